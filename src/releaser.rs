//! Undoing in the background: releases for guards dropped without
//! [`unlock`](crate::LockGuard::unlock), and for acquires and queue places whose caller went
//! away. `Drop` only queues the request, so it stays synchronous, cheap and safe outside a
//! runtime; this task sends the scripts.

use std::sync::Arc;
use std::time::Duration;

use fred::interfaces::ClientLike;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::client::Core;
use crate::error::is_transient;
use crate::fair_lock::Leave;
use crate::guard::Release;
use crate::inflight::InFlight;
use crate::keys::LockKeys;
use crate::ledger::Turn;

/// How long shutdown waits for queued requests before giving up on them (leases and waiter
/// slots still end what they would have undone).
const DRAIN_LIMIT: Duration = Duration::from_secs(2);

/// Something to undo in Redis.
pub(crate) enum Cleanup {
    /// Give back one hold.
    Release(Release),
    /// Leave a fair lock's queue.
    Leave(Leave),
    /// Settle a call whose reply was lost.
    Settle(Settle),
}

impl Cleanup {
    async fn run_dropped(self, core: Arc<Core>) {
        match self {
            Cleanup::Release(release) => release.run_dropped(core).await,
            Cleanup::Leave(leave) => leave.run_dropped(core).await,
            Cleanup::Settle(settle) => settle.run(core).await,
        }
    }
}

/// The effect of a Redis call that must be undone unless somebody takes it over: a won hold
/// whose caller was cancelled, a queue place whose waiter went away. Dropping it unclaimed
/// queues the undo.
pub(crate) struct Undo {
    cleanup: Option<Cleanup>,
    core: Arc<Core>,
}

impl Undo {
    pub(crate) fn new(cleanup: Cleanup, core: Arc<Core>) -> Undo {
        Undo {
            cleanup: Some(cleanup),
            core,
        }
    }

    /// The caller takes the effect over; nothing is undone.
    pub(crate) fn claim(mut self) {
        self.cleanup = None;
    }

    /// Undoes it now, reporting only to tracing; while the client is disconnected, hands it to
    /// the releaser instead, which sends it once fred has reconnected: waiting for that would
    /// only hold the caller up to the command timeout.
    ///
    /// Cancel safe: dropped before its first poll, the undo is still armed and goes to the
    /// releaser; dropped later, the call finishes in a task of its own ([`InFlight`], which
    /// also keeps the 5 KiB script-call future off the caller's, i.e. every waiter's, stack).
    pub(crate) async fn now(mut self) {
        if !self.core.redis.is_connected() {
            return; // dropped armed: queued for the releaser
        }
        if let Some(cleanup) = self.cleanup.take() {
            InFlight::new(cleanup.run_dropped(self.core.clone())).await;
        }
    }
}

impl Drop for Undo {
    fn drop(&mut self) {
        if let Some(cleanup) = self.cleanup.take() {
            // Fails only once the client is gone; leases and slots then end the effect.
            let _ = self.core.releaser.send(cleanup);
        }
    }
}

pub(crate) async fn run(
    core: Arc<Core>,
    mut requests: UnboundedReceiver<Cleanup>,
    shutdown: CancellationToken,
) {
    let mut running = JoinSet::new();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            request = requests.recv() => match request {
                Some(cleanup) => { running.spawn(cleanup.run_dropped(core.clone())); }
                None => break,
            },
            Some(_) = running.join_next(), if !running.is_empty() => {}
        }
    }
    // Shutting down: finish what dropped guards and waiters asked for, within reason.
    while let Ok(cleanup) = requests.try_recv() {
        running.spawn(cleanup.run_dropped(core.clone()));
    }
    let drained = tokio::time::timeout(DRAIN_LIMIT, async {
        while running.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            pending = running.len(),
            "shutdown left releases unfinished; those locks end with their lease"
        );
    }
}

/// How long a settle keeps trying: as long as the fences it sets are kept (see `ledger`).
const SETTLE_LIMIT: Duration = Duration::from_secs(15 * 60);
const MIN_SETTLE_PAUSE: Duration = Duration::from_millis(100);
const MAX_SETTLE_PAUSE: Duration = Duration::from_secs(5);

/// Makes sure that a call whose reply was lost took effect the way the client counts it: the
/// owner's holds are set to its live guards (deleting a hold nobody has a guard for) and the
/// lost calls fenced, retried with backoff until Redis confirms it.
pub(crate) struct Settle {
    keys: Arc<LockKeys>,
    field: Arc<str>,
}

/// Queues a settle when `turn` ends with replies lost, for a call nobody will send again.
pub(crate) fn settle_later(core: &Core, keys: &Arc<LockKeys>, turn: Turn) {
    if turn.is_unsettled() {
        let settle = Settle {
            keys: keys.clone(),
            field: turn.key().1.clone(),
        };
        drop(turn);
        // Fails only once the client is gone; leases and slots then end the effect.
        let _ = core.releaser.send(Cleanup::Settle(settle));
    }
}

/// A settle queued when dropped armed: for an acquire that saw a reply lost (or may have, being
/// dropped while a call was on its way) and then gave up, since no later call of it carries the
/// fences. Arming costs nothing; only an armed drop sends.
pub(crate) struct SettleOnExit<'a> {
    core: &'a Core,
    keys: &'a Arc<LockKeys>,
    field: &'a Arc<str>,
    armed: bool,
}

impl<'a> SettleOnExit<'a> {
    pub(crate) fn new(core: &'a Core, keys: &'a Arc<LockKeys>, field: &'a Arc<str>) -> Self {
        SettleOnExit {
            core,
            keys,
            field,
            armed: false,
        }
    }

    pub(crate) fn arm(&mut self) {
        self.armed = true;
    }

    pub(crate) fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for SettleOnExit<'_> {
    fn drop(&mut self) {
        if self.armed {
            let settle = Settle {
                keys: self.keys.clone(),
                field: self.field.clone(),
            };
            let _ = self.core.releaser.send(Cleanup::Settle(settle));
        }
    }
}

impl Settle {
    async fn run(self, core: Arc<Core>) {
        let until = Instant::now() + SETTLE_LIMIT;
        let mut pause = MIN_SETTLE_PAUSE;
        loop {
            let mut turn = core.ledger.turn(&self.keys.name, &self.field).await;
            if !turn.is_unsettled() {
                return; // a later call of the owner carried the fences
            }
            let left = core.holds.count(&self.keys.name, &self.field);
            let request = turn.request();
            // A lease of 0 keeps the TTL: settling changes counts, never a lease.
            let reply = self
                .keys
                .release(&core.redis, 0, &self.field, left, &request)
                .await;
            turn.record(request, &reply);
            match reply {
                Ok(Some(1)) => {
                    tracing::info!(lock = %self.keys.name, owner = %self.field, "deleted a hold left by a lost reply");
                    return;
                }
                Ok(_) => return,
                Err(error) if !is_transient(&error) => {
                    turn.forget();
                    tracing::warn!(lock = %self.keys.name, owner = %self.field, %error, "cannot settle a lost reply; leases and slots end its effect");
                    return;
                }
                Err(error) if Instant::now() + pause < until => {
                    tracing::debug!(lock = %self.keys.name, owner = %self.field, %error, "settling a lost reply failed; retrying");
                }
                Err(error) => {
                    turn.forget();
                    tracing::warn!(lock = %self.keys.name, owner = %self.field, %error, "gave up settling a lost reply; leases and slots end its effect");
                    return;
                }
            }
            drop(turn);
            tokio::select! {
                _ = core.shutdown.cancelled() => return,
                _ = tokio::time::sleep(pause) => {}
            }
            pause = (pause * 2).min(MAX_SETTLE_PAUSE);
        }
    }
}

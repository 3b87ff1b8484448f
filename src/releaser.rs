//! Undoing in the background: releases for guards dropped without
//! [`unlock`](crate::LockGuard::unlock), and for acquires and queue places whose caller went
//! away. `Drop` only queues the request, so it stays synchronous, cheap and safe outside a
//! runtime; this task sends the scripts.

use std::sync::Arc;
use std::time::Duration;

use fred::interfaces::ClientLike;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::client::Core;
use crate::fair_lock::Leave;
use crate::guard::Release;
use crate::inflight::InFlight;

/// How long shutdown waits for queued requests before giving up on them (leases and waiter
/// slots still end what they would have undone).
const DRAIN_LIMIT: Duration = Duration::from_secs(2);

/// Something to undo in Redis.
pub(crate) enum Cleanup {
    /// Give back one hold.
    Release(Release),
    /// Leave a fair lock's queue.
    Leave(Leave),
}

impl Cleanup {
    async fn run_dropped(self, core: Arc<Core>) {
        match self {
            Cleanup::Release(release) => release.run_dropped(core).await,
            Cleanup::Leave(leave) => leave.run_dropped(core).await,
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

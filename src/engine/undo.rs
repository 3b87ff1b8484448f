//! Every undo (Release, Leave, Settle) and the background task that sends them: releases for
//! guards dropped without an unlock and for acquires whose caller went away, queue places given
//! up, and settles of lost replies; and the hand-over of every hold at shutdown. `Drop` only queues the undo, so it stays synchronous, cheap
//! and safe outside a runtime; this task sends the scripts.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::engine::Value;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::engine::holds::{Hold, Lease};
use crate::engine::inflight::InFlight;
use crate::engine::kind::{Call, Kind, ReleaseArgs, HANDED_ON};
use crate::engine::ledger::{Fencing, Pair, Turn};
use crate::engine::{Core, Field};
use crate::error::{is_transient, RedisError};
use crate::inspection::{LockEventKind, LossReason};

/// How long shutdown waits for queued requests before giving up on them (leases and queue
/// places still end what they would have undone).
const DRAIN_LIMIT: Duration = Duration::from_secs(2);

/// How long a shutdown waits for the hand-over of its holds before it closes anyway: a hold not
/// given back by then ends with its lease.
const HAND_OVER_LIMIT: Duration = Duration::from_secs(2);

/// Gives back every live hold of the client at once, each keeping none: a shutdown hands its
/// locks, permits and terms over to whoever waits instead of leaving them for their leases.
///
/// Cancel first, then give back: every hold is marked lost (its guards' `lost()` complete, their
/// tokens are cancelled) and the work running under holds is dropped before any release is
/// sent, so another instance never takes a hold while this one's work still runs. Work that
/// does not stop within [`HAND_OVER_LIMIT`] (it never reaches an await) keeps every hold from
/// being handed over: they end with their leases.
pub(crate) async fn hand_over(core: &Arc<Core>) {
    let mut holds = Vec::new();
    core.holds.each(|hold| {
        if !hold.is_lost() {
            holds.push(hold.clone());
        }
    });
    core.holds.lose_all();
    core.works.close();
    if tokio::time::timeout(HAND_OVER_LIMIT, core.works.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            running = core.works.len(),
            "shutdown: work under a lock did not stop within {HAND_OVER_LIMIT:?} of its loss; \
             no hold is handed over, each ends with its lease"
        );
        kept(&holds);
        return;
    }
    if holds.is_empty() {
        return;
    }
    if !core.redis().is_connected() {
        kept(&holds);
        return;
    }
    let mut running = JoinSet::new();
    let mut pending = HashMap::with_capacity(holds.len());
    for hold in holds {
        let task_core = core.clone();
        let task_hold = hold.clone();
        let task = running.spawn(async move { give_back(&task_core, &task_hold).await });
        pending.insert(task.id(), hold);
    }
    let timed_out = tokio::time::timeout(HAND_OVER_LIMIT, async {
        while let Some(done) = running.join_next_with_id().await {
            if let Ok((id, ())) = done {
                pending.remove(&id);
            }
        }
    })
    .await
    .is_err();
    if timed_out {
        tracing::warn!(
            pending = running.len(),
            "shutdown could not hand over every hold in time; those end with their lease"
        );
    }
    let left: Vec<Arc<Hold>> = pending.into_values().collect();
    kept(&left);
}

/// Tells of each of `holds` that the shutdown could not give it back: it ends with its lease.
fn kept(holds: &[Arc<Hold>]) {
    for hold in holds {
        hold.tell(LockEventKind::Lost(LossReason::Shutdown));
    }
}

/// Gives back all of `hold`, in its owner's turn.
async fn give_back(core: &Arc<Core>, hold: &Arc<Hold>) {
    let mut turn = core.ledger.turn(&hold.pair).await;
    let (reply, _) = send_release(
        core,
        &mut turn,
        &hold.kind,
        &hold.pair.field,
        (0, &Value::from(0)),
        Instant::now(),
    )
    .await;
    match reply {
        Ok(_) => {
            tracing::debug!(
                lock = %hold.pair.name, owner = %hold.pair.field, "handed over at shutdown"
            );
            hold.tell(LockEventKind::Released);
        }
        Err(error) => {
            tracing::warn!(
                lock = %hold.pair.name, owner = %hold.pair.field, %error,
                "could not hand over a hold at shutdown; it ends with its lease"
            );
            hold.tell(LockEventKind::Lost(LossReason::Shutdown));
        }
    }
    settle_later(core, &hold.kind, turn);
}

/// Sends `kind`'s release of `field`'s holds, keeping `left` (with `lease` set again while some
/// remain), in `turn`. A release is safe to send again, so a lost reply gets an answer here when
/// one comes within a command timeout; only then is the outcome left to the settle. Also
/// whether it was sent again. Resends end one command timeout after `first_sent`.
async fn send_release(
    core: &Core,
    turn: &mut Turn,
    kind: &Arc<dyn Kind>,
    field: &Field,
    (left, lease): (usize, &Value),
    first_sent: Instant,
) -> (Result<Option<i64>, RedisError>, bool) {
    turn.send_again_while_lost(
        core.redis(),
        Fencing::Settles,
        first_sent,
        |request| async {
            let args = ReleaseArgs {
                field,
                left,
                lease,
                request: &request,
            };
            let reply = Call::run_made(&core.writer, || kind.release(&args)).await;
            (request, reply)
        },
    )
    .await
}

/// Something to undo in Redis, whatever the primitive.
pub(crate) enum Undo {
    /// Give back one hold.
    Release(Release),
    /// Give up a waiter's queue place.
    Leave(Leave),
    /// Settle a call whose reply was lost.
    Settle(Settle),
}

impl Undo {
    async fn run(self, core: Arc<Core>) {
        match self {
            Undo::Release(release) => release.run_dropped(core).await,
            Undo::Leave(leave) => leave.run(core).await,
            Undo::Settle(settle) => settle.run(core).await,
        }
    }
}

/// An undo that runs when dropped unless its effect is kept: for a queue place whose waiter
/// may go away. Dropping it without `keep` queues the undo.
pub(crate) struct UndoOnDrop {
    undo: Option<Undo>,
    core: Arc<Core>,
}

impl UndoOnDrop {
    pub(crate) fn new(undo: Undo, core: Arc<Core>) -> UndoOnDrop {
        UndoOnDrop {
            undo: Some(undo),
            core,
        }
    }

    /// The caller keeps the effect; nothing is undone.
    pub(crate) fn keep(mut self) {
        self.undo = None;
    }

    /// Undoes it now, reporting only to tracing; while the client is disconnected, hands it to
    /// the undo task instead, which sends it once fred has reconnected: waiting for that would
    /// only hold the caller up to the command timeout.
    ///
    /// Cancel safe: dropped before its first poll, the undo is still armed and goes to the
    /// undo task; dropped later, the call finishes in a task of its own ([`InFlight`], which
    /// also keeps the 5 KiB script-call future off the caller's, i.e. every waiter's, stack).
    pub(crate) async fn now(mut self) {
        if !self.core.redis().is_connected() {
            return; // dropped armed: queued for the undo task
        }
        if let Some(undo) = self.undo.take() {
            InFlight::new(|| undo.run(self.core.clone())).await;
        }
    }
}

impl Drop for UndoOnDrop {
    fn drop(&mut self) {
        if let Some(undo) = self.undo.take() {
            // Fails only once the client is gone; leases and queue places then end the effect.
            let _ = self.core.undos.send(undo);
        }
    }
}

/// Takes one waiter out of a primitive's queue.
pub(crate) struct Leave {
    pub(crate) kind: Arc<dyn Kind>,
    pub(crate) field: Field,
}

impl Leave {
    /// Leaves in the owner's turn, for a waiter that gave up or went away, reporting only to
    /// tracing: a place that could not be given up ends when it expires.
    async fn run(self, core: Arc<Core>) {
        let name = self.kind.profile().name_text();
        let mut turn = core
            .ledger
            .turn(&Pair::new(name.clone(), self.field.clone()))
            .await;
        let (left, _) = turn
            .send_again_while_lost(
                core.redis(),
                Fencing::Only,
                Instant::now(),
                |request| async {
                    let left = match self.kind.leave(&self.field, &request) {
                        Some(call) => call.run::<i64>(&core.writer).await.map(|left| left == 1),
                        None => Ok(false),
                    };
                    (request, left)
                },
            )
            .await;
        settle_later(&core, &self.kind, turn);
        match left {
            Ok(queued) => tracing::debug!(
                lock = %name, owner = %self.field, queued,
                "left the queue"
            ),
            Err(error) => tracing::warn!(
                lock = %name, owner = %self.field, %error,
                "could not leave the queue; the place ends when it expires"
            ),
        }
    }
}

pub(crate) async fn run(
    core: Arc<Core>,
    mut requests: UnboundedReceiver<Undo>,
    shutdown: CancellationToken,
) {
    let mut running = JoinSet::new();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            request = requests.recv() => match request {
                Some(undo) => { running.spawn(undo.run(core.clone())); }
                None => break,
            },
            Some(_) = running.join_next(), if !running.is_empty() => {}
        }
    }
    // Shutting down: finish what dropped guards and waiters asked for, within reason.
    while let Ok(undo) = requests.try_recv() {
        running.spawn(undo.run(core.clone()));
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
/// At most a second between tries: until it is settled, a hold left by a lost reply keeps
/// every other owner out for its whole lease, so a settle should land soon after Redis answers
/// again (a pause that had grown to 5 s left one unsettled 10 s after a stall healed, on a
/// loaded machine); one small call a second per unsettled pair is little during an outage.
const MAX_SETTLE_PAUSE: Duration = Duration::from_secs(1);

/// Makes sure that a call whose reply was lost took effect the way the client counts it: the
/// owner's holds are set to its live guards (deleting a hold nobody has a guard for) and the
/// lost calls fenced, retried with backoff until Redis confirms it.
pub(crate) struct Settle {
    kind: Arc<dyn Kind>,
    field: Field,
}

/// Queues a settle when `turn` ends with replies lost, for a call nobody will send again.
pub(crate) fn settle_later(core: &Core, kind: &Arc<dyn Kind>, turn: Turn) {
    if turn.is_unsettled() {
        let settle = Settle {
            kind: kind.clone(),
            field: turn.key().field.clone(),
        };
        drop(turn);
        // Fails only once the client is gone; leases and queue places then end the effect.
        let _ = core.undos.send(Undo::Settle(settle));
    }
}

/// A settle queued when dropped armed: for an acquire that saw a reply lost (or may have, being
/// dropped while a call was on its way) and then gave up, since no later call of it carries the
/// fences. Arming costs nothing; only an armed drop sends.
pub(crate) struct SettleOnDrop<'a> {
    core: &'a Core,
    kind: &'a Arc<dyn Kind>,
    field: &'a Field,
    armed: bool,
}

impl<'a> SettleOnDrop<'a> {
    pub(crate) fn new(core: &'a Core, kind: &'a Arc<dyn Kind>, field: &'a Field) -> Self {
        SettleOnDrop {
            core,
            kind,
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

impl Drop for SettleOnDrop<'_> {
    fn drop(&mut self) {
        if self.armed {
            let settle = Settle {
                kind: self.kind.clone(),
                field: self.field.clone(),
            };
            let _ = self.core.undos.send(Undo::Settle(settle));
        }
    }
}

impl Settle {
    async fn run(self, core: Arc<Core>) {
        let until = Instant::now() + SETTLE_LIMIT;
        let mut pause = MIN_SETTLE_PAUSE;
        let pair = Pair::new(self.kind.profile().name_text(), self.field.clone());
        let name = &pair.name;
        loop {
            let mut turn = core.ledger.turn(&pair).await;
            if !turn.is_unsettled() {
                return; // a later call of the owner carried the fences
            }
            let left = core.holds.count(&pair);
            let request = turn.request();
            // A lease of 0 keeps the expiry: settling changes counts, never a lease.
            let call = self.kind.release(&ReleaseArgs {
                field: &self.field,
                left,
                lease: &Value::from(0),
                request: &request,
            });
            let reply = call.run::<Option<i64>>(&core.writer).await;
            turn.record(request, &reply);
            match reply {
                Ok(Some(1 | HANDED_ON)) => {
                    tracing::info!(lock = %name, owner = %self.field, "deleted a hold left by a lost reply");
                    return;
                }
                Ok(_) => return,
                Err(error) if !is_transient(&error) => {
                    turn.drop_fences();
                    tracing::warn!(lock = %name, owner = %self.field, %error, "cannot settle a lost reply; leases and queue places end its effect");
                    return;
                }
                Err(error) if Instant::now() + pause < until => {
                    tracing::debug!(lock = %name, owner = %self.field, %error, "settling a lost reply failed; retrying");
                }
                Err(error) => {
                    turn.drop_fences();
                    tracing::warn!(lock = %name, owner = %self.field, %error, "gave up settling a lost reply; leases and queue places end its effect");
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

/// Everything needed to give back one hold.
pub(crate) struct Release {
    kind: Arc<dyn Kind>,
    hold: Arc<Hold>,
    lease: Lease,
}

impl Release {
    pub(crate) fn new(kind: Arc<dyn Kind>, hold: Arc<Hold>, lease: Lease) -> Release {
        Release { kind, hold, lease }
    }

    /// Lets go of the hold without giving it back, for a release that can no longer be sent:
    /// its lease ends it.
    pub(crate) fn detach(&self, core: &Core) {
        core.holds.detach(&self.hold, self.lease, None);
    }

    /// Runs the release script in the owner's turn, with the count of holds the owner keeps, and
    /// detaches the guard: `Some(1)` released (`Some(HANDED_ON)`: and handed on to a waiting
    /// client, which the client remembers a moment), `Some(0)` holds remain, `None` not held.
    ///
    /// A lost reply is sent again within a command timeout (the count it carries makes that
    /// safe); after that the settle queued for the turn sets the count again and fences the lost
    /// calls (see `ledger`).
    pub(crate) async fn run(&self, core: &Arc<Core>) -> Result<Option<i64>, RedisError> {
        let hold = &self.hold;
        let mut turn = core.ledger.turn(&hold.pair).await;
        let lost = hold.is_lost();
        if lost {
            // Its field may still be in Redis: a renewal that got through after the renew
            // deadline, or a fixed lease a little longer than the local estimate. The last guard
            // of a lost hold that no new acquire replaced deletes it (keeping no holds, the
            // expiry untouched), so it holds up nobody; a field that is gone (or another owner's
            // hold) is left alone by the script. Not while fred reconnects, though: that would
            // hold up the report of the loss, and the lease ends such a field anyway.
            let last_of_its_owner = core.holds.is_registered(hold) && hold.guards() == 1;
            core.holds.detach(hold, self.lease, None);
            if !last_of_its_owner || !core.redis().is_connected() {
                return Ok(None);
            }
        }
        let (left, lease) = if lost {
            (0, Value::from(0))
        } else {
            (hold.guards().saturating_sub(1), core.lease_arg(self.lease))
        };
        if !lost && left == 0 {
            // From here a visit that finds the field gone may have met this release; this
            // release's reply tells the loss, if there was one (below).
            hold.releasing.store(true, Ordering::Release);
        }
        let sent_at = Instant::now();
        let (reply, resent) = send_release(
            core,
            &mut turn,
            &self.kind,
            &hold.pair.field,
            (left, &lease),
            sent_at,
        )
        .await;
        let reply = if lost {
            reply.map(|_| None)
        } else {
            let reply = match reply {
                // Nothing left to delete: the send whose reply was lost deleted it (or the lease
                // ended in between, which Redis cannot tell apart).
                Ok(None) if resent && left == 0 => Ok(Some(1)),
                other => other,
            };
            if matches!(reply, Ok(None)) && left == 0 {
                // The field was gone before this release came: the hold was lost, and is told
                // so before the guard is detached (which would tell it released).
                let why = hold.gone_at(Instant::now());
                tracing::warn!(
                    lock = %hold.pair.name, owner = %hold.pair.field,
                    "lock lost: its owner's field was gone from Redis when it was released"
                );
                hold.mark_lost(why);
            }
            if matches!(reply, Ok(Some(HANDED_ON))) {
                core.handed_on.note(&hold.pair.name);
            }
            let replied = reply.is_ok();
            // Detached in the turn: the next call of the owner counts one hold fewer.
            core.holds
                .detach(hold, self.lease, replied.then_some(sent_at));
            reply
        };
        settle_later(core, &self.kind, turn);
        reply
    }

    /// Releases for a guard nobody unlocked, reporting only to tracing.
    pub(crate) async fn run_dropped(self, core: Arc<Core>) {
        match self.run(&core).await {
            Ok(Some(_)) => {
                tracing::debug!(lock = %self.hold.pair.name, owner = %self.hold.pair.field, "released (nobody waited for it)")
            }
            Ok(None) => tracing::debug!(
                lock = %self.hold.pair.name, owner = %self.hold.pair.field,
                "hold to release in the background was no longer held"
            ),
            Err(error) => tracing::warn!(
                lock = %self.hold.pair.name, owner = %self.hold.pair.field, %error,
                "could not release a lock in the background; sending it again until Redis confirms it"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_settle_keeps_trying_as_long_as_the_fences_it_sets_are_kept() {
        let memory: u128 = crate::lua::FENCES
            .lines()
            .find_map(|line| line.strip_prefix("local FENCE_MEMORY = "))
            .and_then(|ms| ms.trim().parse().ok())
            .expect("fences.lua sets FENCE_MEMORY");
        assert_eq!(SETTLE_LIMIT.as_millis(), memory);
    }
}

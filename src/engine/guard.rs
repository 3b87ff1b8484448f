//! [`Guard`]: one hold as the engine keeps it, which every primitive's guard wraps. Unlocking
//! gives the hold back; dropping it queues the same release for the releaser.

use std::sync::Arc;
use std::time::Duration;

use fred::interfaces::ClientLike;
use fred::types::Value;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::engine::holds::{Hold, Lease};
use crate::engine::inflight::InFlight;
use crate::engine::kind::{Call, Kind, ReleaseArgs};
use crate::engine::releaser::{settle_later, Undo};
use crate::engine::{Core, Engine};
use crate::error::{Error, Result};

/// One hold of one owner on one primitive.
pub(crate) struct Guard {
    engine: Engine,
    hold: Arc<Hold>,
    kind: Arc<dyn Kind>,
    lease: Lease,
    acquired_at: Instant,
    released: bool,
}

impl Guard {
    pub(crate) fn new(engine: Engine, hold: Arc<Hold>, kind: Arc<dyn Kind>, lease: Lease) -> Guard {
        Guard {
            engine,
            hold,
            kind,
            lease,
            acquired_at: Instant::now(),
            released: false,
        }
    }

    /// Gives this hold back: `Err(NotHeld)` when it was lost first; see `LockGuard::unlock`.
    pub(crate) async fn unlock(mut self) -> Result<()> {
        self.released = true;
        let core = self.engine.core().clone();
        if let Err(error) = core.ensure_open() {
            // Shutting down marked every hold lost.
            let lost = self.hold.is_lost();
            core.holds.detach(&self.hold, self.lease, None);
            return Err(if lost { self.not_held() } else { error });
        }
        let release = self.release();
        let span = tracing::debug_span!(
            "release",
            lock = %self.hold.pair.name, kind = self.kind.label(), owner = %self.hold.pair.field,
        );
        let outcome = InFlight::new(|| async move { release.run(&core).await })
            .instrument(span)
            .await;
        let result = match outcome {
            Ok(Some(_)) => {
                tracing::debug!(
                    lock = %self.hold.pair.name, owner = %self.hold.pair.field,
                    held_ms = self.acquired_at.elapsed().as_millis() as u64,
                    "released"
                );
                Ok(())
            }
            Ok(None) => Err(self.not_held()),
            Err(error) => Err(self.engine.redis_error(
                &self.hold.pair.name,
                Some(&self.hold.pair.field),
                error,
            )),
        };
        if let Err(error) = &result {
            let metrics = &self.engine.core().metrics;
            metrics.failed(self.kind.label(), &self.hold.pair.name, error);
        }
        result
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.hold.is_lost()
    }

    /// Lets go of this hold without giving it back: what it holds in Redis stays taken (a
    /// semaphore permit forgotten, as tokio's `SemaphorePermit::forget`).
    pub(crate) fn forget(mut self) {
        self.released = true;
        self.engine
            .core()
            .holds
            .detach(&self.hold, self.lease, None);
    }

    pub(crate) async fn lost(&self) {
        self.hold.lost().await
    }

    pub(crate) fn cancellation_token(&self) -> CancellationToken {
        self.hold.lost_token()
    }

    pub(crate) fn name(&self) -> &str {
        &self.hold.pair.name
    }

    pub(crate) fn owner_field(&self) -> &str {
        &self.hold.pair.field
    }

    /// The fixed lease, or `None` for a watchdog-renewed hold (or one without a lease).
    pub(crate) fn lease(&self) -> Option<Duration> {
        match self.lease {
            Lease::Watchdog | Lease::Unbounded => None,
            Lease::Fixed(lease) => Some(lease),
        }
    }

    pub(crate) fn engine(&self) -> &Engine {
        &self.engine
    }

    /// `Error::NotHeld` for this hold.
    pub(crate) fn not_held(&self) -> Error {
        Error::NotHeld {
            lock: self.hold.pair.name.to_string(),
            owner: self.hold.pair.field.to_string(),
        }
    }

    fn release(&self) -> Release {
        Release {
            kind: self.kind.clone(),
            hold: self.hold.clone(),
            lease: self.lease,
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        let core = self.engine.core();
        // The releaser detaches the guard when it sends the release: until then it still counts
        // among the owner's holds, which the release's own count depends on.
        if let Err(unsent) = core.releaser.send(Undo::Release(self.release())) {
            // The client is gone; the lease ends the hold.
            if let Undo::Release(release) = unsent.0 {
                core.holds.detach(&release.hold, release.lease, None);
            }
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
    /// Runs the release script in the owner's turn, with the count of holds the owner keeps, and
    /// detaches the guard: `Some(1)` released, `Some(0)` holds remain, `None` not held.
    ///
    /// A lost reply is sent again within a command timeout (the count it carries makes that
    /// safe); after that the settle queued for the turn sets the count again and fences the lost
    /// calls (see `ledger`).
    pub(crate) async fn run(&self, core: &Arc<Core>) -> Result<Option<i64>, fred::error::Error> {
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
        let sent_at = Instant::now();
        // A release is safe to send again, so a lost reply gets an answer here when one comes
        // within a command timeout; only then is the outcome left to the settle.
        let (reply, resent) = turn
            .send_again_while_lost(core.redis(), |request| async {
                let args = ReleaseArgs {
                    field: &hold.pair.field,
                    left,
                    lease: &lease,
                    request: &request,
                };
                let reply = Call::run_made(&core.writer, || self.kind.release(&args)).await;
                (request, reply)
            })
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

//! [`Guard`]: one hold as the engine keeps it, which every primitive's guard wraps. Unlocking
//! gives the hold back; dropping it queues the same release for the undo task.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::engine::holds::{from_epoch, since_epoch, Hold, Lease};
use crate::engine::inflight::InFlight;
use crate::engine::kind::Kind;
use crate::engine::undo::{Release, Undo};
use crate::engine::Engine;
use crate::error::{is_transient, Error, RedisError, Result};

/// One hold of one owner on one primitive.
pub(crate) struct Guard {
    engine: Engine,
    hold: Arc<Hold>,
    kind: Arc<dyn Kind>,
    lease: Lease,
    /// When it was made, in ns since the holds' epoch (8 bytes, not an `Instant`'s 16).
    acquired_at: u64,
    released: bool,
}

impl Guard {
    pub(crate) fn new(engine: Engine, hold: Arc<Hold>, kind: Arc<dyn Kind>, lease: Lease) -> Guard {
        Guard {
            engine,
            hold,
            kind,
            lease,
            acquired_at: since_epoch(Instant::now()),
            released: false,
        }
    }

    /// Gives this hold back: `Err(NotHeld)` when it was lost first; see `LockGuard::unlock`.
    pub(crate) async fn unlock(mut self) -> Result<()> {
        self.released = true;
        let core = self.engine.core().clone();
        if let Err(error) = core.ensure_open() {
            // The shutdown gave the hold back (or its lease ends it): say so, not `NotHeld`.
            core.holds.detach(&self.hold, self.lease, None);
            return Err(error);
        }
        if let Err(unsent) = core.redis().refused_unconnected() {
            // One outage rule: a client that knows it has no connection answers at once. The
            // release is not given up: the undo task sends it once the connection is back
            // (within a command timeout), as for a guard dropped without an unlock.
            let error = self.unavailable(Some(unsent));
            let metrics = &core.metrics;
            metrics.failed(self.kind.profile().label(), &self.hold.pair.name, &error);
            self.released = false;
            drop(self);
            return Err(error);
        }
        let release = self.release();
        let span = tracing::debug_span!(
            "release",
            lock = %self.hold.pair.name, kind = self.kind.profile().label(), owner = %self.hold.pair.field,
        );
        let outcome = InFlight::new(|| async move { release.run(&core).await })
            .instrument(span)
            .await;
        let result = match outcome {
            Ok(Some(_)) => {
                tracing::debug!(
                    lock = %self.hold.pair.name, owner = %self.hold.pair.field,
                    held_ms = from_epoch(self.acquired_at).elapsed().as_millis() as u64,
                    "released"
                );
                Ok(())
            }
            // A hold given up locally (its renewals did not get through) while Redis cannot be
            // reached may still be held there: only Redis could say it is not.
            Ok(None) if self.hold.is_lost() && !self.engine.core().redis().is_connected() => {
                Err(self.unavailable(None))
            }
            Ok(None) => Err(self.not_held()),
            Err(error) if is_transient(&error) => Err(self.unavailable(Some(error))),
            Err(error) => Err(self
                .engine
                .refused(&*self.kind, Some(&self.hold.pair.field), None, error)
                .await),
        };
        if let Err(error) = &result {
            let metrics = &self.engine.core().metrics;
            metrics.failed(self.kind.profile().label(), &self.hold.pair.name, error);
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
        self.hold.lost(&self.engine.core().holds.expiries).await
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

    /// `Error::Unavailable` for this hold: its release did not reach Redis (`source`, if it was
    /// sent), which is told once it answers again (the release is followed up by a settle).
    fn unavailable(&self, source: Option<RedisError>) -> Error {
        Error::Unavailable {
            lock: self.hold.pair.name.to_string(),
            server: self.engine.core().address.to_string(),
            source,
        }
    }

    fn release(&self) -> Release {
        Release::new(self.kind.clone(), self.hold.clone(), self.lease)
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        let core = self.engine.core();
        // the undo task detaches the guard when it sends the release: until then it still counts
        // among the owner's holds, which the release's own count depends on.
        if let Err(unsent) = core.undos.send(Undo::Release(self.release())) {
            // The client is gone; the lease ends the hold.
            if let Undo::Release(release) = unsent.0 {
                release.detach(core);
            }
        }
    }
}

//! [`LockGuard`]: proof of one hold, released by [`LockGuard::unlock`] or by dropping it.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::client::{Core, LockClient};
use crate::error::{Error, Result};
use crate::holds::{Hold, Lease};
use crate::inflight::InFlight;
use crate::keys::LockKeys;
use crate::releaser::Cleanup;

/// One hold of a lock, taken by [`Lock::lock`](crate::Lock::lock),
/// [`FairLock::lock`](crate::FairLock::lock) and friends.
///
/// - [`unlock`](Self::unlock) gives the hold back and reports whether it was still held.
/// - Dropping the guard gives it back too, in the background, within milliseconds.
/// - The guard is `Send`: it may move to another task and be unlocked there; it remembers the
///   owner that acquired it.
/// - [`lost`](Self::lost) completes, and [`is_lost`](Self::is_lost) turns true, when the lock is
///   known to be gone: its field vanished from Redis, renewal failed until the lease ran out, the
///   fixed lease ended, or the client shut down. Work protected by the lock should stop then:
///
/// ```no_run
/// # async fn demo(lock: fredlock::Lock) -> fredlock::Result<()> {
/// # async fn long_job() {}
/// let guard = lock.lock().await?;
/// tokio::select! {
///     _ = long_job() => guard.unlock().await?,
///     _ = guard.lost() => eprintln!("lock {} lost; job abandoned", guard.name()),
/// }
/// # Ok(()) }
/// ```
#[must_use = "dropping a guard releases the lock at once"]
pub struct LockGuard {
    client: LockClient,
    hold: Arc<Hold>,
    keys: Arc<LockKeys>,
    lease: Lease,
    acquired_at: Instant,
    released: bool,
}

impl LockGuard {
    pub(crate) fn new(
        client: LockClient,
        hold: Arc<Hold>,
        keys: Arc<LockKeys>,
        lease: Lease,
    ) -> LockGuard {
        LockGuard {
            client,
            hold,
            keys,
            lease,
            acquired_at: Instant::now(),
            released: false,
        }
    }

    /// Gives this hold back. The last hold of the owner deletes the lock and wakes the waiters
    /// (of a fair lock, the first waiter only).
    ///
    /// Fails with [`Error::NotHeld`] when the lock was lost before the call (the owner's field
    /// is gone), and with [`Error::Redis`] when the release could not be confirmed; the lock
    /// then ends with its lease, since the watchdog stops renewing it before this returns.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: once sent, a release dropped mid-way finishes in a task of its own; only its
    /// outcome is not reported.
    pub async fn unlock(mut self) -> Result<()> {
        self.released = true;
        let core = self.client.core().clone();
        // Judged before detaching: without its watchdog guard a hold's loss would be judged by
        // the lease estimate, which a renewal may not have refreshed yet.
        let lost = self.hold.is_lost();
        core.holds.detach(&self.hold, self.lease);
        if lost {
            return Err(self.not_held());
        }
        core.ensure_open()?;
        let release = self.release();
        let outcome = InFlight::new(async move { release.run(&core).await }).await;
        match outcome {
            Ok(Some(_)) => {
                tracing::debug!(
                    lock = %self.hold.name, owner = %self.hold.field,
                    held_ms = self.acquired_at.elapsed().as_millis() as u64,
                    "released"
                );
                Ok(())
            }
            Ok(None) => Err(self.not_held()),
            Err(error) => Err(Error::from_redis(
                &self.client.core().address,
                &self.hold.name,
                Some(&self.hold.field),
                error,
            )),
        }
    }

    /// True once the lock is known lost; see [`lost`](Self::lost).
    pub fn is_lost(&self) -> bool {
        self.hold.is_lost()
    }

    /// Completes when the lock is known lost: its owner's field vanished from Redis (deleted,
    /// expired, or taken over after a failover), the watchdog could not renew it before its lease
    /// ran out, a fixed lease ended, or the client shut down. Never completes while the hold is
    /// safe.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only watches.
    pub async fn lost(&self) {
        self.hold.lost().await
    }

    /// A token cancelled when the lock is known lost, for `select!` or for handing to work that
    /// takes a [`CancellationToken`]. Cancelling it yourself affects only that token.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.hold.lost_token()
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.hold.name
    }

    /// The hash field of the owner of this hold, `<client uuid>:<owner id>`.
    pub fn owner_field(&self) -> &str {
        &self.hold.field
    }

    /// The fixed lease this hold was taken with, or `None` for a watchdog-renewed hold.
    pub fn lease(&self) -> Option<Duration> {
        match self.lease {
            Lease::Watchdog => None,
            Lease::Fixed(lease) => Some(lease),
        }
    }

    fn release(&self) -> Release {
        Release {
            keys: self.keys.clone(),
            field: self.hold.field.clone(),
            lease_ms: self.lease.millis(self.client.core().watchdog_timeout),
        }
    }

    fn not_held(&self) -> Error {
        Error::NotHeld {
            lock: self.hold.name.to_string(),
            owner: self.hold.field.to_string(),
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        let core = self.client.core();
        let lost = self.hold.is_lost();
        core.holds.detach(&self.hold, self.lease);
        if !lost {
            // Fails only when the client is gone; the lease then ends the lock.
            let _ = core.releaser.send(Cleanup::Release(self.release()));
        }
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("name", &self.hold.name)
            .field("owner", &self.hold.field)
            .field("lease", &self.lease())
            .field("lost", &self.is_lost())
            .finish()
    }
}

/// Everything needed to give back one hold.
pub(crate) struct Release {
    pub(crate) keys: Arc<LockKeys>,
    pub(crate) field: Arc<str>,
    pub(crate) lease_ms: u64,
}

impl Release {
    /// Runs the release script: `Some(1)` released, `Some(0)` holds remain, `None` not held.
    pub(crate) async fn run(&self, core: &Core) -> Result<Option<i64>, fred::error::Error> {
        self.keys
            .release(&core.redis, self.lease_ms, &self.field)
            .await
    }

    /// Releases for a guard or an acquire nobody waits for any more, reporting only to tracing.
    pub(crate) async fn run_dropped(self, core: Arc<Core>) {
        match self.run(&core).await {
            Ok(Some(_)) => {
                tracing::debug!(lock = %self.keys.name, owner = %self.field, "released (nobody waited for it)")
            }
            Ok(None) => tracing::debug!(
                lock = %self.keys.name, owner = %self.field,
                "lock to release in the background was no longer held"
            ),
            Err(error) => tracing::warn!(
                lock = %self.keys.name, owner = %self.field, %error,
                "could not release a lock in the background; it ends with its lease"
            ),
        }
    }
}

//! [`LockGuard`]: proof of one hold, released by [`LockGuard::unlock`] or by dropping it.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use fred::interfaces::ClientLike;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::client::{Core, LockClient};
use crate::error::{Error, Result};
use crate::holds::{Hold, Lease};
use crate::inflight::InFlight;
use crate::keys::LockKeys;
use crate::releaser::{settle_later, Cleanup};

/// One hold of a lock, taken by [`Lock::lock`](crate::Lock::lock),
/// [`FairLock::lock`](crate::FairLock::lock) and friends.
///
/// - [`unlock`](Self::unlock) gives the hold back and reports whether it was still held.
/// - Dropping the guard gives it back too, in the background, within milliseconds.
/// - The guard is `Send`: it may move to another task and be unlocked there; it remembers the
///   owner that acquired it.
/// - [`lost`](Self::lost) completes, and [`is_lost`](Self::is_lost) turns true, when the lock is
///   known to be gone: its field vanished from Redis, no renewal got through within the renew
///   deadline (before the lease could end), the fixed lease ended, or the client shut down.
///   Work protected by the lock should stop then:
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
    /// is gone). A release whose reply is lost is sent again (it takes effect once however often
    /// it is sent) for up to the client's command timeout; fails with [`Error::Redis`] when no
    /// answer came by then. The release then goes on in the background until Redis answers, and
    /// the watchdog stops renewing the hold before this returns, so at worst the lock ends with
    /// its lease.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: once sent, a release dropped mid-way finishes in a task of its own; only its
    /// outcome is not reported.
    pub async fn unlock(mut self) -> Result<()> {
        self.released = true;
        let core = self.client.core().clone();
        if let Err(error) = core.ensure_open() {
            // Shutting down marked every hold lost.
            let lost = self.hold.is_lost();
            core.holds.detach(&self.hold, self.lease, None);
            return Err(if lost { self.not_held() } else { error });
        }
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
    /// expired, or taken over after a failover), no renewal got through within the client's
    /// [`renew_deadline`](crate::LockClientBuilder::renew_deadline) (which passes while Redis still
    /// has the lock for a third of the watchdog timeout, by default), a fixed lease ended, or the
    /// client shut down. A renewal that gets through after that does not undo the report. Never
    /// completes while the hold is safe.
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
            hold: self.hold.clone(),
            lease: self.lease,
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
        // The releaser detaches the guard when it sends the release: until then it still counts
        // among the owner's holds, which the release's own count depends on.
        if let Err(unsent) = core.releaser.send(Cleanup::Release(self.release())) {
            // The client is gone; the lease ends the lock.
            if let Cleanup::Release(release) = unsent.0 {
                core.holds.detach(&release.hold, release.lease, None);
            }
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
    pub(crate) hold: Arc<Hold>,
    pub(crate) lease: Lease,
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
        let mut turn = core.ledger.turn(&hold.name, &hold.field).await;
        let lost = hold.is_lost();
        if lost {
            // Its field may still be in Redis: a renewal that got through after the renew
            // deadline, or a fixed lease a little longer than the local estimate. The last guard
            // of a lost hold that no new acquire replaced deletes it (keeping no holds, the TTL
            // untouched), so it holds up nobody; a field that is gone (or another owner's lock)
            // is left alone by the script. Not while fred reconnects, though: that would hold up
            // the report of the loss, and the lease ends such a field anyway.
            let last_of_its_owner = core.holds.is_registered(hold) && hold.guards() == 1;
            core.holds.detach(hold, self.lease, None);
            if !last_of_its_owner || !core.redis.is_connected() {
                return Ok(None);
            }
        }
        let (left, lease_ms) = if lost {
            (0, 0)
        } else {
            let lease_ms = self.lease.millis(core.watchdog_timeout);
            (hold.guards().saturating_sub(1), lease_ms)
        };
        let sent_at = Instant::now();
        // A release is safe to send again, so a lost reply gets an answer here when one comes
        // within a command timeout; only then is the outcome left to the settle.
        let (reply, resent) = turn
            .send_again_while_lost(&core.redis, |request| async {
                let reply = self
                    .keys
                    .release(&core.redis, lease_ms, &hold.field, left, &request)
                    .await;
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
        settle_later(core, &self.keys, turn);
        reply
    }

    /// Releases for a guard nobody unlocked, reporting only to tracing.
    pub(crate) async fn run_dropped(self, core: Arc<Core>) {
        match self.run(&core).await {
            Ok(Some(_)) => {
                tracing::debug!(lock = %self.keys.name, owner = %self.hold.field, "released (nobody waited for it)")
            }
            Ok(None) => tracing::debug!(
                lock = %self.keys.name, owner = %self.hold.field,
                "lock to release in the background was no longer held"
            ),
            Err(error) => tracing::warn!(
                lock = %self.keys.name, owner = %self.hold.field, %error,
                "could not release a lock in the background; sending it again until Redis confirms it"
            ),
        }
    }
}

//! [`FairLock`]: Redisson's `RFairLock`, a reentrant lock granted in arrival order.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::client::{Core, LockClient};
use crate::error::Result;
use crate::guard::LockGuard;
use crate::keys::LockKeys;
use crate::lock::Lock;
use crate::owner::OwnerId;
use crate::releaser::settle_later;

/// A reentrant distributed lock whose waiters are served first come, first served: Redisson's
/// `RFairLock`, with the same keys, so Java and Rust waiters share one line.
///
/// Everything [`Lock`] does, a `FairLock` does the same way (reentrancy, watchdog, [`LockGuard`],
/// cancel safety); the difference is who gets the lock when it is released:
///
/// - A waiter takes its place in the lock's queue (`redisson_lock_queue:{name}`) with its first
///   attempt, and a free lock goes only to the first in line; newcomers queue behind, even when
///   they find the lock free for a moment.
/// - An unlock tells only the first waiter, on its own channel
///   (`redisson_lock__channel:{name}:<owner field>`), so a release wakes one task, not all.
/// - A waiter keeps its place by trying again at least every third of its *slot*
///   ([`fair_wait_timeout`](crate::LockClientBuilder::fair_wait_timeout), 5 s by default). A
///   waiter whose process died stops doing that, and is dropped from the line wherever it
///   stands once its slot runs out. A dead waiter at the head therefore delays a free lock by
///   at most one slot. Slots are timed by the Redis server's clock, never by a client's.
/// - A waiter that gives up (its `try_lock` wait ends, or its future is dropped) leaves the line
///   at once, and the one behind it moves up.
/// - [`try_lock`](Self::try_lock) with a zero wait never joins the line: it takes the lock only
///   if it is free and nobody is waiting.
///
/// Reentry by the holder does not queue. Locking the same name as a plain [`Lock`] elsewhere
/// bypasses the line; use one kind per name.
///
/// # Redisson compatibility
///
/// The hash, queue, slot zset and channels are Redisson's, so Java and Rust clients exclude each
/// other and wait in one line. Slot ends are milliseconds since the epoch, as Redisson writes
/// them. Two differences in behaviour: Redisson gives its waiters 5-minute slots computed from
/// its own clock, and when a Redisson client takes the lock it shortens every remaining slot by
/// that wait time, which makes fredlock's waiters rejoin at the end of the line. Mixed waiters
/// thus keep mutual exclusion but not always strict order.
///
/// ```no_run
/// # async fn demo(client: fredlock::LockClient) -> fredlock::Result<()> {
/// let tickets = client.fair_lock("tickets");
/// let guard = tickets.lock().await?;      // served in the order the waiters arrived
/// // ... serve one customer ...
/// guard.unlock().await?;                  // the next in line is told, and only it
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct FairLock {
    lock: Lock,
}

impl FairLock {
    pub(crate) fn new(client: LockClient, name: String) -> FairLock {
        FairLock {
            lock: Lock::new(client, LockKeys::fair(name)),
        }
    }

    /// The lock's Redis key; see [`Lock::name`].
    pub fn name(&self) -> &str {
        self.lock.name()
    }

    /// The same lock, owned by `owner` instead of the current task; see [`Lock::with_owner`].
    pub fn with_owner(self, owner: OwnerId) -> FairLock {
        FairLock {
            lock: self.lock.with_owner(owner),
        }
    }

    /// This lock as a [`Lock`], for code that takes either kind; it stays fair.
    pub fn as_lock(&self) -> &Lock {
        &self.lock
    }

    /// Acquires the lock when its turn comes, waiting as long as it takes; the watchdog renews it
    /// until the guard goes. See [`Lock::lock`].
    ///
    /// # Errors
    ///
    /// As [`Lock::lock`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the future is dropped, no hold is left behind and the waiter's place in
    /// the queue is given up within milliseconds.
    pub async fn lock(&self) -> Result<LockGuard> {
        self.lock.lock().await
    }

    /// Acquires the lock when its turn comes, for a fixed `lease`. See
    /// [`Lock::lock_with_lease`].
    ///
    /// # Errors
    ///
    /// As [`Lock::lock_with_lease`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`lock`](Self::lock).
    pub async fn lock_with_lease(&self, lease: Duration) -> Result<LockGuard> {
        self.lock.lock_with_lease(lease).await
    }

    /// Tries to acquire the lock within `wait`: `Ok(None)` when its turn did not come that soon,
    /// and then its place in the queue is already given up. A zero `wait` takes the lock only
    /// if it is free and nobody is queued, and never queues. See [`Lock::try_lock`].
    ///
    /// # Errors
    ///
    /// As [`Lock::try_lock`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`lock`](Self::lock).
    pub async fn try_lock(
        &self,
        wait: Duration,
        lease: Option<Duration>,
    ) -> Result<Option<LockGuard>> {
        self.lock.try_lock(wait, lease).await
    }

    /// Runs `work` while holding the lock, taken when its turn comes; see [`Lock::with_lock`].
    ///
    /// # Errors
    ///
    /// As [`Lock::with_lock`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`Lock::with_lock`]; a dropped wait gives up its place in the queue.
    pub async fn with_lock<F, Fut, T>(&self, work: F) -> Result<T>
    where
        F: FnOnce(tokio_util::sync::CancellationToken) -> Fut,
        Fut: std::future::Future<Output = T>,
    {
        self.lock.with_lock(work).await
    }

    /// Whether anyone holds the lock.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn is_locked(&self) -> Result<bool> {
        self.lock.is_locked().await
    }

    /// Whether the current task (or the pinned owner) holds the lock.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn is_held_by_current_task(&self) -> Result<bool> {
        self.lock.is_held_by_current_task().await
    }

    /// How many holds the current task (or the pinned owner) has on the lock; 0 if none.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn hold_count(&self) -> Result<u32> {
        self.lock.hold_count().await
    }

    /// How long the lock lives unless renewed; `None` when it is not held or has no expiry.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn remaining_ttl(&self) -> Result<Option<Duration>> {
        self.lock.remaining_ttl().await
    }

    /// Deletes the lock whoever holds it and tells the first waiter, which keeps its place;
    /// `true` if it was held. See [`Lock::force_unlock`].
    ///
    /// # Cancel safety
    ///
    /// As [`Lock::force_unlock`].
    pub async fn force_unlock(&self) -> Result<bool> {
        self.lock.force_unlock().await
    }
}

impl From<FairLock> for Lock {
    fn from(fair: FairLock) -> Lock {
        fair.lock
    }
}

impl fmt::Debug for FairLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("FairLock").field(&self.lock).finish()
    }
}

/// Takes one waiter out of a fair lock's queue.
pub(crate) struct Leave {
    pub(crate) keys: Arc<LockKeys>,
    pub(crate) field: Arc<str>,
}

impl Leave {
    /// Leaves in the owner's turn, for a waiter that gave up or went away, reporting only to
    /// tracing: a place that could not be given up ends with its slot.
    pub(crate) async fn run_dropped(self, core: Arc<Core>) {
        let mut turn = core.ledger.turn(&self.keys.name, &self.field).await;
        let (left, _) = turn
            .send_again_while_lost(&core.redis, |request| async {
                let left = self.keys.leave(&core.redis, &self.field, &request).await;
                (request, left)
            })
            .await;
        settle_later(&core, &self.keys, turn);
        match left {
            Ok(queued) => tracing::debug!(
                lock = %self.keys.name, owner = %self.field, queued,
                "left the queue"
            ),
            Err(error) => tracing::warn!(
                lock = %self.keys.name, owner = %self.field, %error,
                "could not leave the queue; the place ends with its slot"
            ),
        }
    }
}

//! [`SpinLock`]: Redisson's `RSpinLock`, a reentrant lock whose waiters back off instead of
//! listening for unlocks.

use std::fmt;
use std::time::Duration;

use crate::client::LockClient;
use crate::engine::{durations, Backoff};
use crate::error::{Error, Result};
use crate::lock::reentrant::{Reentrant, DEFAULT_BACKOFF};
use crate::lock::{lock_of_family, Lock};
use crate::owner::OwnerId;

/// The first pause of a spin lock's waiter (Redisson's default).
pub const DEFAULT_SPIN_FIRST_PAUSE: Duration = DEFAULT_BACKOFF.first;
/// The longest pause of a spin lock's waiter (Redisson's default).
pub const DEFAULT_SPIN_MAX_PAUSE: Duration = DEFAULT_BACKOFF.cap;

/// A reentrant distributed lock whose waiters never subscribe: Redisson's `RSpinLock`, with the
/// reentrant lock's keys, guards, watchdog and cancel safety.
///
/// A waiter tries again after a pause that starts at 1 ms and doubles up to 128 ms (both
/// configurable with [`with_backoff`](Self::with_backoff)), each pause random in the upper half
/// of its step so that waiters spread out, and never longer than the holder's remaining lease.
/// Releases publish nothing. Use it where pub/sub is unavailable (some proxies and managed
/// services) or costly: on a cluster a classic `PUBLISH` is sent to every node. The price is a
/// wake-up up to the current pause late, and one attempt per pause per waiter.
///
/// A waiter of a [`Lock`] on the same name is woken by nothing a `SpinLock` holder does, only by
/// the end of its lease: use one kind per name.
///
/// ```no_run
/// # async fn demo(client: fredlock::LockClient) -> fredlock::Result<()> {
/// use std::time::Duration;
///
/// let lock = client
///     .spin_lock("reports:nightly")
///     .with_backoff(Duration::from_millis(2), Duration::from_millis(50))?;
/// let guard = lock.lock().await?;   // polls with backoff; never SUBSCRIBEs
/// guard.unlock().await?;
/// # Ok(()) }
/// ```
///
/// # Waiting
///
/// A waiter tries again after each pause of its backoff, never subscribing. With a bounded
/// wait ([`try_lock`](crate::DistributedLock::try_lock)), the attempts follow the backoff, so
/// the last one may come up to a pause (128 ms by default) before the wait ends.
///
/// # Cancel safety
///
/// Cancel safe: if an acquisition's future is dropped, no hold is left behind (an attempt
/// already sent finishes in a task of its own and gives back what it won). A waiter holds
/// nothing in Redis between attempts.
#[derive(Clone)]
pub struct SpinLock {
    lock: Lock,
}

lock_of_family!(SpinLock);

impl LockClient {
    /// A spin lock named `name`: reentrant like [`lock`](Self::lock), with waiters that back off
    /// instead of subscribing. Creating it costs nothing and sends nothing.
    pub fn spin_lock(&self, name: impl Into<String>) -> SpinLock {
        let backoff = DEFAULT_BACKOFF;
        SpinLock {
            lock: Lock::of_kind(
                self.clone(),
                Reentrant::spinning(self.key(name.into()), backoff),
            ),
        }
    }
}

impl SpinLock {
    /// The same lock with waiters that pause `first` after a busy attempt, doubling up to `max`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when `first` is under 1 ms, `max` is under `first`, or either
    /// is over [`MAX_DURATION`](crate::MAX_DURATION).
    pub fn with_backoff(self, first: Duration, max: Duration) -> Result<SpinLock> {
        let name = self.lock.name();
        durations::check(
            format_args!("the first pause of spin lock {name:?}"),
            first,
            durations::MIN_LEASE,
        )?;
        durations::check(
            format_args!("the longest pause of spin lock {name:?}"),
            max,
            durations::MIN_LEASE,
        )?;
        if max < first {
            return Err(Error::InvalidArgument(format!(
                "the longest pause of spin lock {name:?} ({max:?}) is shorter than its first \
                 pause ({first:?})"
            )));
        }
        let backoff = Backoff { first, cap: max };
        let lock = Lock::of_kind(
            self.lock.client().clone(),
            Reentrant::spinning(name.to_owned(), backoff),
        );
        Ok(SpinLock {
            lock: match self.lock.owner_pinned() {
                Some(owner) => lock.with_owner(owner),
                None => lock,
            },
        })
    }

    /// The same lock, owned by `owner` instead of the current task; see [`Lock::with_owner`].
    pub fn with_owner(self, owner: OwnerId) -> SpinLock {
        SpinLock {
            lock: self.lock.with_owner(owner),
        }
    }
}

impl From<SpinLock> for Lock {
    fn from(spin: SpinLock) -> Lock {
        spin.lock
    }
}

impl fmt::Debug for SpinLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("SpinLock").field(&self.lock).finish()
    }
}

//! The acquisitions every lock shares, written once: [`DistributedLock`] (`lock`,
//! `lock_with_lease`, `try_lock`, `try_lock_now`, `with_lock`, `try_with_lock`) over the one
//! method each lock provides, and [`DistributedGuard`], what `with_lock` needs of its guard.
//! What only the locks of the reentrant family have (the reads, the force unlock, the
//! inspection) is `LockFamily`, in `lock/mod.rs`.
//!
//! A floor module: it names no primitive; each lock implements the traits in its own file.
//!
//! Every lock also has the acquisitions as methods of its own ([`acquisitions!`]), so that
//! `lock.lock()` needs no import, as a semaphore's `acquire()` needs none: the traits are for
//! code written over any lock (ARCHITECTURE.md, "Where `lock()` comes from"). They are sealed
//! ([`sealed::Sealed`]): nothing outside the crate can implement them, since the engine's
//! guarantees (cancel safety, the watchdog, the hand-over at shutdown) hold only for its own.

use std::future::Future;
use std::time::Duration;

use crate::error::{waited, Error, Result};

/// A distributed lock: at most one owner at a time across every client on the same Redis
/// (Java Redisson clients included), acquired in Redisson's words. Every lock of the crate has
/// these methods: [`Lock`](crate::Lock) (and its fair, spin, read and write kinds), [`FencedLock`], whose
/// guards carry a fencing token, [`MultiLock`] over several locks and [`RedLock`] over several
/// independent Redis servers. Each lock has them as methods of its own too, so calling them
/// needs no import; the trait is for code over any lock. Sealed: only the crate's locks
/// implement it.
///
/// ```no_run
/// # async fn demo(client: fredlock::LockClient) -> fredlock::Result<()> {
/// use std::time::Duration;
///
/// let lock = client.lock("orders:1001");
/// let guard = lock.lock().await?;                 // waits as long as needed
/// guard.unlock().await?;                          // released; waiters wake
///
/// // At most 2 s of waiting; held for at most 10 s, without renewal.
/// if let Some(guard) = lock.try_lock(Duration::from_secs(2), Some(Duration::from_secs(10))).await? {
///     guard.unlock().await?;
/// }
/// # Ok(()) }
/// ```
///
/// What each method returns, the errors it reports and what a cancel gives up are said here
/// once; a lock's own page says what it adds (a fenced lock's counter, a MultiLock's members,
/// a Redlock's quorum).
///
/// # Sealed
///
/// Only the crate's locks implement it: an implementation elsewhere does not compile.
///
/// ```compile_fail
/// struct MyLock;
/// impl fredlock::DistributedLock for MyLock {
///     type Guard = fredlock::LockGuard;
///     fn acquire(
///         &self,
///         _: Option<std::time::Duration>,
///         _: Option<std::time::Duration>,
///     ) -> impl std::future::Future<Output = fredlock::Result<Option<fredlock::LockGuard>>> + Send {
///         async { Ok(None) }
///     }
/// }
/// ```
///
/// [`FencedLock`]: crate::FencedLock
/// [`MultiLock`]: crate::MultiLock
/// [`RedLock`]: crate::RedLock
pub trait DistributedLock: sealed::Sealed + Send + Sync {
    /// The guard of one hold: unlocking or dropping it gives the hold back.
    type Guard: DistributedGuard;

    /// Acquires the lock for its owner, waiting at most `wait` (`None`: as long as it takes),
    /// for a fixed `lease` (`None`: renewed until the guard goes); `Ok(None)` when it stayed
    /// held by another owner for the whole wait. Every method of the trait is this one.
    #[doc(hidden)]
    fn acquire(
        &self,
        wait: Option<Duration>,
        lease: Option<Duration>,
    ) -> impl Future<Output = Result<Option<Self::Guard>>> + Send;

    /// Acquires the lock, waiting as long as it takes; it is renewed (by the client's watchdog,
    /// a Redlock by its own extension) until the guard is unlocked or dropped.
    ///
    /// Waiting costs no polling: the waiter sleeps until an unlock is published on the lock's
    /// channel, or at most until the holder's lease would end, so a lost message costs time and
    /// never a hang. While Redis is unreachable the waiter keeps trying, with backoff.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an empty name, [`Error::WrongType`] when the key is not
    /// a lock, [`Error::Redis`] when Redis rejects the script, [`Error::Shutdown`] when the
    /// client shuts down, and [`Error::WouldDeadlock`] for a
    /// [non-reentrant](crate::Lock::non_reentrant) lock its owner holds already. Connection
    /// failures are not errors here: it keeps trying until Redis is back.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the future is dropped, no hold is left behind. An acquire request already
    /// sent runs to completion in a task of its own, which gives the hold back if it won (a
    /// fenced lock's token issued to it is never handed to anyone; a fair lock's place in the
    /// queue is given up). A [`Lock`](crate::Lock)'s client keeps its place in the lock's line
    /// until the place ends (at most `queue_place` after its last attempt): a
    /// release that names it meanwhile is passed on to the other waiting clients.
    ///
    /// [`Error::InvalidArgument`]: crate::Error::InvalidArgument
    /// [`Error::WrongType`]: crate::Error::WrongType
    /// [`Error::Redis`]: crate::Error::Redis
    /// [`Error::Shutdown`]: crate::Error::Shutdown
    /// [`Error::WouldDeadlock`]: crate::Error::WouldDeadlock
    fn lock(&self) -> impl Future<Output = Result<Self::Guard>> + Send {
        async move { self.acquire(None, None).await.and_then(waited) }
    }

    /// Acquires the lock, waiting as long as it takes, for a fixed `lease`: the lock ends by
    /// itself that long after it was taken, released or not, and is never renewed.
    ///
    /// # Errors
    ///
    /// As [`lock`](Self::lock), and [`Error::InvalidArgument`](crate::Error::InvalidArgument)
    /// for a lease under 1 ms or over [`MAX_DURATION`](crate::MAX_DURATION) (a Redlock's: one
    /// that leaves no validity).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`lock`](Self::lock).
    fn lock_with_lease(&self, lease: Duration) -> impl Future<Output = Result<Self::Guard>> + Send {
        async move { self.acquire(None, Some(lease)).await.and_then(waited) }
    }

    /// Takes the lock only if no other owner holds it now, without waiting: `Ok(None)` when
    /// another owner does. It is renewed until the guard goes.
    ///
    /// This is tokio's [`Mutex::try_lock`](tokio::sync::Mutex::try_lock) and Redisson's
    /// `tryLock()`: one attempt, one round trip. The same as
    /// [`try_lock(Duration::ZERO, None)`](Self::try_lock).
    ///
    /// ```no_run
    /// # async fn demo(client: fredlock::LockClient) -> fredlock::Result<()> {
    ///
    /// match client.lock("reports:nightly").try_lock_now().await? {
    ///     Some(guard) => {
    ///         // ... this instance builds the report ...
    ///         guard.unlock().await?;
    ///     }
    ///     None => println!("another instance is on it"),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`try_lock`](Self::try_lock): [`Error::Unavailable`](crate::Error::Unavailable) at
    /// once while Redis cannot be reached (never `Ok(None)`, which always means that another
    /// owner holds it).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`lock`](Self::lock).
    #[doc(alias = "tryLock")]
    fn try_lock_now(&self) -> impl Future<Output = Result<Option<Self::Guard>>> + Send {
        self.acquire(Some(Duration::ZERO), None)
    }

    /// Tries to acquire the lock within `wait`: `Ok(None)` when it stayed held that long.
    ///
    /// This is Redisson's `tryLock(waitTime, leaseTime, unit)`. `wait` zero makes exactly one
    /// attempt. `lease` is a [`Duration`] (or `Some(d)`): the lock ends by itself that long
    /// after it was taken and is never renewed; or `None`: it is renewed until the guard goes
    /// (Redisson's `leaseTime` of -1).
    ///
    /// ```no_run
    /// # async fn demo(client: fredlock::LockClient) -> fredlock::Result<()> {
    /// use std::time::Duration;
    ///
    /// let lock = client.lock("orders:1001");
    /// // Wait up to 2 s; held for 10 s at most, never renewed.
    /// if let Some(guard) = lock.try_lock(Duration::from_secs(2), Duration::from_secs(10)).await? {
    ///     guard.unlock().await?;
    /// }
    /// // Wait up to 2 s; renewed by the watchdog until the guard goes.
    /// if let Some(guard) = lock.try_lock(Duration::from_secs(2), None).await? {
    ///     guard.unlock().await?;
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`lock_with_lease`](Self::lock_with_lease), and the same for a `wait` over
    /// [`MAX_DURATION`](crate::MAX_DURATION). A connection failure is retried within the wait;
    /// when the wait ends and no attempt got an answer from Redis (it was down, refused
    /// connections, or did not reply), [`Error::Unavailable`](crate::Error::Unavailable) with
    /// the last failure, never `Ok(None)`, which always means that another owner held the lock
    /// (a Redlock reports [`Error::NoQuorum`](crate::Error::NoQuorum), naming each node). A
    /// zero `wait` makes one attempt, and fails at once with `Unavailable` while the client is
    /// disconnected.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`lock`](Self::lock): dropped while waiting, it gives up the wait (a
    /// fair lock's place in the queue).
    #[doc(alias = "tryLock")]
    fn try_lock(
        &self,
        wait: Duration,
        lease: impl Into<Option<Duration>>,
    ) -> impl Future<Output = Result<Option<Self::Guard>>> + Send {
        self.acquire(Some(wait), lease.into())
    }

    /// Runs `work` while holding the lock: acquires it as [`lock`](Self::lock) does (renewed
    /// until the work ends), runs the future `work` makes, and unlocks when it ends, returning
    /// its value.
    ///
    /// `work` receives the guard's [`Context`](DistributedGuard::Context): a
    /// [`CancellationToken`](crate::CancellationToken), cancelled when the lock is lost, for work that wants to stop
    /// cleanly at a point of its choosing (a fenced lock hands its fencing token beside it).
    /// If the lock is lost while the future runs, the future is dropped at its next await and
    /// [`Error::Lost`](crate::Error::Lost) returned: the work never goes on unprotected past
    /// the moment the loss is known. For a lock of one client, that client's
    /// [`shutdown`](crate::LockClient::shutdown) drops the work before it gives the hold back
    /// (a `MultiLock`'s or a `RedLock`'s work is tracked by its first member's or node's
    /// client only).
    ///
    /// ```no_run
    /// # async fn demo(client: fredlock::LockClient) -> fredlock::Result<()> {
    /// # async fn charge(order: u64) -> u64 { order }
    ///
    /// let receipt = client
    ///     .lock("orders:1001")
    ///     .with_lock(|_lost| async { charge(1001).await })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`lock`](Self::lock) when the lock cannot be acquired (`work` is not called), and
    /// [`Error::Lost`](crate::Error::Lost) when it was lost while the work ran. When the work
    /// finished while the lock was held, its value is returned even if the unlock afterwards
    /// fails (the lock then ends with its lease; the failure is logged at `warn`).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future drops the work where it stands and gives the hold back
    /// in the background, as dropping a guard does.
    fn with_lock<F, Fut, T>(&self, work: F) -> impl Future<Output = Result<T>> + Send
    where
        F: FnOnce(<Self::Guard as DistributedGuard>::Context) -> Fut + Send,
        Fut: Future<Output = T> + Send,
        T: Send,
    {
        async move {
            let guard = self.lock().await?;
            let work = work(guard.context());
            guard.run_holding(work).await
        }
    }

    /// Runs `work` while holding the lock if it can be had within `wait`: `Ok(None)` (and
    /// `work` is not called) when another owner held it that long. The bounded form of
    /// [`with_lock`](Self::with_lock), acquiring as [`try_lock`](Self::try_lock) does:
    /// `wait` zero makes one attempt, `lease` `None` renews the lock while the work runs,
    /// `Some(lease)` holds it for that long at most (the work is dropped and
    /// [`Error::Lost`](crate::Error::Lost) returned if it outlives it).
    ///
    /// ```no_run
    /// # async fn demo(client: fredlock::LockClient) -> fredlock::Result<()> {
    /// # async fn rebuild_index() {}
    /// use std::time::Duration;
    ///
    /// let ran = client
    ///     .lock("search:index")
    ///     .try_with_lock(Duration::from_secs(2), None, |_lost| rebuild_index())
    ///     .await?;
    /// if ran.is_none() {
    ///     println!("another instance is rebuilding the index");
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`try_lock`](Self::try_lock) when the lock cannot be acquired, and as
    /// [`with_lock`](Self::with_lock) once it is.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`with_lock`](Self::with_lock): dropped while waiting, it gives up the
    /// wait (a fair lock's place in the queue); dropped while the work runs, it drops the work
    /// and gives the hold back in the background.
    fn try_with_lock<F, Fut, T>(
        &self,
        wait: Duration,
        lease: impl Into<Option<Duration>>,
        work: F,
    ) -> impl Future<Output = Result<Option<T>>> + Send
    where
        F: FnOnce(<Self::Guard as DistributedGuard>::Context) -> Fut + Send,
        Fut: Future<Output = T> + Send,
        T: Send,
    {
        let lease = lease.into();
        async move {
            let Some(guard) = self.acquire(Some(wait), lease).await? else {
                return Ok(None);
            };
            let work = work(guard.context());
            guard.run_holding(work).await.map(Some)
        }
    }
}

/// The guard of a [`DistributedLock`], as [`with_lock`](DistributedLock::with_lock) uses it:
/// what it hands the work, and running the work while the hold stands.
pub trait DistributedGuard: sealed::Sealed + Send + Sized {
    /// What `with_lock`'s work receives: a [`CancellationToken`](crate::CancellationToken),
    /// cancelled when the lock is lost; a fenced lock's is `(fencing token, cancellation
    /// token)`.
    type Context: Send;

    /// What `with_lock`'s work receives of this hold.
    fn context(&self) -> Self::Context;

    /// Runs `work` while this hold stands (tracked, so that a shutdown drops it before the
    /// hand-over): its value, and the unlock after it; `Error::Lost` (the work dropped at its
    /// next await) when the hold is lost first.
    #[doc(hidden)]
    fn run_holding<T: Send>(
        self,
        work: impl Future<Output = T> + Send,
    ) -> impl Future<Output = Result<T>> + Send;
}

/// The bound that keeps the crate's public traits its own: `Sealed` is public (a public
/// trait's bound must be) but lives in a module outside code cannot name.
pub(crate) mod sealed {
    /// Implemented by the crate's locks and guards only.
    pub trait Sealed {}
}

/// Gives `$handle`, a [`DistributedLock`], the trait's acquisitions as methods of its own,
/// forwarding to the trait's (no wrapper future: the same code runs), so that a user calls
/// `lock.lock()` without importing anything, and the seal every lock of the crate carries.
/// Each method says what it does in a line and sends the reader to the trait's method, where
/// its errors and cancel safety are said once.
macro_rules! acquisitions {
    ($handle:ty) => {
        impl $crate::family::sealed::Sealed for $handle {}

        impl $handle {
            /// Acquires the lock, waiting as long as it takes; it is renewed until the guard
            /// is unlocked or dropped. As [`DistributedLock::lock`](crate::DistributedLock::lock).
            ///
            /// # Errors
            ///
            /// As [`DistributedLock::lock`](crate::DistributedLock::lock).
            ///
            /// # Cancel safety
            ///
            /// Cancel safe: no hold is left behind; see
            /// [`DistributedLock::lock`](crate::DistributedLock::lock) for what a cancel gives up.
            pub fn lock(
                &self,
            ) -> impl std::future::Future<
                Output = $crate::Result<<$handle as $crate::DistributedLock>::Guard>,
            > + Send
                   + use<'_> {
                $crate::DistributedLock::lock(self)
            }

            /// Acquires the lock, waiting as long as it takes, for a fixed `lease`, never
            /// renewed. As [`DistributedLock::lock_with_lease`](crate::DistributedLock::lock_with_lease).
            ///
            /// # Errors
            ///
            /// As [`DistributedLock::lock_with_lease`](crate::DistributedLock::lock_with_lease).
            ///
            /// # Cancel safety
            ///
            /// Cancel safe, as [`lock`](Self::lock).
            pub fn lock_with_lease(
                &self,
                lease: std::time::Duration,
            ) -> impl std::future::Future<
                Output = $crate::Result<<$handle as $crate::DistributedLock>::Guard>,
            > + Send
                   + use<'_> {
                $crate::DistributedLock::lock_with_lease(self, lease)
            }

            /// Takes the lock only if no other owner holds it now: one attempt, `Ok(None)`
            /// when another owner does (Redisson's `tryLock()`). As
            /// [`DistributedLock::try_lock_now`](crate::DistributedLock::try_lock_now).
            ///
            /// # Errors
            ///
            /// As [`DistributedLock::try_lock_now`](crate::DistributedLock::try_lock_now).
            ///
            /// # Cancel safety
            ///
            /// Cancel safe, as [`lock`](Self::lock).
            #[doc(alias = "tryLock")]
            pub fn try_lock_now(
                &self,
            ) -> impl std::future::Future<
                Output = $crate::Result<Option<<$handle as $crate::DistributedLock>::Guard>>,
            > + Send
                   + use<'_> {
                $crate::DistributedLock::try_lock_now(self)
            }

            /// Tries to acquire the lock within `wait`, for a fixed `lease` or (`None`) renewed
            /// until the guard goes; `Ok(None)` when it stayed held that long (Redisson's
            /// `tryLock(waitTime, leaseTime, unit)`). As
            /// [`DistributedLock::try_lock`](crate::DistributedLock::try_lock).
            ///
            /// # Errors
            ///
            /// As [`DistributedLock::try_lock`](crate::DistributedLock::try_lock).
            ///
            /// # Cancel safety
            ///
            /// Cancel safe: dropped while waiting, it gives up the wait (a fair lock's place in
            /// the queue).
            #[doc(alias = "tryLock")]
            pub fn try_lock<L: Into<Option<std::time::Duration>>>(
                &self,
                wait: std::time::Duration,
                lease: L,
            ) -> impl std::future::Future<
                Output = $crate::Result<Option<<$handle as $crate::DistributedLock>::Guard>>,
            > + Send
                   + use<'_, L> {
                $crate::DistributedLock::try_lock(self, wait, lease)
            }

            /// Runs `work` while holding the lock, acquired as [`lock`](Self::lock) does, and
            /// unlocks when it ends; the work is dropped and `Error::Lost` returned if the lock
            /// is lost first. As [`DistributedLock::with_lock`](crate::DistributedLock::with_lock).
            ///
            /// # Errors
            ///
            /// As [`DistributedLock::with_lock`](crate::DistributedLock::with_lock).
            ///
            /// # Cancel safety
            ///
            /// Cancel safe: dropping the future drops the work and gives the hold back in the
            /// background.
            pub fn with_lock<F, Fut, T>(
                &self,
                work: F,
            ) -> impl std::future::Future<Output = $crate::Result<T>> + Send + use<'_, F, Fut, T>
            where
                F: FnOnce(
                        <<$handle as $crate::DistributedLock>::Guard as $crate::DistributedGuard>::Context,
                    ) -> Fut
                    + Send,
                Fut: std::future::Future<Output = T> + Send,
                T: Send,
            {
                $crate::DistributedLock::with_lock(self, work)
            }

            /// Runs `work` while holding the lock if it can be had within `wait`; `Ok(None)`
            /// (and `work` is not called) when it could not. As
            /// [`DistributedLock::try_with_lock`](crate::DistributedLock::try_with_lock).
            ///
            /// # Errors
            ///
            /// As [`DistributedLock::try_with_lock`](crate::DistributedLock::try_with_lock).
            ///
            /// # Cancel safety
            ///
            /// Cancel safe, as [`with_lock`](Self::with_lock).
            pub fn try_with_lock<L, F, Fut, T>(
                &self,
                wait: std::time::Duration,
                lease: L,
                work: F,
            ) -> impl std::future::Future<Output = $crate::Result<Option<T>>> + Send + use<'_, L, F, Fut, T>
            where
                L: Into<Option<std::time::Duration>>,
                F: FnOnce(
                        <<$handle as $crate::DistributedLock>::Guard as $crate::DistributedGuard>::Context,
                    ) -> Fut
                    + Send,
                Fut: std::future::Future<Output = T> + Send,
                T: Send,
            {
                $crate::DistributedLock::try_with_lock(self, wait, lease, work)
            }
        }
    };
}
pub(crate) use acquisitions;

/// What a guard's [`run_holding`](DistributedGuard::run_holding) gives once `work` ended or the
/// hold was lost (`outcome`, from `Engine::while_held`): the work's value, the hold given back
/// by `unlock` (a failure only logged: the lock then ends with its lease); or, the work
/// dropped at the loss, [`Error::Lost`] naming `lock` and `owner` (`unlock` never polled: the
/// guard it holds is dropped, which gives the hold back in the background).
pub(crate) async fn after_holding<T>(
    outcome: Option<T>,
    lock: String,
    owner: String,
    unlock: impl Future<Output = Result<()>>,
) -> Result<T> {
    match outcome {
        Some(value) => {
            if let Err(error) = unlock.await {
                tracing::warn!(lock = %lock, %error, "unlock after with_lock's work failed");
            }
            Ok(value)
        }
        None => Err(Error::Lost { lock, owner }),
    }
}

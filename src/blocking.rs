//! A blocking API over the async one, for threads, command-line tools and synchronous services
//! (Redisson's default API is synchronous; reqwest's `blocking` module is the model).
//!
//! A [`LockClient`] here owns a small tokio runtime of its own, on which the client's
//! connections, watchdog and background releases run; every call blocks the calling thread
//! until the async call it wraps returns. The semantics are the async API's: the watchdog renews
//! held locks, a guard gives its hold back when unlocked or dropped, and waiting costs no
//! polling. The owner of a hold is the calling **thread** (the async API's is the task): a
//! thread that holds a lock takes it again at once, and another thread waits for it.
//!
//! ```no_run
//! # fn demo() -> fredlock::Result<()> {
//! use std::time::Duration;
//!
//! let client = fredlock::blocking::LockClient::connect("redis://127.0.0.1:6379")?;
//! let lock = client.lock("orders:1001");
//! let guard = lock.lock()?;                     // blocks this thread until it holds the lock
//! // ... charge the order once ...
//! guard.unlock()?;
//! if let Some(guard) = lock.try_lock(Duration::from_secs(2), None)? {
//!     drop(guard);                              // dropping gives it back too
//! }
//! # Ok(()) }
//! ```
//!
//! Where it may block: plain threads; and every thread of a multi-thread tokio runtime, its
//! `spawn_blocking` threads (where it simply blocks) and its workers (through
//! [`tokio::task::block_in_place`], which first moves the worker's other tasks to another
//! thread). Inside a current-thread runtime (`#[tokio::main(flavor = "current_thread")]`,
//! `#[tokio::test]`), where blocking would stall every task of the runtime and deadlock it on a
//! lock one of them holds, every method returns [`Error::InvalidArgument`] at once, naming the
//! call and the async API to use instead; tokio does not tell such a runtime's
//! `spawn_blocking` threads from its own, so they are refused too.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Runtime;

use crate::config::LockClientBuilder;
use crate::error::{Error, Result};
use crate::lock::guard::LockGuard as AsyncGuard;
use crate::lock::Lock as AsyncLock;
use crate::owner::OwnerId;

/// The runtime and the async client every handle of one blocking client shares.
struct Shared {
    /// `None` only while dropping.
    runtime: Option<Runtime>,
    client: crate::LockClient,
}

impl Shared {
    /// Runs `call` to its end on this client's runtime, blocking the calling thread; refused
    /// where blocking would stall an async runtime (see [`blocking`]).
    fn block_on<T>(&self, what: &str, call: impl Future<Output = Result<T>>) -> Result<T> {
        let Some(runtime) = &self.runtime else {
            return Err(Error::Shutdown);
        };
        blocking(what, || runtime.block_on(call))
    }
}

impl Drop for Shared {
    /// Gives every hold back and closes the connections, as `shutdown` does, then stops the
    /// runtime.
    fn drop(&mut self) {
        let Some(runtime) = self.runtime.take() else {
            return;
        };
        let client = &self.client;
        let mut runtime = Some(runtime);
        let stopped = blocking("LockClient (dropped)", || {
            if let Some(runtime) = runtime.take() {
                runtime.block_on(client.shutdown());
            }
            Ok(())
        });
        if let (Err(error), Some(runtime)) = (stopped, runtime) {
            // Dropped inside a current-thread runtime, which must not block (nor drop a
            // runtime there): the holds end with their leases, as when a process dies.
            tracing::debug!(%error, "a blocking client dropped inside a current-thread runtime");
            runtime.shutdown_background();
        }
    }
}

/// Runs `block`, which blocks the calling thread, where that is safe:
/// - outside any runtime (a plain thread), as it is;
/// - on a thread of a multi-thread runtime, a worker or one of its `spawn_blocking` threads,
///   through [`tokio::task::block_in_place`], which moves the worker's other tasks elsewhere
///   first (on a `spawn_blocking` thread it only runs `block`);
/// - never on a current-thread runtime's thread, where it would stall every task of the
///   runtime (and deadlock it on a lock one of them holds): [`Error::InvalidArgument`] naming
///   `what`. Its `spawn_blocking` threads are refused too: tokio gives no way to tell them from
///   the runtime's own thread.
fn blocking<T>(what: &str, block: impl FnOnce() -> Result<T>) -> Result<T> {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current() {
        Err(_) => block(),
        Ok(handle) if handle.runtime_flavor() == RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(block)
        }
        Ok(_) => Err(Error::InvalidArgument(format!(
            "fredlock::blocking::{what} was called inside a current-thread tokio runtime (or \
             one of its spawn_blocking threads, which tokio does not tell apart), where \
             blocking would stall every task of the runtime: use the async API \
             (fredlock::LockClient) there, or call it from a plain thread or a multi-thread \
             runtime"
        ))),
    }
}

/// A blocking lock client: [`crate::LockClient`] on a runtime of its own. Clones share the
/// client; it shuts down (giving every hold back) when the last clone and the last guard go,
/// or on [`shutdown`](Self::shutdown).
#[derive(Clone)]
pub struct LockClient {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for LockClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockClient")
            .field("id", &self.shared.client.id())
            .finish_non_exhaustive()
    }
}

impl LockClient {
    /// Connects to the Redis at `url` with the default settings; see
    /// [`crate::LockClient::connect`].
    ///
    /// # Errors
    ///
    /// As [`crate::LockClient::connect`]; [`Error::InvalidArgument`] inside a current-thread runtime.
    pub fn connect(url: &str) -> Result<LockClient> {
        LockClient::build_as("LockClient::connect", crate::LockClient::builder().url(url))
    }

    /// Connects with the settings of `builder`; see [`LockClientBuilder::build`].
    ///
    /// # Errors
    ///
    /// As [`LockClientBuilder::build`]; [`Error::InvalidArgument`] inside a current-thread runtime, or
    /// when the runtime cannot be started.
    pub fn build(builder: LockClientBuilder) -> Result<LockClient> {
        LockClient::build_as("LockClient::build", builder)
    }

    /// [`build`](Self::build), for the public call `what`, which an error names.
    fn build_as(what: &str, builder: LockClientBuilder) -> Result<LockClient> {
        blocking(what, || LockClient::start(builder))
    }

    /// Starts the runtime and connects the client on it, blocking the calling thread.
    fn start(builder: LockClientBuilder) -> Result<LockClient> {
        // One worker: the client's own tasks (connections, watchdog, releases) are light, and
        // the calling threads drive their calls themselves.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("fredlock-blocking")
            .enable_all()
            .build()
            .map_err(|error| {
                Error::InvalidArgument(format!(
                    "fredlock::blocking could not start its runtime: {error}"
                ))
            })?;
        let client = runtime.block_on(builder.build())?;
        Ok(LockClient {
            shared: Arc::new(Shared {
                runtime: Some(runtime),
                client,
            }),
        })
    }

    /// The reentrant lock named `name`; see [`crate::LockClient::lock`].
    pub fn lock(&self, name: impl Into<String>) -> Lock {
        self.wrap(self.shared.client.lock(name))
    }

    /// The non-reentrant lock named `name`; see [`crate::Lock::non_reentrant`].
    pub fn non_reentrant_lock(&self, name: impl Into<String>) -> Lock {
        self.wrap(self.shared.client.non_reentrant_lock(name))
    }

    /// The fair lock named `name`; see [`crate::LockClient::fair_lock`].
    pub fn fair_lock(&self, name: impl Into<String>) -> Lock {
        self.wrap(self.shared.client.fair_lock(name).into())
    }

    /// The non-reentrant fair lock named `name`; see
    /// [`crate::LockClient::non_reentrant_fair_lock`].
    pub fn non_reentrant_fair_lock(&self, name: impl Into<String>) -> Lock {
        self.wrap(self.shared.client.non_reentrant_fair_lock(name).into())
    }

    /// The spin lock named `name`; see [`crate::LockClient::spin_lock`].
    pub fn spin_lock(&self, name: impl Into<String>) -> Lock {
        self.wrap(self.shared.client.spin_lock(name).into())
    }

    /// The read lock of the read-write lock named `name`; see [`crate::RwLock::read_lock`].
    pub fn read_lock(&self, name: impl Into<String>) -> Lock {
        self.wrap(self.shared.client.rw_lock(name).read_lock().into())
    }

    /// The write lock of the read-write lock named `name`; see [`crate::RwLock::write_lock`].
    pub fn write_lock(&self, name: impl Into<String>) -> Lock {
        self.wrap(self.shared.client.rw_lock(name).write_lock().into())
    }

    /// The async client underneath, for what this module does not wrap (inspections, other
    /// primitives), to use from async code.
    pub fn as_async(&self) -> &crate::LockClient {
        &self.shared.client
    }

    /// Gives every hold back and closes the connections; see
    /// [`crate::LockClient::shutdown`]. Handles and guards fail with
    /// [`Error::Shutdown`] afterwards.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] inside a current-thread runtime.
    pub fn shutdown(&self) -> Result<()> {
        self.shared.block_on("LockClient::shutdown", async {
            self.shared.client.shutdown().await;
            Ok(())
        })
    }

    fn wrap(&self, lock: AsyncLock) -> Lock {
        Lock {
            shared: self.shared.clone(),
            lock,
            owner: None,
        }
    }
}

/// A blocking handle on a lock of any kind (reentrant, non-reentrant, fair, spin, or one side
/// of a read-write lock), owned by the calling thread unless given an owner.
#[derive(Clone)]
pub struct Lock {
    shared: Arc<Shared>,
    lock: AsyncLock,
    owner: Option<OwnerId>,
}

impl std::fmt::Debug for Lock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lock")
            .field("lock", &self.lock)
            .field("owner", &self.owner)
            .finish_non_exhaustive()
    }
}

impl Lock {
    /// The lock's Redis key.
    pub fn name(&self) -> &str {
        self.lock.name()
    }

    /// The same lock, owned by `owner` instead of the calling thread: for work that takes the
    /// lock on one thread and gives it back on another. See [`OwnerId`].
    pub fn with_owner(mut self, owner: OwnerId) -> Lock {
        self.owner = Some(owner);
        self
    }

    /// Blocks until the lock is held; the watchdog renews it until the guard goes. See
    /// [`crate::DistributedLock::lock`].
    ///
    /// # Errors
    ///
    /// As [`crate::DistributedLock::lock`]; [`Error::InvalidArgument`] inside a current-thread runtime.
    pub fn lock(&self) -> Result<LockGuard> {
        let lock = self.owned();
        self.guard(self.shared.block_on("Lock::lock", lock.lock()))
    }

    /// Blocks until the lock is held, for a fixed `lease`. See [`crate::DistributedLock::lock_with_lease`].
    ///
    /// # Errors
    ///
    /// As [`crate::DistributedLock::lock_with_lease`]; [`Error::InvalidArgument`] inside a current-thread runtime.
    pub fn lock_with_lease(&self, lease: Duration) -> Result<LockGuard> {
        let lock = self.owned();
        self.guard(
            self.shared
                .block_on("Lock::lock_with_lease", lock.lock_with_lease(lease)),
        )
    }

    /// Takes the lock only if no other owner holds it now, without waiting: `Ok(None)` when
    /// another owner does. See [`crate::DistributedLock::try_lock_now`].
    ///
    /// # Errors
    ///
    /// As [`crate::DistributedLock::try_lock_now`]; [`Error::InvalidArgument`] inside a current-thread runtime.
    #[doc(alias = "tryLock")]
    pub fn try_lock_now(&self) -> Result<Option<LockGuard>> {
        self.try_lock(Duration::ZERO, None)
    }

    /// Blocks at most `wait` for the lock: `Ok(None)` when it stayed held that long. See
    /// [`crate::DistributedLock::try_lock`].
    ///
    /// # Errors
    ///
    /// As [`crate::DistributedLock::try_lock`]; [`Error::InvalidArgument`] inside a current-thread runtime.
    #[doc(alias = "tryLock")]
    pub fn try_lock(
        &self,
        wait: Duration,
        lease: impl Into<Option<Duration>>,
    ) -> Result<Option<LockGuard>> {
        let lock = self.owned();
        let guard = self
            .shared
            .block_on("Lock::try_lock", lock.try_lock(wait, lease))?;
        Ok(guard.map(|guard| self.wrap(guard)))
    }

    /// Whether anyone holds the lock. See [`crate::LockFamily::is_locked`].
    ///
    /// # Errors
    ///
    /// As [`crate::LockFamily::is_locked`]; [`Error::InvalidArgument`] inside a current-thread runtime.
    pub fn is_locked(&self) -> Result<bool> {
        self.shared
            .block_on("Lock::is_locked", self.lock.is_locked())
    }

    /// How many holds the calling thread (or the given owner) has. See
    /// [`crate::LockFamily::hold_count`].
    ///
    /// # Errors
    ///
    /// As [`crate::LockFamily::hold_count`]; [`Error::InvalidArgument`] inside a current-thread runtime.
    pub fn hold_count(&self) -> Result<u32> {
        let lock = self.owned();
        self.shared.block_on("Lock::hold_count", lock.hold_count())
    }

    /// Deletes the lock whoever holds it. See [`crate::LockFamily::force_unlock`].
    ///
    /// # Errors
    ///
    /// As [`crate::LockFamily::force_unlock`]; [`Error::InvalidArgument`] inside a current-thread runtime.
    pub fn force_unlock(&self) -> Result<bool> {
        self.shared
            .block_on("Lock::force_unlock", self.lock.force_unlock())
    }

    /// The async lock, owned by this handle's owner (the calling thread's by default).
    fn owned(&self) -> AsyncLock {
        self.lock
            .clone()
            .with_owner(self.owner.unwrap_or_else(OwnerId::current))
    }

    fn guard(&self, guard: Result<AsyncGuard>) -> Result<LockGuard> {
        guard.map(|guard| self.wrap(guard))
    }

    fn wrap(&self, guard: AsyncGuard) -> LockGuard {
        LockGuard {
            shared: self.shared.clone(),
            guard: Some(guard),
        }
    }
}

/// One hold of a lock taken through the blocking API: [`unlock`](Self::unlock) gives it back
/// and reports how that went; dropping it gives it back in the background.
pub struct LockGuard {
    /// Keeps the client (and its runtime) alive while the hold is.
    shared: Arc<Shared>,
    /// `None` once unlocked.
    guard: Option<AsyncGuard>,
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("guard", &self.guard)
            .finish_non_exhaustive()
    }
}

impl LockGuard {
    /// Gives the hold back. See [`crate::LockGuard::unlock`].
    ///
    /// # Errors
    ///
    /// As [`crate::LockGuard::unlock`]; [`Error::InvalidArgument`] inside a current-thread
    /// runtime (the guard is then given back in the background, as a drop does).
    pub fn unlock(mut self) -> Result<()> {
        match self.guard.take() {
            Some(guard) => self.shared.block_on("LockGuard::unlock", guard.unlock()),
            None => Ok(()),
        }
    }

    /// Whether the hold is known lost. See [`crate::LockGuard::is_lost`].
    pub fn is_lost(&self) -> bool {
        self.guard.as_ref().is_none_or(AsyncGuard::is_lost)
    }

    /// The owner field of the hold (`<client uuid>:<owner id>`).
    pub fn owner_field(&self) -> &str {
        self.guard.as_ref().map_or("", AsyncGuard::owner_field)
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if let (Some(guard), Some(runtime)) = (self.guard.take(), &self.shared.runtime) {
            // The async guard queues its release for the client's background task; entering
            // the runtime lets whatever it starts on the way find it.
            let _entered = runtime.enter();
            drop(guard);
        }
    }
}

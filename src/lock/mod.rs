//! The lock family: [`Lock`], Redisson's reentrant `RLock`, the handle every lock of the family
//! shares (each with its own kind), and what they share (`LockKind`, the acquisitions and reads
//! their handles delegate).

pub(crate) mod fair;
pub(crate) mod fenced;
pub(crate) mod guard;
pub(crate) mod leader;
pub(crate) mod reentrant;
pub(crate) mod rw;
pub(crate) mod spin;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::client::LockClient;
use crate::engine::{self, Call, Connection, Inspect, Kind, Lease, Win};
use crate::error::{Error, RedisError, Result};
use crate::family::DistributedLock;
use crate::inspection::Inspection;
use crate::layout::{Found, Pending};
use crate::lock::guard::LockGuard;
use crate::owner::OwnerId;

/// Why a non-reentrant lock refused its holder. Most who meet it did not mean to ask twice: they
/// joined or selected two attempts in one task, which are one owner.
pub(crate) const REENTRY_REFUSED: &str = concat!(
    "holds this non-reentrant lock and asked for it again, which would wait for itself. ",
    "The owner is the tokio task (futures joined or selected in one task are one owner) ",
    "unless pinned with with_owner: give the hold back first, run the other attempt on a task ",
    "of its own or with an owner of its own (with_owner(OwnerId::unique())), ",
    "or take a reentrant lock (client.lock)",
);

/// A reentrant distributed lock, Redisson's `RLock`: at most one owner at a time across every
/// client on the same Redis, Java Redisson clients included.
///
/// The owner is the current tokio task (see [`OwnerId`]): a task that already holds the lock
/// takes it again at once, and must give back every hold before others can have it. Each
/// acquisition returns a [`LockGuard`]; unlocking or dropping it gives back that one hold.
///
/// **One task is one owner**: futures joined or selected inside one task (`tokio::join!`,
/// `select!`, `FuturesUnordered`) all enter together. Spawn a task per contender, give each an
/// owner of its own with [`with_owner`](Self::with_owner)`(`[`OwnerId::unique`]`())` (also the
/// way to keep one owner for work that moves between tasks), or take a
/// [non-reentrant](Self::non_reentrant) lock, which refuses its holder a second hold.
///
/// A lock taken without a lease is kept alive by the client's watchdog for as long as its guard
/// lives; if the process dies, the lock frees itself within the client's watchdog lease (30 s
/// by default). A lock taken with a lease ends when the lease does, held or not.
///
/// Its acquisitions are [`DistributedLock`]'s (`lock`, `try_lock(wait, lease)`, `with_lock`,
/// ..) and its reads [`LockFamily`]'s (`is_locked`, `hold_count`, `inspect`, ..), and are also
/// methods of its own: calling them needs no import.
///
/// ```no_run
/// # async fn demo(client: fredlock::LockClient) -> fredlock::Result<()> {
/// use std::time::Duration;
///
/// let lock = client.lock("orders:1001");
/// let guard = lock.lock().await?;                 // waits as long as needed
/// {
///     let inner = lock.lock().await?;             // same task: hold count 2
///     assert_eq!(lock.hold_count().await?, 2);
///     inner.unlock().await?;
/// }
/// guard.unlock().await?;                          // released; waiters wake
///
/// // At most 2 s of waiting; held for at most 10 s, without renewal.
/// if let Some(guard) = lock.try_lock(Duration::from_secs(2), Some(Duration::from_secs(10))).await? {
///     guard.unlock().await?;
/// }
/// # Ok(()) }
/// ```
///
/// A [`FairLock`](crate::FairLock) converts into a `Lock` (and
/// [`as_lock`](crate::FairLock::as_lock) lends one) for code that takes either kind: its methods
/// are these, with waiters served in arrival order; [`is_fair`](Self::is_fair) tells them apart.
#[derive(Clone)]
pub struct Lock {
    client: LockClient,
    /// The lock's kind: its keys and scripts, and how its waiters wake.
    kind: Arc<dyn LockKind>,
    owner: Option<OwnerId>,
    /// Whether an owner that holds it is refused another hold (see [`Lock::non_reentrant`]).
    non_reentrant: bool,
}

/// A primitive of the reentrant lock's family: the hash of holds at its name, so the reads of
/// [`Lock`] apply, plus a force unlock of its own.
pub(crate) trait LockKind: Kind + Inspect {
    /// Deletes the lock whoever holds it, telling its waiters; replies 1 when it was held.
    fn force_unlock(&self) -> Call;

    /// Whether waiters are served in arrival order.
    fn is_fair(&self) -> bool {
        false
    }

    /// The read-only call that counts `field`'s live holds, for a kind whose field can outlive
    /// its holds (a reader's, whose holds end with their own keys); `None` reads the field.
    fn hold_count(&self, _field: &str) -> Option<Call> {
        None
    }

    /// The value of the hash's `mode` field that makes this side of a read-write lock locked;
    /// `None` for a lock that is locked whenever its hash exists.
    fn locked_mode(&self) -> Option<&'static str> {
        None
    }
}

impl Lock {
    /// A lock of `kind` (of the reentrant family) on `client`.
    pub(crate) fn of_kind<K: LockKind>(client: LockClient, kind: K) -> Lock {
        Lock {
            client,
            kind: Arc::new(kind),
            owner: None,
            non_reentrant: false,
        }
    }

    /// The lock's Redis key: the name it was made with, after the client's
    /// [`key_prefix`](crate::LockClientBuilder::key_prefix) if it has one.
    pub fn name(&self) -> &str {
        self.kind.profile().name()
    }

    /// Whether waiters are served in arrival order (a lock made by
    /// [`LockClient::fair_lock`](crate::LockClient::fair_lock)).
    pub fn is_fair(&self) -> bool {
        self.kind.is_fair()
    }

    /// How long a waiter keeps its place, for a kind whose waiters have one.
    pub(crate) fn kind_place(&self) -> Option<Duration> {
        self.kind.profile().place()
    }

    /// Whether an owner that holds the lock may take it again (see
    /// [`non_reentrant`](Self::non_reentrant)).
    pub fn is_reentrant(&self) -> bool {
        !self.non_reentrant
    }

    /// The same lock, owned by `owner` instead of the current task: for work that acquires in
    /// one task and needs to reenter or query from others. See [`OwnerId`].
    pub fn with_owner(mut self, owner: OwnerId) -> Lock {
        self.owner = Some(owner);
        self
    }

    /// [`LockFamily::is_locked`].
    pub(crate) async fn locked(&self) -> Result<bool> {
        let redis = self.ready()?;
        if let Some(locked) = self.kind.locked_mode() {
            let mode: Option<String> = redis
                .hget(self.kind.profile().name_key(), "mode")
                .await
                .map_err(self.redis_error(None))?;
            return Ok(mode.as_deref() == Some(locked));
        }
        let kind = redis
            .key_type(self.kind.profile().name_key())
            .await
            .map_err(self.redis_error(None))?;
        match kind.as_str() {
            "none" => Ok(false),
            "hash" => Ok(true),
            // As `lock()` finds it: not a lock.
            _ => Err(Error::WrongType {
                lock: self.name().to_owned(),
                key: self.name().to_owned(),
            }),
        }
    }

    /// [`LockFamily::hold_count`].
    pub(crate) async fn holds(&self) -> Result<u32> {
        let redis = self.ready()?;
        let field = self
            .client
            .engine()
            .core()
            .field_with(self.owner(), self.kind.profile().field_suffix());
        let count = match self.kind.hold_count(&field) {
            Some(call) => {
                call.run::<Option<u32>>(&self.client.engine().core().reads())
                    .await
            }
            None => {
                redis
                    .hget::<Option<u32>>(self.kind.profile().name_key(), &field)
                    .await
            }
        };
        count
            .map(Option::unwrap_or_default)
            .map_err(self.redis_error(Some(&field)))
    }

    /// [`LockFamily::remaining_lease`].
    pub(crate) async fn lease_left(&self) -> Result<Option<Duration>> {
        let redis = self.ready()?;
        let ttl = redis
            .pttl(self.kind.profile().name_key())
            .await
            .map_err(self.redis_error(None))?;
        Ok(u64::try_from(ttl).ok().map(Duration::from_millis))
    }

    /// [`LockFamily::force_unlock`].
    pub(crate) async fn force(&self) -> Result<bool> {
        // Sent as every primitive's own call is (the engine checks the client is open and
        // connected first): a refusal for want of a permission asks which, and the error names
        // it and the lock rather than a script's line.
        let deleted: i64 = self
            .client
            .engine()
            .send(&*self.kind, self.kind.force_unlock())
            .await?;
        Ok(deleted == 1)
    }

    /// [`LockFamily::inspect`].
    pub(crate) async fn read(&self) -> Result<Inspection> {
        self.client.engine().inspect(&*self.kind, None).await
    }

    /// The client this lock belongs to.
    pub(crate) fn client(&self) -> &LockClient {
        &self.client
    }

    /// The owner pinned with [`with_owner`](Self::with_owner), if any.
    pub(crate) fn owner_pinned(&self) -> Option<OwnerId> {
        self.owner
    }

    fn owner(&self) -> OwnerId {
        self.owner.unwrap_or_else(OwnerId::current)
    }

    /// For a non-reentrant lock, [`Error::WouldDeadlock`] when its owner holds it already, by
    /// this client's count (nothing is sent).
    fn refuse_reentry(&self) -> Result<()> {
        if !self.non_reentrant {
            return Ok(());
        }
        let engine = self.client.engine();
        let (holds, owner) = engine.holds_of(&*self.kind, self.owner());
        if holds == 0 {
            return Ok(());
        }
        Err(Error::WouldDeadlock {
            lock: self.name().to_owned(),
            owner: owner.to_string(),
            server: engine.core().address.to_string(),
            why: REENTRY_REFUSED.to_owned(),
        })
    }

    fn ready(&self) -> Result<&Connection> {
        let core = self.client.engine().core();
        core.ensure_open()?;
        engine::check_primitive(&*self.kind)?;
        let redis = core.redis();
        redis
            .refused_unconnected()
            .map_err(self.redis_error(None))?;
        Ok(redis)
    }

    /// Acquires the lock for its owner, waiting at most `wait` (`None`: as long as it takes), and
    /// returns the engine's win, for a primitive that builds its own guard from it.
    ///
    /// Not an `async fn`, whose future would keep its arguments beside the engine's: a waiting
    /// task carries it all its wait.
    pub(crate) fn win(
        &self,
        wait: Option<Duration>,
        lease: Lease,
    ) -> impl Future<Output = Result<Option<Win>>> + Send + '_ {
        let kind: Arc<dyn Kind> = self.kind.clone();
        engine::acquire(self.client.engine(), kind, self.owner(), wait, lease)
    }

    /// Acquires the lock as [`win`](Self::win) does, as a [`LockGuard`].
    pub(crate) async fn lock_within(
        &self,
        wait: Option<Duration>,
        lease: Lease,
    ) -> Result<Option<LockGuard>> {
        self.refuse_reentry()?;
        lock_guard(self.win(wait, lease).await)
    }

    /// Converts a Redis error about this lock, naming its server and, where there is one, the
    /// owner.
    fn redis_error<'a, E: Into<RedisError>>(
        &'a self,
        owner: Option<&'a str>,
    ) -> impl FnOnce(E) -> Error + 'a {
        move |source| self.client.engine().redis_error(self.name(), owner, source)
    }
}

/// The guard of a won acquisition.
fn lock_guard(win: Result<Option<Win>>) -> Result<Option<LockGuard>> {
    Ok(win?.map(|win| LockGuard::new(win.guard)))
}

impl Found for Lock {
    fn parts(&self) -> (&LockClient, &dyn Inspect) {
        (&self.client, &*self.kind)
    }

    fn force_unlock(&self) -> Pending<'_, bool> {
        Box::pin(self.force())
    }

    /// Every holder must be `<client uuid>:<id>`: a hash whose fields are not is a user's own
    /// data, not a lock.
    fn holds_owners(&self, inspection: &Inspection) -> bool {
        inspection
            .holders
            .iter()
            .all(|holder| holder.client_id().is_some())
    }
}

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lock")
            .field("name", &self.name())
            .field("fair", &self.is_fair())
            .field("reentrant", &self.is_reentrant())
            .field("owner", &self.owner)
            .finish_non_exhaustive()
    }
}

impl DistributedLock for Lock {
    type Guard = LockGuard;

    fn acquire(
        &self,
        wait: Option<Duration>,
        lease: Option<Duration>,
    ) -> impl Future<Output = Result<Option<LockGuard>>> + Send {
        self.lock_within(wait, lease.map_or(Lease::Watchdog, Lease::Fixed))
    }
}

impl LockFamily for Lock {
    fn as_lock(&self) -> &Lock {
        self
    }
}

crate::family::acquisitions!(Lock);
family_reads!(Lock);

/// What every lock of the reentrant family ([`Lock`] and its fair, spin, fenced, read and write
/// kinds) has beside its acquisitions: reads of its state, a force unlock and an inspection,
/// over the [`Lock`] each of them is. Each lock has these as methods of its own too; the trait
/// is for code over any lock of the family. Sealed: only the crate's locks implement it.
pub trait LockFamily: crate::family::sealed::Sealed {
    /// This lock as a [`Lock`], for code that takes any lock of the family; it keeps its kind.
    fn as_lock(&self) -> &Lock;

    /// The lock's Redis key: the name it was made with, after the client's
    /// [`key_prefix`](crate::LockClientBuilder::key_prefix) if it has one.
    fn name(&self) -> &str {
        self.as_lock().name()
    }

    /// Whether anyone holds the lock. For a side of a [`RwLock`](crate::RwLock), whether the
    /// lock is in that side's mode, as Redisson says: a writer that took read holds keeps it in
    /// write mode.
    ///
    /// # Errors
    ///
    /// [`Error::WrongType`](crate::Error::WrongType) when the key holds another type, as
    /// [`lock`](DistributedLock::lock) says.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    fn is_locked(&self) -> impl Future<Output = Result<bool>> + Send {
        self.as_lock().locked()
    }

    /// Whether the current task (or the pinned owner) holds the lock.
    ///
    /// # Errors
    ///
    /// [`Error::WrongType`](crate::Error::WrongType) when the key holds another type;
    /// [`Error::Redis`](crate::Error::Redis) when the server cannot be asked;
    /// [`Error::Shutdown`](crate::Error::Shutdown) after the client shut down.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    fn is_held_by_current_task(&self) -> impl Future<Output = Result<bool>> + Send {
        let count = self.as_lock().holds();
        async move { Ok(count.await? > 0) }
    }

    /// How many holds the current task (or the pinned owner) has on the lock; 0 if none.
    ///
    /// # Errors
    ///
    /// As [`is_held_by_current_task`](Self::is_held_by_current_task).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    fn hold_count(&self) -> impl Future<Output = Result<u32>> + Send {
        self.as_lock().holds()
    }

    /// How long the lock lives unless renewed; `None` when it is not held or has no expiry.
    ///
    /// # Errors
    ///
    /// As [`is_held_by_current_task`](Self::is_held_by_current_task).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    fn remaining_lease(&self) -> impl Future<Output = Result<Option<Duration>>> + Send {
        self.as_lock().lease_left()
    }

    /// Deletes the lock whoever holds it and wakes its waiters (of a fair lock, the first in
    /// line, which keeps its place); `true` if it was held.
    ///
    /// The holder's client is told at once (on its own channel, `fredlock_client:<client id>`,
    /// which a client listens on from its first hold of a lock): its guards' `lost()` fire
    /// within a round trip or two. A spin lock's client, which never subscribes, and a Java
    /// client find the lock gone at their next renewal, within a third of the watchdog lease.
    ///
    /// # Errors
    ///
    /// [`Error::WrongType`](crate::Error::WrongType), deleting nothing, when the key is not a
    /// lock: another type, or a hash whose fields are not `<client uuid>:<owner id>` owners
    /// with hold counts (a user's own hash that happens to have the lock's name).
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe in the sense that the deletion may happen although the future was
    /// dropped before reporting it.
    fn force_unlock(&self) -> impl Future<Output = Result<bool>> + Send {
        self.as_lock().force()
    }

    /// What Redis holds of this lock now: its holders with their hold counts and remaining
    /// lease, a fair lock's queue with each place's remaining time, a fenced lock's last token,
    /// and every key with its expiry. Read in one script call on the master.
    ///
    /// ```no_run
    /// # async fn demo(client: fredlock::LockClient) -> fredlock::Result<()> {
    ///
    /// let seen = client.lock("orders:1001").inspect().await?;
    /// for holder in &seen.holders {
    ///     println!("{} holds it {} time(s), {:?} left", holder.owner, holder.count, holder.remaining_lease);
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::WrongType`](crate::Error::WrongType) when the key holds another type;
    /// [`Error::Redis`](crate::Error::Redis) when the server cannot be asked.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    fn inspect(&self) -> impl Future<Output = Result<Inspection>> + Send {
        self.as_lock().read()
    }
}

/// Gives `$handle`, a [`LockFamily`], the trait's reads, force unlock and inspection as methods
/// of its own, forwarding to the trait's, so that no import is needed (as
/// [`acquisitions!`](crate::family::acquisitions) does for the acquisitions); `with name` adds
/// [`name`](LockFamily::name) too, for a handle that has none of its own.
macro_rules! family_reads {
    ($handle:ty, with name) => {
        impl $handle {
            /// The lock's Redis key, as [`LockFamily::name`](crate::LockFamily::name).
            pub fn name(&self) -> &str {
                $crate::LockFamily::as_lock(self).name()
            }
        }
        $crate::lock::family_reads!($handle);
    };
    ($handle:ty) => {
        impl $handle {
            /// Whether anyone holds the lock (a side of a read-write lock: whether the lock is
            /// in that side's mode). As [`LockFamily::is_locked`](crate::LockFamily::is_locked).
            ///
            /// # Errors
            ///
            /// As [`LockFamily::is_locked`](crate::LockFamily::is_locked).
            ///
            /// # Cancel safety
            ///
            /// Cancel safe: it only reads.
            pub fn is_locked(
                &self,
            ) -> impl std::future::Future<Output = $crate::Result<bool>> + Send + use<'_> {
                $crate::LockFamily::is_locked(self)
            }

            /// Whether the current task (or the pinned owner) holds the lock. As
            /// [`LockFamily::is_held_by_current_task`](crate::LockFamily::is_held_by_current_task).
            ///
            /// # Errors
            ///
            /// As [`LockFamily::is_held_by_current_task`](crate::LockFamily::is_held_by_current_task).
            ///
            /// # Cancel safety
            ///
            /// Cancel safe: it only reads.
            pub fn is_held_by_current_task(
                &self,
            ) -> impl std::future::Future<Output = $crate::Result<bool>> + Send + use<'_> {
                $crate::LockFamily::is_held_by_current_task(self)
            }

            /// How many holds the current task (or the pinned owner) has on the lock. As
            /// [`LockFamily::hold_count`](crate::LockFamily::hold_count).
            ///
            /// # Errors
            ///
            /// As [`LockFamily::hold_count`](crate::LockFamily::hold_count).
            ///
            /// # Cancel safety
            ///
            /// Cancel safe: it only reads.
            pub fn hold_count(
                &self,
            ) -> impl std::future::Future<Output = $crate::Result<u32>> + Send + use<'_> {
                $crate::LockFamily::hold_count(self)
            }

            /// How long the lock lives unless renewed. As
            /// [`LockFamily::remaining_lease`](crate::LockFamily::remaining_lease).
            ///
            /// # Errors
            ///
            /// As [`LockFamily::remaining_lease`](crate::LockFamily::remaining_lease).
            ///
            /// # Cancel safety
            ///
            /// Cancel safe: it only reads.
            pub fn remaining_lease(
                &self,
            ) -> impl std::future::Future<
                Output = $crate::Result<Option<std::time::Duration>>,
            > + Send
                   + use<'_> {
                $crate::LockFamily::remaining_lease(self)
            }

            /// Deletes the lock whoever holds it and wakes its waiters; `true` if it was held.
            /// As [`LockFamily::force_unlock`](crate::LockFamily::force_unlock).
            ///
            /// # Errors
            ///
            /// As [`LockFamily::force_unlock`](crate::LockFamily::force_unlock).
            ///
            /// # Cancel safety
            ///
            /// Not cancel safe: the deletion may happen although the future was dropped.
            pub fn force_unlock(
                &self,
            ) -> impl std::future::Future<Output = $crate::Result<bool>> + Send + use<'_> {
                $crate::LockFamily::force_unlock(self)
            }

            /// What Redis holds of this lock now. As
            /// [`LockFamily::inspect`](crate::LockFamily::inspect).
            ///
            /// # Errors
            ///
            /// As [`LockFamily::inspect`](crate::LockFamily::inspect).
            ///
            /// # Cancel safety
            ///
            /// Cancel safe: it only reads.
            pub fn inspect(
                &self,
            ) -> impl std::future::Future<Output = $crate::Result<$crate::Inspection>> + Send + use<'_>
            {
                $crate::LockFamily::inspect(self)
            }
        }
    };
}
pub(crate) use family_reads;

/// Makes `$handle`, a lock of the reentrant family whose field `lock` is the [`Lock`] it wraps
/// and whose guard is a [`LockGuard`], a [`DistributedLock`] and a [`LockFamily`] as its
/// [`Lock`] is.
macro_rules! lock_of_family {
    ($handle:ty) => {
        impl $crate::DistributedLock for $handle {
            type Guard = $crate::LockGuard;

            fn acquire(
                &self,
                wait: Option<std::time::Duration>,
                lease: Option<std::time::Duration>,
            ) -> impl std::future::Future<Output = $crate::Result<Option<$crate::LockGuard>>> + Send
            {
                self.lock.acquire(wait, lease)
            }
        }

        impl $crate::LockFamily for $handle {
            fn as_lock(&self) -> &$crate::Lock {
                &self.lock
            }
        }

        $crate::family::acquisitions!($handle);
        $crate::lock::family_reads!($handle, with name);
    };
}
pub(crate) use lock_of_family;

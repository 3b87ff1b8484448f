//! The lock family: [`Lock`], Redisson's reentrant `RLock`, the handle every lock of the family
//! shares (each with its own kind), and what they share (`LockKind`, the acquisitions and reads
//! their handles delegate).

pub(crate) mod fair;
pub(crate) mod fenced;
pub(crate) mod guard;
pub(crate) mod reentrant;
pub(crate) mod rw;
pub(crate) mod spin;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use fred::interfaces::{HashesInterface, KeysInterface};
use fred::types::Value;

use crate::client::LockClient;
use crate::engine::{
    self, AcquireArgs, Call, Inspect, Kind, Lease, Primitive, Profile, ReleaseArgs, Request, Win,
};
use crate::error::{waited, Error, Result};
use crate::inspection::{Details, Holder, Inspection, Leak, Tail};
use crate::layout::{Found, Pending};
use crate::lock::guard::LockGuard;
use crate::owner::OwnerId;

/// Why a non-reentrant lock refused its holder. Most who meet it did not mean to ask twice: they
/// joined or selected two attempts in one task, which are one owner.
const REENTRY_REFUSED: &str = concat!(
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

/// A lock of the family whose owner is refused a second hold (see [`Lock::non_reentrant`]).
///
/// [`Lock`] refuses at once, sending nothing, when the client counts a hold of the owner; this
/// refuses in the owner's turn, where the count is exact, an attempt that set out while another
/// of the same owner was on its way (futures joined in one task): without it, that attempt
/// would take a second hold, and both would run.
struct NonReentrant(Arc<dyn LockKind>);

impl Primitive for NonReentrant {
    fn profile(&self) -> &Profile {
        self.0.profile()
    }
}

impl Kind for NonReentrant {
    fn acquire(&self, args: &AcquireArgs<'_>) -> Call {
        if args.holds == 0 {
            return self.0.acquire(args);
        }
        Call {
            script: &reentrant::LOCK_REFUSE_REENTRY,
            keys: vec![self.0.profile().keys().get(0)],
            args: vec![Value::from_static_str(REENTRY_REFUSED)],
        }
    }
    fn release(&self, args: &ReleaseArgs<'_>) -> Call {
        self.0.release(args)
    }
    fn leave(&self, field: &str, request: &Request) -> Option<Call> {
        self.0.leave(field, request)
    }
}

impl Inspect for NonReentrant {
    fn inspect(&self) -> Call {
        self.0.inspect()
    }
    fn family(&self) -> &'static str {
        self.0.family()
    }
    fn strays(&self) -> Option<String> {
        self.0.strays()
    }
    fn details(&self, tail: &mut Tail, holders: &mut [Holder]) -> Result<Details, String> {
        self.0.details(tail, holders)
    }
    fn leaks(&self, inspection: &Inspection, grace: Duration) -> Vec<Leak> {
        self.0.leaks(inspection, grace)
    }
}

impl LockKind for NonReentrant {
    fn force_unlock(&self) -> Call {
        self.0.force_unlock()
    }
    fn is_fair(&self) -> bool {
        self.0.is_fair()
    }
    fn hold_count(&self, field: &str) -> Option<Call> {
        self.0.hold_count(field)
    }
    fn locked_mode(&self) -> Option<&'static str> {
        self.0.locked_mode()
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

    /// The same lock, non-reentrant: an owner that holds it and asks for it again gets
    /// [`Error::WouldDeadlock`] at once, with nothing sent or changed, instead of a second hold
    /// (Redisson 4's `RedissonNonReentrantLock`). The layout in Redis is the reentrant lock's
    /// (an owner's field never counts above 1), so Redisson's clients and reentrant handles
    /// on the same name exclude it as any lock. For code where taking a lock twice is a bug:
    /// the second `lock()` of a task that already holds it would otherwise succeed silently.
    ///
    /// ```no_run
    /// # async fn demo(client: fredlock::LockClient) -> fredlock::Result<()> {
    /// let lock = client.lock("orders:1001").non_reentrant(); // or client.non_reentrant_lock(..)
    /// let guard = lock.lock().await?;
    /// assert!(matches!(lock.lock().await, Err(fredlock::Error::WouldDeadlock { .. })));
    /// guard.unlock().await?;
    /// # Ok(()) }
    /// ```
    pub fn non_reentrant(mut self) -> Lock {
        if !self.non_reentrant {
            self.kind = Arc::new(NonReentrant(self.kind));
        }
        self.non_reentrant = true;
        self
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

    /// Acquires the lock, waiting as long as it takes; the watchdog renews it until the guard is
    /// unlocked or dropped.
    ///
    /// Waiting costs no polling: the waiter sleeps until an unlock is published on the lock's
    /// channel, or at most until the holder's lease would end, so a lost message costs time and
    /// never a hang. While Redis is unreachable the waiter keeps trying, with backoff.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an empty name, [`Error::WrongType`] when the key is not a
    /// hash, [`Error::Redis`] when Redis rejects the script, [`Error::Shutdown`] when the client
    /// shuts down. Connection failures are not errors here: it keeps trying until Redis is back.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the future is dropped, no hold is left behind. An acquire request already
    /// sent runs to completion in a task of its own, which gives the hold back if it won.
    pub async fn lock(&self) -> Result<LockGuard> {
        self.refuse_reentry()?;
        lock_guard(self.win(None, Lease::Watchdog).await).and_then(waited)
    }

    /// Acquires the lock, waiting as long as it takes, for a fixed `lease`: the lock ends by
    /// itself that long after it was taken, released or not, and is never renewed.
    ///
    /// # Errors
    ///
    /// As [`lock`](Self::lock), and [`Error::InvalidArgument`] for a lease under 1 ms or over
    /// [`MAX_DURATION`](crate::MAX_DURATION).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`lock`](Self::lock).
    pub async fn lock_with_lease(&self, lease: Duration) -> Result<LockGuard> {
        self.refuse_reentry()?;
        lock_guard(self.win(None, Lease::Fixed(lease)).await).and_then(waited)
    }

    /// Takes the lock only if no other owner holds it now, without waiting: `Ok(None)` when
    /// another owner does. The lock is renewed by the watchdog until the guard goes.
    ///
    /// This is tokio's [`Mutex::try_lock`](tokio::sync::Mutex::try_lock) and Redisson's
    /// `tryLock()`: one attempt, one round trip. The same as
    /// [`try_lock(Duration::ZERO, None)`](Self::try_lock).
    ///
    /// ```no_run
    /// # async fn demo(client: fredlock::LockClient) -> fredlock::Result<()> {
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
    /// As [`try_lock`](Self::try_lock): [`Error::Unavailable`] at once while Redis
    /// cannot be reached (never `Ok(None)`, which always means that another owner holds it).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`lock`](Self::lock).
    #[doc(alias = "tryLock")]
    pub async fn try_lock_now(&self) -> Result<Option<LockGuard>> {
        self.try_lock(Duration::ZERO, None).await
    }

    /// Tries to acquire the lock within `wait`: `Ok(None)` when it stayed held that long.
    ///
    /// This is Redisson's `tryLock(waitTime, leaseTime, unit)`. `wait` zero makes exactly one
    /// attempt. `lease` is a [`Duration`] (or `Some(d)`): the lock ends by itself that long
    /// after it was taken and is never renewed; or `None`: the watchdog renews it until the
    /// guard goes (Redisson's `leaseTime` of -1).
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
    /// As [`lock_with_lease`](Self::lock_with_lease). A connection failure is retried within the
    /// wait; when the wait ends and no attempt got an answer from Redis (it was down, refused
    /// connections, or did not reply), [`Error::Unavailable`] with the last failure, never
    /// `Ok(None)`, which always means that another owner held the lock. A zero `wait` makes
    /// one attempt, and fails at once with `Unavailable` while the client is disconnected.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`lock`](Self::lock).
    #[doc(alias = "tryLock")]
    pub async fn try_lock(
        &self,
        wait: Duration,
        lease: impl Into<Option<Duration>>,
    ) -> Result<Option<LockGuard>> {
        self.refuse_reentry()?;
        let lease = lease.into().map_or(Lease::Watchdog, Lease::Fixed);
        lock_guard(self.win(Some(wait), lease).await)
    }

    /// Runs `work` while holding the lock: acquires it as [`lock`](Self::lock) does (renewed by
    /// the watchdog), runs the future `work` makes, and unlocks when it ends, returning its
    /// value.
    ///
    /// `work` receives the guard's [`CancellationToken`](crate::CancellationToken), cancelled
    /// when the lock is lost, for work that wants to stop cleanly at a point of its choosing. If
    /// the lock is lost while the future runs, the future is dropped at its next await and
    /// [`Error::Lost`] returned: the work never goes on unprotected past the moment the loss is
    /// known.
    ///
    /// ```no_run
    /// # async fn demo(client: fredlock::LockClient) -> fredlock::Result<()> {
    /// # async fn charge(order: u64) -> u64 { order }
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
    /// [`Error::Lost`] when it was lost while the work ran. When the work finished while the lock
    /// was held, its value is returned even if the unlock afterwards fails (the lock then ends
    /// with its lease; the failure is logged at `warn`).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future drops the work where it stands and gives the hold back
    /// in the background, as dropping a [`LockGuard`] does.
    pub async fn with_lock<F, Fut, T>(&self, work: F) -> Result<T>
    where
        F: FnOnce(tokio_util::sync::CancellationToken) -> Fut,
        Fut: std::future::Future<Output = T>,
    {
        let guard = self.lock().await?;
        let work = work(guard.cancellation_token());
        guard.run_holding(work).await
    }

    /// Runs `work` while holding the lock if it can be had within `wait`: `Ok(None)` (and
    /// `work` is not called) when another owner held it that long. The bounded form of
    /// [`with_lock`](Self::with_lock), acquiring as [`try_lock`](Self::try_lock) does:
    /// `wait` zero makes one attempt, `lease` `None` renews the lock with the watchdog while the
    /// work runs, `Some(lease)` holds it for that long at most (the work is dropped and
    /// [`Error::Lost`] returned if it outlives it).
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
    /// [`with_lock`](Self::with_lock) once it is: [`Error::Lost`] when it was lost while the work
    /// ran.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`with_lock`](Self::with_lock): dropped while waiting, it gives up the
    /// wait (a fair lock's place in the queue); dropped while the work runs, it drops the work
    /// and gives the hold back in the background.
    pub async fn try_with_lock<F, Fut, T>(
        &self,
        wait: Duration,
        lease: impl Into<Option<Duration>>,
        work: F,
    ) -> Result<Option<T>>
    where
        F: FnOnce(tokio_util::sync::CancellationToken) -> Fut,
        Fut: std::future::Future<Output = T>,
    {
        let Some(guard) = self.try_lock(wait, lease).await? else {
            return Ok(None);
        };
        let work = work(guard.cancellation_token());
        guard.run_holding(work).await.map(Some)
    }

    /// Whether anyone holds the lock. For a side of a [`RwLock`](crate::RwLock), whether the
    /// lock is in that side's mode, as Redisson says: a writer that took read holds keeps it in
    /// write mode.
    ///
    /// # Errors
    ///
    /// [`Error::WrongType`] when the key holds another type, as [`lock`](Self::lock) says.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn is_locked(&self) -> Result<bool> {
        let redis = self.ready()?;
        if let Some(locked) = self.kind.locked_mode() {
            let mode: Option<String> = redis
                .hget(self.kind.profile().name_key(), "mode")
                .await
                .map_err(self.redis_error(None))?;
            return Ok(mode.as_deref() == Some(locked));
        }
        let kind: String = redis
            .r#type(self.kind.profile().name_key())
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

    /// Whether the current task (or the pinned owner) holds the lock.
    ///
    /// # Errors
    ///
    /// [`Error::WrongType`] when the key holds another type; [`Error::Redis`] when the server
    /// cannot be asked; [`Error::Shutdown`] after the client shut down.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn is_held_by_current_task(&self) -> Result<bool> {
        Ok(self.hold_count().await? > 0)
    }

    /// How many holds the current task (or the pinned owner) has on the lock; 0 if none.
    ///
    /// # Errors
    ///
    /// [`Error::WrongType`] when the key holds another type; [`Error::Redis`] when the server
    /// cannot be asked; [`Error::Shutdown`] after the client shut down.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn hold_count(&self) -> Result<u32> {
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
                    .hget::<Option<u32>, _, _>(self.kind.profile().name_key(), &*field)
                    .await
            }
        };
        count
            .map(Option::unwrap_or_default)
            .map_err(self.redis_error(Some(&field)))
    }

    /// How long the lock lives unless renewed; `None` when it is not held or has no expiry.
    ///
    /// # Errors
    ///
    /// [`Error::WrongType`] when the key holds another type; [`Error::Redis`] when the server
    /// cannot be asked; [`Error::Shutdown`] after the client shut down.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn remaining_lease(&self) -> Result<Option<Duration>> {
        let redis = self.ready()?;
        let ttl = redis
            .pttl::<i64, _>(self.kind.profile().name_key())
            .await
            .map_err(self.redis_error(None))?;
        Ok(u64::try_from(ttl).ok().map(Duration::from_millis))
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
    /// [`Error::WrongType`], deleting nothing, when the key is not a lock: another type, or a
    /// hash whose fields are not `<client uuid>:<owner id>` owners with hold counts (a user's own
    /// hash that happens to have the lock's name).
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe in the sense that the deletion may happen although the future was
    /// dropped before reporting it.
    pub async fn force_unlock(&self) -> Result<bool> {
        self.ready()?;
        let deleted: i64 = self
            .kind
            .force_unlock()
            .run(&self.client.engine().core().writer)
            .await
            .map_err(self.redis_error(None))?;
        Ok(deleted == 1)
    }

    /// What Redis holds of this lock now: its holders with their hold counts and remaining
    /// lease, a fair lock's queue with each place's remaining time, a fenced lock's last token,
    /// and every key with its expiry. Read in one script call on the master.
    ///
    /// ```no_run
    /// # async fn demo(client: fredlock::LockClient) -> fredlock::Result<()> {
    /// let seen = client.lock("orders:1001").inspect().await?;
    /// for holder in &seen.holders {
    ///     println!("{} holds it {} time(s), {:?} left", holder.owner, holder.count, holder.remaining_lease);
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::WrongType`] when the key holds another type; [`Error::Redis`] when the server
    /// cannot be asked.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn inspect(&self) -> Result<Inspection> {
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

    fn ready(&self) -> Result<&fred::clients::Client> {
        let core = self.client.engine().core();
        core.ensure_open()?;
        engine::check_primitive(&*self.kind)?;
        Ok(core.redis())
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

    /// Converts a fred error about this lock, naming its server and, where there is one, the
    /// owner.
    fn redis_error<'a>(
        &'a self,
        owner: Option<&'a str>,
    ) -> impl FnOnce(fred::error::Error) -> Error + 'a {
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
        Box::pin(Lock::force_unlock(self))
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

/// The acquisitions every lock of the reentrant family that returns a [`LockGuard`] shares with
/// [`Lock`], for a handle whose field `lock` is the `Lock` it wraps: `$waits` says how its waiter
/// waits, `$cancel` what a dropped wait gives up, `$try_lock` what `try_lock` adds.
macro_rules! lock_acquires {
    (waits: $waits:literal, cancel: $cancel:literal, try_lock: $try_lock:literal $(,)?) => {
        /// Acquires the lock, waiting as long as it takes; the watchdog renews it until the
        /// guard goes. See [`Lock::lock`](crate::Lock::lock).
        ///
        #[doc = $waits]
        ///
        /// # Errors
        ///
        /// As [`Lock::lock`](crate::Lock::lock).
        ///
        /// # Cancel safety
        ///
        #[doc = $cancel]
        pub async fn lock(&self) -> $crate::Result<$crate::LockGuard> {
            self.lock.lock().await
        }

        /// Acquires the lock, waiting as long as it takes, for a fixed `lease`. See
        /// [`Lock::lock_with_lease`](crate::Lock::lock_with_lease).
        ///
        /// # Errors
        ///
        /// As [`Lock::lock_with_lease`](crate::Lock::lock_with_lease).
        ///
        /// # Cancel safety
        ///
        /// Cancel safe, as [`lock`](Self::lock).
        pub async fn lock_with_lease(
            &self,
            lease: std::time::Duration,
        ) -> $crate::Result<$crate::LockGuard> {
            self.lock.lock_with_lease(lease).await
        }

        /// Takes the lock only if no other owner holds it now, without waiting: `Ok(None)`
        /// when another owner does. See [`Lock::try_lock_now`](crate::Lock::try_lock_now).
        ///
        /// # Errors
        ///
        /// As [`Lock::try_lock_now`](crate::Lock::try_lock_now).
        ///
        /// # Cancel safety
        ///
        /// Cancel safe, as [`lock`](Self::lock).
        #[doc(alias = "tryLock")]
        pub async fn try_lock_now(&self) -> $crate::Result<Option<$crate::LockGuard>> {
            self.lock.try_lock_now().await
        }

        /// Tries to acquire the lock within `wait`: `Ok(None)` when it stayed held that long.
        /// See [`Lock::try_lock`](crate::Lock::try_lock).
        ///
        #[doc = $try_lock]
        ///
        /// # Errors
        ///
        /// As [`Lock::try_lock`](crate::Lock::try_lock).
        ///
        /// # Cancel safety
        ///
        /// Cancel safe, as [`lock`](Self::lock).
        #[doc(alias = "tryLock")]
        pub async fn try_lock(
            &self,
            wait: std::time::Duration,
            lease: impl Into<Option<std::time::Duration>>,
        ) -> $crate::Result<Option<$crate::LockGuard>> {
            self.lock.try_lock(wait, lease).await
        }

        /// Runs `work` while holding the lock; see [`Lock::with_lock`](crate::Lock::with_lock).
        ///
        /// # Errors
        ///
        /// As [`Lock::with_lock`](crate::Lock::with_lock).
        ///
        /// # Cancel safety
        ///
        /// Cancel safe, as [`lock`](Self::lock): dropping the future drops the work where it
        /// stands and gives the hold back in the background.
        pub async fn with_lock<F, Fut, T>(&self, work: F) -> $crate::Result<T>
        where
            F: FnOnce(tokio_util::sync::CancellationToken) -> Fut,
            Fut: std::future::Future<Output = T>,
        {
            self.lock.with_lock(work).await
        }

        /// Runs `work` while holding the lock if it can be had within `wait`; `Ok(None)` when
        /// not. See [`Lock::try_with_lock`](crate::Lock::try_with_lock).
        ///
        /// # Errors
        ///
        /// As [`Lock::try_with_lock`](crate::Lock::try_with_lock).
        ///
        /// # Cancel safety
        ///
        /// As [`Lock::try_with_lock`](crate::Lock::try_with_lock).
        pub async fn try_with_lock<F, Fut, T>(
            &self,
            wait: std::time::Duration,
            lease: impl Into<Option<std::time::Duration>>,
            work: F,
        ) -> $crate::Result<Option<T>>
        where
            F: FnOnce(tokio_util::sync::CancellationToken) -> Fut,
            Fut: std::future::Future<Output = T>,
        {
            self.lock.try_with_lock(wait, lease, work).await
        }
    };
}
pub(crate) use lock_acquires;

/// The reads and the force unlock every lock of the reentrant family shares with [`Lock`],
/// for a handle whose field `lock` is the `Lock` it wraps.
macro_rules! lock_reads {
    () => {
        /// Whether anyone holds the lock; see [`Lock::is_locked`](crate::Lock::is_locked).
        ///
        /// # Errors
        ///
        /// As [`Lock::is_locked`](crate::Lock::is_locked).
        ///
        /// # Cancel safety
        ///
        /// Cancel safe: it only reads.
        pub async fn is_locked(&self) -> $crate::Result<bool> {
            self.lock.is_locked().await
        }

        /// Whether the current task (or the pinned owner) holds the lock.
        ///
        /// # Errors
        ///
        /// As [`Lock::is_held_by_current_task`](crate::Lock::is_held_by_current_task).
        ///
        /// # Cancel safety
        ///
        /// Cancel safe: it only reads.
        pub async fn is_held_by_current_task(&self) -> $crate::Result<bool> {
            self.lock.is_held_by_current_task().await
        }

        /// How many holds the current task (or the pinned owner) has on the lock; 0 if none.
        ///
        /// # Errors
        ///
        /// As [`Lock::hold_count`](crate::Lock::hold_count).
        ///
        /// # Cancel safety
        ///
        /// Cancel safe: it only reads.
        pub async fn hold_count(&self) -> $crate::Result<u32> {
            self.lock.hold_count().await
        }

        /// How long the lock lives unless renewed; `None` when it is not held or has no expiry.
        ///
        /// # Errors
        ///
        /// As [`Lock::remaining_lease`](crate::Lock::remaining_lease).
        ///
        /// # Cancel safety
        ///
        /// Cancel safe: it only reads.
        pub async fn remaining_lease(&self) -> $crate::Result<Option<std::time::Duration>> {
            self.lock.remaining_lease().await
        }

        /// Deletes the lock whoever holds it and wakes its waiters; `true` if it was held. See
        /// [`Lock::force_unlock`](crate::Lock::force_unlock).
        ///
        /// # Errors
        ///
        /// As [`Lock::force_unlock`](crate::Lock::force_unlock).
        ///
        /// # Cancel safety
        ///
        /// As [`Lock::force_unlock`](crate::Lock::force_unlock).
        pub async fn force_unlock(&self) -> $crate::Result<bool> {
            self.lock.force_unlock().await
        }

        /// What Redis holds of the lock now; see [`Lock::inspect`](crate::Lock::inspect).
        ///
        /// # Errors
        ///
        /// As [`Lock::inspect`](crate::Lock::inspect).
        ///
        /// # Cancel safety
        ///
        /// Cancel safe: it only reads.
        pub async fn inspect(&self) -> $crate::Result<$crate::Inspection> {
            self.lock.inspect().await
        }

        /// The lock's Redis key; see [`Lock::name`](crate::Lock::name).
        pub fn name(&self) -> &str {
            self.lock.name()
        }

        /// This lock as a [`Lock`](crate::Lock), for code that takes any lock of the family;
        /// it keeps its kind.
        pub fn as_lock(&self) -> &crate::Lock {
            &self.lock
        }
    };
}
pub(crate) use lock_reads;

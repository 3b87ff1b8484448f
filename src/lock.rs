//! [`Lock`]: Redisson's reentrant `RLock`, for async Rust.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use fred::interfaces::{ClientLike, HashesInterface, KeysInterface};
use tokio::time::Instant;

use crate::client::{Core, LockClient};
use crate::durations;
use crate::error::{Error, Result};
use crate::fair_lock::Leave;
use crate::guard::LockGuard;
use crate::holds::Lease;
use crate::inflight::InFlight;
use crate::keys::{LockKeys, Taken};
use crate::owner::OwnerId;
use crate::pubsub::Waiter;
use crate::releaser::{Cleanup, SettleOnExit, Undo};

/// An attempt that began before the wait's deadline may run this much past it, so that a
/// request already on the wire is not thrown away (and undone) for being a little late.
const ATTEMPT_GRACE: Duration = Duration::from_millis(100);

/// First pause after a connection error while waiting; doubled up to [`MAX_ERROR_PAUSE`].
const MIN_ERROR_PAUSE: Duration = Duration::from_millis(50);
const MAX_ERROR_PAUSE: Duration = Duration::from_secs(1);

/// A reentrant distributed lock, Redisson's `RLock`: at most one owner at a time across every
/// client on the same Redis, Java Redisson clients included.
///
/// The owner is the current tokio task (see [`OwnerId`]): a task that already holds the lock
/// takes it again at once, and must give back every hold before others can have it. Each
/// acquisition returns a [`LockGuard`]; unlocking or dropping it gives back that one hold.
///
/// A lock taken without a lease is kept alive by the client's watchdog for as long as its guard
/// lives; if the process dies, the lock frees itself within the client's watchdog timeout (30 s
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
    /// The name, the keys and channels derived from it, and the scripts of the lock's kind.
    keys: Arc<LockKeys>,
    owner: Option<OwnerId>,
}

/// What one run of the acquire script said.
enum Attempt {
    Acquired(LockGuard),
    Held {
        retry_after: Duration,
    },
    /// The caller's deadline passed before the reply came; the attempt is undone if it won.
    TimedOut,
}

/// What an acquire call did in Redis, carried out of [`InFlight`] with its undo armed, so that
/// an abandoned call undoes itself.
enum Outcome {
    /// Dropping the guard, if nobody claims it, gives the hold back.
    Won(LockGuard),
    /// Held by another owner: the TTL in ms, and for a fair lock the place in its queue.
    Held(i64, Option<Undo>),
}

impl Lock {
    pub(crate) fn new(client: LockClient, keys: LockKeys) -> Lock {
        Lock {
            client,
            keys: Arc::new(keys),
            owner: None,
        }
    }

    /// The lock's Redis key: the name it was made with, after the client's
    /// [`key_prefix`](crate::LockClientBuilder::key_prefix) if it has one.
    pub fn name(&self) -> &str {
        &self.keys.name
    }

    /// Whether waiters are served in arrival order (a lock made by
    /// [`LockClient::fair_lock`](crate::LockClient::fair_lock)).
    pub fn is_fair(&self) -> bool {
        self.keys.is_fair()
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
        match self.acquire(None, Lease::Watchdog).await? {
            Some(guard) => Ok(guard),
            // A wait without a deadline ends only with a guard or an error.
            None => Err(Error::Shutdown),
        }
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
        match self.acquire(None, Lease::Fixed(lease)).await? {
            Some(guard) => Ok(guard),
            None => Err(Error::Shutdown),
        }
    }

    /// Tries to acquire the lock within `wait`: `Ok(None)` when it stayed held that long.
    ///
    /// `wait` zero makes exactly one attempt. `lease` `None` renews the lock with the watchdog
    /// until the guard goes; `Some(lease)` holds it for that long at most.
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
    pub async fn try_lock(
        &self,
        wait: Duration,
        lease: Option<Duration>,
    ) -> Result<Option<LockGuard>> {
        let lease = lease.map_or(Lease::Watchdog, Lease::Fixed);
        self.acquire(Some(wait), lease).await
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
        let outcome = tokio::select! {
            biased;
            _ = guard.lost() => None,
            value = work(guard.cancellation_token()) => Some(value),
        };
        match outcome {
            Some(value) => {
                if let Err(error) = guard.unlock().await {
                    tracing::warn!(lock = %self.name(), %error, "unlock after with_lock's work failed");
                }
                Ok(value)
            }
            None => {
                let error = Error::Lost {
                    lock: self.name().to_owned(),
                    owner: guard.owner_field().to_owned(),
                };
                drop(guard);
                Err(error)
            }
        }
    }

    /// Whether anyone holds the lock.
    ///
    /// # Errors
    ///
    /// [`Error::WrongType`] when the key holds another type, as [`lock`](Self::lock) says.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn is_locked(&self) -> Result<bool> {
        let core = self.ready()?;
        let kind: String = core
            .redis
            .r#type(self.keys.key.clone())
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
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn is_held_by_current_task(&self) -> Result<bool> {
        Ok(self.hold_count().await? > 0)
    }

    /// How many holds the current task (or the pinned owner) has on the lock; 0 if none.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn hold_count(&self) -> Result<u32> {
        let core = self.ready()?;
        let field = core.field(self.owner());
        core.redis
            .hget::<Option<u32>, _, _>(self.keys.key.clone(), &*field)
            .await
            .map(Option::unwrap_or_default)
            .map_err(self.redis_error(Some(&field)))
    }

    /// How long the lock lives unless renewed; `None` when it is not held or has no expiry.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn remaining_ttl(&self) -> Result<Option<Duration>> {
        let core = self.ready()?;
        let ttl = core
            .redis
            .pttl::<i64, _>(self.keys.key.clone())
            .await
            .map_err(self.redis_error(None))?;
        Ok(u64::try_from(ttl).ok().map(Duration::from_millis))
    }

    /// Deletes the lock whoever holds it and wakes its waiters (of a fair lock, the first in
    /// line, which keeps its place); `true` if it was held.
    ///
    /// The holder is not told directly; its watchdog finds the lock gone within a third of the
    /// watchdog timeout and marks its guards lost.
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
        let core = self.ready()?;
        self.keys
            .force_unlock(&core.redis)
            .await
            .map_err(self.redis_error(None))
    }

    /// The client this lock belongs to.
    pub(crate) fn client(&self) -> &LockClient {
        &self.client
    }

    fn owner(&self) -> OwnerId {
        self.owner.unwrap_or_else(OwnerId::current)
    }

    fn ready(&self) -> Result<&Arc<Core>> {
        let core = self.client.core();
        core.ensure_open()?;
        if self.keys.name.is_empty() {
            return Err(Error::InvalidArgument(
                "a lock name must not be empty".into(),
            ));
        }
        Ok(core)
    }

    /// The acquisition loop: attempt; when held, join the waiter's channel and attempt again once
    /// subscribed (a message published before the subscription existed would otherwise be
    /// missed); after that, sleep until woken or until the holder's TTL would end, and attempt
    /// again, until the deadline.
    ///
    /// A fair lock's waiter also holds a place in the lock's queue from its first attempt on. It
    /// keeps it by trying again at least every third of its slot, and gives it up on every way
    /// out but success: at once when its wait times out, through the releaser when the future is
    /// dropped or fails.
    pub(crate) async fn acquire(
        &self,
        wait: Option<Duration>,
        lease: Lease,
    ) -> Result<Option<LockGuard>> {
        let core = self.ready()?;
        lease.check(self.name())?;
        let field = core.field(self.owner());
        let started = Instant::now();
        let deadline = wait.and_then(|wait| durations::deadline(started, wait));
        let single_attempt = wait == Some(Duration::ZERO);
        // Only a waiter queues: a single attempt leaves no trace in a fair lock's queue.
        let slot = (self.keys.is_fair() && !single_attempt).then_some(core.fair_wait_timeout);
        let place = slot.map(|_| self.leave_undo(core, &field));
        let mut error_pause = MIN_ERROR_PAUSE;
        let mut waiter: Option<Waiter> = None;
        // Whether any attempt got an answer: a wait that ends without one reports the outage,
        // not a lock held by someone else.
        let mut reached = false;
        let mut last_failure: Option<fred::error::Error> = None;
        let mut settle = SettleOnExit::new(core, &self.keys, &field);
        loop {
            // Armed while an attempt is on its way and after one whose reply was lost.
            settle.arm();
            let attempt = self
                .attempt(core, &field, lease, slot, deadline, single_attempt)
                .await;
            if matches!(attempt, Ok(Attempt::Acquired(_) | Attempt::Held { .. })) {
                // A reply: it carried the fences of every earlier lost one.
                settle.disarm();
            }
            let pause = match attempt {
                Ok(Attempt::Acquired(guard)) => {
                    // The acquire script took the waiter out of the queue.
                    if let Some(place) = place {
                        place.claim();
                    }
                    tracing::debug!(
                        lock = %self.name(), owner = %field,
                        waited_ms = started.elapsed().as_millis() as u64,
                        "acquired"
                    );
                    return Ok(Some(guard));
                }
                Ok(Attempt::Held { retry_after }) => {
                    reached = true;
                    error_pause = MIN_ERROR_PAUSE;
                    // Trying again is what keeps a queued waiter's place.
                    slot.map_or(retry_after, |slot| retry_after.min(slot / 3))
                }
                Ok(Attempt::TimedOut) => {
                    leave_now(place).await;
                    return self.gave_up(reached, last_failure.take());
                }
                Err(error) if error.is_transient() && !single_attempt => {
                    tracing::debug!(lock = %self.name(), owner = %field, %error, "acquire failed; retrying");
                    last_failure = error.into_source().or(last_failure);
                    let pause = error_pause;
                    error_pause = (error_pause * 2).min(MAX_ERROR_PAUSE);
                    pause
                }
                Err(error) => return Err(error),
            };
            if single_attempt {
                return Ok(None);
            }
            let until = bounded(Instant::now() + pause, deadline);
            if !core.redis.is_connected() {
                // Nothing to subscribe to while fred reconnects: wait for the connection (or the
                // pause) instead, and try again at once when it is back.
                tokio::select! {
                    biased;
                    _ = core.shutdown.cancelled() => return Err(Error::Shutdown),
                    _ = core.redis.wait_for_connect() => {}
                    _ = tokio::time::sleep_until(until) => {}
                }
            } else {
                match &waiter {
                    None => {
                        tracing::debug!(lock = %self.name(), owner = %field, "waiting");
                        let joined = core.pubsub.join(&self.keys.wait_channel(&field));
                        tokio::select! {
                            biased;
                            _ = core.shutdown.cancelled() => return Err(Error::Shutdown),
                            _ = joined.subscribed(Some(until)) => {}
                        }
                        waiter = Some(joined);
                    }
                    Some(waiter) => {
                        tokio::select! {
                            biased;
                            _ = core.shutdown.cancelled() => return Err(Error::Shutdown),
                            _ = waiter.wait(until) => {}
                        }
                    }
                }
            }
            if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
                leave_now(place).await;
                return self.gave_up(reached, last_failure.take());
            }
        }
    }

    /// How a wait that ran out ends: `Ok(None)` when Redis said the lock was held, else the
    /// outage that kept every attempt from getting an answer.
    fn gave_up(
        &self,
        reached: bool,
        last_failure: Option<fred::error::Error>,
    ) -> Result<Option<LockGuard>> {
        if reached {
            return Ok(None);
        }
        Err(self.unavailable(last_failure))
    }

    /// No attempt reached Redis; `source` is the last failure seen, if any.
    fn unavailable(&self, source: Option<fred::error::Error>) -> Error {
        Error::Unavailable {
            lock: self.name().to_owned(),
            server: self.client.core().address.to_string(),
            source,
        }
    }

    /// Converts a fred error about this lock, naming its server and, where there is one, the
    /// owner.
    fn redis_error<'a>(
        &'a self,
        owner: Option<&'a str>,
    ) -> impl FnOnce(fred::error::Error) -> Error + 'a {
        move |source| Error::from_redis(&self.client.core().address, self.name(), owner, source)
    }

    /// Runs the acquire script once. The outcome is always observed: if the caller stops waiting,
    /// the call finishes in a task of its own ([`InFlight`]), and what it did arrives as an armed
    /// [`Undo`] (the won hold is released, the queue place left) unless the caller claims it.
    async fn attempt(
        &self,
        core: &Arc<Core>,
        field: &Arc<str>,
        lease: Lease,
        slot: Option<Duration>,
        deadline: Option<Instant>,
        single_attempt: bool,
    ) -> Result<Attempt> {
        if !core.redis.is_connected() {
            // fred would queue the script until it reconnects, or until the command timeout.
            return Err(self.unavailable(Some(not_connected())));
        }
        let lease_ms = lease.millis(core.watchdog_timeout);
        let slot_ms = slot.map(durations::millis);
        let keys = self.keys.clone();
        let task_field = field.clone();
        let client = self.client.clone();
        // A single attempt waits for its reply whatever the deadline.
        let deadline = deadline
            .filter(|_| !single_attempt)
            .map(|deadline| deadline.max(Instant::now() + ATTEMPT_GRACE));
        // The owner's turn, taken before the call is handed over: an attempt cancelled or timed
        // out while it waits for it sends nothing. The owner's count of holds cannot change until
        // the reply is in.
        let turn = core.ledger.turn(&keys.name, &task_field);
        let mut turn = match deadline {
            Some(deadline) => match tokio::time::timeout_at(deadline, turn).await {
                Ok(turn) => turn,
                Err(_) => return Ok(Attempt::TimedOut),
            },
            None => turn.await,
        };
        let call = InFlight::new(async move {
            let core = client.core().clone();
            let holds = core.holds.count(&keys.name, &task_field);
            let request = turn.request();
            let sent_at = Instant::now();
            let reply = keys
                .acquire(&core.redis, lease_ms, &task_field, holds, slot_ms, &request)
                .await;
            turn.record(request, &reply);
            // No settle here: the acquire loop tries again with the fences, or settles on exit.
            drop(turn);
            reply.map(|taken| match taken {
                Taken::Held(pttl) => {
                    let place = slot_ms.map(|_| {
                        let leave = Leave {
                            keys: keys.clone(),
                            field: task_field.clone(),
                        };
                        Undo::new(Cleanup::Leave(leave), core.clone())
                    });
                    Outcome::Held(pttl, place)
                }
                Taken::Acquired | Taken::Afresh => {
                    if taken == Taken::Afresh {
                        core.holds.lose(&keys.name, &task_field);
                    }
                    let hold = core.holds.attach(&keys.name, &task_field, lease, sent_at);
                    Outcome::Won(LockGuard::new(client.clone(), hold, keys.clone(), lease))
                }
            })
        });
        let reply = match deadline {
            Some(deadline) => match tokio::time::timeout_at(deadline, call).await {
                Ok(reply) => reply,
                Err(_) => return Ok(Attempt::TimedOut),
            },
            None => call.await,
        };
        match reply {
            Ok(Outcome::Won(guard)) => Ok(Attempt::Acquired(guard)),
            Ok(Outcome::Held(pttl, place)) => {
                // The waiter's own place (armed since before its first attempt) covers this one.
                if let Some(place) = place {
                    place.claim();
                }
                Ok(Attempt::Held {
                    retry_after: retry_after(pttl, core.watchdog_timeout),
                })
            }
            Err(error) => Err(self.redis_error(Some(field))(error)),
        }
    }

    /// The undo that takes `field` out of this fair lock's queue.
    fn leave_undo(&self, core: &Arc<Core>, field: &Arc<str>) -> Undo {
        let leave = Leave {
            keys: self.keys.clone(),
            field: field.clone(),
        };
        Undo::new(Cleanup::Leave(leave), core.clone())
    }
}

/// A waiter that gives up leaves its queue place before returning, so that the next one moves up
/// at once and a later attempt of the same owner is not overtaken by its own departure.
async fn leave_now(place: Option<Undo>) {
    if let Some(place) = place {
        place.now().await;
    }
}

/// How long to sleep at most before trying again, given the holder's PTTL: until the lock would
/// expire, or, for a key without expiry (not ours to judge), a watchdog period.
fn retry_after(pttl: i64, watchdog_timeout: Duration) -> Duration {
    match u64::try_from(pttl) {
        Ok(ms) => Duration::from_millis(ms.max(1)),
        Err(_) if pttl == -1 => watchdog_timeout / 3,
        Err(_) => Duration::from_millis(1),
    }
}

/// What an attempt that could not be sent failed with.
fn not_connected() -> fred::error::Error {
    fred::error::Error::new(
        fred::error::ErrorKind::IO,
        "not connected (the server refused the connection, or fred is reconnecting)",
    )
}

fn bounded(until: Instant, deadline: Option<Instant>) -> Instant {
    deadline.map_or(until, |deadline| until.min(deadline))
}

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lock")
            .field("name", &self.keys.name)
            .field("fair", &self.keys.is_fair())
            .field("owner", &self.owner)
            .finish_non_exhaustive()
    }
}

//! [`Lock`]: Redisson's reentrant `RLock`, for async Rust.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use fred::interfaces::{HashesInterface, KeysInterface};
use fred::types::{Key, Value};
use tokio::time::Instant;

use crate::client::{Core, LockClient};
use crate::error::{Error, Result};
use crate::guard::{LockGuard, Release};
use crate::holds::Lease;
use crate::inflight::InFlight;
use crate::names;
use crate::owner::OwnerId;
use crate::pubsub::Waiter;
use crate::scripts::{LOCK_ACQUIRE, LOCK_FORCE_UNLOCK};

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
#[derive(Clone)]
pub struct Lock {
    client: LockClient,
    name: Arc<str>,
    /// The name and the unlock channel as sent to Redis, built once: clones share the bytes.
    key: Key,
    channel: Key,
    /// The channel's name, for the client's shared subscription.
    channel_name: Arc<str>,
    owner: Option<OwnerId>,
}

/// What one run of the acquire script said.
enum Attempt {
    Acquired {
        sent_at: Instant,
    },
    Held {
        retry_after: Duration,
    },
    /// The caller's deadline passed before the reply came; the attempt is undone if it won.
    TimedOut,
}

impl Lock {
    pub(crate) fn new(client: LockClient, name: String) -> Lock {
        let channel_name: Arc<str> = names::lock_channel(&name).into();
        Lock {
            client,
            key: Key::from(name.as_str()),
            channel: Key::from(&*channel_name),
            channel_name,
            name: name.into(),
            owner: None,
        }
    }

    /// The lock's name, which is its Redis key.
    pub fn name(&self) -> &str {
        &self.name
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
    /// shuts down.
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
    /// As [`lock`](Self::lock), and [`Error::InvalidArgument`] for a zero lease.
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
    /// As [`lock_with_lease`](Self::lock_with_lease). With a zero `wait`, a connection failure is
    /// returned as [`Error::Redis`]; with a longer one it is retried within the wait.
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

    /// Whether anyone holds the lock.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn is_locked(&self) -> Result<bool> {
        let core = self.ready()?;
        core.redis
            .exists::<u32, _>(&*self.name)
            .await
            .map(|count| count > 0)
            .map_err(|error| Error::from_redis(&self.name, None, error))
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
            .hget::<Option<u32>, _, _>(&*self.name, &*field)
            .await
            .map(Option::unwrap_or_default)
            .map_err(|error| Error::from_redis(&self.name, Some(&field), error))
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
            .pttl::<i64, _>(&*self.name)
            .await
            .map_err(|error| Error::from_redis(&self.name, None, error))?;
        Ok(u64::try_from(ttl).ok().map(Duration::from_millis))
    }

    /// Deletes the lock whoever holds it and wakes its waiters; `true` if it was held.
    ///
    /// The holder is not told directly; its watchdog finds the lock gone within a third of the
    /// watchdog timeout and marks its guards lost.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe in the sense that the deletion may happen although the future was
    /// dropped before reporting it.
    pub async fn force_unlock(&self) -> Result<bool> {
        let core = self.ready()?;
        let deleted: i64 = LOCK_FORCE_UNLOCK
            .run(&core.redis, || {
                (
                    vec![self.key.clone(), self.channel.clone()],
                    vec![Value::from(names::UNLOCK_MESSAGE)],
                )
            })
            .await
            .map_err(|error| Error::from_redis(&self.name, None, error))?;
        Ok(deleted == 1)
    }

    fn owner(&self) -> OwnerId {
        self.owner.unwrap_or_else(OwnerId::current)
    }

    fn ready(&self) -> Result<&Arc<Core>> {
        let core = self.client.core();
        core.ensure_open()?;
        if self.name.is_empty() {
            return Err(Error::InvalidArgument(
                "a lock name must not be empty".into(),
            ));
        }
        Ok(core)
    }

    /// The acquisition loop: attempt; when held, join the lock's channel and attempt again once
    /// subscribed (an unlock published before the subscription existed would otherwise be
    /// missed); after that, sleep until woken or until the holder's TTL would end, and attempt
    /// again, until the deadline.
    async fn acquire(&self, wait: Option<Duration>, lease: Lease) -> Result<Option<LockGuard>> {
        let core = self.ready()?;
        if lease == Lease::Fixed(Duration::ZERO) {
            return Err(Error::InvalidArgument(format!(
                "the lease of lock {:?} must be greater than zero",
                self.name
            )));
        }
        let field = core.field(self.owner());
        let started = Instant::now();
        let deadline = wait.map(|wait| started + wait);
        let single_attempt = wait == Some(Duration::ZERO);
        let mut error_pause = MIN_ERROR_PAUSE;
        let mut waiter: Option<Waiter> = None;
        loop {
            let pause = match self
                .attempt(core, &field, lease, deadline, single_attempt)
                .await
            {
                Ok(Attempt::Acquired { sent_at }) => {
                    return Ok(Some(self.guard(core, field, lease, sent_at, started)))
                }
                Ok(Attempt::Held { retry_after }) => {
                    error_pause = MIN_ERROR_PAUSE;
                    retry_after
                }
                Ok(Attempt::TimedOut) => return Ok(None),
                Err(error) if error.is_transient() && !single_attempt => {
                    tracing::debug!(lock = %self.name, owner = %field, %error, "acquire failed; retrying");
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
            match &waiter {
                None => {
                    tracing::debug!(lock = %self.name, owner = %field, "waiting");
                    let joined = core.pubsub.join(&self.channel_name);
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
            if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
                return Ok(None);
            }
        }
    }

    /// Runs the acquire script once. The outcome is always observed: if the caller stops waiting,
    /// the call finishes in a task of its own ([`InFlight`]), and a hold it won arrives as an
    /// [`Unclaimed`], which gives the hold back when nobody claims it.
    async fn attempt(
        &self,
        core: &Arc<Core>,
        field: &Arc<str>,
        lease: Lease,
        deadline: Option<Instant>,
        unbounded: bool,
    ) -> Result<Attempt> {
        let lease_ms = lease.millis(core.watchdog_timeout);
        let release = Release {
            name: self.name.clone(),
            key: self.key.clone(),
            channel: self.channel.clone(),
            field: field.clone(),
            lease_ms,
        };
        let task_core = core.clone();
        let call = InFlight::new(async move {
            let sent_at = Instant::now();
            let reply = LOCK_ACQUIRE
                .run::<Option<i64>>(&task_core.redis, || {
                    (
                        vec![release.key.clone()],
                        vec![Value::from(lease_ms as i64), Value::from(&*release.field)],
                    )
                })
                .await
                .map(|pttl| match pttl {
                    None => Ok(Unclaimed {
                        release: Some(release),
                        core: task_core,
                    }),
                    Some(pttl) => Err(pttl),
                });
            (sent_at, reply)
        });
        let (sent_at, reply) = match deadline.filter(|_| !unbounded) {
            Some(deadline) => {
                let deadline = deadline.max(Instant::now() + ATTEMPT_GRACE);
                match tokio::time::timeout_at(deadline, call).await {
                    Ok(reply) => reply,
                    Err(_) => return Ok(Attempt::TimedOut),
                }
            }
            None => call.await,
        };
        match reply {
            Ok(Ok(won)) => {
                won.claim();
                Ok(Attempt::Acquired { sent_at })
            }
            Ok(Err(pttl)) => Ok(Attempt::Held {
                retry_after: retry_after(pttl, core.watchdog_timeout),
            }),
            Err(error) => Err(Error::from_redis(&self.name, Some(field), error)),
        }
    }

    fn guard(
        &self,
        core: &Core,
        field: Arc<str>,
        lease: Lease,
        sent_at: Instant,
        started: Instant,
    ) -> LockGuard {
        let hold = core.holds.attach(&self.name, &field, lease, sent_at);
        tracing::debug!(
            lock = %self.name, owner = %field,
            waited_ms = started.elapsed().as_millis() as u64,
            "acquired"
        );
        LockGuard::new(
            self.client.clone(),
            hold,
            (self.key.clone(), self.channel.clone()),
            lease,
        )
    }
}

/// A hold won by an acquire script and not yet turned into a guard. Dropping it unclaimed (the
/// caller was cancelled) queues its release, so a won hold can never be lost on the way.
struct Unclaimed {
    release: Option<Release>,
    core: Arc<Core>,
}

impl Unclaimed {
    /// The caller takes the hold over; nothing is released.
    fn claim(mut self) {
        self.release = None;
    }
}

impl Drop for Unclaimed {
    fn drop(&mut self) {
        if let Some(release) = self.release.take() {
            tracing::debug!(
                lock = %release.name, owner = %release.field,
                "undoing an acquire whose caller went away"
            );
            // Fails only once the client is gone; the lease then ends the hold.
            let _ = self.core.releaser.send(release);
        }
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

fn bounded(until: Instant, deadline: Option<Instant>) -> Instant {
    deadline.map_or(until, |deadline| until.min(deadline))
}

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lock")
            .field("name", &self.name)
            .field("owner", &self.owner)
            .finish_non_exhaustive()
    }
}

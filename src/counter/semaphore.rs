//! [`Semaphore`]: Redisson's `RSemaphore`, for async Rust: permits counted in Redis, taken by
//! guards that give them back.

use std::fmt;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use crate::engine::{FromValue, Value};

use crate::client::LockClient;
use crate::counter::{check_permits, read_counter};
use crate::engine::Tail;
use crate::engine::{
    self, AcquireArgs, Call, Class, Guard, Inspect, Keys, Kind, Lease, Own, Primitive, Profile,
    ProfileOf, ReleaseArgs, Script, WakeRule, Win,
};
use crate::error::{waited, Result};
use crate::inspection::{keys_without_expiry, Details, Inspection, Leak};
use crate::layout::{Counted, Layout};
use crate::lua::{counter_script, inspect_script};
use crate::names;
use crate::owner::OwnerId;

/// Where the keys this file reads one by one stand in its `Keys` (scripts take them in order,
/// with `Keys::first`): named, so that an index means one key.
const NAME: usize = 0;
const CHANNEL: usize = 1;
const GRANTS: usize = 3;

/// Every script of the semaphore, as sections of one file.
pub(crate) const SCRIPTS: &str = include_str!("../../lua/semaphore.lua");

/// Takes permits for one acquisition, recording its grant.
pub(crate) static SEMAPHORE_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| counter_script(SCRIPTS, "acquire", true, false));
/// Gives back a grant's permits.
pub(crate) static SEMAPHORE_RELEASE: LazyLock<Script> =
    LazyLock::new(|| counter_script(SCRIPTS, "release", true, true));
/// Drops a grant's record, its permits staying taken.
static SEMAPHORE_FORGET: LazyLock<Script> =
    LazyLock::new(|| counter_script(SCRIPTS, "forget", false, true));
/// Sets the permits of a semaphore that has none set (a permit semaphore's too: KEYS are the
/// counter and the channel).
pub(crate) static SEMAPHORE_TRY_SET: LazyLock<Script> =
    LazyLock::new(|| counter_script(SCRIPTS, "try_set", false, false));
/// Sets the permits available.
static SEMAPHORE_SET: LazyLock<Script> =
    LazyLock::new(|| counter_script(SCRIPTS, "set", false, false));
/// Adds permits, nobody's in particular (to a permit semaphore's counter too).
pub(crate) static SEMAPHORE_ADD: LazyLock<Script> =
    LazyLock::new(|| counter_script(SCRIPTS, "add", false, true));
/// Takes every permit available.
static SEMAPHORE_DRAIN: LazyLock<Script> =
    LazyLock::new(|| counter_script(SCRIPTS, "drain", false, false));
/// Reads the semaphore for an inspection.
static SEMAPHORE_INSPECT: LazyLock<Script> = LazyLock::new(|| inspect_script(SCRIPTS, true));

/// A distributed counting semaphore, Redisson's `RSemaphore`: at most so many permits out at
/// once across every client on the same Redis, Java Redisson clients included.
///
/// The permits available are an integer string at the semaphore's name, which
/// [`try_set_permits`](Self::try_set_permits) sets once (a semaphore never set has none).
/// [`acquire`](Self::acquire) takes permits in one script that checks and takes them, so the
/// semaphore is never oversubscribed, and returns a [`SemaphorePermit`] that gives them back
/// when released or dropped, as tokio's does.
///
/// ```no_run
/// # async fn demo(client: fredlock::LockClient) -> fredlock::Result<()> {
/// use std::time::Duration;
///
/// let exports = client.semaphore("exports");
/// exports.try_set_permits(3).await?;                 // only if not set yet
/// let permit = exports.acquire(1).await?;            // waits for a permit
/// // ... at most 3 exports run at once, across every instance ...
/// permit.release().await?;                           // or drop it
///
/// if let Some(two) = exports.try_acquire(2, Duration::from_secs(1)).await? {
///     drop(two);                                     // given back in the background
/// }
/// # Ok(()) }
/// ```
///
/// # `release(n)` is Redisson's, not tokio's
///
/// A tokio user gives permits back by dropping (or [`release`](SemaphorePermit::release)-ing)
/// the [`SemaphorePermit`], and that is the way here too. [`Semaphore::release(n)`](Self::release)
/// is something else: Redisson's `release(n)`, which *adds* `n` permits to those available,
/// whoever took them, as tokio's `Semaphore::add_permits` does (and as this type's
/// [`add_permits`](Self::add_permits), the same call under tokio's name). Use it only for
/// permits no guard holds: taken by a Java client, or by a permit that was
/// [forgotten](SemaphorePermit::forget). Calling it for permits a guard still holds counts them
/// twice: the guard gives its own back as well, and the semaphore has more permits from then on.
///
/// ```no_run
/// # async fn demo(client: fredlock::LockClient) -> fredlock::Result<()> {
/// let exports = client.semaphore("exports");
/// let permit = exports.acquire(1).await?;
/// permit.release().await?;       // tokio's way: the guard gives its permit back
///
/// exports.release(1).await?;     // Redisson's release(n): one permit more, for good
/// # Ok(()) }
/// ```
///
/// # Permits are not leases
///
/// As in Redisson, permits do not expire: a process that dies holding some takes them with it
/// (Redisson #3573), until someone adds them back ([`add_permits`](Self::add_permits) or
/// [`release`](Self::release)). Where holders may crash, use a
/// [`PermitSemaphore`](crate::PermitSemaphore), whose permits are leases that return once
/// their holder is gone.
///
/// # Grants
///
/// Each acquisition is recorded in fredlock's own hash `fredlock_permits:{name}` (grant
/// `<client uuid>:<id>` -> permits taken), written in the script that takes the permits and
/// deleted in the one that gives them back. That makes every acquire and release take effect
/// once, even when a reply is lost and the call sent again, and lets an inspection tell who
/// holds the permits. Redisson never reads the hash; its acquisitions leave no record.
///
/// # Wake-ups
///
/// Every change publishes the permits now available on `redisson_sc:{name}` (Redisson's
/// message). A message wakes, in each client, the waiters whose wants fit in it, in the order
/// they came (a waiter for several permits is not passed over by later ones for fewer), and no
/// more. A waiter that misses a message looks again after a third of the watchdog lease at
/// most.
#[derive(Clone)]
pub struct Semaphore {
    client: LockClient,
    /// Its keys: the counter (the name), the channel, the fences of lost replies, the grants.
    profile: ProfileOf<[u32; 0]>,
}

/// Permits taken from a [`Semaphore`], given back by [`release`](Self::release) or by dropping
/// it (in the background, within milliseconds); [`forget`](Self::forget) keeps them taken.
#[must_use = "dropping a permit gives it back at once"]
pub struct SemaphorePermit {
    guard: Guard,
    /// The acquisition's kind (the guard's too): its keys and permits.
    kind: Arc<SemaphoreKind>,
}

impl LockClient {
    /// A semaphore named `name` (after the client's
    /// [`key_prefix`](crate::LockClientBuilder::key_prefix)). Creating it costs nothing and
    /// sends nothing; an empty name is reported by the first operation.
    pub fn semaphore(&self, name: impl Into<String>) -> Semaphore {
        self.semaphore_at(self.key(name.into()))
    }
}

impl Semaphore {
    /// The semaphore's Redis key.
    pub fn name(&self) -> &str {
        self.profile.name()
    }

    /// Sets the permits to `permits` if the semaphore has none set yet (its key does not
    /// exist); `true` when it did. The usual way to create a semaphore: every instance may call
    /// it, the first one sets it.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for an empty name, [`Error::Redis`](crate::Error::Redis) when Redis cannot be
    /// asked.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe in the sense that the permits may be set although the future was dropped
    /// before reporting it.
    pub async fn try_set_permits(&self, permits: u32) -> Result<bool> {
        let set: i64 = self.run(&SEMAPHORE_TRY_SET, Some(permits)).await?;
        Ok(set == 1)
    }

    /// Sets the permits available to `permits`, whatever they were (permits out stay out and
    /// are added back when given back), and wakes waiters that fit.
    ///
    /// # Errors
    ///
    /// As [`try_set_permits`](Self::try_set_permits), and [`Error::WrongType`](crate::Error::WrongType) when the key is
    /// not an integer string.
    ///
    /// # Cancel safety
    ///
    /// As [`try_set_permits`](Self::try_set_permits).
    pub async fn set_permits(&self, permits: u32) -> Result<()> {
        self.run::<i64>(&SEMAPHORE_SET, Some(permits))
            .await
            .map(drop)
    }

    /// Adds `permits` to those available (Redisson's `addPermits`), and wakes waiters that fit.
    ///
    /// # Errors
    ///
    /// As [`set_permits`](Self::set_permits), and [`Error::InvalidArgument`](crate::Error::InvalidArgument) for 0 permits.
    ///
    /// # Cancel safety
    ///
    /// As [`try_set_permits`](Self::try_set_permits).
    pub async fn add_permits(&self, permits: u32) -> Result<()> {
        check_permits(self.name(), permits)?;
        self.run::<i64>(&SEMAPHORE_ADD, Some(permits))
            .await
            .map(drop)
    }

    /// Adds `permits` to the permits available and wakes the waiters they fit, as Redisson's
    /// `release(n)` does: Redisson's permits have no owners, so this is
    /// [`add_permits`](Self::add_permits) under Redisson's name. Use it to give back permits
    /// that nobody's guard holds (taken by a Java client, or by a [`SemaphorePermit`] that was
    /// forgotten); a guard's permits are given back by the guard. It never checks what was
    /// taken: releasing more than was taken raises the permits available for good.
    ///
    /// # Errors
    ///
    /// As [`add_permits`](Self::add_permits).
    ///
    /// # Cancel safety
    ///
    /// As [`try_set_permits`](Self::try_set_permits).
    pub async fn release(&self, permits: u32) -> Result<()> {
        self.add_permits(permits).await
    }

    /// The permits available now (negative only if another client made it so: Redisson's
    /// `reducePermits`); 0 for a semaphore never set.
    ///
    /// # Errors
    ///
    /// [`Error::WrongType`](crate::Error::WrongType) when the key is not an integer string.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn available_permits(&self) -> Result<i64> {
        read_counter(&self.client, self.name()).await
    }

    /// Takes every permit available; returns how many it took. Nothing gives them back: add
    /// them again with [`add_permits`](Self::add_permits).
    ///
    /// # Errors
    ///
    /// As [`set_permits`](Self::set_permits).
    ///
    /// # Cancel safety
    ///
    /// As [`try_set_permits`](Self::try_set_permits).
    pub async fn drain_permits(&self) -> Result<u64> {
        let drained: i64 = self.run(&SEMAPHORE_DRAIN, None).await?;
        Ok(u64::try_from(drained).unwrap_or(0))
    }

    /// Takes `permits` permits, waiting as long as it takes for them.
    ///
    /// Waiting costs no polling: the waiter sleeps until a change of the permits is published,
    /// or at most a third of the watchdog lease. While Redis is unreachable it keeps trying,
    /// with backoff.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for 0 permits or an empty name, [`Error::WrongType`](crate::Error::WrongType) when the
    /// key is not an integer string, [`Error::Redis`](crate::Error::Redis) when Redis rejects the script,
    /// [`Error::Shutdown`](crate::Error::Shutdown) when the client shuts down.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the future is dropped, it keeps no permits (an acquire already sent runs
    /// to completion in a task of its own, and gives back what it took) and gives up its place
    /// among this client's waiters.
    pub async fn acquire(&self, permits: u32) -> Result<SemaphorePermit> {
        self.take(permits, None).await.and_then(waited)
    }

    /// Takes `permits` permits only if that many are available now, without waiting:
    /// `Ok(None)` when not. Redisson's `tryAcquire(permits)`; the same as
    /// [`try_acquire(permits, Duration::ZERO)`](Self::try_acquire).
    ///
    /// # Errors
    ///
    /// As [`try_acquire`](Self::try_acquire): [`Error::Unavailable`](crate::Error::Unavailable)
    /// at once while Redis cannot be reached, never `Ok(None)`.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`acquire`](Self::acquire).
    #[doc(alias = "tryAcquire")]
    pub async fn try_acquire_now(&self, permits: u32) -> Result<Option<SemaphorePermit>> {
        self.take(permits, Some(Duration::ZERO)).await
    }

    /// Tries to take `permits` permits within `wait`: `Ok(None)` when not enough were available
    /// that long. A zero `wait` makes one attempt.
    /// Redisson's `tryAcquire(permits, waitTime, unit)`.
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire). When the wait ends and no attempt got an answer from
    /// Redis, [`Error::Unavailable`](crate::Error::Unavailable), never `Ok(None)`.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`acquire`](Self::acquire).
    #[doc(alias = "tryAcquire")]
    pub async fn try_acquire(
        &self,
        permits: u32,
        wait: Duration,
    ) -> Result<Option<SemaphorePermit>> {
        self.take(permits, Some(wait)).await
    }

    /// What Redis holds of the semaphore now: the permits available (in
    /// [`Details::Semaphore`](crate::Details::Semaphore)), and fredlock's grants as holders with the permits each
    /// took.
    ///
    /// # Errors
    ///
    /// [`Error::WrongType`](crate::Error::WrongType) when a key holds another type; [`Error::Redis`](crate::Error::Redis) when the server
    /// cannot be asked.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn inspect(&self) -> Result<Inspection> {
        self.client.engine().inspect(&self.kind(1), None).await
    }

    async fn take(&self, permits: u32, wait: Option<Duration>) -> Result<Option<SemaphorePermit>> {
        check_permits(self.name(), permits)?;
        let kind = Arc::new(self.kind(permits));
        // A grant of its own per acquisition: permits are nobody's to re-enter.
        let win = engine::acquire(
            self.client.engine(),
            kind.clone(),
            OwnerId::unique(),
            wait,
            Lease::Unbounded,
        )
        .await?;
        Ok(win.map(|Win { guard, .. }| SemaphorePermit { guard, kind }))
    }

    fn kind(&self, permits: u32) -> SemaphoreKind {
        SemaphoreKind {
            profile: self.profile.wanting(permits),
        }
    }

    /// Runs one of the semaphore's scripts that take the permits as their one argument.
    async fn run<R: FromValue>(&self, script: &'static Script, permits: Option<u32>) -> Result<R> {
        let kind = self.kind(1);
        let call = kind.call(script, permits.map(Value::from).into_iter().collect());
        self.client.engine().send(&kind, call).await
    }
}

impl SemaphorePermit {
    /// How many permits this holds.
    pub fn permits(&self) -> u32 {
        self.kind.profile.wants()
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        self.guard.name()
    }

    /// The grant these permits were taken under, `<client uuid>:<id>` (a holder in the
    /// semaphore's [`Inspection`]).
    pub fn grant(&self) -> &str {
        self.guard.owner_field()
    }

    /// Gives the permits back and wakes the waiters they fit.
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`](crate::Error::NotHeld) when the grant was gone (its record deleted by hand). A release whose
    /// reply is lost is sent again (it takes effect once however often it is sent) for up to the
    /// client's command timeout; [`Error::Redis`](crate::Error::Redis) when no answer came by then, the release
    /// going on in the background.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: once sent, a release dropped mid-way finishes in a task of its own.
    pub async fn release(self) -> Result<()> {
        self.guard.unlock().await
    }

    /// Keeps the permits taken for good (as tokio's `SemaphorePermit::forget`): the semaphore
    /// has that many fewer until someone adds them back. The grant's record is deleted in the
    /// background.
    pub fn forget(self) {
        let engine = self.guard.engine().clone();
        let call = self
            .kind
            .call(&SEMAPHORE_FORGET, vec![Value::from(self.grant())]);
        let grant = self.grant().to_owned();
        self.guard.forget();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Err(error) = call.run::<i64>(&engine.core().writer).await {
                    tracing::debug!(%grant, %error, "could not delete a forgotten grant's record");
                }
            });
        }
    }
}

impl fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Semaphore")
            .field("name", &self.name())
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for SemaphorePermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SemaphorePermit")
            .field("name", &self.name())
            .field("grant", &self.grant())
            .field("permits", &self.permits())
            .finish()
    }
}

/// One acquisition of a semaphore, as the engine sees it: its keys and the permits it wants.
pub(crate) struct SemaphoreKind {
    profile: ProfileOf<[u32; 1]>,
}

/// The Redis commands `lua/semaphore.lua`'s scripts run (the permit semaphore's setting and
/// adding too).
pub(crate) const SCRIPT_COMMANDS: &[&str] = &[
    "decrby", "exists", "hdel", "hexists", "hget", "hgetall", "hset", "incrby", "set", "type",
];

/// What a semaphore runs (its class's [`Class::commands`]).
const COMMANDS: &[&[&str]] = &[
    SCRIPT_COMMANDS,
    crate::lua::FENCES_COMMANDS,
    crate::lua::COUNTER_COMMANDS,
    crate::lua::INSPECT_COMMANDS,
];

static SEMAPHORE: Class = Class {
    own: Own::Wants,
    ..Class::new("semaphore", WakeRule::Counted(CHANNEL), COMMANDS)
};

/// A semaphore is known by fredlock's grants, while any permit of fredlock's is out.
pub(crate) const LAYOUT: Layout = Layout {
    own_keys: &[names::SEMAPHORE_GRANTS],
    own_key: None,
    mode_field: false,
    of_type: None,
    strays: None,
    at_key: |client, key| {
        Box::new(Counted {
            client: client.clone(),
            kind: Arc::new(client.semaphore_at(key).kind(1)),
        })
    },
};

impl SemaphoreKind {
    fn call(&self, script: &'static Script, args: Vec<Value>) -> Call {
        Call {
            script,
            keys: self.profile.keys().first(4),
            args,
        }
    }
}

impl LockClient {
    /// A semaphore at `key`, the client's prefix already on it.
    fn semaphore_at(&self, key: String) -> Semaphore {
        Semaphore {
            client: self.clone(),
            profile: ProfileOf::new(
                &SEMAPHORE,
                Keys::new([
                    &key,
                    &names::semaphore_channel(&key),
                    &names::fences(&key),
                    &names::semaphore_grants(&key),
                ]),
            ),
        }
    }
}

impl Primitive for SemaphoreKind {
    fn profile(&self) -> &Profile {
        &self.profile
    }
}

impl Kind for SemaphoreKind {
    fn acquire(&self, args: &AcquireArgs<'_>) -> Call {
        let mut argv = vec![
            Value::from(self.profile.wants()),
            Value::String(args.field.clone()),
        ];
        args.request.append_to(&mut argv);
        self.call(&SEMAPHORE_ACQUIRE, argv)
    }
    fn release(&self, args: &ReleaseArgs<'_>) -> Call {
        let mut argv = vec![
            Value::String(args.field.clone()),
            Value::from(args.left as i64),
        ];
        args.request.append_to(&mut argv);
        self.call(&SEMAPHORE_RELEASE, argv)
    }
}

impl Inspect for SemaphoreKind {
    fn inspect(&self) -> Call {
        self.call(&SEMAPHORE_INSPECT, Vec::new())
    }
    fn details(&self, tail: &mut Tail) -> Result<Details, String> {
        Ok(Details::Semaphore {
            available: tail.number(),
        })
    }
    fn leaks(&self, inspection: &Inspection, _grace: Duration) -> Vec<Leak> {
        // The counter lasts by design (Redisson's), and so do the grants while permits are out.
        let keys = self.profile.keys();
        keys_without_expiry(inspection, &[keys.str(NAME), keys.str(GRANTS)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The permission check asks about exactly what its scripts run, as docs/SECURITY.md's
    /// table says.
    #[test]
    fn its_class_names_every_command_its_scripts_run() {
        crate::lua::check_commands(
            &[&SEMAPHORE],
            &[
                SCRIPTS,
                crate::lua::FENCES,
                crate::lua::COUNTER,
                crate::lua::INSPECT_HEAD,
            ],
            &["semaphore"],
        );
    }
}

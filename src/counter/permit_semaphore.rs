//! [`PermitSemaphore`]: Redisson's `RPermitExpirableSemaphore`, whose permits are leases timed by
//! the server's clock and renewed by the watchdog while their guard lives.

use std::fmt;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use crate::engine::ScanType;
use crate::engine::{FromValue, Value};
use tokio_util::sync::CancellationToken;

use crate::client::LockClient;
use crate::counter::check_permits;
use crate::counter::semaphore::{SEMAPHORE_ADD, SEMAPHORE_TRY_SET};
use crate::engine::{
    self, AcquireArgs, Call, Class, Guard, Inspect, Keys, Kind, Lease, Primitive, Profile,
    ProfileOf, Refusal, ReleaseArgs, Script, WakeRule, Win,
};
use crate::engine::{text, Tail};
use crate::error::{waited, Result};
use crate::inspection::{keys_without_expiry, Details, EndedLease, Inspection, Leak};
use crate::layout::{Counted, Layout, OwnKey};
use crate::lua::{counter_script, inspect_script};
use crate::names;
use crate::owner::OwnerId;

/// Where the keys this file reads one by one stand in its `Keys` (scripts take them in order,
/// with `Keys::first`): named, so that an index means one key.
const NAME: usize = 0;
const LEASES: usize = 1;
const CHANNEL: usize = 2;

/// Every script of the permit semaphore, as sections of one file.
const SCRIPTS: &str = include_str!("../../lua/permit_semaphore.lua");

/// Takes one permit for a lease.
pub(crate) static PERMIT_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| counter_script(SCRIPTS, "acquire", true, false));
/// Gives back one permit of a guard.
pub(crate) static PERMIT_RELEASE: LazyLock<Script> =
    LazyLock::new(|| counter_script(SCRIPTS, "release", true, true));
/// Gives back a permit by its id, whoever took it.
static PERMIT_RELEASE_BY_ID: LazyLock<Script> =
    LazyLock::new(|| counter_script(SCRIPTS, "release_by_id", false, true));
/// Reads the permits available, giving back those whose leases ended.
static PERMIT_AVAILABLE: LazyLock<Script> =
    LazyLock::new(|| counter_script(SCRIPTS, "available", false, true));
/// Extends (or checks) many leases in one call.
pub(crate) static PERMIT_RENEW: LazyLock<Script> =
    LazyLock::new(|| counter_script(SCRIPTS, "renew", false, true));
/// Reads the semaphore for an inspection.
static PERMIT_INSPECT: LazyLock<Script> = LazyLock::new(|| inspect_script(SCRIPTS, true));

/// A distributed semaphore whose permits are **leases**: Redisson's
/// `RPermitExpirableSemaphore`, with the same keys, so Java and Rust clients share its permits,
/// and with the weakness of a plain semaphore fixed: the permit of a holder that died comes
/// back once its lease ends.
///
/// ```no_run
/// # async fn demo(client: fredlock::LockClient) -> fredlock::Result<()> {
/// use std::time::Duration;
///
/// let api = client.permit_semaphore("api-slots");
/// api.try_set_permits(5).await?;                     // at most 5 calls at once
/// let slot = api.acquire().await?;                   // renewed by the watchdog while it lives
/// println!("calling with permit {}", slot.id());
/// tokio::select! {
///     _ = call_the_api() => slot.release().await?,
///     _ = slot.lost() => eprintln!("permit lost; the call is no longer covered"),
/// }
///
/// // At most 1 s of waiting; the permit ends by itself after 30 s, released or not.
/// let slot = api.try_acquire(Duration::from_secs(1), Some(Duration::from_secs(30))).await?;
/// # async fn call_the_api() {}
/// # Ok(()) }
/// ```
///
/// # Leases
///
/// Each permit taken is an entry of the zset `{name}:timeout` (permit id -> when its lease
/// ends, in ms), and the permits available are the integer string at the name. Every script
/// that changes the semaphore first gives back the permits whose leases ended, so a dead
/// holder's permit returns at the next acquire, release or
/// [`available_permits`](Self::available_permits) once its lease is over; a waiter sleeps at
/// most until the earliest lease would end, and takes it then.
///
/// - [`acquire`](Self::acquire) (and `try_acquire` without a lease) takes a permit whose lease
///   is the client's watchdog lease (30 s by default), which the watchdog extends every third
///   of it while the guard lives: a live holder never loses its permit, a dead one's returns
///   within the watchdog lease. If renewals stop getting through, the guard reports the loss
///   ([`LeasedPermit::lost`]) at the renew deadline, as a lock's does.
/// - With a fixed lease the permit ends by itself that long after it was taken, and is never
///   renewed.
///
/// **Clocks differ from Redisson.** fredlock times leases by the Redis server's clock (`TIME`
/// inside the scripts); Redisson writes each lease's end by its client's clock, and gives back
/// the leases that ended by the clock of whichever client calls next. Where Java and Rust
/// clients share a semaphore, keep their clocks close to the server's: a Java client whose
/// clock runs ahead gives back fredlock's permits early (a fredlock guard then reports the
/// loss at its next renewal), one that runs behind keeps ended leases a little longer. Permit
/// ids differ too: fredlock's are `<client uuid>:<id>` text, Redisson's 16 bytes (shown in hex
/// by inspections); [`release_by_id`](Self::release_by_id) takes fredlock's ids.
///
/// # Wake-ups
///
/// As [`Semaphore`](crate::Semaphore): every change publishes the permits available on
/// `redisson_sc:{name}`, which wakes as many of this client's waiters as there are permits.
#[derive(Clone)]
pub struct PermitSemaphore {
    client: LockClient,
    /// Its keys: the counter (the name), the leases, the channel, the fences of lost replies;
    /// the leases are empty for a name it refuses.
    profile: ProfileOf<[u32; 0]>,
}

/// One permit of a [`PermitSemaphore`]: given back by [`release`](Self::release) or by dropping
/// it (in the background, within milliseconds).
#[must_use = "dropping a permit gives it back at once"]
pub struct LeasedPermit {
    guard: Guard,
}

impl LockClient {
    /// A permit semaphore named `name` (after the client's
    /// [`key_prefix`](crate::LockClientBuilder::key_prefix)). Creating it costs nothing and
    /// sends nothing; a name it cannot take (empty, or with a brace that makes no hash tag) is
    /// reported by the first operation.
    pub fn permit_semaphore(&self, name: impl Into<String>) -> PermitSemaphore {
        PermitSemaphore::at(self, self.key(name.into()))
    }
}

/// A permit semaphore is known by its leases, while any permit is out.
pub(crate) const LAYOUT: Layout = Layout {
    own_keys: &[],
    own_key: Some(OwnKey {
        of: names::permit_leases,
        glob: "*:timeout",
        key_type: ScanType::ZSet,
        name: names::permit_leases_owner,
    }),
    mode_field: false,
    of_type: None,
    strays: None,
    at_key: |client, key| {
        Box::new(Counted {
            client: client.clone(),
            kind: Arc::new(PermitSemaphore::at(client, key).kind()),
        })
    },
};

impl PermitSemaphore {
    /// The permit semaphore at `key`, the client's prefix already on it.
    pub(crate) fn at(client: &LockClient, key: String) -> PermitSemaphore {
        let leases = names::permit_leases(&key).unwrap_or_default();
        PermitSemaphore {
            client: client.clone(),
            profile: ProfileOf::new(
                &PERMIT_SEMAPHORE,
                Keys::new([
                    &key,
                    &leases,
                    &names::semaphore_channel(&key),
                    &names::fences(&key),
                ]),
            ),
        }
    }

    /// The semaphore's Redis key.
    pub fn name(&self) -> &str {
        self.profile.name()
    }

    /// Sets the permits to `permits` if the semaphore has none set yet (its key does not
    /// exist); `true` when it did.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a name it cannot take,
    /// [`Error::Redis`](crate::Error::Redis) when Redis cannot be asked.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe in the sense that the permits may be set although the future was dropped
    /// before reporting it.
    pub async fn try_set_permits(&self, permits: u32) -> Result<bool> {
        let set: i64 = self
            .send(self.kind().counter_call(&SEMAPHORE_TRY_SET, permits))
            .await?;
        Ok(set == 1)
    }

    /// Adds `permits` to those available, and wakes waiters.
    ///
    /// # Errors
    ///
    /// As [`try_set_permits`](Self::try_set_permits),
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for 0 permits, and
    /// [`Error::WrongType`](crate::Error::WrongType) when the key is not an integer string.
    ///
    /// # Cancel safety
    ///
    /// As [`try_set_permits`](Self::try_set_permits).
    pub async fn add_permits(&self, permits: u32) -> Result<()> {
        check_permits(self.name(), permits)?;
        let _: i64 = self
            .send(self.kind().counter_call(&SEMAPHORE_ADD, permits))
            .await?;
        Ok(())
    }

    /// The permits available now, after giving back those whose leases ended (a write, as
    /// Redisson's is).
    ///
    /// # Errors
    ///
    /// As [`add_permits`](Self::add_permits).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: what it changes, the next call would have.
    pub async fn available_permits(&self) -> Result<i64> {
        self.send(self.call(&PERMIT_AVAILABLE, Vec::new())).await
    }

    /// Gives back the permit `id` (a [`LeasedPermit::id`], from any client), whoever holds it:
    /// `true` when it was held. Its guard, if one lives, reports the loss at its next renewal.
    ///
    /// # Errors
    ///
    /// As [`add_permits`](Self::add_permits).
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe in the sense that the permit may be given back although the future was
    /// dropped before reporting it.
    pub async fn release_by_id(&self, id: &str) -> Result<bool> {
        let call = self.call(&PERMIT_RELEASE_BY_ID, vec![Value::from(id)]);
        let released: i64 = self.send(call).await?;
        Ok(released == 1)
    }

    /// Takes a permit, waiting as long as it takes; the watchdog renews its lease until the
    /// guard goes.
    ///
    /// The waiter sleeps until a change of the permits is published, or at most until the
    /// earliest lease would end (when its permit returns).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a name it cannot take,
    /// [`Error::WrongType`](crate::Error::WrongType) when a key holds another type,
    /// [`Error::Redis`](crate::Error::Redis) when Redis rejects the script,
    /// [`Error::Shutdown`](crate::Error::Shutdown) when the client shuts down.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the future is dropped, it keeps no permit (an acquire already sent runs
    /// to completion in a task of its own, and gives back what it took) and gives up its place
    /// among this client's waiters.
    pub async fn acquire(&self) -> Result<LeasedPermit> {
        self.take(None, Lease::Watchdog).await.and_then(waited)
    }

    /// Takes a permit, waiting as long as it takes, for a fixed `lease`: the permit returns by
    /// itself that long after it was taken, and is never renewed.
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire), and
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a lease under 1 ms or over
    /// [`MAX_DURATION`](crate::MAX_DURATION).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`acquire`](Self::acquire).
    pub async fn acquire_with_lease(&self, lease: Duration) -> Result<LeasedPermit> {
        self.take(None, Lease::Fixed(lease)).await.and_then(waited)
    }

    /// Takes a permit only if one is free now, without waiting: `Ok(None)` when none is. It is
    /// renewed by the watchdog until the guard goes. Redisson's `tryAcquire()`; the same as
    /// [`try_acquire(Duration::ZERO, None)`](Self::try_acquire).
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
    pub async fn try_acquire_now(&self) -> Result<Option<LeasedPermit>> {
        self.try_acquire(Duration::ZERO, None).await
    }

    /// Tries to take a permit within `wait`: `Ok(None)` when none came free that long. `lease`
    /// `None` renews it with the watchdog until the guard goes; `Some(lease)` holds it that
    /// long at most. A zero `wait` makes one attempt.
    ///
    /// # Errors
    ///
    /// As [`acquire_with_lease`](Self::acquire_with_lease). When the wait ends and no attempt
    /// got an answer from Redis, [`Error::Unavailable`](crate::Error::Unavailable), never
    /// `Ok(None)`.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`acquire`](Self::acquire).
    #[doc(alias = "tryAcquire")]
    pub async fn try_acquire(
        &self,
        wait: Duration,
        lease: impl Into<Option<Duration>>,
    ) -> Result<Option<LeasedPermit>> {
        self.take(
            Some(wait),
            lease.into().map_or(Lease::Watchdog, Lease::Fixed),
        )
        .await
    }

    /// What Redis holds of the semaphore now: the permits available and the leases that ended
    /// but were not given back yet (in its [`Details::PermitSemaphore`]), and each live lease as
    /// a holder with its remaining time. It only reads: nothing is given back.
    ///
    /// # Errors
    ///
    /// As [`add_permits`](Self::add_permits).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn inspect(&self) -> Result<Inspection> {
        self.client.engine().inspect(&self.kind(), None).await
    }

    async fn take(&self, wait: Option<Duration>, lease: Lease) -> Result<Option<LeasedPermit>> {
        let kind: Arc<dyn Kind> = Arc::new(self.kind());
        // A permit id of its own per acquisition.
        let win =
            engine::acquire(self.client.engine(), kind, OwnerId::unique(), wait, lease).await?;
        Ok(win.map(|Win { guard, .. }| LeasedPermit { guard }))
    }

    pub(crate) fn kind(&self) -> PermitKind {
        PermitKind {
            profile: self.profile.clone(),
        }
    }

    fn call(&self, script: &'static Script, args: Vec<Value>) -> Call {
        self.kind().call(script, args)
    }

    async fn send<R: FromValue>(&self, call: Call) -> Result<R> {
        self.client.engine().send(&self.kind(), call).await
    }
}

impl LeasedPermit {
    /// The permit's id, `<client uuid>:<id>`: its entry in `{name}:timeout`, which
    /// [`PermitSemaphore::release_by_id`] takes.
    pub fn id(&self) -> &str {
        self.guard.owner_field()
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        self.guard.name()
    }

    /// The fixed lease, or `None` for a permit the watchdog renews.
    pub fn lease(&self) -> Option<Duration> {
        self.guard.lease()
    }

    /// Gives the permit back and wakes a waiter.
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`](crate::Error::NotHeld) when the permit was lost first (its lease
    /// ended, or it was given back by id). A release whose reply is lost is sent again (it
    /// takes effect once however often it is sent) for up to the client's command timeout;
    /// [`Error::Redis`](crate::Error::Redis) when no answer came by then, the release going on
    /// in the background.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: once sent, a release dropped mid-way finishes in a task of its own.
    pub async fn release(self) -> Result<()> {
        self.guard.unlock().await
    }

    /// True once the permit is known lost; see [`lost`](Self::lost).
    pub fn is_lost(&self) -> bool {
        self.guard.is_lost()
    }

    /// Completes when the permit is known lost: its lease ended (a fixed lease ran out, or no
    /// renewal got through within the client's renew deadline), it was given back by id or the
    /// semaphore deleted, or the client shut down. Never completes while the permit is safe.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only watches.
    pub async fn lost(&self) {
        self.guard.lost().await
    }

    /// A token cancelled when the permit is known lost.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.guard.cancellation_token()
    }

    /// Runs `work` while the permit is held: `None` once it is lost (the work is dropped).
    /// The work counts among the client's work under holds, which a shutdown stops and waits
    /// for before it gives the permits back (the fleet-wide limit layer's requests).
    #[cfg(feature = "tower")]
    pub(crate) async fn while_held<T>(
        &self,
        work: impl std::future::Future<Output = T>,
    ) -> Option<T> {
        self.guard.engine().while_held(self.lost(), work).await
    }
}

impl fmt::Debug for PermitSemaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PermitSemaphore")
            .field("name", &self.name())
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for LeasedPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeasedPermit")
            .field("name", &self.name())
            .field("id", &self.id())
            .field("lease", &self.lease())
            .finish()
    }
}

/// A permit semaphore, as the engine sees it.
pub(crate) struct PermitKind {
    profile: ProfileOf<[u32; 0]>,
}

/// The Redis commands `lua/permit_semaphore.lua`'s scripts run.
const SCRIPT_COMMANDS: &[&str] = &[
    "decr",
    "get",
    "incr",
    "incrby",
    "type",
    "zadd",
    "zrange",
    "zrangebyscore",
    "zrem",
    "zscore",
];

/// What a permit semaphore runs (its class's [`Class::commands`]): its scripts', and the
/// semaphore's that set and add permits.
const COMMANDS: &[&[&str]] = &[
    SCRIPT_COMMANDS,
    crate::counter::semaphore::SCRIPT_COMMANDS,
    crate::lua::FENCES_COMMANDS,
    crate::lua::COUNTER_COMMANDS,
    crate::lua::INSPECT_COMMANDS,
];

static PERMIT_SEMAPHORE: Class = Class {
    renewal: Some(&PERMIT_RENEW),
    renewal_key: LEASES,
    refusal: Some(Refusal {
        what: "permit semaphore",
        refuses: |keys| keys.str(LEASES).is_empty(),
        why: "has a brace but no hash tag, so its leases ({name}:timeout) would land in \
              another cluster slot: use a name without braces, or with a hash tag (`{tag}`)",
    }),
    ..Class::new("permit_semaphore", WakeRule::Counted(CHANNEL), COMMANDS)
};

impl PermitKind {
    fn keys(&self) -> &Keys {
        self.profile.keys()
    }

    /// A call of one of the plain semaphore's scripts on the same counter and channel (setting
    /// and adding permits are the same for both kinds).
    fn counter_call(&self, script: &'static Script, permits: u32) -> Call {
        Call {
            script,
            keys: vec![self.keys().get(NAME), self.keys().get(CHANNEL)],
            args: vec![Value::from(permits)],
        }
    }

    fn call(&self, script: &'static Script, args: Vec<Value>) -> Call {
        Call {
            script,
            keys: self.keys().first(4),
            args,
        }
    }
}

impl Primitive for PermitKind {
    fn profile(&self) -> &Profile {
        &self.profile
    }
}

impl Kind for PermitKind {
    fn acquire(&self, args: &AcquireArgs<'_>) -> Call {
        let mut argv = vec![args.lease.clone(), Value::String(args.field.clone())];
        args.request.append_to(&mut argv);
        self.call(&PERMIT_ACQUIRE, argv)
    }
    fn release(&self, args: &ReleaseArgs<'_>) -> Call {
        let mut argv = vec![
            Value::String(args.field.clone()),
            Value::from(args.left as i64),
        ];
        args.request.append_to(&mut argv);
        self.call(&PERMIT_RELEASE, argv)
    }
}

impl Inspect for PermitKind {
    fn inspect(&self) -> Call {
        self.call(&PERMIT_INSPECT, Vec::new())
    }
    fn details(&self, tail: &mut Tail) -> Result<Details, String> {
        let available = tail.number();
        let now = tail.now;
        let ended_leases = tail
            .rows("ended leases", 2)?
            .iter()
            .map(|lease| EndedLease {
                permit: text(&lease[0]),
                ended_ago: Duration::from_millis(
                    now.saturating_sub(lease[1].as_i64().unwrap_or(-1)).max(0) as u64,
                ),
            })
            .collect();
        Ok(Details::PermitSemaphore {
            available,
            ended_leases,
        })
    }
    fn leaks(&self, inspection: &Inspection, grace: Duration) -> Vec<Leak> {
        // The counter lasts by design, and the leases while permits are out; what does not
        // end is a permit without lease (Redisson's), and an ended lease nobody gave back.
        let mut leaks = keys_without_expiry(
            inspection,
            &[self.keys().str(NAME), self.keys().str(LEASES)],
        );
        for holder in &inspection.holders {
            if holder.remaining_lease.is_none() {
                leaks.push(Leak {
                    name: inspection.name.clone(),
                    kind: inspection.kind,
                    key: self.keys().str(LEASES).to_owned(),
                    rule: "no_expiry",
                    detail: format!(
                        "permit {} has no lease: it never returns if its holder dies",
                        holder.owner
                    ),
                });
            }
        }
        let ended_leases = match &inspection.details {
            Details::PermitSemaphore { ended_leases, .. } => ended_leases.as_slice(),
            _ => &[],
        };
        for ended in ended_leases {
            if ended.ended_ago > grace {
                leaks.push(Leak {
                    name: inspection.name.clone(),
                    kind: inspection.kind,
                    key: self.keys().str(LEASES).to_owned(),
                    rule: "ended_lease",
                    detail: format!(
                        "the lease of permit {} ended {} ms ago and nothing gave it back (the \
                         next acquire, release or available_permits will)",
                        ended.permit,
                        ended.ended_ago.as_millis()
                    ),
                });
            }
        }
        leaks
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
            &[&PERMIT_SEMAPHORE],
            &[
                SCRIPTS,
                crate::counter::semaphore::SCRIPTS,
                crate::lua::FENCES,
                crate::lua::COUNTER,
                crate::lua::INSPECT_HEAD,
            ],
            &["permit_semaphore"],
        );
    }
}

//! [`FairLock`]: Redisson's `RFairLock`, a reentrant lock granted in arrival order.

use std::fmt;
use std::sync::LazyLock;
use std::time::Duration;

use crate::engine::Value;

use crate::client::LockClient;
use crate::engine::Tail;
use crate::engine::{
    AcquireArgs, Call, Class, Inspect, Keys, Kind, Own, Primitive, Profile, ProfileOf, ReleaseArgs,
    Request, Script, WakeRule,
};
use crate::inspection::{keys_without_expiry, Details, Inspection, Leak};
use crate::layout::Layout;
use crate::lock::reentrant::LOCK_RENEW;
use crate::lock::{lock_of_family, Lock, LockKind};
use crate::lua;
use crate::names::{self, UNLOCK_MESSAGE};
use crate::owner::OwnerId;

/// Where the keys this file reads one by one stand in its `Keys` (scripts take them in order,
/// with `Keys::first`): named, so that an index means one key.
const NAME: usize = 0;
const QUEUE: usize = 1;
const TIMEOUTS: usize = 2;
const FENCES: usize = 3;
const CHANNEL: usize = 4;

/// Every script of the fair lock: its queue's head, then sections.
const SCRIPTS: &str = include_str!("../../lua/fair_lock.lua");

/// Takes, re-enters or queues for a fair lock.
static FAIR_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| lua::holds_script(SCRIPTS, "acquire", false));
/// Gives back one hold of a fair lock, telling the first waiter when it is free.
static FAIR_RELEASE: LazyLock<Script> =
    LazyLock::new(|| lua::holds_script(SCRIPTS, "release", true));
/// Takes a waiter out of a fair lock's queue.
static FAIR_LEAVE: LazyLock<Script> = LazyLock::new(|| lua::holds_script(SCRIPTS, "leave", true));
/// Deletes a fair lock whoever holds it, telling the first waiter.
static FAIR_FORCE_UNLOCK: LazyLock<Script> = LazyLock::new(|| {
    let [head, body] = lua::sections(SCRIPTS, "force_unlock");
    lua::compose(&[lua::HOLDS, head, lua::DELETE_LOCK, body], true)
});
/// Reads a fair lock, with its queue, for an inspection.
static FAIR_INSPECT: LazyLock<Script> = LazyLock::new(|| lua::inspect_script(SCRIPTS, false));

/// The composed text of the fair lock's script `name`, for tests and the benchmark.
pub(crate) fn script(name: &str) -> Option<&'static Script> {
    Some(match name {
        "acquire" => &FAIR_ACQUIRE,
        "release" => &FAIR_RELEASE,
        "leave" => &FAIR_LEAVE,
        "force_unlock" => &FAIR_FORCE_UNLOCK,
        "inspect" => &FAIR_INSPECT,
        _ => return None,
    })
}

/// A reentrant distributed lock whose waiters are served first come, first served: Redisson's
/// `RFairLock`, with the same keys, so Java and Rust waiters share one line.
///
/// Everything [`Lock`] does, a `FairLock` does the same way (reentrancy, watchdog, [`LockGuard`](crate::LockGuard),
/// cancel safety); the difference is who gets the lock when it is released:
///
/// - A waiter takes its place in the lock's queue (`redisson_lock_queue:{name}`) with its first
///   attempt, and a free lock goes only to the first in line; newcomers queue behind, even when
///   they find the lock free for a moment.
/// - An unlock tells only the first waiter, on its own channel
///   (`redisson_lock__channel:{name}:<owner field>`), so a release wakes one task, not all.
/// - A waiter keeps its place by trying again at least every third of its *place's lifetime*
///   ([`queue_place`](crate::LockClientBuilder::queue_place), 5 s by default). A
///   waiter whose process died stops doing that, and is dropped from the line wherever it
///   stands once its place expires. A dead waiter at the head therefore delays a free lock by
///   at most one place's lifetime. Places are timed by the Redis server's clock, never by a client's.
/// - A waiter that gives up (its `try_lock` wait ends, or its future is dropped) leaves the line
///   at once, and the one behind it moves up.
/// - [`try_lock`](crate::DistributedLock::try_lock) with a zero wait never joins the line: it takes the lock only
///   if it is free and nobody is waiting.
///
/// Reentry by the holder does not queue. Locking the same name as a plain [`Lock`] elsewhere
/// bypasses the line; use one kind per name.
///
/// # Redisson compatibility
///
/// The hash, queue, place-timeout zset and channels are Redisson's, so Java and Rust clients exclude each
/// other and wait in one line. Place expiries are milliseconds since the epoch, as Redisson writes
/// them. Two differences in behaviour: Redisson gives its waiters 5-minute places computed from
/// its own clock, and when a Redisson client takes the lock it shortens every remaining place by
/// that wait time, which makes fredlock's waiters rejoin at the end of the line. Mixed waiters
/// thus keep mutual exclusion but not always strict order.
///
/// ```no_run
/// # async fn demo(client: fredlock::LockClient) -> fredlock::Result<()> {
///
/// let tickets = client.fair_lock("tickets");
/// let guard = tickets.lock().await?;      // served in the order the waiters arrived
/// // ... serve one customer ...
/// guard.unlock().await?;                  // the next in line is told, and only it
/// # Ok(()) }
/// ```
///
/// # Waiting
///
/// Granted when the waiter's turn comes: first come, first served. With a bounded wait
/// ([`try_lock`](crate::DistributedLock::try_lock)), when its turn did not come within `wait`,
/// its place in the queue is already given up; a zero `wait` takes the lock only if it is free
/// and nobody is queued, and never queues.
///
/// # Cancel safety
///
/// Cancel safe: if an acquisition's future is dropped, no hold is left behind and the waiter's
/// place in the queue is given up within milliseconds.
#[derive(Clone)]
pub struct FairLock {
    lock: Lock,
}

lock_of_family!(FairLock);

impl LockClient {
    /// A fair lock named `name`: reentrant like [`lock`](Self::lock), and granted to waiters in
    /// the order they arrived. Creating it costs nothing and sends nothing.
    pub fn fair_lock(&self, name: impl Into<String>) -> FairLock {
        let fair = Fair::new(self.key(name.into()), self.queue_place());
        FairLock {
            lock: Lock::of_kind(self.clone(), fair),
        }
    }

    /// A non-reentrant fair lock named `name`: as [`fair_lock`](Self::fair_lock), but an owner
    /// that holds it and asks for it again gets
    /// [`Error::WouldDeadlock`](crate::Error::WouldDeadlock) at once; see
    /// [`FairLock::non_reentrant`].
    pub fn non_reentrant_fair_lock(&self, name: impl Into<String>) -> FairLock {
        self.fair_lock(name).non_reentrant()
    }
}

/// A fair lock is known by its queue and place-timeout keys, which exist while anyone waits.
pub(crate) const LAYOUT: Layout = Layout {
    own_keys: &[names::FAIR_QUEUE, names::FAIR_TIMEOUTS],
    mode_field: false,
    strays: None,
    own_key: None,
    of_type: None,
    at_key: |client, key| {
        Box::new(Lock::of_kind(
            client.clone(),
            Fair::new(key, client.queue_place()),
        ))
    },
};

impl FairLock {
    /// The same lock, owned by `owner` instead of the current task; see [`Lock::with_owner`].
    pub fn with_owner(self, owner: OwnerId) -> FairLock {
        FairLock {
            lock: self.lock.with_owner(owner),
        }
    }

    /// The same lock, non-reentrant: an owner that holds it and asks for it again gets
    /// [`Error::WouldDeadlock`](crate::Error::WouldDeadlock) at once, with nothing sent (not
    /// even a place in the queue); see [`Lock::non_reentrant`].
    pub fn non_reentrant(self) -> FairLock {
        FairLock {
            lock: self.lock.non_reentrant(),
        }
    }

    /// Whether an owner that holds the lock may take it again.
    pub fn is_reentrant(&self) -> bool {
        self.lock.is_reentrant()
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

/// The fair lock's kind: the reentrant lock's hash plus Redisson's waiting line, each waiter
/// told on its own channel.
struct Fair {
    /// Its keys: the hash of holds (the name); the list of waiter fields in arrival order; the
    /// zset of waiter field -> when its place expires (server clock, ms); the ids of calls whose
    /// replies were lost (see `engine::ledger`); and, not a key, the prefix of each waiter's
    /// own channel, `<prefix>:<waiter field>`, which every call passes as an argument. And how
    /// long a waiter keeps its place without trying again.
    profile: ProfileOf<[u32; 1]>,
}

/// The Redis commands `lua/fair_lock.lua`'s scripts run.
const SCRIPT_COMMANDS: &[&str] = &[
    "exists",
    "hexists",
    "lindex",
    "lpop",
    "lrange",
    "lrem",
    "pexpire",
    "pttl",
    "rpush",
    "time",
    "type",
    "zadd",
    "zrange",
    "zrangebyscore",
    "zrem",
    "zremrangebyscore",
    "zscore",
];

/// What a fair lock runs (its class's [`Class::commands`]): its scripts', their preambles',
/// the lock family's renewal and a guard's `while_held`'s.
const COMMANDS: &[&[&str]] = &[
    SCRIPT_COMMANDS,
    crate::lock::reentrant::SCRIPT_COMMANDS,
    crate::lua::HOLDS_COMMANDS,
    crate::lua::DELETE_LOCK_COMMANDS,
    crate::lua::INSPECT_COMMANDS,
    crate::lock::guard::WHILE_HELD_COMMANDS,
];

static FAIR_LOCK: Class = Class {
    renewal: Some(&LOCK_RENEW),
    own: Own::Place,
    ..Class::new("fair_lock", WakeRule::PerWaiter(CHANNEL), COMMANDS)
};

impl Fair {
    fn new(name: String, place: Duration) -> Fair {
        let keys = Keys::new([
            &name,
            &names::fair_queue(&name),
            &names::fair_timeouts(&name),
            &names::fences(&name),
            &names::lock_channel(&name),
        ]);
        Fair {
            profile: ProfileOf::new(&FAIR_LOCK, keys).with_place(Some(place)),
        }
    }

    fn keys(&self) -> &Keys {
        self.profile.keys()
    }

    /// A fair-lock script call: every one takes the hash, queue, timeouts and fences as KEYS,
    /// and the channel prefix and unlock message (to tell the next waiter) before `args`.
    fn call(&self, script: &'static Script, args: &[Value], request: Option<&Request>) -> Call {
        let mut argv = Vec::with_capacity(args.len() + 4);
        argv.push(Value::String(self.keys().text(CHANNEL)));
        argv.push(Value::from_static_str(UNLOCK_MESSAGE));
        argv.extend_from_slice(args);
        if let Some(request) = request {
            request.append_to(&mut argv);
        }
        Call {
            script,
            keys: vec![
                self.keys().get(NAME),
                self.keys().get(QUEUE),
                self.keys().get(TIMEOUTS),
                self.keys().get(FENCES),
            ],
            args: argv,
        }
    }
}

impl Primitive for Fair {
    fn profile(&self) -> &Profile {
        &self.profile
    }
}

impl Kind for Fair {
    fn acquire(&self, args: &AcquireArgs<'_>) -> Call {
        let own = [
            args.lease.clone(),
            Value::String(args.field.clone()),
            Value::from(args.place_ms.unwrap_or_default() as i64),
            Value::from(args.holds as i64),
        ];
        self.call(&FAIR_ACQUIRE, &own, Some(args.request))
    }
    fn release(&self, args: &ReleaseArgs<'_>) -> Call {
        let own = [
            args.lease.clone(),
            Value::String(args.field.clone()),
            Value::from(args.left as i64),
        ];
        self.call(&FAIR_RELEASE, &own, Some(args.request))
    }
    fn leave(&self, field: &str, request: &Request) -> Option<Call> {
        Some(self.call(&FAIR_LEAVE, &[Value::from(field)], Some(request)))
    }
}

impl Inspect for Fair {
    fn inspect(&self) -> Call {
        Call {
            script: &FAIR_INSPECT,
            keys: self.keys().first(4),
            args: Vec::new(),
        }
    }
    fn details(&self, _tail: &mut Tail) -> Result<Details, String> {
        Ok(Details::Fair)
    }
    /// Besides keys without expiry, a waiter whose place ended more than `grace` ago: every
    /// acquire purges expired waiters, so one that lingers means nobody has asked since, and it
    /// keeps the queue's keys alive.
    ///
    /// The queue's keys may lack an expiry while a waiter is alive: Redisson's own waiters
    /// leave them so, and the last one out deletes them.
    fn leaks(&self, inspection: &Inspection, grace: Duration) -> Vec<Leak> {
        let alive = inspection
            .queue
            .iter()
            .any(|waiter| waiter.ended_ago.is_none_or(|ago| ago <= grace));
        let line = [self.keys().str(QUEUE), self.keys().str(TIMEOUTS)];
        let mut leaks = keys_without_expiry(inspection, if alive { &line } else { &[] });
        for waiter in &inspection.queue {
            if let Some(ago) = waiter.ended_ago.filter(|ago| *ago > grace) {
                leaks.push(Leak {
                    name: inspection.name.clone(),
                    kind: inspection.kind,
                    key: self.keys().str(QUEUE).to_owned(),
                    rule: "stale_waiter",
                    detail: format!(
                        "waiter {} is still queued {ago:?} after its place ended",
                        waiter.owner
                    ),
                });
            }
        }
        leaks
    }
}

impl LockKind for Fair {
    fn force_unlock(&self) -> Call {
        self.call(&FAIR_FORCE_UNLOCK, &[], None)
    }

    fn is_fair(&self) -> bool {
        true
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
            &[&FAIR_LOCK],
            &[
                SCRIPTS,
                include_str!("../../lua/lock.lua"),
                crate::lua::HOLDS,
                crate::lua::DELETE_LOCK,
                crate::lua::INSPECT_HEAD,
                crate::lock::guard::WHILE_HELD,
            ],
            &["fair_lock"],
        );
    }
}

//! The reentrant lock's kind (Redisson's `RLock`): its keys, scripts and layout, which the fair,
//! fenced and spin locks build on; [`Lock`] is its handle.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use crate::engine::{Key, Value};

use crate::client::LockClient;
use crate::engine::Tail;
use crate::engine::{
    AcquireArgs, Backoff, Call, Class, Inspect, Keys, Kind, Own, Primitive, Profile, ProfileOf,
    ReleaseArgs, Request, Script, WakeRule,
};
use crate::inspection::{Details, Inspection, Leak};
use crate::layout::Layout;
use crate::lock::{Lock, LockKind, REENTRY_REFUSED};
use crate::lua;
use crate::names::{self, UNLOCK_MESSAGE};

/// Where the keys this file reads one by one stand in its `Keys` (scripts take them in order,
/// with `Keys::first`): named, so that an index means one key.
const NAME: usize = 0;
const CHANNEL: usize = 1;
const FENCES: usize = 2;
/// A key of a kind of the family that keeps one more: the plain lock's line of waiting clients,
/// the fenced lock's token counter.
pub(crate) const MORE: usize = 3;
/// The plain lock's client a release named, for which the lock is kept a moment.
const NAMED: usize = 4;

/// Every script of the reentrant lock: sections of one file.
const SCRIPTS: &str = include_str!("../../lua/lock.lua");

/// Takes or re-enters a reentrant lock.
pub(crate) static LOCK_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| lua::holds_script(SCRIPTS, "acquire", false));
/// Refuses a non-reentrant lock's holder another hold (see `lock::NonReentrant`).
pub(crate) static LOCK_REFUSE_REENTRY: LazyLock<Script> =
    LazyLock::new(|| lua::section_script(SCRIPTS, "refuse_reentry", false));
/// Gives back one hold of a reentrant lock.
pub(crate) static LOCK_RELEASE: LazyLock<Script> =
    LazyLock::new(|| lua::holds_script(SCRIPTS, "release", true));
/// What a client named with nobody waiting does: ends the keeping, wakes every client.
pub(crate) static LOCK_PASS_ON: LazyLock<Script> =
    LazyLock::new(|| lua::section_script(SCRIPTS, "pass_on", false));
/// Extends many watchdog-held locks in one call (of every kind of the family but the
/// read-write lock).
pub(crate) static LOCK_RENEW: LazyLock<Script> =
    LazyLock::new(|| lua::section_script(SCRIPTS, "renew", true));
/// Deletes a lock whoever holds it.
pub(crate) static LOCK_FORCE_UNLOCK: LazyLock<Script> = LazyLock::new(|| {
    let [head, body] = lua::sections(SCRIPTS, "force_unlock");
    lua::compose(&[lua::HOLDS, lua::DELETE_LOCK, head, body], true)
});
/// Reads a lock of the reentrant family for an inspection.
pub(crate) static LOCK_INSPECT: LazyLock<Script> =
    LazyLock::new(|| lua::inspect_script(SCRIPTS, false));

/// The composed text of the reentrant lock's script `name`, for tests and the benchmark.
pub(crate) fn script(name: &str) -> Option<&'static Script> {
    Some(match name {
        "acquire" => &LOCK_ACQUIRE,
        "refuse_reentry" => &LOCK_REFUSE_REENTRY,
        "release" => &LOCK_RELEASE,
        "pass_on" => &LOCK_PASS_ON,
        "renew" => &LOCK_RENEW,
        "force_unlock" => &LOCK_FORCE_UNLOCK,
        "inspect" => &LOCK_INSPECT,
        _ => return None,
    })
}

/// A spin lock waiter's pauses unless its handle has its own (Redisson's): 1 ms, doubling up
/// to 128 ms.
pub(crate) const DEFAULT_BACKOFF: Backoff = Backoff {
    first: Duration::from_millis(1),
    cap: Duration::from_millis(128),
};

/// The Redis commands `lua/lock.lua`'s scripts run (the lock family's, and the renewal the
/// fair lock and the leader election use).
pub(crate) const SCRIPT_COMMANDS: &[&str] = &[
    "del",
    "exists",
    "get",
    "hexists",
    "pexpire",
    "pttl",
    "set",
    "time",
    "zadd",
    "zrangebyscore",
    "zrem",
    "zremrangebyscore",
    "zscore",
];

/// What a lock of the family runs (its class's [`Class::commands`]): its scripts', their
/// preambles', and a guard's `while_held`'s.
pub(crate) const COMMANDS: &[&[&str]] = &[
    SCRIPT_COMMANDS,
    crate::lua::HOLDS_COMMANDS,
    crate::lua::DELETE_LOCK_COMMANDS,
    crate::lua::INSPECT_COMMANDS,
    crate::lock::guard::WHILE_HELD_COMMANDS,
];

/// The class of a lock of the family labelled `label`, whose waiters listen on its unlock
/// channel.
pub(crate) const fn listening(
    label: &'static str,
    commands: &'static [&'static [&'static str]],
) -> Class {
    Class {
        renewal: Some(&LOCK_RENEW),
        ..Class::new(label, WakeRule::Shared(CHANNEL), commands)
    }
}

/// The reentrant lock's class: its waiting clients stand in line (see `lua/lock.lua`), so that
/// a release wakes one of them rather than all.
static LOCK: Class = Class {
    renewal: Some(&LOCK_RENEW),
    ..Class::new("lock", WakeRule::InLine(CHANNEL), COMMANDS)
};

/// The spin lock's: the same holds, with waiters that back off instead of listening.
static SPIN_LOCK: Class = Class {
    renewal: Some(&LOCK_RENEW),
    own: Own::Backoff,
    ..Class::new("spin_lock", WakeRule::Backoff(DEFAULT_BACKOFF), COMMANDS)
};

/// The reentrant lock's kind (Redisson's `RLock`); the spin lock is the same with waiters that
/// back off instead of listening, and its releases announce nothing.
pub(crate) struct Reentrant<const SLOTS: usize = 0> {
    /// Its keys: the hash of holds (the name), the channel every final unlock is published on,
    /// and the ids of calls whose replies were lost, which never take effect (see
    /// `engine::ledger`).
    profile: ProfileOf<[u32; SLOTS]>,
}

impl Reentrant {
    fn keys(name: &str) -> Keys {
        Keys::new([name, &names::lock_channel(name), &names::fences(name)])
    }

    /// A reentrant lock at key `name`, whose waiters listen on its unlock channel, standing in
    /// its line.
    pub(crate) fn new(name: String) -> Reentrant {
        let keys = Keys::new([
            &*name,
            &names::lock_channel(&name),
            &names::fences(&name),
            &names::lock_line(&name),
            &names::lock_named(&name),
        ]);
        Reentrant {
            profile: ProfileOf::new(&LOCK, keys),
        }
    }

    /// A lock of the family of class `class` at key `name`, which keeps one key more, at
    /// [`MORE`].
    pub(crate) fn with_key(class: &'static Class, name: &str, more: &str) -> Reentrant {
        let keys = Keys::new([name, &names::lock_channel(name), &names::fences(name), more]);
        Reentrant {
            profile: ProfileOf::new(class, keys),
        }
    }

    /// The same lock, whose waiters back off by `backoff` instead (and whose releases
    /// announce nothing).
    pub(crate) fn spinning(name: String, backoff: Backoff) -> Reentrant<2> {
        Reentrant {
            profile: ProfileOf::new(&SPIN_LOCK, Reentrant::keys(&name)).with_backoff(backoff),
        }
    }
}

impl<const SLOTS: usize> Reentrant<SLOTS> {
    fn hash(&self) -> Key {
        self.profile.keys().get(NAME)
    }

    fn channel(&self) -> Key {
        self.profile.keys().get(CHANNEL)
    }

    fn fences(&self) -> Key {
        self.profile.keys().get(FENCES)
    }

    /// The line of waiting clients and the client a release named, for a kind whose waiters
    /// stand in line.
    fn line(&self) -> Option<[Key; 2]> {
        matches!(self.profile.class().wake, WakeRule::InLine(_)).then(|| {
            [
                self.profile.keys().get(MORE),
                self.profile.keys().get(NAMED),
            ]
        })
    }

    /// The acquire script's keys and arguments (see the `acquire` section of `lua/lock.lua`),
    /// after which a script of the family may take keys of its own.
    pub(crate) fn acquire_call(&self, script: &'static Script, args: &AcquireArgs<'_>) -> Call {
        // Room for the place in line and the request id: one allocation each.
        let mut argv = Vec::with_capacity(8);
        argv.push(args.lease.clone());
        argv.push(Value::String(args.field.clone()));
        argv.push(Value::from(args.holds as i64));
        let mut keys = Vec::with_capacity(4);
        keys.extend([self.hash(), self.fences()]);
        if let (Some(line), Some(keys_of_line)) = (args.line, self.line()) {
            keys.extend(keys_of_line);
            argv.push(Value::from(line.number));
            argv.push(Value::from(line.place_ms as i64));
            argv.push(Value::from_static_str(line.on_win.word()));
        }
        args.request.append_to(&mut argv);
        Call {
            script,
            keys,
            args: argv,
        }
    }

    /// The message a final unlock publishes: none when nobody listens.
    fn unlock_message(&self) -> Value {
        match self.profile.class().wake {
            WakeRule::Backoff(_) => Value::from_static_str(""),
            _ => Value::from_static_str(UNLOCK_MESSAGE),
        }
    }
}

impl<const SLOTS: usize> Primitive for Reentrant<SLOTS> {
    fn profile(&self) -> &Profile {
        &self.profile
    }
}

impl<const SLOTS: usize> Kind for Reentrant<SLOTS> {
    fn acquire(&self, args: &AcquireArgs<'_>) -> Call {
        self.acquire_call(&LOCK_ACQUIRE, args)
    }
    fn release(&self, args: &ReleaseArgs<'_>) -> Call {
        let mut argv = Vec::with_capacity(5);
        argv.push(self.unlock_message());
        argv.push(args.lease.clone());
        argv.push(Value::String(args.field.clone()));
        argv.push(Value::from(args.left as i64));
        args.request.append_to(&mut argv);
        let mut keys = Vec::with_capacity(5);
        keys.extend([self.hash(), self.channel(), self.fences()]);
        keys.extend(self.line().into_iter().flatten());
        Call {
            script: &LOCK_RELEASE,
            keys,
            args: argv,
        }
    }
    fn pass_on(&self, number: i64) -> Option<Call> {
        let [_, named] = self.line()?;
        Some(Call {
            script: &LOCK_PASS_ON,
            keys: vec![self.channel(), named],
            args: vec![Value::from_static_str(UNLOCK_MESSAGE), Value::from(number)],
        })
    }
}

impl<const SLOTS: usize> Inspect for Reentrant<SLOTS> {
    fn inspect(&self) -> Call {
        Call {
            script: &LOCK_INSPECT,
            keys: vec![self.hash(), self.fences()],
            args: Vec::new(),
        }
    }
}

impl<const SLOTS: usize> LockKind for Reentrant<SLOTS> {
    fn force_unlock(&self) -> Call {
        Call {
            script: &LOCK_FORCE_UNLOCK,
            keys: vec![self.hash(), self.channel()],
            args: vec![Value::from_static_str(UNLOCK_MESSAGE)],
        }
    }
}

impl LockClient {
    /// A reentrant lock named `name`: its Redis key is `name`, after the client's
    /// [`key_prefix`](crate::LockClientBuilder::key_prefix) if it has one. Creating it costs
    /// nothing and sends nothing; an empty name is reported by the first operation.
    pub fn lock(&self, name: impl Into<String>) -> Lock {
        Lock::of_kind(self.clone(), Reentrant::new(self.key(name.into())))
    }

    /// A non-reentrant lock named `name`: as [`lock`](Self::lock), but an owner that holds it
    /// and asks for it again gets [`Error::WouldDeadlock`](crate::Error::WouldDeadlock) at once;
    /// see [`Lock::non_reentrant`].
    pub fn non_reentrant_lock(&self, name: impl Into<String>) -> Lock {
        self.lock(name).non_reentrant()
    }
}

/// A plain lock is a hash at its name and nothing else.
pub(crate) const LAYOUT: Layout = Layout {
    own_keys: &[],
    mode_field: false,
    strays: None,
    own_key: None,
    of_type: None,
    at_key: |client, key| Box::new(Lock::of_kind(client.clone(), Reentrant::new(key))),
};

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
            script: &LOCK_REFUSE_REENTRY,
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
    fn pass_on(&self, number: i64) -> Option<Call> {
        self.0.pass_on(number)
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
    fn details(&self, tail: &mut Tail) -> Result<Details, String> {
        self.0.details(tail)
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
    /// The same lock, non-reentrant: an owner that holds it and asks for it again gets
    /// [`Error::WouldDeadlock`](crate::Error::WouldDeadlock) at once, with nothing sent or changed, instead of a second hold
    /// (Redisson 4's `RedissonNonReentrantLock`). The layout in Redis is the reentrant lock's
    /// (an owner's field never counts above 1), so Redisson's clients and reentrant handles
    /// on the same name exclude it as any lock. For code where taking a lock twice is a bug:
    /// the second `lock()` of a task that already holds it would otherwise succeed silently.
    ///
    /// ```no_run
    /// # async fn demo(client: fredlock::LockClient) -> fredlock::Result<()> {
    ///
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
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The permission check asks about exactly what its scripts run, as docs/SECURITY.md's
    /// table says.
    #[test]
    fn its_class_names_every_command_its_scripts_run() {
        crate::lua::check_commands(
            &[&LOCK, &SPIN_LOCK],
            &[
                SCRIPTS,
                crate::lua::HOLDS,
                crate::lua::DELETE_LOCK,
                crate::lua::INSPECT_HEAD,
                crate::lock::guard::WHILE_HELD,
            ],
            &["lock", "spin_lock"],
        );
    }
}

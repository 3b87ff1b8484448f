//! The reentrant lock's kind (Redisson's `RLock`): its keys, scripts and layout, which the fair,
//! fenced and spin locks build on; [`Lock`] is its handle.

use std::sync::LazyLock;

use fred::types::{Key, Value};

use crate::client::LockClient;
use crate::engine::{
    AcquireArgs, Backoff, Call, Inspect, Kind, Name, Primitive, ReleaseArgs, Script, Wake,
};
use crate::layout::Layout;
use crate::lock::{Lock, LockKind};
use crate::lua;
use crate::names::{self, Keys, UNLOCK_MESSAGE};

/// Where the keys this file reads one by one stand in its `Keys` (scripts take them in order,
/// with `Keys::first`): named, so that an index means one key.
const NAME: usize = 0;
const CHANNEL: usize = 1;
const FENCES: usize = 2;

/// Every script of the reentrant lock: sections of one file.
const SCRIPTS: &str = include_str!("../../lua/lock.lua");

/// Takes or re-enters a reentrant lock.
pub(crate) static LOCK_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| lua::holds_script(SCRIPTS, "acquire", false));
/// Gives back one hold of a reentrant lock.
pub(crate) static LOCK_RELEASE: LazyLock<Script> =
    LazyLock::new(|| lua::holds_script(SCRIPTS, "release", true));
/// Extends many watchdog-held locks in one call (of every kind of the family but the
/// read-write lock).
pub(crate) static LOCK_RENEW: LazyLock<Script> =
    LazyLock::new(|| lua::section_script(SCRIPTS, "renew", true));
/// Deletes a lock whoever holds it.
pub(crate) static LOCK_FORCE_UNLOCK: LazyLock<Script> = LazyLock::new(|| {
    let [head, body] = lua::sections(SCRIPTS, "force_unlock");
    Script::freeing(&[lua::HOLDS, lua::DELETE_LOCK, head, body])
});
/// Reads a lock of the reentrant family for an inspection.
pub(crate) static LOCK_INSPECT: LazyLock<Script> =
    LazyLock::new(|| lua::inspect_script(SCRIPTS, false));

/// The composed text of the reentrant lock's script `name`, for tests and the benchmark.
pub(crate) fn script(name: &str) -> Option<&'static Script> {
    Some(match name {
        "acquire" => &LOCK_ACQUIRE,
        "release" => &LOCK_RELEASE,
        "renew" => &LOCK_RENEW,
        "force_unlock" => &LOCK_FORCE_UNLOCK,
        "inspect" => &LOCK_INSPECT,
        _ => return None,
    })
}

/// The reentrant lock's kind (Redisson's `RLock`); the spin lock is the same with waiters that
/// back off instead of listening, and its releases announce nothing.
pub(crate) struct Reentrant {
    /// The hash of holds (the name), the channel every final unlock is published on, and the
    /// ids of calls whose replies were lost, which never take effect (see `engine::ledger`).
    keys: Keys<3>,
    /// How a spin lock's waiters back off; `None` for waiters that listen on the channel.
    /// Boxed: a held lock keeps its kind, and most are not spin locks.
    backoff: Option<Box<Backoff>>,
}

impl Reentrant {
    /// A reentrant lock at key `name`, whose waiters listen on its unlock channel.
    pub(crate) fn new(name: String) -> Reentrant {
        let keys = Keys::new([&name, &names::lock_channel(&name), &names::fences(&name)]);
        Reentrant {
            keys,
            backoff: None,
        }
    }

    /// The same lock, whose waiters back off instead (and whose releases announce nothing).
    pub(crate) fn spinning(name: String, backoff: Backoff) -> Reentrant {
        Reentrant {
            backoff: Some(Box::new(backoff)),
            ..Reentrant::new(name)
        }
    }

    fn hash(&self) -> Key {
        self.keys.get(NAME)
    }

    fn channel(&self) -> Key {
        self.keys.get(CHANNEL)
    }

    fn fences(&self) -> Key {
        self.keys.get(FENCES)
    }

    /// The acquire script's keys and arguments (see `lua/lock_acquire.lua`), after which a
    /// script of the family may take keys of its own.
    pub(crate) fn acquire_call(&self, script: &'static Script, args: &AcquireArgs<'_>) -> Call {
        let mut argv = Vec::with_capacity(4);
        argv.push(args.lease.clone());
        argv.push(Value::String(args.field.clone()));
        argv.push(Value::from(args.holds as i64));
        args.request.append_to(&mut argv);
        Call {
            script,
            keys: vec![self.hash(), self.fences()],
            args: argv,
        }
    }

    /// The message a final unlock publishes: none when nobody listens.
    fn unlock_message(&self) -> Value {
        match self.backoff {
            Some(_) => Value::from_static_str(""),
            None => Value::from_static_str(UNLOCK_MESSAGE),
        }
    }
}

impl Primitive for Reentrant {
    fn name(&self) -> &str {
        self.keys.str(NAME)
    }
    fn name_text(&self) -> Name {
        self.keys.text(NAME)
    }
    fn label(&self) -> &'static str {
        match self.backoff {
            Some(_) => "spin_lock",
            None => "lock",
        }
    }
    fn key(&self) -> Key {
        self.hash()
    }
    fn wake(&self) -> Wake {
        match &self.backoff {
            Some(backoff) => Wake::Backoff(**backoff),
            None => Wake::Shared(self.keys.text(CHANNEL)),
        }
    }
}

impl Kind for Reentrant {
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
        Call {
            script: &LOCK_RELEASE,
            keys: vec![self.hash(), self.channel(), self.fences()],
            args: argv,
        }
    }
    fn renewal(&self) -> Option<&'static Script> {
        Some(&LOCK_RENEW)
    }
}

impl Inspect for Reentrant {
    fn inspect(&self) -> Call {
        Call {
            script: &LOCK_INSPECT,
            keys: vec![self.hash(), self.fences()],
            args: Vec::new(),
        }
    }
}

impl LockKind for Reentrant {
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

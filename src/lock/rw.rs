//! [`RwLock`]: Redisson's `RReadWriteLock`, with writers that do not starve and an upgrade that
//! fails at once.

use std::fmt;
use std::sync::LazyLock;

use crate::engine::Value;

use crate::client::LockClient;
use crate::engine::Tail;
use crate::engine::{
    AcquireArgs, Call, Class, Inspect, Keys, Kind, Own, Primitive, Profile, ProfileOf, Refusal,
    ReleaseArgs, Request, Script, WakeRule,
};
use crate::error::Result;
use crate::inspection::{Details, Inspection};
use crate::layout::{glob_escaped, Layout};
use crate::lock::{lock_of_family, Lock, LockKind};
use crate::lua;
use crate::names;
use crate::owner::OwnerId;

/// Where the keys this file reads one by one stand in its `Keys` (scripts take them in order,
/// with `Keys::first`): named, so that an index means one key.
const CHANNEL: usize = 1;
const PREFIX: usize = 4;

/// Every script of the read-write lock: a head, then one section per script.
const SCRIPTS: &str = include_str!("../../lua/rw_lock.lua");

/// Takes or re-enters a read hold of a read-write lock.
static RW_READ_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| lua::holds_script(SCRIPTS, "read_acquire", false));
/// Takes or re-enters the write hold of a read-write lock, or waits for it.
static RW_WRITE_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| lua::holds_script(SCRIPTS, "write_acquire", false));
/// Gives back read holds.
static RW_READ_RELEASE: LazyLock<Script> =
    LazyLock::new(|| lua::holds_script(SCRIPTS, "read_release", true));
/// Gives back write holds.
static RW_WRITE_RELEASE: LazyLock<Script> =
    LazyLock::new(|| lua::holds_script(SCRIPTS, "write_release", true));
/// Takes a waiting writer's place away.
static RW_LEAVE: LazyLock<Script> = LazyLock::new(|| lua::holds_script(SCRIPTS, "leave", true));
/// Extends many read and write holds in one call.
static RW_RENEW: LazyLock<Script> = LazyLock::new(|| lua::section_script(SCRIPTS, "renew", true));
/// Deletes a read-write lock whoever holds it.
static RW_FORCE_UNLOCK: LazyLock<Script> = LazyLock::new(|| {
    let [head, body] = lua::sections(SCRIPTS, "force_unlock");
    lua::compose(&[lua::DELETE_LOCK, head, body], true)
});
/// Counts an owner's live holds of a read-write lock.
static RW_HOLD_COUNT: LazyLock<Script> =
    LazyLock::new(|| lua::section_script(SCRIPTS, "hold_count", false));
/// Reads a read-write lock for an inspection.
static RW_INSPECT: LazyLock<Script> = LazyLock::new(|| lua::inspect_script(SCRIPTS, true));

/// The composed text of the read-write lock's script `name`, for tests and the benchmark.
pub(crate) fn script(name: &str) -> Option<&'static Script> {
    Some(match name {
        "read_acquire" => &RW_READ_ACQUIRE,
        "write_acquire" => &RW_WRITE_ACQUIRE,
        "read_release" => &RW_READ_RELEASE,
        "write_release" => &RW_WRITE_RELEASE,
        "leave" => &RW_LEAVE,
        "renew" => &RW_RENEW,
        "force_unlock" => &RW_FORCE_UNLOCK,
        "hold_count" => &RW_HOLD_COUNT,
        "inspect" => &RW_INSPECT,
        _ => return None,
    })
}

/// A distributed read-write lock: many readers at once, or one writer alone. Redisson's
/// `RReadWriteLock`, with the same keys, so Java and Rust clients exclude each other.
///
/// [`read_lock`](Self::read_lock) and [`write_lock`](Self::write_lock) return lock handles with
/// the methods of [`Lock`] (`lock`, `lock_with_lease`, `try_lock`, `with_lock`, `is_locked`,
/// `hold_count`, ..) and the same [`LockGuard`](crate::LockGuard)s: renewed by the watchdog,
/// reporting a loss through `lost()`, reentrant, given back on drop. Both convert into a
/// [`Lock`], so they fit in a [`MultiLock`](crate::MultiLock).
///
/// ```no_run
/// # async fn demo(client: fredlock::LockClient) -> fredlock::Result<()> {
/// use std::time::Duration;
///
/// let config = client.rw_lock("config:tenant-7");
/// let read = config.read_lock().lock().await?;          // many readers at once
/// // ... read the configuration ...
/// read.unlock().await?;
///
/// if let Some(write) = config.write_lock().try_lock(Duration::from_secs(2), None).await? {
///     // ... one writer alone ...
///     write.unlock().await?;                            // every waiting reader wakes
/// }
/// # Ok(()) }
/// ```
///
/// # Owners
///
/// Holds belong to the current task (or the owner pinned with [`with_owner`](Self::with_owner)),
/// as with [`Lock`]:
///
/// - Reads and writes are reentrant.
/// - **Downgrade** is allowed: the writer may take read holds, and keeps them after giving back
///   its write holds (the lock then stays in read mode).
/// - **Upgrade** is refused at once: an owner that holds a read lock and asks for the write lock
///   gets [`Error::WouldDeadlock`](crate::Error::WouldDeadlock). The write lock waits for every
///   reader, this owner included; Redisson lets such a thread wait for ever.
///
/// # Writer preference
///
/// By default a waiting writer keeps new readers out: readers already inside finish, readers
/// arriving after it wait, so a writer waits at most for the read holds present when it came
/// plus a hand-off, however busy the readers are. Re-entries of a reader (and the writer's own
/// read holds) are never kept out, which would deadlock. The price: under a steady stream of
/// writers, readers wait. A waiting writer keeps its place (in fredlock's own zset
/// `fredlock_rwlock_writers:{name}`, which Redisson never reads) by trying again at least every
/// third of [`queue_place`](crate::LockClientBuilder::queue_place); a writer whose
/// process died is forgotten once its place ends, by the Redis server's clock. A writer that
/// gives up leaves at once.
///
/// [`prefer_readers`](Self::prefer_readers) gives Redisson's behaviour instead: readers enter
/// whenever the lock is in read mode, and a writer may wait as long as readers keep overlapping.
/// Use one preference per name across clients. **Java Redisson readers do not honour writer
/// preference**: they enter whenever the lock is in read mode.
///
/// # Leases
///
/// Each read hold has its own timeout key (`{name}:<owner field>:rwlock_timeout:<n>`) whose TTL
/// is its lease, so one reader's expiry never ends another's; the lock's hash lives as long as
/// its longest hold. The watchdog renews read holds (their timeout keys, never another
/// reader's) and write holds. A reader's field may outlive its holds (until a release passes
/// over the readers, or the hash expires); `hold_count` counts only holds whose keys live.
///
/// # Wake-ups
///
/// Releases are published on `redisson_rwlock:{name}`: the last read unlock publishes `0`
/// (one waiter per client wakes; `1` while writers wait, so that a local writer is not passed
/// over), a write unlock `1`, which wakes every waiting reader at once.
#[derive(Clone)]
pub struct RwLock {
    read: ReadLock,
    write: WriteLock,
}

/// The read side of an [`RwLock`]: shared with other readers, excluded by a writer. Its
/// methods are [`Lock`]'s.
///
/// # Waiting
///
/// Granted at once while the lock is free or in read mode and no writer waits (with writer
/// preference); otherwise the reader sleeps until a write unlock wakes every reader, or at
/// most until the writer's hold or place would end. A zero `wait` makes one attempt.
///
/// # Cancel safety
///
/// Cancel safe: if an acquisition's future is dropped, no read hold is left behind, nor its
/// timeout key.
#[derive(Clone)]
pub struct ReadLock {
    lock: Lock,
}

lock_of_family!(ReadLock);

/// The write side of an [`RwLock`]: excludes every reader and other writers. Its methods are
/// [`Lock`]'s.
///
/// # Waiting
///
/// Granted once no reader and no other writer holds the lock. With writer preference the
/// waiter keeps new readers out from its first attempt on. An owner that holds a read lock
/// gets `Error::WouldDeadlock` at once. With a bounded wait
/// ([`try_lock`](crate::DistributedLock::try_lock)), when the wait ends, the waiter's place is
/// already given up; a zero `wait` makes one attempt and keeps nobody out.
///
/// # Cancel safety
///
/// Cancel safe: if an acquisition's future is dropped, no write hold is left behind, and the
/// waiter's place (which keeps readers out) is given up within milliseconds.
#[derive(Clone)]
pub struct WriteLock {
    lock: Lock,
}

lock_of_family!(WriteLock);

impl LockClient {
    /// A read-write lock named `name`, preferring writers (see [`RwLock`]). Creating it costs
    /// nothing and sends nothing; a name it cannot take (empty, or with a brace that makes no
    /// hash tag) is reported by the first operation.
    pub fn rw_lock(&self, name: impl Into<String>) -> RwLock {
        RwLock::new(self, self.key(name.into()), true)
    }
}

/// A read-write lock is known by its hash's `mode` field, and by its waiting writers' zset.
pub(crate) const LAYOUT: Layout = Layout {
    own_keys: &[names::RW_WRITERS],
    mode_field: true,
    strays: Some("*:rwlock_timeout:*"),
    own_key: None,
    of_type: None,
    at_key: |client, key| {
        Box::new(Lock::of_kind(
            client.clone(),
            RwKind::new(client, key, Side::Either, true),
        ))
    },
};

impl RwLock {
    fn new(client: &LockClient, name: String, prefer_writers: bool) -> RwLock {
        let side = |side| RwKind::new(client, name.clone(), side, prefer_writers);
        RwLock {
            read: ReadLock {
                lock: Lock::of_kind(client.clone(), side(Side::Read)),
            },
            write: WriteLock {
                lock: Lock::of_kind(client.clone(), side(Side::Write)),
            },
        }
    }

    /// The read side: many owners at once.
    pub fn read_lock(&self) -> ReadLock {
        self.read.clone()
    }

    /// The write side: one owner alone.
    pub fn write_lock(&self) -> WriteLock {
        self.write.clone()
    }

    /// The lock's Redis key.
    pub fn name(&self) -> &str {
        self.read.lock.name()
    }

    /// The same lock with Redisson's reader preference: readers enter whenever the lock is in
    /// read mode, even while a writer waits, and writers never keep them out. A writer may then
    /// wait as long as reads keep overlapping.
    pub fn prefer_readers(self) -> RwLock {
        let client = self.read.lock.client().clone();
        let mut lock = RwLock::new(&client, self.name().to_owned(), false);
        if let Some(owner) = self.read.lock.owner_pinned() {
            lock = lock.with_owner(owner);
        }
        lock
    }

    /// Whether waiting writers keep new readers out (the default).
    pub fn prefers_writers(&self) -> bool {
        self.write.lock.kind_place().is_some()
    }

    /// The same lock, owned by `owner` instead of the current task, on both sides; see
    /// [`Lock::with_owner`].
    pub fn with_owner(self, owner: OwnerId) -> RwLock {
        RwLock {
            read: self.read.with_owner(owner),
            write: self.write.with_owner(owner),
        }
    }

    /// What Redis holds of the lock now: its mode, readers and writer with their hold counts
    /// and remaining leases, the writers waiting, every key with its expiry, and read-hold
    /// timeout keys no hold names any more (found with a `SCAN` of the keyspace, which never
    /// blocks the server but costs a pass over every key).
    ///
    /// # Errors
    ///
    /// As [`Lock::inspect`](crate::LockFamily::inspect).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn inspect(&self) -> Result<Inspection> {
        self.read.lock.inspect().await
    }

    /// Deletes the lock in whichever mode, whoever holds it, with its read holds' timeout keys,
    /// and wakes every waiter; `true` if it was held. The holders' watchdogs find their holds
    /// gone and mark their guards lost.
    ///
    /// # Errors
    ///
    /// [`Error::WrongType`](crate::Error::WrongType), deleting nothing, when the key is not a
    /// read-write lock.
    ///
    /// # Cancel safety
    ///
    /// As [`Lock::force_unlock`](crate::LockFamily::force_unlock).
    pub async fn force_unlock(&self) -> Result<bool> {
        let client = self.read.lock.client();
        let either = RwKind::new(client, self.name().to_owned(), Side::Either, true);
        Lock::of_kind(client.clone(), either).force_unlock().await
    }
}

impl ReadLock {
    /// The same lock, owned by `owner` instead of the current task; see [`Lock::with_owner`].
    pub fn with_owner(self, owner: OwnerId) -> ReadLock {
        ReadLock {
            lock: self.lock.with_owner(owner),
        }
    }
}

impl WriteLock {
    /// The same lock, owned by `owner` instead of the current task; see [`Lock::with_owner`].
    pub fn with_owner(self, owner: OwnerId) -> WriteLock {
        WriteLock {
            lock: self.lock.with_owner(owner),
        }
    }
}

impl From<ReadLock> for Lock {
    fn from(read: ReadLock) -> Lock {
        read.lock
    }
}

impl From<WriteLock> for Lock {
    fn from(write: WriteLock) -> Lock {
        write.lock
    }
}

impl fmt::Debug for RwLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RwLock")
            .field("name", &self.name())
            .field("prefers_writers", &self.prefers_writers())
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for ReadLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ReadLock").field(&self.lock).finish()
    }
}

impl fmt::Debug for WriteLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("WriteLock").field(&self.lock).finish()
    }
}

/// Which side of the lock a handle takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Read,
    Write,
    /// Neither: a handle found by name, which inspects and force-unlocks in either mode.
    Either,
}

/// One side of a read-write lock, as the engine sees it.
struct RwKind {
    /// Its keys: the hash (the name), the channel, the fences of lost replies, the waiting
    /// writers, and, not a key, the prefix of read-hold timeout keys (empty for a name it
    /// refuses). On the write side, how long a waiting writer keeps new readers out without
    /// trying again (none with reader preference).
    profile: ProfileOf<[u32; 1]>,
    side: Side,
    /// Whether waiting writers keep new readers out.
    prefer_writers: bool,
}

/// What no side of a read-write lock can be named: with a brace but no hash tag.
const REFUSAL: Refusal = Refusal {
    what: "read-write lock",
    refuses: |keys| keys.str(PREFIX).is_empty(),
    why: "has a brace but no hash tag, so the timeout keys of its read holds would land in \
          another cluster slot: use a name without braces, or with a hash tag (`{tag}`)",
};

/// The class of one side of the lock labelled `label`, whose owner fields end in `suffix`.
const fn side(label: &'static str, field_suffix: &'static str) -> Class {
    Class {
        field_suffix,
        renewal: Some(&RW_RENEW),
        own: Own::Place,
        refusal: Some(REFUSAL),
        ..Class::new(label, WakeRule::Shared(CHANNEL), COMMANDS)
    }
}

/// The Redis commands `lua/rw_lock.lua`'s scripts run.
const SCRIPT_COMMANDS: &[&str] = &[
    "del",
    "exists",
    "hdel",
    "hexists",
    "hget",
    "hgetall",
    "hlen",
    "hset",
    "pexpire",
    "pttl",
    "set",
    "time",
    "zadd",
    "zrange",
    "zrem",
    "zremrangebyscore",
];

/// What a read-write lock's sides run (their classes' [`Class::commands`]): its scripts',
/// their preambles' and a guard's `while_held`'s.
const COMMANDS: &[&[&str]] = &[
    SCRIPT_COMMANDS,
    crate::lua::HOLDS_COMMANDS,
    crate::lua::DELETE_LOCK_COMMANDS,
    crate::lua::INSPECT_COMMANDS,
    crate::lock::guard::WHILE_HELD_COMMANDS,
];

static READ_LOCK: Class = side("read_lock", "");
static WRITE_LOCK: Class = side("write_lock", ":write");
static RW_LOCK: Class = side("rw_lock", ":write");

impl RwKind {
    fn new(client: &LockClient, name: String, side: Side, prefer_writers: bool) -> RwKind {
        let prefix = names::rw_timeout_prefix(&name).unwrap_or_default();
        let keys = Keys::new([
            &name,
            &names::rw_channel(&name),
            &names::fences(&name),
            &names::rw_writers(&name),
            &prefix,
        ]);
        let class = match side {
            Side::Read => &READ_LOCK,
            Side::Write => &WRITE_LOCK,
            Side::Either => &RW_LOCK,
        };
        // Only a writer waits in the line of writers.
        let place = (prefer_writers && side != Side::Read).then(|| client.queue_place());
        RwKind {
            profile: ProfileOf::new(class, keys).with_place(place),
            side,
            prefer_writers,
        }
    }

    fn keys(&self) -> &Keys {
        self.profile.keys()
    }

    fn prefix(&self) -> Value {
        Value::String(self.keys().text(PREFIX))
    }

    /// A call of one of the lock's scripts: every one takes the four keys, and the timeout
    /// prefix before `args`.
    fn call(&self, script: &'static Script, args: &[Value], request: Option<&Request>) -> Call {
        let mut argv = Vec::with_capacity(args.len() + 3);
        argv.push(self.prefix());
        argv.extend_from_slice(args);
        if let Some(request) = request {
            request.append_to(&mut argv);
        }
        Call {
            script,
            keys: self.keys().first(4),
            args: argv,
        }
    }

    /// The mode this handle's force unlock and `is_locked` are about; `None` for either.
    fn mode(&self) -> Option<&'static str> {
        match self.side {
            Side::Read => Some("read"),
            Side::Write => Some("write"),
            Side::Either => None,
        }
    }
}

impl Primitive for RwKind {
    fn profile(&self) -> &Profile {
        &self.profile
    }
}

impl Kind for RwKind {
    fn acquire(&self, args: &AcquireArgs<'_>) -> Call {
        let (script, last) = match self.side {
            Side::Read => (&RW_READ_ACQUIRE, Value::from(self.prefer_writers as i64)),
            Side::Write | Side::Either => (
                &RW_WRITE_ACQUIRE,
                Value::from(args.place_ms.unwrap_or_default() as i64),
            ),
        };
        let own = [
            args.lease.clone(),
            Value::String(args.field.clone()),
            Value::from(args.holds as i64),
            last,
        ];
        self.call(script, &own, Some(args.request))
    }
    fn release(&self, args: &ReleaseArgs<'_>) -> Call {
        let script = match self.side {
            Side::Read => &RW_READ_RELEASE,
            Side::Write | Side::Either => &RW_WRITE_RELEASE,
        };
        let own = [
            args.lease.clone(),
            Value::String(args.field.clone()),
            Value::from(args.left as i64),
        ];
        self.call(script, &own, Some(args.request))
    }
    fn leave(&self, field: &str, request: &Request) -> Option<Call> {
        (self.side != Side::Read)
            .then(|| self.call(&RW_LEAVE, &[Value::from(field)], Some(request)))
    }
}

impl Inspect for RwKind {
    fn family(&self) -> &'static str {
        "rw_lock"
    }
    fn strays(&self) -> Option<String> {
        Some(format!(
            "{}:*:rwlock_timeout:*",
            glob_escaped(self.keys().str(PREFIX))
        ))
    }
    fn inspect(&self) -> Call {
        self.call(&RW_INSPECT, &[], None)
    }
    fn details(&self, tail: &mut Tail) -> Result<Details, String> {
        let mode = match tail.text().as_deref() {
            Some("read") => Some("read"),
            Some("write") => Some("write"),
            _ => None,
        };
        Ok(Details::ReadWrite { mode })
    }
}

impl LockKind for RwKind {
    fn force_unlock(&self) -> Call {
        self.call(
            &RW_FORCE_UNLOCK,
            &[Value::from_static_str(self.mode().unwrap_or(""))],
            None,
        )
    }

    fn locked_mode(&self) -> Option<&'static str> {
        self.mode()
    }

    fn hold_count(&self, field: &str) -> Option<Call> {
        Some(self.call(&RW_HOLD_COUNT, &[Value::from(field)], None))
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
            &[&READ_LOCK, &WRITE_LOCK, &RW_LOCK],
            &[
                SCRIPTS,
                crate::lua::HOLDS,
                crate::lua::DELETE_LOCK,
                crate::lua::INSPECT_HEAD,
                crate::lock::guard::WHILE_HELD,
            ],
            &["rw_lock"],
        );
    }
}

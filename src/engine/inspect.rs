//! Inspections: what Redis holds of one primitive (its holders, its queue, its keys and their
//! expiry), read in one script call from the master, and the rules that call some of it a leak.
//!
//! Each primitive provides its own read ([`Inspect::inspect`]) and its own leak rules
//! ([`Inspect::leaks`]); every read replies in the one shape [`Inspection::parse`] reads (see
//! `lua/inspect.lua`), so this module knows no primitive.

use std::fmt;
use std::time::{Duration, SystemTime};

use fred::interfaces::{ClientLike, KeysInterface, PubsubInterface};
use fred::types::scan::ScanType;
use fred::types::Value;
use uuid::Uuid;

use crate::engine::kind::{Call, Primitive};
use crate::engine::profile::Wake;
use crate::engine::{naming, Engine};
use crate::error::Result;

/// A primitive, as an inspection sees it: beside [`Kind`] (what the acquire loop needs), how to
/// read it and what of it is a leak.
pub(crate) trait Inspect: Primitive {
    /// The read-only call that reads the primitive for an inspection; it replies in the shape
    /// [`Inspection::parse`] reads.
    fn inspect(&self) -> Call;

    /// What a primitive's inspections call its kind, when that is not its profile's label: both
    /// sides of a read-write lock inspect as one `rw_lock`.
    fn family(&self) -> &'static str {
        self.profile().label()
    }

    /// A glob of keys of the primitive that its state does not name, so that an inspection
    /// finds them only by scanning (a read-write lock's timeout keys left by holds that are
    /// gone); `None` for most.
    fn strays(&self) -> Option<String> {
        None
    }

    /// What in `inspection` nothing will clean up: by default each key without expiry. `grace`
    /// is how long past its end a waiter's place may linger before it counts.
    fn leaks(&self, inspection: &Inspection, _grace: Duration) -> Vec<Leak> {
        keys_without_expiry(inspection, &[])
    }
}

/// Keys asked for per `SCAN` call.
const SCAN_COUNT: u32 = 1000;

/// What Redis holds of one primitive at one moment, as [`Lock::inspect`](crate::Lock::inspect)
/// and [`LockClient::inspect`](crate::LockClient::inspect) read it.
///
/// Read in one script call on the master (never a replica), so its parts agree with each other.
/// Remaining times are the server's, at the moment of the read.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Inspection {
    /// The primitive's name (its main key).
    pub name: String,
    /// Its kind, as metrics and the `fredlock` command name it: `lock`, `spin_lock`,
    /// `fenced_lock`, `fair_lock`, `rw_lock` (whose metrics say `read_lock` and `write_lock`),
    /// `semaphore`, `permit_semaphore`, `count_down_latch`, `leader_election`, `job` (whose
    /// holder's identity is the host that runs it), or `counter` for an integer string
    /// found by name, which is a semaphore or a latch (Redisson's layouts cannot tell them
    /// apart).
    pub kind: &'static str,
    /// A read-write lock's mode, `read` or `write`; `None` when it is free or of another kind.
    pub mode: Option<&'static str>,
    /// Who holds it, with how many holds each. A read-write lock's writer is the owner field
    /// ending in `:write`; every other holder is a reader. A semaphore's holders are the grants
    /// of fredlock's acquisitions, each with the permits it took (Redisson's acquisitions
    /// leave no record); a permit semaphore's are its live leases, by permit id, one each.
    pub holders: Vec<Holder>,
    /// A fair lock's waiters, in the order they will be served; a read-write lock's waiting
    /// writers (who keep new readers out), by when their place ends.
    pub queue: Vec<QueuedWaiter>,
    /// A fenced lock's last fencing token issued (the holder's, while it is held).
    pub fencing_token: Option<u64>,
    /// A semaphore's permits available, or a count-down latch's count; `None` for a lock, or
    /// when the key is missing.
    pub count: Option<i64>,
    /// A permit semaphore's leases that ended and that no call has given back yet, with how
    /// long ago each ended: their permits return at the semaphore's next acquire, release or
    /// `available_permits`.
    pub ended_leases: Vec<EndedLease>,
    /// Connections subscribed to its unlock channel on the server read (each client subscribes
    /// once for all its waiting tasks); `None` for a primitive whose waiters do not subscribe to
    /// a shared channel (a spin lock, a fair lock: see [`queue`](Self::queue)).
    pub listeners: Option<u64>,
    /// Every key of the primitive that exists, with its expiry.
    pub keys: Vec<KeyState>,
    /// Keys of the primitive that no hold names any more, found by scanning: a read-write
    /// lock's read-hold timeout keys left behind (by a Java client, or a deletion of the lock).
    /// Each ends with its TTL; one without is a leak.
    pub orphans: Vec<KeyState>,
    /// A job lock's latest scheduled tick that an instance started (see
    /// [`JobLock::run_tick`](crate::JobLock::run_tick)); `None` for other kinds, or before
    /// the first.
    pub last_tick: Option<SystemTime>,
}

/// One owner's holds, in an [`Inspection`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holder {
    /// The owner field, `<client uuid>:<owner id>` (Redisson's form).
    pub owner: String,
    /// Its hold count (reentrant holds).
    pub count: u64,
    /// How long its hold lives unless renewed; `None` when it never expires (a leak). A
    /// reader's is its longest read hold's, zero once all ended (its field lingers until the
    /// next release or the lock's expiry).
    pub remaining_lease: Option<Duration>,
    /// Its fencing token, for a fenced lock (a leader election's epoch).
    pub fencing_token: Option<u64>,
    /// What the holder calls itself, where the primitive records it (a leader election's
    /// identity, `<host>:<pid>` by default).
    pub identity: Option<String>,
    /// When its hold began, by the server's clock, where the primitive records it (a leader
    /// election's term).
    pub since: Option<SystemTime>,
    /// The name its client was given
    /// ([`LockClientBuilder::client_name`](crate::LockClientBuilder::client_name)), found among
    /// the server's connections while that client is connected; `None` for a client without a
    /// name (a Redisson client, or one that is gone).
    pub client_name: Option<String>,
}

impl Holder {
    /// The client half of the owner field: the [`LockClient::id`](crate::LockClient::id) of
    /// the holder's client, when the field has Redisson's form.
    pub fn client_id(&self) -> Option<Uuid> {
        // `<uuid>:<id>`, and a read-write lock's writer `<uuid>:<id>:write`.
        let (client, _) = self.owner.split_once(':')?;
        Uuid::parse_str(client).ok()
    }
}

/// A waiter in a fair lock's queue, in an [`Inspection`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueuedWaiter {
    /// The waiter's owner field.
    pub owner: String,
    /// How long its place lasts unless it tries again; `None` once its place has ended (a live
    /// waiter renews it every third of the place's length).
    pub place_left: Option<Duration>,
    /// How long ago its place ended, for a place that has.
    pub ended_ago: Option<Duration>,
}

/// A permit semaphore's lease that ended and was not given back yet, in an [`Inspection`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct EndedLease {
    /// The permit id (Redisson's 16-byte ids in hex).
    pub permit: String,
    /// How long ago the lease ended, by the server's clock.
    pub ended_ago: Duration,
}

/// One key of a primitive, in an [`Inspection`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyState {
    /// The Redis key.
    pub key: String,
    /// Its time to live; `None` when it never expires.
    pub ttl: Option<Duration>,
}

/// Something a primitive left in Redis that nothing will clean up, as
/// [`LockClient::leaks`](crate::LockClient::leaks) finds it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leak {
    /// The primitive's name.
    pub name: String,
    /// Its kind.
    pub kind: &'static str,
    /// The key at fault.
    pub key: String,
    /// Which rule found it: `no_expiry` (a key of the primitive that never expires, and is not
    /// meant to last), `stale_waiter` (a fair lock's waiter whose place ended long ago).
    pub rule: &'static str,
    /// What was found, in words.
    pub detail: String,
}

impl fmt::Display for Leak {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {:?}: {} ({}, key {:?})",
            self.kind, self.name, self.detail, self.rule, self.key
        )
    }
}

impl Inspection {
    /// Whether anyone holds it.
    pub fn is_held(&self) -> bool {
        !self.holders.is_empty()
    }

    /// Whether any key of it exists.
    pub fn exists(&self) -> bool {
        !self.keys.is_empty()
    }

    /// Reads the reply of an inspect script: `{now (ms, server clock), {key, pttl, ..},
    /// {owner field, hold count, fencing token or '', ..}, {waiter field, place deadline (ms),
    /// ..}, last fencing token or ''}`.
    pub(crate) fn parse(kind: &dyn Inspect, reply: Value) -> Result<Inspection, String> {
        let Value::Array(parts) = reply else {
            return Err(format!("not an array: {reply:?}"));
        };
        let mut parts = parts.into_iter();
        let now = parts.next().and_then(|now| now.as_i64()).unwrap_or(0);
        let mut list = |what: &str, width: usize| match parts.next() {
            Some(Value::Array(items)) if items.len() % width == 0 => Ok(items),
            Some(Value::Null) | None => Ok(Vec::new()),
            other => Err(format!("{what}: {other:?}")),
        };
        let keys = list("keys", 2)?;
        let holders = list("holders", 4)?;
        let queue = list("queue", 2)?;
        let token = parts.next().and_then(|token| token.as_u64());
        let mode = match parts.next().and_then(|mode| mode.as_string()).as_deref() {
            Some("read") => Some("read"),
            Some("write") => Some("write"),
            _ => None,
        };
        let count = parts.next().and_then(|count| count.as_i64());
        let ended = match parts.next() {
            Some(Value::Array(items)) if items.len() % 2 == 0 => items,
            Some(Value::Null) | None => Vec::new(),
            other => return Err(format!("ended leases: {other:?}")),
        };
        // Who holders say they are: {owner field, identity, since ms, ..}.
        let identities = match parts.next() {
            Some(Value::Array(items)) if items.len() % 3 == 0 => items,
            _ => Vec::new(),
        };
        let last_tick = parts
            .next()
            .and_then(|tick| tick.as_u64())
            .map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms));
        let text = |value: &Value| value.as_string().unwrap_or_default();
        let number = |value: &Value| value.as_i64().unwrap_or(-1);
        let keys: Vec<KeyState> = keys
            .chunks(2)
            .map(|pair| KeyState {
                key: text(&pair[0]),
                ttl: millis(number(&pair[1])),
            })
            .collect();
        let name = kind.profile().name();
        let main_ttl = keys
            .iter()
            .find(|key| key.key == name)
            .and_then(|key| key.ttl);
        Ok(Inspection {
            name: name.to_owned(),
            kind: kind.family(),
            mode,
            holders: holders
                .chunks(4)
                .map(|holder| {
                    let owner = text(&holder[0]);
                    let told = identities.chunks(3).find(|told| text(&told[0]) == owner);
                    Holder {
                        count: holder[1].as_u64().unwrap_or(0),
                        remaining_lease: match &holder[3] {
                            Value::Integer(ms) => millis(*ms),
                            _ => main_ttl,
                        },
                        fencing_token: holder[2].as_u64(),
                        identity: told.map(|told| text(&told[1])),
                        since: told
                            .and_then(|told| told[2].as_u64())
                            .map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms)),
                        client_name: None,
                        owner,
                    }
                })
                .collect(),
            queue: queue
                .chunks(2)
                .map(|waiter| {
                    let left = number(&waiter[1]).saturating_sub(now);
                    QueuedWaiter {
                        owner: text(&waiter[0]),
                        place_left: (left > 0).then(|| Duration::from_millis(left as u64)),
                        ended_ago: (left <= 0).then(|| Duration::from_millis(left.unsigned_abs())),
                    }
                })
                .collect(),
            fencing_token: token,
            count,
            ended_leases: ended
                .chunks(2)
                .map(|lease| EndedLease {
                    permit: text(&lease[0]),
                    ended_ago: Duration::from_millis(
                        now.saturating_sub(number(&lease[1])).max(0) as u64
                    ),
                })
                .collect(),
            listeners: None,
            keys,
            orphans: Vec::new(),
            last_tick,
        })
    }
}

/// A PTTL reply as an expiry: `None` for a key without one.
fn millis(pttl: i64) -> Option<Duration> {
    u64::try_from(pttl).ok().map(Duration::from_millis)
}

/// The leak rule every primitive starts from: each of its keys (orphans included) that never
/// expires, but for those in `lasting` (keys meant to outlive every hold, such as a fenced
/// lock's counter).
pub(crate) fn keys_without_expiry(inspection: &Inspection, lasting: &[&str]) -> Vec<Leak> {
    inspection
        .keys
        .iter()
        .chain(&inspection.orphans)
        .filter(|key| key.ttl.is_none() && !lasting.contains(&key.key.as_str()))
        .map(|key| Leak {
            name: inspection.name.clone(),
            kind: inspection.kind,
            key: key.key.clone(),
            rule: "no_expiry",
            detail: if key.key == inspection.name && inspection.is_held() {
                format!(
                    "held by {} with no expiry: it is never freed unless force-unlocked",
                    owners(inspection)
                )
            } else {
                "a key with no expiry, which nothing deletes".to_owned()
            },
        })
        .collect()
}

fn owners(inspection: &Inspection) -> String {
    inspection
        .holders
        .iter()
        .map(|holder| holder.owner.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

impl Engine {
    /// Reads `kind` from the master, with the connections listening on its unlock channel.
    ///
    /// `scanned` is every key a scan already found among which the kind's strays are (see
    /// [`Inspect::strays`]), for a caller inspecting many primitives after one scan; `None` scans
    /// for this one's.
    pub(crate) async fn inspect(
        &self,
        kind: &dyn Inspect,
        scanned: Option<&[String]>,
    ) -> Result<Inspection> {
        let core = self.core();
        core.ensure_open()?;
        crate::engine::check_primitive(kind)?;
        let redis_error = |source| self.redis_error(kind.profile().name(), None, source);
        let reply: Value = kind
            .inspect()
            .run(&core.reads())
            .await
            .map_err(redis_error)?;
        let mut inspection = Inspection::parse(kind, reply).map_err(|problem| {
            redis_error(fred::error::Error::new(
                fred::error::ErrorKind::Parse,
                format!("unexpected reply from an inspect script: {problem}"),
            ))
        })?;
        if let Wake::Shared(channel) | Wake::Counted(channel) | Wake::AtZero(channel) =
            kind.profile().wake()
        {
            let counts: Vec<Value> = if core.writer.sharded {
                core.redis().pubsub_shardnumsub(&*channel).await
            } else {
                core.redis().pubsub_numsub(&*channel).await
            }
            .map_err(redis_error)?;
            inspection.listeners = counts.get(1).and_then(Value::as_u64);
        }
        // A caller inspecting many after one scan names their holders once, if it wants them
        // (`name_holders`), instead of one CLIENT LIST per primitive.
        if scanned.is_none() {
            self.name_holders(std::slice::from_mut(&mut inspection))
                .await;
        }
        if let Some(pattern) = kind.strays() {
            let strays = match scanned {
                Some(keys) => keys
                    .iter()
                    .filter(|key| glob(&pattern, key))
                    .cloned()
                    .collect(),
                None => self.scan(&pattern, None).await?,
            };
            for key in strays {
                if inspection.keys.iter().all(|known| known.key != key) {
                    let ttl: i64 = core.redis().pttl(&key).await.map_err(redis_error)?;
                    if ttl != -2 {
                        inspection.orphans.push(KeyState {
                            key,
                            ttl: millis(ttl),
                        });
                    }
                }
            }
        }
        Ok(inspection)
    }

    /// Fills each holder's client name in `inspections` from one `CLIENT LIST` (none when no
    /// holder has a client id).
    pub(crate) async fn name_holders(&self, inspections: &mut [Inspection]) {
        let holders = || {
            inspections
                .iter()
                .flat_map(|inspection| &inspection.holders)
        };
        if !holders().any(|holder| holder.client_id().is_some()) {
            return;
        }
        let names = naming::connected(self.core().redis()).await;
        for holder in inspections
            .iter_mut()
            .flat_map(|inspection| &mut inspection.holders)
        {
            holder.client_name = holder.client_id().and_then(|id| names.get(&id).cloned());
        }
    }

    /// Every key matching `pattern` (Redis's glob) of type `of_type`, on every master.
    pub(crate) async fn scan(
        &self,
        pattern: &str,
        of_type: Option<ScanType>,
    ) -> Result<Vec<String>> {
        let core = self.core();
        core.ensure_open()?;
        let redis = core.redis();
        let redis_error = |source| self.redis_error(pattern, None, source);
        let mut keys = Vec::new();
        if redis.is_clustered() {
            for master in core.masters() {
                scan_node(
                    &redis.with_cluster_node(master),
                    pattern,
                    of_type.clone(),
                    &mut keys,
                )
                .await
                .map_err(redis_error)?;
            }
        } else {
            scan_node(redis, pattern, of_type, &mut keys)
                .await
                .map_err(redis_error)?;
        }
        keys.sort();
        keys.dedup();
        Ok(keys)
    }
}

/// Pages through one node's keys.
async fn scan_node<C: KeysInterface + Sync>(
    node: &C,
    pattern: &str,
    of_type: Option<ScanType>,
    keys: &mut Vec<String>,
) -> Result<(), fred::error::Error> {
    let mut cursor = "0".to_owned();
    loop {
        let (next, page): (String, Vec<String>) = node
            .scan_page(cursor, pattern, Some(SCAN_COUNT), of_type.clone())
            .await?;
        keys.extend(page);
        if next == "0" {
            return Ok(());
        }
        cursor = next;
    }
}

/// Whether `text` matches `pattern`, a glob as Redis's `KEYS` and `SCAN` read it: `*`, `?`,
/// `[abc]`, `[^a-z]`, and `\` quoting the next character.
pub(crate) fn glob(pattern: &str, text: &str) -> bool {
    let pattern: Vec<char> = pattern.chars().collect();
    let text: Vec<char> = text.chars().collect();
    glob_at(&pattern, &text)
}

fn glob_at(pattern: &[char], text: &[char]) -> bool {
    let Some((&first, rest)) = pattern.split_first() else {
        return text.is_empty();
    };
    match first {
        '*' => (0..=text.len()).any(|skip| glob_at(rest, &text[skip..])),
        '?' => !text.is_empty() && glob_at(rest, &text[1..]),
        '[' => {
            let Some((&c, text_rest)) = text.split_first() else {
                return false;
            };
            let mut i = 0;
            let negate = rest.first() == Some(&'^');
            if negate {
                i += 1;
            }
            let mut matched = false;
            while i < rest.len() && rest[i] != ']' {
                if rest[i] == '\\' && i + 1 < rest.len() {
                    matched |= rest[i + 1] == c;
                    i += 2;
                } else if i + 2 < rest.len() && rest[i + 1] == '-' && rest[i + 2] != ']' {
                    let (low, high) = (rest[i].min(rest[i + 2]), rest[i].max(rest[i + 2]));
                    matched |= (low..=high).contains(&c);
                    i += 3;
                } else {
                    matched |= rest[i] == c;
                    i += 1;
                }
            }
            // Past the `]` (an unclosed class runs to the end, as in Redis).
            let after = (i + 1).min(rest.len());
            matched != negate && glob_at(&rest[after..], text_rest)
        }
        '\\' if !rest.is_empty() => {
            text.first() == Some(&rest[0]) && glob_at(&rest[1..], &text[1..])
        }
        c => text.first() == Some(&c) && glob_at(rest, &text[1..]),
    }
}

#[cfg(test)]
mod tests {
    use super::glob;

    #[test]
    fn globs_match_as_redis_matches_them() {
        assert!(glob("*", ""));
        assert!(glob("orders:*", "orders:1001"));
        assert!(!glob("orders:*", "order:1"));
        assert!(glob("h?llo", "hello") && !glob("h?llo", "hllo"));
        assert!(glob("h[ae]llo", "hallo") && !glob("h[ae]llo", "hillo"));
        assert!(glob("h[^e]llo", "hallo") && !glob("h[^e]llo", "hello"));
        assert!(glob("h[a-b]llo", "hbllo") && !glob("h[a-b]llo", "hcllo"));
        assert!(glob("a\\*b", "a*b") && !glob("a\\*b", "axb"));
        assert!(glob("*{x}*", "lock:{x}:1"));
    }
}

//! Inspections: what Redis holds of one primitive (its holders, its queue, its keys and their
//! expiry), read in one script call from the master, and the rules that call some of it a leak.
//!
//! Each primitive provides its own read ([`Inspect::inspect`]) and its own leak rules
//! ([`Inspect::leaks`]); every read replies in the one shape `parse` reads (see
//! `lua/inspect.lua`): the head every primitive shares, then a tail each reads into its own
//! details ([`Inspect::details`]), so this module knows no primitive.

use std::time::{Duration, SystemTime};

use crate::engine::ScanType;
use crate::engine::Value;

use crate::engine::kind::{Call, Primitive};
use crate::engine::profile::Wake;
use crate::engine::{naming, Connection, Engine};
use crate::error::{RedisError, Result};
use crate::inspection::{
    expiry, keys_without_expiry, Details, Holder, Inspection, KeyState, Leak, QueuedWaiter,
};

/// A primitive, as an inspection sees it: beside [`Kind`] (what the acquire loop needs), how to
/// read it, what it has of its own and what of it is a leak.
pub(crate) trait Inspect: Primitive {
    /// The read-only call that reads the primitive for an inspection; it replies in the shape
    /// [`parse`] reads.
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

    /// What the kind has of its own, read from the reply's tail (the parts after the head, in
    /// the order its script writes them); by default nothing.
    fn details(&self, _tail: &mut Tail) -> Result<Details, String> {
        Ok(Details::None)
    }
}

/// Keys asked for per `SCAN` call.
const SCAN_COUNT: u32 = 1000;

/// Reads the head of an inspect script's reply, `{now (ms, server clock), {key, pttl, ..},
/// {owner field, hold count, remaining lease or '', ..}, {waiter field, place deadline (ms),
/// ..}, ..}`, and hands the rest to the kind's [`Inspect::details`].
fn parse(kind: &dyn Inspect, reply: Value) -> Result<Inspection, String> {
    let Value::Array(parts) = reply else {
        return Err(format!("not an array: {reply:?}"));
    };
    let mut parts = parts.into_iter();
    let now = parts.next().and_then(|now| now.as_i64()).unwrap_or(0);
    let mut tail = Tail::new(now, parts);
    let keys: Vec<KeyState> = tail
        .rows("keys", 2)?
        .iter()
        .map(|pair| KeyState {
            key: text(&pair[0]),
            ttl: expiry(pair[1].as_i64().unwrap_or(-1)),
        })
        .collect();
    let name = kind.profile().name();
    let main_ttl = keys
        .iter()
        .find(|key| key.key == name)
        .and_then(|key| key.ttl);
    let holders: Vec<Holder> = tail
        .rows("holders", 3)?
        .iter()
        .map(|holder| Holder {
            owner: text(&holder[0]),
            count: holder[1].as_u64().unwrap_or(0),
            remaining_lease: match &holder[2] {
                Value::Integer(ms) => expiry(*ms),
                _ => main_ttl,
            },
            client_name: None,
        })
        .collect();
    let queue = tail
        .rows("queue", 2)?
        .iter()
        .map(|waiter| {
            let left = waiter[1].as_i64().unwrap_or(-1).saturating_sub(now);
            QueuedWaiter {
                owner: text(&waiter[0]),
                place_left: (left > 0).then(|| Duration::from_millis(left as u64)),
                ended_ago: (left <= 0).then(|| Duration::from_millis(left.unsigned_abs())),
            }
        })
        .collect();
    let details = kind.details(&mut tail)?;
    Ok(Inspection {
        name: name.to_owned(),
        kind: kind.family(),
        holders,
        queue,
        listeners: None,
        keys,
        orphans: Vec::new(),
        details,
    })
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
        let redis_error =
            |source: RedisError| self.redis_error(kind.profile().name(), None, source);
        core.redis().refused_unconnected().map_err(redis_error)?;
        let reply: Value = kind
            .inspect()
            .run(&core.reads())
            .await
            .map_err(redis_error)?;
        let mut inspection = parse(kind, reply).map_err(|problem| {
            redis_error(RedisError::unreadable(format!(
                "unexpected reply from an inspect script: {problem}"
            )))
        })?;
        if let Wake::Shared(channel)
        | Wake::InLine(channel)
        | Wake::Counted(channel)
        | Wake::AtZero(channel) = kind.profile().wake()
        {
            let counts = core
                .redis()
                .subscribers(&channel, core.writer.sharded)
                .await
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
                    let ttl = core.redis().pttl(&key).await.map_err(redis_error)?;
                    if ttl != -2 {
                        inspection.orphans.push(KeyState {
                            key,
                            ttl: expiry(ttl),
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
        let redis_error = |source: RedisError| self.redis_error(pattern, None, source);
        redis.refused_unconnected().map_err(redis_error)?;
        let mut keys = Vec::new();
        if redis.is_clustered() {
            for master in core.masters() {
                scan_node(&redis.on_node(master), pattern, of_type.clone(), &mut keys)
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
async fn scan_node(
    node: &Connection,
    pattern: &str,
    of_type: Option<ScanType>,
    keys: &mut Vec<String>,
) -> Result<(), RedisError> {
    let mut cursor = "0".to_owned();
    loop {
        let (next, page): (String, Vec<String>) = node
            .scan_page(cursor, pattern, SCAN_COUNT, of_type.clone())
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

/// The reader of an inspect script's tail, the parts after the head: each primitive reads its
/// own, in the order its script writes them.
pub(crate) struct Tail {
    /// The server's clock at the read, in ms.
    pub(crate) now: i64,
    parts: std::vec::IntoIter<Value>,
}

impl Tail {
    pub(crate) fn new(now: i64, parts: std::vec::IntoIter<Value>) -> Tail {
        Tail { now, parts }
    }

    /// The next part as a whole number; `None` for `''` or a missing part.
    pub(crate) fn number(&mut self) -> Option<i64> {
        self.parts.next().and_then(|part| part.as_i64())
    }

    /// The next part as a token or epoch; `None` for `''` or a missing part.
    pub(crate) fn token(&mut self) -> Option<u64> {
        self.parts.next().and_then(|part| part.as_u64())
    }

    /// The next part as text; `None` for `''` or a missing part.
    pub(crate) fn text(&mut self) -> Option<String> {
        self.parts
            .next()
            .and_then(|part| part.as_string())
            .filter(|text| !text.is_empty())
    }

    /// The next part as a time in ms by the server's clock.
    pub(crate) fn time(&mut self) -> Option<SystemTime> {
        self.token()
            .map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms))
    }

    /// The next part as a flat list of `width`-wide rows.
    pub(crate) fn rows(&mut self, what: &str, width: usize) -> Result<Vec<Vec<Value>>, String> {
        match self.parts.next() {
            Some(Value::Array(items)) if items.len() % width == 0 => {
                let mut items = items.into_iter();
                let mut rows = Vec::new();
                loop {
                    let row: Vec<Value> = items.by_ref().take(width).collect();
                    if row.is_empty() {
                        return Ok(rows);
                    }
                    rows.push(row);
                }
            }
            Some(Value::Null) | None => Ok(Vec::new()),
            other => Err(format!("{what}: {other:?}")),
        }
    }

    /// The next part as it is.
    pub(crate) fn part(&mut self) -> Option<Value> {
        self.parts.next()
    }
}

/// A reply part as text (`""` for none).
pub(crate) fn text(value: &Value) -> String {
    value.as_string().unwrap_or_default()
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

//! Redis key and channel names derived from a lock name, as Redisson derives them, placed in
//! the lock's cluster slot whatever the name.

use std::fmt::Write;
use std::sync::OnceLock;

/// The part of `key` Redis hashes to choose its cluster slot, when it has one: what lies between
/// the first `{` and the first `}` after it, if that is not empty. Otherwise Redis hashes the
/// whole key.
fn hash_tag(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let rest = &key[open + 1..];
    let close = rest.find('}')?;
    (close > 0).then(|| &rest[..close])
}

/// `prefix:{name}`, or `prefix:name` when the name carries a hash tag (Redisson's two forms,
/// used for every name they keep in the lock's slot); for any other name, a key whose hash tag
/// hashes to the name's slot. Every derived key thus lands in the cluster slot of the lock.
///
/// Redisson braces only names without `{`, and leaves the rest as they are. That misplaces a
/// name with a `{` but no tag (`a{b`: braced here, so its tag is the whole name) and a name with
/// a `}` that is no tag's end (`}{x`, `{}x`, `x{}y{z}`, `a}b`: the name's slot cannot be written
/// as a tag of the name, so the key starts with a short tag of the same slot).
pub(crate) fn suffixed(prefix: &str, name: &str) -> String {
    if hash_tag(name).is_some() {
        format!("{prefix}:{name}")
    } else if !name.contains('}') {
        format!("{prefix}:{{{name}}}")
    } else {
        let slot = crate::engine::key_slot(name.as_bytes());
        format!("{prefix}:{{{}}}:{name}", slot_tag(slot))
    }
}

/// The name `key` was derived from by [`suffixed`] with `prefix`, if it was: what a scan that
/// finds a primitive's own key reads its name from.
pub(crate) fn unsuffixed(prefix: &str, key: &str) -> Option<String> {
    let rest = key.strip_prefix(prefix)?.strip_prefix(':')?;
    let braced = rest
        .strip_prefix('{')
        .and_then(|inner| inner.strip_suffix('}'));
    let tagged = rest
        .strip_prefix('{')
        .and_then(|inner| inner.split_once("}:"))
        .map(|(_, name)| name);
    [braced, tagged, Some(rest)]
        .into_iter()
        .flatten()
        .find(|name| suffixed(prefix, name) == key)
        .map(str::to_owned)
}

/// The smallest number whose decimal form hashes to `slot`: the same on every client, so all of
/// them derive the same keys. The table of all 16384 is built on first use, in one pass over
/// the numbers below 300 000 (see the test), and only by a process that meets such a name.
fn slot_tag(slot: u16) -> u32 {
    static TAGS: OnceLock<Vec<u32>> = OnceLock::new();
    let tags = TAGS.get_or_init(|| {
        let mut tags = vec![u32::MAX; SLOTS];
        let mut missing = SLOTS;
        let mut text = String::new();
        for n in 0..u32::MAX {
            text.clear();
            let _ = write!(text, "{n}");
            let tag = &mut tags[usize::from(crate::engine::key_slot(text.as_bytes()))];
            if *tag == u32::MAX {
                *tag = n;
                missing -= 1;
                if missing == 0 {
                    break;
                }
            }
        }
        tags
    });
    tags.get(usize::from(slot)).copied().unwrap_or_default()
}

/// Cluster slots in Redis.
const SLOTS: usize = 16384;

/// The channel on which a reentrant lock announces its release.
pub(crate) fn lock_channel(name: &str) -> String {
    suffixed("redisson_lock__channel", name)
}

/// The prefix of a fair lock's queue key.
pub(crate) const FAIR_QUEUE: &str = "redisson_lock_queue";
/// The prefix of a fair lock's place-timeout key.
pub(crate) const FAIR_TIMEOUTS: &str = "redisson_lock_timeout";
/// The prefix of a fenced lock's token counter key.
pub(crate) const FENCING_TOKEN: &str = "redisson_lock_token";

/// The prefix of a read-write lock's zset of waiting writers (fredlock's own; Redisson has none).
pub(crate) const RW_WRITERS: &str = "fredlock_rwlock_writers";

/// The channel on which a read-write lock announces its releases.
pub(crate) fn rw_channel(name: &str) -> String {
    suffixed("redisson_rwlock", name)
}

/// A read-write lock's zset of waiting writer field -> when its place ends.
pub(crate) fn rw_writers(name: &str) -> String {
    suffixed(RW_WRITERS, name)
}

/// What a read-write lock's read-hold timeout keys start with (Redisson's rule, which its
/// scripts apply to any name they are given): the name when it carries a hash tag, else
/// `{name}`. `None` for a name with a brace but no hash tag, whose timeout keys would land in
/// another cluster slot than the lock.
pub(crate) fn rw_timeout_prefix(name: &str) -> Option<String> {
    if hash_tag(name).is_some() {
        Some(name.to_owned())
    } else if name.contains(['{', '}']) {
        None
    } else {
        Some(format!("{{{name}}}"))
    }
}

/// The fair lock's queue of waiter fields, in arrival order.
pub(crate) fn fair_queue(name: &str) -> String {
    suffixed(FAIR_QUEUE, name)
}

/// The fair lock's zset of waiter field -> when the waiter's place expires.
pub(crate) fn fair_timeouts(name: &str) -> String {
    suffixed(FAIR_TIMEOUTS, name)
}

/// The prefix of a reentrant lock's line of waiting clients (fredlock's own; Redisson has none).
pub(crate) const LOCK_LINE: &str = "fredlock_lock_waiters";

/// A reentrant lock's line: a zset of client number -> when its place ends (see `lua/lock.lua`).
pub(crate) fn lock_line(name: &str) -> String {
    suffixed(LOCK_LINE, name)
}

/// The prefix of the key that keeps a reentrant lock a moment for the client a release named.
pub(crate) const LOCK_NAMED: &str = "fredlock_lock_next";

/// The key that keeps a reentrant lock for the client a release named (see `lua/lock.lua`).
pub(crate) fn lock_named(name: &str) -> String {
    suffixed(LOCK_NAMED, name)
}

/// fredlock's own set of fenced request ids (see `ledger`); Redisson never reads it.
pub(crate) fn fences(name: &str) -> String {
    suffixed("fredlock_fences", name)
}

/// The fenced lock's counter of fencing tokens.
pub(crate) fn fencing_token(name: &str) -> String {
    suffixed(FENCING_TOKEN, name)
}

/// The channel on which a semaphore announces its permits available (Redisson's).
pub(crate) fn semaphore_channel(name: &str) -> String {
    suffixed("redisson_sc", name)
}

/// The prefix of fredlock's own hash of a semaphore's grants (Redisson has none).
pub(crate) const SEMAPHORE_GRANTS: &str = "fredlock_permits";

/// fredlock's hash of the permits each of its acquisitions of a semaphore took.
pub(crate) fn semaphore_grants(name: &str) -> String {
    suffixed(SEMAPHORE_GRANTS, name)
}

/// A permit semaphore's zset of permit id -> when its lease ends (Redisson's
/// `{name}:timeout`, by its rule: the name itself when it carries a hash tag); `None` for a name
/// with a brace but no hash tag, whose leases would land in another cluster slot.
pub(crate) fn permit_leases(name: &str) -> Option<String> {
    rw_timeout_prefix(name).map(|prefix| format!("{prefix}:timeout"))
}

/// The name of the permit semaphore whose leases are at `key`, if it is such a key.
pub(crate) fn permit_leases_owner(key: &str) -> Option<String> {
    let prefix = key.strip_suffix(":timeout")?;
    let name = match prefix
        .strip_prefix('{')
        .and_then(|inner| inner.strip_suffix('}'))
    {
        Some(inner) if !inner.contains(['{', '}']) => inner.to_owned(),
        _ => prefix.to_owned(),
    };
    (permit_leases(&name).as_deref() == Some(key)).then_some(name)
}

/// The channel on which a count-down latch announces a new count and its reaching zero:
/// Redisson's, braced whatever the name.
pub(crate) fn latch_channel(name: &str) -> String {
    format!("redisson_countdownlatch__channel__{{{name}}}")
}

/// The message a final unlock publishes on [`lock_channel`].
pub(crate) const UNLOCK_MESSAGE: &str = "0";

/// This host's name, as `$HOSTNAME` or `/etc/hostname` give it; `localhost` when neither does.
pub(crate) fn host_name() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|host| host.trim().to_owned())
        .filter(|host| !host.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_derived_key_gives_back_its_name() {
        for name in [
            "orders:1", "a{b}c", "a{b", "}{x", "{}x", "x{}y{z}", "a}b", "",
        ] {
            let key = suffixed("redisson_lock_queue", name);
            assert_eq!(
                unsuffixed("redisson_lock_queue", &key).as_deref(),
                Some(name),
                "{key}"
            );
        }
        assert_eq!(
            unsuffixed("redisson_lock_queue", "redisson_lock_token:{a}"),
            None
        );
        // A name with a hash tag is not braced again: this key is the name `{a}b`'s.
        assert_eq!(
            unsuffixed("redisson_lock_queue", "redisson_lock_queue:{a}b").as_deref(),
            Some("{a}b")
        );
        assert_eq!(
            unsuffixed("redisson_lock_queue", "redisson_lock_queue:{a"),
            None
        );
    }

    #[test]
    fn braces_a_plain_name() {
        assert_eq!(
            lock_channel("orders:1"),
            "redisson_lock__channel:{orders:1}"
        );
    }

    #[test]
    fn fair_lock_names_follow_redisson() {
        assert_eq!(fair_queue("t"), "redisson_lock_queue:{t}");
        assert_eq!(fencing_token("t"), "redisson_lock_token:{t}");
        assert_eq!(fair_timeouts("t"), "redisson_lock_timeout:{t}");
        // Each waiter's channel, `<lock channel>:<waiter field>`, is checked on the wire by
        // tests/fair_lock.rs (the engine's `Wake::PerWaiter`).
    }

    #[test]
    fn keeps_an_existing_hash_tag() {
        assert_eq!(lock_channel("a{b}c"), "redisson_lock__channel:a{b}c");
        assert_eq!(lock_channel("{b}"), "redisson_lock__channel:{b}");
        assert_eq!(lock_channel("a{b}}{"), "redisson_lock__channel:a{b}}{");
    }

    /// Every derived key hashes to its lock's slot, for names of every shape.
    #[test]
    fn derived_keys_share_the_slot_of_the_lock() {
        let names = [
            "orders:1", "a{b", "}{x", "{}x", "x{}y{z}", "a}b", "{", "}", "{}", "}{", "{{}}",
            "a{b}c", "{a}{b}", "é{ü", "{}{}",
        ];
        for name in names {
            let slot = crate::engine::key_slot(name.as_bytes());
            for key in [lock_channel(name), fair_queue(name), fair_timeouts(name)] {
                assert_eq!(
                    crate::engine::key_slot(key.as_bytes()),
                    slot,
                    "{key:?} is not in the slot of {name:?}"
                );
            }
        }
        assert_eq!(lock_channel("a{b"), "redisson_lock__channel:{a{b}");
        let tag = slot_tag(crate::engine::key_slot(b"}{x"));
        assert_eq!(
            lock_channel("}{x"),
            format!("redisson_lock__channel:{{{tag}}}:}}{{x")
        );
    }

    /// `slot_tag` always finds a tag: every slot is reached by a number below 300 000.
    #[test]
    fn every_slot_has_a_short_tag() {
        for slot in [0, 1, 8000, 16383] {
            let tag = slot_tag(slot);
            assert!(tag < 300_000, "{tag}");
            assert_eq!(crate::engine::key_slot(tag.to_string().as_bytes()), slot);
        }
        let mut reached = vec![false; 16384];
        let mut missing = reached.len();
        for n in 0..300_000u32 {
            let slot = crate::engine::key_slot(n.to_string().as_bytes()) as usize;
            if !reached[slot] {
                reached[slot] = true;
                missing -= 1;
            }
        }
        assert_eq!(missing, 0);
    }
}

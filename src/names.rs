//! Redis key and channel names derived from a lock name, as Redisson derives them.

/// `prefix:{name}`, or `prefix:name` when the name already carries a `{hash tag}`: either way
/// the derived key hashes to the same cluster slot as the lock itself.
pub(crate) fn suffixed(prefix: &str, name: &str) -> String {
    if name.contains('{') {
        format!("{prefix}:{name}")
    } else {
        format!("{prefix}:{{{name}}}")
    }
}

/// The channel on which a reentrant lock announces its release.
pub(crate) fn lock_channel(name: &str) -> String {
    suffixed("redisson_lock__channel", name)
}

/// The fair lock's queue of waiter fields, in arrival order.
pub(crate) fn fair_queue(name: &str) -> String {
    suffixed("redisson_lock_queue", name)
}

/// The fair lock's zset of waiter field -> end of the waiter's slot.
pub(crate) fn fair_timeouts(name: &str) -> String {
    suffixed("redisson_lock_timeout", name)
}

/// The channel on which a fair lock tells one waiter that it is next.
pub(crate) fn waiter_channel(lock_channel: &str, field: &str) -> String {
    format!("{lock_channel}:{field}")
}

/// The message a final unlock publishes on [`lock_channel`].
pub(crate) const UNLOCK_MESSAGE: i64 = 0;

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(fair_timeouts("t"), "redisson_lock_timeout:{t}");
        assert_eq!(
            waiter_channel(&lock_channel("t"), "u:7"),
            "redisson_lock__channel:{t}:u:7"
        );
    }

    #[test]
    fn keeps_an_existing_hash_tag() {
        assert_eq!(lock_channel("a{b}c"), "redisson_lock__channel:a{b}c");
    }
}

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
    fn keeps_an_existing_hash_tag() {
        assert_eq!(lock_channel("a{b}c"), "redisson_lock__channel:a{b}c");
    }
}

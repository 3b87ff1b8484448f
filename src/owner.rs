//! Who holds a lock: the owner id half of the `<client uuid>:<owner id>` hash field.

use std::cell::Cell;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// Identifies the owner of a hold within one [`LockClient`](crate::LockClient).
///
/// Redisson keys a hold by `<client uuid>:<thread id>`; fredlock puts the **tokio task id** in
/// the thread id's place, so reentrancy is per task: a task that locks a lock it already holds
/// gets one more hold instead of waiting for itself.
///
/// Consequences worth knowing:
/// - Futures polled inside one task (`tokio::join!`, `select!`, `FuturesUnordered`) share that
///   task's owner id, so they do **not** exclude each other: both would enter. Spawn a task per
///   contender, or give each its own id with [`Lock::with_owner`](crate::Lock::with_owner).
/// - Outside a tokio task (for example in `block_on`), each thread has a stable owner id of its
///   own, written `t<n>` (`t1` for the first thread of the process to ask, `t2` for the next).
/// - Work that hops tasks (acquire in one, release in another, and reenter from a third) can pin
///   an id: create one with [`OwnerId::unique`] (written `u<n>`) and use
///   [`Lock::with_owner`](crate::Lock::with_owner) everywhere. A
///   [`LockGuard`](crate::LockGuard) remembers its owner, so moving a guard to another task and
///   unlocking it there needs no pinning.
///
/// In the hash field `<client uuid>:<owner id>`, a task's id is its number, as Redisson writes
/// a thread's; the letters keep the other kinds apart from task ids and from each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OwnerId(Origin);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
/// Where an owner id comes from: each is written with its own letter.
enum Origin {
    /// A tokio task's id, or a number chosen by the caller.
    Number(u64),
    /// A thread outside any task.
    Thread(u64),
    /// Made by [`OwnerId::unique`].
    Unique(u64),
}

static NEXT_THREAD: AtomicU64 = AtomicU64::new(1);
static NEXT_UNIQUE: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static THREAD_OWNER: u64 = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
    /// The last task id seen on this thread and its integer, to skip re-parsing it.
    static LAST_TASK: Cell<Option<(tokio::task::Id, u64)>> = const { Cell::new(None) };
}

impl OwnerId {
    /// The owner id of the calling task, or of the calling thread outside a tokio task.
    pub fn current() -> OwnerId {
        if let Some(id) = tokio::task::try_id() {
            if let Some((last, raw)) = LAST_TASK.get() {
                if last == id {
                    return OwnerId(Origin::Number(raw));
                }
            }
            // tokio exposes the task id only through Display, which prints the integer.
            if let Ok(raw) = id.to_string().parse::<u64>() {
                LAST_TASK.set(Some((id, raw)));
                return OwnerId(Origin::Number(raw));
            }
        }
        OwnerId(Origin::Thread(THREAD_OWNER.with(|id| *id)))
    }

    /// A fresh id, distinct from every task id, every thread's id and every other id this
    /// process hands out.
    pub fn unique() -> OwnerId {
        OwnerId(Origin::Unique(NEXT_UNIQUE.fetch_add(1, Ordering::Relaxed)))
    }

    /// An id chosen by the caller, for example to resume ownership recorded elsewhere; it is
    /// written as the number, as a task id is.
    ///
    /// The caller must keep it distinct from the ids of other owners using the same client: a
    /// number may equal a tokio task id.
    pub const fn from_raw(raw: u64) -> OwnerId {
        OwnerId(Origin::Number(raw))
    }
}

impl OwnerId {
    /// The longest an encoded id is: a kind letter and the 20 digits of `u64::MAX`.
    pub(crate) const MAX_LEN: usize = 21;

    /// The id as written (`7`, `t3`, `u12`), encoded into `buf` without the formatting
    /// machinery: every acquire writes one into its owner field, and `format!` cost that
    /// 1 500 instructions. Its length is known before the field is allocated, so the field is
    /// allocated once, at its size.
    pub(crate) fn encode(self, buf: &mut [u8; OwnerId::MAX_LEN]) -> &str {
        let (letter, mut rest) = match self.0 {
            Origin::Number(n) => (None, n),
            Origin::Thread(n) => (Some(b't'), n),
            Origin::Unique(n) => (Some(b'u'), n),
        };
        let mut start = buf.len();
        loop {
            start -= 1;
            buf[start] = b'0' + (rest % 10) as u8;
            rest /= 10;
            if rest == 0 {
                break;
            }
        }
        if let Some(letter) = letter {
            start -= 1;
            buf[start] = letter;
        }
        // ASCII digits and a letter: always UTF-8.
        std::str::from_utf8(&buf[start..]).unwrap_or_default()
    }
}

impl fmt::Display for OwnerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.encode(&mut [0; OwnerId::MAX_LEN]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_outside_tasks_are_readable_and_distinct() {
        let thread = OwnerId::current().to_string();
        assert!(
            thread.starts_with('t') && thread[1..].parse::<u64>().is_ok(),
            "{thread}"
        );
        assert_eq!(OwnerId::current().to_string(), thread, "stable per thread");
        let other = std::thread::spawn(|| OwnerId::current().to_string())
            .join()
            .unwrap();
        assert_ne!(other, thread);
        let (a, b) = (OwnerId::unique(), OwnerId::unique());
        assert_ne!(a, b);
        assert!(a.to_string().starts_with('u'), "{a}");
        assert_eq!(OwnerId::from_raw(7).to_string(), "7");
    }

    #[test]
    fn ids_are_written_as_their_kind_and_number() {
        let ids = [
            (OwnerId::from_raw(0), "0"),
            (OwnerId::from_raw(10), "10"),
            (OwnerId::from_raw(u64::MAX), "18446744073709551615"),
            (OwnerId(Origin::Thread(0)), "t0"),
            (OwnerId(Origin::Thread(1234567890)), "t1234567890"),
            (OwnerId(Origin::Unique(u64::MAX)), "u18446744073709551615"),
        ];
        for (id, text) in ids {
            assert_eq!(id.to_string(), text);
            assert_eq!(id.encode(&mut [0; OwnerId::MAX_LEN]), text);
        }
    }

    #[tokio::test]
    async fn a_task_is_its_number() {
        let id = tokio::spawn(async { OwnerId::current().to_string() })
            .await
            .unwrap();
        assert!(id.parse::<u64>().is_ok(), "{id}");
    }
}

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
///   own.
/// - Work that hops tasks (acquire in one, release in another, and reenter from a third) can pin
///   an id: create one with [`OwnerId::unique`] and use [`Lock::with_owner`](crate::Lock::with_owner)
///   everywhere. A [`LockGuard`](crate::LockGuard) remembers its owner, so moving a guard to
///   another task and unlocking it there needs no pinning.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OwnerId(u64);

/// Ids handed out by [`OwnerId::unique`] and to threads outside tasks start here, far above any
/// tokio task id (a counter starting at 1), so the two kinds never collide.
const LOCAL_ID_BASE: u64 = 1 << 62;
static NEXT_LOCAL_ID: AtomicU64 = AtomicU64::new(LOCAL_ID_BASE);

thread_local! {
    static THREAD_OWNER: u64 = NEXT_LOCAL_ID.fetch_add(1, Ordering::Relaxed);
    /// The last task id seen on this thread and its integer, to skip re-parsing it.
    static LAST_TASK: Cell<Option<(tokio::task::Id, u64)>> = const { Cell::new(None) };
}

impl OwnerId {
    /// The owner id of the calling task, or of the calling thread outside a tokio task.
    pub fn current() -> OwnerId {
        if let Some(id) = tokio::task::try_id() {
            if let Some((last, raw)) = LAST_TASK.get() {
                if last == id {
                    return OwnerId(raw);
                }
            }
            // tokio exposes the task id only through Display, which prints the integer.
            if let Ok(raw) = id.to_string().parse::<u64>() {
                LAST_TASK.set(Some((id, raw)));
                return OwnerId(raw);
            }
        }
        OwnerId(THREAD_OWNER.with(|id| *id))
    }

    /// A fresh id, distinct from every task id and every other id this process hands out.
    pub fn unique() -> OwnerId {
        OwnerId(NEXT_LOCAL_ID.fetch_add(1, Ordering::Relaxed))
    }

    /// An id chosen by the caller, for example to resume ownership recorded elsewhere.
    ///
    /// The caller must keep it distinct from the ids of other owners using the same client; ids
    /// below 2^62 may equal a tokio task id.
    pub const fn from_raw(raw: u64) -> OwnerId {
        OwnerId(raw)
    }

    /// The integer written into the hash field.
    pub const fn as_u64(self) -> u64 {
        self.0
    }
}

impl fmt::Display for OwnerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

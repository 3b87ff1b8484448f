//! The holds this client has: one [`Hold`] per (lock, owner) pair, shared by every guard of that
//! owner on that lock, so that the watchdog renews each pair once and a loss reaches every guard.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use dashmap::DashMap;
use tokio::sync::mpsc::UnboundedSender;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How long a hold lasts without being renewed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lease {
    /// Renewed by the watchdog every `watchdog_timeout / 3` until released.
    Watchdog,
    /// Expires this long after it was taken; never renewed.
    Fixed(Duration),
}

impl Lease {
    /// The lease in whole milliseconds, at least 1 (a sub-millisecond lease must not become a
    /// zero, which Redis rejects).
    pub(crate) fn millis(self, watchdog_timeout: Duration) -> u64 {
        let lease = match self {
            Lease::Watchdog => watchdog_timeout,
            Lease::Fixed(lease) => lease,
        };
        u64::try_from(lease.as_millis()).unwrap_or(u64::MAX).max(1)
    }
}

/// When the hold's Redis TTL was last set, as far as this client knows.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LeaseTimes {
    /// When the last command that set the TTL was sent (acquire, partial release, renewal). The
    /// server set the TTL after this, so expiry estimates from it are on the safe side.
    pub(crate) leased_at: Instant,
    /// For holds without a watchdog guard: when the fixed lease runs out.
    pub(crate) expires_at: Instant,
}

/// One owner's holds on one lock.
#[derive(Debug)]
pub(crate) struct Hold {
    /// Identifies the hold to the watchdog.
    pub(crate) id: u64,
    pub(crate) name: Arc<str>,
    pub(crate) field: Arc<str>,
    /// Live guards. Changed only under the registry's shard lock.
    guards: AtomicUsize,
    /// Live guards in watchdog mode. Changed only under the registry's shard lock.
    watchdog_guards: AtomicUsize,
    times: Mutex<LeaseTimes>,
    /// Cancelled when the hold is known lost; every guard holds a child of it.
    pub(crate) lost: CancellationToken,
}

impl Hold {
    pub(crate) fn guards(&self) -> usize {
        self.guards.load(Ordering::Acquire)
    }

    pub(crate) fn watchdog_guards(&self) -> usize {
        self.watchdog_guards.load(Ordering::Acquire)
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.lost.is_cancelled()
    }

    pub(crate) fn times(&self) -> LeaseTimes {
        *self.times.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set_lease(&self, sent_at: Instant, lease: Lease, watchdog_timeout: Duration) {
        let mut times = self.times.lock().unwrap_or_else(PoisonError::into_inner);
        times.leased_at = sent_at;
        times.expires_at = sent_at
            + match lease {
                Lease::Watchdog => watchdog_timeout,
                Lease::Fixed(lease) => lease,
            };
    }
}

static NEXT_HOLD_ID: AtomicU64 = AtomicU64::new(1);

/// The registry of holds, keyed by (lock name, owner field).
pub(crate) struct Holds {
    map: DashMap<(Arc<str>, Arc<str>), Arc<Hold>>,
    /// Tells the watchdog to look at a hold whose guards changed.
    watchdog: UnboundedSender<Arc<Hold>>,
    watchdog_timeout: Duration,
}

impl Holds {
    pub(crate) fn new(watchdog: UnboundedSender<Arc<Hold>>, watchdog_timeout: Duration) -> Holds {
        Holds {
            map: DashMap::new(),
            watchdog,
            watchdog_timeout,
        }
    }

    /// Records one more guard after an acquire sent at `sent_at` succeeded.
    pub(crate) fn attach(
        &self,
        name: &Arc<str>,
        field: &Arc<str>,
        lease: Lease,
        sent_at: Instant,
    ) -> Arc<Hold> {
        let mut slot = self
            .map
            .entry((name.clone(), field.clone()))
            .or_insert_with(|| new_hold(name, field, sent_at));
        // A lost hold's guards keep their own (cancelled) hold; a new acquire starts afresh.
        if slot.is_lost() {
            *slot = new_hold(name, field, sent_at);
        }
        let hold = slot.clone();
        hold.guards.fetch_add(1, Ordering::AcqRel);
        if lease == Lease::Watchdog {
            hold.watchdog_guards.fetch_add(1, Ordering::AcqRel);
        }
        hold.set_lease(sent_at, lease, self.watchdog_timeout);
        // Sent under the shard lock so the watchdog sees changes to one hold in order.
        let _ = self.watchdog.send(hold.clone());
        drop(slot);
        hold
    }

    /// Records that one guard is gone (released or dropped). The watchdog stops renewing the hold
    /// when its last watchdog guard leaves.
    pub(crate) fn detach(&self, hold: &Arc<Hold>, lease: Lease) {
        let key = (hold.name.clone(), hold.field.clone());
        let forget = |hold: &Hold| {
            if lease == Lease::Watchdog {
                hold.watchdog_guards.fetch_sub(1, Ordering::AcqRel);
            }
            hold.guards.fetch_sub(1, Ordering::AcqRel) == 1
        };
        let mut done = false;
        let removed = self.map.remove_if(&key, |_, current| {
            done = Arc::ptr_eq(current, hold);
            done && forget(hold)
        });
        if !done {
            // Not the registered hold (it was lost and replaced): only its own counts change.
            forget(hold);
        }
        if removed.is_none() && done && hold.guards() > 0 {
            hold.set_lease(Instant::now(), lease, self.watchdog_timeout);
        }
        let _ = self.watchdog.send(hold.clone());
    }

    /// Number of (lock, owner) pairs held.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Marks every hold lost: nothing renews them once the client shuts down.
    pub(crate) fn lose_all(&self) {
        for hold in self.map.iter() {
            hold.lost.cancel();
        }
    }
}

fn new_hold(name: &Arc<str>, field: &Arc<str>, sent_at: Instant) -> Arc<Hold> {
    Arc::new(Hold {
        id: NEXT_HOLD_ID.fetch_add(1, Ordering::Relaxed),
        name: name.clone(),
        field: field.clone(),
        guards: AtomicUsize::new(0),
        watchdog_guards: AtomicUsize::new(0),
        times: Mutex::new(LeaseTimes {
            leased_at: sent_at,
            expires_at: sent_at,
        }),
        lost: CancellationToken::new(),
    })
}

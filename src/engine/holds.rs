//! The holds this client has: one [`Hold`] per (lock, owner) pair, shared by every guard of that
//! owner on that lock, so that the watchdog renews each pair once and a loss reaches every guard.
//!
//! The registry is also what the watchdog scans each period; acquiring and releasing only touch
//! the registry, never the watchdog task.

use std::borrow::Borrow;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{fence, AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, LazyLock, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use crate::engine::Value;
use dashmap::mapref::entry::Entry;
use dashmap::DashMap;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::engine::events::Report;
use crate::engine::expiry::{Expire, Expiries, Watch};
use crate::engine::kind::Kind;
use crate::engine::ledger::Pair;
use crate::engine::{durations, naming, HashState};
use crate::error::Result;
use crate::inspection::{LockEventKind, LossReason};

/// How long a hold lasts without being renewed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lease {
    /// Renewed by the watchdog every `watchdog_lease / 3` until released.
    Watchdog,
    /// Expires this long after it was taken; never renewed.
    Fixed(Duration),
    /// Never expires, and has nothing to renew: a semaphore's permits, which last until given
    /// back.
    Unbounded,
}

impl Lease {
    /// The lease in whole milliseconds; see [`durations::millis`].
    pub(crate) fn millis(self, watchdog_lease: Duration) -> u64 {
        durations::millis(self.duration(watchdog_lease))
    }

    /// Fails with [`Error::InvalidArgument`] for a fixed lease Redis cannot take (under a
    /// millisecond, or over [`MAX_DURATION`](durations::MAX_DURATION)).
    pub(crate) fn check(self, lock: &str) -> Result<()> {
        match self {
            Lease::Watchdog | Lease::Unbounded => Ok(()),
            Lease::Fixed(lease) => durations::check(
                format_args!("the lease of lock {lock:?}"),
                lease,
                durations::MIN_LEASE,
            ),
        }
    }

    fn duration(self, watchdog_lease: Duration) -> Duration {
        match self {
            Lease::Watchdog => watchdog_lease,
            Lease::Fixed(lease) => lease,
            // As far as any estimate of its end goes.
            Lease::Unbounded => durations::MAX_DURATION,
        }
    }
}

/// When the hold's Redis TTL was last set, as far as this client knows, in nanoseconds since
/// [`EPOCH`]: two instants in 16 bytes instead of 32, in every held lock.
#[derive(Clone, Copy, Debug)]
struct LeaseTimes {
    /// When the last command that set the TTL was sent (acquire, partial release, renewal). The
    /// server set the TTL after this, so expiry estimates from it are on the safe side.
    leased_at: u64,
    /// When the TTL set then runs out unless renewed.
    expires_at: u64,
}

/// The origin of [`LeaseTimes`]: long enough before any instant a hold records (a process
/// holds no lock from before it started, let alone 12 days before).
static EPOCH: LazyLock<Instant> = LazyLock::new(|| {
    let now = Instant::now();
    now.checked_sub(Duration::from_secs(1 << 20)).unwrap_or(now)
});

/// `at` in ns since [`EPOCH`]: an instant in 8 bytes instead of 16.
pub(crate) fn since_epoch(at: Instant) -> u64 {
    u64::try_from(at.saturating_duration_since(*EPOCH).as_nanos()).unwrap_or(u64::MAX)
}

/// How long before a fixed lease's estimated end (counted from when its acquire was sent, the
/// earliest Redis can end it) its hold counts as lost: [`TIMER_SLACK`] and a
/// [`DRIFT_SHARE`]th of the lease, Redlock's clock-drift allowance (`lease * 0.01 + 2 ms`). A
/// holder must learn of the end before Redis can give the lock to another, not a tick after:
/// tokio's timers fire up to a tick (1 ms) after the instant they are given, and the wake-up
/// takes more on a busy machine, more than 2 ms alone covers (histories under Valkey and on
/// redis-rs showed the loss of a 150 ms lease seen 1.4 and 4.4 ms after the estimate, after
/// another owner took the lock). A renewed hold has its renew deadline, a third of the lease
/// early, instead.
const TIMER_SLACK: u64 = durations::DRIFT_FIXED.as_nanos() as u64;

/// The share of a fixed lease by which its hold counts as lost early, on top of
/// [`TIMER_SLACK`]: one hundredth.
const DRIFT_SHARE: u64 = durations::DRIFT_SHARE as u64;

/// The instant `nanos` ns after [`EPOCH`].
pub(crate) fn from_epoch(nanos: u64) -> Instant {
    *EPOCH + Duration::from_nanos(nanos)
}

/// One owner's holds on one lock.
pub(crate) struct Hold {
    /// The lock and the owner.
    pub(crate) pair: Pair,
    /// Live guards. Changed only under the registry's shard lock.
    guards: AtomicU32,
    /// Live guards in watchdog mode. Changed only under the registry's shard lock.
    watchdog_guards: AtomicU32,
    /// Set when the hold is known lost.
    lost: AtomicBool,
    /// Set by the watchdog while a visit (a renewal, or a check of a fixed lease) of this hold
    /// is on its way.
    pub(crate) visiting: AtomicBool,
    /// Set while the release of its last guard is on its way. A visit that finds the field gone
    /// then may have met that release on the server, which is no loss: the release's reply
    /// tells which (see `Release::run`).
    pub(crate) releasing: AtomicBool,
    times: Mutex<LeaseTimes>,
    /// How long after the last confirmed renewal was sent the hold counts as lost while
    /// watchdog guards remain, in ns; see `LockClientBuilder::renew_deadline`.
    renew_deadline: u64,
    /// Where its loss is counted and told.
    report: Arc<Report>,
    /// The primitive held, whose key and renewal script the watchdog renews this hold with. Its
    /// guards keep it alive anyway; a copy of the key would cost every held lock its bytes.
    pub(crate) kind: Arc<dyn Kind>,
    /// What few holds need, made when first needed: most holds never have a guard waiting for
    /// their loss, nor a value.
    extras: OnceLock<Box<Extras>>,
}

/// The parts of a hold that only some holds use.
#[derive(Default)]
struct Extras {
    /// Cancelled when the hold is known lost; every guard's token is a child of it.
    lost_token: OnceLock<CancellationToken>,
    /// Signalled whenever the lease changes (acquire, partial release, renewal), which includes
    /// every change of guards that leaves some behind, and at the loss: [`Hold::lost`] and the
    /// token watchers look again then.
    changed: Notify,
    /// What the acquisition that made the hold returned besides the hold (a fencing token, say),
    /// which a re-entry by the same owner gets too.
    value: Mutex<Option<Value>>,
}

impl std::fmt::Debug for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hold")
            .field("pair", &self.pair)
            .field("guards", &self.guards)
            .field("watchdog_guards", &self.watchdog_guards)
            .field("lost", &self.lost)
            .finish_non_exhaustive()
    }
}

impl Hold {
    pub(crate) fn guards(&self) -> usize {
        self.guards.load(Ordering::Acquire) as usize
    }

    pub(crate) fn watchdog_guards(&self) -> usize {
        self.watchdog_guards.load(Ordering::Acquire) as usize
    }

    fn times(&self) -> LeaseTimes {
        *self.times.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn extras(&self) -> &Extras {
        let extras = self.extras.get_or_init(Box::default);
        // Pairs with the fence in `notify_changed`.
        fence(Ordering::SeqCst);
        extras
    }

    /// Wakes whoever waits for a change, if anyone ever did. A waiter makes the extras before it
    /// looks at the state, and a change is made before this looks for them; the two fences order
    /// both so that either the waiter sees the change or this sees the waiter.
    fn notify_changed(&self) {
        fence(Ordering::SeqCst);
        if let Some(extras) = self.extras.get() {
            extras.changed.notify_waiters();
        }
    }

    /// Whether the hold is known lost: reported lost; with watchdog guards, no renewal confirmed
    /// for the renew deadline (reported lost from then on, whatever a late renewal says); or,
    /// with no watchdog guard to renew it, past the end of its fixed lease.
    pub(crate) fn is_lost(&self) -> bool {
        if self.lost.load(Ordering::SeqCst) {
            return true;
        }
        let renewed = self.watchdog_guards() > 0;
        let deadline = self.deadline();
        let now = Instant::now();
        if now < deadline {
            return false;
        }
        if renewed {
            let late_ms = now.duration_since(deadline).as_millis() as u64;
            tracing::warn!(
                lock = %self.pair.name, owner = %self.pair.field,
                client = naming::of_field(&self.pair.field).as_deref(), late_ms,
                "lock lost: no renewal confirmed within the renew deadline (noticed {late_ms} ms \
                 after it)"
            );
            self.mark_lost(LossReason::DeadlinePassed);
        }
        true
    }

    /// Why the hold ended if its field was found gone at `now`: past its deadline, as
    /// [`is_lost`](Self::is_lost) counts it (its renew deadline passed, or its fixed lease ran
    /// out); before it, deleted.
    pub(crate) fn gone_at(&self, now: Instant) -> LossReason {
        if now < self.deadline() {
            LossReason::Deleted
        } else if self.watchdog_guards() > 0 {
            LossReason::DeadlinePassed
        } else {
            LossReason::Expired
        }
    }

    /// When the hold counts as lost unless something changes: the renew deadline while watchdog
    /// guards remain, else the end of the fixed lease, [`TIMER_SLACK`] and a [`DRIFT_SHARE`]th
    /// of the lease early.
    pub(crate) fn deadline(&self) -> Instant {
        let times = self.times();
        if self.watchdog_guards() > 0 {
            from_epoch(times.leased_at.saturating_add(self.renew_deadline))
        } else {
            let lease = times.expires_at.saturating_sub(times.leased_at);
            from_epoch(
                times
                    .expires_at
                    .saturating_sub(TIMER_SLACK.saturating_add(lease / DRIFT_SHARE))
                    .max(times.leased_at),
            )
        }
    }

    /// Marks the hold lost; every guard's `lost()` completes. The first time counts a loss,
    /// before any guard can learn of it.
    pub(crate) fn mark_lost(&self, why: LossReason) {
        if !self.lost.swap(true, Ordering::SeqCst) {
            let profile = self.kind.profile();
            self.report.metrics.lost(profile.label(), &self.pair.name);
            let what = (profile.class().events.lost)(why);
            let (name, owner) = (&self.pair.name, Some(&self.pair.field));
            let events = &self.report.events;
            if why == LossReason::DeadlinePassed {
                // The renewal on its way, or the next one, did not confirm in time.
                events.emit(profile.label(), name, owner, LockEventKind::RenewalFailed);
            }
            events.emit(profile.label(), name, owner, what);
        }
        self.tell_lost();
    }

    /// Marks the hold lost, as [`mark_lost`](Self::mark_lost), without counting a loss: the
    /// client shuts down.
    fn end(&self) {
        self.lost.store(true, Ordering::SeqCst);
        self.tell_lost();
    }

    /// Sends `what` of this hold to the client's event stream, if anyone listens.
    pub(crate) fn tell(&self, what: LockEventKind) {
        let (name, owner) = (&self.pair.name, Some(&self.pair.field));
        let label = self.kind.profile().label();
        self.report.events.emit(label, name, owner, what);
    }

    /// Tells the guards of a hold just marked lost.
    fn tell_lost(&self) {
        // The flag is set before the token is looked at, as `lost_token` makes the token before
        // it looks at the flag, each with a fence between: whichever runs second cancels it.
        fence(Ordering::SeqCst);
        if let Some(token) = self.extras.get().and_then(|extras| extras.lost_token.get()) {
            token.cancel();
        }
        self.notify_changed();
    }

    /// Completes when the hold is known lost: marked lost, or past its deadline, which
    /// `expiries` watches for it (a watch written down again whenever the deadline moves).
    pub(crate) async fn lost(self: &Arc<Self>, expiries: &Expiries<Hold>) {
        let extras = self.extras();
        let mut watch = None;
        loop {
            // Created before the state is read, so that no change between the two is missed.
            let changed = extras.changed.notified();
            if self.is_lost() {
                return;
            }
            let deadline = self.deadline();
            if !watch
                .as_ref()
                .is_some_and(|watch: &Watch<'_, Hold>| watch.is_for(deadline))
            {
                // The old one struck out first: a waiter has one entry in the map.
                drop(watch.take());
                watch = Some(expiries.watch(self, deadline));
            }
            changed.await;
        }
    }

    /// A token cancelled when the hold is known lost.
    pub(crate) fn lost_token(self: &Arc<Self>) -> CancellationToken {
        let lost = self.extras().lost_token.get_or_init(CancellationToken::new);
        fence(Ordering::SeqCst);
        if self.lost.load(Ordering::SeqCst) {
            lost.cancel();
        }
        let token = lost.child_token();
        if self.watchdog_guards() == 0 {
            // A fixed lease ends by time alone, which nothing else would signal (the watchdog
            // marks a renewed hold lost at its renew deadline itself). The watcher ends with the
            // token, the loss, or the hold's last guard.
            let hold = self.clone();
            let child = token.clone();
            tokio::spawn(async move {
                let extras = hold.extras();
                loop {
                    let changed = extras.changed.notified();
                    if hold.is_lost() {
                        child.cancel();
                        return;
                    }
                    if hold.guards() == 0 {
                        return;
                    }
                    tokio::select! {
                        _ = child.cancelled() => return,
                        _ = tokio::time::sleep_until(hold.deadline()) => {}
                        _ = changed => {}
                    }
                }
            });
        }
        token
    }

    /// Records that a command sent at `sent_at` set the TTL to `lease`.
    pub(crate) fn leased(&self, sent_at: Instant, lease: Duration) {
        let sent_at = since_epoch(sent_at);
        let mut times = self.times.lock().unwrap_or_else(PoisonError::into_inner);
        if sent_at >= times.leased_at {
            times.leased_at = sent_at;
            times.expires_at = sent_at.saturating_add(since_epoch_len(lease));
        }
        drop(times);
        self.notify_changed();
    }
}

impl Expire for Hold {
    /// Past its deadline, for the expiry task: a fixed lease that ran out is marked lost (a
    /// renewed hold past its renew deadline is marked by `is_lost`); a deadline that moved
    /// meanwhile wakes the waiters, who watch for the new one.
    fn expire(&self) {
        if self.guards() > 0 && self.is_lost() {
            self.mark_lost(LossReason::Expired);
        }
        self.notify_changed();
    }
}

/// A duration in the nanoseconds [`LeaseTimes`] counts.
fn since_epoch_len(length: Duration) -> u64 {
    u64::try_from(length.as_nanos()).unwrap_or(u64::MAX)
}

/// A hold as the registry keeps it: looked up by its own (lock, owner) pair, so the registry
/// keeps a pointer per hold instead of a copy of the pair beside it.
#[derive(Clone)]
struct Registered(Arc<Hold>);

impl Borrow<Pair> for Registered {
    fn borrow(&self) -> &Pair {
        &self.0.pair
    }
}

impl Hash for Registered {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // As the pair hashes: the map looks holds up by pair.
        self.0.pair.hash(state);
    }
}

impl PartialEq for Registered {
    fn eq(&self, other: &Registered) -> bool {
        self.0.pair == other.0.pair
    }
}

impl Eq for Registered {}

/// The registry of holds, keyed by (name, owner field).
pub(crate) struct Holds {
    map: DashMap<Registered, (), HashState>,
    /// The deadlines of the holds a guard waits to lose, and their timer's task.
    pub(crate) expiries: Arc<Expiries<Hold>>,
    watchdog_lease: Duration,
    renew_deadline: Duration,
    report: Arc<Report>,
}

impl Holds {
    pub(crate) fn new(
        watchdog_lease: Duration,
        renew_deadline: Duration,
        report: Arc<Report>,
    ) -> Holds {
        // Before any hold records an instant.
        LazyLock::force(&EPOCH);
        Holds {
            map: DashMap::with_hasher(HashState::default()),
            expiries: Arc::default(),
            watchdog_lease,
            renew_deadline,
            report,
        }
    }

    /// Records one more guard after an acquire sent at `sent_at` succeeded, with what the acquire
    /// script returned besides the hold: the hold and that value, or for a re-entry that
    /// returned none, the value of the hold's first acquisition.
    pub(crate) fn attach(
        &self,
        pair: &Pair,
        lease: Lease,
        sent_at: Instant,
        kind: &Arc<dyn Kind>,
        value: Option<Value>,
    ) -> (Arc<Hold>, Option<Value>) {
        let lease_len = lease.duration(self.watchdog_lease);
        // A first hold (or one after a loss: a lost hold's guards keep their own hold, a new
        // acquire starts afresh) registers a new one; a re-entry finds its hold, and drops the
        // one made for the look-up. Made first, so that a first hold, the common case, costs
        // one look-up.
        let fresh = Registered(self.new_hold(pair, sent_at, lease_len, kind));
        let hold = match self.map.entry(fresh.clone()) {
            Entry::Occupied(entry) if !entry.key().0.is_lost() => entry.key().0.clone(),
            Entry::Occupied(entry) => {
                entry.replace_entry(());
                fresh.0
            }
            Entry::Vacant(entry) => {
                entry.insert(());
                self.report
                    .metrics
                    .held(kind.profile().label(), &pair.name, 1.0);
                fresh.0
            }
        };
        let value = match value {
            Some(value) => {
                *hold
                    .extras()
                    .value
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = Some(value.clone());
                Some(value)
            }
            None => hold.extras.get().and_then(|extras| {
                extras
                    .value
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clone()
            }),
        };
        hold.guards.fetch_add(1, Ordering::AcqRel);
        if lease == Lease::Watchdog {
            hold.watchdog_guards.fetch_add(1, Ordering::AcqRel);
        }
        hold.leased(sent_at, lease_len);
        (hold, value)
    }

    /// Records that one guard is gone (released or dropped), with when its release was sent, if
    /// one was (it set the remaining holds' TTL again). The watchdog no longer renews a hold
    /// without watchdog guards.
    pub(crate) fn detach(&self, hold: &Arc<Hold>, lease: Lease, released_at: Option<Instant>) {
        // One guard fewer; whether it was the last.
        let one_less = |hold: &Hold| {
            if lease == Lease::Watchdog {
                hold.watchdog_guards.fetch_sub(1, Ordering::AcqRel);
            }
            hold.guards.fetch_sub(1, Ordering::AcqRel) == 1
        };
        let mut registered = false;
        let removed = self.map.remove_if(&hold.pair, |current, _| {
            registered = Arc::ptr_eq(&current.0, hold);
            registered && one_less(hold)
        });
        if removed.is_some() {
            let label = hold.kind.profile().label();
            self.report.metrics.held(label, &hold.pair.name, -1.0);
            if !hold.lost.load(Ordering::Relaxed) {
                let (name, owner) = (&hold.pair.name, Some(&hold.pair.field));
                let released = LockEventKind::Released;
                self.report.events.emit(label, name, owner, released);
            }
        }
        if !registered {
            // Not the registered hold (it was lost and replaced): only its own counts change.
            one_less(hold);
        }
        if hold.guards() == 0 {
            // Token watchers end with the last guard.
            hold.notify_changed();
        }
        if let Some(released_at) = released_at.filter(|_| removed.is_none() && registered) {
            if hold.guards() > 0 {
                hold.leased(released_at, lease.duration(self.watchdog_lease));
            }
        }
    }

    /// How many holds the pair's owner has on its lock by this client's count: its live guards,
    /// none once the hold is known lost.
    pub(crate) fn count(&self, pair: &Pair) -> usize {
        self.map
            .get(pair)
            .filter(|entry| !entry.key().0.is_lost())
            .map_or(0, |entry| entry.key().0.guards())
    }

    /// Marks the pair's hold lost: Redis found none of the holds counted.
    pub(crate) fn lose(&self, pair: &Pair) {
        if let Some(entry) = self.map.get(pair) {
            tracing::warn!(
                lock = %pair.name, owner = %pair.field,
                client = naming::of_field(&pair.field).as_deref(),
                "lock lost: its owner's field was gone from Redis"
            );
            entry.key().0.mark_lost(LossReason::Deleted);
        }
    }

    /// Every hold, for the watchdog's scan.
    pub(crate) fn each(&self, mut visit: impl FnMut(&Arc<Hold>)) {
        for entry in self.map.iter() {
            visit(&entry.key().0);
        }
    }

    /// Number of (lock, owner) pairs held.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    fn new_hold(
        &self,
        pair: &Pair,
        sent_at: Instant,
        lease: Duration,
        kind: &Arc<dyn Kind>,
    ) -> Arc<Hold> {
        let leased_at = since_epoch(sent_at);
        Arc::new(Hold {
            pair: pair.clone(),
            guards: AtomicU32::new(0),
            watchdog_guards: AtomicU32::new(0),
            lost: AtomicBool::new(false),
            visiting: AtomicBool::new(false),
            releasing: AtomicBool::new(false),
            times: Mutex::new(LeaseTimes {
                leased_at,
                expires_at: leased_at.saturating_add(since_epoch_len(lease)),
            }),
            renew_deadline: since_epoch_len(self.renew_deadline),
            report: self.report.clone(),
            kind: kind.clone(),
            extras: OnceLock::new(),
        })
    }

    /// Whether `hold` is the one registered for its (lock, owner): not lost and replaced.
    pub(crate) fn is_registered(&self, hold: &Arc<Hold>) -> bool {
        self.map
            .get(&hold.pair)
            .is_some_and(|registered| Arc::ptr_eq(&registered.key().0, hold))
    }

    /// Marks every hold lost: nothing renews them once the client shuts down.
    pub(crate) fn lose_all(&self) {
        self.each(|hold| hold.end());
    }
}

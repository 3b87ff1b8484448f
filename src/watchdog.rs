//! The watchdog: one task per client that keeps watchdog-mode holds alive and notices lost ones.
//!
//! Its timer wheel is a [`DelayQueue`] holding one renewal *tick* for all watchdog holds, and
//! one timer per fixed-lease hold (only to report it lost when the lease runs out). When the
//! tick fires, every watchdog hold due within the next period is renewed, in script calls of up
//! to 100 keys, one cluster slot per call. Pulling holds forward costs some of them one early
//! renewal and puts every hold on one schedule, so a period costs about `holds / 100` calls per
//! slot, and a renewal touches no per-hold timer.
//!
//! The state of a hold lives in [`Hold`]; the registry sends the hold here whenever its guards
//! change and the watchdog reconciles, so the messages carry no state that could arrive stale.

use std::collections::{BTreeMap, HashMap};
use std::future::poll_fn;
use std::sync::Arc;
use std::time::Duration;

use fred::clients::Client;
use fred::interfaces::ClientLike;
use fred::types::{Key, Value};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::time::{delay_queue, DelayQueue};

use crate::holds::{Hold, Lease};
use crate::scripts::LOCK_RENEW;

/// Keys per renewal script call, as Redisson does.
const BATCH: usize = 100;

enum Mode {
    /// Renewed every period while a watchdog guard is alive.
    Renew,
    /// Only watched: reported lost at the end of its fixed lease.
    Expire,
}

struct Tracked {
    hold: Arc<Hold>,
    /// The hold's key and field as sent to Redis, built once: renewals clone reference counts.
    key: Key,
    field: Value,
    mode: Mode,
    /// When the TTL was last set by a command this client sent (acquire or renewal).
    leased_at: Instant,
    /// The lease-end timer of a fixed-lease hold; watchdog holds share the renewal tick.
    timer: Option<delay_queue::Key>,
    in_flight: bool,
    /// When the hold next needs renewing (watchdog) or its lease ends (fixed).
    due: Instant,
}

/// The [`DelayQueue`] entry of the renewal tick; hold ids start at 1.
const TICK: u64 = 0;

type BatchResult = (Vec<u64>, Instant, Result<Vec<i64>, fred::error::Error>);

pub(crate) struct Watchdog {
    redis: Client,
    timeout: Duration,
    period: Duration,
    retry: Duration,
    lease_ms: u64,
    queue: DelayQueue<u64>,
    /// The renewal tick's entry and when it fires.
    tick: Option<(delay_queue::Key, Instant)>,
    tracked: HashMap<u64, Tracked>,
    batches: JoinSet<BatchResult>,
}

impl Watchdog {
    pub(crate) fn new(redis: Client, timeout: Duration) -> Watchdog {
        let period = timeout / 3;
        Watchdog {
            redis,
            timeout,
            period,
            // Retries after a failed renewal: often enough to get through before the lease ends,
            // rarely enough not to hammer a recovering server.
            retry: (period / 4).clamp(Duration::from_millis(20), Duration::from_secs(1)),
            lease_ms: Lease::Watchdog.millis(timeout),
            queue: DelayQueue::new(),
            tick: None,
            tracked: HashMap::new(),
            batches: JoinSet::new(),
        }
    }

    /// Runs until `shutdown` is cancelled.
    pub(crate) async fn run(
        mut self,
        mut changes: UnboundedReceiver<Arc<Hold>>,
        shutdown: CancellationToken,
    ) {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                Some(hold) = changes.recv() => self.reconcile(hold),
                Some(expired) = poll_fn(|cx| self.queue.poll_expired(cx)), if !self.queue.is_empty() => {
                    match expired.into_inner() {
                        TICK => {
                            self.tick = None;
                            self.renew_due(Instant::now());
                        }
                        id => self.on_lease_end(id),
                    }
                }
                Some(done) = self.batches.join_next(), if !self.batches.is_empty() => {
                    if let Ok(result) = done {
                        self.on_renewed(result);
                    }
                }
            }
        }
        self.batches.abort_all();
        for tracked in self.tracked.values() {
            tracked.hold.lost.cancel();
        }
    }

    /// Brings the tracking of `hold` in line with its guards.
    fn reconcile(&mut self, hold: Arc<Hold>) {
        let id = hold.id;
        if hold.guards() == 0 || hold.is_lost() {
            self.untrack(id);
            return;
        }
        let times = hold.times();
        let mode = if hold.watchdog_guards() > 0 {
            Mode::Renew
        } else {
            Mode::Expire
        };
        let tracked = self.tracked.entry(id).or_insert_with(|| Tracked {
            key: Key::from(&*hold.name),
            field: Value::from(&*hold.field),
            hold,
            mode: Mode::Renew,
            leased_at: times.leased_at,
            timer: None,
            in_flight: false,
            due: times.leased_at,
        });
        tracked.leased_at = tracked.leased_at.max(times.leased_at);
        tracked.mode = mode;
        let in_flight = tracked.in_flight;
        match tracked.mode {
            Mode::Renew => {
                tracked.due = tracked.leased_at + self.period;
                let due = tracked.due;
                if let Some(timer) = tracked.timer.take() {
                    self.queue.remove(&timer);
                }
                // An in-flight renewal reschedules the hold when it returns.
                if !in_flight {
                    self.schedule_tick(due);
                }
            }
            Mode::Expire => {
                tracked.due = times.expires_at;
                match &tracked.timer {
                    Some(timer) => self.queue.reset_at(timer, tracked.due),
                    None => tracked.timer = Some(self.queue.insert_at(id, tracked.due)),
                }
            }
        }
    }

    /// Makes the renewal tick fire no later than `due`.
    fn schedule_tick(&mut self, due: Instant) {
        match &self.tick {
            Some((_, at)) if *at <= due => {}
            Some((key, _)) => {
                self.queue.reset_at(key, due);
                self.tick = Some((*key, due));
            }
            None => self.tick = Some((self.queue.insert_at(TICK, due), due)),
        }
    }

    fn untrack(&mut self, id: u64) {
        if let Some(tracked) = self.tracked.remove(&id) {
            if let Some(timer) = tracked.timer {
                self.queue.remove(&timer);
            }
        }
    }

    /// A fixed-lease hold's timer fired: report it lost if the lease really ended.
    fn on_lease_end(&mut self, id: u64) {
        let Some(tracked) = self.tracked.get_mut(&id) else {
            return;
        };
        tracked.timer = None;
        let hold = tracked.hold.clone();
        if hold.watchdog_guards() == 0 && Instant::now() >= hold.times().expires_at {
            tracing::debug!(lock = %hold.name, owner = %hold.field, "lease ran out");
            hold.lost.cancel();
            self.tracked.remove(&id);
        } else {
            self.reconcile(hold);
        }
    }

    /// Renews every hold due within the next period, grouped by cluster slot, in batches. Pulling
    /// them all forward costs some holds one early renewal, and puts every hold on one schedule:
    /// afterwards one firing per period renews them all in `holds / 100` calls per slot.
    fn renew_due(&mut self, now: Instant) {
        let horizon = now + self.period;
        let clustered = self.redis.is_clustered();
        let mut groups: BTreeMap<u16, Vec<u64>> = BTreeMap::new();
        let mut next: Option<Instant> = None;
        for (id, tracked) in self.tracked.iter_mut() {
            if !matches!(tracked.mode, Mode::Renew) || tracked.in_flight {
                continue;
            }
            if tracked.due > horizon {
                next = Some(next.map_or(tracked.due, |next| next.min(tracked.due)));
                continue;
            }
            tracked.in_flight = true;
            let slot = if clustered {
                fred::util::redis_keyslot(tracked.hold.name.as_bytes())
            } else {
                0
            };
            groups.entry(slot).or_default().push(*id);
        }
        for ids in groups.into_values() {
            for chunk in ids.chunks(BATCH) {
                self.send_batch(chunk.to_vec());
            }
        }
        if let Some(next) = next {
            self.schedule_tick(next);
        }
    }

    fn send_batch(&mut self, ids: Vec<u64>) {
        let mut keys = Vec::with_capacity(ids.len());
        let mut args = Vec::with_capacity(ids.len() + 1);
        args.push(Value::from(self.lease_ms as i64));
        let mut lease_end: Option<Instant> = None;
        for id in &ids {
            if let Some(tracked) = self.tracked.get(id) {
                keys.push(tracked.key.clone());
                args.push(tracked.field.clone());
                let end = tracked.leased_at + self.timeout;
                lease_end = Some(lease_end.map_or(end, |earliest| earliest.min(end)));
            }
        }
        let redis = self.redis.clone();
        // A renewal still unanswered when the earliest lease has ended is given up then, so that
        // in an outage the loss is reported when it happens, not when fred's timeout fires. The
        // lease end is a lower bound, counted from when a command was sent; a command that sat in
        // a reconnect queue can leave it already past while the lock is fine, so every renewal
        // gets at least a period to prove the field is still there.
        let limit = lease_end
            .unwrap_or_else(Instant::now)
            .max(Instant::now() + self.period);
        self.batches.spawn(async move {
            let sent_at = Instant::now();
            let renewal = LOCK_RENEW.run::<Vec<i64>>(&redis, keys, args);
            let result = match tokio::time::timeout_at(limit, renewal).await {
                Ok(result) => result,
                Err(_) => Err(fred::error::Error::new(
                    fred::error::ErrorKind::Timeout,
                    "no reply before the lease ran out",
                )),
            };
            (ids, sent_at, result)
        });
    }

    fn on_renewed(&mut self, (ids, sent_at, result): BatchResult) {
        let now = Instant::now();
        match &result {
            Ok(_) => tracing::trace!(locks = ids.len(), "renewed"),
            Err(error) => tracing::warn!(locks = ids.len(), %error, "lock renewal failed"),
        }
        for (i, id) in ids.into_iter().enumerate() {
            let Some(tracked) = self.tracked.get_mut(&id) else {
                continue; // released while the renewal was in flight
            };
            tracked.in_flight = false;
            let hold = tracked.hold.clone();
            if hold.guards() == 0 {
                self.untrack(id);
                continue;
            }
            let renewed = match &result {
                Ok(replies) => replies.get(i).copied() == Some(1),
                Err(_) => {
                    let lease_end = tracked.leased_at + self.timeout;
                    if now < lease_end {
                        // Try again before the lease can run out; the last try is at its end.
                        tracked.due = (now + self.retry).min(lease_end);
                        let due = tracked.due;
                        self.schedule_tick(due);
                        continue;
                    }
                    tracing::warn!(
                        lock = %hold.name, owner = %hold.field,
                        "lock lost: could not renew it before its lease ran out"
                    );
                    false
                }
            };
            if renewed {
                tracked.leased_at = tracked.leased_at.max(sent_at);
                // A hold that switched to a fixed lease meanwhile is back under its own timer.
                if matches!(tracked.mode, Mode::Renew) {
                    tracked.due = tracked.leased_at + self.period;
                    let due = tracked.due;
                    self.schedule_tick(due);
                } else {
                    self.reconcile(hold);
                }
            } else {
                if result.is_ok() {
                    tracing::warn!(
                        lock = %hold.name, owner = %hold.field,
                        "lock lost: its owner's field is gone from Redis"
                    );
                }
                hold.lost.cancel();
                self.untrack(id);
            }
        }
    }
}

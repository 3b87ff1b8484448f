//! The watchdog: one task per client that keeps watchdog-mode holds alive and notices lost ones.
//!
//! It keeps one timer per hold on a [`DelayQueue`]. When one comes due it renews, in the same
//! script calls, every other hold due within the next half period, so holds taken at different
//! moments fall into step and a period costs about `holds / 100` calls per cluster slot. Holds
//! with a fixed lease are tracked too, only to report them lost when the lease runs out.
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
    mode: Mode,
    /// When the TTL was last set by a command this client sent (acquire or renewal).
    leased_at: Instant,
    /// The timer, absent while a renewal of this hold is in flight.
    timer: Option<delay_queue::Key>,
    in_flight: bool,
    due: Instant,
}

type BatchResult = (Vec<u64>, Instant, Result<Vec<i64>, fred::error::Error>);

pub(crate) struct Watchdog {
    redis: Client,
    timeout: Duration,
    period: Duration,
    retry: Duration,
    lease_ms: u64,
    queue: DelayQueue<u64>,
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
                    self.on_due(expired.into_inner());
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
        let renew = hold.watchdog_guards() > 0;
        let due_after = |leased_at: Instant| {
            if renew {
                leased_at + self.period
            } else {
                times.expires_at
            }
        };
        match self.tracked.get_mut(&id) {
            Some(tracked) => {
                tracked.mode = if renew { Mode::Renew } else { Mode::Expire };
                tracked.leased_at = tracked.leased_at.max(times.leased_at);
                tracked.due = due_after(tracked.leased_at);
                // An in-flight renewal reschedules the hold when it returns.
                if !tracked.in_flight {
                    match &tracked.timer {
                        Some(timer) => self.queue.reset_at(timer, tracked.due),
                        None => tracked.timer = Some(self.queue.insert_at(id, tracked.due)),
                    }
                }
            }
            None => {
                let due = due_after(times.leased_at);
                let timer = Some(self.queue.insert_at(id, due));
                self.tracked.insert(
                    id,
                    Tracked {
                        hold,
                        mode: if renew { Mode::Renew } else { Mode::Expire },
                        leased_at: times.leased_at,
                        timer,
                        in_flight: false,
                        due,
                    },
                );
            }
        }
    }

    fn untrack(&mut self, id: u64) {
        if let Some(tracked) = self.tracked.remove(&id) {
            if let Some(timer) = tracked.timer {
                self.queue.remove(&timer);
            }
        }
    }

    fn on_due(&mut self, id: u64) {
        let now = Instant::now();
        let Some(tracked) = self.tracked.get_mut(&id) else {
            return;
        };
        tracked.timer = None;
        match tracked.mode {
            Mode::Expire => {
                let hold = tracked.hold.clone();
                if hold.watchdog_guards() == 0 && now >= hold.times().expires_at {
                    tracing::debug!(lock = %hold.name, owner = %hold.field, "lease ran out");
                    hold.lost.cancel();
                    self.tracked.remove(&id);
                } else {
                    self.reconcile(hold);
                }
            }
            Mode::Renew => self.renew_due(now),
        }
    }

    /// Renews every hold due within half a period, grouped by cluster slot, in batches.
    fn renew_due(&mut self, now: Instant) {
        let horizon = now + self.period / 2;
        let clustered = self.redis.is_clustered();
        let mut groups: BTreeMap<u16, Vec<u64>> = BTreeMap::new();
        for (id, tracked) in self.tracked.iter_mut() {
            if !matches!(tracked.mode, Mode::Renew) || tracked.in_flight || tracked.due > horizon {
                continue;
            }
            if let Some(timer) = tracked.timer.take() {
                self.queue.remove(&timer);
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
    }

    fn send_batch(&mut self, ids: Vec<u64>) {
        let mut keys = Vec::with_capacity(ids.len());
        let mut args = Vec::with_capacity(ids.len() + 1);
        args.push(Value::from(self.lease_ms as i64));
        let mut lease_end: Option<Instant> = None;
        for id in &ids {
            if let Some(tracked) = self.tracked.get(id) {
                keys.push(Key::from(&*tracked.hold.name));
                args.push(Value::from(&*tracked.hold.field));
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
                        tracked.timer = Some(self.queue.insert_at(id, tracked.due));
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
                if matches!(tracked.mode, Mode::Renew) {
                    tracked.due = tracked.leased_at + self.period;
                } else {
                    tracked.due = hold.times().expires_at;
                }
                tracked.timer = Some(self.queue.insert_at(id, tracked.due));
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

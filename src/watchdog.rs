//! The watchdog: one task per client that keeps watchdog-mode holds alive and notices lost ones.
//!
//! Once a period (`watchdog_timeout / 3`) it scans the client's registry of holds and renews
//! every hold with a watchdog guard, in script calls of up to 100 keys, one cluster slot per
//! call: a period costs `holds / 100` calls per slot. A hold taken between two scans is renewed
//! at the next one, at most a period after it was taken, while its lease lasts three. Acquiring
//! and releasing therefore never involve this task.
//!
//! Its timer wheel, a [`DelayQueue`], holds the period's tick and, after a failed renewal, a
//! retry tick. A failed renewal is retried until the hold's lease would have run out; then, or
//! when a renewal finds the owner's field gone, the hold is marked lost.

use std::collections::{BTreeMap, HashMap};
use std::future::poll_fn;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use fred::clients::Client;
use fred::interfaces::ClientLike;
use fred::types::{Key, Value};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::time::DelayQueue;

use crate::client::Core;
use crate::holds::{Hold, Lease};
use crate::scripts::LOCK_RENEW;

/// Keys per renewal script call, as Redisson does.
const BATCH: usize = 100;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Tick {
    /// The period's scan of every hold.
    Period,
    /// Another try for holds whose renewal failed.
    Retry,
}

type BatchResult = (
    Vec<Arc<Hold>>,
    Instant,
    Result<Vec<i64>, fred::error::Error>,
);

pub(crate) struct Watchdog {
    core: Arc<Core>,
    redis: Client,
    timeout: Duration,
    period: Duration,
    retry: Duration,
    lease_ms: u64,
    queue: DelayQueue<Tick>,
    retry_scheduled: bool,
    /// Holds whose last renewal failed, by address, until renewed or lost.
    failing: HashMap<usize, Arc<Hold>>,
    batches: JoinSet<BatchResult>,
}

impl Watchdog {
    pub(crate) fn new(core: Arc<Core>) -> Watchdog {
        let timeout = core.watchdog_timeout;
        let period = timeout / 3;
        Watchdog {
            redis: core.redis.clone(),
            core,
            timeout,
            period,
            // Retries after a failed renewal: often enough to get through before the lease ends,
            // rarely enough not to hammer a recovering server.
            retry: (period / 4).clamp(Duration::from_millis(20), Duration::from_secs(1)),
            lease_ms: Lease::Watchdog.millis(timeout),
            queue: DelayQueue::new(),
            retry_scheduled: false,
            failing: HashMap::new(),
            batches: JoinSet::new(),
        }
    }

    /// Runs until `shutdown` is cancelled.
    pub(crate) async fn run(mut self, shutdown: CancellationToken) {
        self.queue.insert(Tick::Period, self.period);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                Some(expired) = poll_fn(|cx| self.queue.poll_expired(cx)) => {
                    match expired.into_inner() {
                        Tick::Period => {
                            self.queue.insert(Tick::Period, self.period);
                            self.renew_all();
                        }
                        Tick::Retry => {
                            self.retry_scheduled = false;
                            let failing: Vec<Arc<Hold>> = self.failing.values().cloned().collect();
                            self.renew(failing);
                        }
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
    }

    fn renew_all(&mut self) {
        let mut due = Vec::new();
        self.core.holds.each(|hold| due.push(hold.clone()));
        self.renew(due);
    }

    /// Renews the holds that still have a watchdog guard and no renewal on its way, grouped by
    /// cluster slot, in batches.
    fn renew(&mut self, holds: Vec<Arc<Hold>>) {
        let clustered = self.redis.is_clustered();
        let mut groups: BTreeMap<u16, Vec<Arc<Hold>>> = BTreeMap::new();
        for hold in holds {
            if hold.watchdog_guards() == 0 || hold.is_lost() {
                self.failing.remove(&address(&hold));
                continue;
            }
            if hold.renewing.swap(true, Ordering::AcqRel) {
                continue;
            }
            let slot = if clustered {
                fred::util::redis_keyslot(hold.name.as_bytes())
            } else {
                0
            };
            groups.entry(slot).or_default().push(hold);
        }
        for holds in groups.into_values() {
            let mut holds = holds.into_iter().peekable();
            while holds.peek().is_some() {
                self.send_batch(holds.by_ref().take(BATCH).collect());
            }
        }
    }

    fn send_batch(&mut self, holds: Vec<Arc<Hold>>) {
        let mut keys = Vec::with_capacity(holds.len());
        let mut args = Vec::with_capacity(holds.len() + 1);
        args.push(Value::from(self.lease_ms as i64));
        let mut lease_end: Option<Instant> = None;
        for hold in &holds {
            let (key, field) = hold
                .renewal_args
                .get_or_init(|| (Key::from(&*hold.name), Value::from(&*hold.field)));
            keys.push(key.clone());
            args.push(field.clone());
            let end = hold.times().leased_at + self.timeout;
            lease_end = Some(lease_end.map_or(end, |earliest| earliest.min(end)));
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
            let renewal = LOCK_RENEW.run::<Vec<i64>>(&redis, || (keys.clone(), args.clone()));
            let result = match tokio::time::timeout_at(limit, renewal).await {
                Ok(result) => result,
                Err(_) => Err(fred::error::Error::new(
                    fred::error::ErrorKind::Timeout,
                    "no reply before the lease ran out",
                )),
            };
            (holds, sent_at, result)
        });
    }

    fn on_renewed(&mut self, (holds, sent_at, result): BatchResult) {
        let now = Instant::now();
        match &result {
            Ok(_) => tracing::trace!(locks = holds.len(), "renewed"),
            Err(error) => tracing::warn!(locks = holds.len(), %error, "lock renewal failed"),
        }
        for (i, hold) in holds.into_iter().enumerate() {
            hold.renewing.store(false, Ordering::Release);
            if hold.guards() == 0 {
                self.failing.remove(&address(&hold));
                continue; // released while the renewal was on its way
            }
            match &result {
                Ok(replies) if replies.get(i).copied() == Some(1) => {
                    hold.leased(sent_at, self.timeout);
                    self.failing.remove(&address(&hold));
                }
                Ok(_) => {
                    tracing::warn!(
                        lock = %hold.name, owner = %hold.field,
                        "lock lost: its owner's field is gone from Redis"
                    );
                    self.lose(&hold);
                }
                Err(_) if now < hold.times().leased_at + self.timeout => {
                    self.failing.insert(address(&hold), hold);
                }
                Err(_) => {
                    tracing::warn!(
                        lock = %hold.name, owner = %hold.field,
                        "lock lost: could not renew it before its lease ran out"
                    );
                    self.lose(&hold);
                }
            }
        }
        if !self.failing.is_empty() && !self.retry_scheduled {
            // Try again soon, and once more right at the earliest lease end.
            let earliest_end = self
                .failing
                .values()
                .map(|hold| hold.times().leased_at + self.timeout)
                .min()
                .unwrap_or(now);
            self.queue
                .insert_at(Tick::Retry, (now + self.retry).min(earliest_end.max(now)));
            self.retry_scheduled = true;
        }
    }

    fn lose(&mut self, hold: &Arc<Hold>) {
        self.failing.remove(&address(hold));
        hold.mark_lost();
    }
}

fn address(hold: &Arc<Hold>) -> usize {
    Arc::as_ptr(hold) as usize
}

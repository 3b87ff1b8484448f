//! The watchdog: one task per client that keeps watchdog-mode holds alive and notices lost ones.
//!
//! Once a period (`watchdog_lease / 3`), and at once after fred reconnects, it scans the
//! client's registry of holds and renews every hold with a watchdog guard, in script calls of up
//! to 100 keys, one cluster hash slot (and one primitive's renewal script) per call: a period
//! costs `holds / 100` calls per hash slot. Holds
//! with fixed leases only are checked the same way without being extended, so their guards learn
//! of a loss (a deleted key, a restarted server) within a period too, not at the end of their
//! lease. A hold taken between two scans is renewed at the next one, at most a period after it
//! was taken, while its lease lasts three. Acquiring and releasing therefore never involve this
//! task. A force unlock that names holds of this client (on its own channel, see `pubsub`)
//! has those looked at at once.
//!
//! Its timer wheel, a [`DelayQueue`], holds the period's tick and, after a failed renewal, a
//! retry tick. A failed renewal is retried until the hold's renew deadline (`Hold::deadline`,
//! before its lease could run out); then, or when a renewal finds the owner's field gone, the
//! hold is marked lost.

use std::collections::{BTreeMap, HashMap};
use std::future::poll_fn;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::engine::Value;
use tokio::sync::broadcast::error::RecvError;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::time::DelayQueue;

use crate::engine::holds::{Hold, Lease};
use crate::engine::permissions;
use crate::engine::script::Script;
use crate::engine::Core;
use crate::error::{Failure, RedisError, RedisErrorKind};
use crate::inspection::{LockEventKind, LossReason};

/// Keys per renewal script call, as Redisson does.
const BATCH: usize = 100;

/// How many of the holds a late renewal touched its warning names.
const LATE_LOCKS_NAMED: usize = 10;

#[derive(Clone, Copy, PartialEq, Eq)]

enum Tick {
    /// The period's scan of every hold.
    Period,
    /// Another try for holds whose renewal failed.
    Retry,
}

/// What a batch did: extend watchdog holds, or only check that fixed-lease holds still exist.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Visit {
    Renew,
    Check,
}

type BatchResult = (Vec<Arc<Hold>>, Visit, Instant, Result<Vec<i64>, RedisError>);

/// Holds to visit, by cluster hash slot, visit and renewal script (by address), with the script.
type Groups = BTreeMap<(u16, Visit, usize), (&'static Script, Vec<Arc<Hold>>)>;

pub(crate) struct Watchdog {
    core: Arc<Core>,
    timeout: Duration,
    period: Duration,
    retry: Duration,
    queue: DelayQueue<Tick>,
    retry_scheduled: bool,
    /// Holds whose last renewal failed, by address, until renewed or lost.
    failing: HashMap<usize, Arc<Hold>>,
    /// Holds a force unlock named, by address, until found gone (lost as forced) or standing.
    forced: HashMap<usize, Arc<Hold>>,
    /// Whether a connection loss was told and no reconnect since.
    disconnected: bool,
    batches: JoinSet<BatchResult>,
}

impl Watchdog {
    pub(crate) fn new(core: Arc<Core>) -> Watchdog {
        let timeout = core.watchdog_lease;
        let period = timeout / 3;
        Watchdog {
            core,
            timeout,
            period,
            // Retries after a failed renewal: often enough to get through before the deadline,
            // rarely enough not to hammer a recovering server.
            retry: (period / 4).clamp(Duration::from_millis(20), Duration::from_secs(1)),
            queue: DelayQueue::new(),
            retry_scheduled: false,
            failing: HashMap::new(),
            forced: HashMap::new(),
            disconnected: false,
            batches: JoinSet::new(),
        }
    }

    /// Runs until `shutdown` is cancelled.
    pub(crate) async fn run(mut self, shutdown: CancellationToken) {
        self.queue.insert(Tick::Period, self.period);
        // A reconnect may follow a restart that lost every key: look at once, not a period later.
        let mut reconnects = self.core.redis().reconnects();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                names = self.core.pubsub.forced() => {
                    // A force unlock named holds of this client: look at those now.
                    tracing::debug!(locks = ?names, "told of a force unlock; checking its holds");
                    let mut due = Vec::new();
                    self.core.holds.each(|hold| {
                        if names.iter().any(|name| **name == *hold.pair.name) {
                            due.push(hold.clone());
                        }
                    });
                    for hold in &due {
                        hold.tell(LockEventKind::ForceUnlocked);
                        self.forced.insert(address(hold), hold.clone());
                    }
                    self.renew(due);
                }
                reconnected = reconnects.recv() => match reconnected {
                    Ok(_) | Err(RecvError::Lagged(_)) => {
                        tracing::debug!("reconnected; checking every hold");
                        // One loss and one return per outage, the loss told here if nothing
                        // noticed it before.
                        let server = &self.core.address;
                        if !std::mem::take(&mut self.disconnected) {
                            self.core.report.events.connection(server, LockEventKind::ConnectionLost);
                        }
                        self.core.report.events.connection(server, LockEventKind::ConnectionBack);
                        self.renew_all();
                    }
                    Err(RecvError::Closed) => reconnects = self.core.redis().reconnects(),
                },
                Some(expired) = poll_fn(|cx| self.queue.poll_expired(cx)) => {
                    let late = Instant::now().saturating_duration_since(expired.deadline());
                    match expired.into_inner() {
                        Tick::Period => {
                            if late > self.period / 2 {
                                self.warn_late(late);
                            }
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

    /// Tells the operator that renewals ran `late`: nothing but a runtime whose threads were all
    /// busy (or blocked by synchronous work in an async task) delays a timer that long, and a
    /// hold whose renewal comes after its renew deadline is lost although Redis was fine.
    fn warn_late(&self, late: Duration) {
        let mut locks = Vec::new();
        let mut renewed = 0usize;
        self.core.holds.each(|hold| {
            if hold.watchdog_guards() > 0 {
                hold.tell(LockEventKind::RenewalLate);
                renewed += 1;
                if locks.len() < LATE_LOCKS_NAMED {
                    locks.push(hold.pair.name.to_string());
                }
            }
        });
        if renewed == 0 {
            return;
        }
        tracing::warn!(
            client = self.core.name.as_deref(),
            late_ms = late.as_millis() as u64,
            renewed,
            locks = %locks.join(","),
            "lock renewals ran {} ms late: the runtime was blocked (synchronous work in an async \
             task?); a lock whose renewal came after its renew deadline is lost",
            late.as_millis()
        );
    }

    fn renew_all(&mut self) {
        let mut due = Vec::new();
        self.core.holds.each(|hold| due.push(hold.clone()));
        self.renew(due);
    }

    /// Renews the holds that still have a watchdog guard, and checks that holds with fixed leases
    /// only still exist (so that their guards learn of a loss before the lease ends), skipping
    /// holds with a visit on its way; grouped by cluster hash slot, in batches.
    fn renew(&mut self, holds: Vec<Arc<Hold>>) {
        let clustered = self.core.redis().is_clustered();
        // By cluster hash slot, visit and renewal script (each primitive's own).
        let mut groups: Groups = BTreeMap::new();
        for hold in holds {
            let Some(renewal) = hold.kind.profile().renewal() else {
                continue; // nothing to renew or check: it has no lease
            };
            if hold.guards() == 0 || hold.is_lost() {
                if hold.guards() > 0 && hold.watchdog_guards() == 0 {
                    // A fixed lease past its end, which nothing else marks: it ran out.
                    hold.mark_lost(LossReason::Expired);
                }
                self.failing.remove(&address(&hold));
                continue;
            }
            if hold.releasing.load(Ordering::Acquire) || hold.visiting.swap(true, Ordering::AcqRel)
            {
                continue; // its release, or a visit, is on its way
            }
            let visit = if hold.watchdog_guards() > 0 {
                Visit::Renew
            } else {
                Visit::Check
            };
            let hash_slot = if clustered {
                super::key_slot(hold.pair.name.as_bytes())
            } else {
                0
            };
            let script = std::ptr::from_ref(renewal) as usize;
            groups
                .entry((hash_slot, visit, script))
                .or_insert_with(|| (renewal, Vec::new()))
                .1
                .push(hold);
        }
        for ((_, visit, _), (script, holds)) in groups {
            let mut holds = holds.into_iter().peekable();
            while holds.peek().is_some() {
                self.send_batch(script, holds.by_ref().take(BATCH).collect(), visit);
            }
        }
    }

    fn send_batch(&mut self, script: &'static Script, holds: Vec<Arc<Hold>>, visit: Visit) {
        // A lease of 0 asks the script to check without extending.
        let lease = match visit {
            Visit::Renew => self.core.lease_arg(Lease::Watchdog),
            Visit::Check => Value::from(0),
        };
        let writer = self.core.writer.clone();
        // A renewal still unanswered at the earliest renew deadline is given up then: that is
        // when its holds count as lost (`Hold::deadline`), so the loss reaches them then, not
        // when fred's timeout fires. Holds are renewed only before their deadline, so the limit
        // lies ahead. A check has no deadline to beat: it gets the period.
        let limit = match visit {
            Visit::Renew => holds.iter().map(|hold| hold.deadline()).min(),
            Visit::Check => None,
        }
        .unwrap_or_else(|| Instant::now() + self.period);
        self.batches.spawn(async move {
            let sent_at = Instant::now();
            // Made again only for an `EVAL` fallback. Nothing is copied: each hold's key is its
            // primitive's, and its field the one its acquisition sent.
            let arguments = || {
                let mut keys = Vec::with_capacity(holds.len());
                let mut args = Vec::with_capacity(holds.len() + 1);
                args.push(lease.clone());
                for hold in &holds {
                    keys.push(hold.kind.profile().renewal_key());
                    args.push(Value::String(hold.pair.field.clone()));
                }
                (keys, args)
            };
            let renewal = script.run::<Vec<i64>>(&writer, arguments);
            let result = match tokio::time::timeout_at(limit, renewal).await {
                Ok(result) => result,
                Err(_) => Err(RedisError::new(
                    RedisErrorKind::NoReply,
                    Failure::Timeout,
                    "no reply before the renew deadline",
                )),
            };
            (holds, visit, sent_at, result)
        });
    }

    fn on_renewed(&mut self, (holds, visit, sent_at, result): BatchResult) {
        let now = Instant::now();
        match (&result, visit) {
            (Ok(_), Visit::Renew) => tracing::trace!(locks = holds.len(), "renewed"),
            (Ok(_), Visit::Check) => tracing::trace!(locks = holds.len(), "checked"),
            (Err(error), Visit::Renew) => {
                tracing::warn!(locks = holds.len(), %error, "lock renewal failed");
                // A permission taken away: the next call asks the question again and names it.
                if permissions::is_refused_permission(error) {
                    permissions::forget(&self.core);
                }
            }
            (Err(error), Visit::Check) => {
                tracing::debug!(locks = holds.len(), %error, "lock check failed")
            }
        }
        // One loss and one return per outage: the first renewal without an answer tells the
        // loss, the first answer after it (or a reconnect) the return.
        let answered = match &result {
            Ok(_) => true,
            Err(error) => error.kind() == RedisErrorKind::Refused,
        };
        if answered == self.disconnected {
            self.disconnected = !answered;
            let what = if answered {
                LockEventKind::ConnectionBack
            } else {
                LockEventKind::ConnectionLost
            };
            self.core.report.events.connection(&self.core.address, what);
        }
        for (i, hold) in holds.into_iter().enumerate() {
            hold.visiting.store(false, Ordering::Release);
            if hold.guards() == 0 || hold.releasing.load(Ordering::Acquire) {
                // Released while the visit was on its way, or being released: the release's
                // reply, not this one, tells whether the field was there to give back.
                self.failing.remove(&address(&hold));
                continue;
            }
            if visit == Visit::Renew {
                let renewed = matches!(&result, Ok(replies) if replies.get(i).copied() == Some(1));
                // A field found gone counts as a loss, not as a failed renewal.
                if renewed || result.is_err() {
                    let metrics = &self.core.metrics;
                    metrics.renewed(hold.kind.profile().label(), &hold.pair.name, renewed);
                }
                if result.is_err() && now < hold.deadline() {
                    // Retried until the deadline; a failure at it is told with the loss.
                    hold.tell(LockEventKind::RenewalFailed);
                }
            }
            match &result {
                Ok(replies) if replies.get(i).copied() == Some(1) => {
                    if visit == Visit::Renew {
                        hold.leased(sent_at, self.timeout);
                    }
                    self.failing.remove(&address(&hold));
                    self.forced.remove(&address(&hold));
                }
                Ok(_) => {
                    tracing::warn!(
                        lock = %hold.pair.name, owner = %hold.pair.field,
                        client = self.core.name.as_deref(),
                        "lock lost: its owner's field is gone from Redis"
                    );
                    let why = if self.forced.contains_key(&address(&hold)) {
                        LossReason::Forced
                    } else {
                        hold.gone_at(now)
                    };
                    self.lose(&hold, why);
                }
                // A fixed lease ends by itself; the next period looks again.
                Err(_) if visit == Visit::Check => {}
                Err(_) if now < hold.deadline() => {
                    self.failing.insert(address(&hold), hold);
                }
                Err(_) => {
                    tracing::warn!(
                        lock = %hold.pair.name, owner = %hold.pair.field,
                        client = self.core.name.as_deref(),
                        "lock lost: no renewal confirmed within the renew deadline"
                    );
                    self.lose(&hold, LossReason::DeadlinePassed);
                }
            }
        }
        if !self.failing.is_empty() && !self.retry_scheduled {
            // Try again soon, and once more right at the earliest renew deadline.
            let earliest_end = self
                .failing
                .values()
                .map(|hold| hold.deadline())
                .min()
                .unwrap_or(now);
            self.queue
                .insert_at(Tick::Retry, (now + self.retry).min(earliest_end.max(now)));
            self.retry_scheduled = true;
        }
    }

    fn lose(&mut self, hold: &Arc<Hold>, why: LossReason) {
        self.failing.remove(&address(hold));
        self.forced.remove(&address(hold));
        hold.mark_lost(why);
    }
}

fn address(hold: &Arc<Hold>) -> usize {
    Arc::as_ptr(hold) as usize
}

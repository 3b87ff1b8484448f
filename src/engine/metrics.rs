//! Every metric fredlock records, recorded here and nowhere else: the acquire loop, guards,
//! holds and the watchdog report what happened, and this module turns it into `metrics` calls.
//!
//! Without the `metrics` feature every function is empty and inlined away. With it, each call
//! goes to whatever recorder the application installed (none: nothing is recorded). Metrics are
//! labelled by `kind` (the primitive's kind, as `Primitive::label` says) and,
//! only when the client was built with `metrics_lock_names(true)`, by `lock` (the name):
//! names are unbounded, and a time series per name can outgrow a metrics backend.

use std::time::Duration;

use crate::error::Error;

/// Acquisitions granted (counter).
pub const ACQUISITIONS: &str = "fredlock_acquisitions_total";
/// Acquisitions granted after the primitive was found held: handed on by an unlock or an
/// expiry (counter).
pub const HANDOFFS: &str = "fredlock_handoffs_total";
/// `try_lock` calls whose wait ran out while others held the primitive (counter).
pub const TIMEOUTS: &str = "fredlock_try_lock_timeouts_total";
/// Acquire and release calls that failed, by `error` (counter).
pub const ERRORS: &str = "fredlock_errors_total";
/// Holds found lost: their field gone, or no renewal confirmed in time (counter).
pub const LOST: &str = "fredlock_lost_locks_total";
/// Holds renewed by the watchdog (counter).
pub const RENEWALS: &str = "fredlock_renewals_total";
/// Renewals of a hold that failed, each retried until its renew deadline (counter).
pub const RENEWAL_FAILURES: &str = "fredlock_renewal_failures_total";
/// How long acquire calls waited, in seconds, by `outcome`: `acquired`, `timed_out` or
/// `failed` (histogram).
pub const WAIT: &str = "fredlock_acquire_wait_seconds";
/// (primitive, owner) pairs held by this process (gauge).
pub const HELD: &str = "fredlock_held";
/// Tasks waiting for a primitive that another owner holds (gauge).
pub const WAITING: &str = "fredlock_waiting_tasks";
/// Events a slow receiver of a client's events lost, having fallen too far behind (counter).
pub const EVENTS_LAGGED: &str = "fredlock_events_lagged_total";
/// Counts `lost` events that a slow receiver of a client's events lost (per process: no
/// label).
pub(crate) fn events_lagged(lost: u64) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!(EVENTS_LAGGED).increment(lost);
    #[cfg(not(feature = "metrics"))]
    let _ = lost;
}

/// The metrics of a primitive that runs work under its holds (a job lock's runs), named by the
/// primitive: a counter of the runs by `outcome`, and a histogram of how long the work ran.
#[derive(Clone, Copy, Debug)]
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(crate) struct WorkMetrics {
    /// The counter of runs, by `outcome`.
    pub(crate) runs: &'static str,
    /// The histogram of how long the work ran, in seconds, by `outcome`.
    pub(crate) ran_for: &'static str,
}

/// How an acquire call ended, for the wait histogram and the counters.
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(crate) enum Ended<'a> {
    /// Granted; `contended` when some attempt found it held first.
    Acquired {
        contended: bool,
    },
    TimedOut,
    Failed(&'a Error),
}

/// The `outcome` label of each way an acquire call ends, in [`Ended::index`]'s order.
const OUTCOMES: [&str; 3] = ["acquired", "timed_out", "failed"];

impl Ended<'_> {
    fn index(&self) -> usize {
        match self {
            Ended::Acquired { .. } => 0,
            Ended::TimedOut => 1,
            Ended::Failed(_) => 2,
        }
    }

    pub(crate) fn outcome(&self) -> &'static str {
        OUTCOMES[self.index()]
    }
}

#[cfg(feature = "metrics")]
mod record {
    use std::sync::{Arc, PoisonError, RwLock};

    use ::metrics::{counter, gauge, histogram, Counter, Gauge, Histogram, Label};

    use super::*;

    /// Where a client records: its settings, and the handles of each kind it has met.
    ///
    /// Registering a metric with a recorder is a look-up in the recorder's registry, several
    /// times the work of recording; without name labels a client registers each kind's metrics
    /// once, when it first records one of that kind, and keeps the handles. (A recorder must
    /// therefore be installed before then, as the `metrics` crate asks of every handle.)
    #[derive(Clone)]
    pub(crate) struct Metrics(Arc<Inner>);

    struct Inner {
        /// Whether metrics carry the primitive's name as label `lock`.
        lock_names: bool,
        /// Each kind's handles, by label: a few kinds at most, so a list.
        kinds: RwLock<Vec<(&'static str, Arc<Handles>)>>,
    }

    /// One kind's metrics, registered once.
    struct Handles {
        acquisitions: Counter,
        handoffs: Counter,
        timeouts: Counter,
        lost: Counter,
        renewals: Counter,
        renewal_failures: Counter,
        held: Gauge,
        waiting: Gauge,
        /// By outcome, in [`OUTCOMES`]' order.
        wait: [Histogram; 3],
    }

    impl Handles {
        fn register(kind: &'static str) -> Handles {
            Handles {
                acquisitions: counter!(ACQUISITIONS, "kind" => kind),
                handoffs: counter!(HANDOFFS, "kind" => kind),
                timeouts: counter!(TIMEOUTS, "kind" => kind),
                lost: counter!(LOST, "kind" => kind),
                renewals: counter!(RENEWALS, "kind" => kind),
                renewal_failures: counter!(RENEWAL_FAILURES, "kind" => kind),
                held: gauge!(HELD, "kind" => kind),
                waiting: gauge!(WAITING, "kind" => kind),
                wait: OUTCOMES
                    .map(|outcome| histogram!(WAIT, "kind" => kind, "outcome" => outcome)),
            }
        }
    }

    impl Metrics {
        pub(crate) fn new(lock_names: bool) -> Metrics {
            Metrics(Arc::new(Inner {
                lock_names,
                kinds: RwLock::new(Vec::new()),
            }))
        }

        /// `kind`'s handles, registered on first use.
        fn handles(&self, kind: &'static str) -> Arc<Handles> {
            let known = self.0.kinds.read().unwrap_or_else(PoisonError::into_inner);
            if let Some((_, handles)) = known.iter().find(|(known, _)| *known == kind) {
                return handles.clone();
            }
            drop(known);
            let mut kinds = self.0.kinds.write().unwrap_or_else(PoisonError::into_inner);
            if let Some((_, handles)) = kinds.iter().find(|(known, _)| *known == kind) {
                return handles.clone();
            }
            let handles = Arc::new(Handles::register(kind));
            kinds.push((kind, handles.clone()));
            handles
        }

        /// The labels of a metric of `name`'s: its kind, and its name when names are labels.
        fn labels(&self, kind: &'static str, name: &str) -> Vec<Label> {
            let mut labels = vec![Label::from_static_parts("kind", kind)];
            if self.0.lock_names {
                labels.push(Label::new("lock", name.to_owned()));
            }
            labels
        }

        /// A handle of `kind`'s: the one kept, or with name labels, `named`'s registration under
        /// `name`'s labels.
        fn handle<H: Clone>(
            &self,
            kind: &'static str,
            name: &str,
            kept: fn(&Handles) -> &H,
            named: fn(Vec<Label>) -> H,
        ) -> H {
            if self.0.lock_names {
                named(self.labels(kind, name))
            } else {
                kept(&self.handles(kind)).clone()
            }
        }

        pub(crate) fn acquire_ended(
            &self,
            kind: &'static str,
            name: &str,
            waited: Duration,
            ended: &Ended<'_>,
        ) {
            if self.0.lock_names {
                let mut labels = self.labels(kind, name);
                labels.push(Label::from_static_parts("outcome", ended.outcome()));
                histogram!(WAIT, labels).record(waited.as_secs_f64());
            } else {
                self.handles(kind).wait[ended.index()].record(waited.as_secs_f64());
            }
            match ended {
                Ended::Acquired { contended } => {
                    if *contended {
                        self.handle(kind, name, |h| &h.handoffs, |l| counter!(HANDOFFS, l))
                            .increment(1);
                    }
                    self.handle(
                        kind,
                        name,
                        |h| &h.acquisitions,
                        |l| counter!(ACQUISITIONS, l),
                    )
                    .increment(1);
                }
                Ended::TimedOut => self
                    .handle(kind, name, |h| &h.timeouts, |l| counter!(TIMEOUTS, l))
                    .increment(1),
                Ended::Failed(error) => self.failed(kind, name, error),
            }
        }

        /// Errors are few, and labelled by what failed too: registered each time.
        pub(crate) fn failed(&self, kind: &'static str, name: &str, error: &Error) {
            let mut labels = self.labels(kind, name);
            labels.push(Label::from_static_parts("error", error.label()));
            counter!(ERRORS, labels).increment(1);
        }

        pub(crate) fn lost(&self, kind: &'static str, name: &str) {
            self.handle(kind, name, |h| &h.lost, |l| counter!(LOST, l))
                .increment(1);
        }

        pub(crate) fn renewed(&self, kind: &'static str, name: &str, ok: bool) {
            let counter = if ok {
                self.handle(kind, name, |h| &h.renewals, |l| counter!(RENEWALS, l))
            } else {
                self.handle(
                    kind,
                    name,
                    |h| &h.renewal_failures,
                    |l| counter!(RENEWAL_FAILURES, l),
                )
            };
            counter.increment(1);
        }

        pub(crate) fn held(&self, kind: &'static str, name: &str, change: f64) {
            self.handle(kind, name, |h| &h.held, |l| gauge!(HELD, l))
                .increment(change);
        }

        pub(crate) fn waiting(&self, kind: &'static str, name: &str) -> Waiting {
            let gauge = self.handle(kind, name, |h| &h.waiting, |l| gauge!(WAITING, l));
            gauge.increment(1.0);
            Waiting(gauge)
        }

        /// A primitive's run of work ended with `outcome`, after running for `ran_for` if it
        /// ran, recorded in the primitive's own `metrics`. Runs come minutes apart (a job's):
        /// registered each time.
        pub(crate) fn work_ended(
            &self,
            metrics: WorkMetrics,
            kind: &'static str,
            name: &str,
            outcome: &'static str,
            ran_for: Option<Duration>,
        ) {
            let mut labels = self.labels(kind, name);
            labels.push(Label::from_static_parts("outcome", outcome));
            if let Some(ran_for) = ran_for {
                histogram!(metrics.ran_for, labels.clone()).record(ran_for.as_secs_f64());
            }
            counter!(metrics.runs, labels).increment(1);
        }
    }

    /// A task counted among the waiting until this is dropped.
    pub(crate) struct Waiting(Gauge);

    impl Drop for Waiting {
        fn drop(&mut self) {
            self.0.decrement(1.0);
        }
    }
}

#[cfg(not(feature = "metrics"))]
mod record {
    use super::*;

    /// Nothing is recorded without the feature.
    #[derive(Clone)]
    pub(crate) struct Metrics;

    impl Metrics {
        pub(crate) fn new(_lock_names: bool) -> Metrics {
            Metrics
        }
        #[inline(always)]
        pub(crate) fn acquire_ended(&self, _: &'static str, _: &str, _: Duration, _: &Ended<'_>) {}
        #[inline(always)]
        pub(crate) fn failed(&self, _: &'static str, _: &str, _: &Error) {}
        #[inline(always)]
        pub(crate) fn lost(&self, _: &'static str, _: &str) {}
        #[inline(always)]
        pub(crate) fn renewed(&self, _: &'static str, _: &str, _: bool) {}
        #[inline(always)]
        pub(crate) fn held(&self, _: &'static str, _: &str, _: f64) {}
        #[inline(always)]
        pub(crate) fn waiting(&self, _: &'static str, _: &str) -> Waiting {
            Waiting
        }
        #[inline(always)]
        pub(crate) fn work_ended(
            &self,
            _: WorkMetrics,
            _: &'static str,
            _: &str,
            _: &'static str,
            _: Option<Duration>,
        ) {
        }
    }

    /// Nothing to count without the feature.
    pub(crate) struct Waiting;
}

pub(crate) use record::{Metrics, Waiting};

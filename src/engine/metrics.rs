//! Every metric fredlock records, recorded here and nowhere else: the acquire loop, guards,
//! holds and the watchdog report what happened, and this module turns it into `metrics` calls.
//!
//! Without the `metrics` feature every function is empty and inlined away. With it, each call
//! goes to whatever recorder the application installed (none: nothing is recorded). Metrics are
//! labelled by `kind` (the primitive's kind, as [`Kind::label`](super::Kind::label) says) and,
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

/// Every metric name, for documentation and tests.
pub const ALL: [&str; 10] = [
    ACQUISITIONS,
    HANDOFFS,
    TIMEOUTS,
    ERRORS,
    LOST,
    RENEWALS,
    RENEWAL_FAILURES,
    WAIT,
    HELD,
    WAITING,
];

/// A client's metrics settings; copied into whatever records.
#[derive(Clone, Copy, Debug, Default)]
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(crate) struct Metrics {
    /// Whether metrics carry the primitive's name as label `lock`.
    pub(crate) lock_names: bool,
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

impl Ended<'_> {
    pub(crate) fn outcome(&self) -> &'static str {
        match self {
            Ended::Acquired { .. } => "acquired",
            Ended::TimedOut => "timed_out",
            Ended::Failed(_) => "failed",
        }
    }
}

#[cfg(feature = "metrics")]
mod record {
    use ::metrics::{counter, gauge, histogram, Label};

    use super::*;

    impl Metrics {
        fn labels(self, kind: &'static str, name: &str) -> Vec<Label> {
            let mut labels = Vec::with_capacity(2);
            labels.push(Label::from_static_parts("kind", kind));
            if self.lock_names {
                labels.push(Label::new("lock", name.to_owned()));
            }
            labels
        }

        pub(crate) fn acquire_ended(
            self,
            kind: &'static str,
            name: &str,
            waited: Duration,
            ended: &Ended<'_>,
        ) {
            let labels = self.labels(kind, name);
            let mut with_outcome = labels.clone();
            with_outcome.push(Label::from_static_parts("outcome", ended.outcome()));
            histogram!(WAIT, with_outcome).record(waited.as_secs_f64());
            match ended {
                Ended::Acquired { contended } => {
                    if *contended {
                        counter!(HANDOFFS, labels.clone()).increment(1);
                    }
                    counter!(ACQUISITIONS, labels).increment(1);
                }
                Ended::TimedOut => counter!(TIMEOUTS, labels).increment(1),
                Ended::Failed(error) => self.failed(kind, name, error),
            }
        }

        pub(crate) fn failed(self, kind: &'static str, name: &str, error: &Error) {
            let mut labels = self.labels(kind, name);
            labels.push(Label::from_static_parts("error", error.label()));
            counter!(ERRORS, labels).increment(1);
        }

        pub(crate) fn lost(self, kind: &'static str, name: &str) {
            counter!(LOST, self.labels(kind, name)).increment(1);
        }

        pub(crate) fn renewed(self, kind: &'static str, name: &str, ok: bool) {
            let metric = if ok { RENEWALS } else { RENEWAL_FAILURES };
            counter!(metric, self.labels(kind, name)).increment(1);
        }

        pub(crate) fn held(self, kind: &'static str, name: &str, change: f64) {
            gauge!(HELD, self.labels(kind, name)).increment(change);
        }

        pub(crate) fn waiting(self, kind: &'static str, name: &str) -> Waiting {
            let labels = self.labels(kind, name);
            gauge!(WAITING, labels.clone()).increment(1.0);
            Waiting(labels)
        }
    }

    /// A task counted among the waiting until this is dropped.
    pub(crate) struct Waiting(Vec<Label>);

    impl Drop for Waiting {
        fn drop(&mut self) {
            gauge!(WAITING, std::mem::take(&mut self.0)).decrement(1.0);
        }
    }
}

#[cfg(not(feature = "metrics"))]
mod record {
    use super::*;

    impl Metrics {
        #[inline(always)]
        pub(crate) fn acquire_ended(self, _: &'static str, _: &str, _: Duration, _: &Ended<'_>) {}
        #[inline(always)]
        pub(crate) fn failed(self, _: &'static str, _: &str, _: &Error) {}
        #[inline(always)]
        pub(crate) fn lost(self, _: &'static str, _: &str) {}
        #[inline(always)]
        pub(crate) fn renewed(self, _: &'static str, _: &str, _: bool) {}
        #[inline(always)]
        pub(crate) fn held(self, _: &'static str, _: &str, _: f64) {}
        #[inline(always)]
        pub(crate) fn waiting(self, _: &'static str, _: &str) -> Waiting {
            Waiting
        }
    }

    /// Nothing to count without the feature.
    pub(crate) struct Waiting;
}

pub(crate) use record::Waiting;

//! Every metric, seen through the `metrics` debugging recorder: a scripted workload on real
//! servers, and each metric's value after it. (`tests/metrics_http.rs` scrapes the Prometheus
//! exporter of `examples/metrics.rs` over HTTP.)

mod common;

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use common::{bounded, eventually, RedisServer};
use fred::prelude::*;
use fredlock::metrics;
use fredlock::prelude::*;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::CompositeKey;

/// The process's one recorder: every test of this file reads it.
fn snapshotter() -> &'static Snapshotter {
    static SNAPSHOTTER: OnceLock<Snapshotter> = OnceLock::new();
    SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder.install().expect("no other recorder");
        snapshotter
    })
}

/// What a metric recorded since the start, summed over snapshots: the debugging recorder hands
/// out each change once (a snapshot takes counters and gauges back to zero and empties
/// histograms), so each snapshot is added to these.
#[derive(Debug)]
enum Total {
    Count(u64),
    Level(f64),
    Samples(Vec<f64>),
}

/// The totals of every metric, after one more snapshot.
fn totals() -> std::sync::MutexGuard<'static, HashMap<CompositeKey, Total>> {
    static TOTALS: OnceLock<Mutex<HashMap<CompositeKey, Total>>> = OnceLock::new();
    let mut totals = TOTALS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    for (key, _, _, value) in snapshotter().snapshot().into_vec() {
        let total = totals.entry(key).or_insert_with(|| match value {
            DebugValue::Counter(_) => Total::Count(0),
            DebugValue::Gauge(_) => Total::Level(0.0),
            DebugValue::Histogram(_) => Total::Samples(Vec::new()),
        });
        match (total, value) {
            (Total::Count(count), DebugValue::Counter(more)) => *count += more,
            (Total::Level(level), DebugValue::Gauge(change)) => *level += change.into_inner(),
            (Total::Samples(samples), DebugValue::Histogram(more)) => {
                samples.extend(more.into_iter().map(|sample| sample.into_inner()))
            }
            (total, value) => panic!("a metric changed type: {total:?} then {value:?}"),
        }
    }
    totals
}

/// `metric`'s totals whose key `keep` keeps, read by `read`.
fn matching<T>(
    metric: &str,
    keep: impl Fn(&::metrics::Key) -> bool,
    read: impl Fn(&Total) -> T,
) -> Vec<T> {
    totals()
        .iter()
        .filter(|(key, _)| key.key().name() == metric && keep(key.key()))
        .map(|(_, total)| read(total))
        .collect()
}

/// Keeps a key whose labels include all of `labels`.
fn labelled<'a>(labels: &'a [(&str, &str)]) -> impl Fn(&::metrics::Key) -> bool + 'a {
    move |key| {
        labels.iter().all(|(name, value)| {
            key.labels()
                .any(|label| label.key() == *name && label.value() == *value)
        })
    }
}

impl Total {
    fn count(&self) -> u64 {
        match self {
            Total::Count(count) => *count,
            other => panic!("not a counter: {other:?}"),
        }
    }

    fn level(&self) -> f64 {
        match self {
            Total::Level(level) => *level,
            other => panic!("not a gauge: {other:?}"),
        }
    }

    fn samples(&self) -> Vec<f64> {
        match self {
            Total::Samples(samples) => samples.clone(),
            other => panic!("not a histogram: {other:?}"),
        }
    }
}

fn counter(metric: &str, labels: &[(&str, &str)]) -> u64 {
    matching(metric, labelled(labels), Total::count)
        .into_iter()
        .sum()
}

fn gauge(metric: &str, labels: &[(&str, &str)]) -> f64 {
    matching(metric, labelled(labels), Total::level)
        .into_iter()
        .sum()
}

fn samples(metric: &str, labels: &[(&str, &str)]) -> Vec<f64> {
    matching(metric, labelled(labels), Total::samples).concat()
}

async fn named_client(server: &RedisServer, watchdog: Duration) -> fredlock::LockClient {
    common::builder()
        .url(server.url())
        .watchdog_lease(watchdog)
        .metrics_lock_names(true)
        .build()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_metric_counts_what_happened() {
    snapshotter();
    let server = RedisServer::start_with_debug();
    bounded(async {
        let client = named_client(&server, Duration::from_millis(600)).await;
        let lock = |name: &'static str| [("kind", "lock"), ("lock", name)];

        // An uncontended acquisition: counted, held while the guard lives, waited ~0.
        let guard = client.lock("m:plain").lock().await.unwrap();
        assert_eq!(counter(metrics::ACQUISITIONS, &lock("m:plain")), 1);
        assert_eq!(gauge(metrics::HELD, &lock("m:plain")), 1.0);
        let waited = samples(
            metrics::WAIT,
            &[("lock", "m:plain"), ("outcome", "acquired")],
        );
        assert_eq!(waited.len(), 1, "{waited:?}");
        assert!(waited[0] < 1.0, "{waited:?}");
        // A re-entry is another acquisition of the same hold.
        client
            .lock("m:plain")
            .lock()
            .await
            .unwrap()
            .unlock()
            .await
            .unwrap();
        assert_eq!(counter(metrics::ACQUISITIONS, &lock("m:plain")), 2);
        assert_eq!(gauge(metrics::HELD, &lock("m:plain")), 1.0);
        guard.unlock().await.unwrap();
        assert_eq!(gauge(metrics::HELD, &lock("m:plain")), 0.0);
        assert_eq!(counter(metrics::HANDOFFS, &lock("m:plain")), 0);

        // A hand-off: a waiter counted as waiting until the holder lets go.
        let holder = client.lock("m:contended").lock().await.unwrap();
        let waiter = tokio::spawn({
            let lock = client.lock("m:contended");
            async move { lock.lock().await.unwrap().unlock().await.unwrap() }
        });
        assert!(
            eventually(Duration::from_secs(5), || async {
                gauge(metrics::WAITING, &lock("m:contended")) == 1.0
            })
            .await
        );
        // A try_lock that gives up.
        let other = client.lock("m:contended");
        let gave_up = tokio::spawn(async move {
            other
                .try_lock(Duration::from_millis(100), None)
                .await
                .unwrap()
                .is_none()
        });
        assert!(gave_up.await.unwrap());
        assert_eq!(counter(metrics::TIMEOUTS, &lock("m:contended")), 1);
        let timed_out = samples(
            metrics::WAIT,
            &[("lock", "m:contended"), ("outcome", "timed_out")],
        );
        assert!(timed_out.len() == 1 && timed_out[0] >= 0.1, "{timed_out:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
        holder.unlock().await.unwrap();
        waiter.await.unwrap();
        assert_eq!(counter(metrics::HANDOFFS, &lock("m:contended")), 1);
        assert_eq!(counter(metrics::ACQUISITIONS, &lock("m:contended")), 2);
        assert_eq!(gauge(metrics::WAITING, &lock("m:contended")), 0.0);
        let waited = samples(
            metrics::WAIT,
            &[("lock", "m:contended"), ("outcome", "acquired")],
        );
        assert!(waited.iter().any(|&seconds| seconds >= 0.2), "{waited:?}");

        // Errors, by kind of error.
        let invalid = client
            .lock("m:errors")
            .lock_with_lease(Duration::ZERO)
            .await;
        assert!(matches!(invalid, Err(fredlock::Error::InvalidArgument(_))));
        assert_eq!(
            counter(
                metrics::ERRORS,
                &[("lock", "m:errors"), ("error", "invalid_argument")]
            ),
            1
        );

        // Renewals, then a loss: the key deleted behind the holder's back.
        let renewed = client.lock("m:renewed").lock().await.unwrap();
        assert!(
            eventually(Duration::from_secs(5), || async {
                counter(metrics::RENEWALS, &lock("m:renewed")) >= 2
            })
            .await
        );
        let raw = server.raw().await;
        let _: i64 = raw.del("m:renewed").await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), renewed.lost())
            .await
            .unwrap();
        assert_eq!(counter(metrics::LOST, &lock("m:renewed")), 1);
        // Unlocking a lost lock is an error too.
        assert!(renewed.unlock().await.is_err());
        assert_eq!(
            counter(
                metrics::ERRORS,
                &[("lock", "m:renewed"), ("error", "not_held")]
            ),
            1
        );
        assert_eq!(gauge(metrics::HELD, &lock("m:renewed")), 0.0);

        // Failed renewals: the server sleeps past the renew deadline.
        let stalled = client.lock("m:stalled").lock().await.unwrap();
        common::debug_sleep(&server.raw().await, 1.5).await;
        tokio::time::timeout(Duration::from_secs(5), stalled.lost())
            .await
            .unwrap();
        assert!(counter(metrics::RENEWAL_FAILURES, &lock("m:stalled")) >= 1);
        assert_eq!(counter(metrics::LOST, &lock("m:stalled")), 1);
        drop(stalled);

        // Every primitive is labelled by its kind.
        let kinds: [(&str, &str, fredlock::Lock); 5] = [
            ("fair_lock", "m:fair", client.fair_lock("m:fair").into()),
            (
                "fenced_lock",
                "m:fenced",
                client.fenced_lock("m:fenced").as_lock().clone(),
            ),
            ("spin_lock", "m:spin", client.spin_lock("m:spin").into()),
            (
                "read_lock",
                "m:rw:read",
                client.rw_lock("m:rw:read").read_lock().into(),
            ),
            (
                "write_lock",
                "m:rw:write",
                client.rw_lock("m:rw:write").write_lock().into(),
            ),
        ];
        for (kind, name, lock) in kinds {
            lock.lock().await.unwrap().unlock().await.unwrap();
            assert_eq!(
                counter(metrics::ACQUISITIONS, &[("kind", kind), ("lock", name)]),
                1,
                "{kind}"
            );
        }
        // Semaphores: each acquisition of permits counts under its own kind, held while out,
        // waiting while others hold them.
        let semaphore_labels = [("kind", "semaphore"), ("lock", "m:sem")];
        let semaphore = client.semaphore("m:sem");
        semaphore.try_set_permits(1).await.unwrap();
        let permit = semaphore.acquire(1).await.unwrap();
        assert_eq!(gauge(metrics::HELD, &semaphore_labels), 1.0);
        let waiter = {
            let semaphore = semaphore.clone();
            tokio::spawn(async move { semaphore.acquire(1).await.unwrap() })
        };
        assert!(
            eventually(Duration::from_secs(5), || async {
                gauge(metrics::WAITING, &semaphore_labels) == 1.0
            })
            .await
        );
        permit.release().await.unwrap();
        waiter.await.unwrap().release().await.unwrap();
        assert_eq!(counter(metrics::ACQUISITIONS, &semaphore_labels), 2);
        assert_eq!(counter(metrics::HANDOFFS, &semaphore_labels), 1);
        assert_eq!(gauge(metrics::HELD, &semaphore_labels), 0.0);
        assert_eq!(gauge(metrics::WAITING, &semaphore_labels), 0.0);
        let leased = client.permit_semaphore("m:leased");
        leased.try_set_permits(1).await.unwrap();
        leased.acquire().await.unwrap().release().await.unwrap();
        assert_eq!(
            counter(
                metrics::ACQUISITIONS,
                &[("kind", "permit_semaphore"), ("lock", "m:leased")]
            ),
            1
        );
        // A leader election: the held gauge says who leads, acquisitions count terms and
        // hand-offs count leadership changes from one candidate to a waiting one.
        let leader_labels = [("kind", "leader_election"), ("lock", "m:leader")];
        let election = client.leader_election("m:leader");
        let term = election.campaign().await.unwrap();
        assert_eq!(gauge(metrics::HELD, &leader_labels), 1.0);
        let candidate = {
            let election = election.clone();
            tokio::spawn(async move { election.campaign().await.unwrap() })
        };
        assert!(
            eventually(Duration::from_secs(5), || async {
                gauge(metrics::WAITING, &leader_labels) == 1.0
            })
            .await
        );
        term.resign().await.unwrap();
        candidate.await.unwrap().resign().await.unwrap();
        assert_eq!(counter(metrics::ACQUISITIONS, &leader_labels), 2);
        assert_eq!(counter(metrics::HANDOFFS, &leader_labels), 1);
        assert_eq!(gauge(metrics::HELD, &leader_labels), 0.0);
        // A job lock: runs by outcome (ran, skipped, lost), with how long each ran; attempts
        // are its acquisitions and timeouts.
        let job_labels = [("kind", "job"), ("lock", "job-lock:default:m-job")];
        let job = client
            .job_lock("m-job")
            .at_most_for(Duration::from_millis(300));
        assert!(job.run(async {}).await.unwrap().is_ran());
        let (taken, is_taken) = tokio::sync::oneshot::channel();
        let running = {
            let job = job.clone();
            tokio::spawn(async move {
                job.run(async move {
                    taken.send(()).unwrap();
                    tokio::time::sleep(Duration::from_secs(5)).await;
                })
                .await
                .unwrap()
            })
        };
        is_taken.await.unwrap();
        assert!(job.run(async {}).await.unwrap().is_skipped());
        assert!(running.await.unwrap().is_lost());
        let runs = |outcome| {
            counter(
                metrics::JOB_RUNS,
                &[job_labels[0], job_labels[1], ("outcome", outcome)],
            )
        };
        assert_eq!((runs("ran"), runs("skipped"), runs("lost")), (1, 1, 1));
        let ran_for = samples(
            metrics::JOB_RUN,
            &[job_labels[0], job_labels[1], ("outcome", "lost")],
        );
        assert!(
            ran_for.len() == 1 && ran_for[0] >= 0.25 && ran_for[0] < 1.0,
            "{ran_for:?}"
        );
        assert_eq!(counter(metrics::ACQUISITIONS, &job_labels), 2);
        assert_eq!(counter(metrics::TIMEOUTS, &job_labels), 1);
        // A receiver of the client's events that falls behind: what it lost is counted.
        let mut events = client.events();
        let lock = client.lock("m-events");
        let capacity = fredlock::events::DEFAULT_EVENT_CAPACITY;
        for _ in 0..capacity {
            lock.lock().await.unwrap().unlock().await.unwrap();
        }
        match events.recv().await {
            Err(fredlock::events::RecvError::Lagged(lost)) => {
                assert_eq!(counter(metrics::EVENTS_LAGGED, &[]), lost);
            }
            other => panic!("expected Lagged, got {other:?}"),
        }
        // Each metric the crate names was recorded.
        for metric in metrics::ALL {
            assert!(
                !matching(metric, |_| true, |_| ()).is_empty(),
                "{metric} never recorded"
            );
        }
        client.shutdown().await;
    })
    .await;
}

/// `metric`'s count over the series without a `lock` label: a client without name labels,
/// whose handles it keeps, records there (only the test below has one).
fn unnamed_counter(metric: &str, kind: &str) -> u64 {
    let of_kind = [("kind", kind)];
    let of_kind = labelled(&of_kind);
    let unnamed =
        |key: &::metrics::Key| key.labels().all(|label| label.key() != "lock") && of_kind(key);
    matching(metric, unnamed, Total::count).into_iter().sum()
}

/// Without name labels the client keeps each kind's handles: the same counts arrive, labelled
/// by kind alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_are_labels_only_when_asked() {
    snapshotter();
    let server = RedisServer::start();
    bounded(async {
        let client = server.lock_client(Duration::from_millis(600)).await;
        let name = "m:unnamed-label";
        let guard = client.lock(name).lock().await.unwrap();
        guard.unlock().await.unwrap();
        client
            .lock(name)
            .lock()
            .await
            .unwrap()
            .unlock()
            .await
            .unwrap();
        assert_eq!(unnamed_counter(metrics::ACQUISITIONS, "lock"), 2);
        assert!(matching(metrics::ACQUISITIONS, labelled(&[("lock", name)]), |_| ()).is_empty());

        let renewed = client.fenced_lock(name).lock().await.unwrap();
        assert!(
            eventually(Duration::from_secs(5), || async {
                unnamed_counter(metrics::RENEWALS, "fenced_lock") >= 2
            })
            .await
        );
        let raw = server.raw().await;
        let _: i64 = raw.del(name).await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), renewed.lost())
            .await
            .unwrap();
        assert_eq!(unnamed_counter(metrics::LOST, "fenced_lock"), 1);
        assert!(renewed.unlock().await.is_err());
        assert_eq!(unnamed_counter(metrics::ERRORS, "fenced_lock"), 1);
        client.shutdown().await;
    })
    .await;
}

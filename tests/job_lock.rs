//! Acceptance tests of the job lock against real `redis-server` processes: once per tick across
//! instances with skewed clocks (and ShedLock's double runs without it, as a negative control),
//! jobs cancelled when their lock ends, ShedLock's layout replayed in both directions, waiting
//! runs woken by a release, cancelled runs that leak nothing, inspection and force unlock.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use common::{bounded, eventually, RedisServer};
use fred::prelude::*;
use fred::types::{Expiration, SetOptions};
use fredlock::{Error, JobLock, JobRun};
use rand::Rng;
use tokio::time::Instant;

/// Job locks and what runs return cross tasks.
const _: () = {
    const fn shareable<T: Send + Sync + 'static>() {}
    shareable::<JobLock>();
    shareable::<fredlock::Skipped>();
    shareable::<JobRun<u64>>();
};

/// The schedule of test 1: three instances, a tick every 300 ms, twenty ticks.
const INSTANCES: usize = 3;
const PERIOD: Duration = Duration::from_millis(300);
const TICKS: u32 = 20;

/// How each instance runs its tick.
#[derive(Clone, Copy)]
enum Mode {
    /// `run_tick(tick, ..)`.
    Tick,
    /// `run(..)` with this at-least-for.
    Run(Duration),
}

/// Three clients fire every tick of the schedule, each late by a random skew up to `skew`,
/// with a job of 0-50 ms that records its tick: how many times each tick ran.
async fn fire_schedule(server: &RedisServer, name: &str, mode: Mode, skew: Duration) -> Vec<u32> {
    let runs: Arc<Mutex<BTreeMap<u32, u32>>> = Arc::default();
    let origin = Instant::now() + Duration::from_millis(200);
    let wall_origin = SystemTime::now() + Duration::from_millis(200);
    let mut instances = Vec::new();
    for _ in 0..INSTANCES {
        let client = server.lock_client(Duration::from_secs(30)).await;
        let mut job = client.job_lock(name).at_most_for(Duration::from_secs(5));
        if let Mode::Run(at_least_for) = mode {
            job = job.at_least_for(at_least_for);
        }
        let runs = runs.clone();
        instances.push(tokio::spawn(async move {
            let mut fired = Vec::new();
            for tick in 0..TICKS {
                let late = rand::thread_rng().gen_range(0..=skew.as_millis() as u64);
                tokio::time::sleep_until(origin + PERIOD * tick + Duration::from_millis(late))
                    .await;
                let (job, runs) = (job.clone(), runs.clone());
                fired.push(tokio::spawn(async move {
                    let work = async {
                        let took = rand::thread_rng().gen_range(0..=50);
                        tokio::time::sleep(Duration::from_millis(took)).await;
                        *runs.lock().unwrap().entry(tick).or_default() += 1;
                    };
                    let run = match mode {
                        Mode::Tick => job.run_tick(wall_origin + PERIOD * tick, work).await,
                        Mode::Run(_) => job.run(work).await,
                    };
                    assert!(!run.unwrap().is_lost());
                }));
            }
            for run in fired {
                run.await.unwrap();
            }
            client.shutdown().await;
        }));
    }
    for instance in instances {
        instance.await.unwrap();
    }
    let runs = runs.lock().unwrap();
    (0..TICKS)
        .map(|tick| runs.get(&tick).copied().unwrap_or(0))
        .collect()
}

/// 1a. With `run_tick` and a skew of 0-200 ms, every tick runs exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn run_tick_runs_every_tick_exactly_once_under_skew() {
    bounded(async {
        let server = RedisServer::start();
        let runs = fire_schedule(&server, "ticked", Mode::Tick, Duration::from_millis(200)).await;
        assert_eq!(runs, vec![1; TICKS as usize], "runs per tick");
    })
    .await;
}

/// 1b. With `run`, `at_least_for(150 ms)` and a skew of 0-100 ms (ShedLock's condition), every
/// tick runs exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn run_with_at_least_for_above_the_skew_runs_every_tick_once() {
    bounded(async {
        let server = RedisServer::start();
        let mode = Mode::Run(Duration::from_millis(150));
        let runs = fire_schedule(&server, "shedlock-model", mode, Duration::from_millis(100)).await;
        assert_eq!(runs, vec![1; TICKS as usize], "runs per tick");
    })
    .await;
}

/// 1c. The negative control: `run` alone lets a fast job run again on a late instance, the
/// double runs ShedLock warns about.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn run_without_at_least_for_runs_fast_jobs_twice() {
    bounded(async {
        let server = RedisServer::start();
        let runs = fire_schedule(
            &server,
            "unguarded",
            Mode::Run(Duration::ZERO),
            Duration::from_millis(200),
        )
        .await;
        let doubled = runs.iter().filter(|runs| **runs > 1).count();
        assert!(doubled > 0, "no tick ran twice: {runs:?}");
        assert!(runs.iter().all(|runs| *runs >= 1), "{runs:?}");
    })
    .await;
}

/// 2. A job that outlives `at_most_for` is cancelled (`Lost`) before another instance runs it;
/// with keep-alive it runs to its end, renewed, while the others skip.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_job_is_cancelled_when_its_lock_ends_and_kept_alive_when_asked() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let first = server.lock_client(Duration::from_millis(600)).await;
        let second = server.lock_client(Duration::from_millis(600)).await;
        let at_most_for = Duration::from_millis(700);

        let dropped = Arc::new(Mutex::new(None));
        let long_job = first.job_lock("outlives").at_most_for(at_most_for);
        let (taken, is_taken) = tokio::sync::oneshot::channel();
        let running = tokio::spawn({
            let dropped = common::DroppedAt(dropped.clone());
            async move {
                long_job
                    .run(async move {
                        let _dropped = dropped;
                        taken.send(()).unwrap();
                        tokio::time::sleep(Duration::from_secs(3)).await;
                    })
                    .await
                    .unwrap()
            }
        });
        is_taken.await.unwrap();
        let other = second
            .job_lock("outlives")
            .at_most_for(Duration::from_secs(5));
        let started = loop {
            if let JobRun::Ran(started) = other.run(async { Instant::now() }).await.unwrap() {
                break started;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        assert!(running.await.unwrap().is_lost());
        let cancelled = dropped
            .lock()
            .unwrap()
            .expect("the job's future was dropped");
        assert!(
            cancelled < started,
            "cancelled {:?} after the other instance started",
            cancelled - started
        );

        // Kept alive: a job of 1.5 s under an at-most-for of 0.6 s runs to its end.
        let kept = first
            .job_lock("kept-alive")
            .at_most_for(Duration::from_millis(600))
            .keep_alive(Duration::from_secs(10));
        let key = kept.key().to_owned();
        let contender = second.job_lock("kept-alive");
        let (taken, is_taken) = tokio::sync::oneshot::channel();
        let ended = Arc::new(Mutex::new(None));
        let run = tokio::spawn({
            let ended = ended.clone();
            async move {
                kept.run(async move {
                    taken.send(()).unwrap();
                    tokio::time::sleep(Duration::from_millis(1500)).await;
                    *ended.lock().unwrap() = Some(Instant::now());
                })
                .await
                .unwrap()
            }
        });
        is_taken.await.unwrap();
        let mut skipped = 0;
        while !run.is_finished() {
            match contender.run(async { Instant::now() }).await.unwrap() {
                JobRun::Skipped(_) => skipped += 1,
                // Only once the kept-alive job has ended.
                JobRun::Ran(at) => {
                    let ended = ended.lock().unwrap().expect("ran beside a kept-alive job");
                    assert!(at > ended);
                    break;
                }
                JobRun::Lost => panic!("an empty job lost its lock"),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(run.await.unwrap().is_ran());
        assert!(skipped > 10, "{skipped}");
        let gone: i64 = raw.exists(&key).await.unwrap();
        assert_eq!(gone, 0, "given back at the end");

        // Kept alive up to a cap: a job past it is cancelled.
        let capped = first
            .job_lock("capped")
            .at_most_for(Duration::from_millis(600))
            .keep_alive(Duration::from_millis(800));
        let started = Instant::now();
        let run = capped
            .run(tokio::time::sleep(Duration::from_secs(5)))
            .await
            .unwrap();
        assert!(run.is_lost());
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(800) && took < Duration::from_secs(2),
            "{took:?}"
        );
        first.shutdown().await;
        second.shutdown().await;
    })
    .await;
}

/// What ShedLock writes: `ADDED:<ISO-8601 time>@<host>:<uuid>`.
const SHEDLOCK_VALUE: &str =
    "ADDED:2026-11-26T02:30:00.123Z@spring-pod-3:1b4e28ba-2fa1-11d2-883f-0016d3cca427";

/// ShedLock's safe unlock, replayed: compare the value, then keep the key for the rest of
/// lockAtLeastFor or delete it.
const SHEDLOCK_UNLOCK: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then \
    if tonumber(ARGV[2]) > 0 then return redis.call('pexpire', KEYS[1], ARGV[2]) end \
    return redis.call('del', KEYS[1]) end return 0";

/// 3. ShedLock's layout, both ways, by replaying its commands with a raw client.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shedlock_and_fredlock_share_a_job() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = server.lock_client(Duration::from_secs(30)).await;
        let job = client.job_lock("report").host("rust-pod-1");
        assert_eq!(job.key(), "job-lock:default:report");

        // ShedLock took it: fredlock skips, naming its host and how long it keeps it.
        let taken: Option<String> = raw
            .set(
                job.key(),
                SHEDLOCK_VALUE,
                Some(Expiration::PX(10_000)),
                Some(SetOptions::NX),
                false,
            )
            .await
            .unwrap();
        assert!(taken.is_some());
        let JobRun::Skipped(skipped) = job
            .run(async { panic!("ran beside ShedLock") })
            .await
            .unwrap()
        else {
            panic!("not skipped")
        };
        let holder = skipped.holder().expect("the holder is named");
        assert_eq!(holder.host(), Some("spring-pod-3"));
        assert_eq!(holder.value(), SHEDLOCK_VALUE);
        let left = holder.remaining().unwrap();
        assert!(
            left > Duration::from_secs(9) && left <= Duration::from_secs(10),
            "{left:?}"
        );
        let unlocked: i64 = raw
            .eval(SHEDLOCK_UNLOCK, vec![job.key()], vec![SHEDLOCK_VALUE, "0"])
            .await
            .unwrap();
        assert_eq!(unlocked, 1);

        // fredlock took it: ShedLock's `SET NX` is refused, and the value has ShedLock's form.
        let before = SystemTime::now() - Duration::from_secs(1);
        let run = job.run(async {
            let value: String = raw.get(job.key()).await.unwrap();
            let refused: Option<String> = raw
                .set(
                    job.key(),
                    SHEDLOCK_VALUE,
                    Some(Expiration::PX(10_000)),
                    Some(SetOptions::NX),
                    false,
                )
                .await
                .unwrap();
            let pttl: i64 = raw.pttl(job.key()).await.unwrap();
            (value, refused, pttl)
        });
        let (value, refused, pttl) = run.await.unwrap().ran().unwrap();
        assert_eq!(
            refused, None,
            "ShedLock's SET NX must fail while fredlock runs the job"
        );
        let holder = fredlock_holder(&value);
        assert_eq!(holder.host(), Some("rust-pod-1"));
        let locked_at = holder.locked_at().expect("an ISO-8601 time");
        assert!(locked_at > before && locked_at < SystemTime::now() + Duration::from_secs(1));
        let id = value.rsplit_once('@').unwrap().1.split_once(':').unwrap().1;
        assert!(
            id.starts_with(&client.id().hyphenated().to_string()),
            "{value}"
        );
        assert!(
            pttl > 590_000 && pttl <= 600_000,
            "at-most-for is 10 min: {pttl}"
        );
        let left: i64 = raw.exists(job.key()).await.unwrap();
        assert_eq!(left, 0, "deleted at the end: no at-least-for");

        // At-least-for: what is left of it is the key's PTTL, within 50 ms.
        let kept = job.clone().at_least_for(Duration::from_millis(1000));
        let started = Arc::new(Mutex::new(None));
        let ran = kept
            .run({
                let started = started.clone();
                async move {
                    *started.lock().unwrap() = Some(Instant::now());
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            })
            .await
            .unwrap();
        assert!(ran.is_ran());
        let pttl: i64 = raw.pttl(kept.key()).await.unwrap();
        let started = started.lock().unwrap().unwrap();
        let expected = 1000 - started.elapsed().as_millis() as i64;
        assert!(
            (pttl - expected).abs() <= 50,
            "PTTL {pttl} ms, expected {expected} ms"
        );
        // ShedLock's next `SET NX` is refused until then, and succeeds after.
        let refused: Option<String> = raw
            .set(
                kept.key(),
                SHEDLOCK_VALUE,
                Some(Expiration::PX(10_000)),
                Some(SetOptions::NX),
                false,
            )
            .await
            .unwrap();
        assert_eq!(refused, None);
        tokio::time::sleep(Duration::from_millis(pttl as u64 + 20)).await;
        let taken: Option<String> = raw
            .set(
                kept.key(),
                SHEDLOCK_VALUE,
                Some(Expiration::PX(10_000)),
                Some(SetOptions::NX),
                false,
            )
            .await
            .unwrap();
        assert!(taken.is_some());
        let _: i64 = raw.del(kept.key()).await.unwrap();

        // A value that is not the run's is never deleted: the key changed hands under the job
        // (as after an expiry), and the run's end leaves the new holder's key alone.
        let ran = job
            .run(async {
                let _: i64 = raw.del(job.key()).await.unwrap();
                let _: Option<String> = raw
                    .set(
                        job.key(),
                        SHEDLOCK_VALUE,
                        Some(Expiration::PX(10_000)),
                        None,
                        false,
                    )
                    .await
                    .unwrap();
            })
            .await
            .unwrap();
        assert!(!ran.is_skipped());
        let value: Option<String> = raw.get(job.key()).await.unwrap();
        assert_eq!(
            value.as_deref(),
            Some(SHEDLOCK_VALUE),
            "a foreign value was touched"
        );
        let pttl: i64 = raw.pttl(job.key()).await.unwrap();
        assert!(pttl > 9_000, "its expiry was touched: {pttl}");

        // The environment and prefix are ShedLock's settings, and the client's prefix applies.
        let prefixed = common::builder()
            .url(server.url())
            .key_prefix("svc:")
            .build()
            .await
            .unwrap();
        let staged = prefixed.job_lock("report").env("staging").prefix("locks");
        assert_eq!(staged.key(), "svc:locks:staging:report");
        let value = staged
            .run(async {
                raw.get::<String, _>("svc:locks:staging:report")
                    .await
                    .unwrap()
            })
            .await
            .unwrap()
            .ran()
            .unwrap();
        assert!(value.starts_with("ADDED:"), "{value}");
        client.shutdown().await;
        prefixed.shutdown().await;
    })
    .await;
}

/// A holder read from a value, as a skipped run would report it.
fn fredlock_holder(value: &str) -> fredlock::JobHolder {
    fredlock::JobHolder::from_value(value)
}

/// 4. A waiting run starts within 250 ms of the release that frees the job; one waiting for a
/// ShedLock node (which publishes nothing) within the bounded poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn run_waiting_wakes_on_the_release() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let holder = server.lock_client(Duration::from_secs(30)).await;
        let waiter = server.lock_client(Duration::from_secs(30)).await;
        for round in 0..3 {
            let (go, hold) = tokio::sync::oneshot::channel::<()>();
            let (taken, is_taken) = tokio::sync::oneshot::channel();
            let job = holder.job_lock("waited");
            let holding = tokio::spawn(async move {
                let run = job
                    .run(async move {
                        taken.send(()).unwrap();
                        hold.await.unwrap();
                    })
                    .await
                    .unwrap();
                assert!(run.is_ran());
                Instant::now()
            });
            is_taken.await.unwrap();
            let job = waiter.job_lock("waited");
            let waiting = tokio::spawn(async move {
                job.run_waiting(Duration::from_secs(10), async { Instant::now() })
                    .await
                    .unwrap()
                    .ran()
                    .expect("ran once free")
            });
            // Long enough to be waiting on the channel, shorter than any poll would hide.
            tokio::time::sleep(Duration::from_millis(300 + round * 200)).await;
            let released_at = Instant::now();
            go.send(()).unwrap();
            let released = holding.await.unwrap();
            let started = waiting.await.unwrap();
            let woken = started.saturating_duration_since(released_at);
            assert!(
                woken < Duration::from_millis(250),
                "woken {woken:?} after the release"
            );
            assert!(started >= released_at);
            let _ = released;
        }

        // A ShedLock node's release publishes nothing: the wait polls, within `JOB_POLL`.
        let job = waiter.job_lock("waited");
        let _: Option<String> = raw
            .set(
                job.key(),
                SHEDLOCK_VALUE,
                Some(Expiration::PX(30_000)),
                Some(SetOptions::NX),
                false,
            )
            .await
            .unwrap();
        let waiting = tokio::spawn(async move {
            job.run_waiting(Duration::from_secs(10), async { Instant::now() })
                .await
                .unwrap()
                .ran()
                .expect("ran once free")
        });
        tokio::time::sleep(Duration::from_millis(700)).await;
        let released_at = Instant::now();
        let unlocked: i64 = raw
            .eval(
                SHEDLOCK_UNLOCK,
                vec!["job-lock:default:waited"],
                vec![SHEDLOCK_VALUE, "0"],
            )
            .await
            .unwrap();
        assert_eq!(unlocked, 1);
        let woken = waiting
            .await
            .unwrap()
            .saturating_duration_since(released_at);
        assert!(
            woken < fredlock::JOB_POLL + Duration::from_millis(150),
            "woken {woken:?} after ShedLock's release"
        );

        // A wait that ends first skips, naming the holder.
        let (go, hold) = tokio::sync::oneshot::channel::<()>();
        let job = holder.job_lock("waited").host("busy-host");
        let (taken, is_taken) = tokio::sync::oneshot::channel();
        let holding = tokio::spawn(async move {
            job.run(async move {
                taken.send(()).unwrap();
                let _ = hold.await;
            })
            .await
            .unwrap()
        });
        is_taken.await.unwrap();
        let started = Instant::now();
        let run = waiter
            .job_lock("waited")
            .run_waiting(Duration::from_millis(300), async {})
            .await
            .unwrap();
        let JobRun::Skipped(skipped) = run else {
            panic!("ran while held")
        };
        assert!(started.elapsed() >= Duration::from_millis(300));
        assert_eq!(
            skipped.holder().and_then(|holder| holder.host()),
            Some("busy-host")
        );
        go.send(()).unwrap();
        assert!(holding.await.unwrap().is_ran());
        assert!(eventually(Duration::from_secs(2), || async { common::idle(&waiter) }).await);
        holder.shutdown().await;
        waiter.shutdown().await;
    })
    .await;
}

/// 5. Cancelling a run mid-job gives the job back (kept until its at-least-for, if that is
/// ahead), never leaving it taken; shutting the client down does the same at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancelled_run_gives_the_job_back() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = server.lock_client(Duration::from_secs(30)).await;

        let job = client.job_lock("cancelled");
        let key = job.key().to_owned();
        // The job runs only under the lock: its start says the run took the job.
        let started = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let job_of = |started: &Arc<std::sync::atomic::AtomicBool>| {
            let started = started.clone();
            async move {
                started.store(true, std::sync::atomic::Ordering::SeqCst);
                tokio::time::sleep(Duration::from_secs(30)).await
            }
        };
        let cancelled =
            tokio::time::timeout(Duration::from_millis(200), job.run(job_of(&started))).await;
        assert!(cancelled.is_err());
        assert!(
            started.load(std::sync::atomic::Ordering::SeqCst),
            "the run never took the job"
        );
        assert!(
            eventually(Duration::from_secs(2), || async {
                raw.exists::<i64, _>(&key).await.unwrap() == 0
            })
            .await,
            "the cancelled run's job was not given back"
        );
        assert!(eventually(Duration::from_secs(2), || async { common::idle(&client) }).await);
        // Another instance runs it at once.
        assert!(client
            .job_lock("cancelled")
            .run(async {})
            .await
            .unwrap()
            .is_ran());

        // With at-least-for still ahead, the key stays until then, and no longer.
        let job = client
            .job_lock("cancelled")
            .at_least_for(Duration::from_millis(1500));
        let started = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let cancelled =
            tokio::time::timeout(Duration::from_millis(200), job.run(job_of(&started))).await;
        assert!(cancelled.is_err());
        assert!(
            started.load(std::sync::atomic::Ordering::SeqCst),
            "the run never took the job"
        );
        assert!(
            eventually(Duration::from_secs(2), || async {
                let pttl: i64 = raw.pttl(&key).await.unwrap();
                pttl > 0 && pttl <= 1300
            })
            .await,
            "kept for the rest of at-least-for"
        );
        assert!(
            eventually(Duration::from_secs(3), || async {
                raw.exists::<i64, _>(&key).await.unwrap() == 0
            })
            .await
        );

        // A shutdown hands a running job over at once.
        let job = client.job_lock("cancelled");
        let (taken, is_taken) = tokio::sync::oneshot::channel();
        let running = tokio::spawn(async move {
            job.run(async move {
                taken.send(()).unwrap();
                tokio::time::sleep(Duration::from_secs(30)).await
            })
            .await
        });
        is_taken.await.unwrap();
        client.shutdown().await;
        let exists: i64 = raw.exists(&key).await.unwrap();
        assert_eq!(exists, 0, "handed over at shutdown");
        assert!(running.await.unwrap().unwrap().is_lost());
    })
    .await;
}

/// 6. Inspection and force unlock: kind `job`, the holder's host and remaining time, the last
/// tick; a force unlock cancels the running job at once, not at its next check.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_job_is_inspected_listed_and_force_unlocked() {
    bounded(async {
        let server = RedisServer::start();
        let client = server.lock_client(Duration::from_secs(30)).await;
        let operator = server.lock_client(Duration::from_secs(30)).await;
        let job = client
            .job_lock("inspected")
            .host("pod-9")
            .at_most_for(Duration::from_secs(60));
        let tick = SystemTime::UNIX_EPOCH + Duration::from_millis(1_795_000_000_000);
        assert!(job.run_tick(tick, async {}).await.unwrap().is_ran());
        let JobRun::Skipped(skipped) = job.run_tick(tick, async {}).await.unwrap() else {
            panic!("a tick ran twice")
        };
        assert_eq!(skipped.last_tick(), Some(tick));
        let earlier = tick - Duration::from_secs(60);
        assert!(job.run_tick(earlier, async {}).await.unwrap().is_skipped());

        let (taken, is_taken) = tokio::sync::oneshot::channel();
        let dropped = Arc::new(Mutex::new(None));
        let running = tokio::spawn({
            let job = job.clone();
            let dropped = common::DroppedAt(dropped.clone());
            async move {
                job.run_tick(tick + Duration::from_secs(60), async move {
                    let _dropped = dropped;
                    taken.send(()).unwrap();
                    tokio::time::sleep(Duration::from_secs(60)).await;
                })
                .await
                .unwrap()
            }
        });
        is_taken.await.unwrap();
        for inspection in [
            job.inspect().await.unwrap().unwrap(),
            operator.inspect(job.key()).await.unwrap().unwrap(),
            operator.list("job-lock:*").await.unwrap().remove(0),
        ] {
            assert_eq!(inspection.kind, "job");
            assert_eq!(inspection.name, "job-lock:default:inspected");
            let holder = &inspection.holders[0];
            // Its host, as ShedLock's `lockedBy`, is in its value.
            assert_eq!(
                fredlock::JobHolder::from_value(holder.owner.as_str()).host(),
                Some("pod-9")
            );
            assert!(holder.owner.starts_with("ADDED:"), "{}", holder.owner);
            let left = holder.remaining_lease.unwrap();
            assert!(left > Duration::from_secs(55), "{left:?}");
            assert_eq!(
                inspection.details,
                fredlock::Details::Job {
                    last_tick: Some(tick + Duration::from_secs(60))
                }
            );
            assert_eq!(inspection.holders.len(), 1);
            assert_eq!(holder.count, 1, "a run holds the job once");
            let keys: Vec<&str> = inspection.keys.iter().map(|k| k.key.as_str()).collect();
            assert_eq!(
                keys,
                [
                    "job-lock:default:inspected",
                    "fredlock_job_tick:{job-lock:default:inspected}"
                ]
            );
        }
        assert!(operator
            .leaks("job-lock:*", Duration::from_secs(60))
            .await
            .unwrap()
            .is_empty());
        let holder = job.holder().await.unwrap().unwrap();
        assert_eq!(holder.host(), Some("pod-9"));

        let forced_at = Instant::now();
        assert!(operator.force_unlock(job.key()).await.unwrap());
        assert!(running.await.unwrap().is_lost());
        let cancelled = dropped.lock().unwrap().unwrap();
        assert!(
            cancelled - forced_at < Duration::from_secs(1),
            "cancelled {:?} after the force unlock (the watchdog period is 10 s)",
            cancelled - forced_at
        );
        assert!(!job.force_unlock().await.unwrap());
        client.shutdown().await;
        operator.shutdown().await;
    })
    .await;
}

/// A run that gives the job back wakes the waiting instances on the job's own channel with the
/// message `0` (lua/job_lock.lua's layout: nothing but fredlock reads the channel).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_given_back_publishes_0_on_the_jobs_channel() {
    bounded(async {
        let server = RedisServer::start();
        let client = server.lock_client(Duration::from_secs(30)).await;
        let (_subscriber, mut messages) = common::listen(
            &server.url(),
            "fredlock_job__channel:{job-lock:default:told}",
        )
        .await;
        let run = client.job_lock("told").run(async {}).await.unwrap();
        assert!(run.ran().is_some(), "the job ran");
        assert_eq!(common::heard(&mut messages, 1).await, ["0"]);
    })
    .await;
}

/// A force unlock wakes an instance waiting for the job at once: the waiting run starts within
/// 250 ms, although the force unlock comes 50 ms after one of its polls (the next is 450 ms
/// later).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_force_unlock_wakes_a_waiting_run() {
    bounded(async {
        let server = RedisServer::start();
        let holder = server.lock_client(Duration::from_secs(30)).await;
        let waiter = server.lock_client(Duration::from_secs(30)).await;
        let operator = server.lock_client(Duration::from_secs(30)).await;
        // Subscribed before the waiter starts, so that its polls' timing below is its own.
        let (_subscriber, mut messages) = common::listen(
            &server.url(),
            "fredlock_job__channel:{job-lock:default:forced-wait}",
        )
        .await;
        let job = holder.job_lock("forced-wait");
        let (taken, is_taken) = tokio::sync::oneshot::channel();
        let holding = tokio::spawn(async move {
            job.run(async move {
                taken.send(()).unwrap();
                tokio::time::sleep(Duration::from_secs(60)).await;
            })
            .await
            .unwrap()
        });
        is_taken.await.unwrap();
        let job = waiter.job_lock("forced-wait");
        let waiting = tokio::spawn(async move {
            job.run_waiting(Duration::from_secs(10), async { Instant::now() })
                .await
                .unwrap()
                .ran()
                .expect("ran once the job was free")
        });
        // Its polls come every JOB_POLL from its first attempt: 50 ms past the second.
        tokio::time::sleep(fredlock::JOB_POLL + Duration::from_millis(50)).await;
        let forced_at = Instant::now();
        assert!(operator
            .force_unlock("job-lock:default:forced-wait")
            .await
            .unwrap());
        // The wake-up is the job's own message, as a run given back sends it (the woken run
        // gives the job back, too: only the first message is the force unlock's).
        let first = tokio::time::timeout(Duration::from_secs(5), messages.recv())
            .await
            .expect("the force unlock publishes")
            .unwrap();
        assert_eq!(first.value.as_string().as_deref(), Some("0"));
        let started = waiting.await.unwrap();
        let woken = started.saturating_duration_since(forced_at);
        assert!(
            woken < Duration::from_millis(250),
            "woken {woken:?} after the force unlock"
        );
        assert!(holding.await.unwrap().is_lost());
        println!("the waiting run started {woken:?} after the force unlock");
    })
    .await;
}

/// Bad settings are refused before anything is sent, naming the job; a key of another type
/// is reported, not overwritten.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_settings_are_refused_and_change_nothing() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = server.lock_client(Duration::from_secs(30)).await;
        let refused = |run: fredlock::Result<JobRun<()>>| match run {
            Err(Error::InvalidArgument(message)) => message,
            other => panic!("not refused: {other:?}"),
        };
        let message = refused(client.job_lock("").run(async {}).await);
        assert!(
            message.contains("a job lock's name must not be empty"),
            "names the name, not the key: {message}"
        );
        let message = refused(client.job_lock("j").host("a:b").run(async {}).await);
        assert!(message.contains("\"a:b\""), "{message}");
        let message = refused(
            client
                .job_lock("j")
                .at_most_for(Duration::from_secs(1))
                .at_least_for(Duration::from_secs(2))
                .run(async {})
                .await,
        );
        assert!(message.contains("at_least_for"), "{message}");
        let message = refused(
            client
                .job_lock("j")
                .at_most_for(Duration::from_secs(1))
                .keep_alive(Duration::from_secs(60))
                .run(async {})
                .await,
        );
        assert!(message.contains("watchdog lease"), "{message}");
        let message = refused(
            client
                .job_lock("j")
                .at_most_for(Duration::ZERO)
                .run(async {})
                .await,
        );
        assert!(message.contains("job-lock:default:j"), "{message}");
        let message = refused(
            client
                .job_lock("j")
                .run_tick(SystemTime::UNIX_EPOCH - Duration::from_secs(1), async {})
                .await,
        );
        assert!(message.contains("epoch"), "{message}");
        assert!(common::all_keys(&raw).await.is_empty());

        let _: i64 = raw
            .hset("job-lock:default:hash", ("field", 1))
            .await
            .unwrap();
        let run = client.job_lock("hash").run(async {}).await;
        assert!(
            matches!(run, Err(Error::WrongType { .. }) | Err(Error::Redis { .. })),
            "{run:?}"
        );
        let kind: String = raw.r#type("job-lock:default:hash").await.unwrap();
        assert_eq!(kind, "hash");
        // A refused SET took nothing: no hold was kept, not even one to give back (the call's
        // turn on the ledger is let go as its task ends, which may be just after the reply).
        assert_eq!(client.stats().held, 0, "{:?}", client.stats());
        assert!(
            eventually(Duration::from_secs(2), || async { common::idle(&client) }).await,
            "{:?}",
            client.stats()
        );
        client.shutdown().await;
    })
    .await;
}

/// The uncontended run is ShedLock's `SET NX PX` (no script) and one compare-and-delete: two
/// round trips, as rslock's lock+unlock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_run_is_one_set_and_one_script_call() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        // A watchdog period (a third of the lease) longer than the test: no check of the held
        // job's key is counted with the runs.
        let client = server.lock_client(Duration::from_secs(600)).await;
        let job = client.job_lock("cost");
        // The first run loads the release script and subscribes the client's own channel
        // (in the background: waited for, so that its SUBSCRIBE is not counted below).
        assert!(job.run(async {}).await.unwrap().is_ran());
        common::listening_for_force_unlocks(&raw, &client).await;
        let before = common::command_calls(&raw).await;
        for _ in 0..10 {
            assert!(job.run(async {}).await.unwrap().is_ran());
        }
        let delta = common::commands_since(&raw, &before).await;
        // The SET, the script call, and what the script ran inside it (GET, DEL, PUBLISH).
        let expected: Vec<(String, u64)> = ["del", "evalsha", "get", "publish", "set"]
            .iter()
            .map(|name| (name.to_string(), 10))
            .collect();
        assert_eq!(delta, expected);
        client.shutdown().await;
    })
    .await;
}

/// A run whose reply was lost on the way back fails (it does not know whether it took the job),
/// and the value its call may have set is deleted at once (the engine's settle of a lost reply),
/// so the job is free again rather than after `at_most_for`; a tick whose reply was lost counts
/// as run, as a cancelled one does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_reply_was_lost_fails_and_leaves_nothing() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let proxy = common::StallingProxy::start(server.port());
        let client =
            common::configured_client(proxy.url(), |b| b.command_timeout(Duration::from_secs(1)))
                .await;
        let job = client
            .job_lock("lost-reply")
            .at_most_for(Duration::from_secs(60));
        let key = "job-lock:default:lost-reply";
        let freed = || async {
            eventually(Duration::from_secs(5), || async {
                !raw.exists::<bool, _>(key).await.unwrap()
            })
            .await
        };
        let tick = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        // The scripts cached and the client's own channel subscribed first, so that the reply
        // lost below is the attempt's own.
        assert!(job.run_tick(tick, async {}).await.unwrap().is_ran());
        assert!(job.run(async {}).await.unwrap().is_ran());
        common::listening_for_force_unlocks(&raw, &client).await;

        for lost in ["SET", "tick"] {
            common::quiet(&client).await;
            let next = tick + Duration::from_secs(60);
            proxy.lose_next_reply();
            let failed = match lost {
                "SET" => job.run(async { 1 }).await,
                _ => job.run_tick(next, async { 1 }).await,
            };
            assert!(!proxy.reply_pending_loss(), "{lost}: the reply was lost");
            assert!(failed.is_err(), "{lost}: {failed:?}");
            assert!(freed().await, "{lost}: the value its call set was deleted");
        }
        assert!(matches!(
            job.run(async { 2 }).await.unwrap(),
            JobRun::Ran(2)
        ));
        let next = tick + Duration::from_secs(60);
        match job.run_tick(next, async { 3 }).await.unwrap() {
            JobRun::Skipped(skipped) => assert_eq!(skipped.last_tick(), Some(next)),
            other => panic!("a tick whose reply was lost ran again: {other:?}"),
        }
        client.shutdown().await;
    })
    .await;
}

/// The tick script, called by hand: the same run's attempt sent again (after a lost reply, by
/// a run that waits) finds the job its first attempt took and wins again, restarting the
/// expiry; another run is refused with the last tick, a string; while another run holds the
/// job for an earlier tick, an attempt for a later one is told how long to sleep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tick_script_replies_in_the_engines_shape_and_takes_a_resend() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let tick = fredlock::script_source("job_tick").unwrap();
        let keys = vec![
            "job-lock:default:t",
            "fredlock_job_tick:{job-lock:default:t}",
        ];
        let call = |value: &'static str, at_most_for: i64, tick_ms: i64| {
            let raw = raw.clone();
            let keys = keys.clone();
            async move {
                let reply: Value = raw
                    .eval(
                        tick,
                        keys,
                        vec![
                            value.to_string(),
                            at_most_for.to_string(),
                            tick_ms.to_string(),
                            "60000".into(),
                            "500".into(),
                        ],
                    )
                    .await
                    .unwrap();
                reply
            }
        };
        assert_eq!(call("run-a", 20_000, 1_000).await, Value::Null, "taken");
        // The job is born with at-most-for as its expiry, and the tick is kept for its own time.
        let pttl: i64 = raw.pttl(keys[0]).await.unwrap();
        assert!(
            pttl > 19_000 && pttl <= 20_000,
            "at-most-for (PTTL {pttl} ms)"
        );
        let kept: i64 = raw.pttl(keys[1]).await.unwrap();
        assert!(
            kept > 59_000 && kept <= 60_000,
            "the last tick is kept 60 s (PTTL {kept} ms)"
        );
        assert_eq!(
            call("run-a", 40_000, 1_000).await,
            Value::Null,
            "the resend wins"
        );
        let pttl: i64 = raw.pttl(keys[0]).await.unwrap();
        assert!(
            pttl > 20_000,
            "the resend restarted the expiry (PTTL {pttl} ms)"
        );
        assert_eq!(
            call("run-b", 20_000, 1_000).await,
            Value::String("1000".into()),
            "refused with the last tick"
        );
        // The sleep is the job's own time left (200 ms), below the longest sleep (500 ms).
        let _: bool = raw.pexpire(keys[0], 200, None).await.unwrap();
        match call("run-b", 20_000, 2_000).await {
            Value::Integer(ms) => assert!((1..=200).contains(&ms), "{ms}"),
            other => panic!("a later tick waits for the run of an earlier one: {other:?}"),
        }
        let value: String = raw.get(keys[0]).await.unwrap();
        assert_eq!(value, "run-a");
        // A last tick of another type (a user's data) is refused, naming its key.
        let _: () = raw.del(keys[1]).await.unwrap();
        let _: i64 = raw.hset(keys[1], ("field", "value")).await.unwrap();
        let refused: Result<Value, _> = raw
            .eval(
                tick,
                keys.clone(),
                vec!["run-b", "20000", "3000", "60000", "500"],
            )
            .await;
        let shown = refused.expect_err("a hash as the last tick").to_string();
        assert!(
            shown.contains("WRONGTYPE") && shown.contains(keys[1]),
            "{shown}"
        );
    })
    .await;
}

/// The acquire script of a run that waits, called by hand: a free job is taken with the run's
/// value and its at-most-for; the same run's attempt sent again (after a lost reply) wins
/// again and restarts the expiry; another run is told how long to sleep, and the job stays
/// the first run's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_waiting_acquire_script_takes_the_job_and_a_resend() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let acquire = fredlock::script_source("job_acquire").unwrap();
        let key = "job-lock:default:w";
        let call = |value: &'static str, at_most_for: i64| {
            let raw = raw.clone();
            async move {
                let reply: Value = raw
                    .eval(
                        acquire,
                        vec![key],
                        vec![value.to_string(), at_most_for.to_string(), "500".into()],
                    )
                    .await
                    .unwrap();
                reply
            }
        };
        assert_eq!(call("run-a", 20_000).await, Value::Null, "taken");
        let value: Option<String> = raw.get(key).await.unwrap();
        assert_eq!(
            value.as_deref(),
            Some("run-a"),
            "the job holds the run's value"
        );
        let pttl: i64 = raw.pttl(key).await.unwrap();
        assert!(
            pttl > 19_000 && pttl <= 20_000,
            "at-most-for (PTTL {pttl} ms)"
        );
        assert_eq!(call("run-a", 40_000).await, Value::Null, "the resend wins");
        let pttl: i64 = raw.pttl(key).await.unwrap();
        assert!(
            pttl > 39_000 && pttl <= 40_000,
            "the resend restarted the expiry (PTTL {pttl} ms)"
        );
        match call("run-b", 20_000).await {
            Value::Integer(ms) => assert!((1..=500).contains(&ms), "{ms}"),
            other => panic!("another run waits: {other:?}"),
        }
        let value: Option<String> = raw.get(key).await.unwrap();
        assert_eq!(value.as_deref(), Some("run-a"));
    })
    .await;
}

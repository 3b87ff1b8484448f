//! One outage, one answer (issues 42 and 57): every public call against a server that is gone
//! follows the rule the crate docs give ("Outages" in lib.rs), the same on every client library
//! (CI runs this file on fred and again on redis-rs, `FREDLOCK_BACKEND`). A call that waits
//! without a bound (`lock()`, `acquire`, `campaign()`, a latch's `wait()`, ..) waits through the
//! outage and goes on once the server is back; every other call answers `Error::Unavailable`:
//! at once where the client already knows it has no connection (a server killed with SIGKILL,
//! a connection cut by the proxy), a bounded try when its wait ends; otherwise (a server paused
//! with SIGSTOP, which the client cannot tell from a slow one) within the command timeout, a
//! bounded try within its wait plus that.

mod common;

use std::future::Future;
use std::time::{Duration, SystemTime};

use common::{bounded, RedisServer, StallingProxy};
use fredlock::{Error, LockClient, MultiLock, RedisErrorKind};
use tokio::time::Instant;

/// What an answer may take beyond its bound on a loaded machine.
const SLACK: Duration = Duration::from_millis(700);
/// The wait of the bounded tries.
const WAIT: Duration = Duration::from_millis(300);
/// The longest "at once" may take on a loaded machine: well under the command timeout of a
/// client that knows it has no connection ([`Fault::timeout`]), so that a call that waits for
/// the command timeout instead fails the walk.
const AT_ONCE: Duration = Duration::from_millis(1_000);

/// How the server goes away.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// SIGKILL: the connection closes, and the client knows it has none.
    Killed,
    /// SIGSTOP: the connection stays open and nothing answers; the client cannot know.
    Paused,
    /// The fault proxy closes every connection and refuses new ones: the client knows.
    Cut,
}

impl Fault {
    /// Whether the client knows it has no connection once the fault is on.
    fn known(self) -> bool {
        self != Fault::Paused
    }

    /// The clients' command timeout: long where the client knows (a call that waited for it
    /// would show), short where every call waits for it.
    fn timeout(self) -> Duration {
        if self.known() {
            Duration::from_secs(3)
        } else {
            Duration::from_millis(500)
        }
    }

    /// The bound of a call without a wait.
    fn now_bound(self) -> Duration {
        if self.known() {
            AT_ONCE
        } else {
            self.timeout() + SLACK
        }
    }

    /// The bound of a bounded try (its wait, then a call without one).
    fn wait_bound(self) -> Duration {
        WAIT + self.now_bound()
    }
}

async fn client(url: &str, fault: Fault) -> LockClient {
    common::builder()
        .url(url)
        .command_timeout(fault.timeout())
        .build()
        .await
        .unwrap()
}

/// What a call answered, and how long it took.
struct Answer {
    call: &'static str,
    took: Duration,
    outcome: String,
    bound: Duration,
    /// The error's message.
    shown: String,
}

/// Runs `call`, bounded well past the rule, and records its answer.
async fn answer<T, F>(call: &'static str, bound: Duration, future: F) -> Answer
where
    F: Future<Output = fredlock::Result<T>>,
{
    let started = Instant::now();
    // Boxed: sixty calls' futures in one test's future overflow a debug build's stack.
    let answered = tokio::time::timeout(bound * 4, Box::pin(future)).await;
    let shown = match &answered {
        Ok(Err(error)) => error.to_string(),
        _ => String::new(),
    };
    let outcome = match answered {
        // What the last failure meant for the command: never an answer, which is no outage.
        Ok(Err(Error::Unavailable {
            source: Some(source),
            ..
        })) if source.kind() == RedisErrorKind::Refused => format!("Unavailable, but {source}"),
        Ok(Err(Error::Unavailable { .. })) => "Unavailable".to_owned(),
        Ok(Err(error)) => format!("Err({error})"),
        Ok(Ok(_)) => "Ok".to_owned(),
        Err(_) => format!("no answer in {:?}", bound * 4),
    };
    Answer {
        call,
        took: started.elapsed(),
        outcome,
        bound,
        shown,
    }
}

/// A call that waits without a bound, spawned: it must still be waiting while the server is
/// gone, and succeed once it is back.
type Waiting = (&'static str, tokio::task::JoinHandle<fredlock::Result<()>>);

fn waits<T: Send + 'static>(
    call: &'static str,
    future: impl Future<Output = fredlock::Result<T>> + Send + 'static,
) -> Waiting {
    (call, tokio::spawn(async move { future.await.map(drop) }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_call_follows_the_outage_rule() {
    bounded(walk(Fault::Killed)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_call_follows_the_outage_rule_against_a_paused_server() {
    bounded(walk(Fault::Paused)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_call_follows_the_outage_rule_over_a_cut_connection() {
    bounded(walk(Fault::Cut)).await;
}

/// Walks every public call under `fault`: each call that does not wait without a bound, its
/// answer's kind and time against the rule; then the calls that do, through the outage.
async fn walk(fault: Fault) {
    Box::pin(async {
        let mut server = RedisServer::start();
        // Resumed on every way out: a stopped server would outlive the test. Only the paused
        // fault has one (a killed server's pid may be another process's by the end).
        let paused = (fault == Fault::Paused).then(|| Paused(server.pid()));
        let pid = || paused.as_ref().expect("a paused server").0;
        let proxy = (fault == Fault::Cut).then(|| StallingProxy::start(server.port()));
        let url = proxy
            .as_ref()
            .map_or_else(|| server.url(), StallingProxy::url);
        let c = client(&url, fault).await;
        // What the calls act on, made while the server is up.
        c.semaphore("o:sem").try_set_permits(2).await.unwrap();
        c.permit_semaphore("o:psem")
            .try_set_permits(2)
            .await
            .unwrap();
        c.count_down_latch("o:latch")
            .try_set_count(1)
            .await
            .unwrap();
        let guard = c.lock("o:held").lock().await.unwrap();
        let permit = c.semaphore("o:sem").acquire(1).await.unwrap();
        let leased = c.permit_semaphore("o:psem").acquire().await.unwrap();
        let term = c.leader_election("o:held-term").campaign().await.unwrap();

        assert!(c.stats().connected, "connected before the server goes");
        match fault {
            Fault::Killed => server.kill(),
            Fault::Paused => common::signal(pid(), "STOP"),
            Fault::Cut => proxy.as_ref().expect("the proxy").cut(),
        }
        if fault.known() {
            // The client has seen the connection drop.
            let dropped =
                common::eventually(Duration::from_secs(5), || async { !c.stats().connected }).await;
            assert!(dropped, "the client never saw the server go");
            // A client that knows it has no connection sends nothing, and its answer says so.
            match c.lock("o:unsent").try_lock_now().await {
                Err(Error::Unavailable {
                    source: Some(source),
                    ..
                }) => assert_eq!(source.kind(), RedisErrorKind::NotSent, "{source}"),
                other => panic!("expected Unavailable with its cause, got {other:?}"),
            }
        }

        let t = fault.now_bound();
        let tw = fault.wait_bound();
        let lock = c.lock("o:lock");
        let fair = c.fair_lock("o:fair");
        let fenced = c.fenced_lock("o:fenced");
        let rw = c.rw_lock("o:rw");
        let sem = c.semaphore("o:sem");
        let psem = c.permit_semaphore("o:psem");
        let latch = c.count_down_latch("o:latch");
        let election = c.leader_election("o:leader");
        let job = c.job_lock("o:job");
        let multi = MultiLock::new(vec![c.lock("o:m1"), c.lock("o:m2")]).unwrap();
        // Each part's future is boxed: sixty calls' futures in one poll function overflow a
        // debug build's stack.
        let mut answers = Box::pin(async {
            vec![
                answer("Lock::try_lock_now", t, lock.try_lock_now()).await,
                answer("Lock::try_lock", tw, lock.try_lock(WAIT, None)).await,
                answer(
                    "Lock::try_with_lock",
                    tw,
                    lock.try_with_lock(WAIT, None, |_| async {}),
                )
                .await,
                answer("Lock::is_locked", t, lock.is_locked()).await,
                answer(
                    "Lock::is_held_by_current_task",
                    t,
                    lock.is_held_by_current_task(),
                )
                .await,
                answer("Lock::hold_count", t, lock.hold_count()).await,
                answer("Lock::remaining_lease", t, lock.remaining_lease()).await,
                answer("Lock::force_unlock", t, lock.force_unlock()).await,
                answer("Lock::inspect", t, lock.inspect()).await,
                answer("FairLock::try_lock", tw, fair.try_lock(WAIT, None)).await,
                answer("FencedLock::try_lock_now", t, fenced.try_lock_now()).await,
                answer("FencedLock::last_token", t, fenced.last_token()).await,
                answer(
                    "WriteLock::try_lock",
                    tw,
                    rw.write_lock().try_lock(WAIT, None),
                )
                .await,
                answer("ReadLock::try_lock_now", t, rw.read_lock().try_lock_now()).await,
                answer("RwLock::inspect", t, rw.inspect()).await,
                answer("RwLock::force_unlock", t, rw.force_unlock()).await,
                answer("MultiLock::try_lock_now", t, multi.try_lock_now()).await,
            ]
        })
        .await;
        answers.extend(
            Box::pin(async {
                vec![
                    answer("Semaphore::try_set_permits", t, sem.try_set_permits(3)).await,
                    answer("Semaphore::set_permits", t, sem.set_permits(3)).await,
                    answer("Semaphore::add_permits", t, sem.add_permits(1)).await,
                    answer("Semaphore::release", t, sem.release(1)).await,
                    answer("Semaphore::available_permits", t, sem.available_permits()).await,
                    answer("Semaphore::drain_permits", t, sem.drain_permits()).await,
                    answer("Semaphore::try_acquire_now", t, sem.try_acquire_now(1)).await,
                    answer("Semaphore::try_acquire", tw, sem.try_acquire(1, WAIT)).await,
                    answer("Semaphore::inspect", t, sem.inspect()).await,
                    answer(
                        "PermitSemaphore::try_set_permits",
                        t,
                        psem.try_set_permits(3),
                    )
                    .await,
                    answer("PermitSemaphore::add_permits", t, psem.add_permits(1)).await,
                    answer(
                        "PermitSemaphore::available_permits",
                        t,
                        psem.available_permits(),
                    )
                    .await,
                    answer("PermitSemaphore::release_by_id", t, psem.release_by_id("x")).await,
                    answer(
                        "PermitSemaphore::try_acquire_now",
                        t,
                        psem.try_acquire_now(),
                    )
                    .await,
                    answer(
                        "PermitSemaphore::try_acquire",
                        tw,
                        psem.try_acquire(WAIT, None),
                    )
                    .await,
                    answer("PermitSemaphore::inspect", t, psem.inspect()).await,
                    answer("CountDownLatch::try_set_count", t, latch.try_set_count(2)).await,
                    answer("CountDownLatch::count_down", t, latch.count_down()).await,
                    answer("CountDownLatch::count", t, latch.count()).await,
                    answer("CountDownLatch::try_wait", tw, latch.try_wait(WAIT)).await,
                    answer("CountDownLatch::delete", t, latch.delete()).await,
                    answer("CountDownLatch::inspect", t, latch.inspect()).await,
                ]
            })
            .await,
        );
        answers.extend(
            Box::pin(async {
                vec![
                    answer(
                        "LeaderElection::try_campaign",
                        tw,
                        election.try_campaign(WAIT),
                    )
                    .await,
                    answer("LeaderElection::leader", t, election.leader()).await,
                    answer("LeaderElection::observe", t, election.observe()).await,
                    answer("LeaderElection::force_unlock", t, election.force_unlock()).await,
                    answer("LeaderElection::inspect", t, election.inspect()).await,
                    answer("JobLock::run", t, job.run(async {})).await,
                    answer("JobLock::run_waiting", tw, job.run_waiting(WAIT, async {})).await,
                    answer(
                        "JobLock::run_tick",
                        t,
                        job.run_tick(SystemTime::now(), async {}),
                    )
                    .await,
                    answer("JobLock::holder", t, job.holder()).await,
                    answer("JobLock::inspect", t, job.inspect()).await,
                    answer("JobLock::force_unlock", t, job.force_unlock()).await,
                    answer("LockClient::inspect", t, c.inspect("o:lock")).await,
                    answer("LockClient::list", t, c.list("o:*")).await,
                    answer(
                        "LockClient::leaks",
                        t,
                        c.leaks("o:*", Duration::from_secs(1)),
                    )
                    .await,
                    answer("LockClient::force_unlock", t, c.force_unlock("o:lock")).await,
                    answer("LockGuard::unlock", t, guard.unlock()).await,
                    answer("SemaphorePermit::release", t, permit.release()).await,
                    answer("LeasedPermit::release", t, leased.release()).await,
                    answer("Term::resign", t, term.resign()).await,
                ]
            })
            .await,
        );

        // The calls that wait without a bound, each on a handle of its own.
        let (l, f, s, p, e, m) = (
            c.lock("o:w-lock"),
            c.fair_lock("o:w-fair"),
            c.semaphore("o:sem"),
            c.permit_semaphore("o:psem"),
            c.leader_election("o:w-leader"),
            MultiLock::new(vec![c.lock("o:w-m1"), c.lock("o:w-m2")]).unwrap(),
        );
        let (l2, latch2) = (c.lock("o:w-with"), c.count_down_latch("o:w-latch"));
        let waiting: Vec<Waiting> = vec![
            waits("Lock::lock", async move { l.lock().await }),
            waits("Lock::with_lock", async move {
                l2.with_lock(|_| async {}).await
            }),
            waits("FairLock::lock", async move { f.lock().await }),
            waits("Semaphore::acquire", async move { s.acquire(1).await }),
            waits("PermitSemaphore::acquire", async move { p.acquire().await }),
            waits(
                "LeaderElection::campaign",
                async move { e.campaign().await },
            ),
            waits("MultiLock::lock", async move { m.lock().await }),
            // A latch that does not exist is open: `wait` returns once it can read that.
            waits("CountDownLatch::wait", async move { latch2.wait().await }),
        ];

        // The deployment check diagnoses the connection itself: its own error, as documented,
        // within a command timeout (it connects anew).
        let started = Instant::now();
        let checked = c.check_deployment().await;
        assert!(
            matches!(checked, Err(Error::Redis { .. }))
                && started.elapsed() < fault.timeout() + SLACK,
            "check_deployment: {checked:?} after {:?}",
            started.elapsed()
        );

        let mut broken = Vec::new();
        println!("{fault:?} on {:?}:", common::backend());
        for a in &answers {
            println!("{:<36} {:>8.1?} {}", a.call, a.took, a.outcome);
            if let Some(word) = common::library_word(&a.shown) {
                broken.push(format!(
                    "{}: the message says {word:?}: {}",
                    a.call, a.shown
                ));
            }
            if a.outcome != "Unavailable" || a.took > a.bound {
                broken.push(format!(
                    "{}: {} after {:?} (rule: Unavailable within {:?})",
                    a.call, a.outcome, a.took, a.bound
                ));
            }
        }
        tokio::time::sleep(fault.timeout() * 2).await;
        for (call, task) in &waiting {
            if task.is_finished() {
                broken.push(format!(
                    "{call}: answered during the outage instead of waiting"
                ));
            }
        }
        let set = match fault {
            Fault::Killed => {
                server.start_again();
                // The server came back empty (no persistence): the waiting acquires need
                // permits.
                common::eventually(Duration::from_secs(10), || async {
                    c.semaphore("o:sem").try_set_permits(2).await.is_ok()
                        && c.permit_semaphore("o:psem")
                            .try_set_permits(2)
                            .await
                            .is_ok()
                })
                .await
            }
            // The paused server runs what it was sent once it goes on (a drain among them),
            // and the cut one kept its permits held: the waiting acquires need more.
            Fault::Paused | Fault::Cut => {
                if fault == Fault::Paused {
                    common::signal(pid(), "CONT");
                } else {
                    proxy.as_ref().expect("the proxy").heal();
                }
                common::eventually(Duration::from_secs(10), || async {
                    c.semaphore("o:sem").add_permits(2).await.is_ok()
                        && c.permit_semaphore("o:psem").add_permits(2).await.is_ok()
                })
                .await
            }
        };
        assert!(set, "permits could not be set once the server was back");
        for (call, task) in waiting {
            match tokio::time::timeout(Duration::from_secs(20), task).await {
                Ok(Ok(Ok(()))) => println!("{call:<36} waited through the outage"),
                Ok(Ok(Err(error))) => broken.push(format!("{call}: {error} after the outage")),
                Ok(Err(join)) => broken.push(format!("{call}: {join}")),
                Err(_) => broken.push(format!("{call}: still waiting 20 s after the restart")),
            }
        }
        assert!(
            broken.is_empty(),
            "calls off the rule:\n{}",
            broken.join("\n")
        );
        c.shutdown().await;
    })
    .await;
}

/// A server process that may be stopped: sent SIGCONT when dropped, so that a failing walk
/// leaves no stopped server behind (the server's own handle then kills it).
struct Paused(u32);

impl Drop for Paused {
    fn drop(&mut self) {
        common::signal_quietly(self.0, "CONT");
    }
}

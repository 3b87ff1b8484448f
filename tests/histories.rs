//! The histories: workers on several clients take every kind of lock at random under faults
//! (chaos, pauses of a whole process, server crashes, Sentinel failovers) and record each
//! operation; the checker (`tests/common/history.rs`) then finds any two holders at once, a
//! token out of order, a permit too many or a tick run twice. Each run has a negative control
//! that must show a violation. docs/RELIABILITY.md gives what each run proves and its figures.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use fred::prelude::*;
use fredlock::LockClient;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use common::chaos::{chaos, Rng};
use common::history::{check, Call, Checked, History, Op, Outcome, Violation};
use common::{bounded, KillOnDrop, RedisServer, StallingProxy};

/// A token cancelled at `until`.
fn stop_at(until: Instant) -> CancellationToken {
    let stop = CancellationToken::new();
    let cancel = stop.clone();
    tokio::spawn(async move {
        tokio::time::sleep_until(until).await;
        cancel.cancel();
    });
    stop
}

/// A read-write lock's target in the histories is checked as permits: a read hold takes one, a
/// write hold all of them, so a write beside any other hold goes past the count.
const RW_ALL: u32 = 1000;

/// How many holds each history target allows at once (any other: one).
fn history_limits() -> HashMap<String, u32> {
    HashMap::from([("h-permits".to_string(), 2), ("h-rw".to_string(), RW_ALL)])
}

/// One worker of `histories_under_chaos_show_no_overlap`: takes locks, a fenced lock, the
/// permit semaphore, a fair lock, a read-write lock (reading or writing), leader terms and job ticks at
/// random until `stop`, recording every operation, and the moment a hold's `lost()` fires if
/// it does while held.
async fn history_worker(
    history: History,
    client: LockClient,
    who: String,
    seed: u64,
    stop: CancellationToken,
    work_ms: u64,
) {
    let mut rng = Rng(seed);
    while !stop.is_cancelled() {
        let work = Duration::from_millis(1 + rng.below(work_ms));
        let wait = Duration::from_millis(200 + rng.below(800));
        let lease = (rng.below(3) == 0).then_some(Duration::from_millis(1500));
        let hold = Hold {
            history: &history,
            who: &who,
            work,
        };
        match rng.below(9) {
            0 | 1 => {
                let name = format!("h-lock-{}", rng.below(2));
                let lock = client.lock(&name);
                let call = lock.try_lock(wait, lease);
                hold.run(&name, 1, call, |_| None, |g| g.is_lost(), |g| g.unlock())
                    .await;
            }
            2 | 3 => {
                let lock = client.fenced_lock("h-fenced");
                let call = lock.try_lock(wait, lease);
                let token = |guard: &fredlock::FencedGuard| Some(guard.token());
                hold.run("h-fenced", 1, call, token, |g| g.is_lost(), |g| g.unlock())
                    .await;
            }
            4 => {
                let permits = client.permit_semaphore("h-permits");
                let call = permits.try_acquire(wait, lease);
                hold.run(
                    "h-permits",
                    1,
                    call,
                    |_| None,
                    |p| p.is_lost(),
                    |p| p.release(),
                )
                .await;
            }
            5 => {
                let lock = client.fair_lock("h-fair");
                let call = lock.try_lock(wait, lease);
                hold.run("h-fair", 1, call, |_| None, |g| g.is_lost(), |g| g.unlock())
                    .await;
            }
            8 => {
                let election = client.leader_election("h-leader");
                hold.run_term(election.try_campaign(wait)).await;
            }
            6 => {
                let lock = client.rw_lock("h-rw").read_lock();
                let call = lock.try_lock(wait, lease);
                hold.run("h-rw", 1, call, |_| None, |g| g.is_lost(), |g| g.unlock())
                    .await;
            }
            _ => {
                let lock = client.rw_lock("h-rw").write_lock();
                let call = lock.try_lock(wait, lease);
                hold.run(
                    "h-rw",
                    RW_ALL,
                    call,
                    |_| None,
                    |g| g.is_lost(),
                    |g| g.unlock(),
                )
                .await;
            }
        }
    }
}

/// One history worker's hold: what it records under, and how long it works while it holds.
struct Hold<'a> {
    history: &'a History,
    who: &'a str,
    work: Duration,
}

impl Hold<'_> {
    /// Takes `target` with `call` (recorded with `permits` of its count and the guard's
    /// `token`), works while the hold stands (`is_lost`), then gives it back with `release`
    /// (recorded); nothing when the call took nothing.
    async fn run<G, E: std::fmt::Debug, R, F>(
        &self,
        target: &str,
        permits: u32,
        call: impl std::future::Future<Output = Result<Option<G>, E>>,
        token: impl Fn(&G) -> Option<u64>,
        is_lost: impl Fn(&G) -> bool,
        release: R,
    ) where
        R: FnOnce(G) -> F,
        F: std::future::Future<Output = Result<(), E>>,
    {
        let (history, who) = (self.history, self.who);
        let asked = history.now();
        let (id, guard) = history.acquire(who, target, permits, call, token).await;
        let Some(guard) = guard else { return };
        let work = self.work;
        let standing = work_while_held(history, id, who, target, asked, work, || is_lost(&guard));
        if let (Some(standing), true) = (standing.await, is_lost(&guard)) {
            // Paused between its last step and the release: it did nothing as holder since.
            history.lost_at(id, who, target, standing);
        }
        history.release(id, who, target, release(guard)).await;
    }
}

impl Hold<'_> {
    /// A leader's term, as a hold whose token is its epoch: taken with `call`, worked in while
    /// it stands, then a guarded write (`eval_while_held`) before it is resigned. A write the
    /// server refuses (`NotHeld`: the term is over there) while the guard still believes is
    /// how its owner learns the loss: recorded at the write ([`Call::WriteRefused`]).
    async fn run_term(
        &self,
        call: impl std::future::Future<Output = fredlock::Result<Option<fredlock::Term>>>,
    ) {
        let (history, who, target) = (self.history, self.who, "h-leader");
        let asked = history.now();
        let epoch = |term: &fredlock::Term| Some(term.epoch());
        let (id, term) = history.acquire(who, target, 1, call, epoch).await;
        let Some(term) = term else { return };
        let standing = work_while_held(history, id, who, target, asked, self.work, || {
            term.is_lost()
        });
        if let (Some(_), false) = (standing.await, term.is_lost()) {
            let at = history.now();
            let write = term
                .eval_while_held::<i64, _, _>(
                    "return redis.call('incr', KEYS[1])",
                    ["{h-leader}:writes"],
                    Vec::<String>::new(),
                )
                .await;
            if let Err(fredlock::Error::NotHeld { .. }) = write {
                history.write_refused_at(id, who, target, at);
            } else if term.is_lost() {
                // Paused during the write or after it (a write cut short by the command
                // timeout tells nothing): the write is guarded by the server, and the owner
                // did nothing else as holder since it last found the term standing.
                history.lost_at(id, who, target, at);
            }
        }
        history.release(id, who, target, term.resign()).await;
    }
}

/// Works as the holder of hold `id` for `work`, finding the hold standing (`is_lost()` false)
/// before every step of at most 5 ms; if it finds it lost, records that its owner believed it
/// held until the last step that found it standing. The owner acts as holder only in steps that
/// found it standing: a process paused between two steps did nothing as a holder while paused,
/// and its first step after the pause finds the hold lost if its renew deadline passed (the
/// guard compares the deadline with the clock, whatever the watchdog has done since).
///
/// A hold found lost by its first step never stood if that step came at least
/// [`NEVER_STOOD_AFTER`] after the call was invoked (its owner was paused between the call's
/// answer and that step, past the deadline the guard counts from the call's send, which is
/// after `asked`): recorded as [`Call::NeverStood`] at `asked`, so it holds for no time, and
/// counted. Found lost sooner, the hold cannot have passed its deadline: it stood from the
/// answer until that step, and is checked as every hold is.
///
/// Returns when its last step found the hold standing, `None` when it recorded a loss: the
/// caller that finds the hold lost after that records its loss there, since a process paused
/// between that step and its release did nothing as holder while paused.
async fn work_while_held(
    history: &History,
    id: u64,
    who: &str,
    name: &str,
    asked: Duration,
    work: Duration,
    is_lost: impl Fn() -> bool,
) -> Option<Duration> {
    let until = Instant::now() + work;
    let mut standing: Option<Duration> = None;
    loop {
        if is_lost() {
            let now = history.now();
            match standing {
                Some(standing) => history.lost_at(id, who, name, standing),
                None if now.saturating_sub(asked) >= NEVER_STOOD_AFTER => {
                    history.never_stood(id, who, name, asked)
                }
                None => history.lost_at(id, who, name, now),
            }
            return None;
        }
        standing = Some(history.now());
        let now = Instant::now();
        if now >= until {
            return standing;
        }
        tokio::time::sleep((until - now).min(Duration::from_millis(5))).await;
    }
}

/// How long after a call's invoke its hold may have passed its deadline: the renew deadline of
/// `history_settings` (two thirds of its watchdog lease), below the workers' fixed lease.
const NEVER_STOOD_AFTER: Duration = Duration::from_millis(1000);

/// A history client's settings: a watchdog lease of 1.5 s (renew deadline 1 s), queue places of
/// 1 s, a command timeout of 500 ms.
fn history_settings(builder: fredlock::LockClientBuilder) -> fredlock::LockClientBuilder {
    builder
        .watchdog_lease(Duration::from_millis(1500))
        .queue_place(Duration::from_secs(1))
        .command_timeout(Duration::from_millis(500))
}

/// Three clients (the `c`-th at `url(c)`) of three `history_worker` tasks each, holding for up
/// to `work_ms`, and one `history_ticks` instance each, recording into `history` until `stop`;
/// the first client sets the permit semaphore's 2 permits. `configure` adds to each client's
/// settings.
async fn history_clients(
    history: &History,
    url: impl Fn(u64) -> String,
    stop: &CancellationToken,
    seed: u64,
    work_ms: u64,
    configure: fn(fredlock::LockClientBuilder) -> fredlock::LockClientBuilder,
) -> (Vec<LockClient>, Vec<tokio::task::JoinHandle<()>>) {
    let mut clients = Vec::new();
    let mut tasks = Vec::new();
    for c in 0..3u64 {
        let locks = common::configured_client(url(c), |b| configure(history_settings(b))).await;
        if c == 0 {
            assert!(locks
                .permit_semaphore("h-permits")
                .try_set_permits(2)
                .await
                .unwrap());
        }
        for t in 0..3u64 {
            tasks.push(tokio::spawn(history_worker(
                history.clone(),
                locks.clone(),
                format!("c{c}/t{t}"),
                seed + c * 10 + t,
                stop.clone(),
                work_ms,
            )));
        }
        tasks.push(tokio::spawn(history_ticks(
            history.clone(),
            locks.clone(),
            format!("c{c}/job"),
            stop.clone(),
        )));
        clients.push(locks);
    }
    (clients, tasks)
}

/// One instance of a scheduled job for `histories_under_chaos_show_no_overlap`: runs every
/// 100 ms tick with `run_tick`, recording each run (a tick must run once, anywhere).
async fn history_ticks(history: History, client: LockClient, who: String, stop: CancellationToken) {
    // A run takes 5 ms. A release that a failover undoes (README: "a release not confirmed
    // may be undone by a failover until the lock's lease ends") keeps the job until then.
    let job = client.job_lock("h-job").at_most_for(Duration::from_secs(2));
    let period = 100u64;
    while !stop.is_cancelled() {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        let tick = now / period * period;
        let at = std::time::UNIX_EPOCH + Duration::from_millis(tick);
        let id = history.id();
        let invoke = history.now();
        let run = job
            .run_tick(at, tokio::time::sleep(Duration::from_millis(5)))
            .await;
        history.record(Op {
            id,
            client: who.clone(),
            target: "h-job".into(),
            call: Call::Run { tick },
            invoke,
            ret: history.now(),
            outcome: match run {
                // A run that started and was lost ran its tick as much as one that ended: both
                // are runs of it.
                Ok(run) if run.is_ran() || run.is_lost() => Outcome::Ok,
                Ok(_) => Outcome::Refused,
                Err(error) => Outcome::Failed(error.to_string()),
            },
            token: None,
        });
        tokio::time::sleep(Duration::from_millis(
            period + 7 - (now % period).min(period),
        ))
        .await;
    }
}

/// 4. Histories (issue 35): three clients of three tasks each take two locks, a fenced lock, a
/// permit semaphore of 2 permits, a fair lock and a read-write lock (reading or writing), and
/// run a job every 100 ms tick, for 12 s while connections
/// are killed and the server stalls, and the third client's replies are lost, its connection
/// stalled and cut by a proxy; every operation is recorded with its invoke and return
/// instants, and the checker finds no two holds of a lock at once (a hold ends at its release's
/// invoke or its `lost()`), no write beside another hold, no token below one returned earlier,
/// never more than 2 permits out, and no tick run twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn histories_under_chaos_show_no_overlap() {
    bounded(async {
        let server = RedisServer::start_with_debug();
        // The third client talks through a proxy that loses replies, stalls and cuts.
        let proxy = std::sync::Arc::new(StallingProxy::start(server.port()));
        let history = History::new();
        let until = Instant::now() + Duration::from_secs(12);
        let urls = |c| if c == 2 { proxy.url() } else { server.url() };
        let (clients, tasks) = history_clients(&history, urls, &stop_at(until), 1, 10, |b| b).await;
        let network = tokio::spawn({
            let proxy = proxy.clone();
            async move {
                let mut rng = Rng(23);
                let mut steps: HashMap<&'static str, u32> = HashMap::new();
                while Instant::now() < until {
                    tokio::time::sleep(Duration::from_millis(150 + rng.below(200))).await;
                    let step = match rng.below(4) {
                        0 => {
                            proxy.lose_next_reply();
                            "lose a reply"
                        }
                        1 => {
                            proxy.stall();
                            tokio::time::sleep(Duration::from_millis(100 + rng.below(500))).await;
                            proxy.resume();
                            "stall"
                        }
                        2 => {
                            proxy.cut();
                            tokio::time::sleep(Duration::from_millis(50 + rng.below(200))).await;
                            proxy.heal();
                            "cut"
                        }
                        _ => "nothing",
                    };
                    *steps.entry(step).or_insert(0) += 1;
                }
                steps
            }
        });
        let steps = chaos(
            common::resilient_client(&server.url()).await,
            until,
            11,
            CancellationToken::new(),
        )
        .await;
        let network = network.await.unwrap();
        for task in tasks {
            task.await.unwrap();
        }
        let ops = history.ops();
        let checked =
            check(&ops, &history_limits()).unwrap_or_else(|violation| panic!("{violation}"));
        let failed = ops
            .iter()
            .filter(|op| matches!(op.outcome, Outcome::Failed(_)))
            .count();
        println!(
            "histories: {} operations ({failed} failed), {checked:?}, chaos {steps:?}, \
             network {network:?}",
            ops.len()
        );
        assert!(checked.holds > 300, "{checked:?}");
        assert!(checked.tokens > 50 && checked.runs > 50, "{checked:?}");
        for client in clients {
            client.shutdown().await;
        }
    })
    .await;
}

/// The child of `histories_under_pauses_show_no_overlap`: one client (`history_settings`) at
/// `FREDLOCK_HISTORY_URL` of three `history_worker` tasks and a `history_ticks` instance for
/// `FREDLOCK_HISTORY_MS`, then its history on stdout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by histories_under_pauses_show_no_overlap as a child process"]
async fn history_child() {
    let (Ok(url), Ok(run_ms)) = (
        std::env::var("FREDLOCK_HISTORY_URL"),
        std::env::var("FREDLOCK_HISTORY_MS"),
    ) else {
        return;
    };
    let history = History::new();
    let stop = stop_at(Instant::now() + Duration::from_millis(run_ms.parse().unwrap()));
    let locks = common::configured_client(url, history_settings).await;
    let mut tasks = Vec::new();
    for t in 0..3u64 {
        let who = format!("child/t{t}");
        let worker = history_worker(
            history.clone(),
            locks.clone(),
            who,
            100 + t,
            stop.clone(),
            50,
        );
        tasks.push(tokio::spawn(worker));
    }
    let ticks = history_ticks(history.clone(), locks.clone(), "child/job".into(), stop);
    tasks.push(tokio::spawn(ticks));
    for task in tasks {
        task.await.unwrap();
    }
    locks.shutdown().await;
    print!("{}", history.lines());
}

/// 4d. Histories under pauses: three clients in this process, and a fourth in a child process
/// that is stopped (SIGSTOP) for 0.3–2.3 s at random moments, often past its renew deadline
/// (1 s) and its lease (1.5 s), while all four take the locks, the fenced lock, the permits,
/// the fair and the read-write lock and the job ticks; the checker finds no two holds at once, no token out of order, no third
/// permit and no tick twice. A hold ends where its owner last found it standing before it
/// learnt of the loss (`work_while_held`): a stopped process does nothing as a holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn histories_under_pauses_show_no_overlap() {
    bounded(async {
        let server = RedisServer::start();
        let history = History::new();
        let run = Duration::from_secs(12);
        let until = Instant::now() + run;
        let url = |_| server.url();
        let (clients, tasks) = history_clients(&history, url, &stop_at(until), 31, 10, |b| b).await;
        let env = [
            ("FREDLOCK_HISTORY_URL", server.url()),
            ("FREDLOCK_HISTORY_MS", run.as_millis().to_string()),
        ];
        let mut child = KillOnDrop(
            common::test_child("history_child", &env)
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap(),
        );
        let pid = child.0.id();
        let mut stdout = child.0.stdout.take().unwrap();
        let output = tokio::task::spawn_blocking(move || {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut stdout, &mut text).map(|_| text)
        });
        // Started, connected and taking locks before the first pause.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let mut rng = Rng(37);
        let mut pauses = Vec::new();
        while Instant::now() + Duration::from_millis(1500) < until {
            tokio::time::sleep(Duration::from_millis(200 + rng.below(600))).await;
            let pause = Duration::from_millis(300 + rng.below(2000));
            common::signal(pid, "STOP");
            tokio::time::sleep(pause).await;
            common::signal(pid, "CONT");
            pauses.push(pause.as_millis() as u64);
        }
        for task in tasks {
            task.await.unwrap();
        }
        let output = tokio::time::timeout(Duration::from_secs(30), output)
            .await
            .expect("the child ends")
            .unwrap()
            .unwrap();
        let status = child.0.wait().unwrap();
        assert!(status.success(), "the child failed: {status:?}");
        let joined = history.join_lines(&output);
        let ops = history.ops();
        let checked =
            check(&ops, &history_limits()).unwrap_or_else(|violation| panic!("{violation}"));
        let child_ops = |call: Call| {
            ops.iter()
                .filter(|op| op.client.starts_with("child") && op.call == call)
                .filter(|op| op.outcome == Outcome::Ok)
                .count()
        };
        let (child_holds, child_losses) = (
            child_ops(Call::Acquire { permits: 1 }),
            child_ops(Call::Lost) + child_ops(Call::NeverStood),
        );
        println!(
            "pauses: {} operations ({joined} from the paused child: {child_holds} holds, \
             {child_losses} lost), {checked:?}, pauses of {pauses:?} ms",
            ops.len()
        );
        assert!(pauses.len() >= 4, "{pauses:?}");
        assert!(
            child_holds > 20,
            "the paused child held too little: {child_holds}"
        );
        assert!(
            child_losses > 0,
            "no pause outlasted a hold's renew deadline"
        );
        assert!(
            checked.holds > 200 && checked.tokens > 20 && checked.runs > 50,
            "{checked:?}"
        );
        for client in clients {
            client.shutdown().await;
        }
    })
    .await;
}

/// Three clients of three tasks take the locks (each hold lasting up to `work_ms`), the fenced
/// lock, the permits, the fair and the read-write lock and the job ticks for [`CRASH_RUN`]
/// while the lock server is killed (SIGKILL) and restarted on the same port and directory every 1.5 s or so, each time the moment an
/// acquisition has returned (or after 0.5 s without one), persisting (`appendfsync always`) or
/// not; what the history checker says, how many crashes there were and how many came right
/// after an acquisition.
async fn history_across_crashes(
    persist: bool,
    work_ms: u64,
) -> (Result<Checked, Violation>, u32, u32, Vec<Op>) {
    let persistence: &[&str] = if persist {
        &["--appendonly", "yes", "--appendfsync", "always"]
    } else {
        &["--appendonly", "no"]
    };
    let mut server = RedisServer::start_with(persistence, common::free_port);
    let url = server.url();
    let run_id = |raw: Client| async move {
        let info: String = raw.info(Some(fred::types::InfoKind::Server)).await.unwrap();
        info.lines()
            .find_map(|line| line.strip_prefix("run_id:"))
            .unwrap()
            .trim()
            .to_owned()
    };
    let first_run = run_id(server.raw().await).await;
    let history = History::new();
    let until = Instant::now() + CRASH_RUN;
    let stop = stop_at(until);
    let (clients, tasks) =
        history_clients(&history, |_| url.clone(), &stop, 100, work_ms, |b| b).await;
    let mut acquisitions = history.acquisitions();
    let (mut crashes, mut right_after) = (0, 0);
    while Instant::now() + Duration::from_millis(1500) < until {
        tokio::time::sleep(Duration::from_secs(1)).await;
        acquisitions.borrow_and_update();
        let after = tokio::time::timeout(Duration::from_millis(500), acquisitions.changed())
            .await
            .is_ok();
        // SIGKILL, then the same port and directory.
        tokio::task::block_in_place(|| server.start_again());
        crashes += 1;
        right_after += u32::from(after);
    }
    assert_ne!(run_id(server.raw().await).await, first_run, "restarted");
    let (verdict, ops) = history_checked(&history, clients, tasks).await;
    (verdict, crashes, right_after, ops)
}

/// Waits for `history_clients`' tasks to end (they stop at their token), shuts the clients down
/// and checks the history: what the checker says, and the operations.
async fn history_checked(
    history: &History,
    clients: Vec<LockClient>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
) -> (Result<Checked, Violation>, Vec<Op>) {
    for task in tasks {
        task.await.unwrap();
    }
    for client in clients {
        client.shutdown().await;
    }
    let ops = history.ops();
    (check(&ops, &history_limits()), ops)
}

/// How long a hold of the crash runs lasts at most: long enough that, without persistence, one
/// outlives a restart and its negative control shows two holders; the run with persistence
/// holds as long, so it passes the same hazard.
const CRASH_WORK_MS: u64 = 1000;

/// How long a crash run lasts: with holds of up to [`CRASH_WORK_MS`], long enough for the
/// counts its test asks of it (more than 100 holds and 20 tokens; 12 s gave 113 and 23).
const CRASH_RUN: Duration = Duration::from_secs(20);

/// 5. Histories across server crashes (issue 35): persisting with `appendfsync always`, every
/// hold survives the restart or is known lost, so the history shows no two holds at once, no
/// token out of order, no third permit and no tick twice; holds as long as the negative control
/// needs ([`CRASH_WORK_MS`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn histories_across_server_crashes_show_no_overlap() {
    bounded(async {
        let (verdict, crashes, right_after, ops) =
            history_across_crashes(true, CRASH_WORK_MS).await;
        let checked = verdict.unwrap_or_else(|violation| panic!("{violation}"));
        let failed = ops
            .iter()
            .filter(|op| matches!(op.outcome, Outcome::Failed(_)))
            .count();
        println!(
            "histories across {crashes} crashes ({right_after} right after an acquisition): \
             {} operations ({failed} failed), {checked:?}",
            ops.len()
        );
        assert!(crashes >= 6, "{crashes} crashes");
        assert!(right_after >= 3, "{right_after} right after an acquisition");
        assert!(checked.holds > 100 && checked.tokens > 20, "{checked:?}");
    })
    .await;
}

/// The negative control of the crash histories: without persistence a restart forgets the
/// holds and the ticks, another client takes a lock its holder still works under (holds of up
/// to [`CRASH_WORK_MS`], so that one outlives the restart), and the checker shows it: the hazard
/// of a server that keeps nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_persistence_a_crash_shows_two_holders_in_the_history() {
    bounded(shows_a_violation(|| async {
        let (verdict, crashes, right_after, _) = history_across_crashes(false, CRASH_WORK_MS).await;
        let run = format!(
            "{crashes} crashes ({right_after} right after an acquisition) without persistence"
        );
        (verdict, run)
    }))
    .await;
}

/// A negative control's runs: whether a fault lands where it shows is chance (a holder that
/// renews first learns its loss in time), so `run` is made up to three times until the checker
/// finds a violation (two holders at once, a token out of order, permits past their count or a
/// tick run twice: whichever target it reads first), printed with what `run` says of itself;
/// one such run is the proof, three clean runs fail the test.
async fn shows_a_violation<F, Run>(mut run: F)
where
    F: FnMut() -> Run,
    Run: std::future::Future<Output = (Result<Checked, Violation>, String)>,
{
    let mut clean = Vec::new();
    for _ in 0..3 {
        match run().await {
            (Err(violation), what) => {
                println!("across {what}: {violation}");
                return;
            }
            (Ok(checked), what) => clean.push(format!("{what}: {checked:?}")),
        }
    }
    panic!("no violation in three runs: {clean:?}");
}

/// The negative control of the history checker on real runs: a client that ignores its loss
/// (works on past a 2 s lease while another takes the lock) shows as two holds at once, with
/// the stretch of history that shows it; the same run recording the loss is clean. The lease
/// is long enough that the early margin of a fixed lease (2 ms and 1 % of it, 22 ms) covers
/// the wake-up of a busy machine: with 150 ms (3.5 ms), one run in 30 on an idle 2-core machine
/// saw its loss after the other took the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_that_ignores_its_loss_shows_in_the_history() {
    const LEASE: Duration = Duration::from_secs(2);
    bounded(async {
        let server = RedisServer::start();
        for careful in [false, true] {
            let history = History::new();
            let (a, b) = (
                server.lock_client(Duration::from_secs(10)).await,
                server.lock_client(Duration::from_secs(10)).await,
            );
            let lock = a.lock("h-careless");
            let (id, guard) = history
                .acquire(
                    "a",
                    "h-careless",
                    1,
                    async { lock.lock_with_lease(LEASE).await.map(Some) },
                    |_| None,
                )
                .await;
            let guard = guard.unwrap();
            let other = tokio::spawn({
                let history = history.clone();
                let lock = b.lock("h-careless");
                async move {
                    let (id, guard) = history
                        .acquire("b", "h-careless", 1, lock.try_lock(LEASE * 2, None), |_| {
                            None
                        })
                        .await;
                    let guard = guard.expect("taken after the lease");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    history.release(id, "b", "h-careless", guard.unlock()).await;
                }
            });
            // Works 400 ms past the lease; a careful worker stops believing at `lost()`.
            tokio::select! {
                _ = tokio::time::sleep(LEASE + Duration::from_millis(400)) => {}
                _ = guard.lost(), if careful => history.lost(id, "a", "h-careless"),
            }
            if careful {
                tokio::time::sleep(Duration::from_millis(400)).await;
            }
            other.await.unwrap();
            history.release(id, "a", "h-careless", guard.unlock()).await;
            let verdict = check(&history.ops(), &HashMap::new());
            match (careful, verdict) {
                (true, Ok(checked)) => assert_eq!(checked.holds, 2),
                (false, Err(violation)) => {
                    println!("{violation}");
                    assert!(violation.what.contains("at once"), "{violation}");
                    let clients: Vec<&str> = violation
                        .window
                        .iter()
                        .map(|op| op.client.as_str())
                        .collect();
                    assert!(
                        clients.contains(&"a") && clients.contains(&"b"),
                        "{violation}"
                    );
                }
                (careful, verdict) => panic!("careful {careful}: {verdict:?}"),
            }
            a.shutdown().await;
            b.shutdown().await;
        }
    })
    .await;
}

/// The history checker on histories written by hand: a clean one passes; two holds at once,
/// a third permit of two, a token below one returned earlier and a tick run twice each fail,
/// naming what and showing the operations that show it.
#[test]
fn the_history_checker_finds_what_it_must() {
    let ms = Duration::from_millis;
    let op = |id, client: &str, target: &str, call, invoke, ret, token| Op {
        id,
        client: client.into(),
        target: target.into(),
        call,
        invoke: ms(invoke),
        ret: ms(ret),
        outcome: Outcome::Ok,
        token,
    };
    let acquire = Call::Acquire { permits: 1 };
    // a holds 10..20 (released at 20), b acquires at 15 and returns at 21: clean.
    let clean = vec![
        op(1, "a", "l", acquire, 0, 10, Some(1)),
        op(1, "a", "l", Call::Release, 20, 22, None),
        op(2, "b", "l", acquire, 15, 21, Some(2)),
        op(2, "b", "l", Call::Lost, 30, 30, None),
        op(3, "c", "l", acquire, 25, 31, Some(3)),
        op(3, "c", "l", Call::Release, 40, 41, None),
        op(4, "a", "job", Call::Run { tick: 100 }, 0, 5, None),
        op(5, "b", "job", Call::Run { tick: 200 }, 0, 5, None),
    ];
    let none = HashMap::new();
    assert_eq!(
        check(&clean, &none).unwrap(),
        common::history::Checked {
            holds: 3,
            tokens: 3,
            runs: 2,
            never_stood: 0,
            writes_refused: 0,
        }
    );
    // a's guarded write is refused at 14: it believed until then, and b, returning at 15 from
    // an acquisition invoked at 12, overlaps nothing; the refusal is counted.
    let mut refused = clean.clone();
    refused[1] = op(1, "a", "l", Call::WriteRefused, 14, 14, None);
    refused[2].invoke = ms(12);
    refused[2].ret = ms(15);
    let checked = check(&refused, &none).unwrap();
    assert_eq!(checked.writes_refused, 1, "{checked:?}");
    // Refused at 16, after b's hold began at 15: two holds at once.
    refused[1].invoke = ms(16);
    refused[1].ret = ms(16);
    let violation = check(&refused, &none).unwrap_err();
    assert!(
        violation.what.contains("holds 1 and 2 at once"),
        "{violation}"
    );
    // b's hold never stood (found lost by its first step, past its deadline): recorded at its
    // invoke, it overlaps nothing, and it is counted.
    let mut paused = clean.clone();
    paused[2].ret = ms(18);
    paused[3].call = Call::NeverStood;
    paused[3].invoke = ms(15);
    paused[3].ret = ms(15);
    let checked = check(&paused, &none).unwrap();
    assert_eq!(checked.never_stood, 1, "{checked:?}");
    // b returns at 18, before a's release is invoked at 20: two holds at once.
    let mut overlap = clean.clone();
    overlap[2].ret = ms(18);
    let violation = check(&overlap, &none).unwrap_err();
    println!("{violation}");
    assert!(
        violation.what.contains("holds 1 and 2 at once"),
        "{violation}"
    );
    assert!(violation
        .window
        .iter()
        .any(|op| op.id == 1 && op.call == Call::Release));
    assert!(!violation.window.iter().any(|op| op.target == "job"));
    // Three holds of a two-permit semaphore.
    let permits = HashMap::from([("l".to_string(), 2)]);
    let mut three = clean.clone();
    three[2].ret = ms(18);
    three[4].ret = ms(19);
    three[1].invoke = ms(35);
    three[3].invoke = ms(36);
    let violation = check(&three, &permits).unwrap_err();
    assert!(violation.what.contains("3 permits of 2"), "{violation}");
    assert_eq!(check(&overlap, &permits).map(|c| c.holds).ok(), Some(3));
    // c is invoked at 25, after a's acquisition returned token 1 at 10: token 1 again is wrong.
    let mut tokens = clean.clone();
    tokens[4].token = Some(1);
    let violation = check(&tokens, &none).unwrap_err();
    assert!(
        violation.what.contains("token 1 given after token 2"),
        "{violation}"
    );
    // The same tick run by two instances.
    let mut twice = clean.clone();
    twice[7].call = Call::Run { tick: 100 };
    let violation = check(&twice, &none).unwrap_err();
    assert!(violation.what.contains("tick 100 ran twice"), "{violation}");
    // A read-write lock, as the histories check it: two reads at once are clean, a write
    // beside a read is not.
    let rw = HashMap::from([("l".to_string(), RW_ALL)]);
    assert_eq!(check(&overlap, &rw).map(|c| c.holds).ok(), Some(3));
    let mut write = overlap.clone();
    write[2].call = Call::Acquire { permits: RW_ALL };
    let violation = check(&write, &rw).unwrap_err();
    assert!(
        violation.what.contains("1001 permits of 1000"),
        "{violation}"
    );
}

/// Three clients of three tasks, through Sentinel, take the locks (holds up to 400 ms), the
/// fenced lock, the permits, the fair and the read-write lock and the job ticks while `failovers` `SENTINEL FAILOVER`s (a master,
/// two replicas, three sentinels) are started, each the moment an acquisition has returned; with
/// replica sync (one replica) or without. What the checker says, how many failovers there were
/// and how many of them came right after an acquisition.
async fn history_across_failovers(
    sync: bool,
    failovers: u32,
) -> (Result<Checked, Violation>, u32, u32, Vec<Op>) {
    let setup = Arc::new(common::RedisSentinel::start(1));
    let url = setup.url();
    let history = History::new();
    let stop = CancellationToken::new();
    let configure = if sync {
        |b: fredlock::LockClientBuilder| b.replica_sync(fredlock::ReplicaSync::replicas(1))
    } else {
        |b| b
    };
    let (clients, tasks) =
        history_clients(&history, |_| url.clone(), &stop, 200, 400, configure).await;
    let mut acquisitions = history.acquisitions();
    let (mut done, mut right_after) = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(150);
    while done < failovers && Instant::now() < deadline {
        acquisitions.borrow_and_update();
        let after = tokio::time::timeout(Duration::from_secs(5), acquisitions.changed())
            .await
            .is_ok();
        let setup = setup.clone();
        let switched = tokio::task::spawn_blocking(move || {
            let old = setup.master_port();
            let reply = setup.sentinel_cli(
                setup.sentinels[0].port(),
                &["sentinel", "failover", common::SENTINEL_SERVICE],
            );
            // NOGOODSLAVE while a replica is resyncing, INPROG: again after the next one.
            reply.starts_with("OK").then(|| {
                let new = setup.await_new_master(old, Duration::from_secs(20));
                let new_port = new.to_string();
                setup.data_cli(old, &["replicaof", "127.0.0.1", &new_port]);
                new
            })
        })
        .await
        .unwrap();
        match switched {
            Some(master) => {
                done += 1;
                right_after += u32::from(after);
                println!("failover {done} to {master} at {:?}", history.now());
            }
            None => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    // The last failover's losses show within a watchdog lease.
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.cancel();
    let (verdict, ops) = history_checked(&history, clients, tasks).await;
    (verdict, done, right_after, ops)
}

/// 6. Histories across Sentinel failovers (issue 35), with replica sync: an acquisition returns
/// only once a replica has it, and one made on a master that a failover has left behind has no
/// replica to confirm it, so over 20 failovers, each started right after an acquisition, no two
/// holds overlap, no token goes back, no third permit, no tick twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_replica_sync_histories_across_failovers_show_no_overlap() {
    bounded(async {
        let (verdict, failovers, right_after, ops) = history_across_failovers(true, 20).await;
        let checked = verdict.unwrap_or_else(|violation| panic!("{violation}"));
        let failed = ops
            .iter()
            .filter(|op| matches!(op.outcome, Outcome::Failed(_)))
            .count();
        println!(
            "histories across {failovers} failovers ({right_after} right after an acquisition), \
             replica sync: {} operations ({failed} failed), {checked:?}",
            ops.len()
        );
        assert!(failovers >= 20, "{failovers} failovers");
        assert!(
            right_after >= 20,
            "{right_after} right after an acquisition"
        );
        assert!(checked.holds > 100 && checked.tokens > 20, "{checked:?}");
    })
    .await;
}

/// The negative control of the failover histories: without replica sync an acquisition on the
/// master a failover is leaving behind counts, the promoted replica never sees it, and another
/// client takes the lock there while its holder works: the README's hazard, measured (about
/// three violations in a run of 8 failovers).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_replica_sync_a_failover_shows_two_holders_in_the_history() {
    bounded(shows_a_violation(|| async {
        let (verdict, failovers, _, _) = history_across_failovers(false, 8).await;
        (
            verdict,
            format!("{failovers} failovers without replica sync"),
        )
    }))
    .await;
}

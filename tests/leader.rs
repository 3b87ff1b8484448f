//! Acceptance tests of the leader election against real `redis-server` processes: one leader
//! at a time with epochs that increase, hand-over at once, observers that see every term,
//! cancelled campaigns that leave nothing, and a crashed leader replaced within its lease.

mod common;
#[path = "common/logs.rs"]
mod logs;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{bounded, eventually, spawn_test_child, RedisServer, StallingProxy};
use fred::prelude::*;
use fredlock::{Leader, LockClient};
use rand::Rng;
use tokio::time::Instant;

/// Elections, terms and leaders cross tasks.
const _: () = {
    const fn shareable<T: Send + Sync + 'static>() {}
    shareable::<fredlock::LeaderElection>();
    shareable::<fredlock::Term>();
    shareable::<fredlock::Leader>();
};

/// A short watchdog lease, so that a leader that dies is replaced within the test.
const LEASE: Duration = Duration::from_secs(2);

/// Appends `<what> <epoch> <identity> <server µs>` to the list `log`, only while the term
/// stands.
const LOG: &str = "local now = redis.call('time') \
    redis.call('rpush', KEYS[1], ARGV[1] .. ' ' .. ARGV[2] .. ' ' .. ARGV[3] .. ' ' .. now[1] .. string.format('%06d', tonumber(now[2]))) \
    return 1";

/// When each epoch (or `None`, no leader) was seen or began, in order.
type Timeline<T> = Arc<Mutex<Vec<(T, Instant)>>>;

/// 1 and 4. Three clients `run` for 10 s; each term writes its start and end through guarded
/// writes and resigns after 50-300 ms. The log alternates start/end of one epoch at a time,
/// epochs strictly increase, every client leads, and an observer sees every term in epoch
/// order within 250 ms of its start, then `None` once the runs stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn terms_never_overlap_and_epochs_increase() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let observer_client = server.lock_client(LEASE).await;
        let observer = observer_client.leader_election("{sched}");
        let mut changes = observer.observe().await.unwrap();
        assert_eq!(*changes.borrow(), None);
        let seen: Timeline<Option<u64>> = Arc::default();
        let watching = {
            let seen = seen.clone();
            tokio::spawn(async move {
                while changes.changed().await.is_ok() {
                    let epoch = changes
                        .borrow_and_update()
                        .as_ref()
                        .map(|leader| leader.epoch);
                    seen.lock().unwrap().push((epoch, Instant::now()));
                }
            })
        };

        let started: Timeline<u64> = Arc::default();
        // Asks every term to end (writing its end) and later ones to write nothing, so that
        // aborting the runs afterwards cuts no term short.
        let stop = tokio_util::sync::CancellationToken::new();
        let mut runs = Vec::new();
        for i in 0..3 {
            let client = server.lock_client(LEASE).await;
            let election = client
                .leader_election("{sched}")
                .identity(format!("node-{i}"));
            let started = started.clone();
            let stop = stop.clone();
            runs.push(tokio::spawn(async move {
                election
                    .run(|term| {
                        let started = started.clone();
                        let stop = stop.clone();
                        async move {
                            if stop.is_cancelled() {
                                return;
                            }
                            started.lock().unwrap().push((term.epoch(), Instant::now()));
                            let args = |what: &str| {
                                vec![
                                    what.to_owned(),
                                    term.epoch().to_string(),
                                    term.identity().to_owned(),
                                ]
                            };
                            let _: i64 = term
                                .eval_while_held(LOG, ["{sched}:log"], args("start"))
                                .await
                                .unwrap();
                            let pause = rand::thread_rng().gen_range(50..=300);
                            tokio::select! {
                                _ = tokio::time::sleep(Duration::from_millis(pause)) => {}
                                _ = stop.cancelled() => {}
                            }
                            let _: i64 = term
                                .eval_while_held(LOG, ["{sched}:log"], args("end"))
                                .await
                                .unwrap();
                        }
                    })
                    .await
            }));
        }
        tokio::time::sleep(Duration::from_secs(10)).await;
        stop.cancel();
        tokio::time::sleep(Duration::from_millis(500)).await;
        for run in &runs {
            run.abort();
        }
        for run in runs {
            // Aborted, as asked (a run campaigns until its client shuts down); a run that
            // panicked or failed fails the test.
            match run.await {
                Ok(ended) => ended.unwrap(),
                Err(aborted) if aborted.is_cancelled() => {}
                Err(panicked) => std::panic::resume_unwind(panicked.into_panic()),
            }
        }
        // The aborted runs dropped their terms: the last one is resigned in the background.
        let ended = eventually(Duration::from_secs(2), || async {
            observer.leader().await.unwrap().is_none()
        })
        .await;
        assert!(
            ended,
            "a term outlived its run: {:?}",
            observer.leader().await
        );

        let log: Vec<String> = raw.lrange("{sched}:log", 0, -1).await.unwrap();
        let entries: Vec<(String, u64, String)> = log
            .iter()
            .map(|entry| {
                let parts: Vec<&str> = entry.split(' ').collect();
                (
                    parts[0].to_owned(),
                    parts[1].parse().unwrap(),
                    parts[2].to_owned(),
                )
            })
            .collect();
        assert!(
            entries.len() >= 20,
            "only {} entries in 10 s",
            entries.len()
        );
        let mut last_epoch = 0;
        let mut open: Option<u64> = None;
        let mut leaders = std::collections::HashSet::new();
        for (what, epoch, identity) in &entries {
            match (what.as_str(), open) {
                ("start", None) => {
                    assert!(*epoch > last_epoch, "epoch {epoch} after {last_epoch}");
                    last_epoch = *epoch;
                    open = Some(*epoch);
                    leaders.insert(identity.clone());
                }
                ("end", Some(current)) if current == *epoch => open = None,
                _ => panic!("terms overlap at {what} {epoch} {identity}: {log:?}"),
            }
        }
        assert_eq!(leaders.len(), 3, "not every client led: {leaders:?}");

        // Every term started was observed, in epoch order, within 250 ms of its start.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let seen = seen.lock().unwrap().clone();
        let started = started.lock().unwrap().clone();
        let observed: Vec<u64> = seen.iter().filter_map(|(epoch, _)| *epoch).collect();
        assert!(
            observed.windows(2).all(|pair| pair[0] < pair[1]),
            "{observed:?}"
        );
        for (epoch, at) in &started {
            let (_, heard) = seen
                .iter()
                .find(|(seen, _)| *seen == Some(*epoch))
                .unwrap_or_else(|| panic!("epoch {epoch} was never observed: {observed:?}"));
            let late = heard.saturating_duration_since(*at);
            assert!(
                late < Duration::from_millis(250),
                "epoch {epoch} observed {late:?} late"
            );
        }
        assert_eq!(
            seen.last().map(|(epoch, _)| *epoch),
            Some(None),
            "no None at the end"
        );
        watching.abort();
    })
    .await;
}

/// 5. `resign()` and a dropped term hand over at once: a waiting candidate leads within
///    250 ms of either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resigning_and_dropping_hand_over_at_once() {
    bounded(async {
        let server = RedisServer::start();
        let first = server.lock_client(LEASE).await.leader_election("handover");
        let second = server.lock_client(LEASE).await.leader_election("handover");
        for resign in [true, false] {
            let term = first.campaign().await.unwrap();
            let candidate = {
                let second = second.clone();
                tokio::spawn(async move {
                    let term = second.campaign().await.unwrap();
                    (Instant::now(), term)
                })
            };
            tokio::time::sleep(Duration::from_millis(200)).await;
            assert!(
                !candidate.is_finished(),
                "the candidate led beside the leader"
            );
            let epoch = term.epoch();
            let handed = Instant::now();
            if resign {
                term.resign().await.unwrap();
            } else {
                drop(term);
            }
            let (led, next) = candidate.await.unwrap();
            let took = led.saturating_duration_since(handed);
            assert!(
                took < Duration::from_millis(250),
                "resign {resign}: took {took:?}"
            );
            assert!(next.epoch() > epoch);
            next.resign().await.unwrap();
        }
    })
    .await;
}

/// A force unlock ends the term for everyone at once: an observer sees it ended, and a
/// waiting candidate leads, within a second, although the term had a 30 s lease (neither
/// would look again before its expiry without the force unlock's messages).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_unlock_tells_the_observers_and_the_candidates_at_once() {
    bounded(async {
        let server = RedisServer::start();
        let long = fredlock::DEFAULT_WATCHDOG_LEASE;
        let leader = server.lock_client(long).await.leader_election("forced");
        let observer = server.lock_client(long).await.leader_election("forced");
        let operator = server.lock_client(long).await.leader_election("forced");

        let term = leader.campaign().await.unwrap();
        let mut changes = observer.observe().await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), changes.wait_for(Option::is_some))
            .await
            .expect("the observer sees the term")
            .unwrap();
        // The observer waits on its channel (it looks once more after subscribing): a force
        // unlock before that would be seen by a look, not told.
        let raw = server.raw().await;
        assert!(
            eventually(Duration::from_secs(5), || async {
                let counts: Vec<Value> = raw
                    .pubsub_numsub("fredlock_leader__channel:{forced}")
                    .await
                    .unwrap();
                counts.get(1).and_then(Value::as_i64) == Some(1)
            })
            .await,
            "the observer subscribes"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        let forced = Instant::now();
        assert!(operator.force_unlock().await.unwrap());
        tokio::time::timeout(Duration::from_secs(1), changes.wait_for(Option::is_none))
            .await
            .expect("the observer sees the term ended at once")
            .unwrap();
        println!(
            "observed the end {:?} after the force unlock",
            forced.elapsed()
        );
        drop(term);

        let term = leader.campaign().await.unwrap();
        let candidate = {
            let observer = observer.clone();
            tokio::spawn(async move { observer.campaign().await.unwrap() })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            !candidate.is_finished(),
            "the candidate led beside the leader"
        );
        let forced = Instant::now();
        assert!(operator.force_unlock().await.unwrap());
        let next = tokio::time::timeout(Duration::from_secs(1), candidate)
            .await
            .expect("the candidate leads at once")
            .unwrap();
        println!(
            "the candidate led {:?} after the force unlock",
            forced.elapsed()
        );
        assert!(next.epoch() > term.epoch());
        drop(term);
        next.resign().await.unwrap();
    })
    .await;
}

/// A leader whose process stalls past its renew deadline knows, at its first look, that its
/// term is lost: `is_lost()` compares the deadline with the clock, before any task has run to
/// tell it (here the only thread sleeps; the pause histories found a leader believing on).
#[tokio::test(flavor = "current_thread")]
async fn a_stalled_leader_finds_its_term_lost_at_its_first_look() {
    bounded(async {
        let server = RedisServer::start();
        let election = server
            .lock_client(LEASE)
            .await
            .leader_election("stalled-look");
        let term = election.campaign().await.unwrap();
        assert!(!term.is_lost());
        // Blocks the runtime's only thread: no renewal, no task that would cancel the term.
        std::thread::sleep(LEASE + Duration::from_millis(500));
        assert!(term.is_lost(), "a term believed past its renew deadline");
    })
    .await;
}

/// 6. 200 campaigns cancelled at random points leave no term, subscription or wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_campaigns_leave_nothing() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let leader = server.lock_client(LEASE).await.leader_election("cancel");
        let client = server.lock_client(LEASE).await;
        let candidate = client.leader_election("cancel");
        let term = leader.campaign().await.unwrap();
        let mut won = 0;
        for _ in 0..200 {
            let cancel_after = Duration::from_micros(rand::thread_rng().gen_range(0..3000));
            if let Ok(Ok(term)) = tokio::time::timeout(cancel_after, candidate.campaign()).await {
                won += 1;
                drop(term);
            }
        }
        term.resign().await.unwrap();
        let clean = eventually(Duration::from_secs(5), || async {
            let exists: bool = raw.exists("cancel").await.unwrap();
            let channels: Vec<String> = common::pubsub_channels(&raw).await;
            let stats = client.stats();
            !exists && channels.is_empty() && stats.wait_entries == 0 && stats.held == 0
        })
        .await;
        assert!(clean, "left behind: stats {:?}", client.stats());
        assert_eq!(won, 0, "a campaign won while the leader stood");
    })
    .await;
}

/// `leader()` names the leader's identity, epoch, start (by the server's clock) and owner,
/// and an inspection shows the election with its leader and epoch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_and_inspection_name_the_leader() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = server.lock_client(LEASE).await;
        let election = client.leader_election("who").identity("pod-7:8080");
        assert_eq!(election.leader().await.unwrap(), None);
        let before = common::server_millis(&raw).await;
        let term = election.campaign().await.unwrap();
        let Some(Leader {
            identity,
            epoch,
            since,
            owner,
            ..
        }) = election.leader().await.unwrap()
        else {
            panic!("no leader while a term stands");
        };
        assert_eq!(identity, "pod-7:8080");
        assert_eq!(epoch, term.epoch());
        assert_eq!(owner, term.owner_field());
        let since_ms = since
            .duration_since(std::time::SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        assert!(
            since_ms >= before && since_ms <= before + 1000,
            "{since_ms} vs {before}"
        );

        let inspection = client.inspect("who").await.unwrap().expect("found");
        assert_eq!(inspection.kind, "leader_election");
        assert_eq!(inspection.holders.len(), 1);
        assert_eq!(inspection.holders[0].owner, term.owner_field());
        assert_eq!(inspection.holders[0].count, 1);
        // The leader, with its identity, epoch and term start, as `leader()` tells it.
        let leader = election.leader().await.unwrap();
        assert!(leader.is_some());
        assert_eq!(
            inspection.details,
            fredlock::Details::Leader {
                last_epoch: Some(term.epoch()),
                leader,
            }
        );
        let fredlock::Details::Leader {
            leader: Some(leader),
            ..
        } = &inspection.details
        else {
            unreachable!()
        };
        assert_eq!(
            (leader.identity.as_str(), leader.epoch, leader.since),
            ("pod-7:8080", term.epoch(), since)
        );
        let listed = client.list("*").await.unwrap();
        assert!(listed
            .iter()
            .any(|found| found.name == "who" && found.kind == "leader_election"));

        // A force unlock ends the term for everyone, its leader first.
        let forced = Instant::now();
        assert!(election.force_unlock().await.unwrap());
        assert_eq!(election.leader().await.unwrap(), None);
        tokio::time::timeout(Duration::from_millis(250), term.lost())
            .await
            .expect("the leader is told of the force unlock at once");
        println!(
            "the leader learned of the force unlock after {:?}",
            forced.elapsed()
        );
        drop(term);
    })
    .await;
}

/// The default identity is readable: this host and process.
#[test]
fn the_default_identity_is_host_and_pid() {
    let identity = fredlock::default_identity();
    assert!(
        identity.ends_with(&format!(":{}", std::process::id())),
        "{identity}"
    );
    assert!(identity.len() > 2);
}

/// Issue 42, point 4: an empty identity is refused as a job lock's empty host is, before
/// anything is written, by every way to campaign.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_identity_is_refused_and_writes_nothing() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = server.lock_client(LEASE).await;
        for identity in ["", "  "] {
            let election = client.leader_election("nameless").identity(identity);
            let refused = |error: fredlock::Error| match error {
                fredlock::Error::InvalidArgument(message) => {
                    assert!(
                        message.contains("identity") && message.contains("nameless"),
                        "{message}"
                    )
                }
                other => panic!("not refused: {other:?}"),
            };
            refused(election.campaign().await.unwrap_err());
            refused(election.try_campaign(Duration::ZERO).await.unwrap_err());
            refused(election.run(|_| async {}).await.unwrap_err());
        }
        let keys = common::all_keys(&raw).await;
        assert!(keys.is_empty(), "{keys:?}");
    })
    .await;
}

/// An election whose key holds another type (here a string) is
/// refused as `WrongType` naming that key, by every call that reads it, and is left as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_of_another_type_is_refused_by_every_read_and_left_alone() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = server.lock_client(LEASE).await;
        let _: () = raw.set("taken", "mine", None, None, false).await.unwrap();
        let wrong = |what: &str, outcome: fredlock::Error| match outcome {
            fredlock::Error::WrongType { key, .. } => assert_eq!(key, "taken", "{what}"),
            other => panic!("{what}: expected WrongType, got {other:?}"),
        };
        let election = client.leader_election("taken");
        wrong("leader", election.leader().await.unwrap_err());
        wrong("inspect", election.inspect().await.unwrap_err());
        wrong("force_unlock", election.force_unlock().await.unwrap_err());
        wrong(
            "try_campaign",
            election.try_campaign(Duration::ZERO).await.unwrap_err(),
        );
        let value: String = raw.get("taken").await.unwrap();
        assert_eq!(value, "mine");
    })
    .await;
}

/// An observer of an election without a term looks once and sleeps until told (or a watchdog
/// period), rather than looking again and again; a force unlock finds no term to end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_of_no_term_looks_once_and_sleeps() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = server.lock_client(LEASE).await;
        let election = client.leader_election("vacant");
        assert!(!election.force_unlock().await.unwrap());
        let before = common::command_calls(&raw).await;
        let observed = election.observe().await.unwrap();
        assert!(observed.borrow().is_none());
        tokio::time::sleep(Duration::from_millis(500)).await;
        let looks: u64 = common::scripts_since(&raw, &before).await;
        // The first read, a look, a script sent again in full the first time (NOSCRIPT): a
        // few; an observer that looked again at once would run hundreds.
        assert!(
            (1..=6).contains(&looks),
            "{looks} looks in 500 ms: {:?}",
            common::commands_since(&raw, &before).await
        );
        drop(observed);
    })
    .await;
}

/// A force unlock wakes one candidate of each client, as a resignation does, not all of them:
/// the one woken takes the term, and the others sleep on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_unlock_wakes_one_candidate_of_a_client() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let long = fredlock::DEFAULT_WATCHDOG_LEASE;
        let leader = server.lock_client(long).await.leader_election("one-woken");
        let term = leader.campaign().await.unwrap();
        let candidates = server.lock_client(long).await.leader_election("one-woken");
        let mut waiting = Vec::new();
        for _ in 0..4 {
            let candidate = candidates.clone();
            waiting.push(tokio::spawn(async move {
                candidate.try_campaign(Duration::from_secs(10)).await
            }));
        }
        // Each has tried once and waits on the channel. The force unlock's script is loaded
        // first (a force unlock of an election without a term), so that none is sent in full.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let other = server.lock_client(long).await.leader_election("vacant");
        assert!(!other.force_unlock().await.unwrap());
        let before = common::command_calls(&raw).await;
        assert!(leader.force_unlock().await.unwrap());
        tokio::time::sleep(Duration::from_millis(300)).await;
        let tries: u64 = common::scripts_since(&raw, &before).await;
        // The force unlock, the leader's look at its forced term (its script sent in full the
        // first time: a NOSCRIPT and the script), and one candidate's try: 4; every candidate
        // woken would make 7.
        assert!(
            tries <= 4,
            "{tries} scripts: {:?}",
            common::commands_since(&raw, &before).await
        );
        drop(term);
        for candidate in waiting {
            candidate.abort();
        }
    })
    .await;
}

/// 2. A leader in a child process killed with SIGKILL is replaced within its lease + 1 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_is_replaced_within_its_lease() {
    bounded(async {
        let server = RedisServer::start();
        let election = server.lock_client(LEASE).await.leader_election("crash");
        let child = spawn_test_child(
            "crashed_leader_child",
            &[("FREDLOCK_LEADER_URL", server.url())],
        );
        let leading = eventually(Duration::from_secs(10), || async {
            election.leader().await.unwrap().is_some()
        })
        .await;
        assert!(leading, "the child never led");
        common::sigkill(child);
        let killed = Instant::now();
        let term = election
            .try_campaign(Duration::from_secs(10))
            .await
            .unwrap()
            .expect("the killed leader's term ends");
        let took = killed.elapsed();
        println!("a killed leader was replaced after {took:?} (lease {LEASE:?})");
        assert!(took <= LEASE + Duration::from_secs(1), "took {took:?}");
        term.resign().await.unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by a_killed_leader_is_replaced_within_its_lease as a child process"]
async fn crashed_leader_child() {
    let Ok(url) = std::env::var("FREDLOCK_LEADER_URL") else {
        return;
    };
    let client = common::lock_client_at(&url, LEASE).await;
    let _term = client.leader_election("crash").campaign().await.unwrap();
    tokio::time::sleep(Duration::from_secs(60)).await;
}

/// `run` drops the work when the term is lost (here: forced to end and, with it, the
/// renewal), resigns when it returns, and hands a panic on after resigning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_resigns_when_the_work_panics() {
    bounded(async {
        let server = RedisServer::start();
        let client = server.lock_client(LEASE).await;
        let election = client.leader_election("panics");
        let watcher = server.lock_client(LEASE).await.leader_election("panics");
        let run = {
            let election = election.clone();
            tokio::spawn(async move {
                election
                    .run(|_term| async move {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        panic!("the work failed");
                    })
                    .await
            })
        };
        let outcome = run.await;
        let error = outcome.expect_err("the panic reaches the caller");
        assert!(error.is_panic());
        assert_eq!(
            watcher.leader().await.unwrap(),
            None,
            "the term was left standing"
        );
    })
    .await;
}

/// A client whose connections go through `proxy`, with watchdog lease `lease` and commands that
/// time out after 300 ms, so that a stall is noticed quickly.
async fn through(proxy: &StallingProxy, lease: Duration) -> LockClient {
    common::builder()
        .url(proxy.url())
        .watchdog_lease(lease)
        .command_timeout(Duration::from_millis(300))
        .build()
        .await
        .unwrap()
}

/// 3. A leader whose connection stalls past its lease: its work is dropped before the
///    successor's term starts, and its guarded write that lands after the stall is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stalled_leader_stops_before_its_successor_starts() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let proxy = StallingProxy::start(server.port());
        let stalled_client = through(&proxy, Duration::from_millis(1500)).await;
        let successor = server.lock_client(LEASE).await.leader_election("{stall}");
        let leader = stalled_client.leader_election("{stall}");

        let dropped: Arc<Mutex<Option<Instant>>> = Arc::default();
        let (led, mut leading) = tokio::sync::watch::channel(None);
        let run = {
            let dropped = dropped.clone();
            tokio::spawn(async move {
                leader
                    .run(|term| {
                        let dropped = common::DroppedAt(dropped.clone());
                        let led = led.clone();
                        async move {
                            let _dropped = dropped;
                            led.send_replace(Some(term.epoch()));
                            loop {
                                // Fails with `NotHeld` once refused; keeps trying until dropped.
                                let _: fredlock::Result<i64> = term
                                    .eval_while_held(
                                        "return redis.call('rpush', KEYS[1], ARGV[1])",
                                        ["{stall}:log"],
                                        [term.epoch().to_string()],
                                    )
                                    .await;
                                tokio::time::sleep(Duration::from_millis(20)).await;
                            }
                        }
                    })
                    .await
            })
        };
        leading.wait_for(Option::is_some).await.unwrap();
        let first_epoch = leading.borrow().unwrap();
        tokio::time::sleep(Duration::from_millis(600)).await;

        proxy.stall();
        let term = successor
            .try_campaign(Duration::from_secs(10))
            .await
            .unwrap()
            .expect("the successor leads once the stalled term ends");
        let started = Instant::now();
        let dropped_at = dropped
            .lock()
            .unwrap()
            .expect("the stalled leader's work was dropped");
        assert!(
            dropped_at < started,
            "the work was dropped after the successor started"
        );
        println!(
            "stalled leader's work dropped {:?} before the successor's term",
            started - dropped_at
        );
        let _: i64 = term
            .eval_while_held(
                "return redis.call('rpush', KEYS[1], ARGV[1])",
                ["{stall}:log"],
                [term.epoch().to_string()],
            )
            .await
            .unwrap();

        // What the stalled leader sent during the stall lands now, and is refused.
        proxy.resume();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let log: Vec<u64> = raw.lrange("{stall}:log", 0, -1).await.unwrap();
        let first_new = log
            .iter()
            .position(|epoch| *epoch == term.epoch())
            .expect("the successor wrote");
        assert!(first_new > 0, "the stalled leader never wrote");
        assert!(
            log[first_new..].iter().all(|epoch| *epoch == term.epoch()),
            "a write of epoch {first_epoch} landed after the successor's: {log:?}"
        );
        term.resign().await.unwrap();
        run.abort();
    })
    .await;
}

/// `run` campaigns through an outage: with Redis out of reach for 1.5 s it waits, and leads
/// once Redis is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn run_campaigns_through_an_outage() {
    bounded(async {
        let server = RedisServer::start();
        let proxy = StallingProxy::start(server.port());
        let client = through(&proxy, LEASE).await;
        let election = client.leader_election("outage");
        proxy.stall();
        let (led, mut leading) = tokio::sync::watch::channel(None);
        let run = tokio::spawn(async move {
            election
                .run(|term| {
                    let led = led.clone();
                    async move {
                        led.send_replace(Some(term.epoch()));
                        std::future::pending::<()>().await;
                    }
                })
                .await
        });
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(
            leading.borrow().is_none(),
            "led while Redis was out of reach"
        );
        assert!(!run.is_finished(), "run gave up during the outage");
        proxy.resume();
        let back = Instant::now();
        tokio::time::timeout(Duration::from_secs(5), leading.wait_for(Option::is_some))
            .await
            .expect("leads once Redis is back")
            .unwrap();
        println!("led {:?} after the outage ended", back.elapsed());
        client.shutdown().await;
        assert!(
            matches!(run.await.unwrap(), Ok(())),
            "run returns Ok at shutdown"
        );
    })
    .await;
}

/// 4, the rest. An observer that missed the message of a new term (its pub/sub connection
/// killed and kept down while the term started) sees it once back, and a term that ends by
/// expiry (its leader cut off, so nobody publishes) is seen ended within the leader's lease:
/// the observer sleeps until the term's own expiry, not a period of its own client's
/// watchdog (here the default 30 s lease's, far longer than the leader's).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn observers_catch_up_after_a_missed_message_and_an_expiry() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let observer_proxy = StallingProxy::start(server.port());
        let observer = common::lock_client_at(&observer_proxy.url(), fredlock::DEFAULT_WATCHDOG_LEASE)
            .await
            .leader_election("{missed}");
        let mut changes = observer.observe().await.unwrap();
        assert!(
            eventually(Duration::from_secs(5), || async {
                !raw.pubsub_channels::<Vec<String>, _>("fredlock_leader__channel*")
                    .await
                    .unwrap()
                    .is_empty()
            })
            .await
        );
        // The observer's pub/sub connection goes, and cannot come back while the term starts.
        observer_proxy.cut();
        common::client_kill(&raw, "pubsub").await.unwrap();
        let leader_proxy = StallingProxy::start(server.port());
        let leader_client = through(&leader_proxy, LEASE).await;
        let term = leader_client
            .leader_election("{missed}")
            .campaign()
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(changes.borrow().is_none(), "seen while the observer was cut off");
        observer_proxy.heal();
        let healed = Instant::now();
        tokio::time::timeout(LEASE, changes.wait_for(|now| now.is_some()))
            .await
            .expect("the missed term is seen within the lease")
            .unwrap();
        let seen = healed.elapsed();
        assert_eq!(changes.borrow().as_ref().map(|leader| leader.epoch), Some(term.epoch()));

        // The leader is cut off: nobody publishes the end; its lease ends it.
        leader_proxy.stall();
        let cut = Instant::now();
        tokio::time::timeout(LEASE + Duration::from_secs(1), changes.wait_for(Option::is_none))
            .await
            .expect("the expired term is seen ended")
            .unwrap();
        let ended = cut.elapsed();
        println!("missed term seen {seen:?} after the observer was back; expiry seen {ended:?} after the cut");
        let pttl: i64 = raw.pttl("{missed}").await.unwrap();
        assert_eq!(pttl, -2, "seen ended while the term stood");
        drop(term);
    })
    .await;
}

/// An observer that Redis refuses to tell (the election's key made a string: `WRONGTYPE`) ends
/// its watch, and says why at `warn`, naming the election and the refusal (the key holds no
/// lock), rather than ending without a word. One thread, the one the log capture is set on: the observer's task logs
/// through it.
#[tokio::test]
async fn an_observer_refused_by_redis_ends_and_says_why() {
    let (logged, _default) = logs::capture_logs(tracing::Level::WARN);
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = server.lock_client(LEASE).await;
        let mut changes = client.leader_election("{refused}").observe().await.unwrap();
        let _: () = raw
            .set("{refused}", "not an election", None, None, false)
            .await
            .unwrap();
        // It looks again within a watchdog period (a third of LEASE) without a term.
        let ended = tokio::time::timeout(LEASE * 2, changes.changed()).await;
        assert!(matches!(ended, Ok(Err(_))), "the watch ended: {ended:?}");
        let text = logged.text();
        assert!(
            text.lines().any(|line| line.contains("WARN")
                && line.contains("observer ended")
                && line.contains("election={refused}")
                && line.contains("not part of a lock")),
            "{text}"
        );
        client.shutdown().await;
    })
    .await;
}

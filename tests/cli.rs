//! The `fredlock` command, run as a process against real servers: every subcommand, in text and
//! JSON, its exit status, and the leak found by `leaks` and removed by `force-unlock` while a
//! waiter is woken.

mod common;

use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use common::{bounded, RedisServer};
use fred::prelude::*;
use fredlock::prelude::*;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;
use tokio::sync::oneshot;

/// How long one run of the command may take before the test fails.
const RUN_LIMIT: Duration = Duration::from_secs(20);

fn fredlock(url: &str, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_fredlock"));
    command
        .args(args)
        .env("REDIS_URL", url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

/// Runs the command to its end: its output, with stdout as text.
async fn run(url: &str, args: &[&str]) -> (Output, String) {
    let output = tokio::time::timeout(RUN_LIMIT, fredlock(url, args).output())
        .await
        .expect("the command ended in time")
        .expect("the command ran");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    (output, stdout)
}

/// Runs the command with `--json` and parses what it printed.
async fn run_json(url: &str, args: &[&str]) -> (i32, Value) {
    let mut with_json = vec!["--json"];
    with_json.extend_from_slice(args);
    let (output, stdout) = run(url, &with_json).await;
    let value = serde_json::from_str(&stdout).unwrap_or_else(|error| {
        panic!(
            "not JSON ({error}): {stdout}; stderr: {}",
            String::from_utf8_lossy(&output.stderr)
        )
    });
    (output.status.code().unwrap_or(-1), value)
}

/// A hold written by hand, as a crashed or buggy client might leave it: no TTL.
async fn leak(raw: &Client, name: &str, owner: &str) {
    let _: i64 = raw.hset(name, (owner, 1)).await.unwrap();
}

/// A task waiting for `lock`, which reports when it held it, then lets go.
fn waiter(lock: fredlock::Lock) -> (tokio::task::JoinHandle<()>, oneshot::Receiver<Instant>) {
    let (acquired_tx, acquired_rx) = oneshot::channel();
    let task = tokio::spawn(async move {
        let guard = lock.lock().await.unwrap();
        let _ = acquired_tx.send(Instant::now());
        guard.unlock().await.unwrap();
    });
    (task, acquired_rx)
}

/// Runs `force-unlock NAME --yes`, and checks that it unlocked and that the waiter reporting on
/// `acquired` held the lock within 250 ms of the command's end.
async fn force_unlock_wakes(url: &str, name: &str, acquired: oneshot::Receiver<Instant>) {
    let started = Instant::now();
    let (status, unlocked) = run_json(url, &["force-unlock", name, "--yes"]).await;
    let ended = Instant::now();
    assert_eq!((status, &unlocked["unlocked"]), (0, &Value::Bool(true)));
    let acquired_at = tokio::time::timeout(Duration::from_secs(5), acquired)
        .await
        .expect("the waiter was woken")
        .unwrap();
    assert!(acquired_at > started);
    let after = acquired_at.saturating_duration_since(ended);
    assert!(
        after <= Duration::from_millis(250),
        "woken {after:?} after the command ended"
    );
}

/// Puts `OWNER` in the fair lock `name`'s queue, its place ending at `deadline` (server clock,
/// ms), as a waiter would; with `ttl`, the queue's keys expire as fredlock's do, without, they
/// last as Redisson's waiters leave them.
async fn queue_waiter(raw: &Client, name: &str, deadline: f64, ttl: Option<i64>) {
    let (queue, timeouts) = (common::queue_key(name), common::timeout_key(name));
    let _: i64 = raw.rpush(&queue, OWNER).await.unwrap();
    let _: i64 = raw
        .zadd(&timeouts, None, None, false, false, (deadline, OWNER))
        .await
        .unwrap();
    if let Some(ttl) = ttl {
        for key in [&queue, &timeouts] {
            let _: bool = raw.pexpire(key, ttl, None).await.unwrap();
        }
    }
}

const OWNER: &str = "0b9e7a0e-5f6c-4b43-9d1c-7f2a4c1e8a11:42";

/// A job lock shows kind `job`, the host that runs it, until when, and the last tick; `list`
/// finds it and `force-unlock` ends the run, whose job is cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_job_lock_is_inspected_listed_and_force_unlocked() {
    let server = RedisServer::start();
    bounded(async {
        let url = server.url();
        let client = server.lock_client(Duration::from_secs(30)).await;
        let job = client
            .job_lock("cli-job")
            .host("pod-9")
            .at_most_for(Duration::from_secs(60));
        let tick = std::time::SystemTime::UNIX_EPOCH + Duration::from_millis(1_795_000_000_000);
        let (taken, is_taken) = oneshot::channel();
        let running = tokio::spawn({
            let job = job.clone();
            async move {
                job.run_tick(tick, async move {
                    taken.send(()).unwrap();
                    tokio::time::sleep(Duration::from_secs(60)).await;
                })
                .await
                .unwrap()
            }
        });
        is_taken.await.unwrap();

        let (status, seen) = run_json(&url, &["inspect", "job-lock:default:cli-job"]).await;
        assert_eq!(status, 0);
        assert_eq!(seen["kind"], "job", "{seen}");
        let holder = &seen["holders"][0];
        assert_eq!(holder["identity"], "pod-9");
        assert!(holder["owner"].as_str().unwrap().starts_with("ADDED:"));
        let lease = holder["remaining_lease_ms"].as_u64().unwrap();
        assert!(lease > 50_000 && lease <= 60_000, "{lease}");
        assert_eq!(seen["last_tick_ms"], 1_795_000_000_000u64);

        let (output, text) = run(&url, &["inspect", "job-lock:default:cli-job"]).await;
        assert!(output.status.success());
        assert!(text.starts_with("job-lock:default:cli-job (job)"), "{text}");
        assert!(text.contains("host pod-9"), "{text}");
        assert!(text.contains("last tick 1795000000000"), "{text}");

        let (_, listed) = run_json(&url, &["list", "--pattern", "job-lock:*"]).await;
        assert_eq!(listed[0]["kind"], "job", "{listed}");
        assert_eq!(listed[0]["name"], "job-lock:default:cli-job", "{listed}");

        let (output, _) = run(&url, &["force-unlock", "job-lock:default:cli-job", "--yes"]).await;
        assert!(output.status.success(), "{output:?}");
        let run = tokio::time::timeout(Duration::from_secs(5), running)
            .await
            .expect("the job was cancelled at once")
            .unwrap();
        assert!(run.is_lost());
        client.shutdown().await;
    })
    .await;
}

/// A leader election shows its leader's identity, epoch, start and lease, and the candidates
/// waiting (connections subscribed to its channel).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn inspect_shows_a_leader_election() {
    let server = RedisServer::start();
    bounded(async {
        let url = server.url();
        let client = server.lock_client(Duration::from_secs(30)).await;
        let other = server.lock_client(Duration::from_secs(30)).await;
        let term = client
            .leader_election("cli:leader")
            .identity("pod-7:8080")
            .campaign()
            .await
            .unwrap();
        let candidate = tokio::spawn({
            let election = other.leader_election("cli:leader");
            async move { election.campaign().await.unwrap().resign().await.unwrap() }
        });
        assert!(
            common::eventually(Duration::from_secs(5), || async {
                other.stats().subscriptions == 1
            })
            .await
        );

        let (status, seen) = run_json(&url, &["inspect", "cli:leader"]).await;
        assert_eq!(status, 0);
        assert_eq!(seen["kind"], "leader_election");
        let holder = &seen["holders"][0];
        assert_eq!(holder["owner"], term.owner_field());
        assert_eq!(holder["identity"], "pod-7:8080");
        assert_eq!(holder["fencing_token"], term.epoch());
        assert!(holder["since_ms"].as_u64().unwrap() > 0);
        let lease = holder["remaining_lease_ms"].as_u64().unwrap();
        assert!(lease > 20_000 && lease <= 30_000, "{lease}");
        assert_eq!(
            seen["listeners"], 1,
            "the waiting candidate's connection: {seen}"
        );

        let (output, text) = run(&url, &["inspect", "cli:leader"]).await;
        assert!(output.status.success());
        assert!(text.starts_with("cli:leader (leader_election)"), "{text}");
        assert!(text.contains("identity pod-7:8080"), "{text}");
        assert!(
            text.contains(&format!("fencing token {}", term.epoch())),
            "{text}"
        );

        let (_, listed) = run_json(&url, &["list", "--pattern", "cli:leader"]).await;
        assert_eq!(listed[0]["kind"], "leader_election", "{listed}");

        term.resign().await.unwrap();
        candidate.await.unwrap();
        client.shutdown().await;
        other.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn list_and_inspect_show_every_kind_with_its_holders() {
    let server = RedisServer::start();
    bounded(async {
        let url = server.url();
        let client = server.lock_client(Duration::from_secs(30)).await;
        let plain = client.lock("cli:plain").lock().await.unwrap();
        let fenced = client.fenced_lock("cli:fenced").lock().await.unwrap();
        let fair = client.fair_lock("cli:fair").lock().await.unwrap();
        // A fair waiter, queued behind the holder.
        let waiter = tokio::spawn({
            let fair = client.fair_lock("cli:fair");
            async move { fair.lock().await.unwrap().unlock().await.unwrap() }
        });
        let raw = server.raw().await;
        let _: () = raw.hset("cli:userdata", ("colour", "blue")).await.unwrap();
        assert!(
            common::eventually(Duration::from_secs(5), || async {
                let queued: i64 = raw.llen(common::queue_key("cli:fair")).await.unwrap();
                queued == 1
            })
            .await
        );

        let (status, listed) = run_json(&url, &["list"]).await;
        assert_eq!(status, 0);
        let listed = listed.as_array().unwrap();
        let names: Vec<&str> = listed
            .iter()
            .map(|lock| lock["name"].as_str().unwrap())
            .collect();
        // Sorted by name; the user's own hash is not a lock.
        assert_eq!(names, ["cli:fair", "cli:fenced", "cli:plain"], "{listed:?}");
        let kinds: Vec<&str> = listed
            .iter()
            .map(|lock| lock["kind"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["fair_lock", "fenced_lock", "lock"]);
        let plain_holder = &listed[2]["holders"][0];
        assert_eq!(plain_holder["owner"], plain.owner_field());
        assert_eq!(plain_holder["client_id"], client.id().to_string());
        assert_eq!(plain_holder["count"], 1);
        let lease = plain_holder["remaining_lease_ms"].as_u64().unwrap();
        assert!(lease > 20_000 && lease <= 30_000, "{lease}");
        assert_eq!(listed[1]["holders"][0]["fencing_token"], fenced.token());
        assert_eq!(listed[1]["fencing_token"], fenced.token());
        assert_eq!(listed[0]["queue"].as_array().unwrap().len(), 1);

        let (status, only) = run_json(&url, &["list", "--pattern", "cli:f*"]).await;
        assert_eq!(status, 0);
        assert_eq!(only.as_array().unwrap().len(), 2, "{only}");

        let (output, table) = run(&url, &["list"]).await;
        assert!(output.status.success());
        let mut lines = table.lines();
        let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
        // One unit a column (issue 42): waiters with a queue place, clients listening.
        assert_eq!(
            header,
            ["NAME", "KIND", "HOLDERS", "TTL", "QUEUED", "LISTENING"]
        );
        let fair_row = lines.next().unwrap();
        assert!(
            fair_row.starts_with("cli:fair ") && fair_row.contains("fair_lock"),
            "{table}"
        );
        let cells: Vec<&str> = fair_row.split_whitespace().collect();
        assert_eq!(
            cells[cells.len() - 2..],
            ["1", "-"],
            "one queued waiter: {table}"
        );

        // Everything about one lock: the fair lock's queue with each place's time left.
        let (status, fair_seen) = run_json(&url, &["inspect", "cli:fair"]).await;
        assert_eq!(status, 0);
        assert_eq!(fair_seen["kind"], "fair_lock");
        assert_eq!(fair_seen["holders"][0]["owner"], fair.owner_field());
        let place = &fair_seen["queue"][0];
        assert!(place["owner"]
            .as_str()
            .unwrap()
            .starts_with(&client.id().to_string()));
        let left = place["place_left_ms"].as_u64().unwrap();
        assert!(left > 0 && left <= fredlock::DEFAULT_QUEUE_PLACE.as_millis() as u64);
        let keys: Vec<&str> = fair_seen["keys"]
            .as_array()
            .unwrap()
            .iter()
            .map(|key| key["key"].as_str().unwrap())
            .collect();
        assert!(
            keys.contains(&"cli:fair") && keys.contains(&common::queue_key("cli:fair").as_str())
        );

        let (output, text) = run(&url, &["inspect", "cli:fenced"]).await;
        assert!(output.status.success());
        assert!(text.starts_with("cli:fenced (fenced_lock)"), "{text}");
        assert!(
            text.contains(&format!("fencing token {}", fenced.token())),
            "{text}"
        );
        let (status, missing) = run_json(&url, &["inspect", "cli:none"]).await;
        assert_eq!((status, missing), (1, Value::Null));

        // The library's own view agrees.
        let seen = client.lock("cli:plain").inspect().await.unwrap();
        assert_eq!(seen.holders[0].owner, plain.owner_field());
        assert_eq!(seen.listeners, Some(0));

        fair.unlock().await.unwrap();
        waiter.await.unwrap();
        plain.unlock().await.unwrap();
        fenced.unlock().await.unwrap();
        client.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_leaked_lock_is_found_and_force_unlocked_waking_its_waiter() {
    let server = RedisServer::start();
    bounded(async {
        let url = server.url();
        let raw = server.raw().await;
        let (status, none) = run_json(&url, &["leaks"]).await;
        assert_eq!((status, none), (0, Value::Array(Vec::new())));

        leak(&raw, "cli:leaked", OWNER).await;
        // A waiter: the hash has no TTL, so only the unlock message can wake it early (without
        // one it would sleep a third of the watchdog lease, 10 s, before trying again).
        let client = server.lock_client(Duration::from_secs(30)).await;
        let (waiting, acquired) = waiter(client.lock("cli:leaked"));
        assert!(
            common::eventually(Duration::from_secs(5), || async {
                client.stats().wait_entries == 1
            })
            .await
        );

        let (status, leaks) = run_json(&url, &["leaks"]).await;
        assert_eq!(status, 1, "leaks found: {leaks}");
        let leaks = leaks.as_array().unwrap();
        assert_eq!(leaks.len(), 1, "{leaks:?}");
        assert_eq!(leaks[0]["name"], "cli:leaked");
        assert_eq!(leaks[0]["rule"], "no_expiry");
        assert!(leaks[0]["detail"].as_str().unwrap().contains(OWNER));
        let (output, text) = run(&url, &["leaks"]).await;
        assert_eq!(output.status.code(), Some(1));
        assert!(
            text.contains("cli:leaked") && text.contains("no_expiry"),
            "{text}"
        );

        // Declined at the prompt: nothing changes.
        let mut declined = fredlock(&url, &["force-unlock", "cli:leaked"]);
        declined.stdin(Stdio::piped());
        let mut declined = declined.spawn().unwrap();
        let mut stdin = declined.stdin.take().unwrap();
        stdin.write_all(b"n\n").await.unwrap();
        drop(stdin);
        let declined = tokio::time::timeout(RUN_LIMIT, declined.wait_with_output())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(declined.status.code(), Some(1));
        assert!(String::from_utf8_lossy(&declined.stderr).contains("[y/N]"));
        let still: i64 = raw.exists("cli:leaked").await.unwrap();
        assert_eq!(still, 1);

        // Confirmed with --yes: deleted, and the waiter woken at once.
        force_unlock_wakes(&url, "cli:leaked", acquired).await;
        waiting.await.unwrap();

        let (status, none) = run_json(&url, &["leaks"]).await;
        assert_eq!((status, none), (0, Value::Array(Vec::new())));
        let (status, again) = run_json(&url, &["force-unlock", "cli:leaked", "--yes"]).await;
        assert_eq!((status, &again["unlocked"]), (1, &Value::Bool(false)));

        // A fair lock's waiter whose place ended long ago (its keys do expire).
        let now_ms = common::server_millis(&raw).await as f64;
        queue_waiter(&raw, "cli:fair", now_ms - 120_000.0, Some(600_000)).await;
        let (status, stale) = run_json(&url, &["leaks", "--grace", "60"]).await;
        assert_eq!(status, 1);
        assert_eq!(stale[0]["rule"], "stale_waiter", "{stale}");
        assert_eq!(stale[0]["kind"], "fair_lock");
        let (status, _) = run_json(&url, &["leaks", "--grace", "300"]).await;
        assert_eq!(status, 0, "ended 120 s ago is within a 300 s grace");

        // Redisson's waiters leave the queue's keys without expiry: no leak while one is alive,
        // both rules once its place ended long ago.
        let (queue, timeouts) = (
            common::queue_key("cli:java"),
            common::timeout_key("cli:java"),
        );
        queue_waiter(&raw, "cli:java", now_ms + 60_000.0, None).await;
        let (status, none) = run_json(&url, &["leaks", "--pattern", "cli:java"]).await;
        assert_eq!((status, none), (0, Value::Array(Vec::new())));
        // Its place ended long ago.
        let _: i64 = raw
            .zadd(
                &timeouts,
                None,
                None,
                false,
                false,
                (now_ms - 120_000.0, OWNER),
            )
            .await
            .unwrap();
        let (status, found) = run_json(&url, &["leaks", "--pattern", "cli:java"]).await;
        assert_eq!(status, 1);
        let mut rules: Vec<(&str, &str)> = found
            .as_array()
            .unwrap()
            .iter()
            .map(|leak| {
                (
                    leak["rule"].as_str().unwrap(),
                    leak["key"].as_str().unwrap(),
                )
            })
            .collect();
        rules.sort();
        assert_eq!(
            rules,
            [
                ("no_expiry", queue.as_str()),
                ("no_expiry", timeouts.as_str()),
                ("stale_waiter", queue.as_str())
            ]
        );
        client.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn watch_prints_acquire_and_release_events() {
    let server = RedisServer::start();
    bounded(async {
        let url = server.url();
        let client = server.lock_client(Duration::from_secs(30)).await;
        let mut watcher = fredlock(
            &url,
            &[
                "--json",
                "watch",
                "cli:watched",
                "--interval-ms",
                "20",
                "--count",
                "4",
            ],
        )
        .spawn()
        .unwrap();
        let mut lines = BufReader::new(watcher.stdout.take().unwrap()).lines();
        // Let the watcher read the lock once before anything happens.
        tokio::time::sleep(Duration::from_millis(500)).await;

        let lock = client.lock("cli:watched");
        let pause = Duration::from_millis(200);
        let outer = lock.lock().await.unwrap();
        let owner = outer.owner_field().to_owned();
        tokio::time::sleep(pause).await;
        let inner = lock.lock().await.unwrap();
        tokio::time::sleep(pause).await;
        inner.unlock().await.unwrap();
        tokio::time::sleep(pause).await;
        outer.unlock().await.unwrap();

        let mut events = Vec::new();
        while events.len() < 4 {
            let line = tokio::time::timeout(Duration::from_secs(5), lines.next_line())
                .await
                .expect("an event within 5 s")
                .unwrap()
                .expect("a line");
            let event: Value = serde_json::from_str(&line).unwrap();
            assert_eq!(event["name"], "cli:watched");
            assert_eq!(event["owner"], owner.as_str());
            events.push(event["event"].as_str().unwrap().to_owned());
        }
        assert_eq!(
            events,
            ["acquired", "reentered", "released_one", "released"]
        );
        let status = tokio::time::timeout(Duration::from_secs(5), watcher.wait())
            .await
            .expect("watch ends after --count events")
            .unwrap();
        assert!(status.success());

        // Without --count it watches until stopped.
        let mut endless = fredlock(&url, &["watch", "cli:watched"]).spawn().unwrap();
        let mut lines = BufReader::new(endless.stdout.take().unwrap()).lines();
        let first = tokio::time::timeout(Duration::from_secs(5), lines.next_line())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(first.starts_with("watching \"cli:watched\""), "{first}");
        // Past its first reading, which shows what stood (nothing, here) when it began.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let guard = lock.lock().await.unwrap();
        let acquired = tokio::time::timeout(Duration::from_secs(5), lines.next_line())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        // `05:31:02.123 acquired <owner> (holds: 1)`: the time it was seen, in UTC.
        let (clock, event) = acquired.split_once(' ').unwrap();
        assert!(
            clock.len() == 12 && clock.as_bytes()[2] == b':' && clock.as_bytes()[8] == b'.',
            "{acquired}"
        );
        assert_eq!(
            event,
            format!("acquired {} (holds: 1)", guard.owner_field())
        );
        assert!(
            tokio::time::timeout(Duration::from_millis(300), endless.wait())
                .await
                .is_err(),
            "still watching"
        );
        endless.kill().await.unwrap();

        // A hold that stood before the watch began is shown as `held`, not as an acquisition
        // at the watch's start (issue 42).
        let mut late = fredlock(&url, &["--json", "watch", "cli:watched", "--count", "1"])
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(late.stdout.take().unwrap()).lines();
        let line = tokio::time::timeout(Duration::from_secs(5), lines.next_line())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let event: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(event["event"], "held", "{line}");
        assert_eq!(event["owner"], guard.owner_field(), "{line}");
        assert_eq!(event["count"], 1, "{line}");
        let status = tokio::time::timeout(Duration::from_secs(5), late.wait())
            .await
            .expect("watch ends after --count events")
            .unwrap();
        assert!(status.success());
        guard.unlock().await.unwrap();
        client.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_reports_the_deployment_and_exits_by_its_warnings() {
    let bare = RedisServer::start();
    let durable = RedisServer::start_with(&["--appendonly", "yes"], common::free_port);
    bounded(async {
        let (status, report) = run_json(&bare.url(), &["doctor"]).await;
        assert_eq!(status, 1, "{report}");
        assert_eq!(report["topology"]["type"], "standalone");
        assert_eq!(
            report["nodes"][0]["server"],
            format!("127.0.0.1:{}", bare.port())
        );
        assert_eq!(report["nodes"][0]["appendonly"], false);
        let warnings = report["warnings"].as_array().unwrap();
        assert!(
            warnings
                .iter()
                .any(|warning| warning.as_str().unwrap().contains("no persistence")),
            "{warnings:?}"
        );

        let (status, report) = run_json(&durable.url(), &["doctor"]).await;
        assert_eq!(status, 0, "{report}");
        assert_eq!(report["warnings"], Value::Array(Vec::new()));
        let (output, text) = run(&durable.url(), &["doctor"]).await;
        assert!(output.status.success());
        assert!(
            text.starts_with("standalone server") && text.contains("no warnings"),
            "{text}"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_exit_2_with_a_message_and_url_beats_the_environment() {
    let server = RedisServer::start();
    bounded(async {
        // Nothing listens on the port of a server just stopped.
        let port = common::free_port();
        let nowhere = format!("redis://127.0.0.1:{port}");
        let (output, _) = run(&nowhere, &["list"]).await;
        assert_eq!(output.status.code(), Some(2));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.starts_with("fredlock: ") && stderr.contains(&port.to_string()),
            "{stderr}"
        );

        // --url wins over REDIS_URL.
        let (output, stdout) = run(&nowhere, &["--url", &server.url(), "list"]).await;
        assert!(output.status.success(), "{stdout}");

        let (output, _) = run(&server.url(), &["inspect"]).await;
        assert_eq!(
            output.status.code(),
            Some(2),
            "a missing name is a usage error"
        );
        let (output, _) = run(&server.url(), &["inspect", ""]).await;
        assert_eq!(output.status.code(), Some(2), "an empty name is refused");
    })
    .await;
}

/// `force-unlock` reads the kind from the keys: a leaked fair lock's first waiter, which listens
/// on a channel of its own, is told and holds it at once (a plain lock's unlock message would
/// leave it to its next retry, a third of its place's length later).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn force_unlock_by_name_tells_a_fair_lock_s_first_waiter() {
    let server = RedisServer::start();
    bounded(async {
        let url = server.url();
        let raw = server.raw().await;
        leak(&raw, "cli:fair-leak", OWNER).await;
        let client = server.fair_client(Duration::from_secs(6)).await;
        let (waiting, acquired) = waiter(client.fair_lock("cli:fair-leak").as_lock().clone());
        assert!(
            common::eventually(Duration::from_secs(5), || async {
                let queued: i64 = raw.llen(common::queue_key("cli:fair-leak")).await.unwrap();
                queued == 1
            })
            .await
        );
        let (status, seen) = run_json(&url, &["inspect", "cli:fair-leak"]).await;
        assert_eq!(status, 0);
        assert_eq!(seen["kind"], "fair_lock");
        assert_eq!(seen["holders"][0]["remaining_lease_ms"], Value::Null);

        force_unlock_wakes(&url, "cli:fair-leak", acquired).await;
        waiting.await.unwrap();
        client.shutdown().await;
    })
    .await;
}

/// A read-write lock: listed with its mode, readers and waiting writer; inspected with its
/// timeout keys and an orphan one; the orphan without expiry is a leak; force-unlock by name
/// deletes it in either mode and hands it to the writer.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rw_lock_is_listed_inspected_and_its_orphans_found() {
    let server = RedisServer::start();
    bounded(async {
        let url = server.url();
        let raw = server.raw().await;
        let client = server.lock_client(Duration::from_secs(30)).await;
        let rw = client.rw_lock("cli:rw");
        let first = rw
            .clone()
            .with_owner(fredlock::OwnerId::from_raw(1))
            .read_lock();
        let second = rw
            .clone()
            .with_owner(fredlock::OwnerId::from_raw(2))
            .read_lock();
        let first = first.lock().await.unwrap();
        let _second = second.lock().await.unwrap();
        let (writer, acquired) = waiter(
            rw.clone()
                .with_owner(fredlock::OwnerId::from_raw(3))
                .write_lock()
                .into(),
        );
        assert!(
            common::eventually(Duration::from_secs(5), || async {
                let waiting: i64 = raw.zcard("fredlock_rwlock_writers:{cli:rw}").await.unwrap();
                waiting == 1
            })
            .await
        );
        let orphan = format!("{{cli:rw}}:{OWNER}:rwlock_timeout:1");
        let _: () = raw.set(&orphan, 1, None, None, false).await.unwrap();

        let (status, listed) = run_json(&url, &["list"]).await;
        assert_eq!(status, 0);
        let listed = listed.as_array().unwrap();
        assert_eq!(listed.len(), 1, "{listed:?}");
        assert_eq!(listed[0]["kind"], "rw_lock");
        assert_eq!(listed[0]["mode"], "read");
        assert_eq!(listed[0]["holders"].as_array().unwrap().len(), 2);
        assert!(listed[0]["queue"][0]["owner"]
            .as_str()
            .unwrap()
            .ends_with(":write"));
        let (output, table) = run(&url, &["list"]).await;
        assert!(output.status.success());
        assert!(table.contains("rw_lock (read)"), "{table}");
        // One waiting writer queued; one client listening for the unlock.
        let row: Vec<&str> = table.lines().nth(1).unwrap().split_whitespace().collect();
        assert_eq!(row[row.len() - 2..], ["1", "1"], "{table}");

        let (status, seen) = run_json(&url, &["inspect", "cli:rw"]).await;
        assert_eq!(status, 0);
        let timeout_key = format!("{{cli:rw}}:{}:rwlock_timeout:1", first.owner_field());
        let keys: Vec<&str> = seen["keys"]
            .as_array()
            .unwrap()
            .iter()
            .map(|key| key["key"].as_str().unwrap())
            .collect();
        assert!(keys.contains(&timeout_key.as_str()), "{keys:?}");
        assert_eq!(seen["orphans"][0]["key"], orphan.as_str());
        assert_eq!(seen["orphans"][0]["ttl_ms"], Value::Null);
        let (output, text) = run(&url, &["inspect", "cli:rw"]).await;
        assert!(output.status.success());
        assert!(text.starts_with("cli:rw (rw_lock (read))"), "{text}");
        assert!(
            text.contains("writer waiting #1") && text.contains("orphan key"),
            "{text}"
        );

        let (status, leaks) = run_json(&url, &["leaks"]).await;
        assert_eq!(status, 1, "{leaks}");
        assert_eq!(leaks[0]["key"], orphan.as_str());
        assert_eq!(leaks[0]["kind"], "rw_lock");

        force_unlock_wakes(&url, "cli:rw", acquired).await;
        writer.await.unwrap();
        let _: i64 = raw.del(&orphan).await.unwrap();
        let (status, none) = run_json(&url, &["leaks"]).await;
        assert_eq!((status, none), (0, serde_json::json!([])));
        drop(first);
        client.shutdown().await;
    })
    .await;
}

/// Semaphores and latches: a permit semaphore is listed with its live lease and inspected with
/// its permits available and an ended lease, which `leaks` reports past its grace; a latch is
/// inspected by name as a counter with its count; neither can be force-unlocked.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn semaphores_and_latches_are_listed_inspected_and_their_ended_leases_found() {
    let server = RedisServer::start();
    bounded(async {
        let url = server.url();
        let client = server.lock_client(Duration::from_secs(30)).await;
        let slots = client.permit_semaphore("cli:slots");
        slots.try_set_permits(3).await.unwrap();
        let live = slots.acquire().await.unwrap();
        let short = slots
            .try_acquire(Duration::ZERO, Some(Duration::from_millis(50)))
            .await
            .unwrap()
            .unwrap();
        let short_id = short.id().to_owned();
        // Its lease ends with nobody giving it back.
        std::mem::forget(short);
        let exports = client.semaphore("cli:exports");
        exports.try_set_permits(2).await.unwrap();
        let export = exports.acquire(2).await.unwrap();
        let latch = client.count_down_latch("cli:phase");
        latch.try_set_count(4).await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;

        let (status, listed) = run_json(&url, &["list"]).await;
        assert_eq!(status, 0);
        let listed = listed.as_array().unwrap();
        let kinds: Vec<(&str, &str)> = listed
            .iter()
            .map(|seen| {
                (
                    seen["name"].as_str().unwrap(),
                    seen["kind"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            kinds,
            [
                ("cli:exports", "semaphore"),
                ("cli:slots", "permit_semaphore")
            ],
            "{listed:?}"
        );
        assert_eq!(listed[0]["holders"][0]["owner"], export.grant());
        assert_eq!(listed[0]["holders"][0]["count"], 2);
        assert_eq!(listed[0]["count"], 0);

        let (status, seen) = run_json(&url, &["inspect", "cli:slots"]).await;
        assert_eq!(status, 0);
        assert_eq!(seen["count"], 1);
        assert_eq!(seen["holders"][0]["owner"], live.id());
        let lease = seen["holders"][0]["remaining_lease_ms"].as_u64().unwrap();
        assert!(lease > 20_000 && lease <= 30_000, "{lease}");
        assert_eq!(seen["ended_leases"][0]["permit"], short_id.as_str());
        assert!(seen["ended_leases"][0]["ended_ago_ms"].as_u64().unwrap() >= 100);
        let (output, text) = run(&url, &["inspect", "cli:slots"]).await;
        assert!(output.status.success());
        assert!(text.contains("permits available 1"), "{text}");
        assert!(
            text.contains(&format!("permit {short_id}: lease ended")),
            "{text}"
        );

        let (status, leaks) = run_json(&url, &["leaks", "--grace", "0"]).await;
        assert_eq!(status, 1, "an ended lease is a leak past the grace");
        assert_eq!(leaks[0]["rule"], "ended_lease", "{leaks}");
        assert_eq!(leaks[0]["name"], "cli:slots");
        let (status, _) = run_json(&url, &["leaks"]).await;
        assert_eq!(status, 0, "within the default grace it is none");

        let (status, seen) = run_json(&url, &["inspect", "cli:phase"]).await;
        assert_eq!(status, 0);
        assert_eq!(seen["kind"], "counter");
        assert_eq!(seen["count"], 4);
        let (output, text) = run(&url, &["inspect", "cli:phase"]).await;
        assert!(output.status.success());
        assert!(text.contains("count 4"), "{text}");

        let (output, _) = run(&url, &["force-unlock", "--yes", "cli:slots"]).await;
        assert_eq!(output.status.code(), Some(2), "not a lock");
        live.release().await.unwrap();
        export.release().await.unwrap();
    })
    .await;
}

/// Who holds it (issue 34, trap 4): a client name given on the builder is each connection's
/// name (`CLIENT SETNAME`, again after a reconnect) and shows beside the owner field in
/// inspections, `list`, `inspect` and `watch`; `watch` reports a take-over in the order it
/// happened, the old holder's end (a release, or an expiry) before the new holder's acquisition.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn client_names_show_and_watch_orders_a_take_over() {
    let mut server = RedisServer::start();
    bounded(async {
        let url = server.url();
        let named = |name: &'static str| {
            let url = url.clone();
            async move {
                common::builder()
                    .url(url)
                    .client_name(name)
                    .build()
                    .await
                    .unwrap()
            }
        };
        let (seven, eight) = (named("billing-7").await, named("billing-8").await);
        assert_eq!(seven.client_name(), Some("billing-7"));
        let raw = server.raw().await;
        let connections = |raw: Client| async move {
            let list: String = raw.client_list::<String, String>(None, None).await.unwrap();
            list
        };
        let listed = connections(raw.clone()).await;
        assert!(
            listed.contains(&format!("name=billing-7@{}", seven.id())),
            "{listed}"
        );

        let guard = seven.lock("cli:named").lock().await.unwrap();
        let inspection = eight.lock("cli:named").inspect().await.unwrap();
        assert_eq!(
            inspection.holders[0].client_name.as_deref(),
            Some("billing-7")
        );
        assert_eq!(inspection.holders[0].owner, guard.owner_field());
        let (status, json) = run_json(&url, &["inspect", "cli:named"]).await;
        assert_eq!(status, 0);
        assert_eq!(json["holders"][0]["client_name"], "billing-7");
        let (_, text) = run(&url, &["inspect", "cli:named"]).await;
        assert!(
            text.contains(&format!("held by {} (billing-7) x1", guard.owner_field())),
            "{text}"
        );
        let (_, list) = run(&url, &["list"]).await;
        assert!(list.contains("(billing-7) x1"), "{list}");
        // A listing names every holder from one CLIENT LIST, not one per primitive.
        let other = seven.lock("cli:named-too").lock().await.unwrap();
        let calls = common::command_calls(&raw).await;
        let listed = eight.list("cli:*").await.unwrap();
        let named: Vec<_> = listed
            .iter()
            .flat_map(|inspection| &inspection.holders)
            .map(|holder| holder.client_name.as_deref())
            .collect();
        assert_eq!(named, [Some("billing-7"), Some("billing-7")]);
        let sent = common::commands_since(&raw, &calls).await;
        assert!(sent.contains(&("client|list".to_string(), 1)), "{sent:?}");
        other.unlock().await.unwrap();
        guard.unlock().await.unwrap();

        // Take-overs, each read in one look of the watcher: seven releases and eight (waiting)
        // takes it; eight releases and seven takes it for a lease; the lease ends and eight
        // (waiting) takes it.
        let mut watcher = fredlock(
            &url,
            &[
                "--json",
                "watch",
                "cli:named",
                "--interval-ms",
                "250",
                "--count",
                "7",
            ],
        )
        .spawn()
        .unwrap();
        let mut lines = BufReader::new(watcher.stdout.take().unwrap()).lines();
        tokio::time::sleep(Duration::from_millis(600)).await;
        let waits = |client: &fredlock::LockClient| {
            let lock = client.lock("cli:named");
            tokio::spawn(async move { lock.lock().await.unwrap() })
        };
        let first = seven.lock("cli:named").lock().await.unwrap();
        tokio::time::sleep(Duration::from_millis(600)).await;
        let taking = waits(&eight);
        tokio::time::sleep(Duration::from_millis(50)).await;
        first.unlock().await.unwrap();
        let second = taking.await.unwrap();
        tokio::time::sleep(Duration::from_millis(600)).await;
        let leased = tokio::spawn({
            let lock = seven.lock("cli:named");
            async move {
                lock.lock_with_lease(Duration::from_millis(700))
                    .await
                    .unwrap()
            }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        second.unlock().await.unwrap();
        let leased = leased.await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let last = waits(&eight).await.unwrap();

        let mut events = Vec::new();
        while events.len() < 7 {
            let line = tokio::time::timeout(Duration::from_secs(5), lines.next_line())
                .await
                .expect("an event within 5 s")
                .unwrap()
                .expect("a line");
            let event: Value = serde_json::from_str(&line).unwrap();
            events.push((
                event["event"].as_str().unwrap().to_owned(),
                event["client_name"].as_str().unwrap_or("?").to_owned(),
            ));
        }
        let seen: Vec<(&str, &str)> = events
            .iter()
            .map(|(what, client)| (what.as_str(), client.as_str()))
            .collect();
        assert_eq!(
            seen,
            [
                ("acquired", "billing-7"),
                ("released", "billing-7"),
                ("acquired", "billing-8"),
                ("released", "billing-8"),
                ("acquired", "billing-7"),
                ("expired", "billing-7"),
                ("acquired", "billing-8"),
            ]
        );
        drop(leased);
        last.unlock().await.unwrap();

        // After a restart, the new connections are named again.
        server.kill();
        server.start_again();
        let raw = server.raw().await;
        let named_again = common::eventually(Duration::from_secs(10), || {
            let raw = raw.clone();
            let id = seven.id();
            async move {
                connections(raw)
                    .await
                    .contains(&format!("name=billing-7@{id}"))
            }
        })
        .await;
        assert!(
            named_again,
            "the connections are named again after a restart"
        );
        seven.shutdown().await;
        eight.shutdown().await;
    })
    .await;
}

//! The growth scenarios of issue 59 beside scenario 14 (instances on one lock): held locks
//! (15), waiting tasks on many names (16), and a three-master cluster against one server (17),
//! each a row per size.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fred::prelude::*;
use fredlock::{Backend, LockClient};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::harness;
use crate::measure::{self, Summary};
use crate::scenarios::{
    alternating, command_calls, cycles_per_second, hold_many, lock_cycle, raw_client, server_time,
    watchdog_client, Sizes, SHORT_WATCHDOG,
};
use crate::Row;

/// Held locks of scenario 15, full run and `--quick`.
pub const HELD: [usize; 3] = [1_000, 10_000, 100_000];
pub const HELD_QUICK: [usize; 2] = [1_000, 10_000];

/// Waiting tasks and the names they wait on, scenario 16, full run and `--quick`: ten tasks
/// a name.
pub const WAITERS: [(usize, usize); 3] = [(1_000, 100), (10_000, 1_000), (100_000, 10_000)];
pub const WAITERS_QUICK: [(usize, usize); 2] = [(1_000, 100), (10_000, 1_000)];

/// Watchdog periods scenario 15 measures over.
const PERIODS: u32 = 3;

/// The clients (separate instances) the waiting tasks of scenario 16 are spread over.
const WAITING_CLIENTS: usize = 4;

/// Scenario 15: held locks as they grow. One client with a 3 s watchdog lease (renewed every
/// second) holds `count` locks on names of their own; per size: the renewal scripts Redis runs
/// per period and its CPU for them, the client's CPU, and the client's heap per held lock.
pub async fn held(url: &str, sizes: &[usize]) -> Vec<Row> {
    let raw = raw_client(url).await;
    let period = SHORT_WATCHDOG / 3;
    let mut rows = Vec::new();
    for &count in sizes {
        let scenario = format!("15 held locks ({count})");
        let client = watchdog_client(url, SHORT_WATCHDOG).await;
        measure::count_heap(true);
        let heap = measure::live_heap_bytes();
        let guards = hold_many(&client, &format!("bench:held{count}"), count).await;
        // Let the renewals of locks taken at different moments fall into step.
        tokio::time::sleep(period * 2).await;
        let heap_per = (measure::live_heap_bytes() - heap) as f64 / count as f64;
        let scripts_before = command_calls(&raw, "evalsha").await;
        let cpu_before = measure::cpu_time();
        let started = Instant::now();
        let ((), redis_cpu) = server_time(&raw, tokio::time::sleep(period * PERIODS)).await;
        let client_cpu =
            (measure::cpu_time() - cpu_before).as_secs_f64() / started.elapsed().as_secs_f64();
        let scripts = command_calls(&raw, "evalsha").await - scripts_before;
        measure::count_heap(false);
        let lost = guards.iter().filter(|guard| guard.is_lost()).count();
        assert_eq!(lost, 0, "the watchdog lost held locks during the benchmark");
        drop(guards);
        client.shutdown().await;
        let per_period = f64::from(PERIODS);
        rows.extend([
            Row::single(
                &scenario,
                "fredlock",
                "renewal scripts per 1 s period",
                "calls",
                scripts as f64 / per_period,
            ),
            Row::single(
                &scenario,
                "fredlock",
                "Redis CPU per period",
                "ms",
                redis_cpu / 1e3 / per_period,
            ),
            Row::single(
                &scenario,
                "fredlock",
                "client CPU",
                "% of a core",
                client_cpu * 100.0,
            ),
            Row::single(
                &scenario,
                "fredlock",
                "heap per held lock",
                "bytes",
                heap_per,
            ),
        ]);
    }
    rows
}

/// When each name was released and taken, in scenario 16.
type Timeline = Vec<Mutex<(Vec<Instant>, Vec<Instant>)>>;

/// Scenario 16: waiting tasks as they grow. `count` tasks spread over four clients wait on
/// `names` names (ten a name, each name's waiters from every client) that a fifth client holds;
/// then it releases them all at once, and each task, once it holds its name, releases it at
/// once. Per size: the SUBSCRIBE commands and channels the waiting took, the heap per waiting
/// task, the scripts Redis runs a second while they only wait, each hand-off's latency (a
/// release returned -> the next task holds) and its 99th percentile, the time until every task
/// had its turn, and the scripts per acquisition meanwhile.
pub async fn waiters(url: &str, sizes: &[(usize, usize)]) -> Vec<Row> {
    let raw = raw_client(url).await;
    let mut rows = Vec::new();
    for &(count, names) in sizes {
        let scenario = format!("16 waiters ({count} on {names} names)");
        let prefix = format!("bench:waiters{count}");
        let holder = LockClient::connect(url).await.expect("connect");
        let guards = hold_many(&holder, &prefix, names).await;
        let mut clients = Vec::with_capacity(WAITING_CLIENTS);
        for _ in 0..WAITING_CLIENTS {
            clients.push(LockClient::connect(url).await.expect("connect"));
        }
        let timeline: Arc<Timeline> = Arc::new((0..names).map(|_| Mutex::default()).collect());
        let subscribes_before = subscribe_calls(&raw).await;
        measure::count_heap(true);
        let heap = measure::live_heap_bytes();
        let started = Instant::now();
        let mut tasks = JoinSet::new();
        let mut pairs = std::collections::HashSet::new();
        for task in 0..count {
            let (name, client) = (task % names, (task / names) % WAITING_CLIENTS);
            pairs.insert((name, client));
            let lock = clients[client].lock(format!("{prefix}:{name}"));
            let timeline = timeline.clone();
            tasks.spawn(async move {
                let guard = lock.lock().await.expect("a waiting task locks");
                let taken = Instant::now();
                guard.unlock().await.expect("a waiting task unlocks");
                let mut times = timeline[name].lock().expect("timeline");
                times.1.push(taken);
                times.0.push(Instant::now());
            });
        }
        let subscribed = || {
            clients
                .iter()
                .map(|c| c.stats().subscriptions)
                .sum::<usize>()
        };
        let limit = started + Duration::from_secs(300);
        while subscribed() < pairs.len() && Instant::now() < limit {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let subscribed_in = started.elapsed().as_secs_f64() * 1e3;
        // Each task's attempt after it joined its channel has to come back before it waits.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let heap_per = (measure::live_heap_bytes() - heap) as f64 / count as f64;
        measure::count_heap(false);
        let subscribes = subscribe_calls(&raw).await - subscribes_before;
        let channels = subscribed();
        // What only waiting costs Redis: the attempts that keep each place in line.
        let idle = Duration::from_secs(5);
        let scripts_before = command_calls(&raw, "evalsha").await;
        tokio::time::sleep(idle).await;
        let scripts_at_release = command_calls(&raw, "evalsha").await;
        let idle_scripts = (scripts_at_release - scripts_before) as f64 / idle.as_secs_f64();

        let released = Instant::now();
        let mut releases = JoinSet::new();
        for (name, guard) in guards.into_iter().enumerate() {
            let timeline = timeline.clone();
            releases.spawn(async move {
                guard.unlock().await.expect("the holder unlocks");
                timeline[name]
                    .lock()
                    .expect("timeline")
                    .0
                    .push(Instant::now());
            });
        }
        while let Some(done) = releases.join_next().await {
            done.expect("a release");
        }
        while let Some(done) = tasks.join_next().await {
            done.expect("a waiting task");
        }
        let drained = released.elapsed().as_secs_f64() * 1e3;
        let scripts = command_calls(&raw, "evalsha").await - scripts_at_release;
        let mut latencies = Vec::with_capacity(count);
        for name in timeline.iter() {
            let (mut released, mut taken) = std::mem::take(&mut *name.lock().expect("timeline"));
            released.sort();
            taken.sort();
            // The k-th taking follows the k-th release: one holder at a time.
            for (release, take) in released.iter().zip(&taken) {
                latencies.push(take.saturating_duration_since(*release).as_secs_f64() * 1e3);
            }
        }
        holder.shutdown().await;
        for client in clients {
            client.shutdown().await;
        }
        let latency = Summary::of(&latencies);
        rows.extend([
            Row::single(
                &scenario,
                "fredlock",
                "SUBSCRIBE commands",
                "count",
                subscribes as f64,
            ),
            Row::single(
                &scenario,
                "fredlock",
                "channels joined",
                "count",
                channels as f64,
            ),
            Row::single(
                &scenario,
                "fredlock",
                "until every channel is joined",
                "ms",
                subscribed_in,
            ),
            Row::single(
                &scenario,
                "fredlock",
                "heap per waiting task",
                "bytes",
                heap_per,
            ),
            Row::single(
                &scenario,
                "fredlock",
                "scripts a second while only waiting",
                "calls/s",
                idle_scripts,
            ),
            Row::new(
                &scenario,
                "fredlock",
                "release -> next holds",
                "ms",
                latency,
            ),
            Row::single(
                &scenario,
                "fredlock",
                "release -> next holds, p99",
                "ms",
                latency.p99,
            ),
            Row::single(
                &scenario,
                "fredlock",
                "mass release -> every task had its turn",
                "ms",
                drained,
            ),
            Row::single(
                &scenario,
                "fredlock",
                "scripts per acquisition after the release",
                "calls",
                scripts as f64 / count as f64,
            ),
        ]);
    }
    rows
}

/// SUBSCRIBE and SSUBSCRIBE commands the server has counted.
async fn subscribe_calls(raw: &Client) -> u64 {
    command_calls(raw, "subscribe").await + command_calls(raw, "ssubscribe").await
}

/// Tasks of scenario 17, each looping on a name of its own.
const CLUSTER_TASKS: usize = 64;

/// Scenario 17: a three-master cluster on loopback against one server on the same cores. On
/// each backend: 64 tasks of one client, each looping lock+unlock on a name of its own (the
/// names spread over the slots), cycles a second on the cluster and on the server, alternating
/// rounds; and on the cluster, a waiter's wake-up over sharded pub/sub (unlock returned ->
/// waiter holds) against a PING of the master that owns the name.
pub async fn cluster(sizes: Sizes) -> Vec<Row> {
    let cluster = harness::RedisCluster::start();
    let single = harness::RedisServer::start();
    let mut rows = Vec::new();
    for (backend, subject) in [
        (Backend::Fred, "fredlock"),
        (Backend::RedisRs, crate::libs::ON_REDIS_RS),
    ] {
        let on_cluster = connect(backend, &cluster.url()).await;
        let on_single = connect(backend, &single.url()).await;
        let run = |clustered: bool| {
            let client = if clustered { &on_cluster } else { &on_single };
            let cycles: Vec<_> = (0..CLUSTER_TASKS)
                .map(|i| {
                    let lock = Arc::new(client.lock(format!("bench:cluster:{i}")));
                    move || {
                        let lock = lock.clone();
                        async move { lock_cycle(&lock).await }
                    }
                })
                .collect();
            cycles_per_second(sizes.run_for, cycles)
        };
        let (clustered, alone) = alternating(sizes.rounds, run).await;
        rows.extend([
            Row::new(
                "17 cluster",
                subject,
                "64 tasks on 64 names, three masters",
                "cycles/s",
                clustered,
            ),
            Row::new(
                "17 cluster",
                subject,
                "64 tasks on 64 names, one server",
                "cycles/s",
                alone,
            ),
            Row::ratio(
                "17 cluster",
                &format!("{subject}: three masters / one server"),
                clustered.median / alone.median,
            ),
        ]);

        let name = format!("bench:cluster:wake:{subject}");
        let ping_client =
            raw_client(&format!("redis://127.0.0.1:{}", cluster.master_of(&name))).await;
        let waiting = connect(backend, &cluster.url()).await;
        let (mut wakeups, mut pings) = (Vec::new(), Vec::new());
        for round in 0..=sizes.wakeups {
            let held = on_cluster.lock(&name).lock().await.expect("lock");
            let waiter = {
                let lock = waiting.lock(&name);
                tokio::spawn(async move {
                    let guard = lock.lock().await.expect("waiter locks");
                    let at = Instant::now();
                    guard.unlock().await.expect("waiter unlocks");
                    at
                })
            };
            tokio::time::sleep(Duration::from_millis(20)).await;
            held.unlock().await.expect("unlock");
            let unlocked = Instant::now();
            let taken = waiter.await.expect("waiter");
            if round > 0 {
                wakeups.push(taken.saturating_duration_since(unlocked).as_secs_f64() * 1e3);
                let started = Instant::now();
                let _: String = ping_client.ping(None).await.expect("ping");
                pings.push(started.elapsed().as_secs_f64() * 1e3);
            }
        }
        let (wakeup, ping) = (Summary::of(&wakeups), Summary::of(&pings));
        rows.extend([
            Row::new(
                "17 cluster",
                subject,
                "sharded wake-up: unlock -> waiter holds",
                "ms",
                wakeup,
            ),
            Row::new(
                "17 cluster",
                subject,
                "PING of the name's master",
                "ms",
                ping,
            ),
            Row::ratio(
                "17 cluster",
                &format!("{subject}: sharded wake-up / PING"),
                wakeup.median / ping.median,
            ),
        ]);
        on_cluster.shutdown().await;
        on_single.shutdown().await;
        waiting.shutdown().await;
    }
    rows
}

async fn connect(backend: Backend, url: &str) -> LockClient {
    LockClient::builder()
        .backend(backend)
        .url(url)
        .build()
        .await
        .expect("connect")
}

//! The measured scenarios. Each returns its rows; `main` prints them and checks the targets.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fred::prelude::*;
use fred::types::InfoKind;
use fredlock::LockClient;
use tokio::time::Instant;

use crate::herd;
use crate::libs::{self, Library};
use crate::measure::{self, Summary};
use crate::Row;
use fredlock::prelude::*;

/// How much work each scenario does; `--quick` shrinks it for a smoke run.
#[derive(Clone, Copy)]
pub struct Sizes {
    pub rounds: usize,
    pub cycles: usize,
    pub run_for: Duration,
    pub wakeups: usize,
    pub many: usize,
    pub watch_for: Duration,
    /// The watchdog lease of scenario 5, whose period is a third of it.
    pub watchdog: Duration,
    /// The instance counts of scenario 14, and how long each runs.
    pub instances: &'static [usize],
    pub grow_for: Duration,
}

impl Sizes {
    pub fn full() -> Sizes {
        Sizes {
            rounds: 5,
            cycles: 20_000,
            run_for: Duration::from_secs(5),
            wakeups: 100,
            many: 10_000,
            watch_for: Duration::from_secs(10),
            watchdog: SHORT_WATCHDOG,
            instances: &INSTANCES,
            grow_for: Duration::from_secs(4),
        }
    }

    pub fn quick() -> Sizes {
        Sizes {
            rounds: 5,
            cycles: 1_000,
            run_for: Duration::from_millis(500),
            wakeups: 20,
            many: 2_000,
            watch_for: Duration::from_secs(3),
            watchdog: SHORT_WATCHDOG,
            instances: &[1, 2, 8],
            grow_for: Duration::from_millis(500),
        }
    }
}

pub async fn raw_client(url: &str) -> Client {
    let mut builder = Builder::from_config(Config::from_url(url).expect("url"));
    // The settings LockClient gives its own fred client, so that only the lock differs.
    builder
        .set_performance_config(fred::types::config::PerformanceConfig {
            default_command_timeout: fredlock::DEFAULT_COMMAND_TIMEOUT,
            broadcast_channel_capacity: 4096,
            ..Default::default()
        })
        .set_connection_config(fred::types::config::ConnectionConfig {
            max_command_attempts: 1,
            ..Default::default()
        });
    let client = builder.build().expect("fred client");
    client.init().await.expect("connect");
    client
}

/// Loads fredlock's script `name` (see `fredlock::script_source`): its own composition, so the
/// SHA is fredlock's own.
pub async fn load_script(redis: &Client, name: &str) -> String {
    redis
        .script_load::<String, _>(crate::harness::script(name))
        .await
        .expect("load script")
}

/// Our acquire and release scripts, run straight through fred: the floor fredlock sits on.
pub struct RawScripts {
    acquire: String,
    release: String,
    /// Request ids, as fredlock sends one with every call.
    next: std::sync::atomic::AtomicU64,
}

impl RawScripts {
    pub async fn load(redis: &Client) -> RawScripts {
        RawScripts {
            acquire: load_script(redis, "lock_acquire").await,
            release: load_script(redis, "lock_release").await,
            next: std::sync::atomic::AtomicU64::new(1),
        }
    }

    pub async fn cycle(&self, redis: &Client, name: &str, channel: &str, field: &str) {
        self.acquire(redis, name, field).await;
        self.release(redis, name, channel, field).await;
    }

    /// The acquire script alone, as fredlock sends it on an uncontended lock.
    pub async fn acquire(&self, redis: &Client, name: &str, field: &str) {
        self.try_acquire(redis, name, field).await;
    }

    /// The acquire script once: `None` when `field` holds the lock after it, otherwise the
    /// lock's time to live in ms.
    pub async fn try_acquire(&self, redis: &Client, name: &str, field: &str) -> Option<i64> {
        // The arguments fredlock sends: the hold count, a request id, the fence set's key.
        let fences = format!("fredlock_fences:{{{name}}}");
        let id = || self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) as i64;
        redis
            .evalsha(
                &self.acquire,
                vec![name, fences.as_str()],
                vec![
                    Value::from("30000"),
                    Value::from(field),
                    Value::from(0),
                    Value::from(id()),
                ],
            )
            .await
            .expect("raw acquire")
    }

    /// The release script alone.
    pub async fn release(&self, redis: &Client, name: &str, channel: &str, field: &str) {
        let fences = format!("fredlock_fences:{{{name}}}");
        let id = || self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) as i64;
        let _: Option<i64> = redis
            .evalsha(
                &self.release,
                vec![name, channel, fences.as_str()],
                vec![
                    Value::from("0"),
                    Value::from("30000"),
                    Value::from(field),
                    Value::from(0),
                    Value::from(id()),
                ],
            )
            .await
            .expect("raw release");
    }
}

/// The same two scripts, with the same arguments, through redis-rs (the client rslock runs on,
/// one multiplexed connection): what the round trips cost on another client than fred.
pub struct RedisRsScripts {
    connection: redis::aio::MultiplexedConnection,
    acquire: String,
    release: String,
    next: AtomicU64,
}

impl RedisRsScripts {
    pub async fn connect(url: &str, scripts: &RawScripts) -> RedisRsScripts {
        let client = redis::Client::open(url).expect("redis-rs url");
        RedisRsScripts {
            connection: client
                .get_multiplexed_async_connection()
                .await
                .expect("redis-rs connects"),
            acquire: scripts.acquire.clone(),
            release: scripts.release.clone(),
            next: AtomicU64::new(1),
        }
    }

    pub async fn cycle(&self, name: &str, channel: &str, field: &str) {
        self.acquire_one(name, field).await;
        self.release_one(name, channel, field).await;
    }

    /// The acquire script alone.
    pub async fn acquire_one(&self, name: &str, field: &str) {
        let fences = format!("fredlock_fences:{{{name}}}");
        let id = || self.next.fetch_add(1, Ordering::Relaxed) as i64;
        self.evalsha(&self.acquire, &[name, &fences], &["30000", field], id())
            .await;
    }

    /// The release script alone.
    pub async fn release_one(&self, name: &str, channel: &str, field: &str) {
        let fences = format!("fredlock_fences:{{{name}}}");
        let id = || self.next.fetch_add(1, Ordering::Relaxed) as i64;
        self.evalsha(
            &self.release,
            &[name, channel, &fences],
            &["0", "30000", field],
            id(),
        )
        .await;
    }

    /// `EVALSHA sha keys.. args.. 0 id`: the scripts' own arguments, then a hold count of 0 and
    /// the request id.
    async fn evalsha(&self, sha: &str, keys: &[&str], args: &[&str], id: i64) {
        let mut command = redis::cmd("EVALSHA");
        command
            .arg(sha)
            .arg(keys.len())
            .arg(keys)
            .arg(args)
            .arg(0)
            .arg(id);
        let _: Option<i64> = command
            .query_async(&mut self.connection.clone())
            .await
            .expect("redis-rs EVALSHA");
    }
}

/// A fredlock client on its redis-rs backend (issue 45).
pub async fn on_redis_rs_client(url: &str) -> LockClient {
    LockClient::builder()
        .backend(fredlock::Backend::RedisRs)
        .url(url)
        .build()
        .await
        .expect("fredlock on redis-rs connects")
}

/// One fredlock lock() + unlock().
pub async fn lock_cycle(lock: &fredlock::Lock) {
    let guard = lock.lock().await.expect("lock");
    guard.unlock().await.expect("unlock");
}

/// Runs `body` in a task of its own, as application code runs.
pub async fn in_task<F, T>(body: F) -> T
where
    F: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    tokio::spawn(body).await.expect("benchmark task")
}

/// Times `n` cycles in a task of their own: the mean per cycle and each cycle's latency (µs).
type Cycles = Box<dyn Fn(usize) -> libs::BoxFuture<'static, (f64, Vec<f64>)> + Send + Sync>;

/// One library's uncontended cycles in scenario 1.
struct Subject {
    library: String,
    metric: &'static str,
    run: Cycles,
}

impl Subject {
    fn new<F, Fut>(library: &str, metric: &'static str, cycle: F) -> Subject
    where
        F: Fn() -> Fut + Clone + Send + Sync + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        Subject {
            library: library.to_string(),
            metric,
            run: Box::new(move |n| {
                let cycle = cycle.clone();
                Box::pin(in_task(timed_cycles(n, cycle)))
            }),
        }
    }
}

/// The reentrant lock on redis-rs, in scenario 1.
const ON_REDIS_RS: &str = "fredlock on redis-rs";

/// Scenario 1: Uncontended latency of lock() + unlock(), against two raw EVALSHA calls of our
/// scripts and against the peers.
///
/// Every library runs in every round, a block of cycles each, starting from a different one each
/// round: drift of a shared machine then hits all alike, and each round gives paired ratios.
/// Also returns each cycle's latency (µs) for the reentrant lock, the raw floors and the peers,
/// for the chart of their distributions.
pub async fn uncontended(url: &str, sizes: Sizes) -> (Vec<Row>, Vec<(String, Vec<f64>)>) {
    let client = LockClient::connect(url).await.expect("connect");
    let raw = raw_client(url).await;
    let scripts = Arc::new(RawScripts::load(&raw).await);
    let redis_rs = Arc::new(RedisRsScripts::connect(url, &scripts).await);
    // Blocks short enough that a round of every library passes before the machine changes
    // much, and as many cycles per library in all as five rounds of `cycles`.
    let rounds = sizes.rounds * 4;
    let block = (sizes.cycles / 4).max(100);
    let mut subjects = Vec::new();
    // The reentrant lock, and the two primitives built on the same engine: the fenced lock
    // (its acquire also INCRs the token counter) and the spin lock (its release publishes
    // nothing).
    let locks = [
        ("fredlock", client.lock("bench:uncontended")),
        (
            "fredlock fenced",
            client
                .fenced_lock("bench:uncontended:fenced")
                .as_lock()
                .clone(),
        ),
        (
            "fredlock spin",
            client.spin_lock("bench:uncontended:spin").as_lock().clone(),
        ),
    ];
    // The reentrant lock on redis-rs (issue 45), against the same calls by hand through
    // redis-rs and against rslock, which runs on redis-rs too.
    let on_redis_rs = on_redis_rs_client(url).await;
    let locks = locks
        .into_iter()
        .chain([(ON_REDIS_RS, on_redis_rs.lock("bench:uncontended:redis-rs"))]);
    for (library, lock) in locks {
        subjects.push(Subject::new(library, "lock+unlock", move || {
            crate::recording::record(false);
            let lock = lock.clone();
            async move { lock_cycle(&lock).await }
        }));
    }
    // The same lock on a client whose event receiver never reads (issue 46): every event
    // goes into the receiver's ring, the oldest dropped.
    let listened = LockClient::connect(url).await.expect("connect");
    let idle_receiver = listened.events();
    let lock = listened.lock("bench:uncontended:events");
    subjects.push(Subject::new(
        crate::instructions::IDLE_RECEIVER,
        "lock+unlock",
        move || {
            crate::recording::record(false);
            let lock = lock.clone();
            async move { lock_cycle(&lock).await }
        },
    ));
    // Built with the `metrics` feature: the same lock with a Prometheus recorder recording.
    if crate::recording::ENABLED {
        let lock = client.lock("bench:uncontended:metrics");
        subjects.push(Subject::new(
            "fredlock + metrics recorder",
            "lock+unlock",
            move || {
                crate::recording::record(true);
                let lock = lock.clone();
                async move { lock_cycle(&lock).await }
            },
        ));
    }
    let (fred, floor) = (raw.clone(), scripts.clone());
    subjects.push(Subject::new(
        "raw EVALSHA x2",
        "acquire+release scripts",
        move || {
            let (raw, scripts) = (fred.clone(), floor.clone());
            async move {
                scripts
                    .cycle(
                        &raw,
                        "bench:raw",
                        "redisson_lock__channel:{bench:raw}",
                        "raw:1",
                    )
                    .await
            }
        },
    ));
    let other = redis_rs.clone();
    subjects.push(Subject::new(
        "redis-rs EVALSHA x2",
        "acquire+release scripts",
        move || {
            let redis_rs = other.clone();
            async move {
                redis_rs
                    .cycle(
                        "bench:redisrs",
                        "redisson_lock__channel:{bench:redisrs}",
                        "raw:1",
                    )
                    .await
            }
        },
    ));
    for name in &libs::NAMES[1..] {
        let library: Arc<dyn Library> = libs::connect(name, url).await.into();
        let handle: Arc<dyn libs::Handle> = library.handle("bench:uncontended:peer").into();
        subjects.push(Subject::new(name, "lock+unlock", move || {
            let handle = handle.clone();
            async move { handle.acquire().await.release().await }
        }));
    }
    for subject in &subjects {
        (subject.run)(block / 5).await;
    }
    let at = |library: &str| {
        subjects
            .iter()
            .position(|subject| subject.library == library)
    };
    let (ours, floor, rslock) = (at("fredlock"), at("raw EVALSHA x2"), at("rslock 0.10"));
    // Per subject: the mean of each round's block, each cycle, and what its cycles cost Redis
    // itself per cycle (its CPU time: on a machine where client and server share the cores,
    // that is round-trip time).
    let mut means: Vec<Vec<f64>> = vec![Vec::new(); subjects.len()];
    let mut each: Vec<Vec<f64>> = vec![Vec::new(); subjects.len()];
    let mut server: Vec<Vec<f64>> = vec![Vec::new(); subjects.len()];
    for round in 0..rounds {
        for offset in 0..subjects.len() {
            let i = (round + offset) % subjects.len();
            let ((mean, cycles), spent) = server_time(&raw, (subjects[i].run)(block)).await;
            means[i].push(mean);
            each[i].extend(cycles);
            server[i].push(spent / block as f64);
        }
    }
    let mut rows = Vec::new();
    let median_of = |i: Option<usize>| i.map(|i| Summary::of(&means[i]).median);
    for (i, subject) in subjects.iter().enumerate() {
        rows.push(Row::new(
            "1 uncontended",
            &subject.library,
            subject.metric,
            "µs",
            Summary::of(&means[i]),
        ));
        if subject.library.starts_with("fredlock") && subject.library != ON_REDIS_RS {
            if let Some(floor) = median_of(floor) {
                rows.push(Row::ratio(
                    "1 uncontended",
                    &format!("{} / raw", subject.library),
                    Summary::of(&means[i]).median / floor,
                ));
            }
        }
    }
    if let (Some(plain), Some(recorded)) = (
        median_of(ours),
        median_of(at("fredlock + metrics recorder")),
    ) {
        rows.push(Row::ratio(
            "1 uncontended",
            "fredlock + metrics recorder / fredlock",
            recorded / plain,
        ));
    }
    if let (Some(plain), Some(listened)) = (
        median_of(ours),
        median_of(at(crate::instructions::IDLE_RECEIVER)),
    ) {
        rows.push(Row::ratio(
            "1 uncontended",
            &format!("{} / fredlock", crate::instructions::IDLE_RECEIVER),
            listened / plain,
        ));
    }
    drop(idle_receiver);
    if let (Some(floor), Some(redis_rs)) = (median_of(floor), median_of(at("redis-rs EVALSHA x2")))
    {
        rows.push(Row::ratio(
            "1 uncontended",
            "raw EVALSHA x2 / redis-rs",
            floor / redis_rs,
        ));
    }
    // The same comparisons round by round (each round's fredlock block against the same
    // round's other block): what drift between blocks cannot move much. The lock on redis-rs
    // against the calls by hand through redis-rs and against rslock.
    let redis_rs_raw = at("redis-rs EVALSHA x2");
    for (ours, name, others) in [
        (ours, "fredlock", [(floor, "raw"), (rslock, "rslock 0.10")]),
        (
            at(ON_REDIS_RS),
            ON_REDIS_RS,
            [
                (redis_rs_raw, "redis-rs EVALSHA x2"),
                (rslock, "rslock 0.10"),
            ],
        ),
    ] {
        let Some(ours) = ours else {
            continue;
        };
        for (other, label) in others {
            if let Some(other) = other {
                let ratios: Vec<f64> = means[ours]
                    .iter()
                    .zip(&means[other])
                    .map(|(ours, other)| ours / other)
                    .collect();
                rows.push(Row::new(
                    "1 uncontended",
                    &format!("{name} / {label}, round by round"),
                    "ratio within a round",
                    "x",
                    Summary::of(&ratios),
                ));
            }
        }
    }
    for (i, subject) in subjects.iter().enumerate() {
        rows.push(Row::new(
            "1 uncontended",
            &subject.library,
            "Redis CPU per cycle",
            "µs",
            Summary::of(&server[i]),
        ));
    }
    let series = subjects
        .iter()
        .zip(each)
        .filter(|(subject, _)| {
            !matches!(
                subject.library.as_str(),
                "fredlock fenced" | "fredlock spin"
            )
        })
        .map(|(subject, cycles)| (subject.library.clone(), cycles))
        .collect();
    client.shutdown().await;
    on_redis_rs.shutdown().await;
    (rows, series)
}

/// Runs `n` cycles one after another: the mean per cycle and each cycle's latency, in µs.
pub async fn timed_cycles<F, Fut>(n: usize, cycle: F) -> (f64, Vec<f64>)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut each = Vec::with_capacity(n);
    let started = Instant::now();
    let mut last = started;
    for _ in 0..n {
        cycle().await;
        let now = Instant::now();
        each.push((now - last).as_secs_f64() * 1e6);
        last = now;
    }
    (started.elapsed().as_secs_f64() * 1e6 / n as f64, each)
}

/// Runs a task per cycle of `cycles`, each repeating its cycle until `run_for` has passed:
/// cycles per second, all tasks together.
pub async fn cycles_per_second<F, Fut>(run_for: Duration, cycles: Vec<F>) -> f64
where
    F: Fn() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let done = Arc::new(AtomicU64::new(0));
    let stop_at = Instant::now() + run_for;
    let started = Instant::now();
    let tasks: Vec<_> = cycles
        .into_iter()
        .map(|cycle| {
            let done = done.clone();
            tokio::spawn(async move {
                while Instant::now() < stop_at {
                    cycle().await;
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("throughput task");
    }
    done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

/// Runs `run(true)` (fredlock) then `run(false)` (its baseline), a warm-up round and then
/// `rounds` more: each side's figures over the measured rounds.
pub async fn alternating<F, Fut>(rounds: usize, run: F) -> (Summary, Summary)
where
    F: Fn(bool) -> Fut,
    Fut: std::future::Future<Output = f64>,
{
    let (mut ours, mut baseline) = (Vec::new(), Vec::new());
    for round in 0..=rounds {
        let (o, b) = (run(true).await, run(false).await);
        if round > 0 {
            ours.push(o);
            baseline.push(b);
        }
    }
    (Summary::of(&ours), Summary::of(&baseline))
}

/// Scenario 2: Throughput of 64 tasks on 64 names through one client, against raw EVALSHA pairs.
pub async fn throughput(url: &str, sizes: Sizes) -> Vec<Row> {
    const TASKS: usize = 64;
    let client = LockClient::connect(url).await.expect("connect");
    let raw = raw_client(url).await;
    let scripts = Arc::new(RawScripts::load(&raw).await);
    let run = |ours: bool| {
        let cycles: Vec<_> = (0..TASKS)
            .map(|i| {
                // One task's own lock, or its own name, channel and field for the raw calls.
                let state = Arc::new((
                    client.lock(format!("bench:tp:{i}")),
                    raw.clone(),
                    scripts.clone(),
                    format!("bench:tpraw:{i}"),
                    format!("redisson_lock__channel:{{bench:tpraw:{i}}}"),
                    format!("raw:{i}"),
                ));
                move || {
                    let state = state.clone();
                    async move {
                        let (lock, raw, scripts, name, channel, field) = &*state;
                        if ours {
                            lock_cycle(lock).await;
                        } else {
                            scripts.cycle(raw, name, channel, field).await;
                        }
                    }
                }
            })
            .collect();
        cycles_per_second(sizes.run_for, cycles)
    };
    let (ours, baseline) = alternating(sizes.rounds, run).await;
    client.shutdown().await;
    // The same on the redis-rs backend, against the same two scripts sent by hand through
    // redis-rs (issue 45).
    let on_redis_rs = on_redis_rs_client(url).await;
    let by_hand = Arc::new(RedisRsScripts::connect(url, &scripts).await);
    let run = |ours: bool| {
        let cycles: Vec<_> = (0..TASKS)
            .map(|i| {
                let state = Arc::new((
                    on_redis_rs.lock(format!("bench:tprr:{i}")),
                    by_hand.clone(),
                    format!("bench:tprrraw:{i}"),
                    format!("redisson_lock__channel:{{bench:tprrraw:{i}}}"),
                    format!("raw:{i}"),
                ));
                move || {
                    let state = state.clone();
                    async move {
                        let (lock, by_hand, name, channel, field) = &*state;
                        if ours {
                            lock_cycle(lock).await;
                        } else {
                            by_hand.cycle(name, channel, field).await;
                        }
                    }
                }
            })
            .collect();
        cycles_per_second(sizes.run_for, cycles)
    };
    let (ours_rr, baseline_rr) = alternating(sizes.rounds, run).await;
    on_redis_rs.shutdown().await;
    vec![
        Row::new(
            "2 throughput",
            "fredlock on redis-rs",
            "64 tasks, 64 names",
            "cycles/s",
            ours_rr,
        ),
        Row::new(
            "2 throughput",
            "raw EVALSHA x2 on redis-rs",
            "64 tasks, 64 names",
            "cycles/s",
            baseline_rr,
        ),
        Row::ratio(
            "2 throughput",
            "fredlock on redis-rs / raw on redis-rs",
            ours_rr.median / baseline_rr.median,
        ),
        Row::new(
            "2 throughput",
            "fredlock",
            "64 tasks, 64 names",
            "cycles/s",
            ours,
        ),
        Row::new(
            "2 throughput",
            "raw EVALSHA x2",
            "64 tasks, 64 names",
            "cycles/s",
            baseline,
        ),
        Row::ratio(
            "2 throughput",
            "fredlock / raw",
            ours.median / baseline.median,
        ),
    ]
}

/// Scenario 3: Wake-up latency: from the holder's unlock returning to the blocked waiter's lock
/// returning, for every library; plus PING round trips for scale, taken between the rounds (5
/// after each), so that both see the same machine. Each library's ratio is to the PINGs taken
/// between its own rounds. Returns the samples (ms) per library for the chart.
pub async fn wakeup(url: &str, sizes: Sizes) -> (Vec<Row>, Vec<(String, Vec<f64>)>) {
    const PINGS_PER_ROUND: usize = 5;
    let raw = raw_client(url).await;
    let mut all_pings = Vec::new();
    let mut rows = Vec::new();
    let mut series = Vec::new();
    for name in libs::NAMES.into_iter().chain([libs::ON_REDIS_RS]) {
        let holder_lib = libs::connect(name, url).await;
        let waiter_lib: Arc<dyn Library> = libs::connect(name, url).await.into();
        let resource = format!("bench:wakeup:{name}");
        let holder = holder_lib.handle(&resource);
        let mut samples = Vec::new();
        let mut pings = Vec::new();
        for round in 0..=sizes.wakeups {
            let held = holder.acquire().await;
            let waiter = {
                let handle = waiter_lib.handle(&resource);
                tokio::spawn(async move {
                    let held = handle.acquire().await;
                    let at = Instant::now();
                    held.release().await;
                    at
                })
            };
            tokio::time::sleep(Duration::from_millis(20)).await;
            held.release().await;
            let unlocked = Instant::now();
            let acquired = waiter.await.expect("waiter");
            if round > 0 {
                samples.push(acquired.saturating_duration_since(unlocked).as_secs_f64() * 1e3);
                for _ in 0..PINGS_PER_ROUND {
                    let started = Instant::now();
                    let _: String = raw.ping(None).await.expect("ping");
                    pings.push(started.elapsed().as_secs_f64() * 1e3);
                }
            }
        }
        let ping = Summary::of(&pings);
        all_pings.extend(pings);
        let summary = Summary::of(&samples);
        rows.push(Row::new(
            "3 wake-up",
            name,
            "unlock -> waiter holds",
            "ms",
            summary,
        ));
        rows.push(Row::ratio(
            "3 wake-up",
            &format!("{name} / PING"),
            summary.median / ping.median,
        ));
        series.push((name.to_string(), samples));
    }
    rows.insert(
        0,
        Row::new(
            "3 wake-up",
            "PING round trip",
            "median, between the rounds",
            "ms",
            Summary::of(&all_pings),
        ),
    );
    (rows, series)
}

/// Scenario 4: Contention: 2 clients x 8 tasks on one name, empty critical section.
pub async fn contention(url: &str, sizes: Sizes) -> Vec<Row> {
    const CLIENTS: usize = 2;
    const TASKS: usize = 8;
    let names = [
        libs::NAMES[0],
        libs::FAIR,
        libs::SPIN,
        libs::NAMES[1],
        libs::NAMES[2],
    ];
    let raw = raw_client(url).await;
    let mut libraries: Vec<Vec<Arc<dyn Library>>> = Vec::new();
    for name in names {
        let mut clients: Vec<Arc<dyn Library>> = Vec::new();
        for _ in 0..CLIENTS {
            clients.push(libs::connect(name, url).await.into());
        }
        libraries.push(clients);
    }
    // Per library: acquisitions/s, hand-offs/s, fewest and most per task, Redis CPU (µs) and
    // commands (EVALSHA, EVAL, SET) per acquisition.
    let mut samples: Vec<[Vec<f64>; 6]> = names.iter().map(|_| Default::default()).collect();
    // Interleaved: each round runs every library once, so that drift of a shared machine
    // hits all alike.
    for _ in 0..sizes.rounds {
        for (clients, samples) in libraries.iter().zip(samples.iter_mut()) {
            let commands_before = script_commands(&raw).await;
            let run = contend(clients, CLIENTS * TASKS, Duration::ZERO, sizes.run_for);
            let ((order, _, elapsed), cpu) = server_time(&raw, run).await;
            let commands = script_commands(&raw).await - commands_before;
            let mut per_task: HashMap<usize, usize> = HashMap::new();
            for task in &order {
                *per_task.entry(*task).or_default() += 1;
            }
            let counts: Vec<f64> = (0..CLIENTS * TASKS)
                .map(|task| per_task.get(&task).copied().unwrap_or(0) as f64)
                .collect();
            let acquired = order.len().max(1) as f64;
            samples[0].push(order.len() as f64 / elapsed);
            samples[1].push(order.windows(2).filter(|w| w[0] != w[1]).count() as f64 / elapsed);
            samples[2].push(counts.iter().copied().fold(f64::INFINITY, f64::min));
            samples[3].push(counts.iter().copied().fold(0.0, f64::max));
            samples[4].push(cpu / acquired);
            samples[5].push(commands as f64 / acquired);
        }
    }
    let metrics = [
        ("acquisitions", "1/s"),
        ("hand-offs to another task", "1/s"),
        ("fewest per task", "count"),
        ("most per task", "count"),
        ("Redis CPU per acquisition", "µs"),
        ("scripts and SETs per acquisition", "calls"),
    ];
    let mut rows = Vec::new();
    for (name, samples) in names.iter().zip(&samples) {
        rows.extend(rows_of("4 contention", name, &metrics, samples));
    }
    rows
}

/// `tasks` tasks over `clients` take one lock, hold it `work` (none when zero) and release it,
/// for `run_for`: the order in which they held it, the longest wait for one acquisition, and
/// the seconds it took. Each task finishes the acquisition it waits for when `run_for` ends;
/// the order and the seconds count those too.
async fn contend(
    clients: &[Arc<dyn Library>],
    tasks: usize,
    work: Duration,
    run_for: Duration,
) -> (Vec<usize>, Duration, f64) {
    let order = Arc::new(Mutex::new(Vec::<usize>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let tasks: Vec<_> = (0..tasks)
        .map(|task| {
            let handle = clients[task % clients.len()].handle("bench:contention");
            let (order, stop) = (order.clone(), stop.clone());
            tokio::spawn(async move {
                let mut worst = Duration::ZERO;
                while !stop.load(Ordering::Relaxed) {
                    let asked = Instant::now();
                    let held = handle.acquire().await;
                    worst = worst.max(asked.elapsed());
                    order.lock().expect("order").push(task);
                    if !work.is_zero() {
                        tokio::time::sleep(work).await;
                    }
                    held.release().await;
                }
                worst
            })
        })
        .collect();
    tokio::time::sleep(run_for).await;
    stop.store(true, Ordering::Relaxed);
    let mut worst = Duration::ZERO;
    for task in tasks {
        worst = worst.max(task.await.expect("contention task"));
    }
    let order = std::mem::take(&mut *order.lock().expect("order"));
    (order, worst, started.elapsed().as_secs_f64())
}

/// One row per metric of one library: the samples of each over the rounds.
fn rows_of<const N: usize>(
    scenario: &str,
    library: &str,
    metrics: &[(&str, &str); N],
    samples: &[Vec<f64>; N],
) -> Vec<Row> {
    metrics
        .iter()
        .zip(samples)
        .map(|((metric, unit), samples)| {
            Row::new(scenario, library, metric, unit, Summary::of(samples))
        })
        .collect()
}

/// Commands a lock library's acquisitions and releases are made of, counted by the server:
/// script calls (every library's release, fredlock's acquire) and `SET` (the peers' acquire).
async fn script_commands(raw: &Client) -> u64 {
    let mut calls = 0;
    for command in ["evalsha", "eval", "set"] {
        calls += command_calls(raw, command).await;
    }
    calls
}

/// Takes `count` watchdog locks on distinct names, 100 acquisitions at a time.
pub async fn hold_many(
    client: &LockClient,
    prefix: &str,
    count: usize,
) -> Vec<fredlock::LockGuard> {
    let mut guards = Vec::with_capacity(count);
    for chunk in (0..count).collect::<Vec<_>>().chunks(100) {
        let batch: Vec<_> = chunk
            .iter()
            .map(|i| {
                let lock = client.lock(format!("{prefix}:{i}"));
                tokio::spawn(async move { lock.lock().await.expect("lock") })
            })
            .collect();
        for guard in batch {
            guards.push(guard.await.expect("holder task"));
        }
    }
    guards
}

/// The watchdog lease of the scenarios that watch renewals: a period of 1 s, ten times the
/// default rate (`--watchdog 30` measures scenario 5 at the default).
pub const SHORT_WATCHDOG: Duration = Duration::from_secs(3);

pub async fn watchdog_client(url: &str, timeout: Duration) -> LockClient {
    LockClient::builder()
        .url(url)
        .watchdog_lease(timeout)
        .build()
        .await
        .expect("connect")
}

/// Scenario 5: Watchdog at scale: renewal commands per period and CPU for many held locks.
pub async fn watchdog(url: &str, sizes: Sizes) -> Vec<Row> {
    let period = sizes.watchdog / 3;
    let client = watchdog_client(url, sizes.watchdog).await;
    let raw = raw_client(url).await;
    let guards = hold_many(&client, "bench:watchdog", sizes.many).await;
    // Let the renewals of locks taken at different moments fall into step.
    tokio::time::sleep(period * 2).await;
    let cpu_before = measure::cpu_time();
    let started = Instant::now();
    let mut last = command_calls(&raw, "evalsha").await;
    let mut per_period = Vec::new();
    // At least three periods, so that the median is of whole rounds of renewals.
    while started.elapsed() < sizes.watch_for.max(period * 3) {
        tokio::time::sleep(period).await;
        let now = command_calls(&raw, "evalsha").await;
        per_period.push((now - last) as f64);
        last = now;
    }
    let cpu = (measure::cpu_time() - cpu_before).as_secs_f64() / started.elapsed().as_secs_f64();
    let lost = guards.iter().filter(|guard| guard.is_lost()).count();
    assert_eq!(lost, 0, "watchdog lost locks during the benchmark");
    drop(guards);
    client.shutdown().await;
    vec![
        Row::new(
            "5 watchdog",
            "fredlock",
            &format!(
                "renewal calls per {}s period, {} locks",
                period.as_secs(),
                sizes.many
            ),
            "calls",
            Summary::of(&per_period),
        ),
        Row::single(
            "5 watchdog",
            "fredlock",
            "client CPU over the period",
            "% of a core",
            cpu * 100.0,
        ),
    ]
}

/// Scenario 6: Memory per held lock and per waiting task, from the live heap (counting allocator) and
/// the resident set.
pub async fn memory(url: &str, sizes: Sizes) -> Vec<Row> {
    let mut rows = memory_on(url, sizes, fredlock::Backend::Fred, "fredlock").await;
    rows.extend(memory_on(url, sizes, fredlock::Backend::RedisRs, libs::ON_REDIS_RS).await);
    rows
}

/// Scenario 6 for the clients of one backend, in rows of `subject`.
async fn memory_on(url: &str, sizes: Sizes, backend: fredlock::Backend, subject: &str) -> Vec<Row> {
    // A short watchdog, so that every held lock has been renewed once when it is measured:
    // what a renewal keeps is part of what a held lock costs.
    let client = LockClient::builder()
        .backend(backend)
        .url(url)
        .watchdog_lease(SHORT_WATCHDOG)
        .build()
        .await
        .expect("connect");
    let other = LockClient::builder()
        .backend(backend)
        .url(url)
        .build()
        .await
        .expect("connect");
    let (mut held_heap, mut held_rss, mut wait_heap, mut wait_rss) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let per = |before: isize, after: isize| (after - before) as f64 / sizes.many as f64;
    measure::count_heap(true);
    for _ in 0..sizes.rounds {
        let (heap, rss) = (measure::live_heap_bytes(), measure::rss_bytes() as isize);
        let guards = hold_many(&client, "bench:memory", sizes.many).await;
        tokio::time::sleep(SHORT_WATCHDOG / 3 + Duration::from_millis(500)).await;
        held_heap.push(per(heap, measure::live_heap_bytes()));
        held_rss.push(per(rss, measure::rss_bytes() as isize));
        drop(guards);
        tokio::time::sleep(Duration::from_millis(500)).await;

        let blocker = other.lock("bench:memory:wait").lock().await.expect("lock");
        let (heap, rss) = (measure::live_heap_bytes(), measure::rss_bytes() as isize);
        let waiters: Vec<_> = (0..sizes.many)
            .map(|_| {
                let lock = client.lock("bench:memory:wait");
                tokio::spawn(async move { lock.lock().await.map(drop) })
            })
            .collect();
        // Waiting means two attempts made and the subscription joined: give them time.
        tokio::time::sleep(Duration::from_secs(1)).await;
        wait_heap.push(per(heap, measure::live_heap_bytes()));
        wait_rss.push(per(rss, measure::rss_bytes() as isize));
        for waiter in &waiters {
            waiter.abort();
        }
        for waiter in waiters {
            let _ = waiter.await;
        }
        blocker.unlock().await.expect("unlock");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    measure::count_heap(false);
    client.shutdown().await;
    other.shutdown().await;
    vec![
        Row::new(
            "6 memory",
            subject,
            "heap per held lock",
            "bytes",
            Summary::of(&held_heap),
        ),
        Row::new(
            "6 memory",
            subject,
            "resident per held lock",
            "bytes",
            Summary::of(&held_rss),
        ),
        Row::new(
            "6 memory",
            subject,
            "heap per waiting task",
            "bytes",
            Summary::of(&wait_heap),
        ),
        Row::new(
            "6 memory",
            subject,
            "resident per waiting task",
            "bytes",
            Summary::of(&wait_rss),
        ),
    ]
}

/// Scenario 9: waiters at scale: `many` tasks of one client, each waiting on a name of its own,
/// all over the client's one subscriber connection. Reports how many SUBSCRIBE commands that
/// took and how long until every channel was subscribed, the heap per waiting task, and the
/// wake-up latency of each waiter when the holder then unlocks the names one after another.
pub async fn waiters_at_scale(url: &str, sizes: Sizes) -> Vec<Row> {
    const SCENARIO: &str = "9 waiters at scale";
    let many = sizes.many;
    let holder = LockClient::connect(url).await.expect("connect");
    let waiting = LockClient::connect(url).await.expect("connect");
    let raw = raw_client(url).await;
    let guards = hold_many(&holder, "bench:scale", many).await;

    measure::count_heap(true);
    let subscribes = command_calls(&raw, "subscribe").await;
    let heap = measure::live_heap_bytes();
    let started = Instant::now();
    let waiters: Vec<_> = (0..many)
        .map(|i| {
            let lock = waiting.lock(format!("bench:scale:{i}"));
            tokio::spawn(async move {
                let guard = lock.lock().await.expect("waiter locks");
                let at = Instant::now();
                guard.unlock().await.expect("waiter unlocks");
                at
            })
        })
        .collect();
    let limit = started + Duration::from_secs(120);
    while waiting.stats().subscriptions < many && Instant::now() < limit {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let subscribed_in = started.elapsed().as_secs_f64() * 1e3;
    // Each waiter's second attempt, made once subscribed, has to come back before it waits.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let heap_per = (measure::live_heap_bytes() - heap) as f64 / many as f64;
    let subscribe_calls = command_calls(&raw, "subscribe").await - subscribes;
    measure::count_heap(false);

    let mut unlocked = Vec::with_capacity(many);
    for guard in guards {
        guard.unlock().await.expect("holder unlocks");
        unlocked.push(Instant::now());
    }
    let mut latencies = Vec::with_capacity(many);
    for (waiter, unlocked) in waiters.into_iter().zip(unlocked) {
        let acquired = waiter.await.expect("waiter task");
        latencies.push(acquired.saturating_duration_since(unlocked).as_secs_f64() * 1e3);
    }
    holder.shutdown().await;
    waiting.shutdown().await;
    let latency = Summary::of(&latencies);
    vec![
        Row::single(
            SCENARIO,
            "fredlock",
            &format!("SUBSCRIBE commands for {many} channels"),
            "count",
            subscribe_calls as f64,
        ),
        Row::single(
            SCENARIO,
            "fredlock",
            "until every channel is subscribed",
            "ms",
            subscribed_in,
        ),
        Row::single(
            SCENARIO,
            "fredlock",
            "heap per waiting task",
            "bytes",
            heap_per,
        ),
        Row::new(
            SCENARIO,
            "fredlock",
            "unlock -> waiter holds",
            "ms",
            latency,
        ),
        Row::single(
            SCENARIO,
            "fredlock",
            "unlock -> waiter holds, p99",
            "ms",
            latency.p99,
        ),
    ]
}

/// Calls of `command` the server has counted so far.
/// The CPU time (µs, `INFO cpu`: user + system of the server process) Redis spent while `run`
/// ran: reading, running and answering every command, which per-command statistics do not add
/// up to (a script's own commands are counted inside it and again on their own).
pub async fn server_time<T>(raw: &Client, run: impl std::future::Future<Output = T>) -> (T, f64) {
    let spent = || async {
        let info: String = raw.info(Some(InfoKind::Cpu)).await.expect("info");
        info.lines()
            .filter_map(|line| {
                let (key, value) = line.split_once(':')?;
                matches!(key, "used_cpu_user" | "used_cpu_sys")
                    .then(|| value.trim().parse::<f64>().ok())?
            })
            .sum::<f64>()
    };
    let before = spent().await;
    let output = run.await;
    (output, (spent().await - before) * 1e6)
}

pub async fn command_calls(raw: &Client, command: &str) -> u64 {
    let info: String = raw.info(Some(InfoKind::CommandStats)).await.expect("info");
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|line| line.strip_prefix(&prefix)?.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

/// How many instances the growth scenario (14) runs at, full run.
pub const INSTANCES: [usize; 5] = [1, 2, 8, 16, 64];

/// The work each holder does in the growth scenario, as a service's short critical section.
const GROWTH_WORK: Duration = Duration::from_millis(1);

/// Rounds of the growth scenario per row, fewer than the others': 25 rows of `grow_for` each.
const GROWTH_ROUNDS: usize = 3;

/// Scenario 14: cost as instances grow (issue 59). `n` instances (each a client of its own, as
/// separate service processes have) contend for one name, one task each: lock, about 1 ms of
/// work, unlock, for `grow_for`. Per library and count: acquisitions per second, the scripts
/// (and `SET`s) Redis ran per acquisition, the longest any one acquisition waited, and Redis CPU
/// per acquisition. A lock that wakes every waiter on each unlock shows it here: its scripts
/// per acquisition grow with `n`. The subjects: `Lock` (its wake rule), the same scripts with
/// the wake rule it replaced (`herd`), the fair and spin locks, and rslock.
pub async fn growth(url: &str, sizes: Sizes) -> Vec<Row> {
    let names = [
        libs::NAMES[0],
        herd::HERD,
        libs::FAIR,
        libs::SPIN,
        libs::NAMES[1],
    ];
    let raw = raw_client(url).await;
    let metrics = [
        ("acquisitions", "1/s"),
        ("scripts and SETs per acquisition", "calls"),
        ("worst wait", "ms"),
        ("Redis CPU per acquisition", "µs"),
    ];
    let mut rows = Vec::new();
    for &count in sizes.instances {
        let scenario = format!("14 growth ({count} instances)");
        for name in names {
            let mut clients: Vec<Arc<dyn Library>> = Vec::with_capacity(count);
            for _ in 0..count {
                clients.push(match name {
                    herd::HERD => Arc::new(herd::HerdClient::connect(url).await),
                    _ => libs::connect(name, url).await.into(),
                });
            }
            let mut samples: [Vec<f64>; 4] = Default::default();
            for _ in 0..sizes.rounds.min(GROWTH_ROUNDS) {
                let commands_before = script_commands(&raw).await;
                let run = contend(&clients, count, GROWTH_WORK, sizes.grow_for);
                let ((order, worst, elapsed), cpu) = server_time(&raw, run).await;
                let commands = script_commands(&raw).await - commands_before;
                let per = order.len().max(1) as f64;
                samples[0].push(order.len() as f64 / elapsed);
                samples[1].push(commands as f64 / per);
                samples[2].push(worst.as_secs_f64() * 1e3);
                samples[3].push(cpu / per);
            }
            for client in &clients {
                client.close().await;
            }
            rows.extend(rows_of(&scenario, name, &metrics, &samples));
        }
    }
    rows
}

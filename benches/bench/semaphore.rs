//! Scenario 11: the semaphores. Uncontended acquire+release of a `Semaphore` and a
//! `PermitSemaphore` against the same scripts called straight through fred (and against
//! Redisson's bare counter operations, which keep no grants), and the rate at which 3 permits
//! change hands among 12 tasks of two clients, against 3 locks with 4 tasks each.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use fred::prelude::*;
use fredlock::{Lock, LockClient};

use crate::libs::BoxFuture;
use crate::measure::Summary;
use crate::scenarios::{
    alternating, cycles_per_second, in_task, load_script, lock_cycle, raw_client, timed_cycles,
    Sizes,
};
use crate::Row;

const SCENARIO: &str = "11 semaphores";

/// Redisson's RSemaphore acquire and release as bare counter operations (our Lua of what its
/// scripts do: check and DECRBY, INCRBY and publish), with nothing recorded.
const BARE_ACQUIRE: &str = "local v = tonumber(redis.call('get', KEYS[1]) or '0') \
    if v >= tonumber(ARGV[1]) then redis.call('decrby', KEYS[1], ARGV[1]) return 1 end return 0";
const BARE_RELEASE: &str = "local v = redis.call('incrby', KEYS[1], ARGV[1]) \
    redis.call('publish', KEYS[2], v) return v";

/// One acquire+release through raw script calls, as fredlock sends them.
type RawCycle = Arc<dyn Fn(Client, u64) -> BoxFuture<'static, ()> + Send + Sync>;

pub async fn semaphores(url: &str, sizes: Sizes) -> Vec<Row> {
    let client = LockClient::connect(url).await.expect("connect");
    let raw = raw_client(url).await;
    let mut rows = Vec::new();
    rows.extend(uncontended(&client, &raw, sizes).await);
    rows.extend(hand_off(url, sizes).await);
    client.shutdown().await;
    rows
}

/// Each subject's acquire+release one at a time, against its floor, in interleaved blocks.
async fn uncontended(client: &LockClient, raw: &Client, sizes: Sizes) -> Vec<Row> {
    let block = (sizes.cycles / 4).max(100);
    let semaphore = client.semaphore("bench:sem");
    semaphore.set_permits(1_000_000).await.expect("permits");
    let leased = client.permit_semaphore("bench:leased");
    leased.add_permits(1_000_000).await.expect("permits");
    let _: i64 = raw
        .set("bench:sem:raw", 1_000_000, None, None, false)
        .await
        .unwrap_or(0);
    let _: i64 = raw
        .set("bench:leased:raw", 1_000_000, None, None, false)
        .await
        .unwrap_or(0);
    let _: i64 = raw
        .set("bench:sem:bare", 1_000_000, None, None, false)
        .await
        .unwrap_or(0);
    let (sem_acquire, sem_release) = (
        load_script(raw, "semaphore_acquire").await,
        load_script(raw, "semaphore_release").await,
    );
    let (permit_acquire, permit_release) = (
        load_script(raw, "permit_semaphore_acquire").await,
        load_script(raw, "permit_semaphore_release").await,
    );
    let bare_acquire: String = raw.script_load(BARE_ACQUIRE).await.expect("load");
    let bare_release: String = raw.script_load(BARE_RELEASE).await.expect("load");
    let next = Arc::new(AtomicU64::new(1));

    let raw_semaphore: RawCycle = {
        let next = next.clone();
        Arc::new(move |redis: Client, n: u64| {
            let (acquire, release, next) = (sem_acquire.clone(), sem_release.clone(), next.clone());
            Box::pin(async move {
                let name = "bench:sem:raw";
                let keys = vec![
                    name.to_owned(),
                    format!("redisson_sc:{{{name}}}"),
                    format!("fredlock_fences:{{{name}}}"),
                    format!("fredlock_permits:{{{name}}}"),
                ];
                let grant = format!("raw:u{n}");
                let id = || next.fetch_add(1, Ordering::Relaxed) as i64;
                let args = vec![
                    Value::from(1),
                    Value::from(grant.as_str()),
                    Value::from(id()),
                ];
                let _: Option<i64> = redis
                    .evalsha(&acquire, keys.clone(), args)
                    .await
                    .expect("acquire");
                let args = vec![
                    Value::from(grant.as_str()),
                    Value::from(0),
                    Value::from(id()),
                ];
                let _: Option<i64> = redis.evalsha(&release, keys, args).await.expect("release");
            })
        })
    };
    let raw_permit: RawCycle = {
        let next = next.clone();
        Arc::new(move |redis: Client, n: u64| {
            let (acquire, release, next) =
                (permit_acquire.clone(), permit_release.clone(), next.clone());
            Box::pin(async move {
                let name = "bench:leased:raw";
                let keys = vec![
                    name.to_owned(),
                    format!("{{{name}}}:timeout"),
                    format!("redisson_sc:{{{name}}}"),
                    format!("fredlock_fences:{{{name}}}"),
                ];
                let id = format!("raw:u{n}");
                let request = || next.fetch_add(1, Ordering::Relaxed) as i64;
                let args = vec![
                    Value::from("30000"),
                    Value::from(id.as_str()),
                    Value::from(request()),
                ];
                let _: Option<i64> = redis
                    .evalsha(&acquire, keys.clone(), args)
                    .await
                    .expect("acquire");
                let args = vec![
                    Value::from(id.as_str()),
                    Value::from(0),
                    Value::from(request()),
                ];
                let _: Option<i64> = redis.evalsha(&release, keys, args).await.expect("release");
            })
        })
    };
    let bare: RawCycle = Arc::new(move |redis: Client, _| {
        let (acquire, release) = (bare_acquire.clone(), bare_release.clone());
        Box::pin(async move {
            let keys = vec![
                "bench:sem:bare".to_owned(),
                "redisson_sc:{bench:sem:bare}".to_owned(),
            ];
            let _: i64 = redis
                .evalsha(&acquire, keys.clone(), vec![1])
                .await
                .expect("acquire");
            let _: i64 = redis
                .evalsha(&release, keys, vec![1])
                .await
                .expect("release");
        })
    });

    let ours_semaphore = {
        let semaphore = semaphore.clone();
        move || {
            let semaphore = semaphore.clone();
            Box::pin(async move {
                let permit = semaphore.acquire(1).await.expect("acquire");
                permit.release().await.expect("release");
            }) as BoxFuture<'static, ()>
        }
    };
    let ours_permit = {
        let leased = leased.clone();
        move || {
            let leased = leased.clone();
            Box::pin(async move {
                let permit = leased.acquire().await.expect("acquire");
                permit.release().await.expect("release");
            }) as BoxFuture<'static, ()>
        }
    };
    let mut rows = Vec::new();
    for (subject, ours, floors) in [
        (
            "semaphore",
            Arc::new(ours_semaphore) as Arc<dyn Fn() -> BoxFuture<'static, ()> + Send + Sync>,
            vec![
                ("raw EVALSHA x2 (semaphore scripts)", raw_semaphore),
                ("raw EVALSHA x2 (Redisson's bare counter)", bare),
            ],
        ),
        (
            "permit semaphore",
            Arc::new(ours_permit),
            vec![("raw EVALSHA x2 (permit semaphore scripts)", raw_permit)],
        ),
    ] {
        let ours_run = || {
            let ours = ours.clone();
            in_task(async move { timed_cycles(block, || ours()).await.0 })
        };
        let floor_run = |floor: RawCycle| {
            let redis = raw.clone();
            let counter = Arc::new(AtomicU64::new(0));
            in_task(async move {
                timed_cycles(block, || {
                    floor(redis.clone(), counter.fetch_add(1, Ordering::Relaxed))
                })
                .await
                .0
            })
        };
        ours_run().await;
        let mut ours_means = Vec::new();
        let mut floor_means: Vec<Vec<f64>> = vec![Vec::new(); floors.len()];
        for round in 0..sizes.rounds * 4 {
            let mut measured = Vec::new();
            if round % 2 == 0 {
                ours_means.push(ours_run().await);
            }
            for (i, (_, floor)) in floors.iter().enumerate() {
                measured.push((i, floor_run(floor.clone()).await));
            }
            if round % 2 == 1 {
                ours_means.push(ours_run().await);
            }
            for (i, mean) in measured {
                floor_means[i].push(mean);
            }
        }
        let ours_summary = Summary::of(&ours_means);
        rows.push(Row::new(
            SCENARIO,
            &format!("fredlock {subject}"),
            "acquire+release",
            "µs",
            ours_summary,
        ));
        for ((floor, _), means) in floors.iter().zip(floor_means) {
            let floor_summary = Summary::of(&means);
            rows.push(Row::new(
                SCENARIO,
                floor,
                "acquire+release scripts",
                "µs",
                floor_summary,
            ));
            rows.push(Row::ratio(
                SCENARIO,
                &format!("fredlock {subject} / {floor}"),
                ours_summary.median / floor_summary.median,
            ));
        }
    }
    rows
}

/// 12 tasks over two clients taking 1 of 3 permits, holding it for a moment and giving it
/// back, for `run_for`: cycles per second, against 3 locks with 4 of the tasks each (the same
/// 3 inside at once, the same hand-off of a released place to a waiter).
async fn hand_off(url: &str, sizes: Sizes) -> Vec<Row> {
    let clients = [
        LockClient::connect(url).await.expect("connect"),
        LockClient::connect(url).await.expect("connect"),
    ];
    let semaphore = clients[0].semaphore("bench:sem:contended");
    semaphore.set_permits(3).await.expect("permits");
    let run = |ours: bool| {
        let cycles: Vec<_> = (0..12)
            .map(|i| {
                let client = &clients[i % 2];
                let state = Arc::new((
                    client.semaphore("bench:sem:contended"),
                    client.lock(format!("bench:sem:lock:{}", i % 3)),
                ));
                move || {
                    let state = state.clone();
                    async move {
                        let (semaphore, lock): &(fredlock::Semaphore, Lock) = &state;
                        if ours {
                            let permit = semaphore.acquire(1).await.expect("acquire");
                            tokio::task::yield_now().await;
                            permit.release().await.expect("release");
                        } else {
                            lock_cycle(lock).await;
                        }
                    }
                }
            })
            .collect();
        cycles_per_second(sizes.run_for, cycles)
    };
    let (ours, baseline) = alternating(sizes.rounds, run).await;
    for client in &clients {
        client.shutdown().await;
    }
    let metric = "3 permits, 12 tasks, 2 clients";
    vec![
        Row::new(SCENARIO, "fredlock semaphore", metric, "cycles/s", ours),
        Row::new(
            SCENARIO,
            "fredlock lock x3 (4 tasks each)",
            metric,
            "cycles/s",
            baseline,
        ),
        Row::ratio(
            SCENARIO,
            "semaphore hand-off / 3 locks",
            ours.median / baseline.median,
        ),
    ]
}

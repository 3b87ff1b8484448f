//! Scenario 10: the read-write lock. Uncontended read and write lock+unlock against the same two
//! scripts called straight through fred (and, for scale, the plain lock's two scripts), and the
//! throughput of 16 tasks reading one lock at once against the same through raw script calls.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use fred::prelude::*;
use fredlock::{Lock, LockClient};

use crate::measure::Summary;
use crate::scenarios::{
    alternating, cycles_per_second, in_task, load_script, lock_cycle, raw_client, timed_cycles,
    RawScripts, Sizes,
};
use crate::Row;

const SCENARIO: &str = "10 read-write lock";

/// Tasks reading one lock at once in the throughput half.
const READERS: usize = 16;

/// The read or the write side's acquire and release scripts, run straight through fred with
/// the arguments fredlock sends (a lease, the field, no holds, writer preference or a waiting
/// writer's place, a request id).
struct RawSide {
    acquire: String,
    release: String,
    /// The acquire's last own argument: writer preference on (read), a place of 5 s (write).
    last: &'static str,
    suffix: &'static str,
    next: AtomicU64,
}

impl RawSide {
    async fn load(redis: &Client, read: bool) -> RawSide {
        let side = if read { "read" } else { "write" };
        RawSide {
            acquire: load_script(redis, &format!("rw_{side}_acquire")).await,
            release: load_script(redis, &format!("rw_{side}_release")).await,
            last: if read { "1" } else { "5000" },
            suffix: if read { "" } else { ":write" },
            next: AtomicU64::new(1),
        }
    }

    async fn cycle(&self, redis: &Client, name: &str, field: &str) {
        let keys = vec![
            name.to_owned(),
            format!("redisson_rwlock:{{{name}}}"),
            format!("fredlock_fences:{{{name}}}"),
            format!("fredlock_rwlock_writers:{{{name}}}"),
        ];
        let prefix = format!("{{{name}}}");
        let field = format!("{field}{}", self.suffix);
        let id = || self.next.fetch_add(1, Ordering::Relaxed) as i64;
        let _: Option<i64> = redis
            .evalsha(
                &self.acquire,
                keys.clone(),
                vec![
                    Value::from(prefix.as_str()),
                    Value::from("30000"),
                    Value::from(field.as_str()),
                    Value::from(0),
                    Value::from(self.last),
                    Value::from(id()),
                ],
            )
            .await
            .expect("raw acquire");
        let _: Option<i64> = redis
            .evalsha(
                &self.release,
                keys,
                vec![
                    Value::from(prefix.as_str()),
                    Value::from("30000"),
                    Value::from(field.as_str()),
                    Value::from(0),
                    Value::from(id()),
                ],
            )
            .await
            .expect("raw release");
    }
}

pub async fn rw_lock(url: &str, sizes: Sizes) -> Vec<Row> {
    let client = LockClient::connect(url).await.expect("connect");
    let raw = raw_client(url).await;
    let mut rows = uncontended(&client, &raw, sizes).await;
    rows.extend(readers(&client, &raw, sizes).await);
    client.shutdown().await;
    rows
}

/// Read and write lock+unlock one at a time, each against its raw scripts, in interleaved
/// blocks so that drift of the machine hits all alike; each round also times the plain lock's
/// raw scripts, the floor of scenario 1, for scale.
async fn uncontended(client: &LockClient, raw: &Client, sizes: Sizes) -> Vec<Row> {
    let block = (sizes.cycles / 4).max(100);
    let mut rows = Vec::new();
    let plain_scripts = Arc::new(RawScripts::load(raw).await);
    let plain = || {
        let (raw, scripts) = (raw.clone(), plain_scripts.clone());
        in_task(async move {
            timed_cycles(block, || {
                let (raw, scripts) = (raw.clone(), scripts.clone());
                async move {
                    scripts
                        .cycle(
                            &raw,
                            "bench:rw:plain",
                            "redisson_lock__channel:{bench:rw:plain}",
                            "raw:1",
                        )
                        .await
                }
            })
            .await
            .0
        })
    };
    let mut plain_means = Vec::new();
    for (side, lock) in [
        (
            "read",
            Lock::from(client.rw_lock("bench:rw:read").read_lock()),
        ),
        (
            "write",
            Lock::from(client.rw_lock("bench:rw:write").write_lock()),
        ),
    ] {
        let scripts = Arc::new(RawSide::load(raw, side == "read").await);
        let ours = || {
            let lock = lock.clone();
            in_task(async move {
                timed_cycles(block, || {
                    let lock = lock.clone();
                    async move { lock_cycle(&lock).await }
                })
                .await
                .0
            })
        };
        let floor = || {
            let (raw, scripts) = (raw.clone(), scripts.clone());
            in_task(async move {
                timed_cycles(block, || {
                    let (raw, scripts) = (raw.clone(), scripts.clone());
                    async move { scripts.cycle(&raw, "bench:rw:raw", "raw:1").await }
                })
                .await
                .0
            })
        };
        ours().await;
        floor().await;
        let (mut ours_means, mut floor_means, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..sizes.rounds * 4 {
            let (o, f) = if round % 2 == 0 {
                let o = ours().await;
                (o, floor().await)
            } else {
                let f = floor().await;
                (ours().await, f)
            };
            ours_means.push(o);
            floor_means.push(f);
            ratios.push(o / f);
            plain_means.push(plain().await);
        }
        let (ours_summary, floor_summary) = (Summary::of(&ours_means), Summary::of(&floor_means));
        rows.push(Row::new(
            SCENARIO,
            &format!("fredlock {side} lock"),
            "lock+unlock",
            "µs",
            ours_summary,
        ));
        rows.push(Row::new(
            SCENARIO,
            &format!("raw EVALSHA x2 ({side})"),
            "acquire+release scripts",
            "µs",
            floor_summary,
        ));
        rows.push(Row::ratio(
            SCENARIO,
            &format!("fredlock {side} lock / raw"),
            ours_summary.median / floor_summary.median,
        ));
        rows.push(Row::new(
            SCENARIO,
            &format!("fredlock {side} lock / raw, round by round"),
            "ratio within a round",
            "x",
            Summary::of(&ratios),
        ));
    }
    rows.push(Row::new(
        SCENARIO,
        "raw EVALSHA x2 (plain lock)",
        "acquire+release scripts",
        "µs",
        Summary::of(&plain_means),
    ));
    rows
}

/// 16 tasks of one client reading one lock at once, each in a loop of read lock+unlock: cycles
/// per second, against 16 tasks running the raw read scripts on one name.
async fn readers(client: &LockClient, raw: &Client, sizes: Sizes) -> Vec<Row> {
    let scripts = Arc::new(RawSide::load(raw, true).await);
    let run = |ours: bool| {
        let cycles: Vec<_> = (0..READERS)
            .map(|i| {
                let state = Arc::new((
                    Lock::from(client.rw_lock("bench:rw:readers").read_lock()),
                    raw.clone(),
                    scripts.clone(),
                    format!("raw:{i}"),
                ));
                move || {
                    let state = state.clone();
                    async move {
                        let (read, raw, scripts, field) = &*state;
                        if ours {
                            lock_cycle(read).await;
                        } else {
                            scripts.cycle(raw, "bench:rw:readers:raw", field).await;
                        }
                    }
                }
            })
            .collect();
        cycles_per_second(sizes.run_for, cycles)
    };
    let (ours, baseline) = alternating(sizes.rounds, run).await;
    let metric = "16 readers, one name";
    vec![
        Row::new(SCENARIO, "fredlock read lock", metric, "cycles/s", ours),
        Row::new(
            SCENARIO,
            "raw EVALSHA x2 (read)",
            metric,
            "cycles/s",
            baseline,
        ),
        Row::ratio(
            SCENARIO,
            "fredlock readers / raw",
            ours.median / baseline.median,
        ),
    ]
}

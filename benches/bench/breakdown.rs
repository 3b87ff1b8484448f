//! Scenario 18 (issue 59): where an uncontended lock+unlock's microseconds go on the server and
//! in the client, per backend, beside the same scripts sent by hand and rslock.

use std::collections::HashMap;
use std::sync::Arc;

use fred::prelude::*;
use fred::types::InfoKind;

use crate::libs::{self, Library};
use crate::measure::{self, Summary};
use crate::scenarios::{
    lock_cycle, on_redis_rs_client, raw_client, server_time, RawScripts, RedisRsScripts, Sizes,
};
use crate::Row;

const SCENARIO: &str = "18 where the time goes";

/// The µs the server counted in each command so far.
async fn command_stats(raw: &Client) -> HashMap<String, u64> {
    let info: String = raw.info(Some(InfoKind::CommandStats)).await.expect("info");
    info.lines()
        .filter_map(|line| {
            let (command, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let field = |name: &str| {
                rest.split(',')
                    .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
            };
            Some((command.to_owned(), field("usec")?))
        })
        .collect()
}

/// The µs the server spent in the commands sent (see [`SENT`]) while `run` ran.
async fn sent_usec(raw: &Client, run: impl std::future::Future<Output = ()>) -> f64 {
    let before = command_stats(raw).await;
    run.await;
    let after = command_stats(raw).await;
    SENT.iter()
        .map(|command| {
            let usec = |stats: &HashMap<String, u64>| stats.get(*command).copied().unwrap_or(0);
            (usec(&after) - usec(&before)) as f64
        })
        .sum()
}

/// `count` acquisitions one after another (`acquire(i)` for the i-th name), then their releases
/// (`release(i, what the i-th acquisition gave)`): the server's µs in the commands sent in each
/// phase.
async fn phases<T, A, R>(
    raw: &Client,
    count: usize,
    acquire: impl Fn(usize) -> A,
    release: impl Fn(usize, T) -> R,
) -> (f64, f64)
where
    A: std::future::Future<Output = T>,
    R: std::future::Future<Output = ()>,
{
    let mut taken = Vec::with_capacity(count);
    let acquired = sent_usec(raw, async {
        for i in 0..count {
            taken.push(acquire(i).await);
        }
    })
    .await;
    let released = sent_usec(raw, async {
        for (i, what) in taken.into_iter().enumerate() {
            release(i, what).await;
        }
    })
    .await;
    (acquired, released)
}

/// The commands a client sends itself: their µs include those of the commands a script runs,
/// which the server counts again on their own.
const SENT: [&str; 4] = ["evalsha", "eval", "set", "del"];

/// Scenario 18: `cycles` uncontended lock+unlock cycles one at a time, per subject, rounds
/// interleaved: fredlock on fred and on redis-rs, its two scripts sent by hand through fred and
/// through redis-rs (the floor: the same scripts without the line's keys, no client of ours),
/// and rslock. Per subject and cycle: the server's CPU (`INFO cpu`), the time in the commands
/// sent (`INFO commandstats`), then in each script on its own (all acquisitions first, on as
/// many names, then all releases), and the client process's CPU (every
/// thread of the benchmark, the client library's tasks too). Client instructions per cycle
/// are scenario 8's.
pub async fn breakdown(url: &str, sizes: Sizes) -> Vec<Row> {
    let raw = raw_client(url).await;
    let scripts = Arc::new(RawScripts::load(&raw).await);
    let by_hand_rs = Arc::new(RedisRsScripts::connect(url, &scripts).await);
    let on_fred = fredlock::LockClient::connect(url).await.expect("connect");
    let on_redis_rs = on_redis_rs_client(url).await;
    let rslock: Box<dyn Library> = libs::connect(libs::NAMES[1], url).await;
    let subjects = [
        "fredlock",
        libs::ON_REDIS_RS,
        "raw scripts (fred)",
        "raw scripts (redis-rs)",
        libs::NAMES[1],
    ];
    let cycles = (sizes.cycles / 4).max(200);
    let mut samples: Vec<[Vec<f64>; 5]> = subjects.iter().map(|_| Default::default()).collect();
    for round in 0..=sizes.rounds {
        for (at, sample) in samples.iter_mut().enumerate() {
            let name = format!("bench:breakdown:{at}");
            let channel = format!("redisson_lock__channel:{{{name}}}");
            let run = async {
                let (lock_fred, lock_rs) = (on_fred.lock(&name), on_redis_rs.lock(&name));
                let handle = rslock.handle(&name);
                for _ in 0..cycles {
                    match at {
                        0 => lock_cycle(&lock_fred).await,
                        1 => lock_cycle(&lock_rs).await,
                        2 => scripts.cycle(&raw, &name, &channel, "raw:1").await,
                        3 => by_hand_rs.cycle(&name, &channel, "raw:1").await,
                        _ => handle.acquire().await.release().await,
                    }
                }
            };
            let cpu_before = measure::cpu_time();
            let (cycle_usec, server_cpu) = server_time(&raw, sent_usec(&raw, run)).await;
            let client_cpu = (measure::cpu_time() - cpu_before).as_secs_f64() * 1e6;
            // Then each script on its own: `cycles` acquisitions of as many names, then their
            // releases, the commands counted around each phase.
            let names: Vec<String> = (0..cycles).map(|i| format!("{name}:{i}")).collect();
            let channels: Vec<String> = names
                .iter()
                .map(|name| format!("redisson_lock__channel:{{{name}}}"))
                .collect();
            let library: Option<&dyn Library> = match at {
                0 => Some(&on_fred),
                1 => Some(&on_redis_rs),
                4 => Some(&*rslock),
                _ => None,
            };
            let (acquire_usec, release_usec) = match (library, at) {
                (Some(library), _) => {
                    let handles: Vec<_> = names.iter().map(|name| library.handle(name)).collect();
                    phases(
                        &raw,
                        cycles,
                        |i| handles[i].acquire(),
                        |_, held: Box<dyn libs::Held>| held.release(),
                    )
                    .await
                }
                (None, 2) => {
                    phases(
                        &raw,
                        cycles,
                        |i| scripts.acquire(&raw, &names[i], "raw:1"),
                        |i, ()| scripts.release(&raw, &names[i], &channels[i], "raw:1"),
                    )
                    .await
                }
                (None, _) => {
                    phases(
                        &raw,
                        cycles,
                        |i| by_hand_rs.acquire_one(&names[i], "raw:1"),
                        |i, ()| by_hand_rs.release_one(&names[i], &channels[i], "raw:1"),
                    )
                    .await
                }
            };
            if round > 0 {
                let per = cycles as f64;
                sample[0].push(server_cpu / per);
                sample[1].push(cycle_usec / per);
                sample[2].push(acquire_usec / per);
                sample[3].push(release_usec / per);
                sample[4].push(client_cpu / per);
            }
        }
    }
    on_fred.shutdown().await;
    on_redis_rs.shutdown().await;
    let metrics = [
        "Redis CPU per lock+unlock (INFO cpu)",
        "time in the commands sent, per lock+unlock (commandstats)",
        "time in the acquire's commands, per acquire (commandstats)",
        "time in the release's commands, per release (commandstats)",
        "client process CPU per lock+unlock",
    ];
    let mut rows = Vec::new();
    for (subject, sample) in subjects.iter().zip(&samples) {
        for (metric, values) in metrics.iter().zip(sample) {
            rows.push(Row::new(
                SCENARIO,
                subject,
                metric,
                "µs",
                Summary::of(values),
            ));
        }
    }
    rows
}

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

/// What the server counted per command: calls and µs spent in them.
async fn command_stats(raw: &Client) -> HashMap<String, (u64, u64)> {
    let info: String = raw.info(Some(InfoKind::CommandStats)).await.expect("info");
    info.lines()
        .filter_map(|line| {
            let (command, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let field = |name: &str| {
                rest.split(',')
                    .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
            };
            Some((command.to_owned(), (field("calls")?, field("usec")?)))
        })
        .collect()
}

/// The commands a client sends itself: their µs include those of the commands a script runs,
/// which the server counts again on their own.
const SENT: [&str; 4] = ["evalsha", "eval", "set", "del"];

/// Scenario 18: `cycles` uncontended lock+unlock cycles one at a time, per subject, rounds
/// interleaved: fredlock on fred and on redis-rs, its two scripts sent by hand through fred and
/// through redis-rs (the floor: the same scripts without the line's keys, no client of ours),
/// and rslock. Per subject and cycle: the server's CPU (`INFO cpu`), the time in the commands
/// sent (`INFO commandstats`) and the µs per script call, and the client process's CPU (every
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
    let mut samples: Vec<[Vec<f64>; 4]> = subjects.iter().map(|_| Default::default()).collect();
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
            let before = command_stats(&raw).await;
            let cpu_before = measure::cpu_time();
            let ((), server_cpu) = server_time(&raw, run).await;
            let client_cpu = (measure::cpu_time() - cpu_before).as_secs_f64() * 1e6;
            let after = command_stats(&raw).await;
            let spent = |command: &str| {
                let (calls, usec) = after.get(command).copied().unwrap_or_default();
                let (calls0, usec0) = before.get(command).copied().unwrap_or_default();
                (calls - calls0, usec - usec0)
            };
            let sent_usec: u64 = SENT.iter().map(|command| spent(command).1).sum();
            let (script_calls, script_usec) = spent("evalsha");
            if round > 0 {
                let per = cycles as f64;
                sample[0].push(server_cpu / per);
                sample[1].push(sent_usec as f64 / per);
                sample[2].push(script_usec as f64 / script_calls.max(1) as f64);
                sample[3].push(client_cpu / per);
            }
        }
    }
    on_fred.shutdown().await;
    on_redis_rs.shutdown().await;
    let metrics = [
        "Redis CPU per lock+unlock (INFO cpu)",
        "time in the commands sent, per lock+unlock (commandstats)",
        "µs per EVALSHA",
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

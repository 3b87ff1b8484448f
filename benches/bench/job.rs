//! Scenario 13: the job lock. An uncontended `run` of an empty job (one `SET NX PX`, one
//! compare-and-delete script) against rslock's lock+unlock (one `SET NX PX`, one unlock script)
//! and against the same two commands sent by hand through fred, on the same server, one cycle
//! at a time, in interleaved blocks so that all three see the same machine. The hand-made
//! cycle splits the gap: fredlock's own cost over fred, and fred's over redis-rs (rslock's
//! client). The same job on the redis-rs backend runs in the same blocks (issue 45).

use std::time::Duration;

use fred::prelude::*;
use fred::types::{Expiration, SetOptions};
use fredlock::LockClient;
use tokio::time::Instant;

use crate::measure::Summary;
use crate::scenarios::{on_redis_rs_client, raw_client, Sizes};
use crate::Row;

const SCENARIO: &str = "13 job lock";

/// rslock's TTL, and the job's at-most-for: the same lease on all sides.
const LEASE: Duration = Duration::from_secs(10);

/// A compare-and-delete, as rslock's unlock and the job's release do (without the release's
/// at-least-for and wake-up).
const COMPARE_AND_DELETE: &str =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0";

pub async fn job_lock(url: &str, sizes: Sizes) -> Vec<Row> {
    let client = LockClient::connect(url).await.expect("connect");
    let job = client.job_lock("bench:job").at_most_for(LEASE);
    // The same job on the redis-rs backend (issue 45): rslock's own client library.
    let on_redis_rs = on_redis_rs_client(url).await;
    let job_rr = on_redis_rs.job_lock("bench:job:rr").at_most_for(LEASE);
    let rslock = rslock::LockManager::new(vec![url.to_string()]);
    let raw = raw_client(url).await;
    let sha: String = raw.script_load(COMPARE_AND_DELETE).await.expect("load");
    let per_block = (sizes.cycles / 10).max(200);
    let (mut runs, mut peers, mut by_hand) = (Vec::new(), Vec::new(), Vec::new());
    let (mut runs_rr, mut rr_to_rslock) = (Vec::new(), Vec::new());
    let (mut to_rslock, mut to_hand, mut hand_to_rslock) = (Vec::new(), Vec::new(), Vec::new());
    // The first two blocks warm all up (connections, script caches) and are not counted.
    for block in 0..sizes.rounds * 2 + 2 {
        let mut ours = Vec::with_capacity(per_block);
        for _ in 0..per_block {
            let started = Instant::now();
            let ran = job.run(async {}).await.expect("run");
            assert!(ran.is_ran(), "the job was not free");
            ours.push(started.elapsed().as_secs_f64() * 1e6);
        }
        let mut ours_rr = Vec::with_capacity(per_block);
        for _ in 0..per_block {
            let started = Instant::now();
            let ran = job_rr.run(async {}).await.expect("run on redis-rs");
            assert!(ran.is_ran(), "the job on redis-rs was not free");
            ours_rr.push(started.elapsed().as_secs_f64() * 1e6);
        }
        let mut theirs = Vec::with_capacity(per_block);
        for _ in 0..per_block {
            let started = Instant::now();
            let guard = rslock
                .lock(b"bench:job:rslock", LEASE)
                .await
                .expect("rslock lock");
            rslock.unlock(&guard).await;
            theirs.push(started.elapsed().as_secs_f64() * 1e6);
        }
        let mut hand = Vec::with_capacity(per_block);
        for n in 0..per_block {
            let started = Instant::now();
            let value = format!("ADDED:bench@host:{block}:{n}");
            let taken: Option<String> = raw
                .set(
                    "bench:job:fred",
                    value.as_str(),
                    Some(Expiration::PX(LEASE.as_millis() as i64)),
                    Some(SetOptions::NX),
                    false,
                )
                .await
                .expect("set");
            assert!(taken.is_some());
            let deleted: i64 = raw
                .evalsha(&sha, vec!["bench:job:fred"], vec![value])
                .await
                .expect("evalsha");
            assert_eq!(deleted, 1);
            hand.push(started.elapsed().as_secs_f64() * 1e6);
        }
        if block >= 2 {
            let (ours_median, theirs_median, hand_median) = (
                Summary::of(&ours).median,
                Summary::of(&theirs).median,
                Summary::of(&hand).median,
            );
            to_rslock.push(ours_median / theirs_median);
            rr_to_rslock.push(Summary::of(&ours_rr).median / theirs_median);
            runs_rr.extend(ours_rr);
            to_hand.push(ours_median / hand_median);
            hand_to_rslock.push(hand_median / theirs_median);
            runs.extend(ours);
            peers.extend(theirs);
            by_hand.extend(hand);
        }
    }
    client.shutdown().await;
    on_redis_rs.shutdown().await;
    let _ = raw.quit().await;
    vec![
        Row::new(
            SCENARIO,
            "fredlock on redis-rs",
            "run of an empty job",
            "µs",
            Summary::of(&runs_rr),
        ),
        Row::new(
            SCENARIO,
            "fredlock on redis-rs / rslock",
            "ratio",
            "x",
            Summary::of(&rr_to_rslock),
        ),
        Row::new(
            SCENARIO,
            "fredlock",
            "run of an empty job",
            "µs",
            Summary::of(&runs),
        ),
        Row::new(
            SCENARIO,
            "rslock 0.10",
            "lock+unlock",
            "µs",
            Summary::of(&peers),
        ),
        Row::new(
            SCENARIO,
            "raw fred",
            "SET NX PX + compare-and-delete",
            "µs",
            Summary::of(&by_hand),
        ),
        Row::new(
            SCENARIO,
            "fredlock / rslock",
            "ratio",
            "x",
            Summary::of(&to_rslock),
        ),
        Row::new(
            SCENARIO,
            "fredlock / raw fred",
            "ratio",
            "x",
            Summary::of(&to_hand),
        ),
        Row::new(
            SCENARIO,
            "raw fred / rslock",
            "ratio",
            "x",
            Summary::of(&hand_to_rslock),
        ),
    ]
}

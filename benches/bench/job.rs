//! Scenario 13: the job lock. An uncontended `run` of an empty job (one `SET NX PX`, one
//! compare-and-delete) against rslock's lock+unlock (one `SET NX PX`, one unlock script) on the
//! same server, one cycle at a time, in interleaved blocks so that both see the same machine.

use std::time::Duration;

use fredlock::LockClient;
use tokio::time::Instant;

use crate::measure::Summary;
use crate::scenarios::Sizes;
use crate::Row;

const SCENARIO: &str = "13 job lock";

/// rslock's TTL, and the job's at-most-for: the same lease on both sides.
const LEASE: Duration = Duration::from_secs(10);

pub async fn job_lock(url: &str, sizes: Sizes) -> Vec<Row> {
    let client = LockClient::connect(url).await.expect("connect");
    let job = client.job_lock("bench:job").at_most_for(LEASE);
    let rslock = rslock::LockManager::new(vec![url.to_string()]);
    let per_block = (sizes.cycles / 10).max(200);
    let mut runs = Vec::new();
    let mut peers = Vec::new();
    let mut ratios = Vec::new();
    // The first two blocks warm both up (connections, script caches) and are not counted.
    for block in 0..sizes.rounds * 2 + 2 {
        let mut ours = Vec::with_capacity(per_block);
        for _ in 0..per_block {
            let started = Instant::now();
            let ran = job.run(async {}).await.expect("run");
            assert!(ran.is_ran(), "the job was not free");
            ours.push(started.elapsed().as_secs_f64() * 1e6);
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
        if block >= 2 {
            ratios.push(Summary::of(&ours).median / Summary::of(&theirs).median);
            runs.extend(ours);
            peers.extend(theirs);
        }
    }
    client.shutdown().await;
    vec![
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
            "fredlock / rslock",
            "ratio",
            "x",
            Summary::of(&ratios),
        ),
    ]
}

//! Scenario 7: a Redlock over five loopback servers, uncontended, against the same protocol
//! written by hand with raw fred calls, and against rslock over the same five servers.

use std::sync::Arc;
use std::time::Duration;

use fred::prelude::*;
use fred::types::{Expiration, SetOptions};
use fredlock::{LockClient, RedLock};
use rand::RngCore;
use tokio::time::Instant;

use crate::harness;
use crate::measure::Summary;
use crate::scenarios::{in_task, raw_client, Sizes};
use crate::Row;

const SCENARIO: &str = "7 redlock (5 nodes)";
const TTL: Duration = Duration::from_secs(10);

/// Redlock's acquire and release, by hand: SET NX PX on the five nodes at once, then the
/// compare-and-delete script (fredlock's own, the same SHA) on the five at once. What
/// fredlock's Redlock cannot beat.
struct Raw {
    nodes: [Client; 5],
    release_sha: String,
}

impl Raw {
    async fn connect(urls: &[String]) -> Raw {
        let nodes = [
            raw_client(&urls[0]).await,
            raw_client(&urls[1]).await,
            raw_client(&urls[2]).await,
            raw_client(&urls[3]).await,
            raw_client(&urls[4]).await,
        ];
        let mut release_sha = String::new();
        for node in &nodes {
            release_sha = node
                .script_load(crate::harness::script("redlock_release"))
                .await
                .expect("SCRIPT LOAD");
        }
        Raw { nodes, release_sha }
    }

    async fn cycle(&self, key: &str) {
        let mut bytes = [0u8; 20];
        rand::thread_rng().fill_bytes(&mut bytes);
        let token: String = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
        let [a, b, c, d, e] = &self.nodes;
        let token = token.as_str();
        let granted = tokio::join!(
            set(a, key, token),
            set(b, key, token),
            set(c, key, token),
            set(d, key, token),
            set(e, key, token)
        );
        assert!(matches!(
            granted,
            (Some(_), Some(_), Some(_), Some(_), Some(_))
        ));
        let sha = self.release_sha.as_str();
        let released = tokio::join!(
            release(a, sha, key, token),
            release(b, sha, key, token),
            release(c, sha, key, token),
            release(d, sha, key, token),
            release(e, sha, key, token)
        );
        assert_eq!(released, (1, 1, 1, 1, 1));
    }
}

async fn set(node: &Client, key: &str, token: &str) -> Option<String> {
    node.set(
        key,
        token,
        Some(Expiration::PX(TTL.as_millis() as i64)),
        Some(SetOptions::NX),
        false,
    )
    .await
    .expect("SET NX PX")
}

async fn release(node: &Client, sha: &str, key: &str, token: &str) -> i64 {
    node.evalsha(sha, vec![key], vec![token])
        .await
        .expect("EVALSHA release")
}

/// Microseconds per cycle of `cycle`, run `n` times in a task of its own.
async fn per_cycle<F, Fut>(n: usize, cycle: F) -> f64
where
    F: Fn() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    in_task(async move {
        let started = Instant::now();
        for _ in 0..n {
            cycle().await;
        }
        started.elapsed().as_secs_f64() * 1e6 / n as f64
    })
    .await
}

pub async fn redlock(sizes: Sizes) -> Vec<Row> {
    let servers = harness::start_servers(5);
    let urls = harness::urls(&servers);
    let mut nodes = Vec::new();
    for url in &urls {
        nodes.push(LockClient::connect(url).await.expect("connect"));
    }
    let redlock = RedLock::new(nodes.clone(), "bench:redlock").expect("redlock");
    let raw = Arc::new(Raw::connect(&urls).await);
    let single = nodes[0].lock("bench:redlock:single");
    let cycles = (sizes.cycles / 4).max(200);

    let ours = |n: usize| {
        let redlock = redlock.clone();
        per_cycle(n, move || {
            let redlock = redlock.clone();
            async move {
                let guard = redlock
                    .try_lock(Duration::ZERO, Some(TTL))
                    .await
                    .expect("try_lock")
                    .expect("uncontended");
                guard.unlock().await.expect("unlock");
            }
        })
    };
    let by_hand = |n: usize| {
        let raw = raw.clone();
        per_cycle(n, move || {
            let raw = raw.clone();
            async move { raw.cycle("bench:redlock:raw").await }
        })
    };
    let one_node = |n: usize| {
        let lock = single.clone();
        per_cycle(n, move || {
            let lock = lock.clone();
            async move {
                lock.lock()
                    .await
                    .expect("lock")
                    .unlock()
                    .await
                    .expect("unlock");
            }
        })
    };
    let manager = Arc::new(rslock::LockManager::new(urls.clone()));
    // rslock is slower per cycle: fewer cycles make its blocks last about as long as the others'.
    let rslock_cycles = (cycles / 4).max(100);
    let with_rslock = |n: usize| {
        let manager = manager.clone();
        per_cycle(n, move || {
            let manager = manager.clone();
            async move {
                let lock = manager
                    .lock("bench:redlock:rslock", TTL)
                    .await
                    .expect("rslock");
                manager.unlock(&lock).await;
            }
        })
    };
    ours(cycles / 10).await;
    by_hand(cycles / 10).await;
    one_node(cycles / 10).await;
    with_rslock(rslock_cycles / 10).await;
    let (mut ours_samples, mut raw_samples, mut single_samples, mut rslock_samples) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    // Interleaved, rslock included, so that drift of a shared machine hits all alike.
    for _ in 0..sizes.rounds {
        ours_samples.push(ours(cycles).await);
        raw_samples.push(by_hand(cycles).await);
        single_samples.push(one_node(cycles).await);
        rslock_samples.push(with_rslock(rslock_cycles).await);
    }

    let (ours, raw, single, rslock) = (
        Summary::of(&ours_samples),
        Summary::of(&raw_samples),
        Summary::of(&single_samples),
        Summary::of(&rslock_samples),
    );
    let rows = vec![
        Row::new(SCENARIO, "fredlock RedLock", "try_lock+unlock", "µs", ours),
        Row::new(
            SCENARIO,
            "raw SET NX PX x5 + EVALSHA x5",
            "acquire+release, nodes at once",
            "µs",
            raw,
        ),
        Row::new(
            SCENARIO,
            "fredlock Lock, 1 node",
            "lock+unlock",
            "µs",
            single,
        ),
        Row::new(SCENARIO, "rslock 0.10", "lock+unlock", "µs", rslock),
        Row::ratio(SCENARIO, "fredlock RedLock / raw", ours.median / raw.median),
    ];
    for node in nodes {
        node.shutdown().await;
    }
    drop(servers);
    rows
}

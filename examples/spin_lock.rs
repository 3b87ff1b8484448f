//! A spin lock: workers take turns on one job without any pub/sub, for deployments where
//! SUBSCRIBE is unavailable (some proxies) or costly (a cluster broadcasts every PUBLISH).
//!
//! ```text
//! cargo run --example spin_lock
//! ```
//!
//! Uses the Redis at `REDIS_URL` when it is set; otherwise starts a throw-away `redis-server`
//! (which must be on PATH) on a free loopback port and stops it at the end.

use std::time::Duration;

use fredlock::LockClient;

mod throwaway;

use throwaway::redis_url;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (_server, url) = redis_url()?;
    let client = LockClient::connect(&url).await?;

    // Waiters retry after 2 ms, doubling up to 50 ms (the default is 1 ms up to 128 ms).
    let lock = client
        .spin_lock("spin_lock:nightly-report")
        .with_backoff(Duration::from_millis(2), Duration::from_millis(50))?;

    let mut workers = Vec::new();
    for worker in 0..4 {
        let lock = lock.clone();
        workers.push(tokio::spawn(async move {
            let guard = lock.lock().await?;
            println!("worker {worker} runs the report");
            tokio::time::sleep(Duration::from_millis(100)).await;
            guard.unlock().await?;
            Ok::<_, fredlock::Error>(())
        }));
    }
    for worker in workers {
        worker.await??;
    }
    // Nobody subscribed to anything: every waiter polled with backoff.
    println!(
        "done; subscriptions this client made: {}",
        client.stats().subscriptions
    );

    client.shutdown().await;
    Ok(())
}

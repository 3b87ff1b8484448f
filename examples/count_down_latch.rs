//! Wait for a set of instances to finish a phase, with a count-down latch: 5 workers over two
//! instances each count down when done, and a coordinator on another instance waits for all of
//! them.
//!
//! ```text
//! cargo run --example count_down_latch
//! ```
//!
//! Uses the Redis at `REDIS_URL` when it is set; otherwise starts a throw-away `redis-server`
//! (which must be on PATH) on a free loopback port and stops it at the end.

use std::time::Duration;

use fredlock::LockClient;
use tokio::time::Instant;

mod throwaway;

use throwaway::redis_url;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (_server, url) = redis_url()?;
    let instances = [
        LockClient::connect(&url).await?,
        LockClient::connect(&url).await?,
    ];
    let phase = instances[0].count_down_latch("example:phase-1");
    // Only where no count is set: a latch in use keeps its count.
    if !phase.try_set_count(5).await? {
        println!("a count was set already: {}", phase.count().await?);
    }

    let started = Instant::now();
    for worker in 0..5u64 {
        let phase = instances[(worker % 2) as usize].count_down_latch("example:phase-1");
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100 * (worker + 1))).await; // the work
            let left = phase.count_down().await?;
            println!("worker {worker} done, {left} to go");
            Ok::<_, fredlock::Error>(())
        });
    }

    // Not done within 200 ms: only two workers have finished by then.
    if !phase.try_wait(Duration::from_millis(200)).await? {
        println!("after 200 ms the count is {}", phase.count().await?);
    }
    phase.wait().await?;
    println!("phase 1 done after {:?}", started.elapsed());
    // A latch at zero has no key: waiting on it returns at once.
    phase.wait().await?;
    for instance in &instances {
        instance.shutdown().await;
    }
    Ok(())
}

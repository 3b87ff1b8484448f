//! A nightly report that must run once across the fleet, guarded by a Redlock over five
//! independent Redis masters: it keeps working with two of them down.
//!
//! ```text
//! cargo run --example redlock
//! ```
//!
//! Uses the masters in `REDLOCK_URLS` (comma-separated `redis://` URLs) when it is set;
//! otherwise starts five throw-away `redis-server`s (which must be on PATH) on free loopback
//! ports and stops them at the end.

use std::time::Duration;

use fredlock::{LockClient, RedLock};

mod throwaway;

use throwaway::ThrowAwayRedis;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut servers = Vec::new();
    let urls: Vec<String> = match std::env::var("REDLOCK_URLS") {
        Ok(urls) => urls.split(',').map(str::to_owned).collect(),
        Err(_) => {
            for _ in 0..5 {
                servers.push(ThrowAwayRedis::start()?);
            }
            println!("started five throw-away redis-servers");
            servers
                .iter()
                .map(|server| server.url().to_owned())
                .collect()
        }
    };

    // Two service instances, each with one client per master.
    let mut instances = Vec::new();
    for _ in 0..2 {
        let mut nodes = Vec::new();
        for url in &urls {
            nodes.push(LockClient::connect(url).await?);
        }
        instances.push(
            RedLock::builder(nodes, "example:nightly-report")
                .lease(Duration::from_secs(3))
                .retry_delay(Duration::from_millis(20)..=Duration::from_millis(60))
                .build()?,
        );
    }
    let (a, b) = (&instances[0], &instances[1]);
    println!("{} nodes, a majority is {}", urls.len(), a.quorum());

    // 1. Instance A takes the lock; B cannot while A holds it.
    let guard = a.lock().await?;
    println!("A holds it; safe for another {:?}", guard.validity());
    assert!(b
        .try_lock(Duration::from_millis(200), None)
        .await?
        .is_none());
    println!("B gave up after 200 ms: A holds a majority");
    guard.unlock().await?;

    // 2. A fixed lease: validity() is what is left of it after acquiring and the drift allowance.
    let lease = Duration::from_secs(2);
    if let Some(guard) = b.try_lock(Duration::from_secs(1), lease).await? {
        println!(
            "B holds it for a {lease:?} lease; validity {:?}",
            guard.validity()
        );
        guard.unlock().await?;
    }

    if servers.is_empty() {
        return Ok(()); // not ours to kill
    }

    // 3. Two of five masters die: three are still a majority.
    servers[0].kill();
    servers[1].kill();
    let guard = a.lock().await?;
    println!(
        "with two masters down, A still got it (validity {:?})",
        guard.validity()
    );

    // 4. A third dies while A holds it: the extensions fail on a majority, and A is told.
    servers[2].kill();
    tokio::select! {
        _ = guard.lost() => println!("A was told it lost the lock: the report must stop"),
        _ = tokio::time::sleep(Duration::from_secs(5)) => println!("not lost?"),
    }
    drop(guard);

    // 5. With three of five down, acquisition fails and says which nodes and why.
    match b.try_lock(Duration::from_millis(300), None).await {
        Err(error) => println!("B: {error}"),
        Ok(outcome) => println!("B: unexpected {outcome:?}"),
    }
    Ok(())
}

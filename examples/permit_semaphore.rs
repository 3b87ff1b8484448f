//! At most 2 calls at once to a rate-limited API, with a permit semaphore whose permits are
//! leases: a worker that crashes while holding a slot does not take it with it. Here a worker
//! "crashes" by leaking its permit (its process would die; here its guard is forgotten), and the
//! slot returns once the lease ends, timed by the Redis server's clock.
//!
//! ```text
//! cargo run --example permit_semaphore
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
    // A short watchdog lease, so that the example shows a lease ending within seconds; the
    // default is 30 s.
    let client = LockClient::builder()
        .url(url)
        .watchdog_lease(Duration::from_secs(3))
        .build()
        .await?;
    let api = client.permit_semaphore("example:api-slots");
    api.try_set_permits(2).await?;

    // A live holder: the watchdog renews its lease every second for as long as it holds it.
    let slot = api.acquire().await?;
    println!("holding permit {}", slot.id());
    tokio::time::sleep(Duration::from_secs(4)).await;
    println!("still held after 4 s (lost: {})", slot.is_lost());

    // A crashed holder: a fixed lease of 1 s that nobody gives back.
    let crashed = api
        .try_acquire(Duration::ZERO, Duration::from_secs(1))
        .await?
        .ok_or("no free slot")?;
    std::mem::forget(crashed);
    println!(
        "both slots taken; {} available",
        api.available_permits().await?
    );

    // A waiter sleeps until the earliest lease would end, and takes the slot then.
    let asked = Instant::now();
    let next = api
        .try_acquire(Duration::from_secs(5), None)
        .await?
        .ok_or("the crashed holder's slot did not return")?;
    println!(
        "the crashed holder's slot came back after {:?}",
        asked.elapsed()
    );

    // Work that must stop if its slot is lost.
    tokio::select! {
        _ = tokio::time::sleep(Duration::from_millis(100)) => println!("call done within its slot"),
        _ = next.lost() => println!("slot lost; call abandoned"),
    }
    next.release().await?;
    slot.release().await?;
    println!("{} slot(s) available", api.available_permits().await?);
    client.shutdown().await;
    Ok(())
}

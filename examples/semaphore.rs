//! At most 3 exports at once across every instance of a service, with a semaphore: 2 instances
//! x 6 workers ask for an export slot; never more than 3 run, every worker gets its turn, and a
//! big export takes 2 slots at once.
//!
//! ```text
//! cargo run --example semaphore
//! ```
//!
//! Uses the Redis at `REDIS_URL` when it is set; otherwise starts a throw-away `redis-server`
//! (which must be on PATH) on a free loopback port and stops it at the end.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fredlock::LockClient;

mod throwaway;

use throwaway::redis_url;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (_server, url) = redis_url()?;
    // Two service instances.
    let instances = [
        LockClient::connect(&url).await?,
        LockClient::connect(&url).await?,
    ];
    // Every instance may call this at start-up: the first one sets the permits.
    let exports = instances[0].semaphore("example:exports");
    let set = exports.try_set_permits(3).await?;
    println!("permits set by this instance: {set}");

    let inside = Arc::new(AtomicUsize::new(0));
    let most_inside = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for worker in 0..12 {
        let exports = instances[worker % 2].semaphore("example:exports");
        let (inside, most_inside) = (inside.clone(), most_inside.clone());
        workers.push(tokio::spawn(async move {
            // Worker 0's export is big: it takes 2 slots.
            let slots = if worker == 0 { 2 } else { 1 };
            let permit = exports.acquire(slots).await?;
            let now = inside.fetch_add(slots as usize, Ordering::SeqCst) + slots as usize;
            most_inside.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(50)).await; // the export
            inside.fetch_sub(slots as usize, Ordering::SeqCst);
            permit.release().await?; // dropping it would give the slots back too
            Ok::<_, fredlock::Error>(())
        }));
    }
    for worker in workers {
        worker.await??;
    }
    println!(
        "12 exports done, at most {} slot(s) in use at once",
        most_inside.load(Ordering::SeqCst)
    );

    // A try with a deadline: nothing free for a second means the caller does something else.
    let all = exports.acquire(3).await?;
    match exports.try_acquire(1, Duration::from_millis(200)).await? {
        Some(_) => println!("unexpected: a fourth slot"),
        None => println!("no slot within 200 ms while all 3 are taken"),
    }
    all.release().await?;
    println!("{} slot(s) available", exports.available_permits().await?);
    for instance in &instances {
        instance.shutdown().await;
    }
    Ok(())
}

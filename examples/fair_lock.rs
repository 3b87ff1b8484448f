//! A ticket counter served first come, first served with a fair lock; a waiter that gives up
//! leaves the line, and the one behind it moves up.
//!
//! ```text
//! cargo run --example fair_lock
//! ```
//!
//! Uses the Redis at `REDIS_URL` when it is set; otherwise starts a throw-away `redis-server`
//! (which must be on PATH) on a free loopback port and stops it at the end.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fredlock::LockClient;

mod throwaway;

use throwaway::redis_url;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (_server, url) = redis_url()?;

    // Two service instances share the counter. A waiter whose process dies keeps its place for
    // at most `queue_place` (2 s here; 5 s by default).
    let instances = [
        LockClient::builder()
            .url(&url)
            .queue_place(Duration::from_secs(2))
            .build()
            .await?,
        LockClient::builder()
            .url(&url)
            .queue_place(Duration::from_secs(2))
            .build()
            .await?,
    ];
    let counter = instances[0].fair_lock("example:tickets");

    // The clerk is busy while six customers arrive, 10 ms apart, at either instance.
    let clerk = counter.lock().await?;
    let served = Arc::new(Mutex::new(Vec::new()));
    let mut customers: Vec<tokio::task::JoinHandle<fredlock::Result<()>>> = Vec::new();
    for customer in 1..=6 {
        let counter = instances[customer % 2].fair_lock("example:tickets");
        let served = served.clone();
        customers.push(tokio::spawn(async move {
            // Customer 3 is impatient: it waits 100 ms at most and leaves the line.
            let wait = if customer == 3 {
                Duration::from_millis(100)
            } else {
                Duration::from_secs(10)
            };
            match counter.try_lock(wait, None).await? {
                Some(guard) => {
                    served.lock().expect("served").push(customer);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    guard.unlock().await?;
                }
                None => println!("customer {customer} gave up and left the line"),
            }
            fredlock::Result::Ok(())
        }));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    tokio::time::sleep(Duration::from_millis(200)).await;
    clerk.unlock().await?;
    for customer in customers {
        customer.await.expect("customer task")?;
    }
    let served = served.lock().expect("served").clone();
    println!("served in arrival order: {served:?}");
    assert_eq!(served, vec![1, 2, 4, 5, 6]);

    // A no-wait attempt never queues: it takes the counter only when nobody is in line.
    let walk_in = counter.try_lock_now().await?;
    println!("walk-in served at once: {}", walk_in.is_some());
    drop(walk_in);

    for instance in &instances {
        instance.shutdown().await;
    }
    Ok(())
}

//! fredlock in five minutes: lock, reentrancy, try_lock, and a lost lock.
//!
//! ```text
//! cargo run --example quickstart
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

    // A short watchdog lease so that the lost-lock demo below is quick; the default is 30 s.
    let client = LockClient::builder()
        .url(&url)
        .watchdog_lease(Duration::from_secs(3))
        .build()
        .await?;
    println!("client {} connected", client.id());

    // 1. Lock and reenter: the same task may take the lock again.
    let lock = client.lock("quickstart:orders:1001");
    let outer = lock.lock().await?;
    let inner = lock.lock().await?;
    println!(
        "holding {:?} {} times",
        lock.name(),
        lock.hold_count().await?
    );
    inner.unlock().await?;
    outer.unlock().await?;
    println!("released; locked now: {}", lock.is_locked().await?);

    // 2. try_lock: another task (another owner) cannot take a held lock, neither at once nor
    //    within a wait.
    let guard = lock.lock().await?;
    let contender = lock.clone();
    let attempt = tokio::spawn(async move {
        let now = contender.try_lock_now().await?.is_some();
        let within = contender
            .try_lock(Duration::from_millis(200), Duration::from_secs(10))
            .await?
            .is_some();
        Ok::<_, fredlock::Error>(now || within)
    });
    println!("other task got it while held: {}", attempt.await??);
    let contender = lock.clone();
    let waiter = tokio::spawn(async move { contender.lock().await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    guard.unlock().await?;
    let handed_over = waiter.await??;
    println!("waiting task got it right after the unlock");
    handed_over.unlock().await?;

    // 3. A lost lock: an operator force-unlocks it; the holder is told and stops its work.
    let guard = lock.lock().await?;
    lock.force_unlock().await?;
    tokio::select! {
        _ = tokio::time::sleep(Duration::from_secs(10)) => println!("work finished"),
        _ = guard.lost() => println!("lock lost (is_lost = {}); work abandoned", guard.is_lost()),
    }
    if let Err(error) = guard.unlock().await {
        println!("unlock after the loss: {error}");
    }

    client.shutdown().await;
    Ok(())
}

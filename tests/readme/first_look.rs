use std::time::Duration;

use fredlock::LockClient;

async fn first_look(url: &str) -> fredlock::Result<()> {
    let client = LockClient::connect(url).await?; // "redis://127.0.0.1:6379"
    let lock = client.lock("orders:1001");

    let guard = lock.lock().await?; // waits as long as needed; the watchdog keeps it alive
    {
        let inner = lock.lock().await?; // same task: reentrant, hold count 2
        inner.unlock().await?; // hold count 1
    }
    guard.unlock().await?; // released; waiters are woken

    // Redisson's tryLock(waitTime, leaseTime): wait at most 2 s, hold at most 10 s (no watchdog)
    if let Some(g) = lock.try_lock(Duration::from_secs(2), Duration::from_secs(10)).await? {
        g.unlock().await?;
    }
    // A lease of None: the watchdog renews the hold until the guard goes
    if let Some(g) = lock.try_lock(Duration::from_secs(2), None).await? {
        g.unlock().await?;
    }
    // One attempt, no wait (Redisson's tryLock())
    if let Some(g) = lock.try_lock_now().await? {
        g.unlock().await?;
    }
    Ok(())
}

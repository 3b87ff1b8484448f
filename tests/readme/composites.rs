use std::time::Duration;

use fredlock::{LockClient, MultiLock, RedLock};

async fn composites(masters: Vec<LockClient>, client: &LockClient) -> fredlock::Result<()> {
    let redlock = RedLock::new(masters, "payments:42")?; // one client per independent master
    let guard = redlock.lock().await?; // held on a majority, extended every lease / 3
    guard.unlock().await?;
    let (wait, lease) = (Duration::from_secs(2), Duration::from_secs(10));
    if let Some(g) = redlock.try_lock(wait, lease).await? {
        // safe for g.validity() from now
        g.unlock().await?;
    }

    let transfer = MultiLock::new(vec![client.lock("acct:1"), client.lock("acct:2")])?;
    let both = transfer.lock().await?; // all or nothing, never deadlocks
    both.unlock().await?;
    Ok(())
}

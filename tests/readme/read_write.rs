use std::time::Duration;

use fredlock::LockClient;

async fn read_write(client: &LockClient) -> fredlock::Result<()> {
    let config = client.rw_lock("config:tenant-7");

    let r = config.read_lock().lock().await?; // many readers at once, in any tasks
                                              // ... read ...
    r.unlock().await?; // a task that holds a read lock is refused the write lock: WouldDeadlock

    if let Some(w) = config
        .write_lock()
        .try_lock(Duration::from_secs(2), None)
        .await?
    {
        // one writer alone: no reader and no other writer
        w.unlock().await?;
    }
    Ok(())
}

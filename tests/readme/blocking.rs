use std::time::Duration;

use fredlock::blocking::LockClient;

fn blocking(url: &str) -> fredlock::Result<()> {
    let client = LockClient::connect(url)?; // runs a runtime of its own: call it from threads
    let lock = client.lock("report");
    let guard = lock.lock()?; // blocks this thread; the watchdog renews the lock meanwhile
    let again = lock.lock()?; // the owner is the thread: the same thread takes it again
    again.unlock()?;
    guard.unlock()?;
    if let Some(guard) = lock.try_lock(Duration::from_millis(100), None)? {
        drop(guard); // dropping gives it back too
    }
    client.shutdown()
}

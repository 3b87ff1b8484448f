use std::time::Duration;

use fredlock::LockClient;

async fn charge_once(client: &LockClient, order: u64) -> fredlock::Result<bool> {
    let charged = client
        .lock(format!("orders:{order}"))
        // Wait up to 5 s for an instance already on it, then check and charge holding the lock:
        // the lock makes check-then-charge one step across every instance.
        .try_with_lock(Duration::from_secs(5), None, |_lost| async move {
            // if db.is_charged(order).await? { return false; }
            // payments.charge(order).await?; db.mark_charged(order).await?;
            true
        })
        .await?; // None: another instance held it for 5 s; Err(Lost): lost while charging
    Ok(charged == Some(true))
}

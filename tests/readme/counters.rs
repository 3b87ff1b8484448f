use fredlock::LockClient;

async fn counters(client: &LockClient) -> fredlock::Result<()> {
    let exports = client.semaphore("exports");
    exports.try_set_permits(3).await?; // only if not set yet
    let permit = exports.acquire(1).await?; // at most 3 exports at once; drop gives it back
    permit.release().await?;

    let api = client.permit_semaphore("api-slots"); // permits are leases: a crashed holder's return
    api.try_set_permits(10).await?; // as many permits as slots, set once
    let slot = api.acquire().await?; // renewed by the watchdog; slot.id(), slot.lost()
    slot.release().await?;

    let phase = client.count_down_latch("phase-1");
    phase.try_set_count(5).await?;
    for _worker in 0..5 {
        let phase = phase.clone();
        tokio::spawn(async move {
            // ... this worker's part of the phase ...
            phase.count_down().await
        });
    }
    phase.wait().await?; // or try_wait(d) -> bool
    Ok(())
}

use std::future::Future;

use fredlock::LockClient;

async fn serve(client: LockClient, stop: impl Future<Output = ()>) -> fredlock::Result<()> {
    let guard = client.lock("exports:daily").lock().await?;
    // ... work, until the process is told to stop (tokio::signal::ctrl_c(), SIGTERM) ...
    stop.await;
    // Hands every hold over at once (waiting instances take them now, not a lease later),
    // tells every guard it is lost, and closes the connections.
    client.shutdown().await;
    assert!(guard.is_lost());
    Ok(())
}

use fredlock::events::{LockEventKind, RecvError};
use fredlock::LockClient;

async fn events(client: &LockClient) -> fredlock::Result<Vec<LockEventKind>> {
    let mut events = client.events(); // from now on: this client's holds, waits and connection
    let guard = client.lock("orders:1001").lock().await?;
    guard.unlock().await?;
    let mut seen = Vec::new();
    while seen.len() < 2 {
        match events.recv().await {
            Ok(event) => {
                // kind "lock", name "orders:1001", the owner, the client's name
                println!("{} {} {:?}", event.kind(), event.name(), event.what());
                seen.push(event.what()); // Acquired, then Released
            }
            Err(RecvError::Lagged(missed)) => println!("fell behind: {missed} events lost"),
            Err(RecvError::Closed) => break, // the client shut down
        }
    }
    // In a service: a task of its own that pages someone on LockEventKind::Lost(_).
    Ok(seen)
}

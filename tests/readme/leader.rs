use std::time::Duration;

use fredlock::LockClient;

async fn leader(client: &LockClient) -> fredlock::Result<u64> {
    let election = client.leader_election("billing-scheduler").identity("pod-7:8080");
    let term = election.campaign().await?; // waits until this instance leads
    let epoch = term.epoch(); // above every earlier term's: send it with every write
    let now = election.leader().await?; // Some(Leader { identity, epoch, since, .. })
    assert_eq!(now.map(|leader| leader.epoch), Some(epoch));
    term.resign().await?; // a waiting candidate leads at once

    // Or the whole loop: campaign, lead, stop when leadership is lost (the future is
    // dropped), step down when it returns, campaign again; until the client shuts down.
    let runs = election.run(|term| async move {
        println!("leading in epoch {}", term.epoch()); // ... the scheduler's work ...
        tokio::time::sleep(Duration::from_millis(100)).await;
    });
    let _ = tokio::time::timeout(Duration::from_millis(500), runs).await;
    Ok(epoch)
}

//! Leader election: three instances (here, three clients in one process) campaign for
//! `report-scheduler`; one leads at a time and runs the scheduler loop, stamping every write
//! with its term's epoch; when it steps down another takes over at once. An observer prints
//! every change of leader.
//!
//! ```text
//! cargo run --example leader_election
//! ```
//!
//! Uses the Redis at `REDIS_URL` when it is set, otherwise a throw-away `redis-server` (which
//! must be on PATH).

use std::time::Duration;

use fredlock::{LockClient, Term};

mod throwaway;

use throwaway::redis_url;

/// What a leader does while it leads: here, three ticks of work, each a write that goes through
/// only while its term stands, then it steps down (a real scheduler would loop until
/// leadership is lost, when `run` drops this future).
async fn scheduler_loop(term: Term) {
    for tick in 1..=3 {
        let written: fredlock::Result<i64> = term
            .eval_while_held(
                "return redis.call('hset', KEYS[1], 'epoch', ARGV[1], 'tick', ARGV[2])",
                ["{report-scheduler}:state"],
                [term.epoch().to_string(), tick.to_string()],
            )
            .await;
        match written {
            Ok(_) => println!(
                "  {} (epoch {}) ran tick {tick}",
                term.identity(),
                term.epoch()
            ),
            Err(error) => {
                println!("  {} stopped: {error}", term.identity());
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (_server, url) = redis_url()?;

    // Everyone, leader or not, can watch who leads.
    let watcher = LockClient::connect(&url).await?;
    let mut changes = watcher
        .leader_election("report-scheduler")
        .observe()
        .await?;
    tokio::spawn(async move {
        while changes.changed().await.is_ok() {
            match &*changes.borrow_and_update() {
                Some(leader) => println!("leader: {} (epoch {})", leader.identity, leader.epoch),
                None => println!("leader: none"),
            }
        }
    });

    let mut instances = Vec::new();
    for i in 1..=3 {
        let client = LockClient::connect(&url).await?;
        let election = client
            .leader_election("report-scheduler")
            .identity(format!("instance-{i}"));
        instances.push((
            client,
            // Campaign, lead, step down, campaign again: until the client shuts down.
            tokio::spawn(async move { election.run(scheduler_loop).await }),
        ));
    }

    tokio::time::sleep(Duration::from_secs(5)).await;
    for (client, run) in instances {
        run.abort();
        let _ = run.await;
        client.shutdown().await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(())
}

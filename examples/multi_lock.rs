//! Transfers between accounts, each account a lock: a MultiLock takes both accounts of a
//! transfer or neither, so concurrent transfers in opposite directions never deadlock.
//!
//! ```text
//! cargo run --example multi_lock
//! ```
//!
//! Uses the Redis at `REDIS_URL` when it is set; otherwise starts a throw-away `redis-server`
//! (which must be on PATH) on a free loopback port and stops it at the end.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fredlock::{LockClient, MultiLock};

mod throwaway;

use throwaway::redis_url;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (_server, url) = redis_url()?;
    let client = LockClient::connect(&url).await?;

    // Balances kept in memory for the demo; the locks are what keep transfers apart.
    let balances: Arc<[AtomicI64; 3]> = Arc::new([
        AtomicI64::new(100),
        AtomicI64::new(100),
        AtomicI64::new(100),
    ]);

    // Six transfers at once, pairs in both directions: 0 -> 1 and 1 -> 0, and so on.
    let mut transfers: Vec<tokio::task::JoinHandle<fredlock::Result<()>>> = Vec::new();
    for (from, to) in [(0, 1), (1, 0), (1, 2), (2, 1), (2, 0), (0, 2)] {
        let accounts = MultiLock::new(vec![
            client.lock(format!("example:acct:{from}")),
            client.lock(format!("example:acct:{to}")),
        ])?;
        let balances = balances.clone();
        transfers.push(tokio::spawn(async move {
            for _ in 0..20 {
                let both = accounts.lock().await?;
                // Read, think, write: safe only because both accounts are held.
                let amount = 5;
                let source = balances[from].load(Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(1)).await;
                balances[from].store(source - amount, Ordering::SeqCst);
                let target = balances[to].load(Ordering::SeqCst);
                balances[to].store(target + amount, Ordering::SeqCst);
                both.unlock().await?;
            }
            fredlock::Result::Ok(())
        }));
    }
    for transfer in transfers {
        transfer.await.expect("transfer task")?;
    }
    let total: i64 = balances.iter().map(|b| b.load(Ordering::SeqCst)).sum();
    println!(
        "120 transfers done; balances {:?}, total {total} (was 300)",
        balances
            .iter()
            .map(|b| b.load(Ordering::SeqCst))
            .collect::<Vec<_>>()
    );
    assert_eq!(total, 300, "a transfer overlapped another");

    // All or nothing: with account 1 held elsewhere, a transfer 0 -> 1 takes neither account.
    let other_task = {
        let lock = client.lock("example:acct:1");
        let (held_tx, held_rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let guard = lock.lock().await?;
            let _ = held_tx.send(());
            tokio::time::sleep(Duration::from_millis(500)).await;
            guard.unlock().await
        });
        let _ = held_rx.await;
        task
    };
    let transfer = MultiLock::new(vec![
        client.lock("example:acct:0"),
        client.lock("example:acct:1"),
    ])?;
    let outcome = transfer.try_lock(Duration::from_millis(100), None).await?;
    println!(
        "with account 1 busy: acquired = {}, account 0 held = {}",
        outcome.is_some(),
        client.lock("example:acct:0").is_locked().await?
    );
    other_task.await.expect("holder task")?;
    Ok(())
}

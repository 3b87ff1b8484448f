//! fredlock beside the peer crates the benchmark measures it against, on real servers: rslock's
//! Redlock and fredlock's exclude each other on the same five nodes. In this package, not in
//! `tests/redlock.rs`, so that building fredlock's own tests and examples never builds rslock
//! and the `redis` crate under it.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::time::Duration;

use common::{bounded, clients, start_servers, urls};
use fredlock::RedLock;

const NAME: &str = "peers:redlock";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rslock_and_our_redlock_exclude_each_other() {
    bounded(async {
        let servers = start_servers(5);
        let redlock = RedLock::builder(clients(&urls(&servers)).await, NAME)
            .retry_delay(Duration::from_millis(5)..=Duration::from_millis(20))
            .build()
            .unwrap();
        let lease = Duration::from_secs(10);

        // rslock holds it: we cannot get it; once it unlocks, we can, and then it cannot.
        let rslock = rslock::LockManager::new(urls(&servers));
        let theirs = rslock.lock(NAME, lease).await.expect("rslock lock");
        assert!(redlock
            .try_lock(Duration::ZERO, Some(lease))
            .await
            .unwrap()
            .is_none());
        rslock.unlock(&theirs).await;
        let ours = redlock
            .try_lock(Duration::ZERO, Some(lease))
            .await
            .unwrap()
            .unwrap();
        let mut rslock = rslock;
        rslock.set_retry(2, Duration::from_millis(10));
        assert!(
            rslock.lock(NAME, lease).await.is_err(),
            "rslock acquired our Redlock"
        );
        ours.unlock().await.unwrap();
        let theirs = rslock
            .lock(NAME, lease)
            .await
            .expect("rslock after our unlock");
        rslock.unlock(&theirs).await;
    })
    .await
}

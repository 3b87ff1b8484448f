//! Redis Sentinel: locks through `redis-sentinel://`, and what a failover does to holders,
//! waiters and new acquisitions, against a master, two replicas and three sentinels started
//! by the harness.

mod common;

use std::time::Duration;

use common::{bounded, RedisSentinel, SENTINEL_SERVICE};
use fred::prelude::*;
use fredlock::{LockClient, LockGuard};
use tokio::task::JoinHandle;
use tokio::time::Instant;

async fn client(setup: &RedisSentinel, watchdog: Duration) -> LockClient {
    common::lock_client_at(&setup.url(), watchdog).await
}

/// A builder finding the master through `setup`'s sentinels with `sentinel(..)`, no URL.
fn sentinel_builder(setup: &RedisSentinel) -> fredlock::LockClientBuilder {
    common::builder().sentinel(
        SENTINEL_SERVICE,
        setup
            .sentinels
            .iter()
            .map(|sentinel| ("127.0.0.1", sentinel.port())),
    )
}

/// The owner fields of the lock `name` on the server on `port`, with the key's TTL.
async fn holders(setup: &RedisSentinel, port: u16, name: &str) -> (Vec<String>, i64) {
    let raw = setup.raw(port).await;
    let fields: Vec<String> = raw.hkeys(name).await.unwrap();
    let ttl: i64 = raw.pttl(name).await.unwrap();
    let _ = raw.quit().await;
    (fields, ttl)
}

/// Lock, reentrancy, wake-up and the watchdog, with one client from the URL and one from the
/// builder's `sentinel(..)`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_work_through_sentinel() {
    bounded(async {
        let setup = RedisSentinel::start(1);
        let master = setup.master_port();
        let watchdog = Duration::from_millis(1500);
        let first = client(&setup, watchdog).await;
        let second = sentinel_builder(&setup).build().await.unwrap();

        let lock = first.lock("sentinel-basic");
        let outer = lock.lock().await.unwrap();
        let inner = lock.lock().await.unwrap();
        assert_eq!(lock.hold_count().await.unwrap(), 2);
        let (fields, _) = holders(&setup, master, "sentinel-basic").await;
        assert_eq!(fields, vec![outer.owner_field().to_string()]);

        // The watchdog renews through the sentinel-found master: alive after 3 timeouts.
        tokio::time::sleep(watchdog * 3).await;
        assert!(!outer.is_lost());
        let (fields, ttl) = holders(&setup, master, "sentinel-basic").await;
        assert_eq!(fields.len(), 1);
        assert!(ttl > 0, "renewed, with a TTL: {ttl}");

        let waiter_lock = second.lock("sentinel-basic");
        let waiter = tokio::spawn(async move {
            let guard = waiter_lock.lock().await.unwrap();
            let woke = Instant::now();
            guard.unlock().await.unwrap();
            woke
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !waiter.is_finished(),
            "the waiter waits while the lock is held"
        );
        inner.unlock().await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!waiter.is_finished(), "one hold is still there");
        let released = Instant::now();
        outer.unlock().await.unwrap();
        let woke = waiter.await.unwrap();
        let latency = woke.saturating_duration_since(released);
        println!("waiter held {latency:?} after the unlock");
        assert!(latency < Duration::from_millis(250), "woken by the unlock");

        first.shutdown().await;
        second.shutdown().await;
    })
    .await;
}

/// A holder with the watchdog, a waiter from another client and a prober for fresh locks, then a
/// failover done by `fail`, which returns the new master's port.
async fn survive_failover(fail: impl FnOnce(&mut RedisSentinel) -> u16) {
    let mut setup = RedisSentinel::start(2);
    let old_master = setup.master_port();
    let watchdog = Duration::from_secs(6);
    let holder = client(&setup, watchdog).await;
    let other = client(&setup, watchdog).await;
    let name = "sentinel-failover";
    let guard = holder.lock(name).lock().await.unwrap();
    let waiter_lock = other.lock(name);
    let waiter: JoinHandle<(LockGuard, Instant)> = tokio::spawn(async move {
        let guard = waiter_lock.lock().await.unwrap();
        (guard, Instant::now())
    });
    // Let the hold reach the replicas, as it does in a second on a quiet network.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let failing = Instant::now();
    let lost_at = std::sync::Arc::new(std::sync::OnceLock::new());
    {
        let token = guard.cancellation_token();
        let lost_at = lost_at.clone();
        tokio::spawn(async move {
            token.cancelled().await;
            lost_at.get_or_init(Instant::now);
        });
    }
    // Fresh acquisitions all through: when does the first one that the new master has get
    // through? (Until the old master is turned into a replica, it may still take writes, which
    // the failover then throws away.)
    let (promoted_tx, promoted_rx) = tokio::sync::watch::channel(None::<u16>);
    let prober_client = other.clone();
    let prober = tokio::spawn(async move {
        let mut round = 0u32;
        loop {
            tokio::time::sleep(Duration::from_millis(50)).await;
            round += 1;
            let name = format!("sentinel-fresh-{round}");
            let lock = prober_client.lock(name.as_str());
            let Ok(Some(guard)) = lock
                .try_lock(Duration::from_millis(500), Some(Duration::from_secs(5)))
                .await
            else {
                continue;
            };
            let held_at = Instant::now();
            let new_master = *promoted_rx.borrow();
            if let Some(port) = new_master {
                let raw = common::resilient_client(&format!("redis://127.0.0.1:{port}")).await;
                let fields: Vec<String> = raw.hkeys(&name).await.unwrap_or_default();
                let _ = raw.quit().await;
                if fields == vec![guard.owner_field().to_string()] {
                    return (guard, held_at);
                }
            }
            let _ = guard.unlock().await;
        }
    });
    let new_master = tokio::task::block_in_place(|| fail(&mut setup));
    let promoted = failing.elapsed();
    promoted_tx.send_replace(Some(new_master));
    assert_ne!(new_master, old_master);
    println!("new master {new_master} after {promoted:?}");

    let (fresh, fresh_at) = tokio::time::timeout(Duration::from_secs(20), prober)
        .await
        .expect("a fresh acquisition succeeds after the failover")
        .unwrap();
    let fresh_after = fresh_at.duration_since(failing);
    println!("first fresh acquisition on the new master {fresh_after:?} after the failure");
    assert!(
        fresh_after < promoted + Duration::from_secs(5),
        "new acquisitions succeed within the failover time ({promoted:?}) plus 5 s: \
         {fresh_after:?}"
    );
    fresh.unlock().await.unwrap();

    // Two watchdog leases after the promotion, the hold is either renewed on the new master or
    // reported lost; never neither.
    tokio::time::sleep(watchdog * 2).await;
    let (fields, ttl) = holders(&setup, new_master, name).await;
    let field = guard.owner_field().to_string();
    if guard.is_lost() {
        // The watcher task records the moment; give it its turn.
        tokio::time::sleep(Duration::from_millis(10)).await;
        let lost_after = lost_at.get().map(|at| at.duration_since(failing));
        println!("the holder's guard reported the loss {lost_after:?} after the failure");
        assert!(
            !fields.contains(&field),
            "a lost guard's hold must not be on the new master"
        );
    } else {
        println!("renewals continued on the new master (TTL {ttl} ms)");
        assert_eq!(fields, vec![field], "the hold is on the new master");
        assert!(ttl > 0, "with a TTL: {ttl}");
        assert!(
            !waiter.is_finished(),
            "the waiter must not hold while the holder does"
        );
    }

    let was_lost = guard.is_lost();
    let released = Instant::now();
    let _ = guard.unlock().await;
    let (waited, woke) = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter acquires after the failover")
        .unwrap();
    if was_lost {
        // The replicas had the hold, so nobody could take it before its lease ran out on the
        // new master, and the holder hears of the loss before that.
        let lost = *lost_at.get().expect("the loss was recorded");
        assert!(lost <= woke, "the loss is reported before the waiter holds");
    }
    if woke < released {
        println!(
            "the waiter held {:?} after the failure, when the hold was gone",
            woke.duration_since(failing)
        );
    } else {
        println!(
            "the waiter held {:?} after the holder's unlock",
            woke.duration_since(released)
        );
    }
    let (fields, _) = holders(&setup, new_master, name).await;
    assert_eq!(fields, vec![waited.owner_field().to_string()]);
    waited.unlock().await.unwrap();
    holder.shutdown().await;
    other.shutdown().await;
}

/// `SENTINEL FAILOVER`: the master steps down without failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_survive_a_sentinel_failover() {
    bounded(survive_failover(|setup| setup.failover())).await;
}

/// The master is killed (SIGKILL): the sentinels agree it is down and promote a replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_survive_the_master_being_killed() {
    bounded(survive_failover(|setup| {
        let old = setup.master_port();
        setup.server(old).kill();
        setup.await_new_master(old, Duration::from_secs(30))
    }))
    .await;
}

/// With replica sync through Sentinel, a lock whose acquisition returned is on every replica:
/// the master killed right after it, the promoted replica has it. With one replica left, the
/// two that replica sync asks for cannot confirm a renewal any more, and the holder is told its
/// lock is lost at the renew deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_sync_through_sentinel_keeps_a_confirmed_lock() {
    bounded(async {
        let mut setup = RedisSentinel::start(2);
        let old = setup.master_port();
        let watchdog = Duration::from_secs(6);
        let client = common::builder()
            .url(setup.url())
            .watchdog_lease(watchdog)
            .replica_sync(fredlock::ReplicaSync::replicas(2))
            .build()
            .await
            .unwrap();
        let guard = client.lock("sentinel-synced").lock().await.unwrap();
        // No pause: the acquisition returned only once both replicas had it.
        setup.server(old).kill();
        let new =
            tokio::task::block_in_place(|| setup.await_new_master(old, Duration::from_secs(30)));
        let (fields, _) = holders(&setup, new, "sentinel-synced").await;
        assert_eq!(fields, vec![guard.owner_field().to_string()]);
        println!("the promoted replica {new} has the confirmed lock");
        tokio::time::timeout(watchdog * 2, guard.lost())
            .await
            .expect("unconfirmed renewals lose the lock");
        client.shutdown().await;
    })
    .await;
}

/// Servers and sentinels with passwords of their own: the client authenticates to both (by URL,
/// and by builder), and the watcher of master switches authenticates to the sentinels too, so
/// a `SENTINEL FAILOVER` is followed at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinels_and_servers_with_passwords() {
    bounded(async {
        let setup =
            RedisSentinel::start_with_passwords(2, Some("server-secret"), Some("sentinel-secret"));
        let by_url = client(&setup, Duration::from_secs(6)).await;
        let by_builder = sentinel_builder(&setup)
            .credentials(None, "server-secret")
            .sentinel_credentials(None, "sentinel-secret")
            .build()
            .await
            .unwrap();
        let guard = by_url.lock("sentinel-auth").lock().await.unwrap();
        assert!(by_builder
            .lock("sentinel-auth")
            .try_lock(Duration::ZERO, None)
            .await
            .unwrap()
            .is_none());
        guard.unlock().await.unwrap();

        let failing = Instant::now();
        let new = tokio::task::block_in_place(|| setup.failover());
        // Without the watcher (it needs the sentinels' password), the clients would stay on
        // the old master until the sentinels demote it, about ten seconds later.
        let lock = by_builder.lock("sentinel-auth-after");
        let taken = loop {
            let guard = lock
                .try_lock(Duration::from_millis(200), None)
                .await
                .ok()
                .flatten();
            if let Some(guard) = guard {
                let (fields, _) = holders(&setup, new, "sentinel-auth-after").await;
                if fields == vec![guard.owner_field().to_string()] {
                    break failing.elapsed();
                }
                // Taken on the old master: once the clients follow the new one, the unlock
                // finds no hold there (NotHeld), as in the kill -9 test above.
                let _ = guard.unlock().await;
            }
            assert!(failing.elapsed() < Duration::from_secs(8), "not followed");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        println!("first acquisition on the new master {taken:?} after SENTINEL FAILOVER");
        by_url.shutdown().await;
        by_builder.shutdown().await;
    })
    .await;
}

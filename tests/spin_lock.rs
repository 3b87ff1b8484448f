//! Acceptance tests of the spin lock against real `redis-server` processes: the reentrant lock's
//! guarantees, with waiters that back off and never subscribe.

mod common;

use std::time::Duration;

use common::{bounded, command_calls, eventually, RedisServer};
use fred::prelude::*;
use fredlock::prelude::*;
use fredlock::{Error, DEFAULT_SPIN_MAX_PAUSE, DEFAULT_WATCHDOG_LEASE};
use rand::Rng;
use tokio::time::Instant;

/// Mutual exclusion: 3 clients x 4 tasks x 50 non-atomic increments (read, sleep, write) end at
/// exactly 600; the server never saw a SUBSCRIBE, an SSUBSCRIBE or a PUBLISH on the way.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn spin_lock_excludes_and_never_subscribes() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let mut tasks = Vec::new();
        let mut clients = Vec::new();
        for _ in 0..3 {
            let client = server.lock_client(DEFAULT_WATCHDOG_LEASE).await;
            for _ in 0..4 {
                let lock = client.spin_lock("spin-counter");
                let raw = raw.clone();
                tasks.push(tokio::spawn(async move {
                    for _ in 0..50 {
                        let guard = lock.lock().await.unwrap();
                        let value: Option<i64> = raw.get("counter").await.unwrap();
                        tokio::time::sleep(Duration::from_micros(200)).await;
                        let _: () = raw
                            .set("counter", value.unwrap_or(0) + 1, None, None, false)
                            .await
                            .unwrap();
                        guard.unlock().await.unwrap();
                    }
                }));
            }
            clients.push(client);
        }
        for task in tasks {
            task.await.unwrap();
        }
        let counter: i64 = raw.get("counter").await.unwrap();
        assert_eq!(counter, 600);

        let calls = command_calls(&raw).await;
        for command in [
            "subscribe",
            "ssubscribe",
            "psubscribe",
            "publish",
            "spublish",
        ] {
            assert_eq!(calls.get(command), None, "{command} was sent: {calls:?}");
        }
        assert!(
            calls.get("evalsha").copied().unwrap_or(0) >= 1200,
            "{calls:?}"
        );
        for client in &clients {
            assert_eq!(client.stats().subscriptions, 0);
            assert_eq!(client.stats().wait_entries, 0);
        }
    })
    .await;
}

/// A waiter that has backed off to its longest pause acquires within that pause (plus a margin
/// for the round trips and the scheduler) after the unlock.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiter_acquires_within_the_backoff_cap_after_an_unlock() {
    bounded(async {
        let server = RedisServer::start();
        let holder = server.lock_client(DEFAULT_WATCHDOG_LEASE).await;
        let waiter_client = server.lock_client(DEFAULT_WATCHDOG_LEASE).await;
        let cap = Duration::from_millis(128);
        let margin = Duration::from_millis(100);
        for round in 0..5 {
            let name = format!("spin-wake-{round}");
            let guard = holder.spin_lock(name.as_str()).lock().await.unwrap();
            let lock = waiter_client.spin_lock(name.as_str());
            let waiter = common::time_acquisition(lock);
            // Long enough for the backoff to reach its cap (1 + 2 + .. + 128 ms).
            let held = Duration::from_millis(400 + rand::thread_rng().gen_range(0..128));
            tokio::time::sleep(held).await;
            guard.unlock().await.unwrap();
            let unlocked = Instant::now();
            let acquired = waiter.await.unwrap();
            let latency = acquired.duration_since(unlocked);
            assert!(
                latency <= cap + margin,
                "round {round}: acquired {latency:?} after the unlock"
            );
        }
        assert_eq!(waiter_client.stats().subscriptions, 0);
    })
    .await;
}

/// A shorter backoff is honoured, and bad backoffs are refused before anything is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backoff_is_configurable_and_checked() {
    bounded(async {
        let server = RedisServer::start();
        let client = server.lock_client(DEFAULT_WATCHDOG_LEASE).await;
        for (first, max) in [
            (Duration::ZERO, Duration::from_millis(10)),
            (Duration::from_millis(10), Duration::from_millis(5)),
            (Duration::from_millis(1), Duration::MAX),
        ] {
            let error = client
                .spin_lock("spin-bad")
                .with_backoff(first, max)
                .unwrap_err();
            assert!(matches!(error, Error::InvalidArgument(_)), "{error}");
            assert!(error.to_string().contains("spin-bad"), "{error}");
        }

        let fast = client
            .spin_lock("spin-fast")
            .with_backoff(Duration::from_millis(1), Duration::from_millis(5))
            .unwrap();
        let holder = server.lock_client(DEFAULT_WATCHDOG_LEASE).await;
        let guard = holder.spin_lock("spin-fast").lock().await.unwrap();
        // Attempts counted by the server: pauses capped at 5 ms make dozens in 300 ms, where
        // pauses doubling from 1 ms without a cap make at most 9.
        let raw = server.raw().await;
        let waiter = common::time_acquisition(fast);
        tokio::time::sleep(Duration::from_millis(20)).await;
        let before = command_calls(&raw).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let after = command_calls(&raw).await;
        let attempts = after.get("evalsha").copied().unwrap_or(0)
            - before.get("evalsha").copied().unwrap_or(0);
        assert!(
            attempts >= 15,
            "{attempts} attempts in 300 ms with pauses capped at 5 ms"
        );
        guard.unlock().await.unwrap();
        waiter.await.unwrap();
        // Reentrant, with the reentrant lock's layout.
        let lock = client.spin_lock("spin-fast");
        let outer = lock.lock().await.unwrap();
        let inner = lock.lock().await.unwrap();
        assert_eq!(lock.hold_count().await.unwrap(), 2);
        inner.unlock().await.unwrap();
        outer.unlock().await.unwrap();
        assert!(!lock.is_locked().await.unwrap());
        assert!(!lock.as_lock().is_fair());
    })
    .await;
}

/// Cancelled acquisitions (dropped at random points, inside the acquire round trip too) leave
/// no hold, no key and no subscription behind, and try_lock gives up on time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancelled_spin_acquisitions_leave_nothing() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let holder_client = server.lock_client(DEFAULT_WATCHDOG_LEASE).await;
        let client = server.lock_client(DEFAULT_WATCHDOG_LEASE).await;
        common::cancellation_storm(
            holder_client.spin_lock("spin-cancel").as_lock().clone(),
            client.spin_lock("spin-cancel").as_lock().clone(),
        )
        .await;

        // try_lock gives up after about its wait while another holds it.
        let guard = holder_client.spin_lock("spin-cancel").lock().await.unwrap();
        let started = Instant::now();
        let none = client
            .spin_lock("spin-cancel")
            .try_lock(Duration::from_millis(300), None)
            .await
            .unwrap();
        assert!(none.is_none());
        let waited = started.elapsed();
        // No pause runs past the wait: far less than another of its longest pauses after it.
        assert!(
            waited >= Duration::from_millis(300)
                && waited < Duration::from_millis(300) + DEFAULT_SPIN_MAX_PAUSE * 4,
            "{waited:?}"
        );
        guard.unlock().await.unwrap();

        let clean = eventually(Duration::from_secs(5), || async {
            let exists: u32 = raw.exists("spin-cancel").await.unwrap();
            let stats = client.stats();
            exists == 0 && stats.held == 0 && stats.subscriptions == 0 && stats.unsettled == 0
        })
        .await;
        assert!(clean, "left behind: stats {:?}", client.stats());
    })
    .await;
}

/// An inspection of a spin lock: its holder and kind, and no unlock channel to listen on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spin_lock_inspects_as_its_kind() {
    bounded(async {
        let server = RedisServer::start();
        let client = server.lock_client(DEFAULT_WATCHDOG_LEASE).await;
        let spin = client.spin_lock("spin:inspected");
        let empty = spin.inspect().await.unwrap();
        assert!(!empty.exists() && !empty.is_held());
        let guard = spin.lock().await.unwrap();
        let _again = spin.lock().await.unwrap();
        let seen = spin.inspect().await.unwrap();
        assert_eq!(seen.kind, "spin_lock");
        assert_eq!(seen.listeners, None);
        assert_eq!(seen.holders.len(), 1);
        assert_eq!(seen.holders[0].owner, guard.owner_field());
        assert_eq!(seen.holders[0].count, 2);
        assert_eq!(seen.holders[0].client_id(), Some(client.id()));
        let lease = seen.holders[0].remaining_lease.unwrap();
        assert!(lease > DEFAULT_WATCHDOG_LEASE / 2 && lease <= DEFAULT_WATCHDOG_LEASE);
        // Scanned by name, it has the plain lock's layout.
        let listed = client.list("spin:*").await.unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(
            (listed[0].name.as_str(), listed[0].kind),
            ("spin:inspected", "lock")
        );
        client.shutdown().await;
    })
    .await;
}

//! Acceptance tests of the count-down latch against real `redis-server` processes: prompt
//! release of every waiter, Redisson's layout and interop, inspections.

mod common;

use std::time::Duration;

use common::{bounded, eventually, RedisServer};
use fred::prelude::*;
use fredlock::{Details, Error, DEFAULT_WATCHDOG_LEASE};
use tokio::time::Instant;

/// How soon waiters must be released after the count reaches zero.
const WAKE_LIMIT: Duration = Duration::from_millis(250);

/// 4. Five waiters over two clients are released within 250 ms of the count reaching zero;
///    `try_set_count` on a live latch returns false and leaves its count.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_waiter_is_released_when_the_count_reaches_zero() {
    bounded(async {
        let server = RedisServer::start();
        let first = server.lock_client(DEFAULT_WATCHDOG_LEASE).await;
        let second = server.lock_client(DEFAULT_WATCHDOG_LEASE).await;
        let latch = first.count_down_latch("phase-1");
        assert!(latch.try_set_count(2).await.unwrap());
        assert!(!second
            .count_down_latch("phase-1")
            .try_set_count(7)
            .await
            .unwrap());
        assert_eq!(latch.count().await.unwrap(), 2);
        let mut waiters = Vec::new();
        for i in 0..5 {
            let client = if i % 2 == 0 { &first } else { &second };
            let latch = client.count_down_latch("phase-1");
            waiters.push(tokio::spawn(async move {
                latch.wait().await.unwrap();
                Instant::now()
            }));
        }
        assert!(
            eventually(Duration::from_secs(5), || async {
                first.stats().subscriptions == 1 && second.stats().subscriptions == 1
            })
            .await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(latch.count_down().await.unwrap(), 1);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(waiters.iter().all(|waiter| !waiter.is_finished()));
        let zero = Instant::now();
        assert_eq!(
            second
                .count_down_latch("phase-1")
                .count_down()
                .await
                .unwrap(),
            0
        );
        for waiter in waiters {
            let released = waiter.await.unwrap();
            assert!(
                released - zero <= WAKE_LIMIT,
                "released {:?} after zero",
                released - zero
            );
        }
        assert_eq!(latch.count().await.unwrap(), 0);
        // Done, it can be set again.
        assert!(latch.try_set_count(1).await.unwrap());
    })
    .await;
}

/// 4. `wait` on a missing latch returns at once; `try_wait` says false while it counts and
///    true once it is done; `delete` releases waiters as zero does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_on_missing_and_deleted_latches() {
    bounded(async {
        let server = RedisServer::start();
        let client = server.lock_client(DEFAULT_WATCHDOG_LEASE).await;
        let latch = client.count_down_latch("missing");
        let started = Instant::now();
        latch.wait().await.unwrap();
        assert!(latch.try_wait(Duration::ZERO).await.unwrap());
        // At once: a waiter would sleep up to a third of the watchdog lease (10 s) between looks.
        assert!(started.elapsed() < DEFAULT_WATCHDOG_LEASE / 30);
        assert_eq!(client.stats().subscriptions, 0, "no subscription needed");

        latch.try_set_count(3).await.unwrap();
        let started = Instant::now();
        assert!(!latch.try_wait(Duration::from_millis(200)).await.unwrap());
        assert!(started.elapsed() >= Duration::from_millis(200));
        let waiter = latch.clone();
        let waiting = tokio::spawn(async move { waiter.try_wait(Duration::from_secs(10)).await });
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(latch.delete().await.unwrap());
        let done = tokio::time::timeout(WAKE_LIMIT, waiting)
            .await
            .expect("released by the delete")
            .unwrap()
            .unwrap();
        assert!(done);
        assert!(!latch.delete().await.unwrap());
        assert_eq!(
            latch.count_down().await.unwrap(),
            0,
            "nothing to count down"
        );
    })
    .await;
}

/// Bad input is refused before anything is sent; a key of another type is reported unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_changes_nothing() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = server.lock_client(DEFAULT_WATCHDOG_LEASE).await;
        assert!(matches!(
            client.count_down_latch("zero").try_set_count(0).await,
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            client
                .count_down_latch("huge")
                .try_set_count(u64::MAX)
                .await,
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            client.count_down_latch("{tagged}").wait().await,
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            client.count_down_latch("").count().await,
            Err(Error::InvalidArgument(_))
        ));
        let _: () = raw.set("text", "words", None, None, false).await.unwrap();
        let latch = client.count_down_latch("text");
        for outcome in [
            latch.count_down().await.map(drop),
            latch.count().await.map(drop),
            latch.try_wait(Duration::from_millis(50)).await.map(drop),
            latch.delete().await.map(drop),
        ] {
            assert!(
                matches!(outcome, Err(Error::WrongType { .. })),
                "{outcome:?}"
            );
        }
        let value: String = raw.get("text").await.unwrap();
        assert_eq!(value, "words");
        let keys = common::all_keys(&raw).await;
        assert_eq!(keys, vec!["text".to_owned()]);
    })
    .await;
}

/// 6. The layout is Redisson's: an integer string at the name, `1` published on a new count and
///    `0` when it reaches zero, on `redisson_countdownlatch__channel__{name}`; the key is gone at
///    zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wire_layout_matches_redisson() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = server.lock_client(DEFAULT_WATCHDOG_LEASE).await;
        let (_subscriber, mut messages) =
            common::listen(&server.url(), "redisson_countdownlatch__channel__{layout}").await;
        let latch = client.count_down_latch("layout");
        latch.try_set_count(2).await.unwrap();
        let kind: String = raw.r#type("layout").await.unwrap();
        assert_eq!(kind, "string");
        let value: String = raw.get("layout").await.unwrap();
        assert_eq!(value, "2");
        latch.count_down().await.unwrap();
        latch.count_down().await.unwrap();
        let exists: i64 = raw.exists("layout").await.unwrap();
        assert_eq!(exists, 0);
        // Counting down a latch at zero changes nothing and tells nobody: as Redisson's, only
        // reaching zero publishes `0`. The next message is the new count's.
        assert_eq!(latch.count_down().await.unwrap(), 0);
        let exists: i64 = raw.exists("layout").await.unwrap();
        assert_eq!(exists, 0);
        latch.try_set_count(1).await.unwrap();
        let published = common::heard(&mut messages, 3).await;
        assert_eq!(published, vec!["1", "0", "1"]);
    })
    .await;
}

/// 6. A Java client, replayed with the commands Redisson's scripts run: its count-down to zero
///    (DECR, DEL, publish `0`) releases fredlock's waiters, and its waiters hear fredlock's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interoperates_with_redisson_replay() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = server.lock_client(DEFAULT_WATCHDOG_LEASE).await;
        // Redisson's trySetCount(1).
        let _: () = raw.set("java", 1, None, None, false).await.unwrap();
        let _: i64 = raw
            .publish("redisson_countdownlatch__channel__{java}", 1)
            .await
            .unwrap();
        let latch = client.count_down_latch("java");
        assert_eq!(latch.count().await.unwrap(), 1);
        let waiter = latch.clone();
        let waiting = tokio::spawn(async move {
            waiter.wait().await.unwrap();
            Instant::now()
        });
        assert!(
            eventually(Duration::from_secs(5), || async {
                client.stats().subscriptions == 1
            })
            .await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        // Redisson's countDown: DECR, at zero DEL and publish 0.
        let zero = Instant::now();
        let left: i64 = raw.decr("java").await.unwrap();
        assert_eq!(left, 0);
        let _: i64 = raw.del("java").await.unwrap();
        let _: i64 = raw
            .publish("redisson_countdownlatch__channel__{java}", 0)
            .await
            .unwrap();
        let released = waiting.await.unwrap();
        assert!(released - zero <= WAKE_LIMIT);

        // A Java waiter listens: fredlock's count-down to zero tells it.
        let (_subscriber, mut messages) =
            common::listen(&server.url(), "redisson_countdownlatch__channel__{java}").await;
        latch.try_set_count(1).await.unwrap();
        latch.count_down().await.unwrap();
        let published = common::heard(&mut messages, 2).await;
        assert_eq!(published, vec!["1", "0"]);
    })
    .await;
}

/// 8. Inspections show the latch's count; by name it is a `counter` (Redisson's latch and
///    semaphore are the same integer string); its count lasting is no leak.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspections_show_the_count() {
    bounded(async {
        let server = RedisServer::start();
        let client = server.lock_client(DEFAULT_WATCHDOG_LEASE).await;
        let latch = client.count_down_latch("seen");
        latch.try_set_count(4).await.unwrap();
        latch.count_down().await.unwrap();
        let seen = latch.inspect().await.unwrap();
        assert_eq!(seen.kind, "count_down_latch");
        assert_eq!(seen.details, Details::Latch { count: Some(3) });
        assert_eq!(seen.keys.len(), 1);
        assert_eq!(seen.keys[0].ttl, None);
        assert!(seen.holders.is_empty());
        assert_eq!(seen.listeners, Some(0), "nobody waits");
        let by_name = client.inspect("seen").await.unwrap().expect("found");
        assert_eq!(by_name.kind, "counter");
        assert_eq!(by_name.details, Details::Counter { value: Some(3) });
        assert!(client.leaks("*", Duration::ZERO).await.unwrap().is_empty());
        // A latch never set is at zero: its inspection shows no key, not a wrong type.
        let unset = client
            .count_down_latch("never-set")
            .inspect()
            .await
            .unwrap();
        assert!(unset.keys.is_empty(), "{unset:?}");
    })
    .await;
}

/// A waiter on a latch that stays above zero looks once, then sleeps until the zero message
/// (or a watchdog period, its safety net): it does not look again and again. Its looks are
/// read-only scripts, counted by the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_looks_once_and_sleeps_until_told() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = server.lock_client(DEFAULT_WATCHDOG_LEASE).await;
        let latch = client.count_down_latch("slow");
        latch.try_set_count(1).await.unwrap();
        let before = common::command_calls(&raw).await;
        assert!(!latch.try_wait(Duration::from_millis(500)).await.unwrap());
        let looks: u64 = common::scripts_since(&raw, &before).await;
        // A look, the subscription's, a script sent again in full the first time (NOSCRIPT):
        // a few; a waiter that looked again at once would run hundreds.
        assert!(
            (1..=5).contains(&looks),
            "{looks} looks in 500 ms: {:?}",
            common::commands_since(&raw, &before).await
        );
    })
    .await;
}

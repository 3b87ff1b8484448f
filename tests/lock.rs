//! Acceptance tests of the reentrant lock against real `redis-server` processes.

mod common;

use std::time::Duration;

use common::{bounded, eventually, Kind, RedisServer};
use fred::prelude::*;
use fredlock::{Error, LockClient, OwnerId};
use rand::Rng;
use tokio::time::Instant;

const DEFAULT_WATCHDOG: Duration = fredlock::DEFAULT_WATCHDOG_LEASE;

/// Clients, locks and guards cross tasks: a guard may be unlocked on another task.
const _: () = {
    const fn shareable<T: Send + Sync + 'static>() {}
    shareable::<LockClient>();
    shareable::<fredlock::Lock>();
    shareable::<fredlock::LockGuard>();
    shareable::<Error>();
};

// Every test in this list runs once per lock kind: the fair lock shares the reentrant lock's
// behaviour (issue 4, point 5).
for_each_kind!(
    mutual_exclusion_of_read_sleep_write,
    reentrant_hold_count_and_foreign_unlock,
    stale_guard_cannot_release_another_owners_lock,
    watchdog_keeps_lock_and_stops_after_unlock,
    fixed_lease_expires,
    a_fixed_lease_counts_as_lost_early_by_its_drift_allowance,
    waiter_wakes_promptly_on_unlock,
    missed_message_costs_at_most_the_ttl,
    try_lock_waits_about_wait,
    lost_lock_is_reported,
    a_released_guards_token_is_never_cancelled,
    cancelled_acquisitions_leave_nothing,
    dropped_and_moved_guards_release,
    waiter_survives_redis_restart,
    one_owners_concurrent_calls_each_count,
    a_dropped_guards_release_never_takes_the_next_hold,
    a_waiter_on_a_subscribed_channel_waits_after_one_attempt,
    unlock_racing_a_waiter_on_a_subscribed_channel_is_not_missed,
    waiters_end_with_their_clients_shutdown,
    a_force_unlock_tells_the_holder_at_once,
    quick_forms_take_at_once_or_run_within_a_wait,
);

/// 1. Mutual exclusion: 3 clients x 8 tasks x 50 non-atomic increments end at exactly 1200.
async fn mutual_exclusion_of_read_sleep_write(kind: Kind) {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let client = server.lock_client(DEFAULT_WATCHDOG).await;
        for _ in 0..8 {
            let lock = kind.lock(&client, "counter-lock");
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
    }
    for task in tasks {
        task.await.unwrap();
    }
    let total: i64 = raw.get("counter").await.unwrap();
    assert_eq!(total, 1200);
}

/// 2. Reentrancy: the hash's count follows the nesting depth; the key goes with the last unlock;
///    nobody but the owner can release it.
async fn reentrant_hold_count_and_foreign_unlock(kind: Kind) {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = server.lock_client(DEFAULT_WATCHDOG).await;
    let lock = kind.lock(&client, "reentrant");
    let field = kind.field(&client, OwnerId::current());

    let mut guards = Vec::new();
    for depth in 1..=3u32 {
        guards.push(lock.lock().await.unwrap());
        let count: u32 = raw.hget("reentrant", &field).await.unwrap();
        assert_eq!(count, depth);
        assert_eq!(lock.hold_count().await.unwrap(), depth);
    }
    assert!(lock.is_held_by_current_task().await.unwrap());

    // Another owner (another task) holds nothing and cannot take it meanwhile.
    let other = lock.clone();
    let seen = tokio::spawn(async move {
        let none = other.try_lock(Duration::ZERO, None).await.unwrap();
        (none.is_none(), other.hold_count().await.unwrap())
    })
    .await
    .unwrap();
    assert_eq!(seen, (true, 0));

    // The release script run for another owner's field is refused and changes nothing.
    let foreign = kind.field(&client, OwnerId::unique());
    let reply = kind.raw_release(&raw, "reentrant", &foreign).await;
    assert_eq!(reply, None);
    let count: u32 = raw.hget("reentrant", &field).await.unwrap();
    assert_eq!(count, 3);

    for depth in (0..3u32).rev() {
        guards.pop().unwrap().unlock().await.unwrap();
        let exists: bool = raw.exists("reentrant").await.unwrap();
        assert_eq!(exists, depth > 0);
        if depth > 0 {
            let count: u32 = raw.hget("reentrant", &field).await.unwrap();
            assert_eq!(count, depth);
        }
    }
}

/// 2b. A stale guard (its lock lost and since taken by another owner) cannot release the new
///     owner's lock.
async fn stale_guard_cannot_release_another_owners_lock(kind: Kind) {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let holder = server.lock_client(Duration::from_millis(900)).await;
    let other = server.lock_client(DEFAULT_WATCHDOG).await;
    let stale = kind.lock(&holder, "stale").lock().await.unwrap();
    let _: i64 = raw.del("stale").await.unwrap();
    let fresh = kind.lock(&other, "stale").lock().await.unwrap();
    tokio::time::timeout(Duration::from_secs(2), stale.lost())
        .await
        .unwrap();
    assert!(matches!(stale.unlock().await, Err(Error::NotHeld { .. })));
    assert!(kind.lock(&other, "stale").is_locked().await.unwrap());
    assert!(!fresh.is_lost());
    fresh.unlock().await.unwrap();
}

/// 3. Watchdog: a 1 s watchdog keeps a lock for 5 s; no renewal brings it back after unlock.
async fn watchdog_keeps_lock_and_stops_after_unlock(kind: Kind) {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let holder = server.lock_client(Duration::from_secs(1)).await;
    let other = server.lock_client(Duration::from_secs(1)).await;
    let guard = kind.lock(&holder, "watched").lock().await.unwrap();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(5) {
        let attempt = kind
            .lock(&other, "watched")
            .try_lock(Duration::ZERO, None)
            .await
            .unwrap();
        assert!(attempt.is_none(), "lock taken while its holder lived");
        let ttl: i64 = raw.pttl("watched").await.unwrap();
        assert!(ttl > 0 && ttl <= 1000, "ttl {ttl}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(!guard.is_lost());
    guard.unlock().await.unwrap();
    for _ in 0..10 {
        let exists: bool = raw.exists("watched").await.unwrap();
        assert!(!exists, "a renewal re-created the released lock");
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
}

/// 4. A fixed lease ends by itself; another client then acquires.
async fn fixed_lease_expires(kind: Kind) {
    let server = RedisServer::start();
    let holder = server.lock_client(DEFAULT_WATCHDOG).await;
    let other = server.lock_client(DEFAULT_WATCHDOG).await;
    let guard = kind
        .lock(&holder, "leased")
        .lock_with_lease(Duration::from_millis(300))
        .await
        .unwrap();
    assert_eq!(guard.lease(), Some(Duration::from_millis(300)));
    let started = Instant::now();
    let taken = kind
        .lock(&other, "leased")
        .try_lock(Duration::from_secs(3), None)
        .await
        .unwrap()
        .expect("acquired after the lease ended");
    let waited = started.elapsed();
    assert!(waited < Duration::from_millis(1000), "waited {waited:?}");
    assert!(guard.is_lost(), "the holder learns that its lease ended");
    assert!(matches!(guard.unlock().await, Err(Error::NotHeld { .. })));
    assert!(!taken.is_lost());
    taken.unlock().await.unwrap();
}

/// A fixed lease counts as lost 2 ms and 1 % of it (22 ms of 2 s) before its estimated end,
/// so that its holder learns of the end before Redis can give the lock to another; and not
/// before that. `is_lost` reads the clock itself, so no timer's lateness enters the check.
async fn a_fixed_lease_counts_as_lost_early_by_its_drift_allowance(kind: Kind) {
    let server = RedisServer::start();
    let client = server.lock_client(DEFAULT_WATCHDOG).await;
    let lease = Duration::from_secs(2);
    let before = Instant::now();
    let guard = kind
        .lock(&client, "drift")
        .lock_with_lease(lease)
        .await
        .unwrap();
    let after = Instant::now();
    // The estimate counts from when the acquire was sent, between `before` and `after`.
    tokio::time::sleep_until(before + lease - Duration::from_millis(40)).await;
    let lost = guard.is_lost();
    if Instant::now() < before + lease - Duration::from_millis(22) {
        assert!(!lost, "lost before the early margin");
    }
    tokio::time::sleep_until(after + lease - Duration::from_millis(21)).await;
    assert!(guard.is_lost(), "not lost 21 ms before the lease's end");
    guard.unlock().await.ok();
}

/// 5. A waiter is woken by the unlock message, not by the 30 s TTL.
async fn waiter_wakes_promptly_on_unlock(kind: Kind) {
    let server = RedisServer::start();
    let holder = server.lock_client(DEFAULT_WATCHDOG).await;
    let waiter_client = server.lock_client(DEFAULT_WATCHDOG).await;
    let guard = kind.lock(&holder, "prompt").lock().await.unwrap();
    let lock = kind.lock(&waiter_client, "prompt");
    let waiter = common::time_acquisition(lock);
    if kind.listens() {
        assert!(
            eventually(Duration::from_secs(5), || async {
                waiter_client.stats().subscriptions == 1
            })
            .await
        );
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    if !kind.listens() {
        // A spin waiter is woken by its own next attempt, its pauses capped at 128 ms.
        assert_eq!(
            waiter_client.stats().subscriptions,
            0,
            "a spin waiter subscribed"
        );
    }
    guard.unlock().await.unwrap();
    let unlocked = Instant::now();
    let acquired = waiter.await.unwrap();
    let latency = acquired.duration_since(unlocked);
    assert!(
        latency <= Duration::from_millis(250),
        "woke after {latency:?}"
    );
}

/// 6. A missed message (plain DEL, nothing published) costs at most the lock's remaining TTL.
async fn missed_message_costs_at_most_the_ttl(kind: Kind) {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let holder = server.lock_client(Duration::from_secs(2)).await;
    let waiter_client = server.lock_client(DEFAULT_WATCHDOG).await;
    let _guard = kind.lock(&holder, "missed").lock().await.unwrap();
    let lock = kind.lock(&waiter_client, "missed");
    let waiter = common::time_acquisition(lock);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let ttl: i64 = raw.pttl("missed").await.unwrap();
    let _: i64 = raw.del("missed").await.unwrap();
    let deleted = Instant::now();
    let acquired = waiter.await.unwrap();
    let waited = acquired.duration_since(deleted);
    let bound = Duration::from_millis(ttl as u64 + 300);
    assert!(
        waited <= bound,
        "waited {waited:?}, remaining ttl was {ttl} ms"
    );
}

/// 7. try_lock gives up after about `wait` when held, and succeeds at once when free.
async fn try_lock_waits_about_wait(kind: Kind) {
    let server = RedisServer::start();
    let holder = server.lock_client(DEFAULT_WATCHDOG).await;
    let other = server.lock_client(DEFAULT_WATCHDOG).await;
    let free = Instant::now();
    let guard = kind
        .lock(&holder, "try")
        .try_lock(Duration::from_secs(2), None)
        .await
        .unwrap()
        .expect("free lock");
    assert!(free.elapsed() < Duration::from_millis(200));

    let started = Instant::now();
    let none = kind
        .lock(&other, "try")
        .try_lock(Duration::from_millis(500), None)
        .await
        .unwrap();
    let waited = started.elapsed();
    assert!(none.is_none());
    assert!(
        waited >= Duration::from_millis(500),
        "gave up after {waited:?}"
    );
    assert!(
        waited < Duration::from_millis(900),
        "gave up after {waited:?}"
    );
    assert_eq!(other.stats().wait_entries, 0);
    guard.unlock().await.unwrap();
}

/// 8. A lock deleted behind its holder's back is reported lost within a watchdog period.
async fn lost_lock_is_reported(kind: Kind) {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let watchdog = Duration::from_millis(1500);
    let holder = server.lock_client(watchdog).await;
    let guard = kind.lock(&holder, "lost").lock().await.unwrap();
    let token = guard.cancellation_token();
    let _: i64 = raw.del("lost").await.unwrap();
    let deleted = Instant::now();
    tokio::time::timeout(watchdog / 3 + Duration::from_millis(500), guard.lost())
        .await
        .expect("lost() completes");
    assert!(deleted.elapsed() <= watchdog / 3 + Duration::from_millis(500));
    assert!(guard.is_lost());
    assert!(token.is_cancelled());
    assert!(matches!(guard.unlock().await, Err(Error::NotHeld { .. })));
}

/// A token handed out by a guard is cancelled when the lock is lost, never because it was given
/// back: not at the release, nor when the released fixed lease would have ended.
async fn a_released_guards_token_is_never_cancelled(kind: Kind) {
    let server = RedisServer::start();
    let client = server.lock_client(Duration::from_secs(30)).await;
    let lock = kind.lock(&client, "released-token");
    let lease = Duration::from_millis(300);
    let fixed = lock.lock_with_lease(lease).await.unwrap();
    let token = fixed.cancellation_token();
    fixed.unlock().await.unwrap();
    let renewed = lock.lock().await.unwrap();
    let renewed_token = renewed.cancellation_token();
    drop(renewed);
    tokio::time::sleep(lease * 2).await;
    assert!(!token.is_cancelled(), "cancelled after its release");
    assert!(!renewed_token.is_cancelled(), "cancelled after its drop");
}

/// Helper process for `crashed_holder_frees_lock`: takes the lock and waits to be killed.
#[tokio::test]
#[ignore = "run by crashed_holder_frees_lock as a child process"]
async fn crash_child_holds_lock() {
    let Ok(url) = std::env::var("FREDLOCK_CRASH_URL") else {
        return;
    };
    let client = common::builder()
        .url(url)
        .watchdog_lease(Duration::from_secs(2))
        .build()
        .await
        .unwrap();
    let _guard = client.lock("crash").lock().await.unwrap();
    tokio::time::sleep(Duration::from_secs(60)).await;
}

/// 9. A holder killed with SIGKILL frees its lock within the watchdog lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashed_holder_frees_lock() {
    bounded(async {
        let server = RedisServer::start();
        let child = common::spawn_test_child(
            "crash_child_holds_lock",
            &[("FREDLOCK_CRASH_URL", server.url())],
        );
        let client = server.lock_client(DEFAULT_WATCHDOG).await;
        let taken = eventually(Duration::from_secs(20), || async {
            client.lock("crash").is_locked().await.unwrap()
        })
        .await;
        assert!(taken, "child did not take the lock");
        common::sigkill(child);
        let killed = Instant::now();
        let guard = client
            .lock("crash")
            .try_lock(Duration::from_secs(5), None)
            .await
            .unwrap()
            .expect("the crashed holder's lock frees itself");
        assert!(killed.elapsed() <= Duration::from_secs(2) + Duration::from_millis(500));
        guard.unlock().await.unwrap();
    })
    .await;
}

/// 10. 200 lock() futures cancelled at random points leave no hold, entry or subscription (and,
///     for a fair lock, no queue place).
async fn cancelled_acquisitions_leave_nothing(kind: Kind) {
    let server = RedisServer::start();
    let raw = server.raw().await;
    // Waiter places far longer than the test: a queue place left behind cannot expire meanwhile.
    let holder_client = server.fair_client(Duration::from_secs(120)).await;
    let client = server.fair_client(Duration::from_secs(120)).await;
    common::cancellation_storm(
        kind.lock(&holder_client, "cancel"),
        kind.lock(&client, "cancel"),
    )
    .await;
    let clean = eventually(Duration::from_secs(5), || async {
        let exists: u32 = raw
            .exists(vec![
                "cancel".to_string(),
                common::queue_key("cancel"),
                common::timeout_key("cancel"),
            ])
            .await
            .unwrap();
        let exists = exists > 0;
        let channels: Vec<String> = common::pubsub_channels(&raw).await;
        let stats = client.stats();
        !exists && channels.is_empty() && stats.wait_entries == 0 && stats.held == 0
    })
    .await;
    let fields: std::collections::HashMap<String, i64> = raw.hgetall("cancel").await.unwrap();
    assert!(
        clean,
        "left behind: fields {fields:?}, stats {:?}",
        client.stats()
    );
}

/// 11. Dropping a guard releases the lock; a guard moved to another task unlocks there.
async fn dropped_and_moved_guards_release(kind: Kind) {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = server.lock_client(DEFAULT_WATCHDOG).await;
    let other = server.lock_client(DEFAULT_WATCHDOG).await;

    let guard = kind.lock(&client, "dropped").lock().await.unwrap();
    drop(guard);
    let started = Instant::now();
    let taken = kind
        .lock(&other, "dropped")
        .try_lock(Duration::from_secs(2), None)
        .await
        .unwrap()
        .expect("the dropped guard released the lock");
    assert!(started.elapsed() < Duration::from_millis(250));
    taken.unlock().await.unwrap();

    let guard = kind.lock(&client, "moved").lock().await.unwrap();
    tokio::spawn(async move { guard.unlock().await })
        .await
        .unwrap()
        .unwrap();
    let exists: bool = raw.exists("moved").await.unwrap();
    assert!(!exists);
}

/// 12. Redisson's layout: a hash with field `<client uuid>:<digits>`, and `0` published on
///     `redisson_lock__channel:{name}` once, on the final unlock only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wire_layout_matches_redisson() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let (_subscriber, mut messages) =
            common::listen(&server.url(), "redisson_lock__channel:{layout}").await;

        let client = server.lock_client(DEFAULT_WATCHDOG).await;
        let lock = client.lock("layout");
        let outer = lock.lock().await.unwrap();
        let inner = lock.lock().await.unwrap();

        let kind: String = raw.r#type("layout").await.unwrap();
        assert_eq!(kind, "hash");
        let fields: std::collections::HashMap<String, i64> = raw.hgetall("layout").await.unwrap();
        assert_eq!(fields.len(), 1);
        let (field, count) = fields.into_iter().next().unwrap();
        assert_eq!(count, 2);
        let (uuid, owner) = field.rsplit_once(':').unwrap();
        assert_eq!(uuid, client.id().hyphenated().to_string());
        // A task's id is a number, as Redisson's thread id; this test body runs outside any
        // task (in `block_on`), where the id is `t<n>`.
        let number = owner.strip_prefix('t').unwrap_or(owner);
        assert!(
            !number.is_empty() && number.bytes().all(|b| b.is_ascii_digit()),
            "{owner}"
        );

        inner.unlock().await.unwrap();
        outer.unlock().await.unwrap();
        let seen = common::heard(&mut messages, 1).await;
        assert_eq!(seen, vec!["0".to_string()]);
    })
    .await;
}

/// README, "Redisson compatibility": every lock of the hash family keeps Redisson's keys and
/// messages byte for byte. The reentrant, fenced, spin and non-reentrant locks: a hash at the
/// name with one field `<client uuid>:<digits>` holding the hold count (two after a reentry, one
/// for the non-reentrant lock), whose TTL is the watchdog's lease; after the last unlock the key
/// is gone and `0` was published once on `redisson_lock__channel:{name}` (the spin lock, whose
/// waiters back off as Redisson's `RedissonSpinLock`'s do, publishes nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_lock_of_the_hash_family_keeps_redissons_keys_and_messages() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = server.lock_client(DEFAULT_WATCHDOG).await;
        macro_rules! case {
            ($handle:ident, $name:literal, holds: $holds:literal, publishes: $publishes:literal) => {{
                let channel = concat!("redisson_lock__channel:{", $name, "}");
                let (_subscriber, mut messages) = common::listen(&server.url(), channel).await;
                let lock = client.$handle($name);
                let outer = lock.lock().await.unwrap();
                let inner = if $holds == 2 {
                    Some(lock.lock().await.unwrap())
                } else {
                    None
                };
                let kind: String = raw.r#type($name).await.unwrap();
                assert_eq!(kind, "hash", "{}", $name);
                let fields: std::collections::HashMap<String, i64> =
                    raw.hgetall($name).await.unwrap();
                let field = format!("{}:", client.id().hyphenated());
                assert_eq!(fields.len(), 1, "{}: {fields:?}", $name);
                let (owner, count) = fields.into_iter().next().unwrap();
                let id = owner.strip_prefix(&field).unwrap_or_else(|| panic!("{owner}"));
                let digits = id.strip_prefix('t').unwrap_or(id);
                assert!(
                    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()),
                    "{}: {owner}",
                    $name
                );
                assert_eq!(count, $holds, "{}", $name);
                let pttl: i64 = raw.pttl($name).await.unwrap();
                assert!(
                    pttl > 0 && pttl <= DEFAULT_WATCHDOG.as_millis() as i64,
                    "{}: {pttl}",
                    $name
                );
                if let Some(inner) = inner {
                    inner.unlock().await.unwrap();
                }
                outer.unlock().await.unwrap();
                let exists: bool = raw.exists($name).await.unwrap();
                assert!(!exists, "{}", $name);
                if $publishes {
                    assert_eq!(common::heard(&mut messages, 1).await, ["0"], "{}", $name);
                } else {
                    let heard =
                        tokio::time::timeout(Duration::from_millis(500), messages.recv()).await;
                    assert!(heard.is_err(), "{}: {heard:?}", $name);
                }
            }};
        }
        case!(lock, "hash-lock", holds: 2, publishes: true);
        case!(fenced_lock, "hash-fenced", holds: 2, publishes: true);
        case!(spin_lock, "hash-spin", holds: 2, publishes: false);
        case!(non_reentrant_lock, "hash-once", holds: 1, publishes: true);
    })
    .await;
}

/// A hold written the way Redisson writes it excludes fredlock, and Redisson's unlock message
/// wakes fredlock's waiter; fredlock's hold fails Redisson's acquire condition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interoperates_with_redisson_layout() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = server.lock_client(DEFAULT_WATCHDOG).await;
        let java_field = "6a2c1e5e-4b8f-4f0e-9a8e-3d2b1c0f9e8d:57";
        let _: () = raw.hset("shared", (java_field, 1)).await.unwrap();
        let _: bool = raw.pexpire("shared", 30_000, None).await.unwrap();

        assert!(client
            .lock("shared")
            .try_lock(Duration::ZERO, None)
            .await
            .unwrap()
            .is_none());
        let lock = client.lock("shared");
        let waiter = tokio::spawn(async move {
            let guard = lock.lock().await.unwrap();
            (Instant::now(), guard)
        });
        assert!(
            eventually(Duration::from_secs(5), || async {
                client.stats().subscriptions == 1
            })
            .await
        );
        // Redisson's unlock: delete, publish 0 on the channel.
        let _: i64 = raw.del("shared").await.unwrap();
        let _: i64 = raw
            .publish("redisson_lock__channel:{shared}", 0)
            .await
            .unwrap();
        let released = Instant::now();
        let (acquired, guard) = waiter.await.unwrap();
        assert!(acquired.duration_since(released) < Duration::from_millis(250));

        // Redisson's acquire condition (key absent, or own field present) is false now.
        let exists: bool = raw.exists("shared").await.unwrap();
        let java_holds: bool = raw.hexists("shared", java_field).await.unwrap();
        assert!(exists && !java_holds);
        guard.unlock().await.unwrap();
    })
    .await;
}

/// 13. After 1000 contended acquisitions over 50 names nothing stays subscribed or waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn subscriptions_do_not_leak() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let clients = [
            server.lock_client(DEFAULT_WATCHDOG).await,
            server.lock_client(DEFAULT_WATCHDOG).await,
        ];
        let mut tasks = Vec::new();
        for client in &clients {
            for _ in 0..10 {
                let client = client.clone();
                tasks.push(tokio::spawn(async move {
                    for _ in 0..50 {
                        let name = format!("hygiene:{}", rand::thread_rng().gen_range(0..50));
                        let guard = client.lock(name).lock().await.unwrap();
                        tokio::time::sleep(Duration::from_micros(300)).await;
                        guard.unlock().await.unwrap();
                    }
                }));
            }
        }
        for task in tasks {
            task.await.unwrap();
        }
        let clean = eventually(Duration::from_secs(5), || async {
            let channels: Vec<String> = common::pubsub_channels(&raw).await;
            channels.is_empty()
                && clients
                    .iter()
                    .all(|c| c.stats().wait_entries == 0 && c.stats().subscriptions == 0)
        })
        .await;
        assert!(
            clean,
            "{:?}",
            clients.iter().map(|c| c.stats()).collect::<Vec<_>>()
        );
    })
    .await;
}

/// 14. Redis killed and restarted on the same port while a task waits: the waiter acquires.
async fn waiter_survives_redis_restart(kind: Kind) {
    let mut server = RedisServer::start();
    let holder = server.lock_client(Duration::from_secs(3)).await;
    let waiter_client = server.lock_client(Duration::from_secs(3)).await;
    let guard = kind.lock(&holder, "restart").lock().await.unwrap();
    let lock = kind.lock(&waiter_client, "restart");
    let waiter = tokio::spawn(async move { lock.lock().await });
    tokio::time::sleep(Duration::from_millis(300)).await;

    server.kill();
    tokio::time::sleep(Duration::from_millis(700)).await;
    // While Redis is down, a single attempt reports the outage.
    let down = kind
        .lock(&waiter_client, "other")
        .try_lock(Duration::ZERO, None)
        .await;
    assert!(matches!(down, Err(Error::Unavailable { .. })), "{down:?}");
    server.start_again();

    let acquired = tokio::time::timeout(Duration::from_secs(15), waiter)
        .await
        .expect("waiter acquires after the restart")
        .unwrap()
        .expect("lock() succeeds");
    // The restarted server lost the holder's lock; its watchdog says so.
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("holder learns of the loss");
    acquired.unlock().await.unwrap();
}

/// 15. Bad input is refused before Redis is touched; a key of another type is left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_rejected() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = server.lock_client(DEFAULT_WATCHDOG).await;

        let empty = client.lock("");
        assert!(matches!(empty.lock().await, Err(Error::InvalidArgument(_))));
        assert!(matches!(
            empty.try_lock(Duration::ZERO, None).await,
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(empty.is_locked().await, Err(Error::InvalidArgument(_))));
        let lock = client.lock("fine");
        assert!(matches!(
            lock.lock_with_lease(Duration::ZERO).await,
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            lock.try_lock(Duration::ZERO, Some(Duration::ZERO)).await,
            Err(Error::InvalidArgument(_))
        ));
        let zero_watchdog = common::builder()
            .url(server.url())
            .watchdog_lease(Duration::ZERO)
            .build()
            .await;
        assert!(matches!(zero_watchdog, Err(Error::InvalidArgument(_))));
        assert!(matches!(
            common::connect("not a url").await,
            Err(Error::InvalidArgument(_))
        ));

        let _: () = raw
            .set("a-string", "payload", None, None, false)
            .await
            .unwrap();
        let string = client.lock("a-string");
        let wrong = |r: &Result<_, Error>| matches!(r, Err(Error::WrongType { lock, key }) if lock == "a-string" && key == "a-string");
        assert!(wrong(&string.lock().await.map(|_| ())));
        assert!(wrong(&string.try_lock(Duration::from_millis(200), None).await.map(|_| ())));
        assert!(wrong(&string.lock_with_lease(Duration::from_secs(1)).await.map(|_| ())));
        assert!(wrong(&string.hold_count().await.map(|_| ())));
        assert!(wrong(&string.force_unlock().await.map(|_| ())));
        let value: String = raw.get("a-string").await.unwrap();
        let ttl: i64 = raw.pttl("a-string").await.unwrap();
        assert_eq!((value.as_str(), ttl), ("payload", -1));
        assert_eq!(client.stats().wait_entries, 0);
    })
    .await;
}

/// Query methods, force_unlock, and shutdown behave as documented.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_force_unlock_and_shutdown() {
    bounded(async {
        let server = RedisServer::start();
        let client = server.lock_client(DEFAULT_WATCHDOG).await;
        let other = server.lock_client(DEFAULT_WATCHDOG).await;
        let lock = client.lock("queries");
        assert!(!lock.is_locked().await.unwrap());
        assert_eq!(lock.remaining_lease().await.unwrap(), None);
        assert!(!lock.force_unlock().await.unwrap());

        let guard = lock.lock().await.unwrap();
        assert!(lock.is_locked().await.unwrap());
        let ttl = lock.remaining_lease().await.unwrap().unwrap();
        assert!(ttl > Duration::from_secs(25) && ttl <= DEFAULT_WATCHDOG);

        // A waiter elsewhere is woken by force_unlock.
        let waiting = other.lock("queries");
        let waiter = tokio::spawn(async move { waiting.lock().await.map(|g| (Instant::now(), g)) });
        assert!(
            eventually(Duration::from_secs(5), || async {
                other.stats().subscriptions == 1
            })
            .await
        );
        assert!(other.lock("queries").force_unlock().await.unwrap());
        let forced = Instant::now();
        let (at, taken) = waiter.await.unwrap().unwrap();
        assert!(at.duration_since(forced) < Duration::from_millis(250));
        // A dropped guard's release goes out from the undo task, which lets go of the hold when
        // it sends it: wait for that, so the count below is of the kept guard alone.
        drop(taken);
        assert!(eventually(Duration::from_secs(5), || async { other.stats().held == 0 }).await);

        // Shutdown marks live guards lost, refuses later work, and tells a later unlock why.
        client.shutdown().await;
        assert!(guard.is_lost());
        assert!(matches!(lock.lock().await, Err(Error::Shutdown)));
        assert!(matches!(guard.unlock().await, Err(Error::Shutdown)));
        client.shutdown().await; // again: nothing happens

        // A guard kept past the shutdown and dropped then: its release can no longer be sent
        // (its lease ends the hold in Redis), and the client lets go of the hold.
        let kept = other.lock("kept").lock().await.unwrap();
        assert_eq!(other.stats().held, 1);
        other.shutdown().await;
        drop(kept);
        assert_eq!(other.stats().held, 0);
    })
    .await;
}

/// An uncontended acquire is one EVALSHA and a release is one EVALSHA: nothing else is sent,
/// and the acquire, whose client knows of no contention, does not look at the lock's line (no
/// `GET` of the client a release named).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncontended_lock_and_unlock_cost_one_round_trip_each() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = server.lock_client(DEFAULT_WATCHDOG).await;
        let lock = client.lock("cost");
        // Warm the script cache (the first call of each script may need EVAL); the first hold
        // also subscribes the client's own channel, once.
        common::warmed_up(&raw, &client).await;
        let before = common::command_calls(&raw).await;
        for _ in 0..10 {
            lock.lock().await.unwrap().unlock().await.unwrap();
        }
        let delta = common::commands_since(&raw, &before).await;
        // EVALSHA itself, and the commands the scripts ran inside it.
        let outside: Vec<_> = delta
            .iter()
            .filter(|(name, _)| {
                ![
                    "exists",
                    "hexists",
                    "hset",
                    "pexpire",
                    "hdel",
                    "publish",
                    "sismember",
                ]
                .contains(&name.as_str())
            })
            .collect();
        assert_eq!(outside, vec![&("evalsha".to_string(), 20)], "{delta:?}");
    })
    .await;
}

/// After SCRIPT FLUSH the scripts are loaded again transparently (NOSCRIPT fallback).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_reload_after_script_flush() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = server.lock_client(DEFAULT_WATCHDOG).await;
        let lock = client.lock("flushed");
        lock.lock().await.unwrap().unlock().await.unwrap();
        let _: () = raw.script_flush(false).await.unwrap();
        let guard = lock.lock().await.unwrap();
        let _: () = raw.script_flush(false).await.unwrap();
        guard.unlock().await.unwrap();
        assert!(!lock.is_locked().await.unwrap());
    })
    .await;
}

/// A pinned owner id makes holds taken in different tasks one owner's reentrant holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pinned_owner_reenters_across_tasks() {
    bounded(async {
        let server = RedisServer::start();
        let client = server.lock_client(DEFAULT_WATCHDOG).await;
        let owner = OwnerId::unique();
        let lock = client.lock("pinned").with_owner(owner);
        let first = {
            let lock = lock.clone();
            tokio::spawn(async move { lock.lock().await.unwrap() })
                .await
                .unwrap()
        };
        let second = {
            let lock = lock.clone();
            tokio::spawn(async move { lock.try_lock(Duration::ZERO, None).await.unwrap() })
                .await
                .unwrap()
                .expect("the same pinned owner reenters from another task")
        };
        assert_eq!(lock.hold_count().await.unwrap(), 2);
        assert_eq!(first.owner_field(), client.owner_field(owner));
        // The current task is another owner and is excluded.
        let unpinned = client.lock("pinned");
        assert!(unpinned
            .try_lock(Duration::ZERO, None)
            .await
            .unwrap()
            .is_none());
        first.unlock().await.unwrap();
        second.unlock().await.unwrap();
        assert!(!lock.is_locked().await.unwrap());
    })
    .await;
}

/// One owner's acquisitions and releases running at the same time (tasks sharing a pinned
/// owner, futures joined in one task) each count once: the scripts set counts, so the client
/// sends one owner's changes of a lock one at a time.
async fn one_owners_concurrent_calls_each_count(kind: Kind) {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = server.lock_client(DEFAULT_WATCHDOG).await;
    let owner = OwnerId::unique();
    let lock = kind.lock(&client, "together").with_owner(owner);
    let field = kind.field(&client, owner);
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let lock = lock.clone();
            tokio::spawn(async move { lock.lock().await.unwrap() })
        })
        .collect();
    let mut guards = Vec::new();
    for task in tasks {
        guards.push(task.await.unwrap());
    }
    let (a, b) = tokio::join!(lock.lock(), lock.lock());
    guards.push(a.unwrap());
    guards.push(b.unwrap());
    let count: u32 = raw.hget("together", &field).await.unwrap();
    assert_eq!(count, 18);

    let releases: Vec<_> = guards
        .drain(..9)
        .map(|guard| tokio::spawn(guard.unlock()))
        .collect();
    for release in releases {
        release.await.unwrap().unwrap();
    }
    let count: u32 = raw.hget("together", &field).await.unwrap();
    assert_eq!(count, 9);
    drop(guards);
    assert!(
        eventually(Duration::from_secs(5), || async {
            !raw.exists::<bool, _>("together").await.unwrap()
        })
        .await,
        "dropped guards release every hold"
    );
}

/// A dropped guard's release, sent in the background, and the same owner's next acquisition,
/// back to back: the new hold stands. The acquisition attaches its hold before the owner's turn
/// passes on, so the release that takes the turn next counts it; handed on before, the release
/// counted one hold too few and deleted the lock the new guard believed held (every few dozen
/// rounds). Every other round the lock is deleted first, so the acquisition is granted afresh.
async fn a_dropped_guards_release_never_takes_the_next_hold(kind: Kind) {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let client = server.lock_client(DEFAULT_WATCHDOG).await;
    let lock = kind.lock(&client, "racing");
    let field = kind.field(&client, OwnerId::current());
    for round in 0..300 {
        let guard = lock.lock().await.unwrap();
        if round % 2 == 0 {
            assert!(lock.force_unlock().await.unwrap());
        }
        drop(guard);
        let guard = lock.lock().await.unwrap();
        let settled = eventually(Duration::from_millis(500), || async {
            raw.hget::<Option<u32>, _, _>("racing", &field)
                .await
                .unwrap()
                == Some(1)
        })
        .await;
        let count: Option<u32> = raw.hget("racing", &field).await.unwrap();
        assert!(
            settled,
            "round {round}: the owner's count is {count:?}, its client holds 1"
        );
        guard.unlock().await.unwrap();
        let exists: bool = raw.exists("racing").await.unwrap();
        assert!(!exists, "round {round}: the last unlock released it");
    }
}

/// Many waiters of one lock in one client share one subscription, and leave none behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_share_one_subscription() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let holder = server.lock_client(DEFAULT_WATCHDOG).await;
        let client = server.lock_client(DEFAULT_WATCHDOG).await;
        let guard = holder.lock("shared-sub").lock().await.unwrap();
        let waiters: Vec<_> = (0..20)
            .map(|_| {
                let lock = client.lock("shared-sub");
                tokio::spawn(async move { lock.lock().await.unwrap().unlock().await.unwrap() })
            })
            .collect();
        assert!(
            eventually(Duration::from_secs(5), || async {
                client.stats().wait_entries == 1 && client.stats().subscriptions == 1
            })
            .await
        );
        let counts: Vec<(String, i64)> = raw
            .pubsub_numsub("redisson_lock__channel:{shared-sub}")
            .await
            .unwrap();
        assert_eq!(counts[0].1, 1, "one subscription for 20 waiters");
        guard.unlock().await.unwrap();
        for waiter in waiters {
            waiter.await.unwrap();
        }
        assert!(
            eventually(Duration::from_secs(5), || async {
                client.stats().subscriptions == 0
            })
            .await
        );
    })
    .await;
}

/// An unlock that lands while a waiter is still subscribing must not be missed: on fresh
/// channels, with the unlock at random moments just after the waiter starts, every waiter
/// acquires promptly (a missed message would cost it the holder's 30 s lease).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unlock_during_subscription_is_not_missed() {
    bounded(async {
        let server = RedisServer::start();
        let holder = server.lock_client(DEFAULT_WATCHDOG).await;
        let waiter_client = server.lock_client(DEFAULT_WATCHDOG).await;
        let mut rounds = Vec::new();
        for round in 0..150 {
            let name = format!("subscribe-race:{round}");
            let guard = holder.lock(name.as_str()).lock().await.unwrap();
            let lock = waiter_client.lock(name.as_str());
            let waiter = tokio::spawn(async move {
                tokio::time::timeout(Duration::from_secs(2), lock.lock())
                    .await
                    .map(|guard| drop(guard.unwrap()))
            });
            let yields = rand::thread_rng().gen_range(0..200);
            for _ in 0..yields {
                tokio::task::yield_now().await;
            }
            guard.unlock().await.unwrap();
            rounds.push(waiter);
        }
        let mut missed = 0;
        for waiter in rounds {
            if waiter.await.unwrap().is_err() {
                missed += 1;
            }
        }
        assert_eq!(missed, 0, "{missed} of 150 waiters missed the unlock");
    })
    .await;
}

/// A guard dropped just before its client (the end of an ordinary scope) is still released:
/// the client's last handle closes the connections only after queued releases are sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guard_dropped_with_its_client_is_released() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        for round in 0..20 {
            let name = format!("scope-end:{round}");
            {
                let client = server.lock_client(DEFAULT_WATCHDOG).await;
                let _guard = client.lock(name.as_str()).lock().await.unwrap();
            } // guard, then client, dropped here
            let released = eventually(Duration::from_secs(2), || async {
                let exists: bool = raw.exists(name.as_str()).await.unwrap();
                !exists
            })
            .await;
            assert!(
                released,
                "round {round}: the lock outlived its dropped client"
            );
        }
    })
    .await;
}

/// A task that waits for the same lock again within a second finds its channel still
/// subscribed: one SUBSCRIBE for three waits, and the subscription ends a second later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_waits_reuse_the_subscription() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let holder = server.lock_client(DEFAULT_WATCHDOG).await;
        let client = server.lock_client(DEFAULT_WATCHDOG).await;
        // Each client's first hold subscribes its own channel, once: not counted below.
        for warmed in [&holder, &client] {
            common::warmed_up(&raw, warmed).await;
        }
        let before = common::command_calls(&raw).await;
        let lock = client.lock("again");
        for _ in 0..3 {
            let guard = holder.lock("again").lock().await.unwrap();
            let waiter = {
                let lock = lock.clone();
                tokio::spawn(async move { lock.lock().await.unwrap().unlock().await.unwrap() })
            };
            assert!(
                eventually(Duration::from_secs(2), || async {
                    client.stats().wait_entries == 1 && client.stats().subscriptions == 1
                })
                .await
            );
            guard.unlock().await.unwrap();
            waiter.await.unwrap();
        }
        let after = common::command_calls(&raw).await;
        let subscribes = after.get("subscribe").copied().unwrap_or(0)
            - before.get("subscribe").copied().unwrap_or(0);
        assert_eq!(subscribes, 1, "one SUBSCRIBE for three waits");
        assert!(
            eventually(Duration::from_secs(3), || async {
                client.stats().subscriptions == 0
            })
            .await,
            "the idle subscription was not dropped"
        );
    })
    .await;
}

/// How long a channel stays subscribed after its last waiter left: a copy of the engine's
/// private `LINGER` (src/engine/pubsub.rs), to change with it. A longer linger keeps this test
/// right; a shorter one would make it check rounds whose channel may be gone (failing when one
/// is), not pass where it should fail.
const CHANNEL_LINGER: Duration = Duration::from_secs(1);

/// One task that waits for `lock` whenever told to, reporting each time it holds it (and
/// releasing it at once): its waits reuse its channel, which stays subscribed between them.
fn repeated_waiter(
    lock: fredlock::Lock,
    wait_for: Duration,
) -> (
    tokio::sync::mpsc::UnboundedSender<()>,
    tokio::sync::mpsc::UnboundedReceiver<Option<Instant>>,
) {
    let (go, mut told) = tokio::sync::mpsc::unbounded_channel::<()>();
    let (report, reports) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while told.recv().await.is_some() {
            let acquired = match tokio::time::timeout(wait_for, lock.lock()).await {
                Ok(guard) => {
                    let at = Instant::now();
                    guard.unwrap().unlock().await.unwrap();
                    Some(at)
                }
                Err(_) => None,
            };
            if report.send(acquired).is_err() {
                break;
            }
        }
    });
    (go, reports)
}

/// A waiter whose channel is still subscribed from its last wait (a worker loop) makes one
/// attempt, not two, before it waits: nothing can have been published since it looked. It is
/// still woken by the unlock, within 250 ms.
///
/// Two things a busy machine may do are told apart rather than guessed at. A channel lingers
/// one second after its last waiter left ([`CHANNEL_LINGER`]), which began no earlier than the
/// unlock that woke it: a round whose attempts were all counted less than that after the last
/// round's unlock found its channel subscribed, and must make one attempt; a later one may be a
/// first wait again (one or two). And the waiter's own unlock publishes on the channel it
/// listens on: the next round starts only once that message has had time to arrive, since one
/// delivered after the next wait looked rightly costs that wait a second attempt.
async fn a_waiter_on_a_subscribed_channel_waits_after_one_attempt(kind: Kind) {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let holder = server.lock_client(DEFAULT_WATCHDOG).await;
    let waiter_client = server.lock_client(DEFAULT_WATCHDOG).await;
    // Its first call of each kind asks the server for that kind's permissions first
    // (`permissions`): not an attempt.
    common::warmed_up(&raw, &waiter_client).await;
    let warm = kind
        .lock(&waiter_client, "warm-up-kind")
        .lock()
        .await
        .unwrap();
    warm.unlock().await.unwrap();
    let (go, mut reports) =
        repeated_waiter(kind.lock(&waiter_client, "quiet"), Duration::from_secs(5));
    let mut still_subscribed = 0;
    // When the last round's holder unlocked: its waiter left the channel after that.
    let mut last_unlock: Option<Instant> = None;
    for round in 0..4 {
        if last_unlock.is_some() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let guard = kind.lock(&holder, "quiet").lock().await.unwrap();
        let before = common::command_calls(&raw).await;
        let subscribed = waiter_client.stats().subscriptions == 1;
        go.send(()).unwrap();
        if kind.listens() {
            assert!(
                eventually(Duration::from_secs(2), || async {
                    waiter_client.stats().wait_entries == 1
                })
                .await
            );
        }
        // Time for a second attempt, were one made.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let after = common::command_calls(&raw).await;
        let attempts = after["evalsha"] - before.get("evalsha").copied().unwrap_or(0);
        // Every attempt counted in `after` was made before now.
        let lingering = last_unlock.is_some_and(|at| at.elapsed() < CHANNEL_LINGER);
        if !kind.listens() {
            // A spin waiter has no channel to stay subscribed to: it backs off, its pauses
            // doubling from 1 ms, so 200 ms hold a handful of attempts and no subscription.
            assert_eq!(waiter_client.stats().subscriptions, 0, "round {round}");
            assert!(
                (2..=16).contains(&attempts),
                "round {round}: {attempts} attempts of a backing-off waiter"
            );
        } else if round > 0 && subscribed && lingering {
            still_subscribed += 1;
            assert_eq!(attempts, 1, "round {round}: attempts before waiting");
        } else if round > 0 {
            // Its channel may have stopped lingering before this wait looked.
            assert!(
                (1..=2).contains(&attempts),
                "round {round}: {attempts} attempts of a wait started late"
            );
        } else {
            // The first wait subscribes, and attempts again once subscribed.
            assert_eq!(attempts, 2, "round {round}: a first wait");
        }
        // Before the call: the waiter cannot leave its wait before the unlock ran.
        last_unlock = Some(Instant::now());
        guard.unlock().await.unwrap();
        let unlocked = Instant::now();
        let acquired = reports.recv().await.unwrap().expect("the waiter acquired");
        let latency = acquired.saturating_duration_since(unlocked);
        assert!(
            latency <= Duration::from_millis(250),
            "round {round}: woke after {latency:?}"
        );
    }
    if kind.listens() {
        assert!(
            still_subscribed >= 1,
            "no round found its channel still subscribed"
        );
    }
}

/// Unlocks at random moments around a waiter's attempt and its join of a channel that is still
/// subscribed: before the attempt, between its busy reply and the join, after it. The waiter
/// never misses one (a missed unlock would cost it the holder's 30 s lease, or a fair waiter the
/// third of its 5 s place after which it tries again; it gives up after 1 s).
async fn unlock_racing_a_waiter_on_a_subscribed_channel_is_not_missed(kind: Kind) {
    let server = RedisServer::start();
    let holder = server.lock_client(DEFAULT_WATCHDOG).await;
    let waiter_client = server.lock_client(DEFAULT_WATCHDOG).await;
    let (go, mut reports) = repeated_waiter(
        kind.lock(&waiter_client, "quiet-race"),
        Duration::from_secs(1),
    );
    let lock = kind.lock(&holder, "quiet-race");
    let mut missed = 0;
    for _ in 0..150 {
        let guard = lock.lock().await.unwrap();
        go.send(()).unwrap();
        let yields = rand::thread_rng().gen_range(0..400);
        for _ in 0..yields {
            tokio::task::yield_now().await;
        }
        guard.unlock().await.unwrap();
        if reports.recv().await.unwrap().is_none() {
            missed += 1;
        }
    }
    assert_eq!(missed, 0, "{missed} of 150 waits missed the unlock");
    assert!(
        waiter_client.stats().subscriptions <= 1,
        "one channel for every wait"
    );
}

/// A client's shutdown ends its waiting tasks at once with `Shutdown`, whether they are waiting
/// for a wake-up, or just joining (the lock is held elsewhere for 30 s).
async fn waiters_end_with_their_clients_shutdown(kind: Kind) {
    let server = RedisServer::start();
    let holder = server.lock_client(DEFAULT_WATCHDOG).await;
    let client = server.lock_client(DEFAULT_WATCHDOG).await;
    let _guard = kind.lock(&holder, "shut").lock().await.unwrap();
    let waiters: Vec<_> = (0..10)
        .map(|i| {
            let lock = kind.lock(&client, "shut");
            tokio::spawn(async move {
                // Some are still joining when the shutdown comes.
                tokio::time::sleep(Duration::from_millis(i * 20)).await;
                lock.lock().await.map(drop)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(150)).await;
    let shut = Instant::now();
    client.shutdown().await;
    for waiter in waiters {
        let ended = tokio::time::timeout(Duration::from_secs(2), waiter)
            .await
            .expect("a waiter outlived its client's shutdown")
            .unwrap();
        assert!(matches!(ended, Err(Error::Shutdown)), "{ended:?}");
    }
    let took = shut.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "waiters ended {took:?} after the shutdown"
    );
}

/// The spans an operator's tracing subscriber sees: `acquire` with the lock, kind, owner, how
/// long it waited and how it ended, and `release`.
mod spans {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use tracing::field::{Field, Visit};
    use tracing::span::{Attributes, Id, Record};
    use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
    use tracing_subscriber::registry::LookupSpan;

    use super::common::{bounded, RedisServer};

    type Fields = HashMap<String, String>;

    /// Every closed span, by name, with its fields as text.
    #[derive(Clone, Default)]
    struct Closed(Arc<Mutex<Vec<(String, Fields)>>>);

    struct Text<'a>(&'a mut Fields);

    impl Visit for Text<'_> {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            self.0.insert(field.name().to_owned(), format!("{value:?}"));
        }
        fn record_str(&mut self, field: &Field, value: &str) {
            self.0.insert(field.name().to_owned(), value.to_owned());
        }
    }

    impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Closed {
        fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
            let mut fields = Fields::new();
            attrs.record(&mut Text(&mut fields));
            if let Some(span) = ctx.span(id) {
                span.extensions_mut().insert(fields);
            }
        }
        fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
            if let Some(span) = ctx.span(id) {
                if let Some(fields) = span.extensions_mut().get_mut::<Fields>() {
                    values.record(&mut Text(fields));
                }
            }
        }
        fn on_close(&self, id: Id, ctx: Context<'_, S>) {
            if let Some(span) = ctx.span(&id) {
                let fields = span
                    .extensions()
                    .get::<Fields>()
                    .cloned()
                    .unwrap_or_default();
                self.0
                    .lock()
                    .unwrap()
                    .push((span.name().to_owned(), fields));
            }
        }
    }

    // The process's global subscriber, not a thread's default: the other tests of this binary
    // run at the same time on threads without one, and a span callsite they meet first would
    // otherwise be cached as of no interest to anyone. Spans of their locks are recorded too,
    // and filtered out by name below.
    #[tokio::test]
    async fn acquire_and_release_are_spans_with_their_outcome() {
        let server = RedisServer::start();
        let closed = Closed::default();
        let subscriber = tracing_subscriber::registry().with(closed.clone());
        tracing::subscriber::set_global_default(subscriber)
            .expect("no other test sets a global subscriber");
        bounded(async {
            let client = server.lock_client(Duration::from_secs(30)).await;
            let lock = client.lock("spans:lock");
            let guard = lock.lock().await.unwrap();
            let owner = guard.owner_field().to_owned();
            let other = client.lock("spans:lock");
            let timed_out = tokio::spawn(async move {
                other
                    .try_lock(Duration::from_millis(50), None)
                    .await
                    .unwrap()
                    .is_none()
            });
            assert!(timed_out.await.unwrap());
            guard.unlock().await.unwrap();
            client.shutdown().await;

            let closed: Vec<(String, Fields)> = closed
                .0
                .lock()
                .unwrap()
                .iter()
                .filter(|(_, fields)| fields.get("lock").map(String::as_str) == Some("spans:lock"))
                .cloned()
                .collect();
            let acquires: Vec<&Fields> = closed
                .iter()
                .filter(|(name, _)| name == "acquire")
                .map(|(_, fields)| fields)
                .collect();
            assert_eq!(acquires.len(), 2, "{closed:?}");
            let won = acquires
                .iter()
                .find(|fields| fields["outcome"] == "acquired")
                .expect("an acquired span");
            assert_eq!(won["lock"], "spans:lock");
            assert_eq!(won["kind"], "lock");
            assert_eq!(won["owner"], owner);
            assert!(won.contains_key("waited_ms"));
            let gave_up = acquires
                .iter()
                .find(|fields| fields["outcome"] == "timed_out")
                .expect("a timed-out span");
            let waited: u64 = gave_up["waited_ms"].parse().unwrap();
            assert!(waited >= 50, "{gave_up:?}");
            let release = closed
                .iter()
                .find(|(name, _)| name == "release")
                .map(|(_, fields)| fields)
                .expect("a release span");
            assert_eq!(release["lock"], "spans:lock");
            assert_eq!(release["owner"], owner);
        })
        .await;
    }
}

/// A shutdown hands over every hold at once, whatever the primitive: a waiter in another client
/// gets each lock, permit and term within 250 ms, and the holder's unlock says `Shutdown`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shutdown_hands_every_hold_over_at_once() {
    bounded(async {
        let server = RedisServer::start();
        let holder = server.lock_client(DEFAULT_WATCHDOG).await;
        let waiter = server.lock_client(DEFAULT_WATCHDOG).await;
        holder.semaphore("s").try_set_permits(1).await.unwrap();
        holder
            .permit_semaphore("p")
            .try_set_permits(1)
            .await
            .unwrap();

        let lock = holder.lock("l").lock().await.unwrap();
        let fair = holder.fair_lock("f").lock().await.unwrap();
        let write = holder.rw_lock("rw").write_lock().lock().await.unwrap();
        let permit = holder.semaphore("s").acquire(1).await.unwrap();
        let leased = holder.permit_semaphore("p").acquire().await.unwrap();
        let term = holder.leader_election("e").campaign().await.unwrap();

        let mut waits: Vec<(&str, tokio::task::JoinHandle<Instant>)> = Vec::new();
        macro_rules! wait_for {
            ($what:expr, $acquire:expr) => {{
                let waiter = waiter.clone();
                waits.push((
                    $what,
                    tokio::spawn(async move {
                        let _held = $acquire(waiter).await.unwrap();
                        Instant::now()
                    }),
                ));
            }};
        }
        wait_for!(
            "lock",
            |c: LockClient| async move { c.lock("l").lock().await }
        );
        wait_for!("fair lock", |c: LockClient| async move {
            c.fair_lock("f").lock().await
        });
        wait_for!("write lock", |c: LockClient| async move {
            c.rw_lock("rw").write_lock().lock().await
        });
        wait_for!("semaphore", |c: LockClient| async move {
            c.semaphore("s").acquire(1).await
        });
        wait_for!("permit semaphore", |c: LockClient| async move {
            c.permit_semaphore("p").acquire().await
        });
        wait_for!("leader election", |c: LockClient| async move {
            c.leader_election("e").campaign().await
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        for (what, wait) in &waits {
            assert!(!wait.is_finished(), "{what} was taken while held");
        }

        let shutdown = Instant::now();
        holder.shutdown().await;
        for (what, wait) in waits {
            let got = wait.await.unwrap();
            let after = got.saturating_duration_since(shutdown);
            assert!(
                after < Duration::from_millis(250),
                "{what} handed over after {after:?}"
            );
        }
        assert!(matches!(lock.unlock().await, Err(Error::Shutdown)));
        assert!(matches!(fair.unlock().await, Err(Error::Shutdown)));
        assert!(matches!(write.unlock().await, Err(Error::Shutdown)));
        assert!(matches!(permit.release().await, Err(Error::Shutdown)));
        assert!(matches!(leased.release().await, Err(Error::Shutdown)));
        assert!(matches!(term.resign().await, Err(Error::Shutdown)));
    })
    .await;
}

/// 9 of issue 31. A process holding a lock, a fair lock, a write lock, a permit and a term gets
/// SIGTERM and calls `shutdown()`: waiters in this process get each within 250 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_and_shutdown_hand_over_to_another_process() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let waiter = server.lock_client(DEFAULT_WATCHDOG).await;
        waiter
            .permit_semaphore("sig-p")
            .try_set_permits(1)
            .await
            .unwrap();
        let mut child = common::spawn_test_child(
            "sigterm_child_holds_everything",
            &[("FREDLOCK_SIGTERM_URL", server.url())],
        );
        // The child took everything once its term stands (taken last).
        let ready = eventually(Duration::from_secs(10), || async {
            raw.exists::<bool, _>("sig-e").await.unwrap()
        })
        .await;
        assert!(ready, "the child never took everything");

        let mut waits = Vec::new();
        for what in ["lock", "fair", "write", "permit", "term"] {
            let waiter = waiter.clone();
            waits.push((
                what,
                tokio::spawn(async move {
                    match what {
                        "lock" => drop(waiter.lock("sig-l").lock().await.unwrap()),
                        "fair" => drop(waiter.fair_lock("sig-f").lock().await.unwrap()),
                        "write" => {
                            drop(waiter.rw_lock("sig-rw").write_lock().lock().await.unwrap())
                        }
                        "permit" => drop(waiter.permit_semaphore("sig-p").acquire().await.unwrap()),
                        _ => drop(waiter.leader_election("sig-e").campaign().await.unwrap()),
                    }
                    Instant::now()
                }),
            ));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        for (what, wait) in &waits {
            assert!(
                !wait.is_finished(),
                "{what} was taken while the child held it"
            );
        }
        let signalled = Instant::now();
        common::signal(child.id(), "TERM");
        for (what, wait) in waits {
            let after = wait.await.unwrap().saturating_duration_since(signalled);
            assert!(
                after < Duration::from_millis(250),
                "{what} handed over after {after:?}"
            );
        }
        let status = child.wait().expect("reap the child");
        assert!(status.success(), "the child failed: {status}");
    })
    .await;
}

/// Helper process for `sigterm_and_shutdown_hand_over_to_another_process`: takes everything,
/// then shuts down on SIGTERM, as a service does in a rolling deploy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by sigterm_and_shutdown_hand_over_to_another_process as a child process"]
async fn sigterm_child_holds_everything() {
    let Ok(url) = std::env::var("FREDLOCK_SIGTERM_URL") else {
        return;
    };
    let mut terminate =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).unwrap();
    let client = common::builder().url(url).build().await.unwrap();
    let _lock = client.lock("sig-l").lock().await.unwrap();
    let _fair = client.fair_lock("sig-f").lock().await.unwrap();
    let _write = client.rw_lock("sig-rw").write_lock().lock().await.unwrap();
    let _permit = client.permit_semaphore("sig-p").acquire().await.unwrap();
    let _term = client.leader_election("sig-e").campaign().await.unwrap();
    tokio::time::timeout(Duration::from_secs(60), terminate.recv())
        .await
        .expect("SIGTERM within a minute");
    client.shutdown().await;
}

/// 9 of issue 31, its second half. A force unlock from another client tells the holder's
/// client at once: its guard's `lost()` fires within 250 ms, not at its next renewal. A spin
/// lock, whose clients never subscribe, learns at its next renewal, within a third of the lease.
async fn a_force_unlock_tells_the_holder_at_once(kind: Kind) {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let holder = server.lock_client(DEFAULT_WATCHDOG).await;
    let other = server.lock_client(DEFAULT_WATCHDOG).await;
    let guard = kind.lock(&holder, "forced").lock().await.unwrap();
    if kind.listens() {
        common::listening_for_force_unlocks(&raw, &holder).await;
    }
    let forced = Instant::now();
    assert!(kind.lock(&other, "forced").force_unlock().await.unwrap());
    let told = tokio::time::timeout(DEFAULT_WATCHDOG, guard.lost()).await;
    let after = forced.elapsed();
    assert!(told.is_ok(), "the holder never learned of the force unlock");
    if kind.listens() {
        assert!(after < Duration::from_millis(250), "told after {after:?}");
    } else {
        assert!(
            after <= DEFAULT_WATCHDOG / 3 + Duration::from_secs(1),
            "told after {after:?}"
        );
    }
    assert!(guard.is_lost());
}

/// A non-reentrant lock: its holder asking again gets `WouldDeadlock` at once, from every way
/// of asking, with nothing sent or changed; another owner waits as for any lock; the layout is
/// Redisson's (one field, count 1), so a Redisson holder excludes it and it excludes Redisson.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_reentrant_lock_refuses_its_holder_and_keeps_redissons_layout() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = server.lock_client(DEFAULT_WATCHDOG).await;
        let lock = client.non_reentrant_lock("once");
        assert!(!lock.is_reentrant() && client.lock("once").is_reentrant());
        let guard = lock.lock().await.unwrap();
        let field = guard.owner_field().to_string();
        let layout = || async {
            let fields: std::collections::HashMap<String, i64> = raw.hgetall("once").await.unwrap();
            let pttl: i64 = raw.pttl("once").await.unwrap();
            (fields, pttl)
        };
        let (before, ttl_before) = layout().await;
        assert_eq!(before, [(field.clone(), 1)].into_iter().collect());
        common::warmed_up(&raw, &client).await;
        let calls = common::command_calls(&raw).await;
        let started = Instant::now();
        let refused = [
            lock.lock().await.err(),
            lock.lock_with_lease(Duration::from_secs(5)).await.err(),
            lock.try_lock(Duration::from_secs(5), None).await.err(),
            lock.try_lock(Duration::ZERO, None).await.err(),
            lock.with_lock(|_| async {}).await.err(),
            lock.clone()
                .with_owner(OwnerId::current())
                .lock()
                .await
                .err(),
        ];
        assert!(
            started.elapsed() < Duration::from_millis(100),
            "refused at once"
        );
        for error in refused {
            match error {
                Some(Error::WouldDeadlock {
                    lock, owner, why, ..
                }) => {
                    assert_eq!((lock.as_str(), owner.as_str()), ("once", field.as_str()));
                    assert!(why.contains("non-reentrant"), "{why}");
                    // It says why a caller who did not mean to ask twice did, and the way out.
                    assert!(why.contains("tokio task"), "{why}");
                    assert!(why.contains("with_owner(OwnerId::unique())"), "{why}");
                    assert!(!why.contains("  "), "{why}");
                }
                other => panic!("expected WouldDeadlock, got {other:?}"),
            }
        }
        let sent = common::commands_since(&raw, &calls).await;
        assert_eq!(sent, vec![], "a refusal sends nothing");
        let (fields, ttl) = layout().await;
        assert_eq!(fields, before, "a refusal changes nothing");
        assert!(ttl <= ttl_before && ttl > ttl_before - 1000);
        assert_eq!(lock.hold_count().await.unwrap(), 1);

        // Another task (another owner) waits for it as for any lock.
        let other = tokio::spawn({
            let lock = lock.clone();
            async move {
                lock.try_lock(Duration::from_millis(200), None)
                    .await
                    .unwrap()
                    .is_none()
            }
        });
        assert!(other.await.unwrap(), "another owner got a held lock");
        guard.unlock().await.unwrap();
        let again = lock.lock().await.unwrap();
        again.unlock().await.unwrap();

        // Redisson holds it (its layout by hand): the non-reentrant lock waits; and a
        // reentrant handle of a Redisson-style holder is excluded by it.
        let java = "1b4e28ba-2fa1-11d2-883f-0016d3cca427:77";
        let _: i64 = raw.hset("once", (java, 1)).await.unwrap();
        let _: bool = raw.pexpire("once", 30_000, None).await.unwrap();
        assert!(lock
            .try_lock(Duration::from_millis(100), None)
            .await
            .unwrap()
            .is_none());
        let _: i64 = raw.del("once").await.unwrap();
        let guard = lock.lock().await.unwrap();
        let taken: Option<fredlock::LockGuard> = tokio::spawn({
            let other = client.lock("once");
            async move {
                other
                    .try_lock(Duration::from_millis(100), None)
                    .await
                    .unwrap()
            }
        })
        .await
        .unwrap();
        assert!(
            taken.is_none(),
            "a reentrant handle of another owner got it"
        );
        guard.unlock().await.unwrap();
        client.shutdown().await;
    })
    .await;
}

/// The quick forms (issue 34, trap 3): `try_lock()` takes a free lock (or re-enters) in one
/// script call and answers `None` at once, without waiting or subscribing, while another owner
/// holds it; `try_with_lock` returns `None` without calling its work when the wait ends, runs it
/// and unlocks when the lock comes free within the wait, and drops it with `Lost` when its fixed
/// lease ends under it.
async fn quick_forms_take_at_once_or_run_within_a_wait(kind: Kind) {
    use std::sync::atomic::{AtomicBool, Ordering};
    let server = RedisServer::start();
    let raw = server.raw().await;
    let holder = server.lock_client(DEFAULT_WATCHDOG).await;
    let other = server.lock_client(DEFAULT_WATCHDOG).await;
    let lock = kind.lock(&holder, "quick");
    let theirs = kind.lock(&other, "quick");
    let guard = lock
        .try_lock_now()
        .await
        .unwrap()
        .expect("a free lock is taken");
    let again = lock
        .try_lock_now()
        .await
        .unwrap()
        .expect("its holder re-enters");
    assert_eq!(lock.hold_count().await.unwrap(), 2);
    again.unlock().await.unwrap();

    common::warmed_up(&raw, &other).await;
    // Its first call of this kind asks the server for the kind's permissions: not an attempt.
    let warm = kind.lock(&other, "warm-up-kind").lock().await.unwrap();
    warm.unlock().await.unwrap();
    let calls = common::command_calls(&raw).await;
    let started = Instant::now();
    assert!(theirs.try_lock_now().await.unwrap().is_none());
    let answered = started.elapsed();
    assert!(
        answered < Duration::from_millis(200),
        "answered after {answered:?}"
    );
    // INFO counts the commands a script runs as well; one script call is one attempt.
    let sent = common::commands_since(&raw, &calls).await;
    let scripts: Vec<_> = sent
        .iter()
        .filter(|(name, _)| name.starts_with("eval"))
        .collect();
    assert_eq!(
        scripts,
        [&("evalsha".to_string(), 1)],
        "one attempt: {sent:?}"
    );
    assert_eq!(other.stats().wait_entries, 0, "it never waited");

    let called = AtomicBool::new(false);
    let started = Instant::now();
    let skipped = theirs
        .try_with_lock(Duration::from_millis(300), None, |_| async {
            called.store(true, Ordering::SeqCst)
        })
        .await
        .unwrap();
    let waited = started.elapsed();
    assert!(skipped.is_none() && !called.load(Ordering::SeqCst));
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_millis(800),
        "gave up after {waited:?}"
    );

    // Freed within the wait: the work runs holding it, and the lock is given back after.
    let unlocker = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        guard.unlock().await.unwrap();
    });
    let ran = theirs
        .try_with_lock(Duration::from_secs(5), None, |_| async {
            theirs.hold_count().await.unwrap()
        })
        .await
        .unwrap();
    unlocker.await.unwrap();
    assert_eq!(ran, Some(1), "the work ran holding the lock");
    assert!(
        !theirs.is_locked().await.unwrap(),
        "given back after the work"
    );

    // A fixed lease that ends under the work: the work is dropped, and the caller told.
    let finished = AtomicBool::new(false);
    let started = Instant::now();
    let outcome = theirs
        .try_with_lock(
            Duration::ZERO,
            Some(Duration::from_millis(300)),
            |_| async {
                tokio::time::sleep(Duration::from_secs(3)).await;
                finished.store(true, Ordering::SeqCst)
            },
        )
        .await;
    assert!(matches!(outcome, Err(Error::Lost { .. })), "{outcome:?}");
    assert!(!finished.load(Ordering::SeqCst));
    assert!(started.elapsed() < Duration::from_millis(1500));
}

/// One task is one owner (issue 34, trap 1): three attempts joined in one task all enter a
/// reentrant lock together (the model the docs open with); on a non-reentrant lock, and with an
/// owner of their own each, they take turns. The fenced lock's `try_with_lock` hands its work
/// the token it was issued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_task_is_one_owner_and_the_ways_out_take_turns() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    bounded(async {
        let server = RedisServer::start();
        let client = server.lock_client(DEFAULT_WATCHDOG).await;
        let inside = AtomicUsize::new(0);
        let most = AtomicUsize::new(0);
        let attempt = |lock: fredlock::Lock| {
            let (inside, most) = (&inside, &most);
            async move {
                let guard = lock.lock().await?;
                most.fetch_max(inside.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(100)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                guard.unlock().await
            }
        };
        let mut at_once = Vec::new();
        for make in [
            &(|| client.lock("job")) as &dyn Fn() -> fredlock::Lock,
            &|| client.non_reentrant_lock("job"),
            &|| client.lock("job").with_owner(OwnerId::unique()),
        ] {
            most.store(0, Ordering::SeqCst);
            let (a, b, c) = tokio::join!(attempt(make()), attempt(make()), attempt(make()));
            let mut entered = 0;
            for result in [a, b, c] {
                match result {
                    Ok(()) => entered += 1,
                    // The non-reentrant lock refuses an attempt that asks once the hold is
                    // known; one that asked before waits its turn, as another owner would.
                    Err(Error::WouldDeadlock { why, .. }) => assert!(why.contains("tokio task")),
                    Err(other) => panic!("{other:?}"),
                }
            }
            assert!(entered >= 1);
            at_once.push(most.load(Ordering::SeqCst));
        }
        assert_eq!(
            at_once,
            vec![3, 1, 1],
            "reentrant, non-reentrant, an owner each"
        );

        let fenced = client.fenced_lock("fenced-job");
        let token = fenced
            .try_with_lock(Duration::ZERO, None, |(token, _)| async move { token })
            .await
            .unwrap()
            .expect("a free lock");
        assert_eq!(fenced.last_token().await.unwrap(), Some(token));
    })
    .await
}

/// Issue 42, point 4: what README says of joined attempts on a non-reentrant lock:
/// `tokio::join!(lock.lock(), lock.lock())` gives one guard and one `WouldDeadlock`, every time,
/// in either order, and Redis records one hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joined_attempts_on_a_non_reentrant_lock_give_one_guard_and_one_refusal() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = server.lock_client(DEFAULT_WATCHDOG).await;
        for kind in ["lock", "fair"] {
            for round in 0..20 {
                let lock = match kind {
                    "lock" => client.non_reentrant_lock("joined"),
                    _ => client.non_reentrant_fair_lock("joined").into(),
                };
                let (a, b) = tokio::time::timeout(Duration::from_secs(10), async {
                    tokio::join!(lock.lock(), lock.lock())
                })
                .await
                .unwrap_or_else(|_| {
                    panic!("{kind} round {round}: a joined attempt waited for itself")
                });
                let (guard, refused) = match (a, b) {
                    (Ok(guard), Err(refused)) | (Err(refused), Ok(guard)) => (guard, refused),
                    (a, b) => panic!("{kind} round {round}: {a:?} and {b:?}"),
                };
                assert!(
                    matches!(refused, Error::WouldDeadlock { .. }),
                    "{kind} round {round}: {refused:?}"
                );
                let holds: std::collections::HashMap<String, String> =
                    raw.hgetall("joined").await.unwrap();
                assert_eq!(holds.len(), 1, "{kind} round {round}: {holds:?}");
                guard.unlock().await.unwrap();
            }
        }
    })
    .await
}

/// The work each side of `shutdown_stops_the_work_before_handing_over` runs under a hold.
const SHUTDOWN_WORKS: [&str; 3] = ["job", "lock", "leader"];
/// Rounds of `shutdown_stops_the_work_before_handing_over`.
const SHUTDOWN_ROUNDS: u32 = 50;

/// Issue 42, point 2: a process runs a job (`JobLock::run`), work under a lock
/// (`Lock::with_lock`) and a leader's work (`LeaderElection::run`), and calls `shutdown()` while
/// this process waits for all three; 50 rounds. Cancel first, then give back: on the machine's
/// monotonic clock, the child's work futures were dropped before this process's work on the
/// same lock started, every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shutdown_stops_the_work_before_handing_over() {
    bounded(async {
        use common::history::monotonic_ns;
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = server.lock_client(DEFAULT_WATCHDOG).await;
        let mut child = common::KillOnDrop(
            common::test_child(
                "shutdown_child_runs_the_work",
                &[("FREDLOCK_SHUTDOWN_URL", server.url())],
            )
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
        );
        let mut stdout = child.0.stdout.take().unwrap();
        let output = tokio::task::spawn_blocking(move || {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut stdout, &mut text).map(|_| text)
        });
        let mut started = std::collections::HashMap::new();
        for round in 0..SHUTDOWN_ROUNDS {
            let held = eventually(Duration::from_secs(20), || async {
                raw.get::<Option<u32>, _>("shutdown:held").await.unwrap() == Some(round)
            })
            .await;
            assert!(held, "the child never held everything in round {round}");
            let job = {
                let client = client.clone();
                tokio::spawn(async move {
                    let job = client.job_lock("shutdown:job");
                    match job
                        .run_waiting(Duration::from_secs(10), async { monotonic_ns() })
                        .await
                        .unwrap()
                    {
                        fredlock::JobRun::Ran(at) => at,
                        other => panic!("the job was not handed over: {other:?}"),
                    }
                })
            };
            let lock = {
                let client = client.clone();
                tokio::spawn(async move {
                    client
                        .lock("shutdown:lock")
                        .with_lock(|_| async { monotonic_ns() })
                        .await
                        .unwrap()
                })
            };
            let leader = {
                let client = client.clone();
                tokio::spawn(async move {
                    let term = client
                        .leader_election("shutdown:leader")
                        .campaign()
                        .await
                        .unwrap();
                    let at = monotonic_ns();
                    term.resign().await.unwrap();
                    at
                })
            };
            // The waiters are waiting (the job's polls, the others subscribed) before the
            // child shuts down.
            tokio::time::sleep(Duration::from_millis(150)).await;
            let _: () = raw
                .set("shutdown:waiting", round, None, None, false)
                .await
                .unwrap();
            for (what, task) in SHUTDOWN_WORKS.iter().zip([job, lock, leader]) {
                started.insert((*what, round), task.await.unwrap());
            }
            let _: () = raw
                .set("shutdown:done", round, None, None, false)
                .await
                .unwrap();
        }
        let status = tokio::task::spawn_blocking(move || child.0.wait())
            .await
            .unwrap()
            .unwrap();
        assert!(status.success(), "the child failed: {status}");
        let output = output.await.unwrap().unwrap();
        let mut dropped = std::collections::HashMap::new();
        for line in output.lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            if let ["dropped", what, round, at] = words[..] {
                let what = SHUTDOWN_WORKS.iter().find(|w| **w == what).unwrap();
                dropped.insert(
                    (*what, round.parse::<u32>().unwrap()),
                    at.parse::<u64>().unwrap(),
                );
            }
        }
        let mut overlaps = Vec::new();
        for (key, started) in &started {
            let dropped = dropped
                .get(key)
                .unwrap_or_else(|| panic!("the child's {key:?} was never dropped"));
            if started <= dropped {
                overlaps.push((key, (dropped - started) / 1000));
            }
        }
        overlaps.sort();
        assert!(
            overlaps.is_empty(),
            "work started here before the child's was dropped (µs before): {overlaps:?}"
        );
    })
    .await;
}

/// Helper process for `shutdown_stops_the_work_before_handing_over`: each round, a new client
/// runs the three works (each until it is dropped, printing when), waits for the parent's
/// waiters, shuts down, and waits for the parent to finish the round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by shutdown_stops_the_work_before_handing_over as a child process"]
async fn shutdown_child_runs_the_work() {
    use common::history::monotonic_ns;
    let Ok(url) = std::env::var("FREDLOCK_SHUTDOWN_URL") else {
        return;
    };
    /// Prints when the work that owns it is dropped.
    struct Dropped(&'static str, u32);
    impl Drop for Dropped {
        fn drop(&mut self) {
            println!("dropped {} {} {}", self.0, self.1, monotonic_ns());
        }
    }
    let raw = common::raw_client(&url).await;
    for round in 0..SHUTDOWN_ROUNDS {
        let client = common::builder().url(&url).build().await.unwrap();
        let (running, mut ran) = tokio::sync::mpsc::unbounded_channel();
        let work_of = |what: &'static str| {
            let running = running.clone();
            async move {
                let _dropped = Dropped(what, round);
                running.send(()).unwrap();
                std::future::pending::<()>().await
            }
        };
        let mut tasks = tokio::task::JoinSet::new();
        {
            let job = client.job_lock("shutdown:job");
            let work = work_of("job");
            tasks.spawn(async move {
                let _ = job.run(work).await;
            });
            let lock = client.lock("shutdown:lock");
            let work = work_of("lock");
            tasks.spawn(async move {
                let _ = lock.with_lock(|_| work).await;
            });
            let leader = client.leader_election("shutdown:leader");
            let work = work_of("leader");
            tasks.spawn(async move {
                let mut work = Some(work);
                let _ = leader
                    .run(|_term| work.take().expect("one term a round"))
                    .await;
            });
        }
        for _ in SHUTDOWN_WORKS {
            ran.recv().await.unwrap();
        }
        let _: () = raw
            .set("shutdown:held", round, None, None, false)
            .await
            .unwrap();
        while raw.get::<Option<u32>, _>("shutdown:waiting").await.unwrap() != Some(round) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        client.shutdown().await;
        while tasks.join_next().await.is_some() {}
        while raw.get::<Option<u32>, _>("shutdown:done").await.unwrap() != Some(round) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// A release wakes one waiting client, not every one (issue 59): eight clients, each its own
/// connections as separate instances have, wait on one lock; the lock passes to each in turn,
/// and Redis runs one acquire script per hand-off, not one per waiting client. With places in
/// line of 30 s, no waiter's own pause (a third of its place) ends within the test: each
/// hand-off is a wake-up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_one_waiting_client_not_all() {
    bounded(async {
        const WAITERS: usize = 8;
        let server = RedisServer::start();
        let raw = server.raw().await;
        let holder = long_places(&server).await;
        let guard = holder.lock("herd").lock().await.unwrap();
        let mut clients = Vec::new();
        for _ in 0..WAITERS {
            clients.push(long_places(&server).await);
        }
        let held = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut waiters = Vec::new();
        for waiting in &clients {
            let lock = waiting.lock("herd");
            let held = held.clone();
            waiters.push(tokio::spawn(async move {
                let guard = lock.lock().await.unwrap();
                assert_eq!(
                    held.fetch_add(1, std::sync::atomic::Ordering::SeqCst),
                    0,
                    "one holder at a time"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
                held.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                guard.unlock().await.unwrap();
            }));
        }
        // Every waiting client stands in line once its first attempt was refused.
        assert!(
            eventually(Duration::from_secs(5), || async {
                let places: i64 = raw.zcard("fredlock_lock_waiters:{herd}").await.unwrap();
                places == WAITERS as i64
            })
            .await,
            "every waiting client in line"
        );
        let before = common::command_calls(&raw).await;
        let released = Instant::now();
        guard.unlock().await.unwrap();
        for waiter in waiters {
            waiter.await.unwrap();
        }
        let took = released.elapsed();
        let ran = common::commands_since(&raw, &before).await;
        let scripts = scripts_among(&ran);
        // A release and an acquire per hand-off, and the first release: 17. Every release
        // waking every waiting client would run 8 + 7 + .. + 1 acquires: 36 more.
        assert!(
            scripts <= 2 * WAITERS as u64 + 1 + 3,
            "one acquire per hand-off, not one per waiting client: {ran:?}"
        );
        assert!(
            took < Duration::from_secs(5),
            "each hand-off woke its next client, none waited out its pause: {took:?}"
        );
        let left: i64 = raw.exists("fredlock_lock_waiters:{herd}").await.unwrap();
        assert_eq!(
            left, 0,
            "the last winner left the line, and nobody else is in it"
        );
        for client in std::iter::once(&holder).chain(&clients) {
            client.shutdown().await;
        }
    })
    .await
}

/// Many tasks of one client waiting on one lock keep the client's place in line with one
/// attempt a third of a place between them, not one each: 20 tasks, places of 600 ms, over
/// 2.4 s, cost Redis about 12 acquire scripts (one each 200 ms), where each task's own would be
/// 240. The place stays kept meanwhile, and the release still reaches a task at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_waiting_tasks_of_a_client_keep_its_place_with_one_attempt_a_third_of_a_place() {
    bounded(async {
        const TASKS: usize = 20;
        let server = RedisServer::start();
        let raw = server.raw().await;
        let holder = common::builder().url(server.url()).build().await.unwrap();
        let guard = holder.lock("kept-place").lock().await.unwrap();
        let place = Duration::from_millis(600);
        let waiting = common::builder()
            .url(server.url())
            .queue_place(place)
            .build()
            .await
            .unwrap();
        let mut tasks = Vec::new();
        for _ in 0..TASKS {
            let lock = waiting.lock("kept-place");
            tasks.push(tokio::spawn(async move {
                lock.lock().await.unwrap().unlock().await.unwrap();
            }));
        }
        assert!(
            eventually(Duration::from_secs(5), || async {
                let places: i64 = raw
                    .zcard("fredlock_lock_waiters:{kept-place}")
                    .await
                    .unwrap();
                places == 1
            })
            .await,
            "the waiting client in line"
        );
        // Every task past its first pause, so that none is still on its first attempts.
        tokio::time::sleep(place).await;
        let before = common::command_calls(&raw).await;
        let window = place * 4;
        tokio::time::sleep(window).await;
        let ran = common::commands_since(&raw, &before).await;
        let scripts = scripts_among(&ran);
        // One a third of a place: 12, with room for timers that fire together.
        assert!(
            scripts <= 2 * 12,
            "one attempt a third of a place from the client, not from each task: {ran:?}"
        );
        let places: i64 = raw
            .zcard("fredlock_lock_waiters:{kept-place}")
            .await
            .unwrap();
        assert_eq!(places, 1, "the client's place kept through the window");
        let released = Instant::now();
        guard.unlock().await.unwrap();
        for task in tasks {
            task.await.unwrap();
        }
        assert!(
            released.elapsed() < place,
            "every task had the lock within a place of the release: {:?}",
            released.elapsed()
        );
        holder.shutdown().await;
        waiting.shutdown().await;
    })
    .await
}

/// The script calls (`EVAL`, `EVALSHA`) among commands counted by `common::commands_since`.
fn scripts_among(ran: &[(String, u64)]) -> u64 {
    ran.iter()
        .filter(|(name, _)| name.starts_with("eval"))
        .map(|(_, calls)| calls)
        .sum()
}

/// A client whose places in line last 30 s: its waiters' own pauses are 10 s.
async fn long_places(server: &RedisServer) -> LockClient {
    common::builder()
        .url(server.url())
        .queue_place(Duration::from_secs(30))
        .build()
        .await
        .unwrap()
}

/// A client a release names when none of its tasks waits any more (its wait given up while its
/// place lasts) passes the wake on: it ends the moment the lock is kept for it and wakes the
/// other waiting clients. With places of 30 s a waiter's own pause is 10 s; the next client
/// gets the lock at once instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_client_that_gave_up_passes_the_wake_on() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let holder = long_places(&server).await;
        let gone = long_places(&server).await;
        let next = long_places(&server).await;
        let guard = holder.lock("passed").lock().await.unwrap();
        // First in line, then gives up: its place stays.
        let given_up = tokio::spawn({
            let lock = gone.lock("passed");
            async move { lock.try_lock(Duration::from_millis(400), None).await }
        });
        let line = "fredlock_lock_waiters:{passed}";
        assert!(
            eventually(Duration::from_secs(5), || async {
                raw.zcard::<i64, _>(line).await.unwrap() == 1
            })
            .await
        );
        let waiting = tokio::spawn({
            let lock = next.lock("passed");
            async move {
                let guard = lock.lock().await.unwrap();
                let got = Instant::now();
                guard.unlock().await.unwrap();
                got
            }
        });
        assert!(
            eventually(Duration::from_secs(5), || async {
                raw.zcard::<i64, _>(line).await.unwrap() == 2
            })
            .await
        );
        assert!(given_up.await.unwrap().unwrap().is_none());
        let released = Instant::now();
        guard.unlock().await.unwrap();
        let got = waiting.await.unwrap();
        assert!(
            got.duration_since(released) < Duration::from_secs(2),
            "the wake was passed on, not waited out ({:?})",
            got.duration_since(released)
        );
        for client in [&holder, &gone, &next] {
            client.shutdown().await;
        }
    })
    .await
}

/// A client that never had to wait for a lock, whose release named a waiting client, does not
/// take the lock back with its next attempt while the lock is kept for that client: its release
/// remembers the hand-over, so that its next first attempt stands in line. (Without the memory
/// that attempt, one round trip ahead of the woken client, takes the lock again and again.) The
/// waiting client here is a place in line with no client behind it, so that nothing races the
/// attempt; once the keeping ends the lock is free for anyone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_whose_release_named_another_does_not_take_the_lock_back() {
    bounded(async {
        const NAMED: i64 = (1 << 52) + 7;
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = long_places(&server).await;
        let lock = client.lock("handed-on");
        let guard = lock.lock().await.unwrap();
        let place_ends = common::server_millis(&raw).await + 30_000;
        let _: i64 = raw
            .zadd(
                "fredlock_lock_waiters:{handed-on}",
                None,
                None,
                false,
                false,
                (place_ends as f64, NAMED),
            )
            .await
            .unwrap();
        guard.unlock().await.unwrap();
        let kept: Option<i64> = raw.get("fredlock_lock_next:{handed-on}").await.unwrap();
        assert_eq!(kept, Some(NAMED), "the release named the waiting client");
        let again = lock
            .try_lock(Duration::from_millis(20), None)
            .await
            .unwrap();
        assert!(
            again.is_none(),
            "the releasing client took back the lock kept for the client it named"
        );
        // The keeping lasts 50 ms; then the lock goes to whoever asks.
        tokio::time::sleep(Duration::from_millis(60)).await;
        let taken = lock
            .try_lock(Duration::from_millis(20), None)
            .await
            .unwrap();
        assert!(taken.is_some(), "the lock is free once the keeping ended");
        client.shutdown().await;
    })
    .await
}

/// Every lock's calls are methods of its own: this module imports no trait (no
/// `fredlock::prelude`), and calls every acquisition of every lock, and every read of the
/// reentrant family, as ARCHITECTURE.md's "Where `lock()` comes from" says.
mod calls_without_an_import {
    use std::time::Duration;

    use super::common::{bounded, connect, RedisServer};
    use fredlock::{MultiLock, RedLock};

    /// Each acquisition of `$lock` once, every guard given back.
    macro_rules! acquire_each_way {
        ($lock:expr) => {{
            let lock = $lock;
            lock.lock().await.unwrap().unlock().await.unwrap();
            let leased = lock.lock_with_lease(Duration::from_secs(5)).await.unwrap();
            leased.unlock().await.unwrap();
            let now = lock.try_lock_now().await.unwrap().expect("free");
            now.unlock().await.unwrap();
            let within = lock.try_lock(Duration::from_secs(1), None).await.unwrap();
            within.expect("free").unlock().await.unwrap();
            assert_eq!(lock.with_lock(|_| async { 7 }).await.unwrap(), 7);
            let ran = lock.try_with_lock(Duration::ZERO, Duration::from_secs(5), |_| async { 8 });
            assert_eq!(ran.await.unwrap(), Some(8));
            lock
        }};
    }

    /// Each read of the reentrant family once, on a lock the current task holds once.
    macro_rules! read_each_way {
        ($lock:expr, $name:expr) => {{
            let lock = $lock;
            assert_eq!(lock.name(), $name);
            let guard = lock.lock().await.unwrap();
            assert!(lock.is_locked().await.unwrap());
            assert!(lock.is_held_by_current_task().await.unwrap());
            assert_eq!(lock.hold_count().await.unwrap(), 1);
            assert!(lock.remaining_lease().await.unwrap().is_some());
            assert_eq!(lock.inspect().await.unwrap().holders.len(), 1);
            assert!(lock.force_unlock().await.unwrap());
            drop(guard);
        }};
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_lock_is_called_without_importing_a_trait() {
        bounded(async {
            let server = RedisServer::start();
            let client = connect(&server.url()).await.unwrap();
            let lock = acquire_each_way!(client.lock("plain"));
            read_each_way!(lock, "plain");
            let fair = acquire_each_way!(client.fair_lock("fair"));
            read_each_way!(fair, "fair");
            let spin = acquire_each_way!(client.spin_lock("spin"));
            read_each_way!(spin, "spin");
            let fenced = acquire_each_way!(client.fenced_lock("fenced"));
            read_each_way!(fenced, "fenced");
            let rw = client.rw_lock("rw");
            read_each_way!(acquire_each_way!(rw.read_lock()), "rw");
            read_each_way!(acquire_each_way!(rw.write_lock()), "rw");
            let multi = MultiLock::new(vec![client.lock("m1"), client.lock("m2")]).unwrap();
            acquire_each_way!(multi);
            let red = RedLock::new(vec![client.clone()], "red").unwrap();
            acquire_each_way!(red);
            client.shutdown().await;
        })
        .await;
    }
}

//! Acceptance tests of the permit semaphore against real `redis-server` processes: leases timed
//! by the server, renewed while their guard lives, returned when their holder dies; Redisson's
//! layout and interop; inspections of leases and ended leases.

mod common;

use std::time::Duration;

use common::{bounded, eventually, server_millis, RedisServer};
use fred::prelude::*;
use fredlock::{Details, Error};
use tokio::time::Instant;

/// The watchdog lease of the tests' clients: the lease of a permit taken without one.
const WATCHDOG: Duration = Duration::from_secs(1);

/// Redisson's score of a permit taken without a lease: `Long.MAX_VALUE / 10000`, which never
/// ends.
const REDISSON_NEVER: f64 = 922_337_203_685_477_f64;

/// Redisson's acquire, replayed: `DECR` of the semaphore `name`'s count and `ZADD` of the permit
/// `id` with the end of its lease (`ends`, ms by the server's clock, or [`REDISSON_NEVER`]).
async fn redisson_acquire(raw: &Client, name: &str, id: fred::types::Value, ends: f64) {
    let _: i64 = raw.decr(name).await.unwrap();
    let _: i64 = raw
        .zadd(
            format!("{{{name}}}:timeout"),
            None,
            None,
            false,
            false,
            (ends, id),
        )
        .await
        .unwrap();
}

/// Helper process for `a_killed_holders_permits_return_within_the_lease`: takes both permits
/// (watchdog leases of 2 s) and waits to be killed.
#[tokio::test]
#[ignore = "run by a_killed_holders_permits_return_within_the_lease as a child process"]
async fn crash_child_holds_permits() {
    let Ok(url) = std::env::var("FREDLOCK_PERMITS_URL") else {
        return;
    };
    let client = common::builder()
        .url(url)
        .watchdog_lease(Duration::from_secs(2))
        .build()
        .await
        .unwrap();
    let semaphore = client.permit_semaphore("crash");
    let _first = semaphore.acquire().await.unwrap();
    let _second = semaphore.acquire().await.unwrap();
    tokio::time::sleep(Duration::from_secs(60)).await;
}

/// 3. A child process holding leased permits (watchdog mode, 2 s) is killed with SIGKILL: a
///    waiter gets them within the lease plus a margin, without any call in between.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holders_permits_return_within_the_lease() {
    bounded(async {
        let server = RedisServer::start();
        let client = server.lock_client(WATCHDOG).await;
        let semaphore = client.permit_semaphore("crash");
        semaphore.try_set_permits(2).await.unwrap();
        let child = common::spawn_test_child(
            "crash_child_holds_permits",
            &[("FREDLOCK_PERMITS_URL", server.url())],
        );
        let raw = server.raw().await;
        let taken = eventually(Duration::from_secs(20), || async {
            raw.zcard::<i64, _>("{crash}:timeout").await.unwrap() == 2
        })
        .await;
        assert!(taken, "the child did not take the permits");
        // Held past a renewal, so that the leases are the child's renewed ones.
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        assert_eq!(semaphore.available_permits().await.unwrap(), 0);
        common::sigkill(child);
        let killed = Instant::now();
        let first = semaphore
            .try_acquire(Duration::from_secs(5), None)
            .await
            .unwrap()
            .expect("a dead holder's permit returns");
        let second = semaphore
            .try_acquire(Duration::from_secs(5), None)
            .await
            .unwrap()
            .expect("both return");
        let margin = Duration::from_millis(500);
        assert!(
            killed.elapsed() <= Duration::from_secs(2) + margin,
            "took {:?}",
            killed.elapsed()
        );
        first.release().await.unwrap();
        second.release().await.unwrap();
        assert_eq!(semaphore.available_permits().await.unwrap(), 2);
    })
    .await;
}

/// 3. A live holder keeps its permit for 5 x the lease: the watchdog renews it, nobody else
///    gets it, and its guard never reports a loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_holder_keeps_its_permit_for_five_leases() {
    bounded(async {
        let server = RedisServer::start();
        let holder = server.lock_client(WATCHDOG).await;
        let other = server.lock_client(WATCHDOG).await;
        let semaphore = holder.permit_semaphore("live");
        semaphore.try_set_permits(1).await.unwrap();
        let permit = semaphore.acquire().await.unwrap();
        assert_eq!(permit.lease(), None);
        let contender = other.permit_semaphore("live");
        let started = Instant::now();
        while started.elapsed() < WATCHDOG * 5 {
            assert!(contender
                .try_acquire(Duration::ZERO, None)
                .await
                .unwrap()
                .is_none());
            assert!(!permit.is_lost());
            tokio::time::sleep(WATCHDOG / 4).await;
        }
        let seen = semaphore.inspect().await.unwrap();
        assert_eq!(seen.holders.len(), 1);
        assert_eq!(seen.holders[0].owner, permit.id());
        let left = seen.holders[0].remaining_lease.expect("a lease");
        assert!(left > WATCHDOG / 2 && left <= WATCHDOG, "{left:?}");
        permit.release().await.unwrap();
        assert!(contender
            .try_acquire(Duration::ZERO, None)
            .await
            .unwrap()
            .is_some());
    })
    .await;
}

/// A fixed lease ends by itself and is never renewed: the guard reports the loss, its release
/// finds nothing, and the permit is available again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_lease_ends_by_itself() {
    bounded(async {
        let server = RedisServer::start();
        let client = server.lock_client(WATCHDOG).await;
        let semaphore = client.permit_semaphore("fixed");
        semaphore.try_set_permits(1).await.unwrap();
        let lease = Duration::from_millis(400);
        let permit = semaphore
            .try_acquire(Duration::ZERO, Some(lease))
            .await
            .unwrap()
            .expect("a permit");
        assert_eq!(permit.lease(), Some(lease));
        let taken = Instant::now();
        tokio::time::timeout(Duration::from_secs(2), permit.lost())
            .await
            .expect("the loss is reported");
        assert!(taken.elapsed() >= lease - Duration::from_millis(50));
        assert!(matches!(permit.release().await, Err(Error::NotHeld { .. })));
        assert_eq!(semaphore.available_permits().await.unwrap(), 1);
    })
    .await;
}

/// `release_by_id` gives back a permit whoever holds it; the holder's guard learns of the loss
/// at the watchdog's next visit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_by_id_gives_a_permit_back_and_its_guard_learns_it() {
    bounded(async {
        let server = RedisServer::start();
        let holder = server.lock_client(WATCHDOG).await;
        let operator = server.lock_client(WATCHDOG).await;
        let semaphore = holder.permit_semaphore("by-id");
        semaphore.try_set_permits(1).await.unwrap();
        let permit = semaphore.acquire().await.unwrap();
        let token = permit.cancellation_token();
        assert!(!token.is_cancelled());
        let other = operator.permit_semaphore("by-id");
        assert!(other.release_by_id(permit.id()).await.unwrap());
        assert!(!other.release_by_id(permit.id()).await.unwrap());
        assert_eq!(other.available_permits().await.unwrap(), 1);
        tokio::time::timeout(WATCHDOG, permit.lost())
            .await
            .expect("the guard learns of the loss within a watchdog period");
        assert!(
            token.is_cancelled(),
            "the permit's cancellation token lags behind lost()"
        );
        assert!(matches!(permit.release().await, Err(Error::NotHeld { .. })));
        assert_eq!(other.available_permits().await.unwrap(), 1);
    })
    .await;
}

/// 6. The layout is Redisson's: the counter at the name, the zset `{name}:timeout` of permit id
///    -> the lease's end by the server's clock, the new count published on `redisson_sc:{name}`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wire_layout_matches_redisson() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = server.lock_client(WATCHDOG).await;
        let (_subscriber, mut messages) =
            common::listen(&server.url(), "redisson_sc:{layout}").await;
        let semaphore = client.permit_semaphore("layout");
        semaphore.try_set_permits(2).await.unwrap();
        let before = server_millis(&raw).await;
        let lease = Duration::from_secs(60);
        let permit = semaphore
            .try_acquire(Duration::ZERO, Some(lease))
            .await
            .unwrap()
            .unwrap();
        let after = server_millis(&raw).await;
        let counter: String = raw.get("layout").await.unwrap();
        assert_eq!(counter, "1");
        let ends: f64 = raw.zscore("{layout}:timeout", permit.id()).await.unwrap();
        let ends = ends as u64;
        assert!(
            ends >= before + 60_000 && ends <= after + 60_000,
            "{before} {ends} {after}"
        );
        assert!(permit
            .id()
            .starts_with(&client.id().hyphenated().to_string()));
        // A name with a hash tag keeps it: Redisson's rule.
        let tagged = client.permit_semaphore("a{b}c");
        tagged.try_set_permits(1).await.unwrap();
        let tagged_permit = tagged.acquire().await.unwrap();
        let found: i64 = raw.zcard("a{b}c:timeout").await.unwrap();
        assert_eq!(found, 1);
        tagged_permit.release().await.unwrap();
        assert!(matches!(
            client.permit_semaphore("a{b").acquire().await,
            Err(Error::InvalidArgument(_))
        ));
        permit.release().await.unwrap();
        let counter: String = raw.get("layout").await.unwrap();
        assert_eq!(counter, "2");
        let published = common::heard(&mut messages, 2).await;
        assert_eq!(
            published,
            vec!["2", "2"],
            "try_set, then the release's count"
        );
    })
    .await;
}

/// 6. A Java client, replayed with the commands Redisson's scripts run: its permits (16-byte
///    ids, its clock) count against fredlock's, its ended lease is given back by fredlock's
///    next acquire, and fredlock's ended leases by its own reclaim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interoperates_with_redisson_replay() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = server.lock_client(WATCHDOG).await;
        let semaphore = client.permit_semaphore("java");
        semaphore.try_set_permits(1).await.unwrap();
        // Redisson's tryAcquire(lease 1 s): DECRBY 1 and ZADD the 16-byte id with its clock's end.
        let java_id: Vec<u8> = (1..=16).collect();
        let now = server_millis(&raw).await;
        let java = fred::types::Value::Bytes(java_id.clone().into());
        redisson_acquire(&raw, "java", java.clone(), (now + 1_000) as f64).await;
        assert!(semaphore
            .try_acquire(Duration::ZERO, None)
            .await
            .unwrap()
            .is_none());
        let seen = semaphore.inspect().await.unwrap();
        assert_eq!(seen.holders.len(), 1);
        assert_eq!(seen.holders[0].owner, "0102030405060708090a0b0c0d0e0f10");
        // Its lease ends: fredlock's waiter takes the permit at that moment.
        let permit = semaphore
            .try_acquire(Duration::from_secs(3), Some(Duration::from_millis(200)))
            .await
            .unwrap()
            .expect("the Java permit's lease ended");
        let remaining: i64 = raw.zcard("{java}:timeout").await.unwrap();
        assert_eq!(remaining, 1, "only fredlock's lease");
        tokio::time::sleep(Duration::from_millis(300)).await;
        // Redisson's reclaim (every one of its scripts starts with it), by its clock.
        let now = server_millis(&raw).await;
        let ended: Vec<String> = raw
            .zrangebyscore("{java}:timeout", 0, now as f64, false, None)
            .await
            .unwrap();
        assert_eq!(ended, vec![permit.id().to_owned()]);
        let _: i64 = raw.zrem("{java}:timeout", ended.clone()).await.unwrap();
        let value: i64 = raw.incr_by("java", ended.len() as i64).await.unwrap();
        assert_eq!(value, 1);
        assert!(matches!(permit.release().await, Err(Error::NotHeld { .. })));
        assert_eq!(semaphore.available_permits().await.unwrap(), 1);

        // Redisson's acquire without a lease: its score is `Long.MAX_VALUE / 10000`, which
        // never ends; an inspection shows it holding with no end.
        redisson_acquire(&raw, "java", java, REDISSON_NEVER).await;
        let seen = semaphore.inspect().await.unwrap();
        let holders: Vec<(&str, Option<Duration>)> = seen
            .holders
            .iter()
            .map(|holder| (holder.owner.as_str(), holder.remaining_lease))
            .collect();
        assert_eq!(
            holders,
            [("0102030405060708090a0b0c0d0e0f10", None)],
            "{seen:?}"
        );
    })
    .await;
}

/// 8. Inspections show the permits available, live leases with their remaining time and ended
///    leases not given back yet (a leak past the grace); `list` finds the semaphore by its
///    leases, and `available_permits` gives the ended ones back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspections_show_leases_and_ended_leases() {
    bounded(async {
        let server = RedisServer::start();
        let client = server.lock_client(WATCHDOG).await;
        let semaphore = client.permit_semaphore("seen");
        semaphore.try_set_permits(3).await.unwrap();
        let live = semaphore.acquire().await.unwrap();
        let short = semaphore
            .try_acquire(Duration::ZERO, Some(Duration::from_millis(100)))
            .await
            .unwrap()
            .unwrap();
        let short_id = short.id().to_owned();
        std::mem::forget(short); // neither released nor dropped: its lease just ends
        tokio::time::sleep(Duration::from_millis(300)).await;

        let seen = semaphore.inspect().await.unwrap();
        assert_eq!(seen.kind, "permit_semaphore");
        assert!(
            matches!(
                seen.details,
                Details::PermitSemaphore {
                    available: Some(1),
                    ..
                }
            ),
            "{:?}",
            seen.details
        );
        assert_eq!(seen.holders.len(), 1);
        assert_eq!(seen.holders[0].owner, live.id());
        assert!(seen.holders[0].remaining_lease.is_some());
        // A permit is one hold.
        assert_eq!(seen.holders[0].count, 1);
        assert_eq!(ended_leases(&seen).len(), 1);
        assert_eq!(ended_leases(&seen)[0].permit, short_id);
        assert!(ended_leases(&seen)[0].ended_ago >= Duration::from_millis(150));

        let listed = client.list("*").await.unwrap();
        assert_eq!(listed.len(), 1, "{listed:?}");
        assert_eq!(listed[0].kind, "permit_semaphore");
        let by_name = client.inspect("seen").await.unwrap().expect("found");
        assert_eq!(ended_leases(&by_name).len(), 1);
        let leaks = client.leaks("*", Duration::from_millis(100)).await.unwrap();
        assert_eq!(leaks.len(), 1, "{leaks:?}");
        assert_eq!(leaks[0].rule, "ended_lease");
        assert!(client
            .leaks("*", fredlock::DEFAULT_LEAK_GRACE)
            .await
            .unwrap()
            .is_empty());
        assert!(matches!(
            client.force_unlock("seen").await,
            Err(Error::InvalidArgument(_))
        ));

        assert_eq!(semaphore.available_permits().await.unwrap(), 2);
        let seen = semaphore.inspect().await.unwrap();
        assert!(ended_leases(&seen).is_empty());
        live.release().await.unwrap();

        // A semaphore never set inspects as empty; one whose counter is of another type is
        // refused, naming it.
        let unset = client.permit_semaphore("unset").inspect().await.unwrap();
        assert!(unset.holders.is_empty(), "{unset:?}");
        let raw = server.raw().await;
        let _: () = raw.hset("hashed", ("a", "b")).await.unwrap();
        assert!(matches!(
            client.permit_semaphore("hashed").inspect().await,
            Err(Error::WrongType { .. })
        ));
    })
    .await;
}

/// `acquire_with_lease` with a valid lease: the permit's lease ends at that time by the server
/// clock, is not renewed, and the permit returns to the semaphore without a release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_lease_ends_on_time_and_gives_the_permit_back() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = server.lock_client(WATCHDOG).await;
        let slots = client.permit_semaphore("fixed-lease");
        assert!(slots.try_set_permits(1).await.unwrap());
        let lease = Duration::from_millis(1500);
        let before = server_millis(&raw).await;
        let permit = slots.acquire_with_lease(lease).await.unwrap();
        let after = server_millis(&raw).await;
        assert_eq!(permit.lease(), Some(lease));
        assert_eq!(slots.available_permits().await.unwrap(), 0);
        let ends: Option<f64> = raw
            .zscore("{fixed-lease}:timeout", permit.id())
            .await
            .unwrap();
        let ends = ends.expect("the lease is recorded") as u64;
        assert!(
            ends >= before + 1500 && ends <= after + 1500,
            "{before} {ends} {after}"
        );
        // Before its end it is still out, though a watchdog renewal (every WATCHDOG / 3) would
        // have come by then.
        tokio::time::sleep(lease / 2).await;
        let available = slots.available_permits().await.unwrap();
        if server_millis(&raw).await < ends {
            assert_eq!(available, 0, "the permit returned before its lease ended");
        }
        // Past its end, it is back without a release.
        let back = eventually(lease * 2, || async {
            slots.available_permits().await.unwrap() == 1
        })
        .await;
        assert!(back, "the permit did not return after its lease");
        drop(permit);
        client.shutdown().await;
    })
    .await;
}

/// A waiter behind a Redisson permit without a lease (no end to wait for) whose release's
/// message never comes still takes the permit: it tries again every third of the watchdog
/// lease (333 ms here) instead of sleeping until the message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_behind_a_permit_without_a_lease_tries_again_without_a_message() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = server.lock_client(WATCHDOG).await;
        let semaphore = client.permit_semaphore("quiet");
        semaphore.try_set_permits(1).await.unwrap();
        // Redisson's acquire without a lease.
        let java_id = "0102030405060708090a0b0c0d0e0f10";
        redisson_acquire(&raw, "quiet", java_id.into(), REDISSON_NEVER).await;
        let waiting = client.permit_semaphore("quiet");
        let waiter = tokio::spawn(async move {
            let won = waiting.try_acquire(Duration::from_secs(10), None).await;
            (won, Instant::now())
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        // Its release with the message lost: the permit back, nothing published.
        let _: i64 = raw.zrem("{quiet}:timeout", java_id).await.unwrap();
        let _: i64 = raw.incr("quiet").await.unwrap();
        let released = Instant::now();
        let (won, at) = waiter.await.unwrap();
        let permit = won.unwrap().expect("the waiter takes the permit");
        // A third of the lease and a round trip, with room for a loaded machine; without the
        // retry it would wait for the end of its 10 s wait.
        assert!(
            at - released < Duration::from_secs(3),
            "{:?}",
            at - released
        );
        permit.release().await.unwrap();
    })
    .await;
}

/// A permit semaphore's inspection's ended leases (none for another kind).
fn ended_leases(seen: &fredlock::Inspection) -> &[fredlock::EndedLease] {
    match &seen.details {
        Details::PermitSemaphore { ended_leases, .. } => ended_leases,
        _ => &[],
    }
}

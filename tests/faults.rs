//! The fault suite: lost replies, stalls, partitions, pauses, connection kills and chaos, each
//! against real redis-servers. Where a critical section is checked, the check lives on a second
//! server that no fault touches, so a failed check is never the fault's own doing.
//! docs/RELIABILITY.md gives what each test proves and the figures it measured.

mod common;
#[path = "common/logs.rs"]
mod logs;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fred::prelude::*;
use fredlock::{Error, LockClient};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use common::chaos::{chaos, Rng};
use common::{bounded, eventually, quiet, KillOnDrop, Kind, RedisServer, StallingProxy};

async fn hold_count(raw: &Client, name: &str, field: &str) -> u32 {
    raw.hget::<Option<u32>, _, _>(name, field)
        .await
        .unwrap()
        .unwrap_or_default()
}

/// Every key left on `raw`'s server, with its type and TTL in ms.
async fn leftovers(raw: &Client) -> Vec<(String, String, i64)> {
    let mut left = Vec::new();
    for key in common::all_keys(raw).await {
        let kind: String = raw.r#type(&key).await.unwrap();
        let ttl: i64 = raw.pttl(&key).await.unwrap();
        left.push((key, kind, ttl));
    }
    left
}

/// What a lock kind keeps for good by design, taken out of `left`: the fenced lock's token
/// counter (Redisson's layout: a string holding a whole number, without expiry).
fn kept_by_design(kind: Kind, left: Vec<(String, String, i64)>) -> Vec<(String, String, i64)> {
    left.into_iter()
        .filter(|(key, kind_of_key, ttl)| {
            !(kind == Kind::Fenced
                && key.starts_with("redisson_lock_token:")
                && kind_of_key == "string"
                && *ttl == -1)
        })
        .collect()
}

/// What may stay behind after faults: fredlock's fence sets, which expire by themselves.
fn only_fences(left: &[(String, String, i64)]) -> bool {
    left.iter()
        .all(|(key, kind, ttl)| key.starts_with("fredlock_fences:") && kind == "set" && *ttl > 0)
}

/// How many request ids of lost replies are fenced for `name`: a lost reply that was sent again
/// (or settled) leaves its id here, so a test whose fault took effect sees at least one.
async fn fenced(raw: &Client, name: &str) -> i64 {
    raw.scard(format!("fredlock_fences:{{{name}}}"))
        .await
        .unwrap()
}

/// Another client takes the lock at once: nothing holds it up.
async fn another_client_takes(server: &RedisServer, kind: Kind, name: &str) {
    let other = common::connect(&server.url()).await.unwrap();
    let taken = kind
        .lock(&other, name)
        .try_lock(Duration::ZERO, None)
        .await
        .unwrap();
    assert!(
        taken.is_some(),
        "another client could not take {name:?} at once"
    );
}

/// Waits until every lost reply of `client` is settled; fails the test after `limit`.
async fn settled(client: &LockClient, limit: Duration) {
    let settled = eventually(limit, || async { client.stats().unsettled == 0 }).await;
    assert!(settled, "lost replies left unsettled: {:?}", client.stats());
}

// 1. A stall longer than the command timeout: the retried acquire takes one hold.
for_each_kind!(stall_past_the_command_timeout_takes_one_hold);

async fn stall_past_the_command_timeout_takes_one_hold(kind: Kind) {
    bounded(async {
        let server = RedisServer::start_with_debug();
        let raw = server.raw().await;
        let sleeper = server.raw().await;
        let locks = common::configured_client(server.url(), |b| {
            b.command_timeout(Duration::from_millis(100))
        })
        .await;
        let lock = kind.lock(&locks, "stalled");
        let field = kind.field(&locks, fredlock::OwnerId::current());
        // A warm script cache, as in a running service: the calls during the stall are EVALSHA
        // that run, not NOSCRIPT replies.
        lock.lock().await.unwrap().unlock().await.unwrap();

        let sleeping = tokio::spawn(async move { common::debug_sleep(&sleeper, 0.6).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let guard = lock.lock().await.unwrap();
        sleeping.await.unwrap();
        assert_eq!(hold_count(&raw, "stalled", &field).await, 1);
        settled(&locks, Duration::from_secs(3)).await;
        assert_eq!(hold_count(&raw, "stalled", &field).await, 1);

        assert!(fenced(&raw, "stalled").await > 0, "no call was sent again");
        guard.unlock().await.unwrap();
        let exists: bool = raw.exists("stalled").await.unwrap();
        assert!(!exists, "unlock after a stalled acquire leaves the lock");
        another_client_takes(&server, kind, "stalled").await;
    })
    .await;
}

// 1. A slow network: for a while every reply comes later than the command timeout.
for_each_kind!(latency_past_the_command_timeout_takes_one_hold);

async fn latency_past_the_command_timeout_takes_one_hold(kind: Kind) {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let proxy = StallingProxy::start(server.port());
        let locks = common::configured_client(proxy.url(), |b| {
            b.command_timeout(Duration::from_millis(150))
        })
        .await;
        let lock = kind.lock(&locks, "slow");
        let field = kind.field(&locks, fredlock::OwnerId::current());
        lock.lock().await.unwrap().unlock().await.unwrap();

        proxy.set_latency(Duration::from_millis(120));
        let healed = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            proxy.set_latency(Duration::ZERO);
            proxy
        });
        let guard = lock.lock().await.unwrap();
        let _proxy = healed.await.unwrap();
        settled(&locks, Duration::from_secs(5)).await;
        assert_eq!(hold_count(&raw, "slow", &field).await, 1);
        guard.unlock().await.unwrap();
        let exists: bool = raw.exists("slow").await.unwrap();
        assert!(!exists);
    })
    .await;
}

// 1. Replies cut by the proxy after the script ran: acquire, re-entry and release each take
// effect once.
for_each_kind!(lost_replies_take_effect_once);

/// A lock of `kind` named `name` on a new server, for a client behind a proxy with the command
/// timeout `timeout`; its scripts cached first, so that what a fault cuts is the script's own
/// reply, not a NOSCRIPT.
struct Proxied {
    server: RedisServer,
    raw: Client,
    proxy: StallingProxy,
    locks: LockClient,
    lock: fredlock::Lock,
    /// The owner field of the test's task.
    field: String,
}

async fn proxied(kind: Kind, name: &str, timeout: Duration) -> Proxied {
    let server = RedisServer::start();
    let raw = server.raw().await;
    let proxy = StallingProxy::start(server.port());
    let locks = common::configured_client(proxy.url(), |b| b.command_timeout(timeout)).await;
    let lock = kind.lock(&locks, name);
    let field = kind.field(&locks, fredlock::OwnerId::current());
    lock.lock().await.unwrap().unlock().await.unwrap();
    quiet(&locks).await;
    Proxied {
        server,
        raw,
        proxy,
        locks,
        lock,
        field,
    }
}

/// Takes `proxied`'s lock named `name`, takes it again, gives one hold back and then the last,
/// each call beside a `fault` started just before it; after each, once the client is quiet, the
/// fault must have `struck` and the server must count the holds the client does; at the end
/// nothing is left unsettled and the lock is gone.
async fn each_call_takes_effect_once<F, S>(
    proxied: &Proxied,
    name: &str,
    fault: impl Fn() -> F,
    struck: impl Fn() -> S,
) where
    F: std::future::Future<Output = ()>,
    S: std::future::Future<Output = bool>,
{
    let Proxied {
        raw,
        locks,
        lock,
        field,
        ..
    } = proxied;
    let struck = &struck;
    let after = |step: &'static str, holds: u32| async move {
        quiet(locks).await;
        assert!(struck().await, "{step}: the fault did not strike");
        assert_eq!(hold_count(raw, name, field).await, holds, "{step}");
    };
    let (_, first) = tokio::join!(fault(), lock.lock());
    let first = first.unwrap();
    after("acquire", 1).await;
    let (_, second) = tokio::join!(fault(), lock.lock());
    let second = second.unwrap();
    after("re-entry", 2).await;
    // A release whose reply was lost is sent again and confirmed.
    let (_, released) = tokio::join!(fault(), second.unlock());
    released.unwrap();
    after("release", 1).await;
    // The last release deleted the lock; sent again, it finds nothing: still released.
    let (_, released) = tokio::join!(fault(), first.unlock());
    released.unwrap();
    after("last release", 0).await;
    assert_eq!(locks.stats().unsettled, 0);
    let exists: bool = raw.exists(name).await.unwrap();
    assert!(!exists, "the last release took effect");
}

async fn lost_replies_take_effect_once(kind: Kind) {
    bounded(async {
        let proxied = proxied(kind, "cut", Duration::from_secs(1)).await;
        let proxy = &proxied.proxy;
        let fault = || async { proxy.lose_next_reply() };
        let struck = || async { !proxy.reply_pending_loss() };
        each_call_takes_effect_once(&proxied, "cut", fault, struck).await;
        let left = kept_by_design(kind, leftovers(&proxied.raw).await);
        assert!(only_fences(&left), "{left:?}");
        assert!(fenced(&proxied.raw, "cut").await > 0, "no reply was lost");
        another_client_takes(&proxied.server, kind, "cut").await;
    })
    .await;
}

// 1. The connection dropped while a call is on the wire, and fred reconnecting under it (what
// the Sentinel watcher's move to a new master does to the calls it finds on their way): fred
// fails the call with the connection's error, or puts it back in its queue and refuses to
// write it twice ("Too many failed write attempts."). Either way the call may have run:
// acquire, re-entry and release each still take effect once. (A `force_reconnection` from
// outside does not strike under a call: fred handles it after the call's reply, so the test
// cuts the connection instead, and checks that every step was struck.)
for_each_kind!(reconnects_under_a_call_take_effect_once);

async fn reconnects_under_a_call_take_effect_once(kind: Kind) {
    let proxied = proxied(kind, "requeued", Duration::from_secs(2)).await;
    // Each way takes 150 ms: a call runs on the server 150 ms after it is sent, and its reply
    // is on the way back when the connection drops at 220 ms.
    proxied.proxy.set_latency(Duration::from_millis(150));
    let reconnect = || async {
        tokio::time::sleep(Duration::from_millis(220)).await;
        proxied.proxy.cut();
        tokio::time::sleep(Duration::from_millis(50)).await;
        proxied.proxy.heal();
    };
    // Struck: the call's outcome was lost, so the call after it (its resend) fenced its id,
    // one more in the lock's fence set at every step.
    let seen = std::cell::Cell::new(0);
    let struck = || async {
        let now = fenced(&proxied.raw, "requeued").await;
        let grew = now > seen.get();
        seen.set(now);
        grew
    };
    each_call_takes_effect_once(&proxied, "requeued", reconnect, struck).await;
    proxied.proxy.set_latency(Duration::ZERO);
    another_client_takes(&proxied.server, kind, "requeued").await;
}

/// 1. Semaphores: an acquire whose reply was lost takes its permits once (the attempt sent again
///    finds its grant, or its lease), and a release whose reply was lost gives them back once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lost_replies_move_permits_once() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let proxy = StallingProxy::start(server.port());
        let client =
            common::configured_client(proxy.url(), |b| b.command_timeout(Duration::from_secs(1)))
                .await;
        let semaphore = client.semaphore("cut-permits");
        semaphore.try_set_permits(5).await.unwrap();
        let leased = client.permit_semaphore("cut-leases");
        leased.try_set_permits(5).await.unwrap();
        let counter = |name: &'static str| {
            let raw = raw.clone();
            async move { raw.get::<i64, _>(name).await.unwrap() }
        };
        // The scripts cached first, so that the reply lost is the script's own, not a NOSCRIPT.
        semaphore.acquire(1).await.unwrap().release().await.unwrap();
        leased.acquire().await.unwrap().release().await.unwrap();

        quiet(&client).await;
        proxy.lose_next_reply();
        let permit = semaphore.acquire(2).await.unwrap();
        assert!(!proxy.reply_pending_loss(), "the acquire's reply was lost");
        assert_eq!(counter("cut-permits").await, 3, "acquire");
        quiet(&client).await;
        proxy.lose_next_reply();
        permit.release().await.unwrap();
        assert!(!proxy.reply_pending_loss(), "the release's reply was lost");
        assert_eq!(counter("cut-permits").await, 5, "release");

        quiet(&client).await;
        proxy.lose_next_reply();
        let lease = leased.acquire().await.unwrap();
        assert!(!proxy.reply_pending_loss());
        assert_eq!(counter("cut-leases").await, 4, "acquire");
        let leases: i64 = raw.zcard("{cut-leases}:timeout").await.unwrap();
        assert_eq!(leases, 1);
        quiet(&client).await;
        proxy.lose_next_reply();
        lease.release().await.unwrap();
        assert!(!proxy.reply_pending_loss());
        assert_eq!(counter("cut-leases").await, 5, "release");

        settled(&client, Duration::from_secs(5)).await;
        let left: Vec<_> = leftovers(&raw)
            .await
            .into_iter()
            .filter(|(key, _, _)| key != "cut-permits" && key != "cut-leases")
            .collect();
        assert!(only_fences(&left), "{left:?}");
        assert!(
            fenced(&raw, "cut-permits").await > 0,
            "no permit reply was lost"
        );
        assert!(
            fenced(&raw, "cut-leases").await > 0,
            "no lease reply was lost"
        );
    })
    .await;
}

/// 1. A fair waiter whose join reply is lost holds one place, and takes the lock once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lost_join_reply_queues_once() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let proxy = StallingProxy::start(server.port());
        let holder = common::connect(&server.url()).await.unwrap();
        let held = holder.fair_lock("line").lock().await.unwrap();

        let locks =
            common::configured_client(proxy.url(), |b| b.command_timeout(Duration::from_secs(1)))
                .await;
        // Its first call of each kind asks for that kind's permissions first: made before, so
        // that the reply lost is the join's.
        common::warmed_up(&raw, &locks).await;
        let warm = locks.fair_lock("warm-up-fair").lock().await.unwrap();
        warm.unlock().await.unwrap();
        let owner = fredlock::OwnerId::unique();
        let waiter = locks.fair_lock("line").with_owner(owner);
        let field = locks.owner_field(owner);
        // The join's own reply: the waiter's subscriber goes through the proxy too, and its
        // reply could come first.
        proxy.lose_reply_to(field.as_bytes());
        let waiting = tokio::spawn(async move { waiter.lock().await });
        assert!(
            eventually(Duration::from_secs(5), || async {
                !proxy.reply_pending_loss()
            })
            .await
        );
        let queue: Vec<String> = raw.lrange(common::queue_key("line"), 0, -1).await.unwrap();
        assert_eq!(queue, vec![field.clone()], "one place in the line");

        held.unlock().await.unwrap();
        let guard = waiting.await.unwrap().unwrap();
        assert_eq!(hold_count(&raw, "line", &field).await, 1);
        guard.unlock().await.unwrap();
        settled(&locks, Duration::from_secs(5)).await;
        assert!(
            fenced(&raw, "line").await > 0,
            "the join's reply was not lost"
        );
        assert!(
            only_fences(&leftovers(&raw).await),
            "{:?}",
            leftovers(&raw).await
        );
    })
    .await;
}

/// 3b. A fair waiter whose wait ends while its granting acquire is on the wire, and whose reply
/// is then lost, leaves no hold behind: its leave fences the lost acquire but cannot say whether
/// it ran, so the settle still gives back the hold it made. (The fair lock's model found this:
/// a leave that counted as a settle left the hold until its lease ended, 30 s here.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiter_that_gives_up_after_a_lost_grant_leaves_no_hold() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let proxy = StallingProxy::start(server.port());
        let holder = common::connect(&server.url()).await.unwrap();
        // A lease that ends without a word: the waiter takes the lock on its own next try.
        let lease = Some(Duration::from_millis(400));
        let held = holder.fair_lock("gone");
        let _held = held.try_lock(Duration::ZERO, lease).await.unwrap().unwrap();

        let locks =
            common::configured_client(proxy.url(), |b| b.command_timeout(Duration::from_secs(2)))
                .await;
        let owner = fredlock::OwnerId::unique();
        let waiter = locks.fair_lock("gone").with_owner(owner);
        let field = locks.owner_field(owner);
        let waiting =
            tokio::spawn(async move { waiter.try_lock(Duration::from_secs(1), None).await });
        let queued = eventually(Duration::from_secs(2), || async {
            let place: Option<f64> = raw
                .zscore(common::timeout_key("gone"), &field)
                .await
                .unwrap();
            place.is_some()
        })
        .await;
        assert!(queued, "the waiter never joined the line");
        // Its first replies (busy, the channel joined) are in; from now on its next try goes
        // to the server late, and its reply comes back late, after the wait has ended.
        tokio::time::sleep(Duration::from_millis(100)).await;
        proxy.set_latency(Duration::from_millis(500));
        let granted = eventually(Duration::from_secs(3), || async {
            hold_count(&raw, "gone", &field).await == 1
        })
        .await;
        assert!(granted, "the waiter's try never reached the server");
        // The grant's reply, on the connection that sent the waiter's scripts: never a ping's
        // or the subscriber's on another that happens to come first.
        assert!(
            proxy.lose_next_reply_on(&[b"EVALSHA", field.as_bytes()])
                || proxy.lose_next_reply_on(&[b"evalsha", field.as_bytes()]),
            "no connection sent the waiter's scripts"
        );
        assert!(
            eventually(Duration::from_secs(3), || async {
                !proxy.reply_pending_loss()
            })
            .await,
            "the grant's reply was not lost"
        );
        proxy.set_latency(Duration::ZERO);
        let outcome = waiting.await.unwrap();
        assert!(
            matches!(outcome, Ok(None)),
            "the wait should have ended: {outcome:?}"
        );
        settled(&locks, Duration::from_secs(5)).await;
        let given_back = eventually(Duration::from_secs(3), || async {
            hold_count(&raw, "gone", &field).await == 0
        })
        .await;
        assert!(
            given_back,
            "the lost grant's hold is still there, PTTL {} ms",
            raw.pttl::<i64, _>("gone").await.unwrap()
        );
        assert!(fenced(&raw, "gone").await > 0, "no reply was lost");
        let next = holder.fair_lock("gone").try_lock_now().await.unwrap();
        assert!(next.is_some(), "the lock is free for the next at once");
    })
    .await;
}

/// 4. A partition longer than the renew deadline: `lost()` fires while Redis still has the lock
/// (PTTL above 0), and the renewal that lands after the partition heals does not bring it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn partition_reports_loss_before_the_lease_ends() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let proxy = StallingProxy::start(server.port());
        let locks = common::configured_client(proxy.url(), |b| {
            b.watchdog_lease(Duration::from_millis(1500))
                .command_timeout(Duration::from_millis(300))
        })
        .await;
        let lock = locks.lock("partitioned");
        let guard = lock.lock().await.unwrap();
        // Let one renewal through, then cut the holder off.
        tokio::time::sleep(Duration::from_millis(600)).await;
        let token = guard.cancellation_token();
        proxy.stall();
        let stalled = Instant::now();
        tokio::time::timeout(Duration::from_secs(3), guard.lost())
            .await
            .expect("lost() fires during the partition");
        // The watchdog gives the renewal up at the same deadline: the token follows at once.
        assert!(
            eventually(Duration::from_millis(100), || async {
                token.is_cancelled()
            })
            .await,
            "the cancellation token lags behind lost()"
        );
        let pttl: i64 = raw.pttl("partitioned").await.unwrap();
        assert!(
            pttl > 0,
            "lost() fired only after the lease ended (PTTL {pttl})"
        );
        let reported_after = stalled.elapsed();

        proxy.resume();
        // Whatever was queued lands now; the loss stands.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(guard.is_lost());
        assert!(matches!(guard.unlock().await, Err(Error::NotHeld { .. })));
        // The lost guard's unlock deleted what a late renewal may have kept alive.
        assert!(
            eventually(Duration::from_millis(500), || async {
                !raw.exists::<bool, _>("partitioned").await.unwrap()
            })
            .await
        );
        println!("partition: lost() {reported_after:?} after the stall, PTTL left {pttl} ms");
    })
    .await;
}

/// 4. Calls queued during a partition that land after it heals leave no phantom hold: an unlock
/// and an acquire that timed out during it, for a lock with a long fixed lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn calls_landing_after_a_partition_leave_no_phantom_hold() {
    calls_landing_after_a_partition(Landing::ReleaseThenAcquire).await;
}

/// 4. The same with one lost call alone, so that each is settled by its own undo rather than by
/// the other's: a release whose reply never came queues a settle when it gives up, and an
/// acquire that gave up with its reply lost queues one as its future ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_release_landing_after_a_partition_is_settled() {
    calls_landing_after_a_partition(Landing::Release).await;
}

/// 4. See [`a_release_landing_after_a_partition_is_settled`].
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_acquire_landing_after_a_partition_is_settled() {
    calls_landing_after_a_partition(Landing::Acquire).await;
}

/// Which calls are sent during the partition of [`calls_landing_after_a_partition`].
#[derive(Clone, Copy, PartialEq)]
enum Landing {
    Release,
    Acquire,
    ReleaseThenAcquire,
}

async fn calls_landing_after_a_partition(landing: Landing) {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let proxy = StallingProxy::start(server.port());
        let locks = common::configured_client(proxy.url(), |b| {
            b.command_timeout(Duration::from_millis(200))
        })
        .await;
        let lock = locks.lock("phantom");
        let guard = lock.lock_with_lease(Duration::from_secs(60)).await.unwrap();
        let guard = if landing == Landing::Acquire {
            guard.unlock().await.unwrap();
            None
        } else {
            Some(guard)
        };

        proxy.stall();
        if let Some(guard) = guard {
            assert!(
                guard.unlock().await.is_err(),
                "the release cannot be confirmed"
            );
        }
        if landing != Landing::Release {
            let attempt = lock
                .try_lock(Duration::from_millis(300), Some(Duration::from_secs(60)))
                .await;
            assert!(!matches!(attempt, Ok(Some(_))), "{attempt:?}");
            drop(attempt);
        }
        // Past the command timeout of every call sent during the partition (an attempt may
        // still be on its way when its wait ends): each reply is lost before the calls land,
        // so none can set things right by itself, and only a settle does.
        tokio::time::sleep(Duration::from_millis(400)).await;
        proxy.resume();

        assert!(
            eventually(Duration::from_secs(10), || async {
                locks.stats().unsettled == 0 && locks.stats().held == 0
            })
            .await,
            "{:?}",
            locks.stats()
        );
        let left = leftovers(&raw).await;
        assert!(only_fences(&left), "a phantom hold was left: {left:?}");
        another_client_takes(&server, Kind::Reentrant, "phantom").await;
    })
    .await;
}

/// A lock client behind a stalling proxy (a 200 ms command timeout) whose hold on `name`, with
/// a 60 s lease, was given back while the proxy stalls: the release's reply is lost and a
/// settle is queued. `before_unlock` runs just before the unlock (a test that pauses tokio's
/// clock does it there: the acquisition needs the real one).
struct LostRelease {
    server: RedisServer,
    proxy: StallingProxy,
    locks: LockClient,
}

async fn lose_a_release(name: &str, before_unlock: impl FnOnce()) -> LostRelease {
    let server = RedisServer::start();
    let proxy = StallingProxy::start(server.port());
    let locks = common::configured_client(proxy.url(), |b| {
        b.command_timeout(Duration::from_millis(200))
    })
    .await;
    let guard = locks
        .lock(name)
        .lock_with_lease(Duration::from_secs(60))
        .await
        .unwrap();
    proxy.stall();
    before_unlock();
    assert!(
        guard.unlock().await.is_err(),
        "the release cannot be confirmed"
    );
    LostRelease {
        server,
        proxy,
        locks,
    }
}

/// 4. A settle that meets a key it must not touch (the lock's name now holds a user's string)
/// gives up at once, leaving the key alone, instead of trying again until its 15 minutes end.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_settle_refused_for_good_gives_up_at_once() {
    bounded(async {
        let LostRelease {
            server,
            proxy,
            locks,
        } = lose_a_release("replaced", || {}).await;
        let raw = server.raw().await;
        // Straight to the server: the name is a user's string by the time anything lands.
        let _: () = raw
            .set("replaced", "mine", None, None, false)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(400)).await;
        proxy.resume();
        assert!(
            eventually(Duration::from_secs(5), || async {
                locks.stats().unsettled == 0 && locks.stats().held == 0
            })
            .await,
            "the settle kept trying: {:?}",
            locks.stats()
        );
        let value: String = raw.get("replaced").await.unwrap();
        assert_eq!(value, "mine");
    })
    .await;
}

/// 4. A settle backs off while Redis does not answer: its pause doubles from 100 ms to 1 s, so
///    3 s of a stall take about five tries (each waits out its 200 ms command timeout), not one
///    every command timeout. The tries are counted from the client's `debug` events, in a
///    process of their own ([`settle_backoff_child`]): a subscriber set for one thread of a test
///    binary misses events whose callsites other tests' threads reached first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settle_backs_off_while_redis_does_not_answer() {
    bounded(async {
        let mut child =
            tokio::process::Command::from(common::test_child("settle_backoff_child", &[]));
        let output = child
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .output()
            .await
            .expect("run the child");
        let printed = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "the child failed: {printed}");
        let tries: usize = printed
            .lines()
            .find_map(|line| line.strip_prefix("settle tries in 3 s: "))
            .and_then(|count| count.trim().parse().ok())
            .unwrap_or_else(|| panic!("no count in: {printed}"));
        // Backing off from 100 ms: 5 failed tries in 3 s where nothing slows the client (fewer
        // where something does); a pause that did not grow made 13.
        assert!((2..=7).contains(&tries), "{tries} settle tries in 3 s");
    })
    .await;
}

/// The child of [`a_settle_backs_off_while_redis_does_not_answer`]: loses a release's reply to
/// a stall, prints how many settle tries failed in the next 3 s, then lets the settle land.
#[tokio::test]
#[ignore = "run by a_settle_backs_off_while_redis_does_not_answer as a child process"]
async fn settle_backoff_child() {
    // One thread, the one the default subscriber is set on: the undo task logs through it.
    let (logged, _default) = logs::capture_logs(tracing::Level::DEBUG);
    bounded(async {
        let LostRelease {
            server: _server,
            proxy,
            locks,
        } = lose_a_release("backoff", || {}).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let tries = logged
            .text()
            .lines()
            .filter(|line| line.contains("settling a lost reply failed; retrying"))
            .count();
        println!("settle tries in 3 s: {tries}");
        proxy.resume();
        assert!(
            eventually(Duration::from_secs(5), || async {
                locks.stats().unsettled == 0
            })
            .await,
            "{:?}",
            locks.stats()
        );
    })
    .await;
}

/// 4. A settle gives up once Redis has not answered for as long as the fences it would set are
///    kept (15 minutes): it forgets the lost reply (the lease ends its effect) instead of trying
///    for ever. The 15 minutes pass on tokio's paused clock, which jumps ahead whenever the
///    client only waits: every try meets its command timeout at once.
#[test]
fn a_settle_gives_up_after_fifteen_minutes_of_outage() {
    // Bounded on the real clock: `bounded`'s timeout would run on the paused one.
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(settle_through_fifteen_minutes_of_outage());
        let _ = done.send(());
    });
    match finished.recv_timeout(common::TEST_LIMIT) {
        Ok(()) => {}
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("test exceeded {:?}", common::TEST_LIMIT)
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => panic!("its body panicked"),
    }
}

async fn settle_through_fifteen_minutes_of_outage() {
    let LostRelease {
        server: _server,
        proxy,
        locks,
    } = lose_a_release("outage", tokio::time::pause).await;
    // The settle starts as the unlock gives up. Its tries end 1.2 s apart (a 200 ms command
    // timeout, then its longest pause), and it gives up at the first that fails within a
    // pause of its 15 minutes: between 1 s before they end and 0.2 s after.
    let started = Instant::now();
    let limit = Duration::from_secs(15 * 60);
    tokio::time::sleep_until(started + limit - Duration::from_millis(1500)).await;
    assert_eq!(locks.stats().unsettled, 1, "gave up before its 15 minutes");
    tokio::time::sleep_until(started + limit + Duration::from_millis(500)).await;
    assert_eq!(
        locks.stats().unsettled,
        0,
        "still trying after its 15 minutes"
    );
    tokio::time::resume();
    proxy.resume();
}

/// 5. The holder child for `paused_holder_learns_of_loss_on_resume`: takes the lock, waits for
/// `lost()`, stamps the server's clock, unlocks, and writes what it saw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by paused_holder_learns_of_loss_on_resume as a child process"]
async fn paused_holder_child() {
    let Ok(url) = std::env::var("FREDLOCK_PAUSE_URL") else {
        return;
    };
    let raw = common::raw_client(&url).await;
    let locks = common::configured_client(url.clone(), |b| {
        b.watchdog_lease(Duration::from_millis(900))
    })
    .await;
    let guard = locks.lock("paused").lock().await.unwrap();
    let _: () = raw.set("child:held", 1, None, None, false).await.unwrap();
    guard.lost().await;
    let lost_at = common::server_millis(&raw).await;
    let unlock = match guard.unlock().await {
        Err(Error::NotHeld { .. }) => "NotHeld".to_string(),
        other => format!("{other:?}"),
    };
    let _: () = raw
        .hset(
            "child:report",
            [("lost_at", lost_at.to_string()), ("unlock", unlock)],
        )
        .await
        .unwrap();
}

/// 5. A holder paused with SIGSTOP past its lease: on resume `lost()` fires at once, its stale
/// unlock returns `NotHeld` and leaves the new holder alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn paused_holder_learns_of_loss_on_resume() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let mut child = KillOnDrop(common::spawn_test_child(
            "paused_holder_child",
            &[("FREDLOCK_PAUSE_URL", server.url())],
        ));
        assert!(
            eventually(Duration::from_secs(20), || async {
                raw.exists::<bool, _>("child:held").await.unwrap()
            })
            .await,
            "the child did not take the lock"
        );
        common::signal(child.0.id(), "STOP");
        let locks = common::connect(&server.url()).await.unwrap();
        let lock = locks.lock("paused");
        let guard = lock
            .try_lock(Duration::from_secs(5), None)
            .await
            .unwrap()
            .expect("the paused holder's lease ends");
        tokio::time::sleep(Duration::from_millis(500)).await;
        let resumed_at = common::server_millis(&raw).await;
        common::signal(child.0.id(), "CONT");

        assert!(
            eventually(Duration::from_secs(10), || async {
                raw.exists::<bool, _>("child:report").await.unwrap()
            })
            .await,
            "the child did not report"
        );
        let report: HashMap<String, String> = raw.hgetall("child:report").await.unwrap();
        let lost_at: u64 = report["lost_at"].parse().unwrap();
        let told_after = lost_at.saturating_sub(resumed_at);
        assert!(
            told_after <= 500,
            "lost() fired {told_after} ms after the resume"
        );
        assert_eq!(report["unlock"], "NotHeld");
        assert_eq!(
            lock.hold_count().await.unwrap(),
            1,
            "the new holder is untouched"
        );
        assert!(guard.unlock().await.is_ok());
        let _ = child.0.wait();
        println!("SIGSTOP: lost() {told_after} ms after SIGCONT");
    })
    .await;
}

/// 2. Reconnects of the subscriber while fair waiters come and go: afterwards the server's
/// subscriptions are the client's, and none are left once the waiters are done.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reconnects_leave_no_subscriptions_behind() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let locks = common::connect(&server.url()).await.unwrap();
        let holder = common::connect(&server.url()).await.unwrap();
        let until = Instant::now() + Duration::from_secs(10);
        let mut tasks = Vec::new();
        for task in 0..16u64 {
            let locks = locks.clone();
            tasks.push(tokio::spawn(async move {
                let mut n = 0u64;
                while Instant::now() < until {
                    let lock = locks.fair_lock(format!("churn-{}", (task + n) % 8));
                    let wait = Duration::from_millis(20 + (task * 37 + n * 13) % 200);
                    if let Ok(Some(guard)) = lock.try_lock(wait, None).await {
                        let _ = guard.unlock().await;
                    }
                    n += 1;
                }
            }));
        }
        let holding = tokio::spawn({
            let holder = holder.clone();
            async move {
                let mut n = 0u64;
                while Instant::now() < until {
                    let lock = holder.fair_lock(format!("churn-{}", n % 8));
                    if let Ok(guard) = lock.lock().await {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        let _ = guard.unlock().await;
                    }
                    n += 1;
                }
            }
        });
        let mut kills = 0;
        let mut rng = Rng(17);
        while Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(100 + rng.below(200))).await;
            // The number of connections killed, not of commands sent.
            if let Ok(killed) = common::client_kill(&raw, "pubsub").await {
                kills += killed;
            }
        }
        for task in tasks {
            task.await.unwrap();
        }
        holding.await.unwrap();
        assert!(kills > 0, "no subscriber connection was ever killed");

        let settled = eventually(Duration::from_secs(4), || async {
            common::pubsub_channels(&raw).await.is_empty() && common::idle(&locks)
        })
        .await;
        assert!(
            settled,
            "after {kills} kills: server channels {:?}, client {:?}",
            common::pubsub_channels(&raw).await,
            locks.stats()
        );
    })
    .await;
}

/// 3. 5 000 acquisitions cancelled at random moments under chaos leave nothing behind, in Redis
/// or in the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancelled_futures_under_chaos_leave_nothing() {
    bounded(async {
        let server = RedisServer::start_with_debug();
        let locks = common::configured_client(server.url(), |b| {
            b.watchdog_lease(Duration::from_secs(2))
                .queue_place(Duration::from_secs(1))
                .command_timeout(Duration::from_millis(500))
        })
        .await;
        let cut = Arc::new(AtomicU64::new(0));
        let won = Arc::new(AtomicU64::new(0));
        let chaos_until = Instant::now() + Duration::from_secs(60);
        let chaos_raw = common::resilient_client(&server.url()).await;
        let stop = CancellationToken::new();
        let chaos = tokio::spawn({
            let stop = stop.clone();
            async move { chaos(chaos_raw, chaos_until, 99, stop).await }
        });
        let mut tasks = Vec::new();
        for task in 0..50u64 {
            let (locks, cut, won) = (locks.clone(), cut.clone(), won.clone());
            tasks.push(tokio::spawn(async move {
                let mut rng = Rng(task + 1);
                for n in 0..100u64 {
                    let kind = if (task + n) % 2 == 0 {
                        Kind::Reentrant
                    } else {
                        Kind::Fair
                    };
                    let lock = kind.lock(&locks, &format!("cancel-{}", rng.below(8)));
                    let cancel_after = Duration::from_millis(rng.below(40));
                    let attempt = async {
                        let guard = if rng.below(2) == 0 {
                            lock.lock().await
                        } else {
                            lock.try_lock(Duration::from_millis(30), None)
                                .await
                                .and_then(|guard| guard.ok_or(Error::Shutdown))
                        };
                        if let Ok(guard) = guard {
                            won.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_millis(2)).await;
                            drop(guard);
                        }
                    };
                    if tokio::time::timeout(cancel_after, attempt).await.is_err() {
                        cut.fetch_add(1, Ordering::Relaxed);
                    }
                    // Spread the 5 000 over about 10 s of chaos.
                    tokio::time::sleep(Duration::from_millis(rng.below(150))).await;
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        stop.cancel();
        let steps = chaos.await.unwrap();
        // Both ways out were taken many times, and the chaos did strike.
        let (cut, won) = (cut.load(Ordering::Relaxed), won.load(Ordering::Relaxed));
        assert!(cut >= 100, "only {cut} of 5000 attempts were cancelled");
        assert!(won >= 100, "only {won} of 5000 attempts took a lock");
        let struck: u32 = steps
            .iter()
            .filter(|(step, _)| **step != "nothing")
            .map(|(_, count)| count)
            .sum();
        assert!(struck > 0, "no chaos step took effect: {steps:?}");

        let settled = eventually(Duration::from_secs(15), || async { common::idle(&locks) }).await;
        assert!(settled, "client still has {:?}", locks.stats());
        let raw = server.raw().await;
        let clean = eventually(Duration::from_secs(10), || async {
            only_fences(&leftovers(&raw).await)
        })
        .await;
        assert!(clean, "left in Redis: {:?}", leftovers(&raw).await);
        println!("cancelled futures: {cut} of 5000 cut short, {won} won, chaos {steps:?}");
    })
    .await;
}

/// The chaos test's worker process: 4 tasks taking reentrant and fair locks (some re-entered),
/// each critical section checked on the untouched checker server.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "run by chaos_keeps_every_promise as a child process"]
async fn chaos_worker() {
    let (Ok(url), Ok(check_url), Ok(millis)) = (
        std::env::var("FREDLOCK_CHAOS_URL"),
        std::env::var("FREDLOCK_CHECK_URL"),
        std::env::var("FREDLOCK_CHAOS_MS"),
    ) else {
        return;
    };
    let me = std::process::id();
    let until = Instant::now() + Duration::from_millis(millis.parse().unwrap());
    let checker = common::raw_client(&check_url).await;
    let locks = common::configured_client(url.clone(), |b| {
        b.watchdog_lease(Duration::from_millis(1500))
            .queue_place(Duration::from_secs(1))
            .command_timeout(Duration::from_millis(500))
    })
    .await;
    let mut tasks = Vec::new();
    for task in 0..4u64 {
        let (locks, checker, url) = (locks.clone(), checker.clone(), url.clone());
        tasks.push(tokio::spawn(async move {
            let sampler = common::resilient_client(&url).await;
            let mut rng = Rng(u64::from(me) * 10 + task + 1);
            let mut longest_wait = Duration::ZERO;
            let mut sections = 0u64;
            while Instant::now() < until {
                let n = rng.below(4);
                let (kind, name) = if rng.below(2) == 0 {
                    (Kind::Reentrant, format!("chaos-r{n}"))
                } else {
                    (Kind::Fair, format!("chaos-f{n}"))
                };
                let lock = kind.lock(&locks, &name);
                let lease = (rng.below(3) == 0).then_some(Duration::from_millis(1500));
                let asked = Instant::now();
                let guard = match lease {
                    Some(lease) => lock.lock_with_lease(lease).await,
                    None => lock.lock().await,
                };
                let Ok(guard) = guard else { continue };
                longest_wait = longest_wait.max(asked.elapsed());
                let inside: i64 = checker.incr(format!("inside:{name}")).await.unwrap();
                if inside != 1 {
                    let _: i64 = checker.incr("violations").await.unwrap();
                }
                let nested = rng.below(4) == 0;
                let inner = if nested { lock.lock().await.ok() } else { None };
                let nesting = 1 + u32::from(inner.is_some());
                let field = guard.owner_field().to_owned();
                if let Ok(Some(count)) = sampler.hget::<Option<u32>, _, _>(&name, &field).await {
                    if count > nesting {
                        let _: i64 = checker.incr("overcounted").await.unwrap();
                    }
                }
                tokio::time::sleep(Duration::from_millis(1 + rng.below(10))).await;
                if let Some(inner) = inner {
                    let _ = inner.unlock().await;
                }
                // Leave the section before the unlock is sent: after it, another may enter.
                let _: i64 = checker.decr(format!("inside:{name}")).await.unwrap();
                let _ = guard.unlock().await;
                sections += 1;
            }
            let _: i64 = checker.incr_by("sections", sections as i64).await.unwrap();
            let _: () = checker
                .hset(
                    "waits",
                    [(format!("{me}:{task}"), longest_wait.as_millis() as u64)],
                )
                .await
                .unwrap();
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    // Every worker done: then nothing of this client may be left, here or on the server.
    let _: i64 = checker.incr("done").await.unwrap();
    let raw = common::raw_client(&url).await;
    let clean = eventually(Duration::from_secs(20), || async {
        let all_done = checker.get::<i64, _>("done").await.unwrap() >= 3;
        all_done && common::idle(&locks) && common::pubsub_channels(&raw).await.is_empty()
    })
    .await;
    let verdict = if clean {
        "clean".to_string()
    } else {
        format!(
            "{:?} {:?}",
            locks.stats(),
            common::pubsub_channels(&raw).await
        )
    };
    let _: () = checker
        .hset("verdicts", [(me.to_string(), verdict)])
        .await
        .unwrap();
    locks.shutdown().await;
}

/// 2. Three processes of four tasks for 30 s, reentrant and fair locks, with connection kills
/// (normal and pub/sub) and server stalls every 100-300 ms: no two sections at once, no hold
/// count above a task's own nesting, no wait longer than the longest lease plus the chaos
/// period, and nothing left over.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_keeps_every_promise() {
    bounded(async {
        let server = RedisServer::start_with_debug();
        let checker = RedisServer::start();
        let check = checker.raw().await;
        let chaos_for = Duration::from_secs(30);
        let mut workers: Vec<KillOnDrop> = (0..3)
            .map(|_| {
                KillOnDrop(common::spawn_test_child(
                    "chaos_worker",
                    &[
                        ("FREDLOCK_CHAOS_URL", server.url()),
                        ("FREDLOCK_CHECK_URL", checker.url()),
                        ("FREDLOCK_CHAOS_MS", chaos_for.as_millis().to_string()),
                    ],
                ))
            })
            .collect();
        let chaos_raw = common::resilient_client(&server.url()).await;
        let steps = chaos(
            chaos_raw,
            Instant::now() + chaos_for,
            7,
            CancellationToken::new(),
        )
        .await;
        let finished = eventually(Duration::from_secs(40), || async {
            check.hlen::<u64, _>("verdicts").await.unwrap() == 3
        })
        .await;
        assert!(finished, "the workers did not finish");
        for worker in &mut workers {
            let _ = worker.0.wait();
        }

        let violations: Option<i64> = check.get("violations").await.unwrap();
        let overcounted: Option<i64> = check.get("overcounted").await.unwrap();
        let sections: i64 = check.get("sections").await.unwrap();
        let waits: HashMap<String, u64> = check.hgetall("waits").await.unwrap();
        let verdicts: HashMap<String, String> = check.hgetall("verdicts").await.unwrap();
        let longest = waits.values().copied().max().unwrap_or_default();
        println!("chaos: {sections} sections, longest wait {longest} ms, steps {steps:?}");
        assert_eq!(violations, None, "two holders at once");
        assert_eq!(overcounted, None, "a hold count above the task's nesting");
        assert!(sections > 300, "only {sections} sections in 30 s");
        assert!(verdicts.values().all(|v| v == "clean"), "{verdicts:?}");
        // The longest lease (1.5 s) plus the chaos period (0.3 s).
        assert!(longest <= 1800, "a waiter waited {longest} ms");
        let left = leftovers(&server.raw().await).await;
        assert!(only_fences(&left), "left in Redis: {left:?}");
    })
    .await;
}

/// An attempt already on the wire is not thrown away (and undone) for being a little late: a
/// single attempt (`try_lock_now`) waits for its reply however long the server takes, and a
/// waiting one up to 100 ms past the end of its wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_reply_to_an_attempt_on_the_wire_is_kept() {
    bounded(async {
        let server = RedisServer::start_with_debug();
        let sleeper = server.raw().await;
        let locks =
            common::configured_client(server.url(), |b| b.command_timeout(Duration::from_secs(2)))
                .await;
        let lock = locks.lock("late");
        // The permission question and the script cache, out of the way.
        lock.lock().await.unwrap().unlock().await.unwrap();

        // A single attempt sent 50 ms into a 300 ms stall.
        let sleeping = tokio::spawn(async move {
            common::debug_sleep(&sleeper, 0.3).await;
            sleeper
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let guard = lock
            .try_lock_now()
            .await
            .unwrap()
            .expect("a single attempt waits for its reply");
        guard.unlock().await.unwrap();
        let sleeper = sleeping.await.unwrap();

        // A wait of 20 ms sent 20 ms into a 60 ms stall: its reply comes about 20 ms after the
        // wait ends, within the grace.
        let sleeping = tokio::spawn(async move { common::debug_sleep(&sleeper, 0.06).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        let guard = lock
            .try_lock(Duration::from_millis(20), None)
            .await
            .unwrap()
            .expect("the reply came within the grace");
        sleeping.await.unwrap();
        guard.unlock().await.unwrap();
        let held: bool = server.raw().await.exists("late").await.unwrap();
        assert!(!held, "given back once");
    })
    .await;
}

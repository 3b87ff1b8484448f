//! The fault suite: lost replies, stalls, partitions, pauses, connection kills and chaos, each
//! against real redis-servers. Where a critical section is checked, the check lives on a second
//! server that no fault touches, so a failed check is never the fault's own doing.
//! docs/RELIABILITY.md gives what each test proves and the figures it measured.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fred::prelude::*;
use fredlock::{Error, LockClient};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use common::history::{check, Call, Checked, History, Op, Outcome, Violation};
use common::{bounded, eventually, KillOnDrop, Kind, RedisServer, StallingProxy};
use fredlock::prelude::*;

async fn client(
    url: String,
    configure: impl FnOnce(fredlock::LockClientBuilder) -> fredlock::LockClientBuilder,
) -> LockClient {
    configure(LockClient::builder().url(url))
        .build()
        .await
        .unwrap()
}

async fn hold_count(raw: &Client, name: &str, field: &str) -> u32 {
    raw.hget::<Option<u32>, _, _>(name, field)
        .await
        .unwrap()
        .unwrap_or_default()
}

/// Waits until `client` is connected again and whatever its reconnect set off (a renewal of
/// every hold) has had its reply, so that the next reply the proxy loses is the test's own.
async fn quiet(client: &LockClient) {
    client.redis().wait_for_connect().await.unwrap();
    let _: String = client.redis().ping(None).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
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
    let other = LockClient::connect(&server.url()).await.unwrap();
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
        let locks = client(server.url(), |b| {
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
        let locks = client(proxy.url(), |b| {
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
    let locks = client(proxy.url(), |b| b.command_timeout(timeout)).await;
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
async fn each_call_takes_effect_once<F: std::future::Future<Output = ()>>(
    proxied: &Proxied,
    name: &str,
    fault: impl Fn() -> F,
    struck: impl Fn() -> bool,
) {
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
        assert!(struck(), "{step}: the fault did not strike");
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
        each_call_takes_effect_once(&proxied, "cut", fault, || !proxy.reply_pending_loss()).await;
        let left = kept_by_design(kind, leftovers(&proxied.raw).await);
        assert!(only_fences(&left), "{left:?}");
        assert!(fenced(&proxied.raw, "cut").await > 0, "no reply was lost");
        another_client_takes(&proxied.server, kind, "cut").await;
    })
    .await;
}

// 1. A reconnect forced while a call is on the wire (what the Sentinel watcher does when the
// master switches): fred fails the call with the connection's error, or puts it back in its
// queue and refuses to write it twice ("Too many failed write attempts."). Either way the call
// may have run: acquire, re-entry and release each still take effect once.
for_each_kind!(reconnects_under_a_call_take_effect_once);

async fn reconnects_under_a_call_take_effect_once(kind: Kind) {
    let proxied = proxied(kind, "requeued", Duration::from_secs(2)).await;
    // Each way takes 150 ms: a call runs on the server 150 ms after it is sent, and its reply
    // is on the way back when the reconnect comes at 220 ms.
    proxied.proxy.set_latency(Duration::from_millis(150));
    let reconnect = || async {
        tokio::time::sleep(Duration::from_millis(220)).await;
        proxied.locks.redis().force_reconnection().await.unwrap();
    };
    each_call_takes_effect_once(&proxied, "requeued", reconnect, || true).await;
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
        let client = client(proxy.url(), |b| b.command_timeout(Duration::from_secs(1))).await;
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
        let holder = LockClient::connect(&server.url()).await.unwrap();
        let held = holder.fair_lock("line").lock().await.unwrap();

        let locks = client(proxy.url(), |b| b.command_timeout(Duration::from_secs(1))).await;
        let owner = fredlock::OwnerId::unique();
        let waiter = locks.fair_lock("line").with_owner(owner);
        let field = locks.owner_field(owner);
        proxy.lose_next_reply();
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
        let holder = LockClient::connect(&server.url()).await.unwrap();
        // A lease that ends without a word: the waiter takes the lock on its own next try.
        let lease = Some(Duration::from_millis(400));
        let held = holder.fair_lock("gone");
        let _held = held.try_lock(Duration::ZERO, lease).await.unwrap().unwrap();

        let locks = client(proxy.url(), |b| b.command_timeout(Duration::from_secs(2))).await;
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
        proxy.lose_next_reply();
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
        let locks = client(proxy.url(), |b| {
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
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let proxy = StallingProxy::start(server.port());
        let locks = client(proxy.url(), |b| {
            b.command_timeout(Duration::from_millis(200))
        })
        .await;
        let lock = locks.lock("phantom");
        let guard = lock.lock_with_lease(Duration::from_secs(60)).await.unwrap();

        proxy.stall();
        assert!(
            guard.unlock().await.is_err(),
            "the release cannot be confirmed"
        );
        let attempt = lock
            .try_lock(Duration::from_millis(300), Some(Duration::from_secs(60)))
            .await;
        assert!(!matches!(attempt, Ok(Some(_))), "{attempt:?}");
        drop(attempt);
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

/// 5. The holder child for `paused_holder_learns_of_loss_on_resume`: takes the lock, waits for
/// `lost()`, stamps the server's clock, unlocks, and writes what it saw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by paused_holder_learns_of_loss_on_resume as a child process"]
async fn paused_holder_child() {
    let Ok(url) = std::env::var("FREDLOCK_PAUSE_URL") else {
        return;
    };
    let raw = common::raw_client(&url).await;
    let locks = client(url.clone(), |b| {
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
        let locks = LockClient::connect(&server.url()).await.unwrap();
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
        let locks = LockClient::connect(&server.url()).await.unwrap();
        let holder = LockClient::connect(&server.url()).await.unwrap();
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

/// A small deterministic generator: tests repeat exactly.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// One chaos step against the lock server, chosen at random.
async fn chaos_step(raw: &Client, rng: &mut Rng) -> &'static str {
    match rng.below(4) {
        0 => {
            let _ = common::client_kill(raw, "normal").await;
            "kill normal"
        }
        1 => {
            let _ = common::client_kill(raw, "pubsub").await;
            "kill pubsub"
        }
        2 => {
            common::debug_sleep(raw, 0.2).await;
            "sleep"
        }
        _ => "nothing",
    }
}

/// Runs the chaos loop against `raw`'s server until `until` or `stop`; returns the steps taken.
async fn chaos(
    raw: Client,
    until: Instant,
    seed: u64,
    stop: CancellationToken,
) -> HashMap<&'static str, u32> {
    let mut rng = Rng(seed);
    let mut steps = HashMap::new();
    while Instant::now() < until && !stop.is_cancelled() {
        tokio::time::sleep(Duration::from_millis(100 + rng.below(200))).await;
        *steps.entry(chaos_step(&raw, &mut rng).await).or_insert(0) += 1;
    }
    steps
}

/// 3. 5 000 acquisitions cancelled at random moments under chaos leave nothing behind, in Redis
/// or in the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancelled_futures_under_chaos_leave_nothing() {
    bounded(async {
        let server = RedisServer::start_with_debug();
        let locks = client(server.url(), |b| {
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
    let locks = client(url.clone(), |b| {
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

/// A token cancelled at `until`.
fn stop_at(until: Instant) -> CancellationToken {
    let stop = CancellationToken::new();
    let cancel = stop.clone();
    tokio::spawn(async move {
        tokio::time::sleep_until(until).await;
        cancel.cancel();
    });
    stop
}

/// A read-write lock's target in the histories is checked as permits: a read hold takes one, a
/// write hold all of them, so a write beside any other hold goes past the count.
const RW_ALL: u32 = 1000;

/// How many holds each history target allows at once (any other: one).
fn history_limits() -> HashMap<String, u32> {
    HashMap::from([("h-permits".to_string(), 2), ("h-rw".to_string(), RW_ALL)])
}

/// One worker of `histories_under_chaos_show_no_overlap`: takes locks, a fenced lock, the
/// permit semaphore, a fair lock, a read-write lock (reading or writing) and job ticks at
/// random until `stop`, recording every operation, and the moment a hold's `lost()` fires if
/// it does while held.
async fn history_worker(
    history: History,
    client: LockClient,
    who: String,
    seed: u64,
    stop: CancellationToken,
    work_ms: u64,
) {
    let mut rng = Rng(seed);
    while !stop.is_cancelled() {
        let work = Duration::from_millis(1 + rng.below(work_ms));
        let wait = Duration::from_millis(200 + rng.below(800));
        let lease = (rng.below(3) == 0).then_some(Duration::from_millis(1500));
        let hold = Hold {
            history: &history,
            who: &who,
            work,
        };
        match rng.below(8) {
            0 | 1 => {
                let name = format!("h-lock-{}", rng.below(2));
                let lock = client.lock(&name);
                let call = lock.try_lock(wait, lease);
                hold.run(&name, 1, call, |_| None, |g| g.is_lost(), |g| g.unlock())
                    .await;
            }
            2 | 3 => {
                let lock = client.fenced_lock("h-fenced");
                let call = lock.try_lock(wait, lease);
                let token = |guard: &fredlock::FencedGuard| Some(guard.token());
                hold.run("h-fenced", 1, call, token, |g| g.is_lost(), |g| g.unlock())
                    .await;
            }
            4 => {
                let permits = client.permit_semaphore("h-permits");
                let call = permits.try_acquire(wait, lease);
                hold.run(
                    "h-permits",
                    1,
                    call,
                    |_| None,
                    |p| p.is_lost(),
                    |p| p.release(),
                )
                .await;
            }
            5 => {
                let lock = client.fair_lock("h-fair");
                let call = lock.try_lock(wait, lease);
                hold.run("h-fair", 1, call, |_| None, |g| g.is_lost(), |g| g.unlock())
                    .await;
            }
            6 => {
                let lock = client.rw_lock("h-rw").read_lock();
                let call = lock.try_lock(wait, lease);
                hold.run("h-rw", 1, call, |_| None, |g| g.is_lost(), |g| g.unlock())
                    .await;
            }
            _ => {
                let lock = client.rw_lock("h-rw").write_lock();
                let call = lock.try_lock(wait, lease);
                hold.run(
                    "h-rw",
                    RW_ALL,
                    call,
                    |_| None,
                    |g| g.is_lost(),
                    |g| g.unlock(),
                )
                .await;
            }
        }
    }
}

/// One history worker's hold: what it records under, and how long it works while it holds.
struct Hold<'a> {
    history: &'a History,
    who: &'a str,
    work: Duration,
}

impl Hold<'_> {
    /// Takes `target` with `call` (recorded with `permits` of its count and the guard's
    /// `token`), works while the hold stands (`is_lost`), then gives it back with `release`
    /// (recorded); nothing when the call took nothing.
    async fn run<G, E: std::fmt::Debug, R, F>(
        &self,
        target: &str,
        permits: u32,
        call: impl std::future::Future<Output = Result<Option<G>, E>>,
        token: impl Fn(&G) -> Option<u64>,
        is_lost: impl Fn(&G) -> bool,
        release: R,
    ) where
        R: FnOnce(G) -> F,
        F: std::future::Future<Output = Result<(), E>>,
    {
        let (history, who) = (self.history, self.who);
        let asked = history.now();
        let (id, guard) = history.acquire(who, target, permits, call, token).await;
        let Some(guard) = guard else { return };
        let work = self.work;
        work_while_held(history, id, who, target, asked, work, || is_lost(&guard)).await;
        history.release(id, who, target, release(guard)).await;
    }
}

/// Works as the holder of hold `id` for `work`, finding the hold standing (`is_lost()` false)
/// before every step of at most 5 ms; if it finds it lost, records that its owner believed it
/// held until the last step that found it standing. The owner acts as holder only in steps that
/// found it standing: a process paused between two steps did nothing as a holder while paused,
/// and its first step after the pause finds the hold lost if its renew deadline passed (the
/// guard compares the deadline with the clock, whatever the watchdog has done since).
///
/// A hold found lost by its first step never stood (its owner was paused between the call's
/// answer and that step, past its renew deadline): its loss is recorded at `asked`, an instant
/// before the acquisition returned, so it holds for no time.
async fn work_while_held(
    history: &History,
    id: u64,
    who: &str,
    name: &str,
    asked: Duration,
    work: Duration,
    is_lost: impl Fn() -> bool,
) {
    let until = Instant::now() + work;
    let mut standing = asked;
    loop {
        if is_lost() {
            history.lost_at(id, who, name, standing);
            return;
        }
        standing = history.now();
        let now = Instant::now();
        if now >= until {
            return;
        }
        tokio::time::sleep((until - now).min(Duration::from_millis(5))).await;
    }
}

/// A history client's settings: a watchdog lease of 1.5 s (renew deadline 1 s), queue places of
/// 1 s, a command timeout of 500 ms.
fn history_settings(builder: fredlock::LockClientBuilder) -> fredlock::LockClientBuilder {
    builder
        .watchdog_lease(Duration::from_millis(1500))
        .queue_place(Duration::from_secs(1))
        .command_timeout(Duration::from_millis(500))
}

/// Three clients (the `c`-th at `url(c)`) of three `history_worker` tasks each, holding for up
/// to `work_ms`, and one `history_ticks` instance each, recording into `history` until `stop`;
/// the first client sets the permit semaphore's 2 permits. `configure` adds to each client's
/// settings.
async fn history_clients(
    history: &History,
    url: impl Fn(u64) -> String,
    stop: &CancellationToken,
    seed: u64,
    work_ms: u64,
    configure: fn(fredlock::LockClientBuilder) -> fredlock::LockClientBuilder,
) -> (Vec<LockClient>, Vec<tokio::task::JoinHandle<()>>) {
    let mut clients = Vec::new();
    let mut tasks = Vec::new();
    for c in 0..3u64 {
        let locks = client(url(c), |b| configure(history_settings(b))).await;
        if c == 0 {
            assert!(locks
                .permit_semaphore("h-permits")
                .try_set_permits(2)
                .await
                .unwrap());
        }
        for t in 0..3u64 {
            tasks.push(tokio::spawn(history_worker(
                history.clone(),
                locks.clone(),
                format!("c{c}/t{t}"),
                seed + c * 10 + t,
                stop.clone(),
                work_ms,
            )));
        }
        tasks.push(tokio::spawn(history_ticks(
            history.clone(),
            locks.clone(),
            format!("c{c}/job"),
            stop.clone(),
        )));
        clients.push(locks);
    }
    (clients, tasks)
}

/// One instance of a scheduled job for `histories_under_chaos_show_no_overlap`: runs every
/// 100 ms tick with `run_tick`, recording each run (a tick must run once, anywhere).
async fn history_ticks(history: History, client: LockClient, who: String, stop: CancellationToken) {
    // A run takes 5 ms. A release that a failover undoes (README: "a release not confirmed
    // may be undone by a failover until the lock's lease ends") keeps the job until then.
    let job = client.job_lock("h-job").at_most_for(Duration::from_secs(2));
    let period = 100u64;
    while !stop.is_cancelled() {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        let tick = now / period * period;
        let at = std::time::UNIX_EPOCH + Duration::from_millis(tick);
        let id = history.id();
        let invoke = history.now();
        let run = job
            .run_tick(at, tokio::time::sleep(Duration::from_millis(5)))
            .await;
        history.record(Op {
            id,
            client: who.clone(),
            target: "h-job".into(),
            call: Call::Run { tick },
            invoke,
            ret: history.now(),
            outcome: match run {
                Ok(run) if run.is_ran() => Outcome::Ok,
                Ok(_) => Outcome::Refused,
                Err(error) => Outcome::Failed(error.to_string()),
            },
            token: None,
        });
        tokio::time::sleep(Duration::from_millis(
            period + 7 - (now % period).min(period),
        ))
        .await;
    }
}

/// 4. Histories (issue 35): three clients of three tasks each take two locks, a fenced lock, a
/// permit semaphore of 2 permits, a fair lock and a read-write lock (reading or writing), and
/// run a job every 100 ms tick, for 12 s while connections
/// are killed and the server stalls, and the third client's replies are lost, its connection
/// stalled and cut by a proxy; every operation is recorded with its invoke and return
/// instants, and the checker finds no two holds of a lock at once (a hold ends at its release's
/// invoke or its `lost()`), no write beside another hold, no token below one returned earlier,
/// never more than 2 permits out, and no tick run twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn histories_under_chaos_show_no_overlap() {
    bounded(async {
        let server = RedisServer::start_with_debug();
        // The third client talks through a proxy that loses replies, stalls and cuts.
        let proxy = std::sync::Arc::new(StallingProxy::start(server.port()));
        let history = History::new();
        let until = Instant::now() + Duration::from_secs(12);
        let urls = |c| if c == 2 { proxy.url() } else { server.url() };
        let (clients, tasks) = history_clients(&history, urls, &stop_at(until), 1, 10, |b| b).await;
        let network = tokio::spawn({
            let proxy = proxy.clone();
            async move {
                let mut rng = Rng(23);
                let mut steps: HashMap<&'static str, u32> = HashMap::new();
                while Instant::now() < until {
                    tokio::time::sleep(Duration::from_millis(150 + rng.below(200))).await;
                    let step = match rng.below(4) {
                        0 => {
                            proxy.lose_next_reply();
                            "lose a reply"
                        }
                        1 => {
                            proxy.stall();
                            tokio::time::sleep(Duration::from_millis(100 + rng.below(500))).await;
                            proxy.resume();
                            "stall"
                        }
                        2 => {
                            proxy.cut();
                            tokio::time::sleep(Duration::from_millis(50 + rng.below(200))).await;
                            proxy.heal();
                            "cut"
                        }
                        _ => "nothing",
                    };
                    *steps.entry(step).or_insert(0) += 1;
                }
                steps
            }
        });
        let steps = chaos(
            common::resilient_client(&server.url()).await,
            until,
            11,
            CancellationToken::new(),
        )
        .await;
        let network = network.await.unwrap();
        for task in tasks {
            task.await.unwrap();
        }
        let ops = history.ops();
        let checked =
            check(&ops, &history_limits()).unwrap_or_else(|violation| panic!("{violation}"));
        let failed = ops
            .iter()
            .filter(|op| matches!(op.outcome, Outcome::Failed(_)))
            .count();
        println!(
            "histories: {} operations ({failed} failed), {checked:?}, chaos {steps:?}, \
             network {network:?}",
            ops.len()
        );
        assert!(checked.holds > 300, "{checked:?}");
        assert!(checked.tokens > 50 && checked.runs > 50, "{checked:?}");
        for client in clients {
            client.shutdown().await;
        }
    })
    .await;
}

/// The child of `histories_under_pauses_show_no_overlap`: one client (`history_settings`) at
/// `FREDLOCK_HISTORY_URL` of three `history_worker` tasks and a `history_ticks` instance for
/// `FREDLOCK_HISTORY_MS`, then its history on stdout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by histories_under_pauses_show_no_overlap as a child process"]
async fn history_child() {
    let (Ok(url), Ok(run_ms)) = (
        std::env::var("FREDLOCK_HISTORY_URL"),
        std::env::var("FREDLOCK_HISTORY_MS"),
    ) else {
        return;
    };
    let history = History::new();
    let stop = stop_at(Instant::now() + Duration::from_millis(run_ms.parse().unwrap()));
    let locks = client(url, history_settings).await;
    let mut tasks = Vec::new();
    for t in 0..3u64 {
        let who = format!("child/t{t}");
        let worker = history_worker(
            history.clone(),
            locks.clone(),
            who,
            100 + t,
            stop.clone(),
            50,
        );
        tasks.push(tokio::spawn(worker));
    }
    let ticks = history_ticks(history.clone(), locks.clone(), "child/job".into(), stop);
    tasks.push(tokio::spawn(ticks));
    for task in tasks {
        task.await.unwrap();
    }
    locks.shutdown().await;
    print!("{}", history.lines());
}

/// 4d. Histories under pauses: three clients in this process, and a fourth in a child process
/// that is stopped (SIGSTOP) for 0.3–2.3 s at random moments, often past its renew deadline
/// (1 s) and its lease (1.5 s), while all four take the locks, the fenced lock, the permits,
/// the fair and the read-write lock and the job ticks; the checker finds no two holds at once, no token out of order, no third
/// permit and no tick twice. A hold ends where its owner last found it standing before it
/// learnt of the loss (`work_while_held`): a stopped process does nothing as a holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn histories_under_pauses_show_no_overlap() {
    bounded(async {
        let server = RedisServer::start();
        let history = History::new();
        let run = Duration::from_secs(12);
        let until = Instant::now() + run;
        let url = |_| server.url();
        let (clients, tasks) = history_clients(&history, url, &stop_at(until), 31, 10, |b| b).await;
        let env = [
            ("FREDLOCK_HISTORY_URL", server.url()),
            ("FREDLOCK_HISTORY_MS", run.as_millis().to_string()),
        ];
        let mut child = KillOnDrop(
            common::test_child("history_child", &env)
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap(),
        );
        let pid = child.0.id();
        let mut stdout = child.0.stdout.take().unwrap();
        let output = tokio::task::spawn_blocking(move || {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut stdout, &mut text).map(|_| text)
        });
        // Started, connected and taking locks before the first pause.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let mut rng = Rng(37);
        let mut pauses = Vec::new();
        while Instant::now() + Duration::from_millis(1500) < until {
            tokio::time::sleep(Duration::from_millis(200 + rng.below(600))).await;
            let pause = Duration::from_millis(300 + rng.below(2000));
            common::signal(pid, "STOP");
            tokio::time::sleep(pause).await;
            common::signal(pid, "CONT");
            pauses.push(pause.as_millis() as u64);
        }
        for task in tasks {
            task.await.unwrap();
        }
        let output = tokio::time::timeout(Duration::from_secs(30), output)
            .await
            .expect("the child ends")
            .unwrap()
            .unwrap();
        let status = child.0.wait().unwrap();
        assert!(status.success(), "the child failed: {status:?}");
        let joined = history.join_lines(&output);
        let ops = history.ops();
        let checked =
            check(&ops, &history_limits()).unwrap_or_else(|violation| panic!("{violation}"));
        let child_ops = |call: Call| {
            ops.iter()
                .filter(|op| op.client.starts_with("child") && op.call == call)
                .filter(|op| op.outcome == Outcome::Ok)
                .count()
        };
        let (child_holds, child_losses) = (
            child_ops(Call::Acquire { permits: 1 }),
            child_ops(Call::Lost),
        );
        println!(
            "pauses: {} operations ({joined} from the paused child: {child_holds} holds, \
             {child_losses} lost), {checked:?}, pauses of {pauses:?} ms",
            ops.len()
        );
        assert!(pauses.len() >= 4, "{pauses:?}");
        assert!(
            child_holds > 20,
            "the paused child held too little: {child_holds}"
        );
        assert!(
            child_losses > 0,
            "no pause outlasted a hold's renew deadline"
        );
        assert!(
            checked.holds > 200 && checked.tokens > 20 && checked.runs > 50,
            "{checked:?}"
        );
        for client in clients {
            client.shutdown().await;
        }
    })
    .await;
}

/// Three clients of three tasks take the locks (each hold lasting up to `work_ms`), the fenced
/// lock, the permits, the fair and the read-write lock and the job ticks for 12 s while the lock server is killed (SIGKILL) and
/// restarted on the same port and directory every 1.5 s or so, each time the moment an
/// acquisition has returned (or after 0.5 s without one), persisting (`appendfsync always`) or
/// not; what the history checker says, how many crashes there were and how many came right
/// after an acquisition.
async fn history_across_crashes(
    persist: bool,
    work_ms: u64,
) -> (Result<Checked, Violation>, u32, u32, Vec<Op>) {
    let persistence: &[&str] = if persist {
        &["--appendonly", "yes", "--appendfsync", "always"]
    } else {
        &["--appendonly", "no"]
    };
    let mut server = RedisServer::start_with(persistence, common::free_port);
    let url = server.url();
    let run_id = |raw: Client| async move {
        let info: String = raw.info(Some(fred::types::InfoKind::Server)).await.unwrap();
        info.lines()
            .find_map(|line| line.strip_prefix("run_id:"))
            .unwrap()
            .trim()
            .to_owned()
    };
    let first_run = run_id(server.raw().await).await;
    let history = History::new();
    let until = Instant::now() + Duration::from_secs(12);
    let stop = stop_at(until);
    let (clients, tasks) =
        history_clients(&history, |_| url.clone(), &stop, 100, work_ms, |b| b).await;
    let mut acquisitions = history.acquisitions();
    let (mut crashes, mut right_after) = (0, 0);
    while Instant::now() + Duration::from_millis(1500) < until {
        tokio::time::sleep(Duration::from_secs(1)).await;
        acquisitions.borrow_and_update();
        let after = tokio::time::timeout(Duration::from_millis(500), acquisitions.changed())
            .await
            .is_ok();
        // SIGKILL, then the same port and directory.
        tokio::task::block_in_place(|| server.start_again());
        crashes += 1;
        right_after += u32::from(after);
    }
    assert_ne!(run_id(server.raw().await).await, first_run, "restarted");
    let (verdict, ops) = history_checked(&history, clients, tasks).await;
    (verdict, crashes, right_after, ops)
}

/// Waits for `history_clients`' tasks to end (they stop at their token), shuts the clients down
/// and checks the history: what the checker says, and the operations.
async fn history_checked(
    history: &History,
    clients: Vec<LockClient>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
) -> (Result<Checked, Violation>, Vec<Op>) {
    for task in tasks {
        task.await.unwrap();
    }
    for client in clients {
        client.shutdown().await;
    }
    let ops = history.ops();
    (check(&ops, &history_limits()), ops)
}

/// 5. Histories across server crashes (issue 35): persisting with `appendfsync always`, every
/// hold survives the restart or is known lost, so the history shows no two holds at once, no
/// token out of order, no third permit and no tick twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn histories_across_server_crashes_show_no_overlap() {
    bounded(async {
        let (verdict, crashes, right_after, ops) = history_across_crashes(true, 400).await;
        let checked = verdict.unwrap_or_else(|violation| panic!("{violation}"));
        let failed = ops
            .iter()
            .filter(|op| matches!(op.outcome, Outcome::Failed(_)))
            .count();
        println!(
            "histories across {crashes} crashes ({right_after} right after an acquisition): \
             {} operations ({failed} failed), {checked:?}",
            ops.len()
        );
        assert!(crashes >= 6, "{crashes} crashes");
        assert!(right_after >= 3, "{right_after} right after an acquisition");
        assert!(checked.holds > 100 && checked.tokens > 20, "{checked:?}");
    })
    .await;
}

/// The negative control of the crash histories: without persistence a restart forgets the
/// holds and the ticks, another client takes a lock its holder still works under (holds of up
/// to 1 s here, so that one outlives the restart), and the checker shows it: the hazard of a
/// server that keeps nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_persistence_a_crash_shows_two_holders_in_the_history() {
    bounded(shows_a_violation(|| async {
        let (verdict, crashes, right_after, _) = history_across_crashes(false, 1000).await;
        let run = format!(
            "{crashes} crashes ({right_after} right after an acquisition) without persistence"
        );
        (verdict, run)
    }))
    .await;
}

/// A negative control's runs: whether a fault lands where it shows is chance (a holder that
/// renews first learns its loss in time), so `run` is made up to three times until the checker
/// finds a violation (two holders at once, a token out of order, permits past their count or a
/// tick run twice: whichever target it reads first), printed with what `run` says of itself;
/// one such run is the proof, three clean runs fail the test.
async fn shows_a_violation<F, Run>(mut run: F)
where
    F: FnMut() -> Run,
    Run: std::future::Future<Output = (Result<Checked, Violation>, String)>,
{
    let mut clean = Vec::new();
    for _ in 0..3 {
        match run().await {
            (Err(violation), what) => {
                println!("across {what}: {violation}");
                return;
            }
            (Ok(checked), what) => clean.push(format!("{what}: {checked:?}")),
        }
    }
    panic!("no violation in three runs: {clean:?}");
}

/// The negative control of the history checker on real runs: a client that ignores its loss
/// (works on past a 150 ms lease while another takes the lock) shows as two holds at once, with
/// the stretch of history that shows it; the same run recording the loss is clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_that_ignores_its_loss_shows_in_the_history() {
    bounded(async {
        let server = RedisServer::start();
        for careful in [false, true] {
            let history = History::new();
            let (a, b) = (
                server.lock_client(Duration::from_secs(10)).await,
                server.lock_client(Duration::from_secs(10)).await,
            );
            let lock = a.lock("h-careless");
            let (id, guard) = history
                .acquire(
                    "a",
                    "h-careless",
                    1,
                    async {
                        lock.lock_with_lease(Duration::from_millis(150))
                            .await
                            .map(Some)
                    },
                    |_| None,
                )
                .await;
            let guard = guard.unwrap();
            let other = tokio::spawn({
                let history = history.clone();
                let lock = b.lock("h-careless");
                async move {
                    let (id, guard) = history
                        .acquire(
                            "b",
                            "h-careless",
                            1,
                            lock.try_lock(Duration::from_secs(2), None),
                            |_| None,
                        )
                        .await;
                    let guard = guard.expect("taken after the lease");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    history.release(id, "b", "h-careless", guard.unlock()).await;
                }
            });
            // Works for 400 ms; a careful worker stops believing at `lost()`.
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(400)) => {}
                _ = guard.lost(), if careful => history.lost(id, "a", "h-careless"),
            }
            if careful {
                tokio::time::sleep(Duration::from_millis(400)).await;
            }
            other.await.unwrap();
            history.release(id, "a", "h-careless", guard.unlock()).await;
            let verdict = check(&history.ops(), &HashMap::new());
            match (careful, verdict) {
                (true, Ok(checked)) => assert_eq!(checked.holds, 2),
                (false, Err(violation)) => {
                    println!("{violation}");
                    assert!(violation.what.contains("at once"), "{violation}");
                    let clients: Vec<&str> = violation
                        .window
                        .iter()
                        .map(|op| op.client.as_str())
                        .collect();
                    assert!(
                        clients.contains(&"a") && clients.contains(&"b"),
                        "{violation}"
                    );
                }
                (careful, verdict) => panic!("careful {careful}: {verdict:?}"),
            }
            a.shutdown().await;
            b.shutdown().await;
        }
    })
    .await;
}

/// The history checker on histories written by hand: a clean one passes; two holds at once,
/// a third permit of two, a token below one returned earlier and a tick run twice each fail,
/// naming what and showing the operations that show it.
#[test]
fn the_history_checker_finds_what_it_must() {
    let ms = Duration::from_millis;
    let op = |id, client: &str, target: &str, call, invoke, ret, token| Op {
        id,
        client: client.into(),
        target: target.into(),
        call,
        invoke: ms(invoke),
        ret: ms(ret),
        outcome: Outcome::Ok,
        token,
    };
    let acquire = Call::Acquire { permits: 1 };
    // a holds 10..20 (released at 20), b acquires at 15 and returns at 21: clean.
    let clean = vec![
        op(1, "a", "l", acquire, 0, 10, Some(1)),
        op(1, "a", "l", Call::Release, 20, 22, None),
        op(2, "b", "l", acquire, 15, 21, Some(2)),
        op(2, "b", "l", Call::Lost, 30, 30, None),
        op(3, "c", "l", acquire, 25, 31, Some(3)),
        op(3, "c", "l", Call::Release, 40, 41, None),
        op(4, "a", "job", Call::Run { tick: 100 }, 0, 5, None),
        op(5, "b", "job", Call::Run { tick: 200 }, 0, 5, None),
    ];
    let none = HashMap::new();
    assert_eq!(
        check(&clean, &none).unwrap(),
        common::history::Checked {
            holds: 3,
            tokens: 3,
            runs: 2
        }
    );
    // b returns at 18, before a's release is invoked at 20: two holds at once.
    let mut overlap = clean.clone();
    overlap[2].ret = ms(18);
    let violation = check(&overlap, &none).unwrap_err();
    println!("{violation}");
    assert!(
        violation.what.contains("holds 1 and 2 at once"),
        "{violation}"
    );
    assert!(violation
        .window
        .iter()
        .any(|op| op.id == 1 && op.call == Call::Release));
    assert!(!violation.window.iter().any(|op| op.target == "job"));
    // Three holds of a two-permit semaphore.
    let permits = HashMap::from([("l".to_string(), 2)]);
    let mut three = clean.clone();
    three[2].ret = ms(18);
    three[4].ret = ms(19);
    three[1].invoke = ms(35);
    three[3].invoke = ms(36);
    let violation = check(&three, &permits).unwrap_err();
    assert!(violation.what.contains("3 permits of 2"), "{violation}");
    assert_eq!(check(&overlap, &permits).map(|c| c.holds).ok(), Some(3));
    // c is invoked at 25, after a's acquisition returned token 1 at 10: token 1 again is wrong.
    let mut tokens = clean.clone();
    tokens[4].token = Some(1);
    let violation = check(&tokens, &none).unwrap_err();
    assert!(
        violation.what.contains("token 1 given after token 2"),
        "{violation}"
    );
    // The same tick run by two instances.
    let mut twice = clean.clone();
    twice[7].call = Call::Run { tick: 100 };
    let violation = check(&twice, &none).unwrap_err();
    assert!(violation.what.contains("tick 100 ran twice"), "{violation}");
    // A read-write lock, as the histories check it: two reads at once are clean, a write
    // beside a read is not.
    let rw = HashMap::from([("l".to_string(), RW_ALL)]);
    assert_eq!(check(&overlap, &rw).map(|c| c.holds).ok(), Some(3));
    let mut write = overlap.clone();
    write[2].call = Call::Acquire { permits: RW_ALL };
    let violation = check(&write, &rw).unwrap_err();
    assert!(
        violation.what.contains("1001 permits of 1000"),
        "{violation}"
    );
}

/// Three clients of three tasks, through Sentinel, take the locks (holds up to 400 ms), the
/// fenced lock, the permits, the fair and the read-write lock and the job ticks while `failovers` `SENTINEL FAILOVER`s (a master,
/// two replicas, three sentinels) are started, each the moment an acquisition has returned; with
/// replica sync (one replica) or without. What the checker says, how many failovers there were
/// and how many of them came right after an acquisition.
async fn history_across_failovers(
    sync: bool,
    failovers: u32,
) -> (Result<Checked, Violation>, u32, u32, Vec<Op>) {
    let setup = Arc::new(common::RedisSentinel::start(1));
    let url = setup.url();
    let history = History::new();
    let stop = CancellationToken::new();
    let configure = if sync {
        |b: fredlock::LockClientBuilder| b.replica_sync(fredlock::ReplicaSync::replicas(1))
    } else {
        |b| b
    };
    let (clients, tasks) =
        history_clients(&history, |_| url.clone(), &stop, 200, 400, configure).await;
    let mut acquisitions = history.acquisitions();
    let (mut done, mut right_after) = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(150);
    while done < failovers && Instant::now() < deadline {
        acquisitions.borrow_and_update();
        let after = tokio::time::timeout(Duration::from_secs(5), acquisitions.changed())
            .await
            .is_ok();
        let setup = setup.clone();
        let switched = tokio::task::spawn_blocking(move || {
            let old = setup.master_port();
            let reply = setup.sentinel_cli(
                setup.sentinels[0].port(),
                &["sentinel", "failover", common::SENTINEL_SERVICE],
            );
            // NOGOODSLAVE while a replica is resyncing, INPROG: again after the next one.
            reply.starts_with("OK").then(|| {
                let new = setup.await_new_master(old, Duration::from_secs(20));
                let new_port = new.to_string();
                setup.data_cli(old, &["replicaof", "127.0.0.1", &new_port]);
                new
            })
        })
        .await
        .unwrap();
        match switched {
            Some(master) => {
                done += 1;
                right_after += u32::from(after);
                println!("failover {done} to {master} at {:?}", history.now());
            }
            None => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    // The last failover's losses show within a watchdog lease.
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.cancel();
    let (verdict, ops) = history_checked(&history, clients, tasks).await;
    (verdict, done, right_after, ops)
}

/// 6. Histories across Sentinel failovers (issue 35), with replica sync: an acquisition returns
/// only once a replica has it, and one made on a master that a failover has left behind has no
/// replica to confirm it, so over 20 failovers, each started right after an acquisition, no two
/// holds overlap, no token goes back, no third permit, no tick twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_replica_sync_histories_across_failovers_show_no_overlap() {
    bounded(async {
        let (verdict, failovers, right_after, ops) = history_across_failovers(true, 20).await;
        let checked = verdict.unwrap_or_else(|violation| panic!("{violation}"));
        let failed = ops
            .iter()
            .filter(|op| matches!(op.outcome, Outcome::Failed(_)))
            .count();
        println!(
            "histories across {failovers} failovers ({right_after} right after an acquisition), \
             replica sync: {} operations ({failed} failed), {checked:?}",
            ops.len()
        );
        assert!(failovers >= 20, "{failovers} failovers");
        assert!(
            right_after >= 20,
            "{right_after} right after an acquisition"
        );
        assert!(checked.holds > 100 && checked.tokens > 20, "{checked:?}");
    })
    .await;
}

/// The negative control of the failover histories: without replica sync an acquisition on the
/// master a failover is leaving behind counts, the promoted replica never sees it, and another
/// client takes the lock there while its holder works: the README's hazard, measured (about
/// three violations in a run of 8 failovers).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_replica_sync_a_failover_shows_two_holders_in_the_history() {
    bounded(shows_a_violation(|| async {
        let (verdict, failovers, _, _) = history_across_failovers(false, 8).await;
        (
            verdict,
            format!("{failovers} failovers without replica sync"),
        )
    }))
    .await;
}

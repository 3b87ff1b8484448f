//! Acceptance tests of the semaphore against real `redis-server` processes: never oversubscribed,
//! prompt and counted wake-ups, cancel safety, Redisson's layout and interop, inspections.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{bounded, eventually, RedisServer};
use fred::prelude::*;
use fredlock::{Details, Error, DEFAULT_WATCHDOG_LEASE};
use rand::Rng;
use tokio::time::Instant;

/// How soon a waiter must wake after a release.
const WAKE_LIMIT: Duration = Duration::from_millis(250);

/// 1. 3 clients x 10 tasks on 3 permits for 5 s: never more than 3 inside (counted in Redis
///    and in the process), and every task gets in.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn never_more_inside_than_permits_and_everyone_progresses() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let clients = common::clients(&vec![server.url(); 3]).await;
        assert!(clients[0]
            .semaphore("exports")
            .try_set_permits(3)
            .await
            .unwrap());
        assert!(!clients[1]
            .semaphore("exports")
            .try_set_permits(3)
            .await
            .unwrap());
        let inside = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let until = Instant::now() + Duration::from_secs(5);
        let mut tasks = Vec::new();
        for client in &clients {
            for _ in 0..10 {
                let semaphore = client.semaphore("exports");
                let (inside, most, raw) = (inside.clone(), most.clone(), raw.clone());
                tasks.push(tokio::spawn(async move {
                    let mut entries = 0u32;
                    while Instant::now() < until {
                        let permit = semaphore.acquire(1).await.unwrap();
                        let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        // In Redis too: a shared counter of those inside, checked by each.
                        let counted: i64 = raw.incr("inside").await.unwrap();
                        assert!(counted <= 3, "{counted} inside at once");
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        let _: i64 = raw.decr("inside").await.unwrap();
                        inside.fetch_sub(1, Ordering::SeqCst);
                        permit.release().await.unwrap();
                        entries += 1;
                    }
                    entries
                }));
            }
        }
        let mut entries = Vec::new();
        for task in tasks {
            entries.push(task.await.unwrap());
        }
        assert_eq!(most.load(Ordering::SeqCst), 3, "the permits were used");
        assert!(
            entries.iter().all(|&n| n > 0),
            "every task got in: {entries:?}"
        );
        assert_eq!(
            clients[0]
                .semaphore("exports")
                .available_permits()
                .await
                .unwrap(),
            3
        );
        let grants: i64 = raw.hlen("fredlock_permits:{exports}").await.unwrap();
        assert_eq!(grants, 0, "every grant given back");
    })
    .await;
}

/// 2. A released permit wakes a waiter of another client within 250 ms; a release of 3 wakes
///    three waiters, and only those the permits fit.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn releases_wake_as_many_waiters_as_they_free_permits_for() {
    bounded(async {
        let server = RedisServer::start();
        let clients = common::clients(&vec![server.url(); 2]).await;
        let holder = clients[0].semaphore("slots");
        holder.try_set_permits(3).await.unwrap();
        let held = holder.acquire(3).await.unwrap();

        // One waiter: woken by the release of one permit.
        let waiter = clients[1].semaphore("slots");
        let waiting = tokio::spawn(async move {
            let permit = waiter.acquire(1).await.unwrap();
            (Instant::now(), permit)
        });
        assert!(
            eventually(Duration::from_secs(5), || async {
                clients[1].stats().wait_entries == 1
            })
            .await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        let released = Instant::now();
        held.release().await.unwrap();
        let (woke, permit) = waiting.await.unwrap();
        assert!(
            woke - released <= WAKE_LIMIT,
            "woken {:?} after the release",
            woke - released
        );
        permit.release().await.unwrap();

        // Five waiters, three permits given back at once: three get in at once, two wait on.
        let held = holder.acquire(3).await.unwrap();
        let got = Arc::new(AtomicUsize::new(0));
        let mut waiters = Vec::new();
        for _ in 0..5 {
            let semaphore = clients[1].semaphore("slots");
            let got = got.clone();
            waiters.push(tokio::spawn(async move {
                let permit = semaphore.acquire(1).await.unwrap();
                got.fetch_add(1, Ordering::SeqCst);
                (Instant::now(), permit)
            }));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(got.load(Ordering::SeqCst), 0);
        held.release().await.unwrap();
        assert!(
            eventually(WAKE_LIMIT, || async { got.load(Ordering::SeqCst) == 3 }).await,
            "three waiters got in within {WAKE_LIMIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(got.load(Ordering::SeqCst), 3, "no more than the permits");
        // The two left get in as the three give theirs back.
        let (finished, pending): (Vec<_>, Vec<_>) =
            waiters.into_iter().partition(|waiter| waiter.is_finished());
        assert_eq!((finished.len(), pending.len()), (3, 2));
        for waiter in finished {
            waiter.await.unwrap().1.release().await.unwrap();
        }
        for waiter in pending {
            let (_, permit) = tokio::time::timeout(WAKE_LIMIT * 2, waiter)
                .await
                .expect("woken by a release")
                .unwrap();
            permit.release().await.unwrap();
        }
        assert_eq!(holder.available_permits().await.unwrap(), 3);
    })
    .await;
}

/// Every call that raises the permits wakes a waiter of another client at once, not at its next
/// look: `try_set_permits` on a semaphore not set yet, `set_permits`, `add_permits` and
/// `release(n)`, and the leased semaphore's `try_set_permits` and `add_permits`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_call_that_raises_the_permits_wakes_a_waiter_at_once() {
    bounded(async {
        let server = RedisServer::start();
        let clients = common::clients(&vec![server.url(); 2]).await;
        for call in [
            "try_set_permits",
            "set_permits",
            "add_permits",
            "release",
            "leased try_set_permits",
            "leased add_permits",
        ] {
            let name = call.replace(' ', "_");
            let leased = call.starts_with("leased");
            let waiter_client = clients[1].clone();
            let waiter_name = name.clone();
            // Each call has a name of its own: the permit is dropped, not needed again.
            let waiting = tokio::spawn(async move {
                if leased {
                    drop(
                        waiter_client
                            .permit_semaphore(waiter_name)
                            .acquire()
                            .await
                            .unwrap(),
                    );
                } else {
                    drop(
                        waiter_client
                            .semaphore(waiter_name)
                            .acquire(1)
                            .await
                            .unwrap(),
                    );
                }
                Instant::now()
            });
            assert!(
                eventually(Duration::from_secs(5), || async {
                    clients[1].stats().wait_entries == 1
                })
                .await,
                "{call}: the waiter waits"
            );
            // Long enough that a waiter who only looks again now and then would be seen late.
            tokio::time::sleep(Duration::from_millis(300)).await;
            let raised = Instant::now();
            let semaphore = clients[0].semaphore(name.as_str());
            let permits = clients[0].permit_semaphore(name.as_str());
            match call {
                "try_set_permits" => assert!(semaphore.try_set_permits(1).await.unwrap()),
                "set_permits" => semaphore.set_permits(1).await.unwrap(),
                "add_permits" => semaphore.add_permits(1).await.unwrap(),
                "release" => semaphore.release(1).await.unwrap(),
                "leased try_set_permits" => assert!(permits.try_set_permits(1).await.unwrap()),
                "leased add_permits" => permits.add_permits(1).await.unwrap(),
                _ => unreachable!(),
            }
            let woke = tokio::time::timeout(Duration::from_secs(5), waiting)
                .await
                .unwrap_or_else(|_| panic!("{call}: the waiter never woke"))
                .unwrap();
            assert!(
                woke - raised <= WAKE_LIMIT,
                "{call}: woken {:?} after the permits were raised",
                woke - raised
            );
        }
    })
    .await;
}

/// A release publishes the new count on Redisson's channel, and a message of fewer permits
/// than a waiter wants does not wake it (nor hand it anything).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiter_for_many_permits_waits_for_all_of_them() {
    bounded(async {
        let server = RedisServer::start();
        let client = server.lock_client(DEFAULT_WATCHDOG_LEASE).await;
        let semaphore = client.semaphore("many");
        semaphore.try_set_permits(1).await.unwrap();
        let (_subscriber, mut messages) = common::listen(&server.url(), "redisson_sc:{many}").await;
        let waiter = semaphore.clone();
        let waiting = tokio::spawn(async move { waiter.acquire(3).await.unwrap() });
        tokio::time::sleep(Duration::from_millis(200)).await;
        semaphore.add_permits(1).await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!waiting.is_finished(), "2 permits do not make 3");
        assert_eq!(semaphore.available_permits().await.unwrap(), 2);
        semaphore.release(1).await.unwrap();
        let permit = tokio::time::timeout(WAKE_LIMIT * 2, waiting)
            .await
            .expect("woken by the third permit")
            .unwrap();
        assert_eq!(permit.permits(), 3);
        assert_eq!(semaphore.available_permits().await.unwrap(), 0);
        drop(permit);
        assert!(
            eventually(Duration::from_secs(2), || async {
                semaphore.available_permits().await.unwrap() == 3
            })
            .await,
            "a dropped permit gives its permits back"
        );
        let published = common::heard(&mut messages, 3).await;
        assert_eq!(published, vec!["2", "3", "3"]);
    })
    .await;
}

/// 300 acquisitions cut short at random points (before, during or after their attempt, while
/// waiting, or holding): each takes `take(i)`'s permits and holds them a moment. Returns how
/// many got their permits before being cut short.
async fn cancellation_storm<F, Fut, P>(take: F) -> usize
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = P> + Send + 'static,
    P: Send,
{
    let mut rng = rand::thread_rng();
    let mut tasks = Vec::new();
    for i in 0..300 {
        // In waves of ten, so that some find permits free and some wait behind others.
        if i % 10 == 0 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let cancel_after = Duration::from_micros(rng.gen_range(0..5_000));
        let taken = take(i);
        tasks.push(tokio::spawn(async move {
            let mut got = false;
            let _ = tokio::time::timeout(cancel_after, async {
                let permit = taken.await;
                got = true;
                tokio::time::sleep(Duration::from_micros(300)).await;
                drop(permit);
            })
            .await;
            got
        }));
    }
    let mut got = 0;
    for task in tasks {
        got += usize::from(task.await.unwrap());
    }
    got
}

/// 5. 300 `acquire` futures cancelled at random points leave the counter where it started, no
///    grant, no wait entry and no subscription; and so do 300 of a permit semaphore, with no
///    lease left.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancelled_acquisitions_leave_the_counter_as_it_was() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = server.lock_client(DEFAULT_WATCHDOG_LEASE).await;
        let semaphore = client.semaphore("storm");
        semaphore.try_set_permits(2).await.unwrap();
        let got = cancellation_storm(|i| {
            let semaphore = semaphore.clone();
            async move { semaphore.acquire(1 + (i % 3) as u32).await.unwrap() }
        })
        .await;
        assert!(
            got > 0 && got < 300,
            "{got} got their permits: some, not all"
        );
        let idle = eventually(Duration::from_secs(10), || async { common::idle(&client) }).await;
        assert!(idle, "{:?}", client.stats());
        assert_eq!(semaphore.available_permits().await.unwrap(), 2);
        let grants: i64 = raw.exists("fredlock_permits:{storm}").await.unwrap();
        assert_eq!(grants, 0, "no grant left");

        let leased = client.permit_semaphore("leased-storm");
        leased.try_set_permits(2).await.unwrap();
        let got = cancellation_storm(|_| {
            let leased = leased.clone();
            async move { leased.acquire().await.unwrap() }
        })
        .await;
        assert!(
            got > 0 && got < 300,
            "{got} got their permits: some, not all"
        );
        let idle = eventually(Duration::from_secs(10), || async { common::idle(&client) }).await;
        assert!(idle, "{:?}", client.stats());
        // Read without giving anything back: no lease may have ended in Redis meanwhile.
        let value: i64 = raw.get("leased-storm").await.unwrap();
        assert_eq!(value, 2);
        let leases: i64 = raw.exists("{leased-storm}:timeout").await.unwrap();
        assert_eq!(leases, 0, "no lease left");
    })
    .await;
}

/// Bad input is refused before anything is sent, and a key of another type is reported
/// without a change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_changes_nothing() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = server.lock_client(DEFAULT_WATCHDOG_LEASE).await;
        let semaphore = client.semaphore("bad");
        assert!(matches!(
            semaphore.acquire(0).await,
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            semaphore.add_permits(0).await,
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            client.semaphore("").available_permits().await,
            Err(Error::InvalidArgument(_))
        ));
        let _: () = raw.set("bad", "text", None, None, false).await.unwrap();
        for outcome in [
            semaphore.try_acquire(1, Duration::ZERO).await.map(drop),
            semaphore.add_permits(1).await,
            semaphore.set_permits(2).await,
            semaphore.available_permits().await.map(drop),
        ] {
            assert!(
                matches!(outcome, Err(Error::WrongType { .. })),
                "{outcome:?}"
            );
        }
        let value: String = raw.get("bad").await.unwrap();
        assert_eq!(value, "text");
        let grants: i64 = raw.exists("fredlock_permits:{bad}").await.unwrap();
        assert_eq!(grants, 0);
    })
    .await;
}

/// set, drain, ownerless release and forget behave as Redisson's and tokio's do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_drain_release_and_forget() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = server.lock_client(DEFAULT_WATCHDOG_LEASE).await;
        let semaphore = client.semaphore("ops");
        assert_eq!(semaphore.available_permits().await.unwrap(), 0);
        assert!(semaphore
            .try_acquire(1, Duration::ZERO)
            .await
            .unwrap()
            .is_none());
        semaphore.set_permits(5).await.unwrap();
        let two = semaphore.acquire(2).await.unwrap();
        assert_eq!(semaphore.available_permits().await.unwrap(), 3);
        assert_eq!(semaphore.drain_permits().await.unwrap(), 3);
        assert_eq!(semaphore.available_permits().await.unwrap(), 0);
        two.forget();
        assert!(
            eventually(Duration::from_secs(2), || async {
                raw.exists::<i64, _>("fredlock_permits:{ops}")
                    .await
                    .unwrap()
                    == 0
            })
            .await,
            "a forgotten grant's record goes"
        );
        assert_eq!(semaphore.available_permits().await.unwrap(), 0);
        // Draining none takes none; draining the last one takes it.
        assert_eq!(semaphore.drain_permits().await.unwrap(), 0);
        semaphore.release(2).await.unwrap();
        assert_eq!(semaphore.available_permits().await.unwrap(), 2);
        semaphore.set_permits(1).await.unwrap();
        assert_eq!(semaphore.drain_permits().await.unwrap(), 1);
        assert_eq!(semaphore.available_permits().await.unwrap(), 0);
        assert_eq!(client.stats().held, 0);
    })
    .await;
}

/// `Semaphore::release(n)` is Redisson's: it adds permits whoever holds them, so calling it for
/// a permit a guard still holds counts that permit twice (the type's docs, "`release(n)` is
/// Redisson's, not tokio's"): the guard gives its own back as well.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_n_adds_permits_beside_the_guards_own() {
    bounded(async {
        let server = RedisServer::start();
        let client = server.lock_client(DEFAULT_WATCHDOG_LEASE).await;
        let semaphore = client.semaphore("exports");
        semaphore.set_permits(1).await.unwrap();
        let permit = semaphore.acquire(1).await.unwrap();
        assert_eq!(semaphore.available_permits().await.unwrap(), 0);
        semaphore.release(1).await.unwrap();
        assert_eq!(semaphore.available_permits().await.unwrap(), 1);
        permit.release().await.unwrap();
        assert_eq!(semaphore.available_permits().await.unwrap(), 2);
        client.shutdown().await;
    })
    .await;
}

/// 6. The layout is Redisson's: an integer string at the name, every change published as the
///    new count on `redisson_sc:{name}`; grants in fredlock's own hash, gone with the permits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wire_layout_matches_redisson() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = server.lock_client(DEFAULT_WATCHDOG_LEASE).await;
        let (_subscriber, mut messages) =
            common::listen(&server.url(), "redisson_sc:{layout}").await;
        let semaphore = client.semaphore("layout");
        assert!(semaphore.try_set_permits(4).await.unwrap());
        let kind: String = raw.r#type("layout").await.unwrap();
        assert_eq!(kind, "string");
        let ttl: i64 = raw.pttl("layout").await.unwrap();
        assert_eq!(ttl, -1, "Redisson's counter has no expiry");
        let permit = semaphore.acquire(3).await.unwrap();
        let value: String = raw.get("layout").await.unwrap();
        assert_eq!(value, "1");
        let grants: std::collections::HashMap<String, String> =
            raw.hgetall("fredlock_permits:{layout}").await.unwrap();
        assert_eq!(grants.get(permit.grant()).map(String::as_str), Some("3"));
        assert!(permit
            .grant()
            .starts_with(&client.id().hyphenated().to_string()));
        permit.release().await.unwrap();
        let value: String = raw.get("layout").await.unwrap();
        assert_eq!(value, "4");
        let exists: i64 = raw.exists("fredlock_permits:{layout}").await.unwrap();
        assert_eq!(exists, 0);
        let published = common::heard(&mut messages, 2).await;
        assert_eq!(
            published,
            vec!["4", "4"],
            "try_set, then the release's new count"
        );
    })
    .await;
}

/// The scripts at the wire: fences of lost replies. An acquire whose reply was lost, and that
/// has not landed yet, is fenced by the settle that gives its grant back (the release names the
/// acquire's request id), and takes nothing when it lands after; a release sent again (its first
/// send's reply lost) fences the first send, which finds itself stale when it lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_fenced_after_their_replies_were_lost_take_nothing_when_they_land() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let _: () = raw.set("landing", "5", None, None, false).await.unwrap();
        let keys = vec![
            "landing",
            "redisson_sc:{landing}",
            "fredlock_fences:{landing}",
            "fredlock_permits:{landing}",
        ];
        let call = |script: &'static str, args: &[&str]| {
            let raw = raw.clone();
            let keys = keys.clone();
            let args: Vec<String> = args.iter().map(|arg| arg.to_string()).collect();
            let source = fredlock::script_source(script).unwrap();
            async move { raw.eval::<Value, _, _, _>(source, keys, args).await }
        };
        let permits = || {
            let raw = raw.clone();
            async move { raw.get::<i64, _>("landing").await.unwrap() }
        };
        let stale = |reply: Result<Value, fred::error::Error>| {
            matches!(reply, Err(error) if error.details().starts_with("STALE"))
        };

        // The settle of grant c:1, whose acquire (request 5) never landed: nothing to give
        // back, and request 5 fenced.
        let settle = call("semaphore_release", &["c:1", "0", "6", "5"]).await;
        assert_eq!(settle.unwrap(), Value::Null);
        let landed = call("semaphore_acquire", &["2", "c:1", "5"]).await;
        assert!(stale(landed.clone()), "{landed:?}");
        assert_eq!(permits().await, 5, "the fenced acquire took permits");

        // Grant c:2 takes 2; its release (request 8) loses its reply and is sent again as
        // request 9, fencing 8, which lands after.
        let taken = call("semaphore_acquire", &["2", "c:2", "7"]).await;
        assert_eq!(taken.unwrap(), Value::Null);
        assert_eq!(permits().await, 3);
        let again = call("semaphore_release", &["c:2", "0", "9", "8"]).await;
        assert_eq!(again.unwrap(), Value::Integer(1));
        let landed = call("semaphore_release", &["c:2", "0", "8"]).await;
        assert!(stale(landed.clone()), "{landed:?}");
        assert_eq!(permits().await, 5);

        // A settle of grant c:3 whose guard lives keeps its permits (reply 0); its release gives
        // them back (reply 1).
        let taken = call("semaphore_acquire", &["1", "c:3", "10"]).await;
        assert_eq!(taken.unwrap(), Value::Null);
        let kept = call("semaphore_release", &["c:3", "1", "11"]).await;
        assert_eq!(kept.unwrap(), Value::Integer(0));
        assert_eq!(permits().await, 4);
        let released = call("semaphore_release", &["c:3", "0", "12"]).await;
        assert_eq!(released.unwrap(), Value::Integer(1));
        assert_eq!(permits().await, 5);

        // The fences end with their memory; the grants are gone with the last grant.
        let fences: i64 = raw.pttl("fredlock_fences:{landing}").await.unwrap();
        assert!(fences > 0, "the fences' TTL: {fences}");
        let grants: i64 = raw.exists("fredlock_permits:{landing}").await.unwrap();
        assert_eq!(grants, 0);
    })
    .await;
}

/// A waiter for permits that are not there looks once, then sleeps until a change of the
/// permits is published (or a watchdog period passes, its safety net): it does not look again
/// and again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_looks_once_and_sleeps_until_told() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = server.lock_client(DEFAULT_WATCHDOG_LEASE).await;
        let semaphore = client.semaphore("asleep");
        semaphore.try_set_permits(1).await.unwrap();
        let held = semaphore.acquire(1).await.unwrap();
        let before = common::command_calls(&raw).await;
        let taken = semaphore
            .try_acquire(1, Duration::from_millis(500))
            .await
            .unwrap();
        assert!(taken.is_none());
        let looks: u64 = common::scripts_since(&raw, &before).await;
        // A look, and one more as the wait ends: a few; a waiter that looked again at once
        // would run hundreds.
        assert!(
            (1..=4).contains(&looks),
            "{looks} looks in 500 ms: {:?}",
            common::commands_since(&raw, &before).await
        );
        held.release().await.unwrap();
    })
    .await;
}

/// 6. A Java client, replayed with the commands Redisson's scripts run: its acquisitions and
///    releases move the same counter, its release message wakes fredlock's waiters, and
///    fredlock's release wakes a Java waiter listening on the channel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interoperates_with_redisson_replay() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = server.lock_client(DEFAULT_WATCHDOG_LEASE).await;
        let semaphore = client.semaphore("java");
        // Redisson's trySetPermits(2): SET if missing, publish the count.
        let _: () = raw.set("java", 2, None, None, false).await.unwrap();
        // Redisson's tryAcquire(2): enough available, so DECRBY.
        let _: i64 = raw.decr_by("java", 2).await.unwrap();
        assert!(semaphore
            .try_acquire(1, Duration::ZERO)
            .await
            .unwrap()
            .is_none());
        let waiter = semaphore.clone();
        let waiting = tokio::spawn(async move {
            let permit = waiter.acquire(1).await.unwrap();
            (Instant::now(), permit)
        });
        assert!(
            eventually(Duration::from_secs(5), || async {
                client.stats().subscriptions == 1
            })
            .await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        // Redisson's release(1): INCRBY, publish the new count.
        let released = Instant::now();
        let value: i64 = raw.incr_by("java", 1).await.unwrap();
        let _: i64 = raw.publish("redisson_sc:{java}", value).await.unwrap();
        let (woke, permit) = waiting.await.unwrap();
        assert!(woke - released <= WAKE_LIMIT);
        // A Java waiter listens on the channel: fredlock's release tells it the count.
        let (_subscriber, mut messages) = common::listen(&server.url(), "redisson_sc:{java}").await;
        permit.release().await.unwrap();
        let published = common::heard(&mut messages, 1).await;
        assert_eq!(published, vec!["1"]);
        // The Java client's permit is still out; fredlock never touched it.
        let value: i64 = raw.get("java").await.unwrap();
        assert_eq!(value, 1);
    })
    .await;
}

/// 8. Inspections show the permits available and fredlock's grants; `list` and `leaks` find
///    the semaphore by its grants, and the counter (lasting by design) is no leak.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspections_show_permits_and_grants() {
    bounded(async {
        let server = RedisServer::start();
        let client = server.lock_client(DEFAULT_WATCHDOG_LEASE).await;
        let semaphore = client.semaphore("seen");
        semaphore.try_set_permits(5).await.unwrap();
        let permit = semaphore.acquire(2).await.unwrap();
        let one = semaphore.acquire(1).await.unwrap();
        let seen = semaphore.inspect().await.unwrap();
        assert_eq!(seen.kind, "semaphore");
        assert_eq!(seen.details, Details::Semaphore { available: Some(2) });
        assert_eq!(seen.holders.len(), 2, "{:?}", seen.holders);
        let mut holders: Vec<(&str, u64)> = seen
            .holders
            .iter()
            .map(|holder| (holder.owner.as_str(), holder.count))
            .collect();
        holders.sort();
        let mut grants = vec![(permit.grant(), 2), (one.grant(), 1)];
        grants.sort();
        assert_eq!(holders, grants);
        assert_eq!(seen.holders[0].remaining_lease, None);
        assert_eq!(seen.holders[0].client_id(), Some(client.id()));
        one.release().await.unwrap();

        let by_name = client.inspect("seen").await.unwrap().expect("found");
        assert_eq!(by_name.kind, "semaphore");
        assert_eq!(by_name.details, Details::Semaphore { available: Some(3) });
        let listed = client.list("se*").await.unwrap();
        assert_eq!(listed.len(), 1, "{listed:?}");
        assert_eq!(listed[0].kind, "semaphore");
        assert!(client
            .leaks("*", fredlock::DEFAULT_LEAK_GRACE)
            .await
            .unwrap()
            .is_empty());
        permit.release().await.unwrap();
        // Without grants, a bare integer string is a semaphore or a latch: a counter.
        let by_name = client.inspect("seen").await.unwrap().expect("found");
        assert_eq!(by_name.kind, "counter");
        assert_eq!(by_name.details, Details::Counter { value: Some(5) });

        // A semaphore never set shows no permits and no holders; a name holding another type
        // is refused, naming it.
        let never = client.semaphore("never-set").inspect().await.unwrap();
        assert_eq!(never.details, Details::Semaphore { available: None });
        assert!(never.holders.is_empty());
        let raw = server.raw().await;
        let _: i64 = raw.hset("a-hash", ("field", "value")).await.unwrap();
        let refused = client.semaphore("a-hash").inspect().await;
        assert!(
            matches!(&refused, Err(Error::WrongType { .. })),
            "{refused:?}"
        );
    })
    .await;
}

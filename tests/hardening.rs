//! Production hardening (issue 10): out-of-range durations, names whose braces are no hash tag,
//! outages told apart from a busy lock, force_unlock of keys that are not locks, readable owner
//! ids, one-line errors naming the server, and the small additions (key prefix, `redis()`,
//! `with_lock`). Ends with a sweep of bad input over every public method that takes a name or
//! a duration.

mod common;
#[path = "common/logs.rs"]
mod logs;

use std::future::Future;
use std::time::Duration;

use common::{bounded, free_port, Kind, RedisCluster, RedisServer, StallingProxy};
use fred::prelude::*;
use fredlock::{Error, LockClient, MultiLock, RedLock, MAX_DURATION};
use tokio::time::Instant;

/// Names whose braces are not a hash tag, and one that is.
const BRACED_NAMES: [&str; 5] = ["a{b", "}{x", "{}x", "x{}y{z}", "a{tag}b"];

/// The durations no API may choke on.
const EDGE_DURATIONS: [Duration; 5] = [
    Duration::ZERO,
    Duration::from_nanos(1),
    Duration::from_millis(u64::MAX),
    Duration::from_millis(i64::MAX as u64),
    Duration::MAX,
];

fn is_invalid<T: std::fmt::Debug>(result: fredlock::Result<T>) -> String {
    match result {
        Err(Error::InvalidArgument(message)) => message,
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

/// Every key on the server has a TTL (none was left without one by fredlock).
async fn every_key_expires(raw: &Client) {
    for key in common::all_keys(raw).await {
        let pttl: i64 = raw.pttl(&key).await.unwrap();
        assert!(pttl > 0, "key {key:?} has no TTL ({pttl})");
    }
}

async fn key_count(raw: &Client) -> u64 {
    raw.dbsize().await.unwrap()
}

/// 1. Leases, timeouts and waits out of range are refused before anything is written; the
/// longest accepted wait waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_range_durations_are_refused_and_write_nothing() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = common::connect(&server.url()).await.unwrap();
        let lock = client.lock("leases");
        for lease in [
            Duration::MAX,
            Duration::from_millis(u64::MAX),
            Duration::from_millis(i64::MAX as u64),
            MAX_DURATION + Duration::from_millis(1),
            Duration::ZERO,
            Duration::from_micros(999),
        ] {
            let message = is_invalid(lock.lock_with_lease(lease).await);
            assert!(
                message.contains("leases") && message.contains("365 days"),
                "{message}"
            );
            is_invalid(lock.try_lock(Duration::ZERO, Some(lease)).await);
            assert_eq!(key_count(&raw).await, 0, "lease {lease:?} wrote something");
        }
        let guard = lock.lock_with_lease(MAX_DURATION).await.unwrap();
        let pttl: i64 = raw.pttl("leases").await.unwrap();
        assert!(pttl > 364 * 24 * 3600 * 1000, "{pttl}");
        guard.unlock().await.unwrap();

        // A client name CLIENT SETNAME would refuse is refused before anything connects.
        for name in ["", "billing 7", "line\nbreak", &"x".repeat(65)] {
            let builder = common::builder().url(server.url());
            let message = is_invalid(builder.client_name(name).build().await);
            assert!(message.contains("client_name"), "{message}");
        }
        for timeout in [Duration::MAX, Duration::ZERO, Duration::from_micros(1)] {
            let builder = || common::builder().url(server.url());
            let message = is_invalid(builder().watchdog_lease(timeout).build().await);
            assert!(message.contains("watchdog_lease"), "{message}");
            is_invalid(builder().queue_place(timeout).build().await);
            is_invalid(builder().command_timeout(timeout).build().await);
        }
        // The renew deadline lies after a renewal period and no later than the lease.
        let watchdog = Duration::from_secs(3);
        for deadline in [
            Duration::ZERO,
            watchdog / 3,
            watchdog + Duration::from_millis(1),
            Duration::MAX,
        ] {
            let builder = common::builder().url(server.url());
            let built = builder
                .watchdog_lease(watchdog)
                .renew_deadline(deadline)
                .build()
                .await;
            let message = is_invalid(built);
            assert!(message.contains("renew_deadline"), "{message}");
        }
        for deadline in [watchdog / 3 + Duration::from_millis(1), watchdog] {
            let accepted = common::builder()
                .url(server.url())
                .watchdog_lease(watchdog)
                .renew_deadline(deadline)
                .build()
                .await
                .unwrap();
            accepted.shutdown().await;
        }

        // The longest accepted values work: the watchdog takes a 121-day period in its stride.
        let longest = common::builder()
            .url(server.url())
            .watchdog_lease(MAX_DURATION)
            .queue_place(MAX_DURATION)
            .command_timeout(MAX_DURATION)
            .build()
            .await
            .unwrap();
        for lock in [longest.lock("longest"), longest.fair_lock("longest").into()] {
            let guard = lock.lock().await.unwrap();
            let pttl: i64 = raw.pttl("longest").await.unwrap();
            assert!(pttl > 364 * 24 * 3600 * 1000, "{pttl}");
            guard.unlock().await.unwrap();
        }
        longest.shutdown().await;

        // Waits are checked as leases are (issue 42): over MAX_DURATION is refused by every
        // bounded try, before anything is written.
        for wait in [Duration::MAX, MAX_DURATION + Duration::from_millis(1)] {
            let named = |message: String| {
                assert!(
                    message.contains("wait") && message.contains("365 days"),
                    "{message}"
                );
            };
            named(is_invalid(client.lock("waits").try_lock(wait, None).await));
            named(is_invalid(
                client
                    .lock("waits")
                    .try_with_lock(wait, None, |_| async {})
                    .await,
            ));
            named(is_invalid(
                client.fair_lock("waits").try_lock(wait, None).await,
            ));
            named(is_invalid(
                client.semaphore("waits").try_acquire(1, wait).await,
            ));
            named(is_invalid(
                client
                    .permit_semaphore("waits")
                    .try_acquire(wait, None)
                    .await,
            ));
            named(is_invalid(
                client.leader_election("waits").try_campaign(wait).await,
            ));
            named(is_invalid(
                client.count_down_latch("waits").try_wait(wait).await,
            ));
            named(is_invalid(
                client.job_lock("waits").run_waiting(wait, async {}).await,
            ));
            let multi = MultiLock::new(vec![client.lock("waits:a"), client.lock("waits:b")]);
            named(is_invalid(multi.unwrap().try_lock(wait, None).await));
            let redlock = RedLock::new(vec![client.clone()], "waits").unwrap();
            named(is_invalid(redlock.try_lock(wait, None).await));
            assert_eq!(key_count(&raw).await, 0, "wait {wait:?} wrote something");
        }
        // The longest accepted wait waits: here, until the holder lets go.
        let holder = lock.lock().await.unwrap();
        let waiter = {
            let lock = client.lock("leases");
            tokio::spawn(async move { lock.try_lock(MAX_DURATION, None).await })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!waiter.is_finished());
        holder.unlock().await.unwrap();
        let guard = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .unwrap()
            .unwrap()
            .unwrap()
            .expect("acquired after the holder let go");
        guard.unlock().await.unwrap();
        every_key_expires(&raw).await;
    })
    .await;
}

/// 2. On a cluster, names whose braces are no hash tag lock, unlock, force unlock and wake
/// waiters, for both kinds, and as Redlock and MultiLock members.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn names_with_stray_braces_work_on_a_cluster() {
    bounded(async {
        let cluster = RedisCluster::start();
        let client = common::builder()
            .url(cluster.url())
            .queue_place(Duration::from_secs(2))
            .build()
            .await
            .unwrap();
        for name in BRACED_NAMES {
            for lock in [client.lock(name), client.fair_lock(name).into()] {
                let fair = lock.is_fair();
                let guard = lock.lock().await.unwrap();
                guard.unlock().await.unwrap();
                assert!(!lock.is_locked().await.unwrap(), "{name} fair={fair}");

                let holder = lock.lock().await.unwrap();
                assert!(lock.force_unlock().await.unwrap(), "{name} fair={fair}");
                // Its field is gone: the unlock says so, naming the lock.
                match holder.unlock().await {
                    Err(Error::NotHeld { .. }) => {}
                    other => panic!("{name} fair={fair}: unlock after a force unlock: {other:?}"),
                }

                // A waiter is woken by the unlock, not by the 30 s lease.
                let holder = lock.lock().await.unwrap();
                let waiter = {
                    let lock = lock.clone();
                    tokio::spawn(async move {
                        let guard = lock.lock().await.unwrap();
                        let woke = Instant::now();
                        guard.unlock().await.unwrap();
                        woke
                    })
                };
                tokio::time::sleep(Duration::from_millis(200)).await;
                let unlocked = Instant::now();
                holder.unlock().await.unwrap();
                let woke = tokio::time::timeout(Duration::from_secs(5), waiter)
                    .await
                    .unwrap_or_else(|_| panic!("waiter on {name:?} (fair={fair}) hangs"))
                    .unwrap();
                assert!(
                    woke - unlocked < Duration::from_secs(1),
                    "{name} fair={fair}"
                );
            }
        }
        let members: Vec<fredlock::Lock> = BRACED_NAMES
            .iter()
            .map(|name| client.lock(format!("multi:{name}")))
            .collect();
        let all = MultiLock::new(members).unwrap().lock().await.unwrap();
        all.unlock().await.unwrap();
        for name in BRACED_NAMES {
            let redlock = RedLock::new(vec![client.clone()], format!("red:{name}")).unwrap();
            let guard = redlock.lock().await.unwrap();
            guard.unlock().await.unwrap();
        }
        // KEYS answers for one node: ask each master.
        for node in &cluster.nodes {
            every_key_expires(&node.raw().await).await;
        }
        client.shutdown().await;
    })
    .await;
}

for_each_kind!(an_outage_is_told_apart_from_a_held_lock);

/// 4. An outage is an error, a held lock is `Ok(None)`; a brief outage is waited through.
async fn an_outage_is_told_apart_from_a_held_lock(kind: Kind) {
    {
        let mut server = RedisServer::start();
        let client = common::connect(&server.url()).await.unwrap();
        let other = common::connect(&server.url()).await.unwrap();
        let holder = kind.lock(&other, "outage").lock().await.unwrap();
        let lock = kind.lock(&client, "outage");
        assert!(lock.try_lock(Duration::ZERO, None).await.unwrap().is_none());
        assert!(lock
            .try_lock(Duration::from_millis(200), None)
            .await
            .unwrap()
            .is_none());
        drop(holder);

        server.kill();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let started = Instant::now();
        let error = lock.try_lock(Duration::ZERO, None).await.unwrap_err();
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "a single attempt waited {:?} (the command timeout is 5 s)",
            started.elapsed()
        );
        assert!(matches!(error, Error::Unavailable { .. }), "{error:?}");
        let started = Instant::now();
        let error = lock
            .try_lock(Duration::from_millis(700), None)
            .await
            .unwrap_err();
        let waited = started.elapsed();
        assert!(matches!(error, Error::Unavailable { .. }), "{error:?}");
        assert!(
            waited >= Duration::from_millis(700) && waited < Duration::from_secs(3),
            "{waited:?}"
        );
        let message = error.to_string();
        println!("{message}");
        assert!(
            message.contains(&format!("127.0.0.1:{}", server.port())),
            "{message}"
        );

        // Back within the wait: acquired.
        let waiting = {
            let lock = kind.lock(&client, "outage");
            tokio::spawn(async move { lock.try_lock(Duration::from_secs(20), None).await })
        };
        tokio::time::sleep(Duration::from_millis(500)).await;
        server.start_again();
        let guard = waiting
            .await
            .unwrap()
            .unwrap()
            .expect("acquired once Redis is back");
        guard.unlock().await.unwrap();
    }
}

/// 4b. A server that accepts but never answers: the wait ends with `Unavailable` (no reply),
/// not `Ok(None)`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_server_is_unavailable_not_busy() {
    bounded(async {
        let server = RedisServer::start();
        let proxy = StallingProxy::start(server.port());
        let client = common::connect(&proxy.url()).await.unwrap();
        let lock = client.lock("stalled");
        proxy.stall();
        let started = Instant::now();
        let outcome = lock.try_lock(Duration::from_millis(300), None).await;
        let waited = started.elapsed();
        match outcome {
            Err(Error::Unavailable { source: None, .. }) => {}
            other => panic!("expected Unavailable without a reply, got {other:?}"),
        }
        assert!(waited < Duration::from_secs(2), "{waited:?}");
        proxy.resume();
        client.shutdown().await;
    })
    .await;
}

/// An unlock while the connection is down is not lost: it answers `Unavailable` at once (the
/// client knows it has no connection: one outage rule, issue 57), and its release is sent once
/// the client has reconnected, so the lock is released then, not left to its 20 s lease;
/// `lock()` keeps trying through the same cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlock_during_a_reconnect_is_sent_when_the_connection_is_back() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let proxy = StallingProxy::start(server.port());
        let client = common::connect(&proxy.url()).await.unwrap();
        let lock = client.lock("cut");
        let guard = lock.lock_with_lease(Duration::from_secs(20)).await.unwrap();
        proxy.cut();
        let dropped = common::eventually(Duration::from_secs(5), || async {
            !client.stats().connected
        })
        .await;
        assert!(dropped, "the client never saw the cut");
        let started = Instant::now();
        let unlocked = guard.unlock().await;
        assert!(
            matches!(unlocked, Err(fredlock::Error::Unavailable { .. }))
                && started.elapsed() < Duration::from_secs(1),
            "unlock while the client knows it has no connection: {unlocked:?} after {:?}",
            started.elapsed()
        );
        let other = client.lock("cut-waiter");
        let waiting = tokio::spawn(async move { other.lock().await });
        tokio::time::sleep(Duration::from_millis(700)).await;
        let exists: u32 = raw.exists("cut").await.unwrap();
        assert_eq!(exists, 1, "still held while the connection is cut");
        assert!(
            !waiting.is_finished(),
            "lock() gave up while the connection was cut"
        );
        let healed = Instant::now();
        proxy.heal();
        let released = common::eventually(Duration::from_secs(10), || async {
            raw.exists::<u32, _>("cut").await.unwrap() == 0
        })
        .await;
        assert!(
            released,
            "the release was not sent once the connection was back"
        );
        println!("released {:?} after the network healed", healed.elapsed());
        let guard = tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("lock() acquires once the connection is back")
            .unwrap()
            .unwrap();
        guard.unlock().await.unwrap();
        client.shutdown().await;
    })
    .await;
}

/// An unlock while Redis is down says `Unavailable` (whether it is still held is unknown), never
/// `NotHeld`; the guard's hold is not forgotten: it is given back once Redis is back (issue 34,
/// trap 2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlock_while_redis_is_down_is_unavailable_not_not_held() {
    bounded(async {
        let mut server = RedisServer::start();
        let client = common::builder()
            .url(server.url())
            .command_timeout(Duration::from_millis(500))
            .watchdog_lease(Duration::from_secs(2))
            .build()
            .await
            .unwrap();
        let guard = client
            .lock("down")
            .lock_with_lease(Duration::from_secs(20))
            .await
            .unwrap();
        server.kill();
        let started = Instant::now();
        let error = guard.unlock().await.unwrap_err();
        let took = started.elapsed();
        println!("{error} after {took:?}");
        assert!(matches!(error, Error::Unavailable { .. }), "{error:?}");
        assert!(
            error
                .to_string()
                .contains(&format!("127.0.0.1:{}", server.port())),
            "{error}"
        );
        assert!(took < Duration::from_secs(5), "{took:?}");

        // A watchdog hold given up locally while Redis is down (its renewals did not get
        // through) is not known to be gone either.
        server.start_again();
        let guard = client.lock("down").lock().await.unwrap();
        server.kill();
        tokio::time::timeout(Duration::from_secs(5), guard.lost())
            .await
            .expect("given up when its renewals fail");
        let error = guard.unlock().await.unwrap_err();
        assert!(matches!(error, Error::Unavailable { .. }), "{error:?}");

        // Once Redis answers, a hold that is gone is `NotHeld`, as before.
        server.start_again();
        let guard = client.lock("down").lock().await.unwrap();
        let raw = server.raw().await;
        let _: i64 = raw.del("down").await.unwrap();
        let error = guard.unlock().await.unwrap_err();
        assert!(matches!(error, Error::NotHeld { .. }), "{error:?}");
        client.shutdown().await;
    })
    .await;
}

/// 5. force_unlock deletes only locks; is_locked agrees with lock() about other types.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_that_are_not_locks_are_left_alone() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = common::connect(&server.url()).await.unwrap();
        let _: () = raw
            .hset("profile", [("name", "ada"), ("visits", "3")])
            .await
            .unwrap();
        let _: () = raw
            .hset("almost", [("6d1b1c4e-8b33-4bd8-9d0a-1f0f6b7c1d2e:1", "x")])
            .await
            .unwrap();
        let _: () = raw.set("plain", "v", None, None, false).await.unwrap();
        for name in ["profile", "almost", "plain"] {
            for lock in [client.lock(name), client.fair_lock(name).into()] {
                let error = lock.force_unlock().await.unwrap_err();
                assert!(
                    matches!(error, Error::WrongType { .. }),
                    "{name}: {error:?}"
                );
            }
        }
        let visits: String = raw.hget("profile", "visits").await.unwrap();
        assert_eq!(visits, "3");
        assert_eq!(key_count(&raw).await, 3);

        let plain = client.lock("plain");
        assert!(matches!(plain.lock().await, Err(Error::WrongType { .. })));
        assert!(matches!(
            plain.is_locked().await,
            Err(Error::WrongType { .. })
        ));

        // A Redisson-style hold is a lock.
        let _: () = raw
            .hset("java", [("6d1b1c4e-8b33-4bd8-9d0a-1f0f6b7c1d2e:57", 2)])
            .await
            .unwrap();
        assert!(client.lock("java").force_unlock().await.unwrap());
        assert_eq!(key_count(&raw).await, 3);

        // The layout check reads at most 64 fields: a hash of 64 owners with hold counts is a
        // lock, one of 65 is a user's own, whatever its fields.
        let owners = |n: usize| -> Vec<(String, String)> {
            (0..n)
                .map(|i| {
                    (
                        format!("6d1b1c4e-8b33-4bd8-9d0a-1f0f6b7c1d2e:{i}"),
                        "1".into(),
                    )
                })
                .collect()
        };
        let _: () = raw.hset("sixty-four", owners(64)).await.unwrap();
        let _: () = raw.hset("sixty-five", owners(65)).await.unwrap();
        assert!(client.lock("sixty-four").force_unlock().await.unwrap());
        let error = client.lock("sixty-five").force_unlock().await.unwrap_err();
        assert!(matches!(error, Error::WrongType { .. }), "{error:?}");
        let fields: u32 = raw.hlen("sixty-five").await.unwrap();
        assert_eq!((fields, key_count(&raw).await), (65, 4));
    })
    .await;
}

/// A fair lock whose queue or place timeouts key holds another type: the error names that key,
/// and nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_fair_line_names_its_wrong_key() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = common::connect(&server.url()).await.unwrap();
        for (name, broken) in [
            ("q", "redisson_lock_queue:{q}"),
            ("t", "redisson_lock_timeout:{t}"),
        ] {
            let _: () = raw.set(broken, "mine", None, None, false).await.unwrap();
            let lock = client.fair_lock(name);
            let holder = client.fair_lock(name).lock().await;
            match holder {
                Err(Error::WrongType { lock, key }) => {
                    assert_eq!((lock.as_str(), key.as_str()), (name, broken));
                }
                other => panic!("expected WrongType naming {broken}, got {other:?}"),
            }
            let error = lock
                .try_lock(Duration::from_millis(100), None)
                .await
                .unwrap_err();
            assert!(error.to_string().contains(broken), "{error}");
            let error = lock.force_unlock().await.unwrap_err();
            assert!(
                matches!(&error, Error::WrongType { key, .. } if key == broken),
                "{error:?}"
            );
            let value: String = raw.get(broken).await.unwrap();
            assert_eq!(value, "mine");
            let exists: u32 = raw.exists(name).await.unwrap();
            assert_eq!(exists, 0, "nothing written");
        }
    })
    .await;
}

/// 6. Outside a task the owner id reads `t<n>`.
#[test]
fn owners_outside_a_task_are_readable() {
    let server = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(bounded(async {
        let client = common::connect(&server.url()).await.unwrap();
        let guard = client.lock("threaded").lock().await.unwrap();
        let field = guard.owner_field().to_owned();
        let (uuid, owner) = field.split_once(':').unwrap();
        assert_eq!(uuid, client.id().to_string());
        assert!(
            owner.starts_with('t') && owner[1..].parse::<u64>().is_ok(),
            "{field}"
        );
        guard.unlock().await.unwrap();
        client.shutdown().await;
    }));
}

/// 7. Connection errors in one line: the server, what failed, what to check.
#[tokio::test]
async fn errors_name_the_server_and_what_to_check() {
    bounded(async {
        let port = free_port();
        let error = common::connect(&format!("redis://127.0.0.1:{port}"))
            .await
            .unwrap_err()
            .to_string();
        println!("{error}");
        assert!(error.contains(&format!("127.0.0.1:{port}")), "{error}");
        assert!(
            error.to_lowercase().contains("connection refused"),
            "{error}"
        );
        assert!(
            error.contains("check that redis-server is running"),
            "{error}"
        );
        assert!(!error.contains("Os {"), "Debug form: {error}");
        assert!(!error.contains('\n'));
        // Malformed URLs say what is wrong in words and how to write one (issue 42): no url
        // crate error names (RelativeUrlWithoutBase, InvalidPort).
        for (url, says) in [
            ("http//nonsense", "has no scheme"),
            ("127.0.0.1:6379", "has no scheme"),
            ("redis://127.0.0.1:notaport", "is malformed"),
        ] {
            let error = common::connect(url).await.unwrap_err();
            let message = error.to_string();
            assert!(matches!(error, Error::InvalidArgument(_)), "{error:?}");
            assert!(message.contains(says), "{message}");
            assert!(message.contains("redis://"), "{message}");
            assert!(!message.contains("RelativeUrlWithoutBase"), "{message}");
        }
    })
    .await;
}

/// The key prefix applies to every key and channel; different prefixes never collide.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_prefixes_keep_applications_apart() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let app = |prefix: &'static str| {
            common::builder()
                .url(server.url())
                .key_prefix(prefix)
                .build()
        };
        let (one, two) = (app("one:").await.unwrap(), app("two:").await.unwrap());
        let a = one.lock("job").lock().await.unwrap();
        let b = two
            .lock("job")
            .try_lock(Duration::ZERO, None)
            .await
            .unwrap();
        let b = b.expect("another namespace's lock of the same name is another lock");
        assert_eq!(a.name(), "one:job");
        assert_eq!(common::all_keys(&raw).await, ["one:job", "two:job"]);

        // A fair waiter's keys and channel carry the prefix too.
        let waiter = {
            let lock = one.fair_lock("line");
            let _holder = lock.lock().await.unwrap();
            let lock = lock.clone();
            let task = tokio::spawn(async move { lock.lock().await.map(drop) });
            tokio::time::sleep(Duration::from_millis(200)).await;
            let queued: u32 = raw.exists("redisson_lock_queue:{one:line}").await.unwrap();
            assert_eq!(queued, 1);
            let channels: Vec<String> = raw
                .custom(fred::cmd!("PUBSUB"), vec!["CHANNELS", "*one:*"])
                .await
                .unwrap();
            assert!(!channels.is_empty());
            task
        };
        waiter.await.unwrap().unwrap();
        drop((a, b));
        assert!(matches!(app("x{").await, Err(Error::InvalidArgument(_))));
        assert!(matches!(
            RedLock::new(vec![one.clone(), two.clone()], "r"),
            Err(Error::InvalidArgument(_))
        ));
        // One connection setup for data and locks (fred's client, where the lock client is on
        // fred).
        if let Some(redis) = one.redis() {
            let _: () = redis.set("data", 1, None, None, false).await.unwrap();
            let data: i64 = raw.get("data").await.unwrap();
            assert_eq!(data, 1);
        }
    })
    .await;
}

/// `with_lock` returns the work's value, and stops the work when the lock is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_lock_runs_work_under_the_lock_and_stops_it_when_lost() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = server.lock_client(Duration::from_millis(600)).await;
        let lock = client.lock("work");
        let value = lock
            .with_lock(|_| async { lock.hold_count().await.unwrap() })
            .await
            .unwrap();
        assert_eq!(value, 1);
        assert!(!lock.is_locked().await.unwrap(), "unlocked afterwards");

        let finished = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = finished.clone();
        let started = Instant::now();
        let outcome = lock
            .with_lock(|lost| async move {
                let _: i64 = raw.del("work").await.unwrap();
                tokio::time::sleep(Duration::from_secs(10)).await;
                flag.store(true, std::sync::atomic::Ordering::SeqCst);
                lost.is_cancelled()
            })
            .await;
        assert!(matches!(outcome, Err(Error::Lost { .. })), "{outcome:?}");
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
        assert!(!finished.load(std::sync::atomic::Ordering::SeqCst));
    })
    .await;
}

/// Runs `call` bounded by `limit`: it must end (with any result), never hang or panic.
async fn ends<T, F: Future<Output = T>>(what: &str, limit: Duration, call: F) -> T {
    match tokio::time::timeout(limit, call).await {
        Ok(value) => value,
        Err(_) => panic!("{what} did not end within {limit:?}"),
    }
}

/// The sweep: every public method that takes a name or a duration, with empty, huge and
/// brace-mixed names and edge durations: never a panic, never a hang past its bound, never a
/// key without a TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_input_sweep() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = common::connect(&server.url()).await.unwrap();
        let second = common::connect(&server.url()).await.unwrap();
        let huge = "h".repeat(1 << 20);
        let mut names: Vec<String> = vec![String::new(), huge];
        names.extend(BRACED_NAMES.iter().map(|name| name.to_string()));
        let limit = Duration::from_secs(10);
        for name in &names {
            let shown = &name[..name.len().min(12)];
            for lock in [
                client.lock(name.clone()),
                client.fair_lock(name.clone()).into(),
            ] {
                let what =
                    |method: &str| format!("{method} on {shown:?} (fair: {})", lock.is_fair());
                if let Ok(guard) = ends(&what("lock"), limit, lock.lock()).await {
                    guard.unlock().await.unwrap();
                }
                let _ = ends(&what("is_locked"), limit, lock.is_locked()).await;
                let _ = ends(&what("hold_count"), limit, lock.hold_count()).await;
                let _ = ends(&what("held"), limit, lock.is_held_by_current_task()).await;
                let _ = ends(&what("remaining_lease"), limit, lock.remaining_lease()).await;
                let _ = ends(&what("force_unlock"), limit, lock.force_unlock()).await;
                let _ = ends(&what("with_lock"), limit, lock.with_lock(|_| async {})).await;
                for duration in EDGE_DURATIONS {
                    let what = |method: &str| format!("{} {duration:?}", what(method));
                    if let Ok(guard) = ends(
                        &what("lock_with_lease"),
                        limit,
                        lock.lock_with_lease(duration),
                    )
                    .await
                    {
                        guard.unlock().await.unwrap();
                    }
                    for lease in [None, Some(duration), Some(Duration::from_secs(5))] {
                        let call = lock.try_lock(duration, lease);
                        if let Ok(Some(guard)) = ends(&what("try_lock"), limit, call).await {
                            guard.unlock().await.unwrap();
                        }
                    }
                }
            }
            let multi = MultiLock::new(vec![client.lock(name.clone()), second.lock(name.clone())]);
            if let Ok(multi) = multi {
                for duration in EDGE_DURATIONS {
                    let outcome = ends(
                        "multi lock_with_lease",
                        limit,
                        multi.lock_with_lease(duration),
                    )
                    .await;
                    is_invalid(outcome);
                    let wait = duration.min(Duration::from_millis(300));
                    let outcome = ends(
                        "multi try_lock",
                        limit,
                        multi.try_lock(wait, Some(duration)),
                    )
                    .await;
                    is_invalid(outcome);
                }
                // Two owners of one lock never both get it: a bounded try with a valid lease
                // ends with None, unless the name itself is refused.
                let outcome = ends(
                    "multi try_lock",
                    limit,
                    multi.try_lock(Duration::from_millis(300), Some(Duration::from_secs(5))),
                )
                .await;
                match outcome {
                    Ok(None) | Err(Error::InvalidArgument(_)) => {}
                    Ok(Some(_)) => {
                        panic!("multi try_lock on {shown:?}: both owners of one lock held it")
                    }
                    Err(error) => panic!("multi try_lock on {shown:?}: {error}"),
                }
            }
            for duration in EDGE_DURATIONS {
                let built = RedLock::builder(vec![client.clone()], name.clone())
                    .lease(duration)
                    .build();
                is_invalid(built.map(drop));
                for (i, built) in [
                    RedLock::builder(vec![client.clone()], name.clone())
                        .node_timeout(duration)
                        .build(),
                    RedLock::builder(vec![client.clone()], name.clone())
                        .max_hold(duration)
                        .build(),
                    RedLock::builder(vec![client.clone()], name.clone())
                        .retry_delay(duration..=duration)
                        .build(),
                ]
                .into_iter()
                .enumerate()
                {
                    // A retry delay of 0 or 1 ns is fine; every other edge value is refused.
                    if built.is_ok() {
                        let short = duration <= Duration::from_nanos(1);
                        assert!(i == 2 && short && !name.is_empty(), "{i} {duration:?}");
                    }
                }
                if let Ok(redlock) = RedLock::new(vec![client.clone()], name.clone()) {
                    if let Ok(guard) = ends(
                        "redlock lock_with_lease",
                        limit,
                        redlock.lock_with_lease(duration),
                    )
                    .await
                    {
                        guard.unlock().await.unwrap();
                    }
                    let call = redlock.try_lock(duration, Some(Duration::from_secs(5)));
                    if let Ok(Some(guard)) = ends("redlock try_lock", limit, call).await {
                        guard.unlock().await.unwrap();
                    }
                }
            }
            every_key_expires(&raw).await;
        }
        for duration in EDGE_DURATIONS {
            for builder in [
                common::builder().watchdog_lease(duration),
                common::builder().queue_place(duration),
                common::builder().command_timeout(duration),
            ] {
                let built = ends("build", limit, builder.url(server.url()).build()).await;
                is_invalid(built.map(drop));
            }
        }
        every_key_expires(&raw).await;
    })
    .await;
}

/// A client of `server` whose fred connection tries again every `delay` after a drop, without
/// end.
async fn reconnecting_every(server: &RedisServer, delay: Duration) -> LockClient {
    common::builder()
        .url(server.url())
        .reconnect_policy(fred::types::config::ReconnectPolicy::new_constant(
            0,
            delay.as_millis() as u32,
        ))
        .build()
        .await
        .unwrap()
}

/// `reconnect_policy` is the one fred follows: with a constant 3 s between attempts, a client
/// whose server restarted at once is back no sooner than that (the default backs off from
/// 100 ms), and then locks again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reconnect_policy_given_is_followed() {
    bounded(async {
        let mut server = RedisServer::start();
        let delay = Duration::from_secs(3);
        let client = reconnecting_every(&server, delay).await;
        let lock = client.lock("policy");
        lock.lock().await.unwrap().unlock().await.unwrap();
        let cut = Instant::now();
        server.start_again();
        let back = loop {
            match lock.try_lock(Duration::ZERO, None).await {
                Ok(Some(guard)) => {
                    guard.unlock().await.unwrap();
                    break cut.elapsed();
                }
                Ok(None) => panic!("nobody else holds it"),
                Err(_) if cut.elapsed() < Duration::from_secs(30) => {
                    tokio::time::sleep(Duration::from_millis(50)).await
                }
                Err(error) => panic!("not back after 30 s: {error}"),
            }
        };
        println!("locked again {back:?} after the restart");
        assert!(back >= delay - Duration::from_millis(500), "{back:?}");
        client.shutdown().await;
    })
    .await;
}

/// A dropped connection fails a call at once, whatever the reconnect delay: fred counts itself
/// connected until its first reconnect attempt (here 3 s after the drop), and a call sent
/// before it would wait for that attempt and then the command timeout. The engine follows the
/// drop itself, and waits without spinning until the connection is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_connection_fails_calls_before_the_first_reconnect() {
    bounded(async {
        let mut server = RedisServer::start();
        let delay = Duration::from_secs(3);
        let client = reconnecting_every(&server, delay).await;
        let lock = client.lock("dropped");
        lock.lock().await.unwrap().unlock().await.unwrap();
        server.kill();
        // The drop is read off the socket at once; the first reconnect is 3 s away.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let started = Instant::now();
        let error = lock.try_lock(Duration::ZERO, None).await.unwrap_err();
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "a single attempt waited {:?} (the next reconnect is {delay:?} after the drop)",
            started.elapsed()
        );
        assert!(matches!(error, Error::Unavailable { .. }), "{error:?}");
        // A wait through the outage: back once fred reconnects, after its delay.
        let cut = Instant::now();
        server.start_again();
        let guard = lock
            .try_lock(Duration::from_secs(20), None)
            .await
            .unwrap()
            .expect("acquired once the connection is back");
        println!("locked {:?} after the restart", cut.elapsed());
        guard.unlock().await.unwrap();
        client.shutdown().await;
    })
    .await;
}

/// A password in the URL logs in, and is never shown: not in the builder's or the client's
/// `Debug`, not in an error (a wrong password, a refused URL), not in a log line at any level.
#[test]
fn a_password_in_the_url_works_and_is_never_shown() {
    let (logged, _default) = logs::capture_logs(tracing::Level::TRACE);
    // One thread: every task of the clients logs through the default set here.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let secret = "s3cret-pass-7f";
    let wrong = "wr0ng-pass-7f";
    let mut shown = Vec::new();
    runtime.block_on(bounded(async {
        let server = RedisServer::start_with(
            &[
                "--user",
                "alice",
                "on",
                &format!(">{secret}"),
                "~*",
                "&*",
                "+@all",
            ],
            free_port,
        );
        let url = format!("redis://alice:{secret}@127.0.0.1:{}", server.port());
        let builder = common::builder().url(url.clone());
        shown.push(format!("{builder:?}"));
        let client = builder.build().await.expect("alice logs in");
        shown.push(format!("{client:?}"));
        let guard = client.lock("secret:held").lock().await.unwrap();
        shown.push(format!("{guard:?}"));
        guard.unlock().await.unwrap();

        let refused = common::builder()
            .url(format!("redis://alice:{wrong}@127.0.0.1:{}", server.port()))
            .build()
            .await
            .expect_err("a wrong password is refused");
        shown.push(refused.to_string());
        shown.push(format!("{refused:?}"));
        for url in [
            format!("http://alice:{secret}@127.0.0.1:1"),
            format!("alice:{secret}@127.0.0.1:1"),
            format!("redis://alice:{secret}@127.0.0.1:notaport"),
            format!(
                "redis-sentinel://:{secret}@127.0.0.1:1/0?sentinelServiceName=locks&\
                 sentinelPassword={wrong}&port=x"
            ),
        ] {
            let builder = common::builder().url(url.clone());
            shown.push(format!("{builder:?}"));
            if let Err(error) = builder.build().await {
                shown.push(error.to_string());
                shown.push(format!("{error:?}"));
            }
        }
        client.shutdown().await;
    }));
    shown.push(logged.text());
    for text in &shown {
        assert!(
            !text.contains(secret) && !text.contains(wrong),
            "a password shown: {text}"
        );
    }
    assert!(
        shown[0].contains("alice:***@"),
        "the URL is shown with its password hidden: {}",
        shown[0]
    );
}

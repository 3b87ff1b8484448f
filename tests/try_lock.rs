//! Redisson's grammar on every lock type (issue 42, point 1): `try_lock(wait, lease)` as a
//! Redisson user writes `tryLock(waitTime, leaseTime)`, with the lease a bare `Duration` (a
//! fixed lease, never renewed), `None` (the watchdog's, renewed while the guard lives) or
//! `Some(d)`; and `try_lock_now()`, Redisson's `tryLock()`. Each type is called through its own
//! method, so a type whose `try_lock` took another shape would not compile here.

mod common;

use std::time::Duration;

use common::{bounded, lock_client_at, RedisServer};
use fredlock::{LockClient, MultiLock, RedLock};
use tokio::time::Instant;

/// The watchdog lease of every client here: short, so that "still held past it" is quick to see.
const WATCHDOG: Duration = Duration::from_secs(1);
/// The fixed lease the first hold takes.
const LEASE: Duration = Duration::from_millis(1500);

/// Two clients of one server: two owners.
async fn two_clients(server: &RedisServer) -> (LockClient, LockClient) {
    (
        lock_client_at(&server.url(), WATCHDOG).await,
        lock_client_at(&server.url(), WATCHDOG).await,
    )
}

/// The grammar's behaviour, for a type whose handles `mine` and `theirs` belong to two owners
/// that exclude each other:
/// 1. `try_lock(wait, Duration)` takes a free lock within the wait, for a fixed lease;
/// 2. meanwhile the other owner's `try_lock_now()` and `try_lock(wait, None)` give `None`, the
///    latter after its wait;
/// 3. the fixed lease is not renewed: the other owner, waiting, gets the lock when it ends;
/// 4. a lease of `None` is renewed by the watchdog: held past several watchdog leases;
/// 5. `Some(lease)` is taken as well.
macro_rules! redisson_grammar {
    ($test:ident, |$server:ident| $setup:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $test() {
            bounded(async {
                let $server = RedisServer::start();
                let (mine, theirs, _keep) = $setup;

                let started = Instant::now();
                let guard = mine
                    .try_lock(Duration::from_secs(2), LEASE)
                    .await
                    .unwrap()
                    .expect("a free lock is taken within the wait");
                let taken = Instant::now();
                assert!(started.elapsed() < Duration::from_millis(500));

                assert!(theirs.try_lock_now().await.unwrap().is_none());
                let started = Instant::now();
                let none = theirs
                    .try_lock(Duration::from_millis(300), None)
                    .await
                    .unwrap();
                assert!(none.is_none(), "held by the other owner");
                let waited = started.elapsed();
                assert!(waited >= Duration::from_millis(300), "waited {waited:?}");

                // Not renewed: the fixed lease ends the hold, and a waiter gets it then.
                let rival = theirs
                    .try_lock(Duration::from_secs(5), None)
                    .await
                    .unwrap()
                    .expect("the fixed lease ended within the wait");
                let after = taken.elapsed();
                assert!(
                    after >= LEASE - Duration::from_millis(100),
                    "taken {after:?} after the first hold, before its lease of {LEASE:?} ended"
                );
                assert!(
                    after < LEASE + Duration::from_secs(2),
                    "taken after {after:?}"
                );
                drop(guard);

                // The watchdog's lease: renewed past several leases while the guard lives.
                tokio::time::sleep(WATCHDOG * 3).await;
                assert!(
                    mine.try_lock_now().await.unwrap().is_none(),
                    "a hold with lease None outlived its watchdog lease"
                );
                rival.unlock().await.unwrap();

                let again = mine
                    .try_lock(Duration::ZERO, Some(LEASE))
                    .await
                    .unwrap()
                    .expect("free again");
                again.unlock().await.unwrap();
            })
            .await
        }
    };
}

redisson_grammar!(lock, |server| {
    let (a, b) = two_clients(&server).await;
    (a.lock("grammar"), b.lock("grammar"), ())
});

redisson_grammar!(non_reentrant_lock, |server| {
    let (a, b) = two_clients(&server).await;
    (
        a.non_reentrant_lock("grammar"),
        b.non_reentrant_lock("grammar"),
        (),
    )
});

redisson_grammar!(fair_lock, |server| {
    let (a, b) = two_clients(&server).await;
    (a.fair_lock("grammar"), b.fair_lock("grammar"), ())
});

redisson_grammar!(non_reentrant_fair_lock, |server| {
    let (a, b) = two_clients(&server).await;
    (
        a.non_reentrant_fair_lock("grammar"),
        b.non_reentrant_fair_lock("grammar"),
        (),
    )
});

redisson_grammar!(fenced_lock, |server| {
    let (a, b) = two_clients(&server).await;
    (a.fenced_lock("grammar"), b.fenced_lock("grammar"), ())
});

redisson_grammar!(spin_lock, |server| {
    let (a, b) = two_clients(&server).await;
    (a.spin_lock("grammar"), b.spin_lock("grammar"), ())
});

// A reader excludes a writer (two readers share the lock, so the rival writes).
redisson_grammar!(read_lock, |server| {
    let (a, b) = two_clients(&server).await;
    (
        a.rw_lock("grammar").read_lock(),
        b.rw_lock("grammar").write_lock(),
        (),
    )
});

redisson_grammar!(write_lock, |server| {
    let (a, b) = two_clients(&server).await;
    (
        a.rw_lock("grammar").write_lock(),
        b.rw_lock("grammar").write_lock(),
        (),
    )
});

redisson_grammar!(multi_lock, |server| {
    let (a, b) = two_clients(&server).await;
    let of = |client: &LockClient| {
        MultiLock::new(vec![client.lock("grammar:a"), client.lock("grammar:b")]).unwrap()
    };
    (of(&a), of(&b), ())
});

// Three independent masters (and the first test server, unused).
redisson_grammar!(red_lock, |server| {
    let _ = &server;
    let servers = common::start_servers(3);
    let mut mine = Vec::new();
    let mut theirs = Vec::new();
    for node in &servers {
        mine.push(lock_client_at(&node.url(), WATCHDOG).await);
        theirs.push(lock_client_at(&node.url(), WATCHDOG).await);
    }
    let of = |nodes| {
        RedLock::builder(nodes, "grammar")
            .lease(WATCHDOG)
            .retry_delay(Duration::from_millis(10)..=Duration::from_millis(30))
            .build()
            .unwrap()
    };
    (of(mine), of(theirs), servers)
});

/// The blocking lock, from plain threads: the same grammar.
#[cfg(feature = "blocking")]
#[test]
fn blocking_lock() {
    let server = RedisServer::start();
    let url = server.url();
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let client = |url: &str| {
            fredlock::blocking::LockClient::build(
                common::builder().url(url).watchdog_lease(WATCHDOG),
            )
            .unwrap()
        };
        let (a, b) = (client(&url), client(&url));
        let (mine, theirs) = (a.lock("grammar"), b.lock("grammar"));

        let guard = mine
            .try_lock(Duration::from_secs(2), LEASE)
            .unwrap()
            .expect("a free lock is taken within the wait");
        let taken = std::time::Instant::now();
        assert!(theirs.try_lock_now().unwrap().is_none());
        assert!(theirs
            .try_lock(Duration::from_millis(300), None)
            .unwrap()
            .is_none());
        let rival = theirs
            .try_lock(Duration::from_secs(5), None)
            .unwrap()
            .expect("the fixed lease ended within the wait");
        assert!(taken.elapsed() >= LEASE - Duration::from_millis(100));
        drop(guard);
        std::thread::sleep(WATCHDOG * 3);
        assert!(mine.try_lock_now().unwrap().is_none());
        rival.unlock().unwrap();
        mine.try_lock(Duration::ZERO, Some(LEASE))
            .unwrap()
            .expect("free again")
            .unlock()
            .unwrap();
        a.shutdown().unwrap();
        b.shutdown().unwrap();
        let _ = done.send(());
    });
    finished
        .recv_timeout(common::TEST_LIMIT)
        .expect("the blocking grammar ran to its end in time");
}

/// A bounded wait that ends while the server is gone says why no attempt reached it: its
/// `Unavailable` carries the last failure its attempts met (nothing sent: the connection is
/// down; or an attempt sent as the server died and still unanswered at the wait's end), not a
/// bare "could not be reached". And it ends at its wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_given_up_in_an_outage_names_the_last_failure() {
    bounded(async {
        let mut server = RedisServer::start();
        let client = lock_client_at(&server.url(), WATCHDOG).await;
        let lock = client.lock("gone");
        lock.try_lock_now()
            .await
            .unwrap()
            .unwrap()
            .unlock()
            .await
            .unwrap();
        server.kill();
        let wait = Duration::from_millis(500);
        let started = Instant::now();
        let outcome = lock.try_lock(wait, None).await;
        // Ends at its wait, not at the command timeout (5 s) of an attempt the client holds back
        // while it reconnects; the slack is for a loaded machine.
        let took = started.elapsed();
        assert!(
            took < wait + Duration::from_secs(2),
            "a bounded wait ends at its bound: took {took:?}"
        );
        match outcome {
            Err(fredlock::Error::Unavailable {
                source: Some(source),
                ..
            }) => assert!(
                !source.to_string().trim().is_empty(),
                "the cause has its words: {source:?}"
            ),
            other => panic!("expected Unavailable with its cause, got {other:?}"),
        }
        client.shutdown().await;
    })
    .await;
}

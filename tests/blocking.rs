//! The blocking API (feature `blocking`) from plain `std::thread`s against a real server:
//! exclusion across threads and clients, reentrancy per thread, a dropped guard that gives its
//! hold back, `try_lock` timeouts, and a clear error (no panic, no deadlock) from inside an
//! async runtime.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use common::RedisServer;
use fredlock::blocking::LockClient;
use fredlock::Error;

/// Handles and guards cross threads.
const _: () = {
    const fn shareable<T: Send + Sync + 'static>() {}
    shareable::<LockClient>();
    shareable::<fredlock::blocking::Lock>();
    shareable::<fredlock::blocking::LockGuard>();
};

/// Runs `body` on a thread of its own, failing the test if it takes longer than `limit`: a
/// blocking call that hangs fails instead of blocking the suite.
fn bounded_thread<T: Send + 'static>(
    limit: Duration,
    body: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (done, result) = std::sync::mpsc::channel();
    thread::spawn(move || {
        let _ = done.send(body());
    });
    result
        .recv_timeout(limit)
        .expect("the blocking test ended in time")
}

/// Two clients, four threads each, take turns on one lock: never two inside at once, and every
/// turn is taken.
#[test]
fn threads_of_two_clients_exclude_each_other() {
    let server = RedisServer::start();
    let url = server.url();
    bounded_thread(Duration::from_secs(60), move || {
        let clients = [
            LockClient::connect(&url).unwrap(),
            LockClient::connect(&url).unwrap(),
        ];
        let inside = Arc::new(AtomicBool::new(false));
        let turns = Arc::new(AtomicU32::new(0));
        let start = Arc::new(Barrier::new(8));
        let threads: Vec<_> = (0..8)
            .map(|n| {
                let lock = clients[n % 2].lock("shared");
                let (inside, turns, start) = (inside.clone(), turns.clone(), start.clone());
                thread::spawn(move || {
                    start.wait();
                    for _ in 0..10 {
                        let guard = lock.lock().unwrap();
                        assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                        thread::sleep(Duration::from_millis(2));
                        inside.store(false, Ordering::SeqCst);
                        turns.fetch_add(1, Ordering::SeqCst);
                        guard.unlock().unwrap();
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        assert_eq!(turns.load(Ordering::SeqCst), 80);
        for client in clients {
            client.shutdown().unwrap();
        }
    });
}

/// A thread that holds a lock takes it again (hold count 2); another thread of the same client
/// waits; a non-reentrant lock refuses its holder.
#[test]
fn reentrancy_is_per_thread() {
    let server = RedisServer::start();
    let url = server.url();
    bounded_thread(Duration::from_secs(30), move || {
        let client = LockClient::connect(&url).unwrap();
        let lock = client.lock("per-thread");
        let outer = lock.lock().unwrap();
        let inner = lock.lock().unwrap();
        assert_eq!(lock.hold_count().unwrap(), 2);
        let other = {
            let lock = lock.clone();
            thread::spawn(move || {
                let started = Instant::now();
                let got = lock.try_lock(Duration::from_millis(200), None).unwrap();
                (got.is_some(), started.elapsed(), lock.hold_count().unwrap())
            })
        };
        let (got, waited, count) = other.join().unwrap();
        assert!(!got, "another thread got a held lock");
        assert!(waited >= Duration::from_millis(200), "{waited:?}");
        assert_eq!(count, 0);
        inner.unlock().unwrap();
        outer.unlock().unwrap();
        assert!(!lock.is_locked().unwrap());

        let once = client.non_reentrant_lock("once");
        let guard = once.lock().unwrap();
        assert!(matches!(once.lock(), Err(Error::WouldDeadlock { .. })));
        guard.unlock().unwrap();
        client.shutdown().unwrap();
    });
}

/// Dropping a guard gives its hold back: a thread waiting on another client gets the lock
/// within moments, not at the end of a lease; a thread's guard may be moved to and dropped on
/// another thread.
#[test]
fn a_dropped_guard_gives_the_lock_back() {
    let server = RedisServer::start();
    let url = server.url();
    bounded_thread(Duration::from_secs(30), move || {
        let holder = LockClient::connect(&url).unwrap();
        let waiter = LockClient::connect(&url).unwrap();
        let guard = holder.lock("dropped").lock().unwrap();
        let waiting = {
            let lock = waiter.lock("dropped");
            thread::spawn(move || {
                let guard = lock.lock().unwrap();
                let at = Instant::now();
                guard.unlock().unwrap();
                at
            })
        };
        thread::sleep(Duration::from_millis(300));
        let dropped_at = Instant::now();
        thread::spawn(move || drop(guard)).join().unwrap();
        let got_at = waiting.join().unwrap();
        let took = got_at.duration_since(dropped_at);
        assert!(took < Duration::from_secs(1), "{took:?} after the drop");
        holder.shutdown().unwrap();
        waiter.shutdown().unwrap();
    });
}

/// `try_lock` waits its wait and no longer while the lock is held, returns at once when it is
/// free, and a lease ends a hold by itself; a shut-down client says so.
#[test]
fn try_lock_waits_its_wait_and_leases_end() {
    let server = RedisServer::start();
    let url = server.url();
    bounded_thread(Duration::from_secs(30), move || {
        let client = LockClient::connect(&url).unwrap();
        let other = LockClient::connect(&url).unwrap();
        let guard = client
            .lock("leased")
            .lock_with_lease(Duration::from_millis(500))
            .unwrap();
        let lock = other.lock("leased");
        let started = Instant::now();
        assert!(lock
            .try_lock(Duration::from_millis(150), None)
            .unwrap()
            .is_none());
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(150) && waited < Duration::from_millis(450),
            "{waited:?}"
        );
        // The lease ends the hold: the waiter gets it by then.
        let got = lock.try_lock(Duration::from_secs(2), None).unwrap();
        assert!(got.is_some());
        assert!(
            started.elapsed() < Duration::from_millis(900),
            "{:?}",
            started.elapsed()
        );
        assert!(guard.is_lost());
        drop(got);
        let started = Instant::now();
        let free = other
            .lock("free")
            .try_lock(Duration::from_secs(5), None)
            .unwrap();
        assert!(free.is_some() && started.elapsed() < Duration::from_millis(200));
        drop(free);
        other.shutdown().unwrap();
        assert!(matches!(
            other.lock("free").try_lock(Duration::ZERO, None),
            Err(Error::Shutdown)
        ));
        client.shutdown().unwrap();
    });
}

/// From inside a current-thread runtime every blocking call fails at once with a clear error
/// naming the call, instead of panicking or deadlocking the runtime; a blocking client dropped
/// there does not panic either.
#[tokio::test(flavor = "current_thread")]
async fn inside_a_current_thread_runtime_it_refuses_instead_of_blocking() {
    let server = RedisServer::start();
    let refused = |result: fredlock::Result<()>, call: &str| match result {
        Err(Error::InvalidArgument(message)) => {
            assert!(
                message.contains("inside a current-thread tokio runtime"),
                "{message}"
            );
            assert!(message.contains("fredlock::LockClient"), "{message}");
            assert!(
                message.contains(&format!("fredlock::blocking::{call} ")),
                "{message}"
            );
        }
        other => panic!("not refused: {other:?}"),
    };
    refused(
        LockClient::connect(&server.url()).map(drop),
        "LockClient::connect",
    );
    refused(
        LockClient::build(fredlock::LockClient::builder().url(server.url())).map(drop),
        "LockClient::build",
    );
    // A client made on a plain thread, then used (and dropped) inside the runtime.
    let url = server.url();
    let client = thread::spawn(move || LockClient::connect(&url).unwrap())
        .join()
        .unwrap();
    let lock = client.lock("inside");
    refused(lock.lock().map(drop), "Lock::lock");
    refused(
        lock.try_lock(Duration::ZERO, None).map(drop),
        "Lock::try_lock",
    );
    refused(client.shutdown(), "LockClient::shutdown");
    drop(lock);
    drop(client);
}

/// Issue 42, point 4: on a multi-thread runtime the blocking API works where reqwest's blocking
/// client does: on `spawn_blocking` threads (made to block), and even on a worker (through
/// `block_in_place`, so the runtime's other tasks go on: here, the task that holds the lock and
/// gives it back while the worker blocks for it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_thread_runtime_may_block_on_spawn_blocking_threads_and_workers() {
    let server = RedisServer::start();
    let url = server.url();
    let client = tokio::task::spawn_blocking(move || LockClient::connect(&url))
        .await
        .unwrap()
        .expect("connects on a spawn_blocking thread");
    let on_blocking_thread = client.clone();
    tokio::task::spawn_blocking(move || {
        let lock = on_blocking_thread.lock("multi");
        let guard = lock.lock().unwrap();
        assert!(
            lock.try_lock(Duration::ZERO, None).unwrap().is_some(),
            "reentrant on its thread"
        );
        guard.unlock().unwrap();
    })
    .await
    .unwrap();

    // Held by another owner (a task of this runtime), which lets go 300 ms later: a worker
    // blocking for it must not keep that task from running.
    let holder = client.as_async().lock("multi");
    let held = holder.lock().await.unwrap();
    let released = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        held.unlock().await.unwrap();
    });
    let on_worker = client.clone();
    let took = tokio::spawn(async move {
        let started = Instant::now();
        let guard = on_worker
            .lock("multi")
            .try_lock(Duration::from_secs(10), None)
            .unwrap()
            .expect("given back while this worker blocked");
        guard.unlock().unwrap();
        started.elapsed()
    })
    .await
    .unwrap();
    released.await.unwrap();
    assert!(took < Duration::from_secs(5), "took {took:?}");
    tokio::task::spawn_blocking(move || client.shutdown())
        .await
        .unwrap()
        .unwrap();
}

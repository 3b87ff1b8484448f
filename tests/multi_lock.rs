//! MultiLock: several locks, possibly on different clients and servers, all or nothing.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{bounded, RedisServer};
use fred::prelude::*;
use fredlock::{Error, LockClient, MultiLock};
use tokio::time::Instant;

/// Two service instances, each with a client on each of two servers.
struct Setup {
    servers: [RedisServer; 2],
    /// `instances[i][s]`: instance i's client on server s.
    instances: Vec<[LockClient; 2]>,
}

impl Setup {
    async fn start() -> Setup {
        let servers = [RedisServer::start(), RedisServer::start()];
        let mut instances = Vec::new();
        for _ in 0..2 {
            instances.push([
                common::connect(&servers[0].url()).await.unwrap(),
                common::connect(&servers[1].url()).await.unwrap(),
            ]);
        }
        Setup { servers, instances }
    }

    /// Lock `name` through `instance`: "a" and "c" live on server 0, "b" on server 1.
    fn lock(&self, instance: usize, name: &str) -> fredlock::Lock {
        let server = usize::from(name == "b");
        self.instances[instance][server].lock(name)
    }

    fn multi(&self, instance: usize, names: &[&str]) -> MultiLock {
        MultiLock::new(names.iter().map(|name| self.lock(instance, name)).collect()).unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn overlapping_sets_in_opposite_orders_never_deadlock_or_overlap() {
    bounded(async {
        let setup = Arc::new(Setup::start().await);
        let sets: [&[&str]; 8] = [
            &["a", "b"],
            &["b", "a"],
            &["b", "c"],
            &["c", "b"],
            &["c", "a"],
            &["a", "c"],
            &["a", "b", "c"],
            &["c", "b", "a"],
        ];
        // Holders inside each lock's critical section right now.
        let inside: Arc<[AtomicUsize; 3]> = Arc::new(Default::default());
        let index = |name: &str| (name.as_bytes()[0] - b'a') as usize;
        let until = Instant::now() + Duration::from_secs(3);
        let mut tasks = Vec::new();
        for (task, names) in sets.into_iter().enumerate() {
            let multi = setup.multi(task % 2, names);
            let inside = inside.clone();
            tasks.push(tokio::spawn(async move {
                let mut acquired = 0u32;
                while Instant::now() < until {
                    let guard = tokio::time::timeout(Duration::from_secs(10), multi.lock())
                        .await
                        .unwrap_or_else(|_| panic!("task {task} {names:?}: no progress in 10 s"))
                        .unwrap();
                    for name in names {
                        let before = inside[index(name)].fetch_add(1, Ordering::SeqCst);
                        assert_eq!(before, 0, "task {task}: {name} held twice at once");
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    for name in names {
                        inside[index(name)].fetch_sub(1, Ordering::SeqCst);
                    }
                    guard.unlock().await.unwrap();
                    acquired += 1;
                }
                acquired
            }));
        }
        let mut counts = Vec::new();
        for task in tasks {
            counts.push(task.await.unwrap());
        }
        println!("acquisitions per task in 3 s: {counts:?}");
        assert!(
            counts.iter().all(|&count| count > 0),
            "a task never acquired its set: {counts:?}"
        );
        for name in ["a", "b", "c"] {
            assert!(
                !setup.lock(0, name).is_locked().await.unwrap(),
                "{name} left held"
            );
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_member_releases_the_others() {
    bounded(async {
        let setup = Setup::start().await;
        let holder_lock = setup.lock(1, "b");
        let (held_tx, held_rx) = tokio::sync::oneshot::channel();
        let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
        let holder = tokio::spawn(async move {
            let guard = holder_lock.lock().await.unwrap();
            held_tx.send(()).unwrap();
            let _ = release_rx.await;
            guard.unlock().await.unwrap();
        });
        held_rx.await.unwrap();
        let multi = setup.multi(0, &["a", "b", "c"]);
        let a = setup.lock(0, "a");
        let c = setup.lock(0, "c");

        // One round: a and c are taken, b is not, so a and c are given back before it returns.
        assert!(multi
            .try_lock(Duration::ZERO, None)
            .await
            .unwrap()
            .is_none());
        assert!(!a.is_locked().await.unwrap());
        assert!(!c.is_locked().await.unwrap());

        // Waiting holds nothing: a and c stay free all along, and are free when it gives up.
        let waiting = tokio::spawn({
            let multi = multi.clone();
            async move { multi.try_lock(Duration::from_millis(600), None).await }
        });
        // Its first round takes a and c for a moment; after that it waits for b alone.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut samples = 0;
        while !waiting.is_finished() {
            assert!(!a.is_locked().await.unwrap(), "a held while waiting for b");
            assert!(!c.is_locked().await.unwrap(), "c held while waiting for b");
            samples += 1;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(samples > 10);
        assert!(waiting.await.unwrap().unwrap().is_none());
        assert!(!a.is_locked().await.unwrap() && !c.is_locked().await.unwrap());

        // Once b is given back, the waiting multi-lock gets all three.
        let waiting = tokio::spawn({
            let multi = multi.clone();
            async move { multi.try_lock(Duration::from_secs(5), None).await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        let released = Instant::now();
        release_tx.send(()).unwrap();
        holder.await.unwrap();
        let guard = waiting
            .await
            .unwrap()
            .unwrap()
            .expect("all three after b was freed");
        println!("acquired {:?} after b was released", released.elapsed());
        assert!(released.elapsed() < Duration::from_millis(500));
        assert_eq!(guard.guards().len(), 3);
        guard.unlock().await.unwrap();
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_member_error_releases_the_others_and_is_returned() {
    bounded(async {
        let setup = Setup::start().await;
        // "c" is a string, not a lock: its script fails with WRONGTYPE.
        let raw = setup.servers[0].raw().await;
        let _: () = raw.set("c", "not a lock", None, None, false).await.unwrap();
        let multi = setup.multi(0, &["a", "b", "c"]);
        let outcome = multi.try_lock(Duration::from_secs(1), None).await;
        assert!(
            matches!(&outcome, Err(Error::WrongType { lock, .. }) if lock == "c"),
            "{outcome:?}"
        );
        assert!(!setup.lock(0, "a").is_locked().await.unwrap());
        assert!(!setup.lock(0, "b").is_locked().await.unwrap());
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unlock_releases_every_member_and_reports_every_failure() {
    bounded(async {
        let setup = Setup::start().await;
        let multi = setup.multi(0, &["a", "b", "c"]);
        let guard = multi.lock().await.unwrap();
        assert!(!guard.is_lost());
        // a and c are deleted behind the holder's back.
        assert!(setup.lock(1, "a").force_unlock().await.unwrap());
        assert!(setup.lock(1, "c").force_unlock().await.unwrap());
        match guard.unlock().await {
            Err(Error::Members(errors)) => {
                let mut names: Vec<String> = errors
                    .iter()
                    .map(|error| match error {
                        Error::NotHeld { lock, .. } => lock.clone(),
                        other => panic!("unexpected member error {other:?}"),
                    })
                    .collect();
                names.sort();
                assert_eq!(names, ["a", "c"]);
                println!("{}", Error::Members(errors));
            }
            other => panic!("expected both failures, got {other:?}"),
        }
        // b, whose unlock succeeded, is free.
        assert!(!setup.lock(0, "b").is_locked().await.unwrap());
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn loss_of_any_member_is_reported() {
    bounded(async {
        let setup = Setup::start().await;
        // Short watchdog periods, so that the deletion is noticed within 300 ms.
        let watchdog = Duration::from_millis(900);
        let multi = MultiLock::new(vec![
            setup.servers[0].lock_client(watchdog).await.lock("a"),
            setup.servers[1].lock_client(watchdog).await.lock("b"),
        ])
        .unwrap();
        let guard = multi.lock().await.unwrap();
        let raw = setup.servers[1].raw().await;
        let _: i64 = raw.del("b").await.unwrap();
        tokio::time::timeout(watchdog, guard.lost())
            .await
            .expect("the loss of b was not reported");
        assert!(guard.is_lost());
        assert!(guard.guards()[1].is_lost() && !guard.guards()[0].is_lost());
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dropped_acquisitions_leave_nothing_held() {
    bounded(async {
        let setup = Setup::start().await;
        let multi = setup.multi(0, &["a", "b", "c"]);
        let rival = setup.multi(1, &["c", "a"]);
        for round in 0..100u64 {
            let rival_guard = if round % 3 == 0 {
                Some(rival.lock().await.unwrap())
            } else {
                None
            };
            let cut = Duration::from_micros((round * 53) % 1500);
            let _ = tokio::time::timeout(cut, multi.lock()).await;
            drop(rival_guard);
        }
        // A background release detaches its hold when its reply arrives, just after Redis has
        // freed the key: both must be seen, in either order.
        let free = common::eventually(Duration::from_secs(2), || async {
            let mut free = true;
            for name in ["a", "b", "c"] {
                free &= !setup.lock(0, name).is_locked().await.unwrap();
            }
            free && setup
                .instances
                .iter()
                .flatten()
                .all(|c| c.stats().held == 0)
        })
        .await;
        let held: Vec<usize> = setup
            .instances
            .iter()
            .flatten()
            .map(|c| c.stats().held)
            .collect();
        assert!(
            free,
            "a dropped multi-lock acquisition left a member held (holds per client: {held:?})"
        );
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fair_members_keep_their_order() {
    bounded(async {
        let setup = Setup::start().await;
        let client = &setup.instances[0][0];
        // A fair lock held, with a waiter queued: the multi-lock's one-round attempt must not
        // overtake the waiter, and its waiting joins the line behind it.
        let fair = client.fair_lock("f");
        let held = fair.lock().await.unwrap();
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let first = tokio::spawn({
            let fair = setup.instances[1][0].fair_lock("f");
            let order = order.clone();
            async move {
                let guard = fair.lock().await.unwrap();
                order.lock().unwrap().push("waiter");
                guard.unlock().await.unwrap();
            }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        let multi = MultiLock::new(vec![client.fair_lock("f").into(), setup.lock(0, "b")]).unwrap();
        // Another task than the holder's (which would simply reenter).
        let second = tokio::spawn({
            let order = order.clone();
            async move {
                assert!(multi
                    .try_lock(Duration::ZERO, None)
                    .await
                    .unwrap()
                    .is_none());
                let guard = multi.lock().await.unwrap();
                order.lock().unwrap().push("multi");
                guard.unlock().await.unwrap();
            }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        held.unlock().await.unwrap();
        first.await.unwrap();
        second.await.unwrap();
        assert_eq!(*order.lock().unwrap(), ["waiter", "multi"]);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn empty_and_duplicate_sets_are_refused() {
    bounded(async {
        let setup = Setup::start().await;
        assert!(matches!(
            MultiLock::new(vec![]),
            Err(Error::InvalidArgument(_))
        ));
        let twice = MultiLock::new(vec![setup.lock(0, "a"), setup.lock(0, "a")]);
        assert!(matches!(twice, Err(Error::InvalidArgument(_))));
        // The same name on two servers is two locks.
        let client_a = &setup.instances[0][0];
        let client_b = &setup.instances[0][1];
        let multi = MultiLock::new(vec![client_a.lock("x"), client_b.lock("x")]).unwrap();
        let guard = multi.try_lock(Duration::ZERO, None).await.unwrap().unwrap();
        guard.unlock().await.unwrap();
        assert!(matches!(
            multi.try_lock(Duration::ZERO, Some(Duration::ZERO)).await,
            Err(Error::InvalidArgument(_))
        ));
    })
    .await
}

/// `lock_with_lease` with a valid lease holds every member for that lease and no longer (no
/// renewal), and `locks` lists the members in the order given.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_holds_every_member_for_that_long() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = server.lock_client(Duration::from_secs(1)).await;
        let other = server.lock_client(Duration::from_secs(1)).await;
        let multi = MultiLock::new(vec![client.lock("lease-a"), client.lock("lease-b")]).unwrap();
        let names: Vec<&str> = multi.locks().iter().map(|lock| lock.name()).collect();
        assert_eq!(names, ["lease-a", "lease-b"]);

        let lease = Duration::from_millis(1500);
        let guard = multi.lock_with_lease(lease).await.unwrap();
        for name in ["lease-a", "lease-b"] {
            let pttl: i64 = raw.pttl(name).await.unwrap();
            assert!(
                pttl > 0 && pttl <= lease.as_millis() as i64,
                "{name}: {pttl}"
            );
            let taken = other.lock(name).try_lock(Duration::ZERO, None).await;
            assert!(taken.unwrap().is_none(), "{name} was free while held");
        }
        // Not renewed: both free once the lease has passed, with the guard still alive.
        tokio::time::sleep(lease + Duration::from_millis(200)).await;
        for name in ["lease-a", "lease-b"] {
            let exists: i64 = raw.exists(name).await.unwrap();
            assert_eq!(exists, 0, "{name} outlived its lease");
        }
        drop(guard);
        client.shutdown().await;
        other.shutdown().await;
    })
    .await;
}

/// `with_lock` (from `DistributedLock`) runs the work while every member is held, returns its
/// value and gives every member back; when a member is lost under the work, the work is
/// dropped, its token cancelled, and `Error::Lost` names that member.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_lock_runs_the_work_under_every_member_and_stops_it_at_a_loss() {
    bounded(async {
        let setup = Setup::start().await;
        let multi = setup.multi(0, &["a", "b"]);
        let seen = multi
            .with_lock(|_lost| async {
                (
                    setup.lock(1, "a").is_locked().await.unwrap(),
                    setup.lock(1, "b").is_locked().await.unwrap(),
                )
            })
            .await
            .unwrap();
        assert_eq!(seen, (true, true), "the work ran with every member held");
        assert!(!setup.lock(1, "a").is_locked().await.unwrap());
        assert!(!setup.lock(1, "b").is_locked().await.unwrap());

        // Busy: try_with_lock within a short wait gives None and does not call the work.
        let other = setup.lock(1, "b").with_owner(fredlock::OwnerId::unique());
        let held = other.lock().await.unwrap();
        let called = Arc::new(AtomicUsize::new(0));
        let ran = multi
            .try_with_lock(Duration::from_millis(50), None, |_lost| {
                called.fetch_add(1, Ordering::SeqCst);
                async {}
            })
            .await
            .unwrap();
        assert!(ran.is_none() && called.load(Ordering::SeqCst) == 0);
        held.unlock().await.unwrap();

        // A member lost under the work.
        let watchdog = Duration::from_millis(900);
        let watched = MultiLock::new(vec![
            setup.servers[0].lock_client(watchdog).await.lock("a"),
            setup.servers[1].lock_client(watchdog).await.lock("b"),
        ])
        .unwrap();
        let raw = setup.servers[1].raw().await;
        let cancelled = Arc::new(AtomicUsize::new(0));
        let started = Instant::now();
        let outcome = watched
            .with_lock(|lost| {
                let cancelled = cancelled.clone();
                let raw = raw.clone();
                async move {
                    tokio::spawn(async move {
                        lost.cancelled().await;
                        cancelled.fetch_add(1, Ordering::SeqCst);
                    });
                    let _: i64 = raw.del("b").await.unwrap();
                    tokio::time::sleep(Duration::from_secs(30)).await;
                }
            })
            .await;
        match outcome {
            Err(Error::Lost { lock, .. }) => assert_eq!(lock, "b"),
            other => panic!("expected the loss of b, got {other:?}"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the work was not dropped"
        );
        assert!(
            common::eventually(Duration::from_secs(1), || async {
                cancelled.load(Ordering::SeqCst) == 1
            })
            .await,
            "the work's token was not cancelled"
        );
    })
    .await
}

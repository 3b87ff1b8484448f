//! The event stream (issue 46): `client.events()` tells what happens to the client's holds,
//! each event produced here by its real cause: an unlock, a force unlock from another client,
//! a lease that ran out, a stalled server, a restarted one, a blocked runtime; a receiver that
//! falls behind loses the oldest and is told how many.

mod common;

use std::time::Duration;

use common::{bounded, RedisSentinel, RedisServer, StallingProxy};
use fred::prelude::KeysInterface;
use fredlock::events::{LockEvent, LockEventKind, LockEvents, LossReason, RecvError};
use fredlock::LockClient;

/// The next event within `limit`, or why none came.
async fn next(events: &mut LockEvents, limit: Duration) -> Result<LockEvent, String> {
    match tokio::time::timeout(limit, events.recv()).await {
        Ok(Ok(event)) => Ok(event),
        Ok(Err(error)) => Err(format!("{error:?}")),
        Err(_) => Err(format!("no event within {limit:?}")),
    }
}

/// Receives until an event of `name` (or of the connection, for `"connection"`) is `what`,
/// within `limit`; the events of that name received on the way, that one last.
async fn until(
    events: &mut LockEvents,
    name: &str,
    what: LockEventKind,
    limit: Duration,
) -> Vec<LockEventKind> {
    let deadline = tokio::time::Instant::now() + limit;
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let event = next(events, left)
            .await
            .unwrap_or_else(|why| panic!("waiting for {what:?} of {name}: {why}; saw {seen:?}"));
        if event.name() == name || event.kind() == name {
            seen.push(event.what());
            if event.what() == what {
                return seen;
            }
        }
    }
}

/// Receives within `limit` until each lock of `names` is told lost, whatever the reason; the
/// events of each name received on the way, its loss last.
async fn until_lost<const N: usize>(
    events: &mut LockEvents,
    names: [&str; N],
    limit: Duration,
) -> [Vec<LockEventKind>; N] {
    let deadline = tokio::time::Instant::now() + limit;
    let mut seen = std::array::from_fn(|_| Vec::new());
    while !seen
        .iter()
        .all(|told: &Vec<LockEventKind>| matches!(told.last(), Some(LockEventKind::Lost(_))))
    {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let event = next(events, left)
            .await
            .unwrap_or_else(|why| panic!("{why}; saw {seen:?} of {names:?}"));
        if let Some(at) = names.iter().position(|name| event.name() == *name) {
            seen[at].push(event.what());
        }
    }
    seen
}

async fn client_with(server: &RedisServer, watchdog: Duration, name: &str) -> LockClient {
    common::builder()
        .url(server.url())
        .watchdog_lease(watchdog)
        .client_name(name)
        .build()
        .await
        .unwrap()
}

/// Acquisitions and releases of one lock come in order, naming the kind, the lock, the owner
/// and the client; a leader's term is won and, resigned, released; a job's run ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_are_told_in_order_with_kind_name_owner_and_client() {
    bounded(async {
        let server = RedisServer::start();
        let client = client_with(&server, Duration::from_secs(30), "events-1").await;
        let mut events = client.events();
        let lock = client.lock("ev-order");
        let mut owners = Vec::new();
        for _ in 0..3 {
            let guard = lock.lock().await.unwrap();
            owners.push(guard.owner_field().to_owned());
            guard.unlock().await.unwrap();
        }
        for owner in &owners {
            for what in [LockEventKind::Acquired, LockEventKind::Released] {
                let event = next(&mut events, Duration::from_secs(2)).await.unwrap();
                assert_eq!(event.what(), what, "{event:?}");
                assert_eq!(event.kind(), "lock");
                assert_eq!(event.name(), "ev-order");
                assert_eq!(event.owner(), Some(owner.as_str()));
                assert_eq!(event.client_name(), Some("events-1"));
            }
        }

        let term = client
            .leader_election("ev-leader")
            .campaign()
            .await
            .unwrap();
        let event = next(&mut events, Duration::from_secs(2)).await.unwrap();
        assert_eq!(event.what(), LockEventKind::TermWon, "{event:?}");
        assert_eq!(event.kind(), "leader_election");
        assert_eq!(event.owner(), Some(term.owner_field()));
        term.resign().await.unwrap();
        assert_eq!(
            until(
                &mut events,
                "ev-leader",
                LockEventKind::Released,
                Duration::from_secs(2)
            )
            .await,
            [LockEventKind::Released]
        );

        // A job lock's name is its key, ShedLock's `job-lock:default:<name>`.
        let job = client
            .job_lock("ev-job")
            .at_most_for(Duration::from_secs(5));
        assert!(matches!(
            job.run(async {}).await.unwrap(),
            fredlock::JobRun::Ran(())
        ));
        let seen = until(
            &mut events,
            "job-lock:default:ev-job",
            LockEventKind::JobRan,
            Duration::from_secs(2),
        )
        .await;
        assert_eq!(seen.last(), Some(&LockEventKind::JobRan), "{seen:?}");
        client.shutdown().await;
    })
    .await;
}

/// A job another instance runs is skipped here, and told so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skipped_job_is_told() {
    bounded(async {
        let server = RedisServer::start();
        let here = client_with(&server, Duration::from_secs(30), "events-here").await;
        let there = client_with(&server, Duration::from_secs(30), "events-there").await;
        let mut events = here.events();
        let (started, running) = tokio::sync::oneshot::channel();
        let (finish, finished) = tokio::sync::oneshot::channel::<()>();
        let job = there
            .job_lock("ev-skipped")
            .at_most_for(Duration::from_secs(10));
        let runner = tokio::spawn(async move {
            job.run(async move {
                started.send(()).unwrap();
                let _ = finished.await;
            })
            .await
        });
        running.await.unwrap();
        let job = here
            .job_lock("ev-skipped")
            .at_most_for(Duration::from_secs(10));
        assert!(matches!(
            job.run(async {}).await.unwrap(),
            fredlock::JobRun::Skipped(_)
        ));
        let name = "job-lock:default:ev-skipped";
        let seen = until(
            &mut events,
            name,
            LockEventKind::JobSkipped,
            Duration::from_secs(2),
        )
        .await;
        assert_eq!(seen, [LockEventKind::JobSkipped]);
        finish.send(()).unwrap();
        let ran = runner.await.unwrap().unwrap();
        assert!(matches!(ran, fredlock::JobRun::Ran(())));
        here.shutdown().await;
        there.shutdown().await;
    })
    .await;
}

/// A job that outlives its lock (`at_most_for`) is stopped, and told lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_outlives_its_lock_is_told_lost() {
    bounded(async {
        let server = RedisServer::start();
        let client = client_with(&server, Duration::from_secs(30), "events-job-lost").await;
        let mut events = client.events();
        let job = client
            .job_lock("ev-job-lost")
            .at_most_for(Duration::from_millis(300));
        let run = job.run(tokio::time::sleep(Duration::from_secs(5))).await;
        assert!(run.unwrap().is_lost());
        let name = "job-lock:default:ev-job-lost";
        let seen = until(
            &mut events,
            name,
            LockEventKind::JobLost,
            Duration::from_secs(3),
        )
        .await;
        assert_eq!(seen.first(), Some(&LockEventKind::Acquired), "{seen:?}");
        assert_eq!(seen.last(), Some(&LockEventKind::JobLost), "{seen:?}");
        client.shutdown().await;
    })
    .await;
}

/// A force unlock from another client: the holder is told of it on its own channel, then finds
/// the hold gone, lost as forced; a leader's term likewise ends as a term lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_unlock_from_another_client_is_told_then_lost_as_forced() {
    bounded(async {
        let server = RedisServer::start();
        let holder = client_with(&server, Duration::from_secs(30), "events-holder").await;
        let operator = client_with(&server, Duration::from_secs(30), "events-operator").await;
        let raw = server.raw().await;
        let mut events = holder.events();
        let guard = holder.lock("ev-forced").lock().await.unwrap();
        common::listening_for_force_unlocks(&raw, &holder).await;
        assert!(operator.lock("ev-forced").force_unlock().await.unwrap());
        let seen = until(
            &mut events,
            "ev-forced",
            LockEventKind::Lost(LossReason::Forced),
            Duration::from_secs(5),
        )
        .await;
        assert_eq!(
            seen,
            [
                LockEventKind::Acquired,
                LockEventKind::ForceUnlocked,
                LockEventKind::Lost(LossReason::Forced)
            ]
        );
        assert!(guard.is_lost());
        let term = holder.leader_election("ev-term").campaign().await.unwrap();
        assert!(operator
            .leader_election("ev-term")
            .force_unlock()
            .await
            .unwrap());
        let seen = until(
            &mut events,
            "ev-term",
            LockEventKind::TermLost(LossReason::Forced),
            Duration::from_secs(5),
        )
        .await;
        assert_eq!(
            seen,
            [
                LockEventKind::TermWon,
                LockEventKind::ForceUnlocked,
                LockEventKind::TermLost(LossReason::Forced)
            ]
        );
        assert!(term.is_lost());
        drop(guard);
        drop(term);
        holder.shutdown().await;
        operator.shutdown().await;
    })
    .await;
}

/// A fixed lease that runs out while its guard is kept is lost as expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_that_ran_out_is_lost_as_expired() {
    // The watchdog looks every third of its lease: every 0.3 s here, and the loss is told then.
    a_fixed_lease_runs_out(Duration::from_millis(900), false, Duration::from_secs(3)).await;
}

/// A guard that waits for its fixed lease to run out learns it at the lease's end, and the loss
/// is counted and told then too, not at the watchdog's next look (10 s away here): what a guard
/// learns and what the event stream says agree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_that_ran_out_is_told_when_its_guard_learns_it() {
    a_fixed_lease_runs_out(Duration::from_secs(30), true, Duration::from_millis(500)).await;
}

/// A lock taken with a 400 ms lease by a client whose watchdog lease is `watchdog`, its guard
/// kept (and, when `guard_waits`, waiting for the lease's end): the stream tells it acquired,
/// then lost as expired within `limit` (of the guard's learning it, when it waits).
async fn a_fixed_lease_runs_out(watchdog: Duration, guard_waits: bool, limit: Duration) {
    bounded(async {
        let server = RedisServer::start();
        let client = client_with(&server, watchdog, "events-lease").await;
        let mut events = client.events();
        let guard = client
            .lock("ev-lease")
            .try_lock(Duration::from_secs(1), Some(Duration::from_millis(400)))
            .await
            .unwrap()
            .expect("free");
        if guard_waits {
            tokio::time::timeout(Duration::from_secs(2), guard.lost())
                .await
                .expect("the guard learns at the lease's end");
        }
        let expired = LockEventKind::Lost(LossReason::Expired);
        let seen = until(&mut events, "ev-lease", expired, limit).await;
        assert_eq!(seen, [LockEventKind::Acquired, expired]);
        drop(guard);
        client.shutdown().await;
    })
    .await;
}

/// A force unlock of a read-write lock held by two readers of one client (two tasks, two
/// owners): each reader is told of it and lost as forced, not the first as forced and the
/// other as deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_hold_a_force_unlock_ends_is_lost_as_forced() {
    bounded(async {
        let server = RedisServer::start();
        let holder = client_with(&server, Duration::from_secs(30), "events-readers").await;
        let operator = client_with(&server, Duration::from_secs(30), "events-op").await;
        let raw = server.raw().await;
        let mut events = holder.events();
        let mut readers = Vec::new();
        for _ in 0..2 {
            let lock = holder.rw_lock("ev-forced-readers");
            let task = tokio::spawn(async move { lock.read_lock().lock().await });
            readers.push(task.await.unwrap().unwrap());
        }
        assert_ne!(readers[0].owner_field(), readers[1].owner_field());
        common::listening_for_force_unlocks(&raw, &holder).await;
        assert!(operator
            .rw_lock("ev-forced-readers")
            .force_unlock()
            .await
            .unwrap());
        let mut lost = Vec::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while lost.len() < 2 {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let event = next(&mut events, left)
                .await
                .unwrap_or_else(|why| panic!("{why}; lost so far {lost:?}"));
            if matches!(event.what(), LockEventKind::Lost(_)) {
                lost.push(event.what());
            }
        }
        assert_eq!(lost, [LockEventKind::Lost(LossReason::Forced); 2]);
        assert!(readers.iter().all(|reader| reader.is_lost()));
        drop(readers);
        holder.shutdown().await;
    })
    .await;
}

/// A lock whose key is deleted under its holder (by hand, or lost with the server's data) is
/// told lost as deleted at the watchdog's next look, whether the watchdog renews it or only
/// checks it (a fixed lease, 20 s of it left).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_whose_key_is_deleted_is_told_lost_as_deleted() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = client_with(&server, Duration::from_millis(900), "events-deleted").await;
        let mut events = client.events();
        let renewed = client.lock("ev-deleted-renewed").lock().await.unwrap();
        let fixed = client
            .lock("ev-deleted-fixed")
            .lock_with_lease(Duration::from_secs(20))
            .await
            .unwrap();
        let _: i64 = raw
            .del(vec!["ev-deleted-renewed", "ev-deleted-fixed"])
            .await
            .unwrap();
        let names = ["ev-deleted-renewed", "ev-deleted-fixed"];
        let seen = until_lost(&mut events, names, Duration::from_secs(3)).await;
        let deleted = LockEventKind::Lost(LossReason::Deleted);
        assert_eq!(seen, [[LockEventKind::Acquired, deleted]; 2], "{names:?}");
        assert!(renewed.is_lost() && fixed.is_lost());
        drop((renewed, fixed));
        client.shutdown().await;
    })
    .await;
}

/// A fixed lease that ends while the server stalls (DEBUG SLEEP across its end) is told lost as
/// expired (its lease ran out), not as a renew deadline passed: the checks that fail in the
/// stall do not decide the reason, since nothing was the watchdog's to renew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_lease_that_ends_in_a_stall_is_told_expired() {
    bounded(async {
        let server = RedisServer::start_with_debug();
        let raw = server.raw().await;
        // The watchdog looks every 0.3 s: several checks fail in the stall, before and after
        // the lease's end.
        let client = client_with(&server, Duration::from_millis(900), "events-stalled-lease").await;
        let mut events = client.events();
        let guard = client
            .lock("ev-stalled-lease")
            .lock_with_lease(Duration::from_secs(1))
            .await
            .unwrap();
        let sleeper = {
            let raw = raw.clone();
            tokio::spawn(async move { common::debug_sleep(&raw, 2.0).await })
        };
        let seen = until_lost(&mut events, ["ev-stalled-lease"], Duration::from_secs(6)).await;
        let expired = LockEventKind::Lost(LossReason::Expired);
        assert_eq!(seen, [[LockEventKind::Acquired, expired]]);
        sleeper.await.unwrap();
        drop(guard);
        client.shutdown().await;
    })
    .await;
}

/// On a healthy server, renewals and checks that get through tell nothing: a renewed hold and
/// a fixed lease, kept over four watchdog periods, show only their acquisitions and releases,
/// and the connection nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_and_checks_that_get_through_tell_nothing() {
    bounded(async {
        let server = RedisServer::start();
        // Renewed (and checked) every 300 ms.
        let client = client_with(&server, Duration::from_millis(900), "events-quiet").await;
        let mut events = client.events();
        let renewed = client.lock("ev-quiet-renewed").lock().await.unwrap();
        let fixed = client
            .lock("ev-quiet-fixed")
            .lock_with_lease(Duration::from_secs(20))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(1200)).await;
        // Past its first lease of 900 ms: renewals got through.
        assert!(!renewed.is_lost());
        renewed.unlock().await.unwrap();
        fixed.unlock().await.unwrap();
        let mut told = Vec::new();
        while told.len() < 4 {
            let event = next(&mut events, Duration::from_secs(2))
                .await
                .unwrap_or_else(|why| panic!("{why}; saw {told:?}"));
            told.push((event.name().to_owned(), event.what()));
        }
        let quiet = next(&mut events, Duration::from_millis(300)).await;
        assert!(quiet.is_err(), "{quiet:?} after {told:?}");
        let of = |name: &str, what| (name.to_owned(), what);
        assert_eq!(
            told,
            [
                of("ev-quiet-renewed", LockEventKind::Acquired),
                of("ev-quiet-fixed", LockEventKind::Acquired),
                of("ev-quiet-renewed", LockEventKind::Released),
                of("ev-quiet-fixed", LockEventKind::Released),
            ]
        );
        client.shutdown().await;
    })
    .await;
}

/// A release that meets a renewal or a check on the server (the visit runs just after the release
/// deleted the field) is told released, not lost as deleted: the watchdog renews every 10 ms
/// here, so that among 8 tasks' 40 releases each, of holds renewed and of fixed leases, many
/// have a visit on its way. Before the watchdog left a hold being released to its release's
/// reply, some of them were told lost as deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_meets_a_renewal_is_told_released_not_lost() {
    bounded(async {
        let server = RedisServer::start();
        let client = client_with(&server, Duration::from_millis(30), "events-meet").await;
        let mut events = client.events();
        let mut tasks = tokio::task::JoinSet::new();
        for task in 0..8u64 {
            let client = client.clone();
            tasks.spawn(async move {
                let lock = client.lock(format!("ev-meet-{task}"));
                for round in 0..40u64 {
                    let guard = if round % 2 == 0 {
                        lock.lock().await.unwrap()
                    } else {
                        lock.lock_with_lease(Duration::from_secs(20)).await.unwrap()
                    };
                    // Held across 0 to 3 watchdog periods.
                    let held = (task * 7 + round * 13) % 30;
                    tokio::time::sleep(Duration::from_millis(held)).await;
                    // A renewal that the load here held up past its deadline may lose a hold
                    // (told as such); a release that meets a visit must not.
                    if let Err(error) = guard.unlock().await {
                        assert!(matches!(error, fredlock::Error::NotHeld { .. }), "{error}");
                    }
                }
            });
        }
        while let Some(done) = tasks.join_next().await {
            done.unwrap();
        }
        let mut told = Vec::new();
        while let Ok(event) = next(&mut events, Duration::from_millis(300)).await {
            told.push((event.name().to_owned(), event.what()));
        }
        let acquired = told
            .iter()
            .filter(|(_, what)| *what == LockEventKind::Acquired);
        assert_eq!(acquired.count(), 8 * 40, "{told:?}");
        let wrong: Vec<_> = told
            .iter()
            .filter(|(_, what)| {
                matches!(
                    what,
                    LockEventKind::Lost(LossReason::Deleted | LossReason::Expired)
                )
            })
            .collect();
        // On a failure, every event of the locks told wrongly, in order, and the connection's:
        // whether a renewal failed or the connection dropped first tells a real loss (a key
        // that ended early on the server) from a release that was told as one.
        let around: Vec<_> = told
            .iter()
            .filter(|(name, _)| {
                wrong.iter().any(|(lost, _)| lost == name) || !name.starts_with("ev-meet-")
            })
            .collect();
        assert!(
            wrong.is_empty(),
            "{} of {} told {wrong:?}; their locks' and the connection's events: {around:?}",
            wrong.len(),
            told.len()
        );
        client.shutdown().await;
    })
    .await;
}

/// A release that finds its field already gone (deleted by hand before the watchdog's next
/// look, 10 s away) answers `NotHeld` and tells the hold lost as deleted, not released: what
/// the guard learns and what the stream says agree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_finds_its_field_gone_is_told_lost_as_deleted() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = client_with(&server, Duration::from_secs(30), "events-gone").await;
        let mut events = client.events();
        let renewed = client.lock("ev-gone-renewed").lock().await.unwrap();
        let fixed = client
            .lock("ev-gone-fixed")
            .lock_with_lease(Duration::from_secs(20))
            .await
            .unwrap();
        let _: i64 = raw
            .del(vec!["ev-gone-renewed", "ev-gone-fixed"])
            .await
            .unwrap();
        for guard in [renewed, fixed] {
            let error = guard.unlock().await.unwrap_err();
            assert!(matches!(error, fredlock::Error::NotHeld { .. }), "{error}");
        }
        let names = ["ev-gone-renewed", "ev-gone-fixed"];
        let seen = until_lost(&mut events, names, Duration::from_secs(3)).await;
        let deleted = LockEventKind::Lost(LossReason::Deleted);
        assert_eq!(seen, [[LockEventKind::Acquired, deleted]; 2], "{names:?}");
        let quiet = next(&mut events, Duration::from_millis(300)).await;
        assert!(quiet.is_err(), "{quiet:?} after {seen:?}");
        client.shutdown().await;
    })
    .await;
}

/// A server that stops answering (DEBUG SLEEP past the renew deadline): the renewal fails, the
/// connection is told lost, and the hold is lost once its deadline passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_server_fails_renewals_and_the_deadline_loses_the_hold() {
    bounded(async {
        let server = RedisServer::start_with_debug();
        let raw = server.raw().await;
        let client = client_with(&server, Duration::from_millis(900), "events-stalled").await;
        let mut events = client.events();
        let guard = client.lock("ev-stalled").lock().await.unwrap();
        let sleeper = {
            let raw = raw.clone();
            tokio::spawn(async move { common::debug_sleep(&raw, 2.5).await })
        };
        let mut seen = Vec::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while !seen.contains(&LockEventKind::Lost(LossReason::DeadlinePassed)) {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match next(&mut events, left).await {
                Ok(event) => seen.push(event.what()),
                Err(why) => panic!("{why}; saw {seen:?}"),
            }
        }
        assert_eq!(seen.first(), Some(&LockEventKind::Acquired), "{seen:?}");
        let at = |what| seen.iter().position(|seen| *seen == what);
        let lost = at(LockEventKind::Lost(LossReason::DeadlinePassed)).unwrap();
        let failed = at(LockEventKind::RenewalFailed).expect("a failed renewal told");
        assert!(failed < lost, "{seen:?}");
        assert!(guard.is_lost());
        // The renewal without an answer tells the connection lost, at its deadline: before the
        // loss or just after it.
        if at(LockEventKind::ConnectionLost).is_none() {
            let seen = until(
                &mut events,
                "connection",
                LockEventKind::ConnectionLost,
                Duration::from_secs(3),
            )
            .await;
            assert_eq!(seen, [LockEventKind::ConnectionLost]);
        }
        sleeper.await.unwrap();
        drop(guard);
        client.shutdown().await;
    })
    .await;
}

/// A stall through which several renewals and checks fail (a watchdog hold's renewal, a fixed
/// lease's checks, each in a batch of its own) is told as the connection lost once, and back
/// once when Redis answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_through_one_stall_tell_one_loss_and_one_return() {
    bounded(async {
        let server = RedisServer::start_with_debug();
        let raw = server.raw().await;
        let client = client_with(&server, Duration::from_millis(900), "events-one-stall").await;
        let mut events = client.events();
        let renewed = client.lock("ev-renewed").lock().await.unwrap();
        let fixed = client
            .lock("ev-fixed")
            .lock_with_lease(Duration::from_secs(20))
            .await
            .unwrap();
        let sleeper = {
            let raw = raw.clone();
            tokio::spawn(async move { common::debug_sleep(&raw, 2.0).await })
        };
        let mut told = Vec::new();
        let quiet = tokio::time::Instant::now() + Duration::from_secs(4);
        while let Ok(Ok(event)) = tokio::time::timeout_at(quiet, events.recv()).await {
            if event.kind() == "connection" {
                told.push(event.what());
            }
        }
        assert_eq!(
            told,
            [LockEventKind::ConnectionLost, LockEventKind::ConnectionBack]
        );
        sleeper.await.unwrap();
        drop((renewed, fixed));
        client.shutdown().await;
    })
    .await;
}

/// A server restarted on its port: the connection is told lost, then back, once each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_is_told_as_connection_lost_then_back() {
    bounded(async {
        let mut server = RedisServer::start();
        let client = client_with(&server, Duration::from_secs(30), "events-restart").await;
        let mut events = client.events();
        let address = format!("127.0.0.1:{}", server.port());
        server.kill();
        tokio::time::sleep(Duration::from_millis(300)).await;
        server.start_again();
        // The connection's events name the server.
        let seen = until(
            &mut events,
            &address,
            LockEventKind::ConnectionBack,
            Duration::from_secs(10),
        )
        .await;
        assert_eq!(
            seen,
            [LockEventKind::ConnectionLost, LockEventKind::ConnectionBack]
        );
        // After it, the lock works, and no second loss or return was told.
        client
            .lock("ev-after")
            .lock()
            .await
            .unwrap()
            .unlock()
            .await
            .unwrap();
        let event = next(&mut events, Duration::from_secs(2)).await.unwrap();
        assert_eq!(event.what(), LockEventKind::Acquired);
        client.shutdown().await;
    })
    .await;
}

/// A Sentinel failover: the client follows the new master, told as the connection lost, then
/// back, once each; a lock works after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_failover_is_told_as_connection_lost_then_back() {
    bounded(async {
        let setup = RedisSentinel::start(1);
        let client = common::lock_client_at(&setup.url(), Duration::from_secs(30)).await;
        let mut events = client.events();
        let old = setup.master_port();
        let new = tokio::task::block_in_place(|| setup.failover());
        assert_ne!(old, new);
        let seen = until(
            &mut events,
            "connection",
            LockEventKind::ConnectionBack,
            Duration::from_secs(30),
        )
        .await;
        assert_eq!(
            seen,
            [LockEventKind::ConnectionLost, LockEventKind::ConnectionBack]
        );
        let lock = client.lock("ev-failover");
        let guard = lock.try_lock(Duration::from_secs(10), None).await.unwrap();
        guard
            .expect("free on the new master")
            .unlock()
            .await
            .unwrap();
        client.shutdown().await;
    })
    .await;
}

/// A runtime blocked past half a renewal period (synchronous work in an async task): the
/// renewals ran late, and each hold renewed is told so.
#[tokio::test(flavor = "current_thread")]
async fn renewals_held_up_by_a_blocked_runtime_are_told_late() {
    bounded(async {
        let server = RedisServer::start();
        // Renewed every second, lost 2 s after the last renewal.
        let client = client_with(&server, Duration::from_secs(3), "events-late").await;
        let mut events = client.events();
        let guard = client.lock("ev-late").lock().await.unwrap();
        // The only thread, blocked for 1.7 s: the watchdog's tick, due after 1 s, comes 0.7 s
        // late (over half a period), before the renew deadline.
        std::thread::sleep(Duration::from_millis(1700));
        let seen = until(
            &mut events,
            "ev-late",
            LockEventKind::RenewalLate,
            Duration::from_secs(3),
        )
        .await;
        assert_eq!(seen, [LockEventKind::Acquired, LockEventKind::RenewalLate]);
        guard.unlock().await.unwrap();
        client.shutdown().await;
    })
    .await;
}

/// A receiver that never reads does not hold the client up; when it reads, it learns how many
/// events it lost (the oldest), then gets the newest ones in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_that_falls_behind_is_told_how_many_it_lost() {
    bounded(async {
        let server = RedisServer::start();
        let client = client_with(&server, Duration::from_secs(30), "events-lag").await;
        let mut events = client.events();
        let capacity = fredlock::events::DEFAULT_EVENT_CAPACITY;
        let cycles = capacity; // two events each
        let lock = client.lock("ev-lag");
        for _ in 0..cycles {
            lock.lock().await.unwrap().unlock().await.unwrap();
        }
        match events.recv().await {
            Err(RecvError::Lagged(lost)) => {
                assert_eq!(lost as usize, 2 * cycles - capacity, "the oldest are lost")
            }
            other => panic!("expected Lagged, got {other:?}"),
        }
        // What is kept is the newest, in order: acquired, released, ..
        for i in 0..capacity {
            let event = events.try_recv().unwrap();
            let expected = if i % 2 == 0 {
                LockEventKind::Acquired
            } else {
                LockEventKind::Released
            };
            assert_eq!(event.what(), expected, "event {i}");
        }
        assert!(events.try_recv().is_err(), "nothing more");
        client.shutdown().await;
    })
    .await;
}

/// `shutdown()` tells of each hold it gives back and of each wait it ends, then the stream
/// ends, while a handle of the client still lives (issue 57: before, the holds went back
/// without an event, and the documented read loop never ended while a clone was kept).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_tells_each_hold_and_wait_then_the_stream_ends() {
    bounded(async {
        let server = RedisServer::start();
        let client = client_with(&server, Duration::from_secs(30), "events-end").await;
        let other = client_with(&server, Duration::from_secs(30), "events-other").await;
        let mut events = client.events();
        let held = client.lock("ev-end-held").lock().await.unwrap();
        let semaphore = client.semaphore("ev-end-sem");
        assert!(semaphore.try_set_permits(1).await.unwrap());
        let permit = semaphore.acquire(1).await.unwrap();
        // A wait of this client's, on a lock the other client holds.
        let taken = other.lock("ev-end-wait").lock().await.unwrap();
        let waiting_lock = client.lock("ev-end-wait");
        let waiter = tokio::spawn(async move { waiting_lock.lock().await.map(drop) });
        // Every kind of wait: an acquire of permits (its one permit is out), and a latch's wait
        // (the engine's other wait loop).
        let waiting_semaphore = semaphore.clone();
        let sem_waiter = tokio::spawn(async move { waiting_semaphore.acquire(1).await.map(drop) });
        let latch = client.count_down_latch("ev-end-latch");
        assert!(latch.try_set_count(1).await.unwrap());
        let latch_waiter = tokio::spawn(async move { latch.wait().await });
        for name in ["ev-end-wait", "ev-end-sem", "ev-end-latch"] {
            let joined = common::eventually(Duration::from_secs(5), || async {
                client.inspect(name).await.is_ok_and(|inspection| {
                    inspection.is_some_and(|inspection| inspection.listeners.unwrap_or(0) >= 1)
                })
            })
            .await;
            assert!(joined, "the waiter on {name} never waited");
        }
        // A handle that outlives the shutdown: the stream must end all the same.
        let kept = client.clone();
        client.shutdown().await;

        let mut seen = Vec::new();
        let end = loop {
            match tokio::time::timeout(Duration::from_secs(5), events.recv()).await {
                Ok(Ok(event)) => seen.push((event.name().to_owned(), event.what())),
                Ok(Err(error)) => break Some(error),
                Err(_) => break None,
            }
        };
        assert!(
            matches!(end, Some(RecvError::Closed)),
            "the stream did not end after shutdown ({end:?}); saw {seen:?}"
        );
        for (name, what) in [
            ("ev-end-held", LockEventKind::Released),
            ("ev-end-sem", LockEventKind::Released),
            ("ev-end-wait", LockEventKind::WaitEnded),
            ("ev-end-sem", LockEventKind::WaitEnded),
            ("ev-end-latch", LockEventKind::WaitEnded),
        ] {
            assert!(
                seen.iter().any(|(n, w)| n == name && *w == what),
                "no {what:?} of {name} at shutdown; saw {seen:?}"
            );
        }
        let waited = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the wait ended")
            .unwrap();
        assert!(
            matches!(waited, Err(fredlock::Error::Shutdown)),
            "{waited:?}"
        );
        for waiter in [sem_waiter, latch_waiter] {
            let waited = tokio::time::timeout(Duration::from_secs(5), waiter)
                .await
                .expect("the wait ended")
                .unwrap();
            assert!(
                matches!(waited, Err(fredlock::Error::Shutdown)),
                "{waited:?}"
            );
        }
        // Given back: the other client takes them at once.
        assert!(other
            .lock("ev-end-held")
            .try_lock_now()
            .await
            .unwrap()
            .is_some());
        // A stream asked for after the shutdown is at its end already.
        let mut late = kept.events();
        assert!(matches!(late.recv().await, Err(RecvError::Closed)));
        drop((held, permit, taken, kept));
        other.shutdown().await;
    })
    .await;
}

/// A hold the shutdown cannot give back (the connection is cut) is told lost, why, and the
/// stream still ends (issue 57).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_tells_a_hold_it_could_not_give_back() {
    bounded(async {
        let server = RedisServer::start();
        let proxy = StallingProxy::start(server.port());
        let client = common::connect(&proxy.url()).await.unwrap();
        let mut events = client.events();
        let held = client.lock("ev-kept").lock().await.unwrap();
        proxy.cut();
        let dropped = common::eventually(Duration::from_secs(5), || async {
            !client.stats().connected
        })
        .await;
        assert!(dropped, "the client never saw the cut");
        client.shutdown().await;
        let mut seen = Vec::new();
        let end = loop {
            match tokio::time::timeout(Duration::from_secs(5), events.recv()).await {
                Ok(Ok(event)) => seen.push((event.name().to_owned(), event.what())),
                Ok(Err(error)) => break Some(error),
                Err(_) => break None,
            }
        };
        assert!(
            matches!(end, Some(RecvError::Closed)),
            "{end:?}; saw {seen:?}"
        );
        assert!(
            seen.contains(&(
                "ev-kept".to_owned(),
                LockEventKind::Lost(LossReason::Shutdown)
            )),
            "saw {seen:?}"
        );
        drop(held);
    })
    .await;
}

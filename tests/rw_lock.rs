//! Acceptance tests of the read-write lock against real `redis-server` processes: sharing,
//! exclusion, wake-ups, writer preference, upgrade and downgrade, leases, cancellation, and
//! Redisson's layout.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{bounded, eventually, RedisServer};
use fred::prelude::*;
use fredlock::{Details, Error, LockClient, RwLock};
use rand::Rng;
use tokio::time::Instant;

const _: () = {
    const fn shareable<T: Send + Sync + 'static>() {}
    shareable::<RwLock>();
    shareable::<fredlock::ReadLock>();
    shareable::<fredlock::WriteLock>();
};

const WATCHDOG: Duration = Duration::from_secs(30);

/// A read hold's timeout key, as Redisson names it.
fn timeout_key(name: &str, field: &str, n: u32) -> String {
    format!("{{{name}}}:{field}:rwlock_timeout:{n}")
}

/// fredlock's zset of waiting writers.
fn writers_key(name: &str) -> String {
    format!("fredlock_rwlock_writers:{{{name}}}")
}

async fn fields(raw: &Client, name: &str) -> HashMap<String, String> {
    raw.hgetall(name).await.unwrap()
}

async fn pttl(raw: &Client, key: &str) -> i64 {
    raw.pttl(key).await.unwrap()
}

/// Every key on the server, for "nothing left behind" checks.
async fn all_keys(raw: &Client) -> Vec<String> {
    raw.custom(fred::cmd!("KEYS"), vec!["*"]).await.unwrap()
}

/// One attempt at `lock` (a read or a write side), for "may it be had right now".
/// Whether no key of the lock `name` is left.
async fn nothing_left(raw: &Client, name: &str) -> bool {
    all_keys(raw).await.iter().all(|key| !key.contains(name))
}

/// A read hold of `ended` with a 200 ms lease, then one of `living` with 20 s: once the first
/// ran out, a reader whose holds ended sits in the hash beside one that holds.
async fn ended_and_living_reads(
    ended: &fredlock::RwLock,
    living: &fredlock::RwLock,
) -> (fredlock::LockGuard, fredlock::LockGuard) {
    let (ended, living) = (ended.read_lock(), living.read_lock());
    let short = ended.lock_with_lease(Duration::from_millis(200)).await;
    let long = living.lock_with_lease(Duration::from_secs(20)).await;
    (short.unwrap(), long.unwrap())
}

async fn take_now(lock: impl Into<fredlock::Lock>) -> Option<fredlock::LockGuard> {
    lock.into().try_lock(Duration::ZERO, None).await.unwrap()
}

/// A client whose waiting writers keep their place `place` without trying again.
async fn client_with_place(server: &RedisServer, place: Duration) -> LockClient {
    server.fair_client(place).await
}

/// 1. Readers share: 8 readers over 2 clients hold at the same moment.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readers_share() {
    bounded(async {
        let server = RedisServer::start();
        let clients = [
            server.lock_client(WATCHDOG).await,
            server.lock_client(WATCHDOG).await,
        ];
        // Each reader holds until all 8 hold: readers that excluded each other never get there.
        let all_in = Arc::new(tokio::sync::Barrier::new(9));
        let let_go = Arc::new(tokio::sync::Barrier::new(9));
        let mut tasks = Vec::new();
        for i in 0..8 {
            let read = clients[i % 2].rw_lock("share").read_lock();
            let (all_in, let_go) = (all_in.clone(), let_go.clone());
            tasks.push(tokio::spawn(async move {
                let guard = read.lock().await.unwrap();
                all_in.wait().await;
                let_go.wait().await;
                guard.unlock().await.unwrap();
            }));
        }
        tokio::time::timeout(Duration::from_secs(10), all_in.wait())
            .await
            .expect("8 readers never held at the same moment");
        let seen = clients[0].rw_lock("share").inspect().await.unwrap();
        assert_eq!(seen.details, Details::ReadWrite { mode: Some("read") });
        assert_eq!(seen.holders.len(), 8, "{:?}", seen.holders);
        let_go.wait().await;
        for task in tasks {
            task.await.unwrap();
        }
        let raw = server.raw().await;
        assert!(nothing_left(&raw, "share").await);
    })
    .await;
}

/// 2. Exclusion: 3 clients x 4 tasks mixing reads and writes for 5 s. A writer never overlaps
///    anyone, and readers never see a half-done write (two keys written one after the other).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writers_exclude_everyone() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let mut clients = Vec::new();
        for _ in 0..3 {
            clients.push(server.lock_client(WATCHDOG).await);
        }
        let readers = Arc::new(AtomicUsize::new(0));
        let writers = Arc::new(AtomicUsize::new(0));
        let violations = Arc::new(AtomicUsize::new(0));
        let ops = Arc::new(Mutex::new((0usize, 0usize)));
        let end = Instant::now() + Duration::from_secs(5);
        let mut tasks = Vec::new();
        for client in &clients {
            for _ in 0..4 {
                let rw = client.rw_lock("mixed");
                let raw = raw.clone();
                let (readers, writers, violations, ops) = (
                    readers.clone(),
                    writers.clone(),
                    violations.clone(),
                    ops.clone(),
                );
                tasks.push(tokio::spawn(async move {
                    let mut version = 0u64;
                    while Instant::now() < end {
                        let write = rand::thread_rng().gen_bool(0.3);
                        if write {
                            let guard = rw.write_lock().lock().await.unwrap();
                            if writers.fetch_add(1, Ordering::SeqCst) != 0
                                || readers.load(Ordering::SeqCst) != 0
                            {
                                violations.fetch_add(1, Ordering::SeqCst);
                            }
                            version += 1;
                            let value = format!("{:?}:{version}", tokio::task::id());
                            let _: () =
                                raw.set("mixed:a", &value, None, None, false).await.unwrap();
                            tokio::time::sleep(Duration::from_millis(2)).await;
                            let _: () =
                                raw.set("mixed:b", &value, None, None, false).await.unwrap();
                            writers.fetch_sub(1, Ordering::SeqCst);
                            guard.unlock().await.unwrap();
                            ops.lock().unwrap().1 += 1;
                        } else {
                            let guard = rw.read_lock().lock().await.unwrap();
                            readers.fetch_add(1, Ordering::SeqCst);
                            if writers.load(Ordering::SeqCst) != 0 {
                                violations.fetch_add(1, Ordering::SeqCst);
                            }
                            let (a, b): (Option<String>, Option<String>) =
                                raw.mget(vec!["mixed:a", "mixed:b"]).await.unwrap();
                            if a != b {
                                violations.fetch_add(1, Ordering::SeqCst);
                            }
                            tokio::time::sleep(Duration::from_millis(1)).await;
                            readers.fetch_sub(1, Ordering::SeqCst);
                            guard.unlock().await.unwrap();
                            ops.lock().unwrap().0 += 1;
                        }
                    }
                }));
            }
        }
        for task in tasks {
            task.await.unwrap();
        }
        let (reads, writes) = *ops.lock().unwrap();
        println!("reads {reads}, writes {writes}");
        assert_eq!(violations.load(Ordering::SeqCst), 0);
        assert!(reads > 50 && writes > 20, "reads {reads}, writes {writes}");
        let exists: bool = raw.exists("mixed").await.unwrap();
        assert!(!exists);
    })
    .await;
}

/// 3. A write unlock wakes 10 waiting readers at once: all hold within 250 ms of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_write_unlock_wakes_every_reader() {
    bounded(async {
        let server = RedisServer::start();
        let clients = [
            server.lock_client(WATCHDOG).await,
            server.lock_client(WATCHDOG).await,
        ];
        let writer = clients[0]
            .rw_lock("wake")
            .write_lock()
            .lock()
            .await
            .unwrap();
        let mut readers = Vec::new();
        for i in 0..10 {
            let read = clients[i % 2].rw_lock("wake").read_lock();
            readers.push(tokio::spawn(async move {
                let guard = read.lock().await.unwrap();
                (Instant::now(), guard)
            }));
        }
        // Every reader has tried, and waits on the channel.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(clients
            .iter()
            .all(|client| client.stats().wait_entries == 1));
        writer.unlock().await.unwrap();
        let unlocked = Instant::now();
        let mut guards = Vec::new();
        let mut slowest = Duration::ZERO;
        for reader in readers {
            let (acquired, guard) = reader.await.unwrap();
            slowest = slowest.max(acquired.saturating_duration_since(unlocked));
            guards.push(guard);
        }
        println!("slowest reader held {slowest:?} after the write unlock");
        assert!(slowest <= Duration::from_millis(250), "{slowest:?}");
        for guard in guards {
            guard.unlock().await.unwrap();
        }
    })
    .await;
}

/// Runs 20 readers on `rw`'s name, each looping over 20 ms holds that overlap the others', until
/// `stop`; a writer arrives after 1 s and takes the write lock within `wait`. Returns how long
/// the writer waited, or `None` when it did not get the lock.
async fn writer_amid_readers(
    clients: &[LockClient],
    rw: &RwLock,
    wait: Duration,
) -> Option<Duration> {
    let stop = Arc::new(AtomicBool::new(false));
    let mut readers = Vec::new();
    for i in 0..20 {
        let read = clients[i % clients.len()].rw_lock(rw.name()).read_lock();
        let read = if rw.prefers_writers() {
            read
        } else {
            clients[i % clients.len()]
                .rw_lock(rw.name())
                .prefer_readers()
                .read_lock()
        };
        let stop = stop.clone();
        readers.push(tokio::spawn(async move {
            // Spread out, so that some reader is always inside.
            tokio::time::sleep(Duration::from_millis(i as u64)).await;
            while !stop.load(Ordering::SeqCst) {
                let guard = read.lock().await.unwrap();
                tokio::time::sleep(Duration::from_millis(20)).await;
                guard.unlock().await.unwrap();
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let asked = Instant::now();
    let got = rw.write_lock().try_lock(wait, None).await.unwrap();
    let waited = asked.elapsed();
    stop.store(true, Ordering::SeqCst);
    let outcome = match got {
        Some(guard) => {
            guard.unlock().await.unwrap();
            Some(waited)
        }
        None => None,
    };
    for reader in readers {
        reader.await.unwrap();
    }
    outcome
}

/// 4. No writer starvation: amid 20 readers with overlapping 20 ms holds, a writer acquires
///    within 1 s. With reader preference the test only reports how long it waited.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writers_do_not_starve() {
    bounded(async {
        let server = RedisServer::start();
        let clients = vec![
            server.lock_client(WATCHDOG).await,
            server.lock_client(WATCHDOG).await,
        ];
        let rw = clients[0].rw_lock("starve");
        assert!(rw.prefers_writers());
        let waited = writer_amid_readers(&clients, &rw, Duration::from_secs(3)).await;
        println!("writer preference: the writer waited {waited:?}");
        let waited = waited.expect("the writer got the lock");
        assert!(waited <= Duration::from_secs(1), "{waited:?}");

        // Redisson's behaviour, documented only: the readers keep overlapping, and the writer
        // may wait for as long as they do.
        let rw = clients[0].rw_lock("starve:readers").prefer_readers();
        assert!(!rw.prefers_writers());
        let waited = writer_amid_readers(&clients, &rw, Duration::from_secs(3)).await;
        match waited {
            Some(waited) => println!("reader preference: the writer waited {waited:?}"),
            None => println!("reader preference: the writer did not get the lock within 3 s"),
        }
    })
    .await;
}

/// 5. Only read holds that still live refuse an upgrade: a reader whose holds all ended, while
///    another reader keeps the lock, may ask for the write lock, and waits as any writer does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_after_the_read_holds_ended_waits_as_any_writer() {
    bounded(async {
        let server = RedisServer::start();
        let client = server.lock_client(WATCHDOG).await;
        let rw = client.rw_lock("ended-upgrade");
        let [ended, living] =
            [1, 2].map(|owner| rw.clone().with_owner(fredlock::OwnerId::from_raw(owner)));
        let (short, long) = ended_and_living_reads(&ended, &living).await;
        tokio::time::sleep(Duration::from_millis(400)).await;
        let write = ended
            .write_lock()
            .try_lock(Duration::from_millis(100), None)
            .await;
        assert!(
            matches!(write, Ok(None)),
            "an upgrade without live read holds waits: {write:?}"
        );
        drop(short);
        long.unlock().await.unwrap();
        let write = ended
            .write_lock()
            .try_lock(Duration::from_secs(1), None)
            .await
            .unwrap()
            .expect("free once the living reader let go");
        write.unlock().await.unwrap();
    })
    .await;
}

/// 5. Upgrade is refused at once; downgrade works, and the layout shows both fields.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrade_is_refused_and_downgrade_works() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = server.lock_client(WATCHDOG).await;
        let rw = client.rw_lock("grade");
        tokio::spawn(async move {
            let read = rw.read_lock().lock().await.unwrap();
            let asked = Instant::now();
            let upgrade = tokio::time::timeout(Duration::from_secs(5), rw.write_lock().lock())
                .await
                .expect("the upgrade returned at once");
            println!("upgrade refused after {:?}: {upgrade:?}", asked.elapsed());
            match upgrade {
                Err(Error::WouldDeadlock { lock, owner, .. }) => {
                    assert_eq!(lock, "grade");
                    assert!(owner.ends_with(":write"), "{owner}");
                }
                other => panic!("expected WouldDeadlock, got {other:?}"),
            }
            assert!(asked.elapsed() < Duration::from_secs(1));
            // Nothing changed: still one read hold, no writer waiting.
            let exists: bool = raw.exists(writers_key("grade")).await.unwrap();
            assert!(!exists);
            assert_eq!(rw.read_lock().hold_count().await.unwrap(), 1);
            read.unlock().await.unwrap();

            // Downgrade: the writer takes a read hold, keeps it past the write.
            let write = rw.write_lock().lock().await.unwrap();
            let read = rw.read_lock().lock().await.unwrap();
            assert_eq!(rw.write_lock().hold_count().await.unwrap(), 1);
            assert_eq!(rw.read_lock().hold_count().await.unwrap(), 1);
            assert!(rw.write_lock().is_held_by_current_task().await.unwrap());
            let seen = fields(&raw, "grade").await;
            let field = client.owner_field(fredlock::OwnerId::current());
            assert_eq!(seen.get("mode").map(String::as_str), Some("write"));
            assert_eq!(seen.get(&field).map(String::as_str), Some("1"));
            assert_eq!(
                seen.get(&format!("{field}:write")).map(String::as_str),
                Some("1")
            );
            assert!(pttl(&raw, &timeout_key("grade", &field, 1)).await > 0);
            write.unlock().await.unwrap();
            let seen = fields(&raw, "grade").await;
            assert_eq!(seen.get("mode").map(String::as_str), Some("read"));
            assert_eq!(seen.len(), 2, "{seen:?}");
            assert!(rw.read_lock().is_locked().await.unwrap());
            assert!(!rw.write_lock().is_locked().await.unwrap());
            // Another reader may join now; a writer may not.
            let other = server.lock_client(WATCHDOG).await;
            let joined = take_now(other.rw_lock("grade").read_lock()).await;
            assert!(joined.is_some());
            // (Another owner: this one holds a read lock now, so it would be refused anyway.)
            let refused = take_now(
                other
                    .rw_lock("grade")
                    .with_owner(fredlock::OwnerId::unique())
                    .write_lock(),
            )
            .await;
            assert!(refused.is_none());
            joined.unwrap().unlock().await.unwrap();
            read.unlock().await.unwrap();
            let exists: bool = raw.exists("grade").await.unwrap();
            assert!(!exists);
            other.shutdown().await;
        })
        .await
        .unwrap();
    })
    .await;
}

/// 6. Each read hold ends on its own lease; the watchdog keeps a read hold and a write hold
///    for 5 x its timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_holds_have_leases_of_their_own() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = server.lock_client(WATCHDOG).await;
        let rw = client.rw_lock("leases");
        let short_owner = fredlock::OwnerId::from_raw(1);
        let long_owner = fredlock::OwnerId::from_raw(2);
        let short = rw.clone().with_owner(short_owner).read_lock();
        let long = rw.clone().with_owner(long_owner).read_lock();
        let short_guard = short
            .lock_with_lease(Duration::from_millis(800))
            .await
            .unwrap();
        let long_guard = long.lock_with_lease(Duration::from_secs(10)).await.unwrap();
        let short_field = client.owner_field(short_owner);
        let long_field = client.owner_field(long_owner);
        tokio::time::sleep(Duration::from_millis(1200)).await;
        assert_eq!(
            pttl(&raw, &timeout_key("leases", &short_field, 1)).await,
            -2
        );
        assert!(pttl(&raw, &timeout_key("leases", &long_field, 1)).await > 7000);
        assert!(short_guard.is_lost());
        assert!(!long_guard.is_lost());
        // Its field outlives its holds until a release passes over the readers; it counts none.
        assert_eq!(short.hold_count().await.unwrap(), 0);
        assert!(!short.is_held_by_current_task().await.unwrap());
        assert_eq!(long.hold_count().await.unwrap(), 1);
        let seen = fields(&raw, "leases").await;
        assert_eq!(seen.get("mode").map(String::as_str), Some("read"));
        assert_eq!(seen.get(&long_field).map(String::as_str), Some("1"));
        assert!(pttl(&raw, "leases").await > 7000);
        assert!(take_now(rw.write_lock()).await.is_none());
        // The expired reader's release finds nothing; its field is forgotten on the way.
        assert!(matches!(
            short_guard.unlock().await,
            Err(Error::NotHeld { .. })
        ));
        let seen = fields(&raw, "leases").await;
        assert!(!seen.contains_key(&short_field), "{seen:?}");
        long_guard.unlock().await.unwrap();
        let exists: bool = raw.exists("leases").await.unwrap();
        assert!(!exists);

        // The watchdog, on a short timeout: 5 x 600 ms.
        let watched = server.lock_client(Duration::from_millis(600)).await;
        let read = watched
            .rw_lock("renewed:read")
            .read_lock()
            .lock()
            .await
            .unwrap();
        let write = watched
            .rw_lock("renewed:write")
            .write_lock()
            .lock()
            .await
            .unwrap();
        let field = read.owner_field().to_owned();
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(!read.is_lost() && !write.is_lost());
        assert!(pttl(&raw, &timeout_key("renewed:read", &field, 1)).await > 0);
        assert!(pttl(&raw, "renewed:read").await > 0);
        assert!(pttl(&raw, "renewed:write").await > 0);
        let other = server.lock_client(WATCHDOG).await;
        assert!(take_now(other.rw_lock("renewed:read").write_lock())
            .await
            .is_none());
        assert!(take_now(other.rw_lock("renewed:write").read_lock())
            .await
            .is_none());
        read.unlock().await.unwrap();
        write.unlock().await.unwrap();
        // A read hold whose key is deleted is reported lost on its guard.
        let read = watched
            .rw_lock("renewed:lost")
            .read_lock()
            .lock()
            .await
            .unwrap();
        let field = read.owner_field().to_owned();
        let _: i64 = raw
            .del(timeout_key("renewed:lost", &field, 1))
            .await
            .unwrap();
        tokio::time::timeout(Duration::from_secs(3), read.lost())
            .await
            .expect("the loss was reported");
        drop(read);
        other.shutdown().await;
        watched.shutdown().await;
    })
    .await;
}

/// The hash lives as long as its longest read hold: a release of a shorter one leaves its TTL
/// alone; a release of the longest brings it down to the longest left, wherever that one sits
/// among the readers (here before a shorter one, which a Redis hash lists after it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_lives_as_long_as_its_longest_read_hold() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = server.lock_client(WATCHDOG).await;
        let rw = client.rw_lock("longest");
        let mut guards = Vec::new();
        for (owner, lease) in [(1, 20), (2, 3), (3, 8), (4, 5)] {
            let read = rw
                .clone()
                .with_owner(fredlock::OwnerId::from_raw(owner))
                .read_lock();
            guards.push(
                read.lock_with_lease(Duration::from_secs(lease))
                    .await
                    .unwrap(),
            );
        }
        let [longest, shortest, middle, last] = <[_; 4]>::try_from(guards).ok().unwrap();
        let ttl = pttl(&raw, "longest").await;
        assert!(ttl > 19_000, "{ttl}");
        shortest.unlock().await.unwrap();
        let ttl = pttl(&raw, "longest").await;
        assert!(ttl > 19_000, "{ttl}");
        longest.unlock().await.unwrap();
        let ttl = pttl(&raw, "longest").await;
        assert!(ttl > 6_000 && ttl <= 8_000, "{ttl}");
        middle.unlock().await.unwrap();
        last.unlock().await.unwrap();
        let exists: bool = raw.exists("longest").await.unwrap();
        assert!(!exists);
    })
    .await;
}

/// 7. 200 random cancellations of read and write acquisitions leave no field, timeout key or
///    waiting writer behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancelled_acquisitions_leave_nothing() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let holder_client = server.lock_client(WATCHDOG).await;
        let client = server.lock_client(WATCHDOG).await;
        // Someone holds it now and then, in either mode, so that cancellations fall on waits,
        // on attempts in flight and on wins.
        let stop = Arc::new(AtomicBool::new(false));
        let holder = {
            let rw = holder_client.rw_lock("cancel");
            let stop = stop.clone();
            tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    let hold = rand::thread_rng().gen_range(1..10);
                    if rand::thread_rng().gen_bool(0.5) {
                        let guard = rw.write_lock().lock().await.unwrap();
                        tokio::time::sleep(Duration::from_millis(hold)).await;
                        guard.unlock().await.unwrap();
                    } else {
                        let guard = rw.read_lock().lock().await.unwrap();
                        tokio::time::sleep(Duration::from_millis(hold)).await;
                        guard.unlock().await.unwrap();
                    }
                    tokio::time::sleep(Duration::from_millis(hold)).await;
                }
            })
        };
        let cancelled = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for i in 0..200u64 {
            let rw = client.rw_lock("cancel");
            let cancelled = cancelled.clone();
            tasks.push(tokio::spawn(async move {
                let after = Duration::from_micros(rand::thread_rng().gen_range(0..15_000));
                tokio::time::sleep(Duration::from_millis(i % 20)).await;
                // A won guard is dropped at once, which gives its hold back in the background.
                let outcome = if i % 2 == 0 {
                    tokio::time::timeout(after, rw.read_lock().lock())
                        .await
                        .map(drop)
                } else {
                    tokio::time::timeout(after, rw.write_lock().lock())
                        .await
                        .map(drop)
                };
                if outcome.is_err() {
                    cancelled.fetch_add(1, Ordering::SeqCst);
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        let cancelled = cancelled.load(Ordering::SeqCst);
        println!("{cancelled} of 200 acquisitions cancelled");
        assert!(cancelled >= 50, "too few cancelled to tell: {cancelled}");
        stop.store(true, Ordering::SeqCst);
        holder.await.unwrap();
        let clean = eventually(Duration::from_secs(5), || async {
            let stats = client.stats();
            let left: Vec<String> = all_keys(&raw)
                .await
                .into_iter()
                .filter(|key| !key.starts_with("fredlock_fences"))
                .collect();
            left.is_empty() && stats.held == 0 && stats.unsettled == 0 && stats.wait_entries == 0
        })
        .await;
        assert!(
            clean,
            "left behind: {:?}, {:?}",
            all_keys(&raw).await,
            client.stats()
        );
    })
    .await;
}

/// 8. Redisson's layout for both modes: the hash, a timeout key per read hold, and the messages
///    on `redisson_rwlock:{name}`: `0` for the last read unlock, `1` for a write unlock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wire_layout_matches_redisson() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let (_subscriber, mut messages) =
            common::listen(&server.url(), "redisson_rwlock:{layout}").await;
        let client = server.lock_client(WATCHDOG).await;
        let rw = client.rw_lock("layout");

        let outer = rw
            .read_lock()
            .lock_with_lease(Duration::from_secs(20))
            .await
            .unwrap();
        // The first hold's key as the first read takes it (a re-entry writes every key again).
        let first = timeout_key("layout", outer.owner_field(), 1);
        let value: String = raw.get(&first).await.unwrap();
        assert_eq!(value, "1");
        let inner = rw
            .read_lock()
            .lock_with_lease(Duration::from_secs(20))
            .await
            .unwrap();
        let field = outer.owner_field().to_owned();
        let seen = fields(&raw, "layout").await;
        assert_eq!(seen.len(), 2);
        assert_eq!(seen["mode"], "read");
        assert_eq!(seen[&field], "2");
        for n in 1..=2 {
            let key = timeout_key("layout", &field, n);
            let value: String = raw.get(&key).await.unwrap();
            assert_eq!(value, "1");
            assert!(pttl(&raw, &key).await > 15_000);
        }
        assert!(pttl(&raw, "layout").await > 15_000);
        inner.unlock().await.unwrap();
        assert_eq!(pttl(&raw, &timeout_key("layout", &field, 2)).await, -2);
        outer.unlock().await.unwrap();

        let write = rw.write_lock().lock().await.unwrap();
        let seen = fields(&raw, "layout").await;
        assert_eq!(seen.len(), 2);
        assert_eq!(seen["mode"], "write");
        assert_eq!(seen[&format!("{field}:write")], "1");
        write.unlock().await.unwrap();

        let published = common::heard(&mut messages, 2).await;
        assert_eq!(published, vec!["0".to_string(), "1".to_string()]);
        let exists: bool = raw.exists("layout").await.unwrap();
        assert!(!exists);
    })
    .await;
}

/// 8. A Java client, replayed with the commands Redisson's scripts run: its read hold lets
///    fredlock readers in and keeps writers out, its write hold keeps everyone out and its
///    unlock message wakes fredlock's waiters; fredlock's holds fail Redisson's conditions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interoperates_with_redisson_replay() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = server.lock_client(WATCHDOG).await;
        let rw = client.rw_lock("java");
        let java = "6a2c1e5e-4b8f-4f0e-9a8e-3d2b1c0f9e8d:57";

        // Redisson's read lock on a free lock.
        let _: () = raw
            .hset("java", [("mode", "read"), (java, "1")])
            .await
            .unwrap();
        let _: () = raw
            .set(
                timeout_key("java", java, 1),
                1,
                Some(Expiration::PX(30_000)),
                None,
                false,
            )
            .await
            .unwrap();
        let _: bool = raw.pexpire("java", 30_000, None).await.unwrap();
        let read = take_now(rw.read_lock()).await;
        assert!(
            read.is_some(),
            "a Java reader shares with fredlock's readers"
        );
        let writer = rw
            .clone()
            .with_owner(fredlock::OwnerId::unique())
            .write_lock();
        assert!(take_now(writer).await.is_none());
        read.unwrap().unlock().await.unwrap();
        // The Java reader is still there: fredlock's unlock left its field and key alone.
        let seen = fields(&raw, "java").await;
        assert_eq!(seen.get(java).map(String::as_str), Some("1"));
        assert!(pttl(&raw, &timeout_key("java", java, 1)).await > 0);
        // Redisson's read unlock: the last hold gone, delete and publish 0.
        let _: i64 = raw
            .del(vec!["java".to_owned(), timeout_key("java", java, 1)])
            .await
            .unwrap();
        let _: i64 = raw.publish("redisson_rwlock:{java}", 0).await.unwrap();

        // Redisson's write lock.
        let java_writer = format!("{java}:write");
        let _: () = raw
            .hset("java", [("mode", "write"), (java_writer.as_str(), "1")])
            .await
            .unwrap();
        let _: bool = raw.pexpire("java", 30_000, None).await.unwrap();
        assert!(take_now(rw.read_lock()).await.is_none());
        assert!(take_now(rw.write_lock()).await.is_none());
        let mut waiting = Vec::new();
        for _ in 0..3 {
            let read = rw.read_lock();
            waiting.push(tokio::spawn(async move {
                let guard = read.lock().await.unwrap();
                (Instant::now(), guard)
            }));
        }
        assert!(
            eventually(Duration::from_secs(5), || async {
                client.stats().subscriptions == 1
            })
            .await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        // Redisson's write unlock: the last hold gone, delete and publish 1.
        let _: i64 = raw.del("java").await.unwrap();
        let _: i64 = raw.publish("redisson_rwlock:{java}", 1).await.unwrap();
        let unlocked = Instant::now();
        let mut guards = Vec::new();
        for task in waiting {
            let (acquired, guard) = task.await.unwrap();
            assert!(acquired.duration_since(unlocked) < Duration::from_millis(250));
            guards.push(guard);
        }
        // fredlock's read holds: Redisson's read condition (mode read) holds, its write
        // condition (no mode, or write mode with its own field) does not.
        let seen = fields(&raw, "java").await;
        assert_eq!(seen["mode"], "read");
        assert!(!seen.contains_key(&java_writer));
        for guard in guards {
            guard.unlock().await.unwrap();
        }
        // fredlock's write hold fails both of Redisson's conditions.
        let write = rw.write_lock().lock().await.unwrap();
        let seen = fields(&raw, "java").await;
        assert_eq!(seen["mode"], "write");
        assert!(!seen.contains_key(&java_writer));
        write.unlock().await.unwrap();
        let exists: bool = raw.exists("java").await.unwrap();
        assert!(!exists);
    })
    .await;
}

/// A plain lock's hash under the same name is no read-write lock: refused with `WrongType`,
/// left untouched; a name whose timeout keys would leave its slot is refused before anything
/// is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_and_changes_nothing() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = server.lock_client(WATCHDOG).await;
        let plain = client.lock("taken").lock().await.unwrap();
        let before = fields(&raw, "taken").await;
        for result in [
            client
                .rw_lock("taken")
                .read_lock()
                .try_lock(Duration::ZERO, None)
                .await,
            client
                .rw_lock("taken")
                .write_lock()
                .try_lock(Duration::ZERO, None)
                .await,
        ] {
            assert!(matches!(result, Err(Error::WrongType { .. })), "{result:?}");
        }
        assert!(matches!(
            client.rw_lock("taken").force_unlock().await,
            Err(Error::WrongType { .. })
        ));
        assert_eq!(fields(&raw, "taken").await, before);
        plain.unlock().await.unwrap();

        for name in ["a{b", "a}b", "{}x", ""] {
            let result = client.rw_lock(name).read_lock().lock().await;
            assert!(
                matches!(result, Err(Error::InvalidArgument(_))),
                "{name}: {result:?}"
            );
        }
        // A name with a hash tag keeps its timeout keys in its slot, as Redisson does.
        let tagged = client
            .rw_lock("tenant{7}")
            .read_lock()
            .lock()
            .await
            .unwrap();
        let key = format!("tenant{{7}}:{}:rwlock_timeout:1", tagged.owner_field());
        assert!(pttl(&raw, &key).await > 0);
        tagged.unlock().await.unwrap();
        assert!(all_keys(&raw)
            .await
            .iter()
            .all(|key| key.starts_with("fredlock_fences")));
    })
    .await;
}

/// A waiting writer keeps new readers out until it gives up; one that died is forgotten when
/// its place ends, by the server clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_writer_keeps_readers_out_until_it_goes() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = client_with_place(&server, Duration::from_millis(900)).await;
        let rw = client.rw_lock("queued");
        let reader = rw
            .clone()
            .with_owner(fredlock::OwnerId::from_raw(1))
            .read_lock();
        let held = reader.lock().await.unwrap();
        let writer = rw
            .clone()
            .with_owner(fredlock::OwnerId::from_raw(2))
            .write_lock();
        // The writer waits 300 ms, keeping readers out meanwhile, then leaves.
        let waiting =
            tokio::spawn(async move { writer.try_lock(Duration::from_millis(300), None).await });
        assert!(
            eventually(Duration::from_secs(2), || async {
                let count: i64 = raw.zcard(writers_key("queued")).await.unwrap();
                count == 1
            })
            .await
        );
        let newcomer = rw
            .clone()
            .with_owner(fredlock::OwnerId::from_raw(3))
            .read_lock();
        assert!(take_now(newcomer.clone()).await.is_none());
        // A reader already inside re-enters.
        let again = take_now(reader.clone()).await.expect("re-entry");
        // Once the writer gives up, the newcomer is woken at once.
        let joined = tokio::spawn(async move {
            let guard = newcomer.lock().await.unwrap();
            (Instant::now(), guard)
        });
        assert!(waiting.await.unwrap().unwrap().is_none());
        let left = Instant::now();
        let (acquired, guard) = joined.await.unwrap();
        assert!(acquired.saturating_duration_since(left) < Duration::from_millis(250));
        let exists: bool = raw.exists(writers_key("queued")).await.unwrap();
        assert!(!exists);
        guard.unlock().await.unwrap();

        // A writer that died: its place, written as fredlock writes it, ends by itself.
        let (seconds, micros): (String, String) = raw
            .custom(fred::cmd!("TIME"), Vec::<String>::new())
            .await
            .unwrap();
        let now = seconds.parse::<u64>().unwrap() * 1000 + micros.parse::<u64>().unwrap() / 1000;
        let dead = format!("{}:99:write", client.id());
        let _: i64 = raw
            .zadd(
                writers_key("queued"),
                None,
                None,
                false,
                false,
                (now as f64 + 600.0, dead.as_str()),
            )
            .await
            .unwrap();
        let _: bool = raw
            .pexpire(writers_key("queued"), 5000, None)
            .await
            .unwrap();
        let late = rw
            .clone()
            .with_owner(fredlock::OwnerId::from_raw(4))
            .read_lock();
        let asked = Instant::now();
        let guard = late.lock().await.unwrap();
        let waited = asked.elapsed();
        println!("a dead writer kept a reader out for {waited:?}");
        assert!(
            waited >= Duration::from_millis(400) && waited < Duration::from_secs(3),
            "{waited:?}"
        );
        guard.unlock().await.unwrap();
        again.unlock().await.unwrap();
        held.unlock().await.unwrap();
    })
    .await;
}

/// 10. Introspection: mode, readers, the writer, waiting writers and orphan timeout keys;
///     `list` and `leaks` find the lock by its `mode` field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspections_show_modes_holders_and_orphans() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = client_with_place(&server, Duration::from_secs(5)).await;
        let rw = client.rw_lock("seen");
        let one = rw
            .clone()
            .with_owner(fredlock::OwnerId::from_raw(1))
            .read_lock()
            .lock()
            .await
            .unwrap();
        let two = rw
            .clone()
            .with_owner(fredlock::OwnerId::from_raw(2))
            .read_lock();
        let two_a = two.lock_with_lease(Duration::from_secs(20)).await.unwrap();
        let two_b = two.lock_with_lease(Duration::from_secs(20)).await.unwrap();
        let writer = rw
            .clone()
            .with_owner(fredlock::OwnerId::from_raw(3))
            .write_lock();
        let waiting =
            tokio::spawn(async move { writer.try_lock(Duration::from_secs(10), None).await });
        assert!(
            eventually(Duration::from_secs(2), || async {
                let count: i64 = raw.zcard(writers_key("seen")).await.unwrap();
                count == 1
            })
            .await
        );
        // An orphan: a timeout key of a hold that is gone, without expiry.
        let orphan = timeout_key("seen", &format!("{}:77", client.id()), 1);
        let _: () = raw.set(&orphan, 1, None, None, false).await.unwrap();

        let seen = rw.inspect().await.unwrap();
        assert_eq!(seen.kind, "rw_lock");
        assert_eq!(seen.details, Details::ReadWrite { mode: Some("read") });
        let mut holders: Vec<(String, u64)> = seen
            .holders
            .iter()
            .map(|h| (h.owner.clone(), h.count))
            .collect();
        holders.sort();
        let mut expected = vec![
            (client.owner_field(fredlock::OwnerId::from_raw(1)), 1),
            (client.owner_field(fredlock::OwnerId::from_raw(2)), 2),
        ];
        expected.sort();
        assert_eq!(holders, expected);
        assert!(seen
            .holders
            .iter()
            .all(|h| h.remaining_lease.is_some_and(|ttl| ttl > Duration::ZERO)));
        assert_eq!(seen.queue.len(), 1);
        assert_eq!(
            seen.queue[0].owner,
            client.owner_field(fredlock::OwnerId::from_raw(3)) + ":write"
        );
        assert!(seen.queue[0].place_left.is_some());
        assert_eq!(seen.keys.len(), 5, "{:?}", seen.keys); // hash, writers, three timeout keys
        assert_eq!(seen.orphans.len(), 1);
        assert_eq!(seen.orphans[0].key, orphan);
        assert_eq!(seen.orphans[0].ttl, None);
        assert_eq!(seen.listeners, Some(1));

        let by_name = client.inspect("seen").await.unwrap().unwrap();
        assert_eq!(by_name.kind, "rw_lock");
        assert_eq!(by_name.holders.len(), 2);
        let listed = client.list("se*").await.unwrap();
        assert_eq!(listed.len(), 1, "{listed:?}");
        assert_eq!(listed[0].kind, "rw_lock");
        let leaks = client
            .leaks("*", fredlock::DEFAULT_LEAK_GRACE)
            .await
            .unwrap();
        assert_eq!(leaks.len(), 1, "{leaks:?}");
        assert_eq!(leaks[0].key, orphan);
        assert_eq!(leaks[0].rule, "no_expiry");

        one.unlock().await.unwrap();
        two_a.unlock().await.unwrap();
        two_b.unlock().await.unwrap();
        let write = waiting.await.unwrap().unwrap().expect("the writer got in");
        let seen = rw.inspect().await.unwrap();
        assert_eq!(
            seen.details,
            Details::ReadWrite {
                mode: Some("write")
            }
        );
        assert_eq!(seen.holders.len(), 1);
        assert!(seen.holders[0].owner.ends_with(":write"));
        assert!(seen.queue.is_empty());
        // By name, force-unlocked in whichever mode.
        assert!(client.force_unlock("seen").await.unwrap());
        tokio::time::timeout(Duration::from_secs(15), write.lost())
            .await
            .expect("the writer was told");
        let _: i64 = raw.del(&orphan).await.unwrap();
        assert!(client.inspect("seen").await.unwrap().is_none());
    })
    .await;
}

/// An inspection shows every waiting writer, each once, with its place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspections_show_every_waiting_writer() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = client_with_place(&server, Duration::from_secs(5)).await;
        let rw = client.rw_lock("line");
        let read = rw.read_lock().lock().await.unwrap();
        let mut waiting = Vec::new();
        for owner in [3, 4, 5] {
            let writer = rw
                .clone()
                .with_owner(fredlock::OwnerId::from_raw(owner))
                .write_lock();
            waiting.push(tokio::spawn(async move {
                let guard = writer
                    .try_lock(Duration::from_secs(10), None)
                    .await
                    .unwrap()
                    .expect("each writer gets in in turn");
                guard.unlock().await.unwrap();
            }));
            let joined = owner as i64 - 2;
            assert!(
                eventually(Duration::from_secs(2), || async {
                    let count: i64 = raw.zcard(writers_key("line")).await.unwrap();
                    count == joined
                })
                .await
            );
        }
        let seen = rw.inspect().await.unwrap();
        // In the order of their places' ends, which each writer's next try moves: every one
        // shown once, whatever the order.
        let mut line: Vec<String> = seen.queue.iter().map(|w| w.owner.clone()).collect();
        line.sort();
        let mut expected: Vec<String> = [3, 4, 5]
            .map(|owner| client.owner_field(fredlock::OwnerId::from_raw(owner)) + ":write")
            .to_vec();
        expected.sort();
        assert_eq!(line, expected, "{seen:?}");
        assert!(
            seen.queue.iter().all(|w| w.place_left.is_some()),
            "{seen:?}"
        );
        read.unlock().await.unwrap();
        for writer in waiting {
            writer.await.unwrap();
        }
    })
    .await;
}

/// A force unlock in read mode deletes the hash and every read hold's own key, tells each
/// reader, and wakes a waiting writer at once: the writer's own next try would come a third of
/// its 30 s place later.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_force_unlock_in_read_mode_leaves_nothing_and_wakes_the_writer() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let readers = [
            server.lock_client(WATCHDOG).await,
            server.lock_client(WATCHDOG).await,
        ];
        let one = readers[0]
            .rw_lock("forced")
            .read_lock()
            .lock()
            .await
            .unwrap();
        let two = readers[1]
            .rw_lock("forced")
            .read_lock()
            .lock()
            .await
            .unwrap();
        let writer = client_with_place(&server, Duration::from_secs(30)).await;
        let write = writer.rw_lock("forced").write_lock();
        let waiting = tokio::spawn(async move { write.lock().await });
        assert!(
            common::eventually(Duration::from_secs(5), || async {
                raw.zcard::<i64, _>(writers_key("forced")).await.unwrap() == 1
            })
            .await,
            "the writer waits"
        );
        let forced = Instant::now();
        assert!(readers[0].rw_lock("forced").force_unlock().await.unwrap());
        let guard = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the waiting writer is woken by the force unlock")
            .unwrap()
            .unwrap();
        let woken = forced.elapsed();
        for reader in [&one, &two] {
            tokio::time::timeout(Duration::from_secs(5), reader.lost())
                .await
                .expect("each reader is told");
        }
        guard.unlock().await.unwrap();
        drop((one, two));
        assert!(
            common::eventually(Duration::from_secs(5), || async {
                all_keys(&raw)
                    .await
                    .iter()
                    .all(|key| !key.contains("forced"))
            })
            .await,
            "left behind: {:?}",
            all_keys(&raw).await
        );
        println!("the waiting writer got in {woken:?} after the force unlock");
    })
    .await;
}

/// Releases leave no stale read state: a reader whose holds all ended is forgotten by the next
/// release that passes over the readers, while the lock lives on for a reader still holding;
/// and a reader giving back one of two holds deletes that hold's own key. (A settle's release,
/// which keeps fewer holds with a lease of 0, is the differential test's: no read hold key
/// outlives its reader's count.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_forget_ended_readers_and_the_keys_of_holds_given_back() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = server.lock_client(WATCHDOG).await;
        let rw = client.rw_lock("tidy");
        let owners = [1, 2, 3].map(fredlock::OwnerId::from_raw);
        let [ended, releasing, living] = owners.map(|owner| rw.clone().with_owner(owner));
        let ended_guard = ended.read_lock().lock().await.unwrap();
        let living_guard = living.read_lock().lock().await.unwrap();
        // The releasing reader's hold is taken last, so that it is the longest (the hash's TTL
        // set in the same call): only a release of a hold within 5 ms of the hash's TTL passes
        // over the readers, and taken second, a busy machine put more than that between it and
        // the living reader's, whose hold then outlasted it.
        let releasing_guard = releasing.read_lock().lock().await.unwrap();
        let field = |owner| client.owner_field(owner);
        // The ended reader's hold key goes (as an expiry would take it).
        let _: i64 = raw
            .del(timeout_key("tidy", &field(owners[0]), 1))
            .await
            .unwrap();
        releasing_guard.unlock().await.unwrap();
        let seen = fields(&raw, "tidy").await;
        assert!(
            !seen.contains_key(&field(owners[0])),
            "the ended reader is forgotten: {seen:?}"
        );
        assert!(!seen.contains_key(&field(owners[1])), "{seen:?}");
        assert_eq!(
            seen.get(&field(owners[2])).map(String::as_str),
            Some("1"),
            "{seen:?}"
        );
        drop(ended_guard);
        living_guard.unlock().await.unwrap();

        // Two read holds of one reader; one given back.
        let reader = rw.clone().with_owner(owners[0]).read_lock();
        let first = reader
            .lock_with_lease(Duration::from_secs(20))
            .await
            .unwrap();
        let second = reader
            .lock_with_lease(Duration::from_secs(20))
            .await
            .unwrap();
        assert!(pttl(&raw, &timeout_key("tidy", &field(owners[0]), 2)).await > 0);
        second.unlock().await.unwrap();
        assert_eq!(
            pttl(&raw, &timeout_key("tidy", &field(owners[0]), 2)).await,
            -2,
            "the key of the hold given back is gone"
        );
        assert!(pttl(&raw, &timeout_key("tidy", &field(owners[0]), 1)).await > 0);
        first.unlock().await.unwrap();
        assert!(nothing_left(&raw, "tidy").await);
    })
    .await;
}

/// The last reader whose hold lives frees the lock when it lets go, although readers whose holds
/// ended are still in the hash: they are forgotten, the lock deleted, and a waiting writer
/// told at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_live_reader_frees_the_lock_past_ended_readers() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = server.lock_client(WATCHDOG).await;
        let rw = client.rw_lock("last-live");
        let [ended, living, writer] =
            [1, 2, 3].map(|owner| rw.clone().with_owner(fredlock::OwnerId::from_raw(owner)));
        let (short, long) = ended_and_living_reads(&ended, &living).await;
        let waiting = tokio::spawn(async move {
            let won = writer
                .write_lock()
                .try_lock(Duration::from_secs(10), None)
                .await;
            (won, Instant::now())
        });
        tokio::time::sleep(Duration::from_millis(400)).await;
        // An inspection shows the ended reader with no time left.
        let seen = rw.inspect().await.unwrap();
        let left = |owner| {
            let field = client.owner_field(fredlock::OwnerId::from_raw(owner));
            let holder = seen.holders.iter().find(|holder| holder.owner == field);
            holder.and_then(|holder| holder.remaining_lease)
        };
        assert_eq!(left(1), Some(Duration::ZERO), "{seen:?}");
        assert!(
            left(2).is_some_and(|left| left > Duration::from_secs(10)),
            "{seen:?}"
        );
        long.unlock().await.unwrap();
        let released = Instant::now();
        let (won, at) = waiting.await.unwrap();
        let guard = won.unwrap().expect("the writer wins");
        assert!(
            at.duration_since(released) < Duration::from_secs(1),
            "the writer was told {:?} after the release",
            at.duration_since(released)
        );
        guard.unlock().await.unwrap();
        drop(short);
        assert!(nothing_left(&raw, "last-live").await);
    })
    .await;
}

/// A side's own force unlock deletes the lock only in its mode, as Redisson's `RReadLock` and
/// `RWriteLock` do: the other side's leaves it held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_sides_force_unlock_deletes_only_its_own_mode() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = server.lock_client(WATCHDOG).await;
        let rw = client.rw_lock("sides");
        for held_mode in ["read", "write"] {
            let guard = if held_mode == "read" {
                rw.read_lock().lock().await.unwrap()
            } else {
                rw.write_lock().lock().await.unwrap()
            };
            let (read, write): (fredlock::Lock, fredlock::Lock) =
                (rw.read_lock().into(), rw.write_lock().into());
            let (own, other) = if held_mode == "read" {
                (read, write)
            } else {
                (write, read)
            };
            assert!(!other.force_unlock().await.unwrap(), "{held_mode}");
            assert_eq!(fields(&raw, "sides").await["mode"], held_mode);
            assert!(own.force_unlock().await.unwrap(), "{held_mode}");
            assert!(nothing_left(&raw, "sides").await);
            drop(guard);
        }
    })
    .await;
}

/// Read and write guards fit in a `MultiLock`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_sides_fit_in_a_multi_lock() {
    bounded(async {
        let server = RedisServer::start();
        let client = server.lock_client(WATCHDOG).await;
        let multi = fredlock::MultiLock::new(vec![
            client.rw_lock("multi:a").read_lock().into(),
            client.rw_lock("multi:b").write_lock().into(),
        ])
        .unwrap();
        let guard = multi.lock().await.unwrap();
        let other = server.lock_client(WATCHDOG).await;
        assert!(take_now(other.rw_lock("multi:a").read_lock())
            .await
            .is_some());
        assert!(take_now(other.rw_lock("multi:b").read_lock())
            .await
            .is_none());
        guard.unlock().await.unwrap();
        other.shutdown().await;
    })
    .await;
}

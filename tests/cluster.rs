//! Clusters: waiting on sharded pub/sub (Redis 7), a master failing over, and a waited lock's
//! slot migrating to another master mid-wait.

mod common;

use std::time::Duration;

use common::{bounded, eventually, redis_cli, RedisCluster};
use fredlock::{Details, Error, LockClient, LockGuard};
use tokio::task::JoinHandle;
use tokio::time::Instant;

async fn client(cluster: &RedisCluster, watchdog: Duration) -> LockClient {
    common::lock_client_at(&cluster.url(), watchdog).await
}

fn channel(name: &str) -> String {
    format!("redisson_lock__channel:{{{name}}}")
}

/// A waiter of `name` on `client`, reporting its guard and when it got it.
fn waiter(client: &LockClient, name: &str) -> JoinHandle<(LockGuard, Instant)> {
    let lock = client.lock(name);
    tokio::spawn(async move {
        let guard = lock.lock().await.unwrap();
        (guard, Instant::now())
    })
}

/// The shard channels the node on `port` has subscribers for.
fn shard_channels(port: u16) -> Vec<String> {
    redis_cli(port, &["pubsub", "shardchannels"])
        .lines()
        .map(str::to_string)
        .filter(|line| !line.is_empty())
        .collect()
}

/// Unlocks `guard` and checks that `waiter` holds the lock within 250 ms (woken by the unlock,
/// not by a TTL); `what` says what happened before, for the report.
async fn hand_over_promptly(
    guard: LockGuard,
    waiter: JoinHandle<(LockGuard, Instant)>,
    what: &str,
) {
    let woke = hand_over(guard, waiter).await;
    println!("{what}; the waiter held {woke:?} after the unlock");
    assert!(
        woke < Duration::from_millis(250),
        "woken by the unlock: {woke:?}"
    );
}

/// Unlocks `guard` and returns how long after that `waiter` held the lock.
async fn hand_over(guard: LockGuard, waiter: JoinHandle<(LockGuard, Instant)>) -> Duration {
    assert!(
        !waiter.is_finished(),
        "the waiter waits while the lock is held"
    );
    let released = Instant::now();
    guard.unlock().await.unwrap();
    let (held, at) = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter acquires after the unlock")
        .unwrap();
    held.unlock().await.unwrap();
    at.saturating_duration_since(released)
}

/// redis-rs's RESP2 pub/sub knows no `SSUBSCRIBE`: on a Redis 7 cluster, whose lock channels
/// are sharded, a client on redis-rs over RESP2 is refused at build, saying what to change, and
/// leaves no connection open. The same builder over RESP3 serves locks.
#[cfg(feature = "redis-rs")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resp2_on_redis_rs_is_refused_where_lock_channels_are_sharded() {
    use fredlock::{Backend, Protocol};
    bounded(async {
        let cluster = RedisCluster::start();
        // Every node's connections but the asking redis-cli's own.
        let connected = || {
            cluster
                .nodes
                .iter()
                .map(|node| redis_cli(node.port(), &["client", "list"]).lines().count() - 1)
                .sum::<usize>()
        };
        let builder = |protocol| {
            LockClient::builder()
                .backend(Backend::RedisRs)
                .protocol(protocol)
                .url(cluster.url())
        };
        let refused = builder(Protocol::Resp2)
            .build()
            .await
            .expect_err("RESP2 on redis-rs is refused on a sharded cluster");
        assert!(matches!(refused, Error::InvalidArgument(_)), "{refused:?}");
        let message = refused.to_string();
        assert!(
            message.contains("sharded") && message.contains("protocol(Protocol::Resp3)"),
            "says why and what to change: {message}"
        );
        assert!(
            eventually(Duration::from_secs(5), || async { connected() == 0 }).await,
            "no connection left open: {} still",
            connected()
        );
        let client = builder(Protocol::Resp3).build().await.unwrap();
        let guard = client.lock("sharded").lock().await.unwrap();
        guard.unlock().await.unwrap();
        client.shutdown().await;
    })
    .await
}

/// On a Redis 7 cluster a waiter subscribes with SSUBSCRIBE on the node of its lock's slot, and
/// the unlock's SPUBLISH wakes it; no classic channel exists anywhere but the holder's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_use_sharded_pubsub_on_a_cluster() {
    bounded(async {
        let cluster = RedisCluster::start();
        let holder = client(&cluster, Duration::from_secs(30)).await;
        let other = client(&cluster, Duration::from_secs(30)).await;
        let name = "shard-lock";
        let owner = cluster.master_of(name);
        let guard = holder.lock(name).lock().await.unwrap();
        let waiting = waiter(&other, name);
        assert!(
            eventually(Duration::from_secs(5), || async {
                shard_channels(owner).contains(&channel(name))
            })
            .await,
            "PUBSUB SHARDCHANNELS on the slot's master shows the lock's channel"
        );
        // The holder's own channel, on which a force unlock tells it, is classic by design
        // (it is in no lock's slot); no other classic channel may exist.
        let own = format!("fredlock_client:{}", holder.id());
        for node in &cluster.nodes {
            let classic = redis_cli(node.port(), &["pubsub", "channels"]);
            let others: Vec<&str> = classic
                .split_whitespace()
                .filter(|channel| *channel != own)
                .collect();
            assert!(others.is_empty(), "PUBSUB CHANNELS: {classic}");
        }
        hand_over_promptly(guard, waiting, "sharded wake-up").await;
        holder.shutdown().await;
        other.shutdown().await;
    })
    .await;
}

/// `CLUSTER FAILOVER` of the master holding a watchdog lock while a waiter waits: the renewals
/// go on on the new master (or the loss is reported), and the unlock wakes the waiter within
/// 250 ms, not by TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_failover_keeps_locks_and_waiters_working() {
    bounded(async {
        let cluster = RedisCluster::start_with_replicas(1);
        let watchdog = Duration::from_secs(3);
        let holder = client(&cluster, watchdog).await;
        let other = client(&cluster, watchdog).await;
        let name = "failover-lock";
        let old = cluster.master_of(name);
        let replica = cluster.replicas_of(old)[0];
        let guard = holder.lock(name).lock().await.unwrap();
        let field = guard.owner_field().to_string();
        let waiting = waiter(&other, name);
        tokio::time::sleep(Duration::from_millis(500)).await;

        let reply = redis_cli(replica, &["cluster", "failover"]);
        assert!(reply.starts_with("OK"), "CLUSTER FAILOVER: {reply}");
        let deadline = Instant::now() + Duration::from_secs(20);
        while cluster.master_of(name) != replica {
            assert!(Instant::now() < deadline, "the replica did not take over");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        cluster.await_ok(Duration::from_secs(20));
        println!("{replica} took over the slot from {old}");
        // A new lock in the same slot is taken on the new master.
        let fresh = format!("{{{name}}}:fresh");
        let taken = other
            .lock(fresh.as_str())
            .try_lock(Duration::from_secs(5), None)
            .await
            .unwrap()
            .expect("a new acquisition succeeds after the failover");
        assert!(redis_cli(replica, &["exists", &fresh]).starts_with('1'));
        taken.unlock().await.unwrap();

        tokio::time::sleep(watchdog * 2).await;
        if guard.is_lost() {
            // Told of the loss: then it is gone from the new master too, and the waiter has it
            // within one lease, while the lost guard's unlock finds nothing to release.
            println!("the holder was told its lock is lost");
            let (held, _) = tokio::time::timeout(watchdog, waiting)
                .await
                .expect("the waiter acquires within a lease of the loss")
                .unwrap();
            let fields = redis_cli(replica, &["hkeys", name]);
            assert_eq!(
                fields.trim(),
                held.owner_field(),
                "the waiter's hold, on the new master"
            );
            assert!(matches!(guard.unlock().await, Err(Error::NotHeld { .. })));
            held.unlock().await.unwrap();
        } else {
            let fields = redis_cli(replica, &["hkeys", name]);
            assert_eq!(fields.trim(), field, "renewed on the new master");
            let ttl: i64 = redis_cli(replica, &["pttl", name]).trim().parse().unwrap();
            assert!(ttl > 0, "{ttl}");
            hand_over_promptly(guard, waiting, "renewals continued").await;
        }
        holder.shutdown().await;
        other.shutdown().await;
    })
    .await;
}

/// A move of `name`'s slot from its master to another (`CLUSTER SETSLOT`, `MIGRATE`), step by
/// step.
struct SlotMove {
    slot: String,
    source: u16,
    target: u16,
    source_id: String,
    target_id: String,
}

impl SlotMove {
    fn of(cluster: &RedisCluster, name: &str) -> SlotMove {
        let source = cluster.master_of(name);
        let target = cluster
            .nodes
            .iter()
            .map(|node| node.port())
            .find(|port| *port != source)
            .unwrap();
        SlotMove {
            slot: fred::util::redis_keyslot(name.as_bytes()).to_string(),
            source,
            target,
            source_id: cluster.node_id(source),
            target_id: cluster.node_id(target),
        }
    }

    /// The slot importing on the target, migrating on the source.
    fn begin(&self) {
        ok(redis_cli(
            self.target,
            &[
                "cluster",
                "setslot",
                &self.slot,
                "importing",
                &self.source_id,
            ],
        ));
        ok(redis_cli(
            self.source,
            &[
                "cluster",
                "setslot",
                &self.slot,
                "migrating",
                &self.target_id,
            ],
        ));
    }

    /// Every key of the slot moved to the target (the slot is still the source's).
    fn migrate_keys(&self) {
        let keys = redis_cli(
            self.source,
            &["cluster", "getkeysinslot", &self.slot, "100"],
        );
        let target = self.target.to_string();
        for key in keys.lines().filter(|key| !key.is_empty()) {
            ok(redis_cli(
                self.source,
                &["migrate", "127.0.0.1", &target, key, "0", "5000"],
            ));
        }
    }

    /// The slot the target's, on every node.
    fn finish(&self, cluster: &RedisCluster) {
        for node in &cluster.nodes {
            ok(redis_cli(
                node.port(),
                &["cluster", "setslot", &self.slot, "node", &self.target_id],
            ));
        }
        cluster.await_ok(Duration::from_secs(20));
        println!(
            "slot {} moved from {} to {}",
            self.slot, self.source, self.target
        );
    }
}

fn ok(reply: String) {
    assert!(reply.starts_with("OK"), "{reply}");
}

/// The waited lock's slot moves to another master mid-wait (`CLUSTER SETSLOT` + `MIGRATE`):
/// the waiter subscribes again on the new owner and is still woken within 250 ms of the unlock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_migrated_mid_wait_still_wakes_its_waiter() {
    bounded(async {
        let cluster = RedisCluster::start();
        let holder = client(&cluster, Duration::from_secs(30)).await;
        let other = client(&cluster, Duration::from_secs(30)).await;
        let name = "migrating-lock";
        let moving = SlotMove::of(&cluster, name);
        let (source, target) = (moving.source, moving.target);
        let guard = holder.lock(name).lock().await.unwrap();
        let waiting = waiter(&other, name);
        assert!(
            eventually(Duration::from_secs(5), || async {
                shard_channels(source).contains(&channel(name))
            })
            .await
        );

        moving.begin();
        moving.migrate_keys();
        moving.finish(&cluster);
        assert_eq!(cluster.master_of(name), target);

        assert!(
            eventually(Duration::from_secs(5), || async {
                shard_channels(target).contains(&channel(name))
            })
            .await,
            "the waiter subscribed again on the slot's new master"
        );
        hand_over_promptly(guard, waiting, "the slot moved").await;
        holder.shutdown().await;
        other.shutdown().await;
    })
    .await;
}

/// Reads and writes of a held lock while its slot moves: with the slot half moved (its key
/// already on the new master, the slot still the old one's), the old master answers `ASK`; once
/// the move is done, the client's routing is stale and the old master answers `MOVED`.
///
/// On redis-rs the call follows both (to the new master, behind `ASKING` for an `ASK`), and
/// neither is an error. fred sends each command once (`max_command_attempts` 1, so that no
/// script runs twice) and has no attempt left for the `ASKING`: there the call fails with
/// `Unavailable` and changes nothing, fred ends its routing task, and the seam starts it again,
/// so that the client serves the lock from its new master after the move (without that, it
/// answered no call at all).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_follow_ask_and_moved_while_a_slot_moves() {
    #[cfg(feature = "redis-rs")]
    let on_redis_rs = common::backend() == fredlock::Backend::RedisRs;
    #[cfg(not(feature = "redis-rs"))]
    let on_redis_rs = false;
    bounded(async {
        let cluster = RedisCluster::start();
        let holder = client(&cluster, Duration::from_secs(30)).await;
        let name = "moving-lock";
        let moving = SlotMove::of(&cluster, name);
        let lock = holder.lock(name);
        let guard = lock.lock().await.unwrap();
        moving.begin();
        moving.migrate_keys();
        // The key is on the new master only; the slot is still the old one's, which sends a
        // call for it there.
        let asked = redis_cli(moving.source, &["exists", name]);
        assert!(asked.starts_with("ASK"), "{asked}");
        if on_redis_rs {
            assert_eq!(lock.hold_count().await.unwrap(), 1, "read through ASK");
            assert!(lock.is_locked().await.unwrap(), "read through ASK");
            assert!(lock.remaining_lease().await.unwrap().is_some());
        } else {
            let error = lock.hold_count().await.unwrap_err();
            assert!(matches!(error, Error::Unavailable { .. }), "{error:?}");
        }
        moving.finish(&cluster);
        assert_eq!(cluster.master_of(name), moving.target);
        if on_redis_rs {
            assert_eq!(lock.hold_count().await.unwrap(), 1, "read through MOVED");
        } else {
            let started = Instant::now();
            assert!(
                eventually(Duration::from_secs(10), || async {
                    matches!(lock.hold_count().await, Ok(1))
                })
                .await,
                "fred serves the moved slot again"
            );
            println!("fred served the moved slot after {:?}", started.elapsed());
        }
        guard.unlock().await.unwrap();
        assert!(!lock.is_locked().await.unwrap());
        assert_eq!(redis_cli(moving.target, &["exists", name]).trim(), "0");
        holder.shutdown().await;
    })
    .await;
}

/// Redisson on a Redis 7 cluster waits with SSUBSCRIBE and unlocks with SPUBLISH: its unlock
/// (replayed here: delete, SPUBLISH 0) wakes a fredlock waiter, and fredlock's unlock reaches a
/// Redisson waiter's shard subscription.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_wake_ups_interoperate_with_redisson() {
    bounded(async {
        use fred::prelude::*;
        let cluster = RedisCluster::start();
        let raw = cluster.raw().await;
        let client = client(&cluster, Duration::from_secs(30)).await;
        let name = "shard-java";
        let java_field = "6a2c1e5e-4b8f-4f0e-9a8e-3d2b1c0f9e8d:57";
        let _: () = raw.hset(name, (java_field, 1)).await.unwrap();
        let _: bool = raw.pexpire(name, 30_000, None).await.unwrap();
        let owner = cluster.master_of(name);
        let waiting = waiter(&client, name);
        assert!(
            eventually(Duration::from_secs(5), || async {
                shard_channels(owner).contains(&channel(name))
            })
            .await
        );
        // Redisson's unlock: delete, SPUBLISH 0 on the channel.
        let _: i64 = raw.del(name).await.unwrap();
        let _: i64 = raw.spublish(channel(name), 0).await.unwrap();
        let released = Instant::now();
        let (guard, held) = waiting.await.unwrap();
        let woke = held.saturating_duration_since(released);
        println!("woken by Redisson's SPUBLISH after {woke:?}");
        assert!(woke < Duration::from_millis(250), "{woke:?}");

        // A Redisson waiter's subscription hears fredlock's unlock.
        let java_waiter = raw.clone_new();
        java_waiter.init().await.unwrap();
        let mut messages = java_waiter.message_rx();
        java_waiter.ssubscribe(channel(name)).await.unwrap();
        guard.unlock().await.unwrap();
        let message = tokio::time::timeout(Duration::from_secs(2), messages.recv())
            .await
            .expect("the unlock is published on the shard channel")
            .unwrap();
        assert_eq!(&*message.channel, channel(name));
        assert_eq!(message.value.as_string().as_deref(), Some("0"));
        let _ = java_waiter.quit().await;
        client.shutdown().await;
    })
    .await;
}

/// Listing scans every master: locks on three masters are all found, with their holders, and
/// the waiters listening on a shard channel are counted on the slot's master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_and_inspect_see_every_master() {
    bounded(async {
        let cluster = RedisCluster::start();
        let holder = client(&cluster, Duration::from_secs(30)).await;
        // Names on different masters.
        let mut names: Vec<String> = Vec::new();
        let mut masters = Vec::new();
        for i in 0..200 {
            let name = format!("listed:{i}");
            let master = cluster.master_of(&name);
            if !masters.contains(&master) {
                masters.push(master);
                names.push(name);
            }
        }
        assert_eq!(masters.len(), 3, "three masters");
        let mut guards = Vec::new();
        for name in &names {
            guards.push(holder.lock(name.as_str()).lock().await.unwrap());
        }
        let other = client(&cluster, Duration::from_secs(30)).await;
        let waiting = waiter(&other, &names[0]);
        assert!(
            eventually(Duration::from_secs(5), || async {
                shard_channels(masters[0]).contains(&channel(&names[0]))
            })
            .await
        );
        let listed = holder.list("listed:*").await.unwrap();
        let mut expected = names.clone();
        expected.sort();
        let found: Vec<&str> = listed.iter().map(|seen| seen.name.as_str()).collect();
        assert_eq!(found, expected);
        for seen in &listed {
            assert_eq!(seen.holders.len(), 1);
            assert_eq!(seen.holders[0].client_id(), Some(holder.id()));
        }
        let first = holder.inspect(&names[0]).await.unwrap().unwrap();
        assert_eq!(
            first.listeners,
            Some(1),
            "the waiting client's shard subscription"
        );
        assert!(holder
            .leaks("listed:*", Duration::from_secs(60))
            .await
            .unwrap()
            .is_empty());
        for guard in guards {
            guard.unlock().await.unwrap();
        }
        let (guard, _) = waiting.await.unwrap();
        guard.unlock().await.unwrap();
        holder.shutdown().await;
        other.shutdown().await;
    })
    .await;
}

/// A read-write lock on a cluster: its timeout keys share the lock's slot (so every script runs
/// on one node), a write unlock wakes the readers through sharded pub/sub, the watchdog renews
/// read holds, and `list` finds the locks on every master by their `mode` field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rw_lock_works_on_every_master() {
    bounded(async {
        let cluster = RedisCluster::start();
        let holder = client(&cluster, Duration::from_millis(900)).await;
        let readers = client(&cluster, Duration::from_secs(30)).await;
        let mut names: Vec<String> = Vec::new();
        let mut masters = Vec::new();
        for i in 0..200 {
            let name = format!("rw:{i}");
            let master = cluster.master_of(&name);
            if !masters.contains(&master) {
                masters.push(master);
                names.push(name);
            }
        }
        names.push("rw:tenant{7}".to_owned());
        let mut reads = Vec::new();
        for name in &names {
            let write = holder
                .rw_lock(name.as_str())
                .write_lock()
                .lock()
                .await
                .unwrap();
            let mut waiting = Vec::new();
            for _ in 0..3 {
                let read = readers.rw_lock(name.as_str()).read_lock();
                waiting.push(tokio::spawn(async move {
                    let guard = read.lock().await.unwrap();
                    (guard, Instant::now())
                }));
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
            let released = Instant::now();
            write.unlock().await.unwrap();
            for task in waiting {
                let (guard, at) = task.await.unwrap();
                let woke = at.saturating_duration_since(released);
                assert!(woke < Duration::from_millis(250), "{name}: {woke:?}");
                reads.push(guard);
            }
            // A read hold of the watchdog's, on the short timeout.
            reads.push(
                holder
                    .rw_lock(name.as_str())
                    .read_lock()
                    .lock()
                    .await
                    .unwrap(),
            );
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(reads.iter().all(|guard| !guard.is_lost()));
        let listed = holder.list("rw:*").await.unwrap();
        let found: Vec<(&str, Option<&str>, usize)> = listed
            .iter()
            .map(|seen| {
                let mode = match seen.details {
                    Details::ReadWrite { mode } => mode,
                    _ => None,
                };
                (seen.kind, mode, seen.holders.len())
            })
            .collect();
        // Three readers of one client, and the watchdog-renewed one.
        assert_eq!(found, vec![("rw_lock", Some("read"), 4); names.len()]);
        assert!(holder
            .leaks("rw:*", Duration::from_secs(60))
            .await
            .unwrap()
            .is_empty());
        for guard in reads {
            guard.unlock().await.unwrap();
        }
        assert!(holder.list("rw:*").await.unwrap().is_empty());
    })
    .await;
}

/// Semaphores and latches on every master (sharded pub/sub): a release wakes a waiter of the
/// semaphore, a permit semaphore's leases are renewed, and the latch's zero releases its
/// waiter, each within 250 ms, whatever master the name is on (and for a hash-tagged name).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphores_and_latches_work_on_every_master() {
    bounded(async {
        let cluster = RedisCluster::start();
        let holder = client(&cluster, Duration::from_millis(900)).await;
        let waiters = client(&cluster, Duration::from_secs(30)).await;
        let mut names: Vec<String> = Vec::new();
        let mut masters = Vec::new();
        for i in 0..200 {
            let name = format!("sem:{i}");
            let master = cluster.master_of(&name);
            if !masters.contains(&master) {
                masters.push(master);
                names.push(name);
            }
        }
        names.push("sem:tenant{7}".to_owned());
        let mut leases = Vec::new();
        for name in &names {
            let semaphore = holder.semaphore(name.as_str());
            semaphore.try_set_permits(1).await.unwrap();
            let permit = semaphore.acquire(1).await.unwrap();
            let waiting = {
                let semaphore = waiters.semaphore(name.as_str());
                tokio::spawn(async move {
                    let permit = semaphore.acquire(1).await.unwrap();
                    (permit, Instant::now())
                })
            };
            tokio::time::sleep(Duration::from_millis(300)).await;
            let released = Instant::now();
            permit.release().await.unwrap();
            let (permit, at) = waiting.await.unwrap();
            let woke = at.saturating_duration_since(released);
            assert!(woke < Duration::from_millis(250), "{name}: {woke:?}");
            permit.release().await.unwrap();

            let latch_name = name.replace(['{', '}'], "");
            let latch = holder.count_down_latch(latch_name.as_str());
            latch.try_set_count(1).await.unwrap();
            let waiting = {
                let latch = waiters.count_down_latch(latch_name.as_str());
                tokio::spawn(async move {
                    latch.wait().await.unwrap();
                    Instant::now()
                })
            };
            tokio::time::sleep(Duration::from_millis(300)).await;
            let zero = Instant::now();
            latch.count_down().await.unwrap();
            let woke = waiting.await.unwrap().saturating_duration_since(zero);
            assert!(woke < Duration::from_millis(250), "{latch_name}: {woke:?}");

            let leased = holder.permit_semaphore(format!("{name}:leased"));
            leased.try_set_permits(1).await.unwrap();
            leases.push(leased.acquire().await.unwrap());
        }
        // Renewed on the short watchdog lease, on every master.
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(leases.iter().all(|permit| !permit.is_lost()));
        let listed = holder.list("sem:*").await.unwrap();
        assert_eq!(listed.len(), names.len(), "{listed:?}");
        assert!(listed.iter().all(|seen| seen.kind == "permit_semaphore"));
        for permit in leases {
            permit.release().await.unwrap();
        }
    })
    .await;
}

/// A force unlock tells the holder's client at once on a cluster too: the script's classic
/// PUBLISH reaches the holder's own channel whichever node it subscribed on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_unlock_tells_the_holder_on_a_cluster() {
    bounded(async {
        let cluster = RedisCluster::start();
        let holder = client(&cluster, Duration::from_secs(30)).await;
        let other = client(&cluster, Duration::from_secs(30)).await;
        let guard = holder.lock("forced-on-cluster").lock().await.unwrap();
        let own = format!("fredlock_client:{}", holder.id());
        assert!(
            eventually(Duration::from_secs(5), || async {
                cluster
                    .nodes
                    .iter()
                    .any(|node| redis_cli(node.port(), &["pubsub", "channels"]).contains(&own))
            })
            .await,
            "the holder never listened on {own}"
        );
        let forced = Instant::now();
        assert!(other
            .lock("forced-on-cluster")
            .force_unlock()
            .await
            .unwrap());
        tokio::time::timeout(Duration::from_millis(250), guard.lost())
            .await
            .expect("the holder is told at once");
        println!("told after {:?}", forced.elapsed());
        holder.shutdown().await;
        other.shutdown().await;
    })
    .await;
}

/// A job lock works on every master: its key, tick and channel share a slot, a waiting run is
/// woken through sharded pub/sub within 250 ms, and ticks run once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_job_lock_works_on_every_master() {
    bounded(async {
        let cluster = RedisCluster::start();
        let holder = client(&cluster, Duration::from_secs(30)).await;
        let waiters = client(&cluster, Duration::from_secs(30)).await;
        let mut names: Vec<String> = Vec::new();
        let mut masters = Vec::new();
        for i in 0..200 {
            let name = format!("job{i}");
            let master = cluster.master_of(&format!("job-lock:default:{name}"));
            if !masters.contains(&master) {
                masters.push(master);
                names.push(name);
            }
        }
        assert!(names.len() > 1);
        let tick = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_000_000);
        for name in &names {
            let job = holder.job_lock(name.as_str());
            assert!(
                job.run_tick(tick, async {}).await.unwrap().is_ran(),
                "{name}"
            );
            assert!(
                job.run_tick(tick, async {}).await.unwrap().is_skipped(),
                "{name}"
            );
            let (go, hold) = tokio::sync::oneshot::channel::<()>();
            let (taken, is_taken) = tokio::sync::oneshot::channel();
            let holding = tokio::spawn(async move {
                job.run(async move {
                    taken.send(()).unwrap();
                    hold.await.unwrap();
                })
                .await
                .unwrap()
            });
            is_taken.await.unwrap();
            let waiting = {
                let job = waiters.job_lock(name.as_str());
                tokio::spawn(async move {
                    job.run_waiting(Duration::from_secs(10), async { Instant::now() })
                        .await
                        .unwrap()
                        .ran()
                        .unwrap()
                })
            };
            tokio::time::sleep(Duration::from_millis(300)).await;
            let released = Instant::now();
            go.send(()).unwrap();
            assert!(holding.await.unwrap().is_ran());
            let woke = waiting.await.unwrap().saturating_duration_since(released);
            assert!(woke < Duration::from_millis(250), "{name}: {woke:?}");
        }
        holder.shutdown().await;
        waiters.shutdown().await;
    })
    .await;
}

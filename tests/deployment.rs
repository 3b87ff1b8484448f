//! What the deployment around the locks does to them: a server full to its `maxmemory`, and the
//! deployment check's findings.

mod common;

use std::time::Duration;

use common::{bounded, free_port, script, RedisServer};
use fred::prelude::*;

/// Writes values until the server refuses even a small one for lack of memory: large ones
/// first, then smaller (a refused large value was partly its own query buffer).
async fn fill_to_the_limit(raw: &Client) {
    let mut i = 0u32;
    for size in [64 * 1024, 4 * 1024, 256, 16] {
        let value = "x".repeat(size);
        loop {
            i += 1;
            let written: Result<(), _> = raw
                .set(format!("filler:{i}"), value.as_str(), None, None, false)
                .await;
            match written {
                Ok(()) => assert!(i < 100_000, "the server never filled up"),
                Err(error) => {
                    assert!(error.details().contains("OOM"), "{error}");
                    break;
                }
            }
        }
    }
}

/// At `maxmemory` with `noeviction`, a new acquisition is refused, but holds already taken are
/// renewed, given back (one hold of two, then the last), and force-unlocked: the scripts that
/// free memory carry `allow-oom`. The same release without the flag is refused, so the flag is
/// what makes the difference.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_let_go_on_a_full_server() {
    bounded(async {
        let server = RedisServer::start_with(
            &["--maxmemory", "4mb", "--maxmemory-policy", "noeviction"],
            free_port,
        );
        let raw = server.raw().await;
        let watchdog = Duration::from_millis(1500);
        let client = server.lock_client(watchdog).await;
        let lock = client.lock("full-reentrant");
        let outer = lock.lock().await.unwrap();
        let inner = lock.lock().await.unwrap();
        let fair_lock = client.fair_lock("full-fair");
        let fair = fair_lock.lock().await.unwrap();
        let forced = client.lock("full-forced");
        let _abandoned = forced
            .lock_with_lease(Duration::from_secs(60))
            .await
            .unwrap();
        let legacy = client.lock("full-legacy");
        let legacy_guard = legacy.lock().await.unwrap();
        let legacy_field = legacy_guard.owner_field().to_string();
        // A second hold, kept: the release below must write a count.
        let legacy_second = legacy.lock().await.unwrap();
        assert_eq!(legacy.hold_count().await.unwrap(), 2);

        fill_to_the_limit(&raw).await;
        let refused = client
            .lock("full-new")
            .try_lock(Duration::ZERO, None)
            .await
            .unwrap_err();
        assert!(refused.to_string().contains("OOM"), "{refused}");

        // Without the flags line, the release of one hold of two is refused.
        let unflagged = script("lock_release")
            .split_once('\n')
            .filter(|(first, _)| first.starts_with("#!lua"))
            .expect("the release carries a flags line")
            .1;
        let without_flag: Result<Value, _> = raw
            .eval(
                unflagged,
                vec![
                    "full-legacy".to_string(),
                    "redisson_lock__channel:{full-legacy}".to_string(),
                    "fredlock_fences:{full-legacy}".to_string(),
                ],
                // Keep one hold of the two: the count is written.
                vec!["0", "30000", legacy_field.as_str(), "1", "1"],
            )
            .await;
        let error = without_flag.expect_err("a release without allow-oom is refused when full");
        assert!(error.details().contains("OOM"), "{error}");

        // Renewals go on: alive after two watchdog leases.
        tokio::time::sleep(watchdog * 2).await;
        assert!(!outer.is_lost() && !fair.is_lost());
        assert!(raw.pttl::<i64, _>("full-reentrant").await.unwrap() > 0);

        inner.unlock().await.unwrap();
        assert_eq!(lock.hold_count().await.unwrap(), 1);
        outer.unlock().await.unwrap();
        assert!(!lock.is_locked().await.unwrap());
        fair.unlock().await.unwrap();
        assert!(!fair_lock.is_locked().await.unwrap());
        // Both holds of the legacy lock, the second's count written despite the full server.
        assert_eq!(legacy.hold_count().await.unwrap(), 2);
        legacy_second.unlock().await.unwrap();
        legacy_guard.unlock().await.unwrap();
        assert!(!legacy.is_locked().await.unwrap());
        assert!(forced.force_unlock().await.unwrap());
        assert!(!forced.is_locked().await.unwrap());
        client.shutdown().await;
    })
    .await;
}

async fn check(server: &RedisServer) -> fredlock::Deployment {
    let client = server.lock_client(Duration::from_secs(30)).await;
    let report = client.check_deployment().await.unwrap();
    println!("{report}");
    client.shutdown().await;
    report
}

fn warned(report: &fredlock::Deployment, text: &str) -> bool {
    report.warnings.iter().any(|warning| warning.contains(text))
}

/// Eviction policies that can delete lock keys are flagged, `noeviction` is not; a server
/// without persistence is flagged, one with AOF is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deployment_check_flags_evictable_locks_and_no_persistence() {
    bounded(async {
        let allkeys = RedisServer::start_with(
            &["--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru"],
            free_port,
        );
        let report = check(&allkeys).await;
        assert_eq!(report.topology, fredlock::Topology::Standalone);
        let node = &report.nodes[0];
        assert_eq!(node.server, format!("127.0.0.1:{}", allkeys.port()));
        // The server the harness runs, recognised as what it is (Valkey reports its own
        // version, and a `redis_version` of the Redis it is compatible with).
        let flavour = if common::on_valkey() {
            "valkey"
        } else {
            "redis"
        };
        assert_eq!(node.flavour, flavour);
        assert!(!node.version.is_empty());
        if common::on_valkey() {
            assert!(node.version.starts_with("9."), "{}", node.version);
        }
        assert_eq!(node.role, "master");
        assert!(node.wait);
        let major_minor: Vec<u32> = node
            .version
            .split('.')
            .take(2)
            .map(|part| part.parse().unwrap())
            .collect();
        let waitaof = common::on_valkey() || major_minor >= vec![7, 2];
        assert_eq!(node.waitaof, waitaof, "{}", node.version);
        assert_eq!(node.maxmemory, Some(100 * 1024 * 1024));
        assert!(warned(&report, "allkeys-lru"), "{report}");
        assert!(warned(&report, "no persistence"), "{report}");

        let volatile = RedisServer::start_with(
            &["--maxmemory", "100mb", "--maxmemory-policy", "volatile-lru"],
            free_port,
        );
        let report = check(&volatile).await;
        assert!(warned(&report, "volatile-lru"), "{report}");

        // volatile-* without a limit evicts nothing; AOF persists the counters.
        let safe = RedisServer::start_with(
            &["--maxmemory-policy", "volatile-lru", "--appendonly", "yes"],
            free_port,
        );
        let report = check(&safe).await;
        assert!(report.warnings.is_empty(), "{report}");
    })
    .await;
}

/// A server that refuses `WAIT`, and one that refuses `CONFIG`, are each reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deployment_check_reports_refused_commands() {
    bounded(async {
        let no_wait = RedisServer::start_with(&["--rename-command", "WAIT", ""], free_port);
        let report = check(&no_wait).await;
        assert!(!report.nodes[0].wait);
        assert!(warned(&report, "WAIT is refused"), "{report}");

        let no_config = RedisServer::start_with(&["--rename-command", "CONFIG", ""], free_port);
        let report = check(&no_config).await;
        assert_eq!(report.nodes[0].maxmemory_policy, None);
        assert!(warned(&report, "CONFIG GET is refused"), "{report}");
    })
    .await;
}

/// Behind Sentinel: the master and its replicas; in a cluster: every master, none with replicas.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deployment_check_sees_sentinel_and_cluster_topologies() {
    bounded(async {
        let setup = common::RedisSentinel::start(2);
        let client = common::connect(&setup.url()).await.unwrap();
        let report = client.check_deployment().await.unwrap();
        println!("{report}");
        assert_eq!(
            report.topology,
            fredlock::Topology::Sentinel {
                service: common::SENTINEL_SERVICE.to_string()
            }
        );
        assert_eq!(report.nodes.len(), 1);
        assert_eq!(
            report.nodes[0].server,
            format!("127.0.0.1:{}", setup.master_port())
        );
        assert_eq!(report.nodes[0].replicas, 2);
        assert!(warned(&report, "replicated asynchronously"), "{report}");
        client.shutdown().await;

        let cluster = common::RedisCluster::start();
        let client = common::connect(&cluster.url()).await.unwrap();
        let report = client.check_deployment().await.unwrap();
        println!("{report}");
        assert_eq!(report.topology, fredlock::Topology::Cluster);
        let mut servers: Vec<String> = report
            .nodes
            .iter()
            .map(|node| node.server.clone())
            .collect();
        servers.sort();
        let mut expected: Vec<String> = cluster
            .nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port()))
            .collect();
        expected.sort();
        assert_eq!(servers, expected);
        assert_eq!(
            report
                .warnings
                .iter()
                .filter(|warning| warning.contains("without replicas"))
                .count(),
            3,
            "{report}"
        );
        client.shutdown().await;
    })
    .await;
}

/// Replica sync on a master without replicas: every acquisition would fail, and the check says
/// so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deployment_check_flags_replica_sync_without_replicas() {
    bounded(async {
        let server = RedisServer::start();
        let client = common::builder()
            .url(server.url())
            .replica_sync(fredlock::ReplicaSync::replicas(1))
            .build()
            .await
            .unwrap();
        let report = client.check_deployment().await.unwrap();
        println!("{report}");
        assert!(
            warned(&report, "replica_sync asks for 1 replica(s), but 0"),
            "{report}"
        );
        client.shutdown().await;
    })
    .await;
}

/// The harness's own start-up check (tests/common/up.rs): a server counts as up only when the
/// process answering on its port is the one the test started, not another test's server that
/// took the port first (CI runs two cargo passes at once).
#[test]
fn a_server_is_up_only_when_its_own_process_answers() {
    let server = RedisServer::start();
    assert!(common::up::answers_as(server.port(), server.pid()));
    assert!(!common::up::answers_as(server.port(), server.pid() + 1));
    // Nothing on the port: not up.
    let port = free_port();
    assert!(!common::up::answers_as(port, server.pid()));
}

/// A loopback port the test holds, handed to a harness as its first pick (free ports after
/// that), as happens when another process takes a port between the harness's probe and its
/// server's bind. Counts the picks.
struct TakenFirst {
    _holder: std::net::TcpListener,
    port: u16,
    picks: std::sync::atomic::AtomicUsize,
}

impl TakenFirst {
    fn new() -> TakenFirst {
        let holder = std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)).unwrap();
        TakenFirst {
            port: holder.local_addr().unwrap().port(),
            _holder: holder,
            picks: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    fn pick(&self) -> u16 {
        match self
            .picks
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        {
            0 => self.port,
            _ => free_port(),
        }
    }

    /// Checks that the harness tried the taken port, then started on `port`, another.
    fn assert_moved_to(&self, port: u16) {
        let picks = self.picks.load(std::sync::atomic::Ordering::Relaxed);
        assert!(
            picks >= 2,
            "the taken port was tried, then another ({picks} picks)"
        );
        assert_ne!(port, self.port);
    }
}

/// The harness retries on another port when its first is taken between the probe and the
/// server's bind, as happens when CI's passes run side by side; each retry must find its
/// directory still there (a failed try once removed it, and every later try exited at once).
#[test]
fn a_server_whose_first_port_is_taken_starts_on_another() {
    let taken = TakenFirst::new();
    let server = RedisServer::start_with(&[], || taken.pick());
    taken.assert_moved_to(server.port());
    assert!(common::up::answers_as(server.port(), server.pid()));
}

/// The same for PostgreSQL: a server counts as up once its own pid file says it is ready, not
/// when something answers on its port. Here the port is the test's listener, which a connect
/// reaches while the server that could not bind it exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_whose_first_port_is_taken_starts_on_another() {
    let taken = TakenFirst::new();
    let server =
        tokio::task::block_in_place(|| common::PostgresServer::start_with(|| taken.pick()));
    taken.assert_moved_to(server.port());
    bounded(async {
        let client = server.client().await;
        let row = client.query_one("SELECT 1", &[]).await.unwrap();
        assert_eq!(row.get::<_, i32>(0), 1);
    })
    .await;
}

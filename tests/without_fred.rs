//! The crate built on redis-rs alone (issue 45): `default-features = false, features =
//! ["redis-rs"]`, where fred is not compiled at all (`.ci/run` checks `cargo tree`). These tests
//! run in that build (`cargo test -p fredlock --no-default-features --features redis-rs --test
//! without_fred`) and, on redis-rs, in every build with feature `redis-rs`.
//!
//! They start their own server: the shared harness (`tests/common`) talks to servers through
//! fred, which this build does not have.
#![cfg(feature = "redis-rs")]

#[path = "common/up.rs"]
mod up;

use std::net::{Ipv4Addr, SocketAddrV4, TcpListener};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fredlock::{Backend, LockClient, LockClientBuilder};

/// A throw-away server on a free loopback port (`$FREDLOCK_SERVER`, else `redis-server`),
/// killed when dropped.
struct Server {
    port: u16,
    child: Child,
}

fn free_port() -> u16 {
    TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("a free port")
}

impl Server {
    fn start() -> Server {
        Server::start_with(&[], free_port)
    }

    /// A cluster node (its bus port, port + 10 000, free too), its files in a directory of
    /// its own.
    fn start_cluster_node() -> Server {
        let dir = std::env::temp_dir().join(format!(
            "fredlock-without-fred-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&dir).expect("a directory for the node");
        let dir = dir.to_string_lossy().into_owned();
        Server::start_with(
            &[
                "--cluster-enabled",
                "yes",
                "--cluster-node-timeout",
                "2000",
                "--dir",
                &dir,
            ],
            || loop {
                let port = free_port();
                if port < 55_000
                    && TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port + 10_000))
                        .is_ok()
                {
                    return port;
                }
            },
        )
    }

    fn start_with(extra: &[&str], pick_port: fn() -> u16) -> Server {
        let binary = std::env::var("FREDLOCK_SERVER")
            .ok()
            .filter(|binary| !binary.is_empty())
            .unwrap_or_else(|| "redis-server".to_owned());
        for _ in 0..10 {
            let port = pick_port();
            let mut child = Command::new(&binary)
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"])
                .args(extra)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|error| panic!("start {binary}: {error}"));
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if up::answers_as(port, child.id()) {
                    return Server { port, child };
                }
                if child.try_wait().ok().flatten().is_some() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("could not start {binary}");
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A builder on redis-rs, chosen by name (in every build: a build without fred has no
/// default backend).
fn on_redis_rs(server: &Server) -> LockClientBuilder {
    LockClient::builder()
        .url(server.url())
        .backend(Backend::RedisRs)
}

async fn bounded(body: impl std::future::Future<Output = ()>) {
    tokio::time::timeout(Duration::from_secs(60), body)
        .await
        .expect("the test finished within 60 s");
}

/// Mutual exclusion, a waiter woken by the release's message, reentrancy, a script run while
/// held and a semaphore: the engine on redis-rs, with the crate's own vocabulary of calls when
/// fred is not built.
#[tokio::test]
async fn locks_exclude_and_wake_on_redis_rs() {
    bounded(async {
        let server = Server::start();
        let one = on_redis_rs(&server).build().await.unwrap();
        let two = on_redis_rs(&server).build().await.unwrap();
        assert!(one.stats().connected, "connected once built");

        let held = one.lock("order-7").lock().await.unwrap();
        let again = one.lock("order-7").lock().await.unwrap();
        assert_eq!(
            one.lock("order-7").hold_count().await.unwrap(),
            2,
            "reentrant"
        );
        again.unlock().await.unwrap();
        let other = two.lock("order-7");
        assert!(
            other.try_lock_now().await.unwrap().is_none(),
            "another client must not get a held lock"
        );
        let written: i64 = held
            .eval_while_held(
                "return redis.call('incrby', KEYS[1], ARGV[1])",
                ["{order-7}:paid"],
                [5_i64],
            )
            .await
            .unwrap();
        assert_eq!(written, 5, "a script runs while the hold stands");
        let waiter = tokio::spawn(async move {
            let guard = other
                .try_lock(Duration::from_secs(10), None)
                .await
                .unwrap()
                .expect("the waiter gets the lock");
            (guard, Instant::now())
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        let released = Instant::now();
        held.unlock().await.unwrap();
        let (guard, got) = waiter.await.unwrap();
        assert!(
            got.duration_since(released) < Duration::from_secs(1),
            "woken by the release's message, not by a poll ({:?})",
            got.duration_since(released)
        );
        guard.unlock().await.unwrap();
        assert!(!one.lock("order-7").is_locked().await.unwrap(), "released");

        let permits = one.semaphore("exports");
        assert!(permits.try_set_permits(2).await.unwrap());
        let first = permits.acquire(2).await.unwrap();
        assert!(two
            .semaphore("exports")
            .try_acquire_now(1)
            .await
            .unwrap()
            .is_none());
        first.release().await.unwrap();
        assert_eq!(
            two.semaphore("exports").available_permits().await.unwrap(),
            2
        );
        one.shutdown().await;
        two.shutdown().await;
    })
    .await;
}

/// What a build without fred cannot serve is refused by name before anything is sent: fred
/// itself, a builder that names no backend (fred's default, which a build without fred does not
/// have: were redis-rs the default here, the same code would move to fred when another crate in
/// the build turned fred on), and a malformed URL.
#[cfg(not(feature = "fred"))]
#[tokio::test]
async fn a_build_without_fred_refuses_what_needs_it() {
    let error = "fred".parse::<Backend>().unwrap_err().to_string();
    assert!(error.contains("without feature fred"), "{error}");
    for unnamed in [
        LockClient::builder()
            .url("redis://127.0.0.1:1")
            .build()
            .await,
        LockClient::connect("redis://127.0.0.1:1").await,
    ] {
        let Err(error) = unnamed else {
            panic!("a builder without a backend was built without fred");
        };
        assert!(
            matches!(error, fredlock::Error::InvalidArgument(_)),
            "{error}"
        );
        let error = error.to_string();
        assert!(
            error.contains("no backend named") && error.contains("Backend::RedisRs"),
            "{error}"
        );
    }
    let error = LockClient::builder()
        .backend(Backend::RedisRs)
        .url("redis://127.0.0.1:port")
        .build()
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains("malformed"), "{error}");
}

/// Three masters made a cluster with `redis-cli --cluster create`; killed when dropped.
struct Cluster {
    nodes: Vec<Server>,
}

impl Cluster {
    fn start() -> Cluster {
        let nodes: Vec<Server> = (0..3).map(|_| Server::start_cluster_node()).collect();
        let addresses: Vec<String> = nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port))
            .collect();
        let status = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("run redis-cli --cluster create");
        assert!(status.success(), "redis-cli --cluster create failed");
        let deadline = Instant::now() + Duration::from_secs(20);
        let ok = |port: u16| {
            Command::new("redis-cli")
                .args(["-p", &port.to_string(), "cluster", "info"])
                .output()
                .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).contains("cluster_state:ok"))
        };
        while !nodes.iter().all(|node| ok(node.port)) {
            assert!(
                Instant::now() < deadline,
                "the cluster did not become ready"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Cluster { nodes }
    }

    fn url(&self) -> String {
        format!("redis-cluster://127.0.0.1:{}", self.nodes[0].port)
    }
}

/// A cluster on redis-rs, in a build without fred: the other masters found from one node,
/// every name's lock on its slot's master, two clients excluding each other, and a waiter woken
/// by the release (sharded pub/sub on the slot's master) within 1 s, on names spread over the
/// three masters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_works_on_redis_rs() {
    bounded(async {
        let cluster = Cluster::start();
        let client = || async {
            LockClient::builder()
                .backend(Backend::RedisRs)
                .url(cluster.url())
                .build()
                .await
                .expect("a client on the cluster")
        };
        let (one, two) = (client().await, client().await);
        let nodes = one
            .check_deployment()
            .await
            .expect("the deployment")
            .nodes
            .len();
        assert_eq!(nodes, 3, "every master is found from one node");
        for i in 0..12 {
            let name = format!("orders:{i}");
            let held = one.lock(name.as_str()).lock().await.unwrap();
            assert!(two
                .lock(name.as_str())
                .try_lock(Duration::ZERO, None)
                .await
                .unwrap()
                .is_none());
            let waiter = {
                let lock = two.lock(name.as_str());
                tokio::spawn(async move {
                    let guard = lock.lock().await.unwrap();
                    (guard, Instant::now())
                })
            };
            tokio::time::sleep(Duration::from_millis(200)).await;
            let released = Instant::now();
            held.unlock().await.unwrap();
            let (guard, woke) = waiter.await.unwrap();
            let after = woke.saturating_duration_since(released);
            assert!(
                after < Duration::from_secs(1),
                "{name}: woken after {after:?}"
            );
            guard.unlock().await.unwrap();
        }
        assert!(one.list("orders:*").await.unwrap().is_empty());
        one.shutdown().await;
        two.shutdown().await;
    })
    .await;
}

//! Test harness: throw-away `redis-server` processes on free loopback ports.
//!
//! Every server runs in its own temporary directory with persistence off, is killed when its
//! handle drops, and can be killed and started again on the same port.

#![allow(dead_code)]

use std::future::Future;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fred::prelude::*;

/// Upper bound for any single test.
pub const TEST_LIMIT: Duration = Duration::from_secs(90);

/// Runs a test body with a time limit, so a hang fails instead of blocking the suite.
pub async fn bounded<F: Future<Output = ()>>(body: F) {
    if tokio::time::timeout(TEST_LIMIT, body).await.is_err() {
        panic!("test exceeded {TEST_LIMIT:?}");
    }
}

/// A `redis-server` child process on 127.0.0.1.
pub struct RedisServer {
    port: u16,
    dir: PathBuf,
    extra: Vec<String>,
    /// A config file given first on the command line (a sentinel's, which it rewrites).
    config_file: Option<PathBuf>,
    child: Option<Child>,
}

impl RedisServer {
    /// Starts a server on a free port and waits until it answers PING.
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[], free_port)
    }

    /// Starts a server with extra arguments, on a port chosen by `pick_port`.
    pub fn start_with(extra: &[&str], pick_port: fn() -> u16) -> RedisServer {
        RedisServer::start_in(extra, pick_port, None)
    }

    fn start_in(extra: &[&str], pick_port: fn() -> u16, config: Option<&str>) -> RedisServer {
        let dir = std::env::temp_dir().join(format!(
            "fredlock-test-{}-{}",
            std::process::id(),
            NEXT_DIR.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("create server directory");
        let config_file = config.map(|text| {
            let path = dir.join("server.conf");
            std::fs::write(&path, text).expect("write the server's config file");
            path
        });
        // Another process may take the port between our probe and the server's bind: retry.
        for _ in 0..10 {
            let port = pick_port();
            let mut server = RedisServer {
                port,
                dir: dir.clone(),
                extra: extra.iter().map(|arg| arg.to_string()).collect(),
                config_file: config_file.clone(),
                child: None,
            };
            if server.spawn() {
                return server;
            }
        }
        panic!("could not start redis-server (is it on PATH?)");
    }

    /// The loopback port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The `redis://` URL of this server.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the server (SIGKILL): no clean shutdown, no goodbye to clients.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port, empty.
    pub fn start_again(&mut self) {
        self.kill();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.spawn() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("could not restart redis-server on port {}", self.port);
    }

    fn spawn(&mut self) -> bool {
        let mut command = Command::new("redis-server");
        if let Some(file) = &self.config_file {
            command.arg(file);
        }
        let child = command
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let Ok(mut child) = child else {
            return false;
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return false; // exited: most likely the port was taken
            }
            if ping(self.port) {
                self.child = Some(child);
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        false
    }

    /// A plain fred client on this server, for checking what fredlock wrote.
    pub async fn raw(&self) -> Client {
        raw_client(&self.url()).await
    }

    /// A fredlock client with the given fair-lock wait timeout (and the default watchdog).
    pub async fn fair_client(&self, fair_wait: Duration) -> fredlock::LockClient {
        fredlock::LockClient::builder()
            .url(self.url())
            .fair_wait_timeout(fair_wait)
            .build()
            .await
            .unwrap()
    }

    /// A fredlock client with the given watchdog timeout.
    pub async fn lock_client(&self, watchdog: Duration) -> fredlock::LockClient {
        lock_client_at(&self.url(), watchdog).await
    }
}

/// A fredlock client on `url` (any deployment) with the given watchdog timeout.
pub async fn lock_client_at(url: &str, watchdog: Duration) -> fredlock::LockClient {
    fredlock::LockClient::builder()
        .url(url)
        .watchdog_timeout(watchdog)
        .build()
        .await
        .unwrap()
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Three masters of a Redis cluster on loopback, slots spread over them, no replicas.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start() -> RedisCluster {
        RedisCluster::start_with_replicas(0)
    }

    /// Three masters, each with `replicas` replicas.
    pub fn start_with_replicas(replicas: usize) -> RedisCluster {
        let nodes: Vec<RedisServer> = (0..3 * (1 + replicas))
            .map(|_| {
                RedisServer::start_with(
                    &["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"],
                    free_cluster_port,
                )
            })
            .collect();
        let addresses: Vec<String> = nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port))
            .collect();
        let status = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("run redis-cli --cluster create");
        assert!(status.success(), "redis-cli --cluster create failed");
        let deadline = Instant::now() + Duration::from_secs(20);
        // Replicas are assigned after the slots: wait until every node sees them all, synced.
        let replicas_seen = |port: u16| {
            redis_cli(port, &["cluster", "nodes"])
                .lines()
                .filter(|line| {
                    line.split(' ')
                        .nth(2)
                        .is_some_and(|flags| flags.contains("slave"))
                })
                .count()
                == 3 * replicas
        };
        let replica_synced = |port: u16| {
            let info = redis_cli(port, &["info", "replication"]);
            !info.contains("role:slave") || info.contains("master_link_status:up")
        };
        while !nodes.iter().all(|node| {
            cluster_ok(node.port) && replicas_seen(node.port) && replica_synced(node.port)
        }) {
            assert!(Instant::now() < deadline, "cluster did not become ready");
            std::thread::sleep(Duration::from_millis(100));
        }
        RedisCluster { nodes }
    }

    /// The `redis-cluster://` URL of the first node; fred discovers the rest.
    pub fn url(&self) -> String {
        format!("redis-cluster://127.0.0.1:{}", self.nodes[0].port)
    }

    /// The port of the master that owns `key`'s slot, as the first node's `CLUSTER NODES` says.
    pub fn master_of(&self, key: &str) -> u16 {
        let slot = fred::util::redis_keyslot(key.as_bytes());
        let nodes = redis_cli(self.nodes[0].port, &["cluster", "nodes"]);
        for line in nodes.lines() {
            let fields: Vec<&str> = line.split(' ').collect();
            if fields.len() < 9 || !fields[2].contains("master") {
                continue;
            }
            let owns = fields[8..].iter().any(|range| {
                let mut bounds = range
                    .split('-')
                    .filter_map(|bound| bound.parse::<u16>().ok());
                match (bounds.next(), bounds.next()) {
                    (Some(start), Some(end)) => (start..=end).contains(&slot),
                    (Some(only), None) => only == slot,
                    _ => false,
                }
            });
            if owns {
                if let Some(port) = fields[1]
                    .split(['@', ':'])
                    .nth(1)
                    .and_then(|p| p.parse().ok())
                {
                    return port;
                }
            }
        }
        panic!("no master owns slot {slot}: {nodes}");
    }

    /// The node id of the server on `port`.
    pub fn node_id(&self, port: u16) -> String {
        redis_cli(port, &["cluster", "myid"]).trim().to_string()
    }

    /// Ports of the replicas of the master on `port`.
    pub fn replicas_of(&self, port: u16) -> Vec<u16> {
        let id = self.node_id(port);
        redis_cli(port, &["cluster", "nodes"])
            .lines()
            .filter(|line| line.contains("slave") && line.contains(&id))
            .filter_map(|line| {
                let address = line.split(' ').nth(1)?;
                address.split(['@', ':']).nth(1)?.parse().ok()
            })
            .collect()
    }

    /// Waits until every node agrees on the slots and says `cluster_state:ok`.
    pub fn await_ok(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        while !self.nodes.iter().all(|node| cluster_ok(node.port)) {
            assert!(Instant::now() < deadline, "cluster not ok within {limit:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A plain fred cluster client.
    pub async fn raw(&self) -> Client {
        raw_client(&self.url()).await
    }
}

impl RedisServer {
    /// A replica of `master`, returned once it has synced and streams writes (a first `WAIT`
    /// for one replica on the master returns 1).
    pub async fn start_replica_of(master: &RedisServer) -> RedisServer {
        RedisServer::start_replica_through(master, master.port).await
    }

    /// A replica of `master` that reaches it at `port` (a proxy in front of it), returned once
    /// it streams writes.
    pub async fn start_replica_through(master: &RedisServer, port: u16) -> RedisServer {
        let master_port = port.to_string();
        let replica =
            RedisServer::start_with(&["--replicaof", "127.0.0.1", &master_port], free_port);
        let raw = master.raw().await;
        let deadline = Instant::now() + Duration::from_secs(20);
        // Streaming when a write made now is acknowledged by every replica of the master, this
        // one included (a WAIT for one replica could be answered by an older one).
        loop {
            let linked =
                redis_cli(replica.port, &["info", "replication"]).contains("master_link_status:up");
            if linked {
                let replicas: i64 = redis_cli(master.port, &["info", "replication"])
                    .lines()
                    .find_map(|line| line.trim().strip_prefix("connected_slaves:")?.parse().ok())
                    .unwrap_or(0);
                let _: () = raw
                    .set("replica-probe", 1, None, None, false)
                    .await
                    .unwrap();
                let acked: i64 = raw
                    .custom(fred::cmd!("WAIT"), vec![replicas, 500])
                    .await
                    .unwrap();
                if replicas > 0 && acked == replicas {
                    break;
                }
            }
            assert!(Instant::now() < deadline, "the replica did not sync");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _: i64 = raw.del("replica-probe").await.unwrap();
        let _ = raw.quit().await;
        replica
    }

    /// Makes this replica a master (`REPLICAOF NO ONE`), as a failover would.
    pub fn promote(&self) {
        let reply = redis_cli(self.port, &["replicaof", "no", "one"]);
        assert!(reply.starts_with("OK"), "REPLICAOF NO ONE: {reply}");
    }
}

/// The service name the test sentinels monitor.
pub const SENTINEL_SERVICE: &str = "fredlock-test";

/// A master with replicas and three sentinels watching it, all on loopback, from the same
/// `redis-server` binary. The sentinels agree on a failure with a quorum of 2 after 1 s of
/// silence, so a killed master is replaced within a few seconds.
pub struct RedisSentinel {
    /// Every data server, the first master first; which one is master changes on failover.
    pub servers: Vec<RedisServer>,
    pub sentinels: Vec<RedisServer>,
    /// The data servers' `requirepass`, if any.
    pub server_password: Option<String>,
    /// The sentinels' `requirepass`, if any.
    pub sentinel_password: Option<String>,
}

impl RedisSentinel {
    /// Starts a master, `replicas` replicas of it and three sentinels, and waits until every
    /// sentinel knows every replica and the other two sentinels (what a failover needs).
    pub fn start(replicas: usize) -> RedisSentinel {
        RedisSentinel::start_with_passwords(replicas, None, None)
    }

    /// As [`start`](Self::start), with the data servers and the sentinels each protected by
    /// a password of their own (`requirepass`; the replicas and sentinels are given theirs).
    pub fn start_with_passwords(
        replicas: usize,
        server_password: Option<&str>,
        sentinel_password: Option<&str>,
    ) -> RedisSentinel {
        let mut server_args: Vec<&str> = Vec::new();
        if let Some(password) = server_password {
            server_args.extend(["--requirepass", password, "--masterauth", password]);
        }
        let master = RedisServer::start_with(&server_args, free_port);
        let master_port = master.port.to_string();
        let mut replica_args = server_args.clone();
        replica_args.extend(["--replicaof", "127.0.0.1", &master_port]);
        let mut servers = vec![master];
        for _ in 0..replicas {
            servers.push(RedisServer::start_with(&replica_args, free_port));
        }
        let data_cli = |port: u16, args: &[&str]| redis_cli_auth(port, server_password, args);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !servers[1..].iter().all(|replica| {
            data_cli(replica.port, &["info", "replication"]).contains("master_link_status:up")
        }) {
            assert!(Instant::now() < deadline, "replicas did not sync");
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut config = format!(
            "sentinel monitor {SENTINEL_SERVICE} 127.0.0.1 {} 2\n\
             sentinel down-after-milliseconds {SENTINEL_SERVICE} 1000\n\
             sentinel failover-timeout {SENTINEL_SERVICE} 10000\n\
             sentinel parallel-syncs {SENTINEL_SERVICE} {replicas}\n",
            servers[0].port
        );
        if let Some(password) = server_password {
            config.push_str(&format!(
                "sentinel auth-pass {SENTINEL_SERVICE} {password}\n"
            ));
        }
        if let Some(password) = sentinel_password {
            config.push_str(&format!(
                "requirepass {password}\nsentinel sentinel-pass {password}\n"
            ));
        }
        let sentinels: Vec<RedisServer> = (0..3)
            .map(|_| RedisServer::start_in(&["--sentinel"], free_port, Some(&config)))
            .collect();
        let setup = RedisSentinel {
            servers,
            sentinels,
            server_password: server_password.map(str::to_string),
            sentinel_password: sentinel_password.map(str::to_string),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !setup.sentinels.iter().all(|sentinel| {
            let master = setup.sentinel_master_info(sentinel.port);
            master.get("num-slaves").map(String::as_str) == Some(&*replicas.to_string())
                && master.get("num-other-sentinels").map(String::as_str) == Some("2")
        }) {
            assert!(
                Instant::now() < deadline,
                "sentinels did not find each other"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        setup
    }

    /// `redis-cli` on a data server, with its password.
    pub fn data_cli(&self, port: u16, args: &[&str]) -> String {
        redis_cli_auth(port, self.server_password.as_deref(), args)
    }

    /// `redis-cli` on a sentinel, with its password.
    pub fn sentinel_cli(&self, port: u16, args: &[&str]) -> String {
        redis_cli_auth(port, self.sentinel_password.as_deref(), args)
    }

    /// `SENTINEL MASTER <service>` of the sentinel on `port`, as field -> value.
    fn sentinel_master_info(&self, port: u16) -> std::collections::HashMap<String, String> {
        let reply = self.sentinel_cli(port, &["sentinel", "master", SENTINEL_SERVICE]);
        let lines: Vec<&str> = reply.lines().collect();
        lines
            .chunks(2)
            .filter(|pair| pair.len() == 2)
            .map(|pair| (pair[0].to_string(), pair[1].to_string()))
            .collect()
    }

    /// `redis-sentinel://` with every sentinel and the service name (and the passwords).
    pub fn url(&self) -> String {
        let credentials = self
            .server_password
            .as_ref()
            .map(|password| format!(":{password}@"))
            .unwrap_or_default();
        let mut url = format!(
            "redis-sentinel://{credentials}127.0.0.1:{}?sentinelServiceName={SENTINEL_SERVICE}",
            self.sentinels[0].port
        );
        if let Some(password) = &self.sentinel_password {
            url.push_str(&format!("&sentinelPassword={password}"));
        }
        for sentinel in &self.sentinels[1..] {
            url.push_str(&format!("&node=127.0.0.1:{}", sentinel.port));
        }
        url
    }

    /// The port of the master, as the first sentinel that answers names it.
    pub fn master_port(&self) -> u16 {
        self.sentinels
            .iter()
            .find_map(|sentinel| {
                let reply = self.sentinel_cli(
                    sentinel.port,
                    &["sentinel", "get-master-addr-by-name", SENTINEL_SERVICE],
                );
                reply.lines().nth(1)?.trim().parse().ok()
            })
            .expect("a sentinel names the master")
    }

    /// The data server on `port`.
    pub fn server(&mut self, port: u16) -> &mut RedisServer {
        self.servers
            .iter_mut()
            .find(|server| server.port == port)
            .expect("a data server on that port")
    }

    /// A plain fred client on the data server on `port`.
    pub async fn raw(&self, port: u16) -> Client {
        let credentials = self
            .server_password
            .as_ref()
            .map(|password| format!(":{password}@"))
            .unwrap_or_default();
        resilient_client(&format!("redis://{credentials}127.0.0.1:{port}")).await
    }

    /// Waits until every sentinel names a master other than `old` and that server says it is
    /// the master; returns its port.
    pub fn await_new_master(&self, old: u16, limit: Duration) -> u16 {
        let deadline = Instant::now() + limit;
        loop {
            let named: Vec<Option<u16>> = self
                .sentinels
                .iter()
                .map(|sentinel| {
                    let reply = self.sentinel_cli(
                        sentinel.port,
                        &["sentinel", "get-master-addr-by-name", SENTINEL_SERVICE],
                    );
                    reply.lines().nth(1)?.trim().parse().ok()
                })
                .collect();
            if let Some(Some(new)) = named.first() {
                if *new != old
                    && named.iter().all(|port| *port == Some(*new))
                    && self.data_cli(*new, &["role"]).starts_with("master")
                {
                    return *new;
                }
            }
            assert!(
                Instant::now() < deadline,
                "no new master within {limit:?}: {named:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `SENTINEL FAILOVER`: promotes a replica without the master failing; returns the new
    /// master's port.
    pub fn failover(&self) -> u16 {
        let old = self.master_port();
        let reply = self.sentinel_cli(
            self.sentinels[0].port,
            &["sentinel", "failover", SENTINEL_SERVICE],
        );
        assert!(reply.starts_with("OK"), "SENTINEL FAILOVER: {reply}");
        self.await_new_master(old, Duration::from_secs(20))
    }
}

/// What `redis-cli -p port args..` prints (empty when it could not run).
pub fn redis_cli(port: u16, args: &[&str]) -> String {
    redis_cli_auth(port, None, args)
}

/// What `redis-cli -p port args..` prints, authenticated with `password` if one is given.
pub fn redis_cli_auth(port: u16, password: Option<&str>, args: &[&str]) -> String {
    let mut command = Command::new("redis-cli");
    if let Some(password) = password {
        command.env("REDISCLI_AUTH", password);
    }
    command
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stderr(Stdio::null())
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
        .unwrap_or_default()
}

/// A connection of its own subscribed to `channel` on the server at `url`, with the receiver of
/// what it hears: for tests that check what an unlock publishes.
pub async fn listen(
    url: &str,
    channel: &str,
) -> (
    fred::clients::SubscriberClient,
    tokio::sync::broadcast::Receiver<fred::types::Message>,
) {
    let subscriber = Builder::from_config(Config::from_url(url).unwrap())
        .build_subscriber_client()
        .unwrap();
    subscriber.init().await.unwrap();
    let messages = subscriber.message_rx();
    subscriber.subscribe(channel).await.unwrap();
    (subscriber, messages)
}

/// The messages `messages` receives within `window`, as text, in order.
pub async fn heard(
    messages: &mut tokio::sync::broadcast::Receiver<fred::types::Message>,
    window: Duration,
) -> Vec<String> {
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + window;
    while let Ok(Ok(message)) = tokio::time::timeout_at(deadline, messages.recv()).await {
        seen.push(message.value.as_string().unwrap_or_default());
    }
    seen
}

/// A plain fred client (standalone or cluster, by URL scheme), for checking what fredlock wrote.
pub async fn raw_client(url: &str) -> Client {
    let client = Builder::from_config(Config::from_url(url).unwrap())
        .build()
        .unwrap();
    client.init().await.unwrap();
    client
}

/// A free port whose cluster bus port (port + 10000) is free too.
fn free_cluster_port() -> u16 {
    loop {
        let port = free_port();
        if port < 55_000
            && TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port + 10_000)).is_ok()
        {
            return port;
        }
    }
}

fn cluster_ok(port: u16) -> bool {
    Command::new("redis-cli")
        .args(["-p", &port.to_string(), "cluster", "info"])
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).contains("cluster_state:ok"))
        .unwrap_or(false)
}

static NEXT_DIR: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A free loopback port, as the OS hands one out.
pub fn free_port() -> u16 {
    TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("find a free port")
}

fn ping(port: u16) -> bool {
    let addr = SocketAddrV4::new(Ipv4Addr::LOCALHOST, port);
    let Ok(mut stream) = TcpStream::connect_timeout(&addr.into(), Duration::from_millis(200))
    else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    // A server with a password answers, too: it is up.
    let mut reply = [0u8; 7];
    stream.read_exact(&mut reply).is_ok() && (&reply == b"+PONG\r\n" || &reply == b"-NOAUTH")
}

/// Polls `check` every 20 ms until it holds or `limit` passes; returns whether it held.
pub async fn eventually<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs `test`, an `#[ignore]`d test of the calling test binary, as a child process with `env`
/// set and its output discarded: for tests that need a process to kill.
pub fn spawn_test_child(test: &str, env: &[(&str, String)]) -> Child {
    Command::new(std::env::current_exe().expect("test binary"))
        .args(["--ignored", "--exact", test, "--nocapture"])
        .envs(env.iter().map(|(name, value)| (name, value)))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the test binary as a child")
}

/// Kills a child with SIGKILL (no chance to clean up) and reaps it.
pub fn sigkill(mut child: Child) {
    child.kill().expect("SIGKILL the child");
    child.wait().expect("reap the child");
}

/// A fair lock's queue key, as Redisson names it (the library's own naming is private).
pub fn queue_key(name: &str) -> String {
    format!("redisson_lock_queue:{{{name}}}")
}

/// A fair lock's timeout zset key.
pub fn timeout_key(name: &str) -> String {
    format!("redisson_lock_timeout:{{{name}}}")
}

/// The composed text of a fredlock script, exactly as the crate sends it.
pub fn script(name: &str) -> &'static str {
    fredlock::script_source(name).unwrap_or_else(|| panic!("no script named {name}"))
}

/// The lock kinds that share `Lock`'s behaviour, for tests run once per kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Reentrant,
    Fair,
    /// The fenced lock, through the `Lock` it lends: the reentrant lock with its own acquire
    /// script.
    Fenced,
}

impl Kind {
    /// The lock of this kind named `name`.
    pub fn lock(self, client: &fredlock::LockClient, name: &str) -> fredlock::Lock {
        match self {
            Kind::Reentrant => client.lock(name),
            Kind::Fair => client.fair_lock(name).into(),
            Kind::Fenced => client.fenced_lock(name).as_lock().clone(),
        }
    }

    /// Runs this kind's release script for `field` directly, as a foreign client would, asking
    /// to leave it no holds.
    pub async fn raw_release(self, raw: &Client, name: &str, field: &str) -> Option<i64> {
        let channel = format!("redisson_lock__channel:{{{name}}}");
        let fences = format!("fredlock_fences:{{{name}}}");
        match self {
            Kind::Reentrant | Kind::Fenced => raw
                .eval(
                    script("lock_release"),
                    vec![name.to_string(), channel, fences],
                    vec![
                        "0".to_string(),
                        "30000".to_string(),
                        field.to_string(),
                        "0".to_string(),
                        "1".to_string(),
                    ],
                )
                .await
                .unwrap(),
            Kind::Fair => raw
                .eval(
                    script("fair_release"),
                    vec![name.to_string(), queue_key(name), timeout_key(name), fences],
                    vec![
                        channel,
                        "0".to_string(),
                        "30000".to_string(),
                        field.to_string(),
                        "0".to_string(),
                        "1".to_string(),
                    ],
                )
                .await
                .unwrap(),
        }
    }
}

/// Runs `async fn $test(kind: Kind)` as one test per lock kind: `$test::reentrant`,
/// `$test::fair` and `$test::fenced`.
#[macro_export]
macro_rules! for_each_kind {
    ($($test:ident),* $(,)?) => {$(
        mod $test {
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn reentrant() {
                $crate::common::bounded(super::$test($crate::common::Kind::Reentrant)).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn fair() {
                $crate::common::bounded(super::$test($crate::common::Kind::Fair)).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn fenced() {
                $crate::common::bounded(super::$test($crate::common::Kind::Fenced)).await
            }
        }
    )*};
}

/// A TCP proxy on loopback in front of one server: it forwards both ways until
/// [`stall`](Self::stall) is called, then accepts and reads but never answers (what it holds is
/// delivered if [`resume`](Self::resume) is called, and lost on a [`cut`](Self::cut)). A node
/// that hangs without closing its connections, which a client notices only by timing out.
///
/// It can also [`cut`](Self::cut): close every connection and refuse new ones (accepted and
/// closed at once) until [`heal`](Self::heal), as a network that drops the server would.
pub struct StallingProxy {
    port: u16,
    stalled: std::sync::Arc<std::sync::atomic::AtomicBool>,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
    lose_reply: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Added to every chunk either way, in ms.
    latency: std::sync::Arc<std::sync::atomic::AtomicU64>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl StallingProxy {
    /// Starts forwarding a free loopback port to `target_port` on loopback.
    pub fn start(target_port: u16) -> StallingProxy {
        use std::sync::atomic::AtomicBool;
        use std::sync::Arc;
        let listener =
            TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)).expect("bind the proxy");
        listener.set_nonblocking(true).expect("non-blocking accept");
        let port = listener.local_addr().expect("proxy address").port();
        let stalled = Arc::new(AtomicBool::new(false));
        let cut = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let lose_reply = Arc::new(AtomicBool::new(false));
        let latency = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (flags, cutting, done) = (stalled.clone(), cut.clone(), stop.clone());
        let losing = lose_reply.clone();
        let delay = latency.clone();
        std::thread::spawn(move || {
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                match listener.accept() {
                    Ok((client, _)) if cutting.load(std::sync::atomic::Ordering::SeqCst) => {
                        drop(client);
                    }
                    Ok((client, _)) => {
                        let Ok(server) =
                            TcpStream::connect(SocketAddrV4::new(Ipv4Addr::LOCALHOST, target_port))
                        else {
                            continue;
                        };
                        let _ = client.set_nonblocking(false);
                        for (from, to, replies) in [
                            (client.try_clone(), server.try_clone(), None),
                            (server.try_clone(), client.try_clone(), Some(losing.clone())),
                        ] {
                            if let (Ok(from), Ok(to)) = (from, to) {
                                let (flags, cutting, done, delay) =
                                    (flags.clone(), cutting.clone(), done.clone(), delay.clone());
                                std::thread::spawn(move || {
                                    let faults = Faults {
                                        stalled: &flags,
                                        cut: &cutting,
                                        stop: &done,
                                        lose_reply: replies.as_deref(),
                                        latency: &delay,
                                    };
                                    pump(from, to, faults)
                                });
                            }
                        }
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        StallingProxy {
            port,
            stalled,
            cut,
            lose_reply,
            latency,
            stop,
        }
    }

    /// The `redis://` URL clients should use.
    /// The loopback port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// From now on, nothing is forwarded either way; connections stay open.
    pub fn stall(&self) {
        self.stalled
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Forwards again, including what was held.
    pub fn resume(&self) {
        self.stalled
            .store(false, std::sync::atomic::Ordering::SeqCst);
    }

    /// Closes every connection now and refuses new ones until [`heal`](Self::heal).
    pub fn cut(&self) {
        self.cut.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Accepts and forwards new connections again.
    pub fn heal(&self) {
        self.cut.store(false, std::sync::atomic::Ordering::SeqCst);
    }

    /// The next reply the server sends is thrown away and its connection closed: the request
    /// ran, its client never learns how. Requests sent meanwhile are forwarded as usual.
    pub fn lose_next_reply(&self) {
        self.lose_reply
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Holds every chunk, either way, `latency` before forwarding it (zero: none).
    pub fn set_latency(&self, latency: Duration) {
        self.latency.store(
            latency.as_millis() as u64,
            std::sync::atomic::Ordering::SeqCst,
        );
    }

    /// Whether a reply armed by [`lose_next_reply`](Self::lose_next_reply) is still to come.
    pub fn reply_pending_loss(&self) -> bool {
        self.lose_reply.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for StallingProxy {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// What a proxy's pump applies to the bytes it copies.
struct Faults<'a> {
    stalled: &'a std::sync::atomic::AtomicBool,
    cut: &'a std::sync::atomic::AtomicBool,
    stop: &'a std::sync::atomic::AtomicBool,
    /// On the reply side only: when set, the next chunk is thrown away and the connection closed.
    lose_reply: Option<&'a std::sync::atomic::AtomicBool>,
    latency: &'a std::sync::atomic::AtomicU64,
}

/// Copies `from` to `to`, holding each chunk while stalled and for the latency, until either
/// side closes, the proxy is cut, or stopped; on the reply side a lost reply closes both.
fn pump(mut from: TcpStream, mut to: TcpStream, faults: Faults<'_>) {
    use std::sync::atomic::Ordering;
    let _ = from.set_read_timeout(Some(Duration::from_millis(20)));
    let mut buffer = [0u8; 16 * 1024];
    while !faults.stop.load(Ordering::Relaxed) && !faults.cut.load(Ordering::SeqCst) {
        let read = match from.read(&mut buffer) {
            Ok(0) => break,
            Ok(read) => read,
            Err(error)
                if matches!(
                    error.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            Err(_) => break,
        };
        let latency = faults.latency.load(Ordering::SeqCst);
        if latency > 0 {
            std::thread::sleep(Duration::from_millis(latency));
        }
        while faults.stalled.load(Ordering::SeqCst) && !faults.stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(5));
        }
        // A cut drops what a stall held, as a network that went down loses what was in flight.
        if faults.cut.load(Ordering::SeqCst) || faults.stop.load(Ordering::Relaxed) {
            break;
        }
        if faults
            .lose_reply
            .is_some_and(|lose| lose.swap(false, Ordering::SeqCst))
        {
            break;
        }
        if to.write_all(&buffer[..read]).is_err() {
            break;
        }
    }
    let _ = from.shutdown(std::net::Shutdown::Both);
    let _ = to.shutdown(std::net::Shutdown::Both);
}

/// One fredlock client per URL, each with the default settings: the nodes of a Redlock.
pub async fn clients(urls: &[String]) -> Vec<fredlock::LockClient> {
    let mut clients = Vec::new();
    for url in urls {
        clients.push(fredlock::LockClient::connect(url).await.unwrap());
    }
    clients
}

/// Whether the client has nothing left: no holds, waits, subscriptions or unsettled calls.
pub fn idle(client: &fredlock::LockClient) -> bool {
    let stats = client.stats();
    stats.held == 0 && stats.wait_entries == 0 && stats.subscriptions == 0 && stats.unsettled == 0
}

/// The URLs of `servers`.
pub fn urls(servers: &[RedisServer]) -> Vec<String> {
    servers.iter().map(RedisServer::url).collect()
}

/// `count` servers, each an independent master.
pub fn start_servers(count: usize) -> Vec<RedisServer> {
    (0..count).map(|_| RedisServer::start()).collect()
}

/// Parses `INFO commandstats` into (command, calls).
pub async fn command_calls(raw: &Client) -> std::collections::HashMap<String, u64> {
    let info: String = raw
        .info(Some(fred::types::InfoKind::CommandStats))
        .await
        .unwrap();
    info.lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            Some((name.to_string(), calls))
        })
        .collect()
}

impl RedisServer {
    /// A server that accepts `DEBUG` (Redis 7 refuses it by default), for `DEBUG SLEEP`.
    pub fn start_with_debug() -> RedisServer {
        RedisServer::start_with(&["--enable-debug-command", "yes"], free_port)
    }

    /// The server's process id, for SIGSTOP and SIGCONT.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("server running").id()
    }
}

/// A plain fred client that survives `CLIENT KILL`: it reconnects, and no command waits longer
/// than a second.
pub async fn resilient_client(url: &str) -> Client {
    let client = Builder::from_config(Config::from_url(url).unwrap())
        .with_performance_config(|performance| {
            performance.default_command_timeout = Duration::from_secs(1);
        })
        .set_policy(ReconnectPolicy::new_constant(0, 50))
        .build()
        .unwrap();
    client.init().await.unwrap();
    client
}

/// Every key on the server, sorted.
pub async fn all_keys(raw: &Client) -> Vec<String> {
    let mut keys: Vec<String> = raw.custom(fred::cmd!("KEYS"), vec!["*"]).await.unwrap();
    keys.sort();
    keys
}

/// Blocks the server for `seconds` (`DEBUG SLEEP`), from `raw`'s connection.
pub async fn debug_sleep(raw: &Client, seconds: f64) {
    let _: Value = raw
        .custom(
            fred::cmd!("DEBUG"),
            vec!["SLEEP".to_string(), seconds.to_string()],
        )
        .await
        .unwrap();
}

/// `CLIENT KILL TYPE kind` (`normal` or `pubsub`): every such connection but `raw`'s own.
pub async fn client_kill(raw: &Client, kind: &str) -> Result<i64, fred::error::Error> {
    raw.custom(
        fred::cmd!("CLIENT"),
        vec!["KILL".to_string(), "TYPE".to_string(), kind.to_string()],
    )
    .await
}

/// The channels the server has subscribers for (`PUBSUB CHANNELS`).
pub async fn pubsub_channels(raw: &Client) -> Vec<String> {
    raw.custom(fred::cmd!("PUBSUB"), vec!["CHANNELS".to_string()])
        .await
        .unwrap()
}

/// Sends `signal` (`STOP`, `CONT`) to process `pid`.
pub fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{signal} {pid}");
}

/// Sends `signal` to `pid`, ignoring failure (the process may be gone).
pub fn signal_quietly(pid: u32, signal: &str) -> bool {
    Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// The server's clock (`TIME`) in milliseconds: one clock for a test and its child processes.
pub async fn server_millis(raw: &Client) -> u64 {
    let time: Vec<String> = raw
        .custom(fred::cmd!("TIME"), Vec::<String>::new())
        .await
        .unwrap();
    time[0].parse::<u64>().unwrap() * 1000 + time[1].parse::<u64>().unwrap() / 1000
}

/// A throw-away PostgreSQL server on a free loopback port: `initdb` into a temporary directory
/// (as the `postgres` user when the tests run as root, which PostgreSQL refuses), `postgres`
/// with fsync off, trust authentication for the `postgres` role. Killed and deleted on drop.
pub struct PostgresServer {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl PostgresServer {
    /// Starts a server and waits until it accepts connections.
    pub fn start() -> PostgresServer {
        let bin = postgres_bin();
        let dir = std::env::temp_dir().join(format!(
            "fredlock-pg-{}-{}",
            std::process::id(),
            NEXT_DIR.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("create the PostgreSQL directory");
        let owner = postgres_owner();
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).expect("chown the directory");
        }
        let data = dir.join("data");
        let mut initdb = Command::new(bin.join("initdb"));
        initdb
            .current_dir(&dir)
            .arg("-D")
            .arg(&data)
            .args(["-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        as_owner(&mut initdb, owner);
        let status = initdb
            .status()
            .expect("run initdb (is PostgreSQL installed?)");
        assert!(status.success(), "initdb failed in {}", data.display());
        let mut server = PostgresServer {
            port: 0,
            dir,
            child: None,
        };
        for _ in 0..10 {
            server.port = free_port();
            let mut postgres = Command::new(bin.join("postgres"));
            postgres
                .current_dir(&server.dir)
                .arg("-D")
                .arg(&data)
                .args(["-p", &server.port.to_string()])
                .args(["-c", "listen_addresses=127.0.0.1"])
                .arg("-c")
                .arg(format!("unix_socket_directories={}", server.dir.display()))
                .args(["-c", "fsync=off", "-c", "full_page_writes=off"])
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            as_owner(&mut postgres, owner);
            let mut child = postgres.spawn().expect("start postgres");
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break; // exited: most likely the port was taken
                }
                if TcpStream::connect((Ipv4Addr::LOCALHOST, server.port)).is_ok() {
                    server.child = Some(child);
                    return server;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("could not start postgres");
    }

    /// A connection to the `postgres` database; its driver task runs until the server goes.
    pub async fn client(&self) -> tokio_postgres::Client {
        let config = format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres connect_timeout=10",
            self.port
        );
        // The server may still be starting up behind its open port.
        for _ in 0..100 {
            if let Ok((client, connection)) =
                tokio_postgres::connect(&config, tokio_postgres::NoTls).await
            {
                tokio::spawn(connection);
                return client;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("could not connect to postgres on port {}", self.port);
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Where PostgreSQL's server programs are: on PATH, else Debian's `/usr/lib/postgresql/<v>/bin`
/// (the newest).
fn postgres_bin() -> PathBuf {
    if let Ok(path) = std::env::var("PATH") {
        for dir in std::env::split_paths(&path) {
            if dir.join("initdb").is_file() && dir.join("postgres").is_file() {
                return dir;
            }
        }
    }
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|entries| {
            entries
                .filter_map(|entry| entry.ok().map(|entry| entry.path().join("bin")))
                .filter(|bin| bin.join("initdb").is_file())
                .collect()
        })
        .unwrap_or_default();
    versions.sort_by_key(|bin| {
        bin.parent()
            .and_then(|version| version.file_name())
            .and_then(|name| name.to_str())
            .and_then(|name| name.parse::<u32>().ok())
            .unwrap_or(0)
    });
    versions.pop().expect(
        "PostgreSQL's initdb is neither on PATH nor in /usr/lib/postgresql (Debian: postgresql)",
    )
}

/// The `postgres` user's uid and gid when the tests run as root (PostgreSQL refuses root).
fn postgres_owner() -> Option<(u32, u32)> {
    let id = |flag: &str| -> Option<u32> {
        let out = Command::new("id").args([flag, "postgres"]).output().ok()?;
        String::from_utf8(out.stdout).ok()?.trim().parse().ok()
    };
    let me = Command::new("id").arg("-u").output().ok()?;
    if String::from_utf8_lossy(&me.stdout).trim() != "0" {
        return None;
    }
    Some((
        id("-u").expect("a postgres user to run PostgreSQL as"),
        id("-g")?,
    ))
}

fn as_owner(command: &mut Command, owner: Option<(u32, u32)>) {
    use std::os::unix::process::CommandExt;
    if let Some((uid, gid)) = owner {
        command.uid(uid).gid(gid);
    }
}

/// Drops 200 acquisitions of `contender` (a lock of another client) at random points, inside
/// the acquire round trip too, while `holder` takes and gives back the same lock in a loop;
/// panics if a hold leaked by a cancelled acquire blocks the holder.
pub async fn cancellation_storm(holder: fredlock::Lock, contender: fredlock::Lock) {
    use rand::Rng;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let holder = {
        let lock = holder;
        let stop = stop.clone();
        tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let guard = lock.lock().await.unwrap();
                let hold = rand::thread_rng().gen_range(0..3000);
                tokio::time::sleep(Duration::from_micros(hold)).await;
                guard.unlock().await.unwrap();
                tokio::task::yield_now().await;
            }
        })
    };
    let mut tasks = Vec::new();
    for i in 0..200 {
        let lock = contender.clone();
        // Timers tick in milliseconds, longer than a round trip on loopback; yields cancel
        // at finer points, inside the acquire script's round trip too.
        let (yields, after) = {
            let mut rng = rand::thread_rng();
            (
                rng.gen_range(0..400),
                Duration::from_micros(rng.gen_range(0..4000)),
            )
        };
        tasks.push(tokio::spawn(async move {
            // Whatever it got before being cancelled is released when the guard drops.
            if i % 2 == 0 {
                tokio::select! {
                    _ = lock.lock() => {}
                    _ = async { for _ in 0..yields { tokio::task::yield_now().await } } => {}
                }
            } else {
                let _ = tokio::time::timeout(after, lock.lock()).await;
            }
        }));
        if i % 10 == 9 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    // A hold leaked by a cancelled acquire would stall the holder for a whole 30 s lease.
    tokio::time::timeout(Duration::from_secs(5), holder)
        .await
        .expect("the holder was not blocked by a leaked hold")
        .unwrap();
}

/// Spawns a task that waits for `lock`, releases it at once, and returns when it got it.
pub fn time_acquisition(
    lock: impl Into<fredlock::Lock>,
) -> tokio::task::JoinHandle<tokio::time::Instant> {
    let lock = lock.into();
    tokio::spawn(async move {
        let guard = lock.lock().await.unwrap();
        let at = tokio::time::Instant::now();
        guard.unlock().await.unwrap();
        at
    })
}

//! Throw-away `redis-server` processes on free loopback ports: standalone, replicas, a cluster,
//! Sentinel. Every server runs in its own temporary directory with persistence off, is killed
//! when its handle drops, and can be killed and started again on the same port.
//!
//! `FREDLOCK_SERVER` names another server binary to start instead (`.ci/run` runs the core
//! suites a second time with Valkey 9's `valkey-server`); see [`server_binary`].

#![allow(unused_imports)]

use super::*;
use std::future::Future;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fred::prelude::*;

/// The server binary every throw-away server runs: `$FREDLOCK_SERVER` when it is set (a path
/// to `valkey-server`, say), otherwise `redis-server` from PATH.
pub fn server_binary() -> String {
    std::env::var("FREDLOCK_SERVER")
        .ok()
        .filter(|binary| !binary.is_empty())
        .unwrap_or_else(|| "redis-server".to_owned())
}

/// Whether the throw-away servers are Valkey's.
pub fn on_valkey() -> bool {
    std::path::Path::new(&server_binary())
        .file_name()
        .is_some_and(|name| name.to_string_lossy().starts_with("valkey"))
}

/// A `redis-server` (or [`server_binary`]) child process on 127.0.0.1.
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
    pub fn start_with(extra: &[&str], pick_port: impl Fn() -> u16) -> RedisServer {
        RedisServer::start_in(extra, &pick_port, None)
    }

    fn start_in(extra: &[&str], pick_port: &dyn Fn() -> u16, config: Option<&str>) -> RedisServer {
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
        // One handle for every try: dropping a failed one would remove the directory (and the
        // config file) the next try starts in, and that server would exit at once.
        let mut server = RedisServer {
            port: 0,
            dir,
            extra: extra.iter().map(|arg| arg.to_string()).collect(),
            config_file,
            child: None,
        };
        // Another process may take the port between our probe and the server's bind: retry.
        for _ in 0..10 {
            server.port = pick_port();
            if server.spawn() {
                return server;
            }
        }
        panic!("could not start {} (is it on PATH?)", server_binary());
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
        panic!(
            "could not restart {} on port {}",
            server_binary(),
            self.port
        );
    }

    fn spawn(&mut self) -> bool {
        let mut command = Command::new(server_binary());
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
            if up::answers_as(self.port, child.id()) {
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
        super::builder()
            .url(self.url())
            .queue_place(fair_wait)
            .build()
            .await
            .unwrap()
    }

    /// A fredlock client with the given watchdog lease.
    pub async fn lock_client(&self, watchdog: Duration) -> fredlock::LockClient {
        lock_client_at(&self.url(), watchdog).await
    }
}

/// A fredlock client on `url` (any deployment) with the given watchdog lease.
pub async fn lock_client_at(url: &str, watchdog: Duration) -> fredlock::LockClient {
    super::builder()
        .url(url)
        .watchdog_lease(watchdog)
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
        RedisServer::start_replica_with(master, port, &[]).await
    }

    /// A replica of `master` reached at `port`, started with `extra` arguments (AOF on, say),
    /// returned once it streams writes.
    pub async fn start_replica_with(
        master: &RedisServer,
        port: u16,
        extra: &[&str],
    ) -> RedisServer {
        let master_port = port.to_string();
        let mut args = vec!["--replicaof", "127.0.0.1", &master_port];
        args.extend_from_slice(extra);
        let replica = RedisServer::start_with(&args, free_port);
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
        // A full resync (an old master that took writes after the promotion) starts at once,
        // not after Redis 7's default 5 s wait for more replicas to share the transfer.
        let mut server_args: Vec<&str> = vec!["--repl-diskless-sync-delay", "0"];
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
            .map(|_| RedisServer::start_in(&["--sentinel"], &free_port, Some(&config)))
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
        // A missing redis-cli is the harness's fault, not an empty answer to read on.
        .unwrap_or_else(|error| panic!("redis-cli could not run: {error}"))
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

pub static NEXT_DIR: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A free loopback port, as the OS hands one out.
pub fn free_port() -> u16 {
    TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("find a free port")
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

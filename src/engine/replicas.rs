//! Replica sync: every change waits until enough replicas have it.
//!
//! `WAIT` counts the replicas that acknowledged the writes *of the connection it is sent on*,
//! and blocks that connection meanwhile. So a synced write takes a connection of its own from a
//! small pool, runs its script there, sends `WAIT` (or `WAITAOF`) after it, and gives the
//! connection back; the shared command connection never waits for a replica.
//!
//! A write whose acknowledgement falls short fails as a lost reply would (its effect on the
//! master is known, but not that it would survive a failover): the ledger settles it, so an
//! acquire is undone unless a later attempt of the same owner gets it acknowledged, and a
//! renewal counts as failed.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::engine::{Connection, Connector, Reconnects, Value};
use tokio::sync::broadcast::error::TryRecvError;
use tokio::sync::Semaphore;

use crate::error::{not_replicated, Failure, RedisError, RedisErrorKind};

/// Replica sync: every change a lock makes (an acquisition, a release, a renewal, a fair queue's
/// change, a fencing token) is confirmed by this many replicas before it counts. Off unless
/// given to [`LockClientBuilder::replica_sync`](crate::LockClientBuilder::replica_sync).
///
/// Redis replicates asynchronously: without this, a master that fails right after granting a
/// lock may be replaced by a replica that never saw it, and the lock is granted again. With it,
/// an acquisition that the replicas did not confirm within [`timeout`](Self::timeout) is undone
/// (and tried again while the caller's wait lasts, or reported as
/// [`Error::NotReplicated`](crate::Error::NotReplicated)); it is never reported as held. A
/// renewal that is not confirmed counts as failed, so a holder whose replicas fall away is told
/// its lock is lost at the renew deadline.
///
/// It costs each change a wait for the replicas (`WAIT`, or `WAITAOF` when the server runs it
/// and has the append-only file on, which also waits for the master's and replicas' fsync). The
/// waits run on connections of their own (see [`connections`](Self::connections)), so reads and
/// your own commands on `LockClient::redis` never queue behind
/// them. On a cluster each change waits for the replicas of the master of its slot.
///
/// ```no_run
/// # async fn demo() -> fredlock::Result<()> {
/// use std::time::Duration;
/// use fredlock::{LockClient, ReplicaSync};
///
/// let client = LockClient::builder()
///     .url("redis-sentinel://10.0.0.1:26379?sentinelServiceName=locks")
///     .replica_sync(ReplicaSync::replicas(1).timeout(Duration::from_millis(500)))
///     .build()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplicaSync {
    pub(crate) replicas: u32,
    pub(crate) timeout: Duration,
    pub(crate) connections: usize,
}

impl ReplicaSync {
    /// Every change waits until `replicas` replicas have it, for at most a second (Redisson's
    /// `slavesSyncTimeout`), over 4 connections.
    pub fn replicas(replicas: u32) -> ReplicaSync {
        ReplicaSync {
            replicas,
            timeout: Duration::from_secs(1),
            connections: 4,
        }
    }

    /// How long one change waits for its replicas before it fails. Default 1 s.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How many connections the waits run on, each carrying one change and its wait at a time.
    /// More lets more changes wait at once (each change otherwise queues for a free one).
    /// Default 4.
    pub fn connections(mut self, connections: usize) -> Self {
        self.connections = connections;
        self
    }
}

/// Where writes go: the command connection, or with replica sync a pool of connections that
/// each wait for the replicas after their write.
#[derive(Clone)]
pub(crate) struct Writer {
    pub(crate) client: Connection,
    sync: Option<Arc<Syncer>>,
    /// Unlocks are announced with `SPUBLISH` (a cluster of Redis 7 or later).
    pub(crate) sharded: bool,
}

struct Syncer {
    connections: Vec<Connection>,
    free: Mutex<Vec<Pooled>>,
    available: Semaphore,
    needed: u32,
    timeout_ms: i64,
    /// `WAITAOF 1 <needed>`: the master's and the replicas' AOF have the write on disk.
    aof: bool,
}

impl Writer {
    /// A writer on `client` alone.
    pub(crate) fn plain(client: Connection, sharded: bool) -> Writer {
        Writer {
            client,
            sync: None,
            sharded,
        }
    }

    /// A writer that syncs every write, with `settings.connections` connections of its own made
    /// by `connector`; checks first that the server runs `WAIT` (and uses `WAITAOF` where it runs
    /// and the append-only file is on).
    pub(crate) async fn synced(
        client: Connection,
        sharded: bool,
        connector: &Connector,
        settings: ReplicaSync,
    ) -> Result<Writer, String> {
        let mut connections = Vec::with_capacity(settings.connections);
        let mut pooled = Vec::with_capacity(settings.connections);
        let result = async {
            for _ in 0..settings.connections {
                let connection = connector.connection().map_err(|error| error.to_string())?;
                pooled.push(Pooled {
                    index: connections.len(),
                    reconnects: connection.reconnects(),
                });
                connections.push(connection.clone());
                connection
                    .connect()
                    .await
                    .map_err(|error| error.to_string())?;
            }
            let probe = &connections[0];
            let support = WaitSupport::probe(probe).await;
            if let Err(error) = support.wait {
                return Err(format!("the server refuses WAIT ({error})"));
            }
            Ok(support.waitaof && config_get(probe, "appendonly").await.as_deref() == Some("yes"))
        }
        .await;
        let aof = match result {
            Ok(aof) => aof,
            Err(error) => {
                for connection in connections {
                    connection.quit().await;
                }
                return Err(error);
            }
        };
        let count = connections.len();
        Ok(Writer {
            client,
            sharded,
            sync: Some(Arc::new(Syncer {
                connections,
                free: Mutex::new(pooled),
                available: Semaphore::new(count),
                needed: settings.replicas,
                timeout_ms: i64::try_from(settings.timeout.as_millis())
                    .unwrap_or(i64::MAX)
                    .max(1),
                aof,
            })),
        })
    }

    /// Replicas every change waits for (0 without replica sync).
    pub(crate) fn replicas_needed(&self) -> u32 {
        self.sync.as_ref().map_or(0, |sync| sync.needed)
    }

    /// The connections of its own, for reconnects and shutdown.
    pub(crate) fn own_connections(&self) -> &[Connection] {
        self.sync
            .as_ref()
            .map_or(&[], |sync| sync.connections.as_slice())
    }

    /// Runs `send` (which may send more than once, as [`write`](super::script::write) decides)
    /// on a connection, then, with replica sync, waits for the replicas on that connection.
    ///
    /// On a cluster the wait goes to the master of `slot`, the slot of the change's keys, on the
    /// same pooled connection (each pooled client has one connection per master).
    pub(crate) async fn send<'w, R, F, Fut>(
        &'w self,
        slot: impl FnOnce() -> Option<u16>,
        send: F,
    ) -> Result<R, RedisError>
    where
        F: FnOnce(&'w Connection) -> Fut,
        Fut: std::future::Future<Output = Result<R, RedisError>>,
    {
        let Some(sync) = &self.sync else {
            return send(&self.client).await;
        };
        let Ok(permit) = sync.available.acquire().await else {
            return Err(RedisError::new(
                RedisErrorKind::NoReply,
                Failure::Other("canceled".into()),
                "replica sync closed",
            ));
        };
        let mut checkout = Checkout {
            sync,
            pooled: sync
                .free
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .pop(),
            _permit: permit,
        };
        // The permit leaves one free; the first connection otherwise, as before the pool kept
        // announcements.
        let pooled = checkout.pooled.get_or_insert_with(|| Pooled {
            index: 0,
            reconnects: sync.connections[0].reconnects(),
        });
        let connection = &sync.connections[pooled.index];
        // `WAIT` counts the replicas that have what *its* connection wrote. Sent on a new
        // connection (the old one closed, or moved to a new master by the Sentinel watcher,
        // right after the write's reply), it waits for the new connection's writes, none of
        // which is this one, and on a new master counts replicas that never saw it. fred
        // announces each new connection before it sends anything on it, so an announcement
        // between the write and the wait's reply means the write is unconfirmed.
        pooled.forget_reconnects();
        let reply = send(connection).await;
        if reply.is_ok() {
            sync.confirm(connection, slot()).await?;
            if pooled.reconnected() {
                tracing::debug!(
                    "the connection was replaced between a write and its wait for the replicas"
                );
                return Err(not_replicated(0, sync.needed));
            }
        }
        reply
    }
}

/// One pooled connection, in use until dropped: a change cancelled midway (a renewal given up
/// at its deadline) still gives it back.
struct Checkout<'s> {
    sync: &'s Syncer,
    pooled: Option<Pooled>,
    _permit: tokio::sync::SemaphorePermit<'s>,
}

impl Drop for Checkout<'_> {
    fn drop(&mut self) {
        self.sync
            .free
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(self.pooled.take());
    }
}

/// A pooled connection, and the announcements of its new connections.
struct Pooled {
    index: usize,
    reconnects: Reconnects,
}

impl Pooled {
    /// Drops the announcements so far.
    fn forget_reconnects(&mut self) {
        loop {
            match self.reconnects.try_recv() {
                Ok(_) | Err(TryRecvError::Lagged(_)) => {}
                Err(TryRecvError::Empty | TryRecvError::Closed) => return,
            }
        }
    }

    /// Whether a new connection was announced since [`forget_reconnects`](Self::forget_reconnects)
    /// (or the client quit, which closes the announcements).
    fn reconnected(&mut self) -> bool {
        !matches!(self.reconnects.try_recv(), Err(TryRecvError::Empty))
    }
}

impl Syncer {
    /// Waits for `needed` replicas to acknowledge what `connection` wrote (on a cluster, to
    /// the master of `slot`).
    async fn confirm(&self, connection: &Connection, slot: Option<u16>) -> Result<(), RedisError> {
        let needed = i64::from(self.needed);
        let routed;
        let connection = match slot {
            Some(slot) => {
                routed = connection.on_slot(slot);
                &routed
            }
            None => connection,
        };
        // The change ran; a wait that failed leaves it unconfirmed, as a wait that timed out
        // does, and it is undone the same way: a wait that Redis refuses (`UNBLOCKED` when the
        // master steps down under it, a connection that landed on a replica), and one that
        // never went out (fred had no connection to route it to), which must not pass for a
        // change that never went out.
        let unconfirmed = |error: RedisError| {
            tracing::debug!(%error, "the wait for the replicas failed");
            not_replicated(0, self.needed)
        };
        if self.aof {
            let acked: Vec<i64> = connection
                .command(
                    "WAITAOF",
                    vec![1.into(), needed.into(), self.timeout_ms.into()],
                )
                .await
                .map_err(unconfirmed)?;
            let local = acked.first().copied().unwrap_or(0);
            let replicas = acked.get(1).copied().unwrap_or(0);
            if local < 1 || replicas < needed {
                return Err(not_replicated(replicas, self.needed));
            }
        } else {
            let acked: i64 = connection
                .command("WAIT", vec![needed.into(), self.timeout_ms.into()])
                .await
                .map_err(unconfirmed)?;
            if acked < needed {
                return Err(not_replicated(acked, self.needed));
            }
        }
        Ok(())
    }
}

/// Whether a server runs the commands replica sync waits with.
pub(crate) struct WaitSupport {
    /// `WAIT`, or what refused it (a proxy, a managed service).
    pub(crate) wait: Result<(), RedisError>,
    /// `WAITAOF` (Redis 7.2 and later).
    pub(crate) waitaof: bool,
}

impl WaitSupport {
    /// Asks `server` with nothing to wait for (`WAIT 0 1`, `WAITAOF 0 0 1`), so both return at
    /// once.
    pub(crate) async fn probe(server: &Connection) -> WaitSupport {
        let wait: Result<Value, _> = server.command("WAIT", vec![0.into(), 1.into()]).await;
        let waitaof: Result<Value, _> = server
            .command("WAITAOF", vec![0.into(), 0.into(), 1.into()])
            .await;
        WaitSupport {
            wait: wait.map(drop),
            waitaof: waitaof.is_ok(),
        }
    }
}

/// One setting of `server` (`CONFIG GET name`), or `None` when it is refused or unknown.
pub(crate) async fn config_get(server: &Connection, name: &str) -> Option<String> {
    let pair: Vec<String> = server
        .command("CONFIG", vec!["GET".into(), name.into()])
        .await
        .ok()?;
    pair.into_iter().nth(1)
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
    use std::process::{Child, Command, Stdio};
    use std::sync::atomic::{AtomicU16, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::{ReplicaSync, Writer};
    use crate::engine::{Config, Connector, ReconnectPolicy, Value};
    use crate::error::parse_not_replicated;

    fn free_port() -> u16 {
        TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port()
    }

    /// A throw-away `redis-server` on a free loopback port, killed when dropped (a failing
    /// assertion included).
    struct Server {
        port: u16,
        child: Child,
    }

    impl Server {
        fn start(extra: &[&str]) -> Server {
            let port = free_port();
            let child = Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"])
                .args(extra)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server on PATH");
            let server = Server { port, child };
            until("the server answers", || {
                server.cli(&["ping"]).contains("PONG")
            });
            server
        }

        /// A replica of `master`, returned once `master` counts it in a `WAIT`.
        fn replica_of(master: &Server) -> Server {
            let replica = Server::start(&["--replicaof", "127.0.0.1", &master.port.to_string()]);
            until("the replica streams", || {
                master.cli(&["wait", "1", "100"]).trim() == "1"
            });
            replica
        }

        fn cli(&self, args: &[&str]) -> String {
            let output = Command::new("redis-cli")
                .args(["-p", &self.port.to_string()])
                .args(args)
                .output()
                .expect("redis-cli on PATH");
            String::from_utf8_lossy(&output.stdout).into_owned()
        }
    }

    impl Drop for Server {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    fn until(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !done() {
            assert!(Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A loopback forwarder whose new connections go to the server `target` names at the time:
    /// the same address before and after a failover, as a DNS name or a load balancer gives.
    fn forwarder(target: Arc<AtomicU16>) -> u16 {
        let listener = TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)).expect("bind");
        let port = listener.local_addr().expect("address").port();
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let port = target.load(Ordering::SeqCst);
                let Ok(server) = TcpStream::connect(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port))
                else {
                    continue;
                };
                for (mut from, mut to) in [
                    (client.try_clone(), server.try_clone()),
                    (server.try_clone(), client.try_clone()),
                ]
                .into_iter()
                .filter_map(|(from, to)| Some((from.ok()?, to.ok()?)))
                {
                    std::thread::spawn(move || {
                        let mut buffer = [0u8; 4096];
                        while let Ok(read @ 1..) = from.read(&mut buffer) {
                            if to.write_all(&buffer[..read]).is_err() {
                                break;
                            }
                        }
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        port
    }

    /// A write whose connection is replaced before its wait (what the Sentinel watcher's
    /// `force_reconnection` does when the master switches, at whatever moment) is not
    /// confirmed. Here the new connection lands on another master, whose replica is in sync
    /// with it but never saw the write: `WAIT` there counts that replica at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_wait_on_a_new_connection_confirms_nothing() {
        tokio::time::timeout(Duration::from_secs(60), async {
            let first = Server::start(&[]);
            let _first_replica = Server::replica_of(&first);
            let second = Server::start(&[]);
            let _second_replica = Server::replica_of(&second);
            let target = Arc::new(AtomicU16::new(first.port));
            let front = forwarder(target.clone());
            let config = Config::from_url(&format!("redis://127.0.0.1:{front}")).expect("a URL");
            // fred's connections, or redis-rs's in a build without fred.
            #[cfg(feature = "fred")]
            let library = crate::engine::Library::Fred;
            #[cfg(not(feature = "fred"))]
            let library = crate::engine::Library::RedisRs(None);
            let connector = Connector::new(
                library,
                config,
                None,
                Duration::from_secs(1),
                ReconnectPolicy::new_constant(0, 50),
            );
            let client = connector.connection().expect("a client");
            client.connect().await.expect("connected");
            let sync = ReplicaSync::replicas(1)
                .timeout(Duration::from_millis(300))
                .connections(1);
            let writer = Writer::synced(client.clone(), false, &connector, sync)
                .await
                .expect("replica sync on a master with a replica");

            // On one connection, a write its replica has is confirmed.
            let confirmed: Result<i64, _> = writer
                .send(
                    || None,
                    |redis| async move {
                        redis
                            .command::<i64>("INCR", vec![Value::from("count")])
                            .await
                    },
                )
                .await;
            assert_eq!(confirmed.expect("confirmed"), 1);

            // The write goes to the first master; its connection is replaced by one to the
            // second before the wait.
            let moved = writer
                .send(
                    || None,
                    |redis| async move {
                        let written = redis
                            .command::<i64>("INCR", vec![Value::from("count")])
                            .await;
                        target.store(second.port, Ordering::SeqCst);
                        redis.reconnect().await;
                        written
                    },
                )
                .await;
            let error = moved.expect_err("a wait on another connection confirms nothing");
            assert_eq!(parse_not_replicated(&error), Some((0, 1)), "{error}");
            assert_eq!(
                second.cli(&["get", "count"]).trim(),
                "",
                "the write went to the first"
            );

            // On the new connection, a write is confirmed again.
            let confirmed: Result<i64, _> = writer
                .send(
                    || None,
                    |redis| async move {
                        redis
                            .command::<i64>("INCR", vec![Value::from("count")])
                            .await
                    },
                )
                .await;
            assert_eq!(confirmed.expect("confirmed"), 1);
            for connection in writer.own_connections() {
                connection.quit().await;
            }
            client.quit().await;
        })
        .await
        .expect("within a minute");
    }
}

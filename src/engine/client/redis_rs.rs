//! redis-rs (1.x) under the seam (issue 45): the second client library, behind feature
//! `redis-rs`: one standalone server, or the master behind Sentinel (found again on every
//! connect, and checked with `ROLE`), over RESP3 or RESP2 (a cluster is `redis_rs_cluster`,
//! a link per master).
//!
//! redis-rs's own reconnecting connection (`ConnectionManager`) does not say when it has a new
//! connection, and the engine must know: the watchdog renews every hold on a reconnect, the
//! subscriber subscribes again, and replica sync must not take a `WAIT` on a new connection
//! for the old one's write. So a [`Link`] keeps one multiplexed connection itself, as fred
//! does: it announces each new connection before it hands it out, reconnects in the background
//! as the client's reconnect policy says, and sends every command once (a command whose
//! connection broke is reported, never sent again by the library).
//!
//! Over RESP3 a subscriber's messages come as pushes on its multiplexed connection. RESP2 has
//! no pushes: a subscribed connection answers nothing but (UN)SUBSCRIBE and PING, so a
//! subscriber over RESP2 keeps a pub/sub connection of its own instead (redis-rs's
//! `aio::PubSub`), announced and made again as any other. redis-rs's RESP2 pub/sub knows no
//! `SSUBSCRIBE`: sharded channels need RESP3.
//!
//! Replies are read into the crate's vocabulary as fred reads them (a bulk string is text when
//! it is UTF-8, bytes otherwise), so every `FromValue` reads them alike.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use redis::aio::{MultiplexedConnection, PubSubSink};
use redis::{AsyncConnectionConfig, ProtocolVersion, PushInfo, PushKind};
use tokio::sync::{broadcast, watch};

use crate::engine::client::value::Message;
use crate::engine::client::{
    ConnectionLike, LinkLike, Messages, Reconnects, Route, SubscriberLike,
};
use crate::engine::join::join_all;
use crate::engine::{
    FromValue, Key, Map, MessageKind, ReconnectPolicy, ScanType, Sent, Server, Str, Value,
};
use crate::error::{not_connected, Failure, RedisError, RedisErrorKind};

/// Messages buffered for the subscriber's reader, as fred's broadcast capacity is set.
const MESSAGE_BUFFER: usize = 4096;

/// How a [`Link`] connects: to one server, with the client's credentials and timeouts.
#[derive(Clone)]
pub(crate) struct Target {
    client: redis::Client,
    /// The server (behind Sentinel, the first sentinel, until a master is found).
    server: Server,
    /// Behind Sentinel: how the master is found on each connect.
    lookup: Option<Arc<Lookup>>,
    /// A cluster: the nodes its slots are first asked of, and how each node is reached.
    seeds: Option<Arc<Seeds>>,
    command_timeout: Duration,
    policy: ReconnectPolicy,
    /// A subscriber's over RESP2: its messages come on a pub/sub connection of its own.
    dedicated: bool,
}

/// Where a cluster's slots are first asked, and how each of its nodes is reached.
pub(crate) struct Seeds {
    pub(crate) servers: Vec<Server>,
    tls: bool,
    settings: redis::RedisConnectionInfo,
}

impl Target {
    /// The address, credentials and TLS of a service's own redis-rs client, over `protocol`
    /// (RESP3 when `None`, whatever the client's own: redis-rs's default is RESP2, and a URL
    /// cannot tell that default from a choice).
    pub(crate) fn handed_over(
        info: redis::ConnectionInfo,
        protocol: Option<ProtocolVersion>,
        command_timeout: Duration,
        policy: ReconnectPolicy,
    ) -> Result<Target, RedisError> {
        let (host, port) = match info.addr() {
            redis::ConnectionAddr::Tcp(host, port) => (host.clone(), *port),
            redis::ConnectionAddr::TcpTls { host, port, .. } => (host.clone(), *port),
            _ => {
                return Err(RedisError::new(
                    RedisErrorKind::Refused,
                    Failure::Other("invalid client config".into()),
                    "the redis-rs backend connects over TCP only (not a Unix socket) so far",
                ))
            }
        };
        let settings = info
            .redis_settings()
            .clone()
            .set_protocol(protocol.unwrap_or(ProtocolVersion::RESP3));
        let info = info.set_redis_settings(settings);
        Ok(Target {
            client: redis::Client::open(info).map_err(sorted)?,
            server: Server::new(host, port),
            lookup: None,
            seeds: None,
            command_timeout,
            policy,
            dedicated: false,
        })
    }

    /// This target for a subscriber: over RESP2, whose connections cannot take pushes, its
    /// messages come on a pub/sub connection of its own.
    pub(crate) fn subscribing(mut self) -> Target {
        let protocol = match &self.seeds {
            Some(seeds) => seeds.settings.protocol(),
            None => self
                .client
                .get_connection_info()
                .redis_settings()
                .protocol(),
        };
        self.dedicated = protocol == ProtocolVersion::RESP2;
        self
    }

    /// Whether its subscriber can take sharded channels (`SSUBSCRIBE`): not over RESP2, whose
    /// pub/sub in redis-rs knows only classic channels.
    pub(crate) fn shards(&self) -> bool {
        !self.dedicated
    }
}

/// Who a connection logs in as, which database it uses, and whether it speaks TLS.
pub(crate) struct Login<'l> {
    pub(crate) username: Option<&'l str>,
    pub(crate) password: Option<&'l str>,
    pub(crate) database: Option<u8>,
    /// TLS (a `rediss://` URL): the server's certificate checked against the roots redis-rs
    /// trusts (the platform's by default, webpki's with its `tls-rustls-webpki-roots`), and its
    /// name against the host's.
    pub(crate) tls: bool,
    pub(crate) protocol: ProtocolVersion,
}

impl Target {
    /// `server`, logged in as `login` says.
    pub(crate) fn new(
        server: Server,
        login: Login<'_>,
        command_timeout: Duration,
        policy: ReconnectPolicy,
    ) -> Result<Target, RedisError> {
        let settings = login.settings();
        Ok(Target {
            client: client_for(&server, login.tls, settings)?,
            server,
            lookup: None,
            seeds: None,
            command_timeout,
            policy,
            dedicated: false,
        })
    }

    /// The cluster whose slots `seeds` know, each node logged in as `login` says.
    pub(crate) fn cluster(
        seeds: Vec<Server>,
        login: Login<'_>,
        command_timeout: Duration,
        policy: ReconnectPolicy,
    ) -> Result<Target, RedisError> {
        let first = seeds.first().cloned().ok_or_else(|| {
            RedisError::new(
                RedisErrorKind::Refused,
                Failure::Other("invalid client config".into()),
                "a cluster without a node address",
            )
        })?;
        let settings = login.settings();
        Ok(Target {
            client: client_for(&first, login.tls, settings.clone())?,
            server: first,
            lookup: None,
            seeds: Some(Arc::new(Seeds {
                servers: seeds,
                tls: login.tls,
                settings,
            })),
            command_timeout,
            policy,
            dedicated: false,
        })
    }

    /// On a cluster, where its slots are first asked.
    pub(crate) fn seeds(&self) -> Option<&Arc<Seeds>> {
        self.seeds.as_ref()
    }

    /// This cluster's node `server`, reached as every node is.
    pub(crate) fn node(&self, seeds: &Seeds, server: Server) -> Result<Target, RedisError> {
        Ok(Target {
            client: client_for(&server, seeds.tls, seeds.settings.clone())?,
            server,
            lookup: None,
            seeds: None,
            command_timeout: self.command_timeout,
            policy: self.policy.clone(),
            dedicated: self.dedicated,
        })
    }

    pub(crate) fn command_timeout(&self) -> Duration {
        self.command_timeout
    }

    /// The redis-rs client of the server it names.
    pub(crate) fn client(&self) -> &redis::Client {
        &self.client
    }

    /// The master the sentinels at `sentinels` name for `service`, found again on every
    /// connect, logged in as `login` says; the sentinels themselves with `sentinel_login`.
    pub(crate) fn behind_sentinels(
        sentinels: Vec<Server>,
        service: String,
        sentinel_login: Login<'_>,
        login: Login<'_>,
        command_timeout: Duration,
        policy: ReconnectPolicy,
    ) -> Result<Target, RedisError> {
        let first = sentinels.first().cloned().ok_or_else(|| {
            RedisError::new(
                RedisErrorKind::Refused,
                Failure::Other("invalid client config".into()),
                format!("Sentinel service {service:?}: no sentinel address"),
            )
        })?;
        let tls = login.tls;
        Ok(Target {
            client: client_for(&first, sentinel_login.tls, sentinel_login.settings())?,
            server: first,
            lookup: Some(Arc::new(Lookup {
                sentinels,
                service,
                sentinel_tls: sentinel_login.tls,
                sentinel_settings: sentinel_login.settings(),
                tls,
                settings: login.settings(),
            })),
            seeds: None,
            command_timeout,
            policy,
            dedicated: false,
        })
    }
}

impl Login<'_> {
    /// redis-rs's settings for this login.
    fn settings(&self) -> redis::RedisConnectionInfo {
        let mut settings = redis::RedisConnectionInfo::default().set_protocol(self.protocol);
        if let Some(username) = self.username {
            settings = settings.set_username(username);
        }
        if let Some(password) = self.password {
            settings = settings.set_password(password);
        }
        if let Some(database) = self.database {
            settings = settings.set_db(i64::from(database));
        }
        settings
    }
}

/// A redis-rs client for `server`, over TLS when `tls`.
fn client_for(
    server: &Server,
    tls: bool,
    settings: redis::RedisConnectionInfo,
) -> Result<redis::Client, RedisError> {
    // An IPv6 address comes in brackets, as a URL writes it.
    let host = server.host.trim_start_matches('[').trim_end_matches(']');
    let address = if tls {
        if cfg!(not(feature = "tls-rustls")) {
            return Err(RedisError::new(
                RedisErrorKind::Refused,
                Failure::Other("invalid client config".into()),
                format!(
                    "{server}: a TLS URL on the redis-rs backend needs fredlock's feature \
                     tls-rustls"
                ),
            ));
        }
        redis::ConnectionAddr::TcpTls {
            host: host.to_owned(),
            port: server.port,
            insecure: false,
            tls_params: None,
        }
    } else {
        redis::ConnectionAddr::Tcp(host.to_owned(), server.port)
    };
    let info = redis::IntoConnectionInfo::into_connection_info(address)
        .map_err(sorted)?
        .set_redis_settings(settings);
    redis::Client::open(info).map_err(sorted)
}

/// How the master behind Sentinel is found: each sentinel asked in turn.
struct Lookup {
    sentinels: Vec<Server>,
    service: String,
    sentinel_tls: bool,
    sentinel_settings: redis::RedisConnectionInfo,
    /// How the master is reached once found.
    tls: bool,
    settings: redis::RedisConnectionInfo,
}

impl Lookup {
    /// The master the first sentinel that answers names (`SENTINEL GET-MASTER-ADDR-BY-NAME`),
    /// and a client for it; or the last sentinel's error.
    async fn master(&self, timeout: Duration) -> Result<(redis::Client, Server), RedisError> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout));
        let mut last = None;
        for sentinel in &self.sentinels {
            let asked = async {
                let client =
                    client_for(sentinel, self.sentinel_tls, self.sentinel_settings.clone())?;
                let mut connection = client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await
                    .map_err(sorted)?;
                let master: Option<(String, u16)> = redis::cmd("SENTINEL")
                    .arg("GET-MASTER-ADDR-BY-NAME")
                    .arg(&self.service)
                    .query_async(&mut connection)
                    .await
                    .map_err(sorted)?;
                master.ok_or_else(|| {
                    RedisError::new(
                        RedisErrorKind::NotSent,
                        Failure::Other("sentinel".into()),
                        format!(
                            "sentinel {sentinel} knows no master named {:?}",
                            self.service
                        ),
                    )
                })
            };
            match asked.await {
                Ok((host, port)) => {
                    let master = Server::new(host, port);
                    let client = client_for(&master, self.tls, self.settings.clone())?;
                    return Ok((client, master));
                }
                Err(error) => {
                    tracing::debug!(%sentinel, service = %self.service, %error, "a sentinel did not name the master");
                    last = Some(error);
                }
            }
        }
        Err(last.unwrap_or_else(not_connected))
    }
}

/// One connection to the server, kept up in the background. Clones share it.
#[derive(Clone)]
pub(crate) struct Link {
    shared: Arc<Shared>,
}

struct Shared {
    target: Target,
    state: Mutex<State>,
    /// Whether a connection is there now.
    connected: watch::Sender<bool>,
    /// The announcements of new connections; `None` once quit, which closes them.
    reconnects: Mutex<Option<broadcast::Sender<Server>>>,
    messages: broadcast::Sender<Message>,
    /// The server's major version, once read (0 until then).
    major: AtomicU64,
    generations: AtomicU64,
}

#[derive(Default)]
struct State {
    /// The connection in use, with its generation (each new connection has the next).
    current: Option<(u64, MultiplexedConnection)>,
    /// A subscriber's over RESP2: its pub/sub connection in use, with its generation, and the
    /// task that reads its messages.
    dedicated: Option<(u64, PubSubSink, Reader)>,
    reconnecting: bool,
    closed: bool,
    policy: Option<ReconnectPolicy>,
    /// The server of the connection in use, or of the last one (behind Sentinel, the master it
    /// was found at).
    at: Option<Server>,
}

impl State {
    /// The generation of the connection in use, if one is.
    fn generation(&self) -> Option<u64> {
        match (&self.current, &self.dedicated) {
            (Some((generation, _)), _) | (None, Some((generation, ..))) => Some(*generation),
            (None, None) => None,
        }
    }
}

/// A new connection: a multiplexed one, or a subscriber's pub/sub connection over RESP2 with
/// the task that reads its messages.
enum Opened {
    Multiplexed(MultiplexedConnection),
    Dedicated(PubSubSink, Reader),
}

/// The task reading a pub/sub connection's messages; dropped, it stops, which closes the
/// connection (redis-rs ends it with its stream).
struct Reader(tokio::task::AbortHandle);

impl Drop for Reader {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Link {
    /// A link to `target`, not connected yet ([`connect`](Self::connect)).
    pub(crate) fn new(target: Target) -> Link {
        let (reconnects, _) = broadcast::channel(16);
        let (messages, _) = broadcast::channel(MESSAGE_BUFFER);
        Link::sharing(target, messages, reconnects)
    }

    /// A link to `target` whose messages and announcements go to `messages` and `reconnects`
    /// (a cluster's nodes share one of each).
    pub(crate) fn sharing(
        target: Target,
        messages: broadcast::Sender<Message>,
        reconnects: broadcast::Sender<Server>,
    ) -> Link {
        Link {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    policy: Some(target.policy.clone()),
                    ..State::default()
                }),
                target,
                connected: watch::channel(false).0,
                reconnects: Mutex::new(Some(reconnects)),
                messages,
                major: AtomicU64::new(0),
                generations: AtomicU64::new(0),
            }),
        }
    }

    /// Connects, and returns once connected (or with why it could not).
    pub(crate) async fn connect(&self) -> Result<(), RedisError> {
        let generation = self.shared.generations.fetch_add(1, Ordering::Relaxed) + 1;
        let (connection, server) = Shared::open(&self.shared, generation).await?;
        self.shared.install(generation, connection, server);
        Ok(())
    }

    pub(crate) fn is_connected(&self) -> bool {
        *self.shared.connected.borrow()
    }

    pub(crate) async fn wait_for_connect(&self) {
        let mut connected = self.shared.connected.subscribe();
        let _ = connected.wait_for(|connected| *connected).await;
    }

    /// The server of the connection in use (or of the last one, or the one configured).
    pub(crate) fn server(&self) -> Server {
        self.shared.server()
    }

    /// The server, when connected now.
    pub(crate) fn connected_to(&self) -> Vec<Server> {
        if self.is_connected() {
            vec![self.server()]
        } else {
            Vec::new()
        }
    }

    /// One server: no cluster.
    pub(crate) fn is_clustered(&self) -> bool {
        false
    }

    /// Whether it can take sharded channels (not a subscriber over RESP2).
    pub(crate) fn shards(&self) -> bool {
        self.shared.target.shards()
    }

    /// One server: no cluster's masters.
    pub(crate) fn masters(&self) -> Vec<Server> {
        Vec::new()
    }

    /// One server: no slots.
    pub(crate) fn slot_owner(&self, _slot: u16) -> Option<Server> {
        None
    }

    /// One server: no slots to read.
    pub(crate) async fn refresh_slots(&self) -> Result<(), RedisError> {
        Ok(())
    }

    /// The service it finds its master under, behind Sentinel.
    pub(crate) fn sentinel_service(&self) -> Option<String> {
        let lookup = self.shared.target.lookup.as_ref()?;
        Some(lookup.service.clone())
    }

    pub(crate) fn server_major(&self) -> Option<u64> {
        match self.shared.major.load(Ordering::Relaxed) {
            0 => None,
            major => Some(major),
        }
    }

    pub(crate) fn command_timeout(&self) -> Duration {
        self.shared.target.command_timeout
    }

    pub(crate) fn reconnects(&self) -> broadcast::Receiver<Server> {
        announcements(&self.shared.reconnects)
    }

    pub(crate) fn messages(&self) -> broadcast::Receiver<Message> {
        self.shared.messages.subscribe()
    }

    /// Connects in the background, as after a lost connection (the reconnect policy's delays).
    pub(crate) fn keep_connecting(&self) {
        // No connection has generation 0: this finds none in use and starts the task.
        self.shared.lost(0);
    }

    /// Drops the connection and connects again.
    pub(crate) async fn reconnect(&self) {
        let generation = self
            .shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .generation();
        if let Some(generation) = generation {
            self.shared.lost(generation);
            // Returns once connected again, as fred's forced reconnection does: a call made
            // right after it would otherwise find no connection and answer at once that it has
            // none (the outage rule). Bounded by the command timeout.
            let timeout = self.shared.target.command_timeout;
            let _ = tokio::time::timeout(timeout, self.wait_for_connect()).await;
        }
    }

    /// Closes it: calls after this fail, the announcements end.
    pub(crate) async fn quit(&self) {
        let mut state = self
            .shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        state.closed = true;
        state.current = None;
        let dedicated = state.dedicated.take();
        drop(state);
        drop(dedicated);
        self.shared.connected.send_replace(false);
        self.shared
            .reconnects
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
    }

    fn current(&self) -> Option<(u64, MultiplexedConnection)> {
        self.shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .current
            .clone()
    }

    /// The connection in use. While it is being made again (or never was, or is closed), a
    /// call is not sent and fails at once: the client knows it has no connection (one outage
    /// rule on every client library, lib.rs's "Outages"). The engine's write funnel sends a
    /// change again once the connection is back, within the command timeout counted from the
    /// first send; waiting here too made such a call wait two command timeouts.
    ///
    /// Subscriptions never waited either: calls that wait are let go together when the
    /// connection is back, in no set order, and a `SUBSCRIBE` overtaken by its `UNSUBSCRIBE`
    /// would leave the channel subscribed (`tests/faults.rs`,
    /// `reconnects_leave_no_subscriptions_behind`); the engine subscribes its channels again on
    /// the announcement of the new connection.
    fn ready(&self) -> Result<(u64, MultiplexedConnection), RedisError> {
        self.current().ok_or_else(not_connected)
    }

    /// One call of a script or a plain command; see the seam's `Connection::call`.
    pub(crate) async fn call<R: FromValue>(
        &self,
        sent: Sent<'_>,
        call: &impl Fn() -> (Vec<Key>, Vec<Value>),
    ) -> Result<R, RedisError> {
        self.call_via(|command| self.query(command), sent, call)
            .await
    }

    /// One call as [`call`](Self::call) makes it, behind `ASKING` (a cluster's slot being
    /// moved here: the node serves the call's keys only when asked so first).
    pub(crate) async fn call_asking<R: FromValue>(
        &self,
        sent: Sent<'_>,
        call: &impl Fn() -> (Vec<Key>, Vec<Value>),
    ) -> Result<R, RedisError> {
        self.call_via(|command| self.asking(command), sent, call)
            .await
    }

    /// The call, each command sent by `send` (a type of its own per way of sending, so that
    /// the plain call's path has no branch for `ASKING`).
    async fn call_via<R: FromValue, Sending: Future<Output = Result<R, RedisError>>>(
        &self,
        send: impl Fn(redis::Cmd) -> Sending,
        sent: Sent<'_>,
        call: &impl Fn() -> (Vec<Key>, Vec<Value>),
    ) -> Result<R, RedisError> {
        let (keys, args) = call();
        match sent {
            Sent::Command(name) => send(packed(name, None, &keys, &args)).await,
            Sent::Script { sha, body } => {
                let script = |name: &str, text: &str| packed(name, Some(text), &keys, &args);
                match send(script("EVALSHA", sha)).await {
                    Err(error) if error.details().starts_with("NOSCRIPT") => {
                        send(script("EVAL", body)).await
                    }
                    other => other,
                }
            }
        }
    }

    /// `name` with `args`.
    pub(crate) async fn command<R: FromValue>(
        &self,
        name: &str,
        args: &[Value],
    ) -> Result<R, RedisError> {
        self.query(packed(name, None, &[], args)).await
    }

    /// One page of `SCAN cursor MATCH pattern COUNT count [TYPE of_type]`.
    pub(crate) async fn scan_page(
        &self,
        cursor: String,
        pattern: &str,
        count: u32,
        of_type: Option<ScanType>,
    ) -> Result<(String, Vec<String>), RedisError> {
        let mut args = vec![
            Value::from(cursor),
            Value::from("MATCH"),
            Value::from(pattern),
            Value::from("COUNT"),
            Value::from(i64::from(count)),
        ];
        if let Some(of_type) = of_type {
            args.push(Value::from("TYPE"));
            args.push(Value::from(match of_type {
                ScanType::Set => "set",
                ScanType::String => "string",
                ScanType::ZSet => "zset",
                ScanType::List => "list",
                ScanType::Hash => "hash",
                ScanType::Stream => "stream",
            }));
        }
        self.command("SCAN", &args).await
    }

    /// Commands sent together, each one's reply or error in order.
    pub(crate) async fn pipeline(
        &self,
        commands: Vec<(&'static str, Vec<Value>)>,
    ) -> Result<Vec<Result<Value, RedisError>>, RedisError> {
        // One write for all: the multiplexed connection sends each as it is polled, without
        // waiting for the one before. Each reply or error is the caller's to read, as fred's
        // pipeline gives them.
        let sent: Vec<_> = commands
            .iter()
            .map(|(name, args)| async move {
                let mut command = redis::cmd(name);
                push_args(&mut command, args);
                self.raw(command).await
            })
            .collect();
        Ok(join_all(sent).await)
    }

    /// `SUBSCRIBE channels`; it returns once the server has them (redis-rs waits for each
    /// channel's confirmation, over either protocol).
    pub(crate) async fn subscribe(&self, channels: Vec<String>) -> Result<(), RedisError> {
        if self.shared.target.dedicated {
            let (generation, mut sink) = self.dedicated()?;
            let subscribed = sink.subscribe(channels).await;
            return self.checked(generation, subscribed);
        }
        let (generation, mut connection) = self.current().ok_or_else(not_connected)?;
        let subscribed = connection.subscribe(channels).await;
        self.checked(generation, subscribed)
    }

    /// `UNSUBSCRIBE channels`.
    pub(crate) async fn unsubscribe(&self, channels: Vec<String>) -> Result<(), RedisError> {
        if self.shared.target.dedicated {
            let (generation, mut sink) = self.dedicated()?;
            let unsubscribed = sink.unsubscribe(channels).await;
            return self.checked(generation, unsubscribed);
        }
        let (generation, mut connection) = self.current().ok_or_else(not_connected)?;
        let unsubscribed = connection.unsubscribe(channels).await;
        self.checked(generation, unsubscribed)
    }

    /// A subscriber's pub/sub connection over RESP2, with its generation.
    fn dedicated(&self) -> Result<(u64, PubSubSink), RedisError> {
        let state = self
            .shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let (generation, sink, _) = state.dedicated.as_ref().ok_or_else(not_connected)?;
        Ok((*generation, sink.clone()))
    }

    /// `SSUBSCRIBE` each of `channels`, one command per channel, each returning once the
    /// server has it. redis-rs pairs a shard subscription's confirmation (a push) with the
    /// oldest command waiting for a reply, and confirms several channels with several pushes:
    /// one channel per command keeps each confirmation paired with its own command.
    pub(crate) async fn ssubscribe(&self, channels: Vec<String>) -> Result<(), RedisError> {
        self.shard_command("SSUBSCRIBE", channels).await
    }

    /// `SUNSUBSCRIBE` each of `channels`, one command per channel.
    pub(crate) async fn sunsubscribe(&self, channels: Vec<String>) -> Result<(), RedisError> {
        self.shard_command("SUNSUBSCRIBE", channels).await
    }

    async fn shard_command(&self, name: &str, channels: Vec<String>) -> Result<(), RedisError> {
        let (generation, mut connection) = self.current().ok_or_else(not_connected)?;
        for channel in channels {
            let mut command = redis::cmd(name);
            command.arg(channel);
            let reply = connection.send_packed_command(&command).await;
            self.checked(generation, reply).and_then(read)?;
        }
        Ok(())
    }

    /// `name` with `args`, behind `ASKING`.
    pub(crate) async fn command_asking<R: FromValue>(
        &self,
        name: &str,
        args: &[Value],
    ) -> Result<R, RedisError> {
        self.asking(packed(name, None, &[], args)).await
    }

    /// `ASKING`, then `command`, written together so that nothing comes between them.
    async fn asking<R: FromValue>(&self, command: redis::Cmd) -> Result<R, RedisError> {
        let (generation, mut connection) = self.ready()?;
        let mut pipeline = redis::pipe();
        pipeline.cmd("ASKING").add_command(command);
        let replies = connection.send_packed_commands(&pipeline, 1, 1).await;
        let value = self
            .checked(generation, replies)?
            .into_iter()
            .next()
            .ok_or_else(|| RedisError::unreadable("no reply after ASKING".into()))?;
        R::from_value(read(value)?).map_err(RedisError::from)
    }

    async fn query<R: FromValue>(&self, command: redis::Cmd) -> Result<R, RedisError> {
        let value = self.raw(command).await?;
        R::from_value(value).map_err(RedisError::from)
    }

    async fn raw(&self, command: redis::Cmd) -> Result<Value, RedisError> {
        let (generation, mut connection) = self.ready()?;
        let reply = connection.send_packed_command(&command).await;
        self.checked(generation, reply).and_then(read)
    }

    /// `reply`'s error sorted, after reconnecting when it says the connection broke.
    fn checked<T>(&self, generation: u64, reply: redis::RedisResult<T>) -> Result<T, RedisError> {
        reply.map_err(|error| {
            if error.is_io_error() || error.is_connection_dropped() {
                self.shared.lost(generation);
            }
            sorted(error)
        })
    }
}

impl Shared {
    fn server(&self) -> Server {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state
            .at
            .clone()
            .unwrap_or_else(|| self.target.server.clone())
    }

    /// A new connection of `generation`, whose pushes (messages, its end) come to `shared`,
    /// and the server it reached (behind Sentinel, the master the sentinels name now).
    async fn open(shared: &Arc<Shared>, generation: u64) -> Result<(Opened, Server), RedisError> {
        let timeout = shared.target.command_timeout;
        let (client, server) = match &shared.target.lookup {
            None => (shared.target.client.clone(), shared.target.server.clone()),
            Some(lookup) => lookup.master(timeout).await?,
        };
        if shared.target.dedicated {
            let (sink, reader) = Shared::open_pubsub(shared, &client, &server, generation).await?;
            return Ok((Opened::Dedicated(sink, reader), server));
        }
        let from = server.clone();
        let weak: Weak<Shared> = Arc::downgrade(shared);
        let pushes = move |info: PushInfo| -> Result<(), ()> {
            let Some(shared) = weak.upgrade() else {
                return Err(());
            };
            match info.kind {
                PushKind::Disconnection => shared.lost(generation),
                PushKind::Message | PushKind::SMessage => {
                    let mut data = info.data.into_iter();
                    if let (Some(channel), Some(value)) = (data.next(), data.next()) {
                        let channel = match read(channel) {
                            Ok(Value::String(text)) => text,
                            _ => return Ok(()),
                        };
                        let kind = if info.kind == PushKind::SMessage {
                            MessageKind::SMessage
                        } else {
                            MessageKind::Message
                        };
                        let _ = shared.messages.send(Message {
                            channel,
                            value: read(value).unwrap_or(Value::Null),
                            kind,
                            server: from.clone(),
                        });
                    }
                }
                _ => {}
            }
            Ok(())
        };
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout));
        let info = client.get_connection_info();
        let mut connection = match (info.redis_settings().protocol(), info.addr()) {
            (ProtocolVersion::RESP2, redis::ConnectionAddr::Tcp(host, port)) => {
                Shared::open_resp2(shared, info, (host, *port), config, generation).await?
            }
            // Over RESP2 with TLS, whose stream redis-rs makes alone: a broken connection is
            // found by the next call that meets it, which reports it lost.
            (ProtocolVersion::RESP2, _) => client
                .get_multiplexed_async_connection_with_config(&config)
                .await
                .map_err(sorted)?,
            _ => client
                .get_multiplexed_async_connection_with_config(&config.set_push_sender(pushes))
                .await
                .map_err(sorted)?,
        };
        if shared.target.lookup.is_some() {
            // A sentinel may still name a master that has stepped down (or not yet name the
            // new one): a write there would be lost in its resync.
            let role: redis::Value = redis::cmd("ROLE")
                .query_async(&mut connection)
                .await
                .map_err(sorted)?;
            if !is_master(&role) {
                return Err(RedisError::new(
                    RedisErrorKind::NotSent,
                    Failure::Other("sentinel".into()),
                    format!("{server} is not a master (yet): ROLE answered {role:?}"),
                ));
            }
        }
        if shared.major.load(Ordering::Relaxed) == 0 {
            let info: Result<String, _> = redis::cmd("INFO")
                .arg("server")
                .query_async(&mut connection)
                .await;
            if let Some(major) = info.ok().as_deref().and_then(major_version) {
                shared.major.store(major, Ordering::Relaxed);
            }
        }
        Ok((Opened::Multiplexed(connection), server))
    }

    /// A multiplexed connection over RESP2 to `address`, on a TCP stream made here so that its
    /// driver is ours to watch: RESP2 has no pushes (redis-rs refuses a push sender there), so
    /// the driver's end is what reports the connection of `generation` lost, at once, as the
    /// disconnection push does over RESP3.
    async fn open_resp2(
        shared: &Arc<Shared>,
        info: &redis::ConnectionInfo,
        (host, port): (&str, u16),
        config: AsyncConnectionConfig,
        generation: u64,
    ) -> Result<MultiplexedConnection, RedisError> {
        let timeout = shared.target.command_timeout;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let connecting = async {
            let stream = tokio::net::TcpStream::connect((host, port))
                .await
                .map_err(|error| sorted(redis::RedisError::from(error)))?;
            // As redis-rs sets its own streams.
            let _ = stream.set_nodelay(true);
            MultiplexedConnection::new_with_config(info.redis_settings(), stream, config)
                .await
                .map_err(sorted)
        };
        let (connection, driver) = tokio::time::timeout(timeout, connecting)
            .await
            .map_err(|_| no_connection_within(format!("{host}:{port}"), timeout))??;
        let weak: Weak<Shared> = Arc::downgrade(shared);
        tokio::spawn(async move {
            driver.await;
            if let Some(shared) = weak.upgrade() {
                shared.lost(generation);
            }
        });
        Ok(connection)
    }

    /// A subscriber's pub/sub connection over RESP2 to `server`, and the task that hands its
    /// messages to `shared` and reports its end as the loss of `generation`.
    async fn open_pubsub(
        shared: &Arc<Shared>,
        client: &redis::Client,
        server: &Server,
        generation: u64,
    ) -> Result<(PubSubSink, Reader), RedisError> {
        // redis-rs's pub/sub connection has no timeouts of its own.
        let timeout = shared.target.command_timeout;
        let pubsub = tokio::time::timeout(timeout, client.get_async_pubsub())
            .await
            .map_err(|_| no_connection_within(server, timeout))?
            .map_err(sorted)?;
        let (sink, mut stream) = pubsub.split();
        let weak: Weak<Shared> = Arc::downgrade(shared);
        let from = server.clone();
        let task = tokio::spawn(async move {
            while let Some(message) = std::future::poll_fn(|cx| {
                futures_core::Stream::poll_next(std::pin::Pin::new(&mut stream), cx)
            })
            .await
            {
                let Some(shared) = weak.upgrade() else {
                    return;
                };
                let _ = shared.messages.send(Message {
                    channel: Str::from(message.get_channel_name()),
                    value: text_or_bytes(message.get_payload_bytes().to_vec()),
                    kind: MessageKind::Message,
                    server: from.clone(),
                });
            }
            // The connection ended (redis-rs ends the stream with it).
            if let Some(shared) = weak.upgrade() {
                shared.lost(generation);
            }
        });
        Ok((sink, Reader(task.abort_handle())))
    }

    /// Hands out `connection` (to `server`) from now on, after announcing it.
    fn install(&self, generation: u64, connection: Opened, server: Server) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.closed {
            return;
        }
        if let Some(reconnects) = &*self
            .reconnects
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
        {
            let _ = reconnects.send(server.clone());
        }
        state.at = Some(server);
        match connection {
            Opened::Multiplexed(connection) => state.current = Some((generation, connection)),
            Opened::Dedicated(sink, reader) => state.dedicated = Some((generation, sink, reader)),
        }
        drop(state);
        self.connected.send_replace(true);
    }

    /// The connection of `generation` broke: drop it (if it is still the one in use) and
    /// reconnect in the background.
    fn lost(self: &Arc<Self>, generation: u64) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let mut ended = None;
        if state.generation() == Some(generation) {
            state.current = None;
            // Dropped once the lock is let go: its reader may be the caller.
            ended = state.dedicated.take();
            self.connected.send_replace(false);
        }
        if state.generation().is_some() || state.reconnecting || state.closed {
            drop(state);
            drop(ended);
            return;
        }
        state.reconnecting = true;
        let mut policy = state
            .policy
            .take()
            .unwrap_or_else(|| self.target.policy.clone());
        drop(state);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let shared = self.clone();
        runtime.spawn(async move {
            loop {
                let Some(delay) = policy.next_delay() else {
                    tracing::warn!(server = %shared.server(), "gave up reconnecting (the reconnect policy's attempts ran out)");
                    break;
                };
                tokio::time::sleep(Duration::from_millis(delay)).await;
                if shared.state.lock().unwrap_or_else(PoisonError::into_inner).closed {
                    break;
                }
                let generation = shared.generations.fetch_add(1, Ordering::Relaxed) + 1;
                match Shared::open(&shared, generation).await {
                    Ok((connection, server)) => {
                        // Attempts start again from the first delay after the next break.
                        policy = shared.target.policy.clone();
                        shared.install(generation, connection, server);
                        // Done only if the new connection still stands, checked under the
                        // lock that `lost` takes: one lost between its install and here found
                        // this task at work and left the reconnect to it, and the link would
                        // otherwise stay without a connection and without a task making one.
                        let mut state =
                            shared.state.lock().unwrap_or_else(PoisonError::into_inner);
                        if state.generation().is_some() || state.closed {
                            state.reconnecting = false;
                            state.policy = Some(policy);
                            return;
                        }
                    }
                    Err(error) => {
                        tracing::debug!(server = %shared.server(), %error, "reconnect failed");
                    }
                }
            }
            let mut state = shared.state.lock().unwrap_or_else(PoisonError::into_inner);
            state.reconnecting = false;
            state.policy = Some(policy);
        });
    }
}

/// The announcements of `sender` from now on; once quit (`None`), a receiver whose sender is
/// gone, which reads as closed at once.
pub(crate) fn announcements(
    sender: &Mutex<Option<broadcast::Sender<Server>>>,
) -> broadcast::Receiver<Server> {
    match &*sender.lock().unwrap_or_else(PoisonError::into_inner) {
        Some(sender) => sender.subscribe(),
        None => broadcast::channel(1).1,
    }
}

/// Whether a `ROLE` reply says master.
fn is_master(role: &redis::Value) -> bool {
    let redis::Value::Array(items) = role else {
        return false;
    };
    match items.first() {
        Some(redis::Value::BulkString(word)) => word == b"master",
        Some(redis::Value::SimpleString(word)) => word == "master",
        _ => false,
    }
}

/// `redis_version:7.0.15` (Valkey too reports one) read from `INFO server`.
fn major_version(info: &str) -> Option<u64> {
    info.lines()
        .find_map(|line| line.strip_prefix("redis_version:"))
        .and_then(|version| version.split('.').next())
        .and_then(|major| major.trim().parse().ok())
}

/// `name`, then a script's SHA1 or text and the number of keys (`script`), the keys and the
/// arguments, in one command sized for them up front: a command grown argument by argument
/// spent more instructions growing its buffers than writing into them (callgrind, scenario 8).
fn packed(name: &str, script: Option<&str>, keys: &[Key], args: &[Value]) -> redis::Cmd {
    let count = 1 + 2 * usize::from(script.is_some()) + keys.len() + args.len();
    let bytes = name.len()
        + script.map_or(0, |text| text.len() + 20)
        + keys.iter().map(|key| key.as_bytes().len()).sum::<usize>()
        + args.iter().map(written_len).sum::<usize>();
    let mut command = redis::Cmd::with_capacity(count, bytes);
    command.arg(name);
    if let Some(text) = script {
        command.arg(text).arg(keys.len());
    }
    for key in keys {
        command.arg(key.as_bytes());
    }
    push_args(&mut command, args);
    command
}

/// About how many bytes [`push_args`] writes for `arg` (a number: at most 20 digits).
fn written_len(arg: &Value) -> usize {
    match arg {
        Value::String(text) => text.len(),
        Value::Bytes(bytes) => bytes.len(),
        _ => 20,
    }
}

/// Appends `args` as fred would send them.
fn push_args(command: &mut redis::Cmd, args: &[Value]) {
    for arg in args {
        match arg {
            Value::String(text) => command.arg(text.as_bytes()),
            Value::Bytes(bytes) => command.arg(&bytes[..]),
            Value::Integer(number) => command.arg(*number),
            Value::Double(number) => command.arg(number.to_string()),
            Value::Boolean(yes) => command.arg(if *yes { "true" } else { "false" }),
            Value::Null => command.arg(""),
            other => command.arg(other.as_bytes().unwrap_or_default()),
        };
    }
}

/// A redis-rs reply as fred reads one.
pub(crate) fn read(value: redis::Value) -> Result<Value, RedisError> {
    Ok(match value {
        redis::Value::Nil => Value::Null,
        redis::Value::Int(number) => Value::Integer(number),
        redis::Value::BulkString(bytes) => text_or_bytes(bytes),
        redis::Value::SimpleString(text) => Value::String(Str::from(text)),
        redis::Value::Okay => Value::String(Str::from_static("OK")),
        redis::Value::Array(values) | redis::Value::Set(values) => {
            Value::Array(values.into_iter().map(read).collect::<Result<_, _>>()?)
        }
        redis::Value::Push { data, .. } => {
            Value::Array(data.into_iter().map(read).collect::<Result<_, _>>()?)
        }
        redis::Value::Map(pairs) => {
            let mut map = std::collections::HashMap::with_capacity(pairs.len());
            for (key, value) in pairs {
                let key = match read(key)? {
                    Value::String(text) => Key::from(text.to_string()),
                    Value::Bytes(bytes) => Key::from(&bytes[..]),
                    other => Key::from(other.as_string().unwrap_or_default()),
                };
                map.insert(key, read(value)?);
            }
            Value::Map(Map::try_from(map).map_err(RedisError::from)?)
        }
        redis::Value::Attribute { data, .. } => read(*data)?,
        redis::Value::Double(number) => Value::Double(number),
        redis::Value::Boolean(yes) => Value::Boolean(yes),
        redis::Value::VerbatimString { text, .. } => Value::String(Str::from(text)),
        // A big number (RESP3) is read by no call of the crate; its type is a `BigInt` or its
        // digits, by a feature of redis-rs another crate may turn on, so it is left unread.
        redis::Value::ServerError(error) => {
            return Err(sorted(redis::RedisError::from(error)));
        }
        other => {
            return Err(RedisError::unreadable(format!(
                "a reply of a kind the crate does not read: {other:?}"
            )))
        }
    })
}

fn text_or_bytes(bytes: Vec<u8>) -> Value {
    match String::from_utf8(bytes) {
        Ok(text) => Value::String(Str::from(text)),
        Err(error) => Value::Bytes(error.into_bytes().into()),
    }
}

/// A connection to `to` not made within `timeout`: nothing was sent.
fn no_connection_within(to: impl std::fmt::Display, timeout: Duration) -> RedisError {
    RedisError::new(
        RedisErrorKind::NotSent,
        Failure::Timeout,
        format!("{to}: not connected within {timeout:?}"),
    )
}

/// A redis-rs error sorted as the ledger needs it, in the crate's words.
pub(crate) fn sorted(error: redis::RedisError) -> RedisError {
    use redis::{ErrorKind, ServerErrorKind};
    let details = match (error.code(), error.detail()) {
        (Some(code), Some(detail)) => format!("{code} {detail}"),
        (Some(code), None) => code.to_owned(),
        _ => error.to_string(),
    };
    let failure = if error.is_timeout() {
        Failure::Timeout
    } else if error.is_io_error() || error.is_connection_dropped() {
        Failure::Connection
    } else if error.kind() == ErrorKind::AuthenticationFailed {
        Failure::Auth
    } else if error.code().is_some() {
        // The server's error reply, whose category redis-rs leaves empty when it has no kind
        // for its code (NOPERM).
        Failure::Reply
    } else {
        Failure::Other(error.category().to_ascii_lowercase())
    };
    let kind = match error.kind() {
        // The slot is moving or the cluster cannot serve it: refused before running.
        ErrorKind::Server(ServerErrorKind::TryAgain | ServerErrorKind::ClusterDown) => {
            RedisErrorKind::NotSent
        }
        // Loading its data after a restart, as fred sorts it: the reply counts as lost.
        ErrorKind::Server(ServerErrorKind::BusyLoading) => RedisErrorKind::NoReply,
        _ if error.is_connection_refusal() => RedisErrorKind::NotSent,
        _ if error.is_timeout() || error.is_io_error() || error.is_connection_dropped() => {
            RedisErrorKind::NoReply
        }
        _ => RedisErrorKind::Refused,
    };
    RedisError::new(kind, failure, details)
}

/// The builder's method that takes a service's own redis-rs client: in redis-rs's file, so that
/// no file outside the seam names redis-rs.
impl crate::config::LockClientBuilder {
    /// The address, credentials and TLS of a redis-rs client the service already has, so that
    /// they are written once: the client runs on redis-rs ([`Backend::RedisRs`](crate::Backend::RedisRs)) and opens
    /// connections of its own with them (its commands are sent once each, and its pub/sub
    /// needs a connection of its own), over RESP3 unless [`protocol`](Self::protocol) says
    /// otherwise; the service's client is left as it is.
    /// Timeouts and the reconnect policy stay this builder's. It takes precedence over
    /// [`url`](Self::url) and `config`.
    ///
    /// ```no_run
    /// # async fn demo() -> fredlock::Result<()> {
    /// let redis = redis::Client::open("redis://:secret@127.0.0.1:6379").expect("a valid URL");
    /// let locks = fredlock::LockClient::builder().redis_rs_client(&redis).build().await?;
    /// # Ok(()) }
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "redis-rs")))]
    pub fn redis_rs_client(mut self, client: &redis::Client) -> Self {
        self.backend = Some(crate::Backend::RedisRs);
        self.redis_rs = Some(client.get_connection_info().clone());
        self
    }
}

/// One server's link, or the master's behind Sentinel, behind the seam (a sentinel's own
/// connection too, which subscribes and asks).
impl LinkLike for Link {
    fn connect(&self) -> impl Future<Output = Result<(), RedisError>> + Send {
        Link::connect(self)
    }

    fn messages(&self) -> Messages {
        Link::messages(self)
    }

    fn reconnects(&self) -> Reconnects {
        Link::reconnects(self)
    }

    fn connected_to(&self) -> Vec<Server> {
        Link::connected_to(self)
    }

    fn reconnect(&self) -> impl Future<Output = ()> + Send {
        Link::reconnect(self)
    }

    fn quit(&self) -> impl Future<Output = ()> + Send {
        Link::quit(self)
    }
}

impl ConnectionLike for Link {
    fn is_connected(&self) -> bool {
        Link::is_connected(self)
    }

    fn wait_for_connect(&self) -> impl Future<Output = ()> + Send {
        Link::wait_for_connect(self)
    }

    fn is_clustered(&self) -> bool {
        Link::is_clustered(self)
    }

    fn sentinel_service(&self) -> Option<String> {
        Link::sentinel_service(self)
    }

    fn server_major(&self) -> Option<u64> {
        Link::server_major(self)
    }

    fn command_timeout(&self) -> Duration {
        Link::command_timeout(self)
    }

    fn masters(&self) -> Vec<Server> {
        Link::masters(self)
    }

    fn subscribe(&self, channel: &str) -> impl Future<Output = Result<(), RedisError>> + Send {
        Link::subscribe(self, vec![channel.to_owned()])
    }

    fn call<R: FromValue>(
        &self,
        _route: &Route,
        sent: Sent<'_>,
        call: &impl Fn() -> (Vec<Key>, Vec<Value>),
    ) -> impl Future<Output = Result<R, RedisError>> {
        Link::call(self, sent, call)
    }

    fn command<R: FromValue>(
        &self,
        _route: &Route,
        name: &'static str,
        args: Vec<Value>,
    ) -> impl Future<Output = Result<R, RedisError>> {
        self.query(packed(name, None, &[], &args))
    }

    fn pipeline(
        &self,
        _route: &Route,
        commands: Vec<(&'static str, Vec<Value>)>,
    ) -> impl Future<Output = Result<Vec<Result<Value, RedisError>>, RedisError>> + Send {
        Link::pipeline(self, commands)
    }

    fn scan_page(
        &self,
        _route: &Route,
        cursor: String,
        pattern: &str,
        count: u32,
        of_type: Option<ScanType>,
    ) -> impl Future<Output = Result<(String, Vec<String>), RedisError>> + Send {
        Link::scan_page(self, cursor, pattern, count, of_type)
    }
}

impl SubscriberLike for Link {
    fn subscribe(
        &self,
        channels: Vec<String>,
    ) -> impl Future<Output = Result<(), RedisError>> + Send {
        Link::subscribe(self, channels)
    }

    fn ssubscribe(
        &self,
        channels: Vec<String>,
    ) -> impl Future<Output = Result<(), RedisError>> + Send {
        Link::ssubscribe(self, channels)
    }

    fn unsubscribe(
        &self,
        channels: Vec<String>,
    ) -> impl Future<Output = Result<(), RedisError>> + Send {
        Link::unsubscribe(self, channels)
    }

    fn sunsubscribe(
        &self,
        channels: Vec<String>,
    ) -> impl Future<Output = Result<(), RedisError>> + Send {
        Link::sunsubscribe(self, channels)
    }

    fn shards(&self) -> bool {
        Link::shards(self)
    }

    fn slot_owner(&self, slot: u16) -> Option<Server> {
        Link::slot_owner(self, slot)
    }

    fn refresh_slots(&self) -> impl Future<Output = Result<(), RedisError>> + Send {
        Link::refresh_slots(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_read_as_fred_reads_them() {
        assert_eq!(read(redis::Value::Nil).ok(), Some(Value::Null));
        assert_eq!(
            read(redis::Value::BulkString(b"abc".to_vec())).ok(),
            Some(Value::String("abc".into()))
        );
        assert_eq!(
            read(redis::Value::BulkString(vec![0xff, 0xfe])).ok(),
            Some(Value::Bytes(vec![0xff, 0xfe].into()))
        );
        assert_eq!(
            read(redis::Value::Okay).ok(),
            Some(Value::String("OK".into()))
        );
        assert_eq!(
            read(redis::Value::Array(vec![
                redis::Value::Int(1),
                redis::Value::Nil
            ]))
            .ok(),
            Some(Value::Array(vec![Value::Integer(1), Value::Null]))
        );
        assert_eq!(
            major_version("# Server\r\nredis_version:7.0.15\r\n"),
            Some(7)
        );
    }
    /// An error reply as the server sends it, read by redis-rs's own parser.
    fn reply(line: &str) -> RedisError {
        let value = redis::parse_redis_value(format!("-{line}\r\n").as_bytes())
            .expect("an error reply parses");
        read(value).expect_err("an error reply is an error")
    }

    /// The same sorting as fred's (the seam's unit tests): what the ledger does with a call
    /// depends on it.
    #[test]
    fn redis_rs_errors_are_sorted_by_what_they_mean_for_the_command() {
        for (line, kind) in [
            ("NOSCRIPT No matching script", RedisErrorKind::Refused),
            ("WRONGTYPE Operation against a key", RedisErrorKind::Refused),
            ("ERR unknown command", RedisErrorKind::Refused),
            (
                "TRYAGAIN Multiple keys request during rehashing",
                RedisErrorKind::NotSent,
            ),
            ("CLUSTERDOWN The cluster is down", RedisErrorKind::NotSent),
            (
                "LOADING Redis is loading the dataset",
                RedisErrorKind::NoReply,
            ),
        ] {
            let error = reply(line);
            assert_eq!(error.kind(), kind, "{line}");
            // The words after the code reach the refusal decoder and the NOSCRIPT fallback.
            assert_eq!(error.details(), line);
        }
        let reset = sorted(redis::RedisError::from(std::io::Error::from(
            std::io::ErrorKind::ConnectionReset,
        )));
        assert_eq!(reset.kind(), RedisErrorKind::NoReply);
        assert!(
            reset.to_string().starts_with("connection failed"),
            "{reset}"
        );
        let refused = sorted(redis::RedisError::from(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        )));
        assert_eq!(refused.kind(), RedisErrorKind::NotSent);
        let auth = sorted(redis::RedisError::from((
            redis::ErrorKind::AuthenticationFailed,
            "WRONGPASS invalid username-password pair",
        )));
        assert_eq!(auth.kind(), RedisErrorKind::Refused);
        assert!(auth.to_string().contains("password"), "{auth}");
        assert_eq!(not_connected().kind(), RedisErrorKind::NotSent);
    }
}

//! What the crate needs of fred, its client library, kept in one place so that a second client
//! library can stand beside it (issue 45's seam):
//!
//! - [`Connection`]: a command connection, and every call the crate makes on it (a script call,
//!   a plain command, the few reads), routed by the first key or to a node or slot;
//! - fred's errors, sorted once, where they enter the crate, into what the ledger and the waits
//!   need to know ([`RedisErrorKind`]): never sent, sent without a reply (may have run), or
//!   answered.
//!
//! The vocabulary of calls is in `value.rs`.

#[cfg(feature = "redis-rs")]
mod redis_rs;
#[cfg(feature = "redis-rs")]
mod redis_rs_cluster;
pub(crate) mod settings;
pub(crate) mod value;
#[cfg(any(not(feature = "fred"), all(test, feature = "redis-rs")))]
mod vocabulary;

use std::time::Duration;

#[cfg(feature = "fred")]
use fred::clients::{Client, SubscriberClient};
#[cfg(feature = "fred")]
use fred::error::{Error as FredError, ErrorKind};
#[cfg(feature = "fred")]
use fred::interfaces::{
    ClientInterface, ClientLike, ClusterInterface, EventInterface, HashesInterface, KeysInterface,
    LuaInterface, PubsubInterface,
};
#[cfg(feature = "fred")]
use fred::types::config::{ConnectionConfig, Options, PerformanceConfig};
#[cfg(feature = "fred")]
use fred::types::{Builder, RespVersion};
#[cfg(feature = "fred")]
use fred::types::{ClusterHash, CustomCommand};
#[cfg(feature = "fred")]
use std::sync::atomic::{AtomicBool, Ordering};
#[cfg(feature = "fred")]
use std::sync::Arc;
use tokio::sync::broadcast;
#[cfg(feature = "fred")]
use tokio::sync::Notify;

#[cfg(feature = "fred")]
use crate::engine::key_slot;
use crate::engine::{FromValue, Key, Message, ScanType, Server, Value};
use crate::error::{not_connected, Failure, RedisError, RedisErrorKind};

/// How a connection is made again: the crate's own in every build, converted to fred's here
/// ([`fred_policy`]).
pub(crate) use crate::engine::client::settings::ReconnectPolicy;
#[cfg(not(feature = "fred"))]
pub(crate) use crate::engine::client::settings::{Config, ServerConfig};
#[cfg(not(feature = "fred"))]
use absent::{Client, ClusterHash, Options, SubscriberClient};
/// What a client is configured with: fred's own configuration, which the public builder
/// takes; in a build without fred, the crate's own of the same shape.
#[cfg(feature = "fred")]
pub(crate) use fred::types::config::{Config, ServerConfig};

/// The client libraries' own types that the public builder and client take or hand out
/// (`LockClientBuilder::fred_client`, `redis_rs_client`, `LockClient::redis`): named here, so
/// that no file outside the seam names a client library.
#[cfg(feature = "fred")]
pub(crate) use fred::clients::Client as FredClient;
#[cfg(feature = "redis-rs")]
pub(crate) use redis::{Client as RedisRsClient, ConnectionInfo as RedisRsSettings};

/// The configuration of a fred client the service already has.
#[cfg(feature = "fred")]
pub(crate) fn fred_config_of(client: &FredClient) -> Config {
    client.client_config()
}

/// The connection settings of a redis-rs client the service already has.
#[cfg(feature = "redis-rs")]
pub(crate) fn redis_rs_settings_of(client: &RedisRsClient) -> RedisRsSettings {
    client.get_connection_info().clone()
}

/// Where a redis-rs client handed over connects, as host and port, for messages that name the
/// server (a Unix socket, refused when the client connects, by its path and port 0).
#[cfg(feature = "redis-rs")]
pub(crate) fn redis_rs_address(settings: &RedisRsSettings) -> (String, u16) {
    match settings.addr() {
        redis::ConnectionAddr::Tcp(host, port)
        | redis::ConnectionAddr::TcpTls { host, port, .. } => (host.clone(), *port),
        other => (other.to_string(), 0),
    }
}

/// fred's refusal to write a command a second time.
#[cfg(feature = "fred")]
const TOO_MANY_WRITES: &str = "Too many failed write attempts.";

/// fred's refusal to follow an `ASK` (a slot half moved to another master) when the command
/// has no attempt left: the server answered `ASK`, so the command did not run. fred then ends
/// its routing task: the client answers no call until it is started again.
#[cfg(feature = "fred")]
const ASK_REFUSED: &str = "Max attempts reached.";

/// What a [`Connection::call`] sends.
#[derive(Clone, Copy)]
pub(crate) enum Sent<'s> {
    /// A script, by its SHA1, and its text for when the server does not have it cached.
    Script { sha: &'s str, body: &'s str },
    /// One plain command: its name, then the call's keys, then its arguments.
    Command(&'static str),
}

/// Pub/sub messages buffered per subscriber before a slow reader loses some (and then wakes
/// every waiter). fred's default of 32 is easily outrun by a busy lock.
#[cfg(feature = "fred")]
const MESSAGE_BUFFER: usize = 4096;

/// Which client library a lock client's connections are made with.
#[derive(Clone, Debug)]
pub(crate) enum Library {
    #[cfg(feature = "fred")]
    Fred,
    /// redis-rs, with the connection settings of the service's own redis-rs client when it
    /// handed one over (its address, credentials and TLS), else the configuration's.
    #[cfg(feature = "redis-rs")]
    RedisRs(Option<Box<redis::ConnectionInfo>>),
}

/// The RESP version a lock client's connections speak, when the builder names one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Protocol {
    Resp2,
    Resp3,
}

/// Makes the connections of one lock client, all with the same settings: its command
/// connection, its subscriber, replica sync's own connections, and a connection to a sentinel.
pub(crate) struct Connector {
    config: Config,
    #[cfg(feature = "fred")]
    builder: Builder,
    /// With redis-rs: where its connections go, or why it cannot serve this configuration
    /// (refused by the first connection made).
    #[cfg(feature = "redis-rs")]
    redis_rs: Option<Result<redis_rs::Target, RedisError>>,
}

/// Where a Sentinel deployment's master is looked up.
pub(crate) struct Sentinels {
    pub(crate) hosts: Vec<Server>,
    pub(crate) service: String,
}

impl Connector {
    /// Connections made by `library` to what `config` names, over `protocol` (when `None`:
    /// fred's configuration's, or RESP3 on redis-rs),
    /// whose calls fail after `command_timeout` without a reply, reconnecting as
    /// `reconnect_policy` says.
    pub(crate) fn new(
        library: Library,
        #[cfg_attr(not(feature = "fred"), allow(unused_mut))] mut config: Config,
        protocol: Option<Protocol>,
        command_timeout: Duration,
        reconnect_policy: ReconnectPolicy,
    ) -> Connector {
        #[cfg(feature = "fred")]
        if let Some(protocol) = protocol {
            config.version = match protocol {
                Protocol::Resp2 => RespVersion::RESP2,
                Protocol::Resp3 => RespVersion::RESP3,
            };
        }
        #[cfg(feature = "fred")]
        let builder = fred_builder(&config, command_timeout, &reconnect_policy);
        #[cfg(feature = "redis-rs")]
        let redis_rs = match library {
            #[cfg(feature = "fred")]
            Library::Fred => None,
            Library::RedisRs(None) => Some(redis_rs_target(
                &config,
                protocol.map_or(redis::ProtocolVersion::RESP3, redis_rs_protocol),
                command_timeout,
                reconnect_policy,
            )),
            Library::RedisRs(Some(info)) => Some(redis_rs::Target::handed_over(
                *info,
                protocol.map(redis_rs_protocol),
                command_timeout,
                reconnect_policy,
            )),
        };
        #[cfg(not(feature = "redis-rs"))]
        let _ = protocol;
        #[cfg(not(feature = "redis-rs"))]
        let Library::Fred = library;
        Connector {
            config,
            #[cfg(feature = "fred")]
            builder,
            #[cfg(feature = "redis-rs")]
            redis_rs,
        }
    }

    pub(crate) fn is_clustered(&self) -> bool {
        self.config.server.is_clustered()
    }

    /// The configured servers (the sentinels, behind Sentinel), each `host:port`.
    pub(crate) fn hosts(&self) -> Vec<String> {
        self.config
            .server
            .hosts()
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    /// The sentinels and the service, behind Sentinel.
    pub(crate) fn sentinels(&self) -> Option<Sentinels> {
        match &self.config.server {
            ServerConfig::Sentinel {
                hosts,
                service_name,
                ..
            } => Some(Sentinels {
                hosts: hosts.clone(),
                service: service_name.clone(),
            }),
            _ => None,
        }
    }

    /// A command connection, not connected yet ([`Connection::connect`]).
    pub(crate) fn connection(&self) -> Result<Connection, RedisError> {
        #[cfg(feature = "redis-rs")]
        if let Some(target) = &self.redis_rs {
            return Ok(Connection::with(redis_rs_link(target.clone()?, false)?));
        }
        #[cfg(feature = "fred")]
        return Ok(Connection::new(self.builder.build()?));
        #[cfg(not(feature = "fred"))]
        Err(without_fred())
    }

    /// A subscriber, not connected yet ([`Subscriber::connect`]).
    pub(crate) fn subscriber(&self) -> Result<Subscriber, RedisError> {
        #[cfg(feature = "redis-rs")]
        if let Some(target) = &self.redis_rs {
            return Ok(Subscriber {
                link: redis_rs_link(target.clone()?.subscribing(), true)?,
            });
        }
        #[cfg(feature = "fred")]
        return Ok(Subscriber {
            link: Link::Fred(self.builder.build_subscriber_client()?),
        });
        #[cfg(not(feature = "fred"))]
        Err(without_fred())
    }

    /// A connection to `sentinel` that both subscribes and asks (RESP3), with the sentinels'
    /// own credentials, or the servers' when they have none of their own (as fred connects to
    /// them), and TLS when the servers speak it. Its calls fail after `timeout`; it never
    /// reconnects. Not connected yet ([`Connection::connect`]).
    pub(crate) fn sentinel(
        &self,
        sentinel: &Server,
        timeout: Duration,
    ) -> Result<Connection, RedisError> {
        #[cfg(feature = "redis-rs")]
        if self.redis_rs.is_some() {
            let (username, password) = match &self.config.server {
                ServerConfig::Sentinel {
                    username, password, ..
                } => (username.as_deref(), password.as_deref()),
                _ => (None, None),
            };
            // One attempt: a sentinel that goes away ends the watch, which moves on to the
            // next sentinel with a connection of its own.
            let once = ReconnectPolicy::new_constant(1, 0);
            let target = redis_rs::Target::new(
                sentinel.clone(),
                sentinel_login(&self.config, username, password),
                timeout,
                once,
            )?;
            return Ok(Connection::with(Link::RedisRs(redis_rs::Link::new(target))));
        }
        #[cfg(not(feature = "fred"))]
        {
            let _ = (sentinel, timeout);
            Err(without_fred())
        }
        #[cfg(feature = "fred")]
        self.fred_sentinel(sentinel, timeout)
    }

    #[cfg(feature = "fred")]
    fn fred_sentinel(
        &self,
        sentinel: &Server,
        timeout: Duration,
    ) -> Result<Connection, RedisError> {
        let (username, password) = match &self.config.server {
            ServerConfig::Sentinel {
                username, password, ..
            } => (username.clone(), password.clone()),
            _ => (None, None),
        };
        let config = Config {
            server: ServerConfig::Centralized {
                server: sentinel.clone(),
            },
            username: username.or_else(|| self.config.username.clone()),
            password: password.or_else(|| self.config.password.clone()),
            // RESP3, so that the connection can ask who the master is while it is subscribed.
            version: RespVersion::RESP3,
            #[cfg(any(feature = "tls-rustls", feature = "tls-native-tls"))]
            tls: self.config.tls.clone(),
            ..Config::default()
        };
        let client = Builder::from_config(config)
            .with_performance_config(|performance| {
                performance.default_command_timeout = timeout;
            })
            .build()?;
        Ok(Connection::new(client))
    }
}

/// fred's builder of a client's connections: calls fail after `command_timeout` without a
/// reply, connections come back as `reconnect_policy` says.
#[cfg(feature = "fred")]
fn fred_builder(
    config: &Config,
    command_timeout: Duration,
    reconnect_policy: &ReconnectPolicy,
) -> Builder {
    let performance = PerformanceConfig {
        default_command_timeout: command_timeout,
        broadcast_channel_capacity: MESSAGE_BUFFER,
        ..PerformanceConfig::default()
    };
    // One attempt per command: fred would otherwise send an in-flight script again after a
    // reconnect, and a reentrant acquire or release must not run twice.
    let connection = ConnectionConfig {
        max_command_attempts: 1,
        ..ConnectionConfig::default()
    };
    let mut builder = Builder::from_config(config.clone());
    builder
        .set_performance_config(performance)
        .set_connection_config(connection)
        .set_policy(fred_policy(reconnect_policy));
    builder
}

/// `policy` in fred's words.
#[cfg(feature = "fred")]
pub(crate) fn fred_policy(policy: &ReconnectPolicy) -> fred::types::config::ReconnectPolicy {
    use crate::engine::client::settings::Shape;
    use fred::types::config::ReconnectPolicy as Fred;
    let attempts = policy.max_attempts;
    let mut fred = match policy.shape {
        Shape::Constant { delay } => Fred::new_constant(attempts, delay),
        Shape::Linear { max_delay, delay } => Fred::new_linear(attempts, max_delay, delay),
        Shape::Exponential {
            min_delay,
            max_delay,
            base,
        } => Fred::new_exponential(attempts, min_delay, max_delay, base),
    };
    fred.set_jitter(policy.jitter);
    fred
}

/// fred's policy, for a service that has one already: the builder takes it as the crate's own.
#[cfg(feature = "fred")]
impl From<fred::types::config::ReconnectPolicy> for ReconnectPolicy {
    fn from(fred: fred::types::config::ReconnectPolicy) -> ReconnectPolicy {
        use fred::types::config::ReconnectPolicy as Fred;
        let (mut policy, jitter) = match fred {
            Fred::Constant {
                max_attempts,
                delay,
                jitter,
                ..
            } => (ReconnectPolicy::new_constant(max_attempts, delay), jitter),
            Fred::Linear {
                max_attempts,
                max_delay,
                delay,
                jitter,
                ..
            } => (
                ReconnectPolicy::new_linear(max_attempts, max_delay, delay),
                jitter,
            ),
            Fred::Exponential {
                max_attempts,
                min_delay,
                max_delay,
                base,
                jitter,
                ..
            } => (
                ReconnectPolicy::new_exponential(max_attempts, min_delay, max_delay, base),
                jitter,
            ),
        };
        policy.set_jitter(jitter);
        policy
    }
}

/// fred's place in a build without it: a type of which no value exists, so that the seam is
/// written once and the compiler sees that fred's arms are never taken.
#[cfg(not(feature = "fred"))]
mod absent {
    use crate::engine::Server;

    #[derive(Clone)]
    pub(crate) enum Client {}

    /// Where a call goes on a cluster, in fred's words (read by fred alone, so far).
    #[derive(Clone, Default)]
    #[allow(dead_code)]
    pub(crate) struct Options {
        pub(crate) cluster_node: Option<Server>,
        pub(crate) cluster_hash: Option<ClusterHash>,
    }

    #[derive(Clone)]
    #[allow(dead_code)]
    pub(crate) enum ClusterHash {
        Custom(u16),
    }

    pub(crate) type SubscriberClient = Client;

    impl Client {
        pub(crate) fn absent(&self) -> ! {
            match *self {}
        }
    }
}

/// A connection asked of fred in a build without it.
#[cfg(not(feature = "fred"))]
fn without_fred() -> RedisError {
    RedisError::new(
        RedisErrorKind::Refused,
        Failure::Other("invalid client config".into()),
        "fredlock was built without feature fred: use Backend::RedisRs",
    )
}

/// A redis-rs link to `target`: one server's, or a cluster's (`subscribes`: a subscriber's).
#[cfg(feature = "redis-rs")]
fn redis_rs_link<C>(target: redis_rs::Target, subscribes: bool) -> Result<Link<C>, RedisError> {
    Ok(if target.seeds().is_some() {
        Link::RedisRsCluster(redis_rs_cluster::Cluster::new(target, subscribes)?)
    } else {
        Link::RedisRs(redis_rs::Link::new(target))
    })
}

/// What redis-rs connects to for `config`: one server (over TLS for a TLS URL), the master
/// behind Sentinel, or a cluster.
#[cfg(feature = "redis-rs")]
fn redis_rs_target(
    config: &Config,
    protocol: redis::ProtocolVersion,
    command_timeout: Duration,
    policy: ReconnectPolicy,
) -> Result<redis_rs::Target, RedisError> {
    let login = redis_rs::Login {
        username: config.username.as_deref(),
        password: config.password.as_deref(),
        database: config.database,
        tls: config.uses_tls(),
        protocol,
    };
    match &config.server {
        ServerConfig::Centralized { server } => {
            redis_rs::Target::new(server.clone(), login, command_timeout, policy)
        }
        ServerConfig::Sentinel {
            hosts,
            service_name,
            username,
            password,
        } => redis_rs::Target::behind_sentinels(
            hosts.clone(),
            service_name.clone(),
            sentinel_login(config, username.as_deref(), password.as_deref()),
            login,
            command_timeout,
            policy,
        ),
        ServerConfig::Clustered { hosts, .. } => {
            redis_rs::Target::cluster(hosts.clone(), login, command_timeout, policy)
        }
        #[allow(unreachable_patterns)]
        _ => Err(not_yet("this server configuration")),
    }
}

/// How redis-rs logs in to a sentinel: with the sentinels' own credentials, or the servers'
/// when they have none of their own (as fred does), over TLS when the servers speak it.
#[cfg(feature = "redis-rs")]
fn sentinel_login<'c>(
    config: &'c Config,
    username: Option<&'c str>,
    password: Option<&'c str>,
) -> redis_rs::Login<'c> {
    let (username, password) = match password {
        Some(password) => (username, Some(password)),
        None => (config.username.as_deref(), config.password.as_deref()),
    };
    redis_rs::Login {
        username,
        password,
        database: None,
        tls: config.uses_tls(),
        // The watch subscribes and asks on one connection, which RESP2 cannot.
        protocol: redis::ProtocolVersion::RESP3,
    }
}

/// redis-rs's name for `protocol`.
#[cfg(feature = "redis-rs")]
fn redis_rs_protocol(protocol: Protocol) -> redis::ProtocolVersion {
    match protocol {
        Protocol::Resp2 => redis::ProtocolVersion::RESP2,
        Protocol::Resp3 => redis::ProtocolVersion::RESP3,
    }
}

/// `$fred` on fred's client, or `$other` on another library's link.
macro_rules! either {
    ($link:expr, |$client:ident| $fred:expr, |$other_link:ident| $other:expr) => {
        match $link {
            #[cfg(feature = "fred")]
            Link::Fred($client) => $fred,
            #[cfg(not(feature = "fred"))]
            Link::Fred(absent) => absent.absent(),
            #[cfg(feature = "redis-rs")]
            Link::RedisRs($other_link) => $other,
            #[cfg(feature = "redis-rs")]
            Link::RedisRsCluster($other_link) => $other,
        }
    };
}

/// The client library under a [`Connection`] (`C`: fred's `Client`) or a [`Subscriber`]
/// (fred's `SubscriberClient`).
#[derive(Clone)]
enum Link<C> {
    // Never made in a build without fred, where `C` has no values.
    #[cfg_attr(not(feature = "fred"), allow(dead_code))]
    Fred(C),
    #[cfg(feature = "redis-rs")]
    RedisRs(redis_rs::Link),
    /// A cluster on redis-rs: a link per master.
    #[cfg(feature = "redis-rs")]
    RedisRsCluster(redis_rs_cluster::Cluster),
}

/// The methods of [`Link`], for fred's clients or for fred's absence.
macro_rules! link_methods {
    () => {
        /// Connects (and returns once connected, or with why it could not).
        async fn connect(&self) -> Result<(), RedisError> {
            either!(
                self,
                |client| {
                    let task = client.init().await?;
                    keep_routing(client.clone(), task);
                    Ok(())
                },
                |link| link.connect().await
            )
        }

        fn is_connected(&self) -> bool {
            either!(self, |client| client.is_connected(), |link| link
                .is_connected())
        }

        fn messages(&self) -> broadcast::Receiver<Message> {
            either!(self, |client| client.message_rx(), |link| link.messages())
        }

        fn reconnects(&self) -> Reconnects {
            either!(self, |client| client.reconnect_rx(), |link| link
                .reconnects())
        }

        fn connected_to(&self) -> Vec<Server> {
            either!(self, |client| client.active_connections(), |link| link
                .connected_to())
        }

        async fn reconnect(&self) {
            either!(
                self,
                |client| {
                    let _ = client.force_reconnection().await;
                },
                |link| link.reconnect().await
            )
        }

        async fn quit(&self) {
            either!(
                self,
                |client| {
                    let _ = client.quit().await;
                },
                |link| link.quit().await
            )
        }
    };
}

/// Starts fred's routing task again when it ended on an `ASK` it could not follow (fred sends
/// each command once, `max_command_attempts` 1, and has no attempt left for the `ASKING` an
/// `ASK` needs; it then disconnects and ends the task, and every later call would time out).
/// Any other end (the client quit, the reconnect policy gave up) is left as fred leaves it.
#[cfg(feature = "fred")]
fn keep_routing<C: ClientLike + Clone + Send + Sync + 'static>(
    client: C,
    task: fred::types::ConnectHandle,
) {
    tokio::spawn(async move {
        let mut task = task;
        loop {
            match task.await {
                Ok(Err(error)) if error.details() == ASK_REFUSED => {
                    tracing::warn!(client = %client.id(), "fred stopped routing after an ASK it could not follow (a slot being moved); connecting again");
                    match client.init().await {
                        Ok(next) => task = next,
                        Err(error) => {
                            tracing::error!(client = %client.id(), %error, "could not connect again after an ASK");
                            return;
                        }
                    }
                }
                _ => return,
            }
        }
    });
}

/// Keeps `dropped` true from fred's report that its connection to `client`'s one server
/// dropped until fred reports a new one. fred itself counts as connected until its first
/// reconnect attempt, one reconnect delay after the drop (100-200 ms with the default policy,
/// longer with a user's), and a call sent in that time waits for the reconnect or the command
/// timeout: the engine asks [`Connection::is_connected`] to fail such a call at once. Errors
/// are read before reconnects, so a drop and the reconnect after it, both unread, leave it
/// false. A cluster's nodes drop one at a time, each without the others: not followed.
#[cfg(feature = "fred")]
fn follow_drops(client: &Client, dropped: &Arc<Dropped>) {
    let mut errors = client.error_rx();
    let mut reconnects = client.reconnect_rx();
    // Not the client: the task ends when fred closes its channels as the client goes away,
    // or when the connection is gone.
    let dropped = Arc::downgrade(dropped);
    tokio::spawn(async move {
        loop {
            let now = tokio::select! {
                biased;
                error = errors.recv() => match error {
                    // A connection's own error: it dropped. Without a server: a reconnect
                    // failed, while fred already counts itself not connected.
                    Ok((_, Some(_))) => true,
                    Ok((_, None)) | Err(broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                reconnect = reconnects.recv() => match reconnect {
                    Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => false,
                    Err(broadcast::error::RecvError::Closed) => return,
                },
            };
            let Some(dropped) = dropped.upgrade() else {
                return;
            };
            dropped.now.store(now, Ordering::Release);
            if !now {
                dropped.back.notify_waiters();
            }
        }
    });
}

/// A fred connection's drop, as [`follow_drops`] follows it.
#[cfg(feature = "fred")]
struct Dropped {
    /// True from a drop until the reconnect after it (an atomic: every attempt reads it).
    now: AtomicBool,
    /// Told when `now` turns false.
    back: Notify,
    /// Whether a task follows it (started by the first `connect`).
    followed: AtomicBool,
}

#[cfg(feature = "fred")]
impl Dropped {
    /// Returns once `now` is false.
    async fn back(&self) {
        loop {
            // Made before the look, so a reconnect told between the two is not missed.
            let told = self.back.notified();
            if !self.now.load(Ordering::Acquire) {
                return;
            }
            told.await;
        }
    }
}

/// What a connection and a subscriber do alike: connect, follow their connections, close.
#[cfg(feature = "fred")]
impl<C: ClientLike + EventInterface + Clone + Sync + 'static> Link<C> {
    link_methods!();
}

/// The same in a build without fred (where a connection's and a subscriber's placeholder for
/// fred are one type).
#[cfg(not(feature = "fred"))]
impl Link<Client> {
    link_methods!();
}

/// A command connection (on a cluster, one per master): every script call, command and read the
/// crate sends goes through one. Clones share the connection.
///
/// Each call goes where its first key's slot is served, unless the connection was pointed at a
/// node ([`on_node`](Self::on_node)) or a slot ([`on_slot`](Self::on_slot)). Each call's error is
/// a [`RedisError`], sorted once here.
///
/// Each method matches on the client library and awaits that library's own future in place:
/// no future of the seam's own stands between a caller's and the library's, so the futures of
/// a caller's call nest no deeper than they would without the seam (rustc's query depth, which
/// a caller's `async fn` reaches at about 128 nested futures).
#[derive(Clone)]
pub(crate) struct Connection {
    link: Link<Client>,
    /// Whether fred's connection to its one server (standalone or behind Sentinel) dropped
    /// and has not been made again, shared by clones: see [`follow_drops`].
    #[cfg(feature = "fred")]
    dropped: Arc<Dropped>,
    /// Where every call goes on a cluster when it is not its first key's slot (read by fred
    /// alone, so far).
    #[cfg_attr(not(feature = "fred"), allow(dead_code))]
    route: Option<Options>,
}

/// Runs `$fred` on fred's client `$on`, routed as the connection says, and sorts the error.
#[cfg(feature = "fred")]
macro_rules! on_fred {
    ($connection:expr, $on:expr, |$client:ident| $fred:expr) => {
        match &$connection.route {
            None => {
                let $client = $on;
                $fred.await.map_err(RedisError::from)
            }
            Some(options) => {
                let $client = &$on.with_options(options);
                $fred.await.map_err(RedisError::from)
            }
        }
    };
}

/// Runs `$fred` on the connection's fred client, routed as the connection says, or `$other`
/// on another library's link, and sorts the error.
macro_rules! routed {
    ($connection:expr, |$client:ident| $fred:expr, |$link:ident| $other:expr) => {{
        match &$connection.link {
            #[cfg(feature = "fred")]
            Link::Fred(on) => on_fred!($connection, on, |$client| $fred),
            #[cfg(not(feature = "fred"))]
            Link::Fred(absent) => absent.absent(),
            #[cfg(feature = "redis-rs")]
            Link::RedisRs($link) => $other.await,
            #[cfg(feature = "redis-rs")]
            Link::RedisRsCluster(cluster) => {
                let $link = cluster.pinned(pin(&$connection.route));
                $other.await
            }
        }
    }};
}

/// Where a connection pointed at a node or a slot sends its calls, on a redis-rs cluster.
#[cfg(feature = "redis-rs")]
fn pin(route: &Option<Options>) -> Option<redis_rs_cluster::Pin> {
    let route = route.as_ref()?;
    if let Some(node) = &route.cluster_node {
        return Some(redis_rs_cluster::Pin::Node(node.clone()));
    }
    match &route.cluster_hash {
        Some(ClusterHash::Custom(slot)) => Some(redis_rs_cluster::Pin::Slot(*slot)),
        _ => None,
    }
}

/// The announcements of a connection's reconnects: one per new connection (the node it reached),
/// before anything is sent on it; closed when the client quits.
pub(crate) type Reconnects = broadcast::Receiver<Server>;

impl Connection {
    #[cfg(feature = "fred")]
    pub(crate) fn new(client: Client) -> Connection {
        Connection::with(Link::Fred(client))
    }

    fn with(link: Link<Client>) -> Connection {
        Connection {
            link,
            #[cfg(feature = "fred")]
            dropped: Arc::new(Dropped {
                now: AtomicBool::new(false),
                back: Notify::new(),
                followed: AtomicBool::new(false),
            }),
            route: None,
        }
    }

    /// Connects (and returns once connected, or with why it could not).
    pub(crate) async fn connect(&self) -> Result<(), RedisError> {
        #[cfg(feature = "fred")]
        if let Some(client) = self.fred() {
            if !client.is_clustered() && !self.dropped.followed.swap(true, Ordering::Relaxed) {
                follow_drops(client, &self.dropped);
            }
        }
        self.link.connect().await
    }

    /// The pub/sub messages of a connection that subscribes (a sentinel's).
    pub(crate) fn messages(&self) -> broadcast::Receiver<Message> {
        self.link.messages()
    }

    /// `SUBSCRIBE channel` on a connection that also asks (a sentinel's, RESP3).
    pub(crate) async fn subscribe(&self, channel: &str) -> Result<(), RedisError> {
        either!(
            &self.link,
            |client| Ok(client.subscribe(channel).await?),
            |link| link.subscribe(vec![channel.to_owned()]).await
        )
    }

    /// fred's client under this connection, for the public API that hands it out; `None` on
    /// another library.
    #[cfg(feature = "fred")]
    pub(crate) fn fred(&self) -> Option<&Client> {
        either!(&self.link, |client| Some(client), |_link| None)
    }

    /// This connection, sending every call to `node` (on a cluster; elsewhere, to the server).
    pub(crate) fn on_node(&self, node: Server) -> Connection {
        Connection {
            link: self.link.clone(),
            #[cfg(feature = "fred")]
            dropped: self.dropped.clone(),
            route: Some(Options {
                cluster_node: Some(node),
                ..Options::default()
            }),
        }
    }

    /// This connection, sending every call to the master of `slot` (on a cluster).
    pub(crate) fn on_slot(&self, slot: u16) -> Connection {
        Connection {
            link: self.link.clone(),
            #[cfg(feature = "fred")]
            dropped: self.dropped.clone(),
            route: Some(Options {
                cluster_hash: Some(ClusterHash::Custom(slot)),
                ..Options::default()
            }),
        }
    }

    /// Whether it is connected now (it reconnects in the background).
    pub(crate) fn is_connected(&self) -> bool {
        #[cfg(feature = "fred")]
        if self.dropped.now.load(Ordering::Acquire) {
            return false;
        }
        self.link.is_connected()
    }

    /// A call made on a connection to one server that knows it has none is not sent: it fails
    /// at once, never sent, whatever the client library (fred would hold it back until it
    /// reconnects or the command timeout passes). One outage rule for every public call
    /// (lib.rs's "Outages"): each asks this before its first command; the reads here ask it
    /// themselves. What the engine sends in the background (releases of dropped guards,
    /// leaves, settles, renewals) waits for the connection instead, within the command timeout
    /// (`script::write`). A cluster's nodes come and go one at a time, each call routed to its
    /// own: left to the library.
    #[inline]
    pub(crate) fn refused_unconnected(&self) -> Result<(), RedisError> {
        if self.is_clustered() || self.is_connected() {
            Ok(())
        } else {
            Err(not_connected())
        }
    }

    /// Returns once it is connected (at once when it is).
    pub(crate) async fn wait_for_connect(&self) {
        either!(
            &self.link,
            |client| {
                let _ = client.wait_for_connect().await;
                self.dropped.back().await;
            },
            |link| link.wait_for_connect().await
        )
    }

    pub(crate) fn is_clustered(&self) -> bool {
        either!(&self.link, |client| client.is_clustered(), |link| link
            .is_clustered())
    }

    /// The service it finds its master under, behind Sentinel.
    pub(crate) fn sentinel_service(&self) -> Option<String> {
        either!(
            &self.link,
            |client| match &client.client_config().server {
                ServerConfig::Sentinel { service_name, .. } => Some(service_name.clone()),
                _ => None,
            },
            |link| link.sentinel_service()
        )
    }

    /// The server's major version, once the connection has read it.
    pub(crate) fn server_major(&self) -> Option<u64> {
        either!(
            &self.link,
            |client| client.server_version().map(|version| version.major),
            |link| link.server_major()
        )
    }

    /// How long a call waits for its reply before it fails with a lost reply.
    pub(crate) fn command_timeout(&self) -> Duration {
        either!(
            &self.link,
            |client| client.perf_config().default_command_timeout,
            |link| link.command_timeout()
        )
    }

    /// The announcements of its new connections from now on.
    pub(crate) fn reconnects(&self) -> Reconnects {
        self.link.reconnects()
    }

    /// The nodes it is connected to now (each master's, on a cluster).
    pub(crate) fn connected_to(&self) -> Vec<Server> {
        self.link.connected_to()
    }

    /// The masters of a cluster, as its routing table has them; none outside one.
    pub(crate) fn masters(&self) -> Vec<Server> {
        either!(
            &self.link,
            |client| client
                .cached_cluster_state()
                .map(|state| state.unique_primary_nodes())
                .unwrap_or_default(),
            |link| link.masters()
        )
    }

    /// Drops its connections and connects again (to where the configuration now says).
    pub(crate) async fn reconnect(&self) {
        self.link.reconnect().await
    }

    /// Closes it; calls after this fail.
    pub(crate) async fn quit(&self) {
        self.link.quit().await
    }

    /// One call of a script (`EVALSHA`, then `EVAL` when the server does not have it cached) or
    /// a plain command (its name, the keys, the arguments), with the keys and arguments `call`
    /// makes: once, and a second time only for the `EVAL`.
    pub(crate) async fn call<R: FromValue>(
        &self,
        sent: Sent<'_>,
        call: &impl Fn() -> (Vec<Key>, Vec<Value>),
    ) -> Result<R, RedisError> {
        match &self.link {
            #[cfg(not(feature = "fred"))]
            Link::Fred(absent) => absent.absent(),
            #[cfg(feature = "redis-rs")]
            Link::RedisRs(link) => link.call(sent, call).await,
            #[cfg(feature = "redis-rs")]
            Link::RedisRsCluster(cluster) => {
                cluster.pinned(pin(&self.route)).call(sent, call).await
            }
            #[cfg(feature = "fred")]
            Link::Fred(on) => {
                let (keys, args) = call();
                match sent {
                    Sent::Command(name) => {
                        let mut command: Vec<Value> = keys.into_iter().map(Value::from).collect();
                        command.extend(args);
                        let name = CustomCommand::new_static(name, ClusterHash::FirstKey, false);
                        on_fred!(self, on, |client| client.custom::<R, Value>(name, command))
                    }
                    Sent::Script { sha, body } => {
                        match on_fred!(self, on, |client| client
                            .evalsha::<R, _, _, _>(sha, keys, args))
                        {
                            Err(error) if error.details().starts_with("NOSCRIPT") => {
                                let (keys, args) = call();
                                on_fred!(self, on, |client| client
                                    .eval::<R, _, _, _>(body, keys, args))
                            }
                            other => other,
                        }
                    }
                }
            }
        }
    }

    /// One command, `name` then `args`, routed by its first argument as a key.
    pub(crate) async fn command<R: FromValue>(
        &self,
        name: &'static str,
        args: Vec<Value>,
    ) -> Result<R, RedisError> {
        self.refused_unconnected()?;
        routed!(
            self,
            |client| client.custom::<R, Value>(
                CustomCommand::new_static(name, ClusterHash::FirstKey, false),
                args
            ),
            |link| link.command::<R>(name, &args)
        )
    }

    /// Commands sent together, each `name` then its arguments (the first a key), with each one's
    /// reply or error, in order.
    pub(crate) async fn pipeline(
        &self,
        commands: Vec<(&'static str, Vec<Value>)>,
    ) -> Result<Vec<Result<Value, RedisError>>, RedisError> {
        self.refused_unconnected()?;
        match &self.link {
            #[cfg(not(feature = "fred"))]
            Link::Fred(absent) => absent.absent(),
            #[cfg(feature = "redis-rs")]
            Link::RedisRs(link) => link.pipeline(commands).await,
            #[cfg(feature = "redis-rs")]
            Link::RedisRsCluster(cluster) => {
                cluster.pinned(pin(&self.route)).pipeline(commands).await
            }
            #[cfg(feature = "fred")]
            Link::Fred(client) => {
                let pipeline = client.pipeline();
                for (name, args) in commands {
                    let name = CustomCommand::new_static(name, ClusterHash::FirstKey, false);
                    let () = pipeline.custom(name, args).await?;
                }
                Ok(pipeline
                    .try_all::<Value>()
                    .await
                    .into_iter()
                    .map(|reply| reply.map_err(RedisError::from))
                    .collect())
            }
        }
    }

    /// `GET key`.
    pub(crate) async fn get<R: FromValue>(
        &self,
        key: impl Into<Key> + Send,
    ) -> Result<R, RedisError> {
        self.refused_unconnected()?;
        routed!(self, |client| client.get::<R, _>(key), |link| link
            .command::<R>("GET", &[Value::from(key.into())]))
    }

    /// `HGET key field`.
    pub(crate) async fn hget<R: FromValue>(
        &self,
        key: impl Into<Key> + Send,
        field: &str,
    ) -> Result<R, RedisError> {
        self.refused_unconnected()?;
        routed!(self, |client| client.hget::<R, _, _>(key, field), |link| {
            link.command::<R>("HGET", &[Value::from(key.into()), Value::from(field)])
        })
    }

    /// `TYPE key`: `none` when there is no key.
    pub(crate) async fn key_type(&self, key: impl Into<Key> + Send) -> Result<String, RedisError> {
        self.refused_unconnected()?;
        routed!(self, |client| client.r#type::<String, _>(key), |link| {
            link.command::<String>("TYPE", &[Value::from(key.into())])
        })
    }

    /// `PTTL key`: -2 when there is no key, -1 when it never expires.
    pub(crate) async fn pttl(&self, key: impl Into<Key> + Send) -> Result<i64, RedisError> {
        self.refused_unconnected()?;
        routed!(self, |client| client.pttl::<i64, _>(key), |link| link
            .command::<i64>("PTTL", &[Value::from(key.into())]))
    }

    /// How many subscribers `channel` has (`PUBSUB NUMSUB`, or `PUBSUB SHARDNUMSUB` when
    /// `sharded`), as the reply's pair.
    // Without fred, the two branches are redis-rs's one command.
    #[cfg_attr(not(feature = "fred"), allow(clippy::if_same_then_else))]
    pub(crate) async fn subscribers(
        &self,
        channel: &str,
        sharded: bool,
    ) -> Result<Vec<Value>, RedisError> {
        if sharded {
            self.refused_unconnected()?;
            routed!(
                self,
                |client| client.pubsub_shardnumsub::<Vec<Value>, _>(channel),
                |link| link.command::<Vec<Value>>(
                    "PUBSUB",
                    &[Value::from(which(sharded)), Value::from(channel)]
                )
            )
        } else {
            routed!(
                self,
                |client| client.pubsub_numsub::<Vec<Value>, _>(channel),
                |link| link.command::<Vec<Value>>(
                    "PUBSUB",
                    &[Value::from(which(sharded)), Value::from(channel)]
                )
            )
        }
    }

    /// One page of `SCAN cursor MATCH pattern COUNT count [TYPE of_type]` on the node: the next
    /// cursor ("0" at the end) and the keys.
    pub(crate) async fn scan_page(
        &self,
        cursor: String,
        pattern: &str,
        count: u32,
        of_type: Option<ScanType>,
    ) -> Result<(String, Vec<String>), RedisError> {
        match &self.link {
            #[cfg(not(feature = "fred"))]
            Link::Fred(absent) => absent.absent(),
            #[cfg(feature = "redis-rs")]
            Link::RedisRs(link) => link.scan_page(cursor, pattern, count, of_type).await,
            #[cfg(feature = "redis-rs")]
            Link::RedisRsCluster(cluster) => {
                cluster
                    .pinned(pin(&self.route))
                    .scan_page(cursor, pattern, count, of_type)
                    .await
            }
            #[cfg(feature = "fred")]
            Link::Fred(on) => {
                on_fred!(self, on, |client| client
                    .scan_page::<(String, Vec<String>), _, _>(
                        cursor,
                        pattern,
                        Some(count),
                        of_type
                    ))
            }
        }
    }

    /// `CLIENT SETNAME name`.
    pub(crate) async fn set_name(&self, name: &str) -> Result<(), RedisError> {
        routed!(self, |client| client.client_setname(name), |link| link
            .command::<()>(
                "CLIENT",
                &[Value::from("SETNAME"), Value::from(name)]
            ))
    }

    /// `CLIENT LIST`.
    pub(crate) async fn client_list(&self) -> Result<String, RedisError> {
        routed!(
            self,
            |client| client.client_list::<String, String>(None, None),
            |link| link.command::<String>("CLIENT", &[Value::from("LIST")])
        )
    }
}

/// `PUBSUB`'s subcommand that counts a channel's subscribers.
#[cfg(feature = "redis-rs")]
fn which(sharded: bool) -> &'static str {
    if sharded {
        "SHARDNUMSUB"
    } else {
        "NUMSUB"
    }
}

/// What another library does not serve yet, refused before anything is sent.
#[cfg(feature = "redis-rs")]
fn not_yet(what: &str) -> RedisError {
    RedisError::new(
        RedisErrorKind::Refused,
        Failure::Other("invalid client config".into()),
        format!("the redis-rs backend does not serve {what} yet; use Backend::Fred there"),
    )
}

/// The connection pub/sub messages come in on (on a cluster, one per node it listens on), and
/// the subscriptions it keeps: classic channels, or sharded ones on the node of each channel's
/// slot. Clones share it.
#[derive(Clone)]
pub(crate) struct Subscriber {
    link: Link<SubscriberClient>,
}

/// The messages of a [`Subscriber`], as they come in.
pub(crate) type Messages = broadcast::Receiver<Message>;

impl Subscriber {
    /// Connects (and returns once connected, or with why it could not).
    pub(crate) async fn connect(&self) -> Result<(), RedisError> {
        self.link.connect().await
    }

    /// Subscribes `channels` (`SUBSCRIBE`), and returns once the server has the subscriptions.
    ///
    /// fred completes a `SUBSCRIBE` as soon as it is written, not when Redis has processed it.
    /// A waiter told "subscribed" too early would make its second attempt (on the other
    /// connection) possibly before the subscription exists, and miss an unlock published in
    /// between. Redis runs one connection's commands in order, so a `PING` behind the
    /// `SUBSCRIBE`, on the same connection (in a cluster, the node fred sends subscriptions
    /// to), answers only once it took effect. redis-rs (RESP3) returns on the server's reply.
    pub(crate) async fn subscribe(&self, channels: Vec<String>) -> Result<(), RedisError> {
        match &self.link {
            #[cfg(not(feature = "fred"))]
            Link::Fred(absent) => absent.absent(),
            #[cfg(feature = "redis-rs")]
            Link::RedisRs(link) => link.subscribe(channels).await,
            #[cfg(feature = "redis-rs")]
            Link::RedisRsCluster(cluster) => cluster.subscribe(channels).await,
            #[cfg(feature = "fred")]
            Link::Fred(client) => {
                client.subscribe(channels).await?;
                let options = Options {
                    cluster_hash: client
                        .is_clustered()
                        .then(|| ClusterHash::Custom(key_slot(client.id().as_bytes()))),
                    ..Options::default()
                };
                client.with_options(&options).ping::<Value>(None).await?;
                Ok(())
            }
        }
    }

    /// Subscribes sharded `channels`, all of one slot (`SSUBSCRIBE` on the slot's node), and
    /// returns once the server has them (fred completes an `SSUBSCRIBE` on its reply: it never
    /// pipelines one, so that it can follow a `MOVED`).
    pub(crate) async fn ssubscribe(&self, channels: Vec<String>) -> Result<(), RedisError> {
        either!(
            &self.link,
            |client| Ok(client.ssubscribe(channels).await?),
            |link| link.ssubscribe(channels).await
        )
    }

    /// `UNSUBSCRIBE channels`.
    pub(crate) async fn unsubscribe(&self, channels: Vec<String>) -> Result<(), RedisError> {
        either!(
            &self.link,
            |client| Ok(client.unsubscribe(channels).await?),
            |link| link.unsubscribe(channels).await
        )
    }

    /// `SUNSUBSCRIBE channels`, all of one slot.
    pub(crate) async fn sunsubscribe(&self, channels: Vec<String>) -> Result<(), RedisError> {
        either!(
            &self.link,
            |client| Ok(client.sunsubscribe(channels).await?),
            |link| link.sunsubscribe(channels).await
        )
    }

    /// Whether it can take sharded channels: not on redis-rs over RESP2, whose pub/sub knows
    /// only classic ones.
    pub(crate) fn shards(&self) -> bool {
        match &self.link {
            #[cfg(not(feature = "fred"))]
            Link::Fred(absent) => absent.absent(),
            #[cfg(feature = "fred")]
            Link::Fred(_) => true,
            #[cfg(feature = "redis-rs")]
            Link::RedisRs(link) => link.shards(),
            #[cfg(feature = "redis-rs")]
            Link::RedisRsCluster(cluster) => cluster.shards(),
        }
    }

    /// The classic channels the library itself subscribes again after a reconnect (none on a
    /// library that leaves that to the engine).
    pub(crate) fn tracked_channels(&self) -> Vec<String> {
        either!(
            &self.link,
            |client| client
                .tracked_channels()
                .into_iter()
                .map(|channel| channel.to_string())
                .collect(),
            |_link| Vec::new()
        )
    }

    /// The node that serves `slot`, as its routing table says (none outside a cluster).
    #[cfg_attr(not(feature = "fred"), allow(unused_variables))]
    pub(crate) fn slot_owner(&self, slot: u16) -> Option<Server> {
        either!(
            &self.link,
            |client| client.cached_cluster_state()?.get_server(slot).cloned(),
            |link| link.slot_owner(slot)
        )
    }

    /// Reads the cluster's slots again.
    pub(crate) async fn refresh_slots(&self) -> Result<(), RedisError> {
        either!(
            &self.link,
            |client| Ok(client.sync_cluster().await?),
            |link| link.refresh_slots().await
        )
    }

    /// The messages from now on.
    pub(crate) fn messages(&self) -> Messages {
        self.link.messages()
    }

    /// The announcements of its new connections from now on.
    pub(crate) fn reconnects(&self) -> Reconnects {
        self.link.reconnects()
    }

    /// The nodes it is connected to now.
    pub(crate) fn connected_to(&self) -> Vec<Server> {
        self.link.connected_to()
    }

    /// Drops its connections and connects again (to where the configuration now says).
    pub(crate) async fn reconnect(&self) {
        self.link.reconnect().await
    }

    /// Closes it.
    pub(crate) async fn quit(&self) {
        self.link.quit().await
    }
}

#[cfg(feature = "fred")]
impl From<FredError> for RedisError {
    fn from(error: FredError) -> RedisError {
        RedisError::new(kind(&error), failure(error.kind()), error.details())
    }
}

/// What `error` means for the command that met it.
#[cfg(feature = "fred")]
fn kind(error: &FredError) -> RedisErrorKind {
    let details = error.details();
    // fred had no connection to route the command to (it is reconnecting), or did not follow an
    // ASK; or the slot is being migrated and some keys have moved (TRYAGAIN), or the cluster
    // cannot serve the slot for now (CLUSTERDOWN): refused before running.
    if details.starts_with("Failed to route command")
        || details == ASK_REFUSED
        || details.starts_with("TRYAGAIN")
        || details.starts_with("CLUSTERDOWN")
    {
        return RedisErrorKind::NotSent;
    }
    let no_reply = match error.kind() {
        ErrorKind::IO
        | ErrorKind::Timeout
        | ErrorKind::Canceled
        | ErrorKind::Routing
        | ErrorKind::Cluster
        | ErrorKind::Backpressure => true,
        // Redis answers LOADING while it reads its data set after a restart, and fred reports a
        // connection closed under a command as Unknown on some paths.
        _ => {
            details.starts_with("LOADING")
                || details.contains("Connection closed")
                || details.contains("connection closed")
                // fred sends each command once (`max_command_attempts` 1) and says this when
                // it would write one a second time: after a cluster's MOVED or ASK (it did not
                // run), but also after a reconnect forced under it (the Sentinel watcher's, when
                // the master switches), which puts the sent command back in the queue: it may
                // have run. So it counts as a lost reply, never as a call that was not sent.
                || details == TOO_MANY_WRITES
        }
    };
    if no_reply {
        RedisErrorKind::NoReply
    } else {
        RedisErrorKind::Refused
    }
}

/// What failed, in the message's words.
#[cfg(feature = "fred")]
fn failure(kind: &ErrorKind) -> Failure {
    match kind {
        ErrorKind::IO => Failure::Connection,
        ErrorKind::Timeout => Failure::Timeout,
        ErrorKind::Auth => Failure::Auth,
        other => Failure::Other(other.to_str().to_ascii_lowercase()),
    }
}

/// A connection that was never connected, for tests that never send: fred's, or redis-rs's in
/// a build without fred.
#[cfg(test)]
mod unconnected {
    use super::*;

    impl Connection {
        #[cfg(feature = "fred")]
        pub(crate) fn unconnected() -> Connection {
            Connection::new(Client::default())
        }

        #[cfg(not(feature = "fred"))]
        pub(crate) fn unconnected() -> Connection {
            let nowhere = Server::new("127.0.0.1", 1);
            let login = redis_rs::Login {
                username: None,
                password: None,
                database: None,
                tls: false,
                protocol: redis::ProtocolVersion::RESP3,
            };
            let policy = ReconnectPolicy::new_constant(1, 0);
            let target = redis_rs::Target::new(nowhere, login, Duration::from_secs(1), policy)
                .expect("an address");
            Connection::with(Link::RedisRs(redis_rs::Link::new(target)))
        }
    }
}

#[cfg(test)]
#[cfg(feature = "fred")]
mod tests {
    use super::*;
    use crate::error::{is_transient, reply_lost, was_not_sent, Error};

    /// fred's answer while it has no connection to route a command to: never sent, so waits keep
    /// waiting and releases are sent again (issue 11, point 3).
    #[test]
    fn a_command_fred_could_not_route_was_not_sent_and_is_transient() {
        let unrouted = RedisError::from(FredError::new(
            ErrorKind::Unknown,
            "Failed to route command.",
        ));
        assert!(was_not_sent(&unrouted));
        assert!(is_transient(&unrouted));
        let error = Error::from_redis("127.0.0.1:6379", "a", Some("u:1"), unrouted);
        assert!(error.is_transient());
        let rejected = RedisError::from(FredError::new(ErrorKind::Unknown, "ERR unknown command"));
        assert!(!was_not_sent(&rejected) && !is_transient(&rejected));
        assert_eq!(rejected.kind(), RedisErrorKind::Refused);
    }

    /// A command fred refuses to write again may have run (a reconnect forced under it put it
    /// back in the queue): its reply counts as lost, so it is fenced, never sent as it was.
    #[test]
    fn a_command_fred_would_write_twice_may_have_run() {
        let requeued = RedisError::from(FredError::new(
            ErrorKind::Unknown,
            "Too many failed write attempts.",
        ));
        assert!(!was_not_sent(&requeued));
        assert!(reply_lost(&requeued));
    }

    /// Each of fred's kinds of a failed connection, and a server loading its data, is a reply
    /// that may be lost; a cluster that moves or cannot serve a slot refused before running.
    #[test]
    fn fred_errors_are_sorted_by_what_they_mean_for_the_command() {
        for kind in [
            ErrorKind::IO,
            ErrorKind::Timeout,
            ErrorKind::Canceled,
            ErrorKind::Routing,
            ErrorKind::Cluster,
            ErrorKind::Backpressure,
        ] {
            let error = RedisError::from(FredError::new(kind.clone(), "x"));
            assert_eq!(error.kind(), RedisErrorKind::NoReply, "{kind:?}");
        }
        for details in ["LOADING Redis is loading", "Connection closed abruptly"] {
            let error = RedisError::from(FredError::new(ErrorKind::Unknown, details));
            assert_eq!(error.kind(), RedisErrorKind::NoReply, "{details}");
        }
        for details in ["TRYAGAIN Multiple keys", "CLUSTERDOWN The cluster is down"] {
            let error = RedisError::from(FredError::new(ErrorKind::Unknown, details));
            assert_eq!(error.kind(), RedisErrorKind::NotSent, "{details}");
        }
        // An ASK fred did not follow: the server answered ASK, so it did not run.
        let error = RedisError::from(FredError::new(ErrorKind::Routing, ASK_REFUSED));
        assert_eq!(error.kind(), RedisErrorKind::NotSent);
        for kind in [
            ErrorKind::Auth,
            ErrorKind::Parse,
            ErrorKind::InvalidArgument,
        ] {
            let error = RedisError::from(FredError::new(kind.clone(), "x"));
            assert_eq!(error.kind(), RedisErrorKind::Refused, "{kind:?}");
        }
    }

    #[test]
    fn fred_io_errors_read_as_words_with_a_hint() {
        let refused = RedisError::from(FredError::new(
            ErrorKind::IO,
            r#"Os { code: 111, kind: ConnectionRefused, message: "Connection refused" }"#,
        ));
        assert_eq!(
            refused.to_string(),
            "connection failed: Connection refused; check that redis-server is running and \
             listening at that address"
        );
        let auth = RedisError::from(FredError::new(ErrorKind::Auth, "WRONGPASS invalid"));
        assert_eq!(
            auth.to_string(),
            "authentication error: WRONGPASS invalid; check the user name and password in the URL"
        );
    }
}

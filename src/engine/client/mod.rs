//! The seam between the engine and the client libraries: what the crate needs of a client
//! library, written down as two private traits, and the one place that picks a library.
//!
//! - [`LinkLike`]: what both below do alike: connect, follow their connections, close;
//! - [`ConnectionLike`]: a command connection: a script call (`EVALSHA`, then `EVAL` when the
//!   server does not have the script cached), the few commands and reads the crate sends,
//!   routed by the first key or to a node or slot ([`Route`]), its reconnect announcements,
//!   and connecting, reconnecting and quitting;
//! - [`SubscriberLike`]: a subscriber: classic and sharded subscribe and unsubscribe, the
//!   messages, the reconnect announcements, a cluster's slots;
//! - every error sorted once, where it enters the crate, into what the ledger and the waits
//!   need to know ([`RedisErrorKind`]): never sent, sent without a reply (may have run), or
//!   refused.
//!
//! One file per library implements them: `fred.rs` (fred: standalone, Sentinel, cluster),
//! `redis_rs.rs` (redis-rs: one server, or the master behind Sentinel) and
//! `redis_rs_cluster.rs` (a cluster on redis-rs). [`Connection`] and [`Subscriber`], which the
//! engine holds, pick the library once (`Links`, `Listeners`) and hand each call to its trait
//! method (`each!`); nothing outside this folder names a client library. The vocabulary of
//! calls is in `value.rs`; the settings are in `settings.rs`.

#[cfg(feature = "fred")]
mod fred;
#[cfg(feature = "redis-rs")]
mod redis_rs;
#[cfg(feature = "redis-rs")]
mod redis_rs_cluster;
pub(crate) mod reply;
pub(crate) mod settings;
pub(crate) mod value;
#[cfg(any(not(feature = "fred"), all(test, feature = "redis-rs")))]
mod vocabulary;

use std::future::Future;
use std::time::Duration;

use tokio::sync::broadcast;

use crate::engine::client::value::{FromValue, Key, Message, ScanType, Server, Value};
use crate::error::{not_connected, Failure, RedisError, RedisErrorKind};

#[cfg(all(test, feature = "fred"))]
use self::fred::fred_policy;
/// What a client is configured with, which the public builder takes: fred's own
/// configuration while fred is compiled in, else the crate's own of the same shape.
#[cfg(feature = "fred")]
pub(crate) use self::fred::{Config, ServerConfig};
#[cfg(feature = "fred")]
use self::fred::{FredClient, FredConnection, FredSubscriber};
/// How a connection is made again: the crate's own in every build, converted to each
/// library's own by that library's file.
pub(crate) use crate::engine::client::settings::ReconnectPolicy;
#[cfg(not(feature = "fred"))]
pub(crate) use crate::engine::client::settings::{Config, ServerConfig};

/// The connection settings of a redis-rs client handed over (`LockClientBuilder::redis_rs_client`,
/// in `redis_rs.rs`), which the builder keeps.
#[cfg(feature = "redis-rs")]
pub(crate) use redis::ConnectionInfo as RedisRsSettings;

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

/// What a [`Connection::call`] sends.
#[derive(Clone, Copy)]
pub(crate) enum Sent<'s> {
    /// A script, by its SHA1, and its text for when the server does not have it cached.
    Script { sha: &'s str, body: &'s str },
    /// One plain command: its name, then the call's keys, then its arguments.
    Command(&'static str),
}

/// Where a call goes on a cluster (elsewhere every call goes to the one server).
#[derive(Clone, Debug)]
pub(crate) enum Route {
    /// To the master of its first key's slot (or for `PUBSUB`, its channel's; or any master
    /// for a call without one).
    FirstKey,
    /// To this node.
    Node(Server),
    /// To the master of this slot.
    Slot(u16),
}

/// The announcements of a connection's reconnects: one per new connection (the node it reached),
/// before anything is sent on it; closed when the client quits.
pub(crate) type Reconnects = broadcast::Receiver<Server>;

/// The pub/sub messages of a [`Subscriber`] (or of a connection that subscribes), as they
/// come in.
pub(crate) type Messages = broadcast::Receiver<Message>;

/// What a client library's command connection and its subscriber do alike: connect, follow
/// their connections, close. Clones share the connection.
pub(crate) trait LinkLike: Clone + Send + Sync + 'static {
    /// Connects, and returns once connected (or with why it could not).
    fn connect(&self) -> impl Future<Output = Result<(), RedisError>> + Send;

    /// The pub/sub messages from now on (a command connection has some only when it
    /// subscribes: a sentinel's).
    fn messages(&self) -> Messages;

    /// The announcements of its new connections from now on.
    fn reconnects(&self) -> Reconnects;

    /// The nodes it is connected to now (each master's, on a cluster).
    fn connected_to(&self) -> Vec<Server>;

    /// Drops its connections and connects again (to where the configuration now says).
    fn reconnect(&self) -> impl Future<Output = ()> + Send;

    /// Closes it; calls after this fail.
    fn quit(&self) -> impl Future<Output = ()> + Send;
}

/// What the crate needs of a client library's command connection (on a cluster, its
/// connections to every master). Clones share the connection.
///
/// Every error is a [`RedisError`], sorted by the library's file: never sent, sent without a
/// reply, or refused. A call is sent once: a library must not write a script again on its own
/// after a reconnect (the engine decides what may run twice). The reads have default bodies
/// made of [`command`](Self::command); a library with commands of its own for them may use
/// those.
///
/// Each method returns the library's own future, or an `async fn`'s of the library's file, and
/// [`Connection`]'s method awaits it in place: the futures of a caller's call nest no deeper
/// than they must (rustc's query depth, which a caller's `async fn` reaches at about 128
/// nested futures: `LeaderElection::observe`'s doc test is the deepest). Methods generic over
/// the reply promise no `Send`: each library's future is `Send` for the replies the crate
/// reads, which the compiler sees through the concrete type.
pub(crate) trait ConnectionLike: LinkLike {
    /// Whether it is connected now (it reconnects in the background): false from the moment
    /// the library learns a connection dropped.
    fn is_connected(&self) -> bool;

    /// Returns once it is connected (at once when it is).
    fn wait_for_connect(&self) -> impl Future<Output = ()> + Send;

    fn is_clustered(&self) -> bool;

    /// The service it finds its master under, behind Sentinel.
    fn sentinel_service(&self) -> Option<String>;

    /// The server's major version, once the connection has read it.
    fn server_major(&self) -> Option<u64>;

    /// How long a call waits for its reply before it fails with a lost reply.
    fn command_timeout(&self) -> Duration;

    /// The masters of a cluster, as its routing table has them; none outside one.
    fn masters(&self) -> Vec<Server>;

    /// One call of a script (`EVALSHA`, then `EVAL` when the server answers `NOSCRIPT`) or a
    /// plain command (its name, the keys, the arguments), with the keys and arguments `call`
    /// makes: once, and a second time only for the `EVAL`.
    fn call<R: FromValue>(
        &self,
        route: &Route,
        sent: Sent<'_>,
        call: &impl Fn() -> (Vec<Key>, Vec<Value>),
    ) -> impl Future<Output = Result<R, RedisError>>;

    /// One command, `name` then `args`, routed by its first argument as a key (for `PUBSUB`,
    /// by its second: the channel).
    fn command<R: FromValue>(
        &self,
        route: &Route,
        name: &'static str,
        args: Vec<Value>,
    ) -> impl Future<Output = Result<R, RedisError>>;

    /// Commands sent together, each `name` then its arguments (the first a key), with each
    /// one's reply or error, in order.
    fn pipeline(
        &self,
        route: &Route,
        commands: Vec<(&'static str, Vec<Value>)>,
    ) -> impl Future<Output = Result<Vec<Result<Value, RedisError>>, RedisError>> + Send;

    /// One page of `SCAN cursor MATCH pattern COUNT count [TYPE of_type]` on the node: the
    /// next cursor ("0" at the end) and the keys.
    fn scan_page(
        &self,
        route: &Route,
        cursor: String,
        pattern: &str,
        count: u32,
        of_type: Option<ScanType>,
    ) -> impl Future<Output = Result<(String, Vec<String>), RedisError>> + Send;

    /// `SUBSCRIBE channel` on a connection that also asks (a sentinel's, RESP3).
    fn subscribe(&self, channel: &str) -> impl Future<Output = Result<(), RedisError>> + Send;

    /// `GET key`.
    fn get<R: FromValue>(
        &self,
        route: &Route,
        key: Key,
    ) -> impl Future<Output = Result<R, RedisError>> {
        self.command(route, "GET", vec![Value::from(key)])
    }

    /// `HGET key field`.
    fn hget<R: FromValue>(
        &self,
        route: &Route,
        key: Key,
        field: &str,
    ) -> impl Future<Output = Result<R, RedisError>> {
        self.command(route, "HGET", vec![Value::from(key), Value::from(field)])
    }

    /// `TYPE key`: `none` when there is no key.
    fn key_type(
        &self,
        route: &Route,
        key: Key,
    ) -> impl Future<Output = Result<String, RedisError>> {
        self.command(route, "TYPE", vec![Value::from(key)])
    }

    /// `PTTL key`: -2 when there is no key, -1 when it never expires.
    fn pttl(&self, route: &Route, key: Key) -> impl Future<Output = Result<i64, RedisError>> {
        self.command(route, "PTTL", vec![Value::from(key)])
    }

    /// How many subscribers `channel` has (`PUBSUB NUMSUB`, or `PUBSUB SHARDNUMSUB` when
    /// `sharded`), as the reply's pair.
    fn subscribers(
        &self,
        route: &Route,
        channel: &str,
        sharded: bool,
    ) -> impl Future<Output = Result<Vec<Value>, RedisError>> {
        let which = if sharded { "SHARDNUMSUB" } else { "NUMSUB" };
        self.command(
            route,
            "PUBSUB",
            vec![Value::from(which), Value::from(channel)],
        )
    }

    /// `CLIENT SETNAME name`.
    fn set_name(&self, route: &Route, name: &str) -> impl Future<Output = Result<(), RedisError>> {
        self.command(
            route,
            "CLIENT",
            vec![Value::from("SETNAME"), Value::from(name)],
        )
    }

    /// `CLIENT LIST`.
    fn client_list(&self, route: &Route) -> impl Future<Output = Result<String, RedisError>> {
        self.command(route, "CLIENT", vec![Value::from("LIST")])
    }
}

/// What the crate needs of a client library's subscriber: the connection pub/sub messages come
/// in on (on a cluster, one per node it listens on), and the subscriptions it keeps. Clones
/// share it.
pub(crate) trait SubscriberLike: LinkLike {
    /// Subscribes `channels` (`SUBSCRIBE`), and returns once the server has the subscriptions
    /// (not when the command is written: a waiter told "subscribed" too early would make its
    /// second attempt possibly before the subscription exists, and miss an unlock published
    /// in between).
    fn subscribe(
        &self,
        channels: Vec<String>,
    ) -> impl Future<Output = Result<(), RedisError>> + Send;

    /// Subscribes sharded `channels`, all of one slot (`SSUBSCRIBE` on the slot's node), and
    /// returns once the server has them.
    fn ssubscribe(
        &self,
        channels: Vec<String>,
    ) -> impl Future<Output = Result<(), RedisError>> + Send;

    /// `UNSUBSCRIBE channels`.
    fn unsubscribe(
        &self,
        channels: Vec<String>,
    ) -> impl Future<Output = Result<(), RedisError>> + Send;

    /// `SUNSUBSCRIBE channels`, all of one slot.
    fn sunsubscribe(
        &self,
        channels: Vec<String>,
    ) -> impl Future<Output = Result<(), RedisError>> + Send;

    /// Whether it can take sharded channels.
    fn shards(&self) -> bool;

    /// The classic channels the library itself subscribes again after a reconnect (none on a
    /// library that leaves that to the engine).
    fn tracked_channels(&self) -> Vec<String> {
        Vec::new()
    }

    /// The node that serves `slot`, as its routing table says (none outside a cluster).
    fn slot_owner(&self, slot: u16) -> Option<Server>;

    /// Reads the cluster's slots again.
    fn refresh_slots(&self) -> impl Future<Output = Result<(), RedisError>> + Send;
}

/// The client libraries compiled in, as a command connection: the one list of them. A third
/// library is a variant here and in [`Listeners`], an arm in `each!`, its file and its
/// feature.
#[derive(Clone)]
enum Links {
    #[cfg(feature = "fred")]
    Fred(FredConnection),
    #[cfg(feature = "redis-rs")]
    RedisRs(redis_rs::Link),
    /// A cluster on redis-rs: a link per master.
    #[cfg(feature = "redis-rs")]
    RedisRsCluster(redis_rs_cluster::Cluster),
}

/// The client libraries compiled in, as a subscriber.
#[derive(Clone)]
enum Listeners {
    #[cfg(feature = "fred")]
    Fred(FredSubscriber),
    #[cfg(feature = "redis-rs")]
    RedisRs(redis_rs::Link),
    #[cfg(feature = "redis-rs")]
    RedisRsCluster(redis_rs_cluster::Cluster),
}

/// `$body` with `$link` bound to the library under `$on` (a [`Links`] or a [`Listeners`]),
/// whose methods it calls through the seam's trait.
macro_rules! each {
    ($libraries:ident, $on:expr, |$link:ident| $body:expr) => {
        match $on {
            #[cfg(feature = "fred")]
            $libraries::Fred($link) => $body,
            #[cfg(feature = "redis-rs")]
            $libraries::RedisRs($link) => $body,
            #[cfg(feature = "redis-rs")]
            $libraries::RedisRsCluster($link) => $body,
        }
    };
}

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
    /// With fred: its builder, unless redis-rs makes the connections.
    #[cfg(feature = "fred")]
    fred: Option<self::fred::Connections>,
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
    /// fred's configuration's, or RESP3 on redis-rs), whose calls fail after `command_timeout`
    /// without a reply, reconnecting as `reconnect_policy` says.
    pub(crate) fn new(
        library: Library,
        config: Config,
        protocol: Option<Protocol>,
        command_timeout: Duration,
        reconnect_policy: ReconnectPolicy,
    ) -> Connector {
        match library {
            #[cfg(feature = "fred")]
            Library::Fred => Connector {
                fred: Some(self::fred::Connections::new(
                    &config,
                    protocol,
                    command_timeout,
                    &reconnect_policy,
                )),
                #[cfg(feature = "redis-rs")]
                redis_rs: None,
                config,
            },
            #[cfg(feature = "redis-rs")]
            Library::RedisRs(handed_over) => {
                let target = match handed_over {
                    None => redis_rs_target(
                        &config,
                        protocol.map_or(redis::ProtocolVersion::RESP3, redis_rs_protocol),
                        command_timeout,
                        reconnect_policy,
                    ),
                    Some(info) => redis_rs::Target::handed_over(
                        *info,
                        protocol.map(redis_rs_protocol),
                        command_timeout,
                        reconnect_policy,
                    ),
                };
                Connector {
                    config,
                    #[cfg(feature = "fred")]
                    fred: None,
                    redis_rs: Some(target),
                }
            }
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
            let target = target.clone()?;
            return Ok(Connection::with(if target.seeds().is_some() {
                Links::RedisRsCluster(redis_rs_cluster::Cluster::new(target, false)?)
            } else {
                Links::RedisRs(redis_rs::Link::new(target))
            }));
        }
        #[cfg(feature = "fred")]
        if let Some(fred) = &self.fred {
            return Ok(Connection::with(Links::Fred(fred.connection()?)));
        }
        Err(no_library())
    }

    /// A subscriber, not connected yet ([`Subscriber::connect`]).
    pub(crate) fn subscriber(&self) -> Result<Subscriber, RedisError> {
        #[cfg(feature = "redis-rs")]
        if let Some(target) = &self.redis_rs {
            let target = target.clone()?.subscribing();
            return Ok(Subscriber {
                link: if target.seeds().is_some() {
                    Listeners::RedisRsCluster(redis_rs_cluster::Cluster::new(target, true)?)
                } else {
                    Listeners::RedisRs(redis_rs::Link::new(target))
                },
            });
        }
        #[cfg(feature = "fred")]
        if let Some(fred) = &self.fred {
            return Ok(Subscriber {
                link: Listeners::Fred(fred.subscriber()?),
            });
        }
        Err(no_library())
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
            return Ok(Connection::with(Links::RedisRs(redis_rs::Link::new(
                target,
            ))));
        }
        #[cfg(feature = "fred")]
        if self.fred.is_some() {
            return Ok(Connection::with(Links::Fred(self::fred::sentinel(
                &self.config,
                sentinel,
                timeout,
            )?)));
        }
        let _ = (sentinel, timeout);
        Err(no_library())
    }
}

/// A connection asked of a library the build does not have (the builder refuses such a
/// backend before it makes a connector; kept so that no path panics).
fn no_library() -> RedisError {
    RedisError::new(
        RedisErrorKind::Refused,
        Failure::Other("invalid client config".into()),
        "fredlock was built without the client library this backend needs",
    )
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

/// A command connection (on a cluster, one per master): every script call, command and read the
/// crate sends goes through one. Clones share the connection.
///
/// Each call goes where its first key's slot is served, unless the connection was pointed at a
/// node ([`on_node`](Self::on_node)) or a slot ([`on_slot`](Self::on_slot)). Each call's error is
/// a [`RedisError`], sorted by the library's file.
#[derive(Clone)]
pub(crate) struct Connection {
    link: Links,
    /// Where every call goes on a cluster.
    route: Route,
}

impl Connection {
    fn with(link: Links) -> Connection {
        Connection {
            link,
            route: Route::FirstKey,
        }
    }

    /// Connects (and returns once connected, or with why it could not).
    pub(crate) async fn connect(&self) -> Result<(), RedisError> {
        each!(Links, &self.link, |link| LinkLike::connect(link).await)
    }

    /// The pub/sub messages of a connection that subscribes (a sentinel's).
    pub(crate) fn messages(&self) -> Messages {
        each!(Links, &self.link, |link| LinkLike::messages(link))
    }

    /// `SUBSCRIBE channel` on a connection that also asks (a sentinel's, RESP3).
    pub(crate) async fn subscribe(&self, channel: &str) -> Result<(), RedisError> {
        each!(Links, &self.link, |link| ConnectionLike::subscribe(
            link, channel
        )
        .await)
    }

    /// fred's client under this connection, for the public API that hands it out; `None` on
    /// another library.
    #[cfg(feature = "fred")]
    pub(crate) fn fred(&self) -> Option<&FredClient> {
        match &self.link {
            Links::Fred(link) => Some(link.client()),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    /// This connection, sending every call to `node` (on a cluster; elsewhere, to the server).
    pub(crate) fn on_node(&self, node: Server) -> Connection {
        Connection {
            link: self.link.clone(),
            route: Route::Node(node),
        }
    }

    /// This connection, sending every call to the master of `slot` (on a cluster).
    pub(crate) fn on_slot(&self, slot: u16) -> Connection {
        Connection {
            link: self.link.clone(),
            route: Route::Slot(slot),
        }
    }

    /// Whether it is connected now (it reconnects in the background).
    pub(crate) fn is_connected(&self) -> bool {
        each!(Links, &self.link, |link| ConnectionLike::is_connected(link))
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
        each!(Links, &self.link, |link| ConnectionLike::wait_for_connect(
            link
        )
        .await)
    }

    pub(crate) fn is_clustered(&self) -> bool {
        each!(Links, &self.link, |link| ConnectionLike::is_clustered(link))
    }

    /// The service it finds its master under, behind Sentinel.
    pub(crate) fn sentinel_service(&self) -> Option<String> {
        each!(Links, &self.link, |link| ConnectionLike::sentinel_service(
            link
        ))
    }

    /// The server's major version, once the connection has read it.
    pub(crate) fn server_major(&self) -> Option<u64> {
        each!(Links, &self.link, |link| ConnectionLike::server_major(link))
    }

    /// How long a call waits for its reply before it fails with a lost reply.
    pub(crate) fn command_timeout(&self) -> Duration {
        each!(Links, &self.link, |link| ConnectionLike::command_timeout(
            link
        ))
    }

    /// The announcements of its new connections from now on.
    pub(crate) fn reconnects(&self) -> Reconnects {
        each!(Links, &self.link, |link| LinkLike::reconnects(link))
    }

    /// The nodes it is connected to now (each master's, on a cluster).
    pub(crate) fn connected_to(&self) -> Vec<Server> {
        each!(Links, &self.link, |link| LinkLike::connected_to(link))
    }

    /// The masters of a cluster, as its routing table has them; none outside one.
    pub(crate) fn masters(&self) -> Vec<Server> {
        each!(Links, &self.link, |link| ConnectionLike::masters(link))
    }

    /// Drops its connections and connects again (to where the configuration now says).
    pub(crate) async fn reconnect(&self) {
        each!(Links, &self.link, |link| LinkLike::reconnect(link).await)
    }

    /// Closes it; calls after this fail.
    pub(crate) async fn quit(&self) {
        each!(Links, &self.link, |link| LinkLike::quit(link).await)
    }

    /// One call of a script (`EVALSHA`, then `EVAL` when the server does not have it cached) or
    /// a plain command (its name, the keys, the arguments), with the keys and arguments `call`
    /// makes: once, and a second time only for the `EVAL`.
    pub(crate) async fn call<R: FromValue>(
        &self,
        sent: Sent<'_>,
        call: &impl Fn() -> (Vec<Key>, Vec<Value>),
    ) -> Result<R, RedisError> {
        each!(Links, &self.link, |link| ConnectionLike::call(
            link,
            &self.route,
            sent,
            call
        )
        .await)
    }

    /// One command, `name` then `args`, routed by its first argument as a key.
    pub(crate) async fn command<R: FromValue>(
        &self,
        name: &'static str,
        args: Vec<Value>,
    ) -> Result<R, RedisError> {
        self.refused_unconnected()?;
        each!(Links, &self.link, |link| ConnectionLike::command(
            link,
            &self.route,
            name,
            args
        )
        .await)
    }

    /// Commands sent together, each `name` then its arguments (the first a key), with each one's
    /// reply or error, in order.
    pub(crate) async fn pipeline(
        &self,
        commands: Vec<(&'static str, Vec<Value>)>,
    ) -> Result<Vec<Result<Value, RedisError>>, RedisError> {
        self.refused_unconnected()?;
        each!(Links, &self.link, |link| ConnectionLike::pipeline(
            link,
            &self.route,
            commands
        )
        .await)
    }

    /// `GET key`.
    pub(crate) async fn get<R: FromValue>(
        &self,
        key: impl Into<Key> + Send,
    ) -> Result<R, RedisError> {
        self.refused_unconnected()?;
        let key = key.into();
        each!(Links, &self.link, |link| ConnectionLike::get(
            link,
            &self.route,
            key
        )
        .await)
    }

    /// `HGET key field`.
    pub(crate) async fn hget<R: FromValue>(
        &self,
        key: impl Into<Key> + Send,
        field: &str,
    ) -> Result<R, RedisError> {
        self.refused_unconnected()?;
        let key = key.into();
        each!(Links, &self.link, |link| ConnectionLike::hget(
            link,
            &self.route,
            key,
            field
        )
        .await)
    }

    /// `TYPE key`: `none` when there is no key.
    pub(crate) async fn key_type(&self, key: impl Into<Key> + Send) -> Result<String, RedisError> {
        self.refused_unconnected()?;
        let key = key.into();
        each!(Links, &self.link, |link| ConnectionLike::key_type(
            link,
            &self.route,
            key
        )
        .await)
    }

    /// `PTTL key`: -2 when there is no key, -1 when it never expires.
    pub(crate) async fn pttl(&self, key: impl Into<Key> + Send) -> Result<i64, RedisError> {
        self.refused_unconnected()?;
        let key = key.into();
        each!(Links, &self.link, |link| ConnectionLike::pttl(
            link,
            &self.route,
            key
        )
        .await)
    }

    /// How many subscribers `channel` has (`PUBSUB NUMSUB`, or `PUBSUB SHARDNUMSUB` when
    /// `sharded`), as the reply's pair.
    pub(crate) async fn subscribers(
        &self,
        channel: &str,
        sharded: bool,
    ) -> Result<Vec<Value>, RedisError> {
        self.refused_unconnected()?;
        each!(Links, &self.link, |link| ConnectionLike::subscribers(
            link,
            &self.route,
            channel,
            sharded
        )
        .await)
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
        each!(Links, &self.link, |link| ConnectionLike::scan_page(
            link,
            &self.route,
            cursor,
            pattern,
            count,
            of_type
        )
        .await)
    }

    /// `CLIENT SETNAME name`.
    pub(crate) async fn set_name(&self, name: &str) -> Result<(), RedisError> {
        each!(Links, &self.link, |link| ConnectionLike::set_name(
            link,
            &self.route,
            name
        )
        .await)
    }

    /// `CLIENT LIST`.
    pub(crate) async fn client_list(&self) -> Result<String, RedisError> {
        each!(Links, &self.link, |link| ConnectionLike::client_list(
            link,
            &self.route
        )
        .await)
    }
}

/// The connection pub/sub messages come in on (on a cluster, one per node it listens on), and
/// the subscriptions it keeps: classic channels, or sharded ones on the node of each channel's
/// slot. Clones share it.
#[derive(Clone)]
pub(crate) struct Subscriber {
    link: Listeners,
}

impl Subscriber {
    /// Connects (and returns once connected, or with why it could not).
    pub(crate) async fn connect(&self) -> Result<(), RedisError> {
        each!(Listeners, &self.link, |link| LinkLike::connect(link).await)
    }

    /// Subscribes `channels` (`SUBSCRIBE`), and returns once the server has the subscriptions.
    pub(crate) async fn subscribe(&self, channels: Vec<String>) -> Result<(), RedisError> {
        each!(Listeners, &self.link, |link| SubscriberLike::subscribe(
            link, channels
        )
        .await)
    }

    /// Subscribes sharded `channels`, all of one slot (`SSUBSCRIBE` on the slot's node), and
    /// returns once the server has them.
    pub(crate) async fn ssubscribe(&self, channels: Vec<String>) -> Result<(), RedisError> {
        each!(Listeners, &self.link, |link| SubscriberLike::ssubscribe(
            link, channels
        )
        .await)
    }

    /// `UNSUBSCRIBE channels`.
    pub(crate) async fn unsubscribe(&self, channels: Vec<String>) -> Result<(), RedisError> {
        each!(Listeners, &self.link, |link| SubscriberLike::unsubscribe(
            link, channels
        )
        .await)
    }

    /// `SUNSUBSCRIBE channels`, all of one slot.
    pub(crate) async fn sunsubscribe(&self, channels: Vec<String>) -> Result<(), RedisError> {
        each!(Listeners, &self.link, |link| SubscriberLike::sunsubscribe(
            link, channels
        )
        .await)
    }

    /// Whether it can take sharded channels: not on redis-rs over RESP2, whose pub/sub knows
    /// only classic ones.
    pub(crate) fn shards(&self) -> bool {
        each!(Listeners, &self.link, |link| SubscriberLike::shards(link))
    }

    /// The classic channels the library itself subscribes again after a reconnect (none on a
    /// library that leaves that to the engine).
    pub(crate) fn tracked_channels(&self) -> Vec<String> {
        each!(Listeners, &self.link, |link| {
            SubscriberLike::tracked_channels(link)
        })
    }

    /// The node that serves `slot`, as its routing table says (none outside a cluster).
    pub(crate) fn slot_owner(&self, slot: u16) -> Option<Server> {
        each!(Listeners, &self.link, |link| SubscriberLike::slot_owner(
            link, slot
        ))
    }

    /// Reads the cluster's slots again.
    pub(crate) async fn refresh_slots(&self) -> Result<(), RedisError> {
        each!(Listeners, &self.link, |link| SubscriberLike::refresh_slots(
            link
        )
        .await)
    }

    /// The messages from now on.
    pub(crate) fn messages(&self) -> Messages {
        each!(Listeners, &self.link, |link| LinkLike::messages(link))
    }

    /// The announcements of its new connections from now on.
    pub(crate) fn reconnects(&self) -> Reconnects {
        each!(Listeners, &self.link, |link| LinkLike::reconnects(link))
    }

    /// The nodes it is connected to now.
    pub(crate) fn connected_to(&self) -> Vec<Server> {
        each!(Listeners, &self.link, |link| LinkLike::connected_to(link))
    }

    /// Drops its connections and connects again (to where the configuration now says).
    pub(crate) async fn reconnect(&self) {
        each!(Listeners, &self.link, |link| LinkLike::reconnect(link)
            .await)
    }

    /// Closes it.
    pub(crate) async fn quit(&self) {
        each!(Listeners, &self.link, |link| LinkLike::quit(link).await)
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

/// A connection that was never connected, for tests that never send: fred's, or redis-rs's in
/// a build without fred.
#[cfg(test)]
mod unconnected {
    use super::*;

    impl Connection {
        #[cfg(feature = "fred")]
        pub(crate) fn unconnected() -> Connection {
            Connection::with(Links::Fred(FredConnection::new(Default::default())))
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
            Connection::with(Links::RedisRs(redis_rs::Link::new(target)))
        }
    }
}

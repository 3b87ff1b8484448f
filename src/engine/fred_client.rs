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

use std::time::Duration;

use fred::clients::{Client, SubscriberClient};
use fred::error::{Error as FredError, ErrorKind};
use fred::interfaces::{
    ClientInterface, ClientLike, ClusterInterface, EventInterface, HashesInterface, KeysInterface,
    LuaInterface, PubsubInterface,
};
use fred::types::config::{ConnectionConfig, Options, PerformanceConfig, ServerConfig};
use fred::types::{Builder, RespVersion};
use fred::types::{ClusterHash, CustomCommand};
use tokio::sync::broadcast;

use crate::engine::{key_slot, FromValue, Key, Message, ScanType, Server, Value};
use crate::error::{Failure, RedisError, RedisErrorKind};

/// What a client is configured with: fred's own configuration, which the public builder
/// takes.
pub(crate) use fred::types::config::{Config, ReconnectPolicy};

/// fred's refusal to write a command a second time.
const TOO_MANY_WRITES: &str = "Too many failed write attempts.";

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
const MESSAGE_BUFFER: usize = 4096;

/// Makes the connections of one lock client, all with the same settings: its command
/// connection, its subscriber, replica sync's own connections, and a connection to a sentinel.
pub(crate) struct Connector {
    config: Config,
    builder: Builder,
}

/// Where a Sentinel deployment's master is looked up.
pub(crate) struct Sentinels {
    pub(crate) hosts: Vec<Server>,
    pub(crate) service: String,
}

impl Connector {
    /// Connections to what `config` names, whose calls fail after `command_timeout` without a
    /// reply, reconnecting as `reconnect_policy` says.
    pub(crate) fn new(
        config: Config,
        command_timeout: Duration,
        reconnect_policy: ReconnectPolicy,
    ) -> Connector {
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
            .set_policy(reconnect_policy);
        Connector { config, builder }
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
        Ok(Connection::new(self.builder.build()?))
    }

    /// A subscriber, not connected yet ([`Subscriber::connect`]).
    pub(crate) fn subscriber(&self) -> Result<Subscriber, RedisError> {
        Ok(Subscriber::new(self.builder.build_subscriber_client()?))
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

/// A command connection (on a cluster, one per master): every script call, command and read the
/// crate sends goes through one. Clones share the connection.
///
/// Each call goes where its first key's slot is served, unless the connection was pointed at a
/// node ([`on_node`](Self::on_node)) or a slot ([`on_slot`](Self::on_slot)). Each call's error is
/// a [`RedisError`], sorted once here.
#[derive(Clone)]
pub(crate) struct Connection {
    client: Client,
    /// Where every call goes on a cluster when it is not its first key's slot.
    route: Option<Options>,
}

/// Runs `$call` on the connection's client, routed as the connection says, and sorts its error.
macro_rules! routed {
    ($connection:expr, |$client:ident| $call:expr) => {
        match &$connection.route {
            None => {
                let $client = &$connection.client;
                $call.await.map_err(RedisError::from)
            }
            Some(options) => {
                let $client = &$connection.client.with_options(options);
                $call.await.map_err(RedisError::from)
            }
        }
    };
}

/// The announcements of a connection's reconnects: one per new connection (the node it reached),
/// before anything is sent on it; closed when the client quits.
pub(crate) type Reconnects = broadcast::Receiver<Server>;

impl Connection {
    pub(crate) fn new(client: Client) -> Connection {
        Connection {
            client,
            route: None,
        }
    }

    /// A connection that was never connected, for tests that never send.
    #[cfg(test)]
    pub(crate) fn unconnected() -> Connection {
        Connection::new(Client::default())
    }

    /// Connects (and returns once connected, or with why it could not).
    pub(crate) async fn connect(&self) -> Result<(), RedisError> {
        self.client.init().await?;
        Ok(())
    }

    /// The pub/sub messages of a connection that subscribes (a sentinel's).
    pub(crate) fn messages(&self) -> Messages {
        self.client.message_rx()
    }

    /// `SUBSCRIBE channel` on a connection that also asks (a sentinel's, RESP3).
    pub(crate) async fn subscribe(&self, channel: &str) -> Result<(), RedisError> {
        Ok(self.client.subscribe(channel).await?)
    }

    /// fred's client under this connection, for the public API that hands it out.
    pub(crate) fn fred(&self) -> &Client {
        &self.client
    }

    /// This connection, sending every call to `node` (on a cluster; elsewhere, to the server).
    pub(crate) fn on_node(&self, node: Server) -> Connection {
        Connection {
            client: self.client.clone(),
            route: Some(Options {
                cluster_node: Some(node),
                ..Options::default()
            }),
        }
    }

    /// This connection, sending every call to the master of `slot` (on a cluster).
    pub(crate) fn on_slot(&self, slot: u16) -> Connection {
        Connection {
            client: self.client.clone(),
            route: Some(Options {
                cluster_hash: Some(ClusterHash::Custom(slot)),
                ..Options::default()
            }),
        }
    }

    /// Whether it is connected now (fred reconnects in the background).
    pub(crate) fn is_connected(&self) -> bool {
        self.client.is_connected()
    }

    /// Returns once it is connected (at once when it is).
    pub(crate) async fn wait_for_connect(&self) {
        let _ = self.client.wait_for_connect().await;
    }

    pub(crate) fn is_clustered(&self) -> bool {
        self.client.is_clustered()
    }

    /// The service it finds its master under, behind Sentinel.
    pub(crate) fn sentinel_service(&self) -> Option<String> {
        match &self.client.client_config().server {
            ServerConfig::Sentinel { service_name, .. } => Some(service_name.clone()),
            _ => None,
        }
    }

    /// The server's major version, once the connection has read it.
    pub(crate) fn server_major(&self) -> Option<u64> {
        self.client.server_version().map(|version| version.major)
    }

    /// How long a call waits for its reply before it fails with a lost reply.
    pub(crate) fn command_timeout(&self) -> Duration {
        self.client.perf_config().default_command_timeout
    }

    /// The announcements of its new connections from now on.
    pub(crate) fn reconnects(&self) -> Reconnects {
        self.client.reconnect_rx()
    }

    /// The nodes it is connected to now (each master's, on a cluster).
    pub(crate) fn connected_to(&self) -> Vec<Server> {
        self.client.active_connections()
    }

    /// The masters of a cluster, as its routing table has them; none outside one.
    pub(crate) fn masters(&self) -> Vec<Server> {
        self.client
            .cached_cluster_state()
            .map(|state| state.unique_primary_nodes())
            .unwrap_or_default()
    }

    /// Drops its connections and connects again (to where the configuration now says).
    pub(crate) async fn reconnect(&self) {
        let _ = self.client.force_reconnection().await;
    }

    /// Closes it; calls after this fail.
    pub(crate) async fn quit(&self) {
        let _ = self.client.quit().await;
    }

    /// One call of a script (`EVALSHA`, then `EVAL` when the server does not have it cached) or
    /// a plain command (its name, the keys, the arguments), with the keys and arguments `call`
    /// makes: once, and a second time only for the `EVAL`.
    pub(crate) async fn call<R: FromValue>(
        &self,
        sent: Sent<'_>,
        call: &impl Fn() -> (Vec<Key>, Vec<Value>),
    ) -> Result<R, RedisError> {
        let (keys, args) = call();
        match sent {
            Sent::Command(name) => {
                let mut command: Vec<Value> = keys.into_iter().map(Value::from).collect();
                command.extend(args);
                let name = CustomCommand::new_static(name, ClusterHash::FirstKey, false);
                routed!(self, |client| client.custom::<R, Value>(name, command))
            }
            Sent::Script { sha, body } => {
                match routed!(self, |client| client.evalsha::<R, _, _, _>(sha, keys, args)) {
                    Err(error) if error.details().starts_with("NOSCRIPT") => {
                        let (keys, args) = call();
                        routed!(self, |client| client.eval::<R, _, _, _>(body, keys, args))
                    }
                    other => other,
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
        let name = CustomCommand::new_static(name, ClusterHash::FirstKey, false);
        routed!(self, |client| client.custom::<R, Value>(name, args))
    }

    /// Commands sent together, each `name` then its arguments (the first a key), with each one's
    /// reply or error, in order.
    pub(crate) async fn pipeline(
        &self,
        commands: Vec<(&'static str, Vec<Value>)>,
    ) -> Result<Vec<Result<Value, RedisError>>, RedisError> {
        let pipeline = self.client.pipeline();
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

    /// `GET key`.
    pub(crate) async fn get<R: FromValue>(
        &self,
        key: impl Into<Key> + Send,
    ) -> Result<R, RedisError> {
        routed!(self, |client| client.get::<R, _>(key))
    }

    /// `HGET key field`.
    pub(crate) async fn hget<R: FromValue>(
        &self,
        key: impl Into<Key> + Send,
        field: &str,
    ) -> Result<R, RedisError> {
        routed!(self, |client| client.hget::<R, _, _>(key, field))
    }

    /// `TYPE key`: `none` when there is no key.
    pub(crate) async fn key_type(&self, key: impl Into<Key> + Send) -> Result<String, RedisError> {
        routed!(self, |client| client.r#type::<String, _>(key))
    }

    /// `PTTL key`: -2 when there is no key, -1 when it never expires.
    pub(crate) async fn pttl(&self, key: impl Into<Key> + Send) -> Result<i64, RedisError> {
        routed!(self, |client| client.pttl::<i64, _>(key))
    }

    /// How many subscribers `channel` has (`PUBSUB NUMSUB`, or `PUBSUB SHARDNUMSUB` when
    /// `sharded`), as the reply's pair.
    pub(crate) async fn subscribers(
        &self,
        channel: &str,
        sharded: bool,
    ) -> Result<Vec<Value>, RedisError> {
        if sharded {
            routed!(self, |client| client
                .pubsub_shardnumsub::<Vec<Value>, _>(channel))
        } else {
            routed!(self, |client| client
                .pubsub_numsub::<Vec<Value>, _>(channel))
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
        routed!(self, |client| client
            .scan_page::<(String, Vec<String>), _, _>(
                cursor,
                pattern,
                Some(count),
                of_type
            ))
    }

    /// `CLIENT SETNAME name`.
    pub(crate) async fn set_name(&self, name: &str) -> Result<(), RedisError> {
        routed!(self, |client| client.client_setname(name))
    }

    /// `CLIENT LIST`.
    pub(crate) async fn client_list(&self) -> Result<String, RedisError> {
        routed!(self, |client| client
            .client_list::<String, String>(None, None))
    }
}

/// The connection pub/sub messages come in on (on a cluster, one per node it listens on), and
/// the subscriptions it keeps: classic channels, or sharded ones on the node of each channel's
/// slot. Clones share it.
#[derive(Clone)]
pub(crate) struct Subscriber {
    client: SubscriberClient,
}

/// The messages of a [`Subscriber`], as they come in.
pub(crate) type Messages = broadcast::Receiver<Message>;

impl Subscriber {
    pub(crate) fn new(client: SubscriberClient) -> Subscriber {
        Subscriber { client }
    }

    /// Connects (and returns once connected, or with why it could not).
    pub(crate) async fn connect(&self) -> Result<(), RedisError> {
        self.client.init().await?;
        Ok(())
    }

    /// Subscribes `channels` (`SUBSCRIBE`), and returns once the server has the subscriptions.
    ///
    /// fred completes a `SUBSCRIBE` as soon as it is written, not when Redis has processed it.
    /// A waiter told "subscribed" too early would make its second attempt (on the other
    /// connection) possibly before the subscription exists, and miss an unlock published in
    /// between. Redis runs one connection's commands in order, so a `PING` behind the
    /// `SUBSCRIBE`, on the same connection (in a cluster, the node fred sends subscriptions
    /// to), answers only once it took effect.
    pub(crate) async fn subscribe(&self, channels: Vec<String>) -> Result<(), RedisError> {
        self.client.subscribe(channels).await?;
        let options = Options {
            cluster_hash: self
                .client
                .is_clustered()
                .then(|| ClusterHash::Custom(key_slot(self.client.id().as_bytes()))),
            ..Options::default()
        };
        self.client
            .with_options(&options)
            .ping::<Value>(None)
            .await?;
        Ok(())
    }

    /// Subscribes sharded `channels`, all of one slot (`SSUBSCRIBE` on the slot's node), and
    /// returns once the server has them (fred completes an `SSUBSCRIBE` on its reply: it never
    /// pipelines one, so that it can follow a `MOVED`).
    pub(crate) async fn ssubscribe(&self, channels: Vec<String>) -> Result<(), RedisError> {
        Ok(self.client.ssubscribe(channels).await?)
    }

    /// `UNSUBSCRIBE channels`.
    pub(crate) async fn unsubscribe(&self, channels: Vec<String>) -> Result<(), RedisError> {
        Ok(self.client.unsubscribe(channels).await?)
    }

    /// `SUNSUBSCRIBE channels`, all of one slot.
    pub(crate) async fn sunsubscribe(&self, channels: Vec<String>) -> Result<(), RedisError> {
        Ok(self.client.sunsubscribe(channels).await?)
    }

    /// The classic channels it subscribes again after a reconnect.
    pub(crate) fn tracked_channels(&self) -> Vec<String> {
        self.client
            .tracked_channels()
            .into_iter()
            .map(|channel| channel.to_string())
            .collect()
    }

    /// The node that serves `slot`, as its routing table says (none outside a cluster).
    pub(crate) fn slot_owner(&self, slot: u16) -> Option<Server> {
        self.client
            .cached_cluster_state()?
            .get_server(slot)
            .cloned()
    }

    /// Reads the cluster's slots again.
    pub(crate) async fn refresh_slots(&self) -> Result<(), RedisError> {
        Ok(self.client.sync_cluster().await?)
    }

    /// The messages from now on.
    pub(crate) fn messages(&self) -> Messages {
        self.client.message_rx()
    }

    /// The announcements of its new connections from now on.
    pub(crate) fn reconnects(&self) -> Reconnects {
        self.client.reconnect_rx()
    }

    /// The nodes it is connected to now.
    pub(crate) fn connected_to(&self) -> Vec<Server> {
        self.client.active_connections()
    }

    /// Drops its connections and connects again (to where the configuration now says).
    pub(crate) async fn reconnect(&self) {
        let _ = self.client.force_reconnection().await;
    }

    /// Closes it.
    pub(crate) async fn quit(&self) {
        let _ = self.client.quit().await;
    }
}

impl From<FredError> for RedisError {
    fn from(error: FredError) -> RedisError {
        RedisError::new(kind(&error), failure(error.kind()), error.details())
    }
}

/// What `error` means for the command that met it.
fn kind(error: &FredError) -> RedisErrorKind {
    let details = error.details();
    // fred had no connection to route the command to (it is reconnecting); or the slot is being
    // migrated and some keys have moved (TRYAGAIN), or the cluster cannot serve the slot for now
    // (CLUSTERDOWN): refused before running.
    if details.starts_with("Failed to route command")
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
fn failure(kind: &ErrorKind) -> Failure {
    match kind {
        ErrorKind::IO => Failure::Connection,
        ErrorKind::Timeout => Failure::Timeout,
        ErrorKind::Auth => Failure::Auth,
        other => Failure::Other(other.to_str().to_ascii_lowercase()),
    }
}

#[cfg(test)]
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

//! fred, the default client library, behind the seam: a command connection
//! ([`FredConnection`], standalone, behind Sentinel or on a cluster) and a subscriber
//! ([`FredSubscriber`]), one generic [`Fred`] implementing the seam's traits; how their connections are made
//! ([`Connections`]); and fred's errors, sorted into the crate's kinds.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fred::clients::{Client, SubscriberClient};
use fred::error::{Error as FredError, ErrorKind};
use fred::interfaces::{
    ClientInterface, ClientLike, ClusterInterface, EventInterface, HashesInterface, KeysInterface,
    LuaInterface, PubsubInterface,
};
use fred::types::config::{ConnectionConfig, Options, PerformanceConfig};
use fred::types::{Builder, ClusterHash, CustomCommand, RespVersion};
use tokio::sync::{broadcast, Notify};

use crate::engine::client::settings::{ReconnectPolicy, Shape};
use crate::engine::client::value::{key_slot, FromValue, Key, ScanType, Server, Value};
use crate::engine::client::{
    ConnectionLike, LinkLike, Messages, Protocol, Reconnects, Route, Sent, SubscriberLike,
};
use crate::error::{Failure, RedisError, RedisErrorKind};

/// What a client is configured with: fred's own configuration, which the public builder
/// takes.
pub(crate) use fred::types::config::{Config, ServerConfig};

/// fred's client, which the public builder takes and the client hands out (below).
pub(crate) use fred::clients::Client as FredClient;

/// The builder's methods that take a service's own fred configuration or client: in fred's
/// file, so that no file outside the seam names fred.
impl crate::config::LockClientBuilder {
    /// A complete fred configuration (servers, credentials, TLS); it takes precedence over
    /// [`url`](Self::url).
    #[cfg_attr(docsrs, doc(cfg(feature = "fred")))]
    pub fn config(mut self, config: Config) -> Self {
        self.config = Some(config);
        self
    }

    /// The servers, credentials, TLS and protocol of a fred client the service already has, so
    /// that they are written once: the same as [`config`](Self::config) with
    /// `client.client_config()`. fredlock opens connections of its own with them (its commands
    /// are sent once each, never again after a reconnect, and its pub/sub needs a connection of
    /// its own), so the service's client is left as it is. Timeouts and the reconnect policy
    /// stay this builder's ([`command_timeout`](Self::command_timeout),
    /// [`reconnect_policy`](Self::reconnect_policy)).
    ///
    /// ```no_run
    /// # async fn demo() -> fredlock::Result<()> {
    /// use fredlock::fred::prelude::*;
    ///
    /// let config = Config::from_url("redis://:secret@127.0.0.1:6379").expect("a valid URL");
    /// let redis = Builder::from_config(config).build().expect("a client");
    /// redis.init().await.expect("connected");
    /// let locks = fredlock::LockClient::builder().fred_client(&redis).build().await?;
    /// # Ok(()) }
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "fred")))]
    pub fn fred_client(self, client: &FredClient) -> Self {
        self.config(client.client_config())
    }
}

/// The client's method that hands out its fred client.
impl crate::client::LockClient {
    /// The fred client this lock client sends its commands on, for data commands that go with
    /// the locks (one connection setup for both).
    ///
    /// It is configured for locks: every command is sent **once** (`max_command_attempts` 1,
    /// so a command cut off by a reconnect fails instead of being sent again; a lock script must
    /// never run twice), with the builder's `command_timeout` and reconnect policy. Retry your
    /// own idempotent commands yourself if you need to. Do not `quit()` it: that closes the
    /// lock client's connection; [`shutdown`](Self::shutdown) does it when you are done.
    ///
    /// `None` when the client runs on another library ([`Backend`](crate::Backend)).
    #[cfg_attr(docsrs, doc(cfg(feature = "fred")))]
    pub fn redis(&self) -> Option<&FredClient> {
        self.engine().core().redis().fred()
    }
}

/// fred's refusal to write a command a second time.
const TOO_MANY_WRITES: &str = "Too many failed write attempts.";

/// fred's refusal to follow an `ASK` (a slot half moved to another master) when the command
/// has no attempt left: the server answered `ASK`, so the command did not run. fred then ends
/// its routing task: the client answers no call until it is started again.
const ASK_REFUSED: &str = "Max attempts reached.";

/// fred's words for a call whose reply channel it dropped: its routing task ended (after an
/// `ASK` it could not follow, see [`ASK_REFUSED`]) with the call written and unanswered, and
/// dropped the connection's buffer. The call may have run.
const DROPPED_IN_FLIGHT: &str = "channel closed";

/// Pub/sub messages buffered per subscriber before a slow reader loses some (and then wakes
/// every waiter). fred's default of 32 is easily outrun by a busy lock.
const MESSAGE_BUFFER: usize = 4096;

/// fred's builder of one lock client's connections, all with the same settings.
pub(crate) struct Connections {
    builder: Builder,
}

impl Connections {
    /// Connections to what `config` names, over `protocol` (when `None`: the configuration's),
    /// whose calls fail after `command_timeout` without a reply, coming back as
    /// `reconnect_policy` says.
    pub(crate) fn new(
        config: &Config,
        protocol: Option<Protocol>,
        command_timeout: Duration,
        reconnect_policy: &ReconnectPolicy,
    ) -> Connections {
        let mut config = config.clone();
        if let Some(protocol) = protocol {
            config.version = match protocol {
                Protocol::Resp2 => RespVersion::RESP2,
                Protocol::Resp3 => RespVersion::RESP3,
            };
        }
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
        let mut builder = Builder::from_config(config);
        builder
            .set_performance_config(performance)
            .set_connection_config(connection)
            .set_policy(fred_policy(reconnect_policy));
        Connections { builder }
    }

    /// A command connection, not connected yet.
    pub(crate) fn connection(&self) -> Result<FredConnection, RedisError> {
        Ok(FredConnection::new(self.builder.build()?))
    }

    /// A subscriber, not connected yet.
    pub(crate) fn subscriber(&self) -> Result<FredSubscriber, RedisError> {
        Ok(Fred {
            client: self.builder.build_subscriber_client()?,
            dropped: None,
        })
    }
}

/// A connection to `sentinel` that both subscribes and asks (RESP3, so that it can ask who the
/// master is while it is subscribed), logged in as `config` says for its sentinels, with TLS
/// when the servers speak it. Its calls fail after `timeout`.
pub(crate) fn sentinel(
    config: &Config,
    sentinel: &Server,
    timeout: Duration,
) -> Result<FredConnection, RedisError> {
    let (username, password) = match &config.server {
        ServerConfig::Sentinel {
            username, password, ..
        } => (username.clone(), password.clone()),
        _ => (None, None),
    };
    let config = Config {
        server: ServerConfig::Centralized {
            server: sentinel.clone(),
        },
        username: username.or_else(|| config.username.clone()),
        password: password.or_else(|| config.password.clone()),
        version: RespVersion::RESP3,
        #[cfg(any(feature = "tls-rustls", feature = "tls-native-tls"))]
        tls: config.tls.clone(),
        ..Config::default()
    };
    let client = Builder::from_config(config)
        .with_performance_config(|performance| {
            performance.default_command_timeout = timeout;
        })
        .build()?;
    Ok(FredConnection::new(client))
}

/// `policy` in fred's words.
pub(crate) fn fred_policy(policy: &ReconnectPolicy) -> fred::types::config::ReconnectPolicy {
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

/// One of fred's clients behind the seam: its client (`Client` for commands,
/// `SubscriberClient` for pub/sub), and for a command connection what fred does not track
/// itself: whether its one server's connection dropped (shared by clones).
#[derive(Clone)]
pub(crate) struct Fred<C> {
    client: C,
    dropped: Option<Arc<Dropped>>,
}

/// fred's client as a command connection.
pub(crate) type FredConnection = Fred<Client>;

/// fred's subscriber client.
pub(crate) type FredSubscriber = Fred<SubscriberClient>;

impl FredConnection {
    pub(crate) fn new(client: Client) -> FredConnection {
        Fred {
            client,
            dropped: Some(Arc::new(Dropped {
                now: AtomicBool::new(false),
                back: Notify::new(),
                followed: AtomicBool::new(false),
            })),
        }
    }

    /// fred's client, for the public API that hands it out.
    pub(crate) fn client(&self) -> &Client {
        &self.client
    }
}

/// Runs `$fred` on fred's client `$on`, routed as `$route` says, and sorts the error.
macro_rules! routed {
    ($route:expr, $on:expr, |$client:ident| $fred:expr) => {
        match options($route) {
            None => {
                let $client = $on;
                $fred.await.map_err(RedisError::from)
            }
            Some(options) => {
                let $client = &$on.with_options(&options);
                $fred.await.map_err(RedisError::from)
            }
        }
    };
}

/// fred's options for a call routed as `route` says; none for a call routed by its first key.
#[inline]
fn options(route: &Route) -> Option<Options> {
    match route {
        Route::FirstKey => None,
        Route::Node(node) => Some(Options {
            cluster_node: Some(node.clone()),
            ..Options::default()
        }),
        Route::Slot(slot) => Some(Options {
            cluster_hash: Some(ClusterHash::Custom(*slot)),
            ..Options::default()
        }),
    }
}

/// What fred's command connection and its subscriber do alike.
impl<C: ClientLike + EventInterface + Clone + Send + Sync + 'static> LinkLike for Fred<C> {
    async fn connect(&self) -> Result<(), RedisError> {
        if let Some(dropped) = &self.dropped {
            if !self.client.is_clustered() && !dropped.followed.swap(true, Ordering::Relaxed) {
                follow_drops(&self.client, dropped);
            }
        }
        let task = self.client.init().await?;
        keep_routing(self.client.clone(), task);
        Ok(())
    }

    fn messages(&self) -> Messages {
        self.client.message_rx()
    }

    fn reconnects(&self) -> Reconnects {
        self.client.reconnect_rx()
    }

    fn connected_to(&self) -> Vec<Server> {
        self.client.active_connections()
    }

    async fn reconnect(&self) {
        let _ = self.client.force_reconnection().await;
    }

    async fn quit(&self) {
        let _ = self.client.quit().await;
    }
}

impl ConnectionLike for FredConnection {
    fn is_connected(&self) -> bool {
        let dropped = self.dropped.as_ref();
        !dropped.is_some_and(|dropped| dropped.now.load(Ordering::Acquire))
            && self.client.is_connected()
    }

    async fn wait_for_connect(&self) {
        let _ = self.client.wait_for_connect().await;
        if let Some(dropped) = &self.dropped {
            dropped.back().await;
        }
    }

    fn is_clustered(&self) -> bool {
        self.client.is_clustered()
    }

    fn sentinel_service(&self) -> Option<String> {
        match &self.client.client_config().server {
            ServerConfig::Sentinel { service_name, .. } => Some(service_name.clone()),
            _ => None,
        }
    }

    fn server_major(&self) -> Option<u64> {
        self.client.server_version().map(|version| version.major)
    }

    fn command_timeout(&self) -> Duration {
        self.client.perf_config().default_command_timeout
    }

    fn masters(&self) -> Vec<Server> {
        self.client
            .cached_cluster_state()
            .map(|state| state.unique_primary_nodes())
            .unwrap_or_default()
    }

    async fn call<R: FromValue>(
        &self,
        route: &Route,
        sent: Sent<'_>,
        call: &impl Fn() -> (Vec<Key>, Vec<Value>),
    ) -> Result<R, RedisError> {
        let (keys, args) = call();
        match sent {
            Sent::Command(name) => {
                let mut command: Vec<Value> = keys.into_iter().map(Value::from).collect();
                command.extend(args);
                let name = CustomCommand::new_static(name, ClusterHash::FirstKey, false);
                routed!(route, &self.client, |client| client
                    .custom::<R, Value>(name, command))
            }
            Sent::Script { sha, body } => {
                match routed!(route, &self.client, |client| client
                    .evalsha::<R, _, _, _>(sha, keys, args))
                {
                    Err(error) if error.details().starts_with("NOSCRIPT") => {
                        let (keys, args) = call();
                        routed!(route, &self.client, |client| client
                            .eval::<R, _, _, _>(body, keys, args))
                    }
                    other => other,
                }
            }
        }
    }

    async fn command<R: FromValue>(
        &self,
        route: &Route,
        name: &'static str,
        args: Vec<Value>,
    ) -> Result<R, RedisError> {
        let name = CustomCommand::new_static(name, ClusterHash::FirstKey, false);
        routed!(route, &self.client, |client| client
            .custom::<R, Value>(name, args))
    }

    async fn pipeline(
        &self,
        _route: &Route,
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

    async fn scan_page(
        &self,
        route: &Route,
        cursor: String,
        pattern: &str,
        count: u32,
        of_type: Option<ScanType>,
    ) -> Result<(String, Vec<String>), RedisError> {
        routed!(route, &self.client, |client| client
            .scan_page::<(String, Vec<String>), _, _>(
                cursor,
                pattern,
                Some(count),
                of_type
            ))
    }

    async fn subscribe(&self, channel: &str) -> Result<(), RedisError> {
        Ok(self.client.subscribe(channel).await?)
    }

    // fred's own commands for the reads, as it routes them.

    async fn get<R: FromValue>(&self, route: &Route, key: Key) -> Result<R, RedisError> {
        routed!(route, &self.client, |client| client.get::<R, _>(key))
    }

    async fn hget<R: FromValue>(
        &self,
        route: &Route,
        key: Key,
        field: &str,
    ) -> Result<R, RedisError> {
        routed!(route, &self.client, |client| client
            .hget::<R, _, _>(key, field))
    }

    async fn key_type(&self, route: &Route, key: Key) -> Result<String, RedisError> {
        routed!(route, &self.client, |client| client
            .r#type::<String, _>(key))
    }

    async fn pttl(&self, route: &Route, key: Key) -> Result<i64, RedisError> {
        routed!(route, &self.client, |client| client.pttl::<i64, _>(key))
    }

    async fn subscribers(
        &self,
        route: &Route,
        channel: &str,
        sharded: bool,
    ) -> Result<Vec<Value>, RedisError> {
        if sharded {
            routed!(route, &self.client, |client| client
                .pubsub_shardnumsub::<Vec<Value>, _>(channel))
        } else {
            routed!(route, &self.client, |client| client
                .pubsub_numsub::<Vec<Value>, _>(channel))
        }
    }

    async fn set_name(&self, route: &Route, name: &str) -> Result<(), RedisError> {
        routed!(route, &self.client, |client| client.client_setname(name))
    }

    async fn client_list(&self, route: &Route) -> Result<String, RedisError> {
        routed!(route, &self.client, |client| client
            .client_list::<String, String>(None, None))
    }
}

impl SubscriberLike for FredSubscriber {
    /// fred completes a `SUBSCRIBE` as soon as it is written, not when Redis has processed it:
    /// a `PING` behind it, on the same connection (in a cluster, the node fred sends
    /// subscriptions to), answers only once it took effect, as Redis runs one connection's
    /// commands in order.
    async fn subscribe(&self, channels: Vec<String>) -> Result<(), RedisError> {
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

    /// fred completes an `SSUBSCRIBE` on its reply: it never pipelines one, so that it can
    /// follow a `MOVED`.
    async fn ssubscribe(&self, channels: Vec<String>) -> Result<(), RedisError> {
        Ok(self.client.ssubscribe(channels).await?)
    }

    async fn unsubscribe(&self, channels: Vec<String>) -> Result<(), RedisError> {
        Ok(self.client.unsubscribe(channels).await?)
    }

    async fn sunsubscribe(&self, channels: Vec<String>) -> Result<(), RedisError> {
        Ok(self.client.sunsubscribe(channels).await?)
    }

    fn shards(&self) -> bool {
        true
    }

    fn tracked_channels(&self) -> Vec<String> {
        self.client
            .tracked_channels()
            .into_iter()
            .map(|channel| channel.to_string())
            .collect()
    }

    fn slot_owner(&self, slot: u16) -> Option<Server> {
        self.client
            .cached_cluster_state()?
            .get_server(slot)
            .cloned()
    }

    async fn refresh_slots(&self) -> Result<(), RedisError> {
        Ok(self.client.sync_cluster().await?)
    }
}

/// Starts fred's routing task again when it ended on an `ASK` it could not follow (fred sends
/// each command once, `max_command_attempts` 1, and has no attempt left for the `ASKING` an
/// `ASK` needs; it then disconnects and ends the task, and every later call would time out).
/// Any other end (the client quit, the reconnect policy gave up) is left as fred leaves it.
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
/// timeout: the engine asks the connection whether it is connected to fail such a call at
/// once. Errors are read before reconnects, so a drop and the reconnect after it, both unread,
/// leave it false. A cluster's nodes drop one at a time, each without the others: not
/// followed.
fn follow_drops<C: EventInterface>(client: &C, dropped: &Arc<Dropped>) {
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
struct Dropped {
    /// True from a drop until the reconnect after it (an atomic: every attempt reads it).
    now: AtomicBool,
    /// Told when `now` turns false.
    back: Notify,
    /// Whether a task follows it (started by the first `connect`).
    followed: AtomicBool,
}

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

impl From<FredError> for RedisError {
    fn from(error: FredError) -> RedisError {
        // fred's words for an ASK it did not follow name neither the ASK nor the migration.
        let details = if error.details() == ASK_REFUSED {
            "ASK not followed: the slot of the call's keys is being migrated to another node, \
             and a call is sent once"
        } else if error.details() == DROPPED_IN_FLIGHT {
            "no reply: the connection's routing stopped with the call in flight (as it does after \
             an ASK it cannot follow, the slot of a call's keys being migrated to another node); \
             the call may have run"
        } else {
            error.details()
        };
        RedisError::new(kind(&error), failure(error.kind()), details)
    }
}

/// What `error` means for the command that met it.
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
                || details == DROPPED_IN_FLIGHT
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
        // An ASK fred did not follow: the server answered ASK, so it did not run.
        let error = RedisError::from(FredError::new(ErrorKind::Routing, ASK_REFUSED));
        assert_eq!(error.kind(), RedisErrorKind::NotSent);
        assert!(error.details().starts_with("ASK not followed"), "{error}");
        // A call in flight when fred's routing ended on such an ASK: it was written, so it may
        // have run (a semaphore's permits taken, say), and its words say why it has no reply.
        let error = RedisError::from(FredError::new(ErrorKind::Unknown, DROPPED_IN_FLIGHT));
        assert_eq!(error.kind(), RedisErrorKind::NoReply);
        assert!(error.details().contains("ASK"), "{error}");
        // Errors name the refusal, never the client library under them (the same on both).
        for details in [ASK_REFUSED, DROPPED_IN_FLIGHT] {
            let error = RedisError::from(FredError::new(ErrorKind::Unknown, details));
            let shown = error.to_string().to_ascii_lowercase();
            assert!(!shown.contains("fred"), "{shown}");
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

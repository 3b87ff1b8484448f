//! Building a [`LockClient`]: where Redis is and how locks behave.

use std::time::Duration;

use crate::client::LockClient;
use crate::engine::replicas::ReplicaSync;
use crate::engine::{durations, Config, ReconnectPolicy, Server, ServerConfig};
use crate::error::{Error, Result};

/// Redisson's default: a watchdog lock lives 30 s without renewal and is renewed every 10 s.
pub const DEFAULT_WATCHDOG_LEASE: Duration = Duration::from_secs(30);

/// How long a fair lock's waiter keeps its place in line without trying again. Redisson's
/// default is 5 minutes, which is how long a crashed waiter at the head can stall its lock there.
pub const DEFAULT_QUEUE_PLACE: Duration = Duration::from_secs(5);

/// How long one Redis command may take before it fails with [`Error::Redis`].
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(5);

/// The client library a [`LockClient`]'s connections are made with; see
/// [`LockClientBuilder::backend`].
///
/// fred is the default, and the default exists only where fred does (`Default` with feature
/// `fred`): a build without fred names `Backend::RedisRs`, so that its code keeps its backend
/// when another crate in the same build turns fred on (features are additive).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "fred", derive(Default))]
#[non_exhaustive]
pub enum Backend {
    /// fred, the default: every deployment (standalone, cluster, Sentinel, TLS).
    #[cfg(feature = "fred")]
    #[cfg_attr(docsrs, doc(cfg(feature = "fred")))]
    #[cfg_attr(feature = "fred", default)]
    Fred,
    /// redis-rs 1.x (feature `redis-rs`), the client most Rust services already have: a
    /// standalone server, a cluster (sharded pub/sub on Redis 7 and later), or the master
    /// behind Sentinel (found through the sentinels on every connect, followed on a switch as
    /// on fred); over TLS from a `rediss://` URL (feature `tls-rustls`; the roots redis-rs
    /// trusts, the platform's by default) or through a service's own redis-rs client handed
    /// over with [`LockClientBuilder::redis_rs_client`] (its own CA, say); over RESP3 unless
    /// [`LockClientBuilder::protocol`] (or the handed-over client) says RESP2.
    #[cfg(feature = "redis-rs")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis-rs")))]
    RedisRs,
}

/// The version of the Redis protocol (RESP) the connections speak; see
/// [`LockClientBuilder::protocol`]. Redisson's `Config.setProtocol` names the same choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Protocol {
    /// RESP2, which every Redis and every proxy speaks. Pub/sub takes a connection of its own
    /// on either backend.
    Resp2,
    /// RESP3 (Redis 6 and later): on redis-rs, pub/sub messages come as pushes.
    Resp3,
}

impl std::str::FromStr for Protocol {
    type Err = Error;

    /// `resp2` or `resp3` (any case), as redis-rs's URLs write it (`?protocol=resp3`).
    fn from_str(name: &str) -> Result<Protocol> {
        match name.to_ascii_lowercase().as_str() {
            "resp2" => Ok(Protocol::Resp2),
            "resp3" => Ok(Protocol::Resp3),
            _ => Err(Error::InvalidArgument(format!(
                "protocol {name:?}: expected resp2 or resp3"
            ))),
        }
    }
}

impl std::str::FromStr for Backend {
    type Err = Error;

    /// `fred` or `redis-rs` (the latter with feature `redis-rs`), as a configuration file or an
    /// environment variable names the backend.
    fn from_str(name: &str) -> Result<Backend> {
        match name {
            #[cfg(feature = "fred")]
            "fred" => Ok(Backend::Fred),
            #[cfg(not(feature = "fred"))]
            "fred" => Err(Error::InvalidArgument(
                "backend fred: fredlock was built without feature fred (its default)".into(),
            )),
            #[cfg(feature = "redis-rs")]
            "redis-rs" => Ok(Backend::RedisRs),
            #[cfg(not(feature = "redis-rs"))]
            "redis-rs" => Err(Error::InvalidArgument(
                "backend redis-rs: fredlock was built without feature redis-rs".into(),
            )),
            other => Err(Error::InvalidArgument(format!(
                "backend {other:?}: expected fred or redis-rs"
            ))),
        }
    }
}

/// Builds a [`LockClient`]; start with [`LockClient::builder`].
///
/// ```no_run
/// # async fn demo() -> fredlock::Result<()> {
/// use std::time::Duration;
///
/// let client = fredlock::LockClient::builder()
///     .url("redis://127.0.0.1:6379")
///     .watchdog_lease(Duration::from_secs(10))
///     .build()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
#[must_use = "a builder does nothing until build() is awaited"]
pub struct LockClientBuilder {
    pub(crate) url: Option<String>,
    pub(crate) config: Option<Config>,
    pub(crate) watchdog_lease: Duration,
    pub(crate) command_timeout: Duration,
    pub(crate) queue_place: Duration,
    /// `None`: two thirds of the watchdog lease, whatever that ends up being.
    renew_deadline: Option<Duration>,
    pub(crate) reconnect_policy: ReconnectPolicy,
    pub(crate) key_prefix: String,
    sentinel: Option<Sentinel>,
    sentinel_credentials: Option<Credentials>,
    credentials: Option<Credentials>,
    pub(crate) replica_sync: Option<ReplicaSync>,
    pub(crate) metrics_lock_names: bool,
    pub(crate) client_name: Option<String>,
    /// The backend named (`backend`, `redis_rs_client`, `fred_client`, `config`); none: fred.
    pub(crate) backend: Option<Backend>,
    protocol: Option<Protocol>,
    /// The connection settings of the service's own redis-rs client, when handed over.
    #[cfg(feature = "redis-rs")]
    pub(crate) redis_rs: Option<crate::engine::RedisRsSettings>,
}

/// Where the sentinels are and which master they watch.
#[derive(Clone, Debug)]
struct Sentinel {
    service_name: String,
    sentinels: Vec<Server>,
}

/// An optional ACL user name with its password.
#[derive(Clone)]
struct Credentials {
    username: Option<String>,
    password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

/// Every setting but the secrets: a URL's passwords are written `***`, a fred configuration
/// and a handed-over redis-rs client (whose own `Debug` shows their passwords) only as given.
impl std::fmt::Debug for LockClientBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut debug = f.debug_struct("LockClientBuilder");
        debug
            .field("url", &self.url.as_deref().map(redacted))
            .field("config", &self.config.as_ref().map(|_| "a fred Config"))
            .field("watchdog_lease", &self.watchdog_lease)
            .field("command_timeout", &self.command_timeout)
            .field("queue_place", &self.queue_place)
            .field("renew_deadline", &self.renew_deadline)
            .field("key_prefix", &self.key_prefix)
            .field("sentinel", &self.sentinel)
            .field("sentinel_credentials", &self.sentinel_credentials)
            .field("credentials", &self.credentials)
            .field("replica_sync", &self.replica_sync)
            .field("metrics_lock_names", &self.metrics_lock_names)
            .field("client_name", &self.client_name)
            .field("backend", &self.backend)
            .field("protocol", &self.protocol);
        #[cfg(feature = "redis-rs")]
        debug.field(
            "redis_rs_client",
            &self
                .redis_rs
                .as_ref()
                .map(|_| "a redis-rs client's settings"),
        );
        debug.finish_non_exhaustive()
    }
}

impl Default for LockClientBuilder {
    fn default() -> Self {
        LockClientBuilder {
            url: None,
            config: None,
            watchdog_lease: DEFAULT_WATCHDOG_LEASE,
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
            queue_place: DEFAULT_QUEUE_PLACE,
            renew_deadline: None,
            // Forever, backing off from 100 ms to 2 s: a lock client that stops reconnecting
            // strands every waiter and every watchdog lock.
            reconnect_policy: ReconnectPolicy::new_exponential(0, 100, 2_000, 2),
            key_prefix: String::new(),
            sentinel: None,
            sentinel_credentials: None,
            credentials: None,
            replica_sync: None,
            metrics_lock_names: false,
            client_name: None,
            backend: None,
            protocol: None,
            #[cfg(feature = "redis-rs")]
            redis_rs: None,
        }
    }
}

impl LockClientBuilder {
    /// The server to use: `redis://`, `rediss://`, `redis-cluster://` or `redis-sentinel://`.
    ///
    /// A Sentinel URL names one sentinel as its host, the others as `node` parameters, and the
    /// service (the name the sentinels monitor the master by) as `sentinelServiceName`; user and
    /// password are the Redis servers' own, `sentinelUsername` and `sentinelPassword` the
    /// sentinels' when they have their own:
    ///
    /// ```text
    /// redis-sentinel://:secret@10.0.0.1:26379/0?sentinelServiceName=locks&node=10.0.0.2:26379&node=10.0.0.3:26379&sentinelPassword=s3
    /// ```
    ///
    /// The client asks the sentinels for the master, checks that the server it reaches says it is
    /// the master (`ROLE`), and after a failover reconnects to whichever server the sentinels
    /// name then. See [`sentinel`](Self::sentinel) for the same without a URL.
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.url = Some(url.into());
        self
    }

    /// The client library the connections are made with: `Backend::Fred` (the default, with
    /// feature `fred`) or, with feature `redis-rs`, `Backend::RedisRs`. Every lock kind, its
    /// keys and its scripts are the same on both, so clients on either exclude each other.
    ///
    /// A build without fred has no default: name `Backend::RedisRs` (or hand over a redis-rs
    /// client with `redis_rs_client`); [`build`](Self::build) refuses a
    /// builder that names none, with [`Error::InvalidArgument`]. So the same code keeps its
    /// backend when another crate in the build turns fred on.
    ///
    /// ```no_run
    /// # async fn demo() -> fredlock::Result<()> {
    /// # #[cfg(feature = "redis-rs")] {
    /// use fredlock::{Backend, LockClient};
    ///
    /// let client = LockClient::builder()
    ///     .backend(Backend::RedisRs)
    ///     .url("redis://127.0.0.1:6379")
    ///     .build()
    ///     .await?;
    /// # }
    /// # Ok(()) }
    /// ```
    pub fn backend(mut self, backend: Backend) -> Self {
        self.backend = Some(backend);
        self
    }

    /// The version of the Redis protocol the connections speak. When not given: on fred, its
    /// configuration's (`config(..)`, `fred_client(..)`; fred's default is RESP2); on
    /// redis-rs, RESP3, a client handed over with `redis_rs_client(..)` included (redis-rs's
    /// own default, RESP2, cannot be told from a choice).
    ///
    /// Locks, their keys, scripts and messages are the same over either, so clients on RESP2
    /// and RESP3 exclude each other and wake each other's waiters. Over RESP2 on redis-rs the
    /// client's pub/sub takes a connection of its own (redis-rs's `aio::PubSub`), which knows
    /// only classic channels: a cluster of Redis 7 or later, whose lock channels are sharded,
    /// is refused at [`build`](Self::build) there. Over RESP2 with TLS on redis-rs, a broken
    /// command connection is noticed by the next call that meets it (its answer: the reply
    /// may be lost), not the moment it breaks: redis-rs makes that stream alone and tells
    /// nobody of its end.
    ///
    /// ```no_run
    /// # async fn demo() -> fredlock::Result<()> {
    /// use fredlock::{LockClient, Protocol};
    ///
    /// // A proxy in front of Redis that speaks RESP2 only.
    /// let client = LockClient::builder()
    ///     .url("redis://127.0.0.1:6379")
    ///     .protocol(Protocol::Resp2)
    ///     .build()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn protocol(mut self, protocol: Protocol) -> Self {
        self.protocol = Some(protocol);
        self
    }

    /// The engine's name for [`protocol`](Self::protocol).
    pub(crate) fn engine_protocol(&self) -> Option<crate::engine::Protocol> {
        self.protocol.map(|protocol| match protocol {
            Protocol::Resp2 => crate::engine::Protocol::Resp2,
            Protocol::Resp3 => crate::engine::Protocol::Resp3,
        })
    }

    /// The engine's name for [`backend`](Self::backend): fred when none was named, and in a
    /// build without fred an error that says to name one (were redis-rs the default there, the
    /// same code would move to fred when another crate in the build turned fred on).
    pub(crate) fn library(&self) -> Result<crate::engine::Library> {
        match self.backend {
            #[cfg(feature = "fred")]
            Some(Backend::Fred) | None => Ok(crate::engine::Library::Fred),
            #[cfg(feature = "redis-rs")]
            Some(Backend::RedisRs) => Ok(crate::engine::Library::RedisRs(
                self.redis_rs.clone().map(Box::new),
            )),
            #[cfg(not(feature = "fred"))]
            None => Err(Error::InvalidArgument(
                "no backend named, and fredlock was built without feature fred (the default \
                 backend): name it with .backend(Backend::RedisRs), or hand over a redis-rs \
                 client with .redis_rs_client(..)"
                    .into(),
            )),
        }
    }

    /// Finds the master through Redis Sentinel: `sentinels` are the sentinels' addresses (one is
    /// enough to start; the client learns the rest from it) and `service_name` the name they
    /// monitor the master by (`sentinel monitor <service_name> ..` in their configuration).
    ///
    /// It replaces the servers of [`url`](Self::url) or `config`, whose
    /// password, database and TLS settings still apply; a URL is then optional.
    ///
    /// ```no_run
    /// # async fn demo() -> fredlock::Result<()> {
    /// let client = fredlock::LockClient::builder()
    ///     .sentinel("locks", [("10.0.0.1", 26379), ("10.0.0.2", 26379), ("10.0.0.3", 26379)])
    ///     .credentials(None, "redis-secret")
    ///     .sentinel_credentials(None, "sentinel-secret")
    ///     .build()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn sentinel<H: Into<String>>(
        mut self,
        service_name: impl Into<String>,
        sentinels: impl IntoIterator<Item = (H, u16)>,
    ) -> Self {
        self.sentinel = Some(Sentinel {
            service_name: service_name.into(),
            sentinels: sentinels
                .into_iter()
                .map(|(host, port)| Server::new(host.into(), port))
                .collect(),
        });
        self
    }

    /// The user (`None`: the default user) and password the **sentinels** ask for, when they are
    /// protected apart from the Redis servers (`requirepass` in the sentinels' configuration).
    /// Needs a Sentinel deployment, from [`sentinel`](Self::sentinel) or a `redis-sentinel://`
    /// URL.
    pub fn sentinel_credentials(
        mut self,
        username: Option<String>,
        password: impl Into<String>,
    ) -> Self {
        self.sentinel_credentials = Some(Credentials {
            username,
            password: password.into(),
        });
        self
    }

    /// The user (`None`: the default user) and password of the Redis servers, over whatever
    /// [`url`](Self::url) or `config` says.
    pub fn credentials(mut self, username: Option<String>, password: impl Into<String>) -> Self {
        self.credentials = Some(Credentials {
            username,
            password: password.into(),
        });
        self
    }

    /// Confirms every change with replicas before it counts; see [`ReplicaSync`]. Off by
    /// default. `build()` fails with [`Error::InvalidArgument`] naming this option when the
    /// server refuses `WAIT` (some proxies and managed services do).
    pub fn replica_sync(mut self, sync: ReplicaSync) -> Self {
        self.replica_sync = Some(sync);
        self
    }

    /// How long a lock taken without a lease lives without renewal; the watchdog renews it every
    /// third of this. A crashed holder's lock frees itself after at most this long. Default 30 s.
    pub fn watchdog_lease(mut self, lease: Duration) -> Self {
        self.watchdog_lease = lease;
        self
    }

    /// How long after the last confirmed renewal a watchdog-renewed lock is reported lost when
    /// no renewal gets through (Kubernetes' renew deadline): its guards'
    /// [`lost()`](crate::LockGuard::lost) completes then, *before* Redis could expire the lock,
    /// so work can stop while it is still protected. Counted from when that renewal was sent,
    /// which is before Redis set the TTL; a renewal confirmed later does not undo the report.
    ///
    /// More than a renewal period (a third of the watchdog lease) and at most the watchdog
    /// lease. Default: two thirds of the watchdog lease (20 s of 30 s), which leaves a third
    /// of it, 10 s by default, between the report and the earliest moment another owner could
    /// take the lock.
    pub fn renew_deadline(mut self, deadline: Duration) -> Self {
        self.renew_deadline = Some(deadline);
        self
    }

    /// The renew deadline in effect.
    pub(crate) fn effective_renew_deadline(&self) -> Duration {
        self.renew_deadline.unwrap_or(self.watchdog_lease / 3 * 2)
    }

    /// How long one Redis command may take before it fails. Default 5 s.
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }

    /// How long a [`FairLock`](crate::FairLock) waiter's place in line lasts without trying
    /// again: its queue place. Live waiters try again every third of this, so it bounds how long a
    /// waiter whose process died can hold up the line. Default 5 s.
    ///
    /// The same holds for a waiting writer of an [`RwLock`](crate::RwLock), whose place keeps
    /// new readers out: a writer whose process died keeps them out for at most this long; and
    /// for a client waiting on a [`Lock`](crate::Lock), whose place in the lock's line of
    /// waiting clients decides which client a release wakes: a client that died in line costs
    /// the others at most a third of this before they try again. A client keeps that place with
    /// one attempt a third of this, whichever of its tasks waiting on the lock makes it, not one
    /// from each.
    pub fn queue_place(mut self, place: Duration) -> Self {
        self.queue_place = place;
        self
    }

    /// How a connection is made again after it drops ([`ReconnectPolicy`](crate::ReconnectPolicy),
    /// on either client library; with feature `fred`, fred's own policy is taken too). Default:
    /// forever, with exponential backoff from 100 ms to 2 s.
    pub fn reconnect_policy(mut self, policy: impl Into<ReconnectPolicy>) -> Self {
        self.reconnect_policy = policy.into();
        self
    }

    /// A namespace for every key and channel of this client's locks: the lock named `name` is
    /// the key `<prefix><name>`, and its channels and fair-lock keys are derived from that key,
    /// so two applications sharing one Redis cannot collide. Default: none, as Redisson.
    ///
    /// This is what a Redisson `NameMapper` that prepends the same prefix does, so a Java service
    /// configured that way and fredlock still exclude each other. Every client (and every
    /// [`RedLock`](crate::RedLock) node) working on the same locks needs the same prefix. It may
    /// not contain `{` or `}`, which would change the cluster slot of the names.
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = prefix.into();
        self
    }

    /// Labels every metric of a primitive with its name (label `lock`), besides its kind.
    /// Default: off, as names are unbounded (an order id per lock makes a time series per
    /// order); turn it on for a service with a few well-known locks. With names, every record
    /// looks its metric up in the recorder's registry; without, a client registers each kind's
    /// metrics once.
    ///
    /// Metrics are recorded only with the `metrics` feature; see the README's Operations
    /// section for their names.
    pub fn metrics_lock_names(mut self, on: bool) -> Self {
        self.metrics_lock_names = on;
        self
    }

    /// A name for people: which service (or pod) this client is, shown beside its owner field
    /// wherever a holder is shown. Default: none.
    ///
    /// Owner fields stay Redisson's `<client uuid>:<owner id>`, which tell an operator nothing
    /// about which service holds a lock. With a name, each connection of the client is named
    /// `<name>@<client uuid>` (`CLIENT SETNAME`, again after every reconnect), so `CLIENT LIST`
    /// shows it, and [`Holder::client_name`](crate::Holder::client_name), the `fredlock`
    /// command's `list`, `inspect` and `watch`, and the client's lost-lock warnings (field
    /// `client`) give it beside the owner. A server that refuses `CLIENT SETNAME` (an ACL without
    /// it) still serves the locks; the client warns once.
    ///
    /// ```no_run
    /// # async fn demo() -> fredlock::Result<()> {
    /// let client = fredlock::LockClient::builder()
    ///     .url("redis://127.0.0.1:6379")
    ///     .client_name("billing-7")
    ///     .build()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// `build()` refuses with [`Error::InvalidArgument`] a name `CLIENT SETNAME` would refuse
    /// (spaces, newlines, characters outside printable ASCII), an empty one, and one over 64
    /// characters.
    pub fn client_name(mut self, name: impl Into<String>) -> Self {
        self.client_name = Some(name.into());
        self
    }

    /// Connects and starts the client's background tasks.
    ///
    /// Fails with [`Error::InvalidArgument`] for a missing or unparsable URL, or a timeout out of
    /// range (`watchdog_lease` and `queue_place` at least 3 ms, `command_timeout` at
    /// least 1 ms, each at most [`MAX_DURATION`](crate::MAX_DURATION); `renew_deadline` between
    /// a renewal period and `watchdog_lease`), or a [`client_name`](Self::client_name) Redis
    /// would refuse, and with
    /// [`Error::Redis`] when the server cannot be reached.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future closes any connection it opened.
    pub async fn build(self) -> Result<LockClient> {
        // A third of each must be a timer tick at least: the renewal period, the fair waiter's
        // retry.
        let three_ticks = Duration::from_millis(3);
        durations::check("watchdog_lease", self.watchdog_lease, three_ticks)?;
        durations::check("queue_place", self.queue_place, three_ticks)?;
        durations::check(
            "command_timeout",
            self.command_timeout,
            Duration::from_millis(1),
        )?;
        let deadline = self.effective_renew_deadline();
        if deadline <= self.watchdog_lease / 3 || deadline > self.watchdog_lease {
            return Err(Error::InvalidArgument(format!(
                "renew_deadline {deadline:?} must be more than the renewal period ({:?}, a third of \
                 watchdog_lease) and at most watchdog_lease ({:?})",
                self.watchdog_lease / 3,
                self.watchdog_lease
            )));
        }
        if let Some(sync) = &self.replica_sync {
            if sync.replicas == 0 || !(1..=64).contains(&sync.connections) {
                return Err(Error::InvalidArgument(format!(
                    "replica_sync: {} replica(s) over {} connection(s): at least one replica, and \
                     1 to 64 connections",
                    sync.replicas, sync.connections
                )));
            }
            durations::check(
                "replica_sync timeout",
                sync.timeout,
                Duration::from_millis(1),
            )?;
        }
        if let Some(name) = &self.client_name {
            crate::engine::naming::check(name)?;
        }
        if self.key_prefix.contains(['{', '}']) {
            return Err(Error::InvalidArgument(format!(
                "key_prefix {:?} contains a brace, which would move lock names with a hash tag to \
                 another cluster slot",
                self.key_prefix
            )));
        }
        LockClient::start(self).await
    }

    /// The fred configuration this builder describes.
    pub(crate) fn redis_config(&self) -> Result<Config> {
        #[cfg(feature = "redis-rs")]
        if let Some(info) = &self.redis_rs {
            // Where the handed-over client connects, for messages that name the server.
            let (host, port) = crate::engine::redis_rs_address(info);
            return Ok(Config {
                server: ServerConfig::new_centralized(host, port),
                ..Config::default()
            });
        }
        let mut config = match (&self.config, &self.url, &self.sentinel) {
            (Some(config), _, _) => config.clone(),
            (None, Some(url), _) => {
                check_scheme(url)?;
                let config = Config::from_url(url).map_err(|error| {
                    Error::InvalidArgument(hide_secrets(
                        url,
                        format!(
                            "Redis URL {url:?} is malformed ({}): write it as \
                             redis://[user:password@]host:port[/db]",
                            error.details()
                        ),
                    ))
                })?;
                check_tls_scheme(url, config.uses_tls())?;
                config
            }
            (None, None, Some(_)) => Config::default(),
            (None, None, None) => {
                return Err(Error::InvalidArgument(
                    "no Redis server given: call url(..), sentinel(..) or config(..) on the \
                     builder"
                        .into(),
                ))
            }
        };
        if let Some(sentinel) = &self.sentinel {
            if sentinel.sentinels.is_empty() {
                return Err(Error::InvalidArgument(format!(
                    "sentinel({:?}, ..) was given no sentinel address",
                    sentinel.service_name
                )));
            }
            config.server = ServerConfig::new_sentinel(
                sentinel
                    .sentinels
                    .iter()
                    .map(|server| (server.host.to_string(), server.port))
                    .collect(),
                sentinel.service_name.clone(),
            );
        }
        if let Some(credentials) = &self.credentials {
            config.username = credentials.username.clone();
            config.password = Some(credentials.password.clone());
        }
        if let Some(credentials) = &self.sentinel_credentials {
            let ServerConfig::Sentinel {
                username, password, ..
            } = &mut config.server
            else {
                return Err(Error::InvalidArgument(
                    "sentinel_credentials(..) was given, but the deployment is not Sentinel: \
                     give a redis-sentinel:// URL or call sentinel(..)"
                        .into(),
                ));
            };
            *username = credentials.username.clone();
            *password = Some(credentials.password.clone());
        }
        Ok(config)
    }
}

/// The URL schemes a client connects with, as fred reads them.
const SCHEMES: &str = "redis://, rediss:// (TLS), redis-cluster://, rediss-cluster://, \
                       redis-sentinel://, rediss-sentinel://, redis+unix://, or the same with \
                       valkey in place of redis";

/// Refuses a URL whose scheme is none of [`SCHEMES`] (`http://`, a typo): fred would take it
/// for a plain `redis://` without a word.
fn check_scheme(url: &str) -> Result<()> {
    let Some((scheme, _)) = url.split_once("://") else {
        return Err(Error::InvalidArgument(hide_secrets(
            url,
            format!(
                "Redis URL {url:?} has no scheme: write it as redis://host:port (schemes: \
                 {SCHEMES})"
            ),
        )));
    };
    let lower = scheme.to_ascii_lowercase();
    let base = ["-cluster", "-sentinel", "+unix"]
        .iter()
        .find_map(|suffix| lower.strip_suffix(suffix))
        .unwrap_or(&lower);
    if matches!(base, "redis" | "rediss" | "valkey" | "valkeys") {
        return Ok(());
    }
    Err(Error::InvalidArgument(hide_secrets(
        url,
        format!("Redis URL {url:?}: {scheme}:// is not a Redis scheme; use {SCHEMES}"),
    )))
}

/// The secrets `url` carries: its user's password, and a Sentinel URL's `sentinelPassword`.
fn url_secrets(url: &str) -> Vec<&str> {
    let mut secrets = Vec::new();
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    if let Some((user, _)) = authority.rsplit_once('@') {
        if let Some((_, password)) = user.split_once(':') {
            secrets.push(password);
        }
    }
    if let Some((_, query)) = url.split_once('?') {
        secrets.extend(
            query
                .split('&')
                .filter_map(|pair| pair.strip_prefix("sentinelPassword=")),
        );
    }
    secrets.retain(|secret| !secret.is_empty());
    secrets
}

/// `message` (about `url`) with every secret of `url` written `***`: an error or a `Debug` that
/// names a URL must not hand its passwords on to a log.
fn hide_secrets(url: &str, message: String) -> String {
    url_secrets(url)
        .into_iter()
        .fold(message, |message, secret| message.replace(secret, "***"))
}

/// `url` with its secrets written `***`.
fn redacted(url: &str) -> String {
    hide_secrets(url, url.to_owned())
}

/// Refuses a TLS URL (`rediss://`, `rediss-cluster://`, `valkeys://`..) that fred configured
/// without TLS, as it does when no TLS backend is compiled in: it would otherwise connect in
/// plaintext without a word.
fn check_tls_scheme(url: &str, tls_configured: bool) -> Result<()> {
    let scheme = url.split_once("://").map_or("", |(scheme, _)| scheme);
    let wants_tls = scheme.starts_with("rediss") || scheme.starts_with("valkeys");
    if wants_tls && !tls_configured {
        return Err(Error::InvalidArgument(format!(
            "Redis URL scheme {scheme}:// asks for TLS, but fredlock was built without TLS: \
             enable its `tls-rustls` or `tls-native-tls` feature"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentinel_settings_are_checked() {
        let credentials_alone = LockClient::builder()
            .url("redis://127.0.0.1:6379")
            .sentinel_credentials(None, "secret")
            .redis_config()
            .unwrap_err()
            .to_string();
        assert!(
            credentials_alone.contains("not Sentinel"),
            "{credentials_alone}"
        );
        let no_sentinels = LockClient::builder()
            .sentinel("locks", Vec::<(String, u16)>::new())
            .redis_config()
            .unwrap_err()
            .to_string();
        assert!(
            no_sentinels.contains("no sentinel address"),
            "{no_sentinels}"
        );
        let config = LockClient::builder()
            .sentinel("locks", [("10.0.0.1", 26379), ("10.0.0.2", 26380)])
            .credentials(Some("app".into()), "server-secret")
            .sentinel_credentials(None, "sentinel-secret")
            .redis_config()
            .unwrap();
        assert_eq!(config.username.as_deref(), Some("app"));
        assert_eq!(config.password.as_deref(), Some("server-secret"));
        let ServerConfig::Sentinel {
            hosts,
            service_name,
            password,
            ..
        } = config.server
        else {
            panic!("a Sentinel configuration");
        };
        assert_eq!(service_name, "locks");
        assert_eq!(hosts.len(), 2);
        assert_eq!(password.as_deref(), Some("sentinel-secret"));
    }

    #[test]
    fn tls_urls_need_a_tls_feature() {
        for url in [
            "rediss://127.0.0.1:6380",
            "rediss-cluster://127.0.0.1:30001",
            "valkeys://h",
        ] {
            let error = check_tls_scheme(url, false).unwrap_err().to_string();
            assert!(error.contains("tls-rustls"), "{error}");
            assert!(check_tls_scheme(url, true).is_ok());
        }
        assert!(check_tls_scheme("redis://127.0.0.1:6379", false).is_ok());
        assert!(check_tls_scheme("redis-cluster://127.0.0.1:6379", false).is_ok());
    }

    /// A URL of another protocol (or a typo) is refused at build, naming the schemes accepted,
    /// instead of being read as `redis://`.
    #[tokio::test]
    async fn urls_of_other_schemes_are_refused_at_build() {
        for url in [
            "http://127.0.0.1:6379",
            "https://cache.example",
            "redis-clustr://h:1",
        ] {
            let error = LockClient::builder().url(url).build().await.unwrap_err();
            let Error::InvalidArgument(message) = &error else {
                panic!("{url}: {error:?}");
            };
            assert!(
                message.contains("redis://") && message.contains("rediss-cluster://"),
                "{message}"
            );
            assert!(message.contains(url), "{message}");
        }
        for url in [
            "redis://h:1",
            "REDIS://h:1",
            "rediss://h:1",
            "redis-cluster://h:1",
            "rediss-sentinel://h:1",
            "redis+unix:///tmp/redis.sock",
            "valkey://h:1",
            "valkeys-cluster://h:1",
        ] {
            assert!(check_scheme(url).is_ok(), "{url}");
        }
    }
}

//! [`LockClient`]: the connections and background tasks that every lock of one service instance
//! shares.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use fred::clients::{Client, SubscriberClient};
use fred::interfaces::ClientLike;
use fred::types::config::{ConnectionConfig, PerformanceConfig};
use fred::types::Builder;
use tokio::sync::mpsc::{self, UnboundedSender};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::config::LockClientBuilder;
use crate::error::{Error, Result};
use crate::fair_lock::FairLock;
use crate::holds::Holds;
use crate::keys::LockKeys;
use crate::ledger::Ledger;
use crate::lock::Lock;
use crate::owner::OwnerId;
use crate::pubsub::PubSub;
use crate::releaser::{self, Cleanup};
use crate::watchdog::Watchdog;

/// Pub/sub messages buffered per subscriber before a slow reader loses some (and then wakes
/// every waiter). fred's default of 32 is easily outrun by a busy lock.
const MESSAGE_BUFFER: usize = 4096;

/// What the background tasks share with the handles. Tasks hold this, never [`LockClient`], so
/// that dropping the last handle can stop them.
pub(crate) struct Core {
    pub(crate) id: Uuid,
    /// `id` in Redisson's text form, the first half of every owner field.
    id_text: String,
    pub(crate) redis: Client,
    /// The configured server address(es), `host:port[,host:port..]`, for messages naming a node.
    pub(crate) address: Arc<str>,
    subscriber: SubscriberClient,
    pub(crate) watchdog_timeout: Duration,
    /// A fair-lock waiter's slot.
    pub(crate) fair_wait_timeout: Duration,
    /// Prepended to every lock name to make its key; see `LockClientBuilder::key_prefix`.
    pub(crate) key_prefix: Arc<str>,
    pub(crate) holds: Holds,
    /// One state-changing call at a time per (lock, owner), and the lost replies to fence.
    pub(crate) ledger: Ledger,
    pub(crate) pubsub: PubSub,
    pub(crate) releaser: UnboundedSender<Cleanup>,
    pub(crate) shutdown: CancellationToken,
}

impl Core {
    /// The hash field of `owner`: `<client uuid>:<owner id>`.
    pub(crate) fn field(&self, owner: OwnerId) -> Arc<str> {
        format!("{}:{}", self.id_text, owner).into()
    }

    pub(crate) fn ensure_open(&self) -> Result<()> {
        if self.shutdown.is_cancelled() {
            Err(Error::Shutdown)
        } else {
            Ok(())
        }
    }
}

/// A connection to Redis for locks: create one per process (or per Redis deployment) and share
/// it; clones are cheap and use the same connections.
///
/// A client owns a command connection, a subscriber connection shared by every waiter, a
/// watchdog task that renews held locks, and a task that releases dropped guards. Its
/// [`id`](Self::id) is the first half of every hold it takes (`<id>:<owner id>`), so a Redisson
/// client reading the same keys sees ordinary Redisson holds.
///
/// The background tasks stop when [`shutdown`](Self::shutdown) is called or when the last
/// clone, [`Lock`] and [`LockGuard`](crate::LockGuard) of the client is dropped.
///
/// ```no_run
/// # async fn demo() -> fredlock::Result<()> {
/// let client = fredlock::LockClient::connect("redis://127.0.0.1:6379").await?;
/// let lock = client.lock("orders:1001");
/// let guard = lock.lock().await?;
/// // ... critical section ...
/// guard.unlock().await?;
/// client.shutdown().await;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LockClient {
    handle: Arc<Handle>,
}

struct Handle {
    core: Arc<Core>,
    /// Tasks that end when `core.shutdown` is cancelled.
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.core.shutdown.cancel();
        let tasks = std::mem::take(self.tasks.get_mut().unwrap_or_else(PoisonError::into_inner));
        // Guards dropped just before the client queued releases: let the stop sequence send
        // them before it closes the connections, when a runtime is still there to do it.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(stop(self.core.clone(), tasks));
        }
    }
}

/// Waits for the background tasks to end (the releaser first sends the releases queued by
/// dropped guards), marks every remaining hold lost, and closes the connections.
async fn stop(core: Arc<Core>, tasks: Vec<JoinHandle<()>>) {
    for task in tasks {
        let abort = task.abort_handle();
        if tokio::time::timeout(Duration::from_secs(3), task)
            .await
            .is_err()
        {
            abort.abort();
        }
    }
    core.holds.lose_all();
    let _ = core.subscriber.quit().await;
    let _ = core.redis.quit().await;
    tracing::debug!(client = %core.id, "lock client shut down");
}

/// A snapshot of a client's bookkeeping, for metrics and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClientStats {
    /// (lock, owner) pairs this client holds.
    pub held: usize,
    /// Lock channels with local waiters.
    pub wait_entries: usize,
    /// Channels the subscriber connection is subscribed to.
    pub subscriptions: usize,
    /// (lock, owner) pairs with a change on its way to Redis, or with a lost reply still to
    /// settle (see `docs/RELIABILITY.md`).
    pub unsettled: usize,
}

/// Closes a half-built client's connections unless disarmed.
struct CloseOnDrop(Option<(Client, SubscriberClient)>);

impl CloseOnDrop {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        if let (Some((redis, subscriber)), Ok(runtime)) =
            (self.0.take(), tokio::runtime::Handle::try_current())
        {
            runtime.spawn(async move {
                let _ = subscriber.quit().await;
                let _ = redis.quit().await;
            });
        }
    }
}

impl LockClient {
    /// Connects to the Redis server at `url` with default settings.
    ///
    /// Equivalent to `LockClient::builder().url(url).build().await`.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future closes any connection it opened.
    pub async fn connect(url: &str) -> Result<LockClient> {
        LockClient::builder().url(url).build().await
    }

    /// Starts building a client with settings other than the defaults.
    pub fn builder() -> LockClientBuilder {
        LockClientBuilder::default()
    }

    pub(crate) async fn start(settings: LockClientBuilder) -> Result<LockClient> {
        let config = settings.redis_config()?;
        let address = config
            .server
            .hosts()
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",");
        let performance = PerformanceConfig {
            default_command_timeout: settings.command_timeout,
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
            .set_policy(settings.reconnect_policy.clone());
        let connect_error = |source| Error::Redis {
            context: "connecting".into(),
            server: address.clone(),
            source,
        };
        let redis = builder.build().map_err(connect_error)?;
        let subscriber = builder.build_subscriber_client().map_err(connect_error)?;
        // Until the client exists, a failure or a dropped future must not leave connections open.
        let connecting = CloseOnDrop(Some((redis.clone(), subscriber.clone())));
        redis.init().await.map_err(connect_error)?;
        subscriber.init().await.map_err(connect_error)?;
        connecting.disarm();

        let shutdown = CancellationToken::new();
        let mut tasks = Vec::new();
        let (pubsub, pubsub_tasks) = PubSub::start(subscriber.clone(), shutdown.clone());
        tasks.extend(pubsub_tasks);
        let (releaser_tx, releaser_rx) = mpsc::unbounded_channel();
        let id = Uuid::new_v4();
        let core = Arc::new(Core {
            id,
            id_text: id.hyphenated().to_string(),
            redis: redis.clone(),
            address: address.as_str().into(),
            subscriber,
            watchdog_timeout: settings.watchdog_timeout,
            fair_wait_timeout: settings.fair_wait_timeout,
            key_prefix: settings.key_prefix.as_str().into(),
            holds: Holds::new(
                settings.watchdog_timeout,
                settings.effective_renew_deadline(),
            ),
            ledger: Ledger::new(),
            pubsub,
            releaser: releaser_tx,
            shutdown: shutdown.clone(),
        });
        tasks.push(tokio::spawn(
            Watchdog::new(core.clone()).run(shutdown.clone()),
        ));
        tasks.push(tokio::spawn(releaser::run(
            core.clone(),
            releaser_rx,
            shutdown,
        )));
        tracing::debug!(client = %id, "lock client started");
        Ok(LockClient {
            handle: Arc::new(Handle {
                core,
                tasks: Mutex::new(tasks),
            }),
        })
    }

    /// This client's id, the `<client uuid>` half of its hash fields.
    pub fn id(&self) -> Uuid {
        self.handle.core.id
    }

    /// A reentrant lock named `name`: its Redis key is `name`, after the client's
    /// [`key_prefix`](LockClientBuilder::key_prefix) if it has one. Creating it costs nothing and
    /// sends nothing; an empty name is reported by the first operation.
    pub fn lock(&self, name: impl Into<String>) -> Lock {
        Lock::new(self.clone(), LockKeys::reentrant(self.key(name.into())))
    }

    /// A fair lock named `name`: reentrant like [`lock`](Self::lock), and granted to waiters in
    /// the order they arrived. Creating it costs nothing and sends nothing.
    pub fn fair_lock(&self, name: impl Into<String>) -> FairLock {
        FairLock::new(self.clone(), self.key(name.into()))
    }

    /// The Redis key of the lock named `name`: the client's key prefix, then the name. An empty
    /// name stays empty, for the first operation to refuse.
    pub(crate) fn key(&self, name: String) -> String {
        let prefix = &self.handle.core.key_prefix;
        if prefix.is_empty() || name.is_empty() {
            name
        } else {
            format!("{prefix}{name}")
        }
    }

    /// The fred client this lock client sends its commands on, for data commands that go with
    /// the locks (one connection setup for both).
    ///
    /// It is configured for locks: every command is sent **once** (`max_command_attempts` 1,
    /// so a command cut off by a reconnect fails instead of being sent again; a lock script must
    /// never run twice), with the builder's `command_timeout` and reconnect policy. Retry your
    /// own idempotent commands yourself if you need to. Do not `quit()` it: that closes the
    /// lock client's connection; [`shutdown`](Self::shutdown) does it when you are done.
    pub fn redis(&self) -> &Client {
        &self.handle.core.redis
    }

    /// The hash field this client writes for `owner`: `<client uuid>:<owner id>`.
    pub fn owner_field(&self, owner: OwnerId) -> String {
        self.handle.core.field(owner).to_string()
    }

    /// Counts of what the client holds and waits for.
    pub fn stats(&self) -> ClientStats {
        let core = &self.handle.core;
        ClientStats {
            held: core.holds.len(),
            wait_entries: core.pubsub.wait_entries(),
            subscriptions: core.pubsub.subscriptions(),
            unsettled: core.ledger.len(),
        }
    }

    /// Stops the watchdog and the background tasks and closes the connections.
    ///
    /// Guards still alive are marked lost (their [`lost`](crate::LockGuard::lost) futures
    /// complete): nothing renews them any more, so their locks end with their lease. Guards
    /// dropped before the call are released first. Waiters and later operations fail with
    /// [`Error::Shutdown`]. Calling it again does nothing.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe in that the shutdown has begun once the future is first polled; dropping it
    /// early only skips waiting for the tasks and closing the connections.
    pub async fn shutdown(&self) {
        let core = &self.handle.core;
        core.shutdown.cancel();
        let tasks = std::mem::take(
            &mut *self
                .handle
                .tasks
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        if !tasks.is_empty() {
            stop(core.clone(), tasks).await;
        }
    }

    pub(crate) fn core(&self) -> &Arc<Core> {
        &self.handle.core
    }
}

impl fmt::Debug for LockClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockClient")
            .field("id", &self.handle.core.id)
            .field("watchdog_timeout", &self.handle.core.watchdog_timeout)
            .finish_non_exhaustive()
    }
}

//! [`LockClient`]: the connections and background tasks that every lock of one service instance
//! shares.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use uuid::Uuid;

use crate::config::LockClientBuilder;
use crate::engine::{self, Engine};
use crate::error::Result;
use crate::inspection::ClientStats;
use crate::owner::OwnerId;

/// A connection to Redis for locks: create one per process (or per Redis deployment) and share
/// it; clones are cheap and use the same connections.
///
/// A client owns a command connection, a subscriber connection shared by every waiter, a
/// watchdog task that renews held locks, and a task that releases dropped guards. Its
/// [`id`](Self::id) is the first half of every hold it takes (`<id>:<owner id>`), so a Redisson
/// client reading the same keys sees ordinary Redisson holds.
///
/// The background tasks stop when [`shutdown`](Self::shutdown) is called or when the last
/// clone, primitive and guard of the client is dropped.
///
/// Each primitive's factory is a method of its own file's (`client.lock(name)`,
/// `client.fair_lock(name)`, `client.fenced_lock(name)`, `client.spin_lock(name)`).
///
/// ```no_run
/// # async fn demo() -> fredlock::Result<()> {
///
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
    /// One pointer: every lock handle keeps its client, and every waiting task its handle.
    shared: Arc<ClientState>,
}

struct ClientState {
    engine: Engine,
    /// Prepended to every name to make its key; see `LockClientBuilder::key_prefix`.
    key_prefix: Box<str>,
}

impl LockClient {
    /// Connects to the Redis server at `url` with default settings, on fred.
    ///
    /// Equivalent to `LockClient::builder().url(url).build().await`. In a build without fred,
    /// use the builder and name `Backend::RedisRs` (see
    /// [`LockClientBuilder::backend`](crate::LockClientBuilder::backend)).
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
        let engine = Engine::start(engine::Settings {
            // The URL first: its error is the more specific when both are wrong.
            config: settings.redis_config()?,
            library: settings.library()?,
            protocol: settings.engine_protocol(),
            command_timeout: settings.command_timeout,
            reconnect_policy: settings.reconnect_policy.clone(),
            watchdog_lease: settings.watchdog_lease,
            renew_deadline: settings.effective_renew_deadline(),
            queue_place: settings.queue_place,
            replica_sync: settings.replica_sync,
            metrics: engine::Metrics::new(settings.metrics_lock_names),
            client_name: settings.client_name.as_deref().map(Into::into),
        })
        .await?;
        Ok(LockClient {
            shared: Arc::new(ClientState {
                engine,
                key_prefix: settings.key_prefix.as_str().into(),
            }),
        })
    }

    /// This client's id, the `<client uuid>` half of its hash fields.
    pub fn id(&self) -> Uuid {
        self.shared.engine.core().id
    }

    /// The name this client was given ([`LockClientBuilder::client_name`]), if any.
    ///
    /// [`LockClientBuilder::client_name`]: crate::LockClientBuilder::client_name
    pub fn client_name(&self) -> Option<&str> {
        self.shared.engine.core().name.as_deref()
    }

    /// A receiver of this client's events from now on: every hold acquired, released, renewed
    /// late or not at all, lost (and why) or force-unlocked, leader terms won and lost, job runs
    /// run, skipped and lost, and the connection lost and back.
    ///
    /// The client never waits for a receiver: one that falls more than
    /// [`DEFAULT_EVENT_CAPACITY`](crate::events::DEFAULT_EVENT_CAPACITY) events behind loses the
    /// oldest, learns how many from [`RecvError::Lagged`](crate::events::RecvError::Lagged), and
    /// the loss is counted in the metric `fredlock_events_lagged_total`. With no receiver, no
    /// event is made. The events of one lock come in the order they happened.
    ///
    /// ```no_run
    /// # async fn example(client: fredlock::LockClient) {
    /// use fredlock::events::LockEventKind;
    ///
    /// let mut events = client.events();
    /// tokio::spawn(async move {
    ///     while let Ok(event) = events.recv().await {
    ///         if let LockEventKind::Lost(why) = event.what() {
    ///             tracing::error!(lock = event.name(), ?why, "lost a lock");
    ///         }
    ///     }
    /// });
    /// # }
    /// ```
    pub fn events(&self) -> crate::inspection::LockEvents {
        self.shared.engine.core().report.events.subscribe()
    }

    /// The Redis key of the lock named `name`: the client's key prefix, then the name. An empty
    /// name stays empty, for the first operation to refuse.
    pub(crate) fn key(&self, name: String) -> String {
        let prefix = &self.shared.key_prefix;
        if prefix.is_empty() || name.is_empty() {
            name
        } else {
            format!("{prefix}{name}")
        }
    }

    /// The hash field this client writes for `owner`: `<client uuid>:<owner id>`.
    pub fn owner_field(&self, owner: OwnerId) -> String {
        self.shared.engine.core().field(owner).to_string()
    }

    /// Counts of what the client holds and waits for.
    pub fn stats(&self) -> ClientStats {
        self.shared.engine.stats()
    }

    /// Stops the watchdog and the background tasks and closes the connections.
    ///
    /// Every hold still alive is handed over at once, cancel first: its guards are marked lost
    /// (their [`lost`](crate::LockGuard::lost) futures complete, their cancellation tokens are
    /// cancelled) and the work running under it (`with_lock`, [`JobLock::run`](crate::JobLock::run)
    /// and `run_tick`, [`LeaderElection::run`](crate::LeaderElection::run)) is dropped; only
    /// then is its lock, permits or term given back (all at once, within 2 s; one not
    /// confirmed by then ends with its lease), so that another instance never starts that work
    /// while this one's still runs, and a rolling deploy does not stall the other instances
    /// for a lease. Work that does not reach an await within 2 s of the loss keeps every hold
    /// from being handed over: they end with their leases. A later `unlock` says
    /// [`Error::Shutdown`](crate::Error::Shutdown). Guards dropped before the call are
    /// released too, and waiters give up their queue places. Waiters and later operations fail
    /// with `Error::Shutdown`. Calling it again does nothing.
    ///
    /// Your own work beside a guard (outside `with_lock`) learns of the loss through the guard's
    /// `lost()` or cancellation token, before the hand-over is sent; stop it there.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe in that the shutdown has begun once the future is first polled; dropping it
    /// early only skips waiting for the tasks and closing the connections.
    pub async fn shutdown(&self) {
        self.shared.engine.shutdown().await;
    }

    pub(crate) fn engine(&self) -> &Engine {
        &self.shared.engine
    }

    /// The prefix of every key this client's primitives use.
    pub(crate) fn key_prefix(&self) -> &str {
        &self.shared.key_prefix
    }

    /// How long a fair lock's waiter keeps its place without trying again.
    pub(crate) fn queue_place(&self) -> Duration {
        self.shared.engine.core().queue_place
    }
}

impl fmt::Debug for LockClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockClient")
            .field("id", &self.id())
            .field("watchdog_lease", &self.shared.engine.core().watchdog_lease)
            .finish_non_exhaustive()
    }
}

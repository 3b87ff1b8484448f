//! [`RedLock`]: antirez's Redlock algorithm over independent Redis masters.

mod guard;
mod nodes;
pub(crate) use nodes::script;

use std::fmt;
use std::ops::RangeInclusive;
use std::sync::Arc;
use std::time::Duration;

use crate::engine::Key;
use rand::Rng;
use tokio::time::Instant;

use crate::client::LockClient;
use crate::engine::durations::{self, millis};
use crate::error::{Error, Result};
use crate::family::DistributedLock;
pub use guard::RedLockGuard;
use nodes::{NodeKey, Nodes, Tally, Token, Until};

/// How long a [`RedLock`] taken by [`lock`](RedLock::lock) lives without an extension; it is
/// extended every third of this. Redisson's watchdog default.
pub const DEFAULT_REDLOCK_LEASE: Duration = Duration::from_secs(30);

/// The smallest default per-node timeout; the default is `lease / 100`, but not below this.
pub const MIN_NODE_TIMEOUT: Duration = Duration::from_millis(5);

/// The share of the lease assumed lost to clock drift between the nodes and this process:
/// one hundredth. The same allowance, with [`DRIFT_ALLOWANCE`], is how early any fixed-lease
/// guard counts its hold as lost ([`LockGuard::lost`](crate::LockGuard::lost)).
///
/// ```
/// assert_eq!(fredlock::DEFAULT_DRIFT_FACTOR, 0.01);
/// assert_eq!(fredlock::DRIFT_ALLOWANCE, std::time::Duration::from_millis(2));
/// ```
pub const DEFAULT_DRIFT_FACTOR: f64 = 1.0 / durations::DRIFT_SHARE as f64;

/// The fixed part of the drift allowance, on top of `lease * drift_factor`, as the algorithm
/// publishes it.
pub const DRIFT_ALLOWANCE: Duration = durations::DRIFT_FIXED;

/// A failed attempt is retried after a random delay in this range.
pub const DEFAULT_RETRY_DELAY: RangeInclusive<Duration> =
    Duration::from_millis(50)..=Duration::from_millis(200);

/// A distributed lock over `N` independent Redis masters (Redlock): held while a majority of
/// them (`N / 2 + 1`) hold its key, so it survives the loss of a minority and does not depend
/// on replication.
///
/// Each acquisition writes a fresh random token with `SET <name> <token> NX PX <lease>` on every
/// node at once, each request bounded by a per-node timeout much smaller than the lease. It
/// succeeds when a majority said `OK` and time is left: the guard's
/// [`validity`](RedLockGuard::validity) is `lease - elapsed - (lease * drift_factor + 2 ms)`. A failed
/// attempt is released on every node (only keys carrying its token are deleted) and retried
/// after a random delay. The layout is the one every Redlock client uses, so fredlock and other
/// Redlock implementations exclude each other on the same key. It is not Redisson's `RedLock`,
/// which is a [`MultiLock`](crate::MultiLock) of hash locks.
///
/// [`lock`](DistributedLock::lock) extends the lock on every node every `lease / 3`. An extension counts only
/// if a majority confirmed it before the current validity ran out; otherwise the guard is lost
/// ([`RedLockGuard::lost`]).
///
/// ```no_run
/// # async fn demo(nodes: Vec<fredlock::LockClient>) -> fredlock::Result<()> {
/// use std::time::Duration;
///
/// // Five LockClients, each connected to an independent master.
/// let redlock = fredlock::RedLock::new(nodes, "payments:42")?;
///
/// let guard = redlock.lock().await?;                  // extended on a majority until dropped
/// // ... critical section ...
/// guard.unlock().await?;
///
/// if let Some(guard) = redlock.try_lock(Duration::from_secs(1), Some(Duration::from_secs(10))).await? {
///     // Safe for guard.validity() from now on, at most 10 s minus the time acquiring took.
///     guard.unlock().await?;
/// }
/// # Ok(()) }
/// ```
///
/// Its acquisitions are [`DistributedLock`]'s. Attempts are retried after a random delay for as
/// long as the wait allows, also while too many nodes are down for a majority; each failed
/// attempt is logged at debug level. An attempt already on its way when a wait ends is
/// finished, so `try_lock` may take up to one per-node timeout longer than its wait. They
/// report [`Error::NoQuorum`] when so many nodes reject the request (a key of another type) or
/// have shut-down clients that a majority is out of reach for good, and, for a bounded wait,
/// when the last attempt failed for node failures rather than because the lock was held
/// (listing each node and why); [`Error::InvalidArgument`] for a lease that leaves no validity.
/// A fixed lease ends by itself and is never extended; [`RedLockGuard::validity`] says how much
/// of it is left. Cancel safe: if an acquisition's future is dropped, whatever an attempt in
/// flight wrote is deleted on every node in the background.
///
/// # Safety conditions
///
/// Redlock keeps mutual exclusion only under assumptions that Redis cannot check for you:
///
/// - **Clock drift.** Each node expires the key by its own clock; this process measures validity
///   by its own. The drift allowance (`lease * drift_factor + 2 ms`) must cover how much those
///   clocks can run apart during one lease. A node whose clock jumps forward (an NTP step, a
///   manual change) expires keys early and breaks the majority; run nodes with slewing time
///   sync.
/// - **Process pauses.** A holder stalled past its validity (GC, swap, a frozen VM, a blocked
///   runtime thread) may resume believing it holds the lock while another does. Check
///   [`validity`](RedLockGuard::validity) before each step that needs the lock, and where a late
///   write would do harm, let the resource reject it with **fencing tokens**: a number that grows
///   with each acquisition, checked by the resource against the highest it has seen. Redlock's
///   random tokens are not ordered and cannot serve as one.
/// - **Delayed restart.** A node that crashes loses its keys unless it persists every write
///   (`appendonly yes` with `appendfsync always`). Restarted at once, it would grant the lock to
///   a second client while the first still counts it in its majority. A crashed node must stay
///   down for at least the longest lease in use (the watchdog lease, or the longest fixed lease)
///   before it rejoins.
/// - **Independence.** The nodes must be independent masters: not replicas of each other and not
///   one server listed twice (the same client twice is rejected, but two clients on one server
///   cannot be told apart).
#[derive(Clone)]
pub struct RedLock {
    shared: Arc<RedLockState>,
}

/// What every handle and guard of one Redlock shares.
pub(crate) struct RedLockState {
    pub(crate) name: Arc<str>,
    pub(crate) nodes: Nodes,
    pub(crate) settings: RedLockSettings,
}

/// The tunables of one Redlock; see [`RedLockBuilder`].
#[derive(Clone, Debug)]
pub(crate) struct RedLockSettings {
    pub(crate) lease: Duration,
    pub(crate) node_timeout: Option<Duration>,
    pub(crate) drift_factor: f64,
    pub(crate) retry_delay: RangeInclusive<Duration>,
    pub(crate) max_hold: Option<Duration>,
}

impl RedLockSettings {
    /// The per-node timeout for requests about a key of this lease.
    pub(crate) fn node_timeout(&self, lease: Duration) -> Duration {
        self.node_timeout
            .unwrap_or_else(|| (lease / 100).max(MIN_NODE_TIMEOUT))
    }

    /// The drift allowance for a lease.
    pub(crate) fn drift(&self, lease: Duration) -> Duration {
        lease.mul_f64(self.drift_factor) + DRIFT_ALLOWANCE
    }

    /// A random pause before the next attempt.
    pub(crate) fn retry_delay(&self) -> Duration {
        let (low, high) = (*self.retry_delay.start(), *self.retry_delay.end());
        if low >= high {
            return low;
        }
        rand::thread_rng().gen_range(low..=high)
    }
}

/// Builds a [`RedLock`] with settings other than the defaults; start with [`RedLock::builder`].
///
/// ```no_run
/// # fn demo(nodes: Vec<fredlock::LockClient>) -> fredlock::Result<()> {
/// use std::time::Duration;
///
/// let redlock = fredlock::RedLock::builder(nodes, "reports:nightly")
///     .lease(Duration::from_secs(10))                   // extended every 3.3 s
///     .node_timeout(Duration::from_millis(50))
///     .retry_delay(Duration::from_millis(10)..=Duration::from_millis(100))
///     .max_hold(Duration::from_secs(600))             // never held longer than 10 minutes
///     .build()?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "a builder does nothing until build() is called"]
pub struct RedLockBuilder {
    nodes: Vec<LockClient>,
    name: String,
    settings: RedLockSettings,
}

impl RedLockBuilder {
    /// The lease of a lock taken without one ([`RedLock::lock`](crate::DistributedLock::lock), or `try_lock` with `None`): how
    /// long it lives on the nodes without an extension. It is extended every third of this; a
    /// crashed holder's lock frees itself after at most this long. Default
    /// [`DEFAULT_REDLOCK_LEASE`] (30 s).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.settings.lease = lease;
        self
    }

    /// How long each node may take to answer one request. Default: the lease of the request / 100,
    /// at least [`MIN_NODE_TIMEOUT`] (5 ms). Keep it well below the lease: a slow node then costs
    /// at most this much, and a node that answers later than this counts as failed.
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.settings.node_timeout = Some(timeout);
        self
    }

    /// The share of the lease set aside for clock drift: validity is
    /// `lease - elapsed - (lease * factor + 2 ms)`. Default [`DEFAULT_DRIFT_FACTOR`] (0.01).
    pub fn drift_factor(mut self, factor: f64) -> Self {
        self.settings.drift_factor = factor;
        self
    }

    /// The range of the random pause between two attempts, which keeps contenders from colliding
    /// again in step. Default [`DEFAULT_RETRY_DELAY`] (50 to 200 ms).
    pub fn retry_delay(mut self, range: RangeInclusive<Duration>) -> Self {
        self.settings.retry_delay = range;
        self
    }

    /// The longest a guard of [`lock`](RedLock::lock) keeps the lock: extensions stop so that the
    /// lock ends this long after it was acquired, and the guard is lost then. A runaway holder
    /// thus cannot keep it forever. Default: no limit.
    pub fn max_hold(mut self, limit: Duration) -> Self {
        self.settings.max_hold = Some(limit);
        self
    }

    /// Checks the settings and makes the Redlock. Sends nothing.
    ///
    /// Fails with [`Error::InvalidArgument`] for no nodes, the same client twice, an empty name,
    /// a zero lease, node timeout or hold limit, a drift factor outside `0..1`, a lease that the
    /// drift allowance leaves no validity, or an empty retry range.
    pub fn build(self) -> Result<RedLock> {
        let invalid = |message: String| Err(Error::InvalidArgument(message));
        let settings = self.settings;
        if self.nodes.is_empty() {
            return invalid(format!("Redlock {:?} needs at least one node", self.name));
        }
        for (index, node) in self.nodes.iter().enumerate() {
            if self.nodes[..index]
                .iter()
                .any(|other| other.id() == node.id())
            {
                return invalid(format!(
                    "Redlock {:?}: node {index} is the same client as an earlier node, which \
                     would count one master twice toward the majority",
                    self.name
                ));
            }
        }
        if self.name.is_empty() {
            return invalid("a lock name must not be empty".into());
        }
        let prefix = self.nodes[0].key_prefix();
        if let Some(index) = self
            .nodes
            .iter()
            .position(|node| node.key_prefix() != prefix)
        {
            return invalid(format!(
                "Redlock {:?}: node {index} has another key_prefix than node 0, so the nodes \
                 would not hold one key",
                self.name
            ));
        }
        let name = self.nodes[0].key(self.name.clone());
        if !(0.0..1.0).contains(&settings.drift_factor) {
            return invalid(format!(
                "Redlock {:?}: drift_factor must be in 0..1, not {}",
                self.name, settings.drift_factor
            ));
        }
        let named = |setting: &str| format!("Redlock {:?}: {setting}", self.name);
        if let Some(timeout) = settings.node_timeout {
            durations::check(named("node_timeout"), timeout, durations::MIN_LEASE)?;
        }
        if let Some(limit) = settings.max_hold {
            durations::check(named("max_hold"), limit, durations::MIN_LEASE)?;
        }
        if settings.retry_delay.is_empty() {
            return invalid(format!(
                "Redlock {:?}: the retry delay range is empty",
                self.name
            ));
        }
        durations::check(
            named("the longest retry delay"),
            *settings.retry_delay.end(),
            Duration::ZERO,
        )?;
        check_lease(&self.name, &settings, settings.lease)?;
        let nodes = Nodes {
            key: Key::from(name.as_str()),
            kind: Arc::new(NodeKey::new(&name)),
            clients: self.nodes,
        };
        Ok(RedLock {
            shared: Arc::new(RedLockState {
                name: name.into(),
                nodes,
                settings,
            }),
        })
    }
}

/// A lease must leave a validity once the drift allowance is taken off, and be one Redis takes.
fn check_lease(name: &str, settings: &RedLockSettings, lease: Duration) -> Result<()> {
    durations::check(
        format_args!("Redlock {name:?}: the lease"),
        lease,
        durations::MIN_LEASE,
    )?;
    if lease <= settings.drift(lease) {
        return Err(Error::InvalidArgument(format!(
            "Redlock {name:?}: a lease of {lease:?} leaves no validity after the drift allowance of {:?}",
            settings.drift(lease)
        )));
    }
    Ok(())
}

/// What one attempt came to.
enum RoundOutcome {
    Won(RedLockGuard),
    /// Not acquired; its partial grants are released.
    Failed {
        tally: Tally,
        elapsed: Duration,
    },
}

impl RedLock {
    /// A Redlock named `name` (the key on every node) over `nodes`, one [`LockClient`] per
    /// independent master, with default settings. Sends nothing.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an empty list, the same client twice, or an empty name.
    pub fn new(nodes: Vec<LockClient>, name: impl Into<String>) -> Result<RedLock> {
        RedLock::builder(nodes, name).build()
    }

    /// Starts building a Redlock with settings other than the defaults.
    pub fn builder(nodes: Vec<LockClient>, name: impl Into<String>) -> RedLockBuilder {
        RedLockBuilder {
            nodes,
            name: name.into(),
            settings: RedLockSettings {
                lease: DEFAULT_REDLOCK_LEASE,
                node_timeout: None,
                drift_factor: DEFAULT_DRIFT_FACTOR,
                retry_delay: DEFAULT_RETRY_DELAY,
                max_hold: None,
            },
        }
    }

    /// The lock's name, which is its key on every node.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// How many nodes must grant the lock: `N / 2 + 1`.
    pub fn quorum(&self) -> usize {
        self.shared.nodes.quorum()
    }

    async fn lock_within(
        &self,
        wait: Option<Duration>,
        fixed_lease: Option<Duration>,
    ) -> Result<Option<RedLockGuard>> {
        let shared = &self.shared;
        let lease = fixed_lease.unwrap_or(shared.settings.lease);
        check_lease(&shared.name, &shared.settings, lease)?;
        if let Some(wait) = wait {
            durations::check_wait(&shared.name, wait)?;
        }
        let started = Instant::now();
        let deadline = wait.and_then(|wait| durations::deadline(started, wait));
        let mut warned = false;
        loop {
            let (tally, elapsed) = match self.attempt(lease, fixed_lease.is_some()).await {
                RoundOutcome::Won(guard) => {
                    tracing::debug!(
                        lock = %shared.name,
                        waited_ms = started.elapsed().as_millis() as u64,
                        validity_ms = guard.validity().as_millis() as u64,
                        "Redlock acquired"
                    );
                    return Ok(Some(guard));
                }
                RoundOutcome::Failed { tally, elapsed } => (tally, elapsed),
            };
            let nodes = &shared.nodes;
            let contended = tally.held_elsewhere() > nodes.tolerated();
            if tally.permanent_failures() > nodes.tolerated() {
                return Err(self.no_quorum(&tally, elapsed));
            }
            if !contended && !warned {
                warned = true;
                tracing::warn!(
                    lock = %shared.name, error = %self.no_quorum(&tally, elapsed),
                    "Redlock attempt failed on too many nodes; retrying"
                );
            } else {
                tracing::debug!(
                    lock = %shared.name, granted = tally.done.len(), held_elsewhere = tally.held_elsewhere(),
                    "Redlock attempt failed; retrying"
                );
            }
            let finished = || {
                if contended {
                    Ok(None)
                } else {
                    Err(self.no_quorum(&tally, elapsed))
                }
            };
            if wait == Some(Duration::ZERO) {
                return finished();
            }
            let pause_until = Instant::now() + shared.settings.retry_delay();
            match deadline {
                Some(deadline) if pause_until >= deadline => {
                    tokio::time::sleep_until(deadline).await;
                    return finished();
                }
                _ => tokio::time::sleep_until(pause_until).await,
            }
        }
    }

    /// One round of the algorithm: `SET NX PX` on every node at once; won if a majority said OK
    /// while time was left, else released on every node.
    async fn attempt(&self, lease: Duration, fixed: bool) -> RoundOutcome {
        let shared = &self.shared;
        let token = Token::new();
        let timeout = shared.settings.node_timeout(lease);
        let lease_ms = millis(lease);
        // Whatever the requests wrote is deleted everywhere unless the guard takes it over, even
        // if this future is dropped half-way.
        let refused = shared.nodes.refusals(timeout).await;
        let written = guard::Written::new(shared.clone(), token.clone(), lease);
        let replies = shared
            .nodes
            .set_everywhere(&token, lease_ms, timeout, refused);
        let started = replies.started;
        let tally = replies.tally(&shared.nodes, Until::Quorum).await;
        let elapsed = tally.decided_at - started;
        let valid_until = started + (lease - shared.settings.drift(lease));
        if tally.done.len() >= shared.nodes.quorum() && tally.decided_at < valid_until {
            let guard = written.into_guard(started, valid_until, fixed);
            return RoundOutcome::Won(guard);
        }
        // Wait only for the nodes that granted it: they just answered, and others must not find
        // them taken after this returns. The rest get the release without anyone waiting.
        written.release(&tally.done).await;
        RoundOutcome::Failed { tally, elapsed }
    }

    fn no_quorum(&self, tally: &Tally, elapsed: Duration) -> Error {
        Error::NoQuorum {
            lock: self.shared.name.to_string(),
            granted: tally.done.len(),
            needed: self.shared.nodes.quorum(),
            nodes: self.shared.nodes.len(),
            elapsed,
            failures: tally.failures.clone(),
        }
    }
}

impl DistributedLock for RedLock {
    type Guard = RedLockGuard;

    fn acquire(
        &self,
        wait: Option<Duration>,
        lease: Option<Duration>,
    ) -> impl std::future::Future<Output = Result<Option<RedLockGuard>>> + Send {
        self.lock_within(wait, lease)
    }
}

crate::family::acquisitions!(RedLock);

impl fmt::Debug for RedLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedLock")
            .field("name", &self.shared.name)
            .field("nodes", &self.shared.nodes.len())
            .field("settings", &self.shared.settings)
            .finish()
    }
}

//! Distributed locks on Redis for async Rust, in the model of Redisson's `RLock` family and
//! wire compatible with it: a Java service using Redisson and a Rust service using fredlock
//! exclude each other on the same lock name and wake each other's waiters.
//!
//! # The guide
//!
//! One page per task, beside this reference ([the guide's index](https://github.com/fredlock/fredlock/blob/main/docs/guide/README.md)):
//!
//! - [Locks](https://github.com/fredlock/fredlock/blob/main/docs/guide/locks.md): the reentrant lock and its owner, the non-reentrant, fair, fenced, spin and read-write locks, MultiLock, Redlock; guards, the watchdog, loss
//! - [Semaphores and the latch](https://github.com/fredlock/fredlock/blob/main/docs/guide/semaphores.md): Semaphore, PermitSemaphore, CountDownLatch
//! - [Leader election](https://github.com/fredlock/fredlock/blob/main/docs/guide/leader-election.md): one leader among the instances, its epoch, handing over
//! - [Scheduled jobs](https://github.com/fredlock/fredlock/blob/main/docs/guide/scheduled-jobs.md): a job run once per tick, in ShedLock's layout
//! - [The tower layers](https://github.com/fredlock/fredlock/blob/main/docs/guide/tower.md): LockLayer and ConcurrencyLimitLayer
//! - [The event stream](https://github.com/fredlock/fredlock/blob/main/docs/guide/events.md): everything that happens to a client's holds
//! - [The blocking API](https://github.com/fredlock/fredlock/blob/main/docs/guide/blocking.md): locks from plain threads
//! - [Running on redis-rs](https://github.com/fredlock/fredlock/blob/main/docs/guide/redis-rs.md): redis-rs instead of fred; RESP2 or RESP3
//! - [Deployments](https://github.com/fredlock/fredlock/blob/main/docs/guide/deployments.md): Sentinel, cluster, TLS, replica sync, Valkey
//! - [Operations](https://github.com/fredlock/fredlock/blob/main/docs/guide/operations.md): inspections, the fredlock command, metrics, Grafana, shutdown
//! - [Security](https://github.com/fredlock/fredlock/blob/main/docs/guide/security.md): the ACL rule a client needs; secrets
//! - [Redisson compatibility](https://github.com/fredlock/fredlock/blob/main/docs/guide/redisson.md): every key and channel, and the differences
//! - [Outages and errors](https://github.com/fredlock/fredlock/blob/main/docs/guide/outages-and-errors.md): what holds when things fail; the errors; the limits
//!
//! # Which type do I want
//!
//! Every type comes from one [`LockClient`] per process (`LockClient::connect(url)`).
//!
//! | I need | Type | Example |
//! | --- | --- | --- |
//! | one instance at a time to do a piece of work | [`Lock`] ([`LockClient::lock`]) | [quickstart](https://github.com/fredlock/fredlock/blob/main/examples/quickstart.rs) |
//! | the same, waiters served in arrival order | [`FairLock`] | [fair_lock](https://github.com/fredlock/fredlock/blob/main/examples/fair_lock.rs) |
//! | a lock its holder cannot take twice | [`LockClient::non_reentrant_lock`] | |
//! | a resource that refuses a paused holder's late writes | [`FencedLock`] | [fencing](https://github.com/fredlock/fredlock/blob/main/examples/fencing.rs) |
//! | short holds, waiters that poll instead of listening | [`SpinLock`] | [spin_lock](https://github.com/fredlock/fredlock/blob/main/examples/spin_lock.rs) |
//! | many readers or one writer | [`RwLock`] | [rw_lock](https://github.com/fredlock/fredlock/blob/main/examples/rw_lock.rs) |
//! | at most N at once across instances | [`Semaphore`], [`PermitSemaphore`] (a crashed holder's permit returns) | [semaphore](https://github.com/fredlock/fredlock/blob/main/examples/semaphore.rs), [permit_semaphore](https://github.com/fredlock/fredlock/blob/main/examples/permit_semaphore.rs) |
//! | to wait until N workers are done | [`CountDownLatch`] | [count_down_latch](https://github.com/fredlock/fredlock/blob/main/examples/count_down_latch.rs) |
//! | one leader among the instances | [`LeaderElection`] | [leader_election](https://github.com/fredlock/fredlock/blob/main/examples/leader_election.rs) |
//! | a scheduled job run once per tick (ShedLock's layout) | [`JobLock`] | [scheduled_job](https://github.com/fredlock/fredlock/blob/main/examples/scheduled_job.rs) (tokio-cron-scheduler), [apalis_cron](https://github.com/fredlock/fredlock/blob/main/examples/apalis_cron.rs) (apalis) |
//! | HTTP requests that share a key run one at a time | `tower::LockLayer` (feature `tower`) | [axum](https://github.com/fredlock/fredlock/blob/main/examples/axum.rs) |
//! | at most N requests in flight across instances | `tower::ConcurrencyLimitLayer` (feature `tower`) | `fredlock::tower`'s docs |
//! | several locks, all or nothing | [`MultiLock`] | [multi_lock](https://github.com/fredlock/fredlock/blob/main/examples/multi_lock.rs) |
//! | a lock that survives a master's loss | [`RedLock`] (independent masters) | [redlock](https://github.com/fredlock/fredlock/blob/main/examples/redlock.rs) |
//! | locks from plain threads | `blocking::LockClient` (feature `blocking`) | |
//! | metrics, Sentinel | feature `metrics`, [`LockClientBuilder::sentinel`] | [metrics](https://github.com/fredlock/fredlock/blob/main/examples/metrics.rs), [sentinel](https://github.com/fredlock/fredlock/blob/main/examples/sentinel.rs) |
//!
//! The quick forms of every lock: [`lock`](Lock::lock) waits as long as it takes,
//! [`try_lock(wait, lease)`](Lock::try_lock) waits at most `wait` (Redisson's
//! `tryLock(waitTime, leaseTime)`; `lease` a [`Duration`](std::time::Duration) or `None` for the
//! watchdog), [`try_lock_now`](Lock::try_lock_now) makes one attempt (Redisson's `tryLock()`); [`with_lock`](Lock::with_lock) and [`try_with_lock`](Lock::try_with_lock)
//! run a future holding the lock and drop it if the lock is lost.
//!
//! # One task is one owner
//!
//! A hold belongs to `<client uuid>:<owner id>`, where the owner id is the current **tokio
//! task** (see [`OwnerId`]), as a Redisson hold belongs to a Java thread. The same task locking
//! twice gets hold count 2, so futures joined or selected inside one task share its owner and
//! do **not** exclude each other. Spawn a task per contender; or give each attempt (or work that
//! hops tasks) an owner of its own with [`Lock::with_owner`]`(`[`OwnerId::unique`]`())`; or take
//! a [non-reentrant lock](LockClient::non_reentrant_lock), which refuses its holder a second
//! hold with [`Error::WouldDeadlock`]: joined attempts never hold it together (of
//! `tokio::join!(lock.lock(), lock.lock())` one gets the guard, the other `WouldDeadlock`, since
//! it would wait for a hold its own task keeps until the join ends).
//!
//! ```no_run
//! # async fn demo() -> fredlock::Result<()> {
//! use std::time::Duration;
//!
//! let client = fredlock::LockClient::connect("redis://127.0.0.1:6379").await?;
//! let lock = client.lock("orders:1001");
//!
//! let guard = lock.lock().await?;        // waits as long as needed; the watchdog keeps it alive
//! // ... charge the order once ...
//! guard.unlock().await?;                 // released; waiters are woken at once
//!
//! if let Some(guard) = lock.try_lock(Duration::from_secs(2), Duration::from_secs(10)).await? {
//!     // held for at most 10 s (no watchdog), after waiting at most 2 s
//!     guard.unlock().await?;
//! }
//! # Ok(()) }
//! ```
//!
//! # Moving parts
//!
//! One [`LockClient`] per process owns a command connection, one subscriber connection shared
//! by all waiters, a watchdog task that renews every watchdog-held lock every
//! `watchdog_lease / 3` (up to 100 locks per script call), and a task that releases dropped
//! guards. Locks are cheap handles: [`Lock`], [`FairLock`] for first-come-first-served order,
//! [`FencedLock`] whose guards carry a fencing token, [`SpinLock`] whose waiters back off
//! instead of subscribing, and [`RwLock`], whose [`ReadLock`] many owners hold at once and whose
//! [`WriteLock`] one holds alone. Acquiring one returns a [`LockGuard`] (a [`FencedGuard`] for
//! the fenced lock).
//!
//! Beyond locks, on the same engine: [`Semaphore`] (Redisson's `RSemaphore`: permits counted in
//! Redis, taken by [`SemaphorePermit`]s), [`PermitSemaphore`] (Redisson's
//! `RPermitExpirableSemaphore`, whose [`LeasedPermit`]s are leases renewed by the watchdog, so a
//! crashed holder's permit returns) and [`CountDownLatch`] (Redisson's `RCountDownLatch`).
//!
//! For the jobs a lock is usually wanted for: [`LeaderElection`] (one leader at a time, each
//! term with an epoch that fences its writes) and [`JobLock`] (a scheduled job run by one
//! instance per tick, in ShedLock's Redis layout, cancelled when its lock ends).
//!
//! Two locks are built from several of those: [`RedLock`], the Redlock algorithm over a
//! `LockClient` per independent master (held while a majority holds it), and [`MultiLock`],
//! several locks held all or nothing without deadlock.
//!
//! With the `blocking` feature, `fredlock::blocking` offers the locks to plain threads: its
//! `LockClient` runs a runtime of its own, and a hold's owner is the calling thread. With the
//! `tower` feature, `fredlock::tower::LockLayer` runs requests that share a key (an account, an
//! order) one at a time across instances, and `fredlock::tower::ConcurrencyLimitLayer` lets at
//! most N requests run at once across instances (per key or for all), on leased permits a
//! crashed instance cannot keep.
//!
//! - An uncontended acquire is one Redis round trip (`EVALSHA`), and so is a release.
//! - A waiter does not poll: it sleeps on a semaphore fed by the lock's unlock channel, at most
//!   until the holder's lease would end, so a lost message costs time, never a hang. A
//!   [`Lock`]'s release wakes one waiting client, not every one: the waiting clients stand in a
//!   line beside the lock, and the release names the first (a waiting client also tries again
//!   every third of [`queue_place`](LockClientBuilder::queue_place), one attempt for all its
//!   waiting tasks, which keeps its place).
//! - Every async method documents its cancel safety. Dropping a `lock()` future never leaves a
//!   hold behind; dropping a guard releases it within milliseconds.
//!
//! # Guarantees and their limits
//!
//! fredlock never lets two owners hold a lock at once *as far as the Redis server it talks to
//! knows*. Outside that, the usual limits of Redis locks apply:
//!
//! - **Replication is asynchronous.** If the master fails after granting a lock and before the
//!   replica received it, the promoted replica may grant it again. Use [`RedLock`] over
//!   independent masters where that matters, under the conditions its documentation lists.
//! - **Pauses.** A holder stalled longer than its lease (GC, swap, a stopped VM, a blocked
//!   runtime thread) may resume believing it holds a lock that has expired and been taken. The
//!   watchdog narrows this (it tells the guard via [`LockGuard::lost`]), but cannot close it:
//!   a check and a write are never atomic with respect to a lease. This is why **fencing
//!   tokens** exist ([`FencedLock`]): the protected resource rejects writes carrying an older
//!   token than it has seen. For data in Redis, [`LockGuard::eval_while_held`] makes the check
//!   and the write one step.
//! - **Leases.** A crashed holder's lock frees itself only when its lease ends (the watchdog
//!   timeout for [`Lock::lock`](crate::DistributedLock::lock)). A connection failure in the middle of an acquire or release
//!   leaves its outcome unknown; the lock is then freed by its lease at the latest.
//! - **Clocks.** Leases are Redis TTLs, measured by the server. The client estimates expiry from
//!   the moment it sent a command, which errs on the early side.
//!
//! # Redisson compatibility
//!
//! A lock named `name` is a hash at key `name` with field `<client uuid>:<owner id>` holding the
//! hold count; the final unlock publishes `0` on `redisson_lock__channel:{name}` (the braces keep
//! every key of one lock in one cluster slot; a name that carries a hash tag is not braced
//! again, and a name whose braces are no hash tag gets keys in its own cluster slot by Redis's rule). The same scripts' rules are followed, so each side sees the other's holds as its own
//! kind. A fair lock adds Redisson's queue `redisson_lock_queue:{name}`, its place-timeout zset
//! `redisson_lock_timeout:{name}` and one channel per waiter; see [`FairLock`].
//!
//! # Input, outages and errors
//!
//! Every lease and timeout is checked where it enters the API (at least 1 ms, at most
//! [`MAX_DURATION`]), so nothing out of range reaches Redis and no lock key is ever left without
//! a TTL. Waits are checked the same way (at most [`MAX_DURATION`]; zero makes one attempt). A wait that ends with no
//! attempt reaching Redis fails with [`Error::Unavailable`]: `Ok(None)` always means another
//! owner held the lock. Error messages fit on one line and name the lock, the owner, the server
//! and what to check. The failure behind [`Error::Redis`] and [`Error::Unavailable`] is a
//! [`RedisError`], whose [`kind`](RedisError::kind) says what it meant for the command:
//! [`NotSent`](RedisErrorKind::NotSent) (it did not run), [`NoReply`](RedisErrorKind::NoReply)
//! (it may have run; an `Unavailable` is always one of these two) or
//! [`Refused`](RedisErrorKind::Refused) (Redis answered with an error).
//!
//! # Outages
//!
//! One rule per family of calls, the same for every primitive, when Redis cannot be reached
//! (down, unreachable, or not answering):
//!
//! - **Calls that wait without a bound wait through it**: [`Lock::lock`](crate::DistributedLock::lock) and `lock_with_lease`,
//!   `with_lock`, a semaphore's `acquire`, [`LeaderElection::campaign`] and `run`,
//!   [`MultiLock::lock`](crate::DistributedLock::lock), [`CountDownLatch::wait`]. They keep trying, with backoff, and go on
//!   once Redis is back; they never answer [`Error::Unavailable`]. Bound them yourself
//!   (`tokio::time::timeout`, they are cancel safe) or call the bounded form.
//! - **Every other call answers [`Error::Unavailable`] within a bound**: a bounded try
//!   (`try_lock(wait, lease)`, `try_acquire`, `try_campaign`, `try_wait`, `run_waiting`)
//!   when its wait ends (never `Ok(None)`, which means another owner holds it); a call without
//!   a wait (`try_lock_now`, a job's `run` and `run_tick`, reads such as `is_locked` or
//!   `leader()`, changes such as `add_permits` or `count_down`, `force_unlock`, inspections,
//!   an unlock or a release) within the client's
//!   [`command_timeout`](LockClientBuilder::command_timeout) (5 s by default), at once where the
//!   client already knows it has no connection to its one server, the same on fred and on
//!   redis-rs (on a cluster, each call goes to its own node as the client library routes it).
//!   An `Unavailable` unlock says nothing of the hold: its release is sent in the background
//!   once the connection is back, and the hold ends with its lease at the latest. [`RedLock`]
//!   answers [`Error::NoQuorum`] instead, listing each node; [`LockClient::check_deployment`]
//!   answers [`Error::Redis`], its own diagnosis of the connection.
//!
//! `tests/outage.rs` calls each of them against a killed server, a paused one (SIGSTOP) and a
//! connection cut, on both client libraries.
//!
//! # Features
//!
//! - `fred` (default): fred makes the connections, on every deployment.
//! - `redis-rs`: `Backend::RedisRs`, connections made with redis-rs 1.x; with
//!   `default-features = false`, the crate is built without fred.
//! - `tls-rustls`: `rediss://` through rustls (ring provider).
//! - `tls-native-tls`: `rediss://` through the platform's TLS library. With both, URLs use it.
//! - `metrics`: metrics through the `metrics` facade (see [`metrics`]).
//! - `cli`: the `fredlock` operator command.
//!
//! Without a TLS feature a `rediss://` URL is refused with [`Error::InvalidArgument`]. For a
//! private CA, build a fred `Config` whose `tls` holds a `TlsConnector` that trusts it, and pass
//! it to `LockClientBuilder::config` (feature `fred`); or hand over the fred client the service already has
//! (`LockClientBuilder::fred_client`), so that servers, credentials and TLS are written once.
//!
//! # Observability
//!
//! - Inspections: [`Lock::inspect`](crate::LockFamily::inspect) (on every primitive) reads its holders, hold counts,
//!   remaining leases, a fair lock's queue and a fenced lock's token from the master;
//!   [`LockClient::inspect`], [`LockClient::list`], [`LockClient::leaks`] and
//!   [`LockClient::force_unlock`] work by name, and the `fredlock` command (feature `cli`) prints
//!   them.
//! - Metrics (feature `metrics`): see [`metrics`] for their names and labels.
//! - `tracing` spans `acquire` (with `lock`, `kind`, `owner`, `waited_ms`, `outcome`) and
//!   `release`, at debug level.
//!
//! `tracing` events: `acquired` (with `waited_ms`), `waiting`, `released`, renewal failures and
//! lost locks (`warn`), renewals (`trace`). A [`RedLock`] logs `Redlock acquired` (with
//! `waited_ms` and `validity_ms`), failed attempts (`debug`; the first one caused by node
//! failures at `warn`, naming each node), failed extensions and its loss (`warn`), extensions
//! (`trace`) and `Redlock released`. [`LockClient::stats`] counts holds, wait entries and
//! subscriptions.
#![warn(missing_docs)]
// On docs.rs (`--cfg docsrs`, nightly): each item a feature enables is marked with it.
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(not(any(feature = "fred", feature = "redis-rs")))]
compile_error!(
    "fredlock needs a client library: feature `fred` (the default) or `redis-rs` \
     (`default-features = false, features = [\"redis-rs\"]`)"
);

#[cfg(feature = "blocking")]
#[cfg_attr(docsrs, doc(cfg(feature = "blocking")))]
pub mod blocking;
mod client;
mod config;
mod counter;
mod deployment;
mod engine;
mod error;
mod family;
mod inspection;
mod job;
mod layout;
mod lock;
mod lua;
mod multi_lock;
mod names;
mod ops;
mod owner;
mod redlock;
#[cfg(feature = "tower")]
#[cfg_attr(docsrs, doc(cfg(feature = "tower")))]
pub mod tower;

pub use client::LockClient;
pub use config::{
    Backend, LockClientBuilder, Protocol, DEFAULT_COMMAND_TIMEOUT, DEFAULT_QUEUE_PLACE,
    DEFAULT_WATCHDOG_LEASE,
};
pub use counter::latch::CountDownLatch;
pub use counter::permit_semaphore::{LeasedPermit, PermitSemaphore};
pub use counter::semaphore::{Semaphore, SemaphorePermit};
pub use deployment::{Deployment, NodeReport, Topology};
pub use engine::durations::MAX_DURATION;
pub use engine::replicas::ReplicaSync;
pub use error::{Error, NodeFailure, NodeFailureReason, RedisError, RedisErrorKind, Result};
pub use family::{DistributedGuard, DistributedLock};
pub use inspection::{
    ClientStats, Details, EndedLease, Holder, Inspection, KeyState, Leader, Leak, QueuedWaiter,
};
pub use job::{
    JobHolder, JobLock, JobRun, Skipped, DEFAULT_AT_MOST_FOR, DEFAULT_JOB_ENV, DEFAULT_JOB_PREFIX,
    DEFAULT_TICKS_KEPT_FOR, JOB_POLL,
};
pub use lock::fair::FairLock;
pub use lock::fenced::{FencedGuard, FencedLock};
pub use lock::guard::LockGuard;
pub use lock::leader::{default_identity, LeaderElection, Term};
pub use lock::rw::{ReadLock, RwLock, WriteLock};
pub use lock::spin::{SpinLock, DEFAULT_SPIN_FIRST_PAUSE, DEFAULT_SPIN_MAX_PAUSE};
pub use lock::{Lock, LockFamily};
pub use multi_lock::{MultiLock, MultiLockGuard};
pub use ops::DEFAULT_LEAK_GRACE;
pub use owner::OwnerId;
pub use redlock::{
    RedLock, RedLockBuilder, RedLockGuard, DEFAULT_DRIFT_FACTOR, DEFAULT_REDLOCK_LEASE,
    DEFAULT_RETRY_DELAY, DRIFT_ALLOWANCE, MIN_NODE_TIMEOUT,
};

/// A client's event stream ([`LockClient::events`]): the events, why a hold was lost, and the
/// receiver's errors. Each type is here only (as `tokio::sync::broadcast`'s are in their
/// module), not also at the crate's root.
pub mod events {
    pub use crate::inspection::{
        LockEvent, LockEventKind, LockEvents, LossReason, RecvError, DEFAULT_EVENT_CAPACITY,
    };
}

#[doc(hidden)]
pub use ops::replay_ledger;
#[doc(hidden)]
pub use ops::source as script_source;

/// The names of the metrics fredlock records with the `metrics` feature, through the
/// [`metrics`](https://docs.rs/metrics) facade: nothing is recorded until the application
/// installs a recorder (a Prometheus exporter, say; see `examples/metrics.rs`). Install it
/// before building the [`LockClient`]: a client registers each kind's metrics when it first
/// records one, and keeps the handles.
///
/// Every metric but [`EVENTS_LAGGED`](metrics::EVENTS_LAGGED) (the events slow receivers of
/// [`LockClient::events`] lost, per process) has the label `kind` (`lock`, `spin_lock`,
/// `fenced_lock`, `fair_lock`, `read_lock`, `write_lock`, `semaphore`, `permit_semaphore`,
/// `leader_election`, `job`) and, with [`LockClientBuilder::metrics_lock_names`], `lock` (the
/// name). They are recorded in one
/// place, the engine every primitive runs on, so a primitive added later has them all.
pub mod metrics {
    pub use crate::engine::metrics::{
        ACQUISITIONS, ERRORS, EVENTS_LAGGED, HANDOFFS, HELD, LOST, RENEWALS, RENEWAL_FAILURES,
        TIMEOUTS, WAIT, WAITING,
    };
    pub use crate::job::{JOB_RUN, JOB_RUNS};

    /// Every metric name, for documentation and tests: those recorded for every primitive,
    /// and the job lock's runs (named by the job lock, recorded by the engine).
    pub const ALL: [&str; 13] = [
        ACQUISITIONS,
        HANDOFFS,
        TIMEOUTS,
        ERRORS,
        LOST,
        RENEWALS,
        RENEWAL_FAILURES,
        WAIT,
        HELD,
        WAITING,
        JOB_RUNS,
        JOB_RUN,
        EVENTS_LAGGED,
    ];
}

/// The traits every lock implements, for code written over any lock
/// (`fn run<L: DistributedLock>(lock: &L)`). Calling a lock needs no import: every lock has
/// `lock()`, `try_lock(wait, lease)`, `with_lock` and the reads of its family as methods of its
/// own. The traits are sealed: only the crate's locks implement them.
pub mod prelude {
    pub use crate::{DistributedGuard, DistributedLock, LockFamily};
}

/// A caller's script's words (`eval_while_held`): the crate's own in every build.
pub use crate::engine::client::reply::{FromReply, Reply, ScriptArg};
/// How a lost connection is made again ([`LockClientBuilder::reconnect_policy`]), with the
/// constructors of fred's type of the same name (`new_constant`, `new_linear`,
/// `new_exponential`) and `set_jitter`. The crate's own in every build: turning feature `fred`
/// on beside `redis-rs` changes no type (fred's policy converts into it, `From`).
pub use crate::engine::client::settings::ReconnectPolicy;
/// The fred types that appear in fredlock's API.
#[cfg(feature = "fred")]
#[cfg_attr(docsrs, doc(cfg(feature = "fred")))]
pub use fred;
/// The token [`LockGuard::cancellation_token`] returns: it is cancelled when the lock is lost.
pub use tokio_util::sync::CancellationToken;

/// The guide's page `docs/guide/locks.md`, its code blocks compiled as doc-tests
/// (`tests/readme.rs` also runs them against a server, but for the Sentinel ones, which name
/// addresses of no machine here).
#[cfg(doctest)]
#[doc = include_str!("../docs/guide/locks.md")]
pub struct GuideLocks;

/// The guide's page `docs/guide/semaphores.md`, its code blocks compiled as doc-tests
/// (`tests/readme.rs` also runs them against a server, but for the Sentinel ones, which name
/// addresses of no machine here).
#[cfg(doctest)]
#[doc = include_str!("../docs/guide/semaphores.md")]
pub struct GuideSemaphores;

/// The guide's page `docs/guide/leader-election.md`, its code blocks compiled as doc-tests
/// (`tests/readme.rs` also runs them against a server, but for the Sentinel ones, which name
/// addresses of no machine here).
#[cfg(doctest)]
#[doc = include_str!("../docs/guide/leader-election.md")]
pub struct GuideLeaderElection;

/// The guide's page `docs/guide/scheduled-jobs.md`, its code blocks compiled as doc-tests
/// (`tests/readme.rs` also runs them against a server, but for the Sentinel ones, which name
/// addresses of no machine here).
#[cfg(doctest)]
#[doc = include_str!("../docs/guide/scheduled-jobs.md")]
pub struct GuideScheduledJobs;

/// The guide's page `docs/guide/tower.md`, its code blocks compiled as doc-tests
/// (`tests/readme.rs` also runs them against a server, but for the Sentinel ones, which name
/// addresses of no machine here).
#[cfg(doctest)]
#[doc = include_str!("../docs/guide/tower.md")]
pub struct GuideTower;

/// The guide's page `docs/guide/events.md`, its code blocks compiled as doc-tests
/// (`tests/readme.rs` also runs them against a server, but for the Sentinel ones, which name
/// addresses of no machine here).
#[cfg(doctest)]
#[doc = include_str!("../docs/guide/events.md")]
pub struct GuideEvents;

/// The guide's page `docs/guide/blocking.md`, its code blocks compiled as doc-tests
/// (`tests/readme.rs` also runs them against a server, but for the Sentinel ones, which name
/// addresses of no machine here).
#[cfg(doctest)]
#[doc = include_str!("../docs/guide/blocking.md")]
pub struct GuideBlocking;

/// The guide's page `docs/guide/redis-rs.md`, its code blocks compiled as doc-tests
/// (`tests/readme.rs` also runs them against a server, but for the Sentinel ones, which name
/// addresses of no machine here).
#[cfg(doctest)]
#[doc = include_str!("../docs/guide/redis-rs.md")]
pub struct GuideRedisRs;

/// The guide's page `docs/guide/deployments.md`, its code blocks compiled as doc-tests
/// (`tests/readme.rs` also runs them against a server, but for the Sentinel ones, which name
/// addresses of no machine here).
#[cfg(doctest)]
#[doc = include_str!("../docs/guide/deployments.md")]
pub struct GuideDeployments;

/// The guide's page `docs/guide/operations.md`, its code blocks compiled as doc-tests
/// (`tests/readme.rs` also runs them against a server, but for the Sentinel ones, which name
/// addresses of no machine here).
#[cfg(doctest)]
#[doc = include_str!("../docs/guide/operations.md")]
pub struct GuideOperations;

/// The guide's page `docs/guide/security.md`, its code blocks compiled as doc-tests
/// (`tests/readme.rs` also runs them against a server, but for the Sentinel ones, which name
/// addresses of no machine here).
#[cfg(doctest)]
#[doc = include_str!("../docs/guide/security.md")]
pub struct GuideSecurity;

/// The guide's page `docs/guide/redisson.md`, its code blocks compiled as doc-tests
/// (`tests/readme.rs` also runs them against a server, but for the Sentinel ones, which name
/// addresses of no machine here).
#[cfg(doctest)]
#[doc = include_str!("../docs/guide/redisson.md")]
pub struct GuideRedisson;

/// The guide's page `docs/guide/outages-and-errors.md`, its code blocks compiled as doc-tests
/// (`tests/readme.rs` also runs them against a server, but for the Sentinel ones, which name
/// addresses of no machine here).
#[cfg(doctest)]
#[doc = include_str!("../docs/guide/outages-and-errors.md")]
pub struct GuideOutagesAndErrors;

/// README.md's snippets, compiled as doc-tests; `tests/readme.rs` runs them against a server.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

//! [`JobLock`]: a scheduled job that runs on one instance at a time (and once per tick), in
//! ShedLock's Redis layout, cancelled when its lock ends.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, OnceLock};
use std::time::{Duration, SystemTime};

use crate::engine::ScanType;
use crate::engine::Value;
use tokio::time::Instant;
use tracing::Instrument;

use crate::client::LockClient;
use crate::engine::durations::{self, millis};
use crate::engine::metrics::WorkMetrics;
use crate::engine::Tail;
use crate::engine::{
    self, AcquireArgs, Acquired, Call, Class, Field, Guard, Inspect, Keys, Kind, Lease, Primitive,
    Profile, ProfileOf, ReleaseArgs, Script, WakeRule,
};
use crate::error::{Error, Result};
use crate::inspection::Details;
use crate::layout::{Found, Layout, OwnKey, Pending};
use crate::lua;
use crate::names;

mod kind;
mod outcome;
mod run;
mod wire;

pub(crate) use kind::*;
pub use outcome::{JobHolder, JobRun, Skipped};
use wire::*;

/// Runs of a job lock's job, by `outcome`: `ran`, `skipped` (another instance had it, or the
/// tick was run) or `lost` (the lock ended under the job, which was cancelled) (counter).
/// ShedLock's Micrometer timer is the model; attempts are the engine's acquisitions and
/// timeouts.
pub const JOB_RUNS: &str = "fredlock_job_runs_total";
/// How long a job lock's jobs ran, in seconds, by `outcome`: `ran` or `lost` (histogram).
pub const JOB_RUN: &str = "fredlock_job_run_seconds";

/// The job's runs, as the engine's metrics record them.
const RUN_METRICS: WorkMetrics = WorkMetrics {
    runs: JOB_RUNS,
    ran_for: JOB_RUN,
};

/// Where the keys of a job stand in its `Keys`.
const KEY: usize = 0;
const CHANNEL: usize = 1;
const TICK: usize = 2;

/// ShedLock's key prefix, the first part of every job key: `job-lock:<env>:<name>`.
pub const DEFAULT_JOB_PREFIX: &str = "job-lock";
/// ShedLock's environment, the second part of every job key.
pub const DEFAULT_JOB_ENV: &str = "default";
/// How long a run holds the job unless told otherwise ([`JobLock::at_most_for`]): a dead
/// instance's lock ends by then.
pub const DEFAULT_AT_MOST_FOR: Duration = Duration::from_secs(10 * 60);
/// How long the latest tick an instance started is remembered ([`JobLock::ticks_kept_for`]).
pub const DEFAULT_TICKS_KEPT_FOR: Duration = Duration::from_secs(7 * 24 * 60 * 60);
/// The longest an instance waiting for a job sleeps between looks: a release by fredlock wakes
/// it at once, a ShedLock node's (which publishes nothing) within this.
pub const JOB_POLL: Duration = Duration::from_millis(500);

/// The prefix of the channel a release wakes waiting instances on.
const JOB_CHANNEL: &str = "fredlock_job__channel";
/// The prefix of the key that keeps a job's latest started tick.
const JOB_TICK: &str = "fredlock_job_tick";

/// Every script of the job lock: sections of one file.
const SCRIPTS: &str = include_str!("../../lua/job_lock.lua");

static JOB_RELEASE: LazyLock<Script> =
    LazyLock::new(|| lua::section_script(SCRIPTS, "release", true));
static JOB_RENEW: LazyLock<Script> = LazyLock::new(|| lua::section_script(SCRIPTS, "renew", true));
static JOB_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| lua::section_script(SCRIPTS, "acquire", false));
/// A run's single attempt: ShedLock's `SET <key> <value> PX <at_most_for> NX`, with `GET`.
static JOB_SET: LazyLock<Script> = LazyLock::new(|| Script::command("SET"));
static JOB_TICK_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| lua::section_script(SCRIPTS, "tick", false));
static JOB_FORCE_UNLOCK: LazyLock<Script> =
    LazyLock::new(|| lua::section_script(SCRIPTS, "force_unlock", true));
static JOB_INSPECT: LazyLock<Script> = LazyLock::new(|| lua::inspect_script(SCRIPTS, true));

/// The composed text of the job lock's script `name`, for tests and the benchmark.
pub(crate) fn script(name: &str) -> Option<&'static Script> {
    Some(match name {
        "release" => &JOB_RELEASE,
        "renew" => &JOB_RENEW,
        "acquire" => &JOB_ACQUIRE,
        "tick" => &JOB_TICK_ACQUIRE,
        "force_unlock" => &JOB_FORCE_UNLOCK,
        "inspect" => &JOB_INSPECT,
        _ => return None,
    })
}

/// The Redis commands `lua/job_lock.lua`'s scripts run, and the `SET` of a first attempt,
/// sent by itself.
const SCRIPT_COMMANDS: &[&str] = &["del", "get", "pexpire", "pttl", "set"];

/// What a job lock runs (its class's [`Class::commands`]).
const COMMANDS: &[&[&str]] = &[SCRIPT_COMMANDS, crate::lua::INSPECT_COMMANDS];

static JOB: Class = Class {
    renewal: Some(&JOB_RENEW),
    ..Class::new("job", WakeRule::Shared(CHANNEL), COMMANDS)
};

/// Acquisitions made by this process, which make each run's value unique.
static RUNS: AtomicU64 = AtomicU64::new(0);

/// This host's name, read once.
static HOST: LazyLock<Arc<str>> = LazyLock::new(|| Arc::from(names::host_name()));

/// A scheduled job that runs on one instance at a time, wire compatible with ShedLock: a Spring
/// service using ShedLock's Redis provider and a Rust service share a job during a migration.
///
/// A run takes the job with ShedLock's `SET <key> <value> NX PX <at_most_for>`, runs the job's
/// future, and gives the job back: if the [`at_least_for`](Self::at_least_for) deadline is
/// still ahead, the key is kept until then, otherwise it is deleted, both only if its value is
/// still the run's. Where ShedLock leaves a job running when its lock ends, fredlock drops the
/// job's future as soon as its lock is known lost ([`JobRun::Lost`]): at `at_most_for`, when
/// the key is deleted, or when renewals failed past the renew deadline.
///
/// # Layout
///
/// | key | value | expiry |
/// |---|---|---|
/// | `job-lock:<env>:<name>` (after the client's key prefix) | `ADDED:<ISO-8601 time>@<host>:<id>` | `at_most_for`, then the rest of `at_least_for` |
/// | `fredlock_job__channel:{<key>}` | channel: `0` when a run gives the job back | |
/// | `fredlock_job_tick:{<key>}` | the latest tick started, in ms since the Unix epoch | [`ticks_kept_for`](Self::ticks_kept_for) after it was written |
///
/// The id in the value is `<client uuid>:<n>`, new for every run; ShedLock writes a uuid there
/// and reads nothing of the value but its equality.
///
/// # Which run to use
///
/// - [`run`](Self::run): ShedLock's model: run now unless another instance runs the job. Give
///   [`at_least_for`](Self::at_least_for) a value above the clock skew between instances (and
///   below the period minus it), or a fast job runs again on a late instance.
/// - [`run_tick`](Self::run_tick): at most once per scheduled tick, whatever the skew and
///   however fast the job; the tick is recorded with the acquisition.
/// - [`run_waiting`](Self::run_waiting): wait for the job instead of skipping it.
///
/// ```no_run
/// # async fn demo(client: fredlock::LockClient) -> fredlock::Result<()> {
/// use std::time::Duration;
/// use fredlock::JobRun;
///
/// let job = client
///     .job_lock("nightly-report")
///     .at_most_for(Duration::from_secs(600))
///     .at_least_for(Duration::from_secs(30));
/// match job.run(async { /* build the report */ 42 }).await? {
///     JobRun::Ran(rows) => println!("ran: {rows}"),
///     JobRun::Skipped(skipped) => println!("skipped: {:?}", skipped.holder()),
///     JobRun::Lost => println!("the lock ended under the job, which was cancelled"),
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct JobLock {
    client: LockClient,
    name: Arc<str>,
    prefix: Arc<str>,
    env: Arc<str>,
    kind: Arc<JobKind>,
    host: Arc<str>,
    at_most_for: Duration,
    at_least_for: Duration,
    keep_alive: Option<Duration>,
    ticks_kept_for: Duration,
}

impl std::fmt::Debug for JobLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobLock")
            .field("key", &self.key())
            .field("host", &self.host)
            .field("at_most_for", &self.at_most_for)
            .field("at_least_for", &self.at_least_for)
            .field("keep_alive", &self.keep_alive)
            .finish_non_exhaustive()
    }
}

impl LockClient {
    /// The job lock of the job `name`, at ShedLock's key `job-lock:default:<name>` (after the
    /// client's [`key_prefix`](crate::LockClientBuilder::key_prefix)); see [`JobLock`].
    /// Creating it costs nothing and sends nothing.
    pub fn job_lock(&self, name: impl Into<String>) -> JobLock {
        let name: Arc<str> = Arc::from(name.into());
        let prefix: Arc<str> = Arc::from(DEFAULT_JOB_PREFIX);
        let env: Arc<str> = Arc::from(DEFAULT_JOB_ENV);
        JobLock {
            kind: Arc::new(JobKind::at(self, &prefix, &env, &name)),
            client: self.clone(),
            name,
            prefix,
            env,
            host: HOST.clone(),
            at_most_for: DEFAULT_AT_MOST_FOR,
            at_least_for: Duration::ZERO,
            keep_alive: None,
            ticks_kept_for: DEFAULT_TICKS_KEPT_FOR,
        }
    }
}

impl JobLock {
    /// How long a run holds the job at most ([`DEFAULT_AT_MOST_FOR`] unless set): ShedLock's
    /// `lockAtMostFor`. A dead instance's lock ends by then; a live one's job is cancelled then
    /// ([`JobRun::Lost`]) unless [`keep_alive`](Self::keep_alive) renews it. Set it well above
    /// the job's usual run time.
    pub fn at_most_for(mut self, at_most_for: Duration) -> JobLock {
        self.at_most_for = at_most_for;
        self
    }

    /// How long after its start a run keeps the job at least, even when the job ends sooner:
    /// ShedLock's `lockAtLeastFor` (zero unless set). With [`run`](Self::run) it keeps a fast
    /// job from running again on an instance whose clock is behind: set it above the clock skew
    /// between instances and below the period minus it. [`run_tick`](Self::run_tick) does not
    /// need it.
    pub fn at_least_for(mut self, at_least_for: Duration) -> JobLock {
        self.at_least_for = at_least_for;
        self
    }

    /// Keeps the job's lock alive while the job runs, as ShedLock's `KeepAliveLockProvider`
    /// does: the client's watchdog renews it every third of its
    /// [`watchdog_lease`](crate::LockClientBuilder::watchdog_lease), for up to `up_to` after the
    /// start. A job still running then is cancelled ([`JobRun::Lost`]), so that a hung job
    /// never keeps the job from every instance. A crashed instance's lock ends a watchdog lease
    /// after its last renewal, or at `at_most_for`, whichever is later. Needs `at_most_for` of
    /// at least the watchdog lease (the first renewal comes a third of the lease in).
    pub fn keep_alive(mut self, up_to: Duration) -> JobLock {
        self.keep_alive = Some(up_to);
        self
    }

    /// ShedLock's environment, the second part of the key (`default` unless set).
    pub fn env(mut self, env: impl Into<String>) -> JobLock {
        self.env = Arc::from(env.into());
        self.rekeyed()
    }

    /// ShedLock's key prefix, the first part of the key (`job-lock` unless set).
    pub fn prefix(mut self, prefix: impl Into<String>) -> JobLock {
        self.prefix = Arc::from(prefix.into());
        self.rekeyed()
    }

    /// The same job at the key its prefix, env and name make now.
    fn rekeyed(mut self) -> JobLock {
        self.kind = Arc::new(JobKind::at(
            &self.client,
            &self.prefix,
            &self.env,
            &self.name,
        ));
        self
    }

    /// The host name a run writes into the key, which other instances (and ShedLock) show as
    /// the job's holder: this host's name (`$HOSTNAME`, `/etc/hostname`) unless set. It must not
    /// be empty nor contain `:`, `@` or whitespace.
    pub fn host(mut self, host: impl Into<String>) -> JobLock {
        self.host = Arc::from(host.into());
        self
    }

    /// How long the latest tick started by [`run_tick`](Self::run_tick) is remembered
    /// ([`DEFAULT_TICKS_KEPT_FOR`] unless set). An instance that fires a tick later than this
    /// after it was run (a node that slept for days) would run it again: keep it above the
    /// longest such delay, and above the job's period.
    pub fn ticks_kept_for(mut self, kept_for: Duration) -> JobLock {
        self.ticks_kept_for = kept_for;
        self
    }

    /// The job's key, the client's key prefix included.
    pub fn key(&self) -> &str {
        self.kind.profile.name()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The permission check asks about exactly what its scripts run, as docs/SECURITY.md's
    /// table says.
    #[test]
    fn its_class_names_every_command_its_scripts_run() {
        crate::lua::check_commands(
            &[&JOB],
            &[SCRIPTS, crate::lua::INSPECT_HEAD, "redis.call('set'"],
            &["job"],
        );
    }
}

//! [`JobLock`]: a scheduled job that runs on one instance at a time (and once per tick), in
//! ShedLock's Redis layout, cancelled when its lock ends.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, OnceLock};
use std::time::{Duration, SystemTime};

use fred::interfaces::{ClientLike, KeysInterface};
use fred::types::scan::ScanType;
use fred::types::{Expiration, SetOptions, Value};
use tokio::time::Instant;
use tracing::Instrument;

use crate::client::LockClient;
use crate::engine::durations::{self, millis};
use crate::engine::{
    self, write, AcquireArgs, Attempts, Call, Class, Field, Guard, Inspect, Keys, Kind, Lease,
    Primitive, Profile, ProfileOf, ReleaseArgs, Script, WakeRule,
};
use crate::error::{Error, Result};
use crate::inspection::{Details, Holder, Tail};
use crate::layout::{Found, Layout, OwnKey, Pending};
use crate::lua;
use crate::names;

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
const SCRIPTS: &str = include_str!("../lua/job_lock.lua");

static JOB_RELEASE: LazyLock<Script> =
    LazyLock::new(|| lua::section_script(SCRIPTS, "release", true));
static JOB_RENEW: LazyLock<Script> = LazyLock::new(|| lua::section_script(SCRIPTS, "renew", true));
static JOB_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| lua::section_script(SCRIPTS, "acquire", false));
static JOB_FREE: LazyLock<Script> = LazyLock::new(|| lua::section_script(SCRIPTS, "free", false));
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
        "free" => &JOB_FREE,
        "tick" => &JOB_TICK_ACQUIRE,
        "force_unlock" => &JOB_FORCE_UNLOCK,
        "inspect" => &JOB_INSPECT,
        _ => return None,
    })
}

/// The job lock's class: waiting instances are woken by a release on the job's channel; runs
/// are checked (and with keep-alive renewed) by the watchdog with a compare of their value.
static JOB: Class = Class {
    renewal: Some(&JOB_RENEW),
    ..Class::new("job", WakeRule::Shared(CHANNEL))
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

/// How a run ended.
#[derive(Debug)]
#[must_use = "a job run may have been skipped or lost"]
pub enum JobRun<T> {
    /// This instance ran the job to its end; its output.
    Ran(T),
    /// Another instance runs the job (or, for [`JobLock::run_tick`], ran this tick or a later
    /// one): the job was not started here.
    Skipped(Skipped),
    /// The lock ended while the job ran (its `at_most_for` passed, it was force-unlocked or
    /// deleted, renewals failed past the renew deadline, or the keep-alive reached its cap):
    /// the job's future was dropped then, before another instance could take the job.
    Lost,
}

impl<T> JobRun<T> {
    /// The job's output, if it ran to its end here.
    pub fn ran(self) -> Option<T> {
        match self {
            JobRun::Ran(output) => Some(output),
            _ => None,
        }
    }

    /// Whether the job ran to its end here.
    pub fn is_ran(&self) -> bool {
        matches!(self, JobRun::Ran(_))
    }

    /// Whether the job was skipped here.
    pub fn is_skipped(&self) -> bool {
        matches!(self, JobRun::Skipped(_))
    }

    /// Whether the lock ended under the job, which was cancelled.
    pub fn is_lost(&self) -> bool {
        matches!(self, JobRun::Lost)
    }
}

/// Why a run was skipped: who had the job, or which tick was run already.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    holder: Option<JobHolder>,
    last_tick: Option<SystemTime>,
}

impl Skipped {
    /// The run that had the job when this one was skipped, if it still had it when asked.
    pub fn holder(&self) -> Option<&JobHolder> {
        self.holder.as_ref()
    }

    /// For [`JobLock::run_tick`]: the latest tick an instance started, when that is why the
    /// run was skipped.
    pub fn last_tick(&self) -> Option<SystemTime> {
        self.last_tick
    }
}

/// The run holding a job, as its key tells it (ShedLock's or fredlock's).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobHolder {
    value: String,
    remaining: Option<Duration>,
}

impl JobHolder {
    /// A holder read from a job key's value (ShedLock's `ADDED:<time>@<host>:<uuid>`, or
    /// fredlock's), with no remaining time known.
    pub fn from_value(value: impl Into<String>) -> JobHolder {
        JobHolder {
            value: value.into(),
            remaining: None,
        }
    }

    /// The key's whole value, `ADDED:<ISO-8601 time>@<host>:<id>`.
    pub fn value(&self) -> &str {
        &self.value
    }

    /// The host that runs the job (ShedLock's "locked by"), when the value has ShedLock's form.
    pub fn host(&self) -> Option<&str> {
        let (_, rest) = self.value.strip_prefix("ADDED:")?.split_once('@')?;
        Some(rest.split_once(':').map_or(rest, |(host, _)| host))
    }

    /// When the run took the job, by the clock of the instance that took it.
    pub fn locked_at(&self) -> Option<SystemTime> {
        let (time, _) = self.value.strip_prefix("ADDED:")?.split_once('@')?;
        parse_iso(time)
    }

    /// How long the job stays taken unless the run gives it back or renews it, by the server's
    /// count when it was read.
    pub fn remaining(&self) -> Option<Duration> {
        self.remaining
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

    // The calls below are boxed where they are awaited: inline, their futures nest deeper than
    // rustc's default recursion limit lets a caller's `async fn` compute the layout of.

    /// Runs `job` now, unless another instance runs it (or keeps it for its `at_least_for`):
    /// one `SET NX PX` to take the job, the job, and one compare-and-delete (or
    /// compare-and-pexpire while `at_least_for` lasts) to give it back.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an empty name, a bad host, an `at_most_for` Redis cannot
    /// take, an `at_least_for` above it, or a keep-alive with an `at_most_for` below the
    /// watchdog lease; [`Error::Unavailable`] or [`Error::Redis`] when the job could not be
    /// taken (nothing ran); [`Error::WrongType`] when the key holds something else;
    /// [`Error::Shutdown`] after the client shut down. Once the job ran, its outcome is
    /// returned whatever giving the job back said (a failure there is logged; the key's TTL
    /// ends it).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the job's future where it is, and gives the job back in the
    /// background as a finished run does (kept until `at_least_for` has passed): nothing leaks.
    /// A drop while the `SET` is on its way gives back what it took once the reply is in.
    pub async fn run<T, F>(&self, job: F) -> Result<JobRun<T>>
    where
        F: Future<Output = T>,
    {
        let span = self.span("run");
        async {
            self.check()?;
            let run = self.new_run();
            match Box::pin(self.take(&run)).await? {
                Ok(guard) => Ok(self.execute(&run, guard, job).await),
                Err(holder) => {
                    let holder = Box::pin(self.holder_seen(holder)).await;
                    Ok(self.skipped(holder, None))
                }
            }
        }
        .instrument(span)
        .await
    }

    /// Runs `job` once the job is free, waiting at most `wait` for the instance that runs it to
    /// give it back: a release by fredlock wakes the waiting instances at once (pub/sub); a
    /// ShedLock node's, which publishes nothing, within [`JOB_POLL`]. Skipped when the wait ends
    /// first.
    ///
    /// # Errors
    ///
    /// As [`run`](Self::run).
    ///
    /// # Cancel safety
    ///
    /// As [`run`](Self::run); a cancelled wait gives up its place among the waiting, which
    /// takes nothing.
    pub async fn run_waiting<T, F>(&self, wait: Duration, job: F) -> Result<JobRun<T>>
    where
        F: Future<Output = T>,
    {
        let span = self.span("run_waiting");
        async {
            self.check()?;
            durations::check_wait(self.key(), wait)?;
            let run = self.new_run();
            if let Ok(guard) = Box::pin(self.take(&run)).await? {
                return Ok(self.execute(&run, guard, job).await);
            }
            let waited = Box::pin(engine::acquire_as(
                self.client.engine(),
                run.clone(),
                run.field.clone(),
                Some(wait),
                self.lease(),
            ))
            .await?;
            match waited {
                Some(win) => Ok(self.execute(&run, win.guard, job).await),
                None => Ok(self.skipped(self.holder().await.ok().flatten(), None)),
            }
        }
        .instrument(span)
        .await
    }

    /// Runs `job` for the scheduled tick `tick` (the instant the schedule fired for, the same
    /// on every instance), only if no instance started that tick or a later one: exactly once
    /// per tick across the instances, however skewed their clocks and however fast the job.
    /// While another instance runs an earlier tick, it waits for it (at most `at_most_for`).
    ///
    /// The tick is recorded with the acquisition, in one script call, at
    /// `fredlock_job_tick:{<key>}`, and kept for [`ticks_kept_for`](Self::ticks_kept_for). A
    /// tick whose run was lost or cancelled counts as run: no instance starts it again.
    ///
    /// # Errors
    ///
    /// As [`run`](Self::run), and [`Error::InvalidArgument`] for a tick before the Unix epoch.
    ///
    /// # Cancel safety
    ///
    /// As [`run`](Self::run): a cancelled run's tick stays recorded.
    pub async fn run_tick<T, F>(&self, tick: SystemTime, job: F) -> Result<JobRun<T>>
    where
        F: Future<Output = T>,
    {
        let span = self.span("run_tick");
        async {
            self.check()?;
            let tick_ms = tick
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_err(|_| {
                    Error::InvalidArgument(format!(
                        "the tick of job lock {:?} is before the Unix epoch",
                        self.key()
                    ))
                })
                .map(durations::millis)?;
            durations::check(
                format_args!("the ticks_kept_for of job lock {:?}", self.key()),
                self.ticks_kept_for,
                durations::MIN_LEASE,
            )?;
            let until = Instant::now() + self.at_most_for;
            loop {
                let run = self.new_run();
                let reply = Box::pin(self.take_tick(&run, tick_ms)).await?;
                let holder = match reply {
                    Ok(guard) => return Ok(self.execute(&run, guard, job).await),
                    Err(Value::Array(parts))
                        if parts.first().and_then(Value::as_i64) == Some(0) =>
                    {
                        let last = parts
                            .get(1)
                            .and_then(Value::as_u64)
                            .map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms));
                        return Ok(self.skipped(None, last));
                    }
                    Err(Value::Array(parts)) => parts.get(1).and_then(|value| {
                        Some(JobHolder {
                            value: value.as_string()?,
                            remaining: parts
                                .get(2)
                                .and_then(Value::as_u64)
                                .map(Duration::from_millis),
                        })
                    }),
                    Err(_) => None,
                };
                let left = until.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Ok(self.skipped(holder, None));
                }
                let kind = &*self.kind;
                let free = Box::pin(engine::wait_until(
                    self.client.engine(),
                    kind,
                    || kind.free_call(),
                    Some(left),
                ))
                .await?;
                if !free {
                    return Ok(self.skipped(self.holder().await.ok().flatten(), None));
                }
            }
        }
        .instrument(span)
        .await
    }

    /// The run that holds the job now, if one does.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`] when the server cannot be asked; [`Error::WrongType`] when the key
    /// holds something else.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn holder(&self) -> Result<Option<JobHolder>> {
        Ok(self.inspect().await?.and_then(|inspection| {
            inspection
                .holders
                .into_iter()
                .next()
                .map(|holder| JobHolder {
                    value: holder.owner,
                    remaining: holder.remaining_lease,
                })
        }))
    }

    /// What Redis holds of the job: its holder (with its host as its identity and its
    /// remaining time), its keys and the last tick started; `None` when it has no key.
    ///
    /// # Errors
    ///
    /// As [`holder`](Self::holder).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn inspect(&self) -> Result<Option<crate::Inspection>> {
        let inspection = self.client.engine().inspect(&*self.kind, None).await?;
        Ok(inspection.exists().then_some(inspection))
    }

    /// Ends the current run whoever runs it, as an operator would: deletes the key (a fredlock
    /// instance's job is cancelled as soon as its client hears of it, at once when it listens
    /// for force unlocks), and wakes the waiting instances. The last tick stays. `true` if the
    /// job was taken.
    ///
    /// # Errors
    ///
    /// As [`holder`](Self::holder).
    ///
    /// # Cancel safety
    ///
    /// The deletion happens or not as a whole.
    pub async fn force_unlock(&self) -> Result<bool> {
        self.kind.force_unlock(&self.client).await
    }

    /// Fails for settings a run cannot use, before anything is sent.
    fn check(&self) -> Result<()> {
        let key = self.key();
        // The name, not the key: a name may end with ':', and the key of an empty one does.
        if self.name.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "a job lock's name must not be empty (its key would be {key:?})"
            )));
        }
        if self.host.is_empty()
            || self
                .host
                .chars()
                .any(|c| c == ':' || c == '@' || c.is_whitespace())
        {
            return Err(Error::InvalidArgument(format!(
                "the host {:?} of job lock {key:?} must not be empty nor contain ':', '@' or \
                 whitespace: ShedLock's value reads \"ADDED:<time>@<host>:<id>\"",
                self.host
            )));
        }
        durations::check(
            format_args!("the at_most_for of job lock {key:?}"),
            self.at_most_for,
            durations::MIN_LEASE,
        )?;
        if self.at_least_for > self.at_most_for {
            return Err(Error::InvalidArgument(format!(
                "the at_least_for ({:?}) of job lock {key:?} is above its at_most_for ({:?})",
                self.at_least_for, self.at_most_for
            )));
        }
        let watchdog_lease = self.client.engine().core().watchdog_lease;
        if self.keep_alive.is_some() && self.at_most_for < watchdog_lease {
            return Err(Error::InvalidArgument(format!(
                "job lock {key:?} keeps alive with an at_most_for ({:?}) below the client's \
                 watchdog lease ({watchdog_lease:?}): its first renewal would come too late",
                self.at_most_for
            )));
        }
        Ok(())
    }

    /// A span for one run.
    fn span(&self, how: &'static str) -> tracing::Span {
        tracing::info_span!(
            "job",
            job = %self.key(), how, host = %self.host,
            outcome = tracing::field::Empty,
        )
    }

    /// How the engine keeps a run's hold: renewed by the watchdog with keep-alive, else fixed.
    fn lease(&self) -> Lease {
        if self.keep_alive.is_some() {
            Lease::Watchdog
        } else {
            Lease::Fixed(self.at_most_for)
        }
    }

    /// A new run: its value, and the kind the engine keeps its hold with.
    fn new_run(&self) -> Arc<JobRunKind> {
        let n = RUNS.fetch_add(1, Ordering::Relaxed);
        let value = format!(
            "ADDED:{}@{}:{}:{n}",
            iso_utc(SystemTime::now()),
            self.host,
            self.client.id().hyphenated()
        );
        Arc::new(JobRunKind {
            profile: self.kind.profile.clone(),
            field: Field::from(value),
            at_most_for_ms: Value::from(millis(self.at_most_for) as i64),
            at_least_for: self.at_least_for,
            started: OnceLock::new(),
        })
    }

    /// Takes the job with ShedLock's `SET NX PX` (with `GET`, which says who has it when it
    /// is taken): `Err` with the holder's value when busy.
    async fn take(&self, run: &Arc<JobRunKind>) -> Result<std::result::Result<Guard, Value>> {
        let key = run.profile.keys().get(KEY);
        let value = run.field.clone();
        let at_most_for = millis(self.at_most_for) as i64;
        let won = engine::take(
            self.client.engine(),
            run.clone(),
            run.field.clone(),
            self.lease(),
            move |writer| async move {
                let slot = || {
                    writer
                        .client
                        .is_clustered()
                        .then(|| fred::util::redis_keyslot(key.as_bytes()))
                };
                let reply: Value = write(&writer, Attempts::UntilSent, slot, |redis| {
                    redis.set(
                        key.clone(),
                        Value::String(value.clone()),
                        Some(Expiration::PX(at_most_for)),
                        Some(SetOptions::NX),
                        true,
                    )
                })
                .await?;
                Ok((!reply.is_null()).then_some(reply))
            },
        )
        .await?;
        Ok(won.map(|win| win.guard))
    }

    /// Takes the job for the tick `tick_ms` (see the `tick` script): `Err` with the script's
    /// reply when the tick was run or someone runs the job.
    async fn take_tick(
        &self,
        run: &Arc<JobRunKind>,
        tick_ms: u64,
    ) -> Result<std::result::Result<Guard, Value>> {
        let keys = run.profile.keys();
        let call = Call {
            script: &JOB_TICK_ACQUIRE,
            keys: vec![keys.get(KEY), keys.get(TICK)],
            args: vec![
                Value::String(run.field.clone()),
                run.at_most_for_ms.clone(),
                Value::from(tick_ms as i64),
                Value::from(millis(self.ticks_kept_for) as i64),
            ],
        };
        let won = engine::take(
            self.client.engine(),
            run.clone(),
            run.field.clone(),
            self.lease(),
            move |writer| async move {
                let reply: Value = call.run(&writer).await?;
                Ok((!reply.is_null()).then_some(reply))
            },
        )
        .await?;
        Ok(won.map(|win| win.guard))
    }

    /// Runs `job` under `guard` until it ends or the lock does, then gives the job back.
    async fn execute<T, F>(&self, run: &JobRunKind, guard: Guard, job: F) -> JobRun<T>
    where
        F: Future<Output = T>,
    {
        let started = Instant::now();
        // At-least-for counts from the start, as ShedLock counts it.
        let _ = run.started.set(started);
        let cap = self.keep_alive.map(|up_to| started + up_to);
        let output = {
            let capped = async {
                match cap {
                    Some(cap) => tokio::time::sleep_until(cap).await,
                    None => std::future::pending().await,
                }
            };
            let capped_job = async {
                tokio::select! {
                    biased;
                    () = capped => {
                        tracing::warn!(job = %self.key(), owner = %run.field, "the job outran its keep-alive; the job was cancelled");
                        None
                    }
                    output = job => Some(output),
                }
            };
            // Lost first: a job that ends as its lock does is reported lost.
            let engine = self.client.engine();
            // Boxed: the job's future inside two selects overflows a debug build's stack.
            match engine.while_held(guard.lost(), Box::pin(capped_job)).await {
                Some(output) => output,
                None => {
                    tracing::warn!(job = %self.key(), owner = %run.field, "job lock lost while the job ran; the job was cancelled");
                    None
                }
            }
        };
        let ran_for = started.elapsed();
        let released = Box::pin(guard.unlock()).await;
        if let (Some(_), Err(error)) = (&output, &released) {
            tracing::warn!(job = %self.key(), %error, "the job ran, but giving it back failed; its TTL ends it");
        }
        let outcome = if output.is_some() { "ran" } else { "lost" };
        tracing::Span::current().record("outcome", outcome);
        self.client.engine().core().metrics.job_ended(
            JOB.label,
            self.key(),
            outcome,
            Some(ran_for),
        );
        match output {
            Some(output) => JobRun::Ran(output),
            None => JobRun::Lost,
        }
    }

    /// The holder whose value a `SET .. GET` found, with its remaining time (one `PTTL`; none
    /// when that read fails or the key went meanwhile).
    async fn holder_seen(&self, value: Value) -> Option<JobHolder> {
        let value = value.as_string()?;
        let pttl: Option<i64> = self.client.redis().pttl(self.key()).await.ok();
        Some(JobHolder {
            value,
            remaining: pttl
                .and_then(|ms| u64::try_from(ms).ok())
                .map(Duration::from_millis),
        })
    }

    /// A skipped run, with the holder its caller saw (if any) and `last_tick`.
    fn skipped<T>(&self, holder: Option<JobHolder>, last_tick: Option<SystemTime>) -> JobRun<T> {
        tracing::Span::current().record("outcome", "skipped");
        tracing::debug!(job = %self.key(), holder = ?holder.as_ref().map(JobHolder::value), "job skipped");
        self.client
            .engine()
            .core()
            .metrics
            .job_ended(JOB.label, self.key(), "skipped", None);
        JobRun::Skipped(Skipped { holder, last_tick })
    }
}

/// A job, as inspections, force unlocks and waits see it: its keys.
pub(crate) struct JobKind {
    profile: ProfileOf<[u32; 0]>,
}

impl JobKind {
    fn at(client: &LockClient, prefix: &str, env: &str, name: &str) -> JobKind {
        JobKind::at_key(client.key(format!("{prefix}:{env}:{name}")))
    }

    fn at_key(key: String) -> JobKind {
        JobKind {
            profile: ProfileOf::new(
                &JOB,
                Keys::new([
                    key.as_str(),
                    &names::suffixed(JOB_CHANNEL, &key),
                    &names::suffixed(JOB_TICK, &key),
                ]),
            ),
        }
    }

    fn free_call(&self) -> Call {
        Call {
            script: &JOB_FREE,
            keys: vec![self.profile.keys().get(KEY)],
            args: vec![Value::from(millis(JOB_POLL) as i64)],
        }
    }

    async fn force_unlock(&self, client: &LockClient) -> Result<bool> {
        let keys = self.profile.keys();
        let call = Call {
            script: &JOB_FORCE_UNLOCK,
            keys: vec![keys.get(KEY), keys.get(CHANNEL)],
            args: Vec::new(),
        };
        let deleted: i64 = client.engine().send(self, call).await?;
        if deleted == 1 {
            tracing::info!(job = %self.profile.name(), "job lock force-unlocked");
        }
        Ok(deleted == 1)
    }
}

impl Primitive for JobKind {
    fn profile(&self) -> &Profile {
        &self.profile
    }
}

impl Inspect for JobKind {
    fn inspect(&self) -> Call {
        let keys = self.profile.keys();
        Call {
            script: &JOB_INSPECT,
            keys: vec![keys.get(KEY), keys.get(TICK)],
            args: Vec::new(),
        }
    }

    /// The host that runs it, then the last tick.
    fn details(&self, tail: &mut Tail, holders: &mut [Holder]) -> Result<Details, String> {
        tail.identities(holders)?;
        Ok(Details::Job {
            last_tick: tail.time(),
        })
    }
}

/// One run's hold, as the engine keeps it: its value is its owner field, and giving it back
/// keeps the key for the rest of `at_least_for` from when the job started.
struct JobRunKind {
    profile: ProfileOf<[u32; 0]>,
    field: Field,
    at_most_for_ms: Value,
    at_least_for: Duration,
    /// When the job started; a run whose job never started keeps nothing.
    started: OnceLock<Instant>,
}

impl JobRunKind {
    /// The ms of `at_least_for` left, rounded up; 0 when none is.
    fn at_least_left(&self) -> i64 {
        let Some(started) = self.started.get() else {
            return 0;
        };
        let left = (*started + self.at_least_for).saturating_duration_since(Instant::now());
        if left.is_zero() {
            0
        } else {
            millis(left).max(1) as i64
        }
    }
}

impl Primitive for JobRunKind {
    fn profile(&self) -> &Profile {
        &self.profile
    }
}

impl Kind for JobRunKind {
    /// A waiting instance's attempt, in the engine's acquire loop.
    fn acquire(&self, args: &AcquireArgs<'_>) -> Call {
        Call {
            script: &JOB_ACQUIRE,
            keys: vec![self.profile.keys().get(KEY)],
            args: vec![
                Value::String(args.field.clone()),
                self.at_most_for_ms.clone(),
                Value::from(millis(JOB_POLL) as i64),
            ],
        }
    }

    fn release(&self, args: &ReleaseArgs<'_>) -> Call {
        let keys = self.profile.keys();
        Call {
            script: &JOB_RELEASE,
            keys: vec![keys.get(KEY), keys.get(CHANNEL)],
            args: vec![
                Value::String(args.field.clone()),
                Value::from(self.at_least_left()),
            ],
        }
    }
}

/// A job found by a scan or by name: read and force-unlocked as a job.
struct FoundJob {
    client: LockClient,
    kind: JobKind,
}

impl Found for FoundJob {
    fn parts(&self) -> (&LockClient, &dyn Inspect) {
        (&self.client, &self.kind)
    }

    fn force_unlock(&self) -> Pending<'_, bool> {
        Box::pin(self.kind.force_unlock(&self.client))
    }
}

/// A job is known by its key under ShedLock's default prefix, or by its tick key (a job that
/// ran by tick, under any prefix). A job under another prefix that never ran by tick is found
/// by its own handle only ([`JobLock::inspect`]).
pub(crate) const LAYOUT: Layout = Layout {
    own_keys: &[JOB_TICK],
    own_key: Some(OwnKey {
        of: |key| is_job_key(key).then(|| key.to_owned()),
        glob: "*job-lock:*",
        key_type: ScanType::String,
        name: |key| is_job_key(key).then(|| key.to_owned()),
    }),
    mode_field: false,
    of_type: None,
    strays: None,
    at_key: |client, key| {
        Box::new(FoundJob {
            client: client.clone(),
            kind: JobKind::at_key(key),
        })
    },
};

/// Whether `key` is a job key under ShedLock's default prefix (and not one of fredlock's keys
/// about it).
fn is_job_key(key: &str) -> bool {
    key.contains("job-lock:")
        && names::unsuffixed(JOB_TICK, key).is_none()
        && names::unsuffixed(JOB_CHANNEL, key).is_none()
}

/// `at` as ISO-8601 in UTC with milliseconds, as ShedLock writes it (`Instant.toString()`).
fn iso_utc(at: SystemTime) -> String {
    let ms = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as i64);
    let (days, ms) = (ms.div_euclid(86_400_000), ms.rem_euclid(86_400_000));
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        ms / 3_600_000,
        ms / 60_000 % 60,
        ms / 1000 % 60,
        ms % 1000
    )
}

/// An ISO-8601 UTC instant (`2026-11-26T02:30:00Z`, with any fraction of a second), as ShedLock
/// and [`iso_utc`] write them.
fn parse_iso(text: &str) -> Option<SystemTime> {
    let text = text.strip_suffix('Z')?;
    let (date, time) = text.split_once('T')?;
    let mut date = date.splitn(3, '-').map(str::parse::<i64>);
    let (year, month, day) = (date.next()?.ok()?, date.next()?.ok()?, date.next()?.ok()?);
    let (clock, fraction) = time.split_once('.').unwrap_or((time, ""));
    let mut clock = clock.splitn(3, ':').map(str::parse::<i64>);
    let (hour, minute, second) = (
        clock.next()?.ok()?,
        clock.next()?.ok()?,
        clock.next()?.ok()?,
    );
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 {
        return None;
    }
    let nanos = if fraction.is_empty() {
        0
    } else {
        let digits: String = fraction
            .chars()
            .chain("000000000".chars())
            .take(9)
            .collect();
        digits.parse::<u32>().ok()?
    };
    let seconds = days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second;
    let seconds = u64::try_from(seconds).ok()?;
    Some(SystemTime::UNIX_EPOCH + Duration::new(seconds, nanos))
}

/// The civil date of `days` since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Days since 1970-01-01 of a civil date (the inverse of [`civil_from_days`]).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let yoe = year.rem_euclid(400);
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iso_times_round_trip_and_read_shedlocks() {
        for ms in [0u64, 951_782_400_000, 1_795_000_000_123, 4_107_542_399_999] {
            let at = SystemTime::UNIX_EPOCH + Duration::from_millis(ms);
            assert_eq!(parse_iso(&iso_utc(at)), Some(at), "{}", iso_utc(at));
        }
        assert_eq!(
            iso_utc(SystemTime::UNIX_EPOCH + Duration::from_millis(951_782_400_000)),
            "2000-02-29T00:00:00.000Z"
        );
        // ShedLock's `Instant.toString()`: no fraction when it is zero, up to nine digits.
        let at = parse_iso("2026-11-26T02:30:00Z").unwrap();
        assert_eq!(iso_utc(at), "2026-11-26T02:30:00.000Z");
        let at = parse_iso("2026-11-26T02:30:00.123456789Z").unwrap();
        assert_eq!(iso_utc(at), "2026-11-26T02:30:00.123Z");
        assert_eq!(parse_iso("2026-13-01T00:00:00Z"), None);
        assert_eq!(parse_iso("yesterday"), None);
    }

    #[test]
    fn a_holder_reads_shedlocks_value_and_fredlocks() {
        let shedlock = JobHolder {
            value: "ADDED:2026-11-26T02:30:00.5Z@billing-7:1b4e28ba-2fa1-11d2-883f-0016d3cca427"
                .into(),
            remaining: None,
        };
        assert_eq!(shedlock.host(), Some("billing-7"));
        assert_eq!(shedlock.locked_at(), parse_iso("2026-11-26T02:30:00.500Z"));
        let ours = JobHolder {
            value: "ADDED:2026-11-26T02:30:00.000Z@pod-1:1b4e28ba-2fa1-11d2-883f-0016d3cca427:7"
                .into(),
            remaining: None,
        };
        assert_eq!(ours.host(), Some("pod-1"));
        let foreign = JobHolder {
            value: "something else".into(),
            remaining: None,
        };
        assert_eq!((foreign.host(), foreign.locked_at()), (None, None));
    }
}

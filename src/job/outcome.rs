//! What a run reports: how it ended ([`JobRun`]), why it was skipped, who held the job.

use super::*;

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
    pub(super) holder: Option<JobHolder>,
    pub(super) last_tick: Option<SystemTime>,
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
    pub(super) value: String,
    pub(super) remaining: Option<Duration>,
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

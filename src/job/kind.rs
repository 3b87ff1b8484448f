//! The job as the engine and the scans see it: its keys and reads (`JobKind`), one run's
//! hold (`JobRunKind`), and how a scan knows a job (`LAYOUT`).

use super::*;

/// A job, as inspections, force unlocks and waits see it: its keys.
pub(crate) struct JobKind {
    pub(super) profile: ProfileOf<[u32; 0]>,
}

impl JobKind {
    pub(super) fn at(client: &LockClient, prefix: &str, env: &str, name: &str) -> JobKind {
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

    pub(super) async fn force_unlock(&self, client: &LockClient) -> Result<bool> {
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

    /// The last tick (its holder's host is in its owner field, its key's value).
    fn details(&self, tail: &mut Tail) -> Result<Details, String> {
        Ok(Details::Job {
            last_tick: tail.time(),
        })
    }
}

/// One run's hold, as the engine keeps it: its value is its owner field, and giving it back
/// keeps the key for the rest of `at_least_for` from when the job started.
pub(crate) struct JobRunKind {
    pub(super) profile: ProfileOf<[u32; 0]>,
    pub(super) field: Field,
    pub(super) at_most_for_ms: Value,
    pub(super) at_least_for: Duration,
    /// The call its attempts make.
    pub(super) take: Take,
    /// When the job started; a run whose job never started keeps nothing.
    pub(super) started: OnceLock<Instant>,
}

/// How a run takes the job: the call each of its attempts makes.
pub(crate) enum Take {
    /// ShedLock's `SET NX PX`, with `GET`: refused with the holder's value when busy. For a
    /// single attempt only (it says nothing of how long to wait).
    Now,
    /// The `acquire` script: busy while another run holds the job.
    Waiting,
    /// The `tick` script: refused with the last tick started when it is this one or a later one.
    Tick { tick_ms: Value, kept_for_ms: Value },
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
    fn acquire(&self, args: &AcquireArgs<'_>) -> Call {
        let keys = self.profile.keys();
        let value = Value::String(args.field.clone());
        let poll = || Value::from(millis(JOB_POLL) as i64);
        match &self.take {
            Take::Now => Call {
                script: &JOB_SET,
                keys: vec![keys.get(KEY)],
                args: vec![
                    value,
                    Value::from_static_str("PX"),
                    self.at_most_for_ms.clone(),
                    Value::from_static_str("NX"),
                    Value::from_static_str("GET"),
                ],
            },
            Take::Waiting => Call {
                script: &JOB_ACQUIRE,
                keys: vec![keys.get(KEY)],
                args: vec![value, self.at_most_for_ms.clone(), poll()],
            },
            Take::Tick {
                tick_ms,
                kept_for_ms,
            } => Call {
                script: &JOB_TICK_ACQUIRE,
                keys: vec![keys.get(KEY), keys.get(TICK)],
                args: vec![
                    value,
                    self.at_most_for_ms.clone(),
                    tick_ms.clone(),
                    kept_for_ms.clone(),
                    poll(),
                ],
            },
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
pub(crate) struct FoundJob {
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
pub(super) fn is_job_key(key: &str) -> bool {
    key.contains("job-lock:")
        && names::unsuffixed(JOB_TICK, key).is_none()
        && names::unsuffixed(JOB_CHANNEL, key).is_none()
}

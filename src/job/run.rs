//! Running a job: taking it (a run's `SET NX PX`, or a tick's script), running the job under
//! its hold, giving it back, and what the run reports.

use super::*;
use crate::inspection::LockEventKind;

impl JobLock {
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
        // Boxed: the run (its engine calls and the job inside) nests too deep for the
        // layout of a caller's own `async fn` without it.
        Box::pin(
            async {
                self.check()?;
                let run = self.new_run(Take::Now);
                match Box::pin(self.take(&run, Duration::ZERO)).await? {
                    Acquired::Won(win) => Ok(self.execute(&run, win.guard, job).await),
                    // `SET .. GET`'s refusal is the holder's value.
                    Acquired::Refused(holder) => {
                        let holder = Box::pin(self.holder_seen(holder)).await;
                        Ok(self.skipped(holder, None))
                    }
                    Acquired::Busy => Ok(self.skipped(None, None)),
                }
            }
            .instrument(span),
        )
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
        // Boxed: the run (its engine calls and the job inside) nests too deep for the
        // layout of a caller's own `async fn` without it.
        Box::pin(
            async {
                self.check()?;
                durations::check_wait(self.key(), wait)?;
                let run = self.new_run(Take::Waiting);
                match Box::pin(self.take(&run, wait)).await? {
                    Acquired::Won(win) => Ok(self.execute(&run, win.guard, job).await),
                    Acquired::Busy | Acquired::Refused(_) => {
                        Ok(self.skipped(self.holder().await.ok().flatten(), None))
                    }
                }
            }
            .instrument(span),
        )
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
        // Boxed: the run (its engine calls and the job inside) nests too deep for the
        // layout of a caller's own `async fn` without it.
        Box::pin(
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
                let run = self.new_run(Take::Tick {
                    tick_ms: Value::from(tick_ms as i64),
                    kept_for_ms: Value::from(millis(self.ticks_kept_for) as i64),
                });
                let mut acquired = Box::pin(self.take(&run, Duration::ZERO)).await?;
                if matches!(acquired, Acquired::Busy) {
                    // Only a run that found an earlier one holding the job waits for it: one that
                    // cannot reach Redis answers at once, as the outage rule of a call that does not
                    // wait says ("Outages", in the crate docs).
                    acquired = Box::pin(self.take(&run, self.at_most_for)).await?;
                }
                match acquired {
                    Acquired::Won(win) => Ok(self.execute(&run, win.guard, job).await),
                    // The tick script's refusal is the last tick started.
                    Acquired::Refused(last) => {
                        let last = last
                            .as_u64()
                            .map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms));
                        Ok(self.skipped(None, last))
                    }
                    Acquired::Busy => Ok(self.skipped(self.holder().await.ok().flatten(), None)),
                }
            }
            .instrument(span),
        )
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

    /// A new run that takes the job as `take` says: its value, and the kind the engine keeps
    /// its hold with.
    fn new_run(&self, take: Take) -> Arc<JobRunKind> {
        let n = RUNS.fetch_add(1, Ordering::Relaxed);
        // `ADDED:<time>@<host>:<client id>:<n>`, written part by part (see `push_iso_utc`).
        let id = self.client.engine().core().id_text();
        let mut value = String::with_capacity(6 + ISO_LEN + self.host.len() + id.len() + 22);
        value.push_str("ADDED:");
        push_iso_utc(&mut value, SystemTime::now());
        value.push('@');
        value.push_str(&self.host);
        value.push(':');
        value.push_str(id);
        value.push(':');
        push_decimal(&mut value, n);
        Arc::new(JobRunKind {
            profile: self.kind.profile.clone(),
            field: Field::from(value),
            at_most_for_ms: Value::from(millis(self.at_most_for) as i64),
            at_least_for: self.at_least_for,
            take,
            started: OnceLock::new(),
        })
    }

    /// Takes the job for `run`, trying again (as the engine's acquire loop does, woken by a
    /// release) for at most `wait`: every run's one way in.
    fn take(
        &self,
        run: &Arc<JobRunKind>,
        wait: Duration,
    ) -> impl Future<Output = Result<Acquired>> + Send + '_ {
        engine::acquire_as(
            self.client.engine(),
            run.clone(),
            run.field.clone(),
            Some(wait),
            self.lease(),
        )
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
        let core = self.client.engine().core();
        core.metrics
            .work_ended(RUN_METRICS, JOB.label, self.key(), outcome, Some(ran_for));
        let what = match output {
            Some(_) => LockEventKind::JobRan,
            None => LockEventKind::JobLost,
        };
        core.report.events.work(JOB.label, self.key(), what);
        match output {
            Some(output) => JobRun::Ran(output),
            None => JobRun::Lost,
        }
    }

    /// The holder whose value a `SET .. GET` found, with its remaining time (one `PTTL`; none
    /// when that read fails or the key went meanwhile).
    async fn holder_seen(&self, value: Value) -> Option<JobHolder> {
        let value = value.as_string()?;
        let pttl = self
            .client
            .engine()
            .core()
            .redis()
            .pttl(self.key())
            .await
            .ok();
        Some(JobHolder {
            value,
            remaining: pttl.and_then(crate::inspection::expiry),
        })
    }

    /// A skipped run, with the holder its caller saw (if any) and `last_tick`.
    fn skipped<T>(&self, holder: Option<JobHolder>, last_tick: Option<SystemTime>) -> JobRun<T> {
        tracing::Span::current().record("outcome", "skipped");
        tracing::debug!(job = %self.key(), holder = ?holder.as_ref().map(JobHolder::value), "job skipped");
        let core = self.client.engine().core();
        core.metrics
            .work_ended(RUN_METRICS, JOB.label, self.key(), "skipped", None);
        let skipped = LockEventKind::JobSkipped;
        core.report.events.work(JOB.label, self.key(), skipped);
        JobRun::Skipped(Skipped { holder, last_tick })
    }
}

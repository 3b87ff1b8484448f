//! The one acquire loop, for every primitive: attempt; when busy, join the waiter's channel and
//! attempt again once subscribed (a message published before the subscription existed would
//! otherwise be missed); after that, sleep until woken or until the holder's lease would end,
//! and attempt again, until the deadline. A primitive whose waiters back off instead never
//! subscribes: it sleeps its backoff, bounded by the same lease.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::engine::Value;
use rand::Rng;
use tokio::time::Instant;
use tracing::Instrument;

use crate::engine::durations;
use crate::engine::guard::Guard;
use crate::engine::holds::Lease;
use crate::engine::inflight::{boxed, InFlight};
use crate::engine::kind::{AcquireArgs, Call, InLine, Kind, OnWin, Primitive, Reply};
use crate::engine::ledger::Pair;
use crate::engine::metrics::{Ended, Waiting};
use crate::engine::permissions;
use crate::engine::profile::{Backoff, Wake, WakeRule};
use crate::engine::pubsub::{self, Channel, Messages, PassOn, Quiet, Waiter};
use crate::engine::script::LastRefusal;
use crate::engine::undo::{Leave, SettleOnDrop, Undo, UndoOnDrop};
use crate::engine::{Core, Engine, Field};
use crate::error::{connection_lost, not_connected, Error, RedisError, Result};
use crate::inspection::LockEventKind;
use crate::owner::OwnerId;

/// An attempt that began before the wait's deadline may run this much past it, so that a
/// request already on the wire is not thrown away (and undone) for being a little late.
const ATTEMPT_GRACE: Duration = Duration::from_millis(100);

/// First pause after a connection error while waiting; doubled up to [`MAX_ERROR_PAUSE`] (see
/// [`error_pause`]).
const MIN_ERROR_PAUSE: Duration = Duration::from_millis(50);
const MAX_ERROR_PAUSE: Duration = Duration::from_secs(1);

/// A won acquisition: the hold, and what the acquire script returned with it (a fencing token,
/// say), or for a re-entry what the owner's first acquisition returned.
pub(crate) struct Win {
    pub(crate) guard: Guard,
    pub(crate) value: Option<Value>,
    /// Whether some attempt found it held first: a hand-off, not an uncontended acquisition.
    pub(crate) contended: bool,
}

/// What one run of the acquire script said.
enum Attempt {
    Won(Win),
    Busy {
        retry_after: Duration,
    },
    /// Refused for good: what the script said instead.
    Refused(Value),
    /// The caller's deadline passed before the reply came; the attempt is undone if it won.
    /// With what kept the attempt from running meanwhile, if something did (boxed: rare, and
    /// every attempt's reply carries room for it).
    TimedOut(Option<Box<RedisError>>),
}

/// What an acquire call did in Redis, carried out of [`InFlight`] with its undo armed, so that
/// an abandoned call undoes itself.
enum Outcome {
    /// Dropping the win's guard, unless the caller keeps it, gives the hold back.
    Won(Win),
    /// Held by another owner: the PTTL in ms, and for a queueing kind the place in its queue.
    Busy(i64, Option<UndoOnDrop>),
    Refused(Value),
}

/// How an acquisition of [`acquire_as`] ended, when it did not fail.
pub(crate) enum Acquired {
    Won(Win),
    /// Busy until the wait ended.
    Busy,
    /// Refused for good: what the acquire call said instead (see [`Reply`]).
    Refused(Value),
}

impl Acquired {
    fn won(self) -> Option<Win> {
        match self {
            Acquired::Won(win) => Some(win),
            Acquired::Busy | Acquired::Refused(_) => None,
        }
    }
}

/// Acquires `kind` for `owner`, waiting at most `wait` (`None`: as long as it takes): `Ok(None)`
/// when it stayed busy that long.
///
/// A queueing kind's waiter holds a place in the queue from its first attempt on. It keeps it by
/// trying again at least every third of its place's length, and gives it up on every way out but
/// success: at once when its wait times out, through the undo task when the future is dropped or
/// fails.
///
/// Not an `async fn`, which would keep its arguments twice (as given, and as its body's own):
/// a waiting task carries this future all its wait.
pub(crate) fn acquire(
    engine: &Engine,
    kind: Arc<dyn Kind>,
    owner: OwnerId,
    wait: Option<Duration>,
    lease: Lease,
) -> impl Future<Output = Result<Option<Win>>> + Send + '_ {
    // Made now, so that the future keeps the field instead of the owner it is made from.
    let field = engine
        .core()
        .field_with(owner, kind.profile().field_suffix());
    acquiring(engine, kind, field, wait, lease, Acquired::won)
}

/// [`acquire`] for a primitive whose holds are not an owner's but each acquisition's own
/// `field` (a job lock's run, whose value is new every time), and whose acquire call may refuse
/// for good ([`Acquired::Refused`]).
pub(crate) fn acquire_as(
    engine: &Engine,
    kind: Arc<dyn Kind>,
    field: Field,
    wait: Option<Duration>,
    lease: Lease,
) -> impl Future<Output = Result<Acquired>> + Send + '_ {
    acquiring(engine, kind, field, wait, lease, |acquired| acquired)
}

/// The acquisition of [`acquire`] and [`acquire_as`], its outcome as `told` tells it: one
/// future, not one wrapped in another (a layer more on every lock and in every waiting task).
fn acquiring<T: 'static>(
    engine: &Engine,
    kind: Arc<dyn Kind>,
    field: Field,
    wait: Option<Duration>,
    lease: Lease,
    told: fn(Acquired) -> T,
) -> impl Future<Output = Result<T>> + Send + '_ {
    let pair = Pair::new(kind.profile().name_text(), field);
    // The class, not its label: a pointer is half a `&str` in every waiting task.
    let class = kind.profile().class();
    let span = tracing::debug_span!(
        "acquire",
        lock = %pair.name, kind = class.label, owner = %pair.field,
        waited_ms = tracing::field::Empty, outcome = tracing::field::Empty,
    );
    async move {
        let started = Instant::now();
        let result = acquire_loop(engine, kind, &pair, wait, lease, started).await;
        let waited = started.elapsed();
        let ended = match &result {
            Ok(Acquired::Won(win)) => {
                let what = class.events.taken;
                let events = &engine.core().report.events;
                events.emit(class.label, &pair.name, Some(&pair.field), what);
                Ended::Acquired {
                    contended: win.contended,
                }
            }
            Ok(Acquired::Busy | Acquired::Refused(_)) => Ended::TimedOut,
            Err(error) => Ended::Failed(error),
        };
        engine
            .core()
            .metrics
            .acquire_ended(class.label, &pair.name, waited, &ended);
        let span = tracing::Span::current();
        span.record("waited_ms", waited.as_millis() as u64);
        span.record("outcome", ended.outcome());
        result.map(told)
    }
    .instrument(span)
}

/// The attempts of one [`acquire`], from `started` on.
///
/// Not an `async fn`, which would keep its arguments twice (as given, and as its body's own),
/// in every waiting task.
#[allow(clippy::manual_async_fn)] // the point: see above
fn acquire_loop<'a>(
    engine: &'a Engine,
    kind: Arc<dyn Kind>,
    pair: &'a Pair,
    wait: Option<Duration>,
    lease: Lease,
    started: Instant,
) -> impl Future<Output = Result<Acquired>> + Send + 'a {
    async move {
        // Locals that only name what the pair or the engine hold are not kept: every one would
        // be room in every waiting task.
        engine.core().ensure_open()?;
        check_primitive(&*kind)?;
        lease.check(kind.profile().name())?;
        if !permissions::known(engine.core(), kind.profile().class()) {
            // A bounded wait bounds the question too; a single attempt (a wait of zero) waits for
            // the answer as for its own reply.
            let bound = wait.filter(|wait| !wait.is_zero());
            permissions::check(engine.core(), &*kind, Some(&pair.field), bound).await?;
        }
        if let Some(wait) = wait {
            // Only a bounded wait has one to check: `lock()` pays nothing for it.
            durations::check_wait(kind.profile().name(), wait)?;
        }
        let single_attempt = wait == Some(Duration::ZERO);
        // The deadline and the queue place are worked out where needed from what the future
        // keeps anyway, rather than kept (closures would keep their references).
        // Boxed, like everything a waiting task keeps that most waiters have none of.
        let queued = place(&*kind, single_attempt)
            .map(|_| Box::new(leave_undo(engine.core(), &kind, &pair.field)));
        // Busy replies so far, which a backing-off kind's pauses grow with.
        let mut busy: u32 = 0;
        // Connection errors in a row, which the pause after one grows with.
        let mut errors: u8 = 0;
        let mut waiter: Option<Waiter> = None;
        // The waiters' channel as it was before the first attempt, if subscribed already (a worker
        // loop's lingering channel): joining it after a busy reply needs no second attempt when
        // nothing was delivered since.
        let mut quiet: Option<Quiet> = None;
        // Whether any attempt got an answer: a wait that ends without one reports the outage, not a
        // lock held by someone else.
        let mut reached = false;
        // Boxed: a waiting task keeps room for it all its wait, and it is rarely set.
        let mut last_failure: Option<Box<Error>> = None;
        let mut settle = SettleOnDrop::new(engine.core(), &kind, &pair.field);
        // Counted among the waiting from the first busy reply on, until this future ends.
        let mut waiting: Option<Waiting> = None;
        // Whether the last pause only kept the client's place in line (the lock's own expiry
        // further off).
        let mut keeping_place: bool;
        // Whether this client's release handed the lock on to another a moment ago: its first
        // attempt then stands in line, and respects the lock kept for the named client (see
        // `line`).
        let handed_on =
            in_line(&*kind) && !single_attempt && engine.core().handed_on.take(&pair.name);
        // A wait that ends without the lock leaves its queue place after the loop, with what
        // it ends with boxed: that local is room in every state of the future.
        let left: Box<Result<Acquired>> = loop {
            if waiter.is_none() && !single_attempt {
                quiet = engine
                    .core()
                    .pubsub
                    .quiet(|| channel(&*kind, &pair.field).map(|(channel, _)| channel));
            }
            // Armed while an attempt is on its way and after one whose reply was lost.
            settle.arm();
            // The attempt lives in this block alone, with no await after its own: a local
            // kept over two awaits (rustc frees it at the end of its scope, not at its move)
            // gets room of its own in every state of the future, the waiting one too.
            let pause = {
                // Boxed, like the join, the leave and the reconnect wait below: passing states
                // which, inline, would make every waiting task carry their timers and calls
                // (about 700 bytes) all its wait.
                // A waiter's client stands in the lock's line from its first busy reply on; the
                // attempts after it say whether a win leaves the line. A first attempt goes
                // without the line unless the client knows the lock to be contended (see
                // `line`): a busy reply joins the channel, and the attempt made once joined
                // stands in line.
                let contended = busy > 0 || handed_on || quiet.is_some();
                let line = (in_line(&*kind) && !single_attempt && contended).then(|| InLine {
                    number: engine.core().line_number,
                    place_ms: durations::millis(engine.core().queue_place),
                    on_win: match &waiter {
                        _ if busy == 0 => OnWin::Nothing,
                        Some(waiter) if waiter.has_company() => OnWin::Keep,
                        _ => OnWin::Leave,
                    },
                });
                if let (Some(waiter), Some(_)) = (&waiter, &line) {
                    waiter.attempting();
                }
                keeping_place = false;
                let attempt = boxed(|| {
                    attempt(
                        engine,
                        &kind,
                        pair,
                        lease,
                        line,
                        deadline(started, wait),
                        single_attempt,
                    )
                })
                .await;
                if matches!(
                    attempt,
                    Ok(Attempt::Won(_) | Attempt::Busy { .. } | Attempt::Refused(_))
                ) {
                    // A reply: it carried the fences of every earlier lost one.
                    settle.disarm();
                }
                match attempt {
                    Ok(Attempt::Won(mut win)) => {
                        win.contended = busy > 0;
                        // The acquire script took the waiter out of the queue.
                        if let Some(queued) = queued {
                            queued.keep();
                        }
                        tracing::debug!(
                            lock = %pair.name, owner = %pair.field,
                            waited_ms = started.elapsed().as_millis() as u64,
                            "acquired"
                        );
                        return Ok(Acquired::Won(win));
                    }
                    Ok(Attempt::Refused(said)) => break Box::new(Ok(Acquired::Refused(said))),
                    Ok(Attempt::Busy { retry_after }) => {
                        reached = true;
                        errors = 0;
                        let pause = match kind.profile().wake() {
                            Wake::Backoff(backoff) => retry_after.min(backoff.pause(busy)),
                            _ => retry_after,
                        };
                        busy = busy.saturating_add(1);
                        if waiting.is_none() && !single_attempt {
                            waiting = Some(
                                engine
                                    .core()
                                    .metrics
                                    .waiting(kind.profile().label(), &pair.name),
                            );
                        }
                        // Trying again is what keeps a queued waiter's place, and a place in line.
                        let third = engine.core().queue_place / 3;
                        keeping_place = in_line(&*kind) && third < pause;
                        let pause = if keeping_place { third } else { pause };
                        place(&*kind, single_attempt).map_or(pause, |place| pause.min(place / 3))
                    }
                    Ok(Attempt::TimedOut(refused)) => {
                        // A wait cut short while its attempt was being sent again ends naming
                        // what kept the attempt from running (a slot in migration's ASK, say).
                        // One still unanswered, with no failure seen before it, whose connection
                        // was lost under it (fred holds a call back while it reconnects), ends
                        // naming that; one that simply got no reply names nothing.
                        let cut = refused.map(|refused| *refused).or_else(|| {
                            (last_failure.is_none() && !engine.core().redis().is_connected())
                                .then(connection_lost)
                        });
                        if let Some(cut) = cut {
                            last_failure =
                                Some(Box::new(unavailable(engine, &pair.name, Some(cut))));
                        }
                        break Box::new(gave_up(engine, &pair.name, reached, last_failure.take()));
                    }
                    Err(error) if error.is_transient() && !single_attempt => {
                        tracing::debug!(
                            lock = %pair.name, owner = %pair.field, %error,
                            "acquire failed; retrying"
                        );
                        if !matches!(error, Error::Unavailable { source: None, .. }) {
                            last_failure = Some(Box::new(error));
                        }
                        let pause = error_pause(errors);
                        errors = errors.saturating_add(1);
                        pause
                    }
                    Err(error) => return Err(error),
                }
            };
            if single_attempt {
                return Ok(Acquired::Busy);
            }
            let until = bounded(Instant::now() + pause, deadline(started, wait));
            if !engine.core().redis().is_connected() {
                // Nothing to subscribe to while fred reconnects: wait for the connection (or the
                // pause) instead, and try again at once when it is back.
                if boxed(|| reconnected(engine.core(), until)).await.is_err() {
                    return Err(ended_by_shutdown(engine, &*kind, Some(&pair.field)));
                }
            } else {
                // A waiter's first busy reply joins its channel; once joined, it tries again at
                // once, unless the channel was subscribed since before that reply's attempt and
                // has delivered nothing since: an unlock after the attempt then wakes it.
                let mut sleeps = true;
                if waiter.is_none() {
                    if let Some((channel, messages)) = channel(&*kind, &pair.field) {
                        tracing::debug!(lock = %pair.name, owner = %pair.field, "waiting");
                        let joined = boxed(|| {
                            join(
                                engine.core(),
                                channel,
                                messages,
                                kind.profile().wants(),
                                in_line(&*kind),
                                || {
                                    let call = kind.pass_on(engine.core().line_number)?;
                                    Some(PassOn {
                                        script: call.script,
                                        keys: call.keys,
                                        args: call.args,
                                    })
                                },
                                until,
                            )
                        })
                        .await
                        .map_err(|error| match error {
                            Error::Shutdown => ended_by_shutdown(engine, &*kind, Some(&pair.field)),
                            other => other,
                        })?;
                        sleeps = quiet.take().is_some_and(|quiet| joined.quiet_since(quiet));
                        waiter = Some(joined);
                    }
                }
                if sleeps {
                    match &waiter {
                        Some(waiter) => {
                            // Shutting down closes every wait entry, which ends this wait. Checked
                            // once joined, so a shutdown cannot slip in between.
                            if engine.core().ensure_open().is_err() {
                                return Err(ended_by_shutdown(engine, &*kind, Some(&pair.field)));
                            }
                            let mut until = until;
                            // A place in line is kept by one attempt a third of a place from
                            // the client, not from each of its waiting tasks: a task whose
                            // pause only kept the place waits on while another's attempt did.
                            while !pubsub::woken(waiter.wait(until).await) && keeping_place {
                                let third = engine.core().queue_place / 3;
                                let ends = deadline(started, wait);
                                match waiter.place_kept_until(third) {
                                    Some(next) if ends.is_none_or(|ends| next < ends) => {
                                        until = next;
                                    }
                                    _ => break,
                                }
                                if engine.core().ensure_open().is_err() {
                                    break;
                                }
                            }
                            if engine.core().ensure_open().is_err() {
                                return Err(ended_by_shutdown(engine, &*kind, Some(&pair.field)));
                            }
                        }
                        // A kind whose waiters back off.
                        None => tokio::select! {
                            biased;
                            _ = engine.core().shutdown.cancelled() => {
                                return Err(ended_by_shutdown(engine, &*kind, Some(&pair.field)));
                            }
                            _ = tokio::time::sleep_until(until) => {}
                        },
                    }
                }
            }
            if deadline(started, wait).is_some_and(|deadline| Instant::now() >= deadline) {
                break Box::new(gave_up(engine, &pair.name, reached, last_failure.take()));
            }
        };
        boxed(|| leave_now(queued)).await;
        *left
    }
}

/// Waits until a condition of `kind` holds, for a primitive whose waiters take nothing (a
/// count-down latch's): `check` makes the read-only call that replies nil when it holds, or the
/// longest to sleep before looking again (ms; -1 for a key without expiry, a watchdog period).
/// Waits at most `wait` (`None`: as long as it takes); `Ok(false)` when the condition did not
/// hold by then. Between looks the waiter sleeps on the kind's channel until its messages say
/// to look again, bounded as an acquire's sleeps are, so a missed message costs time, never a
/// hang.
///
/// Cancel safe: it only reads, and its place among the channel's waiters goes with it.
pub(crate) async fn wait_until(
    engine: &Engine,
    kind: &dyn Primitive,
    check: impl Fn() -> Call,
    wait: Option<Duration>,
) -> Result<bool> {
    let core = engine.core();
    core.ensure_open()?;
    check_primitive(kind)?;
    let name = kind.profile().name();
    if let Some(wait) = wait {
        durations::check_wait(name, wait)?;
    }
    let listens = channel(kind, &Field::from_static(""));
    let started = Instant::now();
    let mut waiter: Option<Waiter> = None;
    let mut errors: u8 = 0;
    let mut reached = false;
    let mut last_failure: Option<Box<Error>> = None;
    loop {
        let looked = if core.redis().is_connected() {
            check()
                .run::<Value>(&core.reads())
                .await
                .and_then(Reply::parse)
                .map_err(|error| engine.redis_error(name, None, error))
        } else {
            Err(unavailable(engine, name, Some(not_connected())))
        };
        let pause = match looked {
            Ok(Reply::Won { .. }) => return Ok(true),
            // A condition a look refuses for good will not hold.
            Ok(Reply::Refused(_)) => return Ok(false),
            Ok(Reply::Busy(ms)) => {
                reached = true;
                errors = 0;
                retry_after(ms, core.watchdog_lease)
            }
            Err(error) if error.is_transient() && wait != Some(Duration::ZERO) => {
                tracing::debug!(name, %error, "look failed; retrying");
                last_failure = Some(Box::new(error));
                let pause = error_pause(errors);
                errors = errors.saturating_add(1);
                pause
            }
            Err(error) => return Err(error),
        };
        let ends = deadline(started, wait);
        if ends.is_some_and(|ends| Instant::now() >= ends) {
            return gave_up(engine, name, reached, last_failure).map(|_| false);
        }
        let until = bounded(Instant::now() + pause, ends);
        // The shutdown ends the wait, and says so (`LockEventKind::WaitEnded`).
        let ended = || ended_by_shutdown(engine, kind, None);
        if !core.redis().is_connected() {
            reconnected(core, until).await.map_err(|_| ended())?;
            continue;
        }
        match (&waiter, &listens) {
            // Joined, and subscribed before the next look: a message after it is not missed.
            (None, Some((channel, messages))) => {
                let joined = join(core, channel.clone(), *messages, 1, false, || None, until).await;
                waiter = Some(joined.map_err(|error| match error {
                    Error::Shutdown => ended(),
                    other => other,
                })?);
                continue;
            }
            (None, None) => tokio::select! {
                biased;
                _ = core.shutdown.cancelled() => return Err(ended()),
                _ = tokio::time::sleep_until(until) => {}
            },
            (Some(waiter), _) => {
                core.ensure_open().map_err(|_| ended())?;
                pubsub::woken(waiter.wait(until).await);
                core.ensure_open().map_err(|_| ended())?;
            }
        }
    }
}

/// Whether the kind's waiting clients stand in the lock's line (see `lua/lock.lua`).
fn in_line(kind: &dyn Primitive) -> bool {
    matches!(kind.profile().class().wake, WakeRule::InLine(_))
}

/// When a wait that began at `started` ends.
fn deadline(started: Instant, wait: Option<Duration>) -> Option<Instant> {
    wait.and_then(|wait| durations::deadline(started, wait))
}

/// How long a waiter's queue place lasts, for a queueing kind: only a waiter queues (a single
/// attempt leaves no trace in a queue).
fn place(kind: &dyn Primitive, single_attempt: bool) -> Option<Duration> {
    kind.profile().place().filter(|_| !single_attempt)
}

/// A wait the client's shutdown ended: told on the event stream (the shutdown gives up every
/// wait as it gives back every hold), then the error.
#[cold]
fn ended_by_shutdown(engine: &Engine, kind: &dyn Primitive, owner: Option<&Field>) -> Error {
    let profile = kind.profile();
    let what = LockEventKind::WaitEnded;
    let events = &engine.core().report.events;
    events.emit(profile.label(), &profile.name_text(), owner, what);
    Error::Shutdown
}

/// Waits, while the client reconnects, for the connection or until `until`.
async fn reconnected(core: &Core, until: Instant) -> Result<()> {
    tokio::select! {
        biased;
        _ = core.shutdown.cancelled() => Err(Error::Shutdown),
        _ = core.redis().wait_for_connect() => Ok(()),
        _ = tokio::time::sleep_until(until) => Ok(()),
    }
}

/// The pause after `errors` connection errors in a row: doubling from [`MIN_ERROR_PAUSE`] up to
/// [`MAX_ERROR_PAUSE`].
fn error_pause(errors: u8) -> Duration {
    MIN_ERROR_PAUSE
        .saturating_mul(1u32 << errors.min(16))
        .min(MAX_ERROR_PAUSE)
}

/// The channel `field` waits on, and what its messages say, for a kind whose waiters listen.
fn channel(kind: &dyn Primitive, field: &Field) -> Option<(Channel, Messages)> {
    match kind.profile().wake() {
        Wake::Shared(channel) | Wake::InLine(channel) => Some((channel, Messages::Unlock)),
        Wake::PerWaiter(prefix) => Some((
            Channel::from(format!("{}:{field}", &*prefix)),
            Messages::Unlock,
        )),
        Wake::Counted(channel) => Some((channel, Messages::Count)),
        Wake::AtZero(channel) => Some((channel, Messages::AtZero)),
        Wake::Backoff(_) => None,
    }
}

/// Fails with `InvalidArgument` for an empty name or one the primitive cannot take, before
/// anything is sent.
pub(crate) fn check_primitive(kind: &dyn Primitive) -> Result<()> {
    check_name(kind.profile().name())?;
    match kind.profile().refusal() {
        Some(problem) => Err(Error::InvalidArgument(problem)),
        None => Ok(()),
    }
}

/// Fails with `InvalidArgument` for an empty name, before anything is sent.
pub(crate) fn check_name(name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(Error::InvalidArgument(
            "a lock name must not be empty".into(),
        ));
    }
    Ok(())
}

/// Joins the waiters of `channel` and waits (until `until` at most) for the subscription to be
/// in effect, so that the next attempt cannot miss an unlock.
async fn join(
    core: &Core,
    channel: Channel,
    messages: Messages,
    want: u32,
    listed: bool,
    pass_on: impl FnOnce() -> Option<PassOn>,
    until: Instant,
) -> Result<Waiter> {
    let joined = core.pubsub.join(&channel, messages, want, listed, pass_on);
    tokio::select! {
        biased;
        _ = core.shutdown.cancelled() => Err(Error::Shutdown),
        _ = joined.subscribed(Some(until)) => Ok(joined),
    }
}

/// How a wait that ran out ends: busy when Redis said the lock was held, else what kept
/// every attempt from an answer that counts: an outage, or replicas that never confirmed.
fn gave_up(
    engine: &Engine,
    name: &str,
    reached: bool,
    last_failure: Option<Box<Error>>,
) -> Result<Acquired> {
    if reached {
        return Ok(Acquired::Busy);
    }
    match last_failure.map(|failure| *failure) {
        Some(not_replicated @ Error::NotReplicated { .. }) => Err(not_replicated),
        last_failure => Err(unavailable(
            engine,
            name,
            last_failure.and_then(Error::into_source),
        )),
    }
}

/// No attempt reached Redis; `source` is the last failure seen, if any.
fn unavailable(engine: &Engine, name: &str, source: Option<RedisError>) -> Error {
    Error::Unavailable {
        lock: name.to_owned(),
        server: engine.core().address.to_string(),
        source,
    }
}

/// Runs the acquire script once. The outcome is always observed: if the caller stops waiting,
/// the call finishes in a task of its own ([`InFlight`]), and what it did arrives armed (the won
/// hold is released, the queue place left) unless the caller keeps it.
async fn attempt(
    engine: &Engine,
    kind: &Arc<dyn Kind>,
    pair: &Pair,
    lease: Lease,
    line: Option<InLine>,
    deadline: Option<Instant>,
    single_attempt: bool,
) -> Result<Attempt> {
    let core = engine.core();
    if !core.redis().is_connected() {
        // fred would queue the script until it reconnects, or until the command timeout.
        return Err(unavailable(
            engine,
            kind.profile().name(),
            Some(not_connected()),
        ));
    }
    let lease_arg = core.lease_arg(lease);
    let place_ms = place(&**kind, single_attempt).map(durations::millis);
    let field = &pair.field;
    let task_kind = kind.clone();
    let task_pair = pair.clone();
    let task_engine = engine.clone();
    // A single attempt waits for its reply whatever the deadline.
    let deadline = deadline
        .filter(|_| !single_attempt)
        .map(|deadline| deadline.max(Instant::now() + ATTEMPT_GRACE));
    // The owner's turn, taken before the call is handed over: an attempt cancelled or timed out
    // while it waits for it sends nothing. The owner's count of holds cannot change until the
    // reply is in.
    let turn = core.ledger.turn(pair);
    let mut turn = match deadline {
        Some(deadline) => match tokio::time::timeout_at(deadline, turn).await {
            Ok(turn) => turn,
            Err(_) => return Ok(Attempt::TimedOut(None)),
        },
        None => turn.await,
    };
    let call = InFlight::new(|| async move {
        let engine = task_engine;
        let core = engine.core();
        let task_field = &task_pair.field;
        let holds = core.holds.count(&task_pair);
        let request = turn.request();
        let sent_at = Instant::now();
        let args = AcquireArgs {
            field: task_field,
            lease: &lease_arg,
            holds,
            place_ms,
            line,
            request: &request,
        };
        let reply = Call::run_made::<Value>(&core.writer, || task_kind.acquire(&args)).await;
        turn.record(request, &reply);
        let outcome = match reply.and_then(Reply::parse) {
            Ok(Reply::Busy(pttl)) => {
                let queued = place_ms.map(|_| leave_undo(core, &task_kind, task_field));
                Ok(Outcome::Busy(pttl, queued))
            }
            Ok(Reply::Refused(said)) => Ok(Outcome::Refused(said)),
            Ok(Reply::Won { afresh, value }) => {
                if afresh {
                    core.holds.lose(&task_pair);
                }
                let (hold, value) = core
                    .holds
                    .attach(&task_pair, lease, sent_at, &task_kind, value);
                // The holder of a lock (whose waiters listen) hears of a force unlock at once.
                if matches!(
                    task_kind.profile().class().wake,
                    WakeRule::Shared(_) | WakeRule::InLine(_) | WakeRule::PerWaiter(_)
                ) {
                    core.pubsub.listen_own();
                }
                let guard = Guard::new(engine.clone(), hold, task_kind.clone(), lease);
                Ok(Outcome::Won(Win {
                    guard,
                    value,
                    contended: false,
                }))
            }
            Err(error) => Err(error),
        };
        // Only now, with the win attached (and a lost hold it replaced marked lost), may the
        // owner's next call take the turn: a release waiting for it counts the new hold. Handed
        // on before, a release of another guard of the owner (a dropped one, say) would count
        // one hold too few and set the owner's count below its guards, down to deleting the
        // lock a new guard believes held. No settle here: the acquire loop tries again with the
        // fences, or settles on exit.
        drop(turn);
        outcome
    });
    let reply = match deadline {
        Some(deadline) => {
            let mut noting = std::pin::pin!(LastRefusal::noting(call));
            match tokio::time::timeout_at(deadline, noting.as_mut()).await {
                Ok(reply) => reply,
                Err(_) => {
                    let refused = LastRefusal::take(noting.as_mut());
                    return Ok(Attempt::TimedOut(refused.map(Box::new)));
                }
            }
        }
        None => call.await,
    };
    match reply {
        Ok(Outcome::Won(win)) => Ok(Attempt::Won(win)),
        Ok(Outcome::Refused(said)) => Ok(Attempt::Refused(said)),
        Ok(Outcome::Busy(pttl, queued)) => {
            // The waiter's own place (armed since before its first attempt) covers this one.
            if let Some(queued) = queued {
                queued.keep();
            }
            Ok(Attempt::Busy {
                retry_after: retry_after(pttl, core.watchdog_lease),
            })
        }
        Err(error) => {
            let bound = deadline.map(|deadline| deadline.saturating_duration_since(Instant::now()));
            Err(engine.refused(&**kind, Some(field), bound, error).await)
        }
    }
}

/// The undo that takes `field` out of the kind's queue.
fn leave_undo(core: &Arc<Core>, kind: &Arc<dyn Kind>, field: &Field) -> UndoOnDrop {
    let leave = Leave {
        kind: kind.clone(),
        field: field.clone(),
    };
    UndoOnDrop::new(Undo::Leave(leave), core.clone())
}

/// A waiter that gives up leaves its queue place before returning, so that the next one moves up
/// at once and a later attempt of the same owner is not overtaken by its own departure.
async fn leave_now(queued: Option<Box<UndoOnDrop>>) {
    if let Some(queued) = queued {
        queued.now().await;
    }
}

/// How long to sleep at most before trying again, given the holder's PTTL: until the lock would
/// expire, or, for a key without expiry (not ours to judge), a watchdog period.
fn retry_after(pttl: i64, watchdog_lease: Duration) -> Duration {
    match u64::try_from(pttl) {
        Ok(ms) => Duration::from_millis(ms.max(1)),
        Err(_) if pttl == -1 => watchdog_lease / 3,
        Err(_) => Duration::from_millis(1),
    }
}

fn bounded(until: Instant, deadline: Option<Instant>) -> Instant {
    deadline.map_or(until, |deadline| until.min(deadline))
}

impl Backoff {
    /// The pause after `busy` busy replies: random in the upper half of `first * 2^busy`,
    /// capped (so contenders spread out and none waits longer than the cap).
    fn pause(self, busy: u32) -> Duration {
        let step = self
            .first
            .saturating_mul(2u32.saturating_pow(busy.min(31)))
            .min(self.cap);
        let half = step / 2;
        let nanos = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX);
        half + Duration::from_nanos(rand::thread_rng().gen_range(0..=nanos))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_cap_and_never_sleeps_past_it() {
        let backoff = Backoff {
            first: Duration::from_millis(1),
            cap: Duration::from_millis(128),
        };
        let mut steps = Vec::new();
        for busy in 0..12 {
            let pause = backoff.pause(busy);
            assert!(pause <= Duration::from_millis(128), "{pause:?}");
            steps.push(pause);
        }
        assert!(steps[0] >= Duration::from_micros(500) && steps[0] <= Duration::from_millis(1));
        assert!(steps[11] >= Duration::from_millis(64), "{:?}", steps[11]);
    }

    /// A waiter whose tries fail on the connection backs off: 50 ms after the first failure,
    /// doubling each time, never more than 1 s (so that an outage costs a handful of tries,
    /// not one per command timeout), and never shorter after more failures.
    #[test]
    fn the_pause_after_connection_errors_doubles_from_50_ms_to_1_s() {
        let pauses: Vec<u64> = (0..=u8::MAX)
            .map(|errors| error_pause(errors).as_millis() as u64)
            .collect();
        assert_eq!(pauses[..6], [50, 100, 200, 400, 800, 1000]);
        assert!(pauses[6..].iter().all(|&pause| pause == 1000), "{pauses:?}");
    }

    /// A busy reply's PTTL is how long a waiter sleeps at most: until the lock would expire, at
    /// least 1 ms; a key without expiry (PTTL -1, not ours to judge) is looked at again each
    /// watchdog period, a third of the lease; a key gone by the time its PTTL was read (-2) at
    /// once.
    #[test]
    fn a_busy_waiter_sleeps_until_the_holders_expiry_or_a_watchdog_period() {
        let lease = Duration::from_secs(30);
        assert_eq!(retry_after(250, lease), Duration::from_millis(250));
        assert_eq!(retry_after(0, lease), Duration::from_millis(1));
        assert_eq!(retry_after(-1, lease), Duration::from_secs(10));
        assert_eq!(retry_after(-2, lease), Duration::from_millis(1));
    }
}

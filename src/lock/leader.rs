//! [`LeaderElection`]: one leader at a time among many instances, told before it is too late,
//! with an epoch that fences its writes.

use std::fmt;
use std::future::Future;
use std::panic::{self, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use crate::engine::{FromReply, ScriptArg, Value};
use tokio::sync::{watch, RwLock};
use tokio_util::sync::CancellationToken;

use crate::client::LockClient;
use crate::engine::Tail;
use crate::engine::{
    self, AcquireArgs, Call, Class, HoldEvents, Inspect, Keys, Kind, Primitive, Profile, ProfileOf,
    ReleaseArgs, Script, WakeRule,
};
use crate::error::{Error, Result};
use crate::inspection::{Details, Leader, LockEventKind};
use crate::layout::Layout;
use crate::lock::guard::LockGuard;
use crate::lock::reentrant::LOCK_RENEW;
use crate::lock::{Lock, LockKind};
use crate::lua;
use crate::names;
use crate::owner::OwnerId;

/// Where the keys this file reads one by one stand in its `Keys`: named, so that an index
/// means one key.
const NAME: usize = 0;
const CHANNEL: usize = 1;
const FENCES: usize = 2;
const EPOCHS: usize = 3;
const CHANGES: usize = 4;

/// The prefix of an election's epoch counter, `fredlock_leader_epoch:{name}`: a key only an
/// election has, which outlives its terms.
pub(crate) const LEADER_EPOCH: &str = "fredlock_leader_epoch";
/// The prefix of the channel every change of leader is announced on.
const LEADER_CHANNEL: &str = "fredlock_leader__channel";

/// Every script of the leader election: sections of one file.
const SCRIPTS: &str = include_str!("../../lua/leader.lua");

/// Campaigns: takes a term, with a new epoch.
static LEADER_ACQUIRE: LazyLock<Script> = LazyLock::new(|| lua::tokens_script(SCRIPTS, "acquire"));
/// Resigns: gives a term back, telling candidates and observers.
static LEADER_RELEASE: LazyLock<Script> =
    LazyLock::new(|| lua::holds_script(SCRIPTS, "release", true));
/// Reads the current term.
static LEADER_READ: LazyLock<Script> =
    LazyLock::new(|| lua::section_script(SCRIPTS, "leader", false));
/// Whether the term is another than an observer saw.
static LEADER_CHANGED: LazyLock<Script> =
    LazyLock::new(|| lua::section_script(SCRIPTS, "changed", false));
/// Ends the current term whoever leads.
static LEADER_FORCE_UNLOCK: LazyLock<Script> = LazyLock::new(|| {
    let [head, body] = lua::sections(SCRIPTS, "force_unlock");
    lua::compose(&[lua::DELETE_LOCK, head, body], true)
});
/// Reads an election for an inspection.
static LEADER_INSPECT: LazyLock<Script> = LazyLock::new(|| lua::inspect_script(SCRIPTS, true));

/// The composed text of the leader election's script `name`, for tests and the benchmark.
pub(crate) fn script(name: &str) -> Option<&'static Script> {
    Some(match name {
        "acquire" => &LEADER_ACQUIRE,
        "release" => &LEADER_RELEASE,
        "leader" => &LEADER_READ,
        "changed" => &LEADER_CHANGED,
        "force_unlock" => &LEADER_FORCE_UNLOCK,
        "inspect" => &LEADER_INSPECT,
        _ => return None,
    })
}

/// The longest pause of [`LeaderElection::run`] between a lost or failed term and the next
/// campaign; each pause is random up to it, so that candidates spread out.
const MAX_PAUSE: Duration = Duration::from_millis(200);

/// A leader election: among every instance that campaigns on the same name, one leads at a
/// time, for a term with an epoch greater than every earlier term's.
///
/// A term is a hold of a fenced lock at the election's name, renewed by the client's watchdog
/// while it stands. Candidates wait for it as lock waiters do: a resignation, a dropped
/// [`Term`] or an expiry wakes them at once.
///
/// # What is guaranteed, and under which clock assumption
///
/// - **At most one term at a time on the server.** A term starts only where no other stands
///   (one script call), and lasts its lease (the watchdog lease, 30 s by default) past the
///   last renewal that reached the server.
/// - **A leader stops before another can start.** A term counts as lost here when no
///   renewal was confirmed within the renew deadline
///   ([`renew_deadline`](crate::LockClientBuilder::renew_deadline), two thirds of the lease
///   by default), counted from when the last confirmed renewal was *sent*, so before Redis set
///   its TTL. [`Term::lost`] fires then, and [`run`](Self::run) drops the work. This holds as
///   long as this process's clock and the server's run at the same rate within the margin
///   between the deadline and the lease (a third of the lease, 10 s by default), and the
///   process is not paused longer than that margin between the deadline passing and the work
///   checking it. A pause of the whole process (GC-like stalls, a suspended VM) can break it:
///   no lease-based scheme can exclude that.
/// - **The epoch fences what the clock cannot.** Every term's [`epoch`](Term::epoch) is
///   greater than every earlier term's, even after the counter is lost (it is then seeded from
///   the server clock). Write it with every change the leader makes, and have the store refuse
///   a change older than the last it saw ([`Term::eval_while_held`] does this for Redis: the
///   script runs only while the term stands).
///
/// ```no_run
/// # async fn demo(client: fredlock::LockClient) -> fredlock::Result<()> {
/// let election = client.leader_election("billing-scheduler").identity("pod-7:8080");
/// election
///     .run(|term| async move {
///         // Runs only while this instance leads; dropped when leadership is lost.
///         println!("leading in epoch {}", term.epoch());
///         tokio::time::sleep(std::time::Duration::from_secs(60)).await;
///     })
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LeaderElection {
    lock: Lock,
    /// The same keys, as its observers and readers wait on and read them.
    watch: Arc<LeaderWatch>,
    identity: Arc<str>,
}

impl LockClient {
    /// A leader election named `name` (after the client's
    /// [`key_prefix`](crate::LockClientBuilder::key_prefix)), whose candidates this client
    /// shows as [`default_identity`] unless given another with
    /// [`identity`](LeaderElection::identity). Creating it costs nothing and sends nothing.
    pub fn leader_election(&self, name: impl Into<String>) -> LeaderElection {
        LeaderElection::at(self, &self.key(name.into()), DEFAULT_IDENTITY.clone())
    }
}

/// [`default_identity`], worked out once per process: it reads the host's name.
static DEFAULT_IDENTITY: LazyLock<Arc<str>> = LazyLock::new(|| Arc::from(default_identity()));

/// The identity a candidate shows by default: this host's name and this process's id,
/// `<host>:<pid>`.
pub fn default_identity() -> String {
    format!("{}:{}", names::host_name(), std::process::id())
}

impl LeaderElection {
    /// The election at `key` (the client's prefix on it), whose candidates show `identity`:
    /// its terms' kind and its watch share one set of keys.
    fn at(client: &LockClient, key: &str, identity: Arc<str>) -> LeaderElection {
        let keys = election_keys(key);
        LeaderElection {
            watch: Arc::new(LeaderWatch {
                profile: ProfileOf::new(&LEADER_WATCH, keys.clone()),
            }),
            lock: Lock::of_kind(
                client.clone(),
                LeaderKind {
                    profile: ProfileOf::new(&LEADER_ELECTION, keys),
                    identity: identity.clone(),
                },
            ),
            identity,
        }
    }

    /// The same election, whose terms show `identity` to observers, inspections and the
    /// `fredlock` command (its host and port, a pod name: whatever tells an operator which
    /// instance leads).
    pub fn identity(self, identity: impl Into<String>) -> LeaderElection {
        LeaderElection::at(self.lock.client(), self.name(), Arc::from(identity.into()))
    }

    /// The election's Redis key: the name it was made with, after the client's key prefix.
    pub fn name(&self) -> &str {
        self.lock.name()
    }

    /// The identity this handle's terms show.
    pub fn identity_shown(&self) -> &str {
        &self.identity
    }

    /// Waits until this instance leads, and returns its term. Like [`Lock::lock`](crate::DistributedLock::lock), it waits
    /// through outages: while Redis is unreachable it keeps trying, with backoff, and wins once
    /// Redis is back and the term is free (see "Outages" in the crate docs).
    ///
    /// # Errors
    ///
    /// As [`Lock::lock`](crate::DistributedLock::lock): [`Error::Shutdown`] when the client shuts down,
    /// [`Error::InvalidArgument`] for an empty name, [`Error::WrongType`] when the name holds
    /// something else. Never [`Error::Unavailable`]: use
    /// [`try_campaign`](Self::try_campaign) for an answer within a bound.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped campaign leaves nothing behind (a term it won meanwhile is
    /// resigned at once).
    pub async fn campaign(&self) -> Result<Term> {
        self.campaign_within(None)
            .await
            .and_then(|term| term.ok_or_else(|| self.not_led()))
    }

    /// Campaigns for at most `wait`: the term, or `None` when another instance led that long.
    /// `Duration::ZERO` tries once.
    ///
    /// # Errors
    ///
    /// As [`campaign`](Self::campaign), and [`Error::Unavailable`] when the wait ended with no
    /// attempt reaching Redis (never `Ok(None)`, which means another instance leads).
    ///
    /// # Cancel safety
    ///
    /// As [`campaign`](Self::campaign).
    pub async fn try_campaign(&self, wait: Duration) -> Result<Option<Term>> {
        self.campaign_within(Some(wait)).await
    }

    async fn campaign_within(&self, wait: Option<Duration>) -> Result<Option<Term>> {
        if self.identity.trim().is_empty() {
            return Err(Error::InvalidArgument(format!(
                "the identity of leader election {:?} must not be empty: it tells observers and \
                 operators which instance leads (leave it unset for the host name and process id)",
                self.name()
            )));
        }
        // A term of its own per campaign: a new term never re-enters an old one.
        let lock = self.lock.clone().with_owner(OwnerId::unique());
        let Some(win) = lock.win(wait, engine::Lease::Watchdog).await? else {
            return Ok(None);
        };
        let epoch = win.value.as_ref().and_then(Value::as_u64);
        let guard = LockGuard::new(win.guard);
        let Some(epoch) = epoch else {
            // Won without an epoch: only a re-entry replies so, and a term's owner is new.
            return Err(Error::InvalidArgument(format!(
                "leader election {:?} was won without an epoch by owner {}",
                self.name(),
                guard.owner_field()
            )));
        };
        Ok(Some(Term::new(guard, epoch, self.identity.clone())))
    }

    fn not_led(&self) -> Error {
        Error::InvalidArgument(format!(
            "leader election {:?}: a campaign without a deadline ended without a term",
            self.name()
        ))
    }

    /// Campaigns, runs `work` with the term while this instance leads, and campaigns again,
    /// until the client shuts down.
    ///
    /// - `work`'s future runs only while leading. When leadership is lost (see the guarantee
    ///   on [`LeaderElection`]), it is dropped at once, and the next campaign starts after a
    ///   random pause of up to 200 ms.
    /// - When it returns, the term is resigned, and the next campaign starts after the same
    ///   pause, so that a waiting candidate takes over; when it panics, the term is resigned
    ///   too and the panic goes on to the caller.
    /// - Campaigns go on through outages: a campaign that fails for a reason that passes
    ///   (Redis unreachable) is tried again after a pause.
    ///
    /// # Errors
    ///
    /// Returns `Ok(())` when the client shuts down. An error that trying again cannot mend
    /// ([`Error::InvalidArgument`], [`Error::WrongType`]) ends it.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops `work`'s and resigns a term it holds (in the background,
    /// within milliseconds).
    pub async fn run<F, Fut>(&self, mut work: F) -> Result<()>
    where
        F: FnMut(Term) -> Fut,
        Fut: Future,
    {
        loop {
            let term = match self.campaign().await {
                Ok(term) => term,
                Err(Error::Shutdown) => return Ok(()),
                Err(error) if error.is_transient() => {
                    tracing::debug!(election = %self.name(), %error, "campaign failed; trying again");
                    tokio::time::sleep(jittered(MAX_PAUSE)).await;
                    continue;
                }
                Err(error) => return Err(error),
            };
            let ours = term.share();
            let lost = ours.lost.clone();
            let outcome = {
                let work = CatchUnwind(Box::pin(work(term)));
                self.lock
                    .client()
                    .engine()
                    .while_held(lost.cancelled(), work)
                    .await
            };
            // The work is gone (returned, panicked or dropped): only now is the term given up.
            let resigned = ours.resign().await;
            match outcome {
                Some(Err(panic)) => panic::resume_unwind(panic),
                Some(Ok(_)) => {
                    if let Err(error) = resigned {
                        tracing::debug!(election = %self.name(), %error, "resign after the work failed");
                    }
                    // The candidates the resignation woke go first.
                    tokio::time::sleep(jittered(MAX_PAUSE)).await;
                }
                None => {
                    tracing::warn!(election = %self.name(), epoch = ours.epoch, "leadership lost; the work was dropped");
                    tokio::time::sleep(jittered(MAX_PAUSE)).await;
                }
            }
        }
    }

    /// The current leader, by the server: `None` while no term stands.
    ///
    /// # Errors
    ///
    /// [`Error::Unavailable`] when Redis cannot be reached (within the command timeout),
    /// [`Error::Redis`] when it refuses the read, [`Error::WrongType`] when the name holds
    /// something else.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn leader(&self) -> Result<Option<Leader>> {
        self.watch.leader(self.lock.client().engine()).await
    }

    /// The current leader now and after every change (a new term, a resignation, an expiry),
    /// as a [`tokio::sync::watch::Receiver`]`<Option<`[`Leader`]`>>`: `borrow()` reads the
    /// leader now (`None` while nobody leads), `changed().await` waits for the next change.
    /// Changes are announced through pub/sub within a round trip; a missed message is made up
    /// for within the term's lease. The watch ends (`changed()` returns `Err`) when every
    /// receiver is dropped, when the client shuts down, or when Redis refuses to tell the
    /// observer (the key is no election, a permission was taken away): the refusal is logged at
    /// `warn` with the election's name, and no later change is seen.
    ///
    /// ```no_run
    /// # async fn demo(client: fredlock::LockClient) -> fredlock::Result<()> {
    /// let mut leaders = client.leader_election("scheduler").observe().await?;
    /// while leaders.changed().await.is_ok() {
    ///     match &*leaders.borrow() {
    ///         Some(leader) => println!("{} leads (term {})", leader.identity, leader.epoch),
    ///         None => println!("nobody leads"),
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`leader`](Self::leader), for the first read.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: nothing is watched until it returns.
    pub async fn observe(&self) -> Result<watch::Receiver<Option<Leader>>> {
        let now = self.leader().await?;
        let (sender, receiver) = watch::channel(now);
        let engine = self.lock.client().engine().clone();
        let watch = self.watch.clone();
        let name = self.lock.name().to_owned();
        // Why the watch ended, for the operator: the receivers only see it end.
        let refused = move |error: &Error| {
            tracing::warn!(
                election = %name, %error,
                "a leader election's observer ended: Redis refused to tell it the leader"
            );
        };
        tokio::spawn(async move {
            loop {
                let seen = sender.borrow().as_ref().map_or(0, |leader| leader.epoch);
                let changed = tokio::select! {
                    _ = sender.closed() => return,
                    changed = engine::wait_until(&engine, &*watch, || watch.changed(seen), None) => changed,
                };
                if let Err(error) = changed {
                    if matches!(error, Error::Shutdown) {
                        return;
                    }
                    if !error.is_transient() {
                        refused(&error);
                        return;
                    }
                    tokio::time::sleep(jittered(MAX_PAUSE)).await;
                    continue;
                }
                match watch.leader(&engine).await {
                    Ok(now) => {
                        sender.send_if_modified(|then| {
                            let changed = *then != now;
                            *then = now;
                            changed
                        });
                    }
                    Err(Error::Shutdown) => return,
                    Err(error) if !error.is_transient() => {
                        refused(&error);
                        return;
                    }
                    Err(_) => tokio::time::sleep(jittered(MAX_PAUSE)).await,
                }
            }
        });
        Ok(receiver)
    }

    /// Ends the current term whoever leads, and wakes the candidates and observers. For
    /// operators: the leader's client is told at once, and its term is lost (its `run` drops the
    /// work) within a round trip or two.
    ///
    /// # Errors
    ///
    /// As [`Lock::force_unlock`](crate::LockFamily::force_unlock).
    pub async fn force_unlock(&self) -> Result<bool> {
        self.lock.force_unlock().await
    }

    /// What Redis holds of the election: the leader as its holder, with its epoch as the
    /// fencing token, and the keys.
    ///
    /// # Errors
    ///
    /// As [`Lock::inspect`](crate::LockFamily::inspect).
    pub async fn inspect(&self) -> Result<crate::Inspection> {
        self.lock.inspect().await
    }
}

impl fmt::Debug for LeaderElection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaderElection")
            .field("name", &self.name())
            .field("identity", &self.identity)
            .finish()
    }
}

/// A random pause of up to `max`.
fn jittered(max: Duration) -> Duration {
    max.mul_f64(rand::random::<f64>())
}

/// The leader in the `leader` script's reply, `{identity, epoch, since, owner field}`, as the
/// inspection's tail also gives it; `None` for anything else (no term).
fn leader_of(reply: Value) -> Option<Leader> {
    let Value::Array(parts) = reply else {
        return None;
    };
    let mut parts = parts.into_iter();
    let identity = parts.next()?.as_string()?;
    let epoch = parts.next()?.as_u64()?;
    let since_ms = parts.next()?.as_u64()?;
    let owner = parts.next()?.as_string()?;
    Some(Leader {
        identity,
        epoch,
        since: SystemTime::UNIX_EPOCH + Duration::from_millis(since_ms),
        owner,
    })
}

/// One term of leadership: this instance leads while it stands. Resigned by
/// [`resign`](Self::resign) or by dropping it (in the background, within milliseconds); a
/// waiting candidate leads within a few round trips after either.
#[must_use = "dropping a term resigns it at once"]
pub struct Term {
    shared: Arc<TermShared>,
}

/// What a term and the `run` loop that made it share.
struct TermShared {
    /// The hold; taken out by the resignation.
    guard: RwLock<Option<LockGuard>>,
    /// Cancelled when the term is lost.
    lost: CancellationToken,
    epoch: u64,
    identity: Arc<str>,
    name: String,
    owner: String,
}

impl Term {
    fn new(guard: LockGuard, epoch: u64, identity: Arc<str>) -> Term {
        Term {
            shared: Arc::new(TermShared {
                lost: guard.cancellation_token(),
                name: guard.name().to_owned(),
                owner: guard.owner_field().to_owned(),
                guard: RwLock::new(Some(guard)),
                epoch,
                identity,
            }),
        }
    }

    fn share(&self) -> Arc<TermShared> {
        self.shared.clone()
    }

    /// The term's epoch: greater than every earlier term's of the election, the same for the
    /// whole term. A fencing token: send it with every write the leader makes.
    pub fn epoch(&self) -> u64 {
        self.shared.epoch
    }

    /// The identity this term shows.
    pub fn identity(&self) -> &str {
        &self.shared.identity
    }

    /// The election's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The owner field of the term's hold, `<client uuid>:<owner id>`.
    pub fn owner_field(&self) -> &str {
        &self.shared.owner
    }

    /// True once the term is known lost (its renewal failed past the renew deadline, or it was
    /// resigned).
    pub fn is_lost(&self) -> bool {
        if self.shared.lost.is_cancelled() {
            return true;
        }
        // The token is cancelled by a task that may not have run yet (in a process paused past
        // the renew deadline, until it is scheduled again): the hold itself compares its
        // deadline with the clock. A hold being taken out is being resigned.
        match self.shared.guard.try_read() {
            Ok(guard) => guard.as_ref().is_none_or(LockGuard::is_lost),
            Err(_) => true,
        }
    }

    /// Completes when the term is lost (see [`LeaderElection`] for when, and what it
    /// guarantees).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn lost(&self) {
        self.shared.lost.cancelled().await;
    }

    /// A token cancelled when the term is lost: hand it to work that should stop then.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.shared.lost.child_token()
    }

    /// Gives the term up: a waiting candidate leads within a few round trips.
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] when the term was already lost; [`Error::Unavailable`] when Redis
    /// cannot be reached (the term then ends with its lease).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future still resigns the term, in the background.
    pub async fn resign(self) -> Result<()> {
        self.shared.resign().await
    }

    /// Runs `script` only while the term stands, as [`LockGuard::eval_while_held`]: a write
    /// fenced by leadership itself.
    ///
    /// # Errors
    ///
    /// As [`LockGuard::eval_while_held`]; [`Error::NotHeld`] once resigned.
    ///
    /// # Cancel safety
    ///
    /// As [`LockGuard::eval_while_held`].
    pub async fn eval_while_held<R, K, V>(
        &self,
        script: &str,
        keys: impl IntoIterator<Item = K>,
        args: impl IntoIterator<Item = V>,
    ) -> Result<R>
    where
        R: FromReply,
        K: Into<ScriptArg>,
        V: Into<ScriptArg>,
    {
        let guard = self.shared.guard.read().await;
        match guard.as_ref() {
            Some(guard) => guard.eval_while_held(script, keys, args).await,
            None => Err(Error::NotHeld {
                lock: self.shared.name.clone(),
                owner: self.shared.owner.clone(),
            }),
        }
    }
}

impl TermShared {
    async fn resign(&self) -> Result<()> {
        let guard = self.guard.write().await.take();
        self.lost.cancel();
        match guard {
            Some(guard) => guard.unlock().await,
            None => Err(Error::NotHeld {
                lock: self.name.clone(),
                owner: self.owner.clone(),
            }),
        }
    }
}

impl fmt::Debug for Term {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Term")
            .field("name", &self.name())
            .field("epoch", &self.epoch())
            .field("identity", &self.identity())
            .field("lost", &self.is_lost())
            .finish()
    }
}

/// A future whose panic is caught and returned, so that the term can be resigned before the
/// panic goes on. Boxed: pinned without `unsafe`, at one allocation per term.
struct CatchUnwind<F>(Pin<Box<F>>);

impl<F: Future> Future for CatchUnwind<F> {
    type Output = std::thread::Result<F::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let inner = self.0.as_mut();
        match panic::catch_unwind(AssertUnwindSafe(|| inner.poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(value)) => Poll::Ready(Ok(value)),
            Err(panic) => Poll::Ready(Err(panic)),
        }
    }
}

/// The keys of the election at `key`.
fn election_keys(key: &str) -> Keys {
    Keys::new([
        key,
        &names::lock_channel(key),
        &names::fences(key),
        &names::suffixed(LEADER_EPOCH, key),
        &names::suffixed(LEADER_CHANNEL, key),
    ])
}

/// The Redis commands `lua/leader.lua`'s scripts run.
const SCRIPT_COMMANDS: &[&str] = &[
    "del", "hexists", "hget", "hgetall", "hset", "pttl", "time", "type",
];

/// What an election runs, its candidates' and its observers' (their classes'
/// [`Class::commands`]): its scripts', their preambles' and the lock family's renewal.
const COMMANDS: &[&[&str]] = &[
    SCRIPT_COMMANDS,
    crate::lock::reentrant::SCRIPT_COMMANDS,
    crate::lua::HOLDS_COMMANDS,
    crate::lua::TOKENS_COMMANDS,
    crate::lua::DELETE_LOCK_COMMANDS,
    crate::lua::INSPECT_COMMANDS,
];

static LEADER_ELECTION: Class = Class {
    renewal: Some(&LOCK_RENEW),
    events: HoldEvents {
        taken: LockEventKind::TermWon,
        lost: LockEventKind::TermLost,
    },
    ..Class::new("leader_election", WakeRule::Shared(CHANNEL), COMMANDS)
};

/// An observer's: every change wakes every observer.
static LEADER_WATCH: Class = Class::new("leader_election", WakeRule::AtZero(CHANGES), COMMANDS);

/// The election's terms, as the engine sees them.
struct LeaderKind {
    profile: ProfileOf<[u32; 0]>,
    identity: Arc<str>,
}

impl LeaderKind {
    fn keys(&self) -> &Keys {
        self.profile.keys()
    }
}

impl Primitive for LeaderKind {
    fn profile(&self) -> &Profile {
        &self.profile
    }
}

impl Kind for LeaderKind {
    fn acquire(&self, args: &AcquireArgs<'_>) -> Call {
        let mut argv = Vec::with_capacity(5);
        argv.push(args.lease.clone());
        argv.push(Value::String(args.field.clone()));
        argv.push(Value::from(args.holds as i64));
        argv.push(Value::from(&*self.identity));
        args.request.append_to(&mut argv);
        let keys = self.keys();
        Call {
            script: &LEADER_ACQUIRE,
            keys: vec![
                keys.get(NAME),
                keys.get(FENCES),
                keys.get(EPOCHS),
                keys.get(CHANGES),
            ],
            args: argv,
        }
    }

    fn release(&self, args: &ReleaseArgs<'_>) -> Call {
        let mut argv = Vec::with_capacity(4);
        argv.push(args.lease.clone());
        argv.push(Value::String(args.field.clone()));
        argv.push(Value::from(args.left as i64));
        args.request.append_to(&mut argv);
        let keys = self.keys();
        Call {
            script: &LEADER_RELEASE,
            keys: vec![
                keys.get(NAME),
                keys.get(CHANNEL),
                keys.get(FENCES),
                keys.get(CHANGES),
            ],
            args: argv,
        }
    }
}

impl Inspect for LeaderKind {
    fn inspect(&self) -> Call {
        let keys = self.keys();
        Call {
            script: &LEADER_INSPECT,
            keys: vec![keys.get(NAME), keys.get(FENCES), keys.get(EPOCHS)],
            args: Vec::new(),
        }
    }

    /// The last epoch, then the leader.
    fn details(&self, tail: &mut Tail) -> Result<Details, String> {
        Ok(Details::Leader {
            last_epoch: tail.token(),
            leader: tail.part().and_then(leader_of),
        })
    }

    /// The epoch counter never expires by design: epochs must never go backwards.
    fn leaks(&self, inspection: &crate::Inspection, _grace: Duration) -> Vec<crate::Leak> {
        crate::inspection::keys_without_expiry(inspection, &[self.keys().str(EPOCHS)])
    }
}

impl LockKind for LeaderKind {
    fn force_unlock(&self) -> Call {
        let keys = self.keys();
        Call {
            script: &LEADER_FORCE_UNLOCK,
            keys: vec![keys.get(NAME), keys.get(CHANNEL), keys.get(CHANGES)],
            args: Vec::new(),
        }
    }
}

/// An election as its observers wait on it: its changes channel.
struct LeaderWatch {
    profile: ProfileOf<[u32; 0]>,
}

impl LeaderWatch {
    /// The current leader, read on the command connection.
    async fn leader(&self, engine: &engine::Engine) -> Result<Option<Leader>> {
        let call = Call {
            script: &LEADER_READ,
            keys: vec![self.profile.keys().get(NAME)],
            args: Vec::new(),
        };
        let reply: Value = engine.read(self, call).await?;
        Ok(leader_of(reply))
    }

    /// Whether the term is another than epoch `seen` (0: none).
    fn changed(&self, seen: u64) -> Call {
        Call {
            script: &LEADER_CHANGED,
            keys: vec![self.profile.keys().get(NAME)],
            args: vec![Value::from(seen.to_string())],
        }
    }
}

impl Primitive for LeaderWatch {
    fn profile(&self) -> &Profile {
        &self.profile
    }
}

/// An election is known by its epoch counter, which outlives every term.
pub(crate) const LAYOUT: Layout = Layout {
    own_keys: &[LEADER_EPOCH],
    mode_field: false,
    strays: None,
    own_key: None,
    of_type: None,
    at_key: |client, key| Box::new(LeaderElection::at(client, &key, DEFAULT_IDENTITY.clone()).lock),
};

#[cfg(test)]
mod tests {
    use super::*;

    /// The permission check asks about exactly what its scripts run, as docs/SECURITY.md's
    /// table says.
    #[test]
    fn its_class_names_every_command_its_scripts_run() {
        crate::lua::check_commands(
            &[&LEADER_ELECTION, &LEADER_WATCH],
            &[
                SCRIPTS,
                include_str!("../../lua/lock.lua"),
                crate::lua::HOLDS,
                crate::lua::TOKENS,
                crate::lua::DELETE_LOCK,
                crate::lua::INSPECT_HEAD,
            ],
            &["leader_election"],
        );
    }
}

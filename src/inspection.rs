//! The read model: what an inspection reports of one primitive, what a leak search finds, and
//! a client's own counts ([`ClientStats`]).
//!
//! A floor module: the engine fills the head every primitive shares (its name, kind, holders,
//! queue, keys, orphans and listeners) from the first four parts of an inspect script's reply
//! (see `lua/inspect.lua`); each primitive reads the parts after them, its own tail, into its
//! [`Details`]. A primitive with state of its own adds a variant here and nothing to the engine.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use tokio::sync::broadcast;
use uuid::Uuid;

/// What Redis holds of one primitive at one moment, as [`Lock::inspect`](crate::LockFamily::inspect)
/// and [`LockClient::inspect`](crate::LockClient::inspect) read it.
///
/// Read in one script call on the master (never a replica), so its parts agree with each other.
/// Remaining times are the server's, at the moment of the read. What only some kinds have (a
/// fenced lock's last token, a semaphore's permits, a job's last tick) is in
/// [`details`](Self::details).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Inspection {
    /// The primitive's name (its main key).
    pub name: String,
    /// Its kind, as metrics and the `fredlock` command name it: `lock`, `spin_lock`,
    /// `fenced_lock`, `fair_lock`, `rw_lock` (whose metrics say `read_lock` and `write_lock`),
    /// `semaphore`, `permit_semaphore`, `count_down_latch`, `leader_election`, `job` (whose
    /// holder's owner field is its key's value, with the host that runs it), or `counter` for an integer string
    /// found by name, which is a semaphore or a latch (Redisson's layouts cannot tell them
    /// apart).
    pub kind: &'static str,
    /// Who holds it, with how many holds each. A read-write lock's writer is the owner field
    /// ending in `:write`; every other holder is a reader. A semaphore's holders are the grants
    /// of fredlock's acquisitions, each with the permits it took (Redisson's acquisitions
    /// leave no record); a permit semaphore's are its live leases, by permit id, one each.
    pub holders: Vec<Holder>,
    /// A fair lock's waiters, in the order they will be served; a read-write lock's waiting
    /// writers (who keep new readers out), by when their place ends. Empty for a kind without
    /// a queue (see [`Details::queue_word`]).
    pub queue: Vec<QueuedWaiter>,
    /// Connections subscribed to its unlock channel on the server read (each client subscribes
    /// once for all its waiting tasks); `None` for a primitive whose waiters do not subscribe to
    /// a shared channel (a spin lock, a fair lock: see [`queue`](Self::queue)).
    pub listeners: Option<u64>,
    /// Every key of the primitive that exists, with its expiry.
    pub keys: Vec<KeyState>,
    /// Keys of the primitive that no hold names any more, found by scanning: a read-write
    /// lock's read-hold timeout keys left behind (by a Java client, or a deletion of the lock).
    /// Each ends with its TTL; one without is a leak.
    pub orphans: Vec<KeyState>,
    /// What this kind has that others do not.
    pub details: Details,
}

/// What one kind of primitive reports beside the head every [`Inspection`] has. Its
/// [`Display`](fmt::Display) writes it for people, one indented line a fact (nothing for a
/// kind with nothing of its own).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Details {
    /// A kind with nothing of its own: a reentrant or spin lock.
    None,
    /// A fair lock: its waiters are in [`Inspection::queue`], in the order they will be served.
    Fair,
    /// A fenced lock.
    Fenced {
        /// The last fencing token issued (the holder's, while it is held); `None` before the
        /// first.
        last_token: Option<u64>,
    },
    /// A read-write lock.
    ReadWrite {
        /// `read` or `write`; `None` when it is free.
        mode: Option<&'static str>,
    },
    /// A semaphore.
    Semaphore {
        /// Permits available; `None` when the key is missing.
        available: Option<i64>,
    },
    /// A permit semaphore.
    PermitSemaphore {
        /// Permits available; `None` when the key is missing.
        available: Option<i64>,
        /// Leases that ended and that no call has given back yet, with how long ago each
        /// ended: their permits return at the semaphore's next acquire, release or
        /// `available_permits`.
        ended_leases: Vec<EndedLease>,
    },
    /// A count-down latch.
    Latch {
        /// Its count; `None` when the key is missing (a latch at zero or never set).
        count: Option<i64>,
    },
    /// An integer string found by name, a semaphore's or a latch's (Redisson's layouts cannot
    /// tell them apart).
    Counter {
        /// Its value: a semaphore's permits available, or a latch's count.
        value: Option<i64>,
    },
    /// A leader election.
    Leader {
        /// The last epoch (fencing token) issued, the leader's while there is one.
        last_epoch: Option<u64>,
        /// The leader, as [`LeaderElection::leader`](crate::LeaderElection::leader) tells it;
        /// `None` between terms.
        leader: Option<Leader>,
    },
    /// A job lock.
    Job {
        /// The latest scheduled tick that an instance started (see
        /// [`JobLock::run_tick`](crate::JobLock::run_tick)); `None` before the first.
        last_tick: Option<SystemTime>,
    },
}

impl Details {
    /// What a waiter in [`Inspection::queue`] is called for this kind (`queued`, or a
    /// read-write lock's `writer waiting`: its waiting writers are in no order); `None` for a
    /// kind that has no queue.
    pub fn queue_word(&self) -> Option<&'static str> {
        match self {
            Details::Fair => Some("queued"),
            Details::ReadWrite { .. } => Some("writer waiting"),
            _ => None,
        }
    }
}

impl fmt::Display for Details {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Details::Fenced {
                last_token: Some(token),
            } => writeln!(f, "  last fencing token {token}"),
            Details::Leader {
                last_epoch: Some(token),
                ..
            } => writeln!(f, "  last fencing token {token}"),
            Details::Semaphore {
                available: Some(permits),
            } => writeln!(f, "  permits available {permits}"),
            Details::PermitSemaphore {
                available,
                ended_leases,
            } => {
                if let Some(permits) = available {
                    writeln!(f, "  permits available {permits}")?;
                }
                for lease in ended_leases {
                    writeln!(
                        f,
                        "  permit {}: lease ended {} ago, not given back yet",
                        lease.permit,
                        seconds(Some(lease.ended_ago))
                    )?;
                }
                Ok(())
            }
            Details::Latch { count: Some(count) } => writeln!(f, "  count {count}"),
            Details::Counter { value: Some(value) } => writeln!(
                f,
                "  count {value} (a semaphore's permits available, or a latch's count)"
            ),
            Details::Job {
                last_tick: Some(tick),
            } => {
                let ms = tick
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map_or(0, |tick| tick.as_millis());
                match SystemTime::now().duration_since(*tick) {
                    Ok(ago) => writeln!(
                        f,
                        "  last tick {ms} (ms since the Unix epoch), {} ago",
                        seconds(Some(ago))
                    ),
                    Err(_) => writeln!(
                        f,
                        "  last tick {ms} (ms since the Unix epoch), ahead of this clock"
                    ),
                }
            }
            _ => Ok(()),
        }
    }
}

/// A duration for people: `12.3s`, `none` for no expiry.
pub(crate) fn seconds(duration: Option<Duration>) -> String {
    duration.map_or_else(
        || "none".to_owned(),
        |duration| format!("{:.1}s", duration.as_secs_f64()),
    )
}

/// A snapshot of a client's bookkeeping, for metrics and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClientStats {
    /// (lock, owner) pairs this client holds.
    pub held: usize,
    /// Lock channels with local waiters.
    pub wait_entries: usize,
    /// Channels the subscriber connection is subscribed to.
    pub subscriptions: usize,
    /// (lock, owner) pairs with a change on its way to Redis, or with a lost reply still to
    /// settle (see `docs/RELIABILITY.md`).
    pub unsettled: usize,
    /// Whether the command connection is up now (the client reconnects in the background, and
    /// a call made while it is down fails at once, unsent).
    pub connected: bool,
}

/// Who leads an election, as [`LeaderElection::leader`](crate::LeaderElection::leader),
/// [`LeaderElection::observe`](crate::LeaderElection::observe) and an inspection
/// ([`Details::Leader`]) tell.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    /// The identity the leader's election showed
    /// ([`LeaderElection::identity`](crate::LeaderElection::identity)).
    pub identity: String,
    /// Its term's epoch.
    pub epoch: u64,
    /// When its term started, by the server's clock.
    pub since: SystemTime,
    /// The owner field of its hold, `<client uuid>:<owner id>`.
    pub owner: String,
}

/// One owner's holds, in an [`Inspection`]: what every kind's holders have. What only one
/// kind knows of its holder is in that kind's [`Details`]: a fenced lock's token
/// ([`Details::Fenced`]), a leader's identity, epoch and term start ([`Details::Leader`]); a
/// job's holder's host is in its owner field, which [`JobHolder::from_value`](crate::JobHolder::from_value)
/// reads.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holder {
    /// The owner field, `<client uuid>:<owner id>` (Redisson's form).
    pub owner: String,
    /// Its hold count (reentrant holds).
    pub count: u64,
    /// How long its hold lives unless renewed; `None` when it never expires (a leak). A
    /// reader's is its longest read hold's, zero once all ended (its field lingers until the
    /// next release or the lock's expiry).
    pub remaining_lease: Option<Duration>,
    /// The name its client was given
    /// ([`LockClientBuilder::client_name`](crate::LockClientBuilder::client_name)), found among
    /// the server's connections while that client is connected; `None` for a client without a
    /// name (a Redisson client, or one that is gone).
    pub client_name: Option<String>,
}

impl Holder {
    /// The client half of the owner field: the [`LockClient::id`](crate::LockClient::id) of
    /// the holder's client, when the field has Redisson's form.
    pub fn client_id(&self) -> Option<Uuid> {
        // `<uuid>:<id>`, and a read-write lock's writer `<uuid>:<id>:write`.
        let (client, _) = self.owner.split_once(':')?;
        Uuid::parse_str(client).ok()
    }
}

/// A waiter in a fair lock's queue, in an [`Inspection`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueuedWaiter {
    /// The waiter's owner field.
    pub owner: String,
    /// How long its place lasts unless it tries again; `None` once its place has ended (a live
    /// waiter renews it every third of the place's length).
    pub place_left: Option<Duration>,
    /// How long ago its place ended, for a place that has.
    pub ended_ago: Option<Duration>,
}

/// A permit semaphore's lease that ended and was not given back yet, in its [`Details`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct EndedLease {
    /// The permit id (Redisson's 16-byte ids in hex).
    pub permit: String,
    /// How long ago the lease ended, by the server's clock.
    pub ended_ago: Duration,
}

/// One key of a primitive, in an [`Inspection`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyState {
    /// The Redis key.
    pub key: String,
    /// Its time to live; `None` when it never expires.
    pub ttl: Option<Duration>,
}

/// Something a primitive left in Redis that nothing will clean up, as
/// [`LockClient::leaks`](crate::LockClient::leaks) finds it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leak {
    /// The primitive's name.
    pub name: String,
    /// Its kind.
    pub kind: &'static str,
    /// The key at fault.
    pub key: String,
    /// Which rule found it: `no_expiry` (a key of the primitive that never expires, and is not
    /// meant to last), `stale_waiter` (a fair lock's waiter whose place ended long ago).
    pub rule: &'static str,
    /// What was found, in words.
    pub detail: String,
}

impl fmt::Display for Leak {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {:?}: {} ({}, key {:?})",
            self.kind, self.name, self.detail, self.rule, self.key
        )
    }
}

impl Inspection {
    /// Whether anyone holds it.
    pub fn is_held(&self) -> bool {
        !self.holders.is_empty()
    }

    /// Whether any key of it exists.
    pub fn exists(&self) -> bool {
        !self.keys.is_empty()
    }
}

/// A PTTL reply as an expiry: `None` for a key without one.
pub(crate) fn expiry(pttl: i64) -> Option<Duration> {
    u64::try_from(pttl).ok().map(Duration::from_millis)
}

/// The leak rule every primitive starts from: each of its keys (orphans included) that never
/// expires, but for those in `lasting` (keys meant to outlive every hold, such as a fenced
/// lock's counter).
pub(crate) fn keys_without_expiry(inspection: &Inspection, lasting: &[&str]) -> Vec<Leak> {
    inspection
        .keys
        .iter()
        .chain(&inspection.orphans)
        .filter(|key| key.ttl.is_none() && !lasting.contains(&key.key.as_str()))
        .map(|key| Leak {
            name: inspection.name.clone(),
            kind: inspection.kind,
            key: key.key.clone(),
            rule: "no_expiry",
            detail: if key.key == inspection.name && inspection.is_held() {
                format!(
                    "held by {} with no expiry: it is never freed unless force-unlocked",
                    owners(inspection)
                )
            } else {
                "a key with no expiry, which nothing deletes".to_owned()
            },
        })
        .collect()
}

fn owners(inspection: &Inspection) -> String {
    inspection
        .holders
        .iter()
        .map(|holder| holder.owner.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

// The event stream's types (`LockClient::events`): a report of what happened to holds, made
// by the engine (`engine/events.rs`).

/// How many events a receiver may fall behind before it loses the oldest.
pub const DEFAULT_EVENT_CAPACITY: usize = 1024;

pub use tokio::sync::broadcast::error::RecvError;

/// Why a hold was lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossReason {
    /// Its lease ran out (a fixed lease, not renewed by design) and its key with it.
    Expired,
    /// Its key or its owner's field was gone from Redis before its lease ended: deleted, or
    /// lost with the server's data.
    Deleted,
    /// It was force-unlocked (by an operator, the CLI or another client).
    Forced,
    /// No renewal was confirmed within the renew deadline: the client could not reach Redis.
    DeadlinePassed,
    /// The client shut down and could not give it back (no connection, or the work under it
    /// did not stop in time): it ends with its lease.
    Shutdown,
}

/// What happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockEventKind {
    /// A hold was taken (a lock, a permit, a reader's or writer's hold, a job's run).
    Acquired,
    /// The last guard of a hold is gone: released, or dropped and given back.
    Released,
    /// The watchdog's renewals ran late (its task was held up): the holds it renews were
    /// renewed later than their period.
    RenewalLate,
    /// A renewal of the hold failed; it is retried until the renew deadline.
    RenewalFailed,
    /// The hold is lost, and why.
    Lost(LossReason),
    /// A force unlock named one of this client's holds (told on the client's own channel);
    /// `Lost(Forced)` follows once the watchdog has found it gone.
    ForceUnlocked,
    /// This client became the leader (a term of a leader election began).
    TermWon,
    /// A term of this client's ended without its resigning, and why.
    TermLost(LossReason),
    /// A job lock's job ran to its end here.
    JobRan,
    /// A job lock's job was skipped here: another instance held it, or ran the tick.
    JobSkipped,
    /// A job lock's job was stopped here, its lock lost while it ran.
    JobLost,
    /// The connection to Redis failed: a renewal found no connection, or it was found
    /// reconnected before anything else noticed.
    ConnectionLost,
    /// The connection to Redis is back (a new connection, before anything is sent on it).
    ConnectionBack,
    /// A wait for a hold (a `lock()`, an `acquire`, a `campaign()`, a latch's `wait()`) ended
    /// without it: the client shut down under it.
    WaitEnded,
}

/// One event of a client's stream: what happened, to which primitive (its kind and name), for
/// which owner, on which client.
///
/// Events of one lock come in the order they happened. The connection's events name no
/// primitive: their `kind` is `"connection"` and their name the server's address.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct LockEvent {
    kind: &'static str,
    /// UTF-8, as the engine's names and fields are: shared with them, not copied.
    name: Bytes,
    owner: Option<Bytes>,
    client_name: Option<Arc<str>>,
    what: LockEventKind,
}

impl LockEvent {
    /// An event; `name` and `owner` are UTF-8 text.
    pub(crate) fn new(
        kind: &'static str,
        name: Bytes,
        owner: Option<Bytes>,
        client_name: Option<Arc<str>>,
        what: LockEventKind,
    ) -> LockEvent {
        LockEvent {
            kind,
            name,
            owner,
            client_name,
            what,
        }
    }

    /// What happened.
    pub fn what(&self) -> LockEventKind {
        self.what
    }

    /// The primitive's kind, as its metrics label it (`lock`, `fair_lock`, `leader_election`,
    /// `job`, ..), or `connection`.
    pub fn kind(&self) -> &'static str {
        self.kind
    }

    /// The primitive's name (with the client's key prefix), or the server's address for the
    /// connection's events.
    pub fn name(&self) -> &str {
        std::str::from_utf8(&self.name).unwrap_or_default()
    }

    /// The owner field of the hold (`<client uuid>:<owner id>`), where there is one.
    pub fn owner(&self) -> Option<&str> {
        let owner = self.owner.as_deref()?;
        std::str::from_utf8(owner).ok()
    }

    /// The client's name for people, if it was given one
    /// ([`client_name`](crate::LockClientBuilder::client_name)).
    pub fn client_name(&self) -> Option<&str> {
        self.client_name.as_deref()
    }
}

/// A receiver of a client's events; see [`LockClient::events`](crate::LockClient::events).
pub struct LockEvents {
    receiver: broadcast::Receiver<LockEvent>,
    /// The sender's count of receivers, one less when this is dropped.
    receivers: Arc<AtomicUsize>,
    /// Counts events lost by falling behind (the metric).
    lagged: fn(u64),
}

impl LockEvents {
    pub(crate) fn new(
        receiver: broadcast::Receiver<LockEvent>,
        receivers: Arc<AtomicUsize>,
        lagged: fn(u64),
    ) -> LockEvents {
        LockEvents {
            receiver,
            receivers,
            lagged,
        }
    }
}

impl Drop for LockEvents {
    fn drop(&mut self) {
        self.receivers.fetch_sub(1, Ordering::Relaxed);
    }
}

impl LockEvents {
    /// The next event, waiting for one.
    ///
    /// # Errors
    ///
    /// [`RecvError::Lagged`] with how many events this receiver lost, having fallen more than
    /// the capacity behind (the next call returns the oldest one kept); [`RecvError::Closed`]
    /// once the client has shut down and every event was received.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: an event is taken only when this returns it.
    pub async fn recv(&mut self) -> Result<LockEvent, RecvError> {
        let received = self.receiver.recv().await;
        if let Err(RecvError::Lagged(lost)) = &received {
            (self.lagged)(*lost);
        }
        received
    }

    /// The next event if one is waiting, without waiting; see [`recv`](Self::recv).
    ///
    /// # Errors
    ///
    /// As [`recv`](Self::recv), and [`TryRecvError::Empty`](broadcast::error::TryRecvError)
    /// when no event is waiting.
    pub fn try_recv(&mut self) -> Result<LockEvent, broadcast::error::TryRecvError> {
        let received = self.receiver.try_recv();
        if let Err(broadcast::error::TryRecvError::Lagged(lost)) = &received {
            (self.lagged)(*lost);
        }
        received
    }
}

impl std::fmt::Debug for LockEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockEvents")
            .field("waiting", &self.receiver.len())
            .finish()
    }
}

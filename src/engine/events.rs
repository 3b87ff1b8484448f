//! The client's event stream ([`LockClient::events`](crate::LockClient::events)): what the
//! engine already knows of every hold (acquired, released, renewed late or not at all, lost and
//! why, force-unlocked, a job's run, the connection), told to whoever listens.
//!
//! One `tokio::sync::broadcast` channel per client. The engine never waits for a listener: a
//! send only writes into the channel's ring, and with no receiver at all it builds nothing. A
//! receiver that falls more than the ring's capacity behind loses the oldest events, and learns
//! how many it lost ([`RecvError::Lagged`]); the loss is counted in the metric
//! `fredlock_events_lagged_total`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::broadcast;

use super::metrics::Metrics;
use super::Str;

pub use tokio::sync::broadcast::error::RecvError;

/// How many events a receiver may fall behind before it loses the oldest, unless the builder
/// says otherwise.
pub const DEFAULT_EVENT_CAPACITY: usize = 1024;

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
    name: Str,
    owner: Option<Str>,
    client_name: Option<Arc<str>>,
    what: LockEventKind,
}

impl LockEvent {
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
        &self.name
    }

    /// The owner field of the hold (`<client uuid>:<owner id>`), where there is one.
    pub fn owner(&self) -> Option<&str> {
        self.owner.as_deref()
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
    metrics: Metrics,
    /// The sender's count of receivers, one less when this is dropped.
    receivers: Arc<AtomicUsize>,
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
            self.metrics.events_lagged(*lost);
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
            self.metrics.events_lagged(*lost);
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

/// Where a client's events are sent.
pub(crate) struct Events {
    sender: broadcast::Sender<LockEvent>,
    /// How many [`LockEvents`] there are: one atomic load tells whether to build an event,
    /// where the channel's own count takes its lock.
    receivers: Arc<AtomicUsize>,
    client_name: Option<Arc<str>>,
}

impl Events {
    pub(crate) fn new(capacity: usize, client_name: Option<Arc<str>>) -> Events {
        let (sender, _) = broadcast::channel(capacity.max(1));
        Events {
            sender,
            receivers: Arc::new(AtomicUsize::new(0)),
            client_name,
        }
    }

    /// A new receiver, of the events sent from now on, counting its losses in `metrics`.
    pub(crate) fn subscribe(&self, metrics: Metrics) -> LockEvents {
        self.receivers.fetch_add(1, Ordering::Relaxed);
        LockEvents {
            receiver: self.sender.subscribe(),
            metrics,
            receivers: self.receivers.clone(),
        }
    }

    /// Whether anyone listens: with no receiver, no event is built.
    #[inline]
    pub(crate) fn listened(&self) -> bool {
        self.receivers.load(Ordering::Relaxed) > 0
    }

    /// Sends `what` of the primitive `kind` named `name`, held by `owner`, if anyone listens.
    #[inline]
    pub(crate) fn emit(
        &self,
        kind: &'static str,
        name: &Str,
        owner: Option<&Str>,
        what: LockEventKind,
    ) {
        if self.listened() {
            self.send(kind, name.clone(), owner.cloned(), what);
        }
    }

    /// Sends what became of a run of work (a job's) under the primitive `kind` named `name`.
    pub(crate) fn work(&self, kind: &'static str, name: &str, what: LockEventKind) {
        if self.listened() {
            self.send(kind, Str::from(name), None, what);
        }
    }

    /// Sends a connection event about `server`.
    pub(crate) fn connection(&self, server: &str, what: LockEventKind) {
        if self.listened() {
            self.send("connection", Str::from(server.to_owned()), None, what);
        }
    }

    #[cold]
    fn send(&self, kind: &'static str, name: Str, owner: Option<Str>, what: LockEventKind) {
        // An error only says no receiver is left: nobody to tell.
        let _ = self.sender.send(LockEvent {
            kind,
            name,
            owner,
            client_name: self.client_name.clone(),
            what,
        });
    }
}

/// Where the engine reports what happens to holds: the metrics it records and the events it
/// sends, side by side, so that one call site does both.
pub(crate) struct Report {
    pub(crate) metrics: Metrics,
    pub(crate) events: Events,
}

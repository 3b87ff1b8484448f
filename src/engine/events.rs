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

use super::metrics::{self, Metrics};
use super::Str;
use crate::inspection::{LockEvent, LockEventKind, LockEvents};

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

    /// A new receiver, of the events sent from now on, counting its losses in the metrics.
    pub(crate) fn subscribe(&self) -> LockEvents {
        self.receivers.fetch_add(1, Ordering::Relaxed);
        LockEvents::new(
            self.sender.subscribe(),
            self.receivers.clone(),
            metrics::events_lagged,
        )
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
        let owner = owner.map(|owner| owner.inner().clone());
        let client_name = self.client_name.clone();
        let _ = (self.sender).send(LockEvent::new(
            kind,
            name.inner().clone(),
            owner,
            client_name,
            what,
        ));
    }
}

/// Where the engine reports what happens to holds: the metrics it records and the events it
/// sends, side by side, so that one call site does both.
pub(crate) struct Report {
    pub(crate) metrics: Metrics,
    pub(crate) events: Events,
}

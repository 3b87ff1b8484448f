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
use std::sync::{Arc, PoisonError, RwLock};

use tokio::sync::broadcast;

use super::metrics::{self, Metrics};
use super::Str;
use crate::inspection::{LockEvent, LockEventKind, LockEvents};

/// Where a client's events are sent.
pub(crate) struct Events {
    /// Taken when the client has shut down ([`close`](Self::close)): every receiver then reads
    /// what is left and comes to the stream's end, whatever handles of the client remain.
    sender: RwLock<Option<broadcast::Sender<LockEvent>>>,
    /// How many [`LockEvents`] there are: one atomic load tells whether to build an event,
    /// where the channel's own count takes its lock.
    receivers: Arc<AtomicUsize>,
    client_name: Option<Arc<str>>,
}

impl Events {
    pub(crate) fn new(capacity: usize, client_name: Option<Arc<str>>) -> Events {
        let (sender, _) = broadcast::channel(capacity.max(1));
        Events {
            sender: RwLock::new(Some(sender)),
            receivers: Arc::new(AtomicUsize::new(0)),
            client_name,
        }
    }

    /// A new receiver, of the events sent from now on, counting its losses in the metrics.
    /// After the client shut down: a stream already at its end.
    pub(crate) fn subscribe(&self) -> LockEvents {
        let receiver = match &*self.sender.read().unwrap_or_else(PoisonError::into_inner) {
            Some(sender) => sender.subscribe(),
            None => broadcast::channel(1).1,
        };
        self.receivers.fetch_add(1, Ordering::Relaxed);
        LockEvents::new(receiver, self.receivers.clone(), metrics::events_lagged)
    }

    /// Ends the stream: the client has shut down, and nothing more will be told. Receivers read
    /// what was sent before, then come to the end.
    pub(crate) fn close(&self) {
        self.sender
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
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
        let sender = self.sender.read().unwrap_or_else(PoisonError::into_inner);
        let Some(sender) = &*sender else {
            return;
        };
        let _ = sender.send(LockEvent::new(
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

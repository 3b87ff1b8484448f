//! What a client remembers of the locks' lines of waiting clients (see `lua/lock.lua`) between
//! its calls: the locks its releases handed on to a named client a moment ago.
//!
//! A first attempt stands in line, and so respects a lock kept for a named client, only when
//! the client knows the lock to be contended: its channel is subscribed (a task of the client
//! waits, or waited within the channel's linger), or its own release named another client a
//! moment ago. Every other first attempt goes without the line's keys and arguments, as an
//! uncontended lock's does: a busy reply joins the channel, and the attempt made once joined
//! stands in line. Without this memory a client that never had to wait would take the lock
//! again after each release, one round trip ahead of the client it named, for as long as it
//! loops.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::engine::{HashState, Name};

/// How long a hand-over is remembered: the lock is kept for the named client 50 ms
/// (`HAND_OVER` in `lua/lock.lua`); remembering it longer costs one attempt with the line.
const REMEMBERED: Duration = Duration::from_secs(1);

/// Remembered hand-overs beyond which those that ended are dropped when another is noted.
const PRUNED_ABOVE: usize = 64;

/// The locks this client's releases handed on to another waiting client, with when.
#[derive(Default)]
pub(crate) struct HandedOn {
    /// Whether any is remembered: the one thing an uncontended attempt reads.
    any: AtomicBool,
    names: Mutex<HashMap<Name, Instant, HashState>>,
}

impl HandedOn {
    /// Notes that a release of `name` named another client in its line.
    pub(crate) fn note(&self, name: &Name) {
        let Ok(mut names) = self.names.lock() else {
            return;
        };
        let now = Instant::now();
        if names.len() >= PRUNED_ABOVE {
            names.retain(|_, noted| now.duration_since(*noted) < REMEMBERED);
        }
        names.insert(name.clone(), now);
        self.any.store(true, Ordering::Release);
    }

    /// Whether a release of this client handed `name` on within the last [`REMEMBERED`]; the
    /// memory is used up by asking.
    pub(crate) fn take(&self, name: &str) -> bool {
        if !self.any.load(Ordering::Acquire) {
            return false;
        }
        let Ok(mut names) = self.names.lock() else {
            return false;
        };
        let noted = names.remove(name);
        if names.is_empty() {
            self.any.store(false, Ordering::Release);
        }
        noted.is_some_and(|noted| noted.elapsed() < REMEMBERED)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_hand_over_is_remembered_once_and_for_a_while() {
        let handed = HandedOn::default();
        let name = Name::from("lock");
        assert!(!handed.take("lock"));
        handed.note(&name);
        assert!(!handed.take("other"));
        assert!(handed.take("lock"));
        assert!(!handed.take("lock"), "used up by asking");
        handed.note(&name);
        tokio::time::advance(REMEMBERED).await;
        assert!(!handed.take("lock"), "forgotten after a while");
    }

    #[tokio::test(start_paused = true)]
    async fn ended_hand_overs_are_dropped_as_more_are_noted() {
        let handed = HandedOn::default();
        for i in 0..PRUNED_ABOVE {
            handed.note(&Name::from(format!("old-{i}")));
        }
        tokio::time::advance(REMEMBERED).await;
        handed.note(&Name::from("new"));
        assert_eq!(handed.names.lock().unwrap().len(), 1);
        assert!(handed.take("new"));
    }
}

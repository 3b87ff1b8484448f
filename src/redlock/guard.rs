//! [`RedLockGuard`]: one Redlock acquisition, its validity, and the task that extends it or
//! notices its end.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::nodes::{Tally, Token, Until};
use super::RedLockState;
use crate::engine::durations::millis;
use crate::error::{Error, NodeFailureReason, Result};
use crate::family::{after_holding, DistributedGuard};

/// Keys an attempt may have written: deleted on every node unless a guard takes them over, also
/// when the attempt is dropped half-way.
pub(super) struct Written {
    shared: Arc<RedLockState>,
    token: Token,
    lease: Duration,
    armed: bool,
}

impl Written {
    pub(super) fn new(shared: Arc<RedLockState>, token: Token, lease: Duration) -> Written {
        Written {
            shared,
            token,
            lease,
            armed: true,
        }
    }

    /// Releases on every node, waiting for the replies of `wait_for` only. Cancel safe: the
    /// rest finishes in a task of its own.
    pub(super) async fn release(mut self, wait_for: &[usize]) {
        self.armed = false;
        let until = Until::Answered(wait_for);
        release_everywhere(&self.shared, &self.token, self.lease, until).await;
    }

    /// The won acquisition becomes a guard, which extends it (`fixed` false) or watches its end.
    pub(super) fn into_guard(
        mut self,
        started: Instant,
        valid_until: Instant,
        fixed: bool,
    ) -> RedLockGuard {
        self.armed = false;
        RedLockGuard::start(
            self.shared.clone(),
            self.token.clone(),
            self.lease,
            fixed,
            started,
            valid_until,
        )
    }
}

impl Drop for Written {
    fn drop(&mut self) {
        if self.armed {
            // Dropped unread, the release goes out in a task of its own.
            let timeout = self.shared.settings.node_timeout(self.lease);
            drop(self.shared.nodes.release(&self.token, timeout));
        }
    }
}

/// What a guard and its keeper task share.
struct State {
    /// Until when the lock is safe: the start of the last successful round plus its lease minus the
    /// drift allowance.
    valid_until: Mutex<Instant>,
    lost: CancellationToken,
    /// Set by the first to declare the loss, so it is logged once.
    lost_logged: AtomicBool,
}

impl State {
    fn valid_until(&self) -> Instant {
        *self
            .valid_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn lose(&self, name: &str, reason: &str) {
        if !self.lost_logged.swap(true, Ordering::AcqRel) {
            tracing::warn!(lock = %name, reason, "Redlock lost");
        }
        self.lost.cancel();
    }
}

/// One acquisition of a [`RedLock`](crate::RedLock), from [`lock`](crate::DistributedLock::lock),
/// [`lock_with_lease`](crate::DistributedLock::lock_with_lease) or [`try_lock`](crate::DistributedLock::try_lock).
///
/// - [`validity`](Self::validity) is how much longer the lock is safe by this process's clock:
///   check it before work that must not overlap another holder's.
/// - [`lost`](Self::lost) completes, and [`is_lost`](Self::is_lost) turns true, when the
///   validity ran out without an extension by a majority: a fixed lease ended, extensions failed
///   on too many nodes, the [`max_hold`](crate::RedLockBuilder::max_hold) limit was reached, or
///   a majority no longer carries this acquisition's token.
/// - [`unlock`](Self::unlock) deletes the key on every node that still carries this
///   acquisition's token; dropping the guard does the same in the background.
#[must_use = "dropping a guard releases the lock at once"]
pub struct RedLockGuard {
    shared: Arc<RedLockState>,
    token: Token,
    state: Arc<State>,
    lease: Duration,
    fixed: bool,
    acquired_at: Instant,
    /// Stops the keeper task when the guard goes; taken when unlocking begins, so `None` means
    /// the guard released already.
    stop: Option<DropGuard>,
}

impl RedLockGuard {
    fn start(
        shared: Arc<RedLockState>,
        token: Token,
        lease: Duration,
        fixed: bool,
        started: Instant,
        valid_until: Instant,
    ) -> RedLockGuard {
        let state = Arc::new(State {
            valid_until: Mutex::new(valid_until),
            lost: CancellationToken::new(),
            lost_logged: AtomicBool::new(false),
        });
        let stop = CancellationToken::new();
        let keeper = Keeper {
            shared: shared.clone(),
            token: token.clone(),
            state: state.clone(),
            lease,
            acquired_at: started,
        };
        tokio::spawn(keeper.run(fixed, stop.clone()));
        RedLockGuard {
            shared,
            token,
            state,
            lease,
            fixed,
            acquired_at: started,
            stop: Some(stop.drop_guard()),
        }
    }

    /// How much longer the lock is safe: the end of its validity minus now, by this process's
    /// clock; zero once lost. The validity of an acquisition or extension is its lease minus the
    /// time it took minus the drift allowance, counted from when its requests were sent.
    pub fn validity(&self) -> Duration {
        if self.is_lost() {
            return Duration::ZERO;
        }
        self.state
            .valid_until()
            .saturating_duration_since(Instant::now())
    }

    /// True once the lock is known lost; see [`lost`](Self::lost).
    pub fn is_lost(&self) -> bool {
        if self.state.lost.is_cancelled() {
            return true;
        }
        if Instant::now() >= self.state.valid_until() {
            // The keeper notices too, but the caller should not see a validity of zero with
            // the guard not yet lost.
            self.state.lose(&self.shared.name, "its validity ran out");
            return true;
        }
        false
    }

    /// Completes when the lock is known lost: its validity ran out without an extension by a
    /// majority, or a majority of nodes no longer carry this acquisition's token. Never
    /// completes while the validity lasts.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only watches.
    pub async fn lost(&self) {
        self.state.lost.cancelled().await
    }

    /// A token cancelled when the lock is known lost, for `select!` or for work that takes a
    /// [`CancellationToken`]. Cancelling it yourself affects only that token.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.state.lost.child_token()
    }

    /// The lock's name, its key on every node.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The random value this acquisition wrote on the nodes (40 hex digits): what proves the
    /// hold to each node, not a fencing token (it is not ordered; see [`FencedLock`] for one).
    ///
    /// [`FencedLock`]: crate::FencedLock
    pub fn value(&self) -> &str {
        self.token.as_str()
    }

    /// The fixed lease this lock was taken with, or `None` for a lock extended every third of
    /// the Redlock's [`lease`](crate::RedLockBuilder::lease).
    pub fn lease(&self) -> Option<Duration> {
        self.fixed.then_some(self.lease)
    }

    /// Deletes the key on every node that still carries this acquisition's token, waiting for
    /// each node at most the per-node timeout.
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] (with the token as the owner) when the lock was lost before the call;
    /// [`Error::Unreleased`] when fewer than a majority of nodes confirmed (by deleting the key,
    /// or by not having it), listing the nodes that did not; the lock then ends with its lease
    /// there. Nodes that failed while a majority confirmed are only logged.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the release is sent to every node on the first poll and completes without
    /// the caller; only its outcome is not reported.
    pub async fn unlock(mut self) -> Result<()> {
        // Stopped first: an extension racing the release would find the keys going and cry
        // loss.
        drop(self.stop.take());
        let was_lost = self.is_lost();
        let tally = release_everywhere(&self.shared, &self.token, self.lease, Until::All).await;
        let nodes = &self.shared.nodes;
        let confirmed = tally.done.len() + tally.missing + tally.held_elsewhere();
        if was_lost || tally.done.is_empty() && confirmed >= nodes.quorum() {
            return Err(Error::NotHeld {
                lock: self.shared.name.to_string(),
                owner: self.token.to_string(),
            });
        }
        if confirmed < nodes.quorum() {
            return Err(Error::Unreleased {
                lock: self.shared.name.to_string(),
                confirmed,
                nodes: nodes.len(),
                failures: tally
                    .failures
                    .into_iter()
                    .filter(|failure| !matches!(failure.reason, NodeFailureReason::HeldByOther))
                    .collect(),
            });
        }
        log_released(&self.shared, &tally, self.acquired_at);
        Ok(())
    }
}

/// Deletes the key wherever it carries `token`, reading replies `until` (each node answers
/// within the node timeout). Cancel safe: the requests finish without the caller.
async fn release_everywhere(
    shared: &RedLockState,
    token: &Token,
    lease: Duration,
    until: Until<'_>,
) -> Tally {
    let timeout = shared.settings.node_timeout(lease);
    let replies = shared.nodes.release(token, timeout);
    replies.tally(&shared.nodes, until).await
}

fn log_released(shared: &RedLockState, tally: &Tally, acquired_at: Instant) {
    let unconfirmed = tally.failures.len() - tally.held_elsewhere();
    if unconfirmed > 0 {
        tracing::warn!(
            lock = %shared.name, deleted = tally.done.len(), unconfirmed,
            "Redlock released on a majority; some nodes did not confirm and keep the key until its lease ends"
        );
    } else {
        tracing::debug!(
            lock = %shared.name, deleted = tally.done.len(),
            held_ms = acquired_at.elapsed().as_millis() as u64,
            "Redlock released"
        );
    }
}

impl crate::family::sealed::Sealed for RedLockGuard {}

/// `with_lock`'s work receives [`cancellation_token`](RedLockGuard::cancellation_token).
impl DistributedGuard for RedLockGuard {
    type Context = CancellationToken;

    fn context(&self) -> CancellationToken {
        self.cancellation_token()
    }

    async fn run_holding<T: Send>(
        self,
        work: impl std::future::Future<Output = T> + Send,
    ) -> Result<T> {
        let outcome = match self.shared.nodes.clients.first() {
            Some(node) => node.engine().while_held(self.lost(), work).await,
            None => None,
        };
        let (lock, owner) = (self.name().to_owned(), self.value().to_owned());
        after_holding(outcome, lock, owner, self.unlock()).await
    }
}

impl Drop for RedLockGuard {
    fn drop(&mut self) {
        if self.stop.is_none() {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (shared, token) = (self.shared.clone(), self.token.clone());
            let (lease, acquired_at) = (self.lease, self.acquired_at);
            runtime.spawn(async move {
                let tally = release_everywhere(&shared, &token, lease, Until::All).await;
                log_released(&shared, &tally, acquired_at);
            });
        }
    }
}

impl fmt::Debug for RedLockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedLockGuard")
            .field("name", &self.shared.name)
            .field("lease", &self.lease())
            .field("validity", &self.validity())
            .field("lost", &self.is_lost())
            .finish()
    }
}

/// The task behind a guard: extends a watchdog-mode lock every third of its lease, and declares
/// the guard lost when its validity runs out unextended.
struct Keeper {
    shared: Arc<RedLockState>,
    token: Token,
    state: Arc<State>,
    lease: Duration,
    acquired_at: Instant,
}

impl Keeper {
    async fn run(self, fixed: bool, stop: CancellationToken) {
        tokio::select! {
            _ = stop.cancelled() => {}
            // Declared lost by the guard itself, when it saw the validity run out first.
            _ = self.state.lost.cancelled() => {}
            reason = self.keep(fixed) => self.state.lose(&self.shared.name, reason),
        }
    }

    /// Returns why the lock was lost, when it is.
    async fn keep(&self, fixed: bool) -> &'static str {
        if fixed {
            tokio::time::sleep_until(self.state.valid_until()).await;
            return "its lease ended";
        }
        let settings = &self.shared.settings;
        let nodes = &self.shared.nodes;
        let mut next_round = self.acquired_at + self.lease / 3;
        loop {
            let valid_until = self.state.valid_until();
            tokio::time::sleep_until(next_round.min(valid_until)).await;
            if Instant::now() >= valid_until {
                let limit_reached = settings.max_hold.is_some_and(|limit| {
                    Instant::now() + settings.drift(self.lease) >= self.acquired_at + limit
                });
                return if limit_reached {
                    "its hold limit (max_hold) was reached"
                } else {
                    "it was not extended on a majority before its validity ran out"
                };
            }
            // The hold limit shortens the last extensions, so the lock ends on the nodes when
            // the limit does.
            let lease = match settings.max_hold {
                Some(limit) => (self.acquired_at + limit)
                    .saturating_duration_since(Instant::now())
                    .min(self.lease),
                None => self.lease,
            };
            if lease <= settings.drift(lease) {
                tracing::debug!(lock = %self.shared.name, "Redlock hold limit reached; no more extensions");
                tokio::time::sleep_until(valid_until).await;
                return "its hold limit (max_hold) was reached";
            }
            let timeout = settings.node_timeout(self.lease);
            let replies = nodes.extend(&self.token, millis(lease), timeout);
            let started = replies.started;
            let tally = tokio::select! {
                tally = replies.tally(nodes, Until::Quorum) => tally,
                _ = tokio::time::sleep_until(valid_until) => {
                    return "it was not extended on a majority before its validity ran out";
                }
            };
            if tally.done.len() >= nodes.quorum() && tally.decided_at < valid_until {
                let extended = started + (lease - settings.drift(lease));
                *self
                    .state
                    .valid_until
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = extended;
                tracing::trace!(lock = %self.shared.name, granted = tally.done.len(), "Redlock extended");
                next_round = started + self.lease / 3;
                continue;
            }
            if tally.missing + tally.held_elsewhere() > nodes.tolerated() {
                return "a majority of its nodes no longer carry its token";
            }
            tracing::warn!(
                lock = %self.shared.name, extended = tally.done.len(), needed = nodes.quorum(),
                failures = %failure_list(&tally),
                "Redlock extension failed on too many nodes; retrying while the validity lasts"
            );
            next_round = Instant::now() + settings.retry_delay();
        }
    }
}

fn failure_list(tally: &Tally) -> String {
    tally
        .failures
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

//! [`MultiLock`]: several locks held all or nothing.

use std::fmt;
use std::future::{poll_fn, Future};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use rand::Rng;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::engine::durations;
use crate::engine::join::join_all;
use crate::engine::Lease;
use crate::error::{Error, Result};
use crate::family::{after_holding, DistributedGuard, DistributedLock};
use crate::lock::guard::LockGuard;
use crate::lock::Lock;

/// The first pause after a failed round; it doubles with each further failed round of one
/// acquisition, up to [`MAX_BACKOFF`], and the actual pause is random below it.
const MIN_BACKOFF: Duration = Duration::from_millis(2);
const MAX_BACKOFF: Duration = Duration::from_millis(100);

/// Several [`Lock`]s (and [`FairLock`](crate::FairLock)s, converted with `Lock::from`), held
/// all or nothing: a transfer between two accounts, a job that needs two resources. The locks
/// may belong to different clients, on different Redis servers.
///
/// Acquisition never waits while holding a member, so multi-locks over overlapping sets, in
/// any order, cannot deadlock each other (nor plain lock holders):
///
/// 1. Every member is tried once, all at once.
/// 2. If all were acquired, that is the guard. Otherwise every member acquired is released, and
///    after a short random pause (which keeps two contenders from colliding again in step) the
///    acquisition waits for one member that was held — holding nothing else — and, once it has
///    it, tries every other member once, all at once. Back to 2.
///
/// Members are acquired by the current task (or their pinned owner), as with [`Lock`]; the
/// guard holds one [`LockGuard`] per member. Its acquisitions are [`DistributedLock`]'s, each
/// over every member (each renewed by the watchdog, or each for the same fixed lease):
///
/// - **Errors**: the first member error that waiting cannot cure ([`Error::WrongType`],
///   [`Error::Shutdown`], a rejected script), after every member acquired was released. With a
///   zero wait a connection failure is returned; with a longer one it is retried within the
///   wait, and returned (e.g. [`Error::Unavailable`]) if the wait ends without any member
///   having been found held.
/// - **Cancel safety**: if an acquisition's future is dropped, every member it acquired is
///   released in the background, and member attempts in flight undo themselves as a lock's
///   do. `Ok(None)` from `try_lock` leaves nothing held.
///
/// ```no_run
/// # async fn demo(client: fredlock::LockClient) -> fredlock::Result<()> {
/// use std::time::Duration;
///
/// let transfer = fredlock::MultiLock::new(vec![client.lock("acct:1"), client.lock("acct:2")])?;
/// let both = transfer.lock().await?;          // all or nothing, renewed by the watchdog
/// // ... move the money ...
/// both.unlock().await?;                       // every member, reporting every failure
///
/// if let Some(both) = transfer.try_lock(Duration::from_secs(1), None).await? {
///     both.unlock().await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct MultiLock {
    locks: Arc<[Lock]>,
}

impl MultiLock {
    /// A multi-lock over `locks`. Sends nothing.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an empty list or a lock listed twice (the same name on the
    /// same client). The same name through two clients of one Redis server cannot be told
    /// apart from two locks, but it is one lock with two owners: such a multi-lock never
    /// succeeds.
    pub fn new(locks: Vec<Lock>) -> Result<MultiLock> {
        if locks.is_empty() {
            return Err(Error::InvalidArgument(
                "a multi-lock needs at least one lock".into(),
            ));
        }
        for (index, lock) in locks.iter().enumerate() {
            let same = |other: &Lock| {
                other.name() == lock.name() && other.client().id() == lock.client().id()
            };
            if locks[..index].iter().any(same) {
                return Err(Error::InvalidArgument(format!(
                    "lock {:?} appears twice in a multi-lock",
                    lock.name()
                )));
            }
        }
        Ok(MultiLock {
            locks: locks.into(),
        })
    }

    /// The member locks, in the order given.
    pub fn locks(&self) -> &[Lock] {
        &self.locks
    }

    async fn lock_within(
        &self,
        wait: Option<Duration>,
        lease: Lease,
    ) -> Result<Option<MultiLockGuard>> {
        // One lease for every member: checked once, before any member is tried (`new` makes
        // sure there is one).
        if let Some(first) = self.locks.first() {
            lease.check(first.name())?;
            if let Some(wait) = wait {
                durations::check_wait(first.name(), wait)?;
            }
        }
        let started = Instant::now();
        let deadline = wait.and_then(|wait| durations::deadline(started, wait));
        let single_round = wait == Some(Duration::ZERO);
        let mut awaited: Option<usize> = None;
        let mut backoff = MIN_BACKOFF;
        // Whether a member was ever found held: a wait that ends without that reports the
        // outage that kept the members from answering.
        let mut contended = false;
        loop {
            let mut held: Vec<Option<LockGuard>> = self.locks.iter().map(|_| None).collect();
            if let Some(index) = awaited {
                let remaining =
                    deadline.map(|deadline| deadline.saturating_duration_since(Instant::now()));
                match self.locks[index].lock_within(remaining, lease).await? {
                    Some(guard) => held[index] = Some(guard),
                    None => return Ok(None),
                }
            }
            let round = self.try_the_rest(&mut held, lease).await;
            if round.busy.is_none() && round.error.is_none() {
                let guards = held.into_iter().flatten().collect();
                tracing::debug!(
                    locks = self.locks.len(),
                    waited_ms = started.elapsed().as_millis() as u64,
                    "multi-lock acquired"
                );
                return Ok(Some(MultiLockGuard {
                    guards,
                    cancel: CancellationToken::new(),
                }));
            }
            // Nothing is held while waiting: that is what rules out deadlock.
            release_all(held).await;
            contended |= round.busy.is_some();
            let out_of_time =
                single_round || deadline.is_some_and(|deadline| Instant::now() >= deadline);
            match round.error {
                Some(error)
                    if single_round || !error.is_transient() || (out_of_time && !contended) =>
                {
                    return Err(error)
                }
                _ => {}
            }
            if out_of_time {
                return Ok(None);
            }
            awaited = round.busy;
            let pause = rand::thread_rng().gen_range(Duration::ZERO..=backoff);
            backoff = (backoff * 2).min(MAX_BACKOFF);
            let until = Instant::now() + pause;
            tokio::time::sleep_until(deadline.map_or(until, |deadline| until.min(deadline))).await;
        }
    }

    /// Tries every member not yet in `held` once, all at once, from the current task.
    async fn try_the_rest(&self, held: &mut [Option<LockGuard>], lease: Lease) -> Round {
        let indices: Vec<usize> = (0..held.len()).filter(|&i| held[i].is_none()).collect();
        let attempts = indices
            .iter()
            .map(|&index| self.locks[index].lock_within(Some(Duration::ZERO), lease));
        let outcomes = join_all(attempts.collect()).await;
        let mut round = Round {
            busy: None,
            error: None,
        };
        for (index, outcome) in indices.into_iter().zip(outcomes) {
            match outcome {
                Ok(Some(guard)) => held[index] = Some(guard),
                Ok(None) => {
                    round.busy.get_or_insert(index);
                }
                Err(error) => {
                    // A permanent error outranks a transient one: it ends the acquisition.
                    let replace = match &round.error {
                        None => true,
                        Some(first) => first.is_transient() && !error.is_transient(),
                    };
                    if replace {
                        round.error = Some(error);
                    }
                }
            }
        }
        round
    }
}

/// What one round of single attempts found.
struct Round {
    /// The first member held by someone else.
    busy: Option<usize>,
    /// The worst member error.
    error: Option<Error>,
}

/// Gives back the members of a failed round, all at once; failures are only logged, since the
/// guards' leases (or the stopped watchdog) end those holds anyway.
async fn release_all(held: Vec<Option<LockGuard>>) {
    let unlocks = held.into_iter().flatten().map(LockGuard::unlock).collect();
    for outcome in join_all(unlocks).await {
        if let Err(error) = outcome {
            tracing::warn!(%error, "multi-lock could not give back a member of a failed round");
        }
    }
}

impl fmt::Debug for MultiLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiLock")
            .field(
                "locks",
                &self.locks.iter().map(Lock::name).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// Every member of a [`MultiLock`], held.
///
/// [`unlock`](Self::unlock) gives every member back and reports every failure; dropping the
/// guard gives them back in the background. [`lost`](Self::lost) completes when any member is
/// lost: the set is then no longer held as a whole.
#[must_use = "dropping a guard releases the locks at once"]
pub struct MultiLockGuard {
    guards: Vec<LockGuard>,
    /// What `with_lock`'s work receives: cancelled when a member is found lost while it runs.
    cancel: CancellationToken,
}

impl MultiLockGuard {
    /// One guard per member, in the order of [`MultiLock::locks`].
    pub fn guards(&self) -> &[LockGuard] {
        &self.guards
    }

    /// True once any member is known lost.
    pub fn is_lost(&self) -> bool {
        self.guards.iter().any(LockGuard::is_lost)
    }

    /// Completes when any member is known lost; see [`LockGuard::lost`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only watches.
    pub async fn lost(&self) {
        let mut watches: Vec<_> = self
            .guards
            .iter()
            .map(|guard| Box::pin(guard.lost()))
            .collect();
        poll_fn(|cx| {
            if watches
                .iter_mut()
                .any(|watch| watch.as_mut().poll(cx).is_ready())
            {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await
    }

    /// Gives every member back, all at once, whatever happens to the others.
    ///
    /// # Errors
    ///
    /// [`Error::Members`] with one error per member whose unlock failed (each names its lock);
    /// every other member was released.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: each member's release, once sent, finishes in a task of its own.
    pub async fn unlock(self) -> Result<()> {
        let unlocks = self.guards.into_iter().map(LockGuard::unlock).collect();
        let errors: Vec<Error> = join_all(unlocks)
            .await
            .into_iter()
            .filter_map(Result::err)
            .collect();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(Error::Members(errors))
        }
    }
}

impl DistributedLock for MultiLock {
    type Guard = MultiLockGuard;

    fn acquire(
        &self,
        wait: Option<Duration>,
        lease: Option<Duration>,
    ) -> impl Future<Output = Result<Option<MultiLockGuard>>> + Send {
        self.lock_within(wait, lease.map_or(Lease::Watchdog, Lease::Fixed))
    }
}

crate::family::acquisitions!(MultiLock);

impl crate::family::sealed::Sealed for MultiLockGuard {}

/// `with_lock`'s work receives a token cancelled when a member is found lost while it runs.
impl DistributedGuard for MultiLockGuard {
    type Context = CancellationToken;

    fn context(&self) -> CancellationToken {
        self.cancel.clone()
    }

    async fn run_holding<T: Send>(self, work: impl Future<Output = T> + Send) -> Result<T> {
        let outcome = {
            let lost = async {
                self.lost().await;
                self.cancel.cancel();
            };
            match self.guards.first() {
                Some(first) => first.engine().while_held(lost, work).await,
                None => None,
            }
        };
        // The member found lost names the loss; after a work that ended, the first member.
        let named = self
            .guards
            .iter()
            .find(|guard| guard.is_lost())
            .or(self.guards.first());
        let (lock, owner) = named.map_or_else(Default::default, |guard| {
            (guard.name().to_owned(), guard.owner_field().to_owned())
        });
        after_holding(outcome, lock, owner, self.unlock()).await
    }
}

impl fmt::Debug for MultiLockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiLockGuard")
            .field("guards", &self.guards)
            .finish()
    }
}

//! [`FencedLock`]: Redisson's `RFencedLock`, a reentrant lock whose every acquisition comes with
//! a fencing token that never goes backwards.

use std::fmt;
use std::ops::Deref;
use std::sync::LazyLock;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::engine::{Key, Value};

use crate::client::LockClient;
use crate::engine::Tail;
use crate::engine::{
    self, AcquireArgs, Call, Class, Inspect, Kind, Lease, Primitive, Profile, ReleaseArgs, Script,
    Win,
};
use crate::error::{Error, Result};
use crate::family::{DistributedGuard, DistributedLock};
use crate::inspection::{keys_without_expiry, Details, Inspection, Leak};
use crate::layout::Layout;
use crate::lock::guard::LockGuard;
use crate::lock::reentrant::{self, Reentrant, MORE};
use crate::lock::{Lock, LockFamily, LockKind};
use crate::lua;
use crate::names;
use crate::owner::OwnerId;

/// Takes or re-enters a fenced lock, issuing a token for every first hold.
pub(crate) static FENCED_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| lua::tokens_script(include_str!("../../lua/fenced_lock.lua"), "acquire"));

/// A reentrant distributed lock that hands out a **fencing token** with every acquisition:
/// Redisson's `RFencedLock`, with the same keys, so Java and Rust clients exclude each other and
/// share one sequence of tokens.
///
/// A lock alone cannot protect a resource from a holder that was paused (GC, swap, a stopped VM)
/// past its lease and resumes believing it still holds the lock. The token closes that gap when
/// the resource takes part: every write carries the holder's token, and the resource refuses a
/// write whose token is lower than one it has already seen (Martin Kleppmann, "How to do
/// distributed locking"). Tokens only ever grow, across holders and clients:
///
/// - Each acquisition's [`FencedGuard::token`] is one more than the last token issued on this
///   lock (the counter `redisson_lock_token:{name}`, a string without expiry, incremented in the
///   same script that grants the hold).
/// - A re-entry by the owner that holds the lock gets its outer hold's token, as Hazelcast's
///   `FencedLock` does. Redisson increments the counter on re-entry too, so its inner holds see
///   new tokens; both orders only ever grow.
/// - If the counter is lost (a restart without persistence, an eviction, a `DEL`), the next
///   acquisition seeds it from the server's clock in microseconds before incrementing, so its
///   token still exceeds every earlier one, **as long as the server's clock does not step back**
///   and fewer than a million tokens per second were issued since the counter was first seeded.
///   A Redis failover to a replica that had not yet received the last increments is such a loss
///   only if the counter is missing there; a counter present but behind can repeat tokens, as
///   any asynchronously replicated counter can.
///
/// Where the protected data lives:
///
/// - In Redis: [`LockGuard::eval_while_held`] runs a script only while the hold stands, in one
///   atomic step (no token needed, the server checks the hold itself).
/// - In SQL: a conditional write, `UPDATE ... SET data = $1, last_token = $2 WHERE id = $3 AND
///   last_token < $2`; zero rows updated means a newer holder wrote first. See
///   `examples/fencing.rs`.
///
/// ```no_run
/// # async fn demo(client: fredlock::LockClient) -> fredlock::Result<()> {
///
/// let lock = client.fenced_lock("invoices:7");
/// let guard = lock.lock().await?;
/// let token = guard.token();           // send it with every write the lock protects
/// // UPDATE invoices SET .., last_token = $token WHERE id = 7 AND last_token < $token
/// guard.unlock().await?;
///
/// // with_lock hands the work the token beside the cancellation token.
/// # async fn write_with_token(token: u64) {}
/// lock.with_lock(|(token, _lost)| async move { write_with_token(token).await })
///     .await?;
/// # Ok(()) }
/// ```
///
/// Its acquisitions are [`DistributedLock`]'s, each returning a [`FencedGuard`]. Beside their
/// errors, each reports [`Error::WrongType`] when the token counter holds something other than
/// a whole number (nothing is written then). A cancelled acquisition gives up its token: a
/// token issued to an acquisition whose future was dropped is never handed to anyone (the hold
/// is given back); the next acquisition gets a greater one.
#[derive(Clone)]
pub struct FencedLock {
    lock: Lock,
}

/// The fenced lock's kind: the reentrant lock with its own acquire script, which takes the
/// counter's key too.
struct Fenced {
    /// The reentrant lock's keys, and the counter's.
    lock: Reentrant,
}

/// What a fenced lock runs (its class's [`Class::commands`]): the lock family's, and its
/// tokens' (its own file runs nothing of its own).
const COMMANDS: &[&[&str]] = &[
    reentrant::SCRIPT_COMMANDS,
    crate::lua::TOKENS_COMMANDS,
    crate::lua::HOLDS_COMMANDS,
    crate::lua::DELETE_LOCK_COMMANDS,
    crate::lua::INSPECT_COMMANDS,
    crate::lock::guard::WHILE_HELD_COMMANDS,
];

static FENCED_LOCK: Class = reentrant::listening("fenced_lock", COMMANDS);

impl Fenced {
    fn counter(&self) -> Key {
        self.lock.profile().keys().get(MORE)
    }
}

impl Primitive for Fenced {
    fn profile(&self) -> &Profile {
        self.lock.profile()
    }
}

impl Kind for Fenced {
    fn acquire(&self, args: &AcquireArgs<'_>) -> Call {
        let mut call = self.lock.acquire_call(&FENCED_ACQUIRE, args);
        call.keys.push(self.counter());
        call
    }
    fn release(&self, args: &ReleaseArgs<'_>) -> Call {
        self.lock.release(args)
    }
}

impl Inspect for Fenced {
    fn inspect(&self) -> Call {
        let mut call = self.lock.inspect();
        call.keys.push(self.counter());
        call
    }
    fn details(&self, tail: &mut Tail) -> Result<Details, String> {
        Ok(Details::Fenced {
            last_token: tail.token(),
        })
    }
    /// The token counter never expires by design: tokens must never go backwards.
    fn leaks(&self, inspection: &Inspection, _grace: Duration) -> Vec<Leak> {
        keys_without_expiry(inspection, &[self.profile().keys().str(MORE)])
    }
}

impl LockKind for Fenced {
    fn force_unlock(&self) -> Call {
        self.lock.force_unlock()
    }
}

impl LockClient {
    /// A fenced lock named `name`: reentrant like [`lock`](Self::lock), and every acquisition
    /// comes with a fencing token. Creating it costs nothing and sends nothing.
    pub fn fenced_lock(&self, name: impl Into<String>) -> FencedLock {
        FencedLock {
            lock: fenced_at(self, self.key(name.into())),
        }
    }
}

/// The fenced lock at `key` (the name with the client's prefix on it).
fn fenced_at(client: &LockClient, key: String) -> Lock {
    let fenced = Fenced {
        lock: Reentrant::with_key(&FENCED_LOCK, &key, &names::fencing_token(&key)),
    };
    Lock::of_kind(client.clone(), fenced)
}

/// A fenced lock is known by its token counter, which outlives every hold.
pub(crate) const LAYOUT: Layout = Layout {
    own_keys: &[names::FENCING_TOKEN],
    mode_field: false,
    strays: None,
    own_key: None,
    of_type: None,
    at_key: |client, key| Box::new(fenced_at(client, key)),
};

impl FencedLock {
    /// The same lock, owned by `owner` instead of the current task; see [`Lock::with_owner`].
    pub fn with_owner(self, owner: OwnerId) -> FencedLock {
        FencedLock {
            lock: self.lock.with_owner(owner),
        }
    }

    /// The last token issued on this lock, `None` before the first (or after the counter was
    /// lost). It only reads: the next acquisition gets a greater one. A hold's own token is
    /// [`FencedGuard::token`].
    ///
    /// # Errors
    ///
    /// [`Error::WrongType`] when the counter holds something other than a whole number,
    /// [`Error::InvalidArgument`] for an empty name.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn last_token(&self) -> Result<Option<u64>> {
        let client = self.lock.client();
        client.engine().core().ensure_open()?;
        engine::check_name(self.name())?;
        let counter = names::fencing_token(self.name());
        let value: Value = client
            .engine()
            .core()
            .redis()
            .get(counter.as_str())
            .await
            .map_err(|error| client.engine().redis_error(self.name(), None, error))?;
        match value {
            Value::Null => Ok(None),
            other => other.as_u64().map(Some).ok_or_else(|| Error::WrongType {
                lock: self.name().to_owned(),
                key: counter,
            }),
        }
    }

    async fn lock_within(
        &self,
        wait: Option<Duration>,
        lease: Lease,
    ) -> Result<Option<FencedGuard>> {
        let Some(Win { guard, value, .. }) = self.lock.win(wait, lease).await? else {
            return Ok(None);
        };
        let guard = LockGuard::new(guard);
        match value.and_then(|value| value.as_u64()) {
            Some(token) => Ok(Some(FencedGuard { guard, token })),
            // A hold taken through a plain `Lock` of the same name and owner, re-entered here:
            // no acquisition of it issued a token. The guard is given back on drop.
            None => Err(Error::InvalidArgument(format!(
                "fenced lock {:?} was re-entered by owner {}, which holds it through another \
                 kind of lock, so it has no fencing token; take a name with one kind only",
                self.name(),
                guard.owner_field()
            ))),
        }
    }
}

impl DistributedLock for FencedLock {
    type Guard = FencedGuard;

    fn acquire(
        &self,
        wait: Option<Duration>,
        lease: Option<Duration>,
    ) -> impl std::future::Future<Output = Result<Option<FencedGuard>>> + Send {
        self.lock_within(wait, lease.map_or(Lease::Watchdog, Lease::Fixed))
    }
}

impl LockFamily for FencedLock {
    fn as_lock(&self) -> &Lock {
        &self.lock
    }
}

crate::family::acquisitions!(FencedLock);
crate::lock::family_reads!(FencedLock, with name);

impl fmt::Debug for FencedLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("FencedLock").field(&self.lock).finish()
    }
}

/// One hold of a [`FencedLock`], with its fencing token: everything a [`LockGuard`] has (it
/// dereferences to one), plus [`token`](Self::token).
#[must_use = "dropping a guard releases the lock at once"]
pub struct FencedGuard {
    guard: LockGuard,
    token: u64,
}

impl FencedGuard {
    /// The fencing token of this hold: greater than every token issued before it on this lock
    /// (a re-entry shares its outer hold's). Send it with every write the lock protects.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// Gives this hold back; see [`LockGuard::unlock`].
    ///
    /// # Errors
    ///
    /// As [`LockGuard::unlock`].
    ///
    /// # Cancel safety
    ///
    /// As [`LockGuard::unlock`].
    pub async fn unlock(self) -> Result<()> {
        self.guard.unlock().await
    }

    /// The plain guard, for code that takes a [`LockGuard`]; the token is dropped.
    pub fn into_lock_guard(self) -> LockGuard {
        self.guard
    }
}

impl crate::family::sealed::Sealed for FencedGuard {}

/// `with_lock`'s work receives `(fencing token, cancellation token)`.
impl DistributedGuard for FencedGuard {
    type Context = (u64, CancellationToken);

    fn context(&self) -> (u64, CancellationToken) {
        (self.token, self.guard.cancellation_token())
    }

    fn run_holding<T: Send>(
        self,
        work: impl std::future::Future<Output = T> + Send,
    ) -> impl std::future::Future<Output = Result<T>> + Send {
        self.guard.run_holding(work)
    }
}

impl Deref for FencedGuard {
    type Target = LockGuard;

    fn deref(&self) -> &LockGuard {
        &self.guard
    }
}

impl fmt::Debug for FencedGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FencedGuard")
            .field("guard", &self.guard)
            .field("token", &self.token)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The permission check asks about exactly what its scripts run, as docs/SECURITY.md's
    /// table says.
    #[test]
    fn its_class_names_every_command_its_scripts_run() {
        crate::lua::check_commands(
            &[&FENCED_LOCK],
            &[
                include_str!("../../lua/lock.lua"),
                include_str!("../../lua/fenced_lock.lua"),
                crate::lua::HOLDS,
                crate::lua::TOKENS,
                crate::lua::DELETE_LOCK,
                crate::lua::INSPECT_HEAD,
                crate::lock::guard::WHILE_HELD,
            ],
            &["fenced_lock"],
        );
    }
}

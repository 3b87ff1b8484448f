//! [`LockGuard`]: proof of one hold, released by [`LockGuard::unlock`] or by dropping it.

use std::fmt;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use crate::engine::{key_of, reply_of, value_of, FromReply, Key, ScriptArg, Value};
use dashmap::DashMap;
use tokio_util::sync::CancellationToken;

use crate::engine::{Engine, Guard, Script};
use crate::error::{Error, RedisError, Result};
use crate::family::{after_holding, DistributedGuard};
use crate::lua;

/// The wrapper `eval_while_held` puts around a caller's script: before and after the marker.
pub(crate) const WHILE_HELD: &str = include_str!("../../lua/while_held.lua");
/// The Redis commands [`WHILE_HELD`] runs, for the classes of the locks whose guard has
/// `while_held` ([`Class::commands`](crate::engine::Class)).
pub(crate) const WHILE_HELD_COMMANDS: &[&str] = &["hexists"];
const SCRIPT_MARKER: &str = "--@script\n";

/// Callers' scripts as wrapped and hashed, so that a script written through many times is
/// composed and hashed once. An application has a handful; a cache that outgrows this is
/// emptied rather than kept.
static WRAPPED: LazyLock<DashMap<Box<str>, Arc<Script>>> = LazyLock::new(DashMap::new);
const MOST_WRAPPED: usize = 256;

/// `script` inside the wrapper that runs it only while the hold stands.
fn wrapped(script: &str) -> Arc<Script> {
    if let Some(wrapped) = WRAPPED.get(script) {
        return wrapped.clone();
    }
    let (before, after) = WHILE_HELD
        .split_once(SCRIPT_MARKER)
        .unwrap_or((WHILE_HELD, ""));
    let wrapped = Arc::new(lua::compose(&[before, script, "\n", after], false));
    if WRAPPED.len() >= MOST_WRAPPED {
        WRAPPED.clear();
    }
    WRAPPED.insert(script.into(), wrapped.clone());
    wrapped
}

/// One hold of a lock, taken by [`Lock::lock`](crate::DistributedLock::lock),
/// [`FairLock::lock`](crate::DistributedLock::lock), [`SpinLock::lock`](crate::DistributedLock::lock) and
/// friends.
///
/// - [`unlock`](Self::unlock) gives the hold back, and fails with
///   [`Error::NotHeld`](crate::Error::NotHeld) when it was no longer held.
/// - Dropping the guard gives it back too, in the background, within milliseconds.
/// - The guard is `Send`: it may move to another task and be unlocked there; it remembers the
///   owner that acquired it.
/// - [`lost`](Self::lost) completes, and [`is_lost`](Self::is_lost) turns true, when the lock is
///   known to be gone: its field vanished from Redis, no renewal got through within the renew
///   deadline (before the lease could end), the fixed lease ended, or the client shut down.
///   Work protected by the lock should stop then:
///
/// ```no_run
/// # async fn demo(lock: fredlock::Lock) -> fredlock::Result<()> {
/// # async fn long_job() {}
///
/// let guard = lock.lock().await?;
/// tokio::select! {
///     _ = long_job() => guard.unlock().await?,
///     _ = guard.lost() => eprintln!("lock {} lost; job abandoned", guard.name()),
/// }
/// # Ok(()) }
/// ```
#[must_use = "dropping a guard releases the lock at once"]
pub struct LockGuard {
    guard: Guard,
}

impl LockGuard {
    pub(crate) fn new(guard: Guard) -> LockGuard {
        LockGuard { guard }
    }

    /// Gives this hold back. The last hold of the owner deletes the lock and wakes the waiters
    /// (of a fair lock, the first waiter only).
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] when the lock was lost before the call (the owner's field is gone). A
    /// release whose reply is lost is sent again (it takes effect once however often it is
    /// sent) for up to the client's command timeout; [`Error::Redis`] when no answer came by
    /// then. The release then goes on in the background until Redis answers, and the watchdog
    /// stops renewing the hold before this returns, so at worst the lock ends with its lease.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: once sent, a release dropped mid-way finishes in a task of its own; only its
    /// outcome is not reported.
    pub async fn unlock(self) -> Result<()> {
        self.guard.unlock().await
    }

    /// True once the lock is known lost; see [`lost`](Self::lost).
    pub fn is_lost(&self) -> bool {
        self.guard.is_lost()
    }

    /// Completes when the lock is known lost: its owner's field vanished from Redis (deleted,
    /// expired, or taken over after a failover), no renewal got through within the client's
    /// [`renew_deadline`](crate::LockClientBuilder::renew_deadline) (which passes while Redis still
    /// has the lock for a third of the watchdog lease, by default), a fixed lease ended, or the
    /// client shut down. A fixed lease counts as ended 2 ms and 1 % of it before its end as
    /// reckoned from when the acquire was sent (Redlock's clock-drift allowance), so that the
    /// holder learns of it before Redis can give the lock to another, unless this process is
    /// stalled for longer than that. A renewal that gets through after that does not undo the
    /// report. Never completes while the hold is safe.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only watches.
    pub async fn lost(&self) {
        self.guard.lost().await
    }

    /// A token cancelled when the lock is known lost, for `select!` or for handing to work that
    /// takes a [`CancellationToken`]. Cancelling it yourself affects only that token.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.guard.cancellation_token()
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.guard.name()
    }

    /// The hash field of the owner of this hold, `<client uuid>:<owner id>`.
    pub fn owner_field(&self) -> &str {
        self.guard.owner_field()
    }

    /// The fixed lease this hold was taken with, or `None` for a watchdog-renewed hold.
    pub fn lease(&self) -> Option<Duration> {
        self.guard.lease()
    }

    /// Runs the Lua `script` atomically, only while Redis still records this hold: the storage
    /// side of a lock for data kept in Redis (etcd's `IsOwner` in a transaction). Unlike a check
    /// followed by a write, nothing can come between the two: a holder paused past its lease,
    /// whose lock another owner has taken since, writes nothing.
    ///
    /// `script` is an ordinary `EVAL` body that sees its own `keys` as `KEYS` and `args` as
    /// `ARGV`; its reply is returned. It runs as the body of a function, so it ends with
    /// `return` as a script does, and may not declare globals.
    ///
    /// Keys and arguments are anything that makes a [`ScriptArg`] (text, bytes, a number); the
    /// reply is read as any [`FromReply`] type (a number, a string, a `bool`, an `Option`, a
    /// `Vec`, a map, or the [`Reply`](crate::Reply) itself). They are the crate's own types,
    /// whichever client library is compiled in.
    ///
    /// ```no_run
    /// # async fn demo(lock: fredlock::Lock) -> fredlock::Result<()> {
    ///
    /// let guard = lock.lock().await?;
    /// let written: i64 = guard
    ///     .eval_while_held("return redis.call('set', KEYS[1], ARGV[1]) and 1", ["{orders:1001}:state"], ["paid"])
    ///     .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`], having run nothing, when the hold is gone (on the server, or known
    /// lost here). On a cluster, [`Error::InvalidArgument`] before anything is sent when a key
    /// is not in the lock's hash slot: give the keys the lock's hash tag (`{name}`), as in the
    /// example. [`Error::Redis`] when the script fails (a `WRONGTYPE` of the caller's keys
    /// included), when its reply is not an `R` (the message shows the reply), or when Redis
    /// cannot be reached.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe in the sense that the script may run although the future was dropped
    /// before reporting it; it still runs only while the hold stands.
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
        if self.is_lost() {
            return Err(self.guard.not_held());
        }
        let engine = self.guard.engine();
        let redis = engine.core().redis();
        let mut keys: Vec<Key> = keys.into_iter().map(|key| key_of(key.into())).collect();
        if redis.is_clustered() {
            let hash_slot = crate::engine::key_slot(self.name().as_bytes());
            if let Some(key) = keys
                .iter()
                .find(|key| crate::engine::key_slot(key.as_bytes()) != hash_slot)
            {
                return Err(Error::InvalidArgument(format!(
                    "eval_while_held on lock {:?}: key {:?} is in another cluster hash slot \
                     than the lock, so one script cannot touch both; give it the lock's hash \
                     tag",
                    self.name(),
                    String::from_utf8_lossy(key.as_bytes())
                )));
            }
        }
        keys.push(Key::from(self.name()));
        let mut args: Vec<Value> = args.into_iter().map(|arg| value_of(arg.into())).collect();
        args.push(Value::from(self.owner_field()));
        let reply: Value = match wrapped(script)
            .call(&engine.core().writer, keys, args)
            .await
        {
            Ok(reply) => reply,
            Err(error) if error.details().starts_with("NOTHELD") => {
                return Err(self.guard.not_held())
            }
            Err(error) => return Err(self.script_error(error)),
        };
        let reply = reply_of(reply);
        R::from_reply(reply.clone()).ok_or_else(|| {
            self.script_error(RedisError::unreadable(format!(
                "the script's reply {reply:?} is not a {}",
                std::any::type_name::<R>()
            )))
        })
    }

    /// An error of the caller's script (or of converting its reply), naming the lock, the owner
    /// and the server.
    fn script_error(&self, source: RedisError) -> Error {
        let server = &self.guard.engine().core().address;
        Error::from_script(server, self.name(), Some(self.owner_field()), source)
    }
}

impl LockGuard {
    /// The engine of the client this hold is on.
    pub(crate) fn engine(&self) -> &Engine {
        self.guard.engine()
    }
}

impl crate::family::sealed::Sealed for LockGuard {}

/// `with_lock`'s work receives the guard's cancellation token.
impl DistributedGuard for LockGuard {
    type Context = CancellationToken;

    fn context(&self) -> CancellationToken {
        LockGuard::cancellation_token(self)
    }

    async fn run_holding<T: Send>(
        self,
        work: impl std::future::Future<Output = T> + Send,
    ) -> Result<T> {
        let outcome = self.guard.engine().while_held(self.lost(), work).await;
        let (lock, owner) = (self.name().to_owned(), self.owner_field().to_owned());
        after_holding(outcome, lock, owner, self.unlock()).await
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("name", &self.name())
            .field("owner", &self.owner_field())
            .field("lease", &self.lease())
            .field("lost", &self.is_lost())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn while_held_names_the_commands_it_runs() {
        assert_eq!(crate::lua::commands_run(&[WHILE_HELD]), WHILE_HELD_COMMANDS);
    }
}

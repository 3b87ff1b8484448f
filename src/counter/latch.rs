//! [`CountDownLatch`]: Redisson's `RCountDownLatch`, for async Rust: instances wait until a
//! count set once reaches zero.

use std::fmt;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use crate::engine::{FromValue, Value};

use crate::client::LockClient;
use crate::counter::read_counter;
use crate::engine::Tail;
use crate::engine::{
    self, Call, Class, Inspect, Keys, Primitive, Profile, ProfileOf, Refusal, Script, WakeRule,
};
use crate::error::{Error, Result};
use crate::inspection::{keys_without_expiry, Details, Inspection, Leak};
use crate::layout::{Counted, Layout};
use crate::lua::{counter_script, inspect_script};
use crate::names;

/// Where the keys this file reads one by one stand in its `Keys` (scripts take them in order,
/// with `Keys::first`): named, so that an index means one key.
const NAME: usize = 0;
const CHANNEL: usize = 1;

/// Every script of the latch, as sections of one file.
const SCRIPTS: &str = include_str!("../../lua/latch.lua");

/// Sets the count of a latch that has none.
static LATCH_TRY_SET_COUNT: LazyLock<Script> =
    LazyLock::new(|| counter_script(SCRIPTS, "try_set_count", false, false));
/// Counts down by one, announcing zero.
pub(crate) static LATCH_COUNT_DOWN: LazyLock<Script> =
    LazyLock::new(|| counter_script(SCRIPTS, "count_down", false, true));
/// Deletes the latch, releasing its waiters.
static LATCH_DELETE: LazyLock<Script> =
    LazyLock::new(|| counter_script(SCRIPTS, "delete", false, true));
/// Whether the count is zero, for a waiter.
static LATCH_CHECK: LazyLock<Script> =
    LazyLock::new(|| counter_script(SCRIPTS, "check", false, false));
/// Reads the latch for an inspection.
static LATCH_INSPECT: LazyLock<Script> = LazyLock::new(|| inspect_script(SCRIPTS, true));

/// A distributed count-down latch, Redisson's `RCountDownLatch`: instances wait until a set of
/// others has finished (counted down), across every client on the same Redis, Java Redisson
/// clients included.
///
/// ```no_run
/// # async fn demo(client: fredlock::LockClient) -> fredlock::Result<()> {
/// use std::time::Duration;
///
/// let phase = client.count_down_latch("phase-1");
/// phase.try_set_count(5).await?;                  // only if not set yet
/// // ... each of 5 workers, when done:
/// phase.count_down().await?;
/// // ... whoever waits for all of them:
/// phase.wait().await?;
/// let done = phase.try_wait(Duration::from_secs(10)).await?; // false if still counting
/// # Ok(()) }
/// ```
///
/// The count is an integer string at the latch's name; it is deleted when the count reaches
/// zero, and a missing latch counts zero, so [`wait`](Self::wait) on a latch never set (or done
/// already) returns at once. [`try_set_count`](Self::try_set_count) sets a count only where
/// there is none: a latch is used once, then set again.
///
/// # Wake-ups
///
/// Reaching zero publishes `0` on `redisson_countdownlatch__channel__{name}` (Redisson's
/// channel and message), which wakes every waiter at once; a new count publishes `1`, which
/// wakes nobody. A waiter that misses the message looks again after a third of the watchdog
/// timeout at most.
///
/// The name must keep the channel in the latch's cluster slot, which Redisson's channel (braced
/// whatever the name) does only for a name without braces: names with braces are refused with
/// [`Error::InvalidArgument`].
#[derive(Clone)]
pub struct CountDownLatch {
    client: LockClient,
    /// Its keys: the count (the name) and the channel.
    profile: ProfileOf<[u32; 0]>,
}

impl LockClient {
    /// A count-down latch named `name` (after the client's
    /// [`key_prefix`](crate::LockClientBuilder::key_prefix)). Creating it costs nothing and
    /// sends nothing; a name it cannot take (empty, or with braces) is reported by the first
    /// operation.
    pub fn count_down_latch(&self, name: impl Into<String>) -> CountDownLatch {
        CountDownLatch::at(self, self.key(name.into()))
    }
}

impl CountDownLatch {
    /// The latch at `key`, the client's prefix already on it.
    pub(crate) fn at(client: &LockClient, key: String) -> CountDownLatch {
        CountDownLatch {
            client: client.clone(),
            profile: ProfileOf::new(&LATCH, Keys::new([&key, &names::latch_channel(&key)])),
        }
    }

    /// The latch's Redis key.
    pub fn name(&self) -> &str {
        self.profile.name()
    }

    /// Sets the count to `count` if the latch has none (its key does not exist: never set, or
    /// done); `true` when it did. `false` on a live latch, whose count is left as it is.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a count of 0 or a name it cannot take, [`Error::Redis`]
    /// when Redis cannot be asked.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe in the sense that the count may be set although the future was dropped
    /// before reporting it.
    pub async fn try_set_count(&self, count: u64) -> Result<bool> {
        let count = i64::try_from(count)
            .ok()
            .filter(|count| *count > 0)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "count-down latch {:?}: a count must be from 1 to {} (a latch at zero has \
                     no key), not {count}",
                    self.name(),
                    i64::MAX
                ))
            })?;
        let set: i64 = self
            .run(&LATCH_TRY_SET_COUNT, vec![Value::from(count)])
            .await?;
        Ok(set == 1)
    }

    /// Counts down by one; the count reaching zero deletes the latch and releases every waiter.
    /// Returns the count left. On a latch at zero (or missing) it changes nothing.
    ///
    /// # Errors
    ///
    /// [`Error::WrongType`] when the key is not an integer string, and as
    /// [`try_set_count`](Self::try_set_count).
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe in the sense that the count may go down although the future was dropped
    /// before reporting it.
    pub async fn count_down(&self) -> Result<u64> {
        let left: i64 = self.run(&LATCH_COUNT_DOWN, Vec::new()).await?;
        Ok(u64::try_from(left).unwrap_or(0))
    }

    /// The count now; 0 for a latch at zero (or never set).
    ///
    /// # Errors
    ///
    /// [`Error::WrongType`] when the key is not an integer string.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn count(&self) -> Result<u64> {
        self.check()?;
        Ok(u64::try_from(read_counter(&self.client, self.name()).await?).unwrap_or(0))
    }

    /// Waits until the count is zero, as long as it takes; returns at once on a latch at zero
    /// or never set.
    ///
    /// # Errors
    ///
    /// As [`count`](Self::count), and [`Error::Shutdown`] when the client shuts down.
    /// Connection failures are not errors here: it keeps trying until Redis is back.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads, and leaves the channel's waiters when dropped.
    pub async fn wait(&self) -> Result<()> {
        self.wait_for(None).await.map(drop)
    }

    /// Waits at most `wait` for the count to be zero: `true` when it is (Redisson's
    /// `await(timeout, unit)`). A zero `wait` looks once.
    ///
    /// # Errors
    ///
    /// As [`wait`](Self::wait); when no look got an answer from Redis within `wait`,
    /// [`Error::Unavailable`], never `Ok(false)`.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`wait`](Self::wait).
    #[doc(alias = "await")]
    pub async fn try_wait(&self, wait: Duration) -> Result<bool> {
        self.wait_for(Some(wait)).await
    }

    /// Deletes the latch, releasing its waiters as reaching zero does; `true` when it existed.
    ///
    /// # Errors
    ///
    /// As [`count_down`](Self::count_down).
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe in the sense that the latch may be deleted although the future was
    /// dropped before reporting it.
    pub async fn delete(&self) -> Result<bool> {
        let deleted: i64 = self.run(&LATCH_DELETE, Vec::new()).await?;
        Ok(deleted == 1)
    }

    /// What Redis holds of the latch now: its count (in its
    /// [`Details::Latch`](crate::Details::Latch)) and key.
    ///
    /// # Errors
    ///
    /// [`Error::WrongType`] when the key holds another type.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn inspect(&self) -> Result<Inspection> {
        self.client.engine().inspect(&self.kind(), None).await
    }

    async fn wait_for(&self, wait: Option<Duration>) -> Result<bool> {
        let kind = self.kind();
        engine::wait_until(
            self.client.engine(),
            &kind,
            || self.call(&LATCH_CHECK, Vec::new()),
            wait,
        )
        .await
    }

    fn check(&self) -> Result<()> {
        engine::check_primitive(&self.kind())
    }

    fn kind(&self) -> LatchKind {
        LatchKind {
            profile: self.profile.clone(),
        }
    }

    fn call(&self, script: &'static Script, args: Vec<Value>) -> Call {
        self.kind().call(script, args)
    }

    async fn run<R: FromValue>(&self, script: &'static Script, args: Vec<Value>) -> Result<R> {
        let call = self.call(script, args);
        self.client.engine().send(&self.kind(), call).await
    }
}

impl fmt::Debug for CountDownLatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CountDownLatch")
            .field("name", &self.name())
            .finish_non_exhaustive()
    }
}

/// An integer string found by name: a count-down latch, or a semaphore with none of
/// fredlock's permits out (Redisson's layouts cannot tell them apart); read as a latch is.
pub(crate) const COUNTER_LAYOUT: Layout = Layout {
    own_keys: &[],
    own_key: None,
    mode_field: false,
    of_type: Some("string"),
    strays: None,
    at_key: |client, key| {
        let latch = CountDownLatch::at(client, key);
        let kind = LatchKind {
            profile: ProfileOf::new(&COUNTER, latch.profile.keys().clone()),
        };
        Box::new(Counted {
            client: client.clone(),
            kind: Arc::new(kind),
        })
    },
};

/// A latch, as the engine's inspections and name checks see it; nobody acquires it.
pub(crate) struct LatchKind {
    profile: ProfileOf<[u32; 0]>,
}

/// The Redis commands `lua/latch.lua`'s scripts run.
const SCRIPT_COMMANDS: &[&str] = &["decr", "del", "exists", "set", "type"];

/// What a latch runs (its class's [`Class::commands`]), and a counter found by name.
const COMMANDS: &[&[&str]] = &[
    SCRIPT_COMMANDS,
    crate::lua::FENCES_COMMANDS,
    crate::lua::COUNTER_COMMANDS,
    crate::lua::INSPECT_COMMANDS,
];

static LATCH: Class = Class {
    refusal: Some(Refusal {
        what: "count-down latch",
        refuses: |keys| keys.str(NAME).contains(['{', '}']),
        why: "has braces, so Redisson's channel for it (redisson_countdownlatch__channel__{name}) \
              would land in another cluster slot than its count: use a name without braces",
    }),
    ..Class::new("count_down_latch", WakeRule::AtZero(CHANNEL), COMMANDS)
};

/// An integer string found by name, which may as well be a semaphore's: inspected as a
/// `counter`, whatever its name.
static COUNTER: Class = Class::new("counter", WakeRule::AtZero(CHANNEL), COMMANDS);

impl LatchKind {
    fn call(&self, script: &'static Script, args: Vec<Value>) -> Call {
        Call {
            script,
            keys: self.profile.keys().first(2),
            args,
        }
    }
}

impl Primitive for LatchKind {
    fn profile(&self) -> &Profile {
        &self.profile
    }
}

impl Inspect for LatchKind {
    fn inspect(&self) -> Call {
        self.call(&LATCH_INSPECT, Vec::new())
    }
    fn details(&self, tail: &mut Tail) -> Result<Details, String> {
        let count = tail.number();
        // An integer string found by name has the counter's class: it may be a semaphore's.
        Ok(if std::ptr::eq(self.profile().class(), &COUNTER) {
            Details::Counter { value: count }
        } else {
            Details::Latch { count }
        })
    }
    fn leaks(&self, inspection: &Inspection, _grace: Duration) -> Vec<Leak> {
        // The count lasts until it reaches zero, by design (Redisson's).
        keys_without_expiry(inspection, &[self.profile.name()])
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
            &[&LATCH, &COUNTER],
            &[
                SCRIPTS,
                crate::lua::FENCES,
                crate::lua::COUNTER,
                crate::lua::INSPECT_HEAD,
            ],
            &["count_down_latch"],
        );
    }
}

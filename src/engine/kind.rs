//! What the engine needs of a primitive: its [`Profile`] (fixed data: keys, label, wake rule,
//! ..), and, for one whose owners take holds, the script calls of its three operations
//! ([`Kind`]). A primitive hands the engine these; the engine runs the acquire loop, holds,
//! renewals and undos on them without knowing which it is.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::engine::{FromValue, Key, Value};

use crate::engine::profile::Profile;

use crate::engine::ledger::Request;
use crate::engine::replicas::Writer;
use crate::engine::script::Script;
use crate::engine::Field;
use crate::error::RedisError;

/// The reply of an acquire script that granted a first hold although the owner's client counted
/// more: those holds were gone.
const AFRESH: i64 = -3;

/// The reply of a release script that released the last hold and named the first waiting
/// client in the lock's line (see `lua/lock.lua`).
pub(crate) const HANDED_ON: i64 = 2;

/// One script call a primitive made for an operation.
pub(crate) struct Call {
    pub(crate) script: &'static Script,
    pub(crate) keys: Vec<Key>,
    pub(crate) args: Vec<Value>,
}

impl Call {
    /// Runs the call, cloning its keys and arguments for a resend: for calls off the hot path.
    pub(crate) async fn run<R: FromValue>(self, writer: &Writer) -> Result<R, RedisError> {
        self.script.call(writer, self.keys, self.args).await
    }

    /// Runs the call `make` makes, built once on the common path and made again only for the
    /// `EVAL` fallback or a resend, instead of cloned for them.
    pub(crate) async fn run_made<R: FromValue>(
        writer: &Writer,
        make: impl Fn() -> Call,
    ) -> Result<R, RedisError> {
        let first = make();
        let script = first.script;
        let first = TakeOnce::new((first.keys, first.args));
        script
            .run(writer, || {
                first.take().unwrap_or_else(|| {
                    let again = make();
                    (again.keys, again.args)
                })
            })
            .await
    }
}

/// A value the first of its callers takes, and nobody after: a call's prebuilt arguments, which
/// the first send uses and a resend makes again. An atomic flag instead of a mutex, as it is on
/// every lock and unlock.
struct TakeOnce<T> {
    taken: AtomicBool,
    value: UnsafeCell<Option<T>>,
}

// SAFETY: the value is reached only by the one caller that flipped `taken`, and moved out to
// it, so it is never shared: sending it across threads is all `Sync` asks of `T`.
unsafe impl<T: Send> Sync for TakeOnce<T> {}

impl<T> TakeOnce<T> {
    fn new(value: T) -> TakeOnce<T> {
        TakeOnce {
            taken: AtomicBool::new(false),
            value: UnsafeCell::new(Some(value)),
        }
    }

    /// The value for the first caller; `None` for every later one.
    fn take(&self) -> Option<T> {
        if self.taken.swap(true, Ordering::AcqRel) {
            return None;
        }
        // SAFETY: only the caller that found `taken` false gets here, once; no other reference
        // to the value exists or will.
        unsafe { (*self.value.get()).take() }
    }
}

/// The arguments of one acquire attempt.
pub(crate) struct AcquireArgs<'a> {
    pub(crate) field: &'a Field,
    /// The lease in ms.
    pub(crate) lease: &'a Value,
    /// The owner's holds by its client's count.
    pub(crate) holds: usize,
    /// How long the waiter's queue place lasts without another attempt (ms); `None` makes a
    /// single attempt that leaves no trace. Only for a kind with a [`Profile::place`].
    pub(crate) place_ms: Option<u64>,
    /// The client's place in the lock's line, for a kind whose waiters stand in one
    /// ([`Wake::InLine`](super::profile::Wake::InLine)) and an attempt that may wait; `None`
    /// otherwise.
    pub(crate) line: Option<InLine>,
    pub(crate) request: &'a Request,
}

/// A client's place in a lock's line of waiting clients (see `lua/lock.lua`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct InLine {
    /// The client's number in every line.
    pub(crate) number: i64,
    /// How long its place lasts without another attempt (ms).
    pub(crate) place_ms: u64,
    /// What a win does to the place.
    pub(crate) on_win: OnWin,
}

/// What a win does to the winning client's place in line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OnWin {
    /// Another task of the client waits on: the place stays.
    Keep,
    /// The place is left.
    Leave,
    /// The wait's first attempt, which was not in line: nothing to leave.
    Nothing,
}

impl OnWin {
    /// The word the acquire script takes.
    pub(crate) fn word(self) -> &'static str {
        match self {
            OnWin::Keep => "keep",
            OnWin::Leave => "leave",
            OnWin::Nothing => "none",
        }
    }
}

/// The arguments of one release: `field` keeps `left` holds, with `lease` (ms) set again while
/// some remain (0 keeps the expiry as it is).
pub(crate) struct ReleaseArgs<'a> {
    pub(crate) field: &'a Field,
    pub(crate) left: usize,
    pub(crate) lease: &'a Value,
    pub(crate) request: &'a Request,
}

/// What one run of an acquire script said. Every primitive's acquire call replies in one of
/// these shapes: nil (won), an array `{value, afresh}` (won, carrying a value such as a fencing
/// token), -3 (won afresh), the longest to sleep before trying again, in ms (-1: the key has no
/// expiry), or a string: refused, and trying again would not change it (a job's tick that was
/// run; a `SET NX GET`'s holder, for a call that cannot say how long to sleep), which the
/// primitive reads.
#[derive(Debug)]
pub(crate) enum Reply {
    Won { afresh: bool, value: Option<Value> },
    Busy(i64),
    Refused(Value),
}

impl Reply {
    pub(crate) fn parse(reply: Value) -> Result<Reply, RedisError> {
        match reply {
            Value::Null => Ok(Reply::Won {
                afresh: false,
                value: None,
            }),
            Value::Integer(AFRESH) => Ok(Reply::Won {
                afresh: true,
                value: None,
            }),
            Value::Integer(ms) => Ok(Reply::Busy(ms)),
            Value::Array(mut parts) if parts.len() == 2 => {
                let afresh = parts.pop().and_then(|flag| flag.as_i64()) == Some(1);
                Ok(Reply::Won {
                    afresh,
                    value: parts.pop(),
                })
            }
            refused @ (Value::String(_) | Value::Bytes(_)) => Ok(Reply::Refused(refused)),
            other => Err(RedisError::unreadable(format!(
                "unexpected reply from an acquire script: {other:?}"
            ))),
        }
    }
}

/// What every part of the engine knows of a primitive, whatever it does: its [`Profile`], fixed
/// when its handle was made. A primitive nobody holds (a count-down latch) is only this and its
/// `Inspect`.
pub(crate) trait Primitive: Send + Sync + 'static {
    /// What the engine reads of it: keys, class and the handle's settings.
    fn profile(&self) -> &Profile;
}

/// A primitive whose owners take holds, as the acquire loop, the undo task and the watchdog see
/// it: its profile and three calls.
pub(crate) trait Kind: Primitive {
    /// The acquire script call.
    fn acquire(&self, args: &AcquireArgs<'_>) -> Call;

    /// The release script call; it replies nil when the owner held nothing, 0 when holds remain,
    /// 1 when it released the last ([`HANDED_ON`] when, released, it named a waiting client in
    /// the lock's line).
    fn release(&self, args: &ReleaseArgs<'_>) -> Call;

    /// The call that gives up `field`'s queue place, for a kind whose waiters queue; it replies
    /// 1 when there was one.
    fn leave(&self, _field: &str, _request: &Request) -> Option<Call> {
        None
    }

    /// The call a client whose number `number` a release named, with none of its tasks waiting
    /// any more, makes to pass the wake on, for a kind whose waiters stand in line
    /// ([`Wake::InLine`](super::profile::Wake::InLine)).
    fn pass_on(&self, _number: i64) -> Option<Call> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Of many threads asking at once, exactly one gets the value.
    #[test]
    fn one_caller_takes_the_value() {
        let once = TakeOnce::new(String::from("first"));
        let taken: Vec<Option<String>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..8).map(|_| scope.spawn(|| once.take())).collect();
            handles
                .into_iter()
                .map(|handle| handle.join().unwrap())
                .collect()
        });
        assert_eq!(taken.iter().filter(|value| value.is_some()).count(), 1);
        assert_eq!(once.take(), None);
    }
}

//! What the engine needs to know of a primitive: what every primitive is ([`Primitive`]: its name,
//! label, wake rule and name refusal) and, for one whose owners take holds, the script calls of
//! its operations and how its holds and waiters differ ([`Kind`]). A primitive hands the engine
//! these; the engine runs the acquire loop, holds, renewals and undos on them without knowing
//! which it is.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use fred::types::{Key, Value};

use crate::engine::ledger::Request;
use crate::engine::pubsub::Channel;
use crate::engine::replicas::Writer;
use crate::engine::script::Script;
use crate::engine::{Field, Name};

/// The reply of an acquire script that granted a first hold although the owner's client counted
/// more: those holds were gone.
const AFRESH: i64 = -3;

/// One script call a primitive made for an operation.
pub(crate) struct Call {
    pub(crate) script: &'static Script,
    pub(crate) keys: Vec<Key>,
    pub(crate) args: Vec<Value>,
}

impl Call {
    /// Runs the call, cloning its keys and arguments for a resend: for calls off the hot path.
    pub(crate) async fn run<R: fred::types::FromValue>(
        self,
        writer: &Writer,
    ) -> Result<R, fred::error::Error> {
        self.script.call(writer, self.keys, self.args).await
    }

    /// Runs the call `make` makes, built once on the common path and made again only for the
    /// `EVAL` fallback or a resend, instead of cloned for them.
    pub(crate) async fn run_made<R: fred::types::FromValue>(
        writer: &Writer,
        make: impl Fn() -> Call,
    ) -> Result<R, fred::error::Error> {
        let first = make();
        let script = first.script;
        let first = Mutex::new(Some((first.keys, first.args)));
        script
            .run(writer, || {
                let taken = first.lock().unwrap_or_else(PoisonError::into_inner).take();
                taken.unwrap_or_else(|| {
                    let again = make();
                    (again.keys, again.args)
                })
            })
            .await
    }
}

/// How a waiter learns that it may try again.
#[derive(Clone, Debug)]
pub(crate) enum Wake {
    /// An unlock is published on this channel, shared by every waiter of the primitive.
    Shared(Channel),
    /// Each waiter has its own channel, `<prefix>:<owner field>`, and is told alone.
    PerWaiter(Channel),
    /// Releases publish on this shared channel how many units are free now (a semaphore's
    /// permits): a message wakes the waiters whose wants ([`Kind::wants`]) fit in it, in the
    /// order they came, and no more.
    Counted(Channel),
    /// A count reaching zero publishes `0` on this shared channel, which wakes every waiter;
    /// any other message (a new count) wakes none.
    AtZero(Channel),
    /// Nothing is published: waiters sleep and try again, never subscribing.
    Backoff(Backoff),
}

/// Exponential backoff with jitter: the n-th pause is random in the upper half of
/// `first * 2^n`, capped at `cap`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Backoff {
    pub(crate) first: Duration,
    pub(crate) cap: Duration,
}

/// The arguments of one acquire attempt.
pub(crate) struct AcquireArgs<'a> {
    pub(crate) field: &'a Field,
    /// The lease in ms.
    pub(crate) lease: &'a Value,
    /// The owner's holds by its client's count.
    pub(crate) holds: usize,
    /// How long the waiter's queue place lasts without another attempt (ms); `None` makes a
    /// single attempt that leaves no trace. Only for a kind with a [`Kind::place`].
    pub(crate) place_ms: Option<u64>,
    pub(crate) request: &'a Request,
}

/// The arguments of one release: `field` keeps `left` holds, with `lease` (ms) set again while
/// some remain (0 keeps the expiry as it is).
pub(crate) struct ReleaseArgs<'a> {
    pub(crate) field: &'a Field,
    pub(crate) left: usize,
    pub(crate) lease: &'a Value,
    pub(crate) request: &'a Request,
}

/// What one run of an acquire script said. Every primitive's acquire script replies in one of
/// these shapes: nil (won), an array `{value, afresh}` (won, carrying a value such as a fencing
/// token), -3 (won afresh), or the longest to sleep before trying again, in ms (-1: the key
/// has no expiry).
#[derive(Debug)]
pub(crate) enum Reply {
    Won { afresh: bool, value: Option<Value> },
    Busy(i64),
}

impl Reply {
    pub(crate) fn parse(reply: Value) -> Result<Reply, fred::error::Error> {
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
            other => Err(fred::error::Error::new(
                fred::error::ErrorKind::Parse,
                format!("unexpected reply from an acquire script: {other:?}"),
            )),
        }
    }
}

/// What every part of the engine knows of a primitive, whatever it does: its name and key, its
/// kind in one word, how its waiters learn of a change, and whether it can take its name. A
/// primitive nobody holds (a count-down latch) is only this and its `Inspect`.
pub(crate) trait Primitive: Send + Sync + 'static {
    /// The primitive's name: its main key, which messages name it by.
    fn name(&self) -> &str;

    /// The name as shared text (a slice of the primitive's keys, not a copy), which holds are
    /// kept by.
    fn name_text(&self) -> Name;

    /// The main key as sent to Redis (its name), shared rather than copied: the key a renewal
    /// script takes for each hold.
    fn key(&self) -> Key;

    /// The primitive's kind in one word (`lock`, `fair_lock`, ..): the `kind` label of its
    /// metrics, and of its inspections.
    fn label(&self) -> &'static str;

    /// How its waiters wake.
    fn wake(&self) -> Wake;

    /// Why the primitive cannot take its name, if it cannot: reported as `InvalidArgument`
    /// before anything is sent.
    fn refuses_name(&self) -> Option<String> {
        None
    }
}

/// A primitive whose owners take holds, as the acquire loop, the undo task and the watchdog see
/// it: three calls (acquire, release, leave) and how its holds and waiters differ from a lock's.
pub(crate) trait Kind: Primitive {
    /// What an owner's field adds to `<client uuid>:<owner id>` (Redisson's writer of a
    /// read-write lock has `:write`); empty for most.
    fn field_suffix(&self) -> &'static str {
        ""
    }

    /// How long a waiter's queue place lasts without another attempt, for a primitive whose
    /// waiters queue; `None` for one whose waiters do not.
    fn place(&self) -> Option<Duration> {
        None
    }

    /// How much of what a [`Wake::Counted`] release announces one waiter needs (a semaphore
    /// waiter's permits); 1 for every other.
    fn wants(&self) -> u32 {
        1
    }

    /// The script the watchdog renews (lease > 0) or checks (lease 0) holds with: KEYS are
    /// the holds' primitives' [`key`](Primitive::key)s, ARGV the lease then one owner field per
    /// key; one reply per key, 1 when held. `None` for a primitive whose holds have no lease to
    /// renew or check (a semaphore's permits): the watchdog never visits them.
    fn renewal(&self) -> Option<&'static Script>;

    /// The acquire script call.
    fn acquire(&self, args: &AcquireArgs<'_>) -> Call;

    /// The release script call; it replies nil when the owner held nothing, 0 when holds remain,
    /// 1 when it released the last.
    fn release(&self, args: &ReleaseArgs<'_>) -> Call;

    /// The call that gives up `field`'s queue place; it replies 1 when there was one.
    fn leave(&self, _field: &str, _request: &Request) -> Option<Call> {
        None
    }
}

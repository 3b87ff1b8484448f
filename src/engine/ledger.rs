//! Exactly-once effects for the calls that change a primitive: acquire, release, a queue's join
//! and leave.
//!
//! A reply can be lost after the script ran: the connection breaks, the server stalls past the
//! command timeout, the network partitions. The caller cannot tell whether the call took effect,
//! and sending it again must not take effect twice. A call can also arrive late: bytes written
//! before a reconnect may reach the server after the calls sent on the new connection. Three
//! rules make every such call take effect at most once, and its effect correct whether it ran
//! or not:
//!
//! 1. **One call at a time per (lock, owner).** A [`Turn`] serialises the state-changing calls
//!    of one owner on one lock inside this client, so the client always knows how many holds the
//!    owner has (its live guards) when it sends a call.
//! 2. **Counts are set, never added to.** An acquire carries the owner's hold count `c` and the
//!    script sets it to `c + 1` (or to 1 on a free lock); a release carries the count to leave.
//!    Sending the same call twice leaves the same state as sending it once, so a call whose
//!    reply was lost is simply sent again (with a new id). The owner's client is the one
//!    authority on its own count: no other client writes its field.
//! 3. **Lost replies are fenced.** Each call carries a request id (a number counted per client,
//!    so `<owner field>:<id>` is unique). When a reply is lost, the id is remembered here, and
//!    the owner's next call on the lock carries it; the script adds `<owner>:<id>` to the
//!    lock's fence set (`fredlock_fences:{name}`, kept 15 minutes), and a call found in that set
//!    does nothing, however late it arrives. Without this, an acquire arriving after the
//!    owner's release would leave a phantom hold, and a release arriving after the owner's next
//!    acquire would delete a lock its owner believes it holds.
//!
//! Every call is therefore safe to send again, and what the client knows to be safe it does: an
//! acquire is sent again by the waiting loop, a release or a leave at once (within a command
//! timeout; `Turn::send_again_while_lost`). A lost reply that no later call carries (the caller
//! gave up, or Redis did not answer in time) is followed up by a settle, queued for the
//! undo task: it sets the owner's count to what the client knows (deleting a hold nobody has a
//! guard for) and fences the ids, retrying with backoff. A leave carries the fences too, but
//! its reply settles nothing: it does not set the count, and the acquire it fences may have
//! run before it and left a hold ([`Fencing::Only`]); the settle still follows.
//!
//! Redisson's layout is unchanged: the hash still maps owners to hold counts; the fence set is a
//! key of fredlock's own that Redisson never reads. What stays outside: a call delayed longer
//! than the fence memory (longer than TCP keeps retransmitting by default), and renewals, which
//! only extend a hold that exists and are safe to repeat.

use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};

use crate::engine::Value;
use dashmap::DashMap;
use std::future::Future;

use tokio::sync::{Mutex, OwnedMutexGuard};

use crate::engine::script::Resend;
use crate::engine::{Connection, Field, HashState, Name};
use crate::error::{reply_lost, Failure, RedisError, RedisErrorKind};

/// Request ids whose replies were lost, for one (lock, owner).
#[derive(Debug, Default)]
pub(crate) struct Unsettled {
    ids: Vec<u64>,
}

/// A lock's name and an owner's field: the key of the ledger and of the holds. Hashed once,
/// when made: a lock+unlock looks its pair up about seven times, and hashing the two strings
/// each time was 1 000 instructions of it.
#[derive(Clone, Debug)]
pub(crate) struct Pair {
    pub(crate) name: Name,
    pub(crate) field: Field,
    hash: u64,
}

impl Pair {
    pub(crate) fn new(name: Name, field: Field) -> Pair {
        // Seeded at random once per process, like the maps' own hashers: names nobody can make
        // collide on purpose.
        static SEED: LazyLock<foldhash::quality::RandomState> = LazyLock::new(Default::default);
        Pair {
            hash: SEED.hash_one((&*name, &*field)),
            name,
            field,
        }
    }
}

impl PartialEq for Pair {
    fn eq(&self, other: &Pair) -> bool {
        self.hash == other.hash && self.name == other.name && self.field == other.field
    }
}

impl Eq for Pair {}

impl Hash for Pair {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

/// Every (lock, owner) with a call on its way or ids to fence.
pub(crate) struct Ledger {
    shared: Arc<LedgerEntries>,
}

struct LedgerEntries {
    entries: DashMap<Pair, Arc<Mutex<Unsettled>>, HashState>,
    next: AtomicU64,
}

/// One owner's exclusive right to change one lock, for one call (and its retries). It owns what
/// it needs, so that a call can take its turn before it is handed to a task of its own: a call
/// cancelled while it waits for its turn is never sent.
pub(crate) struct Turn {
    // Dropped before `forget`, which then finds the entry free (field order is drop order).
    unsettled: OwnedMutexGuard<Unsettled>,
    forget: ForgetIfIdle,
}

/// Forgets a pair's entry when it is dropped and the entry is idle: nobody holds or waits for
/// the turn and no id is left to fence. Both a turn and a call still waiting for one drop it,
/// each after letting go of the entry; whichever lets go last finds it idle. (Forgetting only
/// at a turn's end leaked an entry whenever the one call waiting behind it was cancelled.)
struct ForgetIfIdle {
    ledger: Arc<LedgerEntries>,
    key: Pair,
}

impl Drop for ForgetIfIdle {
    fn drop(&mut self) {
        // Under the map's lock nobody can clone the entry: the map's own reference being the
        // only one means nobody holds the turn or waits for it. Whoever makes a fresh entry
        // later starts from nothing, which is what this one held.
        self.ledger.entries.remove_if_mut(&self.key, |_, entry| {
            Arc::get_mut(entry).is_some_and(|entry| entry.get_mut().ids.is_empty())
        });
    }
}

/// What the reply to a call that carried fences says of the lost calls they fence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fencing {
    /// The call sets the owner's count (an acquire, a release): once it is answered, nothing a
    /// lost call did is left that the count does not say.
    Settles,
    /// The call fences them but leaves the count alone (a leave): a lost acquire it fenced may
    /// have run first and left a hold, which only a settle gives back.
    Only,
}

/// The request id of one call and the ids it fences, as the scripts take them after their own
/// arguments.
pub(crate) struct Request {
    id: u64,
    fences: Vec<u64>,
}

impl Ledger {
    pub(crate) fn new() -> Ledger {
        Ledger {
            shared: Arc::new(LedgerEntries {
                entries: DashMap::with_hasher(HashState::default()),
                next: AtomicU64::new(1),
            }),
        }
    }

    /// Waits for the turn of the pair's owner on its lock.
    pub(crate) async fn turn(&self, pair: &Pair) -> Turn {
        let key = pair.clone();
        let entry = self.shared.entries.entry(key.clone()).or_default().clone();
        // Declared before the wait: a call cancelled while it waits drops the wait (and its
        // reference to the entry) first, then this.
        let forget = ForgetIfIdle {
            ledger: self.shared.clone(),
            key,
        };
        let unsettled = entry.lock_owned().await;
        Turn { unsettled, forget }
    }

    /// Number of (lock, owner) pairs with a call on its way or ids to fence.
    pub(crate) fn len(&self) -> usize {
        self.shared.entries.len()
    }
}

impl Turn {
    /// A new request, fencing every id whose reply was lost.
    pub(crate) fn request(&self) -> Request {
        Request {
            id: self.forget.ledger.next.fetch_add(1, Ordering::Relaxed),
            fences: self.unsettled.ids.clone(),
        }
    }

    /// Records how `request` ended: a reply settles every id it fenced; a lost reply adds its
    /// own id to them. After any other error (an error reply, a call never sent) they stay for
    /// the next call.
    pub(crate) fn record<T>(&mut self, request: Request, outcome: &Result<T, RedisError>) {
        self.record_as(request, outcome, Fencing::Settles);
    }

    fn record_as<T>(
        &mut self,
        request: Request,
        outcome: &Result<T, RedisError>,
        fencing: Fencing,
    ) {
        let ids = &mut self.unsettled.ids;
        match outcome {
            Ok(_) if fencing == Fencing::Settles => ids.retain(|id| !request.fences.contains(id)),
            Ok(_) => {}
            Err(error) if reply_lost(error) => ids.push(request.id),
            Err(_) => {}
        }
    }

    /// Gives up on the ids to fence: no call can carry them (the key is not a lock any more).
    pub(crate) fn drop_fences(&mut self) {
        self.unsettled.ids.clear();
    }

    /// Sends the call `send` makes of a request, and sends it again (fencing the lost one) while
    /// its reply is lost, within a command timeout from the first send: for calls safe to repeat
    /// (a release, a leave), whose callers want an answer rather than an unknown outcome. Also
    /// says whether it was sent again: then a reply that finds nothing to change may mean that
    /// an earlier send changed it.
    ///
    /// `first_sent` is when the caller set out (a clock read it has anyway): resends end one
    /// command timeout after it.
    pub(crate) async fn send_again_while_lost<T, F, Fut>(
        &mut self,
        redis: &Connection,
        fencing: Fencing,
        first_sent: tokio::time::Instant,
        send: F,
    ) -> (Result<T, RedisError>, bool)
    where
        F: Fn(Request) -> Fut,
        Fut: Future<Output = (Request, Result<T, RedisError>)>,
    {
        let mut resend: Option<Resend> = None;
        loop {
            let (request, outcome) = send(self.request()).await;
            self.record_as(request, &outcome, fencing);
            if !outcome.as_ref().is_err_and(reply_lost) {
                return (outcome, resend.is_some());
            }
            let resend = resend.get_or_insert_with(|| Resend::new(redis, first_sent));
            if !Box::pin(resend.wait(redis)).await {
                return (outcome, true);
            }
        }
    }

    /// Whether ids are left to fence.
    pub(crate) fn is_unsettled(&self) -> bool {
        !self.unsettled.ids.is_empty()
    }

    /// The lock and owner this turn is for.
    pub(crate) fn key(&self) -> &Pair {
        &self.forget.key
    }
}

impl Request {
    /// The id and the fences, appended to a script's arguments.
    pub(crate) fn append_to(&self, args: &mut Vec<Value>) {
        args.reserve(1 + self.fences.len());
        args.push(Value::Integer(self.id as i64));
        args.extend(self.fences.iter().map(|&id| Value::Integer(id as i64)));
    }
}

/// Replays a recorded sequence of one owner's calls on one lock through a new ledger, for the
/// test that ties the model's client to it (`tests/model`): `call` (an acquire, a release, a
/// settle) and `leave` each take the turn and send a request; `reply`, `lost` and `refused` end
/// the last one (answered; its reply lost; an error reply, which settles nothing). Returns,
/// for each request sent, the ones it fences, as send numbers (1: the first).
pub(crate) async fn replay(steps: &[&str]) -> Result<Vec<Vec<u64>>, String> {
    let ledger = Ledger::new();
    let pair = Pair::new("replay".into(), "owner".into());
    let mut turn = ledger.turn(&pair).await;
    let mut sent: Vec<Vec<u64>> = Vec::new();
    let mut on_its_way: Option<(Request, Fencing)> = None;
    // The ids count from 1 in a new ledger: the n-th request is id n.
    for (at, &step) in steps.iter().enumerate() {
        let fencing = match step {
            "call" => Some(Fencing::Settles),
            "leave" => Some(Fencing::Only),
            _ => None,
        };
        if let Some(fencing) = fencing {
            if on_its_way.is_some() {
                return Err(format!("step {at}: {step} while a call is on its way"));
            }
            let request = turn.request();
            sent.push(request.fences.clone());
            on_its_way = Some((request, fencing));
            continue;
        }
        let Some((request, fencing)) = on_its_way.take() else {
            return Err(format!("step {at}: {step} without a call on its way"));
        };
        let outcome: Result<(), RedisError> = match step {
            "reply" => Ok(()),
            "lost" => Err(RedisError::new(
                RedisErrorKind::NoReply,
                Failure::Timeout,
                "no reply",
            )),
            "refused" => Err(RedisError::new(
                RedisErrorKind::Refused,
                Failure::Other("unknown error".into()),
                "STALE",
            )),
            other => return Err(format!("step {at}: unknown step {other:?}")),
        };
        turn.record_as(request, &outcome, fencing);
    }
    Ok(sent)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lost_reply() -> Result<(), RedisError> {
        Err(RedisError::new(
            RedisErrorKind::NoReply,
            Failure::Timeout,
            "no reply",
        ))
    }

    fn pair() -> Pair {
        Pair::new("lock".into(), "owner".into())
    }

    #[tokio::test]
    async fn lost_replies_are_fenced_by_the_next_call_until_it_gets_a_reply() {
        let ledger = Ledger::new();
        let pair = pair();
        let mut turn = ledger.turn(&pair).await;
        let first = turn.request();
        assert!(first.fences.is_empty());
        let first_id = first.id;
        turn.record(first, &lost_reply());
        assert!(turn.is_unsettled());

        let second = turn.request();
        assert_ne!(second.id, first_id, "ids are never reused");
        assert_eq!(second.fences, vec![first_id]);
        let second_id = second.id;
        turn.record(second, &lost_reply());

        let third = turn.request();
        assert_eq!(third.fences, vec![first_id, second_id]);
        // An error reply is an answer that changed nothing, not a delivery of the fences.
        let refused: Result<(), _> = Err(RedisError::new(
            RedisErrorKind::Refused,
            Failure::Other("invalid argument".into()),
            "WRONGTYPE",
        ));
        turn.record(third, &refused);
        assert!(turn.is_unsettled());

        let fourth = turn.request();
        turn.record(fourth, &Ok::<(), RedisError>(()));
        assert!(!turn.is_unsettled());
        drop(turn);
        assert_eq!(ledger.len(), 0, "a settled pair is forgotten");
    }

    #[tokio::test]
    async fn only_a_lost_reply_leaves_an_id_to_fence() {
        let ledger = Ledger::new();
        let mut turn = ledger.turn(&pair()).await;
        // An error reply is an answer (the script changed nothing), and a call never sent
        // never ran: neither needs fencing, nor a settle.
        for (kind, failure) in [
            (RedisErrorKind::Refused, Failure::Other("refused".into())),
            (RedisErrorKind::NotSent, Failure::Connection),
        ] {
            let request = turn.request();
            turn.record(
                request,
                &Err::<(), _>(RedisError::new(kind, failure, "error")),
            );
            assert!(!turn.is_unsettled(), "{kind:?} left an id to fence");
        }
        let request = turn.request();
        turn.record(request, &lost_reply());
        assert!(turn.is_unsettled());
    }

    #[tokio::test]
    async fn a_leave_fences_lost_calls_but_leaves_them_to_the_settle() {
        let ledger = Ledger::new();
        let mut turn = ledger.turn(&pair()).await;
        let acquire = turn.request();
        let acquire_id = acquire.id;
        turn.record(acquire, &lost_reply());
        // The leave is answered: the acquire it fenced may still have left a hold.
        let (left, again) = turn
            .send_again_while_lost(
                &Connection::unconnected(),
                Fencing::Only,
                tokio::time::Instant::now(),
                |request| {
                    let fences = request.fences.clone();
                    async move {
                        assert_eq!(fences, vec![acquire_id], "the leave carries the fences");
                        (request, Ok::<bool, RedisError>(true))
                    }
                },
            )
            .await;
        assert!(left.unwrap() && !again);
        assert!(turn.is_unsettled(), "only a settle settles after a leave");

        let settle = turn.request();
        assert_eq!(settle.fences, vec![acquire_id]);
        turn.record(settle, &Ok::<(), RedisError>(()));
        assert!(!turn.is_unsettled());
    }

    #[tokio::test]
    async fn pairs_whose_hashes_collide_stay_apart_and_pairs_hash_apart() {
        let ledger = Ledger::new();
        let one = pair();
        let other = Pair::new("lock".into(), "another owner".into());
        // A pair made with another's hash (a collision, rare but possible) is still another
        // (lock, owner): its calls do not wait for the first's turn.
        let colliding = Pair {
            hash: one.hash,
            ..other.clone()
        };
        assert_ne!(one, colliding);
        assert_eq!(one, pair());
        let _held = ledger.turn(&one).await;
        let apart = tokio::time::timeout(
            std::time::Duration::from_millis(50),
            ledger.turn(&colliding),
        )
        .await;
        assert!(
            apart.is_ok(),
            "another owner's call does not wait for this one's turn"
        );
        // The maps spread pairs by the hash made once: two pairs land apart.
        let state = std::hash::RandomState::new();
        assert_ne!(state.hash_one(&one), state.hash_one(&other));
    }

    #[tokio::test]
    async fn a_call_cancelled_while_it_waits_for_its_turn_leaves_no_entry() {
        let ledger = Ledger::new();
        let pair = pair();
        let wait = std::time::Duration::from_millis(20);
        // Cancelled while the turn is held, the turn then ending: CI's cancellation storm
        // (tests/semaphore.rs) saw this order too, but it was always forgotten.
        let held = ledger.turn(&pair).await;
        let mut waiting = Box::pin(ledger.turn(&pair));
        assert!(tokio::time::timeout(wait, &mut waiting).await.is_err());
        drop(waiting);
        drop(held);
        assert_eq!(ledger.len(), 0, "cancelled, then the turn ended");

        // The turn ending while a call waits, the call then cancelled before it is polled
        // again: the entry was left for good, and the pair counted as unsettled.
        let held = ledger.turn(&pair).await;
        let mut waiting = Box::pin(ledger.turn(&pair));
        assert!(tokio::time::timeout(wait, &mut waiting).await.is_err());
        drop(held);
        assert_eq!(ledger.len(), 1, "the waiting call keeps the pair");
        drop(waiting);
        assert_eq!(ledger.len(), 0, "the turn ended, then cancelled");

        // A pair with ids to fence stays whoever lets go last.
        let mut held = ledger.turn(&pair).await;
        let request = held.request();
        held.record(request, &lost_reply());
        let mut waiting = Box::pin(ledger.turn(&pair));
        assert!(tokio::time::timeout(wait, &mut waiting).await.is_err());
        drop(held);
        drop(waiting);
        assert_eq!(ledger.len(), 1, "the lost reply is still to be fenced");
    }

    #[tokio::test]
    async fn an_unsettled_pair_is_remembered_and_calls_take_turns() {
        let ledger = Ledger::new();
        let pair = pair();
        let mut turn = ledger.turn(&pair).await;
        let request = turn.request();
        turn.record(request, &lost_reply());
        drop(turn);
        assert_eq!(ledger.len(), 1);

        let held = ledger.turn(&pair).await;
        let waiting =
            tokio::time::timeout(std::time::Duration::from_millis(50), ledger.turn(&pair)).await;
        assert!(
            waiting.is_err(),
            "a second call of the owner waits its turn"
        );
        drop(held);
        let mut turn = ledger.turn(&pair).await;
        turn.drop_fences();
        drop(turn);
        assert_eq!(ledger.len(), 0);
    }
}

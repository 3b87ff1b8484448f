//! Models of the reentrant lock's, the fair lock's, the read-write lock's, the leader
//! election's and the permit semaphore's protocols (issue 35), checked exhaustively to a bound
//! with stateright, and tied to the Lua by differential tests. One file per model: this one the
//! client's side every lock model shares (its calls, turns, fences, renewals and deadlines),
//! `lock.rs` the lock model (the fair lock and the leader election are the lock model with its
//! `line` or `campaign` set) and its checks, `script.rs` the lock scripts it runs, `permits.rs` the
//! permit semaphore's, `rw.rs` the read-write lock's, `wake.rs` the reentrant lock's wake rule
//! (its line of waiting clients); `checker.rs` the bounded check every
//! model runs, `differential.rs` the harness every differential test shares.
//!
//! The model runs the scripts of `lua/lock.lua` (acquire, release, the watchdog's renew) as
//! atomic steps with the same branches (`script.rs`), the client as the engine runs it (one
//! call at a time per owner, hold counts set not added, lost replies fenced by the owner's next
//! call, resends, settles, watchdog renewals or a fixed lease's checks, the renew deadline and
//! the local loss), a network that delays, reorders and loses, key expiry on a server clock
//! that may run up to `DRIFT` ticks ahead of the clients', and crashes. `the_model_matches_the_scripts` runs random
//! states and calls through both `script` and the real scripts on a real server, and compares
//! replies and keys, so the model cannot drift from the Lua.
//!
//! The bound is CI's (the checks take about 80 s on two cores: this package is built
//! optimised, see its Cargo.toml, the search is depth first and the lock models' clients are
//! reduced by symmetry); `FREDLOCK_MODEL_CLIENTS`, `FREDLOCK_MODEL_TICKS` and
//! `FREDLOCK_MODEL_CALLS` raise it for a longer run.

#[path = "../common/mod.rs"]
mod common;

use std::collections::{BTreeMap, BTreeSet};

use fred::prelude::*;
use fred::types::Value;
use stateright::{Checker, HasDiscoveries, Model, Property};

/// A client (its owner field on the server), and a request id of one owner.
type Owner = u8;
type Req = u8;

mod checker;
mod differential;
mod script;

use checker::*;
use differential::*;

use script::{Reply, Server};

/// A call of a client on its way to the server.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
struct Request {
    owner: Owner,
    req: Req,
    call: CallKind,
    lost: Vec<Req>,
    sent_at: u8,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
enum CallKind {
    Acquire {
        holds: u32,
    },
    Release {
        left: u32,
    },
    Renew,
    /// A fair lock's waiter gives up its place.
    Leave,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
struct Response {
    owner: Owner,
    req: Req,
    reply: Reply,
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, PartialOrd, Ord)]
struct Peer {
    /// Live guards, by the client's count.
    holds: u32,
    /// Whether a guard believes it holds: until its `lost()` fires.
    believes: bool,
    /// The send time of the last acquire or renewal confirmed.
    leased_at: u8,
    next_req: Req,
    /// Calls made in its turn (not renewals): what `max_requests` bounds.
    calls: u8,
    /// Calls it may make in its turn, when the model gives it a budget of its own (0: the
    /// model's `max_requests`); part of the peer, so that the symmetry reduction keeps it with
    /// its client.
    budget: u8,
    /// A release whose reply was lost and is not settled yet: whether it was partial (holds
    /// left).
    lost_release: Option<bool>,
    /// Ids whose replies were lost, fenced by the next call.
    lost: Vec<Req>,
    /// The call in the owner's turn, waiting for its reply.
    waiting: Option<(Req, CallKind, u8)>,
    /// A renewal on its way (the watchdog's, outside the turn).
    renewing: bool,
    /// When it last sent a renewal (or a fixed lease's check): at most one a tick.
    renewed_at: u8,
    crashed: bool,
    /// The fencing token of its first hold.
    token: Option<u64>,
    /// A fair lock's waiter that may have a place in the line: it asked and was not granted.
    queued: bool,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
enum Action {
    /// A client asks (its first hold, or a re-entry, or a resend after a lost reply).
    Acquire(Owner),
    /// A client gives one hold back (all of them once the hold is known lost).
    Release(Owner),
    /// A client that gave up a call whose reply was lost sets its count right (the undo
    /// task's settle: a release to what it knows).
    Settle(Owner),
    /// The watchdog renews.
    Renew(Owner),
    /// A fair lock's waiter gives up its place.
    Leave(Owner),
    /// The server runs the i-th request on its way (any of them: calls may arrive late).
    Deliver(usize),
    /// The i-th reply reaches its client.
    Respond(usize),
    /// A client stops waiting for its call's reply (lost, timed out).
    GiveUp(Owner),
    /// The i-th reply is lost on the way.
    LoseResponse(usize),
    /// Time passes on every clock.
    Tick,
    /// The key expires by the server's clock.
    Expire,
    /// A client process dies.
    Crash(Owner),
}

/// The client's side shared by the lock models (the lock's, the fair lock's and the leader
/// election's, and the read-write lock's): sends `call` of `owner`'s at `now`, in its turn (a
/// renewal outside it), with the lost ids it fences (none for a renewal). The ids stay the
/// client's until a reply settles them (see [`answered`]), as `Turn::request` in
/// `src/engine/ledger.rs` clones them into each request.
fn send(clients: &mut [Peer], requests: &mut Vec<Request>, now: u8, owner: Owner, call: CallKind) {
    let client = &mut clients[owner as usize];
    let req = client.next_req;
    client.next_req += 1;
    if call != CallKind::Renew {
        client.calls += 1;
    }
    let lost = match call {
        CallKind::Renew => Vec::new(),
        _ => client.lost.clone(),
    };
    if call == CallKind::Renew {
        client.renewing = true;
        client.renewed_at = now;
    } else {
        client.waiting = Some((req, call, now));
    }
    requests.push(Request {
        owner,
        req,
        call,
        lost,
        sent_at: now,
    });
    requests.sort();
}

/// The reply to the call in `client`'s turn, as `Turn::record_as` in `src/engine/ledger.rs`
/// records it: the lost ids the call carried are settled (the call set the owner's count
/// after fencing them), unless it only fences them (a leave, `Fencing::Only`: the acquire it
/// fenced may have run first, and only a settle gives its hold back), or `leave_settles` (the
/// engine's rule before, only to see the model fail). While the call is in the owner's turn
/// nothing else changes the ids, so they are all the call carried. Its loss is `GiveUp`,
/// which adds the call's own id (`record_as`'s lost reply).
fn answered(client: &mut Peer, call: CallKind, leave_settles: bool) {
    if call != CallKind::Leave || leave_settles {
        client.lost.clear();
        client.lost_release = None;
    }
}

/// The client stops waiting for the call in its turn (its reply lost, or timed out): its id is
/// fenced by the calls after it, as `Turn::record_as` in `src/engine/ledger.rs` adds a lost
/// reply's id. The call given up, if one was waiting.
fn gave_up(client: &mut Peer) -> Option<CallKind> {
    let (req, call, _) = client.waiting.take()?;
    client.lost.push(req);
    Some(call)
}

/// A renewal's reply, read with its send time as the watchdog reads it: a confirmed renewal
/// moves the owner's lease on, a refused one is a loss. None when the reply is not there.
fn renewal_answered(
    responses: &mut Vec<Response>,
    client: &mut Peer,
    request: &Request,
    renewed: bool,
) -> Option<()> {
    let response = responses
        .iter()
        .position(|r| r.owner == request.owner && r.req == request.req)?;
    let response = responses.remove(response);
    client.renewing = false;
    if !client.crashed {
        match response.reply {
            // A check confirms a fixed lease without moving it on.
            Reply::Int(1) if client.believes && renewed => {
                client.leased_at = client.leased_at.max(request.sent_at);
            }
            Reply::Int(0) => client.believes = false,
            _ => {}
        }
    }
    Some(())
}

/// Time passes for the clients: a guard's `lost()` fires at its renew deadline. Whether one
/// did.
fn deadlines_pass(clients: &mut [Peer], now: u8, renew_deadline: u8) -> bool {
    let mut lost = false;
    for client in clients {
        if client.believes && now >= client.leased_at + renew_deadline {
            client.believes = false;
            lost = true;
        }
    }
    lost
}

/// A lock model's state as the clients' side shared by the lock models sees it.
trait Clients {
    /// The clients, the requests on their way, the replies on theirs, and the time.
    fn parts(&mut self) -> (&mut [Peer], &mut Vec<Request>, &mut Vec<Response>, u8);
    /// The same to read: the clients, how many requests and replies are on their way, the time.
    fn peek(&self) -> (&[Peer], usize, usize, u8);
}

/// What the clients and the network may do next in a lock model: each live client's calls in
/// its turn (an acquire while it holds fewer than `max_holds`, only while it believes its
/// holds), its watchdog's renewal (at most once a tick, as every lease / 3 in the client), a
/// give-up, a crash that matters (of a holder, or of a client with a call on its way); the
/// delivery of any request, the reply or loss of any response; a tick until `max_time`.
fn client_actions(
    state: &impl Clients,
    max_requests: u8,
    max_holds: u32,
    max_time: u8,
    actions: &mut Vec<Action>,
) {
    let (clients, requests, responses, now) = state.peek();
    for (i, client) in clients.iter().enumerate() {
        let owner = i as Owner;
        if client.crashed {
            continue;
        }
        let turn_free = client.waiting.is_none();
        let budget = if client.budget > 0 {
            client.budget
        } else {
            max_requests
        };
        let can_send = client.calls < budget;
        let may_take = client.holds < max_holds && (client.believes || client.holds == 0);
        if turn_free && can_send && may_take {
            actions.push(Action::Acquire(owner));
        }
        if turn_free && can_send && client.holds > 0 {
            actions.push(Action::Release(owner));
        }
        // The settle, and a release sent again after a lost reply (`send_again_while_lost`):
        // a release to the count the client knows, fencing the lost ids.
        if turn_free && can_send && !client.lost.is_empty() {
            actions.push(Action::Settle(owner));
        }
        if turn_free && can_send && client.holds == 0 && client.queued {
            actions.push(Action::Leave(owner));
        }
        let due = now > client.leased_at && now > client.renewed_at;
        if client.believes && !client.renewing && due {
            actions.push(Action::Renew(owner));
        }
        if client.waiting.is_some() {
            actions.push(Action::GiveUp(owner));
        }
        if client.holds > 0 || client.waiting.is_some() {
            actions.push(Action::Crash(owner));
        }
    }
    for i in 0..requests {
        actions.push(Action::Deliver(i));
    }
    for i in 0..responses {
        actions.push(Action::Respond(i));
        actions.push(Action::LoseResponse(i));
    }
    if now < max_time {
        actions.push(Action::Tick);
    }
}

/// A client's own step, or the network's loss of a reply, the same in every lock model; false
/// when `action` is none of them. `joins_line`: whether an owner's acquire takes a place in a
/// line (given up, it may have).
fn client_step(
    state: &mut impl Clients,
    action: &Action,
    joins_line: impl Fn(Owner) -> bool,
) -> bool {
    let (clients, requests, responses, now) = state.parts();
    let call = match *action {
        Action::Acquire(owner) => {
            let holds = clients[owner as usize].holds;
            Some((owner, CallKind::Acquire { holds }))
        }
        Action::Release(owner) => {
            let client = &mut clients[owner as usize];
            // The guard's hold ends at the release's invoke; a lost hold gives all back.
            let left = if client.believes { client.holds - 1 } else { 0 };
            client.holds = left;
            client.believes = client.believes && left > 0;
            Some((owner, CallKind::Release { left }))
        }
        // The undo task's settle: a release to what the client knows.
        Action::Settle(owner) => {
            let left = clients[owner as usize].holds;
            Some((owner, CallKind::Release { left }))
        }
        Action::Renew(owner) => Some((owner, CallKind::Renew)),
        Action::Leave(owner) => {
            clients[owner as usize].queued = false;
            Some((owner, CallKind::Leave))
        }
        Action::GiveUp(owner) => {
            let client = &mut clients[owner as usize];
            if let Some(call) = gave_up(client) {
                if let CallKind::Release { left } = call {
                    client.lost_release = Some(left > 0);
                }
                // An acquire given up may have left a place in a line.
                if matches!(call, CallKind::Acquire { .. }) && joins_line(owner) {
                    client.queued = true;
                }
            }
            None
        }
        Action::LoseResponse(i) => {
            responses.remove(i);
            None
        }
        Action::Crash(owner) => {
            // It sends nothing more, and its request ids are not reused.
            let client = &mut clients[owner as usize];
            *client = Peer {
                crashed: true,
                next_req: client.next_req,
                calls: client.calls,
                budget: client.budget,
                ..Peer::default()
            };
            None
        }
        _ => return false,
    };
    if let Some((owner, call)) = call {
        send(clients, requests, now, owner, call);
    }
    true
}

mod lock;
mod permits;
mod rw;
mod wake;

//! Models of the reentrant lock's, the fair lock's, the read-write lock's, the leader
//! election's and the permit semaphore's protocols (issue 35), checked exhaustively to a bound
//! with stateright, and tied to the Lua by differential tests (the permit model is `permits`
//! below, the read-write lock's `rw`; the fair lock and the leader election are the lock model
//! with its `line` or `campaign` set).
//!
//! The model runs the scripts of `lua/lock.lua` (acquire, release, the watchdog's renew) as
//! atomic steps with the same branches (`script` below), the client as the engine runs it (one
//! call at a time per owner, hold counts set not added, lost replies fenced by the owner's next
//! call, resends, settles, watchdog renewals, the renew deadline and the local loss), a network
//! that delays, reorders and loses, key expiry on a server clock that may run up to `DRIFT`
//! ticks ahead of the clients', and crashes. `the_model_matches_the_scripts` runs random
//! states and calls through both `script` and the real scripts on a real server, and compares
//! replies and keys, so the model cannot drift from the Lua.
//!
//! The bound is CI's (the five checks take about 40 s on two cores: this package is built
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

/// The scripts, as the model runs them: one function per script section, each one atomic
/// step, with the same branches as the Lua.
mod script {
    use super::*;

    /// What Redis keeps of one lock: its hash of holds (empty: no key), when the key expires
    /// (a tick of the server's clock), and the fence set of lost requests.
    #[derive(Clone, Debug, Default, Hash, PartialEq, Eq, PartialOrd, Ord)]
    pub struct Server {
        pub holds: BTreeMap<Owner, u32>,
        pub expires: u8,
        pub fences: BTreeSet<(Owner, Req)>,
        /// A fenced lock's token counter (`None`: missing; the Lua seeds it from the server
        /// clock, the model from [`SEED`]).
        pub counter: Option<u64>,
        /// A leader election's record of the standing term, in the hash beside the holds:
        /// who leads (the owner) and its epoch.
        pub term: Option<(Owner, u64)>,
        /// A fair lock's line: its waiters in the queue's order, and when each one's place
        /// ends (a tick of the server's clock; the timeouts zset).
        pub queue: Vec<Owner>,
        pub places: BTreeMap<Owner, u8>,
    }

    /// Where the model's token counter starts when missing.
    pub const SEED: u64 = 100;

    /// A script's reply: nil, an integer, or the STALE error of a fenced request.
    #[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
    pub enum Reply {
        Nil,
        Int(i64),
        Stale,
        /// A fenced lock's first hold: its token, and whether its client counted holds that
        /// were gone.
        Token(u64, bool),
    }

    /// `fences.lua`'s `fenced`: a request found in the fence set does nothing; the lost ids it
    /// carries are fenced. `key` is whose requests they are (an owner field, a permit id).
    pub fn fenced<K: Ord + Copy>(
        fences: &mut BTreeSet<(K, Req)>,
        key: K,
        req: Req,
        lost: &[Req],
    ) -> bool {
        if fences.contains(&(key, req)) {
            return true;
        }
        for &id in lost {
            fences.insert((key, id));
        }
        false
    }

    /// `holds.lua` `grant_hold`: `owner` has the lock, one hold more on a re-entry, else a
    /// first hold (-3 when its client counted holds that are gone).
    fn grant(
        server: &mut Server,
        now: u8,
        owner: Owner,
        lease: u8,
        holds: u32,
        reentry: bool,
    ) -> Reply {
        server
            .holds
            .insert(owner, if reentry { holds + 1 } else { 1 });
        server.expires = now + lease;
        if !reentry && holds > 0 {
            Reply::Int(-3)
        } else {
            Reply::Nil
        }
    }

    /// `lock.lua` `acquire` (`holds.lua` `take_hold`): nil when the owner holds it after the
    /// call (-3 for a first hold although its client counted more), else the remaining TTL.
    pub fn acquire(
        server: &mut Server,
        now: u8,
        owner: Owner,
        lease: u8,
        holds: u32,
        req: Req,
        lost: &[Req],
    ) -> Reply {
        if fenced(&mut server.fences, owner, req, lost) {
            return Reply::Stale;
        }
        if server.holds.is_empty() || server.holds.contains_key(&owner) {
            let reentry = !server.holds.is_empty();
            return grant(server, now, owner, lease, holds, reentry);
        }
        Reply::Int(i64::from(server.expires - now))
    }

    /// `fenced_lock.lua` `acquire` (`tokens.lua` `take_with_token`): the reentrant acquire,
    /// and a first hold (or one that found its counted holds gone) takes the next token; a
    /// re-entry its client counts keeps its first hold's.
    pub fn fenced_acquire(
        server: &mut Server,
        now: u8,
        owner: Owner,
        lease: u8,
        holds: u32,
        req: Req,
        lost: &[Req],
    ) -> Reply {
        match acquire(server, now, owner, lease, holds, req, lost) {
            Reply::Nil if holds > 0 => Reply::Nil,
            reply @ (Reply::Nil | Reply::Int(-3)) => {
                let token = server.counter.unwrap_or(SEED) + 1;
                server.counter = Some(token);
                Reply::Token(token, reply == Reply::Int(-3))
            }
            busy => busy,
        }
    }

    /// `leader.lua` `acquire`: the fenced acquire, whose epochs are the tokens; a new term
    /// records who leads and its epoch in the hash.
    pub fn leader_acquire(
        server: &mut Server,
        now: u8,
        owner: Owner,
        lease: u8,
        holds: u32,
        req: Req,
        lost: &[Req],
    ) -> Reply {
        let reply = fenced_acquire(server, now, owner, lease, holds, req, lost);
        if let Reply::Token(epoch, _) = reply {
            server.term = Some((owner, epoch));
        }
        reply
    }

    /// `lock.lua` `release`: `give_back` after the fence.
    pub fn release(
        server: &mut Server,
        now: u8,
        owner: Owner,
        lease: u8,
        left: u32,
        req: Req,
        lost: &[Req],
    ) -> Reply {
        if fenced(&mut server.fences, owner, req, lost) {
            return Reply::Stale;
        }
        give_back(server, now, owner, lease, left)
    }

    /// `holds.lua` `give_back_holds`: nil when the owner held nothing, 0 when holds remain
    /// (the lease set again unless 0), 1 when the last went.
    fn give_back(server: &mut Server, now: u8, owner: Owner, lease: u8, left: u32) -> Reply {
        if left == 0 {
            return match server.holds.remove(&owner) {
                Some(_) => Reply::Int(1),
                None => Reply::Nil,
            };
        }
        let Some(count) = server.holds.get_mut(&owner) else {
            return Reply::Nil;
        };
        *count = left;
        if lease != 0 {
            server.expires = now + lease;
        }
        Reply::Int(0)
    }

    /// `leader.lua` `release`: the lock's release; when the owner's last hold goes the term
    /// ends and its record (the whole key) goes with it.
    pub fn leader_release(
        server: &mut Server,
        now: u8,
        owner: Owner,
        lease: u8,
        left: u32,
        req: Req,
        lost: &[Req],
    ) -> Reply {
        let reply = release(server, now, owner, lease, left, req, lost);
        if reply == Reply::Int(1) {
            server.holds.clear();
            server.term = None;
        }
        reply
    }

    /// `fair_lock.lua` `purge`: drops the waiters whose places ended by `now`, wherever they
    /// stand, then any head without a place unless it is `caller`; the head after that.
    fn purge(server: &mut Server, now: u8, caller: Option<Owner>) -> Option<Owner> {
        let ended: Vec<Owner> = server
            .places
            .iter()
            .filter(|(_, &end)| end <= now)
            .map(|(&owner, _)| owner)
            .collect();
        server.queue.retain(|owner| !ended.contains(owner));
        server.places.retain(|_, end| *end > now);
        while let Some(&head) = server.queue.first() {
            if Some(head) == caller || server.places.contains_key(&head) {
                break;
            }
            server.queue.remove(0);
        }
        server.queue.first().copied()
    }

    /// `fair_lock.lua` `acquire`: a re-entry, or a free lock whose line is empty or headed by
    /// the caller, is granted (the caller leaves the line); otherwise, with a `place`, the
    /// caller joins the line's end (or keeps its spot, its place started again) and hears the
    /// lock's TTL, or when the free lock's first waiter's place ends.
    #[allow(clippy::too_many_arguments)]
    pub fn fair_acquire(
        server: &mut Server,
        now: u8,
        owner: Owner,
        lease: u8,
        place: u8,
        holds: u32,
        req: Req,
        lost: &[Req],
    ) -> Reply {
        if fenced(&mut server.fences, owner, req, lost) {
            return Reply::Stale;
        }
        let free = server.holds.is_empty();
        let reentry = server.holds.contains_key(&owner);
        let head = purge(server, now, Some(owner));
        if reentry || (free && (head.is_none() || head == Some(owner))) {
            if head == Some(owner) {
                server.queue.remove(0);
                server.places.remove(&owner);
            }
            return grant(server, now, owner, lease, holds, reentry);
        }
        if place > 0 && server.places.insert(owner, now + place).is_none() {
            server.queue.push(owner);
        }
        match head.filter(|_| free) {
            Some(first) => Reply::Int(i64::from(server.places[&first] - now).max(1)),
            None => Reply::Int(i64::from(server.expires - now)),
        }
    }

    /// `fair_lock.lua` `release`: the lock's release after the fence and the purge.
    pub fn fair_release(
        server: &mut Server,
        now: u8,
        owner: Owner,
        lease: u8,
        left: u32,
        req: Req,
        lost: &[Req],
    ) -> Reply {
        if fenced(&mut server.fences, owner, req, lost) {
            return Reply::Stale;
        }
        purge(server, now, None);
        give_back(server, now, owner, lease, left)
    }

    /// `fair_lock.lua` `leave`: the waiter's place and spot go; 1 when it was in the line.
    pub fn fair_leave(server: &mut Server, now: u8, owner: Owner, req: Req, lost: &[Req]) -> Reply {
        if fenced(&mut server.fences, owner, req, lost) {
            return Reply::Stale;
        }
        purge(server, now, None);
        server.places.remove(&owner);
        let queued = server.queue.contains(&owner);
        server.queue.retain(|&waiter| waiter != owner);
        Reply::Int(i64::from(queued))
    }

    /// `lock.lua` `renew` for one key: extended only while the owner's field is there.
    pub fn renew(server: &mut Server, now: u8, owner: Owner, lease: u8) -> Reply {
        if server.holds.contains_key(&owner) {
            server.expires = now + lease;
            Reply::Int(1)
        } else {
            Reply::Int(0)
        }
    }
}

use script::{Reply, Server};

/// The model's bounds and the client's settings, in ticks.
#[derive(Clone, Debug)]
struct Lock {
    clients: u8,
    /// The watchdog lease.
    lease: u8,
    /// How long after the send of the last confirmed acquire or renewal a client still believes
    /// it holds (`renew_deadline`).
    renew_deadline: u8,
    /// How far the server's clock may run ahead of the clients'.
    drift: u8,
    /// The last tick explored.
    max_time: u8,
    /// Requests each client may send in all.
    max_requests: u8,
    /// Whether the scripts fence lost requests (false only to see the model fail without).
    fences: bool,
    /// Whether the clients campaign in a leader election (`leader.lua`'s acquire and release,
    /// which keep the term's record) instead of taking the fenced lock.
    campaign: bool,
    /// Whether the lock is a fair lock (`fair_lock.lua`: a line of waiters), and how.
    line: Line,
    /// How long a fair lock's waiter keeps its place without asking again.
    place: u8,
    /// Whether a leave's reply settles the lost calls it fences (true only to see the model
    /// fail: the engine's rule until this model found the hold it left).
    leave_settles: bool,
}

/// The fair lock's line in the model: none (the fenced lock), the script's, or one broken on
/// purpose to see the properties fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Line {
    None,
    Fair,
    /// A free lock goes to whoever asks, whoever waits.
    WalkIns,
    /// Places never end: a dead waiter is never dropped.
    KeepsEnded,
}

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
    /// Ids whose replies were lost, fenced by the next call.
    lost: Vec<Req>,
    /// The call in the owner's turn, waiting for its reply.
    waiting: Option<(Req, CallKind, u8)>,
    /// A renewal on its way (the watchdog's, outside the turn).
    renewing: bool,
    crashed: bool,
    /// The fencing token of its first hold.
    token: Option<u64>,
    /// A fair lock's waiter that may have a place in the line: it asked and was not granted.
    queued: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct State {
    now: u8,
    server: Server,
    clients: Vec<Peer>,
    requests: Vec<Request>,
    responses: Vec<Response>,
    /// A fair lock's waiters in the order their places began (a place that ends, or goes
    /// with its grant or leave, takes its waiter out; a new one comes last): arrival order,
    /// kept beside the scripts rather than read from the queue they write.
    arrivals: Vec<Owner>,
    /// A fair lock's first hold went to one while another who came earlier kept a place.
    passed_over: bool,
    /// After a fair lock's script another than its caller stood in line past its place.
    stood_past_its_place: bool,
    /// What happened at least once, for the "sometimes" properties.
    seen: BTreeSet<Seen>,
}

/// States differ by what they hold, not by what happened on the way there: `seen` is left out
/// of the fingerprint, or every path would be a state of its own. A "sometimes" property can
/// then be missed (never wrongly found), which fails the check instead of passing it.
impl std::hash::Hash for State {
    fn hash<H: std::hash::Hasher>(&self, hasher: &mut H) {
        (
            self.now,
            &self.server,
            &self.clients,
            &self.requests,
            &self.responses,
            &self.arrivals,
            self.passed_over,
            self.stood_past_its_place,
        )
            .hash(hasher);
    }
}

impl State {
    /// The state with its clients renamed in the order of what each one has: its own side, its
    /// holds, fences, term, place in line and place's end on the server, its arrival, its calls
    /// and replies on the way. Clients are interchangeable in the lock models (every one runs
    /// the same steps and every property reads them all alike), so states that differ only by
    /// their names are one state to the protocol: the checker explores one of each.
    fn representative(&self) -> State {
        let key = |owner: Owner| {
            let client = &self.clients[owner as usize];
            let fences: Vec<Req> = (self.server.fences.iter())
                .filter(|&&(fenced, _)| fenced == owner)
                .map(|&(_, req)| req)
                .collect();
            let requests: Vec<_> = (self.requests.iter())
                .filter(|request| request.owner == owner)
                .map(|request| (request.req, request.call, &request.lost, request.sent_at))
                .collect();
            let responses: Vec<_> = (self.responses.iter())
                .filter(|response| response.owner == owner)
                .map(|response| (response.req, response.reply))
                .collect();
            (
                client,
                self.server.holds.get(&owner),
                fences,
                self.server.term.filter(|&(leader, _)| leader == owner),
                self.server.queue.iter().position(|&waiter| waiter == owner),
                self.server.places.get(&owner),
                self.arrivals.iter().position(|&waiter| waiter == owner),
                requests,
                responses,
            )
        };
        let mut order: Vec<Owner> = (0..self.clients.len() as Owner).collect();
        order.sort_by_cached_key(|&owner| key(owner));
        let mut names = vec![0; order.len()];
        for (new, &old) in order.iter().enumerate() {
            names[old as usize] = new as Owner;
        }
        let name = |owner: Owner| names[owner as usize];
        let server = &self.server;
        let mut requests: Vec<Request> = (self.requests.iter())
            .map(|request| Request {
                owner: name(request.owner),
                ..request.clone()
            })
            .collect();
        requests.sort();
        let mut responses: Vec<Response> = (self.responses.iter())
            .map(|response| Response {
                owner: name(response.owner),
                ..response.clone()
            })
            .collect();
        responses.sort();
        State {
            now: self.now,
            server: Server {
                holds: server.holds.iter().map(|(&o, &n)| (name(o), n)).collect(),
                fences: server
                    .fences
                    .iter()
                    .map(|&(o, req)| (name(o), req))
                    .collect(),
                term: server.term.map(|(leader, epoch)| (name(leader), epoch)),
                queue: server.queue.iter().map(|&o| name(o)).collect(),
                places: server
                    .places
                    .iter()
                    .map(|(&o, &end)| (name(o), end))
                    .collect(),
                ..server.clone()
            },
            clients: order
                .iter()
                .map(|&o| self.clients[o as usize].clone())
                .collect(),
            requests,
            responses,
            arrivals: self.arrivals.iter().map(|&o| name(o)).collect(),
            passed_over: self.passed_over,
            stood_past_its_place: self.stood_past_its_place,
            seen: (self.seen.iter())
                .map(|&seen| match seen {
                    Seen::HeldBy(o) => Seen::HeldBy(name(o)),
                    other => other,
                })
                .collect(),
        }
    }
}

impl Clients for State {
    fn parts(&mut self) -> (&mut [Peer], &mut Vec<Request>, &mut Vec<Response>, u8) {
        (
            &mut self.clients,
            &mut self.requests,
            &mut self.responses,
            self.now,
        )
    }
    fn peek(&self) -> (&[Peer], usize, usize, u8) {
        (
            &self.clients,
            self.requests.len(),
            self.responses.len(),
            self.now,
        )
    }
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
enum Seen {
    Held,
    Reentered,
    ResentAndWon,
    Fenced,
    Expired,
    LostLocally,
    HandedOver,
    /// A fair lock's first hold went to a waiter from the line.
    ServedInTurn,
    /// A fair lock, free, was refused to one because an earlier waiter came first.
    WaitedItsTurn,
    /// A dead waiter's place ended and it was dropped from the line.
    DeadWaiterDropped,
    /// A waiter left the line.
    Left,
    /// Which owners the server has given the lock to (last in the order, for `range`).
    HeldBy(Owner),
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

impl Lock {
    fn run(&self, server: &mut Server, now: u8, request: &Request) -> Reply {
        let lost: &[Req] = if self.fences { &request.lost } else { &[] };
        if !self.fences {
            // Without fences nothing is ever fenced: the model of the broken script.
            let mut unfenced = server.clone();
            unfenced.fences.clear();
            let reply = self.call(&mut unfenced, now, request, lost);
            unfenced.fences = server.fences.clone();
            *server = unfenced;
            return reply;
        }
        self.call(server, now, request, lost)
    }

    fn call(&self, server: &mut Server, now: u8, request: &Request, lost: &[Req]) -> Reply {
        if self.line != Line::None {
            return self.fair_call(server, now, request, lost);
        }
        let (owner, req) = (request.owner, request.req);
        match request.call {
            CallKind::Acquire { holds } if self.campaign => {
                script::leader_acquire(server, now, owner, self.lease, holds, req, lost)
            }
            CallKind::Acquire { holds } => {
                script::fenced_acquire(server, now, owner, self.lease, holds, req, lost)
            }
            CallKind::Release { left } if self.campaign => {
                script::leader_release(server, now, owner, self.lease, left, req, lost)
            }
            CallKind::Release { left } => {
                script::release(server, now, owner, self.lease, left, req, lost)
            }
            CallKind::Renew => script::renew(server, now, owner, self.lease),
            CallKind::Leave => unreachable!("only a fair lock's waiter leaves"),
        }
    }

    /// A fair lock's call: `fair_lock.lua`'s scripts, or their broken forms.
    fn fair_call(&self, server: &mut Server, now: u8, request: &Request, lost: &[Req]) -> Reply {
        let (owner, req, lease) = (request.owner, request.req, self.lease);
        match (request.call, self.line) {
            (CallKind::Acquire { holds }, Line::WalkIns) if server.holds.is_empty() => {
                script::acquire(server, now, owner, lease, holds, req, lost)
            }
            (_, Line::KeepsEnded) => {
                let ends = std::mem::take(&mut server.places);
                server.places = ends.keys().map(|&waiter| (waiter, u8::MAX)).collect();
                let fair = Lock {
                    line: Line::Fair,
                    ..self.clone()
                };
                let reply = fair.fair_call(server, now, request, lost);
                for (waiter, end) in &mut server.places {
                    *end = ends.get(waiter).copied().unwrap_or(*end);
                }
                reply
            }
            (CallKind::Acquire { holds }, _) => {
                script::fair_acquire(server, now, owner, lease, self.place, holds, req, lost)
            }
            (CallKind::Release { left }, _) => {
                script::fair_release(server, now, owner, lease, left, req, lost)
            }
            (CallKind::Leave, _) => script::fair_leave(server, now, owner, req, lost),
            (CallKind::Renew, _) => script::renew(server, now, owner, lease),
        }
    }

    /// What a fair lock's script did to the line, against the arrival order kept beside it:
    /// a first hold that passed over an earlier waiter with a place, a waiter left standing
    /// past its place, and what the "sometimes" properties look for.
    fn watch_line(&self, state: &mut State, before: &Server, request: &Request) {
        let (now, owner) = (state.now, request.owner);
        let server = &state.server;
        if !before.holds.contains_key(&owner) && server.holds.contains_key(&owner) {
            let live = |waiter: &Owner| before.places.get(waiter).is_some_and(|&end| end > now);
            let earlier = state.arrivals.iter().take_while(|&&waiter| waiter != owner);
            state.passed_over |= earlier.clone().any(live);
            if state.arrivals.contains(&owner) {
                state.seen.insert(Seen::ServedInTurn);
            }
        } else if before.holds.is_empty() && matches!(request.call, CallKind::Acquire { .. }) {
            state.seen.insert(Seen::WaitedItsTurn);
        }
        for waiter in before.places.keys() {
            if !server.places.contains_key(waiter) && state.clients[*waiter as usize].crashed {
                state.seen.insert(Seen::DeadWaiterDropped);
            }
        }
        state.stood_past_its_place |= server.queue.iter().any(|&waiter| {
            waiter != owner && server.places.get(&waiter).is_none_or(|&end| end <= now)
        });
        state
            .arrivals
            .retain(|waiter| server.places.contains_key(waiter));
        for &waiter in server.places.keys() {
            if !before.places.contains_key(&waiter) {
                state.arrivals.push(waiter);
            }
        }
    }
}

/// The client's side shared by the lock models (the lock's, the fair lock's and the leader
/// election's, and the read-write lock's): sends `call` of `owner`'s at `now`, in its turn (a
/// renewal outside it), with the lost ids it fences (none for a renewal; a leave fences them
/// but leaves them to the settle, unless `leave_settles`).
fn send(
    clients: &mut [Peer],
    requests: &mut Vec<Request>,
    now: u8,
    owner: Owner,
    call: CallKind,
    leave_settles: bool,
) {
    let client = &mut clients[owner as usize];
    let req = client.next_req;
    client.next_req += 1;
    let lost = match call {
        CallKind::Renew => Vec::new(),
        CallKind::Leave if !leave_settles => client.lost.clone(),
        _ => std::mem::take(&mut client.lost),
    };
    if call == CallKind::Renew {
        client.renewing = true;
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

/// A renewal's reply, read with its send time as the watchdog reads it: a confirmed renewal
/// moves the owner's lease on, a refused one is a loss. None when the reply is not there.
fn renewal_answered(
    responses: &mut Vec<Response>,
    client: &mut Peer,
    request: &Request,
) -> Option<()> {
    let response = responses
        .iter()
        .position(|r| r.owner == request.owner && r.req == request.req)?;
    let response = responses.remove(response);
    client.renewing = false;
    if !client.crashed {
        match response.reply {
            Reply::Int(1) if client.believes => {
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
        let can_send = client.next_req < max_requests;
        let may_take = client.holds < max_holds && (client.believes || client.holds == 0);
        if turn_free && can_send && may_take {
            actions.push(Action::Acquire(owner));
        }
        if turn_free && can_send && client.holds > 0 {
            actions.push(Action::Release(owner));
        }
        if turn_free && can_send && client.holds == 0 && !client.lost.is_empty() {
            actions.push(Action::Settle(owner));
        }
        if turn_free && can_send && client.holds == 0 && client.queued {
            actions.push(Action::Leave(owner));
        }
        if client.believes && !client.renewing && can_send && now > client.leased_at {
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
    leave_settles: bool,
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
            if let Some((req, call, _)) = client.waiting.take() {
                client.lost.push(req);
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
                ..Peer::default()
            };
            None
        }
        _ => return false,
    };
    if let Some((owner, call)) = call {
        send(clients, requests, now, owner, call, leave_settles);
    }
    true
}

impl Model for Lock {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            now: 0,
            server: Server::default(),
            clients: vec![Peer::default(); self.clients as usize],
            requests: Vec::new(),
            responses: Vec::new(),
            arrivals: Vec::new(),
            passed_over: false,
            stood_past_its_place: false,
            seen: BTreeSet::new(),
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        client_actions(state, self.max_requests, 2, self.max_time, actions);
        if !state.server.holds.is_empty() && state.now + self.drift >= state.server.expires {
            actions.push(Action::Expire);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut state = last.clone();
        let line = self.line != Line::None;
        if client_step(&mut state, &action, self.leave_settles, |_| line) {
            return Some(state);
        }
        match action {
            Action::Deliver(i) => {
                let request = state.requests.remove(i);
                // What a fair lock's line was, to see what the script did to it.
                let before = (self.line != Line::None).then(|| state.server.clone());
                let reply = self.run(&mut state.server, state.now, &request);
                if reply == Reply::Stale {
                    state.seen.insert(Seen::Fenced);
                } else if let Some(before) = before.filter(|_| request.call != CallKind::Renew) {
                    self.watch_line(&mut state, &before, &request);
                    if request.call == CallKind::Leave && reply == Reply::Int(1) {
                        state.seen.insert(Seen::Left);
                    }
                }
                for &owner in state.server.holds.keys() {
                    state.seen.insert(Seen::HeldBy(owner));
                }
                if state.seen.range(Seen::HeldBy(0)..).count() > 1 {
                    state.seen.insert(Seen::HandedOver);
                }
                state.responses.push(Response {
                    owner: request.owner,
                    req: request.req,
                    reply,
                });
                state.responses.sort();
                if request.call == CallKind::Renew {
                    let client = &mut state.clients[request.owner as usize];
                    renewal_answered(&mut state.responses, client, &request)?;
                }
            }
            Action::Respond(i) => {
                let response = state.responses.remove(i);
                let now = state.now;
                let client = &mut state.clients[response.owner as usize];
                let Some((req, call, sent_at)) = client.waiting else {
                    return Some(state); // nobody waits for it: dropped
                };
                if req != response.req || client.crashed {
                    return Some(state);
                }
                client.waiting = None;
                if let CallKind::Acquire { .. } = call {
                    match response.reply {
                        Reply::Nil | Reply::Token(..) | Reply::Int(-3) => {
                            if let Reply::Token(token, afresh) = response.reply {
                                if afresh {
                                    client.holds = 0; // the holds it counted are gone
                                }
                                client.token = Some(token);
                            }
                            if response.reply == Reply::Int(-3) {
                                client.holds = 0;
                            }
                            client.queued = false;
                            if client.holds > 0 {
                                state.seen.insert(Seen::Reentered);
                            }
                            if !client.lost.is_empty() || sent_at < now {
                                state.seen.insert(Seen::ResentAndWon);
                            }
                            client.holds += 1;
                            client.leased_at = sent_at;
                            // A reply that comes after the renew deadline of its send is a
                            // hold known lost at once (the engine counts from the send).
                            client.believes = now < sent_at + self.renew_deadline;
                            state.seen.insert(if client.believes {
                                Seen::Held
                            } else {
                                Seen::LostLocally
                            });
                        }
                        // Refused: a fair lock's waiter has its place in the line.
                        _ => client.queued = self.line != Line::None,
                    }
                }
            }
            Action::Tick => {
                state.now += 1;
                let now = state.now;
                // By the server's clock the key is gone by now at the latest.
                if !state.server.holds.is_empty() && now >= state.server.expires {
                    state.server.holds.clear();
                    state.server.term = None;
                    state.seen.insert(Seen::Expired);
                }
                if deadlines_pass(&mut state.clients, now, self.renew_deadline) {
                    state.seen.insert(Seen::LostLocally);
                }
            }
            Action::Expire => {
                state.server.holds.clear();
                state.server.term = None;
                state.seen.insert(Seen::Expired);
            }
            _ => unreachable!("a client's own step"),
        }
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(
                "no two owners believe they hold the lock",
                |_, state: &State| {
                    state
                        .clients
                        .iter()
                        .filter(|client| client.believes)
                        .count()
                        <= 1
                },
            ),
            Property::always(
                "settled, the server's count is the client's",
                |_, state: &State| {
                    state.clients.iter().enumerate().all(|(i, client)| {
                        let owner = i as Owner;
                        let on_its_way = client.waiting.is_some()
                            || state.requests.iter().any(|r| r.owner == owner)
                            || !client.lost.is_empty();
                        if client.crashed || on_its_way {
                            return true;
                        }
                        match state.server.holds.get(&owner) {
                            // Gone (expired, or lost): its owner learns of it; never extra holds.
                            None => true,
                            Some(&count) => client.holds > 0 && count == client.holds,
                        }
                    })
                },
            ),
            Property::always("a believed hold is on the server", |_, state: &State| {
                state.clients.iter().enumerate().all(|(i, client)| {
                    !client.believes || state.server.holds.contains_key(&(i as Owner))
                })
            }),
            Property::always(
                "a believer's token is the last issued (every later holder's is greater)",
                |_, state: &State| {
                    state
                        .clients
                        .iter()
                        .all(|client| !client.believes || client.token == state.server.counter)
                },
            ),
            Property::always(
                "a believing leader's term is the standing one (its identity and epoch)",
                |model: &Lock, state: &State| {
                    !model.campaign
                        || state.clients.iter().enumerate().all(|(i, client)| {
                            !client.believes
                                || (client.token.is_some()
                                    && state.server.term == client.token.map(|t| (i as Owner, t)))
                        })
                },
            ),
            Property::always("a fair lock grants in arrival order", |_, state: &State| {
                !state.passed_over
            }),
            Property::always(
                "no waiter stands in a fair lock's line past its place",
                |_, state: &State| !state.stood_past_its_place,
            ),
            Property::sometimes("held", |_, state: &State| state.seen.contains(&Seen::Held)),
            Property::sometimes("re-entered", |_, state: &State| {
                state.seen.contains(&Seen::Reentered)
            }),
            Property::sometimes("a late call was fenced", |_, state: &State| {
                state.seen.contains(&Seen::Fenced)
            }),
            Property::sometimes("a resend after a lost reply won", |_, state: &State| {
                state.seen.contains(&Seen::ResentAndWon)
            }),
            Property::sometimes("a lease expired", |_, state: &State| {
                state.seen.contains(&Seen::Expired)
            }),
            Property::sometimes("a guard learnt of its loss", |_, state: &State| {
                state.seen.contains(&Seen::LostLocally)
            }),
            Property::sometimes("the lock changed hands", |_, state: &State| {
                state.seen.contains(&Seen::HandedOver)
            }),
            Property::sometimes(
                "a waiter was served from the line",
                |model: &Lock, state: &State| {
                    model.line == Line::None || state.seen.contains(&Seen::ServedInTurn)
                },
            ),
            Property::sometimes(
                "a free fair lock was refused for an earlier waiter",
                |model: &Lock, state: &State| {
                    model.line == Line::None || state.seen.contains(&Seen::WaitedItsTurn)
                },
            ),
            Property::sometimes(
                "a dead waiter was dropped",
                |model: &Lock, state: &State| {
                    model.line == Line::None || state.seen.contains(&Seen::DeadWaiterDropped)
                },
            ),
            Property::sometimes("a waiter left the line", |model: &Lock, state: &State| {
                model.line == Line::None || state.seen.contains(&Seen::Left)
            }),
        ]
    }
}

/// A bound of the check: the environment variable `name` (for a longer run), else `default`.
fn bound(name: &str, default: u8) -> u8 {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

/// A state's representative among those that differ only by the names of interchangeable
/// clients.
type Representative<M> = fn(&<M as Model>::State) -> <M as Model>::State;

/// Explores every state of `model` to its bound and fails on any property broken or any
/// "sometimes" never reached.
///
/// Depth first: the checker keeps only the fingerprints of the states it has seen and the path
/// it is on, tens of MB where a breadth-first search took GB, in about half the time here.
/// With a `symmetry`, one state of each class is explored.
fn check_to_the_bound<M>(model: M, symmetry: Option<Representative<M>>)
where
    M: Model + Send + Sync + 'static,
    M::State: std::fmt::Debug + std::hash::Hash + Clone + PartialEq + Send + Sync + 'static,
    M::Action: std::fmt::Debug + Clone + PartialEq,
{
    let started = std::time::Instant::now();
    let mut builder = model.checker().threads(2);
    if let Some(representative) = symmetry {
        builder = builder.symmetry_fn(representative);
    }
    let checker = builder.spawn_dfs().join();
    println!(
        "{} states in {:?}",
        checker.unique_state_count(),
        started.elapsed()
    );
    checker.assert_properties();
}

/// The steps of a counterexample to `property` in `model` (a negative control), found by the
/// checker as `check_to_the_bound` runs it (so that a representative which hid states would
/// show here too), stopped at the first one; fails when there is none.
fn counterexample<M>(
    model: M,
    property: &'static str,
    symmetry: Option<Representative<M>>,
) -> Vec<M::Action>
where
    M: Model + Send + Sync + 'static,
    M::State: std::fmt::Debug + std::hash::Hash + Clone + PartialEq + Send + Sync + 'static,
    M::Action: std::fmt::Debug + Clone + PartialEq,
{
    let mut builder = model
        .checker()
        .finish_when(HasDiscoveries::AnyOf(BTreeSet::from([property])))
        .threads(2);
    if let Some(representative) = symmetry {
        builder = builder.symmetry_fn(representative);
    }
    let checker = builder.spawn_dfs().join();
    checker.assert_any_discovery(property).into_actions()
}

/// The bound CI checks: 2 clients, a lease of 3 ticks renewed before a deadline of 2, a server
/// clock up to 1 tick ahead, 3 ticks, 2 calls per client (which covers a lost reply, its resend,
/// a late arrival of the first, an expiry and a hand-over: the "sometimes" properties say each
/// is reached).
fn bounded_lock() -> Lock {
    Lock {
        clients: bound("FREDLOCK_MODEL_CLIENTS", 2),
        lease: 3,
        renew_deadline: 2,
        drift: 1,
        max_time: bound("FREDLOCK_MODEL_TICKS", 3),
        max_requests: bound("FREDLOCK_MODEL_CALLS", 2),
        fences: true,
        campaign: false,
        line: Line::None,
        place: 0,
        leave_settles: false,
    }
}

#[test]
fn the_reentrant_lock_protocol_holds_to_the_bound() {
    check_to_the_bound(bounded_lock(), Some(State::representative));
}

/// The leader election's terms: the same model with every client campaigning (`leader.lua`'s
/// acquire and release): no two believe they lead, a believing leader's epoch is the last
/// issued (epochs only grow) and its term is the one on record; the lock's bound.
#[test]
fn the_leader_election_protocol_holds_to_the_bound() {
    check_to_the_bound(
        Lock {
            campaign: true,
            ..bounded_lock()
        },
        Some(State::representative),
    );
}

/// The fair lock (`fair_lock.lua`): every client waits in the line with a place of 2 ticks,
/// may leave it, and may die in it. Besides the lock's properties: a first hold never passes
/// over a waiter who came earlier and keeps its place (arrival order), and after every script
/// nobody but its caller stands in line past its place (a dead waiter is dropped). 2 ticks
/// reach every "sometimes" (a place and a lease both end in them); 3 ticks (3.75 M states)
/// take twice as long, which CI's two minutes for all the checks cannot spare.
fn bounded_fair_lock() -> Lock {
    Lock {
        line: Line::Fair,
        place: 2,
        max_time: bound("FREDLOCK_MODEL_TICKS", 2),
        ..bounded_lock()
    }
}

#[test]
fn the_fair_lock_protocol_holds_to_the_bound() {
    check_to_the_bound(bounded_fair_lock(), Some(State::representative));
}

/// The fair model fails where a broken line would: a free lock given to whoever asks passes
/// over an earlier waiter; places that never end keep a dead waiter in line; and a leave whose
/// reply settled the lost acquire it fenced (the engine's rule before) leaves a hold nobody
/// counts.
#[test]
fn the_fair_model_fails_with_walk_ins_kept_places_or_a_settling_leave() {
    let walk_ins = Lock {
        line: Line::WalkIns,
        ..bounded_fair_lock()
    };
    let steps = counterexample(
        walk_ins,
        "a fair lock grants in arrival order",
        Some(State::representative),
    );
    println!("walk-ins: {steps:?}");
    let kept = Lock {
        line: Line::KeepsEnded,
        ..bounded_fair_lock()
    };
    let steps = counterexample(
        kept,
        "no waiter stands in a fair lock's line past its place",
        Some(State::representative),
    );
    println!("places that never end: {steps:?}");
    let settling = Lock {
        leave_settles: true,
        ..bounded_fair_lock()
    };
    let steps = counterexample(
        settling,
        "settled, the server's count is the client's",
        Some(State::representative),
    );
    println!("a leave that settles: {steps:?}");
}

/// The model fails where the protocol would: without fences (a late acquire leaves a hold
/// nobody counts), and with a renew deadline no shorter than the lease less the drift.
#[test]
fn the_model_fails_without_fences_or_margin() {
    let unfenced = Lock {
        fences: false,
        ..bounded_lock()
    };
    let steps = counterexample(
        unfenced,
        "settled, the server's count is the client's",
        Some(State::representative),
    );
    println!("without fences: {steps:?}");
    let late = Lock {
        renew_deadline: 3,
        ..bounded_lock()
    };
    let steps = counterexample(
        late,
        "no two owners believe they hold the lock",
        Some(State::representative),
    );
    println!("deadline = lease: {steps:?}");
}

/// One tick of the model, in milliseconds on the real server: long enough that no key expires
/// while a case runs.
const TICK_MS: i64 = 10_000;

/// The fenced lock's token counter in the differential test.
const COUNTER: &str = "{model}:counter";

fn field(owner: Owner) -> String {
    format!("1b4e28ba-2fa1-11d2-883f-0016d3cca427:{owner}")
}

/// Writes `server` to Redis at key `name` (its fences at `fences`), as of server tick `now`.
async fn load(raw: &Client, name: &str, fences: &str, server: &Server, now: u8) {
    let _: i64 = raw.del(vec![name, fences, COUNTER]).await.unwrap();
    if let Some(counter) = server.counter {
        let _: () = raw.set(COUNTER, counter, None, None, false).await.unwrap();
    }
    if !server.holds.is_empty() {
        let fields: Vec<(String, u32)> = server
            .holds
            .iter()
            .map(|(&owner, &count)| (field(owner), count))
            .collect();
        let _: i64 = raw.hset(name, fields).await.unwrap();
        if let Some((owner, epoch)) = server.term {
            let record = [
                ("leader:identity", format!("pod-{owner}")),
                ("leader:epoch", epoch.to_string()),
                ("leader:since", "1795000000000".to_string()),
            ];
            let _: i64 = raw.hset(name, record.to_vec()).await.unwrap();
        }
        let ms = i64::from(server.expires - now) * TICK_MS;
        let _: bool = raw.pexpire(name, ms, None).await.unwrap();
    }
    if !server.fences.is_empty() {
        let members: Vec<String> = server
            .fences
            .iter()
            .map(|&(owner, req)| format!("{}:{req}", field(owner)))
            .collect();
        let _: i64 = raw.sadd(fences, members).await.unwrap();
    }
}

/// Reads Redis back as the model's server at tick `now`.
async fn read(raw: &Client, name: &str, fences: &str, now: u8) -> Server {
    let fields: std::collections::HashMap<String, String> = raw.hgetall(name).await.unwrap();
    let mut server = Server::default();
    for (key, value) in &fields {
        if !key.starts_with("leader:") {
            let owner = owner_of(key);
            server.holds.insert(owner, value.parse().unwrap());
        }
    }
    if let (Some(identity), Some(epoch)) =
        (fields.get("leader:identity"), fields.get("leader:epoch"))
    {
        let owner = identity.strip_prefix("pod-").unwrap().parse().unwrap();
        server.term = Some((owner, epoch.parse().unwrap()));
    }
    if !server.holds.is_empty() {
        let pttl: i64 = raw.pttl(name).await.unwrap();
        server.expires = now + ((pttl + TICK_MS - 1) / TICK_MS) as u8;
    }
    server.counter = raw.get(COUNTER).await.unwrap();
    let members: Vec<String> = raw.smembers(fences).await.unwrap();
    for member in members {
        let mut parts = member.rsplitn(3, ':');
        let req = parts.next().unwrap().parse().unwrap();
        let owner = parts.next().unwrap().parse().unwrap();
        server.fences.insert((owner, req));
    }
    server
}

/// An acquire step of the model: server, now, owner, lease, holds, request id, lost ids.
type Step = fn(&mut Server, u8, Owner, u8, u32, Req, &[Req]) -> Reply;

/// The real script's reply as the model's.
fn reply(value: Result<Value, fred::error::Error>, millis: bool) -> Reply {
    match value {
        Ok(Value::Null) => Reply::Nil,
        Ok(Value::Integer(n)) if millis && n > 0 => Reply::Int((n + TICK_MS - 1) / TICK_MS),
        Ok(Value::Integer(n)) => Reply::Int(n),
        Ok(Value::Array(pair)) => match pair.as_slice() {
            [Value::Integer(token), Value::Integer(afresh)] => {
                Reply::Token(*token as u64, *afresh == 1)
            }
            other => panic!("unexpected reply {other:?}"),
        },
        Err(error) if error.details().contains("STALE") => Reply::Stale,
        other => panic!("unexpected reply {other:?}"),
    }
}

/// Random states and calls through the model's scripts and the real ones: the same replies
/// and the same keys after, for every case. A script changed without the model (or the model
/// without the script) fails here.
#[tokio::test]
async fn the_model_matches_the_scripts() {
    use rand::{Rng, SeedableRng};
    common::bounded(async {
        let server = common::RedisServer::start();
        let raw = server.raw().await;
        let (name, fences) = ("{model}", "{model}:fences");
        let acquire = fredlock::script_source("lock_acquire").unwrap();
        let release = fredlock::script_source("lock_release").unwrap();
        let renew = fredlock::script_source("lock_renew").unwrap();
        let fenced_acquire = fredlock::script_source("fenced_acquire").unwrap();
        let leader_acquire = fredlock::script_source("leader_acquire").unwrap();
        let leader_release = fredlock::script_source("leader_release").unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(35);
        let mut kinds = [0usize; 6];
        for case in 0..400 {
            let now = 1u8;
            let mut state = Server::default();
            for owner in 0..3u8 {
                if rng.gen_bool(0.4) {
                    state.holds.insert(owner, rng.gen_range(1..=3));
                }
            }
            state.expires = now + rng.gen_range(1..=4);
            state.counter = Some(rng.gen_range(100..200));
            // A standing term: one holder, recorded with the last epoch.
            if state.holds.len() == 1 && rng.gen_bool(0.5) {
                let leader = *state.holds.keys().next().unwrap();
                state.term = Some((leader, state.counter.unwrap()));
            }
            for owner in 0..3u8 {
                for req in 0..4u8 {
                    if rng.gen_bool(0.15) {
                        state.fences.insert((owner, req));
                    }
                }
            }
            let owner: Owner = rng.gen_range(0..3);
            let req: Req = rng.gen_range(0..4);
            let lost: Vec<Req> = (0..4).filter(|&id| id != req && rng.gen_bool(0.2)).collect();
            let lease: u8 = rng.gen_range(1..=4);
            let mut model = state.clone();
            load(&raw, name, fences, &state, now).await;
            let mut argv: Vec<Value> = Vec::new();
            let kind = rng.gen_range(0..6);
            kinds[kind] += 1;
            let (expected, got) = match kind {
                0 | 3 => {
                    // The reentrant lock's acquire, or the fenced lock's (its counter last).
                    let holds: u32 = rng.gen_range(0..=3);
                    let (step, source, keys) = if kind == 0 {
                        (script::acquire as Step, acquire, vec![name, fences])
                    } else {
                        (script::fenced_acquire as Step, fenced_acquire, vec![name, fences, COUNTER])
                    };
                    let expected = step(&mut model, now, owner, lease, holds, req, &lost);
                    argv.push((i64::from(lease) * TICK_MS).to_string().into());
                    argv.push(field(owner).into());
                    argv.push(i64::from(holds).into());
                    argv.push(i64::from(req).into());
                    argv.extend(lost.iter().map(|&id| Value::from(i64::from(id))));
                    let got = raw.eval::<Value, _, _, _>(source, keys, argv).await;
                    (expected, reply(got, true))
                }
                1 => {
                    let left: u32 = rng.gen_range(0..=3);
                    let lease_arg: u8 = if rng.gen_bool(0.3) { 0 } else { lease };
                    let expected =
                        script::release(&mut model, now, owner, lease_arg, left, req, &lost);
                    argv.push("0".into()); // the unlock message
                    argv.push((i64::from(lease_arg) * TICK_MS).to_string().into());
                    argv.push(field(owner).into());
                    argv.push(i64::from(left).into());
                    argv.push(i64::from(req).into());
                    argv.extend(lost.iter().map(|&id| Value::from(i64::from(id))));
                    let channel = "{model}:channel";
                    let got = raw
                        .eval::<Value, _, _, _>(release, vec![name, channel, fences], argv)
                        .await;
                    (expected, reply(got, false))
                }
                4 => {
                    // A campaign: the fenced acquire with the candidate's identity.
                    let holds: u32 = rng.gen_range(0..=3);
                    let expected =
                        script::leader_acquire(&mut model, now, owner, lease, holds, req, &lost);
                    argv.push((i64::from(lease) * TICK_MS).to_string().into());
                    argv.push(field(owner).into());
                    argv.push(i64::from(holds).into());
                    argv.push(format!("pod-{owner}").into());
                    argv.push(i64::from(req).into());
                    argv.extend(lost.iter().map(|&id| Value::from(i64::from(id))));
                    let keys = vec![name, fences, COUNTER, "{model}:changes"];
                    let got = raw.eval::<Value, _, _, _>(leader_acquire, keys, argv).await;
                    (expected, reply(got, true))
                }
                5 => {
                    // A resignation: when the last hold goes, the term's record goes too.
                    let left: u32 = rng.gen_range(0..=3);
                    let lease_arg: u8 = if rng.gen_bool(0.3) { 0 } else { lease };
                    let expected =
                        script::leader_release(&mut model, now, owner, lease_arg, left, req, &lost);
                    argv.push((i64::from(lease_arg) * TICK_MS).to_string().into());
                    argv.push(field(owner).into());
                    argv.push(i64::from(left).into());
                    argv.push(i64::from(req).into());
                    argv.extend(lost.iter().map(|&id| Value::from(i64::from(id))));
                    let keys = vec![name, "{model}:channel", fences, "{model}:changes"];
                    let got = raw.eval::<Value, _, _, _>(leader_release, keys, argv).await;
                    (expected, reply(got, false))
                }
                _ => {
                    let expected = script::renew(&mut model, now, owner, lease);
                    argv.push((i64::from(lease) * TICK_MS).to_string().into());
                    argv.push(field(owner).into());
                    let got = raw.eval::<Value, _, _, _>(renew, vec![name], argv).await;
                    let got = match got {
                        Ok(Value::Array(replies)) => Ok(replies[0].clone()),
                        other => other,
                    };
                    (expected, reply(got, false))
                }
            };
            let after = read(&raw, name, fences, now).await;
            // The model keeps the expiry of a key that is gone; Redis has none.
            let mut model_after = model.clone();
            if model_after.holds.is_empty() {
                model_after.expires = after.expires;
            }
            assert_eq!(
                (got, &after),
                (expected, &model_after),
                "case {case}: state {state:?}, call {kind} by {owner} req {req} lost {lost:?} lease {lease}"
            );
        }
        println!(
            "400 cases: {} acquires, {} releases, {} renewals, {} fenced acquires, {} campaigns, \
             {} resignations",
            kinds[0], kinds[1], kinds[2], kinds[3], kinds[4], kinds[5]
        );
    })
    .await;
}

/// Random states and calls through the fair model's scripts and `lua/fair_lock.lua` (acquire,
/// release, leave) on a real server: the same replies, holds, fences and line after (its order,
/// and its places in ticks of the server's clock), for every case.
#[tokio::test]
async fn the_fair_model_matches_the_scripts() {
    use rand::seq::SliceRandom;
    use rand::{Rng, SeedableRng};
    common::bounded(async {
        let server = common::RedisServer::start();
        let raw = server.raw().await;
        let (name, queue, timeouts, fences) = (
            "{model}",
            "{model}:queue",
            "{model}:timeouts",
            "{model}:fences",
        );
        let [acquire, release, leave] = ["fair_acquire", "fair_release", "fair_leave"]
            .map(|script| fredlock::script_source(script).unwrap());
        let mut rng = rand::rngs::StdRng::seed_from_u64(35);
        let mut kinds = [0usize; 3];
        for case in 0..400 {
            let now = 1u8;
            let mut state = Server::default();
            if rng.gen_bool(0.5) {
                state
                    .holds
                    .insert(rng.gen_range(0..3), rng.gen_range(1..=3));
            }
            state.expires = now + rng.gen_range(1..=4);
            // A line of some of the owners in any order, some of whose places ended (at or
            // before now), and now and then a head without a place (Redisson's purge drops it).
            let mut line: Vec<Owner> = (0..3).filter(|_| rng.gen_bool(0.5)).collect();
            line.shuffle(&mut rng);
            for &waiter in &line {
                state.places.insert(waiter, rng.gen_range(0..=4));
            }
            if line.len() < 3 && rng.gen_bool(0.2) {
                let stray = (0..3).find(|owner| !line.contains(owner)).unwrap();
                line.insert(0, stray);
            }
            state.queue = line;
            for owner in 0..3u8 {
                for req in 0..4u8 {
                    if rng.gen_bool(0.15) {
                        state.fences.insert((owner, req));
                    }
                }
            }
            let owner: Owner = rng.gen_range(0..3);
            let req: Req = rng.gen_range(0..4);
            let lost: Vec<Req> = (0..4)
                .filter(|&id| id != req && rng.gen_bool(0.2))
                .collect();
            let lease: u8 = rng.gen_range(1..=4);

            load(&raw, name, fences, &state, now).await;
            let _: i64 = raw.del(vec![queue, timeouts]).await.unwrap();
            // The server's clock in the middle of tick `now`, as in the permit model's test.
            let server_ms = common::server_millis(&raw).await as i64;
            let base = server_ms - i64::from(now) * TICK_MS - TICK_MS / 2;
            for &waiter in &state.queue {
                let _: i64 = raw.rpush(queue, field(waiter)).await.unwrap();
            }
            for (&waiter, &ends) in &state.places {
                let score = (base + i64::from(ends) * TICK_MS) as f64;
                let _: i64 = raw
                    .zadd(timeouts, None, None, false, false, (score, field(waiter)))
                    .await
                    .unwrap();
            }

            let mut model = state.clone();
            let mut argv: Vec<Value> = vec!["{model}:channel".into(), "0".into()];
            let kind = rng.gen_range(0..3);
            kinds[kind] += 1;
            let (expected, script, millis) = match kind {
                0 => {
                    let holds: u32 = rng.gen_range(0..=3);
                    let place: u8 = rng.gen_range(0..=3);
                    let expected = script::fair_acquire(
                        &mut model, now, owner, lease, place, holds, req, &lost,
                    );
                    argv.push((i64::from(lease) * TICK_MS).into());
                    argv.push(field(owner).into());
                    argv.push((i64::from(place) * TICK_MS).into());
                    argv.push(i64::from(holds).into());
                    (expected, acquire, true)
                }
                1 => {
                    let left: u32 = rng.gen_range(0..=3);
                    let lease_arg: u8 = if rng.gen_bool(0.3) { 0 } else { lease };
                    let expected =
                        script::fair_release(&mut model, now, owner, lease_arg, left, req, &lost);
                    argv.push((i64::from(lease_arg) * TICK_MS).to_string().into());
                    argv.push(field(owner).into());
                    argv.push(i64::from(left).into());
                    (expected, release, false)
                }
                _ => {
                    let expected = script::fair_leave(&mut model, now, owner, req, &lost);
                    argv.push(field(owner).into());
                    (expected, leave, false)
                }
            };
            argv.push(i64::from(req).into());
            argv.extend(lost.iter().map(|&id| Value::from(i64::from(id))));
            let keys = vec![name, queue, timeouts, fences];
            let got = reply(raw.eval::<Value, _, _, _>(script, keys, argv).await, millis);

            let mut after = read(&raw, name, fences, now).await;
            let line: Vec<String> = raw.lrange(queue, 0, -1).await.unwrap();
            after.queue = line.iter().map(|waiter| owner_of(waiter)).collect();
            let places: Vec<(String, f64)> = raw
                .zrange(timeouts, 0, -1, None, false, None, true)
                .await
                .unwrap();
            for (waiter, score) in places {
                let ends = (score as i64 - base).div_euclid(TICK_MS) as u8;
                after.places.insert(owner_of(&waiter), ends);
            }
            // The model keeps the expiry of a key that is gone; Redis has none.
            if model.holds.is_empty() {
                model.expires = after.expires;
            }
            assert_eq!(
                (got, &after),
                (expected, &model),
                "case {case}: state {state:?}, call {kind} by {owner} req {req} lost {lost:?} \
                 lease {lease}"
            );
        }
        println!(
            "400 cases: {} acquires, {} releases, {} leaves",
            kinds[0], kinds[1], kinds[2]
        );
    })
    .await;
}

/// The owner whose field is `field` (see [`field`]).
fn owner_of(field: &str) -> Owner {
    field.rsplit(':').next().unwrap().parse().unwrap()
}

/// The permit semaphore (`lua/permit_semaphore.lua`): permits are leases in a zset beside the
/// counter of permits available, each acquisition with a permit id of its own, timed by the
/// server's clock. The model runs its acquire, release and renew as atomic steps with the Lua's
/// branches, the client as the engine runs a permit (a hold whose field is the permit id: one
/// call at a time, lost replies fenced by the permit's next call, an acquire sent again with
/// the same id finds its grant, an undo gives back a permit whose acquire was given up,
/// watchdog renewals, the renew deadline), a network that delays, reorders and loses, a
/// server clock up to `drift` ahead, and crashes.
mod permits {
    use super::*;

    /// A permit id: the client and its acquisition's number.
    pub type Permit = (Owner, u8);

    /// What Redis keeps of one permit semaphore.
    #[derive(Clone, Debug, Default, Hash, PartialEq, Eq, PartialOrd, Ord)]
    pub struct Server {
        /// The counter of permits available.
        pub available: i64,
        /// The leases: permit id -> when it ends (server ticks).
        pub leases: BTreeMap<Permit, u8>,
        /// Fenced requests: permit id and request id.
        pub fences: BTreeSet<(Permit, Req)>,
    }

    /// `prepare`: gives back the permits whose leases ended by `now`; whether any were.
    fn reclaim(server: &mut Server, now: u8) -> bool {
        let ended: Vec<Permit> = server
            .leases
            .iter()
            .filter(|(_, &ends)| ends <= now)
            .map(|(&id, _)| id)
            .collect();
        for id in &ended {
            server.leases.remove(id);
        }
        server.available += ended.len() as i64;
        !ended.is_empty()
    }

    /// `acquire`: nil when the permit is taken (now, or by an earlier send of this
    /// acquisition, whose lease then starts again unless `regrant_extends` is false, the
    /// script before the model found the overlap that leaves); else the ticks until the
    /// earliest lease ends, -1 when none ends.
    pub fn acquire(
        server: &mut Server,
        now: u8,
        lease: u8,
        id: Permit,
        req: Req,
        lost: &[Req],
        regrant_extends: bool,
    ) -> Reply {
        if script::fenced(&mut server.fences, id, req, lost) {
            return Reply::Stale;
        }
        reclaim(server, now);
        if let Some(ends) = server.leases.get_mut(&id) {
            if regrant_extends {
                *ends = now + lease;
            }
            return Reply::Nil;
        }
        if server.available >= 1 {
            server.available -= 1;
            server.leases.insert(id, now + lease);
            return Reply::Nil;
        }
        match server.leases.values().min() {
            Some(&ends) => Reply::Int(i64::from(ends - now).max(1)),
            None => Reply::Int(-1),
        }
    }

    /// `release`: nil when the permit is not held, 0 when it is kept (`keep` > 0), 1 when it
    /// was given back.
    pub fn release(
        server: &mut Server,
        now: u8,
        id: Permit,
        keep: u32,
        req: Req,
        lost: &[Req],
    ) -> Reply {
        if script::fenced(&mut server.fences, id, req, lost) {
            return Reply::Stale;
        }
        reclaim(server, now);
        if !server.leases.contains_key(&id) {
            return Reply::Nil;
        }
        if keep > 0 {
            return Reply::Int(0);
        }
        server.leases.remove(&id);
        server.available += 1;
        Reply::Int(1)
    }

    /// `renew` for one permit: extended only while its lease has not ended.
    pub fn renew(server: &mut Server, now: u8, lease: u8, id: Permit) -> Reply {
        match server.leases.get_mut(&id) {
            Some(ends) if *ends > now => {
                *ends = now + lease;
                Reply::Int(1)
            }
            _ => Reply::Int(0),
        }
    }

    /// The bounds and the client's settings, in ticks.
    #[derive(Clone, Debug)]
    pub struct Semaphore {
        pub clients: u8,
        pub permits: i64,
        pub lease: u8,
        pub renew_deadline: u8,
        pub drift: u8,
        pub max_time: u8,
        /// Calls each client may send in all.
        pub max_requests: u8,
        /// Whether the scripts fence lost requests (false only to see the model fail without).
        pub fences: bool,
        /// Whether an acquire sent again that finds its grant starts the lease again (false
        /// only to see the model fail without).
        pub regrant_extends: bool,
    }

    #[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
    pub enum CallKind {
        Acquire,
        /// A release of the permit: by its guard, or the undo of an acquire given up.
        Release,
        Renew,
    }

    #[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
    pub struct Request {
        id: Permit,
        req: Req,
        call: CallKind,
        lost: Vec<Req>,
        sent_at: u8,
    }

    #[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
    pub struct Response {
        id: Permit,
        req: Req,
        reply: Reply,
    }

    /// Where a client's current acquisition stands.
    #[derive(Clone, Copy, Debug, Default, Hash, PartialEq, Eq, PartialOrd, Ord)]
    pub enum Phase {
        /// No acquisition, or the last one settled.
        #[default]
        Idle,
        /// Asking for a permit (sent, or its reply lost and to be sent again or undone).
        Acquiring,
        /// A guard lives (it believes while `believes`).
        Holding,
        /// Giving the permit back: its guard's release.
        Releasing,
        /// Giving back whatever an acquire given up took: the undo.
        Undoing,
    }

    #[derive(Clone, Debug, Default, Hash, PartialEq, Eq, PartialOrd, Ord)]
    pub struct Peer {
        /// The current acquisition's number (its permit id is `(client, acquisition)`).
        acquisition: u8,
        phase: Phase,
        believes: bool,
        leased_at: u8,
        next_req: Req,
        /// Ids of the permit's calls whose replies were lost.
        lost: Vec<Req>,
        waiting: Option<(Req, CallKind, u8)>,
        renewing: bool,
        crashed: bool,
    }

    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct State {
        now: u8,
        /// The server's clock: from `now` to `now + drift`.
        server_now: u8,
        server: Server,
        clients: Vec<Peer>,
        requests: Vec<Request>,
        responses: Vec<Response>,
        seen: BTreeSet<Seen>,
    }

    impl std::hash::Hash for State {
        fn hash<H: std::hash::Hasher>(&self, hasher: &mut H) {
            (
                self.now,
                self.server_now,
                &self.server,
                &self.clients,
                &self.requests,
                &self.responses,
            )
                .hash(hasher);
        }
    }

    #[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
    pub enum Seen {
        Held,
        /// An acquire sent again after a lost reply found its grant.
        FoundItsGrant,
        Fenced,
        /// Ended leases given back by a later call.
        Reclaimed,
        LostLocally,
        /// An undo gave back a permit whose acquire's reply was lost.
        Undone,
        Waited,
        HeldBy(Owner),
    }

    #[derive(Clone, Debug, Hash, PartialEq, Eq)]
    pub enum Action {
        /// A new acquisition (a permit id of its own).
        Acquire(Owner),
        /// The acquire sent again after its reply was lost (the wait goes on).
        Resend(Owner),
        /// An acquire given up after its reply was lost: the undo gives the permit back.
        Undo(Owner),
        /// The guard gives its permit back.
        Release(Owner),
        Renew(Owner),
        Deliver(usize),
        Respond(usize),
        GiveUp(Owner),
        LoseResponse(usize),
        Tick,
        /// The server's clock runs ahead (at most `drift`).
        ServerAhead,
        Crash(Owner),
    }

    impl Semaphore {
        fn run(&self, state: &mut State, request: &Request) -> Reply {
            let lost: &[Req] = if self.fences { &request.lost } else { &[] };
            let server = &mut state.server;
            let fences = server.fences.clone();
            if !self.fences {
                server.fences.clear();
            }
            let before = server.leases.len();
            let reply = match request.call {
                CallKind::Acquire => {
                    let had = server.leases.contains_key(&request.id);
                    let reply = acquire(
                        server,
                        state.server_now,
                        self.lease,
                        request.id,
                        request.req,
                        lost,
                        self.regrant_extends,
                    );
                    if had && reply == Reply::Nil {
                        state.seen.insert(Seen::FoundItsGrant);
                    }
                    reply
                }
                CallKind::Release => {
                    release(server, state.server_now, request.id, 0, request.req, lost)
                }
                CallKind::Renew => renew(server, state.server_now, self.lease, request.id),
            };
            if !self.fences {
                state.server.fences = fences;
            }
            if request.call != CallKind::Renew
                && state.server.leases.len() + 1 < before + usize::from(reply == Reply::Nil)
            {
                state.seen.insert(Seen::Reclaimed);
            }
            reply
        }

        fn send(&self, state: &mut State, owner: Owner, call: CallKind) {
            let client = &mut state.clients[owner as usize];
            let req = client.next_req;
            client.next_req += 1;
            let lost = if call == CallKind::Renew {
                client.renewing = true;
                Vec::new()
            } else {
                client.waiting = Some((req, call, state.now));
                std::mem::take(&mut client.lost)
            };
            state.requests.push(Request {
                id: (owner, client.acquisition),
                req,
                call,
                lost,
                sent_at: state.now,
            });
            state.requests.sort();
        }

        /// Live leases on the server (by its clock) of `owner`'s permits.
        fn live(state: &State, owner: Owner) -> Vec<Permit> {
            state
                .server
                .leases
                .iter()
                .filter(|(&(of, _), &ends)| of == owner && ends > state.server_now)
                .map(|(&id, _)| id)
                .collect()
        }
    }

    impl Model for Semaphore {
        type State = State;
        type Action = Action;

        fn init_states(&self) -> Vec<State> {
            vec![State {
                now: 0,
                server_now: 0,
                server: Server {
                    available: self.permits,
                    ..Server::default()
                },
                clients: vec![Peer::default(); self.clients as usize],
                requests: Vec::new(),
                responses: Vec::new(),
                seen: BTreeSet::new(),
            }]
        }

        fn actions(&self, state: &State, actions: &mut Vec<Action>) {
            for (i, client) in state.clients.iter().enumerate() {
                let owner = i as Owner;
                if client.crashed {
                    continue;
                }
                let free = client.waiting.is_none();
                let can_send = client.next_req < self.max_requests;
                if free && can_send {
                    match client.phase {
                        Phase::Idle => actions.push(Action::Acquire(owner)),
                        Phase::Acquiring => {
                            actions.push(Action::Resend(owner));
                            actions.push(Action::Undo(owner));
                        }
                        Phase::Holding => actions.push(Action::Release(owner)),
                        // A release whose reply was lost is sent again until confirmed.
                        Phase::Releasing | Phase::Undoing => actions.push(Action::Undo(owner)),
                    }
                }
                if client.believes && !client.renewing && can_send && state.now > client.leased_at {
                    actions.push(Action::Renew(owner));
                }
                if client.waiting.is_some() {
                    actions.push(Action::GiveUp(owner));
                }
                if client.phase != Phase::Idle {
                    actions.push(Action::Crash(owner));
                }
            }
            for i in 0..state.requests.len() {
                actions.push(Action::Deliver(i));
            }
            for i in 0..state.responses.len() {
                actions.push(Action::Respond(i));
                actions.push(Action::LoseResponse(i));
            }
            if state.now < self.max_time {
                actions.push(Action::Tick);
            }
            if state.server_now < state.now + self.drift && state.server_now < self.max_time {
                actions.push(Action::ServerAhead);
            }
        }

        fn next_state(&self, last: &State, action: Action) -> Option<State> {
            let mut state = last.clone();
            match action {
                Action::Acquire(owner) => {
                    let client = &mut state.clients[owner as usize];
                    client.acquisition += 1;
                    client.phase = Phase::Acquiring;
                    self.send(&mut state, owner, CallKind::Acquire);
                }
                Action::Resend(owner) => self.send(&mut state, owner, CallKind::Acquire),
                Action::Undo(owner) => {
                    let client = &mut state.clients[owner as usize];
                    if client.phase == Phase::Acquiring {
                        client.phase = Phase::Undoing;
                    }
                    self.send(&mut state, owner, CallKind::Release);
                }
                Action::Release(owner) => {
                    let client = &mut state.clients[owner as usize];
                    client.believes = false;
                    client.phase = Phase::Releasing;
                    self.send(&mut state, owner, CallKind::Release);
                }
                Action::Renew(owner) => self.send(&mut state, owner, CallKind::Renew),
                Action::Deliver(i) => {
                    let request = state.requests.remove(i);
                    let reply = self.run(&mut state, &request);
                    if reply == Reply::Stale {
                        state.seen.insert(Seen::Fenced);
                    }
                    for &(owner, _) in state.server.leases.keys() {
                        state.seen.insert(Seen::HeldBy(owner));
                    }
                    if request.call == CallKind::Renew {
                        let client = &mut state.clients[request.id.0 as usize];
                        client.renewing = false;
                        if !client.crashed && client.acquisition == request.id.1 {
                            match reply {
                                Reply::Int(1) if client.believes => {
                                    client.leased_at = client.leased_at.max(request.sent_at);
                                }
                                Reply::Int(0) => client.believes = false,
                                _ => {}
                            }
                        }
                    } else {
                        state.responses.push(Response {
                            id: request.id,
                            req: request.req,
                            reply,
                        });
                        state.responses.sort();
                    }
                }
                Action::Respond(i) => {
                    let response = state.responses.remove(i);
                    let now = state.now;
                    let client = &mut state.clients[response.id.0 as usize];
                    let Some((req, call, sent_at)) = client.waiting else {
                        return Some(state);
                    };
                    if req != response.req || client.crashed {
                        return Some(state);
                    }
                    client.waiting = None;
                    match (call, response.reply) {
                        (CallKind::Acquire, Reply::Nil) => {
                            client.phase = Phase::Holding;
                            client.leased_at = sent_at;
                            client.believes = now < sent_at + self.renew_deadline;
                            state.seen.insert(if client.believes {
                                Seen::Held
                            } else {
                                Seen::LostLocally
                            });
                        }
                        // Busy: the acquisition waits and tries again (or is given up).
                        (CallKind::Acquire, Reply::Int(_)) => {
                            state.seen.insert(Seen::Waited);
                        }
                        (CallKind::Acquire, _) => {}
                        (CallKind::Release, reply) => {
                            if reply == Reply::Int(1) && client.phase == Phase::Undoing {
                                state.seen.insert(Seen::Undone);
                            }
                            // Confirmed: nil (not held), or given back. A stale reply never
                            // reaches a waiting call (its own request is never fenced).
                            client.phase = Phase::Idle;
                            client.lost.clear();
                        }
                        (CallKind::Renew, _) => {}
                    }
                }
                Action::GiveUp(owner) => {
                    let client = &mut state.clients[owner as usize];
                    let (req, _, _) = client.waiting.take()?;
                    client.lost.push(req);
                }
                Action::LoseResponse(i) => {
                    state.responses.remove(i);
                }
                Action::Tick => {
                    state.now += 1;
                    state.server_now = state.server_now.max(state.now);
                    let now = state.now;
                    for client in &mut state.clients {
                        if client.believes && now >= client.leased_at + self.renew_deadline {
                            client.believes = false;
                            state.seen.insert(Seen::LostLocally);
                        }
                    }
                }
                Action::ServerAhead => state.server_now += 1,
                Action::Crash(owner) => {
                    let client = &mut state.clients[owner as usize];
                    *client = Peer {
                        crashed: true,
                        acquisition: client.acquisition,
                        next_req: client.next_req,
                        ..Peer::default()
                    };
                }
            }
            Some(state)
        }

        fn properties(&self) -> Vec<Property<Self>> {
            vec![
                Property::always(
                    "permits are conserved (available + leases = permits)",
                    |model: &Semaphore, state: &State| {
                        state.server.available + state.server.leases.len() as i64 == model.permits
                    },
                ),
                Property::always(
                    "never more believers than permits",
                    |model: &Semaphore, state: &State| {
                        state
                            .clients
                            .iter()
                            .filter(|client| client.believes)
                            .count() as i64
                            <= model.permits
                    },
                ),
                Property::always(
                    "a believed permit's lease is live on the server",
                    |_, state: &State| {
                        state.clients.iter().enumerate().all(|(i, client)| {
                            !client.believes
                                || Semaphore::live(state, i as Owner)
                                    == vec![(i as Owner, client.acquisition)]
                        })
                    },
                ),
                Property::always(
                    "settled, a client holds on the server only its guard's permit",
                    |_, state: &State| {
                        state.clients.iter().enumerate().all(|(i, client)| {
                            let owner = i as Owner;
                            let on_its_way = client.waiting.is_some()
                                || state.requests.iter().any(|r| r.id.0 == owner)
                                || !client.lost.is_empty();
                            if client.crashed || on_its_way {
                                return true;
                            }
                            Semaphore::live(state, owner).into_iter().all(|id| {
                                client.phase == Phase::Holding && id == (owner, client.acquisition)
                            })
                        })
                    },
                ),
                Property::sometimes("held", |_, state: &State| state.seen.contains(&Seen::Held)),
                Property::sometimes("waited for a permit", |_, state: &State| {
                    state.seen.contains(&Seen::Waited)
                }),
                Property::sometimes(
                    "an acquire sent again found its grant",
                    |_, state: &State| state.seen.contains(&Seen::FoundItsGrant),
                ),
                Property::sometimes("a late call was fenced", |_, state: &State| {
                    state.seen.contains(&Seen::Fenced)
                }),
                Property::sometimes("an ended lease was given back", |_, state: &State| {
                    state.seen.contains(&Seen::Reclaimed)
                }),
                Property::sometimes("a guard learnt of its loss", |_, state: &State| {
                    state.seen.contains(&Seen::LostLocally)
                }),
                Property::sometimes("an undo gave a permit back", |_, state: &State| {
                    state.seen.contains(&Seen::Undone)
                }),
                Property::sometimes("permits went to both clients", |_, state: &State| {
                    state.seen.range(Seen::HeldBy(0)..).count() > 1
                }),
            ]
        }
    }

    /// The bound CI checks: 2 clients, 1 permit, a lease of 3 ticks renewed before a deadline of
    /// 2, a server clock up to 1 tick ahead, 3 ticks, 2 calls per client.
    pub fn bounded() -> Semaphore {
        Semaphore {
            clients: bound("FREDLOCK_MODEL_CLIENTS", 2),
            permits: i64::from(bound("FREDLOCK_MODEL_PERMITS", 1)),
            lease: 3,
            renew_deadline: 2,
            drift: 1,
            max_time: bound("FREDLOCK_MODEL_TICKS", 3),
            max_requests: bound("FREDLOCK_MODEL_CALLS", 2),
            fences: true,
            regrant_extends: true,
        }
    }
}

#[test]
fn the_permit_semaphore_protocol_holds_to_the_bound() {
    check_to_the_bound(permits::bounded(), None);
}

/// The permit model fails where the protocol would: without fences (a late acquire takes a
/// permit nobody counts), and with the script as it was before this model (an acquire sent
/// again that found its grant left the lease as the first send set it, while its client counts
/// from the resend: two hold the one permit at once).
#[test]
fn the_permit_model_fails_without_fences_or_a_fresh_lease() {
    let unfenced = permits::Semaphore {
        fences: false,
        ..permits::bounded()
    };
    let steps = counterexample(
        unfenced,
        "settled, a client holds on the server only its guard's permit",
        None,
    );
    println!("without fences: {steps:?}");
    let stale_lease = permits::Semaphore {
        regrant_extends: false,
        ..permits::bounded()
    };
    let steps = counterexample(stale_lease, "never more believers than permits", None);
    println!("a found grant's lease left as it was: {steps:?}");
}

/// A permit id of the differential test: `<client uuid>:<owner>x<acquisition>`.
fn permit_id((owner, n): permits::Permit) -> String {
    format!("1b4e28ba-2fa1-11d2-883f-0016d3cca427:{owner}x{n}")
}

fn parse_permit(id: &str) -> permits::Permit {
    let (owner, n) = id.rsplit(':').next().unwrap().split_once('x').unwrap();
    (owner.parse().unwrap(), n.parse().unwrap())
}

/// Random states and calls through the permit model's scripts and `lua/permit_semaphore.lua`
/// (acquire, release, renew) on a real server: the same replies, counter, leases (in ticks of
/// the server's clock) and fences after, for every case.
#[tokio::test]
async fn the_permit_model_matches_the_scripts() {
    use rand::{Rng, SeedableRng};
    common::bounded(async {
        let server = common::RedisServer::start();
        let raw = server.raw().await;
        let (counter, leases, channel, fences) = (
            "{pmodel}",
            "{pmodel}:timeout",
            "redisson_sc:{pmodel}",
            "{pmodel}:fences",
        );
        let acquire = fredlock::script_source("permit_semaphore_acquire").unwrap();
        let release = fredlock::script_source("permit_semaphore_release").unwrap();
        let renew = fredlock::script_source("permit_semaphore_renew").unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(35);
        let mut kinds = [0usize; 3];
        for case in 0..300 {
            let now = 1u8;
            let mut state = permits::Server {
                available: rng.gen_range(0..=2),
                ..permits::Server::default()
            };
            for owner in 0..3u8 {
                for n in 1..=2u8 {
                    if rng.gen_bool(0.3) {
                        // Some ended (at or before now) and not given back yet.
                        state.leases.insert((owner, n), rng.gen_range(0..=4));
                    }
                    for req in 0..3u8 {
                        if rng.gen_bool(0.1) {
                            state.fences.insert(((owner, n), req));
                        }
                    }
                }
            }
            let id: permits::Permit = (rng.gen_range(0..3), rng.gen_range(1..=2));
            let req: Req = rng.gen_range(0..3);
            let lost: Vec<Req> = (0..3).filter(|&r| r != req && rng.gen_bool(0.2)).collect();
            let lease: u8 = rng.gen_range(1..=4);
            // The server's clock in the middle of tick `now`: a case takes far less than half
            // a tick, so every lease end compares as it does in the model.
            let _: i64 = raw.del(vec![counter, leases, fences]).await.unwrap();
            let server_ms = common::server_millis(&raw).await as i64;
            let base = server_ms - i64::from(now) * TICK_MS - TICK_MS / 2;
            let _: () = raw
                .set(counter, state.available, None, None, false)
                .await
                .unwrap();
            for (&permit, &ends) in &state.leases {
                let score = (base + i64::from(ends) * TICK_MS) as f64;
                let _: i64 = raw
                    .zadd(leases, None, None, false, false, (score, permit_id(permit)))
                    .await
                    .unwrap();
            }
            for &(permit, r) in &state.fences {
                let _: i64 = raw
                    .sadd(fences, format!("{}:{r}", permit_id(permit)))
                    .await
                    .unwrap();
            }
            let mut model = state.clone();
            let keys = vec![counter, leases, channel, fences];
            let with_request = |mut argv: Vec<Value>| {
                argv.push(i64::from(req).into());
                argv.extend(lost.iter().map(|&r| Value::from(i64::from(r))));
                argv
            };
            let kind = rng.gen_range(0..3);
            kinds[kind] += 1;
            let (expected, got) = match kind {
                0 => {
                    let expected = permits::acquire(&mut model, now, lease, id, req, &lost, true);
                    let argv = with_request(vec![
                        (i64::from(lease) * TICK_MS).into(),
                        permit_id(id).into(),
                    ]);
                    let got = raw.eval::<Value, _, _, _>(acquire, keys, argv).await;
                    (expected, reply(got, true))
                }
                1 => {
                    let keep: u32 = if rng.gen_bool(0.3) { 1 } else { 0 };
                    let expected = permits::release(&mut model, now, id, keep, req, &lost);
                    let argv = with_request(vec![permit_id(id).into(), i64::from(keep).into()]);
                    let got = raw.eval::<Value, _, _, _>(release, keys, argv).await;
                    (expected, reply(got, false))
                }
                _ => {
                    let expected = permits::renew(&mut model, now, lease, id);
                    let argv: Vec<Value> =
                        vec![(i64::from(lease) * TICK_MS).into(), permit_id(id).into()];
                    let got = raw.eval::<Value, _, _, _>(renew, vec![leases], argv).await;
                    let got = match got {
                        Ok(Value::Array(replies)) => Ok(replies[0].clone()),
                        other => other,
                    };
                    (expected, reply(got, false))
                }
            };
            let mut after = permits::Server {
                available: raw
                    .get::<Option<i64>, _>(counter)
                    .await
                    .unwrap()
                    .unwrap_or(0),
                ..permits::Server::default()
            };
            let scored: Vec<(String, f64)> = raw
                .zrange(leases, 0, -1, None, false, None, true)
                .await
                .unwrap();
            for (member, score) in scored {
                let ends = (score as i64 - base).div_euclid(TICK_MS) as u8;
                after.leases.insert(parse_permit(&member), ends);
            }
            let members: Vec<String> = raw.smembers(fences).await.unwrap();
            for member in members {
                let (permit, r) = member.rsplit_once(':').unwrap();
                after
                    .fences
                    .insert((parse_permit(permit), r.parse().unwrap()));
            }
            assert_eq!(
                (got, &after),
                (expected, &model),
                "case {case}: state {state:?}, call {kind} on {id:?} req {req} lost {lost:?} \
                 lease {lease}"
            );
        }
        println!(
            "300 cases: {} acquires, {} releases, {} renewals",
            kinds[0], kinds[1], kinds[2]
        );
    })
    .await;
}

/// The read-write lock (`lua/rw_lock.lua`) with waiting writers that keep new readers out:
/// the hash of holds with its mode, each read hold's own key and lease, the zset of waiting
/// writers' places. The model runs its read and write acquire, release, the writer's leave and
/// the renewal as atomic steps with the Lua's branches, the client as the engine runs it (one
/// call at a time per owner, lost replies fenced by the next call, settles, watchdog renewals,
/// the renew deadline), a network that delays, reorders and loses, expiry on a server clock up
/// to `drift` ahead, and crashes. The last client writes, the others read; each may re-enter.
mod rw {
    use super::*;

    #[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
    pub enum Mode {
        Read,
        Write,
    }

    /// What Redis keeps of one read-write lock. Without a mode there is no hash: no readers,
    /// no writer.
    #[derive(Clone, Debug, Default, Hash, PartialEq, Eq, PartialOrd, Ord)]
    pub struct Server {
        pub mode: Option<Mode>,
        /// Each reader's hold count in the hash, as the end of each hold's own key (server
        /// ticks; one at or before now is gone).
        pub readers: BTreeMap<Owner, Vec<u8>>,
        /// The writer and its hold count.
        pub writer: Option<(Owner, u32)>,
        /// When the hash expires.
        pub expires: u8,
        /// The waiting writers: when each one's place ends.
        pub waiting: BTreeMap<Owner, u8>,
        pub fences: BTreeSet<(Owner, Req)>,
    }

    impl Server {
        fn clear_hash(&mut self) {
            self.mode = None;
            self.readers.clear();
            self.writer = None;
        }
    }

    /// `hold_ttl`: ticks left of the longest of a reader's holds; `None` when every one ended.
    pub fn hold_left(ends: &[u8], now: u8) -> Option<u8> {
        ends.iter()
            .filter(|&&end| end > now)
            .map(|&end| end - now)
            .max()
    }

    /// `keep_hash`: the hash lives at least `lease` more.
    fn keep_hash(server: &mut Server, now: u8, lease: u8) {
        server.expires = server.expires.max(now + lease);
    }

    /// `waiting_writers`: drops the places that ended; when the first live one ends.
    fn waiting_writers(server: &mut Server, now: u8) -> Option<u8> {
        server.waiting.retain(|_, end| *end > now);
        server.waiting.values().min().copied()
    }

    /// `settle_readers`: forgets the readers whose holds all ended; the longest left.
    fn settle_readers(server: &mut Server, now: u8) -> Option<u8> {
        server
            .readers
            .retain(|_, ends| hold_left(ends, now).is_some());
        server
            .readers
            .values()
            .filter_map(|ends| hold_left(ends, now))
            .max()
    }

    /// `read_acquire` with waiting writers keeping new readers out (`keep_out`).
    #[allow(clippy::too_many_arguments)]
    pub fn read_acquire(
        server: &mut Server,
        now: u8,
        owner: Owner,
        lease: u8,
        holds: u32,
        req: Req,
        lost: &[Req],
        keep_out: bool,
    ) -> Reply {
        if script::fenced(&mut server.fences, owner, req, lost) {
            return Reply::Stale;
        }
        let before = server.readers.get(&owner).cloned().unwrap_or_default();
        let reentry = !before.is_empty() && hold_left(&before, now).is_some();
        // In write mode only the writer itself may read (it keeps its read holds past its
        // write: a downgrade); waiting writers keep out only readers of a lock in read mode.
        let writing = server.mode == Some(Mode::Write);
        let mut may = !writing || server.writer.is_some_and(|(writer, _)| writer == owner);
        let mut first_writer = None;
        if may && !writing && !reentry && keep_out {
            first_writer = waiting_writers(server, now);
            may = first_writer.is_none();
        }
        if may {
            let count = if reentry { holds as usize + 1 } else { 1 };
            if server.mode.is_none() {
                server.mode = Some(Mode::Read);
                server.expires = now + lease;
            } else {
                keep_hash(server, now, lease);
            }
            server.readers.insert(owner, vec![now + lease; count]);
            return if !reentry && holds > 0 {
                Reply::Int(-3)
            } else {
                Reply::Nil
            };
        }
        let mut ttl = match server.mode {
            Some(_) => i64::from(server.expires - now),
            None => -2,
        };
        if let Some(first) = first_writer {
            let place = i64::from(first - now).max(1);
            if ttl < 0 || place <= ttl {
                ttl = place;
            }
        }
        Reply::Int(ttl)
    }

    /// `write_acquire`: a free lock, or the writer's own re-entry; otherwise the writer takes
    /// (or keeps, started again) a place that keeps new readers out, and hears the TTL.
    #[allow(clippy::too_many_arguments)]
    pub fn write_acquire(
        server: &mut Server,
        now: u8,
        owner: Owner,
        lease: u8,
        holds: u32,
        place: u8,
        req: Req,
        lost: &[Req],
    ) -> Reply {
        if script::fenced(&mut server.fences, owner, req, lost) {
            return Reply::Stale;
        }
        let mine = server.writer.is_some_and(|(writer, _)| writer == owner);
        if server.mode.is_none() || (server.mode == Some(Mode::Write) && mine) {
            server.waiting.remove(&owner);
            if server.mode.is_some() {
                server.writer = Some((owner, holds + 1));
                keep_hash(server, now, lease);
                return Reply::Nil;
            }
            server.mode = Some(Mode::Write);
            server.writer = Some((owner, 1));
            server.expires = now + lease;
            return if holds > 0 {
                Reply::Int(-3)
            } else {
                Reply::Nil
            };
        }
        if place > 0 {
            server.waiting.insert(owner, now + place);
        }
        Reply::Int(i64::from(server.expires - now))
    }

    /// `read_release`: the reader keeps `left` (none once its holds all ended); nil when it
    /// held nothing, 0 when holds remain, 1 when it gave back its last. The lock goes when no
    /// live hold of anyone remains.
    pub fn read_release(
        server: &mut Server,
        now: u8,
        owner: Owner,
        lease: u8,
        left: u32,
        req: Req,
        lost: &[Req],
    ) -> Reply {
        if script::fenced(&mut server.fences, owner, req, lost) {
            return Reply::Stale;
        }
        let Some(ends) = server.readers.get(&owner).cloned() else {
            return Reply::Nil;
        };
        let mine = hold_left(&ends, now);
        let held = mine.is_some();
        let left = if held { left as usize } else { 0 };
        if left > 0 && lease != 0 {
            server.readers.insert(owner, vec![now + lease; left]);
            keep_hash(server, now, lease);
        } else if left > 0 {
            let kept = (0..left)
                .map(|n| ends.get(n).copied().unwrap_or(0))
                .collect();
            server.readers.insert(owner, kept);
        } else {
            server.readers.remove(&owner);
        }
        let mut free = false;
        if server.mode == Some(Mode::Write) || (left > 0 && held) {
        } else if server.readers.is_empty() && server.writer.is_none() {
            free = true;
        } else if mine.is_some_and(|mine| mine >= server.expires - now) {
            match settle_readers(server, now) {
                None => free = true,
                Some(longest) => server.expires = now + longest,
            }
        }
        if free {
            server.clear_hash();
            waiting_writers(server, now);
        }
        match (held, left) {
            (false, _) => Reply::Nil,
            (true, 0) => Reply::Int(1),
            _ => Reply::Int(0),
        }
    }

    /// `write_release`: the writer keeps `left`; its last hold gone, the lock goes (or stays in
    /// read mode for readers whose holds live on).
    pub fn write_release(
        server: &mut Server,
        now: u8,
        owner: Owner,
        lease: u8,
        left: u32,
        req: Req,
        lost: &[Req],
    ) -> Reply {
        if script::fenced(&mut server.fences, owner, req, lost) {
            return Reply::Stale;
        }
        let mine = server.writer.is_some_and(|(writer, _)| writer == owner);
        if server.mode != Some(Mode::Write) || !mine {
            return Reply::Nil;
        }
        if left > 0 {
            server.writer = Some((owner, left));
            if lease != 0 {
                keep_hash(server, now, lease);
            }
            return Reply::Int(0);
        }
        server.writer = None;
        match settle_readers(server, now) {
            None => server.clear_hash(),
            Some(longest) => {
                server.mode = Some(Mode::Read);
                server.expires = now + longest;
            }
        }
        Reply::Int(1)
    }

    /// `leave`: a waiting writer gives up its place; 1 when it had one.
    pub fn leave(server: &mut Server, now: u8, owner: Owner, req: Req, lost: &[Req]) -> Reply {
        if script::fenced(&mut server.fences, owner, req, lost) {
            return Reply::Stale;
        }
        let removed = server.waiting.remove(&owner).is_some();
        if removed {
            waiting_writers(server, now);
        }
        Reply::Int(i64::from(removed))
    }

    /// `renew` for one key: a reader's live holds and the hash are extended, a writer's hash.
    pub fn renew(server: &mut Server, now: u8, owner: Owner, lease: u8, writes: bool) -> Reply {
        let held = if writes {
            server.writer.is_some_and(|(writer, _)| writer == owner)
        } else {
            server
                .readers
                .get(&owner)
                .is_some_and(|ends| hold_left(ends, now).is_some())
        };
        if held {
            if let Some(ends) = server.readers.get_mut(&owner) {
                for end in ends.iter_mut().filter(|end| **end > now) {
                    *end = now + lease;
                }
            }
            keep_hash(server, now, lease);
        }
        Reply::Int(i64::from(held))
    }

    /// The model's bounds and settings, in ticks.
    #[derive(Clone, Debug)]
    pub(super) struct RwLock {
        /// Clients: the last writes, the others read.
        pub clients: u8,
        pub lease: u8,
        pub renew_deadline: u8,
        pub drift: u8,
        /// How long a waiting writer keeps its place without asking again.
        pub place: u8,
        pub max_time: u8,
        pub max_requests: u8,
        /// How many holds a client takes at most (more than one: it re-enters).
        pub max_holds: u32,
        /// Whether waiting writers keep new readers out (false only to see the model fail).
        pub keep_out: bool,
        /// Whether the scripts fence lost requests (false only to see the model fail).
        pub fences: bool,
    }

    use super::{Action, CallKind, Clients, Peer, Request, Response};

    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct State {
        now: u8,
        server: Server,
        clients: Vec<Peer>,
        requests: Vec<Request>,
        responses: Vec<Response>,
        /// A reader's first hold was granted while a writer's place was live.
        passed_a_writer: bool,
        seen: BTreeSet<Seen>,
    }

    /// `seen` is left out, as in the lock model.
    impl std::hash::Hash for State {
        fn hash<H: std::hash::Hasher>(&self, hasher: &mut H) {
            (
                self.now,
                &self.server,
                &self.clients,
                &self.requests,
                &self.responses,
                self.passed_a_writer,
            )
                .hash(hasher);
        }
    }

    impl Clients for State {
        fn parts(&mut self) -> (&mut [Peer], &mut Vec<Request>, &mut Vec<Response>, u8) {
            (
                &mut self.clients,
                &mut self.requests,
                &mut self.responses,
                self.now,
            )
        }
        fn peek(&self) -> (&[Peer], usize, usize, u8) {
            (
                &self.clients,
                self.requests.len(),
                self.responses.len(),
                self.now,
            )
        }
    }

    #[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
    pub enum Seen {
        Read,
        Wrote,
        KeptOut,
        WroteAfterWaiting,
        Fenced,
        Expired,
        LostLocally,
        Left,
        Reentered,
    }

    impl RwLock {
        fn writes(&self, owner: Owner) -> bool {
            owner + 1 == self.clients
        }

        fn run(&self, server: &mut Server, now: u8, request: &Request) -> Reply {
            if !self.fences {
                // Without fences nothing is ever fenced: the model of the broken scripts.
                let kept = std::mem::take(&mut server.fences);
                let reply = self.call(server, now, request, &[]);
                server.fences = kept;
                return reply;
            }
            self.call(server, now, request, &request.lost)
        }

        fn call(&self, server: &mut Server, now: u8, request: &Request, lost: &[Req]) -> Reply {
            let (owner, req, lease) = (request.owner, request.req, self.lease);
            let writes = self.writes(owner);
            match request.call {
                CallKind::Acquire { holds } if writes => {
                    write_acquire(server, now, owner, lease, holds, self.place, req, lost)
                }
                CallKind::Acquire { holds } => {
                    read_acquire(server, now, owner, lease, holds, req, lost, self.keep_out)
                }
                CallKind::Release { left } if writes => {
                    write_release(server, now, owner, lease, left, req, lost)
                }
                CallKind::Release { left } => {
                    read_release(server, now, owner, lease, left, req, lost)
                }
                CallKind::Leave => leave(server, now, owner, req, lost),
                CallKind::Renew => renew(server, now, owner, lease, writes),
            }
        }

        /// Whether the server has a live hold of `owner`'s.
        fn holds_on_server(&self, server: &Server, now: u8, owner: Owner) -> Option<u32> {
            if self.writes(owner) {
                return server.writer.filter(|(w, _)| *w == owner).map(|(_, n)| n);
            }
            let ends = server.readers.get(&owner)?;
            hold_left(ends, now).map(|_| ends.len() as u32)
        }
    }

    impl Model for RwLock {
        type State = State;
        type Action = Action;

        fn init_states(&self) -> Vec<State> {
            vec![State {
                now: 0,
                server: Server::default(),
                clients: vec![Peer::default(); self.clients as usize],
                requests: Vec::new(),
                responses: Vec::new(),
                passed_a_writer: false,
                seen: BTreeSet::new(),
            }]
        }

        fn actions(&self, state: &State, actions: &mut Vec<Action>) {
            super::client_actions(
                state,
                self.max_requests,
                self.max_holds,
                self.max_time,
                actions,
            );
            if state.server.mode.is_some() && state.now + self.drift >= state.server.expires {
                actions.push(Action::Expire);
            }
        }

        fn next_state(&self, last: &State, action: Action) -> Option<State> {
            let mut state = last.clone();
            if super::client_step(&mut state, &action, false, |owner| self.writes(owner)) {
                return Some(state);
            }
            match action {
                Action::Deliver(i) => {
                    let request = state.requests.remove(i);
                    let now = state.now;
                    let owner = request.owner;
                    let before = state.server.clone();
                    let reply = self.run(&mut state.server, now, &request);
                    if reply == Reply::Stale {
                        state.seen.insert(Seen::Fenced);
                    }
                    if let CallKind::Acquire { .. } = request.call {
                        let had = self.holds_on_server(&before, now, owner).is_some();
                        let has = self.holds_on_server(&state.server, now, owner).is_some();
                        let live_place = before.waiting.values().any(|&end| end > now);
                        if !self.writes(owner) && !had && has && live_place {
                            state.passed_a_writer = true;
                        }
                        let refused = matches!(reply, Reply::Int(ttl) if ttl > 0);
                        if !self.writes(owner) && refused && before.mode != Some(Mode::Write) {
                            state.seen.insert(Seen::KeptOut);
                        }
                        if self.writes(owner) && !had && has && before.waiting.contains_key(&owner)
                        {
                            state.seen.insert(Seen::WroteAfterWaiting);
                        }
                    }
                    if request.call == CallKind::Leave && reply == Reply::Int(1) {
                        state.seen.insert(Seen::Left);
                    }
                    state.responses.push(Response {
                        owner,
                        req: request.req,
                        reply,
                    });
                    state.responses.sort();
                    if request.call == CallKind::Renew {
                        let client = &mut state.clients[owner as usize];
                        super::renewal_answered(&mut state.responses, client, &request)?;
                    }
                }
                Action::Respond(i) => {
                    let response = state.responses.remove(i);
                    let now = state.now;
                    let writes = self.writes(response.owner);
                    let client = &mut state.clients[response.owner as usize];
                    let Some((req, call, sent_at)) = client.waiting else {
                        return Some(state);
                    };
                    if req != response.req || client.crashed {
                        return Some(state);
                    }
                    client.waiting = None;
                    if let CallKind::Acquire { .. } = call {
                        match response.reply {
                            Reply::Nil | Reply::Int(-3) => {
                                if response.reply == Reply::Int(-3) {
                                    client.holds = 0;
                                }
                                client.queued = false;
                                client.holds += 1;
                                client.leased_at = sent_at;
                                client.believes = now < sent_at + self.renew_deadline;
                                state.seen.insert(match (client.believes, writes) {
                                    (false, _) => Seen::LostLocally,
                                    (true, true) => Seen::Wrote,
                                    (true, false) => Seen::Read,
                                });
                                if client.believes && client.holds > 1 {
                                    state.seen.insert(Seen::Reentered);
                                }
                            }
                            Reply::Stale => {}
                            _ => client.queued = writes,
                        }
                    }
                }
                Action::Tick => {
                    state.now += 1;
                    let now = state.now;
                    if state.server.mode.is_some() && now >= state.server.expires {
                        state.server.clear_hash();
                        state.seen.insert(Seen::Expired);
                    }
                    if super::deadlines_pass(&mut state.clients, now, self.renew_deadline) {
                        state.seen.insert(Seen::LostLocally);
                    }
                }
                Action::Expire => {
                    state.server.clear_hash();
                    state.seen.insert(Seen::Expired);
                }
                _ => unreachable!("a client's own step"),
            }
            Some(state)
        }

        fn properties(&self) -> Vec<Property<Self>> {
            vec![
                Property::always(
                    "a believing writer believes alone",
                    |model: &RwLock, state: &State| {
                        let believers = |writes: bool| {
                            state
                                .clients
                                .iter()
                                .enumerate()
                                .filter(|(i, client)| {
                                    client.believes && model.writes(*i as Owner) == writes
                                })
                                .count()
                        };
                        believers(true) == 0 || believers(false) == 0
                    },
                ),
                Property::always(
                    "no reader's first hold passes a writer waiting with a live place",
                    |_, state: &State| !state.passed_a_writer,
                ),
                Property::always(
                    "settled, the server's count is the client's",
                    |model: &RwLock, state: &State| {
                        state.clients.iter().enumerate().all(|(i, client)| {
                            let owner = i as Owner;
                            let on_its_way = client.waiting.is_some()
                                || state.requests.iter().any(|r| r.owner == owner)
                                || !client.lost.is_empty();
                            if client.crashed || on_its_way {
                                return true;
                            }
                            match model.holds_on_server(&state.server, state.now, owner) {
                                None => true,
                                Some(count) => client.holds > 0 && count == client.holds,
                            }
                        })
                    },
                ),
                Property::always(
                    "a believed hold is on the server",
                    |model: &RwLock, state: &State| {
                        state.clients.iter().enumerate().all(|(i, client)| {
                            !client.believes
                                || model
                                    .holds_on_server(&state.server, state.now, i as Owner)
                                    .is_some()
                        })
                    },
                ),
                Property::sometimes("read", |_, state: &State| state.seen.contains(&Seen::Read)),
                Property::sometimes("wrote", |_, state: &State| {
                    state.seen.contains(&Seen::Wrote)
                }),
                Property::sometimes(
                    "a reader was kept out by a waiting writer",
                    |_, state: &State| state.seen.contains(&Seen::KeptOut),
                ),
                Property::sometimes("a waiting writer got the lock", |_, state: &State| {
                    state.seen.contains(&Seen::WroteAfterWaiting)
                }),
                Property::sometimes("a late call was fenced", |_, state: &State| {
                    state.seen.contains(&Seen::Fenced)
                }),
                Property::sometimes("the lock expired", |_, state: &State| {
                    state.seen.contains(&Seen::Expired)
                }),
                Property::sometimes("a guard learnt of its loss", |_, state: &State| {
                    state.seen.contains(&Seen::LostLocally)
                }),
                Property::sometimes("a writer left its place", |_, state: &State| {
                    state.seen.contains(&Seen::Left)
                }),
                Property::sometimes("a holder re-entered", |model: &RwLock, state: &State| {
                    model.max_holds == 1 || state.seen.contains(&Seen::Reentered)
                }),
            ]
        }
    }

    /// CI's bound: a reader and a writer, lease 3, renew deadline 2, place 2, a server clock up
    /// to 1 tick ahead, 3 ticks, 2 calls each, up to 2 holds each (a re-entry).
    pub(super) fn bounded() -> RwLock {
        RwLock {
            clients: bound("FREDLOCK_MODEL_CLIENTS", 2),
            lease: 3,
            renew_deadline: 2,
            drift: 1,
            place: 2,
            max_time: bound("FREDLOCK_MODEL_TICKS", 3),
            max_requests: bound("FREDLOCK_MODEL_CALLS", 2),
            max_holds: 2,
            keep_out: true,
            fences: true,
        }
    }
}

/// The read-write lock: a writer never holds beside anyone, a reader never takes a first hold
/// past a writer waiting with a live place (writer preference), and the hold rules of the lock
/// (exactly-once settles, a believed hold is on the server).
#[test]
fn the_read_write_lock_protocol_holds_to_the_bound() {
    check_to_the_bound(rw::bounded(), None);
}

/// The read-write model fails where a broken lock would: readers that ignore waiting writers
/// pass them; without fences a late acquire leaves a hold nobody counts.
#[test]
fn the_read_write_model_fails_without_writer_preference_or_fences() {
    let no_preference = rw::RwLock {
        keep_out: false,
        ..rw::bounded()
    };
    let steps = counterexample(
        no_preference,
        "no reader's first hold passes a writer waiting with a live place",
        None,
    );
    println!("without writer preference: {steps:?}");
    let unfenced = rw::RwLock {
        fences: false,
        ..rw::bounded()
    };
    let steps = counterexample(
        unfenced,
        "settled, the server's count is the client's",
        None,
    );
    println!("without fences: {steps:?}");
}

/// A reader's or writer's field in the read-write differential test (the writer's ends in
/// `:write`).
fn rw_field(owner: Owner, writes: bool) -> String {
    if writes {
        format!("{}:write", field(owner))
    } else {
        field(owner)
    }
}

/// The owner of a read-write lock's field.
fn rw_owner(field: &str) -> Owner {
    owner_of(field.strip_suffix(":write").unwrap_or(field))
}

/// Random states and calls through the read-write model's scripts and `lua/rw_lock.lua`
/// (read and write acquire and release, leave, renew) on a real server: the same replies, hash
/// (mode, holds, each read hold's key), waiting writers and fences after (in ticks of the
/// server's clock), for every case. Owners 0 and 1 read, 2 and 3 write, and in some cases read
/// too (a writer's read holds beside its write, which its last write release leaves in read
/// mode: a downgrade).
#[tokio::test]
async fn the_read_write_model_matches_the_scripts() {
    use rand::{Rng, SeedableRng};
    use rw::{Mode, Server};
    common::bounded(async {
        let server = common::RedisServer::start();
        let raw = server.raw().await;
        let (name, channel, fences, writers) = (
            "{rwmodel}",
            "redisson_rwlock:{rwmodel}",
            "{rwmodel}:fences",
            "{rwmodel}:writers",
        );
        let timeout_key =
            |owner: Owner, n: usize| format!("{name}:{}:rwlock_timeout:{n}", field(owner));
        let scripts = [
            "rw_read_acquire",
            "rw_write_acquire",
            "rw_read_release",
            "rw_write_release",
            "rw_leave",
            "rw_renew",
        ]
        .map(|script| fredlock::script_source(script).unwrap());
        let mut rng = rand::rngs::StdRng::seed_from_u64(35);
        let mut kinds = [0usize; 6];
        let mut reads_by_writers = 0;
        for case in 0..400 {
            let now = 1u8;
            let mut state = Server {
                expires: now + rng.gen_range(1..=4),
                ..Server::default()
            };
            // A reader's holds, each hold's key gone (0) or ending in 1 to 4 ticks.
            let hold_ends = |rng: &mut rand::rngs::StdRng| -> Vec<u8> {
                let count = rng.gen_range(1..=2);
                (0..count)
                    .map(|_| {
                        if rng.gen_bool(0.25) {
                            0
                        } else {
                            now + rng.gen_range(1..=4)
                        }
                    })
                    .collect()
            };
            match rng.gen_range(0..3) {
                0 => {}
                1 => {
                    state.mode = Some(Mode::Read);
                    for owner in 0..2u8 {
                        if rng.gen_bool(0.6) || (owner == 1 && state.readers.is_empty()) {
                            state.readers.insert(owner, hold_ends(&mut rng));
                        }
                    }
                }
                _ => {
                    state.mode = Some(Mode::Write);
                    let writer = rng.gen_range(2..4);
                    state.writer = Some((writer, rng.gen_range(1..=2)));
                    if rng.gen_bool(0.5) {
                        // The writer reads too: its read holds outlive its write (a downgrade).
                        state.readers.insert(writer, hold_ends(&mut rng));
                    }
                }
            }
            for writer in 2..4u8 {
                if rng.gen_bool(0.4) {
                    // Some places ended (at or before now).
                    state.waiting.insert(writer, rng.gen_range(0..=4));
                }
            }
            for owner in 0..4u8 {
                for req in 0..4u8 {
                    if rng.gen_bool(0.15) {
                        state.fences.insert((owner, req));
                    }
                }
            }
            let kind = rng.gen_range(0..6);
            kinds[kind] += 1;
            let writes = match kind {
                1 | 3 | 4 => true,
                5 => rng.gen_bool(0.5),
                _ => false,
            };
            // A writer reads, too, in some cases: its read holds beside its write.
            let writer_reads = !writes && rng.gen_bool(0.3);
            let owner: Owner = if writes || writer_reads {
                rng.gen_range(2..4)
            } else {
                rng.gen_range(0..2)
            };
            if writer_reads {
                // Its fences are by the field that called, and the model keeps them by owner:
                // a writer's loaded fences are its write field's.
                state.fences.retain(|&(fenced, _)| fenced != owner);
                reads_by_writers += 1;
            }
            let req: Req = rng.gen_range(0..4);
            let lost: Vec<Req> = (0..4)
                .filter(|&id| id != req && rng.gen_bool(0.2))
                .collect();
            let lease: u8 = rng.gen_range(1..=4);

            // Load: the hash's TTL first, then the holds' keys, so that a hold that ends with
            // the hash reads as the hash's longest, as a hold and its hash set in one call do.
            let mut stale: Vec<String> = vec![name.into(), fences.into(), writers.into()];
            stale.extend(
                (0..4u8)
                    .flat_map(|owner| (1..=3).map(move |n| (owner, n)))
                    .map(|(o, n)| timeout_key(o, n)),
            );
            let _: i64 = raw.del(stale).await.unwrap();
            if let Some(mode) = state.mode {
                let mut fields = vec![(
                    "mode".to_string(),
                    if mode == Mode::Read { "read" } else { "write" }.to_string(),
                )];
                for (&owner, ends) in &state.readers {
                    fields.push((field(owner), ends.len().to_string()));
                }
                if let Some((writer, count)) = state.writer {
                    fields.push((rw_field(writer, true), count.to_string()));
                }
                let _: i64 = raw.hset(name, fields).await.unwrap();
                let ms = i64::from(state.expires - now) * TICK_MS;
                let _: bool = raw.pexpire(name, ms, None).await.unwrap();
                for (&owner, ends) in &state.readers {
                    for (n, &end) in ends.iter().enumerate() {
                        if end > now {
                            let ms = i64::from(end - now) * TICK_MS;
                            let expiry = Some(fred::types::Expiration::PX(ms));
                            let _: () = raw
                                .set(timeout_key(owner, n + 1), 1, expiry, None, false)
                                .await
                                .unwrap();
                        }
                    }
                }
            }
            let server_ms = common::server_millis(&raw).await as i64;
            let base = server_ms - i64::from(now) * TICK_MS - TICK_MS / 2;
            for (&writer, &end) in &state.waiting {
                let score = (base + i64::from(end) * TICK_MS) as f64;
                let member = rw_field(writer, true);
                let _: i64 = raw
                    .zadd(writers, None, None, false, false, (score, member))
                    .await
                    .unwrap();
            }
            for &(fenced_owner, fenced_req) in &state.fences {
                let member = format!("{}:{fenced_req}", rw_field(fenced_owner, fenced_owner >= 2));
                let _: i64 = raw.sadd(fences, member).await.unwrap();
            }

            let mut model = state.clone();
            let lease_ms = Value::from(i64::from(lease) * TICK_MS);
            let who = Value::from(rw_field(owner, writes));
            let mut argv: Vec<Value> = vec![name.into()];
            let keys = vec![name, channel, fences, writers];
            let (expected, got) = if kind == 5 {
                let expected = rw::renew(&mut model, now, owner, lease, writes);
                let argv: Vec<Value> = vec![lease_ms, who];
                let got = raw
                    .eval::<Value, _, _, _>(scripts[5], vec![name], argv)
                    .await;
                let got = match got {
                    Ok(Value::Array(replies)) => Ok(replies[0].clone()),
                    other => other,
                };
                (expected, reply(got, false))
            } else {
                let (expected, millis) = match kind {
                    0 => {
                        let holds: u32 = rng.gen_range(0..=2);
                        argv.extend([lease_ms, who, i64::from(holds).into(), "1".into()]);
                        let expected = rw::read_acquire(
                            &mut model, now, owner, lease, holds, req, &lost, true,
                        );
                        (expected, true)
                    }
                    1 => {
                        let holds: u32 = rng.gen_range(0..=2);
                        let place: u8 = rng.gen_range(0..=3);
                        let place_ms = Value::from(i64::from(place) * TICK_MS);
                        argv.extend([lease_ms, who, i64::from(holds).into(), place_ms]);
                        let expected = rw::write_acquire(
                            &mut model, now, owner, lease, holds, place, req, &lost,
                        );
                        (expected, true)
                    }
                    2 | 3 => {
                        let left: u32 = rng.gen_range(0..=2);
                        let lease_arg: u8 = if rng.gen_bool(0.3) { 0 } else { lease };
                        let lease_arg_ms = (i64::from(lease_arg) * TICK_MS).to_string();
                        argv.extend([lease_arg_ms.into(), who, i64::from(left).into()]);
                        let release = if kind == 2 {
                            rw::read_release
                        } else {
                            rw::write_release
                        };
                        let expected = release(&mut model, now, owner, lease_arg, left, req, &lost);
                        (expected, false)
                    }
                    _ => {
                        argv.push(who);
                        (rw::leave(&mut model, now, owner, req, &lost), false)
                    }
                };
                argv.push(i64::from(req).into());
                argv.extend(lost.iter().map(|&id| Value::from(i64::from(id))));
                let got = raw.eval::<Value, _, _, _>(scripts[kind], keys, argv).await;
                (expected, reply(got, millis))
            };

            // Read back.
            let mut after = Server::default();
            let fields: std::collections::HashMap<String, String> =
                raw.hgetall(name).await.unwrap();
            after.mode = fields.get("mode").map(|mode| {
                if mode == "read" {
                    Mode::Read
                } else {
                    Mode::Write
                }
            });
            for (key, value) in &fields {
                let count: usize = match value.parse() {
                    Ok(count) if key != "mode" => count,
                    _ => continue,
                };
                if key.ends_with(":write") {
                    after.writer = Some((rw_owner(key), count as u32));
                    continue;
                }
                let reader = rw_owner(key);
                let mut ends = Vec::new();
                for n in 1..=count {
                    let pttl: i64 = raw.pttl(timeout_key(reader, n)).await.unwrap();
                    ends.push(if pttl > 0 {
                        now + ((pttl + TICK_MS - 1) / TICK_MS) as u8
                    } else {
                        0
                    });
                }
                after.readers.insert(reader, ends);
            }
            if after.mode.is_some() {
                let pttl: i64 = raw.pttl(name).await.unwrap();
                after.expires = now + ((pttl + TICK_MS - 1) / TICK_MS) as u8;
            }
            let places: Vec<(String, f64)> = raw
                .zrange(writers, 0, -1, None, false, None, true)
                .await
                .unwrap();
            for (writer, score) in places {
                let end = (score as i64 - base).div_euclid(TICK_MS) as u8;
                after.waiting.insert(rw_owner(&writer), end);
            }
            let members: Vec<String> = raw.smembers(fences).await.unwrap();
            for member in members {
                let (fenced_field, fenced_req) = member.rsplit_once(':').unwrap();
                after
                    .fences
                    .insert((rw_owner(fenced_field), fenced_req.parse().unwrap()));
            }
            // The model keeps what Redis forgets: ended keys (0 there) and a gone hash's expiry.
            for ends in model.readers.values_mut() {
                for end in ends.iter_mut().filter(|end| **end <= now) {
                    *end = 0;
                }
            }
            if model.mode.is_none() {
                model.expires = after.expires;
            }
            assert_eq!(
                (got, &after),
                (expected, &model),
                "case {case}: state {state:?}, call {kind} by {owner} req {req} lost {lost:?} \
                 lease {lease}"
            );
        }
        println!(
            "400 cases: {} read acquires, {} write acquires, {} read releases, {} write \
             releases, {} leaves, {} renewals ({reads_by_writers} of the reads by a writer)",
            kinds[0], kinds[1], kinds[2], kinds[3], kinds[4], kinds[5]
        );
    })
    .await;
}

//! A model of the reentrant lock's protocol (issue 35), checked exhaustively to a bound with
//! stateright, and tied to the Lua by a differential test.
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
//! The bound is CI's (about 25 s in the test build); `FREDLOCK_MODEL_CLIENTS`,
//! `FREDLOCK_MODEL_TICKS` and `FREDLOCK_MODEL_CALLS` raise it for a longer run.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use fred::prelude::*;
use fred::types::Value;
use stateright::{Checker, Model, Property};

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
    /// carries are fenced.
    fn fenced(server: &mut Server, owner: Owner, req: Req, lost: &[Req]) -> bool {
        if server.fences.contains(&(owner, req)) {
            return true;
        }
        for &id in lost {
            server.fences.insert((owner, id));
        }
        false
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
        if fenced(server, owner, req, lost) {
            return Reply::Stale;
        }
        if server.holds.is_empty() {
            server.holds.insert(owner, 1);
            server.expires = now + lease;
            return if holds > 0 {
                Reply::Int(-3)
            } else {
                Reply::Nil
            };
        }
        if let Some(count) = server.holds.get_mut(&owner) {
            *count = holds + 1;
            server.expires = now + lease;
            return Reply::Nil;
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

    /// `lock.lua` `release` (`holds.lua` `give_back_holds`): nil when the owner held nothing, 0
    /// when holds remain (the lease set again unless 0), 1 when the last went.
    pub fn release(
        server: &mut Server,
        now: u8,
        owner: Owner,
        lease: u8,
        left: u32,
        req: Req,
        lost: &[Req],
    ) -> Reply {
        if fenced(server, owner, req, lost) {
            return Reply::Stale;
        }
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
    Acquire { holds: u32 },
    Release { left: u32 },
    Renew,
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
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct State {
    now: u8,
    server: Server,
    clients: Vec<Peer>,
    requests: Vec<Request>,
    responses: Vec<Response>,
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
        )
            .hash(hasher);
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
        let (owner, req) = (request.owner, request.req);
        match request.call {
            CallKind::Acquire { holds } => {
                script::fenced_acquire(server, now, owner, self.lease, holds, req, lost)
            }
            CallKind::Release { left } => {
                script::release(server, now, owner, self.lease, left, req, lost)
            }
            CallKind::Renew => script::renew(server, now, owner, self.lease),
        }
    }

    fn send(&self, state: &mut State, owner: Owner, call: CallKind) {
        let client = &mut state.clients[owner as usize];
        let req = client.next_req;
        client.next_req += 1;
        let lost = if call == CallKind::Renew {
            Vec::new()
        } else {
            std::mem::take(&mut client.lost)
        };
        if call == CallKind::Renew {
            client.renewing = true;
        } else {
            client.waiting = Some((req, call, state.now));
        }
        state.requests.push(Request {
            owner,
            req,
            call,
            lost,
            sent_at: state.now,
        });
        state.requests.sort();
    }
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
            seen: BTreeSet::new(),
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        for (i, client) in state.clients.iter().enumerate() {
            let owner = i as Owner;
            if client.crashed {
                continue;
            }
            let turn_free = client.waiting.is_none();
            let can_send = client.next_req < self.max_requests;
            if turn_free && can_send && client.holds < 2 && (client.believes || client.holds == 0) {
                actions.push(Action::Acquire(owner));
            }
            if turn_free && can_send && client.holds > 0 {
                actions.push(Action::Release(owner));
            }
            if turn_free && can_send && client.holds == 0 && !client.lost.is_empty() {
                actions.push(Action::Settle(owner));
            }
            // The watchdog renews at most once a tick (every lease / 3 in the client).
            if client.believes && !client.renewing && can_send && state.now > client.leased_at {
                actions.push(Action::Renew(owner));
            }
            if client.waiting.is_some() {
                actions.push(Action::GiveUp(owner));
            }
            // A crash that matters: of a holder, or of a client with a call on its way.
            if client.holds > 0 || client.waiting.is_some() {
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
        if !state.server.holds.is_empty() && state.now + self.drift >= state.server.expires {
            actions.push(Action::Expire);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut state = last.clone();
        match action {
            Action::Acquire(owner) => {
                let holds = state.clients[owner as usize].holds;
                self.send(&mut state, owner, CallKind::Acquire { holds });
            }
            Action::Release(owner) => {
                let client = &mut state.clients[owner as usize];
                // The guard's hold ends at the release's invoke; a lost hold gives all back.
                let left = if client.believes { client.holds - 1 } else { 0 };
                client.holds = left;
                client.believes = client.believes && left > 0;
                self.send(&mut state, owner, CallKind::Release { left });
            }
            Action::Settle(owner) => {
                let left = state.clients[owner as usize].holds;
                self.send(&mut state, owner, CallKind::Release { left });
            }
            Action::Renew(owner) => self.send(&mut state, owner, CallKind::Renew),
            Action::Deliver(i) => {
                let request = state.requests.remove(i);
                let reply = self.run(&mut state.server, state.now, &request);
                if reply == Reply::Stale {
                    state.seen.insert(Seen::Fenced);
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
                // The renewal's reply is read with its send time.
                if request.call == CallKind::Renew {
                    let response = state
                        .responses
                        .iter()
                        .position(|r| r.owner == request.owner && r.req == request.req)?;
                    let response = state.responses.remove(response);
                    let client = &mut state.clients[request.owner as usize];
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
                        Reply::Nil | Reply::Token(..) => {
                            if let Reply::Token(token, afresh) = response.reply {
                                if afresh {
                                    client.holds = 0; // the holds it counted are gone
                                }
                                client.token = Some(token);
                            }
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
                        _ => {}
                    }
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
                let now = state.now;
                // By the server's clock the key is gone by now at the latest.
                if !state.server.holds.is_empty() && now >= state.server.expires {
                    state.server.holds.clear();
                    state.seen.insert(Seen::Expired);
                }
                for client in &mut state.clients {
                    // The guard's `lost()` fires at the renew deadline.
                    if client.believes && now >= client.leased_at + self.renew_deadline {
                        client.believes = false;
                        state.seen.insert(Seen::LostLocally);
                    }
                }
            }
            Action::Expire => {
                state.server.holds.clear();
                state.seen.insert(Seen::Expired);
            }
            Action::Crash(owner) => {
                let client = &mut state.clients[owner as usize];
                *client = Peer {
                    crashed: true,
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
        ]
    }
}

/// The bound CI checks: 2 clients, a lease of 3 ticks renewed before a deadline of 2, a server
/// clock up to 1 tick ahead, 3 ticks, 2 calls per client (which covers a lost reply, its resend,
/// a late arrival of the first, an expiry and a hand-over: the "sometimes" properties say each
/// is reached).
fn bounded_lock() -> Lock {
    let bound = |name: &str, default: u8| {
        std::env::var(name)
            .ok()
            .and_then(|value| value.parse().ok())
            .unwrap_or(default)
    };
    Lock {
        clients: bound("FREDLOCK_MODEL_CLIENTS", 2),
        lease: 3,
        renew_deadline: 2,
        drift: 1,
        max_time: bound("FREDLOCK_MODEL_TICKS", 3),
        max_requests: bound("FREDLOCK_MODEL_CALLS", 2),
        fences: true,
    }
}

#[test]
fn the_reentrant_lock_protocol_holds_to_the_bound() {
    let started = std::time::Instant::now();
    let checker = bounded_lock().checker().threads(2).spawn_bfs().join();
    println!(
        "{} states in {:?}",
        checker.unique_state_count(),
        started.elapsed()
    );
    checker.assert_properties();
}

/// The model fails where the protocol would: without fences (a late acquire leaves a hold
/// nobody counts), and with a renew deadline no shorter than the lease less the drift.
#[test]
fn the_model_fails_without_fences_or_margin() {
    let unfenced = Lock {
        fences: false,
        ..bounded_lock()
    };
    let checker = unfenced.checker().threads(2).spawn_bfs().join();
    let path = checker.assert_any_discovery("settled, the server's count is the client's");
    println!("without fences: {:?}", path.into_actions());
    let late = Lock {
        renew_deadline: 3,
        ..bounded_lock()
    };
    let checker = late.checker().threads(2).spawn_bfs().join();
    let path = checker.assert_any_discovery("no two owners believe they hold the lock");
    println!("deadline = lease: {:?}", path.into_actions());
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
            let owner = key.rsplit(':').next().unwrap().parse().unwrap();
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
        let mut rng = rand::rngs::StdRng::seed_from_u64(35);
        let mut kinds = [0usize; 5];
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
            let kind = rng.gen_range(0..5);
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
            "400 cases: {} acquires, {} releases, {} renewals, {} fenced acquires, {} campaigns",
            kinds[0], kinds[1], kinds[2], kinds[3], kinds[4]
        );
    })
    .await;
}

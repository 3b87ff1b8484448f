//! The read-write lock (`lua/rw_lock.lua`) with waiting writers that keep new readers out:
//! the hash of holds with its mode, each read hold's own key and lease, the zset of waiting
//! writers' places. The model runs its read and write acquire, release, the writer's leave and
//! the renewal as atomic steps with the Lua's branches, the client as the engine runs it (one
//! call at a time per owner, lost replies fenced by the next call, settles, watchdog renewals,
//! the renew deadline), a network that delays, reorders and loses, expiry on a server clock up
//! to `drift` ahead, and crashes. The last client writes, the others read; each may re-enter.
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

/// `renew` for one key: a reader's live holds and the hash are extended, a writer's hash; a
/// lease of 0 (the check of a fixed-lease hold) only checks.
pub fn renew(server: &mut Server, now: u8, owner: Owner, lease: u8, writes: bool) -> Reply {
    let held = if writes {
        server.writer.is_some_and(|(writer, _)| writer == owner)
    } else {
        server
            .readers
            .get(&owner)
            .is_some_and(|ends| hold_left(ends, now).is_some())
    };
    if held && lease > 0 {
        // A read hold's own keys, for a reader's renewal only: a writer's read holds beside
        // its write are renewed by their own guards (found by case 457 of the differential
        // test, once it ran 1000 cases).
        if !writes {
            if let Some(ends) = server.readers.get_mut(&owner) {
                for end in ends.iter_mut().filter(|end| **end > now) {
                    *end = now + lease;
                }
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
            CallKind::Release { left } => read_release(server, now, owner, lease, left, req, lost),
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
        if super::client_step(&mut state, &action, |owner| self.writes(owner)) {
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
                    if self.writes(owner) && !had && has && before.waiting.contains_key(&owner) {
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
                    super::renewal_answered(&mut state.responses, client, &request, true)?;
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
                super::answered(client, call, false);
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
        // What the releases and leaves publish on the lock's channel: compared too.
        let listener = server.raw().await;
        let mut messages = listener.message_rx();
        listener.subscribe(channel).await.unwrap();
        let mut published_in_all = 0;
        let mut batch_rng = rand::rngs::StdRng::seed_from_u64(44);
        let mut batches = 0;
        for case in 0..CASES {
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
                    // Now and then a third reader (a writer's read holds, with no write): a
                    // release by one reader then settles the others, forgetting one whose
                    // holds all ended while another lives on.
                    if rng.gen_bool(0.3) {
                        state.readers.insert(2, hold_ends(&mut rng));
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
            if writes && state.mode == Some(Mode::Read) {
                // The third reader does not ask to write: an upgrade is refused before the
                // model (DEADLOCK, tests/rw_lock.rs).
                state.readers.remove(&owner);
            }
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
                // A third of the renewals are checks of a fixed-lease hold (a lease of 0).
                let lease = if rng.gen_bool(0.3) { 0 } else { lease };
                let lease_ms = Value::from(i64::from(lease) * TICK_MS);
                let expected = rw::renew(&mut model, now, owner, lease, writes);
                let mut argv: Vec<Value> = vec![lease_ms, who];
                let mut keys = vec![name];
                // Half of them in a batch with another owner's hold of the same lock (a
                // client holding it under two owners), as the watchdog sends them: each
                // answered and renewed as if alone. A generator of its own, so that the cases'
                // draws stay as they were.
                let mut second = None;
                if batch_rng.gen_bool(0.5) {
                    let other: Owner = (owner + batch_rng.gen_range(1..4)) % 4;
                    let other_writes = other >= 2 && batch_rng.gen_bool(0.5);
                    argv.push(rw_field(other, other_writes).into());
                    keys.push(name);
                    second = Some(rw::renew(&mut model, now, other, lease, other_writes));
                }
                let got = raw.eval::<Value, _, _, _>(scripts[5], keys, argv).await;
                let first = first_of_batch(got, second, (case, "hold"), &mut batches);
                (expected, first)
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
            // No read hold key beyond its reader's count: a release that keeps fewer holds
            // (a settle, whose lease of 0 keeps the others' expiry) deletes the rest.
            for reader in 0..4u8 {
                let count = after.readers.get(&reader).map_or(0, Vec::len);
                for n in count + 1..=3 {
                    let left: i64 = raw.exists(timeout_key(reader, n)).await.unwrap();
                    assert_eq!(
                        left, 0,
                        "case {case}: {reader}'s read hold {n} outlives its count"
                    );
                }
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
            // The messages: a read release that frees the lock tells the waiters ('1' when a
            // writer still waits, '0' otherwise); the last write hold given back tells every
            // waiter; a leave by the last waiting writer, unless a writer holds, tells the
            // readers it kept out.
            let _: Value = listener.ping(None).await.unwrap();
            let mut published = Vec::new();
            while let Ok(message) = messages.try_recv() {
                published.push(message.value.as_string().unwrap());
            }
            let writer_waits = model.waiting.values().any(|&end| end > now);
            let expected_published: Vec<String> = match kind {
                2 if expected != Reply::Stale && state.mode.is_some() && model.mode.is_none() => {
                    vec![if writer_waits { "1" } else { "0" }.into()]
                }
                3 if expected == Reply::Int(1) => vec!["1".into()],
                4 if expected == Reply::Int(1)
                    && !writer_waits
                    && model.mode != Some(Mode::Write) =>
                {
                    vec!["1".into()]
                }
                _ => Vec::new(),
            };
            assert_eq!(
                published, expected_published,
                "case {case}: call {kind} by {owner} replied {expected:?}: the messages"
            );
            published_in_all += published.len();
            // Durations to the millisecond, not only to the tick they are read in: the hash's
            // PTTL and each live read hold's.
            if model.mode.is_some() {
                assert_pttl(&raw, name, model.expires.saturating_sub(now), case).await;
            }
            for (&reader, ends) in &model.readers {
                for (n, &end) in ends.iter().enumerate().filter(|(_, &end)| end > now) {
                    assert_pttl(&raw, &timeout_key(reader, n + 1), end - now, case).await;
                }
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
            "{CASES} cases: {} read acquires, {} write acquires, {} read releases, {} write \
             releases, {} leaves, {} renewals ({reads_by_writers} of the reads by a writer); \
             {published_in_all} messages; {batches} renewals in a batch of two",
            kinds[0], kinds[1], kinds[2], kinds[3], kinds[4], kinds[5]
        );
    })
    .await;
}

//! The permit semaphore (`lua/permit_semaphore.lua`): permits are leases in a zset beside the
//! counter of permits available, each acquisition with a permit id of its own, timed by the
//! server's clock. The model runs its acquire, release and renew as atomic steps with the Lua's
//! branches, the client as the engine runs a permit (a hold whose field is the permit id: one
//! call at a time, lost replies fenced by the permit's next call, an acquire sent again with
//! the same id finds its grant, an undo gives back a permit whose acquire was given up,
//! watchdog renewals, the renew deadline), a network that delays, reorders and loses, a
//! server clock up to `drift` ahead, and crashes.
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

/// `renew` for one permit: extended only while its lease has not ended; a lease of 0 (the check
/// of a fixed-lease permit) only checks.
pub fn renew(server: &mut Server, now: u8, lease: u8, id: Permit) -> Reply {
    match server.leases.get_mut(&id) {
        Some(ends) if *ends > now => {
            if lease > 0 {
                *ends = now + lease;
            }
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
            // Kept until a reply settles them, as `Turn::request` keeps them (see `answered`
            // in model.rs).
            client.lost.clone()
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
                // A reply settles the ids its call fenced (`Turn::record_as`).
                client.lost.clear();
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
        // Every change publishes the new count on the channel: compared too.
        let listener = server.raw().await;
        let mut messages = listener.message_rx();
        listener.subscribe(channel).await.unwrap();
        let mut published_in_all = 0;
        let mut leases_set = 0;
        let mut batch_rng = rand::rngs::StdRng::seed_from_u64(44);
        let mut batches = 0;
        for case in 0..CASES {
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
            let clock_before = common::server_millis(&raw).await as i64;
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
                    // A third of the renewals are checks of a fixed-lease permit (a lease of 0).
                    let lease = if rng.gen_bool(0.3) { 0 } else { lease };
                    let expected = permits::renew(&mut model, now, lease, id);
                    let mut argv: Vec<Value> =
                        vec![(i64::from(lease) * TICK_MS).into(), permit_id(id).into()];
                    let mut keys = vec![leases];
                    // Half of them in a batch with another permit of the semaphore, as the
                    // watchdog sends them: each answered and renewed as if alone. A generator
                    // of its own, so that the cases' draws stay as they were.
                    let mut second = None;
                    if batch_rng.gen_bool(0.5) {
                        let other: permits::Permit =
                            (batch_rng.gen_range(0..3), batch_rng.gen_range(1..=2));
                        if other != id {
                            argv.push(permit_id(other).into());
                            keys.push(leases);
                            second = Some(permits::renew(&mut model, now, lease, other));
                        }
                    }
                    let got = raw.eval::<Value, _, _, _>(renew, keys, argv).await;
                    let first = first_of_batch(got, second, (case, "permit"), &mut batches);
                    (expected, first)
                }
            };
            let clock_after = common::server_millis(&raw).await as i64;
            // The messages: a call that ran gives back the ended leases first, publishing the
            // count then (if there were any); a release that gives its permit back publishes
            // the count after it.
            let _: Value = listener.ping(None).await.unwrap();
            let mut published = Vec::new();
            while let Ok(message) = messages.try_recv() {
                published.push(message.value.as_i64().unwrap());
            }
            let mut expected_published = Vec::new();
            if kind != 2 && expected != Reply::Stale {
                let ended = state.leases.values().filter(|&&end| end <= now).count() as i64;
                let available = state.available + ended;
                if ended > 0 {
                    expected_published.push(available);
                }
                if kind == 1 && expected == Reply::Int(1) {
                    expected_published.push(available + 1);
                }
            }
            assert_eq!(
                published, expected_published,
                "case {case}: call {kind} on {id:?} replied {expected:?}: the counts published"
            );
            published_in_all += published.len();
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
                // To the millisecond (a lease set 4 s short rounds to the same tick).
                let what = format!("{member}'s lease");
                let ticks = (base, now, ends);
                let set = end_set(case, &what, score, ticks, (clock_before, clock_after));
                leases_set += usize::from(set);
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
            "{CASES} cases: {} acquires, {} releases, {} renewals; {published_in_all} counts \
             published; {leases_set} leases set to the millisecond; {batches} renewals in a \
             batch of two",
            kinds[0], kinds[1], kinds[2]
        );
    })
    .await;
}

//! The reentrant lock's wake rule (issue 59): waiting clients stand in a line beside the lock,
//! and a release names the first live place in it just before its unlock message, so that one
//! client wakes instead of all (`lua/lock.lua`, `src/engine/pubsub.rs`).
//!
//! What is modelled: clients that start waiting (their first attempt at once: without the line
//! when the client is not subscribed to the lock's channel and handed it on to nobody just
//! before, which takes a free lock even when it is kept for another client, and otherwise joins
//! the channel and attempts again in line), attempts (the
//! acquire script: a win leaves the line, a busy reply takes a place or makes it last again
//! once a third of it has passed, a lock kept a moment for another named client is busy),
//! releases (the release script: the first place not yet ended, the lock kept for it, then
//! the message), the message delivered to each subscribed client in its own time (named:
//! a waiting client wakes; a client no longer waiting ends the keeping and passes the wake on
//! with an unlock message that names nobody; a client named by another's number lets it pass), waits given up (the
//! place stays until it ends), clients that stop listening or crash, a waiter's own pause (a
//! third of a place), and time. Deliveries and woken attempts take no time: a tick passes only
//! when none is pending, which is the engine's order of sizes (a round trip against a third of a
//! place, 1.7 s by default).
//!
//! Checked: a free lock with a client waiting is taken within a place's lease (no waiter is left
//! asleep longer), and time passes with the lock free and a client waiting only after a release
//! named a client that could not act on it (crashed, or no longer listening) or a woken waiter
//! gave up before its attempt: a release wakes a waiting client whenever one can be woken; and
//! a client never takes back, with a first attempt, a lock its own release kept for another
//! (its memory of the hand-over puts that attempt in line). The negative controls drop the
//! pause, the pass-on or the memory and find each property broken.

use super::*;

/// The bounds and the rules, in ticks.
#[derive(Clone, Debug)]
pub(crate) struct Wake {
    clients: u8,
    /// How long a place lasts without another attempt.
    place: u8,
    max_time: u8,
    /// Starts of waiting per client in all.
    max_waits: u8,
    /// Whether a waiter's own pause is a third of a place (false: it sleeps until woken, the
    /// negative control of the first property).
    pause: bool,
    /// Whether a client named with nobody waiting passes the wake on (false: the negative
    /// control of the second).
    pass_on: bool,
    /// Whether a client remembers that its release named another client, so that its next
    /// first attempt stands in line (false: the negative control of the third).
    remember: bool,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Client {
    alive: bool,
    waiting: bool,
    subscribed: bool,
    /// A wake-up taken and not yet acted on (its attempt is next).
    woken: bool,
    /// When its own pause ends (its next attempt without a wake-up).
    due: u8,
    holding: bool,
    /// Its last release named another client (which its client remembers a moment).
    handed_on: bool,
    waits: u8,
    /// Messages published and not yet delivered to it: `Some(number)` names a client first.
    inbox: Vec<Option<u8>>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub(crate) struct State {
    now: u8,
    holder: Option<u8>,
    /// Client -> when its place ends.
    line: BTreeMap<u8, u8>,
    /// The client the last release named, for which the lock is kept (`HAND_OVER`, well under
    /// a tick: it ends before time passes).
    kept: Option<u8>,
    clients: Vec<Client>,
    /// Since when the lock has been free with a client waiting.
    free_since: Option<u8>,
    /// Since the last win, a release named a client that could not act on it (crashed, or no
    /// longer listening, or listening no longer by the time it would read it), or a woken
    /// waiter gave its wait up or crashed before attempting (its wake-up went with it): the
    /// waiters may sleep out their pauses.
    excused: bool,
    woke_by_name: bool,
    passed_on: bool,
    /// A first attempt without the line took a lock kept for another client.
    took_kept: bool,
    /// ... and that client's own release had named the other.
    took_back: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Act {
    Want(u8),
    Attempt(u8),
    Release(u8),
    Deliver(u8),
    KeepingEnds,
    GiveUp(u8),
    StopListening(u8),
    Crash(u8),
    Tick,
}

impl Wake {
    fn live_first(&self, state: &State) -> Option<u8> {
        state
            .line
            .iter()
            .filter(|(_, ends)| **ends >= state.now)
            .min_by_key(|(client, ends)| (**ends, **client))
            .map(|(client, _)| *client)
    }

    fn publish(state: &mut State, message: Option<u8>) {
        for client in state.clients.iter_mut() {
            if client.alive && client.subscribed {
                client.inbox.push(message);
            }
        }
    }

    /// Whether something must happen before time passes: a delivery, the keeping's end, or an
    /// attempt woken or due.
    fn pending(state: &State) -> bool {
        state.kept.is_some()
            || state.clients.iter().any(|client| {
                client.alive && (!client.inbox.is_empty() || Wake::may_attempt(state, client))
            })
    }

    fn may_attempt(state: &State, client: &Client) -> bool {
        client.waiting && (client.woken || client.due <= state.now)
    }

    fn someone_waits(state: &State) -> bool {
        state
            .clients
            .iter()
            .any(|client| client.alive && client.waiting)
    }
}

impl Model for Wake {
    type State = State;
    type Action = Act;

    fn init_states(&self) -> Vec<State> {
        let client = Client {
            alive: true,
            waiting: false,
            subscribed: false,
            woken: false,
            due: 0,
            holding: false,
            handed_on: false,
            waits: 0,
            inbox: Vec::new(),
        };
        vec![State {
            now: 0,
            holder: None,
            line: BTreeMap::new(),
            kept: None,
            clients: vec![client; self.clients as usize],
            free_since: None,
            excused: false,
            woke_by_name: false,
            passed_on: false,
            took_kept: false,
            took_back: false,
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Act>) {
        for (i, client) in state.clients.iter().enumerate() {
            let i = i as u8;
            if !client.alive {
                continue;
            }
            if !client.waiting && !client.holding && client.waits < self.max_waits {
                actions.push(Act::Want(i));
            }
            if Wake::may_attempt(state, client) {
                actions.push(Act::Attempt(i));
            }
            if client.holding {
                actions.push(Act::Release(i));
            }
            if !client.inbox.is_empty() {
                actions.push(Act::Deliver(i));
            }
            if client.waiting {
                actions.push(Act::GiveUp(i));
            }
            if !client.waiting && client.subscribed {
                actions.push(Act::StopListening(i));
            }
            if !client.holding {
                actions.push(Act::Crash(i));
            }
        }
        if state.kept.is_some() {
            actions.push(Act::KeepingEnds);
        }
        if state.now < self.max_time && !Wake::pending(state) {
            actions.push(Act::Tick);
        }
    }

    fn next_state(&self, last: &State, action: Act) -> Option<State> {
        let mut state = last.clone();
        let pause = if self.pause { self.place / 3 } else { u8::MAX };
        match action {
            Act::Want(i) => {
                let client = &mut state.clients[i as usize];
                client.waits += 1;
                let in_line = client.subscribed || (self.remember && client.handed_on);
                let handed_on = std::mem::take(&mut client.handed_on);
                if !in_line && state.holder.is_none() {
                    // A first attempt without the line: a free lock is taken, kept or not.
                    let kept_for_another = state.kept.is_some_and(|named| named != i);
                    state.took_kept |= kept_for_another;
                    state.took_back |= kept_for_another && handed_on;
                    state.holder = Some(i);
                    state.excused = false;
                    client.holding = true;
                } else {
                    // In line from the first attempt, or after a busy reply without it: joins
                    // the channel and attempts again at once, in line.
                    client.waiting = true;
                    client.subscribed = true;
                    client.woken = true;
                }
            }
            Act::Attempt(i) => {
                let now = state.now;
                let client = &mut state.clients[i as usize];
                client.woken = false;
                let kept_for_another = state.kept.is_some_and(|named| named != i);
                if state.kept == Some(i) {
                    state.kept = None;
                }
                if state.holder.is_none() && !kept_for_another {
                    state.holder = Some(i);
                    state.excused = false;
                    client.waiting = false;
                    client.holding = true;
                    state.line.remove(&i);
                } else {
                    // Told busy, whether held or kept for another: it sleeps until named, or
                    // its pause ends.
                    client.due = now.saturating_add(pause);
                    let renew = match state.line.get(&i) {
                        None => true,
                        Some(ends) => {
                            3 * u16::from(ends.saturating_sub(now)) < 2 * u16::from(self.place)
                        }
                    };
                    if renew {
                        state.line.retain(|_, ends| *ends >= now);
                        state.line.insert(i, now + self.place);
                    }
                }
            }
            Act::Release(i) => {
                state.clients[i as usize].holding = false;
                state.holder = None;
                let first = self.live_first(&state);
                state.clients[i as usize].handed_on = first.is_some_and(|first| first != i);
                state.kept = first;
                if let Some(first) = first {
                    let named = &state.clients[first as usize];
                    if !named.alive || !named.subscribed {
                        state.excused = true;
                    }
                }
                Wake::publish(&mut state, first);
            }
            Act::Deliver(i) => {
                let message = state.clients[i as usize].inbox.remove(0);
                match message {
                    Some(named) if named == i => {
                        let client = &mut state.clients[i as usize];
                        if client.waiting {
                            client.woken = true;
                            state.woke_by_name = true;
                        } else if self.pass_on {
                            state.passed_on = true;
                            if state.kept == Some(i) {
                                state.kept = None;
                            }
                            Wake::publish(&mut state, None);
                        }
                    }
                    // Another client's number: its unlock message is let pass.
                    Some(_) => {}
                    None => {
                        let client = &mut state.clients[i as usize];
                        if client.waiting {
                            client.woken = true;
                        }
                    }
                }
            }
            Act::KeepingEnds => state.kept = None,
            Act::GiveUp(i) => {
                let client = &mut state.clients[i as usize];
                if client.woken {
                    state.excused = true;
                }
                client.waiting = false;
                client.woken = false;
            }
            Act::StopListening(i) => {
                let client = &mut state.clients[i as usize];
                // A release that named it, not yet read when its subscription ended (it had
                // lingered its second since its last waiter left): the wake goes with it.
                if client.inbox.contains(&Some(i)) {
                    state.excused = true;
                }
                client.subscribed = false;
                client.inbox.clear();
            }
            Act::Crash(i) => {
                let client = &mut state.clients[i as usize];
                if client.woken || client.inbox.contains(&Some(i)) {
                    state.excused = true;
                }
                client.alive = false;
                client.waiting = false;
                client.subscribed = false;
                client.woken = false;
                client.inbox.clear();
            }
            Act::Tick => state.now += 1,
        }
        state.free_since = if state.holder.is_none() && Wake::someone_waits(&state) {
            Some(last.free_since.unwrap_or(state.now))
        } else {
            None
        };
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut properties = vec![
            Property::always(
                "no waiter is left asleep while the lock is free longer than a place's lease",
                |model: &Wake, state: &State| {
                    state
                        .free_since
                        .is_none_or(|since| state.now - since <= model.place)
                },
            ),
            Property::always(
                "a release wakes a waiting client whenever one can be woken",
                |_, state: &State| {
                    // Only where time may pass: before, a delivery or a woken attempt is due.
                    Wake::pending(state)
                        || state.holder.is_some()
                        || !Wake::someone_waits(state)
                        || state.excused
                },
            ),
            Property::always(
                "a client does not take back a lock its release kept for another",
                |_, state: &State| !state.took_back,
            ),
            Property::sometimes("woken by name", |_, state: &State| state.woke_by_name),
            Property::sometimes("a wake was passed on", |_, state: &State| state.passed_on),
        ];
        // Only a third client can: of two, the one not named is the one whose release named
        // the other, and it stands in line.
        if self.clients >= 3 {
            properties.push(Property::sometimes(
                "a first attempt without the line took a lock kept for another",
                |_, state: &State| state.took_kept,
            ));
        }
        properties
    }

    fn within_boundary(&self, state: &State) -> bool {
        state.now <= self.max_time
    }
}

fn bounded_wake() -> Wake {
    Wake {
        clients: bound("FREDLOCK_MODEL_CLIENTS", 3),
        place: 3,
        max_time: bound("FREDLOCK_MODEL_TICKS", 4),
        max_waits: bound("FREDLOCK_MODEL_WAITS", 1),
        pause: true,
        pass_on: true,
        remember: true,
    }
}

#[test]
fn the_wake_rule_holds_to_the_bound() {
    check_to_the_bound(bounded_wake(), None);
}

/// Clients that want the lock again after they held it: a release that named another client
/// makes the releasing client's next first attempt stand in line, and any other client's first
/// attempt may take a lock kept for another. Two clients, two waits each (three clients with
/// two waits each is beyond a test's time).
#[test]
fn the_wake_rule_holds_for_clients_that_want_again() {
    check_to_the_bound(
        Wake {
            clients: 2,
            max_waits: 2,
            ..bounded_wake()
        },
        None,
    );
}

/// Without the memory of a hand-over, a client whose release named the other takes the lock
/// back with its next first attempt, while it is kept for the other.
#[test]
fn the_wake_model_fails_without_the_memory_of_a_hand_over() {
    let steps = counterexample(
        Wake {
            clients: 2,
            max_waits: 2,
            remember: false,
            ..bounded_wake()
        },
        "a client does not take back a lock its release kept for another",
        None,
    );
    assert!(
        steps.iter().any(|step| matches!(step, Act::Release(_))),
        "{steps:?}"
    );
}

/// Without its own pause a waiter behind a crashed client's place sleeps on; without the pass-on
/// a wait given up as a release named its client leaves the others asleep.
#[test]
fn the_wake_model_fails_without_the_pause_or_the_pass_on() {
    let steps = counterexample(
        Wake {
            pause: false,
            ..bounded_wake()
        },
        "no waiter is left asleep while the lock is free longer than a place's lease",
        None,
    );
    assert!(
        steps
            .iter()
            .any(|step| matches!(step, Act::Crash(_) | Act::StopListening(_) | Act::GiveUp(_))),
        "{steps:?}"
    );
    let steps = counterexample(
        Wake {
            pass_on: false,
            ..bounded_wake()
        },
        "a release wakes a waiting client whenever one can be woken",
        None,
    );
    assert!(
        steps.iter().any(|step| matches!(step, Act::GiveUp(_))),
        "{steps:?}"
    );
}

//! The scripts, as the model runs them: one function per script section, each one atomic
//! step, with the same branches as the Lua.
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
pub(crate) fn purge(server: &mut Server, now: u8, caller: Option<Owner>) -> Option<Owner> {
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

/// `lock.lua` `renew` for one key: extended only while the owner's field is there; a lease of
/// 0 (the watchdog's check of a fixed-lease hold) only checks, and leaves the expiry.
pub fn renew(server: &mut Server, now: u8, owner: Owner, lease: u8) -> Reply {
    if server.holds.contains_key(&owner) {
        if lease > 0 {
            server.expires = now + lease;
        }
        Reply::Int(1)
    } else {
        Reply::Int(0)
    }
}

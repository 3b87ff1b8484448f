//! The Lua scripts of the lock family, composed here and nowhere else: each is its shared
//! preambles (`lua/holds.lua`, then `lua/fair_queue.lua` for the fair lock, then
//! `lua/delete_lock.lua` for a force unlock) followed by its own file; a read-write lock's
//! scripts are sections of one file, `lua/rw_lock.lua`, after its head. A preamble goes only
//! into the scripts that use it: Redis runs a script's whole text, making every function it
//! defines, on every call. Tests and the benchmark read the composed text through [`source`].
//!
//! The scripts that free memory or keep a hold alive (releases, renewals, leaves, force
//! unlocks) are [`Script::freeing`]: they carry the `allow-oom` flag, so that a server full to
//! its `maxmemory` still lets go of a lock.

use std::sync::LazyLock;

use crate::engine::Script;

/// The fences of lost replies, which every script that changes a primitive starts with.
const FENCES: &str = include_str!("../lua/fences.lua");
/// The fences, then the rules of the hash of holds, which every lock script but the renewal
/// starts with.
const HOLDS: &str = concat!(
    include_str!("../lua/fences.lua"),
    include_str!("../lua/holds.lua")
);
/// The queue functions every fair-lock script starts with, after [`HOLDS`].
const FAIR_QUEUE: &str = include_str!("../lua/fair_queue.lua");

/// Deleting a lock whoever holds it, which the force-unlock scripts start with, after the others.
const DELETE_LOCK: &str = include_str!("../lua/delete_lock.lua");

/// A script of the reentrant lock's family (reentrant, fenced, spin): [`HOLDS`], then `body`.
pub(crate) fn holds_script(body: &str) -> Script {
    Script::new(&[HOLDS, body])
}

/// A fair-lock script: [`HOLDS`], [`FAIR_QUEUE`], then `body`.
fn fair_script(body: &str) -> Script {
    Script::new(&[HOLDS, FAIR_QUEUE, body])
}

/// A fair-lock script that frees memory: as [`fair_script`], with `allow-oom`.
fn fair_freeing(body: &str) -> Script {
    Script::freeing(&[HOLDS, FAIR_QUEUE, body])
}

/// Takes or re-enters a reentrant lock.
pub(crate) static LOCK_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| holds_script(include_str!("../lua/lock_acquire.lua")));
/// Gives back one hold of a reentrant lock.
pub(crate) static LOCK_RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::freeing(&[HOLDS, include_str!("../lua/lock_release.lua")]));
/// Extends many watchdog-held locks in one call.
pub(crate) static LOCK_RENEW: LazyLock<Script> =
    LazyLock::new(|| Script::freeing(&[include_str!("../lua/lock_renew.lua")]));
/// Deletes a lock whoever holds it.
pub(crate) static LOCK_FORCE_UNLOCK: LazyLock<Script> = LazyLock::new(|| {
    Script::freeing(&[
        HOLDS,
        DELETE_LOCK,
        include_str!("../lua/lock_force_unlock.lua"),
    ])
});

/// Takes, re-enters or queues for a fair lock.
pub(crate) static FAIR_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| fair_script(include_str!("../lua/fair_acquire.lua")));
/// Gives back one hold of a fair lock, telling the first waiter when it is free.
pub(crate) static FAIR_RELEASE: LazyLock<Script> =
    LazyLock::new(|| fair_freeing(include_str!("../lua/fair_release.lua")));
/// Takes a waiter out of a fair lock's queue.
pub(crate) static FAIR_LEAVE: LazyLock<Script> =
    LazyLock::new(|| fair_freeing(include_str!("../lua/fair_leave.lua")));
/// Deletes a fair lock whoever holds it, telling the first waiter.
pub(crate) static FAIR_FORCE_UNLOCK: LazyLock<Script> = LazyLock::new(|| {
    Script::freeing(&[
        HOLDS,
        FAIR_QUEUE,
        DELETE_LOCK,
        include_str!("../lua/fair_force_unlock.lua"),
    ])
});

/// The reads every inspect script starts with.
const INSPECT: &str = include_str!("../lua/inspect.lua");

/// Reads a lock of the reentrant family for an inspection.
pub(crate) static LOCK_INSPECT: LazyLock<Script> =
    LazyLock::new(|| Script::new(&[INSPECT, include_str!("../lua/lock_inspect.lua")]));
/// Reads a fair lock, with its queue, for an inspection.
pub(crate) static FAIR_INSPECT: LazyLock<Script> =
    LazyLock::new(|| Script::new(&[INSPECT, include_str!("../lua/fair_inspect.lua")]));

/// Every script of the read-write lock: a head, then one section per script.
const RW_LOCK: &str = include_str!("../lua/rw_lock.lua");

/// Where each section of a primitive's file of scripts starts: a line of its own with this and
/// the script's name.
const SECTION: &str = "--- script: ";

/// The head of `file` (what comes before its first section), then its section `name`: one
/// script of a primitive whose scripts share a file. A name that is no section makes a script
/// that fails on every call, which every test of the primitive would show.
fn sections(file: &'static str, name: &str) -> [&'static str; 2] {
    let head_end = file.find(SECTION).unwrap_or(file.len());
    let marker = format!("{SECTION}{name}\n");
    let body = file
        .find(&marker)
        .map_or("error('no such script')", |start| {
            let rest = &file[start..];
            let end = rest[marker.len()..]
                .find(SECTION)
                .map_or(rest.len(), |end| end + marker.len());
            &rest[..end]
        });
    [&file[..head_end], body]
}

/// The head of [`RW_LOCK`], then its section `name`: a script of the read-write lock.
fn rw_parts(name: &str) -> [&'static str; 2] {
    sections(RW_LOCK, name)
}

/// A read-write lock script that changes holds: [`HOLDS`], then [`rw_parts`].
fn rw_script(name: &str, freeing: bool) -> Script {
    let [head, body] = rw_parts(name);
    if freeing {
        Script::freeing(&[HOLDS, head, body])
    } else {
        Script::new(&[HOLDS, head, body])
    }
}

/// Takes or re-enters a read hold of a read-write lock.
pub(crate) static RW_READ_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| rw_script("read_acquire", false));
/// Takes or re-enters the write hold of a read-write lock, or waits for it.
pub(crate) static RW_WRITE_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| rw_script("write_acquire", false));
/// Gives back read holds.
pub(crate) static RW_READ_RELEASE: LazyLock<Script> =
    LazyLock::new(|| rw_script("read_release", true));
/// Gives back write holds.
pub(crate) static RW_WRITE_RELEASE: LazyLock<Script> =
    LazyLock::new(|| rw_script("write_release", true));
/// Takes a waiting writer's place away.
pub(crate) static RW_LEAVE: LazyLock<Script> = LazyLock::new(|| rw_script("leave", true));
/// Extends many read and write holds in one call.
pub(crate) static RW_RENEW: LazyLock<Script> = LazyLock::new(|| {
    let [head, body] = rw_parts("renew");
    Script::freeing(&[head, body])
});
/// Deletes a read-write lock whoever holds it.
pub(crate) static RW_FORCE_UNLOCK: LazyLock<Script> = LazyLock::new(|| {
    let [head, body] = rw_parts("force_unlock");
    Script::freeing(&[head, body])
});
/// Counts an owner's live holds of a read-write lock.
pub(crate) static RW_HOLD_COUNT: LazyLock<Script> = LazyLock::new(|| {
    let [head, body] = rw_parts("hold_count");
    Script::new(&[head, body])
});
/// Reads a read-write lock for an inspection.
pub(crate) static RW_INSPECT: LazyLock<Script> = LazyLock::new(|| {
    let [head, body] = rw_parts("inspect");
    Script::new(&[INSPECT, head, body])
});

/// Redisson's counters (a semaphore's permits, a latch's count): the integer check and the
/// server clock their scripts start with.
const COUNTER: &str = include_str!("../lua/counter.lua");

/// A script of a counter primitive's `file`, section `name`: [`FENCES`] (for one whose calls
/// are fenced) and [`COUNTER`], then [`sections`]; `freeing` as [`Script::freeing`].
pub(crate) fn counter_script(
    file: &'static str,
    name: &str,
    fences: bool,
    freeing: bool,
) -> Script {
    let [head, body] = sections(file, name);
    let fences = if fences { FENCES } else { "" };
    let parts = [fences, COUNTER, head, body];
    if freeing {
        Script::freeing(&parts)
    } else {
        Script::new(&parts)
    }
}

/// A read-only inspect script of a counter primitive's `file`: [`INSPECT`], then its head and
/// its `inspect` section.
pub(crate) fn counter_inspect(file: &'static str) -> Script {
    let [head, body] = sections(file, "inspect");
    Script::new(&[INSPECT, head, body])
}

/// The token check both Redlock scripts start with.
const REDLOCK_TOKEN: &str = include_str!("../lua/redlock_token.lua");

/// Deletes a Redlock node's key if it carries the given token.
pub(crate) static REDLOCK_RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::freeing(&[REDLOCK_TOKEN, include_str!("../lua/redlock_release.lua")]));
/// Sets a new lease on a Redlock node's key if it carries the given token.
pub(crate) static REDLOCK_EXTEND: LazyLock<Script> =
    LazyLock::new(|| Script::freeing(&[REDLOCK_TOKEN, include_str!("../lua/redlock_extend.lua")]));

/// The composed text of the script named after its file in `lua/` (`"lock_acquire"`,
/// `"fair_release"`, `"fenced_acquire"`..): what the crate sends, for tests and the benchmark
/// that call a script by hand. `None` for a name that is no script.
#[doc(hidden)]
pub fn source(name: &str) -> Option<&'static str> {
    let script: &'static Script = match name {
        "lock_acquire" => &LOCK_ACQUIRE,
        "lock_release" => &LOCK_RELEASE,
        "lock_renew" => &LOCK_RENEW,
        "lock_force_unlock" => &LOCK_FORCE_UNLOCK,
        "fair_acquire" => &FAIR_ACQUIRE,
        "fair_release" => &FAIR_RELEASE,
        "fair_leave" => &FAIR_LEAVE,
        "fair_force_unlock" => &FAIR_FORCE_UNLOCK,
        "fenced_acquire" => &crate::fenced_lock::FENCED_ACQUIRE,
        "lock_inspect" => &LOCK_INSPECT,
        "fair_inspect" => &FAIR_INSPECT,
        "rw_read_acquire" => &RW_READ_ACQUIRE,
        "rw_write_acquire" => &RW_WRITE_ACQUIRE,
        "rw_read_release" => &RW_READ_RELEASE,
        "rw_write_release" => &RW_WRITE_RELEASE,
        "rw_leave" => &RW_LEAVE,
        "rw_renew" => &RW_RENEW,
        "rw_force_unlock" => &RW_FORCE_UNLOCK,
        "rw_hold_count" => &RW_HOLD_COUNT,
        "rw_inspect" => &RW_INSPECT,
        "semaphore_acquire" => &crate::semaphore::ACQUIRE,
        "semaphore_release" => &crate::semaphore::RELEASE,
        "semaphore_add" => &crate::semaphore::ADD,
        "permit_semaphore_acquire" => &crate::permit_semaphore::ACQUIRE,
        "permit_semaphore_release" => &crate::permit_semaphore::RELEASE,
        "latch_count_down" => &crate::latch::COUNT_DOWN,
        "redlock_release" => &REDLOCK_RELEASE,
        "redlock_extend" => &REDLOCK_EXTEND,
        _ => return None,
    };
    Some(script.body())
}

//! How a primitive's Lua scripts are composed: its one file in `lua/` (a head, then one section
//! per script) after the shared preambles it uses. A preamble goes only into the scripts that
//! use it: Redis runs a script's whole text, making every function it defines, on every call.
//! The one exception is [`PROTECTED`], first in every script (one function, about 320 server
//! instructions a call: BENCHMARKS.md), so that no protected call reads a refusal as a key of
//! another type.
//! Each primitive composes its own scripts with these helpers; this module knows none of them.
//!
//! The scripts that free memory or keep a hold alive (releases, renewals, leaves, force
//! unlocks) are [`Script::freeing`]: they carry the `allow-oom` flag, so that a server full to
//! its `maxmemory` still lets go of a lock.

use crate::engine::Script;

/// How a protected call's failure is read (a key of another type, or a refusal raised again),
/// which every script starts with: [`compose`] and [`inspect_script`] put it first.
pub(crate) const PROTECTED: &str = include_str!("../lua/protected.lua");
/// The fences of lost replies, which every script that changes a primitive starts with.
pub(crate) const FENCES: &str = include_str!("../lua/fences.lua");
/// The fences, then the rules of the hash of holds, which every lock script but the renewal
/// starts with.
pub(crate) const HOLDS: &str = concat!(
    include_str!("../lua/fences.lua"),
    include_str!("../lua/holds.lua")
);
/// Fencing tokens (a fenced lock's, a leader election's epochs), which their acquire scripts
/// take after [`HOLDS`].
pub(crate) const TOKENS: &str = include_str!("../lua/tokens.lua");
/// Deleting a lock whoever holds it, which the force-unlock scripts start with, after the others.
pub(crate) const DELETE_LOCK: &str = include_str!("../lua/delete_lock.lua");
/// The reads every inspect script starts with.
pub(crate) const INSPECT_HEAD: &str = include_str!("../lua/inspect.lua");
/// Redisson's counters (a semaphore's permits, a latch's count): the integer check and the
/// server clock their scripts start with.
pub(crate) const COUNTER: &str = include_str!("../lua/counter.lua");

/// The Redis commands each preamble runs, for the classes of the primitives whose scripts start
/// with it ([`Class::commands`](crate::engine::Class)); a unit test keeps each equal to its
/// file.
pub(crate) const FENCES_COMMANDS: &[&str] = &["pexpire", "sadd", "sismember"];
/// See [`FENCES_COMMANDS`]: [`HOLDS`]' (with the fences').
pub(crate) const HOLDS_COMMANDS: &[&str] = &[
    "exists",
    "hdel",
    "hexists",
    "hset",
    "pexpire",
    "pttl",
    "sadd",
    "sismember",
];
/// See [`FENCES_COMMANDS`]: [`TOKENS`]'.
pub(crate) const TOKENS_COMMANDS: &[&str] = &["exists", "get", "incr", "set", "time"];
/// See [`FENCES_COMMANDS`]: [`DELETE_LOCK`]' (its `PUBLISH` is asked about on the channel).
pub(crate) const DELETE_LOCK_COMMANDS: &[&str] = &["del", "hgetall", "hkeys", "hlen", "type"];
/// See [`FENCES_COMMANDS`]: [`INSPECT_HEAD`]'.
pub(crate) const INSPECT_COMMANDS: &[&str] = &["get", "hgetall", "pttl", "time"];
/// See [`FENCES_COMMANDS`]: [`COUNTER`]'.
pub(crate) const COUNTER_COMMANDS: &[&str] = &["get", "time"];

/// Where each section of a primitive's file of scripts starts: a line of its own with this and
/// the script's name.
const SECTION: &str = "--- script: ";

/// The head of `file` (what comes before its first section), then its section `name`: one
/// script of a primitive. A name that is no section makes a script that fails on every call,
/// which every test of the primitive would show.
pub(crate) fn sections(file: &'static str, name: &str) -> [&'static str; 2] {
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

/// A script made of [`PROTECTED`], then `parts` in order, freeing ([`Script::freeing`]) or not.
pub(crate) fn compose(parts: &[&str], freeing: bool) -> Script {
    let mut all = Vec::with_capacity(parts.len() + 1);
    all.push(PROTECTED);
    all.extend_from_slice(parts);
    if freeing {
        Script::freeing(&all)
    } else {
        Script::new(&all)
    }
}

/// A script of `file`'s head and its section `name` alone, with no shared preamble.
pub(crate) fn section_script(file: &'static str, name: &str, freeing: bool) -> Script {
    compose(&sections(file, name), freeing)
}

/// A script of a lock of the hash-of-holds family: [`HOLDS`], then `file`'s head and its
/// section `name`.
pub(crate) fn holds_script(file: &'static str, name: &str, freeing: bool) -> Script {
    let [head, body] = sections(file, name);
    compose(&[HOLDS, head, body], freeing)
}

/// An acquire script that issues fencing tokens: [`HOLDS`], [`TOKENS`], then `file`'s head and
/// its section `name`.
pub(crate) fn tokens_script(file: &'static str, name: &str) -> Script {
    let [head, body] = sections(file, name);
    compose(&[HOLDS, TOKENS, head, body], false)
}

/// A read-only inspect script of `file`: [`INSPECT_HEAD`], then its section `inspect`, with its head
/// when `with_head`.
pub(crate) fn inspect_script(file: &'static str, with_head: bool) -> Script {
    let [head, body] = sections(file, "inspect");
    let head = if with_head { head } else { "" };
    Script::new(&[PROTECTED, INSPECT_HEAD, head, body])
}

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
    compose(&[fences, COUNTER, head, body], freeing)
}

/// Every command `redis.call` or `redis.pcall` runs in `files`, publishing aside (asked about
/// on a channel), sorted.
#[cfg(test)]
pub(crate) fn commands_run(files: &[&str]) -> Vec<String> {
    let mut run = std::collections::BTreeSet::new();
    for text in files {
        for call in ["redis.call('", "redis.pcall('"] {
            for (at, _) in text.match_indices(call) {
                let rest = &text[at + call.len()..];
                let end = rest.find('\'').unwrap_or(rest.len());
                run.insert(rest[..end].to_lowercase());
            }
        }
    }
    run.remove("publish");
    run.into_iter().collect()
}

/// The commands of `groups`, each once, sorted.
#[cfg(test)]
fn flattened(groups: &[&[&str]]) -> Vec<String> {
    let all: std::collections::BTreeSet<String> = groups
        .iter()
        .flat_map(|group| group.iter().map(|command| (*command).to_owned()))
        .collect();
    all.into_iter().collect()
}

/// A primitive's unit test of its commands: each of `classes` names (over its groups) exactly
/// what `files` run (its Lua file, the preambles its scripts start with, the other files whose
/// scripts it calls, and a command it sends by itself as `redis.call('set'`), and
/// docs/SECURITY.md's row for each of `kinds` gives the same.
#[cfg(test)]
pub(crate) fn check_commands(classes: &[&crate::engine::Class], files: &[&str], kinds: &[&str]) {
    let run = commands_run(files);
    for class in classes {
        assert_eq!(flattened(class.commands), run, "{}'s class", class.label);
    }
    for kind in kinds {
        assert_eq!(
            documented_commands(kind),
            run,
            "docs/SECURITY.md's row for {kind}"
        );
    }
}

/// The commands docs/SECURITY.md's table "A user for some kinds only" gives for `kind` (its row
/// whose first cell names it), sorted; empty when no row does.
#[cfg(test)]
fn documented_commands(kind: &str) -> Vec<String> {
    let named = format!("`{kind}`");
    let row = include_str!("../docs/SECURITY.md")
        .lines()
        .filter(|line| line.starts_with("| `"))
        .find(|line| {
            line.split('|')
                .nth(1)
                .is_some_and(|cell| cell.contains(&named))
        });
    let Some(cells) = row.map(|row| row.split('|').collect::<Vec<_>>()) else {
        return Vec::new();
    };
    let words: Vec<&str> = cells
        .get(2)
        .map(|cell| cell.trim().trim_matches('`').split_whitespace().collect())
        .unwrap_or_default();
    flattened(&[&words])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each preamble's list of commands is what its file runs.
    #[test]
    fn each_preamble_names_the_commands_it_runs() {
        for (text, commands) in [
            (FENCES, FENCES_COMMANDS),
            (HOLDS, HOLDS_COMMANDS),
            (TOKENS, TOKENS_COMMANDS),
            (DELETE_LOCK, DELETE_LOCK_COMMANDS),
            (INSPECT_HEAD, INSPECT_COMMANDS),
            (COUNTER, COUNTER_COMMANDS),
            (PROTECTED, &[]),
        ] {
            assert_eq!(flattened(&[commands]), commands_run(&[text]));
        }
    }
}

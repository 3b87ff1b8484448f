//! The Lua scripts in `lua/`, compiled in and run with `EVALSHA`, falling back on `EVAL` when
//! the server does not have them cached (after a restart, a `SCRIPT FLUSH` or a failover).

use std::sync::LazyLock;

use fred::clients::Client;
use fred::interfaces::LuaInterface;
use fred::types::{FromValue, Key, Value};

/// A script whose SHA1 is computed once per process.
pub(crate) struct Script {
    body: String,
    sha: String,
}

/// The rules of the hash of holds, which every lock script but the renewal starts with.
const HOLDS: &str = include_str!("../lua/holds.lua");
/// The queue functions every fair-lock script starts with, after [`HOLDS`].
const FAIR_QUEUE: &str = include_str!("../lua/fair_queue.lua");

impl Script {
    /// A script made of `parts`, in order: shared functions first, then the script itself.
    fn new(parts: &[&str]) -> Script {
        let body = parts.concat();
        Script {
            sha: fred::util::sha1_hash(&body),
            body,
        }
    }

    /// A reentrant-lock script.
    fn reentrant(body: &str) -> Script {
        Script::new(&[HOLDS, body])
    }

    /// A fair-lock script.
    fn fair(body: &str) -> Script {
        Script::new(&[HOLDS, FAIR_QUEUE, body])
    }

    /// Runs the script: one round trip when the server has it cached, two the first time.
    ///
    /// `call` makes the keys and arguments; it is called again only for the `EVAL` fallback,
    /// so the common path builds them once.
    pub(crate) async fn run<R: FromValue>(
        &self,
        redis: &Client,
        call: impl Fn() -> (Vec<Key>, Vec<Value>),
    ) -> Result<R, fred::error::Error> {
        let (keys, args) = call();
        match redis
            .evalsha::<R, _, _, _>(self.sha.as_str(), keys, args)
            .await
        {
            Err(error) if error.details().starts_with("NOSCRIPT") => {
                let (keys, args) = call();
                redis.eval(self.body.as_str(), keys, args).await
            }
            other => other,
        }
    }
}

/// Takes or re-enters a reentrant lock.
pub(crate) static LOCK_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::reentrant(include_str!("../lua/lock_acquire.lua")));
/// Gives back one hold of a reentrant lock.
pub(crate) static LOCK_RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::reentrant(include_str!("../lua/lock_release.lua")));
/// Extends many watchdog-held locks in one call.
pub(crate) static LOCK_RENEW: LazyLock<Script> =
    LazyLock::new(|| Script::new(&[include_str!("../lua/lock_renew.lua")]));
/// Deletes a lock whoever holds it.
pub(crate) static LOCK_FORCE_UNLOCK: LazyLock<Script> =
    LazyLock::new(|| Script::reentrant(include_str!("../lua/lock_force_unlock.lua")));

/// Takes, re-enters or queues for a fair lock.
pub(crate) static FAIR_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::fair(include_str!("../lua/fair_acquire.lua")));
/// Gives back one hold of a fair lock, telling the first waiter when it is free.
pub(crate) static FAIR_RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::fair(include_str!("../lua/fair_release.lua")));
/// Takes a waiter out of a fair lock's queue.
pub(crate) static FAIR_LEAVE: LazyLock<Script> =
    LazyLock::new(|| Script::fair(include_str!("../lua/fair_leave.lua")));
/// Deletes a fair lock whoever holds it, telling the first waiter.
pub(crate) static FAIR_FORCE_UNLOCK: LazyLock<Script> =
    LazyLock::new(|| Script::fair(include_str!("../lua/fair_force_unlock.lua")));

/// The token check both Redlock scripts start with.
const REDLOCK_TOKEN: &str = include_str!("../lua/redlock_token.lua");

/// Deletes a Redlock node's key if it carries the given token.
pub(crate) static REDLOCK_RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(&[REDLOCK_TOKEN, include_str!("../lua/redlock_release.lua")]));
/// Sets a new TTL on a Redlock node's key if it carries the given token.
pub(crate) static REDLOCK_EXTEND: LazyLock<Script> =
    LazyLock::new(|| Script::new(&[REDLOCK_TOKEN, include_str!("../lua/redlock_extend.lua")]));

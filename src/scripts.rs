//! The Lua scripts in `lua/`, compiled in and run with `EVALSHA`, falling back on `EVAL` when
//! the server does not have them cached (after a restart, a `SCRIPT FLUSH` or a failover).

use std::sync::LazyLock;
use std::time::Duration;

use fred::clients::Client;
use fred::interfaces::{ClientLike, LuaInterface};
use fred::types::{FromValue, Key, Value};
use tokio::time::Instant;

use crate::error::was_not_sent;

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
    ///
    /// A call fred could not send at all (no connection to route it to, while it reconnects)
    /// never ran, so it is sent again once the connection is back, within the client's command
    /// timeout: as if fred had queued it, which it does for calls made a moment earlier or later.
    /// Every script call gets this here, whatever it does.
    pub(crate) async fn run<R: FromValue>(
        &self,
        redis: &Client,
        call: impl Fn() -> (Vec<Key>, Vec<Value>),
    ) -> Result<R, fred::error::Error> {
        let mut resend: Option<Resend> = None;
        loop {
            let (keys, args) = call();
            let outcome = match redis
                .evalsha::<R, _, _, _>(self.sha.as_str(), keys, args)
                .await
            {
                Err(error) if error.details().starts_with("NOSCRIPT") => {
                    let (keys, args) = call();
                    redis.eval(self.body.as_str(), keys, args).await
                }
                other => other,
            };
            match outcome {
                Err(error) if was_not_sent(&error) => {
                    let resend = resend.get_or_insert_with(|| Resend::new(redis));
                    if !Box::pin(resend.wait(redis)).await {
                        return Err(error);
                    }
                }
                other => return other,
            }
        }
    }
}

/// Sending a call again, within one command timeout from the first failure: a call fred could
/// not send (here), or a call safe to repeat whose reply was lost (a release, a leave).
pub(crate) struct Resend {
    until: Instant,
    pause: Duration,
}

impl Resend {
    pub(crate) fn new(redis: &Client) -> Resend {
        Resend {
            until: Instant::now() + redis.perf_config().default_command_timeout,
            pause: Duration::from_millis(20),
        }
    }

    /// Waits for the connection (or a pause); false once the command timeout has passed.
    pub(crate) async fn wait(&mut self, redis: &Client) -> bool {
        if Instant::now() >= self.until {
            return false;
        }
        tokio::select! {
            _ = redis.wait_for_connect() => {}
            _ = tokio::time::sleep_until((Instant::now() + self.pause).min(self.until)) => {}
        }
        self.pause = (self.pause * 2).min(Duration::from_secs(1));
        true
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

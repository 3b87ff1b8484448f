//! The one check of a client's ACL permissions, before its first call writes anything.
//!
//! Redis checks a script's commands one at a time, as it runs them, and keeps what the script
//! wrote before the one it refused: a user without `pexpire` would leave a lock's hash behind
//! with no TTL, held for ever. So before a client's first call on a kind of primitive the
//! engine asks the server, in one script, whether the client's user may run every command
//! that kind's calls run ([`Class::commands`], which each primitive names) and pub/sub, on
//! that call's key and wake channel and the client's own channel (`redis.acl_check_cmd`,
//! Redis 7 and Valkey; a server without it is not asked). A refusal fails that call with a
//! `NOPERM` error naming the command and what it was checked on, and the next call asks
//! again; once the answer for a kind is yes, no call of that kind asks again (one atomic load
//! on the hot path). A user allowed only the commands of the kinds it uses (docs/SECURITY.md
//! lists each kind's) uses them, and is refused at the first call of any other.
//!
//! A permission can be taken away later, while the client runs. The scripts ask about the
//! expiries they set before their first write (`lua/fences.lua`), and any call the server
//! refuses for want of a permission ([`is_refused_permission`]) forgets the yes and asks the
//! question again ([`Engine::refused`](super::Engine::refused)), so its error names the missing permission
//! and the lock as the first call's does, not a script's line.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::LazyLock;
use std::time::Duration;

use super::kind::Primitive;
use super::profile::{Class, Wake};
use super::script::Script;
use super::Core;
use super::Value;
use crate::error::{Error, RedisError, RedisErrorKind, Result};

/// The commands a client sends outside scripts on the connections it keeps (health checks,
/// confirming a subscription, the server's version and connection id), which a connection may
/// open without; a subcommand as `command|subcommand`, as ACL rules write it.
const CONNECTION_COMMANDS: &[&str] = &["ping", "info", "client|id"];

/// Asks with `redis.acl_check_cmd`: `KEYS[1]` is the name's key, `ARGV[1]` and `ARGV[2]` the
/// publish and subscribe commands, `ARGV[3]` how many channels follow (the client's own, only
/// subscribed to, then the lock's wake channel, also published on), then how many keys follow
/// (every key a call of the lock sends, checked for writing with `pexpire`, which every kind
/// runs), then how many commands follow that are checked on the key (the kind's), then the commands that take no key (the
/// connection's: a refusal names the command alone, never a key). Answers 1, 0 from a server
/// that cannot be asked, or a `NOPERM` error.
const PROBE: &str = r"
if redis.acl_check_cmd == nil then
  return 0
end
local key, publish, subscribe = KEYS[1], ARGV[1], ARGV[2]
local unsubscribe = subscribe == 'ssubscribe' and 'sunsubscribe' or 'unsubscribe'
local channels = tonumber(ARGV[3])
for i = 4, 3 + channels do
  local channel = ARGV[i]
  for _, command in ipairs({subscribe, unsubscribe}) do
    if not redis.acl_check_cmd(command, channel) then
      return redis.error_reply('NOPERM this user may not ' .. command .. ' channel ' .. channel)
    end
  end
  if i > 4 and not redis.acl_check_cmd(publish, channel, '0') then
    return redis.error_reply('NOPERM this user may not ' .. publish .. ' to channel ' .. channel)
  end
end
local keys = tonumber(ARGV[4 + channels])
local counted = 5 + channels + keys
local keyed = tonumber(ARGV[counted])
for i = counted + 1, #ARGV do
  local command = ARGV[i]
  local parent, sub = string.match(command, '^(%w+)|(%w+)$')
  if parent then
    if not redis.acl_check_cmd(parent, sub) then
      return redis.error_reply('NOPERM this user may not run the ' .. command .. ' command')
    end
  elseif i > counted + keyed then
    if not redis.acl_check_cmd(command) then
      return redis.error_reply('NOPERM this user may not run the ' .. command .. ' command')
    end
  elseif not redis.acl_check_cmd(command, key) then
    return redis.error_reply('NOPERM this user may not run the ' .. command ..
      ' command on key ' .. key)
  end
end
for i = 5 + channels, 4 + channels + keys do
  if not redis.acl_check_cmd('pexpire', ARGV[i]) then
    return redis.error_reply('NOPERM this user may not write key ' .. ARGV[i])
  end
end
return 1
";

static PROBE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(&[PROBE]));

/// The bit of a client's answers (`Core::permitted`) that stands for `class`'s yes: each class
/// takes the next at its first question; `None` past 64 classes, whose calls then ask each
/// time (the crate has 16).
fn bit(class: &Class) -> Option<u64> {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let mut slot = class.permission_bit.load(Ordering::Relaxed);
    if slot == u32::MAX {
        let next = NEXT.fetch_add(1, Ordering::Relaxed);
        // Two first questions at once: the one that lost keeps the winner's bit.
        slot = match class.permission_bit.compare_exchange(
            u32::MAX,
            next,
            Ordering::Relaxed,
            Ordering::Relaxed,
        ) {
            Ok(_) => next,
            Err(given) => given,
        };
    }
    (slot < 64).then(|| 1 << slot)
}

/// Whether the client's user has been found to have every permission `class`'s calls need.
pub(crate) fn known(core: &Core, class: &Class) -> bool {
    bit(class).is_some_and(|bit| core.permitted.load(Ordering::Relaxed) & bit != 0)
}

/// Whether `source` is the server refusing a command for want of a permission: its `NOPERM`
/// reply, or the error a script's refused command raises (Redis 7.0 words it "ERR The user
/// executing the script can't run this command or subcommand", "can't publish to the channel
/// mentioned in the command", "can't access at least one of the keys"; Valkey 9 "ERR ACL
/// failure in script: No permissions to access a channel").
pub(crate) fn is_refused_permission(source: &RedisError) -> bool {
    if source.kind() != RedisErrorKind::Refused {
        return false;
    }
    let details = source.details().to_ascii_lowercase();
    [
        "noperm",
        "user executing the script can't",
        "no permissions",
        "acl failure",
    ]
    .iter()
    .any(|words| details.contains(words))
}

/// Forgets every yes the client's user was given: the next call of each kind asks again.
pub(crate) fn forget(core: &Core) {
    core.permitted.store(0, Ordering::Relaxed);
}

/// Asks the server whether the client's user may do all a client does, on `kind`'s key and
/// channel (a waiter's own, for `owner`, where each waiter has one); a refusal names the missing
/// permission, the lock and `owner`. Only the server's answer fails the call: without one (an
/// outage, or no answer within `bound`, the call's wait) the call goes on unchecked. Boxed: it
/// runs once, and a caller's future should not carry its room.
pub(crate) fn check<'a>(
    core: &'a Core,
    kind: &'a dyn Primitive,
    owner: Option<&'a str>,
    bound: Option<Duration>,
) -> Pin<Box<dyn Future<Output = Result<()>> + Send + 'a>> {
    Box::pin(async move {
        ask(core, kind, owner, bound).await.map_err(|source| {
            Error::from_redis(&core.address, kind.profile().name(), owner, source)
        })
    })
}

/// What a call the server refused with `source` lacked: when `source` is a refusal for want of
/// a permission ([`is_refused_permission`]), the yes is forgotten and the question asked again
/// on `kind`'s key and channel, and its `NOPERM` answer (naming the command and the key or
/// channel) is returned; otherwise, or without an answer within `bound`, `source` as it is.
/// (`owner` as for [`check`].) The one path every refused call takes, whether the crate's
/// error or a node's (Redlock's) reports it.
pub(crate) fn named_refusal<'a>(
    core: &'a Core,
    kind: &'a dyn Primitive,
    owner: Option<&'a str>,
    bound: Option<Duration>,
    source: RedisError,
) -> Pin<Box<dyn Future<Output = RedisError> + Send + 'a>> {
    Box::pin(async move {
        if !is_refused_permission(&source) {
            return source;
        }
        forget(core);
        match ask(core, kind, owner, bound).await {
            Err(named) => named,
            Ok(()) => source,
        }
    })
}

/// Asks the question of [`check`]: `Err` with the server's `NOPERM` answer when it refuses,
/// `Ok` when it allows all (and from then on no call asks) or gives no answer.
pub(crate) async fn ask(
    core: &Core,
    kind: &dyn Primitive,
    owner: Option<&str>,
    bound: Option<Duration>,
) -> std::result::Result<(), RedisError> {
    // Down: no answer can come, and the call fails at once as unavailable, as it would have
    // without the question (which would otherwise wait out the command timeout); the next
    // call asks.
    if core.redis().refused_unconnected().is_err() {
        return Ok(());
    }
    let profile = kind.profile();
    let (publish, subscribe) = if core.writer.sharded {
        ("spublish", "ssubscribe")
    } else {
        ("publish", "subscribe")
    };
    // The client's own channel (subscribed only), then the lock's wake channel.
    let mut channels = vec![core.own_channel()];
    match profile.wake() {
        Wake::Shared(channel)
        | Wake::InLine(channel)
        | Wake::Counted(channel)
        | Wake::AtZero(channel) => {
            channels.push(channel.to_string());
        }
        Wake::PerWaiter(prefix) => {
            channels.push(format!("{}:{}", &*prefix, owner.unwrap_or("probe")));
        }
        Wake::Backoff(_) => {}
    }
    // The name's key as the script's key too: it routes the call on a cluster, and a
    // user who may not touch it is refused before the script runs.
    let mut args: Vec<Value> = vec![
        Value::from(publish.to_owned()),
        Value::from(subscribe.to_owned()),
        Value::from(channels.len().to_string()),
    ];
    args.extend(channels.into_iter().map(Value::from));
    // Every key (and channel name) a call of it sends, which must be writable.
    let keys = profile.keys();
    args.push(Value::from(keys.count().to_string()));
    args.extend((0..keys.count()).map(|i| Value::from(keys.str(i).to_owned())));
    // The kind's commands, checked on the key; then the connection's, which take none.
    let class = profile.class();
    let keyed: std::collections::BTreeSet<&str> = class
        .commands
        .iter()
        .flat_map(|group| group.iter().copied())
        .collect();
    args.push(Value::from(keyed.len().to_string()));
    let commands = keyed.into_iter().chain(CONNECTION_COMMANDS.iter().copied());
    args.extend(commands.map(|c| Value::from(c.to_owned())));
    // A read: on the command connection, never waiting for replicas (replica sync).
    let reads = core.reads();
    let asked = PROBE_SCRIPT.call::<i64>(&reads, profile.keys().first(1), args);
    let answer = match bound {
        Some(bound) => match tokio::time::timeout(bound, asked).await {
            Ok(answer) => answer,
            // The wait ran out first: the call's own attempt says what happened.
            Err(_) => return Ok(()),
        },
        None => asked.await,
    };
    match answer {
        Ok(_) => {
            if let Some(bit) = bit(class) {
                core.permitted.fetch_or(bit, Ordering::Relaxed);
            }
            Ok(())
        }
        Err(source) if source.kind() == RedisErrorKind::Refused => Err(source),
        // No answer (an outage, a stalled server): the call goes on unchecked and meets the
        // outage as it would have, waiting it out within its wait; the next call asks.
        Err(_) => Ok(()),
    }
}

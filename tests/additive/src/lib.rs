//! A service's code written against fredlock built on redis-rs alone: every public call it
//! makes, with the crate's own settings and vocabulary in their signatures. It must build
//! unchanged when fred (or any other feature) is turned on too.

use std::time::Duration;

use fredlock::events::{LockEventKind, LossReason};
use fredlock::{Backend, FromReply, LockClient, ReconnectPolicy, Reply, ScriptArg};

/// A service's own type a script's reply is read as.
pub struct Count(pub i64);

impl FromReply for Count {
    fn from_reply(reply: Reply) -> Option<Count> {
        i64::from_reply(reply).map(Count)
    }
}

/// A service's own description of a reconnect policy, for each client library's type it uses:
/// fredlock's stays its own whatever features are on, so the two impls never collide (they
/// did while `fredlock::ReconnectPolicy` became fred's type with feature `fred` on).
pub trait Describe {
    fn describe(&self) -> String;
}

impl Describe for ReconnectPolicy {
    fn describe(&self) -> String {
        format!("fredlock's {self:?}")
    }
}

/// A client on redis-rs with a reconnect policy of the crate's own.
pub async fn client(url: &str) -> fredlock::Result<LockClient> {
    let mut policy = ReconnectPolicy::new_exponential(0, 100, 2_000, 2);
    policy.set_jitter(50);
    LockClient::builder()
        .backend(Backend::RedisRs)
        .url(url)
        .reconnect_policy(policy)
        .reconnect_policy(ReconnectPolicy::new_constant(3, 50))
        .command_timeout(Duration::from_secs(2))
        .build()
        .await
}

/// Locks, a script run while the lock is held (its keys and arguments as plain text and
/// numbers, its reply as an integer), the event stream.
pub async fn work(client: &LockClient) -> fredlock::Result<i64> {
    let mut events = client.events();
    let guard = client.lock("orders:{42}").lock().await?;
    let counted: i64 = guard
        .eval_while_held(
            "return redis.call('INCRBY', KEYS[1], ARGV[1])",
            ["orders:{42}:count"],
            ["1"],
        )
        .await?;
    let key = String::from("orders:{42}:other");
    let _: Option<String> = guard
        .eval_while_held(
            "return redis.call('GET', KEYS[1])",
            [key.as_str()],
            Vec::<String>::new(),
        )
        .await?;
    // The crate's own words for a script, whatever features are on: a reply type of the
    // service's own (an impl that would collide or stop compiling were the trait fred's with
    // fred on), the reply itself, arguments made explicitly.
    let Count(_) = guard
        .eval_while_held(
            "return tonumber(ARGV[1])",
            [ScriptArg::from("orders:{42}:count")],
            [ScriptArg::from(7_u32), ScriptArg::from(&b"raw"[..])],
        )
        .await?;
    let _: Reply = guard
        .eval_while_held("return {1, 'a'}", ["orders:{42}"], [0.5_f64])
        .await?;
    guard.unlock().await?;
    if let Ok(event) = events.try_recv() {
        match event.what() {
            LockEventKind::Lost(LossReason::Shutdown) | LockEventKind::WaitEnded => {}
            _ => {}
        }
    }
    Ok(counted)
}

/// A service's code written against fredlock's defaults (fred): fred's own configuration and
/// reconnect policy handed to the builder, fred's client read back. Built with `defaults`, and
/// with `all` beside it.
#[cfg(feature = "defaults")]
pub mod on_fred {
    use fredlock::fred::types::config::{Config, ReconnectPolicy};
    use fredlock::LockClient;

    impl crate::Describe for ReconnectPolicy {
        fn describe(&self) -> String {
            format!("fred's {self:?}")
        }
    }

    pub async fn client(url: &str) -> fredlock::Result<LockClient> {
        let config = Config::from_url(url)
            .map_err(|error| fredlock::Error::InvalidArgument(format!("{url}: {error}")))?;
        let client = LockClient::builder()
            .config(config)
            .reconnect_policy(ReconnectPolicy::new_constant(3, 50))
            .build()
            .await?;
        let _fred: Option<&fredlock::fred::clients::Client> = client.redis();
        Ok(client)
    }
}

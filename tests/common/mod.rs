//! Test harness, by concern: throw-away servers (`servers`) and whether one is up (`up`), a
//! proxy that stalls, cuts and loses replies (`proxy`), PostgreSQL (`postgres`), the lock kinds
//! every `for_each_kind!` test runs for (`kinds`), histories of operations and their checker
//! (`history`), the walk of every test of a server's refusal (`refusal`), and here what every
//! test uses (time bounds, raw clients, server reads).

#![allow(dead_code)]

pub mod chaos;
pub mod history;
mod kinds;
mod postgres;
mod proxy;
pub mod refusal;
mod servers;
pub mod up;

// Not every test uses every concern.
#[allow(unused_imports)]
pub use kinds::*;
#[allow(unused_imports)]
pub use postgres::*;
#[allow(unused_imports)]
pub use proxy::*;
pub use servers::*;

use std::future::Future;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fred::prelude::*;

/// The client library every lock client of the tests runs on: `FREDLOCK_BACKEND=redis-rs`
/// runs a suite on redis-rs (built with feature `redis-rs`), `fred` or nothing on fred.
pub fn backend() -> fredlock::Backend {
    match std::env::var("FREDLOCK_BACKEND") {
        Ok(name) if !name.is_empty() => name
            .parse()
            .unwrap_or_else(|error| panic!("FREDLOCK_BACKEND={name}: {error}")),
        _ => fredlock::Backend::Fred,
    }
}

/// The RESP version every lock client of the tests speaks, when `FREDLOCK_PROTOCOL` names
/// one (`resp2` or `resp3`); else each backend's default.
pub fn protocol() -> Option<fredlock::Protocol> {
    match std::env::var("FREDLOCK_PROTOCOL") {
        Ok(name) if !name.is_empty() => Some(
            name.parse()
                .unwrap_or_else(|error| panic!("FREDLOCK_PROTOCOL={name}: {error}")),
        ),
        _ => None,
    }
}

/// `LockClient::builder()` on the tests' backend ([`backend`]) and protocol ([`protocol`]).
pub fn builder() -> fredlock::LockClientBuilder {
    let builder = fredlock::LockClient::builder().backend(backend());
    match protocol() {
        Some(protocol) => builder.protocol(protocol),
        None => builder,
    }
}

/// `LockClient::connect(url)` on the tests' backend ([`backend`]).
pub async fn connect(url: &str) -> fredlock::Result<fredlock::LockClient> {
    builder().url(url).build().await
}

/// A word of an error's message that says nothing or names a client library (the crate's
/// messages are its own, whichever library reported the failure: issue 57), if there is one.
pub fn library_word(shown: &str) -> Option<&'static str> {
    let lower = shown.to_ascii_lowercase().replace("fredlock", "");
    ["fred", "redis-rs", "redis::", "unknown error"]
        .into_iter()
        .find(|word| lower.contains(word))
        .or_else(|| {
            // A failure without its word: "..: : NOPERM", or a message that starts with ": ".
            (shown.starts_with(": ") || shown.contains(": : ") || shown.contains("(: "))
                .then_some("an empty failure")
        })
}

/// Upper bound for any single test.
pub const TEST_LIMIT: Duration = Duration::from_secs(90);

/// Runs a test body with a time limit, so a hang fails instead of blocking the suite.
pub async fn bounded<F: Future<Output = ()>>(body: F) {
    if tokio::time::timeout(TEST_LIMIT, body).await.is_err() {
        panic!("test exceeded {TEST_LIMIT:?}");
    }
}
/// A connection of its own subscribed to `channel` on the server at `url`, with the receiver of
/// what it hears: for tests that check what an unlock publishes.
pub async fn listen(
    url: &str,
    channel: &str,
) -> (
    fred::clients::SubscriberClient,
    tokio::sync::broadcast::Receiver<fred::types::Message>,
) {
    static LISTENERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let subscriber = Builder::from_config(Config::from_url(url).unwrap())
        .build_subscriber_client()
        .unwrap();
    subscriber.init().await.unwrap();
    // Named, so that the server's own list tells when this connection is subscribed.
    let name = format!(
        "fredlock-test-listener-{}-{}",
        std::process::id(),
        LISTENERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    let _: () = subscriber.client_setname(name.as_str()).await.unwrap();
    let messages = subscriber.message_rx();
    subscriber.subscribe(channel).await.unwrap();
    // Until the server counts the subscription, a PUBLISH can pass it by: semaphore's
    // wire_layout_matches_redisson heard one of its two messages in two CI runs (stop 39's,
    // and a fresh-clone run in stop 41), never alone. Asked of the server itself, for this
    // connection: the channel's count alone (`PUBSUB NUMSUB`) also counts a lock client's
    // own subscription (a waiter's channel lingers after it is woken), and semaphore's
    // interoperates_with_redisson_replay heard nothing on redis-rs once in CI (issue 57).
    let raw = raw_client(url).await;
    let counted = eventually(Duration::from_secs(5), || async {
        let list: String = raw
            .custom(fred::cmd!("CLIENT"), vec!["LIST"])
            .await
            .unwrap();
        list.lines().any(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            fields.contains(&format!("name={name}").as_str())
                && fields
                    .iter()
                    .any(|field| field.strip_prefix("sub=").is_some_and(|n| n != "0"))
        })
    })
    .await;
    assert!(
        counted,
        "the server never counted the subscription to {channel}"
    );
    let _ = raw.quit().await;
    (subscriber, messages)
}

/// The messages `messages` receives: all it receives until `expected` have come (waiting up to
/// 10 s, as a loaded machine may deliver late), then any more within a further 200 ms (so an
/// extra message still shows), as text, in order.
pub async fn heard(
    messages: &mut tokio::sync::broadcast::Receiver<fred::types::Message>,
    expected: usize,
) -> Vec<String> {
    let mut seen = Vec::new();
    let mut deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while let Ok(Ok(message)) = tokio::time::timeout_at(deadline, messages.recv()).await {
        seen.push(message.value.as_string().unwrap_or_default());
        if seen.len() == expected {
            deadline = tokio::time::Instant::now() + Duration::from_millis(200);
        }
    }
    seen
}

/// A plain fred client (standalone or cluster, by URL scheme), for checking what fredlock wrote.
pub async fn raw_client(url: &str) -> Client {
    let client = Builder::from_config(Config::from_url(url).unwrap())
        .build()
        .unwrap();
    client.init().await.unwrap();
    client
}

/// Records when it is dropped, in the slot it was given: held by a future, when that future was
/// cancelled.
pub struct DroppedAt(pub std::sync::Arc<std::sync::Mutex<Option<tokio::time::Instant>>>);

impl Drop for DroppedAt {
    fn drop(&mut self) {
        *self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(tokio::time::Instant::now());
    }
}

/// Polls `check` every 20 ms until it holds or `limit` passes; returns whether it held.
pub async fn eventually<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs `test`, an `#[ignore]`d test of the calling test binary, as a child process with `env`
/// set and its output discarded: for tests that need a process to kill.
pub fn spawn_test_child(test: &str, env: &[(&str, String)]) -> Child {
    test_child(test, env)
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn the test binary as a child")
}

/// The command that runs this test binary's ignored test `test` alone with `env` set, its
/// stderr dropped: for a child whose stdout the test reads.
pub fn test_child(test: &str, env: &[(&str, String)]) -> Command {
    let mut command = Command::new(std::env::current_exe().expect("test binary"));
    command
        .args(["--ignored", "--exact", test, "--nocapture"])
        .envs(env.iter().map(|(name, value)| (name, value)))
        .stderr(Stdio::null());
    command
}

/// A child process killed (after a SIGCONT, should it be stopped) and reaped when the test
/// ends, failed or not.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = signal_quietly(self.0.id(), "CONT");
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Kills a child with SIGKILL (no chance to clean up) and reaps it.
pub fn sigkill(mut child: Child) {
    child.kill().expect("SIGKILL the child");
    child.wait().expect("reap the child");
}
/// One fredlock client per URL, each with the default settings: the nodes of a Redlock.
pub async fn clients(urls: &[String]) -> Vec<fredlock::LockClient> {
    let mut clients = Vec::new();
    for url in urls {
        clients.push(connect(url).await.unwrap());
    }
    clients
}

/// Whether the client has nothing left: no holds, waits, subscriptions or unsettled calls.
pub fn idle(client: &fredlock::LockClient) -> bool {
    let stats = client.stats();
    stats.held == 0 && stats.wait_entries == 0 && stats.subscriptions == 0 && stats.unsettled == 0
}

/// The URLs of `servers`.
pub fn urls(servers: &[RedisServer]) -> Vec<String> {
    servers.iter().map(RedisServer::url).collect()
}

/// `count` servers, each an independent master.
pub fn start_servers(count: usize) -> Vec<RedisServer> {
    (0..count).map(|_| RedisServer::start()).collect()
}

/// Parses `INFO commandstats` into (command, calls).
pub async fn command_calls(raw: &Client) -> std::collections::HashMap<String, u64> {
    let info: String = raw
        .info(Some(fred::types::InfoKind::CommandStats))
        .await
        .unwrap();
    info.lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            Some((name.to_string(), calls))
        })
        .collect()
}
/// The commands the server ran since `before` (a [`command_calls`] reading), with how many
/// times each, sorted by name: every command but the `INFO` that reads them.
pub async fn commands_since(
    raw: &Client,
    before: &std::collections::HashMap<String, u64>,
) -> Vec<(String, u64)> {
    let mut delta: Vec<(String, u64)> = command_calls(raw)
        .await
        .into_iter()
        .map(|(name, calls)| {
            let since = calls - before.get(&name).copied().unwrap_or(0);
            (name, since)
        })
        .filter(|(name, calls)| *calls > 0 && name != "info")
        .collect();
    delta.sort();
    delta
}

/// How many script calls (`EVAL` and `EVALSHA`, a `NOSCRIPT` answer counted too) the server ran
/// since `before` (a [`command_calls`] reading).
pub async fn scripts_since(raw: &Client, before: &std::collections::HashMap<String, u64>) -> u64 {
    commands_since(raw, before)
        .await
        .iter()
        .filter(|(command, _)| command.starts_with("eval"))
        .map(|(_, calls)| calls)
        .sum()
}

/// A plain fred client that survives `CLIENT KILL`: it reconnects, and no command waits longer
/// than a second.
pub async fn resilient_client(url: &str) -> Client {
    let client = Builder::from_config(Config::from_url(url).unwrap())
        .with_performance_config(|performance| {
            performance.default_command_timeout = Duration::from_secs(1);
        })
        .set_policy(ReconnectPolicy::new_constant(0, 50))
        .build()
        .unwrap();
    client.init().await.unwrap();
    client
}

/// Every key on the server, sorted.
pub async fn all_keys(raw: &Client) -> Vec<String> {
    let mut keys: Vec<String> = raw.custom(fred::cmd!("KEYS"), vec!["*"]).await.unwrap();
    keys.sort();
    keys
}

/// Blocks the server for `seconds` (`DEBUG SLEEP`), from `raw`'s connection.
pub async fn debug_sleep(raw: &Client, seconds: f64) {
    let _: Value = raw
        .custom(
            fred::cmd!("DEBUG"),
            vec!["SLEEP".to_string(), seconds.to_string()],
        )
        .await
        .unwrap();
}

/// `CLIENT KILL TYPE kind` (`normal` or `pubsub`): every such connection but `raw`'s own.
pub async fn client_kill(raw: &Client, kind: &str) -> Result<i64, fred::error::Error> {
    raw.custom(
        fred::cmd!("CLIENT"),
        vec!["KILL".to_string(), "TYPE".to_string(), kind.to_string()],
    )
    .await
}

/// The channels the server has subscribers for (`PUBSUB CHANNELS`).
pub async fn pubsub_channels(raw: &Client) -> Vec<String> {
    let channels: Vec<String> = raw
        .custom(fred::cmd!("PUBSUB"), vec!["CHANNELS".to_string()])
        .await
        .unwrap();
    // A client's own channel (force unlocks of its holds) stays for the client's life.
    channels
        .into_iter()
        .filter(|channel| !channel.starts_with("fredlock_client:"))
        .collect()
}

/// Takes and gives back a lock on `client` (its scripts cached, its own channel subscribed), and
/// waits until it listens there: for tests that count the commands sent after that.
pub async fn warmed_up(raw: &Client, client: &fredlock::LockClient) {
    let guard = client.lock("warm-up").lock().await.unwrap();
    guard.unlock().await.unwrap();
    listening_for_force_unlocks(raw, client).await;
}

/// Waits until `client` listens on its own channel for force unlocks, which it subscribes with
/// its first hold of a lock: for tests that count the commands sent after that.
pub async fn listening_for_force_unlocks(raw: &Client, client: &fredlock::LockClient) {
    let own = format!("fredlock_client:{}", client.id());
    let listening = eventually(Duration::from_secs(5), || async {
        let channels: Vec<String> = raw.pubsub_channels(own.as_str()).await.unwrap();
        channels.contains(&own)
    })
    .await;
    assert!(listening, "{own} was never subscribed");
}

/// Sends `signal` (`STOP`, `CONT`) to process `pid`.
pub fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{signal} {pid}");
}

/// Sends `signal` to `pid`, ignoring failure (the process may be gone).
pub fn signal_quietly(pid: u32, signal: &str) -> bool {
    Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// The server's clock (`TIME`) in milliseconds: one clock for a test and its child processes.
pub async fn server_millis(raw: &Client) -> u64 {
    server_micros(raw).await / 1000
}

/// The server's clock (`TIME`) in microseconds, as the token scripts seed a missing counter.
pub async fn server_micros(raw: &Client) -> u64 {
    let time: Vec<String> = raw
        .custom(fred::cmd!("TIME"), Vec::<String>::new())
        .await
        .unwrap();
    time[0].parse::<u64>().unwrap() * 1_000_000 + time[1].parse::<u64>().unwrap()
}

/// Waits until `client` is connected and quiet: its background calls (a subscription, a
/// script load) done, so that a fault armed next strikes the caller's own call.
pub async fn quiet(client: &fredlock::LockClient) {
    // A read on the command connection: it answers once connected, after what was sent before.
    let probe = client.lock("fredlock-test:quiet");
    let answered = eventually(Duration::from_secs(10), || async {
        probe.is_locked().await.is_ok()
    })
    .await;
    assert!(answered, "the client never answered");
    tokio::time::sleep(Duration::from_millis(300)).await;
}

pub async fn configured_client(
    url: String,
    configure: impl FnOnce(fredlock::LockClientBuilder) -> fredlock::LockClientBuilder,
) -> fredlock::LockClient {
    configure(builder().url(url)).build().await.unwrap()
}

//! `fredlock`: the operator's command for fredlock (and Redisson) locks, a thin layer over the
//! library's inspections (`LockClient::{list, inspect, leaks, force_unlock,
//! check_deployment}`).
//!
//! Exit status: 0 when all is well, 1 when the command found something (a leak, a deployment
//! warning, no such lock, a force unlock that found nothing held or was not confirmed), 2 on an
//! error (no server, bad input).

use std::io::{BufRead, Write};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use fredlock::{
    Deployment, Details, EndedLease, Holder, Inspection, JobHolder, KeyState, Leak, LockClient,
    Topology,
};
use serde_json::{json, Value};

#[derive(Parser)]
#[command(
    name = "fredlock",
    version,
    about = "Inspect and repair fredlock and Redisson locks in Redis"
)]
struct Cli {
    /// The Redis server (`redis://`, `rediss://`, `redis-cluster://`, `redis-sentinel://`).
    #[arg(
        long,
        env = "REDIS_URL",
        default_value = "redis://127.0.0.1:6379",
        global = true
    )]
    url: String,
    /// Print JSON instead of text (one document; `watch` prints one per line).
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Every lock (and semaphore with permits out) whose name matches a glob: kind, holders,
    /// TTL, waiters.
    List {
        /// A Redis glob (`*`, `?`, `[..]`) on lock names.
        #[arg(long, default_value = "*")]
        pattern: String,
    },
    /// Everything known of one lock, semaphore or latch: holders, hold counts, leases, queue,
    /// token, permits available or count, ended leases, keys.
    Inspect {
        /// The lock's name (its Redis key).
        name: String,
    },
    /// Lock keys without expiry, fair-lock waiters whose place ended long ago, and permit
    /// leases that ended long ago and were not given back.
    Leaks {
        /// A Redis glob on lock names.
        #[arg(long, default_value = "*")]
        pattern: String,
        /// How long after its place (or lease) ended a fair-lock waiter (or a permit) counts as
        /// a leak, in seconds.
        #[arg(long, default_value_t = fredlock::DEFAULT_LEAK_GRACE.as_secs())]
        grace: u64,
    },
    /// Deletes a lock whoever holds it and wakes its waiters.
    ForceUnlock {
        /// The lock's name (its Redis key).
        name: String,
        /// Do not ask for confirmation.
        #[arg(long)]
        yes: bool,
    },
    /// Prints acquire, release and queue events of one lock as they happen, until interrupted.
    Watch {
        /// The lock's name (its Redis key).
        name: String,
        /// How often to read the lock, in milliseconds: a hold shorter than this may be missed.
        #[arg(long, default_value_t = 50)]
        interval_ms: u64,
        /// Stop after this many events.
        #[arg(long)]
        count: Option<u64>,
    },
    /// Checks the deployment (persistence, eviction, replication, WAIT) for what can break locks.
    Doctor,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("fredlock: cannot start a runtime: {error}");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(found_nothing) => ExitCode::from(if found_nothing { 0 } else { 1 }),
        Err(error) => {
            eprintln!("fredlock: {error}");
            ExitCode::from(2)
        }
    }
}

/// Runs the command: `Ok(true)` when all is well, `Ok(false)` when it found something.
async fn run(cli: Cli) -> fredlock::Result<bool> {
    let builder = LockClient::builder().url(&cli.url);
    // The command's own default: fred where it is built in, else redis-rs.
    #[cfg(not(feature = "fred"))]
    let builder = builder.backend(fredlock::Backend::RedisRs);
    let client = builder.build().await?;
    let result = command(&client, cli.command, cli.json).await;
    client.shutdown().await;
    result
}

async fn command(client: &LockClient, command: Command, json: bool) -> fredlock::Result<bool> {
    match command {
        Command::List { pattern } => {
            let found = client.list(&pattern).await?;
            if json {
                print_json(&Value::Array(found.iter().map(inspection_json).collect()));
            } else {
                print_table(&found);
            }
            Ok(true)
        }
        Command::Inspect { name } => {
            let found = client.inspect(&name).await?;
            match (&found, json) {
                (Some(inspection), true) => print_json(&inspection_json(inspection)),
                (None, true) => print_json(&Value::Null),
                (Some(inspection), false) => print_inspection(inspection),
                (None, false) => println!("no lock named {name:?}"),
            }
            Ok(found.is_some())
        }
        Command::Leaks { pattern, grace } => {
            let leaks = client.leaks(&pattern, Duration::from_secs(grace)).await?;
            if json {
                print_json(&Value::Array(leaks.iter().map(leak_json).collect()));
            } else if leaks.is_empty() {
                println!("no leaks");
            } else {
                for leak in &leaks {
                    println!("{leak}");
                }
            }
            Ok(leaks.is_empty())
        }
        Command::ForceUnlock { name, yes } => {
            if !yes && !confirm(&name) {
                if json {
                    print_json(&json!({"name": name, "unlocked": false, "confirmed": false}));
                } else {
                    println!("not confirmed; nothing done");
                }
                return Ok(false);
            }
            let unlocked = client.force_unlock(&name).await?;
            if json {
                print_json(&json!({"name": name, "unlocked": unlocked, "confirmed": true}));
            } else if unlocked {
                println!("unlocked {name:?}; its waiters were woken");
            } else {
                println!("{name:?} was not held");
            }
            Ok(unlocked)
        }
        Command::Watch {
            name,
            interval_ms,
            count,
        } => {
            watch(
                client,
                &name,
                Duration::from_millis(interval_ms.max(1)),
                count,
                json,
            )
            .await?;
            Ok(true)
        }
        Command::Doctor => {
            let deployment = client.check_deployment().await?;
            if json {
                print_json(&deployment_json(&deployment));
            } else {
                print!("{deployment}");
                if deployment.warnings.is_empty() {
                    println!("no warnings");
                }
            }
            Ok(deployment.warnings.is_empty())
        }
    }
}

/// Asks on the terminal; anything but `y` or `yes` declines.
fn confirm(name: &str) -> bool {
    eprint!("force-unlock {name:?} whoever holds it? [y/N] ");
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    if std::io::stdin().lock().read_line(&mut answer).is_err() {
        return false;
    }
    matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes")
}

/// Reads the lock every `interval` and prints what changed, each line with the time it was
/// seen: holders that came, went (released, or expired with their lease) or changed their count,
/// and waiters that joined or left the queue. A take-over prints in the order it happened: the
/// old holder's end, then the new holder's acquisition.
async fn watch(
    client: &LockClient,
    name: &str,
    interval: Duration,
    count: Option<u64>,
    json: bool,
) -> fredlock::Result<()> {
    let mut before: Option<(Inspection, std::time::Instant)> = None;
    // The first reading shows what stood when the watch began: `held` and `waiting`, not an
    // acquisition or a join seen to happen.
    let mut first = true;
    let mut printed = 0u64;
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    if !json {
        println!("watching {name:?} every {interval:?} (times in UTC)");
    }
    loop {
        ticks.tick().await;
        let now = client.inspect(name).await?;
        let read_at = std::time::Instant::now();
        let seen_at = std::time::SystemTime::now();
        let previous = before
            .as_ref()
            .map(|(inspection, at)| (inspection, read_at.duration_since(*at)));
        let events = if first {
            standing(now.as_ref())
        } else {
            changes(previous, now.as_ref())
        };
        first = false;
        for event in events {
            if json {
                let at_ms = seen_at
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |since| since.as_millis() as u64);
                let mut line = json!({
                    "event": event.what,
                    "owner": event.owner,
                    "client_name": event.client,
                    "name": name,
                    "at_ms": at_ms,
                });
                if let Some(count) = event.count {
                    line["count"] = json!(count);
                }
                println!("{line}");
            } else {
                let who = match event.client {
                    Some(client) => format!("{} ({client})", event.owner),
                    None => event.owner.to_owned(),
                };
                match event.count {
                    Some(count) => {
                        println!("{} {} {who} (holds: {count})", clock(seen_at), event.what)
                    }
                    None => println!("{} {} {who}", clock(seen_at), event.what),
                }
            }
            let _ = std::io::stdout().flush();
            printed += 1;
            if count.is_some_and(|count| printed >= count) {
                return Ok(());
            }
        }
        before = now.map(|now| (now, read_at));
    }
}

/// The time of day of `at` in UTC, to the millisecond: `05:31:02.123`.
fn clock(at: std::time::SystemTime) -> String {
    let ms = at
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64)
        % 86_400_000;
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        ms / 3_600_000,
        ms / 60_000 % 60,
        ms / 1000 % 60,
        ms % 1000
    )
}

/// One change `watch` reports: what happened (`acquired`, `reentered`, `released_one`,
/// `released`, `expired`, `queued`, `left_queue`; `held` and `waiting` for what stood when the
/// watch began), to which owner (and its client's name), and
/// its holds after it.
struct Event<'a> {
    what: &'static str,
    owner: &'a str,
    client: Option<&'a str>,
    count: Option<u64>,
}

/// What a lock's first reading shows: each holder `held` (with its holds), each waiter in its
/// queue `waiting`.
fn standing(now: Option<&Inspection>) -> Vec<Event<'_>> {
    let Some(now) = now else {
        return Vec::new();
    };
    let held = now.holders.iter().map(|holder| Event {
        what: "held",
        owner: &holder.owner,
        client: holder.client_name.as_deref(),
        count: Some(holder.count),
    });
    let waiting = now.queue.iter().map(|waiter| Event {
        what: "waiting",
        owner: &waiter.owner,
        client: None,
        count: None,
    });
    held.chain(waiting).collect()
}

/// The events between a reading of a lock (`before`, read that long ago) and the next, in the
/// order they happened: what ended or shrank first, then what began or grew (a holder cannot
/// take a lock before the last one let it go, nor a waiter before it leaves the queue).
fn changes<'a>(
    before: Option<(&'a Inspection, Duration)>,
    now: Option<&'a Inspection>,
) -> Vec<Event<'a>> {
    let since = before.map_or(Duration::ZERO, |(_, since)| since);
    let before = before.map(|(inspection, _)| inspection);
    let holders = |seen: Option<&'a Inspection>| seen.map_or(&[][..], |seen| &seen.holders);
    let queue = |seen: Option<&'a Inspection>| seen.map_or(&[][..], |seen| &seen.queue);
    let (old, new) = (holders(before), holders(now));
    let (old_queue, new_queue) = (queue(before), queue(now));
    let mut events = Vec::new();
    for holder in old {
        if !new.iter().any(|new| new.owner == holder.owner) {
            // Gone by the time its lease was up: it ran out (or was released just then).
            let expired = holder.remaining_lease.is_some_and(|left| left <= since);
            events.push(Event {
                what: if expired { "expired" } else { "released" },
                owner: &holder.owner,
                client: holder.client_name.as_deref(),
                count: None,
            });
        }
    }
    for holder in new {
        if let Some(old) = old.iter().find(|old| old.owner == holder.owner) {
            if old.count > holder.count {
                events.push(Event {
                    what: "released_one",
                    owner: &holder.owner,
                    client: holder.client_name.as_deref(),
                    count: Some(holder.count),
                });
            }
        }
    }
    for waiter in old_queue {
        if !new_queue.iter().any(|new| new.owner == waiter.owner) {
            events.push(Event {
                what: "left_queue",
                owner: &waiter.owner,
                client: None,
                count: None,
            });
        }
    }
    for holder in new {
        let what = match old.iter().find(|old| old.owner == holder.owner) {
            None => "acquired",
            Some(old) if old.count < holder.count => "reentered",
            Some(_) => continue,
        };
        events.push(Event {
            what,
            owner: &holder.owner,
            client: holder.client_name.as_deref(),
            count: Some(holder.count),
        });
    }
    for waiter in new_queue {
        if !old_queue.iter().any(|old| old.owner == waiter.owner) {
            events.push(Event {
                what: "queued",
                owner: &waiter.owner,
                client: None,
                count: None,
            });
        }
    }
    events
}

fn print_json(value: &Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_default()
    );
}

fn millis(duration: Option<Duration>) -> Value {
    duration.map_or(Value::Null, |duration| json!(duration.as_millis() as u64))
}

/// What the output shows of a kind's own details, in the same fields for every kind (each
/// `null` or empty where the kind has none): a read-write lock's mode; a fenced lock's last
/// token or a leader election's epoch; a semaphore's permits available or a latch's count; a
/// permit semaphore's ended leases; a job's last tick.
struct OwnDetails<'a> {
    mode: Option<&'static str>,
    fencing_token: Option<u64>,
    count: Option<i64>,
    ended_leases: &'a [EndedLease],
    last_tick: Option<std::time::SystemTime>,
}

fn own_details(details: &Details) -> OwnDetails<'_> {
    let mut own = OwnDetails {
        mode: None,
        fencing_token: None,
        count: None,
        ended_leases: &[],
        last_tick: None,
    };
    match details {
        Details::ReadWrite { mode } => own.mode = *mode,
        Details::Fenced { last_token } => own.fencing_token = *last_token,
        Details::Leader { last_epoch, .. } => own.fencing_token = *last_epoch,
        Details::Semaphore { available } | Details::Counter { value: available } => {
            own.count = *available
        }
        Details::Latch { count } => own.count = *count,
        Details::PermitSemaphore {
            available,
            ended_leases,
        } => {
            own.count = *available;
            own.ended_leases = ended_leases;
        }
        Details::Job { last_tick } => own.last_tick = *last_tick,
        _ => {}
    }
    own
}

/// What the output shows of one holder beside what every holder has, from its kind's details:
/// a fenced lock's token (the last issued, while held) or a leader's epoch; a leader's identity
/// or a job's host, with the word for it; when a leader's term started.
struct OwnHolder {
    fencing_token: Option<u64>,
    identity: Option<(&'static str, String)>,
    since: Option<std::time::SystemTime>,
}

fn own_holder(details: &Details, holder: &Holder) -> OwnHolder {
    let mut own = OwnHolder {
        fencing_token: None,
        identity: None,
        since: None,
    };
    match details {
        Details::Fenced { last_token } => own.fencing_token = *last_token,
        Details::Leader {
            leader: Some(leader),
            ..
        } if leader.owner == holder.owner => {
            own.fencing_token = Some(leader.epoch);
            own.identity = Some(("identity", leader.identity.clone()));
            own.since = Some(leader.since);
        }
        Details::Job { .. } => {
            own.identity = JobHolder::from_value(holder.owner.as_str())
                .host()
                .map(|host| ("host", host.to_owned()));
        }
        _ => {}
    }
    own
}

fn inspection_json(inspection: &Inspection) -> Value {
    let details = own_details(&inspection.details);
    json!({
        "name": inspection.name,
        "kind": inspection.kind,
        "mode": details.mode,
        "holders": inspection.holders.iter().map(|holder| {
            let own = own_holder(&inspection.details, holder);
            json!({
                "owner": holder.owner,
                "client_id": holder.client_id().map(|id| id.to_string()),
                "client_name": holder.client_name,
                "count": holder.count,
                "remaining_lease_ms": millis(holder.remaining_lease),
                "fencing_token": own.fencing_token,
                "identity": own.identity.map(|(_, identity)| identity),
                "since_ms": own.since.and_then(|since| since.duration_since(std::time::UNIX_EPOCH).ok()).map(|since| since.as_millis() as u64),
            })
        }).collect::<Vec<_>>(),
        "queue": inspection.queue.iter().map(|waiter| json!({
            "owner": waiter.owner,
            "place_left_ms": millis(waiter.place_left),
            "ended_ago_ms": millis(waiter.ended_ago),
        })).collect::<Vec<_>>(),
        "fencing_token": details.fencing_token,
        "count": details.count,
        "ended_leases": details.ended_leases.iter().map(|lease| json!({
            "permit": lease.permit,
            "ended_ago_ms": lease.ended_ago.as_millis() as u64,
        })).collect::<Vec<_>>(),
        "listeners": inspection.listeners,
        "keys": inspection.keys.iter().map(key_json).collect::<Vec<_>>(),
        "orphans": inspection.orphans.iter().map(key_json).collect::<Vec<_>>(),
        "last_tick_ms": details.last_tick.and_then(|tick| tick.duration_since(std::time::UNIX_EPOCH).ok()).map(|tick| tick.as_millis() as u64),
    })
}

fn key_json(key: &KeyState) -> Value {
    json!({
        "key": key.key,
        "ttl_ms": millis(key.ttl),
    })
}

fn leak_json(leak: &Leak) -> Value {
    json!({
        "name": leak.name,
        "kind": leak.kind,
        "key": leak.key,
        "rule": leak.rule,
        "detail": leak.detail,
    })
}

fn deployment_json(deployment: &Deployment) -> Value {
    let topology = match &deployment.topology {
        Topology::Standalone => json!({"type": "standalone"}),
        Topology::Sentinel { service } => json!({"type": "sentinel", "service": service}),
        Topology::Cluster => json!({"type": "cluster"}),
        _ => json!({"type": "other"}),
    };
    json!({
        "topology": topology,
        "nodes": deployment.nodes.iter().map(|node| json!({
            "server": node.server,
            "flavour": node.flavour,
            "version": node.version,
            "role": node.role,
            "replicas": node.replicas,
            "wait": node.wait,
            "waitaof": node.waitaof,
            "maxmemory": node.maxmemory,
            "maxmemory_policy": node.maxmemory_policy,
            "appendonly": node.appendonly,
            "save": node.save,
        })).collect::<Vec<_>>(),
        "warnings": deployment.warnings,
    })
}

/// A duration for people: `12.3s`, `none` for no expiry.
fn shown(duration: Option<Duration>) -> String {
    duration.map_or_else(
        || "none".to_owned(),
        |duration| format!("{:.1}s", duration.as_secs_f64()),
    )
}

fn holders_text(inspection: &Inspection) -> String {
    if inspection.holders.is_empty() {
        return "-".to_owned();
    }
    inspection
        .holders
        .iter()
        .map(|holder| match &holder.client_name {
            Some(client) => format!("{} ({client}) x{}", holder.owner, holder.count),
            None => format!("{} x{}", holder.owner, holder.count),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Waiters: a fair lock's queue, a read-write lock's waiting writers and the clients
/// subscribed to its channel, else those clients.
/// The waiters with a place in the lock's queue (a fair lock's, a read-write lock's waiting
/// writers): a count of waiters; `-` for a kind without a queue.
fn queued_text(inspection: &Inspection) -> String {
    match inspection.details.queue_word() {
        Some(_) => inspection.queue.len().to_string(),
        None => "-".to_owned(),
    }
}

/// The clients listening on the lock's channel for its unlock (each client once for all its
/// waiting tasks): a count of clients; `-` for a kind whose waiters do not listen there.
fn listening_text(inspection: &Inspection) -> String {
    inspection
        .listeners
        .map_or_else(|| "-".to_owned(), |listeners| listeners.to_string())
}

fn print_table(found: &[Inspection]) {
    let rows: Vec<[String; 6]> = found
        .iter()
        .map(|inspection| {
            let ttl = inspection
                .keys
                .iter()
                .find(|key| key.key == inspection.name)
                .map_or_else(|| "-".to_owned(), |key| shown(key.ttl));
            [
                inspection.name.clone(),
                kind_text(inspection),
                holders_text(inspection),
                ttl,
                queued_text(inspection),
                listening_text(inspection),
            ]
        })
        .collect();
    // One unit a column: waiters with a queue place, and clients listening for the unlock.
    let header = ["NAME", "KIND", "HOLDERS", "TTL", "QUEUED", "LISTENING"].map(str::to_owned);
    let mut widths = header.clone().map(|title| title.len());
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    for row in std::iter::once(&header).chain(&rows) {
        let line: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        println!("{}", line.join("  ").trim_end());
    }
    if rows.is_empty() {
        println!("(no locks)");
    }
}

/// The kind, with a read-write lock's mode: `rw_lock (read)`.
fn kind_text(inspection: &Inspection) -> String {
    match own_details(&inspection.details).mode {
        Some(mode) => format!("{} ({mode})", inspection.kind),
        None => inspection.kind.to_owned(),
    }
}

fn print_inspection(inspection: &Inspection) {
    println!("{} ({})", inspection.name, kind_text(inspection));
    if inspection.holders.is_empty() {
        println!("  not held");
    }
    for holder in &inspection.holders {
        print!("  held by {}", holder.owner);
        if let Some(client) = &holder.client_name {
            print!(" ({client})");
        }
        print!(
            " x{}, lease left {}",
            holder.count,
            shown(holder.remaining_lease)
        );
        let own = own_holder(&inspection.details, holder);
        if let Some(token) = own.fencing_token {
            print!(", fencing token {token}");
        }
        if let Some((word, identity)) = &own.identity {
            print!(", {word} {identity}");
        }
        match own.since.and_then(|since| since.elapsed().ok()) {
            Some(ago) => println!(", since {} ago", shown(Some(ago))),
            None => println!(),
        }
    }
    print!("{}", inspection.details);
    let queued = inspection.details.queue_word().unwrap_or("queued");
    for (place, waiter) in inspection.queue.iter().enumerate() {
        match (waiter.place_left, waiter.ended_ago) {
            (Some(left), _) => println!(
                "  {queued} #{} {}, place ends in {}",
                place + 1,
                waiter.owner,
                shown(Some(left))
            ),
            (None, ago) => println!(
                "  {queued} #{} {}, place ended {} ago",
                place + 1,
                waiter.owner,
                shown(ago)
            ),
        }
    }
    if let Some(listeners) = inspection.listeners {
        println!("  {listeners} client(s) subscribed to its unlock channel");
    }
    for key in &inspection.keys {
        println!("  key {} ttl {}", key.key, shown(key.ttl));
    }
    for key in &inspection.orphans {
        println!(
            "  orphan key {} ttl {} (no hold names it)",
            key.key,
            shown(key.ttl)
        );
    }
}

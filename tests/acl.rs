//! Least privilege (issue 46): the ACL rule docs/SECURITY.md gives is all a client needs, and
//! a client whose user lacks any part of it is told at its first call, naming what is missing
//! and the lock, before anything is written.

mod common;

use std::time::Duration;

use common::refusal::{keys_without_ttl, under_refusal, writing_call, Marks, KINDS};
use common::{bounded, RedisServer};
use fred::prelude::*;
use fredlock::LockClient;

/// Every primitive's writing calls, and the waits that are woken by pub/sub (a lock's, with a
/// renewal, and a fair lock's, each by another client; a latch's), as `a` and `b` (two clients
/// of the same user).
async fn core_suite(a: &LockClient, b: &LockClient) -> fredlock::Result<()> {
    for (kind, _) in KINDS {
        writing_call(a, kind, &format!("acl-{kind}"), WAIT).await?;
    }

    let lock = a.lock("acl-lock");
    let guard = lock.lock().await?;
    let waiter = {
        let lock = b.lock("acl-lock");
        tokio::spawn(async move { lock.try_lock(Duration::from_secs(5), None).await })
    };
    // Held past a renewal (the watchdog lease is 1 s).
    tokio::time::sleep(Duration::from_millis(700)).await;
    guard.unlock().await?;
    waiter
        .await
        .expect("the waiter ends")?
        .expect("woken")
        .unlock()
        .await?;

    let fair = a.fair_lock("acl-fair");
    let guard = fair.lock().await?;
    let waiter = {
        let fair = b.fair_lock("acl-fair");
        tokio::spawn(async move { fair.try_lock(Duration::from_secs(5), None).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    guard.unlock().await?;
    waiter
        .await
        .expect("the waiter ends")?
        .expect("woken")
        .unlock()
        .await?;

    let latch = a.count_down_latch("acl-latch-wait");
    latch.try_set_count(1).await?;
    let waiting = {
        let latch = b.count_down_latch("acl-latch-wait");
        tokio::spawn(async move { latch.wait().await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    latch.count_down().await?;
    waiting.await.expect("the waiter ends")?;
    Ok(())
}

/// The waits of a kind's writing calls in these tests.
const WAIT: Duration = Duration::from_secs(1);

/// docs/SECURITY.md's table "A user for some kinds only": each row's kinds (the lowercase
/// names in its first cell) and its commands.
fn kinds_table() -> Vec<(Vec<String>, Vec<String>)> {
    let rows: Vec<(Vec<String>, Vec<String>)> = include_str!("../docs/SECURITY.md")
        .lines()
        .filter(|line| line.starts_with("| `"))
        .filter_map(|line| {
            let cells: Vec<&str> = line.split('|').collect();
            let kinds: Vec<String> = cells[1]
                .split('`')
                .skip(1)
                .step_by(2)
                .filter(|word| word.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
                .map(str::to_owned)
                .collect();
            let commands: Vec<String> = cells[2]
                .trim()
                .trim_matches('`')
                .split_whitespace()
                .map(str::to_owned)
                .collect();
            let is_kinds_row = !kinds.is_empty()
                && commands
                    .iter()
                    .all(|c| c.chars().all(|c| c.is_ascii_lowercase()));
            is_kinds_row.then_some((kinds, commands))
        })
        .collect();
    assert!(
        rows.len() >= 10,
        "docs/SECURITY.md's table of kinds: {rows:?}"
    );
    rows
}

/// The row of `kind` in [`kinds_table`].
fn commands_of(kind: &str) -> Vec<String> {
    kinds_table()
        .into_iter()
        .find(|(kinds, _)| kinds.iter().any(|k| k == kind))
        .unwrap_or_else(|| panic!("docs/SECURITY.md has no row for {kind}"))
        .1
}

/// The rule of docs/SECURITY.md: its one line that starts `ACL SETUSER`, split into words. The
/// guide's security page gives the same line, word for word.
fn documented_rule() -> Vec<String> {
    let rule_of = |doc: &'static str| {
        doc.lines()
            .find(|line| line.starts_with("ACL SETUSER fredlock "))
            .expect("the page gives the rule")
    };
    let line = rule_of(include_str!("../docs/SECURITY.md"));
    assert_eq!(
        rule_of(include_str!("../docs/guide/security.md")),
        line,
        "docs/guide/security.md's rule differs from docs/SECURITY.md's"
    );
    line.split_whitespace().map(str::to_owned).collect()
}

/// Makes user `fredlock` (password `secret`) with `rule` (the documented words after `ACL`).
async fn set_user(raw: &Client, rule: &[String]) {
    let mut args: Vec<String> = rule[1..].to_vec();
    for arg in &mut args {
        if arg == ">PASSWORD" {
            *arg = ">secret".into();
        }
    }
    let _: () = raw
        .custom(fred::cmd!("ACL"), args)
        .await
        .unwrap_or_else(|error| panic!("ACL SETUSER {rule:?}: {error}"));
}

/// A client of user `fredlock` with the prefix the rule is written for, and a watchdog lease of
/// 1 s, so that a hold of 0.7 s is renewed.
async fn fredlock_user(server: &RedisServer) -> fredlock::Result<LockClient> {
    common::builder()
        .url(format!(
            "redis://fredlock:secret@127.0.0.1:{}",
            server.port()
        ))
        .key_prefix("app:")
        .watchdog_lease(Duration::from_secs(1))
        .build()
        .await
}

/// The raw connection to `server`, the documented rule, set for user `fredlock`, and a client of
/// that user.
async fn the_documented_user(server: &RedisServer) -> (Client, Vec<String>, LockClient) {
    let raw = server.raw().await;
    let rule = documented_rule();
    set_user(&raw, &rule).await;
    let client = fredlock_user(server).await.expect("connects with the rule");
    (raw, rule, client)
}

/// Every primitive works for a user with exactly the documented rule, and leaves no key without
/// a TTL but the counters that are kept by design (a semaphore's permits, a fencing token, an
/// epoch).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_primitive_works_with_the_documented_rule() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        set_user(&raw, &documented_rule()).await;
        let a = fredlock_user(&server)
            .await
            .expect("connects with the rule");
        let b = fredlock_user(&server)
            .await
            .expect("connects with the rule");
        core_suite(&a, &b)
            .await
            .expect("every primitive works with the rule");
        a.shutdown().await;
        b.shutdown().await;
        for key in common::all_keys(&raw).await {
            assert!(key.contains("app:"), "{key} is outside the prefix");
        }
    })
    .await;
}

/// docs/SECURITY.md, "A user for some kinds only": for each row of its table, a user whose rule
/// keeps only that row's commands (of all the kinds') runs each kind of the row, and a kind
/// that needs a command beyond the row is refused at its first call, naming such a command, with
/// nothing written: each kind is asked about its own commands, and a yes for one kind is not
/// one for another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_kind_works_with_only_its_own_commands() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let rule = documented_rule();
        let table = kinds_table();
        let every: Vec<&String> = table.iter().flat_map(|(_, commands)| commands).collect();
        for (kinds, commands) in &table {
            let run: Vec<&String> = kinds
                .iter()
                .filter(|kind| KINDS.iter().any(|(walked, _)| walked == kind))
                .collect();
            assert!(!run.is_empty(), "no kind of {kinds:?} is walked");
            let kept: Vec<String> = rule
                .iter()
                .filter(|word| match word.strip_prefix('+') {
                    Some(command) if every.iter().any(|c| *c == command) => {
                        commands.iter().any(|c| c == command)
                    }
                    _ => true,
                })
                .cloned()
                .collect();
            set_user(&raw, &kept).await;
            let a = fredlock_user(&server).await.expect("connects");
            let b = fredlock_user(&server).await.expect("connects");
            for kind in &run {
                writing_call(&a, kind, &format!("acl-{kind}"), WAIT)
                    .await
                    .unwrap_or_else(|error| panic!("{kind} with only its commands: {error}"));
            }
            let _: () = raw.flushall(false).await.unwrap();
            for (other, _) in KINDS {
                let beyond: Vec<String> = commands_of(other)
                    .into_iter()
                    .filter(|command| !commands.contains(command))
                    .collect();
                if beyond.is_empty() {
                    continue;
                }
                let error = writing_call(&a, other, "acl-first", WAIT)
                    .await
                    .err()
                    .unwrap_or_else(|| {
                        panic!("a {other}'s first call succeeded with only {kinds:?}'s commands")
                    });
                let shown = error.to_string();
                assert!(
                    shown.contains("NOPERM") && beyond.iter().any(|c| shown.contains(c.as_str())),
                    "a {other} with only {kinds:?}'s commands, lacking {beyond:?}: {shown}"
                );
                assert_eq!(
                    common::all_keys(&raw).await,
                    Vec::<String>::new(),
                    "a {other} refused with only {kinds:?}'s commands wrote something"
                );
            }
            a.shutdown().await;
            b.shutdown().await;
        }
    })
    .await;
}

/// With each part of the rule removed in turn, the client still connects, and its first call
/// fails naming what is missing and the lock (a connection's own command, which takes no key,
/// named without one); nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_permission_removed_fails_the_first_call_and_writes_nothing() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let rule = documented_rule();
        let start = rule.iter().position(|word| word == "-@all").unwrap() + 1;
        // `select` is sent only for a URL that names a database.
        let parts: Vec<&String> = rule[start..].iter().filter(|p| *p != "+select").collect();
        assert!(parts.len() > 40, "{parts:?}");
        for part in parts {
            let without: Vec<String> = rule.iter().filter(|word| *word != part).cloned().collect();
            set_user(&raw, &without).await;
            let missing = part.trim_start_matches(['+', '~', '&']);
            // The first kind that runs the command (a lock, for every part but a kind's own).
            let kind = KINDS
                .iter()
                .map(|(kind, _)| *kind)
                .find(|kind| commands_of(kind).iter().any(|c| c == missing))
                .unwrap_or("lock");
            let error = match fredlock_user(&server).await {
                // SECURITY.md: connecting needs none of them (a connection's own commands are
                // asked about by the first call, as the scripts' are).
                Err(error) => panic!("without {part}, build() failed: {error}"),
                Ok(client) => {
                    let error = writing_call(&client, kind, "acl-first", WAIT)
                        .await
                        .err()
                        .unwrap_or_else(|| {
                            panic!("without {part}, a {kind}'s first call succeeded")
                        });
                    client.shutdown().await;
                    error
                }
            };
            let shown = error.to_string();
            assert_eq!(
                common::library_word(&shown),
                None,
                "without {part}: {shown}"
            );
            assert!(shown.contains("acl-first"), "without {part}: {shown}");
            assert!(shown.contains("NOPERM"), "without {part}: {shown}");
            let named = match part.chars().next() {
                Some('+') => shown.contains(missing),
                // A pattern: the key or channel it no longer lets through.
                _ => shown.contains(" key") || shown.contains(" channel "),
            };
            // A connection's command takes no key: its refusal names none.
            if ["+ping", "+info", "+client|id"].contains(&part.as_str()) {
                assert!(
                    !shown.contains(" on key "),
                    "without {part}, a keyless command is refused on a key: {shown}"
                );
            }
            assert!(
                named,
                "without {part}, the error does not say what: {shown}"
            );
            assert_eq!(
                common::all_keys(&raw).await,
                Vec::<String>::new(),
                "without {part}, something was written"
            );
        }
    })
    .await;
}

/// A new client whose first call is a single attempt (`try_lock` with no wait) waits for the
/// permission question's answer as for its own reply, however slow the server (stalled here
/// for 200 ms): without `publish` (which the acquire itself does not run), it fails naming it
/// and writes nothing, rather than taking the lock unchecked and failing at the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_attempt_as_the_first_call_waits_for_the_permission_answer() {
    bounded(async {
        let server = RedisServer::start_with_debug();
        let raw = server.raw().await;
        let without: Vec<String> = documented_rule()
            .into_iter()
            .filter(|word| word != "+publish")
            .collect();
        set_user(&raw, &without).await;
        let client = fredlock_user(&server).await.expect("connects");
        let sleeper = server.raw().await;
        let stall = tokio::spawn(async move { common::debug_sleep(&sleeper, 0.2).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        let attempt = client
            .lock("single")
            .try_lock(Duration::ZERO, None)
            .await
            .map(|guard| guard.is_some());
        let shown = attempt.expect_err("taken unchecked").to_string();
        assert!(
            shown.contains("NOPERM") && shown.contains("publish") && shown.contains("app:single"),
            "{shown}"
        );
        stall.await.unwrap();
        assert_eq!(common::all_keys(&raw).await, Vec::<String>::new());
        client.shutdown().await;
    })
    .await;
}

/// Issue 58: `pexpire` taken away while the client runs, after its first call's permission
/// question was answered yes. Redis checks a script's commands as it runs them and keeps what it
/// wrote before a refused one, so an acquisition that wrote its key and was then refused the
/// expiry left the key held for ever. Now each acquisition is refused before it writes, naming
/// `pexpire` and the lock, and no key is left without a TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pexpire_taken_away_at_run_time_leaves_no_key_without_a_ttl() {
    acquisitions_without_pexpire_write_nothing(&["-pexpire"]).await;
}

/// Issue 58: `pexpire` taken away for every key but the fences' (an ACL selector gives it back
/// on them alone): each acquisition asks about the key it may create with an expiry, its own,
/// and is refused before it writes. A script that asked about another of its keys (the fences,
/// as a mutant of `fenced_lock.lua` did) would write its lock and be refused its expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pexpire_kept_only_on_the_fences_still_refuses_every_acquisition() {
    acquisitions_without_pexpire_write_nothing(&["-pexpire", "(+pexpire ~fredlock_fences:*)"])
        .await;
}

/// Every acquisition tried after `change` (words of `ACL SETUSER fredlock`) takes `pexpire` away
/// on the locks' keys, while the client runs: each fails naming `pexpire` and its lock, and no
/// key is left without a TTL.
async fn acquisitions_without_pexpire_write_nothing(change: &[&str]) {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        set_user(&raw, &documented_rule()).await;
        let client = fredlock_user(&server)
            .await
            .expect("connects with the rule");
        // The first call asks the permission question, answered yes; the counters are set up.
        client
            .lock("rt-warm")
            .lock()
            .await
            .unwrap()
            .unlock()
            .await
            .unwrap();
        let permits = client.permit_semaphore("rt-permits");
        permits.try_set_permits(2).await.unwrap();
        let kept = keys_without_ttl(&raw).await;

        let mut words = vec!["SETUSER", "fredlock"];
        words.extend(change);
        let wait = Duration::from_millis(300);
        // Each acquisition gets its own script to the server: a refused call makes the client
        // ask the permission question again before its next call, which would refuse every
        // later acquisition before its script ran. So the rule is put back and a call answered
        // yes before each.
        let mut attempts: Vec<(&str, fredlock::Result<bool>)> = Vec::new();
        for name in [
            "rt-lock",
            "rt-fair",
            "rt-spin",
            "rt-fenced",
            "rt-rw-read",
            "rt-rw-write",
            "rt-leader",
        ] {
            set_user(&raw, &documented_rule()).await;
            let warm = client.lock("rt-warm").lock().await.unwrap();
            warm.unlock().await.unwrap();
            let _: () = raw.custom(fred::cmd!("ACL"), words.clone()).await.unwrap();
            let attempt = match name {
                "rt-lock" => client
                    .lock(name)
                    .try_lock(wait, None)
                    .await
                    .map(|g| g.is_some()),
                "rt-fair" => client
                    .fair_lock(name)
                    .try_lock(wait, None)
                    .await
                    .map(|g| g.is_some()),
                "rt-spin" => client
                    .spin_lock(name)
                    .try_lock(wait, None)
                    .await
                    .map(|g| g.is_some()),
                "rt-fenced" => client
                    .fenced_lock(name)
                    .try_lock(wait, None)
                    .await
                    .map(|g| g.is_some()),
                "rt-rw-read" => client
                    .rw_lock("rt-rw")
                    .read_lock()
                    .try_lock(wait, None)
                    .await
                    .map(|g| g.is_some()),
                "rt-rw-write" => client
                    .rw_lock("rt-rw")
                    .write_lock()
                    .try_lock(wait, None)
                    .await
                    .map(|g| g.is_some()),
                _ => client
                    .leader_election(name)
                    .try_campaign(wait)
                    .await
                    .map(|t| t.is_some()),
            };
            attempts.push((
                name.strip_suffix("-read")
                    .or(name.strip_suffix("-write"))
                    .unwrap_or(name),
                attempt,
            ));
        }
        for (name, attempt) in attempts {
            let error = match attempt {
                Err(error) => error,
                Ok(took) => panic!("{name}: without pexpire the acquisition ended with {took}"),
            };
            let shown = error.to_string();
            assert!(
                shown.contains("NOPERM") && shown.contains("pexpire"),
                "{name}: {shown}"
            );
            assert!(shown.contains(&format!("app:{name}")), "{name}: {shown}");
            assert_eq!(common::library_word(&shown), None, "{name}: {shown}");
        }
        assert_eq!(
            keys_without_ttl(&raw).await,
            kept,
            "a key was left without a TTL"
        );
        client.shutdown().await;
    })
    .await;
}

/// The parts of the documented rule (`select` aside: sent only for a URL that names a
/// database), those in `chunk` of `of`, each taken away at run time in turn.
fn parts_in(chunk: usize, of: usize) -> (Vec<String>, Vec<String>) {
    let rule = documented_rule();
    let start = rule.iter().position(|word| word == "-@all").unwrap() + 1;
    let parts: Vec<String> = rule[start..]
        .iter()
        .filter(|part| *part != "+select")
        .enumerate()
        .filter(|(i, _)| i % of == chunk)
        .map(|(_, part)| part.clone())
        .collect();
    (rule, parts)
}

/// Issue 58: each part of the rule taken away while the client runs (its first call's question
/// answered yes), while holders hold and waiters wait: every primitive's writing calls either
/// work or fail with NOPERM naming what is missing and the lock (the question asked again, not
/// a script's line), no key is left without a TTL, holders whose renewals are refused are told
/// of the loss within their lease and their lock is not given to another owner before, and
/// once the part is back every call works.
async fn each_permission_taken_away_at_run_time(chunk: usize, of: usize) {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let (rule, parts) = parts_in(chunk, of);
        set_user(&raw, &rule).await;
        let a = fredlock_user(&server)
            .await
            .expect("connects with the rule");
        let b = fredlock_user(&server)
            .await
            .expect("connects with the rule");
        for (i, part) in parts.iter().enumerate() {
            let without: Vec<String> = rule.iter().filter(|word| *word != part).cloned().collect();
            // The walk's writes and the calls that must be refused: the commands every
            // acquisition runs, the key patterns, and the script commands themselves.
            let marks = ["NOPERM"];
            let marks = if ["+evalsha", "+hset", "+pexpire", "+exists", "~app:*"]
                .contains(&part.as_str())
            {
                Marks::Refused(&marks)
            } else {
                Marks::MayBeRefused(&marks)
            };
            under_refusal(
                std::slice::from_ref(&raw),
                &a,
                &b,
                &format!("rt{chunk}x{i}"),
                "app:",
                marks,
                set_user(&raw, &without),
                set_user(&raw, &rule),
            )
            .await;
        }
        a.shutdown().await;
        b.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_permission_taken_away_at_run_time_1_of_4() {
    each_permission_taken_away_at_run_time(0, 4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_permission_taken_away_at_run_time_2_of_4() {
    each_permission_taken_away_at_run_time(1, 4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_permission_taken_away_at_run_time_3_of_4() {
    each_permission_taken_away_at_run_time(2, 4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_permission_taken_away_at_run_time_4_of_4() {
    each_permission_taken_away_at_run_time(3, 4).await;
}

/// A renewal refused for a moment (`pexpire` taken away, then given back before the renew
/// deadline) is told as failed at once, and the hold, renewed at the next try, is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_refused_for_a_moment_is_told_failed_and_the_hold_kept() {
    bounded(async {
        let server = RedisServer::start();
        let (raw, client, _events, guard) = a_renewal_refused(&server, "+pexpire").await;
        set_user(&raw, &documented_rule()).await;
        // Past the renew deadline the refusal would have reached.
        tokio::time::sleep(Duration::from_millis(900)).await;
        assert!(
            !guard.is_lost(),
            "lost although a renewal got through in time"
        );
        guard.unlock().await.expect("still held");
        client.shutdown().await;
    })
    .await;
}

/// A hold given back while its renewals are refused (the release needs no `pexpire`) is not
/// told lost afterwards, when the renewal is tried again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_released_while_its_renewals_are_refused_is_not_told_lost() {
    bounded(async {
        let server = RedisServer::start();
        let (_raw, client, mut events, guard) = a_renewal_refused(&server, "+pexpire").await;
        guard
            .unlock()
            .await
            .expect("released while renewals are refused");
        let mut seen = Vec::new();
        let quiet = tokio::time::Instant::now() + Duration::from_millis(800);
        while let Ok(Ok(event)) = tokio::time::timeout_at(quiet, events.recv()).await {
            seen.push(event.what());
        }
        assert_eq!(seen, [fredlock::events::LockEventKind::Released]);
        client.shutdown().await;
    })
    .await;
}

/// A fixed lease's checks, refused (`evalsha` taken away while it is held), wait for the next
/// period: they are not retried at the pace of failed renewals (a quarter of the period), since
/// the lease ends by itself whatever a check finds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_leases_refused_checks_wait_for_the_next_period() {
    bounded(async {
        let server = RedisServer::start();
        let (raw, rule, client) = the_documented_user(&server).await;
        let guard = client
            .lock("checked")
            .lock_with_lease(Duration::from_secs(5))
            .await
            .expect("takes it");
        let without: Vec<String> = rule.iter().filter(|w| *w != "+evalsha").cloned().collect();
        set_user(&raw, &without).await;
        let before = scripts_refused(&raw).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let refused = scripts_refused(&raw).await - before;
        set_user(&raw, &rule).await;
        // A check every third of the 1 s watchdog lease: 6 in 2 s (retried at a quarter of
        // that, about 24).
        assert!(
            (3..=8).contains(&refused),
            "{refused} checks refused in 2 s"
        );
        guard.unlock().await.expect("still held");
        client.shutdown().await;
    })
    .await;
}

/// A renewal refused (`evalsha` taken away while the lock is held) is tried again at a quarter
/// of the period, not at once and again and again: a handful of refused scripts in 150 ms, and
/// the hold kept when the permission comes back before the renew deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_renewal_is_tried_again_at_a_quarter_of_the_period() {
    bounded(async {
        let server = RedisServer::start();
        let (raw, client, _events, guard) = a_renewal_refused(&server, "+evalsha").await;
        // The first refusal was told; the tries in the next 150 ms.
        let before = scripts_refused(&raw).await;
        tokio::time::sleep(Duration::from_millis(150)).await;
        let refused = scripts_refused(&raw).await - before;
        set_user(&raw, &documented_rule()).await;
        // A try every 83 ms: 1 or 2 (tried again at once, hundreds).
        assert!(
            (1..=4).contains(&refused),
            "{refused} renewals refused in 150 ms"
        );
        tokio::time::sleep(Duration::from_millis(900)).await;
        assert!(
            !guard.is_lost(),
            "lost although a renewal got through in time"
        );
        guard.unlock().await.expect("still held");
        client.shutdown().await;
    })
    .await;
}

/// The script calls the server refused before running them (`rejected_calls` in
/// `INFO commandstats`), of every form.
async fn scripts_refused(raw: &Client) -> u64 {
    let info: String = raw
        .info(Some(fred::types::InfoKind::CommandStats))
        .await
        .unwrap();
    info.lines()
        .filter(|line| line.starts_with("cmdstat_eval"))
        .filter_map(|line| {
            let (_, rejected) = line.split_once("rejected_calls=")?;
            rejected.split(',').next()?.parse::<u64>().ok()
        })
        .sum()
}

/// A lock held by the documented user, whose renewal was then refused (`part` of the rule taken
/// away): the raw connection, the client, its events after the failure was told, and the guard.
async fn a_renewal_refused(
    server: &RedisServer,
    part: &str,
) -> (
    Client,
    LockClient,
    fredlock::events::LockEvents,
    fredlock::LockGuard,
) {
    let (raw, rule, client) = the_documented_user(server).await;
    let mut events = client.events();
    let guard = client.lock("refused-once").lock().await.expect("takes it");
    // Renewed once with the rule whole (every third of the 1 s lease).
    tokio::time::sleep(Duration::from_millis(400)).await;
    let without: Vec<String> = rule.iter().filter(|w| *w != part).cloned().collect();
    set_user(&raw, &without).await;
    let failed = async {
        loop {
            match events.recv().await {
                Ok(event) if event.what() == fredlock::events::LockEventKind::RenewalFailed => {
                    return event;
                }
                Ok(_) => {}
                Err(error) => panic!("the stream ended: {error:?}"),
            }
        }
    };
    let event = tokio::time::timeout(Duration::from_millis(600), failed)
        .await
        .expect("the refused renewal is told at once, before the renew deadline");
    assert_eq!(event.name(), "app:refused-once");
    (raw, client, events, guard)
}

/// Issue 58: a holder whose renewals are refused (`pexpire`, or the scripts themselves, taken
/// away while it holds) is told of the loss before its lease ends on the server: when the loss
/// is told, the lock's key is still there with a TTL, and nobody else could have taken it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_renewals_are_refused_is_told_before_its_lease_ends() {
    bounded(async {
        let server = RedisServer::start();
        let (raw, rule, client) = the_documented_user(&server).await;
        for part in ["+pexpire", "+evalsha"] {
            let name = format!("renewal-{}", part.trim_start_matches('+'));
            let guard = client.lock(&name).lock().await.expect("takes it");
            // Renewed at least once with the rule whole.
            tokio::time::sleep(Duration::from_millis(600)).await;
            let without: Vec<String> = rule.iter().filter(|word| *word != part).cloned().collect();
            set_user(&raw, &without).await;
            tokio::time::timeout(Duration::from_secs(3), guard.lost())
                .await
                .unwrap_or_else(|_| panic!("without {part}, the holder was never told"));
            let ttl: i64 = raw.pttl(format!("app:{name}")).await.unwrap();
            assert!(
                ttl > 0,
                "without {part}, the holder was told after its lease ended (PTTL {ttl})"
            );
            set_user(&raw, &rule).await;
            assert!(guard.is_lost());
            assert!(guard.cancellation_token().is_cancelled());
            drop(guard);
        }
        client.shutdown().await;
    })
    .await;
}

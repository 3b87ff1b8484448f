//! Acceptance tests of the fenced lock against real `redis-server` and PostgreSQL processes:
//! tokens that never go backwards, Redisson's layout, and fencing that rejects a paused holder's
//! writes where the data lives.

mod common;

use std::time::Duration;

use common::{bounded, PostgresServer, RedisCluster, RedisServer};
use fred::prelude::*;
use fredlock::{Error, RedisErrorKind, DEFAULT_WATCHDOG_LEASE};

/// Guards and locks cross tasks.
const _: () = {
    const fn shareable<T: Send + Sync + 'static>() {}
    shareable::<fredlock::FencedLock>();
    shareable::<fredlock::FencedGuard>();
};

fn counter_key(name: &str) -> String {
    format!("redisson_lock_token:{{{name}}}")
}

async fn tokens_in(raw: &Client, list: &str) -> Vec<u64> {
    raw.lrange(list, 0, -1).await.unwrap()
}

fn assert_strictly_increasing(tokens: &[u64]) {
    for pair in tokens.windows(2) {
        assert!(
            pair[0] < pair[1],
            "tokens went {} then {}",
            pair[0],
            pair[1]
        );
    }
}

/// 3 clients x 4 tasks x 200 acquisitions: inside each critical section the holder appends its
/// token to a list, which ends strictly increasing and 2400 long.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tokens_strictly_increase_across_clients_and_tasks() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let mut tasks = Vec::new();
        let mut clients = Vec::new();
        for _ in 0..3 {
            let client = server.lock_client(DEFAULT_WATCHDOG_LEASE).await;
            for _ in 0..4 {
                let lock = client.fenced_lock("fenced-order");
                let raw = raw.clone();
                tasks.push(tokio::spawn(async move {
                    for _ in 0..200 {
                        let guard = lock.lock().await.unwrap();
                        let _: i64 = raw.rpush("tokens", guard.token()).await.unwrap();
                        guard.unlock().await.unwrap();
                    }
                }));
            }
            clients.push(client);
        }
        for task in tasks {
            task.await.unwrap();
        }
        let tokens = tokens_in(&raw, "tokens").await;
        assert_eq!(tokens.len(), 2400);
        assert_strictly_increasing(&tokens);
        let last = clients[0]
            .fenced_lock("fenced-order")
            .last_token()
            .await
            .unwrap();
        assert_eq!(last, tokens.last().copied());
    })
    .await;
}

/// A re-entry gets its outer hold's token; the next acquisition a greater one; and after the
/// counter is deleted (as a restart without persistence or an eviction would), the next token
/// still exceeds every one before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentry_keeps_the_token_and_a_lost_counter_never_goes_back() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = server.lock_client(DEFAULT_WATCHDOG_LEASE).await;
        let lock = client.fenced_lock("fenced-reentry");
        assert_eq!(lock.last_token().await.unwrap(), None);

        let outer = lock.lock().await.unwrap();
        let inner = lock.lock().await.unwrap();
        let innermost = lock.try_lock(Duration::ZERO, None).await.unwrap().unwrap();
        assert_eq!(lock.hold_count().await.unwrap(), 3);
        assert_eq!(inner.token(), outer.token());
        assert_eq!(innermost.token(), outer.token());
        let first = outer.token();
        // The last token issued, as `token()` reads it and as an inspection reports it.
        assert_eq!(lock.last_token().await.unwrap(), Some(first));
        let inspection = lock.inspect().await.unwrap();
        assert_eq!(
            inspection.details,
            fredlock::Details::Fenced {
                last_token: Some(first)
            },
            "{inspection:?}"
        );
        assert_eq!(inspection.holders.len(), 1, "{inspection:?}");
        // The holder as the hash of holds has it: its owner field, its three holds (its token
        // is the last issued, in the details).
        let holder = &inspection.holders[0];
        assert_eq!(holder.owner, outer.owner_field(), "{inspection:?}");
        assert_eq!(holder.count, 3, "{inspection:?}");
        innermost.unlock().await.unwrap();
        inner.unlock().await.unwrap();
        outer.unlock().await.unwrap();

        let second = lock.lock().await.unwrap();
        assert!(second.token() > first);
        let before_loss = second.token();
        second.unlock().await.unwrap();

        // A small Redisson-seeded counter (Redisson starts at 1): lost, and seeded again from
        // the server clock, the next token is still greater.
        let _: i64 = raw.del(counter_key("fenced-reentry")).await.unwrap();
        let after_loss = lock.lock().await.unwrap();
        assert!(
            after_loss.token() > before_loss,
            "{} after {}",
            after_loss.token(),
            before_loss
        );
        let after_loss_token = after_loss.token();
        after_loss.unlock().await.unwrap();

        // The same when the counter was a clock-seeded one: delete it again right away.
        let _: i64 = raw.del(counter_key("fenced-reentry")).await.unwrap();
        let again = lock.lock().await.unwrap();
        assert!(again.token() > after_loss_token);
        let token = again.token();
        // with_lock hands the work the token.
        again.unlock().await.unwrap();
        let seen = tokio::time::timeout(
            Duration::from_secs(5),
            lock.with_lock(|(token, _lost)| async move { token }),
        )
        .await
        .unwrap()
        .unwrap();
        assert!(seen > token);
    })
    .await;
}

/// Redisson's layout: the reentrant lock's hash at `name`, and the counter
/// `redisson_lock_token:{name}`, a string without expiry holding the last token. A counter of
/// the wrong type is named in `WrongType`, and nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layout_is_redissons_and_a_bad_counter_changes_nothing() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = server.lock_client(DEFAULT_WATCHDOG_LEASE).await;
        let lock = client.fenced_lock("fenced-layout");
        let guard = lock.lock().await.unwrap();

        let kind: String = raw.r#type("fenced-layout").await.unwrap();
        assert_eq!(kind, "hash");
        let fields: std::collections::HashMap<String, i64> =
            raw.hgetall("fenced-layout").await.unwrap();
        assert_eq!(
            fields,
            std::collections::HashMap::from([(guard.owner_field().to_string(), 1)])
        );
        let pttl: i64 = raw.pttl("fenced-layout").await.unwrap();
        assert!(pttl > 0 && pttl <= 30_000, "{pttl}");

        let counter = counter_key("fenced-layout");
        let kind: String = raw.r#type(counter.as_str()).await.unwrap();
        assert_eq!(kind, "string");
        let value: u64 = raw.get(counter.as_str()).await.unwrap();
        assert_eq!(value, guard.token());
        let ttl: i64 = raw.pttl(counter.as_str()).await.unwrap();
        assert_eq!(ttl, -1, "the counter has no expiry");
        guard.unlock().await.unwrap();

        // A counter that is no counter: refused before anything is written.
        let bad = client.fenced_lock("fenced-bad");
        let bad_counter = counter_key("fenced-bad");
        let _: i64 = raw.lpush(bad_counter.as_str(), "x").await.unwrap();
        let error = bad
            .try_lock(Duration::ZERO, None)
            .await
            .expect_err("a list is no counter");
        match &error {
            Error::WrongType { key, .. } => assert_eq!(key, &bad_counter),
            other => panic!("expected WrongType, got {other}"),
        }
        let _: i64 = raw.del(bad_counter.as_str()).await.unwrap();
        let _: () = raw
            .set(bad_counter.as_str(), "not a number", None, None, false)
            .await
            .unwrap();
        let error = bad.try_lock(Duration::ZERO, None).await.unwrap_err();
        assert!(matches!(error, Error::WrongType { .. }), "{error}");
        assert!(matches!(
            bad.last_token().await,
            Err(Error::WrongType { .. })
        ));
        assert!(matches!(
            client.fenced_lock("").last_token().await,
            Err(Error::InvalidArgument(_))
        ));
        let exists: u32 = raw.exists("fenced-bad").await.unwrap();
        assert_eq!(exists, 0, "the lock was not written");
        let value: String = raw.get(bad_counter.as_str()).await.unwrap();
        assert_eq!(value, "not a number", "the counter was not changed");
    })
    .await;
}

/// A Java client, replayed: Redisson's fenced lock operations (the reentrant hash, INCR of the
/// counter on every acquisition, the unlock message on the lock's channel), in our own Lua.
const JAVA_ACQUIRE: &str = r#"
if redis.call('exists', KEYS[1]) == 0 or redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
    redis.call('hincrby', KEYS[1], ARGV[2], 1)
    redis.call('pexpire', KEYS[1], ARGV[1])
    return {'won', redis.call('incr', KEYS[2])}
end
return {'busy', redis.call('pttl', KEYS[1])}
"#;
const JAVA_RELEASE: &str = r#"
if redis.call('hexists', KEYS[1], ARGV[1]) == 0 then
    return nil
end
if redis.call('hincrby', KEYS[1], ARGV[1], -1) > 0 then
    return 0
end
redis.call('del', KEYS[1])
redis.call('publish', KEYS[2], 0)
return 1
"#;

async fn java_acquire(raw: &Client, name: &str, field: &str) -> (String, i64) {
    raw.eval(
        JAVA_ACQUIRE,
        vec![name.to_string(), counter_key(name)],
        vec!["30000".to_string(), field.to_string()],
    )
    .await
    .unwrap()
}

async fn java_release(raw: &Client, name: &str, field: &str) {
    let released: Option<i64> = raw
        .eval(
            JAVA_RELEASE,
            vec![
                name.to_string(),
                format!("redisson_lock__channel:{{{name}}}"),
            ],
            vec![field.to_string()],
        )
        .await
        .unwrap();
    assert_eq!(released, Some(1));
}

/// Redisson and fredlock on one fenced lock: they exclude each other, a fredlock waiter is woken
/// by the Java unlock, and the tokens of both form one increasing sequence.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn interoperates_with_redisson_replay() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = server.lock_client(DEFAULT_WATCHDOG_LEASE).await;
        let lock = client.fenced_lock("fenced-java");
        let java = "8c1a4d3e-0000-4000-8000-000000000001:77";

        let (won, java_token) = java_acquire(&raw, "fenced-java", java).await;
        assert_eq!(won, "won");
        assert!(lock.try_lock(Duration::ZERO, None).await.unwrap().is_none());
        let waiter = {
            let lock = lock.clone();
            tokio::spawn(async move {
                let guard = lock.lock().await.unwrap();
                (guard.token(), guard)
            })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        java_release(&raw, "fenced-java", java).await;
        let (rust_token, guard) = tokio::time::timeout(Duration::from_secs(2), waiter)
            .await
            .expect("the Java unlock woke the waiter")
            .unwrap();
        assert!(rust_token > java_token as u64);

        let (busy, pttl) = java_acquire(&raw, "fenced-java", java).await;
        assert_eq!(busy, "busy");
        assert!(pttl > 0);
        guard.unlock().await.unwrap();

        let (won, java_again) = java_acquire(&raw, "fenced-java", java).await;
        assert_eq!(won, "won");
        assert!(java_again as u64 > rust_token);
        java_release(&raw, "fenced-java", java).await;
        let last = lock.lock().await.unwrap();
        assert!(last.token() > java_again as u64);
        last.unlock().await.unwrap();
    })
    .await;
}

/// Kleppmann's pause, for real: holder A gets token t with a 300 ms lease and sleeps past it;
/// B acquires with t' > t and writes; A wakes and writes with t. PostgreSQL refuses A's write
/// (0 rows, B's data kept), and so does Redis through the held-only write.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paused_holders_writes_are_rejected() {
    bounded(async {
        let redis = RedisServer::start();
        let raw = redis.raw().await;
        let postgres = PostgresServer::start();
        let db = postgres.client().await;
        db.batch_execute(
            "CREATE TABLE resources (id int PRIMARY KEY, data text NOT NULL,
                                     last_fencing_token bigint NOT NULL);
             INSERT INTO resources VALUES (1, 'initial', 0);",
        )
        .await
        .unwrap();
        let update = "UPDATE resources SET data = $1, last_fencing_token = $2 \
                      WHERE id = $3 AND last_fencing_token < $2";

        let client_a = redis.lock_client(DEFAULT_WATCHDOG_LEASE).await;
        let client_b = redis.lock_client(DEFAULT_WATCHDOG_LEASE).await;
        let a = client_a
            .fenced_lock("fenced-pause")
            .lock_with_lease(Duration::from_millis(300))
            .await
            .unwrap();
        let t = a.token();

        // A is paused past its lease.
        tokio::time::sleep(Duration::from_millis(600)).await;

        let b = client_b.fenced_lock("fenced-pause").lock().await.unwrap();
        let t_b = b.token();
        assert!(t_b > t);
        let rows = db
            .execute(update, &[&"written by B", &(t_b as i64), &1i32])
            .await
            .unwrap();
        assert_eq!(rows, 1);
        let written: i64 = b
            .eval_while_held(
                "redis.call('set', KEYS[1], ARGV[1]) return 1",
                ["{fenced-pause}:data"],
                ["written by B"],
            )
            .await
            .unwrap();
        assert_eq!(written, 1);

        // A resumes, unaware, and writes with its old token.
        let rows = db
            .execute(update, &[&"written by A", &(t as i64), &1i32])
            .await
            .unwrap();
        assert_eq!(rows, 0, "PostgreSQL rejected the stale token");
        let row = db
            .query_one(
                "SELECT data, last_fencing_token FROM resources WHERE id = 1",
                &[],
            )
            .await
            .unwrap();
        assert_eq!(row.get::<_, String>(0), "written by B");
        assert_eq!(row.get::<_, i64>(1), t_b as i64);

        let refused = a
            .eval_while_held::<i64, _, _>(
                "redis.call('set', KEYS[1], ARGV[1]) return 1",
                ["{fenced-pause}:data"],
                ["written by A"],
            )
            .await;
        assert!(matches!(refused, Err(Error::NotHeld { .. })), "{refused:?}");
        let data: String = raw.get("{fenced-pause}:data").await.unwrap();
        assert_eq!(data, "written by B");
        b.unlock().await.unwrap();
    })
    .await;
}

/// A held-only script's keys, arguments and reply are the crate's own words, read the same on
/// every client library (this file runs on fred and on redis-rs): numbers, text, bytes that are
/// not UTF-8, Lua's true and false, arrays, a hash as a map; a reply that is not the type asked
/// is an error that shows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_only_scripts_read_their_replies_alike_on_every_client() {
    use fredlock::{FromReply, Reply, ScriptArg};
    use std::collections::HashMap;
    bounded(async {
        let server = RedisServer::start();
        let client = server.lock_client(DEFAULT_WATCHDOG_LEASE).await;
        let guard = client.lock("{words}").lock().await.unwrap();
        let no_keys: [&str; 0] = [];
        let no_args: [&str; 0] = [];
        let reply = |script: &'static str| {
            let guard = &guard;
            async move {
                guard
                    .eval_while_held::<Reply, _, _>(script, no_keys, no_args)
                    .await
                    .unwrap()
            }
        };
        assert_eq!(reply("return 42").await, Reply::Integer(42));
        assert_eq!(reply("return 'paid'").await, Reply::Text("paid".into()));
        assert_eq!(reply("return false").await, Reply::Nil);
        assert_eq!(reply("return true").await, Reply::Integer(1));
        assert_eq!(
            reply("return {1, 'a', {2}}").await,
            Reply::Array(vec![
                Reply::Integer(1),
                Reply::Text("a".into()),
                Reply::Array(vec![Reply::Integer(2)])
            ])
        );
        assert!(!bool::from_reply(reply("return false").await).unwrap());
        // The caller's script sees its own keys and arguments, not the lock and the owner the
        // wrapper sends after them (mutants of lua/while_held.lua that hand them on survived).
        let seen: Vec<i64> = guard
            .eval_while_held(
                "return {#KEYS, #ARGV, KEYS[2] == '{words}:b' and 1 or 0}",
                ["{words}:a", "{words}:b"],
                ["x"],
            )
            .await
            .unwrap();
        assert_eq!(
            seen,
            vec![2, 1, 1],
            "the caller's keys and arguments, alone"
        );
        assert_eq!(
            String::from_reply(reply("return 42").await).as_deref(),
            Some("42")
        );

        // Bytes that are not UTF-8 go and come back as they are; numbers go as decimal text.
        let binary: Reply = guard
            .eval_while_held(
                "return ARGV[1]",
                no_keys,
                [ScriptArg::from(&[0xff_u8, 0][..])],
            )
            .await
            .unwrap();
        assert_eq!(binary, Reply::Bytes(vec![0xff, 0]));
        let echoed: (String, i64) = guard
            .eval_while_held(
                "return {ARGV[1], tonumber(ARGV[2])}",
                no_keys,
                [ScriptArg::from(-1.5_f64), ScriptArg::from(7_u64)],
            )
            .await
            .unwrap();
        assert_eq!(echoed, ("-1.5".to_string(), 7));

        // A hash read back as a map (HGETALL's flat array of fields and values).
        let hash: HashMap<String, i64> = guard
            .eval_while_held(
                "redis.call('hset', KEYS[1], 'a', ARGV[1], 'b', ARGV[2]) \
                 return redis.call('hgetall', KEYS[1])",
                ["{words}:data"],
                [1, 2],
            )
            .await
            .unwrap();
        assert_eq!(hash, HashMap::from([("a".into(), 1), ("b".into(), 2)]));
        let missing: Option<String> = guard
            .eval_while_held(
                "return redis.call('get', KEYS[1])",
                ["{words}:none"],
                no_args,
            )
            .await
            .unwrap();
        assert_eq!(missing, None);

        let unreadable = guard
            .eval_while_held::<i64, _, _>("return 'seven'", no_keys, no_args)
            .await
            .unwrap_err();
        let shown = unreadable.to_string();
        assert!(matches!(unreadable, Error::Redis { .. }), "{shown}");
        assert!(shown.contains("seven") && shown.contains("i64"), "{shown}");
        assert_eq!(common::library_word(&shown), None, "{shown}");
        guard.unlock().await.unwrap();
    })
    .await;
}

/// The held-only write is checked by the server: a holder whose lock was deleted behind its
/// back (it does not know yet) writes nothing; keys outside the lock's hash slot on a cluster are
/// refused before anything is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_only_writes_are_checked_by_the_server() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = server.lock_client(DEFAULT_WATCHDOG_LEASE).await;
        let lock = client.lock("held-only");
        let guard = lock.lock().await.unwrap();
        let reply: String = guard
            .eval_while_held(
                "redis.call('set', KEYS[1], ARGV[1]) return ARGV[2]",
                ["{held-only}:data"],
                ["v1", "echo"],
            )
            .await
            .unwrap();
        assert_eq!(reply, "echo", "the caller's KEYS and ARGV are its own");

        // The lock is deleted behind its holder's back (a plain DEL, which tells nobody, unlike
        // a force unlock, whose notice can reach the holder before this line runs); the
        // watchdog has not noticed yet.
        let deleted: i64 = raw.del("held-only").await.unwrap();
        assert_eq!(deleted, 1);
        assert!(!guard.is_lost());
        let refused = guard
            .eval_while_held::<i64, _, _>(
                "redis.call('set', KEYS[1], ARGV[1]) return 1",
                ["{held-only}:data"],
                ["v2"],
            )
            .await;
        assert!(matches!(refused, Err(Error::NotHeld { .. })), "{refused:?}");
        let data: String = raw.get("{held-only}:data").await.unwrap();
        assert_eq!(data, "v1");
        drop(guard);

        // The caller's own script failing is the caller's error, not the lock's key.
        let guard = lock.lock().await.unwrap();
        let _: i64 = raw.hset("{held-only}:hash", ("f", "v")).await.unwrap();
        let failed = guard
            .eval_while_held::<i64, _, _>(
                "return redis.call('incr', KEYS[1])",
                ["{held-only}:hash"],
                Vec::<String>::new(),
            )
            .await
            .unwrap_err();
        assert!(
            matches!(&failed, Error::Redis { source, .. } if source.kind() == RedisErrorKind::Refused),
            "an error reply is an answer: {failed:?}"
        );
        assert!(failed.to_string().contains("held-only"), "{failed}");
        let fields: std::collections::HashMap<String, i64> =
            raw.hgetall("held-only").await.unwrap();
        assert_eq!(
            lock.hold_count().await.unwrap(),
            1,
            "the hold is untouched: {fields:?} {:?} {}",
            client.stats(),
            guard.is_lost()
        );
        guard.unlock().await.unwrap();

        let cluster = RedisCluster::start();
        let client = common::connect(&cluster.url()).await.unwrap();
        let guard = client.fenced_lock("held-slot").lock().await.unwrap();
        let ok: i64 = guard
            .eval_while_held(
                "redis.call('set', KEYS[1], ARGV[1]) return 1",
                ["{held-slot}:data"],
                ["in the lock's slot"],
            )
            .await
            .unwrap();
        assert_eq!(ok, 1);
        let error = guard
            .eval_while_held::<i64, _, _>(
                "redis.call('set', KEYS[1], ARGV[1]) return 1",
                ["elsewhere"],
                ["x"],
            )
            .await
            .unwrap_err();
        assert!(matches!(error, Error::InvalidArgument(_)), "{error}");
        assert!(error.to_string().contains("elsewhere"), "{error}");
        let cluster_raw = cluster.raw().await;
        let exists: u32 = cluster_raw.exists("elsewhere").await.unwrap();
        assert_eq!(exists, 0);
        guard.unlock().await.unwrap();
        client.shutdown().await;
    })
    .await;
}

/// `into_lock_guard` keeps the hold (nothing is released by the conversion) and the plain
/// guard it gives unlocks it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn into_lock_guard_keeps_the_hold() {
    bounded(async {
        let server = RedisServer::start();
        let client = server.lock_client(Duration::from_secs(2)).await;
        let other = server.lock_client(Duration::from_secs(2)).await;
        let lock = client.fenced_lock("converted");
        let fenced = lock.lock().await.unwrap();
        let plain = fenced.into_lock_guard();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(lock.hold_count().await.unwrap(), 1);
        let taken = other
            .fenced_lock("converted")
            .try_lock(Duration::ZERO, None)
            .await;
        assert!(taken.unwrap().is_none(), "free after the conversion");
        plain.unlock().await.unwrap();
        assert!(!lock.is_locked().await.unwrap());
        client.shutdown().await;
        other.shutdown().await;
    })
    .await;
}

//! Scenario 8: client instructions per uncontended lock+unlock, counted by valgrind's callgrind,
//! which counts instructions rather than time: exact and repeatable on a noisy machine.
//!
//! The benchmark runs itself as a child under `valgrind --tool=callgrind` twice per subject, for
//! 200 and for 600 cycles after a warm-up, on a current-thread runtime; the difference divided by
//! 400 is the marginal cost of one cycle, free of start-up and shutdown. Subjects: the reentrant,
//! fenced and spin locks; our acquire and release scripts as two raw EVALSHAs through fred (with
//! the arguments fredlock sends: a request id per call, the fence set's key); and the floor,
//! Redisson's minimal acquire and release (our Lua of what its RLock scripts do) with constant
//! arguments built once, through raw fred: the least any Redisson-compatible lock can send. The
//! reentrant lock on redis-rs (`Backend::RedisRs`) is measured the same way, against the same
//! raw calls and floor sent through redis-rs.

use std::process::Command;

use fred::prelude::*;
use fred::types::Value;

use crate::scenarios::{lock_cycle, raw_client, RawScripts, RedisRsScripts};
use crate::Row;
use fredlock::prelude::*;

/// The flag that makes the benchmark a child: `--instructions-child <subject> <cycles> <url>`.
pub const CHILD_FLAG: &str = "--instructions-child";

const SUBJECTS: [&str; 11] = [
    "fredlock",
    IDLE_RECEIVER,
    "fredlock fenced",
    "fredlock spin",
    RAW,
    FLOOR,
    ON_REDIS_RS,
    RAW_REDIS_RS,
    FLOOR_REDIS_RS,
    JOB_REDIS_RS,
    RSLOCK,
];

/// The reentrant lock of a client with an event receiver that never reads (issue 46).
pub const IDLE_RECEIVER: &str = "fredlock + idle event receiver";
/// The two script calls by hand through fred.
const RAW: &str = "raw EVALSHA x2";
/// The floor subject.
const FLOOR: &str = "floor: Redisson's minimal scripts";
/// The reentrant lock on redis-rs (`Backend::RedisRs`), and its raw calls and floor through
/// redis-rs (issue 45): each backend is measured against the same client library.
const ON_REDIS_RS: &str = "fredlock on redis-rs";
const RAW_REDIS_RS: &str = "raw EVALSHA x2 on redis-rs";
const FLOOR_REDIS_RS: &str = "floor on redis-rs";
/// An empty job's run on redis-rs (one `SET NX PX`, one release script), against rslock's
/// lock+unlock (one `SET NX PX`, one unlock script) through the same client library: what
/// scenario 13 compares in time, counted in instructions.
const JOB_REDIS_RS: &str = "fredlock job on redis-rs";
const RSLOCK: &str = "rslock 0.10";

/// Redisson's RLock acquire as its script does it (our Lua): take or re-enter, else the TTL.
const MINIMAL_ACQUIRE: &str = "if redis.call('exists', KEYS[1]) == 0 \
    or redis.call('hexists', KEYS[1], ARGV[2]) == 1 then \
    redis.call('hincrby', KEYS[1], ARGV[2], 1) redis.call('pexpire', KEYS[1], ARGV[1]) \
    return nil end return redis.call('pttl', KEYS[1])";
/// Redisson's RLock release as its script does it (our Lua): one hold back, the last deletes
/// and publishes.
const MINIMAL_RELEASE: &str = "if redis.call('hexists', KEYS[1], ARGV[3]) == 0 then \
    return nil end local left = redis.call('hincrby', KEYS[1], ARGV[3], -1) \
    if left > 0 then redis.call('pexpire', KEYS[1], ARGV[2]) return 0 end \
    redis.call('del', KEYS[1]) redis.call('publish', KEYS[2], ARGV[1]) return 1";
const FEW: u64 = 200;
const MANY: u64 = 600;
const WARM_UP: u64 = 50;

/// Runs the scenario; no rows (and a word why) when valgrind is not installed.
pub fn instructions(url: &str) -> Vec<Row> {
    if Command::new("valgrind").arg("--version").output().is_err() {
        eprintln!("  valgrind not found (Debian: valgrind); scenario 8 skipped");
        return Vec::new();
    }
    let Ok(exe) = std::env::current_exe() else {
        eprintln!("  cannot find the benchmark's own executable; scenario 8 skipped");
        return Vec::new();
    };
    let mut rows = Vec::new();
    let mut per_cycle = Vec::new();
    for subject in SUBJECTS {
        let count = |cycles: u64| -> Option<u64> {
            let output = Command::new("valgrind")
                .args(["--tool=callgrind", "--callgrind-out-file=/dev/null"])
                .arg(&exe)
                .args([CHILD_FLAG, subject, &cycles.to_string(), url])
                .output()
                .ok()?;
            let text = String::from_utf8_lossy(&output.stderr);
            text.lines()
                .find_map(|line| line.split_once("Collected :").map(|(_, n)| n.trim()))
                .and_then(|n| n.parse().ok())
        };
        match (count(FEW), count(MANY)) {
            (Some(few), Some(many)) if many > few => {
                let marginal = (many - few) as f64 / (MANY - FEW) as f64;
                rows.push(Row::single(
                    "8 instructions",
                    subject,
                    "per lock+unlock (callgrind)",
                    "instr",
                    marginal,
                ));
                per_cycle.push((subject, marginal));
            }
            _ => eprintln!("  callgrind gave no count for {subject}"),
        }
    }
    let of = |wanted: &str| {
        per_cycle
            .iter()
            .find(|(subject, _)| *subject == wanted)
            .map(|(_, marginal)| *marginal)
    };
    if let (Some(plain), Some(idle)) = (of("fredlock"), of(IDLE_RECEIVER)) {
        rows.push(Row::ratio(
            "8 instructions",
            &format!("{IDLE_RECEIVER} / fredlock"),
            idle / plain,
        ));
    }
    if let (Some(job), Some(rslock)) = (of(JOB_REDIS_RS), of(RSLOCK)) {
        rows.push(Row::ratio(
            "8 instructions",
            &format!("{JOB_REDIS_RS} / {RSLOCK}"),
            job / rslock,
        ));
    }
    // Each subject against the raw calls and the floor through its own client library.
    for (subject, marginal) in &per_cycle {
        if !subject.starts_with("fredlock") || *subject == JOB_REDIS_RS {
            continue;
        }
        let bases = if *subject == ON_REDIS_RS {
            [
                (RAW_REDIS_RS, "raw on redis-rs"),
                (FLOOR_REDIS_RS, "floor on redis-rs"),
            ]
        } else {
            [(RAW, "raw"), (FLOOR, "floor")]
        };
        for (base, name) in bases {
            if let Some(base) = of(base) {
                rows.push(Row::ratio(
                    "8 instructions",
                    &format!("{subject} / {name}"),
                    marginal / base,
                ));
            }
        }
    }
    rows
}

/// The child: `cycles` lock+unlock cycles of `subject` after a warm-up, on the caller's
/// (current-thread) runtime.
pub async fn child(subject: &str, cycles: u64, url: &str) {
    // Built with the `metrics` feature, cycles are counted with a recorder recording.
    crate::recording::record_for_count();
    let backend = if subject == ON_REDIS_RS || subject == JOB_REDIS_RS {
        fredlock::Backend::RedisRs
    } else {
        fredlock::Backend::Fred
    };
    let client = fredlock::LockClient::builder()
        .backend(backend)
        .url(url)
        .build()
        .await
        .expect("connect");
    // Kept, never read: every event of the cycles goes into its ring.
    let _idle = (subject == IDLE_RECEIVER).then(|| client.events());
    let lock = match subject {
        "fredlock" | ON_REDIS_RS | IDLE_RECEIVER => Some(client.lock("bench:instructions")),
        "fredlock fenced" => Some(
            client
                .fenced_lock("bench:instructions:fenced")
                .as_lock()
                .clone(),
        ),
        "fredlock spin" => Some(
            client
                .spin_lock("bench:instructions:spin")
                .as_lock()
                .clone(),
        ),
        _ => None,
    };
    match lock {
        Some(lock) => {
            for _ in 0..WARM_UP + cycles {
                lock_cycle(&lock).await;
            }
        }
        None if subject == JOB_REDIS_RS => {
            let job = client
                .job_lock("bench:instructions:job")
                .at_most_for(std::time::Duration::from_secs(10));
            for _ in 0..WARM_UP + cycles {
                let ran = job.run(async {}).await.expect("run");
                assert!(ran.is_ran(), "the job was not free");
            }
        }
        None if subject == RSLOCK => {
            let rslock = rslock::LockManager::new(vec![url.to_string()]);
            let ttl = std::time::Duration::from_secs(10);
            for _ in 0..WARM_UP + cycles {
                let guard = rslock
                    .lock(b"bench:instructions:rslock", ttl)
                    .await
                    .expect("rslock lock");
                rslock.unlock(&guard).await;
            }
        }
        None if subject == FLOOR => {
            let raw = raw_client(url).await;
            let acquire: String = raw.script_load(MINIMAL_ACQUIRE).await.expect("load");
            let release: String = raw.script_load(MINIMAL_RELEASE).await.expect("load");
            let name = "bench:instructions:floor";
            let keys = vec![name, "redisson_lock__channel:{bench:instructions:floor}"];
            let field = Value::from("00000000-0000-0000-0000-000000000000:1");
            let lease = Value::from("30000");
            let acquire_args = vec![lease.clone(), field.clone()];
            let release_args = vec![Value::from("0"), lease, field];
            for _ in 0..WARM_UP + cycles {
                let _: Option<i64> = raw
                    .evalsha(&acquire, name, acquire_args.clone())
                    .await
                    .expect("floor acquire");
                let _: Option<i64> = raw
                    .evalsha(&release, keys.clone(), release_args.clone())
                    .await
                    .expect("floor release");
            }
        }
        None if subject == RAW_REDIS_RS => {
            let raw = raw_client(url).await;
            let scripts = RedisRsScripts::connect(url, &RawScripts::load(&raw).await).await;
            for _ in 0..WARM_UP + cycles {
                scripts
                    .cycle(
                        "bench:instructions:raw",
                        "redisson_lock__channel:{bench:instructions:raw}",
                        "raw:1",
                    )
                    .await;
            }
        }
        None if subject == FLOOR_REDIS_RS => {
            let raw = raw_client(url).await;
            let acquire: String = raw.script_load(MINIMAL_ACQUIRE).await.expect("load");
            let release: String = raw.script_load(MINIMAL_RELEASE).await.expect("load");
            let mut connection = redis::Client::open(url)
                .expect("redis-rs url")
                .get_multiplexed_async_connection()
                .await
                .expect("redis-rs connects");
            let name = "bench:instructions:floor";
            let channel = "redisson_lock__channel:{bench:instructions:floor}";
            let field = "00000000-0000-0000-0000-000000000000:1";
            // Built once, as the fred floor's arguments are.
            let mut acquire_call = redis::cmd("EVALSHA");
            acquire_call
                .arg(&acquire)
                .arg(1)
                .arg(name)
                .arg("30000")
                .arg(field);
            let mut release_call = redis::cmd("EVALSHA");
            release_call
                .arg(&release)
                .arg(2)
                .arg(name)
                .arg(channel)
                .arg("0")
                .arg("30000")
                .arg(field);
            for _ in 0..WARM_UP + cycles {
                let _: Option<i64> = acquire_call
                    .query_async(&mut connection)
                    .await
                    .expect("floor acquire");
                let _: Option<i64> = release_call
                    .query_async(&mut connection)
                    .await
                    .expect("floor release");
            }
        }
        None => {
            let raw = raw_client(url).await;
            let scripts = RawScripts::load(&raw).await;
            for _ in 0..WARM_UP + cycles {
                scripts
                    .cycle(
                        &raw,
                        "bench:instructions:raw",
                        "redisson_lock__channel:{bench:instructions:raw}",
                        "raw:1",
                    )
                    .await;
            }
        }
    }
    client.shutdown().await;
}

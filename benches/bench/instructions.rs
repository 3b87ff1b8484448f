//! Scenario 8: client instructions per uncontended lock+unlock, counted by valgrind's callgrind,
//! which counts instructions rather than time: exact and repeatable on a noisy machine.
//!
//! The benchmark runs itself as a child under `valgrind --tool=callgrind` twice per subject, for
//! 200 and for 600 cycles after a warm-up, on a current-thread runtime; the difference divided by
//! 400 is the marginal cost of one cycle, free of start-up and shutdown. Subjects: the reentrant,
//! fenced and spin locks, and the floor, our acquire and release scripts as two raw EVALSHAs
//! through fred.

use std::process::Command;

use crate::scenarios::{lock_cycle, raw_client, RawScripts};
use crate::Row;

/// The flag that makes the benchmark a child: `--instructions-child <subject> <cycles> <url>`.
pub const CHILD_FLAG: &str = "--instructions-child";

const SUBJECTS: [&str; 4] = [
    "fredlock",
    "fredlock fenced",
    "fredlock spin",
    "raw EVALSHA x2",
];
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
    let raw = per_cycle
        .iter()
        .find(|(subject, _)| *subject == "raw EVALSHA x2")
        .map(|(_, marginal)| *marginal);
    if let Some(raw) = raw {
        for (subject, marginal) in &per_cycle {
            if *subject != "raw EVALSHA x2" {
                rows.push(Row::ratio(
                    "8 instructions",
                    &format!("{subject} / raw"),
                    marginal / raw,
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
    let client = fredlock::LockClient::connect(url).await.expect("connect");
    let lock = match subject {
        "fredlock" => Some(client.lock("bench:instructions")),
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

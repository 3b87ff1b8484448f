//! Every example runs to success as a new user runs it (issue 42, point 4): each program of
//! `examples/` that `cargo test` built, with `REDIS_URL` unset so that it starts its own
//! throw-away servers, exits with status 0 within its bound (every example of
//! `examples/Cargo.toml`, by its entry there); the failover examples (`sentinel`, `redlock`)
//! three times each. `metrics` serves until Ctrl-C: `tests/metrics_http.rs` runs its
//! exporter. `fencing` gets a throw-away PostgreSQL in `DATABASE_URL`.

mod common;

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The example `name` as `cargo test` built it: `target/<profile>/examples/<name>`, beside this
/// test's own `deps` folder.
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary");
    let profile = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps");
    let path = profile.join("examples").join(name);
    assert!(
        path.exists(),
        "{} is not built: run the tests as README says (`cargo test --all-features`), which \
         builds the examples",
        path.display()
    );
    path
}

/// Runs the example `name` `times` times at once (each with servers of its own) with `env`
/// set, each run in a process group of its own killed (with the servers it started) should it
/// outlive `limit`; every run must succeed.
fn runs_to_success(name: &str, times: u32, limit: Duration, env: &[(&str, String)]) {
    let runs: Vec<_> = (1..=times)
        .map(|run| {
            let (name, env) = (name.to_owned(), env.to_vec());
            let env: Vec<(String, String)> = env
                .into_iter()
                .map(|(key, value)| (key.to_owned(), value))
                .collect();
            std::thread::spawn(move || runs_once(&name, run, times, limit, &env))
        })
        .collect();
    for run in runs {
        if let Err(panic) = run.join() {
            std::panic::resume_unwind(panic);
        }
    }
}

/// Runs the example `name` once (run `run` of `times`); see [`runs_to_success`].
fn runs_once(name: &str, run: u32, times: u32, limit: Duration, env: &[(String, String)]) {
    let path = example(name);
    let started = Instant::now();
    let child = Command::new(&path)
        .env_remove("REDIS_URL")
        .env_remove("REDIS_SENTINELS")
        .env_remove("REDLOCK_URLS")
        .envs(env.iter().map(|(key, value)| (key, value)))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap_or_else(|error| panic!("{name}: {error}"));
    let pid = child.id() as i32;
    let (done, finished) = std::sync::mpsc::channel();
    let watchdog = std::thread::spawn(move || {
        if finished.recv_timeout(limit).is_err() {
            // SAFETY: kill(2) with a negative pid signals the child's process group, which
            // it leads (process_group(0)); it touches no memory.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
    });
    let output = child.wait_with_output().expect("wait for the example");
    let _ = done.send(());
    watchdog.join().unwrap();
    let took = started.elapsed();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{name}, run {run} of {times}: {} after {took:?}\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        output.status
    );
    println!("{name}, run {run}: ok in {took:.1?}");
}

macro_rules! examples {
    ($($name:ident: $times:literal within $secs:literal),* $(,)?) => {$(
        #[test]
        fn $name() {
            runs_to_success(stringify!($name), $times, Duration::from_secs($secs), &[]);
        }
    )*};
}

examples!(
    redlock: 3 within 60,
    sentinel: 3 within 90,
);

/// The examples run by a test of their own: above, `fencing` below (it needs PostgreSQL), and
/// `metrics` (it serves until Ctrl-C: `tests/metrics_http.rs` runs its exporter).
const RUN_APART: [&str; 4] = ["redlock", "sentinel", "fencing", "metrics"];

/// Every other example of `examples/Cargo.toml` (a new primitive's needs no entry here) runs
/// to success once within 60 s, one after another.
#[test]
fn every_other_example_runs() {
    let manifest = include_str!("../examples/Cargo.toml");
    let mut ran = Vec::new();
    for entry in manifest.split("[[example]]").skip(1) {
        let name = entry
            .lines()
            .find_map(|line| line.trim().strip_prefix("name = "))
            .map(|name| name.trim_matches('"'))
            .expect("every [[example]] has a name");
        if !RUN_APART.contains(&name) {
            runs_to_success(name, 1, Duration::from_secs(60), &[]);
            ran.push(name);
        }
    }
    assert!(ran.len() >= 10, "ran {ran:?}");
}

#[test]
fn fencing() {
    let postgres = common::PostgresServer::start();
    runs_to_success(
        "fencing",
        1,
        Duration::from_secs(60),
        &[("DATABASE_URL", postgres.conninfo())],
    );
}

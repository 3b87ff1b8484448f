//! README.md's Rust snippets: each is one file of `tests/readme/`, word for word (checked
//! below), compiled here and run against throw-away servers, so a snippet that fails as
//! written (waits for ever, asks its own task for a lock it holds) fails this suite. The
//! Sentinel snippets name addresses that are not on this machine: they are compiled, not run.

mod common;

use std::time::Duration;

use common::{bounded, clients, start_servers, urls, RedisServer};

mod first_look {
    include!("readme/first_look.rs");
    pub(super) async fn run(url: &str) -> fredlock::Result<()> {
        first_look(url).await
    }
}
mod once {
    include!("readme/once.rs");
    pub(super) async fn run(client: &LockClient, order: u64) -> fredlock::Result<bool> {
        charge_once(client, order).await
    }
}
mod shutdown {
    include!("readme/shutdown.rs");
    pub(super) async fn run(
        client: LockClient,
        stop: impl Future<Output = ()>,
    ) -> fredlock::Result<()> {
        serve(client, stop).await
    }
}
mod fencing {
    include!("readme/fencing.rs");
    pub(super) async fn run(client: &LockClient) -> fredlock::Result<(u64, String)> {
        fencing(client).await
    }
}
mod read_write {
    include!("readme/read_write.rs");
    pub(super) async fn run(client: &LockClient) -> fredlock::Result<()> {
        read_write(client).await
    }
}
mod counters {
    include!("readme/counters.rs");
    pub(super) async fn run(client: &LockClient) -> fredlock::Result<()> {
        counters(client).await
    }
}
mod leader {
    include!("readme/leader.rs");
    pub(super) async fn run(client: &LockClient) -> fredlock::Result<u64> {
        leader(client).await
    }
}
mod job {
    include!("readme/job.rs");
    pub(super) async fn run(client: &LockClient) -> fredlock::Result<u64> {
        job(client).await
    }
}
#[cfg(feature = "blocking")]
mod blocking {
    include!("readme/blocking.rs");
    pub(super) fn run(url: &str) -> fredlock::Result<()> {
        blocking(url)
    }
}
#[cfg(feature = "tower")]
mod axum_layer {
    include!("readme/axum.rs");
    pub(super) fn router(client: LockClient) -> Router {
        app(client)
    }
}
#[cfg(feature = "redis-rs")]
mod redis_rs {
    include!("readme/redis_rs.rs");
    pub(super) async fn run(url: &str) -> fredlock::Result<LockClient> {
        on_redis_rs(url).await
    }
}
mod composites {
    include!("readme/composites.rs");
    pub(super) async fn run(masters: Vec<LockClient>, client: &LockClient) -> fredlock::Result<()> {
        composites(masters, client).await
    }
}
mod events {
    include!("readme/events.rs");
    pub(super) async fn run(client: &LockClient) -> fredlock::Result<Vec<LockEventKind>> {
        events(client).await
    }
}
#[cfg(feature = "tower")]
mod limit {
    include!("readme/limit.rs");
    pub(super) async fn run(client: &LockClient, name: &str) -> Result<String, BoxError> {
        export(client, name).await
    }
}
#[allow(dead_code)]
mod sentinel {
    include!("readme/sentinel.rs");
}
#[allow(dead_code)]
mod replica_sync {
    include!("readme/replica_sync.rs");
}

/// A snippet file of `tests/readme/`: its name and its text.
type Snippet = (&'static str, &'static str);

/// Each document and the snippet files it shows, in order: README.md and the guide's pages.
const DOCUMENTS: [(&str, &str, &[Snippet]); 11] = [
    (
        "README.md",
        include_str!("../README.md"),
        &[("first_look", include_str!("readme/first_look.rs"))],
    ),
    (
        "docs/guide/locks.md",
        include_str!("../docs/guide/locks.md"),
        &[
            ("once", include_str!("readme/once.rs")),
            ("fencing", include_str!("readme/fencing.rs")),
            ("read_write", include_str!("readme/read_write.rs")),
            ("composites", include_str!("readme/composites.rs")),
        ],
    ),
    (
        "docs/guide/semaphores.md",
        include_str!("../docs/guide/semaphores.md"),
        &[("counters", include_str!("readme/counters.rs"))],
    ),
    (
        "docs/guide/leader-election.md",
        include_str!("../docs/guide/leader-election.md"),
        &[("leader", include_str!("readme/leader.rs"))],
    ),
    (
        "docs/guide/scheduled-jobs.md",
        include_str!("../docs/guide/scheduled-jobs.md"),
        &[("job", include_str!("readme/job.rs"))],
    ),
    (
        "docs/guide/tower.md",
        include_str!("../docs/guide/tower.md"),
        &[
            ("axum", include_str!("readme/axum.rs")),
            ("limit", include_str!("readme/limit.rs")),
        ],
    ),
    (
        "docs/guide/events.md",
        include_str!("../docs/guide/events.md"),
        &[("events", include_str!("readme/events.rs"))],
    ),
    (
        "docs/guide/blocking.md",
        include_str!("../docs/guide/blocking.md"),
        &[("blocking", include_str!("readme/blocking.rs"))],
    ),
    (
        "docs/guide/redis-rs.md",
        include_str!("../docs/guide/redis-rs.md"),
        &[("redis_rs", include_str!("readme/redis_rs.rs"))],
    ),
    (
        "docs/guide/deployments.md",
        include_str!("../docs/guide/deployments.md"),
        &[
            ("sentinel", include_str!("readme/sentinel.rs")),
            ("replica_sync", include_str!("readme/replica_sync.rs")),
        ],
    ),
    (
        "docs/guide/operations.md",
        include_str!("../docs/guide/operations.md"),
        &[("shutdown", include_str!("readme/shutdown.rs"))],
    ),
];

/// Every ```rust block of a Markdown document, in order.
fn rust_blocks(document: &str, text: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut block: Option<String> = None;
    for line in text.lines() {
        match &mut block {
            None if line.trim_start().starts_with("```rust") => block = Some(String::new()),
            Some(text) if line.trim_start() == "```" => {
                blocks.push(std::mem::take(text));
                block = None;
            }
            Some(text) => {
                text.push_str(line);
                text.push('\n');
            }
            None => {}
        }
    }
    assert!(block.is_none(), "{document} ends inside a ```rust block");
    blocks
}

#[test]
fn readme_and_the_guide_show_exactly_the_snippets_tested_here() {
    for (document, text, snippets) in DOCUMENTS {
        let blocks = rust_blocks(document, text);
        let names: Vec<&str> = snippets.iter().map(|(name, _)| *name).collect();
        assert_eq!(
            blocks.len(),
            snippets.len(),
            "{document} has {} ```rust blocks; tests/readme/ has {names:?} for it",
            blocks.len()
        );
        for (block, (name, snippet)) in blocks.iter().zip(snippets) {
            assert_eq!(
                block, snippet,
                "{document}'s block in the place of tests/readme/{name}.rs differs from it"
            );
        }
    }
}

/// Every page of the guide is one of DOCUMENTS (or has no Rust in it), is linked from README.md
/// and from the guide's index, and is a doc test of the crate (src/lib.rs), so that none is
/// left out of the checks above or out of reach.
#[test]
fn every_guide_page_is_checked_and_linked() {
    let readme = include_str!("../README.md");
    let index = include_str!("../docs/guide/README.md");
    let lib = include_str!("../src/lib.rs");
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/guide");
    let mut pages = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let file = entry.unwrap().file_name().into_string().unwrap();
        if file == "README.md" || !file.ends_with(".md") {
            continue;
        }
        pages += 1;
        let path = format!("docs/guide/{file}");
        let text = std::fs::read_to_string(format!("{dir}/{file}")).unwrap();
        let listed = DOCUMENTS.iter().any(|(document, ..)| *document == path);
        assert!(
            listed || rust_blocks(&path, &text).is_empty(),
            "{path} has Rust blocks that tests/readme.rs does not check"
        );
        assert!(
            readme.contains(&format!("]({path})")),
            "README.md does not link {path}"
        );
        assert!(
            index.contains(&format!("]({file})")),
            "the guide's index does not link {file}"
        );
        assert!(
            lib.contains(&format!("../docs/guide/{file}")),
            "src/lib.rs does not include {path}"
        );
    }
    assert!(pages >= 12, "only {pages} guide pages found");
}

/// README says each test binary runs four tests at a time unless the environment says
/// otherwise: cargo hands the test binaries `.cargo/config.toml`'s RUST_TEST_THREADS.
#[test]
fn the_tests_run_four_at_a_time() {
    let config =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/.cargo/config.toml"))
            .unwrap();
    assert!(
        config.contains("[env]\nRUST_TEST_THREADS = \"4\"\n"),
        ".cargo/config.toml sets no RUST_TEST_THREADS of 4"
    );
    assert!(
        std::env::var("RUST_TEST_THREADS").is_ok(),
        "cargo ran this test without RUST_TEST_THREADS"
    );
}

#[tokio::test]
async fn the_snippets_run_as_written() {
    bounded(async {
        let server = RedisServer::start();
        let client = server.lock_client(Duration::from_secs(10)).await;

        first_look::run(&server.url()).await.unwrap();
        #[cfg(feature = "redis-rs")]
        {
            let on_redis_rs = redis_rs::run(&server.url()).await.unwrap();
            assert!(on_redis_rs.redis().is_none(), "the client is on redis-rs");
            let held = on_redis_rs.lock("readme:redis-rs").lock().await.unwrap();
            let other = client.lock("readme:redis-rs");
            assert!(other.try_lock_now().await.unwrap().is_none());
            held.unlock().await.unwrap();
            on_redis_rs.shutdown().await;
        }
        let (token, written) = fencing::run(&client).await.unwrap();
        assert!(token > 0);
        assert_eq!(written, "OK");
        read_write::run(&client).await.unwrap();
        counters::run(&client).await.unwrap();
        let told = events::run(&client).await.unwrap();
        assert_eq!(
            told,
            [
                fredlock::events::LockEventKind::Acquired,
                fredlock::events::LockEventKind::Released
            ]
        );
        assert!(leader::run(&client).await.unwrap() > 0);
        assert_eq!(job::run(&client).await.unwrap(), 42);
        assert!(once::run(&client, 1001).await.unwrap());
        // Held by another owner past the wait: not charged here.
        let holder = client.lock("orders:1002").lock().await.unwrap();
        let started = std::time::Instant::now();
        assert!(!tokio::spawn({
            let client = client.clone();
            async move { once::run(&client, 1002).await.unwrap() }
        })
        .await
        .unwrap());
        assert!(started.elapsed() >= Duration::from_secs(5));
        holder.unlock().await.unwrap();
        // Shut down while holding: a waiting instance takes the lock at once.
        let other = server.lock_client(Duration::from_secs(10)).await;
        let stop = async { tokio::time::sleep(Duration::from_millis(600)).await };
        let serving = tokio::spawn(shutdown::run(
            server.lock_client(Duration::from_secs(10)).await,
            stop,
        ));
        let lock = other.lock("exports:daily");
        assert!(
            common::eventually(Duration::from_secs(2), || {
                let lock = lock.clone();
                async move { lock.is_locked().await.unwrap() }
            })
            .await,
            "served"
        );
        let waiting = tokio::spawn(async move { lock.lock().await });
        serving.await.unwrap().unwrap();
        let taken = tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .expect("taken at once after the shutdown, not a lease later")
            .unwrap()
            .unwrap();
        taken.unlock().await.unwrap();
        other.shutdown().await;

        let masters = start_servers(5);
        composites::run(clients(&urls(&masters)).await, &client)
            .await
            .unwrap();
        client.shutdown().await;
    })
    .await;
}

/// The blocking snippet, from a plain thread (feature `blocking`; README marks it `ignore` for
/// doc-tests, which a build without the feature also compiles).
#[cfg(feature = "blocking")]
#[test]
fn the_blocking_snippet_runs_as_written() {
    let server = RedisServer::start();
    let url = server.url();
    let (done, ran) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(blocking::run(&url));
    });
    ran.recv_timeout(Duration::from_secs(30))
        .expect("ended in time")
        .unwrap();
}

/// The axum snippet's router serves a charge under its account's lock (feature `tower`).
#[cfg(feature = "tower")]
#[tokio::test]
async fn the_axum_snippet_serves_under_the_lock() {
    use tower::ServiceExt;
    bounded(async {
        let server = RedisServer::start();
        let client = server.lock_client(Duration::from_secs(30)).await;
        let request = axum::http::Request::post("/accounts/7/charge")
            .body(axum::body::Body::empty())
            .unwrap();
        let response = axum_layer::router(client.clone())
            .oneshot(request)
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        assert!(!client.lock("account:7").is_locked().await.unwrap());
        client.shutdown().await;
    })
    .await;
}

/// The limit snippet exports under the fleet-wide limit, and a request that finds no permit
/// within its wait is told busy (feature `tower`).
#[cfg(feature = "tower")]
#[tokio::test]
async fn the_limit_snippet_runs_under_the_limit() {
    bounded(async {
        let server = RedisServer::start();
        let client = server.lock_client(Duration::from_secs(30)).await;
        assert_eq!(
            limit::run(&client, "report-7").await.unwrap(),
            "exported report-7"
        );
        // Every permit taken elsewhere: the snippet's request waits its 2 s and is told busy.
        let exports = client.permit_semaphore("exports");
        let mut taken = Vec::new();
        for _ in 0..4 {
            taken.push(exports.acquire().await.unwrap());
        }
        assert_eq!(
            limit::run(&client, "report-8").await.unwrap(),
            "busy: try again later"
        );
        drop(taken);
        client.shutdown().await;
    })
    .await;
}

/// BENCHMARKS.md's current table is what `tools/bench-table` makes of the run it names
/// (benches/results/current.json, with the day and commit its opening line gives): the table
/// is never edited by hand, and the next run replaces it in one command. Needs python3, which
/// CI has (it installs Valkey from PyPI with it).
#[test]
fn the_current_benchmark_table_is_what_tools_bench_table_makes() {
    const BEGIN: &str = "<!-- current run: begin";
    const END: &str = "<!-- current run: end -->";
    let doc = include_str!("../BENCHMARKS.md");
    let start = doc
        .find(BEGIN)
        .expect("BENCHMARKS.md has the current run's begin marker");
    let end = doc
        .find(END)
        .expect("BENCHMARKS.md has the current run's end marker")
        + END.len();
    let section = &doc[start..end];
    let opening = section
        .lines()
        .find(|line| line.starts_with("One full run of"))
        .expect("the current run says what it ran");
    let (_, after_on) = opening.split_once("` on ").expect("the run's day");
    let (date, after_date) = after_on.split_once(", commit ").expect("the run's commit");
    let (commit, _) = after_date
        .split_once(": ")
        .expect("the machine after the commit");
    let root = env!("CARGO_MANIFEST_DIR");
    let mut child = std::process::Command::new("python3")
        .current_dir(root)
        .args([
            "tools/bench-table",
            "benches/results/current.json",
            "--print",
        ])
        .args(["--date", date, "--commit", commit])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs tools/bench-table");
    let started = std::time::Instant::now();
    while child
        .try_wait()
        .expect("wait for tools/bench-table")
        .is_none()
    {
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("tools/bench-table ran for over a minute");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let made = child.wait_with_output().expect("its output");
    assert!(made.status.success(), "tools/bench-table failed");
    let made = String::from_utf8(made.stdout).expect("text");
    assert_eq!(
        made.trim_end(),
        section,
        "BENCHMARKS.md's current run is not what tools/bench-table makes of \
         benches/results/current.json: run it again rather than editing the table"
    );
}

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
#[allow(dead_code)]
mod sentinel {
    include!("readme/sentinel.rs");
}
#[allow(dead_code)]
mod replica_sync {
    include!("readme/replica_sync.rs");
}

/// The snippet files, in the order README.md shows them.
const SNIPPETS: [(&str, &str); 14] = [
    ("first_look", include_str!("readme/first_look.rs")),
    ("once", include_str!("readme/once.rs")),
    ("leader", include_str!("readme/leader.rs")),
    ("job", include_str!("readme/job.rs")),
    ("axum", include_str!("readme/axum.rs")),
    ("shutdown", include_str!("readme/shutdown.rs")),
    ("fencing", include_str!("readme/fencing.rs")),
    ("read_write", include_str!("readme/read_write.rs")),
    ("counters", include_str!("readme/counters.rs")),
    ("blocking", include_str!("readme/blocking.rs")),
    ("composites", include_str!("readme/composites.rs")),
    ("sentinel", include_str!("readme/sentinel.rs")),
    ("replica_sync", include_str!("readme/replica_sync.rs")),
    ("redis_rs", include_str!("readme/redis_rs.rs")),
];

/// Every ```rust block of README.md, in order.
fn readme_blocks() -> Vec<String> {
    let readme = include_str!("../README.md");
    let mut blocks = Vec::new();
    let mut block: Option<String> = None;
    for line in readme.lines() {
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
    assert!(block.is_none(), "README.md ends inside a ```rust block");
    blocks
}

#[test]
fn readme_shows_exactly_the_snippets_tested_here() {
    let blocks = readme_blocks();
    let names: Vec<&str> = SNIPPETS.iter().map(|(name, _)| *name).collect();
    assert_eq!(
        blocks.len(),
        SNIPPETS.len(),
        "README.md has {} ```rust blocks; tests/readme/ has {names:?}",
        blocks.len()
    );
    for (block, (name, text)) in blocks.iter().zip(SNIPPETS) {
        assert_eq!(
            block, text,
            "README.md's block in the place of tests/readme/{name}.rs differs from it"
        );
    }
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

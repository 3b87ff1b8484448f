//! fredlock's metrics for Prometheus: a small axum service that serves `/metrics` while a few
//! tasks contend for locks.
//!
//! ```text
//! cargo run --example metrics --features metrics
//! curl http://127.0.0.1:9464/metrics
//! ```
//!
//! Uses the Redis at `REDIS_URL` when it is set; otherwise starts a throw-away `redis-server`
//! (which must be on PATH) on a free loopback port and stops it at the end. `METRICS_ADDR`
//! changes where `/metrics` is served (default `127.0.0.1:9464`). Runs until Ctrl-C.
//!
//! In your own service: install the recorder first, build the `LockClient` with the
//! `metrics` feature on, and serve `render()` wherever your metrics go.

use std::time::Duration;

use axum::routing::get;
use axum::Router;
use fredlock::LockClient;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

mod throwaway;

/// Buckets of the lock-wait histogram, in seconds: from an uncontended round trip to a long
/// queue.
const WAIT_BUCKETS: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
];

/// Installs the Prometheus recorder for the whole process (once: a second call fails).
pub fn install_recorder() -> Result<PrometheusHandle, Box<dyn std::error::Error>> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full(fredlock::metrics::WAIT.to_owned()),
            &WAIT_BUCKETS,
        )?
        .install_recorder()?;
    Ok(handle)
}

/// The service: `GET /metrics` in Prometheus's text format.
pub fn router(prometheus: PrometheusHandle) -> Router {
    Router::new().route(
        "/metrics",
        get(move || {
            let prometheus = prometheus.clone();
            async move { prometheus.render() }
        }),
    )
}

/// One round of work: `workers` tasks take turns on one lock, and one `try_lock` gives up on
/// a lock held for longer than it waits.
pub async fn workload(client: &LockClient, workers: usize) -> fredlock::Result<()> {
    let mut tasks = Vec::new();
    for _ in 0..workers {
        let lock = client.lock("metrics-example:report");
        tasks.push(tokio::spawn(async move {
            let guard = lock.lock().await?;
            tokio::time::sleep(Duration::from_millis(5)).await;
            guard.unlock().await
        }));
    }
    for task in tasks {
        task.await.expect("worker panicked")?;
    }
    let busy = client.lock("metrics-example:busy");
    let held = busy.lock().await?;
    let contender = busy.clone();
    let gave_up = tokio::spawn(async move {
        contender
            .try_lock(Duration::from_millis(20), None)
            .await
            .map(|guard| guard.is_none())
    });
    let gave_up = gave_up.await.expect("contender panicked")?;
    held.unlock().await?;
    assert!(gave_up, "the lock was held throughout");
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let prometheus = install_recorder()?;
    let (_server, url) = throwaway::redis_url()?;
    let client = LockClient::connect(&url).await?;

    let addr = std::env::var("METRICS_ADDR").unwrap_or_else(|_| "127.0.0.1:9464".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("serving http://{}/metrics", listener.local_addr()?);
    let server = tokio::spawn(async move { axum::serve(listener, router(prometheus)).await });

    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            round = workload(&client, 4) => round?,
        }
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
    server.abort();
    client.shutdown().await;
    Ok(())
}

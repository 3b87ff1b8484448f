//! The Prometheus exporter of `examples/metrics.rs`, scraped over real HTTP on loopback after
//! the example's workload.

mod common;

#[allow(dead_code)]
#[path = "../examples/metrics.rs"]
mod example;

use common::{bounded, RedisServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `GET path` on `addr` over HTTP/1.1: the status line and the body.
async fn get(addr: std::net::SocketAddr, path: &str) -> (String, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    (
        head.lines().next().unwrap_or_default().to_owned(),
        body.to_owned(),
    )
}

/// The value of the sample line `metric{labels..}` that has every label in `labels`.
fn sample(body: &str, metric: &str, labels: &[&str]) -> Option<f64> {
    body.lines()
        .filter(|line| !line.starts_with('#'))
        .filter(|line| {
            line.starts_with(&format!("{metric}{{")) || line.starts_with(&format!("{metric} "))
        })
        .filter(|line| labels.iter().all(|label| line.contains(label)))
        .find_map(|line| line.rsplit(' ').next()?.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_example_serves_the_counters_of_its_workload() {
    let server = RedisServer::start();
    bounded(async {
        let prometheus = example::install_recorder().unwrap();
        let client = common::connect(&server.url()).await.unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let http =
            tokio::spawn(async move { axum::serve(listener, example::router(prometheus)).await });

        for _ in 0..3 {
            example::workload(&client, 4).await.unwrap();
        }

        let (status, body) = get(addr, "/metrics").await;
        assert_eq!(status, "HTTP/1.1 200 OK", "{body}");
        let kind = "kind=\"lock\"";
        // Per round: 4 workers and the holder of the busy lock acquire.
        assert_eq!(
            sample(&body, fredlock::metrics::ACQUISITIONS, &[kind]),
            Some(15.0),
            "{body}"
        );
        assert_eq!(
            sample(&body, fredlock::metrics::TIMEOUTS, &[kind]),
            Some(3.0),
            "{body}"
        );
        // Workers queue behind each other: some acquisitions were hand-offs.
        let handoffs = sample(&body, fredlock::metrics::HANDOFFS, &[kind]).unwrap_or(0.0);
        assert!(handoffs >= 1.0, "{body}");
        assert_eq!(
            sample(&body, fredlock::metrics::HELD, &[kind]),
            Some(0.0),
            "{body}"
        );
        assert_eq!(
            sample(&body, fredlock::metrics::WAITING, &[kind]),
            Some(0.0),
            "{body}"
        );
        // The wait histogram, in the example's buckets, by outcome.
        let count = format!("{}_count", fredlock::metrics::WAIT);
        assert_eq!(
            sample(&body, &count, &[kind, "outcome=\"acquired\""]),
            Some(15.0),
            "{body}"
        );
        assert_eq!(
            sample(&body, &count, &[kind, "outcome=\"timed_out\""]),
            Some(3.0),
            "{body}"
        );
        let bucket = format!("{}_bucket", fredlock::metrics::WAIT);
        assert!(
            sample(&body, &bucket, &["le=\"0.0005\""]).is_some(),
            "{body}"
        );
        // Names are not labels unless asked for.
        assert!(!body.contains("metrics-example:report"), "{body}");

        let (status, _) = get(addr, "/nothing").await;
        assert!(status.starts_with("HTTP/1.1 404"), "{status}");
        http.abort();
        client.shutdown().await;
    })
    .await;
}

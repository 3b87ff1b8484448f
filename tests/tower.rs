//! The tower layer (feature `tower`) behind a real axum server on loopback, driven by a real
//! HTTP/1.1 client over TCP: requests with the same key never overlap, different keys run in
//! parallel, a request that waits too long gets `423 Locked`, a client that goes away leaves no
//! lock behind, and a cancelled call gives its lock back at once.

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::error_handling::HandleErrorLayer;
use axum::extract::Path;
use axum::http::{Request, StatusCode};
use axum::routing::get;
use axum::{BoxError, Router};
use common::{bounded, eventually, RedisServer};
use fredlock::prelude::*;
use fredlock::tower::{LockLayer, Locked};
use fredlock::LockClient;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tower::{Service, ServiceBuilder, ServiceExt};

/// When each request's handler ran, by key: (key, start, end).
type Runs = Arc<Mutex<Vec<(String, Instant, Instant)>>>;

/// The key of `/work/<key>/<ms>`; other paths take no lock.
fn key_of(request: &Request<axum::body::Body>) -> Option<String> {
    let mut parts = request.uri().path().strip_prefix("/work/")?.split('/');
    parts.next().map(|key| format!("req:{key}"))
}

/// An axum server on a free loopback port whose `/work/<key>/<ms>` handler runs `ms` under the
/// key's lock (waiting at most `wait`), recording when it ran; `423` for a request whose wait
/// ran out.
async fn serve(
    client: LockClient,
    wait: Duration,
    runs: Runs,
) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let handler = move |Path((key, ms)): Path<(String, u64)>| {
        let runs = runs.clone();
        async move {
            let start = Instant::now();
            tokio::time::sleep(Duration::from_millis(ms)).await;
            runs.lock().unwrap().push((key, start, Instant::now()));
            "done"
        }
    };
    let app = Router::new().route("/work/{key}/{ms}", get(handler)).layer(
        ServiceBuilder::new()
            .layer(HandleErrorLayer::new(|error: BoxError| async move {
                if error.is::<Locked>() {
                    (StatusCode::LOCKED, error.to_string())
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, error.to_string())
                }
            }))
            .layer(LockLayer::new(client, key_of).wait(wait)),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (addr, server)
}

/// A GET over a connection of its own: the response's status.
async fn status_of(addr: SocketAddr, path: &str) -> u16 {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {response:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn same_keys_take_turns_and_different_keys_run_together() {
    bounded(async {
        let server = RedisServer::start();
        // Two instances of the service, each with its own client, as two pods would be.
        let runs: Runs = Arc::default();
        let (first, first_server) = serve(
            server.lock_client(Duration::from_secs(30)).await,
            Duration::from_secs(10),
            runs.clone(),
        )
        .await;
        let (second, second_server) = serve(
            server.lock_client(Duration::from_secs(30)).await,
            Duration::from_secs(10),
            runs.clone(),
        )
        .await;

        let requests: Vec<_> = (0..6)
            .map(|n| {
                let addr = if n % 2 == 0 { first } else { second };
                tokio::spawn(async move { status_of(addr, "/work/account-1/100").await })
            })
            .collect();
        for request in requests {
            assert_eq!(request.await.unwrap(), 200);
        }
        let mut same: Vec<(Instant, Instant)> = runs
            .lock()
            .unwrap()
            .iter()
            .filter(|(key, _, _)| key == "account-1")
            .map(|(_, start, end)| (*start, *end))
            .collect();
        same.sort();
        assert_eq!(same.len(), 6);
        for pair in same.windows(2) {
            assert!(
                pair[1].0 >= pair[0].1,
                "two requests for one key overlapped: {pair:?}"
            );
        }

        // Different keys, on both instances at once: they run side by side.
        let started = Instant::now();
        let parallel: Vec<_> = ["a", "b", "c", "d"]
            .iter()
            .enumerate()
            .map(|(n, key)| {
                let addr = if n % 2 == 0 { first } else { second };
                let path = format!("/work/{key}/300");
                tokio::spawn(async move { status_of(addr, &path).await })
            })
            .collect();
        for request in parallel {
            assert_eq!(request.await.unwrap(), 200);
        }
        // Side by side: every run started before any ended (one instance serialising its two
        // keys would start its second run after its first ended).
        let spans: Vec<(Instant, Instant)> = runs
            .lock()
            .unwrap()
            .iter()
            .filter(|(key, start, _)| {
                ["a", "b", "c", "d"].contains(&key.as_str()) && *start >= started
            })
            .map(|(_, start, end)| (*start, *end))
            .collect();
        assert_eq!(spans.len(), 4, "{spans:?}");
        let last_start = spans.iter().map(|(start, _)| *start).max().unwrap();
        let first_end = spans.iter().map(|(_, end)| *end).min().unwrap();
        assert!(
            last_start < first_end,
            "different keys were serialised: {spans:?}"
        );

        // A path without a key takes no lock: the router's own 404, at once.
        assert_eq!(status_of(first, "/elsewhere").await, 404);
        first_server.abort();
        second_server.abort();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_that_waits_too_long_gets_423_and_a_gone_client_leaves_no_lock() {
    bounded(async {
        let server = RedisServer::start();
        let client = server.lock_client(Duration::from_secs(30)).await;
        let runs: Runs = Arc::default();
        let (addr, http) = serve(client.clone(), Duration::from_millis(150), runs.clone()).await;

        let long = tokio::spawn(async move { status_of(addr, "/work/busy/800").await });
        assert!(
            eventually(Duration::from_secs(2), || async {
                client.lock("req:busy").is_locked().await.unwrap()
            })
            .await
        );
        let asked = Instant::now();
        assert_eq!(status_of(addr, "/work/busy/10").await, 423);
        let waited = asked.elapsed();
        assert!(
            waited >= Duration::from_millis(150) && waited < Duration::from_millis(700),
            "{waited:?}"
        );
        assert_eq!(long.await.unwrap(), 200);

        // A client that sends its request and goes away: the lock is given back (when the
        // server drops the request, or at the latest when the handler ends), never left held.
        let mut gone = TcpStream::connect(addr).await.unwrap();
        gone.write_all(b"GET /work/gone/500 HTTP/1.1\r\nHost: test\r\n\r\n")
            .await
            .unwrap();
        assert!(
            eventually(Duration::from_secs(2), || async {
                client.lock("req:gone").is_locked().await.unwrap()
            })
            .await
        );
        drop(gone);
        assert!(
            eventually(Duration::from_secs(3), || async {
                !client.lock("req:gone").is_locked().await.unwrap()
            })
            .await,
            "the lock of a request whose client went away was left held"
        );
        assert_eq!(status_of(addr, "/work/gone/10").await, 200);
        http.abort();
        client.shutdown().await;
    })
    .await;
}

/// A call dropped mid-way (the server cancelled the request) gives its lock back at once, not
/// when the work would have ended or the lease run out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_call_gives_its_lock_back_at_once() {
    bounded(async {
        let server = RedisServer::start();
        let client = server.lock_client(Duration::from_secs(30)).await;
        let slow = tower::service_fn(|_: String| async {
            tokio::time::sleep(Duration::from_secs(30)).await;
            Ok::<_, std::convert::Infallible>("done")
        });
        let mut service = ServiceBuilder::new()
            .layer(LockLayer::new(client.clone(), |name: &String| {
                Some(name.clone())
            }))
            .service(slow);
        let mut call = Box::pin(
            service
                .ready()
                .await
                .unwrap()
                .call("tower:cancelled".to_owned()),
        );
        // The call takes its lock before the work runs: seen held while the call is polled.
        let held = tokio::select! {
            _ = &mut call => panic!("the 30 s work ended"),
            held = eventually(Duration::from_secs(2), || async {
                client.lock("tower:cancelled").is_locked().await.unwrap()
            }) => held,
        };
        assert!(held, "the call never took its lock");
        drop(call);
        let dropped = Instant::now();
        assert!(
            eventually(Duration::from_secs(2), || async {
                !client.lock("tower:cancelled").is_locked().await.unwrap()
            })
            .await
        );
        assert!(
            dropped.elapsed() < Duration::from_secs(1),
            "{:?}",
            dropped.elapsed()
        );
        client.shutdown().await;
    })
    .await;
}

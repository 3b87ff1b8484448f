//! An axum service whose charges run one at a time per account, across every instance on the
//! same Redis: `fredlock::tower::LockLayer` locks each `/accounts/<id>/charge` request by its
//! account before the handler runs, and a request that cannot get the lock within half a second gets
//! `423 Locked`. Requests for different accounts run in parallel.
//!
//! ```text
//! cargo run --example axum --features tower
//! ```
//!
//! It serves on a free loopback port, then plays a few clients against itself (two charges of
//! one account at once, one of another, one that gives up) and prints what each got. Uses the
//! Redis at `REDIS_URL` when it is set, otherwise a throw-away `redis-server` (which must be on
//! PATH).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::error_handling::HandleErrorLayer;
use axum::extract::Path;
use axum::http::{Request, StatusCode};
use axum::routing::post;
use axum::{BoxError, Router};
use fredlock::tower::{LockLayer, Locked};
use fredlock::LockClient;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tower::ServiceBuilder;

mod throwaway;

use throwaway::redis_url;

/// The lock of a charge: its account, from `/accounts/<id>/charge`. Other requests take none.
fn account_of(request: &Request<axum::body::Body>) -> Option<String> {
    let id = request
        .uri()
        .path()
        .strip_prefix("/accounts/")?
        .strip_suffix("/charge")?;
    Some(format!("account:{id}"))
}

/// The charge itself: here, 400 ms of work that must never run twice at once for one account.
async fn charge(Path(id): Path<String>) -> String {
    tokio::time::sleep(Duration::from_millis(400)).await;
    format!("charged account {id}")
}

/// What a request gets instead of a response when the layer fails it.
async fn refused(error: BoxError) -> (StatusCode, String) {
    if error.is::<Locked>() {
        (StatusCode::LOCKED, error.to_string())
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, error.to_string())
    }
}

/// One POST over a connection of its own: the status line, and how long it took.
async fn post_to(addr: SocketAddr, path: &str) -> std::io::Result<(String, Duration)> {
    let started = Instant::now();
    let mut stream = TcpStream::connect(addr).await?;
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: example\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let status = response.lines().next().unwrap_or_default().to_owned();
    Ok((status, started.elapsed()))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (_server, url) = redis_url()?;
    let client = LockClient::connect(&url).await?;
    let app = Router::new()
        .route("/accounts/{id}/charge", post(charge))
        .layer(
            ServiceBuilder::new()
                .layer(HandleErrorLayer::new(refused))
                .layer(
                    LockLayer::per_key(client.clone(), account_of).wait(Duration::from_millis(500)),
                ),
        );
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    println!("serving on http://{addr}");
    let serving = tokio::spawn(async move { axum::serve(listener, app).await });

    // Three charges of account 7 at once take turns: one runs, the next waits for it (400 ms),
    // the last gives up after half a second with 423. A charge of account 8 runs beside them.
    let requests = [
        "/accounts/7/charge",
        "/accounts/7/charge",
        "/accounts/8/charge",
        "/accounts/7/charge",
    ];
    let mut sent = Vec::new();
    for (n, path) in requests.into_iter().enumerate() {
        sent.push(tokio::spawn(post_to(addr, path)));
        if n == 2 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    for (path, request) in requests.iter().zip(sent) {
        let (status, took) = request.await??;
        println!("{path}: {status} after {} ms", took.as_millis());
    }

    serving.abort();
    client.shutdown().await;
    Ok(())
}

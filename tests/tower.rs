//! The tower layer (feature `tower`) behind a real axum server on loopback, driven by a real
//! HTTP/1.1 client over TCP: requests with the same key never overlap, different keys run in
//! parallel, a request that waits too long gets `423 Locked`, a client that goes away leaves no
//! lock behind, and a cancelled call gives its lock back at once. The fleet-wide concurrency
//! limit: three instances (processes of their own) never run more than N requests at once, as
//! Redis counts them, and a killed instance's permits come back within their lease.

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
use fred::interfaces::ClientLike;
use fredlock::tower::{ConcurrencyLimitLayer, LockLayer, Locked};
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
            .layer(LockLayer::per_key(client, key_of).wait(wait)),
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
            .layer(LockLayer::per_key(client.clone(), |name: &String| {
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

/// `LockLayer::new(client, name)`: every request takes the one lock `name`, whatever the
/// request, as `ConcurrencyLimitLayer::new(client, name, max)` counts every request against one
/// limit; a second request meanwhile waits, and here (wait zero) gets `Locked` naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_named_lock_serialises_every_request() {
    bounded(async {
        let server = RedisServer::start();
        let client = server.lock_client(Duration::from_secs(30)).await;
        let slow = tower::service_fn(|request: String| async move {
            tokio::time::sleep(Duration::from_millis(800)).await;
            Ok::<_, std::convert::Infallible>(request)
        });
        let service = ServiceBuilder::new()
            .layer(LockLayer::new(client.clone(), "tower:reports").wait(Duration::ZERO))
            .service(slow);
        let first = tokio::spawn(service.clone().oneshot("a".to_owned()));
        assert!(
            eventually(Duration::from_secs(2), || async {
                client.lock("tower:reports").is_locked().await.unwrap()
            })
            .await,
            "the first request never took the lock"
        );
        let refused = service.clone().oneshot("b".to_owned()).await.unwrap_err();
        let locked = refused.downcast_ref::<Locked>().expect("Locked");
        assert_eq!(locked.lock, "tower:reports");
        assert_eq!(first.await.unwrap().unwrap(), "a");
        assert_eq!(service.oneshot("c".to_owned()).await.unwrap(), "c");
        client.shutdown().await;
    })
    .await;
}

/// How many requests ran at once at most, across every instance: counted in Redis, outside the
/// processes under test (`limit:inflight` now, `limit:max` the most, `limit:done` in all).
const COUNT_IN: &str = "local n = redis.call('INCR', KEYS[1]) \
    if n > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], n) end \
    return n";

/// A service behind `ConcurrencyLimitLayer::new(client, "exports", 4)` whose requests count
/// themselves in and out in Redis (through `raw`) around `work`.
fn limited(
    client: LockClient,
    raw: fred::clients::Client,
    work: Option<Duration>,
) -> impl Service<u32, Response = (), Error = BoxError, Future: Send> + Clone + Send {
    ServiceBuilder::new()
        .layer(ConcurrencyLimitLayer::new(client, "exports", 4).wait(Duration::from_secs(60)))
        .service_fn(move |_request: u32| {
            let raw = raw.clone();
            async move {
                use fred::interfaces::{KeysInterface, LuaInterface};
                let _: i64 = raw
                    .eval(
                        COUNT_IN,
                        vec!["limit:inflight", "limit:max"],
                        Vec::<String>::new(),
                    )
                    .await?;
                match work {
                    Some(work) => tokio::time::sleep(work).await,
                    // Runs until the process is killed.
                    None => std::future::pending::<()>().await,
                }
                let _: i64 = raw.decr("limit:inflight").await?;
                let _: i64 = raw.incr("limit:done").await?;
                Ok::<(), BoxError>(())
            }
        })
}

/// One instance of the fleet: `FREDLOCK_LIMIT_REQUESTS` requests at once through the limit,
/// each 10 ms of work; fails unless every one ran. Run by
/// `at_most_n_requests_run_at_once_across_instances` as a child process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a child process of at_most_n_requests_run_at_once_across_instances"]
async fn limit_instance() {
    let url = std::env::var("FREDLOCK_LIMIT_URL").expect("FREDLOCK_LIMIT_URL");
    let requests: u32 = std::env::var("FREDLOCK_LIMIT_REQUESTS")
        .expect("FREDLOCK_LIMIT_REQUESTS")
        .parse()
        .unwrap();
    let client = common::connect(&url).await.unwrap();
    let raw = common::raw_client(&url).await;
    let service = limited(client.clone(), raw, Some(Duration::from_millis(10)));
    let calls: Vec<_> = (0..requests)
        .map(|request| tokio::spawn(service.clone().oneshot(request)))
        .collect();
    for call in calls {
        call.await
            .unwrap()
            .expect("every request runs within the wait");
    }
    client.shutdown().await;
}

/// One instance that takes two permits and holds them until it is killed (a lease of 2 s,
/// renewed by its watchdog meanwhile). Run by
/// `a_killed_instances_permits_come_back_within_their_lease` as a child process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a child process of a_killed_instances_permits_come_back_within_their_lease"]
async fn limit_holder() {
    let url = std::env::var("FREDLOCK_LIMIT_URL").expect("FREDLOCK_LIMIT_URL");
    let client = common::builder()
        .url(url.as_str())
        .watchdog_lease(Duration::from_secs(2))
        .build()
        .await
        .unwrap();
    let raw = common::raw_client(&url).await;
    let service = limited(client, raw, None);
    let first = tokio::spawn(service.clone().oneshot(1));
    let second = tokio::spawn(service.oneshot(2));
    let _ = tokio::join!(first, second);
}

/// Three instances (processes of their own), N = 4, 200 requests: never more than 4 run at
/// once, as Redis counts them, and every request runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_n_requests_run_at_once_across_instances() {
    use fred::interfaces::KeysInterface;
    bounded(async {
        let server = RedisServer::start();
        let instances: Vec<_> = [67, 67, 66]
            .iter()
            .map(|requests: &u32| {
                common::KillOnDrop(common::spawn_test_child(
                    "limit_instance",
                    &[
                        ("FREDLOCK_LIMIT_URL", server.url()),
                        ("FREDLOCK_LIMIT_REQUESTS", requests.to_string()),
                    ],
                ))
            })
            .collect();
        for mut instance in instances {
            let status = tokio::task::spawn_blocking(move || instance.0.wait())
                .await
                .unwrap()
                .unwrap();
            assert!(status.success(), "an instance failed: {status}");
        }
        let raw = common::raw_client(&server.url()).await;
        let most: i64 = raw.get("limit:max").await.unwrap();
        let done: i64 = raw.get("limit:done").await.unwrap();
        assert_eq!(done, 200, "every request ran");
        assert!(most <= 4, "{most} requests ran at once across instances");
        assert_eq!(most, 4, "the requests did contend: the limit was reached");
        let available = LockClient::connect(&server.url())
            .await
            .unwrap()
            .permit_semaphore("exports")
            .available_permits()
            .await
            .unwrap();
        assert_eq!(available, 4, "every permit came back");
    })
    .await
}

/// An instance killed mid-request (SIGKILL: no release) keeps its permits only until their
/// lease ends (2 s); then they serve others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_instances_permits_come_back_within_their_lease() {
    bounded(async {
        let server = RedisServer::start();
        let mut holder = common::KillOnDrop(common::spawn_test_child(
            "limit_holder",
            &[("FREDLOCK_LIMIT_URL", server.url())],
        ));
        let client = common::connect(&server.url()).await.unwrap();
        let exports = client.permit_semaphore("exports");
        let held = eventually(Duration::from_secs(20), || async {
            exports.available_permits().await.unwrap_or(-1) == 2
        })
        .await;
        assert!(held, "the holder took two of the four permits");
        // Renewed meanwhile: still held after more than a lease.
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(exports.available_permits().await.unwrap(), 2, "renewed");
        let killed = Instant::now();
        // SIGKILL: no release, no shutdown.
        holder.0.kill().unwrap();
        holder.0.wait().unwrap();
        let back = eventually(Duration::from_secs(10), || async {
            exports.available_permits().await.unwrap_or(-1) == 4
        })
        .await;
        let took = killed.elapsed();
        assert!(back, "the killed instance's permits came back");
        println!("the killed instance's permits came back {took:?} after the kill");
        assert!(
            took < Duration::from_millis(3_500),
            "within their 2 s lease (and a little): {took:?}"
        );
        // And they serve: four requests run at once here now.
        let raw = common::raw_client(&server.url()).await;
        let service = limited(client.clone(), raw, Some(Duration::from_millis(10)));
        let calls: Vec<_> = (0..4)
            .map(|request| tokio::spawn(service.clone().oneshot(request)))
            .collect();
        for call in calls {
            call.await.unwrap().unwrap();
        }
        client.shutdown().await;
    })
    .await
}

/// Per key: each key has its own N (here 1), requests of other keys and unkeyed ones are not
/// held back, a request that finds no permit within its wait gets a typed `LimitReached`
/// naming its limit, and a finished request's permit comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_key_limits_and_a_typed_error_when_the_wait_runs_out() {
    use fredlock::tower::LimitReached;
    bounded(async {
        let server = RedisServer::start();
        let client = LockClient::connect(&server.url()).await.unwrap();
        // A request is (key, how long it works); key "" is not limited.
        let per_tenant = |request: &(&str, u64)| {
            (!request.0.is_empty()).then(|| format!("tenant:{}", request.0))
        };
        let layer = ConcurrencyLimitLayer::per_key(client.clone(), per_tenant, 1)
            .wait(Duration::from_millis(300));
        let service =
            ServiceBuilder::new()
                .layer(layer)
                .service_fn(|(_, ms): (&str, u64)| async move {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    Ok::<_, BoxError>(ms)
                });
        let long_a = tokio::spawn(service.clone().oneshot(("a", 1_500)));
        tokio::time::sleep(Duration::from_millis(200)).await;
        let started = Instant::now();
        let other_key = service.clone().oneshot(("b", 10)).await.unwrap();
        let unkeyed = service.clone().oneshot(("", 10)).await.unwrap();
        assert_eq!((other_key, unkeyed), (10, 10));
        assert!(
            started.elapsed() < Duration::from_millis(1_000),
            "another key and an unkeyed request were not held back by tenant a's request"
        );
        let refused = service
            .clone()
            .oneshot(("a", 10))
            .await
            .expect_err("tenant a's one permit is taken");
        let reached = refused
            .downcast_ref::<LimitReached>()
            .unwrap_or_else(|| panic!("a typed LimitReached, got {refused}"));
        assert_eq!(reached.limit, "tenant:a");
        assert_eq!(
            (reached.max, reached.waited),
            (1, Duration::from_millis(300))
        );
        assert_eq!(long_a.await.unwrap().unwrap(), 1_500);
        let available = client
            .permit_semaphore("tenant:a")
            .available_permits()
            .await
            .unwrap();
        assert!(
            eventually(Duration::from_secs(2), || async {
                client
                    .permit_semaphore("tenant:a")
                    .available_permits()
                    .await
                    .unwrap()
                    == 1
            })
            .await,
            "the finished request's permit came back ({available} at first)"
        );
        // The semaphore gone with its data (a restarted server without persistence): the
        // first request finds no permit within its wait, and the next sets the permits again.
        let raw = common::raw_client(&server.url()).await;
        let _: () = raw
            .custom(fred::cmd!("FLUSHALL"), Vec::<String>::new())
            .await
            .unwrap();
        let gone = service
            .clone()
            .oneshot(("b", 10))
            .await
            .expect_err("no permits");
        assert!(gone.is::<LimitReached>(), "{gone}");
        assert_eq!(service.clone().oneshot(("b", 10)).await.unwrap(), 10);
        // A limit of zero lets none run.
        let none = ServiceBuilder::new()
            .layer(ConcurrencyLimitLayer::new(client.clone(), "closed", 0).wait(Duration::ZERO))
            .service_fn(|()| async { Ok::<_, BoxError>(()) });
        let refused = none.oneshot(()).await.expect_err("no permit at all");
        assert!(refused.is::<LimitReached>(), "{refused}");
        client.shutdown().await;
    })
    .await
}

/// A request whose permit is lost while it runs (given back by id from elsewhere, as an
/// operator's force release does) is stopped with `Error::Lost` at the next renewal, not left
/// running beside the request that takes the permit next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_permit_is_lost_is_stopped() {
    bounded(async {
        let server = RedisServer::start();
        let client = common::builder()
            .url(server.url())
            .watchdog_lease(Duration::from_millis(1_500))
            .build()
            .await
            .unwrap();
        let service = ServiceBuilder::new()
            .layer(ConcurrencyLimitLayer::new(client.clone(), "reports", 1))
            .service_fn(|()| async {
                tokio::time::sleep(Duration::from_secs(30)).await;
                Ok::<_, BoxError>("finished")
            });
        let running = tokio::spawn(service.oneshot(()));
        let reports = client.permit_semaphore("reports");
        let mut holder = None;
        let deadline = Instant::now() + Duration::from_secs(5);
        while holder.is_none() && Instant::now() < deadline {
            holder = reports
                .inspect()
                .await
                .unwrap()
                .holders
                .first()
                .map(|held| held.owner.clone());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let operator = LockClient::connect(&server.url()).await.unwrap();
        let id = holder.expect("the request holds the permit");
        assert!(operator
            .permit_semaphore("reports")
            .release_by_id(&id)
            .await
            .unwrap());
        let stopped = tokio::time::timeout(Duration::from_secs(5), running)
            .await
            .expect("stopped within a renewal or two, not after its 30 s of work")
            .unwrap()
            .expect_err("a request whose permit is lost gets an error");
        match stopped.downcast_ref::<fredlock::Error>() {
            Some(fredlock::Error::Lost { lock, owner }) => {
                assert_eq!(lock, "reports");
                assert_eq!(owner, &id);
            }
            other => panic!("expected Error::Lost, got {other:?} ({stopped})"),
        }
        operator.shutdown().await;
        client.shutdown().await;
    })
    .await
}

/// What a request's work leaves behind when it is dropped, slowly: when its drop ended.
struct SlowEnd(std::sync::Arc<std::sync::Mutex<Option<Instant>>>);

impl Drop for SlowEnd {
    fn drop(&mut self) {
        // A drop that takes a while (a flush, a file closed): the permit must not be handed
        // over before it is done.
        std::thread::sleep(Duration::from_millis(500));
        *self.0.lock().unwrap() = Some(Instant::now());
    }
}

/// `shutdown()` stops a request running under the fleet-wide limit and waits for its work to
/// be dropped before it hands the permit over, as it does for work under a lock (issue 57: the
/// layer's own `select!` on the permit's loss ran outside the engine's work under holds, so the
/// permit went back while the request's work still ran).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_waits_for_a_limited_request_before_it_gives_the_permit_back() {
    bounded(async {
        let server = RedisServer::start();
        let client = common::connect(&server.url()).await.unwrap();
        let ended = std::sync::Arc::new(std::sync::Mutex::new(None));
        let work_ended = ended.clone();
        let service = ServiceBuilder::new()
            .layer(ConcurrencyLimitLayer::new(
                client.clone(),
                "shutdown-limit",
                1,
            ))
            .service_fn(move |()| {
                let end = SlowEnd(work_ended.clone());
                async move {
                    let _end = end;
                    tokio::time::sleep(Duration::from_secs(30)).await;
                    Ok::<_, BoxError>("finished")
                }
            });
        let running = tokio::spawn(service.oneshot(()));
        let other = common::connect(&server.url()).await.unwrap();
        let limit = other.permit_semaphore("shutdown-limit");
        let taken = common::eventually(Duration::from_secs(5), || async {
            limit.available_permits().await.unwrap() == 0
        })
        .await;
        assert!(taken, "the request never took its permit");
        let shutting = tokio::spawn({
            let client = client.clone();
            async move { client.shutdown().await }
        });
        // The permit comes back at the shutdown's hand-over, not at the end of its lease.
        let mut permit = None;
        let deadline = Instant::now() + Duration::from_secs(10);
        while permit.is_none() && Instant::now() < deadline {
            permit = limit.try_acquire_now().await.unwrap();
        }
        let given_back = Instant::now();
        let permit = permit.expect("the shutdown handed the permit over");
        let ended_at = *ended.lock().unwrap();
        assert!(
            ended_at.is_some_and(|ended_at| ended_at <= given_back),
            "the permit was handed over while the request's work still ran"
        );
        let answered = tokio::time::timeout(Duration::from_secs(5), running)
            .await
            .expect("the request answered")
            .unwrap();
        assert!(answered.is_err(), "the request was stopped: {answered:?}");
        shutting.await.unwrap();
        permit.release().await.unwrap();
        other.shutdown().await;
    })
    .await
}

//! Two client libraries under one engine (issue 45): a client on fred and a client on redis-rs
//! exclude each other on every lock kind, the same keys and scripts on the server, and the
//! redis-rs client really is on redis-rs.
//!
//! Needs feature `redis-rs` (`cargo test --all-features --test backends`).

mod common;

use std::time::Duration;

use common::*;
use fred::interfaces::ClientLike;
use fredlock::{Backend, LockClient, Protocol};

async fn on(backend: Backend, server: &RedisServer) -> LockClient {
    LockClient::builder()
        .backend(backend)
        .url(server.url())
        .build()
        .await
        .unwrap()
}

/// `holder` takes `kind`'s lock `name`; `waiter` is kept out, waits, and is woken by the
/// release within a second (a waiter that heard nothing would wait out the 30 s lease).
/// Returns the waiter's guard.
async fn hand_over(
    kind: Kind,
    name: &str,
    (holder, holder_is): (&LockClient, &str),
    (waiter, waiter_is): (&LockClient, &str),
) -> fredlock::LockGuard {
    let held = kind.lock(holder, name).lock().await.unwrap();
    let other = kind.lock(waiter, name);
    assert!(
        other.try_lock_now().await.unwrap().is_none(),
        "{kind:?}: {waiter_is} must not get the lock {holder_is} holds"
    );
    let waiting = tokio::spawn(async move {
        other
            .try_lock(Duration::from_secs(5), None)
            .await
            .unwrap()
            .map(|guard| (guard, std::time::Instant::now()))
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let released = std::time::Instant::now();
    held.unlock().await.unwrap();
    let (guard, got) = waiting
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("{kind:?}: {waiter_is} gets the lock {holder_is} let go"));
    assert!(
        got.duration_since(released) < Duration::from_secs(1),
        "{kind:?}: {waiter_is} woken by {holder_is}'s release, not by a poll"
    );
    guard
}

for_each_kind!(a_fred_client_and_a_redis_rs_client_exclude_each_other);

/// A hold taken on one library is seen by the other, in both directions, and the release of
/// one lets the other in (its waiter woken by the release's message, within the wait).
async fn a_fred_client_and_a_redis_rs_client_exclude_each_other(kind: Kind) {
    let server = RedisServer::start();
    let fred = on(Backend::Fred, &server).await;
    let redis_rs = on(Backend::RedisRs, &server).await;
    assert!(
        fred.redis().is_some(),
        "the fred client hands out its fred client"
    );
    assert!(
        redis_rs.redis().is_none(),
        "the redis-rs client has no fred client: it is on redis-rs"
    );
    for (first, second) in [(&fred, &redis_rs), (&redis_rs, &fred)] {
        let guard = hand_over(kind, "both", (first, "one library"), (second, "the other")).await;
        assert!(
            kind.lock(first, "both")
                .try_lock_now()
                .await
                .unwrap()
                .is_none(),
            "{kind:?}: and the first library's client must not get it back"
        );
        guard.unlock().await.unwrap();
    }
    fred.shutdown().await;
    redis_rs.shutdown().await;
}

/// Each library over each protocol: fred and redis-rs, RESP2 and RESP3.
const SPEAKERS: [(Backend, Protocol); 4] = [
    (Backend::Fred, Protocol::Resp2),
    (Backend::RedisRs, Protocol::Resp3),
    (Backend::Fred, Protocol::Resp3),
    (Backend::RedisRs, Protocol::Resp2),
];

async fn speaking(backend: Backend, protocol: Protocol, server: &RedisServer) -> LockClient {
    LockClient::builder()
        .backend(backend)
        .protocol(protocol)
        .url(server.url())
        .build()
        .await
        .unwrap_or_else(|error| panic!("{backend:?} over {protocol:?}: {error}"))
}

/// Every connection but the asking one, as `CLIENT LIST` has it: its RESP version and whether
/// it is subscribed to a channel.
async fn connections(server: &RedisServer) -> Vec<(i64, bool)> {
    let raw = raw_client(&server.url()).await;
    let own: i64 = raw.custom(fred::cmd!("CLIENT"), vec!["ID"]).await.unwrap();
    let list: String = raw
        .custom(fred::cmd!("CLIENT"), vec!["LIST"])
        .await
        .unwrap();
    let _ = raw.quit().await;
    list.lines()
        .filter_map(|line| {
            let field = |name: &str| {
                line.split(' ')
                    .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
                    .map(|value| value.parse::<i64>().expect("a number"))
            };
            (field("id")? != own).then(|| {
                let resp = field("resp").expect("Redis 7 lists each connection's resp");
                (resp, field("sub").unwrap_or(0) > 0)
            })
        })
        .collect()
}

/// The connections `server` has, once one is subscribed: every one over `resp`, one of them
/// subscribed (the client's pub/sub: a connection of its own over RESP2, and over RESP3 on
/// fred; redis-rs's RESP3 subscriber is also its own connection).
async fn assert_speaks(server: &RedisServer, resp: i64, whom: &str) {
    let subscribed = eventually(Duration::from_secs(5), || async {
        connections(server).await.iter().any(|(_, sub)| *sub)
    })
    .await;
    assert!(subscribed, "{whom}: never subscribed");
    let connections = connections(server).await;
    assert!(!connections.is_empty(), "{whom}: no connection");
    assert!(
        connections.iter().all(|(speaks, _)| *speaks == resp),
        "{whom}: every connection over RESP{resp}: {connections:?}"
    );
    assert!(
        connections.iter().any(|(_, subscribed)| *subscribed),
        "{whom}: its pub/sub is subscribed over RESP{resp}: {connections:?}"
    );
}

/// A client speaks the protocol it was built with, on every connection it opens, its pub/sub
/// included; redis-rs's RESP2 subscriber is a connection of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_library_speaks_the_protocol_it_is_given() {
    bounded(async {
        for (backend, protocol) in SPEAKERS {
            let server = RedisServer::start();
            let client = speaking(backend, protocol, &server).await;
            let resp = if protocol == Protocol::Resp2 { 2 } else { 3 };
            // A first hold subscribes the client's own channel (for force unlocks).
            let guard = client.lock("spoken").lock().await.unwrap();
            let whom = format!("{backend:?} over {protocol:?}");
            assert_speaks(&server, resp, &whom).await;
            guard.unlock().await.unwrap();
            client.shutdown().await;
        }
    })
    .await
}

for_each_kind!(either_protocol_on_either_library_excludes_and_wakes_the_others);

/// Over RESP2 and RESP3, on fred and on redis-rs: each client's hold keeps out the next one
/// in [`SPEAKERS`] (the other library, the other protocol, in turn), and each one's release
/// wakes the next one's waiter through pub/sub (within a second; a waiter that heard nothing
/// would wait out the 30 s lease).
async fn either_protocol_on_either_library_excludes_and_wakes_the_others(kind: Kind) {
    let server = RedisServer::start();
    let mut clients = Vec::new();
    for (backend, protocol) in SPEAKERS {
        clients.push((
            format!("{backend:?} over {protocol:?}"),
            speaking(backend, protocol, &server).await,
        ));
    }
    for (at, (holder, first)) in clients.iter().enumerate() {
        let (waiter, second) = &clients[(at + 1) % clients.len()];
        let guard = hand_over(kind, "spoken", (first, holder), (second, waiter)).await;
        guard.unlock().await.unwrap();
    }
    for (_, client) in clients {
        client.shutdown().await;
    }
}

/// A service's redis-rs client handed over: RESP3 whatever the client's own (redis-rs's default
/// RESP2 cannot be told from a choice), unless the builder names one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handed_over_redis_rs_client_brings_its_protocol() {
    bounded(async {
        for (query, named, resp) in [
            ("", None, 3),
            ("?protocol=resp2", None, 3),
            ("", Some(Protocol::Resp2), 2),
            ("?protocol=resp3", Some(Protocol::Resp2), 2),
            ("?protocol=resp2", Some(Protocol::Resp3), 3),
        ] {
            let server = RedisServer::start();
            let service = redis::Client::open(format!("{}{query}", server.url())).unwrap();
            let mut builder = LockClient::builder().redis_rs_client(&service);
            if let Some(protocol) = named {
                builder = builder.protocol(protocol);
            }
            let client = builder.build().await.unwrap();
            let guard = client.lock("spoken").lock().await.unwrap();
            let whom = format!("a client of {query:?} handed over, protocol {named:?}");
            assert_speaks(&server, resp, &whom).await;
            guard.unlock().await.unwrap();
            client.shutdown().await;
        }
        assert!("RESP3".parse::<Protocol>().unwrap() == Protocol::Resp3);
        let refused = "resp4".parse::<Protocol>().unwrap_err();
        assert!(refused.to_string().contains("resp2 or resp3"), "{refused}");
    })
    .await
}

/// A semaphore's permits and a job's runs are counted alike across libraries.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn semaphores_and_jobs_are_shared_across_libraries() {
    bounded(async {
        let server = RedisServer::start();
        let fred = on(Backend::Fred, &server).await;
        let redis_rs = on(Backend::RedisRs, &server).await;
        let permits = fred.semaphore("permits");
        assert!(permits.try_set_permits(1).await.unwrap());
        let taken = permits.acquire(1).await.unwrap();
        let other = redis_rs.semaphore("permits");
        assert!(other.try_acquire_now(1).await.unwrap().is_none());
        taken.release().await.unwrap();
        let again = tokio::time::timeout(Duration::from_secs(5), other.acquire(1))
            .await
            .expect("the permit comes back")
            .unwrap();
        again.release().await.unwrap();

        let job = fred.job_lock("nightly");
        let (ran, skipped) = tokio::join!(
            job.run(async {
                tokio::time::sleep(Duration::from_millis(300)).await;
            }),
            async {
                tokio::time::sleep(Duration::from_millis(100)).await;
                redis_rs.job_lock("nightly").run(async {}).await
            }
        );
        assert!(ran.unwrap().ran().is_some(), "the first run ran");
        assert!(
            skipped.unwrap().ran().is_none(),
            "the other library's run of a running job is skipped"
        );
        fred.shutdown().await;
        redis_rs.shutdown().await;
    })
    .await
}

/// A cluster on redis-rs whose node does not answer fails to build, naming the node; backends
/// read by name.
#[tokio::test]
async fn an_unreachable_cluster_on_redis_rs_is_named_and_backends_read_by_name() {
    let error = LockClient::builder()
        .backend(Backend::RedisRs)
        .url("redis-cluster://127.0.0.1:1")
        .build()
        .await
        .expect_err("nothing listens on port 1");
    let text = error.to_string();
    assert!(text.contains("127.0.0.1:1"), "{text}");
    assert_eq!("redis-rs".parse::<Backend>().unwrap(), Backend::RedisRs);
    assert_eq!("fred".parse::<Backend>().unwrap(), Backend::Fred);
    assert!(matches!(
        "valkey-glide".parse::<Backend>(),
        Err(fredlock::Error::InvalidArgument(_))
    ));
}

/// A service's own redis-rs client, handed over: its settings serve the locks, on redis-rs,
/// and the service's client is left working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_services_redis_rs_client_is_handed_over() {
    bounded(async {
        let server = RedisServer::start();
        let service = redis::Client::open(server.url()).unwrap();
        let client = LockClient::builder()
            .redis_rs_client(&service)
            .build()
            .await
            .unwrap();
        assert!(client.redis().is_none(), "on redis-rs");
        let guard = client.lock("handed-over").lock().await.unwrap();
        let fred = on(Backend::Fred, &server).await;
        assert!(fred
            .lock("handed-over")
            .try_lock_now()
            .await
            .unwrap()
            .is_none());
        guard.unlock().await.unwrap();
        client.shutdown().await;
        let mut connection = service.get_multiplexed_async_connection().await.unwrap();
        let held: i64 = redis::cmd("EXISTS")
            .arg("handed-over")
            .query_async(&mut connection)
            .await
            .unwrap();
        assert_eq!(
            held, 0,
            "the service's own client still works, and the hold is gone"
        );
        fred.shutdown().await;
    })
    .await
}

/// node-redisson (npm) driven through `tests/node/interop.js`: a child process that answers one
/// line per command. Killed when dropped.
struct NodeRedisson {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    answers: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

impl NodeRedisson {
    fn start(modules: &str, port: u16) -> NodeRedisson {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/node/interop.js");
        let mut child = tokio::process::Command::new("node")
            .arg(script)
            .arg(port.to_string())
            .env("NODE_PATH", modules)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start node (Node.js on PATH)");
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        NodeRedisson {
            child,
            stdin,
            answers: tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout)),
        }
    }

    async fn send(&mut self, command: &str) {
        use tokio::io::AsyncWriteExt;
        self.stdin
            .write_all(format!("{command}\n").as_bytes())
            .await
            .unwrap();
        self.stdin.flush().await.unwrap();
    }

    async fn answer(&mut self) -> String {
        tokio::time::timeout(Duration::from_secs(20), self.answers.next_line())
            .await
            .expect("node-redisson answered within 20 s")
            .unwrap()
            .expect("node-redisson is still running")
    }

    async fn ask(&mut self, command: &str) -> String {
        self.send(command).await;
        self.answer().await
    }
}

/// node-redisson, which speaks Redisson's protocol, and a client on redis-rs exclude each other
/// in both directions, and each one's release wakes the other's waiter through the unlock
/// channel (within a second, far below the 30 s lease either would poll on).
///
/// Needs Node.js and node-redisson from npm: `.ci/run` installs them and runs this test with
/// `--ignored`, `FREDLOCK_NODE_MODULES` naming the `node_modules` folder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs node-redisson from npm: .ci/run installs it and runs this with --ignored"]
async fn node_redisson_and_the_redis_rs_backend_exclude_each_other() {
    let modules = std::env::var("FREDLOCK_NODE_MODULES").expect(
        "FREDLOCK_NODE_MODULES names the node_modules folder holding node-redisson and ioredis \
         (.ci/run installs them)",
    );
    bounded(async {
        let server = RedisServer::start();
        let mut node = NodeRedisson::start(&modules, server.port());
        let client = on(Backend::RedisRs, &server).await;
        let name = "interop-node";

        // node-redisson holds: the redis-rs client is kept out, and woken by its release.
        assert_eq!(
            node.ask(&format!("hold {name}")).await,
            format!("held {name}")
        );
        let lock = client.lock(name);
        assert!(
            lock.try_lock_now().await.unwrap().is_none(),
            "a lock node-redisson holds must not be taken on redis-rs"
        );
        let waiter = tokio::spawn(async move {
            let guard = lock
                .try_lock(Duration::from_secs(10), None)
                .await
                .unwrap()
                .expect("the redis-rs waiter gets the lock node-redisson released");
            (guard, std::time::Instant::now())
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        let released = std::time::Instant::now();
        assert_eq!(
            node.ask(&format!("release {name}")).await,
            format!("released {name}")
        );
        let (guard, got) = waiter.await.unwrap();
        assert!(
            got.duration_since(released) < Duration::from_secs(1),
            "woken by node-redisson's unlock message ({:?})",
            got.duration_since(released)
        );

        // The redis-rs client holds: node-redisson is kept out, and woken by its release.
        assert_eq!(
            node.ask(&format!("try {name} 300")).await,
            format!("refused {name}"),
            "a lock held on redis-rs must not be taken by node-redisson"
        );
        node.send(&format!("try {name} 10000")).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let released = std::time::Instant::now();
        guard.unlock().await.unwrap();
        assert_eq!(node.answer().await, format!("got {name}"));
        assert!(
            released.elapsed() < Duration::from_secs(2),
            "node-redisson woken by the unlock message ({:?})",
            released.elapsed()
        );
        assert!(
            client.lock(name).is_locked().await.unwrap(),
            "node-redisson's hold is seen on redis-rs"
        );
        assert!(client.lock(name).try_lock_now().await.unwrap().is_none());
        assert_eq!(
            node.ask(&format!("release {name}")).await,
            format!("released {name}")
        );
        assert_eq!(node.ask("quit").await, "bye");
        let _ = node.child.wait().await;
        client.shutdown().await;
    })
    .await
}

/// node-redisson and eight fredlock instances (four on fred, four on redis-rs, each its own
/// client) on one lock, now that fredlock's waiting clients stand in line and a release wakes
/// one of them (issue 59): node-redisson's release, which names nobody, wakes them all, and the
/// lock then passes from one instance to the next; a fredlock release, which names the next
/// instance first, still wakes node-redisson, which waits among them; nobody holds the lock
/// with anybody else. Places in line last 30 s, so no waiter's own pause (10 s) ends within
/// the test: every hand-off is a wake-up.
///
/// Needs Node.js and node-redisson from npm, as the test above.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs node-redisson from npm: .ci/run installs it and runs this with --ignored"]
async fn node_redisson_and_eight_waiting_instances_wake_each_other() {
    let modules = std::env::var("FREDLOCK_NODE_MODULES").expect(
        "FREDLOCK_NODE_MODULES names the node_modules folder holding node-redisson and ioredis \
         (.ci/run installs them)",
    );
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let mut node = NodeRedisson::start(&modules, server.port());
        let name = "interop-eight";
        let mut clients = Vec::new();
        for backend in [Backend::Fred, Backend::RedisRs] {
            for _ in 0..4 {
                let client = LockClient::builder()
                    .backend(backend)
                    .url(server.url())
                    .queue_place(Duration::from_secs(30))
                    .build()
                    .await
                    .unwrap();
                clients.push(client);
            }
        }
        let held = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let wait_all = |clients: &[LockClient]| {
            clients
                .iter()
                .map(|client| {
                    let lock = client.lock(name);
                    let held = held.clone();
                    tokio::spawn(async move {
                        let guard = lock
                            .try_lock(Duration::from_secs(20), None)
                            .await
                            .unwrap()
                            .expect("every instance gets the lock in turn");
                        assert_eq!(
                            held.fetch_add(1, std::sync::atomic::Ordering::SeqCst),
                            0,
                            "one fredlock holder at a time"
                        );
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        held.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                        guard.unlock().await.unwrap();
                    })
                })
                .collect::<Vec<_>>()
        };
        let line = format!("fredlock_lock_waiters:{{{name}}}");
        // Whether `count` clients stand in line.
        let in_line = |count: i64| {
            let (raw, line) = (&raw, &line);
            move || async move {
                let places: i64 = fred::interfaces::SortedSetsInterface::zcard(raw, line)
                    .await
                    .unwrap();
                places == count
            }
        };

        // node-redisson holds; its release wakes the eight, which then pass the lock on.
        assert_eq!(
            node.ask(&format!("hold {name}")).await,
            format!("held {name}")
        );
        let waiters = wait_all(&clients);
        assert!(
            eventually(Duration::from_secs(5), in_line(8)).await,
            "all eight in line"
        );
        let released = std::time::Instant::now();
        assert_eq!(
            node.ask(&format!("release {name}")).await,
            format!("released {name}")
        );
        for waiter in waiters {
            waiter.await.unwrap();
        }
        assert!(
            released.elapsed() < Duration::from_secs(5),
            "woken by node-redisson's release, then each by the one before ({:?})",
            released.elapsed()
        );

        // A fredlock instance holds; node-redisson waits among the eight, and is woken by a
        // fredlock release that names another instance first.
        let guard = clients[0].lock(name).lock().await.unwrap();
        let waiters = wait_all(&clients[1..]);
        node.send(&format!("try {name} 15000")).await;
        assert!(
            eventually(Duration::from_secs(5), in_line(7)).await,
            "seven in line"
        );
        let released = std::time::Instant::now();
        guard.unlock().await.unwrap();
        assert_eq!(node.answer().await, format!("got {name}"));
        assert!(
            released.elapsed() < Duration::from_secs(5),
            "node-redisson woken among the waiting instances ({:?})",
            released.elapsed()
        );
        assert_eq!(
            held.load(std::sync::atomic::Ordering::SeqCst),
            0,
            "no fredlock instance holds while node-redisson does"
        );
        assert!(clients[0]
            .lock(name)
            .try_lock_now()
            .await
            .unwrap()
            .is_none());
        assert_eq!(
            node.ask(&format!("release {name}")).await,
            format!("released {name}")
        );
        for waiter in waiters {
            waiter.await.unwrap();
        }
        assert!(
            released.elapsed() < Duration::from_secs(8),
            "every instance got the lock after node-redisson's release ({:?})",
            released.elapsed()
        );
        assert_eq!(node.ask("quit").await, "bye");
        let _ = node.child.wait().await;
        for client in &clients {
            client.shutdown().await;
        }
    })
    .await
}

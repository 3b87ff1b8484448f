//! Acceptance tests of the fair lock against real `redis-server` processes. The behaviour it
//! shares with the reentrant lock is tested per kind in `lock.rs` and `watchdog.rs`.

mod common;

use std::collections::HashMap;
use std::process::Child;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{
    bounded, eventually, queue_key, sigkill, time_acquisition, timeout_key, RedisCluster,
    RedisServer,
};
use fred::prelude::*;
use fredlock::{FairLock, LockClient};
use rand::Rng;
use tokio::time::Instant;

const _: () = {
    const fn shareable<T: Send + Sync + 'static>() {}
    shareable::<FairLock>();
};

/// The waiter fields in the queue, first first.
async fn queue(raw: &Client, name: &str) -> Vec<String> {
    raw.lrange(queue_key(name), 0, -1).await.unwrap()
}

/// The waiter fields with a place.
async fn places(raw: &Client, name: &str) -> Vec<String> {
    raw.zrange(timeout_key(name), 0, -1, None, false, None, false)
        .await
        .unwrap()
}

/// The server's clock, in ms since the epoch.
async fn server_time_ms(raw: &Client) -> u64 {
    let (seconds, micros): (String, String) = raw
        .custom(fred::cmd!("TIME"), Vec::<String>::new())
        .await
        .unwrap();
    seconds.parse::<u64>().unwrap() * 1000 + micros.parse::<u64>().unwrap() / 1000
}

/// Whether `name`'s queue and timeout keys are both gone.
async fn line_is_empty(raw: &Client, name: &str) -> bool {
    let exists: u32 = raw
        .exists(vec![queue_key(name), timeout_key(name)])
        .await
        .unwrap();
    exists == 0
}

/// Waits (up to 2 s) until `name`'s queue holds `len` waiters.
async fn queue_reaches(raw: &Client, name: &str, len: usize) -> bool {
    eventually(Duration::from_secs(2), || async {
        queue(raw, name).await.len() == len
    })
    .await
}

/// A connection of its own subscribed to the channels `pattern` matches, and its messages.
async fn listening(
    server: &RedisServer,
    pattern: &str,
) -> (
    fred::clients::SubscriberClient,
    tokio::sync::broadcast::Receiver<fred::types::Message>,
) {
    let listener = fred::clients::SubscriberClient::new(
        fred::types::config::Config::from_url(&server.url()).unwrap(),
        None,
        None,
        None,
    );
    listener.init().await.unwrap();
    let messages = listener.message_rx();
    listener.psubscribe(pattern).await.unwrap();
    (listener, messages)
}

/// Who got the lock, in the order they got it.
type Served = Arc<Mutex<Vec<usize>>>;

/// Starts `count` waiters on `name`, `spacing` apart, taking turns over `clients`; waiter `i`
/// records `i` when it gets the lock, holds it for `hold` and releases it.
async fn line_up(
    clients: &[&LockClient],
    name: &str,
    count: usize,
    hold: Duration,
    spacing: Duration,
) -> (Vec<tokio::task::JoinHandle<()>>, Served) {
    let order = Served::default();
    let mut tasks = Vec::new();
    for id in 0..count {
        let lock = clients[id % clients.len()].fair_lock(name);
        tasks.push(queue_up(lock, id, hold, order.clone()));
        tokio::time::sleep(spacing).await;
    }
    (tasks, order)
}

/// Waits for the waiters of [`line_up`] and returns the order they were served in.
async fn served(tasks: Vec<tokio::task::JoinHandle<()>>, order: Served) -> Vec<usize> {
    for task in tasks {
        task.await.unwrap();
    }
    let order = order.lock().unwrap();
    order.clone()
}

/// Spawns a task that takes `lock`, records its `id` in `order`, holds it for `hold`, releases.
fn queue_up(
    lock: FairLock,
    id: usize,
    hold: Duration,
    order: Served,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let guard = lock.lock().await.unwrap();
        order.lock().unwrap().push(id);
        tokio::time::sleep(hold).await;
        guard.unlock().await.unwrap();
    })
}

/// 1. Strict order: while the lock is held, 20 tasks over 2 clients start waiting 20 ms apart;
///    they acquire in exactly that order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiters_acquire_in_arrival_order() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let clients = [
            server.fair_client(fredlock::DEFAULT_QUEUE_PLACE).await,
            server.fair_client(fredlock::DEFAULT_QUEUE_PLACE).await,
        ];
        let holder = clients[0].fair_lock("line").lock().await.unwrap();
        let (tasks, order) = line_up(
            &[&clients[0], &clients[1]],
            "line",
            20,
            Duration::from_millis(2),
            Duration::from_millis(20),
        )
        .await;
        assert_eq!(queue(&raw, "line").await.len(), 20);
        holder.unlock().await.unwrap();
        assert_eq!(served(tasks, order).await, (0..20).collect::<Vec<_>>());
        assert!(line_is_empty(&raw, "line").await);
    })
    .await;
}

/// 2. A waiter whose `try_lock` times out leaves the queue before it returns; the waiter behind
///    it then acquires within 250 ms of the holder's unlock (instead of after the leaver's place expired).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn timed_out_waiter_leaves_and_the_next_moves_up() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = server.fair_client(Duration::from_secs(20)).await;
        let holder = client.fair_lock("leaver").lock().await.unwrap();

        let leaving = client.fair_lock("leaver");
        let leaver = tokio::spawn(async move {
            leaving
                .try_lock(Duration::from_millis(400), None)
                .await
                .unwrap()
                .is_none()
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        let staying = client.fair_lock("leaver");
        let stayer = time_acquisition(staying);
        assert!(queue_reaches(&raw, "leaver", 2).await);
        let line = queue(&raw, "leaver").await;

        assert!(leaver.await.unwrap(), "the lock was held throughout");
        // Gone from the queue and from the places by the time try_lock returned.
        assert_eq!(queue(&raw, "leaver").await, line[1..].to_vec());
        assert_eq!(places(&raw, "leaver").await, line[1..].to_vec());

        holder.unlock().await.unwrap();
        let unlocked = Instant::now();
        let acquired = stayer.await.unwrap();
        let latency = acquired.duration_since(unlocked);
        assert!(
            latency <= Duration::from_millis(250),
            "next waiter acquired {latency:?} after the unlock"
        );
    })
    .await;
}

/// Helper process for the dead-waiter tests: queues for a fair lock and waits to be killed.
#[tokio::test]
#[ignore = "run by the dead-waiter tests as a child process"]
async fn dead_waiter_child() {
    let (Ok(url), Ok(name), Ok(place)) = (
        std::env::var("FREDLOCK_CHILD_URL"),
        std::env::var("FREDLOCK_CHILD_LOCK"),
        std::env::var("FREDLOCK_CHILD_PLACE_MS"),
    ) else {
        return;
    };
    let client = common::builder()
        .url(url)
        .queue_place(Duration::from_millis(place.parse().unwrap()))
        .build()
        .await
        .unwrap();
    let guard = client.fair_lock(name).lock().await;
    // Never reached while the parent holds the lock; it kills us first.
    drop(guard);
    tokio::time::sleep(Duration::from_secs(60)).await;
}

/// Starts [`dead_waiter_child`] queueing for `name`, and returns it once it is the last in line.
async fn queued_child(server: &RedisServer, name: &str, place: Duration) -> (Child, String) {
    let raw = server.raw().await;
    let before = queue(&raw, name).await.len();
    let child = common::spawn_test_child(
        "dead_waiter_child",
        &[
            ("FREDLOCK_CHILD_URL", server.url()),
            ("FREDLOCK_CHILD_LOCK", name.to_string()),
            ("FREDLOCK_CHILD_PLACE_MS", place.as_millis().to_string()),
        ],
    );
    assert!(
        eventually(Duration::from_secs(20), || async {
            queue(&raw, name).await.len() == before + 1
        })
        .await,
        "the child did not queue"
    );
    let field = queue(&raw, name).await.pop().unwrap();
    (child, field)
}

/// 3. A waiter killed with SIGKILL at the head of the queue holds up a live waiter behind it by
///    at most its wait timeout (`queue_place`) after the unlock, plus a margin.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dead_waiter_at_the_head_stalls_at_most_one_slot() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let place = Duration::from_secs(1);
        let client = server.fair_client(place).await;
        let holder = client.fair_lock("dead-head").lock().await.unwrap();
        let (child, dead) = queued_child(&server, "dead-head", place).await;
        sigkill(child);

        let lock = client.fair_lock("dead-head");
        let live = time_acquisition(lock);
        assert!(queue_reaches(&raw, "dead-head", 2).await);
        assert_eq!(queue(&raw, "dead-head").await[0], dead, "dead waiter first");
        holder.unlock().await.unwrap();
        let unlocked = Instant::now();
        let acquired = live.await.unwrap();
        let stall = acquired.duration_since(unlocked);
        assert!(
            stall <= place + Duration::from_millis(400),
            "the live waiter acquired {stall:?} after the unlock"
        );
        assert!(line_is_empty(&raw, "dead-head").await);
    })
    .await;
}

/// 3b. A dead waiter is purged once its place expires wherever it stands, not only at the head:
///     behind a live first waiter, it is gone while the lock is still held, and the live waiter
///     behind it follows the first without a stall.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dead_waiter_is_purged_wherever_it_stands() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let place = Duration::from_millis(900);
        let client = server.fair_client(place).await;
        let holder = client.fair_lock("dead-middle").lock().await.unwrap();
        let order = Served::default();
        let first = queue_up(
            client.fair_lock("dead-middle"),
            1,
            Duration::from_millis(50),
            order.clone(),
        );
        assert!(queue_reaches(&raw, "dead-middle", 1).await);
        let (child, dead) = queued_child(&server, "dead-middle", place).await;
        let last = queue_up(
            client.fair_lock("dead-middle"),
            2,
            Duration::ZERO,
            order.clone(),
        );
        assert!(queue_reaches(&raw, "dead-middle", 3).await);
        assert_eq!(queue(&raw, "dead-middle").await[1], dead);
        sigkill(child);

        // The live waiters keep their places (they retry every third of a place) and drop the
        // dead one on the way, while the holder still holds.
        let purged = eventually(place * 2, || async {
            let line = queue(&raw, "dead-middle").await;
            line.len() == 2 && !line.contains(&dead)
        })
        .await;
        assert!(purged, "left: {:?}", queue(&raw, "dead-middle").await);
        assert!(!places(&raw, "dead-middle").await.contains(&dead));

        holder.unlock().await.unwrap();
        let unlocked = Instant::now();
        first.await.unwrap();
        last.await.unwrap();
        assert!(
            unlocked.elapsed() < Duration::from_millis(500),
            "took {:?}",
            unlocked.elapsed()
        );
        assert_eq!(*order.lock().unwrap(), vec![1, 2]);
    })
    .await;
}

/// A live waiter keeps its place for as long as it waits, far beyond one wait timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn live_waiters_keep_their_places_beyond_their_wait_timeout() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let place = Duration::from_millis(600);
        let client = server.fair_client(place).await;
        let holder = client.fair_lock("patient").lock().await.unwrap();
        let (tasks, order) = line_up(
            &[&client],
            "patient",
            3,
            Duration::ZERO,
            Duration::from_millis(30),
        )
        .await;
        let line = queue(&raw, "patient").await;
        assert_eq!(line.len(), 3);
        tokio::time::sleep(place * 5).await;
        assert_eq!(
            queue(&raw, "patient").await,
            line,
            "a live waiter lost its place"
        );
        holder.unlock().await.unwrap();
        assert_eq!(served(tasks, order).await, vec![0, 1, 2]);
    })
    .await;
}

/// 4. Waiters whose futures are dropped (timeouts, `select!`, aborted tasks, `try_lock`s dropped
///    while they leave) at random points leave no queue or timeout entries behind, long before
///    their places would have ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dropped_waiters_leave_nothing_in_the_queue() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        // Slots far longer than the test: only leaving can empty the queue in time.
        let place = Duration::from_secs(120);
        let holder_client = server.fair_client(place).await;
        let clients = [
            server.fair_client(place).await,
            server.fair_client(place).await,
        ];
        let holder = holder_client.fair_lock("dropped").lock().await.unwrap();
        let mut waiting = Vec::new();
        let mut aborted = Vec::new();
        for i in 0..80 {
            let lock = clients[i % 2].fair_lock("dropped");
            let (yields, after) = {
                let mut rng = rand::thread_rng();
                (
                    rng.gen_range(0..400),
                    Duration::from_micros(rng.gen_range(0..400_000)),
                )
            };
            let task = tokio::spawn(async move {
                match i % 4 {
                    0 => {
                        tokio::select! {
                            _ = lock.lock() => panic!("acquired a held lock"),
                            _ = async { for _ in 0..yields { tokio::task::yield_now().await } } => {}
                        }
                    }
                    1 => {
                        let _ = tokio::time::timeout(after, lock.lock()).await;
                    }
                    2 => {
                        let _ = lock.lock().await;
                        panic!("acquired a held lock");
                    }
                    _ => {
                        // Dropped just as its wait ends, i.e. while it leaves the queue.
                        let wait = Duration::from_millis(50);
                        tokio::select! {
                            _ = lock.try_lock(wait, None) => {}
                            _ = async {
                                tokio::time::sleep(wait).await;
                                for _ in 0..yields % 40 { tokio::task::yield_now().await }
                            } => {}
                        }
                    }
                }
            });
            if i % 4 == 2 {
                aborted.push(task);
            } else {
                waiting.push(task);
            }
        }
        // Those to abort are queued first, so that aborting them drops queued waiters.
        assert!(
            eventually(Duration::from_secs(5), || async {
                let line = queue(&raw, "dropped").await;
                line.len() >= aborted.len()
            })
            .await
        );
        for task in &aborted {
            task.abort();
        }
        // A waiter that got the held lock panics: its task's result says so.
        for task in waiting {
            task.await.expect("a waiter acquired a held lock");
        }
        for task in aborted {
            let ended = task.await.expect_err("an aborted waiter ran to its end");
            assert!(ended.is_cancelled(), "an aborted waiter panicked: {ended}");
        }
        let ended = Instant::now();
        let clean = eventually(Duration::from_secs(2), || async {
            line_is_empty(&raw, "dropped").await
                && clients.iter().all(|client| {
                    let stats = client.stats();
                    stats.wait_entries == 0 && stats.subscriptions == 0
                })
        })
        .await;
        assert!(
            clean,
            "left behind: queue {:?}, places {:?}",
            queue(&raw, "dropped").await,
            places(&raw, "dropped").await
        );
        println!("queue empty {:?} after the last waiter ended", ended.elapsed());

        // And the lock passes on at once to a newcomer.
        holder.unlock().await.unwrap();
        let taken = clients[0]
            .fair_lock("dropped")
            .try_lock(Duration::ZERO, None)
            .await
            .unwrap();
        assert!(taken.is_some());
    })
    .await;
}

/// `try_lock` with a zero wait never queues, and does not overtake the queue when it finds the
/// lock free for a moment.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn zero_wait_try_lock_never_queues_or_overtakes() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = server.fair_client(Duration::from_secs(2)).await;
        let other = server.fair_client(Duration::from_secs(2)).await;
        let lock = client.fair_lock("no-wait");

        let holder = lock.lock().await.unwrap();
        let attempt = other
            .fair_lock("no-wait")
            .try_lock(Duration::ZERO, None)
            .await
            .unwrap();
        assert!(attempt.is_none());
        assert!(
            line_is_empty(&raw, "no-wait").await,
            "a no-wait attempt queued"
        );

        holder.unlock().await.unwrap();

        // Another client's waiter (a Redisson one, say) is first in line, its place a minute
        // long, and the lock is free for a moment: a no-wait attempt does not take it.
        let foreign = "c0ffee00-0000-4000-8000-000000000000:1";
        let slot_end = server_time_ms(&raw).await + 60_000;
        let _: i64 = raw.rpush(queue_key("no-wait"), foreign).await.unwrap();
        let _: i64 = raw
            .zadd(
                timeout_key("no-wait"),
                None,
                None,
                false,
                false,
                (slot_end as f64, foreign),
            )
            .await
            .unwrap();
        let attempt = lock.try_lock(Duration::ZERO, None).await.unwrap();
        assert!(attempt.is_none(), "a no-wait attempt overtook a waiter");
        assert_eq!(queue(&raw, "no-wait").await, vec![foreign.to_string()]);
        assert!(!lock.is_locked().await.unwrap());

        // An entry without a place is garbage (no live waiter lacks one): it is dropped.
        let _: i64 = raw.zrem(timeout_key("no-wait"), foreign).await.unwrap();
        // An inspection shows it as it is: in line, with no place left.
        let inspection = lock.inspect().await.unwrap();
        let line: Vec<(&str, Option<Duration>)> = inspection
            .queue
            .iter()
            .map(|waiter| (waiter.owner.as_str(), waiter.place_left))
            .collect();
        assert_eq!(line, [(foreign, None)], "{inspection:?}");
        let guard = lock
            .try_lock(Duration::ZERO, None)
            .await
            .unwrap()
            .expect("free, and nobody really waiting");
        assert!(line_is_empty(&raw, "no-wait").await);
        guard.unlock().await.unwrap();
    })
    .await;
}

/// The wire layout of DESIGN.md §4: the queue and timeout keys, places timed by the server's
/// clock, per-waiter channels, and exactly one message per release, to the first waiter only.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn wire_layout_and_one_message_per_release() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let place = Duration::from_secs(3);
        let client = server.fair_client(place).await;
        let (listener, mut messages) = listening(&server, "redisson_lock__channel:{layout}*").await;

        let holder = client.fair_lock("layout").lock().await.unwrap();
        let (tasks, order) = line_up(
            &[&client],
            "layout",
            3,
            Duration::from_millis(30),
            Duration::from_millis(30),
        )
        .await;
        let line = queue(&raw, "layout").await;
        assert_eq!(line.len(), 3);
        let prefix = format!("{}:", client.id());
        assert!(line.iter().all(|field| field.starts_with(&prefix)));
        // Places expire one wait timeout after the waiter's last attempt, by the server's clock.
        let server_now = server_time_ms(&raw).await;
        let mut last_ends_in = 0;
        for field in &line {
            let end: f64 = raw.zscore(timeout_key("layout"), field).await.unwrap();
            let ahead = end as i64 - server_now as i64;
            assert!(
                ahead > 0 && ahead <= place.as_millis() as i64,
                "place ends {ahead} ms ahead"
            );
            last_ends_in = last_ends_in.max(ahead);
        }
        // The queue keys outlive the last place by at most two places (they are extended only
        // when they would not outlive a new one), so a line of dead waiters leaves nothing
        // for long.
        for key in [queue_key("layout"), timeout_key("layout")] {
            let ttl: i64 = raw.pttl(&key).await.unwrap();
            // Read a moment after the clock: a few ms of slack.
            assert!(
                ttl + 20 >= last_ends_in && ttl <= 2 * place.as_millis() as i64,
                "{key} ttl {ttl}, last place ends in {last_ends_in} ms"
            );
        }

        holder.unlock().await.unwrap();
        assert_eq!(served(tasks, order).await, vec![0, 1, 2]);
        let mut heard = Vec::new();
        while let Ok(Ok(message)) =
            tokio::time::timeout(Duration::from_millis(300), messages.recv()).await
        {
            heard.push((
                message.channel.to_string(),
                message.value.as_string().unwrap(),
            ));
        }
        // The holder's and each waiter's final release: one message each, to the next in line.
        let expected: Vec<(String, String)> = line
            .iter()
            .map(|field| {
                (
                    format!("redisson_lock__channel:{{layout}}:{field}"),
                    "0".to_string(),
                )
            })
            .collect();
        assert_eq!(heard, expected);
        assert!(line_is_empty(&raw, "layout").await);
        listener.quit().await.unwrap();
    })
    .await;
}

/// A force unlock deletes the lock whoever holds it and tells its first waiter only, who is
/// served first; before it, an inspection shows the holder and the line in order, each place
/// with the time it has left.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_force_unlock_tells_the_first_waiter_and_an_inspection_shows_the_line() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let place = Duration::from_secs(3);
        let client = server.fair_client(place).await;
        let (listener, mut messages) = listening(&server, "redisson_lock__channel:{forced}*").await;

        let holder = client.fair_lock("forced").lock().await.unwrap();
        let (tasks, order) = line_up(
            &[&client],
            "forced",
            2,
            Duration::from_millis(30),
            Duration::from_millis(30),
        )
        .await;
        assert!(queue_reaches(&raw, "forced", 2).await);
        let line = queue(&raw, "forced").await;
        let inspection = client.fair_lock("forced").inspect().await.unwrap();
        let holders: Vec<&str> = inspection
            .holders
            .iter()
            .map(|h| h.owner.as_str())
            .collect();
        assert_eq!(holders, [holder.owner_field()], "{inspection:?}");
        let waiters: Vec<&String> = inspection.queue.iter().map(|w| &w.owner).collect();
        assert_eq!(waiters, line.iter().collect::<Vec<_>>(), "{inspection:?}");
        assert!(
            inspection.queue.iter().all(|w| w
                .place_left
                .is_some_and(|left| left > Duration::ZERO && left <= place)),
            "{inspection:?}"
        );

        let other = server.fair_client(place).await;
        assert!(other.fair_lock("forced").force_unlock().await.unwrap());
        let told = tokio::time::timeout(Duration::from_secs(2), messages.recv())
            .await
            .expect("a message at the force unlock")
            .unwrap();
        assert_eq!(
            told.channel.to_string(),
            format!("redisson_lock__channel:{{forced}}:{}", line[0]),
            "the first waiter, and only it, is told"
        );
        // Redisson's unlock message, which a Redisson waiter checks before it tries again.
        assert_eq!(told.value.as_string().as_deref(), Some("0"));
        tokio::time::timeout(Duration::from_secs(5), holder.lost())
            .await
            .expect("the holder learns of the force unlock");
        drop(holder);
        assert_eq!(served(tasks, order).await, vec![0, 1]);
        listener.quit().await.unwrap();
        other.shutdown().await;
    })
    .await;
}

/// 6. Sixteen tasks over two clients contend for 5 s: acquisitions per task differ by at most
///    1.5x, and no wait spans more than 16 other tasks' critical sections (with their hand-offs).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contention_is_shared_evenly() {
    bounded(async {
        let server = RedisServer::start();
        let clients = [
            server.fair_client(fredlock::DEFAULT_QUEUE_PLACE).await,
            server.fair_client(fredlock::DEFAULT_QUEUE_PLACE).await,
        ];
        let started = Instant::now();
        let run_for = Duration::from_secs(5);
        // (task, asked at, acquired at) for every acquisition.
        let log = Arc::new(Mutex::new(Vec::<(usize, Instant, Instant)>::new()));
        let mut tasks = Vec::new();
        for task in 0..16 {
            let lock = clients[task % 2].fair_lock("contended");
            let log = log.clone();
            tasks.push(tokio::spawn(async move {
                while started.elapsed() < run_for {
                    let asked = Instant::now();
                    let guard = lock.lock().await.unwrap();
                    log.lock().unwrap().push((task, asked, Instant::now()));
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    guard.unlock().await.unwrap();
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        let log = log.lock().unwrap();
        let mut per_task: HashMap<usize, usize> = HashMap::new();
        for (task, _, _) in log.iter() {
            *per_task.entry(*task).or_default() += 1;
        }
        assert_eq!(per_task.len(), 16, "some task never acquired");
        let max = *per_task.values().max().unwrap();
        let min = *per_task.values().min().unwrap();
        let spread = max as f64 / min as f64;
        // How many acquisitions happened while each one waited.
        let mut acquired_at: Vec<Instant> = log.iter().map(|(_, _, at)| *at).collect();
        acquired_at.sort();
        let mut longest = (0usize, Duration::ZERO);
        for (_, asked, at) in log.iter() {
            let overtaken = acquired_at.partition_point(|t| t < at)
                - acquired_at.partition_point(|t| t <= asked);
            if overtaken > longest.0 {
                longest = (overtaken, at.duration_since(*asked));
            }
        }
        let longest_wait = log
            .iter()
            .map(|(_, asked, at)| at.duration_since(*asked))
            .max()
            .unwrap();
        println!(
            "{} acquisitions in {run_for:?}; per task {min}..{max} (spread {spread:.2}); \
             most critical sections waited through {} ({:?}); longest wait {longest_wait:?}",
            log.len(),
            longest.0,
            longest.1
        );
        assert!(spread <= 1.5, "spread {spread:.2}: {per_task:?}");
        assert!(
            longest.0 <= 16,
            "a waiter waited through {} critical sections",
            longest.0
        );
    })
    .await;
}

/// On a cluster the fair lock's keys share the lock's cluster slot, and hand-offs go by publish.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fair_lock_on_a_cluster() {
    bounded(async {
        let cluster = RedisCluster::start();
        let raw = cluster.raw().await;
        let client = common::builder().url(cluster.url()).build().await.unwrap();
        let holder = client.fair_lock("clustered").lock().await.unwrap();
        let (tasks, order) = line_up(
            &[&client],
            "clustered",
            4,
            Duration::from_millis(10),
            Duration::from_millis(30),
        )
        .await;
        assert_eq!(queue(&raw, "clustered").await.len(), 4);
        holder.unlock().await.unwrap();
        let unlocked = Instant::now();
        assert_eq!(served(tasks, order).await, vec![0, 1, 2, 3]);
        // Woken by messages, not by the 30 s lease or a place.
        assert!(unlocked.elapsed() < Duration::from_secs(1));
    })
    .await;
}

/// A non-reentrant fair lock refuses its holder at once, without taking a place in the queue,
/// and serves other owners in order as any fair lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_reentrant_fair_lock_refuses_its_holder_without_queueing() {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        let client = server.lock_client(Duration::from_secs(30)).await;
        let lock = client.non_reentrant_fair_lock("fair-once");
        assert!(!lock.is_reentrant());
        let guard = lock.lock().await.unwrap();
        match lock.try_lock(Duration::from_secs(5), None).await {
            Err(fredlock::Error::WouldDeadlock { owner, .. }) => {
                assert_eq!(owner, guard.owner_field())
            }
            other => panic!("expected WouldDeadlock, got {other:?}"),
        }
        let queued: i64 = raw.llen(common::queue_key("fair-once")).await.unwrap();
        assert_eq!(queued, 0, "a refused re-entry took a place in the queue");
        let waiter = tokio::spawn({
            let lock = lock.clone();
            async move { lock.lock().await.unwrap().unlock().await.unwrap() }
        });
        assert!(
            eventually(Duration::from_secs(2), || async {
                raw.llen::<i64, _>(common::queue_key("fair-once"))
                    .await
                    .unwrap()
                    == 1
            })
            .await
        );
        guard.unlock().await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .unwrap()
            .unwrap();
        client.shutdown().await;
    })
    .await;
}

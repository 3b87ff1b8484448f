//! A tenant's configuration read by many workers at once and rewritten by one, with a
//! read-write lock: readers share, a writer waits only for the readers already inside (new
//! readers queue behind it), a writer may keep reading after it wrote (downgrade), and a reader
//! asking to write is refused at once instead of waiting for itself.
//!
//! ```text
//! cargo run --example rw_lock
//! ```
//!
//! Uses the Redis at `REDIS_URL` when it is set; otherwise starts a throw-away `redis-server`
//! (which must be on PATH) on a free loopback port and stops it at the end.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fred::interfaces::KeysInterface;
use fredlock::{Error, LockClient};
use tokio::time::Instant;

mod throwaway;

use throwaway::redis_url;

const CONFIG: &str = "example:tenant-7:config";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (_server, url) = redis_url()?;
    // Two service instances.
    let instances = [
        LockClient::connect(&url).await?,
        LockClient::connect(&url).await?,
    ];
    let redis = instances[0].redis().ok_or("a client on fred")?.clone();
    let _: () = redis.set(CONFIG, "version 1", None, None, false).await?;

    // Eight workers keep reading the configuration, each holding the read lock for 20 ms; the
    // holds overlap, so the lock is never free of readers.
    let stop = Arc::new(AtomicBool::new(false));
    let most_inside = Arc::new(AtomicUsize::new(0));
    let inside = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for worker in 0..8 {
        let config = instances[worker % 2].rw_lock("example:tenant-7");
        let redis = instances[worker % 2]
            .redis()
            .ok_or("a client on fred")?
            .clone();
        let (stop, inside, most_inside) = (stop.clone(), inside.clone(), most_inside.clone());
        workers.push(tokio::spawn(async move {
            let mut versions_seen = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                let read = config.read_lock().lock().await?;
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                most_inside.fetch_max(now, Ordering::SeqCst);
                let version: String = redis.get(CONFIG).await?;
                if versions_seen.last() != Some(&version) {
                    versions_seen.push(version);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                read.unlock().await?;
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(versions_seen)
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;

    // An administrator rewrites it. Without writer preference it could wait as long as the
    // readers keep overlapping; with it, it waits for the readers inside, and new ones wait.
    let config = instances[0].rw_lock("example:tenant-7");
    let asked = Instant::now();
    let write = config
        .write_lock()
        .try_lock(Duration::from_secs(5), None)
        .await?
        .ok_or("the writer did not get the lock in 5 s")?;
    println!(
        "the writer got the lock after {:?}, amid 8 readers",
        asked.elapsed()
    );
    let _: () = redis.set(CONFIG, "version 2", None, None, false).await?;

    // Downgrade: read what was written before letting writers in again.
    let read = config.read_lock().lock().await?;
    write.unlock().await?;
    let version: String = redis.get(CONFIG).await?;
    println!("after the downgrade the writer reads {version:?}");

    // Upgrade: a reader that asks for the write lock would wait for itself; it is refused.
    match config.write_lock().lock().await {
        Err(Error::WouldDeadlock { .. }) => println!("a reader asking to write is refused at once"),
        other => return Err(format!("expected WouldDeadlock, got {other:?}").into()),
    }
    read.unlock().await?;

    tokio::time::sleep(Duration::from_millis(100)).await;
    stop.store(true, Ordering::SeqCst);
    for worker in workers {
        let versions = worker.await?.map_err(|error| error.to_string())?;
        // A reader never sees the configuration go back: version 1 until the write, then 2.
        assert!(
            versions == ["version 1", "version 2"] || versions == ["version 2"],
            "{versions:?}"
        );
    }
    println!("every worker read version 1, then version 2");
    println!(
        "readers inside at once, at most: {}",
        most_inside.load(Ordering::SeqCst)
    );

    let _: i64 = redis.del(CONFIG).await?;
    for instance in instances {
        instance.shutdown().await;
    }
    Ok(())
}

//! Locks on a Redis Sentinel deployment, and a lock that outlives a failover.
//!
//! ```text
//! cargo run --example sentinel
//! REDIS_SENTINELS=10.0.0.1:26379,10.0.0.2:26379 REDIS_SERVICE=locks REDIS_REPLICAS=2 cargo run --example sentinel
//! ```
//!
//! Uses the sentinels in `REDIS_SENTINELS` watching `REDIS_SERVICE`, whose master has
//! `REDIS_REPLICAS` replicas (2 unless set), when they are set (and then does not fail anything
//! over); otherwise starts a throw-away master, two replicas and a sentinel
//! (`redis-server` must be on PATH), and has the sentinel fail the master over while the lock is
//! held. Every change waits for every replica (replica sync), so the lock survives the failover
//! whichever replica Sentinel promotes.

use std::time::Duration;

use fred::prelude::*;
use fredlock::{LockClient, ReplicaSync};

mod throwaway;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (_setup, sentinels, service) = match std::env::var("REDIS_SENTINELS") {
        Ok(list) => {
            let service = std::env::var("REDIS_SERVICE").unwrap_or_else(|_| "mymaster".into());
            let mut sentinels = Vec::new();
            for address in list.split(',') {
                let (host, port) = address
                    .rsplit_once(':')
                    .ok_or("REDIS_SENTINELS: host:port,host:port..")?;
                sentinels.push((host.to_string(), port.parse::<u16>()?));
            }
            (None, sentinels, service)
        }
        Err(_) => {
            let setup = throwaway::ThrowAwaySentinel::start("fredlock-example")?;
            let sentinels = vec![("127.0.0.1".to_string(), setup.sentinel.port())];
            println!(
                "started a throw-away master on {}, two replicas and a sentinel on {}",
                setup.master.port(),
                setup.sentinel.port()
            );
            (Some(setup), sentinels, "fredlock-example".to_string())
        }
    };

    // The sentinels are asked for the master; after a failover the client follows the new one.
    // With passwords: `.credentials(None, "..")` for the servers, `.sentinel_credentials(..)`
    // for the sentinels. The same as a URL:
    // `redis-sentinel://10.0.0.1:26379?sentinelServiceName=locks&node=10.0.0.2:26379`.
    //
    // Replication is asynchronous: a replica promoted before a lock reached it comes up
    // without it. Replica sync makes every change wait until every replica has it, so a lock
    // that `lock()` returned survives the failover whichever replica is promoted (Sentinel
    // picks by an `INFO` up to a second old, so waiting for fewer is a gamble). Renewals wait
    // for every replica too, and right after a failover the new master has fewer: Sentinel
    // turns the old master into its replica only at its next look (10-20 s later). The lease
    // leaves room for that: its renew deadline (two thirds of it, 40 s) is well past it.
    let replicas = std::env::var("REDIS_REPLICAS").map_or(Ok(2), |count| count.parse())?;
    let client = LockClient::builder()
        .sentinel(service.as_str(), sentinels.iter().cloned())
        .watchdog_lease(Duration::from_secs(60))
        .replica_sync(ReplicaSync::replicas(replicas).timeout(Duration::from_secs(1)))
        .build()
        .await?;
    println!("connected to the master of {service:?}");

    let lock = client.lock("sentinel-example:nightly-report");
    let guard = lock.lock().await?;
    println!("holding {:?}", lock.name());

    if _setup.is_some() {
        fail_over(&sentinels[0], &service).await?;
        // Past the renewal that needs the old master back as a replica (every 20 s, retried
        // each second while it fails): the lock is renewed on the new master.
        tokio::time::sleep(Duration::from_secs(25)).await;
        println!(
            "after the failover: lost = {}, still held = {}, TTL {:?}",
            guard.is_lost(),
            lock.is_held_by_current_task().await?,
            lock.remaining_lease().await?
        );
    }

    guard.unlock().await?;
    println!("released");
    client.shutdown().await;
    Ok(())
}

/// Asks the sentinel to promote the replica (`SENTINEL FAILOVER`), retrying until it knows one.
async fn fail_over(
    (host, port): &(String, u16),
    service: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let sentinel =
        Builder::from_config(Config::from_url(&format!("redis://{host}:{port}"))?).build()?;
    sentinel.init().await?;
    for _ in 0..100 {
        let reply: Result<String, _> = sentinel
            .custom(fred::cmd!("SENTINEL"), vec!["FAILOVER", service])
            .await;
        if reply.is_ok() {
            println!("the sentinel is failing the master over");
            sentinel.quit().await?;
            return Ok(());
        }
        // NOGOODSLAVE until the sentinel has found the replica.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err("the sentinel did not fail over".into())
}

//! Issue 58: whatever a server refuses part-way through what a client sends (a server turned
//! replica under it, memory full with `noeviction`, too few replicas for `min-replicas-to-write`,
//! a cluster slot in migration), no key of the crate is left without a TTL, every error names
//! the refusal and the lock, the next calls work once it ends, and nothing held is given to two
//! owners. (A permission taken away is `tests/acl.rs`'s.) Each walk is `common::refusal`'s.

mod common;

use std::time::Duration;

use common::refusal::{under_refusal, Marks};
use common::{bounded, free_port, redis_cli, RedisCluster, RedisServer};
use fred::prelude::*;

/// The walk on one server: `setup` sent first (before the clients connect), then the refusal
/// turned on by `refuse` and off by `restore` (each a command line sent by a plain client),
/// whose errors show `mark`.
async fn on_one_server(tag: &str, mark: &str, setup: &[&str], refuse: &str, restore: &str) {
    bounded(async {
        let server = RedisServer::start();
        let raw = server.raw().await;
        for line in setup {
            send_line(&raw, line).await;
        }
        let a = server.lock_client(Duration::from_secs(1)).await;
        let b = server.lock_client(Duration::from_secs(1)).await;
        under_refusal(
            std::slice::from_ref(&raw),
            &a,
            &b,
            tag,
            "",
            Marks::Refused(&[mark]),
            send_line(&raw, refuse),
            send_line(&raw, restore),
        )
        .await;
        a.shutdown().await;
        b.shutdown().await;
    })
    .await;
}

/// Sends one command line (its first word the command) on `raw`, which must accept it.
async fn send_line(raw: &Client, line: &str) {
    let mut words = line.split_whitespace().map(str::to_owned);
    let command = words.next().expect("a command");
    let args: Vec<String> = words.collect();
    let _: Value = raw
        .custom(fred::cmd!(command.clone()), args.clone())
        .await
        .unwrap_or_else(|error| panic!("{command} {args:?}: {error}"));
}

/// `REPLICAOF` a master that is not there: the server keeps its data and refuses every write
/// with READONLY until `REPLICAOF NO ONE`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_turned_replica_under_the_client_leaves_no_key_without_a_ttl() {
    let nobody = format!("REPLICAOF 127.0.0.1 {}", free_port());
    on_one_server("replica", "READONLY", &[], &nobody, "REPLICAOF NO ONE").await;
}

/// `maxmemory` reached with `noeviction`: every command that may grow memory is refused with OOM
/// (in a script, only before its first write: Redis keeps a script's writes whole).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_full_with_noeviction_leaves_no_key_without_a_ttl() {
    on_one_server(
        "oom",
        "OOM",
        &["CONFIG SET maxmemory-policy noeviction"],
        "CONFIG SET maxmemory 1",
        "CONFIG SET maxmemory 0",
    )
    .await;
}

/// `min-replicas-to-write` unmet: every write is refused with NOREPLICAS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_few_replicas_leave_no_key_without_a_ttl() {
    on_one_server(
        "replicas",
        "NOREPLICAS",
        &[],
        "CONFIG SET min-replicas-to-write 1",
        "CONFIG SET min-replicas-to-write 0",
    )
    .await;
}

/// Every slot the walk's names under `tag` hash to (a job lock's key is its name after
/// `job-lock:default:`; every other primitive's keys share its name's slot).
fn slots_of(tag: &str) -> std::collections::BTreeSet<u16> {
    let mut names = vec![format!("{tag}-held"), format!("{tag}-queued")];
    for suffix in [
        "lock",
        "fair",
        "spin",
        "fenced",
        "rw",
        "semaphore",
        "permits",
        "latch",
        "leader",
    ] {
        names.push(format!("{tag}-under-{suffix}"));
    }
    names.push(format!("job-lock:default:{tag}-under-job"));
    for suffix in common::refusal::HELD {
        match suffix {
            "-force-job" => names.push(format!("job-lock:default:{tag}{suffix}")),
            _ => names.push(format!("{tag}{suffix}")),
        }
    }
    names
        .iter()
        .map(|name| fred::util::redis_keyslot(name.as_bytes()))
        .collect()
}

/// A slot in migration: keys still on the source are served there, others are redirected (ASK)
/// to the target, and a call whose keys are split between them is refused (TRYAGAIN) until
/// the migration ends. Every slot the walk uses migrates to another master, its keys held and
/// waited on move with `MIGRATE`, and the slot is handed over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_slot_in_migration_leaves_no_key_without_a_ttl() {
    bounded(async {
        let cluster = RedisCluster::start();
        let ports: Vec<u16> = cluster.nodes.iter().map(|node| node.port()).collect();
        let mut raws = Vec::new();
        for node in &cluster.nodes {
            raws.push(node.raw().await);
        }
        // A call refused while connected is sent again until one command timeout from its
        // first send: 1 s here, so that the walk's calls end within the waiters' wait.
        let client = || async {
            common::builder()
                .url(cluster.url())
                .watchdog_lease(Duration::from_secs(1))
                .command_timeout(Duration::from_secs(1))
                .build()
                .await
                .unwrap()
        };
        let a = client().await;
        let b = client().await;
        // (slot, source, target): each slot moves to the next master.
        let moves: Vec<(String, u16, u16)> = slots_of("mig")
            .into_iter()
            .map(|slot| {
                let source = cluster.master_of(&format!("{{{}}}", slot_key(slot)));
                let at = ports.iter().position(|port| *port == source).unwrap();
                (slot.to_string(), source, ports[(at + 1) % ports.len()])
            })
            .collect();
        let ids: Vec<String> = ports.iter().map(|port| cluster.node_id(*port)).collect();
        let id = |port: u16| ids[ports.iter().position(|p| *p == port).unwrap()].clone();
        let refuse = async {
            for (slot, source, target) in &moves {
                let importing = redis_cli(
                    *target,
                    &["cluster", "setslot", slot, "importing", &id(*source)],
                );
                assert!(importing.contains("OK"), "{importing}");
                let migrating = redis_cli(
                    *source,
                    &["cluster", "setslot", slot, "migrating", &id(*target)],
                );
                assert!(migrating.contains("OK"), "{migrating}");
            }
        };
        let restore = async {
            for (slot, source, target) in &moves {
                loop {
                    let keys = redis_cli(*source, &["cluster", "getkeysinslot", slot, "100"]);
                    let keys: Vec<&str> = keys.split_whitespace().collect();
                    if keys.is_empty() {
                        break;
                    }
                    let target_port = target.to_string();
                    let mut args = vec![
                        "migrate",
                        "127.0.0.1",
                        &target_port,
                        "",
                        "0",
                        "5000",
                        "KEYS",
                    ];
                    args.extend(keys);
                    let moved = redis_cli(*source, &args);
                    assert!(moved.contains("OK"), "MIGRATE: {moved}");
                }
                let owner = id(*target);
                for port in [*target, *source].iter().chain(ports.iter()) {
                    redis_cli(*port, &["cluster", "setslot", slot, "node", &owner]);
                }
            }
            cluster.await_ok(Duration::from_secs(10));
        };
        // A call sent by itself is refused, once its command timeout has passed, naming `ASK`
        // (fred, which sends each command once, does not follow one) or `TRYAGAIN` (redis-rs
        // follows the `ASK`, and a script creating keys in a half-moved slot meets `TRYAGAIN`
        // until the move ends); an acquisition whose wait ends first names the same.
        let marks = Marks::MayBeRefused(&["ASK", "TRYAGAIN"]);
        under_refusal(&raws, &a, &b, "mig", "", marks, refuse, restore).await;
        a.shutdown().await;
        b.shutdown().await;
    })
    .await;
}

/// A key of `slot`: its text hashes there (found by counting up).
fn slot_key(slot: u16) -> String {
    (0u64..)
        .map(|n| n.to_string())
        .find(|key| fred::util::redis_keyslot(key.as_bytes()) == slot)
        .unwrap()
}

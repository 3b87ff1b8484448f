//! [`LockClient::check_deployment`]: what the Redis deployment under the locks is, and what in
//! its configuration can break them.

use std::collections::HashMap;
use std::fmt;

use crate::client::LockClient;
use crate::engine::replicas::{config_get, WaitSupport};
use crate::engine::{Connection, Server};
use crate::error::{Error, Result};

/// How the client reaches Redis.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Topology {
    /// One server, found by its address.
    Standalone,
    /// A master found through Redis Sentinel under `service`.
    Sentinel {
        /// The name the sentinels monitor the master by.
        service: String,
    },
    /// A Redis Cluster; each master is checked.
    Cluster,
}

/// What one master reported about itself.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct NodeReport {
    /// `host:port`.
    pub server: String,
    /// `"redis"` or `"valkey"`.
    pub flavour: String,
    /// The server's own version (`valkey_version` for Valkey, else `redis_version`).
    pub version: String,
    /// `master` or `slave`, as `INFO replication` says.
    pub role: String,
    /// Replicas connected to it.
    pub replicas: u32,
    /// Whether it runs `WAIT` (proxies and some managed services refuse it).
    pub wait: bool,
    /// Whether it runs `WAITAOF` (Redis 7.2 and later).
    pub waitaof: bool,
    /// `maxmemory` in bytes (0: no limit); `None` when `CONFIG GET` is refused.
    pub maxmemory: Option<u64>,
    /// `maxmemory-policy`; `None` when `CONFIG GET` is refused.
    pub maxmemory_policy: Option<String>,
    /// Whether the append-only file is on; `None` when `CONFIG GET` is refused.
    pub appendonly: Option<bool>,
    /// The RDB `save` schedule (empty: no snapshots); `None` when `CONFIG GET` is refused.
    pub save: Option<String>,
}

/// The deployment check's report: see [`LockClient::check_deployment`]. Its `Display` is a
/// human-readable summary, warnings last.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Deployment {
    /// How the client reaches Redis.
    pub topology: Topology,
    /// One report per master (one outside a cluster).
    pub nodes: Vec<NodeReport>,
    /// What in the deployment can break the locks' guarantees, each naming the server and the
    /// setting. Empty when nothing was found.
    pub warnings: Vec<String>,
}

impl LockClient {
    /// Asks every master what it is and how it is configured, and warns about what can break
    /// the locks:
    ///
    /// - an eviction policy that can delete lock keys (`allkeys-*`, or `volatile-*` with a
    ///   `maxmemory` set: every lock key has a TTL) or fence counters (`allkeys-*`);
    /// - no persistence (no AOF, no RDB snapshots): a restart empties the server, so every lock
    ///   is gone and the fencing token counters are seeded again from the server clock (tokens
    ///   keep increasing only while that clock does not step back);
    /// - no replicas behind Sentinel or in a cluster (nothing to fail over to), and
    ///   asynchronous replication where there are replicas (a failover can lose a lock taken
    ///   just before it) unless [`replica_sync`](crate::LockClientBuilder::replica_sync) is on;
    /// - fewer replicas connected than `replica_sync` asks for (every acquisition then fails);
    /// - a server that refuses `WAIT`, or `CONFIG GET` (the memory and persistence checks are
    ///   then skipped and say so).
    ///
    /// Read-only: it sends `INFO`, `CONFIG GET`, `WAIT 0` and `WAITAOF 0 0` (with no timeout
    /// to wait out) and changes nothing.
    ///
    /// ```no_run
    /// # async fn demo(client: fredlock::LockClient) -> fredlock::Result<()> {
    /// let report = client.check_deployment().await?;
    /// println!("{report}");
    /// for warning in &report.warnings {
    ///     tracing::warn!("{warning}");
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Redis`] when a master cannot be reached or refuses `INFO`.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn check_deployment(&self) -> Result<Deployment> {
        let redis = self.engine().core().redis();
        let topology = match redis.sentinel_service() {
            Some(service) => Topology::Sentinel { service },
            None if redis.is_clustered() => Topology::Cluster,
            None => Topology::Standalone,
        };
        let mut nodes = Vec::new();
        if topology == Topology::Cluster {
            for master in self.engine().core().masters() {
                let server = master.to_string();
                nodes.push(check_node(&redis.on_node(master), server).await?);
            }
        } else {
            let server = redis.connected_to().first().map_or_else(
                || self.engine().core().address.to_string(),
                Server::to_string,
            );
            nodes.push(check_node(redis, server).await?);
        }
        let needed = self.engine().core().writer.replicas_needed();
        let warnings = nodes
            .iter()
            .flat_map(|node| node_warnings(&topology, node, needed))
            .collect();
        Ok(Deployment {
            topology,
            nodes,
            warnings,
        })
    }
}

/// What the master `node` (named `server`) says of itself.
async fn check_node(node: &Connection, server: String) -> Result<NodeReport> {
    let server_name = &server;
    let info = |section: &'static str| async move {
        let text: String = node
            .command("INFO", vec![section.into()])
            .await
            .map_err(|source| Error::Redis {
                context: format!("checking the deployment: INFO {section}"),
                server: server_name.clone(),
                source,
            })?;
        Ok::<_, Error>(parse_info(&text))
    };
    let server_info = info("server").await?;
    let replication = info("replication").await?;
    let (flavour, version) = flavour(&server_info);
    // One setting at a time: `CONFIG GET a b` needs Redis 7.
    let mut config = HashMap::new();
    for name in ["maxmemory", "maxmemory-policy", "appendonly", "save"] {
        if let Some(value) = config_get(node, name).await {
            config.insert(name, value);
        }
    }
    let support = WaitSupport::probe(node).await;
    Ok(NodeReport {
        server,
        flavour: flavour.into(),
        version,
        role: replication.get("role").cloned().unwrap_or_default(),
        replicas: replication
            .get("connected_slaves")
            .and_then(|count| count.parse().ok())
            .unwrap_or(0),
        wait: support.wait.is_ok(),
        waitaof: support.waitaof,
        maxmemory: config.get("maxmemory").and_then(|value| value.parse().ok()),
        maxmemory_policy: config.get("maxmemory-policy").cloned(),
        appendonly: config.get("appendonly").map(|value| value == "yes"),
        save: config.get("save").cloned(),
    })
}

/// The server's flavour and its own version from `INFO server`: Valkey reports
/// `valkey_version` (and a `redis_version` of the Redis it is compatible with).
fn flavour(server_info: &HashMap<String, String>) -> (&'static str, String) {
    match server_info.get("valkey_version") {
        Some(version) => ("valkey", version.clone()),
        None => (
            "redis",
            server_info
                .get("redis_version")
                .cloned()
                .unwrap_or_default(),
        ),
    }
}

/// `INFO` text as field -> value.
fn parse_info(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter_map(|line| line.trim().split_once(':'))
        .map(|(field, value)| (field.to_string(), value.to_string()))
        .collect()
}

/// What in one master's report can break the locks; `needed` is what replica sync asks for.
fn node_warnings(topology: &Topology, node: &NodeReport, needed: u32) -> Vec<String> {
    let server = &node.server;
    let mut warnings = Vec::new();
    if needed > node.replicas {
        warnings.push(format!(
            "{server}: replica_sync asks for {needed} replica(s), but {} are connected: every \
             acquisition fails with NotReplicated until enough replicas are back",
            node.replicas
        ));
    }
    match (&node.maxmemory_policy, node.maxmemory) {
        (Some(policy), _) if policy.starts_with("allkeys-") => warnings.push(format!(
            "{server}: maxmemory-policy {policy} may evict any key, held locks and fence \
             counters included: a lock can vanish while its holder works. Use noeviction (or \
             volatile-* on a server that keeps locks only)"
        )),
        (Some(policy), Some(limit)) if policy.starts_with("volatile-") && limit > 0 => warnings
            .push(format!(
                "{server}: maxmemory-policy {policy} with maxmemory {limit} may evict keys with \
                 a TTL, and every lock key has one: a lock can vanish while its holder works. \
                 Use noeviction"
            )),
        (None, _) => warnings.push(format!(
            "{server}: CONFIG GET is refused, so the eviction policy and persistence are \
             unknown; check that nothing evicts lock keys and that fence counters persist"
        )),
        _ => {}
    }
    let snapshots = node
        .save
        .as_deref()
        .is_some_and(|save| !save.trim().is_empty());
    if node.appendonly == Some(false) && node.save.is_some() && !snapshots {
        warnings.push(format!(
            "{server}: no persistence (appendonly no, no save schedule): a restart empties the \
             server, every lock is gone and fencing tokens are seeded again from the server clock \
             (they keep increasing only while it does not step back)"
        ));
    }
    if !node.wait {
        warnings.push(format!(
            "{server}: WAIT is refused (a proxy or managed service?): replica sync cannot be used"
        ));
    }
    match (topology, node.replicas) {
        (Topology::Standalone, _) => {}
        (_, 0) => warnings.push(format!(
            "{server}: a master without replicas: if it fails there is nothing to fail over to"
        )),
        (_, replicas) if needed == 0 => warnings.push(format!(
            "{server}: {replicas} replica(s), replicated asynchronously: a failover may promote \
             a replica that never saw a lock taken just before it, and that lock is then free \
             twice (replica_sync closes this)"
        )),
        _ => {}
    }
    warnings
}

impl fmt::Display for Deployment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.topology {
            Topology::Standalone => writeln!(f, "standalone server")?,
            Topology::Sentinel { service } => writeln!(f, "Sentinel, service {service:?}")?,
            Topology::Cluster => writeln!(f, "cluster of {} masters", self.nodes.len())?,
        }
        let unknown = || "unknown".to_string();
        for node in &self.nodes {
            writeln!(
                f,
                "  {} {} {} ({}, {} replica(s)): WAIT {}, WAITAOF {}, maxmemory {} ({}), \
                 appendonly {}, save {:?}",
                node.server,
                node.flavour,
                node.version,
                node.role,
                node.replicas,
                if node.wait { "yes" } else { "no" },
                if node.waitaof { "yes" } else { "no" },
                node.maxmemory
                    .map_or_else(unknown, |limit| limit.to_string()),
                node.maxmemory_policy.clone().unwrap_or_else(unknown),
                node.appendonly
                    .map_or_else(unknown, |on| if on { "yes" } else { "no" }.to_string()),
                node.save.clone().unwrap_or_else(unknown),
            )?;
        }
        for warning in &self.warnings {
            writeln!(f, "warning: {warning}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valkey_is_told_from_redis() {
        let valkey = parse_info(
            "# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.0.2\r\n",
        );
        assert_eq!(flavour(&valkey), ("valkey", "8.0.2".to_string()));
        let redis = parse_info("# Server\r\nredis_version:7.0.15\r\nredis_mode:standalone\r\n");
        assert_eq!(flavour(&redis), ("redis", "7.0.15".to_string()));
    }
}

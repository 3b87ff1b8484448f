//! Following the master behind Sentinel the moment the sentinels switch to a new one.
//!
//! fred finds the master through the sentinels only when it (re)connects. A master that steps
//! down (`SENTINEL FAILOVER`, or a master that was cut off and comes back) keeps its clients and
//! keeps taking writes until the sentinels turn it into a replica, which they do only several
//! seconds later; everything written there in between is thrown away by the resync. So a
//! watcher listens on one sentinel for `+switch-master` (and asks it who the master is, in case
//! a message was missed) and reconnects every connection as soon as the master is another
//! server. The reconnect makes the watchdog renew every hold at once on the new master.

use std::time::Duration;

use std::sync::Arc;
use tokio::sync::broadcast::error::RecvError;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::engine::{Connection, Connector, Sentinels, Server, Subscriber};

use crate::error::RedisError;

/// The sentinels' channel announcing a new master:
/// `<service> <old ip> <old port> <new ip> <new port>`.
const SWITCH_MASTER: &str = "+switch-master";

/// How often the watcher asks its sentinel who the master is, and how long it waits for the
/// answer before it moves on to another sentinel.
const CHECK_EVERY: Duration = Duration::from_secs(1);

/// Pause before trying the next sentinel after one failed.
const RETRY_PAUSE: Duration = Duration::from_millis(500);

/// Starts the watcher when `connector` connects through Sentinel.
pub(super) fn follow(
    connector: Arc<Connector>,
    commands: Vec<Connection>,
    subscriber: Subscriber,
    shutdown: CancellationToken,
) -> Option<JoinHandle<()>> {
    let Sentinels { hosts, service } = connector.sentinels()?;
    let watcher = Watcher {
        sentinels: hosts,
        service,
        connector,
        commands,
        subscriber,
    };
    Some(tokio::spawn(watcher.run(shutdown)))
}

struct Watcher {
    sentinels: Vec<Server>,
    service: String,
    /// Makes the connection to a sentinel, with the client's credentials and TLS.
    connector: Arc<Connector>,
    /// The command connection first, then replica sync's own.
    commands: Vec<Connection>,
    subscriber: Subscriber,
}

impl Watcher {
    async fn run(self, shutdown: CancellationToken) {
        let mut next = 0;
        while !shutdown.is_cancelled() {
            let sentinel = &self.sentinels[next % self.sentinels.len()];
            next += 1;
            if let Err(error) = self.watch(sentinel, &shutdown).await {
                tracing::debug!(
                    sentinel = %sentinel,
                    service = %self.service,
                    %error,
                    "lost the sentinel that tells of master switches; trying the next"
                );
            }
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = tokio::time::sleep(RETRY_PAUSE) => {}
            }
        }
    }

    /// Watches through one sentinel until it fails or the client shuts down.
    async fn watch(
        &self,
        sentinel: &Server,
        shutdown: &CancellationToken,
    ) -> Result<(), RedisError> {
        // No reconnects: a sentinel that goes away ends this watch, and the next sentinel is
        // tried.
        let client = self.connector.sentinel(sentinel, CHECK_EVERY)?;
        let result = async {
            client.connect().await?;
            let mut messages = client.messages();
            client.subscribe(SWITCH_MASTER).await?;
            let mut check = tokio::time::interval(CHECK_EVERY);
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return Ok(()),
                    _ = check.tick() => {
                        let master: Option<(String, u16)> = client
                            .command(
                                "SENTINEL",
                                vec!["GET-MASTER-ADDR-BY-NAME".into(), self.service.as_str().into()],
                            )
                            .await?;
                        if let Some((host, port)) = master {
                            self.follow_master(&host, port, false).await;
                        }
                    }
                    message = messages.recv() => match message {
                        Ok(message) => {
                            let text = message.value.as_string().unwrap_or_default();
                            let mut words = text.split(' ');
                            if words.next() == Some(self.service.as_str()) {
                                let new = words.nth(2).zip(words.next());
                                if let Some((host, Ok(port))) =
                                    new.map(|(host, port)| (host, port.parse::<u16>()))
                                {
                                    self.follow_master(host, port, true).await;
                                }
                            }
                        }
                        Err(RecvError::Lagged(_)) => {}
                        Err(RecvError::Closed) => return Ok(()),
                    },
                }
            }
        }
        .await;
        client.quit().await;
        result
    }

    /// Reconnects each connection (commands, replica sync's, the subscriber) that is not on the
    /// master the sentinels name. Each is asked on its own: one that reconnected while the
    /// sentinels still disagreed may have gone back to the old master while the rest moved on,
    /// and its writes (and replica sync's `WAIT`s) would go there. A connection that is not
    /// connected at all is already on its way to the sentinels' master, and is hurried along
    /// only when a switch was `announced` (it may be waiting out a reconnect back-off).
    async fn follow_master(&self, host: &str, port: u16, announced: bool) {
        let on_master = |server: &Server| server.port == port && *server.host == *host;
        let astray = |on: &[Server]| {
            if on.is_empty() {
                announced
            } else {
                !on.iter().all(on_master)
            }
        };
        let commands: Vec<(&Connection, Vec<Server>)> = self
            .commands
            .iter()
            .map(|connection| (connection, connection.connected_to()))
            .filter(|(_, on)| astray(on))
            .collect();
        let subscriber = self.subscriber.connected_to();
        let subscriber_astray = astray(&subscriber);
        if commands.is_empty() && !subscriber_astray {
            return;
        }
        tracing::warn!(
            service = %self.service,
            master = %format_args!("{host}:{port}"),
            was = ?commands
                .iter()
                .flat_map(|(_, on)| on)
                .chain(subscriber_astray.then_some(&subscriber).into_iter().flatten())
                .map(ToString::to_string)
                .collect::<std::collections::BTreeSet<_>>(),
            connections = commands.len() + usize::from(subscriber_astray),
            "the sentinels switched to another master; reconnecting to it"
        );
        for (connection, _) in commands {
            connection.reconnect().await;
        }
        if subscriber_astray {
            self.subscriber.reconnect().await;
        }
    }
}

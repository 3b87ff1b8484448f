//! A cluster on redis-rs (issue 45): one [`Link`] per master, the slots read with
//! `CLUSTER SLOTS`, each call sent to its slot's master, once.
//!
//! redis-rs's own cluster connection sends a command again on its own after a broken
//! connection, and does not say when it has a new connection to a node; the engine needs both
//! (exactly-once scripts; the watchdog, the subscriber and replica sync follow each node's new
//! connections). So the cluster is made of the same links as one server: each announces its
//! new connections on the cluster's one channel, and the messages of all come in on one.
//!
//! A call is sent again only when the server says it did not run it: `MOVED` (the slot is
//! served elsewhere: the slots are read again, and the call goes there), `ASK` (the slot is
//! being moved: the call goes to the node named, behind `ASKING`), or a call that was never
//! written (no connection to the node: the slots are read again, and the call goes to the new
//! master when there is one).

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use redis::AsyncConnectionConfig;
use tokio::sync::broadcast;

use crate::engine::client::redis_rs::{announcements, read, sorted, Link, Seeds, Target};
use crate::engine::client::value::Message;
use crate::engine::client::{
    ConnectionLike, LinkLike, Messages, Reconnects, Route, SubscriberLike,
};
use crate::engine::join::join_all;
use crate::engine::{key_slot, FromValue, Key, ScanType, Sent, Server, Value};
use crate::error::{Failure, RedisError, RedisErrorKind};

/// The slots of a cluster.
const SLOTS: usize = 16384;

/// How often one call follows a redirect (`MOVED`, `ASK`) or a new master before it gives up.
const REDIRECTS: usize = 5;

/// How long a wait for every master's connection sleeps between two readings of the slots.
const WAIT_STEP: Duration = Duration::from_millis(100);

/// Messages buffered for the subscriber's reader, as one server's link buffers them.
const MESSAGE_BUFFER: usize = 4096;

/// Where a call goes on a cluster, when not by its first key.
#[derive(Clone, Debug)]
pub(crate) enum Pin {
    Node(Server),
    Slot(u16),
}

/// A cluster's masters, one link each. Clones share them.
#[derive(Clone)]
pub(crate) struct Cluster {
    shared: Arc<Shared>,
}

struct Shared {
    target: Target,
    seeds: Arc<Seeds>,
    /// A subscriber's cluster: its links carry subscriptions, whose confirmations redis-rs
    /// pairs with the oldest command waiting, so the slots are read on a connection of their
    /// own instead.
    subscribes: bool,
    table: RwLock<Table>,
    links: Mutex<HashMap<Server, Link>>,
    messages: broadcast::Sender<Message>,
    /// Every link's announcements; `None` once quit.
    reconnects: Mutex<Option<broadcast::Sender<Server>>>,
    /// Where classic channels are subscribed (any node hears every `PUBLISH` of a cluster).
    home: Mutex<Option<Server>>,
}

/// Which master serves each slot.
#[derive(Default)]
struct Table {
    /// Index into `masters` per slot; `u16::MAX` where no master serves it.
    owners: Vec<u16>,
    masters: Vec<Server>,
}

impl Table {
    fn owner(&self, slot: u16) -> Option<&Server> {
        let index = *self.owners.get(usize::from(slot))?;
        self.masters.get(usize::from(index))
    }
}

impl Cluster {
    /// The cluster `target` names (its seeds), not connected yet.
    pub(crate) fn new(target: Target, subscribes: bool) -> Result<Cluster, RedisError> {
        let seeds = target
            .seeds()
            .cloned()
            .ok_or_else(|| RedisError::unreadable("a cluster link without seeds".into()))?;
        let (messages, _) = broadcast::channel(MESSAGE_BUFFER);
        let (reconnects, _) = broadcast::channel(64);
        Ok(Cluster {
            shared: Arc::new(Shared {
                target,
                seeds,
                subscribes,
                table: RwLock::new(Table::default()),
                links: Mutex::new(HashMap::new()),
                messages,
                reconnects: Mutex::new(Some(reconnects)),
                home: Mutex::new(None),
            }),
        })
    }

    /// Reads the slots and connects to every master; returns once all are connected, or with
    /// the first error.
    pub(crate) async fn connect(&self) -> Result<(), RedisError> {
        self.refresh_slots().await?;
        let links: Vec<Link> = self
            .masters()
            .into_iter()
            .map(|master| self.link(&master))
            .collect::<Result<_, _>>()?;
        for connected in join_all(links.iter().map(|link| link.connect()).collect()).await {
            connected?;
        }
        Ok(())
    }

    pub(crate) fn is_clustered(&self) -> bool {
        true
    }

    /// Whether its subscriber can take sharded channels (not over RESP2).
    pub(crate) fn shards(&self) -> bool {
        self.shared.target.shards()
    }

    /// Whether every master is connected now.
    pub(crate) fn is_connected(&self) -> bool {
        let masters = self.masters();
        !masters.is_empty()
            && masters.iter().all(|master| {
                self.existing(master)
                    .is_some_and(|link| link.is_connected())
            })
    }

    /// Returns once every master is connected, reading the slots again meanwhile: a master
    /// that failed is replaced by its replica only in the slots as read after the failover.
    pub(crate) async fn wait_for_connect(&self) {
        loop {
            if self.is_connected() {
                return;
            }
            if let Err(error) = self.refresh_slots().await {
                tracing::debug!(%error, "could not read the cluster's slots while reconnecting");
            }
            if self.is_connected() {
                return;
            }
            tokio::time::sleep(WAIT_STEP).await;
        }
    }

    pub(crate) fn masters(&self) -> Vec<Server> {
        self.shared.table().masters.clone()
    }

    /// The masters connected now.
    pub(crate) fn connected_to(&self) -> Vec<Server> {
        self.masters()
            .into_iter()
            .filter(|master| {
                self.existing(master)
                    .is_some_and(|link| link.is_connected())
            })
            .collect()
    }

    pub(crate) fn slot_owner(&self, slot: u16) -> Option<Server> {
        self.shared.table().owner(slot).cloned()
    }

    pub(crate) fn sentinel_service(&self) -> Option<String> {
        None
    }

    pub(crate) fn server_major(&self) -> Option<u64> {
        let links: Vec<Link> = self.shared.links().values().cloned().collect();
        links.iter().find_map(Link::server_major)
    }

    pub(crate) fn command_timeout(&self) -> Duration {
        self.shared.target.command_timeout()
    }

    pub(crate) fn messages(&self) -> broadcast::Receiver<Message> {
        self.shared.messages.subscribe()
    }

    pub(crate) fn reconnects(&self) -> broadcast::Receiver<Server> {
        announcements(&self.shared.reconnects)
    }

    /// Drops every connection and connects again, after reading the slots again.
    pub(crate) async fn reconnect(&self) {
        let links: Vec<Link> = self.shared.links().values().cloned().collect();
        for link in &links {
            link.reconnect().await;
        }
        if let Err(error) = self.refresh_slots().await {
            tracing::debug!(%error, "could not read the cluster's slots");
        }
    }

    /// Closes every link; calls after this fail.
    pub(crate) async fn quit(&self) {
        self.shared
            .reconnects
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let links: Vec<Link> = self.shared.links().drain().map(|(_, link)| link).collect();
        for link in links {
            link.quit().await;
        }
    }

    /// This cluster, sending every call as `pin` says (by its first key without one).
    pub(crate) fn pinned(&self, pin: Option<Pin>) -> Pinned<'_> {
        Pinned { cluster: self, pin }
    }

    /// Reads the slots again (`CLUSTER SLOTS`), from a master it knows or else a seed, and
    /// connects to masters it did not know. When classic channels are subscribed on a node that
    /// no longer is a master, announces the new home, so that the subscriber subscribes them
    /// again there.
    pub(crate) async fn refresh_slots(&self) -> Result<(), RedisError> {
        let table = self.read_slots().await?;
        let new: Vec<Server> = {
            let links = self.shared.links();
            table
                .masters
                .iter()
                .filter(|master| !links.contains_key(*master))
                .cloned()
                .collect()
        };
        *self
            .shared
            .table
            .write()
            .unwrap_or_else(PoisonError::into_inner) = table;
        for master in new {
            let link = self.link(&master)?;
            if link.connect().await.is_err() {
                link.keep_connecting();
            }
        }
        let moved_home = {
            let mut home = self
                .shared
                .home
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            match &*home {
                Some(at) if !self.masters().contains(at) => home.take(),
                _ => None,
            }
        };
        if let Some(old) = moved_home {
            tracing::debug!(%old, "the node of the classic subscriptions is no longer a master");
            // A master demoted to a replica (a manual failover) still runs, and still has them:
            // every classic channel is dropped there, and subscribed again on the new home.
            let demoted = self.existing(&old).filter(Link::is_connected);
            if let Some(link) = demoted.filter(|_| self.shared.subscribes) {
                if let Err(error) = link.unsubscribe(Vec::new()).await {
                    tracing::debug!(%old, %error, "could not drop the classic subscriptions there");
                }
            }
            if let Some(sender) = &*self
                .shared
                .reconnects
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
            {
                if let Some(home) = self.home() {
                    let _ = sender.send(home);
                }
            }
        }
        Ok(())
    }

    /// The slots as the first node that answers says.
    async fn read_slots(&self) -> Result<Table, RedisError> {
        let mut asked: Vec<Server> = self.masters();
        for seed in &self.shared.seeds.servers {
            if !asked.contains(seed) {
                asked.push(seed.clone());
            }
        }
        let mut last = None;
        for node in asked {
            let reply = if self.shared.subscribes {
                self.ask_once(&node).await
            } else {
                match self.existing(&node).filter(Link::is_connected) {
                    Some(link) => {
                        link.command::<Value>("CLUSTER", &[Value::from("SLOTS")])
                            .await
                    }
                    None => self.ask_once(&node).await,
                }
            };
            match reply.and_then(|reply| table_of(&node, reply)) {
                Ok(table) => return Ok(table),
                Err(error) => {
                    tracing::debug!(%node, %error, "a node did not give the cluster's slots");
                    last = Some(error);
                }
            }
        }
        Err(last
            .unwrap_or_else(|| RedisError::unreadable("no cluster node to ask for slots".into())))
    }

    /// `CLUSTER SLOTS` on a connection of its own to `node`, closed after.
    async fn ask_once(&self, node: &Server) -> Result<Value, RedisError> {
        let timeout = self.shared.target.command_timeout();
        let target = self.shared.target.node(&self.shared.seeds, node.clone())?;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout));
        let mut connection = target
            .client()
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(sorted)?;
        let reply: redis::Value = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(&mut connection)
            .await
            .map_err(sorted)?;
        read(reply)
    }

    /// The link to `node`, made (not connected) when there is none yet.
    fn link(&self, node: &Server) -> Result<Link, RedisError> {
        if let Some(link) = self.existing(node) {
            return Ok(link);
        }
        let sender = self
            .shared
            .reconnects
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .ok_or_else(closed)?;
        let target = self.shared.target.node(&self.shared.seeds, node.clone())?;
        let mut links = self.shared.links();
        Ok(links
            .entry(node.clone())
            .or_insert_with(|| Link::sharing(target, self.shared.messages.clone(), sender))
            .clone())
    }

    fn existing(&self, node: &Server) -> Option<Link> {
        self.shared.links().get(node).cloned()
    }

    /// The link of `slot`'s master.
    fn of_slot(&self, slot: u16) -> Result<(Server, Link), RedisError> {
        let owner = self.slot_owner(slot).ok_or_else(|| {
            RedisError::new(
                RedisErrorKind::NotSent,
                Failure::Other("cluster".into()),
                format!("no master serves slot {slot} (as the cluster's slots were last read)"),
            )
        })?;
        Ok((owner.clone(), self.link(&owner)?))
    }

    /// Where classic channels are subscribed: the node chosen before, or the first master.
    fn home(&self) -> Option<Server> {
        let mut home = self
            .shared
            .home
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if home.is_none() {
            *home = self.masters().into_iter().next();
        }
        home.clone()
    }

    /// Where classic channels are subscribed, and its link.
    fn home_link(&self) -> Result<(Server, Link), RedisError> {
        let home = self.home().ok_or_else(|| {
            RedisError::new(
                RedisErrorKind::NotSent,
                Failure::Connection,
                "no cluster master known",
            )
        })?;
        let link = self.link(&home)?;
        Ok((home, link))
    }

    /// `SUBSCRIBE channels` on one node.
    pub(crate) async fn subscribe(&self, channels: Vec<String>) -> Result<(), RedisError> {
        self.home_link()?.1.subscribe(channels).await
    }

    /// `UNSUBSCRIBE channels` on the node they were subscribed on.
    pub(crate) async fn unsubscribe(&self, channels: Vec<String>) -> Result<(), RedisError> {
        self.home_link()?.1.unsubscribe(channels).await
    }

    /// `SSUBSCRIBE channels` (all of one slot) on the slot's master, following a `MOVED`.
    pub(crate) async fn ssubscribe(&self, channels: Vec<String>) -> Result<(), RedisError> {
        self.sharded(channels, true).await
    }

    /// `SUNSUBSCRIBE channels` (all of one slot) on the slot's master.
    pub(crate) async fn sunsubscribe(&self, channels: Vec<String>) -> Result<(), RedisError> {
        self.sharded(channels, false).await
    }

    async fn sharded(&self, channels: Vec<String>, subscribe: bool) -> Result<(), RedisError> {
        let Some(first) = channels.first() else {
            return Ok(());
        };
        let slot = key_slot(first.as_bytes());
        let mut tries = 0;
        loop {
            let (_, link) = self.of_slot(slot)?;
            let done = if subscribe {
                link.ssubscribe(channels.clone()).await
            } else {
                link.sunsubscribe(channels.clone()).await
            };
            match done {
                Err(error) if tries < REDIRECTS && redirect(&error).is_some() => {
                    tries += 1;
                    self.refresh_slots().await?;
                }
                other => return other,
            }
        }
    }
}

/// The cluster with where its calls go ([`Cluster::pinned`]). Each call takes it by value,
/// so that the seam hands back the call's own future.
#[derive(Clone)]
pub(crate) struct Pinned<'c> {
    cluster: &'c Cluster,
    pin: Option<Pin>,
}

impl Pinned<'_> {
    /// The slot a call is routed by: the pinned one, else its first key's.
    fn slot(&self, first_key: Option<&[u8]>) -> Option<u16> {
        match (&self.pin, first_key) {
            (Some(Pin::Slot(slot)), _) => Some(*slot),
            (Some(Pin::Node(_)), _) => None,
            (None, key) => key.map(key_slot),
        }
    }

    /// The node a call goes to: the pinned one, else its slot's master (its first key's, or
    /// for `PUBSUB`, its channel's), else any master.
    fn route(&self, first_key: Option<&[u8]>) -> Result<(Server, Link), RedisError> {
        match (&self.pin, first_key) {
            (Some(Pin::Node(node)), _) => Ok((node.clone(), self.cluster.link(node)?)),
            (Some(Pin::Slot(slot)), _) => self.cluster.of_slot(*slot),
            (None, Some(key)) => self.cluster.of_slot(key_slot(key)),
            (None, None) => self.cluster.home_link(),
        }
    }

    // `call` and `command` each write the redirect loop out: a loop shared through a closure
    // that makes each attempt's future nests the call's futures one level deeper, and the
    // futures of a caller's call are at rustc's query depth already (the doc test of
    // `LeaderElection::observe` stops compiling).

    /// One call of a script or command, to its slot's master, following redirects.
    pub(crate) async fn call<R: FromValue>(
        self,
        sent: Sent<'_>,
        call: &impl Fn() -> (Vec<Key>, Vec<Value>),
    ) -> Result<R, RedisError> {
        let first = call().0.into_iter().next();
        let first = first.as_ref().map(Key::as_bytes);
        let slot = self.slot(first);
        let (mut node, mut link) = self.route(first)?;
        let mut asking = false;
        let mut tries = 0;
        loop {
            let reply = if asking {
                link.call_asking(sent, call).await
            } else {
                link.call(sent, call).await
            };
            let error = match reply {
                Err(error) if tries < REDIRECTS => error,
                other => return other,
            };
            tries += 1;
            (node, link, asking) = match self.followed(slot, &node, &error).await {
                Some(next) => next,
                None => return Err(error),
            };
        }
    }

    /// `name` with `args` (the first a key, or for `PUBSUB` the second: the channel), to its
    /// slot's master, following redirects.
    pub(crate) async fn command<R: FromValue>(
        self,
        name: &str,
        args: Vec<Value>,
    ) -> Result<R, RedisError> {
        let args = &args[..];
        let key = if name.eq_ignore_ascii_case("PUBSUB") {
            args.get(1)
        } else {
            args.first()
        };
        let key = key.and_then(Value::as_bytes);
        let slot = self.slot(key);
        let (mut node, mut link) = self.route(key)?;
        let mut asking = false;
        let mut tries = 0;
        loop {
            let reply = if asking {
                link.command_asking::<R>(name, args).await
            } else {
                link.command::<R>(name, args).await
            };
            let error = match reply {
                Err(error) if tries < REDIRECTS => error,
                other => return other,
            };
            tries += 1;
            (node, link, asking) = match self.followed(slot, &node, &error).await {
                Some(next) => next,
                None => return Err(error),
            };
        }
    }

    /// Where a call that met `error` at `node` goes next (and whether behind `ASKING`), when
    /// the error says it did not run: `MOVED`, `ASK`, or not sent for want of a connection to a
    /// node that is no longer the master of the call's `slot` (`None`: any master's call).
    async fn followed(
        &self,
        slot: Option<u16>,
        node: &Server,
        error: &RedisError,
    ) -> Option<(Server, Link, bool)> {
        if let Some((asking, to)) = redirect(error) {
            if !asking {
                if let Err(error) = self.cluster.refresh_slots().await {
                    tracing::debug!(%error, "could not read the cluster's slots after MOVED");
                }
            }
            let link = self.cluster.link(&to).ok()?;
            return Some((to, link, asking));
        }
        match error.kind() {
            RedisErrorKind::NotSent if !matches!(self.pin, Some(Pin::Node(_))) => {}
            RedisErrorKind::NoReply => {
                // It may have run: never sent again; the slots are read again for the next.
                let cluster = self.cluster.clone();
                tokio::spawn(async move {
                    let _ = cluster.refresh_slots().await;
                });
                return None;
            }
            _ => return None,
        }
        if let Err(error) = self.cluster.refresh_slots().await {
            tracing::debug!(%error, "could not read the cluster's slots after a failed call");
            return None;
        }
        let now = match slot {
            Some(slot) => self.cluster.slot_owner(slot)?,
            None => self.cluster.home()?,
        };
        // The same node would refuse it the same way: only a new master is tried.
        if now == *node {
            return None;
        }
        let link = self.cluster.link(&now).ok()?;
        Some((now, link, false))
    }

    /// Commands sent together, each to its own slot's master (or all to the pinned node), with
    /// each one's reply or error in order.
    pub(crate) async fn pipeline(
        self,
        commands: Vec<(&'static str, Vec<Value>)>,
    ) -> Result<Vec<Result<Value, RedisError>>, RedisError> {
        // The multiplexed connections write each as it is polled, without waiting for the one
        // before: as one pipeline per node, with each command routed (and redirected) alone.
        let sent: Vec<_> = commands
            .into_iter()
            .map(|(name, args)| self.clone().command::<Value>(name, args))
            .collect();
        Ok(join_all(sent).await)
    }

    /// One page of `SCAN` on the pinned node.
    pub(crate) async fn scan_page(
        self,
        cursor: String,
        pattern: &str,
        count: u32,
        of_type: Option<ScanType>,
    ) -> Result<(String, Vec<String>), RedisError> {
        let (_, link) = self.route(None)?;
        link.scan_page(cursor, pattern, count, of_type).await
    }
}

impl Shared {
    fn table(&self) -> std::sync::RwLockReadGuard<'_, Table> {
        self.table.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn links(&self) -> std::sync::MutexGuard<'_, HashMap<Server, Link>> {
        self.links.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// `MOVED slot host:port` (false) or `ASK slot host:port` (true), and the node it names.
fn redirect(error: &RedisError) -> Option<(bool, Server)> {
    let details = error.details();
    let mut words = details.split_whitespace();
    let asking = match words.next()? {
        "MOVED" => false,
        "ASK" => true,
        _ => return None,
    };
    let _slot = words.next()?;
    let address = words.next()?;
    let (host, port) = address.rsplit_once(':')?;
    Some((asking, Server::new(host, port.parse().ok()?)))
}

/// The slot table a `CLUSTER SLOTS` reply from `node` gives: `[start, end, [host, port, ..],
/// replicas..]` per range. A master without a host of its own (an empty or `?` host) is at
/// `node`'s host.
fn table_of(node: &Server, reply: Value) -> Result<Table, RedisError> {
    let unreadable =
        |what: &str| RedisError::unreadable(format!("CLUSTER SLOTS from {node}: {what}"));
    let Value::Array(ranges) = reply else {
        return Err(unreadable("not an array"));
    };
    let mut table = Table {
        owners: vec![u16::MAX; SLOTS],
        masters: Vec::new(),
    };
    for range in ranges {
        let Value::Array(fields) = range else {
            return Err(unreadable("a range is not an array"));
        };
        let number = |index: usize| fields.get(index).and_then(Value::as_i64);
        let (Some(start), Some(end)) = (number(0), number(1)) else {
            return Err(unreadable("a range without its bounds"));
        };
        let Some(Value::Array(master)) = fields.get(2) else {
            return Err(unreadable("a range without its master"));
        };
        let host = master
            .first()
            .and_then(Value::as_string)
            .filter(|host| !host.is_empty() && host != "?")
            .unwrap_or_else(|| node.host.to_string());
        let port = master
            .get(1)
            .and_then(Value::as_i64)
            .and_then(|port| u16::try_from(port).ok())
            .ok_or_else(|| unreadable("a master without its port"))?;
        let server = Server::new(host, port);
        let index = match table.masters.iter().position(|known| *known == server) {
            Some(index) => index,
            None => {
                table.masters.push(server);
                table.masters.len() - 1
            }
        };
        let index = u16::try_from(index).map_err(|_| unreadable("too many masters"))?;
        let start = usize::try_from(start).map_err(|_| unreadable("a negative slot"))?;
        let end = usize::try_from(end).map_err(|_| unreadable("a negative slot"))?;
        for slot in start..=end.min(SLOTS - 1) {
            table.owners[slot] = index;
        }
    }
    if table.masters.is_empty() {
        return Err(unreadable("no slot is served"));
    }
    Ok(table)
}

fn closed() -> RedisError {
    RedisError::new(
        RedisErrorKind::NotSent,
        Failure::Connection,
        "the client was closed",
    )
}

/// A cluster behind the seam: each call pinned as its route says.
impl LinkLike for Cluster {
    fn connect(&self) -> impl Future<Output = Result<(), RedisError>> + Send {
        Cluster::connect(self)
    }

    fn messages(&self) -> Messages {
        Cluster::messages(self)
    }

    fn reconnects(&self) -> Reconnects {
        Cluster::reconnects(self)
    }

    fn connected_to(&self) -> Vec<Server> {
        Cluster::connected_to(self)
    }

    fn reconnect(&self) -> impl Future<Output = ()> + Send {
        Cluster::reconnect(self)
    }

    fn quit(&self) -> impl Future<Output = ()> + Send {
        Cluster::quit(self)
    }
}

impl ConnectionLike for Cluster {
    fn is_connected(&self) -> bool {
        Cluster::is_connected(self)
    }

    fn wait_for_connect(&self) -> impl Future<Output = ()> + Send {
        Cluster::wait_for_connect(self)
    }

    fn is_clustered(&self) -> bool {
        Cluster::is_clustered(self)
    }

    fn sentinel_service(&self) -> Option<String> {
        Cluster::sentinel_service(self)
    }

    fn server_major(&self) -> Option<u64> {
        Cluster::server_major(self)
    }

    fn command_timeout(&self) -> Duration {
        Cluster::command_timeout(self)
    }

    fn masters(&self) -> Vec<Server> {
        Cluster::masters(self)
    }

    fn subscribe(&self, channel: &str) -> impl Future<Output = Result<(), RedisError>> + Send {
        Cluster::subscribe(self, vec![channel.to_owned()])
    }

    fn call<R: FromValue>(
        &self,
        route: &Route,
        sent: Sent<'_>,
        call: &impl Fn() -> (Vec<Key>, Vec<Value>),
    ) -> impl Future<Output = Result<R, RedisError>> {
        self.pinned(pin(route)).call(sent, call)
    }

    fn command<R: FromValue>(
        &self,
        route: &Route,
        name: &'static str,
        args: Vec<Value>,
    ) -> impl Future<Output = Result<R, RedisError>> {
        self.pinned(pin(route)).command(name, args)
    }

    fn pipeline(
        &self,
        route: &Route,
        commands: Vec<(&'static str, Vec<Value>)>,
    ) -> impl Future<Output = Result<Vec<Result<Value, RedisError>>, RedisError>> + Send {
        self.pinned(pin(route)).pipeline(commands)
    }

    fn scan_page(
        &self,
        route: &Route,
        cursor: String,
        pattern: &str,
        count: u32,
        of_type: Option<ScanType>,
    ) -> impl Future<Output = Result<(String, Vec<String>), RedisError>> + Send {
        self.pinned(pin(route))
            .scan_page(cursor, pattern, count, of_type)
    }
}

/// Where a call routed as `route` says goes on the cluster: pinned to a node or a slot, or
/// (`None`) by its first key.
fn pin(route: &Route) -> Option<Pin> {
    match route {
        Route::FirstKey => None,
        Route::Node(node) => Some(Pin::Node(node.clone())),
        Route::Slot(slot) => Some(Pin::Slot(*slot)),
    }
}

impl SubscriberLike for Cluster {
    fn subscribe(
        &self,
        channels: Vec<String>,
    ) -> impl Future<Output = Result<(), RedisError>> + Send {
        Cluster::subscribe(self, channels)
    }

    fn ssubscribe(
        &self,
        channels: Vec<String>,
    ) -> impl Future<Output = Result<(), RedisError>> + Send {
        Cluster::ssubscribe(self, channels)
    }

    fn unsubscribe(
        &self,
        channels: Vec<String>,
    ) -> impl Future<Output = Result<(), RedisError>> + Send {
        Cluster::unsubscribe(self, channels)
    }

    fn sunsubscribe(
        &self,
        channels: Vec<String>,
    ) -> impl Future<Output = Result<(), RedisError>> + Send {
        Cluster::sunsubscribe(self, channels)
    }

    fn shards(&self) -> bool {
        Cluster::shards(self)
    }

    fn slot_owner(&self, slot: u16) -> Option<Server> {
        Cluster::slot_owner(self, slot)
    }

    fn refresh_slots(&self) -> impl Future<Output = Result<(), RedisError>> + Send {
        Cluster::refresh_slots(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(details: &str) -> RedisError {
        RedisError::new(
            RedisErrorKind::Refused,
            Failure::Other("moved".into()),
            details,
        )
    }

    #[test]
    fn redirects_name_their_node() {
        assert_eq!(
            redirect(&error("MOVED 3999 127.0.0.1:6381")),
            Some((false, Server::new("127.0.0.1", 6381)))
        );
        assert_eq!(
            redirect(&error("ASK 3999 127.0.0.1:6382")),
            Some((true, Server::new("127.0.0.1", 6382)))
        );
        assert_eq!(
            redirect(&error("MOVED 3999 ::1:6381")),
            Some((false, Server::new("::1", 6381)))
        );
        assert_eq!(redirect(&error("TRYAGAIN Multiple keys")), None);
        assert_eq!(redirect(&error("MOVED 3999")), None);
        assert_eq!(redirect(&error("ERR MOVED 1 a:1")), None);
    }

    fn node(host: &str, port: i64) -> Value {
        Value::Array(vec![
            Value::from(host),
            Value::Integer(port),
            Value::from("id"),
        ])
    }

    #[test]
    fn slots_are_read_per_range() {
        let seed = Server::new("127.0.0.1", 7000);
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Integer(0),
                Value::Integer(5460),
                node("127.0.0.1", 7000),
                node("127.0.0.1", 7003),
            ]),
            Value::Array(vec![
                Value::Integer(5461),
                Value::Integer(10922),
                node("", 7001),
            ]),
            Value::Array(vec![
                Value::Integer(10923),
                Value::Integer(16383),
                node("127.0.0.2", 7002),
            ]),
        ]);
        let table = table_of(&seed, reply).expect("a table");
        assert_eq!(table.masters.len(), 3);
        assert_eq!(table.owner(0), Some(&Server::new("127.0.0.1", 7000)));
        assert_eq!(table.owner(5460), Some(&Server::new("127.0.0.1", 7000)));
        // A master without a host of its own is at the host that answered.
        assert_eq!(table.owner(5461), Some(&Server::new("127.0.0.1", 7001)));
        assert_eq!(table.owner(16383), Some(&Server::new("127.0.0.2", 7002)));
        let unserved = Value::Array(vec![Value::Array(vec![
            Value::Integer(0),
            Value::Integer(99),
            node("127.0.0.1", 7000),
        ])]);
        let table = table_of(&seed, unserved).expect("a table");
        assert_eq!(table.owner(100), None);
        assert!(table_of(&seed, Value::Array(Vec::new())).is_err());
        assert!(table_of(&seed, Value::Integer(1)).is_err());
    }
}

//! The engine every primitive runs on; it knows no primitive.
//!
//! It owns what a [`LockClient`](crate::LockClient) shares between all its primitives: the
//! connections, the registry of holds and the watchdog that renews them, the ledger that makes
//! every change take effect once, pub/sub wake-ups, the undo task that sends undos in the
//! background, and the one acquire loop ([`acquire`]). A primitive hands it a [`Profile`]
//! (fixed data: keys, label, how its waiters wake, ..) and, as a [`Kind`], its acquire, release
//! and leave script calls, and gets back a [`Win`], whose [`Guard`] it wraps in its own guard
//! type. See `docs/ARCHITECTURE.md`.

mod acquire;
pub(crate) mod client;
pub(crate) mod durations;
pub(crate) mod events;
mod expiry;
mod guard;
mod holds;
mod inflight;
pub(crate) mod inspect;
pub(crate) mod join;
mod kind;
mod ledger;
mod line;
pub(crate) mod metrics;
pub(crate) mod naming;
mod permissions;
mod profile;
mod pubsub;
mod refusal;
pub(crate) mod replicas;
mod script;
mod sentinel;
mod undo;
mod watchdog;

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::mpsc::{self, UnboundedSender};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use crate::error::{Error, RedisError, Result};
use crate::inspection::ClientStats;
use crate::owner::OwnerId;

pub(crate) use acquire::{
    acquire, acquire_as, check_name, check_primitive, wait_until, Acquired, Win,
};
pub(crate) use client::reply::{FromReply, ScriptArg};
pub(crate) use client::value;
#[cfg(feature = "redis-rs")]
pub(crate) use client::{redis_rs_address, RedisRsSettings};
pub(crate) use client::{
    Config, Connection, Connector, Library, Protocol, ReconnectPolicy, Reconnects, Sent, Sentinels,
    ServerConfig, Subscriber,
};
pub(crate) use guard::Guard;
pub(crate) use holds::Lease;
pub(crate) use inspect::{text, Inspect, Tail};
pub(crate) use kind::{AcquireArgs, Call, Kind, Primitive, ReleaseArgs};
pub(crate) use ledger::{replay as replay_ledger, Request};
pub(crate) use metrics::Metrics;
pub(crate) use profile::{
    Backoff, Class, HoldEvents, Keys, Own, Profile, ProfileOf, Refusal, WakeRule,
};
pub(crate) use replicas::Writer;
pub(crate) use script::{write, Attempts, Script};
pub(crate) use value::{
    key_of, key_slot, reply_of, sha1_hex, value_of, FromValue, Key, ScanType, Server, Str, Value,
};
#[cfg(feature = "redis-rs")]
pub(crate) use value::{Map, MessageKind};

/// The hasher of the engine's maps, which every lock and unlock visits: foldhash, seeded at
/// random per map (so that nobody can prepare names that collide), at about a tenth of the
/// default SipHash's cost on these keys.
type HashState = foldhash::fast::RandomState;

/// An owner field (`<client uuid>:<owner id>`), as every script call that changes a hold sends
/// it: shared, not copied, into each call and renewal.
pub(crate) type Field = Str;

/// A primitive's name as holds and calls keep it: a slice of the primitive's keys.
pub(crate) type Name = Str;

/// What the engine is started with.
pub(crate) struct Settings {
    /// The client library the connections are made with.
    pub(crate) library: Library,
    pub(crate) config: Config,
    /// The RESP version, when the builder names one.
    pub(crate) protocol: Option<Protocol>,
    pub(crate) command_timeout: Duration,
    pub(crate) reconnect_policy: ReconnectPolicy,
    pub(crate) watchdog_lease: Duration,
    pub(crate) renew_deadline: Duration,
    /// How long a waiter's place in a line lasts without another attempt.
    pub(crate) queue_place: Duration,
    pub(crate) replica_sync: Option<replicas::ReplicaSync>,
    pub(crate) metrics: metrics::Metrics,
    /// The client's name for people (see `naming`), if it was given one.
    pub(crate) client_name: Option<Arc<str>>,
}

/// What the background tasks share with the handles. Tasks hold this, never [`Engine`], so
/// that dropping the last handle can stop them.
pub(crate) struct Core {
    pub(crate) id: Uuid,
    /// The client's name for people (see `naming`), if it was given one.
    pub(crate) name: Option<Arc<str>>,
    /// `id` in Redisson's text form, the first half of every owner field.
    id_text: String,
    /// Where every change goes: the command connection, or with replica sync connections that
    /// wait for the replicas after each change.
    pub(crate) writer: replicas::Writer,
    /// The configured server address(es), `host:port[,host:port..]`, for messages naming a node.
    pub(crate) address: Arc<str>,
    subscriber: Subscriber,
    pub(crate) watchdog_lease: Duration,
    /// Where acquisitions, holds and renewals are counted.
    pub(crate) metrics: metrics::Metrics,
    /// The watchdog lease in ms, encoded once as the scripts take it: most calls carry it.
    watchdog_lease_arg: Value,
    holds: holds::Holds,
    /// One state-changing call at a time per (name, owner), and the lost replies to fence.
    ledger: ledger::Ledger,
    pubsub: pubsub::PubSub,
    undos: UnboundedSender<undo::Undo>,
    shutdown: CancellationToken,
    /// The work running under holds (`with_lock`, a job, a leader's work): a shutdown waits
    /// until every one has been dropped before it gives the holds back.
    works: TaskTracker,
    /// The kinds of primitive whose calls the user was found to have every permission for, a
    /// bit each (see `permissions`).
    permitted: std::sync::atomic::AtomicU64,
    /// Where holds' changes are counted and told (see `events`).
    pub(crate) report: Arc<events::Report>,
    /// The client's number in the lines of the locks its tasks wait for (see `lua/lock.lua`).
    pub(crate) line_number: i64,
    /// How long its place in such a line lasts without another attempt.
    pub(crate) queue_place: Duration,
    /// The locks its releases handed on to a named client a moment ago (see `line`).
    pub(crate) handed_on: line::HandedOn,
}

/// The client `id`'s number in the locks' lines: 2^52 and up, so that it is never Redisson's
/// `0` or `1`, and below 2^53, so that Lua's numbers hold it exactly.
pub(crate) fn line_number(id: Uuid) -> i64 {
    let first = pubsub::FIRST_LINE_NUMBER;
    first | (id.as_u128() as i64 & (first - 1))
}

/// The channel of the client `id` (Redisson's text form), on which force unlocks of its holds
/// are announced: `fredlock_client:<client uuid>`.
fn own_channel(id: &str) -> String {
    format!("fredlock_client:{id}")
}

impl Core {
    /// The client's id, hyphenated.
    pub(crate) fn id_text(&self) -> &str {
        &self.id_text
    }

    /// The channel force unlocks of this client's holds are announced on (see `pubsub`).
    pub(crate) fn own_channel(&self) -> String {
        own_channel(&self.id_text)
    }

    /// The command connection: every read, and every change without replica sync.
    pub(crate) fn redis(&self) -> &Connection {
        &self.writer.client
    }

    /// Where a read-only script goes: the command connection, never waiting for replicas (which
    /// replica sync would make it do, for nothing).
    pub(crate) fn reads(&self) -> replicas::Writer {
        replicas::Writer::plain(self.redis().clone(), self.writer.sharded)
    }

    /// The masters of a cluster, as the client's routing table has them; none outside one.
    pub(crate) fn masters(&self) -> Vec<Server> {
        self.redis().masters()
    }

    /// The owner field of `owner`: `<client uuid>:<owner id>`.
    pub(crate) fn field(&self, owner: OwnerId) -> Field {
        self.field_with(owner, "")
    }

    /// The owner field of `owner` for a primitive whose fields carry `suffix` (a writer's
    /// `:write`): `<client uuid>:<owner id><suffix>`.
    pub(crate) fn field_with(&self, owner: OwnerId, suffix: &str) -> Field {
        let mut buf = [0; OwnerId::MAX_LEN];
        let owner = owner.encode(&mut buf);
        // Exactly its length: a buffer with room to spare costs `Bytes` a second allocation
        // (or a shrinking one).
        let mut field = String::with_capacity(self.id_text.len() + 1 + owner.len() + suffix.len());
        field.push_str(&self.id_text);
        field.push(':');
        field.push_str(owner);
        field.push_str(suffix);
        Field::from(field.into_boxed_str())
    }

    /// `lease` in ms, as a script argument.
    pub(crate) fn lease_arg(&self, lease: Lease) -> Value {
        match lease {
            Lease::Watchdog => self.watchdog_lease_arg.clone(),
            Lease::Fixed(_) | Lease::Unbounded => {
                Value::from(lease.millis(self.watchdog_lease) as i64)
            }
        }
    }

    pub(crate) fn ensure_open(&self) -> Result<()> {
        if self.shutdown.is_cancelled() {
            Err(Error::Shutdown)
        } else {
            Ok(())
        }
    }
}

/// A handle on a running engine; the engine stops when the last one goes (or on
/// [`shutdown`](Engine::shutdown)). Clones share it.
#[derive(Clone)]
pub(crate) struct Engine {
    handle: Arc<Handle>,
}

struct Handle {
    core: Arc<Core>,
    /// Tasks that end when `core.shutdown` is cancelled.
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        naming::forget(self.core.id);
        self.core.shutdown.cancel();
        self.core.pubsub.close();
        let tasks = std::mem::take(self.tasks.get_mut().unwrap_or_else(PoisonError::into_inner));
        // Guards dropped just before the client queued releases: let the stop sequence send
        // them before it closes the connections, when a runtime is still there to do it.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(stop(self.core.clone(), tasks));
        }
    }
}

/// Hands every hold over (marks it lost, waits until the work under it is dropped, then gives it
/// back at once), waits for the background tasks to end (the undo task first sends the undos
/// queued by dropped guards and waiters), marks every remaining hold lost, and closes the
/// connections.
async fn stop(core: Arc<Core>, tasks: Vec<JoinHandle<()>>) {
    undo::hand_over(&core).await;
    for task in tasks {
        let abort = task.abort_handle();
        if tokio::time::timeout(Duration::from_secs(3), task)
            .await
            .is_err()
        {
            abort.abort();
        }
    }
    core.holds.lose_all();
    core.subscriber.quit().await;
    for connection in core.writer.own_connections() {
        connection.quit().await;
    }
    core.redis().quit().await;
    // Last: the events of the hand-over and of the waits it ended are in the stream first.
    core.report.events.close();
    tracing::debug!(client = %core.id, "lock client shut down");
}

/// The undo of connecting: closes a half-built engine's connections when dropped, unless the
/// engine keeps them (it was built).
struct CloseOnDrop(Option<(Connection, Subscriber)>);

impl CloseOnDrop {
    /// The engine keeps the connections; nothing is closed.
    fn keep(mut self) {
        self.0 = None;
    }
}

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        if let (Some((redis, subscriber)), Ok(runtime)) =
            (self.0.take(), tokio::runtime::Handle::try_current())
        {
            runtime.spawn(async move {
                subscriber.quit().await;
                redis.quit().await;
            });
        }
    }
}

impl Engine {
    /// Connects and starts the background tasks: pub/sub, the watchdog, the undo task.
    pub(crate) async fn start(settings: Settings) -> Result<Engine> {
        let connector = Arc::new(Connector::new(
            settings.library,
            settings.config,
            settings.protocol,
            settings.command_timeout,
            settings.reconnect_policy,
        ));
        let hosts = connector.hosts().join(",");
        // Behind Sentinel the master moves: name the service and where it is looked up.
        let address = match connector.sentinels() {
            Some(sentinels) => {
                format!("the master of {:?} (sentinels {hosts})", sentinels.service)
            }
            None => hosts,
        };
        let connect_error = |source: RedisError| Error::Redis {
            context: "connecting".into(),
            server: address.clone(),
            source,
        };
        let redis = connector.connection().map_err(connect_error)?;
        let subscriber = connector.subscriber().map_err(connect_error)?;
        // Until the engine exists, a failure or a dropped future must not leave connections open.
        let connecting = CloseOnDrop(Some((redis.clone(), subscriber.clone())));
        redis.connect().await.map_err(connect_error)?;
        subscriber.connect().await.map_err(connect_error)?;
        // Redisson's default on clusters of Redis 7 and later: sharded pub/sub, which reaches
        // only the nodes of the channel's slot instead of every node of the cluster.
        let sharded =
            connector.is_clustered() && redis.server_major().is_some_and(|major| major >= 7);
        if sharded && !subscriber.shards() {
            // Classic channels instead would not hear the unlocks of clients that publish on
            // sharded ones (Redisson's default there, and every other fredlock client's), and
            // their waiters would not hear ours.
            return Err(Error::InvalidArgument(format!(
                "{address} is a cluster of Redis 7 or later, whose lock channels are sharded, and \
                 the redis-rs backend subscribes to sharded channels over RESP3 only: build the \
                 client with protocol(Protocol::Resp3)"
            )));
        }
        let writer = match settings.replica_sync {
            None => replicas::Writer::plain(redis.clone(), sharded),
            Some(sync) => replicas::Writer::synced(redis.clone(), sharded, &connector, sync)
                .await
                .map_err(|problem| {
                    Error::InvalidArgument(format!(
                        "replica_sync(..) cannot be used with {address}: {problem}; a server or \
                         proxy that refuses WAIT cannot tell when replicas have a lock"
                    ))
                })?,
        };
        connecting.keep();

        let shutdown = CancellationToken::new();
        let mut tasks = Vec::new();
        let mut commands = vec![redis.clone()];
        commands.extend(writer.own_connections().iter().cloned());
        tasks.extend(sentinel::follow(
            connector,
            commands.clone(),
            subscriber.clone(),
            shutdown.clone(),
        ));
        let id = Uuid::new_v4();
        if let Some(name) = &settings.client_name {
            naming::remember(id, name);
            let named = naming::name_connections(&commands, name, id).await;
            if let Err(error) = named {
                // A server that refuses CLIENT SETNAME (an ACL without it) still serves locks.
                tracing::warn!(
                    client = %name, %error,
                    "could not name the client's connections; inspections will not show its name"
                );
            }
            tasks.extend(naming::follow(
                commands.clone(),
                name.clone(),
                id,
                shutdown.clone(),
            ));
        }
        // Where force unlocks of this client's holds are announced (see `pubsub`).
        let own = pubsub::Channel::from(own_channel(&id.hyphenated().to_string()));
        let line_number = line_number(id);
        let (pubsub, pubsub_tasks) = pubsub::PubSub::start(
            subscriber.clone(),
            sharded,
            own,
            line_number,
            writer.clone(),
            shutdown.clone(),
        );
        tasks.extend(pubsub_tasks);
        let (undo_tx, undo_rx) = mpsc::unbounded_channel();
        let report = Arc::new(events::Report {
            metrics: settings.metrics.clone(),
            events: events::Events::new(
                crate::inspection::DEFAULT_EVENT_CAPACITY,
                settings.client_name.clone(),
            ),
        });
        let core = Arc::new(Core {
            id,
            name: settings.client_name.clone(),
            id_text: id.hyphenated().to_string(),
            writer,
            address: address.as_str().into(),
            subscriber,
            watchdog_lease: settings.watchdog_lease,
            metrics: settings.metrics.clone(),
            watchdog_lease_arg: Value::from(
                Lease::Watchdog.millis(settings.watchdog_lease).to_string(),
            ),
            holds: holds::Holds::new(
                settings.watchdog_lease,
                settings.renew_deadline,
                report.clone(),
            ),
            ledger: ledger::Ledger::new(),
            pubsub,
            undos: undo_tx,
            shutdown: shutdown.clone(),
            works: TaskTracker::new(),
            permitted: std::sync::atomic::AtomicU64::new(0),
            report,
            line_number,
            queue_place: settings.queue_place,
            handed_on: line::HandedOn::default(),
        });
        tasks.push(tokio::spawn(
            watchdog::Watchdog::new(core.clone()).run(shutdown.clone()),
        ));
        tasks.push(tokio::spawn(
            core.holds.expiries.clone().run(shutdown.clone()),
        ));
        tasks.push(tokio::spawn(undo::run(core.clone(), undo_rx, shutdown)));
        tracing::debug!(client = %id, "lock client started");
        Ok(Engine {
            handle: Arc::new(Handle {
                core,
                tasks: Mutex::new(tasks),
            }),
        })
    }

    pub(crate) fn core(&self) -> &Arc<Core> {
        &self.handle.core
    }

    pub(crate) fn stats(&self) -> ClientStats {
        let core = &self.handle.core;
        ClientStats {
            held: core.holds.len(),
            wait_entries: core.pubsub.wait_entries(),
            subscriptions: core.pubsub.subscriptions(),
            unsettled: core.ledger.len(),
            connected: core.redis().is_connected(),
        }
    }

    /// Runs `work` while its hold stands: `None` (the work dropped at once) when `lost`
    /// completes first, as the hold's loss does. Counted as work under a hold until it is
    /// dropped: a shutdown marks every hold lost, then waits for such work to be dropped before
    /// it hands the holds over, so that no other instance takes a hold while this one's work
    /// still runs.
    pub(crate) async fn while_held<T>(
        &self,
        lost: impl std::future::Future,
        work: impl std::future::Future<Output = T>,
    ) -> Option<T> {
        let held = async {
            tokio::select! {
                biased;
                _ = lost => None,
                value = work => Some(value),
            }
        };
        self.core().works.track_future(held).await
    }

    /// How many holds `owner` has on `kind` by this client's count (none once lost), with the
    /// owner's field: for a kind that refuses a second hold.
    pub(crate) fn holds_of(&self, kind: &dyn Primitive, owner: OwnerId) -> (usize, Field) {
        let core = self.core();
        let field = core.field_with(owner, kind.profile().field_suffix());
        let pair = ledger::Pair::new(kind.profile().name_text(), field.clone());
        (core.holds.count(&pair), field)
    }

    /// Stops the background tasks and closes the connections; see `LockClient::shutdown`.
    pub(crate) async fn shutdown(&self) {
        let core = &self.handle.core;
        core.shutdown.cancel();
        core.pubsub.close();
        let tasks = std::mem::take(
            &mut *self
                .handle
                .tasks
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        if !tasks.is_empty() {
            stop(core.clone(), tasks).await;
        }
    }

    /// Sends one of `kind`'s calls outside the acquire loop (setting permits, counting down,
    /// ..) through the write funnel, once the client is open and the name checked; an error
    /// names the primitive and the server.
    pub(crate) async fn send<R: FromValue>(&self, kind: &dyn Primitive, call: Call) -> Result<R> {
        self.call_on(&self.core().writer, kind, call).await
    }

    /// Runs one of `kind`'s read-only calls as [`send`](Self::send) does, on the command
    /// connection: never waiting for replicas, which replica sync would make a write do.
    pub(crate) async fn read<R: FromValue>(&self, kind: &dyn Primitive, call: Call) -> Result<R> {
        self.call_on(&self.core().reads(), kind, call).await
    }

    async fn call_on<R: FromValue>(
        &self,
        writer: &Writer,
        kind: &dyn Primitive,
        call: Call,
    ) -> Result<R> {
        let core = self.core();
        core.ensure_open()?;
        check_primitive(kind)?;
        if let Err(unsent) = core.redis().refused_unconnected() {
            return Err(self.redis_error(kind.profile().name(), None, unsent));
        }
        if !permissions::known(core, kind.profile().class()) {
            permissions::check(core, kind, None, None).await?;
        }
        match call.run(writer).await {
            Ok(reply) => Ok(reply),
            Err(source) => Err(self.refused(kind, None, None, source).await),
        }
    }

    /// The error of a call of `kind` (by `owner`, if one) that `source` failed. A refusal for
    /// want of a permission (taken away while the client runs) forgets that the user had every
    /// permission and asks the question again, within `bound`: the error then names the missing
    /// permission and the lock, as the first call's does, rather than a script's line; the next
    /// call asks again until the answer is yes. Any other failure is [`redis_error`]'s.
    ///
    /// [`redis_error`]: Self::redis_error
    pub(crate) async fn refused(
        &self,
        kind: &dyn Primitive,
        owner: Option<&str>,
        bound: Option<Duration>,
        source: RedisError,
    ) -> Error {
        let source = self.named_refusal(kind, owner, bound, source).await;
        self.redis_error(kind.profile().name(), owner, source)
    }

    /// Whether this client's user was found to have what `kind` needs (see `permissions.rs`).
    pub(crate) fn permission_known(&self, kind: &dyn Primitive) -> bool {
        permissions::known(self.core(), kind.profile().class())
    }

    /// Asks `kind`'s permission question (see `permissions.rs`), for a caller that found it
    /// not [`permission_known`](Self::permission_known): `Err` with the server's `NOPERM`
    /// answer, `Ok` for a yes or for no answer within `bound`. For a primitive that reports
    /// each server's error as it is (Redlock's nodes); the others' calls ask by themselves.
    pub(crate) async fn ask_permission(
        &self,
        kind: &dyn Primitive,
        bound: Option<Duration>,
    ) -> std::result::Result<(), RedisError> {
        permissions::ask(self.core(), kind, None, bound).await
    }

    /// `source`, or for a refusal for want of a permission the server's answer to the permission
    /// question asked again (`NOPERM`, naming the command and the key or channel): what
    /// [`refused`](Self::refused) reports, and what a primitive that reports each server's
    /// error as it is (Redlock's nodes) shows.
    pub(crate) async fn named_refusal(
        &self,
        kind: &dyn Primitive,
        owner: Option<&str>,
        bound: Option<Duration>,
        source: RedisError,
    ) -> RedisError {
        if permissions::is_refused_permission(&source) {
            tracing::warn!(
                lock = %kind.profile().name(), owner, client = self.core().name.as_deref(),
                error = %source, "a call was refused for want of a permission; asking which"
            );
        }
        permissions::named_refusal(self.core(), kind, owner, bound, source).await
    }

    /// Converts a fred error about `name`, naming the server and, where there is one, the owner.
    pub(crate) fn redis_error(
        &self,
        name: &str,
        owner: Option<&str>,
        source: impl Into<RedisError>,
    ) -> Error {
        let source = source.into();
        let server = &self.handle.core.address;
        refusal::decode(&source, server, name, owner)
            .unwrap_or_else(|| Error::from_redis(server, name, owner, source))
    }
}

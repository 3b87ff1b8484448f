//! Waiting without polling: one shared subscription per channel, and a local wait entry per
//! channel whose semaphore the unlock messages feed.
//!
//! Two tasks per client:
//! - the *manager* owns SUBSCRIBE and UNSUBSCRIBE. Joining and leaving only name a channel to
//!   it; it compares which channels have wait entries with which it is subscribed to, and fixes
//!   the difference. Orders of joins and leaves therefore cannot leave a live entry unsubscribed
//!   or a dead one subscribed. Waiters are told a channel is subscribed only once the server
//!   has the subscription, which is what makes "subscribe, then attempt again" race-free.
//! - the *dispatcher* reads the subscriber's messages and hands each to the entry of its
//!   channel. A reader that fell behind, or a reconnect, may have lost messages: then every
//!   waiter is woken to try again.
//!
//! Beside the waiters' channels, a client that holds a lock its waiters listen for also listens
//! on a channel of its own, `fredlock_client:<client uuid>` ([`OwnChannel`]): a force unlock
//! publishes the lock's name there, and the watchdog looks at every hold at once. It is
//! subscribed once, with the client's first such hold, and kept: a client of spin locks only
//! never subscribes. It counts in no statistic of waits.
//!
//! An entry outlives its last waiter while its channel lingers subscribed, counting what is
//! delivered to it. A waiter that saw the channel subscribed before its attempt was sent, and
//! finds nothing delivered since when it joins, cannot have missed an unlock: it waits at once,
//! without the attempt that otherwise follows a new subscription ([`Quiet`]).

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::engine::key_slot;
use crate::engine::Value;
use dashmap::DashMap;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::mpsc::{self, UnboundedReceiver, UnboundedSender};
use tokio::sync::{Notify, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::engine::replicas::Writer;
use crate::engine::script::Script;
use crate::engine::{HashState, Key, Server, Subscriber};
use crate::error::{RedisError, RedisErrorKind};

/// A channel's name: a slice of its primitive's keys where it has one, so that naming it
/// (a lock handle's wake, a registry entry) copies nothing.
pub(crate) type Channel = crate::engine::Str;

/// The message that wakes every waiter of a channel instead of one (Redisson's read-unlock).
const WAKE_ALL_MESSAGE: i64 = 1;

/// The smallest number a client has in a lock's line (see `engine::line_number`): a message
/// from here up names the client a release wakes.
pub(crate) const FIRST_LINE_NUMBER: i64 = 1 << 52;

/// What a channel's messages say, and so whom they wake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Messages {
    /// A lock's unlock: `1` wakes every waiter, anything else one; but a client's number in
    /// the lock's line, published just before the unlock message, makes that message wake a
    /// waiter of that client alone (see [`WaitEntry::deliver`]).
    Unlock,
    /// How many units are free now (a semaphore's permits, Redisson's message): the waiters
    /// whose wants fit in it wake, in the order they came, and no more.
    Count,
    /// A count that reached zero (`0`, a count-down latch's): every waiter wakes; any other
    /// message (a new count) wakes nobody.
    AtZero,
}

/// Delay before a failed SUBSCRIBE or UNSUBSCRIBE is tried again.
const RETRY_DELAY: Duration = Duration::from_millis(250);

/// How long a channel stays subscribed after its last waiter left. A task that waits for the
/// same lock again soon (a worker loop; every waiter with a channel of its own) then
/// finds it subscribed, instead of paying a SUBSCRIBE, a PING and an UNSUBSCRIBE every time.
const LINGER: Duration = Duration::from_secs(1);

/// How often, with sharded subscriptions, the subscriber looks for slots that moved (a
/// migration, a failover). A node that loses a slot drops its subscribers' shard channels with
/// a `sunsubscribe` that fred does not pass on, so the manager compares the slot owners with
/// where it subscribed and subscribes again what moved. A waiter woken late by a move is still
/// bounded by its lock's TTL.
const SHARD_CHECK: Duration = Duration::from_secs(1);

/// The waiters of one channel in this client.
#[derive(Debug)]
pub(crate) struct WaitEntry {
    /// Kept here, not by each waiter: a waiting task carries its waiter all its wait.
    channel: Channel,
    /// What its messages say; set by the entry's first waiter (a channel belongs to one kind of
    /// primitive).
    messages: Messages,
    /// Wake-ups: a waiter takes as many as it wants (one, or a semaphore waiter's permits).
    permits: Semaphore,
    waiters: AtomicUsize,
    /// Waiters not in the lock's line (of a kind whose waiters stand in none, sharing the
    /// channel): while there is one, a release naming another client still wakes one here.
    unlisted: AtomicUsize,
    /// Whether the next unlock message follows a number in line, which took its place.
    after_number: AtomicBool,
    /// How a wake this client cannot use is passed on: set by the entry's first waiter that
    /// stands in line (only such a waiter's client is ever named).
    pass_on: OnceLock<PassOn>,
    /// What the waiters want in all: their number, where each wants one.
    wanted: AtomicUsize,
    subscribed: AtomicBool,
    subscribed_changed: Notify,
    /// Messages and wake-everyone events handed to this entry so far.
    delivered: AtomicU64,
    /// When a waiter of this entry standing in line last made an attempt: one attempt a third
    /// of a place keeps the client's place, whichever of its waiting tasks makes it.
    attempted: std::sync::Mutex<Option<Instant>>,
    /// Unique per entry in the process: a channel unsubscribed and subscribed again between a
    /// waiter's two looks is a new entry.
    id: u64,
}

/// A kind's call that passes a wake on (see `Kind::pass_on`), as a script and its arguments.
#[derive(Debug)]
pub(crate) struct PassOn {
    pub(crate) script: &'static Script,
    pub(crate) keys: Vec<Key>,
    pub(crate) args: Vec<Value>,
}

impl WaitEntry {
    fn new(channel: Channel, messages: Messages) -> WaitEntry {
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        WaitEntry {
            channel,
            messages,
            permits: Semaphore::new(0),
            waiters: AtomicUsize::new(0),
            unlisted: AtomicUsize::new(0),
            after_number: AtomicBool::new(false),
            pass_on: OnceLock::new(),
            wanted: AtomicUsize::new(0),
            subscribed: AtomicBool::new(false),
            subscribed_changed: Notify::new(),
            delivered: AtomicU64::new(0),
            attempted: std::sync::Mutex::new(None),
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        }
    }

    fn mark_subscribed(&self) {
        self.subscribed.store(true, Ordering::Release);
        self.subscribed_changed.notify_waiters();
    }

    /// Wakes one waiter, unless enough wake-ups are already pending for all of them.
    fn wake_one(&self) {
        // Counted before the waiters are read, as a joining waiter counts itself before it
        // reads this (both sequentially consistent): either it is woken or it sees the count
        // move and attempts again (see `Waiter::quiet_since`).
        self.delivered.fetch_add(1, Ordering::SeqCst);
        if self.permits.available_permits() < self.wanted.load(Ordering::SeqCst) {
            self.permits.add_permits(1);
        }
    }

    fn wake_all(&self) {
        self.wake_up_to(usize::MAX);
    }

    /// Makes `count` wake-ups pending, or as many as the waiters want if fewer: the semaphore
    /// hands them out in arrival order, so a waiter wanting more than is left is not passed
    /// over by later ones.
    fn wake_up_to(&self, count: usize) {
        self.delivered.fetch_add(1, Ordering::SeqCst);
        let target = count.min(self.wanted.load(Ordering::SeqCst));
        let pending = self.permits.available_permits();
        if target > pending {
            self.permits.add_permits(target - pending);
        }
    }

    /// Hands `message` to the waiters; `mine` is the client's number in line. Only the
    /// dispatcher calls it, one message at a time, so that a number and the unlock message
    /// after it (one script publishes both) are seen together.
    ///
    /// True when the message named this client and nobody here waits any more (the last waiter
    /// gave up, its place not yet gone): the wake must be passed on.
    fn deliver(&self, message: &Value, mine: i64) -> bool {
        let number = message.as_i64();
        match self.messages {
            Messages::Unlock if number == Some(WAKE_ALL_MESSAGE) => self.wake_all(),
            Messages::Unlock if number.is_some_and(|number| number >= FIRST_LINE_NUMBER) => {
                // A release naming the first client in line. Its unlock message, next, is for
                // Redisson's clients: here the number decides.
                if number == Some(mine) {
                    self.after_number.store(true, Ordering::Relaxed);
                    if self.wanted.load(Ordering::SeqCst) == 0 {
                        return true;
                    }
                    self.wake_one();
                } else if self.unlisted.load(Ordering::SeqCst) == 0 {
                    // Not counted as delivered: a waiter of this client stood in line before
                    // this release (its busy reply put it there), and the release would not
                    // have woken it, so a quiet it took before its attempt still holds.
                    self.after_number.store(true, Ordering::Relaxed);
                }
            }
            Messages::Unlock if self.after_number.swap(false, Ordering::Relaxed) => {}
            Messages::Unlock => self.wake_one(),
            Messages::Count => {
                // A message that is no count (a Java client's in another codec) wakes everyone
                // to look; a count of nothing free wakes nobody, but is delivered.
                let free = number.map_or(usize::MAX, |free| usize::try_from(free).unwrap_or(0));
                self.wake_up_to(free);
            }
            Messages::AtZero if number == Some(0) => self.wake_all(),
            Messages::AtZero => self.wake_up_to(0),
        }
        false
    }
}

/// A channel's entry as a waiter saw it before sending an attempt: subscribed, with so much
/// delivered.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Quiet {
    /// The low halves of the entry's id and count, which is all a waiter needs to tell them
    /// apart within its wait, in half the room.
    entry: u32,
    delivered: u32,
}

struct WaitEntries {
    /// Entries of channels with waiters, and of lingering ones.
    entries: DashMap<Channel, Arc<WaitEntry>, HashState>,
    /// How many entries there are, counted where they are made and removed: with none, the
    /// look-up every first attempt makes ([`PubSub::quiet`]) needs no hashing of its channel.
    live: AtomicUsize,
    /// Channels whose subscription the manager must check.
    changed: UnboundedSender<Channel>,
    /// Channels the manager is subscribed to, for [`PubSub::subscriptions`].
    subscriptions: AtomicUsize,
    own: OwnChannel,
    /// The client's number in the locks' lines.
    line_number: i64,
    /// Where a wake this client cannot use is passed on ([`pass_on`]).
    writer: Writer,
}

/// The client's own channel, on which force unlocks of its holds are announced.
struct OwnChannel {
    name: Channel,
    /// Set with the client's first hold that listens: from then on it stays subscribed.
    wanted: AtomicBool,
    /// The names its messages carried since the watchdog last took them.
    forced: std::sync::Mutex<Vec<String>>,
    /// Told of every message on it.
    heard: Notify,
}

/// The client's subscriptions and wait entries.
#[derive(Clone)]
pub(crate) struct PubSub {
    shared: Arc<WaitEntries>,
}

impl PubSub {
    /// Creates the registry and starts its two tasks, which run until `shutdown`.
    pub(crate) fn start(
        subscriber: Subscriber,
        sharded: bool,
        own: Channel,
        line_number: i64,
        writer: Writer,
        shutdown: CancellationToken,
    ) -> (PubSub, Vec<tokio::task::JoinHandle<()>>) {
        let (changed, changes) = mpsc::unbounded_channel();
        let shared = Arc::new(WaitEntries {
            entries: DashMap::with_hasher(HashState::default()),
            live: AtomicUsize::new(0),
            changed,
            subscriptions: AtomicUsize::new(0),
            own: OwnChannel {
                name: own,
                wanted: AtomicBool::new(false),
                forced: std::sync::Mutex::new(Vec::new()),
                heard: Notify::new(),
            },
            line_number,
            writer,
        });
        let manager = tokio::spawn(manage(
            subscriber.clone(),
            sharded,
            shared.clone(),
            changes,
            shutdown.clone(),
        ));
        let dispatcher = tokio::spawn(dispatch(subscriber, shared.clone(), shutdown));
        (PubSub { shared }, vec![manager, dispatcher])
    }

    /// Joins the waiters of `channel`, whose messages say `messages`, as a waiter that wants
    /// `want` wake-ups (one, or a semaphore waiter's permits), `listed` when its client stands
    /// in the lock's line; subscribes if this is the first.
    pub(crate) fn join(
        &self,
        channel: &Channel,
        messages: Messages,
        want: u32,
        listed: bool,
        pass_on: impl FnOnce() -> Option<PassOn>,
    ) -> Waiter {
        let want = want.max(1);
        let mut created = false;
        let entry = {
            let entry = self
                .shared
                .entries
                .entry(channel.clone())
                .or_insert_with(|| {
                    created = true;
                    self.shared.live.fetch_add(1, Ordering::Relaxed);
                    Arc::new(WaitEntry::new(channel.clone(), messages))
                });
            // Counted under the shard lock, so that the manager cannot remove the entry between
            // our lookup and our count.
            entry.wanted.fetch_add(want as usize, Ordering::SeqCst);
            if !listed {
                entry.unlisted.fetch_add(1, Ordering::SeqCst);
            } else if entry.pass_on.get().is_none() {
                if let Some(call) = pass_on() {
                    let _ = entry.pass_on.set(call);
                }
            }
            entry.waiters.fetch_add(1, Ordering::SeqCst);
            entry.clone()
        };
        if created {
            let _ = self.shared.changed.send(channel.clone());
        }
        Waiter {
            shared: self.shared.clone(),
            entry,
            want,
            listed,
        }
    }

    /// The channel's entry now, if its subscription is in effect: taken before an attempt is
    /// sent, it lets the waiter that joins after a busy reply skip the attempt that would
    /// otherwise follow its subscription.
    ///
    /// `channel` makes the channel's name, only when some entry could be its own: a first
    /// attempt on a client with nothing waiting makes no name and hashes nothing.
    pub(crate) fn quiet(&self, channel: impl FnOnce() -> Option<Channel>) -> Option<Quiet> {
        // A count that lags a new entry only makes its waiter take the attempt after joining.
        if self.shared.live.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let entry = self.shared.entries.get(&channel()?)?;
        entry.subscribed.load(Ordering::Acquire).then(|| Quiet {
            entry: entry.id as u32,
            delivered: entry.delivered.load(Ordering::SeqCst) as u32,
        })
    }

    /// Ends every wait for good, at shutdown: a waiter needs no shutdown future of its own
    /// beside its wait (it checks for shutdown once it has joined, so none slips between).
    pub(crate) fn close(&self) {
        for entry in self.shared.entries.iter() {
            entry.permits.close();
        }
    }

    /// Channels with local waiters.
    pub(crate) fn wait_entries(&self) -> usize {
        self.shared
            .entries
            .iter()
            .filter(|entry| entry.waiters.load(Ordering::Acquire) > 0)
            .count()
    }

    /// Channels this client is subscribed to.
    pub(crate) fn subscriptions(&self) -> usize {
        self.shared.subscriptions.load(Ordering::Acquire)
    }

    /// Listens on the client's own channel from now on (its first hold of a lock whose waiters
    /// listen): one load on every later hold.
    pub(crate) fn listen_own(&self) {
        let own = &self.shared.own;
        if !own.wanted.load(Ordering::Relaxed) && !own.wanted.swap(true, Ordering::AcqRel) {
            let _ = self.shared.changed.send(own.name.clone());
        }
    }

    /// Completes when a force unlock named one of this client's holds, with the names told
    /// since the last call.
    pub(crate) async fn forced(&self) -> Vec<String> {
        loop {
            let heard = self.shared.own.heard.notified();
            let names = std::mem::take(
                &mut *self
                    .shared
                    .own
                    .forced
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner),
            );
            if !names.is_empty() {
                return names;
            }
            heard.await;
        }
    }
}

/// One waiter's membership of a channel's wait entry; leaving (drop) unsubscribes with the last.
pub(crate) struct Waiter {
    shared: Arc<WaitEntries>,
    entry: Arc<WaitEntry>,
    /// Wake-ups it takes at a time.
    want: u32,
    /// Whether its client stands in the lock's line for it.
    listed: bool,
}

impl Waiter {
    /// Waits until the channel's subscription is confirmed, or `until`. Attempting only after
    /// this closes the race with an unlock published before the subscription existed.
    pub(crate) async fn subscribed(&self, until: Option<Instant>) -> bool {
        loop {
            let changed = self.entry.subscribed_changed.notified();
            if self.entry.subscribed.load(Ordering::Acquire) {
                return true;
            }
            match until {
                Some(until) => {
                    if tokio::time::timeout_at(until, changed).await.is_err() {
                        return false;
                    }
                }
                None => changed.await,
            }
        }
    }

    /// Whether another waiter of this client waits on the channel beside this one.
    pub(crate) fn has_company(&self) -> bool {
        self.entry.waiters.load(Ordering::Acquire) > 1
    }

    /// Whether nothing can have been missed since `before`: the same entry, still subscribed,
    /// with nothing delivered since. An unlock published after the attempt that followed
    /// `before` then wakes this waiter, which is counted already.
    pub(crate) fn quiet_since(&self, before: Quiet) -> bool {
        self.entry.id as u32 == before.entry
            && self.entry.subscribed.load(Ordering::Acquire)
            && self.entry.delivered.load(Ordering::SeqCst) as u32 == before.delivered
    }

    /// Notes that this waiter makes an attempt that keeps its client's place in line.
    pub(crate) fn attempting(&self) {
        if let Ok(mut attempted) = self.entry.attempted.lock() {
            *attempted = Some(Instant::now());
        }
    }

    /// Until when an attempt of another waiter of this client keeps the client's place in line,
    /// places being kept by an attempt every `every`: `None` when this waiter's own attempt is
    /// due.
    pub(crate) fn place_kept_until(&self, every: Duration) -> Option<Instant> {
        let attempted = *self.entry.attempted.lock().ok()?;
        let next = attempted? + every;
        (next > Instant::now()).then_some(next)
    }

    /// Waits for a wake-up or until `until`, or until the client shuts down ([`PubSub::close`]);
    /// [`woken`] tells which. The timed wait itself, with no future of its own around it, which
    /// would keep a second copy of it: every waiting task carries this.
    pub(crate) fn wait(
        &self,
        until: Instant,
    ) -> tokio::time::Timeout<impl Future<Output = Woken<'_>> + '_> {
        tokio::time::timeout_at(until, self.entry.permits.acquire_many(self.want))
    }
}

/// What a wait on an entry's permits ends with.
type Woken<'a> = Result<tokio::sync::SemaphorePermit<'a>, tokio::sync::AcquireError>;

/// Whether a [`Waiter::wait`] ended with a wake-up (taking it), rather than at its time or at
/// shutdown.
pub(crate) fn woken(wait: Result<Woken<'_>, tokio::time::error::Elapsed>) -> bool {
    match wait {
        Ok(Ok(permit)) => {
            permit.forget();
            true
        }
        _ => false,
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        // The last to leave tells the manager, which lets the channel linger, then removes the
        // entry (unless a waiter came back) and unsubscribes.
        self.entry
            .wanted
            .fetch_sub(self.want as usize, Ordering::AcqRel);
        if !self.listed {
            self.entry.unlisted.fetch_sub(1, Ordering::AcqRel);
        }
        if self.entry.waiters.fetch_sub(1, Ordering::AcqRel) == 1 {
            let _ = self.shared.changed.send(self.entry.channel.clone());
        }
    }
}

impl WaitEntries {
    /// Removes the channel's entry if nobody waits on it; true when it is gone (or was).
    fn remove_if_unused(&self, channel: &Channel) -> bool {
        let removed = self.entries.remove_if(channel, |_, entry| {
            entry.waiters.load(Ordering::Acquire) == 0
        });
        if let Some((_, entry)) = removed {
            self.live.fetch_sub(1, Ordering::Relaxed);
            entry.subscribed.store(false, Ordering::Release);
            return true;
        }
        !self.entries.contains_key(channel)
    }
}

async fn manage(
    subscriber: Subscriber,
    sharded: bool,
    shared: Arc<WaitEntries>,
    mut changes: UnboundedReceiver<Channel>,
    shutdown: CancellationToken,
) {
    let mut subscribed: HashSet<Channel> = HashSet::new();
    // Sharded: the node each channel was subscribed on.
    let mut homes: HashMap<Channel, Option<Server>> = HashMap::new();
    let mut shard_check = tokio::time::interval(SHARD_CHECK);
    shard_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut retry: HashSet<Channel> = HashSet::new();
    // Channels whose SUBSCRIBE failed without saying it was never sent (a timeout, a connection
    // lost under it): it may still take effect, even later (fred holds a command written while
    // it reconnects and sends it on the new connection). Such a channel is unsubscribed once
    // nobody waits on it, whether or not it seems subscribed; kept across reconnects.
    let mut uncertain: HashSet<Channel> = HashSet::new();
    // fred's own resubscribing (`manage_subscriptions`) stays off: with two owners of the
    // subscription set, channels left during a reconnect came back and stayed for good.
    let mut reconnects = subscriber.reconnects();
    // Subscribed channels without waiters, with when they left: unsubscribed after LINGER.
    let mut idle: HashMap<Channel, Instant> = HashMap::new();
    // Whether the client's own channel is subscribed (on the connection as it is now).
    let mut own_subscribed = false;
    loop {
        let mut pending: HashSet<Channel> = std::mem::take(&mut retry);
        let next_expiry = idle.values().min().map(|left| *left + LINGER);
        tokio::select! {
            _ = shutdown.cancelled() => break,
            changed = changes.recv() => match changed {
                Some(channel) => { pending.insert(channel); }
                None => break,
            },
            _ = tokio::time::sleep(RETRY_DELAY), if !pending.is_empty() => {}
            _ = sleep_until(next_expiry) => {}
            _ = shard_check.tick(), if sharded && !subscribed.is_empty() => {
                let moved = moved_channels(&subscriber, &homes).await;
                if !moved.is_empty() {
                    tracing::debug!(channels = moved.len(), "shard channels moved to another node; subscribing again");
                    for channel in moved {
                        // Not subscribed any more where it went: subscribe it there, and let
                        // its waiters try again, in case an unlock came during the move.
                        subscribed.remove(&channel);
                        homes.remove(&channel);
                        if let Some(entry) = shared.entries.get(&channel) {
                            entry.wake_all();
                        }
                        if !shared.remove_if_unused(&channel) {
                            pending.insert(channel);
                        }
                    }
                }
            }
            reconnected = reconnects.recv() => {
                if let Err(RecvError::Closed) = reconnected {
                    break;
                }
                // The new connection has no subscriptions: every channel with waiters is
                // subscribed again, and the rest forgotten.
                tracing::debug!(channels = subscribed.len(), "subscriber reconnected; subscribing again");
                own_subscribed = false;
                if shared.own.wanted.load(Ordering::Acquire) {
                    pending.insert(shared.own.name.clone());
                }
                // A channel subscribed before may be subscribed on the new connection already:
                // a SUBSCRIBE sent after the reconnect, before this announcement was read, went
                // there. So each is unsubscribed once nobody waits on it, never just forgotten
                // (an UNSUBSCRIBE of a channel the connection lacks is a no-op).
                pending.extend(subscribed.iter().cloned());
                uncertain.extend(subscribed.drain());
                homes.clear();
                idle.clear();
                let channels: Vec<Channel> =
                    shared.entries.iter().map(|entry| entry.key().clone()).collect();
                for channel in channels {
                    if let Some(entry) = shared.entries.get(&channel) {
                        entry.subscribed.store(false, Ordering::Release);
                    }
                    if !shared.remove_if_unused(&channel) {
                        pending.insert(channel);
                    }
                }
                forget_stale(&subscriber, &shared).await;
            }
        }
        // Fold everything queued meanwhile into one SUBSCRIBE and one UNSUBSCRIBE.
        while let Ok(channel) = changes.try_recv() {
            pending.insert(channel);
        }
        // The client's own channel: classic pub/sub (even sharded), subscribed for good.
        if pending.remove(&shared.own.name) && !own_subscribed {
            match subscriber
                .subscribe(vec![shared.own.name.to_string()])
                .await
            {
                Ok(()) => own_subscribed = true,
                Err(error) => {
                    tracing::debug!(%error, "could not listen for force unlocks; retrying");
                    retry.insert(shared.own.name.clone());
                }
            }
        }
        let now = Instant::now();
        let mut subscribe = Vec::new();
        let mut unsubscribe: Vec<Channel> = Vec::new();
        for channel in pending {
            let waiters = shared
                .entries
                .get(&channel)
                .map(|entry| (entry.clone(), entry.waiters.load(Ordering::Acquire) > 0));
            match (waiters, subscribed.contains(&channel)) {
                (Some((entry, true)), true) => {
                    idle.remove(&channel);
                    entry.mark_subscribed();
                }
                (Some((_, true)), false) => subscribe.push(channel),
                // Its last waiter left: it lingers from now (a waiter that came back and left
                // again starts it anew), its entry counting what is delivered.
                (Some((_, false)), true) | (None, true) => {
                    idle.insert(channel, now);
                }
                (Some((_, false)), false) => {
                    // Never subscribed, or no longer: nobody needs the entry (nor, when a
                    // SUBSCRIBE of it may have taken effect, the subscription).
                    if shared.remove_if_unused(&channel) && uncertain.contains(&channel) {
                        unsubscribe.push(channel);
                    }
                }
                (None, false) => {
                    if uncertain.contains(&channel) {
                        unsubscribe.push(channel);
                    }
                }
            }
        }
        // Idle long enough, and nobody came back (a waiter that did keeps the entry).
        idle.retain(|channel, left| {
            if now < *left + LINGER {
                return true;
            }
            if shared.remove_if_unused(channel) {
                unsubscribe.push(channel.clone());
            }
            false
        });
        if !subscribe.is_empty() {
            match subscribe_all(&subscriber, sharded, &subscribe).await {
                Ok(()) => {
                    for channel in subscribe {
                        if sharded {
                            homes.insert(channel.clone(), slot_owner(&subscriber, &channel));
                        }
                        match shared.entries.get(&channel) {
                            Some(entry) => entry.mark_subscribed(),
                            // Only the manager removes entries, so none went meanwhile;
                            // were one gone, its channel would linger like any other.
                            None => {
                                idle.entry(channel.clone()).or_insert(now);
                            }
                        }
                        uncertain.remove(&channel);
                        subscribed.insert(channel);
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, channels = subscribe.len(), "subscribe failed; retrying");
                    if error.kind() != RedisErrorKind::NotSent {
                        uncertain.extend(subscribe.iter().cloned());
                    }
                    retry.extend(subscribe);
                }
            }
        }
        if !unsubscribe.is_empty() {
            match unsubscribe_all(&subscriber, sharded, &unsubscribe).await {
                Ok(()) => {
                    // A waiter that joined meanwhile made a new entry and queued its channel
                    // again, so the next pass subscribes anew.
                    for channel in &unsubscribe {
                        subscribed.remove(channel);
                        homes.remove(channel);
                        uncertain.remove(channel);
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, channels = unsubscribe.len(), "unsubscribe failed; retrying");
                    retry.extend(unsubscribe);
                }
            }
        }
        shared
            .subscriptions
            .store(subscribed.len(), Ordering::Release);
    }
}

/// Drops from fred's tracked set (through UNSUBSCRIBE, a no-op on a new connection) the
/// channels without a wait entry, so that it never grows with channels nobody waits on.
async fn forget_stale(subscriber: &Subscriber, shared: &WaitEntries) {
    let stale: Vec<String> = subscriber
        .tracked_channels()
        .into_iter()
        .filter(|channel| {
            !shared.entries.contains_key(channel.as_str()) && *channel != *shared.own.name
        })
        .collect();
    if !stale.is_empty() {
        if let Err(error) = subscriber.unsubscribe(stale).await {
            tracing::debug!(%error, "could not forget stale channels after a reconnect");
        }
    }
}

fn names(channels: &[Channel]) -> Vec<String> {
    channels.iter().map(ToString::to_string).collect()
}

/// `channels` grouped by cluster slot: a sharded (un)subscribe names channels of one slot.
fn by_slot(channels: &[Channel]) -> HashMap<u16, Vec<String>> {
    let mut groups: HashMap<u16, Vec<String>> = HashMap::new();
    for channel in channels {
        groups
            .entry(key_slot(channel.as_bytes()))
            .or_default()
            .push(channel.to_string());
    }
    groups
}

/// Subscribes `channels` and waits until the server has the subscriptions: one SUBSCRIBE, or
/// with sharded pub/sub one SSUBSCRIBE per slot, on the slot's node.
async fn subscribe_all(
    subscriber: &Subscriber,
    sharded: bool,
    channels: &[Channel],
) -> Result<(), RedisError> {
    if !sharded {
        return subscriber.subscribe(names(channels)).await;
    }
    for names in by_slot(channels).into_values() {
        subscriber.ssubscribe(names).await?;
    }
    Ok(())
}

async fn unsubscribe_all(
    subscriber: &Subscriber,
    sharded: bool,
    channels: &[Channel],
) -> Result<(), RedisError> {
    if !sharded {
        return subscriber.unsubscribe(names(channels)).await;
    }
    for names in by_slot(channels).into_values() {
        subscriber.sunsubscribe(names).await?;
    }
    Ok(())
}

/// The node that owns `channel`'s slot, as the subscriber's routing table says.
fn slot_owner(subscriber: &Subscriber, channel: &Channel) -> Option<Server> {
    subscriber.slot_owner(key_slot(channel.as_bytes()))
}

/// The subscribed shard channels whose slot is now on another node than they were subscribed
/// on, after refreshing the routing table.
async fn moved_channels(
    subscriber: &Subscriber,
    homes: &HashMap<Channel, Option<Server>>,
) -> Vec<Channel> {
    if let Err(error) = subscriber.refresh_slots().await {
        tracing::debug!(%error, "could not refresh the cluster's slots");
        return Vec::new();
    }
    homes
        .iter()
        .filter(|(channel, home)| slot_owner(subscriber, channel) != **home)
        .map(|(channel, _)| channel.clone())
        .collect()
}

/// Sends the entry's pass-on call (the kind's, see `Kind::pass_on`): what a client does with a
/// release that named it in line when it no longer waits, so that the lock is not left free
/// while the others sleep out their pauses. Rare (a wait given up as a release named it).
fn pass_on(shared: &WaitEntries, entry: &WaitEntry) {
    let Some(call) = entry.pass_on.get() else {
        return;
    };
    let writer = shared.writer.clone();
    let channel = entry.channel.clone();
    tracing::debug!(%channel, "named in line with nobody waiting; passing the wake on");
    let (script, keys, args) = (call.script, call.keys.clone(), call.args.clone());
    tokio::spawn(async move {
        if let Err(error) = script.call::<Value>(&writer, keys, args).await {
            tracing::debug!(%channel, %error, "could not pass a wake on");
        }
    });
}

/// Sleeps until `deadline`, or forever without one.
async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

async fn dispatch(subscriber: Subscriber, shared: Arc<WaitEntries>, shutdown: CancellationToken) {
    let mut messages = subscriber.messages();
    let mut reconnects = subscriber.reconnects();
    let wake_everyone = |shared: &WaitEntries| {
        for entry in shared.entries.iter() {
            entry.wake_all();
        }
    };
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            message = messages.recv() => match message {
                Ok(message) => {
                    if *message.channel == *shared.own.name {
                        if let Some(name) = message.value.as_string() {
                            shared
                                .own
                                .forced
                                .lock()
                                .unwrap_or_else(std::sync::PoisonError::into_inner)
                                .push(name);
                            shared.own.heard.notify_one();
                        }
                    } else if let Some(entry) = shared.entries.get(&*message.channel) {
                        if entry.deliver(&message.value, shared.line_number) {
                            pass_on(&shared, &entry);
                        }
                    }
                }
                Err(RecvError::Lagged(missed)) => {
                    tracing::debug!(missed, "pub/sub reader fell behind; waking every waiter");
                    wake_everyone(&shared);
                }
                Err(RecvError::Closed) => break,
            },
            reconnect = reconnects.recv() => match reconnect {
                Ok(_) | Err(RecvError::Lagged(_)) => wake_everyone(&shared),
                Err(RecvError::Closed) => break,
            },
        }
    }
}

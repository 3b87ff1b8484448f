//! The Redis keys of one lock and the scripts that change them: what differs between the
//! reentrant lock and the fair lock. Everything else (waiting, guards, the watchdog) is shared.

use std::sync::Arc;

use fred::clients::Client;
use fred::types::{Key, Value};

use crate::ledger::Request;
use crate::names::{self, UNLOCK_MESSAGE};
use crate::scripts::{
    FAIR_ACQUIRE, FAIR_FORCE_UNLOCK, FAIR_LEAVE, FAIR_RELEASE, LOCK_ACQUIRE, LOCK_FORCE_UNLOCK,
    LOCK_RELEASE,
};

type RedisResult<T> = Result<T, fred::error::Error>;

/// The acquire scripts' reply when the owner holds the lock with a first hold although its
/// client counted more: those holds were gone.
const AFRESH: i64 = -3;

/// What one run of an acquire script did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Taken {
    /// The owner holds the lock, with one hold more than its client counted.
    Acquired,
    /// The owner holds the lock with one hold: the holds its client counted were gone.
    Afresh,
    /// Held by another owner, for this PTTL (ms; -1 without expiry).
    Held(i64),
}

/// A lock's name and the keys derived from it, built once per lock handle; clones of the handle,
/// its guards and its releases share them.
#[derive(Debug)]
pub(crate) struct LockKeys {
    pub(crate) name: Arc<str>,
    /// The name as sent to Redis: the hash of holds.
    pub(crate) key: Key,
    /// Reentrant lock: the channel every final unlock is published on. Fair lock: the prefix of
    /// each waiter's own channel, `<prefix>:<waiter field>`.
    channel: Key,
    channel_name: Arc<str>,
    /// Ids of calls whose replies were lost, which never take effect (see `ledger`).
    fences: Key,
    /// The fair lock's waiting line; `None` for the reentrant lock.
    queue: Option<QueueKeys>,
}

#[derive(Debug)]
struct QueueKeys {
    /// List of waiter fields in arrival order.
    queue: Key,
    /// Zset of waiter field -> end of its slot (server clock, ms).
    timeouts: Key,
}

impl LockKeys {
    pub(crate) fn reentrant(name: String) -> LockKeys {
        LockKeys::new(name, None)
    }

    pub(crate) fn fair(name: String) -> LockKeys {
        let queue = QueueKeys {
            queue: Key::from(names::fair_queue(&name)),
            timeouts: Key::from(names::fair_timeouts(&name)),
        };
        LockKeys::new(name, Some(queue))
    }

    fn new(name: String, queue: Option<QueueKeys>) -> LockKeys {
        let channel_name: Arc<str> = names::lock_channel(&name).into();
        LockKeys {
            key: Key::from(name.as_str()),
            channel: Key::from(&*channel_name),
            channel_name,
            fences: Key::from(names::fences(&name)),
            name: name.into(),
            queue,
        }
    }

    pub(crate) fn is_fair(&self) -> bool {
        self.queue.is_some()
    }

    /// The channel on which `field` hears that it may try again.
    pub(crate) fn wait_channel(&self, field: &str) -> Arc<str> {
        match self.queue {
            None => self.channel_name.clone(),
            Some(_) => names::waiter_channel(&self.channel_name, field).into(),
        }
    }

    /// Runs the acquire script once for `field`, which has `holds` holds by this client's count:
    /// `Ok(Acquired)` when it holds the lock afterwards, else how long to sleep at most before
    /// trying again (ms; -1 for a key without expiry).
    ///
    /// `slot` is the fair lock's waiter slot (at least 1 ms, the builder makes sure): `Some`
    /// joins the queue (or keeps the place and refreshes it) when the lock cannot be had, `None`
    /// makes a single attempt that leaves no trace. The reentrant lock has no queue and ignores
    /// it.
    pub(crate) async fn acquire(
        &self,
        redis: &Client,
        lease_ms: u64,
        field: &str,
        holds: usize,
        slot: Option<u64>,
        request: &Request,
    ) -> RedisResult<Taken> {
        let reply: Option<i64> = match &self.queue {
            None => {
                LOCK_ACQUIRE
                    .run(redis, || {
                        let mut args = vec![
                            Value::from(lease_ms as i64),
                            Value::from(field),
                            Value::from(holds as i64),
                        ];
                        request.append_to(&mut args);
                        (vec![self.key.clone(), self.fences.clone()], args)
                    })
                    .await?
            }
            Some(line) => {
                let args = || {
                    let mut args = vec![
                        Value::from(lease_ms as i64),
                        Value::from(field),
                        Value::from(slot.unwrap_or_default() as i64),
                        Value::from(holds as i64),
                    ];
                    request.append_to(&mut args);
                    args
                };
                FAIR_ACQUIRE.run(redis, || line.call(self, args())).await?
            }
        };
        Ok(match reply {
            None => Taken::Acquired,
            Some(AFRESH) => Taken::Afresh,
            Some(pttl) => Taken::Held(pttl),
        })
    }

    /// Runs the release script once: `field` keeps `left` holds (none: the lock is deleted and
    /// the release announced). `None` when `field` held nothing, `Some(1)` when the lock was
    /// released, `Some(0)` when holds remain. `lease_ms` 0 keeps the TTL as it is.
    pub(crate) async fn release(
        &self,
        redis: &Client,
        lease_ms: u64,
        field: &str,
        left: usize,
        request: &Request,
    ) -> RedisResult<Option<i64>> {
        let Some(line) = &self.queue else {
            return LOCK_RELEASE
                .run(redis, || {
                    let mut args = vec![
                        Value::from(UNLOCK_MESSAGE),
                        Value::from(lease_ms as i64),
                        Value::from(field),
                        Value::from(left as i64),
                    ];
                    request.append_to(&mut args);
                    (
                        vec![self.key.clone(), self.channel.clone(), self.fences.clone()],
                        args,
                    )
                })
                .await;
        };
        let args = || {
            let mut args = vec![
                Value::from(lease_ms as i64),
                Value::from(field),
                Value::from(left as i64),
            ];
            request.append_to(&mut args);
            args
        };
        FAIR_RELEASE.run(redis, || line.call(self, args())).await
    }

    /// Takes `field` out of a fair lock's queue: whether it was queued. The reentrant lock has
    /// no queue.
    pub(crate) async fn leave(
        &self,
        redis: &Client,
        field: &str,
        request: &Request,
    ) -> RedisResult<bool> {
        let Some(line) = &self.queue else {
            return Ok(false);
        };
        let args = || {
            let mut args = vec![Value::from(field)];
            request.append_to(&mut args);
            args
        };
        FAIR_LEAVE
            .run::<i64>(redis, || line.call(self, args()))
            .await
            .map(|removed| removed == 1)
    }

    /// Deletes the lock whoever holds it and wakes its waiter(s): `true` if it was held.
    pub(crate) async fn force_unlock(&self, redis: &Client) -> RedisResult<bool> {
        let deleted: i64 = match &self.queue {
            None => {
                LOCK_FORCE_UNLOCK
                    .run(redis, || {
                        (
                            vec![self.key.clone(), self.channel.clone()],
                            vec![Value::from(UNLOCK_MESSAGE)],
                        )
                    })
                    .await?
            }
            Some(line) => {
                FAIR_FORCE_UNLOCK
                    .run(redis, || line.call(self, Vec::new()))
                    .await?
            }
        };
        Ok(deleted == 1)
    }
}

impl QueueKeys {
    /// A fair-lock script's keys and arguments: every one takes the hash, queue and timeouts as
    /// KEYS, and the channel prefix and unlock message (to tell the next waiter) before `args`.
    fn call(&self, lock: &LockKeys, args: Vec<Value>) -> (Vec<Key>, Vec<Value>) {
        let mut argv = Vec::with_capacity(args.len() + 2);
        argv.push(Value::from(lock.channel.clone()));
        argv.push(Value::from(UNLOCK_MESSAGE));
        argv.extend(args);
        (
            vec![
                lock.key.clone(),
                self.queue.clone(),
                self.timeouts.clone(),
                lock.fences.clone(),
            ],
            argv,
        )
    }
}

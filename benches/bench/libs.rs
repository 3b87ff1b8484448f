//! One interface over the lock libraries compared: fredlock, `rslock` and the `redisson` crate.
//! Each is pointed at the benchmark's own loopback server only, with its default retry settings.

use fredlock::prelude::*;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Lease used by the peers, which have no watchdog in the form used here.
const PEER_TTL: Duration = Duration::from_secs(10);

/// A connection of one library, like a service instance's client.
pub trait Library: Send + Sync {
    /// A lock on `resource` for one task (one owner).
    fn handle(&self, resource: &str) -> Box<dyn Handle>;

    /// Closes the connections, for a scenario whose next subject must not share the server
    /// with them (a subscribed connection left open still receives every message). Dropping is
    /// enough for a library that closes what it dropped.
    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

/// One owner's view of one lock.
pub trait Handle: Send + Sync {
    /// Waits until the lock is held.
    fn acquire(&self) -> BoxFuture<'_, Box<dyn Held>>;
}

/// A held lock.
pub trait Held: Send {
    fn release(self: Box<Self>) -> BoxFuture<'static, ()>;
}

pub const NAMES: [&str; 3] = ["fredlock", "rslock 0.10", "redisson 0.1"];

/// fredlock's fair lock, compared in the contention scenario only (where order matters). The
/// `redisson` crate's fair lock is not compared: it polls every 100 ms and gives up after 100
/// polls with an error, which a 16-task contention run reaches.
pub const FAIR: &str = "fredlock fair";

/// fredlock's spin lock (waiters back off instead of listening), compared in the contention
/// scenario only, next to the fair and reentrant locks.
pub const SPIN: &str = "fredlock spin";

/// fredlock's reentrant lock on its redis-rs backend (issue 45), compared in the wake-up
/// scenario next to the same lock on fred.
pub const ON_REDIS_RS: &str = "fredlock on redis-rs";

/// Connects a client of library `name` to `url`.
pub async fn connect(name: &str, url: &str) -> Box<dyn Library> {
    match name {
        "fredlock" => Box::new(
            fredlock::LockClient::connect(url)
                .await
                .expect("fredlock connects"),
        ),
        FAIR => Box::new(FairClient(
            fredlock::LockClient::connect(url)
                .await
                .expect("fredlock connects"),
        )),
        SPIN => Box::new(SpinClient(
            fredlock::LockClient::connect(url)
                .await
                .expect("fredlock connects"),
        )),
        ON_REDIS_RS => Box::new(crate::scenarios::on_redis_rs_client(url).await),
        "rslock 0.10" => Box::new(rslock::LockManager::new(vec![url.to_string()])),
        "redisson 0.1" => Box::new(Arc::new(
            redisson::AsyncRedissonClient::new(redisson::RedissonConfig::single_server(url))
                .await
                .expect("redisson connects"),
        )),
        other => panic!("unknown library {other}"),
    }
}

impl Library for fredlock::LockClient {
    fn handle(&self, resource: &str) -> Box<dyn Handle> {
        Box::new(self.lock(resource))
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.shutdown())
    }
}

/// A client whose handles are fair locks.
struct FairClient(fredlock::LockClient);

impl Library for FairClient {
    fn handle(&self, resource: &str) -> Box<dyn Handle> {
        Box::new(fredlock::Lock::from(self.0.fair_lock(resource)))
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.0.shutdown())
    }
}

/// A client whose handles are spin locks.
struct SpinClient(fredlock::LockClient);

impl Library for SpinClient {
    fn handle(&self, resource: &str) -> Box<dyn Handle> {
        Box::new(self.0.spin_lock(resource).as_lock().clone())
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.0.shutdown())
    }
}

impl Handle for fredlock::Lock {
    fn acquire(&self) -> BoxFuture<'_, Box<dyn Held>> {
        Box::pin(
            async move { Box::new(self.lock().await.expect("fredlock lock")) as Box<dyn Held> },
        )
    }
}

impl Held for fredlock::LockGuard {
    fn release(self: Box<Self>) -> BoxFuture<'static, ()> {
        Box::pin(async move { self.unlock().await.expect("fredlock unlock") })
    }
}

struct RsHandle {
    manager: rslock::LockManager,
    resource: Vec<u8>,
}

impl Library for rslock::LockManager {
    fn handle(&self, resource: &str) -> Box<dyn Handle> {
        Box::new(RsHandle {
            manager: self.clone(),
            resource: resource.as_bytes().to_vec(),
        })
    }
}

impl Handle for RsHandle {
    fn acquire(&self) -> BoxFuture<'_, Box<dyn Held>> {
        Box::pin(async move {
            // `acquire` retries with rslock's defaults until it gets the lock.
            let guard = self
                .manager
                .acquire(self.resource.as_slice(), PEER_TTL)
                .await
                .expect("rslock acquire");
            Box::new(guard) as Box<dyn Held>
        })
    }
}

impl Held for rslock::LockGuard {
    fn release(self: Box<Self>) -> BoxFuture<'static, ()> {
        Box::pin(async move { (*self).release().await })
    }
}

impl Library for Arc<redisson::AsyncRedissonClient> {
    fn handle(&self, resource: &str) -> Box<dyn Handle> {
        Box::new(Arc::new(self.get_lock(resource)))
    }
}

impl Handle for Arc<redisson::AsyncRLock> {
    fn acquire(&self) -> BoxFuture<'_, Box<dyn Held>> {
        Box::pin(async move {
            self.lock().await.expect("redisson lock");
            Box::new(self.clone()) as Box<dyn Held>
        })
    }
}

impl Held for Arc<redisson::AsyncRLock> {
    fn release(self: Box<Self>) -> BoxFuture<'static, ()> {
        Box::pin(async move {
            self.unlock().await.expect("redisson unlock");
        })
    }
}

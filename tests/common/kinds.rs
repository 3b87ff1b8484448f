//! The lock kinds that share `Lock`'s behaviour, run by `for_each_kind!`, and the lock-level
//! helpers tests share.

#![allow(unused_imports)]

use super::*;
use std::future::Future;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fred::prelude::*;
use fredlock::prelude::*;

/// A fair lock's queue key, as Redisson names it (the library's own naming is private).
pub fn queue_key(name: &str) -> String {
    format!("redisson_lock_queue:{{{name}}}")
}

/// A fair lock's timeout zset key.
pub fn timeout_key(name: &str) -> String {
    format!("redisson_lock_timeout:{{{name}}}")
}

/// The composed text of a fredlock script, exactly as the crate sends it.
pub fn script(name: &str) -> &'static str {
    fredlock::script_source(name).unwrap_or_else(|| panic!("no script named {name}"))
}

/// The lock kinds that share `Lock`'s behaviour, for tests run once per kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Reentrant,
    Fair,
    /// The fenced lock, through the `Lock` it lends: the reentrant lock with its own acquire
    /// script.
    Fenced,
    /// The spin lock: the reentrant lock's layout, with waiters that back off instead of
    /// listening.
    Spin,
    /// The write side of a read-write lock: a hash with a `mode` field, whose owner field ends
    /// in `:write`.
    Write,
}

impl Kind {
    /// The lock of this kind named `name`.
    pub fn lock(self, client: &fredlock::LockClient, name: &str) -> fredlock::Lock {
        match self {
            Kind::Reentrant => client.lock(name),
            Kind::Fair => client.fair_lock(name).into(),
            Kind::Fenced => client.fenced_lock(name).as_lock().clone(),
            Kind::Spin => client.spin_lock(name).as_lock().clone(),
            Kind::Write => client.rw_lock(name).write_lock().as_lock().clone(),
        }
    }

    /// The field in the lock's hash of `owner`'s holds: the owner field, with `:write` for the
    /// write side.
    pub fn field(self, client: &fredlock::LockClient, owner: fredlock::OwnerId) -> String {
        let field = client.owner_field(owner);
        match self {
            Kind::Write => format!("{field}:write"),
            _ => field,
        }
    }

    /// Whether this kind's waiters listen for unlocks (all but the spin lock's).
    pub fn listens(self) -> bool {
        self != Kind::Spin
    }

    /// Runs this kind's release script for `field` directly, as a foreign client would, asking
    /// to leave it no holds.
    pub async fn raw_release(self, raw: &Client, name: &str, field: &str) -> Option<i64> {
        let channel = format!("redisson_lock__channel:{{{name}}}");
        let fences = format!("fredlock_fences:{{{name}}}");
        // Each script's keys and the arguments before the lease; then every one takes the lease,
        // the field, the holds to keep (none) and a request id.
        let (script_name, keys, mut args) = match self {
            Kind::Reentrant | Kind::Fenced | Kind::Spin => (
                "lock_release",
                vec![name.to_string(), channel, fences],
                vec!["0".to_string()],
            ),
            Kind::Fair => (
                "fair_release",
                vec![name.to_string(), queue_key(name), timeout_key(name), fences],
                vec![channel, "0".to_string()],
            ),
            Kind::Write => (
                "rw_write_release",
                vec![
                    name.to_string(),
                    format!("redisson_rwlock:{{{name}}}"),
                    fences,
                    format!("fredlock_rwlock_writers:{{{name}}}"),
                ],
                vec![format!("{{{name}}}")],
            ),
        };
        args.extend(["30000", field, "0", "1"].map(str::to_string));
        raw.eval(script(script_name), keys, args).await.unwrap()
    }
}

/// Runs `async fn $test(kind: Kind)` as one test per lock kind: `$test::reentrant`,
/// `$test::fair`, `$test::fenced`, `$test::spin` and `$test::write`.
#[macro_export]
macro_rules! for_each_kind {
    ($($test:ident),* $(,)?) => {$(
        mod $test {
            $crate::for_each_kind!(
                @kinds $test:
                reentrant Reentrant, fair Fair, fenced Fenced, spin Spin, write Write
            );
        }
    )*};
    (@kinds $test:ident: $($name:ident $kind:ident),*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $name() {
            $crate::common::bounded(super::$test($crate::common::Kind::$kind)).await
        }
    )*};
}

/// Drops 200 acquisitions of `contender` (a lock of another client) at random points, inside
/// the acquire round trip too, while `holder` takes and gives back the same lock in a loop;
/// panics if a hold leaked by a cancelled acquire blocks the holder.
pub async fn cancellation_storm(holder: fredlock::Lock, contender: fredlock::Lock) {
    use rand::Rng;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let holder = {
        let lock = holder;
        let stop = stop.clone();
        tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let guard = lock.lock().await.unwrap();
                let hold = rand::thread_rng().gen_range(0..3000);
                tokio::time::sleep(Duration::from_micros(hold)).await;
                guard.unlock().await.unwrap();
                tokio::task::yield_now().await;
            }
        })
    };
    let mut tasks = Vec::new();
    for i in 0..200 {
        let lock = contender.clone();
        // Timers tick in milliseconds, longer than a round trip on loopback; yields cancel
        // at finer points, inside the acquire script's round trip too.
        let (yields, after) = {
            let mut rng = rand::thread_rng();
            (
                rng.gen_range(0..400),
                Duration::from_micros(rng.gen_range(0..4000)),
            )
        };
        tasks.push(tokio::spawn(async move {
            // Whatever it got before being cancelled is released when the guard drops.
            if i % 2 == 0 {
                tokio::select! {
                    _ = lock.lock() => {}
                    _ = async { for _ in 0..yields { tokio::task::yield_now().await } } => {}
                }
            } else {
                let _ = tokio::time::timeout(after, lock.lock()).await;
            }
        }));
        if i % 10 == 9 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    // A hold leaked by a cancelled acquire would stall the holder for a whole 30 s lease.
    tokio::time::timeout(Duration::from_secs(5), holder)
        .await
        .expect("the holder was not blocked by a leaked hold")
        .unwrap();
}

/// Spawns a task that waits for `lock`, releases it at once, and returns when it got it.
pub fn time_acquisition(
    lock: impl Into<fredlock::Lock>,
) -> tokio::task::JoinHandle<tokio::time::Instant> {
    let lock = lock.into();
    tokio::spawn(async move {
        let guard = lock.lock().await.unwrap();
        let at = tokio::time::Instant::now();
        guard.unlock().await.unwrap();
        at
    })
}

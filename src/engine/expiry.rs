//! One timer for every hold a guard waits to lose ([`Hold::lost`]): the deadlines of the holds
//! waited on, and a task that sleeps until the earliest and marks a hold lost once past it.
//!
//! A waiter with a timer of its own cost every waited-on hold a timer registration, and tokio
//! wakes its time driver (an `eventfd` write and a parked worker's turn) for each timer that
//! comes before the driver's next wake-up: a job's run, which waits for its loss while the job
//! runs, took 1.22x rslock's lock+unlock on a multi-threaded runtime (1.04x on a
//! current-thread one), and 1.00x with the wait taken out (bench scenario 13). Here a waiter
//! writes its deadline into a map, and the task's timer is set again only when a deadline comes
//! before the one it sleeps until. A deadline given up (its waiter gone) is left to pass: the
//! task wakes for it once, finds nothing due, and sleeps until the next.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// What the task tells at its deadline (a hold).
pub(crate) trait Expire: Send + Sync + 'static {
    /// The deadline written down for it has passed.
    fn expire(&self);
}

/// The deadlines waited on.
pub(crate) struct Expiries<T> {
    state: Mutex<State<T>>,
    /// Wakes the task when a deadline comes before the one it sleeps until.
    sooner: Notify,
}

struct State<T> {
    /// (deadline, a number of its own) to the hold.
    due: BTreeMap<(Instant, u64), Weak<T>>,
    /// The next number.
    next: u64,
    /// What the task sleeps until; `None` while it sleeps without end.
    armed: Option<Instant>,
}

impl<T> Default for Expiries<T> {
    fn default() -> Expiries<T> {
        Expiries {
            state: Mutex::new(State {
                due: BTreeMap::new(),
                next: 0,
                armed: None,
            }),
            sooner: Notify::new(),
        }
    }
}

/// A deadline written down for a waiter, struck out when the waiter goes.
pub(crate) struct Watch<'a, T> {
    expiries: &'a Expiries<T>,
    key: (Instant, u64),
}

impl<T> Watch<'_, T> {
    /// Whether this watch is for `at`.
    pub(crate) fn is_for(&self, at: Instant) -> bool {
        self.key.0 == at
    }
}

impl<T> Drop for Watch<'_, T> {
    fn drop(&mut self) {
        self.expiries.state().due.remove(&self.key);
    }
}

impl<T> Expiries<T> {
    fn state(&self) -> std::sync::MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T: Expire> Expiries<T> {
    /// Writes down `hold`'s deadline `at`, until the returned watch is dropped.
    pub(crate) fn watch(&self, hold: &Arc<T>, at: Instant) -> Watch<'_, T> {
        let mut state = self.state();
        let key = (at, state.next);
        state.next += 1;
        state.due.insert(key, Arc::downgrade(hold));
        let sooner = state.armed.is_none_or(|armed| at < armed);
        if sooner {
            state.armed = Some(at);
        }
        drop(state);
        if sooner {
            self.sooner.notify_one();
        }
        Watch {
            expiries: self,
            key,
        }
    }

    /// Marks each hold lost at its deadline, until `shutdown`.
    pub(crate) async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let mut due = Vec::new();
        loop {
            let now = Instant::now();
            let next = {
                let mut state = self.state();
                while let Some(entry) = state.due.first_entry() {
                    if entry.key().0 > now {
                        break;
                    }
                    due.push(entry.remove());
                }
                // With none left, an instant still to come is kept: a watch made and struck out
                // while the task was woken for it (a job that ends at once) would otherwise
                // leave the task asleep without end, to be woken by the next watch, and by the
                // next: a wake-up per watch instead of one per deadline's length.
                let next = match state.due.first_key_value() {
                    Some((key, _)) => Some(key.0),
                    None => state.armed.filter(|armed| *armed > now),
                };
                state.armed = next;
                next
            };
            // Outside the map's lock: a loss wakes its waiters, who strike their watches out.
            for hold in due.drain(..).filter_map(|hold| hold.upgrade()) {
                hold.expire();
            }
            let sleep = async {
                match next {
                    Some(next) => tokio::time::sleep_until(next).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = sleep => {}
                () = self.sooner.notified() => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use super::*;

    /// When each expiry was told.
    #[derive(Default)]
    struct Told(Mutex<Vec<Instant>>);

    impl Expire for Told {
        fn expire(&self) {
            self.0.lock().unwrap().push(Instant::now());
        }
    }

    impl Told {
        fn times(&self) -> Vec<Instant> {
            self.0.lock().unwrap().clone()
        }
    }

    fn started() -> (Arc<Expiries<Told>>, CancellationToken) {
        let expiries = Arc::new(Expiries::default());
        let shutdown = CancellationToken::new();
        tokio::spawn(expiries.clone().run(shutdown.clone()));
        (expiries, shutdown)
    }

    #[tokio::test]
    async fn a_deadline_is_told_once_when_it_passes_and_not_before() {
        let (expiries, shutdown) = started();
        let told = Arc::new(Told::default());
        let at = Instant::now() + Duration::from_millis(50);
        let watch = expiries.watch(&told, at);
        assert!(watch.is_for(at));
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(told.times().is_empty(), "told before its deadline");
        tokio::time::sleep(Duration::from_millis(220)).await;
        let times = told.times();
        assert_eq!(times.len(), 1, "told {} times", times.len());
        assert!(times[0] >= at, "told {:?} early", at - times[0]);
        assert!(expiries.state().due.is_empty());
        drop(watch);
        shutdown.cancel();
    }

    #[tokio::test]
    async fn a_watch_dropped_before_its_deadline_is_never_told() {
        let (expiries, shutdown) = started();
        let told = Arc::new(Told::default());
        let watch = expiries.watch(&told, Instant::now() + Duration::from_millis(40));
        drop(watch);
        assert!(expiries.state().due.is_empty());
        tokio::time::sleep(Duration::from_millis(120)).await;
        assert!(told.times().is_empty());
        shutdown.cancel();
    }

    #[tokio::test]
    async fn a_sooner_deadline_wakes_the_task_sleeping_until_a_later_one() {
        let (expiries, shutdown) = started();
        let (late, soon) = (Arc::new(Told::default()), Arc::new(Told::default()));
        let _late = expiries.watch(&late, Instant::now() + Duration::from_secs(60));
        // The task is asleep until the late one before the soon one comes.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let at = Instant::now() + Duration::from_millis(30);
        let _soon = expiries.watch(&soon, at);
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert_eq!(soon.times().len(), 1, "the sooner deadline was not told");
        assert!(late.times().is_empty());
        shutdown.cancel();
    }

    #[tokio::test]
    async fn a_later_deadline_leaves_the_timer_where_it_is() {
        let (expiries, shutdown) = started();
        let (first, second) = (Arc::new(Told::default()), Arc::new(Told::default()));
        let at = Instant::now() + Duration::from_millis(40);
        let first_watch = expiries.watch(&first, at);
        let _second = expiries.watch(&second, at + Duration::from_millis(60));
        assert_eq!(
            expiries.state().armed,
            Some(at),
            "re-armed for a later deadline"
        );
        // Struck out, its instant still armed: the task wakes then, tells nobody, and sleeps
        // until the second.
        drop(first_watch);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(first.times().is_empty());
        assert_eq!(second.times().len(), 1);
        shutdown.cancel();
    }

    #[tokio::test]
    async fn a_watch_struck_out_at_once_leaves_its_instant_armed_for_the_next() {
        let (expiries, shutdown) = started();
        let told = Arc::new(Told::default());
        let at = Instant::now() + Duration::from_secs(30);
        // Made and struck out before the task runs, as a job that ends at once does.
        drop(expiries.watch(&told, at));
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(
            expiries.state().armed,
            Some(at),
            "the task let its instant go"
        );
        // The next one, later, does not wake the task.
        let _next = expiries.watch(&told, at + Duration::from_millis(5));
        assert_eq!(expiries.state().armed, Some(at));
        shutdown.cancel();
    }
}

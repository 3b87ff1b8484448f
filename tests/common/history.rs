//! Histories of operations, and a checker of what no history may show (issue 35): two holds of
//! one lock at once, fencing tokens that go back in real time, a semaphore past its permits, a
//! job tick run twice.
//!
//! Every instant is read from one monotonic clock, this process's `Instant`, so the tasks of
//! every client of a test share it; a child process's history joins its parent's on the same
//! clock (`CLOCK_MONOTONIC`, which `Instant` reads, is the machine's). A hold runs from its
//! acquire's return to its release's invoke or the moment its owner learnt of its loss,
//! whichever comes first: that is when its owner believes it holds the lock. An acquire that
//! failed (an error, a timeout) is no hold: its owner never believed it held anything, whatever
//! the server did.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

/// What an operation did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    /// An acquisition of `permits` (1 for a lock).
    Acquire { permits: u32 },
    /// The release of the hold the acquisition with the same id made.
    Release,
    /// The moment the owner learnt that hold was lost (`lost()` fired).
    Lost,
    /// The hold was found lost by its owner's first step, after its deadline (counted from
    /// before the call) had passed: its owner was paused between the answer and that step, and
    /// did nothing as its holder. Recorded at the call's invoke, so the hold stands for no time,
    /// and counted ([`Checked::never_stood`]).
    NeverStood,
    /// A guarded write of the holder (a leader's `eval_while_held`) was refused: the server
    /// says the hold is gone, and its owner, which believed it until the write, knows it now.
    /// Counted ([`Checked::writes_refused`]).
    WriteRefused,
    /// A run of a job for a scheduled tick (ms since the epoch).
    Run { tick: u64 },
}

/// How an operation ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// It did what was asked: acquired, released, ran.
    Ok,
    /// It was refused: held by another within the wait, a tick already run.
    Refused,
    /// It failed; whether it took effect on the server is unknown.
    Failed(String),
}

/// One operation of one client.
#[derive(Clone, Debug)]
pub struct Op {
    /// The hold (or run) it belongs to: an acquisition and its release share it.
    pub id: u64,
    /// Who: a client and task, for people.
    pub client: String,
    /// The primitive's name.
    pub target: String,
    pub call: Call,
    /// When it was invoked and when it returned, since the history began.
    pub invoke: Duration,
    pub ret: Duration,
    pub outcome: Outcome,
    /// The fencing token (or epoch) an acquisition was given.
    pub token: Option<u64>,
}

/// A history being recorded; clones record into the same one.
#[derive(Clone)]
pub struct History {
    start: Instant,
    /// `start` on the machine's monotonic clock, in ns.
    origin_ns: u64,
    ops: Arc<Mutex<Vec<Op>>>,
    next: Arc<AtomicU64>,
    /// How many acquisitions have returned a hold, for a fault to strike right after one.
    acquired: Arc<tokio::sync::watch::Sender<u64>>,
}

impl Default for History {
    fn default() -> History {
        History::new()
    }
}

impl History {
    pub fn new() -> History {
        History {
            start: Instant::now(),
            origin_ns: monotonic_ns(),
            ops: Arc::default(),
            next: Arc::new(AtomicU64::new(1)),
            acquired: Arc::new(tokio::sync::watch::channel(0).0),
        }
    }

    /// Changes each time an acquisition returns a hold.
    pub fn acquisitions(&self) -> tokio::sync::watch::Receiver<u64> {
        self.acquired.subscribe()
    }

    /// Now, on the history's clock.
    pub fn now(&self) -> Duration {
        self.start.elapsed()
    }

    /// A new hold's (or run's) id.
    pub fn id(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    pub fn record(&self, op: Op) {
        self.ops.lock().unwrap().push(op);
    }

    /// Runs the acquisition `call` of `permits` on `target` for `client`, recording it: its
    /// hold's id and what it returned. `token` reads the fencing token off the guard.
    pub async fn acquire<G, E: fmt::Debug>(
        &self,
        client: &str,
        target: &str,
        permits: u32,
        call: impl Future<Output = Result<Option<G>, E>>,
        token: impl Fn(&G) -> Option<u64>,
    ) -> (u64, Option<G>) {
        let id = self.id();
        let invoke = self.now();
        let result = call.await;
        let ret = self.now();
        let (outcome, token, guard) = match result {
            Ok(Some(guard)) => {
                self.acquired.send_modify(|count| *count += 1);
                (Outcome::Ok, token(&guard), Some(guard))
            }
            Ok(None) => (Outcome::Refused, None, None),
            Err(error) => (Outcome::Failed(format!("{error:?}")), None, None),
        };
        self.record(Op {
            id,
            client: client.to_owned(),
            target: target.to_owned(),
            call: Call::Acquire { permits },
            invoke,
            ret,
            outcome,
            token,
        });
        (id, guard)
    }

    /// Runs the release `call` of hold `id`, recording it.
    pub async fn release<E: fmt::Debug>(
        &self,
        id: u64,
        client: &str,
        target: &str,
        call: impl Future<Output = Result<(), E>>,
    ) {
        let invoke = self.now();
        let result = call.await;
        let ret = self.now();
        self.record(Op {
            id,
            client: client.to_owned(),
            target: target.to_owned(),
            call: Call::Release,
            invoke,
            ret,
            outcome: match result {
                Ok(()) => Outcome::Ok,
                Err(error) => Outcome::Failed(format!("{error:?}")),
            },
            token: None,
        });
    }

    /// Records that hold `id`'s owner learnt now that it was lost.
    pub fn lost(&self, id: u64, client: &str, target: &str) {
        self.lost_at(id, client, target, self.now());
    }

    /// Records that hold `id`'s owner believed it held until `at`, and then learnt it was lost.
    pub fn lost_at(&self, id: u64, client: &str, target: &str, at: Duration) {
        self.ended(id, client, target, Call::Lost, at);
    }

    /// Records that hold `id` never stood (see [`Call::NeverStood`]); `asked` is when its
    /// acquisition was invoked.
    pub fn never_stood(&self, id: u64, client: &str, target: &str, asked: Duration) {
        self.ended(id, client, target, Call::NeverStood, asked);
    }

    /// Records that hold `id`'s owner believed it held until `at`, when the server refused its
    /// guarded write (see [`Call::WriteRefused`]).
    pub fn write_refused_at(&self, id: u64, client: &str, target: &str, at: Duration) {
        self.ended(id, client, target, Call::WriteRefused, at);
    }

    fn ended(&self, id: u64, client: &str, target: &str, call: Call, at: Duration) {
        self.record(Op {
            id,
            client: client.to_owned(),
            target: target.to_owned(),
            call,
            invoke: at,
            ret: at,
            outcome: Outcome::Ok,
            token: None,
        });
    }

    pub fn ops(&self) -> Vec<Op> {
        self.ops.lock().unwrap().clone()
    }

    /// The operations as lines another process can read ([`History::join_lines`]), with their
    /// instants on the machine's monotonic clock.
    pub fn lines(&self) -> String {
        let at = |instant: Duration| self.origin_ns + instant.as_nanos() as u64;
        let mut text = String::new();
        for op in self.ops() {
            let call = match op.call {
                Call::Acquire { permits } => format!("acquire:{permits}"),
                Call::Release => "release".into(),
                Call::Lost => "lost".into(),
                Call::NeverStood => "never-stood".into(),
                Call::WriteRefused => "write-refused".into(),
                Call::Run { tick } => format!("run:{tick}"),
            };
            let outcome = match op.outcome {
                Outcome::Ok => "ok".into(),
                Outcome::Refused => "refused".into(),
                Outcome::Failed(error) => format!("failed:{}", error.replace(['\t', '\n'], " ")),
            };
            let token = op.token.map_or("-".into(), |token| token.to_string());
            text.push_str(&format!(
                "{LINE}\t{}\t{}\t{}\t{call}\t{}\t{}\t{outcome}\t{token}\n",
                op.id,
                op.client,
                op.target,
                at(op.invoke),
                at(op.ret)
            ));
        }
        text
    }

    /// Adds the operations another process wrote with [`History::lines`] (other lines of
    /// `text` are skipped), on this history's clock; their ids are kept apart from this one's.
    /// How many were added.
    pub fn join_lines(&self, text: &str) -> usize {
        let mut added = 0;
        for line in text.lines() {
            let fields: Vec<&str> = line.split('\t').collect();
            let [LINE, id, client, target, call, invoke, ret, outcome, token] = fields[..] else {
                continue;
            };
            let since = |ns: &str| {
                Duration::from_nanos(ns.parse::<u64>().unwrap().saturating_sub(self.origin_ns))
            };
            let call = match call.split_once(':') {
                Some(("acquire", permits)) => Call::Acquire {
                    permits: permits.parse().unwrap(),
                },
                Some(("run", tick)) => Call::Run {
                    tick: tick.parse().unwrap(),
                },
                None if call == "release" => Call::Release,
                None if call == "never-stood" => Call::NeverStood,
                None if call == "write-refused" => Call::WriteRefused,
                _ => Call::Lost,
            };
            let outcome = match outcome.split_once(':') {
                Some(("failed", error)) => Outcome::Failed(error.to_owned()),
                _ if outcome == "refused" => Outcome::Refused,
                _ => Outcome::Ok,
            };
            self.record(Op {
                id: CHILD_IDS + id.parse::<u64>().unwrap(),
                client: client.to_owned(),
                target: target.to_owned(),
                call,
                invoke: since(invoke),
                ret: since(ret),
                outcome,
                token: token.parse().ok(),
            });
            added += 1;
        }
        added
    }
}

/// How a line of [`History::lines`] starts.
const LINE: &str = "history-op";

/// Where the ids of another process's operations start.
const CHILD_IDS: u64 = 1 << 40;

/// Now on the machine's monotonic clock (the one `Instant` reads), in ns: comparable between
/// processes.
pub fn monotonic_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes only the timespec it is given, which lives on this stack.
    let read = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    assert_eq!(read, 0, "clock_gettime(CLOCK_MONOTONIC)");
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

/// A hold as the checker sees it: when its owner believed it held `permits` of `target`.
#[derive(Clone, Copy, Debug)]
struct Hold {
    id: u64,
    start: Duration,
    end: Duration,
    permits: u32,
}

/// What a history showed that it must not, with the shortest stretch of it that shows it.
#[derive(Debug)]
pub struct Violation {
    pub what: String,
    /// The operations that show it: those of the holds involved and every other operation on
    /// the same target that overlaps the stretch, in invoke order.
    pub window: Vec<Op>,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}; the history around it:", self.what)?;
        for op in &self.window {
            writeln!(
                f,
                "  {:>9.3} ms .. {:>9.3} ms  hold {:>5}  {:<12} {:<16} {:?} -> {:?}{}",
                op.invoke.as_secs_f64() * 1e3,
                op.ret.as_secs_f64() * 1e3,
                op.id,
                op.client,
                op.target,
                op.call,
                op.outcome,
                op.token.map(|t| format!(" token {t}")).unwrap_or_default()
            )?;
        }
        Ok(())
    }
}

/// What a clean history held.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Checked {
    pub holds: usize,
    pub tokens: usize,
    pub runs: usize,
    /// Holds found lost by their owner's first step past their deadline, which count as never
    /// standing ([`Call::NeverStood`]): printed with every run, so that a run where the rule
    /// hides many holds shows it.
    pub never_stood: usize,
    /// Holds whose end their owner learnt from a guarded write the server refused
    /// ([`Call::WriteRefused`]), not from its guard.
    pub writes_refused: usize,
}

/// Checks `ops`: on each target, holds never take more than `permits[target]` at once (1 when
/// the target is not listed: a lock); a token is above every token whose acquisition returned
/// before its own was invoked; each tick of a job ran at most once.
pub fn check(ops: &[Op], permits: &HashMap<String, u32>) -> Result<Checked, Violation> {
    let mut checked = Checked::default();
    let mut by_target: HashMap<&str, Vec<&Op>> = HashMap::new();
    for op in ops {
        by_target.entry(&op.target).or_default().push(op);
    }
    for (target, ops) in &by_target {
        let limit = permits.get(*target).copied().unwrap_or(1);
        let holds = holds(ops);
        checked.holds += holds.len();
        checked.never_stood += ops.iter().filter(|op| op.call == Call::NeverStood).count();
        checked.writes_refused += ops
            .iter()
            .filter(|op| op.call == Call::WriteRefused)
            .count();
        check_permits(target, ops, &holds, limit)?;
        checked.tokens += check_tokens(target, ops)?;
        checked.runs += check_runs(target, ops)?;
    }
    Ok(checked)
}

/// The holds the acquisitions of `ops` made, each ending at its release's invoke or its loss.
fn holds(ops: &[&Op]) -> Vec<Hold> {
    let mut ends: HashMap<u64, Duration> = HashMap::new();
    for op in ops {
        if matches!(
            op.call,
            Call::Release | Call::Lost | Call::NeverStood | Call::WriteRefused
        ) {
            let end = ends.entry(op.id).or_insert(op.invoke);
            *end = (*end).min(op.invoke);
        }
    }
    ops.iter()
        .filter_map(|op| match (op.call, &op.outcome) {
            (Call::Acquire { permits }, Outcome::Ok) => Some(Hold {
                id: op.id,
                start: op.ret,
                // Never given back within the history: held to its end.
                end: ends.get(&op.id).copied().unwrap_or(Duration::MAX),
                permits,
            }),
            _ => None,
        })
        .collect()
}

fn check_permits(target: &str, ops: &[&Op], holds: &[Hold], limit: u32) -> Result<(), Violation> {
    // Ends before starts at the same instant: a release's invoke may coincide with the next
    // acquisition's return only if that one began after it.
    let mut edges: Vec<(Duration, bool, usize)> = Vec::new();
    for (i, hold) in holds.iter().enumerate() {
        if hold.end > hold.start {
            edges.push((hold.start, true, i));
            edges.push((hold.end, false, i));
        }
    }
    edges.sort_by_key(|&(at, starts, _)| (at, starts));
    let mut taken = 0u32;
    let mut active: Vec<usize> = Vec::new();
    for (at, starts, i) in edges {
        if starts {
            taken += holds[i].permits;
            active.push(i);
            if taken > limit {
                let involved: Vec<Hold> = active.iter().map(|&i| holds[i]).collect();
                let what = if limit == 1 {
                    format!(
                        "{target}: holds {} at once at {:.3} ms",
                        involved
                            .iter()
                            .map(|hold| hold.id.to_string())
                            .collect::<Vec<_>>()
                            .join(" and "),
                        at.as_secs_f64() * 1e3
                    )
                } else {
                    format!(
                        "{target}: {taken} permits of {limit} taken at once at {:.3} ms",
                        at.as_secs_f64() * 1e3
                    )
                };
                return Err(Violation {
                    what,
                    window: window(ops, &involved, at),
                });
            }
        } else {
            taken -= holds[i].permits;
            active.retain(|&j| j != i);
        }
    }
    Ok(())
}

/// The operations that show a violation at `at` among `involved` holds: theirs, and every
/// other on the target that overlaps the stretch from the first of them to `at`.
fn window(ops: &[&Op], involved: &[Hold], at: Duration) -> Vec<Op> {
    let from = involved
        .iter()
        .filter_map(|hold| {
            ops.iter()
                .find(|op| op.id == hold.id && matches!(op.call, Call::Acquire { .. }))
                .map(|op| op.invoke)
        })
        .min()
        .unwrap_or(at);
    let mut shown: Vec<Op> = ops
        .iter()
        .filter(|op| {
            involved.iter().any(|hold| hold.id == op.id) || (op.ret >= from && op.invoke <= at)
        })
        .map(|op| (*op).clone())
        .collect();
    shown.sort_by_key(|op| (op.invoke, op.id));
    shown
}

fn check_tokens(target: &str, ops: &[&Op]) -> Result<usize, Violation> {
    let mut tokened: Vec<&Op> = ops
        .iter()
        .copied()
        .filter(|op| matches!(op.call, Call::Acquire { .. }) && op.token.is_some())
        .collect();
    // Each acquisition against every one that returned before it was invoked: the highest
    // such token must be below its own.
    let mut by_return = tokened.clone();
    by_return.sort_by_key(|op| op.ret);
    tokened.sort_by_key(|op| op.invoke);
    let mut before: Option<&Op> = None;
    let mut next = 0;
    for op in &tokened {
        while next < by_return.len() && by_return[next].ret < op.invoke {
            let candidate = by_return[next];
            if before.is_none_or(|best| candidate.token > best.token) {
                before = Some(candidate);
            }
            next += 1;
        }
        if let Some(earlier) = before {
            if earlier.token >= op.token {
                let mut window = vec![earlier.clone(), (*op).clone()];
                window.sort_by_key(|op| op.invoke);
                return Err(Violation {
                    what: format!(
                        "{target}: token {} given after token {} had been returned",
                        op.token.unwrap_or_default(),
                        earlier.token.unwrap_or_default()
                    ),
                    window,
                });
            }
        }
    }
    Ok(tokened.len())
}

fn check_runs(target: &str, ops: &[&Op]) -> Result<usize, Violation> {
    let mut ran: HashMap<u64, &Op> = HashMap::new();
    for op in ops {
        if let (Call::Run { tick }, Outcome::Ok) = (op.call, &op.outcome) {
            if let Some(first) = ran.insert(tick, op) {
                return Err(Violation {
                    what: format!("{target}: tick {tick} ran twice"),
                    window: vec![first.clone(), (*op).clone()],
                });
            }
        }
    }
    Ok(ran.len())
}

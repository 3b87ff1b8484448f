//! One request to every Redlock node at once, each bounded by the per-node timeout, and the
//! tally of their replies.
//!
//! The requests are polled together in the caller's task; the caller reads replies in the order
//! they arrive and stops as soon as it can decide, so a node that never answers holds up nobody.
//! fred hands a command to its connection on the future's first poll, and the first poll of
//! [`Replies::tally`] polls every request: from then on every request is on its way, in order
//! behind anything sent before on that node's connection and ahead of anything sent after. That
//! order is what makes a release sent after an abandoned acquisition delete what it wrote.
//! Requests nobody reads to the end (dropped unpolled, or still out when the caller decided) are
//! finished in a task: a script call may need its second step, the `EVAL` after a `NOSCRIPT`.

use std::fmt;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::{Arc, LazyLock};
use std::task::Poll;
use std::time::Duration;

use crate::engine::{Key, Value};
use crate::engine::{Script, Writer};
use rand::RngCore;
use tokio::time::Instant;

use crate::client::LockClient;
use crate::engine::join::join_all;
use crate::engine::WakeRule;
use crate::engine::{write, Attempts, Backoff, Class, Keys, Primitive, Profile, ProfileOf};
use crate::error::{is_transient, NodeFailure, NodeFailureReason, RedisError};
use crate::lua;

/// Both scripts of a Redlock node: the token check, then a section each.
const SCRIPTS: &str = include_str!("../../lua/redlock.lua");

/// Deletes a Redlock node's key if it carries the given token.
static REDLOCK_RELEASE: LazyLock<Script> =
    LazyLock::new(|| lua::section_script(SCRIPTS, "release", true));
/// Sets a new lease on a Redlock node's key if it carries the given token.
static REDLOCK_EXTEND: LazyLock<Script> =
    LazyLock::new(|| lua::section_script(SCRIPTS, "extend", true));

/// The composed text of a Redlock node's script `name`, for tests and the benchmark.
pub(crate) fn script(name: &str) -> Option<&'static Script> {
    Some(match name {
        "release" => &REDLOCK_RELEASE,
        "extend" => &REDLOCK_EXTEND,
        _ => return None,
    })
}

/// Random bytes in a token: the Redlock specification asks for at least 20.
const TOKEN_BYTES: usize = 20;

/// The value one acquisition writes on every node: 20 random bytes, hex encoded. Release and
/// extension act only on keys carrying it.
#[derive(Clone)]
pub(crate) struct Token(Arc<str>);

impl Token {
    pub(crate) fn new() -> Token {
        let mut bytes = [0u8; TOKEN_BYTES];
        rand::thread_rng().fill_bytes(&mut bytes);
        // Once per acquisition: hex by table, one allocation.
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut text = String::with_capacity(TOKEN_BYTES * 2);
        for byte in bytes {
            text.push(char::from(HEX[usize::from(byte >> 4)]));
            text.push(char::from(HEX[usize::from(byte & 0x0f)]));
        }
        Token(text.into())
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What one node answered.
pub(crate) enum NodeReply {
    /// Set, extended or deleted.
    Done,
    /// No such key (extend, release).
    Missing,
    /// The key carries another token.
    Other,
    Failed(NodeFailureReason),
}

/// The nodes of one Redlock and the key they share.
pub(crate) struct Nodes {
    pub(crate) clients: Vec<LockClient>,
    pub(crate) key: Key,
    /// The key as the engine sees a primitive, for the permission question a node's refusal
    /// asks again.
    pub(crate) kind: Arc<NodeKey>,
}

/// The Redis commands `lua/redlock.lua`'s scripts run, and the `SET` of an acquisition,
/// sent by itself.
const SCRIPT_COMMANDS: &[&str] = &["del", "get", "pexpire", "set"];

/// What a Redlock runs on each node (its class's [`Class::commands`]).
const COMMANDS: &[&[&str]] = &[SCRIPT_COMMANDS];

/// What the engine asks about a Redlock's key on a node: the key alone, no channel (nobody
/// waits on one: an acquisition retries after its delay).
static REDLOCK: Class = Class::new(
    "redlock",
    WakeRule::Backoff(Backoff {
        first: Duration::from_millis(1),
        cap: Duration::from_millis(1),
    }),
    COMMANDS,
);

/// A Redlock's key as a primitive of the engine (see [`Nodes::kind`]).
pub(crate) struct NodeKey {
    profile: ProfileOf<[u32; 0]>,
}

impl NodeKey {
    pub(crate) fn new(key: &str) -> NodeKey {
        NodeKey {
            profile: ProfileOf::new(&REDLOCK, Keys::new([key])),
        }
    }
}

impl Primitive for NodeKey {
    fn profile(&self) -> &Profile {
        &self.profile
    }
}

impl Nodes {
    pub(crate) fn len(&self) -> usize {
        self.clients.len()
    }

    /// A majority: `N / 2 + 1`.
    pub(crate) fn quorum(&self) -> usize {
        self.clients.len() / 2 + 1
    }

    /// How many nodes may refuse or fail with a majority still possible.
    pub(crate) fn tolerated(&self) -> usize {
        self.clients.len() - self.quorum()
    }

    /// Each node's refusal of the permission question (see the engine's `permissions.rs`),
    /// asked before an attempt's `SET`s of the nodes whose client has not been found to have
    /// what a Redlock needs, so that a user who may not release never takes; empty when every
    /// client was. The questions run in tasks of their own, each within `timeout`, and this
    /// returns once a majority of nodes may be written (answered yes, known, or without an
    /// answer, which goes on unchecked) or every node answered: a stalled node costs no more
    /// than it costs the round. A `SET` is never held back behind its question, so it is on
    /// the wire before any release that may follow it.
    pub(crate) async fn refusals(&self, timeout: Duration) -> Vec<Option<RedisError>> {
        let kind = &self.kind;
        let unknown: Vec<usize> = (0..self.clients.len())
            .filter(|&i| !self.clients[i].engine().permission_known(&**kind))
            .collect();
        let mut refused: Vec<Option<RedisError>> = Vec::new();
        if unknown.is_empty() {
            return refused;
        }
        refused.resize_with(self.clients.len(), || None);
        let (answers, mut answered) = tokio::sync::mpsc::unbounded_channel();
        for &index in &unknown {
            let (client, kind, answers) =
                (self.clients[index].clone(), kind.clone(), answers.clone());
            tokio::spawn(async move {
                let answer = client.engine().ask_permission(&*kind, Some(timeout)).await;
                let _ = answers.send((index, answer));
            });
        }
        drop(answers);
        let mut writable = self.clients.len() - unknown.len();
        while writable < self.quorum() {
            let Some((index, answer)) = answered.recv().await else {
                break;
            };
            match answer {
                Ok(()) => writable += 1,
                Err(refusal) => refused[index] = Some(refusal),
            }
        }
        refused
    }

    /// `SET key token NX PX lease` on every node but those `refused` (see
    /// [`refusals`](Self::refusals)).
    pub(crate) fn set_everywhere(
        &self,
        token: &Token,
        lease_ms: u64,
        timeout: Duration,
        refused: Vec<Option<RedisError>>,
    ) -> Replies {
        self.on_every_node(
            token,
            timeout,
            refused,
            move |writer, key, token| async move {
                // Sent once: the release that may follow must come after it on the wire.
                let slot = || Some(crate::engine::key_slot(key.as_bytes()));
                let reply: Option<String> = write(&writer, Attempts::Once, slot, |redis| {
                    let px = i64::try_from(lease_ms).unwrap_or(i64::MAX);
                    redis.command(
                        "SET",
                        vec![
                            Value::from(key.clone()),
                            Value::from(token.as_str()),
                            Value::from("NX"),
                            Value::from("PX"),
                            Value::from(px),
                        ],
                    )
                })
                .await?;
                Ok(if reply.is_some() {
                    NodeReply::Done
                } else {
                    NodeReply::Other
                })
            },
        )
    }

    /// Compare-and-pexpire on every node.
    pub(crate) fn extend(&self, token: &Token, lease_ms: u64, timeout: Duration) -> Replies {
        self.script_everywhere(&REDLOCK_EXTEND, token, timeout, Some(lease_ms))
    }

    /// Compare-and-delete on every node.
    pub(crate) fn release(&self, token: &Token, timeout: Duration) -> Replies {
        self.script_everywhere(&REDLOCK_RELEASE, token, timeout, None)
    }

    /// One of the compare scripts on every node: the key, then the token and the lease (if
    /// one) as its arguments.
    fn script_everywhere(
        &self,
        script: &'static Script,
        token: &Token,
        timeout: Duration,
        lease_ms: Option<u64>,
    ) -> Replies {
        self.on_every_node(
            token,
            timeout,
            Vec::new(),
            move |writer, key, token| async move {
                let reply: i64 = script
                    .run(&writer, || {
                        let mut args = vec![Value::from(token.as_str())];
                        args.extend(lease_ms.map(|ms| Value::from(ms as i64)));
                        (vec![key.clone()], args)
                    })
                    .await?;
                Ok(script_reply(reply))
            },
        )
    }

    /// `request` for every node, each bounded by `timeout`; nothing is sent before the first
    /// poll of [`Replies::tally`].
    ///
    /// A node whose client is not connected is not sent anything (fred would hold the request
    /// until it reconnects and send it then, long after anyone waits for it): it fails at once
    /// as unreachable.
    fn on_every_node<F, Fut>(
        &self,
        token: &Token,
        timeout: Duration,
        refused: Vec<Option<RedisError>>,
        request: F,
    ) -> Replies
    where
        F: Fn(Writer, Key, Token) -> Fut,
        Fut: Future<Output = Result<NodeReply, RedisError>> + Send + 'static,
    {
        let mut refused = refused.into_iter();
        let calls = self
            .clients
            .iter()
            .map(|client| {
                if let Some(Some(refusal)) = refused.next() {
                    return NodeRequest::Done(NodeReply::Failed(NodeFailureReason::Rejected(
                        refusal,
                    )));
                }
                let core = client.engine().core();
                if core.ensure_open().is_err() {
                    return NodeRequest::Done(NodeReply::Failed(NodeFailureReason::Shutdown));
                }
                if !core.redis().is_connected() {
                    return NodeRequest::Done(NodeReply::Failed(NodeFailureReason::Unreachable(
                        None,
                    )));
                }
                let call = request(core.writer.clone(), self.key.clone(), token.clone());
                let (client, kind) = (client.clone(), self.kind.clone());
                NodeRequest::Pending(Box::pin(async move {
                    let sent = Instant::now();
                    match tokio::time::timeout(timeout, call).await {
                        Err(_) => NodeReply::Failed(NodeFailureReason::TimedOut(timeout)),
                        Ok(Ok(reply)) => reply,
                        Ok(Err(error)) if is_transient(&error) => {
                            NodeReply::Failed(NodeFailureReason::Unreachable(Some(error)))
                        }
                        Ok(Err(error)) => {
                            // A script's refused command names its line, not what was missing:
                            // the permission question, asked again within the node's time
                            // left, names the command and the key.
                            let left = timeout.saturating_sub(sent.elapsed());
                            let error = client
                                .engine()
                                .named_refusal(&*kind, None, Some(left), error)
                                .await;
                            NodeReply::Failed(NodeFailureReason::Rejected(error))
                        }
                    }
                }))
            })
            .collect();
        Replies {
            calls,
            started: Instant::now(),
        }
    }

    /// The failure of node `index`, for errors and logs.
    pub(crate) fn failure(&self, index: usize, reason: NodeFailureReason) -> NodeFailure {
        NodeFailure {
            index,
            node: self.clients[index].engine().core().address.to_string(),
            reason,
        }
    }
}

fn script_reply(reply: i64) -> NodeReply {
    match reply {
        1 => NodeReply::Done,
        0 => NodeReply::Missing,
        _ => NodeReply::Other,
    }
}

/// When a caller may stop reading replies.
#[derive(Clone, Copy)]
pub(crate) enum Until<'a> {
    /// As soon as a majority did it; otherwise when every node answered (or timed out).
    Quorum,
    /// When every node answered (or timed out).
    All,
    /// When these nodes answered (or timed out).
    Answered(&'a [usize]),
}

type PendingReply = Pin<Box<dyn Future<Output = NodeReply> + Send>>;

/// One node's request.
enum NodeRequest {
    Pending(PendingReply),
    /// Decided without a request (not connected, shut down), not yet read.
    Done(NodeReply),
    Read,
}

/// Replies of one request to every node, in the order they arrive. Requests still out when it
/// is dropped finish in a task of their own.
pub(crate) struct Replies {
    calls: Vec<NodeRequest>,
    /// When the requests were made: the base of a validity, earlier than any node saw them.
    pub(crate) started: Instant,
}

impl Replies {
    /// The next reply to arrive, polling every pending request; `None` once all are read.
    async fn next(&mut self) -> Option<(usize, NodeReply)> {
        poll_fn(|cx| {
            let mut pending = false;
            let mut ready = None;
            for (index, call) in self.calls.iter_mut().enumerate() {
                match call {
                    NodeRequest::Pending(request) => {
                        // Every pending request is polled, even after one is ready: the first
                        // poll is what sends it.
                        if let Poll::Ready(reply) = request.as_mut().poll(cx) {
                            *call = NodeRequest::Done(reply);
                        } else {
                            pending = true;
                            continue;
                        }
                    }
                    NodeRequest::Done(_) => {}
                    NodeRequest::Read => continue,
                }
                if ready.is_none() {
                    if let NodeRequest::Done(reply) = std::mem::replace(call, NodeRequest::Read) {
                        ready = Some((index, reply));
                    }
                }
            }
            match ready {
                Some(ready) => Poll::Ready(Some(ready)),
                None if pending => Poll::Pending,
                None => Poll::Ready(None),
            }
        })
        .await
    }

    /// Reads replies until `until` is met. Cancel safe: requests not read to the end finish in a
    /// task of their own.
    pub(crate) async fn tally(mut self, nodes: &Nodes, until: Until<'_>) -> Tally {
        let quorum = nodes.quorum();
        let mut tally = Tally {
            done: Vec::new(),
            missing: 0,
            failures: Vec::new(),
            decided_at: self.started,
        };
        let mut answered = vec![false; nodes.len()];
        loop {
            let enough = match until {
                Until::Quorum => tally.done.len() >= quorum,
                Until::All => false,
                Until::Answered(indices) => indices.iter().all(|&index| answered[index]),
            };
            if enough {
                break;
            }
            let Some((index, reply)) = self.next().await else {
                break;
            };
            answered[index] = true;
            match reply {
                NodeReply::Done => tally.done.push(index),
                NodeReply::Missing => tally.missing += 1,
                NodeReply::Other => tally
                    .failures
                    .push(nodes.failure(index, NodeFailureReason::HeldByOther)),
                NodeReply::Failed(reason) => tally.failures.push(nodes.failure(index, reason)),
            }
        }
        tally.decided_at = Instant::now();
        tally.failures.sort_by_key(|failure| failure.index);
        tally
    }
}

impl Drop for Replies {
    fn drop(&mut self) {
        if !self
            .calls
            .iter()
            .any(|call| matches!(call, NodeRequest::Pending(_)))
        {
            return;
        }
        // Without a runtime nothing can run them; leases end what they would have done.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(finish(std::mem::take(&mut self.calls)));
        }
    }
}

/// Polls the pending requests among `calls` to their ends, dropping the replies. Not a
/// [`Replies`], whose drop would hand them on again (and again, on a runtime shutting down).
async fn finish(calls: Vec<NodeRequest>) {
    let pending = calls
        .into_iter()
        .filter_map(|call| match call {
            NodeRequest::Pending(request) => Some(request),
            NodeRequest::Done(_) | NodeRequest::Read => None,
        })
        .collect();
    join_all(pending).await;
}

/// What a request to every node achieved.
pub(crate) struct Tally {
    /// Nodes that did it.
    pub(crate) done: Vec<usize>,
    /// Nodes without the key (extend, release).
    pub(crate) missing: usize,
    /// Nodes that failed, including those with another token (`HeldByOther`).
    pub(crate) failures: Vec<NodeFailure>,
    /// When the last reply read arrived.
    pub(crate) decided_at: Instant,
}

impl Tally {
    /// Nodes where the key carries another token.
    pub(crate) fn held_elsewhere(&self) -> usize {
        self.failures
            .iter()
            .filter(|failure| matches!(failure.reason, NodeFailureReason::HeldByOther))
            .count()
    }

    /// Nodes that failed for a reason that trying again will not fix: they rejected the request
    /// (the key is not a string) or their client is shut down.
    pub(crate) fn permanent_failures(&self) -> usize {
        self.failures
            .iter()
            .filter(|failure| {
                matches!(
                    failure.reason,
                    NodeFailureReason::Rejected(_) | NodeFailureReason::Shutdown
                )
            })
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The permission check asks about exactly what its scripts run, as docs/SECURITY.md's
    /// table says.
    #[test]
    fn its_class_names_every_command_its_scripts_run() {
        crate::lua::check_commands(&[&REDLOCK], &[SCRIPTS, "redis.call('set'"], &["redlock"]);
    }
}

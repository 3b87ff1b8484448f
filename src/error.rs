//! The error type of every fallible fredlock operation.

use std::fmt;
use std::time::Duration;

/// A specialized `Result` for fredlock operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong with a lock operation.
///
/// Messages name the lock and, where one is involved, the owner (`<client uuid>:<owner id>`),
/// so that a log line alone says which lock on which service instance failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The owner tried to release a hold it does not have: it never held the lock, or the lock
    /// was lost (its lease ran out or the key was deleted) before the unlock.
    #[error("lock {lock:?} is not held by owner {owner}")]
    NotHeld {
        /// The lock's name.
        lock: String,
        /// The owner field, `<client uuid>:<owner id>`.
        owner: String,
    },

    /// An argument was rejected before anything was sent to Redis: an empty lock name, a zero
    /// lease or watchdog lease, an unparsable URL.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// A key of the lock exists in Redis with something that is not part of a lock: the lock's
    /// key with a type other than a hash, or (for
    /// [`force_unlock`](crate::LockFamily::force_unlock)) a hash without the lock layout of
    /// `<client uuid>:<owner id>` fields and hold counts; a fair lock's queue that is not a list
    /// or its place timeouts that are not a zset. The key is left untouched.
    #[error(
        "lock {lock:?}: key {key:?} holds something that is not part of a lock (a lock is a hash \
         of `<client uuid>:<owner id>` fields and hold counts, a fair lock's queue a list and its \
         place timeouts a zset), so it cannot be used; it was left untouched: pick another lock \
         name or a key prefix"
    )]
    WrongType {
        /// The lock's name (its key).
        lock: String,
        /// The key with the wrong content: the lock's own, or one derived from it.
        key: String,
    },

    /// Redis or the connection to it failed.
    ///
    /// After a connection failure in the middle of an acquire or a release, the outcome on the
    /// server is unknown; see the crate documentation on guarantees.
    #[error("Redis at {server}, {context}: {source}")]
    Redis {
        /// What was being done, naming the lock and owner where there is one.
        context: String,
        /// The configured server address(es), `host:port[,host:port..]`.
        server: String,
        /// What the client library reported, sorted by what it means for the command.
        #[source]
        source: RedisError,
    },

    /// Redis could not be reached: a wait for the lock ended without any attempt reaching it,
    /// or an unlock could not tell it (the server was down, unreachable or not answering).
    /// Unlike `Ok(None)` from `try_lock`, or [`NotHeld`](Self::NotHeld) from an unlock, this says
    /// nothing about whether the lock is held: an unlock's hold ends with its lease at the
    /// latest (a release whose reply was lost is followed up once Redis answers again).
    #[error(
        "lock {lock:?}: Redis at {server} could not be reached{}; whether the lock is held is \
         unknown",
        Cause(source.as_ref())
    )]
    Unavailable {
        /// The lock's name.
        lock: String,
        /// The configured server address(es).
        server: String,
        /// The last failure seen, if any: `None` when the last attempt simply got no reply.
        #[source]
        source: Option<RedisError>,
    },

    /// The lock was lost (see [`LockGuard::lost`](crate::LockGuard::lost)) while
    /// [`with_lock`](crate::DistributedLock::with_lock) ran its work, which was stopped.
    #[error(
        "lock {lock:?} held by owner {owner} was lost while its work ran; the work was stopped"
    )]
    Lost {
        /// The lock's name.
        lock: String,
        /// The owner field, `<client uuid>:<owner id>`.
        owner: String,
    },

    /// With [`ReplicaSync`](crate::ReplicaSync), fewer replicas than it asks for confirmed a
    /// change in time. An acquisition is undone and never reported as held (this error ends a
    /// wait during which no attempt was confirmed); a release happened on the master but may
    /// not survive a failover, until the lock's lease ends there.
    #[error(
        "lock {lock:?}{}: {acked} of the {needed} replica(s) that replica_sync asks for confirmed \
         the change at {server} in time; an acquisition is undone, a release may not survive a \
         failover",
        owner.as_deref().map(|owner| format!(" (owner {owner})")).unwrap_or_default()
    )]
    NotReplicated {
        /// The lock's name.
        lock: String,
        /// The owner field, where the change was one owner's.
        owner: Option<String>,
        /// The configured server address(es).
        server: String,
        /// Replicas that confirmed the change.
        acked: u32,
        /// Replicas `ReplicaSync` asks for.
        needed: u32,
    },

    /// The client was shut down with [`LockClient::shutdown`](crate::LockClient::shutdown):
    /// every later operation says so, and so does a guard's `unlock` after it (the shutdown
    /// gave its hold back, or its lease ends it).
    #[error("the lock client has been shut down")]
    Shutdown,

    /// An owner asked for a hold it would wait for itself, refused at once with nothing
    /// changed: a holder of a read lock asked for the write lock of the same
    /// [`RwLock`](crate::RwLock) (the write lock waits for every reader, this owner included;
    /// release the read holds first: a writer may take read holds, the other way round), or a
    /// holder of a [non-reentrant](crate::Lock::non_reentrant) lock asked for it again.
    #[error("lock {lock:?}: owner {owner} {why} (at {server})")]
    WouldDeadlock {
        /// The lock's name.
        lock: String,
        /// The owner field that asked (a read-write lock's writer's ends in `:write`).
        owner: String,
        /// The configured server address(es).
        server: String,
        /// What the owner held and asked for, and what to do instead.
        why: String,
    },

    /// A [`RedLock`](crate::RedLock) was not acquired because too many nodes failed (timed out,
    /// were unreachable, rejected the request) for a majority to be reached, or because reaching
    /// it took longer than the lease allowed. A lock that is merely held elsewhere is `Ok(None)`
    /// from [`try_lock`](crate::DistributedLock::try_lock), not this error.
    ///
    /// `failures` lists every node that did not grant the lock, and why.
    #[error(
        "Redlock {lock:?} not acquired: {granted} of {nodes} nodes granted it, {needed} needed{}; {}",
        late(*granted, *needed, *elapsed), NodeList(failures)
    )]
    NoQuorum {
        /// The lock's name (its key on every node).
        lock: String,
        /// Nodes that granted the lock (all of it was released again).
        granted: usize,
        /// The majority: `nodes / 2 + 1`.
        needed: usize,
        /// Nodes in the Redlock.
        nodes: usize,
        /// How long the last attempt took, from sending to deciding.
        elapsed: Duration,
        /// The nodes that did not grant it.
        failures: Vec<NodeFailure>,
    },

    /// A [`RedLockGuard`](crate::RedLockGuard)'s release was not confirmed by a majority of its
    /// nodes, so the lock may still stand until its lease ends there. Nodes that confirmed deleted
    /// the key (or no longer had it); `failures` are the ones that did not answer.
    #[error(
        "Redlock {lock:?}: release confirmed by {confirmed} of {nodes} nodes, so the lock may stand until its lease ends; {}",
        NodeList(failures)
    )]
    Unreleased {
        /// The lock's name.
        lock: String,
        /// Nodes that deleted the key or no longer had it.
        confirmed: usize,
        /// Nodes in the Redlock.
        nodes: usize,
        /// The nodes that did not confirm.
        failures: Vec<NodeFailure>,
    },

    /// Members of a [`MultiLock`](crate::MultiLock) failed to unlock; one error per failed
    /// member, each naming its lock. Every other member was released.
    #[error("{} member(s) of the multi-lock failed: {}", .0.len(), ErrorList(.0))]
    Members(Vec<Error>),
}

/// One [`RedLock`](crate::RedLock) node that did not do what was asked, and why.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct NodeFailure {
    /// The node's position in the list given to [`RedLock::new`](crate::RedLock::new).
    pub index: usize,
    /// The node's address as its client was configured (`host:port`).
    pub node: String,
    /// What went wrong there.
    pub reason: NodeFailureReason,
}

/// Why a [`RedLock`](crate::RedLock) node failed; see [`NodeFailure`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum NodeFailureReason {
    /// No reply within the per-node timeout. The request may still run on the node later; what
    /// it wrote carries this acquisition's token and ends with the lease.
    TimedOut(Duration),
    /// The key carries another token: another acquisition (of this or any Redlock client)
    /// holds it there.
    HeldByOther,
    /// Extending or releasing: the key is gone from the node (expired or deleted).
    NotHeld,
    /// The node could not be reached: its client was not connected (the node is down, refuses
    /// connections, or its client is reconnecting), or the connection failed under the request.
    Unreachable(Option<RedisError>),
    /// The node answered with an error, e.g. `WRONGTYPE` when the key is not a string.
    Rejected(RedisError),
    /// The node's [`LockClient`](crate::LockClient) was shut down.
    Shutdown,
}

impl fmt::Display for NodeFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "node {} ({}) ", self.index, self.node)?;
        match &self.reason {
            NodeFailureReason::TimedOut(after) => write!(f, "timed out after {after:?}"),
            NodeFailureReason::HeldByOther => f.write_str("is held by another token"),
            NodeFailureReason::NotHeld => f.write_str("no longer has the key"),
            NodeFailureReason::Unreachable(None) => {
                f.write_str("is unreachable (not connected; refused or reconnecting)")
            }
            NodeFailureReason::Unreachable(Some(error)) => {
                write!(f, "is unreachable: {error}")
            }
            NodeFailureReason::Rejected(error) => {
                write!(f, "rejected the request: {error}")
            }
            NodeFailureReason::Shutdown => f.write_str("has a shut-down client"),
        }
    }
}

/// `"; took 1.2s, longer than the lease allowed"` when a majority granted the lock too slowly.
fn late(granted: usize, needed: usize, elapsed: Duration) -> String {
    if granted >= needed {
        format!(" but acquiring took {elapsed:?}, which left no validity")
    } else {
        String::new()
    }
}

struct NodeList<'a>(&'a [NodeFailure]);

impl fmt::Display for NodeList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("no node failed");
        }
        for (i, failure) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{failure}")?;
        }
        Ok(())
    }
}

struct ErrorList<'a>(&'a [Error]);

impl fmt::Display for ErrorList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, error) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{error}")?;
        }
        Ok(())
    }
}

/// The outcome of a wait without a deadline, which ends only with a guard or an error: no
/// guard means that the client shut down under it.
pub(crate) fn waited<T>(outcome: Option<T>) -> Result<T> {
    outcome.ok_or(Error::Shutdown)
}

impl Error {
    /// The error's kind in one word, as metrics label it (`error`).
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) fn label(&self) -> &'static str {
        match self {
            Error::NotHeld { .. } => "not_held",
            Error::InvalidArgument(_) => "invalid_argument",
            Error::WrongType { .. } => "wrong_type",
            Error::Redis { .. } => "redis",
            Error::Unavailable { .. } => "unavailable",
            Error::Lost { .. } => "lost",
            Error::NotReplicated { .. } => "not_replicated",
            Error::Shutdown => "shutdown",
            Error::NoQuorum { .. } => "no_quorum",
            Error::Unreleased { .. } => "unreleased",
            Error::Members(_) => "members",
            Error::WouldDeadlock { .. } => "would_deadlock",
        }
    }

    /// Converts a Redis error met on `server` while working on `lock`, recognising a refused
    /// replica sync (the refusals scripts raise are the engine's to decode). A failure to reach
    /// the server (no connection, no reply within the command timeout) is
    /// [`Unavailable`](Self::Unavailable), whatever the call: one outage, one answer.
    pub(crate) fn from_redis(
        server: &str,
        lock: &str,
        owner: Option<&str>,
        source: RedisError,
    ) -> Error {
        if let Some((acked, needed)) = parse_not_replicated(&source) {
            return Error::NotReplicated {
                lock: lock.to_owned(),
                owner: owner.map(str::to_owned),
                server: server.to_owned(),
                acked,
                needed,
            };
        }
        if is_transient(&source) {
            return Error::Unavailable {
                lock: lock.to_owned(),
                server: server.to_owned(),
                source: Some(source),
            };
        }
        Error::Redis {
            context: Context { lock, owner }.to_string(),
            server: server.to_owned(),
            source,
        }
    }

    /// Converts a Redis error of a caller's own script run on `server` for `lock`: always
    /// [`Error::Redis`], since a `WRONGTYPE` there is about the caller's keys, not the lock's.
    pub(crate) fn from_script(
        server: &str,
        lock: &str,
        owner: Option<&str>,
        source: RedisError,
    ) -> Error {
        Error::Redis {
            context: Context { lock, owner }.to_string(),
            server: server.to_owned(),
            source,
        }
    }

    /// The Redis error behind a failure to reach Redis, if there is one.
    pub(crate) fn into_source(self) -> Option<RedisError> {
        match self {
            Error::Redis { source, .. } => Some(source),
            Error::Unavailable { source, .. } => source,
            _ => None,
        }
    }

    /// True for failures of the connection rather than of the command: worth trying again after
    /// the client reconnects.
    pub(crate) fn is_transient(&self) -> bool {
        match self {
            Error::Redis { source, .. } => is_transient(source),
            Error::Unavailable { .. } | Error::NotReplicated { .. } => true,
            _ => false,
        }
    }
}

/// A failure of Redis or of the connection to it, as the client library reported it: sorted
/// once, where the library's error enters the crate, by what it means for the command that met
/// it ([`kind`](Self::kind)), and printed in words with what to check.
#[derive(Clone, Debug)]
pub struct RedisError {
    kind: RedisErrorKind,
    failure: Failure,
    details: String,
}

/// What a [`RedisError`] means for the command that met it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RedisErrorKind {
    /// The command was never sent: the client had no connection to route it to (it was
    /// reconnecting), or the cluster refused it before running it (`TRYAGAIN`, `CLUSTERDOWN`).
    /// It did not run, so sending it again is safe.
    NotSent,
    /// No answer came: the connection failed or the command timed out after it was sent (or the
    /// server is still loading its data set). The command may have run.
    NoReply,
    /// An answer that is an error (a refusal, `WRONGTYPE`, `NOPERM`, ..), or a command the
    /// client library refused to send or whose reply it could not read: not a failure of the
    /// connection, and nothing to try again.
    Refused,
}

/// What failed, as the message words it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The connection: refused, reset, closed.
    Connection,
    /// No reply within the command timeout.
    Timeout,
    /// Authentication.
    Auth,
    /// An error reply from the server (`NOPERM ..`, `WRONGTYPE ..`): the server's own words
    /// follow.
    Reply,
    /// Anything else, in the client library's word for it.
    Other(String),
}

/// Whether `details` starts as a server's error reply does: an upper-case code (`ERR`,
/// `NOPERM`, `WRONGTYPE`, ..), then a space or the end.
fn is_server_reply(details: &str) -> bool {
    let code = details.split(' ').next().unwrap_or_default();
    code.len() >= 2
        && code.starts_with(|c: char| c.is_ascii_uppercase())
        && code
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
}

impl RedisError {
    /// An error of `kind`, where `failure` failed, with the client library's `details`.
    ///
    /// A library's word that says nothing (fred's "unknown error" for a server's error reply,
    /// redis-rs's empty category for one it has no kind for) is replaced: the message names the
    /// failure in the crate's words, whichever library reported it.
    pub(crate) fn new(kind: RedisErrorKind, failure: Failure, details: impl Into<String>) -> Self {
        let details = details.into();
        let failure = match failure {
            Failure::Other(word) if word.trim().is_empty() || word.starts_with("unknown") => {
                if is_server_reply(&details) {
                    Failure::Reply
                } else {
                    Failure::Other("failed".into())
                }
            }
            other => other,
        };
        RedisError {
            kind,
            failure,
            details,
        }
    }

    /// A reply the crate cannot read (`what` says whose and how): an answer, so
    /// [`Refused`](RedisErrorKind::Refused).
    pub(crate) fn unreadable(what: String) -> Self {
        RedisError::new(
            RedisErrorKind::Refused,
            Failure::Other("parse error".into()),
            what,
        )
    }

    /// This failure of a call that the server had refused before it was sent again (a slot in
    /// migration's `ASK` or `TRYAGAIN`): the same kind, its words saying that refusal too, so
    /// that a call whose last try was cut off (a connection dropped while the slot moved) still
    /// names what kept it from running.
    pub(crate) fn after_refusal(self, refused: &RedisError) -> RedisError {
        RedisError {
            details: format!("{} (sent again after: {refused})", self.words()),
            ..self
        }
    }

    /// The words of `details`: a client library may keep an io::Error only in its Debug form,
    /// `Os { .., message: "Connection refused" }` or `Custom { kind: InvalidData, error:
    /// InvalidCertificate(UnknownIssuer) }`.
    fn words(&self) -> &str {
        let details = self.details.as_str();
        between(details, "message: \"", "\"")
            .or_else(|| between(details, "error: ", " }"))
            .or_else(|| between(details, "Kind(", ")"))
            .unwrap_or(details)
    }

    /// What the error means for the command that met it.
    pub fn kind(&self) -> RedisErrorKind {
        self.kind
    }

    /// The client library's own message, or the server's error reply.
    pub fn details(&self) -> &str {
        &self.details
    }
}

impl std::error::Error for RedisError {}

/// In one line: what failed, in words, and what to check.
impl fmt::Display for RedisError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let details = self.details.as_str();
        let what = self.words();
        let lower = details.to_ascii_lowercase();
        let hint = if lower.contains("certificate") || lower.contains("unknownissuer") {
            "the server's TLS certificate is not trusted: configure the CA that signed it, and \
             check the host name"
        } else if lower.contains("refused") {
            "check that redis-server is running and listening at that address"
        } else if lower.contains("reset")
            || lower.contains("unexpectedeof")
            || lower.contains("corrupt")
            || lower.contains("invalidcontenttype")
        {
            "the server closed the connection: check that client and server agree on TLS \
             (rediss:// for a TLS port, redis:// otherwise) and that it accepts more clients"
        } else if self.failure == Failure::Timeout {
            "no reply in time: check that the server is up and not blocked (command_timeout sets \
             the limit)"
        } else if self.failure == Failure::Auth || lower.contains("noauth") {
            "check the user name and password in the URL"
        } else {
            ""
        };
        let failed = match &self.failure {
            Failure::Connection => "connection failed",
            Failure::Timeout => "timed out",
            Failure::Auth => "authentication error",
            Failure::Reply => "refused by the server",
            Failure::Other(word) => word,
        };
        write!(f, "{failed}: {what}")?;
        if !hint.is_empty() {
            write!(f, "; {hint}")?;
        }
        Ok(())
    }
}

/// The start of the message of a change that too few replicas confirmed.
const NOT_REPLICATED: &str = "NOTREPLICATED";

/// The error of a change that `acked` of `needed` replicas confirmed in time: a reply not come,
/// as far as the rules for lost replies go (the change is on the master, but may not survive a
/// failover, so it is settled as if its reply had been lost).
pub(crate) fn not_replicated(acked: i64, needed: u32) -> RedisError {
    RedisError::new(
        RedisErrorKind::NoReply,
        Failure::Timeout,
        format!("{NOT_REPLICATED} acked={acked} needed={needed}"),
    )
}

/// `(acked, needed)` of a [`not_replicated`] error.
pub(crate) fn parse_not_replicated(error: &RedisError) -> Option<(u32, u32)> {
    let rest = error.details().strip_prefix(NOT_REPLICATED)?;
    let mut numbers = rest.split_whitespace().filter_map(|part| {
        part.split_once('=')
            .and_then(|(_, number)| number.parse::<u32>().ok())
    });
    Some((numbers.next()?, numbers.next()?))
}

/// A call the client did not send because it knows it has no connection (it is reconnecting,
/// or the server refused the last connection): nothing was sent, so nothing ran.
pub(crate) fn not_connected() -> RedisError {
    RedisError::new(
        RedisErrorKind::NotSent,
        Failure::Connection,
        "not connected (the server refused the connection, or the client is reconnecting)",
    )
}

/// A call sent whose connection was lost before its reply came (the client is reconnecting):
/// it may have run.
pub(crate) fn connection_lost() -> RedisError {
    RedisError::new(
        RedisErrorKind::NoReply,
        Failure::Connection,
        "the connection was lost before the reply (the client is reconnecting)",
    )
}

/// True when the command was not sent at all. Such a command never ran, so sending it again is
/// always safe.
pub(crate) fn was_not_sent(error: &RedisError) -> bool {
    error.kind == RedisErrorKind::NotSent
}

/// True when a call that failed with `error` may have run without its reply reaching us: it was
/// sent, and the connection failed or timed out before the reply came. An error reply from
/// Redis is an answer (the scripts check before they write, so it changed nothing), and a call
/// never sent never ran.
pub(crate) fn reply_lost(error: &RedisError) -> bool {
    error.kind == RedisErrorKind::NoReply
}

/// True when `error` says the connection failed or timed out, not that Redis rejected a command.
pub(crate) fn is_transient(error: &RedisError) -> bool {
    error.kind != RedisErrorKind::Refused
}

/// The text between `start` and the next `end` in `text`.
fn between<'a>(text: &'a str, start: &str, end: &str) -> Option<&'a str> {
    let from = text.find(start)? + start.len();
    let to = text[from..].find(end)?;
    Some(&text[from..from + to])
}

/// `": <cause>"` for an [`Error::Unavailable`], or what no cause means.
struct Cause<'a>(Option<&'a RedisError>);

impl fmt::Display for Cause<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(error) => write!(f, " (last failure: {error})"),
            None => f.write_str(" (no reply in time; check that the server is up and not blocked)"),
        }
    }
}

struct Context<'a> {
    lock: &'a str,
    owner: Option<&'a str>,
}

impl fmt::Display for Context<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "lock {:?}", self.lock)?;
        if let Some(owner) = self.owner {
            write!(f, " (owner {owner})")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_is_named_in_the_crates_words_whatever_the_library_said() {
        let nopermit = "NOPERM User fredlock has no permissions to run the 'pexpire' command";
        // fred's word for a server's error reply, and redis-rs's empty category.
        for word in ["unknown error", "", "unknown"] {
            let error = RedisError::new(
                RedisErrorKind::Refused,
                Failure::Other(word.into()),
                nopermit,
            );
            let shown = error.to_string();
            assert_eq!(
                shown,
                format!("refused by the server: {nopermit}"),
                "{word:?}"
            );
            let other = RedisError::new(
                RedisErrorKind::NoReply,
                Failure::Other(word.into()),
                "closed",
            );
            assert_eq!(other.to_string(), "failed: closed", "{word:?}");
        }
        let kept = RedisError::new(
            RedisErrorKind::Refused,
            Failure::Other("parse error".into()),
            "x",
        );
        assert_eq!(kept.to_string(), "parse error: x");
        assert!(is_server_reply("ERR wrong") && is_server_reply("WRONGTYPE Operation"));
        assert!(
            !is_server_reply("Connection closed") && !is_server_reply("") && !is_server_reply("E")
        );
    }

    /// A call refused (a slot in migration) and cut off when sent again keeps the kind of its
    /// last failure (it may have run) and names the refusal before it.
    #[test]
    fn a_call_cut_off_after_a_refusal_names_both() {
        let refused = RedisError::new(
            RedisErrorKind::NotSent,
            Failure::Other("routing".into()),
            "ASK not followed",
        );
        let cut = RedisError::new(
            RedisErrorKind::NoReply,
            Failure::Other("canceled".into()),
            "Canceled.",
        )
        .after_refusal(&refused);
        assert_eq!(cut.kind(), RedisErrorKind::NoReply);
        let shown = cut.to_string();
        assert!(
            shown.starts_with("canceled: Canceled.") && shown.contains("ASK not followed"),
            "{shown}"
        );
    }

    #[test]
    fn not_replicated_errors_carry_their_counts() {
        let error = not_replicated(0, 2);
        assert_eq!(parse_not_replicated(&error), Some((0, 2)));
        assert!(is_transient(&error) && reply_lost(&error));
        let other = RedisError::new(RedisErrorKind::NoReply, Failure::Timeout, "timed out");
        assert_eq!(parse_not_replicated(&other), None);
    }

    /// A command never sent is transient (waits keep waiting, releases are sent again) and its
    /// reply was not lost; an answer that is an error is neither.
    #[test]
    fn each_kind_says_what_the_ledger_and_the_waits_need() {
        let unsent = RedisError::new(RedisErrorKind::NotSent, Failure::Connection, "no route");
        assert!(was_not_sent(&unsent) && is_transient(&unsent) && !reply_lost(&unsent));
        let error = Error::from_redis("127.0.0.1:6379", "a", Some("u:1"), unsent);
        assert!(error.is_transient());
        let lost = RedisError::new(RedisErrorKind::NoReply, Failure::Connection, "closed");
        assert!(!was_not_sent(&lost) && is_transient(&lost) && reply_lost(&lost));
        let refused = RedisError::new(
            RedisErrorKind::Refused,
            Failure::Other("unknown".into()),
            "ERR unknown command",
        );
        assert!(!was_not_sent(&refused) && !is_transient(&refused) && !reply_lost(&refused));
        let error = Error::from_redis("127.0.0.1:6379", "a", None, refused);
        assert!(matches!(error, Error::Redis { .. }) && !error.is_transient());
    }

    #[test]
    fn io_errors_read_as_words_with_the_server_and_a_hint() {
        let refused = RedisError::new(
            RedisErrorKind::NoReply,
            Failure::Connection,
            r#"Os { code: 111, kind: ConnectionRefused, message: "Connection refused" }"#,
        );
        let text = Error::from_redis("127.0.0.1:6399", "a", None, refused).to_string();
        assert_eq!(
            text,
            "lock \"a\": Redis at 127.0.0.1:6399 could not be reached (last failure: connection \
             failed: Connection refused; check that redis-server is running and listening at \
             that address); whether the lock is held is unknown"
        );
    }
}

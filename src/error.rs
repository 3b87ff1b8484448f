//! The error type of every fallible fredlock operation.

use std::fmt;

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
    /// lease or watchdog timeout, an unparsable URL.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// The lock's key exists in Redis with a type other than a hash, so it is not a lock. The key
    /// is left untouched.
    #[error("key {lock:?} exists with a type other than a hash, so it cannot be used as a lock")]
    WrongType {
        /// The lock's name (the key).
        lock: String,
    },

    /// Redis or the connection to it failed.
    ///
    /// After a connection failure in the middle of an acquire or a release, the outcome on the
    /// server is unknown; see the crate documentation on guarantees.
    #[error("Redis error on {context}: {source}")]
    Redis {
        /// What was being done, naming the lock and owner where there is one.
        context: String,
        /// The error reported by fred.
        #[source]
        source: fred::error::Error,
    },

    /// The client was shut down with [`LockClient::shutdown`](crate::LockClient::shutdown).
    #[error("the lock client has been shut down")]
    Shutdown,
}

impl Error {
    /// Converts a fred error met while working on `lock`, recognising `WRONGTYPE` replies.
    pub(crate) fn from_redis(lock: &str, owner: Option<&str>, source: fred::error::Error) -> Error {
        if source.details().contains("WRONGTYPE") {
            return Error::WrongType {
                lock: lock.to_owned(),
            };
        }
        Error::Redis {
            context: Context { lock, owner }.to_string(),
            source,
        }
    }

    /// True for failures of the connection rather than of the command: worth trying again after
    /// fred reconnects.
    pub(crate) fn is_transient(&self) -> bool {
        matches!(self, Error::Redis { source, .. } if is_transient(source))
    }
}

/// True when `error` says the connection failed or timed out, not that Redis rejected a command.
pub(crate) fn is_transient(error: &fred::error::Error) -> bool {
    use fred::error::ErrorKind;
    match error.kind() {
        ErrorKind::IO
        | ErrorKind::Timeout
        | ErrorKind::Canceled
        | ErrorKind::Routing
        | ErrorKind::Cluster
        | ErrorKind::Backpressure => true,
        // Redis answers LOADING while it reads its data set after a restart, and fred reports a
        // connection closed under a command as Unknown on some paths.
        _ => {
            let details = error.details();
            details.starts_with("LOADING")
                || details.contains("Connection closed")
                || details.contains("connection closed")
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

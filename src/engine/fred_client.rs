//! What the crate needs of fred, its client library, kept in one place so that a second client
//! library can stand beside it (issue 45's seam). So far, fred's errors, sorted once, where they
//! enter the crate, into what the ledger and the waits need to know ([`RedisErrorKind`]): never
//! sent, sent without a reply (may have run), or answered. The vocabulary of calls is in
//! `value.rs`.

use fred::error::{Error as FredError, ErrorKind};

use crate::error::{Failure, RedisError, RedisErrorKind};

/// fred's refusal to write a command a second time.
const TOO_MANY_WRITES: &str = "Too many failed write attempts.";

impl From<FredError> for RedisError {
    fn from(error: FredError) -> RedisError {
        RedisError::new(kind(&error), failure(error.kind()), error.details())
    }
}

/// What `error` means for the command that met it.
fn kind(error: &FredError) -> RedisErrorKind {
    let details = error.details();
    // fred had no connection to route the command to (it is reconnecting); or the slot is being
    // migrated and some keys have moved (TRYAGAIN), or the cluster cannot serve the slot for now
    // (CLUSTERDOWN): refused before running.
    if details.starts_with("Failed to route command")
        || details.starts_with("TRYAGAIN")
        || details.starts_with("CLUSTERDOWN")
    {
        return RedisErrorKind::NotSent;
    }
    let no_reply = match error.kind() {
        ErrorKind::IO
        | ErrorKind::Timeout
        | ErrorKind::Canceled
        | ErrorKind::Routing
        | ErrorKind::Cluster
        | ErrorKind::Backpressure => true,
        // Redis answers LOADING while it reads its data set after a restart, and fred reports a
        // connection closed under a command as Unknown on some paths.
        _ => {
            details.starts_with("LOADING")
                || details.contains("Connection closed")
                || details.contains("connection closed")
                // fred sends each command once (`max_command_attempts` 1) and says this when
                // it would write one a second time: after a cluster's MOVED or ASK (it did not
                // run), but also after a reconnect forced under it (the Sentinel watcher's, when
                // the master switches), which puts the sent command back in the queue: it may
                // have run. So it counts as a lost reply, never as a call that was not sent.
                || details == TOO_MANY_WRITES
        }
    };
    if no_reply {
        RedisErrorKind::NoReply
    } else {
        RedisErrorKind::Refused
    }
}

/// What failed, in the message's words.
fn failure(kind: &ErrorKind) -> Failure {
    match kind {
        ErrorKind::IO => Failure::Connection,
        ErrorKind::Timeout => Failure::Timeout,
        ErrorKind::Auth => Failure::Auth,
        other => Failure::Other(other.to_str().to_ascii_lowercase()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{is_transient, reply_lost, was_not_sent, Error};

    /// fred's answer while it has no connection to route a command to: never sent, so waits keep
    /// waiting and releases are sent again (issue 11, point 3).
    #[test]
    fn a_command_fred_could_not_route_was_not_sent_and_is_transient() {
        let unrouted = RedisError::from(FredError::new(
            ErrorKind::Unknown,
            "Failed to route command.",
        ));
        assert!(was_not_sent(&unrouted));
        assert!(is_transient(&unrouted));
        let error = Error::from_redis("127.0.0.1:6379", "a", Some("u:1"), unrouted);
        assert!(error.is_transient());
        let rejected = RedisError::from(FredError::new(ErrorKind::Unknown, "ERR unknown command"));
        assert!(!was_not_sent(&rejected) && !is_transient(&rejected));
        assert_eq!(rejected.kind(), RedisErrorKind::Refused);
    }

    /// A command fred refuses to write again may have run (a reconnect forced under it put it
    /// back in the queue): its reply counts as lost, so it is fenced, never sent as it was.
    #[test]
    fn a_command_fred_would_write_twice_may_have_run() {
        let requeued = RedisError::from(FredError::new(
            ErrorKind::Unknown,
            "Too many failed write attempts.",
        ));
        assert!(!was_not_sent(&requeued));
        assert!(reply_lost(&requeued));
    }

    /// Each of fred's kinds of a failed connection, and a server loading its data, is a reply
    /// that may be lost; a cluster that moves or cannot serve a slot refused before running.
    #[test]
    fn fred_errors_are_sorted_by_what_they_mean_for_the_command() {
        for kind in [
            ErrorKind::IO,
            ErrorKind::Timeout,
            ErrorKind::Canceled,
            ErrorKind::Routing,
            ErrorKind::Cluster,
            ErrorKind::Backpressure,
        ] {
            let error = RedisError::from(FredError::new(kind.clone(), "x"));
            assert_eq!(error.kind(), RedisErrorKind::NoReply, "{kind:?}");
        }
        for details in ["LOADING Redis is loading", "Connection closed abruptly"] {
            let error = RedisError::from(FredError::new(ErrorKind::Unknown, details));
            assert_eq!(error.kind(), RedisErrorKind::NoReply, "{details}");
        }
        for details in ["TRYAGAIN Multiple keys", "CLUSTERDOWN The cluster is down"] {
            let error = RedisError::from(FredError::new(ErrorKind::Unknown, details));
            assert_eq!(error.kind(), RedisErrorKind::NotSent, "{details}");
        }
        for kind in [
            ErrorKind::Auth,
            ErrorKind::Parse,
            ErrorKind::InvalidArgument,
        ] {
            let error = RedisError::from(FredError::new(kind.clone(), "x"));
            assert_eq!(error.kind(), RedisErrorKind::Refused, "{kind:?}");
        }
    }

    #[test]
    fn fred_io_errors_read_as_words_with_a_hint() {
        let refused = RedisError::from(FredError::new(
            ErrorKind::IO,
            r#"Os { code: 111, kind: ConnectionRefused, message: "Connection refused" }"#,
        ));
        assert_eq!(
            refused.to_string(),
            "connection failed: Connection refused; check that redis-server is running and \
             listening at that address"
        );
        let auth = RedisError::from(FredError::new(ErrorKind::Auth, "WRONGPASS invalid"));
        assert_eq!(
            auth.to_string(),
            "authentication error: WRONGPASS invalid; check the user name and password in the URL"
        );
    }
}

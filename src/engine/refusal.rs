//! Errors a script raises for its caller, decoded in this one place. Every script follows one
//! convention: an error reply whose first word is a code, then a sentence for people.
//!
//! - `WRONGTYPE <what the key should be>: <key>`: a key is not what the primitive keeps there
//!   (Redis's own `WRONGTYPE` replies carry no key: then it is the primitive's name).
//! - `DEADLOCK <why>`: the call would wait for its own owner.
//!
//! The codes are the engine's, not any primitive's: a new primitive raises them with its own
//! sentences, and nothing here changes.

use crate::error::{Error, RedisError};

/// The code of a key of the wrong type.
const WRONG_TYPE: &str = "WRONGTYPE";
/// The code of a call that would wait for its own owner.
const DEADLOCK: &str = "DEADLOCK";

/// A script's refusal, if `source` is one, as the crate's error about `lock` of `owner` on
/// `server`.
pub(crate) fn decode(
    source: &RedisError,
    server: &str,
    lock: &str,
    owner: Option<&str>,
) -> Option<Error> {
    let details = source.details();
    // A client library may put its own words before the server's reply; the first code starts the reply.
    let at = [WRONG_TYPE, DEADLOCK]
        .iter()
        .filter_map(|code| details.find(code))
        .min()?;
    let reply = &details[at..];
    if let Some(why) = reply.strip_prefix(DEADLOCK) {
        return Some(Error::WouldDeadlock {
            lock: lock.to_owned(),
            owner: owner.unwrap_or_default().to_owned(),
            server: server.to_owned(),
            why: why.trim().to_owned(),
        });
    }
    let key = reply
        .split_once(": ")
        .map(|(_, key)| key)
        .filter(|_| reply.starts_with("WRONGTYPE not "))
        .unwrap_or(lock);
    Some(Error::WrongType {
        lock: lock.to_owned(),
        key: key.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{Failure, RedisErrorKind};

    fn reply(text: &str) -> RedisError {
        RedisError::new(
            RedisErrorKind::Refused,
            Failure::Other("unknown error".into()),
            text,
        )
    }

    #[test]
    fn codes_are_decoded_whatever_the_sentence() {
        let deadlock = decode(&reply("DEADLOCK any words"), "s", "a", Some("u:1:write"));
        assert!(
            matches!(deadlock, Some(Error::WouldDeadlock { owner, .. }) if owner == "u:1:write")
        );
        let named = decode(
            &reply("WRONGTYPE not the queue of a lock (a list): q"),
            "s",
            "a",
            None,
        );
        assert!(matches!(named, Some(Error::WrongType { key, .. }) if key == "q"));
        let redis_own = decode(
            &reply("WRONGTYPE Operation against a key holding the wrong kind of value"),
            "s",
            "a",
            None,
        );
        assert!(matches!(redis_own, Some(Error::WrongType { key, .. }) if key == "a"));
        assert!(decode(&reply("ERR something else"), "s", "a", None).is_none());
    }
}

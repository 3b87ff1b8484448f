//! The vocabulary of calls: a key, an argument or a reply and its conversions, a shared string,
//! a key's cluster hash slot. The engine and the primitives name these through `crate::engine`
//! (the read model through this file), never by a client library's paths.
//!
//! While fred is compiled in they are fred's own types, re-exported, so that the calls reach
//! fred as they are built. The crate's own types, converted at the seam, were measured
//! (scenario 8, callgrind): 1 356 more instructions per uncontended lock+unlock (60 771 to
//! 62 127, +2.2 %; fredlock / raw EVALSHA 1.04 to 1.07), most of it converting each call's
//! arguments. So these stay fred's while fred is compiled in; a build without fred uses the
//! crate's own (`vocabulary.rs`, held to fred's conversions by its tests), and a second client
//! library converts from whichever these are.
//!
//! A caller's own script (`eval_while_held`) is public, so its words are the crate's own in
//! every build (`reply.rs`): converted here ([`reply_of`], [`key_of`], [`value_of`]), off the
//! lock's own path.

use crate::engine::client::reply::{Reply, ScriptArg};

#[cfg(feature = "fred")]
pub(crate) use fred::bytes_utils::Str;
#[cfg(feature = "fred")]
pub(crate) use fred::types::config::Server;
#[cfg(feature = "fred")]
pub(crate) use fred::types::scan::ScanType;
#[cfg(feature = "fred")]
pub(crate) use fred::types::{FromValue, Key, Message, Value};
#[cfg(all(feature = "fred", feature = "redis-rs"))]
pub(crate) use fred::types::{Map, MessageKind};

#[cfg(not(feature = "fred"))]
pub(crate) use crate::engine::client::vocabulary::{
    key_slot, sha1_hex, FromValue, Key, Map, Message, MessageKind, ScanType, Server, Str, Value,
};

/// The SHA1 of a script's text, in hex, as `EVALSHA` names it.
#[cfg(feature = "fred")]
pub(crate) fn sha1_hex(text: &str) -> String {
    fred::util::sha1_hash(text)
}

/// The cluster hash slot of `key` (CRC16 of its hash tag, or of the whole key, mod 16384).
#[cfg(feature = "fred")]
pub(crate) fn key_slot(key: &[u8]) -> u16 {
    fred::util::redis_keyslot(key)
}

/// A script's reply in the crate's own words, converted from the library's.
pub(crate) fn reply_of(value: Value) -> Reply {
    match value {
        Value::Null => Reply::Nil,
        Value::Integer(number) => Reply::Integer(number),
        Value::Double(number) => Reply::Double(number),
        Value::Boolean(flag) => Reply::Boolean(flag),
        Value::String(text) => Reply::Text(text.to_string()),
        Value::Bytes(bytes) => Reply::of_bytes(bytes.to_vec()),
        Value::Array(items) => Reply::Array(items.into_iter().map(reply_of).collect()),
        Value::Map(map) => Reply::Map(
            map.inner()
                .into_iter()
                .map(|(key, value)| (Reply::of_bytes(key.as_bytes().to_vec()), reply_of(value)))
                .collect(),
        ),
        // fred's answer to a command queued in a transaction, which a script never gets.
        #[cfg(feature = "fred")]
        Value::Queued => Reply::Text("QUEUED".into()),
    }
}

/// A key of a caller's script, in the library's words.
pub(crate) fn key_of(arg: ScriptArg) -> Key {
    Key::from(bytes::Bytes::from(arg.into_bytes()))
}

/// An argument of a caller's script, in the library's words: its bytes, as Redis receives it.
pub(crate) fn value_of(arg: ScriptArg) -> Value {
    Value::Bytes(bytes::Bytes::from(arg.into_bytes()))
}

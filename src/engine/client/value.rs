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

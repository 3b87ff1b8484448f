//! The vocabulary of calls: a key, an argument or a reply and its conversions, a shared string,
//! a key's cluster hash slot. The engine and the primitives name these through `crate::engine`
//! (the read model through this file), never by a client library's paths.
//!
//! For now they are fred's own types, re-exported: with a second client library (issue 45),
//! the crate's own types replace them here, and each library's conversions go in its seam file
//! (`fred_client.rs`).

pub(crate) use fred::bytes_utils::Str;
pub(crate) use fred::types::scan::ScanType;
pub(crate) use fred::types::{FromValue, Key, Value};

/// The cluster hash slot of `key` (CRC16 of its hash tag, or of the whole key, mod 16384).
pub(crate) fn key_slot(key: &[u8]) -> u16 {
    fred::util::redis_keyslot(key)
}

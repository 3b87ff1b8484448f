//! The crate's own vocabulary of calls, for a build without fred (`default-features = false,
//! features = ["redis-rs"]`): a key, an argument or a reply, a shared string, a pub/sub
//! message, a server's address, a key's cluster hash slot and a script's SHA1.
//!
//! It reads and converts as fred's types do (the same variants, the same conversions of a
//! reply into a number, a string, an option, a list or a tuple), so that the engine and the
//! primitives are written once for either build. Its unit tests, run in every build, hold it
//! to fred's behaviour where fred is compiled in.
//!
//! No public signature names these: a caller's own script (`eval_while_held`) speaks the
//! crate's public words (`reply.rs`), converted to and from these in `value.rs`.
//!
//! It has what fred's types have that the crate reads in some build; not every part is read in
//! every build (a test build with fred reads it only in its tests).
#![allow(dead_code)]

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::ops::Deref;

use bytes::Bytes;

use crate::error::RedisError;

/// A reply that cannot be read as what was asked (as fred's parse error): an answer, so a
/// [`RedisError`] of kind `Refused` where it enters the crate.
#[derive(Debug)]
pub(crate) struct Unreadable(String);

impl From<Unreadable> for RedisError {
    fn from(error: Unreadable) -> RedisError {
        RedisError::unreadable(error.0)
    }
}

/// A shared, immutable UTF-8 string: cloned without copying.
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Str(Bytes);

/// Hashed as its text, so that a map keyed by it is looked up by a `&str` ([`Borrow`]).
impl Hash for Str {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        (**self).hash(state)
    }
}

impl std::borrow::Borrow<str> for Str {
    fn borrow(&self) -> &str {
        self
    }
}

impl Str {
    pub(crate) const fn from_static(text: &'static str) -> Str {
        Str(Bytes::from_static(text.as_bytes()))
    }

    /// The bytes, shared (a slice of them is a key without a copy).
    pub(crate) fn inner(&self) -> &Bytes {
        &self.0
    }

    /// `part`, a slice of this string's text, shared without a copy.
    pub(crate) fn slice_ref(&self, part: &str) -> Str {
        Str(self.0.slice_ref(part.as_bytes()))
    }
}

impl From<Box<str>> for Str {
    fn from(text: Box<str>) -> Str {
        Str::from(String::from(text))
    }
}

impl Deref for Str {
    type Target = str;

    fn deref(&self) -> &str {
        // Made only from a `str` or a `String`, so always UTF-8.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

impl From<String> for Str {
    fn from(text: String) -> Str {
        Str(Bytes::from(text))
    }
}

impl From<&str> for Str {
    fn from(text: &str) -> Str {
        Str(Bytes::copy_from_slice(text.as_bytes()))
    }
}

impl From<&String> for Str {
    fn from(text: &String) -> Str {
        Str::from(text.as_str())
    }
}

impl fmt::Debug for Str {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

impl fmt::Display for Str {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self)
    }
}

/// A key: bytes, most often UTF-8.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Key(Bytes);

impl Key {
    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    pub(crate) fn as_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.0).ok()
    }
}

impl From<Bytes> for Key {
    fn from(bytes: Bytes) -> Key {
        Key(bytes)
    }
}

impl From<&[u8]> for Key {
    fn from(bytes: &[u8]) -> Key {
        Key(Bytes::copy_from_slice(bytes))
    }
}

impl From<Vec<u8>> for Key {
    fn from(bytes: Vec<u8>) -> Key {
        Key(Bytes::from(bytes))
    }
}

impl From<String> for Key {
    fn from(text: String) -> Key {
        Key(Bytes::from(text))
    }
}

impl From<&String> for Key {
    fn from(text: &String) -> Key {
        Key::from(text.as_bytes())
    }
}

impl From<&str> for Key {
    fn from(text: &str) -> Key {
        Key::from(text.as_bytes())
    }
}

impl From<Str> for Key {
    fn from(text: Str) -> Key {
        Key(text.0)
    }
}

impl From<&Str> for Key {
    fn from(text: &Str) -> Key {
        Key(text.0.clone())
    }
}

impl From<&Key> for Key {
    fn from(key: &Key) -> Key {
        key.clone()
    }
}

/// A map reply (RESP3).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Map {
    inner: HashMap<Key, Value>,
}

impl Map {
    pub(crate) fn len(&self) -> usize {
        self.inner.len()
    }

    pub(crate) fn inner(self) -> HashMap<Key, Value> {
        self.inner
    }
}

impl TryFrom<HashMap<Key, Value>> for Map {
    type Error = Unreadable;

    fn try_from(inner: HashMap<Key, Value>) -> Result<Map, Unreadable> {
        Ok(Map { inner })
    }
}

/// An argument of a call, or a reply.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Value {
    Boolean(bool),
    Integer(i64),
    Double(f64),
    /// Text (a bulk string that is UTF-8, or a simple string).
    String(Str),
    /// A bulk string that is not UTF-8.
    Bytes(Bytes),
    Null,
    Map(Map),
    Array(Vec<Value>),
}

impl Value {
    pub(crate) const fn from_static_str(text: &'static str) -> Value {
        Value::String(Str::from_static(text))
    }

    pub(crate) fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }

    /// The number, read from an integer or text, or from an array of one.
    pub(crate) fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Integer(number) => Some(*number),
            Value::String(text) => text.parse().ok(),
            Value::Array(values) if values.len() == 1 => values[0].as_i64(),
            _ => None,
        }
    }

    /// As [`as_i64`](Self::as_i64), when it is not negative.
    pub(crate) fn as_u64(&self) -> Option<u64> {
        match self {
            Value::Integer(number) => u64::try_from(*number).ok(),
            Value::String(text) => text.parse().ok(),
            Value::Array(values) if values.len() == 1 => values[0].as_u64(),
            _ => None,
        }
    }

    pub(crate) fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Double(number) => Some(*number),
            Value::Integer(number) => Some(*number as f64),
            Value::String(text) => text.parse().ok(),
            Value::Array(values) if values.len() == 1 => values[0].as_f64(),
            _ => None,
        }
    }

    /// A scalar as text (a number written out); `None` for null, bytes that are not UTF-8, an
    /// array or a map.
    pub(crate) fn as_str(&self) -> Option<Cow<'_, str>> {
        Some(match self {
            Value::String(text) => Cow::Borrowed(&**text),
            Value::Bytes(bytes) => return std::str::from_utf8(bytes).ok().map(Cow::Borrowed),
            Value::Integer(number) => Cow::Owned(number.to_string()),
            Value::Double(number) => Cow::Owned(number.to_string()),
            Value::Boolean(yes) => Cow::Owned(yes.to_string()),
            _ => return None,
        })
    }

    pub(crate) fn as_string(&self) -> Option<String> {
        self.as_str().map(Cow::into_owned)
    }

    pub(crate) fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            Value::String(text) => Some(text.as_bytes()),
            Value::Bytes(bytes) => Some(bytes),
            _ => None,
        }
    }

    pub(crate) fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Boolean(yes) => Some(*yes),
            Value::Integer(0) => Some(false),
            Value::Integer(1) => Some(true),
            Value::String(text) => match &**text {
                "0" | "false" | "FALSE" | "f" | "F" => Some(false),
                "1" | "true" | "TRUE" | "t" | "T" => Some(true),
                _ => None,
            },
            Value::Array(values) if values.len() == 1 => values[0].as_bool(),
            _ => None,
        }
    }

    pub(crate) fn into_bytes(self) -> Option<Bytes> {
        match self {
            Value::String(text) => Some(text.0),
            Value::Bytes(bytes) => Some(bytes),
            Value::Integer(number) => Some(Bytes::from(number.to_string())),
            Value::Array(mut values) if values.len() == 1 => values.pop()?.into_bytes(),
            _ => None,
        }
    }

    pub(crate) fn convert<R: FromValue>(self) -> Result<R, Unreadable> {
        R::from_value(self)
    }
}

macro_rules! value_from {
    ($($source:ty => |$x:ident| $made:expr),* $(,)?) => {
        $(impl From<$source> for Value {
            fn from($x: $source) -> Value {
                $made
            }
        })*
    };
}

value_from! {
    i64 => |x| Value::Integer(x),
    i32 => |x| Value::Integer(i64::from(x)),
    u32 => |x| Value::Integer(i64::from(x)),
    u16 => |x| Value::Integer(i64::from(x)),
    u8 => |x| Value::Integer(i64::from(x)),
    bool => |x| Value::Boolean(x),
    f64 => |x| Value::Double(x),
    String => |x| Value::String(Str::from(x)),
    &String => |x| Value::String(Str::from(x)),
    &str => |x| Value::String(Str::from(x)),
    Str => |x| Value::String(x),
    &Str => |x| Value::String(x.clone()),
    Bytes => |x| Value::Bytes(x),
    Vec<u8> => |x| Value::Bytes(Bytes::from(x)),
    &[u8] => |x| Value::Bytes(Bytes::copy_from_slice(x)),
    Key => |x| match std::str::from_utf8(&x.0) {
        Ok(_) => Value::String(Str(x.0)),
        Err(_) => Value::Bytes(x.0),
    },
    Vec<Value> => |x| Value::Array(x),
}

/// A number too large for a reply's integer is sent as its text, as fred does.
impl TryFrom<u64> for Value {
    type Error = Unreadable;

    fn try_from(number: u64) -> Result<Value, Unreadable> {
        Ok(i64::try_from(number)
            .map(Value::Integer)
            .unwrap_or_else(|_| Value::from(number.to_string())))
    }
}

impl TryFrom<usize> for Value {
    type Error = Unreadable;

    fn try_from(number: usize) -> Result<Value, Unreadable> {
        Value::try_from(number as u64)
    }
}

impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(value: Option<T>) -> Value {
        value.map_or(Value::Null, Into::into)
    }
}

/// A reply read as `Self`.
pub(crate) trait FromValue: Sized {
    fn from_value(value: Value) -> Result<Self, Unreadable>;

    /// A flat array's elements read as a list of `Self` (a tuple takes several at a time).
    fn from_values(values: Vec<Value>) -> Result<Vec<Self>, Unreadable> {
        values.into_iter().map(Self::from_value).collect()
    }
}

fn unreadable(what: &str, value: &Value) -> Unreadable {
    Unreadable(format!("cannot read {value:?} as {what}"))
}

impl FromValue for Value {
    fn from_value(value: Value) -> Result<Value, Unreadable> {
        Ok(value)
    }
}

impl FromValue for () {
    fn from_value(_: Value) -> Result<(), Unreadable> {
        Ok(())
    }
}

macro_rules! number_from_value {
    ($($number:ty),*) => {
        $(impl FromValue for $number {
            fn from_value(value: Value) -> Result<$number, Unreadable> {
                let read = match &value {
                    Value::Double(number) => Some(*number as $number),
                    Value::Integer(number) => <$number>::try_from(*number).ok(),
                    Value::String(text) => text.parse().ok(),
                    Value::Array(values) if values.len() == 1 => {
                        return <$number>::from_value(values[0].clone())
                    }
                    _ => None,
                };
                read.ok_or_else(|| unreadable(stringify!($number), &value))
            }
        })*
    };
}

number_from_value!(i64, i32, u64, u32, u16, u8, usize);

impl FromValue for f64 {
    fn from_value(value: Value) -> Result<f64, Unreadable> {
        value.as_f64().ok_or_else(|| unreadable("f64", &value))
    }
}

impl FromValue for bool {
    fn from_value(value: Value) -> Result<bool, Unreadable> {
        if let Some(yes) = value.as_bool() {
            return Ok(yes);
        }
        match value {
            Value::String(text) => Ok(!text.is_empty()),
            Value::Bytes(bytes) => Ok(!bytes.is_empty()),
            other => Err(unreadable("bool", &other)),
        }
    }
}

impl FromValue for String {
    fn from_value(value: Value) -> Result<String, Unreadable> {
        match value {
            Value::Array(mut values) if values.len() == 1 => {
                String::from_value(values.pop().unwrap_or(Value::Null))
            }
            Value::String(text) => Ok(text.to_string()),
            other => other.as_string().ok_or_else(|| unreadable("text", &other)),
        }
    }
}

impl FromValue for Str {
    fn from_value(value: Value) -> Result<Str, Unreadable> {
        match value {
            Value::String(text) => Ok(text),
            other => String::from_value(other).map(Str::from),
        }
    }
}

impl FromValue for Key {
    fn from_value(value: Value) -> Result<Key, Unreadable> {
        match value {
            Value::String(text) => Ok(Key(text.0)),
            Value::Bytes(bytes) => Ok(Key(bytes)),
            other => String::from_value(other).map(Key::from),
        }
    }
}

impl FromValue for Bytes {
    fn from_value(value: Value) -> Result<Bytes, Unreadable> {
        let shown = format!("{value:?}");
        value
            .into_bytes()
            .ok_or_else(|| Unreadable(format!("cannot read {shown} as bytes")))
    }
}

impl<T: FromValue> FromValue for Option<T> {
    fn from_value(value: Value) -> Result<Option<T>, Unreadable> {
        match value {
            Value::Null => Ok(None),
            Value::Array(values) if values.is_empty() => Ok(None),
            other => T::from_value(other).map(Some),
        }
    }
}

impl<T: FromValue> FromValue for Vec<T> {
    fn from_value(value: Value) -> Result<Vec<T>, Unreadable> {
        match value {
            Value::Null => Ok(Vec::new()),
            Value::Array(values) => match values.first() {
                None => Ok(Vec::new()),
                // An array of arrays: one `T` per inner array.
                Some(Value::Array(_)) => values.into_iter().map(T::from_value).collect(),
                Some(_) => T::from_values(values),
            },
            Value::Map(map) => {
                let mut flat = Vec::with_capacity(map.len() * 2);
                for (key, value) in map.inner {
                    flat.push(Value::from(key));
                    flat.push(value);
                }
                T::from_values(flat)
            }
            other => Ok(vec![T::from_value(other)?]),
        }
    }
}

impl<K, V, S> FromValue for HashMap<K, V, S>
where
    K: FromValue + Eq + Hash,
    V: FromValue,
    S: std::hash::BuildHasher + Default,
{
    fn from_value(value: Value) -> Result<HashMap<K, V, S>, Unreadable> {
        let pairs: Vec<(K, V)> = match value {
            Value::Null => Vec::new(),
            other => Vec::from_value(other)?,
        };
        Ok(pairs.into_iter().collect())
    }
}

macro_rules! tuple_from_value {
    ($count:literal: $($name:ident),+) => {
        impl<$($name: FromValue),+> FromValue for ($($name,)+) {
            #[allow(non_snake_case)]
            fn from_value(value: Value) -> Result<Self, Unreadable> {
                match value {
                    Value::Array(values) if values.len() == $count => {
                        let mut values = values.into_iter();
                        $(let $name = $name::from_value(values.next().unwrap_or(Value::Null))?;)+
                        Ok(($($name,)+))
                    }
                    other => Err(unreadable(concat!("a tuple of ", $count), &other)),
                }
            }

            #[allow(non_snake_case, clippy::modulo_one)]
            fn from_values(values: Vec<Value>) -> Result<Vec<Self>, Unreadable> {
                if values.len() % $count != 0 {
                    return Err(Unreadable(format!(
                        "{} values are not tuples of {}", values.len(), $count
                    )));
                }
                let mut out = Vec::with_capacity(values.len() / $count);
                let mut values = values.into_iter();
                while values.len() > 0 {
                    $(let $name = $name::from_value(values.next().unwrap_or(Value::Null))?;)+
                    out.push(($($name,)+));
                }
                Ok(out)
            }
        }
    };
}

tuple_from_value!(1: A);
tuple_from_value!(2: A, B);
tuple_from_value!(3: A, B, C);
tuple_from_value!(4: A, B, C, D);
tuple_from_value!(5: A, B, C, D, E);
tuple_from_value!(6: A, B, C, D, E, F);

/// A server's address.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Server {
    pub(crate) host: Str,
    pub(crate) port: u16,
}

impl Server {
    pub(crate) fn new(host: impl Into<Str>, port: u16) -> Server {
        Server {
            host: host.into(),
            port,
        }
    }
}

impl fmt::Display for Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

/// Which kind of pub/sub message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MessageKind {
    Message,
    SMessage,
}

/// A pub/sub message: its channel, its payload, and the server it came from.
#[derive(Clone, Debug)]
pub(crate) struct Message {
    pub(crate) channel: Str,
    pub(crate) value: Value,
    pub(crate) kind: MessageKind,
    pub(crate) server: Server,
}

/// The type a SCAN asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ScanType {
    Set,
    String,
    ZSet,
    List,
    Hash,
    Stream,
}

/// The SHA1 of a script's text, in hex, as `EVALSHA` names it.
pub(crate) fn sha1_hex(text: &str) -> String {
    redis::Script::new(text).get_hash().to_owned()
}

/// The cluster hash slot of `key`: CRC16 (XMODEM) of its hash tag (the text between the first
/// `{` and the next `}`, when not empty), or of the whole key, mod 16384.
pub(crate) fn key_slot(key: &[u8]) -> u16 {
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let tag = &key[open + 1..];
            let close = tag.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &tag[..close])
        })
        .unwrap_or(key);
    crc16(hashed) & 0x3fff
}

fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
#[cfg(feature = "fred")]
mod tests {
    //! The vocabulary against fred's, where both are compiled in.
    use super::*;

    #[test]
    fn slots_and_hashes_are_fred_s() {
        for key in [
            &b"foo"[..],
            b"{user1000}.following",
            b"foo{}{bar}",
            b"foo{{bar}}zap",
            b"foo{bar}{zap}",
            b"redisson_lock__channel:{order-7}",
            b"",
            &[0xff, 0x00, 0x7b, 0x7d][..],
        ] {
            assert_eq!(key_slot(key), fred::util::redis_keyslot(key), "{key:?}");
        }
        assert_eq!(crc16(b"123456789"), 0x31c3);
        let script = "return redis.call('get', KEYS[1])";
        assert_eq!(sha1_hex(script), fred::util::sha1_hash(script));
    }

    /// Each reply shape read as each target type, by both: the same answer, or both refuse.
    #[test]
    fn replies_convert_as_fred_s() {
        use fred::types::Value as F;
        let pairs: Vec<(Value, F)> = vec![
            (Value::Null, F::Null),
            (Value::Integer(-3), F::Integer(-3)),
            (Value::Integer(7), F::Integer(7)),
            (Value::Double(2.5), F::Double(2.5)),
            (Value::Boolean(true), F::Boolean(true)),
            (Value::from("42"), F::from("42")),
            (Value::from("OK"), F::from("OK")),
            (Value::from(""), F::from("")),
            (
                Value::Bytes(Bytes::from_static(&[0xff])),
                F::Bytes(Bytes::from_static(&[0xff])),
            ),
            (
                Value::Array(vec![Value::from("a"), Value::Integer(1)]),
                F::Array(vec![F::from("a"), F::Integer(1)]),
            ),
            (
                Value::Array(vec![Value::Integer(9)]),
                F::Array(vec![F::Integer(9)]),
            ),
            (Value::Array(vec![]), F::Array(vec![])),
            (
                Value::Array(vec![
                    Value::Array(vec![Value::from("x"), Value::Integer(1)]),
                    Value::Array(vec![Value::from("y"), Value::Integer(2)]),
                ]),
                F::Array(vec![
                    F::Array(vec![F::from("x"), F::Integer(1)]),
                    F::Array(vec![F::from("y"), F::Integer(2)]),
                ]),
            ),
        ];
        for (ours, theirs) in pairs {
            macro_rules! same {
                ($($target:ty),*) => {$(
                    let mine = ours.clone().convert::<$target>().ok();
                    let fred = theirs.clone().convert::<$target>().ok();
                    assert_eq!(mine, fred, "{ours:?} as {}", stringify!($target));
                )*};
            }
            same!(
                i64,
                u64,
                u32,
                String,
                bool,
                Option<i64>,
                Option<String>,
                Vec<String>,
                Vec<i64>,
                (String, i64),
                Vec<(String, i64)>
            );
            assert_eq!(ours.as_i64(), theirs.as_i64(), "{ours:?}");
            assert_eq!(ours.as_u64(), theirs.as_u64(), "{ours:?}");
            assert_eq!(ours.as_string(), theirs.as_string(), "{ours:?}");
            assert_eq!(ours.as_bytes(), theirs.as_bytes(), "{ours:?}");
        }
    }
}

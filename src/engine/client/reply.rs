//! The crate's own words for a script a caller runs while it holds a lock
//! ([`LockGuard::eval_while_held`](crate::LockGuard::eval_while_held),
//! [`Leader::eval_while_held`](crate::Leader::eval_while_held)): its keys and arguments
//! ([`ScriptArg`]) and its reply ([`Reply`], read into a caller's type by [`FromReply`]).
//!
//! They are the same types whichever client libraries are compiled in: a service written
//! against fredlock on redis-rs builds unchanged when another crate in the build turns fred on.
//! The seam converts them to and from each library's own.

use std::collections::HashMap;
use std::hash::Hash;

/// A key or an argument of a script: its bytes, as Redis receives every argument (a number is
/// sent as its decimal text, as `redis-cli` would).
///
/// Made from text, bytes or a number:
///
/// ```
/// use fredlock::ScriptArg;
///
/// assert_eq!(ScriptArg::from("paid").as_bytes(), b"paid");
/// assert_eq!(ScriptArg::from(42_u32).as_bytes(), b"42");
/// assert_eq!(ScriptArg::from(-1.5_f64).as_bytes(), b"-1.5");
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ScriptArg(Vec<u8>);

impl ScriptArg {
    /// The bytes sent.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The bytes sent, owned.
    pub fn into_bytes(self) -> Vec<u8> {
        self.0
    }
}

impl From<&str> for ScriptArg {
    fn from(text: &str) -> ScriptArg {
        ScriptArg(text.as_bytes().to_vec())
    }
}

impl From<String> for ScriptArg {
    fn from(text: String) -> ScriptArg {
        ScriptArg(text.into_bytes())
    }
}

impl From<&String> for ScriptArg {
    fn from(text: &String) -> ScriptArg {
        ScriptArg::from(text.as_str())
    }
}

impl From<&[u8]> for ScriptArg {
    fn from(bytes: &[u8]) -> ScriptArg {
        ScriptArg(bytes.to_vec())
    }
}

impl<const N: usize> From<&[u8; N]> for ScriptArg {
    fn from(bytes: &[u8; N]) -> ScriptArg {
        ScriptArg(bytes.to_vec())
    }
}

impl From<Vec<u8>> for ScriptArg {
    fn from(bytes: Vec<u8>) -> ScriptArg {
        ScriptArg(bytes)
    }
}

impl From<&ScriptArg> for ScriptArg {
    fn from(arg: &ScriptArg) -> ScriptArg {
        arg.clone()
    }
}

/// Numbers, as their decimal text.
macro_rules! numbers {
    ($($number:ty),*) => {$(
        impl From<$number> for ScriptArg {
            fn from(number: $number) -> ScriptArg {
                ScriptArg(number.to_string().into_bytes())
            }
        }
    )*};
}

numbers!(i8, i16, i32, i64, i128, isize, u8, u16, u32, u64, u128, usize, f32, f64);

/// A script's reply, as Redis sends it, whichever client library read it.
///
/// Text is [`Text`](Reply::Text) when it is UTF-8, else [`Bytes`](Reply::Bytes). A Lua
/// `false` (and a missing value) is [`Nil`](Reply::Nil), a Lua `true` the integer 1.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Reply {
    /// No value: a missing key's, or a Lua `false`.
    Nil,
    /// An integer (a Lua number is truncated to one).
    Integer(i64),
    /// A double (RESP3).
    Double(f64),
    /// A boolean (RESP3).
    Boolean(bool),
    /// Text: a bulk or status string that is UTF-8.
    Text(String),
    /// A bulk string that is not UTF-8.
    Bytes(Vec<u8>),
    /// An array (a Lua table of values).
    Array(Vec<Reply>),
    /// A map (RESP3), its pairs in no particular order.
    Map(Vec<(Reply, Reply)>),
}

impl Reply {
    /// Text or bytes as `Reply::Text` when they are UTF-8, else `Reply::Bytes`.
    pub(crate) fn of_bytes(bytes: Vec<u8>) -> Reply {
        match String::from_utf8(bytes) {
            Ok(text) => Reply::Text(text),
            Err(error) => Reply::Bytes(error.into_bytes()),
        }
    }

    /// Its text, when it is text or UTF-8 bytes.
    fn text(&self) -> Option<&str> {
        match self {
            Reply::Text(text) => Some(text),
            Reply::Bytes(bytes) => std::str::from_utf8(bytes).ok(),
            _ => None,
        }
    }
}

/// A type a script's [`Reply`] is read as. `None`: it is not one; the call then fails with an
/// error that shows the reply.
///
/// Implemented for the reply itself, `()` (any reply), the integers (from an integer, a whole
/// double, or decimal text), `f32` and `f64`, `bool` (an integer not 0, a boolean, `Nil` as
/// false, or the text `1`, `0`, `true`, `false`), `String` (from text, or a number as its
/// decimal text), `Option<T>` (`Nil` as `None`), `Vec<T>` (an array, `Nil` as empty, any
/// other reply as a list of one), pairs and triples (an array of 2 or 3), and `HashMap<K, V>`
/// (a map, or an array of keys and values in turn, as `HGETALL` returns one).
///
/// ```
/// use fredlock::{FromReply, Reply};
///
/// assert_eq!(i64::from_reply(Reply::Text("42".into())), Some(42));
/// assert_eq!(Option::<String>::from_reply(Reply::Nil), Some(None));
/// assert_eq!(bool::from_reply(Reply::Nil), Some(false));
/// ```
pub trait FromReply: Sized {
    /// `reply` as `Self`, or `None` when it is not one.
    fn from_reply(reply: Reply) -> Option<Self>;
}

impl FromReply for Reply {
    fn from_reply(reply: Reply) -> Option<Reply> {
        Some(reply)
    }
}

impl FromReply for () {
    fn from_reply(_: Reply) -> Option<()> {
        Some(())
    }
}

/// An integer read from `reply`, as `T`.
fn integer<T: TryFrom<i64> + std::str::FromStr>(reply: Reply) -> Option<T> {
    match reply {
        Reply::Integer(number) => T::try_from(number).ok(),
        Reply::Boolean(flag) => T::try_from(i64::from(flag)).ok(),
        // A whole double within i64's range (Lua numbers are doubles).
        Reply::Double(number)
            if number.fract() == 0.0 && number >= i64::MIN as f64 && number < i64::MAX as f64 =>
        {
            T::try_from(number as i64).ok()
        }
        Reply::Array(mut items) if items.len() == 1 => items.pop().and_then(integer),
        other => other.text()?.trim().parse().ok(),
    }
}

macro_rules! integers {
    ($($number:ty),*) => {$(
        impl FromReply for $number {
            fn from_reply(reply: Reply) -> Option<$number> {
                integer(reply)
            }
        }
    )*};
}

integers!(i8, i16, i32, i64, isize, u8, u16, u32, u64, usize);

impl FromReply for f64 {
    fn from_reply(reply: Reply) -> Option<f64> {
        match reply {
            Reply::Double(number) => Some(number),
            Reply::Integer(number) => Some(number as f64),
            other => other.text()?.trim().parse().ok(),
        }
    }
}

impl FromReply for f32 {
    fn from_reply(reply: Reply) -> Option<f32> {
        f64::from_reply(reply).map(|number| number as f32)
    }
}

impl FromReply for bool {
    fn from_reply(reply: Reply) -> Option<bool> {
        match reply {
            Reply::Nil => Some(false),
            Reply::Boolean(flag) => Some(flag),
            Reply::Integer(number) => Some(number != 0),
            other => match other.text()? {
                "1" | "true" => Some(true),
                "0" | "false" => Some(false),
                _ => None,
            },
        }
    }
}

impl FromReply for String {
    fn from_reply(reply: Reply) -> Option<String> {
        match reply {
            Reply::Text(text) => Some(text),
            Reply::Bytes(bytes) => String::from_utf8(bytes).ok(),
            Reply::Integer(number) => Some(number.to_string()),
            Reply::Double(number) => Some(number.to_string()),
            _ => None,
        }
    }
}

impl<T: FromReply> FromReply for Option<T> {
    fn from_reply(reply: Reply) -> Option<Option<T>> {
        match reply {
            Reply::Nil => Some(None),
            other => T::from_reply(other).map(Some),
        }
    }
}

impl<T: FromReply> FromReply for Vec<T> {
    fn from_reply(reply: Reply) -> Option<Vec<T>> {
        match reply {
            Reply::Nil => Some(Vec::new()),
            Reply::Array(items) => items.into_iter().map(T::from_reply).collect(),
            other => T::from_reply(other).map(|item| vec![item]),
        }
    }
}

impl<A: FromReply, B: FromReply> FromReply for (A, B) {
    fn from_reply(reply: Reply) -> Option<(A, B)> {
        let Reply::Array(items) = reply else {
            return None;
        };
        let [a, b]: [Reply; 2] = items.try_into().ok()?;
        Some((A::from_reply(a)?, B::from_reply(b)?))
    }
}

impl<A: FromReply, B: FromReply, C: FromReply> FromReply for (A, B, C) {
    fn from_reply(reply: Reply) -> Option<(A, B, C)> {
        let Reply::Array(items) = reply else {
            return None;
        };
        let [a, b, c]: [Reply; 3] = items.try_into().ok()?;
        Some((A::from_reply(a)?, B::from_reply(b)?, C::from_reply(c)?))
    }
}

impl<K: FromReply + Eq + Hash, V: FromReply> FromReply for HashMap<K, V> {
    fn from_reply(reply: Reply) -> Option<HashMap<K, V>> {
        let pairs: Vec<(Reply, Reply)> = match reply {
            Reply::Nil => Vec::new(),
            Reply::Map(pairs) => pairs,
            Reply::Array(items) if items.len() % 2 == 0 => {
                let mut items = items.into_iter();
                let mut pairs = Vec::new();
                while let (Some(key), Some(value)) = (items.next(), items.next()) {
                    pairs.push((key, value));
                }
                pairs
            }
            _ => return None,
        };
        pairs
            .into_iter()
            .map(|(key, value)| Some((K::from_reply(key)?, V::from_reply(value)?)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_read_from_integers_doubles_and_text() {
        assert_eq!(i64::from_reply(Reply::Integer(-7)), Some(-7));
        assert_eq!(u32::from_reply(Reply::Text(" 12 ".into())), Some(12));
        assert_eq!(u8::from_reply(Reply::Integer(300)), None);
        assert_eq!(u64::from_reply(Reply::Integer(-1)), None);
        assert_eq!(i64::from_reply(Reply::Double(3.0)), Some(3));
        assert_eq!(i64::from_reply(Reply::Double(3.5)), None);
        assert_eq!(
            i64::from_reply(Reply::Array(vec![Reply::Integer(9)])),
            Some(9)
        );
        assert_eq!(i64::from_reply(Reply::Nil), None);
        assert_eq!(i64::from_reply(Reply::Text("nine".into())), None);
        assert_eq!(f64::from_reply(Reply::Text("2.5".into())), Some(2.5));
        assert_eq!(f64::from_reply(Reply::Integer(2)), Some(2.0));
    }

    #[test]
    fn lua_false_and_true_read_as_bool() {
        assert_eq!(bool::from_reply(Reply::Nil), Some(false));
        assert_eq!(bool::from_reply(Reply::Integer(1)), Some(true));
        assert_eq!(bool::from_reply(Reply::Integer(0)), Some(false));
        assert_eq!(bool::from_reply(Reply::Text("true".into())), Some(true));
        assert_eq!(bool::from_reply(Reply::Text("yes".into())), None);
    }

    #[test]
    fn text_options_lists_pairs_and_maps() {
        assert_eq!(
            String::from_reply(Reply::Bytes(b"ok".to_vec())),
            Some("ok".to_string())
        );
        assert_eq!(String::from_reply(Reply::Bytes(vec![0xff])), None);
        assert_eq!(String::from_reply(Reply::Integer(5)), Some("5".into()));
        assert_eq!(String::from_reply(Reply::Nil), None);
        assert_eq!(Option::<String>::from_reply(Reply::Nil), Some(None));
        assert_eq!(Option::<i64>::from_reply(Reply::Integer(1)), Some(Some(1)));
        assert_eq!(Vec::<i64>::from_reply(Reply::Nil), Some(vec![]));
        assert_eq!(Vec::<i64>::from_reply(Reply::Integer(4)), Some(vec![4]));
        assert_eq!(
            Vec::<i64>::from_reply(Reply::Array(vec![Reply::Integer(1), Reply::Nil])),
            None
        );
        assert_eq!(
            <(String, i64)>::from_reply(Reply::Array(vec![
                Reply::Text("a".into()),
                Reply::Integer(1)
            ])),
            Some(("a".into(), 1))
        );
        assert_eq!(
            <(String, i64)>::from_reply(Reply::Array(vec![Reply::Integer(1)])),
            None
        );
        let flat = Reply::Array(vec![
            Reply::Text("a".into()),
            Reply::Text("1".into()),
            Reply::Text("b".into()),
            Reply::Text("2".into()),
        ]);
        let map = HashMap::<String, i64>::from_reply(flat).unwrap();
        assert_eq!(map.get("b"), Some(&2));
        let pairs = Reply::Map(vec![(Reply::Text("c".into()), Reply::Integer(3))]);
        assert_eq!(
            HashMap::<String, i64>::from_reply(pairs).unwrap().get("c"),
            Some(&3)
        );
    }

    #[test]
    fn args_are_the_bytes_redis_receives() {
        assert_eq!(ScriptArg::from("a").as_bytes(), b"a");
        assert_eq!(ScriptArg::from(String::from("b")).into_bytes(), b"b");
        assert_eq!(ScriptArg::from(&[1_u8, 2][..]).as_bytes(), &[1, 2]);
        assert_eq!(ScriptArg::from(-3_i64).as_bytes(), b"-3");
        assert_eq!(
            ScriptArg::from(u64::MAX).as_bytes(),
            b"18446744073709551615"
        );
        assert_eq!(ScriptArg::from(0.25_f64).as_bytes(), b"0.25");
    }

    #[test]
    fn text_replies_are_text_when_utf8() {
        assert_eq!(Reply::of_bytes(b"x".to_vec()), Reply::Text("x".into()));
        assert_eq!(Reply::of_bytes(vec![0xff]), Reply::Bytes(vec![0xff]));
    }
}

//! What the engine reads of a primitive, fixed when its handle is made: the [`Keys`] it lives
//! at, what every handle of its kind shares (a [`Class`]: label, owner-field suffix, renewal
//! script, wake rule, name refusal) and the few settings of the handle itself (a queue place, the
//! units a waiter wants, a backoff). Together, its [`Profile`]: data, not calls, so the engine
//! reads it on every operation without asking the primitive anything.

use std::sync::LazyLock;
use std::time::Duration;

use fred::bytes_utils::Str;
use fred::types::Key;

use crate::engine::pubsub::Channel;
use crate::engine::script::Script;
use crate::engine::Name;

/// The most keys (and channel names) one primitive keeps.
const MOST_KEYS: usize = 5;

/// The keys of one primitive, one after another in one buffer: a handle made per task (for a
/// waiter per request, say) then costs one allocation and a few offsets instead of a buffer and
/// a `Key` per key. A key taken out shares the buffer.
#[derive(Clone)]
pub(crate) struct Keys {
    /// Text, checked once to be UTF-8 when made: the keys taken out of it are not checked again.
    joined: Str,
    /// Where each key but the last ends in `joined` (the last ends with it). As `u32`, to keep
    /// the handle small: a key never comes near that, as Redis refuses arguments over 512 MB
    /// (the ends saturate beyond it, and a command carrying such a name is refused whole).
    ends: [u32; MOST_KEYS - 1],
}

impl Keys {
    /// The keys `texts`, at most [`MOST_KEYS`] (checked when compiled).
    pub(crate) fn new<const N: usize>(texts: [&str; N]) -> Keys {
        const { assert!(N <= MOST_KEYS && N > 0) };
        let mut ends = [u32::MAX; MOST_KEYS - 1];
        let mut end = 0usize;
        for (i, text) in texts.iter().enumerate().take(N - 1) {
            end += text.len();
            ends[i] = u32::try_from(end).unwrap_or(u32::MAX);
        }
        Keys {
            joined: Str::from(texts.concat()),
            ends,
        }
    }

    /// The `i`-th key given to [`Keys::new`].
    pub(crate) fn get(&self, i: usize) -> Key {
        Key::from(self.joined.inner().slice(self.range(i)))
    }

    /// The first `n` keys given to [`Keys::new`], as a script call sends them (a primitive whose
    /// last entry is no key, such as a prefix, sends fewer than it keeps).
    pub(crate) fn first(&self, n: usize) -> Vec<Key> {
        (0..n.min(MOST_KEYS)).map(|i| self.get(i)).collect()
    }

    /// The `i`-th key given to [`Keys::new`], as text: a channel's name, say.
    pub(crate) fn text(&self, i: usize) -> Str {
        self.joined.slice_ref(self.str(i))
    }

    /// The `i`-th key given to [`Keys::new`], borrowed: a lock's name, say, which its handle
    /// therefore keeps no copy of.
    pub(crate) fn str(&self, i: usize) -> &str {
        // Each key was a whole `&str`, so its ends fall between characters.
        self.joined.get(self.range(i)).unwrap_or_default()
    }

    fn range(&self, i: usize) -> std::ops::Range<usize> {
        let len = self.joined.len();
        let end = |at: usize| {
            self.ends
                .get(at)
                .map_or(len, |end| (*end as usize).min(len))
        };
        let start = i.checked_sub(1).map_or(0, end);
        start..end(i).max(start)
    }
}

/// How a waiter learns that it may try again.
#[derive(Clone, Debug)]
pub(crate) enum Wake {
    /// An unlock is published on this channel, shared by every waiter of the primitive.
    Shared(Channel),
    /// Each waiter has its own channel, `<prefix>:<owner field>`, and is told alone.
    PerWaiter(Channel),
    /// Releases publish on this shared channel how many units are free now (a semaphore's
    /// permits): a message wakes the waiters whose wants ([`Profile::wants`]) fit in it, in the
    /// order they came, and no more.
    Counted(Channel),
    /// A count reaching zero publishes `0` on this shared channel, which wakes every waiter;
    /// any other message (a new count) wakes none.
    AtZero(Channel),
    /// Nothing is published: waiters sleep and try again, never subscribing.
    Backoff(Backoff),
}

/// Exponential backoff with jitter: the n-th pause is random in the upper half of
/// `first * 2^n`, capped at `cap`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Backoff {
    pub(crate) first: Duration,
    pub(crate) cap: Duration,
}

/// How a kind's waiters learn that they may try again: [`Wake`] without its channel, which is
/// the key at the index given.
#[derive(Clone, Copy, Debug)]
pub(crate) enum WakeRule {
    /// See [`Wake::Shared`].
    Shared(usize),
    /// See [`Wake::PerWaiter`]: the key is the prefix of each waiter's channel.
    PerWaiter(usize),
    /// See [`Wake::Counted`].
    Counted(usize),
    /// See [`Wake::AtZero`].
    AtZero(usize),
    /// See [`Wake::Backoff`]: this backoff unless the profile has its own.
    Backoff(Backoff),
}

/// Why a primitive of a kind cannot take some names: reported as `InvalidArgument`, naming the
/// primitive, before anything is sent.
pub(crate) struct Refusal {
    /// What the message calls the primitive (`read-write lock`).
    pub(crate) what: &'static str,
    /// Whether a handle's keys make its name unusable.
    pub(crate) refuses: fn(&Keys) -> bool,
    /// Why, after `<what> name "<name>"`.
    pub(crate) why: &'static str,
}

/// What every handle of one kind of primitive shares.
pub(crate) struct Class {
    /// The kind in one word (`lock`, `fair_lock`, ..): the `kind` label of its metrics and of its
    /// inspections.
    pub(crate) label: &'static str,
    /// What an owner's field adds to `<client uuid>:<owner id>` (Redisson's writer of a
    /// read-write lock has `:write`); empty for most.
    pub(crate) field_suffix: &'static str,
    /// The script the watchdog renews (lease > 0) or checks (lease 0) holds with: KEYS are
    /// the holds' primitives' [`renewal_key`](Profile::renewal_key)s, ARGV the lease then one owner field per
    /// key; one reply per key, 1 when held. `None` for a primitive whose holds have no lease to
    /// renew or check (a semaphore's permits): the watchdog never visits them.
    pub(crate) renewal: Option<&'static LazyLock<Script>>,
    /// Which of its keys the renewal script takes: the name (0) but for a permit semaphore,
    /// whose leases it extends.
    pub(crate) renewal_key: usize,
    /// How its waiters wake.
    pub(crate) wake: WakeRule,
    /// The names it cannot take, if there are any.
    pub(crate) refusal: Option<Refusal>,
}

impl Class {
    /// A class labelled `label` with no owner-field suffix, renewal or refusal, whose waiters
    /// wake by `wake`: a start for `..` in a `const`.
    pub(crate) const fn new(label: &'static str, wake: WakeRule) -> Class {
        Class {
            label,
            field_suffix: "",
            renewal: None,
            renewal_key: 0,
            wake,
            refusal: None,
        }
    }
}

/// The engine's view of one primitive, worked out once when its handle is made: its keys (the
/// name first), its class, and the handle's own settings.
#[derive(Clone)]
pub(crate) struct Profile {
    keys: Keys,
    class: &'static Class,
    /// How long a waiter's queue place lasts without another attempt, in ms, for a kind whose
    /// waiters queue; 0 for one whose waiters do not. Kept in 32 bits so that the profile of a
    /// plain lock stays small: a place is capped at about 49 days.
    place_ms: u32,
    /// How much of what a [`Wake::Counted`] release announces one waiter needs.
    wants: u32,
    /// A waiter's pauses, for a class whose waiters back off and a handle that does not keep
    /// the class's: boxed, as most do not.
    backoff: Option<Box<Backoff>>,
    /// Whether the class's refusal applies to these keys: worked out when made.
    refused: bool,
}

impl Profile {
    /// A primitive of class `class` at `keys` (its name first), whose waiters want one unit and
    /// do not queue.
    pub(crate) fn new(class: &'static Class, keys: Keys) -> Profile {
        let refused = class
            .refusal
            .as_ref()
            .is_some_and(|refusal| (refusal.refuses)(&keys));
        Profile {
            keys,
            class,
            place_ms: 0,
            wants: 1,
            backoff: None,
            refused,
        }
    }

    /// The same, whose waiters keep a queue place of `place` (none for `None` or zero).
    pub(crate) fn with_place(self, place: Option<Duration>) -> Profile {
        let place_ms = place.map_or(0, |place| {
            u32::try_from(place.as_millis().max(1)).unwrap_or(u32::MAX)
        });
        Profile { place_ms, ..self }
    }

    /// The same, whose waiters each want `wants` units of a counted release.
    pub(crate) fn with_wants(self, wants: u32) -> Profile {
        Profile { wants, ..self }
    }

    /// The same, whose waiters pause by `backoff` (for a class that backs off) instead of the
    /// class's.
    pub(crate) fn with_backoff(self, backoff: Backoff) -> Profile {
        let own = match self.class.wake {
            WakeRule::Backoff(default) => backoff != default,
            _ => false,
        };
        Profile {
            backoff: own.then(|| Box::new(backoff)),
            ..self
        }
    }

    /// The primitive's keys, as given when made.
    pub(crate) fn keys(&self) -> &Keys {
        &self.keys
    }

    /// The primitive's name: its main key, which messages name it by.
    pub(crate) fn name(&self) -> &str {
        self.keys.str(0)
    }

    /// The name as shared text (a slice of the keys, not a copy), which holds are kept by.
    pub(crate) fn name_text(&self) -> Name {
        self.keys.text(0)
    }

    /// The name as a key, shared rather than copied.
    pub(crate) fn name_key(&self) -> Key {
        self.keys.get(0)
    }

    /// The key a renewal script takes for each hold (see [`Class::renewal_key`]), shared
    /// rather than copied.
    pub(crate) fn renewal_key(&self) -> Key {
        self.keys.get(self.class.renewal_key)
    }

    /// See [`Class::label`].
    pub(crate) fn label(&self) -> &'static str {
        self.class.label
    }

    /// See [`Class::field_suffix`].
    pub(crate) fn field_suffix(&self) -> &'static str {
        self.class.field_suffix
    }

    /// See [`Class::renewal`].
    pub(crate) fn renewal(&self) -> Option<&'static Script> {
        self.class.renewal.map(|script| &**script)
    }

    /// What it shares with every handle of its kind.
    pub(crate) fn class(&self) -> &'static Class {
        self.class
    }

    /// How its waiters wake, on which channel.
    pub(crate) fn wake(&self) -> Wake {
        match self.class.wake {
            WakeRule::Shared(at) => Wake::Shared(self.keys.text(at)),
            WakeRule::PerWaiter(at) => Wake::PerWaiter(self.keys.text(at)),
            WakeRule::Counted(at) => Wake::Counted(self.keys.text(at)),
            WakeRule::AtZero(at) => Wake::AtZero(self.keys.text(at)),
            WakeRule::Backoff(default) => {
                Wake::Backoff(self.backoff.as_deref().copied().unwrap_or(default))
            }
        }
    }

    /// How long a waiter's queue place lasts without another attempt, for a primitive whose
    /// waiters queue; `None` for one whose waiters do not.
    pub(crate) fn place(&self) -> Option<Duration> {
        (self.place_ms > 0).then(|| Duration::from_millis(self.place_ms.into()))
    }

    /// How much of what a [`Wake::Counted`] release announces one waiter needs (a semaphore
    /// waiter's permits); 1 for every other.
    pub(crate) fn wants(&self) -> u32 {
        self.wants
    }

    /// Why the primitive cannot take its name, if it cannot.
    pub(crate) fn refusal(&self) -> Option<String> {
        let refusal = self.class.refusal.as_ref().filter(|_| self.refused)?;
        Some(format!(
            "{} name {:?} {}",
            refusal.what,
            self.name(),
            refusal.why
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_made_together_are_the_texts_given() {
        let texts = ["orders:1", "", "redisson_lock__channel:{orders:1}", "é{ü"];
        let keys = Keys::new(texts);
        for (i, text) in texts.iter().enumerate() {
            assert_eq!(keys.get(i), Key::from(*text));
            assert_eq!(&*keys.text(i), *text);
            assert_eq!(keys.str(i), *text);
        }
        let five = ["a", "bc", "", "def", "g"];
        let keys = Keys::new(five);
        for (i, text) in five.iter().enumerate() {
            assert_eq!(keys.str(i), *text);
        }
        assert_eq!(keys.first(9).len(), MOST_KEYS);
    }

    #[test]
    fn a_place_is_kept_in_ms_and_none_is_none() {
        static CLASS: Class = Class::new("lock", WakeRule::Shared(1));
        let profile = Profile::new(&CLASS, Keys::new(["a", "b"]));
        assert_eq!(profile.place(), None);
        let placed = profile
            .clone()
            .with_place(Some(Duration::from_millis(1500)));
        assert_eq!(placed.place(), Some(Duration::from_millis(1500)));
        let tiny = profile.clone().with_place(Some(Duration::from_micros(10)));
        assert_eq!(tiny.place(), Some(Duration::from_millis(1)));
        assert_eq!(profile.with_place(None).place(), None);
    }
}

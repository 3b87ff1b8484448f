//! What the engine reads of a primitive, fixed when its handle is made: the [`Keys`] it lives
//! at, what every handle of its kind shares (a [`Class`]: label, owner-field suffix, renewal
//! script, wake rule, name refusal) and the few settings of the handle itself (a queue place, the
//! units a waiter wants, a backoff). Together, its [`Profile`]: data, not calls, so the engine
//! reads it on every operation without asking the primitive anything.

use std::sync::atomic::AtomicU32;
use std::sync::LazyLock;
use std::time::Duration;

use crate::engine::Key;
use crate::engine::Str;
use crate::inspection::{LockEventKind, LossReason};

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

    /// How many keys were given to [`Keys::new`].
    pub(crate) fn count(&self) -> usize {
        1 + self.ends.iter().take_while(|end| **end != u32::MAX).count()
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
    /// As [`Shared`](Self::Shared), and the waiting clients stand in a line beside the lock (a
    /// zset the kind's acquire keeps, see `lua/lock.lua`): a release publishes the first one's
    /// number just before its unlock message, and the other clients in line let that message
    /// pass, so that one client wakes instead of all.
    InLine(Channel),
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
    /// See [`Wake::InLine`].
    InLine(usize),
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
    /// What its handles keep of their own.
    pub(crate) own: Own,
    /// The names it cannot take, if there are any: a rule on a handle's keys.
    pub(crate) refusal: Option<Refusal>,
    /// What its holds are told as on the event stream, which the engine sends without
    /// knowing what they mean.
    pub(crate) events: HoldEvents,
    /// Every Redis command its calls run on its keys, in groups (its own file's, each
    /// preamble's): those its scripts' files run (`redis.call`, publishing aside, which is
    /// asked about on its channel), and any it sends outside a script. The permission check asks the server about these, and only these,
    /// before its first call (see `permissions.rs`); the primitive's own unit test keeps the
    /// list and its scripts in step.
    pub(crate) commands: &'static [&'static [&'static str]],
    /// Which bit of a client's answers stands for this class's yes, given at its first
    /// question (see `permissions.rs`); `u32::MAX` until then. (An atomic, not a `OnceLock`,
    /// whose destructor a `..` in a `static` cannot run.)
    pub(crate) permission_bit: AtomicU32,
}

/// The events a class's holds are told as: taken, and lost (with why). Most primitives' are
/// [`HoldEvents::HOLDS`]; one whose holds mean something of their own names its events (a
/// leader election's holds are terms, won and lost).
#[derive(Clone, Copy)]
pub(crate) struct HoldEvents {
    /// A hold taken.
    pub(crate) taken: LockEventKind,
    /// A hold lost, and why.
    pub(crate) lost: fn(LossReason) -> LockEventKind,
}

impl HoldEvents {
    /// `Acquired` and `Lost(why)`.
    pub(crate) const HOLDS: HoldEvents = HoldEvents {
        taken: LockEventKind::Acquired,
        lost: LockEventKind::Lost,
    };
}

impl Class {
    /// A class labelled `label` with no owner-field suffix, renewal or refusal, whose waiters
    /// wake by `wake` and whose calls run `commands`: a start for `..` in a `const`.
    pub(crate) const fn new(
        label: &'static str,
        wake: WakeRule,
        commands: &'static [&'static [&'static str]],
    ) -> Class {
        Class {
            label,
            field_suffix: "",
            renewal: None,
            renewal_key: 0,
            wake,
            own: Own::Nothing,
            refusal: None,
            events: HoldEvents::HOLDS,
            commands,
            permission_bit: AtomicU32::new(u32::MAX),
        }
    }
}

/// What a class's handles keep of their own, in the slots of their profile: each costs a
/// handle 4 bytes, and a kind with none pays nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Own {
    /// Nothing.
    Nothing,
    /// How long a waiter's queue place lasts without another attempt, in ms (capped at about
    /// 49 days), in the first slot; none when 0 or absent.
    Place,
    /// How many units of a counted release one waiter needs, in the first slot; 1 when absent.
    Wants,
    /// A waiter's backoff, first pause and cap in µs (a cap over about 71 minutes counts as
    /// that; every pause is bounded by the holder's lease as well), in the first two slots; the
    /// class's when absent.
    Backoff,
}

/// The engine's view of one primitive, worked out once when its handle is made: its keys (the
/// name first), its class, and the handle's own settings in `own` slots whose meaning the
/// class gives ([`Class::own`]). The engine sees every kind's as a [`Profile`], whatever the
/// number of slots.
#[derive(Clone)]
pub(crate) struct ProfileOf<Slots: ?Sized> {
    keys: Keys,
    class: &'static Class,
    own: Slots,
}

/// A profile as the engine reads it, with however many slots its kind keeps.
pub(crate) type Profile = ProfileOf<[u32]>;

/// `duration` in whole units of `unit`, at least 1 and at most `u32::MAX`.
fn units(duration: Duration, unit: Duration) -> u32 {
    u32::try_from((duration.as_nanos() / unit.as_nanos()).max(1)).unwrap_or(u32::MAX)
}

impl ProfileOf<[u32; 0]> {
    /// A primitive of class `class` at `keys` (its name first), keeping nothing of its own.
    pub(crate) fn new(class: &'static Class, keys: Keys) -> ProfileOf<[u32; 0]> {
        ProfileOf {
            keys,
            class,
            own: [],
        }
    }

    /// The same, whose waiters keep a queue place of `place` (none for `None`), for a class
    /// of [`Own::Place`].
    pub(crate) fn with_place(self, place: Option<Duration>) -> ProfileOf<[u32; 1]> {
        let ms = place.map_or(0, |place| units(place, Duration::from_millis(1)));
        self.with_own([ms])
    }

    /// The same, whose waiters pause by `backoff` instead of the class's, for a class of
    /// [`Own::Backoff`].
    pub(crate) fn with_backoff(self, backoff: Backoff) -> ProfileOf<[u32; 2]> {
        let us = Duration::from_micros(1);
        self.with_own([units(backoff.first, us), units(backoff.cap, us)])
    }

    fn with_own<const N: usize>(self, own: [u32; N]) -> ProfileOf<[u32; N]> {
        ProfileOf {
            keys: self.keys,
            class: self.class,
            own,
        }
    }
}

impl<const N: usize> ProfileOf<[u32; N]> {
    /// The same profile, wanting `wants` (a semaphore's acquisition): for a class of
    /// [`Own::Wants`].
    pub(crate) fn wanting(&self, wants: u32) -> ProfileOf<[u32; 1]> {
        ProfileOf {
            keys: self.keys.clone(),
            class: self.class,
            own: [wants],
        }
    }
}

impl<Slots: AsRef<[u32]> + ?Sized> ProfileOf<Slots> {
    /// The handle's `i`-th slot, if its class keeps `what` there.
    fn slot(&self, what: Own, i: usize) -> Option<u32> {
        (self.class.own == what)
            .then(|| self.own.as_ref().get(i).copied())
            .flatten()
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
            WakeRule::InLine(at) => Wake::InLine(self.keys.text(at)),
            WakeRule::PerWaiter(at) => Wake::PerWaiter(self.keys.text(at)),
            WakeRule::Counted(at) => Wake::Counted(self.keys.text(at)),
            WakeRule::AtZero(at) => Wake::AtZero(self.keys.text(at)),
            WakeRule::Backoff(default) => Wake::Backoff(
                match (self.slot(Own::Backoff, 0), self.slot(Own::Backoff, 1)) {
                    (Some(first_us), Some(cap_us)) => Backoff {
                        first: Duration::from_micros(first_us.into()),
                        cap: Duration::from_micros(cap_us.into()),
                    },
                    _ => default,
                },
            ),
        }
    }

    /// How long a waiter's queue place lasts without another attempt, for a primitive whose
    /// waiters queue; `None` for one whose waiters do not.
    pub(crate) fn place(&self) -> Option<Duration> {
        let ms = self.slot(Own::Place, 0).filter(|ms| *ms > 0)?;
        Some(Duration::from_millis(ms.into()))
    }

    /// How much of what a [`Wake::Counted`] release announces one waiter needs (a semaphore
    /// waiter's permits); 1 for every other.
    pub(crate) fn wants(&self) -> u32 {
        self.slot(Own::Wants, 0).unwrap_or(1)
    }

    /// Why the primitive cannot take its name, if it cannot: its class's rule on its keys.
    pub(crate) fn refusal(&self) -> Option<String> {
        let refusal =
            (self.class.refusal.as_ref()).filter(|refusal| (refusal.refuses)(&self.keys))?;
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
        static QUEUE: Class = Class {
            own: Own::Place,
            ..Class::new("fair_lock", WakeRule::PerWaiter(1), &[])
        };
        let profile = ProfileOf::new(&QUEUE, Keys::new(["a", "b"]));
        assert_eq!(profile.place(), None);
        let placed = profile
            .clone()
            .with_place(Some(Duration::from_millis(1500)));
        assert_eq!(placed.place(), Some(Duration::from_millis(1500)));
        assert_eq!(placed.wants(), 1);
        let tiny = profile.clone().with_place(Some(Duration::from_micros(10)));
        assert_eq!(tiny.place(), Some(Duration::from_millis(1)));
        assert_eq!(profile.with_place(None).place(), None);
    }

    #[test]
    fn slots_mean_what_the_class_says() {
        static COUNTED: Class = Class {
            own: Own::Wants,
            ..Class::new("semaphore", WakeRule::Counted(1), &[])
        };
        let profile = ProfileOf::new(&COUNTED, Keys::new(["a", "b"]));
        assert_eq!(profile.wants(), 1);
        assert_eq!(profile.wanting(7).wants(), 7);
        assert_eq!(profile.wanting(7).place(), None);
    }

    #[test]
    fn a_backoff_of_its_own_is_kept_and_the_class_default_otherwise() {
        const DEFAULT: Backoff = Backoff {
            first: Duration::from_millis(1),
            cap: Duration::from_millis(128),
        };
        static SPIN: Class = Class {
            own: Own::Backoff,
            ..Class::new("spin_lock", WakeRule::Backoff(DEFAULT), &[])
        };
        let profile = ProfileOf::new(&SPIN, Keys::new(["a"]));
        assert!(matches!(profile.wake(), Wake::Backoff(backoff) if backoff == DEFAULT));
        let own = Backoff {
            first: Duration::from_micros(2500),
            cap: Duration::from_secs(3),
        };
        let profile = profile.with_backoff(own);
        assert!(matches!(profile.wake(), Wake::Backoff(backoff) if backoff == own));
        assert_eq!(profile.wants(), 1);
        assert_eq!(profile.place(), None);
    }

    /// A plain lock's handle keeps its profile and nothing else: what every held lock and
    /// waiting task pays. Each slot adds 4 bytes.
    #[test]
    fn a_profile_stays_small() {
        assert_eq!(std::mem::size_of::<ProfileOf<[u32; 0]>>(), 56);
        assert_eq!(std::mem::size_of::<ProfileOf<[u32; 1]>>(), 64);
        assert_eq!(std::mem::size_of::<ProfileOf<[u32; 2]>>(), 64);
    }
}

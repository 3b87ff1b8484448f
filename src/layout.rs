//! How a scan recognises a primitive by its keys ([`Layout`]), and what it gets back: a handle
//! that reads, judges and force-unlocks what it found ([`Found`]). Each primitive declares its
//! layout beside itself; the one list of them is in `ops.rs`, which nothing but `lib.rs`
//! imports, so this module knows no primitive.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::engine::ScanType;

use crate::client::LockClient;
use crate::engine::Inspect;
use crate::error::{Error, Result};
use crate::inspection::{Inspection, Leak};

/// A future a [`Found`] returns: boxed, as a handle behind `dyn` returns them.
pub(crate) type Pending<'a, T> = Pin<Box<dyn Future<Output = Result<T>> + Send + 'a>>;

/// How a scan recognises one primitive's keys.
pub(crate) struct Layout {
    /// The prefixes of keys only this primitive has (`<prefix>:{name}`), by which a name is
    /// known to be of it; none for the plain lock, which is a hash at the name and nothing else.
    pub(crate) own_keys: &'static [&'static str],
    /// A key only this primitive has that is named otherwise (a permit semaphore's
    /// `{name}:timeout`): the key of a name, a glob that finds such keys, and the name of one.
    pub(crate) own_key: Option<OwnKey>,
    /// Whether a `mode` field in the hash at the name tells it (a read-write lock's).
    pub(crate) mode_field: bool,
    /// The type of key at the name that tells it, when nothing else does (`string`: Redisson's
    /// counters).
    pub(crate) of_type: Option<&'static str>,
    /// A glob of every name's keys that only a scan finds (its `Inspect::strays`, for any
    /// name), scanned once for all the primitives a listing inspects.
    pub(crate) strays: Option<&'static str>,
    /// A handle on the primitive at `key` (the name with the client's prefix already on it).
    pub(crate) at_key: fn(&LockClient, String) -> Box<dyn Found>,
}

/// A key of a primitive named otherwise than `<prefix>:{name}`.
pub(crate) struct OwnKey {
    /// The key of a name; `None` for a name that cannot have one.
    pub(crate) of: fn(&str) -> Option<String>,
    /// A glob that finds every such key, and the type of those keys.
    pub(crate) glob: &'static str,
    pub(crate) key_type: ScanType,
    /// The name whose key `key` is, if it is one.
    pub(crate) name: fn(&str) -> Option<String>,
}

/// A primitive found by its keys: what the client's inspections, listings, leak search and
/// force unlock by name do with it.
pub(crate) trait Found: Send + Sync {
    /// The client it was found with, and how it reads and judges itself.
    fn parts(&self) -> (&LockClient, &dyn Inspect);

    /// Reads it, with the keys a scan already found among which its strays are (`None`: it
    /// scans for its own).
    fn inspect_among<'a>(&'a self, scanned: Option<&'a [String]>) -> Pending<'a, Inspection> {
        let (client, kind) = self.parts();
        Box::pin(client.engine().inspect(kind, scanned))
    }

    /// What in `inspection` (of this primitive) nothing will clean up, by its own rules.
    fn leaks(&self, inspection: &Inspection, grace: Duration) -> Vec<Leak> {
        self.parts().1.leaks(inspection, grace)
    }

    /// Deletes it whoever holds it, waking its waiters; `true` if it was held.
    fn force_unlock(&self) -> Pending<'_, bool>;

    /// Whether `inspection` is of this primitive rather than of a user's own data under its
    /// name (a hash whose fields are not owners is no lock).
    fn holds_owners(&self, _inspection: &Inspection) -> bool {
        true
    }
}

/// A primitive that is no lock (a semaphore, a latch): read and judged by its kind, and never
/// force-unlocked.
pub(crate) struct Counted {
    pub(crate) client: LockClient,
    pub(crate) kind: Arc<dyn Inspect>,
}

impl Found for Counted {
    fn parts(&self) -> (&LockClient, &dyn Inspect) {
        (&self.client, &*self.kind)
    }

    fn force_unlock(&self) -> Pending<'_, bool> {
        let refusal = Error::InvalidArgument(format!(
            "{:?} is a {}, not a lock: nothing to force-unlock (give permits back with \
             release_by_id or add_permits; release a latch's waiters with delete)",
            self.kind.profile().name(),
            self.kind.family()
        ));
        Box::pin(async move { Err(refusal) })
    }
}

/// `text` with Redis's glob characters quoted, to match itself only.
pub(crate) fn glob_escaped(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

//! The roof: what needs the list of every primitive. The client's inspections, scans, leak
//! search and force unlock by name (which the `fredlock` command is a thin layer over) find a
//! primitive by its keys through each primitive's [`Layout`]; the script-source hook for tests
//! and the benchmark names every primitive's scripts. Only `lib.rs` imports this module: a
//! primitive imports the floor (`layout.rs`, `lua.rs`, the engine), never the list of the others.
//! The reads themselves and the leak rules are each primitive's own (its `Inspect`), run by
//! the engine.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::engine::ScanType;
use crate::engine::Value;

use crate::client::LockClient;
use crate::engine::Script;
use crate::error::Result;
use crate::inspection::{Inspection, Leak};
use crate::layout::{glob_escaped, Found, Layout};
use crate::names;

/// Every layout, the most telling first: a name is of the first layout whose own keys exist
/// (or whose `mode` field does, or whose type the key has). A spin lock has the plain lock's
/// layout and is reported as one. A fair or fenced lock that nobody waits for (or whose counter
/// was deleted) looks like a plain lock too, and reads and force-unlocks as one correctly. A
/// semaphore whose permits are all in, a permit semaphore without leases and a count-down latch
/// are all one integer string: they are found by name only, as a `counter`. A job lock is a
/// string too, known by its key (`job-lock:..`) or its tick key: first, before the counters.
const LAYOUTS: [&Layout; 9] = [
    &crate::job::LAYOUT,
    &crate::lock::leader::LAYOUT,
    &crate::lock::rw::LAYOUT,
    &crate::lock::fair::LAYOUT,
    &crate::lock::fenced::LAYOUT,
    &crate::counter::permit_semaphore::LAYOUT,
    &crate::counter::semaphore::LAYOUT,
    &crate::counter::latch::COUNTER_LAYOUT,
    &crate::lock::reentrant::LAYOUT,
];

/// A waiter's place that ended longer ago than this is a leak by default (see
/// [`LockClient::leaks`]).
pub const DEFAULT_LEAK_GRACE: Duration = Duration::from_secs(60);

impl LockClient {
    /// What Redis holds of the primitive named `name` (after the client's key prefix): its
    /// kind, holders, queue and keys; `None` when it has no key at all. The kind is read from
    /// its keys; see [`Lock::inspect`](crate::LockFamily::inspect) to read a handle you have.
    ///
    /// # Errors
    ///
    /// [`Error::WrongType`](crate::Error::WrongType) when the key holds another type,
    /// [`Error::Redis`](crate::Error::Redis) when the server cannot be asked.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn inspect(&self, name: &str) -> Result<Option<Inspection>> {
        let found = self.find(self.key(name.to_owned())).await?;
        let inspection = found.inspect_among(None).await?;
        Ok(inspection.exists().then_some(inspection))
    }

    /// Every primitive whose name (key) matches `pattern`, a Redis glob (`*`, `?`, `[..]`),
    /// after the client's key prefix, read as [`inspect`](Self::inspect) reads one; sorted by
    /// name. It scans every master with `SCAN`, which never blocks the server, so primitives
    /// made or deleted during the scan may be missed. A hash that is not a hash of holds (a
    /// user's own data) is skipped.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`](crate::Error::Redis) when a server cannot be asked.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn list(&self, pattern: &str) -> Result<Vec<Inspection>> {
        let mut inspections: Vec<Inspection> = self
            .scan_primitives(pattern)
            .await?
            .into_iter()
            .map(|(_, inspection)| inspection)
            .collect();
        self.engine().name_holders(&mut inspections).await;
        Ok(inspections)
    }

    /// Everything the primitives matching `pattern` (as [`list`](Self::list) reads it) left
    /// in Redis that nothing will clean up, by each primitive's own rules: keys of a primitive
    /// without expiry (a lock hash written without a TTL is never freed), and a fair lock's
    /// waiters whose place ended more than `grace` ago (see [`DEFAULT_LEAK_GRACE`]).
    /// [`force_unlock`](Self::force_unlock) removes a leaked hold.
    ///
    /// # Errors
    ///
    /// As [`list`](Self::list).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn leaks(&self, pattern: &str, grace: Duration) -> Result<Vec<Leak>> {
        Ok(self
            .scan_primitives(pattern)
            .await?
            .into_iter()
            .flat_map(|(found, inspection)| found.leaks(&inspection, grace))
            .collect())
    }

    /// Deletes the primitive named `name` (after the client's key prefix) whoever holds it,
    /// and wakes its waiters, as its own `force_unlock` does (for a fair lock, the first in
    /// line); `true` if it was held. The kind is read from its keys.
    ///
    /// # Errors
    ///
    /// As [`Lock::force_unlock`](crate::LockFamily::force_unlock).
    ///
    /// # Cancel safety
    ///
    /// As [`Lock::force_unlock`](crate::LockFamily::force_unlock).
    pub async fn force_unlock(&self, name: &str) -> Result<bool> {
        self.find(self.key(name.to_owned()))
            .await?
            .force_unlock()
            .await
    }

    /// A handle on the primitive at `key`, of the first layout that claims it.
    async fn find(&self, key: String) -> Result<Box<dyn Found>> {
        crate::engine::check_name(&key)?;
        self.engine().core().ensure_open()?;
        let layout = self.layouts_of(std::slice::from_ref(&key)).await?[0];
        Ok((layout.at_key)(self, key))
    }

    /// The layout of the primitive at each of `keys`: the first whose own keys exist there,
    /// whose `mode` field is in the hash, or whose type the key has; the plain lock's otherwise.
    /// One round trip: an `EXISTS` per layout with own keys, an `HEXISTS` per layout told by its
    /// mode and a `TYPE` per layout told by its type, in one pipeline.
    async fn layouts_of(&self, keys: &[String]) -> Result<Vec<&'static Layout>> {
        let redis_error = |source: crate::RedisError| {
            let name = keys.first().map_or("", String::as_str);
            self.engine().redis_error(name, None, source)
        };
        let mut commands: Vec<(&'static str, Vec<Value>)> = Vec::new();
        // What each answer must be for a yes: a count above zero, or this type.
        let mut asked: Vec<Option<&'static str>> = Vec::new();
        for key in keys {
            for layout in LAYOUTS {
                let mut own: Vec<String> = layout
                    .own_keys
                    .iter()
                    .map(|prefix| names::suffixed(prefix, key))
                    .collect();
                own.extend(layout.own_key.as_ref().and_then(|own| (own.of)(key)));
                if !own.is_empty() {
                    commands.push(("EXISTS", own.into_iter().map(Value::from).collect()));
                    asked.push(None);
                }
                if layout.mode_field {
                    commands.push(("HEXISTS", vec![key.as_str().into(), "mode".into()]));
                    asked.push(None);
                }
                if let Some(of_type) = layout.of_type {
                    commands.push(("TYPE", vec![key.as_str().into()]));
                    asked.push(Some(of_type));
                }
            }
        }
        let found = if asked.is_empty() {
            Vec::new()
        } else {
            self.engine()
                .core()
                .redis()
                .pipeline(commands)
                .await
                .map_err(redis_error)?
        };
        // A connection failure is one; an error reply (WRONGTYPE, for a key that is no hash) says
        // no.
        let mut answers = Vec::with_capacity(found.len());
        for (reply, wanted) in found.into_iter().zip(asked) {
            match reply {
                Ok(value) => answers.push(match wanted {
                    None => value.as_i64().unwrap_or(0) > 0,
                    Some(of_type) => value.as_str().as_deref() == Some(of_type),
                }),
                Err(error) if crate::error::is_transient(&error) => return Err(redis_error(error)),
                Err(_) => answers.push(false),
            }
        }
        let mut found = answers.into_iter();
        Ok(keys
            .iter()
            .map(|key| {
                let mut claimed = None;
                for layout in LAYOUTS {
                    let own = !layout.own_keys.is_empty()
                        || layout
                            .own_key
                            .as_ref()
                            .is_some_and(|own| (own.of)(key).is_some());
                    let asks = usize::from(own)
                        + usize::from(layout.mode_field)
                        + usize::from(layout.of_type.is_some());
                    // Every answer is read, so that the next key's answers start where they should.
                    let yes = (0..asks).fold(false, |yes, _| found.next().unwrap_or(false) || yes);
                    if claimed.is_none() && (yes || asks == 0) {
                        claimed = Some(layout);
                    }
                }
                claimed.unwrap_or(&crate::lock::reentrant::LAYOUT)
            })
            .collect())
    }

    /// Every primitive matching `pattern`, with a handle on it, by name.
    async fn scan_primitives(&self, pattern: &str) -> Result<Vec<(Box<dyn Found>, Inspection)>> {
        let pattern = format!("{}{pattern}", glob_escaped(self.key_prefix()));
        let engine = self.engine();
        // Names by the first layout that claims them: their own keys first, then bare hashes.
        let mut found: BTreeMap<String, &Layout> = BTreeMap::new();
        for layout in LAYOUTS {
            for prefix in layout.own_keys {
                for key in engine.scan(&format!("{prefix}:*"), None).await? {
                    if let Some(name) = names::unsuffixed(prefix, &key) {
                        if crate::engine::inspect::glob(&pattern, &name) {
                            found.entry(name).or_insert(layout);
                        }
                    }
                }
            }
            if let Some(own) = &layout.own_key {
                for key in engine.scan(own.glob, Some(own.key_type.clone())).await? {
                    if let Some(name) = (own.name)(&key) {
                        if crate::engine::inspect::glob(&pattern, &name) {
                            found.entry(name).or_insert(layout);
                        }
                    }
                }
            }
        }
        let hashes: Vec<String> = engine
            .scan(&pattern, Some(ScanType::Hash))
            .await?
            .into_iter()
            .filter(|key| !found.contains_key(key) && !is_own_key(key))
            .collect();
        if !hashes.is_empty() {
            let layouts = self.layouts_of(&hashes).await?;
            found.extend(hashes.into_iter().zip(layouts));
        }
        // One scan per kind of stray key, not one per primitive that may have some.
        let mut scanned = Vec::new();
        for layout in LAYOUTS {
            let used = found.values().any(|found| std::ptr::eq(*found, layout));
            if let Some(strays) = layout.strays.filter(|_| used) {
                scanned.extend(engine.scan(strays, None).await?);
            }
        }
        let mut primitives = Vec::with_capacity(found.len());
        for (name, layout) in found {
            let primitive = (layout.at_key)(self, name);
            let inspection = match primitive.inspect_among(Some(&scanned)).await {
                Ok(inspection) => inspection,
                // Deleted and made again as something else since the scan.
                Err(crate::Error::WrongType { .. }) => continue,
                Err(error) => return Err(error),
            };
            if inspection.exists() && primitive.holds_owners(&inspection) {
                primitives.push((primitive, inspection));
            }
        }
        Ok(primitives)
    }
}

/// Whether `key` is a key some layout's primitive has besides its name (a semaphore's grants
/// are a hash, and no lock).
fn is_own_key(key: &str) -> bool {
    LAYOUTS.iter().any(|layout| {
        layout
            .own_keys
            .iter()
            .any(|prefix| names::unsuffixed(prefix, key).is_some())
    })
}

/// The composed text of the script named `<primitive>_<script>` (`"lock_acquire"`,
/// `"fair_release"`, `"rw_read_acquire"`, `"permit_semaphore_acquire"`..): what the crate
/// sends, for tests and the benchmark that call a script by hand. `None` for a name that is no
/// script.
#[doc(hidden)]
pub fn source(name: &str) -> Option<&'static str> {
    let script: &'static Script = if let Some(rest) = name.strip_prefix("permit_semaphore_") {
        match rest {
            "acquire" => &crate::counter::permit_semaphore::PERMIT_ACQUIRE,
            "release" => &crate::counter::permit_semaphore::PERMIT_RELEASE,
            "renew" => &crate::counter::permit_semaphore::PERMIT_RENEW,
            _ => return None,
        }
    } else if let Some(rest) = name.strip_prefix("semaphore_") {
        match rest {
            "acquire" => &crate::counter::semaphore::SEMAPHORE_ACQUIRE,
            "release" => &crate::counter::semaphore::SEMAPHORE_RELEASE,
            "add" => &crate::counter::semaphore::SEMAPHORE_ADD,
            _ => return None,
        }
    } else if name == "latch_count_down" {
        &crate::counter::latch::LATCH_COUNT_DOWN
    } else if name == "fenced_acquire" {
        &crate::lock::fenced::FENCED_ACQUIRE
    } else if let Some(rest) = name.strip_prefix("lock_") {
        crate::lock::reentrant::script(rest)?
    } else if let Some(rest) = name.strip_prefix("fair_") {
        crate::lock::fair::script(rest)?
    } else if let Some(rest) = name.strip_prefix("rw_") {
        crate::lock::rw::script(rest)?
    } else if let Some(rest) = name.strip_prefix("job_") {
        crate::job::script(rest)?
    } else if let Some(rest) = name.strip_prefix("leader_") {
        crate::lock::leader::script(rest)?
    } else if let Some(rest) = name.strip_prefix("redlock_") {
        crate::redlock::script(rest)?
    } else {
        return None;
    };
    Some(script.body())
}

/// Replays a recorded sequence of one owner's calls through a new ledger (the engine's record
/// of lost replies and the fences they need), for the test that ties the model's client to it;
/// see `tests/model`. `Err` names a step it cannot take.
#[doc(hidden)]
pub async fn replay_ledger(steps: &[&str]) -> std::result::Result<Vec<Vec<u64>>, String> {
    crate::engine::replay_ledger(steps).await
}

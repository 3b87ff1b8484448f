//! What every test of a refusal does (issue 58): while the server refuses writes (a permission
//! taken away, a server turned replica, memory full, replicas missing, a slot in migration),
//! holders hold and waiters wait on a lock and a fair lock, and every primitive's writing calls
//! are tried. Afterwards a SCAN finds no new key without a TTL, every error names the refusal
//! and the lock, the next calls work, and nothing held was given to two owners.

use std::future::Future;
use std::time::Duration;

use fred::prelude::*;
use fredlock::LockClient;
use tokio::time::Instant;

/// The keys of the server behind `raw` (one node) that have no TTL, found by SCAN.
pub async fn keys_without_ttl(raw: &Client) -> Vec<String> {
    let mut without = Vec::new();
    let mut cursor = "0".to_string();
    loop {
        let (next, keys): (String, Vec<String>) = raw
            .custom(
                fred::cmd!("SCAN"),
                vec![cursor.clone(), "COUNT".into(), "1000".into()],
            )
            .await
            .expect("SCAN");
        for key in keys {
            let ttl: i64 = match raw.pttl(&key).await {
                Ok(ttl) => ttl,
                // A key of a slot this cluster node imports: it answers after ASKING.
                Err(_) => {
                    let _: Value = raw
                        .custom(fred::cmd!("ASKING"), Vec::<String>::new())
                        .await
                        .expect("ASKING");
                    raw.pttl(&key).await.expect("PTTL after ASKING")
                }
            };
            if ttl == -1 {
                without.push(key);
            }
        }
        if next == "0" {
            break;
        }
        cursor = next;
    }
    without.sort();
    without
}

/// Whether `key` is one the crate keeps without a TTL by design (docs/SECURITY.md): a
/// semaphore's or permit semaphore's permits and a latch's count (the walk's names for them
/// end so), the fenced lock's last token, an election's epoch.
pub fn kept_without_ttl(key: &str) -> bool {
    ["-semaphore", "-permits", "-latch"]
        .iter()
        .any(|end| key.ends_with(end))
        || ["redisson_lock_token:{", "fredlock_leader_epoch:{"]
            .iter()
            .any(|start| key.starts_with(start))
}

/// What each writing call ended with, by the name it was called on.
pub type Outcomes = Vec<(String, fredlock::Result<()>)>;

/// Every kind of primitive, as docs/SECURITY.md's table of kinds names it, with the suffix
/// of the names [`writing_calls`] calls it on: the one list of kinds the tests walk (a new
/// primitive joins it here, and every refusal and ACL test then runs it).
pub const KINDS: [(&str, &str); 11] = [
    ("lock", "-lock"),
    ("fair_lock", "-fair"),
    ("spin_lock", "-spin"),
    ("fenced_lock", "-fenced"),
    ("rw_lock", "-rw"),
    ("semaphore", "-semaphore"),
    ("permit_semaphore", "-permits"),
    ("count_down_latch", "-latch"),
    ("leader_election", "-leader"),
    ("redlock", "-redlock"),
    ("job", "-job"),
];

/// `kind`'s writing calls, once each on `name` (a job's key is `job-lock:default:` and its
/// name), each wait `wait`: what a client's first call of it is, and what a walk tries.
pub async fn writing_call(
    client: &LockClient,
    kind: &str,
    name: &str,
    wait: Duration,
) -> fredlock::Result<()> {
    match kind {
        "lock" => {
            if let Some(guard) = client.lock(name).try_lock(wait, None).await? {
                guard.unlock().await?;
            }
        }
        "fair_lock" => {
            if let Some(guard) = client.fair_lock(name).try_lock(wait, None).await? {
                guard.unlock().await?;
            }
        }
        "spin_lock" => {
            if let Some(guard) = client.spin_lock(name).try_lock(wait, None).await? {
                guard.unlock().await?;
            }
        }
        "fenced_lock" => {
            if let Some(guard) = client.fenced_lock(name).try_lock(wait, None).await? {
                guard.unlock().await?;
            }
        }
        "rw_lock" => {
            let rw = client.rw_lock(name);
            if let Some(guard) = rw.read_lock().try_lock(wait, None).await? {
                guard.unlock().await?;
            }
            if let Some(guard) = rw.write_lock().try_lock(wait, None).await? {
                guard.unlock().await?;
            }
        }
        "semaphore" => {
            let semaphore = client.semaphore(name);
            semaphore.try_set_permits(1).await?;
            if let Some(permit) = semaphore.try_acquire(1, wait).await? {
                permit.release().await?;
            }
        }
        "permit_semaphore" => {
            let permits = client.permit_semaphore(name);
            permits.try_set_permits(1).await?;
            if let Some(permit) = permits.try_acquire(wait, None).await? {
                permit.release().await?;
            }
        }
        "count_down_latch" => {
            let latch = client.count_down_latch(name);
            latch.try_set_count(1).await?;
            latch.count_down().await?;
        }
        "leader_election" => {
            if let Some(term) = client.leader_election(name).try_campaign(wait).await? {
                term.resign().await?;
            }
        }
        // Redlock over the one server: its SET NX PX, extension and release.
        "redlock" => {
            let redlock = fredlock::RedLock::builder(vec![client.clone()], name)
                .lease(Duration::from_secs(5))
                .build()?;
            if let Some(guard) = redlock.try_lock(wait, None).await? {
                guard.unlock().await?;
            }
        }
        "job" => {
            let _ran = client
                .job_lock(name)
                .at_most_for(Duration::from_secs(5))
                .run(async {})
                .await?;
        }
        other => panic!("no writing call for a {other}"),
    }
    Ok(())
}

/// Every primitive's writing calls ([`writing_call`] of each of [`KINDS`]), a MultiLock's and a
/// force unlock's, once each on a name of its own that starts with `tag`, with short waits:
/// what each ended with, by name.
pub async fn writing_calls(client: &LockClient, tag: &str) -> Outcomes {
    let wait = Duration::from_millis(200);
    let mut ended: Outcomes = Vec::new();
    for (kind, suffix) in KINDS {
        let name = format!("{tag}{suffix}");
        let outcome = writing_call(client, kind, &name, wait).await;
        ended.push((name, outcome));
    }
    // A MultiLock over two of the lock's keys, and a force unlock of a lock the client holds.
    let name = format!("{tag}-multi");
    let outcome: fredlock::Result<()> = async {
        let multi = fredlock::MultiLock::new(vec![
            client.lock(format!("{name}-1")),
            client.lock(format!("{name}-2")),
        ])?;
        if let Some(guard) = multi.try_lock(wait, None).await? {
            guard.unlock().await?;
        }
        Ok(())
    }
    .await;
    ended.push((name, outcome));
    let name = format!("{tag}-forced");
    let outcome: fredlock::Result<()> = async {
        let lock = client.lock(&name);
        // Kept until the force unlock has been tried: it is what the force unlock deletes.
        let _guard = lock.try_lock(wait, None).await?;
        lock.force_unlock().await?;
        Ok(())
    }
    .await;
    ended.push((name, outcome));
    ended
}

/// What the force unlocks of the walk end: a hold of each kind, taken before the refusal
/// begins (the walk's writing calls take theirs while it lasts, and a refusal of writes stops
/// them before their force unlock), and kept until it ended.
pub struct Held {
    tag: String,
    guards: Vec<Box<dyn std::any::Any + Send>>,
}

/// The suffixes of [`Held`]'s names, after the tag (a job lock's key is `job-lock:default:`
/// and its name).
pub const HELD: [&str; 7] = [
    "-force-lock",
    "-force-fair",
    "-force-fenced",
    "-force-rw",
    "-force-leader",
    "-force-job",
    "-force-by-name",
];

impl Held {
    /// One hold of each kind whose force unlock is its own script: the lock, the fair lock,
    /// the fenced lock, the read-write lock, the election, the job lock (kept after its run),
    /// and a lock ended by name (which reads the layout first).
    pub async fn take(client: &LockClient, tag: &str) -> Held {
        let name = |end: &str| format!("{tag}{end}");
        let [lock, fair, fenced, rw, leader, job, by_name] = HELD.map(name);
        let guards: Vec<Box<dyn std::any::Any + Send>> = vec![
            Box::new(client.lock(lock).lock().await.expect("free")),
            Box::new(client.fair_lock(fair).lock().await.expect("free")),
            Box::new(client.fenced_lock(fenced).lock().await.expect("free")),
            Box::new(client.rw_lock(rw).read_lock().lock().await.expect("free")),
            Box::new(
                client
                    .leader_election(leader)
                    .campaign()
                    .await
                    .expect("free"),
            ),
            Box::new(client.lock(by_name).lock().await.expect("free")),
        ];
        let _ran = client
            .job_lock(job)
            .at_most_for(Duration::from_secs(30))
            .at_least_for(Duration::from_secs(30))
            .run(async {})
            .await
            .expect("the job runs");
        Held {
            tag: tag.to_string(),
            guards,
        }
    }

    /// Each one force-unlocked: what each ended with, by name.
    pub async fn force_unlock(&self, client: &LockClient) -> Outcomes {
        let name = |end: &str| format!("{}{end}", self.tag);
        let [lock, fair, fenced, rw, leader, job, by_name] = HELD.map(name);
        vec![
            (
                lock.clone(),
                client.lock(lock).force_unlock().await.map(drop),
            ),
            (
                fair.clone(),
                client.fair_lock(fair).force_unlock().await.map(drop),
            ),
            (
                fenced.clone(),
                client.fenced_lock(fenced).force_unlock().await.map(drop),
            ),
            (
                rw.clone(),
                client.rw_lock(rw).force_unlock().await.map(drop),
            ),
            (
                leader.clone(),
                client
                    .leader_election(leader)
                    .force_unlock()
                    .await
                    .map(drop),
            ),
            (
                job.clone(),
                client.job_lock(job).force_unlock().await.map(drop),
            ),
            (
                by_name.clone(),
                client.force_unlock(&by_name).await.map(drop),
            ),
        ]
    }
}

/// Asserts that every failed call's error names the lock it was called on, one of `marks` (the
/// refusal's words), and no client library.
pub fn assert_named(outcomes: &Outcomes, marks: &[&str], prefix: &str, what: &str) {
    for (name, outcome) in outcomes {
        if let Err(error) = outcome {
            let shown = error.to_string();
            // A job lock's key is `job-lock:default:` and its name, after the prefix.
            assert!(
                shown.contains(name) && shown.contains(&format!("\"{prefix}")),
                "{what}: {name}'s error does not name it: {shown}"
            );
            assert!(
                marks.is_empty() || marks.iter().any(|mark| shown.contains(mark)),
                "{what}: {name}'s error does not name the refusal ({marks:?}): {shown}"
            );
            assert_eq!(super::library_word(&shown), None, "{what}: {name}: {shown}");
        }
    }
}

/// How long each refusal lasts: past the 1 s watchdog lease of the holders, so that a holder
/// whose renewals are refused is told of the loss within it.
pub const REFUSAL: Duration = Duration::from_millis(1600);

/// How long a waiter of the walk waits: past the whole walk (a migration walk's calls each wait
/// up to their 1 s command timeout, about 7 s in all on an idle machine, 13 s seen on a loaded
/// one), so that it is still waiting when its holder lets go at the settle.
const WAITER_WAIT: Duration = Duration::from_secs(40);

/// The words an error of the refusal shows, and whether a call must meet it.
pub enum Marks<'a> {
    /// Every write is refused while it lasts.
    Refused(&'a [&'a str]),
    /// Some calls may not need what is refused; those that do fail naming it.
    MayBeRefused(&'a [&'a str]),
}

/// One holder's hold on `name` (a lock or a fair lock) and one waiter on it, with when the
/// holder was told of a loss and when the waiter won.
struct Contended {
    name: String,
    guard: fredlock::LockGuard,
    lost_at: tokio::task::JoinHandle<Instant>,
    waiter: tokio::task::JoinHandle<(fredlock::Result<Option<fredlock::LockGuard>>, Instant)>,
}

async fn contend(holder: fredlock::Lock, waiter: fredlock::Lock) -> Contended {
    let name = holder.name().to_string();
    let guard = holder.lock().await.expect("the holder takes it");
    let token = guard.cancellation_token();
    let lost_at = tokio::spawn(async move {
        token.cancelled().await;
        Instant::now()
    });
    let waiter = tokio::spawn(async move {
        let won = waiter.try_lock(WAITER_WAIT, None).await;
        (won, Instant::now())
    });
    Contended {
        name,
        guard,
        lost_at,
        waiter,
    }
}

impl Contended {
    /// Once the refusal ended: the holder lets go (or was told of its loss), the waiter wins
    /// only after that, or failed naming the refusal.
    async fn settle(self, marks: &[&str], what: &str) {
        let name = self.name;
        let unlocked_at = Instant::now();
        let lost = self.lost_at.is_finished();
        let _ = self.guard.unlock().await;
        let gone_at = if lost {
            self.lost_at.await.expect("loss watcher")
        } else {
            self.lost_at.abort();
            unlocked_at
        };
        let (won, at) = self.waiter.await.expect("the waiter ends");
        match won {
            Ok(Some(guard)) => {
                assert!(
                    at >= gone_at,
                    "{what}: {name} was given to the waiter {:?} before its holder let go",
                    gone_at - at
                );
                match guard.unlock().await {
                    Ok(_) => {}
                    // Won while the refusal lasted (before the settle began), its hold may have
                    // ended under refused renewals since, as the holder's did (`+hexists` taken
                    // away: the renewal is refused, the lease runs out).
                    Err(fredlock::Error::NotHeld { .. }) if at < unlocked_at => {}
                    Err(error) => panic!("{what}: the waiter on {name} unlocks: {error}"),
                }
            }
            Ok(None) => panic!("{what}: the waiter on {name} was never given it"),
            Err(error) => {
                let shown = error.to_string();
                assert!(shown.contains(&name), "{what}: {name}: {shown}");
                assert!(
                    marks.is_empty() || marks.iter().any(|mark| shown.contains(mark)),
                    "{what}: the waiter on {name} failed without naming the refusal: {shown}"
                );
            }
        }
    }
}

/// The walk every refusal test takes, on `tag`'s names: a lock and a fair lock held by `a` and
/// waited on by `b`, and a hold of each kind for a force unlock ([`Held`]); `refuse` run; every
/// writing call of `a` tried, and every force unlock; the holders left past their
/// lease; then no key of `raws` (every node) newly without a TTL. Then `restore` run, the
/// errors checked against `marks` (at least one call refused, unless `marks` says a refusal may
/// not come: a migration, whose redirections are followed), the holders and waiters settled,
/// and every writing call tried again, each of which must now work. `prefix` is the clients'
/// key prefix.
#[allow(clippy::too_many_arguments)]
pub async fn under_refusal(
    raws: &[Client],
    a: &LockClient,
    b: &LockClient,
    tag: &str,
    prefix: &str,
    marks: Marks<'_>,
    refuse: impl Future<Output = ()>,
    restore: impl Future<Output = ()>,
) {
    let (marks, must_refuse): (&[&str], bool) = match marks {
        Marks::Refused(marks) => (marks, true),
        Marks::MayBeRefused(marks) => (marks, false),
    };
    let locks = contend(a.lock(format!("{tag}-held")), b.lock(format!("{tag}-held"))).await;
    let fair = contend(
        a.fair_lock(format!("{tag}-queued")).into(),
        b.fair_lock(format!("{tag}-queued")).into(),
    )
    .await;
    // The waiters have tried once and wait.
    tokio::time::sleep(Duration::from_millis(150)).await;
    let mut before = Vec::new();
    for raw in raws {
        before.extend(keys_without_ttl(raw).await);
    }
    let held = Held::take(a, tag).await;
    let started = Instant::now();
    refuse.await;
    let mut tried = writing_calls(a, &format!("{tag}-under")).await;
    tried.extend(held.force_unlock(a).await);
    tokio::time::sleep_until(started + REFUSAL).await;
    for raw in raws {
        for key in keys_without_ttl(raw).await {
            assert!(
                before.contains(&key) || kept_without_ttl(&key),
                "{tag}: {key} was left without a TTL"
            );
        }
    }
    restore.await;
    assert!(
        !must_refuse || tried.iter().any(|(_, outcome)| outcome.is_err()),
        "{tag}: nothing was refused"
    );
    assert_named(&tried, marks, prefix, tag);
    locks.settle(marks, tag).await;
    fair.settle(marks, tag).await;
    // A cluster client learns a moved slot from the next call's redirection: redis-rs may give
    // that call up as unreachable ("too many failed write attempts") while it refreshes its
    // slots, so a force unlock that could not reach Redis is tried again, for up to 5 s.
    let caught_up = Instant::now() + Duration::from_secs(5);
    loop {
        let failed: Vec<(String, fredlock::Error)> = held
            .force_unlock(a)
            .await
            .into_iter()
            .filter_map(|(name, outcome)| outcome.err().map(|error| (name, error)))
            .collect();
        match failed.first() {
            None => break,
            Some((_, fredlock::Error::Unavailable { .. })) if Instant::now() < caught_up => {
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Some((name, error)) => {
                panic!("{tag}: once the refusal ended, the force unlock of {name} failed: {error}")
            }
        }
    }
    // Its guards give back what a force unlock left.
    drop(held);
    for (name, outcome) in writing_calls(a, &format!("{tag}-after")).await {
        if let Err(error) = outcome {
            panic!("{tag}: once the refusal ended, {name} failed: {error}");
        }
    }
}

//! Scenario 12: the leader election. How fast leadership changes hands: after a `resign()`,
//! from the call to a waiting candidate's `campaign()` returning, against PING round trips
//! taken between the rounds (5 after each); and after a crash, from a term's last renewal to a
//! candidate leading, in fractions of the lease.

use std::time::Duration;

use fred::prelude::*;
use fredlock::LockClient;
use tokio::time::Instant;

use crate::measure::Summary;
use crate::scenarios::{raw_client, Sizes};
use crate::Row;

const SCENARIO: &str = "12 leader election";

/// The lease of the crashed leaders: short, so that a round takes about this long.
const CRASH_LEASE: Duration = Duration::from_secs(1);

pub async fn leader_election(url: &str, sizes: Sizes) -> Vec<Row> {
    let mut rows = hand_over(url, sizes).await;
    rows.extend(takeover(url, sizes).await);
    rows
}

/// A leader resigns while a candidate of another client waits: from the `resign()` call to the
/// candidate's `campaign()` returning.
async fn hand_over(url: &str, sizes: Sizes) -> Vec<Row> {
    const PINGS_PER_ROUND: usize = 5;
    let leader = LockClient::connect(url).await.expect("connect");
    let candidate = LockClient::connect(url).await.expect("connect");
    let raw = raw_client(url).await;
    let mine = leader.leader_election("bench:leader");
    let theirs = candidate.leader_election("bench:leader");
    let mut hand_overs = Vec::new();
    let mut pings = Vec::new();
    for round in 0..sizes.wakeups + 5 {
        let term = mine.campaign().await.expect("campaign");
        let waiting = {
            let theirs = theirs.clone();
            tokio::spawn(async move {
                let term = theirs.campaign().await.expect("campaign");
                (Instant::now(), term)
            })
        };
        // The candidate subscribed and tried once: it waits for the resignation.
        while candidate.stats().subscriptions == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
        let resigned = Instant::now();
        term.resign().await.expect("resign");
        let (led, next) = waiting.await.expect("candidate");
        next.resign().await.expect("resign");
        for _ in 0..PINGS_PER_ROUND {
            let sent = Instant::now();
            let _: String = raw.ping(None).await.expect("ping");
            if round >= 5 {
                pings.push(sent.elapsed().as_secs_f64() * 1000.0);
            }
        }
        if round >= 5 {
            hand_overs.push(led.saturating_duration_since(resigned).as_secs_f64() * 1000.0);
        }
    }
    leader.shutdown().await;
    candidate.shutdown().await;
    let hand_over = Summary::of(&hand_overs);
    let ping = Summary::of(&pings);
    let ratio = hand_over.median / ping.median;
    vec![
        Row::new(
            SCENARIO,
            "fredlock",
            "hand-over after resign()",
            "ms",
            hand_over,
        ),
        Row::new(SCENARIO, "PING round trip", "median", "ms", ping),
        Row::ratio(SCENARIO, "hand-over / PING round trip", ratio),
    ]
}

/// A leader that stopped renewing (its term written as a crashed leader leaves it, with a
/// lease of [`CRASH_LEASE`]): from that write to a waiting candidate leading, over the lease.
async fn takeover(url: &str, sizes: Sizes) -> Vec<Row> {
    let candidate = LockClient::connect(url).await.expect("connect");
    let raw = raw_client(url).await;
    let election = candidate.leader_election("bench:crashed");
    let mut fractions = Vec::new();
    for _ in 0..sizes.rounds {
        let _: () = raw
            .hset(
                "bench:crashed",
                [
                    ("00000000-0000-4000-8000-000000000000:1", "1"),
                    ("leader:identity", "crashed"),
                    ("leader:epoch", "1"),
                    ("leader:since", "0"),
                ],
            )
            .await
            .expect("hset");
        let _: bool = raw
            .pexpire("bench:crashed", CRASH_LEASE.as_millis() as i64, None)
            .await
            .expect("pexpire");
        let crashed = Instant::now();
        let term = election.campaign().await.expect("campaign");
        fractions.push(crashed.elapsed().as_secs_f64() / CRASH_LEASE.as_secs_f64());
        term.resign().await.expect("resign");
    }
    candidate.shutdown().await;
    vec![Row::new(
        SCENARIO,
        "fredlock",
        "takeover after a crash, in leases",
        "x",
        Summary::of(&fractions),
    )]
}

//! Chaos against a lock server: connection kills and server stalls at random, from a seeded
//! generator so that a run repeats exactly.

use std::collections::HashMap;
use std::time::Duration;

use fred::prelude::*;
use fredlock::CancellationToken;
use tokio::time::Instant;

/// A small deterministic generator: tests repeat exactly.
pub struct Rng(pub u64);

impl Rng {
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// One chaos step against the lock server, chosen at random.
pub async fn chaos_step(raw: &Client, rng: &mut Rng) -> &'static str {
    match rng.below(4) {
        0 => {
            let _ = super::client_kill(raw, "normal").await;
            "kill normal"
        }
        1 => {
            let _ = super::client_kill(raw, "pubsub").await;
            "kill pubsub"
        }
        2 => {
            super::debug_sleep(raw, 0.2).await;
            "sleep"
        }
        _ => "nothing",
    }
}

/// Runs the chaos loop against `raw`'s server until `until` or `stop`; returns the steps taken.
pub async fn chaos(
    raw: Client,
    until: Instant,
    seed: u64,
    stop: CancellationToken,
) -> HashMap<&'static str, u32> {
    let mut rng = Rng(seed);
    let mut steps = HashMap::new();
    while Instant::now() < until && !stop.is_cancelled() {
        tokio::time::sleep(Duration::from_millis(100 + rng.below(200))).await;
        *steps.entry(chaos_step(&raw, &mut rng).await).or_insert(0) += 1;
    }
    steps
}

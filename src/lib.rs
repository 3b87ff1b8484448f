//! Distributed locks on Redis for async Rust, wire compatible with Redisson's `RLock` family.
//!
//! PLACEHOLDER
#![warn(missing_docs)]

mod client;
mod config;
mod error;
mod guard;
mod holds;
mod lock;
mod names;
mod owner;
mod pubsub;
mod releaser;
mod scripts;
mod watchdog;

pub use client::{ClientStats, LockClient};
pub use config::{LockClientBuilder, DEFAULT_COMMAND_TIMEOUT, DEFAULT_WATCHDOG_TIMEOUT};
pub use error::{Error, Result};
pub use guard::LockGuard;
pub use lock::Lock;
pub use owner::OwnerId;

/// The fred types that appear in fredlock's API.
pub use fred;

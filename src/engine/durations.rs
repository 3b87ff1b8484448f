//! Durations at the edge of the API: the range fredlock accepts for leases and timeouts, the
//! conversion to Redis milliseconds, and waits that may be longer than any deadline.

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{Error, Result};

/// The longest lease or timeout fredlock accepts (365 days): leases, the watchdog lease,
/// the queue place, the command timeout, Redlock leases, node timeouts, retry delays and hold
/// limits. Longer values are refused with [`Error::InvalidArgument`] before anything is sent.
///
/// Redis refuses an expiry that overflows its clock, and a value that does not fit its signed
/// milliseconds wraps to a negative TTL, which deletes the key at once; tokio's timers panic on
/// deadlines they cannot represent. A year is far inside all of these, and longer than any lock
/// should live without a renewal. Waits (`try_lock`'s `wait`, `try_acquire`'s, ..) are
/// bounded by it too: a longer one is refused, as a lease is (wait as long as it takes with
/// `lock()` or `acquire`).
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// The shortest lease: Redis counts expiry in whole milliseconds.
pub(crate) const MIN_LEASE: Duration = Duration::from_millis(1);

/// The fixed part of the clock-drift allowance on a lease, as the Redlock algorithm publishes
/// it (`lease * 0.01 + 2 ms`): a fixed lease counts as lost this much early (engine), and a
/// Redlock's validity is cut by it (public as `DRIFT_ALLOWANCE`).
pub(crate) const DRIFT_FIXED: Duration = Duration::from_millis(2);

/// The share of a lease in the same allowance: a [`DRIFT_SHARE`]th, one hundredth (Redlock's
/// `DEFAULT_DRIFT_FACTOR` is its inverse).
pub(crate) const DRIFT_SHARE: u32 = 100;

/// Fails with [`Error::InvalidArgument`] unless `min <= value <= MAX_DURATION`; `what` names the
/// setting and, where there is one, the lock.
pub(crate) fn check(what: impl fmt::Display, value: Duration, min: Duration) -> Result<()> {
    if value < min || value > MAX_DURATION {
        return Err(Error::InvalidArgument(format!(
            "{what} is {}; it must be at least {} and at most {}",
            Shown(value),
            Shown(min),
            Shown(MAX_DURATION)
        )));
    }
    Ok(())
}

/// Fails with [`Error::InvalidArgument`] for a wait over [`MAX_DURATION`] (zero is one
/// attempt); `name` names the primitive.
pub(crate) fn check_wait(name: &str, wait: Duration) -> Result<()> {
    check(format_args!("the wait for {name:?}"), wait, Duration::ZERO)
}

/// The deadline of a wait of `wait` from `start`; `None`, waiting for ever, when no instant can
/// represent it.
pub(crate) fn deadline(start: Instant, wait: Duration) -> Option<Instant> {
    start.checked_add(wait)
}

/// A TTL in whole milliseconds as Redis takes it: at least 1 (a sub-millisecond duration must not
/// become a zero, which `PX` and `PEXPIRE` reject). Callers pass checked durations, so it fits.
pub(crate) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis())
        .unwrap_or(u64::MAX)
        .max(1)
}

/// A duration for a message: whole days when it is one, else Debug form (`1.5s`, `0ns`).
struct Shown(Duration);

impl fmt::Display for Shown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const DAY: u64 = 24 * 60 * 60;
        let Shown(value) = *self;
        if value == Duration::MAX {
            f.write_str("Duration::MAX")
        } else if value.subsec_nanos() == 0 && value.as_secs() >= DAY && value.as_secs() % DAY == 0
        {
            write!(f, "{} days", value.as_secs() / DAY)
        } else {
            write!(f, "{value:?}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_range_values_are_named_with_the_limit() {
        let error = check("the lease of lock \"a\"", Duration::MAX, MIN_LEASE).unwrap_err();
        assert_eq!(
            error.to_string(),
            "invalid argument: the lease of lock \"a\" is Duration::MAX; it must be at least 1ms \
             and at most 365 days"
        );
        let error = check("x", Duration::ZERO, MIN_LEASE).unwrap_err();
        assert!(error.to_string().contains("x is 0ns"), "{error}");
        assert!(check("x", MAX_DURATION, MIN_LEASE).is_ok());
        assert!(check("x", MAX_DURATION + Duration::from_nanos(1), MIN_LEASE).is_err());
        assert!(check("x", Duration::from_nanos(999_999), MIN_LEASE).is_err());
    }

    #[test]
    fn waits_beyond_any_instant_are_for_ever() {
        let now = Instant::now();
        assert_eq!(deadline(now, Duration::MAX), None);
        assert_eq!(
            deadline(now, Duration::from_secs(1)),
            Some(now + Duration::from_secs(1))
        );
    }
}

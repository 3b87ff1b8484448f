//! ShedLock's wire formats: the ISO-8601 instants it writes in a job's value.

use super::*;

/// The length of what [`push_iso_utc`] writes for a year of four digits.
pub(super) const ISO_LEN: usize = "2026-11-26T02:30:00.000Z".len();

/// Appends `at` as ISO-8601 in UTC with milliseconds, as ShedLock writes it
/// (`Instant.toString()`), digit by digit: a job's every run writes one into its value, and
/// `format!`'s machinery took about 3 000 instructions a run (callgrind, bench scenario 8),
/// most of the run's own cost.
pub(super) fn push_iso_utc(out: &mut String, at: SystemTime) {
    let ms = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as i64);
    let (days, ms) = (ms.div_euclid(86_400_000), ms.rem_euclid(86_400_000));
    let (year, month, day) = civil_from_days(days);
    let digits = |out: &mut String, value: i64, width: u32| {
        for place in (0..width).rev() {
            let digit = (value / 10_i64.pow(place)).rem_euclid(10) as u8;
            out.push(char::from(b'0' + digit));
        }
    };
    if (0..10_000).contains(&year) {
        digits(out, year, 4);
    } else {
        // Beyond four digits (no clock of a running job): as `format!` wrote it.
        out.push_str(&format!("{year:04}"));
    }
    for (separator, value, width) in [
        ('-', i64::from(month), 2),
        ('-', i64::from(day), 2),
        ('T', ms / 3_600_000, 2),
        (':', ms / 60_000 % 60, 2),
        (':', ms / 1000 % 60, 2),
        ('.', ms % 1000, 3),
    ] {
        out.push(separator);
        digits(out, value, width);
    }
    out.push('Z');
}

/// Appends `n` in decimal.
pub(super) fn push_decimal(out: &mut String, n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut rest = n;
    loop {
        at -= 1;
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    for &digit in &digits[at..] {
        out.push(char::from(digit));
    }
}

/// An ISO-8601 UTC instant (`2026-11-26T02:30:00Z`, with any fraction of a second), as ShedLock
/// and [`push_iso_utc`] write them.
pub(super) fn parse_iso(text: &str) -> Option<SystemTime> {
    let text = text.strip_suffix('Z')?;
    let (date, time) = text.split_once('T')?;
    let mut date = date.splitn(3, '-').map(str::parse::<i64>);
    let (year, month, day) = (date.next()?.ok()?, date.next()?.ok()?, date.next()?.ok()?);
    let (clock, fraction) = time.split_once('.').unwrap_or((time, ""));
    let mut clock = clock.splitn(3, ':').map(str::parse::<i64>);
    let (hour, minute, second) = (
        clock.next()?.ok()?,
        clock.next()?.ok()?,
        clock.next()?.ok()?,
    );
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 {
        return None;
    }
    let nanos = if fraction.is_empty() {
        0
    } else {
        let digits: String = fraction
            .chars()
            .chain("000000000".chars())
            .take(9)
            .collect();
        digits.parse::<u32>().ok()?
    };
    let seconds = days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second;
    let seconds = u64::try_from(seconds).ok()?;
    Some(SystemTime::UNIX_EPOCH + Duration::new(seconds, nanos))
}

/// The civil date of `days` since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Days since 1970-01-01 of a civil date (the inverse of [`civil_from_days`]).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let yoe = year.rem_euclid(400);
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iso_utc(at: SystemTime) -> String {
        let mut text = String::with_capacity(ISO_LEN);
        push_iso_utc(&mut text, at);
        text
    }

    #[test]
    fn iso_times_round_trip_and_read_shedlocks() {
        for ms in [0u64, 951_782_400_000, 1_795_000_000_123, 4_107_542_399_999] {
            let at = SystemTime::UNIX_EPOCH + Duration::from_millis(ms);
            assert_eq!(parse_iso(&iso_utc(at)), Some(at), "{}", iso_utc(at));
        }
        assert_eq!(
            iso_utc(SystemTime::UNIX_EPOCH + Duration::from_millis(951_782_400_000)),
            "2000-02-29T00:00:00.000Z"
        );
        // ShedLock's `Instant.toString()`: no fraction when it is zero, up to nine digits.
        let at = parse_iso("2026-11-26T02:30:00Z").unwrap();
        assert_eq!(iso_utc(at), "2026-11-26T02:30:00.000Z");
        let at = parse_iso("2026-11-26T02:30:00.123456789Z").unwrap();
        assert_eq!(iso_utc(at), "2026-11-26T02:30:00.123Z");
        assert_eq!(parse_iso("2026-13-01T00:00:00Z"), None);
        assert_eq!(parse_iso("yesterday"), None);
    }

    #[test]
    fn instants_and_numbers_written_by_hand_read_as_format_writes_them() {
        let by_format = |ms: i64| {
            let (days, ms) = (ms.div_euclid(86_400_000), ms.rem_euclid(86_400_000));
            let (year, month, day) = civil_from_days(days);
            format!(
                "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
                ms / 3_600_000,
                ms / 60_000 % 60,
                ms / 1000 % 60,
                ms % 1000
            )
        };
        // Every part's carries: the epoch, leap days, the turn of centuries and of a year, up
        // to the last instant of year 9999, then beyond four digits.
        let mut instants = vec![0, 951_782_400_000, 4_107_542_399_999, 253_402_300_799_999];
        instants.extend((0..5_000).map(|i: i64| i * 50_636_731_117 % 253_402_300_800_000));
        instants.push(253_402_300_800_000);
        for ms in instants {
            let at = SystemTime::UNIX_EPOCH + Duration::from_millis(ms as u64);
            assert_eq!(iso_utc(at), by_format(ms), "at {ms} ms");
        }
        for n in [0, 7, 10, 99, 1_000, 123_456_789, u64::MAX] {
            let mut text = String::new();
            push_decimal(&mut text, n);
            assert_eq!(text, n.to_string());
        }
    }

    #[test]
    fn a_holder_reads_shedlocks_value_and_fredlocks() {
        let shedlock = JobHolder {
            value: "ADDED:2026-11-26T02:30:00.5Z@billing-7:1b4e28ba-2fa1-11d2-883f-0016d3cca427"
                .into(),
            remaining: None,
        };
        assert_eq!(shedlock.host(), Some("billing-7"));
        assert_eq!(shedlock.locked_at(), parse_iso("2026-11-26T02:30:00.500Z"));
        let ours = JobHolder {
            value: "ADDED:2026-11-26T02:30:00.000Z@pod-1:1b4e28ba-2fa1-11d2-883f-0016d3cca427:7"
                .into(),
            remaining: None,
        };
        assert_eq!(ours.host(), Some("pod-1"));
        let foreign = JobHolder {
            value: "something else".into(),
            remaining: None,
        };
        assert_eq!((foreign.host(), foreign.locked_at()), (None, None));
    }
}

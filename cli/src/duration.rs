//! Durations on the command line.

use std::time::Duration;

/// The longest duration any option takes: a year.
const LONGEST: Duration = Duration::from_secs(366 * 24 * 3600);

/// A moment as people write it: an RFC 3339 time (`2026-12-03T09:00:00Z`,
/// `2026-12-03T10:00:00+01:00`) or `+DURATION` from now (`+10m`, `+2h`);
/// in epoch seconds, `now` given. Both forms take the same range: from now
/// to a year from now.
pub(crate) fn parse_moment(raw: &str, now: i64) -> Result<i64, String> {
    let text = raw.trim();
    if let Some(after) = text.strip_prefix('+') {
        let wait = parse_duration(after)?;
        let seconds = i64::try_from(wait.as_secs()).unwrap_or(i64::MAX);
        return Ok(now.saturating_add(seconds));
    }
    let at = text
        .parse::<jiff::Timestamp>()
        .map(|time| time.as_second())
        .map_err(|_| {
            format!(
                "{raw:?} is not a time: use RFC 3339 (2026-12-03T09:00:00Z) or +DURATION from now (+10m, +2h)"
            )
        })?;
    let latest = now.saturating_add(i64::try_from(LONGEST.as_secs()).unwrap_or(i64::MAX));
    if at < now {
        return Err(format!("{raw:?} is in the past: give a time from now on"));
    }
    if at > latest {
        return Err(format!(
            "{raw:?} is too far: at most {} days from now",
            LONGEST.as_secs() / 86_400
        ));
    }
    Ok(at)
}

/// Parses a duration: seconds (`90`, `0.5`) or a number with a unit (`90s`,
/// `30m`, `2h`, `1d`, `2w`). Negative, non-finite and absurd values (over a
/// year) are refused with a message that says what is accepted.
pub(crate) fn parse_duration(raw: &str) -> Result<Duration, String> {
    let text = raw.trim();
    let (number, unit) = match text.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((at, _)) => (&text[..at], &text[at..]),
        None => (text, "s"),
    };
    let scale = match unit {
        "ms" => 0.001,
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        "d" => 86_400.0,
        "w" => 604_800.0,
        _ => {
            return Err(format!(
                "{raw:?} is not a duration: use seconds (90) or a unit (90s, 30m, 2h, 1d, 2w)"
            ));
        }
    };
    let value: f64 = number.trim().parse().map_err(|_| {
        format!("{raw:?} is not a duration: use seconds (90) or a unit (90s, 30m, 2h, 1d, 2w)")
    })?;
    let seconds = value * scale;
    if !seconds.is_finite() || seconds < 0.0 {
        return Err(format!(
            "{raw:?} is not a duration: it must be a finite number, 0 or more"
        ));
    }
    if seconds > LONGEST.as_secs_f64() {
        return Err(format!(
            "{raw:?} is too long: at most {} days",
            LONGEST.as_secs() / 86_400
        ));
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// Parses a duration of at least one second: a limit of 0 would stop
/// everything at once, and is refused as `--ttl 0` is.
pub(crate) fn parse_limit(raw: &str) -> Result<Duration, String> {
    let duration = parse_duration(raw)?;
    if duration < Duration::from_secs(1) {
        return Err(format!("{raw:?} is too short: at least 1 second"));
    }
    Ok(duration)
}

/// Parses a duration of at least one second, as whole seconds.
pub(crate) fn parse_positive_seconds(raw: &str) -> Result<i64, String> {
    let duration = parse_limit(raw)?;
    i64::try_from(duration.as_secs()).map_err(|_| format!("{raw:?} is too long"))
}

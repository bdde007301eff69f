//! Human tables and the stable JSON shapes.

use kanban_core::{EventRecord, RunRecord, TaskRecord};
use serde_json::{Value, json};

/// A task as `--json` prints it.
pub(crate) fn task_json(task: &TaskRecord) -> Value {
    json!({
        "id": task.id,
        "title": task.title,
        "body": task.body,
        "assignee": task.assignee,
        "status": task.status.as_str(),
        "priority": task.priority,
        "created_at": task.created_at,
        "claim_lock": task.claim_lock,
        "claim_expires": task.claim_expires,
        "current_run_id": task.current_run_id,
        "worker_pid": task.worker_pid,
        "goal_mode": task.goal_mode,
        "goal_max_turns": task.goal_max_turns,
        "max_retries": task.max_retries,
        "consecutive_failures": task.consecutive_failures,
        "last_failure_error": task.last_failure_error,
        "not_before": task.not_before,
        "last_heartbeat_at": task.last_heartbeat_at,
        "max_runtime_seconds": task.max_runtime_seconds,
        "result": task.result,
        "held_reason": task.held_reason,
        "every_seconds": task.every_seconds,
    })
}

/// A run as `--json` prints it.
pub(crate) fn run_json(run: &RunRecord) -> Value {
    json!({
        "id": run.id,
        "status": run.status,
        "claim_lock": run.claim_lock,
        "claim_expires": run.claim_expires,
        "worker_pid": run.worker_pid,
        "started_at": run.started_at,
        "ended_at": run.ended_at,
        "outcome": run.outcome,
        "summary": run.summary,
        "error": run.error,
    })
}

/// An event as `--json` prints it.
pub(crate) fn event_json(event: &EventRecord) -> Value {
    json!({
        "id": event.id,
        "task_id": event.task_id,
        "run_id": event.run_id,
        "kind": event.kind,
        "payload": event.payload,
        "created_at": event.created_at,
    })
}

/// Renders rows as a plain, left-aligned table with a header.
pub(crate) fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (index, (cell, width)) in cells.iter().zip(&widths).enumerate() {
            if index + 1 == cells.len() {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<width$}  "));
            }
        }
        out.trim_end().to_owned()
    };
    let mut out = line(header.to_vec());
    out.push('\n');
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
        out.push('\n');
    }
    out
}

/// Shortens text to one line of at most `limit` characters.
pub(crate) fn short(text: &str, limit: usize) -> String {
    let flat = text.replace('\n', " ");
    if flat.chars().count() <= limit {
        return flat;
    }
    let mut out: String = flat.chars().take(limit.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// `epoch` as a UTC date and time: `2026-12-02 20:49:03Z`.
pub(crate) fn utc_time(epoch: i64) -> String {
    let days = epoch.div_euclid(86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {}Z", time_of_day(epoch))
}

/// The UTC time of day of `epoch`: `20:49:03`.
pub(crate) fn time_of_day(epoch: i64) -> String {
    let second = epoch.rem_euclid(86_400);
    format!(
        "{:02}:{:02}:{:02}",
        second / 3600,
        second % 3600 / 60,
        second % 60
    )
}

/// When a card held back after a failure may be claimed again, if later
/// than `now`: `retry at 2026-12-02 20:49:03Z (in 9m 58s)`.
/// The provider walls as a table: scope, kind, state, hits, who hit it last.
pub(crate) fn walls_table(walls: &[kanban_core::walls::Wall], now: i64) -> String {
    let rows: Vec<Vec<String>> = walls
        .iter()
        .map(|wall| {
            let state = match (wall.probe_run, wall.until > now) {
                (_, true) => format!(
                    "holds until {} (in {})",
                    utc_time(wall.until),
                    span(wall.until - now)
                ),
                (Some(run), false) => format!("probing with run {run}"),
                (None, false) => "reset: the next card is its probe".to_owned(),
            };
            vec![
                short(&wall.scope, 60),
                wall.kind.as_str().to_owned(),
                state,
                wall.hits.to_string(),
                format!(
                    "{} via {}: {}",
                    wall.source,
                    wall.route,
                    short(&wall.reason, 40)
                ),
            ]
        })
        .collect();
    table(&["SCOPE", "WALL", "STATE", "HITS", "LAST HIT"], &rows)
}

/// A wait in seconds as people read it: `42s`, `3m 5s`, `2h 10m`.
fn span(wait: i64) -> String {
    match wait {
        ..60 => format!("{wait}s"),
        60..3600 => format!("{}m {}s", wait / 60, wait % 60),
        _ => format!("{}h {}m", wait / 3600, wait % 3600 / 60),
    }
}

pub(crate) fn retry_note(not_before: Option<i64>, now: i64) -> Option<String> {
    let at = not_before.filter(|at| *at > now)?;
    Some(format!("retry at {} (in {})", utc_time(at), span(at - now)))
}

#[cfg(test)]
mod tests {
    use super::{retry_note, utc_time};

    #[test]
    fn utc_times_match_the_calendar() {
        for (epoch, expected) in [
            (0, "1970-01-01 00:00:00Z"),
            (951_782_400, "2000-02-29 00:00:00Z"),
            (1_796_244_201, "2026-12-02 20:43:21Z"),
            (-1, "1969-12-31 23:59:59Z"),
            (253_402_300_799, "9999-12-31 23:59:59Z"),
        ] {
            assert_eq!(utc_time(epoch), expected);
        }
        // No panic at the ends of the range.
        utc_time(i64::MIN / 2);
        utc_time(i64::MAX / 2);
    }

    #[test]
    fn a_retry_note_only_for_a_wait_still_ahead() {
        assert_eq!(retry_note(None, 100), None);
        assert_eq!(retry_note(Some(100), 100), None);
        assert_eq!(
            retry_note(Some(101), 100).as_deref(),
            Some("retry at 1970-01-01 00:01:41Z (in 1s)")
        );
        assert_eq!(
            retry_note(Some(100 + 598), 100).as_deref(),
            Some("retry at 1970-01-01 00:11:38Z (in 9m 58s)")
        );
        assert_eq!(
            retry_note(Some(100 + 7260), 100).as_deref(),
            Some("retry at 1970-01-01 02:02:40Z (in 2h 1m)")
        );
    }
}

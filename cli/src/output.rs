//! Human tables and the stable JSON shapes.

use kanban_core::{EventRecord, RunRecord, TaskRecord};
use serde_json::{Value, json};

/// A task as `--json` prints it. The workspace fields are there only for a
/// card with a workspace other than its own scratch folder: most cards
/// have none, and a page of a thousand would carry them for nothing.
pub(crate) fn task_json(task: &TaskRecord) -> Value {
    let mut shown = json!({
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
        "block_kind": task.block_kind,
        "created_by": task.created_by,
        "tenant": task.tenant,
    });
    let scratch = task.workspace.is_none();
    let has_one = !scratch;
    if has_one && let Value::Object(fields) = &mut shown {
        fields.insert("workspace_kind".to_owned(), task.workspace_kind().into());
        fields.insert("workspace_path".to_owned(), task.workspace_path().into());
        fields.insert("branch_name".to_owned(), task.branch_name().into());
    }
    shown
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
        "metadata": run.metadata,
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

/// Text from a board or an agent as a terminal may show it: every control
/// character but a line break and a tab (ESC, which starts the sequences
/// that move the cursor, retitle the window or write the clipboard, among
/// them) is written as its escape, `\u{1b}`, never sent as itself.
pub(crate) fn visible(text: &str) -> std::borrow::Cow<'_, str> {
    escaped(text, |c| c.is_control() && c != '\n' && c != '\t')
}

/// [`visible`] on one line: line breaks and tabs are escaped too.
pub(crate) fn visible_line(text: &str) -> std::borrow::Cow<'_, str> {
    escaped(text, char::is_control)
}

fn escaped(text: &str, escape: impl Fn(char) -> bool) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(&escape) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if escape(c) {
            out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Renders rows as a plain, left-aligned table with a header: columns two
/// spaces apart, no borders, no trailing blanks (grep and awk read it).
/// A cell is one line of visible text.
pub(crate) fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut table = comfy_table::Table::new();
    table
        .load_preset(comfy_table::presets::NOTHING)
        .set_content_arrangement(comfy_table::ContentArrangement::Disabled)
        .set_header(header.to_vec());
    for row in rows {
        table.add_row(row.iter().map(|cell| visible_line(cell).into_owned()));
    }
    for column in table.column_iter_mut() {
        column.set_padding((0, 2));
    }
    let mut out = String::new();
    for line in table.lines() {
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// Shortens text to one visible line of at most `limit` characters.
pub(crate) fn short(text: &str, limit: usize) -> String {
    let flat = visible_line(&text.replace(['\n', '\t'], " ")).into_owned();
    if flat.chars().count() <= limit {
        return flat;
    }
    let mut out: String = flat.chars().take(limit.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// Times for people are in the local time zone unless `--utc` says UTC;
/// set once, at start-up, by the binary.
static UTC: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Prints human times in UTC from now on (`--utc`).
pub(crate) fn use_utc(utc: bool) {
    UTC.store(utc, std::sync::atomic::Ordering::Relaxed);
}

fn zone() -> jiff::tz::TimeZone {
    if UTC.load(std::sync::atomic::Ordering::Relaxed) {
        jiff::tz::TimeZone::UTC
    } else {
        // No zone configured, or one that cannot be read: UTC, said as such.
        jiff::tz::TimeZone::try_system().unwrap_or(jiff::tz::TimeZone::UTC)
    }
}

/// `epoch` as a date and time in `zone`: `2026-12-02 20:49:03 UTC`; an
/// epoch out of range prints as the number it is.
fn clock_time(epoch: i64, zone: jiff::tz::TimeZone) -> String {
    match jiff::Timestamp::from_second(epoch) {
        Ok(at) => at
            .to_zoned(zone)
            .strftime("%Y-%m-%d %H:%M:%S %Z")
            .to_string(),
        Err(_) => format!("@{epoch}"),
    }
}

/// `epoch` in UTC: `2026-12-02 20:49:03 UTC`.
#[cfg(test)]
fn utc_time(epoch: i64) -> String {
    clock_time(epoch, jiff::tz::TimeZone::UTC)
}

/// `epoch` for people: local time (UTC with `--utc`) and how far from now:
/// `2026-12-02 21:49:03 CET (5m ago)`.
pub(crate) fn human_time(epoch: i64, now: i64) -> String {
    let when = clock_time(epoch, zone());
    match now - epoch {
        0 => format!("{when} (now)"),
        ago if ago > 0 => format!("{when} ({} ago)", span(ago)),
        ahead => format!("{when} (in {})", span(-ahead)),
    }
}

/// The UTC time of day now, to the millisecond: `20:49:03.125` (the
/// dispatcher's lines; a benchmark reads spawn and booking times from them).
pub(crate) fn time_of_day_now() -> String {
    jiff::Timestamp::now().strftime("%H:%M:%S%.3f").to_string()
}

/// Whether `task_id`'s card met `wall` last (a wall names the card and
/// run that hit it: `TASK#RUN`).
pub(crate) fn wall_met_by(wall: &kanban_core::walls::Wall, task_id: &str) -> bool {
    wall.source
        .strip_prefix(task_id)
        .is_some_and(|rest| rest.starts_with('#'))
}

/// The provider walls as a table: scope, kind, state, hits, who hit it last.
pub(crate) fn walls_table(walls: &[kanban_core::walls::Wall], now: i64) -> String {
    let rows: Vec<Vec<String>> = walls
        .iter()
        .map(|wall| {
            let state = match (wall.probe_run, wall.until > now) {
                (_, true) => format!("holds until {}", human_time(wall.until, now)),
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

/// Payload fields written for machines: claim locks name a host and a
/// process, seals sign a worker's trailer.
const MACHINE_FIELDS: [&str; 5] = ["claim_lock", "lock", "prev_lock", "stale_lock", "seal"];

/// An event as people read it: its kind in words, then its payload's
/// fields (`completed: wrote the notes`, `spawned: pid 31626`), times as
/// times, without what is written for machines; at most `limit` characters.
pub(crate) fn event_words(event: &EventRecord, now: i64, limit: usize) -> String {
    let kind = event.kind.replace('_', " ");
    let fields = match &event.payload {
        Value::Object(map) => map
            .iter()
            .filter(|(key, value)| !MACHINE_FIELDS.contains(&key.as_str()) && !value.is_null())
            .map(|(key, value)| match (key.as_str(), value.as_i64()) {
                ("expires" | "until" | "claim_expires", Some(at)) => {
                    format!("{} {}", key.replace('_', " "), human_time(at, now))
                }
                ("reason" | "summary" | "note" | "output", _) => value_words(value),
                _ => format!("{} {}", key.replace('_', " "), value_words(value)),
            })
            .collect::<Vec<_>>()
            .join(", "),
        Value::Null => String::new(),
        other => value_words(other),
    };
    let words = if fields.is_empty() {
        kind
    } else {
        format!("{kind}: {fields}")
    };
    short(&words, limit)
}

/// A JSON value in words: a string as itself, a list joined, the rest as
/// JSON.
fn value_words(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        Value::Array(items) => items.iter().map(value_words).collect::<Vec<_>>().join(", "),
        other => other.to_string(),
    }
}

/// A span in seconds as people read it, in its two largest units, a zero
/// second unit left out: `42s`, `3m 5s`, `2h`, `2h 10m`, `7d`, `1d 2h`.
pub(crate) fn span(seconds: i64) -> String {
    let (large, unit, small, small_unit) = match seconds {
        ..60 => return format!("{seconds}s"),
        60..3600 => (seconds / 60, "m", seconds % 60, "s"),
        3600..86_400 => (seconds / 3600, "h", seconds % 3600 / 60, "m"),
        _ => (seconds / 86_400, "d", seconds % 86_400 / 3600, "h"),
    };
    if small == 0 {
        format!("{large}{unit}")
    } else {
        format!("{large}{unit} {small}{small_unit}")
    }
}

/// When a card that waits may be claimed, if later than `now`: after a
/// failure, `retry at 2026-12-02 20:49:03 UTC (in 9m 58s)`; otherwise (a
/// card due later, the next of a recurring one) `waits until …`.
pub(crate) fn wait_note(not_before: Option<i64>, failed: bool, now: i64) -> Option<String> {
    let at = not_before.filter(|at| *at > now)?;
    let words = if failed { "retry at" } else { "waits until" };
    Some(format!("{words} {}", human_time(at, now)))
}

#[cfg(test)]
mod tests {
    use super::{human_time, short, table, use_utc, utc_time, visible, visible_line, wait_note};

    #[test]
    fn text_from_a_board_cannot_drive_the_terminal() {
        let hostile = "title\u{1b}]0;owned\u{7}\u{1b}[2J\u{9b}31m\r\nnext\tcol";
        assert_eq!(
            visible(hostile),
            "title\\u{1b}]0;owned\\u{7}\\u{1b}[2J\\u{9b}31m\\u{d}\nnext\tcol"
        );
        assert_eq!(
            visible_line(hostile),
            "title\\u{1b}]0;owned\\u{7}\\u{1b}[2J\\u{9b}31m\\u{d}\\u{a}next\\u{9}col"
        );
        assert!(matches!(
            visible("plain é text\n"),
            std::borrow::Cow::Borrowed(_)
        ));
        assert!(!short(hostile, 200).chars().any(char::is_control));
        let rendered = table(&["A"], &[vec![hostile.to_owned()]]);
        assert!(
            !rendered.chars().any(|c| c.is_control() && c != '\n'),
            "{rendered:?}"
        );
        assert_eq!(rendered.lines().count(), 2, "one line a row: {rendered:?}");
    }

    #[test]
    fn utc_times_match_the_calendar() {
        for (epoch, expected) in [
            (0, "1970-01-01 00:00:00 UTC"),
            (951_782_400, "2000-02-29 00:00:00 UTC"),
            (1_796_244_201, "2026-12-02 20:43:21 UTC"),
            (-1, "1969-12-31 23:59:59 UTC"),
            (253_402_207_200, "9999-12-30 22:00:00 UTC"),
            // jiff's range ends a day before the year does.
            (253_402_300_799, "@253402300799"),
        ] {
            assert_eq!(utc_time(epoch), expected);
        }
        // Out of range: the number, no panic.
        assert_eq!(utc_time(i64::MAX / 2), format!("@{}", i64::MAX / 2));
        assert_eq!(utc_time(i64::MIN), format!("@{}", i64::MIN));
    }

    #[test]
    fn human_times_say_how_far_from_now() {
        use_utc(true);
        assert_eq!(human_time(100, 100), "1970-01-01 00:01:40 UTC (now)");
        assert_eq!(human_time(40, 100), "1970-01-01 00:00:40 UTC (1m ago)");
        assert_eq!(
            human_time(100 + 90_000, 100),
            "1970-01-02 01:01:40 UTC (in 1d 1h)"
        );
        assert_eq!(wait_note(None, true, 100), None);
        assert_eq!(wait_note(Some(100), true, 100), None);
        assert_eq!(
            wait_note(Some(101), true, 100).as_deref(),
            Some("retry at 1970-01-01 00:01:41 UTC (in 1s)")
        );
        assert_eq!(
            wait_note(Some(100 + 598), true, 100).as_deref(),
            Some("retry at 1970-01-01 00:11:38 UTC (in 9m 58s)")
        );
        assert_eq!(
            wait_note(Some(100 + 7260), false, 100).as_deref(),
            Some("waits until 1970-01-01 02:02:40 UTC (in 2h 1m)")
        );
    }

    #[test]
    fn an_event_reads_in_words_without_what_is_for_machines() {
        use serde_json::{Value, json};
        use_utc(true);
        let event = |kind: &str, payload: Value| kanban_core::EventRecord {
            id: 1,
            task_id: "t_1".to_owned(),
            run_id: Some(2),
            kind: kind.to_owned(),
            payload,
            created_at: 0,
        };
        let said = |kind, payload| super::event_words(&event(kind, payload), 100, 80);
        assert_eq!(
            said("completed", json!({"summary": "wrote it"})),
            "completed: wrote it"
        );
        assert_eq!(
            said(
                "claimed",
                json!({"claim_lock": "host:42:9f8e", "expires": 700})
            ),
            "claimed: expires 1970-01-01 00:11:40 UTC (in 10m)"
        );
        assert_eq!(
            said(
                "created",
                json!({"status": "todo", "parents": ["t_a", "t_b"], "assignee": null})
            ),
            "created: parents t_a, t_b, status todo"
        );
        assert_eq!(said("promoted", Value::Null), "promoted");
        assert_eq!(said("heartbeat", json!(3)), "heartbeat: 3");
        assert_eq!(
            said("blocked", json!({"reason": "x".repeat(200)}))
                .chars()
                .count(),
            80
        );
    }

    #[test]
    fn spans_read_in_their_two_largest_units() {
        for (seconds, read) in [
            (0, "0s"),
            (59, "59s"),
            (60, "1m"),
            (185, "3m 5s"),
            (7200, "2h"),
            (7500, "2h 5m"),
            (86_399, "23h 59m"),
            (604_800, "7d"),
            (604_764, "6d 23h"),
            (93_600, "1d 2h"),
        ] {
            assert_eq!(super::span(seconds), read, "{seconds}");
        }
    }
}

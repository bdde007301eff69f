//! The reliability invariants, checked from a board file alone: reusable by
//! every storm, kill or soak test.

use std::collections::BTreeMap;
use std::path::Path;

use kanban_core::ExitCode;
use rusqlite::{Connection, OpenFlags};
use serde_json::Value;

/// What a board holds, counted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BoardFigures {
    pub cards: usize,
    pub runs: usize,
    /// Cards per status.
    pub statuses: BTreeMap<String, usize>,
    /// Runs per outcome (`open` for runs still open).
    pub outcomes: BTreeMap<String, usize>,
    /// Worker writes refused by the fence.
    pub stale_writes_rejected: usize,
    /// Exits booked by a dispatcher.
    pub bookings: usize,
}

/// Event kinds that close a run, each written once by the transition that closes it.
const CLOSING_KINDS: [&str; 9] = [
    "completed",
    "blocked",
    "reclaimed",
    "protocol_violation",
    "rate_limited",
    "crashed",
    "terminal_provider",
    "interrupted",
    "stale",
];

/// Event kinds a dispatcher writes when it books a worker's exit.
const BOOKING_KINDS: [&str; 6] = [
    "worker_exited",
    "protocol_violation",
    "rate_limited",
    "crashed",
    "terminal_provider",
    "interrupted",
];

struct Run {
    id: i64,
    task_id: String,
    started_at: i64,
    ended_at: Option<i64>,
    outcome: Option<String>,
}

/// Checks every invariant and returns the figures, or every violation found.
///
/// - each card's status agrees with its runs: a running card has exactly one
///   open run and points at it; any other card has none and a NULL pointer;
///   a done card's last run completed;
/// - no card ever had two open runs at once (its runs do not overlap);
/// - no run was closed twice (at most one closing event per run);
/// - every booking agrees with its worker's own `worker_result`: the same
///   exit code, and a kind that core's table gives that code;
/// - run ids strictly increase per card in claim order.
pub fn check_board_invariants(db: &Path) -> Result<BoardFigures, Vec<String>> {
    let conn = Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_ONLY)
        .map_err(|e| vec![format!("cannot open {}: {e}", db.display())])?;
    let (tasks, runs, events) =
        read_board(&conn).map_err(|e| vec![format!("query failed: {e}")])?;
    let mut problems = Vec::new();
    let mut figures = BoardFigures::default();
    check_cards(&tasks, &runs, &mut figures, &mut problems);
    check_bookings(&events, &mut figures, &mut problems);
    if problems.is_empty() {
        Ok(figures)
    } else {
        Err(problems)
    }
}

/// A card as the checks read it: its id, status and run pointer.
type CardRow = (String, String, Option<i64>);
/// An event as the checks read it: its card, run, kind and payload.
type EventRow = (String, Option<i64>, String, Value);

fn read_board(conn: &Connection) -> rusqlite::Result<(Vec<CardRow>, Vec<Run>, Vec<EventRow>)> {
    let tasks = conn
        .prepare("SELECT id, status, current_run_id FROM tasks")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<Result<_, _>>()?;
    let runs = conn
        .prepare("SELECT id, task_id, started_at, ended_at, outcome FROM task_runs ORDER BY id")?
        .query_map([], |r| {
            Ok(Run {
                id: r.get(0)?,
                task_id: r.get(1)?,
                started_at: r.get(2)?,
                ended_at: r.get(3)?,
                outcome: r.get(4)?,
            })
        })?
        .collect::<Result<_, _>>()?;
    let events = conn
        .prepare("SELECT task_id, run_id, kind, payload FROM task_events ORDER BY id")?
        .query_map([], |r| {
            let payload: Option<String> = r.get(3)?;
            let payload = payload.and_then(|p| serde_json::from_str(&p).ok());
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                payload.unwrap_or(Value::Null),
            ))
        })?
        .collect::<Result<_, _>>()?;
    Ok((tasks, runs, events))
}

/// Each card's status against its runs; runs never overlap.
fn check_cards(
    tasks: &[CardRow],
    runs: &[Run],
    figures: &mut BoardFigures,
    problems: &mut Vec<String>,
) {
    figures.cards = tasks.len();
    figures.runs = runs.len();
    let mut runs_by_task: BTreeMap<&str, Vec<&Run>> = BTreeMap::new();
    for run in runs {
        runs_by_task
            .entry(run.task_id.as_str())
            .or_default()
            .push(run);
        *figures
            .outcomes
            .entry(run.outcome.clone().unwrap_or_else(|| "open".into()))
            .or_default() += 1;
    }
    for (id, status, current) in tasks {
        *figures.statuses.entry(status.clone()).or_default() += 1;
        let own = runs_by_task.get(id.as_str()).cloned().unwrap_or_default();
        let open: Vec<_> = own.iter().filter(|r| r.ended_at.is_none()).collect();
        if status == "running" {
            if open.len() != 1 || *current != open.first().map(|r| r.id) {
                problems.push(format!(
                    "{id}: running with {} open run(s) and run pointer {current:?}",
                    open.len()
                ));
            }
        } else if !open.is_empty() || current.is_some() {
            problems.push(format!(
                "{id}: {status} but {} open run(s), run pointer {current:?}",
                open.len()
            ));
        }
        let last = own.last().and_then(|r| r.outcome.clone());
        if status == "done" && last.as_deref() != Some("completed") {
            problems.push(format!("{id}: done but its last run is {last:?}"));
        }
        for pair in own.windows(2) {
            let (earlier, later) = (pair[0], pair[1]);
            match earlier.ended_at {
                Some(ended) if ended <= later.started_at => {}
                _ => problems.push(format!(
                    "{id}: runs {} and {} were open at the same time",
                    earlier.id, later.id
                )),
            }
        }
    }
}

/// No run closed twice; every booking agrees with its worker's own result
/// and with core's table.
fn check_bookings(events: &[EventRow], figures: &mut BoardFigures, problems: &mut Vec<String>) {
    let mut closings: BTreeMap<i64, usize> = BTreeMap::new();
    let mut results: BTreeMap<i64, i64> = BTreeMap::new();
    let mut bookings: Vec<(i64, &str, &Value)> = Vec::new();
    for (_, run_id, kind, payload) in events {
        if kind == "stale_write_rejected" {
            figures.stale_writes_rejected += 1;
        }
        let Some(run_id) = run_id else { continue };
        // A manual or stale reclaim of a card that a worker is still on is
        // one closing; a booking of that run afterwards is `worker_exited`.
        if CLOSING_KINDS.contains(&kind.as_str()) {
            *closings.entry(*run_id).or_default() += 1;
        }
        if kind == "worker_result"
            && let Some(code) = payload["exit_code"].as_i64()
        {
            results.insert(*run_id, code);
        }
        if BOOKING_KINDS.contains(&kind.as_str()) {
            figures.bookings += 1;
            bookings.push((*run_id, kind, payload));
        }
    }
    for (run_id, count) in &closings {
        if *count > 1 {
            problems.push(format!("run {run_id} was closed {count} times"));
        }
    }
    for (run_id, kind, payload) in bookings {
        let Some(booked) = payload["exit_code"].as_i64() else {
            continue;
        };
        if let Some(own) = results.get(&run_id)
            && *own != booked
        {
            problems.push(format!(
                "run {run_id}: booked exit {booked} but its worker_result says {own}"
            ));
        }
        if !booked_as_the_table_says(kind, booked) {
            problems.push(format!("run {run_id}: exit {booked} booked as {kind}"));
        }
    }
}

/// Whether core's table books the exit code `booked` as `kind`.
fn booked_as_the_table_says(kind: &str, booked: i64) -> bool {
    let exit = i32::try_from(booked).ok().and_then(ExitCode::from_code);
    match kind {
        "worker_exited" => true,
        "protocol_violation" => exit == Some(ExitCode::Success),
        "rate_limited" => exit == Some(ExitCode::TempFail),
        "terminal_provider" => exit == Some(ExitCode::ConfigFail),
        "interrupted" => exit == Some(ExitCode::Interrupted),
        "crashed" => !matches!(
            exit,
            Some(ExitCode::Success | ExitCode::TempFail | ExitCode::ConfigFail)
        ),
        _ => false,
    }
}

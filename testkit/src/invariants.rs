//! The reliability invariants, checked from a board file alone: reusable by
//! every storm, kill or soak test.

use std::collections::BTreeMap;
use std::path::Path;

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
    let mut problems = Vec::new();
    let mut figures = BoardFigures::default();
    let sql = |e: rusqlite::Error| vec![format!("query failed: {e}")];

    let tasks: Vec<(String, String, Option<i64>)> = conn
        .prepare("SELECT id, status, current_run_id FROM tasks")
        .map_err(sql)?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .map_err(sql)?
        .collect::<Result<_, _>>()
        .map_err(sql)?;
    let runs: Vec<Run> = conn
        .prepare("SELECT id, task_id, started_at, ended_at, outcome FROM task_runs ORDER BY id")
        .map_err(sql)?
        .query_map([], |r| {
            Ok(Run {
                id: r.get(0)?,
                task_id: r.get(1)?,
                started_at: r.get(2)?,
                ended_at: r.get(3)?,
                outcome: r.get(4)?,
            })
        })
        .map_err(sql)?
        .collect::<Result<_, _>>()
        .map_err(sql)?;
    let events: Vec<(String, Option<i64>, String, Value)> = conn
        .prepare("SELECT task_id, run_id, kind, payload FROM task_events ORDER BY id")
        .map_err(sql)?
        .query_map([], |r| {
            let payload: Option<String> = r.get(3)?;
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                payload
                    .and_then(|p| serde_json::from_str(&p).ok())
                    .unwrap_or(Value::Null),
            ))
        })
        .map_err(sql)?
        .collect::<Result<_, _>>()
        .map_err(sql)?;

    figures.cards = tasks.len();
    figures.runs = runs.len();
    let mut runs_by_task: BTreeMap<&str, Vec<&Run>> = BTreeMap::new();
    for run in &runs {
        runs_by_task
            .entry(run.task_id.as_str())
            .or_default()
            .push(run);
        *figures
            .outcomes
            .entry(run.outcome.clone().unwrap_or_else(|| "open".into()))
            .or_default() += 1;
    }
    for (id, status, current) in &tasks {
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
        if status == "done" && own.last().and_then(|r| r.outcome.as_deref()) != Some("completed") {
            problems.push(format!(
                "{id}: done but its last run is {:?}",
                own.last().and_then(|r| r.outcome.clone())
            ));
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

    let mut closings: BTreeMap<i64, usize> = BTreeMap::new();
    let mut results: BTreeMap<i64, i64> = BTreeMap::new();
    let mut bookings: Vec<(i64, String, Value)> = Vec::new();
    for (task_id, run_id, kind, payload) in &events {
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
            bookings.push((*run_id, kind.clone(), payload.clone()));
        }
        let _ = task_id;
    }
    for (run_id, count) in &closings {
        if *count > 1 {
            problems.push(format!("run {run_id} was closed {count} times"));
        }
    }
    for (run_id, kind, payload) in &bookings {
        let Some(booked) = payload["exit_code"].as_i64() else {
            continue;
        };
        if let Some(own) = results.get(run_id)
            && *own != booked
        {
            problems.push(format!(
                "run {run_id}: booked exit {booked} but its worker_result says {own}"
            ));
        }
        let consistent = match kind.as_str() {
            "worker_exited" => true,
            "protocol_violation" => booked == 0,
            "rate_limited" => booked == 75,
            "terminal_provider" => booked == 78,
            "interrupted" => booked == 130,
            "crashed" => !matches!(booked, 0 | 75 | 78),
            _ => false,
        };
        if !consistent {
            problems.push(format!("run {run_id}: exit {booked} booked as {kind}"));
        }
    }
    if problems.is_empty() {
        Ok(figures)
    } else {
        Err(problems)
    }
}

//! What is wrong with a card, in the seed system's terms
//! (`hermes_cli/kanban_diagnostics.py` of release 0.19.0): the rules read a
//! card, its events and runs, and decide; the binary reads the board and
//! prints. Its rules are kept with its kinds, severities and thresholds
//! (`repeated_failures`, `repeated_crashes`, `stuck_in_blocked`,
//! `block_unblock_cycling`, `stranded_in_ready`), and three of ours are
//! added: `no_agent_serves`, `stuck_run` and `walled`.

use serde::Serialize;
use serde_json::{Value, json};

use crate::board::{EventRecord, RunRecord, TaskRecord};
use crate::data::TaskStatus;

/// How bad, least first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    Warning,
    Error,
    Critical,
}

impl Severity {
    /// Every severity, least first.
    pub const ALL: [Self; 3] = [Self::Warning, Self::Error, Self::Critical];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Warning => "warning",
            Self::Error => "error",
            Self::Critical => "critical",
        }
    }

    pub fn parse(raw: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|severity| severity.as_str() == raw)
    }
}

/// Something a person can do about a diagnostic.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Action {
    /// `reclaim`, `reassign`, `unblock`, `comment` or `cli_hint`.
    pub kind: &'static str,
    pub label: String,
    pub payload: Value,
    pub suggested: bool,
}

impl Action {
    fn hint(label: &str, command: String, suggested: bool) -> Self {
        Self {
            kind: "cli_hint",
            label: label.to_owned(),
            payload: json!({"command": command}),
            suggested,
        }
    }
}

/// One thing wrong with a card.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Diagnostic {
    pub kind: &'static str,
    pub severity: Severity,
    pub title: String,
    pub detail: String,
    pub actions: Vec<Action>,
    pub first_seen_at: i64,
    pub last_seen_at: i64,
    pub count: u64,
    pub run_id: Option<i64>,
    pub data: Value,
}

/// The thresholds, with the seed system's defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Thresholds {
    /// Failures in a row that make `repeated_failures` (the dispatcher's
    /// failure limit).
    pub failures: u32,
    /// Crashed runs in a row that make `repeated_crashes`.
    pub crashes: u32,
    /// How long a card may stay blocked with nobody answering.
    pub blocked_seconds: i64,
    /// Block-unblock cycles within `cycle_window_seconds`.
    pub cycles: u32,
    pub cycle_window_seconds: i64,
    /// How long an assigned card may wait ready with nobody claiming it.
    pub stranded_seconds: i64,
    /// How long past its lease a running card may go unreclaimed.
    pub lease_grace_seconds: i64,
}

impl Default for Thresholds {
    fn default() -> Self {
        Self {
            failures: crate::DEFAULT_FAILURE_LIMIT,
            crashes: 2,
            blocked_seconds: 24 * 3600,
            cycles: 3,
            cycle_window_seconds: 24 * 3600,
            stranded_seconds: 30 * 60,
            lease_grace_seconds: 60,
        }
    }
}

/// What the rules read of one card.
#[derive(Clone, Copy, Debug)]
pub struct CardFacts<'a> {
    pub task: &'a TaskRecord,
    /// Oldest first.
    pub events: &'a [EventRecord],
    /// Oldest first.
    pub runs: &'a [RunRecord],
    /// Whether an agent serves the card's assignee (`None`: unknown, no
    /// agents file).
    pub served: Option<bool>,
    /// The provider walls the card met that still stand: their scope and
    /// until when.
    pub walls: &'a [(String, i64)],
}

/// One rule: what it finds on a card at a time, if anything.
type Rule = fn(&CardFacts<'_>, i64, &Thresholds) -> Option<Diagnostic>;

/// Every active diagnostic of a card, worst first (then the newest).
pub fn diagnose(facts: &CardFacts<'_>, now: i64, limits: &Thresholds) -> Vec<Diagnostic> {
    let rules: [Rule; 8] = [
        repeated_failures,
        repeated_crashes,
        stuck_in_blocked,
        block_unblock_cycling,
        stranded_in_ready,
        no_agent_serves,
        stuck_run,
        walled,
    ];
    let mut found: Vec<Diagnostic> = rules
        .iter()
        .filter_map(|rule| rule(facts, now, limits))
        .collect();
    found.sort_by(|a, b| {
        b.severity
            .cmp(&a.severity)
            .then(b.last_seen_at.cmp(&a.last_seen_at))
    });
    found
}

/// A span of time in its largest sensible unit: `45s`, `12m`, `3h`, `2d`.
pub fn span(seconds: i64) -> String {
    match seconds {
        s if s < 60 => format!("{}s", s.max(0)),
        s if s < 3600 => format!("{}m", s / 60),
        s if s < 2 * 86_400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

fn status(facts: &CardFacts<'_>) -> Option<TaskStatus> {
    facts.task.status.known()
}

/// A done, archived or running card has no failure streak to show: the
/// first is history, the last a fresh try.
fn settled_or_trying(facts: &CardFacts<'_>) -> bool {
    matches!(
        status(facts),
        Some(TaskStatus::Done | TaskStatus::Archived | TaskStatus::Running)
    )
}

fn first_line(text: &str, limit: usize) -> String {
    text.lines()
        .next()
        .unwrap_or("")
        .chars()
        .take(limit)
        .collect()
}

fn logs_hint(facts: &CardFacts<'_>) -> Action {
    Action::hint(
        "Check its log",
        format!("kanban logs {}", facts.task.id),
        true,
    )
}

fn reassign(facts: &CardFacts<'_>) -> Action {
    Action {
        kind: "reassign",
        label: "Reassign it to another agent".to_owned(),
        payload: json!({"current_assignee": facts.task.assignee}),
        suggested: false,
    }
}

/// The card failed `failures` times in a row: critical at twice that.
fn repeated_failures(facts: &CardFacts<'_>, now: i64, limits: &Thresholds) -> Option<Diagnostic> {
    let failures = facts.task.consecutive_failures;
    if settled_or_trying(facts) || failures < limits.failures.max(1) {
        return None;
    }
    let last_outcome = facts.runs.iter().rev().find_map(|run| {
        run.outcome
            .as_deref()
            .filter(|o| matches!(*o, "timed_out" | "crashed" | "spawn_failed"))
    });
    let error = facts
        .task
        .last_failure_error
        .as_deref()
        .unwrap_or("")
        .trim();
    let title = if error.is_empty() {
        format!("Agent failure x{failures} (no error recorded)")
    } else {
        format!("Agent failure x{failures}: {}", first_line(error, 160))
    };
    Some(Diagnostic {
        kind: "repeated_failures",
        severity: if failures >= limits.failures.max(1).saturating_mul(2) {
            Severity::Critical
        } else {
            Severity::Error
        },
        title,
        detail: format!(
            "It failed {failures} times in a row; a dispatcher blocks it at {} failures. Fix the cause, then unblock or reclaim it.",
            limits.failures
        ),
        actions: vec![logs_hint(facts), reassign(facts)],
        first_seen_at: now,
        last_seen_at: now,
        count: u64::from(failures),
        run_id: None,
        data: json!({"consecutive_failures": failures, "most_recent_outcome": last_outcome, "last_error": facts.task.last_failure_error, "failure_threshold": limits.failures}),
    })
}

/// Its last runs crashed, `crashes` of them in a row (runs with other
/// outcomes between do not break the streak; a completed or reclaimed
/// one does), before the failure count says so.
fn repeated_crashes(facts: &CardFacts<'_>, now: i64, limits: &Thresholds) -> Option<Diagnostic> {
    if settled_or_trying(facts) || facts.task.consecutive_failures >= limits.failures {
        return None;
    }
    let mut crashes = 0_u32;
    let mut last_error = None;
    for run in facts.runs.iter().rev() {
        match run.outcome.as_deref() {
            Some("crashed") => {
                crashes += 1;
                last_error = last_error.or(run.error.clone());
            }
            Some("completed" | "reclaimed") => break,
            _ => {}
        }
    }
    if crashes < limits.crashes.max(1) {
        return None;
    }
    Some(Diagnostic {
        kind: "repeated_crashes",
        severity: if crashes >= limits.crashes.max(1).saturating_mul(2) {
            Severity::Critical
        } else {
            Severity::Error
        },
        title: match &last_error {
            Some(error) => format!("Agent crashed {crashes}x: {}", first_line(error, 160)),
            None => format!("Agent crashed {crashes}x (no error recorded)"),
        },
        detail: format!("Its last {crashes} runs ended crashed."),
        actions: vec![logs_hint(facts), reassign(facts)],
        first_seen_at: now,
        last_seen_at: now,
        count: u64::from(crashes),
        run_id: None,
        data: json!({"consecutive_crashes": crashes, "last_error": last_error}),
    })
}

/// Blocked for a day with no comment or unblock since.
fn stuck_in_blocked(facts: &CardFacts<'_>, now: i64, limits: &Thresholds) -> Option<Diagnostic> {
    if status(facts) != Some(TaskStatus::Blocked) {
        return None;
    }
    let blocked_at = facts
        .events
        .iter()
        .filter(|event| event.kind == "blocked")
        .map(|event| event.created_at)
        .max()?;
    let age = now.saturating_sub(blocked_at);
    let answered = facts.events.iter().any(|event| {
        matches!(event.kind.as_str(), "commented" | "unblocked") && event.created_at > blocked_at
    });
    if age < limits.blocked_seconds || answered {
        return None;
    }
    let hours = age / 3600;
    Some(Diagnostic {
        kind: "stuck_in_blocked",
        severity: Severity::Warning,
        title: format!("Blocked for {hours}h"),
        detail: format!(
            "It was blocked {hours}h ago and nobody has commented or unblocked it since: it waits for a person."
        ),
        actions: vec![Action {
            kind: "comment",
            label: "Answer with a comment, or unblock it".to_owned(),
            payload: json!({}),
            suggested: true,
        }],
        first_seen_at: blocked_at,
        last_seen_at: blocked_at,
        count: 1,
        run_id: None,
        data: json!({"blocked_at": blocked_at, "age_hours": hours}),
    })
}

/// Blocked again after an unblock, `cycles` times within the window: the
/// unblocks do not fix the cause.
fn block_unblock_cycling(
    facts: &CardFacts<'_>,
    now: i64,
    limits: &Thresholds,
) -> Option<Diagnostic> {
    let since = now.saturating_sub(limits.cycle_window_seconds);
    let mut cycles = 0_u32;
    let mut unblocked = false;
    let (mut first, mut last) = (None, 0);
    for event in facts
        .events
        .iter()
        .filter(|event| event.created_at >= since)
    {
        match event.kind.as_str() {
            "blocked" => {
                first = first.or(Some(event.created_at));
                if unblocked {
                    cycles += 1;
                    last = event.created_at;
                    unblocked = false;
                }
            }
            "unblocked" => unblocked = true,
            _ => {}
        }
    }
    if cycles < limits.cycles.max(1) {
        return None;
    }
    Some(Diagnostic {
        kind: "block_unblock_cycling",
        severity: Severity::Warning,
        title: format!(
            "Blocked again after an unblock {cycles}x in {}h",
            limits.cycle_window_seconds / 3600
        ),
        detail: "The unblocks do not reach the cause: read the block reasons and change something else (reassign it, change its scope, archive it).".to_owned(),
        actions: vec![Action::hint(
            "Read its block reasons",
            format!("kanban events {}", facts.task.id),
            true,
        )],
        first_seen_at: first.unwrap_or(now),
        last_seen_at: last,
        count: u64::from(cycles),
        run_id: None,
        data: json!({"cycles": cycles, "window_seconds": limits.cycle_window_seconds}),
    })
}

/// The events after which a card is back in line.
const READY_AGAIN: [&str; 8] = [
    "created",
    "promoted",
    "promoted_manual",
    "reclaimed",
    "unblocked",
    "released",
    "due",
    "wall_lifted",
];

/// Ready, assigned, and claimed by nobody for half an hour: warning, error
/// at twice that, critical at six times.
fn stranded_in_ready(facts: &CardFacts<'_>, now: i64, limits: &Thresholds) -> Option<Diagnostic> {
    let task = facts.task;
    let assigned = task
        .assignee
        .as_deref()
        .is_some_and(|a| !a.trim().is_empty());
    if status(facts) != Some(TaskStatus::Ready) || task.claim_lock.is_some() || !assigned {
        return None;
    }
    // A card a wall holds is not stranded.
    if facts.walls.iter().any(|(_, until)| *until > now) {
        return None;
    }
    // Ready since whatever put it back in line last: an event that says so,
    // or the end of its last run, or its backoff's end (one still to come
    // makes the card too young to be stranded).
    let ready_since = facts
        .events
        .iter()
        .filter(|event| READY_AGAIN.contains(&event.kind.as_str()))
        .map(|event| event.created_at)
        .chain(facts.runs.iter().filter_map(|run| run.ended_at))
        .chain(task.not_before)
        .max()
        .unwrap_or(task.created_at);
    let age = now.saturating_sub(ready_since);
    let threshold = limits.stranded_seconds.max(1);
    if age < threshold {
        return None;
    }
    let severity = if age >= threshold.saturating_mul(6) {
        Severity::Critical
    } else if age >= threshold.saturating_mul(2) {
        Severity::Error
    } else {
        Severity::Warning
    };
    Some(Diagnostic {
        kind: "stranded_in_ready",
        severity,
        title: format!("Ready for {} with no worker", span(age)),
        detail: format!(
            "Nothing has claimed it: is a dispatcher running for this board, and does an agent serve {:?}?",
            task.assignee.as_deref().unwrap_or("")
        ),
        actions: vec![reassign(facts)],
        first_seen_at: ready_since,
        last_seen_at: now,
        count: 1,
        run_id: None,
        data: json!({"ready_since": ready_since, "age_seconds": age}),
    })
}

/// Ready or in review for an assignee no agent of the agents file serves:
/// no dispatcher of this board will ever claim it.
fn no_agent_serves(facts: &CardFacts<'_>, now: i64, _: &Thresholds) -> Option<Diagnostic> {
    let waiting = matches!(status(facts), Some(TaskStatus::Ready | TaskStatus::Review));
    if !waiting || facts.served != Some(false) {
        return None;
    }
    let assignee = facts.task.assignee.clone().unwrap_or_default();
    Some(Diagnostic {
        kind: "no_agent_serves",
        severity: Severity::Error,
        title: format!("No agent serves {assignee:?}"),
        detail: format!(
            "The agents file has no agent named {assignee:?}, so no dispatcher of this board claims the card: add the agent, or reassign the card."
        ),
        actions: vec![reassign(facts)],
        first_seen_at: now,
        last_seen_at: now,
        count: 1,
        run_id: None,
        data: json!({"assignee": assignee}),
    })
}

/// Running on a lease that ran out more than the grace ago: its worker
/// is gone or silent, and no dispatcher has taken the card back.
fn stuck_run(facts: &CardFacts<'_>, now: i64, limits: &Thresholds) -> Option<Diagnostic> {
    if status(facts) != Some(TaskStatus::Running) {
        return None;
    }
    let expired = facts.task.claim_expires?;
    let late = now.saturating_sub(expired);
    if late <= limits.lease_grace_seconds {
        return None;
    }
    Some(Diagnostic {
        kind: "stuck_run",
        severity: Severity::Error,
        title: format!("Its lease ran out {} ago", span(late)),
        detail: "Its worker has not renewed its lease and no dispatcher has reclaimed it: is a dispatcher running for this board? `kanban reclaim` takes it back by hand.".to_owned(),
        actions: vec![
            Action {
                kind: "reclaim",
                label: "Reclaim it".to_owned(),
                payload: json!({}),
                suggested: true,
            },
            logs_hint(facts),
        ],
        first_seen_at: expired,
        last_seen_at: now,
        count: 1,
        run_id: facts.task.current_run_id,
        data: json!({"claim_expires": expired, "late_seconds": late}),
    })
}

/// It met a provider wall that still stands: it and its agent's other
/// cards wait, uncharged.
fn walled(facts: &CardFacts<'_>, now: i64, _: &Thresholds) -> Option<Diagnostic> {
    let (scope, until) = facts
        .walls
        .iter()
        .filter(|(_, until)| *until > now)
        .max_by_key(|(_, until)| *until)?;
    Some(Diagnostic {
        kind: "walled",
        severity: Severity::Warning,
        title: format!("A provider wall holds it for {}", span(until - now)),
        detail: format!(
            "It met the wall on {scope}: its agent's cards wait, uncharged, until the provider's reset; `kanban walls --lift` lifts it by hand."
        ),
        actions: vec![Action::hint(
            "Lift the wall",
            format!("kanban walls --lift '{scope}'"),
            false,
        )],
        first_seen_at: now,
        last_seen_at: *until,
        count: 1,
        run_id: None,
        data: json!({"scope": scope, "until": until}),
    })
}

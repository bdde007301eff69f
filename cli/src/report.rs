//! `kanban stats` and `kanban assignees`: the board in counts, as the seed
//! system's commands of those names count it.

use std::collections::BTreeMap;

use kanban_board_sqlite::SystemClock;
use kanban_core::diagnostics::{CardFacts, Diagnostic, Severity, Thresholds, diagnose};
use kanban_core::{Clock as _, Environment, ExitCode, TaskRecord, TaskStatus};
use serde_json::json;

use crate::agents_file::{agents_file_path, load};
use crate::args::GlobalArgs;
use crate::board_path::open_board_for_reading;
use crate::out::outln;
use crate::output::visible_line;
use crate::runtime::block_on;

/// The lanes the seed system shows, in its order: `stats` prints them and
/// the web board draws them (archived cards are in neither).
pub(crate) const LANES: [TaskStatus; 8] = [
    TaskStatus::Triage,
    TaskStatus::Todo,
    TaskStatus::Scheduled,
    TaskStatus::Ready,
    TaskStatus::Running,
    TaskStatus::Blocked,
    TaskStatus::Review,
    TaskStatus::Done,
];

/// Counts by status of `tasks` that are not archived.
fn counts<'a>(tasks: impl Iterator<Item = &'a TaskRecord>) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for task in tasks.filter(|task| task.status != TaskStatus::Archived) {
        *counts.entry(task.status.as_str().to_owned()).or_insert(0) += 1;
    }
    counts
}

/// `name=N` pairs, or `(idle)`.
fn counts_line(counts: &BTreeMap<String, u64>) -> String {
    if counts.is_empty() {
        return "(idle)".to_owned();
    }
    counts
        .iter()
        .map(|(status, n)| format!("{status}={n}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `kanban stats [--json]`: cards by status and by assignee, and how long
/// the oldest ready card has waited.
pub(crate) fn stats(
    global: &GlobalArgs,
    env: &Environment,
    as_json: bool,
) -> anyhow::Result<ExitCode> {
    let board = open_board_for_reading(global, env)?;
    let tasks = block_on(board.list_tasks(None))?;
    let now = SystemClock.now();
    let by_status = counts(tasks.iter());
    let mut by_assignee: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    for task in &tasks {
        if let Some(assignee) = &task.assignee {
            by_assignee.entry(assignee.clone()).or_default();
        }
    }
    for (assignee, counted) in &mut by_assignee {
        *counted = counts(
            tasks
                .iter()
                .filter(|task| task.assignee.as_deref() == Some(assignee.as_str())),
        );
    }
    by_assignee.retain(|_, counted| !counted.is_empty());
    let oldest_ready = tasks
        .iter()
        .filter(|task| task.status == TaskStatus::Ready)
        .map(|task| task.created_at)
        .min()
        .map(|created| now.saturating_sub(created).max(0));
    if as_json {
        outln!(
            "{}",
            json!({
                "by_status": by_status,
                "by_assignee": by_assignee,
                "oldest_ready_age_seconds": oldest_ready,
                "now": now,
            })
        );
        return Ok(ExitCode::Success);
    }
    outln!("By status:");
    for lane in LANES {
        outln!(
            "  {:<10} {}",
            lane.as_str(),
            by_status.get(lane.as_str()).copied().unwrap_or(0)
        );
    }
    outln!("\nBy assignee:");
    if by_assignee.is_empty() {
        outln!("  (none)");
    }
    for (assignee, counted) in &by_assignee {
        outln!("  {:<20}  {}", visible_line(assignee), counts_line(counted));
    }
    match oldest_ready {
        Some(age) => outln!("\nOldest ready card age: {}", crate::output::span(age)),
        None => outln!("\nNo card is ready"),
    }
    Ok(ExitCode::Success)
}

/// `kanban assignees [--json]`: every name cards are assigned to or an
/// agent of the agents file has, whether an agent serves it, and its cards
/// by status.
pub(crate) fn assignees(
    global: &GlobalArgs,
    env: &Environment,
    as_json: bool,
) -> anyhow::Result<ExitCode> {
    let board = open_board_for_reading(global, env)?;
    let tasks = block_on(board.list_tasks(None))?;
    let served: Vec<String> = match agents_file_path(global.agents.as_deref(), &board.folder) {
        Some(path) => load(&path, env)
            .map_err(anyhow::Error::msg)?
            .agents
            .into_keys()
            .collect(),
        None => Vec::new(),
    };
    let mut names: Vec<String> = tasks
        .iter()
        .filter_map(|task| task.assignee.clone())
        .chain(served.iter().cloned())
        .collect();
    names.sort();
    names.dedup();
    let rows: Vec<(String, bool, BTreeMap<String, u64>)> = names
        .into_iter()
        .map(|name| {
            let counted = counts(
                tasks
                    .iter()
                    .filter(|task| task.assignee.as_deref() == Some(name.as_str())),
            );
            let has_agent = served.contains(&name);
            (name, has_agent, counted)
        })
        .collect();
    if as_json {
        let shown: Vec<_> = rows
            .iter()
            .map(|(name, has_agent, counted)| json!({"name": name, "on_disk": has_agent, "counts": counted}))
            .collect();
        outln!("{}", serde_json::Value::Array(shown));
        return Ok(ExitCode::Success);
    }
    outln!("{:<22}{:<7}COUNTS", "NAME", "AGENT");
    for (name, has_agent, counted) in &rows {
        outln!(
            "{:<22}{:<7}{}",
            visible_line(name),
            if *has_agent { "yes" } else { "no" },
            counts_line(counted)
        );
    }
    Ok(ExitCode::Success)
}

/// `kanban diagnostics [--severity S] [--task ID] [--json]`: what is
/// wrong with the cards that are not done or archived ([`diagnose`]).
pub(crate) fn diagnostics(
    global: &GlobalArgs,
    env: &Environment,
    severity: Option<Severity>,
    task: Option<&str>,
    as_json: bool,
) -> anyhow::Result<ExitCode> {
    let board = open_board_for_reading(global, env)?;
    let tasks = match task {
        Some(given) => {
            let id = crate::admin::card_id(&board, given)?;
            vec![block_on(board.show_task(&id))?.task]
        }
        None => block_on(board.list_tasks(None))?
            .into_iter()
            .filter(|task| {
                !matches!(
                    task.status.known(),
                    Some(TaskStatus::Done | TaskStatus::Archived)
                )
            })
            .collect(),
    };
    let agents = match agents_file_path(global.agents.as_deref(), &board.folder) {
        Some(path) => Some(load(&path, env).map_err(anyhow::Error::msg)?),
        None => None,
    };
    let reports = block_on(diagnose_cards(
        &board,
        &tasks,
        agents.as_ref(),
        SystemClock.now(),
    ))?
    .into_iter()
    .filter_map(|(task, found)| {
        let found: Vec<Diagnostic> = found
            .into_iter()
            .filter(|found| severity.is_none_or(|least| found.severity >= least))
            .collect();
        (!found.is_empty()).then_some((task, found))
    })
    .collect::<Vec<_>>();
    print_diagnostics(&reports, as_json);
    if !as_json && task.is_none() {
        // Notifications no one will get: a board-wide finding, so not in
        // the seed system's per-card JSON. A board from before
        // notifications has none.
        let subscriptions = block_on(board.subscriptions()).unwrap_or_default();
        for sub in subscriptions.iter().filter(|sub| sub.dead > 0) {
            outln!(
                "\n  notifications: {} dead for subscription {} ({} {}): {}; see `kanban notify list`",
                sub.dead,
                sub.id,
                sub.channel,
                kanban_core::notify::shown_address(&sub.channel, &sub.address),
                visible_line(sub.last_error.as_deref().unwrap_or("no error recorded"))
            );
        }
    }
    Ok(ExitCode::Success)
}

/// Each of `tasks` with what `kanban diagnostics` finds on it (none: not
/// listed): whether an agent serves it (when there is an agents file) and
/// the walls it met or its agent's cards wait behind.
pub(crate) async fn diagnose_cards(
    board: &crate::board_path::OpenBoard,
    tasks: &[TaskRecord],
    agents: Option<&crate::agents_file::AgentsFile>,
    now: i64,
) -> Result<Vec<(TaskRecord, Vec<Diagnostic>)>, kanban_core::BoardError> {
    let walls = board.walls().await?;
    let limits = Thresholds::default();
    let mut reports = Vec::new();
    for task in tasks {
        let view = board.show_task(&task.id).await?;
        let served = match (agents, &task.assignee) {
            (Some(file), Some(assignee)) => Some(file.agents.contains_key(assignee)),
            _ => None,
        };
        // The walls it met, and those that hold its agent's cards.
        let route = kanban_core::walls::route_label(task.assignee.as_deref().unwrap_or(""));
        let met: Vec<(String, i64)> = walls
            .iter()
            .filter(|wall| crate::output::wall_met_by(wall, &task.id) || wall.route == route)
            .map(|wall| (wall.scope.clone(), wall.until))
            .collect();
        let facts = CardFacts {
            task: &view.task,
            events: &view.events,
            runs: &view.runs,
            served,
            walls: &met,
        };
        let found = diagnose(&facts, now, &limits);
        if !found.is_empty() {
            reports.push((view.task, found));
        }
    }
    Ok(reports)
}

/// The cards with their diagnostics, as JSON (the seed system's shape) or
/// a list for people.
fn print_diagnostics(reports: &[(TaskRecord, Vec<Diagnostic>)], as_json: bool) {
    if as_json {
        let shown: Vec<_> = reports
            .iter()
            .map(|(task, found)| {
                json!({"task_id": task.id, "title": task.title, "status": task.status.as_str(), "assignee": task.assignee, "diagnostics": found})
            })
            .collect();
        outln!("{}", serde_json::Value::Array(shown));
        return;
    }
    if reports.is_empty() {
        outln!("no diagnostics: nothing on the board needs a person");
        return;
    }
    let count: usize = reports.iter().map(|(_, found)| found.len()).sum();
    outln!(
        "{count} active diagnostic(s) across {} card(s):",
        reports.len()
    );
    for (task, found) in reports {
        outln!(
            "\n  {}  {:<9} @{:<18} {}",
            task.id,
            task.status.as_str(),
            visible_line(task.assignee.as_deref().unwrap_or("-")),
            visible_line(&task.title)
        );
        for diagnostic in found {
            outln!(
                "    [{}] {}: {}",
                diagnostic.severity.as_str(),
                diagnostic.kind,
                visible_line(&diagnostic.title)
            );
            for action in diagnostic
                .actions
                .iter()
                .filter(|action| action.kind == "cli_hint")
            {
                if let Some(command) = action.payload["command"].as_str() {
                    outln!("      → {command}");
                }
            }
        }
    }
}

/// `kanban tail ID [--interval D] [--json]`: a card's events, then each
/// new one as it comes, until interrupted (or the card is pruned).
pub(crate) fn tail(
    global: &GlobalArgs,
    env: &Environment,
    id: &str,
    every: std::time::Duration,
    as_json: bool,
    interrupt: &std::sync::Arc<std::sync::atomic::AtomicUsize>,
) -> anyhow::Result<ExitCode> {
    use std::sync::atomic::Ordering;
    let board = open_board_for_reading(global, env)?;
    let id = crate::admin::card_id(&board, id)?;
    if !as_json {
        crate::out::errln!("following the events of {id}; Ctrl-C stops");
    }
    let every = every.max(std::time::Duration::from_millis(50));
    let mut seen = 0_i64;
    loop {
        if interrupt.load(Ordering::SeqCst) != 0 {
            return Ok(ExitCode::Success);
        }
        let view = match block_on(board.show_task(&id)) {
            Ok(view) => view,
            Err(kanban_core::BoardError::TaskNotFound(_)) => {
                crate::out::errln!("{id} is no longer on the board (pruned)");
                return Ok(ExitCode::Success);
            }
            Err(error) => return Err(error.into()),
        };
        let now = SystemClock.now();
        let since = seen;
        for event in view.events.iter().filter(|event| event.id > since) {
            if as_json {
                outln!("{}", crate::output::event_json(event));
            } else {
                outln!(
                    "[{}] {}",
                    crate::output::human_time(event.created_at, now),
                    crate::output::event_words(event, now, 200)
                );
            }
            seen = seen.max(event.id);
        }
        // Sliced, so an interrupt stops it at once.
        let started = std::time::Instant::now();
        while started.elapsed() < every {
            if interrupt.load(Ordering::SeqCst) != 0 {
                return Ok(ExitCode::Success);
            }
            std::thread::sleep(every.min(std::time::Duration::from_millis(50)));
        }
    }
}

/// `kanban gc [--event-retention-days N] [--log-retention-days N]`: the
/// seed system's clean-up: events older than N days of cards that are
/// done or archived, and worker logs not written for N days.
pub(crate) fn gc(
    global: &GlobalArgs,
    env: &Environment,
    event_days: u32,
    log_days: u32,
) -> anyhow::Result<ExitCode> {
    let board = crate::board_path::open_board(global, env)?;
    let now = SystemClock.now();
    let days = |n: u32| i64::from(n).saturating_mul(86_400);
    let events = block_on(board.gc_events(now.saturating_sub(days(event_days))))?;
    let logs = board.folder.join("logs");
    let cutoff = std::time::SystemTime::now()
        .checked_sub(std::time::Duration::from_secs(u64::from(log_days) * 86_400))
        .unwrap_or(std::time::UNIX_EPOCH);
    let mut removed = 0_u64;
    if let Ok(entries) = std::fs::read_dir(&logs) {
        for entry in entries.flatten() {
            let path = entry.path();
            let is_log = path
                .file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| name.contains(".log"));
            // A plain file only: a link is somebody else's to keep.
            let old = std::fs::symlink_metadata(&path)
                .is_ok_and(|meta| meta.is_file() && meta.modified().is_ok_and(|at| at < cutoff));
            if is_log && old && std::fs::remove_file(&path).is_ok() {
                removed += 1;
            }
        }
    }
    outln!(
        "removed {events} event(s) of done or archived cards older than {event_days} day(s), and {removed} worker log(s) not written for {log_days} day(s)"
    );
    // The worktrees of cards no longer on the board, in the repositories
    // the board's cards name.
    let tasks = block_on(board.list_tasks(None))?;
    for said in crate::workspace::orphan_worktrees(&tasks, &board.name()) {
        outln!("{said}");
    }
    Ok(ExitCode::Success)
}

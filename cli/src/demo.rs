//! `kanban demo`: a fresh board, simulated agents that fail in every way the
//! policy knows, and a summary of how each card was booked.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::{Duration, Instant};

use kanban_board_sqlite::{SqliteBoard, SystemClock};
use kanban_core::ExitCode;
use kanban_core::rules::FailurePolicy;
use kanban_core::{BoardAdmin, BookingKind, DispatchSettings, NewTask, RunMode};

use crate::agent_check::agent_route;
use crate::agents_file::AgentCommand;
use crate::dispatch::DispatchPlan;

/// The demo's second agent, for the card that hits a quota wall.
const METERED: &str = "metered";
use crate::out::outln;
use crate::output::table;
use crate::runtime::block_on;

const CARDS: [(&str, &str); 6] = [
    ("write the release notes", "ok"),
    ("fix the flaky parser test", "flaky"),
    ("summarise the design review", "flaky-twice"),
    ("translate the README", "quota"),
    ("tidy the changelog", "chatty"),
    ("update the dependency list", "ok"),
];

/// The demo's dispatcher: simulated agents, short delays, until idle.
fn demo_plan(path: &Path, env: &kanban_core::Environment) -> anyhow::Result<DispatchPlan> {
    let exe = std::env::current_exe()?;
    let sim = format!("'{}' sim-agent", exe.display());
    let agents = crate::dispatch::Agents {
        by_route: [
            (String::new(), AgentCommand::bare(sim.clone())),
            (METERED.to_owned(), AgentCommand::bare(sim)),
        ]
        .into(),
        unassigned: None,
    };
    Ok(DispatchPlan {
        db: path.to_owned(),
        folder: path.parent().unwrap_or(Path::new(".")).to_owned(),
        board_slug: "demo".to_owned(),
        mode: RunMode::UntilIdle,
        settings: DispatchSettings {
            ttl_seconds: 120,
            max_in_progress: 3,
            failure_policy: FailurePolicy::default(),
            interval: Duration::from_secs(1),
            grace: Duration::from_secs(5),
            max_runtime_seconds: None,
            routes: agents
                .by_route
                .iter()
                .map(|(route, agent)| (route.clone(), agent_route(route, agent, env)))
                .collect(),
            unassigned_route: None,
        },
        agents,
        worker_args: vec![
            "--recovery-delays".to_owned(),
            "1".to_owned(),
            "--grace".to_owned(),
            "2".to_owned(),
        ],
        worker_env: vec![("HERMES_KANBAN_TURN_RECOVERY".to_owned(), "3".to_owned())],
    })
}

pub(crate) fn demo(
    board_file: Option<PathBuf>,
    interrupt: Arc<AtomicUsize>,
) -> anyhow::Result<ExitCode> {
    let started = Instant::now();
    let path = match board_file {
        Some(path) if std::fs::symlink_metadata(&path).is_ok() => {
            anyhow::bail!(
                "--board-file {} exists; the demo makes a new board: name a path that does not exist",
                path.display()
            )
        }
        Some(path) => path,
        None => std::env::temp_dir()
            .join(format!(
                "kanban-demo-{}-{}",
                std::process::id(),
                kanban_core::Clock::now(&SystemClock)
            ))
            .join("kanban.db"),
    };
    let board = SqliteBoard::create(&path, Arc::new(SystemClock))?;
    outln!("kanban demo on {}", path.display());
    outln!("simulated agents (a real child process each turn, speaking the agent protocol):");
    for (behaviour, what) in crate::sim_agent::BEHAVIOURS {
        outln!("  {behaviour:<12} {what}");
    }
    outln!(
        "short delays for the demo: in-place recovery backoff 1 s (default 15/45/90 s), tick 1 s (default 60 s); quota walls are held 300 s"
    );
    outln!(
        "the quota card is assigned to agent {METERED}: its wall holds that agent's cards, and the others go on\n"
    );
    let mut ids = Vec::new();
    for (title, behaviour) in CARDS {
        let new = NewTask {
            title: title.to_owned(),
            body: Some(format!("sim: {behaviour}")),
            // The walled card has an agent of its own, so its wall holds
            // that agent alone (an agent is one client of one provider).
            assignee: (behaviour == "quota").then(|| METERED.to_owned()),
            ..NewTask::default()
        };
        ids.push(block_on(board.create_task(&new))?);
    }
    drop(board);
    let env = kanban_core::Environment::default();
    let plan = demo_plan(&path, &env)?;
    let code = crate::dispatch::run(&plan, &env, &interrupt)?;
    let board = SqliteBoard::open(&path, Arc::new(SystemClock))?;
    let rows = summary_rows(&board, &ids)?;
    outln!(
        "\n{}",
        table(
            &[
                "CARD",
                "TITLE",
                "STATUS",
                "RUNS",
                "IN-PLACE RECOVERIES",
                "EXIT CODES (BOOKED AS)"
            ],
            &rows
        )
    );
    outln!(
        "finished in {:.1} s; board kept at {}",
        started.elapsed().as_secs_f64(),
        path.display()
    );
    outln!(
        "look closer: kanban --db {} show {}",
        path.display(),
        ids[2]
    );
    Ok(code)
}

/// One row per card: status, runs, recoveries, and each run's exit code with its booking.
pub(crate) fn summary_rows(
    board: &SqliteBoard,
    ids: &[String],
) -> anyhow::Result<Vec<Vec<String>>> {
    let mut rows = Vec::new();
    for id in ids {
        let view = block_on(board.show_task(id))?;
        let recoveries: u64 = view
            .events
            .iter()
            .filter(|e| e.kind == "worker_result")
            .filter_map(|e| e.payload["recovery_attempts"].as_u64())
            .sum();
        let bookings: Vec<String> = view
            .events
            .iter()
            .filter(|e| {
                e.kind == "worker_exited" || BookingKind::ALL.iter().any(|k| k.as_str() == e.kind)
            })
            .map(|e| {
                let code = e.payload["exit_code"]
                    .as_i64()
                    .map_or_else(|| "?".to_owned(), |c| c.to_string());
                let kind = e.payload["kind"]
                    .as_str()
                    .unwrap_or(&e.kind)
                    .replace('_', " ");
                format!("{code} ({kind})")
            })
            .collect();
        let now = kanban_core::Clock::now(&SystemClock);
        let status = match (view.task.status.known(), view.task.not_before) {
            (Some(kanban_core::TaskStatus::Ready), Some(at)) if at > now => {
                format!("ready, retry in {} s", at - now)
            }
            _ => view.task.status.as_str().to_owned(),
        };
        rows.push(vec![
            id.clone(),
            view.task.title.clone(),
            status,
            view.runs.len().to_string(),
            recoveries.to_string(),
            bookings.join(", "),
        ]);
    }
    Ok(rows)
}

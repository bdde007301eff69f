//! `kanban watch`: a live view of one board.

use std::io::IsTerminal;
use std::time::Duration;

use kanban_board_sqlite::SystemClock;
use kanban_core::ExitCode;
use kanban_core::{Clock, Environment, TaskStatus};

use crate::args::GlobalArgs;
use crate::board_path::open_board_for_reading;
use crate::out::{out, outln};
use crate::output::{event_words, short, span, table, visible, walls_table};
use crate::runtime::block_on;

fn snapshot(board: &crate::board_path::OpenBoard) -> anyhow::Result<String> {
    let now = SystemClock.now();
    let tasks = block_on(board.list_tasks(None))?;
    let mut out = format!("board {}\n\n", board.name());
    let mut counts: Vec<String> = TaskStatus::ALL
        .iter()
        .map(|status| {
            format!(
                "{} {}",
                status.as_str(),
                tasks.iter().filter(|t| t.status == *status).count()
            )
        })
        .collect();
    let unknown = tasks.iter().filter(|t| t.status.known().is_none()).count();
    if unknown > 0 {
        counts.push(format!("other {unknown}"));
    }
    out.push_str(&counts.join("   "));
    out.push_str("\n\nrunning:\n");
    let running = block_on(board.running_workers())?;
    let rows: Vec<Vec<String>> = running
        .iter()
        .map(|w| {
            let title = tasks
                .iter()
                .find(|t| t.id == w.claim.task_id)
                .map(|t| short(&t.title, 40))
                .unwrap_or_default();
            vec![
                w.claim.task_id.clone(),
                w.claim.run_id.to_string(),
                w.worker_pid
                    .map(|p| p.to_string())
                    .unwrap_or_else(|| "-".into()),
                w.claim_expires
                    .map(|e| format!("{}s", e - now))
                    .unwrap_or_else(|| "-".into()),
                title,
            ]
        })
        .collect();
    out.push_str(&table(
        &["CARD", "RUN", "PID", "LEASE LEFT", "TITLE"],
        &rows,
    ));
    let walls = block_on(board.walls())?;
    if !walls.is_empty() {
        out.push_str("\nprovider walls:\n");
        out.push_str(&walls_table(&walls, now));
    }
    out.push_str("\nlast events:\n");
    let events = block_on(board.recent_events(12))?;
    let rows: Vec<Vec<String>> = events
        .iter()
        .map(|e| {
            vec![
                format!("{} ago", span(now - e.created_at)),
                e.task_id.clone(),
                event_words(e, now, 80),
            ]
        })
        .collect();
    out.push_str(&table(&["WHEN", "CARD", "WHAT"], &rows));
    Ok(visible(&out).into_owned())
}

pub(crate) fn watch(
    global: &GlobalArgs,
    env: &Environment,
    interval: Duration,
    once: bool,
) -> anyhow::Result<ExitCode> {
    let terminal = std::io::stdout().is_terminal();
    loop {
        // Opened anew for each view: a board of the seed system is read
        // through a copy taken at open, which must not go stale.
        let board = open_board_for_reading(global, env)?;
        let view = snapshot(&board)?;
        drop(board);
        if terminal && !once {
            // Home and clear, then redraw: the view updates in place.
            out!("\x1b[H\x1b[2J{view}");
        } else {
            outln!("{view}");
        }
        if once {
            return Ok(ExitCode::Success);
        }
        std::thread::sleep(interval.max(Duration::from_millis(100)));
    }
}

//! `kanban logs`: a card's worker log, whole, one run of it, or followed.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::bail;
use kanban_core::ExitCode;
use kanban_core::{Environment, TaskStatus, WORKER_END_DETAIL, WORKER_EXIT_TRAILER};

use crate::args::GlobalArgs;
use crate::board_path::open_board_for_reading;
use crate::out::{errln, out};
use crate::output::visible;
use crate::runtime::block_on;
use crate::supervisor::run_marker;

/// How often `--follow` looks for more.
const FOLLOW_EVERY: Duration = Duration::from_millis(200);

/// The lines of run `run` in a log: from its marker to the next run's.
fn run_section(text: &str, run: i64) -> Option<String> {
    let marker = run_marker(run);
    let start = text.lines().position(|line| line == marker)?;
    let lines: Vec<&str> = text
        .lines()
        .skip(start)
        .enumerate()
        .take_while(|(index, line)| *index == 0 || !line.starts_with("[kanban-dispatch] run "))
        .map(|(_, line)| line)
        .collect();
    Some(lines.join("\n") + "\n")
}

fn read_lossy(path: &Path) -> Option<String> {
    std::fs::read(path)
        .ok()
        .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
}

pub(crate) fn logs(
    global: &GlobalArgs,
    env: &Environment,
    task: &str,
    run: Option<i64>,
    follow: bool,
    interrupt: &Arc<AtomicUsize>,
) -> anyhow::Result<ExitCode> {
    let board = open_board_for_reading(global, env)?;
    // The card must exist: a typo names no file, and says so.
    let task = &crate::admin::card_id(&board, task)?;
    let view = block_on(board.show_task(task))?;
    let folder = board.folder.join("logs");
    let current = crate::supervisor::readable_log(&folder, task);
    let mut older = current.as_os_str().to_owned();
    older.push(".1");
    let older = PathBuf::from(older);
    if let Some(run) = run {
        if !view.runs.iter().any(|r| r.id == run) {
            bail!("{task} has no run {run}; `kanban show {task}` lists its runs");
        }
        // A rotated log holds the older runs.
        let section = [&current, &older]
            .into_iter()
            .filter_map(|path| read_lossy(path))
            .find_map(|text| run_section(&text, run));
        match section {
            Some(section) if !follow => {
                out!("{}", visible(&for_people(&section)));
                return Ok(ExitCode::Success);
            }
            Some(_) => {}
            None => bail!(
                "the log of run {run} of {task} is gone (logs rotate past 16 MiB; `kanban prune` removes old ones)"
            ),
        }
    }
    let Ok(mut file) = std::fs::File::open(&current) else {
        if view.runs.is_empty() {
            bail!("{task} has not run yet: no log");
        }
        bail!("no log for {task} at {}", current.display());
    };
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    let shown = String::from_utf8_lossy(&bytes);
    let print = |text: &str| match run {
        Some(run) => run_section(text, run).unwrap_or_default(),
        None => text.to_owned(),
    };
    out!("{}", visible(&for_people(&print(&shown))));
    if !follow {
        return Ok(ExitCode::Success);
    }
    follow_log(
        &board,
        task,
        run,
        &current,
        file,
        bytes.len() as u64,
        interrupt,
    )
}

/// Follows a card's log from `offset`: prints what is appended until the
/// card no longer runs (the run asked for, or any) and nothing more came for
/// a second, or Ctrl-C. It goes on from what was read, not from the end: a
/// write since is not skipped, nor a truncation since missed.
fn follow_log(
    board: &crate::board_path::OpenBoard,
    task: &str,
    run: Option<i64>,
    current: &Path,
    mut file: std::fs::File,
    mut offset: u64,
    interrupt: &Arc<AtomicUsize>,
) -> anyhow::Result<ExitCode> {
    let mut quiet_since = Instant::now();
    let mut pending = String::new();
    loop {
        if interrupt.load(Ordering::SeqCst) != 0 {
            return Ok(ExitCode::Success);
        }
        std::thread::sleep(FOLLOW_EVERY);
        // As `tail -F`: a log cut short, or replaced by another file (it
        // rotated), is read again from its start.
        if let Some(reopened) = started_over(current, &file, offset) {
            errln!(
                "kanban: {}: {}; following it from its start",
                current.display(),
                reopened.1
            );
            file = reopened.0;
            offset = 0;
            pending.clear();
        }
        let mut more = Vec::new();
        file.seek(SeekFrom::Start(offset))?;
        let read = file.read_to_end(&mut more)?;
        offset += read as u64;
        if read > 0 {
            quiet_since = Instant::now();
            pending.push_str(&String::from_utf8_lossy(&more));
            // Whole lines only, so a run's end marker is seen whole.
            if let Some(end) = pending.rfind('\n') {
                let lines: String = pending.drain(..=end).collect();
                for line in lines.split_inclusive('\n') {
                    // Following one run: the next run's marker ends it.
                    if run.is_some() && line.starts_with("[kanban-dispatch] run ") {
                        return Ok(ExitCode::Success);
                    }
                    out!("{}", visible(&for_people(line)));
                }
            }
        }
        let running = block_on(board.show_task(task))
            .map(|view| {
                view.task.status == TaskStatus::Running
                    && run.is_none_or(|run| view.task.current_run_id == Some(run))
            })
            .unwrap_or(false);
        if !running && quiet_since.elapsed() > Duration::from_secs(1) {
            if !pending.is_empty() {
                out!("{}", visible(&for_people(&pending)));
            }
            return Ok(ExitCode::Success);
        }
    }
}

/// A log as people read it: a worker's closing lines, written for the
/// dispatchers that read them back (its code, its seal), are shown as
/// `exit N`; the log file itself keeps them as written.
fn for_people(text: &str) -> String {
    text.split_inclusive('\n')
        .filter(|line| !line.starts_with(WORKER_END_DETAIL))
        .map(|line| match line.strip_prefix(WORKER_EXIT_TRAILER) {
            Some(code) => format!("exit {}\n", code.trim_end()),
            None => line.to_owned(),
        })
        .collect()
}

/// The log to follow from its start, and why, when the one followed was
/// replaced (another file at its path now) or cut short (shorter than what
/// was read of it).
fn started_over(
    path: &Path,
    file: &std::fs::File,
    offset: u64,
) -> Option<(std::fs::File, &'static str)> {
    use std::os::unix::fs::MetadataExt as _;
    let open = file.metadata().ok()?;
    let named = std::fs::metadata(path).ok()?;
    if (named.dev(), named.ino()) != (open.dev(), open.ino()) {
        return std::fs::File::open(path)
            .ok()
            .map(|file| (file, "replaced"));
    }
    if open.len() < offset {
        return file.try_clone().ok().map(|file| (file, "truncated"));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::{for_people, run_section};

    #[test]
    fn a_workers_closing_lines_read_as_its_exit() {
        let log =
            "working\n[kanban-worker-end] rc=75 seal=abc alone\n[kanban-worker-exit] rc=75\nnext";
        assert_eq!(for_people(log), "working\nexit 75\nnext");
        assert_eq!(for_people("[kanban-worker-exit] rc=0"), "exit 0\n");
    }

    #[test]
    fn a_run_is_cut_from_its_marker_to_the_next() {
        let log = "\n[kanban-dispatch] run 1 spawned\none\n\n[kanban-dispatch] run 2 spawned\ntwo\nmore\n[kanban-dispatch] run 3 spawned\nthree\n";
        assert_eq!(
            run_section(log, 1).unwrap(),
            "[kanban-dispatch] run 1 spawned\none\n\n"
        );
        assert_eq!(
            run_section(log, 2).unwrap(),
            "[kanban-dispatch] run 2 spawned\ntwo\nmore\n"
        );
        assert_eq!(
            run_section(log, 3).unwrap(),
            "[kanban-dispatch] run 3 spawned\nthree\n"
        );
        assert_eq!(run_section(log, 4), None);
        assert_eq!(run_section("[kanban-dispatch] run 11 spawned\n", 1), None);
    }
}

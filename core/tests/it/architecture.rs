//! The architecture's invariants, read off the source tree, so that
//! `docs/ARCHITECTURE.md` stays true: a change that breaks one fails here.

use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("core sits in the workspace")
        .to_owned()
}

/// Every `.rs` file under `dir`, with its text, comments stripped: an
/// invariant is about code, and a comment may well name what it forbids.
fn sources(dir: &str) -> Vec<(PathBuf, String)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(&workspace().join(dir), &mut files);
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).expect("a readable source file");
            let code: String = text
                .lines()
                .map(|line| match line.find("//") {
                    Some(at) if !line[..at].contains('"') => &line[..at],
                    _ => line,
                })
                .collect::<Vec<_>>()
                .join("\n");
            (path, code)
        })
        .collect()
}

fn offenders(dirs: &[&str], forbidden: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    for dir in dirs {
        let files = sources(dir);
        assert!(!files.is_empty(), "no sources under {dir}");
        for (path, code) in files {
            for needle in forbidden {
                if code.contains(needle) {
                    found.push(format!("{}: {needle}", path.display()));
                }
            }
        }
    }
    found
}

/// The adapters: crates that talk to the world.
#[test]
fn core_does_no_io_and_reads_no_ambient_state() {
    let found = offenders(
        &["core/src"],
        &[
            "std::env",
            "std::fs",
            "std::process",
            "std::net",
            "SystemTime",
            "Instant::now",
            "thread::sleep",
            "tokio",
        ],
    );
    assert!(found.is_empty(), "core must stay pure: {found:#?}");
}

#[test]
fn only_the_binary_exits_reads_the_environment_or_handles_signals() {
    let found = offenders(
        &[
            "core/src",
            "board-sqlite/src",
            "board-postgres/src",
            "agent-port/src",
        ],
        &[
            "std::process::exit",
            "std::env::var",
            "std::env::vars",
            "signal_hook",
        ],
    );
    assert!(found.is_empty(), "{found:#?}");
}

#[test]
fn core_depends_on_no_async_runtime() {
    let manifest = std::fs::read_to_string(workspace().join("core/Cargo.toml")).unwrap();
    let dependencies = manifest
        .split("[dependencies]")
        .nth(1)
        .and_then(|rest| rest.split("\n[").next())
        .unwrap_or("");
    for runtime in ["tokio", "async-std", "smol", "pollster"] {
        assert!(!dependencies.contains(runtime), "core depends on {runtime}");
    }
}

#[test]
fn only_the_process_adapters_signal_processes() {
    // The dispatcher decides whom to stop; `Supervisor` (cli) and the agent
    // adapters (agent-port) are the only code that sends a signal.
    let found = offenders(
        &["core/src", "board-sqlite/src", "board-postgres/src"],
        &["killpg", "nix::sys::signal", "libc::kill", "Command::new"],
    );
    assert!(found.is_empty(), "{found:#?}");
}

#[test]
fn the_board_adapter_opens_board_files_only_through_sqlite() {
    // Closing any handle of our own on a database file drops the POSIX
    // locks SQLite holds on it in this process; SQLite then may let another
    // process delete a write-ahead log still in use. board-sqlite reads and
    // checks board files through SQLite only (it creates a missing one with
    // `OpenOptions::create_new`, before SQLite has it open).
    let found = offenders(
        &["board-sqlite/src"],
        &["File::open", "fs::read(", "fs::read_to_string", "fs::File"],
    );
    assert!(found.is_empty(), "{found:#?}");
}

#[test]
fn the_postgres_board_reads_time_from_its_clock_never_from_the_server() {
    // The simulation and the fakes drive a board with a virtual clock; a
    // server's own time in SQL would make the PostgreSQL board disagree
    // with SQLite's on every lease and hold.
    let found = offenders(
        &["board-postgres/src"],
        &[
            // `clock.now()` is the board's clock; SQL's `now()` is not.
            " now()",
            "(now()",
            ",now()",
            "NOW()",
            "CURRENT_TIMESTAMP",
            "current_timestamp",
            "clock_timestamp",
            "statement_timestamp",
            "transaction_timestamp",
            "LOCALTIMESTAMP",
            "SystemTime",
        ],
    );
    assert!(found.is_empty(), "{found:#?}");
}

#[test]
fn a_dispatcher_makes_its_workers_calls_only_through_a_workers_port() {
    // The link answers a worker with the worker's own claim through the
    // calls of the worker's port (and the card's view); a call of the
    // dispatcher's or an operator's port there would let a worker reach
    // past its fence.
    const WORKER_CALLS: [&str; 11] = [
        "show_task",
        "prove_claim",
        "bind_worker",
        "book_result",
        "run_status",
        "heartbeat",
        "complete",
        "block",
        "settle_overrun",
        "comment",
        "append_event",
    ];
    let link = sources("cli/src")
        .into_iter()
        .find(|(path, _)| path.ends_with("dispatch_link.rs"))
        .map(|(_, code)| code)
        .expect("cli/src/dispatch_link.rs is the dispatcher's link");
    let perform = link
        .split("async fn perform(")
        .nth(1)
        .and_then(|rest| rest.split("\n}\n").next())
        .expect("dispatch_link.rs makes the calls in `perform`");
    let called: Vec<&str> = perform
        .split("board.")
        .skip(1)
        .filter_map(|rest| rest.split('(').next())
        .collect();
    assert!(called.len() >= WORKER_CALLS.len(), "{called:?}");
    let foreign: Vec<&&str> = called
        .iter()
        .filter(|call| !WORKER_CALLS.contains(call))
        .collect();
    assert!(foreign.is_empty(), "the link makes {foreign:?}");
}

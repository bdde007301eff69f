//! The architecture's invariants, read off the source tree, so that
//! `docs/ARCHITECTURE.md` stays true: a change that breaks one fails here.

use std::collections::BTreeSet;
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
const ADAPTERS: [&str; 4] = [
    "board-sqlite/src",
    "board-postgres/src",
    "agent-port/src",
    "cli/src",
];

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
fn no_booking_or_requeue_rule_outside_core() {
    // Adapters keep rows, indexes and transactions: they neither name a
    // booking's outcome, nor count failures, nor branch on rows in SQL, nor
    // call the booking table themselves; core's rules decide all of that.
    let found = offenders(
        &ADAPTERS,
        &[
            "\"protocol_violation\"",
            "\"rate_limited\"",
            "\"crashed\"",
            "\"timed_out\"",
            "\"terminal_provider\"",
            "\"gave_up\"",
            "'protocol_violation'",
            "'rate_limited'",
            "'crashed'",
            "CASE WHEN",
            "consecutive_failures + ",
            "consecutive_failures = consecutive_failures",
            "book_worker_exit(",
            "stale_claim_action(",
            "violation_streak(",
            "retry_backoff_seconds(",
        ],
    );
    assert!(
        found.is_empty(),
        "a board or dispatch rule outside core: {found:#?}"
    );
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

/// The functions of `folder` (outside `definitions`, where the durabilities
/// are defined) that name one of `needles`, as `file: function`.
fn functions_naming(folder: &str, definitions: &str, needles: &[&str]) -> BTreeSet<String> {
    let mut named = BTreeSet::new();
    for (path, code) in sources(folder) {
        if path.ends_with(definitions) {
            continue;
        }
        for needle in needles {
            for (at, _) in code.match_indices(needle) {
                let before = &code[..at];
                let name = before
                    .rfind("fn ")
                    .map(|start| {
                        before[start + 3..]
                            .split(|c: char| !c.is_alphanumeric() && c != '_')
                            .next()
                            .unwrap_or("")
                    })
                    .unwrap_or("");
                let file = path.file_name().unwrap_or_default().to_string_lossy();
                named.insert(format!("{file}: {name}"));
            }
        }
    }
    named
}

#[test]
fn only_writes_whose_loss_equals_an_earlier_crash_skip_the_sync() {
    // docs/ARCHITECTURE.md, both boards' invariants on syncing: a claim
    // (its run id is a fencing token), a settlement, a booking or a
    // person's change is synced before it returns; only these records may
    // wait for the next synced commit.
    // (`book_exit` begins unsynced and is synced unless `rules` says its
    // change only records: the exit of a run its worker settled.)
    let sqlite = functions_naming(
        "board-sqlite/src",
        "open.rs",
        &[
            "write_deferred(",
            "Durability::Deferred",
            "write_synced_unless_record(",
        ],
    );
    let expected = [
        "dispatch.rs: book_exit",
        "dispatch.rs: extend_lease",
        "dispatch.rs: record_signal",
        "dispatch.rs: record_spawn",
        "dispatch.rs: record_ticks",
        "worker.rs: bind_worker",
        "worker.rs: book_result",
        "worker.rs: heartbeat",
    ];
    assert_eq!(sqlite, expected.map(String::from).into(), "SQLite's board");

    // On PostgreSQL, fewer: a worker outlives a server that crashed, and
    // would act on a bind, a lease extension, a spawn or signal record or
    // a result the crash took. Only what nobody alive acts on is left.
    let postgres = functions_naming("board-postgres/src", "conn.rs", &["commit_unsynced("]);
    let expected = ["dispatch.rs: book_exit", "dispatch.rs: record_ticks"];
    assert_eq!(
        postgres,
        expected.map(String::from).into(),
        "PostgreSQL's board"
    );
}

#[test]
fn every_statement_of_the_sqlite_board_fits_its_cache() {
    // A statement evicted from the connection's cache is parsed and planned
    // again on its next use; the cache holds twice the statements written,
    // so that the lane queries whose text varies with a filter fit too.
    let board = sources("board-sqlite/src");
    let declared = board
        .iter()
        .filter(|(path, _)| path.ends_with("open.rs"))
        .flat_map(|(_, code)| code.lines())
        .find_map(|line| {
            line.trim()
                .strip_prefix("pub(crate) const STATEMENT_CACHE: usize = ")
        })
        .and_then(|rest| {
            rest.trim_end_matches(';')
                .replace('_', "")
                .parse::<usize>()
                .ok()
        })
        .expect("board-sqlite/src/open.rs declares STATEMENT_CACHE");
    let statements: usize = board
        .iter()
        .map(|(_, code)| code.matches("prepare_cached(").count())
        .sum();
    assert!(statements > 0, "no cached statement was found");
    assert!(
        statements * 2 <= declared,
        "{statements} cached statements in a cache of {declared}"
    );
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

#[test]
fn a_dispatched_card_s_statements_keep_no_statement_journal() {
    // SQLite runs a `RETURNING` clause as a trigger, and a statement with
    // a trigger inside a transaction keeps a statement journal, allocated
    // and freed at every call: a seventh of a single claim's time when the
    // claim's compare-and-set returned its columns. The claims, bookings
    // and worker calls read what they need with a plain `SELECT` instead.
    let mut seen = 0;
    let mut found = Vec::new();
    for (path, code) in sources("board-sqlite/src") {
        if !(path.ends_with("dispatch.rs") || path.ends_with("worker.rs")) {
            continue;
        }
        seen += 1;
        if code.contains("RETURNING") {
            found.push(path.display().to_string());
        }
    }
    assert_eq!(
        seen, 2,
        "the dispatcher's and the worker's calls were not found"
    );
    assert!(found.is_empty(), "{found:#?}");
}

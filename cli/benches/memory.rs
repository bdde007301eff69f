//! Peak memory (VmHWM) of a worker and a dispatcher, against fixed bounds:
//! a worker of a quiet agent, a worker whose agent prints 200 MB without a
//! newline (a tail is kept, not the output), and a dispatcher ticking a
//! board of 1M cards. Prints each peak and its bound.
//!
//! `cargo bench -p kanban-cli --bench memory` (`KANBAN_BENCH_CARDS=N` sizes
//! the dispatcher's board; default 1,000,000).
//!
//! Each measurement runs in a helper process (this binary again) that
//! spawns one command and reads `getrusage(RUSAGE_CHILDREN)`: the peak
//! resident set of that command alone, not of the benchmark.

#![allow(
    clippy::too_many_lines,
    reason = "the length rule is for src/: a test or a benchmark reads best whole"
)]
#![allow(
    clippy::disallowed_methods,
    clippy::disallowed_types,
    reason = "tests and benchmarks read their knobs from the environment and drive real processes and files"
)]

use std::path::Path;
use std::process::Command;

use nix::sys::resource::{UsageWho, getrusage};

const KANBAN: &str = env!("CARGO_BIN_EXE_kanban");

/// Runs `command` in a helper process; returns its peak RSS in KiB.
fn peak_kib(command: &[&str], env: &[(String, String)]) -> u64 {
    let output = Command::new(std::env::current_exe().unwrap())
        .arg("--measure")
        .args(command)
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&output.stdout);
    assert!(
        said.lines().any(|line| line == "success=true"),
        "{command:?} failed: {said}"
    );
    said.lines()
        .find_map(|line| line.strip_prefix("peak_kib="))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or_else(|| {
            panic!(
                "the helper did not measure {command:?}: {said}\n{}",
                String::from_utf8_lossy(&output.stderr)
            )
        })
}

/// The helper: run the command, then report the peak of the children.
fn measure(command: &[String]) {
    let status = Command::new(&command[0])
        .args(&command[1..])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    let usage = getrusage(UsageWho::RUSAGE_CHILDREN).unwrap();
    println!("success={}", status.success());
    println!("peak_kib={}", usage.max_rss());
}

fn kanban(db: &Path, args: &[&str]) -> String {
    let output = Command::new(KANBAN)
        .arg("--db")
        .arg(db)
        .args(args)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "kanban {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn write_agent(path: &Path, body: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, format!("#!/bin/sh\ncat > /dev/null\n{body}\n")).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A worker's peak for one card and `agent`.
fn worker_peak(dir: &Path, name: &str, agent_body: &str) -> u64 {
    let db = dir.join(format!("{name}.db"));
    kanban(&db, &["init"]);
    let id = kanban(&db, &["add", name]).trim().to_owned();
    let claim: serde_json::Value =
        serde_json::from_str(&kanban(&db, &["claim", &id, "--json"])).unwrap();
    let agent = dir.join(format!("{name}.sh"));
    write_agent(&agent, agent_body);
    let carrier = vec![
        ("HERMES_KANBAN_TASK".to_owned(), id),
        (
            "HERMES_KANBAN_DB".to_owned(),
            claim["db"].as_str().unwrap().to_owned(),
        ),
        (
            "HERMES_KANBAN_RUN_ID".to_owned(),
            claim["run_id"].to_string(),
        ),
        (
            "HERMES_KANBAN_CLAIM_LOCK".to_owned(),
            claim["claim_lock"].as_str().unwrap().to_owned(),
        ),
        ("HERMES_KANBAN_STOP_NUDGE".to_owned(), "0".to_owned()),
    ];
    peak_kib(
        &[KANBAN, "worker", "--agent", agent.to_str().unwrap()],
        &carrier,
    )
}

/// A dispatcher's peak over a few ticks of a board of `cards` cards, half
/// of them ready, with nothing to claim (`--max-in-progress` is full).
fn dispatcher_peak(dir: &Path, cards: u64) -> u64 {
    let db = dir.join("big.db");
    kanban(&db, &["init"]);
    kanban_testkit::bulk_add_cards(
        &db,
        cards,
        kanban_testkit::BulkLanes::HalfDone,
        1_700_000_000,
    );
    let agent = dir.join("finish.sh");
    write_agent(
        &agent,
        "\"$KANBAN_BIN\" complete --summary done || exit $?\necho '{\"completed\": true}'",
    );
    // Ten ticks: claims, spawns, books, and every scan of the lanes.
    let peak = peak_kib(
        &[
            "timeout",
            "20",
            KANBAN,
            "--db",
            db.to_str().unwrap(),
            "dispatch",
            "--once",
            "--max-in-progress",
            "4",
            "--agent",
            agent.to_str().unwrap(),
        ],
        &[],
    );
    end_workers_left(&db);
    peak
}

/// Stops the workers a `--once` dispatcher left running, before their board
/// is deleted with the benchmark's folder: left alone, they were still
/// running 90 s after the benchmark ended, inside the next benchmark's
/// measurements.
fn end_workers_left(db: &Path) {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let conn = rusqlite::Connection::open(db).unwrap();
    let pids: Vec<i32> = conn
        .prepare("SELECT worker_pid FROM tasks WHERE status = 'running' AND worker_pid IS NOT NULL")
        .unwrap()
        .query_map([], |row| row.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    // Only a process that is still one of this binary's workers: a worker
    // that died unbooked leaves its pid on the board, free for reuse.
    let pids: Vec<i32> = pids
        .into_iter()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| {
                let mut args = cmdline.split(|byte| *byte == 0);
                args.next() == Some(KANBAN.as_bytes()) && args.next() == Some(b"worker".as_slice())
            })
        })
        .collect();
    for &pid in &pids {
        let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while pids
        .iter()
        .any(|pid| Path::new(&format!("/proc/{pid}")).exists())
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--measure") {
        measure(&args[1..]);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let quiet = worker_peak(
        dir.path(),
        "quiet",
        "\"$KANBAN_BIN\" complete --summary done || exit $?\necho '{\"completed\": true}'",
    );
    let chatty = worker_peak(
        dir.path(),
        "chatty",
        "head -c 200000000 /dev/zero | tr '\\0' x\necho\n\"$KANBAN_BIN\" complete --summary done || exit $?\necho '{\"completed\": true}'",
    );
    let cards: u64 = std::env::var("KANBAN_BENCH_CARDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let dispatcher = dispatcher_peak(dir.path(), cards);
    let row = |what: &str, kib: u64, bound_mib: u64| {
        let mib = kib as f64 / 1024.0;
        println!(
            "{what:<44} peak {mib:>6.1} MiB   bound {bound_mib:>3} MiB   {:.2}x of the bound {}",
            mib / bound_mib as f64,
            if mib <= bound_mib as f64 {
                "ok"
            } else {
                "OVER"
            }
        );
    };
    row("worker, quiet agent", quiet, 8);
    row("worker, agent printing 200 MB, no newline", chatty, 32);
    row(&format!("dispatcher, {cards} cards"), dispatcher, 32);
    laid_out();
}

/// The quiet worker's bound holds because the functions workers run are
/// laid out first (`cli/build.rs`). The list's names carry hashes of the
/// toolchain and the dependencies: after an update few of them match, the
/// code is laid out as before, and the peak rises. A change of the
/// functions workers run does it too, in part: 94 names fewer (3,006 of
/// about 3,100) raised the quiet worker's peak from 4.8 to 5.4 MiB. Says how
/// many match.
fn laid_out() {
    let list = concat!(env!("CARGO_MANIFEST_DIR"), "/link/hot-symbols.txt");
    let listed: std::collections::HashSet<String> = std::fs::read_to_string(list)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    match Command::new("nm").args(["--defined-only", KANBAN]).output() {
        Ok(output) if output.status.success() => {
            let found = String::from_utf8_lossy(&output.stdout)
                .lines()
                .filter_map(|line| line.split_whitespace().nth(2))
                .filter(|name| listed.contains(*name))
                .count();
            println!(
                "code laid out for workers: {found} of the {} functions cli/link/hot-symbols.txt \
                 names are in this binary (it holds two builds' names, about 3,100 each; fewer \
                 means it is stale: record it again with cli/link/record-hot-symbols.sh)",
                listed.len()
            );
        }
        _ => println!("code laid out for workers: not counted (needs nm, from binutils)"),
    }
}

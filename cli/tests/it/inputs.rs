//! Inputs from every source (arguments, environment bytes, files, pipes and
//! board content) never panic, never corrupt a board and never leak a key.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use kanban_testkit::write_executable;

use crate::{Bench, text};

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// A digest of a file's bytes (an assertion failure then prints a number,
/// not a megabyte).
fn bytes_of(path: &Path) -> (usize, u64) {
    use std::hash::{Hash, Hasher};
    let bytes = std::fs::read(path).unwrap();
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut hasher);
    (bytes.len(), hasher.finish())
}

#[test]
fn the_demo_never_touches_a_users_board() {
    let bench = Bench::new();
    bench.add("a real card", &[]);
    let before = bytes_of(&bench.db);
    let output = bench.run(&["demo"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        text(&output.stderr).contains("never touches yours"),
        "{}",
        text(&output.stderr)
    );
    assert_eq!(bytes_of(&bench.db), before, "the board was written");
    let kept = bench
        .command()
        .args(["demo", "--board-file"])
        .arg(&bench.db)
        .output()
        .unwrap();
    assert_eq!(kept.status.code(), Some(1));
    assert!(
        text(&kept.stderr).contains("exists"),
        "{}",
        text(&kept.stderr)
    );
    assert_eq!(bytes_of(&bench.db), before, "the board was written");
}

#[test]
fn a_hard_linked_board_is_refused_by_every_name_and_left_as_it_was() {
    let bench = Bench::new();
    bench.add("a card", &[]);
    let second = bench.path().join("second-name.db");
    std::fs::hard_link(&bench.db, &second).unwrap();
    let before = bytes_of(&bench.db);
    for db in [&bench.db, &second] {
        for args in [
            &["ls"][..],
            &["add", "x"],
            &["dispatch", "--once", "--agent", "true"],
        ] {
            let output = bench.on(db).args(args).output().unwrap();
            assert_ne!(
                output.status.code(),
                Some(0),
                "{args:?} ran on a linked board"
            );
            assert!(
                text(&output.stderr).contains("has 2 hard links"),
                "{args:?}: {}",
                text(&output.stderr)
            );
        }
    }
    assert_eq!(bytes_of(&bench.db), before);
}

#[test]
fn a_symlink_and_a_relative_path_reach_one_board_with_one_absolute_name() {
    let bench = Bench::new();
    let id = bench.add("a card", &[]);
    let link = bench.path().join("link.db");
    std::os::unix::fs::symlink(&bench.db, &link).unwrap();
    // The claim carrier names the canonical absolute path, however the
    // board was named: an agent that changes folder can still finish.
    let claimed = bench
        .command()
        .current_dir(bench.path())
        .args(["--db", "./link.db", "claim", &id, "--json"])
        .output()
        .unwrap();
    assert!(claimed.status.success(), "{}", text(&claimed.stderr));
    let claim: serde_json::Value = serde_json::from_slice(&claimed.stdout).unwrap();
    let canonical = std::fs::canonicalize(&bench.db).unwrap();
    assert_eq!(claim["db"], canonical.to_str().unwrap());
    // A dispatcher holding the board by one name excludes one by another.
    let agent = bench.path().join("slow.sh");
    write_executable(&agent, "#!/bin/sh\ncat > /dev/null\nsleep 30\n");
    let mut first = bench
        .on(&bench.db)
        .args(["dispatch", "--interval", "0.2", "--agent"])
        .arg(&agent)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(700));
    let second = bench
        .on(&link)
        .args(["dispatch", "--once", "--agent"])
        .arg(&agent)
        .output()
        .unwrap();
    let _ = first.kill();
    let _ = first.wait();
    assert!(
        text(&second.stdout).contains("another dispatcher is ticking"),
        "{}\n{}",
        text(&second.stdout),
        text(&second.stderr)
    );
}

#[test]
fn dispatch_hands_agents_an_absolute_board_path_for_a_relative_db() {
    let bench = Bench::new();
    let id = bench.add("where is my board", &[]);
    let seen = bench.path().join("seen-db");
    let agent = bench.path().join("agent.sh");
    write_executable(
        &agent,
        &format!(
            "#!/bin/sh\ncat > /dev/null\nprintf '%s' \"$HERMES_KANBAN_DB\" > '{}'\ncd /\n\"$KANBAN_BIN\" complete --summary done || exit $?\necho '{{\"completed\": true}}'\n",
            seen.display()
        ),
    );
    let output = bench
        .command()
        .current_dir(bench.path())
        .args([
            "--db",
            "./kanban.db",
            "dispatch",
            "--until-idle",
            "--interval",
            "0.2",
            "--agent",
        ])
        .arg(&agent)
        .env("HERMES_KANBAN_STOP_NUDGE", "0")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output.stderr));
    let db = std::fs::read_to_string(&seen).unwrap();
    assert!(Path::new(&db).is_absolute(), "{db}");
    assert_eq!(bench.show(&id)["task"]["status"], "done");
}

#[test]
fn bytes_that_are_not_utf8_in_the_environment_stop_only_commands_that_read_them() {
    let bench = Bench::new();
    let bad = OsStr::from_bytes(b"caf\xe9");
    let unrelated = bench
        .on(&bench.db)
        .arg("ls")
        .env("SOMETHING_ELSE", bad)
        .output()
        .unwrap();
    assert!(unrelated.status.success(), "{}", text(&unrelated.stderr));
    let needed = bench
        .on(&bench.db)
        .arg("ls")
        .env("KANBAN_LOG", bad)
        .output()
        .unwrap();
    assert_eq!(needed.status.code(), Some(1));
    let stderr = text(&needed.stderr);
    assert!(
        stderr.contains("KANBAN_LOG is not valid UTF-8") && !stderr.contains("panicked"),
        "{stderr}"
    );
}

#[test]
fn kanban_log_picks_targets_and_levels_and_a_filter_it_cannot_read_is_named() {
    let bench = Bench::new();
    let dispatch_once = |filter: &str| {
        bench
            .on(&bench.db)
            .args(["dispatch", "--once", "--agent", "/bin/true"])
            .env("KANBAN_LOG", filter)
            .output()
            .unwrap()
    };
    let chosen = dispatch_once(" warn, kanban::dispatch=debug,");
    let stderr = text(&chosen.stderr);
    assert!(chosen.status.success(), "{stderr}");
    assert!(
        stderr.contains("DEBUG claim plan:") && stderr.contains("INFO tick:"),
        "{stderr}"
    );
    let unreadable = dispatch_once("warn,kanban::dispatch=[oops");
    let stderr = text(&unreadable.stderr);
    assert!(unreadable.status.success(), "{stderr}");
    assert!(
        stderr.contains("KANBAN_LOG is not a list of targets and levels")
            && !stderr.contains("tick:"),
        "{stderr}"
    );
}

#[test]
fn a_reader_that_goes_away_ends_a_listing_quietly() {
    let bench = Bench::new();
    // One title longer than a pipe's buffer: the write must meet a closed pipe.
    bench.add(&"long title ".repeat(9_000), &[]);
    for args in [&["ls"][..], &["ls", "--json"]] {
        let mut child = bench
            .on(&bench.db)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let output = child.wait_with_output().unwrap();
        let stderr = text(&output.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert_eq!(output.status.code(), Some(0), "{args:?}: {stderr}");
    }
}

/// Runs `command` to its end, failing the test if it takes over 20 s.
fn bounded(mut command: std::process::Command, what: &str) -> std::process::Output {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("kanban {what} hangs");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn hostile_values_for_every_subcommand_never_panic() {
    let bench = Bench::new();
    let id = bench.add("target", &[]);
    let hostile: [&OsStr; 11] = [
        OsStr::new("inf"),
        OsStr::new("NaN"),
        OsStr::new("1e30"),
        OsStr::new("-1"),
        OsStr::new("0"),
        OsStr::new("99999999999999999999999"),
        OsStr::new(""),
        OsStr::new("../../etc/passwd"),
        OsStr::new("http:"),
        OsStr::new("http:http://[::1"),
        OsStr::from_bytes(b"\xff\xfe"),
    ];
    let options: &[(&str, &[&str])] = &[
        (
            "add",
            &[
                "--priority",
                "--max-retries",
                "--goal-max-turns",
                "--max-runtime",
                "--parent",
                "--body",
            ],
        ),
        ("ls", &["--status"]),
        ("show", &[]),
        ("events", &[]),
        ("runs", &["--status", "--outcome"]),
        ("claim", &["--ttl"]),
        ("unblock", &[]),
        ("reclaim", &["--reason"]),
        ("prove", &["--task", "--run-id", "--claim-lock", "--pid"]),
        (
            "dispatch",
            &[
                "--interval",
                "--max-in-progress",
                "--ttl",
                "--rate-limit-cooldown",
                "--failure-limit",
                "--retry-backoff",
                "--turn-timeout",
                "--max-runtime",
                "--grace",
                "--agent",
            ],
        ),
        ("watch", &["--interval"]),
        ("heartbeat", &["--note"]),
        ("turn", &["--agent"]),
        (
            "swarm",
            &[
                "--worker",
                "--verifier",
                "--synthesizer",
                "--created-by",
                "--priority",
                "--idempotency-key",
            ],
        ),
    ];
    let mut tried = 0;
    for (command, flags) in options {
        for (index, value) in hostile.into_iter().enumerate() {
            let mut attempts: Vec<Vec<&OsStr>> = vec![vec![OsStr::new(command), value]];
            for flag in *flags {
                let mut args = vec![OsStr::new(*command)];
                if matches!(
                    *command,
                    "show" | "events" | "runs" | "claim" | "unblock" | "reclaim"
                ) {
                    args.push(OsStr::new(&id));
                }
                args.extend([OsStr::new(*flag), value]);
                if *command == "dispatch" {
                    args.push(OsStr::new("--once"));
                    if *flag != "--agent" {
                        args.extend([OsStr::new("--agent"), OsStr::new("true")]);
                    }
                }
                if *command == "turn" {
                    args.push(OsStr::new("hello"));
                }
                if *command == "watch" {
                    args.push(OsStr::new("--once"));
                }
                if *command == "swarm" {
                    args.insert(1, OsStr::new("a goal"));
                    for (required, given) in [
                        ("--worker", "writer:draft"),
                        ("--verifier", "checker"),
                        ("--synthesizer", "editor"),
                    ] {
                        if *flag != required {
                            args.extend([OsStr::new(required), OsStr::new(given)]);
                        }
                    }
                }
                attempts.push(args);
            }
            for args in attempts {
                let mut command = bench.on(&bench.db);
                command
                    .args(&args)
                    // The carrier gets hostile values of its own, apart from
                    // the arguments (clap refuses some of those first), and
                    // an unrelated variable is never text.
                    .env("HERMES_KANBAN_TASK", hostile[(index + 1) % hostile.len()])
                    .env("HERMES_KANBAN_RUN_ID", hostile[(index + 2) % hostile.len()])
                    .env(
                        "HERMES_KANBAN_CLAIM_LOCK",
                        hostile[(index + 3) % hostile.len()],
                    )
                    .env("UNRELATED_BYTES", OsStr::from_bytes(b"\xff"))
                    .env("HERMES_KANBAN_DB", &bench.db)
                    .stdin(Stdio::null());
                let output = bounded(command, &format!("{args:?}"));
                tried += 1;
                let stderr = text(&output.stderr);
                assert!(
                    !stderr.contains("panicked") && output.status.code() != Some(101),
                    "kanban {args:?} panicked: {stderr}"
                );
                assert!(
                    output.status.code().is_some(),
                    "kanban {args:?} died by a signal"
                );
            }
        }
    }
    assert!(tried > 300, "only {tried} runs");
}

#[test]
fn files_that_are_not_boards_get_their_own_errors_and_stay_as_they_were() {
    let bench = Bench::new();
    let fifo = bench.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let folder = bench.path().join("folder");
    std::fs::create_dir(&folder).unwrap();
    let empty = bench.path().join("empty");
    std::fs::write(&empty, b"").unwrap();
    let cases: [(&Path, &[&str], &str); 5] = [
        (&fifo, &["init"], "not a regular file"),
        (&fifo, &["ls"], "not a regular file"),
        (&folder, &["ls"], "is a folder"),
        (&folder, &["init"], "is a folder"),
        (&empty, &["ls"], "is empty, not a board"),
    ];
    for (path, args, needle) in cases {
        let started = Instant::now();
        let mut child = bench
            .on(path)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        while child.try_wait().unwrap().is_none() && started.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
        }
        if child.try_wait().unwrap().is_none() {
            let _ = child.kill();
            panic!("kanban {args:?} on {} hangs", path.display());
        }
        let output = child.wait_with_output().unwrap();
        assert_eq!(output.status.code(), Some(1), "{args:?} {}", path.display());
        assert!(
            text(&output.stderr).contains(needle),
            "{}",
            text(&output.stderr)
        );
    }
    assert_eq!(
        std::fs::read(&empty).unwrap(),
        b"",
        "ls adopted an empty file"
    );
    // Only init adopts an empty file.
    let init = bench.on(&empty).arg("init").output().unwrap();
    assert!(init.status.success(), "{}", text(&init.stderr));
}

#[test]
fn a_hostile_task_id_on_the_board_is_never_claimed_and_names_no_path() {
    let bench = Bench::new();
    let id = bench.add("planted", &[]);
    // Named after this bench's folder: the target outside it is shared.
    let folder = bench
        .path()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let hostile = format!("../../escape-{folder}");
    {
        let conn = rusqlite::Connection::open(&bench.db).unwrap();
        conn.execute("UPDATE tasks SET id = ?2 WHERE id = ?1", [&id, &hostile])
            .unwrap();
    }
    // A card behind it in the lane, and room for one claim: the claim reads
    // past the card it passes over.
    let behind = bench.add("behind it", &[]);
    let agent = bench.path().join("agent.sh");
    write_executable(
        &agent,
        "#!/bin/sh\ncat > /dev/null\necho '{\"completed\": true}'\n",
    );
    let output = bench.dispatch_until_idle(&agent, &["--max-in-progress", "1"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let escaped = bench.path().join(format!("../escape-{folder}.log"));
    assert!(!escaped.exists(), "a log was written outside logs/");
    let listed = bench.ok(&["ls", "--json"]);
    let cards: serde_json::Value = serde_json::from_str(&listed).unwrap();
    let status_of = |id: &str| {
        cards
            .as_array()
            .unwrap()
            .iter()
            .find(|card| card["id"] == id)
            .map(|card| card["status"].clone())
    };
    assert_eq!(
        status_of(&hostile),
        Some("ready".into()),
        "the hostile card was claimed"
    );
    assert_ne!(
        status_of(&behind),
        Some("ready".into()),
        "the card behind it was never claimed: {cards}"
    );
}

#[test]
fn out_of_range_leases_are_refused_not_changed() {
    let bench = Bench::new();
    let id = bench.add("card", &[]);
    let refused = |output: std::process::Output, needle: &str| {
        assert_ne!(output.status.code(), Some(0));
        assert!(
            text(&output.stderr).contains(needle),
            "{}",
            text(&output.stderr)
        );
    };
    refused(
        bench.run(&["claim", &id, "--ttl", "0"]),
        "at least 1 second",
    );
    refused(
        bench.run(&["claim", &id, "--ttl", "2d"]),
        "1 to 86400 seconds",
    );
    refused(
        bench.run(&[
            "dispatch",
            "--once",
            "--max-in-progress",
            "0",
            "--agent",
            "true",
        ]),
        "0",
    );
    let by_env = bench
        .on(&bench.db)
        .args(["dispatch", "--once", "--agent", "true"])
        .env("HERMES_KANBAN_CLAIM_TTL_SECONDS", "0")
        .output()
        .unwrap();
    assert_eq!(by_env.status.code(), Some(78));
    refused(by_env, "HERMES_KANBAN_CLAIM_TTL_SECONDS");
    for (name, value, named) in [
        ("KANBAN_CLAIM_TTL_SECONDS", "0", "KANBAN_CLAIM_TTL_SECONDS"),
        (
            "KANBAN_RATE_LIMIT_COOLDOWN_SECONDS",
            "soon",
            "KANBAN_RATE_LIMIT_COOLDOWN_SECONDS",
        ),
        (
            "HERMES_KANBAN_RATE_LIMIT_COOLDOWN_SECONDS",
            "-1",
            "HERMES_KANBAN_RATE_LIMIT_COOLDOWN_SECONDS",
        ),
    ] {
        let by_env = bench
            .on(&bench.db)
            .args(["dispatch", "--once", "--agent", "true"])
            .env(name, value)
            .output()
            .unwrap();
        assert_eq!(by_env.status.code(), Some(78), "{name}={value}");
        refused(by_env, named);
    }
    assert_eq!(
        bench.show(&id)["task"]["status"],
        "ready",
        "nothing was claimed"
    );
}

#[test]
fn boards_logs_and_their_folders_are_the_owners_alone() {
    let bench = Bench::new();
    let db = bench.path().join("new-folder/kanban.db");
    let run = |args: &[&str]| {
        let output = bench.on(&db).args(args).output().unwrap();
        assert!(
            output.status.success(),
            "{args:?}: {}",
            text(&output.stderr)
        );
    };
    run(&["init"]);
    run(&["add", "card"]);
    // Held open so that SQLite keeps the -wal and -shm files to look at.
    let open = rusqlite::Connection::open(&db).unwrap();
    let _: i64 = open
        .query_row("SELECT count(*) FROM tasks", [], |row| row.get(0))
        .unwrap();
    let agent = bench.path().join("agent.sh");
    write_executable(
        &agent,
        "#!/bin/sh\ncat > /dev/null\n\"$KANBAN_BIN\" complete --summary done || exit $?\necho '{\"completed\": true}'\n",
    );
    let output = bench
        .on(&db)
        .args(["dispatch", "--until-idle", "--interval", "0.2", "--agent"])
        .arg(&agent)
        .env("HERMES_KANBAN_STOP_NUDGE", "0")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output.stderr));
    let folder = db.parent().unwrap();
    assert_eq!(mode(folder), 0o700, "the board's folder");
    for suffix in ["", "-wal", "-shm", ".dispatch.lock"] {
        let mut name = db.as_os_str().to_owned();
        name.push(suffix);
        assert_eq!(mode(Path::new(&name)), 0o600, "kanban.db{suffix}");
    }
    let logs = folder.join("logs");
    assert_eq!(mode(&logs), 0o700, "the log folder");
    let log = std::fs::read_dir(&logs)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    assert_eq!(mode(&log), 0o600, "{}", log.display());
}

#[test]
fn a_run_id_is_compared_as_written_by_the_proof_and_by_fenced_writes() {
    let bench = Bench::new();
    let id = bench.add("card", &[]);
    let carrier = bench.claim(&id, None);
    let run_id = carrier
        .iter()
        .find(|(k, _)| k == "HERMES_KANBAN_RUN_ID")
        .unwrap()
        .1
        .clone();
    let padded = format!("0{run_id}");
    let with = |run: &str, args: &[&str]| {
        let mut command = bench.command();
        command.envs(carrier.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        command.env("HERMES_KANBAN_RUN_ID", run).args(args);
        command.output().unwrap()
    };
    assert!(with(&run_id, &["prove"]).status.success());
    assert!(with(&run_id, &["heartbeat"]).status.success());
    assert_ne!(with(&padded, &["prove"]).status.code(), Some(0));
    let heartbeat = with(&padded, &["heartbeat"]);
    assert_ne!(
        heartbeat.status.code(),
        Some(0),
        "{padded} was accepted as run {run_id}"
    );
    assert!(
        text(&heartbeat.stderr).contains("not a run id"),
        "{}",
        text(&heartbeat.stderr)
    );
}

/// A board as the seed system makes it: its schema (§1.3 of the reference,
/// without the notification table kanban never reads, and with `task_runs`
/// as older seed boards have it, before `worker_started_at`),
/// `user_version` 0, one card and its event.
fn seed_board(path: &Path) {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.execute_batch(SEED_SCHEMA).unwrap();
    conn.execute_batch(
        "INSERT INTO tasks (id, title, status, created_at) VALUES ('t_0123abcd', 'seed card', 'ready', 1700000000);
         INSERT INTO task_events (task_id, kind, created_at) VALUES ('t_0123abcd', 'created', 1700000000);",
    )
    .unwrap();
}

const SEED_SCHEMA: &str = "
PRAGMA journal_mode = WAL;
CREATE TABLE IF NOT EXISTS tasks (
    id TEXT PRIMARY KEY, title TEXT NOT NULL, body TEXT, assignee TEXT, status TEXT NOT NULL,
    priority INTEGER DEFAULT 0, created_by TEXT, created_at INTEGER NOT NULL, started_at INTEGER,
    completed_at INTEGER, workspace_kind TEXT NOT NULL DEFAULT 'scratch', workspace_path TEXT,
    branch_name TEXT, project_id TEXT, claim_lock TEXT, claim_expires INTEGER, tenant TEXT,
    result TEXT, idempotency_key TEXT, consecutive_failures INTEGER NOT NULL DEFAULT 0,
    worker_pid INTEGER, worker_started_at INTEGER, last_failure_error TEXT,
    max_runtime_seconds INTEGER, last_heartbeat_at INTEGER, current_run_id INTEGER,
    workflow_template_id TEXT, current_step_key TEXT, skills TEXT, model_override TEXT,
    provider_override TEXT, reasoning_effort TEXT, max_retries INTEGER,
    goal_mode INTEGER NOT NULL DEFAULT 0, goal_max_turns INTEGER, session_id TEXT,
    block_kind TEXT, block_recurrences INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS task_links (
    parent_id TEXT NOT NULL, child_id TEXT NOT NULL, PRIMARY KEY (parent_id, child_id)
);
CREATE TABLE IF NOT EXISTS task_comments (
    id INTEGER PRIMARY KEY AUTOINCREMENT, task_id TEXT NOT NULL,
    author TEXT NOT NULL, body TEXT NOT NULL, created_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS task_events (
    id INTEGER PRIMARY KEY AUTOINCREMENT, task_id TEXT NOT NULL, run_id INTEGER,
    kind TEXT NOT NULL, payload TEXT, created_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS task_runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT, task_id TEXT NOT NULL, profile TEXT, step_key TEXT,
    status TEXT NOT NULL, claim_lock TEXT, claim_expires INTEGER, worker_pid INTEGER,
    max_runtime_seconds INTEGER, last_heartbeat_at INTEGER,
    started_at INTEGER NOT NULL, ended_at INTEGER, outcome TEXT, summary TEXT, metadata TEXT,
    error TEXT
);
CREATE TABLE IF NOT EXISTS task_attachments (
    id INTEGER PRIMARY KEY AUTOINCREMENT, task_id TEXT NOT NULL, filename TEXT NOT NULL,
    stored_path TEXT NOT NULL, content_type TEXT, size INTEGER NOT NULL DEFAULT 0,
    uploaded_by TEXT, created_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS idx_tasks_status ON tasks(status);
CREATE INDEX IF NOT EXISTS idx_events_task ON task_events(task_id, created_at);
CREATE INDEX IF NOT EXISTS idx_runs_task ON task_runs(task_id, started_at);
";

#[test]
fn a_seed_system_board_is_read_without_writing_and_written_only_after_migrate() {
    let bench = Bench::new();
    let db = bench.path().join("seed.db");
    seed_board(&db);
    let run = |args: &[&str]| bench.on(&db).args(args).output().unwrap();
    let before = bytes_of(&db);
    for args in [
        &["ls"][..],
        &["ls", "--json"],
        &["show", "t_0123abcd"],
        &["events", "t_0123abcd"],
        &["watch", "--once"],
    ] {
        let output = run(args);
        assert!(
            output.status.success(),
            "{args:?}: {}",
            text(&output.stderr)
        );
        let shown = text(&output.stdout);
        assert!(
            shown.contains("seed card") || matches!(args[0], "events" | "watch"),
            "{args:?}: {shown}"
        );
    }
    assert_eq!(bytes_of(&db), before, "a read wrote the seed board");
    let add = run(&["add", "ours"]);
    assert_eq!(add.status.code(), Some(1));
    assert!(
        text(&add.stderr).contains("kanban migrate"),
        "{}",
        text(&add.stderr)
    );
    assert_eq!(
        bytes_of(&db),
        before,
        "a refused write wrote the seed board"
    );

    let migrated = run(&["migrate"]);
    assert!(migrated.status.success(), "{}", text(&migrated.stderr));
    let said = text(&migrated.stdout);
    assert!(said.contains("from schema 0 to"), "{said}");
    let backups: Vec<_> = std::fs::read_dir(bench.path())
        .unwrap()
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.to_string_lossy().ends_with(".backup"))
        .collect();
    assert_eq!(backups.len(), 1, "{backups:?}");
    assert_eq!(mode(&backups[0]), 0o600);
    let backup = rusqlite::Connection::open(&backups[0]).unwrap();
    let version: i64 = backup
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .unwrap();
    let title: String = backup
        .query_row("SELECT title FROM tasks", [], |row| row.get(0))
        .unwrap();
    assert_eq!(
        (version, title.as_str()),
        (0, "seed card"),
        "the backup is the board as it was"
    );

    let again = run(&["migrate"]);
    assert!(
        text(&again.stdout).contains("nothing to do"),
        "{}",
        text(&again.stdout)
    );
    let count = std::fs::read_dir(bench.path())
        .unwrap()
        .flatten()
        .filter(|entry| entry.path().to_string_lossy().ends_with(".backup"))
        .count();
    assert_eq!(count, 1, "a second migrate made another backup");
    assert!(run(&["add", "ours"]).status.success());
    let show = run(&["show", "t_0123abcd", "--json"]);
    assert!(show.status.success(), "{}", text(&show.stderr));
}

#[test]
fn a_zero_turn_limit_and_a_moment_out_of_range_are_refused_as_a_zero_lease_is() {
    let bench = Bench::new();
    let id = bench.add("card", &[]);
    for args in [
        &[
            "dispatch",
            "--once",
            "--agent",
            "true",
            "--turn-timeout",
            "0",
        ][..],
        &[
            "dispatch",
            "--once",
            "--agent",
            "true",
            "--turn-timeout",
            "0.5s",
        ],
        &["worker", "--agent", "true", "--turn-timeout", "0"],
    ] {
        let output = bench.run(args);
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        assert!(
            text(&output.stderr).contains("at least 1 second"),
            "{args:?}: {}",
            text(&output.stderr)
        );
    }
    let file = bench.path().join("kanban.toml");
    std::fs::write(
        &file,
        "[agents.a]\ncommand = \"true\"\nturn_timeout = \"0\"\n",
    )
    .unwrap();
    let output = bench.run(&["dispatch", "--once"]);
    assert_eq!(output.status.code(), Some(78));
    assert!(
        text(&output.stderr).contains("turn_timeout: \"0\" is too short"),
        "{}",
        text(&output.stderr)
    );
    std::fs::remove_file(&file).unwrap();
    assert_eq!(bench.show(&id)["task"]["status"], "ready");
    // Both forms of a moment take the same range: from now to a year out.
    let year = 366 * 24 * 3600;
    let at = |epoch: i64| jiff::Timestamp::from_second(epoch).unwrap().to_string();
    for (moment, says) in [
        ("+367d".to_owned(), "too long"),
        (at(crate::now() + year + 3600), "too far"),
        (at(crate::now() - 3600), "in the past"),
        ("1970-01-01T00:00:00Z".to_owned(), "in the past"),
        ("9999-12-30T00:00:00Z".to_owned(), "too far"),
    ] {
        bench.refused(&["add", "later", "--not-before", &moment], says);
    }
    for moment in ["+365d".to_owned(), at(crate::now() + year - 3600)] {
        bench.add("later", &["--not-before", &moment]);
    }
}

#[test]
fn a_seed_board_lists_its_lanes_and_statuses_we_do_not_know_as_they_are() {
    let bench = Bench::new();
    let db = bench.path().join("seed.db");
    seed_board(&db);
    {
        let conn = rusqlite::Connection::open(&db).unwrap();
        conn.execute_batch(
            "INSERT INTO tasks (id, title, status, created_at, block_kind, workspace_kind)
                  VALUES ('t_11111111', 'waits for triage', 'triage', 1700000001, 'needs_input', 'worktree'),
                         ('t_22222222', 'parked', 'scheduled', 1700000002, NULL, 'dir'),
                         ('t_33333333', 'from the future', 'frozen', 1700000003, NULL, 'scratch');
             INSERT INTO task_links (parent_id, child_id) VALUES ('t_11111111', 't_0123abcd');
             INSERT INTO task_events (task_id, kind, payload, created_at)
                  VALUES ('t_11111111', 'specified', '{\"by\": \"llm\"}', 1700000004),
                         ('t_22222222', 'scheduled', 'not json at all', 1700000005);",
        )
        .unwrap();
    }
    let run = |args: &[&str]| bench.on(&db).args(args).output().unwrap();
    // The seed system's own lanes, and one this build does not know.
    let unknown = [
        ("t_11111111", "triage"),
        ("t_22222222", "scheduled"),
        ("t_33333333", "frozen"),
    ];
    for stage in ["as the seed system wrote it", "after kanban migrate"] {
        let listed = run(&["ls"]);
        assert!(listed.status.success(), "{stage}: {}", text(&listed.stderr));
        let listed = text(&listed.stdout);
        let json = run(&["ls", "--json"]);
        assert!(json.status.success(), "{stage}: {}", text(&json.stderr));
        let cards: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
        for (id, status) in unknown {
            assert!(
                listed
                    .lines()
                    .any(|line| line.contains(id) && line.contains(status)),
                "{stage}: {listed}"
            );
            let card = cards
                .as_array()
                .unwrap()
                .iter()
                .find(|card| card["id"] == id)
                .unwrap_or_else(|| panic!("{stage}: {id} missing from {cards}"));
            assert_eq!(card["status"], status, "{stage}");
            for args in [&["show", id][..], &["show", id, "--json"], &["events", id]] {
                let output = run(args);
                assert!(
                    output.status.success(),
                    "{stage} {args:?}: {}",
                    text(&output.stderr)
                );
            }
        }
        let watch = run(&["watch", "--once"]);
        let counts = text(&watch.stdout);
        assert!(
            counts.contains("triage 1")
                && counts.contains("scheduled 1")
                && counts.contains("other 1"),
            "{stage}: {}",
            text(&watch.stdout)
        );
        if stage == "as the seed system wrote it" {
            // The server acts on the board: it asks for the upgrade first.
            let refused = run(&["serve", "--listen", "127.0.0.1:0"]);
            assert!(
                text(&refused.stderr).contains("kanban migrate"),
                "{}",
                text(&refused.stderr)
            );
            assert!(run(&["migrate"]).status.success());
            continue;
        }
        // The web board lists them, in a lane of their own.
        let mut serve = bench.on(&db);
        serve.args(["serve", "--listen", "127.0.0.1:0"]);
        let (mut child, url) = kanban_testkit::start_server(serve);
        let (status, page) = crate::serve::get(&format!("{url}/"));
        let (api_status, api) = crate::serve::get(&format!("{url}/api/cards?limit=1000"));
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!((status, api_status), (200, 200), "{stage}: {page} {api}");
        for (id, _) in unknown {
            assert!(page.contains(id) && api.contains(id), "{stage}: {id}");
        }
        for lane in ["triage", "scheduled", "other"] {
            assert!(
                page.contains(&format!(r#"data-lane="{lane}""#)),
                "{stage}: {lane}"
            );
        }
    }
    // Never claimed, never rewritten: a dispatcher takes only the ready card
    // (a parked card with no time waits for an unblock).
    let agent = bench.path().join("agent.sh");
    kanban_testkit::write_executable(&agent, "#!/bin/sh\nkanban complete --summary done\n");
    let dispatched = bench
        .on(&db)
        .args(["dispatch", "--until-idle", "--agent"])
        .arg(&agent)
        .output()
        .unwrap();
    assert!(dispatched.status.success(), "{}", text(&dispatched.stderr));
    let conn = rusqlite::Connection::open(&db).unwrap();
    for (id, status) in unknown {
        let (stored, runs): (String, i64) = conn
            .query_row(
                "SELECT status, (SELECT COUNT(*) FROM task_runs WHERE task_id = ?1) FROM tasks WHERE id = ?1",
                [id],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .unwrap();
        assert_eq!((stored.as_str(), runs), (status, 0), "{id}");
    }
    // An operator's change to one is refused by name, and changes nothing.
    let refused = run(&["cancel", "t_33333333"]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        text(&refused.stderr).contains("does not know"),
        "{}",
        text(&refused.stderr)
    );
}

#[test]
fn a_seed_worker_agent_is_checked_before_anything_runs() {
    let bench = Bench::new();
    let id = bench.add("for the seed worker", &["--assignee", "a"]);
    let fake = bench.path().join("bin/hermes");
    std::fs::create_dir_all(bench.path().join("bin")).unwrap();
    kanban_testkit::write_executable(&fake, "#!/bin/sh\nexit 0\n");
    let file = bench.path().join("kanban.toml");
    let fake_bin = format!("hermes_bin = \"{}\"\n", fake.display());
    for (entry, says) in [
        (
            format!("hermes = \"Bad Name\"\n{fake_bin}"),
            "is not a profile of the seed system",
        ),
        (
            format!("hermes = \"tmp\"\n{fake_bin}"),
            "the seed system reserves the profile name \"tmp\"",
        ),
        (
            format!("command = \"true\"\nhermes = \"coder\"\n{fake_bin}"),
            "give exactly one of `command`",
        ),
        (
            format!("command = \"true\"\n{fake_bin}"),
            "hermes_bin is for `hermes` agents",
        ),
        (
            "hermes = \"coder\"\nhermes_bin = \"bin/no-such-hermes\"\n".to_owned(),
            "no-such-hermes does not exist",
        ),
    ] {
        std::fs::write(&file, format!("[agents.a]\n{entry}")).unwrap();
        let output = bench.run(&["dispatch", "--once"]);
        assert_eq!(output.status.code(), Some(78), "{entry}");
        assert!(
            text(&output.stderr).contains(says),
            "{entry}: {}",
            text(&output.stderr)
        );
    }
    // Without hermes_bin: HERMES_BIN, else `hermes` on PATH, as the seed
    // system's dispatcher finds it.
    std::fs::write(&file, "[agents.a]\nhermes = \"coder\"\n").unwrap();
    let output = bench
        .command()
        .arg("--db")
        .arg(&bench.db)
        .args(["dispatch", "--once"])
        .env("PATH", "/nonexistent")
        .env_remove("HERMES_BIN")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(78));
    assert!(
        text(&output.stderr).contains("hermes is not on PATH"),
        "{}",
        text(&output.stderr)
    );
    std::fs::remove_file(&file).unwrap();
    let refused = bench.run(&["turn", "--agent", "hermes:coder", "hello"]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        text(&refused.stderr).contains("works a card it was claimed for"),
        "{}",
        text(&refused.stderr)
    );
    assert_eq!(bench.show(&id)["task"]["status"], "ready");
    assert!(crate::runs(&bench.show(&id)).is_empty());
    // A PostgreSQL board has no file for it to write.
    let pg = Bench::postgres();
    let output = pg
        .command()
        .arg("--db")
        .arg(&pg.db)
        .args(["dispatch", "--once", "--agent"])
        .arg("a=hermes:coder")
        .env("HERMES_BIN", &fake)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(78), "{}", text(&output.stderr));
    assert!(
        text(&output.stderr).contains("cannot work a PostgreSQL board"),
        "{}",
        text(&output.stderr)
    );
}

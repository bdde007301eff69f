//! `kanban dispatch` and `kanban demo` with real worker processes.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use kanban_testkit::{AgentScript, AgentTurn, WrittenAgent, write_executable};

use serde_json::Value;

use crate::{Bench, reaped, runs, text, wait_for};

const SUCCESS: &str = r#"{"completed": true, "final_response": "all done"}"#;

impl Bench {
    pub(crate) fn dispatch_command(&self, agent: &std::path::Path, extra: &[&str]) -> Command {
        let mut command = self.command();
        command
            .arg("--db")
            .arg(&self.db)
            .args([
                "dispatch",
                "--interval",
                "0.2",
                "--recovery-delays",
                "0",
                "--agent",
            ])
            .arg(agent)
            .args(extra)
            .env("HERMES_KANBAN_STOP_NUDGE", "0");
        command
    }

    pub(crate) fn dispatch_until_idle(&self, agent: &std::path::Path, extra: &[&str]) -> Output {
        let output = self
            .dispatch_command(agent, extra)
            .arg("--until-idle")
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "dispatch failed:\n{}\n{}",
            text(&output.stdout),
            text(&output.stderr)
        );
        output
    }

    pub(crate) fn event_kinds(&self, id: &str) -> Vec<String> {
        self.show(id)["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["kind"].as_str().unwrap().to_owned())
            .collect()
    }
}

fn agent(bench: &Bench, turns: Vec<AgentTurn>) -> WrittenAgent {
    AgentScript::new(turns).write(bench.path(), "agent.sh")
}

#[test]
fn a_clean_exit_without_a_terminal_call_is_a_protocol_violation_and_the_third_blocks() {
    let bench = Bench::new();
    let id = bench.add("chatty", &[]);
    let agent = agent(&bench, vec![AgentTurn::result(SUCCESS)]);
    let output = bench.dispatch_until_idle(&agent.path, &[]);
    let card = bench.show(&id);
    assert_eq!(
        card["task"]["status"],
        "blocked",
        "{}",
        text(&output.stdout)
    );
    assert_eq!(
        card["task"]["consecutive_failures"], 0,
        "violations are not counted as failures"
    );
    let outcomes: Vec<_> = runs(&card)
        .iter()
        .map(|r| r["outcome"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(outcomes, ["protocol_violation"; 3]);
    assert_eq!(
        bench
            .event_kinds(&id)
            .iter()
            .filter(|k| *k == "protocol_violation")
            .count(),
        3
    );
    let violation = bench.event(&id, "protocol_violation");
    assert_eq!(violation["payload"]["exit_code"], 0);
    assert!(
        violation["payload"]["output"]
            .as_str()
            .unwrap()
            .contains("all done"),
        "the booking carries the worker's last output"
    );
}

#[test]
fn exit_75_requeues_without_counting_and_holds_the_respawn() {
    let bench = Bench::new();
    let id = bench.add("walled", &[]);
    let agent = agent(
        &bench,
        vec![AgentTurn::result(
            r#"{"failed": true, "failure_retryable": true, "failure_reason": "rate_limit", "error": "429"}"#,
        )],
    );
    bench.dispatch_until_idle(&agent.path, &["--rate-limit-cooldown", "300"]);
    let card = bench.show(&id);
    assert_eq!(card["task"]["status"], "ready");
    assert_eq!(card["task"]["consecutive_failures"], 0);
    assert_eq!(runs(&card).len(), 1, "not respawned during the cooldown");
    assert_eq!(runs(&card)[0]["outcome"], "rate_limited");
    let held_until = card["task"]["not_before"].as_i64().expect("held");
    let booked_at = runs(&card)[0]["ended_at"].as_i64().unwrap();
    assert_eq!(held_until - booked_at, 300, "held for the cooldown");
    // The hold is the card's: another dispatcher, whatever its own cooldown,
    // does not respawn it inside the hold.
    bench.dispatch_until_idle(&agent.path, &["--rate-limit-cooldown", "0"]);
    assert_eq!(runs(&bench.show(&id)).len(), 1);
    // The wall is the agent's too: a new card bound for it waits as well,
    // uncharged and never spawned.
    let other = bench.add("bound for the same provider", &[]);
    bench.dispatch_until_idle(&agent.path, &["--rate-limit-cooldown", "0"]);
    assert_eq!(runs(&bench.show(&other)).len(), 0, "held by the wall");
    assert_eq!(bench.show(&other)["task"]["consecutive_failures"], 0);
    // A wall booked with no cooldown is claimed again at once.
    let bench = Bench::new();
    let quick = bench.add("walled briefly", &["--priority", "9"]);
    let agent = self::agent(
        &bench,
        vec![AgentTurn::result(
            r#"{"failed": true, "failure_retryable": true, "failure_reason": "rate_limit", "error": "429"}"#,
        )],
    );
    let once = bench
        .dispatch_command(&agent.path, &["--rate-limit-cooldown", "0", "--once"])
        .output()
        .unwrap();
    assert!(once.status.success());
    let pid = bench.show(&quick)["task"]["worker_pid"]
        .as_i64()
        .expect("the quick wall got a worker") as i32;
    wait_for("the quick wall's worker to exit", || {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_err()
    });
    let once = bench
        .dispatch_command(&agent.path, &["--rate-limit-cooldown", "0", "--once"])
        .output()
        .unwrap();
    assert!(once.status.success());
    assert!(
        runs(&bench.show(&quick)).len() >= 2,
        "booked and claimed again in one tick: {}",
        bench.show(&quick)
    );
}

#[test]
fn exit_78_blocks_at_once() {
    let bench = Bench::new();
    let id = bench.add("bad key", &[]);
    let agent = agent(
        &bench,
        vec![AgentTurn::result(
            r#"{"failed": true, "failure_retryable": false, "failure_reason": "auth", "error": "401"}"#,
        )],
    );
    bench.dispatch_until_idle(&agent.path, &[]);
    let card = bench.show(&id);
    assert_eq!(card["task"]["status"], "blocked");
    assert_eq!(runs(&card).len(), 1);
    assert_eq!(runs(&card)[0]["outcome"], "terminal_provider");
}

#[test]
fn a_crash_twice_blocks_at_the_failure_limit() {
    let bench = Bench::new();
    let id = bench.add("crasher", &[]);
    let agent = agent(&bench, vec![AgentTurn::exit(3)]);
    bench.dispatch_until_idle(&agent.path, &[]);
    let card = bench.show(&id);
    assert_eq!(
        (card["task"]["status"].as_str(), runs(&card).len()),
        (Some("ready"), 1),
        "a crashed card backs off before its next run"
    );
    let retry_at = card["task"]["not_before"].as_i64().expect("retry at");
    let crashed_at = runs(&card)[0]["ended_at"].as_i64().unwrap();
    assert!((30..=38).contains(&(retry_at - crashed_at)), "{card}");
    bench.dispatch_until_idle(&agent.path, &["--retry-backoff", "0"]);
    assert_eq!(runs(&bench.show(&id)).len(), 1, "the backoff is the card's");
    let id = bench.add("crasher without backoff", &[]);
    bench.dispatch_until_idle(&agent.path, &["--retry-backoff", "0"]);
    let card = bench.show(&id);
    assert_eq!(card["task"]["status"], "blocked");
    assert_eq!(card["task"]["consecutive_failures"], 2);
    let outcomes: Vec<_> = runs(&card)
        .iter()
        .map(|r| r["outcome"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(outcomes, ["crashed", "crashed"]);
    // A card's own --max-retries wins over the default.
    let id = bench.add("patient crasher", &["--max-retries", "3"]);
    bench.dispatch_until_idle(&agent.path, &["--retry-backoff", "0"]);
    assert_eq!(runs(&bench.show(&id)).len(), 3);
}

#[test]
fn a_worker_killed_with_sigkill_is_booked_crashed_from_the_wait_status() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let bench = Bench::new();
    let id = bench.add("victim", &["--max-retries", "1"]);
    let agent = bench.path().join("sleepy.sh");
    write_executable(&agent, "#!/bin/sh\ncat > /dev/null\nsleep 60\n");
    let child = bench
        .dispatch_command(&agent, &["--until-idle"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut pid = 0;
    wait_for("the worker pid", || {
        pid = bench.show(&id)["task"]["worker_pid"].as_i64().unwrap_or(0);
        pid != 0
    });
    kill(Pid::from_raw(pid as i32), Signal::SIGKILL).unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success());
    let card = bench.show(&id);
    assert_eq!(
        card["task"]["status"],
        "blocked",
        "{}",
        text(&output.stdout)
    );
    let crashed = bench.event(&id, "crashed");
    assert_eq!(crashed["payload"]["signal"], 9);
    assert_eq!(crashed["payload"]["source"], "wait");
    // The agent's own process group outlives a SIGKILLed worker; clean it up.
    let _ = nix::sys::signal::killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
}

#[test]
fn a_restarted_dispatcher_books_workers_that_died_while_it_was_away() {
    let bench = Bench::new();
    let id = bench.add("orphan", &[]);
    let agent = agent(
        &bench,
        vec![AgentTurn::result(
            r#"{"failed": true, "failure_retryable": false, "failure_reason": "billing", "error": "402"}"#,
        )],
    );
    // --once spawns the worker and leaves; the worker finishes on its own.
    assert!(
        bench
            .dispatch_command(&agent.path, &["--once"])
            .output()
            .unwrap()
            .status
            .success()
    );
    wait_for("the worker's result", || {
        bench.event_kinds(&id).iter().any(|k| k == "worker_result")
    });
    let pid = bench.show(&id)["task"]["worker_pid"].as_i64().unwrap();
    wait_for("the worker to exit", || {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), None).is_err()
    });
    assert!(
        bench
            .dispatch_command(&agent.path, &["--once"])
            .output()
            .unwrap()
            .status
            .success()
    );
    let booked = bench.event(&id, "rate_limited");
    assert_eq!(booked["payload"]["source"], "worker_result");
    assert_eq!(booked["payload"]["exit_code"], 75);

    // Without a worker_result, the log's trailer is the witness.
    let id = bench.add("orphan two", &[]);
    let agent = AgentScript::new(vec![AgentTurn::exit(3)]).write(bench.path(), "crash.sh");
    assert!(
        bench
            .dispatch_command(&agent.path, &["--once", "--rate-limit-cooldown", "0"])
            .output()
            .unwrap()
            .status
            .success()
    );
    wait_for("the second worker's result", || {
        bench.event_kinds(&id).iter().any(|k| k == "worker_result")
    });
    let pid = bench.show(&id)["task"]["worker_pid"].as_i64().unwrap();
    wait_for("the worker to exit", || {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), None).is_err()
    });
    let conn = rusqlite_free_delete(&bench.db, &id);
    assert!(conn, "the worker_result was removed");
    assert!(
        bench
            .dispatch_command(
                &agent.path,
                &[
                    "--once",
                    "--rate-limit-cooldown",
                    "0",
                    "--max-in-progress",
                    "1"
                ]
            )
            .output()
            .unwrap()
            .status
            .success()
    );
    let booked = bench.event(&id, "crashed");
    assert_eq!(booked["payload"]["source"], "trailer");
    assert_eq!(booked["payload"]["exit_code"], 1);
}

/// Deletes a card's worker_result events with the sqlite3 module of python3
/// (the test crate has no SQLite of its own).
fn rusqlite_free_delete(db: &std::path::Path, id: &str) -> bool {
    Command::new("python3")
        .args(["-c", "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.execute(\"DELETE FROM task_events WHERE task_id=? AND kind='worker_result'\", (sys.argv[2],)); c.commit()"])
        .arg(db)
        .arg(id)
        .status()
        .unwrap()
        .success()
}

#[test]
fn two_dispatchers_on_one_board_never_spawn_a_card_twice() {
    let bench = Bench::new();
    let ids: Vec<String> = (0..6)
        .map(|n| bench.add(&format!("card {n}"), &[]))
        .collect();
    let agent = agent(
        &bench,
        vec![AgentTurn::result(SUCCESS).completing().after("sleep 0.3")],
    );
    let first = bench
        .dispatch_command(&agent.path, &["--until-idle", "--max-in-progress", "3"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let second = bench
        .dispatch_command(&agent.path, &["--until-idle", "--max-in-progress", "3"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let outputs = [
        first.wait_with_output().unwrap(),
        second.wait_with_output().unwrap(),
    ];
    assert!(outputs.iter().all(|o| o.status.success()));
    let said: String = outputs.iter().map(|o| text(&o.stdout)).collect();
    assert!(said.contains("another dispatcher is ticking"), "{said}");
    for id in ids {
        let card = bench.show(&id);
        assert_eq!(card["task"]["status"], "done", "{id}");
        assert_eq!(runs(&card).len(), 1, "{id} was spawned once");
    }
}

#[test]
fn a_live_worker_keeps_its_claim_through_a_quiet_backoff() {
    // The worker fails its first turn and backs off 4 s with a 2 s lease:
    // nothing heartbeats during the backoff, but the worker is alive, so its
    // dispatcher renews the lease; the re-proof passes and the card finishes
    // in its first run.
    let bench = Bench::new();
    let id = bench.add("slow but alive", &[]);
    let agent = agent(
        &bench,
        vec![
            AgentTurn::result(
                r#"{"failed": true, "failure_retryable": true, "failure_reason": "timeout", "error": "reset"}"#,
            ),
            AgentTurn::result(SUCCESS).completing(),
        ],
    );
    let output = bench
        .dispatch_command(
            &agent.path,
            &["--until-idle", "--ttl", "2", "--recovery-delays", "4"],
        )
        .output()
        .unwrap();
    assert!(output.status.success());
    let card = bench.show(&id);
    assert_eq!(card["task"]["status"], "done", "{}", text(&output.stdout));
    assert_eq!(runs(&card).len(), 1, "not reclaimed");
    let run = &runs(&card)[0];
    let held = run["claim_expires"].as_i64().unwrap() - run["started_at"].as_i64().unwrap();
    assert!(held >= 4, "the lease was renewed past the backoff: {run}");
}

#[test]
fn shutdown_forwards_the_signal_and_books_the_interrupted_worker() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let bench = Bench::new();
    let id = bench.add("interrupted", &[]);
    let agent = bench.path().join("sleepy.sh");
    write_executable(&agent, "#!/bin/sh\ncat > /dev/null\nsleep 60\n");
    let child = bench
        .dispatch_command(&agent, &[])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for("the worker", || {
        bench.show(&id)["task"]["worker_pid"].as_i64().is_some()
    });
    std::thread::sleep(Duration::from_millis(300));
    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    let output = child.wait_with_output().unwrap();
    assert_eq!(
        output.status.code(),
        Some(130),
        "a stopped dispatcher exits 130, never 0: {}",
        text(&output.stdout)
    );
    let card = bench.show(&id);
    assert_eq!(card["task"]["status"], "ready", "{}", text(&output.stdout));
    assert_eq!(card["task"]["consecutive_failures"], 0, "not counted");
    assert_eq!(runs(&card)[0]["outcome"], "interrupted");
}

#[test]
fn the_demo_runs_and_prints_its_summary() {
    let bench = Bench::new();
    let started = Instant::now();
    let output = bench
        .command()
        .args(["demo", "--board-file"])
        .arg(bench.path().join("demo/kanban.db"))
        .output()
        .unwrap();
    let stdout = text(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        text(&output.stderr)
    );
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "the demo finishes in under a minute"
    );
    for needle in [
        "retrying the turn in place",
        "rate limited",
        "protocol violation",
        "CARD",
        "IN-PLACE RECOVERIES",
        "ready, retry in",
        "75 (rate limited)",
    ] {
        assert!(
            stdout.contains(needle),
            "the demo shows {needle:?}:\n{stdout}"
        );
    }
    let summary: Vec<&str> = stdout
        .lines()
        .skip_while(|l| !l.starts_with("CARD"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .collect();
    assert_eq!(summary.len(), 6, "{stdout}");
    assert!(
        summary
            .iter()
            .any(|l| l.contains("flaky parser") && l.contains("done") && l.contains(" 1 ")),
        "one recovery: {summary:?}"
    );
    assert!(
        summary
            .iter()
            .any(|l| l.contains("tidy the changelog") && l.contains("blocked")),
        "{summary:?}"
    );
}

#[test]
fn watch_once_shows_the_board() {
    let bench = Bench::new();
    bench.add("watched", &[]);
    let shown = bench.ok(&["watch", "--once"]);
    assert!(
        shown.contains("ready 1") && shown.contains("last events") && shown.contains("created"),
        "{shown}"
    );
}

#[test]
fn a_board_call_stuck_on_a_busy_lock_does_not_stall_reaping() {
    use nix::sys::signal::{Signal, kill, killpg};
    use nix::unistd::Pid;
    let bench = Bench::new();
    let first = bench.add("first", &[]);
    let second = bench.add("second", &[]);
    let agent = bench.path().join("slow.sh");
    write_executable(&agent, "#!/bin/sh\ncat > /dev/null\nsleep 30\n");
    let mut dispatcher = bench
        .dispatch_command(&agent, &["--max-in-progress", "3"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let pid_of = |id: &str| bench.show(id)["task"]["worker_pid"].as_i64();
    wait_for("both workers", || {
        pid_of(&first).is_some() && pid_of(&second).is_some()
    });
    // A third card keeps the dispatcher claiming: each tick writes.
    bench.add("third, to keep the dispatcher writing", &[]);
    let victim = pid_of(&first).unwrap() as i32;
    let lock = rusqlite::Connection::open(&bench.db).unwrap();
    lock.execute_batch("BEGIN IMMEDIATE").unwrap();
    let locked = Instant::now();
    std::thread::sleep(Duration::from_millis(500));
    killpg(Pid::from_raw(victim), Signal::SIGKILL).unwrap();
    let killed = Instant::now();
    while !reaped(victim) && killed.elapsed() < Duration::from_secs(4) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let reaped_after = killed.elapsed();
    assert!(
        reaped(victim),
        "the dead worker was not reaped while the board was locked"
    );
    assert!(
        locked.elapsed() < Duration::from_secs(5),
        "reaped while the lock was still held"
    );
    assert!(
        reaped_after < Duration::from_secs(1),
        "reaped within a second of its death, not after the lock: {reaped_after:?}"
    );
    std::thread::sleep(Duration::from_secs(5).saturating_sub(locked.elapsed()));
    lock.execute_batch("COMMIT").unwrap();
    wait_for("the exit booked once the board is free", || {
        runs(&bench.show(&first))
            .first()
            .is_some_and(|run| run["outcome"] == "crashed")
    });
    kill(Pid::from_raw(dispatcher.id() as i32), Signal::SIGTERM).unwrap();
    let status = dispatcher.wait().unwrap();
    assert_eq!(status.code(), Some(130));
}

#[test]
fn a_card_added_while_the_dispatcher_waits_out_a_long_interval_is_claimed_at_once() {
    let bench = Bench::new();
    let agent = agent(&bench, vec![AgentTurn::result(SUCCESS).completing()]);
    // A minute between ticks, as by default.
    let mut dispatcher = bench
        .command()
        .arg("--db")
        .arg(&bench.db)
        .args(["dispatch", "--agent"])
        .arg(&agent.path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Let it finish its first (empty) tick and start waiting.
    std::thread::sleep(Duration::from_secs(1));
    let id = bench.add("added while it waits", &[]);
    let added = Instant::now();
    let mut done = false;
    while added.elapsed() < Duration::from_secs(20) && !done {
        done = bench.show(&id)["task"]["status"] == "done";
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(dispatcher.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = dispatcher.wait();
    // Without the board watch the card waits for the next tick, 59 s away.
    assert!(done, "the card was not claimed until the next tick");
}

#[test]
fn kanban_logs_prints_a_cards_runs_one_run_and_follows_to_the_end() {
    let bench = Bench::new();
    let id = bench.add("logged", &[]);
    let marker = bench.path().join("ran-once");
    let agent = bench.path().join("two-runs.sh");
    write_executable(
        &agent,
        &format!(
            "#!/bin/sh\ncat > /dev/null\nif [ -e '{m}' ]; then echo 'second run output'; \"$KANBAN_BIN\" complete --summary ok >&2; echo '{{\"completed\": true}}'; exit 0; fi\ntouch '{m}'\necho 'first run output'\nexit 3\n",
            m = marker.display()
        ),
    );
    bench.dispatch_until_idle(&agent, &["--retry-backoff", "0"]);
    let card = bench.show(&id);
    assert_eq!(card["task"]["status"], "done");
    let run_ids: Vec<String> = runs(&card).iter().map(|r| r["id"].to_string()).collect();
    assert_eq!(run_ids.len(), 2);
    let all = bench.ok(&["logs", &id]);
    assert!(
        all.contains("first run output") && all.contains("second run output"),
        "{all}"
    );
    // A worker's closing lines, written for dispatchers, read as its exit.
    let raw = std::fs::read_to_string(bench.path().join("logs").join(format!("{id}.log"))).unwrap();
    assert!(raw.contains("[kanban-worker-exit] rc=0"), "{raw}");
    assert!(all.contains("\nexit 0\n"), "{all}");
    assert!(!all.contains("[kanban-worker-"), "{all}");
    let first = bench.ok(&["logs", &id, "--run", &run_ids[0]]);
    assert!(first.contains("first run output"), "{first}");
    assert!(!first.contains("second run output"), "{first}");
    let second = bench.ok(&["logs", &id, "--run", &run_ids[1]]);
    assert!(second.contains("second run output") && !second.contains("first run output"));
    // Following a card that no longer runs prints its log and ends.
    let started = Instant::now();
    let followed = bench.ok(&["logs", &id, "--follow"]);
    assert!(followed.contains("second run output"));
    assert!(started.elapsed() < Duration::from_secs(10));
    for (args, needle) in [
        (vec!["logs", id.as_str(), "--run", "999"], "has no run 999"),
        (
            vec!["logs", "t_00000000"],
            "t_00000000 is not on this board",
        ),
    ] {
        bench.refused(&args, needle);
    }
    let fresh = bench.add("never ran", &[]);
    let output = bench.run(&["logs", &fresh]);
    assert!(text(&output.stderr).contains("has not run yet"));
}

#[test]
fn a_long_log_is_moved_aside_and_a_turn_adds_a_bounded_amount() {
    let bench = Bench::new();
    let id = bench.add("loud", &[]);
    let logs = bench.path().join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    // An old log past the rotation size.
    std::fs::write(logs.join(format!("{id}.log")), vec![b'o'; 17 << 20]).unwrap();
    let agent = agent(
        &bench,
        vec![
            AgentTurn::result(SUCCESS)
                .completing()
                .after("head -c 9437184 /dev/zero | tr '\\0' 'x'"),
        ],
    );
    bench.dispatch_until_idle(&agent.path, &[]);
    assert_eq!(bench.show(&id)["task"]["status"], "done");
    let old = std::fs::metadata(logs.join(format!("{id}.log.1"))).unwrap();
    assert_eq!(old.len(), 17 << 20, "the old log was moved aside whole");
    let log = std::fs::read(logs.join(format!("{id}.log"))).unwrap();
    assert!(log.len() < 9 << 20, "{} bytes", log.len());
    assert!(log.len() > 8 << 20);
    let text = String::from_utf8_lossy(&log);
    assert!(text.contains("the agent printed more than 8 MiB this turn; the rest is not logged"));
}

#[test]
fn the_card_lifecycle_cancel_edit_archive_hold_release_not_before_every_prune() {
    let bench = Bench::new();
    // Cancel a running card: its dispatcher stops the worker and the agent.
    let long = bench.add("long", &[]);
    let (mut dispatcher, agent_pid) = dispatch_a_sleeping_agent(&bench);
    let said = bench.ok(&["cancel", &long, "--reason", "not needed"]);
    assert!(said.contains("cancelled"), "{said}");
    wait_for("the cancelled card's agent to stop", || gone(agent_pid));
    let card = bench.show(&long);
    assert_eq!(card["task"]["status"], "archived");
    assert_eq!(runs(&card)[0]["outcome"], "cancelled");
    assert_eq!(
        bench.event(&long, "cancelled")["payload"]["reason"],
        "not needed"
    );
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(dispatcher.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = dispatcher.wait();
    assert!(
        !bench.ok(&["ls"]).contains(&long),
        "archived cards are hidden"
    );
    assert!(bench.ok(&["ls", "--archived"]).contains(&long));

    // Edit, hold and release, a delayed card, a recurring one.
    let held = bench.add("held", &["--priority", "1"]);
    bench.ok(&["edit", &held, "--title", "held, renamed", "--priority", "7"]);
    let card = bench.show(&held);
    assert_eq!(card["task"]["title"], "held, renamed");
    assert_eq!(card["task"]["priority"], 7);
    assert_eq!(
        bench.event(&held, "edited")["payload"]["fields"],
        serde_json::json!(["title", "priority"])
    );
    bench.ok(&["hold", &held, "--reason", "waiting for the key"]);
    assert!(bench.ok(&["ls"]).contains("held: waiting for the key"));
    let later = bench.add("later", &["--not-before", "+1h"]);
    let recurring = bench.add("nightly", &["--every", "1d"]);
    let agent = agent(&bench, vec![AgentTurn::result(SUCCESS).completing()]);
    bench.dispatch_until_idle(&agent.path, &[]);
    assert_eq!(
        runs(&bench.show(&held)).len(),
        0,
        "a held card is not claimed"
    );
    assert_eq!(runs(&bench.show(&later)).len(), 0, "not before its time");
    assert_eq!(bench.show(&recurring)["task"]["status"], "done");
    let next = bench.event(&recurring, "recurred")["payload"]["next"]
        .as_str()
        .unwrap()
        .to_owned();
    let next_card = bench.show(&next);
    assert_eq!(next_card["task"]["title"], "nightly");
    assert_eq!(next_card["task"]["every_seconds"], 86_400);
    let created = bench.show(&recurring)["task"]["created_at"]
        .as_i64()
        .unwrap();
    assert_eq!(
        next_card["task"]["not_before"].as_i64().unwrap(),
        created + 86_400
    );
    bench.ok(&["release", &held]);
    bench.dispatch_until_idle(&agent.path, &[]);
    assert_eq!(bench.show(&held)["task"]["status"], "done");
    assert_eq!(
        runs(&bench.show(&next)).len(),
        0,
        "one occurrence at a time"
    );

    // Refusals name the card and change nothing.
    for (args, needle) in [
        (vec!["release", held.as_str()], "is not held"),
        (vec!["edit", held.as_str()], "nothing to edit"),
        (vec!["archive", held.as_str()], ""),
        (vec!["cancel", held.as_str()], "cannot cancel it"),
        (
            vec!["edit", held.as_str(), "--priority", "1"],
            "cannot edit it",
        ),
        (
            vec!["add", "x", "--not-before", "tomorrow"],
            "is not a time",
        ),
    ] {
        let output = bench.run(&args);
        if needle.is_empty() {
            assert!(output.status.success());
            continue;
        }
        assert_eq!(output.status.code(), Some(1), "{args:?}");
        assert!(
            text(&output.stderr).contains(needle),
            "{args:?}: {}",
            text(&output.stderr)
        );
    }

    // Prune: done and archived cards idle past the cutoff, with their logs
    // and their attached files.
    assert!(bench.path().join(format!("logs/{held}.log")).exists());
    let file = bench.path().join("kept.txt");
    std::fs::write(&file, "x").unwrap();
    bench.ok(&["attach", &held, file.to_str().unwrap()]);
    let files = bench.path().join("attachments").join(&held);
    assert!(files.join("kept.txt").exists());
    // An hour, not a second: a slow machine can take a second to get here.
    let dry = bench.ok(&["prune", "--older-than", "1h", "--dry-run"]);
    assert!(dry.is_empty(), "nothing is an hour old yet: {dry}");
    std::thread::sleep(Duration::from_millis(2100));
    let dry = bench.ok(&["prune", "--older-than", "1s", "--dry-run"]);
    assert!(
        dry.contains(&held) && dry.contains(&long) && !dry.contains(&later),
        "{dry}"
    );
    assert_eq!(
        bench.show(&held)["task"]["status"],
        "archived",
        "a dry run deletes nothing"
    );
    let pruned = bench.ok(&["prune", "--older-than", "1s"]);
    assert!(pruned.contains(&held));
    assert!(
        !bench.path().join(format!("logs/{held}.log")).exists(),
        "its log went too"
    );
    assert!(!files.exists(), "and its files");
    assert_eq!(bench.run(&["show", &held]).status.code(), Some(1));
    assert_eq!(bench.show(&later)["task"]["status"], "scheduled");
}

#[test]
fn an_agents_file_routes_cards_by_assignee_with_each_agents_limits_and_environment() {
    let bench = Bench::new();
    let seen = bench.path().join("seen");
    let running = bench.path().join("running");
    std::fs::create_dir_all(&running).unwrap();
    // The reviewer notes how many of its runs overlap; the coder notes its
    // environment and times its first turn out.
    let reviewer = bench.path().join("reviewer.sh");
    write_executable(
        &reviewer,
        &format!(
            "#!/bin/sh\ncat > /dev/null\ntouch '{r}'/$$\necho \"reviewer $HERMES_KANBAN_TASK $(ls '{r}' | wc -l)\" >> '{s}'\nsleep 0.5\nrm '{r}'/$$\n\"$KANBAN_BIN\" complete --summary reviewed >&2 || exit $?\necho '{{\"completed\": true}}'\n",
            r = running.display(),
            s = seen.display()
        ),
    );
    let coder = bench.path().join("coder.sh");
    // Its first turn outlives its 1 s limit.
    write_executable(
        &coder,
        &format!(
            "#!/bin/sh\ncat > /dev/null\necho \"coder $HERMES_KANBAN_TASK $CODER_PROFILE turn $KANBAN_TURN\" >> '{s}'\nif [ \"$KANBAN_TURN\" = 1 ]; then sleep 5; fi\n\"$KANBAN_BIN\" complete --summary coded >&2 || exit $?\necho '{{\"completed\": true}}'\n",
            s = seen.display()
        ),
    );
    std::fs::write(
        bench.path().join("kanban.toml"),
        format!(
            "default = \"coder\"\n\n[agents.coder]\ncommand = \"{}\"\nturn_timeout = \"1s\"\nrecovery_delays = \"0\"\nenv = {{ CODER_PROFILE = \"strict\" }}\n\n[agents.reviewer]\ncommand = \"{}\"\nmax_in_progress = 1\n",
            coder.display(),
            reviewer.display()
        ),
    )
    .unwrap();
    let unassigned = bench.add("write it", &[]);
    let reviews: Vec<String> = (0..3)
        .map(|n| bench.add(&format!("review {n}"), &["--assignee", "reviewer"]))
        .collect();
    let refused = bench.run(&["add", "lost", "--assignee", "ghost"]);
    assert_eq!(refused.status.code(), Some(1));
    let said = text(&refused.stderr);
    assert!(
        said.contains("no agent of that name") && said.contains("coder, reviewer"),
        "{said}"
    );
    let refused = bench.run(&["edit", &reviews[0], "--assignee", "ghost"]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(text(&refused.stderr).contains("no agent of that name"));

    // No --agent: the file's agents serve.
    let output = bench
        .command()
        .arg("--db")
        .arg(&bench.db)
        .args([
            "dispatch",
            "--until-idle",
            "--interval",
            "0.2",
            "--max-in-progress",
            "4",
        ])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output.stderr));
    let log = std::fs::read_to_string(&seen).unwrap();
    assert!(
        log.contains(&format!("coder {unassigned} strict turn 1")),
        "{log}"
    );
    // The coder's own turn limit (1 s, not the dispatcher's 30 m) stopped it.
    let coded = bench.show(&unassigned);
    assert_eq!(runs(&coded)[0]["outcome"], "timed_out");
    assert!(
        runs(&coded)[0]["summary"]
            .as_str()
            .unwrap_or("")
            .contains("1 s deadline")
            || runs(&coded)[0]["error"]
                .as_str()
                .unwrap_or("")
                .contains("1 s deadline"),
        "{coded}"
    );
    for id in &reviews {
        assert!(
            log.contains(&format!("reviewer {id} 1")),
            "one reviewer at a time: {log}"
        );
        assert_eq!(bench.show(id)["task"]["status"], "done");
    }

    // A broken file stops the dispatcher before any claim, naming the fix.
    std::fs::write(
        bench.path().join("kanban.toml"),
        "[agents.coder]\ncommand = \"./x\"\nhttp = \"y\"\n",
    )
    .unwrap();
    bench.add("waits", &[]);
    let output = bench
        .command()
        .arg("--db")
        .arg(&bench.db)
        .args(["dispatch", "--once"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(78));
    assert!(
        text(&output.stderr).contains("give exactly one of `command`"),
        "{}",
        text(&output.stderr)
    );
}

#[test]
fn an_agents_file_others_could_change_or_with_bad_keys_is_refused_before_any_claim() {
    use std::os::unix::fs::PermissionsExt as _;
    let bench = Bench::new();
    let id = bench.add("waits", &[]);
    let agent = bench.path().join("agent.sh");
    kanban_testkit::write_executable(&agent, "#!/bin/sh\nexit 0\n");
    let file = bench.path().join("kanban.toml");
    let dispatch = || {
        bench
            .command()
            .arg("--db")
            .arg(&bench.db)
            .args(["dispatch", "--once"])
            .output()
            .unwrap()
    };
    let refused = |contents: &str, mode: u32, says: &str| {
        std::fs::write(&file, contents).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
        let output = dispatch();
        assert_eq!(output.status.code(), Some(78), "{contents} {mode:o}");
        assert!(
            text(&output.stderr).contains(says),
            "{contents} {mode:o}: {}",
            text(&output.stderr)
        );
        assert_eq!(
            bench.show(&id)["task"]["status"],
            "ready",
            "nothing claimed"
        );
    };
    let good = format!("[agents.coder]\ncommand = \"{}\"\n", agent.display());
    refused(&good, 0o664, "chmod go-w");
    refused(&good, 0o646, "chmod go-w");
    for (key, says) in [
        ("\"\" = \"x\"", "env key \"\""),
        ("\"A=B\" = \"x\"", "env key \"A=B\""),
    ] {
        refused(&format!("{good}env = {{ {key} }}\n"), 0o644, says);
    }
    refused(
        &format!("{good}provider = \"agent:other#12ab34cd\"\n"),
        0o644,
        "`agent:` names are the agents' own",
    );
    refused(
        "[agents.coder]\nhttp = \"http://127.0.0.1:9/v1?model=m\"\nprovider = \"p\"\n",
        0o644,
        "provider is for command agents",
    );
    // Another user's file: ownership moved to nobody.
    std::fs::write(&file, &good).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    nix::unistd::chown(&file, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
    let output = dispatch();
    assert_eq!(output.status.code(), Some(78));
    assert!(
        text(&output.stderr).contains("belongs to another user"),
        "{}",
        text(&output.stderr)
    );
    // Owner-only writes and a declared provider: it runs.
    std::fs::remove_file(&file).unwrap();
    std::fs::write(&file, format!("{good}provider = \"anthropic:team\"\n")).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let output = dispatch();
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
}

#[test]
fn hand_claims_ours_and_the_seed_systems_are_left_until_their_lease_lapses() {
    let bench = Bench::new();
    let ours = bench.add("claimed by hand", &[]);
    let theirs = bench.add("claimed by the seed system's hand", &[]);
    let carrier = bench.claim(&ours, Some(600));
    let lock = &carrier
        .iter()
        .find(|(name, _)| name == kanban_core::vars::CLAIM_LOCK)
        .unwrap()
        .1;
    let (host, nonce) = lock.split_once(":claim:").expect("HOST:claim:NONCE");
    assert_eq!(host, nix::unistd::gethostname().unwrap().to_str().unwrap());
    assert!(
        nonce.len() == 32 && nonce.bytes().all(|b| b.is_ascii_hexdigit()),
        "128 random bits: {lock}"
    );
    // The seed system's hand claim: `HOST:PID` of a CLI process that has
    // already exited, a live lease, no worker pid.
    bench.claim(&theirs, Some(600));
    let mut exited = std::process::Command::new("true").spawn().unwrap();
    let pid = exited.id();
    exited.wait().unwrap();
    let seed_lock = format!("{host}:{pid}");
    let db = rusqlite::Connection::open(&bench.db).unwrap();
    for table in ["tasks", "task_runs"] {
        let column = if table == "tasks" { "id" } else { "task_id" };
        db.execute(
            &format!("UPDATE {table} SET claim_lock = ?1 WHERE {column} = ?2"),
            rusqlite::params![seed_lock, theirs],
        )
        .unwrap();
    }
    drop(db);
    let agent = bench.path().join("agent.sh");
    write_executable(&agent, "#!/bin/sh\nkanban complete --summary done\n");
    let output = bench
        .command()
        .arg("--db")
        .arg(&bench.db)
        .args(["dispatch", "--once", "--agent"])
        .arg(&agent)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output.stderr));
    for (id, lock) in [(&ours, lock.as_str()), (&theirs, seed_lock.as_str())] {
        let card = bench.show(id);
        assert_eq!(card["task"]["status"], "running", "{id} left alone: {card}");
        assert_eq!(card["task"]["claim_lock"], lock, "{id}");
        assert_eq!(runs(&card).len(), 1, "{id}: nothing spawned for it");
    }
}

#[test]
fn the_dispatchers_lines_name_each_card_by_its_title_cut_to_fit() {
    let bench = Bench::new();
    let id = bench.add(
        "write the introduction to the user guide, then the chapter on walls",
        &[],
    );
    let bell = bench.add("ring\u{1b}]0;owned\u{7} the bell", &[]);
    let agent = bench.path().join("agent.sh");
    write_executable(
        &agent,
        "#!/bin/sh\ncat > /dev/null\n\"$KANBAN_BIN\" complete --summary done >&2 || exit $?\necho '{\"completed\": true}'\n",
    );
    let output = bench.dispatch_until_idle(&agent, &[]);
    let log = text(&output.stdout);
    let titled = format!("{id} \"write the introduction to the user guid…\"");
    assert!(
        log.contains(&format!("{titled} spawned worker"))
            && log.contains(&format!("{titled} worker exited 0")),
        "{log}"
    );
    assert!(
        log.contains(&format!(
            "{bell} \"ring\\u{{1b}}]0;owned\\u{{7}} the bell\" spawned"
        )),
        "control characters are shown escaped: {log}"
    );
    assert!(!log.contains('\u{1b}'), "{log}");
}

#[test]
fn an_agent_gets_each_variable_under_both_names_and_the_seed_name_wins() {
    let bench = Bench::new();
    let id = bench.add("read the names", &[]);
    let dump = bench.path().join("env");
    let agent = bench.path().join("agent.sh");
    write_executable(
        &agent,
        &format!(
            "#!/bin/sh\ncat > /dev/null\nenv > '{}'\n\"$KANBAN_BIN\" complete --summary read >&2 || exit $?\necho '{{\"completed\": true}}'\n",
            dump.display()
        ),
    );
    // The bench's dispatch sets HERMES_KANBAN_STOP_NUDGE=0.
    let output = bench
        .dispatch_command(&agent, &["--until-idle"])
        .env("KANBAN_TURN_RECOVERY", "2")
        .env("KANBAN_STOP_NUDGE", "1")
        .env_remove("HERMES_KANBAN_TURN_RECOVERY")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output.stderr));
    let env = std::fs::read_to_string(&dump).unwrap();
    let value = |name: &str| {
        env.lines()
            .find_map(|line| line.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("no {name} in {env}"))
            .to_owned()
    };
    assert_eq!(value("HERMES_KANBAN_TASK"), id);
    for name in [
        "TASK",
        "DB",
        "RUN_ID",
        "CLAIM_LOCK",
        "BOARD",
        "TURN_RECOVERY",
        "STOP_NUDGE",
    ] {
        assert_eq!(
            value(&format!("KANBAN_{name}")),
            value(&format!("HERMES_KANBAN_{name}")),
            "{name}"
        );
    }
    assert_eq!(value("HERMES_KANBAN_TURN_RECOVERY"), "2", "ours stands in");
    assert_eq!(value("KANBAN_STOP_NUDGE"), "0", "the seed name wins");
    assert_eq!(bench.show(&id)["task"]["status"], "done");
}

#[test]
fn a_workers_environment_holds_no_secret_its_agent_could_read() {
    let bench = Bench::new();
    let id = bench.add("read the worker", &[]);
    let dump = bench.path().join("environ");
    let agent = bench.path().join("agent.sh");
    // The agent reads its worker's environment, as any process of the same
    // user can, then finishes its card through that worker.
    write_executable(
        &agent,
        &format!(
            r#"#!/bin/sh
p=$$
while [ "$p" -gt 1 ] && [ "$(cat /proc/$p/comm)" != kanban ]; do p=$(awk '{{print $4}}' /proc/$p/stat); done
tr '\0' '\n' < /proc/$p/environ > '{dump}'
kanban complete --summary read
"#,
            dump = dump.display()
        ),
    );
    let output = bench
        .command()
        .env("PGPASSWORD", "s3cret-pw")
        .arg("--db")
        .arg(&bench.db)
        .args(["dispatch", "--until-idle", "--agent"])
        .arg(&agent)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output.stderr));
    let environ = std::fs::read_to_string(&dump).unwrap();
    assert!(
        environ
            .lines()
            .any(|line| line.starts_with("HERMES_KANBAN_TASK=")),
        "that was the worker: {environ}"
    );
    for secret in [
        "KANBAN_WORKER_SEAL=",
        "KANBAN_DISPATCH_SOCKET=",
        "PGPASSWORD=",
        "s3cret-pw",
    ] {
        assert!(!environ.contains(secret), "{secret} in {environ}");
    }
    let card = bench.show(&id);
    assert_eq!(card["task"]["status"], "done", "{card}");
    // Its exit was read from its sealed trailer's pair of lines, alone.
    let log = std::fs::read_to_string(bench.path().join("logs").join(format!("{id}.log"))).unwrap();
    assert!(
        log.contains("[kanban-worker-end] rc=0 seal=")
            && log.trim_end().ends_with("[kanban-worker-exit] rc=0"),
        "{log}"
    );
}

#[test]
fn a_relative_agent_command_is_read_from_the_agents_files_folder() {
    let bench = Bench::new();
    let id = bench.add("write it", &["--assignee", "writer"]);
    let agents = bench.path().join("agents");
    std::fs::create_dir(&agents).unwrap();
    kanban_testkit::write_executable(
        &agents.join("writer.sh"),
        "#!/bin/sh\ncat > /dev/null\n\"$KANBAN_BIN\" complete --summary \"written $1\" >&2 || exit $?\necho '{\"completed\": true}'\n",
    );
    let file = bench.path().join("kanban.toml");
    let elsewhere = bench.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let dispatch = || {
        bench
            .command()
            .current_dir(&elsewhere)
            .arg("--db")
            .arg(&bench.db)
            .args(["dispatch", "--until-idle", "--interval", "0.2"])
            .output()
            .unwrap()
    };

    // Missing: the error names the file, the agent, the key and the path
    // as resolved, and nothing is claimed.
    std::fs::write(
        &file,
        "[agents.writer]\ncommand = \"./agents/missing.sh\"\n",
    )
    .unwrap();
    let output = dispatch();
    assert_eq!(output.status.code(), Some(78));
    let said = text(&output.stderr);
    let resolved = agents.join("missing.sh");
    for needle in [
        file.to_str().unwrap(),
        "agent writer",
        resolved.to_str().unwrap(),
        "`command`",
    ] {
        assert!(said.contains(needle), "{needle}: {said}");
    }
    assert!(!said.contains("--agent"), "{said}");
    assert_eq!(bench.show(&id)["task"]["status"], "ready");

    // Present, with an argument after it: run from another folder, the
    // worker gets the program's absolute path and the argument as written.
    std::fs::write(
        &file,
        "[agents.writer]\ncommand = \"./agents/writer.sh 'in full'\"\n",
    )
    .unwrap();
    let output = dispatch();
    assert!(output.status.success(), "{}", text(&output.stderr));
    let card = bench.show(&id);
    assert_eq!(card["task"]["status"], "done", "{card}");
    assert_eq!(runs(&card)[0]["summary"], "written in full", "{card}");
}

/// A running card parked by `kanban schedule` loses its claim: its
/// dispatcher stops the worker and the agent, and claims it again only once
/// it is back in line.
#[test]
fn scheduling_a_running_card_stops_its_agent_until_it_is_back_in_line() {
    let bench = Bench::new();
    let parked = bench.add("parked while it runs", &[]);
    let (mut dispatcher, agent_pid) = dispatch_a_sleeping_agent(&bench);
    let said = bench.ok(&["schedule", &parked, "after", "lunch"]);
    assert!(said.contains("scheduled"), "{said}");
    wait_for("the parked card's agent to stop", || gone(agent_pid));
    let card = bench.show(&parked);
    assert_eq!(card["task"]["status"], "scheduled");
    assert_eq!(runs(&card)[0]["outcome"], "scheduled");
    assert_eq!(runs(&card).len(), 1, "not claimed while parked");
    // Back in line: the same dispatcher claims it again.
    bench.ok(&["unblock", &parked]);
    wait_for("the card's second run", || {
        runs(&bench.show(&parked)).len() == 2
    });
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(dispatcher.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = dispatcher.wait();
}

/// A dispatcher whose agent sleeps a minute, once its agent started: the
/// dispatcher and the agent's pid.
fn dispatch_a_sleeping_agent(bench: &Bench) -> (std::process::Child, i32) {
    let agent_pids = bench.path().join("agent-pids");
    let sleeper = bench.path().join("sleeper.sh");
    write_executable(
        &sleeper,
        &format!(
            "#!/bin/sh\ncat > /dev/null\necho $$ >> '{}'\nsleep 60\n",
            agent_pids.display()
        ),
    );
    let dispatcher = bench
        .dispatch_command(&sleeper, &[])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for("the agent to start", || {
        std::fs::read_to_string(&agent_pids).is_ok_and(|pids| pids.ends_with('\n'))
    });
    let agent_pid = std::fs::read_to_string(&agent_pids)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    (dispatcher, agent_pid)
}

/// Whether process `pid` is gone (or only its zombie is left).
fn gone(pid: i32) -> bool {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_err() || reaped(pid)
}

/// `dispatch --dry-run` says what one tick would claim and why not the
/// rest, writes nothing, and the tick that follows claims just those.
fn a_dry_run_foresees_the_tick(bench: &Bench) {
    let crasher = agent(bench, vec![AgentTurn::exit(3)]);
    // A card that crashed once waits out its backoff in the ready lane.
    let backing_off = bench.add("backing off", &[]);
    bench.dispatch_until_idle(&crasher.path, &[]);
    let agents = bench.path().join("agents.toml");
    let command = crasher.path.display();
    std::fs::write(
        &agents,
        format!(
            "default = \"plain\"\n\
             [agents.coder]\ncommand = \"{command}\"\nmax_in_progress = 1\n\
             [agents.plain]\ncommand = \"{command}\"\n"
        ),
    )
    .unwrap();
    let first = bench.add("coder first", &["--assignee", "coder", "--priority", "5"]);
    let second = bench.add("coder second", &["--assignee", "coder", "--priority", "4"]);
    let plain = bench.add("plain", &["--priority", "3"]);
    let nobody = bench.add("for nobody", &["--assignee", "reviewer", "--priority", "2"]);
    let third = bench.add("plain again", &["--priority", "1"]);
    let last = bench.add("no slot left", &[]);
    let parent = bench.add("waited for", &["--blocked"]);
    bench.add("waiting", &["--parent", &parent]);
    let ids = [
        &backing_off,
        &first,
        &second,
        &plain,
        &nobody,
        &third,
        &last,
    ];
    let state = || -> Vec<Value> {
        ids.iter()
            .map(|id| {
                let card = bench.show(id);
                serde_json::json!([card["task"], card["runs"], card["events"]])
            })
            .collect()
    };
    let before = state();
    let args = [
        "--agents",
        agents.to_str().unwrap(),
        "dispatch",
        "--max-in-progress",
        "3",
    ];
    let mut dry = args.to_vec();
    dry.extend(["--dry-run", "--json"]);
    let preview: Value = serde_json::from_str(&bench.ok(&dry)).unwrap();
    assert_eq!(state(), before, "a dry run writes nothing");
    assert_eq!(preview["dry_run"], true);
    assert_eq!(preview["slots"], 3);
    assert_eq!(preview["running_here"], 0);
    assert_eq!(preview["more"], false);
    assert!(preview["now"].is_i64() && preview["host"].is_string());
    let verdict = |id: &str| -> Value {
        preview["cards"]
            .as_array()
            .unwrap()
            .iter()
            .find(|card| card["task_id"] == id)
            .unwrap_or_else(|| panic!("{id} not in {preview}"))
            .clone()
    };
    let said = |id: &str| verdict(id)["verdict"].as_str().unwrap().to_owned();
    assert_eq!(said(&first), "claim");
    assert_eq!(verdict(&first)["route"], "coder");
    assert_eq!(said(&second), "agent_full");
    assert_eq!(said(&plain), "claim");
    assert_eq!(verdict(&plain)["route"], "plain");
    assert_eq!(said(&nobody), "no_agent");
    assert_eq!(said(&third), "claim");
    assert_eq!(said(&last), "no_room");
    assert_eq!(said(&backing_off), "waits");
    assert_eq!(
        verdict(&backing_off)["until"],
        bench.show(&backing_off)["task"]["not_before"]
    );
    assert_eq!(preview["skipped_unassigned"], serde_json::json!([nobody]));
    assert_eq!(
        preview["elsewhere"],
        serde_json::json!({"blocked": 1, "todo": 1})
    );
    let foreseen: Vec<&str> = preview["spawned"]
        .as_array()
        .unwrap()
        .iter()
        .map(|spawned| spawned["task_id"].as_str().unwrap())
        .collect();
    assert_eq!(foreseen, [first.as_str(), plain.as_str(), third.as_str()]);
    let human = bench.ok(&[&args[..], &["--dry-run"]].concat());
    assert!(
        human.contains("3 of 7 would be claimed")
            && human.contains("no agent serves \"reviewer\"")
            && human.contains("1 todo (wait for their parents)"),
        "{human}"
    );

    // The tick itself claims just those.
    let mut once = args.to_vec();
    once.push("--once");
    bench.ok(&once);
    let ran: Vec<&str> = ids
        .iter()
        .zip(&before)
        .filter(|(id, was)| runs(&bench.show(id)).len() > was[1].as_array().unwrap().len())
        .map(|(id, _)| id.as_str())
        .collect();
    assert_eq!(ran, foreseen);
}

#[test]
fn a_dry_run_foresees_the_tick_on_sqlite() {
    a_dry_run_foresees_the_tick(&Bench::new());
}

#[test]
fn a_dry_run_foresees_the_tick_on_postgresql() {
    a_dry_run_foresees_the_tick(&Bench::postgres());
}

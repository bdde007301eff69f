//! `kanban worker` and `kanban turn` against real agent scripts, one test per
//! call-site case of the seed.

use std::path::Path;

use kanban_testkit::{AgentScript, AgentTurn, write_executable, write_judge};

use crate::{Bench, last_line, text};

const FAILED: &str = r#"{"failed": true, "failure_retryable": true, "failure_reason": "timeout", "error": "peer closed connection"}"#;
const SUCCESS: &str = r#"{"completed": true, "final_response": "all done"}"#;

fn failed(reason: &str) -> String {
    format!(
        r#"{{"failed": true, "failure_retryable": true, "failure_reason": "{reason}", "error": "wall"}}"#
    )
}

struct Case {
    code: i32,
    entries: usize,
    stdout: String,
    stderr: String,
    requests: Vec<serde_json::Value>,
}

fn run_case(
    turns: Vec<AgentTurn>,
    env: &[(&str, &str)],
    claim_ttl: Option<i64>,
    extra: &[&str],
) -> (Bench, String, Case) {
    let bench = Bench::new();
    let id = bench.add("recover", &["--body", "the body"]);
    let carrier = bench.claim(&id, claim_ttl);
    let agent = AgentScript::new(turns).write(bench.path(), "agent.sh");
    let output = bench.worker(&carrier, &agent.path, env, extra);
    let case = Case {
        code: output.status.code().unwrap_or(-1),
        entries: agent.requests().len(),
        stdout: text(&output.stdout),
        stderr: text(&output.stderr),
        requests: agent.requests(),
    };
    (bench, id, case)
}

#[test]
fn recovers_in_place() {
    let (bench, id, case) = run_case(
        vec![
            AgentTurn::result(FAILED),
            AgentTurn::result(SUCCESS).completing(),
        ],
        &[],
        None,
        &[],
    );
    assert_eq!(case.code, 0, "{}", case.stderr);
    assert_eq!(case.entries, 2);
    assert_eq!(case.requests[0]["kind"], "initial");
    assert_eq!(case.requests[1]["kind"], "recovery");
    let nudge = case.requests[1]["message"].as_str().unwrap();
    assert!(
        nudge.contains("Do NOT start over") && nudge.contains(&id),
        "{nudge}"
    );
    assert_eq!(
        case.requests[0]["session_id"], case.requests[1]["session_id"],
        "the same session"
    );
    assert_eq!(case.requests[0]["task"]["body"], "the body");
    let run = bench.show(&id)["runs"][0]["id"].clone();
    assert_eq!(
        case.requests[0]["fence_token"], run,
        "the run id is the fencing token"
    );
    assert_eq!(case.requests[1]["fence_token"], run);
    assert_eq!(bench.show(&id)["task"]["status"], "done");
    assert_eq!(
        closing_lines(&case.stderr),
        [
            "[kanban-worker-end] rc=0 alone",
            "[kanban-worker-exit] rc=0"
        ]
    );
    assert_eq!(
        last_line(case.stdout.as_bytes()),
        "all done",
        "the last stdout line is the reply"
    );
}

#[test]
fn budget_exhausted_stops_and_releases() {
    let (_, _, case) = run_case(
        vec![AgentTurn::result(FAILED)],
        &[("HERMES_KANBAN_TURN_RECOVERY", "1")],
        None,
        &[],
    );
    assert_eq!(case.code, 75, "{}", case.stderr);
    assert_eq!(case.entries, 2);
    assert_eq!(
        closing_lines(&case.stderr),
        [
            "[kanban-worker-end] rc=75 alone",
            "[kanban-worker-exit] rc=75"
        ]
    );
}

#[test]
fn single_turn_route_outcomes() {
    let rows = [
        ("nothing-settled", "null".to_owned(), 1),
        (
            "denial-unfinished-turn",
            r#"{"partial": true, "completed": false, "final_response": "cut off"}"#.to_owned(),
            1,
        ),
        ("quota-wall", failed("rate_limit"), 75),
        ("billing-wall", failed("billing"), 75),
        ("upstream-quota-wall", failed("upstream_rate_limit"), 75),
    ];
    for (id, result, code) in rows {
        let (_, _, case) = run_case(vec![AgentTurn::result(&result)], &[], None, &[]);
        assert_eq!(case.code, code, "{id}: {}", case.stderr);
        assert_eq!(case.entries, 1, "{id}");
        assert_eq!(
            closing_lines(&case.stderr),
            [
                format!("[kanban-worker-end] rc={code} alone"),
                format!("[kanban-worker-exit] rc={code}")
            ],
            "{id}"
        );
    }
}

/// The last two lines of a worker's stderr: the detail line and the trailer.
fn closing_lines(stderr: &str) -> [String; 2] {
    let lines: Vec<&str> = stderr.trim_end().lines().collect();
    let at = lines.len().saturating_sub(2);
    [0, 1].map(|offset| lines.get(at + offset).copied().unwrap_or("").to_owned())
}

/// The seed system's dispatcher reads a dead worker's exit code from its
/// log with this expression, the last match winning (`hermes-kanban.md` §2.4).
const SEED_TRAILER: &str = r"(?m)^\[kanban-worker-exit\] rc=(\d+)\s*$";

#[test]
fn the_seed_systems_trailer_expression_reads_every_exit_code_of_a_real_worker() {
    let seed = regex::Regex::new(SEED_TRAILER).unwrap();
    let rows = [
        (SUCCESS.to_owned(), true, 0),
        ("null".to_owned(), false, 1),
        (failed("rate_limit"), false, 75),
        (failed("auth"), false, 78),
        (
            r#"{"interrupted": true, "final_response": "stopped"}"#.to_owned(),
            false,
            130,
        ),
    ];
    for (result, completing, code) in rows {
        let turn = AgentTurn::result(&result);
        let turn = if completing { turn.completing() } else { turn };
        let (_, _, case) = run_case(vec![turn], &[], None, &[]);
        assert_eq!(case.code, code, "{result}: {}", case.stderr);
        let read = seed
            .captures_iter(&case.stderr)
            .last()
            .and_then(|found| found[1].parse::<i32>().ok());
        assert_eq!(
            read,
            Some(code),
            "{result}: the seed reads {read:?} from\n{}",
            case.stderr
        );
    }
}

/// Expires the claim's lease from inside the agent's turn.
const EXPIRE_LEASE: &str = r#"python3 -c "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.execute('UPDATE tasks SET claim_expires=1'); c.execute('UPDATE task_runs SET claim_expires=1'); c.commit()" "$HERMES_KANBAN_DB""#;

#[test]
fn claim_denial_stops_before_model_reentry() {
    let (_, _, case) = run_case(
        vec![AgentTurn::result(FAILED).after(EXPIRE_LEASE)],
        &[],
        None,
        &[],
    );
    assert_eq!(case.code, 75, "{}", case.stderr);
    assert_eq!(case.entries, 1);
    assert!(
        case.stderr.contains("no longer holds a live run/claim"),
        "{}",
        case.stderr
    );
}

#[test]
fn a_lease_that_expires_during_the_backoff_blocks_reentry() {
    // A 2 s lease, a 4 s backoff: the proof before the sleep holds, the one after does not.
    let (_, _, case) = run_case(
        vec![AgentTurn::result(FAILED)],
        &[],
        Some(2),
        &["--recovery-delays", "4"],
    );
    assert_eq!(case.code, 75, "{}", case.stderr);
    assert_eq!(case.entries, 1);
    assert!(
        case.stderr.contains("attempt 1/3"),
        "the attempt was authorised: {}",
        case.stderr
    );
    assert!(
        case.stderr.contains("no longer holds a live run/claim"),
        "{}",
        case.stderr
    );
}

#[test]
fn goal_mode_does_not_continue() {
    let interrupted = r#"{"interrupted": true, "failed": true, "failure_retryable": true, "failure_reason": "timeout"}"#;
    let settled = r#"{"failed": true, "failure_retryable": true, "failure_reason": "timeout", "turn_exit_reason": "max_iterations_reached(60/60)"}"#;
    let partial = r#"{"partial": true, "completed": false}"#;
    // (id, agent turns, extra environment, exit code, model entries)
    type Row<'a> = (&'a str, Vec<AgentTurn>, Vec<(&'a str, &'a str)>, i32, usize);
    let rows: Vec<Row> = vec![
        (
            "recovery-denied",
            vec![AgentTurn::result(FAILED).after(EXPIRE_LEASE)],
            vec![],
            75,
            1,
        ),
        (
            "quota-wall-billing",
            vec![AgentTurn::result(&failed("billing"))],
            vec![],
            75,
            1,
        ),
        (
            "quota-wall-upstream",
            vec![AgentTurn::result(&failed("upstream_rate_limit"))],
            vec![],
            75,
            1,
        ),
        (
            "interrupt",
            vec![AgentTurn::result(interrupted)],
            vec![],
            130,
            1,
        ),
        (
            "terminal-settlement",
            vec![AgentTurn::result(settled)],
            vec![],
            75,
            1,
        ),
        (
            "budget-exhausted",
            vec![AgentTurn::result(FAILED)],
            vec![("HERMES_KANBAN_TURN_RECOVERY", "1")],
            75,
            2,
        ),
        (
            "unfinished-nonfailed",
            vec![AgentTurn::result(partial)],
            vec![],
            1,
            1,
        ),
    ];
    for (id, turns, env, code, entries) in rows {
        let bench = Bench::new();
        let card = bench.add("goal card", &["--goal", "--goal-max-turns", "3"]);
        let carrier = bench.claim(&card, None);
        let agent = AgentScript::new(turns).write(bench.path(), "agent.sh");
        let (judge, calls) = write_judge(bench.path(), "continue");
        let output = bench.worker(
            &carrier,
            &agent.path,
            &env,
            &["--judge", judge.to_str().unwrap()],
        );
        assert_eq!(
            output.status.code(),
            Some(code),
            "{id}: {}",
            text(&output.stderr)
        );
        assert_eq!(agent.requests().len(), entries, "{id}");
        assert!(!calls.exists(), "{id}: the judge was never asked");
    }
    // The lease that expires during the backoff, in goal mode.
    let (_, _, case) = run_case(
        vec![AgentTurn::result(FAILED)],
        &[("HERMES_KANBAN_GOAL_MODE", "1")],
        Some(2),
        &["--recovery-delays", "4", "--judge", "false"],
    );
    assert_eq!(
        (case.code, case.entries),
        (75, 1),
        "lease-expired-during-backoff: {}",
        case.stderr
    );
}

#[test]
fn a_judge_is_handed_neither_the_workers_seal_nor_the_boards_password() {
    let bench = Bench::new();
    let card = bench.add("judged", &["--goal"]);
    let carrier = bench.claim(&card, None);
    let agent = AgentScript::new(vec![AgentTurn::result(
        r#"{"completed": true, "final_response": "an answer"}"#,
    )])
    .write(bench.path(), "agent.sh");
    let said = bench.path().join("judge.said");
    let judge = bench.path().join("judge.sh");
    write_executable(
        &judge,
        &format!(
            "#!/bin/sh\ncat > /dev/null\n\
             echo \"seal=${{KANBAN_WORKER_SEAL-none}} password=${{PGPASSWORD-none}}\" >> '{}'\n\
             printf '%s\\n' '{{\"verdict\": \"blocked\", \"reason\": \"scripted\"}}'\n",
            said.display()
        ),
    );
    let output = bench.worker(
        &carrier,
        &agent.path,
        &[
            ("KANBAN_WORKER_SEAL", "s3cret-seal"),
            ("PGPASSWORD", "hunter2"),
        ],
        &["--judge", judge.to_str().unwrap()],
    );
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let said = std::fs::read_to_string(said).unwrap();
    assert_eq!(said, "seal=none password=none\n");
    assert_eq!(
        bench.show(&card)["task"]["status"],
        "blocked",
        "the judge was asked"
    );
}

#[test]
fn goal_mode_continues_after_a_successful_authorized_recovery() {
    let bench = Bench::new();
    let card = bench.add("goal card", &["--goal"]);
    let carrier = bench.claim(&card, None);
    let agent = AgentScript::new(vec![
        AgentTurn::result(FAILED),
        AgentTurn::result(r#"{"completed": true, "final_response": "recovered answer"}"#),
    ])
    .write(bench.path(), "agent.sh");
    let (judge, calls) = write_judge(bench.path(), "blocked");
    let output = bench.worker(
        &carrier,
        &agent.path,
        &[],
        &["--judge", judge.to_str().unwrap()],
    );
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert_eq!(agent.requests().len(), 2);
    let calls = std::fs::read_to_string(calls).unwrap();
    let first: serde_json::Value = serde_json::from_str(calls.lines().next().unwrap()).unwrap();
    assert_eq!(
        first["last_response"], "recovered answer",
        "the judge sees the RECOVERED response"
    );
    assert_eq!(first["goal"], "goal card");
    assert_eq!(
        bench.show(&card)["task"]["status"],
        "blocked",
        "the judge ruled it unachievable"
    );
}

#[test]
fn stop_nudges_follow_a_reply_without_a_terminal_call() {
    let (bench, id, case) = run_case(
        vec![AgentTurn::result(SUCCESS)],
        &[("HERMES_KANBAN_STOP_NUDGE", "1")],
        None,
        &[],
    );
    assert_eq!(case.code, 0);
    assert_eq!(case.entries, 3, "the turn and two stop nudges");
    assert_eq!(case.requests[1]["kind"], "stop_nudge");
    assert_eq!(
        bench.show(&id)["task"]["status"],
        "running",
        "the dispatcher will book a protocol violation"
    );
    let (_, _, case) = run_case(
        vec![AgentTurn::result(SUCCESS)],
        &[("HERMES_KANBAN_STOP_NUDGE", "off")],
        None,
        &[],
    );
    assert_eq!(case.entries, 1, "off disables the stop nudge");
}

#[test]
fn agents_without_a_result_line_are_read_by_their_exit_status() {
    let rows = [
        (
            AgentTurn::exit(0).after("echo plain text reply"),
            0,
            "plain text reply",
        ),
        (AgentTurn::exit(75), 75, ""),
        (AgentTurn::exit(3), 1, ""),
    ];
    for (turn, code, reply) in rows {
        let (_, _, case) = run_case(
            vec![turn],
            &[
                ("HERMES_KANBAN_TURN_RECOVERY", "0"),
                ("HERMES_KANBAN_STOP_NUDGE", "0"),
            ],
            None,
            &[],
        );
        assert_eq!(case.code, code, "{}", case.stderr);
        if !reply.is_empty() {
            assert_eq!(last_line(case.stdout.as_bytes()), reply);
        }
    }
}

#[test]
fn a_real_sigint_during_a_turn_stops_the_agent_group_and_exits_130() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let bench = Bench::new();
    let id = bench.add("long job", &[]);
    let carrier = bench.claim(&id, None);
    let pids = bench.path().join("pids");
    let agent = bench.path().join("slow.sh");
    write_executable(
        &agent,
        &format!(
            "#!/bin/sh\ncat > /dev/null\nsleep 300 &\necho $! > '{}'\nwait\n",
            pids.display()
        ),
    );
    let child = spawn_worker(&bench, &carrier, &agent, &["--grace", "5"]);
    let started = std::time::Instant::now();
    while !pids.exists() || std::fs::read_to_string(&pids).unwrap().trim().is_empty() {
        assert!(started.elapsed().as_secs() < 20, "the agent never started");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let grandchild: i32 = std::fs::read_to_string(&pids)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    kill(Pid::from_raw(child.id() as i32), Signal::SIGINT).unwrap();
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(130), "{}", text(&output.stderr));
    assert_eq!(
        closing_lines(&text(&output.stderr)),
        [
            "[kanban-worker-end] rc=130 alone",
            "[kanban-worker-exit] rc=130"
        ]
    );
    assert!(gone(grandchild), "the agent's process group is gone");
    assert!(started.elapsed().as_secs() < 20);
}

#[test]
fn a_missing_carrier_is_refused_before_any_agent_runs() {
    let bench = Bench::new();
    let id = bench.add("x", &[]);
    let carrier = bench.claim(&id, None);
    let agent = AgentScript::new(vec![AgentTurn::result(SUCCESS)]).write(bench.path(), "agent.sh");
    for missing in [
        "HERMES_KANBAN_TASK",
        "HERMES_KANBAN_DB",
        "HERMES_KANBAN_RUN_ID",
        "HERMES_KANBAN_CLAIM_LOCK",
    ] {
        let partial: Vec<_> = carrier
            .iter()
            .filter(|(k, _)| k != missing)
            .cloned()
            .collect();
        let output = bench.worker(&partial, &agent.path, &[], &[]);
        assert_eq!(output.status.code(), Some(1));
        assert!(
            text(&output.stderr).contains(missing),
            "{missing}: {}",
            text(&output.stderr)
        );
    }
    assert!(agent.requests().is_empty(), "no agent ran");
}

#[test]
fn a_stale_workers_terminal_call_is_refused_and_the_board_unchanged() {
    let bench = Bench::new();
    let id = bench.add("contested", &[]);
    let stale = bench.claim(&id, None);
    bench.ok(&["reclaim", &id]);
    let before = bench.show(&id);
    let output = bench
        .command()
        .envs(stale.iter().map(|(k, v)| (k, v)))
        .args(["complete", "--summary", "zombie"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("no longer holds the claim") && stderr.contains("nothing was changed"),
        "{stderr}"
    );
    let after = bench.show(&id);
    assert_eq!(after["task"], before["task"], "the card is unchanged");
    assert_eq!(after["runs"], before["runs"], "the runs are unchanged");
    let kinds: Vec<_> = after["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        kinds.last().map(String::as_str),
        Some("stale_write_rejected")
    );
    for args in [
        vec!["block", "--reason", "x"],
        vec!["heartbeat"],
        vec!["comment", "x"],
    ] {
        let output = bench
            .command()
            .envs(stale.iter().map(|(k, v)| (k, v)))
            .args(&args)
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(1), "{args:?}");
    }
}

#[test]
fn one_shot_turn_prints_its_text_and_session() {
    let bench = Bench::new();
    let agent = AgentScript::new(vec![AgentTurn::result(r#"{"failed": true, "failure_reason": "rate_limit", "final_response": "API call failed after 3 retries", "session_id": "stored"}"#)])
        .write(bench.path(), "agent.sh");
    let output = bench
        .command()
        .args(["turn", "--agent"])
        .arg(&agent.path)
        .arg("hello")
        .output()
        .unwrap();
    assert_eq!(
        output.status.code(),
        Some(1),
        "not a worker: a quota wall is 1, never 75"
    );
    assert!(text(&output.stdout).contains("API call failed"));
    assert!(text(&output.stderr).contains("session_id: stored"));
    assert_eq!(agent.requests().len(), 1, "one turn, no recovery");
    assert_eq!(agent.requests()[0]["message"], "hello");
    let ok = AgentScript::new(vec![AgentTurn::result(SUCCESS)]).write(bench.path(), "ok.sh");
    let output = bench
        .command()
        .args(["turn", "--agent"])
        .arg(&ok.path)
        .arg("hi")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(last_line(&output.stdout), "all done");
}

#[test]
fn one_shot_turn_shows_the_agents_stderr_and_tells_it_the_task_given() {
    let bench = Bench::new();
    let agent = bench.path().join("complain.sh");
    let request = bench.path().join("request.json");
    kanban_testkit::write_executable(
        &agent,
        &format!(
            "#!/bin/sh\ncat > '{}'\necho 'no API key: set MY_KEY' >&2\nexit 1\n",
            request.display()
        ),
    );
    let turn = |args: &[&str]| {
        bench
            .command()
            .arg("--db")
            .arg(&bench.db)
            .arg("turn")
            .arg("--agent")
            .arg(&agent)
            .args(args)
            .output()
            .unwrap()
    };
    let sent = || -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(&request).unwrap()).unwrap()
    };

    let output = turn(&[
        "--id",
        "t_try",
        "--title",
        "fix the README",
        "--body",
        "the install line",
    ]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        text(&output.stderr).contains("no API key: set MY_KEY"),
        "the agent's own words: {}",
        text(&output.stderr)
    );
    let asked = sent();
    assert_eq!(asked["task"]["id"], "t_try");
    assert_eq!(asked["task"]["title"], "fix the README");
    assert_eq!(asked["task"]["body"], "the install line");
    assert_eq!(
        asked["message"],
        "work kanban task t_try: fix the README\n\nthe install line"
    );

    // A card of the board, named by the start of its id, read and never
    // claimed; a message given is sent instead of the card's first one.
    let id = bench.add("write the docs", &["--body", "all of them"]);
    bench.ok(&["comment", &id, "mind the tone"]);
    let short = &id["t_".len().."t_".len() + 6];
    turn(&["--card", short, "begin"]);
    let asked = sent();
    assert_eq!(asked["task"]["id"], id.as_str());
    assert_eq!(asked["task"]["title"], "write the docs");
    assert_eq!(asked["task"]["comments"][0]["body"], "mind the tone");
    assert_eq!(asked["message"], "begin");
    assert_eq!(
        bench.show(&id)["task"]["status"],
        "ready",
        "nothing claimed"
    );

    // No message and no task: refused, saying what to give.
    std::fs::remove_file(&request).unwrap();
    let output = turn(&[]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        text(&output.stderr).contains("needs a message"),
        "{}",
        text(&output.stderr)
    );
    assert!(!request.exists(), "the agent never ran");
}

/// True when `pid` no longer runs: absent, or a zombie waiting for its reaper.
fn gone(pid: i32) -> bool {
    let started = std::time::Instant::now();
    while started.elapsed().as_secs() < 5 {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => return true,
            Ok(stat)
                if stat
                    .rsplit(')')
                    .next()
                    .is_some_and(|rest| rest.trim_start().starts_with('Z')) =>
            {
                return true;
            }
            Ok(_) => std::thread::sleep(std::time::Duration::from_millis(50)),
        }
    }
    false
}

/// An agent whose board calls name a board that does not exist: they can
/// only go through if its worker makes them.
fn calls_through_the_worker(bench: &Bench, body: &str) -> std::path::PathBuf {
    let said = bench.path().join("said");
    write_executable(
        &bench.path().join("agent.sh"),
        &format!(
            "#!/bin/sh\ncat > /dev/null\nsaid='{}'\necho \"socket=$KANBAN_WORKER_SOCKET\" >> \"$said\"\n\
             real_db=\"$HERMES_KANBAN_DB\"\nexport HERMES_KANBAN_DB=/nonexistent/board.db\n{body}\n",
            said.display()
        ),
    );
    said
}

#[test]
fn an_agents_board_calls_are_made_by_its_worker_with_the_workers_claim() {
    let bench = Bench::new();
    let id = bench.add("through the worker", &[]);
    let carrier = bench.claim(&id, None);
    let said = calls_through_the_worker(
        &bench,
        "echo \"password=${PGPASSWORD-none}\" >> \"$said\"\n\
         HERMES_KANBAN_DB=\"$real_db\" \"$KANBAN_BIN\" fence check > /dev/null; echo \"fence=$?\" >> \"$said\"\n\
         \"$KANBAN_BIN\" comment 'from the agent'; echo \"comment=$?\" >> \"$said\"\n\
         \"$KANBAN_BIN\" heartbeat --note busy; echo \"heartbeat=$?\" >> \"$said\"\n\
         HERMES_KANBAN_RUN_ID=999999 \"$KANBAN_BIN\" comment 'not this run'; echo \"other run=$?\" >> \"$said\"\n\
         \"$KANBAN_BIN\" complete --summary 'done by proxy'; echo \"complete=$?\" >> \"$said\"\n\
         HERMES_KANBAN_DB=\"$real_db\" \"$KANBAN_BIN\" fence check 2> /dev/null; echo \"fence after=$?\" >> \"$said\"\n\
         echo '{\"completed\": true}'",
    );
    let output = bench.worker(
        &carrier,
        &bench.path().join("agent.sh"),
        &[("PGPASSWORD", "hunter2")],
        &[],
    );
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let said = std::fs::read_to_string(said).unwrap();
    assert!(said.contains("socket=@kanban-worker-"), "{said}");
    // The agent is handed no database password: it needs none.
    assert!(said.contains("password=none\n"), "{said}");
    // Its fence proof (which the worker answers when the claim and board
    // are its own: the unit test of the wire shows it does) is live while
    // the run is, and not once its own terminal call closed it.
    assert!(said.contains("fence=0\n"), "{said}");
    assert!(said.contains("fence after=1\n"), "{said}");
    // The worker made these on its own board, with its own claim.
    assert!(said.contains("comment=0\n"), "{said}");
    assert!(said.contains("heartbeat=0\n"), "{said}");
    assert!(said.contains("complete=0\n"), "{said}");
    // A call for another run is not the worker's to make: the agent's own
    // carrier names a board that cannot be opened, which is the
    // environment's fault (75), and nothing is written.
    assert!(said.contains("other run=75\n"), "{said}");
    let card = bench.show(&id);
    assert_eq!(card["task"]["status"], "done", "{card}");
    let comments: Vec<&str> = card["comments"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["body"].as_str())
        .collect();
    assert_eq!(comments, vec!["from the agent"]);
    assert!(bench.event(&id, "heartbeat")["payload"]["note"] == "busy");
}

#[test]
fn a_call_the_workers_claim_no_longer_covers_is_refused_by_the_worker() {
    let bench = Bench::new();
    let id = bench.add("taken away", &[]);
    let carrier = bench.claim(&id, None);
    let db = bench.db.display().to_string();
    let said = calls_through_the_worker(
        &bench,
        &format!(
            "\"$KANBAN_BIN\" --db '{db}' reclaim \"$HERMES_KANBAN_TASK\" > /dev/null\n\
             \"$KANBAN_BIN\" complete --summary late 2> \"$said.err\"; echo \"complete=$?\" >> \"$said\"\n\
             echo '{{\"completed\": true}}'"
        ),
    );
    bench.worker(&carrier, &bench.path().join("agent.sh"), &[], &[]);
    let said_text = std::fs::read_to_string(&said).unwrap();
    assert!(said_text.contains("complete=1\n"), "{said_text}");
    let err = std::fs::read_to_string(said.with_extension("err")).unwrap();
    assert!(
        err.contains("no longer holds the claim") && err.contains("hint:"),
        "{err}"
    );
    let card = bench.show(&id);
    assert_ne!(card["task"]["status"], "done", "{card}");
}

/// `kanban worker` on `carrier`'s claim with `agent`, its output piped,
/// started once `args` are added.
fn spawn_worker(
    bench: &Bench,
    carrier: &[(String, String)],
    agent: &Path,
    args: &[&str],
) -> std::process::Child {
    bench
        .command()
        .envs(carrier.iter().map(|(k, v)| (k, v)))
        .arg("worker")
        .arg("--agent")
        .arg(agent)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits up to 20 s for the file the agent writes once it got to `what`.
fn wait_for(ready: &Path, what: &str) {
    let started = std::time::Instant::now();
    while !ready.exists() {
        assert!(started.elapsed().as_secs() < 20, "the agent never {what}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The zombies among `pid`'s children, each with its `/proc` stat line.
fn zombie_children(pid: u32) -> Vec<String> {
    let mut zombies = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let children = std::fs::read_to_string(task.unwrap().path().join("children")).unwrap();
        for child in children.split_ascii_whitespace() {
            let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
            let state = stat.rsplit_once(')').map(|(_, rest)| rest.trim_start());
            if state.is_some_and(|rest| rest.starts_with('Z')) {
                zombies.push(stat);
            }
        }
    }
    zombies
}

#[test]
fn orphans_that_end_while_the_agent_works_are_reaped_then() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let bench = Bench::new();
    let id = bench.add("long run", &[]);
    let carrier = bench.claim(&id, None);
    let ready = bench.path().join("ready");
    // Two orphans that end 0.2 s after their parents: one that left for a
    // session of its own, one still in the agent's group. The agent works on.
    let agent = bench.path().join("spawner.sh");
    write_executable(
        &agent,
        &format!(
            "#!/bin/sh\ncat > /dev/null\nsh -c 'setsid sleep 0.2 &'\nsh -c 'sleep 0.2 &'\nsleep 1.5\necho ready > '{}'\nexec sleep 300\n",
            ready.display()
        ),
    );
    let child = spawn_worker(&bench, &carrier, &agent, &[]);
    wait_for(&ready, "got going");
    let zombies = zombie_children(child.id());
    kill(Pid::from_raw(child.id() as i32), Signal::SIGINT).unwrap();
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(130), "{}", text(&output.stderr));
    assert!(zombies.is_empty(), "zombies of the worker: {zombies:#?}");
}

#[test]
fn a_stopped_agents_wrapper_leaves_no_zombie_to_hold_the_turn_for_its_grace() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let bench = Bench::new();
    let id = bench.add("wrapped", &[]);
    let carrier = bench.claim(&id, None);
    let ready = bench.path().join("ready");
    // The agent's child ignores the stop and ends 0.3 s after the agent
    // itself: an orphan of the worker's by then, and a zombie of it once
    // it ends.
    let agent = bench.path().join("wrapper.sh");
    write_executable(
        &agent,
        &format!(
            "#!/bin/sh\ncat > /dev/null\n( trap '' INT TERM; sleep 0.3 ) &\necho ready > '{}'\nexec sleep 300\n",
            ready.display()
        ),
    );
    let child = spawn_worker(&bench, &carrier, &agent, &["--grace", "8"]);
    wait_for(&ready, "started");
    let stopped = std::time::Instant::now();
    kill(Pid::from_raw(child.id() as i32), Signal::SIGINT).unwrap();
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(130), "{}", text(&output.stderr));
    assert!(
        stopped.elapsed() < std::time::Duration::from_secs(4),
        "the stop took {:?} of its 8 s grace",
        stopped.elapsed()
    );
}

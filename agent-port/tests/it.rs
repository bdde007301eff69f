//! kanban-agent-port: the protocol's reading rules as a table, real child
//! processes, and property tests over hostile inputs (the same inputs the
//! fuzz targets in testkit/fuzz take).

#![allow(
    clippy::too_many_lines,
    reason = "the length rule is for src/: a test or a benchmark reads best whole"
)]
#![allow(
    clippy::disallowed_methods,
    clippy::disallowed_types,
    reason = "tests and benchmarks read their knobs from the environment and drive real processes and files"
)]

use std::sync::Arc;
use std::time::Duration;

use kanban_agent_port::Activity;
use kanban_agent_port::{
    AgentExit, BoardTools, ExecAgent, ExecAgentConfig, Forward, McpServer, ResultLine, SeedWorker,
    SeedWorkerTurn, TaskBrief, parse_chat_completion, parse_chat_stream, parse_result_line,
    parse_verdict, seed_worker_args, seed_worker_session, settle_seed_worker, settle_turn,
};
use kanban_board_sqlite::SqliteBoard;
use kanban_core::{
    BoardAdmin, FailureReason, NewTask, TurnInput, TurnKind, TurnRunner, VerdictKind,
};
use kanban_testkit::{VirtualClock, block_on, memory_board, write_executable};
use proptest::prelude::*;

#[test]
fn result_lines_are_read_from_the_end() {
    let rows: Vec<(&str, &str, ResultLine)> = vec![
        ("no JSON at all", "hello\nworld\n", ResultLine::Absent),
        (
            "null settles nothing",
            "thinking\nnull\n",
            ResultLine::NothingSettled,
        ),
        (
            "a bare number is text",
            "{\"completed\": true}\n42\n",
            ResultLine::Result(kanban_core::TurnResult {
                completed: Some(true),
                ..Default::default()
            }),
        ),
        (
            "the last object wins",
            "{\"failed\": true}\n{\"completed\": true}\n",
            ResultLine::Result(kanban_core::TurnResult {
                completed: Some(true),
                ..Default::default()
            }),
        ),
        (
            "blank lines are skipped",
            "{\"partial\": true}\n\n  \n",
            ResultLine::Result(kanban_core::TurnResult {
                partial: Some(true),
                ..Default::default()
            }),
        ),
    ];
    for (case, stdout, expected) in rows {
        assert_eq!(parse_result_line(stdout), expected, "{case}");
    }
    assert!(
        matches!(
            parse_result_line("{\"failed\": \"yes\"}"),
            ResultLine::Invalid { .. }
        ),
        "a wrong type is invalid, not ignored"
    );
}

#[test]
fn exit_statuses_settle_a_turn_without_a_result_line() {
    let settle = |exit| {
        settle_turn("line one\nthe reply\n", exit, "s1")
            .unwrap()
            .unwrap()
    };
    let ok = settle(AgentExit::Code(0));
    assert_eq!(
        (ok.completed, ok.final_response.as_deref()),
        (Some(true), Some("line one\nthe reply"))
    );
    let wall = settle(AgentExit::Code(75));
    assert_eq!(
        (wall.failure_reason, wall.failure_retryable),
        (Some(FailureReason::Overloaded), Some(true))
    );
    let crash = settle(AgentExit::Code(3));
    assert_eq!(
        (crash.failure_reason, crash.failure_retryable),
        (Some(FailureReason::Unknown), Some(false))
    );
    let killed = settle(AgentExit::Signal(9));
    assert_eq!(killed.failure_reason, Some(FailureReason::Unknown));
    let interrupted = settle_turn("{\"completed\": true}", AgentExit::Interrupted, "s1")
        .unwrap()
        .unwrap();
    assert_eq!(
        interrupted.interrupted,
        Some(true),
        "an interrupt wins over the result line"
    );
    assert_eq!(ok.session_id.as_deref(), Some("s1"));
    let invalid = settle_turn("{\"completed\": 3}", AgentExit::Code(0), "s1")
        .unwrap()
        .unwrap();
    assert!(invalid.error.unwrap().contains("not a turn result"));
}

#[test]
fn a_chatty_agent_cannot_deadlock_the_worker_on_its_pipes() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("loud.sh");
    // Far more than a pipe buffer on both streams, interleaved, before exiting.
    write_executable(
        &script,
        "#!/bin/sh\ni=0; while [ $i -lt 3000 ]; do echo \"stdout line $i padding padding padding padding\"; echo \"stderr line $i padding padding\" >&2; i=$((i+1)); done\necho '{\"completed\": true, \"final_response\": \"loud but done\"}'\n",
    );
    let mut agent = ExecAgent::new(
        ExecAgentConfig {
            command: script.display().to_string(),
            task: TaskBrief::default(),
            env: Vec::new(),
            env_remove: Vec::new(),
            session_id: "s".into(),
            interrupt_grace: Duration::from_secs(1),
            forward: Forward::Neither,
            turn_timeout: None,
            seed_worker: None,
            workdir: None,
        },
        activity(),
    );
    let input = TurnInput {
        message: "go".into(),
        kind: TurnKind::Initial,
        turn: 1,
    };
    let result = on_tokio(agent.run_turn(&input)).unwrap().unwrap();
    assert_eq!(result.final_response.as_deref(), Some("loud but done"));
}

#[test]
fn an_agent_the_shell_cannot_find_is_the_environments_fault() {
    let mut agent = ExecAgent::new(
        ExecAgentConfig {
            command: "exit 127".into(),
            task: TaskBrief::default(),
            env: Vec::new(),
            env_remove: Vec::new(),
            session_id: "s".into(),
            interrupt_grace: Duration::from_secs(1),
            forward: Forward::Neither,
            turn_timeout: None,
            seed_worker: None,
            workdir: None,
        },
        activity(),
    );
    let result = on_tokio(agent.run_turn(&TurnInput {
        message: "go".into(),
        kind: TurnKind::Initial,
        turn: 1,
    }))
    .unwrap_err();
    assert!(result.environment, "{result:?}");
    assert!(
        result.message.contains("command not found"),
        "{}",
        result.message
    );
}

#[test]
fn an_agent_that_answers_before_exiting_127_is_judged_by_its_answer() {
    let mut agent = ExecAgent::new(
        ExecAgentConfig {
            command: r#"echo '{"failed": true, "error": "tool missing"}'; exit 127"#.into(),
            task: TaskBrief::default(),
            env: Vec::new(),
            env_remove: Vec::new(),
            session_id: "s".into(),
            interrupt_grace: Duration::from_secs(1),
            forward: Forward::Neither,
            turn_timeout: None,
            seed_worker: None,
            workdir: None,
        },
        activity(),
    );
    let result = on_tokio(agent.run_turn(&TurnInput {
        message: "go".into(),
        kind: TurnKind::Initial,
        turn: 1,
    }))
    .unwrap()
    .unwrap();
    assert_eq!(result.error.as_deref(), Some("tool missing"));
}

#[test]
fn verdicts_and_chat_bodies_are_read_or_refused_readably() {
    assert_eq!(
        parse_verdict("thinking...\n{\"verdict\": \"done\", \"reason\": \"all there\"}\n")
            .unwrap()
            .verdict,
        VerdictKind::Done
    );
    assert_eq!(parse_verdict("{\"verdict\": \"wait\"}").unwrap().reason, "");
    assert!(
        parse_verdict("{\"verdict\": \"maybe\"}")
            .unwrap_err()
            .0
            .contains("no verdict line")
    );
    let (text, calls) = parse_chat_completion(r#"{"choices":[{"message":{"content":"hi","tool_calls":[{"id":"1","function":{"name":"kanban_comment","arguments":"{\"text\":\"x\"}"}}]}}]}"#).unwrap();
    assert_eq!((text.as_str(), calls.len()), ("hi", 1));
    assert!(
        parse_chat_completion("<html>")
            .unwrap_err()
            .contains("not a chat completion")
    );
    assert!(
        parse_chat_completion("{\"choices\": []}")
            .unwrap_err()
            .contains("choices[0].message")
    );
    assert_eq!(
        parse_chat_stream(
            b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n"
        )
        .unwrap()
        .0,
        "a"
    );
    assert!(
        parse_chat_stream(b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n")
            .unwrap_err()
            .contains("before [DONE]")
    );
}

fn mcp_fixture() -> (McpServer, SqliteBoard, String) {
    let board = memory_board(Arc::new(VirtualClock::at(1_000)));
    let task_id = block_on(board.create_task(&NewTask {
        title: "t".into(),
        ..NewTask::default()
    }))
    .unwrap();
    let claim = block_on(board.claim_task(&task_id, 900, "lk"))
        .unwrap()
        .unwrap()
        .claim;
    (
        McpServer::new(BoardTools::new(Arc::new(board.clone()), claim, "w")),
        board,
        task_id,
    )
}

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(512u32);
    ProptestConfig {
        cases,
        ..ProptestConfig::default()
    }
}

fn json_ish() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[{}\\[\\]\":,a-z0-9 .\\-]{0,80}",
        Just("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"kanban_comment\",\"arguments\":".to_owned()),
    ]
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn any_stdout_settles_without_a_panic(stdout in any::<String>(), code in any::<i32>()) {
        let _ = parse_result_line(&stdout);
        let outcome = settle_turn(&stdout, AgentExit::Code(code), "s");
        if let Ok(Some(result)) = outcome {
            prop_assert_eq!(result.session_id.as_deref(), Some("s"));
        }
    }

    #[test]
    fn a_valid_last_result_line_is_always_found(prefix in "[a-zA-Z0-9 \\n]{0,200}", completed in any::<bool>()) {
        let stdout = format!("{prefix}\n{{\"completed\": {completed}}}\n");
        let completed_matches = matches!(parse_result_line(&stdout), ResultLine::Result(r) if r.completed == Some(completed));
        prop_assert!(completed_matches);
    }

    #[test]
    fn any_judge_output_or_chat_body_is_read_or_refused(text in json_ish()) {
        let _ = parse_verdict(&text);
        let _ = parse_chat_completion(&text);
        let _ = parse_chat_stream(text.as_bytes());
    }

    #[test]
    fn any_mcp_line_gets_an_answer_and_rejected_calls_change_nothing(
        line in json_ish(),
        name in prop_oneof![Just("kanban_comment".to_owned()), Just("kanban_heartbeat".to_owned()), Just("kanban_show".to_owned()), Just("nope".to_owned()), "[a-z_]{0,12}"],
        arguments in json_ish(),
    ) {
        let (server, board, task_id) = mcp_fixture();
        let before = block_on(board.show_task(&task_id)).unwrap();
        for candidate in [line, format!("{{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"tools/call\",\"params\":{{\"name\":\"{name}\",\"arguments\":{arguments}}}}}")] {
            if let Some(answer) = block_on(server.handle_line(&candidate)) {
                let answer: serde_json::Value = serde_json::from_str(&answer).unwrap();
                let rejected = answer.get("error").is_some() || answer.pointer("/result/isError") == Some(&serde_json::Value::Bool(true));
                if rejected {
                    let after = block_on(board.show_task(&task_id)).unwrap();
                    prop_assert_eq!(&after.task, &before.task);
                    prop_assert_eq!(after.events.len(), before.events.len());
                }
            }
        }
    }
}

fn activity() -> Arc<Activity> {
    Activity::new(
        Arc::new(VirtualClock::at(0)),
        Arc::new(std::sync::atomic::AtomicUsize::new(0)),
    )
}

/// The exec agent runs on tokio, as the worker does.
fn on_tokio<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(future)
}

fn exec_agent(
    dir: &std::path::Path,
    script: &str,
    config: impl FnOnce(&mut ExecAgentConfig),
) -> (ExecAgent, Arc<Activity>) {
    let path = dir.join("agent.sh");
    write_executable(&path, script);
    let mut settings = ExecAgentConfig {
        command: path.display().to_string(),
        task: TaskBrief::default(),
        env: Vec::new(),
        env_remove: Vec::new(),
        session_id: "s".into(),
        interrupt_grace: Duration::from_secs(2),
        forward: Forward::Neither,
        turn_timeout: None,
        seed_worker: None,
        workdir: None,
    };
    config(&mut settings);
    let activity = activity();
    (ExecAgent::new(settings, activity.clone()), activity)
}

fn turn() -> TurnInput {
    TurnInput {
        message: "go".into(),
        kind: TurnKind::Initial,
        turn: 1,
    }
}

/// The peak resident set of this process, in KiB (`VmHWM`).
fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[test]
fn an_agent_printing_without_end_keeps_only_a_bounded_tail_in_memory() {
    let dir = tempfile::tempdir().unwrap();
    // 400 MB without a single newline, then a result line.
    let (mut agent, _) = exec_agent(
        dir.path(),
        "#!/bin/sh\nhead -c 400000000 /dev/zero | tr '\\0' x\necho\necho '{\"completed\": true, \"final_response\": \"survived\"}'\n",
        |_| {},
    );
    let before = peak_rss_kib();
    let result = on_tokio(agent.run_turn(&turn())).unwrap().unwrap();
    let grew = peak_rss_kib().saturating_sub(before);
    assert_eq!(result.final_response.as_deref(), Some("survived"));
    assert!(
        grew < 64 * 1024,
        "the worker's memory grew by {grew} KiB for 400 MB of output"
    );
}

#[test]
fn a_daemon_holding_the_agents_stdout_does_not_hold_the_turn() {
    let dir = tempfile::tempdir().unwrap();
    // The agent leaves a setsid daemon with its stdout open, then answers.
    let (mut agent, _) = exec_agent(
        dir.path(),
        "#!/bin/sh\nsetsid sleep 30 &\necho '{\"completed\": true, \"final_response\": \"answered\"}'\n",
        |_| {},
    );
    let started = std::time::Instant::now();
    let result = on_tokio(agent.run_turn(&turn())).unwrap().unwrap();
    assert_eq!(
        result.final_response.as_deref(),
        Some("answered"),
        "the result line is read when the agent exits, not at EOF"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "the turn ended with the agent: {:?}",
        started.elapsed()
    );
}

#[test]
fn a_turn_past_its_deadline_is_stopped_and_settled_as_a_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let (mut agent, _) = exec_agent(dir.path(), "#!/bin/sh\nsleep 60\n", |config| {
        config.turn_timeout = Some(Duration::from_millis(500));
        config.interrupt_grace = Duration::from_millis(500);
    });
    let started = std::time::Instant::now();
    let result = on_tokio(agent.run_turn(&turn())).unwrap().unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(
        result
            .turn_exit_reason
            .as_deref()
            .is_some_and(|reason| reason.starts_with("turn_deadline_exceeded")),
        "{result:?}"
    );
    assert_eq!(result.failed, Some(true));
}

#[test]
fn a_stopped_agent_gets_its_grace_period_even_after_its_shell_dies() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("cleaned-up");
    // The shell dies at once on SIGTERM; the agent it started traps it and
    // needs a second to clean up.
    let script = format!(
        "#!/bin/sh\nsh -c 'trap \"sleep 1; touch {}; exit 0\" TERM; while true; do sleep 0.1; done' &\nwait\n",
        marker.display()
    );
    let (mut agent, activity) = exec_agent(dir.path(), &script, |config| {
        config.interrupt_grace = Duration::from_secs(5);
    });
    let stopper = activity.clone();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(400));
        kanban_core::AgentControl::stop(&*stopper, kanban_core::StopReason::Fenced);
    });
    let result = on_tokio(agent.run_turn(&turn())).unwrap().unwrap();
    assert_eq!(result.interrupted, Some(true));
    assert!(
        marker.exists(),
        "the agent was killed before it could use its grace period"
    );
}

fn call(server: &McpServer, line: serde_json::Value) -> serde_json::Value {
    let answer = block_on(server.handle_line(&line.to_string())).unwrap();
    serde_json::from_str(&answer).unwrap()
}

#[test]
fn an_mcp_call_naming_another_card_or_any_unknown_argument_is_refused() {
    let (server, board, task_id) = mcp_fixture();
    let before = block_on(board.show_task(&task_id)).unwrap();
    for (tool, arguments) in [
        (
            "kanban_complete",
            serde_json::json!({"summary": "done", "task_id": "t_other"}),
        ),
        (
            "kanban_comment",
            serde_json::json!({"text": "hi", "author": "mallory"}),
        ),
        ("kanban_show", serde_json::json!({"task_id": "t_other"})),
    ] {
        let answer = call(
            &server,
            serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool, "arguments": arguments}}),
        );
        assert_eq!(
            answer.pointer("/result/isError"),
            Some(&serde_json::json!(true)),
            "{tool}: {answer}"
        );
        let said = answer
            .pointer("/result/content/0/text")
            .unwrap()
            .as_str()
            .unwrap();
        assert!(said.contains("unknown argument"), "{said}");
    }
    let after = block_on(board.show_task(&task_id)).unwrap();
    assert_eq!(after.task, before.task);
    assert_eq!(after.events.len(), before.events.len());
}

#[test]
fn mcp_answers_with_a_protocol_version_it_speaks() {
    let (server, _, _) = mcp_fixture();
    let initialize = |version: &str| {
        call(
            &server,
            serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": version}}),
        )["result"]["protocolVersion"]
            .clone()
    };
    assert_eq!(initialize("2024-11-05"), "2024-11-05");
    assert_eq!(initialize("2025-06-18"), "2025-06-18");
    assert_eq!(
        initialize("1999-01-01"),
        kanban_agent_port::MCP_PROTOCOL_VERSION
    );
}

#[test]
fn the_ambient_key_goes_only_to_https_or_loopback_and_debug_never_shows_a_key() {
    use kanban_agent_port::HttpAgentConfig;
    let env = kanban_core::Environment::new().with("OPENAI_API_KEY", "sk-ambient-secret");
    let key = |url: &str| {
        HttpAgentConfig::parse(&format!("http:{url}?model=m"), &env)
            .unwrap()
            .api_key
    };
    assert_eq!(
        key("http://10.1.2.3:8080/v1"),
        None,
        "clear text across a network"
    );
    assert_eq!(key("http://example.com/v1"), None);
    for url in [
        "https://api.example.com/v1",
        "http://127.0.0.1:8080/v1",
        "http://localhost/v1",
        "http://[::1]:9000/v1",
    ] {
        assert_eq!(key(url).as_deref(), Some("sk-ambient-secret"), "{url}");
    }
    // A key named explicitly is the operator's choice, whatever the URL.
    let named = HttpAgentConfig::parse(
        "http:http://10.1.2.3/v1?model=m&key_env=MY_KEY",
        &env.clone().with("MY_KEY", "sk-named-secret"),
    )
    .unwrap();
    assert_eq!(named.api_key.as_deref(), Some("sk-named-secret"));
    let shown = format!("{named:?} {env:?}");
    assert!(
        !shown.contains("sk-named-secret") && !shown.contains("sk-ambient-secret"),
        "{shown}"
    );
    assert!(shown.contains("OPENAI_API_KEY"), "names are shown: {shown}");
}

#[test]
fn a_process_stat_tells_a_zombie_its_group_and_its_session() {
    use kanban_agent_port::{ProcessStat, process_stat};
    use nix::unistd::{Pid, getpgrp, getsid};
    let me = process_stat(Pid::this()).unwrap();
    assert_eq!(
        me,
        ProcessStat {
            zombie: false,
            group: getpgrp(),
            session: getsid(None).unwrap(),
        }
    );
    // A child in a group of its own, ended and not yet waited for.
    let mut child = std::process::Command::new("true");
    std::os::unix::process::CommandExt::process_group(&mut child, 0);
    let mut child = child.spawn().unwrap();
    let pid = Pid::from_raw(child.id() as i32);
    let started = std::time::Instant::now();
    while !process_stat(pid).unwrap().zombie {
        assert!(started.elapsed() < Duration::from_secs(20), "never ended");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(process_stat(pid).unwrap().group, pid);
    assert_eq!(process_stat(pid).unwrap().session, me.session);
    child.wait().unwrap();
    assert_eq!(process_stat(pid), None, "reaped: gone");
}

/// A stand-in for the seed system's `hermes`: it records its arguments,
/// working directory and standard input, prints a session line, and exits
/// with the code in `HERMES_FAKE_EXIT`.
fn fake_hermes(dir: &std::path::Path) -> std::path::PathBuf {
    let program = dir.join("hermes");
    write_executable(
        &program,
        "#!/bin/sh\n\
         n=$(cat \"$HERMES_FAKE_LOG.count\" 2>/dev/null || echo 0); n=$((n+1)); echo $n > \"$HERMES_FAKE_LOG.count\"\n\
         { printf '%s\\n' \"$@\"; echo \"cwd=$(pwd)\"; echo \"stdin=$(cat)\"; } > \"$HERMES_FAKE_LOG.$n\"\n\
         echo '{\"completed\": false, \"failed\": true}'\n\
         echo \"session_id: sess-$n\" >&2\n\
         exit \"$HERMES_FAKE_EXIT\"\n",
    );
    program
}

fn seed_agent(dir: &std::path::Path, exit: i32) -> ExecAgent {
    let workspace = dir.join("workspace");
    std::fs::create_dir_all(&workspace).unwrap();
    ExecAgent::new(
        ExecAgentConfig {
            command: fake_hermes(dir).display().to_string(),
            task: TaskBrief {
                id: "t_1a2b".into(),
                ..TaskBrief::default()
            },
            env: vec![
                (
                    "HERMES_FAKE_LOG".into(),
                    dir.join("call").display().to_string(),
                ),
                ("HERMES_FAKE_EXIT".into(), exit.to_string()),
            ],
            env_remove: Vec::new(),
            session_id: "t_1a2b-run1".into(),
            interrupt_grace: Duration::from_secs(1),
            forward: Forward::Neither,
            turn_timeout: None,
            seed_worker: Some(SeedWorker {
                profile: "coder".into(),
                workspace,
            }),
            workdir: None,
        },
        activity(),
    )
}

#[test]
fn the_seed_worker_is_started_as_its_dispatcher_starts_it_and_resumed() {
    let dir = tempfile::tempdir().unwrap();
    let mut agent = seed_agent(dir.path(), 0);
    let first = on_tokio(agent.run_turn(&TurnInput {
        message: "work kanban task t_1a2b: our own words".into(),
        kind: TurnKind::Initial,
        turn: 1,
    }))
    .unwrap()
    .unwrap();
    // Exit 0 is a turn that ended: its JSON-looking prose is not a result.
    assert_eq!(first.completed, Some(true), "{first:?}");
    assert_eq!(first.failed, None);
    let call = |n: u32| std::fs::read_to_string(dir.path().join(format!("call.{n}"))).unwrap();
    let workspace = std::fs::canonicalize(dir.path().join("workspace")).unwrap();
    assert_eq!(
        call(1),
        format!(
            "-p\ncoder\n--cli\n--accept-hooks\nchat\n-q\nwork kanban task t_1a2b\n-Q\ncwd={}\nstdin=\n",
            workspace.display()
        )
    );
    on_tokio(agent.run_turn(&TurnInput {
        message: "you did not complete; call kanban_complete".into(),
        kind: TurnKind::StopNudge,
        turn: 2,
    }))
    .unwrap()
    .unwrap();
    assert!(
        call(2).starts_with(
            "-p\ncoder\n--cli\n--accept-hooks\nchat\n--resume\nsess-1\n-q\nyou did not complete; call kanban_complete\n-Q\n"
        ),
        "{}",
        call(2)
    );
}

#[test]
fn the_seed_workers_exits_are_booked_by_its_own_table() {
    for (exit, reason) in [
        (75, FailureReason::RateLimit),
        (1, FailureReason::Unknown),
        (2, FailureReason::Unknown),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut agent = seed_agent(dir.path(), exit);
        let result = on_tokio(agent.run_turn(&TurnInput {
            message: "go".into(),
            kind: TurnKind::Initial,
            turn: 1,
        }))
        .unwrap()
        .unwrap();
        assert_eq!(
            (result.failure_reason.clone(), result.failure_retryable),
            (Some(reason), Some(false)),
            "exit {exit}"
        );
        assert_eq!(
            kanban_core::outcome_exit_code(&Ok(Some(result.clone())), true).code(),
            if exit == 75 { 75 } else { 1 },
            "exit {exit}"
        );
    }
    let killed = settle_seed_worker("", AgentExit::Signal(9), "s")
        .unwrap()
        .unwrap();
    assert_eq!(killed.failure_reason, Some(FailureReason::Unknown));
    let stopped = settle_seed_worker("", AgentExit::Interrupted, "s")
        .unwrap()
        .unwrap();
    assert_eq!(stopped.interrupted, Some(true));
}

#[test]
fn a_seed_worker_that_cannot_be_found_is_the_environments_fault() {
    let dir = tempfile::tempdir().unwrap();
    let mut agent = ExecAgent::new(
        ExecAgentConfig {
            command: dir.path().join("no-hermes-here").display().to_string(),
            task: TaskBrief::default(),
            env: Vec::new(),
            env_remove: Vec::new(),
            session_id: "s".into(),
            interrupt_grace: Duration::from_secs(1),
            forward: Forward::Neither,
            turn_timeout: None,
            seed_worker: Some(SeedWorker {
                profile: "coder".into(),
                workspace: dir.path().to_owned(),
            }),
            workdir: None,
        },
        activity(),
    );
    let error = on_tokio(agent.run_turn(&TurnInput {
        message: "go".into(),
        kind: TurnKind::Initial,
        turn: 1,
    }))
    .unwrap_err();
    assert!(error.environment, "{error:?}");
}

#[test]
fn the_seed_workers_session_line_is_read_only_when_plain() {
    assert_eq!(
        seed_worker_session("x\nsession_id: 20261206_abc-1\n\n"),
        Some("20261206_abc-1".into())
    );
    assert_eq!(seed_worker_session("session_id: a b"), None);
    assert_eq!(seed_worker_session("session_id: --evil;rm"), None);
    assert_eq!(seed_worker_session("no session"), None);
    let recovery = seed_worker_args(
        &SeedWorkerTurn {
            profile: "p",
            task_id: "t",
            resume: None,
        },
        &TurnInput {
            message: "m".into(),
            kind: TurnKind::Recovery,
            turn: 2,
        },
    );
    assert_eq!(recovery.join(" "), "-p p --cli --accept-hooks chat -q m -Q");
}

#[test]
fn a_one_shot_command_is_read_to_its_end_and_stopped_whole() {
    use kanban_agent_port::{ONE_SHOT_ANSWER_BYTES, OneShotCommand};
    let timeout = Duration::from_secs(20);
    // More than the head it keeps, then the line a judge looks for: the
    // command is read to its end (no broken pipe), its head and its end kept.
    let chatty = OneShotCommand::new(
        format!(
            "head -c {} /dev/zero | tr '\\0' x; echo; echo '{{\"verdict\": \"done\"}}'",
            ONE_SHOT_ANSWER_BYTES * 3
        ),
        timeout,
    );
    let answer = chatty.run("").expect("it exits 0");
    assert!(answer.len() < 2 * usize::try_from(ONE_SHOT_ANSWER_BYTES).unwrap());
    assert!(answer.starts_with("xxxx"));
    assert!(
        answer.trim_end().ends_with(r#"{"verdict": "done"}"#),
        "{}",
        &answer[answer.len() - 80..]
    );
    // A process that left the group and holds the output open does not
    // hold the answer back.
    let started = std::time::Instant::now();
    let leaver = OneShotCommand::new("setsid sleep 30 & echo answered".to_owned(), timeout);
    assert_eq!(leaver.run("").expect("it exits 0").trim(), "answered");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    // An interrupt stops it.
    let flag = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let stopping = flag.clone();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        stopping.store(1, std::sync::atomic::Ordering::SeqCst);
    });
    let waiting = OneShotCommand {
        interrupt: Some(flag),
        ..OneShotCommand::new("sleep 30".to_owned(), timeout)
    };
    let started = std::time::Instant::now();
    let error = waiting.run("").expect_err("interrupted");
    assert!(error.contains("interrupted"), "{error}");
    assert!(started.elapsed() < Duration::from_secs(10));
    // A failing one says how it ended.
    let failing = OneShotCommand::new("exit 3".to_owned(), timeout);
    assert!(
        failing
            .run("")
            .expect_err("fails")
            .contains("exit status: 3")
    );
}

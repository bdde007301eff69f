//! `kanban worker --agent http:…` against a real HTTP server on loopback
//! that scripts its answers, and `kanban mcp` driven by a test client.

use std::io::{BufRead, BufReader, Write};
use std::process::{Output, Stdio};

use kanban_testkit::{Reply, ScriptedHttpServer};
use serde_json::{Value, json};

use crate::{Bench, last_line, text};

fn complete_call() -> Reply {
    Reply::tool_call("kanban_complete", r#"{"summary": "done by the model"}"#)
}

/// Runs a worker on a fresh card against `replies`; returns the bench, the
/// card, the server and the worker's output.
fn run(
    replies: Vec<Reply>,
    options: &str,
    env: &[(&str, &str)],
) -> (Bench, String, ScriptedHttpServer, Output) {
    let server = ScriptedHttpServer::start(replies);
    let bench = Bench::new();
    let id = bench.add("answer the question", &["--body", "what is 6 x 7?"]);
    let carrier = bench.claim(&id, None);
    let agent = format!(
        "http:{}?model=test-model&retries=0{options}",
        server.base_url
    );
    let output = bench.worker(&carrier, std::path::Path::new(&agent), env, &[]);
    (bench, id, server, output)
}

fn messages(request: &Value) -> Vec<Value> {
    request["messages"].as_array().unwrap().clone()
}

#[test]
fn a_500_then_a_200_is_recovered_in_place_and_the_tool_loop_completes_the_card() {
    let (bench, id, server, output) = run(
        vec![
            Reply::json(500, "upstream exploded"),
            complete_call(),
            Reply::text("42, and the card is done"),
        ],
        "",
        &[],
    );
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert!(text(&output.stderr).contains("retrying the turn in place"));
    assert_eq!(bench.show(&id)["task"]["status"], "done");
    let requests = server.requests();
    assert_eq!(requests.len(), 3);
    assert_eq!(requests[0]["model"], "test-model");
    assert!(
        requests[0]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["function"]["name"] == "kanban_complete")
    );
    // The recovery turn continues the same history: the first user message is still there.
    let recovery = messages(&requests[1]);
    assert_eq!(
        recovery[1],
        messages(&requests[0])[1],
        "the same conversation"
    );
    assert!(
        recovery.last().unwrap()["content"]
            .as_str()
            .unwrap()
            .contains("Do NOT start over")
    );
    // The tool result went back to the model.
    let last = messages(&requests[2]);
    assert_eq!(last.last().unwrap()["role"], "tool");
    assert_eq!(last_line(&output.stdout), "42, and the card is done");
}

#[test]
fn a_stream_cut_midway_is_a_failed_turn_recovered_in_place() {
    let streamed_complete = Reply::Stream {
        events: vec![
            json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "kanban_complete", "arguments": "{\"summary\":"}}]}}]}).to_string(),
            json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": " \"streamed\"}"}}]}}]}).to_string(),
        ],
        complete: true,
    };
    let replies = vec![
        Reply::streamed_text(&["The answer is", " 4"], false),
        streamed_complete,
        Reply::streamed_text(&["done"], true),
    ];
    let (bench, id, server, output) = run(replies, "&stream=1", &[]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert!(
        text(&output.stderr).contains("retrying the turn in place"),
        "a cut stream is not a partial success"
    );
    assert_eq!(server.requests()[0]["stream"], true);
    let card = bench.show(&id);
    assert_eq!(card["task"]["status"], "done");
    assert_eq!(card["runs"][0]["summary"], "streamed");
}

#[test]
fn walls_and_refusals_map_to_their_exit_codes_after_one_turn() {
    let rows = [
        (
            "429",
            Reply::json(429, "rate limit reached").with_header("Retry-After", "30"),
            75,
        ),
        (
            "429 quota",
            Reply::json(429, r#"{"error": {"code": "insufficient_quota"}}"#),
            75,
        ),
        ("402", Reply::json(402, "payment required"), 75),
        ("401", Reply::json(401, "bad key"), 78),
        (
            "404 model",
            Reply::json(404, "the model `test-model` does not exist"),
            78,
        ),
        ("418", Reply::json(418, "I'm a teapot"), 1),
    ];
    for (case, reply, code) in rows {
        let (_, _, server, output) = run(vec![reply], "", &[]);
        assert_eq!(
            output.status.code(),
            Some(code),
            "{case}: {}",
            text(&output.stderr)
        );
        assert_eq!(server.requests().len(), 1, "{case}: one turn, no recovery");
        assert!(
            !text(&output.stderr).contains("retrying the turn in place"),
            "{case}"
        );
    }
}

#[test]
fn a_retry_after_is_kept_for_the_dispatcher() {
    let (bench, id, _, output) = run(
        vec![Reply::json(429, "slow down").with_header("Retry-After", "30")],
        "",
        &[],
    );
    assert_eq!(output.status.code(), Some(75));
    let booked = bench.event(&id, "worker_result");
    assert_eq!(booked["payload"]["retry_after_seconds"], 30, "{booked}");
}

#[test]
fn the_wait_is_read_from_openai_reset_headers_and_from_the_error_text() {
    for (reply, wait) in [
        (
            Reply::json(429, "slow down").with_header("x-ratelimit-reset-tokens", "6m0s"),
            360,
        ),
        (
            Reply::json(
                429,
                r#"{"error": {"message": "Rate limit reached. Please try again in 20s."}}"#,
            ),
            20,
        ),
    ] {
        let (bench, id, _, output) = run(vec![reply], "", &[]);
        assert_eq!(output.status.code(), Some(75));
        let booked = bench.event(&id, "worker_result");
        assert_eq!(booked["payload"]["retry_after_seconds"], wait, "{booked}");
    }
}

#[test]
fn the_provider_retry_layer_absorbs_a_transient_failure_within_the_turn() {
    let (bench, id, server, output) = run(
        vec![
            Reply::json(503, "overloaded"),
            complete_call(),
            Reply::text("ok"),
        ],
        "&retries=2&retry_delay_ms=10",
        &[],
    );
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert!(
        !text(&output.stderr).contains("retrying the turn in place"),
        "no in-place recovery was needed"
    );
    assert_eq!(server.requests().len(), 3);
    assert_eq!(bench.show(&id)["task"]["status"], "done");
}

#[test]
fn a_model_that_answers_without_a_terminal_call_gets_the_stop_nudge() {
    let (bench, id, server, output) = run(vec![Reply::text("I think it is 42.")], "", &[]);
    assert_eq!(output.status.code(), Some(0));
    let requests = server.requests();
    assert_eq!(requests.len(), 3, "the reply, then two stop nudges");
    let nudge = messages(&requests[1]).last().unwrap()["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        nudge.contains("kanban_complete") && nudge.contains("1/2"),
        "{nudge}"
    );
    assert_eq!(
        bench.show(&id)["task"]["status"],
        "running",
        "the dispatcher books the violation"
    );
}

#[test]
fn the_iteration_limit_is_a_terminal_settlement_exit_75_without_recovery() {
    let (_, _, server, output) = run(
        vec![Reply::tool_call(
            "kanban_heartbeat",
            r#"{"note": "still going"}"#,
        )],
        "&max_iterations=2",
        &[],
    );
    assert_eq!(output.status.code(), Some(75), "{}", text(&output.stderr));
    assert_eq!(server.requests().len(), 2);
    assert!(!text(&output.stderr).contains("retrying the turn in place"));
}

#[test]
fn a_dispatched_run_at_the_iteration_limit_is_timed_out_counted_and_blocks_at_the_limit() {
    let server = ScriptedHttpServer::start(vec![Reply::tool_call(
        "kanban_heartbeat",
        r#"{"note": "still going"}"#,
    )]);
    let bench = Bench::new();
    let id = bench.add("loops forever", &[]);
    let agent = format!(
        "http:{}?model=test-model&retries=0&max_iterations=2",
        server.base_url
    );
    let output = bench.dispatch_until_idle(std::path::Path::new(&agent), &["--retry-backoff", "0"]);
    let card = bench.show(&id);
    let outcomes: Vec<&str> = card["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|run| run["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(
        outcomes,
        ["timed_out", "timed_out"],
        "{}",
        text(&output.stdout)
    );
    assert_eq!(card["task"]["status"], "blocked", "the default limit of 2");
    assert_eq!(card["task"]["consecutive_failures"], 2);
}

#[test]
fn bad_answers_give_typed_failures_with_readable_errors() {
    // A body that is not a chat completion.
    let (_, _, _, output) = run(
        vec![Reply::json(200, "<html>gateway</html>")],
        "",
        &[("HERMES_KANBAN_TURN_RECOVERY", "0")],
    );
    assert_eq!(
        output.status.code(),
        Some(75),
        "server_error is transient: {}",
        text(&output.stderr)
    );
    assert!(
        text(&output.stdout).contains("not a chat completion"),
        "{}",
        text(&output.stdout)
    );
    // Invalid JSON in a tool's arguments goes back to the model as an error it can read.
    let (bench, id, server, output) = run(
        vec![
            Reply::tool_call("kanban_complete", "{not json"),
            complete_call(),
            Reply::text("fixed"),
        ],
        "",
        &[],
    );
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let tool_reply = messages(&server.requests()[1]).last().unwrap().clone();
    assert_eq!(tool_reply["role"], "tool");
    assert!(
        tool_reply["content"]
            .as_str()
            .unwrap()
            .contains("invalid JSON in the tool arguments"),
        "{tool_reply}"
    );
    assert_eq!(bench.show(&id)["task"]["status"], "done");
    // An unreachable host.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let bench = Bench::new();
    let id = bench.add("x", &[]);
    let carrier = bench.claim(&id, None);
    let agent = format!("http:http://127.0.0.1:{port}/v1?model=m&retries=0");
    let output = bench.worker(
        &carrier,
        std::path::Path::new(&agent),
        &[("HERMES_KANBAN_TURN_RECOVERY", "0")],
        &[],
    );
    assert_eq!(output.status.code(), Some(75), "{}", text(&output.stderr));
    assert!(
        text(&output.stdout).contains("failed"),
        "{}",
        text(&output.stdout)
    );
    // A bad agent spec is refused before anything runs.
    let output = bench.worker(
        &carrier,
        std::path::Path::new("http:http://127.0.0.1:1/v1"),
        &[],
        &[],
    );
    assert_eq!(output.status.code(), Some(1));
    assert!(
        text(&output.stderr).contains("needs a model"),
        "{}",
        text(&output.stderr)
    );
}

#[test]
fn one_shot_turn_over_http() {
    let bench = Bench::new();
    // One turn on a fresh model that answers `reply`.
    let turn = |reply: &str, args: &[&str]| {
        let server = ScriptedHttpServer::start(vec![Reply::text(reply)]);
        let output = bench
            .command()
            .args([
                "turn",
                "--agent",
                &format!("http:{}?model=m", server.base_url),
            ])
            .args(args)
            .output()
            .unwrap();
        (server, output)
    };
    let (server, output) = turn("hello from the model", &["hi"]);
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(last_line(&output.stdout), "hello from the model");
    assert!(
        server.requests()[0].get("tools").is_none(),
        "no board tools outside a card"
    );
    assert_eq!(
        server.requests()[0]["messages"][0]["role"],
        "user",
        "no task given: no card's system prompt"
    );

    // A task given: the model is told the card, as a worker's would be.
    let (server, output) = turn("on it", &["--id", "t_try", "--title", "fix the README"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let told = &server.requests()[0]["messages"][0];
    assert_eq!(told["role"], "system");
    assert!(
        told["content"]
            .as_str()
            .unwrap()
            .contains("card t_try: fix the README"),
        "{told}"
    );
}

/// A minimal MCP client over the server's stdio.
struct McpClient {
    child: std::process::Child,
    reader: BufReader<std::process::ChildStdout>,
    next_id: i64,
}

impl McpClient {
    fn start(bench: &Bench, carrier: &[(String, String)]) -> Self {
        let mut child = bench
            .command()
            .envs(carrier.iter().map(|(k, v)| (k, v)))
            .arg("mcp")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let reader = BufReader::new(child.stdout.take().unwrap());
        Self {
            child,
            reader,
            next_id: 1,
        }
    }

    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let message = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        writeln!(self.child.stdin.as_mut().unwrap(), "{message}").unwrap();
        let mut line = String::new();
        self.reader.read_line(&mut line).unwrap();
        let answer: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(answer["id"], id);
        answer
    }

    fn notify(&mut self, method: &str) {
        writeln!(
            self.child.stdin.as_mut().unwrap(),
            "{}",
            json!({"jsonrpc": "2.0", "method": method})
        )
        .unwrap();
    }
}

impl Drop for McpClient {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn kanban_mcp_lists_the_tools_completes_the_card_and_refuses_a_stale_worker() {
    let bench = Bench::new();
    let id = bench.add("via mcp", &[]);
    let carrier = bench.claim(&id, None);
    let mut client = McpClient::start(&bench, &carrier);
    let init = client.request("initialize", json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}}));
    assert_eq!(init["result"]["serverInfo"]["name"], "kanban");
    client.notify("notifications/initialized");
    let listed = client.request("tools/list", json!({}));
    let names: Vec<&str> = listed["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "kanban_complete",
            "kanban_block",
            "kanban_heartbeat",
            "kanban_comment",
            "kanban_create",
            "kanban_link",
            "kanban_unblock",
            "kanban_attach",
            "kanban_list",
            "kanban_show"
        ]
    );
    let shown = client.request(
        "tools/call",
        json!({"name": "kanban_show", "arguments": {}}),
    );
    assert!(
        shown["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("via mcp")
    );
    let bad = client.request(
        "tools/call",
        json!({"name": "kanban_complete", "arguments": {}}),
    );
    assert_eq!(
        bad["result"]["isError"], true,
        "a missing summary is a tool error"
    );
    let done = client.request(
        "tools/call",
        json!({"name": "kanban_complete", "arguments": {"summary": "finished over mcp"}}),
    );
    assert_eq!(done["result"]["isError"], false, "{done}");
    assert_eq!(bench.show(&id)["task"]["status"], "done");
    let unknown = client.request("no/such/method", json!({}));
    assert_eq!(unknown["error"]["code"], -32601);

    // A stale worker: its card was reclaimed; every write is refused and changes nothing.
    let id = bench.add("contested", &[]);
    let stale = bench.claim(&id, None);
    bench.ok(&["reclaim", &id]);
    let before = bench.show(&id);
    let mut client = McpClient::start(&bench, &stale);
    let refused = client.request(
        "tools/call",
        json!({"name": "kanban_complete", "arguments": {"summary": "zombie"}}),
    );
    assert_eq!(refused["result"]["isError"], true);
    assert!(
        refused["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("no longer holds"),
        "{refused}"
    );
    let after = bench.show(&id);
    assert_eq!(after["task"], before["task"]);
    assert_eq!(after["runs"], before["runs"]);
}

#[test]
fn kanban_mcp_blocks_with_the_seed_systems_kinds_and_refuses_any_other() {
    let bench = Bench::new();
    let id = bench.add("needs a person", &[]);
    let carrier = bench.claim(&id, None);
    let mut client = McpClient::start(&bench, &carrier);
    client.request("initialize", json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}}));
    let listed = client.request("tools/list", json!({}));
    let block = listed["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|tool| tool["name"] == "kanban_block")
        .unwrap()
        .clone();
    assert_eq!(
        block["inputSchema"]["properties"]["kind"]["enum"],
        json!(["dependency", "needs_input", "capability", "transient"])
    );
    let before = bench.show(&id);
    let refused = client.request(
        "tools/call",
        json!({"name": "kanban_block", "arguments": {"reason": "?", "kind": "someday"}}),
    );
    assert_eq!(refused["result"]["isError"], true, "{refused}");
    assert!(
        refused["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("needs_input"),
        "{refused}"
    );
    assert_eq!(bench.show(&id)["task"], before["task"], "nothing changed");
    let blocked = client.request(
        "tools/call",
        json!({"name": "kanban_block", "arguments": {"reason": "which region?", "kind": "needs_input"}}),
    );
    assert_eq!(blocked["result"]["isError"], false, "{blocked}");
    let card = bench.show(&id);
    assert_eq!(card["task"]["status"], "blocked");
    assert_eq!(card["task"]["block_kind"], "needs_input");
    assert_eq!(
        bench.event(&id, "blocked")["payload"]["kind"],
        "needs_input"
    );
}

#[test]
fn a_key_the_provider_echoes_back_reaches_neither_the_board_nor_the_log() {
    let secret = "sk-test-0123456789abcdef";
    let (bench, id, _server, output) = run(
        vec![Reply::json(
            401,
            &format!(r#"{{"error": {{"message": "Incorrect API key provided: {secret}"}}}}"#),
        )],
        "&key_env=MY_PROVIDER_KEY",
        &[("MY_PROVIDER_KEY", secret)],
    );
    assert_eq!(output.status.code(), Some(78), "{}", text(&output.stderr));
    let everything = format!(
        "{}{}{}{}",
        text(&output.stdout),
        text(&output.stderr),
        bench.ok(&["show", &id, "--json"]),
        bench.ok(&["events", &id, "--json"])
    );
    assert!(
        everything.contains("Incorrect API key provided"),
        "{everything}"
    );
    assert!(!everything.contains(secret), "{everything}");
    assert!(everything.contains("[redacted]"), "{everything}");
}

#[test]
fn a_server_that_answers_a_stream_request_with_plain_json_is_read() {
    let (bench, id, server, output) =
        run(vec![complete_call(), Reply::text("done")], "&stream=1", &[]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert_eq!(server.requests()[0]["stream"], true);
    assert_eq!(bench.show(&id)["task"]["status"], "done");
}

#[test]
fn kanban_mcp_survives_an_oversized_line_and_bytes_that_are_not_utf8() {
    let bench = Bench::new();
    let id = bench.add("card", &[]);
    let carrier = bench.claim(&id, None);
    let mut child = bench
        .command()
        .envs(carrier.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .arg("mcp")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut answer = || {
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        serde_json::from_str::<Value>(&line).unwrap()
    };
    // 5 MiB in one line, past the 4 MiB limit.
    let huge = format!(
        "{{\"jsonrpc\": \"2.0\", \"id\": 1, \"method\": \"ping\", \"pad\": \"{}\"}}\n",
        "x".repeat(5 << 20)
    );
    stdin.write_all(huge.as_bytes()).unwrap();
    let refused = answer();
    assert_eq!(refused["error"]["code"], -32600, "{refused}");
    stdin.write_all(b"\xff\xfe{\"id\": 2}\n").unwrap();
    let garbled = answer();
    assert_eq!(garbled["error"]["code"], -32700, "{garbled}");
    stdin
        .write_all(b"{\"jsonrpc\": \"2.0\", \"id\": 3, \"method\": \"ping\"}\n")
        .unwrap();
    let pong = answer();
    assert_eq!(pong["id"], 3, "still serving: {pong}");
    drop(stdin);
    assert!(child.wait().unwrap().success());
}

#[test]
fn kanban_mcp_fans_out_lists_and_hands_over_what_the_run_made() {
    let bench = Bench::new();
    let lead = bench.add("split the work", &[]);
    let other = bench.add("a person's card", &[]);
    let carrier = bench.claim(&lead, None);
    let mut client = McpClient::start(&bench, &carrier);
    client.request("initialize", json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}}));
    let listed = client.request("tools/list", json!({}));
    let names: Vec<&str> = listed["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|tool| tool["name"].as_str())
        .collect();
    for tool in [
        "kanban_create",
        "kanban_link",
        "kanban_unblock",
        "kanban_list",
    ] {
        assert!(names.contains(&tool), "{names:?}");
    }
    let call = |client: &mut McpClient, name: &str, arguments: serde_json::Value| {
        let answer = client.request("tools/call", json!({"name": name, "arguments": arguments}));
        let text = answer["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .to_owned();
        (answer["result"]["isError"] == true, text)
    };
    let (failed, made) = call(
        &mut client,
        "kanban_create",
        json!({"title": "a part", "body": "the first half", "priority": 3}),
    );
    assert!(!failed, "{made}");
    let made: serde_json::Value = serde_json::from_str(&made).unwrap();
    let part = made["task_id"].as_str().unwrap().to_owned();
    let card = bench.show(&part);
    assert_eq!(card["task"]["status"], "todo");
    assert_eq!(card["task"]["priority"], 3);
    assert_eq!(card["parents"], json!([lead]));
    // A person's card is out of reach; bad arguments are named.
    let (failed, text) = call(
        &mut client,
        "kanban_link",
        json!({"parent_id": part, "child_id": other}),
    );
    assert!(failed && text.contains("does not wait for"), "{text}");
    let (failed, text) = call(
        &mut client,
        "kanban_create",
        json!({"title": "x", "parents": 3}),
    );
    assert!(failed && text.contains("`parents`"), "{text}");
    let (failed, text) = call(&mut client, "kanban_list", json!({"limit": 1}));
    assert!(!failed, "{text}");
    let listing: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        (
            &listing["count"],
            &listing["truncated"],
            &listing["tasks"][0]["id"]
        ),
        (&json!(1), &json!(true), &json!(lead)),
        "the oldest card, and more to come: {listing}"
    );
    let (failed, text) = call(&mut client, "kanban_list", json!({"limit": 0}));
    assert!(failed && text.contains("`limit`"), "{text}");
    let (failed, text) = call(&mut client, "kanban_list", json!({"status": "todo"}));
    assert!(!failed, "{text}");
    let listing: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(listing["count"], 1, "{listing}");
    assert_eq!(listing["tasks"][0]["id"], part.as_str());
    assert_eq!(listing["tasks"][0]["created_by"], lead.as_str());
    // A card it did not make refuses the completion; its own is vouched for.
    let (failed, text) = call(
        &mut client,
        "kanban_complete",
        json!({"summary": "split", "created_cards": [part, other]}),
    );
    assert!(failed && text.contains(&other), "{text}");
    assert_eq!(bench.show(&lead)["task"]["status"], "running");
    let (failed, text) = call(
        &mut client,
        "kanban_complete",
        json!({"summary": "split", "created_cards": [part], "metadata": {"parts": 1}}),
    );
    assert!(!failed, "{text}");
    let card = bench.show(&lead);
    assert_eq!(card["task"]["status"], "done");
    assert_eq!(card["runs"][0]["metadata"], json!({"parts": 1}));
    assert_eq!(
        bench.event(&lead, "completed")["payload"]["verified_cards"],
        json!([part])
    );
    assert_eq!(bench.show(&part)["task"]["status"], "ready");
}

#[test]
fn a_run_attaches_files_to_its_own_card_only_while_it_owns_it() {
    let bench = Bench::new();
    let lead = bench.add("write the report", &[]);
    let other = bench.add("a person's card", &[]);
    let carrier = bench.claim(&lead, None);
    let folder = bench.path().join("attachments").join(&lead);
    // Through `kanban mcp`: the bytes inline, the name made safe.
    let mut client = McpClient::start(&bench, &carrier);
    client.request("initialize", json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}}));
    let mut call = |arguments: serde_json::Value| {
        let answer = client.request(
            "tools/call",
            json!({"name": "kanban_attach", "arguments": arguments}),
        );
        let text = answer["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .to_owned();
        (answer["result"]["isError"] == true, text)
    };
    let (failed, said) = call(json!({"filename": "../../r.txt", "content_base64": "aGVsbG8K"}));
    assert!(!failed, "{said}");
    assert_eq!(
        std::fs::read_to_string(folder.join("r.txt")).unwrap(),
        "hello\n"
    );
    let (failed, said) = call(json!({"filename": "x.txt", "content_base64": "not base64!"}));
    assert!(failed && said.contains("not base64"), "{said}");
    let (failed, said) =
        call(json!({"filename": "x.txt", "content_base64": "aGk=", "task_id": other}));
    assert!(failed && said.contains("task_id"), "{said}");
    // Through `kanban attach` inside the run: its own card only.
    let notes = bench.path().join("notes.md");
    std::fs::write(&notes, "# notes\n").unwrap();
    let attach = |card: &str| {
        let mut command = bench.command();
        command.envs(carrier.iter().map(|(k, v)| (k, v)));
        command.args(["attach", card]).arg(&notes).output().unwrap()
    };
    let done = attach(&lead);
    assert!(done.status.success(), "{}", text(&done.stderr));
    let refused = attach(&other);
    assert!(!refused.status.success());
    assert!(
        text(&refused.stderr).contains("to its own card"),
        "{}",
        text(&refused.stderr)
    );
    let files: serde_json::Value =
        serde_json::from_str(&bench.ok(&["attachments", &lead, "--json"])).unwrap();
    let files = files.as_array().unwrap();
    assert_eq!(files.len(), 2);
    assert_eq!(files[1]["content_type"], "text/markdown");
    assert!(
        bench.show(&lead)["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["kind"] == "attached" && e["run_id"] == carrier_run(&carrier))
    );
    // Once the claim is gone, neither path records anything, and no file stays.
    bench.ok(&["reclaim", &lead]);
    let stale = attach(&lead);
    assert!(!stale.status.success(), "{}", text(&stale.stdout));
    let (failed, said) = call(json!({"filename": "late.txt", "content_base64": "aGk="}));
    assert!(failed, "{said}");
    assert_eq!(
        std::fs::read_dir(&folder).unwrap().count(),
        2,
        "no file of a refused write stays"
    );
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&bench.ok(&["attachments", &lead, "--json"]))
            .unwrap()
            .as_array()
            .unwrap()
            .len(),
        2
    );
}

fn carrier_run(carrier: &[(String, String)]) -> serde_json::Value {
    let run = carrier
        .iter()
        .find(|(k, _)| k == "HERMES_KANBAN_RUN_ID")
        .map(|(_, v)| v.clone())
        .unwrap();
    json!(run.parse::<i64>().unwrap())
}

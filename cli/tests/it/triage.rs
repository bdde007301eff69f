//! `kanban specify` and `kanban decompose` through an agent of the agents
//! file: an OpenAI-compatible server on loopback that answers from a
//! script, and command agents that answer on stdout.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use kanban_testkit::{Reply, ScriptedHttpServer};
use serde_json::{Value, json};

use crate::{Bench, text};

/// A server whose next answer the test sets before each call.
struct Planner {
    server: ScriptedHttpServer,
    answers: Arc<Mutex<VecDeque<String>>>,
}

impl Planner {
    fn start() -> Self {
        let answers: Arc<Mutex<VecDeque<String>>> = Arc::default();
        let queue = answers.clone();
        let server = ScriptedHttpServer::start_with(move |_, _| {
            let answer = queue.lock().unwrap().pop_front();
            Reply::text(&answer.unwrap_or_else(|| "no answer scripted".to_owned()))
        });
        Self { server, answers }
    }

    fn will_answer(&self, answer: &str) {
        self.answers.lock().unwrap().push_back(answer.to_owned());
    }
}

/// An agents file in the bench's folder: the planner at `url`, and two
/// agents to route to.
fn agents_file(bench: &Bench, planner: &str) -> String {
    let path = bench.path().join("agents.toml");
    std::fs::write(
        &path,
        format!(
            "default = \"coder\"\ntriage_agent = \"planner\"\n\
             [agents.planner]\n{planner}\n\
             [agents.coder]\ncommand = \"true\"\ndescription = \"writes and tests Rust\"\n\
             [agents.writer]\ncommand = \"true\"\ndescription = \"writes user docs\"\n"
        ),
    )
    .unwrap();
    path.display().to_string()
}

fn json_line(stdout: &str) -> Value {
    serde_json::from_str(stdout.trim()).unwrap_or_else(|_| panic!("one JSON line: {stdout}"))
}

fn card_count(bench: &Bench) -> usize {
    let listed: Value = serde_json::from_str(&bench.ok(&["ls", "--archived", "--json"])).unwrap();
    listed.as_array().unwrap().len()
}

#[test]
fn specify_and_decompose_through_an_http_agent_on_sqlite() {
    specify_and_decompose_on(&Bench::new());
}

#[test]
fn specify_and_decompose_through_an_http_agent_on_postgres() {
    specify_and_decompose_on(&Bench::postgres());
}

fn specify_and_decompose_on(bench: &Bench) {
    let planner = Planner::start();
    let agents = agents_file(
        bench,
        &format!(
            "http = \"{}?model=planner-model&retries=0\"",
            planner.server.base_url
        ),
    );
    let idea = bench.add("login page", &["--triage", "--body", "users want it"]);
    planner.will_answer(
        "```json\n{\"title\": \"Add a login page\", \"body\": \"**Goal** users log in\"}\n```",
    );
    let said = bench.ok(&[
        "--agents", &agents, "specify", &idea, "--author", "ann", "--json",
    ]);
    let line = json_line(&said);
    assert_eq!(line["ok"], true, "{line}");
    assert_eq!(line["new_title"], "Add a login page");
    assert_eq!(line["status"], "ready");
    let card = bench.show(&idea);
    assert_eq!(card["task"]["status"], "ready");
    assert_eq!(card["task"]["title"], "Add a login page");
    assert_eq!(card["task"]["body"], "**Goal** users log in");
    let note = card["comments"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(note["author"], "ann");
    assert!(note["body"].as_str().unwrap().contains("planner"), "{note}");
    // The prompt: the documented system message and the card.
    let requests = planner.server.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0]["model"], "planner-model");
    assert!(requests[0].get("tools").is_none(), "no tools offered");
    let messages = requests[0]["messages"].as_array().unwrap();
    assert!(
        messages[0]["content"]
            .as_str()
            .unwrap()
            .contains("triage specifier")
    );
    let user = messages[1]["content"].as_str().unwrap();
    assert!(
        user.contains(&format!(
            "Task id: {idea}\nTitle: login page\nBody:\nusers want it"
        )),
        "{user}"
    );

    // Once per card: asked again, it is refused before the agent is.
    let again = bench.run(&["--agents", &agents, "specify", &idea]);
    assert_eq!(again.status.code(), Some(1));
    assert!(
        text(&again.stderr).contains("not in triage"),
        "{}",
        text(&again.stderr)
    );
    assert_eq!(planner.server.requests().len(), 1, "the agent is not asked");

    // Decompose: children routed by description, linked, the card waits.
    let big = bench.add("ship search", &["--triage", "--tenant", "acme"]);
    planner.will_answer(
        &json!({
            "fanout": true, "rationale": "index first, then document",
            "tasks": [
                {"title": "Document search", "body": "user docs", "assignee": "writer", "parents": [1]},
                {"title": "Build the index", "body": "in Rust", "assignee": "coder", "parents": []},
            ]
        })
        .to_string(),
    );
    let said = bench.ok(&["--agents", &agents, "decompose", &big, "--json"]);
    let line = json_line(&said);
    assert_eq!(line["ok"], true, "{line}");
    assert_eq!(line["fanout"], true);
    let children: Vec<String> = line["child_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|id| id.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(children.len(), 2);
    let (docs, index) = (bench.show(&children[0]), bench.show(&children[1]));
    assert_eq!(docs["task"]["title"], "Document search");
    assert_eq!(docs["task"]["assignee"], "writer");
    assert_eq!(docs["task"]["tenant"], "acme");
    assert_eq!(docs["task"]["status"], "todo");
    assert_eq!(docs["parents"], json!([children[1]]));
    assert_eq!(index["task"]["assignee"], "coder");
    assert_eq!(index["task"]["status"], "ready");
    let root = bench.show(&big);
    assert_eq!(root["task"]["status"], "todo");
    let mut parents: Vec<String> = serde_json::from_value(root["parents"].clone()).unwrap();
    parents.sort();
    let mut expected = children.clone();
    expected.sort();
    assert_eq!(parents, expected, "the card waits for every child");
    let prompt = &planner.server.requests()[1]["messages"];
    let user = prompt[1]["content"].as_str().unwrap();
    assert!(
        user.contains("  - coder: writes and tests Rust\n"),
        "{user}"
    );
    assert!(user.contains("  - writer: writes user docs\n"), "{user}");
    assert!(
        user.contains("default agent (for a null assignee): coder"),
        "{user}"
    );

    // Malformed or hostile answers write nothing and say why.
    let rough = bench.add("rough", &["--triage"]);
    let before = card_count(bench);
    for (answer, why) in [
        (
            "Sure! I would split it into two tasks.",
            "is not a JSON object",
        ),
        (
            r#"{"fanout": true, "tasks": [{"title": "a", "parents": [1]}, {"title": "b", "parents": [0]}]}"#,
            "cycle",
        ),
        (
            r#"{"fanout": true, "tasks": [{"title": "a", "assignee": "root"}]}"#,
            "not an agent of the roster",
        ),
        (
            r#"{"fanout": true, "tasks": [{"title": "a", "parents": [7]}]}"#,
            "the parent 7",
        ),
    ] {
        planner.will_answer(answer);
        let output = bench.run(&["--agents", &agents, "decompose", &rough]);
        let said = text(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{answer}: {said}");
        assert!(said.contains(why), "{answer}: {said}");
        assert!(said.contains("nothing was written"), "{said}");
        let card = bench.show(&rough);
        assert_eq!(card["task"]["status"], "triage");
        assert_eq!(card["comments"], json!([]));
        assert_eq!(card_count(bench), before);
    }
    // The agent down: said, nothing written.
    planner.will_answer("");
    let output = bench.run(&["--agents", &agents, "specify", &rough]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        text(&output.stderr).contains("is empty"),
        "{}",
        text(&output.stderr)
    );
    assert_eq!(bench.show(&rough)["task"]["status"], "triage");
}

/// A command agent that answers a specification for any card, after
/// writing what it was handed (its request and whether it saw the board's
/// password) beside itself.
const COMMAND_PLANNER: &str = r#"#!/bin/sh
here=$(dirname "$0")
cat > "$here/request.$$.json"
echo "${PGPASSWORD-unset}" > "$here/password.$$"
printf '%s\n' '{"title": "Specified by a command", "body": "**Goal** it works"}'
"#;

#[test]
fn a_command_agent_specifies_every_card_in_triage_of_a_tenant() {
    let bench = Bench::new();
    let script = bench.path().join("planner.sh");
    std::fs::write(&script, COMMAND_PLANNER).unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let agents = agents_file(&bench, &format!("command = \"{}\"", script.display()));
    let first = bench.add("first idea", &["--triage", "--tenant", "acme"]);
    let second = bench.add("second idea", &["--triage", "--tenant", "acme"]);
    let other = bench.add("another tenant's", &["--triage", "--tenant", "zeta"]);
    let output = bench
        .command()
        .args(["--db", bench.db.to_str().unwrap(), "--agents", &agents])
        .args(["specify", "--all", "--tenant", "acme", "--json"])
        .env("PGPASSWORD", "hunter2-secret")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let lines: Vec<Value> = text(&output.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(lines[0]["task_id"], first.as_str());
    assert_eq!(lines[1]["task_id"], second.as_str());
    for id in [&first, &second] {
        let card = bench.show(id);
        assert_eq!(card["task"]["title"], "Specified by a command");
        assert_eq!(card["task"]["status"], "ready");
    }
    assert_eq!(bench.show(&other)["task"]["status"], "triage");
    let mut requests = Vec::new();
    for entry in std::fs::read_dir(bench.path()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("request.") {
            requests.push(
                serde_json::from_str::<Value>(&std::fs::read_to_string(&path).unwrap()).unwrap(),
            );
        }
        if name.starts_with("password.") {
            assert_eq!(
                std::fs::read_to_string(&path).unwrap().trim(),
                "unset",
                "no board password for the agent"
            );
        }
    }
    assert_eq!(requests.len(), 2);
    assert!(requests.iter().all(|request| request["kind"] == "specify"));
    assert!(
        requests
            .iter()
            .any(|request| request["task"]["id"] == first.as_str())
    );
    assert!(
        requests[0]["system"]
            .as_str()
            .unwrap()
            .contains("triage specifier")
    );
    assert!(requests[0]["message"].as_str().unwrap().contains("idea"));

    // Nothing left in triage of the tenant: said, exit 0.
    let said = bench.ok(&["--agents", &agents, "specify", "--all", "--tenant", "acme"]);
    assert!(
        said.contains("no cards in triage of the tenant acme"),
        "{said}"
    );
}

#[test]
fn an_agent_that_hangs_is_stopped_whole_and_nothing_is_written() {
    let bench = Bench::new();
    let pid_file = bench.path().join("sleeper.pid");
    let agents = agents_file(
        &bench,
        &format!(
            "command = \"sleep 300 >/dev/null 2>&1 & echo $! > {} ; wait\"",
            pid_file.display()
        ),
    );
    let idea = bench.add("idea", &["--triage"]);
    let output = bench.run(&["--agents", &agents, "specify", &idea, "--timeout", "1s"]);
    let said = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{said}");
    assert!(said.contains("gave no answer within"), "{said}");
    assert_eq!(bench.show(&idea)["task"]["status"], "triage");
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let gone = (0..200).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(50));
        crate::reaped(pid)
    });
    if !gone {
        let _ = std::process::Command::new("kill")
            .arg(pid.to_string())
            .status();
    }
    assert!(
        gone,
        "the agent's own child {pid} outlived its agent's limit"
    );
}

#[test]
fn specify_says_what_is_missing_and_changes_nothing() {
    let bench = Bench::new();
    let idea = bench.add("idea", &["--triage"]);
    bench.refused(&["specify", &idea], "no agents file");
    let file = bench.path().join("plain.toml");
    std::fs::write(&file, "[agents.coder]\ncommand = \"true\"\n").unwrap();
    let plain = file.display().to_string();
    bench.refused(
        &["--agents", &plain, "specify", &idea],
        "--agent NAME, or triage_agent",
    );
    bench.refused(
        &["--agents", &plain, "specify", &idea, "--agent", "ghost"],
        "no agent of that name",
    );
    let seed = bench.path().join("seed.toml");
    std::fs::write(
        &seed,
        "[agents.hermes]\nhermes = \"default\"\nhermes_bin = \"/bin/true\"\n",
    )
    .unwrap();
    bench.refused(
        &[
            "--agents",
            seed.to_str().unwrap(),
            "decompose",
            &idea,
            "--agent",
            "hermes",
        ],
        "seed system's worker",
    );
    let bad = bench.path().join("bad.toml");
    std::fs::write(
        &bad,
        "triage_agent = \"ghost\"\n[agents.coder]\ncommand = \"true\"\n",
    )
    .unwrap();
    bench.refused(
        &["--agents", bad.to_str().unwrap(), "specify", &idea],
        "triage_agent = \"ghost\" names no agent",
    );
    bench.refused(
        &[
            "--agents",
            &plain,
            "specify",
            &idea,
            "--agent",
            "coder",
            "--timeout",
            "0s",
        ],
        "--timeout",
    );
    let usage = bench.run(&["specify"]);
    assert_eq!(usage.status.code(), Some(2), "clap's usage error");
    assert_eq!(bench.show(&idea)["task"]["status"], "triage");
    assert_eq!(bench.show(&idea)["comments"], json!([]));
}

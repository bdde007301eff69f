//! One board, both systems: the seed system's own CLI (`hermes-agent`
//! 0.19.0 from the package registry, in this test's own venv) and ours, on
//! each other's boards.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use kanban_testkit::{Reply, ScriptedHttpServer};
use serde_json::{Value, json};

use crate::{Bench, runs, text};

/// The seed system's release, as its users install it.
const SEED_RELEASE: &str = "hermes-agent==0.19.0";

/// A venv of this test binary's own with the seed system installed; its
/// `hermes`. Made once (the tests of one run share it) under Cargo's
/// folder for test files, and kept there for the next run: a venv that
/// was not finished is never used.
fn seed_cli(_dir: &Path) -> PathBuf {
    static VENV: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    VENV.get_or_init(|| {
        let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("seed-venv-hermes-agent-0.19.0");
        let finished = venv.join("installed");
        // A venv cannot move (its scripts name their interpreter by its
        // path): it is made where it stays, and marked when whole.
        if !finished.exists() {
            let _ = std::fs::remove_dir_all(&venv);
            install_seed(&venv);
            std::fs::write(&finished, SEED_RELEASE).unwrap();
        }
        venv.join("bin/hermes")
    })
    .clone()
}

/// A venv at `venv` with the seed system installed from the registry.
fn install_seed(venv: &Path) {
    let made = Command::new("python3")
        .args(["-m", "venv"])
        .arg(venv)
        .output()
        .expect("python3 runs the seed system: apt-get install python3-venv (.ci/run does)");
    assert!(
        made.status.success(),
        "python3 -m venv: {}",
        text(&made.stderr)
    );
    let installed = Command::new(venv.join("bin/pip"))
        .args([
            "install",
            "--quiet",
            "--disable-pip-version-check",
            SEED_RELEASE,
        ])
        .output()
        .unwrap();
    assert!(
        installed.status.success(),
        "pip install {SEED_RELEASE} failed (this test needs the package registry): {}",
        text(&installed.stderr)
    );
}

/// `hermes kanban ARGS…` on the board file `db`, its home in `home`.
fn hermes(cli: &Path, home: &Path, db: Option<&Path>, args: &[&str]) -> Output {
    let mut command = Command::new(cli);
    command.env("HERMES_HOME", home).arg("kanban").args(args);
    for (seed, ours) in kanban_core::vars::KANBAN_NAMES {
        command.env_remove(seed).env_remove(ours);
    }
    if let Some(db) = db {
        command.env("HERMES_KANBAN_DB", db);
    }
    command.output().unwrap()
}

fn said(output: &Output) -> String {
    format!("{}{}", text(&output.stdout), text(&output.stderr))
}

#[test]
fn each_system_reads_and_works_the_others_lanes() {
    let bench = Bench::new();
    let cli = seed_cli(bench.path());
    let home = bench.path().join("hermes-home");
    std::fs::create_dir_all(&home).unwrap();

    // Our board, the seed system's hands: it leaves our held, future and
    // triage cards alone, and claims the ready one.
    let held = bench.add("held by us", &[]);
    bench.ok(&["hold", &held]);
    let later = bench.add("due in an hour", &["--not-before", "+1h"]);
    let shaped = bench.add("to shape", &["--triage"]);
    let ready = bench.add("ready for anyone", &[]);
    for (id, lane) in [
        (&held, "scheduled"),
        (&later, "scheduled"),
        (&shaped, "triage"),
    ] {
        let refused = hermes(&cli, &home, Some(&bench.db), &["claim", id]);
        assert!(
            said(&refused).contains(&format!("cannot claim {id}: status={lane}")),
            "{id}: {}",
            said(&refused)
        );
    }
    let claimed = hermes(&cli, &home, Some(&bench.db), &["claim", &ready]);
    assert!(
        said(&claimed).contains(&format!("Claimed {ready}")),
        "{}",
        said(&claimed)
    );
    assert_eq!(bench.show(&ready)["task"]["status"], "running");
    let listed = hermes(&cli, &home, Some(&bench.db), &["ls", "--json"]);
    assert!(listed.status.success(), "{}", said(&listed));
    let cards: Value = serde_json::from_slice(&listed.stdout).unwrap();
    let status_of = |id: &str| {
        cards
            .as_array()
            .unwrap()
            .iter()
            .find(|card| card["id"] == id)
            .map(|card| card["status"].clone())
    };
    assert_eq!(status_of(&held), Some("scheduled".into()));
    assert_eq!(status_of(&shaped), Some("triage".into()));
    // Ours reads the board the seed system just wrote.
    assert!(bench.ok(&["ls"]).contains(&ready));

    // The seed system's board, our hands: its triage and scheduled cards
    // keep their lanes under our dispatcher, its links promote at
    // completion, and our operator moves take them out.
    let seed_home = bench.path().join("seed-home");
    std::fs::create_dir_all(&seed_home).unwrap();
    let create = |args: &[&str]| -> String {
        let mut all = vec!["create"];
        all.extend_from_slice(args);
        all.push("--json");
        let made = hermes(&cli, &seed_home, None, &all);
        assert!(made.status.success(), "{args:?}: {}", said(&made));
        let card: Value = serde_json::from_slice(&made.stdout).unwrap();
        card["id"].as_str().unwrap().to_owned()
    };
    assert!(hermes(&cli, &seed_home, None, &["init"]).status.success());
    let triaged = create(&["their triage card", "--triage"]);
    let parked = create(&["their parked card"]);
    let parked_by_them = hermes(
        &cli,
        &seed_home,
        None,
        &["schedule", &parked, "after", "lunch"],
    );
    assert!(parked_by_them.status.success(), "{}", said(&parked_by_them));
    let parent = create(&["their parent"]);
    let child = create(&["their child", "--parent", &parent]);
    let asking = create(&["their card that asks a person"]);
    let blocked_by_them = hermes(
        &cli,
        &seed_home,
        None,
        &["block", &asking, "which region?", "--kind", "needs_input"],
    );
    assert!(
        blocked_by_them.status.success(),
        "{}",
        said(&blocked_by_them)
    );
    let board = seed_home.join("kanban.db");
    let ours = |args: &[&str]| {
        let output = bench.on(&board).args(args).output().unwrap();
        assert!(output.status.success(), "{args:?}: {}", said(&output));
        text(&output.stdout)
    };
    ours(&["migrate"]);
    let listed = ours(&["ls"]);
    for (id, lane) in [
        (&triaged, "triage"),
        (&parked, "scheduled"),
        (&parent, "ready"),
        (&child, "todo"),
        (&asking, "blocked (needs_input)"),
    ] {
        assert!(
            listed
                .lines()
                .any(|line| line.contains(id.as_str()) && line.contains(lane)),
            "{id} {lane}: {listed}"
        );
    }
    let agent = bench.path().join("agent.sh");
    kanban_testkit::write_executable(&agent, "#!/bin/sh\nkanban complete --summary done\n");
    let dispatch = || {
        let output = bench
            .on(&board)
            .args(["dispatch", "--until-idle", "--interval", "1", "--agent"])
            .arg(&agent)
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", said(&output));
    };
    dispatch();
    let status = |id: &str| -> String {
        let card: Value = serde_json::from_str(&ours(&["show", id, "--json"])).unwrap();
        card["task"]["status"].as_str().unwrap().to_owned()
    };
    assert_eq!(status(&triaged), "triage");
    assert_eq!(status(&parked), "scheduled");
    assert_eq!(
        (status(&parent), status(&child)),
        ("done".into(), "done".into())
    );
    assert!(ours(&["ls", "--block-kind", "needs_input"]).contains(&asking));
    ours(&["promote", &triaged]);
    ours(&["unblock", &parked]);
    ours(&["unblock", &asking]);
    dispatch();
    assert_eq!(
        (status(&triaged), status(&parked)),
        ("done".into(), "done".into())
    );
    // Each finds the other's worker logs: the seed system ours, linked
    // where it looks, and ours the one its worker wrote, where its own code
    // puts it.
    let theirs = hermes(&cli, &seed_home, None, &["log", &parent]);
    assert!(
        text(&theirs.stdout).contains("[kanban-dispatch] run "),
        "{}",
        said(&theirs)
    );
    let python = cli.with_file_name("python");
    let where_theirs = Command::new(&python)
        .env("HERMES_HOME", &seed_home)
        .args(["-c", "import sys; from hermes_cli.kanban_db import worker_log_path; print(worker_log_path(sys.argv[1]))"])
        .arg(&child)
        .output()
        .unwrap();
    assert!(where_theirs.status.success(), "{}", said(&where_theirs));
    let their_log = PathBuf::from(text(&where_theirs.stdout).trim());
    assert!(std::fs::symlink_metadata(&their_log).unwrap().is_symlink());
    std::fs::remove_file(&their_log).unwrap();
    std::fs::remove_file(seed_home.join("logs").join(format!("{child}.log"))).unwrap();
    std::fs::write(&their_log, "their worker was here\n").unwrap();
    assert!(ours(&["logs", &child]).contains("their worker was here"));
    // And the seed system reads what ours wrote, after our migration.
    let seen = hermes(&cli, &seed_home, None, &["ls", "--json"]);
    assert!(seen.status.success(), "{}", said(&seen));
    let cards: Value = serde_json::from_slice(&seen.stdout).unwrap();
    for card in cards.as_array().unwrap() {
        assert_eq!(card["status"], "done", "{card}");
    }
    swarms_are_found_by_either_system(&cli, &home, &bench);
    files_and_tenants_cross_over(&cli, &seed_home, &bench);
}

/// On the seed system's own board, each system sees the other's
/// attachments (kept in the one folder both use) and tenants.
fn files_and_tenants_cross_over(cli: &Path, seed_home: &Path, bench: &Bench) {
    let board = seed_home.join("kanban.db");
    let ours = |args: &[&str]| {
        let output = bench.on(&board).args(args).output().unwrap();
        assert!(output.status.success(), "{args:?}: {}", said(&output));
        text(&output.stdout)
    };
    let theirs = |args: &[&str]| {
        let output = hermes(cli, seed_home, None, args);
        assert!(output.status.success(), "{args:?}: {}", said(&output));
        text(&output.stdout)
    };
    let made: Value = serde_json::from_str(&theirs(&[
        "create",
        "their tenant's card",
        "--tenant",
        "acme",
        "--json",
    ]))
    .unwrap();
    let their_card = made["id"].as_str().unwrap().to_owned();
    let our_card = ours(&["add", "our tenant's card", "--tenant", "zenith"])
        .trim()
        .to_owned();
    let listed: Value = serde_json::from_str(&ours(&["ls", "--tenant", "acme", "--json"])).unwrap();
    assert_eq!(listed[0]["id"], their_card.as_str(), "{listed}");
    let listed: Value =
        serde_json::from_str(&theirs(&["ls", "--tenant", "zenith", "--json"])).unwrap();
    assert_eq!(listed[0]["id"], our_card.as_str(), "{listed}");

    let file = bench.path().join("report.txt");
    std::fs::write(&file, "the report\n").unwrap();
    theirs(&[
        "attach",
        &our_card,
        file.to_str().unwrap(),
        "--name",
        "theirs.txt",
    ]);
    ours(&[
        "attach",
        &our_card,
        file.to_str().unwrap(),
        "--name",
        "ours.txt",
    ]);
    let folder = seed_home.join("kanban/attachments").join(&our_card);
    for name in ["theirs.txt", "ours.txt"] {
        assert_eq!(
            std::fs::read_to_string(folder.join(name)).unwrap(),
            "the report\n",
            "{name}"
        );
    }
    let seen_by_us: Value =
        serde_json::from_str(&ours(&["attachments", &our_card, "--json"])).unwrap();
    let seen_by_them: Value =
        serde_json::from_str(&theirs(&["attachments", &our_card, "--json"])).unwrap();
    let names = |value: &Value| -> Vec<String> {
        value
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["filename"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(names(&seen_by_us), ["theirs.txt", "ours.txt"]);
    assert_eq!(names(&seen_by_them), ["theirs.txt", "ours.txt"]);
    // Either removes the other's, file and all.
    let their_id = seen_by_us[0]["id"].to_string();
    let our_id = seen_by_us[1]["id"].to_string();
    ours(&["attach-rm", &their_id]);
    theirs(&["attach-rm", &our_id]);
    assert!(!folder.join("theirs.txt").exists() && !folder.join("ours.txt").exists());
    assert!(ours(&["attachments", &our_card]).contains("has no attachments"));
    // Both count the board alike.
    let their_stats: Value = serde_json::from_str(&theirs(&["stats", "--json"])).unwrap();
    let our_stats: Value = serde_json::from_str(&ours(&["stats", "--json"])).unwrap();
    for key in ["by_status", "by_assignee"] {
        assert_eq!(their_stats[key], our_stats[key], "{key}");
    }
    // Both diagnose a card that keeps failing alike.
    {
        let conn = rusqlite::Connection::open(&board).unwrap();
        conn.execute(
            "UPDATE tasks SET consecutive_failures = 4, last_failure_error = 'boom' WHERE id = ?1",
            [&their_card],
        )
        .unwrap();
    }
    let flagged = |found: &Value| -> Vec<(String, String)> {
        found
            .as_array()
            .unwrap()
            .iter()
            .filter(|card| card["task_id"] == their_card.as_str())
            .flat_map(|card| card["diagnostics"].as_array().unwrap().clone())
            .map(|d| {
                (
                    d["kind"].as_str().unwrap().to_owned(),
                    d["severity"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    };
    let theirs_found: Value = serde_json::from_str(&theirs(&["diagnostics", "--json"])).unwrap();
    let ours_found: Value = serde_json::from_str(&ours(&["diagnostics", "--json"])).unwrap();
    assert_eq!(
        flagged(&theirs_found),
        [("repeated_failures".to_owned(), "critical".to_owned())]
    );
    assert_eq!(flagged(&ours_found), flagged(&theirs_found));
}

/// A swarm either system made is the one the other's `swarm` returns for
/// the same idempotency key: the root's topology note is read by both.
fn swarms_are_found_by_either_system(cli: &Path, home: &Path, bench: &Bench) {
    let swarm = |key: &str| {
        [
            "swarm".to_owned(),
            format!("the goal of {key}"),
            "--worker".to_owned(),
            "writer:draft".to_owned(),
            "--worker".to_owned(),
            "counter:count".to_owned(),
            "--verifier".to_owned(),
            "checker".to_owned(),
            "--synthesizer".to_owned(),
            "editor".to_owned(),
            "--idempotency-key".to_owned(),
            key.to_owned(),
            "--json".to_owned(),
        ]
    };
    let cards = |said: &str| -> Value {
        let mut cards: Value = serde_json::from_str(said).unwrap();
        cards.as_object_mut().unwrap().remove("made");
        cards
    };
    let theirs = |key: &str| {
        let args = swarm(key);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let output = hermes(cli, home, Some(&bench.db), &args);
        assert!(output.status.success(), "{}", said(&output));
        cards(&text(&output.stdout))
    };
    let ours = |key: &str| {
        let args = swarm(key);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        cards(&bench.ok(&args))
    };
    let made_by_us = ours("ours");
    assert_eq!(theirs("ours"), made_by_us);
    let made_by_them = theirs("theirs");
    assert_eq!(ours("theirs"), made_by_them);
    assert_ne!(made_by_us, made_by_them);
    let verifier = bench.show(made_by_them["verifier_id"].as_str().unwrap());
    assert_eq!(verifier["task"]["status"], "todo");
    assert_eq!(verifier["parents"].as_array().unwrap().len(), 2);
}

/// The model the seed system's worker talks to, on loopback: its probes for
/// a local server's kind get 404, `GET /v1/models` names the one model, and
/// each chat request gets `chat(request)`.
fn seed_model(chat: impl Fn(&Value) -> Reply + Send + 'static) -> ScriptedHttpServer {
    ScriptedHttpServer::start_routed(move |_, target, body| match target {
        "GET /v1/models" => Reply::json(
            200,
            r#"{"object": "list", "data": [{"id": "lab-model", "object": "model", "owned_by": "test"}]}"#,
        ),
        "POST /v1/chat/completions" => chat(body),
        _ => Reply::json(404, r#"{"error": "not found"}"#),
    })
}

/// One streamed chat chunk.
fn chunk(delta: &Value, finish: Option<&str>) -> String {
    json!({
        "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": "lab-model",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]
    })
    .to_string()
}

/// A streamed answer (the worker streams) that calls `kanban_complete`,
/// then a closing text once the tool answered.
fn completes_the_card(request: &Value) -> Reply {
    let after_tool = request["messages"]
        .as_array()
        .and_then(|messages| messages.last())
        .is_some_and(|last| last["role"] == "tool");
    let events = if after_tool {
        vec![
            chunk(&json!({"role": "assistant", "content": "Done."}), None),
            chunk(&json!({}), Some("stop")),
        ]
    } else {
        vec![
            chunk(
                &json!({"role": "assistant", "content": null, "tool_calls": [{
                    "index": 0, "id": "call_1", "type": "function",
                    "function": {"name": "kanban_complete", "arguments": ""}
                }]}),
                None,
            ),
            chunk(
                &json!({"tool_calls": [{"index": 0, "function": {
                    "arguments": "{\"summary\": \"written by the seed worker\"}"
                }}]}),
                None,
            ),
            chunk(&json!({}), Some("tool_calls")),
        ]
    };
    Reply::Stream {
        events,
        complete: true,
    }
}

/// The seed system's home at `root` with a profile `coder` whose model is
/// at `base_url`, set so that nothing the worker does leaves loopback: no
/// update check (a fresh cache), no scanner download, no lazy installs, no
/// model catalogue; one try per call.
fn seed_home_for(root: &Path, base_url: &str) {
    let profile = root.join("profiles/coder");
    std::fs::create_dir_all(&profile).unwrap();
    std::fs::write(
        profile.join("config.yaml"),
        format!(
            "model:\n  provider: custom\n  default: lab-model\n  base_url: {base_url}\n  api_key: sk-test\n  context_length: 128000\nagent:\n  api_max_retries: 1\nsecurity:\n  tirith_enabled: false\n  allow_lazy_installs: false\nplatform_toolsets:\n  cli: [todo]\n"
        ),
    )
    .unwrap();
    let checked =
        json!({"ts": crate::now(), "behind": null, "rev": null, "ver": "0.19.0"}).to_string();
    std::fs::write(profile.join(".update_check"), checked).unwrap();
    std::fs::create_dir_all(root.join("home")).unwrap();
}

/// Our dispatcher until the board is idle, with the seed system's worker
/// (`hermes` at `cli`, its home `root`) as the agent `coder` of the board's
/// agents file.
fn seed_dispatcher(bench: &Bench, cli: &Path, root: &Path) -> Command {
    std::fs::write(
        bench.path().join("kanban.toml"),
        format!(
            "[agents.coder]\nhermes = \"coder\"\nhermes_bin = \"{}\"\n",
            cli.display()
        ),
    )
    .unwrap();
    let mut command = bench.command();
    command
        .arg("--db")
        .arg(&bench.db)
        .args(["dispatch", "--until-idle", "--interval", "0.2"])
        .env("HERMES_HOME", root)
        .env("HOME", root.join("home"));
    command
}

/// Runs [`seed_dispatcher`] to its end; what it said.
fn dispatch_seed_worker(bench: &Bench, cli: &Path, root: &Path) -> String {
    let output = seed_dispatcher(bench, cli, root).output().unwrap();
    assert!(output.status.success(), "{}", said(&output));
    said(&output)
}

#[test]
fn the_seed_systems_own_worker_works_our_card_under_our_dispatcher() {
    let bench = Bench::new();
    let cli = seed_cli(bench.path());
    let root = bench.path().join("hermes-root");
    let model = seed_model(completes_the_card);
    seed_home_for(&root, &model.base_url);
    let card = bench.add("write the report", &["--assignee", "coder"]);
    let said = dispatch_seed_worker(&bench, &cli, &root);
    let shown = bench.show(&card);
    assert_eq!(shown["task"]["status"], "done", "{said}\n{shown}");
    let run = &runs(&shown)[0];
    assert_eq!(run["outcome"], "completed", "{run}");
    assert_eq!(run["summary"], "written by the seed worker", "{run}");
    // Our dispatcher booked its worker's exit, by our table.
    let exited = bench.event(&card, "worker_exited");
    assert_eq!(exited["payload"]["exit_code"], 0, "{exited}");
    // The model was asked for the card in the seed system's words, with
    // the seed system's tools, and the card's log has the run.
    let chats: Vec<Value> = model
        .requests()
        .into_iter()
        .filter(|request| request["messages"].is_array())
        .collect();
    let asked = chats[0]["messages"]
        .as_array()
        .and_then(|messages| messages.last())
        .map(|message| message["content"].clone());
    assert_eq!(asked, Some(json!(format!("work kanban task {card}"))));
    assert!(
        chats[0]["tools"]
            .to_string()
            .contains("\"kanban_complete\"")
    );
    assert!(bench.ok(&["logs", &card]).contains("session_id:"));
}

#[test]
fn a_rate_limited_seed_worker_exits_75_and_walls_its_agent() {
    let bench = Bench::new();
    let cli = seed_cli(bench.path());
    let root = bench.path().join("hermes-root");
    let model = seed_model(|_| {
        Reply::json(
            429,
            r#"{"error": {"message": "Rate limit reached for lab-model on requests per min (RPM): Limit 3, Used 3, Requested 1.", "type": "requests", "param": null, "code": "rate_limit_exceeded"}}"#,
        )
    });
    seed_home_for(&root, &model.base_url);
    let card = bench.add("write the report", &["--assignee", "coder"]);
    let said = dispatch_seed_worker(&bench, &cli, &root);
    assert!(
        said.contains("a provider wall holds the cards of agent coder"),
        "{said}"
    );
    let shown = bench.show(&card);
    assert_eq!(shown["task"]["status"], "ready", "{said}\n{shown}");
    assert_eq!(shown["task"]["consecutive_failures"], 0, "{shown}");
    assert_eq!(runs(&shown)[0]["outcome"], "rate_limited");
    let booked = bench.event(&card, "rate_limited");
    assert_eq!(booked["payload"]["exit_code"], 75, "{booked}");
    let walls: Value = serde_json::from_str(&bench.ok(&["walls", "--json"])).unwrap();
    assert_eq!(walls.as_array().unwrap().len(), 1, "{walls}");
    assert_eq!(walls[0]["agent"], "coder", "{walls}");
}

/// The pids of the seed system's workers started for `card`.
fn seed_workers_of(card: &str) -> Vec<i32> {
    let asked = format!("work kanban task {card}");
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            !crate::dead(*pid)
                && std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|line| {
                    let words: Vec<&[u8]> = line.split(|b| *b == 0).collect();
                    words.contains(&asked.as_bytes())
                        && words.contains(&b"--accept-hooks".as_slice())
                })
        })
        .collect()
}

#[test]
fn a_seed_worker_that_lost_its_claim_is_stopped_with_its_group() {
    let bench = Bench::new();
    let cli = seed_cli(bench.path());
    let root = bench.path().join("hermes-root");
    // The model thinks for a long while: the worker is busy when its
    // claim goes.
    let model = seed_model(|request| {
        Reply::After(
            Duration::from_secs(120),
            Box::new(completes_the_card(request)),
        )
    });
    seed_home_for(&root, &model.base_url);
    let card = bench.add("write the report", &["--assignee", "coder"]);
    let dispatcher = seed_dispatcher(&bench, &cli, &root)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    crate::wait_for("the seed worker asks its model", || {
        model
            .requests()
            .iter()
            .any(|request| request["messages"].is_array())
    });
    let first = seed_workers_of(&card);
    assert_eq!(first.len(), 1, "{first:?}");
    bench.ok(&["reclaim", &card]);
    crate::wait_for("the worker that lost its claim is gone", || {
        crate::dead(first[0])
    });
    // The card goes to a new run; cancelling it ends that one too, and the
    // dispatcher with it.
    crate::wait_for("the next run's worker starts", || {
        seed_workers_of(&card).iter().any(|pid| *pid != first[0])
    });
    bench.ok(&["cancel", &card]);
    let output = dispatcher.wait_with_output().unwrap();
    assert!(output.status.success(), "{}", said(&output));
    crate::wait_for("no seed worker of the card lives", || {
        seed_workers_of(&card).is_empty()
    });
    let shown = bench.show(&card);
    assert_eq!(runs(&shown)[0]["outcome"], "reclaimed", "{shown}");
}

/// One kanban home, two systems: each lists, uses and removes the boards
/// the other made, and both follow the one current board.
#[test]
fn both_systems_keep_the_same_boards_in_one_home() {
    let bench = Bench::new();
    let cli = seed_cli(bench.path());
    let home = bench.path().join("hermes-home");
    std::fs::create_dir_all(&home).unwrap();
    let ours = |args: &[&str]| {
        let output = bench
            .command()
            .env(kanban_core::vars::HOME, &home)
            .args(args)
            .output()
            .unwrap();
        assert!(output.status.success(), "{args:?}: {}", said(&output));
        text(&output.stdout)
    };
    let theirs = |args: &[&str]| {
        let output = hermes(&cli, &home, None, args);
        assert!(output.status.success(), "{args:?}: {}", said(&output));
        text(&output.stdout)
    };
    let board = |listed: &Value, slug: &str| -> Value {
        listed
            .as_array()
            .unwrap()
            .iter()
            .find(|entry| entry["slug"] == slug)
            .cloned()
            .unwrap_or_else(|| panic!("no board {slug}: {listed}"))
    };

    // Ours, seen by the seed system: its name, its cards, current.
    ours(&[
        "boards",
        "create",
        "ours",
        "--name",
        "Our Board",
        "--switch",
    ]);
    ours(&["add", "on our board"]);
    let listed: Value = serde_json::from_str(&theirs(&["boards", "list", "--json"])).unwrap();
    let entry = board(&listed, "ours");
    assert_eq!(entry["name"], "Our Board");
    assert_eq!(entry["is_current"], true);
    assert_eq!(entry["counts"], serde_json::json!({"ready": 1}));
    assert!(theirs(&["list"]).contains("on our board"));

    // Theirs, seen by us; their switch moves our current board.
    theirs(&["boards", "create", "theirs", "--name", "Their Board"]);
    theirs(&["--board", "theirs", "create", "on their board"]);
    theirs(&["boards", "switch", "theirs"]);
    let listed: Value = serde_json::from_str(&ours(&["boards", "list", "--json"])).unwrap();
    let entry = board(&listed, "theirs");
    assert_eq!(entry["name"], "Their Board");
    assert_eq!(entry["is_current"], true);
    assert_eq!(entry["counts"], serde_json::json!({"ready": 1}));
    assert!(ours(&["ls"]).contains("on their board"));

    // Our default board is theirs too.
    ours(&["--board", "default", "init"]);
    ours(&["--board", "default", "add", "on the default board"]);
    assert!(theirs(&["--board", "default", "list"]).contains("on the default board"));

    // A board either removes is gone for both.
    theirs(&["boards", "rm", "ours"]);
    let listed: Value = serde_json::from_str(&ours(&["boards", "list", "--json"])).unwrap();
    assert!(
        listed
            .as_array()
            .unwrap()
            .iter()
            .all(|entry| entry["slug"] != "ours"),
        "{listed}"
    );
    ours(&["boards", "rm", "theirs"]);
    let listed = theirs(&["boards", "list"]);
    assert!(!listed.contains("theirs"), "{listed}");
    assert!(listed.contains("Current board: default"), "{listed}");
}

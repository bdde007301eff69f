//! One board, both systems: the seed system's own CLI (`hermes-agent`
//! 0.19.0 from the package registry, in this test's own venv) and ours, on
//! each other's boards.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

use crate::{Bench, text};

/// The seed system's release, as its users install it.
const SEED_RELEASE: &str = "hermes-agent==0.19.0";

/// A venv of its own with the seed system installed; its `hermes`.
fn seed_cli(dir: &Path) -> PathBuf {
    let venv = dir.join("seed-venv");
    let made = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv)
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
    venv.join("bin/hermes")
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

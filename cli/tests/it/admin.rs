//! Board administration through the binary.

use serde_json::Value;

use crate::{Bench, runs, text};

#[test]
fn add_list_show_claim_unblock_reclaim() {
    let bench = Bench::new();
    let parent = bench.add("parent", &["--priority", "3"]);
    let json: Value =
        serde_json::from_str(&bench.ok(&["add", "child", "--parent", &parent, "--json"])).unwrap();
    let child = json["id"].as_str().unwrap().to_owned();
    let listed: Value = serde_json::from_str(&bench.ok(&["ls", "--json"])).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 2);
    assert_eq!(bench.show(&child)["task"]["status"], "todo");
    let table = bench.ok(&["ls"]);
    assert!(
        table.starts_with("ID") && table.contains("parent") && table.contains("todo"),
        "{table}"
    );
    let ready: Value =
        serde_json::from_str(&bench.ok(&["ls", "--status", "ready", "--json"])).unwrap();
    assert_eq!(ready[0]["id"], parent.as_str());

    let claim: Value =
        serde_json::from_str(&bench.ok(&["claim", &parent, "--ttl", "60", "--json"])).unwrap();
    for key in ["task_id", "run_id", "claim_lock", "claim_expires"] {
        assert!(!claim[key].is_null(), "claim --json has {key}");
    }
    let exports = bench.run(&["claim", &parent]);
    assert_eq!(
        exports.status.code(),
        Some(1),
        "a running card cannot be claimed again"
    );
    assert!(
        text(&exports.stderr).contains("running"),
        "{}",
        text(&exports.stderr)
    );
    bench.ok(&["reclaim", &parent]);
    assert_eq!(bench.show(&parent)["task"]["status"], "ready");
    let exports = bench.ok(&["claim", &parent]);
    assert!(
        exports.contains("export HERMES_KANBAN_TASK=")
            && exports.contains("export HERMES_KANBAN_CLAIM_LOCK="),
        "{exports}"
    );

    let blocked = bench.add("held", &["--blocked"]);
    assert_eq!(bench.show(&blocked)["task"]["status"], "blocked");
    bench.ok(&["unblock", &blocked]);
    assert_eq!(bench.show(&blocked)["task"]["status"], "ready");
    let events = bench.ok(&["events", &blocked, "--json"]);
    let kinds: Vec<String> = events
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["kind"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(kinds, ["created", "blocked", "unblocked"]);
    let shown = bench.ok(&["show", &parent]);
    assert!(
        shown.contains("runs:") && shown.contains("reclaimed"),
        "{shown}"
    );
}

#[test]
fn bad_input_gets_a_clear_error_and_changes_nothing() {
    let bench = Bench::new();
    let output = bench.run(&["ls", "--status", "bogus"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        text(&output.stderr).contains("unknown status \"bogus\": use one of"),
        "{}",
        text(&output.stderr)
    );
    let output = bench.run(&["show", "t_nope"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(text(&output.stderr).contains("t_nope is not on this board"));
    let output = bench.run(&["add", "  "]);
    assert_eq!(output.status.code(), Some(1));
    assert!(text(&output.stderr).contains("non-blank title"));
    let missing = bench.path().join("nope.db");
    let output = bench
        .command()
        .arg("--db")
        .arg(&missing)
        .arg("ls")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(
        text(&output.stderr).contains("kanban init") && text(&output.stderr).contains("nope.db")
    );
    assert!(!missing.exists());
    let output = bench.run(&["frobnicate"]);
    assert_eq!(output.status.code(), Some(2), "usage errors exit 2");
    let output = bench
        .command()
        .args(["--board", "Bad Name!", "ls"])
        .env("HERMES_KANBAN_HOME", bench.path())
        .output()
        .unwrap();
    assert!(
        text(&output.stderr).contains("board name"),
        "{}",
        text(&output.stderr)
    );
}

#[test]
fn the_kanban_home_and_board_have_kanban_names_and_the_seed_names_win() {
    let bench = Bench::new();
    let ours = bench.path().join("ours");
    let seed = bench.path().join("seed");
    let init = |command: &mut std::process::Command| {
        let output = command.arg("init").output().unwrap();
        assert!(output.status.success(), "{}", text(&output.stderr));
    };
    init(
        bench
            .command()
            .env("KANBAN_HOME", &ours)
            .env("KANBAN_BOARD", "team"),
    );
    assert!(ours.join("kanban/boards/team/kanban.db").is_file());
    init(
        bench
            .command()
            .env("KANBAN_HOME", &ours)
            .env("HERMES_KANBAN_HOME", &seed)
            .env("KANBAN_BOARD", "ours")
            .env("HERMES_KANBAN_BOARD", "seed"),
    );
    assert!(seed.join("kanban/boards/seed/kanban.db").is_file());
    assert!(!ours.join("kanban/boards/ours").exists());
    // A blank seed name is unset: ours stands in.
    init(
        bench
            .command()
            .env("KANBAN_HOME", &ours)
            .env("HERMES_KANBAN_HOME", " ")
            .env("KANBAN_BOARD", "blank"),
    );
    assert!(ours.join("kanban/boards/blank/kanban.db").is_file());
}

#[test]
fn named_boards_live_under_the_kanban_home() {
    let bench = Bench::new();
    let home = bench.path().join("home");
    let run = |args: &[&str]| {
        bench
            .command()
            .env("HERMES_KANBAN_HOME", &home)
            .args(args)
            .output()
            .unwrap()
    };
    assert!(run(&["--board", "team-a", "init"]).status.success());
    assert!(run(&["--board", "team-a", "add", "on a"]).status.success());
    assert!(home.join("kanban/boards/team-a/kanban.db").is_file());
    let listed = text(&run(&["--board", "team-a", "ls"]).stdout);
    assert!(listed.contains("on a"));
    let output = run(&["ls"]);
    assert_eq!(
        output.status.code(),
        Some(1),
        "the default board was never created"
    );
}

#[test]
fn help_teaches_with_examples_and_version_answers() {
    let bench = Bench::new();
    for command in [
        "worker", "prove", "claim", "add", "complete", "turn", "swarm",
    ] {
        for help in ["--help", "-h"] {
            let output = bench.command().args([command, help]).output().unwrap();
            assert!(output.status.success());
            let shown = text(&output.stdout);
            assert!(
                shown.contains("Example:"),
                "{command} {help} has an example"
            );
            // The command's own options first, the global ones after them
            // under a heading of their own, the examples last.
            let own = shown.find("\nOptions:\n").unwrap_or(usize::MAX);
            let global = shown.find("\nGlobal options:\n").unwrap_or(0);
            let example = shown.find("Example:").unwrap_or(0);
            assert!(
                own < global && global < example,
                "{command} {help}:\n{shown}"
            );
        }
    }
    // The short help is pinned as a reader sees it.
    let output = bench
        .command()
        .env("COLUMNS", "100")
        .env_remove("KANBAN_AGENTS")
        .args(["add", "-h"])
        .output()
        .unwrap();
    let pinned = include_str!("add-h.txt");
    assert_eq!(
        text(&output.stdout),
        pinned,
        "`kanban add -h` changed: check it by eye, then update cli/tests/it/add-h.txt"
    );
    let output = bench.command().arg("--version").output().unwrap();
    assert!(text(&output.stdout).starts_with("kanban "));
}

#[test]
fn completions_for_every_shell_and_a_manual_page_name_every_command() {
    let bench = Bench::new();
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let script = bench.ok(&["completions", shell]);
        for command in ["dispatch", "migrate", "prove", "worker"] {
            assert!(script.contains(command), "{shell}: no {command}");
        }
    }
    let bash = bench.path().join("kanban.bash");
    std::fs::write(&bash, bench.ok(&["completions", "bash"])).unwrap();
    let checked = std::process::Command::new("bash")
        .arg("-n")
        .arg(&bash)
        .output()
        .unwrap();
    assert!(checked.status.success(), "{}", text(&checked.stderr));
    let man = bench.ok(&["man"]);
    assert!(man.contains(".TH kanban 1"), "{man}");
    assert!(man.contains("dispatch") && man.contains("migrate"), "{man}");
}

#[test]
fn a_humans_comment_reaches_the_next_runs_agent_and_show() {
    use kanban_testkit::{AgentScript, AgentTurn};
    let bench = Bench::new();
    let id = bench.add("steerable", &[]);
    let said = bench.ok(&["comment", &id, "use the v2 API, not v1", "--author", "ana"]);
    assert_eq!(said.trim(), format!("{id} commented"));
    bench.ok(&["comment", &id, "  and keep it short  "]);
    let card = bench.show(&id);
    let comments = card["comments"].as_array().unwrap();
    assert_eq!(comments.len(), 2);
    assert_eq!(comments[0]["author"], "ana");
    assert_eq!(comments[0]["body"], "use the v2 API, not v1");
    assert_eq!(
        comments[1]["body"], "and keep it short",
        "newest last, trimmed"
    );
    assert!(bench.event_kinds(&id).contains(&"commented".to_owned()));
    let human = bench.ok(&["show", &id]);
    assert!(human.contains("ana: use the v2 API, not v1"), "{human}");

    let carrier = bench.claim(&id, None);
    let agent = AgentScript::new(vec![
        AgentTurn::result(r#"{"completed": true, "final_response": "ok"}"#).completing(),
    ])
    .write(bench.path(), "agent.sh");
    let output = bench.worker(&carrier, &agent.path, &[], &[]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let request = &agent.requests()[0];
    assert_eq!(
        request["task"]["comments"][0]["body"],
        "use the v2 API, not v1"
    );
    assert_eq!(
        request["task"]["comments"][1]["author"],
        comments[1]["author"]
    );

    for (args, needle) in [
        (
            vec!["comment", id.as_str(), "   "],
            "a comment needs some text",
        ),
        (
            vec!["comment", "t_00000000", "hello"],
            "t_00000000 is not on this board",
        ),
    ] {
        bench.refused(&args, needle);
    }
    let long = "x".repeat(kanban_core::MAX_COMMENT_BYTES + 1);
    let output = bench.run(&["comment", &id, &long]);
    assert!(text(&output.stderr).contains("at most 16384 bytes"));
    assert_eq!(
        bench.show(&id)["comments"].as_array().unwrap().len(),
        2,
        "nothing was added"
    );
}

#[test]
fn errors_are_json_with_json_and_times_are_human_without() {
    let bench = Bench::new();
    let output = bench.run(&["show", "t_00000000", "--json"]);
    assert_eq!(output.status.code(), Some(1));
    let error: Value = serde_json::from_str(text(&output.stderr).trim()).unwrap();
    assert_eq!(error["error"], "task t_00000000 is not on this board");
    assert_eq!(error["exit_code"], 1);
    let plain = bench.run(&["show", "t_00000000"]);
    assert_eq!(
        text(&plain.stderr).trim(),
        "error: task t_00000000 is not on this board"
    );
    let id = bench.add("timed", &[]);
    let shown = bench.ok(&["--utc", "show", &id]);
    assert!(
        shown.contains(" UTC (") && shown.contains("ago)") || shown.contains("(now)"),
        "{shown}"
    );
    let json = bench.show(&id);
    assert!(
        json["events"][0]["created_at"].is_i64(),
        "epoch seconds in --json"
    );
}

#[test]
fn ls_says_retry_only_for_a_card_that_failed() {
    let bench = Bench::new();
    let later = bench.add("due later", &["--not-before", "+2h"]);
    let listed = bench.ok(&["ls"]);
    let line = listed.lines().find(|line| line.contains(&later)).unwrap();
    assert!(
        line.contains("waits until") && !line.contains("retry"),
        "{line}"
    );
    let shown = bench.ok(&["show", &later]);
    assert!(!shown.contains("retry at"), "{shown}");
}

#[test]
fn logs_follow_starts_over_on_a_log_truncated_or_replaced() {
    use std::io::{BufRead, BufReader, Write};
    let bench = Bench::new();
    let id = bench.add("followed", &[]);
    let carrier = bench.claim(&id, None);
    let logs = bench.path().join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let log = logs.join(format!("{id}.log"));
    std::fs::write(&log, "first line\n").unwrap();
    let mut follow = bench
        .command()
        .arg("--db")
        .arg(&bench.db)
        .args(["logs", &id, "--follow"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (sender, lines) = std::sync::mpsc::channel();
    let stdout = follow.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let _ = sender.send(line.unwrap_or_default());
        }
    });
    let next = || {
        lines
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the follower printed nothing more")
    };
    assert_eq!(next(), "first line");
    // Cut short, then written again: shorter than what was read.
    std::fs::write(&log, "").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));
    let mut file = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
    writeln!(file, "after").unwrap();
    drop(file);
    assert_eq!(next(), "after");
    // Replaced by another file, as a rotation does.
    let fresh = logs.join("fresh");
    std::fs::write(&fresh, "rotated in\n").unwrap();
    std::fs::rename(&fresh, &log).unwrap();
    assert_eq!(next(), "rotated in");
    let mut complete = bench.command();
    complete
        .envs(carrier.iter().cloned())
        .args(["complete", "--summary", "done"]);
    assert!(complete.output().unwrap().status.success());
    let output = follow.wait_with_output().unwrap();
    assert!(output.status.success());
    let said = text(&output.stderr);
    assert!(
        said.contains("truncated") && said.contains("replaced"),
        "{said}"
    );
}

#[test]
fn text_on_the_board_cannot_drive_the_terminal_of_whoever_reads_it() {
    let bench = Bench::new();
    let hostile = "\u{1b}]0;owned\u{7}\u{1b}[2Jtitle\u{9b}31m";
    let id = bench.add(hostile, &["--body", &format!("body {hostile}\nline two")]);
    bench.ok(&["comment", &id, &format!("note {hostile}")]);
    bench.ok(&["hold", &id, "--reason", hostile]);
    let logs = bench.path().join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    std::fs::write(
        logs.join(format!("{id}.log")),
        format!("agent said {hostile}\n"),
    )
    .unwrap();
    for args in [
        vec!["ls"],
        vec!["show", &id],
        vec!["events", &id],
        vec!["watch", "--once"],
        vec!["logs", &id],
    ] {
        let output = bench.run(&args);
        assert!(
            output.status.success(),
            "{args:?}: {}",
            text(&output.stderr)
        );
        let said = text(&output.stdout);
        assert!(
            !said.chars().any(|c| c.is_control() && c != '\n'),
            "{args:?} sends a control character: {said:?}"
        );
        assert!(
            said.contains("\\u{1b}") || said.contains("\\u001b"),
            "{args:?} shows the escape: {said}"
        );
    }
}

#[test]
fn ls_and_show_say_whom_a_card_is_for_and_what_it_waits_for() {
    let bench = Bench::new();
    let parent = bench.add("design it", &["--assignee", "architect"]);
    let child = bench.add("build it", &["--assignee", "coder", "--parent", &parent]);
    let loose = bench.add("tidy up", &["--every", "7d"]);
    let row = |listed: &str, id: &str| {
        listed
            .lines()
            .find(|line| line.starts_with(id))
            .map(str::to_owned)
    };

    let listed = bench.ok(&["ls"]);
    assert!(
        listed.lines().next().unwrap().contains("ASSIGNEE"),
        "{listed}"
    );
    let built = row(&listed, &child).unwrap();
    assert!(built.contains("coder"), "{built}");
    assert!(built.contains(&format!("waits for {parent}")), "{built}");
    let tidy = row(&listed, &loose).unwrap();
    assert!(tidy.contains("every 7d"), "{tidy}");
    let only = bench.ok(&["ls", "--assignee", "coder"]);
    assert!(
        row(&only, &child).is_some() && row(&only, &parent).is_none(),
        "{only}"
    );
    let unassigned = bench.ok(&["ls", "--assignee", "-"]);
    assert!(row(&unassigned, &loose).is_some(), "{unassigned}");
    assert!(row(&unassigned, &child).is_none(), "{unassigned}");
    let children = bench.ok(&["ls", "--parent", &parent[2..8]]);
    assert!(
        row(&children, &child).is_some()
            && row(&children, &parent).is_none()
            && row(&children, &loose).is_none(),
        "{children}"
    );
    bench.refused(&["ls", "--parent", "t_nosuchcard"], "t_nosuchcard");

    let shown = bench.ok(&["show", &child]);
    assert!(shown.contains("assignee: coder"), "{shown}");
    assert!(
        shown.contains(&format!("parents: {parent} (ready)")),
        "{shown}"
    );
    let shown: Value = serde_json::from_str(&bench.ok(&["show", &child, "--json"])).unwrap();
    assert_eq!(shown["parents"][0], parent.as_str());

    // A blocked card says why on a line of its own.
    let carrier = bench.claim(&parent, None);
    let output = bench
        .command()
        .envs(carrier.iter().map(|(k, v)| (k, v)))
        .args(["block", "--reason", "needs the API key"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output.stderr));
    let shown = bench.ok(&["show", &parent]);
    assert!(shown.contains("\nblocked: needs the API key\n"), "{shown}");
    // A card that is not running shows the run it ran last.
    let listed = bench.ok(&["ls"]);
    let run_at = listed.lines().next().unwrap().find("RUN").unwrap();
    let run_of = |id: &str| {
        row(&listed, id).unwrap()[run_at..]
            .split_whitespace()
            .next()
            .unwrap()
            .to_owned()
    };
    assert_eq!(run_of(&parent), "1", "{listed}");
    assert_eq!(run_of(&loose), "-", "{listed}");
    // A cancelled card says it was, and why.
    bench.ok(&["cancel", &child, "--reason", "not needed"]);
    let shown = bench.ok(&["show", &child]);
    assert!(shown.contains("\ncancelled: not needed\n"), "{shown}");
}

#[test]
fn a_unique_start_of_a_card_id_names_it_and_an_ambiguous_one_is_refused() {
    let bench = Bench::new();
    let ids: Vec<String> = (0..40)
        .map(|n| bench.add(&format!("card {n}"), &[]))
        .collect();
    let id = &ids[0];
    // With and without its `t_`.
    for short in [&id[..8], &id[2..8]] {
        let shown: Value = serde_json::from_str(&bench.ok(&["show", short, "--json"])).unwrap();
        assert_eq!(shown["task"]["id"], id.as_str(), "{short}");
    }
    bench.ok(&["hold", &id[2..9], "--reason", "later"]);
    assert_eq!(bench.show(id)["task"]["held_reason"], "later");
    // Matching nothing: not on the board.
    bench.refused(&["show", "t_zzzzzz"], "is not on this board");
    bench.refused(&["show", "t_"], "is not on this board");
    // Forty cards, sixteen hex digits: some first digit starts two ids, and
    // is refused, naming them; nothing changes.
    let first = |id: &String| id[2..3].to_owned();
    let shared = ids
        .iter()
        .map(first)
        .find(|digit| ids.iter().filter(|id| first(id) == *digit).count() > 1)
        .unwrap();
    let output = bench.run(&["cancel", &shared, "--reason", "oops"]);
    assert_eq!(output.status.code(), Some(1));
    let said = text(&output.stderr);
    assert!(
        said.contains(&format!("{shared} starts")) && said.contains("give more of it"),
        "{said}"
    );
    for id in ids.iter().filter(|id| first(id) == shared) {
        assert!(said.contains(id.as_str()), "{id}: {said}");
        assert_ne!(bench.show(id)["task"]["status"], "archived");
    }
}

#[test]
fn link_and_unlink_make_a_card_wait_and_stop_waiting() {
    let bench = Bench::new();
    let design = bench.add("design it", &[]);
    let build = bench.add("build it", &[]);
    let said = bench.ok(&["link", &design[2..8], &build]);
    assert_eq!(said.trim(), format!("{build} now waits for {design}"));
    assert_eq!(bench.show(&build)["task"]["status"], "todo");
    let said = bench.ok(&["link", &design, &build]);
    assert_eq!(said.trim(), format!("{build} already waits for {design}"));

    let shown = bench.ok(&["show", &design]);
    assert!(
        shown.contains(&format!("children: {build} (todo)")),
        "{shown}"
    );
    let shown = bench.ok(&["show", &build]);
    assert!(
        shown.contains(&format!("parents: {design} (ready)")),
        "{shown}"
    );
    assert_eq!(bench.show(&design)["children"][0], build.as_str());

    bench.refused(&["link", &build, &design], "would make a cycle");
    bench.refused(&["link", &build, &build], "cannot wait for itself");
    bench.refused(&["link", &design, "t_nosuchcard"], "t_nosuchcard");

    let said = bench.ok(&["unlink", &design, &build]);
    assert_eq!(
        said.trim(),
        format!("{build} no longer waits for {design} (it is ready)")
    );
    bench.refused(&["unlink", &design, &build], "does not wait for");
    assert_eq!(bench.show(&build)["task"]["status"], "ready");
}

/// The seed system's lanes from the terminal: a card in triage is never
/// claimed until promoted; a scheduled card waits for its time or an
/// unblock; `promote` refuses an open parent unless forced and a dry run
/// changes nothing; a card up for review is claimed and worked again.
#[test]
fn triage_schedule_promote_and_review_from_the_terminal() {
    let bench = Bench::new();
    let dispatch = until_idle(
        &bench,
        "kanban complete --summary \"done by $HERMES_KANBAN_TASK\"",
    );
    let status = |id: &str| {
        bench.show(id)["task"]["status"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let shaped = bench.add("shape me first", &["--triage"]);
    let parked = bench.add("after the freeze", &[]);
    let said = bench.ok(&[
        "schedule",
        &parked,
        "after",
        "the",
        "freeze",
        "--not-before",
        "+1h",
    ]);
    assert!(
        said.contains("scheduled: back in line in 1h") || said.contains("waits until"),
        "{said}"
    );
    assert_eq!(
        bench.event(&parked, "scheduled")["payload"]["reason"],
        "after the freeze"
    );
    let listed = bench.ok(&["ls", "--status", "triage"]);
    assert!(
        listed.contains(&shaped) && !listed.contains(&parked),
        "{listed}"
    );
    let listed = bench.ok(&["ls", "--status", "scheduled"]);
    assert!(
        listed.contains(&parked) && listed.contains("waits until"),
        "{listed}"
    );
    dispatch();
    assert_eq!(status(&shaped), "triage", "never claimed");
    assert_eq!(status(&parked), "scheduled", "not due yet");
    // A dry run says so and changes nothing; then promoted, it is worked.
    let dry: serde_json::Value =
        serde_json::from_str(&bench.ok(&["promote", &shaped, "--dry-run", "--json"])).unwrap();
    assert_eq!(
        dry,
        serde_json::json!({"id": shaped, "promoted": false, "dry_run": true})
    );
    assert_eq!(status(&shaped), "triage");
    assert!(
        bench
            .ok(&["promote", &shaped, "spec", "reviewed"])
            .contains("promoted: ready")
    );
    assert_eq!(
        bench.event(&shaped, "promoted_manual")["payload"]["reason"],
        "spec reviewed"
    );
    bench.ok(&["unblock", &parked]);
    dispatch();
    assert_eq!(
        (status(&shaped), status(&parked)),
        ("done".into(), "done".into())
    );
    // Promote by hand refuses a card whose parent is open, unless forced.
    let parent = bench.add("parent", &["--blocked"]);
    let child = bench.add("child", &["--parent", &parent]);
    bench.refused(&["promote", &child], "--force");
    bench.refused(&["promote", &child, "--dry-run"], "--force");
    assert_eq!(status(&child), "todo");
    let forced = bench.ok(&["promote", &child, "--force"]);
    assert!(
        forced.contains(&format!("still waits for {parent}")),
        "{forced}"
    );
    assert_eq!(
        bench.event(&child, "promoted_manual")["payload"]["forced"],
        true
    );
    // As in the seed system, a claim sends it back while the parent is
    // open; unlinked, it runs.
    dispatch();
    assert_eq!(status(&child), "todo");
    bench.event(&child, "claim_rejected");
    bench.ok(&["unlink", &parent, &child]);
    // Review: a done card goes up for review and is worked again.
    dispatch();
    assert_eq!(status(&child), "done");
    assert!(
        bench
            .ok(&["review", &child, "check", "it"])
            .contains("up for review")
    );
    assert_eq!(status(&child), "review");
    dispatch();
    let card = bench.show(&child);
    assert_eq!(card["task"]["status"], "done");
    assert_eq!(runs(&card).len(), 2, "{card}");
    assert_eq!(bench.event(&child, "review")["payload"]["was"], "done");
    // Refused moves name the status and the move, and change nothing.
    bench.refused(&["triage", &child], "is done; cannot triage it");
    bench.refused(&["schedule", &child], "is done; cannot schedule it");
    bench.refused(&["promote", &child], "is done; cannot promote it");
    bench.refused(
        &["schedule", &parent, "--not-before", "someday"],
        "--not-before",
    );
    assert_eq!(status(&child), "done");
    // Hold parks in scheduled; release puts it back in line.
    let held = bench.add("held", &[]);
    assert!(bench.ok(&["hold", &held]).contains("held (scheduled)"));
    assert_eq!(status(&held), "scheduled");
    assert!(bench.ok(&["release", &held]).contains("released: ready"));
}

/// An agent's typed block, from the terminal: `ls` says the kind and
/// filters by it; blocked again for the same kind after an unblock, the
/// card goes to triage; a kind nobody knows is refused with the kinds.
#[test]
fn an_agents_typed_block_is_shown_filtered_and_breaks_its_loop() {
    let bench = Bench::new();
    let dispatch = until_idle(
        &bench,
        "kanban block --reason \"which region?\" --kind needs_input",
    );
    let id = bench.add("ask a person", &[]);
    let other = bench.add("fine", &["--blocked"]);
    dispatch();
    let card = bench.show(&id);
    assert_eq!(card["task"]["status"], "blocked");
    assert_eq!(card["task"]["block_kind"], "needs_input");
    let listed = bench.ok(&["ls"]);
    assert!(
        listed
            .lines()
            .any(|line| line.contains(&id) && line.contains("blocked (needs_input)")),
        "{listed}"
    );
    let only = bench.ok(&["ls", "--block-kind", "needs_input"]);
    assert!(only.contains(&id) && !only.contains(&other), "{only}");
    assert!(
        !bench
            .ok(&["ls", "--block-kind", "capability"])
            .contains(&id)
    );
    let bad = bench.run(&["ls", "--block-kind", "someday"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        text(&bad.stderr).contains("needs_input"),
        "{}",
        text(&bad.stderr)
    );
    // Unblocked, it blocks again for the same reason: triage.
    bench.ok(&["unblock", &id]);
    dispatch();
    assert_eq!(bench.show(&id)["task"]["status"], "triage");
    let loop_event = bench.event(&id, "block_loop_detected");
    assert_eq!(loop_event["payload"]["recurrences"], 2);
    assert!(bench.ok(&["show", &id]).contains("triage (needs_input)"));
}

#[test]
fn an_agent_fans_out_from_the_terminal_and_its_cards_run_after_it() {
    let bench = Bench::new();
    let lead = bench.add("plan the release", &[]);
    let other = bench.add("a person's card", &["--triage"]);
    // The lead's agent makes three cards (the third gathers the other two),
    // is refused what is not its own, and hands them over; every other
    // card's agent just completes it.
    let dispatch = until_idle(
        &bench,
        &format!(
            r#"if [ "$KANBAN_TASK" != "{lead}" ]; then exec kanban complete --summary "did $KANBAN_TASK"; fi
a=$(kanban create "part a" --body "the first half") || exit 1
b=$(kanban create "part b") || exit 1
s=$(kanban create "gather" --parent "$a") || exit 1
kanban link "$b" "$s" || exit 1
kanban list --json > "{dir}/listed.json" || exit 1
kanban link "$a" "{other}" 2> "{dir}/refused-link.txt" && exit 3
kanban unblock "{other}" 2> "{dir}/refused-unblock.txt" && exit 3
kanban complete --summary early --created-cards "$a,{other}" 2> "{dir}/refused-complete.txt" && exit 3
kanban complete --summary "split in three" --metadata '{{"parts": 2}}' --created-cards "$a,$b" --created-cards "$s"
"#,
            dir = bench.path().display()
        ),
    );
    dispatch();
    let card = bench.show(&lead);
    assert_eq!(card["task"]["status"], "done", "{card}");
    assert_eq!(card["runs"][0]["metadata"], serde_json::json!({"parts": 2}));
    let children: Vec<String> = card["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|id| id.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(children.len(), 3, "{card}");
    let verified = &bench.event(&lead, "completed")["payload"]["verified_cards"];
    assert_eq!(verified.as_array().unwrap().len(), 3, "{verified}");
    let fanned: Vec<&Value> = card["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|event| event["kind"] == "fanned_out")
        .collect();
    let actions: Vec<&str> = fanned
        .iter()
        .map(|event| event["payload"]["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, ["created", "created", "created", "linked"]);
    assert!(
        fanned
            .iter()
            .all(|event| event["run_id"] == card["runs"][0]["id"])
    );
    // Each made card ran after the lead; the gatherer after both parts.
    for child in &children {
        let made = bench.show(child);
        assert_eq!(made["task"]["status"], "done", "{made}");
        assert_eq!(made["task"]["created_by"], lead.as_str());
    }
    let gather = children
        .iter()
        .find(|id| bench.show(id)["task"]["title"] == "gather")
        .unwrap();
    assert_eq!(bench.show(gather)["parents"].as_array().unwrap().len(), 3);
    // What was refused says why, and left the person's card alone.
    for (file, words) in [
        ("refused-link.txt", "does not wait for"),
        ("refused-unblock.txt", "does not wait for"),
        ("refused-complete.txt", "did not make"),
    ] {
        let said = std::fs::read_to_string(bench.path().join(file)).unwrap();
        assert!(
            said.contains(words) && said.contains(&other),
            "{file}: {said}"
        );
    }
    let person = bench.show(&other);
    assert_eq!(person["task"]["status"], "triage");
    assert_eq!(person["parents"], serde_json::json!([]));
    let listed: Value =
        serde_json::from_str(&std::fs::read_to_string(bench.path().join("listed.json")).unwrap())
            .unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 5, "{listed}");
    let shown = bench.ok(&["show", &lead]);
    assert!(shown.contains("metadata: {\"parts\":2}"), "{shown}");
    let part = bench.ok(&["show", &children[0]]);
    assert!(part.contains(&format!("created by: {lead}")), "{part}");
}

#[test]
fn a_swarm_runs_its_workers_then_its_verifier_then_its_synthesizer() {
    let bench = Bench::new();
    let swarm = [
        "swarm",
        "ship the notes",
        "--worker",
        "writer:draft the notes",
        "--worker",
        "counter:count the changes",
        "--verifier",
        "checker",
        "--synthesizer",
        "editor",
        "--idempotency-key",
        "notes",
    ];
    let said = bench.ok(&swarm);
    assert!(said.starts_with("root: t_"), "{said}");
    let mut json = swarm.to_vec();
    json.push("--json");
    let cards: Value = serde_json::from_str(&bench.ok(&json)).unwrap();
    assert_eq!(cards["made"], false, "the key found the first swarm");
    assert!(
        said.contains(cards["verifier_id"].as_str().unwrap()),
        "{said}"
    );
    let ids = |key: &str| -> Vec<String> {
        let value = &cards[key];
        let all = value
            .as_array()
            .cloned()
            .unwrap_or_else(|| vec![value.clone()]);
        all.iter()
            .map(|id| id.as_str().unwrap().to_owned())
            .collect()
    };
    let (workers, verifier, synthesizer) =
        (ids("worker_ids"), ids("verifier_id"), ids("synthesizer_id"));
    assert_eq!(workers.len(), 2);
    assert_eq!(
        bench.ok(&["ls"]).lines().count(),
        1 + 5,
        "a header and five cards"
    );
    until_idle(
        &bench,
        r#"exec kanban complete --summary "did $KANBAN_TASK""#,
    )();
    let run_of = |id: &String| {
        let card = bench.show(id);
        assert_eq!(card["task"]["status"], "done", "{card}");
        card["runs"][0]["id"].as_i64().unwrap()
    };
    let verified = run_of(&verifier[0]);
    assert!(workers.iter().all(|id| run_of(id) < verified));
    assert!(verified < run_of(&synthesizer[0]));
    // Refused before anything is written: a worker with skills, no worker.
    let bad = bench.run(&[
        "swarm",
        "g",
        "--worker",
        "a:b:review",
        "--verifier",
        "v",
        "--synthesizer",
        "s",
    ]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        text(&bad.stderr).contains("skills"),
        "{}",
        text(&bad.stderr)
    );
    bench.refused(
        &[
            "swarm",
            " ",
            "--worker",
            "a:b",
            "--verifier",
            "v",
            "--synthesizer",
            "s",
        ],
        "non-blank goal",
    );
    assert_eq!(bench.ok(&["ls"]).lines().count(), 1 + 5);
}

#[test]
fn a_done_card_s_handoff_is_backfilled_by_edit() {
    let bench = Bench::new();
    let id = bench.add("write the notes", &[]);
    bench.refused(
        &["edit", &id, "--result", "shipped"],
        "change a done card's handoff",
    );
    until_idle(&bench, "exec kanban complete --summary draft")();
    let said = bench.ok(&[
        "edit",
        &id,
        "--result",
        "shipped in 0.3",
        "--summary",
        "notes for 0.3",
        "--metadata",
        r#"{"tests_run": 12}"#,
    ]);
    assert_eq!(
        said.trim(),
        format!("{id} edited: result, summary, metadata")
    );
    let card = bench.show(&id);
    assert_eq!(card["task"]["result"], "shipped in 0.3");
    assert_eq!(card["runs"][0]["summary"], "notes for 0.3");
    assert_eq!(
        card["runs"][0]["metadata"],
        serde_json::json!({"tests_run": 12})
    );
    let shown = bench.ok(&["show", &id]);
    assert!(shown.contains(r#"metadata: {"tests_run":12}"#), "{shown}");
    // `runs` lists them with their metadata, and filters them.
    let listed = bench.ok(&["runs", &id]);
    assert!(listed.contains("notes for 0.3"), "{listed}");
    assert!(listed.contains(r#"metadata: {"tests_run":12}"#), "{listed}");
    let runs: Value =
        serde_json::from_str(&bench.ok(&["runs", &id, "--outcome", "completed", "--json"]))
            .unwrap();
    assert_eq!(runs.as_array().unwrap().len(), 1, "{runs}");
    assert_eq!(runs[0]["metadata"]["tests_run"], 12);
    let none: Value =
        serde_json::from_str(&bench.ok(&["runs", &id, "--status", "blocked", "--json"])).unwrap();
    assert_eq!(none, serde_json::json!([]));
    let bad = bench.run(&["edit", &id, "--metadata", "[1]"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        text(&bad.stderr).contains("not a JSON object"),
        "{}",
        text(&bad.stderr)
    );
}

/// A dispatcher run until nothing is left to claim, whose agent runs the
/// shell line `line`; it must end well.
fn until_idle<'b>(bench: &'b Bench, line: &str) -> impl Fn() + 'b {
    let agent = bench.path().join("agent.sh");
    kanban_testkit::write_executable(&agent, &format!("#!/bin/sh\n{line}\n"));
    move || {
        let out = bench
            .command()
            .arg("--db")
            .arg(&bench.db)
            .args(["dispatch", "--until-idle", "--interval", "1", "--agent"])
            .arg(&agent)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
}

/// Where `bench`'s attached files are kept (beside a board file; in a
/// PostgreSQL board's folder under the kanban home).
fn attachments_folder(bench: &Bench) -> std::path::PathBuf {
    match &bench.home {
        Some(home) => home.join("kanban/boards/default/attachments"),
        None => bench.path().join("attachments"),
    }
}

/// Attachments and tenants, the same on either engine.
fn files_and_tenants_on(bench: &Bench) {
    let card = bench.add("with files", &["--tenant", "acme", "--created-by", "alice"]);
    let other = bench.add("no tenant", &[]);
    let shown = bench.show(&card);
    assert_eq!(shown["task"]["tenant"], "acme");
    assert_eq!(shown["task"]["created_by"], "alice");
    let listed: Value =
        serde_json::from_str(&bench.ok(&["ls", "--tenant", "acme", "--json"])).unwrap();
    let ids: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [card.as_str()]);
    let table = bench.ok(&["ls"]);
    assert!(
        table.contains("TENANT") && table.contains("acme"),
        "{table}"
    );
    assert!(bench.ok(&["show", &card]).contains("tenant: acme"));
    let blank = bench.run(&["add", "x", "--tenant", " "]);
    assert_eq!(blank.status.code(), Some(2), "a usage error");
    assert!(text(&blank.stderr).contains("is blank"));

    let notes = bench.path().join("notes.txt");
    std::fs::write(&notes, "hello\n").unwrap();
    let first: Value =
        serde_json::from_str(&bench.ok(&["attach", &card, notes.to_str().unwrap(), "--json"]))
            .unwrap();
    let second: Value = serde_json::from_str(&bench.ok(&[
        "attach",
        &card,
        notes.to_str().unwrap(),
        "--json",
        "--author",
        "bob",
    ]))
    .unwrap();
    // A second file of one name is kept beside the first, as the seed system names it.
    assert_eq!(first["filename"], "notes.txt");
    assert_eq!(second["filename"], "notes (1).txt");
    let folder = attachments_folder(bench).join(&card);
    assert_eq!(
        std::fs::read_to_string(folder.join("notes (1).txt")).unwrap(),
        "hello\n"
    );
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode =
            |path: &std::path::Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&folder), 0o700);
        assert_eq!(mode(&folder.join("notes.txt")), 0o600);
    }
    let listed: Value = serde_json::from_str(&bench.ok(&["attachments", &card, "--json"])).unwrap();
    let listed = listed.as_array().unwrap();
    assert_eq!(listed.len(), 2);
    for key in [
        "id",
        "task_id",
        "filename",
        "stored_path",
        "content_type",
        "size",
        "uploaded_by",
        "created_at",
    ] {
        assert!(listed[0].get(key).is_some(), "{key}: {}", listed[0]);
    }
    assert_eq!(listed[0]["content_type"], "text/plain");
    assert_eq!(listed[0]["size"], 6);
    assert_eq!(listed[1]["uploaded_by"], "bob");
    assert_eq!(
        bench.show(&card)["attachments"].as_array().unwrap().len(),
        2
    );
    assert!(bench.event(&card, "attached")["payload"]["filename"] == "notes.txt");

    // Refused, and nothing written: a folder, a file past 25 MiB, a name
    // that leaves nothing, a card that is not there, a bad content type.
    let big = bench.path().join("big.bin");
    let file = std::fs::File::create(&big).unwrap();
    file.set_len(25 * 1024 * 1024 + 1).unwrap();
    let dir = bench.path().to_str().unwrap().to_owned();
    for (args, says) in [
        (vec!["attach", &card, &dir], "is not a file"),
        (
            vec!["attach", &card, big.to_str().unwrap()],
            "at most 25 MiB",
        ),
        (
            vec!["attach", &card, notes.to_str().unwrap(), "--name", "../.."],
            "leaves no file name",
        ),
        (
            vec!["attach", "t_00000000", notes.to_str().unwrap()],
            "t_00000000",
        ),
        (
            vec![
                "attach",
                &card,
                notes.to_str().unwrap(),
                "--content-type",
                "text",
            ],
            "is not a content type",
        ),
    ] {
        bench.refused(&args, says);
    }
    assert_eq!(
        std::fs::read_dir(&folder).unwrap().count(),
        2,
        "nothing more was written"
    );
    assert!(!attachments_folder(bench).join("t_00000000").exists());

    // Removed: its record and its file.
    let id = first["id"].as_i64().unwrap().to_string();
    assert!(bench.ok(&["attach-rm", &id]).contains("removed"));
    assert!(!folder.join("notes.txt").exists());
    bench.refused(&["attach-rm", &id], "no attachment");
    bench.refused(&["attachments", "t_00000000"], "t_00000000");
    assert!(
        bench
            .ok(&["attachments", &other])
            .contains("has no attachments")
    );
}

#[test]
fn files_attach_to_cards_and_cards_belong_to_tenants() {
    files_and_tenants_on(&Bench::new());
}

#[test]
fn files_attach_to_cards_and_cards_belong_to_tenants_on_postgresql() {
    files_and_tenants_on(&Bench::postgres());
}

/// `stats`, `assignees`, `reassign`, `ls --mine` and `ls --sort`, the same
/// on either engine.
fn counts_and_reassignment_on(bench: &Bench) {
    let a = bench.add("alpha", &["--assignee", "coder", "--priority", "1"]);
    let b = bench.add("bravo", &["--assignee", "coder", "--priority", "5"]);
    let c = bench.add("charlie", &["--assignee", "reviewer", "--triage"]);
    let d = bench.add("delta", &[]);
    bench.ok(&["archive", &d]);
    let stats: Value = serde_json::from_str(&bench.ok(&["stats", "--json"])).unwrap();
    assert_eq!(
        stats["by_status"],
        serde_json::json!({"ready": 2, "triage": 1}),
        "archived cards are not counted"
    );
    assert_eq!(
        stats["by_assignee"],
        serde_json::json!({"coder": {"ready": 2}, "reviewer": {"triage": 1}})
    );
    assert!(stats["oldest_ready_age_seconds"].as_i64().unwrap() >= 0);
    assert!(stats["now"].as_i64().unwrap() > 0);
    let human = bench.ok(&["stats"]);
    assert!(
        human.contains("ready      2")
            && human.contains("coder")
            && human.contains("Oldest ready card age"),
        "{human}"
    );
    let names: Value = serde_json::from_str(&bench.ok(&["assignees", "--json"])).unwrap();
    assert_eq!(
        names,
        serde_json::json!([
            {"name": "coder", "on_disk": false, "counts": {"ready": 2}},
            {"name": "reviewer", "on_disk": false, "counts": {"triage": 1}}
        ])
    );
    // Sorted as asked; --mine is $HERMES_PROFILE's.
    let ids = |args: &[&str]| -> Vec<String> {
        let listed: Value = serde_json::from_str(&bench.ok(args)).unwrap();
        listed
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["id"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(
        ids(&["ls", "--json", "--sort", "priority"]),
        [b.clone(), a.clone(), c.clone()]
    );
    assert_eq!(
        ids(&["ls", "--json", "--sort", "created-desc"]),
        [c.clone(), b.clone(), a.clone()]
    );
    assert_eq!(
        ids(&["ls", "--json", "--sort", "title"]),
        [a.clone(), b.clone(), c.clone()]
    );
    let mine = bench
        .command()
        .arg("--db")
        .arg(&bench.db)
        .args(["ls", "--mine", "--json"])
        .env("HERMES_PROFILE", "reviewer")
        .output()
        .unwrap();
    assert!(mine.status.success(), "{}", text(&mine.stderr));
    let listed: Value = serde_json::from_slice(&mine.stdout).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 1);
    assert_eq!(listed[0]["id"], c.as_str());
    let unset = bench
        .command()
        .arg("--db")
        .arg(&bench.db)
        .args(["ls", "--mine"])
        .env_remove("HERMES_PROFILE")
        .output()
        .unwrap();
    assert_eq!(unset.status.code(), Some(1));
    assert!(
        text(&unset.stderr).contains("HERMES_PROFILE"),
        "{}",
        text(&unset.stderr)
    );
    // Reassign: a running card only with --reclaim; `none` unassigns.
    bench.ok(&["reassign", &a, "reviewer"]);
    assert_eq!(bench.show(&a)["task"]["assignee"], "reviewer");
    bench.ok(&["reassign", &a, "none"]);
    assert!(bench.show(&a)["task"]["assignee"].is_null());
    bench.claim(&b, None);
    bench.refused(&["reassign", &b, "reviewer"], "give --reclaim");
    assert_eq!(
        bench.show(&b)["task"]["assignee"],
        "coder",
        "nothing changed"
    );
    bench.ok(&["reassign", &b, "reviewer", "--reclaim", "--reason", "stuck"]);
    let card = bench.show(&b);
    assert_eq!(
        (
            card["task"]["status"].as_str(),
            card["task"]["assignee"].as_str()
        ),
        (Some("ready"), Some("reviewer"))
    );
    assert_eq!(runs(&card)[0]["outcome"], "reclaimed");
}

#[test]
fn stats_assignees_and_reassign_count_and_move_cards() {
    counts_and_reassignment_on(&Bench::new());
}

#[test]
fn stats_assignees_and_reassign_count_and_move_cards_on_postgresql() {
    counts_and_reassignment_on(&Bench::postgres());
}

#[test]
fn diagnostics_name_what_needs_a_person_and_context_shows_what_an_agent_is_handed() {
    let bench = Bench::new();
    assert!(
        bench
            .ok(&["diagnostics"])
            .contains("nothing on the board needs a person")
    );
    let failing = bench.add(
        "keeps failing",
        &["--assignee", "coder", "--body", "the spec"],
    );
    let orphan = bench.add("for nobody", &["--assignee", "ghost"]);
    {
        let conn = rusqlite::Connection::open(&bench.db).unwrap();
        conn.execute(
            "UPDATE tasks SET consecutive_failures = 4, last_failure_error = 'boom' WHERE id = ?1",
            [&failing],
        )
        .unwrap();
    }
    std::fs::write(
        bench.path().join("kanban.toml"),
        "[agents.coder]\ncommand = \"true\"\n",
    )
    .unwrap();
    let found: Value = serde_json::from_str(&bench.ok(&["diagnostics", "--json"])).unwrap();
    let kinds = |found: &Value| -> Vec<(String, String, String)> {
        let mut kinds = Vec::new();
        for card in found.as_array().unwrap() {
            for diagnostic in card["diagnostics"].as_array().unwrap() {
                kinds.push((
                    card["task_id"].as_str().unwrap().to_owned(),
                    diagnostic["kind"].as_str().unwrap().to_owned(),
                    diagnostic["severity"].as_str().unwrap().to_owned(),
                ));
            }
        }
        kinds
    };
    assert_eq!(
        kinds(&found),
        [
            (
                failing.clone(),
                "repeated_failures".into(),
                "critical".into()
            ),
            (orphan.clone(), "no_agent_serves".into(), "error".into())
        ]
    );
    let first = &found[0]["diagnostics"][0];
    for key in [
        "kind",
        "severity",
        "title",
        "detail",
        "actions",
        "first_seen_at",
        "last_seen_at",
        "count",
        "run_id",
        "data",
    ] {
        assert!(first.get(key).is_some(), "{key}: {first}");
    }
    for key in ["task_id", "title", "status", "assignee", "diagnostics"] {
        assert!(found[0].get(key).is_some(), "{key}");
    }
    let worst: Value =
        serde_json::from_str(&bench.ok(&["diagnostics", "--json", "--severity", "critical"]))
            .unwrap();
    assert_eq!(kinds(&worst).len(), 1);
    let one: Value =
        serde_json::from_str(&bench.ok(&["diagnostics", "--json", "--task", &orphan])).unwrap();
    assert_eq!(
        kinds(&one),
        [(orphan.clone(), "no_agent_serves".into(), "error".into())]
    );
    let human = bench.ok(&["diagnostics"]);
    assert!(
        human.contains("2 active diagnostic(s) across 2 card(s)")
            && human.contains(&format!("kanban logs {failing}")),
        "{human}"
    );
    let bad = bench.run(&["diagnostics", "--severity", "fatal"]);
    assert_eq!(bad.status.code(), Some(2));
    // What an agent is handed, nothing claimed.
    bench.ok(&["comment", &failing, "use the new API"]);
    let told = bench.ok(&["context", &failing]);
    assert!(
        told.starts_with(&format!(
            "work kanban task {failing}: keeps failing\n\nthe spec"
        )),
        "{told}"
    );
    assert!(told.contains("use the new API"), "{told}");
    let request: Value = serde_json::from_str(&bench.ok(&["context", &failing, "--json"])).unwrap();
    assert_eq!(request["kind"], "initial");
    assert_eq!(request["turn"], 1);
    assert_eq!(request["task"]["id"], failing.as_str());
    assert_eq!(request["task"]["comments"][0]["body"], "use the new API");
    assert_eq!(
        bench.show(&failing)["task"]["status"],
        "ready",
        "nothing claimed"
    );
}

#[test]
fn tail_follows_a_cards_events_and_gc_cleans_up_what_is_old() {
    let bench = Bench::new();
    let card = bench.add("followed", &[]);
    let mut follower = bench
        .command()
        .arg("--db")
        .arg(&bench.db)
        .args(["tail", &card, "--interval", "0.1", "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    bench.ok(&["comment", &card, "first note"]);
    bench.ok(&["hold", &card, "--reason", "wait"]);
    crate::wait_for("tail prints the new events", || {
        bench.show(&card)["events"].as_array().unwrap().len() >= 3
    });
    std::thread::sleep(std::time::Duration::from_millis(500));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(follower.id()).unwrap()),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = follower.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "tail stops at Ctrl-C"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(status.success());
    let mut out = String::new();
    std::io::Read::read_to_string(follower.stdout.as_mut().unwrap(), &mut out).unwrap();
    let kinds: Vec<String> = out
        .lines()
        .map(|line| {
            serde_json::from_str::<Value>(line).unwrap()["kind"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(kinds, ["created", "commented", "held"], "{out}");

    // gc: old events of settled cards, and old logs; nothing else.
    let done = bench.add("finished long ago", &[]);
    let carrier = bench.claim(&done, None);
    let mut complete = bench.command();
    complete
        .envs(carrier.iter().cloned())
        .args(["complete", "--summary", "done"]);
    assert!(complete.output().unwrap().status.success());
    {
        let conn = rusqlite::Connection::open(&bench.db).unwrap();
        conn.execute(
            "UPDATE task_events SET created_at = created_at - 40 * 86400",
            [],
        )
        .unwrap();
    }
    let logs = bench.path().join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let old_log = logs.join("t_00000001.log");
    let new_log = logs.join("t_00000002.log");
    for log in [&old_log, &new_log] {
        std::fs::write(log, "x").unwrap();
    }
    let month_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(31 * 86_400);
    std::fs::File::options()
        .write(true)
        .open(&old_log)
        .unwrap()
        .set_modified(month_ago)
        .unwrap();
    let said = bench.ok(&["gc"]);
    assert!(
        said.contains("removed 3 event(s)") && said.contains("and 1 worker log(s)"),
        "{said}"
    );
    assert!(bench.show(&done)["events"].as_array().unwrap().is_empty());
    assert_eq!(
        bench.show(&card)["events"].as_array().unwrap().len(),
        3,
        "an open card keeps its history"
    );
    assert!(!old_log.exists() && new_log.exists());
}

#[test]
fn several_cards_move_at_once_and_an_unknown_one_moves_none() {
    let bench = Bench::new();
    let cards: Vec<String> = (0..3)
        .map(|n| bench.add(&format!("card {n}"), &[]))
        .collect();
    let [a, b, c] = [&cards[0], &cards[1], &cards[2]];
    let status = |id: &str| {
        bench.show(id)["task"]["status"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    // One unknown id: nothing changes.
    bench.refused(
        &["schedule", a, "later", "--ids", b, "t_00000000"],
        "t_00000000",
    );
    assert_eq!([status(a), status(b)], ["ready", "ready"]);
    bench.ok(&["schedule", a, "after", "lunch", "--ids", b, c]);
    assert_eq!(
        [status(a), status(b), status(c)],
        ["scheduled", "scheduled", "scheduled"]
    );
    bench.ok(&["unblock", a, b, c]);
    assert_eq!(
        [status(a), status(b), status(c)],
        ["ready", "ready", "ready"]
    );
    bench.ok(&["triage", a]);
    bench.ok(&["triage", b]);
    bench.ok(&["promote", a, "shaped", "--ids", b]);
    assert_eq!([status(a), status(b)], ["ready", "ready"]);
    // A refusal is said, and the rest still move.
    bench.claim(b, None);
    let output = bench.run(&["archive", a, b, c]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        text(&output.stderr).contains(&format!("error: {b}:")),
        "{}",
        text(&output.stderr)
    );
    assert_eq!(
        [status(a), status(b), status(c)],
        ["archived", "running", "archived"]
    );
}

//! `kanban boards`: several boards under one kanban home, in the seed
//! system's layout.

use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;

use crate::{Bench, text};

/// `kanban ARGS…` with the kanban home `home` and no board named.
fn at(bench: &Bench, home: &Path, args: &[&str]) -> Output {
    bench
        .command()
        .env(kanban_core::vars::HOME, home)
        .args(args)
        .output()
        .unwrap()
}

fn ok(bench: &Bench, home: &Path, args: &[&str]) -> String {
    let output = at(bench, home, args);
    assert!(
        output.status.success(),
        "kanban {args:?}: {}",
        text(&output.stderr)
    );
    text(&output.stdout)
}

/// The error of a refused command, which must exit 1.
fn refused(bench: &Bench, home: &Path, args: &[&str]) -> String {
    let output = at(bench, home, args);
    assert_eq!(
        output.status.code(),
        Some(1),
        "kanban {args:?}: {}{}",
        text(&output.stdout),
        text(&output.stderr)
    );
    text(&output.stderr)
}

fn listed(bench: &Bench, home: &Path) -> Vec<Value> {
    let listed: Value =
        serde_json::from_str(&ok(bench, home, &["boards", "list", "--json"])).unwrap();
    listed.as_array().unwrap().clone()
}

fn slugs(entries: &[Value]) -> Vec<&str> {
    entries
        .iter()
        .map(|entry| entry["slug"].as_str().unwrap())
        .collect()
}

/// Every entry has the documented fields (docs/cli.md), of their types.
fn assert_shape(entry: &Value) {
    for field in ["slug", "name", "engine"] {
        assert!(entry[field].is_string(), "{field}: {entry}");
    }
    for field in ["is_current", "earlier_place"] {
        assert!(entry[field].is_boolean(), "{field}: {entry}");
    }
    assert!(entry["counts"].is_object(), "{entry}");
    assert!(entry["total"].is_i64(), "{entry}");
    assert!(
        entry["db_path"].is_string() || entry["db_path"].is_null(),
        "{entry}"
    );
    assert!(
        entry["problem"].is_string() || entry["problem"].is_null(),
        "{entry}"
    );
    assert!(
        entry.get("db_url").is_none(),
        "db_url is never shown: {entry}"
    );
}

#[test]
fn boards_are_made_listed_switched_renamed_and_archived_in_the_seed_layout() {
    let bench = Bench::new();
    let home = bench.path().join("home");
    // A new home has the default board, current, not made yet.
    let entries = listed(&bench, &home);
    assert_eq!(slugs(&entries), ["default"]);
    assert_eq!(entries[0]["is_current"], true);
    assert_eq!(entries[0]["counts"], serde_json::json!({}));
    assert_shape(&entries[0]);
    // The default board is HOME/kanban.db, marked as the seed marks its own.
    ok(&bench, &home, &["init"]);
    assert!(home.join("kanban.db").is_file());
    assert!(home.join("kanban.db.init.lock").is_file());
    ok(&bench, &home, &["add", "on the default board"]);

    let made = ok(
        &bench,
        &home,
        &[
            "boards",
            "create",
            "ATM10-server",
            "--description",
            "the modded server",
            "--switch",
        ],
    );
    assert!(made.contains("created"), "{made}");
    let file = home.join("kanban/boards/atm10-server/kanban.db");
    assert!(file.is_file());
    let metadata: Value =
        serde_json::from_str(&std::fs::read_to_string(file.with_file_name("board.json")).unwrap())
            .unwrap();
    assert_eq!(metadata["name"], "Atm10 Server");
    assert_eq!(metadata["description"], "the modded server");
    assert!(metadata["created_at"].is_i64());
    // Made twice: left as it was.
    let again = ok(&bench, &home, &["boards", "create", "atm10-server"]);
    assert!(again.contains("already exists"), "{again}");

    // Commands naming no board use the current one; --board names another.
    ok(&bench, &home, &["add", "on the server board"]);
    let on_current = ok(&bench, &home, &["ls"]);
    assert!(on_current.contains("on the server board") && !on_current.contains("default board"));
    let on_default = ok(&bench, &home, &["--board", "default", "ls"]);
    assert!(on_default.contains("on the default board"));

    let entries = listed(&bench, &home);
    assert_eq!(slugs(&entries), ["default", "atm10-server"]);
    entries.iter().for_each(assert_shape);
    assert_eq!(entries[1]["is_current"], true);
    assert_eq!(entries[0]["is_current"], false);
    assert_eq!(entries[1]["counts"], serde_json::json!({"ready": 1}));
    assert_eq!(entries[1]["total"], 1);
    assert_eq!(entries[1]["description"], "the modded server");
    assert_eq!(entries[1]["db_path"], file.display().to_string());
    let human = ok(&bench, &home, &["boards"]);
    assert!(
        human.contains("●   atm10-server") && human.contains("Current board: atm10-server"),
        "{human}"
    );

    ok(
        &bench,
        &home,
        &["boards", "rename", "atm10-server", "ATM10 (prod)"],
    );
    let shown: Value =
        serde_json::from_str(&ok(&bench, &home, &["boards", "show", "--json"])).unwrap();
    assert_eq!(shown["slug"], "atm10-server");
    assert_eq!(shown["name"], "ATM10 (prod)");
    assert_shape(&shown);

    // Bad names and missing boards are refused, naming the fix.
    let error = refused(&bench, &home, &["boards", "switch", "nowhere"]);
    assert!(error.contains("boards create nowhere"), "{error}");
    let error = refused(&bench, &home, &["boards", "create", "../up"]);
    assert!(error.contains("not valid"), "{error}");
    assert!(!bench.path().join("up").exists());
    let error = refused(&bench, &home, &["boards", "rm", "default"]);
    assert!(error.contains("cannot be removed"), "{error}");

    // Removing the current board archives its folder; default is current again.
    ok(&bench, &home, &["boards", "rm", "atm10-server"]);
    assert!(!file.exists());
    let archived: Vec<PathBuf> = std::fs::read_dir(home.join("kanban/boards/_archived"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    assert_eq!(archived.len(), 1);
    assert!(archived[0].join("kanban.db").is_file());
    assert_eq!(slugs(&listed(&bench, &home)), ["default"]);
    assert!(ok(&bench, &home, &["ls"]).contains("on the default board"));

    // `delete` removes for good.
    ok(&bench, &home, &["boards", "new", "scratch"]);
    ok(&bench, &home, &["boards", "delete", "scratch"]);
    assert!(!home.join("kanban/boards/scratch").exists());
}

#[test]
fn a_board_where_an_earlier_kanban_kept_it_is_found_there() {
    let bench = Bench::new();
    let home = bench.path().join("home");
    let earlier = home.join("boards/team/kanban.db");
    bench.on(&earlier).arg("init").output().unwrap();
    let made = bench
        .on(&earlier)
        .args(["add", "kept before"])
        .output()
        .unwrap();
    assert!(made.status.success(), "{}", text(&made.stderr));
    assert!(ok(&bench, &home, &["--board", "team", "ls"]).contains("kept before"));
    let entries = listed(&bench, &home);
    assert_eq!(slugs(&entries), ["default", "team"]);
    assert_eq!(entries[1]["earlier_place"], true);
    assert_eq!(entries[1]["db_path"], earlier.display().to_string());
    assert!(ok(&bench, &home, &["boards"]).contains("[in HOME/boards]"));
    ok(&bench, &home, &["boards", "switch", "team"]);
    assert!(ok(&bench, &home, &["ls"]).contains("kept before"));
}

#[test]
fn a_broken_board_json_is_said_and_never_overwritten() {
    let bench = Bench::new();
    let home = bench.path().join("home");
    ok(&bench, &home, &["boards", "create", "team"]);
    let metadata = home.join("kanban/boards/team/board.json");
    std::fs::write(&metadata, "[not an object").unwrap();
    let entries = listed(&bench, &home);
    assert!(
        entries[1]["problem"]
            .as_str()
            .is_some_and(|problem| problem.contains("board.json is not a JSON object")),
        "{}",
        entries[1]
    );
    let error = refused(&bench, &home, &["boards", "rename", "team", "Team"]);
    assert!(error.contains("board.json"), "{error}");
    assert_eq!(
        std::fs::read_to_string(&metadata).unwrap(),
        "[not an object"
    );
    // A stale current board is passed over.
    std::fs::write(home.join("kanban/current"), "gone\n").unwrap();
    let shown: Value =
        serde_json::from_str(&ok(&bench, &home, &["boards", "show", "--json"])).unwrap();
    assert_eq!(shown["slug"], "default");
}

#[test]
fn a_board_a_dispatcher_ticks_is_not_removed() {
    let bench = Bench::new();
    let home = bench.path().join("home");
    ok(&bench, &home, &["boards", "create", "busy"]);
    ok(&bench, &home, &["--board", "busy", "add", "work"]);
    let said = bench.path().join("dispatcher.out");
    let mut dispatcher = bench
        .command()
        .env("KANBAN_HOME", &home)
        .args([
            "--board",
            "busy",
            "dispatch",
            "--agent",
            "true",
            "--interval",
            "60",
        ])
        .stdout(std::fs::File::create(&said).unwrap())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // It says its first spawn once it holds the board's dispatch lock.
    crate::wait_for("the dispatcher's first spawn", || {
        std::fs::metadata(&said).is_ok_and(|meta| meta.len() > 0)
    });
    let error = refused(&bench, &home, &["boards", "rm", "busy"]);
    dispatcher.kill().unwrap();
    dispatcher.wait().unwrap();
    assert!(error.contains("a dispatcher is ticking"), "{error}");
    assert!(home.join("kanban/boards/busy/kanban.db").is_file());
    ok(&bench, &home, &["boards", "rm", "busy"]);
    assert!(!home.join("kanban/boards/busy").exists());
}

#[test]
fn a_postgresql_board_is_one_database_named_under_the_home() {
    let bench = Bench::postgres();
    let home = bench.path().join("named");
    let url = bench.db.display().to_string();
    ok(
        &bench,
        &home,
        &["boards", "create", "team", "--url", &url, "--switch"],
    );
    let metadata: Value = serde_json::from_str(
        &std::fs::read_to_string(home.join("kanban/boards/team/board.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(metadata["db_url"], url.as_str());
    ok(&bench, &home, &["add", "on the database"]);
    let on_db = bench.ok(&["ls"]);
    assert!(on_db.contains("on the database"), "{on_db}");
    let entries = listed(&bench, &home);
    assert_eq!(entries[1]["engine"], "postgresql");
    assert_eq!(entries[1]["counts"], serde_json::json!({"ready": 1}));
    entries.iter().for_each(assert_shape);
    // A password in the URL never reaches board.json.
    let error = refused(
        &bench,
        &home,
        &[
            "boards",
            "create",
            "leaky",
            "--url",
            "postgres://u:hunter2@localhost/x",
        ],
    );
    assert!(!error.contains("hunter2"), "{error}");
    assert!(!home.join("kanban/boards/leaky").exists());
}

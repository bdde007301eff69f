//! `kanban prove` over the seed's claim matrix, on real files.

use kanban_testkit::SyntheticBoard;

use crate::{Bench, text};

fn prove(bench: &Bench, db: &std::path::Path, extra: &[&str]) -> (i32, serde_json::Value) {
    let output = bench
        .command()
        .arg("--db")
        .arg(db)
        .args([
            "prove",
            "--task",
            "t_live",
            "--run-id",
            "1",
            "--claim-lock",
            "lk",
            "--json",
        ])
        .args(extra)
        .output()
        .unwrap();
    (
        output.status.code().unwrap(),
        serde_json::from_str(&text(&output.stdout)).unwrap(),
    )
}

#[test]
fn prove_over_the_claim_matrix() {
    let bench = Bench::new();
    let pid = 4_242;
    // Each row fails for its own reason, not merely "not live".
    let expected = |id: &str| match id {
        "owned-live" => "live",
        "released-to-the-board" => "not_running",
        "other-process-owns-the-claim" => "pid_mismatch",
        "run-already-closed" => "run_closed",
        "run-handed-to-another-pid" => "run_pid_mismatch",
        "no-live-run-pointer" => "no_run_pointer",
        "board-moved-to-another-run" => "run_moved",
        "claim-lock-no-longer-ours" => "claim_lock_mismatch",
        "task-lease-expired" => "task_lease_expired",
        "run-lease-expired" => "run_lease_expired",
        "null-task-lease-is-not-unbounded" => "task_lease_missing",
        "null-run-lease-is-not-unbounded" => "run_lease_missing",
        other => panic!("a matrix row without an expected reason: {other}"),
    };
    for (id, board) in SyntheticBoard::ownership_matrix(pid) {
        let dir = tempfile::tempdir().unwrap();
        let db = board.write(dir.path());
        let before = std::fs::read(&db).unwrap();
        let (code, verdict) = prove(&bench, &db, &["--pid", &pid.to_string()]);
        let live = id == "owned-live";
        assert_eq!(code, if live { 0 } else { 1 }, "{id}: {verdict}");
        assert_eq!(verdict["live"], live, "{id}");
        assert_eq!(verdict["reason"], expected(id), "{id}: {verdict}");
        assert_eq!(std::fs::read(&db).unwrap(), before, "{id}: prove wrote");
    }
}

#[test]
fn prove_fails_closed_and_never_falls_back() {
    let bench = Bench::new();
    let dir = tempfile::tempdir().unwrap();
    let db = SyntheticBoard::live(1).write(dir.path());
    // No --pid: the pid coordinate is not checked.
    assert_eq!(prove(&bench, &db, &[]).0, 0);
    let missing = dir.path().join("missing.db");
    let (code, verdict) = prove(&bench, &missing, &[]);
    assert_eq!(
        (code, verdict["reason"].as_str()),
        (1, Some("board_not_found"))
    );
    assert!(!missing.exists(), "prove never creates a board");
    // A blank explicit --task is not a worker, whatever the environment says.
    let output = bench
        .command()
        .env("HERMES_KANBAN_TASK", "t_live")
        .arg("--db")
        .arg(&db)
        .args([
            "prove",
            "--task",
            "  ",
            "--run-id",
            "1",
            "--claim-lock",
            "lk",
            "--json",
        ])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(text(&output.stdout).contains("no_task_id"));
    // The carrier in the environment is used when no flag overrides it.
    let before = std::fs::read(&db).unwrap();
    let output = bench
        .command()
        .env("HERMES_KANBAN_TASK", "t_live")
        .env("HERMES_KANBAN_DB", &db)
        .env("HERMES_KANBAN_RUN_ID", "1")
        .env("HERMES_KANBAN_CLAIM_LOCK", "lk")
        .arg("prove")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stdout));
    assert_eq!(text(&output.stdout).trim(), "live");
    assert_eq!(std::fs::read(&db).unwrap(), before, "prove never writes");
}

#[test]
fn prove_owner_side_needs_the_bound_process() {
    let bench = Bench::new();
    let id = bench.add("owned", &[]);
    let carrier = bench.claim(&id, None);
    let get = |name: &str| carrier.iter().find(|(k, _)| k == name).unwrap().1.clone();
    let run = |pid: &str| {
        bench
            .command()
            .envs(carrier.iter().map(|(k, v)| (k, v)))
            .args(["prove", "--owner", "--pid", pid, "--json"])
            .output()
            .unwrap()
    };
    let output = run("77");
    assert_eq!(output.status.code(), Some(1));
    assert!(text(&output.stdout).contains("not_bound"));
    assert_eq!(get("HERMES_KANBAN_RUN_ID"), "1");
    let output = bench.command().args(["prove", "--owner"]).output().unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(
        text(&output.stderr).contains("--pid"),
        "{}",
        text(&output.stderr)
    );
}

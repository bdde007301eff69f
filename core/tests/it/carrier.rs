//! The claim carrier, the proof request and the reasons a proof fails: the
//! names and texts other hosts and scripts rely on.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;

use kanban_core::{CarrierError, Claim, Environment, NotLive, ProofRequest, vars};

fn claim() -> Claim {
    Claim {
        task_id: "t_0123abcd".to_owned(),
        db: "/boards/kanban.db".to_owned(),
        run_id: 42,
        claim_lock: "host:1:abcdef".to_owned(),
        board: Some("team".to_owned()),
    }
}

#[test]
fn a_claim_travels_through_the_carrier_and_back_unchanged() {
    let claim = claim();
    let pairs = claim.to_env_pairs();
    assert_eq!(
        pairs,
        vec![
            (vars::TASK, "t_0123abcd".to_owned()),
            ("KANBAN_TASK", "t_0123abcd".to_owned()),
            (vars::DB, "/boards/kanban.db".to_owned()),
            ("KANBAN_DB", "/boards/kanban.db".to_owned()),
            (vars::RUN_ID, "42".to_owned()),
            ("KANBAN_RUN_ID", "42".to_owned()),
            (vars::CLAIM_LOCK, "host:1:abcdef".to_owned()),
            ("KANBAN_CLAIM_LOCK", "host:1:abcdef".to_owned()),
            (vars::FENCE_TOKEN, "42".to_owned()),
            (vars::BOARD, "team".to_owned()),
            ("KANBAN_BOARD", "team".to_owned()),
        ]
    );
    let env = Environment::from_vars(pairs.iter().map(|(k, v)| (k.to_string(), v.clone())));
    assert_eq!(Claim::from_env(&env), Ok(claim.clone()));
    let unnamed = Claim {
        board: None,
        ..claim
    };
    assert_eq!(
        unnamed.to_env_pairs().len(),
        9,
        "no board variable without a board"
    );
}

#[test]
fn each_variable_is_read_under_its_kanban_name_and_the_seed_name_wins() {
    let ours_only = Environment::from_vars([
        ("KANBAN_TASK", "t_0123abcd"),
        ("KANBAN_DB", "/boards/kanban.db"),
        ("KANBAN_RUN_ID", "42"),
        ("KANBAN_CLAIM_LOCK", "host:1:abcdef"),
        ("KANBAN_BOARD", "team"),
    ]);
    assert_eq!(
        Claim::from_env(&ours_only),
        Err(CarrierError::Missing(vars::TASK)),
        "the seed names are what is read"
    );
    let resolved = ours_only.clone().with_kanban_names();
    assert_eq!(Claim::from_env(&resolved), Ok(claim()));

    let both = ours_only
        .with(vars::TASK, "t_seed")
        .with(vars::DB, "   ")
        .with_kanban_names();
    assert_eq!(both.get(vars::TASK), Some("t_seed"), "the seed name wins");
    assert_eq!(
        both.get(vars::DB),
        Some("/boards/kanban.db"),
        "a blank seed name is unset"
    );

    for (seed, ours) in vars::KANBAN_NAMES {
        assert_eq!(vars::kanban_name(seed), Some(ours));
        assert_eq!(
            ours.strip_prefix("KANBAN_"),
            seed.strip_prefix("HERMES_KANBAN_")
        );
        let env = Environment::new().with(ours, "7").with_kanban_names();
        assert_eq!(env.get(seed), Some("7"), "{ours} stands for {seed}");
        assert_eq!(
            env.kanban_pairs(),
            vec![(seed, "7".to_owned()), (ours, "7".to_owned())],
            "a child gets both names of {seed}"
        );
    }
    assert_eq!(vars::kanban_name(vars::FENCE_TOKEN), None);
}

#[test]
fn a_carrier_that_cannot_be_used_says_which_variable_and_why() {
    let full = Environment::from_vars(
        claim()
            .to_env_pairs()
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v)),
    );
    for name in [vars::TASK, vars::DB, vars::RUN_ID, vars::CLAIM_LOCK] {
        assert_eq!(
            Claim::from_env(&full.clone().without(name)),
            Err(CarrierError::Missing(name))
        );
        assert_eq!(
            Claim::from_env(&full.clone().with(name, "   ")),
            Err(CarrierError::Missing(name)),
            "blank is missing"
        );
    }
    assert_eq!(
        Claim::from_env(&full.clone().with(vars::TASK, "../x")),
        Err(CarrierError::InvalidTaskId {
            variable: vars::TASK,
            value: "../x".to_owned()
        })
    );
    assert_eq!(
        Claim::from_env(&full.clone().with(vars::RUN_ID, "042")),
        Err(CarrierError::InvalidRunId {
            variable: vars::RUN_ID,
            value: "042".to_owned()
        })
    );
    let said = CarrierError::Missing(vars::DB).to_string();
    assert!(
        said.starts_with("HERMES_KANBAN_DB (or KANBAN_DB) is not set"),
        "{said}"
    );
}

#[test]
fn a_proof_request_comes_from_a_claim_or_from_the_carrier() {
    let claim = claim();
    let expected = ProofRequest {
        task_id: Some("t_0123abcd".to_owned()),
        db: Some("/boards/kanban.db".to_owned()),
        run_id: Some("42".to_owned()),
        claim_lock: Some("host:1:abcdef".to_owned()),
    };
    assert_eq!(ProofRequest::for_claim(&claim), expected);
    let env = Environment::new()
        .with(vars::TASK, " t_0123abcd ")
        .with(vars::DB, "/boards/kanban.db")
        .with(vars::RUN_ID, "42")
        .with(vars::CLAIM_LOCK, "host:1:abcdef\n");
    assert_eq!(
        ProofRequest::from_env(&env),
        expected,
        "values are stripped"
    );
    assert_eq!(
        ProofRequest::from_env(&Environment::new().with(vars::RUN_ID, " ")),
        ProofRequest::default()
    );
}

#[test]
fn each_reason_a_proof_fails_has_its_code_and_its_words() {
    let rows: Vec<(NotLive, &str, &str, bool)> = vec![
        (
            NotLive::NoTaskId,
            "no_task_id",
            "no task id: this is not a worker",
            false,
        ),
        (
            NotLive::NoBoard,
            "no_board_pin",
            "no pinned board file (HERMES_KANBAN_DB)",
            false,
        ),
        (
            NotLive::BoardNotFound("/b".into()),
            "board_not_found",
            "board file /b does not exist",
            false,
        ),
        (
            NotLive::NoRunId,
            "no_run_id",
            "no pinned run id (HERMES_KANBAN_RUN_ID)",
            false,
        ),
        (
            NotLive::NoClaimLock,
            "no_claim_lock",
            "no pinned claim lock (HERMES_KANBAN_CLAIM_LOCK)",
            false,
        ),
        (
            NotLive::TaskNotFound,
            "task_not_found",
            "the task is not on the board",
            false,
        ),
        (
            NotLive::NotRunning("ready".into()),
            "not_running",
            "the task is ready, not running",
            false,
        ),
        (
            NotLive::PidMismatch { recorded: 7 },
            "pid_mismatch",
            "the task names worker pid 7",
            false,
        ),
        (
            NotLive::NoRunPointer,
            "no_run_pointer",
            "the task has no current run",
            false,
        ),
        (
            NotLive::RunMoved { current: 3 },
            "run_moved",
            "the task moved on to run 3",
            false,
        ),
        (
            NotLive::LockMismatch,
            "claim_lock_mismatch",
            "the claim lock is no longer ours",
            false,
        ),
        (
            NotLive::TaskLeaseMissing,
            "task_lease_missing",
            "the task lease has no expiry",
            true,
        ),
        (
            NotLive::TaskLeaseExpired { expires: 5, now: 9 },
            "task_lease_expired",
            "the task lease expired at 5 (now 9)",
            true,
        ),
        (
            NotLive::RunNotFound,
            "run_not_found",
            "the run is not on the board",
            false,
        ),
        (
            NotLive::RunClosed,
            "run_closed",
            "the run is already closed",
            false,
        ),
        (
            NotLive::RunPidMismatch { recorded: 8 },
            "run_pid_mismatch",
            "the run names worker pid 8",
            false,
        ),
        (
            NotLive::RunLeaseMissing,
            "run_lease_missing",
            "the run lease has no expiry",
            true,
        ),
        (
            NotLive::RunLeaseExpired { expires: 6, now: 9 },
            "run_lease_expired",
            "the run lease expired at 6 (now 9)",
            true,
        ),
        (
            NotLive::NotBound,
            "not_bound",
            "the newest worker_bound event names another process",
            false,
        ),
        (
            NotLive::Unreadable("disk".into()),
            "board_unreadable",
            "the board could not be read: disk",
            false,
        ),
    ];
    for (reason, code, words, only_expired) in rows {
        assert_eq!(reason.code(), code);
        assert_eq!(reason.to_string(), words);
        assert_eq!(reason.only_expired(), only_expired, "{code}");
    }
}

#[test]
fn the_environment_is_read_as_bytes_and_shows_no_values() {
    let pairs = vec![
        (OsString::from("PATH"), OsString::from("/bin")),
        (
            OsString::from("NOT_TEXT"),
            OsString::from_vec(b"caf\xe9".to_vec()),
        ),
        (
            OsString::from_vec(b"BAD\xffNAME".to_vec()),
            OsString::from("x"),
        ),
        (
            OsString::from("OPENAI_API_KEY"),
            OsString::from("sk-secret"),
        ),
    ];
    let env = Environment::from_os_vars(pairs);
    assert_eq!(env.get("PATH"), Some("/bin"));
    assert_eq!(env.get("OPENAI_API_KEY"), Some("sk-secret"));
    assert_eq!(env.get("NOT_TEXT"), None);
    assert!(env.is_unreadable("NOT_TEXT"));
    assert!(!env.is_unreadable("PATH"));
    assert!(!env.is_unreadable("UNSET"));
    let unreadable: Vec<&str> = env.unreadable().collect();
    assert_eq!(unreadable, ["BAD\u{fffd}NAME", "NOT_TEXT"]);
    let shown = format!("{env:?}");
    assert!(
        shown.contains("OPENAI_API_KEY") && shown.contains("NOT_TEXT"),
        "{shown}"
    );
    assert!(
        !shown.contains("sk-secret") && !shown.contains("/bin"),
        "{shown}"
    );
    let text = Environment::from_vars([("A", "1"), ("B", "2")]);
    assert_eq!((text.get("A"), text.get("B")), (Some("1"), Some("2")));
    assert_eq!(text.unreadable().count(), 0);
}

#[test]
fn an_environment_value_is_set_read_and_removed_by_name() {
    let mut env = Environment::new()
        .with("B", "  two ")
        .with("A", "one")
        .with("BLANK", "  ");
    assert_eq!(env.get("B"), Some("  two "));
    assert_eq!(env.get_trimmed("B"), Some("two"));
    assert_eq!(env.get_trimmed("BLANK"), None, "blank reads as unset");
    assert_eq!(env.get_trimmed("MISSING"), None);
    let all: Vec<(&str, &str)> = env.iter().collect();
    assert_eq!(
        all,
        [("A", "one"), ("B", "  two "), ("BLANK", "  ")],
        "sorted by name"
    );
    env.set("A", "uno");
    env.remove("BLANK");
    assert_eq!(env.get("A"), Some("uno"));
    assert_eq!(env.get("BLANK"), None);
    let without = env.clone().without("A");
    assert_eq!(
        (without.get("A"), without.get_trimmed("B")),
        (None, Some("two"))
    );
    assert_eq!(Environment::new().iter().count(), 0);
}

#[test]
fn turn_kinds_reach_agents_by_the_protocols_names() {
    use kanban_core::TurnKind;
    for (kind, name) in [
        (TurnKind::Initial, "initial"),
        (TurnKind::Recovery, "recovery"),
        (TurnKind::StopNudge, "stop_nudge"),
        (TurnKind::Goal, "goal"),
    ] {
        assert_eq!(kind.as_str(), name);
    }
}

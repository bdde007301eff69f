//! The diagnostics rules: each fires at its threshold and not a second
//! before, with the seed system's kinds and severities.

use kanban_core::diagnostics::{CardFacts, Diagnostic, Severity, Thresholds, diagnose, span};
use kanban_core::{EventRecord, RunRecord, TaskRecord};
use serde_json::json;

const NOW: i64 = 1_000_000;

fn card(status: &str) -> TaskRecord {
    serde_json::from_value(json!({
        "id": "t_1a2b3c4d", "title": "a card", "body": null, "assignee": "coder", "status": status,
        "priority": 0, "created_at": NOW - 10, "claim_lock": null, "claim_expires": null,
        "current_run_id": null, "worker_pid": null, "goal_mode": false, "goal_max_turns": null,
        "max_retries": null, "consecutive_failures": 0, "result": null, "not_before": null,
        "last_failure_error": null, "last_heartbeat_at": null, "max_runtime_seconds": null,
        "held_reason": null, "every_seconds": null
    }))
    .unwrap()
}

fn event(kind: &str, at: i64) -> EventRecord {
    EventRecord {
        id: at,
        task_id: "t_1a2b3c4d".into(),
        run_id: None,
        kind: kind.into(),
        payload: json!({}),
        created_at: at,
    }
}

fn run(id: i64, outcome: &str, error: Option<&str>) -> RunRecord {
    serde_json::from_value(json!({
        "id": id, "task_id": "t_1a2b3c4d", "status": "done", "claim_lock": null, "claim_expires": null,
        "worker_pid": null, "worker_started_at": null, "started_at": NOW - 100, "ended_at": NOW - 50,
        "outcome": outcome, "summary": null, "error": error
    }))
    .unwrap()
}

struct Case {
    task: TaskRecord,
    events: Vec<EventRecord>,
    runs: Vec<RunRecord>,
    served: Option<bool>,
    walls: Vec<(String, i64)>,
}

impl Case {
    fn of(task: TaskRecord) -> Self {
        Self {
            task,
            events: vec![event("created", NOW - 10)],
            runs: Vec::new(),
            served: None,
            walls: Vec::new(),
        }
    }

    fn found(&self) -> Vec<Diagnostic> {
        diagnose(
            &CardFacts {
                task: &self.task,
                events: &self.events,
                runs: &self.runs,
                served: self.served,
                walls: &self.walls,
            },
            NOW,
            &Thresholds::default(),
        )
    }

    /// The kinds and severities found.
    fn kinds(&self) -> Vec<(&'static str, Severity)> {
        self.found().iter().map(|d| (d.kind, d.severity)).collect()
    }
}

#[test]
fn repeated_failures_at_the_dispatchers_limit_and_critical_at_twice_it() {
    let limit = Thresholds::default().failures;
    let mut case = Case::of(card("ready"));
    case.events.push(event("created", NOW)); // not stranded
    for (failures, expected) in [
        (limit - 1, None),
        (limit, Some(Severity::Error)),
        (limit * 2 - 1, Some(Severity::Error)),
        (limit * 2, Some(Severity::Critical)),
    ] {
        case.task.consecutive_failures = failures;
        case.task.last_failure_error = Some("boom\nsecond line".into());
        let found = case.found();
        let got = found.iter().find(|d| d.kind == "repeated_failures");
        assert_eq!(got.map(|d| d.severity), expected, "{failures}");
        if let Some(got) = got {
            assert_eq!(got.title, format!("Agent failure x{failures}: boom"));
            assert_eq!(got.count, u64::from(failures));
            assert_eq!(got.data["consecutive_failures"], failures);
        }
    }
    for status in ["done", "archived", "running"] {
        let mut quiet = Case::of(card(status));
        quiet.task.consecutive_failures = limit * 3;
        assert!(
            quiet
                .kinds()
                .iter()
                .all(|(kind, _)| *kind != "repeated_failures"),
            "{status}"
        );
    }
    let mut bare = Case::of(card("blocked"));
    bare.task.consecutive_failures = limit;
    bare.runs = vec![run(1, "timed_out", None)];
    let found = bare.found();
    let got = found
        .iter()
        .find(|d| d.kind == "repeated_failures")
        .unwrap();
    assert!(got.title.ends_with("(no error recorded)"), "{}", got.title);
    assert_eq!(got.data["most_recent_outcome"], "timed_out");
}

#[test]
fn repeated_crashes_count_back_to_the_last_completed_or_reclaimed_run() {
    let mut case = Case::of(card("blocked"));
    case.runs = vec![
        run(1, "crashed", Some("old")),
        run(2, "completed", None),
        run(3, "crashed", Some("first")),
        run(4, "rate_limited", None),
        run(5, "crashed", Some("last")),
    ];
    let found = case.found();
    let got = found.iter().find(|d| d.kind == "repeated_crashes").unwrap();
    assert_eq!((got.count, got.severity), (2, Severity::Error));
    assert_eq!(got.title, "Agent crashed 2x: last");
    case.runs = vec![
        run(1, "crashed", None),
        run(2, "reclaimed", None),
        run(3, "crashed", None),
    ];
    assert!(case.kinds().is_empty(), "one crash since the reclaim");
    case.runs = (1..=4).map(|id| run(id, "crashed", None)).collect();
    let found = case.found();
    let got = found.iter().find(|d| d.kind == "repeated_crashes").unwrap();
    assert_eq!((got.count, got.severity), (4, Severity::Critical));
    assert!(got.title.ends_with("(no error recorded)"));
    // The failure count says it already; a running card is trying again.
    case.task.consecutive_failures = Thresholds::default().failures;
    assert!(
        case.kinds()
            .iter()
            .all(|(kind, _)| *kind != "repeated_crashes")
    );
    case.task.consecutive_failures = 0;
    case.task = TaskRecord {
        status: card("running").status,
        ..case.task
    };
    assert!(
        case.kinds()
            .iter()
            .all(|(kind, _)| *kind != "repeated_crashes")
    );
}

#[test]
fn a_day_blocked_with_nobody_answering_waits_for_a_person() {
    let day = Thresholds::default().blocked_seconds;
    let mut case = Case::of(card("blocked"));
    case.events.push(event("blocked", NOW - day + 1));
    assert!(case.kinds().is_empty());
    case.events.push(event("blocked", NOW - day));
    case.events.retain(|e| e.created_at != NOW - day + 1);
    assert_eq!(case.kinds(), [("stuck_in_blocked", Severity::Warning)]);
    assert_eq!(case.found()[0].title, "Blocked for 24h");
    // A comment of the same second came with the block, not after it.
    case.events.push(event("commented", NOW - day));
    assert_eq!(case.kinds().len(), 1);
    case.events.push(event("commented", NOW - 5));
    assert!(case.kinds().is_empty(), "a comment answers it");
    let mut ready = Case::of(card("ready"));
    ready.task.assignee = None;
    ready.events.push(event("blocked", NOW - 2 * day));
    assert!(ready.kinds().is_empty(), "only a blocked card");
}

#[test]
fn blocks_after_unblocks_within_a_day_are_cycles() {
    let limits = Thresholds::default();
    let mut case = Case::of(card("todo"));
    let start = NOW - limits.cycle_window_seconds;
    case.events = vec![event("blocked", start - 10), event("unblocked", start - 5)];
    for n in 0..limits.cycles {
        let at = start + 10 * i64::from(n);
        case.events.push(event("blocked", at));
        case.events.push(event("unblocked", at + 1));
    }
    // Two cycles in the window (the first block has no unblock before it there).
    assert!(case.kinds().is_empty(), "{:?}", case.kinds());
    case.events.push(event("blocked", NOW - 1));
    let found = case.found();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(
        (found[0].kind, found[0].count),
        ("block_unblock_cycling", 3)
    );
    assert_eq!(
        (found[0].first_seen_at, found[0].last_seen_at),
        (start, NOW - 1)
    );
}

#[test]
fn an_assigned_ready_card_nobody_claims_is_stranded_and_worse_with_time() {
    let half_hour = Thresholds::default().stranded_seconds;
    for (age, expected) in [
        (half_hour - 1, None),
        (half_hour, Some(Severity::Warning)),
        (2 * half_hour, Some(Severity::Error)),
        (6 * half_hour, Some(Severity::Critical)),
    ] {
        let mut case = Case::of(card("ready"));
        case.events = vec![
            event("created", NOW - 10 * half_hour),
            event("unblocked", NOW - age),
        ];
        let found = case.found();
        assert_eq!(
            found
                .iter()
                .find(|d| d.kind == "stranded_in_ready")
                .map(|d| d.severity),
            expected,
            "{age}"
        );
    }
    let mut old = Case::of(card("ready"));
    old.events.clear();
    old.task.created_at = NOW - half_hour;
    assert_eq!(
        old.kinds(),
        [("stranded_in_ready", Severity::Warning)],
        "no event: its creation"
    );
    let mut waiting = Case::of(card("ready"));
    waiting.events = vec![event("created", NOW - 7 * half_hour)];
    waiting.task.not_before = Some(NOW + 1);
    assert!(waiting.kinds().is_empty(), "a backoff is not stranding");
    // A backoff that ended long ago: ready since it ended.
    waiting.task.not_before = Some(NOW - 6 * half_hour);
    assert_eq!(waiting.kinds(), [("stranded_in_ready", Severity::Critical)]);
    waiting.task.assignee = Some(" ".into());
    assert!(
        waiting.kinds().is_empty(),
        "unassigned cards are not stranded"
    );
    waiting.task.assignee = Some("coder".into());
    waiting.task.claim_lock = Some("lock".into());
    assert!(waiting.kinds().is_empty(), "a claimed card is not");
    // Back in line only now: a run that just ended, a backoff just over,
    // a manual promotion, a lifted wall.
    let mut fresh = Case::of(card("ready"));
    fresh.events = vec![event("created", NOW - 7 * half_hour)];
    fresh.runs = vec![serde_json::from_value(json!({
        "id": 1, "task_id": "t_1a2b3c4d", "status": "done", "claim_lock": null, "claim_expires": null,
        "worker_pid": null, "worker_started_at": null, "started_at": NOW - 200, "ended_at": NOW - 100,
        "outcome": "crashed", "summary": null, "error": null
    })).unwrap()];
    assert!(
        fresh.kinds().is_empty(),
        "it crashed a minute ago: {:?}",
        fresh.kinds()
    );
    fresh.runs.clear();
    fresh.task.not_before = Some(NOW - 60);
    assert!(fresh.kinds().is_empty(), "its backoff just ended");
    fresh.task.not_before = None;
    for kind in [
        "promoted_manual",
        "wall_lifted",
        "released",
        "due",
        "promoted",
        "reclaimed",
    ] {
        fresh.events = vec![event("created", NOW - 7 * half_hour), event(kind, NOW - 60)];
        assert!(fresh.kinds().is_empty(), "{kind}");
    }
    // A wall on its agent holds it, so it is not stranded (the wall is said).
    fresh.events = vec![event("created", NOW - 7 * half_hour)];
    fresh.walls = vec![("agent:coder".into(), NOW + 60)];
    assert_eq!(fresh.kinds(), [("walled", Severity::Warning)]);
    fresh.walls = vec![("agent:coder".into(), NOW)];
    assert_eq!(fresh.kinds(), [("stranded_in_ready", Severity::Critical)]);
}

#[test]
fn a_card_no_agent_serves_a_stuck_run_and_a_wall_are_named() {
    let mut case = Case::of(card("review"));
    case.served = Some(false);
    assert_eq!(case.kinds(), [("no_agent_serves", Severity::Error)]);
    case.served = None;
    assert!(case.kinds().is_empty(), "unknown without an agents file");
    case.served = Some(true);
    assert!(case.kinds().is_empty());
    let mut blocked = Case::of(card("blocked"));
    blocked.served = Some(false);
    assert!(
        blocked.kinds().is_empty(),
        "only cards that wait for a claim"
    );

    let grace = Thresholds::default().lease_grace_seconds;
    let mut running = Case::of(card("running"));
    running.task.current_run_id = Some(7);
    running.task.claim_expires = Some(NOW - grace);
    assert!(running.kinds().is_empty(), "within the grace");
    running.task.claim_expires = Some(NOW - grace - 1);
    let found = running.found();
    assert_eq!(
        (found[0].kind, found[0].severity, found[0].run_id),
        ("stuck_run", Severity::Error, Some(7))
    );
    assert_eq!(found[0].data["late_seconds"], grace + 1);
    running.task.claim_expires = None;
    assert!(running.kinds().is_empty());
    let mut ready = Case::of(card("ready"));
    ready.task.claim_expires = Some(NOW - 10 * grace);
    assert!(ready.kinds().is_empty(), "only a running card");

    let mut held = Case::of(card("ready"));
    held.walls = vec![
        ("old".into(), NOW),
        ("agent:coder".into(), NOW + 90),
        ("sooner".into(), NOW + 30),
    ];
    let found = held.found();
    assert_eq!(
        (found[0].kind, found[0].severity),
        ("walled", Severity::Warning)
    );
    assert_eq!(found[0].data["scope"], "agent:coder");
    assert_eq!(found[0].title, "A provider wall holds it for 1m");
    held.walls = vec![("gone".into(), NOW)];
    assert!(
        held.kinds().is_empty(),
        "a wall that has reset holds nothing"
    );
}

#[test]
fn the_worst_comes_first_and_spans_read_in_their_unit() {
    let mut case = Case::of(card("ready"));
    case.served = Some(false);
    case.task.consecutive_failures = Thresholds::default().failures * 2;
    case.walls = vec![("agent:coder".into(), NOW + 60)];
    let kinds: Vec<_> = case.kinds().into_iter().map(|(kind, _)| kind).collect();
    assert_eq!(kinds, ["repeated_failures", "no_agent_serves", "walled"]);
    assert_eq!(
        [
            span(-5),
            span(59),
            span(60),
            span(3599),
            span(3600),
            span(2 * 86_400 - 1),
            span(2 * 86_400)
        ],
        ["0s", "59s", "1m", "59m", "1h", "47h", "2d"].map(String::from)
    );
    for severity in Severity::ALL {
        assert_eq!(Severity::parse(severity.as_str()), Some(severity));
    }
    assert_eq!(Severity::parse("fatal"), None);
    assert!(Severity::Warning < Severity::Error && Severity::Error < Severity::Critical);
}

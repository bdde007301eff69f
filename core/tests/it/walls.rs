//! Provider walls: the pure rules, as tables.

use std::collections::BTreeSet;

use kanban_core::BookingKind;
use kanban_core::FailureReason;
use kanban_core::walls::{
    Gate, ProviderId, Wall, WallBounds, WallChange, WallHit, WallKind, arm_wall, gate,
    probed_walls, route_label, scopes_of, wall_scope, wall_wait_seconds, walls_after_booking,
};

const NOW: i64 = 1_000_000;
const BOUNDS: WallBounds = WallBounds {
    unnamed_wait: 300,
    max_wall: 3600,
};

fn provider(provider: &str, model: Option<&str>) -> ProviderId {
    ProviderId {
        provider: Some(provider.to_owned()),
        model: model.map(str::to_owned),
    }
}

fn hit(scope: &str, reported: Option<u64>) -> WallHit {
    WallHit {
        scope: scope.to_owned(),
        kind: WallKind::Rate,
        route: "a".to_owned(),
        reported_wait: reported,
        reason: "rate_limit".to_owned(),
    }
}

fn wall(scope: &str, until: i64, probe_run: Option<i64>) -> Wall {
    Wall {
        scope: scope.to_owned(),
        kind: WallKind::Rate,
        route: "a".to_owned(),
        since: NOW - 100,
        until,
        reason: "rate_limit".to_owned(),
        source: "t_1#1".to_owned(),
        hits: 2,
        failed_probes: 1,
        probe_run,
    }
}

fn set(scopes: &[&str]) -> BTreeSet<String> {
    scopes.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn failure_reasons_that_are_walls() {
    let table = [
        (FailureReason::RateLimit, Some(WallKind::Rate)),
        (FailureReason::UpstreamRateLimit, Some(WallKind::Rate)),
        (FailureReason::Billing, Some(WallKind::Credential)),
        (FailureReason::Auth, Some(WallKind::Credential)),
        (FailureReason::AuthPermanent, Some(WallKind::Credential)),
        (FailureReason::Overloaded, None),
        (FailureReason::ServerError, None),
        (FailureReason::Timeout, None),
        (FailureReason::ContextOverflow, None),
    ];
    for (reason, kind) in table {
        assert_eq!(WallKind::of_failure(&reason), kind, "{reason:?}");
    }
    for kind in [WallKind::Rate, WallKind::Credential] {
        assert_eq!(WallKind::parse(kind.as_str()), Some(kind));
    }
    assert_eq!(WallKind::parse("moon"), None);
    assert_eq!(WallKind::Rate.as_str(), "rate");
    assert_eq!(WallKind::Credential.as_str(), "credential");
}

#[test]
fn scopes_name_the_credential_the_model_or_the_agent() {
    let p = provider("https://api.example/v1 key:ab12", Some("gpt-x"));
    assert_eq!(
        wall_scope(WallKind::Credential, "a#1", &p),
        "https://api.example/v1 key:ab12"
    );
    assert_eq!(
        wall_scope(WallKind::Rate, "a#1", &p),
        "https://api.example/v1 key:ab12 model:gpt-x"
    );
    let no_model = provider("P", None);
    assert_eq!(wall_scope(WallKind::Rate, "a#1", &no_model), "P");
    let none = ProviderId::default();
    assert_eq!(wall_scope(WallKind::Rate, "a#1", &none), "agent:a#1");
    // Reported names are cleaned: no control characters, bounded, trimmed.
    let messy = provider(" P\n\u{7}Q ", Some("m\r"));
    assert_eq!(wall_scope(WallKind::Rate, "x", &messy), "PQ model:m");
    let blank = provider(" \n ", Some(" "));
    assert_eq!(wall_scope(WallKind::Rate, "x", &blank), "agent:x");
    let long = provider(&"p".repeat(500), None);
    assert_eq!(wall_scope(WallKind::Credential, "x", &long).len(), 200);
    assert_eq!(
        scopes_of("a#1", &p),
        set(&[
            "agent:a#1",
            "https://api.example/v1 key:ab12",
            "https://api.example/v1 key:ab12 model:gpt-x"
        ])
    );
    assert_eq!(scopes_of("a#1", &none), set(&["agent:a#1"]));
    assert_eq!(scopes_of("a#1", &blank), set(&["agent:a#1"]));
    assert_eq!(route_label(""), "default");
    assert_eq!(route_label("a"), "a");
}

#[test]
fn the_wait_honours_the_reset_doubles_per_failed_probe_and_is_bounded() {
    let table = [
        // (reported, unnamed, failed probes, max, wait)
        (Some(30), 300, 0, 3600, 30),
        (Some(30), 300, 1, 3600, 60),
        (Some(30), 300, 3, 3600, 240),
        (None, 300, 0, 3600, 300),
        (None, 300, 2, 3600, 1200),
        (None, 300, 5, 3600, 3600),
        (Some(86_400), 300, 0, 3600, 3600),
        (Some(u64::MAX), 300, 0, 3600, 3600),
        (Some(30), 300, 200, 3600, 3600),
        (None, 0, 0, 3600, 0),
        (Some(30), 300, 0, 0, 0),
        (None, -5, 0, 3600, 0),
    ];
    for (reported, unnamed, failed, max, wait) in table {
        assert_eq!(
            wall_wait_seconds(reported, unnamed, failed, max),
            wait,
            "{reported:?} {unnamed} {failed} {max}"
        );
    }
}

#[test]
fn a_first_hit_arms_a_wall_at_the_reset_time() {
    let armed = arm_wall(None, &hit("S", Some(30)), "t_1", 7, NOW, BOUNDS);
    assert_eq!(
        armed,
        Wall {
            scope: "S".into(),
            kind: WallKind::Rate,
            route: "a".into(),
            since: NOW,
            until: NOW + 30,
            reason: "rate_limit".into(),
            source: "t_1#7".into(),
            hits: 1,
            failed_probes: 0,
            probe_run: None,
        }
    );
}

#[test]
fn more_hits_extend_but_never_shorten_and_a_failed_probe_backs_off() {
    let existing = wall("S", NOW + 500, Some(9));
    // A run that started before the wall: counted, the wall stays further out.
    let other = arm_wall(Some(&existing), &hit("S", Some(30)), "t_2", 8, NOW, BOUNDS);
    assert_eq!(other.until, NOW + 500);
    assert_eq!(other.hits, 3);
    assert_eq!(other.failed_probes, 1);
    assert_eq!(other.since, NOW - 100);
    assert_eq!(other.probe_run, Some(9), "the probe still runs");
    assert_eq!(other.source, "t_2#8");
    let later = arm_wall(Some(&existing), &hit("S", Some(900)), "t_2", 8, NOW, BOUNDS);
    assert_eq!(
        later.until,
        NOW + 1800,
        "a later reset (backed off) moves the wall out"
    );
    // The probe itself hit it again: doubled from the reset, whatever the
    // old wall said, and the probe is over.
    let probe = arm_wall(Some(&existing), &hit("S", Some(30)), "t_3", 9, NOW, BOUNDS);
    assert_eq!(probe.failed_probes, 2);
    assert_eq!(probe.until, NOW + 120);
    assert_eq!(probe.probe_run, None);
    assert_eq!(probe.hits, 3);
    let capped = Wall {
        hits: u32::MAX,
        ..existing.clone()
    };
    assert_eq!(
        arm_wall(Some(&capped), &hit("S", None), "t", 1, NOW, BOUNDS).hits,
        u32::MAX
    );
    let long_reason = WallHit {
        reason: "r".repeat(500),
        ..hit("S", None)
    };
    assert_eq!(
        arm_wall(None, &long_reason, "t", 1, NOW, BOUNDS)
            .reason
            .len(),
        200
    );
}

#[test]
fn a_booking_arms_lifts_or_ends_a_probe() {
    let walls = [wall("S", NOW - 1, Some(9)), wall("T", NOW - 1, Some(9))];
    // A wall hit by a wall-kind booking arms its scope; the probe of
    // another scope just ends.
    let changes = walls_after_booking(
        &walls,
        Some(&hit("S", Some(30))),
        BookingKind::RateLimited,
        "t",
        9,
        NOW,
        BOUNDS,
    );
    assert_eq!(changes.len(), 2, "{changes:?}");
    // The probe met its wall again: twice its last backoff of the reset.
    assert!(matches!(&changes[0], WallChange::Arm(w) if w.scope == "S" && w.until == NOW + 120));
    assert_eq!(changes[1], WallChange::ProbeEnded { scope: "T".into() });
    // A terminal provider failure arms too.
    let changes = walls_after_booking(
        &[],
        Some(&hit("S", None)),
        BookingKind::TerminalProvider,
        "t",
        9,
        NOW,
        BOUNDS,
    );
    assert!(matches!(&changes[..], [WallChange::Arm(w)] if w.until == NOW + 300));
    // A hit booked as anything else (the run settled first) arms nothing.
    for kind in [
        BookingKind::Settled,
        BookingKind::Crashed,
        BookingKind::Interrupted,
        BookingKind::TimedOut,
        BookingKind::ProtocolViolation,
    ] {
        let changes = walls_after_booking(&[], Some(&hit("S", None)), kind, "t", 9, NOW, BOUNDS);
        assert!(changes.is_empty(), "{kind:?}");
    }
    // The probe answered: lifted. It crashed: the probe ends, the wall stays.
    for (kind, lifted) in [
        (BookingKind::Settled, true),
        (BookingKind::ProtocolViolation, true),
        (BookingKind::Crashed, false),
        (BookingKind::TimedOut, false),
        (BookingKind::Interrupted, false),
        (BookingKind::RateLimited, false),
    ] {
        let changes = walls_after_booking(&walls[..1], None, kind, "t", 9, NOW, BOUNDS);
        let expected = if lifted {
            WallChange::Lift { scope: "S".into() }
        } else {
            WallChange::ProbeEnded { scope: "S".into() }
        };
        assert_eq!(changes, [expected], "{kind:?}");
    }
    // Another run's booking leaves the probe alone.
    assert!(
        walls_after_booking(&walls, None, BookingKind::Settled, "t", 10, NOW, BOUNDS).is_empty()
    );
}

#[test]
fn the_gate_holds_until_the_reset_then_lets_one_probe_through() {
    let scopes = set(&["S", "agent:a#1"]);
    let running = BTreeSet::from([9]);
    let none = BTreeSet::new();
    let table = [
        // (walls, running runs, gate)
        (vec![], &none, Gate::Open),
        (vec![wall("other", NOW + 10, None)], &none, Gate::Open),
        (
            vec![wall("S", NOW + 10, None)],
            &none,
            Gate::Held { until: NOW + 10 },
        ),
        (vec![wall("S", NOW, None)], &none, Gate::Probe),
        (
            vec![wall("S", NOW - 5, Some(9))],
            &running,
            Gate::Held { until: NOW - 5 },
        ),
        (vec![wall("S", NOW - 5, Some(9))], &none, Gate::Probe),
        (
            vec![wall("S", NOW + 10, None), wall("agent:a#1", NOW + 20, None)],
            &none,
            Gate::Held { until: NOW + 20 },
        ),
        (
            vec![wall("S", NOW + 30, None), wall("agent:a#1", NOW + 20, None)],
            &none,
            Gate::Held { until: NOW + 30 },
        ),
        (
            vec![wall("S", NOW - 1, None), wall("agent:a#1", NOW + 20, None)],
            &none,
            Gate::Held { until: NOW + 20 },
        ),
        (
            vec![wall("agent:a#1", NOW + 20, None), wall("S", NOW - 1, None)],
            &none,
            Gate::Held { until: NOW + 20 },
        ),
        (
            vec![wall("S", NOW - 1, None), wall("agent:a#1", NOW - 2, None)],
            &none,
            Gate::Probe,
        ),
    ];
    for (walls, running, expected) in table {
        assert_eq!(gate(&walls, &scopes, running, NOW), expected, "{walls:?}");
    }
    let walls = [
        wall("S", NOW - 1, None),
        wall("agent:a#1", NOW, Some(3)),
        wall("later", NOW - 1, None),
        wall("S2", NOW + 1, None),
    ];
    let scopes = set(&["S", "agent:a#1", "S2"]);
    let probed: Vec<&str> = probed_walls(&walls, &scopes, NOW)
        .into_iter()
        .map(|wall| wall.scope.as_str())
        .collect();
    assert_eq!(probed, ["S", "agent:a#1"]);
}

#[test]
fn a_run_names_only_the_provider_its_agent_is_entitled_to() {
    use kanban_core::walls::{entitled_provider, is_declarable_provider};
    let id = |provider: Option<&str>, model: Option<&str>| ProviderId {
        provider: provider.map(str::to_owned),
        model: model.map(str::to_owned),
    };
    let rows = [
        // entitled, reported, walled
        (
            id(Some("p"), Some("m")),
            id(Some("p"), Some("m")),
            id(Some("p"), Some("m")),
        ),
        (
            id(Some("p"), Some("m")),
            id(Some("p"), Some("x")),
            id(Some("p"), Some("m")),
        ),
        (
            id(Some("p"), None),
            id(Some("p"), Some("x")),
            id(Some("p"), Some("x")),
        ),
        (
            id(Some("p"), None),
            id(None, Some("x")),
            id(Some("p"), Some("x")),
        ),
        (id(Some("p"), None), id(None, None), id(Some("p"), None)),
        (
            id(Some("p"), None),
            id(Some(" p\n"), None),
            id(Some("p"), None),
        ),
        (
            id(Some("p"), Some("m")),
            id(Some("q"), Some("m")),
            id(None, None),
        ),
        (
            id(Some("p"), None),
            id(Some("agent:other#1"), None),
            id(None, None),
        ),
        (id(None, None), id(Some("p"), Some("m")), id(None, None)),
        (id(None, None), id(None, Some("m")), id(None, None)),
        (id(Some("\n"), None), id(Some("p"), None), id(None, None)),
    ];
    for (entitled, reported, walled) in rows {
        assert_eq!(
            entitled_provider(&entitled, &reported),
            walled,
            "{entitled:?} reporting {reported:?}"
        );
    }
    assert!(is_declarable_provider("openai:team"));
    assert!(!is_declarable_provider("agent:coder#ab12"));
    assert!(!is_declarable_provider("  "));
}

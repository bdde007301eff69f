//! A dry run of a tick's claims: `foresee`, as tables.

use std::collections::BTreeMap;

use kanban_core::rules::ClaimCandidate;
use kanban_core::walls::Gate;
use kanban_core::{Foreseen, Gates, TaskStatus, foresee};

const NOW: i64 = 1_000;

/// A ready card of `assignee`, claimable at NOW.
fn card(id: &str, assignee: Option<&str>) -> ClaimCandidate {
    ClaimCandidate {
        task_id: id.to_owned(),
        title: String::new(),
        status: Some(TaskStatus::Ready),
        claimed: false,
        held: false,
        not_before: None,
        assignee: assignee.map(str::to_owned),
        priority: 0,
        created_at: 0,
        place: 0,
        open_parents: false,
        goal_mode: false,
        ran_before: false,
    }
}

/// Agents `coder` (its own route) and the unnamed one for unassigned
/// cards, both open; nobody serves `reviewer`.
fn gates() -> Gates {
    Gates {
        routes: BTreeMap::from([
            (Some("coder".to_owned()), Some("coder".to_owned())),
            (None, Some(String::new())),
            (Some("reviewer".to_owned()), None),
        ]),
        gates: BTreeMap::from([
            ("coder".to_owned(), Gate::Open),
            (String::new(), Gate::Open),
        ]),
        room: BTreeMap::new(),
    }
}

fn claim(route: &str) -> Foreseen {
    Foreseen::Claim {
        route: route.to_owned(),
    }
}

#[test]
fn the_claim_rule_passes_over_cards_whatever_their_agent() {
    let mut running = card("t_run", Some("coder"));
    running.claimed = true;
    let mut held = card("t_held", Some("coder"));
    held.held = true;
    let mut later = card("t_later", Some("coder"));
    later.not_before = Some(NOW + 1);
    let mut now_due = card("t_due", Some("coder"));
    now_due.not_before = Some(NOW);
    let mut parents = card("t_child", Some("coder"));
    parents.open_parents = true;
    let mut review = card("t_review", Some("coder"));
    review.status = Some(TaskStatus::Review);
    review.open_parents = true;
    let lane = [
        running,
        held,
        later,
        card("../x", Some("coder")),
        card("t_nobody", Some("reviewer")),
        card("t_unknown", Some("stranger")),
        parents,
        now_due,
        review,
    ];
    assert_eq!(
        foresee(&lane, NOW, 10, &gates()),
        [
            Foreseen::Running,
            Foreseen::Held,
            Foreseen::Waits { until: NOW + 1 },
            Foreseen::InvalidId,
            Foreseen::NoAgent,
            Foreseen::NoAgent,
            Foreseen::ParentsOpen,
            claim("coder"),
            // A card in review is claimed whatever its parents.
            claim("coder"),
        ]
    );
}

#[test]
fn the_hosts_slots_go_in_claim_order_and_passed_over_cards_use_none() {
    let mut held = card("t_held", None);
    held.held = true;
    let lane = [
        card("t_1", None),
        held,
        card("t_2", Some("coder")),
        card("t_3", None),
    ];
    assert_eq!(
        foresee(&lane, NOW, 2, &gates()),
        [
            claim("default"),
            Foreseen::Held,
            claim("coder"),
            Foreseen::NoRoom
        ]
    );
    assert_eq!(
        foresee(&lane, NOW, 0, &gates()),
        [
            Foreseen::NoRoom,
            Foreseen::Held,
            Foreseen::NoRoom,
            Foreseen::NoRoom
        ]
    );
}

#[test]
fn an_agent_takes_no_more_than_its_own_room() {
    let mut gates = gates();
    gates.room.insert("coder".to_owned(), 1);
    let lane = [
        card("t_1", Some("coder")),
        card("t_2", Some("coder")),
        card("t_3", None),
    ];
    let full = Foreseen::AgentFull {
        route: "coder".to_owned(),
    };
    assert_eq!(
        foresee(&lane, NOW, 5, &gates),
        [claim("coder"), full.clone(), claim("default")]
    );
    // An agent already at its limit has no gate at all.
    gates.gates.remove("coder");
    gates.room.insert("coder".to_owned(), 0);
    assert_eq!(
        foresee(&lane, NOW, 5, &gates),
        [full.clone(), full, claim("default")]
    );
}

#[test]
fn a_wall_holds_its_agents_cards_and_one_card_probes_it_first() {
    let mut gates = gates();
    gates
        .gates
        .insert("coder".to_owned(), Gate::Held { until: NOW + 60 });
    let lane = [card("t_1", None), card("t_2", Some("coder"))];
    assert_eq!(
        foresee(&lane, NOW, 5, &gates),
        [
            claim("default"),
            Foreseen::Walled {
                route: "coder".to_owned(),
                until: NOW + 60
            }
        ]
    );
    // Its reset came: the agent's first card probes it, before any other
    // card takes a slot; the rest of its cards wait for the probe.
    gates.gates.insert("coder".to_owned(), Gate::Probe);
    gates.room.insert("coder".to_owned(), 2);
    let lane = [
        card("t_1", None),
        card("t_2", Some("coder")),
        card("t_3", Some("coder")),
    ];
    let probe = Foreseen::Probe {
        route: "coder".to_owned(),
    };
    let probed = Foreseen::WallProbed {
        route: "coder".to_owned(),
    };
    assert_eq!(
        foresee(&lane, NOW, 1, &gates),
        [Foreseen::NoRoom, probe.clone(), probed]
    );
    assert_eq!(
        foresee(&lane, NOW, 0, &gates),
        [Foreseen::NoRoom, Foreseen::NoRoom, Foreseen::NoRoom]
    );
    // A probe's claim takes its slot even when no card of its agent waits,
    // as the tick's claim call does.
    let lane_without = [card("t_1", None), card("t_4", None)];
    assert_eq!(
        foresee(&lane_without, NOW, 2, &gates),
        [claim("default"), Foreseen::NoRoom]
    );
    // Each walled agent has its own probe.
    gates.gates.insert(String::new(), Gate::Probe);
    let lane = [card("t_2", Some("coder")), card("t_1", None)];
    assert_eq!(
        foresee(&lane, NOW, 2, &gates),
        [
            probe,
            Foreseen::Probe {
                route: "default".to_owned()
            }
        ]
    );
}

#[test]
fn only_claims_and_probes_are_claimed() {
    assert!(claim("a").claimed());
    assert!(Foreseen::Probe { route: "a".into() }.claimed());
    assert!(!Foreseen::NoRoom.claimed());
    assert!(!Foreseen::Held.claimed());
}

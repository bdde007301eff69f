//! A swarm's graph: the cards it plans, what it refuses, and the topology
//! note either system reads back.

use kanban_core::BoardError;
use kanban_core::swarm::{
    BLACKBOARD_PREFIX, MAX_SWARM_WORKERS, SWARM_KIND, Swarm, SwarmCards, SwarmWorker,
    recorded_topology,
};

fn worker(assignee: &str, title: &str) -> SwarmWorker {
    SwarmWorker {
        assignee: assignee.into(),
        title: title.into(),
    }
}

fn swarm() -> Swarm {
    Swarm {
        goal: "ship the notes\nand the changelog".into(),
        workers: vec![worker("writer", "draft"), worker("counter", "count")],
        verifier: "checker".into(),
        synthesizer: "editor".into(),
        created_by: "lead".into(),
        priority: 2,
        idempotency_key: Some("k".into()),
    }
}

fn cards() -> SwarmCards {
    SwarmCards {
        root_id: "t_root".into(),
        worker_ids: vec!["t_a".into(), "t_b".into()],
        verifier_id: "t_v".into(),
        synthesizer_id: "t_s".into(),
    }
}

#[test]
fn a_worker_is_assignee_colon_title() {
    assert_eq!(
        SwarmWorker::parse(" writer : draft the notes: part one"),
        Err("--worker \" writer : draft the notes: part one\" names skills (part one), which cards here do not keep; give ASSIGNEE:TITLE".into())
    );
    assert_eq!(
        SwarmWorker::parse(" writer : draft the notes "),
        Ok(worker("writer", "draft the notes"))
    );
    assert_eq!(
        SwarmWorker::parse("writer:draft:"),
        Ok(worker("writer", "draft"))
    );
    for bad in ["writer", "writer:", ":draft", " : "] {
        let refused = SwarmWorker::parse(bad).unwrap_err();
        assert!(refused.contains("ASSIGNEE:TITLE"), "{bad}: {refused}");
    }
}

#[test]
fn a_swarm_needs_a_goal_workers_and_names() {
    assert_eq!(swarm().check(), Ok(()));
    let refused = |changed: Swarm, words: &str| match changed.check() {
        Err(BoardError::InvalidInput(message)) => assert!(message.contains(words), "{message}"),
        other => panic!("{words}: {other:?}"),
    };
    refused(
        Swarm {
            goal: " \n".into(),
            ..swarm()
        },
        "non-blank goal",
    );
    refused(
        Swarm {
            workers: Vec::new(),
            ..swarm()
        },
        "at least one --worker",
    );
    let many = vec![worker("w", "t"); MAX_SWARM_WORKERS + 1];
    refused(
        Swarm {
            workers: many,
            ..swarm()
        },
        "at most 64 workers (65 given)",
    );
    let most = vec![worker("w", "t"); MAX_SWARM_WORKERS];
    assert_eq!(
        Swarm {
            workers: most,
            ..swarm()
        }
        .check(),
        Ok(())
    );
    refused(
        Swarm {
            verifier: " ".into(),
            ..swarm()
        },
        "--verifier",
    );
    refused(
        Swarm {
            synthesizer: String::new(),
            ..swarm()
        },
        "--synthesizer",
    );
    refused(
        Swarm {
            created_by: " ".into(),
            ..swarm()
        },
        "--created-by",
    );
    for blank in [worker(" ", "t"), worker("w", " ")] {
        let workers = vec![worker("w", "t"), blank];
        refused(Swarm { workers, ..swarm() }, "an assignee and a title");
    }
}

#[test]
fn the_graph_waits_in_order_and_names_its_maker() {
    let swarm = swarm();
    let root = swarm.root();
    assert_eq!(root.title, "Swarm: ship the notes");
    assert_eq!(root.assignee.as_deref(), Some("lead"));
    assert_eq!(root.created_by.as_deref(), Some("lead"));
    assert_eq!(root.idempotency_key.as_deref(), Some("k"));
    assert_eq!(root.priority, 2);
    assert!(root.parents.is_empty());
    assert!(
        root.body
            .unwrap()
            .ends_with("Goal:\nship the notes\nand the changelog")
    );
    let long = Swarm {
        goal: "x".repeat(100),
        ..swarm.clone()
    };
    assert_eq!(long.root().title, format!("Swarm: {}", "x".repeat(80)));
    let handoff = swarm.root_handoff();
    let metadata = handoff.metadata.unwrap();
    assert_eq!(metadata["kind"], SWARM_KIND);
    assert_eq!(metadata["worker_count"], 2);
    assert_eq!(metadata["goal"], swarm.goal.as_str());

    let workers = swarm.worker_cards("t_root");
    assert_eq!(workers.len(), 2);
    for (card, (assignee, title)) in workers
        .iter()
        .zip([("writer", "draft"), ("counter", "count")])
    {
        assert_eq!(card.title, title);
        assert_eq!(card.assignee.as_deref(), Some(assignee));
        assert_eq!(card.parents, ["t_root"]);
        assert_eq!(card.created_by.as_deref(), Some("lead"));
        assert_eq!(card.priority, 2);
        assert_eq!(card.idempotency_key, None, "the key is the root's alone");
        let body = card.body.as_deref().unwrap();
        assert!(
            body.starts_with(title) && body.contains("`t_root`"),
            "{body}"
        );
    }
    let ids = ["t_a".to_owned(), "t_b".to_owned()];
    let verifier = swarm.verifier_card("t_root", &ids);
    assert_eq!(verifier.title, "Verify swarm outputs");
    assert_eq!(verifier.assignee.as_deref(), Some("checker"));
    assert_eq!(verifier.parents, ids);
    assert!(verifier.body.unwrap().contains(r#"{"gate": "pass"}"#));
    let synthesizer = swarm.synthesizer_card("t_root", "t_v");
    assert_eq!(synthesizer.title, "Synthesize swarm outputs");
    assert_eq!(synthesizer.assignee.as_deref(), Some("editor"));
    assert_eq!(synthesizer.parents, ["t_v"]);
    assert_eq!(synthesizer.created_by.as_deref(), Some("lead"));
}

#[test]
fn the_newest_complete_topology_note_names_the_swarm() {
    let swarm = swarm();
    let note = swarm.topology_note(&cards());
    assert!(note.starts_with(BLACKBOARD_PREFIX), "{note}");
    assert!(
        note.contains(r#""goal":"ship the notes\nand the changelog""#),
        "{note}"
    );
    assert_eq!(recorded_topology([note.as_str()]), Some(cards()));
    // The seed system's own spelling: spaces after its separators.
    let seed = r#"[swarm:blackboard] {"key": "topology", "value": {"goal": "g", "root_id": "t_r", "synthesizer_id": "t_s", "verifier_id": "t_v", "worker_ids": ["t_w"]}}"#;
    let theirs = SwarmCards {
        root_id: "t_r".into(),
        worker_ids: vec!["t_w".into()],
        verifier_id: "t_v".into(),
        synthesizer_id: "t_s".into(),
    };
    assert_eq!(recorded_topology([seed]), Some(theirs.clone()));
    // The newest topology note decides; other notes and keys are passed by.
    let other_key = r#"[swarm:blackboard] {"key": "findings", "value": {"root_id": "t_x"}}"#;
    let plain = "not a note";
    let broken = "[swarm:blackboard] {not json";
    assert_eq!(
        recorded_topology([other_key, plain, broken, seed, note.as_str()]),
        Some(theirs)
    );
    let without_prefix = note.trim_start_matches(BLACKBOARD_PREFIX);
    assert_eq!(recorded_topology([without_prefix]), None);
    // A topology note that leaves a card out names no swarm.
    for value in [
        r#"{"root_id": "t_r", "worker_ids": [], "verifier_id": "t_v", "synthesizer_id": "t_s"}"#,
        r#"{"root_id": "t_r", "worker_ids": [""], "verifier_id": "t_v", "synthesizer_id": "t_s"}"#,
        r#"{"root_id": "", "worker_ids": ["t_w"], "verifier_id": "t_v", "synthesizer_id": "t_s"}"#,
        r#"{"root_id": "t_r", "worker_ids": ["t_w"], "verifier_id": "", "synthesizer_id": "t_s"}"#,
        r#"{"root_id": "t_r", "worker_ids": ["t_w"], "verifier_id": "t_v", "synthesizer_id": ""}"#,
        r#"{"root_id": "t_r", "worker_ids": ["t_w"], "verifier_id": "t_v"}"#,
    ] {
        let incomplete = format!(r#"{BLACKBOARD_PREFIX}{{"key": "topology", "value": {value}}}"#);
        assert_eq!(
            recorded_topology([incomplete.as_str(), seed]),
            None,
            "{value}"
        );
    }
}

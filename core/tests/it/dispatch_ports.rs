//! The plain values the dispatcher's ports carry: which cards a claim may
//! take, how ticks are counted, which board errors are the environment's.

use kanban_core::{
    BoardError, ClaimFilter, EnvironmentFault, NotLive, TICK_BUCKETS_MS, TickDurations,
};

#[test]
fn a_claim_filter_admits_every_card_or_its_assignees_only() {
    let any = ClaimFilter::any();
    assert!(any.admits(Some("a")) && any.admits(None));
    assert!(!any.admits_none());
    let only = ClaimFilter::only(["a".to_owned(), String::new()]);
    assert!(only.admits(Some("a")), "its assignee");
    assert!(only.admits(None), "\"\" stands for no assignee");
    assert!(!only.admits(Some("b")));
    assert!(!only.admits_none());
    let none = ClaimFilter::only([]);
    assert!(none.admits_none());
    assert!(!none.admits(None));
}

#[test]
fn a_tick_counts_in_the_first_bucket_whose_bound_it_does_not_pass() {
    let mut ticks = TickDurations::default();
    for ms in [0, 1, 2, 5000, 5001, 60_000] {
        ticks.observe(ms);
    }
    assert_eq!(
        ticks.buckets.len(),
        TICK_BUCKETS_MS.len() + 1,
        "one for longer ticks"
    );
    assert_eq!(ticks.buckets, [2, 1, 0, 0, 0, 0, 0, 0, 0, 1, 2]);
    assert_eq!((ticks.count, ticks.sum_ms), (6, 70_004));
}

#[test]
fn a_board_that_cannot_be_used_is_a_configuration_fault_and_a_slow_one_passes() {
    let unusable = BoardError::Unusable {
        path: "/srv/kanban.db".into(),
        message: "not a database".into(),
    };
    assert!(matches!(
        EnvironmentFault::from_board(&unusable),
        Some(EnvironmentFault::Configuration(_))
    ));
    let newer = BoardError::NewerSchema {
        path: "/srv/kanban.db".into(),
        found: 9,
        supported: 8,
    };
    assert!(matches!(
        EnvironmentFault::from_board(&newer),
        Some(EnvironmentFault::Configuration(_))
    ));
    assert!(matches!(
        EnvironmentFault::from_board(&BoardError::Busy { attempts: 3 }),
        Some(EnvironmentFault::Transient(_))
    ));
    assert_eq!(
        EnvironmentFault::from_board(&BoardError::TaskNotFound("t_1".into())),
        None,
        "the card's, not the environment's"
    );
    let lapsed = BoardError::LeaseLost {
        task_id: "t_1".into(),
        reason: NotLive::TaskLeaseExpired {
            expires: 10,
            now: 11,
        },
    };
    assert!(
        matches!(
            EnvironmentFault::blocking(&lapsed),
            EnvironmentFault::Transient(_)
        ),
        "a lease that only ran out means a slow host"
    );
    let taken = BoardError::LeaseLost {
        task_id: "t_1".into(),
        reason: NotLive::LockMismatch,
    };
    assert!(
        matches!(
            EnvironmentFault::blocking(&taken),
            EnvironmentFault::Configuration(_)
        ),
        "a claim someone else holds means a wrong setup"
    );
}

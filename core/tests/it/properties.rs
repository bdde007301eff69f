//! Property tests: the authority against a naive oracle, the loop's bounds,
//! and the exit mapping's invariants.

use kanban_core::{
    CredentialFailure, FailureReason, NotLive, RecoveryPolicy, TurnOutcome, TurnResult,
    recover_in_place, turn_exit_code,
};
use kanban_testkit::{ScriptedRunner, VirtualClock, block_on};
use proptest::prelude::*;

fn config() -> ProptestConfig {
    // CI sets PROPTEST_CASES; locally at least 2048 cases run.
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2048u32);
    ProptestConfig {
        cases: cases.max(2048),
        ..ProptestConfig::default()
    }
}

fn reason() -> impl Strategy<Value = FailureReason> {
    prop_oneof![
        proptest::sample::select(FailureReason::NAMED.to_vec()),
        "[a-z_]{0,12}".prop_map(|raw| FailureReason::parse(&raw)),
    ]
}

fn result() -> impl Strategy<Value = Option<TurnResult>> {
    let flag = proptest::option::of(any::<bool>());
    let exit_reason = proptest::option::of(prop_oneof![
        Just("max_iterations_reached(60/60)".to_owned()),
        Just("max_iterations_reached".to_owned()),
        Just("budget_exhausted".to_owned()),
        "[a-z_()/0-9]{0,20}",
    ]);
    let shape = (
        flag.clone(),
        flag.clone(),
        flag.clone(),
        proptest::option::of(reason()),
        flag.clone(),
        flag,
        exit_reason,
    )
        .prop_map(
            |(
                completed,
                failed,
                failure_retryable,
                failure_reason,
                interrupted,
                partial,
                turn_exit_reason,
            )| TurnResult {
                completed,
                failed,
                failure_retryable,
                failure_reason,
                interrupted,
                partial,
                turn_exit_reason,
                error: Some("e".into()),
                ..TurnResult::default()
            },
        );
    proptest::option::of(shape)
}

/// The seed's rules written as a plain table, with no cleverness.
fn authority_oracle(
    task: &Option<String>,
    budget: u32,
    attempt: u32,
    result: &Option<TurnResult>,
) -> bool {
    let Some(_) = task else { return false };
    if budget == 0 || attempt >= budget {
        return false;
    }
    let Some(r) = result else { return false };
    if r.interrupted == Some(true) {
        return false;
    }
    if r.turn_exit_reason
        .as_deref()
        .unwrap_or("")
        .starts_with("max_iterations_reached")
    {
        return false;
    }
    if r.failed != Some(true) || r.failure_retryable != Some(true) {
        return false;
    }
    !matches!(
        r.failure_reason.as_ref().map(FailureReason::as_str),
        Some("rate_limit" | "billing" | "upstream_rate_limit")
    )
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn authority_equals_the_oracle(
        task in proptest::option::of("[a-z_0-9 ]{0,8}"),
        budget in 0u32..=10,
        attempt in 0u32..=12,
        result in result(),
    ) {
        let env = kanban_core::Environment::new();
        let policy = RecoveryPolicy { task_id: kanban_core::resolve_task_id(task.as_deref(), &env), max_attempts: budget, delays_seconds: vec![15, 45, 90] };
        prop_assert_eq!(
            policy.should_recover(result.as_ref(), attempt),
            authority_oracle(&policy.task_id, budget, attempt, &result)
        );
    }

    #[test]
    fn the_loop_is_bounded_and_sleeps_once_per_authorised_attempt(
        budget in 0u32..=10,
        first in result(),
        script in proptest::collection::vec(result(), 1..16),
        live_for in 0usize..30,
    ) {
        let policy = RecoveryPolicy { task_id: Some("t".into()), max_attempts: budget, delays_seconds: vec![15, 45, 90] };
        let time = VirtualClock::at(0);
        let mut runner = ScriptedRunner::results(script);
        let entered = runner.entered();
        let proofs = std::sync::atomic::AtomicUsize::new(0);
        let check = || {
            let n = proofs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if n < live_for { Ok(()) } else { Err(NotLive::RunClosed) }
        };
        let mut latest: TurnOutcome = Ok(first);
        let mut turns = 1;
        let report = block_on(recover_in_place(&policy, &mut latest, 0, &mut turns, &mut runner, &check, &time, &mut |_| {}));
        prop_assert!(report.attempts <= budget);
        prop_assert_eq!(time.sleeps().len() as u32, report.attempts);
        prop_assert!(entered.len() as u32 <= report.attempts);
        prop_assert!(report.attempts as usize - entered.len() <= 1, "at most the last attempt is vetoed");
    }

    #[test]
    fn exit_mapping_invariants(result in result(), worker in any::<bool>(), rate in any::<bool>(), terminal in any::<bool>()) {
        let code = turn_exit_code(result.as_ref(), worker, CredentialFailure { rate_limited: rate, terminal });
        if result.as_ref().is_some_and(|r| r.interrupted == Some(true)) {
            prop_assert_eq!(code.code(), 130);
        }
        if code.code() == 0 {
            let r = result.as_ref().unwrap();
            prop_assert!(r.interrupted != Some(true) && r.failed != Some(true) && r.partial != Some(true) && r.completed != Some(false));
        }
        if !worker {
            prop_assert!(code.code() != 75 && code.code() != 78);
        }
    }

    #[test]
    fn any_carrier_values_give_a_claim_or_a_typed_error(
        values in proptest::collection::vec(proptest::option::of(any::<String>()), 8),
    ) {
        let mut env = kanban_core::Environment::new();
        for (name, value) in kanban_core::vars::CARRIER.iter().zip(&values) {
            if let Some(value) = value {
                env.set(*name, value.clone());
            }
        }
        match kanban_core::Claim::from_env(&env) {
            Ok(claim) => {
                prop_assert!(!claim.task_id.is_empty() && claim.task_id == claim.task_id.trim());
                prop_assert!(!claim.db.is_empty() && !claim.claim_lock.is_empty());
            }
            Err(error) => prop_assert!(error.to_string().contains("HERMES_KANBAN_")),
        }
        prop_assert!(RecoveryPolicy::from_env(&env, None).max_attempts <= 10);
    }
}

//! Enablement, budget, delays and retry authority.

use kanban_core::shapes::{self, failed, failed_timeout, failed_with};
use kanban_core::{
    DEFAULT_MAX_RECOVERY_ATTEMPTS, Environment, RECOVERY_DELAYS_SECONDS, RecoveryPolicy,
    TurnResult, build_recovery_nudge, max_recovery_attempts, recovery_delay_seconds,
    resolve_task_id, vars, worker_task_id,
};

use crate::worker_env;

fn should_recover(env: &Environment, result: Option<&TurnResult>, attempt: u32) -> bool {
    RecoveryPolicy::from_env(env, None).should_recover(result, attempt)
}

#[test]
fn test_env_zero_disables_and_blank_ids_are_not_workers() {
    let env = worker_env("t_probe").with(vars::TURN_RECOVERY, "0");
    assert!(!RecoveryPolicy::from_env(&env, None).enabled());
    assert!(!should_recover(&env, Some(&failed_timeout()), 0));

    let env = env.with(vars::TASK, "   ");
    assert_eq!(
        worker_task_id(&env),
        None,
        "whitespace-only is not a worker, anywhere"
    );
    assert!(!RecoveryPolicy::from_env(&env, None).enabled());

    let env = env
        .without(vars::TURN_RECOVERY)
        .with(vars::TASK, "  t_probe  ");
    assert_eq!(
        worker_task_id(&env).as_deref(),
        Some("t_probe"),
        "padded ids are the same worker"
    );
    assert!(RecoveryPolicy::from_env(&env, None).enabled());
}

#[test]
fn test_max_attempts_parsing_and_clamp() {
    let env = worker_env("t_probe");
    assert_eq!(max_recovery_attempts(&env), DEFAULT_MAX_RECOVERY_ATTEMPTS);
    let check = |raw: &str, expected: u32| {
        let env = worker_env("t_probe").with(vars::TURN_RECOVERY, raw);
        assert_eq!(
            max_recovery_attempts(&env),
            expected,
            "HERMES_KANBAN_TURN_RECOVERY={raw:?}"
        );
    };
    check("2", 2);
    check("99", 10);
    check("abc", DEFAULT_MAX_RECOVERY_ATTEMPTS);
    check("false", 0);
    check("", DEFAULT_MAX_RECOVERY_ATTEMPTS);
    check("   ", DEFAULT_MAX_RECOVERY_ATTEMPTS);
    check("OFF", 0);
    check("no", 0);
    check("-4", 0);
    check(" 7 ", 7);
    // Read as the seed reads them: underscores between digits, saturation.
    check("1_0", 10);
    check("1__0", DEFAULT_MAX_RECOVERY_ATTEMPTS);
    check("_1", DEFAULT_MAX_RECOVERY_ATTEMPTS);
    check("+2", 2);
    check("-99999999999999999999", 0);
    check("99999999999999999999", 10);
    check("2.5", DEFAULT_MAX_RECOVERY_ATTEMPTS);
}

#[test]
fn test_delay_schedule_repeats_last_entry() {
    assert_eq!(RECOVERY_DELAYS_SECONDS, [15, 45, 90]);
    assert_eq!(recovery_delay_seconds(1, &RECOVERY_DELAYS_SECONDS), 15);
    assert_eq!(recovery_delay_seconds(3, &RECOVERY_DELAYS_SECONDS), 90);
    assert_eq!(recovery_delay_seconds(9, &RECOVERY_DELAYS_SECONDS), 90);
    assert_eq!(recovery_delay_seconds(0, &RECOVERY_DELAYS_SECONDS), 15);
    assert_eq!(recovery_delay_seconds(-5, &RECOVERY_DELAYS_SECONDS), 15);
    // A host may pass its own schedule.
    assert_eq!(recovery_delay_seconds(2, &[1, 2]), 2);
    assert_eq!(recovery_delay_seconds(i64::MAX, &[1, 2]), 2);
}

#[test]
fn test_retryable_failed_turn_is_eligible() {
    let env = worker_env("t_probe");
    assert!(should_recover(&env, Some(&failed_timeout()), 0));
    assert!(should_recover(&env, Some(&failed_timeout()), 2), "budget 3");
    assert!(!should_recover(&env, Some(&failed_timeout()), 3));
}

/// One test per refused shape, named by the seed's parametrised id.
macro_rules! refuses {
    ($($id:ident => $result:expr,)*) => {
        mod test_should_recover_turn_refuses {
            use super::*;
            $(
                #[test]
                fn $id() {
                    let env = worker_env("t_probe");
                    let result: Option<TurnResult> = $result;
                    assert!(!should_recover(&env, result.as_ref(), 0), "{}", stringify!($id));
                }
            )*
        }
    };
}

refuses! {
    not_retryable => Some(failed(false, "auth", "peer closed connection")),
    success => Some(shapes::success()),
    nothing_settled => None,
    quota_wall => Some(failed_with("rate_limit")),
    billing_wall => Some(failed_with("billing")),
    upstream_quota_wall => Some(failed_with("upstream_rate_limit")),
    interrupt => Some(shapes::interrupted()),
    terminal_settlement => Some(shapes::settled()),
    unfinished_nonfailed => Some(shapes::partial()),
    completed_false => Some(shapes::completed_false()),
}

#[test]
fn test_explicit_blank_carrier_never_falls_back_to_the_env_pin() {
    let env = worker_env("t_foreign");
    assert!(!RecoveryPolicy::from_env(&env, Some("  ")).should_recover(Some(&failed_timeout()), 0));
    assert!(
        RecoveryPolicy::from_env(&env, Some(" t_bound "))
            .should_recover(Some(&failed_timeout()), 0)
    );
    assert_eq!(
        resolve_task_id(Some(" t_bound "), &env).as_deref(),
        Some("t_bound")
    );
    assert_eq!(resolve_task_id(None, &env).as_deref(), Some("t_foreign"));
}

#[test]
fn test_nudge_terminal_contract() {
    let nudge = build_recovery_nudge(
        Some(&failed(true, "timeout", "peer closed connection")),
        1,
        3,
        Some("t_probe"),
    );
    for needle in [
        "t_probe",
        "1/3",
        "kanban_complete",
        "kanban_block",
        "Do NOT start over",
        "peer closed connection",
    ] {
        assert!(nudge.contains(needle), "nudge lacks {needle:?}: {nudge}");
    }
}

#[test]
fn an_empty_error_falls_through_to_the_reply_as_in_the_seed() {
    let result = kanban_core::TurnResult {
        error: Some(String::new()),
        final_response: Some("the reply".into()),
        ..Default::default()
    };
    assert!(build_recovery_nudge(Some(&result), 1, 3, Some("t")).contains("Error: the reply."));
}

#[test]
fn nudge_without_an_error_names_the_stream_failure_and_truncates_long_errors() {
    let bare = build_recovery_nudge(None, 2, 3, None);
    assert!(
        bare.contains("provider stream failure")
            && bare.contains("this task")
            && bare.contains("2/3")
    );
    let long = "x".repeat(1000);
    let nudge = build_recovery_nudge(Some(&failed(true, "timeout", &long)), 1, 3, Some("t"));
    assert!(!nudge.contains(&long));
    assert!(nudge.contains(&format!("{}…", "x".repeat(299))));
}

#[test]
fn the_stop_nudge_is_on_twice_unless_switched_off() {
    use kanban_core::{is_off_value, stop_nudge_attempts};
    let nudges = |value: Option<&str>| {
        let env = match value {
            Some(value) => Environment::new().with(kanban_core::vars::STOP_NUDGE, value),
            None => Environment::new(),
        };
        stop_nudge_attempts(&env)
    };
    assert_eq!(nudges(None), 2);
    for on in ["1", "yes", "on", "", "2", "nudge"] {
        assert_eq!(nudges(Some(on)), 2, "{on:?}");
    }
    for off in ["0", "false", "no", "off", " OFF ", "False"] {
        assert_eq!(nudges(Some(off)), 0, "{off:?}");
        assert!(is_off_value(off));
    }
    assert!(!is_off_value("none"));
}

//! The exit mapping.

use kanban_core::shapes::{self, failed, failed_with};
use kanban_core::{
    CredentialFailure, Environment, ExitCode, single_query_exit_code, turn_exit_code, vars,
};

#[test]
fn test_exit_mapping_composes_with_the_stripped_worker_predicate() {
    let env = Environment::new().with(vars::TASK, "   ");
    assert_eq!(
        single_query_exit_code(Some(&failed_with("rate_limit")), &env),
        ExitCode::Failure
    );
    let env = Environment::new().with(vars::TASK, "  t_probe  ");
    assert_eq!(
        single_query_exit_code(Some(&failed_with("rate_limit")), &env),
        ExitCode::TempFail
    );
    assert_eq!(ExitCode::TempFail.code(), 75);
}

#[test]
fn exit_mapping_rows() {
    let none = CredentialFailure::default();
    // (case, result, non-worker, worker)
    let rows: Vec<(&str, Option<kanban_core::TurnResult>, i32, i32)> = vec![
        ("success", Some(shapes::success()), 0, 0),
        ("interrupted", Some(shapes::interrupted()), 130, 130),
        ("transient timeout", Some(shapes::failed_timeout()), 1, 75),
        (
            "transient overloaded",
            Some(failed_with("overloaded")),
            1,
            75,
        ),
        (
            "transient server_error",
            Some(failed_with("server_error")),
            1,
            75,
        ),
        ("billing", Some(failed(false, "billing", "quota")), 1, 75),
        (
            "upstream rate limit",
            Some(failed_with("upstream_rate_limit")),
            1,
            75,
        ),
        ("terminal auth", Some(failed(false, "auth", "401")), 1, 78),
        (
            "terminal auth_permanent",
            Some(failed(false, "auth_permanent", "401")),
            1,
            78,
        ),
        (
            "terminal model_not_found",
            Some(failed(false, "model_not_found", "404")),
            1,
            78,
        ),
        (
            "terminal ssl",
            Some(failed(false, "ssl_cert_verification", "tls")),
            1,
            78,
        ),
        (
            "terminal upstream_blocked",
            Some(failed(false, "upstream_blocked", "x")),
            1,
            78,
        ),
        (
            "other reason",
            Some(failed(true, "context_overflow", "x")),
            1,
            1,
        ),
        ("unnamed reason", Some(failed(true, "brand_new", "x")), 1, 1),
        ("partial", Some(shapes::partial()), 1, 1),
        ("completed false", Some(shapes::completed_false()), 1, 1),
        ("settlement + transient", Some(shapes::settled()), 1, 75),
        ("nothing settled", None, 1, 1),
    ];
    for (case, result, plain, worker) in rows {
        assert_eq!(
            turn_exit_code(result.as_ref(), false, none).code(),
            plain,
            "{case}: non-worker"
        );
        assert_eq!(
            turn_exit_code(result.as_ref(), true, none).code(),
            worker,
            "{case}: worker"
        );
    }
    let quota = CredentialFailure {
        rate_limited: true,
        terminal: false,
    };
    let relogin = CredentialFailure {
        rate_limited: false,
        terminal: true,
    };
    assert_eq!(turn_exit_code(None, true, quota), ExitCode::TempFail);
    assert_eq!(turn_exit_code(None, true, relogin), ExitCode::ConfigFail);
    assert_eq!(turn_exit_code(None, false, quota), ExitCode::Failure);
    assert_eq!(turn_exit_code(None, false, relogin), ExitCode::Failure);
}

#[test]
fn exit_codes_round_trip() {
    for exit in ExitCode::ALL {
        assert_eq!(ExitCode::from_code(exit.code()), Some(exit));
    }
    assert_eq!(ExitCode::from_code(2), None);
}

#[test]
fn turn_results_keep_the_seed_json_shape_and_unknown_reasons() {
    let raw = r#"{"failed": true, "failure_retryable": true, "failure_reason": "brand_new", "error": "e", "messages": [], "api_calls": 4}"#;
    let result: kanban_core::TurnResult = serde_json::from_str(raw).unwrap();
    assert_eq!(
        result.failure_reason.as_ref().unwrap().as_str(),
        "brand_new"
    );
    assert!(result.is_failed());
    let back = serde_json::to_value(&result).unwrap();
    assert_eq!(back["failure_reason"], "brand_new");
    assert_eq!(back.get("partial"), None, "unset flags are not written");
    let known: kanban_core::TurnResult =
        serde_json::from_str(r#"{"failure_reason": "rate_limit"}"#).unwrap();
    assert_eq!(
        known.failure_reason,
        Some(kanban_core::FailureReason::RateLimit)
    );
}

//! The claim carrier and every setting read from the environment: any
//! values give a typed error or a documented outcome, never a panic.
#![no_main]

use kanban_core::{Claim, Environment, ProofRequest, RecoveryPolicy, WorkerSettings, claim_ttl_seconds, shapes, single_query_exit_code, vars};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut values = text.split('\u{1f}');
    let mut env = Environment::new();
    for name in vars::CARRIER.iter().chain([&vars::CLAIM_TTL_SECONDS]) {
        if let Some(value) = values.next() {
            env.set(*name, value);
        }
    }
    if let Ok(claim) = Claim::from_env(&env) {
        assert!(!claim.task_id.trim().is_empty() && claim.task_id == claim.task_id.trim());
        assert!(!claim.claim_lock.is_empty() && !claim.db.is_empty());
    }
    let _ = ProofRequest::from_env(&env);
    let policy = RecoveryPolicy::from_env(&env, None);
    assert!(policy.max_attempts <= 10);
    let settings = WorkerSettings::from_env(&env);
    assert!(settings.stop_nudge_attempts <= 2);
    if let Ok(ttl) = claim_ttl_seconds(None, &env) {
        assert!((1..=kanban_core::MAX_CLAIM_TTL_SECONDS).contains(&ttl));
    }
    let code = single_query_exit_code(Some(&shapes::failed_with("rate_limit")), &env).code();
    assert!(code == 1 || code == 75);
});

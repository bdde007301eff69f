//! One exit code for every outcome.

use std::fmt;

use crate::data::ExitCode;
use crate::data::FailureReason;
use crate::env::Environment;
use crate::policy::worker_task_id;
use crate::turn::{TurnOutcome, TurnResult};

impl ExitCode {
    /// Every exit code, in numeric order.
    pub const ALL: [ExitCode; 5] = [
        Self::Success,
        Self::Failure,
        Self::TempFail,
        Self::ConfigFail,
        Self::Interrupted,
    ];

    /// The numeric process exit code.
    pub fn code(self) -> i32 {
        match self {
            Self::Success => 0,
            Self::Failure => 1,
            Self::TempFail => 75,
            Self::ConfigFail => 78,
            Self::Interrupted => 130,
        }
    }

    /// The exit code with this number, if it is one of ours.
    pub fn from_code(code: i32) -> Option<Self> {
        Self::ALL.into_iter().find(|exit| exit.code() == code)
    }
}

impl TryFrom<i32> for ExitCode {
    type Error = String;

    fn try_from(code: i32) -> Result<Self, String> {
        Self::from_code(code)
            .ok_or_else(|| format!("{code} is not an exit code of a kanban worker"))
    }
}

impl From<ExitCode> for i32 {
    fn from(exit: ExitCode) -> i32 {
        exit.code()
    }
}

impl fmt::Display for ExitCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.code())
    }
}

/// Failure reasons a worker books as the neutral 75: the wall passes with time.
pub const TRANSIENT_PROVIDER_REASONS: [FailureReason; 6] = [
    FailureReason::RateLimit,
    FailureReason::UpstreamRateLimit,
    FailureReason::Billing,
    FailureReason::Overloaded,
    FailureReason::ServerError,
    FailureReason::Timeout,
];

/// Failure reasons a worker books as 78: retrying will not help without a human.
pub const TERMINAL_PROVIDER_REASONS: [FailureReason; 5] = [
    FailureReason::Auth,
    FailureReason::AuthPermanent,
    FailureReason::ModelNotFound,
    FailureReason::SslCertVerification,
    FailureReason::UpstreamBlocked,
];

/// Credential failures that happened before any turn could settle.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CredentialFailure {
    /// The credential is rate- or quota-limited.
    pub rate_limited: bool,
    /// The credential needs a re-login.
    pub terminal: bool,
}

/// The exit code of a turn result.
///
/// `worker` says whether this process is a kanban worker; only workers get the
/// neutral 75 and the blocking 78, because only a dispatcher knows what to do
/// with them. `credentials` matters only when nothing settled.
pub fn turn_exit_code(
    result: Option<&TurnResult>,
    worker: bool,
    credentials: CredentialFailure,
) -> ExitCode {
    let Some(result) = result else {
        return match (worker, credentials) {
            (
                true,
                CredentialFailure {
                    rate_limited: true, ..
                },
            ) => ExitCode::TempFail,
            (true, CredentialFailure { terminal: true, .. }) => ExitCode::ConfigFail,
            _ => ExitCode::Failure,
        };
    };
    if result.is_interrupted() {
        return ExitCode::Interrupted;
    }
    if !result.is_unfinished() {
        return ExitCode::Success;
    }
    if worker && let Some(reason) = &result.failure_reason {
        if TRANSIENT_PROVIDER_REASONS.contains(reason) {
            return ExitCode::TempFail;
        }
        if TERMINAL_PROVIDER_REASONS.contains(reason) {
            return ExitCode::ConfigFail;
        }
    }
    ExitCode::Failure
}

/// [`turn_exit_code`] for a [`TurnOutcome`]: a runner error maps like
/// "nothing settled" with the error's credential flags.
pub fn outcome_exit_code(outcome: &TurnOutcome, worker: bool) -> ExitCode {
    match outcome {
        Ok(result) => turn_exit_code(result.as_ref(), worker, CredentialFailure::default()),
        Err(error) => turn_exit_code(
            None,
            worker,
            CredentialFailure {
                rate_limited: error.credentials_rate_limited,
                terminal: error.credentials_terminal,
            },
        ),
    }
}

/// The exit code of a one-shot run, asking the environment whether this
/// process is a worker through the stripped predicate: a whitespace-only
/// `HERMES_KANBAN_TASK` is not a worker, so it never earns the neutral 75.
pub fn single_query_exit_code(result: Option<&TurnResult>, env: &Environment) -> ExitCode {
    turn_exit_code(
        result,
        worker_task_id(env).is_some(),
        CredentialFailure::default(),
    )
}

//! What one agent turn is asked and what it settles to.

use serde::{Deserialize, Serialize};

use crate::data::FailureReason;

/// The settled result of one agent turn, in the seed system's JSON shape.
///
/// Every flag is optional because the policy distinguishes "said false" from
/// "did not say": `completed: false` fails the exit code, a missing
/// `completed` does not. Unknown keys (`messages`, `api_calls`, …) are ignored.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnResult {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_retryable: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_reason: Option<FailureReason>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_response: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interrupted: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partial: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_exit_reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// Seconds the provider asked us to wait (`Retry-After`), kept for the dispatcher.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_seconds: Option<u64>,
    /// Who the turn talked to: endpoint and credential (a fingerprint, never
    /// the credential), the scope of a credential wall.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// The model the turn used; with the provider, the scope of a rate wall.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

impl TurnResult {
    /// True when the turn says it failed.
    pub fn is_failed(&self) -> bool {
        self.failed == Some(true)
    }

    /// True when the turn says it was interrupted.
    pub fn is_interrupted(&self) -> bool {
        self.interrupted == Some(true)
    }

    /// True when the turn ended unfinished: failed, partial or `completed: false`.
    pub fn is_unfinished(&self) -> bool {
        self.is_failed() || self.partial == Some(true) || self.completed == Some(false)
    }

    /// The text a human would read as the turn's reply.
    pub fn reply(&self) -> &str {
        self.final_response
            .as_deref()
            .or(self.error.as_deref())
            .unwrap_or("")
    }
}

/// Why a turn could not even settle: the runner itself failed.
///
/// The credential flags let the exit mapping book a quota-limited or
/// re-login-required credential the same way as a settled provider wall.
#[derive(Clone, Debug, Default, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct TurnError {
    pub message: String,
    pub credentials_rate_limited: bool,
    pub credentials_terminal: bool,
    /// The environment failed the turn (the agent could not even be
    /// started): not the card's fault.
    pub environment: bool,
}

impl TurnError {
    /// A plain runner failure without credential flags.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            ..Self::default()
        }
    }
}

/// What a turn produced: a settled result, "nothing settled" (`Ok(None)`),
/// or a runner failure.
pub type TurnOutcome = Result<Option<TurnResult>, TurnError>;

/// Why a turn is being run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TurnKind {
    /// The first turn of a run, carrying the task prompt.
    Initial,
    /// A retry in place after a failed turn, carrying the recovery nudge.
    Recovery,
    /// A reminder that a plain reply is not a terminal board call.
    StopNudge,
    /// A goal-mode continuation or finalize nudge.
    Goal,
}

impl TurnKind {
    /// The wire name of this kind.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Initial => "initial",
            Self::Recovery => "recovery",
            Self::StopNudge => "stop_nudge",
            Self::Goal => "goal",
        }
    }
}

/// One request to the agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TurnInput {
    /// The user message of this turn.
    pub message: String,
    /// Why this turn runs.
    pub kind: TurnKind,
    /// 1-based index of this turn within the run.
    pub turn: u32,
}

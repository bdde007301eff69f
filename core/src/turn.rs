//! What one agent turn is asked and what it settles to.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Why a turn failed, as the provider-error classifier types it.
///
/// Unknown strings are kept as [`FailureReason::Other`] rather than rejected:
/// a newer agent may know reasons this build does not, and the policy treats
/// an unknown reason like any reason outside its named sets.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum FailureReason {
    Auth,
    AuthPermanent,
    Billing,
    RateLimit,
    UpstreamRateLimit,
    Overloaded,
    ServerError,
    Timeout,
    SslCertVerification,
    ContextOverflow,
    PayloadTooLarge,
    ImageTooLarge,
    ImageCorrupt,
    ModelNotFound,
    ProviderPolicyBlocked,
    ContentPolicyBlocked,
    FormatError,
    InvalidEncryptedContent,
    MultimodalToolContentUnsupported,
    ThinkingSignature,
    LongContextTier,
    OauthLongContextBetaForbidden,
    LlamaCppGrammarPattern,
    UpstreamBlocked,
    Unknown,
    /// A reason this build has no name for, kept verbatim.
    Other(String),
}

impl FailureReason {
    /// Every named reason, in the classifier's declaration order.
    pub const NAMED: [FailureReason; 25] = [
        Self::Auth,
        Self::AuthPermanent,
        Self::Billing,
        Self::RateLimit,
        Self::UpstreamRateLimit,
        Self::Overloaded,
        Self::ServerError,
        Self::Timeout,
        Self::SslCertVerification,
        Self::ContextOverflow,
        Self::PayloadTooLarge,
        Self::ImageTooLarge,
        Self::ImageCorrupt,
        Self::ModelNotFound,
        Self::ProviderPolicyBlocked,
        Self::ContentPolicyBlocked,
        Self::FormatError,
        Self::InvalidEncryptedContent,
        Self::MultimodalToolContentUnsupported,
        Self::ThinkingSignature,
        Self::LongContextTier,
        Self::OauthLongContextBetaForbidden,
        Self::LlamaCppGrammarPattern,
        Self::UpstreamBlocked,
        Self::Unknown,
    ];

    /// The wire name of this reason.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Auth => "auth",
            Self::AuthPermanent => "auth_permanent",
            Self::Billing => "billing",
            Self::RateLimit => "rate_limit",
            Self::UpstreamRateLimit => "upstream_rate_limit",
            Self::Overloaded => "overloaded",
            Self::ServerError => "server_error",
            Self::Timeout => "timeout",
            Self::SslCertVerification => "ssl_cert_verification",
            Self::ContextOverflow => "context_overflow",
            Self::PayloadTooLarge => "payload_too_large",
            Self::ImageTooLarge => "image_too_large",
            Self::ImageCorrupt => "image_corrupt",
            Self::ModelNotFound => "model_not_found",
            Self::ProviderPolicyBlocked => "provider_policy_blocked",
            Self::ContentPolicyBlocked => "content_policy_blocked",
            Self::FormatError => "format_error",
            Self::InvalidEncryptedContent => "invalid_encrypted_content",
            Self::MultimodalToolContentUnsupported => "multimodal_tool_content_unsupported",
            Self::ThinkingSignature => "thinking_signature",
            Self::LongContextTier => "long_context_tier",
            Self::OauthLongContextBetaForbidden => "oauth_long_context_beta_forbidden",
            Self::LlamaCppGrammarPattern => "llama_cpp_grammar_pattern",
            Self::UpstreamBlocked => "upstream_blocked",
            Self::Unknown => "unknown",
            Self::Other(other) => other,
        }
    }

    /// Parses a wire name; anything unnamed is kept as [`FailureReason::Other`].
    pub fn parse(raw: &str) -> Self {
        Self::NAMED
            .iter()
            .find(|named| named.as_str() == raw)
            .cloned()
            .unwrap_or_else(|| Self::Other(raw.to_owned()))
    }
}

impl From<String> for FailureReason {
    fn from(raw: String) -> Self {
        Self::parse(&raw)
    }
}

impl From<FailureReason> for String {
    fn from(reason: FailureReason) -> Self {
        reason.as_str().to_owned()
    }
}

impl fmt::Display for FailureReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

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

//! One table from a provider call's transport outcome to the failure reason
//! and retryability a turn result carries.

use crate::turn::FailureReason;

/// A provider call that failed below HTTP.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum TransportFailure {
    /// The call or a read timed out.
    Timeout,
    /// The peer reset or closed the connection before answering.
    ConnectionReset,
    /// The host could not be reached (refused, no route, name not found).
    Unreachable,
    /// A streamed answer ended before its end marker.
    StreamCut,
    /// The server's TLS certificate could not be verified.
    TlsCertificate,
    /// The answer could not be understood (not the API's JSON shape).
    MalformedBody,
    /// Anything else.
    Other,
}

/// What a provider call came back with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProviderOutcome<'a> {
    /// An HTTP status outside 2xx, with its body.
    Status {
        status: u16,
        body: &'a str,
    },
    Transport(&'a TransportFailure),
}

/// A classified failure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Classified {
    pub reason: FailureReason,
    pub retryable: bool,
}

fn says(body: &str, needles: &[&str]) -> bool {
    let lower = body.to_ascii_lowercase();
    needles.iter().any(|needle| lower.contains(needle))
}

/// Error codes and phrases of an exhausted quota or credit: a wall that no
/// wait lifts. Matched as codes, not as words of prose, so a plain rate
/// limit whose message links a billing page stays a rate limit.
const QUOTA_CODES: [&str; 6] = [
    "insufficient_quota",
    "quota_exceeded",
    "exceeded your current quota",
    "billing_hard_limit_reached",
    "credit balance is too low",
    "billing_not_active",
];
/// A 403 that names billing refuses for money, not for credentials.
const BILLING_WORDS: [&str; 2] = ["billing", "insufficient_quota"];
/// A model the endpoint does not serve, as OpenAI, LiteLLM's proxy and
/// other compatible gateways say it, whatever the status.
const MODEL_MISSING: [&str; 5] = [
    "model_not_found",
    "invalid model name",
    "model not found",
    "no such model",
    "unknown model",
];
const OVERLOAD_WORDS: [&str; 2] = ["overloaded", "overload"];
const CONTEXT_WORDS: [&str; 4] = [
    "context_length_exceeded",
    "context length",
    "maximum context",
    "too many tokens",
];

/// Classifies a failed provider call.
///
/// 429 is a rate limit (retryable, though never retried in place: the
/// dispatcher's cooldown owns it), or a billing wall when the body carries
/// a quota code; 402 is billing; 401 auth; 403 auth, or billing when the
/// body names billing; a 4xx whose body says the model does not exist (or a
/// 404 naming a model) is `model_not_found`; 408, timeouts, resets, cut
/// streams and other transport failures are `timeout`; 503/529 and overload
/// bodies `overloaded`; other 5xx `server_error`; context-length errors
/// `context_overflow`; certificate failures `ssl_cert_verification`; a
/// generic 404 is `unknown` and retryable, as in the reference; any other
/// 4xx `unknown`, not retryable.
pub fn classify_provider_failure(outcome: ProviderOutcome<'_>) -> Classified {
    use FailureReason as R;
    let classified = |reason, retryable| Classified { reason, retryable };
    match outcome {
        ProviderOutcome::Transport(failure) => match failure {
            TransportFailure::Timeout
            | TransportFailure::ConnectionReset
            | TransportFailure::StreamCut
            | TransportFailure::Unreachable => classified(R::Timeout, true),
            TransportFailure::TlsCertificate => classified(R::SslCertVerification, false),
            TransportFailure::MalformedBody => classified(R::ServerError, true),
            TransportFailure::Other => classified(R::Timeout, true),
        },
        ProviderOutcome::Status { status, body } => match status {
            429 if says(body, &QUOTA_CODES) => classified(R::Billing, false),
            429 if says(body, &OVERLOAD_WORDS) => classified(R::Overloaded, true),
            429 => classified(R::RateLimit, true),
            402 => classified(R::Billing, false),
            403 if says(body, &BILLING_WORDS) => classified(R::Billing, false),
            401 | 403 => classified(R::Auth, false),
            400..=499 if says(body, &MODEL_MISSING) => classified(R::ModelNotFound, false),
            404 if says(body, &["model"]) => classified(R::ModelNotFound, false),
            404 => classified(R::Unknown, true),
            408 => classified(R::Timeout, true),
            413 => classified(R::PayloadTooLarge, true),
            503 | 529 => classified(R::Overloaded, true),
            _ if says(body, &OVERLOAD_WORDS) => classified(R::Overloaded, true),
            400..=499 if says(body, &CONTEXT_WORDS) => classified(R::ContextOverflow, true),
            500..=599 => classified(R::ServerError, true),
            _ => classified(R::Unknown, false),
        },
    }
}

/// Seconds to wait from a `Retry-After` value (whole seconds only).
pub fn parse_retry_after(value: &str) -> Option<u64> {
    value
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(|s| s.ceil() as u64)
}

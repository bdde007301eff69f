//! One table from a provider call's transport outcome to the failure reason
//! and retryability a turn result carries.

use crate::data::FailureReason;

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

/// How long a provider asked to wait before the next call, in whole seconds
/// (rounded up), from everything it sends: `Retry-After` (seconds or an
/// HTTP date), `retry-after-ms`, `x-ratelimit-reset-requests` and
/// `-tokens` (durations such as `1s`, `6m0s`, `1h2m3.5s`),
/// `anthropic-ratelimit-*-reset` (RFC 3339 times), and "try again in 20s"
/// in an error body. The first of these that says anything wins, in that
/// order; among several reset headers the longest wait. Times in the past
/// wait 0. Header names are matched without regard to case.
pub fn provider_wait_seconds(headers: &[(&str, &str)], body: &str, now: i64) -> Option<u64> {
    fn header<'a>(
        headers: &'a [(&'a str, &'a str)],
        name: &'a str,
    ) -> impl Iterator<Item = &'a str> {
        headers
            .iter()
            .filter(move |(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.trim())
    }
    let until = |at: i64| u64::try_from(at.saturating_sub(now)).unwrap_or(0);
    if let Some(wait) = header(headers, "retry-after")
        .find_map(|value| parse_retry_after(value).or_else(|| http_date(value).map(until)))
    {
        return Some(wait);
    }
    if let Some(wait) = header(headers, "retry-after-ms").find_map(|value| {
        value
            .parse::<f64>()
            .ok()
            .filter(|ms| ms.is_finite() && *ms >= 0.0)
            .map(|ms| seconds_up(ms / 1000.0))
    }) {
        return Some(wait);
    }
    let resets = ["x-ratelimit-reset-requests", "x-ratelimit-reset-tokens"]
        .iter()
        .flat_map(|name| header(headers, name))
        .filter_map(go_duration_seconds)
        .max();
    if resets.is_some() {
        return resets;
    }
    let anthropic = headers
        .iter()
        .filter(|(key, _)| {
            let key = key.to_ascii_lowercase();
            key.starts_with("anthropic-ratelimit-") && key.ends_with("-reset")
        })
        .filter_map(|(_, value)| value.trim().parse::<jiff::Timestamp>().ok())
        .map(|at| until(at.as_second()))
        .max();
    if anthropic.is_some() {
        return anthropic;
    }
    try_again_in(body)
}

fn seconds_up(seconds: f64) -> u64 {
    // Bounded first: a day is the longest wait any provider means.
    seconds.clamp(0.0, 86_400.0).ceil() as u64
}

/// An HTTP date (`Wed, 21 Oct 2015 07:28:00 GMT`) as epoch seconds.
fn http_date(value: &str) -> Option<i64> {
    jiff::fmt::rfc2822::DateTimeParser::new()
        .parse_timestamp(value)
        .ok()
        .map(|at| at.as_second())
}

/// A Go-style duration (`1s`, `6m0s`, `1h2m3.5s`, `250ms`) in whole seconds,
/// rounded up.
fn go_duration_seconds(value: &str) -> Option<u64> {
    let mut rest = value.trim();
    if rest.is_empty() {
        return None;
    }
    let mut total = 0.0_f64;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
        let number: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let (scale, unit_len) = if rest.starts_with("ms") {
            (0.001, 2)
        } else if rest.starts_with("us") {
            (0.000_001, 2)
        } else if rest.starts_with("µs") {
            (0.000_001, "µs".len())
        } else if rest.starts_with("ns") {
            (0.000_000_001, 2)
        } else if rest.starts_with('h') {
            (3600.0, 1)
        } else if rest.starts_with('m') {
            (60.0, 1)
        } else if rest.starts_with('s') {
            (1.0, 1)
        } else {
            return None;
        };
        total += number * scale;
        rest = &rest[unit_len..];
    }
    total.is_finite().then(|| seconds_up(total))
}

/// "try again in 20s", "Please try again in 1m30s", "try again in 2.5 seconds"
/// in an error body.
fn try_again_in(body: &str) -> Option<u64> {
    let lower = body.to_ascii_lowercase();
    let at = lower.find("try again in ")? + "try again in ".len();
    let phrase: String = lower[at..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '.' || *c == ' ')
        .collect();
    let phrase = phrase.trim();
    let mut words = phrase.split(' ').map(|word| word.trim_end_matches('.'));
    let first = words.next()?;
    if let Some(value) = go_duration_seconds(first) {
        return Some(value);
    }
    // "2.5 seconds", "3 minutes"
    let number: f64 = first.parse().ok()?;
    let scale = match words.next()? {
        unit if unit.starts_with("sec") => 1.0,
        unit if unit.starts_with("min") => 60.0,
        unit if unit.starts_with("hour") => 3600.0,
        unit if unit.starts_with("millisecond") || unit == "ms" => 0.001,
        _ => return None,
    };
    number.is_finite().then(|| seconds_up(number * scale))
}

//! An agent that speaks the OpenAI-compatible chat-completions API, keeps the
//! run's conversation across turns, and offers the board as function tools.

use std::io::{BufRead, BufReader, Read};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use kanban_core::{
    Classified, Environment, ProviderOutcome, TransportFailure, TurnInput, TurnOutcome, TurnResult,
    TurnRunner, classify_provider_failure, provider_wait_seconds,
};
use serde_json::{Value, json};

use crate::activity::Activity;
use crate::exec::TaskBrief;
use crate::tools::{BoardTools, board_tool_specs};

/// How to reach the model. `Debug` never shows the key.
#[derive(Clone, PartialEq, Eq)]
pub struct HttpAgentConfig {
    /// The API root, such as `http://127.0.0.1:8080/v1`; requests go to `BASE/chat/completions`.
    pub base_url: String,
    pub model: String,
    pub api_key: Option<String>,
    /// Ask for a streamed answer (server-sent events).
    pub stream: bool,
    /// Model calls per turn before the turn settles as out of budget.
    pub max_iterations: u32,
    /// Extra attempts for a retryable failed call, within one turn.
    pub provider_retries: u32,
    /// The backoff before provider retry N is N times this.
    pub retry_delay: Duration,
    /// The limit of one call, answer included.
    pub timeout: Duration,
}

impl HttpAgentConfig {
    /// Who this agent talks to, as a wall's scope names it: the endpoint and
    /// a fingerprint of the key (the first 12 hex digits of its SHA-256;
    /// never the key itself).
    pub fn provider_id(&self) -> String {
        use sha2::Digest;
        match &self.api_key {
            Some(key) => {
                let digest = sha2::Sha256::digest(key.as_bytes());
                let hex: String = digest
                    .iter()
                    .take(6)
                    .map(|byte| format!("{byte:02x}"))
                    .collect();
                format!("{} key:{hex}", self.base_url)
            }
            None => self.base_url.clone(),
        }
    }
}

impl std::fmt::Debug for HttpAgentConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpAgentConfig")
            .field("base_url", &self.base_url)
            .field("model", &self.model)
            .field("api_key", &self.api_key.as_ref().map(|_| "[redacted]"))
            .field("stream", &self.stream)
            .field("max_iterations", &self.max_iterations)
            .field("provider_retries", &self.provider_retries)
            .field("retry_delay", &self.retry_delay)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// Whether a URL goes to this machine: `localhost`, `127.x.y.z` or `[::1]`.
fn is_loopback(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host_port = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    let host = if let Some(bracketed) = host_port.strip_prefix('[') {
        bracketed.split(']').next().unwrap_or("")
    } else {
        host_port.split(':').next().unwrap_or("")
    };
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// `text` with every occurrence of `key` replaced, so that a provider that
/// echoes the key in an error body cannot carry it to the board or the logs.
pub(crate) fn redact(text: &str, key: Option<&str>) -> String {
    match key.filter(|key| key.len() >= 4) {
        Some(key) => text.replace(key, "[redacted]"),
        None => text.to_owned(),
    }
}

impl HttpAgentConfig {
    /// Parses `http:URL[?model=M&key_env=VAR&stream=1&retries=N&max_iterations=N&timeout=S&retry_delay_ms=N]`.
    ///
    /// The key is read from the variable `key_env` names (an error when it
    /// is named but unset), else from `OPENAI_API_KEY` when set, but only for
    /// an `https://` or loopback URL: the ambient key is never sent in clear
    /// text across a network. A local server needs none.
    pub fn parse(spec: &str, env: &Environment) -> Result<Self, String> {
        let rest = spec
            .strip_prefix("http:")
            .ok_or_else(|| format!("{spec:?} is not an http agent: it must start with http:"))?;
        let (url, query) = rest.split_once('?').unwrap_or((rest, ""));
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(format!(
                "the agent URL {url:?} must start with http:// or https://, for example http:http://127.0.0.1:8080/v1?model=llama3"
            ));
        }
        let mut config = Self {
            base_url: url.trim_end_matches('/').to_owned(),
            model: String::new(),
            api_key: (url.starts_with("https://") || is_loopback(url))
                .then(|| env.get_trimmed("OPENAI_API_KEY").map(str::to_owned))
                .flatten(),
            stream: false,
            max_iterations: 20,
            provider_retries: 2,
            retry_delay: Duration::from_millis(500),
            timeout: Duration::from_secs(120),
        };
        let number = |key: &str, value: &str| {
            value
                .parse::<u64>()
                .map_err(|_| format!("{key}={value:?} in the agent spec is not a whole number"))
        };
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match key {
                "model" => config.model = value.to_owned(),
                "key_env" if env.is_unreadable(value) => {
                    return Err(format!(
                        "the agent's API key variable {value} is not valid UTF-8: set it to the key's text"
                    ));
                }
                "key_env" => {
                    config.api_key = Some(env.get_trimmed(value).map(str::to_owned).ok_or_else(|| {
                        format!("the agent's API key variable {value} is not set: export {value}=... or drop key_env for a server without keys")
                    })?)
                }
                "stream" => config.stream = matches!(value, "1" | "true" | "yes" | "on"),
                "retries" => config.provider_retries = number(key, value)? as u32,
                "max_iterations" => config.max_iterations = (number(key, value)? as u32).max(1),
                "timeout" => config.timeout = Duration::from_secs(number(key, value)?.max(1)),
                "retry_delay_ms" => config.retry_delay = Duration::from_millis(number(key, value)?),
                other => return Err(format!("unknown agent option {other:?}: use model, key_env, stream, retries, max_iterations, timeout or retry_delay_ms")),
            }
        }
        if config.model.is_empty() {
            return Err(
                "the http agent needs a model: add ?model=NAME to the agent spec".to_owned(),
            );
        }
        Ok(config)
    }
}

/// A failed call, classified, with what the provider said.
#[derive(Debug)]
struct CallFailure {
    classified: Classified,
    detail: String,
    retry_after: Option<u64>,
}

impl CallFailure {
    fn transport(failure: TransportFailure, detail: String) -> Self {
        Self {
            classified: classify_provider_failure(ProviderOutcome::Transport(&failure)),
            detail,
            retry_after: None,
        }
    }
}

/// One model answer.
#[derive(Debug, Default)]
struct Answer {
    content: String,
    /// `(id, name, arguments)` of each tool call.
    tool_calls: Vec<(String, String, String)>,
}

fn transport_failure(error: &ureq::Error) -> TransportFailure {
    match error {
        ureq::Error::Timeout(_) => TransportFailure::Timeout,
        ureq::Error::HostNotFound | ureq::Error::ConnectionFailed => TransportFailure::Unreachable,
        ureq::Error::Tls(_) | ureq::Error::Rustls(_) => TransportFailure::TlsCertificate,
        ureq::Error::Io(io) => match io.kind() {
            std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => {
                TransportFailure::Timeout
            }
            std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::NotFound
            | std::io::ErrorKind::HostUnreachable
            | std::io::ErrorKind::NetworkUnreachable => TransportFailure::Unreachable,
            _ => TransportFailure::ConnectionReset,
        },
        ureq::Error::Protocol(_) => TransportFailure::ConnectionReset,
        _ => TransportFailure::Other,
    }
}

fn parse_message(body: &str) -> Result<Answer, CallFailure> {
    let malformed = |why: &str| {
        CallFailure::transport(
            TransportFailure::MalformedBody,
            format!(
                "the provider's answer is not a chat completion ({why}): {}",
                body.chars().take(200).collect::<String>()
            ),
        )
    };
    let value: Value = serde_json::from_str(body).map_err(|e| malformed(&e.to_string()))?;
    let message = value
        .pointer("/choices/0/message")
        .ok_or_else(|| malformed("no choices[0].message"))?;
    let mut answer = Answer {
        content: message["content"].as_str().unwrap_or("").to_owned(),
        tool_calls: Vec::new(),
    };
    if let Some(calls) = message["tool_calls"].as_array() {
        for call in calls {
            let name = call
                .pointer("/function/name")
                .and_then(Value::as_str)
                .ok_or_else(|| malformed("a tool call without a function name"))?;
            let arguments = match call.pointer("/function/arguments") {
                Some(Value::String(text)) => text.clone(),
                Some(other) => other.to_string(),
                None => String::new(),
            };
            answer.tool_calls.push((
                call["id"].as_str().unwrap_or("call").to_owned(),
                name.to_owned(),
                arguments,
            ));
        }
    }
    Ok(answer)
}

/// Tool calls one streamed answer may carry.
const MAX_STREAMED_TOOL_CALLS: u64 = 128;

/// Reads a server-sent-events answer; an end without `[DONE]` is a cut stream.
fn parse_stream(reader: impl Read) -> Result<Answer, CallFailure> {
    let mut answer = Answer::default();
    let mut calls: Vec<(String, String, String)> = Vec::new();
    for line in BufReader::new(reader).lines() {
        let line = line.map_err(|error| {
            let failure = if error.kind() == std::io::ErrorKind::TimedOut {
                TransportFailure::Timeout
            } else {
                TransportFailure::StreamCut
            };
            CallFailure::transport(failure, format!("the answer stream broke: {error}"))
        })?;
        let Some(data) = line.trim().strip_prefix("data:").map(str::trim) else {
            continue;
        };
        if data == "[DONE]" {
            answer.tool_calls = calls;
            return Ok(answer);
        }
        let chunk: Value = serde_json::from_str(data).map_err(|e| {
            CallFailure::transport(
                TransportFailure::MalformedBody,
                format!(
                    "a stream chunk is not JSON ({e}): {}",
                    data.chars().take(200).collect::<String>()
                ),
            )
        })?;
        let delta = &chunk["choices"][0]["delta"];
        if let Some(text) = delta["content"].as_str() {
            answer.content.push_str(text);
        }
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            // The index comes from the provider: bound it before it sizes anything.
            let index = call["index"].as_u64().unwrap_or(0);
            if index >= MAX_STREAMED_TOOL_CALLS {
                return Err(CallFailure::transport(
                    TransportFailure::MalformedBody,
                    format!(
                        "a stream chunk names tool call {index}; at most {MAX_STREAMED_TOOL_CALLS} are accepted"
                    ),
                ));
            }
            let index = index as usize;
            if calls.len() <= index {
                calls.resize(index + 1, (String::new(), String::new(), String::new()));
            }
            let slot = &mut calls[index];
            if let Some(id) = call["id"].as_str() {
                slot.0 = id.to_owned();
            }
            if let Some(name) = call.pointer("/function/name").and_then(Value::as_str) {
                slot.1.push_str(name);
            }
            if let Some(arguments) = call.pointer("/function/arguments").and_then(Value::as_str) {
                slot.2.push_str(arguments);
            }
        }
    }
    Err(CallFailure::transport(
        TransportFailure::StreamCut,
        "the answer stream ended before [DONE]".to_owned(),
    ))
}

/// A parsed answer as callers outside this module see it: the reply text
/// and the tool calls `(name, arguments)`, or a readable error.
type PublicAnswer = Result<(String, Vec<(String, String)>), String>;

fn public(parsed: Result<Answer, CallFailure>) -> PublicAnswer {
    parsed
        .map(|answer| {
            (
                answer.content,
                answer
                    .tool_calls
                    .into_iter()
                    .map(|(_, name, arguments)| (name, arguments))
                    .collect(),
            )
        })
        .map_err(|failure| failure.detail)
}

/// Parses a whole chat-completion body.
pub fn parse_chat_completion(body: &str) -> PublicAnswer {
    public(parse_message(body))
}

/// Parses a streamed (server-sent events) chat completion.
pub fn parse_chat_stream(bytes: &[u8]) -> PublicAnswer {
    public(parse_stream(bytes))
}

/// The chat-completions agent. One per run: its conversation is the run's
/// session, so a recovery turn continues the same history.
pub struct HttpAgent {
    config: HttpAgentConfig,
    http: ureq::Agent,
    messages: Vec<Value>,
    tools: Option<BoardTools>,
    session_id: String,
    activity: Arc<Activity>,
    /// `kanban-TASK-RUN` for a worker's agent: with the turn and the call it
    /// makes each call's `Idempotency-Key`, the same on every retry of it.
    key_prefix: Option<String>,
    /// The key of the call in flight.
    idempotency_key: Option<String>,
}

impl std::fmt::Debug for HttpAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpAgent")
            .field("config", &self.config)
            .field("messages", &self.messages.len())
            .finish_non_exhaustive()
    }
}

impl HttpAgent {
    /// An agent for `task`, with the board tools when it works a claimed card.
    pub fn new(
        config: HttpAgentConfig,
        task: Option<&TaskBrief>,
        tools: Option<BoardTools>,
        session_id: String,
        activity: Arc<Activity>,
    ) -> Self {
        let http = ureq::Agent::new_with_config(
            ureq::config::Config::builder()
                .http_status_as_error(false)
                .timeout_global(Some(config.timeout))
                .build(),
        );
        let mut messages = Vec::new();
        if let Some(task) = task {
            let mut body = if task.body.trim().is_empty() {
                String::new()
            } else {
                format!("\n\n{}", task.body)
            };
            if !task.comments.is_empty() {
                body.push_str(
                    "\n\nComments on the card, newest last (people steer your work here):",
                );
                for comment in &task.comments {
                    body.push_str(&format!("\n- {}: {}", comment.author, comment.body));
                }
            }
            messages.push(json!({
                "role": "system",
                "content": format!(
                    "You are a worker on a kanban board, working card {}: {}{body}\n\nUse the tools to report on the card. \
                     A plain reply does not finish the card: end with kanban_complete when the work is done, or kanban_block \
                     when you cannot go on.",
                    task.id, task.title
                ),
            }));
        }
        let key_prefix = task.and_then(|task| {
            task.fence_token
                .map(|run| format!("kanban-{}-{run}", task.id))
        });
        Self {
            config,
            http,
            messages,
            tools,
            session_id,
            activity,
            key_prefix,
            idempotency_key: None,
        }
    }

    /// One question outside any card's run (the specifier, the decomposer):
    /// a system and a user message, the model's text answer, through the
    /// same retries as a turn's calls. Tools are neither offered nor run.
    pub fn ask(&mut self, system: &str, user: &str) -> Result<String, String> {
        self.messages = vec![
            json!({"role": "system", "content": system}),
            json!({"role": "user", "content": user}),
        ];
        let answer = self.call().map_err(|failure| failure.detail)?;
        self.messages
            .push(json!({"role": "assistant", "content": answer.content}));
        Ok(answer.content)
    }

    /// The conversation so far.
    pub fn messages(&self) -> &[Value] {
        &self.messages
    }

    fn request_body(&self) -> Value {
        let mut body = json!({"model": self.config.model, "messages": self.messages, "stream": self.config.stream});
        if self.tools.is_some() {
            let tools: Vec<Value> = board_tool_specs(true)
                .into_iter()
                .map(|spec| json!({"type": "function", "function": {"name": spec.name, "description": spec.description, "parameters": spec.schema}}))
                .collect();
            body["tools"] = Value::Array(tools);
        }
        body
    }

    /// One model call; whatever it reports has the key redacted.
    fn call_once(&self) -> Result<Answer, CallFailure> {
        self.call_once_unredacted().map_err(|mut failure| {
            failure.detail = redact(&failure.detail, self.config.api_key.as_deref());
            failure
        })
    }

    fn call_once_unredacted(&self) -> Result<Answer, CallFailure> {
        let url = format!("{}/chat/completions", self.config.base_url);
        let mut request = self
            .http
            .post(&url)
            .header("Content-Type", "application/json");
        if let Some(key) = &self.config.api_key {
            request = request.header("Authorization", &format!("Bearer {key}"));
        }
        if let Some(key) = &self.idempotency_key {
            request = request.header("Idempotency-Key", key);
        }
        let mut response = request
            .send(self.request_body().to_string())
            .map_err(|error| {
                CallFailure::transport(
                    transport_failure(&error),
                    format!("POST {url} failed: {error}"),
                )
            })?;
        let status = response.status().as_u16();
        let headers: Vec<(String, String)> = response
            .headers()
            .iter()
            .filter_map(|(name, value)| {
                Some((name.as_str().to_owned(), value.to_str().ok()?.to_owned()))
            })
            .collect();
        if !(200..300).contains(&status) {
            let body = response
                .body_mut()
                .with_config()
                .limit(64 * 1024)
                .read_to_string()
                .unwrap_or_default();
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |since| {
                    i64::try_from(since.as_secs()).unwrap_or(i64::MAX)
                });
            let pairs: Vec<(&str, &str)> = headers
                .iter()
                .map(|(name, value)| (name.as_str(), value.as_str()))
                .collect();
            let retry_after = provider_wait_seconds(&pairs, &body, now);
            return Err(CallFailure {
                classified: classify_provider_failure(ProviderOutcome::Status {
                    status,
                    body: &body,
                }),
                // Redacted before it is cut, so no prefix of the key survives.
                detail: format!(
                    "HTTP {status}: {}",
                    redact(&body, self.config.api_key.as_deref())
                        .chars()
                        .take(300)
                        .collect::<String>()
                ),
                retry_after,
            });
        }
        // A server that ignores `stream: true` and answers with one JSON
        // body is read as that body.
        let json_answer = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|kind| kind.to_ascii_lowercase().starts_with("application/json"));
        if self.config.stream && !json_answer {
            return parse_stream(response.into_body().into_reader());
        }
        let body = response
            .body_mut()
            .with_config()
            .limit(16 * 1024 * 1024)
            .read_to_string()
            .map_err(|error| {
                CallFailure::transport(
                    transport_failure(&error),
                    format!("reading the answer failed: {error}"),
                )
            })?;
        parse_message(&body)
    }

    /// One model call with the provider-retry layer under it.
    fn call(&self) -> Result<Answer, CallFailure> {
        let attempts = self.config.provider_retries + 1;
        let mut attempt = 1;
        loop {
            match self.call_once() {
                Ok(answer) => return Ok(answer),
                Err(failure)
                    if failure.classified.retryable
                        && attempt < attempts
                        && self.activity.stop_reason().is_none() =>
                {
                    tracing::info!(target: "kanban::agent", "provider call failed ({}), retry {attempt}/{}", failure.detail, attempts - 1);
                    std::thread::sleep(self.config.retry_delay * attempt);
                    attempt += 1;
                }
                Err(mut failure) => {
                    failure.detail = format!(
                        "API call failed after {attempt} attempt(s): {}",
                        failure.detail
                    );
                    return Err(failure);
                }
            }
        }
    }

    fn settle(&self, result: TurnResult) -> TurnOutcome {
        Ok(Some(TurnResult {
            session_id: Some(self.session_id.clone()),
            provider: Some(self.config.provider_id()),
            model: Some(self.config.model.clone()),
            ..result
        }))
    }

    /// Runs the model's tool calls and adds their answers to the history.
    async fn run_tools(&mut self, calls: &[(String, String, String)]) {
        for (id, name, arguments) in calls {
            let outcome = match &self.tools {
                Some(tools) => tools.call(name, arguments).await,
                None => crate::tools::ToolOutcome {
                    text: "no board tools outside a claimed card".into(),
                    is_error: true,
                    terminal: false,
                },
            };
            let content = if outcome.is_error {
                json!({"error": outcome.text}).to_string()
            } else {
                outcome.text
            };
            self.messages.push(
                json!({"role": "tool", "tool_call_id": id, "name": name, "content": content}),
            );
        }
    }

    async fn turn(&mut self, input: &TurnInput) -> TurnOutcome {
        self.messages
            .push(json!({"role": "user", "content": input.message}));
        let limit = self.config.max_iterations;
        for iteration in 1..=limit {
            self.idempotency_key = self
                .key_prefix
                .as_ref()
                .map(|prefix| format!("{prefix}-{}-{iteration}", input.turn));
            if self.activity.stop_reason().is_some() {
                return self.settle(TurnResult {
                    interrupted: Some(true),
                    completed: Some(false),
                    final_response: Some("the turn was interrupted".into()),
                    ..TurnResult::default()
                });
            }
            let answer = match self.call() {
                Ok(answer) => {
                    self.activity.touch();
                    answer
                }
                Err(failure) => {
                    return self.settle(TurnResult {
                        failed: Some(true),
                        completed: Some(false),
                        failure_retryable: Some(failure.classified.retryable),
                        failure_reason: Some(failure.classified.reason),
                        error: Some(failure.detail.clone()),
                        final_response: Some(failure.detail),
                        retry_after_seconds: failure.retry_after,
                        ..TurnResult::default()
                    });
                }
            };
            let mut message = json!({"role": "assistant", "content": answer.content});
            if !answer.tool_calls.is_empty() {
                message["tool_calls"] = answer
                    .tool_calls
                    .iter()
                    .map(|(id, name, arguments)| json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}))
                    .collect();
            }
            self.messages.push(message);
            if answer.tool_calls.is_empty() {
                return self.settle(TurnResult {
                    completed: Some(true),
                    final_response: Some(answer.content),
                    ..TurnResult::default()
                });
            }
            self.run_tools(&answer.tool_calls).await;
            tracing::debug!(target: "kanban::agent", "model iteration {iteration}/{limit} made {} tool call(s)", answer.tool_calls.len());
        }
        // Out of budget: a terminal settlement, never retried in place.
        let detail = format!(
            "the model made {limit} calls in this turn without finishing (iteration limit)"
        );
        self.settle(TurnResult {
            failed: Some(true),
            completed: Some(false),
            failure_retryable: Some(true),
            failure_reason: Some(kanban_core::FailureReason::Timeout),
            turn_exit_reason: Some(format!("max_iterations_reached({limit}/{limit})")),
            error: Some(detail.clone()),
            final_response: Some(detail),
            ..TurnResult::default()
        })
    }
}

#[async_trait]
impl TurnRunner for HttpAgent {
    async fn run_turn(&mut self, input: &TurnInput) -> TurnOutcome {
        self.activity.set_turn_active(true);
        let outcome = self.turn(input).await;
        self.activity.set_turn_active(false);
        outcome
    }
}

//! The plain data every part of core passes around: a claim and its
//! proof's verdict, a card's status, a worker's result, the board's errors.
//! A leaf: it imports nothing of core, so the modules that use these types
//! (the ports, the rules, the worker, the dispatcher) need not import one
//! another for them.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The exact authority a worker was spawned with: which task, on which board
/// file, under which run and claim lock.
///
/// `(run_id, claim_lock)` is the fencing token: run ids only grow, so a stale
/// worker's token can never match a newer claim.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Claim {
    pub task_id: String,
    /// The board file the claim lives on (`HERMES_KANBAN_DB`).
    pub db: String,
    pub run_id: i64,
    pub claim_lock: String,
    /// The board slug, when one was named.
    pub board: Option<String>,
}

/// Whose process the proof must name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum ProofIdentity {
    /// No process check: any process holding the token may act.
    AnyProcess,
    /// The recorded worker pid, where one is recorded, must be this pid.
    Process(u32),
    /// Owner-side: the recorded pid is not checked; instead the newest
    /// `worker_bound` event must name this pid and the claim lock.
    BoundOwner(u32),
}

/// Why a worker does not hold a live claim. Each has a stable reason code.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum NotLive {
    NoTaskId,
    NoBoard,
    BoardNotFound(String),
    NoRunId,
    NoClaimLock,
    TaskNotFound,
    NotRunning(String),
    PidMismatch { recorded: i64 },
    NoRunPointer,
    RunMoved { current: i64 },
    LockMismatch,
    TaskLeaseMissing,
    TaskLeaseExpired { expires: i64, now: i64 },
    RunNotFound,
    RunClosed,
    RunPidMismatch { recorded: i64 },
    RunLeaseMissing,
    RunLeaseExpired { expires: i64, now: i64 },
    NotBound,
    Unreadable(String),
}

impl NotLive {
    /// True when the claim is still the card's (same run, same lock, card
    /// running) and only its lease ran out: nobody took the card, and the
    /// dispatcher extends a live worker's lease.
    pub fn only_expired(&self) -> bool {
        matches!(
            self,
            Self::TaskLeaseExpired { .. }
                | Self::RunLeaseExpired { .. }
                | Self::TaskLeaseMissing
                | Self::RunLeaseMissing
        )
    }

    /// The stable reason code, for scripts and `--json` output.
    pub fn code(&self) -> &'static str {
        match self {
            Self::NoTaskId => "no_task_id",
            Self::NoBoard => "no_board_pin",
            Self::BoardNotFound(_) => "board_not_found",
            Self::NoRunId => "no_run_id",
            Self::NoClaimLock => "no_claim_lock",
            Self::TaskNotFound => "task_not_found",
            Self::NotRunning(_) => "not_running",
            Self::PidMismatch { .. } => "pid_mismatch",
            Self::NoRunPointer => "no_run_pointer",
            Self::RunMoved { .. } => "run_moved",
            Self::LockMismatch => "claim_lock_mismatch",
            Self::TaskLeaseMissing => "task_lease_missing",
            Self::TaskLeaseExpired { .. } => "task_lease_expired",
            Self::RunNotFound => "run_not_found",
            Self::RunClosed => "run_closed",
            Self::RunPidMismatch { .. } => "run_pid_mismatch",
            Self::RunLeaseMissing => "run_lease_missing",
            Self::RunLeaseExpired { .. } => "run_lease_expired",
            Self::NotBound => "not_bound",
            Self::Unreadable(_) => "board_unreadable",
        }
    }
}

impl fmt::Display for NotLive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoTaskId => f.write_str("no task id: this is not a worker"),
            Self::NoBoard => f.write_str("no pinned board file (HERMES_KANBAN_DB)"),
            Self::BoardNotFound(path) => write!(f, "board file {path} does not exist"),
            Self::NoRunId => f.write_str("no pinned run id (HERMES_KANBAN_RUN_ID)"),
            Self::NoClaimLock => f.write_str("no pinned claim lock (HERMES_KANBAN_CLAIM_LOCK)"),
            Self::TaskNotFound => f.write_str("the task is not on the board"),
            Self::NotRunning(status) => write!(f, "the task is {status}, not running"),
            Self::PidMismatch { recorded } => write!(f, "the task names worker pid {recorded}"),
            Self::NoRunPointer => f.write_str("the task has no current run"),
            Self::RunMoved { current } => write!(f, "the task moved on to run {current}"),
            Self::LockMismatch => f.write_str("the claim lock is no longer ours"),
            Self::TaskLeaseMissing => f.write_str("the task lease has no expiry"),
            Self::TaskLeaseExpired { expires, now } => {
                write!(f, "the task lease expired at {expires} (now {now})")
            }
            Self::RunNotFound => f.write_str("the run is not on the board"),
            Self::RunClosed => f.write_str("the run is already closed"),
            Self::RunPidMismatch { recorded } => write!(f, "the run names worker pid {recorded}"),
            Self::RunLeaseMissing => f.write_str("the run lease has no expiry"),
            Self::RunLeaseExpired { expires, now } => {
                write!(f, "the run lease expired at {expires} (now {now})")
            }
            Self::NotBound => f.write_str("the newest worker_bound event names another process"),
            Self::Unreadable(error) => write!(f, "the board could not be read: {error}"),
        }
    }
}

/// Errors of board operations, owned by core so policy can match on them.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum BoardError {
    /// The caller's claim is no longer live; nothing was changed.
    #[error(
        "task {task_id}: this worker no longer holds the claim ({reason}); nothing was changed"
    )]
    LeaseLost { task_id: String, reason: NotLive },
    #[error("task {0} is not on this board")]
    TaskNotFound(String),
    #[error("task {task_id} is {status}; cannot {action} it")]
    InvalidTransition {
        task_id: String,
        status: String,
        action: std::borrow::Cow<'static, str>,
    },
    #[error(
        "task {task_id} has the status {status:?}, which this build of kanban does not know; it is left as it is (a newer kanban, or the system that set it, can change it)"
    )]
    UnknownStatus { task_id: String, status: String },
    #[error("invalid input: {0}")]
    InvalidInput(String),
    #[error("the board stayed busy after {attempts} attempts; try again")]
    Busy { attempts: u32 },
    #[error(
        "{path}: board schema version {found} is newer than this build supports ({supported}); upgrade kanban"
    )]
    NewerSchema {
        path: String,
        found: i64,
        supported: i64,
    },
    #[error("{path}: {message}")]
    Unusable { path: String, message: String },
    #[error("{path}: cannot grow: the disk is full; free some space and retry")]
    DiskFull { path: String },
    #[error("board storage error: {0}")]
    Storage(String),
}

/// Where a worker's run stands, as the goal loop and the stop nudge see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum RunStatus {
    /// The run is open and the task is running under it.
    Running,
    /// The run ended with the task completed.
    Done,
    /// The run ended with the task blocked.
    Blocked,
    /// The run ended some other way, or the task moved on to another run.
    Superseded,
}

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

/// What the worker books when it ends (event `worker_result`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerResult {
    pub pid: u32,
    pub claim_lock: String,
    pub exit_code: ExitCode,
    pub last_output: String,
    /// Model entries the run made.
    #[serde(default)]
    pub turns: u32,
    /// In-place recovery attempts the run authorised.
    #[serde(default)]
    pub recovery_attempts: u32,
    /// How long the provider asked to wait (`Retry-After`) on the run's last turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_seconds: Option<u64>,
    /// Why the run's last turn failed, as the agent typed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_reason: Option<FailureReason>,
    /// Who the run's last turn talked to (endpoint and credential, never the
    /// credential itself), as the agent reported it: a wall's scope.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// The model of the run's last turn, as the agent reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

/// An event to append.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewEvent {
    pub kind: String,
    pub run_id: Option<i64>,
    /// `Value::Null` is stored as no payload.
    pub payload: Value,
}

impl NewEvent {
    /// An event of `kind` about `run_id`.
    pub fn new(kind: &str, run_id: Option<i64>, payload: Value) -> Self {
        Self {
            kind: kind.to_owned(),
            run_id,
            payload,
        }
    }
}

/// A dispatcher's knobs for failed runs: they travel with every booking and
/// release (and to its workers), so every board applies the same ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct FailurePolicy {
    /// Counted failures that block a card naming no `max_retries` of its own.
    pub failure_limit: u32,
    /// Seconds a rate-limited card (exit 75) waits before its next claim.
    pub rate_limit_cooldown: i64,
    /// The first wait after a counted failure; it doubles per failure in a
    /// row (see [`crate::rules::retry_backoff_seconds`]). 0 turns the backoff off.
    pub backoff_base_seconds: i64,
    /// The longest a provider wall (or a card's `Retry-After`) holds its
    /// cards before a probe goes through.
    pub max_wall_seconds: i64,
}

/// Why a claim is released without its worker's exit being booked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Release {
    /// The lease ran out and its worker is gone. Counted, as the reference
    /// counts a stale release: a card whose workers keep wedging is blocked
    /// at its limit instead of cycling forever.
    Expired,
    /// The claim's worker never ran its card: the environment failed to
    /// start it, or its dispatcher died before spawning it. Not counted: a
    /// card is charged only for what its own run did.
    NotStarted { reason: String },
}

/// What releasing a claim came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Released {
    /// The card no longer holds the claim, or its lease is live again:
    /// nothing changed.
    NotHeld,
    /// Released, no failure counted against the card.
    Uncounted,
    /// Released, and a failure counted against the card.
    Counted,
}

/// Why a worker settled its own run as timed out.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Overrun {
    /// The agent's tool loop reached its iteration limit.
    IterationLimit(String),
    /// One turn outlived its deadline.
    TurnDeadline { seconds: u64 },
    /// The run outlived its time limit.
    RunLimit { seconds: u64 },
}

impl Overrun {
    pub(crate) fn error(&self) -> String {
        match self {
            Self::IterationLimit(detail) => {
                format!(
                    "iteration budget exhausted ({detail}): the task could not complete within the allowed iterations"
                )
            }
            Self::TurnDeadline { seconds } => {
                format!("a turn ran past its {seconds} s deadline and its agent was stopped")
            }
            Self::RunLimit { seconds } => {
                format!("the run ran past its {seconds} s limit and its agent was stopped")
            }
        }
    }
}

/// The lanes a card moves through, in the seed system's order.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum TaskStatus {
    /// Waits for a person (or a specifier) to shape it; never claimed.
    Triage,
    /// Waits for its parents.
    Todo,
    /// Parked: waits for a time (`not_before`), for an operator's release
    /// (`held`), or for an unblock; never claimed, by either system.
    Scheduled,
    Ready,
    Running,
    Blocked,
    /// Its work waits for a reviewer: claimed like a ready card, parents
    /// not checked again.
    Review,
    Done,
    Archived,
}

impl TaskStatus {
    /// Every status.
    pub const ALL: [TaskStatus; 9] = [
        Self::Triage,
        Self::Todo,
        Self::Scheduled,
        Self::Ready,
        Self::Running,
        Self::Blocked,
        Self::Review,
        Self::Done,
        Self::Archived,
    ];

    /// The name stored on the board.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Triage => "triage",
            Self::Todo => "todo",
            Self::Scheduled => "scheduled",
            Self::Ready => "ready",
            Self::Running => "running",
            Self::Blocked => "blocked",
            Self::Review => "review",
            Self::Done => "done",
            Self::Archived => "archived",
        }
    }

    /// Parses a stored name.
    pub fn parse(raw: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|status| status.as_str() == raw)
    }
}

/// Why a worker blocks its card, in the seed system's words: each kind is
/// routed its own way ([`crate::rules::block`]).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum BlockKind {
    /// It waits for another card: back to `todo`, promoted once its
    /// parents are done; no person needed.
    Dependency,
    /// It needs a person's answer or decision.
    NeedsInput,
    /// It met a wall no agent can pass (access, credentials, an action
    /// only a person can take).
    Capability,
    /// A failure that may clear by itself.
    Transient,
}

impl BlockKind {
    /// Every kind.
    pub const ALL: [BlockKind; 4] = [
        Self::Dependency,
        Self::NeedsInput,
        Self::Capability,
        Self::Transient,
    ];

    /// The name stored on the board (`tasks.block_kind`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Dependency => "dependency",
            Self::NeedsInput => "needs_input",
            Self::Capability => "capability",
            Self::Transient => "transient",
        }
    }

    /// Parses a stored or given name.
    pub fn parse(raw: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.as_str() == raw)
    }
}

/// A card's status as stored: one of [`TaskStatus`], or one this build
/// does not know (written by the seed system or by a newer build), kept
/// exactly as written. A card of a status this build does not know is
/// listed and shown as it is, and never claimed or changed.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CardStatus {
    Known(TaskStatus),
    Unknown(String),
}

impl CardStatus {
    /// Reads a stored status; any text is one.
    pub fn parse(raw: &str) -> Self {
        TaskStatus::parse(raw).map_or_else(|| Self::Unknown(raw.to_owned()), Self::Known)
    }

    /// The name stored on the board.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Known(status) => status.as_str(),
            Self::Unknown(raw) => raw,
        }
    }

    /// The status, when this build knows it.
    pub fn known(&self) -> Option<TaskStatus> {
        match self {
            Self::Known(status) => Some(*status),
            Self::Unknown(_) => None,
        }
    }
}

impl From<TaskStatus> for CardStatus {
    fn from(status: TaskStatus) -> Self {
        Self::Known(status)
    }
}

impl PartialEq<TaskStatus> for CardStatus {
    fn eq(&self, other: &TaskStatus) -> bool {
        self.known() == Some(*other)
    }
}

impl std::fmt::Display for CardStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for CardStatus {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for CardStatus {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(deserializer)?;
        Ok(Self::parse(&raw))
    }
}

/// The process exit codes a worker may end with. The dispatcher books each
/// of them from the same table ([`crate::book_worker_exit`]). Written as
/// its number wherever it is stored; the numbers are `exit.rs`'s alone.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(try_from = "i32", into = "i32")]
pub enum ExitCode {
    /// The turn settled successfully.
    Success,
    /// The turn ended unfinished or failed for a reason nobody can wait out.
    Failure,
    /// A transient provider wall (BSD `EX_TEMPFAIL`): requeue without
    /// counting a failure, after a cooldown.
    TempFail,
    /// A provider failure that needs a human (BSD `EX_CONFIG`): block at once.
    ConfigFail,
    /// The turn was interrupted (128 + SIGINT).
    Interrupted,
}

/// A failure of the environment, not of any card: a dispatcher stops
/// claiming when it sees one, and no card is charged for it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EnvironmentFault {
    /// The dispatcher is set up wrong (a missing agent, an unwritable log
    /// folder, a read-only board): a human must fix it.
    #[error("{0}")]
    Configuration(String),
    /// A fault that may pass (a full disk, a busy board).
    #[error("{0}")]
    Transient(String),
}

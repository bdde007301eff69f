//! The in-place recovery contract of the kanban worker, as a library.
//!
//! This crate states, once, when a failed agent turn may be retried in place,
//! what exit code every outcome gets, and how a worker's turns are driven
//! (first turn, in-place recovery, stop nudges, goal loop, booking). Hosts
//! bring the adapters: a board, an agent, a clock, a sleeper and a judge.
//!
//! Nothing here does I/O or reads ambient state: time comes through [`Clock`],
//! waiting through [`Sleeper`], and the process environment arrives as an
//! [`Environment`] value.

pub mod attachments;
mod board;
mod booking;
mod carrier;
mod classify;
mod data;
pub mod diagnostics;
mod dispatcher;
mod env;
pub mod events;
mod exit;
pub mod lease;
pub mod moves;
pub mod notify;
mod policy;
mod ports;
mod recovery;
pub mod rules;
pub mod shapes;
pub mod swarm;
pub mod tables;
pub mod triage;
mod turn;
mod turns;
pub mod walls;
mod worker;
pub mod workspaces;

pub use board::{
    BoardAdmin, BoardStats, COMMENTS_SHOWN, ClaimGrant, CommentRecord, DEFAULT_CLAIM_TTL_SECONDS,
    EventRecord, Handoff, MAX_CLAIM_TTL_SECONDS, MAX_COMMENT_BYTES, MAX_METADATA_BYTES, NewTask,
    RunRecord, TaskPage, TaskRecord, TaskView, claim_ttl_seconds, heartbeat_interval_seconds,
};
pub use booking::{
    Booking, BookingInput, BookingKind, DEFAULT_FAILURE_LIMIT, ExitWitness,
    PROTOCOL_VIOLATION_LIMIT, SignalReason, Trailer, WORKER_END_DETAIL, WORKER_EXIT_TRAILER,
    book_worker_exit, exit_code_from_trailer, last_trailer,
};
pub use carrier::{CarrierError, ProofRequest, is_valid_task_id, parse_run_id};
pub use classify::{
    Classified, ProviderOutcome, TransportFailure, classify_provider_failure, parse_retry_after,
    provider_wait_seconds,
};
pub use data::{
    BlockKind, BoardError, CardStatus, Claim, EnvironmentFault, ExitCode, FailureReason, NotLive,
    ProofIdentity, RunStatus, TaskStatus, WorkerResult,
};
pub use dispatcher::{
    ClaimFilter, DispatchBoard, DispatchEnd, DispatchEvent, DispatchNotes, DispatchPorts,
    DispatchSettings, Dispatcher, DispatcherReport, DispatcherState, ExitReport, Foreseen, Gates,
    RunLog, RunMode, RunningWorker, STALE_HEARTBEAT_SECONDS, StaleClaimAction, StopSignal,
    Supervisor, TICK_BUCKETS_MS, TickDurations, TickPreview, TickReport, Wakeups, WorkerExit,
    WorkerProcess, assignees_behind, foresee, stale_claim_action,
};
pub use env::{Environment, vars};
pub use exit::{
    CredentialFailure, TERMINAL_PROVIDER_REASONS, TRANSIENT_PROVIDER_REASONS, outcome_exit_code,
    single_query_exit_code, turn_exit_code,
};
pub use policy::{
    Authority, DEFAULT_MAX_RECOVERY_ATTEMPTS, DEFAULT_STOP_NUDGE_ATTEMPTS,
    MAX_RECOVERY_ATTEMPTS_CEILING, NON_RECOVERABLE_REASONS, RECOVERY_DELAYS_SECONDS,
    RecoveryPolicy, Refusal, TERMINAL_TURN_EXIT_PREFIXES, build_recovery_nudge, build_stop_nudge,
    is_off_value, max_recovery_attempts, parse_recovery_budget, recovery_delay_seconds,
    resolve_task_id, stop_nudge_attempts, worker_task_id,
};
pub use ports::{
    Board, BoardProof, ClaimCheck, Clock, Judge, JudgeError, Sleeper, TurnRunner, Verdict,
    VerdictKind,
};
pub use recovery::{
    RecoveryReport, RecoveryStop, recover_in_place, recovery_message, skipped_message,
};
pub use turn::{TurnError, TurnInput, TurnKind, TurnOutcome, TurnResult};
pub use turns::{
    DEFAULT_GOAL_MAX_TURNS, Frame, GoalOutcome, GoalSpec, LAST_OUTPUT_LIMIT, WorkerPorts,
    WorkerRun, WorkerSettings, WorkerSetup, run_worker_turns,
};
pub use worker::{
    AgentControl, BIND_PATIENCE, ITERATION_LIMIT_EXIT_PREFIX, RUN_LIMIT_EXIT_PREFIX, StopReason,
    TURN_DEADLINE_EXIT_PREFIX, WatchEnd, WorkerLife, WorkerLifeReport, run_worker,
};

//! The board's rules, as pure functions.
//!
//! A board adapter reads the rows a decision needs into a [`CardState`],
//! asks this module, and applies the [`Transition`] it gets back inside the
//! same transaction. The adapters keep rows, indexes, fences and
//! transactions; which limit applies, whether a release counts, where a card
//! lands, how long it waits and what the event says are decided here, once,
//! for every engine.

use serde_json::{Value, json};

use crate::board::Handoff;
use crate::data::{BoardError, Claim, RunStatus, TaskStatus};
// Part of the rules' own words, kept here for their callers.
use crate::booking::{
    Booking, BookingInput, BookingKind, ExitWitness, PROTOCOL_VIOLATION_LIMIT, SignalReason,
    book_worker_exit,
};
pub use crate::data::{FailurePolicy, NewEvent, Overrun, Release, Released};

use crate::dispatcher::ExitReport;

use crate::walls::{Wall, WallBounds, WallChange, walls_after_booking};

/// A card blocked this many times in a row for the same kind (its block
/// unblocked, then blocked again) goes to `triage` instead: the seed
/// system's unblock-loop breaker.
pub const BLOCK_RECURRENCE_LIMIT: u32 = 2;
/// Closed runs read, newest first, when counting a protocol-violation streak.
pub const STREAK_SCAN_LIMIT: usize = 50;
/// The first wait before a card whose run failed is claimed again.
pub const RETRY_BACKOFF_BASE_SECONDS: i64 = 30;
/// The longest wait between failed runs.
pub const RETRY_BACKOFF_CAP_SECONDS: i64 = 3600;
/// The most of a worker's output an event or run error keeps.
pub const OUTPUT_TAIL_CHARS: usize = 400;

/// The rows of one card that the rules read, as a board holds them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CardState {
    pub task_id: String,
    pub status: TaskStatus,
    pub current_run_id: Option<i64>,
    pub claim_lock: Option<String>,
    pub claim_expires: Option<i64>,
    pub worker_pid: Option<i64>,
    pub consecutive_failures: u32,
    pub max_retries: Option<u32>,
    /// Some parent of the card is neither done nor archived.
    pub open_parents: bool,
    /// An operator holds the card (`kanban hold`): it is not claimed.
    pub held: bool,
    /// It is not claimed before this time.
    pub not_before: Option<i64>,
    /// The kind of its last block, as stored (a name this build may not
    /// know, written by the seed system); none for an untyped one.
    pub block_kind: Option<String>,
    /// How many times in a row it was blocked for that same kind since it
    /// was last done: the seed system's unblock-loop counter.
    pub block_recurrences: u32,
}

/// How a card's open run is closed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunClose {
    pub status: String,
    pub outcome: String,
    pub summary: Option<String>,
    pub error: Option<String>,
    /// What the worker handed over besides its summary.
    pub metadata: Option<Value>,
}

/// A card's result once it is done.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completion {
    pub result: String,
    pub completed_at: i64,
}

/// What becomes of one column: left as it is, set, or cleared.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Change<T> {
    #[default]
    Keep,
    Set(T),
    Clear,
}

impl<T> Change<T> {
    /// True when the column is left as it is.
    pub fn is_keep(&self) -> bool {
        matches!(self, Self::Keep)
    }

    /// The column's new value (`Some(None)`: cleared), unless it is kept.
    pub fn value(&self) -> Option<Option<&T>> {
        match self {
            Self::Keep => None,
            Self::Set(value) => Some(Some(value)),
            Self::Clear => Some(None),
        }
    }

    /// Set to `value` when there is one, else cleared.
    pub fn to(value: Option<T>) -> Self {
        value.map_or(Self::Clear, Self::Set)
    }
}

/// One change of one card, decided here and applied by a board in one
/// transaction, in this order: close the open run, release the claim, set
/// the task's columns, append the events. `None` (and [`Change::Keep`])
/// leaves a column as it is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Transition {
    pub close_run: Option<RunClose>,
    /// Clear the claim: lock, expiry, run pointer, worker pid and start time.
    pub release_claim: bool,
    pub status: Option<TaskStatus>,
    pub consecutive_failures: Option<u32>,
    pub last_failure_error: Change<String>,
    /// The card is not claimed before this time.
    pub not_before: Change<i64>,
    pub completion: Option<Completion>,
    pub events: Vec<NewEvent>,
    /// Changes to the provider walls (see [`crate::walls`]).
    pub walls: Vec<WallChange>,
    /// The operator's hold, and why.
    pub held: Change<String>,
    /// An operator's edit of the card's fields.
    pub edit: Option<CardEdit>,
    /// The kind of the card's last block.
    pub block_kind: Change<String>,
    /// The unblock-loop counter ([`BLOCK_RECURRENCE_LIMIT`]).
    pub block_recurrences: Option<u32>,
}

impl Transition {
    /// Whether it only adds to the card's history: no run closed, no claim
    /// released, no column, wall, hold or field changed. A board may leave
    /// such a change to its next synced commit: losing it in a machine crash
    /// is the same as that crash coming just before it (the exit record of
    /// a run its worker already settled is one).
    pub fn only_records(&self) -> bool {
        // Named field by field, so that a field added later is weighed here.
        let Self {
            close_run,
            release_claim,
            status,
            consecutive_failures,
            last_failure_error,
            not_before,
            completion,
            events: _,
            walls,
            held,
            edit,
            block_kind,
            block_recurrences,
        } = self;
        close_run.is_none()
            && !release_claim
            && status.is_none()
            && consecutive_failures.is_none()
            && last_failure_error.is_keep()
            && not_before.is_keep()
            && completion.is_none()
            && walls.is_empty()
            && held.is_keep()
            && edit.is_none()
            && block_kind.is_keep()
            && block_recurrences.is_none()
    }

    /// Whether it may give a dispatcher work: a card changes lanes or a run
    /// ends (a board that wakes its dispatchers wakes them then).
    pub fn makes_work(&self) -> bool {
        self.release_claim || self.status.is_some()
    }

    /// Whether the card's children stop waiting for it: it is done or
    /// archived. Its `todo` children with no other open parent are promoted
    /// in the same transaction, as the seed system promotes at completion,
    /// not at a dispatcher's next tick.
    pub fn frees_children(&self) -> bool {
        matches!(self.status, Some(TaskStatus::Done | TaskStatus::Archived))
    }
}

/// An operator's edit: each field given replaces the card's.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CardEdit {
    pub title: Option<String>,
    pub body: Option<String>,
    pub priority: Option<i64>,
    pub assignee: Change<String>,
    pub tenant: Change<String>,
    pub max_retries: Change<u32>,
    pub max_runtime_seconds: Change<i64>,
    /// A done card's result (the card's `result`).
    pub result: Option<String>,
    /// A done card's handoff summary (its last completed run's).
    pub summary: Option<String>,
    /// A done card's handoff metadata (its last completed run's).
    pub metadata: Option<serde_json::Map<String, Value>>,
    /// Where its agent works from its next run on, as `add --workspace`
    /// gives it (checked against the world by the caller), with a
    /// worktree's branch.
    pub workspace: Option<WorkspaceEdit>,
}

/// A card's workspace, as an edit gives it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkspaceEdit {
    pub spec: crate::workspaces::WorkspaceSpec,
    pub branch: Option<String>,
}

impl CardEdit {
    /// Whether it changes a done card's handoff: its result, or its last
    /// completed run's summary or metadata.
    pub fn changes_handoff(&self) -> bool {
        self.result.is_some() || self.summary.is_some() || self.metadata.is_some()
    }

    /// The names of the fields it changes, for the `edited` event.
    pub fn fields(&self) -> Vec<&'static str> {
        [
            ("title", self.title.is_some()),
            ("body", self.body.is_some()),
            ("priority", self.priority.is_some()),
            ("assignee", !self.assignee.is_keep()),
            ("tenant", !self.tenant.is_keep()),
            ("max_retries", !self.max_retries.is_keep()),
            ("max_runtime_seconds", !self.max_runtime_seconds.is_keep()),
            ("result", self.result.is_some()),
            ("summary", self.summary.is_some()),
            ("metadata", self.metadata.is_some()),
            ("workspace", self.workspace.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, given)| given.then_some(name))
        .collect()
    }
}

impl Default for FailurePolicy {
    fn default() -> Self {
        Self {
            failure_limit: crate::DEFAULT_FAILURE_LIMIT,
            rate_limit_cooldown: DEFAULT_RATE_LIMIT_COOLDOWN_SECONDS,
            backoff_base_seconds: RETRY_BACKOFF_BASE_SECONDS,
            max_wall_seconds: crate::walls::DEFAULT_MAX_WALL_SECONDS,
        }
    }
}

/// Seconds a rate-limited card waits when the dispatcher names no cooldown.
pub const DEFAULT_RATE_LIMIT_COOLDOWN_SECONDS: i64 = 300;

/// Which failure limit applies to a card, and where it came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FailureLimit {
    pub limit: u32,
    /// True when the card names it (`max_retries`), false for the dispatcher's.
    pub from_card: bool,
}

/// The card's own `max_retries` wins over the dispatcher's limit; a limit
/// is at least 1, so a card is never blocked before its first failure.
pub fn failure_limit(max_retries: Option<u32>, dispatcher_default: u32) -> FailureLimit {
    match max_retries {
        Some(limit) => FailureLimit {
            limit: limit.max(1),
            from_card: true,
        },
        None => FailureLimit {
            limit: dispatcher_default.max(1),
            from_card: false,
        },
    }
}

/// Protocol violations in a row that block a card: its `max_retries`, else 3.
pub fn violation_limit(max_retries: Option<u32>) -> u32 {
    max_retries.unwrap_or(PROTOCOL_VIOLATION_LIMIT).max(1)
}

/// Protocol violations booked in a row, over closed run outcomes newest
/// first: rate-limited runs neither count nor break the streak; anything
/// else breaks it. Only the newest [`STREAK_SCAN_LIMIT`] runs are read.
pub fn violation_streak<'a>(outcomes_newest_first: impl IntoIterator<Item = &'a str>) -> u32 {
    let mut streak = 0;
    for outcome in outcomes_newest_first.into_iter().take(STREAK_SCAN_LIMIT) {
        match outcome {
            "rate_limited" => continue,
            "protocol_violation" => streak += 1,
            _ => break,
        }
    }
    streak
}

/// Where a card goes back in line: `todo` while a parent is open, else `ready`.
pub fn requeue_landing(open_parents: bool) -> TaskStatus {
    if open_parents {
        TaskStatus::Todo
    } else {
        TaskStatus::Ready
    }
}

/// How a new card asks to start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Start {
    /// In line: ready, or todo while a parent is open.
    #[default]
    InLine,
    /// Blocked (`add --blocked`).
    Blocked,
    /// In triage, for a person to shape first (`add --triage`).
    Triage,
}

/// Where a new card starts: a card due later (`not_before` after `now`)
/// waits in `scheduled`, where neither system claims it.
pub fn initial_status(
    start: Start,
    open_parents: bool,
    not_before: Option<i64>,
    now: i64,
) -> TaskStatus {
    match start {
        Start::Blocked => TaskStatus::Blocked,
        Start::Triage => TaskStatus::Triage,
        Start::InLine if not_before.is_some_and(|at| at > now) => TaskStatus::Scheduled,
        Start::InLine => requeue_landing(open_parents),
    }
}

/// The wait before a card is claimed again after its `failures`-th counted
/// failure in a row: `base` (30 s by default) doubling per failure, capped
/// at one hour, plus up to a quarter more of jitter drawn from
/// `jitter_seed`, so cards that failed together do not all come back in the
/// same second. A base of 0 (or less) waits not at all.
pub fn retry_backoff_seconds(base: i64, failures: u32, jitter_seed: u64) -> i64 {
    if base <= 0 {
        return 0;
    }
    let doublings = failures.saturating_sub(1).min(16);
    let base = base
        .saturating_mul(1_i64 << doublings)
        .min(RETRY_BACKOFF_CAP_SECONDS);
    // A quarter of the base, spread by the seed's low bits (0..=255 of 256).
    let jitter = base / 4 * i64::try_from(spread(jitter_seed) % 256).unwrap_or(0) / 256;
    base + jitter
}

/// A cheap, well-mixed function of a seed (splitmix64's finaliser): two
/// neighbouring run ids get unrelated jitter.
fn spread(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The jitter seed of a run: run ids are unique on a board, so cards that
/// failed together still get different waits, and a replay waits the same.
fn jitter_seed(run_id: Option<i64>) -> u64 {
    run_id.map_or(0, |run| run as u64)
}

/// True when the card is running under exactly this claim.
pub fn holds_claim(card: &CardState, claim: &Claim) -> bool {
    card.status == TaskStatus::Running
        && card.current_run_id == Some(claim.run_id)
        && card.claim_lock.as_deref() == Some(claim.claim_lock.as_str())
}

/// True when a lease with this expiry has run out at `now`. A lease that
/// expires exactly now is still live, as the seed's `claim_expires < now`
/// says; a missing expiry is not an unbounded lease but an expired one.
pub fn lease_expired(expires: Option<i64>, now: i64) -> bool {
    expires.is_none_or(|expires| expires < now)
}

/// What a closed or open run looks like, for [`run_status`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunRow {
    pub ended: bool,
    pub outcome: Option<String>,
}

/// Where a worker's run stands: running while the card runs under it and
/// the run is open; done or blocked when the worker's own terminal call
/// closed it; superseded in every other case.
pub fn run_status(card: &CardState, run: Option<&RunRow>, claim: &Claim) -> RunStatus {
    match run {
        Some(run) if !run.ended && holds_claim(card, claim) => RunStatus::Running,
        Some(run) if run.ended && run.outcome.as_deref() == Some("completed") => RunStatus::Done,
        Some(run) if run.ended && run.outcome.as_deref() == Some("blocked") => RunStatus::Blocked,
        _ => RunStatus::Superseded,
    }
}

fn tail(text: &str, limit: usize) -> String {
    let text = text.trim();
    let count = text.chars().count();
    text.chars().skip(count.saturating_sub(limit)).collect()
}

/// A counted failure of the claim's run: the run closes with `outcome`, the
/// card goes back to ready after its backoff, or to blocked at its limit.
fn counted_failure(
    card: &CardState,
    run_id: Option<i64>,
    outcome: &str,
    error: String,
    policy: &FailurePolicy,
    now: i64,
    mut payload: Value,
) -> Transition {
    let limit = failure_limit(card.max_retries, policy.failure_limit);
    let failures = card.consecutive_failures.saturating_add(1);
    let blocks = failures >= limit.limit;
    let wait = retry_backoff_seconds(policy.backoff_base_seconds, failures, jitter_seed(run_id));
    let retry_at = (!blocks && wait > 0).then(|| now.saturating_add(wait));
    if let Value::Object(map) = &mut payload {
        map.insert("counted".into(), json!(true));
        map.insert("failures".into(), json!(failures));
        map.insert("blocked".into(), json!(blocks));
        map.insert("retry_at".into(), json!(retry_at));
    }
    let mut events = vec![NewEvent::new(outcome, run_id, payload)];
    if blocks {
        events.push(NewEvent::new(
            "gave_up",
            run_id,
            json!({
                "trigger": outcome,
                "failures": failures,
                "effective_limit": limit.limit,
                "limit_source": if limit.from_card { "card" } else { "dispatcher" },
                "sticky": true,
            }),
        ));
    }
    Transition {
        block_kind: Change::Keep,
        block_recurrences: None,
        walls: Vec::new(),
        held: Change::Keep,
        edit: None,
        close_run: Some(RunClose {
            status: outcome.to_owned(),
            outcome: outcome.to_owned(),
            summary: None,
            error: Some(error.clone()),
            metadata: None,
        }),
        release_claim: true,
        status: Some(if blocks {
            TaskStatus::Blocked
        } else {
            TaskStatus::Ready
        }),
        consecutive_failures: Some(failures),
        last_failure_error: Change::Set(error),
        not_before: Change::to(retry_at),
        completion: None,
        events,
    }
}

/// What a board knows about a run's history when it books its exit.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExitHistory {
    /// Outcomes of the card's closed runs, newest first.
    pub recent_outcomes: Vec<String>,
    /// The reason of the newest `worker_signalled` event of the run.
    pub recorded_signal: Option<SignalReason>,
    /// The walls of the report's wall scope, and those this run probes.
    pub walls: Vec<Wall>,
}

fn witness_parts(witness: ExitWitness) -> (Option<i32>, Option<i32>) {
    match witness {
        ExitWitness::Code(code) => (Some(code), None),
        ExitWitness::Signal(signal) => (None, Some(signal)),
        ExitWitness::Unknown => (None, None),
    }
}

/// The error text a booking leaves on the run and the card.
pub fn booking_error(kind: BookingKind, witness: ExitWitness, output_tail: &str) -> String {
    let how = match witness {
        ExitWitness::Code(code) => format!("exited with code {code}"),
        ExitWitness::Signal(signal) => format!("was killed by signal {signal}"),
        ExitWitness::Unknown => "ended, and nothing says how".to_owned(),
    };
    let what = match kind {
        BookingKind::ProtocolViolation => "worker exited cleanly (rc=0) without kanban complete or kanban block: protocol violation; a run without a terminal board call counts as unfinished".to_owned(),
        BookingKind::RateLimited => "worker hit a transient provider wall (rc=75); requeued after the cooldown".to_owned(),
        BookingKind::TerminalProvider => "worker hit a provider failure that needs a human (rc=78)".to_owned(),
        BookingKind::Interrupted => format!("worker was interrupted and {how}"),
        BookingKind::TimedOut => format!("worker overran its time and was stopped; it {how}"),
        BookingKind::Crashed | BookingKind::Settled => format!("worker {how}"),
    };
    if output_tail.trim().is_empty() {
        what
    } else {
        format!("{what}. Worker's last output: {:?}", output_tail.trim())
    }
}

/// Books one worker exit of `claim`'s run: core's booking table decides the
/// kind, and this turns it into the card's change. A card no longer running
/// under the claim is left alone; only a `worker_exited` record is added.
/// A run that hit a provider wall arms (or re-arms) it; a probe run that got
/// an answer lifts the wall it probed.
pub fn book_exit(
    card: &CardState,
    claim: &Claim,
    history: &ExitHistory,
    report: &ExitReport,
    now: i64,
) -> (Booking, Transition) {
    let (booking, mut transition) = book_card_exit(card, claim, history, report, now);
    if let Some(reason) = &report.unbookable {
        block_unbookable(&mut transition, reason, claim.run_id);
    }
    let changes = walls_after_booking(
        &history.walls,
        report.wall.as_ref(),
        booking.kind,
        &claim.task_id,
        claim.run_id,
        now,
        WallBounds {
            unnamed_wait: report.policy.rate_limit_cooldown,
            max_wall: report.policy.max_wall_seconds,
        },
    );
    for change in &changes {
        let (kind, payload) = match change {
            WallChange::Arm(wall) => (
                "wall_armed",
                json!({"scope": wall.scope, "wall": wall.kind.as_str(), "until": wall.until,
                       "hits": wall.hits, "failed_probes": wall.failed_probes, "reason": wall.reason}),
            ),
            WallChange::Lift { scope } => ("wall_lifted", json!({"scope": scope})),
            WallChange::ProbeEnded { scope } => ("wall_probe_ended", json!({"scope": scope})),
        };
        transition
            .events
            .push(NewEvent::new(kind, Some(claim.run_id), payload));
    }
    transition.walls = changes;
    (booking, transition)
}

fn book_card_exit(
    card: &CardState,
    claim: &Claim,
    history: &ExitHistory,
    report: &ExitReport,
    now: i64,
) -> (Booking, Transition) {
    let limit = failure_limit(card.max_retries, report.policy.failure_limit);
    let still_running = holds_claim(card, claim);
    let booking = book_worker_exit(BookingInput {
        witness: report.witness,
        still_running,
        signalled: report.signalled.max(history.recorded_signal),
        violation_streak: violation_streak(history.recent_outcomes.iter().map(String::as_str)),
        consecutive_failures: card.consecutive_failures,
        failure_limit: limit.limit,
        violation_limit: violation_limit(card.max_retries),
    });
    let (exit_code, signal) = witness_parts(report.witness);
    let output = tail(&report.output_tail, OUTPUT_TAIL_CHARS);
    let run_id = Some(claim.run_id);
    let payload = json!({
        "kind": booking.kind.as_str(),
        "exit_code": exit_code,
        "signal": signal,
        "source": report.source,
        "output": output,
    });
    if booking.kind == BookingKind::Settled {
        let transition = Transition {
            events: vec![NewEvent::new(booking.kind.event_kind(), run_id, payload)],
            ..Transition::default()
        };
        return (booking, transition);
    }
    let error = booking_error(booking.kind, report.witness, &output);
    if booking.counts_failure {
        let mut transition = counted_failure(
            card,
            run_id,
            booking.kind.as_str(),
            error,
            &report.policy,
            now,
            payload,
        );
        // A wall that needs a human blocks at once, whatever the count.
        if booking.blocks && transition.status != Some(TaskStatus::Blocked) {
            transition.status = Some(TaskStatus::Blocked);
            transition.not_before = Change::Clear;
            transition.events.push(NewEvent::new(
                "gave_up",
                run_id,
                json!({"trigger": booking.kind.as_str(), "sticky": true}),
            ));
        }
        return (booking, transition);
    }
    let transition = uncounted_exit(card, run_id, &booking, report, error, payload, now);
    (booking, transition)
}

/// An exit the board refused to book as reported, booked again without the
/// worker's output: a card it moves is blocked, the refusal its reason.
fn block_unbookable(transition: &mut Transition, reason: &str, run_id: i64) {
    if transition.status.is_none() {
        return;
    }
    let error = format!(
        "the board refused to book this exit with the worker's output ({reason}); blocked for a human"
    );
    transition.status = Some(TaskStatus::Blocked);
    transition.not_before = Change::Clear;
    transition.last_failure_error = Change::Set(error.clone());
    if let Some(close) = &mut transition.close_run {
        close.error = Some(error);
    }
    transition.events.push(NewEvent::new(
        "gave_up",
        Some(run_id),
        json!({"trigger": "unbookable", "reason": reason, "sticky": true}),
    ));
}

/// The transition of an exit that counts no failure: a rate limit, an
/// interruption, a protocol violation (which may block at its limit). The
/// card goes back to ready, after the cooldown when the booking asks for one.
fn uncounted_exit(
    card: &CardState,
    run_id: Option<i64>,
    booking: &Booking,
    report: &ExitReport,
    error: String,
    mut payload: Value,
    now: i64,
) -> Transition {
    let retry_at = booking.cooldown.then(|| {
        let wait = report
            .retry_after_seconds
            .map_or(0, |seconds| i64::try_from(seconds).unwrap_or(i64::MAX))
            // A provider's reset time is honoured up to the wall bound.
            .min(report.policy.max_wall_seconds.max(0))
            .max(report.policy.rate_limit_cooldown.max(0));
        now.saturating_add(wait)
    });
    if let Value::Object(map) = &mut payload {
        map.insert("counted".into(), json!(false));
        map.insert("failures".into(), json!(card.consecutive_failures));
        map.insert("blocked".into(), json!(booking.blocks));
        map.insert("retry_at".into(), json!(retry_at));
    }
    let mut events = vec![NewEvent::new(booking.kind.as_str(), run_id, payload)];
    if booking.blocks {
        events.push(NewEvent::new(
            "gave_up",
            run_id,
            json!({"trigger": booking.kind.as_str(), "failures": card.consecutive_failures, "sticky": true}),
        ));
    }
    Transition {
        block_kind: Change::Keep,
        block_recurrences: None,
        walls: Vec::new(),
        held: Change::Keep,
        edit: None,
        close_run: Some(RunClose {
            status: booking.kind.as_str().to_owned(),
            outcome: booking.kind.as_str().to_owned(),
            summary: None,
            error: Some(error.clone()),
            metadata: None,
        }),
        release_claim: true,
        status: Some(if booking.blocks {
            TaskStatus::Blocked
        } else {
            TaskStatus::Ready
        }),
        consecutive_failures: None,
        last_failure_error: Change::Set(error),
        not_before: Change::to(retry_at),
        completion: None,
        events,
    }
}

/// Releases `claim` back to the card's lane, or `None` when the card no
/// longer holds it (or, for an expired release, its lease is live again).
/// `recorded_signal` is the reason of the run's newest `worker_signalled`
/// event: a worker its own dispatcher stopped as it shut down is not
/// charged to the card, whoever releases its claim.
pub fn release_claim(
    card: &CardState,
    claim: &Claim,
    release: &Release,
    policy: &FailurePolicy,
    now: i64,
    recorded_signal: Option<SignalReason>,
) -> Option<Transition> {
    if !holds_claim(card, claim) {
        return None;
    }
    let run_id = Some(claim.run_id);
    match release {
        Release::Expired => {
            if !lease_expired(card.claim_expires, now) {
                return None;
            }
            let error = format!("stale_lock={}", claim.claim_lock);
            let payload = json!({
                "stale_lock": claim.claim_lock,
                "claim_expires": card.claim_expires,
                "now": now,
            });
            if recorded_signal == Some(SignalReason::Shutdown) {
                // Its dispatcher stopped the worker as it shut down, then
                // died or stalled before it booked the exit: the run was cut
                // short by its environment, and that exit's booking would
                // not have charged the card either.
                return Some(uncounted_stale_release(card, claim, error, payload));
            }
            let mut transition =
                counted_failure(card, run_id, "reclaimed", error, policy, now, payload);
            transition.status = transition.status.map(|status| match status {
                TaskStatus::Ready => requeue_landing(card.open_parents),
                other => other,
            });
            Some(transition)
        }
        Release::NotStarted { reason } => Some(Transition {
            close_run: Some(RunClose {
                status: "released".to_owned(),
                outcome: "released".to_owned(),
                summary: None,
                error: Some(reason.clone()),
                metadata: None,
            }),
            release_claim: true,
            status: Some(requeue_landing(card.open_parents)),
            events: vec![NewEvent::new(
                "released",
                run_id,
                json!({"reason": reason, "counted": false, "claim_lock": claim.claim_lock}),
            )],
            ..Transition::default()
        }),
    }
}

/// The stale release of a run its dispatcher stopped as it shut down: the
/// run closes as reclaimed, the card goes back in line, nothing counted.
fn uncounted_stale_release(
    card: &CardState,
    claim: &Claim,
    error: String,
    mut payload: Value,
) -> Transition {
    if let Value::Object(map) = &mut payload {
        map.insert("counted".into(), json!(false));
        map.insert("signalled".into(), json!(SignalReason::Shutdown.as_str()));
    }
    Transition {
        close_run: Some(RunClose {
            status: "reclaimed".to_owned(),
            outcome: "reclaimed".to_owned(),
            summary: None,
            error: Some(error),
            metadata: None,
        }),
        release_claim: true,
        status: Some(requeue_landing(card.open_parents)),
        events: vec![NewEvent::new("reclaimed", Some(claim.run_id), payload)],
        ..Transition::default()
    }
}

/// The worker's own settlement of a run that overran: the run closes as
/// `timed_out`, a failure is counted and the claim released (the seed's
/// finalizer does this for an exhausted iteration budget).
pub fn settle_overrun(
    card: &CardState,
    claim: &Claim,
    overrun: &Overrun,
    policy: &FailurePolicy,
    now: i64,
) -> Option<Transition> {
    if !holds_claim(card, claim) {
        return None;
    }
    let error = overrun.error();
    let payload = json!({"reason": error});
    Some(counted_failure(
        card,
        Some(claim.run_id),
        "timed_out",
        error,
        policy,
        now,
        payload,
    ))
}

/// The worker's terminal `complete`.
pub fn complete(
    claim: &Claim,
    handoff: &Handoff,
    verified_cards: &[String],
    now: i64,
) -> Transition {
    let summary = handoff.summary.as_str();
    let mut payload = json!({"summary": summary});
    if !verified_cards.is_empty() {
        // The seed system's name for the cards a completion vouches for.
        payload["verified_cards"] = json!(verified_cards);
    }
    Transition {
        walls: Vec::new(),
        held: Change::Keep,
        edit: None,
        close_run: Some(RunClose {
            status: "done".to_owned(),
            outcome: "completed".to_owned(),
            summary: Some(summary.to_owned()),
            error: None,
            metadata: handoff.metadata.clone().map(Value::Object),
        }),
        release_claim: true,
        status: Some(TaskStatus::Done),
        consecutive_failures: Some(0),
        last_failure_error: Change::Clear,
        not_before: Change::Clear,
        completion: Some(Completion {
            result: handoff.result.as_deref().unwrap_or(summary).to_owned(),
            completed_at: now,
        }),
        events: vec![NewEvent::new("completed", Some(claim.run_id), payload)],
        // Done: the unblock-loop counter starts again, as the seed
        // system's does.
        block_kind: Change::Keep,
        block_recurrences: Some(0),
    }
}

/// A card a completing run says it made, as the board found it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MadeCard {
    pub id: String,
    /// Its `created_by`.
    pub created_by: Option<String>,
    /// It waits for the completing card.
    pub child: bool,
}

/// The cards of a handoff's `created_cards` that the completing card
/// (`task_id`, assigned to `assignee`) did make, in the order given, once
/// each; `found` holds those the board has. A card counts as made when it
/// waits for the completing card, or names the card or its assignee as its
/// maker (the seed system's three tests). Any other id (not on the board,
/// or somebody else's) refuses the completion, which changes nothing.
pub fn verify_created_cards(
    task_id: &str,
    assignee: Option<&str>,
    claimed: &[String],
    found: &[MadeCard],
) -> Result<Vec<String>, BoardError> {
    let mut verified = Vec::new();
    let mut phantom = Vec::new();
    for id in claimed {
        if verified.contains(id) || phantom.contains(id) {
            continue;
        }
        let made = found.iter().any(|card| {
            card.id == *id
                && (card.child
                    || card.created_by.as_deref() == Some(task_id)
                    || (assignee.is_some() && card.created_by.as_deref() == assignee))
        });
        if made {
            verified.push(id.clone());
        } else {
            phantom.push(id.clone());
        }
    }
    if phantom.is_empty() {
        return Ok(verified);
    }
    Err(BoardError::InvalidInput(format!(
        "created_cards names cards {task_id} did not make: {} (not on the board, or made by somebody else); the card is still yours and unchanged: complete again without them",
        phantom.join(", ")
    )))
}

/// What a run's fan-out may change: the cards its own card made, which
/// wait for it (`child`). Any other card is another worker's or a
/// person's, out of a worker's reach.
pub fn check_fan_out_target(task_id: &str, target: &str, child: bool) -> Result<(), BoardError> {
    if child {
        return Ok(());
    }
    Err(BoardError::InvalidInput(format!(
        "{target} does not wait for {task_id}: a run changes only the cards its own card made (create them with `kanban create`, or ask a person)"
    )))
}

/// The card a worker makes from inside its run on `claim`'s card, whose
/// assignee is `assignee` and tenant `tenant`: it waits for that card (and
/// any parents it names), names the card's assignee as its maker, and
/// belongs to the card's tenant unless it names its own, as the seed
/// system's `kanban_create` does (its worker's `HERMES_TENANT`).
pub fn child_card(
    claim: &Claim,
    assignee: Option<&str>,
    tenant: Option<&str>,
    new: &crate::NewTask,
) -> crate::NewTask {
    let mut child = new.clone();
    if !child.parents.contains(&claim.task_id) {
        child.parents.insert(0, claim.task_id.clone());
    }
    child.created_by = Some(assignee.unwrap_or(&claim.task_id).to_owned());
    if child.tenant.is_none() {
        child.tenant = tenant.map(str::to_owned);
    }
    child
}

/// A run's fan-out, recorded on its own card: `action` (created, linked,
/// unblocked) and what it touched.
pub fn fanned_out(claim: &Claim, action: &str, details: Value) -> NewEvent {
    let mut payload = json!({"action": action});
    if let (Value::Object(payload), Value::Object(details)) = (&mut payload, details) {
        payload.extend(details);
    }
    NewEvent::new("fanned_out", Some(claim.run_id), payload)
}

/// The worker's terminal `block`, routed by its kind as the seed system
/// routes it: a `dependency` block waits in `todo` for the card's parents
/// (no person needed); any other, or none, is `blocked` for a person,
/// unless the card was blocked for the same kind last time too (unblocked
/// in between): at [`BLOCK_RECURRENCE_LIMIT`] blocks in a row it goes to
/// `triage`, so an unblocker and a worker cannot loop forever.
pub fn block(
    card: &CardState,
    claim: &Claim,
    reason: &str,
    kind: Option<crate::BlockKind>,
) -> Transition {
    let close_run = Some(RunClose {
        status: "blocked".to_owned(),
        outcome: "blocked".to_owned(),
        summary: Some(reason.to_owned()),
        error: None,
        metadata: None,
    });
    let named = kind.map(crate::BlockKind::as_str);
    let block_kind = Change::to(named.map(str::to_owned));
    if kind == Some(crate::BlockKind::Dependency) {
        return Transition {
            close_run,
            release_claim: true,
            status: Some(TaskStatus::Todo),
            not_before: Change::Clear,
            block_kind,
            events: vec![NewEvent::new(
                "dependency_wait",
                Some(claim.run_id),
                json!({"reason": reason, "kind": named}),
            )],
            ..Transition::default()
        };
    }
    let recurrences = if card.block_kind.as_deref() == named {
        card.block_recurrences.saturating_add(1)
    } else {
        1
    };
    let looped = recurrences >= BLOCK_RECURRENCE_LIMIT;
    let event = if looped {
        NewEvent::new(
            "block_loop_detected",
            Some(claim.run_id),
            json!({"reason": reason, "kind": named, "recurrences": recurrences, "limit": BLOCK_RECURRENCE_LIMIT}),
        )
    } else {
        NewEvent::new(
            "blocked",
            Some(claim.run_id),
            json!({"reason": reason, "kind": named}),
        )
    };
    Transition {
        close_run,
        release_claim: true,
        status: Some(if looped {
            TaskStatus::Triage
        } else {
            TaskStatus::Blocked
        }),
        not_before: Change::Clear,
        block_kind,
        block_recurrences: Some(recurrences),
        events: vec![event],
        ..Transition::default()
    }
}

/// An operator's reclaim of a running card: the run closes as reclaimed,
/// the card goes back in line and its failure count starts again.
pub fn reclaim(card: &CardState, reason: &str, now: i64) -> Result<Transition, BoardError> {
    if card.status != TaskStatus::Running {
        return Err(BoardError::InvalidTransition {
            task_id: card.task_id.clone(),
            status: card.status.as_str().to_owned(),
            action: "reclaim".into(),
        });
    }
    let landing = requeue_landing(card.open_parents);
    Ok(Transition {
        block_kind: Change::Keep,
        block_recurrences: None,
        walls: Vec::new(),
        held: Change::Keep,
        edit: None,
        close_run: Some(RunClose {
            status: "reclaimed".to_owned(),
            outcome: "reclaimed".to_owned(),
            summary: None,
            error: Some(format!("manual_reclaim: {reason}")),
            metadata: None,
        }),
        release_claim: true,
        status: Some(landing),
        consecutive_failures: Some(0),
        last_failure_error: Change::Clear,
        not_before: Change::Clear,
        completion: None,
        events: vec![NewEvent::new(
            "reclaimed",
            card.current_run_id,
            json!({"manual": true, "reason": reason, "prev_lock": card.claim_lock, "status": landing.as_str(), "now": now}),
        )],
    })
}

/// An operator's unblock of a blocked or parked (`scheduled`) card: back in
/// line now, whatever it waited for (its hold and its time too), failure
/// count reset.
pub fn unblock(card: &CardState) -> Result<Transition, BoardError> {
    if !matches!(card.status, TaskStatus::Blocked | TaskStatus::Scheduled) {
        return Err(refuse(card, "unblock"));
    }
    let landing = requeue_landing(card.open_parents);
    Ok(Transition {
        status: Some(landing),
        consecutive_failures: Some(0),
        last_failure_error: Change::Clear,
        not_before: Change::Clear,
        held: end_hold(card),
        events: vec![NewEvent::new(
            "unblocked",
            None,
            json!({"status": landing.as_str()}),
        )],
        ..Transition::default()
    })
}

/// What a dispatcher's tick does to a waiting card at `now`: a `todo` card
/// whose parents are all done becomes ready, and a parked card that waited
/// only for its time (not held) goes back in line once that time comes.
pub fn promote(card: &CardState, now: i64) -> Option<Transition> {
    match card.status {
        TaskStatus::Todo if !card.open_parents => Some(Transition {
            status: Some(TaskStatus::Ready),
            events: vec![NewEvent::new("promoted", None, Value::Null)],
            ..Transition::default()
        }),
        TaskStatus::Scheduled if !card.held && card.not_before.is_some_and(|at| at <= now) => {
            let landing = requeue_landing(card.open_parents);
            Some(Transition {
                status: Some(landing),
                events: vec![NewEvent::new(
                    "due",
                    None,
                    json!({"status": landing.as_str()}),
                )],
                ..Transition::default()
            })
        }
        _ => None,
    }
}

/// An operator's promotion (`kanban promote`) of a card in triage, in todo
/// or blocked: ready, refused while a parent is open unless `force`d. The
/// seed system's recovery path, which also takes a card out of triage.
pub fn promote_by_hand(
    card: &CardState,
    reason: Option<&str>,
    force: bool,
) -> Result<Transition, BoardError> {
    if !matches!(
        card.status,
        TaskStatus::Triage | TaskStatus::Todo | TaskStatus::Blocked
    ) {
        return Err(refuse(card, "promote"));
    }
    if card.open_parents && !force {
        return Err(BoardError::InvalidInput(format!(
            "{} waits for a parent that is neither done nor archived (see `kanban show {}`); --force promotes it anyway",
            card.task_id, card.task_id
        )));
    }
    Ok(Transition {
        status: Some(TaskStatus::Ready),
        events: vec![NewEvent::new(
            "promoted_manual",
            None,
            json!({"reason": reason, "forced": force, "was": card.status.as_str()}),
        )],
        ..Transition::default()
    })
}

/// An operator's `kanban schedule`: the card is parked in `scheduled`,
/// where neither system claims it, until `not_before` if given (a
/// dispatcher's tick puts it back in line then) or until an unblock. A
/// running card's run closes as `scheduled` and its claim is released, so
/// its worker is fenced out.
pub fn schedule(
    card: &CardState,
    reason: Option<&str>,
    not_before: Option<i64>,
) -> Result<Transition, BoardError> {
    if !matches!(
        card.status,
        TaskStatus::Todo | TaskStatus::Ready | TaskStatus::Running | TaskStatus::Blocked
    ) {
        return Err(refuse(card, "schedule"));
    }
    let running = card.status == TaskStatus::Running;
    Ok(Transition {
        close_run: running.then(|| RunClose {
            status: "scheduled".to_owned(),
            outcome: "scheduled".to_owned(),
            summary: reason.map(str::to_owned),
            error: None,
            metadata: None,
        }),
        release_claim: running,
        status: Some(TaskStatus::Scheduled),
        not_before: Change::to(not_before),
        events: vec![NewEvent::new(
            "scheduled",
            card.current_run_id.filter(|_| running),
            json!({"reason": reason, "not_before": not_before, "was": card.status.as_str()}),
        )],
        ..Transition::default()
    })
}

/// An operator sends a card nobody works back to `triage`, where it waits
/// for a person and is never claimed.
pub fn to_triage(card: &CardState, reason: Option<&str>) -> Result<Transition, BoardError> {
    if !matches!(
        card.status,
        TaskStatus::Todo | TaskStatus::Scheduled | TaskStatus::Ready | TaskStatus::Blocked
    ) {
        return Err(refuse(card, "triage"));
    }
    Ok(move_to(card, TaskStatus::Triage, "triaged", reason))
}

/// An operator puts a card nobody works up for review: a dispatcher
/// claims it for its assignee (the reviewer) as it claims a ready card,
/// without waiting for its parents again, as the seed system does.
pub fn to_review(card: &CardState, reason: Option<&str>) -> Result<Transition, BoardError> {
    if !matches!(
        card.status,
        TaskStatus::Todo
            | TaskStatus::Scheduled
            | TaskStatus::Ready
            | TaskStatus::Blocked
            | TaskStatus::Done
    ) {
        return Err(refuse(card, "review"));
    }
    Ok(move_to(card, TaskStatus::Review, "review", reason))
}

/// An operator's move of a card nobody works to `lane`: whatever it
/// waited for (its time, its hold) ends, and `kind` says why and from where.
fn move_to(card: &CardState, lane: TaskStatus, kind: &str, reason: Option<&str>) -> Transition {
    Transition {
        status: Some(lane),
        not_before: Change::Clear,
        held: end_hold(card),
        events: vec![NewEvent::new(
            kind,
            None,
            json!({"reason": reason, "was": card.status.as_str()}),
        )],
        ..Transition::default()
    }
}

/// The hold of a card that leaves its lane: cleared if it has one.
fn end_hold(card: &CardState) -> Change<String> {
    if card.held {
        Change::Clear
    } else {
        Change::Keep
    }
}

/// What making `child` wait for `parent` does, given the board's `links`
/// (`(parent, child)` pairs): `None` when it waits for it already. Refused
/// when the card would wait for itself, directly or through the cards that
/// wait for it. A ready child of a parent that is neither done nor archived
/// goes back to `todo` until the parent is done.
pub fn link(
    parent: &CardState,
    child: &CardState,
    links: &[(String, String)],
) -> Result<Option<Transition>, BoardError> {
    if parent.task_id == child.task_id {
        return Err(BoardError::InvalidInput(format!(
            "{} cannot wait for itself",
            child.task_id
        )));
    }
    if links
        .iter()
        .any(|(from, to)| *from == parent.task_id && *to == child.task_id)
    {
        return Ok(None);
    }
    if waits_for(&parent.task_id, &child.task_id, links) {
        return Err(BoardError::InvalidInput(format!(
            "{} already waits for {}: linking {} -> {} would make a cycle",
            parent.task_id, child.task_id, parent.task_id, child.task_id
        )));
    }
    let parent_open = !matches!(parent.status, TaskStatus::Done | TaskStatus::Archived);
    Ok(Some(Transition {
        status: (parent_open && child.status == TaskStatus::Ready).then_some(TaskStatus::Todo),
        events: vec![NewEvent::new(
            "linked",
            None,
            json!({"parent": parent.task_id, "child": child.task_id}),
        )],
        ..Transition::default()
    }))
}

/// What ending `child`'s wait for `parent` does to the child, as it stands
/// once the link is gone: a `todo` child with no open parent left is ready.
pub fn unlinked(child: &CardState, parent: &str, now: i64) -> Transition {
    let mut events = vec![NewEvent::new(
        "unlinked",
        None,
        json!({"parent": parent, "child": child.task_id}),
    )];
    match promote(child, now) {
        Some(promoted) => {
            events.extend(promoted.events);
            Transition { events, ..promoted }
        }
        None => Transition {
            events,
            ..Transition::default()
        },
    }
}

/// Whether `card` waits for `ancestor` through `links`, directly or
/// through cards between them.
pub fn waits_for(card: &str, ancestor: &str, links: &[(String, String)]) -> bool {
    let mut children = std::collections::BTreeMap::<&str, Vec<&str>>::new();
    for (parent, child) in links {
        children
            .entry(parent.as_str())
            .or_default()
            .push(child.as_str());
    }
    let mut seen = std::collections::BTreeSet::new();
    let mut next = vec![ancestor];
    while let Some(at) = next.pop() {
        if at == card {
            return true;
        }
        if seen.insert(at) {
            next.extend(children.get(at).into_iter().flatten());
        }
    }
    false
}

/// A card as a claim finds it: what the claim rule reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimCandidate {
    pub task_id: String,
    /// Its title, for the dispatcher's log.
    pub title: String,
    /// Its status; `None` when this build does not know it.
    pub status: Option<TaskStatus>,
    /// Somebody holds a claim on it.
    pub claimed: bool,
    /// An operator holds it (`kanban hold`).
    pub held: bool,
    pub not_before: Option<i64>,
    pub assignee: Option<String>,
    pub priority: i64,
    pub created_at: i64,
    /// Its place on the board: cards added later have later places.
    pub place: i64,
    /// Some parent is neither done nor archived.
    pub open_parents: bool,
    pub goal_mode: bool,
    /// The card ran before: processes of its earlier runs may still live.
    pub ran_before: bool,
}

/// What a claim does with a card.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ClaimVerdict {
    /// Claim it.
    Claim,
    /// A ready card whose parents are not all done: back to `todo`
    /// ([`reject_claim_for_parents`]).
    WaitForParents,
    /// Leave it: not ready, claimed, held, not due yet, another agent's, or
    /// an id no kanban writes.
    Pass,
}

/// Whether a claim takes `card` at `now`: a ready, unclaimed card, not
/// held, whose parents are done; a dispatcher's claim also waits for its
/// `not_before` and takes only the cards `filter` admits, while a claim by
/// hand takes the card it names whatever its time. An id no kanban writes
/// (`../x`) is never claimed: ids name log files and reach workers'
/// environments.
pub fn claim_verdict(
    card: &ClaimCandidate,
    now: i64,
    filter: &crate::ClaimFilter,
    by_hand: bool,
) -> ClaimVerdict {
    let waiting = !by_hand
        && (card.not_before.is_some_and(|at| at > now) || !filter.admits(card.assignee.as_deref()));
    if !matches!(card.status, Some(TaskStatus::Ready | TaskStatus::Review))
        || card.claimed
        || card.held
        || waiting
        || !crate::is_valid_task_id(&card.task_id)
    {
        return ClaimVerdict::Pass;
    }
    if card.open_parents && card.status == Some(TaskStatus::Ready) {
        ClaimVerdict::WaitForParents
    } else {
        ClaimVerdict::Claim
    }
}

/// The order claims take ready cards in: higher priority first, then the
/// oldest, then the first added.
pub fn claim_order(a: &ClaimCandidate, b: &ClaimCandidate) -> std::cmp::Ordering {
    b.priority
        .cmp(&a.priority)
        .then(a.created_at.cmp(&b.created_at))
        .then(a.place.cmp(&b.place))
}

/// A claim attempt on a ready card with an open parent sends it back to
/// `todo`, with the reason recorded.
pub fn reject_claim_for_parents() -> Transition {
    Transition {
        status: Some(TaskStatus::Todo),
        events: vec![NewEvent::new(
            "claim_rejected",
            None,
            json!({"reason": "parents_not_done"}),
        )],
        ..Transition::default()
    }
}

/// The events a new card is created with.
pub fn creation_events(
    status: TaskStatus,
    parents: &[String],
    assignee: Option<&str>,
) -> Vec<NewEvent> {
    let mut events = vec![NewEvent::new(
        "created",
        None,
        json!({"status": status.as_str(), "parents": parents, "assignee": assignee}),
    )];
    match status {
        TaskStatus::Blocked => events.push(NewEvent::new(
            "blocked",
            None,
            json!({"reason": "initial_status"}),
        )),
        TaskStatus::Todo => events.push(NewEvent::new(
            "dependency_wait",
            None,
            json!({"reason": "parent_not_done"}),
        )),
        _ => {}
    }
    events
}

/// The `claimed` event of a new claim.
pub fn claimed_event(claim: &Claim, expires: i64, ttl: i64) -> NewEvent {
    NewEvent::new(
        "claimed",
        Some(claim.run_id),
        json!({"lock": claim.claim_lock, "expires": expires, "run_id": claim.run_id, "ttl": ttl}),
    )
}

fn refuse(card: &CardState, action: &'static str) -> BoardError {
    BoardError::InvalidTransition {
        task_id: card.task_id.clone(),
        status: card.status.as_str().to_owned(),
        action: action.into(),
    }
}

/// An operator's cancel: the card leaves every lane (archived) with why. A
/// running card's run closes as `cancelled` and its claim is released, so
/// its worker is fenced out and its dispatcher stops it and its agent.
pub fn cancel(card: &CardState, reason: &str) -> Result<Transition, BoardError> {
    if matches!(card.status, TaskStatus::Done | TaskStatus::Archived) {
        return Err(refuse(card, "cancel"));
    }
    let running = card.status == TaskStatus::Running;
    Ok(Transition {
        close_run: running.then(|| RunClose {
            status: "cancelled".to_owned(),
            outcome: "cancelled".to_owned(),
            summary: None,
            error: Some(format!("cancelled: {reason}")),
            metadata: None,
        }),
        release_claim: running,
        status: Some(TaskStatus::Archived),
        not_before: Change::Clear,
        held: Change::Clear,
        events: vec![NewEvent::new(
            "cancelled",
            card.current_run_id.filter(|_| running),
            json!({"reason": reason, "was": card.status.as_str()}),
        )],
        ..Transition::default()
    })
}

/// An operator's archive of a card nobody works: out of every lane; a
/// running card is cancelled first (`kanban cancel`).
pub fn archive(card: &CardState) -> Result<Transition, BoardError> {
    if matches!(card.status, TaskStatus::Running | TaskStatus::Archived) {
        return Err(refuse(card, "archive"));
    }
    Ok(Transition {
        status: Some(TaskStatus::Archived),
        not_before: Change::Clear,
        held: end_hold(card),
        events: vec![NewEvent::new(
            "archived",
            None,
            json!({"was": card.status.as_str()}),
        )],
        ..Transition::default()
    })
}

/// An operator's hold of a card waiting for its turn (ready, todo or
/// parked): it is parked in `scheduled`, where neither system claims it,
/// until released.
pub fn hold(card: &CardState, reason: &str) -> Result<Transition, BoardError> {
    if !matches!(
        card.status,
        TaskStatus::Ready | TaskStatus::Todo | TaskStatus::Scheduled
    ) || card.held
    {
        return Err(refuse(card, if card.held { "hold again" } else { "hold" }));
    }
    Ok(Transition {
        status: Some(TaskStatus::Scheduled),
        held: Change::Set(reason.to_owned()),
        events: vec![NewEvent::new("held", None, json!({"reason": reason}))],
        ..Transition::default()
    })
}

/// What taking a provider wall down by hand does to the card that met it
/// last (`source` of the wall, run `run`): an event on its history, and,
/// while it waits for its turn (ready or todo), the end of the hold that
/// the wall's booking left on it (`not_before`), so it is claimable at once.
pub fn lift_wall(card: &CardState, scope: &str, run: Option<i64>) -> Transition {
    let waiting = matches!(card.status, TaskStatus::Ready | TaskStatus::Todo);
    Transition {
        not_before: if waiting { Change::Clear } else { Change::Keep },
        events: vec![crate::events::wall_lifted_by_operator(scope, run)],
        ..Transition::default()
    }
}

/// Releases an operator's hold: the card goes back in line, or stays
/// parked while its time (`not_before`) is still to come.
pub fn release_hold(card: &CardState, now: i64) -> Result<Transition, BoardError> {
    if !card.held {
        return Err(BoardError::InvalidInput(format!(
            "{} is not held; nothing to release",
            card.task_id
        )));
    }
    let due_later = card.not_before.is_some_and(|at| at > now);
    let landing = (card.status == TaskStatus::Scheduled && !due_later)
        .then(|| requeue_landing(card.open_parents));
    Ok(Transition {
        status: landing,
        held: Change::Clear,
        events: vec![NewEvent::new("released", None, json!({}))],
        ..Transition::default()
    })
}

/// An operator's edit of a card that is not archived (a running card's
/// run goes on; the next run reads the new fields). A handoff's result,
/// summary and metadata change only on a done card, as the seed system's
/// `edit` backfills them.
pub fn edit(card: &CardState, edit: &CardEdit) -> Result<Transition, BoardError> {
    if card.status == TaskStatus::Archived {
        return Err(refuse(card, "edit"));
    }
    let fields = edit.fields();
    if fields.is_empty() {
        return Err(BoardError::InvalidInput(
            "nothing to edit: give at least one of --title, --body, --priority, --assignee, --tenant, --max-retries, --max-runtime, --result, --summary, --metadata, --workspace"
                .to_owned(),
        ));
    }
    if edit.changes_handoff() && card.status != TaskStatus::Done {
        return Err(BoardError::InvalidInput(format!(
            "--result, --summary and --metadata change a done card's handoff, and {} is {}; the run that completes it sets them",
            card.task_id,
            card.status.as_str()
        )));
    }
    crate::events::check_metadata(edit.metadata.as_ref())?;
    if let Some(workspace) = &edit.workspace {
        // A run works in the workspace its card named as it started: one
        // running, or done, keeps it.
        if matches!(card.status, TaskStatus::Running | TaskStatus::Done) {
            return Err(BoardError::InvalidInput(format!(
                "{} is {}, and its run works or worked in its workspace: a workspace changes for a card whose next run has not started (reclaim a running one first)",
                card.task_id,
                card.status.as_str()
            )));
        }
        crate::workspaces::check_workspace(&workspace.spec, workspace.branch.as_deref())
            .map_err(|problem| BoardError::InvalidInput(problem.to_string()))?;
    }
    // A tenant is a label as `add` takes it: one plain line, bounded.
    if let Change::Set(tenant) = &edit.tenant {
        crate::events::check_label(tenant)
            .map_err(|problem| BoardError::InvalidInput(format!("a card's tenant {problem}")))?;
    }
    if edit
        .title
        .as_deref()
        .is_some_and(|title| title.trim().is_empty())
    {
        return Err(BoardError::InvalidInput(
            "a task needs a non-blank title".to_owned(),
        ));
    }
    Ok(Transition {
        edit: Some(edit.clone()),
        events: vec![NewEvent::new("edited", None, json!({"fields": fields}))],
        ..Transition::default()
    })
}

/// When the next occurrence of a card recurring every `every` seconds
/// (scheduled at `scheduled_at`) is due: the first period boundary after
/// `now`, so a late finish never starts a burst of catch-up cards.
pub fn next_occurrence(scheduled_at: i64, every: i64, now: i64) -> i64 {
    let every = every.max(1);
    // Not due yet: the period after this one; late: past now.
    let periods = now.saturating_sub(scheduled_at).max(0) / every + 1;
    scheduled_at.saturating_add(periods.saturating_mul(every))
}

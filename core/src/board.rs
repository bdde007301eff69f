//! What a dispatcher and an operator need from a board, beyond a worker's port.

use async_trait::async_trait;

use crate::data::{BoardError, CardStatus, Claim, TaskStatus};
use crate::env::{Environment, vars};

/// The lease a claim gets when nobody asks for another.
pub const DEFAULT_CLAIM_TTL_SECONDS: i64 = 15 * 60;

/// The longest lease a claim may get: a day. A longer one would hold a card
/// whose worker died for longer than anyone waits.
pub const MAX_CLAIM_TTL_SECONDS: i64 = 24 * 3600;

/// The claim TTL: an explicit value, else `HERMES_KANBAN_CLAIM_TTL_SECONDS`
/// (or `KANBAN_CLAIM_TTL_SECONDS`),
/// else 900. A value outside 1..=[`MAX_CLAIM_TTL_SECONDS`] is refused with a
/// message naming where it came from, never silently changed.
pub fn claim_ttl_seconds(explicit: Option<i64>, env: &Environment) -> Result<i64, String> {
    let in_range = |ttl: i64| (1..=MAX_CLAIM_TTL_SECONDS).contains(&ttl);
    if let Some(ttl) = explicit {
        return if in_range(ttl) {
            Ok(ttl)
        } else {
            Err(format!(
                "--ttl {ttl}: a lease is 1 to {MAX_CLAIM_TTL_SECONDS} seconds"
            ))
        };
    }
    match env.get_trimmed(vars::CLAIM_TTL_SECONDS) {
        None => Ok(DEFAULT_CLAIM_TTL_SECONDS),
        Some(raw) => raw.parse::<i64>().ok().filter(|ttl| in_range(*ttl)).ok_or_else(|| {
            format!(
                "{} is {raw:?}: it must be a whole number of seconds from 1 to {MAX_CLAIM_TTL_SECONDS}, or unset",
                vars::both_names(vars::CLAIM_TTL_SECONDS)
            )
        }),
    }
}

/// How often a worker heartbeats while a turn runs: a third of the lease, so
/// two heartbeats may be lost before it lapses, and at least once a minute.
pub fn heartbeat_interval_seconds(ttl_seconds: i64) -> u64 {
    u64::try_from((ttl_seconds / 3).clamp(1, 60)).unwrap_or(60)
}

/// A card to create.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct NewTask {
    pub title: String,
    pub body: Option<String>,
    pub assignee: Option<String>,
    pub priority: i64,
    pub parents: Vec<String>,
    pub goal_mode: bool,
    pub goal_max_turns: Option<u32>,
    pub max_retries: Option<u32>,
    /// A second create with the same key returns the first card's id.
    pub idempotency_key: Option<String>,
    /// Where it starts: in line (`ready`/`todo`), `blocked` or `triage`.
    pub start: crate::rules::Start,
    /// The longest a run of this card may take, in seconds.
    pub max_runtime_seconds: Option<i64>,
    /// Not claimed before this time (epoch seconds).
    pub not_before: Option<i64>,
    /// Recurs: when it is done, the next card is due one period after this
    /// one was (never two at once).
    pub every_seconds: Option<i64>,
    /// Who made it: a worker's card made from inside its run names the
    /// run card's assignee (the seed system's `created_by`).
    pub created_by: Option<String>,
    /// The namespace it belongs to (the seed system's `tenant`).
    pub tenant: Option<String>,
    /// Where its agent works (`None`: a scratch folder of its own);
    /// [`crate::workspaces`].
    pub workspace: Option<crate::workspaces::WorkspaceSpec>,
    /// The branch of its worktree (default `wt/ID`).
    pub branch: Option<String>,
}

/// What a worker hands over when it completes its card.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Handoff {
    /// What was done, in a line or two.
    pub summary: String,
    /// The result itself, when there is one to keep.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    /// Facts for whoever reads the run (changed files, tests run…), kept
    /// on the run as the seed system keeps them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<serde_json::Map<String, serde_json::Value>>,
    /// The cards the run says it made: each must be one it did make
    /// ([`crate::rules::verify_created_cards`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub created_cards: Vec<String>,
}

impl Handoff {
    /// A handoff of a summary and a result only.
    pub fn new(summary: impl Into<String>, result: Option<String>) -> Self {
        Self {
            summary: summary.into(),
            result,
            ..Self::default()
        }
    }
}

/// The largest run metadata a board takes, as JSON text.
pub const MAX_METADATA_BYTES: usize = 64 * 1024;

/// A claim just taken.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimGrant {
    pub claim: Claim,
    pub claim_expires: i64,
    /// The card runs in goal mode.
    pub goal_mode: bool,
    /// The card ran before: processes of its earlier runs may still live.
    pub rerun: bool,
    /// The card's assignee, which picks its agent.
    pub assignee: Option<String>,
    /// The card's title, for the dispatcher's log.
    pub title: String,
}

/// A card as stored.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TaskRecord {
    pub id: String,
    pub title: String,
    pub body: Option<String>,
    pub assignee: Option<String>,
    pub status: CardStatus,
    pub priority: i64,
    pub created_at: i64,
    pub claim_lock: Option<String>,
    pub claim_expires: Option<i64>,
    pub current_run_id: Option<i64>,
    pub worker_pid: Option<i64>,
    pub goal_mode: bool,
    pub goal_max_turns: Option<u32>,
    pub max_retries: Option<u32>,
    pub consecutive_failures: u32,
    pub result: Option<String>,
    /// The card is not claimed before this time (a backoff, a cooldown).
    pub not_before: Option<i64>,
    pub last_failure_error: Option<String>,
    pub last_heartbeat_at: Option<i64>,
    pub max_runtime_seconds: Option<i64>,
    /// Why an operator holds it (`kanban hold`); `None`: not held.
    pub held_reason: Option<String>,
    /// It recurs with this period.
    pub every_seconds: Option<i64>,
    /// The kind of its last block (`needs_input`, `dependency`…), as
    /// stored; none for an untyped block.
    #[serde(default)]
    pub block_kind: Option<String>,
    /// Who made it: for a card a worker made from inside its run, the
    /// assignee of the run's card.
    #[serde(default)]
    pub created_by: Option<String>,
    /// The namespace it belongs to (the seed system's `tenant`).
    #[serde(default)]
    pub tenant: Option<String>,
    /// Where its agent works, when not in a scratch folder of its own (the
    /// seed system's `workspace_kind`, `workspace_path`, `branch_name`;
    /// [`crate::workspaces`]). Boxed: most cards have none, and a page of
    /// cards is read whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<Box<crate::workspaces::CardWorkspace>>,
}

impl TaskRecord {
    /// Its workspace's kind: `scratch`, `dir` or `worktree`.
    pub fn workspace_kind(&self) -> &str {
        self.workspace
            .as_ref()
            .map_or(crate::workspaces::WorkspaceKind::Scratch.as_str(), |w| {
                &w.kind
            })
    }

    /// The folder, repository or worktree of its workspace, as given.
    pub fn workspace_path(&self) -> Option<&str> {
        self.workspace.as_ref().and_then(|w| w.path.as_deref())
    }

    /// The branch of its worktree, when it names one.
    pub fn branch_name(&self) -> Option<&str> {
        self.workspace.as_ref().and_then(|w| w.branch.as_deref())
    }
}

/// A run (one claim of a card) as stored.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RunRecord {
    pub id: i64,
    pub task_id: String,
    pub status: String,
    pub claim_lock: Option<String>,
    pub claim_expires: Option<i64>,
    pub worker_pid: Option<i64>,
    /// The worker process's start time, as the dispatcher recorded it.
    pub worker_started_at: Option<i64>,
    pub started_at: i64,
    pub ended_at: Option<i64>,
    pub outcome: Option<String>,
    pub summary: Option<String>,
    pub error: Option<String>,
    /// What the worker handed over besides its summary
    /// ([`Handoff::metadata`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<serde_json::Value>,
}

/// An event as stored.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EventRecord {
    pub id: i64,
    pub task_id: String,
    pub run_id: Option<i64>,
    pub kind: String,
    pub payload: serde_json::Value,
    pub created_at: i64,
}

/// A card with its runs and events, oldest first.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TaskView {
    pub task: TaskRecord,
    /// The cards this one waits for.
    pub parents: Vec<String>,
    /// The cards that wait for this one.
    #[serde(default)]
    pub children: Vec<String>,
    pub runs: Vec<RunRecord>,
    pub events: Vec<EventRecord>,
    /// The newest [`COMMENTS_SHOWN`] comments, newest last.
    pub comments: Vec<CommentRecord>,
    /// The files attached to it, oldest first.
    #[serde(default)]
    pub attachments: Vec<crate::attachments::AttachmentRecord>,
}

/// Comments a card view carries (the newest; older ones stay on the board).
pub const COMMENTS_SHOWN: usize = 50;
/// The longest comment a board takes, in bytes.
pub const MAX_COMMENT_BYTES: usize = 16 * 1024;

/// A comment on a card: from a human steering its agent, or from the agent.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CommentRecord {
    pub id: i64,
    pub author: String,
    pub body: String,
    pub created_at: i64,
}

/// The dispatcher's and operator's side of a board. Kept apart from
/// [`crate::Board`] so a worker depends on no more than it uses.
#[async_trait]
pub trait BoardAdmin: Send + Sync {
    /// Creates a card; returns its id (or the existing id for a repeated idempotency key).
    async fn create_task(&self, task: &NewTask) -> Result<String, BoardError>;
    /// Claims one `ready` card. `Ok(None)` when somebody else holds it or it is not ready.
    async fn claim_task(
        &self,
        task_id: &str,
        ttl_seconds: i64,
        claim_lock: &str,
    ) -> Result<Option<ClaimGrant>, BoardError>;
    /// Moves a blocked card back to `ready` (or `todo` while a parent is open).
    async fn unblock(&self, task_id: &str) -> Result<(), BoardError>;
    /// Adds a comment from outside any run (a human steering the card's
    /// agent between runs); event `commented`.
    async fn add_comment(&self, task_id: &str, author: &str, text: &str) -> Result<(), BoardError>;
    /// Cancels a card ([`crate::rules::cancel`]): archived with why; a
    /// running card's run closes and its worker is fenced out.
    async fn cancel(&self, task_id: &str, reason: &str) -> Result<(), BoardError>;
    /// Archives a card nobody works ([`crate::rules::archive`]).
    async fn archive(&self, task_id: &str) -> Result<(), BoardError>;
    /// Holds a ready, todo or scheduled card: parked in `scheduled`, not
    /// claimed until released ([`crate::rules::hold`]).
    async fn hold(&self, task_id: &str, reason: &str) -> Result<(), BoardError>;
    /// Releases a held card ([`crate::rules::release_hold`]).
    async fn release_hold(&self, task_id: &str) -> Result<(), BoardError>;
    /// Parks a card in `scheduled` until `not_before`, or until an unblock
    /// ([`crate::rules::schedule`]).
    async fn schedule(
        &self,
        task_id: &str,
        reason: Option<&str>,
        not_before: Option<i64>,
    ) -> Result<(), BoardError>;
    /// Promotes a card by hand ([`crate::rules::promote_by_hand`]); with
    /// `dry_run`, only says whether it would, changing nothing.
    async fn promote(
        &self,
        task_id: &str,
        reason: Option<&str>,
        force: bool,
        dry_run: bool,
    ) -> Result<(), BoardError>;
    /// Sends a card nobody works to `triage` ([`crate::rules::to_triage`]).
    async fn triage(&self, task_id: &str, reason: Option<&str>) -> Result<(), BoardError>;
    /// Puts a card nobody works up for review ([`crate::rules::to_review`]).
    async fn review(&self, task_id: &str, reason: Option<&str>) -> Result<(), BoardError>;
    /// Edits a card's fields ([`crate::rules::edit`]).
    async fn edit(&self, task_id: &str, edit: &crate::rules::CardEdit) -> Result<(), BoardError>;
    /// Stores a notification subscription; its id.
    async fn subscribe(&self, new: &crate::notify::NewSubscription) -> Result<i64, BoardError>;
    /// The subscriptions, with their notifications' counts.
    async fn subscriptions(&self) -> Result<Vec<crate::notify::SubscriptionView>, BoardError>;
    /// Removes a subscription; false when there is none of that id.
    async fn unsubscribe(&self, id: i64) -> Result<bool, BoardError>;
    /// Leases up to `count` due notifications to `owner` for `lease_seconds`.
    async fn lease_notifications(
        &self,
        owner: &str,
        lease_seconds: i64,
        count: usize,
    ) -> Result<Vec<crate::notify::Delivery>, BoardError>;
    /// Holds a leased notification `lease_seconds` more before it is sent;
    /// false when `owner` lost it.
    async fn renew_notification(
        &self,
        outbox_id: i64,
        owner: &str,
        lease_seconds: i64,
    ) -> Result<bool, BoardError>;
    /// Records an attempt at a notification `owner` holds; false when it
    /// lost its lease.
    async fn settle_notification(
        &self,
        outbox_id: i64,
        owner: &str,
        result: &crate::notify::DeliveryResult,
    ) -> Result<bool, BoardError>;
    /// Writes an agent's plan for a card in triage in one transaction
    /// ([`crate::triage`]): the cards it made, in plan order, and where the
    /// card went.
    async fn settle_triage(
        &self,
        task_id: &str,
        plan: &crate::triage::TriagePlan,
        agent: &str,
        author: &str,
    ) -> Result<crate::triage::Settled, BoardError>;
    /// Makes a swarm ([`crate::swarm`]) in one transaction; its cards, or
    /// the first swarm's for a repeated idempotency key.
    async fn create_swarm(
        &self,
        swarm: &crate::swarm::Swarm,
    ) -> Result<crate::swarm::Swarmed, BoardError>;
    /// Deletes done and archived cards whose last event is older than
    /// `before`, with their runs, events, comments and links; returns their
    /// ids (their logs are the caller's to remove). `dry_run` deletes nothing.
    async fn prune(&self, before: i64, dry_run: bool) -> Result<Vec<String>, BoardError>;
    /// Deletes the events older than `before` of the cards that are done
    /// or archived (the seed system's `gc`); how many.
    async fn gc_events(&self, before: i64) -> Result<u64, BoardError>;
    /// Lifts the provider wall of `scope` by hand (event `wall_lifted` on
    /// the card that met it last); false when no such wall stands.
    async fn lift_wall(&self, scope: &str) -> Result<bool, BoardError>;
    /// Takes a running card back from its worker: the run closes as
    /// `reclaimed`, the card is ready again (todo while a parent is open)
    /// and its failure count is reset.
    async fn reclaim(&self, task_id: &str, reason: &str) -> Result<(), BoardError>;
    /// Records a file already written for a card (event `attached`); its id.
    async fn add_attachment(
        &self,
        task_id: &str,
        new: &crate::attachments::NewAttachment,
    ) -> Result<i64, BoardError>;
    /// The files attached to a card, oldest first (every card's, with none).
    async fn attachments(
        &self,
        task_id: Option<&str>,
    ) -> Result<Vec<crate::attachments::AttachmentRecord>, BoardError>;
    /// Deletes an attachment's row (event `attachment_removed`); the row it
    /// was, whose file the caller removes; `None` when there was none.
    async fn remove_attachment(
        &self,
        id: i64,
    ) -> Result<Option<crate::attachments::AttachmentRecord>, BoardError>;
    /// A card with its runs and events.
    async fn show_task(&self, task_id: &str) -> Result<TaskView, BoardError>;
    /// Every card, optionally of one status, oldest first.
    async fn list_tasks(&self, status: Option<TaskStatus>) -> Result<Vec<TaskRecord>, BoardError>;
    /// One page of cards in the order they were added, optionally of one
    /// status: at most `limit` of them, those after the card whose place
    /// is `after` (the [`TaskPage::next`] of the page before).
    async fn list_page(
        &self,
        status: Option<TaskStatus>,
        after: Option<i64>,
        limit: usize,
    ) -> Result<TaskPage, BoardError>;
    /// The newest `limit` events of the whole board, newest last.
    async fn recent_events(&self, limit: usize) -> Result<Vec<EventRecord>, BoardError>;
    /// Makes `child` wait for `parent` ([`crate::rules::link`]); false when
    /// it waited for it already.
    async fn link(&self, parent: &str, child: &str) -> Result<bool, BoardError>;
    /// Ends `child`'s wait for `parent` ([`crate::rules::unlinked`]); false
    /// when it did not wait for it.
    async fn unlink(&self, parent: &str, child: &str) -> Result<bool, BoardError>;
    /// Every link of the board, as `(parent, child)` pairs, sorted.
    async fn links(&self) -> Result<Vec<(String, String)>, BoardError>;
    /// The newest run of each card that has run, by card id.
    async fn last_runs(&self) -> Result<std::collections::BTreeMap<String, i64>, BoardError>;
    /// The exit code booked by the worker holding `claim`: the newest
    /// `worker_result` whose claim lock matches, else 1.
    async fn booked_exit_code(&self, claim: &Claim) -> Result<i32, BoardError>;
}

/// One page of a listing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TaskPage {
    pub tasks: Vec<TaskRecord>,
    /// Where the next page starts, when there are more cards.
    pub next: Option<i64>,
}

impl TaskPage {
    /// A page from `limit + 1` rows read with their places: the extra row
    /// only says that there is a next page.
    pub fn from_rows(mut rows: Vec<(i64, TaskRecord)>, limit: usize) -> Self {
        let more = rows.len() > limit;
        rows.truncate(limit);
        let next = more.then(|| rows.last().map(|(place, _)| *place)).flatten();
        Self {
            tasks: rows.into_iter().map(|(_, task)| task).collect(),
            next,
        }
    }
}

/// Counts across a board, for metrics: each a label and a count.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BoardStats {
    pub cards_by_status: Vec<(String, i64)>,
    pub runs_by_outcome: Vec<(String, i64)>,
    /// Booked worker exits by exit code (`none` when killed by a signal).
    pub exits_by_code: Vec<(String, i64)>,
    /// In-place recovery attempts the workers authorised, summed.
    pub recovery_attempts: i64,
    /// Runs that recovered in place at least once and then completed.
    pub recovered_runs: i64,
    /// Claims released because their lease ran out (not by an operator).
    pub stale_releases: i64,
    /// Worker writes refused because the writer no longer held the claim.
    pub stale_writes_rejected: i64,
    /// Provider walls standing, and those holding cards now.
    pub walls: i64,
    pub walls_holding: i64,
    /// Every dispatcher's ticks: a count per bucket of
    /// [`kanban_core::TICK_BUCKETS_MS`] (then the longer ones), and the sum
    /// of their milliseconds.
    pub tick_buckets: Vec<i64>,
    pub tick_sum_ms: i64,
}

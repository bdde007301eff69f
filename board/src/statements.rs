//! The board's tables, read and written: every statement both engines run,
//! written once (each in words both dialects read alike, `$N` bound in the
//! order they first appear), with the words that differ taken from the
//! engine's [`Dialect`].

use std::collections::{BTreeMap, HashMap};

use kanban_core::attachments::{AttachmentRecord, NewAttachment};
use kanban_core::lease::{LeaseView, RunLease, TaskLease};
use kanban_core::notify::{
    AfterFailure, Delivery, DeliveryResult, NewSubscription, NotifiedCard, SubscriptionView,
};
use kanban_core::rules::{
    CardEdit, CardState, Change, ClaimCandidate, MadeCard, NewEvent, RunRow, Transition,
};
use kanban_core::walls::{Wall, WallChange, WallKind};
use kanban_core::{
    BoardError, BoardStats, CardStatus, Claim, ClaimFilter, CommentRecord, DispatcherReport,
    EventRecord, NewTask, ProofIdentity, RunRecord, RunningWorker, TaskRecord, TaskStatus,
    TaskView, TickDurations, WorkerProcess,
};
use serde_json::Value;

use crate::args;
use crate::engine::{Param, Row, Sql, Turns, TxResult};

const TASK_COLUMNS: &str = "id, title, body, assignee, status, priority, created_at, claim_lock, \
    claim_expires, current_run_id, worker_pid, goal_mode, goal_max_turns, max_retries, \
    consecutive_failures, result, not_before, last_failure_error, last_heartbeat_at, max_runtime_seconds, \
    held_reason, every_seconds, block_kind, created_by, tenant, workspace_kind, workspace_path, \
    branch_name";
const RUN_COLUMNS: &str = "id, task_id, status, claim_lock, claim_expires, worker_pid, \
    started_at, ended_at, outcome, summary, error, worker_started_at, metadata";
const EVENT_COLUMNS: &str = "id, task_id, run_id, kind, payload, created_at";
const WALL_COLUMNS: &str =
    "scope, kind, route, since, until, reason, source, hits, failed_probes, probe_run";
/// A parent that is neither done nor archived keeps its children waiting.
const OPEN_PARENT: &str = "EXISTS (SELECT 1 FROM task_links l JOIN tasks p ON p.id = l.parent_id \
    WHERE l.child_id = t.id AND p.status NOT IN ('done', 'archived'))";

/// A run to open: what a claim writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunOpening {
    pub task_id: String,
    pub claim_lock: String,
    pub expires: i64,
    pub started_at: i64,
    /// The lease's length, kept with the run for its heartbeats.
    pub ttl: i64,
    /// Who the run is for (the card's assignee).
    pub profile: Option<String>,
}

/// A lane of the board, as a page lists it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Lane {
    /// The cards of one status: in claim order; done cards newest first.
    Status(TaskStatus),
    /// The cards of statuses this build does not know, oldest first.
    Unknown,
}

/// Which cards of a lane a page shows: each given field narrows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct LaneFilter {
    /// A piece of the title (any case; `%` and `_` as themselves), or the
    /// card's whole id.
    pub text: Option<String>,
    pub assignee: Option<String>,
    pub tenant: Option<String>,
    /// The kind of the card's last block (`needs_input`, `capability`, …).
    pub block_kind: Option<String>,
    /// Cards of any of these assignees (`""`: a card with none).
    pub assignees: Option<Vec<String>>,
}

impl LaneFilter {
    /// True when it narrows nothing.
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

/// The most cards of a lane a view counts, and a filter searches (the
/// first ones, in the lane's order): a view of a lane of a million cards
/// reads no more of it than this.
pub const LANE_WINDOW: usize = 10_000;

/// A page of a lane, as a view shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LanePage {
    /// How many cards the lane holds (filtered: how many of its first
    /// [`LANE_WINDOW`] match), at most [`LANE_WINDOW`].
    pub count: usize,
    /// The lane holds more than [`LANE_WINDOW`] cards: the count stopped
    /// there, and a filter searched only those.
    pub more: bool,
    pub cards: Vec<TaskRecord>,
}

/// What a host's dispatcher last said of itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DispatcherSeen {
    pub host: String,
    /// When (epoch seconds).
    pub reported_at: i64,
    /// Its workers alive then.
    pub in_flight: i64,
    /// `claiming`, `paused`, `halted`, `stopping` or `stopped`.
    pub state: String,
    /// Why it was paused or halted.
    pub why: Option<String>,
}

/// What a board page's health line shows, read at once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BoardHealth {
    pub walls: Vec<kanban_core::walls::Wall>,
    /// When the board's last event was written.
    pub last_activity: Option<i64>,
    pub dispatchers: Vec<DispatcherSeen>,
}

/// The newest event of each of some cards: its kind and time.
pub type LastEvents = HashMap<String, (String, i64)>;

/// The query of the rows a lease proof and a fence read, one `$1`: the
/// card's id. An engine's proof runs it on a connection of its own.
pub fn lease_query(identity: ProofIdentity) -> String {
    let bound = match identity {
        ProofIdentity::BoundOwner(_) => {
            "(SELECT e.payload FROM task_events e WHERE e.task_id = t.id AND e.kind = 'worker_bound'
               ORDER BY e.id DESC LIMIT 1)"
        }
        _ => "NULL",
    };
    format!(
        "SELECT t.status, t.worker_pid, t.current_run_id, t.claim_lock, t.claim_expires,
                r.id, r.ended_at, r.worker_pid, r.claim_expires, {bound}
           FROM tasks t LEFT JOIN task_runs r ON r.id = t.current_run_id WHERE t.id = $1"
    )
}

/// The lease view of [`lease_query`]'s row (none: no such card).
pub fn lease_from_row(row: Option<&Row>) -> TxResult<LeaseView> {
    let Some(row) = row else {
        return Ok(LeaseView {
            task: None,
            run: None,
            newest_bound: None,
        });
    };
    let run = match row.opt_int(5)? {
        None => None,
        Some(_) => Some(RunLease {
            ended_at: row.opt_int(6)?,
            worker_pid: row.opt_int(7)?,
            claim_expires: row.opt_int(8)?,
        }),
    };
    // A binding that names no pid binds no process: as good as none.
    let newest_bound = row.json(9)?.and_then(|payload| {
        Some((
            payload["pid"].as_i64()?,
            payload["claim_lock"].as_str().unwrap_or("").to_owned(),
        ))
    });
    Ok(LeaseView {
        task: Some(TaskLease {
            status: row.opt_text(0)?.unwrap_or_default(),
            worker_pid: row.opt_int(1)?,
            current_run_id: row.opt_int(2)?,
            claim_lock: row.opt_text(3)?,
            claim_expires: row.opt_int(4)?,
        }),
        run,
        newest_bound,
    })
}

fn limit(rows: usize) -> i64 {
    i64::try_from(rows).unwrap_or(i64::MAX)
}

/// A card read from the columns [`TASK_COLUMNS`] names, from column `at` on.
fn task_at(row: &Row, at: usize) -> TxResult<TaskRecord> {
    Ok(TaskRecord {
        id: row.text(at)?,
        title: row.text(at + 1)?,
        body: row.opt_text(at + 2)?,
        assignee: row.opt_text(at + 3)?,
        status: CardStatus::parse(&row.text(at + 4)?),
        priority: row.opt_int(at + 5)?.unwrap_or(0),
        created_at: row.int(at + 6)?,
        claim_lock: row.opt_text(at + 7)?,
        claim_expires: row.opt_int(at + 8)?,
        current_run_id: row.opt_int(at + 9)?,
        worker_pid: row.opt_int(at + 10)?,
        goal_mode: row.flag(at + 11)?,
        goal_max_turns: row.opt_count(at + 12)?,
        max_retries: row.opt_count(at + 13)?,
        consecutive_failures: row.count(at + 14)?,
        result: row.opt_text(at + 15)?,
        not_before: row.opt_int(at + 16)?,
        last_failure_error: row.opt_text(at + 17)?,
        last_heartbeat_at: row.opt_int(at + 18)?,
        max_runtime_seconds: row.opt_int(at + 19)?,
        held_reason: row.opt_text(at + 20)?,
        every_seconds: row.opt_int(at + 21)?,
        block_kind: row.opt_text(at + 22)?,
        created_by: row.opt_text(at + 23)?,
        tenant: row.opt_text(at + 24)?,
        workspace: kanban_core::workspaces::CardWorkspace::from_columns(
            row.opt_text(at + 25)?,
            row.opt_text(at + 26)?,
            row.opt_text(at + 27)?,
        ),
    })
}

fn task(row: &Row) -> TxResult<TaskRecord> {
    task_at(row, 0)
}

fn run(row: &Row) -> TxResult<RunRecord> {
    Ok(RunRecord {
        id: row.int(0)?,
        task_id: row.text(1)?,
        status: row.text(2)?,
        claim_lock: row.opt_text(3)?,
        claim_expires: row.opt_int(4)?,
        worker_pid: row.opt_int(5)?,
        started_at: row.int(6)?,
        ended_at: row.opt_int(7)?,
        outcome: row.opt_text(8)?,
        summary: row.opt_text(9)?,
        error: row.opt_text(10)?,
        worker_started_at: row.opt_int(11)?,
        metadata: row.json(12)?,
    })
}

fn event(row: &Row) -> TxResult<EventRecord> {
    Ok(EventRecord {
        id: row.int(0)?,
        task_id: row.text(1)?,
        run_id: row.opt_int(2)?,
        kind: row.text(3)?,
        payload: row.json(4)?.unwrap_or(Value::Null),
        created_at: row.int(5)?,
    })
}

/// A subscription's SMTP settings, from its options; none when they are
/// not there or not readable.
fn smtp_of(options: Option<Value>) -> Option<kanban_core::notify::SmtpSettings> {
    serde_json::from_value(options?.get("smtp")?.clone()).ok()
}

/// A wall; a kind this build does not know reads as a credential wall
/// (the wider one: it holds more, never less).
fn wall(row: &Row) -> TxResult<Wall> {
    Ok(Wall {
        scope: row.text(0)?,
        kind: WallKind::parse(&row.text(1)?).unwrap_or(WallKind::Credential),
        route: row.text(2)?,
        since: row.int(3)?,
        until: row.int(4)?,
        reason: row.text(5)?,
        source: row.text(6)?,
        hits: row.count(7)?,
        failed_probes: row.count(8)?,
        probe_run: row.opt_int(9)?,
    })
}

/// What a claim reads of a card (the `tasks t` of [`Tx::candidates`]).
fn candidate_query(place: &str) -> String {
    format!(
        "SELECT t.id, t.status, t.claim_lock IS NOT NULL, t.held_reason IS NOT NULL, t.not_before,
                t.assignee, t.priority, t.created_at, t.{place}, {OPEN_PARENT}, t.goal_mode,
                EXISTS (SELECT 1 FROM task_runs r WHERE r.task_id = t.id), t.title
           FROM tasks t"
    )
}

fn candidate(row: &Row) -> TxResult<ClaimCandidate> {
    Ok(ClaimCandidate {
        task_id: row.text(0)?,
        status: TaskStatus::parse(&row.text(1)?),
        claimed: row.flag(2)?,
        held: row.flag(3)?,
        not_before: row.opt_int(4)?,
        assignee: row.opt_text(5)?,
        priority: row.opt_int(6)?.unwrap_or(0),
        created_at: row.int(7)?,
        place: row.int(8)?,
        open_parents: row.flag(9)?,
        goal_mode: row.flag(10)?,
        ran_before: row.flag(11)?,
        title: row.text(12)?,
    })
}

fn rows<T>(found: Vec<Row>, map: impl Fn(&Row) -> TxResult<T>) -> TxResult<Vec<T>> {
    found.iter().map(map).collect()
}

/// The records of the rows `query` returns, each mapped as it is read.
async fn mapped<T: Send>(
    sql: &mut dyn Sql,
    query: &str,
    params: &[Param<'_>],
    map: impl Fn(&Row) -> TxResult<T> + Send + Sync,
) -> TxResult<Vec<T>> {
    let mut records = Vec::new();
    sql.for_each_row(query, params, &mut |row| {
        records.push(map(&row)?);
        Ok(())
    })
    .await?;
    Ok(records)
}

/// The statuses this build knows, as an SQL list.
/// A lane's cards (a condition on `tasks`) and its order, given the name
/// of the column that orders rows as they were added (`place`).
fn lane_rows(lane: Lane, place: &str) -> (String, fn(&str) -> String) {
    match lane {
        // The newest done cards: found by walking the table back from
        // its newest row, which meets them soon (no index orders done
        // cards by age, and one would cost every claim a page).
        Lane::Status(TaskStatus::Done) => ("status = 'done'".to_owned(), |place| {
            format!("{place} DESC")
        }),
        Lane::Status(status) => (format!("status = '{}'", status.as_str()), |place| {
            format!("priority DESC, created_at ASC, {place} ASC")
        }),
        // Through the lane index's ranges (a planner ordering by place
        // would scan the table for them).
        Lane::Unknown => (
            format!(
                "{place} IN (SELECT {place} FROM tasks WHERE {})",
                unknown_statuses()
            ),
            |place| place.to_owned(),
        ),
    }
}

/// A `LIKE` pattern matching `text` anywhere, in any case, its `%`, `_`
/// and `\\` matched as themselves.
fn like_pattern(text: &str) -> String {
    let escaped = text
        .trim()
        .to_lowercase()
        .replace('\\', "\\\\")
        .replace('%', "\\%")
        .replace('_', "\\_");
    format!("%{escaped}%")
}

/// A lane filter's conditions, and their values bound in the order they
/// appear (`$1` on).
fn filter_conditions<'a>(
    filter: &'a LaneFilter,
    pattern: Option<&'a str>,
    any: fn(usize) -> String,
) -> (String, Vec<Param<'a>>) {
    let mut values: Vec<Param<'a>> = Vec::new();
    let mut conditions = "TRUE".to_owned();
    if let (Some(pattern), Some(text)) = (pattern, &filter.text) {
        values.push(Param::Text(pattern));
        values.push(Param::Text(text.trim()));
        conditions.push_str(&format!(
            " AND (LOWER(title) LIKE ${} ESCAPE '\\' OR id = ${})",
            values.len() - 1,
            values.len()
        ));
    }
    for (column, value) in [
        ("assignee", &filter.assignee),
        ("tenant", &filter.tenant),
        ("block_kind", &filter.block_kind),
    ] {
        if let Some(value) = value {
            values.push(Param::Text(value));
            conditions.push_str(&format!(" AND {column} = ${}", values.len()));
        }
    }
    if let Some(assignees) = &filter.assignees {
        values.push(Param::from(assignees.as_slice()));
        conditions.push_str(&format!(
            " AND COALESCE(assignee, '') {}",
            any(values.len())
        ));
    }
    (conditions, values)
}

/// The cards whose status this build does not know, as ranges of the
/// lane index between the known names: each range is a seek, so the lane
/// of unknown statuses is read without a scan of the table (`NOT IN`
/// would read every row).
fn unknown_statuses() -> String {
    let mut names: Vec<&str> = TaskStatus::ALL
        .iter()
        .map(|status| status.as_str())
        .collect();
    names.sort_unstable();
    let mut ranges = Vec::with_capacity(names.len() + 1);
    let mut below: Option<&str> = None;
    for name in names {
        ranges.push(match below {
            None => format!("status < '{name}'"),
            Some(low) => format!("(status > '{low}' AND status < '{name}')"),
        });
        below = Some(name);
    }
    if let Some(low) = below {
        ranges.push(format!("status > '{low}'"));
    }
    format!("({})", ranges.join(" OR "))
}

/// One transaction's reads and writes of the board's rows.
pub(crate) struct Tx<'t> {
    sql: &'t mut dyn Sql,
}

impl<'t> Tx<'t> {
    pub(crate) fn new(sql: &'t mut dyn Sql) -> Self {
        Self { sql }
    }

    async fn one(&mut self, query: &str, params: &[Param<'_>]) -> TxResult<Option<Row>> {
        Ok(self.sql.rows(query, params).await?.into_iter().next())
    }

    async fn value(&mut self, query: &str, params: &[Param<'_>]) -> TxResult<Row> {
        self.one(query, params).await?.ok_or_else(|| {
            BoardError::Storage(format!("a query of one row returned none: {query}")).into()
        })
    }

    async fn flag(&mut self, query: &str, params: &[Param<'_>]) -> TxResult<bool> {
        self.value(query, params).await?.flag(0)
    }

    /// The dialect's words for `lock`, in a write; nothing in a read.
    fn locking(&self, lock: fn(&'static crate::Dialect) -> &'static str) -> &'static str {
        if self.sql.writing() {
            lock(self.sql.dialect())
        } else {
            ""
        }
    }

    /// Where a read of a card to change it locks the card's row.
    fn lock_card(&self) -> &'static str {
        self.locking(|dialect| dialect.lock_card)
    }

    pub(crate) fn require_sync(&mut self) -> TxResult<()> {
        self.sql.require_sync()
    }

    pub(crate) async fn notify(&mut self) -> TxResult<()> {
        self.sql.notify().await
    }

    /// The board's counts, for metrics. The bookings' event kinds are
    /// core's; the board only counts them. A value that is not JSON, or
    /// not a number, counts for nothing and never fails the read.
    pub(crate) async fn stats(&mut self, now: i64) -> TxResult<BoardStats> {
        let dialect = self.sql.dialect();
        let (text, number) = (dialect.json_text, dialect.json_number);
        let kinds: Vec<String> = kanban_core::BookingKind::ALL
            .iter()
            .map(|kind| kind.event_kind().to_owned())
            .collect();
        let exits = format!(
            "SELECT COALESCE({}, 'none'), COUNT(*) FROM task_events WHERE kind {} GROUP BY 1 ORDER BY 1",
            text("payload", "exit_code"),
            (dialect.any)(1)
        );
        let attempts = number("payload", "recovery_attempts");
        let counts = [
            format!(
                "SELECT CAST(SUM({attempts}) AS BIGINT) FROM task_events WHERE kind = 'worker_result'"
            ),
            format!(
                "SELECT COUNT(*) FROM task_events e JOIN task_runs r ON r.id = e.run_id
                  WHERE e.kind = 'worker_result' AND {} > 0 AND r.outcome = 'completed'",
                number("e.payload", "recovery_attempts")
            ),
            format!(
                "SELECT COUNT(*) FROM task_events WHERE kind = 'reclaimed'
                    AND COALESCE({}, 'false') NOT IN ('true', '1')",
                text("payload", "manual")
            ),
            "SELECT COUNT(*) FROM task_events WHERE kind = 'stale_write_rejected'".to_owned(),
            "SELECT COUNT(*) FROM provider_walls".to_owned(),
        ];
        let mut found = Vec::new();
        for query in &counts {
            found.push(self.value(query, &[]).await?.opt_int(0)?.unwrap_or(0));
        }
        let walls_holding = "SELECT COUNT(*) FROM provider_walls WHERE until > $1";
        let ticks =
            "SELECT bucket, CAST(SUM(count) AS BIGINT) FROM dispatcher_ticks GROUP BY bucket";
        let mut tick_buckets = vec![0; kanban_core::TICK_BUCKETS_MS.len() + 1];
        let mut tick_sum_ms = 0;
        for row in self.sql.rows(ticks, &[]).await? {
            match (row.int(0)?, row.opt_int(1)?.unwrap_or(0)) {
                (-1, sum) => tick_sum_ms = sum,
                (bucket, count) => {
                    if let Some(slot) = usize::try_from(bucket)
                        .ok()
                        .and_then(|at| tick_buckets.get_mut(at))
                    {
                        *slot = count;
                    }
                }
            }
        }
        Ok(BoardStats {
            cards_by_status: self.pairs("SELECT status, COUNT(*) FROM tasks GROUP BY status ORDER BY status", &[]).await?,
            runs_by_outcome: self
                .pairs("SELECT COALESCE(outcome, 'running'), COUNT(*) FROM task_runs GROUP BY 1 ORDER BY 1", &[])
                .await?,
            exits_by_code: self.pairs(&exits, args![kinds.as_slice()]).await?,
            recovery_attempts: found[0],
            recovered_runs: found[1],
            stale_releases: found[2],
            stale_writes_rejected: found[3],
            walls: found[4],
            walls_holding: self.value(walls_holding, args![now]).await?.int(0)?,
            tick_buckets,
            tick_sum_ms,
        })
    }

    async fn pairs(&mut self, query: &str, params: &[Param<'_>]) -> TxResult<Vec<(String, i64)>> {
        rows(self.sql.rows(query, params).await?, |row| {
            Ok((row.text(0)?, row.int(1)?))
        })
    }

    /// The rows of a card a rule reads; a status this build does not know
    /// is [`BoardError::UnknownStatus`]: no rule changes such a card.
    pub(crate) async fn card_state(&mut self, task_id: &str) -> TxResult<Option<CardState>> {
        let query = format!(
            "SELECT t.status, t.current_run_id, t.claim_lock, t.claim_expires, t.worker_pid,
                    t.consecutive_failures, t.max_retries, {OPEN_PARENT}, t.held_reason IS NOT NULL,
                    t.not_before, t.block_kind, t.block_recurrences
               FROM tasks t WHERE t.id = $1{}",
            self.lock_card()
        );
        let Some(row) = self.one(&query, args![task_id]).await? else {
            return Ok(None);
        };
        let status = row.text(0)?;
        let Some(status) = TaskStatus::parse(&status) else {
            let task_id = task_id.to_owned();
            return Err(BoardError::UnknownStatus { task_id, status }.into());
        };
        Ok(Some(CardState {
            task_id: task_id.to_owned(),
            status,
            current_run_id: row.opt_int(1)?,
            claim_lock: row.opt_text(2)?,
            claim_expires: row.opt_int(3)?,
            worker_pid: row.opt_int(4)?,
            consecutive_failures: row.count(5)?,
            max_retries: row.opt_count(6)?,
            open_parents: row.flag(7)?,
            held: row.flag(8)?,
            not_before: row.opt_int(9)?,
            block_kind: row.opt_text(10)?,
            block_recurrences: row.count(11)?,
        }))
    }

    /// The rows a fence reads (the card's row locked, in a write).
    pub(crate) async fn lease_view(&mut self, task_id: &str) -> TxResult<LeaseView> {
        let query = format!(
            "{}{}",
            lease_query(ProofIdentity::AnyProcess),
            self.lock_card()
        );
        let row = self.one(&query, args![task_id]).await?;
        lease_from_row(row.as_ref())
    }

    pub(crate) async fn task(&mut self, task_id: &str) -> TxResult<Option<TaskRecord>> {
        let query = format!("SELECT {TASK_COLUMNS} FROM tasks WHERE id = $1");
        self.one(&query, args![task_id])
            .await?
            .as_ref()
            .map(task)
            .transpose()
    }

    /// A card with its parents, runs, events and newest `comments`.
    pub(crate) async fn task_view(
        &mut self,
        task_id: &str,
        comments: usize,
    ) -> TxResult<Option<TaskView>> {
        let Some(card) = self.task(task_id).await? else {
            return Ok(None);
        };
        let runs_of = format!("SELECT {RUN_COLUMNS} FROM task_runs WHERE task_id = $1 ORDER BY id");
        let runs = rows(self.sql.rows(&runs_of, args![task_id]).await?, run)?;
        let events_of =
            format!("SELECT {EVENT_COLUMNS} FROM task_events WHERE task_id = $1 ORDER BY id");
        let events = rows(self.sql.rows(&events_of, args![task_id]).await?, event)?;
        let parents_of = "SELECT parent_id FROM task_links WHERE child_id = $1 ORDER BY parent_id";
        let parents = rows(self.sql.rows(parents_of, args![task_id]).await?, |row| {
            row.text(0)
        })?;
        let children_of = "SELECT child_id FROM task_links WHERE parent_id = $1 ORDER BY child_id";
        let children = rows(self.sql.rows(children_of, args![task_id]).await?, |row| {
            row.text(0)
        })?;
        let newest = self
            .sql
            .rows(
                "SELECT id, author, body, created_at FROM task_comments
                  WHERE task_id = $1 ORDER BY id DESC LIMIT $2",
                args![task_id, limit(comments)],
            )
            .await?;
        let mut comments = rows(newest, |row| {
            Ok(CommentRecord {
                id: row.int(0)?,
                author: row.text(1)?,
                body: row.text(2)?,
                created_at: row.int(3)?,
            })
        })?;
        comments.reverse();
        let attachments = self.attachments(Some(task_id)).await?;
        let task = card;
        Ok(Some(TaskView {
            task,
            parents,
            children,
            runs,
            events,
            comments,
            attachments,
        }))
    }

    pub(crate) async fn run_row(&mut self, claim: &Claim) -> TxResult<Option<RunRow>> {
        let row = self
            .one(
                "SELECT ended_at IS NOT NULL, outcome FROM task_runs WHERE id = $1 AND task_id = $2",
                args![claim.run_id, &claim.task_id],
            )
            .await?;
        row.map(|row| {
            Ok(RunRow {
                ended: row.flag(0)?,
                outcome: row.opt_text(1)?,
            })
        })
        .transpose()
    }

    /// Whether the claim's run exists with the claim's lock.
    pub(crate) async fn run_owned(&mut self, claim: &Claim) -> TxResult<bool> {
        self.flag(
            "SELECT EXISTS (SELECT 1 FROM task_runs WHERE id = $1 AND task_id = $2 AND claim_lock = $3)",
            args![claim.run_id, &claim.task_id, &claim.claim_lock],
        )
        .await
    }

    /// The lease length kept with the claim's run.
    pub(crate) async fn lease_ttl(&mut self, claim: &Claim) -> TxResult<Option<i64>> {
        let row = self
            .one(
                "SELECT lease_ttl FROM task_runs WHERE id = $1",
                args![claim.run_id],
            )
            .await?;
        Ok(row.map(|row| row.opt_int(0)).transpose()?.flatten())
    }

    /// The payload of the newest event of `kind` of one run.
    pub(crate) async fn latest_payload(
        &mut self,
        task_id: &str,
        run_id: i64,
        kind: &str,
    ) -> TxResult<Option<Value>> {
        let row = self
            .one(
                "SELECT payload FROM task_events WHERE task_id = $1 AND run_id = $2 AND kind = $3
                  ORDER BY id DESC LIMIT 1",
                args![task_id, run_id, kind],
            )
            .await?;
        Ok(row.map(|row| row.json(0)).transpose()?.flatten())
    }

    /// Outcomes of a card's closed runs, newest first.
    pub(crate) async fn recent_outcomes(
        &mut self,
        task_id: &str,
        count: usize,
    ) -> TxResult<Vec<String>> {
        let found = self
            .sql
            .rows(
                "SELECT outcome FROM task_runs WHERE task_id = $1 AND ended_at IS NOT NULL
                  ORDER BY id DESC LIMIT $2",
                args![task_id, limit(count)],
            )
            .await?;
        rows(found, |row| Ok(row.opt_text(0)?.unwrap_or_default()))
    }

    /// The walls of `scope` and those `run_id` probes. Two writers booking
    /// exits of one scope take turns, so that neither arms or lifts a wall
    /// from a stale read of it: the scope's turn covers a wall not armed
    /// yet, the row lock one that stands.
    pub(crate) async fn walls_of(
        &mut self,
        scope: Option<&str>,
        run_id: i64,
    ) -> TxResult<Vec<Wall>> {
        if let Some(scope) = scope {
            self.sql.take_turns(Turns::WallScope, scope).await?;
        }
        let query = format!(
            "SELECT {WALL_COLUMNS} FROM provider_walls WHERE scope = $1 OR probe_run = $2{}",
            self.locking(|dialect| dialect.lock_rows)
        );
        rows(
            self.sql
                .rows(&query, args![scope.unwrap_or(""), run_id])
                .await?,
            wall,
        )
    }

    pub(crate) async fn walls(&mut self) -> TxResult<Vec<Wall>> {
        let query = format!("SELECT {WALL_COLUMNS} FROM provider_walls ORDER BY until, scope");
        rows(self.sql.rows(&query, &[]).await?, wall)
    }

    pub(crate) async fn running_workers(&mut self, db: &str) -> TxResult<Vec<RunningWorker>> {
        let found = self
            .sql
            .rows(
                "SELECT t.id, t.current_run_id, t.claim_lock, t.worker_pid, t.claim_expires,
                        t.last_heartbeat_at, t.worker_started_at, r.started_at, t.max_runtime_seconds,
                        r.worker_seal, t.assignee
                   FROM tasks t JOIN task_runs r ON r.id = t.current_run_id
                  WHERE t.status = 'running' AND t.claim_lock IS NOT NULL
                  ORDER BY t.current_run_id",
                &[],
            )
            .await?;
        rows(found, |row| {
            Ok(RunningWorker {
                claim: Claim {
                    task_id: row.text(0)?,
                    db: db.to_owned(),
                    run_id: row.int(1)?,
                    claim_lock: row.text(2)?,
                    board: None,
                },
                worker_pid: row.opt_int(3)?,
                claim_expires: row.opt_int(4)?,
                last_heartbeat_at: row.opt_int(5)?,
                worker_started_at: row.opt_int(6)?,
                run_started_at: row.int(7)?,
                max_runtime_seconds: row.opt_int(8)?,
                seal_digest: row.opt_text(9)?,
                assignee: row.opt_text(10)?,
            })
        })
    }

    /// Claimable cards (ready, and review for its reviewer) through the
    /// lane index, at most `count` in claim order, leaving out by index
    /// what core's claim rule passes over for `filter` at `now` and what
    /// another writer holds this instant; the rule decides on each.
    pub(crate) async fn ready_candidates(
        &mut self,
        filter: &ClaimFilter,
        now: i64,
        count: usize,
    ) -> TxResult<Vec<ClaimCandidate>> {
        let dialect = self.sql.dialect();
        let admitted: Option<Vec<String>> = filter
            .assignees
            .as_ref()
            .map(|set| set.iter().cloned().collect());
        // Two statements, each prepared once: for every card, and for the
        // cards of some assignees. The lane is a parameter, so each lane is
        // one range of the lane index, read in claim order.
        let (assignees, rows_at) = match admitted {
            Some(_) => (
                format!("AND COALESCE(t.assignee, '') {}", (dialect.any)(3)),
                4,
            ),
            None => (String::new(), 3),
        };
        let query = format!(
            "{} WHERE t.status = $1 AND t.claim_lock IS NULL AND t.held_reason IS NULL
                 AND (t.not_before IS NULL OR t.not_before <= $2) {assignees}
               ORDER BY t.priority DESC, t.created_at ASC, t.{} ASC LIMIT ${rows_at}{}",
            candidate_query(dialect.place),
            dialect.place,
            self.locking(|dialect| dialect.skip_locked)
        );
        let mut found = Vec::new();
        for lane in [TaskStatus::Ready, TaskStatus::Review] {
            let lane = lane.as_str();
            self.sql.walk_indexes();
            let lane_rows = match &admitted {
                Some(admitted) => {
                    let admitted: &[String] = admitted;
                    self.sql
                        .rows(&query, args![lane, now, admitted, limit(count)])
                        .await?
                }
                None => {
                    self.sql
                        .rows(&query, args![lane, now, limit(count)])
                        .await?
                }
            };
            found.extend(rows(lane_rows, candidate)?);
        }
        found.sort_by(kanban_core::rules::claim_order);
        found.truncate(count);
        Ok(found)
    }

    /// The first `count` cards of the claim lanes in claim order, whatever
    /// their claims, holds and times (a dry run's reading), through the
    /// lane index.
    pub(crate) async fn claim_lane(&mut self, count: usize) -> TxResult<Vec<ClaimCandidate>> {
        let dialect = self.sql.dialect();
        let query = format!(
            "{} WHERE t.status = $1
               ORDER BY t.priority DESC, t.created_at ASC, t.{} ASC LIMIT $2",
            candidate_query(dialect.place),
            dialect.place,
        );
        let mut found = Vec::new();
        for lane in [TaskStatus::Ready, TaskStatus::Review] {
            self.sql.walk_indexes();
            let lane_rows = self
                .sql
                .rows(&query, args![lane.as_str(), limit(count)])
                .await?;
            found.extend(rows(lane_rows, candidate)?);
        }
        found.sort_by(kanban_core::rules::claim_order);
        found.truncate(count);
        Ok(found)
    }

    /// One card for a claim by hand; `None` while another writer holds it.
    pub(crate) async fn claim_candidate(
        &mut self,
        task_id: &str,
    ) -> TxResult<Option<ClaimCandidate>> {
        let dialect = self.sql.dialect();
        let query = format!(
            "{} WHERE t.id = $1{}",
            candidate_query(dialect.place),
            self.locking(|dialect| dialect.skip_locked)
        );
        if let Some(row) = self.one(&query, args![task_id]).await? {
            return candidate(&row).map(Some);
        }
        if self
            .flag(
                "SELECT EXISTS (SELECT 1 FROM tasks WHERE id = $1)",
                args![task_id],
            )
            .await?
        {
            return Ok(None);
        }
        Err(BoardError::TaskNotFound(task_id.to_owned()).into())
    }

    /// The `todo` cards whose parents are all done, and the parked cards,
    /// not held, due at `now` (another writer's are promoted on a later
    /// tick).
    pub(crate) async fn promotable(&mut self, now: i64) -> TxResult<Vec<String>> {
        let dialect = self.sql.dialect();
        let query = format!(
            "SELECT t.id FROM tasks t
              WHERE (t.status = 'todo' AND NOT {OPEN_PARENT})
                 OR (t.status = 'scheduled' AND t.held_reason IS NULL AND t.not_before <= $1)
              ORDER BY t.{}{}",
            dialect.place,
            self.locking(|dialect| dialect.skip_locked)
        );
        rows(self.sql.rows(&query, args![now]).await?, |row| row.text(0))
    }

    /// The `todo` children of `parent` with no open parent (one written by
    /// another transaction is promoted on a dispatcher's tick).
    pub(crate) async fn promotable_children(&mut self, parent: &str) -> TxResult<Vec<String>> {
        let query = format!(
            "SELECT t.id FROM task_links c JOIN tasks t ON t.id = c.child_id
              WHERE c.parent_id = $1 AND t.status = 'todo' AND NOT {OPEN_PARENT}
              ORDER BY t.id"
        );
        rows(self.sql.rows(&query, args![parent]).await?, |row| {
            row.text(0)
        })
    }

    /// Whether a tick has a card to promote at `now`: one in `todo`, or a
    /// parked one, not held, whose time has come.
    pub(crate) async fn any_waiting(&mut self, now: i64) -> TxResult<bool> {
        self.flag(
            "SELECT EXISTS (SELECT 1 FROM tasks WHERE status = 'todo')
                 OR EXISTS (SELECT 1 FROM tasks WHERE status = 'scheduled' AND held_reason IS NULL
                                                  AND not_before <= $1)",
            args![now],
        )
        .await
    }

    /// The newest card (not archived) of an idempotency key; two creates
    /// with one key take turns, so that the second finds the first's card.
    pub(crate) async fn idempotent_card(&mut self, key: &str) -> TxResult<Option<String>> {
        self.sql.take_turns(Turns::IdempotencyKey, key).await?;
        let query = format!(
            "SELECT id FROM tasks WHERE idempotency_key = $1 AND status <> 'archived'
              ORDER BY created_at DESC, {} DESC LIMIT 1",
            self.sql.dialect().place
        );
        self.one(&query, args![key])
            .await?
            .map(|row| row.text(0))
            .transpose()
    }

    pub(crate) async fn status_of(&mut self, task_id: &str) -> TxResult<Option<CardStatus>> {
        let row = self
            .one("SELECT status FROM tasks WHERE id = $1", args![task_id])
            .await?;
        row.map(|row| Ok(CardStatus::parse(&row.text(0)?)))
            .transpose()
    }

    /// Records a file attached to `task_id`; its id.
    pub(crate) async fn insert_attachment(
        &mut self,
        task_id: &str,
        new: &NewAttachment,
        now: i64,
    ) -> TxResult<i64> {
        self.sql
            .insert_id(
                "INSERT INTO task_attachments (task_id, filename, stored_path, content_type, size, uploaded_by, created_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7)",
                args![
                    task_id,
                    &new.filename,
                    &new.stored_path,
                    new.content_type.as_deref(),
                    new.size,
                    new.uploaded_by.as_deref(),
                    now,
                ],
            )
            .await
    }

    /// The files attached to `task_id` (every card's, with none), oldest first.
    pub(crate) async fn attachments(
        &mut self,
        task_id: Option<&str>,
    ) -> TxResult<Vec<AttachmentRecord>> {
        let rows = self
            .sql
            .rows(
                "SELECT id, task_id, filename, stored_path, content_type, size, uploaded_by, created_at
                   FROM task_attachments WHERE CAST($1 AS TEXT) IS NULL OR task_id = $1
                  ORDER BY created_at, id",
                args![task_id],
            )
            .await?;
        rows.iter()
            .map(|row| {
                Ok(AttachmentRecord {
                    id: row.int(0)?,
                    task_id: row.text(1)?,
                    filename: row.text(2)?,
                    stored_path: row.text(3)?,
                    content_type: row.opt_text(4)?,
                    size: row.opt_int(5)?.unwrap_or(0),
                    uploaded_by: row.opt_text(6)?,
                    created_at: row.int(7)?,
                })
            })
            .collect()
    }

    /// Deletes attachment `id`'s row; the row it was.
    pub(crate) async fn delete_attachment(
        &mut self,
        id: i64,
    ) -> TxResult<Option<AttachmentRecord>> {
        let row = self
            .one(
                "SELECT task_id FROM task_attachments WHERE id = $1",
                args![id],
            )
            .await?;
        let Some(task_id) = row.map(|row| row.text(0)).transpose()? else {
            return Ok(None);
        };
        let found = self
            .attachments(Some(&task_id))
            .await?
            .into_iter()
            .find(|attachment| attachment.id == id);
        self.sql
            .execute("DELETE FROM task_attachments WHERE id = $1", args![id])
            .await?;
        Ok(found)
    }

    /// Every card, or those of one status, oldest first.
    pub(crate) async fn tasks(&mut self, status: Option<TaskStatus>) -> TxResult<Vec<TaskRecord>> {
        let query = format!(
            "SELECT {TASK_COLUMNS} FROM tasks WHERE CAST($1 AS TEXT) IS NULL OR status = $1
              ORDER BY created_at, {}",
            self.sql.dialect().place
        );
        let status = status.map(TaskStatus::as_str);
        mapped(self.sql, &query, args![status], task).await
    }

    /// Cards after place `after` in the order they were added, with their
    /// places: a range of an index, read only as far as the page goes.
    pub(crate) async fn page(
        &mut self,
        status: Option<TaskStatus>,
        after: i64,
        count: usize,
    ) -> TxResult<Vec<(i64, TaskRecord)>> {
        let place = self.sql.dialect().place;
        let query = format!(
            "SELECT {place}, {TASK_COLUMNS} FROM tasks
              WHERE (CAST($1 AS TEXT) IS NULL OR status = $1) AND {place} > $2
              ORDER BY {place} LIMIT $3"
        );
        let status = status.map(TaskStatus::as_str);
        mapped(
            self.sql,
            &query,
            args![status, after, limit(count)],
            |row| Ok((row.int(0)?, task_at(row, 1)?)),
        )
        .await
    }

    /// The newest `count` events of the board, newest first.
    pub(crate) async fn recent_events(&mut self, count: usize) -> TxResult<Vec<EventRecord>> {
        let query = format!("SELECT {EVENT_COLUMNS} FROM task_events ORDER BY id DESC LIMIT $1");
        rows(self.sql.rows(&query, args![limit(count)]).await?, event)
    }

    /// Every link, as `(parent, child)` pairs, sorted.
    pub(crate) async fn links(&mut self) -> TxResult<Vec<(String, String)>> {
        let query = "SELECT parent_id, child_id FROM task_links ORDER BY parent_id, child_id";
        mapped(self.sql, query, &[], |row| Ok((row.text(0)?, row.text(1)?))).await
    }

    /// The newest run of each card that has run.
    pub(crate) async fn last_runs(&mut self) -> TxResult<BTreeMap<String, i64>> {
        let query = "SELECT task_id, MAX(id) FROM task_runs GROUP BY task_id";
        let pairs = mapped(self.sql, query, &[], |row| Ok((row.text(0)?, row.int(1)?))).await?;
        Ok(pairs.into_iter().collect())
    }

    /// A recurring card's fields for its next occurrence, and when it was
    /// scheduled.
    pub(crate) async fn recurring(&mut self, task_id: &str) -> TxResult<Option<(NewTask, i64)>> {
        let row = self
            .one(
                "SELECT title, body, assignee, priority, max_retries, goal_mode, goal_max_turns,
                        max_runtime_seconds, every_seconds, COALESCE(scheduled_at, created_at),
                        workspace_kind, workspace_path, branch_name
                   FROM tasks WHERE id = $1 AND every_seconds IS NOT NULL",
                args![task_id],
            )
            .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let (workspace_kind, workspace_path) = (row.opt_text(10)?, row.opt_text(11)?);
        let next = NewTask {
            title: row.text(0)?,
            body: row.opt_text(1)?,
            assignee: row.opt_text(2)?,
            priority: row.opt_int(3)?.unwrap_or(0),
            max_retries: row.opt_count(4)?,
            goal_mode: row.flag(5)?,
            goal_max_turns: row.opt_count(6)?,
            max_runtime_seconds: row.opt_int(7)?,
            every_seconds: row.opt_int(8)?,
            // The next card works where this one did.
            workspace: workspace_kind
                .as_deref()
                .and_then(kanban_core::workspaces::WorkspaceKind::parse)
                .map(|kind| kanban_core::workspaces::WorkspaceSpec {
                    kind,
                    path: workspace_path,
                }),
            branch: row.opt_text(12)?,
            ..NewTask::default()
        };
        Ok(Some((next, row.int(9)?)))
    }

    /// Done and archived cards whose last event is older than `before`.
    pub(crate) async fn prunable(&mut self, before: i64) -> TxResult<Vec<String>> {
        let found = self
            .sql
            .rows(
                "SELECT t.id FROM tasks t
                  WHERE t.status IN ('done', 'archived')
                    AND COALESCE((SELECT MAX(e.created_at) FROM task_events e WHERE e.task_id = t.id),
                                 t.completed_at, t.created_at) < $1
                  ORDER BY t.created_at",
                args![before],
            )
            .await?;
        rows(found, |row| row.text(0))
    }

    /// Whether a wall of `scopes` bars a probe by `run_id` at `now`: its
    /// reset time not come, or another running run probing it. The walls'
    /// rows stay locked to the commit: a second writer probing the same
    /// wall waits, then reads this probe.
    pub(crate) async fn probe_barred(
        &mut self,
        scopes: &[String],
        now: i64,
        run_id: i64,
    ) -> TxResult<bool> {
        let dialect = self.sql.dialect();
        let lock = format!(
            "SELECT 1 FROM provider_walls WHERE scope {} ORDER BY scope{}",
            (dialect.any)(1),
            self.locking(|dialect| dialect.lock_rows)
        );
        self.sql.rows(&lock, args![scopes]).await?;
        let query = format!(
            "SELECT EXISTS (SELECT 1 FROM provider_walls w
              WHERE w.scope {}
                AND (w.until > $2
                     OR (w.probe_run IS NOT NULL AND w.probe_run <> $3
                         AND EXISTS (SELECT 1 FROM tasks t
                                      WHERE t.current_run_id = w.probe_run
                                        AND t.status = 'running' AND t.claim_lock IS NOT NULL))))",
            (dialect.any)(1)
        );
        self.flag(&query, args![scopes, now, run_id]).await
    }

    /// A page of a lane: `count` cards from `skip` on, in the lane's
    /// order, and how many it holds, counted only up to [`LANE_WINDOW`]. A
    /// filter searches the lane's first [`LANE_WINDOW`] cards only, so no
    /// view of a big lane reads it whole.
    pub(crate) async fn lane(
        &mut self,
        lane: Lane,
        filter: &LaneFilter,
        count: usize,
        skip: usize,
    ) -> TxResult<LanePage> {
        let dialect = self.sql.dialect();
        let place = dialect.place;
        let (base, order) = lane_rows(lane, place);
        let held = self
            .value(
                &format!(
                    "SELECT COUNT(*) FROM (SELECT 1 FROM tasks WHERE {base} LIMIT {}) counted",
                    LANE_WINDOW + 1
                ),
                &[],
            )
            .await?
            .int(0)?;
        let held = usize::try_from(held).unwrap_or(0);
        if held == 0 {
            return Ok(LanePage {
                count: 0,
                more: false,
                cards: Vec::new(),
            });
        }
        // Walking the table back finds the newest of a big done lane at
        // once; a smaller one, spread through a big table, is read (and
        // sorted, at most the window) through the lane index instead.
        let table = match lane {
            Lane::Status(TaskStatus::Done) if held > LANE_WINDOW => dialect.done_scan,
            _ => "tasks",
        };
        if filter.is_empty() {
            let query = format!(
                "SELECT {TASK_COLUMNS} FROM {table} WHERE {base} ORDER BY {} LIMIT $1 OFFSET $2",
                order(place)
            );
            let cards = mapped(self.sql, &query, args![limit(count), limit(skip)], task).await?;
            return Ok(LanePage {
                count: held.min(LANE_WINDOW),
                more: held > LANE_WINDOW,
                cards,
            });
        }
        let pattern = filter.text.as_deref().map(like_pattern);
        let (conditions, mut values) = filter_conditions(filter, pattern.as_deref(), dialect.any);
        // The window holds only what the filter and the order read; the
        // page's cards are read whole afterwards, by id (the key both
        // engines index).
        let window = format!(
            "WITH lane AS (SELECT {place} AS lane_place, id, title, assignee, tenant, block_kind, \
             priority, created_at FROM {table} WHERE {base} ORDER BY {} LIMIT {LANE_WINDOW})",
            order(place)
        );
        let matched = self
            .value(
                &format!("{window} SELECT COUNT(*) FROM lane WHERE {conditions}"),
                &values,
            )
            .await?
            .int(0)?;
        let query = format!(
            "{window} SELECT {TASK_COLUMNS} FROM tasks WHERE id IN (SELECT id FROM lane \
             WHERE {conditions} ORDER BY {} LIMIT ${} OFFSET ${}) ORDER BY {}",
            order("lane_place"),
            values.len() + 1,
            values.len() + 2,
            order(place)
        );
        values.push(Param::Int(limit(count)));
        values.push(Param::Int(limit(skip)));
        let cards = mapped(self.sql, &query, &values, task).await?;
        Ok(LanePage {
            count: usize::try_from(matched).unwrap_or(0),
            more: held > LANE_WINDOW,
            cards,
        })
    }

    pub(crate) async fn last_events(&mut self, ids: &[String]) -> TxResult<LastEvents> {
        let query = format!(
            "SELECT e.task_id, e.kind, e.created_at FROM task_events e
              WHERE e.id IN (SELECT MAX(id) FROM task_events WHERE task_id {} GROUP BY task_id)",
            (self.sql.dialect().any)(1)
        );
        let found = self.sql.rows(&query, args![ids]).await?;
        found
            .iter()
            .map(|row| Ok((row.text(0)?, (row.text(1)?, row.int(2)?))))
            .collect()
    }

    /// Every violation of the board's structural invariants found.
    pub(crate) async fn audit(&mut self) -> TxResult<Vec<String>> {
        let mut problems = Vec::new();
        for (what, query) in AUDIT {
            let found = rows(self.sql.rows(query, &[]).await?, |row| row.text(0))?;
            problems.extend(found.into_iter().map(|at| format!("{what}: {at}")));
        }
        Ok(problems)
    }
}

/// A board's structural invariants, each a query of the places that break
/// it: a running card holds a claim and points at its one open run; no
/// other card holds a claim or an open run; a closed run has an outcome.
const AUDIT: [(&str, &str); 5] = [
    (
        "a running card without a claim or an open current run",
        "SELECT t.id FROM tasks t WHERE t.status = 'running' AND (t.claim_lock IS NULL
           OR t.claim_expires IS NULL OR NOT EXISTS (SELECT 1 FROM task_runs r
           WHERE r.id = t.current_run_id AND r.task_id = t.id AND r.ended_at IS NULL))",
    ),
    (
        "a card with more than one open run",
        "SELECT task_id FROM task_runs WHERE ended_at IS NULL GROUP BY task_id HAVING COUNT(*) > 1",
    ),
    (
        "an open run that is not its card's current run",
        "SELECT r.task_id || ' run ' || CAST(r.id AS TEXT) FROM task_runs r JOIN tasks t ON t.id = r.task_id
          WHERE r.ended_at IS NULL AND (t.status <> 'running' OR t.current_run_id IS DISTINCT FROM r.id)",
    ),
    (
        "a card that is not running but holds a claim",
        "SELECT id FROM tasks WHERE status <> 'running'
          AND (current_run_id IS NOT NULL OR claim_lock IS NOT NULL OR claim_expires IS NOT NULL)",
    ),
    (
        "a closed run without an outcome",
        "SELECT task_id || ' run ' || CAST(id AS TEXT) FROM task_runs WHERE ended_at IS NOT NULL AND outcome IS NULL",
    ),
];

/// A column a transition sets, and its value.
type Set<'a> = (&'static str, Param<'a>);

/// The column of a [`Change`]: its new value, unless it is kept.
fn change<'a, T>(sets: &mut Vec<Set<'a>>, column: &'static str, change: &'a Change<T>)
where
    Param<'a>: From<&'a T>,
{
    if let Some(value) = change.value() {
        sets.push((column, value.map_or(Param::Null, Param::from)));
    }
}

impl<'a> From<&'a i64> for Param<'a> {
    fn from(value: &'a i64) -> Self {
        Self::Int(*value)
    }
}

impl<'a> From<&'a u32> for Param<'a> {
    fn from(value: &'a u32) -> Self {
        Self::Int(i64::from(*value))
    }
}

/// The columns `transition` sets on the card.
fn card_columns(transition: &Transition) -> Vec<Set<'_>> {
    let mut sets: Vec<Set<'_>> = Vec::new();
    if let Some(status) = transition.status {
        sets.push(("status", Param::Text(status.as_str())));
    }
    if let Some(failures) = transition.consecutive_failures {
        sets.push(("consecutive_failures", Param::from(failures)));
    }
    change(
        &mut sets,
        "last_failure_error",
        &transition.last_failure_error,
    );
    change(&mut sets, "not_before", &transition.not_before);
    change(&mut sets, "held_reason", &transition.held);
    change(&mut sets, "block_kind", &transition.block_kind);
    if let Some(recurrences) = transition.block_recurrences {
        sets.push(("block_recurrences", Param::from(recurrences)));
    }
    if let Some(edit) = &transition.edit {
        if let Some(title) = &edit.title {
            sets.push(("title", Param::Text(title)));
        }
        if let Some(body) = &edit.body {
            sets.push(("body", Param::Text(body)));
        }
        if let Some(priority) = edit.priority {
            sets.push(("priority", Param::Int(priority)));
        }
        change(&mut sets, "assignee", &edit.assignee);
        change(&mut sets, "tenant", &edit.tenant);
        change(&mut sets, "max_retries", &edit.max_retries);
        change(&mut sets, "max_runtime_seconds", &edit.max_runtime_seconds);
        if let Some(result) = &edit.result {
            sets.push(("result", Param::Text(result)));
        }
        if let Some(workspace) = &edit.workspace {
            sets.push(("workspace_kind", Param::Text(workspace.spec.kind.as_str())));
            sets.push((
                "workspace_path",
                Param::from(workspace.spec.path.as_deref()),
            ));
            sets.push(("branch_name", Param::from(workspace.branch.as_deref())));
        }
    }
    if let Some(completion) = &transition.completion {
        sets.push(("result", Param::Text(&completion.result)));
        sets.push(("completed_at", Param::Int(completion.completed_at)));
    }
    sets
}

impl Tx<'_> {
    /// Applies a transition: closes the open run, releases the claim, sets
    /// the card's columns, changes walls, appends the events.
    pub(crate) async fn apply(
        &mut self,
        task_id: &str,
        transition: &Transition,
        now: i64,
    ) -> TxResult<()> {
        if let Some(close) = &transition.close_run {
            self.sql
                .execute(
                    "UPDATE task_runs SET ended_at = $1, status = $2, outcome = $3, summary = $4, error = $5,
                                          metadata = $6
                      WHERE id = (SELECT current_run_id FROM tasks WHERE id = $7) AND ended_at IS NULL",
                    args![now, &close.status, &close.outcome, close.summary.as_deref(), close.error.as_deref(), close.metadata.as_ref(), task_id],
                )
                .await?;
        }
        if let Some(edit) = transition.edit.as_ref() {
            self.amend_handoff(task_id, edit).await?;
        }
        if transition.release_claim {
            self.sql
                .execute(
                    "UPDATE tasks SET current_run_id = NULL, claim_lock = NULL, claim_expires = NULL,
                                      worker_pid = NULL, worker_started_at = NULL
                      WHERE id = $1",
                    args![task_id],
                )
                .await?;
        }
        let sets = card_columns(transition);
        if !sets.is_empty() {
            let assignments: Vec<String> = sets
                .iter()
                .enumerate()
                .map(|(index, (column, _))| format!("{column} = ${}", index + 1))
                .collect();
            let mut values: Vec<Param<'_>> = sets.iter().map(|(_, value)| *value).collect();
            values.push(Param::Text(task_id));
            let query = format!(
                "UPDATE tasks SET {} WHERE id = ${}",
                assignments.join(", "),
                values.len()
            );
            self.sql.execute(&query, &values).await?;
        }
        for change in &transition.walls {
            self.apply_wall(change).await?;
        }
        for event in &transition.events {
            self.append_event(task_id, event, now).await?;
        }
        Ok(())
    }

    /// An edit's new summary and metadata, on the card's last completed
    /// run (the handoff its children and the seed system read).
    async fn amend_handoff(&mut self, task_id: &str, edit: &CardEdit) -> TxResult<()> {
        const LAST_COMPLETED: &str =
            "(SELECT MAX(id) FROM task_runs WHERE task_id = $2 AND outcome = 'completed')";
        if let Some(summary) = &edit.summary {
            let query = format!("UPDATE task_runs SET summary = $1 WHERE id = {LAST_COMPLETED}");
            self.sql.execute(&query, args![summary, task_id]).await?;
        }
        if let Some(metadata) = &edit.metadata {
            let metadata = serde_json::Value::Object(metadata.clone());
            let query = format!("UPDATE task_runs SET metadata = $1 WHERE id = {LAST_COMPLETED}");
            self.sql.execute(&query, args![&metadata, task_id]).await?;
        }
        Ok(())
    }

    async fn apply_wall(&mut self, change: &WallChange) -> TxResult<()> {
        match change {
            WallChange::Arm(wall) => {
                let query = format!(
                    "INSERT INTO provider_walls ({WALL_COLUMNS})
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
                     ON CONFLICT (scope) DO UPDATE SET kind = excluded.kind, route = excluded.route,
                        since = excluded.since, until = excluded.until, reason = excluded.reason,
                        source = excluded.source, hits = excluded.hits,
                        failed_probes = excluded.failed_probes, probe_run = excluded.probe_run"
                );
                let values = args![
                    &wall.scope,
                    wall.kind.as_str(),
                    &wall.route,
                    wall.since,
                    wall.until,
                    &wall.reason,
                    &wall.source,
                    wall.hits,
                    wall.failed_probes,
                    wall.probe_run,
                ];
                self.sql.execute(&query, values).await?;
            }
            WallChange::Lift { scope } => {
                self.sql
                    .execute("DELETE FROM provider_walls WHERE scope = $1", args![scope])
                    .await?;
            }
            WallChange::ProbeEnded { scope } => {
                self.sql
                    .execute(
                        "UPDATE provider_walls SET probe_run = NULL WHERE scope = $1",
                        args![scope],
                    )
                    .await?;
            }
        }
        Ok(())
    }

    pub(crate) async fn append_event(
        &mut self,
        task_id: &str,
        event: &NewEvent,
        now: i64,
    ) -> TxResult<()> {
        let payload = (!event.payload.is_null()).then_some(&event.payload);
        self.sql
            .execute(
                "INSERT INTO task_events (task_id, run_id, kind, payload, created_at) VALUES ($1, $2, $3, $4, $5)",
                args![task_id, event.run_id, &event.kind, payload, now],
            )
            .await?;
        // Most events notify nobody: no subscription is read for them.
        let kinds = kanban_core::notify::notify_kinds(&event.kind, &event.payload);
        let Some(first) = kinds.first() else {
            return Ok(());
        };
        let second = kinds.get(1).unwrap_or(first);
        let (first, second) = (format!("%,{first},%"), format!("%,{second},%"));
        // The outbox rows of this event, in its transaction: one per
        // subscription that wants it. The event is the newest of its kind
        // on its card (read on an index, with no RETURNING, which would
        // cost SQLite a statement journal).
        self.sql
            .execute(
                "INSERT INTO notify_outbox (subscription_id, event_id, task_id, created_at, next_attempt_at)
                 SELECT s.id, (SELECT MAX(e.id) FROM task_events e WHERE e.task_id = $1 AND e.kind = $2), $1, $3, $3
                   FROM notify_subscriptions s
                  WHERE s.removed_at IS NULL AND (s.kinds LIKE $4 OR s.kinds LIKE $5)
                    AND (s.scope = 'board'
                      OR (s.scope = 'card' AND s.target = $1)
                      OR (s.scope = 'assignee' AND s.target = (SELECT c.assignee FROM tasks c WHERE c.id = $1))
                      OR (s.scope = 'tenant' AND s.target = (SELECT c.tenant FROM tasks c WHERE c.id = $1)))",
                args![task_id, &event.kind, now, &first, &second],
            )
            .await?;
        Ok(())
    }

    /// Stores a subscription; its id.
    pub(crate) async fn insert_subscription(
        &mut self,
        new: &NewSubscription,
        now: i64,
    ) -> TxResult<i64> {
        let (scope, target) = new.scope.columns();
        let kinds: Vec<&str> = new.kinds.iter().map(String::as_str).collect();
        let kinds = kanban_core::notify::stored_kinds(&kinds);
        let options = new
            .smtp
            .as_ref()
            .map(|smtp| serde_json::json!({ "smtp": smtp }));
        let mut bytes = [0_u8; 4];
        getrandom::fill(&mut bytes).map_err(|error| {
            BoardError::Storage(format!("no randomness for a subscription's token: {error}"))
        })?;
        let token: String = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
        self.value(
            "INSERT INTO notify_subscriptions (token, scope, target, kinds, channel, address, format, secret, options, created_by, created_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) RETURNING id",
            args![&token, scope, target, &kinds, &new.channel, &new.address, &new.format, new.secret.as_deref(), options.as_ref(), new.created_by.as_deref(), now],
        )
        .await?
        .int(0)
    }

    /// The subscriptions not removed, oldest first, with their counts.
    pub(crate) async fn subscriptions(&mut self) -> TxResult<Vec<SubscriptionView>> {
        mapped(
            self.sql,
            "SELECT s.id, s.scope, s.target, s.kinds, s.channel, s.address, s.format, s.secret, s.created_by, s.created_at, s.options,
                    (SELECT COUNT(*) FROM notify_outbox o WHERE o.subscription_id = s.id AND o.delivered_at IS NULL AND o.dead_at IS NULL),
                    (SELECT COUNT(*) FROM notify_outbox o WHERE o.subscription_id = s.id AND o.delivered_at IS NOT NULL),
                    (SELECT COUNT(*) FROM notify_outbox o WHERE o.subscription_id = s.id AND o.dead_at IS NOT NULL),
                    (SELECT o.last_error FROM notify_outbox o WHERE o.subscription_id = s.id AND o.last_error IS NOT NULL ORDER BY o.id DESC LIMIT 1)
               FROM notify_subscriptions s WHERE s.removed_at IS NULL ORDER BY s.id",
            args![],
            |row| {
                Ok(SubscriptionView {
                    id: row.int(0)?,
                    scope: row.text(1)?,
                    target: row.opt_text(2)?,
                    kinds: kanban_core::notify::kinds_of_stored(&row.text(3)?),
                    channel: row.text(4)?,
                    address: row.text(5)?,
                    format: row.text(6)?,
                    secret: row.opt_text(7)?,
                    created_by: row.opt_text(8)?,
                    created_at: row.int(9)?,
                    smtp: smtp_of(row.json(10)?),
                    pending: row.int(11)?,
                    delivered: row.int(12)?,
                    dead: row.int(13)?,
                    last_error: row.opt_text(14)?,
                })
            },
        )
        .await
    }

    /// Removes a subscription; its open notifications die with it. False
    /// when there is none of that id.
    pub(crate) async fn remove_subscription(&mut self, id: i64, now: i64) -> TxResult<bool> {
        let removed = self
            .sql
            .execute(
                "UPDATE notify_subscriptions SET removed_at = $1 WHERE id = $2 AND removed_at IS NULL",
                args![now, id],
            )
            .await?;
        self.sql
            .execute(
                "UPDATE notify_outbox SET dead_at = $1, last_error = 'unsubscribed'
                  WHERE subscription_id = $2 AND delivered_at IS NULL AND dead_at IS NULL",
                args![now, id],
            )
            .await?;
        Ok(removed == 1)
    }

    /// Whether some notification is due and held by no deliverer.
    pub(crate) async fn any_notification_due(&mut self, now: i64) -> TxResult<bool> {
        self.flag(
            "SELECT EXISTS (SELECT 1 FROM notify_outbox t
                             WHERE t.delivered_at IS NULL AND t.dead_at IS NULL AND t.next_attempt_at <= $1
                               AND (t.lease_until IS NULL OR t.lease_until < $1)
                               AND NOT EXISTS (SELECT 1 FROM notify_outbox p
                                                WHERE p.subscription_id = t.subscription_id AND p.task_id = t.task_id
                                                  AND p.id < t.id AND p.delivered_at IS NULL AND p.dead_at IS NULL))",
            args![now],
        )
        .await
    }

    /// Leases up to `count` due notifications to `owner` until `until`: in
    /// order per subscription and card (a notification waits while an
    /// earlier one of its card is open), rows another deliverer holds
    /// passed over.
    pub(crate) async fn lease_notifications(
        &mut self,
        owner: &str,
        until: i64,
        now: i64,
        count: usize,
    ) -> TxResult<Vec<i64>> {
        let query = format!(
            "SELECT t.id FROM notify_outbox t
              WHERE t.delivered_at IS NULL AND t.dead_at IS NULL AND t.next_attempt_at <= $1
                AND (t.lease_until IS NULL OR t.lease_until < $1)
                AND NOT EXISTS (SELECT 1 FROM notify_outbox p
                                 WHERE p.subscription_id = t.subscription_id AND p.task_id = t.task_id
                                   AND p.id < t.id AND p.delivered_at IS NULL AND p.dead_at IS NULL)
              ORDER BY t.id LIMIT $2{}",
            self.locking(|dialect| dialect.skip_locked)
        );
        let ids = rows(
            self.sql.rows(&query, args![now, limit(count)]).await?,
            |row| row.int(0),
        )?;
        let mut leased = Vec::with_capacity(ids.len());
        for id in ids {
            let taken = self
                .sql
                .execute(
                    "UPDATE notify_outbox SET lease_owner = $1, lease_until = $2
                      WHERE id = $3 AND delivered_at IS NULL AND dead_at IS NULL
                        AND (lease_until IS NULL OR lease_until < $4)",
                    args![owner, until, id, now],
                )
                .await?;
            if taken == 1 {
                leased.push(id);
            }
        }
        Ok(leased)
    }

    /// A leased notification with what it carries.
    pub(crate) async fn delivery(&mut self, outbox_id: i64) -> TxResult<Option<Delivery>> {
        let found = self
            .one(
                "SELECT o.id, o.attempts, o.first_tried_at, s.id, s.channel, s.address, s.format, s.secret,
                        e.id, e.task_id, e.run_id, e.kind, e.payload, e.created_at,
                        o.task_id, c.title, c.status, c.assignee, c.tenant, s.options, s.token
                   FROM notify_outbox o
                   JOIN notify_subscriptions s ON s.id = o.subscription_id
                   LEFT JOIN task_events e ON e.id = o.event_id
                   LEFT JOIN tasks c ON c.id = o.task_id
                  WHERE o.id = $1",
                args![outbox_id],
            )
            .await?;
        let Some(row) = found else {
            return Ok(None);
        };
        let event = match row.opt_int(8)? {
            Some(id) => Some(EventRecord {
                id,
                task_id: row.text(9)?,
                run_id: row.opt_int(10)?,
                kind: row.text(11)?,
                payload: row.json(12)?.unwrap_or(Value::Null),
                created_at: row.int(13)?,
            }),
            None => None,
        };
        Ok(Some(Delivery {
            outbox_id: row.int(0)?,
            token: row.text(20)?,
            attempts: u32::try_from(row.int(1)?).unwrap_or(u32::MAX),
            first_tried_at: row.opt_int(2)?,
            subscription_id: row.int(3)?,
            channel: row.text(4)?,
            address: row.text(5)?,
            format: row.text(6)?,
            secret: row.opt_text(7)?,
            smtp: smtp_of(row.json(19)?),
            event,
            card: NotifiedCard {
                id: row.text(14)?,
                title: row.opt_text(15)?.unwrap_or_default(),
                status: row.opt_text(16)?.unwrap_or_else(|| "gone".to_owned()),
                assignee: row.opt_text(17)?,
                tenant: row.opt_text(18)?,
            },
        }))
    }

    /// Holds a leased notification a while longer, just before it is sent:
    /// false when `owner` no longer holds it (its lease ran out and another
    /// deliverer took it), and it is not sent.
    pub(crate) async fn renew_notification(
        &mut self,
        outbox_id: i64,
        owner: &str,
        until: i64,
    ) -> TxResult<bool> {
        let renewed = self
            .sql
            .execute(
                "UPDATE notify_outbox SET lease_until = $1
                  WHERE id = $2 AND lease_owner = $3 AND delivered_at IS NULL AND dead_at IS NULL",
                args![until, outbox_id, owner],
            )
            .await?;
        Ok(renewed == 1)
    }

    /// Deletes the delivered and dead notifications older than `before`.
    pub(crate) async fn delete_settled_notifications(&mut self, before: i64) -> TxResult<u64> {
        self.sql
            .execute(
                "DELETE FROM notify_outbox
                  WHERE (delivered_at IS NOT NULL OR dead_at IS NOT NULL) AND created_at < $1",
                args![before],
            )
            .await
    }

    /// Records an attempt at a notification `owner` holds; false when it no
    /// longer holds it (its lease ran out and another took it).
    pub(crate) async fn settle_notification(
        &mut self,
        outbox_id: i64,
        owner: &str,
        result: &DeliveryResult,
        now: i64,
    ) -> TxResult<bool> {
        let changed = match result {
            DeliveryResult::Delivered => {
                self.sql
                    .execute(
                        "UPDATE notify_outbox SET delivered_at = $1, attempts = attempts + 1, last_error = NULL,
                                first_tried_at = COALESCE(first_tried_at, $1), lease_owner = NULL, lease_until = NULL
                          WHERE id = $2 AND lease_owner = $3 AND delivered_at IS NULL AND dead_at IS NULL",
                        args![now, outbox_id, owner],
                    )
                    .await?
            }
            DeliveryResult::Failed { error, next } => {
                let (retry_at, dead_at) = match next {
                    AfterFailure::RetryAt(at) => (*at, None),
                    AfterFailure::Dead => (now, Some(now)),
                };
                self.sql
                    .execute(
                        "UPDATE notify_outbox SET attempts = attempts + 1, last_error = $1, next_attempt_at = $2,
                                dead_at = $3, first_tried_at = COALESCE(first_tried_at, $4), lease_owner = NULL, lease_until = NULL
                          WHERE id = $5 AND lease_owner = $6 AND delivered_at IS NULL AND dead_at IS NULL",
                        args![error, retry_at, dead_at, now, outbox_id, owner],
                    )
                    .await?
            }
        };
        Ok(changed == 1)
    }

    /// A fresh card id no card has: `t_` and eight hex digits.
    pub(crate) async fn new_task_id(&mut self) -> TxResult<String> {
        loop {
            let mut bytes = [0_u8; 4];
            getrandom::fill(&mut bytes).map_err(|error| {
                BoardError::Storage(format!("no randomness for a card id: {error}"))
            })?;
            let candidate: String = std::iter::once("t_".to_owned())
                .chain(bytes.iter().map(|byte| format!("{byte:02x}")))
                .collect();
            let taken = self
                .flag(
                    "SELECT EXISTS (SELECT 1 FROM tasks WHERE id = $1)",
                    args![&candidate],
                )
                .await?;
            if !taken {
                return Ok(candidate);
            }
        }
    }

    /// Inserts a card, and its links to its parents.
    pub(crate) async fn insert_task(
        &mut self,
        id: &str,
        new: &NewTask,
        status: TaskStatus,
        now: i64,
    ) -> TxResult<()> {
        let scheduled_at = new.every_seconds.map(|_| new.not_before.unwrap_or(now));
        let workspace = new.workspace.clone().unwrap_or_default();
        self.sql
            .execute(
                "INSERT INTO tasks (id, title, body, assignee, status, priority, created_at, idempotency_key,
                                    max_retries, goal_mode, goal_max_turns, max_runtime_seconds,
                                    not_before, every_seconds, scheduled_at, created_by, tenant,
                                    workspace_kind, workspace_path, branch_name)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17,
                         $18, $19, $20)",
                args![
                    id,
                    &new.title,
                    new.body.as_deref(),
                    new.assignee.as_deref(),
                    status.as_str(),
                    new.priority,
                    now,
                    new.idempotency_key.as_deref(),
                    new.max_retries,
                    new.goal_mode,
                    new.goal_max_turns,
                    new.max_runtime_seconds,
                    new.not_before,
                    new.every_seconds,
                    scheduled_at,
                    new.created_by.as_deref(),
                    new.tenant.as_deref(),
                    workspace.kind.as_str(),
                    workspace.path.as_deref(),
                    new.branch.as_deref(),
                ],
            )
            .await?;
        for parent in &new.parents {
            self.insert_link(parent, id).await?;
        }
        Ok(())
    }

    /// Makes `child` wait for `parent`.
    pub(crate) async fn insert_link(&mut self, parent: &str, child: &str) -> TxResult<()> {
        self.sql
            .execute(
                "INSERT INTO task_links (parent_id, child_id) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                args![parent, child],
            )
            .await?;
        Ok(())
    }

    /// Whether `child` waits for `parent` directly.
    pub(crate) async fn waits_on(&mut self, parent: &str, child: &str) -> TxResult<bool> {
        let row = self
            .one(
                "SELECT 1 FROM task_links WHERE parent_id = $1 AND child_id = $2",
                args![parent, child],
            )
            .await?;
        Ok(row.is_some())
    }

    /// A card's assignee (none for a card with none, or none on the board).
    pub(crate) async fn assignee_of(&mut self, task_id: &str) -> TxResult<Option<String>> {
        Ok(self.maker_of(task_id).await?.0)
    }

    /// A card's assignee and tenant: what a card made from inside its run
    /// takes from it.
    pub(crate) async fn maker_of(
        &mut self,
        task_id: &str,
    ) -> TxResult<(Option<String>, Option<String>)> {
        let row = self
            .one(
                "SELECT assignee, tenant FROM tasks WHERE id = $1",
                args![task_id],
            )
            .await?;
        match row {
            Some(row) => Ok((row.opt_text(0)?, row.opt_text(1)?)),
            None => Ok((None, None)),
        }
    }

    /// Those of `ids` the board has, with their maker and whether they wait
    /// for `task_id`.
    pub(crate) async fn made_cards(
        &mut self,
        task_id: &str,
        ids: &[String],
    ) -> TxResult<Vec<MadeCard>> {
        let query = format!(
            "SELECT t.id, t.created_by,
                    EXISTS (SELECT 1 FROM task_links l WHERE l.parent_id = $1 AND l.child_id = t.id)
               FROM tasks t WHERE t.id {}",
            (self.sql.dialect().any)(2)
        );
        let found = self.sql.rows(&query, args![task_id, ids]).await?;
        rows(found, |row| {
            Ok(MadeCard {
                id: row.text(0)?,
                created_by: row.opt_text(1)?,
                child: row.flag(2)?,
            })
        })
    }

    /// The swarm notes on `root` (comments starting with the seed system's
    /// blackboard prefix), newest first.
    pub(crate) async fn swarm_notes(&mut self, root: &str) -> TxResult<Vec<String>> {
        let found = self
            .sql
            .rows(
                "SELECT body FROM task_comments WHERE task_id = $1 AND body LIKE $2 ORDER BY id DESC",
                args![root, &format!("{}%", kanban_core::swarm::BLACKBOARD_PREFIX)],
            )
            .await?;
        rows(found, |row| row.text(0))
    }

    /// Ends `child`'s wait for `parent`; whether it waited.
    pub(crate) async fn delete_link(&mut self, parent: &str, child: &str) -> TxResult<bool> {
        let deleted = self
            .sql
            .execute(
                "DELETE FROM task_links WHERE parent_id = $1 AND child_id = $2",
                args![parent, child],
            )
            .await?;
        Ok(deleted > 0)
    }

    /// The board's links, read after taking turns on them.
    pub(crate) async fn links_to_change(&mut self) -> TxResult<Vec<(String, String)>> {
        self.sql.take_turns(Turns::Links, "links").await?;
        self.links().await
    }

    pub(crate) async fn insert_comment(
        &mut self,
        task_id: &str,
        author: &str,
        body: &str,
        now: i64,
    ) -> TxResult<()> {
        self.sql
            .execute(
                "INSERT INTO task_comments (task_id, author, body, created_at) VALUES ($1, $2, $3, $4)",
                args![task_id, author, body, now],
            )
            .await?;
        Ok(())
    }

    /// Sets the lease of the claim's card and run, and the heartbeat time.
    pub(crate) async fn set_lease(
        &mut self,
        claim: &Claim,
        expires: i64,
        heartbeat: Option<i64>,
    ) -> TxResult<()> {
        for (table, key) in [
            ("tasks", Param::Text(&claim.task_id)),
            ("task_runs", Param::Int(claim.run_id)),
        ] {
            let query = format!(
                "UPDATE {table} SET claim_expires = $1, last_heartbeat_at = COALESCE($2, last_heartbeat_at)
                  WHERE id = $3"
            );
            self.sql
                .execute(&query, &[Param::Int(expires), Param::from(heartbeat), key])
                .await?;
        }
        Ok(())
    }

    /// Records a worker on the claim's card (while it runs under the claim)
    /// and run; false when the card no longer runs under it.
    pub(crate) async fn record_spawn(
        &mut self,
        claim: &Claim,
        process: &WorkerProcess,
    ) -> TxResult<bool> {
        let pid = i64::from(process.pid);
        let changed = self
            .sql
            .execute(
                "UPDATE tasks SET worker_pid = $1, worker_started_at = $2
                  WHERE id = $3 AND status = 'running' AND current_run_id = $4 AND claim_lock = $5",
                args![
                    pid,
                    process.started_at,
                    &claim.task_id,
                    claim.run_id,
                    &claim.claim_lock
                ],
            )
            .await?;
        if changed != 1 {
            return Ok(false);
        }
        self.sql
            .execute(
                "UPDATE task_runs SET worker_pid = $1, worker_started_at = $2, worker_seal = $3 WHERE id = $4",
                args![pid, process.started_at, process.seal_digest.as_deref(), claim.run_id],
            )
            .await?;
        Ok(true)
    }

    /// Opens a run; its id.
    pub(crate) async fn open_run(&mut self, opening: &RunOpening) -> TxResult<i64> {
        self.sql
            .insert_id(
                "INSERT INTO task_runs (task_id, profile, status, claim_lock, claim_expires, started_at, lease_ttl)
                 VALUES ($1, $2, 'running', $3, $4, $5, $6)",
                args![
                    &opening.task_id,
                    opening.profile.as_deref(),
                    &opening.claim_lock,
                    opening.expires,
                    opening.started_at,
                    opening.ttl,
                ],
            )
            .await
    }

    /// Gives the card to the opened run, if it is still ready and unclaimed:
    /// the claim's compare-and-set.
    pub(crate) async fn take_card(&mut self, opening: &RunOpening, run_id: i64) -> TxResult<bool> {
        let taken = self
            .sql
            .execute(
                "UPDATE tasks SET status = 'running', claim_lock = $1, claim_expires = $2, current_run_id = $3,
                                  started_at = COALESCE(started_at, $4), last_heartbeat_at = NULL
                  WHERE id = $5 AND status IN ('ready', 'review') AND claim_lock IS NULL",
                args![&opening.claim_lock, opening.expires, run_id, opening.started_at, &opening.task_id],
            )
            .await?;
        Ok(taken == 1)
    }

    /// Keeps what a dispatcher says of itself (one row per host) and adds
    /// its ticks to the histogram.
    pub(crate) async fn add_report(&mut self, report: &DispatcherReport, now: i64) -> TxResult<()> {
        let in_flight = i64::try_from(report.in_flight).unwrap_or(i64::MAX);
        let why = report.state.why().map(crate::storable_text);
        self.sql
            .execute(
                "INSERT INTO dispatchers (host, reported_at, in_flight, state, why) VALUES ($1, $2, $3, $4, $5)
                 ON CONFLICT (host) DO UPDATE SET reported_at = excluded.reported_at,
                     in_flight = excluded.in_flight, state = excluded.state, why = excluded.why",
                args![
                    &report.host,
                    now,
                    in_flight,
                    report.state.as_str(),
                    why.as_deref()
                ],
            )
            .await?;
        self.add_ticks(&report.host, &report.ticks).await
    }

    /// What each host's dispatcher last said, the latest first.
    pub(crate) async fn dispatchers(&mut self) -> TxResult<Vec<DispatcherSeen>> {
        mapped(
            self.sql,
            "SELECT host, reported_at, in_flight, state, why FROM dispatchers ORDER BY reported_at DESC, host LIMIT 100",
            &[],
            |row| {
                Ok(DispatcherSeen {
                    host: row.text(0)?,
                    reported_at: row.int(1)?,
                    in_flight: row.int(2)?,
                    state: row.text(3)?,
                    why: row.opt_text(4)?,
                })
            },
        )
        .await
    }

    async fn add_ticks(&mut self, host: &str, ticks: &TickDurations) -> TxResult<()> {
        let add = "INSERT INTO dispatcher_ticks (host, bucket, count) VALUES ($1, $2, $3)
                   ON CONFLICT (host, bucket) DO UPDATE SET count = dispatcher_ticks.count + excluded.count";
        let counts = ticks
            .buckets
            .iter()
            .enumerate()
            .map(|(bucket, count)| (limit(bucket), *count));
        // Bucket -1 holds the sum; a zero adds nothing, so it is not sent.
        for (bucket, count) in counts.chain([(-1, ticks.sum_ms)]) {
            if count != 0 {
                let count = i64::try_from(count).unwrap_or(i64::MAX);
                self.sql.execute(add, args![host, bucket, count]).await?;
            }
        }
        Ok(())
    }

    /// Marks `run_id` the probe of the walls of `scopes`.
    pub(crate) async fn set_probe(&mut self, scopes: &[String], run_id: i64) -> TxResult<()> {
        let query = format!(
            "UPDATE provider_walls SET probe_run = $1 WHERE scope {}",
            (self.sql.dialect().any)(2)
        );
        self.sql.execute(&query, args![run_id, scopes]).await?;
        Ok(())
    }

    /// Deletes the wall of `scope`; its source (`TASK#RUN`), if it stood.
    pub(crate) async fn take_wall(&mut self, scope: &str) -> TxResult<Option<String>> {
        let source = self
            .one(
                "SELECT source FROM provider_walls WHERE scope = $1",
                args![scope],
            )
            .await?
            .map(|row| row.text(0))
            .transpose()?;
        self.sql
            .execute("DELETE FROM provider_walls WHERE scope = $1", args![scope])
            .await?;
        Ok(source)
    }

    /// Deletes the events older than `before` of done and archived cards.
    pub(crate) async fn delete_settled_events(&mut self, before: i64) -> TxResult<u64> {
        self.sql
            .execute(
                "DELETE FROM task_events WHERE created_at < $1
                    AND task_id IN (SELECT id FROM tasks WHERE status IN ('done', 'archived'))",
                args![before],
            )
            .await
    }

    /// Deletes a card with its runs, events, comments, attachments and links.
    pub(crate) async fn delete_card(&mut self, task_id: &str) -> TxResult<()> {
        for query in [
            "DELETE FROM task_events WHERE task_id = $1",
            "DELETE FROM task_comments WHERE task_id = $1",
            "DELETE FROM task_runs WHERE task_id = $1",
            "DELETE FROM task_attachments WHERE task_id = $1",
            "DELETE FROM task_links WHERE child_id = $1 OR parent_id = $1",
            "DELETE FROM notify_outbox WHERE task_id = $1",
            "DELETE FROM tasks WHERE id = $1",
        ] {
            self.sql.execute(query, args![task_id]).await?;
        }
        Ok(())
    }

    /// Sets both lease expiries of a card's current run (tests, operators).
    pub(crate) async fn set_lease_expiry(&mut self, task_id: &str, expires: i64) -> TxResult<()> {
        self.sql
            .execute(
                "UPDATE task_runs SET claim_expires = $1
                  WHERE id = (SELECT current_run_id FROM tasks WHERE id = $2)",
                args![expires, task_id],
            )
            .await?;
        self.sql
            .execute(
                "UPDATE tasks SET claim_expires = $1 WHERE id = $2",
                args![expires, task_id],
            )
            .await?;
        Ok(())
    }
}

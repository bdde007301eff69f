//! The schema, as numbered migrations recorded in `kanban_schema`.
//!
//! Names follow the SQLite board's, so the two read alike; types are
//! PostgreSQL's own (`BIGINT` times in epoch seconds, `BOOLEAN`, `JSONB`
//! event payloads). Run ids come from a sequence: never handed out twice,
//! even after a prune, so a run id stays a fencing token.

use kanban_core::BoardError;

use kanban_board::TxResult;

use crate::conn::{Conn, pg};

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = 7;

/// Migration N (1-based) brings a board from version N-1 to N.
pub const MIGRATIONS: [&str; 7] = [
    r#"
CREATE TABLE tasks (
    id                   TEXT PRIMARY KEY,
    seq                  BIGSERIAL NOT NULL,
    title                TEXT NOT NULL,
    body                 TEXT,
    assignee             TEXT,
    status               TEXT NOT NULL,
    priority             BIGINT NOT NULL DEFAULT 0,
    created_at           BIGINT NOT NULL,
    started_at           BIGINT,
    completed_at         BIGINT,
    claim_lock           TEXT,
    claim_expires        BIGINT,
    result               TEXT,
    idempotency_key      TEXT,
    consecutive_failures BIGINT NOT NULL DEFAULT 0,
    worker_pid           BIGINT,
    worker_started_at    BIGINT,
    last_failure_error   TEXT,
    max_runtime_seconds  BIGINT,
    last_heartbeat_at    BIGINT,
    current_run_id       BIGINT,
    max_retries          BIGINT,
    goal_mode            BOOLEAN NOT NULL DEFAULT FALSE,
    goal_max_turns       BIGINT,
    not_before           BIGINT,
    held_reason          TEXT,
    every_seconds        BIGINT,
    scheduled_at         BIGINT
);
CREATE TABLE task_links (
    parent_id  TEXT NOT NULL,
    child_id   TEXT NOT NULL,
    PRIMARY KEY (parent_id, child_id)
);
CREATE TABLE task_comments (
    id BIGSERIAL PRIMARY KEY, task_id TEXT NOT NULL,
    author TEXT NOT NULL, body TEXT NOT NULL, created_at BIGINT NOT NULL
);
CREATE TABLE task_events (
    id BIGSERIAL PRIMARY KEY, task_id TEXT NOT NULL, run_id BIGINT,
    kind TEXT NOT NULL, payload JSONB, created_at BIGINT NOT NULL
);
CREATE TABLE task_runs (
    id                  BIGSERIAL PRIMARY KEY,
    task_id             TEXT NOT NULL,
    profile             TEXT,
    status              TEXT NOT NULL,
    claim_lock          TEXT,
    claim_expires       BIGINT,
    worker_pid          BIGINT,
    worker_started_at   BIGINT,
    worker_seal         TEXT,
    lease_ttl           BIGINT,
    last_heartbeat_at   BIGINT,
    started_at          BIGINT NOT NULL,
    ended_at            BIGINT,
    outcome             TEXT,
    summary             TEXT,
    error               TEXT
);
CREATE TABLE provider_walls (
    scope          TEXT PRIMARY KEY,
    kind           TEXT NOT NULL,
    route          TEXT NOT NULL,
    since          BIGINT NOT NULL,
    until          BIGINT NOT NULL,
    reason         TEXT NOT NULL,
    source         TEXT NOT NULL,
    hits           BIGINT NOT NULL,
    failed_probes  BIGINT NOT NULL DEFAULT 0,
    probe_run      BIGINT
);
CREATE TABLE dispatcher_ticks (
    host    TEXT NOT NULL,
    bucket  BIGINT NOT NULL,
    count   BIGINT NOT NULL,
    PRIMARY KEY (host, bucket)
);
CREATE INDEX idx_tasks_lane_order  ON tasks(status, priority DESC, created_at, seq);
CREATE INDEX idx_tasks_idempotency ON tasks(idempotency_key);
CREATE INDEX idx_links_child       ON task_links(child_id);
CREATE INDEX idx_comments_task     ON task_comments(task_id, id);
CREATE INDEX idx_events_task_kind  ON task_events(task_id, kind, id);
CREATE INDEX idx_runs_task         ON task_runs(task_id, id);
"#,
    // 2: a held card waits in the seed system's `scheduled` lane, which
    // neither system claims; a block has the seed system's kind and
    // unblock-loop counter.
    r#"
UPDATE tasks SET status = 'scheduled' WHERE status IN ('ready', 'todo') AND held_reason IS NOT NULL;
ALTER TABLE tasks ADD COLUMN block_kind TEXT;
ALTER TABLE tasks ADD COLUMN block_recurrences BIGINT NOT NULL DEFAULT 0;
"#,
    // 3: who made a card (a worker's fan-out names its card's assignee),
    // and what a run handed over besides its summary.
    r#"
ALTER TABLE tasks ADD COLUMN created_by TEXT;
ALTER TABLE task_runs ADD COLUMN metadata JSONB;
"#,
    // 4: the namespace a card belongs to, and the files attached to cards
    // (the file itself in the board's attachments folder on this host).
    r#"
ALTER TABLE tasks ADD COLUMN tenant TEXT;
CREATE INDEX idx_tasks_tenant ON tasks(tenant);
CREATE TABLE task_attachments (
    id           BIGSERIAL PRIMARY KEY,
    task_id      TEXT NOT NULL,
    filename     TEXT NOT NULL,
    stored_path  TEXT NOT NULL,
    content_type TEXT,
    size         BIGINT NOT NULL DEFAULT 0,
    uploaded_by  TEXT,
    created_at   BIGINT NOT NULL
);
CREATE INDEX idx_attachments_task ON task_attachments(task_id, created_at);
"#,
    // 5: where a card's agent works (the seed system's columns).
    r#"
ALTER TABLE tasks ADD COLUMN workspace_kind TEXT NOT NULL DEFAULT 'scratch';
ALTER TABLE tasks ADD COLUMN workspace_path TEXT;
ALTER TABLE tasks ADD COLUMN branch_name TEXT;
"#,
    // 6: notifications: subscriptions, and the outbox a board writes in
    // the transaction of each event a subscription wants.
    r#"
CREATE TABLE notify_subscriptions (
    id          BIGSERIAL PRIMARY KEY,
    token       TEXT NOT NULL,
    scope       TEXT NOT NULL,
    target      TEXT,
    kinds       TEXT NOT NULL,
    channel     TEXT NOT NULL,
    address     TEXT NOT NULL,
    format      TEXT NOT NULL DEFAULT 'json',
    secret      TEXT,
    options     JSONB,
    created_by  TEXT,
    created_at  BIGINT NOT NULL,
    removed_at  BIGINT
);
CREATE TABLE notify_outbox (
    id              BIGSERIAL PRIMARY KEY,
    subscription_id BIGINT NOT NULL,
    event_id        BIGINT NOT NULL,
    task_id         TEXT NOT NULL,
    created_at      BIGINT NOT NULL,
    attempts        BIGINT NOT NULL DEFAULT 0,
    next_attempt_at BIGINT NOT NULL,
    first_tried_at  BIGINT,
    last_error      TEXT,
    delivered_at    BIGINT,
    dead_at         BIGINT,
    lease_owner     TEXT,
    lease_until     BIGINT
);
CREATE INDEX idx_outbox_open ON notify_outbox(delivered_at, dead_at, next_attempt_at);
CREATE INDEX idx_outbox_order ON notify_outbox(subscription_id, task_id, id);
"#,
    // 7: what each host's dispatcher last said of itself (the web
    // board's health line).
    r#"
CREATE TABLE dispatchers (
    host         TEXT PRIMARY KEY,
    reported_at  BIGINT NOT NULL,
    in_flight    BIGINT NOT NULL,
    state        TEXT NOT NULL,
    why          TEXT
);
"#,
];

/// Any number fits: one lock id for "a kanban schema change is running".
const MIGRATION_LOCK: i64 = 0x6b61_6e62_616e; // "kanban"

/// Brings the schema to [`SCHEMA_VERSION`] inside the caller's transaction,
/// holding an advisory lock so that two dispatchers starting at once do not
/// both migrate. A newer schema is refused, never touched.
pub(crate) async fn migrate(conn: &mut Conn, board: &str) -> TxResult<()> {
    conn.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    conn.batch("CREATE TABLE IF NOT EXISTS kanban_schema (version BIGINT NOT NULL)")
        .await
        .map_err(pg)?;
    let found: Option<i64> = conn
        .value("SELECT MAX(version) FROM kanban_schema", &[])
        .await?;
    let found = found.unwrap_or(0);
    if found > SCHEMA_VERSION {
        return Err(BoardError::NewerSchema {
            path: board.to_owned(),
            found,
            supported: SCHEMA_VERSION,
        }
        .into());
    }
    for (index, migration) in MIGRATIONS.iter().enumerate() {
        let version = i64::try_from(index).unwrap_or(i64::MAX) + 1;
        if version <= found {
            continue;
        }
        conn.batch(migration).await.map_err(pg)?;
        conn.execute(
            "INSERT INTO kanban_schema (version) VALUES ($1)",
            &[&version],
        )
        .await?;
    }
    Ok(())
}

//! The schema, as numbered migrations under `PRAGMA user_version`.
//!
//! Table and column names are those of the seed system's board, so a board
//! file means the same thing to both.

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = 10;

/// Migration N (1-based) brings a board from version N-1 to N. Public so
/// tests can build a board of any earlier version.
pub const MIGRATIONS: [&str; 10] = [
    r#"
CREATE TABLE IF NOT EXISTS tasks (
    id                   TEXT PRIMARY KEY,
    title                TEXT NOT NULL,
    body                 TEXT,
    assignee             TEXT,
    status               TEXT NOT NULL,
    priority             INTEGER DEFAULT 0,
    created_by           TEXT,
    created_at           INTEGER NOT NULL,
    started_at           INTEGER,
    completed_at         INTEGER,
    workspace_kind       TEXT NOT NULL DEFAULT 'scratch',
    workspace_path       TEXT,
    branch_name          TEXT,
    project_id           TEXT,
    claim_lock           TEXT,
    claim_expires        INTEGER,
    tenant               TEXT,
    result               TEXT,
    idempotency_key      TEXT,
    consecutive_failures INTEGER NOT NULL DEFAULT 0,
    worker_pid           INTEGER,
    worker_started_at    INTEGER,
    last_failure_error   TEXT,
    max_runtime_seconds  INTEGER,
    last_heartbeat_at    INTEGER,
    current_run_id       INTEGER,
    workflow_template_id TEXT,
    current_step_key     TEXT,
    skills               TEXT,
    model_override       TEXT,
    provider_override    TEXT,
    reasoning_effort     TEXT,
    max_retries          INTEGER,
    goal_mode            INTEGER NOT NULL DEFAULT 0,
    goal_max_turns       INTEGER,
    session_id           TEXT,
    block_kind           TEXT,
    block_recurrences    INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS task_links (
    parent_id  TEXT NOT NULL,
    child_id   TEXT NOT NULL,
    PRIMARY KEY (parent_id, child_id)
);
CREATE TABLE IF NOT EXISTS task_comments (
    id INTEGER PRIMARY KEY AUTOINCREMENT, task_id TEXT NOT NULL,
    author TEXT NOT NULL, body TEXT NOT NULL, created_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS task_events (
    id INTEGER PRIMARY KEY AUTOINCREMENT, task_id TEXT NOT NULL, run_id INTEGER,
    kind TEXT NOT NULL, payload TEXT, created_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS task_runs (
    id                  INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id             TEXT NOT NULL,
    profile             TEXT,
    step_key            TEXT,
    status              TEXT NOT NULL,
    claim_lock          TEXT,
    claim_expires       INTEGER,
    worker_pid          INTEGER,
    worker_started_at   INTEGER,
    max_runtime_seconds INTEGER,
    last_heartbeat_at   INTEGER,
    started_at          INTEGER NOT NULL,
    ended_at            INTEGER,
    outcome             TEXT,
    summary             TEXT,
    metadata            TEXT,
    error               TEXT
);
CREATE INDEX IF NOT EXISTS idx_tasks_lane_order  ON tasks(status, priority DESC, created_at);
CREATE INDEX IF NOT EXISTS idx_tasks_idempotency ON tasks(idempotency_key);
CREATE INDEX IF NOT EXISTS idx_links_child       ON task_links(child_id);
CREATE INDEX IF NOT EXISTS idx_links_parent      ON task_links(parent_id);
CREATE INDEX IF NOT EXISTS idx_comments_task     ON task_comments(task_id, created_at);
CREATE INDEX IF NOT EXISTS idx_events_task_kind  ON task_events(task_id, kind, id);
CREATE INDEX IF NOT EXISTS idx_runs_task         ON task_runs(task_id, started_at);
"#,
    // 2: a rate-limited run can hold its card for the provider's Retry-After.
    "ALTER TABLE task_runs ADD COLUMN hold_until INTEGER;",
    // 3: a card is held until `not_before` (backoff, cooldown, Retry-After),
    // decided by core when the run is booked; a run keeps its lease length
    // and the digest of the seal its worker signs its exit trailer with.
    r#"
ALTER TABLE tasks ADD COLUMN not_before INTEGER;
ALTER TABLE task_runs ADD COLUMN lease_ttl INTEGER;
ALTER TABLE task_runs ADD COLUMN worker_seal TEXT;
UPDATE tasks SET not_before = (SELECT MAX(r.hold_until) FROM task_runs r WHERE r.task_id = tasks.id)
 WHERE status = 'ready';
"#,
    // 4: provider walls, shared by every dispatcher of the board (see
    // kanban_core::walls): nothing of a walled scope is spawned before
    // `until`, then one probe run goes through.
    r#"
CREATE TABLE IF NOT EXISTS provider_walls (
    scope          TEXT PRIMARY KEY,
    kind           TEXT NOT NULL,
    route          TEXT NOT NULL,
    since          INTEGER NOT NULL,
    until          INTEGER NOT NULL,
    reason         TEXT NOT NULL,
    source         TEXT NOT NULL,
    hits           INTEGER NOT NULL,
    failed_probes  INTEGER NOT NULL DEFAULT 0,
    probe_run      INTEGER
);
"#,
    // 5: the operator's lifecycle: a hold (why; NULL: not held), and
    // recurring cards (the period and when this occurrence was due).
    r#"
ALTER TABLE tasks ADD COLUMN held_reason TEXT;
ALTER TABLE tasks ADD COLUMN every_seconds INTEGER;
ALTER TABLE tasks ADD COLUMN scheduled_at INTEGER;
"#,
    // 6: the dispatchers' tick durations, a histogram per host (bucket
    // -1 holds the sum of milliseconds), for /metrics.
    r#"
CREATE TABLE IF NOT EXISTS dispatcher_ticks (
    host    TEXT NOT NULL,
    bucket  INTEGER NOT NULL,
    count   INTEGER NOT NULL,
    PRIMARY KEY (host, bucket)
);
"#,
    // 7: a held card waits in the seed system's `scheduled` lane, which
    // neither system claims (it kept its lane before, and the seed
    // system's claim took it).
    r#"
UPDATE tasks SET status = 'scheduled' WHERE status IN ('ready', 'todo') AND held_reason IS NOT NULL;
"#,
    // 8: files attached to cards, as the seed system records them (the
    // file itself in the board's attachments folder).
    r#"
CREATE TABLE IF NOT EXISTS task_attachments (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id      TEXT NOT NULL,
    filename     TEXT NOT NULL,
    stored_path  TEXT NOT NULL,
    content_type TEXT,
    size         INTEGER NOT NULL DEFAULT 0,
    uploaded_by  TEXT,
    created_at   INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS idx_attachments_task ON task_attachments(task_id, created_at);
CREATE INDEX IF NOT EXISTS idx_tasks_tenant ON tasks(tenant);
"#,
    // 9: notifications: subscriptions, and the outbox a board writes in
    // the transaction of each event a subscription wants.
    r#"
CREATE TABLE IF NOT EXISTS notify_subscriptions (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    token       TEXT NOT NULL,
    scope       TEXT NOT NULL,
    target      TEXT,
    kinds       TEXT NOT NULL,
    channel     TEXT NOT NULL,
    address     TEXT NOT NULL,
    format      TEXT NOT NULL DEFAULT 'json',
    secret      TEXT,
    options     TEXT,
    created_by  TEXT,
    created_at  INTEGER NOT NULL,
    removed_at  INTEGER
);
CREATE TABLE IF NOT EXISTS notify_outbox (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    subscription_id INTEGER NOT NULL,
    event_id        INTEGER NOT NULL,
    task_id         TEXT NOT NULL,
    created_at      INTEGER NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at INTEGER NOT NULL,
    first_tried_at  INTEGER,
    last_error      TEXT,
    delivered_at    INTEGER,
    dead_at         INTEGER,
    lease_owner     TEXT,
    lease_until     INTEGER
);
CREATE INDEX IF NOT EXISTS idx_outbox_open ON notify_outbox(delivered_at, dead_at, next_attempt_at);
CREATE INDEX IF NOT EXISTS idx_outbox_order ON notify_outbox(subscription_id, task_id, id);
"#,
    // 10: what each host's dispatcher last said of itself (the web
    // board's health line).
    r#"
CREATE TABLE IF NOT EXISTS dispatchers (
    host         TEXT PRIMARY KEY,
    reported_at  INTEGER NOT NULL,
    in_flight    INTEGER NOT NULL,
    state        TEXT NOT NULL,
    why          TEXT
);
"#,
];

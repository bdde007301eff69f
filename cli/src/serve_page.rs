//! The web board's HTML (maud: checked at compile time, escaped by default).
//! The style and the script are embedded (served under `/assets/`):
//! `kanban serve` needs nothing else.

use kanban_core::{TaskRecord, TaskStatus, TaskView};
use maud::{DOCTYPE, Markup, html};

use crate::output::{human_time, short};
use crate::serve::{App, LANE_LIMIT, Lanes};

/// A card as its lane shows it.
pub(crate) struct CardTile {
    pub(crate) task: TaskRecord,
    /// Seconds left of its lease, while it runs.
    pub(crate) lease_left: Option<i64>,
    /// Its newest event: kind and time.
    pub(crate) last_event: Option<(String, i64)>,
}

pub(crate) const STYLE: &str = r#"
:root { --bg:#f5f6f8; --card:#fff; --ink:#1d2430; --muted:#6b7380; --line:#e2e5ea;
        --ready:#2f6fde; --running:#d98a00; --blocked:#c8372d; --done:#2e8b57; --todo:#7a7f8a; }
* { box-sizing: border-box; }
body { margin:0; font:14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; background:var(--bg); color:var(--ink); }
header { display:flex; align-items:center; gap:16px; padding:12px 20px; background:#1d2430; color:#fff; }
header h1 { font-size:16px; margin:0; font-weight:600; }
header h1 a.home { color:inherit; text-decoration:none; }
header .path { color:#aab3c2; font-family:ui-monospace, monospace; font-size:12px; }
header .live { margin-left:auto; font-size:12px; color:#8fd19e; }
main { padding:16px 20px; }
.lanes { display:grid; grid-template-columns:repeat(auto-fit, minmax(200px, 1fr)); gap:12px; align-items:start; }
.lane { background:#eceef2; border-radius:8px; padding:8px; }
.lane h2 { font-size:12px; text-transform:uppercase; letter-spacing:.06em; margin:4px 4px 8px; display:flex; justify-content:space-between; }
.lane.todo h2 { color:var(--todo); } .lane.ready h2 { color:var(--ready); } .lane.running h2 { color:var(--running); }
.lane.blocked h2 { color:var(--blocked); } .lane.done h2 { color:var(--done); }
.card { display:block; background:var(--card); border:1px solid var(--line); border-radius:6px; padding:8px 10px; margin-bottom:6px; color:inherit; text-decoration:none; }
.card:hover { border-color:#b8c0cc; }
.card .title { font-weight:600; }
.meta { color:var(--muted); font-size:12px; display:flex; flex-wrap:wrap; gap:8px; margin-top:4px; }
.pill { border-radius:10px; padding:0 6px; background:#eef1f5; }
.pill.warn { background:#fdecea; color:var(--blocked); }
.more { color:var(--muted); font-size:12px; padding:4px; }
form.inline { display:inline; }
.add { display:flex; gap:6px; margin-bottom:14px; flex-wrap:wrap; }
input, textarea { font:inherit; padding:5px 8px; border:1px solid var(--line); border-radius:5px; }
button { font:inherit; padding:5px 10px; border:1px solid #c9ced6; border-radius:5px; background:#fff; cursor:pointer; }
button.primary { background:var(--ready); border-color:var(--ready); color:#fff; }
table { border-collapse:collapse; width:100%; background:#fff; }
th, td { text-align:left; padding:5px 8px; border-bottom:1px solid var(--line); vertical-align:top; font-size:13px; }
th { color:var(--muted); font-weight:500; }
pre { background:#11161d; color:#d5dbe3; padding:10px; border-radius:6px; overflow:auto; max-height:360px; font-size:12px; }
.walls { background:#fff7e6; border:1px solid #f1d08a; border-radius:6px; padding:8px 12px; margin-bottom:12px; }
section { margin-bottom:18px; } section h3 { font-size:13px; color:var(--muted); text-transform:uppercase; letter-spacing:.05em; }
.actions { display:flex; gap:6px; flex-wrap:wrap; margin:10px 0; }
.body { white-space:pre-wrap; background:#fff; border:1px solid var(--line); border-radius:6px; padding:10px; }
"#;

/// Listens for `changed` and fetches the part of the page that changed.
pub(crate) const SCRIPT: &str = r#"
(function () {
  var target = document.querySelector('[data-fragment]');
  var state = document.getElementById('live');
  if (!target || !window.EventSource) return;
  var busy = false, again = false;
  function refresh() {
    if (busy) { again = true; return; }
    busy = true;
    fetch(target.getAttribute('data-fragment'), {credentials: 'same-origin'})
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) { if (html !== null) target.innerHTML = html; })
      .finally(function () { busy = false; if (again) { again = false; refresh(); } });
  }
  var source = new EventSource('/live');
  source.addEventListener('changed', refresh);
  source.onopen = function () { state.textContent = '● live'; };
  source.onerror = function () { state.textContent = '○ reconnecting'; };
})();
"#;

fn layout(app: &App, title: &str, content: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · kanban" }
                link rel="stylesheet" href="/assets/board.css";
            }
            body {
                header {
                    h1 { a.home href="/" { "kanban" } }
                    span.path { (app.board.name()) }
                    span.live #live { "○ connecting" }
                }
                main { (content) }
                script src="/assets/board.js" {}
            }
        }
    }
}

/// The board page.
pub(crate) fn board(app: &App, lanes: &Lanes) -> Markup {
    layout(
        app,
        "board",
        html! {
            form.add method="post" action="/actions/add" {
                input type="hidden" name="csrf" value=(app.csrf);
                input name="title" placeholder="New card title" required size="40";
                input name="assignee" placeholder="assignee (agent)";
                input name="tenant" placeholder="tenant";
                input name="priority" placeholder="priority" size="6";
                button.primary type="submit" id="add-card" { "Add card" }
            }
            div data-fragment="/fragments/lanes" { (self::lanes(app, lanes)) }
        },
    )
}

/// The lanes, alone: what a live board fetches on `changed`.
pub(crate) fn lanes(_app: &App, lanes: &Lanes) -> Markup {
    html! {
        @if !lanes.walls.is_empty() {
            div.walls {
                strong { "Provider walls: " }
                @for wall in &lanes.walls {
                    span.pill.warn title=(wall.reason) {
                        (short(&wall.scope, 50)) " — "
                        @if wall.until > lanes.now { "until " (human_time(wall.until, lanes.now)) } @else { "probing" }
                    }
                    " "
                }
            }
        }
        div.lanes {
            @for (status, count, tiles) in &lanes.lanes {
                div class={ "lane " (status) } data-lane=(status) {
                    h2 {
                        span { (status) }
                        span { (count) }
                    }
                    @if status == crate::serve::OTHER_LANE {
                        div.more { "statuses this kanban does not know: shown as they are, never claimed" }
                    }
                    @for tile in tiles { (card_tile(tile, lanes.now)) }
                    @if *count > LANE_LIMIT { div.more { "… and " (count - LANE_LIMIT) " more (see /api/cards)" } }
                }
            }
        }
    }
}

fn card_tile(tile: &CardTile, now: i64) -> Markup {
    let task = &tile.task;
    html! {
        a.card href={ "/cards/" (task.id) } data-card=(task.id) {
            div.title { (short(&task.title, 80)) }
            div.meta {
                span { (task.id) }
                @if task.status.known().is_none() { span.pill { (task.status) } }
                @if let Some(assignee) = &task.assignee { span.pill { "→ " (assignee) } }
                @if let Some(tenant) = &task.tenant { span.pill data-tenant=(tenant) { (tenant) } }
                @if let Some(run) = task.current_run_id { span { "run " (run) } }
                @if let Some(left) = tile.lease_left { span { "lease " (left.max(0)) "s" } }
                @if task.consecutive_failures > 0 { span.pill.warn { (task.consecutive_failures) " failed" } }
                @if let Some(reason) = &task.held_reason { span.pill.warn title=(reason) { "held" } }
                @if let Some(at) = task.not_before.filter(|at| *at > now) { span.pill { "waits " (crate::output::span(at - now)) } }
            }
            @if let Some((kind, at)) = &tile.last_event {
                div.meta { span data-last-event=(kind) { (kind.replace('_', " ")) " · " (now - at) "s ago" } }
            }
        }
    }
}

/// The status of each linked card, by id (`serve::linked_statuses`).
type Linked = std::collections::BTreeMap<String, String>;

/// A card's page.
/// What a card page shows besides the card.
pub(crate) struct CardParts<'a> {
    pub(crate) view: &'a TaskView,
    pub(crate) linked: &'a Linked,
    pub(crate) log_tail: &'a str,
    /// The subscriptions to this card's events.
    pub(crate) subscriptions: &'a [kanban_core::notify::SubscriptionView],
}

pub(crate) fn card(app: &App, parts: &CardParts<'_>, now: i64) -> Markup {
    let view = parts.view;
    layout(
        app,
        &view.task.title,
        html! {
            p { a href="/" { "← board" } }
            div data-fragment={ "/fragments/cards/" (view.task.id) } { (card_details(app, parts, now)) }
        },
    )
}

/// A card's line of facts: id, status, priority, whom it is for, its tenant.
fn card_meta(task: &kanban_core::TaskRecord, now: i64) -> Markup {
    let id = task.id.as_str();
    html! {
        div.meta {
            span { (id) }
            span.pill data-status=(task.status.as_str()) { (task.status.as_str()) }
            span { "priority " (task.priority) }
            @if let Some(assignee) = &task.assignee { span.pill { "→ " (assignee) } }
            @if let Some(tenant) = &task.tenant { span.pill data-tenant=(tenant) { "tenant " (tenant) } }
            @if let Some(maker) = &task.created_by { span { "by " (maker) } }
            @if task.workspace.is_some() {
                span.pill data-workspace=(task.workspace_kind()) {
                    (task.workspace_kind()) @if let Some(path) = task.workspace_path() { " " (path) }
                    @if let Some(branch) = task.branch_name() { " · " (branch) }
                }
            }
            span { (task.consecutive_failures) " failures" }
            @if let Some(reason) = &task.held_reason { span.pill.warn { "held: " (reason) } }
            @if let Some(kind) = &task.block_kind { @if matches!(task.status.known(), Some(TaskStatus::Blocked | TaskStatus::Triage)) { span.pill.warn { "block: " (kind) } } }
            span { "created " (human_time(task.created_at, now)) }
        }
    }
}

/// Where a run worked, as its handoff records it: the workspace, and a
/// worktree's branch and the commit it ended on.
fn worked_in(run: &kanban_core::RunRecord) -> String {
    let Some(facts) = &run.metadata else {
        return String::new();
    };
    let text = |key: &str| facts.get(key).and_then(serde_json::Value::as_str);
    let mut said: Vec<String> = text("workspace").map(str::to_owned).into_iter().collect();
    if let Some(branch) = text("branch") {
        said.push(branch.to_owned());
    }
    if let Some(commit) = text("commit") {
        said.push(commit.chars().take(12).collect());
    }
    said.join(" · ")
}

/// Who hears of this card's events, a button to stop each, and a form to
/// add a webhook.
fn notifications(
    app: &App,
    id: &str,
    subscriptions: &[kanban_core::notify::SubscriptionView],
) -> Markup {
    html! {
        section.notifications {
            h3 { "Notifications" }
            @if !subscriptions.is_empty() {
                ul {
                    @for sub in subscriptions {
                        li data-subscription=(sub.id) {
                            (sub.kinds.join(", ")) " → " (sub.channel) " " (sub.address)
                            @if sub.dead > 0 { " " span.pill.warn { (sub.dead) " dead" } }
                            form.inline method="post" action={ "/actions/" (id) "/unnotify" } {
                                input type="hidden" name="csrf" value=(app.csrf);
                                input type="hidden" name="text" value=(sub.id);
                                " " button type="submit" data-action="unnotify" { "Stop" }
                            }
                        }
                    }
                }
            }
            form method="post" action={ "/actions/" (id) "/notify" } {
                input type="hidden" name="csrf" value=(app.csrf);
                label { "Webhook " input name="text" type="url" placeholder="https://…" size="40" required; }
                " "
                label { "for " input name="events" value="needs_input,failed,done" size="24"; }
                " " button type="submit" data-action="notify" { "Notify" }
            }
        }
    }
}

/// A card's attached files, each a link that downloads it.
fn attachments(id: &str, files: &[kanban_core::attachments::AttachmentRecord]) -> Markup {
    html! {
        @if !files.is_empty() {
            section.attachments {
                h3 { "Attachments" }
                ul {
                    @for file in files {
                        li data-attachment=(file.id) {
                            a href={ "/cards/" (id) "/attachments/" (file.id) } { (file.filename) }
                            " · " (file.size) " bytes"
                            @if let Some(by) = &file.uploaded_by { " · by " (by) }
                        }
                    }
                }
            }
        }
    }
}

fn action(app: &App, id: &str, name: &str, label: &str, with_reason: bool) -> Markup {
    html! {
        form.inline method="post" action={ "/actions/" (id) "/" (name) } {
            input type="hidden" name="csrf" value=(app.csrf);
            @if with_reason { input name="reason" placeholder="why (optional)" size="14"; }
            button type="submit" data-action=(name) { (label) }
        }
    }
}

/// The exit code its dispatcher booked for a run, if it booked one.
fn exit_code(view: &TaskView, run: i64) -> String {
    view.events
        .iter()
        .rev()
        .filter(|event| event.run_id == Some(run))
        .find_map(|event| {
            event
                .payload
                .get("exit_code")
                .and_then(serde_json::Value::as_i64)
        })
        .map_or_else(|| "-".to_owned(), |code| code.to_string())
}

/// The cards a card waits for and those that wait for it, with their statuses.
fn links(view: &TaskView, linked: &Linked) -> Markup {
    html! {
        @for (label, ids) in [("Waits for", &view.parents), ("Waited for by", &view.children)] {
            @if !ids.is_empty() {
                section.links {
                    h3 { (label) }
                    ul {
                        @for linked_id in ids {
                            @let status = linked.get(linked_id).map_or("gone", String::as_str);
                            li { a href={ "/cards/" (linked_id) } { (linked_id) } " " span.pill data-status=(status) { (status) } }
                        }
                    }
                }
            }
        }
    }
}

/// A card's details, alone: what a live card page fetches on `changed`.
pub(crate) fn card_details(app: &App, parts: &CardParts<'_>, now: i64) -> Markup {
    let (view, linked, log_tail) = (parts.view, parts.linked, parts.log_tail);
    let task = &view.task;
    let id = task.id.as_str();
    html! {
        h2 { (task.title) }
        (card_meta(task, now))
        div.actions {
            @match task.status.known() {
                Some(TaskStatus::Blocked) => { (action(app, id, "unblock", "Unblock", false)) (action(app, id, "cancel", "Cancel", true)) }
                Some(TaskStatus::Running) => { (action(app, id, "reclaim", "Reclaim", true)) (action(app, id, "cancel", "Cancel", true)) }
                Some(TaskStatus::Ready | TaskStatus::Todo) => {
                    @if task.held_reason.is_some() { (action(app, id, "release", "Release", false)) }
                    @else { (action(app, id, "hold", "Hold", true)) }
                    (action(app, id, "cancel", "Cancel", true))
                }
                Some(TaskStatus::Scheduled) => {
                    @if task.held_reason.is_some() { (action(app, id, "release", "Release", false)) }
                    (action(app, id, "unblock", "Back in line now", false))
                    (action(app, id, "cancel", "Cancel", true))
                }
                Some(TaskStatus::Triage) => { (action(app, id, "promote", "Promote", false)) (action(app, id, "cancel", "Cancel", true)) }
                Some(TaskStatus::Review) => { (action(app, id, "cancel", "Cancel", true)) }
                _ => {}
            }
        }
        (links(view, linked))
        (attachments(id, &view.attachments))
        (notifications(app, id, parts.subscriptions))
        @if let Some(body) = &task.body { section { h3 { "Body" } div.body { (body) } } }
        @if let Some(result) = &task.result { section { h3 { "Result" } div.body { (result) } } }
        section {
            h3 { "Runs" }
            table {
                tr { th { "run" } th { "outcome" } th { "exit code" } th { "started" } th { "took" } th { "worked in" } th { "summary / error" } }
                @for run in &view.runs {
                    tr {
                        td { (run.id) }
                        td { (run.outcome.as_deref().unwrap_or(run.status.as_str())) }
                        td { (exit_code(view, run.id)) }
                        td { (human_time(run.started_at, now)) }
                        td { (run.ended_at.map_or_else(|| "running".to_owned(), |end| format!("{}s", end - run.started_at))) }
                        td data-worked-in=(run.id) { (worked_in(run)) }
                        td { (short(run.summary.as_deref().or(run.error.as_deref()).unwrap_or(""), 120)) }
                    }
                }
            }
        }
        section {
            h3 { "Comments" }
            @for comment in &view.comments {
                p { strong { (comment.author) } " · " span.meta { (human_time(comment.created_at, now)) } br; (comment.body) }
            }
            form method="post" action={ "/actions/" (id) "/comment" } {
                input type="hidden" name="csrf" value=(app.csrf);
                input name="text" placeholder="Steer the agent: a comment its next run reads" size="60" required;
                " " button type="submit" data-action="comment" { "Comment" }
            }
        }
        section {
            h3 { "Events" }
            table {
                tr { th { "at" } th { "run" } th { "kind" } th { "details" } }
                @for event in view.events.iter().rev().take(100) {
                    tr data-event=(event.kind) {
                        td { (human_time(event.created_at, now)) }
                        td { (event.run_id.map(|r| r.to_string()).unwrap_or_default()) }
                        td { (event.kind) }
                        td { (short(&event.payload.to_string(), 140)) }
                    }
                }
            }
        }
        @if !log_tail.is_empty() { section { h3 { "Log (tail)" } pre { (log_tail) } } }
    }
}

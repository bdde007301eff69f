//! The web board's HTML (maud: checked at compile time, escaped by default).
//! The style and the script are embedded (served under `/assets/`):
//! `kanban serve` needs nothing else.

use kanban_core::{TaskRecord, TaskStatus, TaskView};
use maud::{DOCTYPE, Markup, html};

use crate::output::{human_time, short};
use crate::serve::{App, LANE_LIMIT, Lanes};
use crate::serve_board::count_text;

/// A card as its lane shows it.
pub(crate) struct CardTile {
    pub(crate) task: TaskRecord,
    /// Seconds left of its lease, while it runs.
    pub(crate) lease_left: Option<i64>,
    /// Its newest event: kind and time.
    pub(crate) last_event: Option<(String, i64)>,
}

/// The page's style (light and dark, following the system).
pub(crate) const STYLE: &str = include_str!("../assets/board.css");

/// The page's script: live updates, drag and drop, keys, bulk actions.
pub(crate) const SCRIPT: &str = include_str!("../assets/board.js");

fn layout(app: &App, title: &str, content: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                meta name="color-scheme" content="light dark";
                title { (title) " · kanban" }
                link rel="stylesheet" href="/assets/board.css";
            }
            body data-base=(app.base) {
                a.skip href="#main" { "Skip to the board" }
                header {
                    h1 { a.home href=(app.home()) { "kanban" } }
                    span.path { (app.board.name()) }
                    @if app.boards.len() > 1 {
                        form.switch method="get" action="/switch" {
                            label { "Board " select name="board" data-switch {
                                @for board in app.boards.iter() {
                                    option value=(board.slug) selected[board.href == app.home()] { (board.name) }
                                }
                            } }
                            " " button type="submit" { "Open" }
                        }
                    }
                    nav aria-label="views" {
                        a href=(app.home()) { "Board" }
                        a href=(app.at("/walls")) { "Walls" }
                        a href=(app.at("/diagnostics")) { "Diagnostics" }
                        a href=(app.at("/notifications")) { "Notifications" }
                    }
                    button.help type="button" data-keys-help aria-haspopup="dialog" { "Keys (?)" }
                    span.live #live role="status" { "○ connecting" }
                }
                main #main { (content) }
                div #toast role="status" aria-live="polite" {}
                (keys_dialog())
                script src="/assets/board.js" {}
            }
        }
    }
}

/// The keys the board takes, listed by `?`.
const KEYS: [(&str, &str); 12] = [
    ("j / k", "next / previous card in the lane"),
    ("h / l", "card in the lane to the left / right"),
    ("Enter", "open the card"),
    ("x", "select the card for a bulk action"),
    ("r", "move to ready (unblock, promote, terminate a run)"),
    ("t", "move to triage"),
    ("v", "move to review"),
    ("s", "hold (move to scheduled)"),
    ("u", "release a hold"),
    ("a", "archive"),
    ("/", "search"),
    ("?", "this list"),
];

fn keys_dialog() -> Markup {
    html! {
        dialog #keys aria-labelledby="keys-title" {
            h2 #keys-title { "Keyboard" }
            p { "Focus a card (Tab, or j and k), then:" }
            table {
                @for (key, what) in KEYS { tr { th scope="row" { kbd { (key) } } td { (what) } } }
            }
            form method="dialog" { button type="submit" { "Close" } }
        }
    }
}

/// The agents a card may go to, for the assignee fields.
fn agents_list(agents: &[String]) -> Markup {
    html! {
        datalist #agents { @for agent in agents { option value=(agent) {} } }
    }
}

/// The board page.
pub(crate) fn board(app: &App, lanes: &Lanes, agents: &[String]) -> Markup {
    let query = &lanes.query;
    let fragment = app.at(&format!("/fragments/lanes?{}", lane_query(lanes)));
    layout(
        app,
        "board",
        html! {
            (agents_list(agents))
            details.add-card {
                summary { "Add a card" }
                (add_form(app, None))
            }
            form.filter method="get" action=(app.home()) role="search" aria-label="filter the board" {
                label { "Search " input #search type="search" name="q" value=(query.q) placeholder="title or id"; }
                label { "Assignee " input name="assignee" value=(query.assignee) list="agents" size="12"; }
                label { "Tenant " input name="tenant" value=(query.tenant) size="10"; }
                label { "Block " input name="block" value=(query.block) placeholder="needs_input…" size="12"; }
                @if !lanes.walls.is_empty() || !query.wall.is_empty() {
                    label { "Wall " select name="wall" {
                        option value="" { "any" }
                        @for wall in &lanes.walls {
                            option value=(wall.scope) selected[wall.scope == query.wall.trim()] { (short(&wall.scope, 50)) " (" (wall.route) ")" }
                        }
                    } }
                }
                @if !query.lane.is_empty() { input type="hidden" name="lane" value=(query.lane); }
                button type="submit" { "Filter" }
                @if !query.filter_string().is_empty() || !query.lane.is_empty() { " " a href=(app.home()) { "Clear" } }
            }
            form #bulk .bulk method="post" action=(app.at("/actions/bulk")) aria-label="act on the selected cards" {
                input type="hidden" name="csrf" value=(app.csrf);
                @for (name, value) in [("q", &query.q), ("assignee", &query.assignee), ("tenant", &query.tenant), ("block", &query.block), ("wall", &query.wall), ("lane", &query.lane)] {
                    input type="hidden" name=(name) value=(value);
                }
                @if lanes.page > 1 { input type="hidden" name="page" value=(lanes.page); }
                span #selected { "Selected cards:" }
                label { "Action "
                    select name="action" {
                        @for (value, label) in BULK_LABELS { option value=(value) { (label) } }
                    }
                }
                label { "Lane " select name="to" { @for status in crate::report::LANES { option value=(status.as_str()) { (status.as_str()) } } } }
                label { "Assignee or priority " input name="text" size="10" list="agents"; }
                label { "Why " input name="reason" size="14"; }
                button type="submit" data-bulk { "Apply to selected" }
            }
            div data-fragment=(fragment) { (self::lanes(app, lanes)) }
        },
    )
}

/// A bulk action's choices, as the form lists them.
const BULK_LABELS: [(&str, &str); 9] = [
    ("hold", "Hold"),
    ("release", "Release"),
    ("archive", "Archive"),
    ("cancel", "Cancel"),
    ("reassign", "Reassign to…"),
    ("priority", "Set priority…"),
    ("unblock", "Unblock"),
    ("promote", "Promote"),
    ("move", "Move to lane…"),
];

/// The query of the lanes a page shows: its filter, and the lane and page
/// shown alone.
fn lane_query(lanes: &Lanes) -> String {
    let query = &lanes.query;
    if query.lane.is_empty() {
        query.filter_string()
    } else {
        query.page_string(&query.lane, lanes.page)
    }
}

/// The form that makes a card: a child of `parent` when given.
fn add_form(app: &App, parent: Option<&str>) -> Markup {
    html! {
        form.add method="post" action=(app.at("/actions/add")) {
            input type="hidden" name="csrf" value=(app.csrf);
            @if let Some(parent) = parent {
                input type="hidden" name="parents" value=(parent);
                input type="hidden" name="back" value=(parent);
            }
            label { "Title " input name="title" required size="40"; }
            label { "Assignee " input name="assignee" list="agents" size="12"; }
            label { "Tenant " input name="tenant" size="10"; }
            label { "Priority " input name="priority" size="4" inputmode="numeric"; }
            @if parent.is_none() {
                label { "Waits for " input name="parents" placeholder="card ids" size="16"; }
                label { input type="checkbox" name="triage" value="1"; " in triage" }
            }
            label.wide { "Body (Markdown) " textarea name="body" rows="3" cols="60" {} }
            button.primary type="submit" id=(if parent.is_some() { "add-child" } else { "add-card" }) {
                @if parent.is_some() { "Add child card" } @else { "Add card" }
            }
        }
    }
}

/// Dispatchers the health line names (the latest to report first).
const SHOWN_DISPATCHERS: usize = 4;

/// How long a dispatcher may say nothing before the health line calls it
/// silent: it reports every 15 s while it runs.
const SILENT_AFTER: i64 = 60;

/// One dispatcher on the health line: whether it claims (and why not),
/// its workers, and when it last reported.
fn dispatcher_health(seen: &kanban_board::DispatcherSeen, now: i64) -> Markup {
    let ago = crate::output::span((now - seen.reported_at).max(0));
    let silent = seen.state != "stopped" && now - seen.reported_at > SILENT_AFTER;
    let warn = silent || matches!(seen.state.as_str(), "paused" | "halted");
    html! {
        span.dispatcher.warn[warn] data-dispatcher=(seen.host) data-state=(seen.state) {
            "dispatcher " (seen.host) ": "
            @if silent {
                "silent for " (ago) " (last " (seen.state) ")"
            } @else if seen.state == "stopped" {
                "stopped " (ago) " ago"
            } @else {
                (seen.state)
                @if let Some(why) = &seen.why { " (" (short(why, 120)) ")" }
                ", " (seen.in_flight) " in flight, reported " (ago) " ago"
            }
        }
    }
}

/// The query string of the board narrowed to the cards a wall holds.
fn wall_query(scope: &str) -> String {
    form_urlencoded::Serializer::new(String::new())
        .append_pair("wall", scope)
        .finish()
}

/// The lanes, alone: what a live board fetches on `changed`.
pub(crate) fn lanes(app: &App, lanes: &Lanes) -> Markup {
    let query = &lanes.query;
    let filtered = !query.filter_string().is_empty();
    html! {
        p.health data-health {
            (lanes.running) " running"
            " · " (lanes.walls.len()) " provider wall" @if lanes.walls.len() != 1 { "s" }
            " · last activity "
            @match lanes.last_activity { Some(at) => { (crate::output::span((lanes.now - at).max(0))) " ago" } None => { "never" } }
            @if lanes.dispatchers.is_empty() { " · no dispatcher has reported" }
            @for seen in lanes.dispatchers.iter().take(SHOWN_DISPATCHERS) { " · " (dispatcher_health(seen, lanes.now)) }
            @if lanes.dispatchers.len() > SHOWN_DISPATCHERS { " · " (lanes.dispatchers.len() - SHOWN_DISPATCHERS) " more dispatchers" }
        }
        @if !lanes.walls.is_empty() {
            div.walls {
                strong { "Provider walls: " }
                @for wall in &lanes.walls {
                    a.pill.warn title=(wall.reason) href={ (app.home()) "?" (wall_query(&wall.scope)) } data-wall-filter=(wall.scope) {
                        (short(&wall.scope, 50)) " — "
                        @if wall.until > lanes.now { "until " (human_time(wall.until, lanes.now)) } @else { "probing" }
                    }
                    " "
                }
            }
        }
        div.lanes {
            @for (status, count, tiles) in &lanes.lanes {
                section class={ "lane " (status) } data-lane=(status) aria-label={ (status) " lane" } {
                    h2 {
                        a href={ (app.home()) "?" (query.page_string(status, 1)) } { (status) }
                        span data-count { (count_text(*count, filtered)) }
                    }
                    @if status == crate::serve::OTHER_LANE {
                        div.more { "statuses this kanban does not know: shown as they are, never claimed" }
                    }
                    @for tile in tiles { (card_tile(app, tile, lanes.now)) }
                    @if lanes.page > 1 || count.count > lanes.page * LANE_LIMIT {
                        nav.pages aria-label={ (status) " pages" } {
                            @if lanes.page > 1 { a rel="prev" href={ (app.home()) "?" (query.page_string(status, lanes.page - 1)) } { "← previous" } " " }
                            span { "page " (lanes.page) }
                            @if count.count > lanes.page * LANE_LIMIT { " " a rel="next" data-next-page href={ (app.home()) "?" (query.page_string(status, lanes.page + 1)) } { "next " (LANE_LIMIT) " →" } }
                        }
                    }
                }
            }
        }
    }
}

fn card_tile(app: &App, tile: &CardTile, now: i64) -> Markup {
    let task = &tile.task;
    html! {
        div.card data-card=(task.id) data-status=(task.status.as_str()) {
            input.pick type="checkbox" name="card" value=(task.id) form="bulk" aria-label={ "select " (task.id) };
            a.title href={ (app.base) "/cards/" (task.id) } draggable="false" { (short(&task.title, 80)) }
            div.meta {
                span { (task.id) }
                @if task.status.known().is_none() { span.pill { (task.status) } }
                @if task.priority != 0 { span.pill { "p" (task.priority) } }
                @if let Some(assignee) = &task.assignee { span.pill { "→ " (assignee) } }
                @if let Some(tenant) = &task.tenant { span.pill data-tenant=(tenant) { (tenant) } }
                @if let Some(run) = task.current_run_id { span { "run " (run) } }
                @if let Some(left) = tile.lease_left { span { "lease " (left.max(0)) "s" } }
                @if task.consecutive_failures > 0 { span.pill.warn { (task.consecutive_failures) " failed" } }
                @if let Some(reason) = &task.held_reason { span.pill.warn title=(reason) { "held" } }
                @if let Some(kind) = task.block_kind.as_ref().filter(|_| task.status.known() == Some(TaskStatus::Blocked)) { span.pill.warn { (kind) } }
                @if let Some(at) = task.not_before.filter(|at| *at > now) { span.pill { "waits " (crate::output::span(at - now)) } }
            }
            @if let Some((kind, at)) = &tile.last_event {
                div.meta { span data-last-event=(kind) { (kind.replace('_', " ")) " · " (now - at) "s ago" } }
            }
        }
    }
}

/// What a bulk action refused, card by card, with a way back.
pub(crate) fn bulk_refusals(
    app: &App,
    refused: &[&serde_json::Value],
    all: &[serde_json::Value],
) -> Markup {
    layout(
        app,
        "bulk action",
        html! {
            h2 { (all.len() - refused.len()) " of " (all.len()) " cards done; " (refused.len()) " refused" }
            ul {
                @for result in refused {
                    li data-refused=(result["id"].as_str().unwrap_or("")) {
                        a href={ (app.base) "/cards/" (result["id"].as_str().unwrap_or("")) } { (result["id"].as_str().unwrap_or("")) }
                        ": " (result["error"].as_str().unwrap_or(""))
                    }
                }
            }
            p { a href=(app.home()) { "← board" } }
        },
    )
}

/// The status of each linked card, by id (`serve::linked_statuses`).
type Linked = std::collections::BTreeMap<String, String>;

/// A card's page.
/// What a card page shows besides the card.
pub(crate) struct CardParts<'a> {
    pub(crate) view: &'a TaskView,
    pub(crate) linked: &'a Linked,
    pub(crate) log_tail: &'a str,
    /// The byte of the log just after its tail: where its stream starts.
    pub(crate) log_end: u64,
    /// The subscriptions to this card's events.
    pub(crate) subscriptions: &'a [kanban_core::notify::SubscriptionView],
    /// The agents of the agents file, for its assignee field.
    pub(crate) agents: &'a [String],
}

pub(crate) fn card(app: &App, parts: &CardParts<'_>, now: i64) -> Markup {
    let view = parts.view;
    layout(
        app,
        &view.task.title,
        html! {
            p { a href=(app.home()) { "← board" } }
            (agents_list(parts.agents))
            div data-fragment={ (app.base) "/fragments/cards/" (view.task.id) "?part=head" } { (card_head(app, &view.task, now)) }
            (card_forms(app, view))
            div data-fragment={ (app.base) "/fragments/cards/" (view.task.id) } { (card_details(app, parts, now)) }
            (card_log(app, parts))
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
                            form.inline method="post" action={ (app.base) "/actions/" (id) "/unnotify" } {
                                input type="hidden" name="csrf" value=(app.csrf);
                                input type="hidden" name="text" value=(sub.id);
                                " " button type="submit" data-action="unnotify" { "Stop" }
                            }
                        }
                    }
                }
            }
            form method="post" action={ (app.base) "/actions/" (id) "/notify" } {
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
fn attachments(
    app: &App,
    id: &str,
    files: &[kanban_core::attachments::AttachmentRecord],
) -> Markup {
    html! {
        @if !files.is_empty() {
            section.attachments {
                h3 { "Attachments" }
                ul {
                    @for file in files {
                        li data-attachment=(file.id) {
                            a href={ (app.base) "/cards/" (id) "/attachments/" (file.id) } { (file.filename) }
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
        form.inline method="post" action={ (app.base) "/actions/" (id) "/" (name) } {
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

/// The cards a card waits for (each with a button that unlinks it) and
/// those that wait for it, with their statuses.
fn links(app: &App, view: &TaskView, linked: &Linked) -> Markup {
    let id = view.task.id.as_str();
    html! {
        @for (label, ids, parents) in [("Waits for", &view.parents, true), ("Waited for by", &view.children, false)] {
            @if !ids.is_empty() {
                section.links {
                    h3 { (label) }
                    ul {
                        @for linked_id in ids {
                            @let status = linked.get(linked_id).map_or("gone", String::as_str);
                            li data-linked=(linked_id) {
                                a href={ (app.base) "/cards/" (linked_id) } { (linked_id) } " " span.pill data-status=(status) { (status) }
                                @if parents {
                                    form.inline method="post" action={ (app.base) "/actions/" (id) "/unlink" } {
                                        input type="hidden" name="csrf" value=(app.csrf);
                                        input type="hidden" name="text" value=(linked_id);
                                        " " button type="submit" data-action="unlink" aria-label={ "stop waiting for " (linked_id) } { "Unlink" }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The forms of a card's page that stay put while its details go live: a
/// live refresh must not wipe what is being typed.
fn card_forms(app: &App, view: &TaskView) -> Markup {
    let task = &view.task;
    let id = task.id.as_str();
    let (workspace, branch) = crate::serve_board::workspace_text(task);
    html! {
        @if task.status.known() != Some(TaskStatus::Archived) {
            details.edit {
                summary { "Edit" }
                form method="post" action={ (app.base) "/actions/" (id) "/edit" } {
                    input type="hidden" name="csrf" value=(app.csrf);
                    // What the form showed: only what is changed in it is saved.
                    input type="hidden" name="was_title" value=(task.title);
                    input type="hidden" name="was_priority" value=(task.priority);
                    input type="hidden" name="was_assignee" value=(task.assignee.as_deref().unwrap_or(""));
                    input type="hidden" name="was_tenant" value=(task.tenant.as_deref().unwrap_or(""));
                    input type="hidden" name="was_body" value=(task.body.as_deref().unwrap_or(""));
                    input type="hidden" name="was_workspace" value=(workspace);
                    input type="hidden" name="was_branch" value=(branch);
                    label { "Title " input name="title" value=(task.title) required size="50"; }
                    label { "Priority " input name="priority" value=(task.priority) size="4" inputmode="numeric"; }
                    label { "Assignee " input name="assignee" value=(task.assignee.as_deref().unwrap_or("")) list="agents" size="14"; }
                    label { "Tenant " input name="tenant" value=(task.tenant.as_deref().unwrap_or("")) size="12"; }
                    label { "Workspace " input name="workspace" value=(workspace) size="40" placeholder="scratch, dir:/path, worktree:/repo" title="where its agent works from its next run on"; }
                    label { "Branch " input name="branch" value=(branch) size="16" placeholder="wt/ID"; }
                    // A parser drops the newline that opens a textarea: one
                    // is put there, so a body that starts with one keeps it.
                    label.wide { "Body (Markdown) " textarea name="body" rows="8" cols="80" { "\n" (task.body.as_deref().unwrap_or("")) } }
                    button.primary type="submit" data-action="edit" { "Save" }
                }
            }
            form.upload data-upload={ (app.base) "/api/cards/" (id) "/attachments" } method="post" action={ (app.base) "/api/cards/" (id) "/attachments" } {
                label { "Attach a file " input type="file" name="file" required; }
                " " button type="submit" data-action="upload" { "Upload" }
                noscript { " Uploading needs JavaScript; without it: kanban attach " (id) " FILE" }
            }
            details.more {
                summary { "Move, link, reassign, add a child" }
                form.inline method="post" action={ (app.base) "/actions/" (id) "/move" } {
                    input type="hidden" name="csrf" value=(app.csrf);
                    input type="hidden" name="from" value=(task.status.as_str());
                    label { "Move to "
                        select name="to" { @for status in crate::report::LANES { option value=(status.as_str()) selected[task.status == status] { (status.as_str()) } } }
                    }
                    " " button type="submit" data-action="move" { "Move" }
                }
                form.inline method="post" action={ (app.base) "/actions/" (id) "/link" } {
                    input type="hidden" name="csrf" value=(app.csrf);
                    label { " Wait for card " input name="text" required size="14" placeholder="t_…"; }
                    " " button type="submit" data-action="link" { "Link" }
                }
                form.inline method="post" action={ (app.base) "/actions/" (id) "/reassign" } {
                    input type="hidden" name="csrf" value=(app.csrf);
                    label { " Reassign to " input name="text" list="agents" size="12" placeholder="none"; }
                    " " button type="submit" data-action="reassign" { "Reassign" }
                }
                h3 { "Add a child card (it waits for this one)" }
                (add_form(app, Some(id)))
            }
        }
    }
}

/// A card's details, alone: what a live card page fetches on `changed`.
/// A card's title, facts and actions, alone: the first live part of its page.
pub(crate) fn card_head(app: &App, task: &kanban_core::TaskRecord, now: i64) -> Markup {
    let id = task.id.as_str();
    html! {
        h2 { (task.title) }
        (card_meta(task, now))
        div.actions {
            @match task.status.known() {
                Some(TaskStatus::Blocked) => {
                    (action(app, id, "unblock", "Unblock", true)) (action(app, id, "triage", "To triage", true))
                    (action(app, id, "cancel", "Cancel", true)) (action(app, id, "archive", "Archive", false))
                }
                Some(TaskStatus::Running) => { (action(app, id, "reclaim", "Terminate run", true)) (action(app, id, "cancel", "Cancel", true)) }
                Some(TaskStatus::Ready | TaskStatus::Todo) => {
                    @if task.held_reason.is_some() { (action(app, id, "release", "Release", false)) }
                    @else { (action(app, id, "hold", "Hold", true)) }
                    (action(app, id, "review", "To review", true))
                    (action(app, id, "cancel", "Cancel", true)) (action(app, id, "archive", "Archive", false))
                }
                Some(TaskStatus::Scheduled) => {
                    @if task.held_reason.is_some() { (action(app, id, "release", "Release", false)) }
                    (action(app, id, "unblock", "Back in line now", false))
                    (action(app, id, "cancel", "Cancel", true)) (action(app, id, "archive", "Archive", false))
                }
                Some(TaskStatus::Triage) => {
                    (action(app, id, "promote", "Promote", false))
                    (action(app, id, "cancel", "Cancel", true)) (action(app, id, "archive", "Archive", false))
                }
                Some(TaskStatus::Review) => { (action(app, id, "cancel", "Cancel", true)) }
                Some(TaskStatus::Done) => { (action(app, id, "review", "To review", true)) (action(app, id, "archive", "Archive", false)) }
                _ => {}
            }
        }
    }
}

/// A card's links, files, notifications, body, runs, comments, events and
/// log, alone: the second live part of its page.
pub(crate) fn card_details(app: &App, parts: &CardParts<'_>, now: i64) -> Markup {
    let (view, linked) = (parts.view, parts.linked);
    let task = &view.task;
    let id = task.id.as_str();
    html! {
        (links(app, view, linked))
        (attachments(app, id, &view.attachments))
        (notifications(app, id, parts.subscriptions))
        @if let Some(body) = &task.body { section { h3 { "Body" } div.body.markdown { (maud::PreEscaped(crate::serve_board::markdown(body))) } } }
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
            form method="post" action={ (app.base) "/actions/" (id) "/comment" } {
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
    }
}

/// A card's log: its tail, which the script goes on with as the agent
/// writes (outside the live parts, so a refresh does not cut it short).
fn card_log(app: &App, parts: &CardParts<'_>) -> Markup {
    let task = &parts.view.task;
    let running = task.status.known() == Some(TaskStatus::Running);
    html! {
        section {
            h3 { "Log (tail)" }
            @if parts.log_tail.is_empty() && !running {
                p.meta data-no-log { "No log yet: a run writes one." }
            }
            pre data-log={ (app.base) "/cards/" (task.id) "/log" } data-from=(parts.log_end) tabindex="0" { (parts.log_tail) }
        }
    }
}

/// The provider walls, each with a button that lifts it.
pub(crate) fn walls(app: &App, walls: &[kanban_core::walls::Wall], now: i64) -> Markup {
    layout(
        app,
        "walls",
        html! {
            h2 { "Provider walls" }
            @if walls.is_empty() {
                p { "No provider wall: every agent's cards may be claimed." }
            } @else {
                table {
                    tr { th { "scope" } th { "kind" } th { "agent" } th { "holds until" } th { "hits" } th { "last hit by" } th { "reason" } th { "" } }
                    @for wall in walls {
                        tr data-wall=(wall.scope) {
                            td { a href={ (app.home()) "?" (wall_query(&wall.scope)) } title="the cards it holds back" { (wall.scope) } }
                            td { (wall.kind.as_str()) }
                            td { (wall.route) }
                            td { @if wall.until > now { (human_time(wall.until, now)) } @else { "probing" } }
                            td { (wall.hits) }
                            td { (wall.source) }
                            td { (short(&wall.reason, 160)) }
                            td {
                                form.inline method="post" action=(app.at("/actions/lift-wall")) {
                                    input type="hidden" name="csrf" value=(app.csrf);
                                    input type="hidden" name="scope" value=(wall.scope);
                                    button type="submit" data-action="lift" aria-label={ "lift the wall on " (wall.scope) } { "Lift" }
                                }
                            }
                        }
                    }
                }
            }
        },
    )
}

/// What `kanban diagnostics` finds on the first cards of each lane, and
/// the notifications nobody will get.
pub(crate) fn diagnostics(
    app: &App,
    reports: &[(TaskRecord, Vec<kanban_core::diagnostics::Diagnostic>)],
    dead: &[kanban_core::notify::SubscriptionView],
) -> Markup {
    layout(
        app,
        "diagnostics",
        html! {
            h2 { "Diagnostics" }
            p.meta { "What needs a person, on the first " (crate::serve::DIAGNOSED_PER_LANE) " cards of each lane but done (kanban diagnostics reads them all)." }
            @if reports.is_empty() && dead.is_empty() {
                p { "Nothing on the board needs a person." }
            }
            @for (task, found) in reports {
                section data-diagnosed=(task.id) {
                    h3 { a href={ (app.base) "/cards/" (task.id) } { (task.id) } " · " (task.status.as_str()) " · " (short(&task.title, 80)) }
                    ul {
                        @for diagnostic in found {
                            li {
                                span.pill.warn { (diagnostic.severity.as_str()) } " " strong { (diagnostic.kind) } ": " (diagnostic.title)
                                @for action in diagnostic.actions.iter().filter(|action| action.kind == "cli_hint") {
                                    @if let Some(command) = action.payload["command"].as_str() { br; code { (command) } }
                                }
                            }
                        }
                    }
                }
            }
            @for sub in dead {
                p data-dead-subscription=(sub.id) {
                    span.pill.warn { (sub.dead) " dead" } " notifications of subscription " (sub.id) " (" (sub.channel) " "
                    (kanban_core::notify::shown_address(&sub.channel, &sub.address)) "): " (sub.last_error.as_deref().unwrap_or("no error recorded"))
                }
            }
        },
    )
}

/// Every subscription, a Stop button for each webhook, and a form that
/// sends the events of every card, an assignee's or a tenant's to a webhook.
pub(crate) fn notifications_page(
    app: &App,
    subscriptions: &[kanban_core::notify::SubscriptionView],
) -> Markup {
    layout(
        app,
        "notifications",
        html! {
            h2 { "Notifications" }
            @if subscriptions.is_empty() {
                p { "Nobody is notified of this board's events yet." }
            } @else {
                table {
                    tr { th { "#" } th { "of" } th { "events" } th { "to" } th { "sent" } th { "waiting" } th { "dead" } th { "" } }
                    @for sub in subscriptions {
                        tr data-subscription=(sub.id) {
                            td { (sub.id) }
                            td { (sub.scope) @if let Some(target) = &sub.target { " " (target) } }
                            td { (sub.kinds.join(", ")) }
                            td { (sub.channel) " " (sub.address) }
                            td { (sub.delivered) }
                            td { (sub.pending) }
                            td { @if sub.dead > 0 { span.pill.warn { (sub.dead) } } @else { "0" } }
                            td {
                                @if sub.channel == "webhook" {
                                    form.inline method="post" action=(app.at("/actions/unnotify")) {
                                        input type="hidden" name="csrf" value=(app.csrf);
                                        input type="hidden" name="id" value=(sub.id);
                                        button type="submit" data-action="unnotify" aria-label={ "stop subscription " (sub.id) } { "Stop" }
                                    }
                                } @else {
                                    span.meta { "kanban notify unsubscribe " (sub.id) }
                                }
                            }
                        }
                    }
                }
            }
            h3 { "Send events to a webhook" }
            form.add method="post" action=(app.at("/actions/notify")) {
                input type="hidden" name="csrf" value=(app.csrf);
                label { "Of "
                    select name="scope" {
                        option value="all" { "every card" }
                        option value="assignee" { "an assignee's cards" }
                        option value="tenant" { "a tenant's cards" }
                    }
                }
                label { "Assignee or tenant " input name="name" size="12"; }
                label { "Events " input name="events" value="needs_input,failed" size="24"; }
                label { "Webhook " input name="webhook" type="url" required placeholder="https://…" size="36"; }
                label { "Format "
                    select name="format" { option value="json" { "json" } option value="slack" { "slack" } }
                }
                button.primary type="submit" data-action="notify" { "Subscribe" }
            }
            p.meta { "A webhook is sent unsigned from here; a signed one, a command or mail is made with kanban notify subscribe on a dispatcher's host (docs/notifications.md)." }
        },
    )
}

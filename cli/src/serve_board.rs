//! The web board's operations beyond one action on one card: the filter a
//! board page carries in its URL, moves between lanes, edits, and actions
//! on many cards at once. Each is the same board operation the CLI makes.

use axum::http::StatusCode;
use kanban_board::{LANE_WINDOW, LaneFilter};
use kanban_core::TaskStatus;
use kanban_core::moves::{self, MoveOperation};
use kanban_core::rules::{CardEdit, Change};
use serde::Deserialize;

use crate::serve::{App, Failure, LANE_LIMIT, LaneCount, OTHER_LANE};

/// What a board page shows, as its URL says: `?q=…&assignee=…&tenant=…
/// &block=…&lane=…&page=…`. A bookmark or a shared link shows the same.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct BoardQuery {
    /// A piece of the title (any case), or a card's whole id.
    #[serde(default)]
    pub(crate) q: String,
    #[serde(default)]
    pub(crate) assignee: String,
    #[serde(default)]
    pub(crate) tenant: String,
    /// The kind of a card's last block.
    #[serde(default)]
    pub(crate) block: String,
    /// A provider wall's scope: the cards of the agent it holds.
    #[serde(default)]
    pub(crate) wall: String,
    /// One lane alone (a status, or `other`), to page through it.
    #[serde(default)]
    pub(crate) lane: String,
    /// The page of that lane, from 1.
    pub(crate) page: Option<usize>,
}

/// The longest filter text a page takes.
const FILTER_MOST: usize = 200;
/// The last page a lane pages to: as far as a view reads a lane (its
/// cards past that: the API's cursor).
const PAGE_MOST: usize = LANE_WINDOW / LANE_LIMIT;

impl BoardQuery {
    /// The board's filter, or why the URL's is not one.
    pub(crate) fn filter(&self) -> Result<LaneFilter, Failure> {
        let given = |name: &str, value: &str| -> Result<Option<String>, Failure> {
            let value = value.trim();
            if value.chars().count() > FILTER_MOST || value.chars().any(char::is_control) {
                return Err(bad(format!(
                    "{name}: at most {FILTER_MOST} characters, none of them control characters"
                )));
            }
            Ok((!value.is_empty()).then(|| value.to_owned()))
        };
        Ok(LaneFilter {
            text: given("q", &self.q)?,
            assignee: given("assignee", &self.assignee)?,
            tenant: given("tenant", &self.tenant)?,
            block_kind: given("block", &self.block)?,
            assignees: None,
        })
    }

    /// The wall the query names, if it names one: one on the board, or
    /// why not (404 once it is lifted).
    pub(crate) fn wall<'w>(
        &self,
        walls: &'w [kanban_core::walls::Wall],
    ) -> Result<Option<&'w kanban_core::walls::Wall>, Failure> {
        let scope = self.wall.trim();
        if scope.is_empty() {
            return Ok(None);
        }
        walls
            .iter()
            .find(|wall| wall.scope == scope)
            .map(Some)
            .ok_or_else(|| {
                Failure::new(
                    StatusCode::NOT_FOUND,
                    format!("no provider wall on {scope:?} now (lifted, or there never was one): the walls page lists those there are"),
                )
            })
    }

    /// The lane shown alone, if one is: a status, or [`OTHER_LANE`].
    pub(crate) fn lane(&self) -> Result<Option<String>, Failure> {
        let lane = self.lane.trim();
        if lane.is_empty() {
            return Ok(None);
        }
        if lane == OTHER_LANE || crate::report::LANES.iter().any(|s| s.as_str() == lane) {
            return Ok(Some(lane.to_owned()));
        }
        Err(bad(format!(
            "lane {lane:?}: name one of {} or {OTHER_LANE}",
            crate::report::LANES.map(TaskStatus::as_str).join(", ")
        )))
    }

    /// The page of the lane shown alone, from 1.
    pub(crate) fn page(&self) -> Result<usize, Failure> {
        match self.page {
            None => Ok(1),
            Some(page @ 1..=PAGE_MOST) => Ok(page),
            Some(page) => Err(bad(format!(
                "page {page}: a lane pages from 1 to {PAGE_MOST}; /api/cards?status=… with its cursor reads further"
            ))),
        }
    }

    /// The query again, without the page, as a URL's query string: for
    /// the links and fragments of the page that shows it.
    pub(crate) fn filter_string(&self) -> String {
        let mut out = form_urlencoded::Serializer::new(String::new());
        for (name, value) in [
            ("q", &self.q),
            ("assignee", &self.assignee),
            ("tenant", &self.tenant),
            ("block", &self.block),
            ("wall", &self.wall),
        ] {
            if !value.trim().is_empty() {
                out.append_pair(name, value.trim());
            }
        }
        out.finish()
    }

    /// The query string of page `page` of `lane` under this filter.
    pub(crate) fn page_string(&self, lane: &str, page: usize) -> String {
        // The serializer puts the `&` after what it starts from.
        let mut out = form_urlencoded::Serializer::new(self.filter_string());
        out.append_pair("lane", lane);
        if page > 1 {
            out.append_pair("page", &page.to_string());
        }
        out.finish()
    }
}

/// How a lane's count reads: past the window a view reads, `10000+`; a
/// filter's matches among the first 10,000 of a bigger lane say so.
pub(crate) fn count_text(count: LaneCount, filtered: bool) -> String {
    match (count.more, filtered) {
        (false, _) => count.count.to_string(),
        (true, false) => format!("{LANE_WINDOW}+"),
        (true, true) => format!("{} in the first {LANE_WINDOW}", count.count),
    }
}

/// Cards skipped before a page of a lane.
pub(crate) fn skipped(page: usize) -> usize {
    (page - 1) * LANE_LIMIT
}

fn bad(message: String) -> Failure {
    Failure::new(StatusCode::BAD_REQUEST, message)
}

/// The assignees whose cards `wall` holds back (`""`: cards with none), as
/// the dispatcher routes them through the agents file: each agent one of
/// whose scopes the wall is, and the cards with no assignee when that is
/// the file's default agent. Without an agents file one agent works every
/// card: `None`, every card.
pub(crate) fn walled_assignees(
    app: &App,
    wall: &kanban_core::walls::Wall,
) -> Result<Option<Vec<String>>, Failure> {
    let Some(path) = &app.agents else {
        return Ok(None);
    };
    let file = crate::agents_file::load(path, &app.env)
        .map_err(|error| Failure::new(StatusCode::INTERNAL_SERVER_ERROR, error))?;
    let scopes = file
        .agents
        .iter()
        .map(|(name, agent)| {
            let route = crate::agent_check::agent_route(name, agent, &app.env);
            let reached = kanban_core::walls::scopes_of(&route.identity, &route.provider);
            (name.clone(), reached)
        })
        .collect();
    Ok(
        kanban_core::assignees_behind(&wall.scope, &scopes, file.default.as_deref())
            .map(|assignees| assignees.into_iter().collect()),
    )
}

/// Where a move goes: the lane `to`, from the lane `from` the page showed
/// the card in (empty: wherever it is).
pub(crate) struct Move<'a> {
    pub(crate) to: &'a str,
    pub(crate) from: &'a str,
    pub(crate) reason: &'a str,
}

/// Moves a card to the lane `to`: the operation the move stands for
/// ([`kanban_core::moves`]), checked again by that operation's own rule.
/// A card no longer where the page showed it is not moved: the same drop
/// on a card that has moved on (say, started running) would be another
/// operation than the one the person saw.
pub(crate) async fn move_card(app: &App, id: &str, given: &Move<'_>) -> Result<(), Failure> {
    let (to, reason) = (given.to, given.reason);
    let to_status = TaskStatus::parse(to.trim()).ok_or_else(|| {
        bad(format!(
            "no lane {to:?}: move a card to one of {}",
            crate::report::LANES.map(TaskStatus::as_str).join(", ")
        ))
    })?;
    let card = app.board.show_task(id).await?.task;
    let Some(from) = card.status.known() else {
        return Err(Failure::new(
            StatusCode::CONFLICT,
            format!(
                "{id} is {}, a status this kanban does not know; the system that set it moves it",
                card.status
            ),
        ));
    };
    let shown = given.from.trim();
    if !shown.is_empty() && shown != from.as_str() {
        return Err(Failure::new(
            StatusCode::CONFLICT,
            format!(
                "{id} is {} now, not {shown}: the page was behind; look again before moving it",
                from.as_str()
            ),
        ));
    }
    let operation = moves::operation(from, to_status)
        .map_err(|why| Failure::new(StatusCode::CONFLICT, format!("{id}: {why}")))?;
    let board = &app.board;
    match operation {
        MoveOperation::Unblock => board.unblock(id).await?,
        MoveOperation::Promote => match board.promote(id, Some(reason), false, false).await {
            // A parent still open: said for a person at the board, not
            // with the command line's --force.
            Err(kanban_core::BoardError::InvalidInput(_)) => {
                return Err(Failure::new(
                    StatusCode::CONFLICT,
                    format!(
                        "{id} waits for a card that is neither done nor archived: it stays where it is; move it again once that one is done, or run kanban promote --force {id} to take it now"
                    ),
                ));
            }
            other => other?,
        },
        MoveOperation::Reclaim => board.reclaim(id, reason).await?,
        MoveOperation::Hold => board.hold(id, reason).await?,
        MoveOperation::Triage => board.triage(id, Some(reason)).await?,
        MoveOperation::Review => board.review(id, Some(reason)).await?,
    }
    Ok(())
}

/// An edit as a page's form or the API sends it: each field given
/// replaces the card's; an empty assignee or tenant clears it.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct EditFields {
    pub(crate) title: Option<String>,
    pub(crate) body: Option<String>,
    /// A whole number (a form sends it as text).
    pub(crate) priority: Option<serde_json::Value>,
    pub(crate) assignee: Option<String>,
    pub(crate) tenant: Option<String>,
    /// As `add --workspace` takes it.
    pub(crate) workspace: Option<String>,
    /// A worktree's branch; empty: `wt/ID`.
    pub(crate) branch: Option<String>,
}

/// A card's workspace as `add --workspace` names it, and its branch.
pub(crate) fn workspace_text(task: &kanban_core::TaskRecord) -> (String, String) {
    let kind = task.workspace_kind();
    let spec = match task.workspace_path() {
        Some(path) => format!("{kind}:{path}"),
        None => kind.to_owned(),
    };
    (spec, task.branch_name().unwrap_or_default().to_owned())
}

/// The workspace an edit gives, checked as `add` checks it; none when it
/// is the card's already.
fn workspace_change(
    card: &kanban_core::TaskRecord,
    fields: &EditFields,
) -> Result<Option<kanban_core::rules::WorkspaceEdit>, Failure> {
    let (spec, branch) = workspace_text(card);
    let given_spec = fields.workspace.as_deref().map_or(spec.as_str(), str::trim);
    let given_branch = fields.branch.as_deref().map_or(branch.as_str(), str::trim);
    if given_spec == spec && given_branch == branch {
        return Ok(None);
    }
    let branch = Some(given_branch).filter(|name| !name.is_empty());
    let (spec, branch) = crate::workspace::for_add(Some(given_spec), None, branch)
        .map_err(|error| bad(format!("{error:#}")))?;
    Ok(spec.map(|spec| kanban_core::rules::WorkspaceEdit { spec, branch }))
}

/// The agents of the agents file for a page's assignee fields: none when
/// the file does not load (the page still serves; an assignee given is
/// checked, and refused with the file's error, when it is saved).
pub(crate) fn listed_agents(app: &App) -> Vec<String> {
    use std::sync::atomic::Ordering;
    // Said once each time the file breaks, not on every page (a live page
    // fetches one on every commit).
    match agent_names(app) {
        Ok(names) => {
            app.agents_broken.store(false, Ordering::Relaxed);
            names.unwrap_or_default()
        }
        Err(failure) => {
            if !app.agents_broken.swap(true, Ordering::Relaxed) {
                crate::out::errln!(
                    "the agents file does not load, so the pages list no agents until it does: {}",
                    failure.message()
                );
            }
            Vec::new()
        }
    }
}

/// The agents a card may be given to, from the agents file the server was
/// started with (none: any name).
pub(crate) fn agent_names(app: &App) -> Result<Option<Vec<String>>, Failure> {
    let Some(path) = &app.agents else {
        return Ok(None);
    };
    let file = crate::agents_file::load(path, &app.env)
        .map_err(|error| Failure::new(StatusCode::INTERNAL_SERVER_ERROR, error))?;
    Ok(Some(file.agents.keys().cloned().collect()))
}

/// An assignee given: cleared when blank, refused when the agents file
/// names no such agent.
fn assignee_change(app: &App, given: &str) -> Result<Change<String>, Failure> {
    let name = given.trim();
    if name.is_empty() || name.eq_ignore_ascii_case("none") {
        return Ok(Change::Clear);
    }
    if let Some(names) = agent_names(app)?
        && !names.iter().any(|known| known == name)
    {
        return Err(bad(format!(
            "assignee {name:?}: no agent of that name in the agents file; pick one of {}",
            names.join(", ")
        )));
    }
    Ok(Change::Set(name.to_owned()))
}

fn priority(given: &serde_json::Value) -> Result<Option<i64>, Failure> {
    match given {
        serde_json::Value::Null => Ok(None),
        serde_json::Value::Number(number) => number
            .as_i64()
            .map(Some)
            .ok_or_else(|| bad(format!("priority {number} is not a whole number"))),
        serde_json::Value::String(text) if text.trim().is_empty() => Ok(None),
        serde_json::Value::String(text) => text
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| bad(format!("priority {text:?} is not a whole number"))),
        other => Err(bad(format!("priority {other} is not a whole number"))),
    }
}

/// Applies an edit: the same board operation as `kanban edit`. A field the
/// card already has is left out, so a form sent whole changes only what
/// was changed in it.
pub(crate) async fn edit_card(app: &App, id: &str, fields: &EditFields) -> Result<(), Failure> {
    let card = app.board.show_task(id).await?.task;
    let differs = |given: &Option<String>, now: Option<&str>| {
        given
            .as_ref()
            .filter(|given| Some(given.as_str()) != now)
            .cloned()
    };
    let assignee = match &fields.assignee {
        Some(given) if Some(given.trim()) != card.assignee.as_deref() => {
            assignee_change(app, given)?
        }
        _ => Change::Keep,
    };
    let tenant = match fields.tenant.as_deref().map(str::trim) {
        Some(given) if Some(given) != card.tenant.as_deref() => {
            Change::to(Some(given.to_owned()).filter(|name| !name.is_empty()))
        }
        _ => Change::Keep,
    };
    let edit = CardEdit {
        title: differs(&fields.title, Some(card.title.as_str())),
        body: differs(&fields.body, card.body.as_deref()),
        priority: priority(fields.priority.as_ref().unwrap_or(&serde_json::Value::Null))?
            .filter(|priority| *priority != card.priority),
        assignee: assignee.clone(),
        tenant: tenant.clone(),
        workspace: workspace_change(&card, fields)?,
        ..CardEdit::default()
    };
    // Clearing what is already clear is no change either.
    let edit = CardEdit {
        assignee: keep_if_same(assignee, card.assignee.as_deref()),
        tenant: keep_if_same(tenant, card.tenant.as_deref()),
        ..edit
    };
    if edit.fields().is_empty() {
        return Ok(());
    }
    app.board.edit(id, &edit).await?;
    Ok(())
}

fn keep_if_same(change: Change<String>, now: Option<&str>) -> Change<String> {
    match (&change, now) {
        (Change::Clear, None) => Change::Keep,
        (Change::Set(new), Some(old)) if new == old => Change::Keep,
        _ => change,
    }
}

/// Gives a card to another agent (the assignee of `kanban reassign`): a
/// running card is terminated first by hand (its run is its old agent's).
pub(crate) async fn reassign(app: &App, id: &str, to: &str) -> Result<(), Failure> {
    let card = app.board.show_task(id).await?.task;
    if card.status.known() == Some(TaskStatus::Running) {
        return Err(Failure::new(
            StatusCode::CONFLICT,
            format!("{id} is running: terminate its run (reclaim) first, then reassign it"),
        ));
    }
    let edit = CardEdit {
        assignee: assignee_change(app, to)?,
        ..CardEdit::default()
    };
    app.board.edit(id, &edit).await?;
    Ok(())
}

/// Sets a card's priority.
pub(crate) async fn set_priority(app: &App, id: &str, given: &str) -> Result<(), Failure> {
    let Some(priority) = priority(&serde_json::Value::String(given.to_owned()))? else {
        return Err(bad("priority: give a whole number".to_owned()));
    };
    let edit = CardEdit {
        priority: Some(priority),
        ..CardEdit::default()
    };
    app.board.edit(id, &edit).await?;
    Ok(())
}

/// The most cards one bulk action names.
pub(crate) const BULK_MOST: usize = 500;

/// The actions a bulk form or `/api/bulk` takes.
pub(crate) const BULK_ACTIONS: [&str; 9] = [
    "hold", "release", "archive", "cancel", "reassign", "priority", "unblock", "promote", "move",
];

/// What a bulk action names: its cards, each at most once and in the order
/// given, or why not.
pub(crate) fn bulk_cards(cards: Vec<String>, action: &str) -> Result<Vec<String>, Failure> {
    if !BULK_ACTIONS.contains(&action) {
        return Err(bad(format!(
            "no bulk action {action:?}: {}",
            BULK_ACTIONS.join(", ")
        )));
    }
    let mut seen = std::collections::HashSet::new();
    let cards: Vec<String> = cards
        .into_iter()
        .map(|card| card.trim().to_owned())
        .filter(|card| !card.is_empty() && seen.insert(card.clone()))
        .collect();
    if cards.is_empty() {
        return Err(bad("select at least one card".to_owned()));
    }
    if cards.len() > BULK_MOST {
        return Err(bad(format!(
            "{} cards: one bulk action takes at most {BULK_MOST}",
            cards.len()
        )));
    }
    Ok(cards)
}

/// Renders a card's Markdown body as HTML that cannot run or restyle the
/// page: raw HTML in it is shown as text, and only web and mail links and
/// images of this server are kept.
pub(crate) fn markdown(text: &str) -> String {
    use pulldown_cmark::{CowStr, Event, Options, Parser, Tag};
    let safe = |url: &CowStr<'_>| {
        let lower = url.trim().to_ascii_lowercase();
        lower.starts_with("https://")
            || lower.starts_with("http://")
            || lower.starts_with("mailto:")
            || lower.starts_with('#')
            || (lower.starts_with('/') && !lower.starts_with("//"))
    };
    let options =
        Options::ENABLE_TABLES | Options::ENABLE_STRIKETHROUGH | Options::ENABLE_TASKLISTS;
    let events = Parser::new_ext(text, options).map(|event| match event {
        Event::Html(raw) | Event::InlineHtml(raw) => Event::Text(raw),
        Event::Start(Tag::Link {
            link_type,
            dest_url,
            title,
            id,
        }) => Event::Start(Tag::Link {
            link_type,
            // An e-mail autolink's address gets its `mailto:` from the writer.
            dest_url: if safe(&dest_url) || link_type == pulldown_cmark::LinkType::Email {
                dest_url
            } else {
                "#".into()
            },
            title,
            id,
        }),
        Event::Start(Tag::Image {
            link_type,
            dest_url,
            title,
            id,
        }) => Event::Start(Tag::Image {
            link_type,
            // The page's policy loads images of this server only.
            dest_url: if dest_url.starts_with('/') && !dest_url.starts_with("//") {
                dest_url
            } else {
                "#".into()
            },
            title,
            id,
        }),
        other => other,
    });
    let mut html = String::new();
    pulldown_cmark::html::push_html(&mut html, events);
    html
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markdown_keeps_no_markup_or_link_that_could_run() {
        let cases = [
            ("**bold** and `code`", "<strong>bold</strong>", true),
            ("<script>alert(1)</script>", "&lt;script&gt;", true),
            ("<script>alert(1)</script>", "<script>", false),
            ("a <img src=x onerror=alert(1)> b", "&lt;img", true),
            ("[x](javascript:alert(1))", "href=\"#\"", true),
            ("[x](JavaScript:alert(1))", "javascript", false),
            (
                "[x](https://example.com/a)",
                "href=\"https://example.com/a\"",
                true,
            ),
            ("![i](https://example.com/t.png)", "src=\"#\"", true),
            (
                "![i](/cards/t_1/attachments/1)",
                "src=\"/cards/t_1/attachments/1\"",
                true,
            ),
            ("[x](//evil.example/)", "href=\"#\"", true),
            ("<me@example.com>", "href=\"mailto:me@example.com\"", true),
            ("| a | b |\n|---|---|\n| 1 | 2 |", "<table>", true),
        ];
        for (given, needle, present) in cases {
            let html = markdown(given);
            assert_eq!(
                html.to_ascii_lowercase()
                    .contains(&needle.to_ascii_lowercase()),
                present,
                "{given:?} -> {html}"
            );
        }
    }

    #[test]
    fn a_filter_is_bounded_and_round_trips_through_its_url() {
        let query = BoardQuery {
            q: " flaky test ".into(),
            assignee: "coder".into(),
            tenant: String::new(),
            block: "needs_input".into(),
            wall: "http:api.example/v1".into(),
            lane: String::new(),
            page: None,
        };
        let filter = query.filter().unwrap();
        assert_eq!(filter.text.as_deref(), Some("flaky test"));
        assert_eq!(filter.tenant, None);
        assert_eq!(
            query.filter_string(),
            "q=flaky+test&assignee=coder&block=needs_input&wall=http%3Aapi.example%2Fv1"
        );
        assert_eq!(
            query.page_string("ready", 2),
            "q=flaky+test&assignee=coder&block=needs_input&wall=http%3Aapi.example%2Fv1&lane=ready&page=2"
        );
        assert_eq!(BoardQuery::default().page_string("done", 1), "lane=done");
        let long = BoardQuery {
            q: "x".repeat(FILTER_MOST + 1),
            ..BoardQuery::default()
        };
        assert!(long.filter().is_err());
        let control = BoardQuery {
            tenant: "a\u{7}b".into(),
            ..BoardQuery::default()
        };
        assert!(control.filter().is_err());
        let exact = BoardQuery {
            q: "é".repeat(FILTER_MOST),
            ..BoardQuery::default()
        };
        assert!(exact.filter().is_ok());
        for (page, ok) in [
            (None, true),
            (Some(0), false),
            (Some(1), true),
            (Some(PAGE_MOST), true),
            (Some(PAGE_MOST + 1), false),
        ] {
            let query = BoardQuery {
                page,
                ..BoardQuery::default()
            };
            assert_eq!(query.page().is_ok(), ok, "{page:?}");
        }
        assert_eq!(skipped(1), 0);
        assert_eq!(skipped(3), 2 * LANE_LIMIT);
        for (lane, ok) in [
            ("", true),
            ("ready", true),
            ("other", true),
            ("archived", false),
            ("nope", false),
        ] {
            let query = BoardQuery {
                lane: lane.into(),
                ..BoardQuery::default()
            };
            assert_eq!(query.lane().is_ok(), ok, "{lane:?}");
        }
        let count = |count, more| LaneCount { count, more };
        assert_eq!(count_text(count(7, false), false), "7");
        assert_eq!(count_text(count(7, false), true), "7");
        assert_eq!(count_text(count(LANE_WINDOW, true), false), "10000+");
        assert_eq!(count_text(count(3, true), true), "3 in the first 10000");
    }

    #[test]
    fn a_bulk_action_names_each_card_once_and_not_too_many() {
        let cards = bulk_cards(
            vec!["b".into(), " a ".into(), "b".into(), String::new()],
            "hold",
        )
        .unwrap();
        assert_eq!(cards, ["b", "a"]);
        assert!(bulk_cards(vec!["a".into()], "delete").is_err());
        assert!(bulk_cards(Vec::new(), "hold").is_err());
        let many: Vec<String> = (0..=BULK_MOST).map(|n| n.to_string()).collect();
        assert!(bulk_cards(many.clone(), "hold").is_err());
        assert!(bulk_cards(many[..BULK_MOST].to_vec(), "hold").is_ok());
    }

    #[test]
    fn priorities_are_whole_numbers_as_json_or_text() {
        use serde_json::json;
        assert_eq!(priority(&json!(3)).unwrap(), Some(3));
        assert_eq!(priority(&json!(" -2 ")).unwrap(), Some(-2));
        assert_eq!(priority(&json!("")).unwrap(), None);
        assert_eq!(priority(&json!(null)).unwrap(), None);
        assert!(priority(&json!(1.5)).is_err());
        assert!(priority(&json!("high")).is_err());
        assert!(priority(&json!([1])).is_err());
    }
}

//! The specifier and the decomposer: a card in `triage` (a rough idea) is
//! turned by one agent turn into a specified card (`specify`) or into a
//! small graph of linked child cards the root waits for (`decompose`), as
//! the seed system's `kanban specify` and `kanban decompose` do
//! (`hermes_cli/kanban_specify.py`, `kanban_decompose.py` of
//! `hermes-agent` 0.19.0).
//!
//! Unlike the seed, an answer is read strictly: whatever is not the
//! documented JSON, or breaks a bound, is refused with the reason, and
//! nothing is written. Only the prompts, the reading of answers and the
//! transitions live here; asking the agent and writing the cards is the
//! host's.

use serde_json::{Map, Value, json};

use crate::BoardError;
use crate::TaskStatus;
use crate::data::NewEvent;
use crate::rules::{CardState, Change, requeue_landing};

/// The most of an answer that is read.
pub const MAX_ANSWER_BYTES: usize = 256 * 1024;
/// The most child cards one decomposition makes.
pub const MAX_CHILDREN: usize = 12;
/// The longest title an answer may give.
pub const MAX_TITLE_CHARS: usize = 200;
/// The longest body an answer may give, per card.
pub const MAX_BODY_CHARS: usize = 16 * 1024;
/// The most of a card's title and body a prompt carries (the seed's cuts).
const PROMPT_TITLE_CHARS: usize = 400;
const PROMPT_BODY_CHARS: usize = 4000;

/// What an agent is asked: a system message and a user message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prompt {
    pub system: String,
    pub user: String,
}

/// A card in triage as a prompt shows it.
#[derive(Clone, Copy, Debug)]
pub struct TriageCard<'a> {
    pub id: &'a str,
    pub title: &'a str,
    pub body: &'a str,
}

/// An agent a decomposer may route a child card to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RosterEntry {
    pub name: String,
    pub description: Option<String>,
}

/// The agents a decomposer may route to, and the one that takes a card
/// with no assignee.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Roster {
    pub agents: Vec<RosterEntry>,
    pub default: Option<String>,
}

impl Roster {
    fn knows(&self, name: &str) -> bool {
        self.agents.iter().any(|agent| agent.name == name)
    }

    fn names(&self) -> String {
        if self.agents.is_empty() {
            return "none".to_owned();
        }
        self.agents
            .iter()
            .map(|agent| agent.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// A specified card's new fields: each one given replaces the card's.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Specification {
    pub title: Option<String>,
    pub body: Option<String>,
    pub assignee: Option<String>,
}

/// One child card of a decomposition.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ChildCard {
    pub title: String,
    pub body: Option<String>,
    /// An agent of the roster; none: the board's default agent.
    pub assignee: Option<String>,
    /// Indices of the sibling cards it waits for.
    pub parents: Vec<usize>,
    /// Where its agent works: never from an answer, but the host's choice
    /// from the decomposed card's workspace; none: a scratch folder.
    pub workspace: Option<crate::workspaces::WorkspaceSpec>,
}

/// What an answer asks the board to do with the card in triage.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "plan", rename_all = "snake_case")]
pub enum TriagePlan {
    /// Tighten the card and put it in line.
    Specify(Specification),
    /// Make child cards, make the card wait for all of them, and put it in
    /// line.
    Decompose {
        rationale: Option<String>,
        children: Vec<ChildCard>,
    },
}

/// What writing a plan did: the cards made, in the plan's order, and the
/// lane the card in triage went to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settled {
    pub child_ids: Vec<String>,
    pub status: TaskStatus,
}

/// Why an answer was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the agent's answer {0}")]
pub struct AnswerError(pub String);

fn refused(why: impl Into<String>) -> AnswerError {
    AnswerError(why.into())
}

fn cut(text: &str, limit: usize) -> String {
    if text.chars().count() <= limit {
        return text.to_owned();
    }
    let mut short: String = text.chars().take(limit.saturating_sub(1)).collect();
    short.push('…');
    short
}

fn card_lines(card: &TriageCard<'_>) -> String {
    let body = if card.body.trim().is_empty() {
        "(no body)"
    } else {
        card.body
    };
    format!(
        "Task id: {}\nTitle: {}\nBody:\n{}\n",
        card.id,
        cut(card.title, PROMPT_TITLE_CHARS),
        cut(body, PROMPT_BODY_CHARS)
    )
}

/// The specifier's prompt: answer `{"title", "body"}`.
pub fn specify_prompt(card: &TriageCard<'_>) -> Prompt {
    let system = format!(
        "You are the triage specifier of a kanban board of AI agents. A person dropped a rough idea \
into the triage lane. Turn it into a concrete task that an autonomous worker can pick up and finish \
without asking anything.

Answer with one JSON object and nothing else:

  {{\"title\": \"<the task's title, at most 80 characters, imperative>\",
   \"body\": \"<the spec>\"}}

The body has these sections, each under a bold Markdown heading, in this order:
  **Goal**: one sentence, the outcome for the user.
  **Approach**: 2 to 5 bullets on how to do it.
  **Acceptance criteria**: a checklist of conditions someone can verify.
  **Out of scope**: what not to touch (leave the section out when nothing is obvious).

Keep the title close to the idea; keep what a detailed idea says; add no requirement the idea does \
not hint at. A title is at most {MAX_TITLE_CHARS} characters and a body at most {MAX_BODY_CHARS}; \
an answer that is not this JSON object changes nothing."
    );
    Prompt {
        system,
        user: card_lines(card),
    }
}

/// The decomposer's prompt: answer a graph of child cards, or one card.
pub fn decompose_prompt(card: &TriageCard<'_>, roster: &Roster) -> Prompt {
    let system = format!(
        "You are the decomposer of a kanban board of AI agents. A person dropped a rough idea into \
the triage lane. Break it into a small graph of concrete child tasks and route each to the agent \
that fits it best. The original card then waits for all of them.

Answer with one JSON object and nothing else, either

  {{\"fanout\": true,
   \"rationale\": \"<one sentence: why this split>\",
   \"tasks\": [
     {{\"title\": \"<imperative, at most 80 characters>\",
      \"body\": \"<what a fresh worker needs: goal, approach, acceptance criteria>\",
      \"assignee\": \"<an agent of the roster, or null for the default agent>\",
      \"parents\": [<indices into this same tasks list of the tasks it waits for>]}}
   ]}}

or, when the idea is one unit of work,

  {{\"fanout\": false, \"rationale\": \"<one sentence>\", \"title\": \"<tightened title>\",
   \"body\": \"<the spec>\", \"assignee\": \"<an agent of the roster, or null>\"}}

Rules: indices start at 0; tasks with no parents run in parallel, so prefer them; use 2 to 6 tasks, \
at most {MAX_CHILDREN}; no task waits for itself or, through others, on a task that waits for it; an \
assignee is a name of the roster exactly, or null. A title is at most {MAX_TITLE_CHARS} characters \
and a body at most {MAX_BODY_CHARS}; an answer that breaks a rule changes nothing."
    );
    let mut user = card_lines(card);
    user.push_str("\nAgents you may route to:\n");
    if roster.agents.is_empty() {
        user.push_str("  (none: leave every assignee null)\n");
    }
    for agent in &roster.agents {
        match agent.description.as_deref().map(str::trim) {
            Some(description) if !description.is_empty() => {
                user.push_str(&format!("  - {}: {description}\n", agent.name));
            }
            _ => user.push_str(&format!("  - {} (no description)\n", agent.name)),
        }
    }
    user.push_str(&format!(
        "\nThe default agent (for a null assignee): {}\n",
        roster.default.as_deref().unwrap_or("none named")
    ));
    Prompt { system, user }
}

/// The JSON object of an answer: the whole answer, or the answer inside
/// one Markdown code fence, as models often wrap it. Nothing else is
/// guessed at.
fn answer_object(answer: &str) -> Result<Map<String, Value>, AnswerError> {
    if answer.len() > MAX_ANSWER_BYTES {
        return Err(refused(format!(
            "is {} bytes long, more than the {MAX_ANSWER_BYTES} read",
            answer.len()
        )));
    }
    let text = answer.trim();
    if text.is_empty() {
        return Err(refused("is empty"));
    }
    let text = unfenced(text).unwrap_or(text);
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(object)) => Ok(object),
        Ok(_) => Err(refused("is JSON but not an object")),
        Err(error) => Err(refused(format!(
            "is not a JSON object ({error}); it begins: {:?}",
            cut(text, 120)
        ))),
    }
}

/// The text inside one code fence (```` ``` ```` or ```` ```json ````)
/// that is the whole answer.
fn unfenced(text: &str) -> Option<&str> {
    let inner = text.strip_prefix("```")?.strip_suffix("```")?;
    let inner = inner.strip_prefix("json").unwrap_or(inner);
    inner.starts_with(['\n', '\r', ' ']).then(|| inner.trim())
}

/// A text field: absent or null is `None`; a string is checked.
fn text_field(
    object: &Map<String, Value>,
    key: &str,
    at: &str,
    limit: usize,
) -> Result<Option<String>, AnswerError> {
    match object.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => {
            if text.chars().count() > limit {
                return Err(refused(format!(
                    "gives a {at}{key} of {} characters, more than {limit}",
                    text.chars().count()
                )));
            }
            if text
                .chars()
                .any(|c| c.is_control() && !matches!(c, '\n' | '\t' | '\r'))
            {
                return Err(refused(format!(
                    "gives a {at}{key} with a control character"
                )));
            }
            Ok((!text.trim().is_empty()).then(|| text.clone()))
        }
        Some(_) => Err(refused(format!("gives a {at}{key} that is not a string"))),
    }
}

/// A title: one line, trimmed.
fn title_field(object: &Map<String, Value>, at: &str) -> Result<Option<String>, AnswerError> {
    let title = text_field(object, "title", at, MAX_TITLE_CHARS)?;
    if title
        .as_deref()
        .is_some_and(|title| title.contains(['\n', '\r']))
    {
        return Err(refused(format!("gives a {at}title of more than one line")));
    }
    Ok(title.map(|title| title.trim().to_owned()))
}

/// An assignee: null, or a name of the roster.
fn assignee_field(
    object: &Map<String, Value>,
    at: &str,
    roster: &Roster,
) -> Result<Option<String>, AnswerError> {
    match object.get("assignee") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(name)) if name.trim().is_empty() => Ok(None),
        Some(Value::String(name)) if roster.knows(name.trim()) => Ok(Some(name.trim().to_owned())),
        Some(Value::String(name)) => Err(refused(format!(
            "routes {at}to {:?}, which is not an agent of the roster ({})",
            cut(name, 80),
            roster.names()
        ))),
        Some(_) => Err(refused(format!(
            "gives a {at}assignee that is not a string"
        ))),
    }
}

/// Reads a specifier's answer: `{"title", "body"}`, at least one of them.
pub fn read_specification(answer: &str) -> Result<Specification, AnswerError> {
    let object = answer_object(answer)?;
    one_card(&object, None)
}

/// The single card of a specifier's answer, or of a decomposer's
/// `fanout: false` (which may name an assignee).
fn one_card(
    object: &Map<String, Value>,
    roster: Option<&Roster>,
) -> Result<Specification, AnswerError> {
    let title = title_field(object, "")?;
    let body = text_field(object, "body", "", MAX_BODY_CHARS)?;
    let assignee = match roster {
        Some(roster) => assignee_field(object, "", roster)?,
        None => None,
    };
    if title.is_none() && body.is_none() {
        return Err(refused("gives neither a title nor a body"));
    }
    Ok(Specification {
        title,
        body,
        assignee,
    })
}

/// Reads a decomposer's answer: a graph of child cards (`fanout: true`),
/// or one card (`fanout: false`).
pub fn read_decomposition(answer: &str, roster: &Roster) -> Result<TriagePlan, AnswerError> {
    let object = answer_object(answer)?;
    let rationale = text_field(&object, "rationale", "", MAX_TITLE_CHARS * 4)?;
    match object.get("fanout") {
        Some(Value::Bool(false)) => {
            return Ok(TriagePlan::Specify(one_card(&object, Some(roster))?));
        }
        Some(Value::Bool(true)) => {}
        _ => return Err(refused("gives no \"fanout\": true or false")),
    }
    let Some(Value::Array(tasks)) = object.get("tasks") else {
        return Err(refused("gives fanout true and no \"tasks\" list"));
    };
    if tasks.is_empty() || tasks.len() > MAX_CHILDREN {
        return Err(refused(format!(
            "gives {} tasks: give 1 to {MAX_CHILDREN}",
            tasks.len()
        )));
    }
    let mut children = Vec::with_capacity(tasks.len());
    for (index, task) in tasks.iter().enumerate() {
        let at = format!("tasks[{index}].");
        let Value::Object(task) = task else {
            return Err(refused(format!(
                "gives tasks[{index}], which is not an object"
            )));
        };
        let Some(title) = title_field(task, &at)? else {
            return Err(refused(format!("gives tasks[{index}] no title")));
        };
        let body = text_field(task, "body", &at, MAX_BODY_CHARS)?;
        let assignee = assignee_field(task, &at, roster)?;
        let parents = parents_field(task, index, tasks.len())?;
        children.push(ChildCard {
            title,
            body,
            assignee,
            parents,
            workspace: None,
        });
    }
    if creation_order(&children).len() != children.len() {
        return Err(refused(
            "gives tasks that wait for each other in a cycle: none of them could ever start",
        ));
    }
    Ok(TriagePlan::Decompose {
        rationale,
        children,
    })
}

/// A task's parents: distinct indices of other tasks.
fn parents_field(
    task: &Map<String, Value>,
    index: usize,
    count: usize,
) -> Result<Vec<usize>, AnswerError> {
    let parents = match task.get("parents") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(parents)) => parents,
        Some(_) => {
            return Err(refused(format!(
                "gives tasks[{index}].parents, which is not a list of indices"
            )));
        }
    };
    let mut indices = Vec::with_capacity(parents.len());
    for parent in parents {
        let Some(parent) = parent
            .as_u64()
            .and_then(|p| usize::try_from(p).ok())
            .filter(|p| *p < count && *p != index)
        else {
            return Err(refused(format!(
                "gives tasks[{index}] the parent {parent}, which is not the index of another task (0 to {})",
                count - 1
            )));
        };
        if !indices.contains(&parent) {
            indices.push(parent);
        }
    }
    Ok(indices)
}

/// The order to make the children in: every card after the cards it waits
/// for. Shorter than `children` when some wait for each other in a cycle.
pub fn creation_order(children: &[ChildCard]) -> Vec<usize> {
    let mut order: Vec<usize> = Vec::with_capacity(children.len());
    let mut made = vec![false; children.len()];
    loop {
        let next = (0..children.len()).find(|&index| {
            !made[index]
                && children[index]
                    .parents
                    .iter()
                    .all(|&parent| made.get(parent).copied().unwrap_or(false))
        });
        let Some(index) = next else {
            return order;
        };
        made[index] = true;
        order.push(index);
    }
}

/// Checks a plan as the board writes it, whoever made it: the shape of
/// the graph (how many cards, titles, parents, no cycle). The bounds on
/// text (lengths, control characters) are the reader's.
pub fn check_plan(plan: &TriagePlan) -> Result<(), BoardError> {
    let invalid = |why: String| Err(BoardError::InvalidInput(why));
    match plan {
        TriagePlan::Specify(spec) => {
            if spec.title.is_none() && spec.body.is_none() && spec.assignee.is_none() {
                return invalid("a specification changes at least the title or the body".into());
            }
            if spec.title.as_deref().is_some_and(|t| t.trim().is_empty()) {
                return invalid("a task needs a non-blank title".into());
            }
        }
        TriagePlan::Decompose { children, .. } => {
            if children.is_empty() || children.len() > MAX_CHILDREN {
                return invalid(format!(
                    "a decomposition makes 1 to {MAX_CHILDREN} cards, not {}",
                    children.len()
                ));
            }
            if children.iter().any(|child| child.title.trim().is_empty()) {
                return invalid("a task needs a non-blank title".into());
            }
            if creation_order(children).len() != children.len() {
                return invalid(
                    "the cards of a decomposition wait for each other in a cycle, or for one that is not there"
                        .into(),
                );
            }
        }
    }
    Ok(())
}

/// The transition of the card in triage once its plan is written (for a
/// decomposition, after it waits for its children): its changed fields,
/// and in line (`ready`, or `todo` while a parent is open), as the seed
/// puts a specified card. Refused unless the card is in triage, so a
/// card is specified or decomposed once.
pub fn settle(
    card: &CardState,
    current: &Specification,
    plan: &TriagePlan,
    child_ids: &[String],
    by: &str,
) -> Result<crate::rules::Transition, BoardError> {
    if card.status != TaskStatus::Triage {
        let action = match plan {
            TriagePlan::Specify(_) => "specify",
            TriagePlan::Decompose { .. } => "decompose",
        };
        return Err(BoardError::InvalidTransition {
            task_id: card.task_id.clone(),
            status: card.status.as_str().to_owned(),
            action: action.into(),
        });
    }
    let landing = requeue_landing(card.open_parents);
    let (edit, event) = match plan {
        TriagePlan::Specify(spec) => {
            let edit = changes(current, spec);
            let fields = edit.fields();
            let event = NewEvent::new(
                "specified",
                None,
                json!({"changed_fields": fields, "by": by, "status": landing.as_str()}),
            );
            (edit, event)
        }
        TriagePlan::Decompose { rationale, .. } => (
            crate::rules::CardEdit::default(),
            NewEvent::new(
                "decomposed",
                None,
                json!({"child_ids": child_ids, "by": by, "rationale": rationale, "status": landing.as_str()}),
            ),
        ),
    };
    Ok(crate::rules::Transition {
        status: Some(landing),
        edit: (!edit.fields().is_empty()).then_some(edit),
        events: vec![event],
        ..crate::rules::Transition::default()
    })
}

/// The fields of `spec` that differ from the card's `current` ones.
fn changes(current: &Specification, spec: &Specification) -> crate::rules::CardEdit {
    let differs = |new: &Option<String>, old: &Option<String>| {
        new.as_ref()
            .filter(|new| Some(*new) != old.as_ref())
            .cloned()
    };
    crate::rules::CardEdit {
        title: differs(&spec.title, &current.title),
        body: differs(&spec.body, &current.body),
        assignee: differs(&spec.assignee, &current.assignee).map_or(Change::Keep, Change::Set),
        ..crate::rules::CardEdit::default()
    }
}

/// The comment left on the card, with its author: what was done and by
/// which agent.
pub fn note(plan: &TriagePlan, agent: &str, child_ids: &[String]) -> String {
    match plan {
        TriagePlan::Specify(_) => {
            format!("Specified by the agent {agent} and put in line.")
        }
        TriagePlan::Decompose { rationale, .. } => {
            let mut note = format!(
                "Decomposed by the agent {agent} into {}; this card waits for them.",
                child_ids.join(", ")
            );
            if let Some(rationale) = rationale {
                note.push_str(&format!(" Why: {}", rationale.trim()));
            }
            note
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roster() -> Roster {
        Roster {
            agents: vec![
                RosterEntry {
                    name: "coder".into(),
                    description: Some("writes Rust".into()),
                },
                RosterEntry {
                    name: "writer".into(),
                    description: None,
                },
            ],
            default: Some("coder".into()),
        }
    }

    fn card(status: TaskStatus, open_parents: bool) -> CardState {
        CardState {
            task_id: "t_1".into(),
            status,
            current_run_id: None,
            claim_lock: None,
            claim_expires: None,
            worker_pid: None,
            consecutive_failures: 0,
            max_retries: None,
            open_parents,
            held: false,
            not_before: None,
            block_kind: None,
            block_recurrences: 0,
        }
    }

    fn refusal(result: Result<impl std::fmt::Debug, AnswerError>) -> String {
        result.expect_err("refused").0
    }

    #[test]
    fn a_specification_is_read_bare_or_in_one_fence() {
        let plain = r#"{"title": " Add a login page ", "body": "**Goal** log in"}"#;
        let expected = Specification {
            title: Some("Add a login page".into()),
            body: Some("**Goal** log in".into()),
            assignee: None,
        };
        assert_eq!(read_specification(plain), Ok(expected.clone()));
        let fenced = format!("```json\n{plain}\n```");
        assert_eq!(read_specification(&fenced), Ok(expected.clone()));
        assert_eq!(
            read_specification(&format!("```\n{plain}\n```")),
            Ok(expected)
        );
        let only_body = read_specification(r#"{"body": "b", "title": "  "}"#).expect("read");
        assert_eq!(only_body.title, None);
        assert_eq!(only_body.body.as_deref(), Some("b"));
    }

    #[test]
    fn a_malformed_specification_is_refused_with_why() {
        for (answer, why) in [
            ("", "is empty"),
            ("   ", "is empty"),
            ("Sure! Here is the spec: make it", "is not a JSON object"),
            ("[1, 2]", "not an object"),
            (r#"{"title": 3}"#, "title that is not a string"),
            (r#"{"title": "a\nb"}"#, "more than one line"),
            (r#"{"title": "a\u0000b"}"#, "control character"),
            (r#"{"body": 7}"#, "body that is not a string"),
            (r#"{"other": "x"}"#, "neither a title nor a body"),
            (
                r#"{"title": "", "body": " "}"#,
                "neither a title nor a body",
            ),
            (
                "prefix ```json\n{\"title\": \"x\"}\n```",
                "is not a JSON object",
            ),
        ] {
            let got = refusal(read_specification(answer));
            assert!(got.contains(why), "{answer:?}: {got}");
        }
        let long_title = json!({"title": "x".repeat(MAX_TITLE_CHARS + 1)}).to_string();
        assert!(refusal(read_specification(&long_title)).contains("more than 200"));
        let just_title = json!({"title": "x".repeat(MAX_TITLE_CHARS)}).to_string();
        assert!(read_specification(&just_title).is_ok());
        let long_body = json!({"body": "x".repeat(MAX_BODY_CHARS + 1)}).to_string();
        assert!(refusal(read_specification(&long_body)).contains("more than"));
        let just_body = json!({"body": "x".repeat(MAX_BODY_CHARS)}).to_string();
        assert!(read_specification(&just_body).is_ok());
        let huge = format!("{{\"body\": \"{}\"}}", "x".repeat(MAX_ANSWER_BYTES));
        assert!(refusal(read_specification(&huge)).contains("bytes long"));
        let padded = format!("{{\"title\": \"t\"}}{}", " ".repeat(200 * 1024));
        // The documented bound, 16,384 characters (not bytes).
        let long_body = json!({"body": "é".repeat(16_384)}).to_string();
        assert!(read_specification(&long_body).is_ok());
        let longer_body = json!({"body": "é".repeat(16_385)}).to_string();
        assert!(refusal(read_specification(&longer_body)).contains("16385 characters"));
        let title = r#"{"title": "t"}"#;
        let exact = format!("{title}{}", " ".repeat(MAX_ANSWER_BYTES - title.len()));
        assert!(
            read_specification(&exact).is_ok(),
            "an answer of the bound is read"
        );
        assert!(refusal(read_specification(&format!("{exact} "))).contains("bytes long"));
        assert!(
            read_specification(&padded).is_ok(),
            "an answer under the bound is read"
        );
        let tabs = read_specification("{\"body\": \"a\\tb\\r\\nc\"}").expect("read");
        assert_eq!(tabs.body.as_deref(), Some("a\tb\r\nc"));
        let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        assert!(refusal(read_specification(&deep)).contains("not a JSON object"));
    }

    #[test]
    fn a_decomposition_is_read_with_its_graph() {
        let answer = json!({
            "fanout": true, "rationale": "two parts",
            "tasks": [
                {"title": "Write the API", "body": "b0", "assignee": "coder", "parents": []},
                {"title": "Document it", "assignee": null, "parents": [0, 0]},
                {"title": "Announce", "assignee": " writer ", "parents": [1]},
            ]
        })
        .to_string();
        let plan = read_decomposition(&answer, &roster()).expect("read");
        let TriagePlan::Decompose {
            rationale,
            children,
        } = plan
        else {
            panic!("a decomposition");
        };
        assert_eq!(rationale.as_deref(), Some("two parts"));
        assert_eq!(children.len(), 3);
        assert_eq!(children[0].assignee.as_deref(), Some("coder"));
        assert_eq!(children[0].body.as_deref(), Some("b0"));
        assert_eq!(children[1].assignee, None);
        assert_eq!(children[1].body, None);
        assert_eq!(children[1].parents, vec![0]);
        assert_eq!(children[2].assignee.as_deref(), Some("writer"));
        assert_eq!(creation_order(&children), vec![0, 1, 2]);
    }

    #[test]
    fn a_blank_assignee_is_the_default_agent_and_a_rationale_is_bounded() {
        let blank = r#"{"fanout": false, "title": "T", "assignee": "  "}"#;
        let TriagePlan::Specify(spec) = read_decomposition(blank, &roster()).expect("read") else {
            panic!("one card");
        };
        assert_eq!(spec.assignee, None);
        let with = |rationale: String| {
            json!({"fanout": true, "rationale": rationale, "tasks": [{"title": "t"}]}).to_string()
        };
        assert!(read_decomposition(&with("r".repeat(MAX_TITLE_CHARS * 4)), &roster()).is_ok());
        let long = refusal(read_decomposition(&with("r".repeat(801)), &roster()));
        assert!(
            long.contains("rationale of 801 characters, more than 800"),
            "{long}"
        );
    }

    #[test]
    fn no_fanout_is_one_card_with_its_assignee() {
        let answer = r#"{"fanout": false, "title": "T", "body": "B", "assignee": "writer"}"#;
        assert_eq!(
            read_decomposition(answer, &roster()),
            Ok(TriagePlan::Specify(Specification {
                title: Some("T".into()),
                body: Some("B".into()),
                assignee: Some("writer".into()),
            }))
        );
        let stranger = r#"{"fanout": false, "title": "T", "assignee": "root"}"#;
        assert!(
            refusal(read_decomposition(stranger, &roster()))
                .contains("\"root\", which is not an agent of the roster (coder, writer)")
        );
        assert!(
            refusal(read_decomposition(stranger, &Roster::default())).contains("roster (none)")
        );
        // The specifier never reads an assignee.
        assert_eq!(read_specification(stranger).expect("read").assignee, None);
    }

    /// A task of an answer: a title and `extra`.
    fn task(extra: Value) -> Value {
        let mut task = json!({"title": "t"});
        if let (Value::Object(task), Value::Object(extra)) = (&mut task, extra) {
            task.extend(extra);
        }
        task
    }

    #[test]
    fn a_malformed_decomposition_is_refused_with_why() {
        let many: Vec<Value> = (0..=MAX_CHILDREN).map(|_| task(json!({}))).collect();
        let most: Vec<Value> = (0..MAX_CHILDREN).map(|_| task(json!({}))).collect();
        assert!(
            read_decomposition(
                &json!({"fanout": true, "tasks": most}).to_string(),
                &roster()
            )
            .is_ok()
        );
        for (answer, why) in [
            (json!({"tasks": [task(json!({}))]}), "no \"fanout\""),
            (
                json!({"fanout": "yes", "tasks": [task(json!({}))]}),
                "no \"fanout\"",
            ),
            (json!({"fanout": true}), "no \"tasks\" list"),
            (json!({"fanout": true, "tasks": {}}), "no \"tasks\" list"),
            (json!({"fanout": true, "tasks": []}), "gives 0 tasks"),
            (json!({"fanout": true, "tasks": many}), "gives 13 tasks"),
            (json!({"fanout": true, "tasks": ["t"]}), "not an object"),
            (
                json!({"fanout": true, "tasks": [{"body": "b"}]}),
                "tasks[0] no title",
            ),
            (
                json!({"fanout": true, "tasks": [task(json!({"parents": [1]}))]}),
                "the parent 1",
            ),
            (
                json!({"fanout": true, "tasks": [task(json!({"parents": [0]}))]}),
                "the parent 0",
            ),
            (
                json!({"fanout": true, "tasks": [task(json!({"parents": [-1]}))]}),
                "the parent -1",
            ),
            (
                json!({"fanout": true, "tasks": [task(json!({"parents": ["0"]}))]}),
                "the parent \"0\"",
            ),
            (
                json!({"fanout": true, "tasks": [task(json!({"parents": 0}))]}),
                "not a list",
            ),
            (
                json!({"fanout": true, "tasks": [task(json!({"assignee": "root"}))]}),
                "routes tasks[0].to \"root\"",
            ),
            (
                json!({"fanout": true, "tasks": [task(json!({"assignee": 1}))]}),
                "assignee that is not a string",
            ),
            (
                json!({"fanout": true, "tasks": [task(json!({"body": ["x"]}))]}),
                "tasks[0].body that is not a string",
            ),
            (
                json!({"fanout": true, "rationale": 5, "tasks": [task(json!({}))]}),
                "rationale",
            ),
            (
                json!({"fanout": true, "tasks": [task(json!({"parents": [1]})), task(json!({"parents": [0]}))]}),
                "cycle",
            ),
            (
                json!({"fanout": false, "rationale": "r"}),
                "neither a title nor a body",
            ),
        ] {
            let got = refusal(read_decomposition(&answer.to_string(), &roster()));
            assert!(got.contains(why), "{answer}: {got}");
        }
    }

    #[test]
    fn a_decomposition_whose_tasks_wait_in_a_cycle_is_refused() {
        let mut cycle = vec![task(json!({"parents": [2]}))];
        cycle.push(task(json!({"parents": [0]})));
        cycle.push(task(json!({"parents": [1]})));
        cycle.push(task(json!({})));
        let got = refusal(read_decomposition(
            &json!({"fanout": true, "tasks": cycle}).to_string(),
            &roster(),
        ));
        assert!(got.contains("cycle"), "{got}");
    }

    #[test]
    fn children_are_made_after_the_cards_they_wait_for() {
        let child = |parents: Vec<usize>| ChildCard {
            title: "t".into(),
            body: None,
            assignee: None,
            parents,
            workspace: None,
        };
        let children = vec![
            child(vec![2]),
            child(vec![]),
            child(vec![1]),
            child(vec![0, 1]),
        ];
        assert_eq!(creation_order(&children), vec![1, 2, 0, 3]);
        assert_eq!(
            creation_order(&[child(vec![1]), child(vec![0])]),
            Vec::<usize>::new()
        );
        assert_eq!(creation_order(&[child(vec![5])]), Vec::<usize>::new());
    }

    #[test]
    fn a_plan_is_checked_as_it_is_written() {
        let child = ChildCard {
            title: "t".into(),
            body: None,
            assignee: None,
            parents: vec![],
            workspace: None,
        };
        let decompose = |children: Vec<ChildCard>| TriagePlan::Decompose {
            rationale: None,
            children,
        };
        assert_eq!(check_plan(&decompose(vec![child.clone()])), Ok(()));
        assert!(check_plan(&decompose(vec![])).is_err());
        assert!(check_plan(&decompose(vec![child.clone(); MAX_CHILDREN + 1])).is_err());
        assert_eq!(
            check_plan(&decompose(vec![child.clone(); MAX_CHILDREN])),
            Ok(())
        );
        let blank = ChildCard {
            title: " ".into(),
            ..child.clone()
        };
        assert!(check_plan(&decompose(vec![blank])).is_err());
        let lost = ChildCard {
            parents: vec![3],
            ..child
        };
        assert!(check_plan(&decompose(vec![lost])).is_err());
        let spec = |title: Option<&str>, body: Option<&str>, assignee: Option<&str>| {
            TriagePlan::Specify(Specification {
                title: title.map(Into::into),
                body: body.map(Into::into),
                assignee: assignee.map(Into::into),
            })
        };
        assert!(check_plan(&spec(None, None, None)).is_err());
        assert!(check_plan(&spec(Some(" "), Some("b"), None)).is_err());
        assert_eq!(check_plan(&spec(Some("t"), None, None)), Ok(()));
        assert_eq!(check_plan(&spec(None, Some("b"), None)), Ok(()));
        assert_eq!(check_plan(&spec(None, None, Some("coder"))), Ok(()));
    }

    #[test]
    fn settling_puts_a_triage_card_in_line_with_only_what_changed() {
        let current = Specification {
            title: Some("idea".into()),
            body: None,
            assignee: Some("coder".into()),
        };
        let plan = TriagePlan::Specify(Specification {
            title: Some("idea".into()),
            body: Some("spec".into()),
            assignee: Some("writer".into()),
        });
        let free = settle(
            &card(TaskStatus::Triage, false),
            &current,
            &plan,
            &[],
            "ann",
        )
        .expect("settled");
        assert_eq!(free.status, Some(TaskStatus::Ready));
        let edit = free.edit.expect("an edit");
        assert_eq!(edit.title, None);
        assert_eq!(edit.body.as_deref(), Some("spec"));
        assert_eq!(edit.assignee, Change::Set("writer".into()));
        assert_eq!(free.events[0].kind, "specified");
        assert_eq!(
            free.events[0].payload["changed_fields"],
            json!(["body", "assignee"])
        );
        assert_eq!(free.events[0].payload["by"], json!("ann"));
        let retitled = TriagePlan::Specify(Specification {
            title: Some("a sharper idea".into()),
            ..current.clone()
        });
        let edit = settle(
            &card(TaskStatus::Triage, false),
            &current,
            &retitled,
            &[],
            "ann",
        )
        .expect("settled")
        .edit
        .expect("an edit");
        assert_eq!(edit.title.as_deref(), Some("a sharper idea"));
        assert_eq!(edit.fields(), vec!["title"]);
        let waiting =
            settle(&card(TaskStatus::Triage, true), &current, &plan, &[], "ann").expect("settled");
        assert_eq!(waiting.status, Some(TaskStatus::Todo));
        let same = TriagePlan::Specify(current.clone());
        let unchanged = settle(
            &card(TaskStatus::Triage, false),
            &current,
            &same,
            &[],
            "ann",
        )
        .expect("settled");
        assert_eq!(unchanged.edit, None);
        for status in [
            TaskStatus::Todo,
            TaskStatus::Ready,
            TaskStatus::Blocked,
            TaskStatus::Done,
        ] {
            let refused = settle(&card(status, false), &current, &plan, &[], "ann");
            assert!(
                matches!(refused, Err(BoardError::InvalidTransition { ref action, .. }) if action == "specify"),
                "{status:?}: {refused:?}"
            );
        }
    }

    #[test]
    fn settling_a_decomposition_names_the_children() {
        let plan = TriagePlan::Decompose {
            rationale: Some("split".into()),
            children: vec![],
        };
        let ids = vec!["t_a".to_owned(), "t_b".to_owned()];
        let settled = settle(
            &card(TaskStatus::Triage, true),
            &Specification::default(),
            &plan,
            &ids,
            "ann",
        )
        .expect("settled");
        assert_eq!(settled.status, Some(TaskStatus::Todo));
        assert_eq!(settled.edit, None);
        assert_eq!(settled.events[0].kind, "decomposed");
        assert_eq!(
            settled.events[0].payload["child_ids"],
            json!(["t_a", "t_b"])
        );
        assert_eq!(settled.events[0].payload["rationale"], json!("split"));
        let refused = settle(
            &card(TaskStatus::Todo, true),
            &Specification::default(),
            &plan,
            &ids,
            "ann",
        );
        assert!(
            matches!(refused, Err(BoardError::InvalidTransition { ref action, .. }) if action == "decompose"),
            "{refused:?}"
        );
        assert_eq!(
            note(&plan, "planner", &ids),
            "Decomposed by the agent planner into t_a, t_b; this card waits for them. Why: split"
        );
        assert_eq!(
            note(
                &TriagePlan::Specify(Specification::default()),
                "planner",
                &[]
            ),
            "Specified by the agent planner and put in line."
        );
    }

    #[test]
    fn prompts_carry_the_card_and_the_roster() {
        let card = TriageCard {
            id: "t_9",
            title: "make it fast",
            body: "",
        };
        let specify = specify_prompt(&card);
        assert!(
            specify
                .user
                .contains("Task id: t_9\nTitle: make it fast\nBody:\n(no body)")
        );
        assert!(specify.system.contains("\"title\""));
        let decompose = decompose_prompt(&card, &roster());
        assert!(decompose.user.contains("  - coder: writes Rust\n"));
        assert!(decompose.user.contains("  - writer (no description)\n"));
        assert!(
            decompose
                .user
                .contains("default agent (for a null assignee): coder")
        );
        assert!(decompose.system.contains("\"fanout\": true"));
        let blank = Roster {
            agents: vec![RosterEntry {
                name: "quiet".into(),
                description: Some("  ".into()),
            }],
            default: None,
        };
        assert!(
            decompose_prompt(&card, &blank)
                .user
                .contains("  - quiet (no description)\n")
        );
        let empty = decompose_prompt(&card, &Roster::default());
        assert!(empty.user.contains("(none: leave every assignee null)"));
        assert!(empty.user.contains("none named"));
        let long = "y".repeat(PROMPT_BODY_CHARS + 10);
        let cut_prompt = specify_prompt(&TriageCard {
            body: &long,
            ..card
        });
        assert!(
            cut_prompt
                .user
                .contains(&format!("{}…", "y".repeat(PROMPT_BODY_CHARS - 1)))
        );
        assert!(!cut_prompt.user.contains(&"y".repeat(PROMPT_BODY_CHARS)));
        let exact = "z".repeat(PROMPT_BODY_CHARS);
        assert!(
            specify_prompt(&TriageCard {
                body: &exact,
                ..card
            })
            .user
            .contains(&exact)
        );
    }
}

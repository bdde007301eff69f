//! The board as tools: the worker's fenced writes (its terminal calls,
//! heartbeat, comment and fan-out) and reads of the board, for
//! function-calling models and for MCP clients.

use std::sync::Arc;

use kanban_core::rules::Start;
use kanban_core::{Board, BoardAdmin, BoardError, Claim, Handoff, NewTask, TaskStatus};
use serde_json::{Value, json};

/// The most cards `kanban_list` returns at once.
const LIST_LIMIT: usize = 200;
/// What `kanban_list` returns when no limit is asked.
const LIST_DEFAULT: usize = 50;

/// A board a tool can write to and read from.
pub trait ToolBoard: Board + BoardAdmin {}

impl<B: Board + BoardAdmin + ?Sized> ToolBoard for B {}

/// One tool: its name, what it does, and the JSON schema of its arguments.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolSpec {
    pub name: &'static str,
    pub description: &'static str,
    pub schema: Value,
}

fn object(properties: Value, required: &[&str]) -> Value {
    json!({"type": "object", "properties": properties, "required": required, "additionalProperties": false})
}

/// The board tools, terminal calls first.
pub fn board_tool_specs(with_show: bool) -> Vec<ToolSpec> {
    let mut specs = vec![
        ToolSpec {
            name: "kanban_complete",
            description: "Finish your card: the work is done. This is a terminal call; make it once, at the end.",
            schema: object(
                json!({
                    "summary": {"type": "string", "description": "one line on what was done"},
                    "result": {"type": "string", "description": "the result, if there is one to hand over"},
                    "metadata": {"type": "object", "description": "facts for whoever reads the run: changed_files, tests_run… (at most 64 KiB of JSON)"},
                    "created_cards": {"type": "array", "items": {"type": "string"}, "description": "the ids of the cards you made with kanban_create; an id you did not make refuses the call, changing nothing"}
                }),
                &["summary"],
            ),
        },
        ToolSpec {
            name: "kanban_block",
            description: "Stop: you cannot go on. This is a terminal call. Say what kind of wait it is: dependency (another card must finish first: the card waits for its parents, no person needed), needs_input (a person must answer or decide), capability (something no agent can do: access, credentials), transient (may clear by itself).",
            schema: object(
                json!({"reason": {"type": "string", "description": "what is missing or wrong"}, "kind": {"type": "string", "enum": ["dependency", "needs_input", "capability", "transient"], "description": "what the card waits for"}}),
                &["reason"],
            ),
        },
        ToolSpec {
            name: "kanban_heartbeat",
            description: "Say you are still working; extends your claim's lease.",
            schema: object(json!({"note": {"type": "string"}}), &[]),
        },
        ToolSpec {
            name: "kanban_comment",
            description: "Leave a note on your card for humans and later runs.",
            schema: object(json!({"text": {"type": "string"}}), &["text"]),
        },
    ];
    specs.extend(fan_out_tool_specs());
    if with_show {
        specs.push(ToolSpec {
            name: "kanban_show",
            description: "Read your own card: title, body, status, its runs so far, and the comments on it (humans steer you there; newest last).",
            schema: object(json!({}), &[]),
        });
    }
    specs
}

/// The tools of a run's fan-out, and a read of the board.
fn fan_out_tool_specs() -> [ToolSpec; 5] {
    [
        ToolSpec {
            name: "kanban_create",
            description: "Fan out: make a new card for another agent. It waits for your card (and any parents you name) and becomes ready when they are done, so finish your own card with kanban_complete, naming it in created_cards. Returns its id.",
            schema: object(
                json!({
                    "title": {"type": "string", "description": "what is to be done, in one line"},
                    "assignee": {"type": "string", "description": "the agent that should do it"},
                    "body": {"type": "string", "description": "the full spec and acceptance criteria"},
                    "priority": {"type": "integer", "description": "higher is claimed first"},
                    "parents": {"type": "array", "items": {"type": "string"}, "description": "cards it must also wait for (for example the cards a synthesizer gathers)"},
                    "triage": {"type": "boolean", "description": "start in triage, for a person to shape first"},
                    "idempotency_key": {"type": "string", "description": "a second call with the same key returns the first card"},
                    "tenant": {"type": "string", "description": "the namespace it belongs to (default: your card's)"}
                }),
                &["title"],
            ),
        },
        ToolSpec {
            name: "kanban_link",
            description: "Make child, a card you made, wait for parent too (a cycle is refused).",
            schema: object(
                json!({"parent_id": {"type": "string"}, "child_id": {"type": "string", "description": "a card you made with kanban_create"}}),
                &["parent_id", "child_id"],
            ),
        },
        ToolSpec {
            name: "kanban_unblock",
            description: "Move a blocked card you made back in line.",
            schema: object(
                json!({"task_id": {"type": "string", "description": "a card you made with kanban_create"}}),
                &["task_id"],
            ),
        },
        ToolSpec {
            name: "kanban_attach",
            description: "Attach a file to your own card, its bytes inline (base64), 25 MiB at most: a report, an image, an export the next worker or a person should be able to download.",
            schema: object(
                json!({
                    "filename": {"type": "string", "description": "the name to store it under; folders are dropped"},
                    "content_base64": {"type": "string", "description": "the file's bytes, base64"},
                    "content_type": {"type": "string", "description": "its content type (default: guessed from the name)"}
                }),
                &["filename", "content_base64"],
            ),
        },
        ToolSpec {
            name: "kanban_list",
            description: "List the board's cards, oldest first, optionally of one assignee or status; truncated says there are more.",
            schema: object(
                json!({
                    "assignee": {"type": "string"},
                    "status": {"type": "string", "enum": ["triage", "todo", "scheduled", "ready", "running", "blocked", "review", "done", "archived"]},
                    "limit": {"type": "integer", "minimum": 1, "maximum": LIST_LIMIT, "description": "at most this many (default 50)"}
                }),
                &[],
            ),
        },
    ]
}

/// What a tool call did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolOutcome {
    /// The text handed back to the model or the client.
    pub text: String,
    pub is_error: bool,
    /// The call settled the card (complete or block).
    pub terminal: bool,
}

impl ToolOutcome {
    fn ok(text: String, terminal: bool) -> Self {
        Self {
            text,
            is_error: false,
            terminal,
        }
    }

    fn error(text: String) -> Self {
        Self {
            text,
            is_error: true,
            terminal: false,
        }
    }
}

fn refused(error: BoardError) -> ToolOutcome {
    match error {
        BoardError::LeaseLost { .. } => ToolOutcome::error(format!(
            "refused: {error}. This worker no longer holds the card (it was reclaimed, settled or its lease ran out); stop working on it."
        )),
        other => ToolOutcome::error(format!("the board refused the call: {other}")),
    }
}

fn text_argument<'a>(arguments: &'a Value, name: &str) -> Result<Option<&'a str>, ToolOutcome> {
    match arguments.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text.as_str())),
        Some(other) => Err(ToolOutcome::error(format!(
            "invalid arguments: `{name}` must be a string, not {other}"
        ))),
    }
}

/// Refuses an argument the tool's schema does not name, as its
/// `additionalProperties: false` promises: a `task_id` naming another card
/// must not be quietly ignored, as if the call had acted on it.
fn check_arguments(name: &str, arguments: &Value) -> Result<(), ToolOutcome> {
    let Some(spec) = board_tool_specs(true)
        .into_iter()
        .find(|spec| spec.name == name)
    else {
        return Ok(()); // an unknown tool is named as such below
    };
    let known: Vec<&String> = spec.schema["properties"]
        .as_object()
        .map(|properties| properties.keys().collect())
        .unwrap_or_default();
    let Some(given) = arguments.as_object() else {
        return Ok(());
    };
    if let Some(unknown) = given.keys().find(|key| !known.contains(key)) {
        let accepted = if known.is_empty() {
            "none".to_owned()
        } else {
            known
                .iter()
                .map(|key| key.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        return Err(ToolOutcome::error(format!(
            "unknown argument `{unknown}` for {name}: it acts on your own card and the cards it made only; its arguments are {accepted}"
        )));
    }
    Ok(())
}

/// A list of ids: an array of strings, or one string.
fn ids_argument(arguments: &Value, name: &str) -> Result<Vec<String>, ToolOutcome> {
    let invalid = || {
        ToolOutcome::error(format!(
            "invalid arguments: `{name}` must be an array of card ids"
        ))
    };
    match arguments.get(name) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(id)) => Ok(vec![id.trim().to_owned()]),
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| {
                item.as_str()
                    .map(|id| id.trim().to_owned())
                    .ok_or_else(invalid)
            })
            .filter(|id| !matches!(id, Ok(id) if id.is_empty()))
            .collect(),
        Some(_) => Err(invalid()),
    }
}

fn integer_argument(arguments: &Value, name: &str) -> Result<Option<i64>, ToolOutcome> {
    match arguments.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => value.as_i64().map(Some).ok_or_else(|| {
            ToolOutcome::error(format!(
                "invalid arguments: `{name}` must be a whole number, not {value}"
            ))
        }),
    }
}

fn flag_argument(arguments: &Value, name: &str) -> Result<bool, ToolOutcome> {
    match arguments.get(name) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(flag)) => Ok(*flag),
        Some(other) => Err(ToolOutcome::error(format!(
            "invalid arguments: `{name}` must be true or false, not {other}"
        ))),
    }
}

fn required<'a>(arguments: &'a Value, name: &str) -> Result<&'a str, ToolOutcome> {
    text_argument(arguments, name)?
        .filter(|text| !text.trim().is_empty())
        .ok_or_else(|| {
            ToolOutcome::error(format!(
                "invalid arguments: `{name}` is required and must not be blank"
            ))
        })
}

/// The board tools bound to one worker's claim.
#[derive(Clone)]
pub struct BoardTools {
    board: Arc<dyn ToolBoard>,
    claim: Claim,
    author: String,
    /// Where the board's attached files are kept on this host, when known.
    attachments: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for BoardTools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BoardTools")
            .field("claim", &self.claim)
            .finish_non_exhaustive()
    }
}

impl BoardTools {
    /// `kanban_complete`: the terminal call with its handoff.
    async fn complete(&self, arguments: &Value) -> Result<ToolOutcome, ToolOutcome> {
        let claim = &self.claim;
        let summary = required(arguments, "summary")?;
        let result = text_argument(arguments, "result")?.map(str::to_owned);
        let metadata = match arguments.get("metadata") {
            None | Some(Value::Null) => None,
            Some(Value::Object(metadata)) => Some(metadata.clone()),
            Some(other) => {
                return Err(ToolOutcome::error(format!(
                    "invalid arguments: `metadata` must be a JSON object, not {other}"
                )));
            }
        };
        let handoff = Handoff {
            summary: summary.to_owned(),
            result,
            metadata,
            created_cards: ids_argument(arguments, "created_cards")?,
        };
        Ok(match self.board.hand_off(claim, &handoff).await {
            Ok(()) => ToolOutcome::ok(
                json!({"ok": true, "task_id": claim.task_id, "run_id": claim.run_id}).to_string(),
                true,
            ),
            Err(error) => refused(error),
        })
    }

    /// The fan-out tools (`name` is one of them) and the board listing.
    async fn fan_out(&self, name: &str, arguments: &Value) -> Result<ToolOutcome, ToolOutcome> {
        let claim = &self.claim;
        Ok(match name {
            "kanban_create" => {
                let task = NewTask {
                    title: required(arguments, "title")?.trim().to_owned(),
                    assignee: text_argument(arguments, "assignee")?.map(str::to_owned),
                    body: text_argument(arguments, "body")?.map(str::to_owned),
                    priority: integer_argument(arguments, "priority")?.unwrap_or(0),
                    parents: ids_argument(arguments, "parents")?,
                    start: if flag_argument(arguments, "triage")? {
                        Start::Triage
                    } else {
                        Start::InLine
                    },
                    idempotency_key: text_argument(arguments, "idempotency_key")?
                        .map(str::to_owned),
                    tenant: text_argument(arguments, "tenant")?.map(str::to_owned),
                    ..NewTask::default()
                };
                match self.board.create_child(claim, &task).await {
                    Ok(id) => ToolOutcome::ok(
                        json!({"ok": true, "task_id": id, "parent": claim.task_id}).to_string(),
                        false,
                    ),
                    Err(error) => refused(error),
                }
            }
            "kanban_link" => {
                let parent = required(arguments, "parent_id")?;
                let child = required(arguments, "child_id")?;
                match self.board.link_child(claim, parent, child).await {
                    Ok(linked) => ToolOutcome::ok(
                        json!({"ok": true, "parent_id": parent, "child_id": child, "new": linked})
                            .to_string(),
                        false,
                    ),
                    Err(error) => refused(error),
                }
            }
            "kanban_unblock" => {
                let task_id = required(arguments, "task_id")?;
                match self.board.unblock_child(claim, task_id).await {
                    Ok(()) => {
                        ToolOutcome::ok(json!({"ok": true, "task_id": task_id}).to_string(), false)
                    }
                    Err(error) => refused(error),
                }
            }
            _ => self.list(arguments).await?,
        })
    }

    async fn list(&self, arguments: &Value) -> Result<ToolOutcome, ToolOutcome> {
        let status = match text_argument(arguments, "status")? {
            None => None,
            Some(raw) => Some(TaskStatus::parse(raw).ok_or_else(|| {
                ToolOutcome::error(format!(
                    "invalid arguments: unknown `status` {raw:?}: use triage, todo, scheduled, ready, running, blocked, review, done or archived"
                ))
            })?),
        };
        let assignee = text_argument(arguments, "assignee")?;
        let limit = match integer_argument(arguments, "limit")? {
            None => LIST_DEFAULT,
            Some(limit) => usize::try_from(limit)
                .ok()
                .filter(|limit| (1..=LIST_LIMIT).contains(limit))
                .ok_or_else(|| {
                    ToolOutcome::error(format!(
                        "invalid arguments: `limit` is 1 to {LIST_LIMIT}, not {limit}"
                    ))
                })?,
        };
        // Page by page, oldest first, so that a listing of a board of any
        // size holds no more than a page and the cards it returns.
        let mut shown: Vec<Value> = Vec::new();
        let mut truncated = false;
        let mut after = None;
        'pages: loop {
            let page = match self.board.list_page(status, after, LIST_LIMIT + 1).await {
                Ok(page) => page,
                Err(error) => return Ok(refused(error)),
            };
            let matching = page
                .tasks
                .iter()
                .filter(|task| assignee.is_none() || task.assignee.as_deref() == assignee)
                .filter(|task| {
                    status.is_some() || task.status.known() != Some(TaskStatus::Archived)
                });
            for task in matching {
                if shown.len() == limit {
                    truncated = true;
                    break 'pages;
                }
                shown.push(json!({"id": task.id, "title": task.title, "assignee": task.assignee, "status": task.status.as_str(), "priority": task.priority, "created_by": task.created_by}));
            }
            match page.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        Ok(ToolOutcome::ok(
            json!({"tasks": shown, "count": shown.len(), "truncated": truncated}).to_string(),
            false,
        ))
    }

    pub fn new(board: Arc<dyn ToolBoard>, claim: Claim, author: impl Into<String>) -> Self {
        Self {
            board,
            claim,
            author: author.into(),
            attachments: None,
        }
    }

    /// The same tools, `kanban_attach` keeping files under `root` (the
    /// board's attachments folder on this host).
    #[must_use]
    pub fn with_attachments(mut self, root: std::path::PathBuf) -> Self {
        self.attachments = Some(root);
        self
    }

    /// `kanban_attach`: the file written, then recorded on the run's own
    /// card, fenced; removed again when the fence refuses it.
    async fn attach(&self, arguments: &Value) -> Result<ToolOutcome, ToolOutcome> {
        use base64::Engine as _;
        let Some(root) = &self.attachments else {
            return Ok(ToolOutcome::error(
                "this board's attachments folder is not known here: attach with `kanban attach` instead".to_owned(),
            ));
        };
        let name = required(arguments, "filename")?;
        let encoded = text_argument(arguments, "content_base64")?.unwrap_or("");
        // Bounded before decoding: base64 is four characters per three bytes.
        let bound = kanban_core::attachments::MAX_ATTACHMENT_BYTES / 3 * 4 + 8;
        if encoded.len() as u64 > bound {
            return Ok(ToolOutcome::error(format!(
                "the file is larger than {} MiB: a card takes no more",
                kanban_core::attachments::MAX_ATTACHMENT_BYTES >> 20
            )));
        }
        let bytes = match base64::engine::general_purpose::STANDARD.decode(encoded.trim()) {
            Ok(bytes) => bytes,
            Err(error) => {
                return Ok(ToolOutcome::error(format!(
                    "invalid arguments: `content_base64` is not base64 ({error})"
                )));
            }
        };
        let content_type = text_argument(arguments, "content_type")?;
        let stored = match crate::store_attachment(
            root,
            &self.claim.task_id,
            name,
            &bytes,
            content_type,
            &self.author,
        ) {
            Ok(stored) => stored,
            Err(problem) => return Ok(ToolOutcome::error(problem)),
        };
        Ok(match self.board.attach(&self.claim, &stored).await {
            Ok(id) => ToolOutcome::ok(
                json!({"ok": true, "id": id, "filename": stored.filename, "size": stored.size})
                    .to_string(),
                false,
            ),
            Err(error) => {
                crate::discard_attachment(&stored);
                refused(error)
            }
        })
    }

    /// Runs tool `name` with raw JSON `arguments`. Never panics: bad
    /// arguments, unknown tools and refused writes come back as errors the
    /// model can read.
    pub async fn call(&self, name: &str, arguments: &str) -> ToolOutcome {
        let arguments: Value = match arguments.trim() {
            "" => json!({}),
            raw => match serde_json::from_str(raw) {
                Ok(value @ Value::Object(_)) => value,
                Ok(other) => {
                    return ToolOutcome::error(format!(
                        "invalid arguments: expected a JSON object, got {other}"
                    ));
                }
                Err(error) => {
                    return ToolOutcome::error(format!(
                        "invalid JSON in the tool arguments ({error}): {}",
                        raw.chars().take(200).collect::<String>()
                    ));
                }
            },
        };
        match self.dispatch(name, &arguments).await {
            Ok(outcome) | Err(outcome) => outcome,
        }
    }

    async fn dispatch(&self, name: &str, arguments: &Value) -> Result<ToolOutcome, ToolOutcome> {
        check_arguments(name, arguments)?;
        let claim = &self.claim;
        Ok(match name {
            "kanban_complete" => self.complete(arguments).await?,
            "kanban_block" => {
                let reason = required(arguments, "reason")?;
                let kind = match text_argument(arguments, "kind")? {
                    None => None,
                    Some(raw) => Some(kanban_core::BlockKind::parse(raw).ok_or_else(|| {
                        ToolOutcome::error(format!(
                            "invalid arguments: unknown `kind` {raw:?}: use dependency, needs_input, capability or transient"
                        ))
                    })?),
                };
                match self.board.block(claim, reason, kind).await {
                    Ok(()) => ToolOutcome::ok(
                        json!({"ok": true, "task_id": claim.task_id, "blocked": true}).to_string(),
                        true,
                    ),
                    Err(error) => refused(error),
                }
            }
            "kanban_heartbeat" => {
                let note = text_argument(arguments, "note")?.map(str::to_owned);
                match self.board.heartbeat(claim, note).await {
                    Ok(expires) => ToolOutcome::ok(
                        json!({"ok": true, "claim_expires": expires}).to_string(),
                        false,
                    ),
                    Err(error) => refused(error),
                }
            }
            "kanban_comment" => {
                let text = required(arguments, "text")?;
                match self.board.comment(claim, &self.author, text).await {
                    Ok(()) => ToolOutcome::ok(json!({"ok": true}).to_string(), false),
                    Err(error) => refused(error),
                }
            }
            "kanban_create" | "kanban_link" | "kanban_unblock" | "kanban_list" => {
                self.fan_out(name, arguments).await?
            }
            "kanban_attach" => self.attach(arguments).await?,
            "kanban_show" => match self.board.show_task(&claim.task_id).await {
                Ok(view) => {
                    let runs: Vec<Value> = view
                        .runs
                        .iter()
                        .map(|r| json!({"id": r.id, "status": r.status, "outcome": r.outcome, "summary": r.summary, "error": r.error}))
                        .collect();
                    let task = &view.task;
                    ToolOutcome::ok(
                        json!({"id": task.id, "title": task.title, "body": task.body, "status": task.status.as_str(), "runs": runs, "comments": view.comments}).to_string(),
                        false,
                    )
                }
                Err(error) => refused(error),
            },
            other => ToolOutcome::error(format!(
                "unknown tool `{other}`: the tools are {}",
                board_tool_specs(true)
                    .iter()
                    .map(|s| s.name)
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        })
    }
}

//! The board as tools: the same four fenced writes (and a read of the
//! worker's own card) for function-calling models and for MCP clients.

use std::sync::Arc;

use kanban_core::{Board, BoardAdmin, BoardError, Claim};
use serde_json::{Value, json};

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
                json!({"summary": {"type": "string", "description": "one line on what was done"}, "result": {"type": "string", "description": "the result, if there is one to hand over"}}),
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
    if with_show {
        specs.push(ToolSpec {
            name: "kanban_show",
            description: "Read your own card: title, body, status, its runs so far, and the comments on it (humans steer you there; newest last).",
            schema: object(json!({}), &[]),
        });
    }
    specs
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
            "unknown argument `{unknown}` for {name}: it acts on your own card only; its arguments are {accepted}"
        )));
    }
    Ok(())
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
}

impl std::fmt::Debug for BoardTools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BoardTools")
            .field("claim", &self.claim)
            .finish_non_exhaustive()
    }
}

impl BoardTools {
    pub fn new(board: Arc<dyn ToolBoard>, claim: Claim, author: impl Into<String>) -> Self {
        Self {
            board,
            claim,
            author: author.into(),
        }
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
            "kanban_complete" => {
                let summary = required(arguments, "summary")?;
                let result = text_argument(arguments, "result")?.map(str::to_owned);
                match self.board.complete(claim, summary, result).await {
                    Ok(()) => ToolOutcome::ok(
                        json!({"ok": true, "task_id": claim.task_id, "run_id": claim.run_id})
                            .to_string(),
                        true,
                    ),
                    Err(error) => refused(error),
                }
            }
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

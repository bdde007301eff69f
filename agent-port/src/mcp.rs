//! The board tools as an MCP server: JSON-RPC 2.0, one message per line.
//! `kanban mcp` feeds it stdin; tests and fuzzers feed it strings.

use serde_json::{Value, json};

use crate::tools::{BoardTools, board_tool_specs};

/// The protocol revision answered when a client names none, or one this
/// server does not speak.
pub const MCP_PROTOCOL_VERSION: &str = "2025-06-18";

/// The revisions this server speaks; a client asking for one gets it.
pub const MCP_PROTOCOL_VERSIONS: [&str; 3] = ["2025-06-18", "2025-03-26", "2024-11-05"];

/// The longest request line served: 4 MiB. A longer one is refused
/// without being held in memory.
pub const MCP_MAX_LINE_BYTES: usize = 4 * 1024 * 1024;

/// The answer to a line that could not be read: over [`MCP_MAX_LINE_BYTES`]
/// or not UTF-8. The server keeps serving.
pub fn unreadable_line_answer(too_long: bool) -> String {
    let message = if too_long {
        format!("invalid request: a message is at most {MCP_MAX_LINE_BYTES} bytes")
    } else {
        "parse error: the message is not UTF-8".to_owned()
    };
    let code = if too_long { -32600 } else { -32700 };
    failure(&Value::Null, code, &message).to_string()
}

fn reply(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

fn failure(id: &Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

/// Serves one worker's board tools.
#[derive(Clone, Debug)]
pub struct McpServer {
    tools: BoardTools,
}

impl McpServer {
    pub fn new(tools: BoardTools) -> Self {
        Self { tools }
    }

    /// Answers one line: `None` for a notification or a blank line, else one
    /// JSON-RPC response (a parse error for anything that is not a request).
    pub async fn handle_line(&self, line: &str) -> Option<String> {
        if line.trim().is_empty() {
            return None;
        }
        let answer = match serde_json::from_str::<Value>(line) {
            Ok(message) if message.is_object() => self.handle(&message).await?,
            Ok(_) => failure(
                &Value::Null,
                -32600,
                "invalid request: a JSON-RPC message is an object",
            ),
            Err(error) => failure(&Value::Null, -32700, &format!("parse error: {error}")),
        };
        Some(answer.to_string())
    }

    async fn handle(&self, message: &Value) -> Option<Value> {
        let id = message.get("id")?.clone();
        let method = message["method"].as_str().unwrap_or("");
        Some(match method {
            "initialize" => reply(
                &id,
                json!({
                    "protocolVersion": message
                        .pointer("/params/protocolVersion")
                        .and_then(Value::as_str)
                        .filter(|asked| MCP_PROTOCOL_VERSIONS.contains(asked))
                        .unwrap_or(MCP_PROTOCOL_VERSION),
                    "capabilities": {"tools": {"listChanged": false}},
                    "serverInfo": {"name": "kanban", "version": env!("CARGO_PKG_VERSION")},
                    "instructions": "Board tools for the card this worker holds. End your work with kanban_complete or kanban_block.",
                }),
            ),
            "ping" => reply(&id, json!({})),
            "tools/list" => {
                let tools: Vec<Value> = board_tool_specs(true)
                    .into_iter()
                    .map(|spec| json!({"name": spec.name, "description": spec.description, "inputSchema": spec.schema}))
                    .collect();
                reply(&id, json!({"tools": tools}))
            }
            "tools/call" => {
                let Some(name) = message.pointer("/params/name").and_then(Value::as_str) else {
                    return Some(failure(&id, -32602, "tools/call needs params.name"));
                };
                let arguments = message
                    .pointer("/params/arguments")
                    .cloned()
                    .unwrap_or_else(|| json!({}));
                let outcome = self.tools.call(name, &arguments.to_string()).await;
                reply(
                    &id,
                    json!({"content": [{"type": "text", "text": outcome.text}], "isError": outcome.is_error}),
                )
            }
            other => failure(&id, -32601, &format!("method not found: {other}")),
        })
    }
}

//! `kanban mcp`: the worker's board tools as an MCP server over stdio
//! (JSON-RPC 2.0, one message per line), for agent CLIs that take MCP servers.

use std::io::{BufRead, Write};
use std::sync::Arc;

use anyhow::Context;
use kanban_agent_port::{BoardTools, board_tool_specs};
use kanban_board_sqlite::{SqliteBoard, SystemClock};
use kanban_core::{Claim, Environment};
use serde_json::{Value, json};

use crate::runtime::block_on;

const PROTOCOL_VERSION: &str = "2025-06-18";

fn reply(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

fn failure(id: &Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

/// Answers one JSON-RPC message; `None` for notifications.
fn handle(tools: &BoardTools, message: &Value) -> Option<Value> {
    let id = message.get("id")?.clone();
    let method = message["method"].as_str().unwrap_or("");
    Some(match method {
        "initialize" => reply(
            &id,
            json!({
                "protocolVersion": message.pointer("/params/protocolVersion").and_then(Value::as_str).unwrap_or(PROTOCOL_VERSION),
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
            let outcome = block_on(tools.call(name, &arguments.to_string()));
            reply(
                &id,
                json!({"content": [{"type": "text", "text": outcome.text}], "isError": outcome.is_error}),
            )
        }
        other => failure(&id, -32601, &format!("method not found: {other}")),
    })
}

pub(crate) fn mcp(env: &Environment) -> anyhow::Result<i32> {
    let claim =
        Claim::from_env(env).context("kanban mcp serves the board tools of a claimed card")?;
    let board = SqliteBoard::open(&claim.db, Arc::new(SystemClock))?;
    let author = env
        .get_trimmed("KANBAN_AUTHOR")
        .unwrap_or("worker")
        .to_owned();
    let tools = BoardTools::new(Arc::new(board), claim, author);
    let stdin = std::io::stdin();
    let mut stdout = std::io::stdout().lock();
    for line in stdin.lock().lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let answer = match serde_json::from_str::<Value>(&line) {
            Ok(message) => handle(&tools, &message),
            Err(error) => Some(failure(
                &Value::Null,
                -32700,
                &format!("parse error: {error}"),
            )),
        };
        if let Some(answer) = answer {
            writeln!(stdout, "{answer}")?;
            stdout.flush()?;
        }
    }
    Ok(0)
}

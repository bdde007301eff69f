//! `kanban mcp`: the worker's board tools as an MCP server over stdio.

use std::io::{BufRead, Write};
use std::sync::Arc;

use anyhow::Context;
use kanban_agent_port::{BoardTools, MCP_MAX_LINE_BYTES, McpServer, unreadable_line_answer};
use kanban_board_sqlite::SystemClock;
use kanban_core::ExitCode;
use kanban_core::{Claim, Environment};

use crate::runtime::block_on;

pub(crate) fn mcp(env: &Environment) -> anyhow::Result<ExitCode> {
    let claim =
        Claim::from_env(env).context("kanban mcp serves the board tools of a claimed card")?;
    let board = crate::runtime::block_on(crate::board_path::open_claim_board(
        &claim,
        Arc::new(SystemClock),
        env,
    ))?
    .into_tool_board();
    let author = env
        .get_trimmed("KANBAN_AUTHOR")
        .unwrap_or("worker")
        .to_owned();
    let root = crate::attach::claim_attachments_root(&claim, env);
    let server = McpServer::new(BoardTools::new(board, claim, author).with_attachments(root));
    let mut stdout = std::io::stdout().lock();
    let mut stdin = std::io::stdin().lock();
    loop {
        let answer = match read_line(&mut stdin)? {
            Line::End => return Ok(ExitCode::Success),
            Line::TooLong => Some(unreadable_line_answer(true)),
            Line::Text(bytes) => match String::from_utf8(bytes) {
                Ok(line) => block_on(server.handle_line(&line)),
                Err(_) => Some(unreadable_line_answer(false)),
            },
        };
        if let Some(answer) = answer {
            writeln!(stdout, "{answer}")?;
            stdout.flush()?;
        }
    }
}

enum Line {
    Text(Vec<u8>),
    TooLong,
    End,
}

/// Reads one line of at most [`MCP_MAX_LINE_BYTES`]; the rest of a longer
/// one is read and dropped, never held.
fn read_line(input: &mut impl BufRead) -> std::io::Result<Line> {
    let mut line = Vec::new();
    let mut too_long = false;
    loop {
        let chunk = input.fill_buf()?;
        if chunk.is_empty() {
            return Ok(match (too_long, line.is_empty()) {
                (true, _) => Line::TooLong,
                (false, true) => Line::End,
                (false, false) => Line::Text(line),
            });
        }
        let (taken, ended) = match chunk.iter().position(|byte| *byte == b'\n') {
            Some(at) => (at + 1, true),
            None => (chunk.len(), false),
        };
        let content = &chunk[..if ended { taken - 1 } else { taken }];
        if !too_long && line.len() + content.len() <= MCP_MAX_LINE_BYTES {
            line.extend_from_slice(content);
        } else {
            too_long = true;
            line = Vec::new();
        }
        input.consume(taken);
        if ended {
            return Ok(if too_long {
                Line::TooLong
            } else {
                Line::Text(line)
            });
        }
    }
}

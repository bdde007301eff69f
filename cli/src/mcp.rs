//! `kanban mcp`: the worker's board tools as an MCP server over stdio.

use std::io::{BufRead, Write};
use std::sync::Arc;

use anyhow::Context;
use kanban_agent_port::{BoardTools, McpServer};
use kanban_board_sqlite::{SqliteBoard, SystemClock};
use kanban_core::{Claim, Environment};

use crate::runtime::block_on;

pub(crate) fn mcp(env: &Environment) -> anyhow::Result<i32> {
    let claim =
        Claim::from_env(env).context("kanban mcp serves the board tools of a claimed card")?;
    let board = SqliteBoard::open(&claim.db, Arc::new(SystemClock))?;
    let author = env
        .get_trimmed("KANBAN_AUTHOR")
        .unwrap_or("worker")
        .to_owned();
    let server = McpServer::new(BoardTools::new(Arc::new(board), claim, author));
    let mut stdout = std::io::stdout().lock();
    for line in std::io::stdin().lock().lines() {
        if let Some(answer) = block_on(server.handle_line(&line?)) {
            writeln!(stdout, "{answer}")?;
            stdout.flush()?;
        }
    }
    Ok(0)
}

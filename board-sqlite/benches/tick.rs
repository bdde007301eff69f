//! One dispatch tick's board work on boards of 1k, 100k and 1M cards (ready,
//! running and done mixed), to show the tick stays index-driven: its cost
//! must not grow with the number of cards.
//!
//! `cargo bench -p kanban-board-sqlite --bench tick` (KANBAN_BENCH_SIZES=1000,100000
//! picks other sizes).

#![allow(
    clippy::too_many_lines,
    reason = "the length rule is for src/: a test or a benchmark reads best whole"
)]
#![allow(
    clippy::disallowed_methods,
    clippy::disallowed_types,
    reason = "tests and benchmarks read their knobs from the environment and drive real processes and files"
)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use kanban_board_sqlite::{SqliteBoard, SystemClock};
use kanban_core::{Clock, DispatchBoard};

fn block_on<F: std::future::Future>(future: F) -> F::Output {
    pollster::block_on(future)
}

/// Fills a board with `cards` cards: 8 running, the rest split between ready and done.
fn fill(path: &std::path::Path, cards: u64) {
    drop(SqliteBoard::create(path, Arc::new(SystemClock)).unwrap());
    kanban_testkit::bulk_add_cards(
        path,
        cards,
        kanban_testkit::BulkLanes::HalfDone,
        SystemClock.now(),
    );
    let board = SqliteBoard::open(path, Arc::new(SystemClock)).unwrap();
    for _ in 0..8 {
        block_on(board.claim_next_ready(900, "bench:runner", &kanban_core::ClaimFilter::any()))
            .unwrap()
            .unwrap();
    }
}

/// The board work of one idle-ish tick of the dispatcher in core: read the
/// running workers (every decision about them is core's, in memory), look
/// for cards to promote, claim one.
fn tick(board: &SqliteBoard) {
    block_on(board.running_workers()).unwrap();
    block_on(board.promote_ready()).unwrap();
    block_on(board.claim_next_ready(900, "bench:tick", &kanban_core::ClaimFilter::any())).unwrap();
}

fn main() {
    let sizes: Vec<u64> = std::env::var("KANBAN_BENCH_SIZES")
        .ok()
        .map(|raw| {
            raw.split(',')
                .filter_map(|s| s.trim().parse().ok())
                .collect()
        })
        .unwrap_or_else(|| vec![1_000, 100_000, 1_000_000]);
    let mut results = Vec::new();
    for cards in sizes {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kanban.db");
        let filled = Instant::now();
        fill(&path, cards);
        let board = SqliteBoard::open(&path, Arc::new(SystemClock)).unwrap();
        let fill_time = filled.elapsed();
        // Best of 5 batches of 20 ticks: disk noise hits every size alike.
        let per_tick = (0..5)
            .map(|_| {
                let start = Instant::now();
                for _ in 0..20 {
                    tick(&board);
                }
                start.elapsed() / 20
            })
            .min()
            .unwrap();
        println!(
            "{cards:>9} cards: {:>8.1} µs per tick (board filled in {:.1} s)",
            per_tick.as_secs_f64() * 1e6,
            fill_time.as_secs_f64()
        );
        results.push((cards, per_tick));
    }
    if let (Some((small, floor)), Some((large, top))) = (results.first(), results.last()) {
        let ratio = top.as_secs_f64() / floor.max(&Duration::from_nanos(1)).as_secs_f64();
        println!("tick at {large} cards / tick at {small} cards: {ratio:.2}x (target <= 3.00x)");
    }
}

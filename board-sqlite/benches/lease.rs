//! The lease proof and the claim against bare rusqlite doing the same I/O,
//! measured in the same run on the same kind of file. Prints ratios.
//!
//! `cargo bench -p kanban-board-sqlite` (set KANBAN_BENCH_SCALE to scale the
//! iteration counts).

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

use kanban_board_sqlite::{LeaseProver, SqliteBoard, SystemClock, prove_lease};
use kanban_core::{BoardAdmin, DispatchBoard, NewTask, ProofIdentity, ProofRequest};
use rusqlite::{Connection, OpenFlags, TransactionBehavior, params};

fn scale() -> usize {
    std::env::var("KANBAN_BENCH_SCALE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

/// The best of `rounds` timings of `iterations` runs of `body`, per call.
fn measure(rounds: usize, iterations: usize, mut body: impl FnMut(usize)) -> Duration {
    (0..rounds)
        .map(|round| {
            let start = Instant::now();
            for i in 0..iterations {
                body(round * iterations + i);
            }
            start.elapsed() / iterations as u32
        })
        .min()
        .unwrap()
}

fn block_on<F: std::future::Future>(future: F) -> F::Output {
    pollster::block_on(future)
}

/// Adds `count` ready cards titled `title N`; returns their ids.
fn add_cards(board: &SqliteBoard, title: &str, count: usize) -> Vec<String> {
    (0..count)
        .map(|n| {
            block_on(board.create_task(&NewTask {
                title: format!("{title} {n}"),
                ..NewTask::default()
            }))
            .unwrap()
        })
        .collect()
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kanban.db");
    let board = SqliteBoard::create(&path, Arc::new(SystemClock)).unwrap();
    add_cards(&board, "filler", 200);
    let id = block_on(board.create_task(&NewTask {
        title: "proved".into(),
        ..NewTask::default()
    }))
    .unwrap();
    let claim = block_on(board.claim_task(&id, 3600, "bench:1"))
        .unwrap()
        .unwrap()
        .claim;
    let request = ProofRequest::for_claim(&claim);
    let now = kanban_core::Clock::now(&SystemClock);
    assert!(prove_lease(&request, ProofIdentity::AnyProcess, now).is_ok());

    let bare = || {
        let conn = Connection::open_with_flags(
            &path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .unwrap();
        let run: i64 = conn
            .query_row(
                "SELECT current_run_id FROM tasks WHERE id = ?1",
                params![claim.task_id],
                |row| row.get(0),
            )
            .unwrap();
        let _: Option<i64> = conn
            .query_row(
                "SELECT ended_at FROM task_runs WHERE id = ?1",
                params![run],
                |row| row.get(0),
            )
            .unwrap();
    };
    let (mut proof, mut bare_proof) = (Duration::MAX, Duration::MAX);
    for _ in 0..40 * scale() {
        proof = proof.min(measure(1, 50, |_| {
            prove_lease(&request, ProofIdentity::AnyProcess, now).unwrap()
        }));
        bare_proof = bare_proof.min(measure(1, 50, |_| bare()));
    }

    // The kept proof: one read-only connection, a stat and a read
    // transaction per proof, against two point selects on an open
    // connection.
    let prover = LeaseProver::new(claim.db.clone());
    assert!(
        prover
            .prove(&request, ProofIdentity::AnyProcess, now)
            .is_ok()
    );
    let open = Connection::open_with_flags(
        &path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .unwrap();
    let two_selects = || {
        let run: i64 = open
            .prepare_cached("SELECT current_run_id FROM tasks WHERE id = ?1")
            .unwrap()
            .query_row(params![claim.task_id], |row| row.get(0))
            .unwrap();
        let _: Option<i64> = open
            .prepare_cached("SELECT ended_at FROM task_runs WHERE id = ?1")
            .unwrap()
            .query_row(params![run], |row| row.get(0))
            .unwrap();
    };
    let (mut kept, mut selects) = (Duration::MAX, Duration::MAX);
    for _ in 0..40 * scale() {
        kept = kept.min(measure(1, 500, |_| {
            prover
                .prove(&request, ProofIdentity::AnyProcess, now)
                .unwrap()
        }));
        selects = selects.min(measure(1, 500, |_| two_selects()));
    }
    let seed = seed_proof_micros(&path, &claim);

    // Claims: each claims a fresh ready card. The floor is one bare
    // BEGIN IMMEDIATE transaction with one UPDATE under the same pragmas.
    let claims = 300 * scale();
    let ids = add_cards(&board, "claimable", claims * 3);
    // A second floor: bare rusqlite making the writes the contract makes a
    // claim make, in one transaction (its run, the card, its `claimed`
    // event: three tables and their indexes), with its statements prepared
    // once as ours are, on cards of their own.
    let written = add_cards(&board, "written", claims * 3);
    let mut conn = Connection::open(&path).unwrap();
    conn.execute_batch("PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON; PRAGMA busy_timeout = 30000;").unwrap();
    // Interleave small batches of the three, so that disk noise hits all alike.
    let batch = 25;
    let (mut claim_time, mut bare_claim, mut bare_writes) =
        (Duration::MAX, Duration::MAX, Duration::MAX);
    for start in (0..claims * 3).step_by(batch) {
        let end = (start + batch).min(ids.len());
        let (cards, written) = (&ids[start..end], &written[start..end]);
        claim_time = claim_time.min(measure(1, cards.len(), |i| {
            assert!(
                block_on(board.claim_task(&cards[i], 900, "bench:2"))
                    .unwrap()
                    .is_some()
            );
        }));
        bare_claim = bare_claim.min(measure(1, cards.len(), |i| {
            let id = &cards[i];
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .unwrap();
            tx.execute(
                "UPDATE tasks SET priority = priority + 1 WHERE id = ?1",
                params![id],
            )
            .unwrap();
            tx.commit().unwrap();
        }));
        bare_writes = bare_writes.min(measure(1, written.len(), |i| {
            let id = &written[i];
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .unwrap();
            tx.prepare_cached(
                "INSERT INTO task_runs (task_id, status, claim_lock, claim_expires, started_at, lease_ttl)
                 VALUES (?1, 'running', 'bench:3', 1900000900, 1900000000, 900)",
            )
            .unwrap()
            .execute(params![id])
            .unwrap();
            let run = tx.last_insert_rowid();
            tx.prepare_cached(
                "UPDATE tasks SET status = 'running', claim_lock = 'bench:3', claim_expires = 1900000900,
                                  current_run_id = ?2, started_at = COALESCE(started_at, 1900000000)
                  WHERE id = ?1 AND status = 'ready' AND claim_lock IS NULL",
            )
            .unwrap()
            .execute(params![id, run])
            .unwrap();
            tx.prepare_cached(
                "INSERT INTO task_events (task_id, run_id, kind, payload, created_at)
                 VALUES (?1, ?2, 'claimed', ?3, 1900000000)",
            )
            .unwrap()
            .execute(params![
                id,
                run,
                format!(r#"{{"expires":1900000900,"lock":"bench:3","run_id":{run},"ttl":900}}"#)
            ])
            .unwrap();
            tx.commit().unwrap();
        }));
    }

    // Batched claims: eight cards per transaction (a dispatcher with room
    // for eight), per card, against the same bare per-claim floor.
    const BATCH: usize = 8;
    let batched_cards = 40 * BATCH * scale();
    add_cards(&board, "batched", batched_cards);
    let mut batched = Duration::MAX;
    for _ in 0..batched_cards / (BATCH * 5) {
        let began = Instant::now();
        for _ in 0..5 {
            let locks: Vec<String> = (0..BATCH).map(|n| format!("bench:b{n}")).collect();
            let grants =
                block_on(board.claim_ready_batch(900, &locks, &kanban_core::ClaimFilter::any()))
                    .unwrap();
            assert_eq!(grants.len(), BATCH);
        }
        batched = batched.min(began.elapsed() / (5 * BATCH) as u32);
    }

    let proof_ratio = proof.as_secs_f64() / bare_proof.as_secs_f64();
    let claim_rate_ratio = bare_claim.as_secs_f64() / claim_time.as_secs_f64();
    println!(
        "lease proof : {:>9.1} µs/proof   bare read-only open + 2 selects: {:>9.1} µs   ratio {proof_ratio:.2}x (target <= 1.20x)",
        micros(proof),
        micros(bare_proof)
    );
    println!(
        "kept proof  : {:>9.1} µs/proof   2 point selects, open connection: {:>9.1} µs   ratio {:.2}x (target <= 1.50x)",
        micros(kept),
        micros(selects),
        kept.as_secs_f64() / selects.as_secs_f64()
    );
    match seed {
        Some(seed) => println!(
            "seed proof  : {seed:>9.1} µs/proof (CPython, the seed's worker_claim_is_live)   kept proof {:.1}x faster (target >= 10x)",
            seed / micros(kept)
        ),
        None => println!("seed proof  : not measured (python3 did not run)"),
    }
    println!(
        "claim       : {:>9.1} µs/claim   bare BEGIN IMMEDIATE + 1 UPDATE: {:>9.1} µs   rate ratio {claim_rate_ratio:.2}x (target >= 0.80x)",
        micros(claim_time),
        micros(bare_claim)
    );
    println!(
        "claim       : {:>9.1} µs/claim   bare BEGIN IMMEDIATE + the claim's own writes (its run, the card, its event): {:>9.1} µs   rate ratio {:.2}x   (those writes alone: {:.2}x the one-UPDATE floor's rate)",
        micros(claim_time),
        micros(bare_writes),
        bare_writes.as_secs_f64() / claim_time.as_secs_f64(),
        bare_claim.as_secs_f64() / bare_writes.as_secs_f64()
    );
    println!(
        "batch claim : {:>9.1} µs/card (8 per transaction)   bare per-claim floor: {:>9.1} µs   rate ratio {:.2}x",
        micros(batched),
        micros(bare_claim),
        bare_claim.as_secs_f64() / batched.as_secs_f64()
    );
}

/// The seed's own proof, transcribed to `seed_proof.py`, timed by CPython on
/// the same board file: the best round's microseconds per proof.
fn seed_proof_micros(path: &std::path::Path, claim: &kanban_core::Claim) -> Option<f64> {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/seed_proof.py");
    let output = std::process::Command::new("python3")
        .arg(script)
        .arg(path)
        .args([
            claim.task_id.as_str(),
            &claim.run_id.to_string(),
            claim.claim_lock.as_str(),
            &(500 * scale()).to_string(),
            "7",
        ])
        .output()
        .ok()?;
    if !output.status.success() {
        eprintln!("{}", String::from_utf8_lossy(&output.stderr));
        return None;
    }
    String::from_utf8_lossy(&output.stdout).trim().parse().ok()
}

fn micros(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e6
}

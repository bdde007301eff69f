//! Claims per second with 1, 4 and 16 concurrent claimers, and the lease
//! proof's latency, on a real server (the test cluster), each against a
//! floor: the bare driver sending the same statements on its own client,
//! in the same run. Prints ratios.
//!
//! `cargo bench -p kanban-board-postgres` (KANBAN_BENCH_SCALE scales the
//! card counts).

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

use kanban_board_postgres::PgBoard;
use kanban_core::{
    BoardAdmin, ClaimFilter, Clock, DispatchBoard, NewTask, ProofIdentity, ProofRequest,
};
use kanban_testkit::PgCluster;
use tokio_postgres::{Client, NoTls, Statement};

#[derive(Debug, Clone, Copy)]
struct WallClock;

impl Clock for WallClock {
    fn now(&self) -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_secs() as i64)
    }
}

fn scale() -> usize {
    std::env::var("KANBAN_BENCH_SCALE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn board(url: &str) -> PgBoard {
    let config = kanban_board_postgres::parse_url(url).unwrap();
    pollster::block_on(PgBoard::connect(config, Arc::new(WallClock))).unwrap()
}

/// A fresh board of `cards` ready cards; returns its URL.
fn board_of(cluster: &PgCluster, cards: usize) -> String {
    let url = cluster.fresh_database();
    let board = board(&url);
    let first = pollster::block_on(board.create_task(&NewTask {
        title: "first".into(),
        ..NewTask::default()
    }))
    .unwrap();
    drop(first);
    cluster.admin_on(
        &url,
        &format!(
            "INSERT INTO tasks (id, title, status, created_at)
             SELECT 't_' || lpad(to_hex(n), 8, '0'), 'card ' || n, 'ready', 1
               FROM generate_series(1, {}) AS n",
            cards - 1
        ),
    );
    url
}

/// The claim's statements, as the board sends them, on a bare client.
struct Bare {
    client: Client,
    candidates: Statement,
    lock: Statement,
    open_run: Statement,
    take: Statement,
    rerun: Statement,
    event: Statement,
}

const CANDIDATES: &str = "SELECT t.id FROM tasks t
  WHERE t.status = 'ready' AND t.claim_lock IS NULL AND t.held_reason IS NULL
    AND (t.not_before IS NULL OR t.not_before <= $1)
    AND ($2::text[] IS NULL OR COALESCE(t.assignee, '') = ANY($2::text[]))
  ORDER BY t.priority DESC, t.created_at ASC, t.seq ASC
  LIMIT $3 FOR UPDATE OF t SKIP LOCKED";
const LOCK: &str = "SELECT status FROM tasks WHERE id = $1 FOR UPDATE SKIP LOCKED";
const OPEN_RUN: &str = "INSERT INTO task_runs (task_id, profile, status, claim_lock, claim_expires, started_at, lease_ttl)
 SELECT t.id, t.assignee, 'running', $2, $3, $4, $5 FROM tasks t
  WHERE t.id = $1 AND t.status = 'ready' AND t.claim_lock IS NULL
    AND t.held_reason IS NULL AND NOT EXISTS (SELECT 1 FROM task_links l JOIN tasks p ON p.id = l.parent_id WHERE l.child_id = t.id AND p.status NOT IN ('done', 'archived'))
 RETURNING id";
const TAKE: &str =
    "UPDATE tasks SET status = 'running', claim_lock = $2, claim_expires = $3, current_run_id = $5,
  started_at = COALESCE(started_at, $4), last_heartbeat_at = NULL
  WHERE id = $1 AND status = 'ready' AND claim_lock IS NULL RETURNING goal_mode, assignee";
const RERUN: &str = "SELECT EXISTS (SELECT 1 FROM task_runs WHERE task_id = $1 AND id < $2)";
const EVENT: &str = "INSERT INTO task_events (task_id, run_id, kind, payload, created_at) VALUES ($1, $2, $3, $4, $5)";

impl Bare {
    async fn connect(url: &str) -> Self {
        let (client, connection) = tokio_postgres::connect(url, NoTls).await.unwrap();
        tokio::spawn(connection);
        Self {
            candidates: client.prepare(CANDIDATES).await.unwrap(),
            lock: client.prepare(LOCK).await.unwrap(),
            open_run: client.prepare(OPEN_RUN).await.unwrap(),
            take: client.prepare(TAKE).await.unwrap(),
            rerun: client.prepare(RERUN).await.unwrap(),
            event: client.prepare(EVENT).await.unwrap(),
            client,
        }
    }

    /// One claim; false when nothing was left.
    async fn claim(&self, lock: &str) -> bool {
        let now = WallClock.now();
        let (expires, ttl) = (now + 600, 600_i64);
        // The board's settings for a claim, which walks the lane's index
        // in its order whatever the statistics say.
        self.client
            .batch_execute("BEGIN; SET LOCAL enable_sort = off; SET LOCAL enable_seqscan = off")
            .await
            .unwrap();
        let none: Option<Vec<String>> = None;
        let rows = self
            .client
            .query(&self.candidates, &[&now, &none, &9_i64])
            .await
            .unwrap();
        let Some(row) = rows.first() else {
            self.client.batch_execute("COMMIT").await.unwrap();
            return false;
        };
        let id: String = row.get(0);
        self.client.query_opt(&self.lock, &[&id]).await.unwrap();
        let run: i64 = self
            .client
            .query_one(&self.open_run, &[&id, &lock, &expires, &now, &ttl])
            .await
            .unwrap()
            .get(0);
        self.client
            .query_one(&self.take, &[&id, &lock, &expires, &now, &run])
            .await
            .unwrap();
        self.client
            .query_one(&self.rerun, &[&id, &run])
            .await
            .unwrap();
        let payload = serde_json::json!({"run_id": run, "claim_lock": lock, "claim_expires": expires, "ttl": ttl});
        self.client
            .execute(
                &self.event,
                &[&id, &Some(run), &"claimed", &Some(&payload), &now],
            )
            .await
            .unwrap();
        self.client.batch_execute("COMMIT").await.unwrap();
        true
    }
}

/// Claims every card with `claimers` threads; returns claims per second.
fn rate(claimers: usize, cards: usize, claim_all: impl Fn(usize) -> usize + Sync) -> f64 {
    let started = Instant::now();
    let claimed: usize = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..claimers)
            .map(|claimer| {
                let claim_all = &claim_all;
                scope.spawn(move || claim_all(claimer))
            })
            .collect();
        handles
            .into_iter()
            .map(|handle| handle.join().unwrap())
            .sum()
    });
    assert_eq!(claimed, cards, "every card claimed once");
    cards as f64 / started.elapsed().as_secs_f64()
}

fn main() {
    let cluster = PgCluster::shared();
    let cards = 1500 * scale();
    println!(
        "claims on PostgreSQL ({cards} cards a round; the floor is the bare driver sending the board's statements)"
    );
    for claimers in [1, 4, 16] {
        let url = board_of(cluster, cards);
        let ours = rate(claimers, cards, |claimer| {
            let board = board(&url);
            let mut claimed = 0;
            loop {
                let lock = format!("bench:{claimer}:{claimed}");
                match pollster::block_on(board.claim_next_ready(600, &lock, &ClaimFilter::any()))
                    .unwrap()
                {
                    Some(_) => claimed += 1,
                    None => return claimed,
                }
            }
        });
        let url = board_of(cluster, cards);
        let floor = rate(claimers, cards, |claimer| {
            let runtime = runtime();
            runtime.block_on(async {
                let bare = Bare::connect(&url).await;
                let mut claimed = 0;
                while bare.claim(&format!("bare:{claimer}:{claimed}")).await {
                    claimed += 1;
                }
                claimed
            })
        });
        println!(
            "{claimers:>2} claimers: {ours:>8.0} claims/s   bare driver: {floor:>8.0} claims/s   rate ratio {:.2}x",
            ours / floor
        );
    }
    // The lease proof: one read-only snapshot transaction, two selects.
    let url = board_of(cluster, 200);
    let board = board(&url);
    let grant =
        pollster::block_on(board.claim_next_ready(3600, "bench:proof", &ClaimFilter::any()))
            .unwrap()
            .unwrap();
    let request = ProofRequest::for_claim(&grant.claim);
    let proofs = 3000 * scale();
    let best = |mut body: Box<dyn FnMut()>| {
        (0..5)
            .map(|_| {
                let started = Instant::now();
                for _ in 0..proofs / 5 {
                    body();
                }
                started.elapsed() / (proofs / 5) as u32
            })
            .min()
            .unwrap_or(Duration::MAX)
    };
    let ours = best(Box::new(|| {
        pollster::block_on(board.prove(&request, ProofIdentity::AnyProcess)).unwrap();
    }));
    let runtime = runtime();
    let (client, task) = runtime.block_on(async {
        let (client, connection) = tokio_postgres::connect(&url, NoTls).await.unwrap();
        tokio::spawn(connection);
        (client, grant.claim.task_id.clone())
    });
    let select = runtime.block_on(async {
        client
            .prepare(
                "SELECT t.status, t.worker_pid, t.current_run_id, t.claim_lock, t.claim_expires,
                        r.id, r.ended_at, r.worker_pid, r.claim_expires, NULL::jsonb
                   FROM tasks t LEFT JOIN task_runs r ON r.id = t.current_run_id WHERE t.id = $1",
            )
            .await
            .unwrap()
    });
    let floor = best(Box::new(|| {
        runtime.block_on(async {
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&task];
            // The same three messages, pipelined as the board sends them.
            tokio::try_join!(
                client.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"),
                client.query_opt(&select, &params),
                client.batch_execute("COMMIT"),
            )
            .unwrap();
        });
    }));
    println!(
        "lease proof: {:>7.1} µs   bare driver, the same snapshot and select: {:>7.1} µs   ratio {:.2}x",
        ours.as_secs_f64() * 1e6,
        floor.as_secs_f64() * 1e6,
        ours.as_secs_f64() / floor.as_secs_f64()
    );
}

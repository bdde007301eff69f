//! What each of the shared board's steps asks of its engine, heard by an
//! engine that wraps SQLite's: the durability of every write, and the text
//! of every statement.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use kanban_board::{Dialect, Durability, Engine, Param, Row, Sql, StoredBoard, Turns, TxFuture};
use kanban_board_sqlite::{Sqlite, SqliteBoard};
use kanban_core::{
    BoardError, ClaimFilter, ExitCode, ExitWitness, NewTask, NotLive, ProofIdentity, ProofRequest,
    SignalReason, TickDurations, WorkerProcess,
};
use kanban_testkit::board_contract::{exit_report, worker_result};
use kanban_testkit::{VirtualClock, block_on};

/// What the engine heard.
#[derive(Default)]
struct Heard {
    writes: Vec<Durability>,
    statements: Vec<String>,
}

/// SQLite's engine, heard.
struct Listening {
    inner: Sqlite,
    heard: Arc<Mutex<Heard>>,
}

/// One transaction's statements, heard on their way.
struct ListeningSql<'t> {
    inner: &'t mut dyn Sql,
    heard: Arc<Mutex<Heard>>,
}

impl ListeningSql<'_> {
    fn hear(&self, query: &str) {
        self.heard.lock().unwrap().statements.push(query.to_owned());
    }
}

#[async_trait]
impl Sql for ListeningSql<'_> {
    async fn for_each_row(
        &mut self,
        query: &str,
        params: &[Param<'_>],
        each: &mut (dyn FnMut(Row) -> kanban_board::TxResult<()> + Send),
    ) -> kanban_board::TxResult<()> {
        self.hear(query);
        self.inner.for_each_row(query, params, each).await
    }
    async fn execute(&mut self, query: &str, params: &[Param<'_>]) -> kanban_board::TxResult<u64> {
        self.hear(query);
        self.inner.execute(query, params).await
    }
    async fn insert_id(
        &mut self,
        query: &str,
        params: &[Param<'_>],
    ) -> kanban_board::TxResult<i64> {
        self.hear(query);
        self.inner.insert_id(query, params).await
    }
    fn dialect(&self) -> &'static Dialect {
        self.inner.dialect()
    }
    fn writing(&self) -> bool {
        self.inner.writing()
    }
    fn require_sync(&mut self) -> kanban_board::TxResult<()> {
        self.inner.require_sync()
    }
    async fn notify(&mut self) -> kanban_board::TxResult<()> {
        self.inner.notify().await
    }
    async fn take_turns(&mut self, on: Turns, name: &str) -> kanban_board::TxResult<()> {
        self.inner.take_turns(on, name).await
    }
    fn walk_indexes(&mut self) {
        self.inner.walk_indexes();
    }
}

#[async_trait]
impl Engine for Listening {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn write<T, F>(&self, durability: Durability, body: F) -> Result<T, BoardError>
    where
        T: Send + 'static,
        F: for<'t> FnMut(&'t mut dyn Sql, i64) -> TxFuture<'t, T> + Send + 'static,
    {
        self.heard.lock().unwrap().writes.push(durability);
        let (body, heard) = (Arc::new(Mutex::new(body)), self.heard.clone());
        let listened = writing(move |sql, now| {
            let (body, heard) = (body.clone(), heard.clone());
            Box::pin(async move {
                let mut sql = ListeningSql { inner: sql, heard };
                let step = (body.lock().unwrap())(&mut sql, now);
                step.await
            })
        });
        self.inner.write(durability, listened).await
    }

    async fn read<T, F>(&self, body: F) -> Result<T, BoardError>
    where
        T: Send + 'static,
        F: for<'t> FnOnce(&'t mut dyn Sql) -> TxFuture<'t, T> + Send + 'static,
    {
        let heard = self.heard.clone();
        let listened = reading(move |sql| {
            Box::pin(async move {
                let mut sql = ListeningSql { inner: sql, heard };
                body(&mut sql).await
            })
        });
        self.inner.read(listened).await
    }

    fn now(&self) -> i64 {
        self.inner.now()
    }

    async fn prove(&self, request: &ProofRequest, identity: ProofIdentity) -> Result<(), NotLive> {
        self.inner.prove(request, identity).await
    }

    async fn check_health(&self) -> Result<(), BoardError> {
        self.inner.check_health().await
    }
}

/// A write's body, its lifetimes spelled out for the compiler.
fn writing<T, F>(body: F) -> F
where
    F: for<'t> FnMut(&'t mut dyn Sql, i64) -> TxFuture<'t, T>,
{
    body
}

/// A read's body, its lifetimes spelled out for the compiler.
fn reading<T, F>(body: F) -> F
where
    F: for<'t> FnOnce(&'t mut dyn Sql) -> TxFuture<'t, T>,
{
    body
}

fn listening_board() -> (StoredBoard<Listening>, Arc<Mutex<Heard>>) {
    let clock = Arc::new(VirtualClock::at(1_700_000_000));
    let sqlite = SqliteBoard::open_in_memory(clock).unwrap();
    let heard = Arc::new(Mutex::new(Heard::default()));
    let inner = sqlite.into_stored().into_engine();
    let board = StoredBoard::new(Listening {
        inner,
        heard: heard.clone(),
    });
    (board, heard)
}

/// The durabilities of the writes `step` made, and the statements it ran.
fn heard<T>(heard: &Mutex<Heard>, step: impl FnOnce() -> T) -> (Vec<Durability>, Vec<String>) {
    *heard.lock().unwrap() = Heard::default();
    step();
    let heard = std::mem::take(&mut *heard.lock().unwrap());
    (heard.writes, heard.statements)
}

/// A step's name, the durabilities of its writes, and the step.
type Step<'a> = (&'static str, Vec<Durability>, &'a dyn Fn());

#[test]
fn only_writes_whose_loss_equals_an_earlier_crash_skip_the_sync() {
    let (board, listened) = listening_board();
    for n in 0..2 {
        let title = format!("card {n}");
        block_on(board.create_task(&NewTask {
            title,
            ..NewTask::default()
        }))
        .unwrap();
    }
    let writes = |step: &dyn Fn()| heard(&listened, step).0;
    let claim = |lock: &str| {
        block_on(board.claim_ready_batch(600, &[lock.to_owned()], &ClaimFilter::any()))
            .unwrap()
            .remove(0)
            .claim
    };
    let first = claim("host:1:a");
    let process = WorkerProcess {
        pid: 7,
        started_at: Some(1),
        seal_digest: None,
    };
    let report = kanban_core::DispatcherReport {
        host: "host".to_owned(),
        ticks: TickDurations::default(),
        in_flight: 0,
        state: kanban_core::DispatcherState::Claiming,
    };
    let expected: [Step<'_>; 9] = [
        ("claim", vec![Durability::Synced], &|| {
            claim("host:1:b");
        }),
        ("record_spawn", vec![Durability::LocalRecord], &|| {
            block_on(board.record_spawn(&first, &process)).unwrap();
        }),
        ("bind_worker", vec![Durability::LocalRecord], &|| {
            block_on(board.bind_worker(&first, 7)).unwrap();
        }),
        ("heartbeat", vec![Durability::LocalRecord], &|| {
            block_on(board.heartbeat(&first, None)).unwrap();
        }),
        ("extend_lease", vec![Durability::LocalRecord], &|| {
            block_on(board.extend_lease(&first, 1_700_001_000, None)).unwrap();
        }),
        ("record_signal", vec![Durability::LocalRecord], &|| {
            block_on(board.record_signal(&first, 15, SignalReason::Shutdown)).unwrap();
        }),
        ("report_dispatcher", vec![Durability::Record], &|| {
            block_on(board.report_dispatcher(&report)).unwrap();
        }),
        ("complete", vec![Durability::Synced], &|| {
            block_on(board.complete(&first, "done", None)).unwrap();
        }),
        ("book_result", vec![Durability::LocalRecord], &|| {
            block_on(board.book_result(&first, &worker_result(&first, ExitCode::Success))).unwrap();
        }),
    ];
    for (step, durability, run) in expected {
        assert_eq!(writes(run), durability, "{step}");
    }
    let booked = writes(&|| {
        block_on(board.book_exit(&first, &exit_report(ExitWitness::Code(0)))).unwrap();
    });
    assert_eq!(booked, [Durability::SyncedUnlessRecord], "book_exit");
}

/// SQLite runs a `RETURNING` clause as a trigger, and a statement with a
/// trigger inside a transaction keeps a statement journal, allocated and
/// freed at every call: a seventh of a single claim's time when the claim's
/// compare-and-set returned its columns. A card's calls read what they
/// need with a plain `SELECT` instead.
#[test]
fn a_dispatched_card_s_statements_keep_no_statement_journal() {
    let (board, listened) = listening_board();
    block_on(board.create_task(&NewTask {
        title: "card".to_owned(),
        ..NewTask::default()
    }))
    .unwrap();
    let (_, statements) = heard(&listened, || {
        block_on(board.promote_ready()).unwrap();
        let claim =
            block_on(board.claim_ready_batch(600, &["h:1:a".to_owned()], &ClaimFilter::any()))
                .unwrap()
                .remove(0)
                .claim;
        let process = WorkerProcess {
            pid: 7,
            started_at: Some(1),
            seal_digest: None,
        };
        block_on(board.record_spawn(&claim, &process)).unwrap();
        block_on(board.bind_worker(&claim, 7)).unwrap();
        block_on(board.heartbeat(&claim, None)).unwrap();
        block_on(board.complete(&claim, "done", None)).unwrap();
        block_on(board.book_result(&claim, &worker_result(&claim, ExitCode::Success))).unwrap();
        block_on(board.book_exit(&claim, &exit_report(ExitWitness::Code(0)))).unwrap();
    });
    assert!(
        statements.len() > 10,
        "{} statements heard",
        statements.len()
    );
    let journaled: Vec<&String> = statements
        .iter()
        .filter(|sql| sql.to_ascii_uppercase().contains("RETURNING"))
        .collect();
    assert!(journaled.is_empty(), "{journaled:#?}");
}

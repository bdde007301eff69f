//! The PostgreSQL engine: the board's transactions on pooled connections,
//! retried whole when the server resolves a conflict by failing one side.

use std::sync::Arc;

use async_trait::async_trait;
use kanban_board::{
    Cell, Dialect, Durability, Engine, Param, Row, Sql, Turns, TxError, TxFuture, TxResult,
    lease_from_row, lease_query, storable_json, storable_list, storable_text,
};
use kanban_core::lease::{evaluate_lease, required_coordinates};
use kanban_core::{BoardError, Clock, NotLive, ProofIdentity, ProofRequest};
use serde_json::Value;
use tokio_postgres::types::{IsNull, ToSql, Type};

use crate::SCHEMA_VERSION;
use crate::conn::{CONFLICT_RETRIES, Conn, Pool, is_conflict, pg, storage_error};

/// PostgreSQL's words: writers run at once, so a write locks the rows it
/// reads to change, and a claim skips the rows another claimer holds (it
/// never waits); a card's place is its sequence number.
static POSTGRES: Dialect = Dialect {
    place: "seq",
    lock_card: " FOR UPDATE OF t",
    skip_locked: " FOR UPDATE OF t SKIP LOCKED",
    lock_rows: " FOR UPDATE",
    any: |n| format!("= ANY(${n})"),
    done_scan: "tasks",
    json_text: |column, key| format!("({column}->>'{key}')"),
    json_number: |column, key| {
        format!(
            "CASE WHEN jsonb_typeof({column}->'{key}') = 'number' THEN ({column}->>'{key}')::numeric END"
        )
    },
};

/// A value bound to a PostgreSQL statement, checked against the type the
/// server gives its `$N`.
#[derive(Debug)]
struct Bind<'p>(Param<'p>);

impl ToSql for Bind<'_> {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut bytes::BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match self.0 {
            Param::Null => Ok(IsNull::Yes),
            Param::Int(value) => value.to_sql_checked(ty, out),
            Param::Bool(value) => value.to_sql_checked(ty, out),
            Param::Text(text) => storable_text(text).as_ref().to_sql_checked(ty, out),
            Param::Json(value) => storable_json(value).as_ref().to_sql_checked(ty, out),
            Param::List(list) => storable_list(list).as_ref().to_sql_checked(ty, out),
        }
    }

    fn accepts(_: &Type) -> bool {
        // Each value checks its own type in `to_sql`.
        true
    }

    tokio_postgres::types::to_sql_checked!();
}

/// A row as plain values, by the types of its columns.
fn row_of(row: &tokio_postgres::Row) -> TxResult<Row> {
    let cells = row
        .columns()
        .iter()
        .enumerate()
        .map(|(at, column)| {
            let cell = match *column.type_() {
                Type::INT8 => row.try_get::<_, Option<i64>>(at)?.map(Cell::Int),
                Type::INT4 => row
                    .try_get::<_, Option<i32>>(at)?
                    .map(|v| Cell::Int(v.into())),
                Type::INT2 => row
                    .try_get::<_, Option<i16>>(at)?
                    .map(|v| Cell::Int(v.into())),
                Type::BOOL => row.try_get::<_, Option<bool>>(at)?.map(Cell::Bool),
                Type::JSON | Type::JSONB => row.try_get::<_, Option<Value>>(at)?.map(Cell::Json),
                _ => row.try_get::<_, Option<String>>(at)?.map(Cell::Text),
            };
            Ok(cell.unwrap_or(Cell::Null))
        })
        .collect::<Result<_, tokio_postgres::Error>>()
        .map_err(pg)?;
    Ok(Row(cells))
}

/// One transaction's statements on a pooled connection.
pub(crate) struct PgSql<'c> {
    conn: &'c mut Conn,
    writing: bool,
    /// Its commit may return before the server flushed its log.
    unsynced: bool,
    /// Settings sent with the next statement, in its round trip.
    prelude: Option<&'static str>,
}

/// The planner's settings of a transaction that walks indexes in their
/// order ([`Sql::walk_indexes`]): a bulk of new cards leaves the statistics
/// saying the ready lane is nearly empty, and the planner then reads the
/// whole lane and sorts it at every claim (and scans every run for a
/// card's earlier runs) until the next analyze.
const WALK_INDEXES: &str = "SET LOCAL enable_sort = off; SET LOCAL enable_seqscan = off";

fn bound<'p>(params: &'p [Param<'p>]) -> Vec<Bind<'p>> {
    params.iter().map(|param| Bind(*param)).collect()
}

fn refs<'a>(bound: &'a [Bind<'a>]) -> Vec<&'a (dyn ToSql + Sync)> {
    bound
        .iter()
        .map(|bind| bind as &(dyn ToSql + Sync))
        .collect()
}

#[async_trait]
impl Sql for PgSql<'_> {
    async fn for_each_row(
        &mut self,
        query: &str,
        params: &[Param<'_>],
        each: &mut (dyn FnMut(Row) -> TxResult<()> + Send),
    ) -> TxResult<()> {
        let bound = bound(params);
        let found = match self.prelude.take() {
            Some(prelude) => self.conn.query_after(prelude, query, &refs(&bound)).await?,
            None => self.conn.query(query, &refs(&bound)).await?,
        };
        found.iter().try_for_each(|row| each(row_of(row)?))
    }

    async fn execute(&mut self, query: &str, params: &[Param<'_>]) -> TxResult<u64> {
        let bound = bound(params);
        self.conn.execute(query, &refs(&bound)).await
    }

    async fn insert_id(&mut self, query: &str, params: &[Param<'_>]) -> TxResult<i64> {
        let bound = bound(params);
        self.conn
            .value(&format!("{query} RETURNING id"), &refs(&bound))
            .await
    }

    fn dialect(&self) -> &'static Dialect {
        &POSTGRES
    }

    fn writing(&self) -> bool {
        self.writing
    }

    fn require_sync(&mut self) -> TxResult<()> {
        // The server reads `synchronous_commit` at the commit: this one
        // simply commits synced.
        self.unsynced = false;
        Ok(())
    }

    async fn notify(&mut self) -> TxResult<()> {
        crate::watch::notify(self.conn).await
    }

    fn walk_indexes(&mut self) {
        self.prelude = Some(WALK_INDEXES);
    }

    async fn take_turns(&mut self, on: Turns, name: &str) -> TxResult<()> {
        if !self.writing {
            return Ok(());
        }
        let space: i64 = match on {
            Turns::IdempotencyKey => 0,
            Turns::WallScope => 1,
            Turns::Links => 2,
        };
        self.conn
            .execute(
                "SELECT pg_advisory_xact_lock(hashtextextended($1, $2))",
                &[&name, &space],
            )
            .await?;
        Ok(())
    }
}

/// A board in one PostgreSQL database: its connections, the clock it reads
/// time from (never the server's), and the runtime its connections run on.
pub struct Postgres {
    pub(crate) pool: Pool,
    pub(crate) clock: Arc<dyn Clock>,
    /// Runs the clients' connection tasks; shut down with the board.
    pub(crate) runtime: Option<tokio::runtime::Runtime>,
}

impl std::fmt::Debug for Postgres {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Postgres")
            .field("board", &self.pool.name)
            .finish_non_exhaustive()
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        // Never block: the board may be dropped inside another runtime.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// What became of one attempt at a transaction.
enum Settled<T> {
    Done(Result<T, BoardError>),
    /// A conflict the server resolved by failing this side: again.
    Conflict,
}

impl Postgres {
    fn fail(&self, error: &tokio_postgres::Error) -> BoardError {
        storage_error(&self.pool.name, error)
    }

    /// Ends a transaction as its step's outcome says: committed (a
    /// `CommitThen` too, then failed), or rolled back.
    async fn settle<T>(
        &self,
        conn: &mut Conn,
        outcome: Result<T, TxError>,
        unsynced: bool,
    ) -> Settled<T> {
        let ended = match outcome {
            Ok(value) => conn.end(true, unsynced).await.map(|()| Ok(value)),
            Err(TxError::CommitThen(error)) => conn.end(true, false).await.map(|()| Err(error)),
            Err(error @ (TxError::Board(_) | TxError::NeedsSync)) => {
                let error = error.into_board_error(|other| BoardError::Storage(other.to_string()));
                conn.end(false, false).await.map(|()| Err(error))
            }
            Err(TxError::Engine(error)) => {
                let _ = conn.end(false, false).await;
                return match error.downcast::<tokio_postgres::Error>() {
                    Ok(error) if is_conflict(&error) => Settled::Conflict,
                    Ok(error) => Settled::Done(Err(self.fail(&error))),
                    Err(other) => Settled::Done(Err(BoardError::Storage(format!(
                        "{}: {other}",
                        self.pool.name
                    )))),
                };
            }
        };
        Settled::Done(ended.unwrap_or_else(|error| Err(self.fail(&error))))
    }
}

#[async_trait]
impl Engine for Postgres {
    fn name(&self) -> &str {
        &self.pool.name
    }

    async fn write<T, F>(&self, durability: Durability, mut body: F) -> Result<T, BoardError>
    where
        T: Send + 'static,
        F: for<'t> FnMut(&'t mut dyn Sql, i64) -> TxFuture<'t, T> + Send + 'static,
    {
        // Which commits may return before the server flushed its log: only
        // records no process acts on (tick counts, the exit of a settled
        // run). A server can crash while the workers on other hosts live
        // on, and they would act on a bind or a lease extension the crash
        // took: those stay synced here, unlike on a file.
        let unsynced = matches!(
            durability,
            Durability::Record | Durability::SyncedUnlessRecord
        );
        let mut conn = self.pool.get().await?;
        for _ in 0..CONFLICT_RETRIES {
            let now = self.clock.now();
            conn.begin("BEGIN")
                .await
                .map_err(|error| self.fail(&error))?;
            let mut tx = PgSql {
                conn: &mut conn,
                writing: true,
                unsynced,
                prelude: None,
            };
            let outcome = body(&mut tx, now).await;
            let unsynced = tx.unsynced;
            match self.settle(&mut conn, outcome, unsynced).await {
                Settled::Done(result) => return result,
                Settled::Conflict => continue,
            }
        }
        Err(BoardError::Busy {
            attempts: CONFLICT_RETRIES,
        })
    }

    async fn read<T, F>(&self, body: F) -> Result<T, BoardError>
    where
        T: Send + 'static,
        F: for<'t> FnOnce(&'t mut dyn Sql) -> TxFuture<'t, T> + Send + 'static,
    {
        let mut conn = self.pool.get().await?;
        conn.begin("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            .await
            .map_err(|error| self.fail(&error))?;
        let mut tx = PgSql {
            conn: &mut conn,
            writing: false,
            unsynced: false,
            prelude: None,
        };
        let outcome = body(&mut tx).await;
        match self.settle(&mut conn, outcome, false).await {
            Settled::Done(result) => result,
            Settled::Conflict => Err(BoardError::Busy { attempts: 1 }),
        }
    }

    fn now(&self) -> i64 {
        self.clock.now()
    }

    /// The lease proof as one read-only statement in its own snapshot
    /// transaction, sent in one round trip: no lock taken, nothing written.
    async fn prove(&self, request: &ProofRequest, identity: ProofIdentity) -> Result<(), NotLive> {
        let (task_id, db, run_id, claim_lock) = required_coordinates(request)?;
        // A claim on another board is never proven here; the same board
        // spelled another way (`postgresql://`, a default port) is this one.
        let same = db == self.pool.name
            || crate::parse_url(db).is_ok_and(|url| crate::public_url(&url) == self.pool.name);
        if !same {
            return Err(NotLive::BoardNotFound(db.to_owned()));
        }
        let now = self.clock.now();
        let unreadable = |error: String| NotLive::Unreadable(error);
        let mut conn = self
            .pool
            .get()
            .await
            .map_err(|error| unreadable(error.to_string()))?;
        let row = conn
            .query_opt_alone(
                "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY",
                &lease_query(identity),
                &[&task_id],
            )
            .await
            .map_err(|error| unreadable(self.fail(&error).to_string()))?;
        let row = row.as_ref().map(row_of).transpose();
        let view = row
            .and_then(|row| lease_from_row(row.as_ref()))
            .map_err(|error| unreadable(format!("{error:?}")))?;
        evaluate_lease(&view, run_id, claim_lock, identity, now)
    }

    /// A server out of reach is passing: the calls that follow fail and
    /// pause claiming until it is back. What makes a PostgreSQL board
    /// unsafe to write is a schema newer than this build's (a newer kanban
    /// upgraded it meanwhile).
    async fn check_health(&self) -> Result<(), BoardError> {
        let found = async {
            let conn = self.pool.get().await?;
            conn.value::<Option<i64>>("SELECT MAX(version) FROM kanban_schema", &[])
                .await
                .map_err(|error| match error {
                    TxError::Board(error) => error,
                    _ => BoardError::Storage("the schema's version cannot be read".to_owned()),
                })
        }
        .await;
        match found {
            Ok(Some(found)) if found > SCHEMA_VERSION => Err(BoardError::NewerSchema {
                path: self.pool.name.clone(),
                found,
                supported: SCHEMA_VERSION,
            }),
            _ => Ok(()),
        }
    }
}

//! The SQLite engine: the board's transactions on its one connection, run
//! where blocking is allowed.

use std::borrow::Cow;
use std::sync::Arc;

use async_trait::async_trait;
use kanban_board::{
    Cell, Dialect, Durability, Engine, Param, Row, Sql, Turns, TxError, TxFuture, TxResult,
    lease_from_row, lease_query, storable_json, storable_list, storable_text,
};
use kanban_core::lease::{evaluate_lease, required_coordinates};
use kanban_core::{BoardError, NotLive, ProofIdentity, ProofRequest};
use rusqlite::Connection;
use rusqlite::types::{ToSqlOutput, Value, ValueRef};

use crate::MEMORY_BOARD;
use crate::proof::LeaseProver;
use crate::store::{Offload, Store, Sync, sql, unwritten};

/// SQLite's words: one writer holds the whole file, so nothing is locked
/// by row; a card's place is its rowid; a list is bound as JSON text.
static SQLITE: Dialect = Dialect {
    place: "rowid",
    lock_card: "",
    skip_locked: "",
    lock_rows: "",
    any: |n| format!("IN (SELECT value FROM json_each(${n}))"),
    // Done cards newest first, many of them: the table walked back from
    // its newest row meets them soon, where the lane index would be sorted.
    done_scan: "tasks NOT INDEXED",
    json_text: |column, key| {
        format!(
            "CASE WHEN json_valid({column}) THEN CAST(json_extract({column}, '$.{key}') AS TEXT) END"
        )
    },
    json_number: |column, key| {
        format!(
            "CASE WHEN json_valid({column}) AND json_type({column}, '$.{key}') IN ('integer', 'real')
                  THEN json_extract({column}, '$.{key}') END"
        )
    },
};

/// A value bound to a SQLite statement.
struct Bind<'p>(&'p Param<'p>);

impl rusqlite::ToSql for Bind<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(match self.0 {
            Param::Null => ToSqlOutput::Owned(Value::Null),
            Param::Int(value) => ToSqlOutput::Borrowed(ValueRef::Integer(*value)),
            Param::Bool(value) => ToSqlOutput::Borrowed(ValueRef::Integer(i64::from(*value))),
            Param::Text(text) => match storable_text(text) {
                Cow::Borrowed(text) => ToSqlOutput::Borrowed(ValueRef::Text(text.as_bytes())),
                Cow::Owned(text) => ToSqlOutput::Owned(Value::Text(text)),
            },
            Param::Json(value) => ToSqlOutput::Owned(Value::Text(storable_json(value).to_string())),
            Param::List(list) => ToSqlOutput::Owned(Value::Text(
                serde_json::to_string(&storable_list(list)).unwrap_or_else(|_| "[]".to_owned()),
            )),
        })
    }
}

/// A row as plain values.
pub(crate) fn row_of(row: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
    let cells = (0..row.as_ref().column_count())
        .map(|at| {
            Ok(match row.get_ref(at)? {
                ValueRef::Null => Cell::Null,
                ValueRef::Integer(value) => Cell::Int(value),
                // SQLite's affinity may keep a whole number as a real.
                ValueRef::Real(value) => Cell::Int(value as i64),
                ValueRef::Text(bytes) | ValueRef::Blob(bytes) => {
                    Cell::Text(String::from_utf8_lossy(bytes).into_owned())
                }
            })
        })
        .collect::<rusqlite::Result<_>>()?;
    Ok(Row(cells))
}

/// One transaction's statements on the board's connection.
pub(crate) struct SqliteSql<'c> {
    conn: &'c mut Connection,
    writing: bool,
    /// Begun unsynced as a record: a change of more must start again synced.
    as_record: bool,
}

impl SqliteSql<'_> {
    /// `query`, prepared once per connection, its parameters checked.
    fn prepared(&self, query: &str) -> TxResult<rusqlite::CachedStatement<'_>> {
        let statement = self.conn.prepare_cached(query).map_err(sql)?;
        in_order(&statement, query)?;
        Ok(statement)
    }
}

fn bound<'p>(params: &'p [Param<'p>]) -> impl rusqlite::Params + 'p {
    rusqlite::params_from_iter(params.iter().map(Bind))
}

/// SQLite numbers `$N` in the order the names first appear in a statement,
/// and values are bound by number: a statement must name `$1`, `$2`, … in
/// that order. Checked in debug builds, where every test runs.
fn in_order(statement: &rusqlite::Statement<'_>, query: &str) -> TxResult<()> {
    if cfg!(debug_assertions) {
        for index in 1..=statement.parameter_count() {
            if statement.parameter_name(index) != Some(format!("${index}").as_str()) {
                return Err(BoardError::Storage(format!(
                    "a statement names its parameters out of order: {query}"
                ))
                .into());
            }
        }
    }
    Ok(())
}

#[async_trait]
impl Sql for SqliteSql<'_> {
    async fn for_each_row(
        &mut self,
        query: &str,
        params: &[Param<'_>],
        each: &mut (dyn FnMut(Row) -> TxResult<()> + Send),
    ) -> TxResult<()> {
        let mut statement = self.prepared(query)?;
        let mut rows = statement.query(bound(params)).map_err(sql)?;
        while let Some(row) = rows.next().map_err(sql)? {
            each(row_of(row).map_err(sql)?)?;
        }
        Ok(())
    }

    async fn execute(&mut self, query: &str, params: &[Param<'_>]) -> TxResult<u64> {
        let changed = self.prepared(query)?.execute(bound(params)).map_err(sql)?;
        Ok(u64::try_from(changed).unwrap_or(u64::MAX))
    }

    async fn insert_id(&mut self, query: &str, params: &[Param<'_>]) -> TxResult<i64> {
        // Not `RETURNING`: SQLite makes that a trigger, and a statement with
        // a trigger keeps a statement journal, allocated and freed at every
        // claim.
        self.execute(query, params).await?;
        Ok(self.conn.last_insert_rowid())
    }

    fn dialect(&self) -> &'static Dialect {
        &SQLITE
    }

    fn writing(&self) -> bool {
        self.writing
    }

    fn require_sync(&mut self) -> TxResult<()> {
        if self.as_record {
            // SQLite will not change how a commit is synced inside a
            // transaction: this one starts again, synced.
            return Err(TxError::NeedsSync);
        }
        Ok(())
    }

    async fn notify(&mut self) -> TxResult<()> {
        // A watcher reads the file's `data_version`: every commit tells it.
        Ok(())
    }

    async fn take_turns(&mut self, _on: Turns, _name: &str) -> TxResult<()> {
        // The write transaction holds the whole file already.
        Ok(())
    }
}

/// A board file (or SQLite's in-memory database) and where its blocking
/// work runs.
#[derive(Clone)]
pub struct Sqlite {
    pub(crate) store: Arc<Store>,
    offload: Option<Arc<dyn Offload>>,
}

impl std::fmt::Debug for Sqlite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sqlite")
            .field("path", &self.store.path)
            .field("offload", &self.offload)
            .finish_non_exhaustive()
    }
}

impl Sqlite {
    pub(crate) fn new(store: Store) -> Self {
        Self {
            store: Arc::new(store),
            offload: None,
        }
    }

    pub(crate) fn set_offload(&mut self, offload: Arc<dyn Offload>) {
        self.offload = Some(offload);
    }

    /// Runs `f` on the board's connection: a hook for tests and tools (an
    /// authorizer, a commit hook).
    pub fn with_connection<T>(&self, f: impl FnOnce(&mut rusqlite::Connection) -> T) -> T {
        f(&mut self.store.conn())
    }

    /// Runs `job` on the store, through the offload when there is one.
    async fn call<T: Send + 'static>(
        &self,
        job: impl FnOnce(&Store) -> Result<T, BoardError> + Send + 'static,
    ) -> Result<T, BoardError> {
        let Some(offload) = &self.offload else {
            return job(&self.store);
        };
        let (answer, answered) = std::sync::mpsc::sync_channel(1);
        let store = self.store.clone();
        let job = move || drop(answer.send(job(&store)));
        offload.run(Box::new(job)).await;
        answered.try_recv().unwrap_or_else(|_| {
            let failed = "a board call ended without an answer (its thread failed)";
            Err(BoardError::Storage(failed.to_owned()))
        })
    }
}

#[async_trait]
impl Engine for Sqlite {
    fn name(&self) -> &str {
        &self.store.name
    }

    async fn write<T, F>(&self, durability: Durability, mut body: F) -> Result<T, BoardError>
    where
        T: Send + 'static,
        F: for<'t> FnMut(&'t mut dyn Sql, i64) -> TxFuture<'t, T> + Send + 'static,
    {
        self.call(move |store| {
            store.refuse_read_only_copy()?;
            // SQLite's primitives never wait: a step's future is done when
            // first polled.
            let mut run = |sync: Sync, as_record: bool| {
                store.transact(sync, |conn, now| {
                    let mut tx = SqliteSql {
                        conn,
                        writing: true,
                        as_record,
                    };
                    pollster::block_on(body(&mut tx, now))
                })
            };
            // The writes whose loss in a machine crash equals that crash
            // coming just before them skip the sync: every process that
            // wrote one dies in the same crash. A booking cannot know which
            // it is before it reads the card, and SQLite will not change how
            // a commit is synced inside a transaction: it begins unsynced,
            // and starts again synced when it changes more than a record.
            let written = match durability {
                Durability::Synced => run(Sync::Full, false),
                Durability::LocalRecord | Durability::Record => run(Sync::Normal, false),
                Durability::SyncedUnlessRecord => match run(Sync::Normal, true) {
                    Err(TxError::NeedsSync) => run(Sync::Full, false),
                    written => written,
                },
            };
            written.map_err(unwritten)
        })
        .await
    }

    async fn read<T, F>(&self, body: F) -> Result<T, BoardError>
    where
        T: Send + 'static,
        F: for<'t> FnOnce(&'t mut dyn Sql) -> TxFuture<'t, T> + Send + 'static,
    {
        self.call(move |store| {
            store.read(|conn| {
                let mut tx = SqliteSql {
                    conn,
                    writing: false,
                    as_record: false,
                };
                pollster::block_on(body(&mut tx))
            })
        })
        .await
    }

    fn now(&self) -> i64 {
        self.store.clock.now()
    }

    async fn prove(&self, request: &ProofRequest, identity: ProofIdentity) -> Result<(), NotLive> {
        let now = self.store.clock.now();
        if self.store.name != MEMORY_BOARD {
            // The proof reads the file the claim pins, read-only, exactly as
            // a worker in another language would, on a connection kept open.
            return self
                .store
                .prover
                .get_or_init(|| LeaseProver::new(self.store.name.clone()))
                .prove(request, identity, now);
        }
        let (task_id, _, run_id, claim_lock) = required_coordinates(request)?;
        let task_id = task_id.to_owned();
        let view = self
            .read(move |tx| {
                Box::pin(async move {
                    let row = tx
                        .rows(&lease_query(identity), &[Param::Text(&task_id)])
                        .await?;
                    lease_from_row(row.first())
                })
            })
            .await
            .map_err(|error| NotLive::Unreadable(error.to_string()))?;
        evaluate_lease(&view, run_id, claim_lock, identity, now)
    }

    async fn check_health(&self) -> Result<(), BoardError> {
        self.store.check_health()
    }
}

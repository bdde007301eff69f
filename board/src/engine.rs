//! What a storage engine gives the board: transactions, and inside them
//! statements run with values bound, rows read back as plain values, and
//! the few words of SQL its dialect writes its own way. An engine decides
//! nothing: which card may be claimed, what a booking changes and what a
//! fence refuses are core's rules, applied by this crate's steps.

use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;

use async_trait::async_trait;
use kanban_core::{BoardError, NotLive, ProofIdentity, ProofRequest};
use serde_json::Value;

/// Why a step inside a transaction did not return a value.
#[derive(Debug)]
pub enum TxError {
    /// The engine failed; it reads its own error back (to retry a busy
    /// board or a conflict, or to name the fault).
    Engine(Box<dyn std::error::Error + Send + Sync>),
    /// Roll back and fail.
    Board(BoardError),
    /// Commit what was written (a `stale_write_rejected` event), then fail.
    CommitThen(BoardError),
    /// Roll back, and run the step again with a synced commit: a write begun
    /// as a record found it changes more ([`Durability::SyncedUnlessRecord`]).
    NeedsSync,
}

impl TxError {
    /// An engine's own error.
    pub fn engine(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self::Engine(Box::new(error))
    }

    /// The board's error this stands for; `engine` names an engine's own.
    pub fn into_board_error(
        self,
        engine: impl FnOnce(Box<dyn std::error::Error + Send + Sync>) -> BoardError,
    ) -> BoardError {
        match self {
            Self::Board(error) | Self::CommitThen(error) => error,
            Self::Engine(error) => engine(error),
            // Only a write begun as a record may ask, and only once: any
            // other ask is a bug of the step that made it.
            Self::NeedsSync => {
                BoardError::Storage("a write asked for a synced commit while in one".to_owned())
            }
        }
    }
}

impl From<BoardError> for TxError {
    fn from(error: BoardError) -> Self {
        Self::Board(error)
    }
}

/// The result of one statement or step.
pub type TxResult<T> = Result<T, TxError>;

/// A step's future, borrowing the transaction it runs in.
pub type TxFuture<'t, T> = Pin<Box<dyn Future<Output = TxResult<T>> + Send + 't>>;

/// How soon a write's commit must reach the disk. Each engine maps these
/// to what its own crashes can lose.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Durability {
    /// On the disk before the commit returns: claims (a run id is a fencing
    /// token, never handed out twice), settlements, bookings and every
    /// change a person or an agent made.
    Synced,
    /// A record whose loss in a crash of the machine that holds the board
    /// equals that crash coming just before it, as long as the processes
    /// that wrote it die in the same crash: a worker binding its pid, a
    /// heartbeat or lease extension, a worker's result, spawn and signal
    /// records. An engine whose writers outlive its storage (a server other
    /// hosts write to) syncs them.
    LocalRecord,
    /// A record nobody acts on (tick counts): never worth a sync.
    Record,
    /// Synced, unless the step finds its change only records (the exit of a
    /// run its worker already settled): it calls [`Sql::require_sync`]
    /// before it writes more than a record.
    SyncedUnlessRecord,
}

/// A value bound to a statement's `$N`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Param<'a> {
    Null,
    Int(i64),
    Bool(bool),
    Text(&'a str),
    Json(&'a Value),
    /// A list of texts, for [`Dialect::any`].
    List(&'a [String]),
}

impl From<i64> for Param<'_> {
    fn from(value: i64) -> Self {
        Self::Int(value)
    }
}

impl From<u32> for Param<'_> {
    fn from(value: u32) -> Self {
        Self::Int(i64::from(value))
    }
}

impl From<bool> for Param<'_> {
    fn from(value: bool) -> Self {
        Self::Bool(value)
    }
}

impl<'a> From<&'a str> for Param<'a> {
    fn from(value: &'a str) -> Self {
        Self::Text(value)
    }
}

impl<'a> From<&'a String> for Param<'a> {
    fn from(value: &'a String) -> Self {
        Self::Text(value)
    }
}

impl<'a> From<&'a Value> for Param<'a> {
    fn from(value: &'a Value) -> Self {
        Self::Json(value)
    }
}

impl<'a> From<&'a [String]> for Param<'a> {
    fn from(value: &'a [String]) -> Self {
        Self::List(value)
    }
}

impl<'a, T: Into<Param<'a>>> From<Option<T>> for Param<'a> {
    fn from(value: Option<T>) -> Self {
        value.map_or(Self::Null, Into::into)
    }
}

/// What stands for a NUL character in stored text, on both engines.
///
/// PostgreSQL's `text` and `jsonb` cannot hold NUL (an agent's output with
/// one made its exit unbookable), and SQLite's own string functions stop at
/// it; so every engine stores U+FFFD REPLACEMENT CHARACTER in its place, and
/// one board reads the same whichever engine wrote it.
pub const NUL_STAND_IN: char = '\u{FFFD}';

/// `text` as an engine stores it: each NUL replaced by [`NUL_STAND_IN`].
pub fn storable_text(text: &str) -> Cow<'_, str> {
    if text.contains('\0') {
        Cow::Owned(text.replace('\0', &NUL_STAND_IN.to_string()))
    } else {
        Cow::Borrowed(text)
    }
}

/// `value` as an engine stores it: NUL replaced in every string and key.
pub fn storable_json(value: &Value) -> Cow<'_, Value> {
    fn holds_nul(value: &Value) -> bool {
        match value {
            Value::String(text) => text.contains('\0'),
            Value::Array(items) => items.iter().any(holds_nul),
            Value::Object(map) => map
                .iter()
                .any(|(key, item)| key.contains('\0') || holds_nul(item)),
            Value::Null | Value::Bool(_) | Value::Number(_) => false,
        }
    }
    fn replaced(value: &Value) -> Value {
        match value {
            Value::String(text) => Value::String(storable_text(text).into_owned()),
            Value::Array(items) => Value::Array(items.iter().map(replaced).collect()),
            Value::Object(map) => Value::Object(
                map.iter()
                    .map(|(key, item)| (storable_text(key).into_owned(), replaced(item)))
                    .collect(),
            ),
            Value::Null | Value::Bool(_) | Value::Number(_) => value.clone(),
        }
    }
    if holds_nul(value) {
        Cow::Owned(replaced(value))
    } else {
        Cow::Borrowed(value)
    }
}

/// `list` as an engine stores it: NUL replaced in each text.
pub fn storable_list(list: &[String]) -> Cow<'_, [String]> {
    if list.iter().any(|text| text.contains('\0')) {
        Cow::Owned(
            list.iter()
                .map(|text| storable_text(text).into_owned())
                .collect(),
        )
    } else {
        Cow::Borrowed(list)
    }
}

/// The values bound to a statement: `args![a, b]`.
#[macro_export]
macro_rules! args {
    ($($value:expr),* $(,)?) => {
        &[$($crate::Param::from($value)),*]
    };
}

/// One value of a row read back.
#[derive(Clone, Debug, PartialEq)]
pub enum Cell {
    Null,
    Int(i64),
    Bool(bool),
    Text(String),
    Json(Value),
}

/// A row read back: its values, by column.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Row(pub Vec<Cell>);

impl Row {
    fn cell(&self, at: usize) -> TxResult<&Cell> {
        self.0.get(at).ok_or_else(|| mismatch(at, "a column"))
    }

    /// A whole number or none; a truth value is read with [`Row::flag`].
    pub fn opt_int(&self, at: usize) -> TxResult<Option<i64>> {
        match self.cell(at)? {
            Cell::Null => Ok(None),
            Cell::Int(value) => Ok(Some(*value)),
            _ => Err(mismatch(at, "a whole number")),
        }
    }

    pub fn int(&self, at: usize) -> TxResult<i64> {
        self.opt_int(at)?
            .ok_or_else(|| mismatch(at, "a whole number"))
    }

    /// A count kept as a whole number, read into core's `u32`.
    pub fn count(&self, at: usize) -> TxResult<u32> {
        Ok(u32::try_from(self.int(at)?.max(0)).unwrap_or(u32::MAX))
    }

    pub fn opt_count(&self, at: usize) -> TxResult<Option<u32>> {
        Ok(self
            .opt_int(at)?
            .map(|value| u32::try_from(value.max(0)).unwrap_or(u32::MAX)))
    }

    pub fn opt_text(&self, at: usize) -> TxResult<Option<String>> {
        match self.cell(at)? {
            Cell::Null => Ok(None),
            Cell::Text(value) => Ok(Some(value.clone())),
            _ => Err(mismatch(at, "text")),
        }
    }

    pub fn text(&self, at: usize) -> TxResult<String> {
        self.opt_text(at)?.ok_or_else(|| mismatch(at, "text"))
    }

    /// A truth value: a boolean, or a whole number (0 is false).
    pub fn flag(&self, at: usize) -> TxResult<bool> {
        match self.cell(at)? {
            Cell::Bool(value) => Ok(*value),
            Cell::Int(value) => Ok(*value != 0),
            _ => Err(mismatch(at, "a truth value")),
        }
    }

    /// A JSON value: stored as JSON, or as JSON text; anything else (text
    /// that is not JSON, none) reads as none.
    pub fn json(&self, at: usize) -> TxResult<Option<Value>> {
        match self.cell(at)? {
            Cell::Json(value) => Ok(Some(value.clone())),
            Cell::Text(text) => Ok(serde_json::from_str(text).ok()),
            _ => Ok(None),
        }
    }
}

fn mismatch(at: usize, wanted: &str) -> TxError {
    BoardError::Storage(format!("column {at} of a row is not {wanted}")).into()
}

/// The words of SQL a dialect writes its own way.
#[derive(Clone, Copy, Debug)]
pub struct Dialect {
    /// A card's place in the order cards were added: a column of `tasks`.
    pub place: &'static str,
    /// Locks the rows of `tasks t` a write reads to change, for the rest of
    /// the transaction ("" where one writer holds the whole board).
    pub lock_card: &'static str,
    /// Locks the rows of `tasks t` a claim takes, skipping those another
    /// writer holds this instant.
    pub skip_locked: &'static str,
    /// Locks rows of one table a write reads to change.
    pub lock_rows: &'static str,
    /// `… IN (the texts of list $N)`: the test of membership in a bound
    /// [`Param::List`].
    pub any: fn(usize) -> String,
    /// The table a newest-first scan of a large done lane reads.
    pub done_scan: &'static str,
    /// `key` of the JSON in `column`, as text (none where it is not JSON).
    pub json_text: fn(&str, &str) -> String,
    /// `key` of the JSON in `column`, as a number (none where it is not one).
    pub json_number: fn(&str, &str) -> String,
}

/// What a name locks for the rest of a transaction, where writers run at
/// once: writes that read, then write, take turns on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Turns {
    /// A card's idempotency key: a second create finds the first's card.
    IdempotencyKey,
    /// A wall's scope, armed or not.
    WallScope,
    /// The board's links: a new link is checked against all of them, so two
    /// links that would close a cycle together are made one after the other.
    Links,
}

/// One transaction's statements.
#[async_trait]
pub trait Sql: Send {
    /// Hands each row a query returns to `each` as it is read: a listing
    /// keeps its records, never every row's plain values beside them.
    async fn for_each_row(
        &mut self,
        query: &str,
        params: &[Param<'_>],
        each: &mut (dyn FnMut(Row) -> TxResult<()> + Send),
    ) -> TxResult<()>;
    /// The rows a query returns.
    async fn rows(&mut self, query: &str, params: &[Param<'_>]) -> TxResult<Vec<Row>> {
        let mut found = Vec::new();
        self.for_each_row(query, params, &mut |row| {
            found.push(row);
            Ok(())
        })
        .await?;
        Ok(found)
    }
    /// Runs a statement; how many rows it changed.
    async fn execute(&mut self, query: &str, params: &[Param<'_>]) -> TxResult<u64>;
    /// Runs an `INSERT` of one row into a table whose key is `id`; its id.
    async fn insert_id(&mut self, query: &str, params: &[Param<'_>]) -> TxResult<i64>;
    /// This engine's words.
    fn dialect(&self) -> &'static Dialect;
    /// Whether this is a write transaction.
    fn writing(&self) -> bool;
    /// A step of [`Durability::SyncedUnlessRecord`] about to write more than
    /// a record calls this first.
    fn require_sync(&mut self) -> TxResult<()>;
    /// Tells the board's listeners, at the commit, that there may be work
    /// (a watcher of a file needs nothing: every commit tells it).
    async fn notify(&mut self) -> TxResult<()>;
    /// Takes turns on `name` with other writers (nothing where one writer
    /// holds the whole board).
    async fn take_turns(&mut self, on: Turns, name: &str) -> TxResult<()>;
    /// The rest of the transaction walks the board's indexes in their
    /// order, never a scan and a sort: said before a claim walks a lane, so
    /// that a planner working from stale statistics (PostgreSQL's, after a
    /// burst of new cards) does not sort the whole lane at every claim.
    fn walk_indexes(&mut self) {}
}

/// A board's storage.
#[async_trait]
pub trait Engine: Send + Sync + 'static {
    /// The board's name as claims carry it: a canonical path, a URL
    /// without its password.
    fn name(&self) -> &str;
    /// Runs `body` as one write transaction at the board's time, again
    /// whole when the engine resolved a conflict by failing it (a busy
    /// file, a serialization failure).
    async fn write<T, F>(&self, durability: Durability, body: F) -> Result<T, BoardError>
    where
        T: Send + 'static,
        F: for<'t> FnMut(&'t mut dyn Sql, i64) -> TxFuture<'t, T> + Send + 'static;
    /// Runs `body` in one read-only snapshot.
    async fn read<T, F>(&self, body: F) -> Result<T, BoardError>
    where
        T: Send + 'static,
        F: for<'t> FnOnce(&'t mut dyn Sql) -> TxFuture<'t, T> + Send + 'static;
    /// The board's time, from its clock.
    fn now(&self) -> i64;
    /// The read-only lease proof, fail-closed.
    async fn prove(&self, request: &ProofRequest, identity: ProofIdentity) -> Result<(), NotLive>;
    /// An error when the board is no longer safe to write.
    async fn check_health(&self) -> Result<(), BoardError>;
}

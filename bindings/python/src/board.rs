//! `kanban_core.Board`: a board for a Python host, on either engine. Each
//! call releases the interpreter while the board works, so threads of the
//! host run meanwhile and may share one `Board`.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use kanban_board_postgres::{PgBoard, is_postgres_url};
use kanban_board_sqlite::{SqliteBoard, SystemClock};
use kanban_core::{
    BlockKind, BoardAdmin, BoardError, Environment, NewTask, ProofIdentity, TaskStatus,
};
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

create_exception!(
    _native,
    KanbanError,
    PyException,
    "A board call that did not happen."
);
create_exception!(
    _native,
    FencedWriteError,
    KanbanError,
    "A worker write refused: the claim is no longer live (reclaimed, settled or expired)."
);
create_exception!(
    _native,
    BoardMissingError,
    KanbanError,
    "No usable board there: no file (create it with Board(path, create=True)), not a board, or a database that cannot be reached."
);
create_exception!(
    _native,
    StorageError,
    KanbanError,
    "The board's storage failed: busy, full, or a newer schema."
);
create_exception!(
    _native,
    CardNotFoundError,
    KanbanError,
    "No such card on the board."
);
create_exception!(
    _native,
    RefusedError,
    KanbanError,
    "A change the card's rules refuse (a move its status does not allow, bad input)."
);

pub(crate) fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = module.py();
    module.add_class::<Board>()?;
    module.add_class::<Claim>()?;
    module.add("KanbanError", py.get_type::<KanbanError>())?;
    module.add("FencedWriteError", py.get_type::<FencedWriteError>())?;
    module.add("BoardMissingError", py.get_type::<BoardMissingError>())?;
    module.add("StorageError", py.get_type::<StorageError>())?;
    module.add("CardNotFoundError", py.get_type::<CardNotFoundError>())?;
    module.add("RefusedError", py.get_type::<RefusedError>())?;
    Ok(())
}

/// A board error as the exception a Python host catches.
fn raised(error: BoardError) -> PyErr {
    let text = error.to_string();
    match error {
        BoardError::LeaseLost { .. } => FencedWriteError::new_err(text),
        BoardError::TaskNotFound(_) => CardNotFoundError::new_err(text),
        BoardError::Unusable { .. } => BoardMissingError::new_err(text),
        BoardError::InvalidTransition { .. }
        | BoardError::InvalidInput(_)
        | BoardError::UnknownStatus { .. } => RefusedError::new_err(text),
        _ => StorageError::new_err(text),
    }
}

/// What a Python host needs of a board.
trait Ports: kanban_core::Board + BoardAdmin {}

impl<T: kanban_core::Board + BoardAdmin> Ports for T {}

/// A claim a Python worker holds: the fencing token of every write it makes.
#[pyclass(module = "kanban_core._native", frozen, get_all)]
#[derive(Clone, Debug)]
struct Claim {
    task_id: String,
    /// The board: the file's canonical path, or the URL without a password.
    db: String,
    run_id: i64,
    claim_lock: String,
    /// When the lease ends unless renewed (epoch seconds).
    claim_expires: i64,
}

impl Claim {
    fn core(&self) -> kanban_core::Claim {
        kanban_core::Claim {
            task_id: self.task_id.clone(),
            db: self.db.clone(),
            run_id: self.run_id,
            claim_lock: self.claim_lock.clone(),
            board: None,
        }
    }
}

#[pymethods]
impl Claim {
    /// A claim from its parts: a carrier a worker process was handed.
    #[new]
    #[pyo3(signature = (task_id, db, run_id, claim_lock, claim_expires=0))]
    fn new(
        task_id: String,
        db: String,
        run_id: i64,
        claim_lock: String,
        claim_expires: i64,
    ) -> Self {
        Self {
            task_id,
            db,
            run_id,
            claim_lock,
            claim_expires,
        }
    }

    /// The claim carrier a worker process is handed, under the seed
    /// system's names (`HERMES_KANBAN_TASK`, `_DB`, `_RUN_ID`, `_CLAIM_LOCK`).
    fn env(&self) -> HashMap<String, String> {
        self.core()
            .to_env_pairs()
            .into_iter()
            .map(|(name, value)| (name.to_owned(), value))
            .collect()
    }

    fn __repr__(&self) -> String {
        format!(
            "Claim(task_id={:?}, run_id={}, claim_expires={})",
            self.task_id, self.run_id, self.claim_expires
        )
    }
}

/// A kanban board: a SQLite file, or a PostgreSQL database by its URL.
#[pyclass(module = "kanban_core._native", frozen)]
struct Board {
    ports: Arc<dyn Ports>,
    name: String,
    runtime: tokio::runtime::Runtime,
}

impl std::fmt::Debug for Board {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Board").field("name", &self.name).finish()
    }
}

impl Board {
    /// Runs a board call with the interpreter released.
    fn call<T: Send>(
        &self,
        py: Python<'_>,
        work: impl std::future::Future<Output = Result<T, BoardError>> + Send,
    ) -> PyResult<T> {
        py.detach(|| self.runtime.block_on(work)).map_err(raised)
    }
}

/// A fresh claim lock: this host, this process, 16 random bytes.
fn new_claim_lock() -> PyResult<String> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|error| {
        StorageError::new_err(format!("no randomness for a claim lock: {error}"))
    })?;
    let random: String = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_owned())
        .ok()
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "localhost".to_owned());
    Ok(format!("{host}:{}:{random}", std::process::id()))
}

/// A Python object as JSON text, for `json.loads` on the Python side.
fn as_json(value: &impl serde::Serialize) -> PyResult<String> {
    serde_json::to_string(value).map_err(|error| StorageError::new_err(error.to_string()))
}

#[pymethods]
impl Board {
    /// Opens the board at `path_or_url`; `create=True` makes it when it is
    /// not there (a file and its folder; a PostgreSQL database's schema).
    /// A PostgreSQL URL carries no password: it comes from `PGPASSWORD` or
    /// the password file, as for `kanban`.
    #[new]
    #[pyo3(signature = (path_or_url, *, create = false))]
    fn new(py: Python<'_>, path_or_url: &str, create: bool) -> PyResult<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(|error| {
                StorageError::new_err(format!("cannot start the board's runtime: {error}"))
            })?;
        let clock = Arc::new(SystemClock);
        let (ports, name): (Arc<dyn Ports>, String) = if is_postgres_url(path_or_url) {
            let env = Environment::from_os_vars(std::env::vars_os());
            let settings = kanban_board_postgres::settings(path_or_url, &env).map_err(raised)?;
            let board = py
                .detach(|| {
                    runtime.block_on(async {
                        if create {
                            PgBoard::connect(settings, clock).await
                        } else {
                            PgBoard::open(settings, clock).await
                        }
                    })
                })
                .map_err(|error| match error {
                    BoardError::Storage(message) => BoardMissingError::new_err(message),
                    other => raised(other),
                })?;
            let name = board.url().to_owned();
            (Arc::new(board), name)
        } else {
            let path = Path::new(path_or_url);
            if !create && std::fs::symlink_metadata(path).is_err() {
                return Err(BoardMissingError::new_err(format!(
                    "{path_or_url}: no board here; Board({path_or_url:?}, create=True) makes one"
                )));
            }
            let board = py
                .detach(|| {
                    if create {
                        SqliteBoard::create(path, clock)
                    } else {
                        SqliteBoard::open(path, clock)
                    }
                })
                .map_err(raised)?;
            let name = board.path().display().to_string();
            (Arc::new(board), name)
        };
        Ok(Self {
            ports,
            name,
            runtime,
        })
    }

    /// The board's name: the canonical path of its file, or its URL
    /// without a password.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// Adds a card; its id.
    #[pyo3(signature = (title, *, body=None, assignee=None, priority=0, parents=None, tenant=None, created_by=None))]
    #[allow(
        clippy::too_many_arguments,
        reason = "the keyword arguments of `kanban add`"
    )]
    fn add(
        &self,
        py: Python<'_>,
        title: String,
        body: Option<String>,
        assignee: Option<String>,
        priority: i64,
        parents: Option<Vec<String>>,
        tenant: Option<String>,
        created_by: Option<String>,
    ) -> PyResult<String> {
        let task = NewTask {
            title,
            body,
            assignee,
            priority,
            parents: parents.unwrap_or_default(),
            tenant,
            created_by,
            ..NewTask::default()
        };
        self.call(py, self.ports.create_task(&task))
    }

    /// Claims a ready card for `ttl_seconds`; `None` when it is not ready.
    #[pyo3(signature = (task_id, *, ttl_seconds=900))]
    fn claim(&self, py: Python<'_>, task_id: &str, ttl_seconds: i64) -> PyResult<Option<Claim>> {
        let lock = new_claim_lock()?;
        let grant = self.call(py, self.ports.claim_task(task_id, ttl_seconds, &lock))?;
        Ok(grant.map(|grant| Claim {
            task_id: grant.claim.task_id,
            db: grant.claim.db,
            run_id: grant.claim.run_id,
            claim_lock: grant.claim.claim_lock,
            claim_expires: grant.claim_expires,
        }))
    }

    /// Renews the claim's lease; its new end. Fenced.
    #[pyo3(signature = (claim, note=None))]
    fn heartbeat(&self, py: Python<'_>, claim: &Claim, note: Option<String>) -> PyResult<i64> {
        let claim = claim.core();
        self.call(py, self.ports.heartbeat(&claim, note))
    }

    /// Completes the card and closes the run. Fenced.
    #[pyo3(signature = (claim, summary, result=None))]
    fn complete(
        &self,
        py: Python<'_>,
        claim: &Claim,
        summary: &str,
        result: Option<String>,
    ) -> PyResult<()> {
        let claim = claim.core();
        self.call(py, self.ports.complete(&claim, summary, result))
    }

    /// Blocks the card for a human (`kind`: dependency, needs_input,
    /// capability or transient). Fenced.
    #[pyo3(signature = (claim, reason, kind=None))]
    fn block(
        &self,
        py: Python<'_>,
        claim: &Claim,
        reason: &str,
        kind: Option<&str>,
    ) -> PyResult<()> {
        let kind = match kind {
            None => None,
            Some(name) => Some(BlockKind::parse(name).ok_or_else(|| {
                RefusedError::new_err(format!(
                    "block kind {name:?} is not one of dependency, needs_input, capability, transient"
                ))
            })?),
        };
        let claim = claim.core();
        self.call(py, self.ports.block(&claim, reason, kind))
    }

    /// Comments on the claimed card. Fenced.
    #[pyo3(signature = (claim, text, author="worker"))]
    fn comment(&self, py: Python<'_>, claim: &Claim, text: &str, author: &str) -> PyResult<()> {
        let claim = claim.core();
        self.call(py, self.ports.comment(&claim, author, text))
    }

    /// Whether the claim is live: its run current, its lock, its lease
    /// unexpired (and, with `verify_pid`, this process the recorded worker).
    #[pyo3(signature = (claim, *, verify_pid=false))]
    fn prove(&self, py: Python<'_>, claim: &Claim, verify_pid: bool) -> bool {
        let claim = claim.core();
        let identity = if verify_pid {
            ProofIdentity::Process(std::process::id())
        } else {
            ProofIdentity::AnyProcess
        };
        py.detach(|| {
            self.runtime
                .block_on(self.ports.prove_claim(&claim, identity))
                .is_ok()
        })
    }

    /// Takes a running card back from its worker (an operator's reclaim):
    /// its claim is no longer live.
    #[pyo3(signature = (task_id, reason="reclaimed by the host"))]
    fn reclaim(&self, py: Python<'_>, task_id: &str, reason: &str) -> PyResult<()> {
        self.call(py, self.ports.reclaim(task_id, reason))
    }

    /// A card with its runs, events and comments, as JSON text.
    fn show_json(&self, py: Python<'_>, task_id: &str) -> PyResult<String> {
        let view = self.call(py, self.ports.show_task(task_id))?;
        as_json(&view)
    }

    /// The cards (of one status), oldest first, as JSON text.
    #[pyo3(signature = (status=None))]
    fn list_json(&self, py: Python<'_>, status: Option<&str>) -> PyResult<String> {
        let status = match status {
            None => None,
            Some(name) => Some(TaskStatus::parse(name).ok_or_else(|| {
                RefusedError::new_err(format!("{name:?} is not a status this build knows"))
            })?),
        };
        let tasks = self.call(py, self.ports.list_tasks(status))?;
        as_json(&tasks)
    }

    fn __repr__(&self) -> String {
        format!("Board({:?})", self.name)
    }
}

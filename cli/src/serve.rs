//! `kanban serve`: the live web board, a JSON API and Prometheus metrics.
//!
//! One page per board (its lanes, live), a page per card (body, runs,
//! events, comments, the tail of its log), operator actions through the
//! same board operations as the CLI, `/api/…` (docs/api.md, with an
//! OpenAPI description the tests check the server against) and `/metrics`.
//! Live: a server-sent event `changed` whenever anybody commits to the
//! board (its `data_version`, looked at every 200 ms); the page then fetches
//! the part that changed.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::Context;
use axum::extract::{Form, Path as UrlPath, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use kanban_board_sqlite::{ChangeWatch, SqliteBoard, SystemClock};

use crate::board_path::{Engine, OpenBoard};
use crate::supervisor::BoardWatch;
use kanban_core::{BoardError, Clock, NewTask, TaskStatus};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::output::{event_json, run_json, task_json};
use crate::serve_page as page;

/// Cards a lane shows (its count says how many there are).
pub(crate) const LANE_LIMIT: usize = 100;
/// Lines of a card's log its page shows.
const LOG_TAIL_LINES: usize = 200;
/// How often the board is looked at for commits.
const WATCH_EVERY: Duration = Duration::from_millis(200);

/// What every handler shares.
pub(crate) struct App {
    pub(crate) board: OpenBoard,
    logs: PathBuf,
    /// Put in every form; a POST without it is refused (a page of another
    /// site cannot read it).
    pub(crate) csrf: String,
    /// Required of every request when set (`--token`).
    token: Option<String>,
    changes: tokio::sync::broadcast::Sender<()>,
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The CSRF secret and the token stay out of logs.
        f.debug_struct("App")
            .field("board", &self.board.name())
            .finish_non_exhaustive()
    }
}

type Shared = Arc<App>;

/// An error as the API and the pages answer it.
#[derive(Debug)]
pub(crate) struct Failure {
    status: StatusCode,
    message: String,
}

impl Failure {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }
}

impl From<BoardError> for Failure {
    fn from(error: BoardError) -> Self {
        let status = match &error {
            BoardError::TaskNotFound(_) => StatusCode::NOT_FOUND,
            BoardError::InvalidTransition { .. } | BoardError::LeaseLost { .. } => {
                StatusCode::CONFLICT
            }
            BoardError::InvalidInput(_) => StatusCode::BAD_REQUEST,
            BoardError::Busy { .. } => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Self::new(status, error.to_string())
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        (self.status, Json(json!({"error": self.message}))).into_response()
    }
}

/// True for an address only this machine reaches.
fn loopback(addr: &SocketAddr) -> bool {
    addr.ip().is_loopback()
}

/// Runs the server until SIGINT or SIGTERM.
pub(crate) fn serve(
    board: OpenBoard,
    listen: SocketAddr,
    token: Option<String>,
    interrupt: &Arc<AtomicUsize>,
) -> anyhow::Result<i32> {
    if !loopback(&listen) && token.is_none() {
        anyhow::bail!(
            "--listen {listen} is reachable from other machines: give --token TOKEN (or KANBAN_SERVE_TOKEN) so only those who know it get in, or listen on 127.0.0.1"
        );
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the server's runtime")?;
    let logs = board.folder.join("logs");
    // Pages go live on every commit: SQLite's data_version, looked at every
    // WATCH_EVERY, or PostgreSQL's notifications.
    let watch = match &board.engine {
        Engine::Sqlite(sqlite) => ChangeWatch::open(sqlite.path())
            .ok()
            .map(BoardWatch::Sqlite),
        Engine::Postgres(pg) => Some(BoardWatch::Postgres(pg.watch())),
    };
    let (changes, _) = tokio::sync::broadcast::channel(16);
    let app = Arc::new(App {
        board: board.with_offload(Arc::new(crate::runtime::TokioOffload)),
        logs,
        csrf: crate::supervisor::random_hex(),
        token,
        changes,
    });
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("cannot listen on {listen}"))?;
        let bound = listener.local_addr()?;
        // The first line says where: a test or a script reads it.
        crate::out::outln!("serving {} on http://{bound}/", app.board.name());
        if let Some(watch) = watch {
            tokio::spawn(watch_board(watch, app.changes.clone()));
        }
        let stop = interrupt.clone();
        axum::serve(listener, router(app))
            .with_graceful_shutdown(async move {
                while stop.load(Ordering::SeqCst) == 0 {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            })
            .await
            .context("the server failed")?;
        anyhow::Ok(())
    })?;
    Ok(if interrupt.load(Ordering::SeqCst) != 0 {
        130
    } else {
        0
    })
}

/// Tells every live page when anybody commits to the board.
async fn watch_board(mut watch: BoardWatch, changes: tokio::sync::broadcast::Sender<()>) {
    loop {
        tokio::time::sleep(WATCH_EVERY).await;
        if watch.changed() {
            let _ = changes.send(());
        }
    }
}

/// Every route.
pub(crate) fn router(app: Shared) -> Router {
    Router::new()
        .route("/", get(board_page))
        .route("/cards/{id}", get(card_page))
        .route("/fragments/lanes", get(lanes_fragment))
        .route("/fragments/cards/{id}", get(card_fragment))
        .route("/live", get(live))
        .route("/login", get(login))
        .route("/actions/add", post(add_form))
        .route("/actions/{id}/{action}", post(act_form))
        .route("/api/cards", get(api_cards).post(api_add))
        .route("/api/cards/{id}", get(api_card))
        .route("/api/cards/{id}/runs", get(api_runs))
        .route("/api/cards/{id}/events", get(api_events))
        .route("/api/cards/{id}/comments", get(api_comments))
        .route("/api/cards/{id}/{action}", post(api_act))
        .route("/api/walls", get(api_walls))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi))
        .layer(axum::middleware::from_fn_with_state(app.clone(), guard))
        .with_state(app)
}

/// The token check, when the server has one: `Authorization: Bearer T` or
/// the cookie `/login?token=T` sets.
async fn guard(
    State(app): State<Shared>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let Some(token) = &app.token else {
        return next.run(request).await;
    };
    if request.uri().path() == "/login" {
        return next.run(request).await;
    }
    let headers = request.headers();
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "));
    let cookie = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .find_map(|pair| pair.trim().strip_prefix("kanban_token="));
    if [bearer, cookie]
        .into_iter()
        .flatten()
        .any(|given| constant_eq(given, token))
    {
        return next.run(request).await;
    }
    Failure::new(
        StatusCode::UNAUTHORIZED,
        "this board needs its token: send `Authorization: Bearer TOKEN`, or open /login?token=TOKEN once in a browser",
    )
    .into_response()
}

/// Compares without leaking where the first difference is.
fn constant_eq(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |diff, (x, y)| diff | (x ^ y))
            == 0
}

#[derive(Deserialize)]
struct LoginQuery {
    token: String,
}

async fn login(State(app): State<Shared>, Query(query): Query<LoginQuery>) -> Response {
    match &app.token {
        Some(token) if constant_eq(&query.token, token) => (
            [(
                header::SET_COOKIE,
                format!("kanban_token={token}; HttpOnly; SameSite=Strict; Path=/"),
            )],
            Redirect::to("/"),
        )
            .into_response(),
        Some(_) => {
            Failure::new(StatusCode::UNAUTHORIZED, "that is not this board's token").into_response()
        }
        None => Redirect::to("/").into_response(),
    }
}

/// The lanes as the board page shows them.
pub(crate) struct Lanes {
    pub(crate) lanes: Vec<(TaskStatus, usize, Vec<page::CardTile>)>,
    pub(crate) walls: Vec<kanban_core::walls::Wall>,
    pub(crate) now: i64,
}

/// Runs a SQLite board's synchronous reads on the blocking pool, off the
/// workers that answer requests.
async fn read<T: Send + 'static>(
    app: &Shared,
    job: impl FnOnce(&SqliteBoard) -> Result<T, BoardError> + Send + 'static,
) -> Result<T, Failure> {
    let app = app.clone();
    tokio::task::spawn_blocking(move || match &app.board.engine {
        Engine::Sqlite(board) => job(board),
        Engine::Postgres(_) => Err(BoardError::Storage(
            "a PostgreSQL board is read without blocking".to_owned(),
        )),
    })
    .await
    .map_err(|error| Failure::new(StatusCode::INTERNAL_SERVER_ERROR, error.to_string()))?
    .map_err(Failure::from)
}

/// The lanes a page shows, each lane's count and first cards, and their
/// last events: one blocking read on SQLite, one snapshot per read on
/// PostgreSQL.
async fn lane_rows(app: &Shared) -> Result<LaneRows, Failure> {
    const SHOWN: [TaskStatus; 5] = [
        TaskStatus::Todo,
        TaskStatus::Ready,
        TaskStatus::Running,
        TaskStatus::Blocked,
        TaskStatus::Done,
    ];
    let ids = |rows: &[(TaskStatus, usize, Vec<kanban_core::TaskRecord>)]| -> Vec<String> {
        rows.iter()
            .flat_map(|(_, _, tasks)| tasks.iter().map(|task| task.id.clone()))
            .collect()
    };
    if let Engine::Postgres(board) = &app.board.engine {
        let mut rows = Vec::new();
        for status in SHOWN {
            let (count, tasks) = board.lane(status, LANE_LIMIT).await?;
            rows.push((status, count, tasks));
        }
        let last = board.last_events(&ids(&rows)).await?;
        return Ok((rows, last));
    }
    read(app, move |board| {
        let mut rows = Vec::new();
        for status in SHOWN {
            let (count, tasks) = board.lane(status, LANE_LIMIT)?;
            rows.push((status, count, tasks));
        }
        let last = board.last_events(&ids(&rows))?;
        Ok((rows, last))
    })
    .await
}

/// The lanes shown, in one blocking read: each lane's count and first
/// cards, and their last events.
type LaneRows = (
    Vec<(TaskStatus, usize, Vec<kanban_core::TaskRecord>)>,
    std::collections::HashMap<String, (String, i64)>,
);

async fn lanes(app: &Shared) -> Result<Lanes, Failure> {
    let now = SystemClock.now();
    let running = app.board.running_workers().await?;
    let (rows, mut last): LaneRows = lane_rows(app).await?;
    let lanes = rows
        .into_iter()
        .map(|(status, count, tasks)| {
            let tiles = tasks
                .into_iter()
                .map(|task| {
                    let lease_left = running
                        .iter()
                        .find(|worker| worker.claim.task_id == task.id)
                        .and_then(|worker| worker.claim_expires)
                        .map(|expires| expires - now);
                    let last_event = last.remove(&task.id);
                    page::CardTile {
                        task,
                        lease_left,
                        last_event,
                    }
                })
                .collect();
            (status, count, tiles)
        })
        .collect();
    let walls = app.board.walls().await?;
    Ok(Lanes { lanes, walls, now })
}

async fn board_page(State(app): State<Shared>) -> Result<Html<String>, Failure> {
    let lanes = lanes(&app).await?;
    Ok(Html(page::board(&app, &lanes).into_string()))
}

async fn lanes_fragment(State(app): State<Shared>) -> Result<Html<String>, Failure> {
    let lanes = lanes(&app).await?;
    Ok(Html(page::lanes(&app, &lanes).into_string()))
}

/// The last lines of a card's log, if it has one: read from its last
/// 256 KiB only (a live page refetches on every commit; a log may be 16 MiB).
fn log_tail(logs: &Path, id: &str) -> String {
    use std::io::{Read, Seek, SeekFrom};
    const TAIL_BYTES: u64 = 256 * 1024;
    let path = crate::supervisor::log_path(logs, id);
    let Ok(mut file) = std::fs::File::open(path) else {
        return String::new();
    };
    let length = file.metadata().map_or(0, |meta| meta.len());
    let from = length.saturating_sub(TAIL_BYTES);
    let mut bytes = Vec::new();
    if file.seek(SeekFrom::Start(from)).is_err() || file.read_to_end(&mut bytes).is_err() {
        return String::new();
    }
    let text = String::from_utf8_lossy(&bytes);
    // A cut start is a partial line: drop it.
    let text = if from > 0 {
        text.split_once('\n').map_or("", |(_, rest)| rest)
    } else {
        &text
    };
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
}

/// A card's page, whole or (for a live page) only its details.
async fn card_view(app: &App, id: &str, whole: bool) -> Result<Html<String>, Failure> {
    let view = app.board.show_task(id).await?;
    let tail = log_tail(&app.logs, id);
    let now = SystemClock.now();
    let markup = if whole {
        page::card(app, &view, &tail, now)
    } else {
        page::card_details(app, &view, &tail, now)
    };
    Ok(Html(markup.into_string()))
}

async fn card_page(
    State(app): State<Shared>,
    UrlPath(id): UrlPath<String>,
) -> Result<Html<String>, Failure> {
    card_view(&app, &id, true).await
}

async fn card_fragment(
    State(app): State<Shared>,
    UrlPath(id): UrlPath<String>,
) -> Result<Html<String>, Failure> {
    card_view(&app, &id, false).await
}

/// Server-sent events: `changed` whenever anybody commits to the board.
async fn live(
    State(app): State<Shared>,
) -> Sse<impl futures_util::Stream<Item = Result<Event, std::convert::Infallible>>> {
    let receiver = app.changes.subscribe();
    let stream = futures_util::stream::unfold(receiver, |mut receiver| async move {
        // A page that lagged behind only needs to know the board changed.
        match receiver.recv().await {
            Ok(()) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => Some((
                Ok(Event::default().event("changed").data("board")),
                receiver,
            )),
            Err(tokio::sync::broadcast::error::RecvError::Closed) => None,
        }
    });
    Sse::new(stream).keep_alive(KeepAlive::default())
}

/// An action's form: the CSRF token and what the action needs.
#[derive(Deserialize)]
struct ActionForm {
    csrf: String,
    #[serde(default)]
    text: String,
    #[serde(default)]
    reason: String,
}

#[derive(Deserialize)]
struct AddForm {
    csrf: String,
    title: String,
    #[serde(default)]
    body: String,
    #[serde(default)]
    assignee: String,
    #[serde(default)]
    priority: String,
}

fn check_csrf(app: &App, given: &str) -> Result<(), Failure> {
    if constant_eq(given, &app.csrf) {
        Ok(())
    } else {
        Err(Failure::new(
            StatusCode::FORBIDDEN,
            "this form is stale or not from this board (CSRF check): reload the page and try again",
        ))
    }
}

fn non_blank(text: &str) -> Option<String> {
    Some(text.trim().to_owned()).filter(|text| !text.is_empty())
}

async fn add_form(
    State(app): State<Shared>,
    Form(form): Form<AddForm>,
) -> Result<Redirect, Failure> {
    check_csrf(&app, &form.csrf)?;
    let priority = match form.priority.trim() {
        "" => 0,
        raw => raw.parse().map_err(|_| {
            Failure::new(
                StatusCode::BAD_REQUEST,
                format!("priority {raw:?} is not a whole number"),
            )
        })?,
    };
    let id = app
        .board
        .create_task(&NewTask {
            title: form.title,
            body: non_blank(&form.body),
            assignee: non_blank(&form.assignee),
            priority,
            ..NewTask::default()
        })
        .await?;
    Ok(Redirect::to(&format!("/cards/{id}")))
}

/// Applies one operator action to a card: the same board operations as the CLI.
async fn act(app: &App, id: &str, action: &str, text: &str, reason: &str) -> Result<(), Failure> {
    let reason = non_blank(reason).unwrap_or_else(|| format!("{action} from the web board"));
    match action {
        "comment" => app.board.add_comment(id, "web", text).await?,
        "unblock" => app.board.unblock(id).await?,
        "reclaim" => app.board.reclaim(id, &reason).await?,
        "hold" => app.board.hold(id, &reason).await?,
        "release" => app.board.release_hold(id).await?,
        "cancel" => app.board.cancel(id, &reason).await?,
        other => {
            return Err(Failure::new(
                StatusCode::NOT_FOUND,
                format!("no action {other:?}: comment, unblock, reclaim, hold, release, cancel"),
            ));
        }
    }
    Ok(())
}

async fn act_form(
    State(app): State<Shared>,
    UrlPath((id, action)): UrlPath<(String, String)>,
    Form(form): Form<ActionForm>,
) -> Result<Redirect, Failure> {
    check_csrf(&app, &form.csrf)?;
    act(&app, &id, &action, &form.text, &form.reason).await?;
    Ok(Redirect::to(&format!("/cards/{id}")))
}

/// A JSON write must say it is JSON: a page of another site cannot send
/// that without the browser asking first, which this server never allows.
fn check_json(headers: &HeaderMap) -> Result<(), Failure> {
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with("application/json"));
    if json {
        Ok(())
    } else {
        Err(Failure::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "send the request body as JSON (Content-Type: application/json)",
        ))
    }
}

#[derive(Deserialize)]
struct StatusQuery {
    status: Option<String>,
}

async fn api_cards(
    State(app): State<Shared>,
    Query(query): Query<StatusQuery>,
) -> Result<Json<Value>, Failure> {
    let status = match query.status.as_deref() {
        None => None,
        Some(raw) => Some(TaskStatus::parse(raw).ok_or_else(|| {
            Failure::new(StatusCode::BAD_REQUEST, format!("unknown status {raw:?}"))
        })?),
    };
    let tasks = app.board.list_tasks(status).await?;
    Ok(Json(Value::Array(tasks.iter().map(task_json).collect())))
}

async fn api_card(
    State(app): State<Shared>,
    UrlPath(id): UrlPath<String>,
) -> Result<Json<Value>, Failure> {
    let view = app.board.show_task(&id).await?;
    Ok(Json(json!({
        "task": task_json(&view.task),
        "runs": view.runs.iter().map(run_json).collect::<Vec<_>>(),
        "events": view.events.iter().map(event_json).collect::<Vec<_>>(),
        "comments": view.comments,
    })))
}

async fn api_runs(
    State(app): State<Shared>,
    UrlPath(id): UrlPath<String>,
) -> Result<Json<Value>, Failure> {
    let view = app.board.show_task(&id).await?;
    Ok(Json(Value::Array(view.runs.iter().map(run_json).collect())))
}

async fn api_events(
    State(app): State<Shared>,
    UrlPath(id): UrlPath<String>,
) -> Result<Json<Value>, Failure> {
    let view = app.board.show_task(&id).await?;
    Ok(Json(Value::Array(
        view.events.iter().map(event_json).collect(),
    )))
}

async fn api_comments(
    State(app): State<Shared>,
    UrlPath(id): UrlPath<String>,
) -> Result<Json<Value>, Failure> {
    let view = app.board.show_task(&id).await?;
    Ok(Json(json!(view.comments)))
}

async fn api_walls(State(app): State<Shared>) -> Result<Json<Value>, Failure> {
    let now = SystemClock.now();
    let walls = app.board.walls().await?;
    Ok(Json(Value::Array(
        walls
            .iter()
            .map(|wall| crate::admin::wall_json(wall, now))
            .collect(),
    )))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewCard {
    title: String,
    body: Option<String>,
    assignee: Option<String>,
    #[serde(default)]
    priority: i64,
    #[serde(default)]
    parents: Vec<String>,
}

async fn api_add(
    State(app): State<Shared>,
    headers: HeaderMap,
    body: String,
) -> Result<(StatusCode, Json<Value>), Failure> {
    check_json(&headers)?;
    let card: NewCard = serde_json::from_str(&body)
        .map_err(|error| Failure::new(StatusCode::BAD_REQUEST, format!("bad card: {error}")))?;
    let id = app
        .board
        .create_task(&NewTask {
            title: card.title,
            body: card.body,
            assignee: card.assignee,
            priority: card.priority,
            parents: card.parents,
            ..NewTask::default()
        })
        .await?;
    Ok((StatusCode::CREATED, Json(json!({"id": id}))))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ActionBody {
    #[serde(default)]
    text: String,
    #[serde(default)]
    reason: String,
}

async fn api_act(
    State(app): State<Shared>,
    UrlPath((id, action)): UrlPath<(String, String)>,
    headers: HeaderMap,
    body: String,
) -> Result<Json<Value>, Failure> {
    check_json(&headers)?;
    let request: ActionBody = if body.trim().is_empty() {
        ActionBody::default()
    } else {
        serde_json::from_str(&body).map_err(|error| {
            Failure::new(StatusCode::BAD_REQUEST, format!("bad action: {error}"))
        })?
    };
    act(&app, &id, &action, &request.text, &request.reason).await?;
    Ok(Json(json!({"ok": true})))
}

async fn openapi() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        include_str!("../../docs/openapi.json"),
    )
        .into_response()
}

async fn metrics(State(app): State<Shared>) -> Result<Response, Failure> {
    let stats = match &app.board.engine {
        Engine::Postgres(board) => board.stats().await?,
        Engine::Sqlite(_) => read(&app, SqliteBoard::stats).await?,
    };
    let text = crate::metrics::render(&stats)
        .map_err(|error| Failure::new(StatusCode::INTERNAL_SERVER_ERROR, error.to_string()))?;
    Ok((
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response())
}

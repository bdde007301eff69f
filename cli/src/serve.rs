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
use axum::extract::rejection::{FormRejection, QueryRejection};
use axum::extract::{Form, Path as UrlPath, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use kanban_board_sqlite::{ChangeWatch, SystemClock};

use crate::board_path::{Engine, OpenBoard};
use crate::supervisor::BoardWatch;
use kanban_core::ExitCode;
use kanban_core::notify::{self, NewSubscription, NotifyScope};
use kanban_core::{BoardError, Clock, NewTask, TaskStatus};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::output::{event_json, run_json, task_json};
use crate::serve_board::{BoardQuery, EditFields};
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
    /// The board's attachments folder on this host: only files in it are served.
    pub(crate) attachments: PathBuf,
    /// Put in every form; a POST without it is refused (a page of another
    /// site cannot read it).
    pub(crate) csrf: String,
    /// Required of every request when set (`--token`).
    token: Option<String>,
    changes: tokio::sync::broadcast::Sender<()>,
    /// Live pages held at once: each holds a connection for as long as it
    /// is open, so they may take only part of the server's.
    live_pages: Arc<tokio::sync::Semaphore>,
    /// Log streams held at once, apart from the live pages: a page that
    /// follows a log holds both.
    log_streams: Arc<tokio::sync::Semaphore>,
    /// The agents file, read again for each page that lists its agents.
    pub(crate) agents: Option<PathBuf>,
    /// The agents file did not load the last time a page read it (said
    /// once a breakage).
    pub(crate) agents_broken: std::sync::atomic::AtomicBool,
    /// The environment the server was started in: the agents file's
    /// `${VAR}`s, and git's for a workspace taken away.
    pub(crate) env: kanban_core::Environment,
    /// Where this board's pages are: `""` for the board the server was
    /// started for, `/boards/SLUG` for another board of the kanban home.
    pub(crate) base: String,
    /// Every board the server serves, for the switcher in each page.
    pub(crate) boards: Arc<Vec<BoardLink>>,
}

/// A board the server serves, as the switcher lists it.
#[derive(Debug, Clone)]
pub(crate) struct BoardLink {
    pub(crate) slug: String,
    pub(crate) name: String,
    /// Its board page.
    pub(crate) href: String,
}

impl App {
    /// This board's page.
    pub(crate) fn home(&self) -> &str {
        if self.base.is_empty() {
            "/"
        } else {
            &self.base
        }
    }

    /// A path of this board's pages or API (`path` starts with `/`).
    pub(crate) fn at(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
}

/// Live pages (`/live` streams) a server holds at once.
const LIVE_PAGES: usize = crate::serve_net::MAX_CONNECTIONS / 4;
/// Log streams (`/cards/ID/log`) a server holds at once.
const LOG_STREAMS: usize = LIVE_PAGES / 2;

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
    /// What it says.
    pub(crate) fn message(&self) -> &str {
        &self.message
    }

    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> Self {
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

/// The server's token: from `--token` (or `KANBAN_SERVE_TOKEN`) or from
/// `--token-file`. A blank one is refused, never taken as "no token"; so
/// is a file other users may read.
pub(crate) fn serve_token(
    given: Option<String>,
    file: Option<&Path>,
    env: &kanban_core::Environment,
) -> anyhow::Result<Option<String>> {
    let from_env = given.is_some() && env.get(TOKEN_VAR) == given.as_deref();
    if from_env && given.as_deref().is_some_and(str::is_empty) {
        anyhow::bail!(
            "{TOKEN_VAR} is set but empty: give it a token (`openssl rand -hex 16`), or unset it"
        );
    }
    let (token, source) = match (given, file) {
        (Some(token), _) if from_env => (token, TOKEN_VAR.to_owned()),
        (Some(token), _) => (token, "--token".to_owned()),
        (None, Some(path)) => (read_token_file(path)?, path.display().to_string()),
        (None, None) => return Ok(None),
    };
    let token = token.trim().to_owned();
    if token.is_empty() {
        anyhow::bail!(
            "{source}: the token is empty; give one nobody can guess (`openssl rand -hex 16`)"
        );
    }
    if token
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || c == ';')
    {
        anyhow::bail!(
            "{source}: the token holds a space, a control character or `;`, which a header or a cookie cannot carry; use letters and digits (`openssl rand -hex 16`)"
        );
    }
    Ok(Some(token))
}

/// The variable a token may come from.
const TOKEN_VAR: &str = "KANBAN_SERVE_TOKEN";

/// The first line of an owner-only token file.
fn read_token_file(path: &Path) -> anyhow::Result<String> {
    use std::os::unix::fs::MetadataExt as _;
    let meta = std::fs::metadata(path)
        .with_context(|| format!("--token-file {}: cannot read it", path.display()))?;
    if meta.mode() & 0o077 != 0 {
        anyhow::bail!(
            "--token-file {}: other users may read it (mode {:o}); run `chmod 600 {}`",
            path.display(),
            meta.mode() & 0o777,
            path.display()
        );
    }
    if meta.uid() != nix::unistd::geteuid().as_raw() {
        anyhow::bail!(
            "--token-file {}: it belongs to another user; keep the token in a file of your own",
            path.display()
        );
    }
    let bytes = std::fs::read(path)
        .with_context(|| format!("--token-file {}: cannot read it", path.display()))?;
    let text = String::from_utf8(bytes)
        .map_err(|_| anyhow::anyhow!("--token-file {}: the token is not text", path.display()))?;
    Ok(text.lines().next().unwrap_or("").to_owned())
}

/// True for an address only this machine reaches.
fn loopback(addr: &SocketAddr) -> bool {
    addr.ip().is_loopback()
}

/// Where a server finds what is beside its board.
pub(crate) struct Places {
    /// The board's attachments folder on this host.
    pub(crate) attachments: PathBuf,
    /// The agents file, if there is one.
    pub(crate) agents: Option<PathBuf>,
    pub(crate) env: kanban_core::Environment,
}

/// A board a server serves: the board, what is beside it, and its slug in
/// the kanban home (none for a board named by `--db`).
pub(crate) struct ServedBoard {
    pub(crate) board: OpenBoard,
    pub(crate) places: Places,
    pub(crate) slug: Option<String>,
    /// What the switcher calls it.
    pub(crate) title: String,
}

/// The boards `kanban serve` serves: the board the command means first;
/// then, when that is a board of the kanban home (no `--db`), every other
/// board there that is not archived, so a page can switch to it. A board
/// that does not open is left out and said so.
pub(crate) fn served_boards(
    global: &crate::args::GlobalArgs,
    env: &kanban_core::Environment,
) -> anyhow::Result<(ServedBoard, Vec<ServedBoard>)> {
    let open = |global: &crate::args::GlobalArgs, slug: Option<String>, title: String| {
        let board = crate::board_path::open_board(global, env)?;
        let places = Places {
            attachments: crate::attach::board_attachments_root(global, env, &board)?,
            agents: crate::agents_file::agents_file_path(global.agents.as_deref(), &board.folder),
            env: env.clone(),
        };
        anyhow::Ok(ServedBoard {
            board,
            places,
            slug,
            title,
        })
    };
    let named_by_path = global.db.is_some() || env.get_trimmed(kanban_core::vars::DB).is_some();
    let home = crate::board_path::home(env).ok().filter(|_| !named_by_path);
    let Some(home) = home else {
        let board = open(global, None, String::new())?;
        let title = board.board.name();
        return Ok((ServedBoard { title, ..board }, Vec::new()));
    };
    let title = |slug: &str| {
        home.metadata(slug).map_or_else(
            |_| crate::home::display_name(slug),
            |metadata| metadata.name(slug),
        )
    };
    let slug = crate::board_path::board_slug(global, env)?;
    let first = open(global, Some(slug.clone()), title(&slug))?;
    let mut others = Vec::new();
    for other in home.slugs().into_iter().filter(|other| *other != slug) {
        let archived = home.metadata(&other).is_ok_and(|metadata| {
            metadata
                .fields
                .get("archived")
                .and_then(serde_json::Value::as_bool)
                == Some(true)
        });
        if archived {
            continue;
        }
        let global = crate::args::GlobalArgs {
            board: Some(other.clone()),
            ..global.clone()
        };
        match open(&global, Some(other.clone()), title(&other)) {
            Ok(board) => others.push(board),
            Err(error) => crate::out::errln!(
                "board {other:?} is not served, since it does not open: {error:#}"
            ),
        }
    }
    Ok((first, others))
}

/// Runs the server until SIGINT or SIGTERM: `first` at `/`, each of
/// `others` (the other boards of the kanban home) at `/boards/SLUG`.
pub(crate) fn serve(
    first: ServedBoard,
    others: Vec<ServedBoard>,
    listen: SocketAddr,
    token: Option<String>,
    interrupt: &Arc<AtomicUsize>,
) -> anyhow::Result<ExitCode> {
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
    let boards: Vec<BoardLink> = std::iter::once(&first)
        .chain(&others)
        .enumerate()
        .map(|(at, served)| {
            let slug = served.slug.clone().unwrap_or_default();
            BoardLink {
                name: served.title.clone(),
                href: if at == 0 {
                    "/".to_owned()
                } else {
                    format!("/boards/{slug}")
                },
                slug,
            }
        })
        .collect();
    let boards = Arc::new(boards);
    let shared = Limits {
        live_pages: Arc::new(tokio::sync::Semaphore::new(LIVE_PAGES)),
        log_streams: Arc::new(tokio::sync::Semaphore::new(LOG_STREAMS)),
        csrf: crate::supervisor::random_hex(),
        token,
        boards,
    };
    let mut watches = Vec::new();
    let app = served_app(first, String::new(), &shared, &mut watches);
    // Each other board's pages are where the switcher links it.
    let bases: Vec<String> = shared.boards[1..]
        .iter()
        .map(|board| board.href.clone())
        .collect();
    let others: Vec<Shared> = others
        .into_iter()
        .zip(bases)
        .map(|(served, base)| served_app(served, base, &shared, &mut watches))
        .collect();
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("cannot listen on {listen}"))?;
        let bound = listener.local_addr()?;
        // The first line says where: a test or a script reads it.
        crate::out::outln!("serving {} on http://{bound}/", app.board.name());
        for (watch, changes) in watches {
            tokio::spawn(watch_board(watch, changes));
        }
        let mut routes = router(app);
        for other in others {
            routes = routes.nest(&other.base.clone(), router(other));
        }
        let stop = interrupt.clone();
        crate::serve_net::serve(listener, routes, async move {
            while stop.load(Ordering::SeqCst) == 0 {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await;
        anyhow::Ok(())
    })?;
    Ok(if interrupt.load(Ordering::SeqCst) != 0 {
        ExitCode::Interrupted
    } else {
        ExitCode::Success
    })
}

/// What the boards of one server share: their limits, the secrets a
/// request shows, and the list of boards.
struct Limits {
    live_pages: Arc<tokio::sync::Semaphore>,
    log_streams: Arc<tokio::sync::Semaphore>,
    csrf: String,
    token: Option<String>,
    boards: Arc<Vec<BoardLink>>,
}

/// The state of one served board's pages at `base`; how its commits are
/// seen goes to `watches`.
fn served_app(
    served: ServedBoard,
    base: String,
    shared: &Limits,
    watches: &mut Vec<(BoardWatch, tokio::sync::broadcast::Sender<()>)>,
) -> Shared {
    let ServedBoard { board, places, .. } = served;
    let Places {
        attachments,
        agents,
        env,
    } = places;
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
    if let Some(watch) = watch {
        watches.push((watch, changes.clone()));
    }
    Arc::new(App {
        board: board.with_offload(Arc::new(crate::runtime::TokioOffload)),
        logs,
        attachments,
        csrf: shared.csrf.clone(),
        token: shared.token.clone(),
        changes,
        live_pages: shared.live_pages.clone(),
        log_streams: shared.log_streams.clone(),
        agents,
        agents_broken: std::sync::atomic::AtomicBool::new(false),
        env,
        base,
        boards: shared.boards.clone(),
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
        .route("/cards/{id}/attachments/{attachment}", get(attachment_file))
        .route("/fragments/lanes", get(lanes_fragment))
        .route("/fragments/cards/{id}", get(card_fragment))
        .route("/live", get(live))
        .route("/cards/{id}/log", get(log_stream))
        .route(
            "/api/cards/{id}/attachments",
            post(crate::serve_upload::api_upload),
        )
        .route("/login", get(login))
        .route("/switch", get(switch_board))
        .route("/actions/add", post(add_form))
        .route("/actions/bulk", post(bulk_form))
        .route("/actions/lift-wall", post(lift_wall_form))
        .route("/walls", get(walls_page))
        .route("/notifications", get(notifications_page))
        .route("/actions/notify", post(notify_form))
        .route("/actions/unnotify", post(unnotify_form))
        .route("/diagnostics", get(diagnostics_page))
        .route("/actions/{id}/{action}", post(act_form))
        .route("/api/cards", get(api_cards).post(api_add))
        .route("/api/cards/{id}", get(api_card))
        .route("/api/cards/{id}/runs", get(api_runs))
        .route("/api/cards/{id}/events", get(api_events))
        .route("/api/cards/{id}/comments", get(api_comments))
        .route("/api/cards/{id}/edit", post(api_edit))
        .route("/api/cards/{id}/{action}", post(api_act))
        .route("/api/walls", get(api_walls))
        .route("/api/bulk", post(api_bulk))
        .route("/api/walls/lift", post(api_lift_wall))
        .route("/api/diagnostics", get(api_diagnostics))
        .route(
            "/api/notifications",
            get(api_notifications).post(api_subscribe),
        )
        .route("/api/notifications/{id}/unsubscribe", post(api_unsubscribe))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi))
        .route("/assets/{name}", get(asset))
        .fallback(no_such_page)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(app.clone(), guard))
        .layer(axum::middleware::from_fn(secure_headers))
        .with_state(app)
}

/// Every request's gate: without a token, only pages this machine named
/// (a `Host` of loopback: a page of another site that made its own name
/// point here, DNS rebinding, names itself); writes only from this board's
/// own pages (`Origin`); with a token, only those who send it
/// (`Authorization: Bearer T`, or the cookie `/login?token=T` sets).
async fn guard(
    State(app): State<Shared>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let headers = request.headers();
    if app.token.is_none()
        && let Some(host) = headers.get(header::HOST)
        && !host.to_str().is_ok_and(loopback_host)
    {
        return Failure::new(
            StatusCode::FORBIDDEN,
            "this board answers only to a loopback name (localhost, 127.0.0.1, [::1]); to reach it by another name, serve it with --token",
        )
        .into_response();
    }
    if request.method() != axum::http::Method::GET
        && request.method() != axum::http::Method::HEAD
        && !same_origin(headers)
    {
        return Failure::new(
            StatusCode::FORBIDDEN,
            "a write must come from this board's own pages (its Origin is another site's)",
        )
        .into_response();
    }
    let Some(token) = &app.token else {
        return next.run(request).await;
    };
    if request.uri().path() == "/login" {
        return next.run(request).await;
    }
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.trim().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim());
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

/// True for a `Host` naming this machine: `localhost` (or a name under
/// it), an IPv4 loopback address or `[::1]`, with or without a port.
fn loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(bracketed) => match bracketed.split_once(']') {
            Some((address, "")) => address,
            Some((address, port)) if port.strip_prefix(':').is_some_and(valid_port) => address,
            _ => return false,
        },
        None => match host.rsplit_once(':') {
            Some((name, port)) if valid_port(port) => name,
            Some(_) => return false,
            None => host,
        },
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    name == "localhost"
        || name.ends_with(".localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|address| address.is_loopback())
}

fn valid_port(digits: &str) -> bool {
    !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && digits.parse::<u16>().is_ok()
}

/// True unless the request names an origin other than the server's own
/// (`Origin` against `Host`). A client that is not a browser sends none.
fn same_origin(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN) else {
        return true;
    };
    let host = headers
        .get(header::HOST)
        .and_then(|host| host.to_str().ok());
    match (origin.to_str().ok(), host) {
        (Some(origin), Some(host)) => origin
            .strip_prefix("http://")
            .is_some_and(|authority| authority.eq_ignore_ascii_case(host)),
        _ => false,
    }
}

/// What every answer carries: no framing by other sites, no guessing of
/// content types, and only this server's own scripts and styles.
async fn secure_headers(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    // An attached file's own, stricter policy (a sandbox) stays.
    headers
        .entry(header::CONTENT_SECURITY_POLICY)
        .or_insert(header::HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ));
    headers.insert(
        header::X_FRAME_OPTIONS,
        header::HeaderValue::from_static("DENY"),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        header::HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        header::HeaderValue::from_static("same-origin"),
    );
    response
}

async fn no_such_page(uri: axum::http::Uri) -> Failure {
    Failure::new(
        StatusCode::NOT_FOUND,
        format!("no page {}: see /openapi.json for the API", uri.path()),
    )
}

async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> Failure {
    Failure::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{} takes no {method}: see /openapi.json", uri.path()),
    )
}

/// The page's style and script, served as files so that the content
/// security policy allows no inline code.
async fn asset(UrlPath(name): UrlPath<String>) -> Result<Response, Failure> {
    let (body, media) = match name.as_str() {
        "board.css" => (page::STYLE, "text/css; charset=utf-8"),
        "board.js" => (page::SCRIPT, "text/javascript; charset=utf-8"),
        _ => {
            return Err(Failure::new(
                StatusCode::NOT_FOUND,
                format!("no asset {name:?}"),
            ));
        }
    };
    Ok(([(header::CONTENT_TYPE, media)], body).into_response())
}

/// Compares without leaking where the first difference is (only whether
/// the lengths differ), in a way the optimiser may not shorten.
fn constant_eq(a: &str, b: &str) -> bool {
    use subtle::ConstantTimeEq;
    a.as_bytes().ct_eq(b.as_bytes()).into()
}

/// The board a page's switcher picked.
#[derive(Deserialize)]
struct SwitchQuery {
    board: String,
}

/// To the page of the board the switcher picked.
async fn switch_board(
    State(app): State<Shared>,
    query: Result<Query<SwitchQuery>, QueryRejection>,
) -> Result<Redirect, Failure> {
    let query = query_of(query)?;
    app.boards
        .iter()
        .find(|board| board.slug == query.board)
        .map(|board| Redirect::to(&board.href))
        .ok_or_else(|| {
            Failure::new(
                StatusCode::NOT_FOUND,
                format!(
                    "no board {:?} is served here: kanban boards lists the home's boards, and a board made after kanban serve started is served once it starts again",
                    query.board
                ),
            )
        })
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
            Redirect::to(app.home()),
        )
            .into_response(),
        Some(_) => {
            Failure::new(StatusCode::UNAUTHORIZED, "that is not this board's token").into_response()
        }
        None => Redirect::to(app.home()).into_response(),
    }
}

/// The lanes as the board page shows them.
pub(crate) struct Lanes {
    /// Each lane's name (a status, or [`OTHER_LANE`]), count and cards.
    pub(crate) lanes: Vec<(String, LaneCount, Vec<page::CardTile>)>,
    pub(crate) walls: Vec<kanban_core::walls::Wall>,
    pub(crate) now: i64,
    /// What the page's URL asked for.
    pub(crate) query: BoardQuery,
    /// The page of the lane shown alone, from 1.
    pub(crate) page: usize,
    /// When the board's last event was written.
    pub(crate) last_activity: Option<i64>,
    /// Cards running now, on every host.
    pub(crate) running: usize,
    /// What each host's dispatcher last said of itself.
    pub(crate) dispatchers: Vec<kanban_board::DispatcherSeen>,
}

/// How many cards a lane holds, as far as a view counts
/// ([`kanban_board::LANE_WINDOW`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct LaneCount {
    /// The lane's cards (filtered: those of its first window that match).
    pub(crate) count: usize,
    /// The lane holds more than the window: counted, and searched, no further.
    pub(crate) more: bool,
}

/// The lanes a page shows, each lane's count and first cards, and their
/// last events.
async fn lane_rows(
    app: &Shared,
    query: &BoardQuery,
    walls: &[kanban_core::walls::Wall],
) -> Result<LaneRows, Failure> {
    // The seed system's columns, in its order; archived cards only in the
    // API and on their own pages.
    const SHOWN: [TaskStatus; 8] = crate::report::LANES;
    let ids = |rows: &[(String, LaneCount, Vec<kanban_core::TaskRecord>)]| -> Vec<String> {
        rows.iter()
            .flat_map(|(_, _, tasks)| tasks.iter().map(|task| task.id.clone()))
            .collect()
    };
    // Cards of statuses this build does not know get a lane of their own,
    // shown only when there are some.
    let other = |rows: &mut Vec<(String, LaneCount, Vec<kanban_core::TaskRecord>)>,
                 page: kanban_board::LanePage| {
        if page.count > 0 {
            let count = LaneCount {
                count: page.count,
                more: page.more,
            };
            rows.push((OTHER_LANE.to_owned(), count, page.cards));
        }
    };
    let board = &app.board;
    let mut filter = query.filter()?;
    if let Some(wall) = query.wall(walls)? {
        filter.assignees = crate::serve_board::walled_assignees(app, wall)?;
    }
    let alone = query.lane()?;
    let skip = crate::serve_board::skipped(query.page()?);
    let shown = |lane: &str| alone.as_deref().is_none_or(|alone| alone == lane);
    let mut rows = Vec::new();
    for status in SHOWN.into_iter().filter(|status| shown(status.as_str())) {
        let lane = kanban_board::Lane::Status(status);
        let page = board.lane_page(lane, &filter, LANE_LIMIT, skip).await?;
        let count = LaneCount {
            count: page.count,
            more: page.more,
        };
        rows.push((status.as_str().to_owned(), count, page.cards));
    }
    if shown(OTHER_LANE) {
        let lane = kanban_board::Lane::Unknown;
        other(
            &mut rows,
            board.lane_page(lane, &filter, LANE_LIMIT, skip).await?,
        );
    }
    let last = board.last_events(&ids(&rows)).await?;
    Ok((rows, last))
}

/// The lane of cards whose status this build does not know.
pub(crate) const OTHER_LANE: &str = "other";

/// The lanes shown: each lane's count and first cards, and their last
/// events.
type LaneRows = (
    Vec<(String, LaneCount, Vec<kanban_core::TaskRecord>)>,
    std::collections::HashMap<String, (String, i64)>,
);

async fn lanes(app: &Shared, query: BoardQuery) -> Result<Lanes, Failure> {
    let now = SystemClock.now();
    let running = app.board.running_workers().await?;
    let kanban_board::BoardHealth {
        walls,
        last_activity,
        dispatchers,
    } = app.board.health().await?;
    let (rows, mut last): LaneRows = lane_rows(app, &query, &walls).await?;
    let page = query.page()?;
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
    Ok(Lanes {
        lanes,
        walls,
        now,
        query,
        page,
        last_activity,
        running: running.len(),
        dispatchers,
    })
}

/// A URL's query, or the documented error for one that is not.
pub(crate) fn query_of<T>(given: Result<Query<T>, QueryRejection>) -> Result<T, Failure> {
    given
        .map(|Query(query)| query)
        .map_err(|rejection| Failure::new(StatusCode::BAD_REQUEST, rejection.body_text()))
}

async fn board_page(
    State(app): State<Shared>,
    query: Result<Query<BoardQuery>, QueryRejection>,
) -> Result<Html<String>, Failure> {
    let lanes = lanes(&app, query_of(query)?).await?;
    let agents = crate::serve_board::listed_agents(&app);
    Ok(Html(page::board(&app, &lanes, &agents).into_string()))
}

async fn lanes_fragment(
    State(app): State<Shared>,
    query: Result<Query<BoardQuery>, QueryRejection>,
) -> Result<Html<String>, Failure> {
    let lanes = lanes(&app, query_of(query)?).await?;
    Ok(Html(page::lanes(&app, &lanes).into_string()))
}

/// The last whole lines of a card's log, if it has one, and the byte of
/// the log just after them (where a stream of what follows starts): read
/// from its last 256 KiB only (a live page refetches on every commit; a
/// log may be 16 MiB). A line still being written is left to the stream.
fn log_tail(logs: &Path, id: &str) -> (String, u64) {
    use std::io::{Read, Seek, SeekFrom};
    const TAIL_BYTES: u64 = 256 * 1024;
    let Some(mut file) = open_log(&crate::supervisor::readable_log(logs, id)) else {
        return (String::new(), 0);
    };
    let length = file.metadata().map_or(0, |meta| meta.len());
    let from = length.saturating_sub(TAIL_BYTES);
    let mut bytes = Vec::new();
    if file.seek(SeekFrom::Start(from)).is_err() || file.read_to_end(&mut bytes).is_err() {
        return (String::new(), 0);
    }
    let whole = whole_lines(&bytes, false);
    bytes.truncate(whole);
    let text = log_text(&bytes);
    // A cut start is a partial line: drop it.
    let text = if from > 0 {
        text.split_once('\n').map_or("", |(_, rest)| rest)
    } else {
        &text
    };
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n");
    (tail, from + whole as u64)
}

/// A log opened for reading, never through a link: a log is the worker's
/// file in the logs folder, and a link there points anywhere.
fn open_log(path: &Path) -> Option<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)
        .ok()
}

/// How many of `bytes` are whole lines (up to the last line end, `\n` or
/// a `\r` that is not the last byte: a `\r\n` may be cut in two). With
/// `forced`, a read that holds no line end at all is taken whole, short
/// of a character cut at its end.
fn whole_lines(bytes: &[u8], forced: bool) -> usize {
    let ends = bytes
        .iter()
        .enumerate()
        .rev()
        .find(|(at, byte)| **byte == b'\n' || (**byte == b'\r' && at + 1 < bytes.len()));
    match ends {
        Some((end, _)) => end + 1,
        None if forced => utf8_whole(bytes),
        None => 0,
    }
}

/// How many of `bytes` end on a whole UTF-8 character: a character whose
/// last bytes are still to come waits for them.
fn utf8_whole(bytes: &[u8]) -> usize {
    let Some(start) = (bytes.len().saturating_sub(4)..bytes.len())
        .rev()
        .find(|at| bytes[*at] & 0xC0 != 0x80)
    else {
        return bytes.len();
    };
    let wants = match bytes[start] {
        lead if lead >= 0xF0 => 4,
        lead if lead >= 0xE0 => 3,
        lead if lead >= 0xC0 => 2,
        _ => 1,
    };
    if start + wants > bytes.len() {
        start
    } else {
        bytes.len()
    }
}

/// A log's bytes as the page shows them: every line end a `\n` (a
/// progress bar's `\r` too), bytes that are not UTF-8 replaced.
fn log_text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes)
        .replace("\r\n", "\n")
        .replace('\r', "\n")
}

/// The status of each card a card waits for or is waited for by, by id;
/// `gone` for a card no longer on the board.
pub(crate) async fn linked_statuses(
    board: &OpenBoard,
    view: &kanban_core::TaskView,
) -> Result<std::collections::BTreeMap<String, String>, BoardError> {
    let mut statuses = std::collections::BTreeMap::new();
    for id in view.parents.iter().chain(&view.children) {
        let status = match board.show_task(id).await {
            Ok(card) => card.task.status.as_str().to_owned(),
            Err(BoardError::TaskNotFound(_)) => "gone".to_owned(),
            Err(other) => return Err(other),
        };
        statuses.insert(id.clone(), status);
    }
    Ok(statuses)
}

/// A card's page, whole or (for a live page) only its details.
async fn card_view(app: &App, id: &str, whole: bool) -> Result<Html<String>, Failure> {
    let view = app.board.show_task(id).await?;
    let linked = linked_statuses(&app.board, &view).await?;
    let (tail, log_end) = log_tail(&app.logs, id);
    let now = SystemClock.now();
    let mut subscriptions = app.board.subscriptions().await?;
    subscriptions.retain(|sub| sub.scope == "card" && sub.target.as_deref() == Some(id));
    for sub in &mut subscriptions {
        sub.address = notify::shown_address(&sub.channel, &sub.address);
    }
    let agents = crate::serve_board::listed_agents(app);
    let parts = page::CardParts {
        view: &view,
        linked: &linked,
        log_tail: &tail,
        log_end,
        subscriptions: &subscriptions,
        agents: &agents,
    };
    let markup = if whole {
        page::card(app, &parts, now)
    } else {
        page::card_details(app, &parts, now)
    };
    Ok(Html(markup.into_string()))
}

/// Content types a browser may show in the page's place; any other file is
/// only ever downloaded, so no attached HTML or SVG runs as this site.
const SHOWN_INLINE: [&str; 6] = [
    "image/png",
    "image/jpeg",
    "image/gif",
    "image/webp",
    "application/pdf",
    "text/plain",
];

/// One attached file, streamed: only a file inside the board's attachments
/// folder, with a content type that cannot run as this site.
async fn attachment_file(
    State(app): State<Shared>,
    UrlPath((id, attachment)): UrlPath<(String, i64)>,
) -> Result<Response, Failure> {
    let files = app.board.attachments(Some(&id)).await?;
    let missing = || {
        Failure::new(
            StatusCode::NOT_FOUND,
            format!("{id} has no attachment #{attachment}"),
        )
    };
    let record = files
        .into_iter()
        .find(|file| file.id == attachment)
        .ok_or_else(missing)?;
    let path = crate::attach::kept_file(&app.attachments, &record).ok_or_else(|| {
        Failure::new(
            StatusCode::NOT_FOUND,
            format!("attachment #{attachment}'s file is not in its card's attachments folder"),
        )
    })?;
    // Opened without following a link, and checked on the open file: a
    // file swapped for a link since the check is not served.
    let file = tokio::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(&path)
        .await
        .map_err(|_| missing())?;
    if !file.metadata().await.is_ok_and(|meta| meta.is_file()) {
        return Err(missing());
    }
    let kind = record.content_type.as_deref().unwrap_or("");
    let inline = SHOWN_INLINE.contains(&kind);
    let content_type = match kind {
        "text/plain" => "text/plain; charset=utf-8".to_owned(),
        shown if inline => shown.to_owned(),
        _ => "application/octet-stream".to_owned(),
    };
    let name: String =
        percent_encoding::utf8_percent_encode(&record.filename, percent_encoding::NON_ALPHANUMERIC)
            .collect();
    let disposition = format!(
        "{}; filename*=UTF-8''{name}",
        if inline { "inline" } else { "attachment" }
    );
    let chunks = futures_util::stream::unfold(file, |mut file| async move {
        use tokio::io::AsyncReadExt as _;
        let mut chunk = vec![0; 64 * 1024];
        match file.read(&mut chunk).await {
            Ok(0) | Err(_) => None,
            Ok(read) => {
                chunk.truncate(read);
                Some((Ok::<_, std::io::Error>(chunk), file))
            }
        }
    });
    Ok((
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_DISPOSITION, disposition),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff".to_owned()),
            (
                header::CONTENT_SECURITY_POLICY,
                "sandbox; default-src 'none'; frame-ancestors 'none'".to_owned(),
            ),
        ],
        axum::body::Body::from_stream(chunks),
    )
        .into_response())
}

async fn card_page(
    State(app): State<Shared>,
    UrlPath(id): UrlPath<String>,
) -> Result<Html<String>, Failure> {
    card_view(&app, &id, true).await
}

/// Which live part of a card's page a fragment is.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FragmentQuery {
    /// `head`: the title, facts and actions; otherwise the rest.
    part: Option<String>,
}

async fn card_fragment(
    State(app): State<Shared>,
    UrlPath(id): UrlPath<String>,
    query: Result<Query<FragmentQuery>, QueryRejection>,
) -> Result<Html<String>, Failure> {
    let query = query_of(query)?;
    match query.part.as_deref() {
        None => card_view(&app, &id, false).await,
        Some("head") => {
            let task = app.board.show_task(&id).await?.task;
            Ok(Html(
                page::card_head(&app, &task, SystemClock.now()).into_string(),
            ))
        }
        Some(other) => Err(Failure::new(
            StatusCode::BAD_REQUEST,
            format!("part {other:?}: the only part is head (none: the rest)"),
        )),
    }
}

/// Server-sent events: `changed` whenever anybody commits to the board.
async fn live(State(app): State<Shared>) -> Result<Response, Failure> {
    let permit = app.live_pages.clone().try_acquire_owned().map_err(|_| {
        Failure::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{LIVE_PAGES} live pages are open already: close one, or reload later"),
        )
    })?;
    let receiver = app.changes.subscribe();
    // The permit lives as long as the stream.
    let stream =
        futures_util::stream::unfold((receiver, permit), |(mut receiver, permit)| async move {
            // A page that lagged behind only needs to know the board changed.
            match receiver.recv().await {
                Ok(()) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => Some((
                    Ok::<_, std::convert::Infallible>(
                        Event::default().event("changed").data("board"),
                    ),
                    (receiver, permit),
                )),
                Err(tokio::sync::broadcast::error::RecvError::Closed) => None,
            }
        });
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response())
}

/// How often a streamed log is looked at for new lines.
const LOG_EVERY: Duration = Duration::from_millis(300);
/// How often a log stream asks the board whether the card still runs.
const LOG_STATUS_EVERY: Duration = Duration::from_secs(3);
/// The most of a log one event of a stream carries.
const LOG_CHUNK: u64 = 64 * 1024;

/// Where a log stream starts.
#[derive(Deserialize)]
struct LogQuery {
    /// A byte of the log: the end of the tail the page shows.
    from: Option<u64>,
}

/// A card's log as it grows, as server-sent events `log` (its new text,
/// whole lines only, each event's id the byte it ends on) from `from`,
/// from a reconnecting browser's `Last-Event-ID`, or else from the log's
/// end; `end` once the card no longer runs and its log has no more, and
/// the stream closes. A log that shrank (moved aside for the next run) is
/// followed from its start.
async fn log_stream(
    State(app): State<Shared>,
    UrlPath(id): UrlPath<String>,
    query: Result<Query<LogQuery>, QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, Failure> {
    if !kanban_core::is_valid_task_id(&id) {
        return Err(Failure::new(
            StatusCode::NOT_FOUND,
            format!("no card {id:?}"),
        ));
    }
    let query = query_of(query)?;
    app.board.show_task(&id).await?;
    let permit = app.log_streams.clone().try_acquire_owned().map_err(|_| {
        Failure::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "{LOG_STREAMS} logs are followed already: close a card's page, or reload later"
            ),
        )
    })?;
    let path = crate::supervisor::readable_log(&app.logs, &id);
    let resumed = headers
        .get("last-event-id")
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.trim().parse::<u64>().ok());
    let start = match resumed.or(query.from) {
        Some(at) => at,
        None => std::fs::metadata(&path).map_or(0, |meta| meta.len()),
    };
    let follow = LogFollow {
        app: app.clone(),
        id,
        path,
        at: start,
        asked: None,
        ended: false,
        _permit: permit,
    };
    let stream = futures_util::stream::unfold(follow, |mut follow| async move {
        let event = follow.next().await?;
        Some((Ok::<_, std::convert::Infallible>(event), follow))
    });
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response())
}

/// One log stream's place in its log.
struct LogFollow {
    app: Shared,
    id: String,
    path: PathBuf,
    at: u64,
    /// When the board was last asked whether the card runs.
    asked: Option<tokio::time::Instant>,
    ended: bool,
    /// Held as long as the stream.
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl LogFollow {
    /// The stream's next event: new lines, or `end`; none after `end`.
    async fn next(&mut self) -> Option<Event> {
        if self.ended {
            return None;
        }
        loop {
            let read = read_log_from(&self.path, self.at);
            self.at = read.next;
            if !read.text.is_empty() {
                return Some(
                    Event::default()
                        .event("log")
                        .id(read.next.to_string())
                        .data(read.text),
                );
            }
            if read.full {
                continue;
            }
            let due = self
                .asked
                .is_none_or(|asked| asked.elapsed() >= LOG_STATUS_EVERY);
            if due {
                self.asked = Some(tokio::time::Instant::now());
                // A busy board is asked again later; a card gone runs no more.
                let runs = match self.app.board.show_task(&self.id).await {
                    Ok(card) => card.task.status.known() == Some(TaskStatus::Running),
                    Err(BoardError::TaskNotFound(_)) => false,
                    Err(_) => true,
                };
                if !runs {
                    // What the run wrote last may have landed since the read.
                    let last = read_log_from(&self.path, self.at);
                    if !last.text.is_empty() {
                        self.at = last.next;
                        self.asked = None;
                        return Some(
                            Event::default()
                                .event("log")
                                .id(last.next.to_string())
                                .data(last.text),
                        );
                    }
                    self.ended = true;
                    return Some(Event::default().event("end").data(self.id.clone()));
                }
            }
            tokio::time::sleep(LOG_EVERY).await;
        }
    }
}

/// What one read of a log found.
struct LogRead {
    /// Whole lines, line ends as `\n`.
    text: String,
    /// Where the next read starts.
    next: u64,
    /// The read filled a chunk: more may be there already.
    full: bool,
}

/// The whole lines of a log from byte `at` on (at most [`LOG_CHUNK`]);
/// from its start again when it shrank.
fn read_log_from(path: &Path, at: u64) -> LogRead {
    use std::io::{Read, Seek, SeekFrom};
    let nothing = |at| LogRead {
        text: String::new(),
        next: at,
        full: false,
    };
    let Some(mut file) = open_log(path) else {
        return nothing(at);
    };
    let length = file.metadata().map_or(0, |meta| meta.len());
    let at = if length < at { 0 } else { at };
    let mut bytes = Vec::new();
    if file.seek(SeekFrom::Start(at)).is_err()
        || (&mut file).take(LOG_CHUNK).read_to_end(&mut bytes).is_err()
    {
        return nothing(at);
    }
    let full = bytes.len() as u64 == LOG_CHUNK;
    // Whole lines only: a line still being written waits for its end
    // (unless one chunk holds no end of line at all).
    let whole = whole_lines(&bytes, full);
    bytes.truncate(whole);
    LogRead {
        text: log_text(&bytes),
        next: at + whole as u64,
        full,
    }
}

/// An action's form: the CSRF token and what the action needs.
#[derive(Deserialize)]
struct ActionForm {
    /// Missing is refused as a wrong token is (403), not as a bad form.
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    text: String,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    events: String,
    /// The lane a move goes to.
    #[serde(default)]
    to: String,
    /// The lane the page showed the card in (move).
    #[serde(default)]
    from: String,
    // An edit's fields, and (`was_…`) each as the form showed it: only
    // what was changed in the form is saved, so a change made meanwhile
    // by somebody else stays.
    title: Option<String>,
    body: Option<String>,
    priority: Option<String>,
    assignee: Option<String>,
    tenant: Option<String>,
    workspace: Option<String>,
    branch: Option<String>,
    was_title: Option<String>,
    was_body: Option<String>,
    was_priority: Option<String>,
    was_assignee: Option<String>,
    was_tenant: Option<String>,
    was_workspace: Option<String>,
    was_branch: Option<String>,
}

/// A form's field as the person left it: given, and not what the form
/// showed (line ends as a browser sends them, `\r\n`, read as `\n`).
fn changed(given: Option<String>, shown: Option<&String>) -> Option<String> {
    let normal = |text: &str| text.replace("\r\n", "\n");
    let given = given.map(|text| normal(&text))?;
    match shown {
        Some(shown) if normal(shown) == given => None,
        _ => Some(given),
    }
}

#[derive(Deserialize)]
struct AddForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    title: String,
    #[serde(default)]
    body: String,
    #[serde(default)]
    assignee: String,
    #[serde(default)]
    tenant: String,
    #[serde(default)]
    priority: String,
    /// The cards it waits for, by id, separated by commas or spaces.
    #[serde(default)]
    parents: String,
    /// Made in triage: it waits for a person and is never claimed.
    #[serde(default)]
    triage: String,
    /// Where to go once it is made: the card's page, or this card's (a
    /// child's parent).
    #[serde(default)]
    back: String,
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

/// A form's fields, or the documented error for a form that is not one.
fn form<T>(form: Result<Form<T>, FormRejection>) -> Result<T, Failure> {
    form.map(|Form(form)| form)
        .map_err(|rejection| Failure::new(StatusCode::BAD_REQUEST, rejection.body_text()))
}

async fn add_form(
    State(app): State<Shared>,
    given: Result<Form<AddForm>, FormRejection>,
) -> Result<Redirect, Failure> {
    let form = form(given)?;
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
    let parents: Vec<String> = form
        .parents
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|id| !id.is_empty())
        .map(str::to_owned)
        .collect();
    let back = parents.iter().find(|id| **id == form.back).cloned();
    let id = app
        .board
        .create_task(&NewTask {
            title: form.title,
            body: non_blank(&form.body),
            assignee: non_blank(&form.assignee),
            tenant: non_blank(&form.tenant),
            priority,
            parents,
            start: if form.triage.is_empty() {
                kanban_core::rules::Start::InLine
            } else {
                kanban_core::rules::Start::Triage
            },
            created_by: Some("web".to_owned()),
            ..NewTask::default()
        })
        .await?;
    Ok(Redirect::to(
        &app.at(&format!("/cards/{}", back.unwrap_or(id))),
    ))
}

/// The kinds a card's page subscribes a webhook to unless it names others.
const PAGE_NOTIFY_KINDS: &str = "needs_input,failed,done";

/// What an action is given besides its name: its text, why, and (notify)
/// the kinds of event.
struct ActionInput<'a> {
    text: &'a str,
    reason: &'a str,
    events: &'a str,
    /// The lane the page showed the card in (move; empty: wherever it is).
    from: &'a str,
}

/// Subscribes a webhook (never a command: what runs on the dispatchers'
/// hosts is named on their command line) to a card's events.
async fn notify_card(app: &App, id: &str, url: &str, events: &str) -> Result<(), Failure> {
    let events = non_blank(events).unwrap_or_else(|| PAGE_NOTIFY_KINDS.to_owned());
    let kinds = notify::parse_kinds(&events)
        .map_err(|error| Failure::new(StatusCode::BAD_REQUEST, format!("events: {error}")))?;
    app.board
        .subscribe(&NewSubscription {
            scope: NotifyScope::Card(id.to_owned()),
            kinds: kinds.iter().map(|kind| (*kind).to_owned()).collect(),
            channel: "webhook".to_owned(),
            address: url.trim().to_owned(),
            format: "json".to_owned(),
            secret: None,
            smtp: None,
            created_by: Some("web".to_owned()),
        })
        .await?;
    Ok(())
}

/// Removes a subscription to this card's events (and only to this card's).
async fn unnotify_card(app: &App, id: &str, subscription: &str) -> Result<(), Failure> {
    let number: i64 = subscription.trim().parse().map_err(|_| {
        Failure::new(
            StatusCode::BAD_REQUEST,
            format!("{subscription:?} is not a subscription's number"),
        )
    })?;
    let ours = app.board.subscriptions().await?.iter().any(|sub| {
        sub.id == number
            && sub.scope == "card"
            && sub.target.as_deref() == Some(id)
            && sub.channel == "webhook"
    });
    if !ours || !app.board.unsubscribe(number).await? {
        return Err(Failure::new(
            StatusCode::NOT_FOUND,
            format!("no webhook subscription {number} to the events of {id}"),
        ));
    }
    Ok(())
}

/// Applies one operator action to a card: the same board operations as the CLI.
async fn act(app: &App, id: &str, action: &str, input: &ActionInput<'_>) -> Result<(), Failure> {
    let (text, reason) = (input.text, input.reason);
    let reason = non_blank(reason).unwrap_or_else(|| format!("{action} from the web board"));
    match action {
        "notify" => notify_card(app, id, text, input.events).await?,
        "unnotify" => unnotify_card(app, id, text).await?,
        "comment" => app.board.add_comment(id, "web", text).await?,
        "unblock" => {
            app.board.unblock(id).await?;
            // The reason given goes to the card as a comment, which its
            // next run reads: the answer a block waited for.
            if let Some(given) = non_blank(input.reason) {
                app.board
                    .add_comment(id, "web", &format!("Unblocked: {given}"))
                    .await?;
            }
        }
        "reclaim" => app.board.reclaim(id, &reason).await?,
        "hold" => app.board.hold(id, &reason).await?,
        "release" => app.board.release_hold(id).await?,
        "promote" => app.board.promote(id, Some(&reason), false, false).await?,
        "cancel" => app.board.cancel(id, &reason).await?,
        "archive" => archive(app, id).await?,
        "triage" => app.board.triage(id, Some(&reason)).await?,
        "review" => app.board.review(id, Some(&reason)).await?,
        "move" => {
            let given = crate::serve_board::Move {
                to: text,
                from: input.from,
                reason: &reason,
            };
            crate::serve_board::move_card(app, id, &given).await?;
        }
        "reassign" => crate::serve_board::reassign(app, id, text).await?,
        "priority" => crate::serve_board::set_priority(app, id, text).await?,
        "link" => {
            app.board.link(text.trim(), id).await?;
        }
        "unlink" => {
            if !app.board.unlink(text.trim(), id).await? {
                return Err(Failure::new(
                    StatusCode::NOT_FOUND,
                    format!("{id} does not wait for {:?}", text.trim()),
                ));
            }
        }
        other => {
            return Err(Failure::new(
                StatusCode::NOT_FOUND,
                format!("no action {other:?}: {}", ACTIONS.join(", ")),
            ));
        }
    }
    Ok(())
}

/// Every action a card takes, by name (`edit` besides, with its fields).
const ACTIONS: [&str; 17] = [
    "comment", "unblock", "reclaim", "hold", "release", "promote", "cancel", "archive", "triage",
    "review", "move", "reassign", "priority", "link", "unlink", "notify", "unnotify",
];

/// Archives a card, then takes its workspace away as `kanban archive` does.
async fn archive(app: &App, id: &str) -> Result<(), Failure> {
    let task = app.board.show_task(id).await?.task;
    app.board.archive(id).await?;
    let db = crate::admin::workspace_db(&app.board);
    let env = app.env.clone();
    // Git and the file system block: off the server's threads.
    let _ = tokio::task::spawn_blocking(move || {
        if let Some(said) = crate::workspace::retire(&task, &db, &env) {
            crate::out::errln!("{}: {said}", task.id);
        }
    })
    .await;
    Ok(())
}

async fn act_form(
    State(app): State<Shared>,
    UrlPath((id, action)): UrlPath<(String, String)>,
    given: Result<Form<ActionForm>, FormRejection>,
) -> Result<Redirect, Failure> {
    let form = form(given)?;
    check_csrf(&app, &form.csrf)?;
    if action == "edit" {
        let fields = EditFields {
            title: changed(form.title, form.was_title.as_ref()),
            body: changed(form.body, form.was_body.as_ref()),
            priority: changed(form.priority, form.was_priority.as_ref()).map(Value::String),
            assignee: changed(form.assignee, form.was_assignee.as_ref()),
            tenant: changed(form.tenant, form.was_tenant.as_ref()),
            workspace: changed(form.workspace, form.was_workspace.as_ref()),
            branch: changed(form.branch, form.was_branch.as_ref()),
        };
        crate::serve_board::edit_card(&app, &id, &fields).await?;
        return Ok(Redirect::to(&app.at(&format!("/cards/{id}"))));
    }
    let text = if action == "move" {
        &form.to
    } else {
        &form.text
    };
    let input = ActionInput {
        text,
        reason: &form.reason,
        events: &form.events,
        from: &form.from,
    };
    act(&app, &id, &action, &input).await?;
    Ok(Redirect::to(&app.at(&format!("/cards/{id}"))))
}

/// A JSON write must say it is JSON: a page of another site cannot send
/// that without the browser asking first, which this server never allows.
fn check_json(headers: &HeaderMap) -> Result<(), Failure> {
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(is_json_media_type);
    if json {
        Ok(())
    } else {
        Err(Failure::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "send the request body as JSON (Content-Type: application/json)",
        ))
    }
}

/// True for the media type `application/json`, compared as a media type:
/// case aside, with or without parameters (`; charset=utf-8`).
fn is_json_media_type(value: &str) -> bool {
    let essence = value.split(';').next().unwrap_or("").trim();
    essence.eq_ignore_ascii_case("application/json")
}

/// Cards a page of `/api/cards` holds when the request names no limit.
const PAGE_DEFAULT: usize = 100;
/// The most cards a page of `/api/cards` holds.
const PAGE_MOST: usize = 1000;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CardsQuery {
    status: Option<String>,
    limit: Option<usize>,
    cursor: Option<String>,
}

async fn api_cards(
    State(app): State<Shared>,
    query: Result<Query<CardsQuery>, QueryRejection>,
) -> Result<Json<Value>, Failure> {
    let query = query_of(query)?;
    let status = match query.status.as_deref() {
        None => None,
        Some(raw) => Some(TaskStatus::parse(raw).ok_or_else(|| {
            Failure::new(StatusCode::BAD_REQUEST, format!("unknown status {raw:?}"))
        })?),
    };
    let limit = match query.limit {
        None => PAGE_DEFAULT,
        Some(limit @ 1..=PAGE_MOST) => limit,
        Some(limit) => {
            return Err(Failure::new(
                StatusCode::BAD_REQUEST,
                format!("limit {limit}: a page holds 1 to {PAGE_MOST} cards"),
            ));
        }
    };
    let after = match query.cursor.as_deref() {
        None => None,
        Some(raw) => Some(raw.parse::<i64>().ok().filter(|place| *place > 0).ok_or_else(|| {
            Failure::new(
                StatusCode::BAD_REQUEST,
                format!("cursor {raw:?} is not one this server gave: pass next_cursor from the page before"),
            )
        })?),
    };
    let page = app.board.list_page(status, after, limit).await?;
    Ok(Json(json!({
        "cards": page.tasks.iter().map(task_json).collect::<Vec<_>>(),
        "next_cursor": page.next.map(|place| place.to_string()),
    })))
}

async fn api_card(
    State(app): State<Shared>,
    UrlPath(id): UrlPath<String>,
) -> Result<Json<Value>, Failure> {
    let view = app.board.show_task(&id).await?;
    let linked = linked_statuses(&app.board, &view).await?;
    Ok(Json(json!({
        "attachments": view.attachments.iter().map(crate::attach::attachment_json).collect::<Vec<_>>(),
        "task": task_json(&view.task),
        "parents": view.parents,
        "children": view.children,
        "linked_statuses": linked,
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
    tenant: Option<String>,
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
            tenant: card.tenant,
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
    #[serde(default)]
    events: String,
    /// The lane a move goes to.
    #[serde(default)]
    to: String,
    /// The lane the page showed the card in (move): a card elsewhere now
    /// is not moved (409).
    #[serde(default)]
    from: String,
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
    let text = if action == "move" {
        &request.to
    } else {
        &request.text
    };
    let input = ActionInput {
        text,
        reason: &request.reason,
        events: &request.events,
        from: &request.from,
    };
    act(&app, &id, &action, &input).await?;
    Ok(Json(json!({"ok": true})))
}

/// Edits a card in place.
async fn api_edit(
    State(app): State<Shared>,
    UrlPath(id): UrlPath<String>,
    headers: HeaderMap,
    body: String,
) -> Result<Json<Value>, Failure> {
    check_json(&headers)?;
    let fields: EditFields = serde_json::from_str(&body)
        .map_err(|error| Failure::new(StatusCode::BAD_REQUEST, format!("bad edit: {error}")))?;
    crate::serve_board::edit_card(&app, &id, &fields).await?;
    Ok(Json(json!({"ok": true})))
}

/// The provider walls, each with a button that lifts it.
async fn walls_page(State(app): State<Shared>) -> Result<Html<String>, Failure> {
    let walls = app.board.walls().await?;
    Ok(Html(
        page::walls(&app, &walls, SystemClock.now()).into_string(),
    ))
}

/// Lifts a wall by hand: its cards may be claimed at once.
async fn lift_wall(app: &App, scope: &str) -> Result<(), Failure> {
    if app.board.lift_wall(scope.trim()).await? {
        Ok(())
    } else {
        Err(Failure::new(
            StatusCode::NOT_FOUND,
            format!("no provider wall on {:?}; /walls lists them", scope.trim()),
        ))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LiftWall {
    #[serde(default)]
    csrf: String,
    scope: String,
}

async fn lift_wall_form(
    State(app): State<Shared>,
    given: Result<Form<LiftWall>, FormRejection>,
) -> Result<Redirect, Failure> {
    let form = form(given)?;
    check_csrf(&app, &form.csrf)?;
    lift_wall(&app, &form.scope).await?;
    Ok(Redirect::to(&app.at("/walls")))
}

async fn api_lift_wall(
    State(app): State<Shared>,
    headers: HeaderMap,
    body: String,
) -> Result<Json<Value>, Failure> {
    check_json(&headers)?;
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Scope {
        scope: String,
    }
    let given: Scope = serde_json::from_str(&body)
        .map_err(|error| Failure::new(StatusCode::BAD_REQUEST, format!("bad wall: {error}")))?;
    lift_wall(&app, &given.scope).await?;
    Ok(Json(json!({"ok": true})))
}

/// Cards of each lane a diagnostics view reads: a board of a million
/// cards is diagnosed a page at a time, not whole.
pub(crate) const DIAGNOSED_PER_LANE: usize = 50;

/// What `kanban diagnostics` finds, on the first cards of each lane that
/// is not done.
async fn diagnosed(
    app: &App,
) -> Result<
    Vec<(
        kanban_core::TaskRecord,
        Vec<kanban_core::diagnostics::Diagnostic>,
    )>,
    Failure,
> {
    let mut tasks = Vec::new();
    for status in crate::report::LANES
        .into_iter()
        .filter(|status| *status != TaskStatus::Done)
    {
        let lane = kanban_board::Lane::Status(status);
        let filter = kanban_board::LaneFilter::default();
        tasks.extend(
            app.board
                .lane_page(lane, &filter, DIAGNOSED_PER_LANE, 0)
                .await?
                .cards,
        );
    }
    let agents = match &app.agents {
        Some(path) => Some(
            crate::agents_file::load(path, &app.env)
                .map_err(|error| Failure::new(StatusCode::INTERNAL_SERVER_ERROR, error))?,
        ),
        None => None,
    };
    Ok(
        crate::report::diagnose_cards(&app.board, &tasks, agents.as_ref(), SystemClock.now())
            .await?,
    )
}

async fn diagnostics_page(State(app): State<Shared>) -> Result<Html<String>, Failure> {
    let reports = diagnosed(&app).await?;
    let dead: Vec<_> = app
        .board
        .subscriptions()
        .await?
        .into_iter()
        .filter(|sub| sub.dead > 0)
        .collect();
    Ok(Html(page::diagnostics(&app, &reports, &dead).into_string()))
}

/// The seed system's `diagnostics --json` shape.
async fn api_diagnostics(State(app): State<Shared>) -> Result<Json<Value>, Failure> {
    let reports = diagnosed(&app).await?;
    Ok(Json(Value::Array(
        reports
            .iter()
            .map(|(task, found)| {
                json!({"task_id": task.id, "title": task.title, "status": task.status.as_str(), "assignee": task.assignee, "diagnostics": found})
            })
            .collect(),
    )))
}

/// One action on many cards: each card's result, in the order named. One
/// card refused stops none of the others.
async fn bulk(
    app: &App,
    cards: Vec<String>,
    action: &str,
    input: &ActionInput<'_>,
) -> Result<Vec<Value>, Failure> {
    let cards = crate::serve_board::bulk_cards(cards, action)?;
    let mut results = Vec::with_capacity(cards.len());
    for id in cards {
        results.push(match act(app, &id, action, input).await {
            Ok(()) => json!({"id": id, "ok": true}),
            Err(failure) => json!({"id": id, "ok": false, "error": failure.message}),
        });
    }
    Ok(results)
}

/// `/api/bulk`: one action on many cards.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BulkBody {
    cards: Vec<String>,
    action: String,
    #[serde(default)]
    text: String,
    #[serde(default)]
    reason: String,
    /// The lane of a bulk move.
    #[serde(default)]
    to: String,
}

async fn api_bulk(
    State(app): State<Shared>,
    headers: HeaderMap,
    body: String,
) -> Result<Json<Value>, Failure> {
    check_json(&headers)?;
    let request: BulkBody = serde_json::from_str(&body).map_err(|error| {
        Failure::new(StatusCode::BAD_REQUEST, format!("bad bulk action: {error}"))
    })?;
    let text = if request.action == "move" {
        &request.to
    } else {
        &request.text
    };
    let input = ActionInput {
        text,
        reason: &request.reason,
        events: "",
        from: "",
    };
    let results = bulk(&app, request.cards, &request.action, &input).await?;
    Ok(Json(json!({"results": results})))
}

/// The board page's bulk form: its checked cards (`card`, repeated), the
/// action and what it needs; back to the same view after.
async fn bulk_form(
    State(app): State<Shared>,
    body: axum::body::Bytes,
) -> Result<Response, Failure> {
    let mut fields: std::collections::HashMap<String, String> = std::collections::HashMap::new();
    let mut cards = Vec::new();
    for (name, value) in form_urlencoded::parse(&body) {
        if name == "card" {
            cards.push(value.into_owned());
        } else {
            fields.insert(name.into_owned(), value.into_owned());
        }
    }
    let field = |name: &str| fields.get(name).map_or("", String::as_str);
    check_csrf(&app, field("csrf"))?;
    let action = field("action");
    let text = if action == "move" {
        field("to")
    } else {
        field("text")
    };
    let input = ActionInput {
        text,
        reason: field("reason"),
        events: "",
        from: "",
    };
    let results = bulk(&app, cards, action, &input).await?;
    let refused: Vec<&Value> = results
        .iter()
        .filter(|result| result["ok"] != true)
        .collect();
    if !refused.is_empty() {
        return Ok(
            Html(page::bulk_refusals(&app, &refused, &results).into_string()).into_response(),
        );
    }
    // Back to the view the form was sent from: its filter, never another site.
    let back = BoardQuery {
        q: field("q").to_owned(),
        assignee: field("assignee").to_owned(),
        tenant: field("tenant").to_owned(),
        block: field("block").to_owned(),
        wall: field("wall").to_owned(),
        lane: field("lane").to_owned(),
        page: field("page").parse().ok(),
    };
    let back = match back.lane().ok().flatten() {
        Some(lane) => back.page_string(&lane, back.page().unwrap_or(1)),
        None => back.filter_string(),
    };
    Ok(Redirect::to(&format!("{}?{back}", app.home())).into_response())
}

/// The subscriptions, a webhook shown without its path (it may hold a token).
async fn api_notifications(State(app): State<Shared>) -> Result<Json<Value>, Failure> {
    Ok(Json(json!(shown_subscriptions(&app).await?)))
}

/// A webhook subscription made through the API: a command or mail is made
/// on the command line of a dispatcher's host, never from a browser.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewNotification {
    card: Option<String>,
    assignee: Option<String>,
    tenant: Option<String>,
    #[serde(default)]
    all_cards: bool,
    events: Option<String>,
    webhook: String,
    format: Option<String>,
}

async fn api_subscribe(
    State(app): State<Shared>,
    headers: HeaderMap,
    body: String,
) -> Result<(StatusCode, Json<Value>), Failure> {
    check_json(&headers)?;
    let bad = |why: String| Failure::new(StatusCode::BAD_REQUEST, why);
    let new: NewNotification =
        serde_json::from_str(&body).map_err(|error| bad(format!("bad subscription: {error}")))?;
    let scope = match (new.card, new.assignee, new.tenant, new.all_cards) {
        (Some(card), None, None, false) => NotifyScope::Card(card),
        (None, Some(name), None, false) => NotifyScope::Assignee(name),
        (None, None, Some(name), false) => NotifyScope::Tenant(name),
        (None, None, None, true) => NotifyScope::Board,
        _ => {
            return Err(bad(
                "name exactly one of card, assignee, tenant and all_cards".to_owned(),
            ));
        }
    };
    let webhook = Webhook {
        url: &new.webhook,
        events: new.events.as_deref().unwrap_or("needs_input,failed"),
        format: new.format.as_deref().unwrap_or("json"),
        by: "api",
    };
    let id = subscribe_webhook(&app, scope, &webhook).await?;
    Ok((StatusCode::CREATED, Json(json!({"id": id}))))
}

/// A webhook subscription as the API or a page makes it.
struct Webhook<'a> {
    url: &'a str,
    events: &'a str,
    format: &'a str,
    by: &'a str,
}

/// Subscribes an unsigned webhook: a secret, a command or mail is named
/// on a dispatcher host's command line (the API could otherwise have the
/// dispatchers sign with any of their secrets, to a host it names).
async fn subscribe_webhook(
    app: &App,
    scope: NotifyScope,
    hook: &Webhook<'_>,
) -> Result<i64, Failure> {
    let kinds = notify::parse_kinds(hook.events)
        .map_err(|error| Failure::new(StatusCode::BAD_REQUEST, format!("events: {error}")))?;
    Ok(app
        .board
        .subscribe(&NewSubscription {
            scope,
            kinds: kinds.iter().map(|kind| (*kind).to_owned()).collect(),
            channel: "webhook".to_owned(),
            address: hook.url.trim().to_owned(),
            format: hook.format.to_owned(),
            secret: None,
            smtp: None,
            created_by: Some(hook.by.to_owned()),
        })
        .await?)
}

/// Every subscription, a webhook's address without its path.
async fn shown_subscriptions(app: &App) -> Result<Vec<notify::SubscriptionView>, Failure> {
    let mut subscriptions = app.board.subscriptions().await?;
    for sub in &mut subscriptions {
        sub.address = notify::shown_address(&sub.channel, &sub.address);
    }
    Ok(subscriptions)
}

async fn notifications_page(State(app): State<Shared>) -> Result<Html<String>, Failure> {
    let subscriptions = shown_subscriptions(&app).await?;
    Ok(Html(
        page::notifications_page(&app, &subscriptions).into_string(),
    ))
}

/// The notifications page's form: a webhook for every card, an assignee's
/// or a tenant's.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NotifyForm {
    #[serde(default)]
    csrf: String,
    /// `all`, `assignee` or `tenant`.
    scope: String,
    #[serde(default)]
    name: String,
    webhook: String,
    #[serde(default)]
    events: String,
    #[serde(default)]
    format: String,
}

async fn notify_form(
    State(app): State<Shared>,
    given: Result<Form<NotifyForm>, FormRejection>,
) -> Result<Redirect, Failure> {
    let form = form(given)?;
    check_csrf(&app, &form.csrf)?;
    let name = form.name.trim().to_owned();
    let scope = match (form.scope.as_str(), name.is_empty()) {
        ("all", _) => NotifyScope::Board,
        ("assignee", false) => NotifyScope::Assignee(name),
        ("tenant", false) => NotifyScope::Tenant(name),
        (scope @ ("assignee" | "tenant"), true) => {
            return Err(Failure::new(
                StatusCode::BAD_REQUEST,
                format!("name the {scope} whose cards' events to send"),
            ));
        }
        (other, _) => {
            return Err(Failure::new(
                StatusCode::BAD_REQUEST,
                format!("scope {other:?}: all, assignee or tenant"),
            ));
        }
    };
    let (events, format) = (non_blank(&form.events), non_blank(&form.format));
    let webhook = Webhook {
        url: &form.webhook,
        events: events.as_deref().unwrap_or("needs_input,failed"),
        format: format.as_deref().unwrap_or("json"),
        by: "web",
    };
    subscribe_webhook(&app, scope, &webhook).await?;
    Ok(Redirect::to(&app.at("/notifications")))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UnnotifyForm {
    #[serde(default)]
    csrf: String,
    id: String,
}

/// Stops a webhook subscription (never a command or mail: those are
/// removed on a dispatcher host's command line).
async fn unnotify_form(
    State(app): State<Shared>,
    given: Result<Form<UnnotifyForm>, FormRejection>,
) -> Result<Redirect, Failure> {
    let form = form(given)?;
    check_csrf(&app, &form.csrf)?;
    let number: i64 = form.id.trim().parse().map_err(|_| {
        Failure::new(
            StatusCode::BAD_REQUEST,
            format!("{:?} is not a subscription's number", form.id),
        )
    })?;
    let webhook = app
        .board
        .subscriptions()
        .await?
        .iter()
        .any(|sub| sub.id == number && sub.channel == "webhook");
    if !webhook || !app.board.unsubscribe(number).await? {
        return Err(Failure::new(
            StatusCode::NOT_FOUND,
            format!(
                "no webhook subscription {number}: commands and mail are removed with kanban notify unsubscribe"
            ),
        ));
    }
    Ok(Redirect::to(&app.at("/notifications")))
}

async fn api_unsubscribe(
    State(app): State<Shared>,
    UrlPath(id): UrlPath<i64>,
    headers: HeaderMap,
) -> Result<Json<Value>, Failure> {
    check_json(&headers)?;
    let found = app.board.subscriptions().await?;
    if found
        .iter()
        .any(|sub| sub.id == id && sub.channel != "webhook")
    {
        return Err(Failure::new(
            StatusCode::BAD_REQUEST,
            format!(
                "subscription {id} is a command or mail: remove it on a dispatcher host's command line (kanban notify unsubscribe {id})"
            ),
        ));
    }
    if !app.board.unsubscribe(id).await? {
        return Err(Failure::new(
            StatusCode::NOT_FOUND,
            format!("no subscription {id}"),
        ));
    }
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
    let stats = app.board.stats().await?;
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

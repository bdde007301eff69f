//! `kanban boards`: the boards of the kanban home, as the seed system's
//! `hermes kanban boards` keeps them (see [`crate::home`] for the layout).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context as _, bail};
use kanban_board_sqlite::{SqliteBoard, SystemClock};
use kanban_core::{Clock as _, Environment, ExitCode};
use serde_json::{Value, json};

use crate::args::BoardsCommand;
use crate::board_path::{Schema, home, open_db, postgres_url};
use crate::home::{DEFAULT_BOARD, Home, normalized_slug};
use crate::out::outln;
use crate::output::visible_line;
use crate::runtime::block_on;

/// `kanban boards …`.
pub(crate) fn boards(
    env: &Environment,
    command: Option<BoardsCommand>,
) -> anyhow::Result<ExitCode> {
    let home = home(env)?;
    match command.unwrap_or(BoardsCommand::List {
        json: false,
        all: false,
    }) {
        BoardsCommand::List { json, all } => list(&home, env, json, all),
        BoardsCommand::Create {
            slug,
            name,
            description,
            icon,
            color,
            switch,
            url,
        } => {
            let shown = Shown {
                name,
                description,
                icon,
                color,
            };
            create(&home, env, &slug, shown, switch, url.as_deref())
        }
        BoardsCommand::Show { json } => show(&home, env, json),
        BoardsCommand::Rename { slug, name } => rename(&home, &slug, &name),
        BoardsCommand::Rm { slug, delete } => remove(&home, &slug, delete),
        BoardsCommand::Delete { slug } => remove(&home, &slug, true),
        BoardsCommand::Switch { slug } => switch(&home, &slug),
    }
}

/// The current board: the one `HOME/kanban/current` names, else `default`
/// (`KANBAN_BOARD` picks a board for one command, not the current one).
fn current(home: &Home) -> String {
    home.current().unwrap_or_else(|| DEFAULT_BOARD.to_owned())
}

/// One board as `list --json` gives it: the fields of its board.json, and
/// what kanban knows of it.
fn entry(home: &Home, env: &Environment, slug: &str, current: &str) -> Value {
    let mut problems = Vec::new();
    let mut fields = match home.metadata(slug) {
        Ok(metadata) => {
            let name = metadata.name(slug);
            let mut fields = metadata.fields;
            fields.insert("name".to_owned(), name.into());
            fields
        }
        Err(error) => {
            problems.push(format!("{error:#}"));
            let mut fields = serde_json::Map::new();
            fields.insert("name".to_owned(), crate::home::display_name(slug).into());
            fields
        }
    };
    fields.remove("db_url");
    let db = home.board_db(slug).map_err(|error| format!("{error:#}"));
    let counts = match &db {
        Ok(db) => counts(db, env).unwrap_or_else(|error| {
            problems.push(format!("{error:#}"));
            BTreeMap::new()
        }),
        Err(problem) => {
            problems.push(problem.clone());
            BTreeMap::new()
        }
    };
    let engine = match &db {
        Ok(db) if postgres_url(db).is_some() => "postgresql",
        _ => "sqlite",
    };
    let db_path = db.ok().map(|db| db.display().to_string());
    let total: i64 = counts.values().sum();
    fields.insert("slug".to_owned(), slug.into());
    fields.insert("db_path".to_owned(), db_path.into());
    fields.insert("engine".to_owned(), engine.into());
    fields.insert("is_current".to_owned(), (slug == current).into());
    fields.insert("counts".to_owned(), json!(counts));
    fields.insert("total".to_owned(), total.into());
    fields.insert(
        "earlier_place".to_owned(),
        home.in_earlier_place(slug).into(),
    );
    let problem = (!problems.is_empty()).then(|| problems.join("; "));
    fields.insert("problem".to_owned(), problem.into());
    Value::Object(fields)
}

/// A board's cards by status (archived ones too, as the seed system counts
/// them); none for a board file that is not there yet.
fn counts(db: &Path, env: &Environment) -> anyhow::Result<BTreeMap<String, i64>> {
    if postgres_url(db).is_none() && std::fs::symlink_metadata(db).is_err() {
        return Ok(BTreeMap::new());
    }
    let stats = block_on(async {
        let board = if postgres_url(db).is_some() {
            open_db(db, Arc::new(SystemClock), env, Schema::AsItIs, || {
                Ok(std::path::PathBuf::from("."))
            })
            .await?
        } else {
            crate::board_path::OpenBoard::for_reading(SqliteBoard::open_for_reading(
                db,
                Arc::new(SystemClock),
            )?)
        };
        anyhow::Ok(board.stats().await?)
    })?;
    Ok(stats
        .cards_by_status
        .into_iter()
        .filter(|(_, count)| *count > 0)
        .collect())
}

fn counts_line(counts: &Value) -> String {
    let line = counts
        .as_object()
        .map(|counts| {
            counts
                .iter()
                .map(|(status, count)| format!("{status}={count}"))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default();
    if line.is_empty() {
        "(empty)".to_owned()
    } else {
        line
    }
}

fn text<'a>(entry: &'a Value, field: &str) -> &'a str {
    entry[field].as_str().unwrap_or("")
}

fn list(home: &Home, env: &Environment, as_json: bool, all: bool) -> anyhow::Result<ExitCode> {
    let current = current(home);
    let entries: Vec<Value> = home
        .slugs()
        .iter()
        .map(|slug| entry(home, env, slug, &current))
        .filter(|entry| all || !entry["archived"].as_bool().unwrap_or(false))
        .collect();
    if as_json {
        outln!("{}", Value::Array(entries));
        return Ok(ExitCode::Success);
    }
    outln!("{:2}  {:24}  {:28}  COUNTS", "", "SLUG", "NAME");
    for entry in &entries {
        let marker = if entry["is_current"] == true {
            "●"
        } else {
            " "
        };
        let mut name = visible_line(text(entry, "name")).into_owned();
        if entry["archived"] == true {
            name.push_str(" [archived]");
        }
        if entry["earlier_place"] == true {
            name.push_str(" [in HOME/boards]");
        }
        let counts = match entry["problem"].as_str() {
            Some(problem) => format!("error: {}", visible_line(problem)),
            None => counts_line(&entry["counts"]),
        };
        outln!(
            "{marker:2}  {:24}  {name:28}  {counts}",
            text(entry, "slug")
        );
    }
    outln!("\nCurrent board: {current}");
    if entries.len() > 1 {
        outln!("Switch boards with `kanban boards switch SLUG`.");
    }
    Ok(ExitCode::Success)
}

/// What people see of a board, as `create` was given it.
struct Shown {
    name: Option<String>,
    description: Option<String>,
    icon: Option<String>,
    color: Option<String>,
}

fn create(
    home: &Home,
    env: &Environment,
    given: &str,
    shown: Shown,
    switch_to: bool,
    url: Option<&str>,
) -> anyhow::Result<ExitCode> {
    let slug = normalized_slug(given)?;
    let existed = slug != DEFAULT_BOARD && home.exists(&slug);
    let mut metadata = home.metadata(&slug)?;
    if let Some(url) = url {
        if postgres_url(Path::new(url)).is_none() {
            bail!("--url {url:?} is not a postgres:// URL: write postgres://USER@HOST:PORT/DBNAME");
        }
        if let Some(named) = metadata.url()?.filter(|named| *named != url) {
            bail!(
                "board {slug:?} is already the database {named}: remove it first (`kanban boards rm {slug}`), or pick another name"
            );
        }
        if home.board_file(&slug).exists() {
            bail!(
                "board {slug:?} is already a SQLite board ({}): pick another name for the PostgreSQL one",
                home.board_file(&slug).display()
            );
        }
        // Connecting makes the schema (or upgrades an older one).
        let folder = home.board_folder(&slug);
        block_on(open_db(
            Path::new(url),
            Arc::new(SystemClock),
            env,
            Schema::Upgrade,
            || Ok(folder),
        ))?;
        metadata.fields.insert("db_url".to_owned(), url.into());
    } else if let Some(named) = metadata.url()? {
        bail!(
            "board {slug:?} is the PostgreSQL database {named}: it is made with `kanban boards create {slug} --url URL`"
        );
    }
    for (field, value) in [
        ("name", shown.name),
        ("description", shown.description),
        ("icon", shown.icon),
        ("color", shown.color),
    ] {
        if let Some(value) = value {
            metadata.fields.insert(field.to_owned(), value.into());
        }
    }
    if !metadata.fields.contains_key("name") {
        metadata
            .fields
            .insert("name".to_owned(), crate::home::display_name(&slug).into());
    }
    if url.is_none() {
        let file = home.board_file(&slug);
        let made = !file.exists();
        let board = SqliteBoard::create(&file, Arc::new(SystemClock))?;
        if made {
            home.mark_default_board(board.path())?;
        }
    }
    metadata.save(SystemClock.now())?;
    let verb = if existed { "already exists" } else { "created" };
    outln!("board {slug:?} {verb}");
    outln!("  name: {}", visible_line(&metadata.name(&slug)));
    outln!("  board: {}", home.board_db(&slug)?.display());
    if switch_to {
        home.set_current(&slug)?;
        outln!("  it is the current board now");
    } else {
        outln!("  make it the current board with `kanban boards switch {slug}`");
    }
    Ok(ExitCode::Success)
}

fn show(home: &Home, env: &Environment, as_json: bool) -> anyhow::Result<ExitCode> {
    let current = current(home);
    let entry = entry(home, env, &current, &current);
    if as_json {
        outln!("{entry}");
        return Ok(ExitCode::Success);
    }
    outln!("Current board: {current}");
    outln!("  name:        {}", visible_line(text(&entry, "name")));
    if !text(&entry, "description").is_empty() {
        outln!(
            "  description: {}",
            visible_line(text(&entry, "description"))
        );
    }
    outln!("  board:       {}", visible_line(text(&entry, "db_path")));
    match entry["problem"].as_str() {
        Some(problem) => outln!("  error:       {}", visible_line(problem)),
        None => outln!(
            "  cards:       {} ({})",
            entry["total"],
            counts_line(&entry["counts"])
        ),
    }
    Ok(ExitCode::Success)
}

/// A board that exists, by a name as given.
fn existing(home: &Home, given: &str) -> anyhow::Result<String> {
    let slug = normalized_slug(given)?;
    if !home.exists(&slug) {
        bail!(
            "there is no board {slug:?} under {}: `kanban boards list` lists them, `kanban boards create {slug}` makes it",
            home.root().display()
        );
    }
    Ok(slug)
}

fn rename(home: &Home, given: &str, name: &str) -> anyhow::Result<ExitCode> {
    let slug = existing(home, given)?;
    let name = name.trim();
    if name.is_empty() {
        bail!("the new name is empty: give the name people should see");
    }
    let mut metadata = home.metadata(&slug)?;
    metadata.fields.insert("name".to_owned(), name.into());
    metadata.save(SystemClock.now())?;
    outln!("board {slug:?} is named {:?} now", visible_line(name));
    Ok(ExitCode::Success)
}

/// Whether a dispatcher holds the dispatch lock of the board file `db`.
fn dispatcher_ticks(db: &Path) -> bool {
    use nix::fcntl::{Flock, FlockArg};
    let mut name = db.as_os_str().to_owned();
    name.push(".dispatch.lock");
    let Ok(file) = std::fs::File::open(std::path::PathBuf::from(name)) else {
        return false;
    };
    match Flock::lock(file, FlockArg::LockSharedNonblock) {
        Ok(_unlocked_on_drop) => false,
        Err((_, errno)) => errno == nix::errno::Errno::EWOULDBLOCK,
    }
}

fn remove(home: &Home, given: &str, delete: bool) -> anyhow::Result<ExitCode> {
    let slug = existing(home, given)?;
    if slug == DEFAULT_BOARD {
        bail!("the default board cannot be removed: archive or prune its cards instead");
    }
    let folder = home.board_folder(&slug);
    let db = home.board_db(&slug)?;
    // The dispatcher locks beside the board's canonical path.
    let canonical = std::fs::canonicalize(&db).unwrap_or_else(|_| db.clone());
    if postgres_url(&db).is_none() && dispatcher_ticks(&canonical) {
        bail!("a dispatcher is ticking board {slug:?}: stop it first; nothing was removed");
    }
    let was_current = home.current().as_deref() == Some(slug.as_str());
    let database = postgres_url(&db)
        .map(|url| format!(" (the database {url} is left as it is: drop it there)"))
        .unwrap_or_default();
    if delete {
        std::fs::remove_dir_all(&folder)
            .with_context(|| format!("cannot delete {}", folder.display()))?;
        outln!("board {slug:?} is deleted{database}");
        forget_current(home, was_current)?;
        return Ok(ExitCode::Success);
    }
    let archive = home.boards_root().join("_archived");
    {
        use std::os::unix::fs::DirBuilderExt as _;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&archive)
            .with_context(|| format!("cannot make {}", archive.display()))?;
    }
    let stamp = SystemClock.now();
    let mut target = archive.join(format!("{slug}-{stamp}"));
    let mut suffix = 1;
    while target.exists() {
        target = archive.join(format!("{slug}-{stamp}-{suffix}"));
        suffix += 1;
    }
    std::fs::rename(&folder, &target)
        .with_context(|| format!("cannot move {} to {}", folder.display(), target.display()))?;
    outln!(
        "board {slug:?} is archived in {}{database}",
        target.display()
    );
    outln!(
        "move the folder back to {} to have it again",
        home.boards_root().join(&slug).display()
    );
    forget_current(home, was_current)
}

/// Once a board that was current is gone, the default board is current
/// again.
fn forget_current(home: &Home, was_current: bool) -> anyhow::Result<ExitCode> {
    if was_current {
        home.clear_current()?;
        outln!("the default board is the current board again");
    }
    Ok(ExitCode::Success)
}

fn switch(home: &Home, given: &str) -> anyhow::Result<ExitCode> {
    let slug = existing(home, given)?;
    home.set_current(&slug)?;
    outln!("the current board is {slug:?} now");
    Ok(ExitCode::Success)
}

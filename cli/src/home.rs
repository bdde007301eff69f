//! The boards of a kanban home, laid out as the seed system lays them out,
//! so that one home serves both systems:
//!
//! - the default board is `HOME/kanban.db`; every other board is
//!   `HOME/kanban/boards/SLUG/kanban.db`, its logs and files beside it;
//! - a board's name and description are in `HOME/kanban/boards/SLUG/board.json`
//!   (the default board's too), which may also name a PostgreSQL database
//!   (`db_url`, ours: the seed system keeps the field and ignores it);
//! - `HOME/kanban/current` names the board commands use when none is named.
//!
//! A board made by an earlier kanban at `HOME/boards/SLUG/kanban.db` is
//! found there for as long as the seed's place for it is empty.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use kanban_board_postgres::is_postgres_url;
use serde_json::{Map, Value};

/// The default board's name.
pub(crate) const DEFAULT_BOARD: &str = "default";

/// The most of `board.json` or `current` that is read.
const SMALL_FILE: u64 = 64 * 1024;

/// Whether `slug` is a board name both systems accept: 1-64 lowercase
/// letters, digits, `-` or `_`, starting with a letter or digit.
pub(crate) fn valid_slug(slug: &str) -> bool {
    let bytes = slug.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 64
        && (bytes[0].is_ascii_lowercase() || bytes[0].is_ascii_digit())
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-' || *b == b'_')
}

/// A board name as given (trimmed, lowercased), checked.
pub(crate) fn normalized_slug(given: &str) -> anyhow::Result<String> {
    let slug = given.trim().to_lowercase();
    if !valid_slug(&slug) {
        bail!(
            "board name {slug:?} is not valid: use 1-64 lowercase letters, digits, '-' or '_', starting with a letter or digit"
        );
    }
    Ok(slug)
}

/// The kanban home: where its boards are.
#[derive(Clone, Debug)]
pub(crate) struct Home {
    root: PathBuf,
}

/// Whether something is at `path` (a dangling link counts: it is not empty).
fn taken(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok()
}

impl Home {
    pub(crate) fn at(root: PathBuf) -> Self {
        Self { root }
    }

    pub(crate) fn root(&self) -> &Path {
        &self.root
    }

    /// `HOME/kanban/boards`: the folders of the boards.
    pub(crate) fn boards_root(&self) -> PathBuf {
        self.root.join("kanban").join("boards")
    }

    /// `HOME/kanban/current`.
    pub(crate) fn current_file(&self) -> PathBuf {
        self.root.join("kanban").join("current")
    }

    /// Where an earlier kanban kept the board `slug`.
    fn earlier_folder(&self, slug: &str) -> PathBuf {
        self.root.join("boards").join(slug)
    }

    /// Whether the board `slug` is where an earlier kanban kept it.
    pub(crate) fn in_earlier_place(&self, slug: &str) -> bool {
        let seed_place = if slug == DEFAULT_BOARD {
            self.root.join("kanban.db")
        } else {
            self.boards_root().join(slug)
        };
        !taken(&seed_place) && taken(&self.earlier_folder(slug).join("kanban.db"))
    }

    /// The board's folder: its `board.json`, and the logs and files of a
    /// PostgreSQL board on this host.
    pub(crate) fn board_folder(&self, slug: &str) -> PathBuf {
        let seed_place = self.boards_root().join(slug);
        let earlier = self.earlier_folder(slug);
        if !taken(&seed_place) && taken(&earlier) {
            earlier
        } else {
            seed_place
        }
    }

    /// The board `slug` names: its file, or the PostgreSQL URL its
    /// `board.json` names.
    pub(crate) fn board_db(&self, slug: &str) -> anyhow::Result<PathBuf> {
        if let Some(url) = self.metadata(slug)?.url()? {
            return Ok(PathBuf::from(url));
        }
        Ok(self.board_file(slug))
    }

    /// The file of the SQLite board `slug`.
    pub(crate) fn board_file(&self, slug: &str) -> PathBuf {
        if self.in_earlier_place(slug) {
            return self.earlier_folder(slug).join("kanban.db");
        }
        if slug == DEFAULT_BOARD {
            self.root.join("kanban.db")
        } else {
            self.boards_root().join(slug).join("kanban.db")
        }
    }

    /// Marks the new board file `db` (canonical), when it is this home's default board in
    /// the seed's place, as the seed system marks its default board (an
    /// empty `kanban.db.init.lock` beside it, the lock it takes to make the
    /// schema), so that both systems keep its logs and files in the same
    /// place (`HOME/kanban/logs`, `HOME/kanban/attachments`) from the start.
    pub(crate) fn mark_default_board(&self, db: &Path) -> anyhow::Result<()> {
        use std::os::unix::fs::OpenOptionsExt as _;
        let default = std::fs::canonicalize(&self.root).map(|root| root.join("kanban.db"));
        if !default.is_ok_and(|default| default == db) {
            return Ok(());
        }
        let marker = self.root.join("kanban.db.init.lock");
        std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .open(&marker)
            .with_context(|| format!("cannot make {}", marker.display()))?;
        Ok(())
    }

    /// Whether the board exists: the default board always does (as the seed
    /// system has it); another has a file or a `board.json`.
    pub(crate) fn exists(&self, slug: &str) -> bool {
        if slug == DEFAULT_BOARD {
            return true;
        }
        let folder = self.board_folder(slug);
        taken(&folder.join("kanban.db")) || taken(&folder.join("board.json"))
    }

    /// The board named in `HOME/kanban/current`, when it names one that
    /// exists (a stale or hand-mangled file is passed over, as the seed
    /// system passes it over).
    pub(crate) fn current(&self) -> Option<String> {
        let text = read_small(&self.current_file()).ok()??;
        let slug = normalized_slug(text.trim()).ok()?;
        self.exists(&slug).then_some(slug)
    }

    /// Names `slug` in `HOME/kanban/current`.
    pub(crate) fn set_current(&self, slug: &str) -> anyhow::Result<()> {
        write_private(&self.current_file(), format!("{slug}\n").as_bytes())
    }

    /// Forgets the current board: the default board is current again.
    pub(crate) fn clear_current(&self) -> anyhow::Result<()> {
        match std::fs::remove_file(self.current_file()) {
            Ok(()) => Ok(()),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(error) => Err(error)
                .with_context(|| format!("cannot remove {}", self.current_file().display())),
        }
    }

    /// The board's `board.json`, or an empty one when it has none.
    pub(crate) fn metadata(&self, slug: &str) -> anyhow::Result<Metadata> {
        let path = self.board_folder(slug).join("board.json");
        let fields = match read_small(&path)? {
            None => Map::new(),
            Some(text) => match serde_json::from_str(&text) {
                Ok(Value::Object(fields)) => fields,
                Ok(_) | Err(_) => bail!(
                    "{} is not a JSON object: fix it or remove it (it holds the board's name and description only)",
                    path.display()
                ),
            },
        };
        Ok(Metadata { path, fields })
    }

    /// The boards of the home: the default board first, then every folder
    /// of `HOME/kanban/boards` (and of an earlier kanban's `HOME/boards`)
    /// with a board file or a `board.json`, by name.
    pub(crate) fn slugs(&self) -> Vec<String> {
        let mut slugs = std::collections::BTreeSet::new();
        for root in [self.boards_root(), self.root.join("boards")] {
            let Ok(entries) = std::fs::read_dir(&root) else {
                continue;
            };
            for entry in entries.flatten() {
                let name = entry.file_name();
                let Some(slug) = name.to_str().filter(|slug| valid_slug(slug)) else {
                    continue;
                };
                if slug != DEFAULT_BOARD && self.exists(slug) {
                    slugs.insert(slug.to_owned());
                }
            }
        }
        std::iter::once(DEFAULT_BOARD.to_owned())
            .chain(slugs)
            .collect()
    }
}

/// A board's `board.json`: the seed system's fields, kept as they are, and
/// ours beside them.
#[derive(Clone, Debug)]
pub(crate) struct Metadata {
    pub(crate) path: PathBuf,
    pub(crate) fields: Map<String, Value>,
}

impl Metadata {
    /// A text field, when it is one.
    pub(crate) fn text(&self, field: &str) -> Option<&str> {
        self.fields.get(field).and_then(Value::as_str)
    }

    /// The display name: the file's, else the slug in title case (as the
    /// seed system makes it).
    pub(crate) fn name(&self, slug: &str) -> String {
        match self.text("name").map(str::trim) {
            Some(name) if !name.is_empty() => name.to_owned(),
            _ => display_name(slug),
        }
    }

    /// The PostgreSQL database the board is, if `db_url` names one.
    pub(crate) fn url(&self) -> anyhow::Result<Option<&str>> {
        match self.fields.get("db_url") {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(url)) if is_postgres_url(url) => {
                let parsed = kanban_board_postgres::parse_url(url)
                    .with_context(|| format!("{}: db_url", self.path.display()))?;
                if parsed.config.get_password().is_some() {
                    bail!(
                        "{}: db_url carries a password, which would reach every worker's environment: remove it and give it through PGPASSWORD or ~/.pgpass",
                        self.path.display()
                    );
                }
                Ok(Some(url))
            }
            Some(_) => bail!(
                "{}: db_url is not a postgres:// URL: fix it, or remove it for a SQLite board",
                self.path.display()
            ),
        }
    }

    /// Writes the file back (owner-only), `created_at` set on the first write.
    pub(crate) fn save(&mut self, now: i64) -> anyhow::Result<()> {
        if !self
            .fields
            .get("created_at")
            .is_some_and(|at| at.is_number())
        {
            self.fields.insert("created_at".to_owned(), now.into());
        }
        let mut text = serde_json::to_string_pretty(&self.fields)?;
        text.push('\n');
        write_private(&self.path, text.as_bytes())
    }
}

/// `atm10-server` → `Atm10 Server`.
pub(crate) fn display_name(slug: &str) -> String {
    let words: Vec<String> = slug
        .split(['-', '_'])
        .filter(|word| !word.is_empty())
        .map(|word| {
            let mut chars = word.chars();
            chars.next().map_or_else(String::new, |first| {
                first.to_uppercase().chain(chars).collect()
            })
        })
        .collect();
    if words.is_empty() {
        slug.to_owned()
    } else {
        words.join(" ")
    }
}

/// A small file's text; `None` when there is none.
fn read_small(path: &Path) -> anyhow::Result<Option<String>> {
    use std::io::Read as _;
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(error).with_context(|| format!("cannot read {}", path.display())),
    };
    let mut bytes = Vec::new();
    file.take(SMALL_FILE + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("cannot read {}", path.display()))?;
    if bytes.len() as u64 > SMALL_FILE {
        bail!(
            "{} is larger than {SMALL_FILE} bytes: it is not a file kanban wrote",
            path.display()
        );
    }
    String::from_utf8(bytes)
        .map(Some)
        .map_err(|_| anyhow::anyhow!("{} is not UTF-8 text", path.display()))
}

/// Writes `bytes` to `path` whole or not at all (a temporary file renamed
/// over it), owner-only, its folder made owner-only when it is made.
pub(crate) fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
    let folder = path.parent().unwrap_or(Path::new("."));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(folder)
        .with_context(|| format!("cannot make {}", folder.display()))?;
    let mut name = path.file_name().unwrap_or_default().to_owned();
    name.push(format!(".{}.tmp", std::process::id()));
    let temporary = folder.join(name);
    let written = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&temporary)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&temporary, path)
    })();
    if let Err(error) = written {
        let _ = std::fs::remove_file(&temporary);
        return Err(error).with_context(|| format!("cannot write {}", path.display()));
    }
    Ok(())
}

//! `kanban attach`, `attachments` and `attach-rm`: files on cards, kept
//! where the seed system keeps them so that both systems see them.

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use kanban_agent_port::{discard_attachment, store_attachment};
use kanban_core::attachments::{
    AttachmentRecord, MAX_ATTACHMENT_BYTES, NewAttachment, check_attachment_size,
};
use kanban_core::{Claim, Environment, ExitCode};
use serde_json::json;

use crate::admin::card_id;
use crate::args::GlobalArgs;
use crate::board_path::{open_board, open_board_for_reading};
use crate::out::outln;
use crate::runtime::block_on;
use crate::supervisor::seed_default_board;

/// The variable that pins the attachments folder (the seed system's).
pub(crate) const ATTACHMENTS_ROOT_VAR: &str = "HERMES_KANBAN_ATTACHMENTS_ROOT";

/// Where the files of the board `db` (its folder on this host: `folder`)
/// are kept, as the seed system keeps them: `HERMES_KANBAN_ATTACHMENTS_ROOT`,
/// else `kanban/attachments/` beside its default board, else
/// `attachments/` beside the board file (or in a PostgreSQL board's folder).
pub(crate) fn attachments_root(db: &Path, folder: &Path, env: &Environment) -> PathBuf {
    if let Some(root) = env.get_trimmed(ATTACHMENTS_ROOT_VAR) {
        return std::path::absolute(root).unwrap_or_else(|_| PathBuf::from(root));
    }
    let base = if seed_default_board(db) {
        folder.join("kanban").join("attachments")
    } else {
        folder.join("attachments")
    };
    std::path::absolute(&base).unwrap_or(base)
}

/// Where the files of the board a claim pins are kept on this host (a
/// PostgreSQL board's: in its folder under the kanban home, as its logs).
pub(crate) fn claim_attachments_root(claim: &Claim, env: &Environment) -> PathBuf {
    let db = Path::new(&claim.db);
    let folder = if crate::board_path::postgres_url(db).is_some() {
        crate::board_path::claim_host_folder(env)
    } else {
        db.parent().unwrap_or(Path::new(".")).to_owned()
    };
    attachments_root(db, &folder, env)
}

/// What `kanban attach` was given.
pub(crate) struct AttachRequest<'a> {
    pub(crate) task: &'a str,
    pub(crate) path: &'a Path,
    pub(crate) name: Option<&'a str>,
    pub(crate) content_type: Option<&'a str>,
    pub(crate) author: Option<&'a str>,
    pub(crate) json: bool,
}

/// Copies `source` (a regular file of at most 25 MiB) into the card's
/// folder under `root`; the record to write. The file is the caller's to
/// remove if the record is refused.
fn store(
    root: &Path,
    task_id: &str,
    source: &Path,
    request: &AttachRequest<'_>,
    uploaded_by: &str,
) -> anyhow::Result<NewAttachment> {
    let name = match request.name {
        Some(name) => name.to_owned(),
        None => source
            .file_name()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_default(),
    };
    // Looked at before it is opened: opening a pipe would wait for a writer.
    let looked =
        std::fs::metadata(source).with_context(|| format!("cannot read {}", source.display()))?;
    if !looked.is_file() {
        bail!("{} is not a file: attach a regular file", source.display());
    }
    let mut file =
        std::fs::File::open(source).with_context(|| format!("cannot read {}", source.display()))?;
    let meta = file
        .metadata()
        .with_context(|| format!("cannot read {}", source.display()))?;
    if !meta.is_file() {
        bail!("{} is not a file: attach a regular file", source.display());
    }
    check_attachment_size(meta.len()).map_err(anyhow::Error::msg)?;
    // Read one byte past the bound: a file that grew meanwhile is refused too.
    let mut bytes = Vec::new();
    Read::by_ref(&mut file)
        .take(MAX_ATTACHMENT_BYTES + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("cannot read {}", source.display()))?;
    store_attachment(
        root,
        task_id,
        &name,
        &bytes,
        request.content_type,
        uploaded_by,
    )
    .map_err(anyhow::Error::msg)
}

/// Who attached a file when `--author` names nobody: the seed system's
/// `HERMES_PROFILE`, else `$USER`, else `user`.
fn default_author(env: &Environment) -> String {
    env.get_trimmed("HERMES_PROFILE")
        .or_else(|| env.get_trimmed("USER"))
        .unwrap_or("user")
        .to_owned()
}

fn said(record: &NewAttachment, id: i64, task: &str, as_json: bool) {
    if as_json {
        outln!(
            "{}",
            json!({"id": id, "task_id": task, "filename": record.filename, "stored_path": record.stored_path, "size": record.size, "content_type": record.content_type})
        );
    } else {
        outln!(
            "attached {} to {task} as #{id} ({} bytes)",
            record.filename,
            record.size
        );
    }
}

/// `kanban attach ID PATH`: by a person, or inside a run to the run's own
/// card, fenced like every worker write.
pub(crate) fn attach(
    global: &GlobalArgs,
    env: &Environment,
    request: &AttachRequest<'_>,
) -> anyhow::Result<ExitCode> {
    let author = request
        .author
        .map(str::trim)
        .filter(|author| !author.is_empty())
        .map_or_else(|| default_author(env), str::to_owned);
    kanban_core::events::check_label(&author)
        .map_err(|problem| anyhow::anyhow!("--author {problem}"))?;
    if let Ok(claim) = Claim::from_env(env) {
        return attach_in_run(env, &claim, request, author);
    }
    let board = open_board(global, env)?;
    let task = card_id(&board, request.task)?;
    let root = board_attachments_root(global, env, &board)?;
    let record = store(&root, &task, request.path, request, &author)?;
    match block_on(board.add_attachment(&task, &record)) {
        Ok(id) => {
            said(&record, id, &task, request.json);
            Ok(ExitCode::Success)
        }
        Err(error) => {
            discard_attachment(&record);
            Err(error.into())
        }
    }
}

/// Inside a run: the run's own card only; the file is removed again when
/// the fence refuses the record.
fn attach_in_run(
    env: &Environment,
    claim: &Claim,
    request: &AttachRequest<'_>,
    author: String,
) -> anyhow::Result<ExitCode> {
    if request.task != claim.task_id {
        bail!(
            "a run attaches files to its own card ({}) only, not to {}",
            claim.task_id,
            request.task
        );
    }
    let root = claim_attachments_root(claim, env);
    let record = store(&root, &claim.task_id, request.path, request, &author)?;
    let stored = record.clone();
    let (task, as_json) = (claim.task_id.clone(), request.json);
    let shown = record.clone();
    let code = crate::agent_calls::attach(env, record, move |id| {
        said(&shown, id, &task, as_json);
    });
    if !matches!(code, Ok(ExitCode::Success)) {
        discard_attachment(&stored);
    }
    code
}

/// `kanban attachments ID [--json]`.
pub(crate) fn list(
    global: &GlobalArgs,
    env: &Environment,
    task: &str,
    as_json: bool,
) -> anyhow::Result<ExitCode> {
    let board = open_board_for_reading(global, env)?;
    let task = card_id(&board, task)?;
    let found = block_on(board.attachments(Some(&task)))?;
    if as_json {
        outln!(
            "{}",
            serde_json::Value::Array(found.iter().map(attachment_json).collect())
        );
        return Ok(ExitCode::Success);
    }
    if found.is_empty() {
        outln!("{task} has no attachments");
        return Ok(ExitCode::Success);
    }
    for attachment in &found {
        outln!(
            "#{}  {}  {} bytes  {}  by {}  {}",
            attachment.id,
            crate::output::visible_line(&attachment.filename),
            attachment.size,
            attachment.content_type.as_deref().unwrap_or("-"),
            crate::output::visible_line(attachment.uploaded_by.as_deref().unwrap_or("-")),
            crate::output::visible_line(&attachment.stored_path)
        );
    }
    Ok(ExitCode::Success)
}

/// An attachment as `--json` prints it (the seed system's fields).
pub(crate) fn attachment_json(attachment: &AttachmentRecord) -> serde_json::Value {
    json!({
        "id": attachment.id,
        "task_id": attachment.task_id,
        "filename": attachment.filename,
        "stored_path": attachment.stored_path,
        "content_type": attachment.content_type,
        "size": attachment.size,
        "uploaded_by": attachment.uploaded_by,
        "created_at": attachment.created_at,
    })
}

/// `kanban attach-rm ATTACHMENT_ID`: its row, then its file (a file
/// already gone is no error: the row says what exists).
pub(crate) fn remove(global: &GlobalArgs, env: &Environment, id: i64) -> anyhow::Result<ExitCode> {
    let board = open_board(global, env)?;
    let root = board_attachments_root(global, env, &board)?;
    let Some(removed) = block_on(board.remove_attachment(id))? else {
        bail!("no attachment #{id}; `kanban attachments ID` lists a card's");
    };
    let name = crate::output::visible_line(&removed.filename);
    match kept_file(&root, &removed) {
        Some(path) => {
            let _ = std::fs::remove_file(path);
            outln!("removed #{id} ({name}) from {}", removed.task_id);
        }
        None => outln!(
            "removed #{id} ({name}) from {}; its file is not in that card's folder of the board's attachments folder {}, so it was left where it is",
            removed.task_id,
            root.display()
        ),
    }
    Ok(ExitCode::Success)
}

/// The file a row names, when it is a regular file in its own card's
/// folder of the board's attachments folder (`root/TASK/NAME`, no link on
/// the way): a row is data, and a hostile one must not make us read or
/// delete anything else, another card's file included.
pub(crate) fn kept_file(root: &Path, record: &AttachmentRecord) -> Option<PathBuf> {
    if !kanban_core::is_valid_task_id(&record.task_id) {
        return None;
    }
    let folder = std::fs::canonicalize(root.join(&record.task_id)).ok()?;
    let path = Path::new(&record.stored_path);
    let canonical = std::fs::canonicalize(path).ok()?;
    let own = canonical.parent()? == folder
        && canonical.file_name()? == std::ffi::OsStr::new(&record.filename);
    let plain = std::fs::symlink_metadata(path).is_ok_and(|meta| meta.is_file());
    (own && plain && canonical == path).then_some(canonical)
}

/// The attachments folder of the board a command opened.
pub(crate) fn board_attachments_root(
    global: &GlobalArgs,
    env: &Environment,
    board: &crate::board_path::OpenBoard,
) -> anyhow::Result<PathBuf> {
    Ok(attachments_root(
        &crate::board_path::board_path(global, env)?,
        &board.folder,
        env,
    ))
}

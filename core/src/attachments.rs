//! Files attached to cards, as the seed system keeps them: a row on the
//! board naming the file, the file itself in the board's attachments
//! folder (`ATTACHMENTS/TASK/NAME`). This module only decides names and
//! bounds; the boards store rows, the binary writes files.

use serde::{Deserialize, Serialize};

/// The largest file a card takes: the seed system's
/// `KANBAN_ATTACHMENT_MAX_BYTES`.
pub const MAX_ATTACHMENT_BYTES: u64 = 25 * 1024 * 1024;
/// The longest stored name, in characters (the seed system's bound).
const MAX_NAME_CHARS: usize = 200;

/// A file attached to a card, as the board records it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttachmentRecord {
    pub id: i64,
    pub task_id: String,
    /// The stored name (the leaf of `stored_path`).
    pub filename: String,
    /// The file, absolute.
    pub stored_path: String,
    pub content_type: Option<String>,
    pub size: i64,
    /// Who attached it: a person's name, or a run's agent.
    pub uploaded_by: Option<String>,
    pub created_at: i64,
}

/// A file about to be recorded: already written at `stored_path`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewAttachment {
    pub filename: String,
    pub stored_path: String,
    pub content_type: Option<String>,
    pub size: i64,
    pub uploaded_by: Option<String>,
}

/// A name given for a file, made safe to store as the seed system makes
/// it: its last path part (either separator), printable characters only,
/// no leading dots, at most 200 characters; `Err` when nothing is left.
pub fn safe_attachment_name(raw: &str) -> Result<String, String> {
    let leaf = raw.replace('\\', "/");
    let leaf = leaf.rsplit('/').next().unwrap_or("").trim();
    let printable: String = leaf.chars().filter(|c| !c.is_control()).collect();
    let name = printable.trim().trim_start_matches('.').trim();
    if name.is_empty() {
        return Err(format!(
            "{raw:?} leaves no file name to store (a name that is only dots, separators or control characters): give one with --name"
        ));
    }
    Ok(name.chars().take(MAX_NAME_CHARS).collect())
}

/// The name `safe` is stored under in a folder where `taken` says which
/// names are used: `safe` itself, else `STEM (1).REST`, `STEM (2).REST`…
/// (split at the first dot, as the seed system splits it).
pub fn collision_free_name(safe: &str, taken: impl Fn(&str) -> bool) -> String {
    if !taken(safe) {
        return safe.to_owned();
    }
    let (stem, rest) = match safe.split_once('.') {
        Some((stem, rest)) => (stem, format!(".{rest}")),
        None => (safe, String::new()),
    };
    (1_u64..)
        .map(|n| format!("{stem} ({n}){rest}"))
        .find(|candidate| !taken(candidate))
        .unwrap_or_else(|| safe.to_owned())
}

/// Whether a file of `size` bytes fits a card.
pub fn check_attachment_size(size: u64) -> Result<(), String> {
    if size > MAX_ATTACHMENT_BYTES {
        return Err(format!(
            "the file is {size} bytes; a card takes files of at most {} MiB",
            MAX_ATTACHMENT_BYTES >> 20
        ));
    }
    Ok(())
}

/// The content type a file's name suggests, for the common kinds; `None`
/// leaves it unknown (served as bytes to download).
pub fn guess_content_type(name: &str) -> Option<&'static str> {
    let extension = name.rsplit_once('.')?.1.to_ascii_lowercase();
    Some(match extension.as_str() {
        "txt" | "log" => "text/plain",
        "md" => "text/markdown",
        "csv" => "text/csv",
        "json" => "application/json",
        "pdf" => "application/pdf",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "zip" => "application/zip",
        "gz" => "application/gzip",
        "html" | "htm" => "text/html",
        "svg" => "image/svg+xml",
        _ => return None,
    })
}

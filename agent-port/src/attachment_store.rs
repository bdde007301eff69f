//! Writing an attached file where the seed system keeps them
//! (`ROOT/TASK/NAME`), for `kanban attach` and the `kanban_attach` tool
//! alike: one path, one set of bounds.

use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::Path;

use kanban_core::attachments::{
    NewAttachment, check_attachment_size, collision_free_name, guess_content_type,
    safe_attachment_name,
};

/// A content type as a header carries it (`type/subtype`, plain
/// characters, 100 at most), lowercased; `Err` says why not.
pub fn checked_content_type(given: &str) -> Result<String, String> {
    let given = given.trim();
    let plain = |part: &str| {
        !part.is_empty()
            && part
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "!#$&-^_.+".contains(c))
    };
    match given.split_once('/') {
        Some((kind, sub)) if given.len() <= 100 && plain(kind) && plain(sub) => {
            Ok(given.to_ascii_lowercase())
        }
        _ => Err(format!(
            "{given:?} is not a content type: give one like text/plain or application/pdf"
        )),
    }
}

/// Writes `bytes` (at most 25 MiB) for card `task_id` under `root`, named
/// after `name` made safe and under a name no file there has yet
/// (owner-only folder and file); the record to write. The file is the
/// caller's to remove if the record is refused.
pub fn store_attachment(
    root: &Path,
    task_id: &str,
    name: &str,
    bytes: &[u8],
    content_type: Option<&str>,
    uploaded_by: &str,
) -> Result<NewAttachment, String> {
    check_attachment_size(bytes.len() as u64)?;
    let mut source = bytes;
    store_attachment_from(root, task_id, name, &mut source, content_type, uploaded_by)
}

/// [`store_attachment`] of what `source` reads, copied as it is read (a
/// file of 25 MiB is never held whole); one byte past the bound is refused
/// and what was written of it removed.
pub fn store_attachment_from(
    root: &Path,
    task_id: &str,
    name: &str,
    source: &mut dyn std::io::Read,
    content_type: Option<&str>,
    uploaded_by: &str,
) -> Result<NewAttachment, String> {
    use std::io::Read as _;
    if !kanban_core::is_valid_task_id(task_id) {
        return Err(format!("the card id {task_id:?} cannot name a folder"));
    }
    let safe = safe_attachment_name(name)?;
    let content_type = match content_type {
        Some(given) => Some(checked_content_type(given)?),
        None => guess_content_type(&safe).map(str::to_owned),
    };
    let folder = root.join(task_id);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&folder)
        .map_err(|error| {
            format!(
                "cannot make the attachments folder {}: {error}; make {} writable or set HERMES_KANBAN_ATTACHMENTS_ROOT",
                folder.display(),
                root.display()
            )
        })?;
    // The record names the file by its one canonical path, as the seed
    // system's does: the folder reached through no link.
    let folder = std::fs::canonicalize(&folder).map_err(|error| {
        format!(
            "cannot read the attachments folder {}: {error}",
            folder.display()
        )
    })?;
    let stored_name = collision_free_name(&safe, |taken| {
        std::fs::symlink_metadata(folder.join(taken)).is_ok()
    });
    let stored = folder.join(&stored_name);
    let cannot = |error: std::io::Error| format!("cannot write {}: {error}", stored.display());
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&stored)
        .map_err(cannot)?;
    let limit = kanban_core::attachments::MAX_ATTACHMENT_BYTES;
    let copied = std::io::copy(&mut source.take(limit + 1), &mut out);
    let size = match copied {
        Ok(size) => size,
        Err(error) => {
            let _ = std::fs::remove_file(&stored);
            return Err(cannot(error));
        }
    };
    if let Err(problem) = check_attachment_size(size) {
        let _ = std::fs::remove_file(&stored);
        // Only an empty folder goes; another file keeps it.
        let _ = std::fs::remove_dir(&folder);
        return Err(problem);
    }
    if let Err(error) = out.sync_all() {
        let _ = std::fs::remove_file(&stored);
        return Err(cannot(error));
    }
    Ok(NewAttachment {
        filename: stored_name,
        stored_path: stored.display().to_string(),
        content_type,
        size: i64::try_from(size).unwrap_or(i64::MAX),
        uploaded_by: Some(uploaded_by.to_owned()),
    })
}

/// Removes a file written for a record that was refused, and its card's
/// folder when that leaves it empty.
pub fn discard_attachment(stored: &NewAttachment) {
    let path = Path::new(&stored.stored_path);
    let _ = std::fs::remove_file(path);
    if let Some(folder) = path.parent() {
        // Only an empty folder goes; another file keeps it.
        let _ = std::fs::remove_dir(folder);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kanban_core::attachments::MAX_ATTACHMENT_BYTES;
    use std::io::Read as _;

    #[test]
    fn a_stream_past_the_bound_is_refused_and_leaves_no_file() {
        let root = tempfile::tempdir().unwrap();
        let mut big = std::io::repeat(b'x').take(MAX_ATTACHMENT_BYTES + 1);
        let refused =
            store_attachment_from(root.path(), "t_1234abcd", "big.bin", &mut big, None, "web");
        assert!(refused.is_err_and(|why| why.contains("at most")));
        assert!(!root.path().join("t_1234abcd").exists(), "nothing is left");
        let mut exact = std::io::repeat(b'x').take(MAX_ATTACHMENT_BYTES);
        let kept = store_attachment_from(
            root.path(),
            "t_1234abcd",
            "big.bin",
            &mut exact,
            None,
            "web",
        )
        .unwrap();
        assert_eq!(kept.size, i64::try_from(MAX_ATTACHMENT_BYTES).unwrap());
        assert_eq!(
            std::fs::metadata(&kept.stored_path).unwrap().len(),
            MAX_ATTACHMENT_BYTES
        );
    }
}

//! A card's workspace: where its agent works, in the seed system's kinds
//! and meanings (`hermes_cli/kanban_db.py` of `hermes-agent` 0.19.0,
//! `resolve_workspace`):
//!
//! - `scratch`: a folder of its own under the board's `workspaces/`,
//!   removed when the card is done;
//! - `dir:PATH`: an existing folder, kept;
//! - `worktree` or `worktree:PATH`: a linked git worktree on the card's
//!   branch (`wt/ID` unless named), at `REPO/.worktrees/ID` when PATH is a
//!   repository's top level, else at PATH; kept.
//!
//! Only the rules live here; making folders and worktrees is the host's.

use std::fmt;

/// What kind of place a card's agent works in.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum WorkspaceKind {
    #[default]
    Scratch,
    Dir,
    Worktree,
}

impl WorkspaceKind {
    /// Its stored name (the seed system's `workspace_kind`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Scratch => "scratch",
            Self::Dir => "dir",
            Self::Worktree => "worktree",
        }
    }

    /// The kind a stored name means; `None` for one this build does not know.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "scratch" => Some(Self::Scratch),
            "dir" => Some(Self::Dir),
            "worktree" => Some(Self::Worktree),
            _ => None,
        }
    }
}

impl fmt::Display for WorkspaceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A workspace as `add --workspace` names it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct WorkspaceSpec {
    pub kind: WorkspaceKind,
    /// The folder (`dir:`), or the repository or worktree (`worktree:`).
    pub path: Option<String>,
}

/// A card's workspace as stored, when it is not its own scratch folder.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct CardWorkspace {
    /// `scratch`, `dir` or `worktree` (one this build does not know stays
    /// as stored).
    pub kind: String,
    pub path: Option<String>,
    pub branch: Option<String>,
}

impl CardWorkspace {
    /// The stored columns as a card keeps them: `None` for a scratch folder
    /// of its own.
    pub fn from_columns(
        kind: Option<String>,
        path: Option<String>,
        branch: Option<String>,
    ) -> Option<Box<Self>> {
        let kind = kind.unwrap_or_else(|| WorkspaceKind::Scratch.as_str().to_owned());
        let plain = kind == WorkspaceKind::Scratch.as_str() && path.is_none() && branch.is_none();
        (!plain).then(|| Box::new(Self { kind, path, branch }))
    }
}

/// Why a workspace or branch cannot be taken.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WorkspaceError {
    #[error(
        "workspace {0:?} is not one of scratch, dir:PATH, worktree, worktree:PATH (an absolute PATH)"
    )]
    UnknownKind(String),
    #[error("workspace path {0:?} is not absolute: give the whole path, from /")]
    NotAbsolute(String),
    #[error("workspace path {0:?} has a `..` part: give the path it means")]
    ParentPart(String),
    #[error("workspace path {0:?} holds a control character")]
    ControlCharacter(String),
    #[error("a dir: workspace needs its PATH (dir:/abs/path)")]
    DirWithoutPath,
    #[error("a worktree workspace names its repository (worktree:/path/to/repo, or --repo)")]
    WorktreeWithoutPath,
    #[error(
        "branch {0:?} is not a branch name git takes: letters, digits and `/-._`, not starting with `-` or `/`, no `..`, not ending in `.lock`, `/` or `.`"
    )]
    BadBranch(String),
    #[error("--branch is for a worktree workspace: add --workspace worktree[:PATH]")]
    BranchWithoutWorktree,
}

/// The most of a path or branch name that is taken.
const LONGEST: usize = 4096;

fn check_path(path: &str) -> Result<(), WorkspaceError> {
    if path.chars().any(char::is_control) || path.len() > LONGEST {
        return Err(WorkspaceError::ControlCharacter(path.to_owned()));
    }
    if !path.starts_with('/') {
        return Err(WorkspaceError::NotAbsolute(path.to_owned()));
    }
    if path.split('/').any(|part| part == "..") {
        return Err(WorkspaceError::ParentPart(path.to_owned()));
    }
    Ok(())
}

/// Reads `add --workspace SPEC`.
pub fn parse_workspace(spec: &str) -> Result<WorkspaceSpec, WorkspaceError> {
    let spec = spec.trim();
    let (kind, path) = match spec.split_once(':') {
        Some((kind, path)) => (kind, Some(path)),
        None => (spec, None),
    };
    let kind = WorkspaceKind::parse(kind)
        .filter(|kind| *kind != WorkspaceKind::Scratch || path.is_none())
        .ok_or_else(|| WorkspaceError::UnknownKind(spec.to_owned()))?;
    if let Some(path) = path {
        check_path(path)?;
    } else if kind == WorkspaceKind::Dir {
        return Err(WorkspaceError::DirWithoutPath);
    }
    Ok(WorkspaceSpec {
        kind,
        path: path.map(str::to_owned),
    })
}

/// Whether git takes `name` as a branch (a safe subset of
/// `git check-ref-format --branch`).
pub fn valid_branch(name: &str) -> bool {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '/' | '-' | '.' | '_');
    !name.is_empty()
        && name.len() <= 255
        && name.chars().all(allowed)
        && !name.starts_with(['-', '/', '.'])
        && !name.ends_with(['/', '.'])
        && !name.ends_with(".lock")
        && !name.contains("..")
        && !name.contains("//")
        && !name.split('/').any(|part| part.starts_with('.'))
}

/// Checks a card's workspace and branch together, as `add` takes them.
pub fn check_workspace(spec: &WorkspaceSpec, branch: Option<&str>) -> Result<(), WorkspaceError> {
    match (&spec.path, spec.kind) {
        (Some(path), _) => check_path(path)?,
        (None, WorkspaceKind::Dir) => return Err(WorkspaceError::DirWithoutPath),
        (None, WorkspaceKind::Worktree) => return Err(WorkspaceError::WorktreeWithoutPath),
        (None, WorkspaceKind::Scratch) => {}
    }
    match branch {
        Some(_) if spec.kind != WorkspaceKind::Worktree => {
            Err(WorkspaceError::BranchWithoutWorktree)
        }
        Some(name) if !valid_branch(name) => Err(WorkspaceError::BadBranch(name.to_owned())),
        _ => Ok(()),
    }
}

/// The branch of a card's worktree: its own, else `wt/ID` (the seed
/// system's name).
pub fn worktree_branch(task_id: &str, branch: Option<&str>) -> String {
    branch
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .map_or_else(|| format!("wt/{task_id}"), str::to_owned)
}

/// Where a card's worktree goes when it names a repository's top level
/// (or nothing, and the repository is the board's): `REPO/.worktrees/ID`.
pub fn worktree_in(repo_root: &str, task_id: &str) -> String {
    format!("{}/.worktrees/{task_id}", repo_root.trim_end_matches('/'))
}

/// Whether a card's scratch folder, not empty, may go after its run: the
/// card is done (as the seed system removes it at completion) and every
/// card that waits for it is done or archived, so none of them may still
/// read what it left. A child whose status could not be read (`None`)
/// keeps it.
pub fn scratch_may_go(
    card: Option<crate::TaskStatus>,
    children: &[Option<crate::TaskStatus>],
) -> bool {
    use crate::TaskStatus::{Archived, Done};
    card == Some(Done)
        && children
            .iter()
            .all(|child| matches!(child, Some(Done | Archived)))
}

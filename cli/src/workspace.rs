//! A card's workspace on this host ([`kanban_core::workspaces`] has the
//! rules): checked against the world when the card is added, made (a
//! scratch folder, a git worktree) when its worker starts, and what the
//! run ended on, read for its result.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use kanban_core::workspaces::{
    WorkspaceKind, WorkspaceSpec, check_workspace, parse_workspace, worktree_branch, worktree_in,
};
use kanban_core::{Claim, Environment, TaskRecord, vars};

/// How long a worker waits for another's `git worktree` change on the same
/// repository.
const GIT_LOCK_PATIENCE: Duration = Duration::from_secs(30);

/// `git -C DIR ARGS…`: its trimmed output, or what it said. Git's own
/// variables of the caller never steer it to another repository.
fn git(dir: &Path, args: &[&str]) -> Result<String, String> {
    let mut command = Command::new("git");
    command
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_TERMINAL_PROMPT", "0")
        .env_remove("GIT_DIR")
        .env_remove("GIT_WORK_TREE")
        .env_remove("GIT_INDEX_FILE")
        .env_remove("GIT_COMMON_DIR");
    // Git runs the repository's hooks: they get no notification secret.
    for (name, _) in std::env::vars_os() {
        if name
            .to_str()
            .is_some_and(|name| name.starts_with(kanban_core::notify::SECRET_ENV_PREFIX))
        {
            command.env_remove(name);
        }
    }
    let output = command
        .output()
        .map_err(|error| format!("cannot run git: {error}; install git"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).trim().to_owned())
    }
}

/// Where `dir` stands in git: the common git folder of its repository, and
/// the top level and git folder of the checkout it is in.
#[derive(Debug)]
struct GitPlace {
    common: PathBuf,
    top: PathBuf,
    git_dir: PathBuf,
}

fn git_place(dir: &Path) -> Option<GitPlace> {
    let found = git(
        dir,
        &[
            "rev-parse",
            "--path-format=absolute",
            "--git-common-dir",
            "--show-toplevel",
            "--git-dir",
        ],
    )
    .ok()?;
    let mut lines = found.lines().map(PathBuf::from);
    Some(GitPlace {
        common: lines.next()?,
        top: lines.next()?,
        git_dir: lines.next()?,
    })
}

impl GitPlace {
    /// The repository's main checkout: where its common git folder is.
    fn main_checkout(&self) -> Result<PathBuf, String> {
        match self.common.file_name() {
            Some(name) if name == ".git" => {
                Ok(self.common.parent().unwrap_or(Path::new("/")).to_owned())
            }
            _ => Err(format!(
                "{} is a bare repository: name a checkout of it for a worktree",
                self.common.display()
            )),
        }
    }

    /// Whether `path` is the top level of a linked worktree (not the main
    /// checkout).
    fn is_linked_worktree(&self, path: &Path) -> bool {
        self.top == path && self.git_dir != self.common
    }
}

/// The nearest folder of `path` that exists.
fn nearest_existing(path: &Path) -> &Path {
    path.ancestors()
        .find(|ancestor| ancestor.exists())
        .unwrap_or(Path::new("/"))
}

/// Where a branch is checked out, by branch name (`git worktree list`).
fn checked_out(repo: &Path) -> Vec<(String, PathBuf)> {
    let Ok(list) = git(repo, &["worktree", "list", "--porcelain"]) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    let mut at = None;
    for line in list.lines() {
        if let Some(path) = line.strip_prefix("worktree ") {
            at = Some(PathBuf::from(path));
        } else if let (Some(branch), Some(path)) = (line.strip_prefix("branch refs/heads/"), &at) {
            found.push((branch.to_owned(), path.clone()));
        }
    }
    found
}

/// The repository (its main checkout) and the worktree's place for a
/// `worktree` workspace naming `path`, as the seed system reads it: a
/// linked worktree is itself; the main checkout's top level means its
/// `.worktrees/ID`; another path is where a new worktree goes, which is
/// never inside a checkout (it would show in that checkout's status), but
/// under `.worktrees/` or outside.
fn worktree_place(path: &Path, task_id: &str) -> Result<(PathBuf, PathBuf), String> {
    let not_in_git = || {
        format!(
            "{} is not in a git repository: name a repository (or a worktree of one) for a worktree",
            path.display()
        )
    };
    let place = git_place(nearest_existing(path)).ok_or_else(not_in_git)?;
    let repo = place.main_checkout()?;
    if place.is_linked_worktree(path) {
        return Ok((repo, path.to_owned()));
    }
    if path == repo {
        let target = PathBuf::from(worktree_in(&repo.display().to_string(), task_id));
        return Ok((repo, target));
    }
    let under_worktrees = path.parent() == Some(repo.join(".worktrees").as_path());
    if path.starts_with(&place.top) && !under_worktrees {
        return Err(format!(
            "{} is inside the checkout {}: a worktree there would show in its status; name the repository (its worktree goes to .worktrees/ID) or a place outside it",
            path.display(),
            place.top.display()
        ));
    }
    Ok((repo, path.to_owned()))
}

/// The workspace the children of a decomposed card get: a `dir:` the same
/// folder; a worktree card's repository (its main checkout), so each child
/// gets a worktree of its own; else, or when the repository is gone, none
/// (a scratch folder each).
pub(crate) fn for_children(root: &TaskRecord) -> Option<WorkspaceSpec> {
    let path = Path::new(root.workspace_path()?);
    match WorkspaceKind::parse(root.workspace_kind())? {
        WorkspaceKind::Dir => Some(WorkspaceSpec {
            kind: WorkspaceKind::Dir,
            path: Some(path.display().to_string()),
        }),
        WorkspaceKind::Worktree => {
            let repo = git_place(nearest_existing(path))?.main_checkout().ok()?;
            Some(WorkspaceSpec {
                kind: WorkspaceKind::Worktree,
                path: Some(repo.display().to_string()),
            })
        }
        WorkspaceKind::Scratch => None,
    }
}

/// `add --workspace SPEC --repo R --branch B`, checked against the world:
/// what the card keeps (paths canonical, symbolic links resolved).
pub(crate) fn for_add(
    spec: Option<&str>,
    repo: Option<&Path>,
    branch: Option<&str>,
) -> anyhow::Result<(Option<WorkspaceSpec>, Option<String>)> {
    let mut spec = spec.map(parse_workspace).transpose()?;
    if let Some(repo) = repo {
        // The repository, wherever in it (a worktree of it too) it is named:
        // its main checkout.
        let absolute = git_place(repo)
            .ok_or_else(|| anyhow::anyhow!("--repo {}: not a git repository", repo.display()))?
            .main_checkout()
            .map_err(anyhow::Error::msg)?;
        match &mut spec {
            None => {
                spec = Some(WorkspaceSpec {
                    kind: WorkspaceKind::Worktree,
                    path: Some(absolute.display().to_string()),
                });
            }
            Some(WorkspaceSpec {
                kind: WorkspaceKind::Worktree,
                path: path @ None,
            }) => *path = Some(absolute.display().to_string()),
            Some(_) => bail!(
                "--repo names the repository of a worktree workspace: drop it, or use --workspace worktree"
            ),
        }
    }
    let Some(mut spec) = spec else {
        if branch.is_some() {
            bail!(
                "--branch is for a worktree workspace: add --workspace worktree:REPO (or --repo REPO)"
            );
        }
        return Ok((None, None));
    };
    check_workspace(&spec, branch)?;
    let given = PathBuf::from(spec.path.clone().unwrap_or_default());
    spec.path = match spec.kind {
        WorkspaceKind::Scratch => spec.path,
        WorkspaceKind::Dir => Some(checked_dir(&given)?),
        WorkspaceKind::Worktree if spec.path.is_none() => bail!(
            "a worktree workspace names its repository: --workspace worktree:/path/to/repo (or --repo)"
        ),
        WorkspaceKind::Worktree => Some(checked_worktree(&given, branch)?),
    };
    Ok((Some(spec), branch.map(str::to_owned)))
}

/// A `dir:` folder as `add` takes it: there, a folder, writable; its
/// canonical path.
fn checked_dir(given: &Path) -> anyhow::Result<String> {
    let dir = std::fs::canonicalize(given).with_context(|| {
        format!(
            "--workspace dir:{}: no such folder; make it first",
            given.display()
        )
    })?;
    if !dir.is_dir() {
        bail!("--workspace dir:{}: not a folder", given.display());
    }
    if nix::unistd::access(&dir, nix::unistd::AccessFlags::W_OK).is_err() {
        bail!(
            "--workspace dir:{}: not writable by you; an agent could not work there",
            dir.display()
        );
    }
    Ok(dir.display().to_string())
}

/// A `worktree:` path as `add` takes it: in a git repository, its branch
/// checked out nowhere else; the path with its symbolic links resolved.
fn checked_worktree(given: &Path, branch: Option<&str>) -> anyhow::Result<String> {
    let canonical = match std::fs::canonicalize(given) {
        Ok(path) => path,
        Err(_) => {
            let anchor = nearest_existing(given);
            let rest = given.strip_prefix(anchor).unwrap_or(Path::new(""));
            std::fs::canonicalize(anchor)
                .unwrap_or_else(|_| anchor.to_owned())
                .join(rest)
        }
    };
    // The card's own worktree may hold its branch (a worktree named by its
    // path, made before); any other checkout of it may not.
    let (repo, target) = worktree_place(&canonical, "ID").map_err(anyhow::Error::msg)?;
    if let Some(branch) = branch
        && let Some((_, at)) = checked_out(&repo)
            .into_iter()
            .find(|(name, at)| name == branch && *at != target)
    {
        bail!(
            "branch {branch} is checked out at {}: a card's worktree needs a branch of its own (git worktree remove, or another --branch)",
            at.display()
        );
    }
    Ok(canonical.display().to_string())
}

/// A claimed card's workspace on this host, made ready for its agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Place {
    pub(crate) kind: WorkspaceKind,
    pub(crate) path: PathBuf,
    /// A worktree's branch.
    pub(crate) branch: Option<String>,
}

impl Place {
    /// What its agent is handed: the workspace under both names.
    pub(crate) fn env(&self) -> Vec<(String, String)> {
        vars::under_both_names([(vars::WORKSPACE, self.path.display().to_string())])
            .map(|(name, value)| (name.to_owned(), value))
            .collect()
    }

    /// What the run ended on, for its result: the workspace, and a
    /// worktree's branch and commit.
    pub(crate) fn result(&self) -> serde_json::Map<String, serde_json::Value> {
        let mut facts = serde_json::Map::new();
        // A scratch folder is the card's own and goes: nothing to record.
        if self.kind == WorkspaceKind::Scratch {
            return facts;
        }
        facts.insert(
            "workspace".to_owned(),
            self.path.display().to_string().into(),
        );
        facts.insert("workspace_kind".to_owned(), self.kind.as_str().into());
        if let Some(branch) = &self.branch {
            facts.insert("branch".to_owned(), branch.clone().into());
            if let Ok(commit) = git(&self.path, &["rev-parse", "HEAD"]) {
                facts.insert("commit".to_owned(), commit.into());
            }
        }
        facts
    }
}

/// The folder under which scratch workspaces of the board file `db` are
/// made, where the seed system makes them.
pub(crate) fn scratch_root(db: &Path, env: &Environment) -> PathBuf {
    if let Some(root) = env.get_trimmed(vars::WORKSPACES_ROOT) {
        return std::path::absolute(root).unwrap_or_else(|_| PathBuf::from(root));
    }
    let folder = db.parent().unwrap_or(Path::new("/"));
    if crate::supervisor::seed_default_board(db) {
        folder.join("kanban").join("workspaces")
    } else {
        folder.join("workspaces")
    }
}

/// The scratch workspace of `task_id` on the board file `db`.
pub(crate) fn scratch_of(db: &Path, task_id: &str, env: &Environment) -> PathBuf {
    scratch_root(db, env).join(task_id)
}

/// Makes `task`'s workspace ready for the run of `claim`: a fault of the
/// environment, never the card's, when it cannot be.
pub(crate) fn prepare(
    task: &TaskRecord,
    claim: &Claim,
    env: &Environment,
) -> Result<Place, String> {
    if !kanban_core::is_valid_task_id(&claim.task_id) {
        return Err(format!(
            "the card id {:?} cannot name a workspace",
            claim.task_id
        ));
    }
    let kind = WorkspaceKind::parse(task.workspace_kind()).ok_or_else(|| {
        format!(
            "card {} has a workspace kind this build does not know ({:?})",
            task.id,
            task.workspace_kind()
        )
    })?;
    let given = task.workspace_path().map(PathBuf::from);
    match (kind, given) {
        (WorkspaceKind::Scratch, _) => {
            let db = if crate::board_path::postgres_url(Path::new(&claim.db)).is_some() {
                crate::board_path::claim_host_folder(env).join("kanban.db")
            } else {
                PathBuf::from(&claim.db)
            };
            let path = scratch_of(&db, &task.id, env);
            make_private(&path)?;
            Ok(Place {
                kind,
                path,
                branch: None,
            })
        }
        (WorkspaceKind::Dir, Some(path)) if path.is_dir() => Ok(Place {
            kind,
            path,
            branch: None,
        }),
        (WorkspaceKind::Dir, path) => Err(format!(
            "card {}'s workspace folder {} is gone: make it again, or edit the card",
            task.id,
            path.unwrap_or_default().display()
        )),
        (WorkspaceKind::Worktree, None) => Err(format!(
            "card {} has a worktree workspace that names no repository",
            task.id
        )),
        (WorkspaceKind::Worktree, Some(path)) => {
            let (repo, target) = worktree_place(&path, &task.id)?;
            let branch = worktree_branch(&task.id, task.branch_name());
            ensure_worktree(&repo, &target, &branch, &claim.db)?;
            Ok(Place {
                kind,
                path: target,
                branch: Some(branch),
            })
        }
    }
}

fn make_private(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::DirBuilderExt as _;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(|error| {
            format!(
                "cannot make the workspace {}: {error}; make its folder writable or set {}",
                path.display(),
                vars::WORKSPACES_ROOT
            )
        })
}

/// `target` as a worktree of `repo` on `branch`: made once, reused after.
/// `git worktree` changes on one repository take turns (a lock file in its
/// git folder, waited for a bounded time).
fn ensure_worktree(repo: &Path, target: &Path, branch: &str, board: &str) -> Result<(), String> {
    let place = git_place(repo)
        .ok_or_else(|| format!("{} is not a git repository any more", repo.display()))?;
    let _turn = take_turn(&place.common.join("kanban-worktree.lock"))?;
    if target.exists() {
        // Only the card's own worktree, on its own branch, is worked in.
        let theirs = git_place(target)
            .filter(|theirs| theirs.common == place.common && theirs.is_linked_worktree(target));
        let on = git(target, &["symbolic-ref", "--quiet", "HEAD"]).unwrap_or_default();
        return match theirs {
            Some(_) if on == format!("refs/heads/{branch}") => Ok(()),
            Some(_) => Err(format!(
                "the worktree {} is on {on:?}, not on the card's branch {branch}: check it out there, or name another place",
                target.display()
            )),
            None => Err(format!(
                "{} exists and is not a worktree of {}: move it away, or name another place",
                target.display(),
                repo.display()
            )),
        };
    }
    if target.starts_with(repo.join(".worktrees")) {
        keep_out_of_status(&place.common);
    }
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|error| format!("cannot make {}: {error}", parent.display()))?;
    }
    let target_text = target.display().to_string();
    let branch_ref = format!("refs/heads/{branch}");
    let exists = git(repo, &["rev-parse", "--verify", "--quiet", &branch_ref]).is_ok();
    let made = if exists {
        git(repo, &["worktree", "add", "--", &target_text, branch])
    } else {
        git(
            repo,
            &["worktree", "add", "-b", branch, "--", &target_text, "HEAD"],
        )
    };
    made.map_err(|said| {
        format!(
            "git worktree add {} on branch {branch} failed: {said}",
            target.display()
        )
    })?;
    mark_as_ours(target, board);
    Ok(())
}

/// The file in a worktree's own git folder naming the board that made it:
/// `gc` takes away only the worktrees its own board made.
const MARKER: &str = "kanban-board";

fn mark_as_ours(target: &Path, board: &str) {
    if let Some(place) = git_place(target) {
        let _ = std::fs::write(place.git_dir.join(MARKER), format!("{board}\n"));
    }
}

/// Whether the worktree at `target` was made for a card of `board`.
fn made_for(target: &Path, board: &str) -> bool {
    git_place(target)
        .and_then(|place| std::fs::read_to_string(place.git_dir.join(MARKER)).ok())
        .is_some_and(|named| named.trim_end() == board)
}

/// Keeps the cards' worktrees out of the main checkout's status (the
/// repository's own `info/exclude`, never a tracked `.gitignore`).
fn keep_out_of_status(common: &Path) {
    use std::io::Write as _;
    let exclude = common.join("info").join("exclude");
    let listed = std::fs::read_to_string(&exclude).unwrap_or_default();
    if listed.lines().any(|line| line.trim() == "/.worktrees/") {
        return;
    }
    let _ = std::fs::create_dir_all(common.join("info"));
    if let Ok(mut file) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&exclude)
    {
        let _ = writeln!(
            file,
            "{}/.worktrees/",
            if listed.ends_with('\n') || listed.is_empty() {
                ""
            } else {
                "\n"
            }
        );
    }
}

/// An exclusive lock on `path`, waited for up to [`GIT_LOCK_PATIENCE`].
fn take_turn(path: &Path) -> Result<nix::fcntl::Flock<std::fs::File>, String> {
    use nix::fcntl::{Flock, FlockArg};
    use std::os::unix::fs::OpenOptionsExt as _;
    let started = Instant::now();
    loop {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(path)
            .map_err(|error| format!("cannot open {}: {error}", path.display()))?;
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => return Ok(lock),
            Err((_, nix::errno::Errno::EWOULDBLOCK)) if started.elapsed() < GIT_LOCK_PATIENCE => {
                std::thread::sleep(Duration::from_millis(100));
            }
            Err((_, errno)) => {
                return Err(format!(
                    "another worktree change on this repository held {} for {}s ({errno}): try again",
                    path.display(),
                    GIT_LOCK_PATIENCE.as_secs()
                ));
            }
        }
    }
}

/// Takes away the workspace of a card that is archived or pruned: its
/// scratch folder, and its worktree unless git finds changes in it not
/// committed (`git worktree remove` without `--force`: kept, and said); its
/// branch stays. What it did, when there is something to say.
pub(crate) fn retire(task: &TaskRecord, db: &Path, env: &Environment) -> Option<String> {
    if !kanban_core::is_valid_task_id(&task.id) {
        return None;
    }
    match WorkspaceKind::parse(task.workspace_kind())? {
        WorkspaceKind::Scratch => {
            let folder = scratch_of(db, &task.id, env);
            std::fs::remove_dir_all(&folder).ok()?;
            None
        }
        WorkspaceKind::Dir => None,
        WorkspaceKind::Worktree => {
            let (repo, target) =
                worktree_place(Path::new(task.workspace_path()?), &task.id).ok()?;
            if !target.exists() {
                return None;
            }
            let target_text = target.display().to_string();
            Some(
                match git(&repo, &["worktree", "remove", "--", &target_text]) {
                    Ok(_) => format!("removed its worktree {target_text} (its branch stays)"),
                    Err(said) => format!(
                        "kept its worktree {target_text}: {said} (commit or drop the changes, then git worktree remove)"
                    ),
                },
            )
        }
    }
}

/// Removes the worktrees under `REPO/.worktrees/` that `board` made, of
/// the repositories the cards of `tasks` name, whose card is no longer
/// among them (with
/// `git worktree remove`: one with changes not committed is kept, and
/// said); what was done, a line each.
pub(crate) fn orphan_worktrees(tasks: &[TaskRecord], board: &str) -> Vec<String> {
    let known: std::collections::BTreeSet<&str> =
        tasks.iter().map(|task| task.id.as_str()).collect();
    let repos: std::collections::BTreeSet<PathBuf> = tasks
        .iter()
        .filter(|task| task.workspace_kind() == WorkspaceKind::Worktree.as_str())
        .filter_map(|task| {
            let path = task.workspace_path()?;
            worktree_place(Path::new(path), &task.id)
                .ok()
                .map(|(repo, _)| repo)
        })
        .collect();
    let mut said = Vec::new();
    for repo in repos {
        let Ok(entries) = std::fs::read_dir(repo.join(".worktrees")) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(id) = name.to_str() else { continue };
            // Only the worktrees this board made: not another board's, nor
            // the seed system's, in the same repository.
            if !kanban_core::is_valid_task_id(id)
                || known.contains(id)
                || !made_for(&entry.path(), board)
            {
                continue;
            }
            let target = entry.path().display().to_string();
            said.push(match git(&repo, &["worktree", "remove", "--", &target]) {
                Ok(_) => format!("removed the worktree {target} of {id}, a card no longer on the board (its branch stays)"),
                Err(error) => format!("kept the worktree {target} of {id}, a card no longer on the board: {error}"),
            });
        }
    }
    said
}

/// Removes a done card's scratch folder (as the seed system does), unless
/// a card waiting for it may still read what it left.
pub(crate) fn remove_scratch(place: &Place) {
    if place.kind == WorkspaceKind::Scratch {
        let _ = std::fs::remove_dir_all(&place.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scratch_workspaces_sit_where_the_seed_system_makes_them() {
        let dir = tempfile::tempdir().unwrap();
        let named = dir.path().join("boards/x/kanban.db");
        assert_eq!(
            scratch_root(&named, &Environment::new()),
            dir.path().join("boards/x/workspaces")
        );
        let default = dir.path().join("kanban.db");
        assert_eq!(
            scratch_root(&default, &Environment::new()),
            dir.path().join("workspaces")
        );
        std::fs::write(dir.path().join("kanban.db.init.lock"), "").unwrap();
        assert_eq!(
            scratch_root(&default, &Environment::new()),
            dir.path().join("kanban/workspaces")
        );
    }
}

//! The seed system's own worker under ours (`hermes:PROFILE`): where it
//! works and what it is handed, as the seed system's dispatcher hands it
//! (`_default_spawn` of `hermes_cli/kanban_db.py`).

use std::path::{Path, PathBuf};

use kanban_core::{Claim, Environment, EnvironmentFault, is_valid_task_id, vars};

use crate::board_path::postgres_url;

/// Where the seed worker runs and what it gets on top of a worker's agent
/// environment.
#[derive(Debug)]
pub(crate) struct SeedWorkerPlace {
    /// Its program: `HERMES_BIN`, else `hermes` on `PATH`.
    pub(crate) program: String,
    /// The card's scratch workspace: its working directory.
    pub(crate) workspace: PathBuf,
    pub(crate) env: Vec<(String, String)>,
    /// What it must not inherit.
    pub(crate) env_remove: Vec<String>,
}

/// The seed worker's place for `claim`, in the card's `workspace` (made
/// ready by [`crate::workspace::prepare`]); a fault of the environment
/// (never the card's) when it cannot have one.
pub(crate) fn seed_worker_place(
    profile: &str,
    claim: &Claim,
    tenant: Option<&str>,
    env: &Environment,
    workspace: &Path,
) -> Result<SeedWorkerPlace, EnvironmentFault> {
    let fault = |what: String| EnvironmentFault::Configuration(what);
    let db = Path::new(&claim.db);
    if postgres_url(db).is_some() {
        return Err(fault(format!(
            "the seed system's worker (hermes:{profile}) writes the board's SQLite file itself, so it cannot work a PostgreSQL board; route these cards to another agent"
        )));
    }
    if !is_valid_task_id(&claim.task_id) {
        return Err(fault(format!(
            "the card id {:?} cannot name a workspace folder",
            claim.task_id
        )));
    }
    let absolute = |path: &Path| {
        std::path::absolute(path).map_err(|error| {
            fault(format!(
                "cannot make {} absolute for the seed system's worker: {error}",
                path.display()
            ))
        })
    };
    let db = absolute(db)?;
    let root = crate::workspace::scratch_root(&db, env);
    let workspace = workspace.to_owned();
    let program = env.get_trimmed("HERMES_BIN").unwrap_or("hermes").to_owned();
    let shown = |path: &Path| path.display().to_string();
    let mut pairs: Vec<(String, String)> = vars::under_both_names([
        (vars::WORKSPACE, shown(&workspace)),
        (vars::WORKSPACES_ROOT, shown(&root)),
        (vars::DB, shown(&db)),
    ])
    .map(|(name, value)| (name.to_owned(), value))
    .collect();
    // Its file tools and context files anchor on the workspace, and its
    // comments are signed with the profile, as the seed system sets them.
    pairs.push(("TERMINAL_CWD".to_owned(), shown(&workspace)));
    pairs.push(("HERMES_PROFILE".to_owned(), profile.to_owned()));
    // The cards it makes belong to its card's tenant, as the seed system's
    // `kanban_create` defaults them.
    if let Some(tenant) = tenant {
        pairs.push(("HERMES_TENANT".to_owned(), tenant.to_owned()));
    }
    Ok(SeedWorkerPlace {
        program,
        workspace,
        env: pairs,
        // An inherited TUI setting would send its quiet run into the
        // interactive interface, which exits 0 having done nothing.
        env_remove: vec!["HERMES_TUI".to_owned()],
    })
}

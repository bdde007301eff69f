//! The board's agents file: named agents, each a command or an HTTP
//! endpoint with its own limits and environment, that cards are routed to by
//! assignee. `kanban.toml` beside the board, or `--agents FILE`.
//!
//! ```toml
//! default = "coder"                  # the agent for cards with no assignee
//! triage_agent = "planner"           # the agent `specify` and `decompose` ask
//!
//! [agents.coder]
//! command = "./agents/coder.sh"      # or: http = "https://api.example/v1?model=m"
//!                                    # or: hermes = "coder" (the seed system's worker,
//!                                    #     `hermes -p coder`; hermes_bin = its program)
//!                                    # (a relative program: from this file's folder)
//! turn_timeout = "20m"
//! recovery_delays = "15,45,90"
//! max_in_progress = 2
//! provider = "anthropic:team"       # the provider a command agent calls
//! workspace = "worktree:/src/app"    # its cards' workspace, unless they name one
//! env = { CODER_PROFILE = "strict" }
//! description = "writes and tests Rust"  # what `decompose` routes to it
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kanban_core::Environment;
use serde::Deserialize;

use kanban_agent_port::SEED_WORKER_PREFIX;

use crate::agent_check::{anchor_program, is_agent_name, validate_agent};
use crate::duration::parse_limit;

/// The file name looked for beside the board.
pub(crate) const AGENTS_FILE: &str = "kanban.toml";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileShape {
    default: Option<String>,
    triage_agent: Option<String>,
    #[serde(default)]
    agents: BTreeMap<String, EntryShape>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EntryShape {
    command: Option<String>,
    http: Option<String>,
    hermes: Option<String>,
    hermes_bin: Option<String>,
    turn_timeout: Option<String>,
    recovery_delays: Option<String>,
    max_in_progress: Option<u32>,
    provider: Option<String>,
    workspace: Option<String>,
    description: Option<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
}

impl std::fmt::Debug for EntryShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The environment may carry secrets: names only.
        f.debug_struct("EntryShape")
            .field("command", &self.command)
            .field("http", &self.http)
            .field("hermes", &self.hermes)
            .field("env", &self.env.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// One agent as a worker is started for it.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct AgentCommand {
    /// What `kanban worker --agent` gets: a command or `http:…`.
    pub(crate) spec: String,
    /// More worker arguments (`--turn-timeout`, `--recovery-delays`).
    pub(crate) args: Vec<String>,
    /// More worker (and so agent) environment.
    pub(crate) env: Vec<(String, String)>,
    /// Runs of this agent at once on the board, at most.
    pub(crate) max_in_progress: Option<usize>,
    /// The provider a command agent calls, as the file declares it: the
    /// only provider its runs may wall (`walls::entitled_provider`).
    pub(crate) provider: Option<String>,
    /// The workspace of the cards assigned to it that name none
    /// (`add --workspace`'s form).
    pub(crate) workspace: Option<String>,
    /// What it is good at: the decomposer routes child cards by it.
    pub(crate) description: Option<String>,
}

impl AgentCommand {
    /// An agent given on the command line: its spec alone.
    pub(crate) fn bare(spec: String) -> Self {
        Self {
            spec,
            args: Vec::new(),
            env: Vec::new(),
            max_in_progress: None,
            provider: None,
            workspace: None,
            description: None,
        }
    }
}

impl std::fmt::Debug for AgentCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentCommand")
            .field("spec", &self.spec)
            .field("args", &self.args)
            .field(
                "env",
                &self.env.iter().map(|(name, _)| name).collect::<Vec<_>>(),
            )
            .field("max_in_progress", &self.max_in_progress)
            .field("provider", &self.provider)
            .field("workspace", &self.workspace)
            .field("description", &self.description)
            .finish()
    }
}

/// The agents of a board's file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct AgentsFile {
    pub(crate) path: PathBuf,
    pub(crate) agents: BTreeMap<String, AgentCommand>,
    /// The agent for cards with no assignee.
    pub(crate) default: Option<String>,
    /// The agent `specify` and `decompose` ask when none is named.
    pub(crate) triage_agent: Option<String>,
}

/// Where the agents file is: `--agents FILE` (it must exist), else
/// `kanban.toml` beside the board (if it exists).
pub(crate) fn agents_file_path(given: Option<&Path>, folder: &Path) -> Option<PathBuf> {
    if let Some(given) = given {
        return Some(given.to_owned());
    }
    let beside = folder.join(AGENTS_FILE);
    beside.is_file().then_some(beside)
}

/// Reads and checks an agents file: every agent named as a card's assignee
/// can be, has exactly one of `command` and `http` (checked as `--agent`
/// is), and limits that parse.
pub(crate) fn load(path: &Path, env: &Environment) -> Result<AgentsFile, String> {
    let where_ = path.display();
    check_owner_only_writes(path)?;
    let text = std::fs::read_to_string(path)
        .map_err(|error| format!("cannot read the agents file {where_}: {error}"))?;
    let shape: FileShape = toml::from_str(&text).map_err(|error| {
        format!(
            "the agents file {where_} is not valid: {}",
            error.to_string().trim()
        )
    })?;
    // Relative commands are read from the file's folder, wherever the
    // dispatcher runs (and a worker gets them absolute).
    let absolute = std::path::absolute(path)
        .map_err(|error| format!("cannot read the agents file {where_}: {error}"))?;
    let folder = absolute.parent().unwrap_or(Path::new("/"));
    let mut agents = BTreeMap::new();
    for (name, entry) in shape.agents {
        let agent = agent_of(&where_, folder, &name, entry, env)?;
        agents.insert(name, agent);
    }
    for (key, named) in [
        ("default", &shape.default),
        ("triage_agent", &shape.triage_agent),
    ] {
        if let Some(name) = named
            && !agents.contains_key(name)
        {
            return Err(format!(
                "{where_}: {key} = {name:?} names no agent of the file ({})",
                names(&agents)
            ));
        }
    }
    Ok(AgentsFile {
        path: path.to_owned(),
        agents,
        default: shape.default,
        triage_agent: shape.triage_agent,
    })
}

/// One agent of an agents file, checked.
fn agent_of(
    where_: &std::path::Display<'_>,
    folder: &Path,
    name: &str,
    entry: EntryShape,
    env: &Environment,
) -> Result<AgentCommand, String> {
    let problem = |what: String| format!("{where_}: agent {name}: {what}");
    if !is_agent_name(name) {
        return Err(format!(
            "{where_}: {name:?} cannot name an agent: use letters, digits, '_', '-' and '.'"
        ));
    }
    let key = match (&entry.http, &entry.hermes) {
        (Some(_), _) => "`http`",
        (None, Some(_)) => "`hermes`",
        (None, None) => "`command`",
    };
    let spec = spec_of(entry.command, entry.http, entry.hermes, folder).map_err(&problem)?;
    let mut file_env = entry.env;
    if let Some(program) = hermes_bin(entry.hermes_bin, &spec, folder).map_err(&problem)? {
        file_env.insert("HERMES_BIN".to_owned(), program);
    }
    let mut checked_env = env.clone();
    if let Some(program) = file_env.get("HERMES_BIN") {
        checked_env.set("HERMES_BIN", program.clone());
    }
    validate_agent(Some(&spec), key, &checked_env).map_err(&problem)?;
    let mut args = Vec::new();
    if let Some(limit) = &entry.turn_timeout {
        parse_limit(limit).map_err(|error| problem(format!("turn_timeout: {error}")))?;
        args.extend(["--turn-timeout".to_owned(), limit.clone()]);
    }
    if let Some(delays) = &entry.recovery_delays {
        let valid = delays
            .split(',')
            .all(|delay| delay.trim().parse::<u64>().is_ok());
        if !valid {
            return Err(problem(format!(
                "recovery_delays {delays:?}: give whole seconds separated by commas (15,45,90)"
            )));
        }
        args.extend(["--recovery-delays".to_owned(), delays.clone()]);
    }
    if entry.max_in_progress == Some(0) {
        return Err(problem("max_in_progress is at least 1".to_owned()));
    }
    if let Some((key, _)) = file_env
        .iter()
        .find(|(key, value)| key.is_empty() || key.contains(['=', '\0']) || value.contains('\0'))
    {
        return Err(problem(format!(
            "env key {key:?}: a variable's name is not empty and holds no `=` (and neither name nor value a NUL)"
        )));
    }
    check_provider_workspace_description(
        &entry.provider,
        &entry.workspace,
        &entry.description,
        &spec,
    )
    .map_err(&problem)?;
    Ok(AgentCommand {
        workspace: entry.workspace.map(|workspace| workspace.trim().to_owned()),
        description: entry.description,
        spec,
        args,
        env: file_env.into_iter().collect(),
        max_in_progress: entry
            .max_in_progress
            .map(|limit| usize::try_from(limit).unwrap_or(usize::MAX)),
        provider: entry.provider.map(|provider| provider.trim().to_owned()),
    })
}

/// The provider (command agents only, a declarable name), workspace and
/// description of an agent, checked.
fn check_provider_workspace_description(
    provider: &Option<String>,
    workspace: &Option<String>,
    description: &Option<String>,
    spec: &str,
) -> Result<(), String> {
    if let Some(provider) = provider {
        if spec.starts_with("http:") {
            return Err(
                "provider is for command agents: an HTTP agent's provider is its endpoint and key"
                    .to_owned(),
            );
        }
        if !kanban_core::walls::is_declarable_provider(provider) {
            return Err(format!(
                "provider {provider:?}: name the provider the agent calls (like \"anthropic:team\"); `agent:` names are the agents' own"
            ));
        }
    }
    if let Some(workspace) = workspace
        && let Err(error) = kanban_core::workspaces::parse_workspace(workspace)
    {
        return Err(format!("workspace: {error}"));
    }
    if let Some(description) = description
        && (description.len() > 2000 || description.contains('\0'))
    {
        return Err("description: at most 2000 bytes of text, no NUL".to_owned());
    }
    Ok(())
}

/// The `--agent` spec of an agent given by exactly one of its three keys.
fn spec_of(
    command: Option<String>,
    http: Option<String>,
    hermes: Option<String>,
    folder: &Path,
) -> Result<String, String> {
    match (command, http, hermes) {
        (Some(command), None, None) => Ok(anchor_program(&command, folder)),
        // `http:` before the URL, as `--agent` takes it, is allowed too.
        (None, Some(http), None)
            if http.starts_with("http:http://") || http.starts_with("http:https://") =>
        {
            Ok(http)
        }
        (None, Some(http), None) => Ok(format!("http:{http}")),
        (None, None, Some(profile)) => Ok(format!("{SEED_WORKER_PREFIX}{profile}")),
        _ => Err("give exactly one of `command` (a command run once per turn), `http` (an OpenAI-compatible endpoint) and `hermes` (a profile of the seed system's own worker)".to_owned()),
    }
}

/// `hermes_bin`, absolute (a relative one from the file's folder): only for
/// the seed system's worker.
fn hermes_bin(given: Option<String>, spec: &str, folder: &Path) -> Result<Option<String>, String> {
    let Some(program) = given else {
        return Ok(None);
    };
    if !spec.starts_with(SEED_WORKER_PREFIX) {
        return Err(
            "hermes_bin is for `hermes` agents: it names the seed system's program".to_owned(),
        );
    }
    let program = std::path::absolute(folder.join(program.trim()))
        .map_err(|error| format!("hermes_bin: {error}"))?;
    Ok(Some(program.display().to_string()))
}

/// An agents file says what commands run: like ssh with its config, only
/// its owner (or root) may be able to change it.
fn check_owner_only_writes(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt as _;
    let where_ = path.display();
    let meta = std::fs::metadata(path)
        .map_err(|error| format!("cannot read the agents file {where_}: {error}"))?;
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me && meta.uid() != 0 {
        return Err(format!(
            "the agents file {where_} belongs to another user (uid {}), who could change what it runs: keep your own copy",
            meta.uid()
        ));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(format!(
            "the agents file {where_} may be changed by other users (mode {:o}), who could change what it runs: run `chmod go-w {where_}`",
            meta.mode() & 0o777
        ));
    }
    Ok(())
}

/// The agents' names, for messages.
pub(crate) fn names(agents: &BTreeMap<String, AgentCommand>) -> String {
    if agents.is_empty() {
        return "it names none".to_owned();
    }
    agents.keys().cloned().collect::<Vec<_>>().join(", ")
}

//! The agent a dispatcher is given, checked before anything is claimed.

use std::collections::BTreeMap;
use std::path::Path;

use kanban_core::Environment;
use kanban_core::walls::{AgentRoute, ProviderId, route_label};

use crate::agents_file::AgentCommand;

/// The dispatcher's agents by route (`""`: the unnamed one), from its
/// `--agent` values: `NAME=SPEC` names an agent (the cards assigned to NAME
/// go to it), a bare `SPEC` is the unnamed agent (cards with no assignee, or
/// every card when no agent is named). NAME is letters, digits, `_`, `-`
/// and `.`; a command that starts with a variable assignment is written
/// `env VAR=value CMD`. Each agent is checked as [`validate_agent`] says.
pub(crate) fn parse_agents(
    values: &[String],
    env: &Environment,
) -> Result<BTreeMap<String, String>, String> {
    let mut agents = BTreeMap::new();
    for value in values {
        let (route, spec) = match value.split_once('=') {
            Some((name, spec)) if is_agent_name(name) => (name.to_owned(), spec.to_owned()),
            _ => (String::new(), value.clone()),
        };
        validate_agent(Some(&spec), env).map_err(|problem| match route.as_str() {
            "" => problem,
            name => format!("agent {name}: {problem}"),
        })?;
        if agents.insert(route.clone(), spec).is_some() {
            return Err(match route.as_str() {
                "" => {
                    "two --agent values name no agent; give all but one a name (--agent NAME=CMD)"
                        .to_owned()
                }
                name => {
                    format!("two --agent values are named {name}; give each agent its own name")
                }
            });
        }
    }
    if agents.is_empty() {
        validate_agent(None, env)?;
    }
    Ok(agents)
}

/// A name an agent can be routed by (a card's assignee).
pub(crate) fn is_agent_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

/// An agent as walls see it: its name with a digest of its command (two
/// different commands are two agents; the command itself may hold secrets
/// and never reaches the board), and the provider it is known to call
/// before it ran: an HTTP agent's endpoint, key fingerprint and model; a
/// command agent's as its agents file declares it (`provider`), else none.
pub(crate) fn agent_route(route: &str, agent: &AgentCommand, env: &Environment) -> AgentRoute {
    use sha2::Digest;
    let spec = agent.spec.as_str();
    let digest = sha2::Sha256::digest(spec.as_bytes());
    let short: String = digest
        .iter()
        .take(4)
        .map(|byte| format!("{byte:02x}"))
        .collect();
    let provider = match kanban_agent_port::HttpAgentConfig::parse(spec, env) {
        Ok(config) if spec.starts_with("http:") => ProviderId {
            provider: Some(config.provider_id()),
            model: Some(config.model),
        },
        _ => ProviderId {
            provider: agent.provider.clone(),
            model: None,
        },
    };
    AgentRoute {
        identity: format!("{}#{short}", route_label(route)),
        provider,
        max_in_progress: agent.max_in_progress,
    }
}

/// The first word of a shell command, unquoted.
fn first_word(command: &str) -> Option<String> {
    let command = command.trim_start();
    let quote = command.chars().next().filter(|c| *c == '\'' || *c == '"');
    match quote {
        Some(quote) => command[1..].split(quote).next().map(str::to_owned),
        None => command.split_whitespace().next().map(str::to_owned),
    }
}

/// Checks the agent before anything is claimed: a missing or mistyped agent
/// is the dispatcher's configuration, and no card may pay for it.
pub(crate) fn validate_agent(agent: Option<&str>, env: &Environment) -> Result<(), String> {
    let Some(agent) = agent.map(str::trim).filter(|agent| !agent.is_empty()) else {
        return Err(
            "dispatch needs an agent: pass --agent CMD or set KANBAN_AGENT (see docs/agent-protocol.md)"
                .to_owned(),
        );
    };
    if agent.starts_with("http:") {
        return kanban_agent_port::HttpAgentConfig::parse(agent, env)
            .map(|_| ())
            .map_err(|error| format!("--agent {agent:?}: {error}"));
    }
    let Some(program) = first_word(agent) else {
        return Err(format!("--agent {agent:?} names no command"));
    };
    let executable = |path: &Path| {
        use std::os::unix::fs::PermissionsExt;
        path.metadata()
            .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        let path = Path::new(&program);
        if !path.exists() {
            return Err(format!(
                "the agent {program} does not exist; check the path given to --agent"
            ));
        }
        if !executable(path) {
            return Err(format!(
                "the agent {program} is not an executable file; make it one (chmod +x) or run it through an interpreter (--agent 'sh {program}')"
            ));
        }
        return Ok(());
    }
    const SHELL_WORDS: [&str; 6] = ["exec", "env", "cd", "set", "export", "eval"];
    if SHELL_WORDS.contains(&program.as_str()) {
        return Ok(());
    }
    let found = env
        .get("PATH")
        .unwrap_or("/usr/bin:/bin")
        .split(':')
        .any(|dir| executable(&Path::new(dir).join(&program)));
    if found {
        Ok(())
    } else {
        Err(format!(
            "the agent command {program} is not on PATH; give its full path to --agent"
        ))
    }
}

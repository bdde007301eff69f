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
        validate_agent(Some(&spec), "--agent", env).map_err(|problem| match route.as_str() {
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
        validate_agent(None, "--agent", env)?;
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
    split_program(command).map(|(program, _)| program)
}

/// A shell command's first word, unquoted, and the rest of the command
/// after it.
fn split_program(command: &str) -> Option<(String, &str)> {
    let command = command.trim_start();
    let quote = command.chars().next().filter(|c| *c == '\'' || *c == '"');
    let (program, rest) = match quote {
        Some(quote) => {
            let inner = &command[1..];
            let end = inner.find(quote)?;
            (&inner[..end], &inner[end + 1..])
        }
        None => {
            let end = command.find(char::is_whitespace).unwrap_or(command.len());
            (&command[..end], &command[end..])
        }
    };
    (!program.is_empty()).then(|| (program.to_owned(), rest))
}

/// A command whose program is a relative path (`./agents/coder.sh`, with a
/// `/` in it) rewritten with the program's absolute path under `folder`, as
/// Cargo and git resolve the paths of their configuration files against the
/// file's folder: a worker runs it the same from any folder. Other commands
/// (a program found on `PATH`, an absolute path, a relative path given as an
/// argument) are kept as written.
pub(crate) fn anchor_program(command: &str, folder: &Path) -> String {
    match split_program(command) {
        Some((program, rest)) if program.contains('/') && !program.starts_with('/') => {
            match folder.join(program.trim_start_matches("./")).to_str() {
                Some(absolute) => format!("{}{rest}", shell_quoted(absolute)),
                // A folder whose name is not UTF-8 cannot be written into
                // a command: the command is checked as written instead.
                None => command.to_owned(),
            }
        }
        _ => command.to_owned(),
    }
}

/// A word the shell reads back as exactly `word`.
fn shell_quoted(word: &str) -> String {
    let plain = word
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '/' | '.' | '_' | '-' | '+' | ',' | ':'));
    if plain {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

/// Checks the agent before anything is claimed: a missing or mistyped agent
/// is the dispatcher's configuration, and no card may pay for it. `key` is
/// where the agent was given (`--agent`, or an agents file's `command`), for
/// the messages.
pub(crate) fn validate_agent(
    agent: Option<&str>,
    key: &str,
    env: &Environment,
) -> Result<(), String> {
    let Some(agent) = agent.map(str::trim).filter(|agent| !agent.is_empty()) else {
        return Err(
            "dispatch needs an agent: pass --agent CMD or set KANBAN_AGENT (see docs/agent-protocol.md)"
                .to_owned(),
        );
    };
    if agent.starts_with("http:") {
        return kanban_agent_port::HttpAgentConfig::parse(agent, env)
            .map(|_| ())
            .map_err(|error| format!("{key} {agent:?}: {error}"));
    }
    let seed_worker = kanban_agent_port::seed_worker_profile(agent);
    if let Some(Err(problem)) = &seed_worker {
        return Err(format!("{key} {agent:?}: {problem}"));
    }
    let program = match seed_worker {
        // The seed system's worker: its program as its dispatcher finds it.
        Some(_) => Some(env.get_trimmed("HERMES_BIN").unwrap_or("hermes").to_owned()),
        None => first_word(agent),
    };
    let Some(program) = program else {
        return Err(format!("{key} {agent:?} names no command"));
    };
    let key = if seed_worker.is_some() {
        "HERMES_BIN (or hermes_bin in the agents file)"
    } else {
        key
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
                "the agent {program} does not exist; check the path given to {key}"
            ));
        }
        if !executable(path) {
            return Err(format!(
                "the agent {program} is not an executable file; make it one (chmod +x) or run it through an interpreter ('sh {program}')"
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
            "the agent command {program} is not on PATH; give its full path to {key}"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::anchor_program;
    use std::path::Path;

    #[test]
    fn a_relative_program_is_anchored_and_the_rest_kept_as_written() {
        let folder = Path::new("/srv/my board's");
        for (command, anchored) in [
            ("./a.sh", "'/srv/my board'\\''s/a.sh'"),
            (
                "bin/a --fast 'x y'",
                "'/srv/my board'\\''s/bin/a' --fast 'x y'",
            ),
            ("'sub dir/a' -v", "'/srv/my board'\\''s/sub dir/a' -v"),
            ("/opt/a.sh -v", "/opt/a.sh -v"),
            ("python3 ./a.py", "python3 ./a.py"),
            ("'unclosed", "'unclosed"),
            ("", ""),
        ] {
            assert_eq!(anchor_program(command, folder), anchored, "{command}");
        }
        assert_eq!(
            anchor_program("./a.sh x", Path::new("/srv/board")),
            "/srv/board/a.sh x"
        );
    }
}

//! The agent a dispatcher is given, checked before anything is claimed.

use std::path::Path;

use kanban_core::Environment;

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

//! Real agent scripts for end-to-end tests: small `sh` programs written into
//! a temporary folder, speaking the agent protocol, recording every request.

use std::path::{Path, PathBuf};

/// One turn of a scripted agent: shell lines to run, then one line to print
/// as the turn result.
#[derive(Clone, Debug)]
pub struct AgentTurn {
    shell: String,
    result: Option<String>,
    exit: i32,
}

impl AgentTurn {
    /// Prints `json` as the result line.
    pub fn result(json: &str) -> Self {
        Self {
            shell: String::new(),
            result: Some(json.to_owned()),
            exit: 0,
        }
    }

    /// Prints nothing that parses as a result; exits with `code`.
    pub fn exit(code: i32) -> Self {
        Self {
            shell: String::new(),
            result: None,
            exit: code,
        }
    }

    /// Runs `shell` first (it may call `$KANBAN_BIN complete …`).
    pub fn after(mut self, shell: &str) -> Self {
        self.shell.push_str(shell);
        self.shell.push('\n');
        self
    }

    /// Finishes the card with a terminal `complete` call before answering;
    /// a refused call ends the turn with the call's exit code (75 when the
    /// board, not the card, failed), as the agent protocol asks.
    pub fn completing(self) -> Self {
        self.after(
            r#""$KANBAN_BIN" complete --summary "finished by the scripted agent" >&2 || exit $?"#,
        )
    }
}

/// An agent whose turn N plays the Nth scripted turn (the last repeats).
#[derive(Clone, Debug)]
pub struct AgentScript {
    turns: Vec<AgentTurn>,
}

/// A written agent script and where it records its requests.
#[derive(Clone, Debug)]
pub struct WrittenAgent {
    /// The script to pass as `--agent`.
    pub path: PathBuf,
    /// One `turn-N.json` per turn, holding the request the agent read.
    pub requests: PathBuf,
}

impl WrittenAgent {
    /// Every request the agent received, in turn order.
    pub fn requests(&self) -> Vec<serde_json::Value> {
        let mut turns = Vec::new();
        for n in 1.. {
            let Ok(text) = std::fs::read_to_string(self.requests.join(format!("turn-{n}.json")))
            else {
                break;
            };
            turns.push(serde_json::from_str(text.trim()).expect("the request is JSON"));
        }
        turns
    }
}

impl AgentScript {
    /// An agent playing `turns`.
    pub fn new(turns: Vec<AgentTurn>) -> Self {
        assert!(
            !turns.is_empty(),
            "a scripted agent needs at least one turn"
        );
        Self { turns }
    }

    /// Writes the script as `dir/name`, executable.
    pub fn write(&self, dir: &Path, name: &str) -> WrittenAgent {
        let path = dir.join(name);
        let requests = dir.join(format!("{name}.requests"));
        std::fs::create_dir_all(&requests).unwrap();
        let mut script = format!(
            "#!/bin/sh\n# Written by kanban-testkit: a scripted agent.\ncat > '{}/turn-'\"$KANBAN_TURN\"'.json'\ncase \"$KANBAN_TURN\" in\n",
            requests.display()
        );
        for (index, turn) in self.turns.iter().enumerate() {
            let pattern = if index + 1 == self.turns.len() {
                "*".to_owned()
            } else {
                (index + 1).to_string()
            };
            script.push_str(&format!("{pattern})\n{}", turn.shell));
            if let Some(result) = &turn.result {
                script.push_str(&format!(
                    "printf '%s\\n' '{}'\n",
                    result.replace('\'', r"'\''")
                ));
            }
            script.push_str(&format!("exit {}\n;;\n", turn.exit));
        }
        script.push_str("esac\n");
        write_executable(&path, &script);
        WrittenAgent { path, requests }
    }
}

/// Writes `text` to `path` and makes it executable.
pub fn write_executable(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A judge that records each request and always rules `verdict`.
pub fn write_judge(dir: &Path, verdict: &str) -> (PathBuf, PathBuf) {
    let path = dir.join("judge.sh");
    let calls = dir.join("judge.calls");
    write_executable(
        &path,
        &format!(
            "#!/bin/sh\ncat >> '{}'\necho >> '{}'\nprintf '%s\\n' '{{\"verdict\": \"{verdict}\", \"reason\": \"scripted\"}}'\n",
            calls.display(),
            calls.display()
        ),
    );
    (path, calls)
}

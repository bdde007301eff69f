//! What a dispatcher hands its worker that no agent may read: the seal
//! that signs the worker's trailer, the address of the dispatcher's socket
//! and the board's password. They travel on the worker's standard input,
//! read to its end before any agent starts, never in its environment: a
//! process of the same user reads `/proc/PID/environ` of any other.

use std::io::Read;

use kanban_core::Environment;

use crate::dispatch_link::LINK_VAR;
use crate::worker::SEAL_VAR;

/// Set (to `stdin`) in a worker's environment when its secrets come on its
/// standard input.
pub(crate) const SECRETS_VAR: &str = "KANBAN_WORKER_SECRETS";
/// The board's password, as libpq names it.
pub(crate) const PASSWORD_VAR: &str = "PGPASSWORD";
/// The variables that are secrets: never in a worker's environment when a
/// dispatcher starts it.
pub(crate) const SECRET_VARS: [&str; 3] = [SEAL_VAR, LINK_VAR, PASSWORD_VAR];
/// The notifications' secret variables of `env` (`KANBAN_SECRET_*`): only
/// a dispatcher's deliverer reads them, and no process kanban starts gets
/// them, whoever started kanban.
pub(crate) fn notify_secret_names(env: &Environment) -> Vec<String> {
    let prefix = kanban_core::notify::SECRET_ENV_PREFIX;
    env.iter()
        .map(|(name, _)| name)
        .chain(env.unreadable())
        .filter(|name| name.starts_with(prefix))
        .map(str::to_owned)
        .collect()
}

/// The variables of `env` that no child process gets: the worker secrets,
/// and the notifications' secrets (`KANBAN_SECRET_*`), which only the
/// dispatcher's deliverer reads.
pub(crate) fn withheld(env: &Environment) -> Vec<String> {
    SECRET_VARS
        .iter()
        .map(|name| (*name).to_owned())
        .chain(notify_secret_names(env))
        .collect()
}

/// The most a worker reads of its standard input for them.
const MOST: u64 = 64 * 1024;

/// The secrets as one line for a worker's standard input: each variable
/// with its value, as JSON.
pub(crate) fn encode(secrets: &[(String, String)]) -> String {
    let map: serde_json::Map<String, serde_json::Value> = secrets
        .iter()
        .map(|(name, value)| (name.clone(), serde_json::Value::String(value.clone())))
        .collect();
    format!("{}\n", serde_json::Value::Object(map))
}

/// The worker's environment with the secrets its dispatcher sent on its
/// standard input, when it says they come there; the process's own
/// environment never holds them. A worker started by hand reads nothing.
pub(crate) fn receive(env: &Environment) -> Result<Environment, String> {
    if env.get_trimmed(SECRETS_VAR) != Some("stdin") {
        return Ok(env.clone());
    }
    let mut line = Vec::new();
    std::io::stdin()
        .take(MOST)
        .read_to_end(&mut line)
        .map_err(|error| format!("cannot read the secrets on standard input: {error}"))?;
    decode(env, &line)
}

fn decode(env: &Environment, line: &[u8]) -> Result<Environment, String> {
    let map: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(line)
        .map_err(|_| "the secrets on standard input are not a JSON object".to_owned())?;
    let mut env = env.clone();
    for (name, value) in map {
        let (Some(name), Some(value)) = (
            SECRET_VARS.iter().find(|known| **known == name),
            value.as_str(),
        ) else {
            return Err(format!("the secrets on standard input hold {name:?}"));
        };
        env.set(*name, value);
    }
    Ok(env)
}

/// The secrets of the dispatcher's own environment its workers need: the
/// board's password.
pub(crate) fn from_dispatcher(env: &Environment) -> Vec<(String, String)> {
    env.get(PASSWORD_VAR)
        .filter(|password| !password.is_empty())
        .map(|password| (PASSWORD_VAR.to_owned(), password.to_owned()))
        .into_iter()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_round_trip_and_nothing_else_is_taken() {
        let env = Environment::from_vars([("PATH", "/bin")]);
        let line = encode(&[
            (SEAL_VAR.to_owned(), "s3al".to_owned()),
            (PASSWORD_VAR.to_owned(), "pw\n\"x".to_owned()),
        ]);
        let got = decode(&env, line.as_bytes()).unwrap();
        assert_eq!(got.get(SEAL_VAR), Some("s3al"));
        assert_eq!(got.get(PASSWORD_VAR), Some("pw\n\"x"));
        assert_eq!(got.get("PATH"), Some("/bin"));
        assert!(decode(&env, br#"{"PATH": "/evil"}"#).is_err());
        assert!(decode(&env, br#"{"PGPASSWORD": 3}"#).is_err());
        assert!(decode(&env, b"not json").is_err());
        assert!(decode(&env, b"").is_err());
    }
}

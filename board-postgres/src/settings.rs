//! A board URL's connection settings as a host reads them: the password
//! never from the URL.

use std::path::PathBuf;

use kanban_core::{BoardError, Environment};

use crate::{BoardUrl, Config, Host};

/// The connection settings of a board URL, as a host reads them from its
/// environment (`env`): the password from `PGPASSWORD`, else the password
/// file (`PGPASSFILE`, else `~/.pgpass`), never from the URL, which reaches
/// claims, logs and process listings; a URL naming no user takes `PGUSER`,
/// else `USER`.
pub fn settings(url: &str, env: &Environment) -> Result<BoardUrl, BoardError> {
    let unusable = |message: &str| BoardError::Unusable {
        path: "--db".to_owned(),
        message: message.to_owned(),
    };
    let mut parsed = crate::parse_url(url)?;
    let config = &mut parsed.config;
    if config.get_password().is_some() {
        return Err(unusable(
            "the URL carries a password, which would reach every worker's environment and the process list; \
             drop it from the URL and give it through PGPASSWORD or ~/.pgpass",
        ));
    }
    if config.get_user().is_none() {
        let user = env
            .get_trimmed("PGUSER")
            .or(env.get_trimmed("USER"))
            .ok_or_else(|| unusable("the URL names no user (postgres://USER@HOST:PORT/DBNAME) and neither PGUSER nor USER is set"))?;
        config.user(user);
    }
    if let Some(password) = env.get("PGPASSWORD").filter(|p| !p.is_empty()) {
        config.password(password);
    } else if let Some(password) = pgpass_password(config, env) {
        config.password(password);
    }
    Ok(parsed)
}

/// The first matching line of the password file, as libpq reads it
/// (`host:port:database:user:password`, `*` matches anything, `\` escapes).
/// A file others may read is ignored, as libpq ignores it.
fn pgpass_password(config: &Config, env: &Environment) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let path = match env.get_trimmed("PGPASSFILE") {
        Some(path) => PathBuf::from(path),
        None => PathBuf::from(env.get_trimmed("HOME")?).join(".pgpass"),
    };
    let meta = std::fs::metadata(&path).ok()?;
    if !meta.is_file() || meta.mode() & 0o077 != 0 || meta.len() > 1 << 20 {
        return None;
    }
    let text = std::fs::read_to_string(&path).ok()?;
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(host)) => host.clone(),
        Some(Host::Unix(_)) | None => "localhost".to_owned(),
    };
    let port = config
        .get_ports()
        .first()
        .copied()
        .unwrap_or(5432)
        .to_string();
    let user = config.get_user().unwrap_or("");
    let database = config.get_dbname().unwrap_or(user);
    let wanted = [host.as_str(), port.as_str(), database, user];
    text.lines()
        .filter(|line| !line.trim_start().starts_with('#'))
        .find_map(|line| {
            let fields = pgpass_fields(line);
            let [h, p, d, u, password] = fields.as_slice() else {
                return None;
            };
            let matches = [h, p, d, u]
                .iter()
                .zip(wanted)
                .all(|(field, want)| field.as_str() == "*" || field.as_str() == want);
            matches.then(|| password.clone())
        })
}

fn pgpass_fields(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(next) = chars.next()
                    && let Some(field) = fields.last_mut()
                {
                    field.push(next);
                }
            }
            ':' if fields.len() < 5 => fields.push(String::new()),
            c => {
                if let Some(field) = fields.last_mut() {
                    field.push(c);
                }
            }
        }
    }
    fields
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use kanban_core::Environment;

    use super::settings as postgres_config;

    const URL: &str = "postgres://kanban@db.example:5433/cards";

    fn env_with(file: &std::path::Path, extra: &[(&str, &str)]) -> Environment {
        let mut pairs = vec![("PGPASSFILE".to_owned(), file.display().to_string())];
        pairs.extend(
            extra
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        );
        Environment::from_vars(pairs)
    }

    fn password(env: &Environment) -> Option<Vec<u8>> {
        postgres_config(URL, env)
            .unwrap()
            .config
            .get_password()
            .map(<[u8]>::to_vec)
    }

    #[test]
    fn the_password_comes_from_the_password_file_as_libpq_reads_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pgpass");
        std::fs::write(
            &file,
            "# comment\n\
             other.example:5433:cards:kanban:not-this-host\n\
             db.example:5432:cards:kanban:not-this-port\n\
             db.example:5433:*:someone:not-this-user\n\
             db.example:*:cards:kanban:se\\:cr\\\\et\n\
             *:*:*:*:too-late\n",
        )
        .unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(password(&env_with(&file, &[])), Some(b"se:cr\\et".to_vec()));
        // PGPASSWORD comes first.
        assert_eq!(
            password(&env_with(&file, &[("PGPASSWORD", "from-env")])),
            Some(b"from-env".to_vec())
        );
        // A file others may read is ignored, as libpq ignores it.
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(password(&env_with(&file, &[])), None);
    }

    #[test]
    fn a_password_in_the_url_is_refused_without_echoing_it() {
        let error = postgres_config(
            "postgres://kanban:hunter2@db.example/cards",
            &Environment::new(),
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("PGPASSWORD"), "{error}");
        assert!(!error.contains("hunter2"), "{error}");
    }

    #[test]
    fn a_url_without_a_user_takes_pguser_then_user() {
        let env = Environment::from_vars([("PGUSER", "pg-user"), ("USER", "login")]);
        let config = postgres_config("postgres://db.example/cards", &env).unwrap();
        assert_eq!(config.config.get_user(), Some("pg-user"));
        let env = Environment::from_vars([("USER", "login")]);
        let config = postgres_config("postgres://db.example/cards", &env).unwrap();
        assert_eq!(config.config.get_user(), Some("login"));
        assert!(postgres_config("postgres://db.example/cards", &Environment::new()).is_err());
    }
}

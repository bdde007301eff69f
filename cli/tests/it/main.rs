//! End-to-end tests: the built `kanban` binary, a real board file, real
//! agent scripts as child processes, real signals.

mod admin;
mod dispatch;
mod hostile;
mod http;
mod prove;
mod storm;
mod worker;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kanban_core::vars;
use serde_json::Value;

pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_kanban");

/// A fresh board in a temporary folder, and helpers to drive the binary.
pub(crate) struct Bench {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) db: PathBuf,
}

impl Bench {
    pub(crate) fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("kanban.db");
        let bench = Self { dir, db };
        bench.ok(&["init"]);
        bench
    }

    pub(crate) fn path(&self) -> &Path {
        self.dir.path()
    }

    /// `kanban` with a clean environment: no ambient carrier, no home board.
    pub(crate) fn command(&self) -> Command {
        let mut command = Command::new(BIN);
        for name in vars::CARRIER {
            command.env_remove(name);
        }
        command
            .env_remove(vars::HOME)
            .env_remove("KANBAN_AGENT")
            .env_remove("KANBAN_JUDGE")
            .env("NO_COLOR", "1");
        command
    }

    /// `kanban --db BOARD ARGS…`.
    pub(crate) fn run(&self, args: &[&str]) -> Output {
        self.command()
            .arg("--db")
            .arg(&self.db)
            .args(args)
            .output()
            .unwrap()
    }

    /// Like [`Bench::run`], asserting success; returns stdout.
    pub(crate) fn ok(&self, args: &[&str]) -> String {
        let output = self.run(args);
        assert!(
            output.status.success(),
            "kanban {args:?} failed:\n{}",
            text(&output.stderr)
        );
        text(&output.stdout)
    }

    pub(crate) fn add(&self, title: &str, extra: &[&str]) -> String {
        let mut args = vec!["add", title];
        args.extend_from_slice(extra);
        self.ok(&args).trim().to_owned()
    }

    /// Claims `id` and returns its carrier as environment pairs.
    pub(crate) fn claim(&self, id: &str, ttl: Option<i64>) -> Vec<(String, String)> {
        let ttl = ttl.map(|t| t.to_string());
        let mut args = vec!["claim", id, "--json"];
        if let Some(ttl) = &ttl {
            args.extend(["--ttl", ttl]);
        }
        let claim: Value = serde_json::from_str(&self.ok(&args)).unwrap();
        vec![
            (
                vars::TASK.to_owned(),
                claim["task_id"].as_str().unwrap().to_owned(),
            ),
            (
                vars::DB.to_owned(),
                claim["db"].as_str().unwrap().to_owned(),
            ),
            (vars::RUN_ID.to_owned(), claim["run_id"].to_string()),
            (
                vars::CLAIM_LOCK.to_owned(),
                claim["claim_lock"].as_str().unwrap().to_owned(),
            ),
        ]
    }

    /// The first event of `kind` on card `id`; fails the test when there is none.
    pub(crate) fn event(&self, id: &str, kind: &str) -> Value {
        let card = self.show(id);
        card["events"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["kind"] == kind)
            .unwrap_or_else(|| panic!("{id} has no {kind} event: {card}"))
            .clone()
    }

    pub(crate) fn show(&self, id: &str) -> Value {
        serde_json::from_str(&self.ok(&["show", id, "--json"])).unwrap()
    }

    /// Runs `kanban worker` on a claimed card with the given carrier.
    pub(crate) fn worker(
        &self,
        carrier: &[(String, String)],
        agent: &Path,
        extra_env: &[(&str, &str)],
        extra_args: &[&str],
    ) -> Output {
        let mut command = self.command();
        command
            .envs(carrier.iter().map(|(k, v)| (k, v)))
            .envs(extra_env.iter().copied());
        command
            .arg("worker")
            .arg("--agent")
            .arg(agent)
            .args(["--recovery-delays", "0"])
            .args(extra_args);
        command.output().unwrap()
    }
}

pub(crate) fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

pub(crate) fn last_line(bytes: &[u8]) -> String {
    text(bytes)
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .to_owned()
}

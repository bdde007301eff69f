//! End-to-end tests: the built `kanban` binary, a real board file, real
//! agent scripts as child processes, real signals.

#![allow(
    clippy::too_many_lines,
    reason = "the length rule is for src/: a test or a benchmark reads best whole"
)]
#![allow(
    clippy::disallowed_methods,
    clippy::disallowed_types,
    reason = "tests and benchmarks read their knobs from the environment and drive real processes and files"
)]

mod admin;
mod boards;
mod dispatch;
mod faults;
mod hostile;
mod hosts;
mod http;
mod inputs;
mod notify;
mod postgres;
mod prove;
mod seed_interop;
mod serve;
mod serve_attacks;
mod storm;
mod triage;
mod walls;
mod web;
mod worker;
mod workspaces;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use kanban_core::vars;
use serde_json::Value;

pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_kanban");

/// A fresh board in a temporary folder, and helpers to drive the binary.
pub(crate) struct Bench {
    pub(crate) dir: tempfile::TempDir,
    /// The board: a file, or a `postgres://` URL.
    pub(crate) db: PathBuf,
    /// The kanban home (a PostgreSQL board keeps its logs there); none:
    /// no home at all.
    pub(crate) home: Option<PathBuf>,
}

impl Bench {
    pub(crate) fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("kanban.db");
        let bench = Self {
            dir,
            db,
            home: None,
        };
        bench.ok(&["init"]);
        bench
    }

    /// A fresh board on its own database of the test cluster; the kanban
    /// home (its logs) in a temporary folder.
    pub(crate) fn postgres() -> Self {
        Self::postgres_at(&kanban_testkit::PgCluster::shared().fresh_database())
    }

    /// A board at the PostgreSQL URL `url`; the kanban home in a temporary
    /// folder.
    pub(crate) fn postgres_at(url: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let db = PathBuf::from(url);
        let home = dir.path().join("home");
        let bench = Self {
            dir,
            db,
            home: Some(home),
        };
        bench.ok(&["init"]);
        bench
    }

    pub(crate) fn path(&self) -> &Path {
        self.dir.path()
    }

    /// `kanban` with a clean environment: no ambient carrier, no home board.
    pub(crate) fn command(&self) -> Command {
        let mut command = Command::new(BIN);
        for (seed, ours) in vars::KANBAN_NAMES {
            command.env_remove(seed).env_remove(ours);
        }
        match &self.home {
            Some(home) => command.env(vars::HOME, home),
            None => command.env_remove(vars::HOME),
        };
        command
            .env_remove("KANBAN_DB")
            .env_remove("KANBAN_AGENT")
            .env_remove("KANBAN_JUDGE")
            .env("NO_COLOR", "1");
        command
    }

    /// `kanban --db DB` for a board file other than this bench's own.
    pub(crate) fn on(&self, db: &Path) -> Command {
        let mut command = self.command();
        command.arg("--db").arg(db);
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

    /// Runs `kanban --db BOARD ARGS…`, which must fail with 1 and say `needle`.
    pub(crate) fn refused(&self, args: &[&str], needle: &str) {
        let output = self.run(args);
        let said = text(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{args:?}: {said}");
        assert!(said.contains(needle), "{args:?}: {said}");
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

/// Now, in epoch seconds, as the board stamps it.
pub(crate) fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| {
            i64::try_from(elapsed.as_secs()).unwrap_or(i64::MAX)
        })
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

pub(crate) fn runs(card: &Value) -> Vec<Value> {
    card["runs"].as_array().unwrap().clone()
}

pub(crate) fn wait_for(what: &str, mut ready: impl FnMut() -> bool) {
    let started = Instant::now();
    while !ready() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// True once process `pid` is neither running nor a zombie waiting to be reaped.
pub(crate) fn reaped(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('X')),
    }
}

/// True once process `pid` runs no more: gone, or a zombie (its parent, or
/// init, has yet to reap it).
pub(crate) fn dead(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| matches!(rest.trim_start().chars().next(), Some('Z' | 'X'))),
    }
}

/// A tmpfs of `size` mounted under the bench, unmounted on drop.
pub(crate) struct Mount(pub(crate) PathBuf);

impl Mount {
    /// Mounting needs root: the test fails, rather than skips, without it
    /// (CI runs as root).
    pub(crate) fn tmpfs(bench: &Bench, size: &str) -> Self {
        assert!(
            nix::unistd::geteuid().is_root(),
            "this test mounts a tmpfs and needs root (run the suite as root, as CI does)"
        );
        let point = bench.path().join("mnt");
        std::fs::create_dir_all(&point).unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&point)
            .status()
            .unwrap();
        assert!(status.success(), "mount a tmpfs at {}", point.display());
        Self(point)
    }

    pub(crate) fn remount(&self, mode: &str) {
        assert!(
            Command::new("mount")
                .args(["-o", &format!("remount,{mode}")])
                .arg(&self.0)
                .status()
                .unwrap()
                .success()
        );
    }

    pub(crate) fn remount_read_only(&self) {
        self.remount("ro");
    }

    /// Makes the folder read-only for every path lookup from now on (a
    /// read-only bind mount over itself), while files already open stay
    /// writable: a plain `remount,ro` is refused while SQLite holds the
    /// board open for writing.
    pub(crate) fn freeze(&self) {
        for args in [&["--bind"][..], &["-o", "remount,bind,ro"][..]] {
            assert!(
                Command::new("mount")
                    .args(args)
                    .arg(&self.0)
                    .arg(&self.0)
                    .status()
                    .unwrap()
                    .success(),
                "mount {args:?}"
            );
        }
    }

    /// Undoes [`Mount::freeze`].
    pub(crate) fn thaw(&self) {
        assert!(
            Command::new("umount")
                .arg(&self.0)
                .status()
                .unwrap()
                .success()
        );
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        // Every layer: a frozen mount has two.
        while Command::new("umount")
            .arg(&self.0)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
        {}
    }
}

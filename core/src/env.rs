//! The process environment as a value.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;

/// The names of the environment variables kanban reads and hands on.
///
/// The `HERMES_KANBAN_*` names are the seed system's, kept verbatim so that a
/// board and a worker written by either side understand each other. Each has
/// a `KANBAN_*` name too ([`KANBAN_NAMES`]): a worker's processes get both,
/// and where both are set the seed system's name wins, because it is the one
/// a dispatcher of either system pins for its worker.
pub mod vars {
    /// The task (card) id a worker was spawned for.
    pub const TASK: &str = "HERMES_KANBAN_TASK";
    /// The board file the dispatcher pinned at spawn.
    pub const DB: &str = "HERMES_KANBAN_DB";
    /// The run id the claim opened.
    pub const RUN_ID: &str = "HERMES_KANBAN_RUN_ID";
    /// The claim lock string of the claim.
    pub const CLAIM_LOCK: &str = "HERMES_KANBAN_CLAIM_LOCK";
    /// The board slug.
    pub const BOARD: &str = "HERMES_KANBAN_BOARD";
    /// `1` when the task runs in goal mode.
    pub const GOAL_MODE: &str = "HERMES_KANBAN_GOAL_MODE";
    /// The in-place recovery budget.
    pub const TURN_RECOVERY: &str = "HERMES_KANBAN_TURN_RECOVERY";
    /// Turns the stop nudge off when set to an off value.
    pub const STOP_NUDGE: &str = "HERMES_KANBAN_STOP_NUDGE";
    /// The claim time-to-live in seconds.
    pub const CLAIM_TTL_SECONDS: &str = "HERMES_KANBAN_CLAIM_TTL_SECONDS";
    /// The root under which named boards live.
    pub const HOME: &str = "HERMES_KANBAN_HOME";
    /// How long a card that hit a rate limit waits before its next worker.
    pub const RATE_LIMIT_COOLDOWN_SECONDS: &str = "HERMES_KANBAN_RATE_LIMIT_COOLDOWN_SECONDS";
    /// The folder a worker works in (the seed system's scratch workspace
    /// of the card, for its own worker).
    pub const WORKSPACE: &str = "HERMES_KANBAN_WORKSPACE";
    /// The folder under which the cards' scratch workspaces are made.
    pub const WORKSPACES_ROOT: &str = "HERMES_KANBAN_WORKSPACES_ROOT";
    /// The claim's fencing token (its run id, which only grows per board):
    /// `kanban fence check` and side-effect hooks compare it.
    pub const FENCE_TOKEN: &str = "KANBAN_FENCE_TOKEN";

    /// Every variable of the claim carrier, in the order the seed lists them.
    pub const CARRIER: [&str; 8] = [
        TASK,
        DB,
        RUN_ID,
        CLAIM_LOCK,
        BOARD,
        GOAL_MODE,
        TURN_RECOVERY,
        STOP_NUDGE,
    ];

    /// Each seed-system name with the `KANBAN_*` name that stands for it.
    pub const KANBAN_NAMES: [(&str, &str); 13] = [
        (TASK, "KANBAN_TASK"),
        (DB, "KANBAN_DB"),
        (RUN_ID, "KANBAN_RUN_ID"),
        (CLAIM_LOCK, "KANBAN_CLAIM_LOCK"),
        (BOARD, "KANBAN_BOARD"),
        (GOAL_MODE, "KANBAN_GOAL_MODE"),
        (TURN_RECOVERY, "KANBAN_TURN_RECOVERY"),
        (STOP_NUDGE, "KANBAN_STOP_NUDGE"),
        (CLAIM_TTL_SECONDS, "KANBAN_CLAIM_TTL_SECONDS"),
        (HOME, "KANBAN_HOME"),
        (
            RATE_LIMIT_COOLDOWN_SECONDS,
            "KANBAN_RATE_LIMIT_COOLDOWN_SECONDS",
        ),
        (WORKSPACE, "KANBAN_WORKSPACE"),
        (WORKSPACES_ROOT, "KANBAN_WORKSPACES_ROOT"),
    ];

    /// The `KANBAN_*` name of the seed-system variable `seed`.
    pub fn kanban_name(seed: &str) -> Option<&'static str> {
        KANBAN_NAMES
            .iter()
            .find(|(name, _)| *name == seed)
            .map(|(_, ours)| *ours)
    }

    /// `HERMES_KANBAN_X (or KANBAN_X)`, as a message names a variable.
    pub fn both_names(seed: &str) -> String {
        match kanban_name(seed) {
            Some(ours) => format!("{seed} (or {ours})"),
            None => seed.to_owned(),
        }
    }

    /// `(seed name, value)` pairs under both names, as handed to a child.
    pub fn under_both_names<'a>(
        pairs: impl IntoIterator<Item = (&'static str, String)> + 'a,
    ) -> impl Iterator<Item = (&'static str, String)> + 'a {
        pairs.into_iter().flat_map(|(name, value)| {
            let ours = kanban_name(name).map(|ours| (ours, value.clone()));
            std::iter::once((name, value)).chain(ours)
        })
    }
}

/// A snapshot of environment variables, passed around as a value.
///
/// Core never calls `std::env`: the host takes the snapshot once and hands it
/// in, so every decision is reproducible from its inputs.
/// `Debug` shows the names only: values may be secrets (API keys).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Environment {
    variables: BTreeMap<String, String>,
    /// Names (lossily decoded) whose name or value is not UTF-8: absent for
    /// `get`, and named by whoever needs one of them.
    unreadable: BTreeSet<String>,
}

impl std::fmt::Debug for Environment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Environment")
            .field("names", &self.variables.keys().collect::<Vec<_>>())
            .field("unreadable", &self.unreadable)
            .finish()
    }
}

impl Environment {
    /// An empty environment.
    pub fn new() -> Self {
        Self::default()
    }

    /// A snapshot built from `(name, value)` pairs, such as `std::env::vars()`.
    pub fn from_vars<I, K, V>(pairs: I) -> Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<String>,
    {
        Self {
            variables: pairs
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
            unreadable: BTreeSet::new(),
        }
    }

    /// A snapshot of the operating system's pairs (`std::env::vars_os()`).
    /// A pair that is not UTF-8 is left out and its name remembered, so that
    /// an unrelated variable never stops a command and a needed one is named.
    pub fn from_os_vars<I>(pairs: I) -> Self
    where
        I: IntoIterator<Item = (OsString, OsString)>,
    {
        let mut environment = Self::default();
        for (name, value) in pairs {
            match (name.into_string(), value.into_string()) {
                (Ok(name), Ok(value)) => {
                    environment.variables.insert(name, value);
                }
                (name, _) => {
                    let name = match name {
                        Ok(name) => name,
                        Err(name) => name.to_string_lossy().into_owned(),
                    };
                    environment.unreadable.insert(name);
                }
            }
        }
        environment
    }

    /// Whether `name` is set to a value that is not UTF-8.
    pub fn is_unreadable(&self, name: &str) -> bool {
        self.unreadable.contains(name)
    }

    /// The names of the variables that are not UTF-8.
    pub fn unreadable(&self) -> impl Iterator<Item = &str> {
        self.unreadable.iter().map(String::as_str)
    }

    /// The raw value of `name`, if set.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.variables.get(name).map(String::as_str)
    }

    /// The value of `name` with surrounding whitespace removed; blank reads as unset.
    pub fn get_trimmed(&self, name: &str) -> Option<&str> {
        self.get(name)
            .map(str::trim)
            .filter(|value| !value.is_empty())
    }

    /// Sets `name` to `value`.
    pub fn set(&mut self, name: impl Into<String>, value: impl Into<String>) {
        self.variables.insert(name.into(), value.into());
    }

    /// Removes `name`.
    pub fn remove(&mut self, name: &str) {
        self.variables.remove(name);
    }

    /// This environment with `name` set to `value`.
    pub fn with(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.set(name, value);
        self
    }

    /// This environment without `name`.
    pub fn without(mut self, name: &str) -> Self {
        self.remove(name);
        self
    }

    /// This snapshot read through both names of each variable: a `KANBAN_*`
    /// name stands for its seed-system name where that is unset or blank;
    /// where both are set, the seed-system name wins. Everything after reads
    /// the seed-system names only.
    pub fn with_kanban_names(mut self) -> Self {
        for (seed, ours) in vars::KANBAN_NAMES {
            if self.get_trimmed(seed).is_some() || self.is_unreadable(seed) {
                continue;
            }
            if let Some(value) = self.get_trimmed(ours).map(str::to_owned) {
                self.set(seed, value);
            }
        }
        self
    }

    /// The variables kanban reads that this snapshot sets, under both names
    /// each, as a worker hands them to its agents (after
    /// [`Environment::with_kanban_names`], the two agree).
    pub fn kanban_pairs(&self) -> Vec<(&'static str, String)> {
        let set = vars::KANBAN_NAMES
            .iter()
            .filter_map(|(seed, _)| {
                self.get_trimmed(seed)
                    .map(|value| (*seed, value.to_owned()))
            })
            .collect::<Vec<_>>();
        vars::under_both_names(set).collect()
    }

    /// Every variable, sorted by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.variables.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }
}

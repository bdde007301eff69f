//! The architecture's rules that live in the dependency graph, read from
//! `cargo metadata` (which resolves every dependency and its kind). The
//! rules about code are clippy's (`clippy.toml` in each crate: no I/O or
//! ambient state in core, only the binary exits, reads the environment or
//! installs signal handlers) and the compiler's (a dispatcher answers its
//! workers through a narrow port, `WorkersBoard` in `cli/src/dispatch_link.rs`).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

/// The workspace's resolved graph: each package id with its dependencies,
/// each as (package id, kinds: `None` for normal, `dev`, `build`).
struct Graph {
    names: BTreeMap<String, String>,
    edges: BTreeMap<String, Vec<Dependency>>,
    members: Vec<String>,
}

/// A dependency: its package id, and the kinds it is one of.
type Dependency = (String, Vec<Option<String>>);

fn graph() -> Graph {
    // Not `--offline`: metadata reads the manifest of every package in the
    // lock file, those of other platforms too, which a build for this host
    // never downloads; on a fresh machine cargo fetches them here.
    let output = std::process::Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--locked"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata runs");
    assert!(
        output.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: Value = serde_json::from_slice(&output.stdout).expect("metadata is JSON");
    let names = metadata["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .map(|package| {
            let id = package["id"].as_str().expect("an id").to_owned();
            (id, package["name"].as_str().expect("a name").to_owned())
        })
        .collect();
    let edges = metadata["resolve"]["nodes"]
        .as_array()
        .expect("a resolved graph")
        .iter()
        .map(|node| {
            let deps = node["deps"]
                .as_array()
                .expect("deps")
                .iter()
                .map(|dep| {
                    let kinds = dep["dep_kinds"]
                        .as_array()
                        .expect("dep kinds")
                        .iter()
                        .map(|kind| kind["kind"].as_str().map(str::to_owned))
                        .collect();
                    (dep["pkg"].as_str().expect("a package").to_owned(), kinds)
                })
                .collect();
            (node["id"].as_str().expect("an id").to_owned(), deps)
        })
        .collect();
    let members = metadata["workspace_members"]
        .as_array()
        .expect("members")
        .iter()
        .map(|id| id.as_str().expect("an id").to_owned())
        .collect();
    Graph {
        names,
        edges,
        members,
    }
}

impl Graph {
    fn id_of(&self, name: &str) -> String {
        self.members
            .iter()
            .find(|id| self.names[*id] == name)
            .unwrap_or_else(|| panic!("{name} is a member of the workspace"))
            .clone()
    }

    /// Every package `name` is built with: its normal dependencies, and
    /// theirs, all the way down.
    fn built_with(&self, name: &str) -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut next = vec![self.id_of(name)];
        while let Some(id) = next.pop() {
            for (dep, kinds) in &self.edges[&id] {
                let normal = kinds.iter().any(Option::is_none);
                if normal && seen.insert(self.names[dep].clone()) {
                    next.push(dep.clone());
                }
            }
        }
        seen
    }
}

#[test]
fn core_is_built_with_no_async_runtime_and_no_board() {
    // Its async ports are `async-trait` objects, so the binary drives them
    // on tokio and the simulator on its own executor.
    let built_with = graph().built_with("kanban-core");
    assert!(built_with.contains("async-trait"), "{built_with:?}");
    let forbidden = [
        "tokio",
        "async-std",
        "smol",
        "pollster",
        "futures-executor",
        "rusqlite",
        "tokio-postgres",
    ];
    let found: Vec<&str> = forbidden
        .into_iter()
        .filter(|name| built_with.contains(*name))
        .collect();
    assert!(found.is_empty(), "kanban-core is built with {found:?}");
}

#[test]
fn the_test_kit_is_only_ever_a_dev_dependency() {
    let graph = graph();
    let testkit = graph.id_of("kanban-testkit");
    let mut users = 0;
    for member in &graph.members {
        for (dep, kinds) in &graph.edges[member] {
            if *dep != testkit {
                continue;
            }
            users += 1;
            assert!(
                kinds.iter().all(|kind| kind.as_deref() == Some("dev")),
                "{} depends on kanban-testkit as {kinds:?}",
                graph.names[member]
            );
        }
    }
    assert!(users >= 3, "only {users} crates test with kanban-testkit");
}

#[test]
fn the_engines_reach_each_other_only_through_the_shared_board() {
    // Each engine crate is built with the shared board, and neither with
    // the other: what they share is written once, in kanban-board.
    let graph = graph();
    for (engine, other) in [
        ("kanban-board-sqlite", "kanban-board-postgres"),
        ("kanban-board-postgres", "kanban-board-sqlite"),
    ] {
        let built_with = graph.built_with(engine);
        assert!(built_with.contains("kanban-board"), "{engine}");
        assert!(
            !built_with.contains(other),
            "{engine} is built with {other}"
        );
    }
    assert!(
        !graph.built_with("kanban-board").contains("rusqlite"),
        "the shared board speaks to no engine's driver"
    );
}

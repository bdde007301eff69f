//! The Python binding under Python: installs it the documented way
//! (`pip install ./bindings/python`) into a venv of its own, with the seed
//! system's release beside it, and runs its pytest tests (on SQLite and on
//! a PostgreSQL database of the test cluster), its example worker, and
//! `mypy --strict` on the package and the examples.

#![allow(
    clippy::disallowed_methods,
    clippy::disallowed_types,
    reason = "a test harness drives real processes and reads its knobs from the environment"
)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const SEED_RELEASE: &str = "hermes-agent==0.19.0";
const TOOLS: [&str; 3] = ["pytest==8.4.2", "mypy==1.18.2", "maturin==1.9.6"];

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn said(output: &Output) -> String {
    format!("{}{}", text(&output.stdout), text(&output.stderr))
}

fn binding() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `pip install ARGS…` in `venv`; whether it went.
fn pip(venv: &Path, args: &[&str]) -> Output {
    Command::new(venv.join("bin/pip"))
        .args(["install", "--quiet", "--disable-pip-version-check"])
        .args(args)
        .output()
        .expect("the venv's pip runs")
}

/// The harness's venv (kept under Cargo's folder for test files between
/// runs), with the test tools; `None`, said, when the package registry
/// cannot be reached to install them. Whether the seed system is in it.
fn venv() -> Option<(PathBuf, bool)> {
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("python-binding-venv");
    let tools = venv.join("tools-installed");
    if !tools.exists() {
        let _ = std::fs::remove_dir_all(&venv);
        let made = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .output()
            .expect(
                "python3 runs the binding's tests: apt-get install python3-venv (.ci/run does)",
            );
        assert!(made.status.success(), "python3 -m venv: {}", said(&made));
        let installed = pip(&venv, &TOOLS);
        if !installed.status.success() {
            eprintln!(
                "SKIPPED the Python binding's tests: the package registry could not be reached to install {TOOLS:?}: {}",
                said(&installed)
            );
            return None;
        }
        std::fs::write(&tools, TOOLS.join("\n")).unwrap();
    }
    let seed = venv.join("seed-installed");
    if !seed.exists() {
        let installed = pip(&venv, &[SEED_RELEASE]);
        if installed.status.success() {
            std::fs::write(&seed, SEED_RELEASE).unwrap();
        } else {
            eprintln!(
                "the seed system ({SEED_RELEASE}) could not be installed; its ambient-board test is skipped: {}",
                said(&installed)
            );
        }
    }
    Some((venv.clone(), seed.exists()))
}

/// `pip install ./bindings/python`, built as a developer build would be,
/// in a target folder of its own (this test's Cargo holds the workspace's).
fn install_binding(venv: &Path) {
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("python-binding-target");
    let installed = Command::new(venv.join("bin/pip"))
        .args([
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-build-isolation",
            "--no-deps",
            "--force-reinstall",
        ])
        .arg(binding())
        .env("CARGO_TARGET_DIR", &target)
        .env("MATURIN_PEP517_ARGS", "--profile dev")
        .env("PATH", path_with(venv))
        .output()
        .expect("pip runs");
    assert!(
        installed.status.success(),
        "pip install ./bindings/python: {}",
        said(&installed)
    );
}

/// `PATH` with the venv's programs (maturin) first.
fn path_with(venv: &Path) -> String {
    format!(
        "{}:{}",
        venv.join("bin").display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

fn python(venv: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(venv.join("bin/python"));
    command
        .args(args)
        .current_dir(binding())
        .env("PATH", path_with(venv))
        .env_remove("PYTHONPATH");
    for name in kanban_core::vars::CARRIER {
        command.env_remove(name);
    }
    command
}

fn passes(command: &mut Command, what: &str) -> String {
    let output = command
        .output()
        .unwrap_or_else(|error| panic!("{what}: {error}"));
    assert!(output.status.success(), "{what} failed:\n{}", said(&output));
    text(&output.stdout)
}

/// Every `python` example of the README and the binding's README runs as
/// written, in a folder of its own.
fn readme_examples_run(venv: &Path) {
    let root = binding().join("../..");
    for readme in [root.join("README.md"), binding().join("README.md")] {
        let text = std::fs::read_to_string(&readme).unwrap();
        let blocks: Vec<&str> = text
            .split("```python\n")
            .skip(1)
            .filter_map(|rest| rest.split("```").next())
            .collect();
        assert!(
            !blocks.is_empty(),
            "{} has a python example",
            readme.display()
        );
        for block in blocks {
            let folder = tempfile_folder();
            let mut command = python(venv, &["-c", block]);
            command.current_dir(&folder);
            passes(
                &mut command,
                &format!("the example of {}:\n{block}", readme.display()),
            );
            let _ = std::fs::remove_dir_all(&folder);
        }
    }
}

/// A new empty folder under Cargo's folder for test files.
fn tempfile_folder() -> PathBuf {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let folder = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "python-example-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&folder);
    std::fs::create_dir_all(&folder).unwrap();
    folder
}

#[test]
fn the_python_binding_passes_its_tests_on_both_engines() {
    match venv() {
        None => eprintln!("the Python binding was not tested: see the line above"),
        Some((venv, seed)) => {
            install_binding(&venv);
            let url = kanban_testkit::PgCluster::shared().fresh_database();
            let mut pytest = python(
                &venv,
                &[
                    "-m",
                    "pytest",
                    "-q",
                    "-rs",
                    "-p",
                    "no:cacheprovider",
                    "tests",
                ],
            );
            pytest.env("KANBAN_TEST_PG_URL", &url);
            if seed {
                pytest.env("KANBAN_SEED_INSTALLED", "1");
            }
            let report = passes(&mut pytest, "pytest");
            assert!(report.contains(" passed"), "{report}");
            // With the seed system installed, nothing is skipped.
            assert!(!seed || !report.contains("skipped"), "{report}");
            let worked = passes(
                &mut python(&venv, &["examples/worker.py"]),
                "the example worker",
            );
            assert!(worked.contains("done after 1 recovery"), "{worked}");
            readme_examples_run(&venv);
            passes(
                &mut python(
                    &venv,
                    &[
                        "-m",
                        "mypy",
                        "--strict",
                        "--no-incremental",
                        "examples",
                        "python/kanban_core",
                    ],
                ),
                "mypy --strict",
            );
        }
    }
}

//! Hostile board files: each is refused with an error that names the file and
//! the fix, exits 1, and leaves the file exactly as it was.
//!
//! The read-only and full-disk cases mount a small tmpfs, which needs root;
//! CI runs as root. Elsewhere they say so and pass nothing off as checked.

use std::path::Path;
use std::process::Command;

use crate::{Bench, Mount, text};

fn refused(bench: &Bench, db: &Path, args: &[&str], needles: &[&str]) {
    let before = std::fs::read(db).ok();
    let output = bench.on(db).args(args).output().unwrap();
    let stderr = text(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(1),
        "{args:?} on {}: {stderr}",
        db.display()
    );
    assert!(
        stderr.contains(&db.file_name().unwrap().to_string_lossy().to_string()),
        "the error names the file: {stderr}"
    );
    for needle in needles {
        assert!(
            stderr.contains(needle),
            "the error says {needle:?}: {stderr}"
        );
    }
    assert_eq!(std::fs::read(db).ok(), before, "the file is left as it was");
}

#[test]
fn a_truncated_board_is_refused_as_damaged() {
    let bench = Bench::new();
    for n in 0..200 {
        bench.add(&format!("card {n} {}", "x".repeat(200)), &[]);
    }
    // Checkpoint the WAL into the file, then cut the file in half.
    let copy = bench.path().join("truncated.db");
    bench.ok(&["ls"]);
    let script = format!(
        "import sqlite3; c=sqlite3.connect('{}'); c.execute('PRAGMA wal_checkpoint(TRUNCATE)'); c.close()",
        bench.db.display()
    );
    assert!(
        Command::new("python3")
            .args(["-c", &script])
            .status()
            .unwrap()
            .success()
    );
    let bytes = std::fs::read(&bench.db).unwrap();
    assert!(bytes.len() > 8192, "the board has several pages");
    std::fs::write(&copy, &bytes[..bytes.len() / 2]).unwrap();
    refused(&bench, &copy, &["ls"], &["damaged", "backup"]);
}

#[test]
fn a_file_that_is_not_sqlite_is_refused() {
    let bench = Bench::new();
    let notes = bench.path().join("notes.txt");
    std::fs::write(&notes, "my notes, not a board\n".repeat(20)).unwrap();
    refused(
        &bench,
        &notes,
        &["ls"],
        &["not a SQLite board", "kanban init"],
    );
    refused(&bench, &notes, &["add", "x"], &["not a SQLite board"]);
    refused(&bench, &notes, &["init"], &["not a SQLite board"]);
}

#[test]
fn a_board_from_a_newer_version_is_refused() {
    let bench = Bench::new();
    let script = format!(
        "import sqlite3; c=sqlite3.connect('{}'); c.execute('PRAGMA user_version = 99'); c.execute('PRAGMA wal_checkpoint(TRUNCATE)'); c.commit(); c.close()",
        bench.db.display()
    );
    assert!(
        Command::new("python3")
            .args(["-c", &script])
            .status()
            .unwrap()
            .success()
    );
    refused(
        &bench,
        &bench.db,
        &["add", "x"],
        &["newer", "upgrade kanban"],
    );
}

#[test]
fn a_missing_directory_is_named() {
    let bench = Bench::new();
    let missing = bench.path().join("no/such/dir/kanban.db");
    let output = bench.on(&missing).arg("ls").output().unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("no/such/dir/kanban.db") && stderr.contains("kanban init"),
        "{stderr}"
    );
    assert!(!bench.path().join("no").exists(), "nothing was created");
}

#[test]
fn a_board_on_a_read_only_filesystem_is_refused_and_untouched() {
    let bench = Bench::new();
    let mount = Mount::tmpfs(&bench, "4m");
    let db = mount.0.join("kanban.db");
    let run = |args: &[&str]| bench.on(&db).args(args).output().unwrap();
    assert!(run(&["init"]).status.success());
    assert!(run(&["add", "before"]).status.success());
    mount.remount_read_only();
    let before = std::fs::read(&db).unwrap();
    let output = run(&["add", "after"]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("kanban.db")
            && (stderr.contains("read-only") || stderr.contains("cannot be opened")),
        "{stderr}"
    );
    assert_eq!(std::fs::read(&db).unwrap(), before);
}

#[test]
fn a_full_disk_is_named_and_the_board_stays_whole() {
    let bench = Bench::new();
    let mount = Mount::tmpfs(&bench, "400k");
    let db = mount.0.join("kanban.db");
    let run = |args: &[&str]| bench.on(&db).args(args).output().unwrap();
    assert!(run(&["init"]).status.success());
    let body = "y".repeat(4000);
    let mut added = 0;
    let error = loop {
        let output = run(&["add", "filler", "--body", &body]);
        if !output.status.success() {
            break text(&output.stderr);
        }
        added += 1;
        assert!(added < 1000, "the disk never filled");
    };
    assert!(
        error.contains("kanban.db") && error.contains("disk is full"),
        "{error}"
    );
    // Everything that was accepted is still there, and the board still reads.
    let output = run(&["ls", "--json"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let listed: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        listed.as_array().unwrap().len(),
        added,
        "no accepted card was lost"
    );
}

//! Lays out the `kanban` binary's code so that what every short-lived
//! process runs sits together.
//!
//! A worker, and each board call an agent makes, is a process of its own.
//! Linux maps a binary's code 64 KiB at a time around each page it touches,
//! and the code a worker runs was spread over the whole binary: 4.3 of its
//! 4.4 MiB of code was resident in a quiet worker, for about 1 MiB of
//! functions it ran. `link/hot-symbols.txt` lists the functions a quiet
//! worker and its agent's `kanban complete` run, alone and under a
//! dispatcher (recorded by `link/record-hot-symbols.sh`), and the linker
//! places them first, in that order. A symbol the list names that this
//! build lacks is skipped, and a function missing from the list is laid
//! out as before: a stale list costs memory, never correctness.
//!
//! Only with LLD, the linker Rust uses on x86-64 Linux since 1.90 (this
//! workspace needs 1.95). After a toolchain or dependency update the
//! symbols' hashes change, and a change of the functions on a worker's path
//! renames some of them too (94 once, 0.6 MiB more of a quiet worker's
//! peak): record the list again (the memory benchmark says how many match).

fn main() {
    println!("cargo::rerun-if-changed=link/hot-symbols.txt");
    if std::env::var("TARGET").as_deref() == Ok("x86_64-unknown-linux-gnu") {
        let list = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("link/hot-symbols.txt");
        println!(
            "cargo::rustc-link-arg-bins=-Wl,--symbol-ordering-file={}",
            list.display()
        );
        // Names the list holds that this build has not (another build's
        // hashes, a function since inlined) are expected, not news.
        println!("cargo::rustc-link-arg-bins=-Wl,--no-warn-symbol-ordering");
    }
}

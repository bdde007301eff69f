//! Writing to stdout and stderr without panicking.
//!
//! `println!` panics when the reader went away (`kanban ls | head -1`). A
//! listing then ends quietly with 0, as `cat` and ripgrep do; a diagnostic
//! that cannot be written is dropped, since there is nowhere left to say it.

use std::fmt;
use std::io::{self, Write};

/// Writes to stdout; a closed pipe ends the command with 0, another write
/// failure (a full disk) with 1 and a message.
pub(crate) fn stdout(args: fmt::Arguments<'_>) {
    let written = {
        let mut out = io::stdout().lock();
        out.write_fmt(args).and_then(|()| out.flush())
    };
    match written {
        Ok(()) => {}
        Err(error) if error.kind() == io::ErrorKind::BrokenPipe => std::process::exit(0),
        Err(error) => {
            stderr(format_args!("error: cannot write the output: {error}\n"));
            std::process::exit(1);
        }
    }
}

/// Writes to stdout for a process whose exit code means something (a
/// worker): a write failure is ignored rather than turned into an exit.
pub(crate) fn stdout_or_drop(args: fmt::Arguments<'_>) {
    let mut out = io::stdout().lock();
    let _ = out.write_fmt(args).and_then(|()| out.flush());
}

/// Writes to stderr; a failure is dropped.
pub(crate) fn stderr(args: fmt::Arguments<'_>) {
    let mut err = io::stderr().lock();
    let _ = err.write_fmt(args);
}

/// `println!` that never panics (see [`stdout`]).
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::out::stdout(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` that never panics (see [`stdout`]).
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::out::stdout(format_args!($($arg)*))
    };
}

/// `eprintln!` that never panics.
macro_rules! errln {
    ($($arg:tt)*) => {
        $crate::out::stderr(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `println!` for a worker (see [`stdout_or_drop`]).
macro_rules! outln_or_drop {
    ($($arg:tt)*) => {
        $crate::out::stdout_or_drop(format_args!("{}\n", format_args!($($arg)*)))
    };
}

pub(crate) use {errln, out, outln, outln_or_drop};

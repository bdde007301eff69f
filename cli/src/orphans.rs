//! A worker's own process tree, ended before the worker says it is done.
//!
//! A worker makes itself the reaper of its descendants (Linux's child
//! subreaper): whatever its agent starts and leaves behind, even a daemon
//! that forked twice and left its session, is re-parented to the worker
//! rather than to init. So before it writes its exit trailer, a worker can
//! find every process of its run among its own children and end them, and
//! say so in the trailer (`alone`). Its dispatcher then need not look
//! through every process of the machine for what the run left running; it
//! still does when the trailer does not say so (a worker that was killed,
//! or one that could not end them all in time).

use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::Pid;

/// Makes this process the reaper of its orphaned descendants; false when
/// the kernel refused.
pub(crate) fn adopt_orphans() -> bool {
    nix::sys::prctl::set_child_subreaper(true).is_ok()
}

/// This process's children, from every thread's list; `None` when a list
/// cannot be read.
fn children() -> Option<Vec<Pid>> {
    let mut found = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let path = task.ok()?.path().join("children");
        match std::fs::read_to_string(&path) {
            Ok(text) => found.extend(
                text.split_ascii_whitespace()
                    .filter_map(|pid| pid.parse::<i32>().ok())
                    .map(Pid::from_raw),
            ),
            // A thread that ended meanwhile has no children to list.
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(_) => return None,
        }
    }
    Some(found)
}

/// Ends every process below this one: SIGKILL to each child, reaped, and
/// again for the orphans that killing it hands over, until none is left.
/// Each child is killed alone, never by its process group, which may hold
/// processes that are not this worker's. True when none is left within
/// `patience`.
pub(crate) fn end_all(patience: Duration) -> bool {
    let deadline = Instant::now() + patience;
    loop {
        let Some(children) = children() else {
            return false;
        };
        if children.is_empty() {
            return true;
        }
        for pid in children {
            let _ = kill(pid, Signal::SIGKILL);
            let _ = waitpid(pid, Some(WaitPidFlag::WNOHANG));
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

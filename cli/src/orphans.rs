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

use kanban_agent_port::own_children;
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::Pid;

/// A worker's hold on its process tree: it is the reaper of its
/// descendants' orphans, and knows which children it had before it was.
#[derive(Debug)]
pub(crate) struct Reaper {
    /// Children this process had when it became their reaper (a wrapper
    /// that exec'd it may have started a sidecar): not of the run, left be.
    before: Vec<Pid>,
}

impl Reaper {
    /// Makes this process the reaper of its orphaned descendants; `None`
    /// when the kernel refused, or this process's children cannot be read
    /// (a kernel without `/proc/PID/task/TID/children`), so that nothing
    /// will be claimed of the tree.
    pub(crate) fn adopt_orphans() -> Option<Self> {
        let before = own_children()?;
        nix::sys::prctl::set_child_subreaper(true).ok()?;
        Some(Self { before })
    }

    /// Ends every process below this one that came after it became their
    /// reaper: SIGKILL to each such child, reaped, and again for the
    /// orphans that killing it hands over, until none is left. Each child
    /// is killed alone, never by its process group, which may hold
    /// processes that are not this worker's. True when none is left within
    /// `patience`.
    pub(crate) fn end_all(&self, patience: Duration) -> bool {
        let deadline = Instant::now() + patience;
        loop {
            let Some(children) = own_children() else {
                return false;
            };
            let ours: Vec<Pid> = children
                .into_iter()
                .filter(|pid| !self.before.contains(pid))
                .collect();
            if ours.is_empty() {
                return true;
            }
            for pid in ours {
                let _ = kill(pid, Signal::SIGKILL);
                let _ = waitpid(pid, Some(WaitPidFlag::WNOHANG));
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

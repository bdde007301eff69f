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
//!
//! Meanwhile, once a second, it reaps the orphans that ended
//! (`reap_ended`): a long run whose agent starts many short-lived
//! background processes would otherwise collect their zombies.

use std::time::{Duration, Instant};

use kanban_agent_port::{own_children, process_stat};
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::{Pid, getpgrp, getsid};

/// How often a worker looks for orphans that ended.
const ORPHAN_SCAN: Duration = Duration::from_secs(1);

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
    /// Reaps, once a second until dropped, the orphans that ended while
    /// the run goes on: without it each stays a zombie, holding a pid and
    /// counting against the user's process limit, until the worker ends.
    pub(crate) async fn reap_ended_meanwhile(&self) -> std::convert::Infallible {
        let mut every = tokio::time::interval(ORPHAN_SCAN);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            self.reap_ended();
        }
    }

    /// Reaps the zombies among this process's children that no one else
    /// waits for. This process starts its agent as the leader of a group
    /// of its own and everything else (a judge) in its own group, never in
    /// another session, and whoever started one waits for it; so a zombie
    /// in another session, or in another group that it does not lead, is
    /// an orphan that came to this reaper, and reaping it takes no exit
    /// status a waiter expects.
    pub(crate) fn reap_ended(&self) {
        let (Ok(session), group) = (getsid(None), getpgrp()) else {
            return;
        };
        for pid in own_children()
            .unwrap_or_default()
            .into_iter()
            .filter(|pid| !self.before.contains(pid))
        {
            let Some(stat) = process_stat(pid) else {
                continue;
            };
            let stray = stat.session != session || (stat.group != group && stat.group != pid);
            if stat.zombie && stray {
                let _ = waitpid(pid, Some(WaitPidFlag::WNOHANG));
            }
        }
    }

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

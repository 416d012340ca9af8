//! Is the process that holds a slot still alive? The real driver learns that a process died when
//! its file descriptors close; the simulated node learns it lazily, whenever a process of the
//! node needs an accurate picture (`Node::reap_dead`, before every NVML query).
//!
//! Owns: one pidfd per slot holder, per handle. Why: reading `/proc/<pid>/stat` for every slot on
//! every query made the simulator itself the largest cost of an arbiter watching 200 functions
//! (62 % of its CPU, `perf record`, docs/arbiter.md "The arbiter's own cost as functions grow"):
//! that is the simulator's bookkeeping, not the arbiter's, and it would have hidden the
//! arbiter's own figure. A pidfd names one process for its whole life — a recycled pid cannot be
//! mistaken for it — and polls readable once it has exited (zombies included), so a known holder
//! costs one `poll(2)` instead of an open + read + parse + close.
//!
//! Must never: take a new holder for alive without checking its start time once (the pid may have
//! been recycled between the claim and the first look); where pidfds are unavailable (Linux < 5.3)
//! fall back to the `/proc` check.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Mutex;

/// A slot holder this handle has a pidfd for.
struct Watched {
    pid: u32,
    start: u64,
    fd: OwnedFd,
}

/// Per-handle pidfds of the slot holders (index = slot).
#[derive(Default)]
pub(crate) struct Liveness {
    watched: Mutex<Vec<Option<Watched>>>,
}

impl Liveness {
    /// Whether the process `pid` that claimed slot `slot` at start time `start` (clock ticks
    /// since boot) is still alive: not exited, not a zombie, not a later process with its pid.
    pub(crate) fn alive(&self, slot: usize, pid: u32, start: u64) -> bool {
        let Ok(mut w) = self.watched.lock() else {
            return crate::node::slot_alive(pid, start);
        };
        if w.len() <= slot {
            w.resize_with(slot + 1, || None);
        }
        if let Some(x) = &w[slot] {
            if x.pid == pid && x.start == start {
                return !exited(&x.fd);
            }
        }
        w[slot] = None;
        let Some(fd) = pidfd_open(pid) else {
            return crate::node::slot_alive(pid, start);
        };
        // The pidfd names whatever process has the pid now: it is the holder only if that one
        // started when the holder did (and is not already a zombie).
        if !crate::node::slot_alive(pid, start) {
            return false;
        }
        w[slot] = Some(Watched { pid, start, fd });
        true
    }
}

fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open(2) takes a pid and flags (0) and returns a new fd or -1; no pointers.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: the syscall returned a fresh descriptor that nothing else owns.
    Some(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// A pidfd polls readable once its process has exited.
fn exited(fd: &OwnedFd) -> bool {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, count 1, no wait.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n > 0 && p.revents != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start_of(pid: u32) -> u64 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        rest.split_whitespace().nth(19).unwrap().parse().unwrap()
    }

    #[test]
    fn a_holder_is_alive_until_it_exits_even_as_a_zombie_and_a_wrong_start_is_not_it() {
        let l = Liveness::default();
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        let start = start_of(pid);
        assert!(l.alive(3, pid, start));
        assert!(l.alive(3, pid, start), "cached");
        assert!(
            !l.alive(4, pid, start + 1),
            "another start time is another process"
        );
        child.kill().unwrap();
        // Not waited for yet: a zombie, which has exited.
        let t0 = std::time::Instant::now();
        while l.alive(3, pid, start) {
            assert!(t0.elapsed().as_secs() < 5, "exit not seen");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        child.wait().unwrap();
        assert!(!l.alive(3, pid, start));
    }
}

//! Pid namespaces on the simulated GPU: a process in a container claims its slot with the pid
//! its own namespace gives it (`getpid`), which means nothing to an observer in another
//! namespace — the arbiter on the host, whose NVML must report the *host* pid that
//! `SO_PEERCRED` also gives it (the real driver records processes by their initial-namespace
//! pid: NVIDIA/nvidia-docker#1483). A slot therefore also records the inode of its process's
//! pid namespace, and an observer translates a slot's pid into its own namespace by looking the
//! process up in its `/proc`: the process whose `ns/pid` is that namespace, whose innermost
//! `NSpid` (`/proc/<pid>/status`) is the recorded pid, and whose start time matches.
//!
//! Owns: reading a process's pid namespace and `NSpid`, and that lookup. Must never: take a
//! process for another (namespace, innermost pid and start time must all match), or report a
//! pid the observer cannot see (a container observer does not see its neighbours: they are
//! left out, not shown under a pid that could be one of its own).

use std::collections::HashMap;
use std::sync::Mutex;

/// Inode of the initial pid namespace: the kernel's `PROC_PID_INIT_INO` (0xEFFFFFFC,
/// include/linux/proc_ns.h), the same on every Linux host.
pub const INIT_PID_NS: u64 = 0xEFFF_FFFC;

/// The pid namespace (its inode) of `/proc/<who>` (`"self"` or a pid), from the link
/// `pid:[<inode>]`; None when unreadable (the process is gone, or /proc hides it).
pub fn ns_of(who: &str) -> Option<u64> {
    let link = std::fs::read_link(format!("/proc/{who}/ns/pid")).ok()?;
    let s = link.to_str()?;
    s.strip_prefix("pid:[")?.strip_suffix(']')?.parse().ok()
}

/// This process's pid namespace (0 when it cannot be read: then every slot is taken to be in
/// the observer's namespace, the behaviour before namespaces were modelled).
pub fn own_ns() -> u64 {
    ns_of("self").unwrap_or(0)
}

/// The `NSpid` line of a `/proc/<pid>/status` text: the process's pid in each namespace from
/// the one of that `/proc` inwards (outermost first). None when absent (kernels before 4.1).
pub fn parse_nspid(status: &str) -> Option<Vec<u32>> {
    let line = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    line.split_whitespace().map(|f| f.parse().ok()).collect()
}

/// Start time (clock ticks since boot, field 22 of `/proc/<pid>/stat`): the same number in
/// every pid namespace, so it tells a process from a later one that got the same pid.
fn start_of(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Identity of a slot's process as recorded at claim time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Claimed {
    /// Its pid namespace's inode.
    pub ns: u64,
    /// Its pid in that namespace.
    pub pid: u32,
    /// Its start time.
    pub start: u64,
}

/// What an observer knows of processes in other namespaces: claimed identity → pid here.
/// Found once per process by one scan of `/proc`; forgotten when the process is not found
/// alive under that pid any more.
#[derive(Debug, Default)]
pub struct Translator {
    seen: Mutex<HashMap<Claimed, u32>>,
}

impl Translator {
    /// The pid of `c` in this observer's namespace `here`, or None when this observer cannot
    /// see it (it lives in a namespace beside or above this one, or it exited).
    pub fn local_pid(&self, here: u64, c: Claimed) -> Option<u32> {
        if c.ns == 0 || c.ns == here {
            return Some(c.pid);
        }
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&p) = seen.get(&c) {
            if start_of(p) == Some(c.start) {
                return Some(p);
            }
            seen.remove(&c);
        }
        let found = scan(c)?;
        seen.insert(c, found);
        Some(found)
    }

    /// Whether this observer can judge the liveness of processes it does not find: only one in
    /// the initial namespace sees every process (any other sees its own subtree at most).
    pub fn sees_everything(here: u64) -> bool {
        here == INIT_PID_NS
    }
}

/// One pass over `/proc` looking for `c`.
fn scan(c: Claimed) -> Option<u32> {
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if ns_of(&pid.to_string()) != Some(c.ns) {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
            continue;
        };
        if parse_nspid(&status).and_then(|v| v.last().copied()) == Some(c.pid)
            && start_of(pid) == Some(c.start)
        {
            return Some(pid);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nspid_lines_parse_outermost_first() {
        let st = "Name:\tsim-probe\nTgid:\t4242\nNSpid:\t4242\t7\nPPid:\t1\n";
        assert_eq!(parse_nspid(st), Some(vec![4242, 7]));
        assert_eq!(parse_nspid("Name:\tx\nNSpid:\t12\n"), Some(vec![12]));
        assert_eq!(parse_nspid("Name:\tx\n"), None);
    }

    #[test]
    fn a_process_in_the_observers_namespace_keeps_its_pid_and_others_are_found_in_proc() {
        let here = own_ns();
        assert_ne!(here, 0, "this test process can read its own pid namespace");
        let me = std::process::id();
        let start = start_of(me).unwrap();
        let t = Translator::default();
        let mine = Claimed {
            ns: here,
            pid: me,
            start,
        };
        assert_eq!(t.local_pid(here, mine), Some(me));
        // As an observer in another namespace would look this process up: by /proc.
        assert_eq!(scan(mine), Some(me));
        assert_eq!(
            scan(Claimed {
                start: start + 1,
                ..mine
            }),
            None,
            "a different start time is a different process"
        );
        // A namespace nobody here lives in: not visible.
        let elsewhere = Claimed {
            ns: here ^ 1,
            ..mine
        };
        assert_eq!(t.local_pid(here, elsewhere), None);
    }
}

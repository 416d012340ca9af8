//! Facts about processes from `/proc`: liveness with pid-reuse protection (start time), the
//! parent chain (a function's GPU work may run in a child of the registered process), and
//! whether the shim is mapped into a process. Safe Rust only; every read tolerates the process
//! vanishing mid-read (it is then reported dead / without the shim).

use std::fs;

/// Start time of `pid` in clock ticks since boot (field 22 of `/proc/<pid>/stat`), or `None`
/// when the process does not exist or is a zombie.
pub fn start_time(pid: u32) -> Option<u64> {
    let (state, rest) = stat_fields(pid)?;
    if state == 'Z' || state == 'X' {
        return None;
    }
    // rest[0] is field 4 (ppid); start time is field 22 → rest[18].
    rest.get(18)?.parse().ok()
}

/// Parent pid of `pid`.
pub fn parent(pid: u32) -> Option<u32> {
    stat_fields(pid)?.1.first()?.parse().ok()
}

/// The state letter and the fields after it (from field 4 on) of `/proc/<pid>/stat`; the command
/// name (field 2) may contain spaces and parentheses, so split after the last `)`.
fn stat_fields(pid: u32) -> Option<(char, Vec<String>)> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &s[s.rfind(')')? + 1..];
    let mut it = after.split_whitespace();
    let state = it.next()?.chars().next()?;
    Some((state, it.map(str::to_string).collect()))
}

/// Whether `pid` is alive and is the same process that had `start` (pid reuse check).
pub fn is_same_process(pid: u32, start: u64) -> bool {
    start_time(pid) == Some(start)
}

/// Whether `ancestor` is `pid` or one of its ancestors (bounded walk: 64 levels).
pub fn is_descendant_of(pid: u32, ancestor: u32) -> bool {
    let mut p = pid;
    for _ in 0..64 {
        if p == ancestor {
            return true;
        }
        match parent(p) {
            Some(pp) if pp != 0 && pp != p => p = pp,
            _ => return false,
        }
    }
    false
}

/// Whether a library whose file name contains `needle` is mapped into `pid`.
pub fn maps_library(pid: u32, needle: &str) -> Option<bool> {
    let maps = fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    Some(
        maps.lines()
            .any(|l| l.rsplit('/').next().is_some_and(|f| f.contains(needle))),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_its_own_descendant() {
        let me = std::process::id();
        let st = start_time(me).unwrap();
        assert!(is_same_process(me, st));
        assert!(!is_same_process(me, st + 1));
        assert!(is_descendant_of(me, me));
        let parent = parent(me).unwrap();
        assert!(is_descendant_of(me, parent));
        assert!(!is_descendant_of(parent, me));
        assert_eq!(maps_library(me, "definitely-not-mapped-lib"), Some(false));
    }

    #[test]
    fn a_reaped_child_is_dead() {
        let mut c = std::process::Command::new("true").spawn().unwrap();
        let pid = c.id();
        c.wait().unwrap();
        assert_eq!(start_time(pid), None);
    }
}

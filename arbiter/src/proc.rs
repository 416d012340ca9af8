//! Facts about processes from `/proc`: liveness with pid-reuse protection (start time), the
//! parent, whether the shim is mapped into a process, and pidfd handles that report a process's
//! exit without reading `/proc` at all. Safe Rust only; every read tolerates the process
//! vanishing mid-read (it is then reported dead / without the shim).
//!
//! Cost: `stat` reads `/proc/<pid>/stat` into a stack buffer and parses the three fields it
//! needs in place (no allocation per field); [`Pidfd::exited`] is one `poll(2)` with a zero
//! timeout — what the arbiter does per known process per reconcile round.

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::fd::OwnedFd;
use rustix::process::{pidfd_open, Pid, PidfdFlags};
use std::io::Read;

/// Largest `/proc/<pid>/stat` line read, bytes. Reasoning: 52 numeric fields of ≤ 20 digits
/// plus a 16-byte comm (in parentheses) stay under 1.2 KiB; the fields parsed here come within
/// the first ~250 bytes after the comm, so a longer line is still parsed correctly.
const STAT_BUF: usize = 1536;

/// The fields of `/proc/<pid>/stat` the arbiter uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// State letter (field 3).
    pub state: u8,
    /// Parent pid (field 4).
    pub ppid: u32,
    /// Session id (field 6): the pid of the session's leader.
    pub session: u32,
    /// Start time in clock ticks since boot (field 22).
    pub start: u64,
}

impl Stat {
    /// A zombie or dead process.
    pub fn is_dead(&self) -> bool {
        matches!(self.state, b'Z' | b'X')
    }
}

/// Parses a stat line. The command name (field 2) may contain spaces and parentheses, so
/// fields are counted after the last `)`.
pub fn parse_stat(line: &[u8]) -> Option<Stat> {
    let close = line.iter().rposition(|&b| b == b')')?;
    let mut fields = line[close + 1..]
        .split(|b| b.is_ascii_whitespace())
        .filter(|f| !f.is_empty());
    let state = *fields.next()?.first()?;
    let ppid = parse_u64(fields.next()?)? as u32;
    let _pgrp = fields.next()?;
    let session = parse_u64(fields.next()?)? as u32;
    // Fields 7..=21 skipped; field 22 is the 16th after the session.
    let start = parse_u64(fields.nth(15)?)?;
    Some(Stat {
        state,
        ppid,
        session,
        start,
    })
}

fn parse_u64(b: &[u8]) -> Option<u64> {
    if b.is_empty() {
        return None;
    }
    b.iter().try_fold(0u64, |acc, &c| {
        c.is_ascii_digit()
            .then(|| acc.checked_mul(10)?.checked_add((c - b'0') as u64))
            .flatten()
    })
}

/// `/proc/<pid>/stat`, parsed; None when the process does not exist (or vanished mid-read)
/// or cannot be read.
pub fn stat(pid: u32) -> Option<Stat> {
    stat_checked(pid).ok().flatten()
}

/// `/proc/<pid>/stat`, telling "no such process" (`Ok(None)`) from "cannot tell" (`Err`: out
/// of file descriptors, permissions): a failed read is never evidence that a process died.
pub fn stat_checked(pid: u32) -> std::io::Result<Option<Stat>> {
    stat_at(&format!("/proc/{pid}/stat"))
}

/// This process's start time in clock ticks since boot, from `/proc/self/stat`: unlike
/// `/proc/<own pid>`, `self` resolves in the pid namespace `/proc` was mounted for, so it is
/// right in a container whose `/proc` is the host's (or another namespace's) too.
pub fn own_start_time() -> Option<u64> {
    stat_at("/proc/self/stat").ok().flatten().map(|s| s.start)
}

fn stat_at(path: &str) -> std::io::Result<Option<Stat>> {
    let gone = |e: &std::io::Error| {
        e.kind() == std::io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH)
    };
    let mut f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if gone(&e) => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut buf = [0u8; STAT_BUF];
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if gone(&e) => return Ok(None),
            Err(e) => return Err(e),
        }
    }
    Ok(parse_stat(&buf[..n]))
}

/// Start time of `pid` in clock ticks since boot (field 22 of `/proc/<pid>/stat`), or `None`
/// when the process does not exist or is a zombie.
pub fn start_time(pid: u32) -> Option<u64> {
    stat(pid).filter(|s| !s.is_dead()).map(|s| s.start)
}

/// Parent pid of `pid`.
pub fn parent(pid: u32) -> Option<u32> {
    stat(pid).map(|s| s.ppid)
}

/// The groups `pid` acts with: its effective gid and its supplementary groups (from
/// `/proc/<pid>/status`); None when it cannot be read.
pub fn groups(pid: u32) -> Option<Vec<u32>> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_groups(&status)
}

/// The effective uid in a `/proc/<pid>/status` text (the `Uid:` line's second field). Unlike the
/// owner of `/proc/<pid>`, which a process that turns off its dumpable flag hands to root, this
/// is the process's own (found by review, 2026-11-28).
pub fn parse_effective_uid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|rest| rest.split_whitespace().nth(1)?.parse().ok())
}

/// The effective uid of `pid`; None when it cannot be read.
pub fn effective_uid(pid: u32) -> Option<u32> {
    parse_effective_uid(&std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?)
}

/// The `Gid:` (effective, the second field) and `Groups:` lines of a status text.
pub fn parse_groups(status: &str) -> Option<Vec<u32>> {
    let mut out = Vec::new();
    let mut gid_seen = false;
    for line in status.lines() {
        if let Some(rest) = line.strip_prefix("Gid:") {
            out.push(rest.split_whitespace().nth(1)?.parse().ok()?);
            gid_seen = true;
        } else if let Some(rest) = line.strip_prefix("Groups:") {
            out.extend(
                rest.split_whitespace()
                    .filter_map(|g| g.parse::<u32>().ok()),
            );
        }
    }
    gid_seen.then_some(out)
}

/// Session id of `pid` (the pid of its session's leader).
pub fn session(pid: u32) -> Option<u32> {
    stat(pid).map(|s| s.session)
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
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    Some(
        maps.lines()
            .any(|l| l.rsplit('/').next().is_some_and(|f| f.contains(needle))),
    )
}

/// User + system CPU time `pid` has used, seconds (fields 14 and 15 of `/proc/<pid>/stat`):
/// what `smore bench arbiter` reports per second of wall time.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let s = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    let close = s.iter().rposition(|&b| b == b')')?;
    let mut f = s[close + 1..]
        .split(|b| b.is_ascii_whitespace())
        .filter(|f| !f.is_empty());
    // After the comm: field 3 is the first; utime is field 14 (index 11), stime field 15.
    let utime = parse_u64(f.nth(11)?)?;
    let stime = parse_u64(f.next()?)?;
    Some((utime + stime) as f64 / rustix::param::clock_ticks_per_second() as f64)
}

/// Inode of the initial pid namespace: the kernel's `PROC_PID_INIT_INO` (0xEFFFFFFC,
/// include/linux/proc_ns.h), the same on every Linux host. The arbiter must run there (or in the
/// namespace every function and NVML report pids in): `SO_PEERCRED` gives it each peer's pid in
/// its own namespace (0 for a peer outside it), and NVML reports pids of the initial namespace
/// (docs/kubernetes.md, "Containers and pid namespaces").
pub const INIT_PID_NS: u64 = 0xEFFF_FFFC;

/// The pid namespace of `pid` (its inode, from the `/proc/<pid>/ns/pid` link `pid:[<inode>]`);
/// None when it cannot be read.
pub fn pid_namespace(pid: u32) -> Option<u64> {
    let link = std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok()?;
    link.to_str()?
        .strip_prefix("pid:[")?
        .strip_suffix(']')?
        .parse()
        .ok()
}

/// A file as the kernel identifies it: device (major, minor) and inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileId {
    /// Device major number.
    pub major: u32,
    /// Device minor number.
    pub minor: u32,
    /// Inode number.
    pub inode: u64,
}

impl FileId {
    /// The id of the file at `path`.
    pub fn of(path: &std::path::Path) -> Option<FileId> {
        let st = rustix::fs::stat(path).ok()?;
        Some(FileId {
            major: rustix::fs::major(st.st_dev),
            minor: rustix::fs::minor(st.st_dev),
            inode: st.st_ino,
        })
    }
}

/// The file-backed mappings of a `/proc/<pid>/maps` text whose file name contains `needle`:
/// (file id, path). Lines are `addr perms offset major:minor inode path`.
pub fn mapped_files<'a>(
    maps: &'a str,
    needle: &'a str,
) -> impl Iterator<Item = (FileId, &'a str)> + 'a {
    maps.lines().filter_map(move |l| {
        let mut f = l.split_ascii_whitespace();
        let (_, _, _, dev, inode) = (f.next()?, f.next()?, f.next()?, f.next()?, f.next()?);
        let path = f.next()?;
        if !path.rsplit('/').next()?.contains(needle) {
            return None;
        }
        let (maj, min) = dev.split_once(':')?;
        Some((
            FileId {
                major: u32::from_str_radix(maj, 16).ok()?,
                minor: u32::from_str_radix(min, 16).ok()?,
                inode: inode.parse().ok()?,
            },
            path,
        ))
    })
}

/// A pidfd on one process: tells whether *that* process exited, however its pid is reused.
#[derive(Debug)]
pub struct Pidfd(OwnedFd);

impl Pidfd {
    /// Opens a pidfd on `pid` and checks it is the process that had `start` (the pid may have
    /// been recycled before the open). None when pidfds are unavailable (Linux < 5.3, seccomp)
    /// or the process is not that one: callers fall back to [`is_same_process`].
    pub fn open(pid: u32, start: u64) -> Option<Pidfd> {
        let fd = pidfd_open(Pid::from_raw(pid as i32)?, PidfdFlags::empty()).ok()?;
        let p = Pidfd(fd);
        // The pidfd names whatever process had `pid` at the open; the stat read after it names
        // the same process if that one has not exited since (checked last).
        (start_time(pid) == Some(start) && !p.exited()).then_some(p)
    }

    /// Whether the process exited (the pidfd is readable then). One `poll(2)`, no `/proc`.
    pub fn exited(&self) -> bool {
        let mut fds = [PollFd::new(&self.0, PollFlags::IN)];
        match poll(&mut fds, Some(&Timespec::default())) {
            Ok(n) => n > 0,
            // A failed poll says nothing about the process: not exited.
            Err(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_its_own_descendant() {
        let me = std::process::id();
        let st = start_time(me).unwrap();
        assert_eq!(
            own_start_time(),
            Some(st),
            "/proc/self is this process here"
        );
        assert!(is_same_process(me, st));
        assert!(!is_same_process(me, st + 1));
        assert!(is_descendant_of(me, me));
        let parent = parent(me).unwrap();
        assert!(is_descendant_of(me, parent));
        assert!(!is_descendant_of(parent, me));
        assert_eq!(maps_library(me, "definitely-not-mapped-lib"), Some(false));
    }

    #[test]
    fn a_child_shares_this_process_pid_namespace() {
        let me = pid_namespace(std::process::id()).expect("own pid namespace readable");
        let mut c = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        assert_eq!(pid_namespace(c.id()), Some(me));
        c.kill().unwrap();
        c.wait().unwrap();
        assert_eq!(pid_namespace(c.id()), None, "gone");
    }

    #[test]
    fn a_reaped_child_is_dead() {
        let mut c = std::process::Command::new("true").spawn().unwrap();
        let pid = c.id();
        c.wait().unwrap();
        assert_eq!(start_time(pid), None);
        assert!(
            matches!(stat_checked(pid), Ok(None)),
            "gone is a fact, not an error"
        );
    }

    #[test]
    fn groups_are_the_effective_gid_and_the_supplementary_ones() {
        let status = "Name:\tx\nUid:\t0\t0\t0\t0\nGid:\t5\t6\t6\t6\nGroups:\t7 8 \n";
        assert_eq!(parse_groups(status), Some(vec![6, 7, 8]));
        assert_eq!(parse_groups("Name:\tx\n"), None);
        assert!(groups(std::process::id()).is_some());
    }

    #[test]
    fn the_effective_uid_is_the_uid_lines_second_field() {
        let status = "Name:\tx\nUid:\t1000\t0\t0\t0\nGid:\t5\t6\t6\t6\n";
        assert_eq!(parse_effective_uid(status), Some(0));
        assert_eq!(parse_effective_uid("Name:\tx\n"), None);
        assert_eq!(parse_effective_uid("Uid:\t1000\n"), None);
        assert!(effective_uid(std::process::id()).is_some());
    }

    #[test]
    fn stat_lines_with_odd_command_names_parse() {
        let line = b"42 (a) b (c)) S 7 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 123456 1000 10 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n";
        assert_eq!(
            parse_stat(line),
            Some(Stat {
                state: b'S',
                ppid: 7,
                session: 42,
                start: 123456
            })
        );
        assert_eq!(parse_stat(b"42 (x) S 7"), None, "truncated");
        assert_eq!(parse_stat(b""), None);
        assert!(cpu_seconds(std::process::id()).is_some_and(|s| s >= 0.0));
    }

    #[test]
    fn mapped_files_are_identified_by_device_and_inode() {
        let maps = "7f00-7f01 r-xp 00000000 fd:01 1234 /opt/smore/libsmore_shim.so\n\
                    7f02-7f03 r--p 00000000 00:1f 99 /tmp/evil/libsmore_shim_fake.so\n\
                    7f04-7f05 rw-p 00000000 00:00 0 [heap]\n";
        let got: Vec<_> = mapped_files(maps, "libsmore_shim").collect();
        assert_eq!(got.len(), 2);
        assert_eq!(
            got[0].0,
            FileId {
                major: 0xfd,
                minor: 1,
                inode: 1234
            }
        );
        // This test's own executable, as its maps show it, is the file `FileId::of` names.
        let me = std::env::current_exe().unwrap();
        let name = me.file_name().unwrap().to_str().unwrap().to_string();
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let id = FileId::of(&me).unwrap();
        assert!(mapped_files(&maps, &name).any(|(f, _)| f == id));
    }

    #[test]
    fn a_pidfd_sees_its_process_exit() {
        let mut c = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let pid = c.id();
        let start = start_time(pid).unwrap();
        assert!(
            Pidfd::open(pid, start + 1).is_none(),
            "another start: not that process"
        );
        let Some(fd) = Pidfd::open(pid, start) else {
            // pidfds unavailable here (old kernel, seccomp): the fallback is tested elsewhere.
            c.kill().unwrap();
            c.wait().unwrap();
            return;
        };
        assert!(!fd.exited());
        c.kill().unwrap();
        c.wait().unwrap();
        assert!(fd.exited());
    }
}

//! Clock, sleep, stderr, fds, signals, fork-handler registration and lock-free slots for leaked
//! values: thin, audited wrappers over libc.
//!
//! Owns the process-image-wide `pthread_atfork` registration. Imports nothing from the crate:
//! the fork-child behaviour is a callback the runtime registers.
//!
//! Must never: block except in [`sleep_until`] and [`wait_hangup`] (the arbiter watcher thread
//! only), or take a lock in the fork-child handler.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering::*};

/// CLOCK_MONOTONIC in ns (a vDSO read, no syscall on Linux x86-64/aarch64).
#[inline]
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC is always supported.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The calling thread, as a number unique among the process's live threads (`pthread_self`:
/// a read of the thread pointer, no syscall, no allocation).
#[inline]
pub fn thread_id() -> usize {
    // SAFETY: pthread_self has no preconditions and cannot fail.
    unsafe { libc::pthread_self() as usize }
}

/// Sleeps until the CLOCK_MONOTONIC instant `deadline_ns` (absolute: no drift from 10 ms ticks or
/// from the time spent computing the deadline). Retries on EINTR.
pub fn sleep_until(deadline_ns: u64) {
    let ts = libc::timespec {
        tv_sec: (deadline_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (deadline_ns % 1_000_000_000) as libc::c_long,
    };
    loop {
        // SAFETY: `ts` is a valid timespec; a null remainder is allowed with TIMER_ABSTIME.
        let r = unsafe {
            libc::clock_nanosleep(
                libc::CLOCK_MONOTONIC,
                libc::TIMER_ABSTIME,
                &ts,
                std::ptr::null_mut(),
            )
        };
        if r != libc::EINTR {
            return;
        }
    }
}

/// A slot holding a leaked `&'static T` that can be emptied without freeing (fork child: the
/// old value may be mid-use by a thread that no longer exists, and its locks may be held).
pub struct LeakedSlot<T>(AtomicPtr<T>);

impl<T> LeakedSlot<T> {
    /// An empty slot.
    pub const fn new() -> Self {
        LeakedSlot(AtomicPtr::new(std::ptr::null_mut()))
    }

    /// The installed value, if any (one acquire load).
    #[inline]
    pub fn get(&self) -> Option<&'static T> {
        let p = self.0.load(Acquire);
        // SAFETY: the slot only ever holds null or a pointer from `Box::leak` in `install`, and
        // leaked values are never freed, so a non-null pointer is valid for 'static.
        unsafe { p.as_ref() }
    }

    /// Installs `v` unless another thread won; returns the value in the slot.
    pub fn install(&self, v: Box<T>) -> &'static T {
        let p: *mut T = Box::leak(v);
        match self
            .0
            .compare_exchange(std::ptr::null_mut(), p, AcqRel, Acquire)
        {
            // SAFETY: `p` is the leaked box we just stored.
            Ok(_) => unsafe { &*p },
            Err(cur) => {
                // SAFETY: we still own `p` (never published); `cur` is a leaked value (see get).
                unsafe {
                    drop(Box::from_raw(p));
                    &*cur
                }
            }
        }
    }

    /// Empties the slot, leaking the old value (lock-free: safe in a fork child handler).
    pub fn clear(&self) {
        self.0.store(std::ptr::null_mut(), Release);
    }
}

impl<T> Default for LeakedSlot<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// An atomically replaceable `&'static T` (the live limits page): one acquire load to read.
pub struct StaticRef<T>(AtomicPtr<T>);

impl<T> StaticRef<T> {
    /// Refers to `v` until [`StaticRef::set`] replaces it.
    pub fn new(v: &'static T) -> Self {
        StaticRef(AtomicPtr::new(std::ptr::from_ref(v).cast_mut()))
    }

    /// The current reference (one acquire load).
    #[inline]
    pub fn get(&self) -> &'static T {
        // SAFETY: the pointer only ever comes from a `&'static T` (`new`, `set`), so it is
        // non-null and valid for 'static.
        unsafe { &*self.0.load(Acquire) }
    }

    /// Replaces the reference; readers see either the old or the new one, both valid forever.
    pub fn set(&self, v: &'static T) {
        self.0.store(std::ptr::from_ref(v).cast_mut(), Release);
    }
}

/// The fork-child callback (a `fn()` as an address; 0 = none registered yet).
static ATFORK_CHILD: AtomicUsize = AtomicUsize::new(0);

extern "C" fn child_after_fork() {
    let a = ATFORK_CHILD.load(Acquire);
    if a == 0 {
        return;
    }
    // SAFETY: a non-zero value was stored by `register_atfork` from a `fn()`, so it is that
    // function's address.
    let f = unsafe { std::mem::transmute::<usize, fn()>(a) };
    // The callback must take no lock and allocate nothing (documented at `register_atfork`).
    let _ = std::panic::catch_unwind(f);
}

/// Registers `child` to run in the child after every `fork` of this process image (the first
/// registration installs the `pthread_atfork` handler; a later one replaces the callback).
/// `child` runs in a process with one thread whose memory may hold locks taken by threads that
/// no longer exist: it must only do atomic stores (no lock, no allocation).
pub fn register_atfork(child: fn()) {
    if ATFORK_CHILD.swap(child as usize, AcqRel) != 0 {
        return;
    }
    // SAFETY: registering a plain extern "C" fn with no prepare/parent handlers.
    unsafe { libc::pthread_atfork(None, None, Some(child_after_fork)) };
}

/// This process's id (getpid: cheap, not cached across fork by glibc ≥ 2.25).
pub fn pid() -> u32 {
    std::process::id()
}

/// The pid the arbiter knows this process by, packed with the pid it was learnt under:
/// `(own pid << 32) | arbiter's pid`; 0 = not known. A forked child inherits the value but not
/// the pid it was learnt under, so it falls back to its own pid.
static KNOWN_AS: AtomicU64 = AtomicU64::new(0);

/// Records that the arbiter knows this process as `theirs` (the grant's pid, from
/// `SO_PEERCRED`): in a container, its host pid — the one NVML reports.
pub fn set_known_as(theirs: u32) {
    KNOWN_AS.store((u64::from(pid()) << 32) | u64::from(theirs), Release);
}

/// Start time of process `pid` in clock ticks since boot (`/proc/<pid>/stat` field 22): `Ok(None)`
/// when there is no such living process (none, or a zombie whose threads have all exited: it
/// holds no memory, no fds and no GPU context any more — a leader that left by `pthread_exit`
/// while other threads run reads `Z` too, and lives), `Err` when `/proc` could not be read
/// otherwise (never taken for proof of death). Allocation slow path only (file reads).
pub fn start_ticks(pid: u32) -> Result<Option<u64>, std::io::Error> {
    let gone = |e: &std::io::Error| {
        e.kind() == std::io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH)
    };
    let bytes = match std::fs::read(format!("/proc/{pid}/stat")) {
        Ok(t) => t,
        Err(e) if gone(&e) => return Ok(None),
        Err(e) => return Err(e),
    };
    // Fields are counted from field 3 (state); field 22 is the 20th of them.
    if matches!(stat_field::<char>(&bytes, 0), Some('Z' | 'X')) {
        // The leader's entry stays in `task` until it is reaped; any other means a thread runs.
        match std::fs::read_dir(format!("/proc/{pid}/task")).map(|t| t.take(2).count()) {
            Ok(n) if n > 1 => {}
            Ok(_) => return Ok(None),
            Err(e) if gone(&e) => return Ok(None),
            Err(e) => return Err(e),
        }
    }
    stat_field(&bytes, 19)
        .map(Some)
        .ok_or_else(|| std::io::Error::other(format!("/proc/{pid}/stat: no start time")))
}

/// Whether `/proc` is this process's pid namespace's: `/proc/self` names this process by its own
/// pid. In a pid namespace that did not mount a `/proc` of its own (`unshare -p -f` alone),
/// `/proc/<pid>` is another process, so nothing read there by pid may be trusted — neither a
/// shared ledger's owner check nor a holder's files (found by review, 2026-11-29).
pub fn proc_is_ours() -> bool {
    std::fs::read_link("/proc/self")
        .ok()
        .and_then(|t| t.to_str()?.parse::<u32>().ok())
        == Some(pid())
}

/// Field `3 + n` of a `/proc/<pid>/stat` line, as a number. The command name (field 2) may hold
/// spaces, parentheses and bytes that are not UTF-8 (the kernel writes it raw): fields resume
/// after the last `)`, and only what follows is read as text.
fn stat_field<T: std::str::FromStr>(stat: &[u8], n: usize) -> Option<T> {
    let close = stat.iter().rposition(|&b| b == b')')?;
    std::str::from_utf8(&stat[close + 1..])
        .ok()?
        .split_ascii_whitespace()
        .nth(n)?
        .parse()
        .ok()
}

/// Whether the process of a shared-ledger owner word (pid, start time's low 32 bits) lives: a
/// process with that pid and start time exists (or `/proc` could not say otherwise).
pub fn owner_alive(owner: u64) -> bool {
    let pid = smore_protocol::ledger::owner_pid(owner);
    match start_ticks(pid) {
        Ok(Some(t)) => t & 0xffff_ffff == owner & 0xffff_ffff,
        Ok(None) => false,
        Err(_) => true,
    }
}

/// The pid the arbiter (and NVML) knows this process by: the recorded one if it was recorded in
/// this very process, else this process's own pid.
pub fn known_as() -> u32 {
    let me = pid();
    let v = KNOWN_AS.load(Acquire);
    if v != 0 && (v >> 32) as u32 == me {
        v as u32
    } else {
        me
    }
}

/// Blocks until the peer of the stream socket `fd` hangs up (or `fd` errs or is not open), without
/// reading from it: `poll(POLLRDHUP)` never consumes data another holder of the connection may be
/// waiting for, and does not wake for data (`POLLIN` is not asked for). Retries on EINTR.
pub fn wait_hangup(fd: RawFd) {
    while !wait_hangup_for(fd, -1) {}
}

/// Like [`wait_hangup`], for at most `timeout_ms` (−1: no limit): true if the peer hung up (or
/// `fd` erred), false if the time passed first.
pub fn wait_hangup_for(fd: RawFd, timeout_ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLRDHUP,
        revents: 0,
    };
    loop {
        // SAFETY: one valid pollfd, living across the call; any timeout is valid for poll.
        let r = unsafe { libc::poll(&mut p, 1, timeout_ms) };
        let gone = libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR | libc::POLLNVAL;
        if r > 0 && p.revents & gone != 0 {
            return true;
        }
        if r == 0 {
            return false;
        }
        if r < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return true;
        }
    }
}

/// Opens anew, close-on-exec, the file process `pid` holds at its fd `fd` (`/proc/<pid>/fd/<fd>`;
/// read-write when `write`): the grant page or ledger a worker inherited in its environment but
/// not as an fd (started with `close_fds`, as Python's `subprocess` and multiprocessing's `spawn`
/// start theirs), from the process `smore run` exec'd, which keeps them. The kernel allows it to a
/// process of the same user that may read the other's memory (ptrace read access); init path
/// only (a path is formatted and a file opened).
///
/// Only a memfd named `memfd` (`smore-grant`, `smore-ledger`, `smore-turns`) is opened: the link
/// is read first, which touches no file system, so whatever else the holder keeps at that number
/// (a socket, a FIFO, a tty, a file on a hung mount) is never opened; and non-blocking, without
/// becoming a controlling terminal, whatever it is.
pub fn reopen_from(
    pid: u32,
    fd: RawFd,
    memfd: &str,
    write: bool,
) -> Result<std::os::fd::OwnedFd, String> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = format!("/proc/{pid}/fd/{fd}");
    let target = std::fs::read_link(&path).map_err(|e| format!("cannot read {path}: {e}"))?;
    let want = format!("/memfd:{memfd}");
    let name = target.to_string_lossy();
    if !(name == want || name.starts_with(&format!("{want} "))) {
        return Err(format!("{path} is {name}, not a {want}"));
    }
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(libc::O_CLOEXEC | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(&path)
        .map(std::os::fd::OwnedFd::from)
        .map_err(|e| format!("cannot open {path}: {e}"))?;
    // What was opened, not what the link said a moment before (the holder may have moved its
    // fd in between).
    use std::os::fd::AsRawFd;
    let opened = std::fs::read_link(format!("/proc/self/fd/{}", f.as_raw_fd()))
        .map(|t| t.to_string_lossy().into_owned())
        .unwrap_or_default();
    if !(opened == want || opened.starts_with(&format!("{want} "))) {
        return Err(format!("{path} was {name}, then opened as {opened:?}"));
    }
    Ok(f)
}

/// Whether process `ancestor` is this process's parent, its parent's parent, … (at most 64
/// levels; `/proc/<pid>/stat` reads: init path only). A pid that is an ancestor now is the
/// process it names: a living ancestor's pid cannot have been reused.
pub fn is_ancestor(ancestor: u32) -> bool {
    if ancestor == 0 {
        // The parent of init, or of a process whose parent is outside the pid namespace.
        return false;
    }
    // `/proc/self` first: it resolves in `/proc`'s own pid namespace, the one the holder's pid
    // and `reopen_from` are read in.
    let mut path = "/proc/self/stat".to_string();
    for _ in 0..64 {
        // Field 4: the parent's pid.
        let Some(parent) = std::fs::read(&path)
            .ok()
            .and_then(|s| stat_field::<u32>(&s, 1))
        else {
            return false;
        };
        if parent == ancestor {
            return true;
        }
        if parent <= 1 {
            return false;
        }
        path = format!("/proc/{parent}/stat");
    }
    false
}

/// Closes an fd this crate owns (a dead arbiter connection).
pub fn close_fd(fd: RawFd) {
    // SAFETY: the caller owns `fd` and nothing else uses it afterwards.
    unsafe { libc::close(fd) };
}

/// A close-on-exec duplicate of `fd` if it is an open socket (an inherited arbiter connection):
/// the shim then owns its own reference, whatever the host later does with `fd`.
pub fn dup_socket(fd: RawFd) -> Result<RawFd, String> {
    // SAFETY: `stat` is plain old data; all-zero is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat on any integer is safe (EBADF for a non-fd); `st` is a valid out pointer.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(format!(
            "fd {fd} is not open ({})",
            std::io::Error::last_os_error()
        ));
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err(format!("fd {fd} is not a socket"));
    }
    // SAFETY: `sockaddr_storage` is plain old data; all-zero is a valid value.
    let mut addr: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: `fd` is an open socket (checked above); `addr` and `len` are valid out pointers
    // of the size `len` says.
    let rc = unsafe {
        libc::getsockname(
            fd,
            (&mut addr as *mut libc::sockaddr_storage).cast::<libc::sockaddr>(),
            &mut len,
        )
    };
    if rc != 0 || i32::from(addr.ss_family) != libc::AF_UNIX {
        return Err(format!("fd {fd} is not a unix socket (not the arbiter's)"));
    }
    // SAFETY: duplicating an open fd onto the lowest free number ≥ 3; the result is checked.
    let d = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) };
    if d < 0 {
        return Err(format!(
            "dup of fd {fd} failed: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(d)
}

/// Writes `bytes` to fd 2 with write(2), retrying on EINTR and short writes; errors are dropped
/// (a closed stderr must not break the host). Takes no lock.
pub fn write_stderr(mut bytes: &[u8]) {
    while !bytes.is_empty() {
        // SAFETY: `bytes` is a valid buffer of `bytes.len()` bytes; fd 2 may be closed (EBADF).
        let n = unsafe { libc::write(2, bytes.as_ptr().cast(), bytes.len()) };
        if n > 0 {
            bytes = &bytes[n as usize..];
        } else if n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
            continue;
        } else {
            return;
        }
    }
}

/// Blocks every blockable signal in the calling thread (the shim's own background thread), so
/// signals meant for the host's threads are never delivered to it.
pub fn block_signals() {
    // SAFETY: `set` is initialised by sigfillset before use; pthread_sigmask on the calling
    // thread with a valid set and a null old-set pointer.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut set);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_read_after_a_command_name_of_any_bytes() {
        // A name cut at 15 bytes inside a multibyte character, with a ") " in it.
        let mut line = b"4242 (a) b\xe2\x82".to_vec();
        line.extend_from_slice(b") S 17 4242 4242 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 987654");
        assert_eq!(stat_field::<u32>(&line, 1), Some(17), "the parent");
        assert_eq!(
            stat_field::<u64>(&line, 19),
            Some(987_654),
            "the start time"
        );
        assert_eq!(stat_field::<u32>(b"no parenthesis", 1), None);
        // This process's parent is its ancestor; pid 0 and a pid that is not are not.
        assert!(is_ancestor(std::os::unix::process::parent_id()));
        assert!(!is_ancestor(0));
        assert!(!is_ancestor(u32::MAX - 1));
    }

    #[test]
    fn a_zombie_has_no_start_time_and_a_leader_whose_threads_run_has() {
        assert!(proc_is_ours(), "/proc is this test's pid namespace's");
        assert!(start_ticks(pid()).unwrap().is_some());
        // A leader that left by pthread_exit while another thread runs reads Z, and lives: its
        // memory, fds and GPU context are its threads'.
        let script = "import threading, time, sys\n\
                      threading.Thread(target=time.sleep, args=(30,)).start()\n\
                      sys.stdout.write('x\\n'); sys.stdout.flush()\n\
                      import ctypes; ctypes.CDLL(None).pthread_exit(None)";
        let mut leader = std::process::Command::new("python3")
            .args(["-c", script])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(leader.stdout.as_mut().unwrap()),
            &mut line,
        )
        .unwrap();
        let lid = leader.id();
        let since = std::time::Instant::now();
        loop {
            let stat = std::fs::read(format!("/proc/{lid}/stat")).unwrap();
            if stat_field::<char>(&stat, 0) == Some('Z') {
                break;
            }
            assert!(since.elapsed().as_secs() < 10, "the leader never exited");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let alive = start_ticks(lid).unwrap();
        let _ = leader.kill();
        let _ = leader.wait();
        assert!(alive.is_some(), "a leader whose thread runs is alive");
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let child_pid = child.id();
        // Not reaped yet: it turns into a zombie, which holds nothing a start time vouches for.
        let since = std::time::Instant::now();
        loop {
            let stat = std::fs::read(format!("/proc/{child_pid}/stat")).unwrap();
            if stat_field::<char>(&stat, 0) == Some('Z') {
                break;
            }
            assert!(since.elapsed().as_secs() < 10, "never became a zombie");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(start_ticks(child_pid).unwrap(), None);
        child.wait().unwrap();
        assert_eq!(start_ticks(child_pid).unwrap(), None);
    }

    #[test]
    fn the_pid_the_arbiter_knows_holds_in_this_process_and_not_in_a_forked_child() {
        assert_eq!(known_as(), pid(), "not known yet: this process's own pid");
        set_known_as(pid() + 1_000_000);
        assert_eq!(known_as(), pid() + 1_000_000);
        // As a forked child sees the inherited value: learnt under another pid, so not its own.
        KNOWN_AS.store((u64::from(pid() + 1) << 32) | 77, Release);
        assert_eq!(known_as(), pid());
        KNOWN_AS.store(0, Release);
    }
}

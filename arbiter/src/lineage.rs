//! Descendants of functions, followed as the kernel creates them (issue 12, item 6).
//!
//! Why: attribution used to walk a GPU process's parent chain up to a function's registered
//! process. A child that double-forks (`fork`, `setsid`, `fork`, parent exits) is re-parented
//! to init or a subreaper, its chain no longer reaches the function, and it was taken for
//! *training*: no cap, never watched, and its SM use reshaped the other functions' shares. The
//! kernel's process-events connector (netlink `NETLINK_CONNECTOR`, group `CN_IDX_PROC`) reports
//! every `fork` with parent and child as they happen, so the lineage is recorded before the
//! parent can exit and is never lost to re-parenting.
//!
//! Owns: [`Lineage`] — the roots (functions' registered processes, pid + start time), the
//! recorded descendants of live roots (pid + start time, so a recycled pid is never taken for
//! one), the connector thread that feeds it, and the [`Mode`] in use. Memory is bounded: only
//! forks whose parent is a root or a recorded descendant are kept, entries go when their process
//! exits or their root is dropped, and at most [`MAX_DESCENDANTS`] are held.
//!
//! Must never: record a process that is not provably a root's descendant (a fork event from a
//! recorded parent, with the child's start time read at once), block the state lock on the
//! socket, or be consulted as the only evidence when it is not running ([`Mode::ParentWalk`]:
//! attribution then walks parents and checks sessions, docs/arbiter.md "Attribution").
//!
//! Pid namespaces: the connector reports pids of the initial pid namespace, which is what the
//! arbiter sees only when it runs there (as NVML's pids, docs/kubernetes.md "Containers and pid
//! namespaces"); the kernel also ignores a listen request from any other namespace. So the
//! connector is used only by an arbiter in the initial pid namespace.

use std::collections::HashMap;
use std::sync::Mutex;

/// Descendants recorded at most (all roots together). Reasoning: a function's runtime has a few
/// to a few hundred processes; 65 536 × ~40 bytes ≈ 2.5 MiB bounds the arbiter's memory against
/// a function that forks without end. Past it new forks are not recorded (logged once) and
/// attribution falls back to the parent walk for them.
pub const MAX_DESCENDANTS: usize = 65_536;

/// How descendants are followed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// Fork events from the kernel's process connector: a double-forked child is still known.
    ProcConnector,
    /// No connector (the reason says why): the parent walk plus session evidence only; a
    /// double-forked child that also left the function's session is not seen as the function's.
    ParentWalk(String),
}

impl Mode {
    /// For `smore status` and the start log.
    pub fn describe(&self) -> String {
        match self {
            Mode::ProcConnector => "proc-connector: fork events from the kernel; descendants are followed even after re-parenting".into(),
            Mode::ParentWalk(why) => format!(
                "parent-walk ({why}): a function's descendant is recognised by its parent chain or its session; one that double-forks out of the function's session is taken for training"
            ),
        }
    }
}

/// A process, across pid reuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Proc {
    pid: u32,
    start: u64,
}

#[derive(Debug, Default)]
struct Inner {
    /// Functions' registered processes: pid → start time.
    roots: HashMap<u32, u64>,
    /// Descendants: pid → (its start time, its root). The start time is None for a process
    /// that was gone (or a zombie) by the time its fork event was read — the middle of a double
    /// fork exits at once: it is kept only as a link, so its children are recorded, and is
    /// never itself attributed. Events come in order, so its exit removes it before its pid
    /// can fork again as another process.
    descendants: HashMap<u32, (Option<u64>, Proc)>,
    /// Whether the bound was hit (logged once).
    full_logged: bool,
}

/// The record of functions' descendants (see the module docs).
#[derive(Debug)]
pub struct Lineage {
    mode: Mode,
    inner: Mutex<Inner>,
}

impl Default for Lineage {
    fn default() -> Self {
        Lineage::without_connector("not started")
    }
}

impl Lineage {
    /// A record fed by nothing (tests, or no connector): [`Mode::ParentWalk`].
    pub fn without_connector(why: &str) -> Lineage {
        Lineage {
            mode: Mode::ParentWalk(why.to_string()),
            inner: Default::default(),
        }
    }

    fn with_mode(mode: Mode) -> Lineage {
        Lineage {
            mode,
            inner: Default::default(),
        }
    }

    /// Starts following forks through the process connector where it can, on its own thread;
    /// otherwise a record in [`Mode::ParentWalk`]. Logs the mode once.
    pub fn start() -> std::sync::Arc<Lineage> {
        let lineage = match connector::open() {
            Ok(sock) => {
                let l = std::sync::Arc::new(Lineage::with_mode(Mode::ProcConnector));
                let feed = l.clone();
                match std::thread::Builder::new()
                    .name("smore-lineage".into())
                    .spawn(move || connector::run(sock, &feed))
                {
                    Ok(_) => l,
                    Err(e) => std::sync::Arc::new(Lineage::without_connector(&format!(
                        "cannot start its thread: {e}"
                    ))),
                }
            }
            Err(why) => std::sync::Arc::new(Lineage::without_connector(&why)),
        };
        tracing::info!("descendants of functions: {}", lineage.mode.describe());
        lineage
    }

    /// How descendants are followed.
    pub fn mode(&self) -> &Mode {
        &self.mode
    }

    /// Whether fork events feed this record.
    pub fn active(&self) -> bool {
        self.mode == Mode::ProcConnector
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A function's registered process: its forks are recorded from now on.
    pub fn add_root(&self, pid: u32, start: u64) {
        self.lock().roots.insert(pid, start);
    }

    /// Keeps only the roots `keep` says are still functions' (and their descendants).
    pub fn retain_roots(&self, mut keep: impl FnMut(u32) -> bool) {
        let mut g = self.lock();
        let before = g.roots.len();
        g.roots.retain(|&pid, _| keep(pid));
        if g.roots.len() != before {
            let roots = std::mem::take(&mut g.roots);
            g.descendants
                .retain(|_, (_, root)| roots.get(&root.pid) == Some(&root.start));
            g.roots = roots;
        }
    }

    /// The root (registered pid) whose descendant the process `pid` that had `start` is, if
    /// one was recorded.
    pub fn root_of(&self, pid: u32, start: u64) -> Option<u32> {
        let g = self.lock();
        let &(s, root) = g.descendants.get(&pid)?;
        (s == Some(start) && g.roots.get(&root.pid) == Some(&root.start)).then_some(root.pid)
    }

    /// The recorded descendants of `root` whose start time is known: (pid, start).
    pub fn descendants_of(&self, root: u32) -> Vec<(u32, u64)> {
        self.lock()
            .descendants
            .iter()
            .filter(|(_, (_, r))| r.pid == root)
            .filter_map(|(&pid, &(start, _))| Some((pid, start?)))
            .collect()
    }

    /// Descendants recorded now.
    pub fn len(&self) -> usize {
        self.lock().descendants.len()
    }

    /// Whether none is recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `parent` forked the process `child`; `child_start` reads the child's start time (called
    /// only when the parent is a root or a recorded descendant).
    pub fn on_fork(&self, parent: u32, child: u32, child_start: impl FnOnce() -> Option<u64>) {
        let root = {
            let g = self.lock();
            match g.roots.get(&parent) {
                Some(&start) => Proc { pid: parent, start },
                None => match g.descendants.get(&parent) {
                    Some(&(_, root)) => root,
                    None => return,
                },
            }
        };
        // Read outside the lock (a /proc read); a child already gone is kept as a link only.
        let start = child_start();
        let mut g = self.lock();
        if g.descendants.len() >= MAX_DESCENDANTS && !g.descendants.contains_key(&child) {
            if !g.full_logged {
                g.full_logged = true;
                tracing::warn!(
                    "{MAX_DESCENDANTS} descendants of functions recorded: further forks are attributed by their parent chain only"
                );
            }
            return;
        }
        g.descendants.insert(child, (start, root));
    }

    /// The process `pid` exited.
    pub fn on_exit(&self, pid: u32) {
        let mut g = self.lock();
        if !g.descendants.is_empty() {
            g.descendants.remove(&pid);
        }
    }

    /// Events were lost (the socket overflowed): drops every recorded process that is not the
    /// one recorded any more (exited, or its pid recycled), and every link (its exit may have
    /// been among the lost events).
    pub fn revalidate(&self, same: impl Fn(u32, u64) -> bool) {
        self.lock()
            .descendants
            .retain(|&pid, (start, _)| start.is_some_and(|s| same(pid, s)));
    }
}

/// The netlink process connector (Linux `include/uapi/linux/cn_proc.h`, `connector.h`).
mod connector {
    use super::Lineage;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

    const NETLINK_CONNECTOR: i32 = 11;
    const CN_IDX_PROC: u32 = 1;
    const CN_VAL_PROC: u32 = 1;
    const PROC_CN_MCAST_LISTEN: u32 = 1;
    const NLMSG_DONE: u16 = 3;
    const PROC_EVENT_NONE: u32 = 0;
    const PROC_EVENT_FORK: u32 = 1;
    const PROC_EVENT_EXIT: u32 = 0x8000_0000;
    /// nlmsghdr (16 bytes) + cn_msg (20 bytes): where `struct proc_event` starts.
    const EVENT_AT: usize = 36;
    /// Receive buffer asked for, bytes: a fork storm on the node must not overflow it between
    /// two reads of the thread (each event is 76 bytes with headers).
    const RCVBUF: i32 = 4 << 20;

    fn u32_at(b: &[u8], at: usize) -> Option<u32> {
        Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
    }

    fn last_error(what: &str) -> String {
        format!("{what}: {}", std::io::Error::last_os_error())
    }

    /// A subscribed socket, or why none.
    pub(super) fn open() -> Result<OwnedFd, String> {
        if crate::proc::pid_namespace(std::process::id()) != Some(crate::proc::INIT_PID_NS) {
            return Err("the arbiter is not in the initial pid namespace, where the process connector reports pids".into());
        }
        // SAFETY: plain socket(2); the returned descriptor is owned below.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
                NETLINK_CONNECTOR,
            )
        };
        if fd < 0 {
            return Err(last_error("no netlink process connector"));
        }
        // SAFETY: fd was just returned by socket(2) and is owned by nobody else.
        let sock = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: setsockopt with a pointer to a live i32 and its size. Failure only leaves the
        // default buffer (the FORCE variant needs CAP_NET_ADMIN, which the connector needs too).
        unsafe {
            let v = RCVBUF;
            let p = &v as *const i32 as *const libc::c_void;
            let n = std::mem::size_of::<i32>() as libc::socklen_t;
            if libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, p, n) != 0 {
                libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, p, n);
            }
        }
        // SAFETY: sockaddr_nl is plain data; zeroed is a valid value.
        let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        addr.nl_groups = CN_IDX_PROC;
        // SAFETY: bind with a pointer to a live sockaddr_nl and its size.
        let rc = unsafe {
            libc::bind(
                fd,
                &addr as *const libc::sockaddr_nl as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(last_error("cannot bind the process connector"));
        }
        // nlmsghdr + cn_msg + the listen op.
        let mut msg = Vec::with_capacity(EVENT_AT + 4);
        msg.extend_from_slice(&((EVENT_AT + 4) as u32).to_ne_bytes()); // nlmsg_len
        msg.extend_from_slice(&NLMSG_DONE.to_ne_bytes()); // nlmsg_type
        msg.extend_from_slice(&0u16.to_ne_bytes()); // nlmsg_flags
        msg.extend_from_slice(&0u32.to_ne_bytes()); // nlmsg_seq
        msg.extend_from_slice(&std::process::id().to_ne_bytes()); // nlmsg_pid
        msg.extend_from_slice(&CN_IDX_PROC.to_ne_bytes()); // cn_msg.id.idx
        msg.extend_from_slice(&CN_VAL_PROC.to_ne_bytes()); // cn_msg.id.val
        msg.extend_from_slice(&0u32.to_ne_bytes()); // seq
        msg.extend_from_slice(&0u32.to_ne_bytes()); // ack
        msg.extend_from_slice(&4u16.to_ne_bytes()); // len
        msg.extend_from_slice(&0u16.to_ne_bytes()); // flags
        msg.extend_from_slice(&PROC_CN_MCAST_LISTEN.to_ne_bytes());
        // SAFETY: send of a live buffer with its length.
        let n = unsafe { libc::send(fd, msg.as_ptr() as *const libc::c_void, msg.len(), 0) };
        if n != msg.len() as isize {
            return Err(last_error("cannot subscribe to the process connector"));
        }
        // The kernel acknowledges the subscription (a PROC_EVENT_NONE carrying an errno):
        // without CAP_NET_ADMIN it says EPERM. Wait up to a second for it.
        set_timeout(&sock, 1)?;
        let mut buf = [0u8; 4096];
        let t0 = std::time::Instant::now();
        loop {
            if t0.elapsed() > std::time::Duration::from_secs(2) {
                return Err("the process connector did not acknowledge the subscription".into());
            }
            let n = recv(&sock, &mut buf)
                .map_err(|e| format!("no acknowledgement from the process connector: {e}"))?;
            let b = &buf[..n];
            if u32_at(b, EVENT_AT) == Some(PROC_EVENT_NONE) {
                match u32_at(b, EVENT_AT + 16) {
                    Some(0) => break,
                    Some(err) => {
                        return Err(format!(
                            "the process connector refused the subscription: {} (it needs CAP_NET_ADMIN)",
                            std::io::Error::from_raw_os_error(err as i32)
                        ))
                    }
                    None => continue,
                }
            }
        }
        set_timeout(&sock, 0)?;
        Ok(sock)
    }

    fn set_timeout(sock: &OwnedFd, secs: i64) -> Result<(), String> {
        let tv = libc::timeval {
            tv_sec: secs as libc::time_t,
            tv_usec: 0,
        };
        // SAFETY: setsockopt with a pointer to a live timeval and its size.
        let rc = unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                &tv as *const libc::timeval as *const libc::c_void,
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(last_error("cannot set a timeout on the process connector"))
        }
    }

    fn recv(sock: &OwnedFd, buf: &mut [u8]) -> std::io::Result<usize> {
        // SAFETY: recv into a live, writable buffer of the given length.
        let n = unsafe {
            libc::recv(
                sock.as_raw_fd(),
                buf.as_mut_ptr() as *mut libc::c_void,
                buf.len(),
                0,
            )
        };
        if n < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }

    /// Feeds `lineage` from `sock` for the life of the arbiter.
    pub(super) fn run(sock: OwnedFd, lineage: &Lineage) {
        let mut buf = vec![0u8; 64 * 1024];
        let mut failures = 0u32;
        loop {
            let n = match recv(&sock, &mut buf) {
                Ok(n) => {
                    failures = 0;
                    n
                }
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                    // Events were dropped: an exit may be among them, so a recorded pid may have
                    // been recycled. Check every record against its start time.
                    tracing::warn!(
                        "process connector overflowed: re-checking the recorded descendants"
                    );
                    lineage.revalidate(crate::proc::is_same_process);
                    continue;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    failures += 1;
                    if failures == 1 {
                        tracing::warn!("process connector: {e}");
                    }
                    std::thread::sleep(std::time::Duration::from_millis(100));
                    continue;
                }
            };
            events(&buf[..n], lineage);
        }
    }

    /// Handles every netlink message in one datagram.
    fn events(mut b: &[u8], lineage: &Lineage) {
        while let Some(len) = u32_at(b, 0).map(|l| l as usize) {
            if len < EVENT_AT + 16 || len > b.len() {
                return;
            }
            let ev = &b[EVENT_AT..len];
            match u32_at(ev, 0) {
                Some(PROC_EVENT_FORK) => {
                    // parent_pid, parent_tgid, child_pid, child_tgid after the 16-byte header.
                    let (Some(parent), Some(child_pid), Some(child)) =
                        (u32_at(ev, 20), u32_at(ev, 24), u32_at(ev, 28))
                    else {
                        return;
                    };
                    // A new thread (child_pid ≠ child_tgid) is not a new process.
                    if child_pid == child {
                        lineage.on_fork(parent, child, || crate::proc::start_time(child));
                    }
                }
                Some(PROC_EVENT_EXIT) => {
                    if let (Some(pid), Some(tgid)) = (u32_at(ev, 16), u32_at(ev, 20)) {
                        if pid == tgid {
                            lineage.on_exit(tgid);
                        }
                    }
                }
                _ => {}
            }
            let next = (len + 3) & !3;
            if next >= b.len() {
                return;
            }
            b = &b[next..];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forks_of_roots_and_their_descendants_are_recorded_and_nothing_else() {
        let l = Lineage::without_connector("test");
        l.add_root(100, 10);
        l.on_fork(100, 101, || Some(11)); // the function's child
        l.on_fork(101, 102, || Some(12)); // its grandchild (double fork)
        l.on_fork(1, 200, || panic!("a stranger's fork costs no /proc read"));
        assert_eq!(l.root_of(102, 12), Some(100));
        assert_eq!(l.root_of(200, 13), None);
        assert_eq!(l.len(), 2);
        // The middle process exits (the grandchild is re-parented): the grandchild stays known.
        l.on_exit(101);
        assert_eq!(l.root_of(102, 12), Some(100));
        // A recycled pid (another start time) is not the descendant.
        assert_eq!(l.root_of(102, 99), None);
        assert_eq!(l.descendants_of(100), vec![(102, 12)]);
        // The function goes: its descendants go with it.
        l.retain_roots(|_| false);
        assert_eq!(l.root_of(102, 12), None);
        assert!(l.is_empty());
    }

    #[test]
    fn a_middle_process_gone_when_read_links_its_children_and_revalidation_drops_recycled_pids() {
        let l = Lineage::without_connector("test");
        l.add_root(100, 10);
        // The middle of a double fork, gone (or a zombie) when its fork event is read.
        l.on_fork(100, 101, || None);
        l.on_fork(101, 105, || Some(15));
        assert_eq!(
            l.root_of(105, 15),
            Some(100),
            "linked through the middle process"
        );
        assert_eq!(
            l.root_of(101, 11),
            None,
            "a link is never attributed itself"
        );
        l.on_exit(101);
        l.on_fork(101, 106, || Some(16));
        assert_eq!(
            l.root_of(106, 16),
            None,
            "a recycled pid of the link is nobody's"
        );
        l.on_exit(105);
        l.on_fork(100, 102, || Some(12));
        l.on_fork(100, 103, || Some(13));
        l.revalidate(|pid, _| pid == 103);
        assert_eq!(l.root_of(102, 12), None);
        assert_eq!(l.root_of(103, 13), Some(100));
    }
}

//! The two things the state machine reads from the outside world besides NVML samples: the
//! clock and facts about processes. Injected, so every rule in `state` is testable with fakes.
//!
//! Owns: the [`Clock`] and [`ProcFacts`] seams and their live implementations ([`SystemClock`],
//! [`LiveProcs`] over [`crate::proc`]). Must never: be consulted on a path that cannot fail
//! softly — every fact is an `Option` (the process may vanish mid-read).

use std::sync::OnceLock;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Time in seconds since the Unix epoch, never going backwards.
pub trait Clock: Send {
    /// Now, seconds since the epoch.
    fn now(&self) -> f64;
}

/// The system clock, stepped by the monotonic clock: the wall time when the daemon first read
/// it, plus the monotonic time since. Every window of the state (the slowdown estimate, use and
/// misses, request pacing, the over-use debt, escalation) is a difference of two readings, and a
/// wall clock stepped back (NTP, an operator) would make them negative or stall them: the request
/// pacer refused every request for as long as the step (found by review, 2026-11-28). Readings
/// drift from the wall clock by whatever it is stepped by while the daemon runs.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> f64 {
        static ANCHOR: OnceLock<(f64, Instant)> = OnceLock::new();
        let (wall, at) = ANCHOR.get_or_init(|| {
            let wall = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0);
            (wall, Instant::now())
        });
        wall + at.elapsed().as_secs_f64()
    }
}

/// Bound on a parent walk: deeper trees are not followed (a function's processes are a few
/// levels below it; the bound stops a cycle in a racing `/proc` from looping).
pub const MAX_ANCESTRY_DEPTH: usize = 64;

/// A handle on one process that reports its exit without reading `/proc` (a pidfd).
pub trait Liveness: Send {
    /// Whether the process exited.
    fn exited(&self) -> bool;
}

impl Liveness for crate::proc::Pidfd {
    fn exited(&self) -> bool {
        crate::proc::Pidfd::exited(self)
    }
}

/// What the arbiter needs to know about a process.
pub trait ProcFacts: Send {
    /// Start time of `pid` (clock ticks since boot), None if it is gone or a zombie.
    fn start_time(&self, pid: u32) -> Option<u64>;
    /// Parent of `pid`.
    fn parent(&self, pid: u32) -> Option<u32>;
    /// Session of `pid` (its leader's pid); None: unknown.
    fn session(&self, _pid: u32) -> Option<u32> {
        None
    }
    /// The groups `pid` acts with (effective gid + supplementary); None: unknown.
    fn groups(&self, _pid: u32) -> Option<Vec<u32>> {
        None
    }
    /// Whether the smore shim is mapped into `pid` (None: cannot tell).
    fn shim_mapped(&self, pid: u32) -> Option<bool>;

    /// Whether `pid` is an MPS server (`nvidia-cuda-mps-server`: its command name, its program a
    /// root-owned file of that name, its parent root's MPS control daemon); None: cannot tell. Asked only of a process no function owns ([`super::attribution`]).
    fn is_mps_server(&self, _pid: u32) -> Option<bool> {
        None
    }

    /// A handle that reports the exit of the process `pid` that had `start`; None when the
    /// platform has none (callers then re-check [`ProcFacts::is_same_process`]).
    fn watch(&self, _pid: u32, _start: u64) -> Option<Box<dyn Liveness>> {
        None
    }

    /// Whether `pid` is alive and the process that had `start` (pid reuse check). Only a
    /// positive fact (no such process, another start time, a zombie) says no: a read that
    /// fails for another reason (no file descriptor left) is "alive".
    fn is_same_process(&self, pid: u32, start: u64) -> bool {
        self.start_time(pid) == Some(start)
    }

    /// Whether `ancestor` is `pid` or one of its ancestors (bounded walk).
    fn is_descendant_of(&self, pid: u32, ancestor: u32) -> bool {
        let mut p = pid;
        for _ in 0..MAX_ANCESTRY_DEPTH {
            if p == ancestor {
                return true;
            }
            match self.parent(p) {
                Some(pp) if pp != 0 && pp != p => p = pp,
                _ => return false,
            }
        }
        false
    }
}

/// File-name fragment of the shim library (what `shim_mapped` looks for in `/proc/<pid>/maps`).
pub const SHIM_LIBRARY: &str = "libsmore_shim";
/// File name of the installed shim.
pub const SHIM_FILE: &str = "libsmore_shim.so";

/// Which mapped files are the real shim: the installed file (device + inode), or a file with
/// the same bytes (a copy, e.g. `smore run --shim`). A file merely *named* like the shim is
/// not. Verdicts are cached per file id, so each distinct file is read at most once.
#[derive(Debug, Default)]
pub struct ShimCheck {
    /// The installed shim: its id and path (None: not found — then only the name is checked,
    /// and the arbiter says so at start).
    reference: Option<(crate::proc::FileId, std::path::PathBuf)>,
    verdicts: std::sync::Mutex<std::collections::HashMap<crate::proc::FileId, bool>>,
}

impl ShimCheck {
    /// The shim installed next to this executable (or in `$SMORE_LIB_DIR`).
    pub fn installed() -> ShimCheck {
        let reference = smore_protocol::install::find(SHIM_FILE)
            .and_then(|p| Some((crate::proc::FileId::of(&p)?, p)));
        if reference.is_none() {
            tracing::warn!(
                "{SHIM_FILE} not found next to the arbiter or in $SMORE_LIB_DIR: the watchdog can only check mapped file names"
            );
        }
        ShimCheck::with_reference(reference)
    }

    /// A check against a given file (None: names only).
    pub fn with_reference(
        reference: Option<(crate::proc::FileId, std::path::PathBuf)>,
    ) -> ShimCheck {
        ShimCheck {
            reference,
            verdicts: Default::default(),
        }
    }

    fn genuine(&self, id: crate::proc::FileId, path: &str) -> bool {
        let Some((ref_id, ref_path)) = &self.reference else {
            return true;
        };
        if id == *ref_id {
            return true;
        }
        let mut v = self.verdicts.lock().unwrap_or_else(|e| e.into_inner());
        *v.entry(id).or_insert_with(|| {
            // Same id as mapped (not a file swapped in at the same path since) and same bytes.
            crate::proc::FileId::of(std::path::Path::new(path)) == Some(id)
                && matches!(
                    (std::fs::read(path), std::fs::read(ref_path)),
                    (Ok(a), Ok(b)) if a == b
                )
        })
    }

    /// Whether the genuine shim is mapped in this maps text.
    pub fn in_maps(&self, maps: &str) -> bool {
        crate::proc::mapped_files(maps, SHIM_LIBRARY).any(|(id, path)| self.genuine(id, path))
    }
}

/// `/proc/<pid>/comm` of an MPS server: `nvidia-cuda-mps-server` cut to the kernel's 15
/// characters (TASK_COMM_LEN less its NUL). The control daemon, `nvidia-cuda-mps-control`, which
/// starts the server, reads the same but holds no CUDA context, so NVML never lists it on a GPU. Seen on an NVIDIA H200
/// (driver 580.159.04): NVML listed the server (69 MB) among the GPU's compute processes
/// beside its clients, and the arbiter took it for a training job (docs/real-gpu.md, section
/// 11).
pub const MPS_SERVER_COMM: &str = "nvidia-cuda-mps";
/// The MPS server's program, as NVIDIA ships it; it must also be owned by root
/// ([`LiveProcs`]'s check).
pub const MPS_SERVER_EXE: &str = "nvidia-cuda-mps-server";

/// Whether a process has an MPS server's shape: its command name `comm`, the file name and
/// owner of its program, and its parent's command name and effective user. The name is the
/// process's to choose (prctl). The program must be a root-owned file named as NVIDIA ships it,
/// but that file is world-executable, so anyone can run it (found by review, 2026-11-28); its
/// parent must be root's MPS control daemon, which a function (not root) cannot start: a
/// function's own daemon runs as the function's user.
pub fn mps_server_shape(
    comm: &str,
    exe_name: Option<&str>,
    exe_uid: u32,
    parent_comm: &str,
    parent_uid: u32,
) -> bool {
    comm.trim_end_matches('\n') == MPS_SERVER_COMM
        && exe_name == Some(MPS_SERVER_EXE)
        && exe_uid == 0
        && parent_comm.trim_end_matches('\n') == MPS_SERVER_COMM
        && parent_uid == 0
}

/// Facts from this machine's `/proc`.
#[derive(Debug, Default)]
pub struct LiveProcs {
    /// How the shim is recognized.
    pub shim: ShimCheck,
}

impl ProcFacts for LiveProcs {
    fn start_time(&self, pid: u32) -> Option<u64> {
        crate::proc::start_time(pid)
    }
    fn parent(&self, pid: u32) -> Option<u32> {
        crate::proc::parent(pid)
    }
    fn session(&self, pid: u32) -> Option<u32> {
        crate::proc::session(pid)
    }
    fn groups(&self, pid: u32) -> Option<Vec<u32>> {
        crate::proc::groups(pid)
    }
    fn shim_mapped(&self, pid: u32) -> Option<bool> {
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
        Some(self.shim.in_maps(&maps))
    }
    fn is_mps_server(&self, pid: u32) -> Option<bool> {
        use std::os::unix::fs::MetadataExt;
        let comm = |p: u32| std::fs::read_to_string(format!("/proc/{p}/comm")).ok();
        let name = comm(pid)?;
        if name.trim_end_matches('\n') != MPS_SERVER_COMM {
            return Some(false);
        }
        // Without the right to read its `exe` (a daemon not run as root): cannot tell.
        let exe = format!("/proc/{pid}/exe");
        let path = std::fs::read_link(&exe).ok()?;
        let exe_uid = std::fs::metadata(&exe).ok()?.uid();
        let parent = crate::proc::parent(pid)?;
        let parent_name = comm(parent)?;
        let parent_uid = crate::proc::effective_uid(parent)?;
        Some(mps_server_shape(
            &name,
            path.file_name().and_then(|n| n.to_str()),
            exe_uid,
            &parent_name,
            parent_uid,
        ))
    }
    fn watch(&self, pid: u32, start: u64) -> Option<Box<dyn Liveness>> {
        crate::proc::Pidfd::open(pid, start).map(|p| Box::new(p) as Box<dyn Liveness>)
    }
    fn is_same_process(&self, pid: u32, start: u64) -> bool {
        match crate::proc::stat_checked(pid) {
            Ok(Some(s)) => !s.is_dead() && s.start == start,
            Ok(None) => false,
            Err(e) => {
                tracing::debug!("cannot read /proc/{pid}/stat ({e}): taken as alive");
                true
            }
        }
    }
}

/// One process, tracked across pid reuse: by a [`Liveness`] handle where the platform has one,
/// else by re-reading its start time.
pub struct Tracked {
    /// Its pid.
    pub pid: u32,
    /// Its start time (clock ticks since boot).
    pub start: u64,
    watch: Option<Box<dyn Liveness>>,
}

impl Tracked {
    /// Starts tracking `pid` (which had `start`).
    pub fn new(pid: u32, start: u64, facts: &dyn ProcFacts) -> Tracked {
        Tracked {
            pid,
            start,
            watch: facts.watch(pid, start),
        }
    }

    /// Whether the process still lives (and is the same process).
    pub fn alive(&self, facts: &dyn ProcFacts) -> bool {
        match &self.watch {
            Some(w) => !w.exited(),
            None => facts.is_same_process(self.pid, self.start),
        }
    }
}

impl std::fmt::Debug for Tracked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Tracked({} @ {}, watched: {})",
            self.pid,
            self.start,
            self.watch.is_some()
        )
    }
}

#[cfg(test)]
pub(crate) mod fake {
    //! Injected facts for unit tests: a process table and a settable clock.
    use super::*;
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex};

    /// One fake process.
    #[derive(Debug, Clone, Copy)]
    pub struct FakeProc {
        pub start: u64,
        pub parent: u32,
        pub shim: bool,
        /// Its session (None: not told; [`ProcFacts::session`] then says None).
        pub session: Option<u32>,
        /// An MPS server ([`ProcFacts::is_mps_server`]).
        pub mps_server: bool,
    }

    /// A shared, mutable fake process table; counts the `/proc`-like reads made through it.
    #[derive(Debug, Clone, Default)]
    pub struct FakeProcs(
        pub Arc<Mutex<BTreeMap<u32, FakeProc>>>,
        pub Arc<std::sync::atomic::AtomicU64>,
    );

    impl FakeProcs {
        pub fn spawn(&self, pid: u32, parent: u32, start: u64, shim: bool) {
            self.0.lock().unwrap().insert(
                pid,
                FakeProc {
                    start,
                    parent,
                    shim,
                    session: None,
                    mps_server: false,
                },
            );
        }
        /// Makes `pid` an MPS server.
        pub fn mark_mps_server(&self, pid: u32) {
            if let Some(p) = self.0.lock().unwrap().get_mut(&pid) {
                p.mps_server = true;
            }
        }
        /// Re-parents `pid` (its parent exited) and puts it in session `session`.
        pub fn reparent(&self, pid: u32, parent: u32, session: Option<u32>) {
            if let Some(p) = self.0.lock().unwrap().get_mut(&pid) {
                p.parent = parent;
                p.session = session;
            }
        }
        pub fn exit(&self, pid: u32) {
            self.0.lock().unwrap().remove(&pid);
        }
        /// Reads made so far (start time, parent, maps).
        pub fn reads(&self) -> u64 {
            self.1.load(std::sync::atomic::Ordering::Relaxed)
        }
        fn read(&self) {
            self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// A fake pidfd: exited once the table no longer holds that process.
    struct FakeWatch(FakeProcs, u32, u64);

    impl Liveness for FakeWatch {
        fn exited(&self) -> bool {
            self.0 .0.lock().unwrap().get(&self.1).map(|p| p.start) != Some(self.2)
        }
    }

    impl ProcFacts for FakeProcs {
        fn start_time(&self, pid: u32) -> Option<u64> {
            self.read();
            self.0.lock().unwrap().get(&pid).map(|p| p.start)
        }
        fn parent(&self, pid: u32) -> Option<u32> {
            self.read();
            self.0.lock().unwrap().get(&pid).map(|p| p.parent)
        }
        fn session(&self, pid: u32) -> Option<u32> {
            self.read();
            self.0.lock().unwrap().get(&pid).and_then(|p| p.session)
        }
        fn shim_mapped(&self, pid: u32) -> Option<bool> {
            self.read();
            self.0.lock().unwrap().get(&pid).map(|p| p.shim)
        }
        fn is_mps_server(&self, pid: u32) -> Option<bool> {
            self.read();
            self.0.lock().unwrap().get(&pid).map(|p| p.mps_server)
        }
        fn watch(&self, pid: u32, start: u64) -> Option<Box<dyn Liveness>> {
            Some(Box::new(FakeWatch(self.clone(), pid, start)))
        }
    }

    /// A clock tests move by hand.
    #[derive(Debug, Clone, Default)]
    pub struct FakeClock(pub Arc<Mutex<f64>>);

    impl FakeClock {
        pub fn advance(&self, s: f64) {
            *self.0.lock().unwrap() += s;
        }
    }

    impl Clock for FakeClock {
        fn now(&self) -> f64 {
            *self.0.lock().unwrap()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proc::FileId;

    /// Copies the program `from` (the first of the paths that exists) to `dir/name`.
    fn copy_as(from: &[&str], dir: &std::path::Path, name: &str) -> std::path::PathBuf {
        let src = from
            .iter()
            .find(|p| std::path::Path::new(p).exists())
            .expect("program");
        let exe = dir.join(name);
        std::fs::copy(src, &exe).unwrap();
        exe
    }

    /// Spawns `cmd`, retrying while another test thread's fork holds a fresh copy open for
    /// writing (ETXTBSY).
    fn spawn(cmd: &mut std::process::Command) -> std::process::Child {
        for _ in 0..100 {
            match cmd.spawn() {
                Ok(c) => return c,
                Err(e) if e.raw_os_error() == Some(26) => {
                    std::thread::sleep(std::time::Duration::from_millis(20))
                }
                Err(e) => panic!("{cmd:?}: {e}"),
            }
        }
        panic!("{cmd:?}: text file busy");
    }

    #[test]
    fn an_mps_servers_shape_is_its_name_roots_program_of_that_name_and_roots_daemon() {
        let (name, exe) = ("nvidia-cuda-mps\n", Some(MPS_SERVER_EXE));
        assert!(mps_server_shape(name, exe, 0, name, 0));
        assert!(
            !mps_server_shape("python3\n", exe, 0, name, 0),
            "another name"
        );
        assert!(
            !mps_server_shape(name, Some("python3"), 0, name, 0),
            "another program"
        );
        assert!(
            !mps_server_shape(name, None, 0, name, 0),
            "a program without a name"
        );
        assert!(
            !mps_server_shape(name, exe, 1000, name, 0),
            "a copy of the program, not root's"
        );
        assert!(
            !mps_server_shape(name, exe, 0, "bash\n", 0),
            "root's program, run by anyone"
        );
        assert!(
            !mps_server_shape(name, exe, 0, name, 1000),
            "started by a daemon of a user's own"
        );
    }

    #[test]
    fn an_mps_server_is_its_name_a_root_owned_program_of_that_name_and_roots_control_daemon() {
        use std::os::unix::fs::MetadataExt;
        let live = LiveProcs::default();
        assert_eq!(live.is_mps_server(std::process::id()), Some(false));
        // Beside the test binary, not in /tmp, which may be mounted noexec.
        let here = std::env::current_exe().unwrap();
        let dir = tempfile::tempdir_in(here.parent().unwrap()).unwrap();
        let server = copy_as(
            &["/bin/sleep", "/usr/bin/sleep"],
            dir.path(),
            MPS_SERVER_EXE,
        );
        let control = copy_as(
            &["/bin/sh", "/usr/bin/sh"],
            dir.path(),
            "nvidia-cuda-mps-control",
        );
        // Started by a "control daemon" (a shell under that name; its command name is the
        // file name's first 15 characters): the server's shape.
        let mut daemon = spawn(
            std::process::Command::new(&control)
                .arg("-c")
                .arg(format!("{} 30 & wait", server.display())),
        );
        // The same program started by anyone else, and another program of the same name.
        let mut orphan = spawn(std::process::Command::new(&server).arg("30"));
        let impostor = copy_as(
            &["/bin/sleep", "/usr/bin/sleep"],
            dir.path(),
            "nvidia-cuda-mps-fake",
        );
        let mut impostor = spawn(std::process::Command::new(&impostor).arg("30"));
        let children = format!("/proc/{0}/task/{0}/children", daemon.id());
        let mut child = None;
        for _ in 0..200 {
            let text = std::fs::read_to_string(&children).unwrap_or_default();
            child = text
                .split_whitespace()
                .next()
                .and_then(|p| p.parse::<u32>().ok());
            if child.is_some() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let child = child.expect("the daemon's child");
        // Its exec may lag its fork a moment.
        for _ in 0..500 {
            let exe = std::fs::read_link(format!("/proc/{child}/exe")).unwrap_or_default();
            if exe.file_name() == Some(std::ffi::OsStr::new(MPS_SERVER_EXE)) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        // Root's only where the tests run as root; elsewhere no server.
        let root = std::fs::metadata(&server).unwrap().uid() == 0;
        assert_eq!(live.is_mps_server(child), Some(root));
        assert_eq!(
            live.is_mps_server(orphan.id()),
            Some(false),
            "not the daemon's"
        );
        assert_eq!(
            live.is_mps_server(impostor.id()),
            Some(false),
            "not the program"
        );
        for c in [&mut daemon, &mut orphan, &mut impostor] {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::process::Command::new("kill")
            .arg(child.to_string())
            .status();
        assert_eq!(live.is_mps_server(u32::MAX), None, "no such process");
    }

    #[test]
    fn only_the_installed_shim_or_a_byte_identical_copy_counts() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("libsmore_shim.so");
        std::fs::write(&real, b"the real shim").unwrap();
        let copy = dir.path().join("copy-libsmore_shim.so");
        std::fs::copy(&real, &copy).unwrap();
        let fake = dir.path().join("libsmore_shim_fake.so");
        std::fs::write(&fake, b"something else").unwrap();
        let check = ShimCheck::with_reference(Some((FileId::of(&real).unwrap(), real.clone())));
        let line = |p: &std::path::Path| {
            let id = FileId::of(p).unwrap();
            format!(
                "7f00-7f01 r-xp 00000000 {:x}:{:x} {} {}\n",
                id.major,
                id.minor,
                id.inode,
                p.display()
            )
        };
        assert!(check.in_maps(&line(&real)));
        assert!(
            check.in_maps(&line(&copy)),
            "a byte-identical copy is the shim"
        );
        assert!(
            !check.in_maps(&line(&fake)),
            "a file named like the shim is not"
        );
        assert!(!check.in_maps("7f00-7f01 r-xp 00000000 00:00 0 [heap]\n"));
    }
}

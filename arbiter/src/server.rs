//! The daemon: the socket server, the NVML reconcile loop, persistence and the metrics endpoint.
//!
//! Threads: one acceptor; one thread per connection (a function holds its connection for its
//! whole life, so the count is bounded by the functions on the node); one reconcile thread that
//! samples NVML every `reconcile_ms`, folds the samples into the state and carries out watchdog
//! actions; one metrics thread; one thread reading the kernel's fork events (`lineage`, where
//! the process connector is available; it takes only the lineage's own lock, never the
//! state's). All share one `Mutex<State>`; no decision takes more than
//! microseconds under it, and NVML is sampled *outside* it.
//!
//! Must never: trust identity from a message (peers are `SO_PEERCRED`), let one malformed client
//! disturb another, or lose a grant on restart (state is persisted on every change).

use crate::config::{Config, PolicyKind, WatchdogAction};
use crate::gpus::{GpuSource, NvmlSource};
use crate::lifecycle::{self, StateDirLock};
use crate::metrics;
use crate::policy::{FitPolicy, Policy};
use crate::state::persist::{self, PersistFile};
use crate::state::{Peer, ShimUsage, State};
use anyhow::{bail, Context, Result};
use smore_protocol::conn::{peer_cred, recv_with_fd, send_with_fd, send_with_fds};
use smore_protocol::wire::{
    Envelope, ErrorCode, Reply, Request, WireError, MAX_REQUEST_FRAME, PROTOCOL_VERSION,
};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// The shared state.
pub type Shared = Arc<Mutex<State>>;

fn lock(s: &Shared) -> MutexGuard<'_, State> {
    // A panic while holding the lock leaves consistent-enough data (every transition writes
    // pages last); keep serving rather than take the node down.
    s.lock().unwrap_or_else(|e| e.into_inner())
}

fn persist_path(cfg: &Config) -> PathBuf {
    cfg.state_dir.join("instances.json")
}

/// Writes the persisted state atomically (temp file + rename) if it changed; on failure the
/// previous file stays and the state is marked dirty again (retried on the next change or round).
pub fn persist(state: &mut State) {
    if let Some(snap) = take_snapshot(state) {
        if let Err(e) = write_snapshot(&persist_path(&state.cfg), snap) {
            tracing::warn!("{e}");
            state.dirty = true;
        }
    }
}

/// The state to persist, if it changed, numbered so that an older snapshot never overwrites a
/// newer one. Taken under the state lock (a clone of the records: microseconds); written by
/// [`write_snapshot`] outside it, so a registration does not wait for another's file write.
struct Snapshot(u64, PersistFile, Arc<Mutex<u64>>);

fn take_snapshot(state: &mut State) -> Option<Snapshot> {
    if !state.dirty {
        return None;
    }
    state.dirty = false;
    state.persist_generation += 1;
    Some(Snapshot(
        state.persist_generation,
        state.persisted(),
        state.persist_written.clone(),
    ))
}

fn write_snapshot(path: &std::path::Path, snap: Snapshot) -> Result<(), persist::PersistError> {
    let mut written = snap.2.lock().unwrap_or_else(|e| e.into_inner());
    if snap.0 <= *written {
        // A newer snapshot is already on disk.
        return Ok(());
    }
    persist::save(path, &snap.1)?;
    *written = snap.0;
    Ok(())
}

/// Takes a snapshot under the lock, writes it after releasing the lock.
fn persist_unlocked(state: &Shared, mut st: MutexGuard<'_, State>) {
    let path = persist_path(&st.cfg);
    let snap = take_snapshot(&mut st);
    drop(st);
    if let Some(snap) = snap {
        if let Err(e) = write_snapshot(&path, snap) {
            tracing::warn!("{e}");
            lock(state).dirty = true;
        }
    }
}

fn load_persisted(cfg: &Config) -> Result<Option<PersistFile>> {
    Ok(persist::load(&persist_path(cfg))?)
}

/// Builds the policy named in the config.
pub fn make_policy(cfg: &Config) -> Result<Box<dyn Policy>> {
    match cfg.policy {
        PolicyKind::Fit => Ok(Box::new(FitPolicy)),
        PolicyKind::Smore => crate::smore_policy::from_config(cfg),
    }
}

/// Checks that the socket's directory exists, or that only that last directory is missing (the
/// arbiter creates it, like `/run/smore` under `/run`; systemd's `RuntimeDirectory=smore` creates
/// it already). A deeper missing path is a typo in the config, not something to create.
pub fn socket_parent_ok(socket: &Path) -> Result<()> {
    let Some(dir) = socket.parent().filter(|d| !d.as_os_str().is_empty()) else {
        return Ok(());
    };
    if dir.is_dir() {
        return Ok(());
    }
    match dir.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(up) if !up.is_dir() => bail!(
            "the socket's directory {} does not exist and neither does {}: create it (or fix `socket` in the config); the arbiter creates only the socket's own directory",
            dir.display(),
            up.display()
        ),
        _ if dir.exists() => bail!("{} is not a directory", dir.display()),
        _ => Ok(()),
    }
}

/// Binds the socket: refuses if another arbiter answers on it, removes a stale one.
fn bind(cfg: &Config) -> Result<UnixListener> {
    let path = &cfg.socket;
    socket_parent_ok(path)?;
    if let Some(dir) = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty() && !d.is_dir())
    {
        std::fs::create_dir(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    if path.exists() {
        if UnixStream::connect(path).is_ok() {
            bail!("another arbiter is already listening on {}", path.display());
        }
        std::fs::remove_file(path)
            .with_context(|| format!("removing stale socket {}", path.display()))?;
    }
    let l = UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
    if let Some(g) = cfg.socket_group {
        std::os::unix::fs::chown(path, None, Some(g.gid)).with_context(|| {
            format!(
                "giving {} to group {} (socket_group): the arbiter must run as root or be a \
                 member of that group",
                path.display(),
                g.gid
            )
        })?;
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(cfg.socket_mode))
        .with_context(|| format!("setting the mode of {}", path.display()))?;
    Ok(l)
}

/// Raises the open-file soft limit to the hard limit: the arbiter holds one connection per
/// function plus a pidfd per function process (`state::attribution`), so 1 000 functions need
/// ~3 000 descriptors, past the common soft default of 1 024.
fn raise_fd_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut l = getrlimit(Resource::Nofile);
    if l.current < l.maximum {
        l.current = l.maximum;
        if let Err(e) = setrlimit(Resource::Nofile, l) {
            tracing::warn!("cannot raise the open-file limit: {e}");
        }
    }
}

/// A running arbiter (the daemon's parts, startable in-process by tests).
pub struct Daemon {
    /// The node state, shared with the connection, reconcile and metrics threads.
    pub state: Shared,
    listener: UnixListener,
    source: Box<dyn GpuSource>,
    /// Held for the daemon's life: one arbiter per state directory.
    _lock: StateDirLock,
}

impl Daemon {
    /// Opens NVML, discovers GPUs, restores persisted grants and binds the socket.
    pub fn start(cfg: Config) -> Result<Daemon> {
        raise_fd_limit();
        let source = NvmlSource::open(&cfg.nvml_library)?;
        let gpus = source.discover()?;
        if let Some(want) = &cfg.gpu_indices {
            for i in want {
                if !gpus.iter().any(|g| g.index == *i) {
                    bail!(
                        "[gpus] indices names GPU {i}, but NVML reports only {} GPU(s)",
                        gpus.len()
                    );
                }
            }
        }
        if gpus.is_empty() {
            tracing::warn!("NVML reports no GPU: every registration will be refused");
        }
        cfg.check_against_gpus(&gpus.iter().map(|g| g.total).collect::<Vec<_>>())?;
        match crate::proc::pid_namespace(std::process::id()) {
            Some(ns) if ns != crate::proc::INIT_PID_NS => tracing::warn!(
                "the arbiter runs in a pid namespace of its own (inode {ns}): NVML reports host pids and functions outside this namespace connect with pid 0, so they cannot be attributed; run it in the host pid namespace (Kubernetes: hostPID: true; podman/docker: --pid=host)"
            ),
            _ => {}
        }
        std::fs::create_dir_all(&cfg.state_dir)
            .with_context(|| format!("creating state_dir {}", cfg.state_dir.display()))?;
        // Before reading or writing anything in it: a second arbiter on the same state would
        // hand out the same memory twice.
        let lock = StateDirLock::acquire(&cfg.state_dir)?;
        let persisted = load_persisted(&cfg)?;
        let policy = make_policy(&cfg)?;
        let mut state = State::new(cfg.clone(), gpus, policy);
        state.set_lineage(crate::lineage::Lineage::start());
        for g in &state.gpus {
            tracing::info!(
                "managing GPU {} {} ({}, {} MiB)",
                g.info.index,
                g.info.uuid,
                g.info.name,
                g.info.total >> 20
            );
        }
        if let Some(p) = persisted {
            state.restore(p);
            state.dirty = true;
            persist(&mut state);
        }
        let listener = bind(&cfg)?;
        tracing::info!(
            "arbiter listening on {} (policy {}, σ = {}, θ_train = {})",
            cfg.socket.display(),
            state.policy_name(),
            cfg.memory_safety,
            cfg.theta_train
        );
        Ok(Daemon {
            state: Arc::new(Mutex::new(state)),
            listener,
            source: Box::new(source),
            _lock: lock,
        })
    }

    /// Serves until SIGTERM/SIGINT (see [`lifecycle`]); `signals` were registered before
    /// [`Daemon::start`] bound the socket ([`lifecycle::register_signals`]); `base` is the
    /// configuration as read from the file, before command-line overrides (SIGHUP compares the
    /// re-read file against it).
    pub fn run_service(self, signals: signal_hook::iterator::Signals, base: Config) -> Result<()> {
        lifecycle::spawn_signal_thread(signals, self.state.clone(), base)?;
        self.run()
    }

    /// Serves forever (no signal handling: for in-process use; the CLI uses [`Daemon::run_service`]).
    pub fn run(self) -> Result<()> {
        let Daemon {
            state,
            listener,
            source,
            _lock,
        } = self;
        let cfg = lock(&state).cfg.clone();
        {
            let state = state.clone();
            std::thread::Builder::new()
                .name("smore-reconcile".into())
                .spawn(move || reconcile_loop(state, source))?;
        }
        if let Some(addr) = &cfg.metrics_addr {
            metrics::serve(addr, state.clone())?;
        }
        let conns = ConnCount::new(MAX_CONNECTIONS_PER_UID);
        let mut backoff = Backoff::default();
        lifecycle::notify_ready();
        for conn in listener.incoming() {
            match conn {
                Ok(stream) => {
                    backoff.reset();
                    let Some(slot) = conns.claim(&stream) else {
                        continue;
                    };
                    let state = state.clone();
                    let r = std::thread::Builder::new()
                        .name("smore-conn".into())
                        .stack_size(256 << 10)
                        .spawn(move || {
                            serve_conn(state, stream);
                            drop(slot);
                        });
                    if let Err(e) = r {
                        backoff.failed(&format!("cannot start a connection thread: {e}"));
                    }
                }
                Err(e) => backoff.failed(&format!("accept failed: {e}")),
            }
        }
        Ok(())
    }
}

/// Open connections a single uid may hold. Reasoning: a function holds one connection (two
/// when its runtime attaches), so 4 096 covers 2 000 functions of one user — beyond the
/// 1 000 the arbiter is benchmarked at — while one user cannot exhaust the arbiter's
/// descriptors and threads for everyone else.
pub const MAX_CONNECTIONS_PER_UID: usize = 4096;

/// Open connections per uid, up to a cap (a claim is returned when its connection closes).
#[derive(Clone)]
struct ConnCount(Arc<Mutex<std::collections::HashMap<u32, usize>>>, usize);

/// One claimed connection slot; released on drop.
struct ConnSlot(ConnCount, u32);

impl Drop for ConnSlot {
    fn drop(&mut self) {
        let mut m = self.0 .0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = m.get_mut(&self.1) {
            *n = n.saturating_sub(1);
        }
    }
}

impl ConnCount {
    fn new(cap: usize) -> ConnCount {
        ConnCount(Default::default(), cap)
    }

    /// A slot for the peer's uid, or None (the connection is answered and closed) past the cap.
    fn claim(&self, stream: &UnixStream) -> Option<ConnSlot> {
        let uid = peer_cred(stream).map(|c| c.uid).ok()?;
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let n = m.entry(uid).or_default();
        let cap = self.1;
        if *n >= cap {
            drop(m);
            let _ = send_with_fd(
                stream,
                &error(
                    ErrorCode::Forbidden,
                    format!("uid {uid} already holds {cap} connections to the arbiter; close some"),
                ),
                None,
            );
            return None;
        }
        *n += 1;
        Some(ConnSlot(self.clone(), uid))
    }
}

/// Back-off of the accept loop when accepting fails (out of descriptors: `EMFILE`): sleeps
/// 10 ms doubling to 1 s instead of spinning, and logs at most once per 5 s with a count.
#[derive(Default)]
struct Backoff {
    delay: Duration,
    last_log: Option<std::time::Instant>,
    suppressed: u64,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(10);
    const MAX: Duration = Duration::from_secs(1);
    const LOG_EVERY: Duration = Duration::from_secs(5);

    fn reset(&mut self) {
        self.delay = Duration::ZERO;
    }

    fn failed(&mut self, what: &str) {
        let now = std::time::Instant::now();
        if self
            .last_log
            .is_none_or(|t| now.duration_since(t) >= Self::LOG_EVERY)
        {
            tracing::warn!(
                "{what} ({} similar failures suppressed); backing off {:?}",
                self.suppressed,
                self.delay.max(Self::FIRST)
            );
            self.last_log = Some(now);
            self.suppressed = 0;
        } else {
            self.suppressed += 1;
        }
        self.delay = (self.delay * 2).clamp(Self::FIRST, Self::MAX);
        std::thread::sleep(self.delay);
    }
}

fn reconcile_loop(state: Shared, mut source: Box<dyn GpuSource>) {
    let period = Duration::from_millis(lock(&state).cfg.reconcile_ms);
    loop {
        let indices: Vec<u32> = lock(&state).gpus.iter().map(|g| g.info.index).collect();
        let mut samples = Vec::new();
        for i in indices {
            match source.sample(i) {
                Ok(s) => samples.push((i, s)),
                Err(e) => tracing::warn!("NVML sample of GPU {i} failed: {e:#}"),
            }
        }
        let actions = {
            let mut st = lock(&state);
            let a = st.reconcile(&samples);
            st.prewarm_tick();
            persist_unlocked(&state, st);
            a
        };
        for a in actions {
            let sig = match a.action {
                WatchdogAction::Log => None,
                WatchdogAction::Sigterm => Some(rustix::process::Signal::TERM),
                WatchdogAction::Sigkill => Some(rustix::process::Signal::KILL),
            };
            tracing::warn!("watchdog: {} ({:?})", a.reason, a.action);
            if sig.is_some() {
                tell_function(a.pid, &format!("{} — sending {:?}", a.reason, a.action));
            }
            if let (Some(sig), Some(pid)) = (sig, rustix::process::Pid::from_raw(a.pid as i32)) {
                if let Err(e) = rustix::process::kill_process(pid, sig) {
                    tracing::warn!("watchdog: cannot signal pid {}: {e}", a.pid);
                }
            }
        }
        std::thread::sleep(period);
    }
}

/// Says on the function process's own stderr why the watchdog signals it (issue 12, item 5): a
/// killed function otherwise dies with nothing in its log. Best effort and never blocking: a
/// stderr that is a socket, a closed descriptor or a full pipe just gets nothing.
fn tell_function(pid: u32, line: &str) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = format!("/proc/{pid}/fd/2");
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .append(true)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
        .open(path)
    {
        let _ = writeln!(f, "smore watchdog: {line}");
    }
}

fn error(code: ErrorCode, message: impl Into<String>) -> Reply {
    Reply::Error {
        code,
        message: message.into(),
    }
}

/// Serves one connection until it closes; releases its grant then.
pub fn serve_conn(state: Shared, stream: UnixStream) {
    let cred = match peer_cred(&stream) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!("no peer credentials on a connection: {e}");
            return;
        }
    };
    let peer = Peer {
        pid: cred.pid,
        uid: cred.uid,
    };
    let mut registered: Option<u64> = None;
    let mut attached: Option<u64> = None;
    loop {
        let env: Envelope = match recv_with_fd(&stream, MAX_REQUEST_FRAME) {
            Ok((e, _)) => e,
            Err(WireError::Closed) => break,
            Err(WireError::TooLarge { len, max }) => {
                // The stream cannot be re-synchronised after an oversized frame: answer and close.
                let _ = send_with_fd(
                    &stream,
                    &error(
                        ErrorCode::TooLarge,
                        format!("frame of {len} bytes exceeds {max}"),
                    ),
                    None,
                );
                break;
            }
            Err(WireError::Malformed(m)) => {
                tracing::debug!(pid = peer.pid, "malformed message: {m}");
                // The whole frame was consumed: the connection stays usable.
                if send_with_fd(&stream, &error(ErrorCode::Malformed, m), None).is_err() {
                    break;
                }
                continue;
            }
            Err(WireError::Io(_)) => break,
        };
        if env.v != PROTOCOL_VERSION {
            let _ = send_with_fd(
                &stream,
                &error(
                    ErrorCode::Version,
                    format!(
                        "protocol version {} (arbiter speaks {PROTOCOL_VERSION})",
                        env.v
                    ),
                ),
                None,
            );
            break;
        }
        let (reply, fd_page, board) = {
            let mut st = lock(&state);
            let (reply, page) = handle(&mut st, peer, &mut registered, &mut attached, env.req);
            let mut reply = reply;
            // A grant that says a turn board follows carries it after the page; a reply without
            // a page carries neither, and says so.
            let board = match &mut reply {
                Reply::Granted(g) if g.board && page.is_some() => st.board_of(g.gpu_index).cloned(),
                Reply::Granted(g) => {
                    g.board = false;
                    None
                }
                _ => None,
            };
            // Persisted before the reply announces the change (written outside the lock).
            persist_unlocked(&state, st);
            (reply, page, board)
        };
        let fds: Vec<_> = fd_page
            .iter()
            .map(|p| p.fd())
            .chain(board.iter().map(|b| b.fd()))
            .collect();
        let sent = send_with_fds(&stream, &reply, &fds);
        if sent.is_err() {
            break;
        }
    }
    if let Some(id) = registered {
        let mut st = lock(&state);
        st.disconnected(id);
        persist_unlocked(&state, st);
    }
}

type PageRef = Arc<crate::grantpage::PageHandle>;

/// The answer to a registration from a peer whose pid the kernel reports as 0: it lives in a pid
/// namespace the arbiter's does not contain, so neither its liveness nor its NVML entries could
/// be told apart from anyone else's.
pub const PEER_OUTSIDE_NAMESPACE: &str = "the arbiter cannot see this process's pid (SO_PEERCRED reports 0 for a peer outside the arbiter's pid namespace): run the arbiter in the host pid namespace (Kubernetes: hostPID: true; podman/docker: --pid=host)";

/// `Preempted` for a preempted instance (None: it is not).
fn preempted(st: &State, id: u64) -> Option<Reply> {
    st.preemption(id)
        .map(|(reason, message, grace_ms)| Reply::Preempted {
            reason,
            message,
            grace_ms,
        })
}

// The error side of `need` is the wire's `Reply`, answered as is: boxing it for one local helper
// would only move the allocation, not avoid it.
#[allow(clippy::result_large_err)]
fn handle(
    st: &mut State,
    peer: Peer,
    registered: &mut Option<u64>,
    attached: &mut Option<u64>,
    req: Request,
) -> (Reply, Option<PageRef>) {
    if peer.pid == 0 && matches!(req, Request::Register(_) | Request::Attach { .. }) {
        return (error(ErrorCode::Forbidden, PEER_OUTSIDE_NAMESPACE), None);
    }
    let current = registered.or(*attached);
    let need = |_: &Option<u64>| {
        current.ok_or_else(|| error(ErrorCode::NotRegistered, "register (or attach) first"))
    };
    match req {
        Request::Register(args) => {
            if registered.is_some() {
                return (
                    error(
                        ErrorCode::AlreadyRegistered,
                        "this connection already holds a grant",
                    ),
                    None,
                );
            }
            match st.register(peer, args) {
                Ok((grant, page)) => {
                    *registered = Some(grant.instance);
                    (Reply::Granted(grant), Some(page))
                }
                Err(r) => (
                    Reply::Refused {
                        code: r.code,
                        reason: r.reason,
                    },
                    None,
                ),
            }
        }
        Request::Attach { instance } => {
            if current.is_some() {
                return (
                    error(
                        ErrorCode::AlreadyRegistered,
                        "this connection already refers to an instance",
                    ),
                    None,
                );
            }
            match st.instances.get(&instance) {
                Some(_) if st.may_attach(peer, instance) => {
                    *attached = Some(instance);
                    tracing::debug!(instance, pid = peer.pid, "a report connection attached");
                    // With the page (and the turn board), so that a worker that only reports
                    // follows this arbiter's page after a restart (docs/shim.md, "Workers after
                    // an arbiter restart"); clients that do not want it drop the fds.
                    let page = st.page_of(instance);
                    (Reply::Granted(st.grant_of(instance)), page)
                }
                Some(_) => (
                    error(
                        ErrorCode::Forbidden,
                        format!("instance {instance} belongs to another process"),
                    ),
                    None,
                ),
                None => (
                    error(ErrorCode::NotRegistered, format!("no instance {instance}")),
                    None,
                ),
            }
        }
        Request::Report {
            latencies_ms,
            used_bytes,
            throttled_ns,
            refusals,
            gpu_ns,
            contention_ns,
            measured_contention_ns,
            deferred_ns,
            turn_waited_ns,
            turn_cut_ins,
            contention_ahead_ns,
            contention_shared,
            raw_shared,
        } => match need(registered) {
            Ok(id) => {
                if let Some(i) = st.instances.get(&id) {
                    metrics::observe_latencies(&i.rec.function, &latencies_ms);
                }
                // A shim's hold time is per process and goes through the usage ledger with its
                // other counters (summed over the instance's workers); a report without them
                // (an older reporter) sets it as it is.
                let held_alone = throttled_ns.filter(|_| gpu_ns.is_none());
                st.report(id, &latencies_ms, used_bytes, held_alone, refusals);
                if let (Some(gpu_ns), Some(contention_ns)) = (gpu_ns, contention_ns) {
                    st.report_usage(
                        id,
                        peer.pid,
                        ShimUsage {
                            gpu_ns,
                            contention_ns,
                            measured_contention_ns,
                            deferred_ns: deferred_ns.unwrap_or(0),
                            turn_waited_ns: turn_waited_ns.unwrap_or(0),
                            turn_cut_ins: turn_cut_ins.unwrap_or(0),
                            held_ns: throttled_ns.unwrap_or(0),
                            shared: contention_shared.unwrap_or(false),
                            raw_shared: raw_shared.unwrap_or(false),
                        },
                    );
                }
                if let Some(ahead) = contention_ahead_ns {
                    st.report_contention_ahead(id, ahead);
                }
                // A preempted instance learns it from its next report too (runtimes that only
                // report, and the C ABI's poll).
                (preempted(st, id).unwrap_or(Reply::Ok), None)
            }
            Err(e) => (e, None),
        },
        Request::Admit { waited_ms, .. } => match need(registered) {
            Ok(id) => {
                if let Some(r) = preempted(st, id) {
                    st.counters.preempted_requests += 1;
                    return (r, None);
                }
                let a = st.admit_request(id, waited_ms.unwrap_or(0.0));
                (
                    Reply::Admission {
                        admitted: a.admitted,
                        predicted_train: a.predicted_train,
                        predicted_fn: a.predicted_fn,
                        reason: a.reason,
                    },
                    None,
                )
            }
            Err(e) => (e, None),
        },
        Request::Hints => (Reply::Hints { hints: st.hints() }, None),
        Request::Status => (
            Reply::Status {
                snapshot: st.snapshot(),
            },
            None,
        ),
        Request::SetShare { instance, share } => {
            if let Err(why) = st.operator(peer) {
                return (error(ErrorCode::Forbidden, why), None);
            }
            let share = (share != 0).then_some(share);
            match st.set_share(instance, share) {
                Ok(_) => (Reply::Ok, None),
                Err(e) => (error(ErrorCode::Invalid, e.to_string()), None),
            }
        }
        Request::SetMemory { instance, bytes } => {
            if let Err(why) = st.operator(peer) {
                return (error(ErrorCode::Forbidden, why), None);
            }
            match st.set_memory(instance, bytes) {
                Ok(()) => (Reply::Ok, None),
                Err(e) => (error(ErrorCode::Invalid, e.to_string()), None),
            }
        }
        Request::Release => match registered.take() {
            Some(id) => {
                st.release_by_client(id);
                (Reply::Ok, None)
            }
            None => (error(ErrorCode::NotRegistered, "nothing to release"), None),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_past_the_per_uid_cap_are_answered_and_refused() {
        let count = ConnCount::new(8);
        let mut held = Vec::new();
        for _ in 0..8 {
            let (a, b) = UnixStream::pair().unwrap();
            held.push((count.claim(&a).expect("under the cap"), a, b));
        }
        let (a, b) = UnixStream::pair().unwrap();
        assert!(count.claim(&a).is_none());
        let (reply, _): (Reply, _) =
            smore_protocol::conn::recv_with_fd(&b, smore_protocol::wire::MAX_FRAME).unwrap();
        assert!(matches!(
            reply,
            Reply::Error {
                code: ErrorCode::Forbidden,
                ..
            }
        ));
        // A closed connection gives its slot back.
        held.pop();
        let (c, _d) = UnixStream::pair().unwrap();
        assert!(count.claim(&c).is_some());
    }

    #[test]
    fn a_peer_outside_the_pid_namespace_cannot_register_or_attach() {
        let gpus = vec![crate::gpus::GpuInfo {
            index: 0,
            uuid: "GPU-0".into(),
            name: "sim".into(),
            total: 8 << 30,
        }];
        let cfg = Config {
            prewarm_policy: "off".into(),
            ..Config::default()
        };
        let mut st = State::new(cfg, gpus, Box::new(FitPolicy));
        let hidden = Peer { pid: 0, uid: 0 };
        let (mut reg, mut att) = (None, None);
        let register = Request::Register(smore_protocol::wire::Register {
            function: "f".into(),
            memory: Some(1 << 30),
            ..Default::default()
        });
        for req in [register.clone(), Request::Attach { instance: 1 }] {
            let (reply, page) = handle(&mut st, hidden, &mut reg, &mut att, req);
            assert_eq!(reply, error(ErrorCode::Forbidden, PEER_OUTSIDE_NAMESPACE));
            assert!(page.is_none());
        }
        assert!(st.instances.is_empty());
        // Status still answers (an operator tool in a container may read it).
        let (reply, _) = handle(&mut st, hidden, &mut reg, &mut att, Request::Status);
        assert!(matches!(reply, Reply::Status { .. }));
        // The same request from a visible peer registers.
        let me = Peer {
            pid: std::process::id(),
            uid: 0,
        };
        let (reply, page) = handle(&mut st, me, &mut reg, &mut att, register);
        assert!(matches!(reply, Reply::Granted(_)), "{reply:?}");
        assert!(page.is_some());
    }

    #[test]
    fn a_failing_accept_backs_off_instead_of_spinning() {
        let mut b = Backoff::default();
        let t = std::time::Instant::now();
        for _ in 0..5 {
            b.failed("accept failed: too many open files");
        }
        // 10 + 20 + 40 + 80 + 160 ms.
        assert!(
            t.elapsed() >= Duration::from_millis(300),
            "{:?}",
            t.elapsed()
        );
        assert_eq!(b.suppressed, 4, "logged once, the rest counted");
        b.reset();
        assert_eq!(b.delay, Duration::ZERO);
    }
}

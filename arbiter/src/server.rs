//! The daemon: the socket server, the NVML reconcile loop, persistence and the metrics endpoint.
//!
//! Threads: one acceptor; one thread per connection (a function holds its connection for its
//! whole life, so the count is bounded by the functions on the node); one reconcile thread that
//! samples NVML every `reconcile_ms`, folds the samples into the state and carries out watchdog
//! actions; one metrics thread. All share one `Mutex<State>`; no decision takes more than
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
use smore_protocol::conn::{peer_cred, recv_with_fd, send_with_fd};
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
/// previous file stays and the state stays dirty (retried on the next change or round).
pub fn persist(state: &mut State) {
    if !state.dirty {
        return;
    }
    match persist::save(&persist_path(&state.cfg), &state.persisted()) {
        Ok(()) => state.dirty = false,
        Err(e) => tracing::warn!("{e}"),
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
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(cfg.socket_mode))
        .with_context(|| format!("setting the mode of {}", path.display()))?;
    Ok(l)
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
        std::fs::create_dir_all(&cfg.state_dir)
            .with_context(|| format!("creating state_dir {}", cfg.state_dir.display()))?;
        // Before reading or writing anything in it: a second arbiter on the same state would
        // hand out the same memory twice.
        let lock = StateDirLock::acquire(&cfg.state_dir)?;
        let persisted = load_persisted(&cfg)?;
        let policy = make_policy(&cfg)?;
        let mut state = State::new(cfg.clone(), gpus, policy);
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

    /// Serves until SIGTERM/SIGINT (see [`lifecycle`]); `base` is the configuration as read from
    /// the file, before command-line overrides (SIGHUP compares the re-read file against it).
    pub fn run_service(self, base: Config) -> Result<()> {
        lifecycle::spawn_signal_thread(self.state.clone(), base)?;
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
        lifecycle::notify_ready();
        for conn in listener.incoming() {
            match conn {
                Ok(stream) => {
                    let state = state.clone();
                    let r = std::thread::Builder::new()
                        .name("smore-conn".into())
                        .stack_size(256 << 10)
                        .spawn(move || serve_conn(state, stream));
                    if let Err(e) = r {
                        tracing::error!("cannot start a connection thread: {e}");
                    }
                }
                Err(e) => tracing::warn!("accept failed: {e}"),
            }
        }
        Ok(())
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
            persist(&mut st);
            a
        };
        for a in actions {
            let sig = match a.action {
                WatchdogAction::Log => None,
                WatchdogAction::Sigterm => Some(rustix::process::Signal::TERM),
                WatchdogAction::Sigkill => Some(rustix::process::Signal::KILL),
            };
            tracing::warn!("watchdog: {} ({:?})", a.reason, a.action);
            if let (Some(sig), Some(pid)) = (sig, rustix::process::Pid::from_raw(a.pid as i32)) {
                if let Err(e) = rustix::process::kill_process(pid, sig) {
                    tracing::warn!("watchdog: cannot signal pid {}: {e}", a.pid);
                }
            }
        }
        std::thread::sleep(period);
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
    let my_uid = rustix::process::getuid().as_raw();
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
        let operator = peer.uid == 0 || peer.uid == my_uid;
        let (reply, fd_page) = {
            let mut st = lock(&state);
            let r = handle(
                &mut st,
                peer,
                operator,
                &mut registered,
                &mut attached,
                env.req,
            );
            persist(&mut st);
            r
        };
        let sent = send_with_fd(&stream, &reply, fd_page.as_ref().map(|p| p.fd()));
        if sent.is_err() {
            break;
        }
    }
    if let Some(id) = registered {
        let mut st = lock(&state);
        st.disconnected(id);
        persist(&mut st);
    }
}

type PageRef = Arc<crate::grantpage::PageHandle>;

fn handle(
    st: &mut State,
    peer: Peer,
    operator: bool,
    registered: &mut Option<u64>,
    attached: &mut Option<u64>,
    req: Request,
) -> (Reply, Option<PageRef>) {
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
                Some(_) if st.may_bind(peer, instance) => {
                    *attached = Some(instance);
                    (Reply::Granted(st.grant_of(instance)), None)
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
        } => match need(registered) {
            Ok(id) => {
                if let Some(i) = st.instances.get(&id) {
                    metrics::observe_latencies(&i.rec.function, &latencies_ms);
                }
                st.report(id, &latencies_ms, used_bytes, throttled_ns, refusals);
                if let (Some(gpu_ns), Some(contention_ns)) = (gpu_ns, contention_ns) {
                    st.report_usage(
                        id,
                        peer.pid,
                        ShimUsage {
                            gpu_ns,
                            contention_ns,
                        },
                    );
                }
                (Reply::Ok, None)
            }
            Err(e) => (e, None),
        },
        Request::Admit { .. } => match need(registered) {
            Ok(id) => {
                let a = st.admit_request(id);
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
            if !operator {
                return (
                    error(
                        ErrorCode::Forbidden,
                        "only root or the arbiter's user may change shares",
                    ),
                    None,
                );
            }
            let share = (share != 0).then_some(share);
            match st.set_share(instance, share) {
                Ok(_) => (Reply::Ok, None),
                Err(e) => (error(ErrorCode::Invalid, e.to_string()), None),
            }
        }
        Request::SetMemory { instance, bytes } => {
            if !operator {
                return (
                    error(
                        ErrorCode::Forbidden,
                        "only root or the arbiter's user may change caps",
                    ),
                    None,
                );
            }
            match st.set_memory(instance, bytes) {
                Ok(()) => (Reply::Ok, None),
                Err(e) => (error(ErrorCode::Invalid, e.to_string()), None),
            }
        }
        Request::Release => match registered.take() {
            Some(id) => {
                st.release(id, "released by the client");
                (Reply::Ok, None)
            }
            None => (error(ErrorCode::NotRegistered, "nothing to release"), None),
        },
    }
}

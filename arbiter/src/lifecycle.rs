//! The daemon's lifecycle as a service: one arbiter per state directory, readiness, reload and
//! shutdown (docs/arbiter.md, "Running it as a service").
//!
//! Owns: the state-directory lock ([`StateDirLock`]: `flock` on `<state_dir>/arbiter.lock`), the
//! signal thread (SIGTERM/SIGINT: log, persist, remove the socket, exit 0; SIGHUP: reload the
//! live keys of the config file, log the ones that need a restart), systemd notifications
//! (`READY=1`, `RELOADING=1`, `STOPPING=1`; no-ops without `NOTIFY_SOCKET`), and `smore arbiter
//! --check` ([`check`]).
//!
//! Must never: let two arbiters serve one state directory (both would hand out the same memory),
//! run shutdown or reload work inside a signal handler (signal-hook's iterator only records the
//! signal; the work runs on the `smore-signals` thread), or exit without persisting.

use crate::config::Config;
use crate::server::{self, Shared};
use rustix::fs::{flock, FlockOperation};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Name of the lock file inside `state_dir`.
pub const LOCK_FILE: &str = "arbiter.lock";

/// Why the daemon's lifecycle could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum LifecycleError {
    /// Another arbiter holds the state directory.
    #[error(
        "another arbiter{holder} already uses the state directory {dir}: stop it first (systemctl stop smore-arbiter), or give this one its own state_dir"
    )]
    StateDirLocked {
        /// The state directory.
        dir: PathBuf,
        /// " (pid N)" when the lock file names its holder, else empty.
        holder: String,
    },
    /// The lock file could not be opened or locked.
    #[error("cannot lock {path}: {source}; check that the state directory is writable by the arbiter's user")]
    Lock {
        /// The lock file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The signal handlers could not be installed.
    #[error("cannot install the SIGTERM/SIGINT/SIGHUP handlers: {0}")]
    Signals(std::io::Error),
}

/// An exclusive `flock` on `<state_dir>/arbiter.lock`, held for the life of the daemon (the
/// kernel drops it when the process exits, however it exits: no stale lock after a crash).
#[derive(Debug)]
pub struct StateDirLock {
    _file: File,
    path: PathBuf,
}

impl StateDirLock {
    /// Takes the lock, or says which arbiter holds it. `dir` must exist.
    pub fn acquire(dir: &Path) -> Result<StateDirLock, LifecycleError> {
        let path = dir.join(LOCK_FILE);
        let lock_err = |source| LifecycleError::Lock {
            path: path.clone(),
            source,
        };
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(lock_err)?;
        match flock(&file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(e) if e == rustix::io::Errno::WOULDBLOCK => {
                let holder = std::fs::read_to_string(&path)
                    .ok()
                    .and_then(|s| s.trim().parse::<u32>().ok())
                    .map(|p| format!(" (pid {p})"))
                    .unwrap_or_default();
                return Err(LifecycleError::StateDirLocked {
                    dir: dir.to_path_buf(),
                    holder,
                });
            }
            Err(e) => return Err(lock_err(e.into())),
        }
        // The pid is for the message above only; the lock itself is the flock.
        let _ = file.set_len(0);
        let _ = writeln!(file, "{}", std::process::id());
        Ok(StateDirLock { _file: file, path })
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Tells systemd (when it started us with `Type=notify`) that the daemon serves.
pub fn notify_ready() {
    notify(&[sd_notify::NotifyState::Ready]);
}

fn notify(states: &[sd_notify::NotifyState]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!("sd_notify failed: {e}");
    }
}

/// The daemon's signals, caught from the moment this is called: register them before binding
/// the socket, so a SIGTERM that arrives as soon as clients can connect (a supervisor stopping a
/// daemon that just started) is a clean shutdown, not death by the default action. Until the
/// signal thread runs ([`spawn_signal_thread`]) they are only recorded.
pub fn register_signals() -> Result<signal_hook::iterator::Signals, LifecycleError> {
    signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP]).map_err(LifecycleError::Signals)
}

/// Starts the `smore-signals` thread over signals registered by [`register_signals`]:
/// SIGTERM/SIGINT shut the daemon down, SIGHUP reloads. `base` is the configuration as loaded at
/// start (before command-line overrides are compared).
pub fn spawn_signal_thread(
    mut signals: signal_hook::iterator::Signals,
    state: Shared,
    base: Config,
) -> Result<(), LifecycleError> {
    std::thread::Builder::new()
        .name("smore-signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                match sig {
                    SIGHUP => reload(&state, &base),
                    _ => shutdown(&state, if sig == SIGINT { "SIGINT" } else { "SIGTERM" }),
                }
            }
        })
        .map_err(LifecycleError::Signals)?;
    Ok(())
}

/// Stops serving: persists the state, removes the socket file and exits 0. Holding the state
/// lock to the end means no request changes the state after it was saved.
fn shutdown(state: &Shared, signal: &str) -> ! {
    notify(&[sd_notify::NotifyState::Stopping]);
    let mut st = state.lock().unwrap_or_else(|e| e.into_inner());
    tracing::info!(
        "received {signal}: shutting down ({} instance(s) persisted; they re-attach after a restart)",
        st.instances.len()
    );
    st.dirty = true;
    server::persist(&mut st);
    let socket = st.cfg.socket.clone();
    match std::fs::remove_file(&socket) {
        Ok(()) => tracing::info!("removed the socket {}", socket.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!("cannot remove the socket {}: {e}", socket.display()),
    }
    let code = if st.dirty {
        tracing::error!("the state could not be persisted (see above): exiting with status 1");
        1
    } else {
        0
    };
    std::process::exit(code)
}

/// Re-reads the config file and applies what can change live.
fn reload(state: &Shared, base: &Config) {
    let Some(path) = base.source.clone() else {
        tracing::info!("received SIGHUP: the arbiter runs on built-in defaults (no --config): nothing to reload");
        return;
    };
    let monotonic = sd_notify::NotifyState::monotonic_usec_now();
    match &monotonic {
        Ok(m) => notify(&[sd_notify::NotifyState::Reloading, m.clone()]),
        Err(_) => notify(&[sd_notify::NotifyState::Reloading]),
    }
    tracing::info!("received SIGHUP: reloading {}", path.display());
    match Config::load(&path) {
        Err(e) => tracing::error!("reload refused, the running configuration stays: {e}"),
        Ok(new) => {
            let mut st = state.lock().unwrap_or_else(|e| e.into_inner());
            match st.reload(base, &new, server::make_policy) {
                Err(e) => tracing::error!(
                    "reload refused, the running configuration stays: rebuilding the policy failed: {e:#}"
                ),
                Ok(out) => {
                    if out.applied.is_empty() {
                        tracing::info!("reload: no live setting changed");
                    }
                    for a in &out.applied {
                        tracing::info!("reload applied {a}");
                    }
                    for r in &out.need_restart {
                        tracing::warn!("reload: {r} needs a restart (systemctl restart smore-arbiter) to take effect");
                    }
                }
            }
        }
    }
    notify_ready();
}

/// `smore arbiter --check`: validates everything the daemon would need from the config without
/// touching the node (no socket bound, no directory created, no lock taken). Returns a summary.
pub fn check(cfg: &Config) -> anyhow::Result<String> {
    server::make_policy(cfg)?;
    server::socket_parent_ok(&cfg.socket)?;
    if cfg.state_dir.exists() && !cfg.state_dir.is_dir() {
        anyhow::bail!(
            "state_dir {} exists and is not a directory",
            cfg.state_dir.display()
        );
    }
    Ok(format!(
        "{}: configuration OK (socket {}, state_dir {}, policy {:?}, θ_train {})",
        cfg.source
            .as_ref()
            .map_or("built-in defaults".to_string(), |p| p.display().to_string()),
        cfg.socket.display(),
        cfg.state_dir.display(),
        cfg.policy,
        cfg.theta_train
    ))
}

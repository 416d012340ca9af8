//! Arbiter mode: where the live grant page comes from when an arbiter runs the node, and what
//! the shim needs to re-register after an arbiter restart.
//!
//! - `SMORE_GRANT_FD=<n>`: an inherited fd of the arbiter's sealed memfd (`smore run` passes it);
//!   mapped read-only. The registration is held by the connection `smore run` made
//!   (`SMORE_ARBITER_FD`, inherited); the shim only watches a duplicate of it for the hang-up.
//! - else `SMORE_ARBITER_SOCKET=<path>`: on the first CUDA call, connect, send
//!   `Register { function, model, slo_ms, memory }`, receive `Granted` with the page fd as
//!   `SCM_RIGHTS`, map it, and keep the connection open for the process lifetime (closing it is
//!   the release).
//! - `SMORE_BOARD_FD=<n>` (with `SMORE_GRANT_FD`), or the fd after the page in `Granted`: the
//!   GPU's turn board (`smore_protocol::board`), mapped read-write; the process then takes turns
//!   with the GPU's other functions (docs/shim.md, "Turns").
//!
//! Either way a [`Resume`] says how to re-register with `resume` after the arbiter restarts
//! (`watch` does it); [`reregister`] is that exchange.
//!
//! Owns the registration exchanges and their failure reasons. Must never: block the host longer
//! than [`ARBITER_TIMEOUT`], trust anything but the page the arbiter sent, send identity (the
//! arbiter reads it from `SO_PEERCRED`), or write on an inherited connection (other holders may
//! use it; re-registration always opens a new one).

use crate::config::{Config, FailurePolicy};
use crate::harvest::Usage;
use crate::limits::GrantPage;
use crate::sys::grant::{self, FileId};
use smore_protocol::board::{TurnBoard, ENV_BOARD_FD};
use smore_protocol::conn::Client;
use smore_protocol::wire::{
    parse_gpu_list, parse_known_as, Grant, Register, Reply, Request, ENV_CONN_FD, ENV_GPUS,
    ENV_GRANT_FD, ENV_KNOWN_AS, ENV_KNOWN_START, ENV_SOCKET,
};
use std::os::fd::{AsRawFd, IntoRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

/// Environment variable with the instance id `smore run` registered (set by `smore run`).
pub const ENV_INSTANCE: &str = "SMORE_INSTANCE";

/// Longest the first CUDA call waits for the arbiter's answer: 5 s (reasoning: admission is a
/// lookup plus a predictor call, milliseconds; a busy arbiter may queue a few hundred
/// registrations; beyond this the host must not hang — the failure policy applies).
pub const ARBITER_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the limits come from.
pub enum Source {
    /// No arbiter configured: the standalone environment contract.
    Standalone,
    /// The arbiter's live page, and the GPU's turn board when the grant came with one.
    Arbiter(&'static GrantPage, Option<&'static TurnBoard>),
    /// An arbiter was configured but could not be used (the reason, for one log line).
    Unavailable(String),
}

/// What the registration sends, from the environment (`SMORE_FUNCTION`, `SMORE_MODEL`,
/// `SMORE_SLO_MS`) and the parsed memory limit.
pub fn register_request(get: &impl Fn(&str) -> Option<String>, config: &Config) -> Request {
    let function = get("SMORE_FUNCTION")
        .filter(|f| !f.is_empty())
        .or_else(|| {
            std::env::current_exe()
                .ok()?
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| "unknown".into());
    let memory = config.mem_cap[0];
    Request::Register(Register {
        function,
        model: get("SMORE_MODEL").filter(|m| !m.is_empty()),
        slo_ms: get("SMORE_SLO_MS").and_then(|s| s.trim().parse::<f64>().ok()),
        memory: (memory != u64::MAX).then_some(memory),
        resume: None,
        gpu: None,
        // Not exec'd by `smore run`: the arbiter writes the grant to the slot of the GPU's NVML
        // index (the shim indexes slots by CUDA ordinal: equal unless CUDA_VISIBLE_DEVICES or
        // CUDA_DEVICE_ORDER reorder devices; see docs/shim.md) — or, in a container given some
        // GPUs (SMORE_GPUS, from the CDI spec), of its position among them.
        exec: false,
        gpus: get(ENV_GPUS).and_then(|v| {
            let list = parse_gpu_list(&v);
            if list.is_none() {
                crate::log::line(
                    crate::config::Level::Warn,
                    format_args!("{ENV_GPUS}={v:?} is not a comma-separated list of GPU indices: ignored (any GPU)"),
                );
            }
            list
        }),
    })
}

/// How to re-register after the arbiter restarts: the connection whose hang-up says the arbiter
/// is gone, where to reconnect, and which instance to resume.
#[derive(Debug)]
pub struct Resume {
    /// An fd this process owns for the life of the watcher (socket mode: the registration's own
    /// connection; `smore run` mode: a close-on-exec duplicate of `SMORE_ARBITER_FD`). Only
    /// polled for the hang-up, never read or written. Raw on purpose: dropping it must never
    /// close a live registration.
    pub conn: RawFd,
    /// `SMORE_ARBITER_SOCKET`.
    pub socket: PathBuf,
    /// The instance id the arbiter granted (what `resume` names).
    pub instance: u64,
    /// NVML index of the GPU, when known (socket mode: from the grant; `smore run` mode: looked
    /// up at re-registration from the arbiter's GPU list and `CUDA_VISIBLE_DEVICES`).
    pub gpu: Option<u32>,
    /// The grant came from `smore run` (page slot 0, device pinned by `CUDA_VISIBLE_DEVICES`).
    /// The registration then belongs to the process `smore run` exec'd, not necessarily to this
    /// one: the watcher checks the instance's pid before re-registering.
    pub exec: bool,
    /// Page slot of the grant (0 under `smore run`, else the GPU's NVML index).
    pub slot: usize,
    /// The registration to send again (with `resume`, `gpu`, `exec` filled in at the time).
    pub request: Request,
    /// The arbiter's failure policy from the last grant (socket mode), which overrides the
    /// process's `SMORE_FAILURE`; `None` under `smore run` (it exports the arbiter's policy as
    /// `SMORE_FAILURE`) or from an older arbiter.
    pub policy: Option<FailurePolicy>,
}

/// The shim's spelling of the arbiter's failure policy.
pub fn policy_of(p: smore_protocol::wire::FailurePolicy) -> FailurePolicy {
    match p {
        smore_protocol::wire::FailurePolicy::FailOpen => FailurePolicy::Open,
        smore_protocol::wire::FailurePolicy::FailClosed => FailurePolicy::Closed,
    }
}

/// Resolves the limits source from the environment, how to resume the grant after an arbiter
/// restart when the environment allows it, and which file an inherited grant page is (what a
/// process that only reports compares the pages it is handed with).
pub fn source(
    get: impl Fn(&str) -> Option<String>,
    config: &Config,
) -> (Source, Option<Resume>, Option<FileId>) {
    if let Some(v) = get(ENV_GRANT_FD) {
        let Ok(fd) = v.trim().parse::<RawFd>() else {
            return (
                Source::Unavailable(format!(
                    "{ENV_GRANT_FD}={v:?} is not a file descriptor number"
                )),
                None,
                None,
            );
        };
        let map = |fd: RawFd| grant::map_fd(fd).map(|p| (p, grant::file_id(fd)));
        return match map_inherited(&get, ENV_GRANT_FD, fd, ("smore-grant", false), map) {
            Ok(((p, id), Found::Own)) => (
                Source::Arbiter(p, inherited_board(&get)),
                inherited_resume(&get, config),
                id,
            ),
            // Without its fds: no registration's connection to watch (`report_only`).
            Ok(((p, id), Found::Holder)) => (Source::Arbiter(p, inherited_board(&get)), None, id),
            Err(e) => (
                Source::Unavailable(format!("{ENV_GRANT_FD}: {e}")),
                None,
                None,
            ),
        };
    }
    let Some(path) = get(ENV_SOCKET).filter(|p| !p.is_empty()) else {
        return (Source::Standalone, None, None);
    };
    match register(&path, register_request(&get, config)) {
        Ok((page, board, resume)) => (Source::Arbiter(page, board), Some(resume), None),
        Err(e) => (
            Source::Unavailable(format!("arbiter at {path}: {e}")),
            None,
            None,
        ),
    }
}

/// Maps with `map` what `smore run` handed down as fd `fd` (named by `var`); when this process
/// does not hold it — a worker started with `close_fds`, as Python's `subprocess` and
/// multiprocessing's `spawn` start theirs, keeps the environment but not the fds — the same file
/// from the process `smore run` exec'd ([`ENV_KNOWN_AS`]), which does (docs/shim.md, "Workers
/// started with close_fds"). Else the first error, with why the second way failed.
///
/// The holder must be this process's ancestor (a living ancestor's pid is not reused) or have
/// the start time `smore run` gave ([`ENV_KNOWN_START`]: a worker whose launcher exited is no
/// longer its descendant), checked again once the file is open; and the file there a memfd named
/// `memfd` ([`crate::sys::os::reopen_from`]); `write` opens it read-write.
pub fn map_inherited<T>(
    get: &impl Fn(&str) -> Option<String>,
    var: &str,
    fd: RawFd,
    (memfd, write): (&str, bool),
    map: impl Fn(RawFd) -> Result<T, String>,
) -> Result<(T, Found), String> {
    let first = match map(fd) {
        Ok(t) => return Ok((t, Found::Own)),
        Err(e) => e,
    };
    // The process `smore run` exec'd: the variable's first field, when it is not this one.
    let Some(holder) = get(ENV_KNOWN_AS)
        .and_then(|v| parse_known_as(&v))
        .map(|(own, _)| own)
        .filter(|&own| own != crate::sys::os::pid())
    else {
        return Err(first);
    };
    // The holder's pid and ancestry are read in `/proc`: only where it names processes by the
    // pids they know themselves by (else `/proc/<holder>` is some other process).
    if !crate::sys::os::proc_is_ours() {
        return Err(format!(
            "{first}; /proc is another pid namespace's, so the process `smore run` started cannot be looked for there"
        ));
    }
    let started = get(ENV_KNOWN_START).and_then(|v| v.trim().parse::<u64>().ok());
    let same =
        || started.is_some_and(|t| crate::sys::os::start_ticks(holder).ok().flatten() == Some(t));
    if !crate::sys::os::is_ancestor(holder) && !same() {
        return Err(format!(
            "{first}; process {holder}, which `smore run` started, is neither an ancestor of this one nor alive with its start time"
        ));
    }
    let again = crate::sys::os::reopen_from(holder, fd, memfd, write)
        .and_then(|f| {
            // Still that process, now that its file is open (its pid may have gone to another).
            if crate::sys::os::is_ancestor(holder) || same() {
                Ok(f)
            } else {
                Err(
                    "it exited while its file was opened (or /proc could not say it lives)"
                        .to_string(),
                )
            }
        })
        .and_then(|f| map(f.as_raw_fd()))
        .map_err(|e| format!("{first}; from process {holder}, which `smore run` started: {e}"))?;
    crate::log::line(
        crate::config::Level::Info,
        format_args!(
            "{var}: fd {fd} is not this process's ({first}: started with close_fds?); opened it from process {holder}, which `smore run` started"
        ),
    );
    Ok((again, Found::Holder))
}

/// Where [`map_inherited`] found what `smore run` handed down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// At the fd the variable names, in this process.
    Own,
    /// At that fd of the process `smore run` exec'd: this process did not inherit its fds, so
    /// the registration's connection the environment names is not this process's either (the
    /// number may be any socket of its own now).
    Holder,
}

/// Where a process that holds an inherited grant but not its registration's connection
/// (`SMORE_ARBITER_FD` closed: started with `close_fds`) reports its usage: the arbiter's
/// socket and the instance, when both are named and the grant was inherited. Such a process
/// only reports, as a fork child does: the registration and its resumption are the process
/// `smore run` exec'd.
pub fn report_only(get: impl Fn(&str) -> Option<String>) -> Option<(PathBuf, u64)> {
    get(ENV_GRANT_FD)?;
    let instance = get(ENV_INSTANCE).and_then(|v| v.trim().parse::<u64>().ok())?;
    let socket = get(ENV_SOCKET).filter(|p| !p.is_empty())?;
    Some((socket.into(), instance))
}

/// The turn board `smore run` handed down with the grant page (`SMORE_BOARD_FD`), if any; one
/// that cannot be mapped is reported and the process runs without turns.
fn inherited_board(get: &impl Fn(&str) -> Option<String>) -> Option<&'static TurnBoard> {
    let v = get(ENV_BOARD_FD)?;
    let board = v
        .trim()
        .parse::<RawFd>()
        .map_err(|_| format!("{v:?} is not a file descriptor number"))
        .and_then(|fd| {
            map_inherited(
                get,
                ENV_BOARD_FD,
                fd,
                ("smore-turns", true),
                grant::map_board_fd,
            )
        })
        .map(|(board, _)| board);
    board
        .map_err(|e| {
            crate::log::line(
                crate::config::Level::Warn,
                format_args!("{ENV_BOARD_FD}: {e}; this process runs without turns"),
            )
        })
        .ok()
}

/// The turn board that came with a grant (the fd after the page, when the grant says one
/// follows); one that cannot be mapped is reported and the process runs without turns.
fn board_of(g: &Grant, fd: Option<std::os::fd::OwnedFd>) -> Option<&'static TurnBoard> {
    if !g.board {
        return None;
    }
    let mapped = fd
        .ok_or_else(|| "the grant says a turn board follows, but none came".to_string())
        .and_then(|fd| grant::map_board_fd(fd.as_raw_fd()));
    mapped
        .map_err(|e| {
            crate::log::line(
                crate::config::Level::Warn,
                format_args!("turn board: {e}; this process runs without turns"),
            )
        })
        .ok()
}

/// The [`Resume`] of a grant inherited from `smore run`: needs `SMORE_ARBITER_FD` (an open
/// socket), `SMORE_INSTANCE` and `SMORE_ARBITER_SOCKET`. Without them the process keeps its grant
/// page but cannot re-register (reported at info level: a hand-made `SMORE_GRANT_FD` is legal).
fn inherited_resume(get: &impl Fn(&str) -> Option<String>, config: &Config) -> Option<Resume> {
    let why_not = |why: String| {
        crate::log::line(
            crate::config::Level::Info,
            format_args!("no re-registration after an arbiter restart: {why}"),
        );
        None
    };
    // `smore run` says which pid the arbiter knows the process it exec'd by; a descendant that
    // inherited the variable has another pid of its own and ignores it.
    if let Some((own, theirs)) = get(ENV_KNOWN_AS).and_then(|v| parse_known_as(&v)) {
        if own == crate::sys::os::pid() {
            crate::sys::os::set_known_as(theirs);
        }
    }
    let Some(instance) = get(ENV_INSTANCE).and_then(|v| v.trim().parse::<u64>().ok()) else {
        return why_not(format!("{ENV_INSTANCE} is not set to an instance id"));
    };
    let Some(socket) = get(ENV_SOCKET).filter(|p| !p.is_empty()) else {
        return why_not(format!("{ENV_SOCKET} is not set"));
    };
    let Some(fd) = get(ENV_CONN_FD).and_then(|v| v.trim().parse::<RawFd>().ok()) else {
        return why_not(format!("{ENV_CONN_FD} is not set to a file descriptor"));
    };
    let conn = match crate::sys::os::dup_socket(fd) {
        Ok(c) => c,
        Err(e) => return why_not(format!("{ENV_CONN_FD}: {e}")),
    };
    Some(Resume {
        conn,
        socket: socket.into(),
        instance,
        gpu: None,
        exec: true,
        slot: 0,
        request: register_request(get, config),
        policy: None,
    })
}

fn connect(path: &std::path::Path) -> Result<UnixStream, String> {
    connect_io(path).map_err(|e| match e {
        Connect::Socket(e) => smore_protocol::conn::unreachable_reason(path, &e),
        Connect::Options(e) => format!("socket options: {e}"),
    })
}

/// Why [`connect_io`] failed: the connection itself, or the options set on it.
enum Connect {
    Socket(std::io::Error),
    Options(std::io::Error),
}

fn connect_io(path: &std::path::Path) -> Result<UnixStream, Connect> {
    let stream = UnixStream::connect(path).map_err(Connect::Socket)?;
    stream
        .set_read_timeout(Some(ARBITER_TIMEOUT))
        .and_then(|_| stream.set_write_timeout(Some(ARBITER_TIMEOUT)))
        .map_err(Connect::Options)?;
    Ok(stream)
}

type Registered = (&'static GrantPage, Option<&'static TurnBoard>, Resume);

fn register(path: &str, req: Request) -> Result<Registered, String> {
    let client = Client::from_stream(connect(path.as_ref())?);
    let (reply, fds) = client
        .call_with_fds(req.clone())
        .map_err(|e| format!("registration failed: {e}"))?;
    let mut fds = fds.into_iter();
    match reply {
        Reply::Granted(g) => {
            let fd = fds
                .next()
                .ok_or("the Granted reply carried no grant page fd")?;
            let page = grant::map_fd(fd.as_raw_fd())?;
            // The mappings keep the memfds alive; the fds themselves can go.
            drop(fd);
            let board = board_of(&g, fds.next());
            if let Some(p) = g.pid {
                crate::sys::os::set_known_as(p);
            }
            // Held for the process lifetime: its raw fd goes to the watcher and is never closed
            // while it lives (closing it releases the grant). Close-on-exec, so exec'd programs
            // do not hold the grant.
            let conn = client.into_stream().into_raw_fd();
            crate::log::line(
                crate::config::Level::Info,
                format_args!(
                    "arbiter mode: instance {} on GPU {} ({}), cap {} B, share {} %",
                    g.instance, g.gpu_index, g.gpu_uuid, g.memory_cap, g.sm_share
                ),
            );
            let resume = Resume {
                conn,
                socket: path.into(),
                instance: g.instance,
                gpu: Some(g.gpu_index),
                exec: false,
                slot: match &req {
                    Request::Register(r) => r.slot_for(g.gpu_index),
                    _ => (g.gpu_index as usize).min(crate::limits::MAX_DEVICES - 1),
                },
                request: req,
                policy: g.failure_policy.map(policy_of),
            };
            Ok((page, board, resume))
        }
        Reply::Refused { code, reason } => {
            Err(format!("registration refused ({code:?}): {reason}"))
        }
        Reply::Error { code, message } => Err(format!("arbiter error ({code:?}): {message}")),
        other => Err(format!("unexpected reply {other:?}")),
    }
}

/// What one re-registration attempt came to.
pub enum Rejoin {
    /// Granted: the new connection (held for the process lifetime), its page, the grant.
    Granted {
        /// The new registration's connection (closing it releases the grant).
        conn: RawFd,
        /// The new grant page, mapped read-only.
        page: &'static GrantPage,
        /// The GPU's turn board that came with it, if any.
        board: Option<&'static TurnBoard>,
        /// What the arbiter granted.
        grant: Grant,
    },
    /// Not this process's to resume (the reason, for one log line): stop trying.
    NotOurs(String),
    /// The arbiter answered but did not grant (refused, or an error reply): try again later.
    Refused(String),
    /// The arbiter could not be reached or the exchange broke off: retry soon.
    Unreachable(String),
}

/// The instance as the arbiter's status snapshot shows it.
#[derive(Debug, PartialEq)]
pub struct Listed {
    /// The process the instance was registered for.
    pub pid: u32,
    /// Whether the arbiter holds a live connection for it (a detached one awaits resumption).
    pub attached: bool,
    /// NVML index of the GPU this process runs on: the GPU whose UUID `CUDA_VISIBLE_DEVICES`
    /// names (what `smore run` set), else the GPU the arbiter lists the instance under.
    pub gpu: u32,
}

/// Finds `instance` in a status snapshot (`{"gpus": [{"index", "uuid", "functions": [{"id",
/// "pid", "attached"}]}]}`, see docs/cli.md). `None`: not listed.
pub fn find_listed(
    snapshot: &serde_json::Value,
    instance: u64,
    visible: Option<&str>,
) -> Option<Listed> {
    let gpus = snapshot["gpus"].as_array()?;
    let by_uuid = visible.and_then(|v| {
        gpus.iter()
            .find(|g| g["uuid"].as_str() == Some(v.trim()))
            .and_then(|g| g["index"].as_u64())
    });
    gpus.iter().find_map(|g| {
        let f = g["functions"]
            .as_array()?
            .iter()
            .find(|f| f["id"].as_u64() == Some(instance))?;
        Some(Listed {
            pid: f["pid"].as_u64()? as u32,
            attached: f["attached"].as_bool().unwrap_or(true),
            gpu: by_uuid.or_else(|| g["index"].as_u64())? as u32,
        })
    })
}

/// One re-registration attempt after the arbiter connection was lost: connect anew, and send
/// `Register { resume: instance, gpu, exec }`. Under `smore run` (`exec`) the instance may belong
/// to another process of the tree (the one `smore run` exec'd): the arbiter's status is read
/// first, and only the instance's own process, while the instance is detached, re-registers —
/// a descendant would otherwise be granted a second instance (counted twice). `last_cap` is the
/// cap of the last grant (asked for again should the arbiter not know the instance any more).
pub fn reregister(r: &Resume, last_cap: u64, visible: Option<&str>) -> Rejoin {
    let client = match connect(&r.socket) {
        Ok(s) => Client::from_stream(s),
        Err(e) => return Rejoin::Unreachable(e),
    };
    let mut gpu = r.gpu;
    if r.exec {
        let snapshot = match client.call(Request::Status) {
            Ok(Reply::Status { snapshot }) => snapshot,
            Ok(other) => return Rejoin::Refused(format!("status request answered {other:?}")),
            Err(e) => return Rejoin::Unreachable(format!("status request failed: {e}")),
        };
        // The arbiter lists processes by the pid it sees (the host pid, in a container).
        let me = crate::sys::os::known_as();
        match find_listed(&snapshot, r.instance, visible) {
            None => {
                return Rejoin::NotOurs(format!(
                    "the arbiter does not list instance {} (it found the process gone or lost its state); not registering afresh, which could count the process twice",
                    r.instance
                ))
            }
            Some(l) if l.pid != me => {
                return Rejoin::NotOurs(format!(
                    "instance {} belongs to pid {} (this is pid {me}): that process re-registers",
                    r.instance, l.pid
                ))
            }
            Some(l) if l.attached => {
                return Rejoin::NotOurs(format!(
                    "instance {} is attached already",
                    r.instance
                ))
            }
            Some(l) => gpu = Some(l.gpu),
        }
    }
    let mut req = r.request.clone();
    if let Request::Register(Register {
        resume,
        gpu: g,
        exec,
        memory,
        ..
    }) = &mut req
    {
        *resume = Some(r.instance);
        *g = gpu;
        *exec = r.exec;
        if last_cap != u64::MAX && last_cap != 0 {
            *memory = Some(last_cap);
        }
    }
    match client.call_with_fds(req).map(|(r, fds)| {
        let mut fds = fds.into_iter();
        (r, fds.next(), fds.next())
    }) {
        Ok((Reply::Granted(grant), Some(fd), board)) => match grant::map_fd(fd.as_raw_fd()) {
            Ok(page) => Rejoin::Granted {
                conn: client.into_stream().into_raw_fd(),
                page,
                board: board_of(&grant, board),
                grant,
            },
            // The connection closes here: the arbiter releases what it just granted.
            Err(e) => Rejoin::Refused(format!("the new grant page is unusable: {e}")),
        },
        Ok((Reply::Granted(_), None, _)) => {
            Rejoin::Refused("the Granted reply carried no grant page fd".into())
        }
        Ok((Reply::Refused { code, reason }, _, _)) => {
            Rejoin::Refused(format!("re-registration refused ({code:?}): {reason}"))
        }
        Ok((Reply::Error { code, message }, _, _)) => {
            Rejoin::Refused(format!("arbiter error ({code:?}): {message}"))
        }
        Ok((other, _, _)) => Rejoin::Refused(format!("unexpected reply {other:?}")),
        Err(e) => Rejoin::Unreachable(format!("re-registration failed: {e}")),
    }
}

/// How long unchanged usage goes unreported at most: 10 s. Reasoning: an idle process of a
/// function — a context held, nothing launched — is known to the arbiter by its reports (which
/// gate it shares: docs/shim.md, "One share per grant"), and a restarted arbiter knows only what
/// it was told since; one report per 10 s per idle process costs the arbiter nothing, and a
/// connection an arbiter restart broke is found and replaced at the latest then.
pub const REPORT_REFRESH: std::time::Duration = std::time::Duration::from_secs(10);

/// The shim's usage reports to the arbiter (docs/harvest.md): cumulative estimated GPU and
/// collision time on the granted device, sent over a connection of the reporter's own, attached to
/// the instance — never over the registration connection, which other processes of the function
/// may share (a forked worker holds the same socket).
#[derive(Default)]
pub struct Reporter {
    conn: Option<Client>,
    last: Option<Usage>,
    /// When a report was last sent (None: never).
    sent_at: Option<std::time::Instant>,
    /// The arbiter's preemption was already said on stderr.
    told_preempted: bool,
    /// Whether this reporter follows the page an attach hands it (a process that only
    /// reports: it has no registration of its own to get a new page by), and which page the
    /// process holds now (None: not known, the first page handed is taken).
    follow: Option<Option<FileId>>,
    /// What the last attach handed that this process does not hold yet (taken by
    /// [`Reporter::take_attached`]).
    attached: Option<Attached>,
}

/// What an attach handed a following reporter: the grant as the arbiter announces it, and its
/// page (and turn board) when the page is not the one the process holds.
pub struct Attached {
    /// The grant (its failure policy is the node's).
    pub grant: Grant,
    /// What the attach said of the page the process holds.
    pub page: PageNews,
    /// The GPU's turn board that came with a new page.
    pub board: Option<&'static TurnBoard>,
}

/// What an attach said of the page a following process holds.
#[derive(Clone, Copy)]
pub enum PageNews {
    /// The instance's page is the file the process holds.
    Same,
    /// The instance's page is another file (a restarted arbiter's), mapped.
    New(&'static GrantPage),
    /// Nothing usable came (no fd — an arbiter from before 2026-11-29 —, or one that could not
    /// be identified or mapped): whether the page held is still the instance's is not known.
    Unknown,
}

/// Why a report was not sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReportError {
    /// The arbiter's socket is absent or refuses connections: no arbiter runs (it is down or
    /// restarting). The next report connects again.
    Down(String),
    /// The arbiter could not be reached otherwise, or the connection to it failed (a timeout, a
    /// local failure such as running out of fds): the next report connects again.
    Unreachable(String),
    /// The arbiter answered, but not with what a report needs (the instance is unknown to it or
    /// another's, or the report was refused).
    Refused(String),
}

impl std::fmt::Display for ReportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReportError::Down(why) | ReportError::Unreachable(why) | ReportError::Refused(why) => {
                f.write_str(why)
            }
        }
    }
}

impl Reporter {
    /// A reporter that follows the instance's page (see [`Reporter::take_attached`]); `page`:
    /// the file of the page this process holds, when known.
    pub fn following(page: Option<FileId>) -> Reporter {
        Reporter {
            follow: Some(page),
            ..Reporter::default()
        }
    }

    /// The connection's fd, while attached (to be polled for the arbiter's hang-up).
    pub fn conn_fd(&self) -> Option<RawFd> {
        self.conn.as_ref().map(|c| c.stream().as_raw_fd())
    }

    /// Drops the connection (its peer hung up): the next report connects and attaches again.
    pub fn disconnect(&mut self) {
        self.conn = None;
    }

    /// What the last attach handed, once (following reporters only).
    pub fn take_attached(&mut self) -> Option<Attached> {
        self.attached.take()
    }

    /// Connects and attaches to `instance`; a following reporter keeps what the attach handed.
    fn attach(&mut self, socket: &std::path::Path, instance: u64) -> Result<(), ReportError> {
        let c = Client::from_stream(connect_io(socket).map_err(|e| match e {
            // No socket, or nobody listening on it: no arbiter runs.
            Connect::Socket(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
                ) =>
            {
                ReportError::Down(smore_protocol::conn::unreachable_reason(socket, &e))
            }
            Connect::Socket(e) => {
                ReportError::Unreachable(smore_protocol::conn::unreachable_reason(socket, &e))
            }
            Connect::Options(e) => ReportError::Unreachable(format!("socket options: {e}")),
        })?);
        let (grant, fds) = match c.call_with_fds(Request::Attach { instance }) {
            Ok((Reply::Granted(g), fds)) => (g, fds),
            Ok((other, _)) => {
                return Err(ReportError::Refused(format!("attach refused: {other:?}")))
            }
            Err(e) => return Err(ReportError::Unreachable(format!("attach failed: {e}"))),
        };
        self.conn = Some(c);
        let Some(held) = self.follow else {
            return Ok(());
        };
        let mut fds = fds.into_iter();
        let (page_fd, board_fd) = (fds.next(), fds.next());
        // Only a page known to be another file than the one held is mapped: no mapping per
        // attach (the fstat cannot fail on an fd just received; if it did, nothing is known).
        let id = page_fd
            .as_ref()
            .and_then(|fd| grant::file_id(fd.as_raw_fd()));
        let (page, board) = match (&page_fd, id) {
            (Some(_), Some(id)) if Some(id) == held => (PageNews::Same, None),
            (Some(fd), Some(id)) => match grant::map_fd(fd.as_raw_fd()) {
                Ok(p) => {
                    self.follow = Some(Some(id));
                    (PageNews::New(p), board_of(&grant, board_fd))
                }
                Err(e) => {
                    crate::log::line(
                        crate::config::Level::Warn,
                        format_args!("the page instance {instance}'s attach handed is unusable: {e}; keeping the one held"),
                    );
                    (PageNews::Unknown, None)
                }
            },
            _ => (PageNews::Unknown, None),
        };
        self.attached = Some(Attached { grant, page, board });
        Ok(())
    }

    /// Sends `usage` for `instance` unless it is what was sent last. A failure drops the
    /// connection; the next call connects again.
    pub fn report(
        &mut self,
        socket: &std::path::Path,
        instance: u64,
        usage: Usage,
        force: bool,
    ) -> Result<(), ReportError> {
        // Unchanged usage is not sent again, unless forced (the page cap went to 0) and the
        // preemption was not said yet, or the last report is [`REPORT_REFRESH`] old — or there
        // is a following reporter without a connection (it broke: attaching again is how a
        // follower learns the arbiter is back).
        let forced = force && !self.told_preempted;
        let fresh = self.sent_at.is_some_and(|t| t.elapsed() < REPORT_REFRESH);
        let reattach = self.conn.is_none() && self.follow.is_some();
        if self.last == Some(usage) && !forced && fresh && !reattach {
            return Ok(());
        }
        if self.conn.is_none() {
            self.attach(socket, instance)?;
        }
        let Some(c) = &self.conn else {
            return Err(ReportError::Unreachable("no connection".into()));
        };
        let r = c.call(Request::Report {
            latencies_ms: Vec::new(),
            used_bytes: None,
            throttled_ns: Some(usage.held_ns),
            refusals: None,
            gpu_ns: Some(usage.gpu_ns),
            contention_ns: Some(usage.contention_ns),
            measured_contention_ns: Some(usage.measured_contention_ns),
            deferred_ns: Some(usage.deferred_ns),
            turn_waited_ns: (usage.turn_waited_ns > 0).then_some(usage.turn_waited_ns),
            turn_cut_ins: (usage.turn_cut_ins > 0).then_some(usage.turn_cut_ins),
            contention_ahead_ns: Some(usage.contention_ahead_ns),
            contention_shared: usage.contention_shared.then_some(true),
            raw_shared: usage.raw_shared.then_some(true),
        });
        match r {
            Ok(Reply::Ok) => {
                self.last = Some(usage);
                self.sent_at = Some(std::time::Instant::now());
                Ok(())
            }
            Ok(Reply::Preempted {
                reason,
                message,
                grace_ms,
            }) => {
                // The arbiter took this instance's memory back for training (docs/arbiter.md,
                // "Memory headroom and reclaim"): its page cap is already 0. Say why once, on
                // the process's stderr, so the out-of-memory errors that follow are explained.
                self.last = Some(usage);
                self.sent_at = Some(std::time::Instant::now());
                if !self.told_preempted {
                    self.told_preempted = true;
                    crate::log::line(
                        crate::config::Level::Error,
                        format_args!(
                            "instance {instance} was preempted ({}): {message}; new device allocations are refused and the arbiter stops this process in {grace_ms} ms unless it exits",
                            reason.as_str()
                        ),
                    );
                }
                Ok(())
            }
            Ok(other) => {
                self.conn = None;
                Err(ReportError::Refused(format!("report refused: {other:?}")))
            }
            Err(e) => {
                self.conn = None;
                Err(ReportError::Unreachable(format!("report failed: {e}")))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn registration_carries_the_function_and_its_declared_needs() {
        let mut c = Config::default();
        c.mem_cap[0] = 2 << 30;
        let get = env(&[
            ("SMORE_FUNCTION", "resnet"),
            ("SMORE_MODEL", "resnet50"),
            ("SMORE_SLO_MS", "50"),
        ]);
        match register_request(&get, &c) {
            Request::Register(Register {
                function,
                model,
                slo_ms,
                memory,
                resume,
                gpu,
                exec,
                gpus,
            }) => {
                assert_eq!(function, "resnet");
                assert_eq!(model.as_deref(), Some("resnet50"));
                assert_eq!(slo_ms, Some(50.0));
                assert_eq!(memory, Some(2 << 30));
                assert_eq!((resume, gpu, exec, gpus), (None, None, false, None));
            }
            other => panic!("{other:?}"),
        }
        // A container given GPUs 2 and 0 through CDI says so; a malformed list is not sent.
        for (v, want) in [("2,0", Some(vec![2, 0])), ("two", None)] {
            match register_request(&env(&[("SMORE_GPUS", v)]), &c) {
                Request::Register(r) => assert_eq!(r.gpus, want, "{v}"),
                other => panic!("{other:?}"),
            }
        }
        // Defaults: the executable's name, no declared memory, a bad SLO is simply not sent.
        match register_request(&env(&[("SMORE_SLO_MS", "fast")]), &Config::default()) {
            Request::Register(Register {
                function,
                slo_ms,
                memory,
                ..
            }) => {
                assert!(!function.is_empty() && function != "unknown");
                assert_eq!((slo_ms, memory), (None, None));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn no_arbiter_variables_means_standalone_and_bad_ones_are_reported() {
        assert!(matches!(
            source(env(&[]), &Config::default()),
            (Source::Standalone, None, None)
        ));
        match source(env(&[("SMORE_GRANT_FD", "seven")]), &Config::default()) {
            (Source::Unavailable(why), None, None) => {
                assert!(why.contains("SMORE_GRANT_FD"), "{why}")
            }
            _ => panic!("a non-number fd must be refused"),
        }
        // A descriptor number that is not open.
        match source(env(&[("SMORE_GRANT_FD", "987654")]), &Config::default()) {
            (Source::Unavailable(why), None, None) => assert!(why.contains("not open"), "{why}"),
            _ => panic!("a closed fd must be refused"),
        }
        match source(
            env(&[("SMORE_ARBITER_SOCKET", "/nonexistent/smore.sock")]),
            &Config::default(),
        ) {
            (Source::Unavailable(why), None, None) => {
                assert!(why.contains("cannot reach the arbiter"), "{why}")
            }
            _ => panic!("an unreachable socket must be reported"),
        }
    }

    fn snapshot() -> serde_json::Value {
        serde_json::json!({
            "arbiter": {"version": "x"},
            "gpus": [
                {"index": 0, "uuid": "GPU-aaaa", "functions": [
                    {"id": 3, "pid": 100, "attached": true}
                ]},
                {"index": 1, "uuid": "GPU-bbbb", "functions": [
                    {"id": 7, "pid": 200, "attached": false},
                    {"id": 8, "pid": 300}
                ]}
            ]
        })
    }

    #[test]
    fn the_instance_is_found_in_the_status_snapshot() {
        let s = snapshot();
        assert_eq!(
            find_listed(&s, 7, None),
            Some(Listed {
                pid: 200,
                attached: false,
                gpu: 1
            })
        );
        // The GPU is the one CUDA_VISIBLE_DEVICES names when it is a listed UUID …
        assert_eq!(find_listed(&s, 7, Some("GPU-aaaa")).unwrap().gpu, 0);
        // … else the one the arbiter lists the instance under.
        assert_eq!(find_listed(&s, 7, Some("0")).unwrap().gpu, 1);
        assert!(find_listed(&s, 3, None).unwrap().attached);
        // Without an `attached` field the instance is taken as attached (do not re-register).
        assert!(find_listed(&s, 8, None).unwrap().attached);
        assert_eq!(find_listed(&s, 9, None), None);
        assert_eq!(find_listed(&serde_json::json!({}), 7, None), None);
    }

    /// The grant a test arbiter answers an attach with.
    fn attached_grant(instance: u64) -> Grant {
        Grant {
            instance,
            gpu_index: 0,
            gpu_uuid: "GPU-0".into(),
            memory_cap: 0,
            sm_share: 100,
            generation: 1,
            predicted_train: None,
            predicted_fn: None,
            rule: String::new(),
            failure_policy: None,
            pid: None,
            board: false,
        }
    }

    #[test]
    fn a_preempted_instance_is_told_once_and_reports_even_when_idle() {
        use smore_protocol::conn::{recv_with_fd, send_with_fd};
        use smore_protocol::wire::{Envelope, PreemptReason, MAX_FRAME};
        let sock = std::env::temp_dir().join(format!("smore-preempt-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&sock);
        let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let server = std::thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            let mut reports = 0;
            while let Ok((env, _)) = recv_with_fd::<Envelope>(&s, MAX_FRAME) {
                let reply = match env.req {
                    Request::Attach { instance } => Reply::Granted(attached_grant(instance)),
                    Request::Report { .. } => {
                        reports += 1;
                        Reply::Preempted {
                            reason: PreemptReason::TrainingMemory,
                            message: "training grew".into(),
                            grace_ms: 2000,
                        }
                    }
                    other => panic!("{other:?}"),
                };
                send_with_fd(&s, &reply, None).unwrap();
            }
            reports
        });
        let mut rep = Reporter::default();
        let u = Usage::default();
        assert_eq!(rep.report(&sock, 7, u, true), Ok(()));
        assert!(rep.told_preempted, "the preemption was said");
        // Unchanged usage: not sent again, forced or not, once the preemption was said.
        assert_eq!(rep.report(&sock, 7, u, true), Ok(()));
        assert_eq!(rep.report(&sock, 7, u, false), Ok(()));
        // Unless the last report is older than the refresh: an idle process stays known (and a
        // restarted arbiter learns of it).
        rep.sent_at = std::time::Instant::now().checked_sub(REPORT_REFRESH);
        assert_eq!(rep.report(&sock, 7, u, false), Ok(()));
        assert_eq!(rep.report(&sock, 7, u, false), Ok(()));
        drop(rep);
        assert_eq!(
            server.join().unwrap(),
            2,
            "one report answered `preempted`, one refresh"
        );
        let _ = std::fs::remove_file(&sock);
    }

    /// A memfd holding a valid grant page with cap `cap` on slot 0.
    fn page_file(cap: u64) -> std::os::fd::OwnedFd {
        use std::os::fd::{FromRawFd, OwnedFd};
        // SAFETY: memfd_create with a NUL-terminated name; the result is checked before it is
        // owned, once.
        let raw = unsafe { libc::memfd_create(c"smore-grant".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(raw >= 0);
        // SAFETY: `raw` is a fresh, open fd no one else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let page = GrantPage::unlimited();
        page.set(0, cap, 100);
        // SAFETY: the bytes of a repr(C) value that lives across the call, for its size.
        let bytes = unsafe {
            std::slice::from_raw_parts(
                &page as *const GrantPage as *const u8,
                std::mem::size_of::<GrantPage>(),
            )
        };
        let mut whole = bytes.to_vec();
        whole.resize(smore_protocol::grant::PAGE_BYTES, 0);
        std::io::Write::write_all(&mut std::fs::File::from(fd.try_clone().unwrap()), &whole)
            .unwrap();
        fd
    }

    #[test]
    fn a_following_reporter_takes_a_page_of_another_file_once_and_never_the_one_it_holds() {
        use smore_protocol::conn::{recv_with_fd, send_with_fds};
        use smore_protocol::wire::{Envelope, MAX_FRAME};
        use std::os::fd::AsFd;
        let sock = std::env::temp_dir().join(format!("smore-follow-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&sock);
        let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let (old, new) = (page_file(1 << 20), page_file(2 << 20));
        let held = grant::file_id(old.as_raw_fd());
        // Each connection's attach hands one of the two pages: the old, the new, the new again.
        let hand = [
            old.try_clone().unwrap(),
            new.try_clone().unwrap(),
            new.try_clone().unwrap(),
        ];
        let server = std::thread::spawn(move || {
            for page in hand {
                let (s, _) = listener.accept().unwrap();
                while let Ok((env, _)) = recv_with_fd::<Envelope>(&s, MAX_FRAME) {
                    let (reply, fds) = match env.req {
                        Request::Attach { instance } => {
                            (Reply::Granted(attached_grant(instance)), vec![page.as_fd()])
                        }
                        Request::Report { .. } => (Reply::Ok, vec![]),
                        other => panic!("{other:?}"),
                    };
                    send_with_fds(&s, &reply, &fds).unwrap();
                }
            }
        });
        let mut rep = Reporter::following(held);
        let u = Usage::default();
        let mut handed = Vec::new();
        for _ in 0..3 {
            assert_eq!(rep.report(&sock, 7, u, false), Ok(()));
            let a = rep
                .take_attached()
                .expect("every attach says what it handed");
            handed.push(match a.page {
                PageNews::New(p) => Some(p.cap(0)),
                PageNews::Same => None,
                PageNews::Unknown => panic!("a page came"),
            });
            rep.disconnect();
        }
        server.join().unwrap();
        let _ = std::fs::remove_file(&sock);
        assert_eq!(
            handed,
            [None, Some(2 << 20), None],
            "the page held is not mapped again; another file is, once"
        );
        assert_eq!(rep.follow, Some(grant::file_id(new.as_raw_fd())));
        // A reporter that does not follow takes no page, and attaches only when it has news.
        let mut plain = Reporter::default();
        assert!(plain.take_attached().is_none());
        assert!(matches!(
            plain.report(&sock, 7, u, false),
            Err(ReportError::Down(_))
        ));
    }

    #[test]
    fn a_worker_without_the_registrations_connection_reports_when_it_inherited_a_grant() {
        let all = [
            ("SMORE_GRANT_FD", "5"),
            ("SMORE_INSTANCE", "7"),
            ("SMORE_ARBITER_SOCKET", "/run/smore/a.sock"),
        ];
        assert_eq!(
            report_only(env(&all)),
            Some(("/run/smore/a.sock".into(), 7))
        );
        // Self-registered (no inherited grant), or nothing to report to: nothing.
        assert_eq!(report_only(env(&all[1..])), None);
        assert_eq!(report_only(env(&all[..2])), None);
        assert_eq!(
            report_only(env(&[all[0], ("SMORE_INSTANCE", "x"), all[2]])),
            None
        );
    }

    #[test]
    fn an_inherited_fd_this_process_lacks_is_looked_for_in_the_process_smore_run_started() {
        // (Opening it there and mapping it: `workers_started_with_close_fds_share_the_grants_one_cap`,
        // end to end.)
        let refuse = |_: RawFd| -> Result<(), String> { Err("not here".into()) };
        let what = ("smore-grant", false);
        let me = crate::sys::os::pid();
        // The holder is this very process: nowhere else to look, the first error stands.
        let known = format!("{me}:{me}");
        let r = map_inherited(
            &env(&[("SMORE_KNOWN_AS", &known)]),
            "V",
            987_654,
            what,
            refuse,
        );
        assert_eq!(r, Err("not here".into()));
        // No holder named: the same.
        assert_eq!(
            map_inherited(&env(&[]), "V", 987_654, what, refuse),
            Err("not here".into())
        );
        // A holder that is not an ancestor (one that exited, its pid since anyone's): not asked.
        let gone = format!("{}:1", u32::MAX - 1);
        let e = map_inherited(
            &env(&[("SMORE_KNOWN_AS", &gone)]),
            "V",
            987_654,
            what,
            refuse,
        )
        .unwrap_err();
        assert!(
            e.starts_with("not here; process") && e.contains("neither an ancestor"),
            "{e}"
        );
        // A holder that is not an ancestor (here a child: a worker's launcher that exited makes
        // the holder that) is asked when the variable names its start time, and only then.
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .stdin(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let pid = child.id();
        let start = crate::sys::os::start_ticks(pid).unwrap().unwrap();
        let named = format!("{pid}:{pid}");
        let ask = |start: u64| {
            map_inherited(
                &env(&[
                    ("SMORE_KNOWN_AS", named.as_str()),
                    ("SMORE_KNOWN_START", start.to_string().as_str()),
                ]),
                "V",
                0,
                what,
                refuse,
            )
            .unwrap_err()
        };
        let asked = ask(start);
        let other = ask(start + 1);
        let _ = child.kill();
        let _ = child.wait();
        assert!(
            asked.starts_with("not here; from process") && asked.contains("not a /memfd"),
            "its stdin is no memfd, but it was asked: {asked}"
        );
        assert!(
            other.contains("neither an ancestor"),
            "another start time: {other}"
        );
        // The parent is: what it holds there is judged by its fd's link, and only a memfd of
        // the name asked for is opened (the parent's stdin is none).
        let parent = std::os::unix::process::parent_id();
        assert!(crate::sys::os::is_ancestor(parent));
        let holder = format!("{parent}:{parent}");
        let e =
            map_inherited(&env(&[("SMORE_KNOWN_AS", &holder)]), "V", 0, what, refuse).unwrap_err();
        assert!(e.starts_with("not here; from process"), "{e}");
        assert!(
            e.contains("not a /memfd:smore-grant") || e.contains("cannot read"),
            "{e}"
        );
    }

    #[test]
    fn a_memfd_the_holder_keeps_is_mapped_from_it_while_it_lives_and_not_once_it_is_a_zombie() {
        use std::io::Write;
        use std::os::fd::{FromRawFd, OwnedFd};
        // A grant-named memfd handed to a child as its stdin: the child stands for the process
        // `smore run` exec'd, this one for a worker started with close_fds (its fd 0 is not the
        // memfd).
        // SAFETY: memfd_create with a NUL-terminated name; the result is checked before it is
        // owned, once.
        let raw = unsafe { libc::memfd_create(c"smore-grant".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(
            raw >= 0,
            "memfd_create: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: `raw` is a fresh, open fd no one else owns.
        let memfd = unsafe { OwnedFd::from_raw_fd(raw) };
        std::fs::File::from(memfd.try_clone().unwrap())
            .write_all(b"the grant")
            .unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .stdin(std::process::Stdio::from(memfd))
            .spawn()
            .unwrap();
        let pid = child.id();
        let start = crate::sys::os::start_ticks(pid).unwrap().unwrap();
        let named = format!("{pid}:{pid}");
        let start = start.to_string();
        let vars = env(&[
            ("SMORE_KNOWN_AS", named.as_str()),
            ("SMORE_KNOWN_START", start.as_str()),
        ]);
        // Maps only a grant memfd, and reads what it holds.
        let read = |fd: RawFd| -> Result<String, String> {
            let link =
                std::fs::read_link(format!("/proc/self/fd/{fd}")).map_err(|e| e.to_string())?;
            if !link.to_string_lossy().starts_with("/memfd:smore-grant") {
                return Err(format!("not a grant: {}", link.display()));
            }
            let mut buf = [0u8; 9];
            // SAFETY: `fd` is open for the call; `buf` is valid for writes of its length.
            let n = unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
            Ok(String::from_utf8_lossy(&buf[..n.max(0) as usize]).into_owned())
        };
        let found = map_inherited(&vars, "V", 0, ("smore-grant", false), read);
        // Another memfd name is not opened.
        let other = map_inherited(&vars, "V", 0, ("smore-ledger", false), read);
        // Killed but not reaped: a zombie, whose fds are closed. It is not that living process.
        child.kill().unwrap();
        let gone = std::time::Instant::now();
        while crate::sys::os::start_ticks(pid).unwrap().is_some() {
            assert!(gone.elapsed().as_secs() < 10, "never became a zombie");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let zombie = map_inherited(&vars, "V", 0, ("smore-grant", false), read);
        child.wait().unwrap();
        let reaped = map_inherited(&vars, "V", 0, ("smore-grant", false), read);
        assert_eq!(found, Ok(("the grant".to_string(), Found::Holder)));
        assert!(
            other
                .as_ref()
                .is_err_and(|e| e.contains("not a /memfd:smore-ledger")),
            "{other:?}"
        );
        for r in [zombie, reaped] {
            assert!(
                r.as_ref()
                    .is_err_and(|e| e.contains("nor alive with its start time")),
                "{r:?}"
            );
        }
    }

    #[test]
    fn an_unreachable_arbiter_is_retried_not_given_up() {
        let r = Resume {
            conn: -1,
            socket: "/nonexistent/smore.sock".into(),
            instance: 7,
            gpu: Some(0),
            exec: true,
            slot: 0,
            request: register_request(&env(&[]), &Config::default()),
            policy: None,
        };
        assert!(matches!(
            reregister(&r, 1 << 30, None),
            Rejoin::Unreachable(_)
        ));
    }
}

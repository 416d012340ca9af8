//! The per-node configuration file (`/etc/smore/node.toml`; example: `docs/node.example.toml`).
//!
//! Owns: the schema, its defaults and its validation. Every error names the file, the line and
//! the key, and says what a valid value looks like: a daemon that starts with a typo in its
//! safety factor is worse than one that refuses to start. Must never: accept an unknown key
//! (a misspelt `theta_train` silently falling back to the default is exactly the failure to avoid).

use serde::Deserialize;
use smore_protocol::grant::{TimingNoise, MAX_TIMING_NOISE_US};
use smore_protocol::size::parse_size;
use std::path::{Path, PathBuf};
use toml::Spanned;

/// What the shim does while the arbiter cannot be reached (one definition, in the protocol: it is
/// announced to every shim in its grant).
pub use smore_protocol::wire::FailurePolicy;

/// What the watchdog does to a function that exceeds its cap or bypasses the shim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WatchdogAction {
    /// Only log the violation.
    Log,
    /// Send SIGTERM to the process.
    Sigterm,
    /// Send SIGKILL to the process.
    Sigkill,
}

/// Harvest's deadline-aware deferral (docs/harvest.md, "Deferral"): where the arbiter gives
/// each admitted request's latest start to its function's shim, which then holds launches that
/// have slack while the training job is busy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DeferMode {
    /// On the GPUs NVML shows running MPS, off elsewhere (the default). Measured on the
    /// simulated GPU: under MPS it lowered the trainer's slowdown and raised deadline
    /// satisfaction with no scenario worse; on a time-sliced GPU it lowered the slowdown beside
    /// a mostly idle trainer but cost 3.5 pp of deadline satisfaction beside one busy 60 % of the
    /// time (docs/harvest.md, "Deferral").
    Auto,
    /// On every GPU with a training job.
    On,
    /// Nowhere: functions never wait for training.
    Off,
}

/// Harvest's turns (docs/harvest.md, "Serializing the functions"): where the harvesting
/// functions of a GPU take turns through the GPU's turn board, one function's queued work on the
/// GPU at a time, so that none waits on the GPU behind another (a wait its shim would count as
/// a collision with training) and their requests run one after the other instead of in the
/// GPU's round robin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TurnsMode {
    /// smore's measured default, today the same as `On`: every GPU, MPS included. Under MPS
    /// the functions' kernels slow each other as the trainer slows them, and a shim cannot tell
    /// the two apart; without turns the collision budget paid for their mutual slowing
    /// (docs/harvest.md, "The calibrated floor under MPS").
    Auto,
    /// On every GPU, whatever smore's default becomes.
    On,
    /// Nowhere: functions' kernels meet on the GPU as the driver schedules them.
    Off,
}

/// Which placement policy sits behind the policy seam.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PolicyKind {
    /// Memory fit, least-loaded GPU, time share split under θ_train (`policy::FitPolicy`).
    Fit,
    /// SMORE's degradation-aware policy (predictor crate).
    Smore,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    arbiter: RawArbiter,
    #[serde(default)]
    gpus: RawGpus,
    #[serde(default)]
    policy: RawPolicy,
    #[serde(default)]
    functions: RawFunctions,
    #[serde(default)]
    watchdog: RawWatchdog,
    #[serde(default)]
    prewarm: RawPrewarm,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawPrewarm {
    policy: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawArbiter {
    socket: Option<Spanned<String>>,
    socket_mode: Option<Spanned<String>>,
    socket_group: Option<Spanned<String>>,
    state_dir: Option<Spanned<String>>,
    metrics_addr: Option<Spanned<String>>,
    failure_policy: Option<FailurePolicy>,
    reconcile_ms: Option<Spanned<u64>>,
    operators: Option<Spanned<Vec<String>>>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawGpus {
    discover: Option<bool>,
    indices: Option<Spanned<Vec<u32>>>,
    nvml_library: Option<String>,
    context_switch_us: Option<Spanned<u64>>,
    wait_noise_us: Option<Spanned<u32>>,
    stretch_noise_us: Option<Spanned<u32>>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    name: Option<PolicyKind>,
    memory_safety: Option<Spanned<f64>>,
    theta_train: Option<Spanned<Fraction>>,
    harvest: Option<bool>,
    defer: Option<DeferMode>,
    turns: Option<TurnsMode>,
    min_share: Option<Spanned<u32>>,
    power_of_d: Option<Spanned<u32>>,
    lambda: Option<Spanned<f64>>,
    first_fit_queue: Option<Spanned<u32>>,
    catalog: Option<String>,
    model: Option<String>,
    training_headroom: Option<Spanned<String>>,
    training_headroom_fraction: Option<Spanned<f64>>,
    reclaim_line: Option<Spanned<f64>>,
    reclaim_hold_s: Option<Spanned<f64>>,
    preempt_grace_ms: Option<Spanned<u64>>,
    idle_after_s: Option<Spanned<f64>>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawFunctions {
    default_slo_ms: Option<Spanned<f64>>,
    default_memory: Option<Spanned<String>>,
    grants_per_process: Option<Spanned<u32>>,
    allow_root: Option<bool>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawWatchdog {
    action: Option<WatchdogAction>,
    memory_slack: Option<Spanned<String>>,
    check_shim: Option<bool>,
    kill_after_s: Option<Spanned<f64>>,
}

/// A fraction as the file may spell it: a number (`0.1`) or a percentage string (`"10%"`).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Fraction {
    Number(f64),
    Text(String),
}

/// The most device memory one function may be given by default: 1 TiB. The largest GPUs sold
/// today carry 192 GB; a default above this is a typo (or `u64::MAX`), not a plan.
pub const MAX_DEFAULT_MEMORY: u64 = 1 << 40;

/// The group the arbiter's socket is handed to (`[arbiter] socket_group`), resolved once at load
/// so that `smore arbiter --check` reports an unknown group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct SocketGroup {
    /// The numeric group id.
    pub gid: u32,
}

impl SocketGroup {
    /// A group name (looked up through NSS, as `chgrp` does) or a numeric gid.
    pub fn resolve(spec: &str) -> Result<SocketGroup, String> {
        if let Ok(gid) = spec.parse::<u32>() {
            return Ok(SocketGroup { gid });
        }
        match nix::unistd::Group::from_name(spec) {
            Ok(Some(g)) => Ok(SocketGroup {
                gid: g.gid.as_raw(),
            }),
            Ok(None) => Err(format!(
                "no group named {spec:?} on this node: create it (`groupadd {spec}`) and add the \
                 users that run functions, or give a numeric gid"
            )),
            Err(e) => Err(format!("looking up group {spec:?}: {e}")),
        }
    }
}

/// Who may change shares and caps (`[arbiter] operators`), resolved at load so that
/// `smore arbiter --check` reports an unknown user or group. A process that is a function or a
/// function's descendant is never an operator, whatever its user (`State::operator`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Operators {
    /// Operator users (uids).
    pub uids: Vec<u32>,
    /// Operator groups (gids): a process whose effective or supplementary groups hold one.
    pub gids: Vec<u32>,
}

impl Default for Operators {
    /// Root and the arbiter's own user: the admin who runs `smore share` / `smore status` on
    /// the node keeps working as before the list existed.
    fn default() -> Self {
        let me = rustix::process::getuid().as_raw();
        let mut uids = vec![0];
        if me != 0 {
            uids.push(me);
        }
        Operators {
            uids,
            gids: Vec::new(),
        }
    }
}

impl Operators {
    /// Users (`"root"`, `"1000"`) and groups (`"@smore-admin"`, `"@1001"`), names looked up
    /// through NSS as `chown` does.
    pub fn resolve(specs: &[String]) -> Result<Operators, String> {
        let mut o = Operators {
            uids: Vec::new(),
            gids: Vec::new(),
        };
        for spec in specs {
            let spec = spec.trim();
            if let Some(group) = spec.strip_prefix('@') {
                o.gids.push(SocketGroup::resolve(group)?.gid);
            } else if let Ok(uid) = spec.parse::<u32>() {
                o.uids.push(uid);
            } else {
                match nix::unistd::User::from_name(spec) {
                    Ok(Some(u)) => o.uids.push(u.uid.as_raw()),
                    Ok(None) => {
                        return Err(format!(
                            "no user named {spec:?} on this node: give an existing user, a numeric uid, or a group as \"@group\""
                        ))
                    }
                    Err(e) => return Err(format!("looking up user {spec:?}: {e}")),
                }
            }
        }
        Ok(o)
    }

    /// Whether a process of `uid` with groups `gids` is an operator (before the function check).
    pub fn admits(&self, uid: u32, gids: &[u32]) -> bool {
        self.uids.contains(&uid) || gids.iter().any(|g| self.gids.contains(g))
    }

    /// Whether any group is listed (then the peer's groups are worth reading).
    pub fn has_groups(&self) -> bool {
        !self.gids.is_empty()
    }
}

/// The validated configuration.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Config {
    /// Where the config came from (for messages); `None` = built-in defaults.
    pub source: Option<PathBuf>,
    /// Path of the arbiter's Unix socket.
    pub socket: PathBuf,
    /// Permission bits of the socket (octal in the file, e.g. `"0660"`).
    pub socket_mode: u32,
    /// Group the socket is given (name or numeric gid, resolved at load): with the default mode
    /// 0660 its members may register functions (None: the arbiter's own group, i.e. root only).
    pub socket_group: Option<SocketGroup>,
    /// Where grants are persisted across arbiter restarts.
    pub state_dir: PathBuf,
    /// Address of the Prometheus `/metrics` endpoint (None: off).
    pub metrics_addr: Option<String>,
    /// What functions do while the arbiter is unreachable.
    pub failure_policy: FailurePolicy,
    /// Period of the NVML reconcile / watchdog loop, milliseconds.
    pub reconcile_ms: u64,
    /// Who may change shares and caps.
    pub operators: Operators,
    /// Whether to discover GPUs through NVML at start.
    pub discover: bool,
    /// The GPUs to manage by NVML index (None: all).
    pub gpu_indices: Option<Vec<u32>>,
    /// Path or name of `libnvidia-ml.so.1`.
    pub nvml_library: String,
    /// Harvest: what one context switch between a function and the training job costs on this
    /// node's GPUs without MPS, ns (0: free). The arbiter publishes it on time-sliced GPUs and
    /// the shims charge each collision two of them (docs/harvest.md, "Context switches").
    pub context_switch_ns: u64,
    /// Harvest: how far the shims' event timing strays on this node's GPUs with nothing to wait
    /// for — what a sample's wait and stretch must pass before any of them counts as a collision
    /// (`[gpus] wait_noise_us`, `stretch_noise_us`; default: what an NVIDIA H200 measured,
    /// docs/harvest.md "Timing noise"). Written to the page of every function on a time-sliced
    /// GPU (none under MPS or before the GPU's mode is known).
    pub timing_noise: TimingNoise,
    /// The placement policy.
    pub policy: PolicyKind,
    /// σ: fraction of each GPU's memory smore may hand out (training included).
    pub memory_safety: f64,
    /// θ_train: largest tolerated slowdown of a training job (fraction, 0.1 = 10 %).
    pub theta_train: f64,
    /// Harvest mode (docs/harvest.md): functions get a budget of *collision* time with training,
    /// θ/(1+θ) per GPU split among them, and may use idle GPU time freely; `false` keeps the
    /// worst-case raw time shares θ/(u+θ).
    pub harvest: bool,
    /// Harvest: where deadline-aware deferral applies (docs/harvest.md, "Deferral"): each
    /// admitted request's latest start goes to its function's shim, which holds launches with
    /// slack until the training job's busy phase is over instead of colliding with it.
    pub defer: DeferMode,
    /// Harvest: where the functions of a GPU take turns (docs/harvest.md, "Serializing the
    /// functions").
    pub turns: TurnsMode,
    /// Smallest SM share granted, percent.
    pub min_share: u32,
    /// Power-of-d choices of the SMORE policy (GPUs sampled per placement).
    pub power_of_d: u32,
    /// λ of the SMORE policy: weight of training's predicted degradation in the placement score
    /// λ·D̂_train + (1−λ)·D̂_fn.
    pub lambda: f64,
    /// The SMORE policy switches to first fit ("fast processing") when more than this many
    /// registrations arrived within its queue window.
    pub first_fit_queue: u32,
    /// SMORE predictor catalog file (None: the built-in one).
    pub catalog: Option<PathBuf>,
    /// SMORE predictor model file (None: the built-in one).
    pub model: Option<PathBuf>,
    /// SLO of a registration that declares none, ms.
    pub default_slo_ms: f64,
    /// Memory cap of a registration that declares none, bytes.
    pub default_memory: u64,
    /// Live grants one process may hold (1: one instance per process, so one process cannot
    /// collect grants and refuse legitimate functions; issue 12, item 13).
    pub grants_per_process: u32,
    /// Whether functions may run as root: true registers them with a warning (event + log),
    /// false refuses them.
    pub allow_root: bool,
    /// What the watchdog does to a function breaking its grant.
    pub watchdog_action: WatchdogAction,
    /// Bytes a function may exceed its cap by in NVML before the watchdog acts (the context and
    /// allocator rounding NVML counts but the shim's ledger does not).
    pub memory_slack: u64,
    /// Whether the watchdog checks that a registered process actually loaded the shim.
    pub check_shim: bool,
    /// Seconds a function may go on breaking its grant after the configured action before the
    /// watchdog sends SIGKILL (docs/arbiter.md, "Watchdog").
    pub kill_after_s: f64,
    /// Prewarm policy the arbiter runs online over request reports (`off` disables hints).
    pub prewarm_policy: String,
    /// Memory kept free above a GPU's training high-water mark, bytes (at least; see
    /// `training_headroom_fraction`). docs/arbiter.md, "Memory headroom and reclaim".
    pub training_headroom: u64,
    /// Headroom as a fraction of the training high-water mark; the larger of the two applies.
    pub training_headroom_fraction: f64,
    /// Reclaim line: fraction of capacity that training memory + Σ function caps may not
    /// cross; crossing it makes the arbiter take memory back from functions at once.
    pub reclaim_line: f64,
    /// Seconds a GPU's training memory must have been stable after a reclaim before functions
    /// are admitted onto it again (hysteresis).
    pub reclaim_hold_s: f64,
    /// Time a preempted instance has to finish its request and exit before it is killed, ms.
    pub preempt_grace_ms: u64,
    /// An instance with no request admitted or reported for this long is idle (unloaded before
    /// any busy instance is preempted), s.
    pub idle_after_s: f64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            source: None,
            socket: PathBuf::from(smore_protocol::wire::DEFAULT_SOCKET),
            socket_mode: 0o660,
            socket_group: None,
            state_dir: PathBuf::from("/var/lib/smore"),
            metrics_addr: None,
            failure_policy: FailurePolicy::FailOpen,
            // 250 ms: NVML's process samples refresh about every 1/6 s; faster polling only
            // re-reads the same sample.
            reconcile_ms: 250,
            operators: Operators::default(),
            discover: true,
            gpu_indices: None,
            nvml_library: "libnvidia-ml.so.1".into(),
            context_switch_ns: 0,
            timing_noise: TimingNoise::H200,
            policy: PolicyKind::Fit,
            // σ = 0.95 and θ_train = 0.10: SMORE's defaults (Liu et al., "SMORE…", IEEE TPDS 2025, §V).
            memory_safety: 0.95,
            theta_train: 0.10,
            // Harvest on: the raw worst-case shares starved functions (docs/demo.md, docs/harvest.md).
            harvest: true,
            // Auto: deferral where it measured a win on every scenario (MPS; docs/harvest.md).
            defer: DeferMode::Auto,
            turns: TurnsMode::Auto,
            // 2 %: 2 ms of GPU time per 100 ms window still runs a few small kernels per window;
            // a higher floor admits fewer functions beside a busy trainer (the floors of all
            // functions must fit the θ_train time budget). Reasoning, not measured.
            min_share: 2,
            power_of_d: 2,
            lambda: 0.5,
            first_fit_queue: 64,
            catalog: None,
            model: None,
            default_slo_ms: 100.0,
            default_memory: 2 << 30,
            grants_per_process: 1,
            // Warn only: CI and many single-user nodes run everything as root; a node that
            // separates users should refuse (docs/arbiter.md, "Operators").
            allow_root: true,
            watchdog_action: WatchdogAction::Sigterm,
            // 64 MiB: covers allocator rounding (2 MiB pages) and small context growth.
            memory_slack: 64 << 20,
            check_shim: true,
            kill_after_s: crate::state::watchdog::KILL_AFTER_S,
            // HHP: the serverless industry baseline (Shahrad et al., ATC'20); needs no training.
            prewarm_policy: "hhp".into(),
            // 2 GiB or 10 % of the high-water mark, whichever is larger: PyTorch's caching
            // allocator reserves in 2 MiB/20 MiB blocks and grows over the first iterations;
            // an evaluation pass, cuDNN workspaces or a checkpoint's staging buffers add a
            // few hundred MiB to a few GiB beyond the steady state. 10 % scales that with the job
            // (a 40 GiB job keeps 4 GiB). Reasoning, not measured on real jobs (docs/arbiter.md).
            training_headroom: 2 << 30,
            training_headroom_fraction: 0.10,
            // 0.97: above σ = 0.95 so that a node admitted up to σ never sits on the line, and
            // 3 % of capacity (2.4 GiB on 80 GB) below the wall: what training may still
            // allocate between one NVML sample and the caps written after it.
            reclaim_line: 0.97,
            // 30 s: several iterations of a typical job (and one reconcile-driven reclaim
            // cycle); re-admitting sooner would hand back memory a still-growing job takes
            // again, each time costing a function a cold start.
            reclaim_hold_s: 30.0,
            // 2 s: one in-flight inference request (SLOs of 10–1000 ms) finishes well within it.
            preempt_grace_ms: 2000,
            // 10 s: ten report periods of the runtimes (they report every second).
            idle_after_s: 10.0,
        }
    }
}

/// A configuration error with its location.
#[derive(Debug)]
pub struct ConfigError(pub String);

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for ConfigError {}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// The dotted key (`policy.theta_train`) whose `key = value` line holds `offset`, with the
/// nearest `[table]` header above it; `None` when the line is not a key/value line.
fn key_at(text: &str, offset: usize) -> Option<String> {
    let offset = offset.min(text.len());
    let start = text[..offset].rfind('\n').map_or(0, |i| i + 1);
    let line = text[start..].lines().next().unwrap_or("");
    let (key, _) = line.split_once('=')?;
    let key = key.trim().trim_matches('"');
    if key.is_empty() || key.starts_with('[') || key.starts_with('#') {
        return None;
    }
    let table = text[..start].lines().rev().find_map(|l| {
        let l = l.trim();
        (l.starts_with('[') && !l.starts_with("[[")).then(|| l.trim_matches(['[', ']']).trim())
    });
    Some(match table {
        Some(t) if !t.is_empty() => format!("{t}.{key}"),
        _ => key.to_string(),
    })
}

/// θ_train from the file: a fraction in (0, 1] (`0.1`) or a percentage in (0, 100] (`"10%"`).
/// A bare number above 1 is refused rather than guessed: `10` may mean 10 % or a 10× slowdown.
fn theta_train(v: Fraction) -> Result<f64, String> {
    let x = match v {
        Fraction::Number(x) => {
            if x > 1.0 && x.is_finite() {
                return Err(format!(
                    "{x} is ambiguous: θ_train is a fraction of the training job's time, write 0.1 or \"10%\" for 10 %"
                ));
            }
            x
        }
        Fraction::Text(t) => {
            let pct = t
                .trim()
                .strip_suffix('%')
                .and_then(|n| n.trim().parse::<f64>().ok())
                .ok_or_else(|| format!("{t:?} is not a fraction: write 0.1 or \"10%\" for 10 %"))?;
            pct / 100.0
        }
    };
    if x.is_finite() && x > 0.0 && x <= 1.0 {
        Ok(x)
    } else {
        Err(format!(
            "{x} is outside (0, 1]: θ_train is a fraction of the training job's time (0.1 or \"10%\" = 10 %)"
        ))
    }
}

impl Config {
    /// Checks what depends on the GPUs NVML found (issue 12, item 15): a `default_memory` no
    /// managed GPU can give (its memory × σ) would refuse every registration that declares no
    /// memory, so it is an error at start, not a surprise per function. `totals`: bytes per GPU.
    pub fn check_against_gpus(&self, totals: &[u64]) -> Result<(), ConfigError> {
        let Some(largest) = totals.iter().max() else {
            return Ok(());
        };
        let room = (*largest as f64 * self.memory_safety) as u64;
        if self.default_memory > room {
            return Err(ConfigError(format!(
                "key `functions.default_memory`: {} is more than any GPU here can give (the \
                 largest has {}, × memory_safety {} = {}): give the memory a typical function \
                 needs, e.g. \"2GiB\"",
                smore_protocol::size::format_size(self.default_memory),
                smore_protocol::size::format_size(*largest),
                self.memory_safety,
                smore_protocol::size::format_size(room)
            )));
        }
        Ok(())
    }

    /// Reads and validates `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigError(format!(
                "{}: cannot read the config file: {e}",
                path.display()
            ))
        })?;
        let mut c = Config::parse(&text, &path.display().to_string())?;
        c.source = Some(path.to_path_buf());
        Ok(c)
    }

    /// Parses config text; `name` is used in messages.
    pub fn parse(text: &str, name: &str) -> Result<Config, ConfigError> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| {
            let msg = e.message().trim().to_string();
            match e.span() {
                Some(span) => {
                    let line = line_of(text, span.start);
                    match key_at(text, span.start) {
                        // Unknown keys already name themselves (with the valid ones).
                        Some(key) if !msg.starts_with("unknown field") => {
                            ConfigError(format!("{name}:{line}: key `{key}`: {msg}"))
                        }
                        _ => ConfigError(format!("{name}:{line}: {msg}")),
                    }
                }
                None => ConfigError(format!("{name}: {msg}")),
            }
        })?;
        let err = |span: std::ops::Range<usize>, key: &str, what: String| {
            ConfigError(format!(
                "{name}:{}: key `{key}`: {what}",
                line_of(text, span.start)
            ))
        };
        let mut c = Config::default();
        let a = raw.arbiter;
        if let Some(s) = a.socket {
            c.socket = PathBuf::from(s.into_inner());
        }
        if let Some(m) = a.socket_mode {
            let span = m.span();
            c.socket_mode = u32::from_str_radix(m.get_ref().trim_start_matches("0o"), 8)
                .ok()
                .filter(|m| *m <= 0o777)
                .ok_or_else(|| {
                    err(
                        span,
                        "arbiter.socket_mode",
                        format!("{:?} is not an octal mode like \"0660\"", m.get_ref()),
                    )
                })?;
        }
        if let Some(g) = a.socket_group {
            let span = g.span();
            c.socket_group = Some(
                SocketGroup::resolve(g.get_ref())
                    .map_err(|what| err(span, "arbiter.socket_group", what))?,
            );
        }
        if let Some(o) = a.operators {
            let span = o.span();
            c.operators = Operators::resolve(o.get_ref())
                .map_err(|what| err(span, "arbiter.operators", what))?;
        }
        if let Some(s) = a.state_dir {
            c.state_dir = PathBuf::from(s.into_inner());
        }
        if let Some(m) = a.metrics_addr {
            let span = m.span();
            let v = m.into_inner();
            if v.parse::<std::net::SocketAddr>().is_err() {
                return Err(err(
                    span,
                    "arbiter.metrics_addr",
                    format!("{v:?} is not an address like \"127.0.0.1:9464\""),
                ));
            }
            c.metrics_addr = Some(v);
        }
        if let Some(f) = a.failure_policy {
            c.failure_policy = f;
        }
        if let Some(r) = a.reconcile_ms {
            if !(10..=10_000).contains(r.get_ref()) {
                return Err(err(
                    r.span(),
                    "arbiter.reconcile_ms",
                    format!("{} is outside 10..=10000 ms", r.get_ref()),
                ));
            }
            c.reconcile_ms = r.into_inner();
        }
        if let Some(d) = raw.gpus.discover {
            c.discover = d;
        }
        if let Some(i) = raw.gpus.indices {
            if i.get_ref().is_empty() {
                return Err(err(
                    i.span(),
                    "gpus.indices",
                    "is empty: list GPU indices or remove the key to manage every GPU".into(),
                ));
            }
            c.gpu_indices = Some(i.into_inner());
        }
        if let Some(l) = raw.gpus.nvml_library {
            c.nvml_library = l;
        }
        if let Some(v) = raw.gpus.context_switch_us {
            let us = *v.get_ref();
            let max_us = smore_protocol::grant::MAX_SWITCH_NS / 1_000;
            if us > max_us {
                return Err(err(
                    v.span(),
                    "gpus.context_switch_us",
                    format!(
                        "{us} µs is more than {max_us} µs: give one switch's cost in microseconds \
                         (leave it 0 on an NVIDIA H200: docs/real-gpu.md, section 9)"
                    ),
                ));
            }
            c.context_switch_ns = us * 1_000;
        }
        for (key, v) in [
            ("gpus.wait_noise_us", raw.gpus.wait_noise_us),
            ("gpus.stretch_noise_us", raw.gpus.stretch_noise_us),
        ] {
            let Some(v) = v else { continue };
            let us = *v.get_ref();
            if us > MAX_TIMING_NOISE_US {
                return Err(err(
                    v.span(),
                    key,
                    format!(
                        "{us} µs is more than {MAX_TIMING_NOISE_US} µs: waits for a trainer's time \
                         slice are that short and longer, and an allowance past it hides them; \
                         measure the node's noise with tests/gpu/wait_jitter.py (docs/real-gpu.md, \
                         section 10)"
                    ),
                ));
            }
            if key == "gpus.wait_noise_us" {
                c.timing_noise.wait_us = us;
            } else {
                c.timing_noise.stretch_us = us;
            }
        }
        if !c.discover && c.gpu_indices.is_none() {
            return Err(ConfigError(format!(
                "{name}: [gpus] discover = false needs `indices = [...]` naming the GPUs to manage"
            )));
        }
        let p = raw.policy;
        if let Some(n) = p.name {
            c.policy = n;
        }
        let frac = |v: Spanned<f64>, key: &str, lo: f64, hi: f64| -> Result<f64, ConfigError> {
            let x = *v.get_ref();
            if x.is_finite() && x > lo && x <= hi {
                Ok(x)
            } else {
                Err(err(v.span(), key, format!("{x} is outside ({lo}, {hi}]")))
            }
        };
        if let Some(v) = p.memory_safety {
            c.memory_safety = frac(v, "policy.memory_safety", 0.0, 1.0)?;
        }
        if let Some(v) = p.theta_train {
            let span = v.span();
            c.theta_train = theta_train(v.into_inner())
                .map_err(|what| err(span, "policy.theta_train", what))?;
        }
        if let Some(v) = p.harvest {
            c.harvest = v;
        }
        if let Some(v) = p.defer {
            c.defer = v;
        }
        if let Some(v) = p.turns {
            c.turns = v;
        }
        if let Some(v) = p.lambda {
            let x = *v.get_ref();
            if !(0.0..=1.0).contains(&x) {
                return Err(err(
                    v.span(),
                    "policy.lambda",
                    format!("{x} is outside [0, 1]"),
                ));
            }
            c.lambda = x;
        }
        if let Some(v) = p.min_share {
            if !(1..=100).contains(v.get_ref()) {
                return Err(err(
                    v.span(),
                    "policy.min_share",
                    format!("{} is outside 1..=100 %", v.get_ref()),
                ));
            }
            c.min_share = v.into_inner();
        }
        if let Some(v) = p.power_of_d {
            if *v.get_ref() == 0 {
                return Err(err(
                    v.span(),
                    "policy.power_of_d",
                    "must be at least 1".into(),
                ));
            }
            c.power_of_d = v.into_inner();
        }
        if let Some(v) = p.first_fit_queue {
            c.first_fit_queue = v.into_inner();
        }
        if let Some(v) = p.training_headroom {
            let span = v.span();
            c.training_headroom = parse_size(v.get_ref()).map_err(|_| {
                err(
                    span,
                    "policy.training_headroom",
                    format!("{:?} is not a size like \"2GiB\"", v.get_ref()),
                )
            })?;
        }
        if let Some(v) = p.training_headroom_fraction {
            let x = *v.get_ref();
            if !(x.is_finite() && (0.0..1.0).contains(&x)) {
                return Err(err(
                    v.span(),
                    "policy.training_headroom_fraction",
                    format!("{x} is outside [0, 1): a fraction of the training high-water mark"),
                ));
            }
            c.training_headroom_fraction = x;
        }
        if let Some(v) = p.reclaim_line {
            c.reclaim_line = frac(v, "policy.reclaim_line", 0.0, 1.0)?;
        }
        if c.reclaim_line < c.memory_safety {
            return Err(ConfigError(format!(
                "{name}: [policy] reclaim_line = {} is below memory_safety = {}: a node filled up to σ would sit on the reclaim line; set reclaim_line ≥ memory_safety",
                c.reclaim_line, c.memory_safety
            )));
        }
        if let Some(v) = p.reclaim_hold_s {
            let x = *v.get_ref();
            if !(x.is_finite() && x >= 0.0) {
                return Err(err(
                    v.span(),
                    "policy.reclaim_hold_s",
                    format!("{x} must be a non-negative number of seconds"),
                ));
            }
            c.reclaim_hold_s = x;
        }
        if let Some(v) = p.preempt_grace_ms {
            if *v.get_ref() > 600_000 {
                return Err(err(
                    v.span(),
                    "policy.preempt_grace_ms",
                    format!(
                        "{} ms is more than 10 minutes: training may not wait that long for memory",
                        v.get_ref()
                    ),
                ));
            }
            c.preempt_grace_ms = v.into_inner();
        }
        if let Some(v) = p.idle_after_s {
            let x = *v.get_ref();
            if !(x.is_finite() && x > 0.0) {
                return Err(err(
                    v.span(),
                    "policy.idle_after_s",
                    format!("{x} must be a positive number of seconds"),
                ));
            }
            c.idle_after_s = x;
        }
        c.catalog = p.catalog.map(PathBuf::from);
        c.model = p.model.map(PathBuf::from);
        if let Some(v) = raw.functions.default_slo_ms {
            let x = *v.get_ref();
            if !(x.is_finite() && x > 0.0) {
                return Err(err(
                    v.span(),
                    "functions.default_slo_ms",
                    format!("{x} must be a positive number of milliseconds"),
                ));
            }
            c.default_slo_ms = x;
        }
        if let Some(v) = raw.functions.default_memory {
            let span = v.span();
            c.default_memory =
                parse_size(v.get_ref())
                    .ok()
                    .filter(|b| *b > 0)
                    .ok_or_else(|| {
                        err(
                            span.clone(),
                            "functions.default_memory",
                            format!("{:?} is not a size like \"2GiB\"", v.get_ref()),
                        )
                    })?;
            if c.default_memory > MAX_DEFAULT_MEMORY {
                return Err(err(
                    span,
                    "functions.default_memory",
                    format!(
                        "{:?} is more than any GPU has (at most {}): give the memory a typical function needs, e.g. \"2GiB\"",
                        v.get_ref(),
                        smore_protocol::size::format_size(MAX_DEFAULT_MEMORY)
                    ),
                ));
            }
        }
        if let Some(v) = raw.functions.grants_per_process {
            if *v.get_ref() == 0 {
                return Err(err(
                    v.span(),
                    "functions.grants_per_process",
                    "0 would refuse every registration: give at least 1".into(),
                ));
            }
            c.grants_per_process = v.into_inner();
        }
        if let Some(b) = raw.functions.allow_root {
            c.allow_root = b;
        }
        if let Some(v) = raw.watchdog.kill_after_s {
            let x = *v.get_ref();
            if !(x.is_finite() && x > 0.0 && x <= 600.0) {
                return Err(err(
                    v.span(),
                    "watchdog.kill_after_s",
                    format!("{x} must be a number of seconds in (0, 600]: how long a function may ignore SIGTERM while breaking its grant"),
                ));
            }
            c.kill_after_s = x;
        }
        if let Some(a) = raw.watchdog.action {
            c.watchdog_action = a;
        }
        if let Some(v) = raw.watchdog.memory_slack {
            let span = v.span();
            c.memory_slack = parse_size(v.get_ref()).map_err(|_| {
                err(
                    span,
                    "watchdog.memory_slack",
                    format!("{:?} is not a size like \"64MiB\"", v.get_ref()),
                )
            })?;
        }
        if let Some(b) = raw.watchdog.check_shim {
            c.check_shim = b;
        }
        if let Some(p) = raw.prewarm.policy {
            let v = p.get_ref().trim().to_string();
            if v != "off" && smore_prewarm::policy::PolicySpec::parse(&v).is_err() {
                return Err(err(
                    p.span(),
                    "prewarm.policy",
                    format!(
                        "{v:?} is not a policy: use hhp, lsth, ls-lstm, last-value, fixed-N or off"
                    ),
                ));
            }
            c.prewarm_policy = v;
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_example_parses() {
        let text = include_str!("../../docs/node.example.toml");
        let c = Config::parse(text, "node.example.toml").unwrap();
        assert_eq!(c.memory_safety, 0.95);
        assert_eq!(c.theta_train, 0.10);
        assert_eq!(c.socket_mode, 0o660);
    }

    #[test]
    fn defaults_need_no_file() {
        let c = Config::parse("", "empty").unwrap();
        assert_eq!(c.memory_safety, 0.95);
        assert_eq!(c.failure_policy, FailurePolicy::FailOpen);
        assert_eq!(c.defer, DeferMode::Auto);
        assert_eq!(c.turns, TurnsMode::Auto);
    }

    #[test]
    fn deferral_is_auto_on_or_off_and_anything_else_is_refused_with_the_choices() {
        for (v, m, t) in [
            ("auto", DeferMode::Auto, TurnsMode::Auto),
            ("on", DeferMode::On, TurnsMode::On),
            ("off", DeferMode::Off, TurnsMode::Off),
        ] {
            let c = Config::parse(&format!("[policy]\ndefer = \"{v}\"\n"), "node.toml").unwrap();
            assert_eq!(c.defer, m);
            let c = Config::parse(&format!("[policy]\nturns = \"{v}\"\n"), "node.toml").unwrap();
            assert_eq!(c.turns, t);
        }
        let e = error_of("[policy]\nturns = \"sometimes\"\n");
        assert!(
            e.contains("turns") && e.contains("auto") && e.contains("off"),
            "{e}"
        );
        let e = error_of("[policy]\ndefer = \"sometimes\"\n");
        assert!(
            e.contains("defer") && e.contains("auto") && e.contains("off"),
            "{e}"
        );
    }

    #[test]
    fn socket_group_is_a_name_or_a_gid_and_an_unknown_name_is_refused() {
        let c = Config::parse("[arbiter]\nsocket_group = \"root\"\n", "node.toml").unwrap();
        assert_eq!(c.socket_group, Some(SocketGroup { gid: 0 }));
        let c = Config::parse("[arbiter]\nsocket_group = \"4242\"\n", "node.toml").unwrap();
        assert_eq!(c.socket_group, Some(SocketGroup { gid: 4242 }));
        assert_eq!(Config::parse("", "x").unwrap().socket_group, None);
        let e = error_of("[arbiter]\nsocket_group = \"no-such-group-smore\"\n");
        assert!(
            e.starts_with("node.toml:2:")
                && e.contains("arbiter.socket_group")
                && e.contains("groupadd"),
            "{e}"
        );
    }

    #[test]
    fn operators_are_users_and_groups_and_unknown_names_are_refused() {
        let c = Config::parse(
            "[arbiter]\noperators = [\"root\", \"4242\", \"@root\", \"@77\"]\n",
            "node.toml",
        )
        .unwrap();
        assert_eq!(c.operators.uids, vec![0, 4242]);
        assert_eq!(c.operators.gids, vec![0, 77]);
        assert!(c.operators.admits(4242, &[]));
        assert!(c.operators.admits(1000, &[5, 77]));
        assert!(!c.operators.admits(1000, &[5]));
        assert!(Config::default().operators.admits(0, &[]));
        for bad in ["\"no-such-user-smore\"", "\"@no-such-group-smore\""] {
            let e = error_of(&format!("[arbiter]\noperators = [{bad}]\n"));
            assert!(
                e.starts_with("node.toml:2:") && e.contains("arbiter.operators"),
                "{e}"
            );
        }
        let c = Config::parse(
            "[functions]\nallow_root = false\n[watchdog]\nkill_after_s = 0.5\n",
            "x",
        )
        .unwrap();
        assert!(!c.allow_root && Config::default().allow_root);
        assert_eq!(c.kill_after_s, 0.5);
        assert!(error_of("[watchdog]\nkill_after_s = 0\n").contains("watchdog.kill_after_s"));
    }

    #[test]
    fn a_default_memory_no_gpu_can_give_is_refused_against_the_gpus() {
        let c = Config::parse("[functions]\ndefault_memory = \"100GiB\"\n", "node.toml").unwrap();
        let e = c.check_against_gpus(&[80 << 30, 16 << 30]).unwrap_err().0;
        assert!(
            e.contains("functions.default_memory") && e.contains("2GiB"),
            "{e}"
        );
        assert!(c.check_against_gpus(&[141 << 30]).is_ok());
        assert!(
            c.check_against_gpus(&[]).is_ok(),
            "no GPU: nothing to check"
        );
        assert!(Config::default().check_against_gpus(&[16 << 30]).is_ok());
    }

    fn error_of(text: &str) -> String {
        Config::parse(text, "node.toml").unwrap_err().0
    }

    #[test]
    fn a_context_switch_cost_is_microseconds_up_to_the_page_bound() {
        assert_eq!(Config::parse("", "node.toml").unwrap().context_switch_ns, 0);
        // Timing noise: the H200's by default, each part settable, at most 300 µs.
        assert_eq!(
            Config::parse("", "node.toml").unwrap().timing_noise,
            TimingNoise::H200
        );
        let c = Config::parse("[gpus]\nwait_noise_us = 0\n", "node.toml").unwrap();
        assert_eq!(
            c.timing_noise,
            TimingNoise {
                wait_us: 0,
                stretch_us: 60
            }
        );
        let c = Config::parse("[gpus]\nwait_noise_us = 80\nstretch_noise_us = 0\n", "n").unwrap();
        assert_eq!((c.timing_noise.wait_us, c.timing_noise.stretch_us), (80, 0));
        let c = Config::parse("[gpus]\nwait_noise_us = 300\n", "n").unwrap();
        assert_eq!(c.timing_noise.wait_us, 300, "the bound itself is accepted");
        let e = error_of("[gpus]\nstretch_noise_us = 301\n");
        assert!(
            e.starts_with("node.toml:2:")
                && e.contains("stretch_noise_us")
                && e.contains("wait_jitter"),
            "{e}"
        );
        assert!(error_of("[gpus]\nwait_noise_us = -5\n").contains("wait_noise_us"));
        let c = Config::parse("[gpus]\ncontext_switch_us = 250\n", "node.toml").unwrap();
        assert_eq!(c.context_switch_ns, 250_000);
        let e = error_of("[gpus]\ncontext_switch_us = 20000\n");
        assert!(
            e.starts_with("node.toml:2:") && e.contains("context_switch_us") && e.contains("10000"),
            "{e}"
        );
        assert!(error_of("[gpus]\ncontext_switch_us = -1\n").contains("context_switch_us"));
    }

    #[test]
    fn errors_name_file_line_and_key() {
        let e = error_of("[arbiter]\nsocket = \"/x\"\n\n[policy]\nthetatrain = 0.1\n");
        assert!(e.starts_with("node.toml:5:"), "{e}");
        assert!(e.contains("thetatrain"), "{e}");
        let e = error_of("[policy]\nmemory_safety = 1.5\n");
        assert!(
            e.starts_with("node.toml:2:") && e.contains("policy.memory_safety"),
            "{e}"
        );
        let e = error_of("[functions]\ndefault_memory = \"lots\"\n");
        assert!(
            e.starts_with("node.toml:2:") && e.contains("default_memory"),
            "{e}"
        );
        let e = error_of("[arbiter]\nsocket_mode = \"rw\"\n");
        assert!(
            e.contains("node.toml:2:") && e.contains("socket_mode"),
            "{e}"
        );
        let e = error_of("[watchdog]\naction = \"nuke\"\n");
        assert!(e.starts_with("node.toml:2:") && e.contains("nuke"), "{e}");
        let e = error_of("[policy]\ntheta_train = \"ten\"\n");
        assert!(e.starts_with("node.toml:2:"), "{e}");
        let e = error_of("[mystery]\n");
        assert!(
            e.starts_with("node.toml:1:") && e.contains("mystery"),
            "{e}"
        );
        let e = error_of("[prewarm]\npolicy = \"crystal-ball\"\n");
        assert!(
            e.starts_with("node.toml:2:") && e.contains("prewarm.policy"),
            "{e}"
        );
        let e = error_of("[gpus]\ndiscover = false\n");
        assert!(e.contains("indices"), "{e}");
    }

    #[test]
    fn theta_train_is_a_fraction_or_a_percentage() {
        let parse = |v: &str| Config::parse(&format!("[policy]\ntheta_train = {v}\n"), "n");
        assert_eq!(parse("0.1").unwrap().theta_train, 0.1);
        assert_eq!(parse("1").unwrap().theta_train, 1.0);
        assert_eq!(parse("\"10%\"").unwrap().theta_train, 0.1);
        assert_eq!(parse("\"2.5 %\"").unwrap().theta_train, 0.025);
    }

    #[test]
    fn theta_train_above_one_is_refused_as_ambiguous() {
        let e = error_of("[policy]\ntheta_train = 10\n");
        assert!(
            e.starts_with("node.toml:2:")
                && e.contains("policy.theta_train")
                && e.contains("ambiguous"),
            "{e}"
        );
        let e = error_of("[policy]\ntheta_train = \"150%\"\n");
        assert!(e.contains("outside (0, 1]"), "{e}");
        let e = error_of("[policy]\ntheta_train = 0\n");
        assert!(e.contains("outside (0, 1]"), "{e}");
    }

    #[test]
    fn a_type_error_names_the_key() {
        let e = error_of("[arbiter]\nsocket = \"/x\"\n\n[policy]\nmemory_safety = \"ninety\"\n");
        assert!(
            e.starts_with("node.toml:5: key `policy.memory_safety`:") && e.contains("invalid type"),
            "{e}"
        );
        let e = error_of("[policy]\ntheta_train = \"ten percent\"\n");
        assert!(
            e.starts_with("node.toml:2: key `policy.theta_train`:"),
            "{e}"
        );
    }

    #[test]
    fn a_default_memory_larger_than_any_gpu_is_refused() {
        let e = error_of("[functions]\ndefault_memory = \"18446744073709551615\"\n");
        assert!(
            e.starts_with("node.toml:2:")
                && e.contains("functions.default_memory")
                && e.contains("more than any GPU"),
            "{e}"
        );
        let c = Config::parse("[functions]\ndefault_memory = \"80GiB\"\n", "n").unwrap();
        assert_eq!(c.default_memory, 80 << 30);
    }

    #[test]
    fn headroom_and_reclaim_keys_are_validated() {
        let c = Config::parse(
            "[policy]\ntraining_headroom = \"1GiB\"\ntraining_headroom_fraction = 0.2\nreclaim_line = 0.99\nreclaim_hold_s = 5\npreempt_grace_ms = 500\nidle_after_s = 3\n",
            "n",
        )
        .unwrap();
        assert_eq!(c.training_headroom, 1 << 30);
        assert_eq!(c.training_headroom_fraction, 0.2);
        assert_eq!(c.reclaim_line, 0.99);
        assert_eq!(c.reclaim_hold_s, 5.0);
        assert_eq!(c.preempt_grace_ms, 500);
        assert_eq!(c.idle_after_s, 3.0);
        let e = error_of("[policy]\ntraining_headroom = \"lots\"\n");
        assert!(
            e.starts_with("node.toml:2:") && e.contains("training_headroom"),
            "{e}"
        );
        let e = error_of("[policy]\nreclaim_line = 0.9\n");
        assert!(
            e.contains("reclaim_line") && e.contains("memory_safety"),
            "{e}"
        );
        let e = error_of("[policy]\ntraining_headroom_fraction = 1.5\n");
        assert!(e.contains("training_headroom_fraction"), "{e}");
    }
}

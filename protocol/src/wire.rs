//! The arbiter's Unix-socket protocol: messages and framing.
//!
//! Framing: each message is a 4-byte little-endian length followed by that many bytes of JSON.
//! JSON keeps the protocol debuggable (`socat` + `jq`) and easy for runtimes in any language; the
//! length prefix makes a malformed or truncated message detectable without a streaming parser.
//! Frames larger than [`MAX_FRAME`] are refused before anything is allocated for them.
//!
//! Identity never comes from a message: the arbiter reads the peer's pid and uid from
//! `SO_PEERCRED`. A `Register` therefore carries no pid. With a `Granted` reply the arbiter passes
//! the grant page (a sealed memfd) as `SCM_RIGHTS` ancillary data on the same `sendmsg`.
//!
//! Versioning: every request is sent inside an [`Envelope`] carrying [`PROTOCOL_VERSION`]; the
//! arbiter answers a different version with [`ErrorCode::Version`] and closes.

use serde::{de::DeserializeOwned, Deserialize, Serialize};
use std::io::{self, Read, Write};

/// Version of the messages below. Bump on any incompatible change.
pub const PROTOCOL_VERSION: u32 = 1;
/// Largest frame either side accepts, in bytes. Reasoning: the largest message is a status
/// snapshot of a full node (16 GPUs × a few hundred instances × ~200 B ≈ 1 MiB); requests are
/// far smaller. Status replies may use up to this; requests are checked against
/// [`MAX_REQUEST_FRAME`].
pub const MAX_FRAME: usize = 4 << 20;
/// Largest request frame the arbiter accepts, in bytes (a request is a few hundred bytes; a
/// latency report of 1 000 samples is ~10 KiB).
pub const MAX_REQUEST_FRAME: usize = 64 << 10;
/// Longest function name or model id the arbiter accepts, bytes. Reasoning: names are shown in
/// `status`, events and metrics labels; 128 bytes is far above any real name and keeps a status
/// snapshot of thousands of functions well under [`MAX_FRAME`].
pub const MAX_NAME: usize = 128;
/// Default socket path of the arbiter (`SMORE_ARBITER_SOCKET` and the config override it).
pub const DEFAULT_SOCKET: &str = "/run/smore/arbiter.sock";
/// Environment variable naming the arbiter socket.
pub const ENV_SOCKET: &str = "SMORE_ARBITER_SOCKET";
/// Environment variable through which `smore run` hands an already-registered connection to the
/// exec'd command (a file descriptor number, inherited across `exec`).
pub const ENV_CONN_FD: &str = "SMORE_ARBITER_FD";
/// Environment variable through which `smore run` hands the grant page fd to the exec'd command.
pub const ENV_GRANT_FD: &str = "SMORE_GRANT_FD";

/// A request with the sender's protocol version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope {
    /// The sender's [`PROTOCOL_VERSION`].
    pub v: u32,
    /// The request itself.
    #[serde(flatten)]
    pub req: Request,
}

impl Envelope {
    /// `req` at this crate's protocol version.
    pub fn new(req: Request) -> Envelope {
        Envelope {
            v: PROTOCOL_VERSION,
            req,
        }
    }
}

/// What a client may ask. Identity (pid, uid) comes from `SO_PEERCRED`, never from here.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Register the peer process as a function instance and ask for a grant.
    Register(Register),
    /// Attach this connection to an instance registered on another connection (a runtime inside
    /// a process `smore run` started): allowed only for that instance's process or a descendant
    /// of it (checked by `SO_PEERCRED`). Reports and admissions then refer to the instance;
    /// closing an attached connection does not release the grant. Answered with `Granted`
    /// (without a page fd).
    Attach {
        /// The instance registered on the other connection.
        instance: u64,
    },
    /// Request latencies observed by the runtime since the last report (milliseconds), and the
    /// shim's view of the device memory it holds (a hint: NVML is the authority).
    Report {
        /// Latencies of the requests finished since the last report, ms.
        #[serde(default)]
        latencies_ms: Vec<f64>,
        /// Device memory the shim counts as held, bytes (a hint).
        #[serde(default)]
        used_bytes: Option<u64>,
        /// Total time the shim held launches back, ns (cumulative).
        #[serde(default)]
        throttled_ns: Option<u64>,
        /// Allocations the shim refused (cumulative).
        #[serde(default)]
        refusals: Option<u64>,
        /// The reporting process's estimated GPU time on its granted device, ns (cumulative, the
        /// shim's harvest counters; a hint — NVML is the authority).
        #[serde(default)]
        gpu_ns: Option<u64>,
        /// The reporting process's estimated collision time with other contexts on that device,
        /// ns (cumulative; docs/harvest.md).
        #[serde(default)]
        contention_ns: Option<u64>,
        /// The reporting process's collision time as its samples measured it, ns (cumulative;
        /// what it was charged at admission is not refunded in `contention_ns`, and is not
        /// counted here: docs/harvest.md, "The estimate from what was measured"). The arbiter's
        /// slowdown estimate counts this when present, `contention_ns` otherwise. The shim sends
        /// it with every usage report, so it needs an arbiter that knows the field (`Request`
        /// refuses unknown fields; docs/protocol.md).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        measured_contention_ns: Option<u64>,
        /// Time the reporting process's shim held launches to wait out the training job's busy
        /// phase (deferral), ns (cumulative; docs/harvest.md, "Deferral").
        #[serde(default)]
        deferred_ns: Option<u64>,
        /// Time the reporting process's launches waited for their turn on the GPU, ns
        /// (cumulative; docs/harvest.md, "Serializing the functions"). Left out when none: an
        /// arbiter before it refuses fields it does not know.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        turn_waited_ns: Option<u64>,
        /// How many of the reporting process's launches cut in beside another function's turn
        /// on an MPS GPU (cumulative; docs/harvest.md, "Cut-ins under MPS"). Left out when none,
        /// like `turn_waited_ns`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        turn_cut_ins: Option<u64>,
        /// How far the reporting process's contention bucket ran ahead of now when it reported,
        /// ns (not cumulative): the arbiter's request admission mirrors that bucket and catches
        /// up with it (docs/harvest.md, "Context switches").
        #[serde(default)]
        contention_ahead_ns: Option<u64>,
        /// Whether the reporting process charges the collision bucket its grant's processes
        /// share (the grant's ledger table under `smore run`) rather than one of its own: the
        /// arbiter divides the function's budget only among processes with buckets of their own
        /// (docs/harvest.md, "Several processes of one function"). Left out when not.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        contention_shared: Option<bool>,
        /// Whether the reporting process gates its launches by the raw-share gate its grant's
        /// processes share (the grant's ledger table under `smore run`) rather than one of its
        /// own: the arbiter divides the function's raw share only among gates of their own
        /// (docs/shim.md, "One share per grant"). Left out when not, like `contention_shared`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        raw_shared: Option<bool>,
    },
    /// Request-level admission (SMORE style): may one more request run now?
    Admit {
        /// The runtime's request id (for its own correlation; the arbiter does not use it).
        #[serde(default)]
        request: Option<u64>,
        /// How long the request has already waited (queued at the runtime, earlier deferrals), ms.
        /// The arbiter refuses a request its shim would hold past the SLO (docs/harvest.md,
        /// "Request admission"); what it already waited counts against the SLO. It only moves
        /// this function's own requests: the budget its shim enforces does not change.
        #[serde(default)]
        waited_ms: Option<f64>,
    },
    /// Pre-warm hints for the functions of this node.
    Hints,
    /// Snapshot of the node: GPUs, training processes, functions, events.
    Status,
    /// Operator: change an instance's SM share (percent, 1..=100). Allowed for root or the
    /// arbiter's own uid.
    SetShare {
        /// The instance.
        instance: u64,
        /// The share, percent; 0 = back to the policy's share.
        share: u32,
    },
    /// Operator: change an instance's memory cap (bytes). Allowed for root or the arbiter's uid.
    SetMemory {
        /// The instance.
        instance: u64,
        /// The new cap, bytes.
        bytes: u64,
    },
    /// Give the grant back (a closed connection does the same).
    Release,
}

/// What a registration asks for, defaults not yet applied: the one definition the shim, `smore
/// run`, the C bindings and the arbiter share (the arbiter applies its config's defaults).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Register {
    /// Function name (what `status` shows; several instances may share it).
    pub function: String,
    /// Model id in the predictor's catalog (`unknown` when the runtime does not know).
    #[serde(default)]
    pub model: Option<String>,
    /// Latency SLO of one request, milliseconds.
    #[serde(default)]
    pub slo_ms: Option<f64>,
    /// Declared device memory need in bytes (the cap asked for).
    #[serde(default)]
    pub memory: Option<u64>,
    /// Instance id of an earlier grant this process held (re-registration after an arbiter
    /// restart): the arbiter keeps the same id, GPU and cap if they still fit.
    #[serde(default)]
    pub resume: Option<u64>,
    /// GPU index the instance already runs on (re-registration), so it is not moved.
    #[serde(default)]
    pub gpu: Option<u32>,
    /// Set by `smore run`: the command will be exec'd with `CUDA_VISIBLE_DEVICES` naming only
    /// the granted GPU, so the grant is written to page slot 0. Otherwise the slot is the
    /// GPU's NVML index (the process must then order devices by PCI bus id).
    #[serde(default)]
    pub exec: bool,
    /// The GPUs (NVML indices, in the order the process sees them as CUDA ordinals 0, 1, …)
    /// the process was given — a container that got some GPUs through CDI
    /// (`SMORE_GPUS`, docs/kubernetes.md). The arbiter places the instance on one of them only
    /// and, unless `exec`, writes the grant to the page slot of its position in this list.
    /// None: any GPU of the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<Vec<u32>>,
}

impl Register {
    /// The grant page slot of an instance placed on NVML index `gpu` (the one rule the arbiter
    /// writes by and the shim reads by): 0 under `smore run` (`exec`: the command sees only its
    /// GPU), else the GPU's position in [`Register::gpus`] (the process's CUDA ordinal for it),
    /// else the NVML index itself; capped to the page's last slot.
    pub fn slot_for(&self, gpu: u32) -> usize {
        let slot = match &self.gpus {
            _ if self.exec => 0,
            Some(only) => only.iter().position(|&i| i == gpu).unwrap_or(0),
            None => gpu as usize,
        };
        slot.min(crate::grant::MAX_DEVICES - 1)
    }
}

/// Environment variable naming the GPUs a container was given (comma-separated NVML indices,
/// e.g. `0` or `0,1`): set by the CDI spec of `smore cdi generate`, read by the shim into
/// [`Register::gpus`].
pub const ENV_GPUS: &str = "SMORE_GPUS";

/// Environment variable through which `smore run` tells the exec'd command the pid the arbiter
/// knows it by: `<pid in its own namespace>:<pid as the arbiter sees it>` (they differ in a
/// container). The first field lets a descendant that inherited the variable tell it is not
/// about itself.
pub const ENV_KNOWN_AS: &str = "SMORE_KNOWN_AS";

/// Environment variable through which `smore run` tells its command's descendants when the
/// process it exec'd started (clock ticks since boot, `/proc/<pid>/stat` field 22): with the
/// first field of [`ENV_KNOWN_AS`] it names that process, whatever became of the processes in
/// between — a worker whose launcher exited finds the grant there (docs/shim.md, "Workers
/// started with close_fds"); a pid reused since is another process.
pub const ENV_KNOWN_START: &str = "SMORE_KNOWN_START";

/// Parses a [`ENV_KNOWN_AS`] value into (own pid, pid as the arbiter sees it).
pub fn parse_known_as(s: &str) -> Option<(u32, u32)> {
    let (own, theirs) = s.trim().split_once(':')?;
    Some((own.parse().ok()?, theirs.parse().ok()?))
}

/// Parses a [`ENV_GPUS`] value: comma-separated NVML indices, at least one, no duplicates.
pub fn parse_gpu_list(s: &str) -> Option<Vec<u32>> {
    let mut out: Vec<u32> = Vec::new();
    for f in s.split(',') {
        let i: u32 = f.trim().parse().ok()?;
        if out.contains(&i) {
            return None;
        }
        out.push(i);
    }
    Some(out)
}

/// Why a registration was refused (also the exit code `smore run` uses, see `docs/cli.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefuseCode {
    /// No GPU has the memory (after σ, training use and other grants).
    NoMemory,
    /// Every GPU with memory would slow training beyond θ_train.
    TrainingBound,
    /// The function's SLO cannot be met on any GPU.
    Slo,
    /// The node has no GPU the arbiter manages.
    NoGpu,
    /// The request itself is invalid (e.g. memory 0 or larger than any GPU).
    Invalid,
}

impl RefuseCode {
    /// Exit code of `smore run` for this refusal (distinct from the command's own codes, which
    /// are conventionally < 64, and from 126/127 of the shell).
    pub fn exit_code(self) -> i32 {
        match self {
            RefuseCode::NoMemory => 75,
            RefuseCode::TrainingBound => 76,
            RefuseCode::Slo => 77,
            RefuseCode::NoGpu => 78,
            RefuseCode::Invalid => 79,
        }
    }
}

/// Error classes the arbiter answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The frame was not valid JSON for any request.
    Malformed,
    /// The frame exceeded the size limit.
    TooLarge,
    /// Different protocol version.
    Version,
    /// The request needs a registration first (or the instance is unknown).
    NotRegistered,
    /// The peer may not do this (operator requests from other uids).
    Forbidden,
    /// A registered process asked to register again.
    AlreadyRegistered,
    /// The value is out of range.
    Invalid,
    /// The arbiter failed internally; the message says how.
    Internal,
}

/// One grant, as the arbiter answers a registration. The page passed with it is the live copy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Grant {
    /// The instance id (what `resume`, `attach` and operator requests name).
    pub instance: u64,
    /// NVML index of the GPU (what `CUDA_VISIBLE_DEVICES` must name).
    pub gpu_index: u32,
    /// NVML UUID of the GPU.
    pub gpu_uuid: String,
    /// Device memory cap, bytes.
    pub memory_cap: u64,
    /// SM time share, percent.
    pub sm_share: u32,
    /// The page slot's generation when the grant was written (bumps on every change).
    pub generation: u64,
    /// Predicted slowdown of the GPU's training job with this instance (fraction), if predicted.
    #[serde(default)]
    pub predicted_train: Option<f64>,
    /// Predicted latency degradation of the function (fraction), if predicted.
    #[serde(default)]
    pub predicted_fn: Option<f64>,
    /// The rule that admitted the instance (shown by `status`).
    #[serde(default)]
    pub rule: String,
    /// What the function's shim does while this arbiter cannot be reached (the node's
    /// `[arbiter] failure_policy`): a floor — `FailClosed` wins over the process's own
    /// `SMORE_FAILURE=open` (docs/shim.md, "Failure policy"). `None` from an older arbiter.
    #[serde(default)]
    pub failure_policy: Option<FailurePolicy>,
    /// The instance's process as the arbiter knows it (`SO_PEERCRED`): its host pid when the
    /// arbiter runs in the host pid namespace — the pid NVML reports. A process in a container
    /// knows itself by another pid, and matches NVML's entries with this one
    /// (docs/kubernetes.md). None from arbiters before it was added.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// Whether the GPU's turn board (`smore_protocol::board`) travels with the grant, as the
    /// second `SCM_RIGHTS` fd after the grant page: the functions of a time-sliced GPU take
    /// turns through it (docs/harvest.md, "Serializing the functions"). False from arbiters
    /// before it was added.
    #[serde(default)]
    pub board: bool,
}

/// What a function's shim does while the arbiter cannot be reached: the node's
/// `[arbiter] failure_policy`, announced in every [`Grant`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FailurePolicy {
    /// Keep the last grant (or the environment contract) and go on.
    FailOpen,
    /// Refuse new device memory until the arbiter is back.
    FailClosed,
}

impl FailurePolicy {
    /// The shim's `SMORE_FAILURE` spelling (`open` / `closed`).
    pub fn env_value(self) -> &'static str {
        match self {
            FailurePolicy::FailOpen => "open",
            FailurePolicy::FailClosed => "closed",
        }
    }
}

/// Why the arbiter preempts an instance (docs/arbiter.md, "Memory headroom and reclaim").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PreemptReason {
    /// The instance was idle and its memory is needed by training: the cheapest to take back
    /// (its cost is one cold start later).
    Unload,
    /// Training on the instance's GPU grew past the reclaim line and caps lowered to what the
    /// functions use were not enough: a running instance gives its memory back.
    TrainingMemory,
}

impl PreemptReason {
    /// The name in status, events and metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            PreemptReason::Unload => "unload",
            PreemptReason::TrainingMemory => "training_memory",
        }
    }
}

/// What the prewarm policy advises for a function this minute (the arbiter converts
/// `smore_prewarm::policy::Action` into this; the protocol crate stays free of the prewarm stack).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HintAction {
    /// Load the model now: requests are expected.
    Load,
    /// Keep the model resident.
    Keep,
    /// The model may be unloaded.
    Unload,
}

/// A pre-warm hint for one function.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hint {
    /// Function name.
    pub function: String,
    /// What to do with the function's model.
    pub action: HintAction,
    /// Requests per minute the policy expects this minute; negative when the policy makes no
    /// forecast (histogram and keep-alive policies).
    pub forecast_rpm: f64,
}

/// What the arbiter answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum Reply {
    /// Registration accepted; the grant page fd travels as ancillary data.
    Granted(Grant),
    /// Registration refused.
    Refused {
        /// The class of refusal (and `smore run`'s exit code).
        code: RefuseCode,
        /// Why, for a person.
        reason: String,
    },
    /// Request-level admission decision.
    Admission {
        /// Whether the request may run now.
        admitted: bool,
        /// Predicted training slowdown (fraction), if predicted.
        #[serde(default)]
        predicted_train: Option<f64>,
        /// Predicted function latency degradation (fraction), if predicted.
        #[serde(default)]
        predicted_fn: Option<f64>,
        /// The rule behind the decision.
        reason: String,
    },
    /// The node's pre-warm hints.
    Hints {
        /// One per function the prewarm policy tracks.
        hints: Vec<Hint>,
    },
    /// A node snapshot (the schema is the arbiter's `status` JSON, documented in docs/cli.md).
    Status {
        /// The snapshot.
        snapshot: serde_json::Value,
    },
    /// The instance was preempted: every further request of it is refused. The runtime should
    /// finish (or fail, with this message) its in-flight request and exit within `grace_ms`;
    /// after that the arbiter kills its processes. New device allocations are already refused
    /// (its cap on the grant page is 0).
    Preempted {
        /// Why.
        reason: PreemptReason,
        /// What happened, for a person (and the error an in-flight request ends with).
        message: String,
        /// Milliseconds left before the arbiter enforces (0: already due).
        grace_ms: u64,
    },
    /// The request was carried out.
    Ok,
    /// The request failed.
    Error {
        /// The class of failure.
        code: ErrorCode,
        /// What went wrong and what to do.
        message: String,
    },
}

/// Errors of reading or writing a frame.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The peer closed the connection at a frame boundary.
    #[error("connection closed by peer (is the arbiter still running?)")]
    Closed,
    /// The frame announced more bytes than allowed.
    #[error("frame of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge {
        /// Announced length, bytes.
        len: usize,
        /// The limit, bytes.
        max: usize,
    },
    /// The bytes were not a valid message.
    #[error("malformed message: {0} (are both sides the same smore version?)")]
    Malformed(String),
    /// The socket failed.
    #[error("i/o error on the arbiter connection: {0}")]
    Io(io::Error),
}

impl From<io::Error> for WireError {
    fn from(e: io::Error) -> Self {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            WireError::Closed
        } else {
            WireError::Io(e)
        }
    }
}

/// Encodes `msg` as one frame (length prefix + JSON).
pub fn encode<T: Serialize>(msg: &T) -> Vec<u8> {
    // Serialising these plain data types cannot fail (no maps with non-string keys).
    let body = serde_json::to_vec(msg).unwrap_or_default();
    let mut out = Vec::with_capacity(4 + body.len());
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

/// Writes one frame.
pub fn write_frame<W: Write, T: Serialize>(w: &mut W, msg: &T) -> io::Result<()> {
    w.write_all(&encode(msg))?;
    w.flush()
}

/// Reads the 4-byte length prefix; `Closed` on a clean EOF before it.
pub fn read_len<R: Read>(r: &mut R, max: usize) -> Result<usize, WireError> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match r.read(&mut len[got..]) {
            Ok(0) if got == 0 => return Err(WireError::Closed),
            Ok(0) => return Err(WireError::Malformed("truncated length prefix".into())),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > max {
        return Err(WireError::TooLarge { len, max });
    }
    Ok(len)
}

/// Decodes a frame body.
pub fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, WireError> {
    serde_json::from_slice(body).map_err(|e| WireError::Malformed(e.to_string()))
}

/// Reads one frame of at most `max` bytes and decodes it.
pub fn read_frame<R: Read, T: DeserializeOwned>(r: &mut R, max: usize) -> Result<T, WireError> {
    let len = read_len(r, max)?;
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            WireError::Malformed(format!("truncated frame: expected {len} bytes"))
        } else {
            WireError::Io(e)
        }
    })?;
    decode(&body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fmt;

    fn roundtrip<T: Serialize + DeserializeOwned + PartialEq + fmt::Debug>(m: T) {
        let bytes = encode(&m);
        let back: T = read_frame(&mut &bytes[..], MAX_FRAME).unwrap();
        assert_eq!(back, m);
    }

    #[test]
    fn every_message_round_trips() {
        roundtrip(Envelope::new(Request::Register(Register {
            function: "resnet".into(),
            model: Some("resnet50".into()),
            slo_ms: Some(50.0),
            memory: Some(2 << 30),
            resume: None,
            gpu: None,
            exec: false,
            gpus: Some(vec![1, 3]),
        })));
        roundtrip(Reply::Hints {
            hints: vec![Hint {
                function: "f".into(),
                action: HintAction::Unload,
                forecast_rpm: -1.0,
            }],
        });
        roundtrip(Envelope::new(Request::Report {
            latencies_ms: vec![1.5, 2.0],
            used_bytes: Some(10),
            throttled_ns: None,
            refusals: Some(1),
            gpu_ns: Some(5_000_000),
            contention_ns: Some(1_000_000),
            measured_contention_ns: Some(400_000),
            deferred_ns: Some(2_000_000),
            turn_waited_ns: Some(300_000),
            turn_cut_ins: Some(7),
            contention_ahead_ns: Some(1_200_000_000),
            contention_shared: Some(true),
            raw_shared: Some(true),
        }));
        for r in [
            Request::Admit {
                request: Some(3),
                waited_ms: Some(1.5),
            },
            Request::Attach { instance: 4 },
            Request::Hints,
            Request::Status,
            Request::SetShare {
                instance: 1,
                share: 30,
            },
            Request::SetMemory {
                instance: 1,
                bytes: 5,
            },
            Request::Release,
        ] {
            roundtrip(Envelope::new(r));
        }
        roundtrip(Reply::Granted(Grant {
            instance: 7,
            gpu_index: 1,
            gpu_uuid: "GPU-x".into(),
            memory_cap: 1 << 30,
            sm_share: 40,
            generation: 2,
            predicted_train: Some(0.05),
            predicted_fn: None,
            rule: "fit".into(),
            failure_policy: Some(FailurePolicy::FailClosed),
            pid: Some(4242),
            board: true,
        }));
        roundtrip(Reply::Refused {
            code: RefuseCode::NoMemory,
            reason: "full".into(),
        });
        roundtrip(Reply::Error {
            code: ErrorCode::Malformed,
            message: "x".into(),
        });
        roundtrip(Reply::Ok);
        roundtrip(Reply::Preempted {
            reason: PreemptReason::TrainingMemory,
            message: "training grew".into(),
            grace_ms: 2000,
        });
    }

    #[test]
    fn a_registration_keeps_its_flat_wire_form_and_refuses_unknown_fields() {
        let bytes = encode(&Envelope::new(Request::Register(Register {
            function: "f".into(),
            exec: true,
            ..Register::default()
        })));
        let v: serde_json::Value = serde_json::from_slice(&bytes[4..]).unwrap();
        assert_eq!(v["op"], "register");
        assert_eq!(v["function"], "f");
        assert_eq!(v["exec"], true);
        let unknown = encode(&serde_json::json!({"v":1,"op":"register","function":"f","pid":1}));
        assert!(matches!(
            read_frame::<_, Envelope>(&mut &unknown[..], MAX_FRAME),
            Err(WireError::Malformed(_))
        ));
        let minimal = encode(&serde_json::json!({"v":1,"op":"register","function":"f"}));
        let e: Envelope = read_frame(&mut &minimal[..], MAX_FRAME).unwrap();
        assert_eq!(
            e.req,
            Request::Register(Register {
                function: "f".into(),
                ..Register::default()
            })
        );
    }

    #[test]
    fn the_wire_form_is_plain_json_with_a_version() {
        let bytes = encode(&Envelope::new(Request::Status));
        assert_eq!(&bytes[4..], br#"{"v":1,"op":"status"}"#);
        assert_eq!(
            u32::from_le_bytes(bytes[..4].try_into().unwrap()) as usize,
            bytes.len() - 4
        );
    }

    #[test]
    fn malformed_and_oversized_frames_are_errors_not_panics() {
        let mut junk = 5u32.to_le_bytes().to_vec();
        junk.extend_from_slice(b"{nope");
        assert!(matches!(
            read_frame::<_, Envelope>(&mut &junk[..], MAX_FRAME),
            Err(WireError::Malformed(_))
        ));
        let unknown_op = encode(&serde_json::json!({"v":1,"op":"launch_missiles"}));
        assert!(matches!(
            read_frame::<_, Envelope>(&mut &unknown_op[..], MAX_FRAME),
            Err(WireError::Malformed(_))
        ));
        let huge = (1u32 << 30).to_le_bytes();
        assert!(matches!(
            read_frame::<_, Envelope>(&mut &huge[..], MAX_REQUEST_FRAME),
            Err(WireError::TooLarge { .. })
        ));
        let truncated = {
            let mut b = encode(&Envelope::new(Request::Status));
            b.truncate(b.len() - 3);
            b
        };
        assert!(matches!(
            read_frame::<_, Envelope>(&mut &truncated[..], MAX_FRAME),
            Err(WireError::Malformed(_))
        ));
        assert!(matches!(
            read_frame::<_, Envelope>(&mut &[][..], MAX_FRAME),
            Err(WireError::Closed)
        ));
    }

    #[test]
    fn refusal_exit_codes_are_distinct() {
        let codes = [
            RefuseCode::NoMemory,
            RefuseCode::TrainingBound,
            RefuseCode::Slo,
            RefuseCode::NoGpu,
            RefuseCode::Invalid,
        ]
        .map(RefuseCode::exit_code);
        let mut s = codes.to_vec();
        s.sort();
        s.dedup();
        assert_eq!(s.len(), codes.len());
    }

    #[test]
    fn gpu_lists_parse_and_an_absent_list_stays_off_the_wire() {
        assert_eq!(parse_gpu_list("0"), Some(vec![0]));
        assert_eq!(parse_gpu_list(" 3, 1"), Some(vec![3, 1]));
        assert_eq!(parse_known_as("1:4242"), Some((1, 4242)));
        assert_eq!(parse_known_as("1"), None);
        assert_eq!(parse_known_as("x:1"), None);
        let mut r = Register {
            gpus: Some(vec![3, 1]),
            ..Default::default()
        };
        assert_eq!((r.slot_for(1), r.slot_for(3)), (1, 0));
        r.exec = true;
        assert_eq!(r.slot_for(1), 0);
        r.exec = false;
        r.gpus = None;
        assert_eq!((r.slot_for(5), r.slot_for(99)), (5, 15));
        for bad in ["", "a", "0,,1", "1,1", "-1"] {
            assert_eq!(parse_gpu_list(bad), None, "{bad:?}");
        }
        let r = Envelope::new(Request::Register(Register {
            function: "f".into(),
            ..Default::default()
        }));
        let text = String::from_utf8(encode(&r)[4..].to_vec()).unwrap();
        assert!(
            !text.contains("gpus"),
            "older arbiters refuse unknown fields: {text}"
        );
    }
}

//! The runtime layer, between the hooks above and the safe core and `sys` below: the per-process
//! [`Runtime`] (configuration, limits view, ledger, gates, cost table, sampler), its lazy
//! initialisation (which registers with the arbiter through `client`, starts the `watch`er, and
//! registers [`after_fork_child`] with `sys::os`), and the reset in a fork child.
//!
//! Owns the enforcement decisions: reserve/commit/rollback around allocations, the virtualised
//! memory info, launch admission (raw share and, in harvest mode, deferral and the contention
//! bucket) and event sampling (costs, queueing waits, collisions), the calibration of estimates
//! against NVML (≤ 2 per s per device, on a sampled launch), the usage counters, the footprint
//! charge of every context, the charge of what memory pools reserve (refreshed from the driver)
//! and of graph memory nodes from instantiation to destruction.
//! Must never: call the real driver twice for one hooked call, take a lock on the launch path
//! except the sampler's (a `try_lock` on a periodic sample, ≤ 1 per ms; a blocking lock only
//! around the first, unmeasured launch of a kernel or graph and around a probe after a capped
//! contention hold or for deferral), sleep a launch on an unthrottled device, or hold a launch
//! for deferral past the latest start the arbiter wrote for its request. (The opt-in sample
//! trace, `SMORE_TRACE_SAMPLES`, writes its file under the sampler's lock about once a second.)

use crate::client::{self, Source};
use crate::config::{self, Config, FailurePolicy, Level};
use crate::gate::{CostTable, SampleClock, SharedGate, PPM, SAMPLE_PERIOD_NS};
use crate::harvest::{
    self, Backlog, Calibration, Chained, Chains, Collision, Contention, Defer, Deferral, InDebt,
    Link, Usage, UsageCounters,
};
use crate::ledger::{graph_exec_key, Kind, Ledger, OverCap, PoolFree, Reservation};
use crate::limits::{self, GrantPage, MAX_DEVICES};
use crate::log::{self, RateLimit};
use crate::shared_ledger::FirstContext;
use crate::sys::{driver, os};
use crate::trace::{self, SampleTrace};
use crate::turns::{self, Seat, Take};
use smore_protocol::board::{process_tag, TurnBoard};
use smore_protocol::phase;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering::*};
use std::sync::{Mutex, TryLockError};

/// `CUDA_ERROR_OUT_OF_MEMORY`.
pub const CUDA_ERROR_OUT_OF_MEMORY: u32 = 2;
/// `CUDA_ERROR_NOT_PERMITTED` (cuda.h: "the attempted operation is not permitted"): a launch on
/// a device the grant does not cover.
pub const CUDA_ERROR_NOT_PERMITTED: u32 = 800;
/// `CUDA_ERROR_NOT_READY` (cuEventQuery on pending work).
const CUDA_ERROR_NOT_READY: u32 = 600;
/// Outstanding sampled event pairs before sampling pauses (a deep queue means samples complete
/// late; more pending pairs would only cost events). Reasoning: 8 × 1 ms period ≥ the time
/// queued work takes to drain at typical shares.
const MAX_PENDING: usize = 8;
/// Event pairs kept per context for reuse.
const POOL_PER_CTX: usize = 8;
/// Poll period while waiting for a first measurement: 20 µs (reasoning: well under the shortest
/// kernels worth gating, ~5 µs of CPU per poll at most).
const UNMEASURED_POLL_NS: u64 = 20_000;

/// How often the estimated GPU time of a device is compared with the driver's per-process
/// accounting: 500 ms (reasoning: NVML's utilization samples are ~1/6 s apart, so a window holds
/// ~3 of them; a few windows settle the calibration within the first seconds of a run).
const CALIBRATION_PERIOD_NS: u64 = 500_000_000;

/// A calibration window longer than this is not judged but begins anew: 30 s. Reasoning: a
/// process that launched nothing sampled for longer has NVML samples for the end of the gap
/// only, and the first would be taken to cover all of it (found by review, 2026-11-28: after
/// hours idle the sums overflowed); shorter gaps are judged as before, since a process whose
/// sampled launches come further apart than this would otherwise never be calibrated (within
/// 30 s the sums stay far from overflowing: 30 s × 100 % in ns × 10⁶ ppm < 2⁶⁴).
const CALIBRATION_STALE_NS: u64 = 30_000_000_000;

/// Every process's NVML figures in the window `(ts0, last]` (µs), summed, as ppm of the window:
/// each sample covers the time since the previous sample of its process (the first one, since
/// `ts0`). At most [`PPM`] when each figure is the process's own time on the device.
fn window_sum_ppm(samples: &[driver::ProcessUtilization], ts0: u64, last: u64) -> u64 {
    if last <= ts0 {
        return 0;
    }
    let mut prev: [(u32, u64); driver::MAX_UTIL_SAMPLES] = [(0, 0); driver::MAX_UTIL_SAMPLES];
    let mut known = 0;
    let mut sorted: [driver::ProcessUtilization; driver::MAX_UTIL_SAMPLES] =
        [driver::ProcessUtilization::default(); driver::MAX_UTIL_SAMPLES];
    let n = samples.len().min(driver::MAX_UTIL_SAMPLES);
    sorted[..n].copy_from_slice(&samples[..n]);
    sorted[..n].sort_by_key(|u| u.ts_us);
    let mut ns = 0u64;
    for u in sorted[..n]
        .iter()
        .filter(|u| u.ts_us > ts0 && u.ts_us <= last)
    {
        let slot = match prev[..known].iter().position(|&(p, _)| p == u.pid) {
            Some(i) => i,
            None => {
                prev[known] = (u.pid, ts0);
                known += 1;
                known - 1
            }
        };
        let since = prev[slot].1;
        ns += (u.ts_us - since) * 1000 * u64::from(u.sm_util.min(100)) / 100;
        prev[slot].1 = u.ts_us;
    }
    ns * PPM as u64 / ((last - ts0) * 1000)
}

/// The device's utilization samples (µs, percent) integrated over the window `(ts0, last]`, as
/// ppm of the window: each sample covers the time since the previous one (the first, since
/// `ts0`).
fn device_window_ppm(samples: &[(u64, u32)], ts0: u64, last: u64) -> u64 {
    if last <= ts0 {
        return 0;
    }
    let (mut prev, mut ns) = (ts0, 0u64);
    for &(ts, pct) in samples.iter().filter(|&&(ts, _)| ts > ts0 && ts <= last) {
        ns += ts.saturating_sub(prev) * 1000 * u64::from(pct.min(100)) / 100;
        prev = prev.max(ts);
    }
    ns * PPM as u64 / ((last - ts0) * 1000)
}

/// What a calibration window lets the calibrated estimate be, as the rate the calibration
/// observes (ppm of the device), or `None` when the estimate already agrees with the window.
///
/// `mine`: this process's NVML figure; `others`: every other process's, summed; `device`: the
/// device's utilization over the window (None: NVML gave none); all ppm. Under MPS, or with no
/// other process in the window, `mine` is this process's own time and is taken as it is. On a
/// time-sliced device beside others it is only an upper bound — a real H200 counted another
/// context's time in it (docs/real-gpu.md, section 8) — and the device's busy time minus the
/// others' figures is a lower bound (each figure is at least its process's own time). The
/// estimate is moved only as far as the bounds prove: up to the lower one, down to the upper
/// one. Where the figures are each process's own time the bounds meet and this is `mine`.
fn calibration_target(
    calibrated: u64,
    mine: u64,
    others: u64,
    device: Option<u64>,
    mps: bool,
) -> Option<u64> {
    if mps || others == 0 {
        return Some(mine);
    }
    let lower = device.map_or(0, |d| d.saturating_sub(others)).min(mine);
    if calibrated < lower {
        Some(lower)
    } else if calibrated > mine {
        Some(mine)
    } else {
        None
    }
}

/// Everything the hooks need, for one process image (a fork child gets a new one).
pub struct Runtime {
    /// The environment contract as parsed (after the failure policy was applied).
    pub config: Config,
    /// False when the configuration was invalid under the fail-open policy: pure pass-through.
    pub enforcing: bool,
    /// The live limits page (standalone: process-local; arbiter mode: the arbiter's mapping).
    /// Swapped whole by the arbiter watcher (`watch`, handed this reference at its start) after
    /// a re-registration or a fail-closed transition; pages are leaked, never unmapped, so a
    /// reader's reference stays valid.
    limits: os::StaticRef<GrantPage>,
    /// This process's seat on its GPU's turn board (none: no board, or no seat), swapped by the
    /// watcher with the page after a re-registration; seats are leaked, never freed.
    turns: os::StaticRef<Option<Seat<'static>>>,
    /// Device memory this process holds, per device and per handle.
    pub ledger: Ledger,
    gates: [SharedGate; MAX_DEVICES],
    /// Per device: the collision probability of recent launches.
    collision: [Collision; MAX_DEVICES],
    /// Per device: the contention bucket (harvest mode).
    contention: [Contention; MAX_DEVICES],
    /// Per device: the multiplier on estimated GPU time from the driver's accounting.
    calibration: [Calibration; MAX_DEVICES],
    /// Per device: uncalibrated estimated GPU ns of admitted launches (the calibration's input).
    estimated: [AtomicU64; MAX_DEVICES],
    /// Per device: what the launches used, as estimated ([`Runtime::usage`]).
    usage: [UsageCounters; MAX_DEVICES],
    /// Learned GPU time per kernel / graph.
    pub costs: CostTable,
    sample_clock: SampleClock,
    sampler: Mutex<Sampler>,
    ctx_charged: [AtomicBool; MAX_DEVICES],
    /// Per device: the footprint of one context, bytes (the first one measured; 0 = unknown).
    /// Every further context is charged at least this much, and refused before the driver is
    /// asked when it would not fit.
    ctx_footprint: [AtomicU64; MAX_DEVICES],
    window_ns: u64,
    /// Serialises stream-ordered (pool) allocations of this process, so a pool's reservation
    /// read after one is that allocation's doing (frees and trims only lower it).
    pool_serial: Mutex<()>,
    /// Allocations refused over the cap (for reports and tests).
    pub refusals: AtomicU64,
    /// Launches of never-measured keys whose measurement is still in flight.
    unmeasured: AtomicU64,
    /// Probe launches (after a capped contention hold or a deferral) whose measurement is still
    /// in flight.
    probing: AtomicU64,
    /// Per device: deferral's state (last probe and hold, how often holds succeed).
    deferral: [Deferral; MAX_DEVICES],
    /// Per device: this process's queued GPU work, harvest mode ([`harvest::BACKLOG_HORIZON_NS`]).
    backlog: [Backlog; MAX_DEVICES],
    /// Per device, harvest mode: the stream last launched on (handle, `_ptsz` in the top bit)
    /// and how often that changed ([`Link::stream_changes`]).
    last_stream: [AtomicU64; MAX_DEVICES],
    stream_changes: [AtomicU64; MAX_DEVICES],
    /// Per CUDA ordinal: its GPU's UUID (two words) once asked of the driver, and whether it is
    /// known ([`Runtime::device_slot`]).
    dev_uuid: [[AtomicU64; 2]; MAX_DEVICES],
    dev_uuid_known: [AtomicBool; MAX_DEVICES],
    /// Per CUDA ordinal: NVML listed this process as an MPS client at the last calibration (its
    /// MPS process list, read on the sampled path at most once per [`CALIBRATION_PERIOD_NS`];
    /// false until then, and without NVML). The solo floor ([`CostTable::solo`]) and cut-ins
    /// ([`turns::Urgency`]) apply under MPS only; a page's MPS counts only with it
    /// ([`Runtime::sharing`]).
    runs_mps: [AtomicBool; MAX_DEVICES],
}

#[derive(Default)]
struct Sampler {
    /// (context, free event pairs).
    pools: Vec<(usize, Vec<(usize, usize)>)>,
    pending: Vec<Pending>,
    /// Per device: where the last calibration window ended.
    calibrated: [CalibrationMark; MAX_DEVICES],
    /// Per device: when the next calibration may run (CLOCK_MONOTONIC ns).
    calibrate_next: [u64; MAX_DEVICES],
    /// Per context: the reference for queueing delays.
    clock_refs: Vec<ClockRef>,
    /// (context, device) of every context sampled: which contexts a primary context's
    /// destruction of a device may have taken with it.
    ctx_devices: Vec<(usize, usize)>,
    /// Per device: where the launches an unchained sample stands for begin ([`Settled`]).
    settled: [Settled; MAX_DEVICES],
    /// The opt-in trace of settled samples (`SMORE_TRACE_SAMPLES`, [`crate::trace`]).
    trace: Option<SampleTrace>,
    /// Per stream, the last settled sample ([`Chains`]).
    chains: Chains,
}

/// The end of a device's last calibration window: (wall ns, estimated ns counter, NVML sample
/// timestamp µs). `None`: no baseline yet.
type CalibrationMark = Option<(u64, u64, u64)>;

/// What a sampled launch was charged, to settle when its measurement arrives.
#[derive(Clone, Copy)]
struct PendingMeta {
    key: u64,
    dev: usize,
    /// When it was admitted (CLOCK_MONOTONIC ns): a late charge counts from there, so the
    /// bucket's credit for the time the launch ran is not lost.
    admitted: u64,
    /// GPU ns the gate was charged at admission (calibrated).
    charged: u64,
    /// The key had no measurement yet (the gate holds further launches until it has one).
    unmeasured: bool,
    /// A probe after a capped contention hold or a deferral (further launches wait for its
    /// measurement).
    probe: bool,
    /// It went beside another function's turn (a cut-in, [`turns::Take::CutIn`]): what it
    /// waited may be behind that function, so its sample says nothing of the trainer's phase.
    without_turn: bool,
}

struct Pending {
    meta: PendingMeta,
    ctx: usize,
    a: usize,
    b: usize,
    /// CLOCK_MONOTONIC ns just before the start event was recorded.
    submitted: u64,
    /// The stream had none of our work queued when the start event was recorded.
    idle: bool,
    /// CLOCK_MONOTONIC ns just after the launch call returned.
    launched: u64,
    /// The last time its end event was seen not yet complete (CLOCK_MONOTONIC ns; `launched`
    /// until then): a lower bound on when the launch ended, whatever its stream held before it.
    not_done_at: u64,
    /// Its stream's queue ([`queue_key`]): the key of its chain ([`Chains`]).
    stream: (usize, bool),
    /// The device's estimated GPU time admitted before this launch and with it
    /// ([`Usage::gpu_ns`]): the process's own work between two samples of a stream.
    pushed_before: u64,
    pushed_after: u64,
    /// The device's contention charged at admission, this launch included
    /// ([`UsageCounters::admitted_contention_ns`]).
    paid_after: u64,
    /// [`Link::stream_changes`] when it was launched.
    stream_changes: u64,
}

/// A point in a device's admitted launches: its estimated GPU time ([`Usage::gpu_ns`]) and the
/// contention charged at admission ([`UsageCounters::admitted_contention_ns`]) up to there. An
/// unchained sample stands for the launches admitted since the last such point — the last
/// settled sample, or a chained one's launch, whichever came later — and what they were charged
/// at admission is what they paid.
#[derive(Clone, Copy, Debug, Default)]
struct Settled {
    gpu_ns: u64,
    paid_ns: u64,
}

/// What is known of a settled sample ([`Runtime::settle`]).
#[derive(Clone, Copy, Debug)]
struct Measured {
    /// Its measured GPU time, ns.
    ns: u64,
    /// How long it waited for the GPU before starting, when known (an idle stream).
    wait: Option<u64>,
    /// Its chained wait, when its stream had work throughout since its previous sample.
    chained: Option<Chained>,
    /// Where it was launched in the device's admitted launches.
    launched: Settled,
    /// When it ended, about ([`harvest::ran_until`]).
    ran_until: u64,
}

/// How a measured sample was judged ([`Runtime::settle`]).
#[derive(Clone, Copy, Debug)]
struct Judged {
    /// Its solo cost, ns.
    d0_ns: u64,
    /// Its collision time, ns.
    collided_ns: u64,
    /// Whether it was charged context switches.
    handover: bool,
}

/// A context's reference for queueing delays: a kept start event, its submission time, and the
/// smallest `(GPU time since the reference) − (CPU time since its submission)` seen — the offset
/// of a launch that did not wait (see [`Sampler::queue_wait`]).
struct ClockRef {
    ctx: usize,
    event: usize,
    submitted: u64,
    min_offset_ns: i64,
}

/// The queue a launch on `stream` (`ptsz`: through a `_ptsz` variant) goes to: the stream, or for
/// the calling thread's default stream — one handle, a different queue on each thread — that
/// thread (`(thread, true)`: a thread's identity is the address of its descriptor, never a live
/// stream's handle).
#[inline]
fn queue_key(stream: usize, ptsz: bool) -> (usize, bool) {
    if driver::per_thread_stream(stream, ptsz) {
        (os::thread_id(), true)
    } else {
        (stream, ptsz)
    }
}

static RUNTIME: os::LeakedSlot<Runtime> = os::LeakedSlot::new();
/// Configuration errors are reported once per process tree, not again in fork children.
static REPORTED: AtomicBool = AtomicBool::new(false);
static OVERCAP_LOG: RateLimit = RateLimit::new();
static UNACCOUNTED_LOG: RateLimit = RateLimit::new();

/// The runtime, initialising it on first use.
#[inline]
pub fn get() -> &'static Runtime {
    match RUNTIME.get() {
        Some(r) => r,
        None => init(),
    }
}

/// The runtime if it is initialised (no initialisation: the launch fast path's first look).
#[inline]
pub fn peek() -> Option<&'static Runtime> {
    RUNTIME.get()
}

/// The runtime if it enforces anything.
#[inline]
pub fn enforcing() -> Option<&'static Runtime> {
    Some(get()).filter(|r| r.enforcing)
}

/// The runtime if some device's launches are throttled (the launch fast path is `None`).
#[inline]
pub fn throttling() -> Option<&'static Runtime> {
    let r = get();
    (r.enforcing && !limits::none_throttled(r.limits())).then_some(r)
}

/// 0: not initialised; 1: a thread is initialising; 2: done. Reset in a fork child.
static INIT: AtomicU8 = AtomicU8::new(0);

#[cold]
fn init() -> &'static Runtime {
    loop {
        if let Some(r) = RUNTIME.get() {
            return r;
        }
        if INIT.compare_exchange(0, 1, AcqRel, Acquire).is_ok() {
            break;
        }
        // Another thread registers / parses: wait for it (once per process, bounded by the
        // arbiter timeout) rather than registering twice.
        std::thread::yield_now();
    }
    let env = |k: &str| std::env::var(k).ok();
    let parsed = config::parse(env);
    // Before the grant is looked for, so that what that says is said at the configured level.
    log::set_level(parsed.config.log);
    let (source, resume, page_file) = client::source(env, &parsed.config);
    // An inherited grant without its registration's connection (a worker started with
    // `close_fds`): it reports, as a fork child does.
    let report_only = (resume.is_none() && matches!(source, Source::Arbiter(..)))
        .then(|| client::report_only(env))
        .flatten();
    let shared = matches!(source, Source::Arbiter(..))
        .then(|| shared_ledger(env))
        .flatten();
    let (board, arbiter_page) = match &source {
        Source::Arbiter(p, b) => (*b, Some(*p)),
        _ => (None, None),
    };
    let mut rt = Runtime::build(parsed.config, &parsed.errors, source);
    let slot = resume.as_ref().map_or(0, |r| r.slot);
    set_board(&rt.turns, board, slot, rt.limits());
    if let Some(path) = env("SMORE_TRACE_SAMPLES") {
        match SampleTrace::open(&path, os::pid(), os::now_ns()) {
            Ok(t) => {
                rt.sampler
                    .get_mut()
                    .unwrap_or_else(|e| e.into_inner())
                    .trace = Some(t)
            }
            Err(e) => log::line(
                Level::Warn,
                format_args!("SMORE_TRACE_SAMPLES: {e}; samples are not traced"),
            ),
        }
    }
    // A fork child sets it again: its claim is its own.
    crate::watch::set_allocations_refused(matches!(shared, Some(Err(_))));
    match shared {
        Some(Ok(group)) => rt.ledger = Ledger::shared(group),
        Some(Err(e)) => {
            log::line(
                Level::Error,
                format_args!("{e}; every device allocation is refused"),
            );
            let page = rt.limits();
            let shares: [u32; MAX_DEVICES] = std::array::from_fn(|d| page.share(d));
            let budgets: [u32; MAX_DEVICES] = std::array::from_fn(|d| page.contention(d));
            let closed = limits::standalone(&[0; MAX_DEVICES], &shares, &budgets, 0);
            for d in 0..MAX_DEVICES {
                closed.set_switch(d, page.switch(d));
                closed.set_timing_noise(d, page.timing_noise(d));
                // No mode: nothing updates this page again, and a GPU whose MPS daemon quits
                // would be judged as MPS for good (found by review, 2026-11-28). Not known is
                // the side that counts every wait.
                closed.set_sharing(d, None);
                if let Some(u) = page.slot_uuid(d) {
                    closed.set_slot_uuid(d, u);
                }
                // Its launches still take turns.
                closed.set_turn_seat(d, page.turn_seat(d));
            }
            rt.limits.set(closed);
        }
        None => {}
    }
    let rt = RUNTIME.install(Box::new(rt));
    INIT.store(2, Release);
    os::register_atfork(after_fork_child);
    let policy = rt.config.policy;
    let follow = |socket, instance, slot| crate::watch::Follow {
        socket,
        instance,
        slot,
        page: page_file,
        policy,
    };
    if let Some((socket, instance)) = report_only {
        let held = arbiter_page.unwrap_or(rt.limits());
        let f = follow(socket, instance, 0);
        crate::watch::spawn_follower(f, held, &rt.limits, usage, board_to);
    }
    if let Some(r) = resume {
        if r.exec && FORKED.load(Acquire) {
            // A fork child of the process `smore run` registered: it shares that process's
            // grant page, but the registration (and its resumption) is the parent's.
            os::close_fd(r.conn);
            let f = follow(r.socket.clone(), r.instance, r.slot);
            let held = arbiter_page.unwrap_or(rt.limits());
            crate::watch::spawn_follower(f, held, &rt.limits, usage, board_to);
        } else {
            crate::watch::spawn(rt.config.policy, &rt.limits, r, usage, board_to);
        }
    }
    rt
}

/// No seat on a turn board.
static NO_SEAT: Option<Seat<'static>> = None;

/// Seats this process on `board` (the GPU's turn board that came with the grant) at its
/// function's seat — the one the arbiter wrote into `page` for grant-page slot `slot` — and makes
/// it `turns`'s; none without a board or a seat.
fn set_board(
    turns: &os::StaticRef<Option<Seat<'static>>>,
    board: Option<&'static TurnBoard>,
    slot: usize,
    page: &GrantPage,
) {
    let seat = board
        .zip(page.turn_seat(slot))
        .and_then(|(b, member)| Seat::new(b, member, process_tag(os::pid()), slot));
    match seat {
        Some(seat) => turns.set(Box::leak(Box::new(Some(seat)))),
        None => {
            if board.is_some() {
                log::line(
                    Level::Info,
                    format_args!(
                        "turn board: the grant gives this function no seat; it runs without turns"
                    ),
                );
            }
            turns.set(&NO_SEAT);
        }
    }
}

/// The watcher's hook for the turn board of a new grant (after a re-registration).
fn board_to(board: Option<&'static TurnBoard>, slot: usize) {
    if let Some(rt) = peek() {
        set_board(&rt.turns, board, slot, rt.limits());
    }
}

/// This process's slot in its grant's shared ledger (`SMORE_LEDGER_FD`, set by `smore run` next
/// to the grant page; issue 12 item 4): every process holding the grant — the exec'd one, its
/// fork children, descendants that exec — charges the grant's one cap. `None` without the
/// variable (a self-registered process has a grant of its own); `Some(Err)` when the process
/// cannot join: every slot held by a live process, a table that cannot be mapped, or life that
/// cannot be judged here (`ClaimError`) — it then refuses every allocation.
fn shared_ledger(
    env: impl Fn(&str) -> Option<String>,
) -> Option<Result<crate::shared_ledger::Group, crate::shared_ledger::ClaimError>> {
    use smore_protocol::ledger::{owner_word, ENV_LEDGER_FD};
    let v = env(ENV_LEDGER_FD)?;
    let table = v
        .trim()
        .parse::<i32>()
        .map_err(|_| format!("{ENV_LEDGER_FD}={v:?} is not a file descriptor number"))
        .and_then(|fd| {
            client::map_inherited(
                &env,
                ENV_LEDGER_FD,
                fd,
                ("smore-ledger", true),
                crate::sys::grant::map_ledger_fd,
            )
        })
        .map(|(table, _)| table);
    // A process that cannot join the grant's table refuses every allocation: a ledger of its
    // own would give it a cap beside the grant's (found by review, 2026-11-29).
    let table = match table {
        Ok(t) => t,
        Err(e) => {
            log::line(Level::Error, format_args!("{ENV_LEDGER_FD}: {e}"));
            return Some(Err(crate::shared_ledger::ClaimError::Unusable));
        }
    };
    let me = os::pid();
    // The group tells a member's life by `/proc/<pid>` (`os::owner_alive`): only where `/proc`
    // names processes by the pids they know themselves by, and only for members of this pid
    // namespace (`LedgerTable::slot_ns`). A process that cannot judge the others refuses every
    // allocation, as one that finds the table full does: a ledger of its own would give it a
    // cap beside the grant's.
    if !os::proc_is_ours() {
        return Some(Err(crate::shared_ledger::ClaimError::ForeignProc));
    }
    let ns = smore_protocol::ledger::own_pid_namespace();
    if ns == 0 {
        return Some(Err(crate::shared_ledger::ClaimError::NamespaceUnknown));
    }
    let start = match os::start_ticks(me) {
        Ok(Some(t)) => t,
        _ => return Some(Err(crate::shared_ledger::ClaimError::StartUnknown)),
    };
    Some(crate::shared_ledger::Group::claim(
        table,
        owner_word(me, start),
        ns,
        os::owner_alive,
    ))
}

/// Set in a fork child (until it execs): such a process does not own an inherited grant.
static FORKED: AtomicBool = AtomicBool::new(false);

/// Fork child: forget the parent's runtime (its allocations, contexts and events are not the
/// child's) without locking or freeing; the next hook call initialises a fresh one. The parent's
/// arbiter watcher thread does not exist in the child: a child that registers itself
/// (`SMORE_ARBITER_SOCKET`) gets its own watcher; a child sharing an inherited `smore run` grant
/// gets a thread that reports and follows the grant (`watch::follow`: its parent re-registers,
/// the child takes the restarted arbiter's page through its report connection).
pub fn after_fork_child() {
    FORKED.store(true, Release);
    RUNTIME.clear();
    INIT.store(0, Release);
}

fn fmt_bytes(b: u64) -> String {
    if b == u64::MAX {
        "unlimited".into()
    } else if b >= 1 << 30 && b.is_multiple_of(1 << 20) {
        format!("{b} B ({:.2} GiB)", b as f64 / (1u64 << 30) as f64)
    } else {
        format!("{b} B ({:.1} MiB)", b as f64 / (1u64 << 20) as f64)
    }
}

impl Runtime {
    /// Builds a standalone runtime from a parsed configuration (tests; no arbiter).
    pub fn from_parsed(config: Config, errors: &[config::ConfigError]) -> Runtime {
        Runtime::build(config, errors, Source::Standalone)
    }

    /// Builds the runtime: reports configuration errors once, and applies the failure policy to
    /// them and to an arbiter that was configured but could not be used.
    ///
    /// - Arbiter page: enforced whatever the environment says (the arbiter owns the limits; a
    ///   bad local value is reported and otherwise ignored).
    /// - Bad value, no arbiter: `open` runs pass-through; `closed` refuses every allocation.
    /// - Arbiter unavailable: `open` falls back to the standalone contract
    ///   (`SMORE_MEMORY_LIMIT` / `SMORE_SM_SHARE`); `closed` refuses every allocation.
    pub fn build(mut config: Config, errors: &[config::ConfigError], source: Source) -> Runtime {
        log::set_level(config.log);
        let first = !errors.is_empty() && !REPORTED.swap(true, AcqRel);
        let msgs: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
        let mut enforcing = true;
        let mut page = None;
        match source {
            Source::Arbiter(p, _) => {
                page = Some(p);
                if first {
                    log::line(
                        Level::Error,
                        format_args!("{}; ignored: the arbiter's grant applies", msgs.join("; ")),
                    );
                }
            }
            Source::Unavailable(why) => match config.policy {
                FailurePolicy::Open => log::line(
                    Level::Error,
                    format_args!(
                        "{why}; SMORE_FAILURE=open: running with the standalone limits (SMORE_MEMORY_LIMIT, SMORE_SM_SHARE)"
                    ),
                ),
                FailurePolicy::Closed => {
                    config.mem_cap = [0; MAX_DEVICES];
                    config.sm_share = [100; MAX_DEVICES];
                    config.contention_ppm = [0; MAX_DEVICES];
                    log::line(
                        Level::Error,
                        format_args!("{why}; SMORE_FAILURE=closed: every device allocation is refused"),
                    );
                }
            },
            Source::Standalone => {}
        }
        if page.is_none() && !errors.is_empty() {
            match config.policy {
                FailurePolicy::Open => {
                    enforcing = false;
                    if first {
                        log::line(
                            Level::Error,
                            format_args!(
                                "{}; running pass-through (no memory cap, no SM share)",
                                msgs.join("; ")
                            ),
                        );
                    }
                }
                FailurePolicy::Closed => {
                    config.mem_cap = [0; MAX_DEVICES];
                    config.sm_share = [100; MAX_DEVICES];
                    config.contention_ppm = [0; MAX_DEVICES];
                    if first {
                        log::line(
                            Level::Error,
                            format_args!(
                                "{}; SMORE_FAILURE=closed: every device allocation is refused",
                                msgs.join("; ")
                            ),
                        );
                    }
                }
            }
        }
        let limits = match page {
            Some(p) => p,
            None => limits::standalone(
                &config.mem_cap,
                &config.sm_share,
                &config.contention_ppm,
                config.switch_ns,
            ),
        };
        if enforcing && page.is_none() && log::enabled(Level::Info) {
            log::line(
                Level::Info,
                format_args!(
                    "standalone mode: memory cap {}, SM share {} %, contention budget {} ppm, context switch {} µs (device 0), window {} ms, policy {:?}",
                    fmt_bytes(config.mem_cap[0]),
                    config.sm_share[0],
                    config.contention_ppm[0],
                    config.switch_ns / 1_000,
                    config.window_ms,
                    config.policy
                ),
            );
        }
        Runtime {
            window_ns: config.window_ms * 1_000_000,
            config,
            enforcing,
            limits: os::StaticRef::new(limits),
            turns: os::StaticRef::new(&NO_SEAT),
            ledger: Ledger::new(),
            gates: std::array::from_fn(|_| SharedGate::new()),
            collision: std::array::from_fn(|_| Collision::default()),
            contention: std::array::from_fn(|_| Contention::default()),
            calibration: std::array::from_fn(|_| Calibration::default()),
            estimated: std::array::from_fn(|_| AtomicU64::new(0)),
            usage: std::array::from_fn(|_| UsageCounters::default()),
            costs: CostTable::new(),
            sample_clock: SampleClock::seeded(os::now_ns() ^ ((os::pid() as u64) << 32)),
            sampler: Mutex::new(Sampler::default()),
            ctx_charged: std::array::from_fn(|_| AtomicBool::new(false)),
            ctx_footprint: std::array::from_fn(|_| AtomicU64::new(0)),
            pool_serial: Mutex::new(()),
            refusals: AtomicU64::new(0),
            unmeasured: AtomicU64::new(0),
            probing: AtomicU64::new(0),
            deferral: Default::default(),
            backlog: Default::default(),
            last_stream: std::array::from_fn(|_| AtomicU64::new(0)),
            runs_mps: std::array::from_fn(|_| AtomicBool::new(false)),
            stream_changes: std::array::from_fn(|_| AtomicU64::new(0)),
            dev_uuid: std::array::from_fn(|_| [AtomicU64::new(0), AtomicU64::new(0)]),
            dev_uuid_known: std::array::from_fn(|_| AtomicBool::new(false)),
        }
    }

    /// The live limits page.
    #[inline]
    pub fn limits(&self) -> &'static GrantPage {
        self.limits.get()
    }

    /// The page slot that describes CUDA ordinal `dev`, `None` when the grant does not cover it.
    ///
    /// A page whose slots name their GPUs (`GrantPage::slot_uuid`, written by the arbiter) maps
    /// the ordinal to the slot of the same UUID (`cuDeviceGetUuid`, asked once per ordinal and
    /// kept): a function that changed `CUDA_VISIBLE_DEVICES` — the ordinals then name other
    /// GPUs — still gets its grant on its GPU and nothing on the others (issue 12 item 9). A page
    /// that names no GPU (standalone, an older arbiter) maps ordinal `d` to slot `d`. A UUID the
    /// driver cannot give is not granted (asked again next time). No lock, allocation or
    /// syscall once the UUID is known: the throttled launch path may call it.
    pub fn device_slot(&self, dev: usize) -> Option<usize> {
        let page = self.limits();
        if dev >= MAX_DEVICES || !page.names_gpus() {
            return Some(dev);
        }
        let uuid = if self.dev_uuid_known[dev].load(Acquire) {
            let w = &self.dev_uuid[dev];
            let mut u = [0u8; 16];
            u[..8].copy_from_slice(&w[0].load(Relaxed).to_ne_bytes());
            u[8..].copy_from_slice(&w[1].load(Relaxed).to_ne_bytes());
            u
        } else {
            let u = driver::cuda_uuid_bytes(dev)?;
            let w = &self.dev_uuid[dev];
            w[0].store(u64::from_ne_bytes(u[..8].try_into().ok()?), Relaxed);
            w[1].store(u64::from_ne_bytes(u[8..].try_into().ok()?), Relaxed);
            self.dev_uuid_known[dev].store(true, Release);
            u
        };
        let slot = page.slot_of_uuid(&uuid)?;
        // The grant's shared ledger counts this GPU under its slot, whatever ordinal each of
        // the grant's processes calls it.
        self.ledger.map_shared(dev, slot);
        Some(slot)
    }

    /// Memory cap of CUDA ordinal `dev`: its slot's, 0 on a device the grant does not cover.
    pub fn cap(&self, dev: usize) -> u64 {
        self.device_slot(dev).map_or(0, |s| self.limits().cap(s))
    }

    /// SM share of CUDA ordinal `dev` (its slot's; 100 for a device the grant does not cover,
    /// where no context can be made and a launch is refused before the share matters).
    pub fn share(&self, dev: usize) -> u32 {
        self.device_slot(dev)
            .map_or(100, |s| limits::share(self.limits(), s))
    }

    /// Contention budget of CUDA ordinal `dev` (its slot's; 0 off the grant).
    pub fn contention(&self, dev: usize) -> u32 {
        self.device_slot(dev)
            .map_or(0, |s| self.limits().contention(s))
    }

    /// What one context switch costs on CUDA ordinal `dev`, ns (its slot's; 0 off the grant).
    pub fn switch_ns(&self, dev: usize) -> u64 {
        self.device_slot(dev).map_or(0, |s| self.limits().switch(s))
    }

    /// The node's timing-noise allowance for CUDA ordinal `dev`'s samples (its slot's; none off
    /// the grant).
    pub fn timing_noise(&self, dev: usize) -> harvest::TimingNoise {
        self.device_slot(dev)
            .map_or(harvest::TimingNoise::NONE, |s| {
                self.limits().timing_noise(s)
            })
    }

    /// How CUDA ordinal `dev`'s GPU runs this process's kernels beside others': the arbiter's
    /// word on the grant page (`None`: not said, or off the grant), and MPS only while NVML
    /// also lists this very process as an MPS client ([`harvest::honoured`]). Until this
    /// process's first NVML reading, not a client.
    pub fn sharing(&self, dev: usize) -> Option<harvest::Sharing> {
        let page = self.device_slot(dev).and_then(|s| self.limits().sharing(s));
        harvest::honoured(page, self.runs_mps[dev].load(Relaxed))
    }

    /// What to do when an allocation cannot be accounted (device unknown).
    fn unaccountable(&self, call: impl FnOnce() -> (u32, u64)) -> u32 {
        match self.config.policy {
            FailurePolicy::Open => {
                log::limited(
                    &UNACCOUNTED_LOG,
                    os::now_ns(),
                    Level::Warn,
                    format_args!("allocation without a current device: passed through unaccounted"),
                );
                call().0
            }
            FailurePolicy::Closed => CUDA_ERROR_OUT_OF_MEMORY,
        }
    }

    /// Charges `bytes` on `dev` (the current context's device when `None`) around `call`, which
    /// returns the driver's result and the new handle. Over the cap the driver is not called.
    pub fn alloc(
        &self,
        dev: Option<usize>,
        bytes: u64,
        kind: Kind,
        call: impl FnOnce() -> (u32, u64),
    ) -> u32 {
        self.alloc_sized(
            dev,
            bytes,
            kind,
            || {
                let (rc, key) = call();
                (rc, key, bytes)
            },
            |_| {},
        )
    }

    /// As [`Runtime::alloc`], for allocations whose final size is known only afterwards
    /// (pitched): `estimate` is reserved, then adjusted to the size `call` reports. If the real
    /// size does not fit under the cap, `undo` frees the new handle and the caller gets
    /// `CUDA_ERROR_OUT_OF_MEMORY`: the cap holds exactly even when the estimate was low.
    pub fn alloc_sized(
        &self,
        dev: Option<usize>,
        estimate: u64,
        kind: Kind,
        call: impl FnOnce() -> (u32, u64, u64),
        undo: impl FnOnce(u64),
    ) -> u32 {
        let Some(dev) = dev.or_else(driver::ctx_device) else {
            return self.unaccountable(|| {
                let (rc, key, _) = call();
                (rc, key)
            });
        };
        if estimate == 0 {
            // The driver rejects zero-byte requests; nothing to charge.
            return call().0;
        }
        self.ensure_context_charged(dev);
        let cap = self.cap(dev);
        match self.reserve(dev, estimate, cap) {
            Err(e) => {
                self.refused(e.dev, e.request, e.cap, e.used);
                CUDA_ERROR_OUT_OF_MEMORY
            }
            Ok(mut r) => {
                let (rc, key, actual) = call();
                if rc == 0 && key != 0 {
                    if actual != r.bytes() && !r.try_resize(actual, cap) {
                        let used = self.ledger.grant_used(dev);
                        drop(r);
                        undo(key);
                        self.refused(dev, actual, cap, used);
                        return CUDA_ERROR_OUT_OF_MEMORY;
                    }
                    r.commit(kind, key);
                }
                rc
            }
        }
    }

    /// Reserves `bytes` on `dev` against `cap`; before refusing, re-reads what the device's pools
    /// reserve (their charges are only refreshed when it matters: a pool that released memory
    /// since it was last asked is credited now).
    fn reserve(&self, dev: usize, bytes: u64, cap: u64) -> Result<Reservation<'_>, OverCap> {
        self.ledger.reserve(dev, bytes, cap).or_else(|_| {
            self.refresh_pools(dev);
            self.ledger.reserve(dev, bytes, cap)
        })
    }

    /// Sets every live pool of `dev` to the reservation the driver reports for it now.
    fn refresh_pools(&self, dev: usize) {
        for pool in self.ledger.pools_on(dev) {
            if let Some(reserved) = driver::pool_reserved(pool) {
                self.ledger.pool_sync(pool, reserved);
            }
        }
    }

    /// A stream-ordered allocation of `bytes` from `pool` (`None`: the current pool of the
    /// current device, `cuMemAllocAsync`) through `call`, which returns the driver's answer and
    /// the pointer. Charges the pool what it *reserves*, not what is allocated from it: freed
    /// memory a pool keeps (its release threshold) stays charged until the pool releases it
    /// (escape 2 of issue 12: 4 GiB held under a 1 GiB cap).
    ///
    /// Before the call the growth the pool will need is reserved against the cap (the request
    /// less what the pool holds unused); after it the pool's reservation is read back and
    /// charged. If the pool grew more than that and the growth does not fit, the allocation is
    /// freed again (`undo`, in stream order) and refused; what the pool then holds stays charged
    /// until the pool releases it. A pool created through `cuMemPoolCreate` is charged on its own
    /// device; others on the current context's.
    pub fn pool_alloc(
        &self,
        pool: Option<u64>,
        bytes: u64,
        call: impl FnOnce() -> (u32, u64),
        undo: impl FnOnce(u64),
    ) -> u32 {
        let Some(current) = driver::ctx_device() else {
            return self.unaccountable(call);
        };
        let Some(pool) = pool.or_else(|| driver::device_mem_pool(current)) else {
            return self.alloc(Some(current), bytes, Kind::Ptr, call);
        };
        let dev = self.ledger.pool_device(pool).unwrap_or(current);
        if bytes == 0 || dev >= MAX_DEVICES {
            return call().0;
        }
        self.ensure_context_charged(dev);
        let cap = self.cap(dev);
        let _serial = self.pool_serial.lock().unwrap_or_else(|e| e.into_inner());
        let want = bytes.saturating_sub(driver::pool_idle(pool).unwrap_or(0));
        let r = match self.reserve(dev, want, cap) {
            Ok(r) => r,
            Err(e) => {
                self.refused(e.dev, bytes, e.cap, e.used);
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
        };
        let (rc, ptr) = call();
        if rc != 0 || ptr == 0 {
            return rc;
        }
        let reserved = driver::pool_reserved(pool);
        if self.ledger.pool_commit(r, pool, ptr, bytes, reserved, cap) {
            return rc;
        }
        let used = self.ledger.grant_used(dev);
        undo(ptr);
        self.refused(dev, bytes, cap, used);
        CUDA_ERROR_OUT_OF_MEMORY
    }

    /// Instantiates `graph` through `call` (the driver's answer and the new `CUgraphExec`): the
    /// bytes of its memory-allocation nodes are charged on their devices for as long as the
    /// executable graph lives — the driver backs them with device memory when it runs, and keeps
    /// it for the graph — and an instantiation whose allocations do not fit under the cap is
    /// refused with `CUDA_ERROR_OUT_OF_MEMORY` before the driver is asked.
    pub fn instantiate(&self, graph: u64, call: impl FnOnce() -> (u32, u64)) -> u32 {
        let allocs = self.ledger.graph_allocs(graph);
        if allocs.iter().all(|&b| b == 0) {
            return call().0;
        }
        let mut held = Vec::new();
        for (dev, &bytes) in allocs.iter().enumerate().filter(|(_, b)| **b > 0) {
            self.ensure_context_charged(dev);
            match self.reserve(dev, bytes, self.cap(dev)) {
                Ok(r) => held.push((dev, r)),
                Err(e) => {
                    self.refused(e.dev, e.request, e.cap, e.used);
                    return CUDA_ERROR_OUT_OF_MEMORY;
                }
            }
        }
        let (rc, exec) = call();
        if rc == 0 && exec != 0 {
            for (dev, r) in held {
                r.commit(Kind::GraphExec, graph_exec_key(exec, dev));
            }
        }
        rc
    }

    /// `cuGraphExecDestroy` destroyed `exec`: its allocation nodes' memory is credited.
    pub fn graph_exec_destroyed(&self, exec: u64) {
        for dev in 0..MAX_DEVICES {
            self.ledger
                .release(Kind::GraphExec, graph_exec_key(exec, dev));
        }
    }

    /// `cuMemPoolCreate` made `pool` on device `dev`.
    pub fn pool_created(&self, pool: u64, dev: usize) {
        self.ledger.pool_created(pool, dev);
    }

    /// `cuMemPoolDestroy` destroyed `pool`.
    pub fn pool_destroyed(&self, pool: u64) {
        self.ledger.pool_destroyed(pool);
    }

    fn refused(&self, dev: usize, request: u64, cap: u64, used: u64) {
        self.refusals.fetch_add(1, Relaxed);
        log::limited(
            &OVERCAP_LOG,
            os::now_ns(),
            Level::Warn,
            format_args!(
                "device {dev}: allocation of {} refused (CUDA_ERROR_OUT_OF_MEMORY): cap {}, in use {}",
                fmt_bytes(request),
                fmt_bytes(cap),
                fmt_bytes(used)
            ),
        );
    }

    /// Credits a handle the driver has freed. A pool allocation's memory stays with its pool:
    /// the pool's charge follows what the driver says it reserves now.
    pub fn freed(&self, kind: Kind, key: u64) {
        if key == 0 {
            return;
        }
        if kind == Kind::Ptr {
            match self.ledger.pool_freed(key) {
                PoolFree::NotPool => {}
                PoolFree::Destroyed => return,
                PoolFree::Live(pool) => {
                    if let Some(reserved) = driver::pool_reserved(pool) {
                        self.ledger.pool_sync(pool, reserved);
                    }
                    return;
                }
            }
        }
        self.ledger.release(kind, key);
    }

    /// The memory view of a capped device: total = min(cap, physical total), free =
    /// min(physical free, cap − used). Uncapped devices are reported as they are.
    pub fn virtual_info(&self, dev: usize, phys_free: u64, phys_total: u64) -> (u64, u64) {
        let cap = self.cap(dev);
        if cap == u64::MAX {
            return (phys_free, phys_total);
        }
        self.refresh_pools(dev);
        let total = cap.min(phys_total);
        let free = phys_free.min(cap.saturating_sub(self.ledger.grant_used(dev)));
        (free, total)
    }

    /// Charges the context footprint of `dev` if it is capped and not charged yet (called on
    /// context creation and before an allocation; an uncapped device needs no charge, and an
    /// NVML query is not free).
    pub fn ensure_context_charged(&self, dev: usize) {
        let Some(flag) = self.ctx_charged.get(dev) else {
            return;
        };
        if flag.load(Acquire) || self.cap(dev) == u64::MAX {
            return;
        }
        if flag.swap(true, AcqRel) {
            return;
        }
        let (me, known) = (os::pid(), os::known_as());
        match driver::nvml_process_mem(dev, |p| p == me || p == known) {
            Some(mem) => {
                let footprint = mem.saturating_sub(self.ledger.used(dev));
                self.ledger.force_charge(dev, footprint);
                let _ = self.ctx_footprint[dev].compare_exchange(0, footprint, AcqRel, Acquire);
                self.ledger.publish_footprint(dev, footprint);
                log::line(
                    Level::Info,
                    format_args!("device {dev}: context footprint {} charged", fmt_bytes(footprint)),
                );
            }
            None => log::line(
                Level::Info,
                format_args!("device {dev}: context footprint not measurable (NVML unavailable); not charged"),
            ),
        }
    }

    /// Creates a context on `dev` through `call` (which returns the driver's answer and the new
    /// `CUcontext`) and charges its footprint for as long as it lives: every context costs device
    /// memory, not only a device's first (ten `cuCtxCreate` held 4 GiB under a 1 GiB cap).
    ///
    /// - `primary`: a `cuDevicePrimaryCtxRetain`; only the retain that creates the device's
    ///   primary context is charged (keyed by the device, credited when it is destroyed).
    /// - Once a device's footprint is known (its first context was measured), a context that
    ///   would not fit under the cap is refused with `CUDA_ERROR_OUT_OF_MEMORY` before the driver
    ///   is called (what the driver answers when it lacks the memory).
    /// - The charge is the larger of that footprint and what NVML attributes to this process on
    ///   `dev` beyond the ledger, measured after the call (so a first context, or one larger than
    ///   the first, is counted as the driver counts it).
    ///
    /// Uncapped devices are not measured (an NVML query is not free); their contexts are not
    /// charged.
    pub fn create_context(
        &self,
        dev: usize,
        primary: bool,
        call: impl FnOnce() -> (u32, u64),
    ) -> u32 {
        if self.device_slot(dev).is_none() {
            // A device the grant does not cover (issue 12 item 9): a context costs device
            // memory the grant gives none of there, and without a context no allocation or
            // launch can reach the device through any path.
            self.refused(dev, self.ctx_footprint[dev].load(Acquire), 0, 0);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        if dev >= MAX_DEVICES
            || (primary && self.ledger.holds(Kind::PrimaryContext, dev as u64))
            || self.cap(dev) == u64::MAX
            // A retain of a primary context that exists already (made before it was charged:
            // the allocation fallback below counted it) creates nothing.
            || (primary && driver::primary_ctx_active(dev) == Some(true))
        {
            return call().0;
        }
        // What a context costs here: this process's first measurement, or one another process of
        // the grant published (so a process's first context is checked too, once any was seen).
        let mut known = self.ctx_footprint[dev]
            .load(Acquire)
            .max(self.ledger.shared_footprint(dev));
        // While the grant's first footprint on `dev` is unknown, its processes create their
        // first contexts one at a time (`Ledger::begin_first_context`): the measurer goes
        // unchecked, the others wait for its figure and are checked with it, so processes
        // starting together cannot each add an unchecked context (issue 12 item 4).
        let _measuring = (known == 0).then(|| {
            let first = self.ledger.begin_first_context(dev);
            if let FirstContext::Known(f) = first {
                known = f;
            }
            FirstMeasurement {
                ledger: &self.ledger,
                dev,
                mine: first == FirstContext::Mine,
            }
        });
        // The first context of a grant on a device is never refused: its footprint is not known
        // yet.
        let cap = if known == 0 { u64::MAX } else { self.cap(dev) };
        let mut r = match self.reserve(dev, known, cap) {
            Ok(r) => r,
            Err(e) => {
                self.refused(e.dev, e.request, e.cap, e.used);
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
        };
        let (rc, ctx) = call();
        if rc != 0 || (ctx == 0 && !primary) {
            return rc;
        }
        self.ctx_charged[dev].store(true, Release);
        // What the driver holds for this process beyond the ledger (which counts `known` for this
        // context already).
        let (me, known_as) = (os::pid(), os::known_as());
        let unexplained = driver::nvml_process_mem(dev, |p| p == me || p == known_as)
            .map(|mem| mem.saturating_sub(self.ledger.used(dev).saturating_sub(r.bytes())));
        let footprint = known.max(unexplained.unwrap_or(0));
        if known == 0 {
            let _ = self.ctx_footprint[dev].compare_exchange(0, footprint, AcqRel, Acquire);
        }
        self.ledger.publish_footprint(dev, footprint);
        r.force_resize(footprint);
        let (kind, key) = if primary {
            (Kind::PrimaryContext, dev as u64)
        } else {
            (Kind::Context, ctx)
        };
        r.commit(kind, key);
        match unexplained {
            Some(_) => log::line(
                Level::Info,
                format_args!(
                    "device {dev}: {} context footprint {} charged",
                    if primary { "primary" } else { "new" },
                    fmt_bytes(footprint)
                ),
            ),
            None => log::line(
                Level::Info,
                format_args!(
                    "device {dev}: context footprint not measurable (NVML unavailable); charged {}",
                    fmt_bytes(footprint)
                ),
            ),
        }
        rc
    }

    /// A context the driver destroyed: `cuCtxDestroy` of `ctx`, or (`primary`) the primary
    /// context of device `ctx` after its last release or a reset. Credits its footprint.
    pub fn context_destroyed(&self, primary: bool, ctx: u64) {
        let kind = if primary {
            Kind::PrimaryContext
        } else {
            Kind::Context
        };
        self.ledger.release(kind, ctx);
        let mut s = self.sampler();
        s.forget_context(primary, ctx);
        s.recount(&self.unmeasured, &self.probing);
    }

    /// The turn board of grant-page slot `slot`'s GPU while this process takes turns there at
    /// `now`: it has a seat for that slot, the page still gives its function that seat, the
    /// GPU's functions take turns, and it is not backed off after a give-up (its phase ring is
    /// written only then: `smore_protocol::phase`).
    fn turn_board(&self, slot: usize, page: &GrantPage, now: u64) -> Option<&'static TurnBoard> {
        let seat = self.turns.get().as_ref()?;
        (seat.slot() == slot
            && seat.enabled()
            && seat.taking_turns(now)
            && page.turn_seat(slot) == Some(seat.member()))
        .then(|| seat.board())
    }

    /// Admits a launch keyed by its CUfunction / CUgraphExec, sleeping precisely if the device's
    /// share is spent, and samples its GPU time at most once per period.
    ///
    /// A key never measured is always sampled, and until its measurement arrives no further
    /// launch of the process is admitted: queued-but-unmeasured work is bounded by one launch
    /// (a new CUDA graph of 200 ms is not taken for a 50 µs kernel), and its real cost is then
    /// charged to the gate, so the next launch waits until it is paid for.
    pub fn launch(&self, key: u64, stream: usize, ptsz: bool, call: impl FnOnce() -> u32) -> u32 {
        let Some(dev) = driver::ctx_device().filter(|&d| d < MAX_DEVICES) else {
            return call();
        };
        let Some(slot) = self.device_slot(dev) else {
            // A device the grant does not cover: no context can be made there through the
            // shim; a launch that still reaches one is refused as the driver refuses an
            // operation the process may not make.
            return CUDA_ERROR_NOT_PERMITTED;
        };
        // One slot look-up per launch (the page's UUID words are read once here).
        let page = self.limits();
        let share = limits::share(page, slot);
        let budget = page.contention(slot);
        if share >= 100 && budget == 0 {
            return call();
        }
        if self.unmeasured.load(Acquire) > 0 || self.probing.load(Acquire) > 0 {
            self.wait_unmeasured();
        }
        let known = self.costs.lookup(key);
        // An unmeasured launch is charged nothing now and its measured cost once known (no
        // estimate from other kernels: a graph's 200 ms must not be charged to a 5 µs kernel).
        let cost = known.map_or(0, |c| self.calibration[dev].apply(c));
        // The raw share's gate first (an operator's share, an over-use debt's, or the arbiter's
        // throttle of a function its collision budget cannot hold): what harvesting decides
        // below — the backlog, a probe, a hold on the evidence of now — then rests on evidence
        // of when the launch goes, not of before a pacing hold of up to the gate's window. A
        // launch released by the gate on evidence of before its hold ran into the trainer's
        // busy phases unheld (docs/harvest.md, "When the budget cannot hold θ").
        if share < 100 {
            let gate = &self.gates[dev];
            if !gate.is_shared() {
                // The grant's processes gate by one raw share (its ledger table's word), as they
                // check one memory cap and pay one collision bucket; a process without a shared
                // ledger keeps a gate of its own, and the arbiter divides the share among such
                // gates (docs/shim.md, "One share per grant").
                if let Some(word) = self.ledger.shared_raw(slot) {
                    gate.attach(word);
                }
            }
            let now = os::now_ns();
            if let Some(t) = gate.get().admit(now, cost, share, self.window_ns) {
                os::sleep_until(t);
                self.usage[dev].add_held(t.saturating_sub(now));
                // Another thread's unmeasured launch or blocking probe may have gone meanwhile.
                if self.unmeasured.load(Acquire) > 0 || self.probing.load(Acquire) > 0 {
                    self.wait_unmeasured();
                }
            }
        }
        // Harvesting keeps its backlog short, so that what is decided below on the evidence of
        // now holds the work while that evidence is fresh ([`harvest::BACKLOG_HORIZON_NS`]).
        // Reserved first, first come first served, so that threads launching at once are
        // each judged below when their turn comes.
        let mut reserved = false;
        if budget > 0 {
            if !self.contention[dev].is_shared() {
                // The grant's processes charge one collision bucket (its ledger table's), as
                // they check one memory cap; a process without a shared ledger keeps its own.
                if let Some(words) = self.ledger.shared_contention(slot) {
                    self.collision[dev].share(words.evidence);
                    self.contention[dev].share(words);
                }
            }
            let now = os::now_ns();
            let evidence = self.collision[dev].evidence_at(now);
            let horizon = self.contention[dev].backlog_horizon(now, budget, evidence);
            if let Some(t) = self.backlog[dev].reserve(now, cost, horizon) {
                os::sleep_until(t);
                self.usage[dev].add_held(t.saturating_sub(now));
                // Another thread's unmeasured launch or blocking probe may have gone meanwhile.
                if self.unmeasured.load(Acquire) > 0 || self.probing.load(Acquire) > 0 {
                    self.wait_unmeasured();
                }
            }
            reserved = true;
        }
        // Deadline-aware deferral (docs/harvest.md, "Deferral"): a launch whose request may
        // still start later waits out the trainer's busy phase instead of colliding with it.
        let mut probe = false;
        // Whether later launches wait for the probe's measurement (a deferral's last probe is
        // only sampled: [`harvest::probe_blocks`]).
        let mut blocking = true;
        if budget > 0 {
            let until = page.defer_until(slot);
            if until > 0 {
                let now = os::now_ns();
                let c = &self.collision[dev];
                match self.deferral[dev].decide(now, c.evidence_at(now), c.newest(now), until) {
                    Defer::Run => {}
                    Defer::Probe => probe = true,
                    Defer::Hold(t) => {
                        os::sleep_until(t);
                        self.usage[dev].add_deferred(t.saturating_sub(now));
                        self.backlog[dev].went_at(t, cost);
                        probe = true;
                        blocking = harvest::probe_blocks(t, until);
                    }
                }
            }
        }
        // A function in debt whose evidence is stale probes first, at most once per staleness
        // age (docs/harvest.md, "Enforcement on stale evidence"): otherwise bursts spaced past
        // the staleness age are never held. The age's probe is the grant's: a launch that finds
        // another process of it probing waits for that measurement, at most the staleness age,
        // and then probes itself.
        if budget > 0 && !probe {
            let start = os::now_ns();
            let mut now = start;
            let mut waited = false;
            loop {
                match self.contention[dev].probe_in_debt(now, self.collision[dev].evidence_at(now))
                {
                    InDebt::Go => break,
                    InDebt::Probe => {
                        probe = true;
                        blocking = true;
                        break;
                    }
                    InDebt::WaitUntil(_) if now.saturating_sub(start) > harvest::STALE_NS => {
                        // No evidence came of the other's probe: this launch probes.
                        self.contention[dev].take_probe(now);
                        probe = true;
                        blocking = true;
                        break;
                    }
                    InDebt::WaitUntil(t) => {
                        os::sleep_until(t);
                        let woke = os::now_ns();
                        self.usage[dev].add_held(woke.saturating_sub(now));
                        now = woke;
                        waited = true;
                    }
                }
            }
            if waited {
                // Held after its reservation, like a deferral; and another thread's launch may
                // have gone meanwhile.
                self.backlog[dev].went_at(now, cost);
                if self.unmeasured.load(Acquire) > 0 || self.probing.load(Acquire) > 0 {
                    self.wait_unmeasured();
                }
            }
        }
        let mut now = os::now_ns();
        let p = self.collision[dev].ppm_at(now);
        let expected = harvest::expected_collision(cost, p);
        let (_, harvested) = self.contention[dev].admit(now, cost, p, budget);
        // A contention hold longer than the evidence stays fresh is cut short: this launch then
        // probes (it is sampled, and later launches wait for its measurement), so a trainer that
        // went idle meanwhile is seen at once instead of after the whole debt is paid. (Cutting
        // it later, `cost / budget` after the last probe, was tried: docs/harvest.md,
        // "Enforcement on stale evidence".)
        let mut deadline = harvested;
        let cut = harvested.filter(|&h| h > now + harvest::STALE_NS);
        // What this launch was to do before the cut made it a probe (a deferral's probe stays).
        let before_cut = (probe, blocking);
        if cut.is_some() {
            probe = true;
            blocking = true;
            deadline = Some(now + harvest::STALE_NS);
        }
        if let Some(deadline) = deadline {
            os::sleep_until(deadline);
            self.usage[dev].add_held(deadline.saturating_sub(now));
            now = deadline;
        }
        if let Some(paid) = cut {
            // The probe after a cut hold is the function's, as in debt above: while another
            // process of the grant has probed within the staleness age, this launch goes on
            // that probe's evidence — on when it says the trainer is idle, else held again,
            // at most one more staleness age, until the bucket is paid or the probe is its own.
            // On the clock, not the hold's planned end: a sleep overruns, and a sibling's
            // fresh probe must not look more than 1 ms ahead.
            let mut clock = os::now_ns();
            let give_up = clock.saturating_add(harvest::STALE_NS);
            loop {
                if !self.contention[dev].probed_by_another(clock, harvest::STALE_NS)
                    || clock >= give_up
                {
                    self.contention[dev].mark_probe(clock);
                    break;
                }
                let idle = self.collision[dev]
                    .evidence_at(clock)
                    .is_some_and(|p| p < harvest::HOLD_FROM_PPM);
                if idle || clock >= paid {
                    (probe, blocking) = before_cut;
                    break;
                }
                let t = clock
                    .saturating_add(harvest::PROBE_POLL_NS)
                    .min(paid)
                    .min(give_up);
                os::sleep_until(t);
                let woke = os::now_ns();
                self.usage[dev].add_held(woke.saturating_sub(clock));
                clock = woke;
                now = woke;
            }
        }
        // Turns (docs/shim.md, "Turns"): after every hold of its own, so that no turn is held
        // through one; a launch that waited for its turn moves its backlog's end like a hold.
        // A launch that cut in runs beside another function's work: its sample is not posted
        // for the trainer's phase.
        let mut without_turn = false;
        if reserved {
            if let Some(seat) = self.turns.get() {
                // The page must still give the function this seat: a process that outlived its
                // instance's release must not take turns as whoever is seated there next.
                if seat.slot() == slot
                    && seat.enabled()
                    && page.turn_seat(slot) == Some(seat.member())
                {
                    let deadline = turns::request_deadline(page.turn_key(slot), now);
                    let key = deadline.unwrap_or(now);
                    let urgent =
                        turns::Urgency::on(self.runs_mps[dev].load(Relaxed), cost, deadline);
                    match seat.try_take(now, self.backlog[dev].end(), key, urgent) {
                        Take::Go => {}
                        Take::CutIn => {
                            without_turn = true;
                            self.usage[dev].add_turn_cut_in();
                        }
                        Take::WaitUntil(t) => {
                            let waited_from = now;
                            let (went, cut_in) =
                                self.wait_for_turn(seat, dev, (now, key, urgent), t, cost);
                            now = went;
                            without_turn = cut_in;
                            // What was decided above rests on evidence the wait made stale: this
                            // launch probes (docs/harvest.md, "Enforcement on stale evidence").
                            if now.saturating_sub(waited_from) > harvest::STALE_NS {
                                probe = true;
                                blocking = true;
                            }
                        }
                    }
                }
            }
        }
        self.estimated[dev].fetch_add(known.unwrap_or(0), Relaxed);
        self.usage[dev].add_admitted(cost, expected);
        if reserved {
            if deadline.is_some() {
                // Held after its reservation: the queue is done no earlier than its own work.
                self.backlog[dev].went_at(now, cost);
            }
            // After every wait, just before it goes: a chain must see every launch on another
            // stream that goes between two of its samples.
            self.note_stream(dev, stream, ptsz);
        }
        let pending = PendingMeta {
            key,
            dev,
            admitted: now,
            charged: cost,
            unmeasured: known.is_none(),
            probe: probe && blocking,
            without_turn,
        };
        if known.is_none() || probe {
            // A probe nothing waits for is still sampled, at once (its measurement judges the
            // hold before it).
            return self.sampled_launch(pending, stream, ptsz, call);
        }
        // Under a raw share the sampled launch is drawn (a function cannot choose which of its
        // launches is measured: cost poisoning, issue 12 item 10). Harvesting keeps the first
        // launch after each period: its collision evidence is the queue wait of a launch on an
        // idle stream — the first of a batch — and a drawn sample is mostly not one (measured:
        // a harvesting function then slowed the trainer 12–17 % against a 5 % budget).
        let claimed = if budget == 0 {
            self.sample_clock
                .try_claim_unpredictable(now, SAMPLE_PERIOD_NS)
        } else {
            self.sample_clock.try_claim(now, SAMPLE_PERIOD_NS)
        };
        if !claimed {
            return call();
        }
        self.sampled_launch(pending, stream, ptsz, call)
    }

    /// Waits, from `start`, in line at `key` for this process's turn on the GPU (first look at
    /// `first`), at most [`turns::MAX_WAIT_NS`]; returns when it goes. The launch's backlog slot
    /// moves with it (its work ends no earlier than its cost after it goes), so the lease it
    /// takes covers its work.
    #[cold]
    fn wait_for_turn(
        &self,
        seat: &Seat,
        dev: usize,
        (start, key, urgent): (u64, u64, Option<turns::Urgency>),
        first: u64,
        cost: u64,
    ) -> (u64, bool) {
        let give_up = start.saturating_add(turns::MAX_WAIT_NS);
        let mut next = first;
        // Whether the turn passed from one function to another while this launch waited: a
        // line that moves is contention, one that does not is a stalled board.
        let (first_holder, mut moved) = (seat.holding(), false);
        loop {
            os::sleep_until(next.min(give_up));
            let now = os::now_ns();
            self.backlog[dev].went_at(now, cost);
            moved |= seat.holding() != first_holder;
            if now >= give_up || !seat.enabled() {
                let gave_up = now >= give_up;
                seat.leave_line_at((start, now), gave_up, moved);
                self.usage[dev].add_turn_wait(now - start, gave_up);
                return (now, false);
            }
            match seat.try_take(now, self.backlog[dev].end(), key, urgent) {
                Take::Go => {
                    self.usage[dev].add_turn_wait(now - start, false);
                    return (now, false);
                }
                Take::CutIn => {
                    self.usage[dev].add_turn_wait(now - start, false);
                    self.usage[dev].add_turn_cut_in();
                    return (now, true);
                }
                Take::WaitUntil(t) => next = t,
            }
        }
    }

    /// Notes a launch on `stream` of `dev`: counts a change of stream (one load, and a store and
    /// an add only on a change).
    #[inline]
    fn note_stream(&self, dev: usize, stream: usize, ptsz: bool) {
        let (q, ptsz) = queue_key(stream, ptsz);
        let key = q as u64 ^ ((ptsz as u64) << 63);
        if self.last_stream[dev].load(Relaxed) != key {
            self.last_stream[dev].store(key, Relaxed);
            self.stream_changes[dev].fetch_add(1, Relaxed);
        }
    }

    /// Waits (polling the pending samples every [`UNMEASURED_POLL_NS`]) until no unmeasured launch
    /// is in flight, for at most one window (a kernel longer than that is then admitted on its
    /// estimate; the late measurement is still charged).
    #[cold]
    fn wait_unmeasured(&self) {
        let give_up = os::now_ns().saturating_add(self.window_ns);
        loop {
            self.harvest(&mut self.sampler());
            let now = os::now_ns();
            let waiting = self.unmeasured.load(Acquire) + self.probing.load(Acquire);
            if waiting == 0 || now >= give_up {
                return;
            }
            os::sleep_until(now + UNMEASURED_POLL_NS);
        }
    }

    fn sampled_launch(
        &self,
        meta: PendingMeta,
        stream: usize,
        ptsz: bool,
        call: impl FnOnce() -> u32,
    ) -> u32 {
        // A first (unmeasured) launch waits for the sampler; a periodic sample never does.
        let guard = if meta.unmeasured || meta.probe {
            Some(self.sampler())
        } else {
            match self.sampler.try_lock() {
                Ok(g) => Some(g),
                Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
                Err(TryLockError::WouldBlock) => None,
            }
        };
        let Some(mut s) = guard else {
            return call();
        };
        self.harvest(&mut s);
        self.calibrate(&mut s, meta.dev, meta.admitted);
        if s.pending.len() >= MAX_PENDING || driver::stream_capturing(stream, ptsz) != Some(false) {
            return call();
        }
        let Some(ctx) = driver::ctx_current() else {
            return call();
        };
        s.note_device(ctx, meta.dev);
        let Some((a, b)) = s.take_pair(ctx) else {
            return call();
        };
        // Whether the stream had nothing of ours queued: then the start event's GPU time minus
        // the submission time is how long the launch waited for the GPU (other contexts' work).
        let idle = driver::stream_idle(stream, ptsz) == Some(true);
        let submitted = os::now_ns();
        if !driver::event_record(a, stream, ptsz) {
            // Not pooled again: an event the driver refuses (its context destroyed, the handle
            // stale) would be taken again by every sample of the context (leaked, once).
            return call();
        }
        let rc = call();
        let launched = os::now_ns();
        let at_launch = self.usage[meta.dev].get();
        let pushed_after = at_launch.gpu_ns;
        let paid_after = self.usage[meta.dev].admitted_contention_ns();
        let stream_changes = self.stream_changes[meta.dev].load(Relaxed);
        if rc == 0 && driver::event_record(b, stream, ptsz) {
            if meta.unmeasured {
                self.unmeasured.fetch_add(1, AcqRel);
            }
            if meta.probe {
                self.probing.fetch_add(1, AcqRel);
            }
            s.pending.push(Pending {
                meta,
                ctx,
                a,
                b,
                submitted,
                idle,
                launched,
                not_done_at: launched,
                stream: queue_key(stream, ptsz),
                pushed_before: pushed_after.saturating_sub(meta.charged),
                pushed_after,
                paid_after,
                stream_changes,
            });
        } else if rc != 0 {
            // The launch failed and no end was recorded: the pair is as good as new.
            s.give_back(ctx, (a, b));
        }
        // else the end event was refused: the pair is leaked, as above.
        rc
    }

    /// The sampler, also after a panic while it was held (the guard of every hook catches the
    /// panic; the state is a cache of samples, and the in-flight counts are recounted from it by
    /// [`Runtime::harvest`], so a poisoned lock must not stop sampling — or leave launches
    /// waiting a window each for a measurement no pending sample stands for).
    fn sampler(&self) -> std::sync::MutexGuard<'_, Sampler> {
        self.sampler.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Folds every completed sample into the cost table; a first measurement also charges what
    /// the launch cost beyond its estimate to the device's gate. Drops pairs that errored.
    fn harvest(&self, s: &mut Sampler) {
        let mut i = 0;
        let looked = os::now_ns();
        while i < s.pending.len() {
            match driver::event_query(s.pending[i].b) {
                CUDA_ERROR_NOT_READY => {
                    s.pending[i].not_done_at = looked;
                    i += 1;
                }
                rc => {
                    // Kept in submission order (the sampler's lock is held from a sample's
                    // submission to its push): a stream's earlier sample settles before its
                    // later one in the same pass, and the later one's chained wait needs it.
                    let p = s.pending.remove(i);
                    if rc == 0 {
                        let (wait, kept) = if p.idle {
                            s.queue_wait(p.ctx, p.a, p.submitted)
                        } else {
                            (None, None)
                        };
                        if let Some(ms) = driver::event_elapsed_ms(p.a, p.b) {
                            // On an idle stream the start event may complete as soon as it is
                            // recorded, before the launch call has enqueued the kernel: the pair
                            // then spans that CPU time too (less what the start event waited),
                            // which is neither the kernel's cost nor contention.
                            let cpu = match wait {
                                Some(w) => (p.launched - p.submitted).saturating_sub(w),
                                None => 0,
                            };
                            let raw = (ms as f64 * 1e6) as u64;
                            let ns = raw.saturating_sub(cpu);
                            // Harvest mode only: nothing else judges collisions.
                            let chained = if self.contention(p.meta.dev) > 0 {
                                s.chained_wait(&p, wait, raw)
                            } else {
                                None
                            };
                            let ran_until = harvest::ran_until(
                                harvest::Ran {
                                    submitted: p.submitted,
                                    launched: p.launched,
                                    wait,
                                    span_ns: raw,
                                    not_done_at: p.not_done_at,
                                },
                                os::now_ns(),
                            );
                            let settled = &mut s.settled[p.meta.dev];
                            let launched = Settled {
                                gpu_ns: p.pushed_after,
                                paid_ns: p.paid_after,
                            };
                            let measured = Measured {
                                ns,
                                wait,
                                chained,
                                launched,
                                ran_until,
                            };
                            let judged = self.settle(&p.meta, measured, settled);
                            if let Some(t) = s.trace.as_mut() {
                                let sample = trace::Sample {
                                    t_ns: os::now_ns(),
                                    dev: p.meta.dev,
                                    ns,
                                    d0_ns: judged.map(|j| j.d0_ns),
                                    wait_ns: wait,
                                    collided_ns: judged.map(|j| j.collided_ns),
                                    handover: judged.is_some_and(|j| j.handover),
                                    submitted_ns: p.submitted,
                                };
                                if t.record(&sample).is_err() {
                                    s.trace = None;
                                }
                            }
                        }
                        match kept {
                            // `a` became the context's reference: the old reference's event
                            // takes its place in the pool.
                            Some(Some(old)) => s.give_back(p.ctx, (old, p.b)),
                            // `a` became the first reference: the pair is not pooled.
                            Some(None) => {}
                            None => s.give_back(p.ctx, (p.a, p.b)),
                        }
                    }
                }
            }
        }
        s.recount(&self.unmeasured, &self.probing);
    }
}

impl Runtime {
    /// Settles a sampled launch ([`Measured`]: measured at `ns`, which waited `wait` ns for the
    /// GPU before starting, when known, or else behind its stream's queued work the [`Chained`]
    /// wait, when known; and ended at about `ran_until`): folds it into the cost table; a first
    /// measurement charges what the launch cost beyond its (zero) charge; a measured one updates
    /// the collision probability against its solo cost and charges contention beyond what was
    /// charged at admission. Returns how a measured launch was judged; `None` for a first
    /// measurement.
    fn settle(&self, m: &PendingMeta, x: Measured, settled: &mut Settled) -> Option<Judged> {
        let Measured {
            ns,
            wait,
            chained,
            launched,
            ran_until,
        } = x;
        let dev = m.dev;
        // The cost table's figures before this sample is folded in: the floor (what a launch is
        // charged, before calibration, and the solo cost on a time-sliced GPU) and the solo floor
        // (the solo cost under MPS).
        let floor = self.costs.lookup(m.key);
        let solo = self.costs.solo(m.key);
        self.costs.record(m.key, ns, ran_until);
        if m.unmeasured {
            let cost = self.calibration[dev].apply(ns);
            self.estimated[dev].fetch_add(ns, Relaxed);
            self.usage[dev].add(cost.saturating_sub(m.charged), 0);
            if cost > m.charged {
                let share = self.share(dev);
                self.gates[dev]
                    .get()
                    .charge(m.admitted, cost - m.charged, share);
            }
            return None;
        }
        let floor = floor?;
        // What a launch of this cost is charged in the gate's units (calibrated GPU time), which
        // the collision probability is per: a launch charged `cost × p` at admission then pays
        // the collision in the units it was measured in, the trainer's lost time.
        let d0_charged = self.calibration[dev].apply(floor);
        // The solo cost the sample is judged against: the floor or its calibrated figure,
        // whichever is smaller (the side of training). A calibration above ×1 must not raise it:
        // under MPS the driver counts the time a kernel ran slowed beside the trainer as the
        // process's own, so the calibration grows by that slowing, and a calibrated floor hid
        // the very stretch the trainer pays for (simulated MPS beside a trainer busy 93 %: the
        // estimate read 0.5 % against a true 2.9 %). One below ×1 says the floor crept above the
        // kernel's own GPU time (time-sliced spans include the co-runners' slices), and the
        // calibrated figure is the better solo cost (docs/harvest.md, "The calibrated floor
        // under MPS").
        // Under MPS the floor is the solo floor, which slowed samples raise at most one step
        // per 20 ms (`CostTable::solo`): beside a trainer that hardly idles nearly every sample
        // is slowed, and the per-sample floor settled well above the solo cost (docs/harvest.md,
        // "A solo floor that rises with time under MPS").
        // Whether this process is an MPS client is NVML's word: a process that claimed it
        // falsely would be judged against a lower floor, so count more, never less.
        let floor_judged = if self.runs_mps[dev].load(Relaxed) {
            solo.unwrap_or(floor)
        } else {
            floor
        };
        let d0 = floor_judged.min(d0_charged);
        // Collisions are judged on what the sample measured beyond the timing's noise: a few
        // tens of µs of jitter on a real GPU, which made every short kernel a whole collision
        // (docs/harvest.md, "Timing noise").
        let (ns, wait, chained) =
            harvest::beyond_noise(ns, d0, wait, chained, self.timing_noise(dev));
        // Under MPS, as the arbiter says and for an MPS client, an idle-stream wait is no
        // collision; its stretch is (docs/harvest.md, "Waits under MPS").
        let wait = harvest::wait_that_collides(wait, self.sharing(dev));
        // The chain's own work is in calibrated units, and so is the sample's part of it.
        let wait = wait.or_else(|| chained.map(|c| c.share_of(d0_charged)));
        let switch_ns = self.switch_ns(dev);
        // The evidence is as old as what it measured ([`harvest::ran_until`]).
        let collided =
            self.collision[dev].observe_per(ran_until, ns, d0, d0_charged, wait, switch_ns);
        // Every function of a GPU with turns posts its samples for the arbiter to read the
        // trainer's phase from (docs/harvest.md, "Phase prediction"): busy when the launch met
        // training work for at least the share of its solo cost at which the shim takes the
        // trainer for busy (the hold compares `p`, per the charged cost: under MPS it holds a
        // little later than the ring says busy, the side of training). A sample
        // without a known wait that shows no stretch says nothing (it may have waited before its
        // start event) and is not posted.
        if d0 > 0 && !m.without_turn && (wait.is_some() || ns > d0) {
            let board = self
                .device_slot(dev)
                .and_then(|slot| self.turn_board(slot, self.limits(), ran_until));
            if let Some(b) = board {
                let busy =
                    collided as u128 * PPM as u128 >= d0 as u128 * harvest::HOLD_FROM_PPM as u128;
                phase::post(b, ran_until, busy);
            }
        }
        let mut handover = false;
        // A chained sample is corrected whatever its own share of the wait: the work between
        // it and its stream's previous sample may have collided when the sample itself did not.
        if collided > 0 || chained.is_some() {
            let now = self.usage[dev].get();
            let rate = (collided as u128 * PPM as u128 / d0_charged.max(1) as u128).min(PPM as u128)
                as u32;
            // Plus, on a time-sliced GPU, the context switches the collision cost the
            // trainer, where the sample shows one (docs/harvest.md, "Context switches").
            handover = harvest::shows_handover(ns, d0, wait, switch_ns);
            let switches = if handover {
                harvest::switch_charge(switch_ns, rate)
            } else {
                0
            };
            let (due, paid) = match chained {
                // The sample stands for its stream's work since the previous sample, in the
                // order it ran: what of it collided is measured, and what it was charged at
                // admission is known.
                Some(c) => (c.collided_with(ns, d0, d0_charged) + switches, c.paid_ns),
                // The sample stands for the launches admitted since the last settled one (a
                // batch submitted together waited together): they collided at its rate, and
                // whatever they were charged below that is charged now.
                None => (
                    harvest::expected_collision(now.gpu_ns.saturating_sub(settled.gpu_ns), rate)
                        + switches,
                    self.usage[dev]
                        .admitted_contention_ns()
                        .saturating_sub(settled.paid_ns),
                ),
            };
            let excess = self.contention[dev].correct(m.admitted, paid, due, self.contention(dev));
            self.usage[dev].add(0, excess);
            // What was measured, whatever was paid: the estimate counts this, the bucket what
            // it paid (docs/harvest.md, "The estimate from what was measured").
            self.usage[dev].add_measured(due);
        }
        match chained {
            // What the chain covered ends at this sample's launch: launches admitted since are
            // the next sample's, chained or not. Never back: a window that already ran past it
            // covered them.
            Some(_) => {
                if launched.gpu_ns > settled.gpu_ns {
                    *settled = launched;
                }
            }
            None => {
                *settled = Settled {
                    gpu_ns: self.usage[dev].get().gpu_ns,
                    paid_ns: self.usage[dev].admitted_contention_ns(),
                }
            }
        }
        Some(Judged {
            d0_ns: d0,
            collided_ns: collided,
            handover,
        })
    }

    /// Compares the estimated GPU time of `dev` with the driver's per-process accounting at most
    /// once per [`CALIBRATION_PERIOD_NS`], and folds the ratio into the device's calibration.
    /// Needs NVML; without it (or when NVML does not list this process under a pid it knows)
    /// the estimates stay uncalibrated.
    fn calibrate(&self, s: &mut Sampler, dev: usize, now: u64) {
        if now < s.calibrate_next[dev] {
            return;
        }
        s.calibrate_next[dev] = now + CALIBRATION_PERIOD_NS;
        // NVML names this process by its own pid or, in a container, by the host pid the
        // arbiter knows it by (drivers differ: docs/kubernetes.md).
        let (me, known) = (os::pid(), os::known_as());
        let mps = driver::nvml_mps_client(dev, |p| p == me || p == known) == Some(true);
        self.runs_mps[dev].store(mps, Relaxed);
        let mark = s.calibrated[dev];
        let estimated = self.estimated[dev].load(Relaxed);
        let since = mark.map_or(0, |(_, _, ts)| ts);
        let mut buf = [driver::ProcessUtilization::default(); driver::MAX_UTIL_SAMPLES];
        let Some(n) = driver::nvml_process_utilization(dev, since, &mut buf) else {
            s.calibrated[dev] = None;
            return;
        };
        let mut mine: Vec<driver::ProcessUtilization> = buf[..n]
            .iter()
            .copied()
            .filter(|u| (u.pid == me || u.pid == known) && u.ts_us > since)
            .collect();
        mine.sort_by_key(|u| u.ts_us);
        let Some(last) = mine.last().map(|u| u.ts_us) else {
            // Nothing new for this process (or it has not run yet): no baseline to keep, so the
            // first window starts once the process is running.
            return;
        };
        s.calibrated[dev] = Some((now, estimated, last));
        let Some((at, est0, ts0)) = mark else {
            // The baseline: the first window starts once the process is running.
            return;
        };
        if now.saturating_sub(at) > CALIBRATION_STALE_NS
            || last.saturating_sub(ts0) > CALIBRATION_STALE_NS / 1000
        {
            // The process launched nothing sampled for a while: NVML keeps only its recent
            // samples, so the first would stand for the whole gap. The window starts anew.
            return;
        }
        let mut prev = ts0;
        let mut measured_ns = 0u64;
        for u in &mine {
            measured_ns += (u.ts_us - prev) * 1000 * u.sm_util.min(100) as u64 / 100;
            prev = u.ts_us;
        }
        let measured_ppm = measured_ns * PPM as u64 / ((last - ts0) * 1000).max(1);
        let estimated_ppm = estimated.saturating_sub(est0).saturating_mul(PPM as u64)
            / now.saturating_sub(at).max(1);
        // On a time-sliced device a process's NVML figure is not its own GPU time once another
        // context has work (measured on an H200, docs/real-gpu.md, section 8: ~9 % of the GPU
        // read 60–99 % beside a trainer): the window bounds it instead ([`calibration_target`]).
        let others = window_sum_ppm(&buf[..n], ts0, last).saturating_sub(measured_ppm);
        let device = if mps || others == 0 {
            None
        } else {
            let mut util = [(0u64, 0u32); driver::MAX_UTIL_SAMPLES];
            driver::nvml_device_utilization(dev, ts0, &mut util)
                .map(|k| device_window_ppm(&util[..k], ts0, last))
        };
        let calibrated =
            estimated_ppm.saturating_mul(u64::from(self.calibration[dev].ppm())) / PPM as u64;
        if let Some(target) = calibration_target(calibrated, measured_ppm, others, device, mps) {
            self.calibration[dev].observe(estimated_ppm, target);
        }
    }

    /// What this process's launches on `dev` used, as the shim estimates it (cumulative; only
    /// launches on a throttled or harvesting device are counted — others take the fast path).
    pub fn usage(&self, dev: usize) -> Usage {
        match (
            self.usage.get(dev),
            self.contention.get(dev),
            self.gates.get(dev),
        ) {
            (Some(u), Some(c), Some(g)) => Usage {
                contention_ahead_ns: c.ahead_ns(os::now_ns()),
                contention_shared: c.is_shared(),
                // Shared already, or will be at its first gated launch: the grant's ledger is
                // there to attach to, so the arbiter need not divide the share for this process.
                raw_shared: g.is_shared() || self.ledger.has_group(),
                ..u.get()
            },
            _ => Usage::default(),
        }
    }
}

/// What this process's launches on `dev` used, as the shim estimates it (zero before the runtime
/// is initialised). For reports to the arbiter.
pub fn usage(dev: usize) -> Usage {
    peek().map_or(Usage::default(), |r| r.usage(dev))
}

/// Re-basing period of a context's queueing reference: 1 s (reasoning: keeps the GPU-side
/// elapsed times short — `cuEventElapsedTime` is an f32 of ms, ~0.1 µs resolution at 1 s — and
/// clock drift between GPU and CPU negligible).
const CLOCK_REF_PERIOD_NS: u64 = 1_000_000_000;

/// Oldest reference an event's completion is read against: 10 s. Reasoning: the reference moves
/// only with samples on an idle stream ([`CLOCK_REF_PERIOD_NS`]), and a process whose streams
/// never go idle keeps its first. At 10 s `cuEventElapsedTime`'s f32 of ms resolves ~1 µs, and
/// a GPU clock that drifts from the host's by 50 ppm (an assumption: crystal tolerance) is off
/// by 0.5 ms — the size of the waits chained waits are made of, so no older.
const CLOCK_REF_MAX_AGE_NS: u64 = 10_000_000_000;

impl Sampler {
    /// When event `a` of context `ctx`, recorded at CPU time `submitted`, completed on the GPU,
    /// in CLOCK_MONOTONIC ns: the context's reference's submission plus the GPU time between
    /// them, less the smallest offset seen (a launch that did not wait completed as submitted).
    /// `None` without a reference, for an event older than it, or one more than
    /// [`CLOCK_REF_MAX_AGE_NS`] younger.
    fn completed_at(&self, ctx: usize, a: usize, submitted: u64) -> Option<u64> {
        let r = self.clock_refs.iter().find(|r| r.ctx == ctx)?;
        if submitted < r.submitted || submitted - r.submitted > CLOCK_REF_MAX_AGE_NS {
            return None;
        }
        let gpu = (driver::event_elapsed_ms(r.event, a)? as f64 * 1e6) as i64;
        let at = r.submitted as i64 + gpu - r.min_offset_ns;
        u64::try_from(at).ok()
    }

    /// The chained wait of sample `p` ([`Chains::follow`]; its start event's wait `wait` when
    /// known, its pair's span `span_ns`), and its stream's chain moved on to it.
    fn chained_wait(&mut self, p: &Pending, wait: Option<u64>, span_ns: u64) -> Option<Chained> {
        let stream = p.stream;
        let started = match wait {
            Some(w) => Some(p.submitted.saturating_add(w)),
            None => self.completed_at(p.ctx, p.a, p.submitted),
        };
        self.chains.follow(
            Link {
                ctx: p.ctx,
                stream,
                submitted: p.submitted,
                started,
                span_ns,
                pushed_before: p.pushed_before,
                pushed_after: p.pushed_after,
                paid_after: p.paid_after,
                stream_changes: p.stream_changes,
            },
            wait.is_some(),
        )
    }

    /// How long the launch whose start event `a` was recorded at CPU time `submitted` on an idle
    /// stream waited for the GPU: its offset `(a − reference on the GPU) − (submitted − reference
    /// on the CPU)` above the smallest offset seen (a launch that did not wait). Also says whether
    /// `a` was kept as the context's new reference: `Some(old)` with the replaced reference's
    /// event (`None` if it was the first). The first sample of a context only sets the reference.
    fn queue_wait(
        &mut self,
        ctx: usize,
        a: usize,
        submitted: u64,
    ) -> (Option<u64>, Option<Option<usize>>) {
        let Some(r) = self.clock_refs.iter_mut().find(|r| r.ctx == ctx) else {
            self.clock_refs.push(ClockRef {
                ctx,
                event: a,
                submitted,
                min_offset_ns: 0,
            });
            return (None, Some(None));
        };
        if submitted < r.submitted {
            // Settled out of order (older than the reference): no offset to take.
            return (None, None);
        }
        let Some(ms) = driver::event_elapsed_ms(r.event, a) else {
            // The reference is unusable (its context is gone, the address reused): the next
            // sample of this context sets a new one (the old event is leaked, once).
            self.clock_refs.retain(|r| r.ctx != ctx);
            return (None, None);
        };
        let gpu = (ms as f64 * 1e6) as i64;
        let cpu = submitted.saturating_sub(r.submitted) as i64;
        let offset = gpu - cpu;
        r.min_offset_ns = r.min_offset_ns.min(offset);
        let wait = (offset - r.min_offset_ns) as u64;
        if cpu as u64 >= CLOCK_REF_PERIOD_NS {
            // Offsets against `a` are offsets against the old reference minus `offset`.
            let old = r.event;
            r.min_offset_ns -= offset;
            r.event = a;
            r.submitted = submitted;
            return (Some(wait), Some(Some(old)));
        }
        (Some(wait), None)
    }

    /// Sets the counts of unmeasured and probe launches in flight from the pending samples (under
    /// the sampler's lock, where every sample is pushed and settled).
    fn recount(&self, unmeasured: &AtomicU64, probing: &AtomicU64) {
        let (u, p) = self.pending.iter().fold((0u64, 0u64), |(u, p), x| {
            (
                u + u64::from(x.meta.unmeasured),
                p + u64::from(x.meta.probe),
            )
        });
        unmeasured.store(u, Release);
        probing.store(p, Release);
    }

    /// Notes that context `ctx` runs on device `dev` (the sampled path: a scan of a few).
    fn note_device(&mut self, ctx: usize, dev: usize) {
        if !self.ctx_devices.iter().any(|&(c, _)| c == ctx) {
            self.ctx_devices.push((ctx, dev));
        }
    }

    /// Forgets what it holds of a context the driver destroyed (`primary`: device `key`'s
    /// primary context, whose handle the release does not give; else the context `key`): its
    /// pending samples, pooled event pairs and clock reference, whose events died with it. A
    /// new context may get the same handle, and must not be handed the old one's events. For a
    /// primary context, every context sampled on that device goes (which of them was the
    /// primary one is unknown): the next samples rebuild them. The events are leaked, not
    /// destroyed (their context may be gone).
    fn forget_context(&mut self, primary: bool, key: u64) {
        let dead = |ctx: usize, devices: &[(usize, usize)]| {
            if primary {
                devices.iter().any(|&(c, d)| c == ctx && d as u64 == key)
            } else {
                ctx as u64 == key
            }
        };
        let devices = std::mem::take(&mut self.ctx_devices);
        self.pending
            .retain(|p| !(dead(p.ctx, &devices) || (primary && p.meta.dev as u64 == key)));
        self.pools.retain(|(c, _)| !dead(*c, &devices));
        self.clock_refs.retain(|r| !dead(r.ctx, &devices));
        self.ctx_devices = devices
            .iter()
            .copied()
            .filter(|&(c, _)| !dead(c, &devices))
            .collect();
    }

    fn take_pair(&mut self, ctx: usize) -> Option<(usize, usize)> {
        if let Some((_, pool)) = self.pools.iter_mut().find(|(c, _)| *c == ctx) {
            if let Some(p) = pool.pop() {
                return Some(p);
            }
        }
        Some((driver::event_create()?, driver::event_create()?))
    }

    fn give_back(&mut self, ctx: usize, pair: (usize, usize)) {
        match self.pools.iter_mut().find(|(c, _)| *c == ctx) {
            Some((_, pool)) if pool.len() < POOL_PER_CTX => pool.push(pair),
            Some(_) => {} // Pool full: leak the pair (bounded by MAX_PENDING per period).
            None => self.pools.push((ctx, vec![pair])),
        }
    }
}

/// Bytes of a CUDA array: width × max(height,1) × max(depth,1) × element size × channels.
/// Unknown formats (compressed, YUV) are charged 4 bytes per channel element (an upper bound
/// for the 8/16-bit planar formats, approximate for block-compressed ones; documented).
pub fn array_bytes(w: u64, h: u64, d: u64, format: u32, channels: u32) -> u64 {
    let elem: u64 = match format {
        0x01 | 0x08 => 1,        // UNSIGNED_INT8, SIGNED_INT8
        0x02 | 0x09 | 0x10 => 2, // UNSIGNED_INT16, SIGNED_INT16, HALF
        0x03 | 0x0a | 0x20 => 4, // UNSIGNED_INT32, SIGNED_INT32, FLOAT
        _ => 4,
    };
    w.saturating_mul(h.max(1))
        .saturating_mul(d.max(1))
        .saturating_mul(elem)
        .saturating_mul(channels.max(1) as u64)
}

/// Bytes of a mipmapped array of `levels` levels: each level halves the extents of the one
/// before (never below 1; a 0 extent — 1D / 2D — stays 0), charged as [`array_bytes`] each.
pub fn mipmap_bytes(w: u64, h: u64, d: u64, format: u32, channels: u32, levels: u32) -> u64 {
    (0..levels.min(64))
        .map(|l| {
            let e = |x: u64| if x == 0 { 0 } else { (x >> l).max(1) };
            array_bytes(e(w), e(h), e(d), format, channels)
        })
        .fold(0u64, u64::saturating_add)
}

/// The claim on measuring a grant's first context on a device, released when the measurement is
/// published or the context call failed (whichever way `create_context` returns).
struct FirstMeasurement<'a> {
    ledger: &'a Ledger,
    dev: usize,
    mine: bool,
}

impl Drop for FirstMeasurement<'_> {
    fn drop(&mut self) {
        if self.mine {
            self.ledger.end_first_context(self.dev);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(ctx: usize, dev: usize, unmeasured: bool, probe: bool) -> Pending {
        Pending {
            meta: PendingMeta {
                key: 1,
                dev,
                admitted: 0,
                charged: 0,
                unmeasured,
                probe,
                without_turn: false,
            },
            ctx,
            a: 10,
            b: 11,
            submitted: 0,
            idle: true,
            launched: 0,
            not_done_at: 0,
            stream: (0, false),
            pushed_before: 0,
            pushed_after: 0,
            paid_after: 0,
            stream_changes: 0,
        }
    }

    #[test]
    fn a_destroyed_context_leaves_no_events_to_reuse_and_no_launch_waiting_for_its_samples() {
        let (unmeasured, probing) = (AtomicU64::new(0), AtomicU64::new(0));
        let mut s = Sampler::default();
        s.pending.push(pending(0xa000, 0, true, false));
        s.pending.push(pending(0xb000, 1, false, true));
        s.pools.push((0xa000, vec![(1, 2)]));
        s.pools.push((0xb000, vec![(3, 4)]));
        s.pools.push((0xc000, vec![(5, 6)]));
        s.note_device(0xa000, 0);
        s.note_device(0xb000, 1);
        s.note_device(0xc000, 0);
        s.recount(&unmeasured, &probing);
        assert_eq!((unmeasured.load(Acquire), probing.load(Acquire)), (1, 1));
        // cuCtxDestroy of 0xa000: its sample, pool and reference go; 0xb000's stay.
        s.forget_context(false, 0xa000);
        s.recount(&unmeasured, &probing);
        assert_eq!((unmeasured.load(Acquire), probing.load(Acquire)), (0, 1));
        assert_eq!(s.take_pair(0xb000), Some((3, 4)));
        assert!(s.pools.iter().all(|(c, _)| *c != 0xa000));
        // Device 1's primary context released for the last time: the samples and pools of the
        // contexts sampled on device 1 go, device 0's stay.
        s.give_back(0xb000, (3, 4));
        s.forget_context(true, 1);
        s.recount(&unmeasured, &probing);
        assert_eq!(probing.load(Acquire), 0);
        assert!(s.pending.is_empty());
        assert_eq!(s.pools.len(), 1);
        assert_eq!(s.take_pair(0xc000), Some((5, 6)));
    }

    fn util(pid: u32, ts_us: u64, sm: u32) -> driver::ProcessUtilization {
        driver::ProcessUtilization {
            pid,
            ts_us,
            sm_util: sm,
            ..Default::default()
        }
    }

    #[test]
    fn the_calibration_moves_only_as_far_as_a_windows_bounds_prove() {
        // Alone, or under MPS: the figure is the process's own time.
        assert_eq!(
            calibration_target(50_000, 80_000, 0, None, false),
            Some(80_000)
        );
        assert_eq!(
            calibration_target(50_000, 80_000, 900_000, Some(980_000), true),
            Some(80_000)
        );
        // Time-sliced, figures that are own time (the simulated `running` model): device 90 %
        // = 30 % mine + 60 % others, so both bounds are 30 % and it is taken.
        assert_eq!(
            calibration_target(100_000, 300_000, 600_000, Some(900_000), false),
            Some(300_000)
        );
        assert_eq!(
            calibration_target(500_000, 300_000, 600_000, Some(900_000), false),
            Some(300_000)
        );
        // The H200 beside a trainer: 98 % mine, 99 % the trainer's, device 100 %: own time
        // anywhere in 1–98 %; an estimate of 5 % is consistent, nothing moves (before: ×2 per
        // window towards 98 %).
        assert_eq!(
            calibration_target(50_000, 980_000, 990_000, Some(1_000_000), false),
            None
        );
        // The simulated default scenario under `held`: mine 7 %, others 70 % (the trainer's
        // 61 % plus its waits), device 64 %: the lower bound is 0; an estimate of 4 % stays.
        assert_eq!(
            calibration_target(40_000, 70_000, 700_000, Some(640_000), false),
            None
        );
        // Without the device's figure only the upper bound is known: lower, never raise.
        assert_eq!(
            calibration_target(40_000, 70_000, 700_000, None, false),
            None
        );
        assert_eq!(
            calibration_target(90_000, 70_000, 700_000, None, false),
            Some(70_000)
        );
    }

    #[test]
    fn a_windows_figures_sum_over_processes_and_bound_the_device() {
        // Two processes with exclusive figures (a time-sliced GPU NVML-counted as run time):
        // 30 % + 50 % over three 1/6 s samples each.
        let own: Vec<_> = (1..=3)
            .flat_map(|k| [util(1, k * 166_667, 30), util(2, k * 166_667, 50)])
            .collect();
        let sum = window_sum_ppm(&own, 0, 3 * 166_667);
        assert!((790_000..=810_000).contains(&sum), "{sum}");
        // The H200 beside a trainer: a function and the trainer both read ~99 %.
        let held: Vec<_> = (1..=3)
            .flat_map(|k| [util(7, k * 166_667, 98), util(8, k * 166_667 + 10, 99)])
            .collect();
        let sum = window_sum_ppm(&held, 0, 3 * 166_667 + 10);
        assert!(sum > 1_900_000, "{sum}");
        let device = device_window_ppm(&[(166_667, 100), (333_334, 96)], 0, 333_334);
        assert!((979_000..=981_000).contains(&device), "{device}");
        // Samples outside the window, and an empty window, count nothing.
        assert_eq!(window_sum_ppm(&held, 600_000, 600_000), 0);
        assert_eq!(window_sum_ppm(&[util(1, 10, 100)], 10, 20), 0);
    }

    #[test]
    fn a_mipmapped_array_is_charged_every_level() {
        // 64×32 floats, 3 levels: 64×32 + 32×16 + 16×8.
        assert_eq!(
            mipmap_bytes(64, 32, 0, 0x20, 1, 3),
            (64 * 32 + 32 * 16 + 16 * 8) * 4
        );
        // Extents stop at 1; a 1D array stays 1D.
        assert_eq!(mipmap_bytes(4, 0, 0, 0x01, 1, 5), 4 + 2 + 1 + 1 + 1);
        assert_eq!(mipmap_bytes(u64::MAX, 2, 1, 0x20, 4, 2), u64::MAX);
    }

    fn rt(cap: u64) -> Runtime {
        let mut c = Config::default();
        c.mem_cap[0] = cap;
        Runtime::from_parsed(c, &[])
    }

    #[test]
    fn an_allocation_over_the_cap_is_refused_without_calling_the_driver() {
        let r = rt(1000);
        let mut called = 0;
        assert_eq!(
            r.alloc(Some(0), 600, Kind::Ptr, || {
                called += 1;
                (0, 0xa000)
            }),
            0
        );
        assert_eq!(
            r.alloc(Some(0), 600, Kind::Ptr, || {
                called += 1;
                (0, 0xb000)
            }),
            CUDA_ERROR_OUT_OF_MEMORY
        );
        assert_eq!(called, 1);
        assert_eq!(r.ledger.used(0), 600);
        assert_eq!(r.refusals.load(Relaxed), 1);
    }

    #[test]
    fn an_allocation_the_driver_fails_is_rolled_back() {
        let r = rt(1000);
        assert_eq!(r.alloc(Some(0), 300, Kind::Ptr, || (2, 0)), 2);
        assert_eq!(r.ledger.used(0), 0);
    }

    #[test]
    fn a_free_credits_the_allocation() {
        let r = rt(1000);
        assert_eq!(r.alloc(Some(0), 600, Kind::Ptr, || (0, 0xa000)), 0);
        r.freed(Kind::Ptr, 0xa000);
        assert_eq!(r.ledger.used(0), 0);
    }

    #[test]
    fn capped_memory_info_is_the_cap_minus_use_and_never_more_than_physical() {
        let r = rt(1000);
        assert_eq!(r.alloc(Some(0), 600, Kind::Ptr, || (0, 0xa000)), 0);
        assert_eq!(r.virtual_info(0, 80 << 30, 80 << 30), (400, 1000));
        assert_eq!(r.virtual_info(0, 100, 80 << 30), (100, 1000));
    }

    #[test]
    fn a_pitched_allocation_is_charged_its_real_size() {
        let r = rt(1000);
        let undone = std::cell::Cell::new(0);
        assert_eq!(
            r.alloc_sized(
                Some(0),
                512,
                Kind::Ptr,
                || (0, 0xc000, 700),
                |k| undone.set(k)
            ),
            0
        );
        assert_eq!(r.ledger.used(0), 700);
        assert_eq!(undone.get(), 0);
    }

    #[test]
    fn a_pitched_allocation_whose_real_size_does_not_fit_is_undone_and_refused() {
        let r = rt(1000);
        assert_eq!(r.alloc(Some(0), 700, Kind::Ptr, || (0, 0xa000)), 0);
        let undone = std::cell::Cell::new(0);
        assert_eq!(
            r.alloc_sized(
                Some(0),
                200,
                Kind::Ptr,
                || (0, 0xd000, 400),
                |k| undone.set(k)
            ),
            CUDA_ERROR_OUT_OF_MEMORY
        );
        assert_eq!(undone.get(), 0xd000);
        assert_eq!(r.ledger.used(0), 700);
    }

    #[test]
    fn uncapped_memory_info_is_physical() {
        let r = rt(u64::MAX);
        assert_eq!(r.virtual_info(0, 5, 10), (5, 10));
    }

    fn bad_share() -> Vec<config::ConfigError> {
        vec![config::ConfigError {
            var: "SMORE_SM_SHARE".into(),
            value: "0".into(),
            expected: "x",
        }]
    }

    #[test]
    fn a_bad_value_under_fail_open_runs_pass_through() {
        let open = Runtime::from_parsed(Config::default(), &bad_share());
        assert!(!open.enforcing);
    }

    #[test]
    fn a_bad_value_under_fail_closed_refuses_every_allocation_and_throttles_nothing() {
        let closed = Runtime::from_parsed(
            Config {
                policy: FailurePolicy::Closed,
                ..Config::default()
            },
            &bad_share(),
        );
        assert!(closed.enforcing);
        assert_eq!(
            closed.alloc(Some(0), 1, Kind::Ptr, || (0, 1)),
            CUDA_ERROR_OUT_OF_MEMORY
        );
        assert!(limits::none_throttled(closed.limits()));
    }

    #[test]
    fn an_array_is_charged_its_extents_times_element_size_saturating() {
        assert_eq!(array_bytes(64, 0, 0, 0x20, 4), 64 * 16);
        assert_eq!(array_bytes(64, 32, 2, 0x01, 1), 64 * 32 * 2);
        assert_eq!(array_bytes(u64::MAX, 2, 1, 0x20, 4), u64::MAX);
    }
}

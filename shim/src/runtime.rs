//! Glue between the hooks and the safe parts: the per-process [`Runtime`] (configuration, limits
//! view, ledger, gates, cost table, sampler), its lazy initialisation, and the reset in a fork
//! child.
//!
//! Owns the enforcement decisions: reserve/commit/rollback around allocations, the virtualised
//! memory info, launch admission and event sampling, the context-footprint charge. Must never:
//! call the real driver twice for one hooked call, take a lock on the launch path except a
//! `try_lock` on a sampled launch (≤ 1 per ms), or sleep a launch on an unthrottled device.

use crate::config::{self, Config, FailurePolicy, Level};
use crate::ffi::{real, sys};
use crate::gate::{CostTable, Gate, SampleClock, SAMPLE_PERIOD_NS};
use crate::ledger::{Kind, Ledger};
use crate::limits::{LimitsPage, MAX_DEVICES};
use crate::log::{self, RateLimit};
use std::sync::atomic::{AtomicBool, Ordering::*};
use std::sync::Mutex;

/// `CUDA_ERROR_OUT_OF_MEMORY`.
pub const CUDA_ERROR_OUT_OF_MEMORY: u32 = 2;
/// `CUDA_ERROR_NOT_READY` (cuEventQuery on pending work).
const CUDA_ERROR_NOT_READY: u32 = 600;
/// Outstanding sampled event pairs before sampling pauses (a deep queue means samples complete
/// late; more pending pairs would only cost events). Reasoning: 8 × 1 ms period ≥ the time
/// queued work takes to drain at typical shares.
const MAX_PENDING: usize = 8;
/// Event pairs kept per context for reuse.
const POOL_PER_CTX: usize = 8;

/// Everything the hooks need, for one process image (a fork child gets a new one).
pub struct Runtime {
    pub config: Config,
    /// False when the configuration was invalid under the fail-open policy: pure pass-through.
    pub enforcing: bool,
    pub limits: &'static LimitsPage,
    pub ledger: Ledger,
    gates: [Gate; MAX_DEVICES],
    pub costs: CostTable,
    sample_clock: SampleClock,
    sampler: Mutex<Sampler>,
    ctx_charged: [AtomicBool; MAX_DEVICES],
    window_ns: u64,
}

#[derive(Default)]
struct Sampler {
    /// (context, free event pairs).
    pools: Vec<(usize, Vec<(usize, usize)>)>,
    pending: Vec<Pending>,
}

struct Pending {
    key: u64,
    ctx: usize,
    a: usize,
    b: usize,
}

static RUNTIME: sys::LeakedSlot<Runtime> = sys::LeakedSlot::new();
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

/// The runtime if it enforces anything.
#[inline]
pub fn enforcing() -> Option<&'static Runtime> {
    Some(get()).filter(|r| r.enforcing)
}

/// The runtime if some device's launches are throttled (the launch fast path is `None`).
#[inline]
pub fn throttling() -> Option<&'static Runtime> {
    let r = get();
    (r.enforcing && !r.limits.none_throttled()).then_some(r)
}

#[cold]
fn init() -> &'static Runtime {
    let parsed = config::parse(|k| std::env::var(k).ok());
    let rt = Runtime::from_parsed(parsed.config, &parsed.errors);
    let rt = RUNTIME.install(Box::new(rt));
    sys::register_atfork();
    rt
}

/// Fork child: forget the parent's runtime (its allocations, contexts and events are not the
/// child's) without locking or freeing; the next hook call initialises a fresh one.
pub fn after_fork_child() {
    RUNTIME.clear();
}

fn fmt_bytes(b: u64) -> String {
    if b == u64::MAX {
        "unlimited".into()
    } else if b >= 1 << 30 && b % (1 << 20) == 0 {
        format!("{b} B ({:.2} GiB)", b as f64 / (1u64 << 30) as f64)
    } else {
        format!("{b} B ({:.1} MiB)", b as f64 / (1u64 << 20) as f64)
    }
}

impl Runtime {
    /// Builds the runtime from a parsed configuration, reporting errors once and applying the
    /// failure policy to them.
    pub fn from_parsed(mut config: Config, errors: &[config::ConfigError]) -> Runtime {
        log::set_level(config.log);
        let mut enforcing = true;
        if !errors.is_empty() {
            let first = !REPORTED.swap(true, AcqRel);
            let msgs: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
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
                    if first {
                        log::line(
                            Level::Error,
                            format_args!(
                                "{}; SMORE_FAILURE_POLICY=closed: every device allocation is refused",
                                msgs.join("; ")
                            ),
                        );
                    }
                }
            }
        }
        let limits: &'static LimitsPage =
            Box::leak(Box::new(LimitsPage::new(&config.mem_cap, &config.sm_share)));
        if enforcing && log::enabled(Level::Info) {
            log::line(
                Level::Info,
                format_args!(
                    "standalone mode: memory cap {} , SM share {} % (device 0), window {} ms, policy {:?}",
                    fmt_bytes(config.mem_cap[0]),
                    config.sm_share[0],
                    config.window_ms,
                    config.policy
                ),
            );
        }
        Runtime {
            window_ns: config.window_ms * 1_000_000,
            config,
            enforcing,
            limits,
            ledger: Ledger::new(),
            gates: std::array::from_fn(|_| Gate::new()),
            costs: CostTable::new(),
            sample_clock: SampleClock::default(),
            sampler: Mutex::new(Sampler::default()),
            ctx_charged: std::array::from_fn(|_| AtomicBool::new(false)),
        }
    }

    /// What to do when an allocation cannot be accounted (device unknown).
    fn unaccountable(&self, call: impl FnOnce() -> (u32, u64)) -> u32 {
        match self.config.policy {
            FailurePolicy::Open => {
                log::limited(
                    &UNACCOUNTED_LOG,
                    sys::now_ns(),
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
        self.alloc_sized(dev, bytes, kind, || {
            let (rc, key) = call();
            (rc, key, bytes)
        })
    }

    /// As [`Runtime::alloc`], for allocations whose final size is known only afterwards
    /// (pitched): `estimate` is reserved, then adjusted to the size `call` reports.
    pub fn alloc_sized(
        &self,
        dev: Option<usize>,
        estimate: u64,
        kind: Kind,
        call: impl FnOnce() -> (u32, u64, u64),
    ) -> u32 {
        let Some(dev) = dev.or_else(real::ctx_device) else {
            return self.unaccountable(|| {
                let (rc, key, _) = call();
                (rc, key)
            });
        };
        if estimate == 0 {
            // The driver rejects zero-byte requests; nothing to charge.
            return call().0;
        }
        let cap = self.limits.cap(dev);
        match self.ledger.reserve(dev, estimate, cap) {
            Err(e) => {
                log::limited(
                    &OVERCAP_LOG,
                    sys::now_ns(),
                    Level::Warn,
                    format_args!(
                        "device {}: allocation of {} refused (CUDA_ERROR_OUT_OF_MEMORY): cap {}, in use {}",
                        e.dev,
                        fmt_bytes(e.request),
                        fmt_bytes(e.cap),
                        fmt_bytes(e.used)
                    ),
                );
                CUDA_ERROR_OUT_OF_MEMORY
            }
            Ok(mut r) => {
                let (rc, key, actual) = call();
                if rc == 0 && key != 0 {
                    if actual != r.bytes() {
                        r.resize(actual);
                    }
                    r.commit(kind, key);
                }
                rc
            }
        }
    }

    /// Credits a handle the driver has freed.
    pub fn freed(&self, kind: Kind, key: u64) {
        if key != 0 {
            self.ledger.release(kind, key);
        }
    }

    /// The memory view of a capped device: total = min(cap, physical total), free =
    /// min(physical free, cap − used). Uncapped devices are reported as they are.
    pub fn virtual_info(&self, dev: usize, phys_free: u64, phys_total: u64) -> (u64, u64) {
        let cap = self.limits.cap(dev);
        if cap == u64::MAX {
            return (phys_free, phys_total);
        }
        let total = cap.min(phys_total);
        let free = phys_free.min(cap.saturating_sub(self.ledger.used(dev)));
        (free, total)
    }

    /// Charges the context footprint once per device: what NVML attributes to this process right
    /// after its first context on `dev`, minus what the ledger already holds there.
    pub fn on_context(&self, dev: usize) {
        let Some(flag) = self.ctx_charged.get(dev) else {
            return;
        };
        if flag.swap(true, AcqRel) {
            return;
        }
        match real::nvml_process_mem(dev, sys::pid()) {
            Some(mem) => {
                let footprint = mem.saturating_sub(self.ledger.used(dev));
                self.ledger.force_charge(dev, footprint);
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

    /// Admits a launch keyed by its CUfunction / CUgraphExec, sleeping precisely if the device's
    /// share is spent, and samples its GPU time at most once per period.
    pub fn launch(&self, key: u64, stream: usize, ptsz: bool, call: impl FnOnce() -> u32) -> u32 {
        let Some(dev) = real::ctx_device() else {
            return call();
        };
        let share = self.limits.share(dev);
        if share >= 100 {
            return call();
        }
        let cost = self.costs.estimate(key);
        let mut now = sys::now_ns();
        if let Some(deadline) = self.gates[dev.min(MAX_DEVICES - 1)].admit(now, cost, share, self.window_ns) {
            sys::sleep_until(deadline);
            now = deadline;
        }
        if !self.sample_clock.try_claim(now, SAMPLE_PERIOD_NS) {
            return call();
        }
        self.sampled_launch(key, stream, ptsz, call)
    }

    fn sampled_launch(&self, key: u64, stream: usize, ptsz: bool, call: impl FnOnce() -> u32) -> u32 {
        let Ok(mut s) = self.sampler.try_lock() else {
            return call();
        };
        s.harvest(&self.costs);
        if s.pending.len() >= MAX_PENDING || real::stream_capturing(stream, ptsz) != Some(false) {
            return call();
        }
        let Some(ctx) = real::ctx_current() else {
            return call();
        };
        let Some((a, b)) = s.take_pair(ctx) else {
            return call();
        };
        if !real::event_record(a, stream, ptsz) {
            s.give_back(ctx, (a, b));
            return call();
        }
        let rc = call();
        if rc == 0 && real::event_record(b, stream, ptsz) {
            s.pending.push(Pending { key, ctx, a, b });
        } else {
            s.give_back(ctx, (a, b));
        }
        rc
    }
}

impl Sampler {
    fn take_pair(&mut self, ctx: usize) -> Option<(usize, usize)> {
        if let Some((_, pool)) = self.pools.iter_mut().find(|(c, _)| *c == ctx) {
            if let Some(p) = pool.pop() {
                return Some(p);
            }
        }
        Some((real::event_create()?, real::event_create()?))
    }

    fn give_back(&mut self, ctx: usize, pair: (usize, usize)) {
        match self.pools.iter_mut().find(|(c, _)| *c == ctx) {
            Some((_, pool)) if pool.len() < POOL_PER_CTX => pool.push(pair),
            Some(_) => {} // Pool full: leak the pair (bounded by MAX_PENDING per period).
            None => self.pools.push((ctx, vec![pair])),
        }
    }

    /// Folds every completed sample into the cost table; drops pairs that errored.
    fn harvest(&mut self, costs: &CostTable) {
        let mut i = 0;
        while i < self.pending.len() {
            let p = &self.pending[i];
            match real::event_query(p.b) {
                CUDA_ERROR_NOT_READY => i += 1,
                rc => {
                    let p = self.pending.swap_remove(i);
                    if rc == 0 {
                        if let Some(ms) = real::event_elapsed_ms(p.a, p.b) {
                            costs.record(p.key, (ms as f64 * 1e6) as u64);
                        }
                        self.give_back(p.ctx, (p.a, p.b));
                    }
                }
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn rt(cap: u64) -> Runtime {
        let mut c = Config::default();
        c.mem_cap[0] = cap;
        Runtime::from_parsed(c, &[])
    }

    #[test]
    fn alloc_commit_rollback_and_refusal() {
        let r = rt(1000);
        let mut called = 0;
        assert_eq!(r.alloc(Some(0), 600, Kind::Ptr, || { called += 1; (0, 0xa000) }), 0);
        // Over the cap: the driver is not called.
        assert_eq!(r.alloc(Some(0), 600, Kind::Ptr, || { called += 1; (0, 0xb000) }), 2);
        assert_eq!(called, 1);
        // The driver fails: rolled back.
        assert_eq!(r.alloc(Some(0), 300, Kind::Ptr, || (2, 0)), 2);
        assert_eq!(r.ledger.used(0), 600);
        assert_eq!(r.virtual_info(0, 80 << 30, 80 << 30), (400, 1000));
        assert_eq!(r.virtual_info(0, 100, 80 << 30), (100, 1000), "never more than physical");
        r.freed(Kind::Ptr, 0xa000);
        assert_eq!(r.ledger.used(0), 0);
        // Pitched: estimate reserved, actual charged.
        assert_eq!(r.alloc_sized(Some(0), 512, Kind::Ptr, || (0, 0xc000, 700)), 0);
        assert_eq!(r.ledger.used(0), 700);
    }

    #[test]
    fn uncapped_info_is_physical() {
        let r = rt(u64::MAX);
        assert_eq!(r.virtual_info(0, 5, 10), (5, 10));
    }

    #[test]
    fn bad_config_policies() {
        let e = vec![config::ConfigError {
            var: "SMORE_SM_SHARE".into(),
            value: "0".into(),
            expected: "x",
        }];
        let open = Runtime::from_parsed(Config::default(), &e);
        assert!(!open.enforcing);
        let closed = Runtime::from_parsed(
            Config {
                policy: FailurePolicy::Closed,
                ..Config::default()
            },
            &e,
        );
        assert!(closed.enforcing);
        assert_eq!(closed.alloc(Some(0), 1, Kind::Ptr, || (0, 1)), 2);
        assert!(closed.limits.none_throttled());
    }

    #[test]
    fn array_sizes() {
        assert_eq!(array_bytes(64, 0, 0, 0x20, 4), 64 * 16);
        assert_eq!(array_bytes(64, 32, 2, 0x01, 1), 64 * 32 * 2);
        assert_eq!(array_bytes(u64::MAX, 2, 1, 0x20, 4), u64::MAX);
    }
}

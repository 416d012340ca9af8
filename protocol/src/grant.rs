//! The grant page: one 4 KiB page per function instance, written by the arbiter and mapped
//! read-only by the shim (a memfd sealed with `F_SEAL_FUTURE_WRITE`, so no client can map it
//! writable, not even by re-opening `/proc/self/fd/N`). Every field the shim reads is an atomic,
//! so the launch path reads its share with one relaxed load and the arbiter's changes are seen
//! within one launch.
//!
//! Slot `d` describes the process's CUDA ordinal `d` (what the process calls device `d` after
//! `CUDA_VISIBLE_DEVICES`); a device the instance was not admitted to has cap 0 (no allocation).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

/// Devices per process the page describes (CUDA ordinals 0..16). Reasoning: the largest common
/// nodes have 8–16 GPUs; ordinals beyond this are passed through unaccounted (documented).
pub const MAX_DEVICES: usize = 16;
/// `b"SMORELIM"` — identifies a grant page (checked after mmap).
pub const PAGE_MAGIC: u64 = 0x4d49_4c45_524f_4d53;
/// Horizon over which a function may spend its contention budget (`DeviceGrant::contention_ppm`):
/// 1 s — the shim's bucket holds a launch once its collision debt runs more than this far ahead of
/// wall time at the granted rate, and the arbiter's request admission predicts that hold with the
/// same horizon. Reasoning: θ_train bounds the trainer's *mean* slowdown (SMORE paper §IV), not
/// every 100 ms, so a burst of requests may spend the collision allowance of a longer horizon; the
/// trainer's phases last tens of ms, so 1 s spans many of them while keeping the worst burst
/// (budget × 1 s, e.g. 50 ms at 5 %) to a few training iterations (docs/harvest.md).
pub const CONTENTION_HORIZON_NS: u64 = 1_000_000_000;
/// Layout version of [`GrantPage`]. 2: `DeviceGrant::contention_ppm` (was padding). 3:
/// `GrantPage::slot_uuid` (the GPU each slot describes). 4: `DeviceGrant::defer_until_ns`. 5:
/// `DeviceGrant::switch_ns`. 6: `DeviceGrant::turn_key_ns`, `DeviceGrant::turn_seat`. 7:
/// `DeviceGrant::timing_noise` (was reserved, zero). 8: `DeviceGrant::sharing`.
pub const PAGE_VERSION: u32 = 8;
/// Largest context-switch charge a page may carry: 10 ms (ns). Reasoning: a real H200's trainer
/// lost 0.1–0.35 ms per overlap, two switches (docs/real-gpu.md, section 9); a value beyond a
/// few timeslices is a typo, and the shim never trusts foreign memory past it.
pub const MAX_SWITCH_NS: u64 = 10_000_000;
/// Largest timing-noise allowance a page may carry, for a wait and for a stretch each: 300 µs.
/// Reasoning: about 2.5 × the H200's p99 jitter (122 µs for a wait, docs/real-gpu.md, section
/// 10). The waits it is to tell from noise are comparable or longer — in the demo's co-located
/// runs on that GPU a sampled launch's wait was 285–414 µs at the median and 1.1–1.7 ms at p90 —
/// and the allowance is taken off each wait, not a threshold under which a wait is dropped; an
/// allowance of a millisecond would hide most of them. A part past it on a page is foreign or
/// corrupt memory and is read as 0: no allowance counts every collision, the side that protects
/// training.
pub const MAX_TIMING_NOISE_US: u32 = 300;

/// How far the shim's event-pair timing strays on a GPU with nothing to wait for: what a sample's
/// wait and its stretch past its solo cost must pass before any of them counts as a collision
/// (docs/harvest.md, "Timing noise"). A node's property, set by the arbiter from `[gpus]
/// wait_noise_us` / `stretch_noise_us`, never by the process whose collisions it judges.
/// Each part at most [`MAX_TIMING_NOISE_US`]; a part past it counts as 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct TimingNoise {
    /// A start event's wait above the smallest offset seen, with nothing to wait for, µs.
    pub wait_us: u32,
    /// A kernel's duration above its floor, with nothing beside it, µs.
    pub stretch_us: u32,
}

impl TimingNoise {
    /// No allowance: exact timestamps (the simulated GPU's, docs/simgpu.md).
    pub const NONE: TimingNoise = TimingNoise {
        wait_us: 0,
        stretch_us: 0,
    };
    /// What an NVIDIA H200 measured (`tests/gpu/wait_jitter.py`, docs/real-gpu.md, section 10):
    /// a tiny kernel's start event on an idle stream of an idle GPU read 47 / 88 / 122 µs
    /// (p50 / p90 / p99) above the smallest offset seen, 4 % of them 100 µs or more, the same
    /// with every CPU busy; its duration strayed 24 / 44 / 57 µs above its floor. The wait
    /// allowance is about the p96, the stretch's about the p99. The default of a node.
    pub const H200: TimingNoise = TimingNoise {
        wait_us: 100,
        stretch_us: 60,
    };

    /// The allowance for a wait, ns (0 for a part past [`MAX_TIMING_NOISE_US`]).
    pub fn wait_ns(self) -> u64 {
        u64::from(in_bounds(self.wait_us)) * 1_000
    }

    /// The allowance for a stretch, ns (0 for a part past [`MAX_TIMING_NOISE_US`]).
    pub fn stretch_ns(self) -> u64 {
        u64::from(in_bounds(self.stretch_us)) * 1_000
    }

    /// The page's word: the wait's µs in the low half, the stretch's in the high, a part past
    /// [`MAX_TIMING_NOISE_US`] as 0.
    fn word(self) -> u32 {
        in_bounds(self.wait_us) | (in_bounds(self.stretch_us) << 16)
    }

    /// What a page's word says, a part past [`MAX_TIMING_NOISE_US`] as 0 (the page may be
    /// foreign memory).
    fn from_word(w: u32) -> TimingNoise {
        TimingNoise {
            wait_us: in_bounds(w & 0xffff),
            stretch_us: in_bounds(w >> 16),
        }
    }
}

/// A timing-noise part as used: itself up to [`MAX_TIMING_NOISE_US`], 0 past it (less
/// allowance counts more collisions: the side that protects training).
fn in_bounds(us: u32) -> u32 {
    if us > MAX_TIMING_NOISE_US {
        0
    } else {
        us
    }
}

/// How a GPU's processes share it, as NVML shows it (the arbiter reads it; the grant page
/// carries it to the shims, [`GrantPage::sharing`]). It decides how much a function's kernel
/// costs a training job it meets (docs/harvest.md, "Where the targets stand"): its whole run time
/// when contexts take turns, only its slowing when they run concurrently.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Sharing {
    /// No process on the GPU is an MPS client: contexts take turns in time slices.
    TimeSliced,
    /// At least one process is an MPS client (`nvmlDeviceGetMPSComputeRunningProcesses`): its
    /// kernels run concurrently with other clients' instead of in turns.
    Mps,
}

impl Sharing {
    /// What NVML's two process lists say: MPS clients listed → MPS; compute processes but no MPS
    /// client → time-sliced; no compute process (or the MPS list unsupported) → unknown.
    pub fn from_process_lists(compute: usize, mps_clients: Option<usize>) -> Option<Sharing> {
        match mps_clients {
            Some(n) if n > 0 => Some(Sharing::Mps),
            Some(_) if compute > 0 => Some(Sharing::TimeSliced),
            _ => None,
        }
    }
}

impl Sharing {
    /// The page's word: 0 = not known, 1 = time-sliced, 2 = MPS.
    fn word(mode: Option<Sharing>) -> u32 {
        match mode {
            None => 0,
            Some(Sharing::TimeSliced) => 1,
            Some(Sharing::Mps) => 2,
        }
    }

    /// What a page's word says; any other value is not known (the page may be foreign memory,
    /// and not known is the side that counts every collision).
    fn from_word(w: u32) -> Option<Sharing> {
        match w {
            1 => Some(Sharing::TimeSliced),
            2 => Some(Sharing::Mps),
            _ => None,
        }
    }
}

/// Now on the clock of `DeviceGrant::defer_until_ns`: CLOCK_MONOTONIC, ns. Every process of the
/// machine reads the same clock (the shim's launch path reads it with its own `clock_gettime`).
pub fn monotonic_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (t.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(t.tv_nsec as u64)
}

/// Bytes the arbiter allocates for a page (one page; the layout uses far less).
pub const PAGE_BYTES: usize = 4096;

/// One device's grant.
#[repr(C)]
#[derive(Debug)]
pub struct DeviceGrant {
    /// Memory cap in bytes; `u64::MAX` = uncapped.
    pub mem_cap_bytes: AtomicU64,
    /// SM time share in percent, 1..=100 (100 = unthrottled): caps the function's raw GPU time.
    pub sm_share_pct: AtomicU32,
    /// The share of wall time this function may spend *colliding* with other contexts' work
    /// (training), in parts per million; 0 = harvest off (the raw share alone applies). See
    /// docs/shim.md, "Harvest".
    pub contention_ppm: AtomicU32,
    /// Bumped by the owner on every change of this device's grant.
    pub generation: AtomicU64,
    /// Harvest: until when (CLOCK_MONOTONIC ns, the clock every process of the machine shares)
    /// the function's current request can still start and meet its deadline; while a launch is
    /// before it, the shim may hold the launch until the training job's busy phase is over
    /// instead of colliding with it (docs/harvest.md, "Deferral"). 0 = no deferral. Written by
    /// the arbiter at each request's admission; a hold only ever delays the function itself.
    pub defer_until_ns: AtomicU64,
    /// Harvest: what one context switch between the function and the training job costs on this
    /// GPU, ns (0: free, or an MPS GPU, where contexts do not switch). The shim charges each
    /// collision it measures two of them — the GPU switches to the function and back — beside
    /// the collision's run time (docs/harvest.md, "Context switches"). Set by the arbiter from
    /// the node's `[gpus] context_switch_us`; at most [`MAX_SWITCH_NS`].
    pub switch_ns: AtomicU64,
    /// Harvest with turns: the deadline of the function's current request (CLOCK_MONOTONIC ns;
    /// 0 = none known), its place in line for the GPU's turn — the earliest deadline goes first
    /// (docs/harvest.md, "Serializing the functions"). Written by the arbiter at each request's
    /// admission on a GPU whose functions take turns.
    pub turn_key_ns: AtomicU64,
    /// Harvest with turns: the function's seat on its GPU's turn board, index + 1 (0 = none: it
    /// runs without turns). Assigned by the arbiter per instance, so every process of the grant
    /// — fork children, exec'd descendants, in any pid namespace — takes turns as one function.
    pub turn_seat: AtomicU32,
    /// Harvest: the node's [`TimingNoise`] allowance, as [`TimingNoise::word`] packs it (0: none,
    /// as under MPS or before the GPU's mode is known). Set by the arbiter at each write of the
    /// grant.
    pub timing_noise: AtomicU32,
    /// How the GPU's processes share it, as the arbiter last read it from NVML ([`Sharing`];
    /// 0 = not known, 1 = time-sliced, 2 = MPS). The shim judges a sampled launch's wait by it:
    /// under MPS a wait is not a collision (docs/harvest.md, "Waits under MPS"). The arbiter's,
    /// never the function's own reading: a function that could claim MPS on a time-sliced GPU
    /// would have its waits, there the collisions themselves, counted as nothing.
    pub sharing: AtomicU32,
}

/// The page: header plus [`MAX_DEVICES`] grants and slot UUIDs. 8 + 4 + 4 + 16 × 64 + 16 × 16 =
/// 1 296 bytes (< 4 KiB; a grant is 60 bytes of fields padded to 64).
#[repr(C)]
#[derive(Debug)]
pub struct GrantPage {
    /// [`PAGE_MAGIC`].
    pub magic: u64,
    /// [`PAGE_VERSION`] of the writer.
    pub version: u32,
    /// Bit d set ⇔ device d has a share below 100 or a contention budget (harvest mode): the
    /// launch fast path reads only this word.
    pub throttled_mask: AtomicU32,
    /// Slot `d`: the grant of CUDA ordinal `d` (of the GPU [`GrantPage::slot_uuid`] names, when
    /// the owner wrote one).
    pub devices: [DeviceGrant; MAX_DEVICES],
    /// Per slot: the 16-byte UUID of the GPU the slot's grant is for (two words, native byte
    /// order of the bytes as `cuDeviceGetUuid` returns them); all zero = not said. When any slot
    /// names a GPU, the shim maps each CUDA ordinal to the slot of the same UUID and gives a
    /// device no slot names nothing (issue 12 item 9: a function that changed
    /// `CUDA_VISIBLE_DEVICES` ran unthrottled on a GPU it was not granted).
    pub slot_uuid: [[AtomicU64; 2]; MAX_DEVICES],
}

const _: () = assert!(std::mem::size_of::<GrantPage>() <= PAGE_BYTES);

impl GrantPage {
    /// A page with every device uncapped and unthrottled.
    pub fn unlimited() -> GrantPage {
        GrantPage {
            magic: PAGE_MAGIC,
            version: PAGE_VERSION,
            throttled_mask: AtomicU32::new(0),
            devices: std::array::from_fn(|_| DeviceGrant {
                mem_cap_bytes: AtomicU64::new(u64::MAX),
                sm_share_pct: AtomicU32::new(100),
                contention_ppm: AtomicU32::new(0),
                generation: AtomicU64::new(0),
                defer_until_ns: AtomicU64::new(0),
                switch_ns: AtomicU64::new(0),
                turn_key_ns: AtomicU64::new(0),
                turn_seat: AtomicU32::new(0),
                timing_noise: AtomicU32::new(0),
                sharing: AtomicU32::new(0),
            }),
            slot_uuid: std::array::from_fn(|_| [AtomicU64::new(0), AtomicU64::new(0)]),
        }
    }

    /// Owner-side: slot `dev` describes the GPU of UUID `uuid` (bytes as `cuDeviceGetUuid`).
    pub fn set_slot_uuid(&self, dev: usize, uuid: [u8; 16]) {
        let Some(w) = self.slot_uuid.get(dev) else {
            return;
        };
        w[0].store(
            u64::from_ne_bytes(uuid[..8].try_into().unwrap_or_default()),
            Relaxed,
        );
        w[1].store(
            u64::from_ne_bytes(uuid[8..].try_into().unwrap_or_default()),
            Relaxed,
        );
    }

    /// The UUID slot `dev` describes, if the owner said.
    pub fn slot_uuid(&self, dev: usize) -> Option<[u8; 16]> {
        let w = self.slot_uuid.get(dev)?;
        let (a, b) = (w[0].load(Relaxed), w[1].load(Relaxed));
        if a == 0 && b == 0 {
            return None;
        }
        let mut u = [0u8; 16];
        u[..8].copy_from_slice(&a.to_ne_bytes());
        u[8..].copy_from_slice(&b.to_ne_bytes());
        Some(u)
    }

    /// Whether any slot names its GPU (then devices no slot names get nothing).
    pub fn names_gpus(&self) -> bool {
        (0..MAX_DEVICES).any(|d| self.slot_uuid(d).is_some())
    }

    /// The slot whose GPU has UUID `uuid`.
    pub fn slot_of_uuid(&self, uuid: &[u8; 16]) -> Option<usize> {
        (0..MAX_DEVICES).find(|&d| self.slot_uuid(d).as_ref() == Some(uuid))
    }

    /// Whether a mapped page is one of ours, of this layout version.
    pub fn is_valid(&self) -> bool {
        self.magic == PAGE_MAGIC && self.version == PAGE_VERSION
    }

    /// Owner-side update of one device. Only the page's owner (the arbiter, or the shim for its
    /// process-local standalone page) calls this.
    pub fn set(&self, dev: usize, cap: u64, share: u32) {
        let Some(d) = self.devices.get(dev) else {
            return;
        };
        let share = share.clamp(1, 100);
        d.mem_cap_bytes.store(cap, Relaxed);
        d.sm_share_pct.store(share, Relaxed);
        d.generation.fetch_add(1, Relaxed);
        self.update_mask(dev);
    }

    /// Owner-side update of one device's contention budget (ppm of wall time; 0 = harvest off,
    /// values above 10⁶ are clamped). A device with a budget counts as throttled.
    pub fn set_contention(&self, dev: usize, ppm: u32) {
        let Some(d) = self.devices.get(dev) else {
            return;
        };
        d.contention_ppm.store(ppm.min(1_000_000), Relaxed);
        d.generation.fetch_add(1, Relaxed);
        self.update_mask(dev);
    }

    /// Owner-side: the current request of the function may start as late as `until_ns`
    /// (CLOCK_MONOTONIC; 0 = no deferral). Not a grant change: the generation is not bumped.
    pub fn set_defer_until(&self, dev: usize, until_ns: u64) {
        if let Some(d) = self.devices.get(dev) {
            d.defer_until_ns.store(until_ns, Relaxed);
        }
    }

    /// Owner-side: the deadline of the function's current request on `dev` (CLOCK_MONOTONIC; 0 =
    /// none), its place in line for the GPU's turn. Not a grant change: the generation is not
    /// bumped.
    pub fn set_turn_key(&self, dev: usize, deadline_ns: u64) {
        if let Some(d) = self.devices.get(dev) {
            d.turn_key_ns.store(deadline_ns, Relaxed);
        }
    }

    /// Owner-side: the function's seat on `dev`'s turn board (`None`: no seat, no turns).
    pub fn set_turn_seat(&self, dev: usize, seat: Option<usize>) {
        if let Some(d) = self.devices.get(dev) {
            d.turn_seat.store(seat.map_or(0, |s| s as u32 + 1), Relaxed);
        }
    }

    /// The function's seat on `dev`'s turn board, if it has one (also none for untracked
    /// devices).
    pub fn turn_seat(&self, dev: usize) -> Option<usize> {
        let v = self.devices.get(dev)?.turn_seat.load(Relaxed);
        (v as usize).checked_sub(1)
    }

    /// The deadline of the function's current request on `dev`, its place in line for the GPU's
    /// turn (CLOCK_MONOTONIC ns; 0 = none known, also for untracked devices).
    pub fn turn_key(&self, dev: usize) -> u64 {
        self.devices
            .get(dev)
            .map_or(0, |d| d.turn_key_ns.load(Relaxed))
    }

    /// Owner-side: one context switch on `dev` costs `ns` (clamped to [`MAX_SWITCH_NS`]). Not a
    /// grant change: the generation is not bumped (the shim reads it at each settled sample).
    pub fn set_switch(&self, dev: usize, ns: u64) {
        if let Some(d) = self.devices.get(dev) {
            d.switch_ns.store(ns.min(MAX_SWITCH_NS), Relaxed);
        }
    }

    /// What one context switch on `dev` costs, ns (0 for untracked devices; never more than
    /// [`MAX_SWITCH_NS`], whatever the page holds).
    pub fn switch(&self, dev: usize) -> u64 {
        self.devices
            .get(dev)
            .map_or(0, |d| d.switch_ns.load(Relaxed).min(MAX_SWITCH_NS))
    }

    /// Owner-side: the node's timing-noise allowance for `dev`'s samples (a part past
    /// [`MAX_TIMING_NOISE_US`] is written as 0). Not a grant change: the generation is not
    /// bumped (the shim reads it at each settled sample).
    pub fn set_timing_noise(&self, dev: usize, noise: TimingNoise) {
        if let Some(d) = self.devices.get(dev) {
            d.timing_noise.store(noise.word(), Relaxed);
        }
    }

    /// Owner-side: how `dev`'s processes share it (`None`: not known). Not a grant change: the
    /// generation is not bumped (the shim reads it at each settled sample).
    pub fn set_sharing(&self, dev: usize, mode: Option<Sharing>) {
        if let Some(d) = self.devices.get(dev) {
            d.sharing.store(Sharing::word(mode), Relaxed);
        }
    }

    /// How `dev`'s processes share it, as the arbiter said (`None`: not said, an untracked
    /// device, or a word that is no mode).
    pub fn sharing(&self, dev: usize) -> Option<Sharing> {
        self.devices
            .get(dev)
            .and_then(|d| Sharing::from_word(d.sharing.load(Relaxed)))
    }

    /// The timing-noise allowance for `dev`'s samples ([`TimingNoise::NONE`] for untracked
    /// devices; a part past [`MAX_TIMING_NOISE_US`] on the page reads as 0).
    pub fn timing_noise(&self, dev: usize) -> TimingNoise {
        self.devices.get(dev).map_or(TimingNoise::NONE, |d| {
            TimingNoise::from_word(d.timing_noise.load(Relaxed))
        })
    }

    /// Until when `dev`'s launches may be deferred (CLOCK_MONOTONIC ns; 0 = not at all, also for
    /// untracked devices).
    pub fn defer_until(&self, dev: usize) -> u64 {
        self.devices
            .get(dev)
            .map_or(0, |d| d.defer_until_ns.load(Relaxed))
    }

    fn update_mask(&self, dev: usize) {
        let d = &self.devices[dev];
        if d.sm_share_pct.load(Relaxed) < 100 || d.contention_ppm.load(Relaxed) > 0 {
            self.throttled_mask.fetch_or(1 << dev, Relaxed);
        } else {
            self.throttled_mask.fetch_and(!(1 << dev), Relaxed);
        }
    }

    /// Contention budget of `dev` in ppm (0 = harvest off; 0 for untracked devices).
    pub fn contention(&self, dev: usize) -> u32 {
        self.devices
            .get(dev)
            .map_or(0, |d| d.contention_ppm.load(Relaxed))
    }

    /// Memory cap of `dev` in bytes (`u64::MAX` = uncapped, also for untracked devices).
    pub fn cap(&self, dev: usize) -> u64 {
        self.devices
            .get(dev)
            .map_or(u64::MAX, |d| d.mem_cap_bytes.load(Relaxed))
    }

    /// SM share of `dev` in percent as written (100 for untracked devices).
    pub fn share(&self, dev: usize) -> u32 {
        self.devices
            .get(dev)
            .map_or(100, |d| d.sm_share_pct.load(Relaxed))
    }

    /// How many times the owner changed `dev`'s grant.
    pub fn generation(&self, dev: usize) -> u64 {
        self.devices
            .get(dev)
            .map_or(0, |d| d.generation.load(Relaxed))
    }
}

/// The 16 bytes of an NVML GPU UUID string (`GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, the
/// spelling of `nvmlDeviceGetUUID` and of `CUDA_VISIBLE_DEVICES`), as `cuDeviceGetUuid` returns
/// them. `None` for anything else (a MIG instance's `MIG-…` included).
pub fn parse_gpu_uuid(s: &str) -> Option<[u8; 16]> {
    let hex: Vec<u8> = s
        .strip_prefix("GPU-")?
        .bytes()
        .filter(|b| *b != b'-')
        .collect();
    if hex.len() != 32 {
        return None;
    }
    let mut u = [0u8; 16];
    for (i, pair) in hex.chunks(2).enumerate() {
        u[i] = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(u)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_name_their_gpu_by_uuid() {
        let p = GrantPage::unlimited();
        assert!(!p.names_gpus());
        let u = parse_gpu_uuid("GPU-01020304-0506-0708-090a-0b0c0d0e0f10").unwrap();
        assert_eq!(u, std::array::from_fn::<u8, 16, _>(|i| i as u8 + 1));
        assert_eq!(
            parse_gpu_uuid("MIG-01020304-0506-0708-090a-0b0c0d0e0f10"),
            None
        );
        assert_eq!(parse_gpu_uuid("GPU-0102"), None);
        p.set_slot_uuid(3, u);
        assert!(p.names_gpus());
        assert_eq!(p.slot_uuid(3), Some(u));
        assert_eq!(p.slot_of_uuid(&u), Some(3));
        assert_eq!(p.slot_of_uuid(&[9; 16]), None);
    }

    #[test]
    fn set_updates_cap_share_generation_and_mask() {
        let p = GrantPage::unlimited();
        assert!(p.is_valid());
        p.set(2, 1 << 30, 25);
        assert_eq!(p.cap(2), 1 << 30);
        assert_eq!(p.share(2), 25);
        assert_eq!(p.generation(2), 1);
        assert_eq!(p.throttled_mask.load(Relaxed), 1 << 2);
        p.set(2, 1 << 30, 100);
        assert_eq!(p.throttled_mask.load(Relaxed), 0);
        p.set(99, 1, 1); // out of range: ignored
        assert_eq!(p.cap(99), u64::MAX);
        p.set(0, 0, 0); // share clamps to 1
        assert_eq!(p.share(0), 1);
    }

    #[test]
    fn a_contention_budget_throttles_the_device_and_keeps_the_share() {
        let p = GrantPage::unlimited();
        assert_eq!(p.contention(3), 0);
        p.set_contention(3, 20_000);
        assert_eq!(p.contention(3), 20_000);
        assert_eq!(p.share(3), 100);
        assert_eq!(p.generation(3), 1);
        assert_eq!(p.throttled_mask.load(Relaxed), 1 << 3);
        // The raw share changes independently; the device stays throttled while either applies.
        p.set(3, u64::MAX, 100);
        assert_eq!(p.throttled_mask.load(Relaxed), 1 << 3);
        p.set_contention(3, 0);
        assert_eq!(p.throttled_mask.load(Relaxed), 0);
        p.set_contention(3, u32::MAX);
        assert_eq!(p.contention(3), 1_000_000);
        p.set_contention(99, 5); // out of range: ignored
        assert_eq!(p.contention(99), 0);
    }

    #[test]
    fn a_switch_cost_is_clamped_and_changes_no_grant() {
        let p = GrantPage::unlimited();
        assert_eq!(p.switch(4), 0);
        p.set_switch(4, 250_000);
        assert_eq!(p.switch(4), 250_000);
        assert_eq!(p.generation(4), 0);
        assert_eq!(p.throttled_mask.load(Relaxed), 0);
        p.set_switch(4, u64::MAX);
        assert_eq!(p.switch(4), MAX_SWITCH_NS);
        // A page written by someone else is read clamped too.
        p.devices[4].switch_ns.store(u64::MAX, Relaxed);
        assert_eq!(p.switch(4), MAX_SWITCH_NS);
        p.set_switch(99, 5); // out of range: ignored
        assert_eq!(p.switch(99), 0);
    }

    #[test]
    fn the_gpus_sharing_is_per_device_changes_no_grant_and_a_foreign_word_is_not_known() {
        let p = GrantPage::unlimited();
        assert_eq!(p.sharing(1), None, "not known until the arbiter says");
        p.set_sharing(1, Some(Sharing::Mps));
        p.set_sharing(2, Some(Sharing::TimeSliced));
        assert_eq!(p.sharing(1), Some(Sharing::Mps));
        assert_eq!(p.sharing(2), Some(Sharing::TimeSliced));
        assert_eq!(p.sharing(0), None);
        assert_eq!(p.sharing(MAX_DEVICES), None, "an untracked device");
        assert_eq!(p.generation(1), 0);
        assert_eq!(p.throttled_mask.load(Relaxed), 0);
        p.set_sharing(1, None);
        assert_eq!(p.sharing(1), None);
        // Foreign or corrupt memory: no mode, the side that counts every wait.
        for w in [3, 0x100, u32::MAX] {
            p.devices[2].sharing.store(w, Relaxed);
            assert_eq!(p.sharing(2), None, "word {w}");
        }
    }

    #[test]
    fn a_timing_noise_allowance_is_per_device_bounded_and_changes_no_grant() {
        let p = GrantPage::unlimited();
        assert_eq!(p.timing_noise(2), TimingNoise::NONE);
        p.set_timing_noise(2, TimingNoise::H200);
        assert_eq!(p.timing_noise(2), TimingNoise::H200);
        assert_eq!(
            (p.timing_noise(2).wait_ns(), p.timing_noise(2).stretch_ns()),
            (100_000, 60_000)
        );
        assert_eq!(p.timing_noise(3), TimingNoise::NONE);
        assert_eq!(p.generation(2), 0);
        assert_eq!(p.throttled_mask.load(Relaxed), 0);
        // A part past the bound is no allowance, on the way in and on the way out (a page
        // written by someone else): the side that counts every collision.
        p.set_timing_noise(
            2,
            TimingNoise {
                wait_us: u32::MAX,
                stretch_us: 7,
            },
        );
        assert_eq!(
            p.timing_noise(2),
            TimingNoise {
                wait_us: 0,
                stretch_us: 7
            }
        );
        let at_bound = TimingNoise {
            wait_us: MAX_TIMING_NOISE_US,
            stretch_us: MAX_TIMING_NOISE_US + 1,
        };
        p.set_timing_noise(2, at_bound);
        assert_eq!(p.timing_noise(2).wait_ns(), 300_000);
        assert_eq!(p.timing_noise(2).stretch_ns(), 0);
        p.devices[2].timing_noise.store(u32::MAX, Relaxed);
        assert_eq!(p.timing_noise(2), TimingNoise::NONE);
        p.devices[2]
            .timing_noise
            .store(200 | (0x8000 << 16), Relaxed);
        assert_eq!(
            p.timing_noise(2),
            TimingNoise {
                wait_us: 200,
                stretch_us: 0
            }
        );
        // A value built by hand is bounded where it is used.
        let wild = TimingNoise {
            wait_us: 5_000,
            stretch_us: 5_000,
        };
        assert_eq!((wild.wait_ns(), wild.stretch_ns()), (0, 0));
        p.set_timing_noise(99, TimingNoise::H200); // out of range: ignored
        assert_eq!(p.timing_noise(99), TimingNoise::NONE);
    }

    #[test]
    fn a_deferral_deadline_is_per_device_and_changes_no_grant() {
        let p = GrantPage::unlimited();
        assert_eq!(p.defer_until(1), 0);
        p.set_defer_until(1, 123_456_789);
        assert_eq!(p.defer_until(1), 123_456_789);
        assert_eq!(p.defer_until(0), 0);
        assert_eq!(p.generation(1), 0);
        assert_eq!(p.throttled_mask.load(Relaxed), 0);
        p.set_defer_until(99, 5); // out of range: ignored
        assert_eq!(p.defer_until(99), 0);
    }
}

//! The shared ledger: one small `MAP_SHARED` table per grant through which every process that
//! holds the grant charges its device memory against the grant's one cap (issue 12 item 4: a
//! function that forked before CUDA initialised gave each child a fresh per-process ledger under
//! the inherited grant — 4 × 1 GiB under one 1 GiB grant).
//!
//! Owns the table's layout and its creation. `smore run` creates it (a memfd, [`create`]) before
//! it execs the function and passes it down as [`ENV_LEDGER_FD`] next to the grant page: that is
//! the one place every process sharing a `smore run` grant descends from — the exec'd process,
//! its fork children (which inherit the fd and the environment even if they fork before their
//! first CUDA call, when no shim has initialised yet) and descendants that exec (the fd is not
//! close-on-exec). The shim maps it read-write and keeps one slot per process
//! (docs/shim.md, "The memory cap").
//!
//! Unlike the grant page the table is writable by the function: it is the function's own
//! bookkeeping, like the per-process ledger it replaces, and the arbiter never trusts it — the
//! NVML watchdog, which sums a function's processes, stays the authority (docs/arbiter.md,
//! "Threat model").
//!
//! Must never: change layout without bumping [`LEDGER_VERSION`]; move or change a word without a
//! new [`LEDGER_MAGIC`] (shims map tables of newer versions: [`LedgerTable::is_valid`]).

use crate::grant::MAX_DEVICES;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU32, AtomicU64};

/// Environment variable through which `smore run` hands the shared ledger's fd to the function.
pub const ENV_LEDGER_FD: &str = "SMORE_LEDGER_FD";
/// `b"SMORELED"` — identifies a shared ledger (checked after mmap).
pub const LEDGER_MAGIC: u64 = 0x4445_4c45_524f_4d53;
/// Layout version of [`LedgerTable`] as [`create`] writes it.
pub const LEDGER_VERSION: u32 = 6;
/// The oldest layout a shim maps: 2. Layouts 3 to 6 only added words (the collision buckets,
/// then the probe clocks and the collision evidence, then the raw-share gates, then the slots'
/// pid namespaces) in what was the zero-filled tail of the same
/// [`LEDGER_BYTES`], so an older table (from an older `smore run`) is a newer one whose added
/// words are empty — refusing it would give every process of the grant a cap of its own.
pub const LEDGER_VERSION_MIN: u32 = 2;
/// Processes that can hold memory under one grant at once: 128. Reasoning: the simulated node
/// admits 128 processes; a real function runs a handful (a server and its workers). A process
/// that finds the table full of live processes is refused every allocation (docs/shim.md).
pub const LEDGER_SLOTS: usize = 128;
/// An owner word of a free slot.
pub const OWNER_FREE: u64 = 0;
/// An owner word of a slot being reclaimed (its process died; its bytes are being zeroed).
pub const OWNER_RECLAIMING: u64 = u64::MAX;

/// One process's charges.
#[repr(C)]
#[derive(Debug)]
pub struct LedgerSlot {
    /// [`owner_word`] of the process holding the slot, [`OWNER_FREE`] or [`OWNER_RECLAIMING`].
    pub owner: AtomicU64,
    /// Bytes the process holds per CUDA ordinal.
    pub bytes: [AtomicU64; MAX_DEVICES],
}

/// The table: header, footprints, first-context claims, [`LEDGER_SLOTS`] slots, the shared
/// collision buckets, probe clocks, collision evidence, raw-share gates and the slots' pid
/// namespaces. 16 + 128 + 128 + 128 × 136 + 4 × 128 + 128 × 4 = 18 704 bytes.
#[repr(C)]
#[derive(Debug)]
pub struct LedgerTable {
    /// [`LEDGER_MAGIC`].
    pub magic: u64,
    /// [`LEDGER_VERSION`].
    pub version: u32,
    /// Zero (a shim of commit fe400f6 wrote its pid namespace here; nothing reads it).
    pub reserved: u32,
    /// Per device (grant-page slot): the largest context footprint a process of the grant
    /// measured there, bytes (0 = none yet). A process's later contexts are checked against the
    /// cap with it before the driver is asked, not only after its own first one was measured.
    pub footprint: [AtomicU64; MAX_DEVICES],
    /// Per device: [`owner_word`] of the process measuring the grant's first context there
    /// ([`OWNER_FREE`] when none). While the footprint is unknown a context cannot be checked
    /// against the cap, so the grant's processes create their first contexts one at a time:
    /// the others wait for the footprint and are then checked with it.
    pub measuring: [AtomicU64; MAX_DEVICES],
    /// One slot per process.
    pub slots: [LedgerSlot; LEDGER_SLOTS],
    /// Per device (grant-page slot), under harvest: the collision bucket every process of the
    /// grant shares — its theoretical arrival time, when what was charged so far is paid for at
    /// the budget's rate, ns of CLOCK_MONOTONIC (0: none). One bucket per grant, as one cap: with
    /// a bucket each, a function's worker processes each spent the grant's whole budget
    /// (docs/harvest.md, "Several processes of one function"). Since layout 3.
    pub contention: [AtomicU64; MAX_DEVICES],
    /// Per device, under harvest: when a process of the grant last probed because the shared
    /// bucket was in debt, ns of CLOCK_MONOTONIC (0: never). One probe per period for the grant,
    /// as for one process: with a probe clock each, three workers in debt sent three times the
    /// unheld probes of one. Since layout 4.
    pub probe: [AtomicU64; MAX_DEVICES],
    /// Per device, under harvest: the grant's newest collision evidence, [`pack_evidence`]
    /// (0: none). A probe's measurement holds or releases every process of the grant, not only
    /// the one that made it. Since layout 4.
    pub evidence: [AtomicU64; MAX_DEVICES],
    /// Per device (grant-page slot), under a raw share below 100 % (an operator's `smore share`,
    /// an over-use correction or the arbiter's throttle): the launch gate every process of the
    /// grant shares — its theoretical arrival time, when what was admitted so far is paid for at
    /// the share's rate, ns of CLOCK_MONOTONIC (0: none). One gate per grant, as one cap: with a
    /// gate each, a function's three workers at a 20 % share took 60 % of the GPU, and the
    /// watchdog then stopped the function for it (docs/shim.md, "One share per grant"). Since
    /// layout 5.
    pub raw: [AtomicU64; MAX_DEVICES],
    /// Per slot: the pid namespace of the process holding it ([`own_pid_namespace`]; 0: not
    /// said — a slot taken by a shim of a layout before 6). A process tells another's life by
    /// `/proc/<pid>`, which names the same process only inside one pid namespace: a slot of
    /// another namespace is never judged dead from outside it (before, a worker under `unshare
    /// --pid --mount-proc` took a live member for dead, reclaimed its bytes and allocated past
    /// the cap; docs/shim.md, "The memory cap"). Written while the slot is marked
    /// [`OWNER_RECLAIMING`], before its owner word. Since layout 6.
    pub slot_ns: [AtomicU32; LEDGER_SLOTS],
}

/// Bits of an evidence word ([`LedgerTable::evidence`]) that hold the probability (ppm, at most
/// 10⁶ < 2²⁰); the rest hold when its sample ran.
const EVIDENCE_PPM_BITS: u32 = 20;
/// Unit of an evidence word's time: 16 µs (44 bits of it span 8.9 years of CLOCK_MONOTONIC;
/// evidence goes stale after milliseconds).
const EVIDENCE_TICK_NS: u64 = 16_000;

/// An evidence word: when the sample behind it ran (`at_ns`, CLOCK_MONOTONIC, rounded down to
/// 16 µs) in the high bits, its collision probability (`ppm`, capped at 2²⁰ − 1) in the low: a
/// newer word is a larger one, so `fetch_max` keeps the newest (within one 16 µs tick, the
/// larger probability: the side of training). A time past 44 bits of ticks (8.9 years of
/// uptime) is held at the largest, which reads as stale from then on: sharing ends, and each
/// process goes on its own evidence.
pub fn pack_evidence(at_ns: u64, ppm: u32) -> u64 {
    let ticks = (at_ns / EVIDENCE_TICK_NS).min((1 << (64 - EVIDENCE_PPM_BITS)) - 1);
    ticks << EVIDENCE_PPM_BITS | u64::from(ppm.min((1 << EVIDENCE_PPM_BITS) - 1))
}

/// The (`at_ns`, `ppm`) of an evidence word; `None` for 0 (none yet).
pub fn unpack_evidence(word: u64) -> Option<(u64, u32)> {
    (word != 0).then(|| {
        (
            (word >> EVIDENCE_PPM_BITS).saturating_mul(EVIDENCE_TICK_NS),
            (word & ((1 << EVIDENCE_PPM_BITS) - 1)) as u32,
        )
    })
}

/// Bytes of the memfd ([`LedgerTable`] rounded up to whole pages).
pub const LEDGER_BYTES: usize = std::mem::size_of::<LedgerTable>().div_ceil(4096) * 4096;

impl LedgerTable {
    /// Whether a mapped table is one of ours: the magic, and a layout version from
    /// [`LEDGER_VERSION_MIN`] on. A newer layout only adds words in the zero-filled tail of the
    /// same [`LEDGER_BYTES`] (an older shim then reads the words it knows and leaves the rest), so
    /// a shim maps tables of layouts newer than its own: refusing one gave each of a grant's
    /// processes a cap of its own. A layout that moves or changes a word takes a new
    /// [`LEDGER_MAGIC`].
    pub fn is_valid(&self) -> bool {
        self.magic == LEDGER_MAGIC && self.version >= LEDGER_VERSION_MIN
    }
}

/// The owner word of a process: its pid in the high half, the low 32 bits of its start time
/// (clock ticks since boot, `/proc/<pid>/stat` field 22) in the low half, so a recycled pid is not
/// taken for the process that held the slot. Never [`OWNER_FREE`] or [`OWNER_RECLAIMING`] for a
/// real pid (pids are > 0 and < 2³²−1).
pub fn owner_word(pid: u32, start_ticks: u64) -> u64 {
    (pid as u64) << 32 | (start_ticks & 0xffff_ffff)
}

/// The pid of an owner word.
pub fn owner_pid(owner: u64) -> u32 {
    (owner >> 32) as u32
}

/// This process's pid namespace as [`LedgerTable::slot_ns`] names it: the inode of
/// `/proc/self/ns/pid`, low 32 bits (namespace inodes are 32-bit), or 0 when it cannot be read.
pub fn own_pid_namespace() -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/pid").map_or(0, |m| m.ino() as u32)
}

/// Creates an empty table: a memfd of [`LEDGER_BYTES`] with the header written and every slot
/// free (zero), sealed against shrinking and growing (the shim maps it for the process's life: a
/// function that truncated it would fault in its own launches). Close-on-exec: the caller clears
/// it on the fd it hands down.
pub fn create() -> std::io::Result<OwnedFd> {
    use rustix::fs::{MemfdFlags, SealFlags};
    let fd = rustix::fs::memfd_create(
        "smore-ledger",
        MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
    )?;
    rustix::fs::ftruncate(&fd, LEDGER_BYTES as u64)?;
    let mut header = [0u8; 16];
    header[..8].copy_from_slice(&LEDGER_MAGIC.to_ne_bytes());
    header[8..12].copy_from_slice(&LEDGER_VERSION.to_ne_bytes());
    let n = rustix::io::pwrite(&fd, &header, 0)?;
    if n != header.len() {
        return Err(std::io::Error::other("short write of the ledger header"));
    }
    rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_is_where_the_layout_says_and_a_created_table_is_sized() {
        assert_eq!(std::mem::offset_of!(LedgerTable, magic), 0);
        assert_eq!(std::mem::offset_of!(LedgerTable, version), 8);
        assert_eq!(std::mem::offset_of!(LedgerTable, footprint), 16);
        assert_eq!(
            std::mem::offset_of!(LedgerTable, measuring),
            16 + 8 * MAX_DEVICES
        );
        assert_eq!(
            std::mem::offset_of!(LedgerTable, slots),
            16 + 16 * MAX_DEVICES
        );
        assert_eq!(std::mem::size_of::<LedgerSlot>(), 8 + 8 * MAX_DEVICES);
        assert_eq!(
            std::mem::offset_of!(LedgerTable, contention),
            16 + 16 * MAX_DEVICES + LEDGER_SLOTS * (8 + 8 * MAX_DEVICES)
        );
        assert_eq!(
            std::mem::offset_of!(LedgerTable, probe),
            std::mem::offset_of!(LedgerTable, contention) + 8 * MAX_DEVICES
        );
        assert_eq!(
            std::mem::offset_of!(LedgerTable, evidence),
            std::mem::offset_of!(LedgerTable, probe) + 8 * MAX_DEVICES
        );
        assert_eq!(
            std::mem::offset_of!(LedgerTable, raw),
            std::mem::offset_of!(LedgerTable, evidence) + 8 * MAX_DEVICES
        );
        assert_eq!(
            std::mem::offset_of!(LedgerTable, slot_ns),
            std::mem::offset_of!(LedgerTable, raw) + 8 * MAX_DEVICES
        );
        assert_eq!(std::mem::size_of::<LedgerTable>(), 18_704);
        assert_eq!(
            LEDGER_BYTES,
            5 * 4096,
            "the same memfd size as layouts 2 to 4"
        );
        let fd = create().unwrap();
        let st = rustix::fs::fstat(&fd).unwrap();
        assert_eq!(st.st_size as usize, LEDGER_BYTES);
        // A function cannot truncate the table under its own processes.
        assert!(rustix::fs::ftruncate(&fd, 0).is_err());
        let mut h = [0u8; 16];
        rustix::io::pread(&fd, &mut h, 0).unwrap();
        assert_eq!(u64::from_ne_bytes(h[..8].try_into().unwrap()), LEDGER_MAGIC);
        assert_ne!(own_pid_namespace(), 0, "/proc/self/ns/pid is readable here");
        let w = owner_word(4242, 0x1_0000_0007);
        assert_eq!((owner_pid(w), w & 0xffff_ffff), (4242, 7));
        assert_ne!(w, OWNER_FREE);
    }

    #[test]
    fn an_evidence_word_keeps_when_and_what_and_a_newer_one_is_larger() {
        let at = 5_000_000_123_456;
        let (t, p) = unpack_evidence(pack_evidence(at, 400_000)).unwrap();
        assert!(t <= at && at - t < EVIDENCE_TICK_NS, "{t}");
        assert_eq!(p, 400_000);
        assert_eq!(unpack_evidence(0), None);
        assert_eq!(
            unpack_evidence(pack_evidence(at, u32::MAX)).unwrap().1,
            (1 << 20) - 1
        );
        // Newer is larger whatever the probabilities: fetch_max keeps the newest.
        assert!(pack_evidence(at + EVIDENCE_TICK_NS, 0) > pack_evidence(at, 1_000_000));
        assert!(unpack_evidence(u64::MAX).is_some(), "any word unpacks");
        let far = unpack_evidence(pack_evidence(u64::MAX, 7)).unwrap();
        assert_eq!(
            far.1, 7,
            "a time past the word's range does not spill into the probability"
        );
    }
}

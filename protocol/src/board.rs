//! The turn board: one small `MAP_SHARED` table per GPU through which the harvesting functions of
//! a time-sliced GPU take turns, one function's queued work at a time (docs/harvest.md,
//! "Serializing the functions"; docs/shim.md, "Turns").
//!
//! Why: on a time-sliced GPU a function kernel that waits behind another function's looks, to its
//! shim, exactly like one that waits behind the training job, so the shims charged their
//! collision budget for waits behind each other, and the GPU's round robin among contexts served
//! several functions' requests at once instead of one after the other (docs/harvest.md has the
//! study that measured it, and what turns in smore measured).
//!
//! Owns the table's layout and its creation. The arbiter creates one per GPU (a memfd, [`create`])
//! and sends it with each grant on that GPU as a second `SCM_RIGHTS` fd after the grant page;
//! `smore run` hands it down as [`ENV_BOARD_FD`]. The arbiter assigns each instance its seat
//! (written into the sealed grant page, `DeviceGrant::turn_seat`). The shim maps the board
//! read-write: unlike the grant page, every function of the GPU writes to it. The arbiter reads
//! only its phase ring, for request admission. What a function can do with it (delay its
//! neighbours' launches, by bounded amounts; skew which of their requests admission refuses) is
//! in the threat model, docs/arbiter.md.
//!
//! The board also carries the training job's phase as the functions see it: a ring of the
//! shims' settled samples, each when it ran and whether it met training work
//! ([`TurnBoard::phase`]). With turns a shim's waits are behind the trainer, so the samples of
//! every function of the GPU together show the trainer's busy and idle phases, which one
//! function's own samples are too sparse to show (docs/harvest.md, "Phase prediction").
//!
//! Must never: change layout without bumping [`BOARD_VERSION`].

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

/// Environment variable through which `smore run` hands the GPU's turn board fd to the function.
pub const ENV_BOARD_FD: &str = "SMORE_BOARD_FD";
/// `b"SMOREBRD"` — identifies a turn board (checked after mmap).
pub const BOARD_MAGIC: u64 = 0x4452_4245_524f_4d53;
/// Layout version of [`TurnBoard`].
pub const BOARD_VERSION: u32 = 3;
/// Functions that can take turns on one GPU: 64. Reasoning: a GPU runs a handful of function
/// instances; one registered when every seat is taken runs without turns (as without a board),
/// its waits behind the others charged as collisions: the trainer's side.
pub const BOARD_MEMBERS: usize = 64;

/// One function taking turns (every process of its grant: the seat is the instance's).
#[repr(C)]
#[derive(Debug)]
pub struct Member {
    /// The instance holding the seat (its id), 0 = free. Written by the arbiter, which assigns
    /// seats at registration and frees them at release (`DeviceGrant::turn_seat`).
    pub owner: AtomicU64,
    /// While the process waits for a turn: its place in line, smaller first — the deadline of
    /// its current request (`DeviceGrant::turn_key_ns`), or when it began waiting if none is
    /// known (CLOCK_MONOTONIC ns). 0 = not waiting.
    pub key: AtomicU64,
    /// When the waiter last looked at the board, CLOCK_MONOTONIC ns: a waiter that stopped
    /// looking (died, stopped) is passed over once this is old, and one that claims to have
    /// looked in the future is not believed.
    pub seen_ns: AtomicU64,
}

/// Samples the phase ring holds: 256. Reasoning: the functions of the demo's `harvest` settle
/// ~550 samples a second on one GPU (simulated, 2026-11-28), so 256 span about half a second,
/// ~9 of its trainer's iterations of 52–58 ms — a busy length and an idle length are medians of
/// several whole phases — and the page still holds the board (2 088 + 1 536 bytes).
pub const PHASE_SAMPLES: usize = 256;

/// The table: header, the turn word, [`BOARD_MEMBERS`] members and the phase ring. 24 + 8 +
/// 64 × 24 + 8 + 256 × 8 = 3 624 bytes.
#[repr(C)]
#[derive(Debug)]
pub struct TurnBoard {
    /// [`BOARD_MAGIC`]. Atomic like every field: any function of the GPU may write any of them
    /// while another reads.
    pub magic: AtomicU64,
    /// [`BOARD_VERSION`].
    pub version: AtomicU32,
    /// 1 = the GPU's functions take turns; 0 = they do not (`[policy] turns = "off"`, or
    /// harvest off). Written by the arbiter.
    pub enabled: AtomicU32,
    /// Zero.
    pub reserved: AtomicU64,
    /// The turn: the holder's member index + 1 in bits 48–54 (0 = none), the holding process's
    /// tag ([`process_tag`]) in bits 55–63, and the end of its lease in µs of CLOCK_MONOTONIC in
    /// the low 48 bits (8.9 years of uptime). One word, so that taking and extending a turn is
    /// one compare-and-swap.
    pub turn: AtomicU64,
    /// The members.
    pub members: [Member; BOARD_MEMBERS],
    /// How many samples were ever posted to [`TurnBoard::phase`]; the next goes to this modulo
    /// [`PHASE_SAMPLES`].
    pub phase_next: AtomicU64,
    /// The ring of settled samples ([`phase_word`]; 0 = empty), written by every function's shim
    /// while it takes turns, read by the arbiter's request admission (`crate::phase`). Advisory:
    /// a function that writes lies into it changes which of its neighbours' requests are refused
    /// or served late, never what the trainer pays (docs/arbiter.md, threat model).
    pub phase: [AtomicU64; PHASE_SAMPLES],
}

/// Bytes of the memfd ([`TurnBoard`] rounded up to whole pages).
pub const BOARD_BYTES: usize = std::mem::size_of::<TurnBoard>().div_ceil(4096) * 4096;

/// Bits of the turn word that hold the lease's end, µs.
pub const LEASE_BITS: u32 = 48;
const LEASE_MASK: u64 = (1 << LEASE_BITS) - 1;

/// A phase sample's word: when its launch ended, µs of CLOCK_MONOTONIC, and whether it met
/// training work (the low bit). One word, so a reader never sees half of a sample.
pub fn phase_word(at_us: u64, busy: bool) -> u64 {
    (at_us << 1) | busy as u64
}

/// A phase word's time (µs) and busy bit; none for an empty slot.
pub fn split_phase(word: u64) -> Option<(u64, bool)> {
    let at = word >> 1;
    (at != 0).then_some((at, word & 1 == 1))
}

/// Bits of the turn word's holder field that name the member (its index + 1): 7.
const MEMBER_BITS: u32 = 7;
const MEMBER_MASK: u64 = (1 << MEMBER_BITS) - 1;
const _: () = assert!(BOARD_MEMBERS < (1 << MEMBER_BITS));
/// Bits of the turn word that name the holding process among its function's ([`process_tag`]).
const TAG_BITS: u32 = 64 - LEASE_BITS - MEMBER_BITS;

/// A process's tag in the turn word: 1 + its pid modulo 511 (9 bits). The seat is the
/// function's, shared by all its processes; the tag tells which of them holds the turn, so that
/// a function's worker processes take turns with each other as with other functions (two
/// processes of one function on a time-sliced GPU wait for each other's slices, and each shim
/// would charge that as a collision with training). Two processes of one function whose pids
/// agree modulo 511 share a tag and interleave as without it.
pub fn process_tag(pid: u32) -> u16 {
    (pid % ((1 << TAG_BITS) - 1)) as u16 + 1
}

/// The turn word of member `holder` (an index below [`BOARD_MEMBERS`]), process `tag` of its
/// function ([`process_tag`]), leased until `until_us`.
pub fn turn_word(holder: usize, tag: u16, until_us: u64) -> u64 {
    let tag = u64::from(tag) & ((1 << TAG_BITS) - 1);
    (((tag << MEMBER_BITS) | (holder as u64 + 1)) << LEASE_BITS) | (until_us & LEASE_MASK)
}

/// A turn word's holder (member index) and lease end (µs); no holder for a word of none.
pub fn split_turn(word: u64) -> (Option<usize>, u64) {
    let h = ((word >> LEASE_BITS) & MEMBER_MASK) as usize;
    (h.checked_sub(1), word & LEASE_MASK)
}

/// A turn word's holding process tag ([`process_tag`]; 0 for a word of none).
pub fn turn_tag(word: u64) -> u16 {
    (word >> (LEASE_BITS + MEMBER_BITS)) as u16
}

impl TurnBoard {
    /// An empty board, turns on, as [`create`] lays it out (tests; a board shared between
    /// processes is a memfd).
    pub fn empty() -> TurnBoard {
        TurnBoard {
            magic: AtomicU64::new(BOARD_MAGIC),
            version: AtomicU32::new(BOARD_VERSION),
            enabled: AtomicU32::new(1),
            reserved: AtomicU64::new(0),
            turn: AtomicU64::new(0),
            members: std::array::from_fn(|_| Member {
                owner: AtomicU64::new(0),
                key: AtomicU64::new(0),
                seen_ns: AtomicU64::new(0),
            }),
            phase_next: AtomicU64::new(0),
            phase: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// Whether a mapped table is one of ours, of this layout version.
    pub fn is_valid(&self) -> bool {
        self.magic.load(Relaxed) == BOARD_MAGIC && self.version.load(Relaxed) == BOARD_VERSION
    }
}

/// Creates an empty board, turns on: a memfd of [`BOARD_BYTES`] with the header written and every
/// member free (zero), sealed against shrinking and growing — every function of the GPU maps it,
/// and one that truncated it would make its neighbours' next access fault (SIGBUS).
/// Close-on-exec: the caller clears it on an fd it hands down.
pub fn create() -> std::io::Result<OwnedFd> {
    use rustix::fs::{MemfdFlags, SealFlags};
    let fd = rustix::fs::memfd_create(
        "smore-turns",
        MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
    )?;
    rustix::fs::ftruncate(&fd, BOARD_BYTES as u64)?;
    let mut header = [0u8; 16];
    header[..8].copy_from_slice(&BOARD_MAGIC.to_ne_bytes());
    header[8..12].copy_from_slice(&BOARD_VERSION.to_ne_bytes());
    header[12..16].copy_from_slice(&1u32.to_ne_bytes());
    let n = rustix::io::pwrite(&fd, &header, 0)?;
    if n != header.len() {
        return Err(std::io::Error::other(
            "short write of the turn board header",
        ));
    }
    rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_is_where_the_layout_says_and_a_created_board_is_sized() {
        assert_eq!(std::mem::offset_of!(TurnBoard, magic), 0);
        assert_eq!(std::mem::offset_of!(TurnBoard, version), 8);
        assert_eq!(std::mem::offset_of!(TurnBoard, enabled), 12);
        assert_eq!(std::mem::offset_of!(TurnBoard, turn), 24);
        assert_eq!(std::mem::offset_of!(TurnBoard, members), 32);
        assert_eq!(std::mem::offset_of!(TurnBoard, phase_next), 1568);
        assert_eq!(std::mem::offset_of!(TurnBoard, phase), 1576);
        assert_eq!(BOARD_BYTES, 4096);
        let fd = create().unwrap();
        let st = rustix::fs::fstat(&fd).unwrap();
        assert_eq!(st.st_size as usize, BOARD_BYTES);
        let mut h = [0u8; 16];
        rustix::io::pread(&fd, &mut h, 0).unwrap();
        assert_eq!(u64::from_ne_bytes(h[..8].try_into().unwrap()), BOARD_MAGIC);
        assert_eq!(u32::from_ne_bytes(h[12..16].try_into().unwrap()), 1);
        // A function cannot truncate the board under its neighbours.
        assert!(rustix::fs::ftruncate(&fd, 0).is_err());
    }

    #[test]
    fn a_turn_word_carries_its_holder_process_and_lease() {
        assert_eq!(split_turn(0), (None, 0));
        assert_eq!(turn_tag(0), 0);
        let w = turn_word(0, 1, 1234);
        assert_eq!(split_turn(w), (Some(0), 1234));
        assert_eq!(turn_tag(w), 1);
        let tag = process_tag(u32::MAX);
        let w = turn_word(BOARD_MEMBERS - 1, tag, LEASE_MASK + 5);
        assert_eq!(split_turn(w), (Some(BOARD_MEMBERS - 1), 4));
        assert_eq!(turn_tag(w), tag);
        // Every pid has a tag of 1..=511: never 0 (no holder), never wider than its bits.
        for pid in [0, 1, 510, 511, 512, 4_194_304, u32::MAX] {
            let t = process_tag(pid);
            assert!((1..=511).contains(&t), "{pid}: {t}");
        }
        assert_ne!(process_tag(100), process_tag(101));
    }

    #[test]
    fn a_phase_word_carries_its_time_and_busy_bit() {
        assert_eq!(split_phase(0), None);
        assert_eq!(split_phase(phase_word(1234, true)), Some((1234, true)));
        assert_eq!(split_phase(phase_word(1234, false)), Some((1234, false)));
    }
}

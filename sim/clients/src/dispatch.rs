//! A study's dispatch board (`smore demo --serialize`, docs/harvest.md, "Serializing the
//! functions"): the function instances of one GPU take turns, one request's kernels at a time,
//! in deadline order (`edf`) or arrival order (`fifo`), so that — within a turn's lease — no
//! function's kernels wait on the GPU behind another function's.
//!
//! Why a study and not smore: it lives in the simulated function (`sim-function`), which
//! cooperates; smore's shim would have to do it for functions that do not. What it answers is
//! whether serializing is worth building there — what it does to the waits a shim counts as
//! collisions (on a time-sliced GPU a wait behind another function looks like a wait behind the
//! trainer) and to the deadlines.
//!
//! The board is a small file every instance maps shared: a holder, the turn's lease and a table
//! of waiting requests with their keys (deadline or arrival, CLOCK_MONOTONIC ns). The table is
//! changed under `flock` on the file; a waiter sleeps on a futex word that each release bumps.
//! Holders and waiters are threads, named by (process id, thread id) and checked with
//! `tgkill(.., 0)`; every process of a board must share one PID namespace. A turn ends when its
//! holder releases it, or at the latest when its lease runs out or its holder dies. A waiter
//! refreshes its entry at least every [`RECHECK`]; one not refreshed for [`WAITER_STALE`] (dead,
//! stopped, or left by an earlier run) is dropped, so it cannot stand first for ever.
//!
//! Must never: let two holders run at once while both are alive and within their lease; leave a
//! waiter asleep for longer than [`RECHECK`] without looking at the board again; spin on a
//! `flock` that fails for a reason other than a signal (the request then runs without a turn).

use std::cell::Cell;
use std::fs::File;
use std::marker::PhantomData;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::SeqCst};
use std::time::Duration;

use crate::monotonic_ns;

/// Waiting requests the board holds: 64 (reasoning: one per function instance of a GPU, and a
/// demo runs a handful).
pub const SLOTS: usize = 64;
/// The longest a turn may last before the others take the GPU anyway: 200 ms (reasoning: a
/// request of the demo's functions runs in a few ms, so a turn this long belongs to a holder
/// that hangs).
pub const LEASE: Duration = Duration::from_millis(200);
/// How long a waiter sleeps before it looks at the board again even if no release woke it:
/// 2 ms (a lease that ran out wakes no one).
pub const RECHECK: Duration = Duration::from_millis(2);
/// A waiting entry not refreshed for this long is dropped: 50 ms (reasoning: 25 × [`RECHECK`];
/// a live waiter descheduled longer than that on a loaded machine only loses its place until
/// its next look).
pub const WAITER_STALE: Duration = Duration::from_millis(50);

/// In which order waiting requests get their turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// Earliest deadline first.
    Edf,
    /// Earliest arrival first.
    Fifo,
}

impl std::str::FromStr for Order {
    type Err = String;
    fn from_str(s: &str) -> Result<Order, String> {
        match s {
            "edf" => Ok(Order::Edf),
            "fifo" => Ok(Order::Fifo),
            other => Err(format!("{other:?}: the order is `edf` or `fifo`")),
        }
    }
}

#[repr(C)]
struct Slot {
    /// Who waits: [`owner`] word (0 = free).
    owner: AtomicU64,
    /// Its key: smaller goes first.
    key: AtomicU64,
    /// When the waiter last looked at the board, CLOCK_MONOTONIC ns.
    seen_ns: AtomicU64,
}

/// The shared layout (the file is sized to it).
#[repr(C)]
struct Layout {
    /// Bumped on every release: the futex word waiters sleep on.
    seq: AtomicU32,
    _pad: u32,
    /// The turn's holder: [`owner`] word (0 = none).
    holder: AtomicU64,
    /// When the holder's turn ends at the latest, CLOCK_MONOTONIC ns.
    lease_until: AtomicU64,
    slots: [Slot; SLOTS],
}

/// One thread's view of a GPU's board: open one per thread (the `flock` that guards the table
/// belongs to the open file, so two threads sharing a `Board` would not exclude each other —
/// hence not `Sync`).
pub struct Board {
    file: File,
    map: &'static Layout,
    _one_thread: PhantomData<Cell<()>>,
}

/// This thread's owner word: process id in the high half, thread id in the low.
fn owner() -> u64 {
    // SAFETY: getpid and gettid take no arguments and cannot fail.
    let (pid, tid) = unsafe { (libc::getpid(), libc::gettid()) };
    (u64::from(pid as u32) << 32) | u64::from(tid as u32)
}

/// Whether the thread of owner word `w` still lives. A word whose halves are not positive pids
/// (garbage in the file) is dead.
fn alive(w: u64) -> bool {
    let (pid, tid) = ((w >> 32) as u32, w as u32);
    if pid == 0 || tid == 0 || pid > i32::MAX as u32 || tid > i32::MAX as u32 {
        return false;
    }
    // SAFETY: tgkill with signal 0 sends nothing; it only checks that thread `tid` of process
    // `pid` exists (both positive, so no process group or broadcast is addressed).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_tgkill,
            pid as libc::c_long,
            tid as libc::c_long,
            0,
        )
    };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// Holds the board's `flock` for as long as it lives.
struct Locked<'a>(&'a File);

impl<'a> Locked<'a> {
    /// Takes the lock, retrying only when a signal interrupted the wait; `None` when `flock`
    /// fails otherwise (the caller goes on without a turn rather than spin).
    fn take(f: &'a File) -> Option<Locked<'a>> {
        loop {
            // SAFETY: flock on an fd this File owns for its whole life.
            if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } == 0 {
                return Some(Locked(f));
            }
            if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                return None;
            }
        }
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        // SAFETY: unlocks the flock taken in `take` on the same fd.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

impl Board {
    /// Opens (creating it if needed) the board at `path`.
    pub fn open(path: &Path) -> anyhow::Result<Board> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| anyhow::anyhow!("dispatch board {}: {e}", path.display()))?;
        let bytes = std::mem::size_of::<Layout>();
        {
            let _l = Locked::take(&file).ok_or_else(|| {
                anyhow::anyhow!(
                    "dispatch board {}: flock: {}",
                    path.display(),
                    std::io::Error::last_os_error()
                )
            })?;
            if file.metadata()?.len() < bytes as u64 {
                file.set_len(bytes as u64)?;
            }
        }
        // SAFETY: maps `bytes` of a file at least that long (only ever grown), shared and
        // read-write; the mapping is never unmapped (the `&'static` below), and a zero-filled
        // file is a valid Layout (atomics of zero: no holder, no waiters).
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        anyhow::ensure!(
            p != libc::MAP_FAILED,
            "dispatch board {}: mmap: {}",
            path.display(),
            std::io::Error::last_os_error()
        );
        // SAFETY: a live, never-unmapped, page-aligned mapping of a Layout, whose fields are all
        // atomics (or padding nobody reads).
        let map = unsafe { &*(p as *const Layout) };
        Ok(Board {
            file,
            map,
            _one_thread: PhantomData,
        })
    }

    /// Waits for this thread's turn for a request of `key` (its deadline or arrival, ns);
    /// returns how long it waited. The turn lasts until [`Board::release`] or [`LEASE`]. If the
    /// board's lock fails it returns at once, without a turn.
    pub fn acquire(&self, key: u64) -> Duration {
        let start = monotonic_ns();
        let me = owner();
        let m = self.map;
        let mut mine: Option<usize> = None;
        loop {
            let seq;
            {
                let Some(_l) = Locked::take(&self.file) else {
                    return Duration::from_nanos(monotonic_ns().saturating_sub(start));
                };
                let now = monotonic_ns();
                // My entry may have been dropped (I was descheduled past WAITER_STALE).
                if mine.is_some_and(|i| m.slots[i].owner.load(SeqCst) != me) {
                    mine = None;
                }
                if let Some(i) = mine {
                    m.slots[i].seen_ns.store(now, SeqCst);
                }
                // Forget waiters that died or stopped looking, and any entry of mine that is not
                // the one this call listed (left by an earlier call that did not end).
                for (i, s) in m.slots.iter().enumerate() {
                    let w = s.owner.load(SeqCst);
                    let stale =
                        now.saturating_sub(s.seen_ns.load(SeqCst)) > WAITER_STALE.as_nanos() as u64;
                    if w != 0 && Some(i) != mine && (w == me || stale || !alive(w)) {
                        s.owner.store(0, SeqCst);
                    }
                }
                let holder = m.holder.load(SeqCst);
                let until = m.lease_until.load(SeqCst);
                // A lease further ahead than a lease is garbage (an earlier boot's clock).
                let lapsed = until <= now || until > now + LEASE.as_nanos() as u64;
                let free = holder == 0 || lapsed || !alive(holder);
                let first = m.slots.iter().enumerate().all(|(i, s)| {
                    let w = s.owner.load(SeqCst);
                    Some(i) == mine || w == 0 || (key, me) <= (s.key.load(SeqCst), w)
                });
                if free && first {
                    if let Some(i) = mine {
                        m.slots[i].owner.store(0, SeqCst);
                    }
                    m.holder.store(me, SeqCst);
                    m.lease_until.store(now + LEASE.as_nanos() as u64, SeqCst);
                    return Duration::from_nanos(monotonic_ns().saturating_sub(start));
                }
                if mine.is_none() {
                    // A full table: wait unlisted and look again (never blocks a turn).
                    mine = m.slots.iter().position(|s| s.owner.load(SeqCst) == 0);
                    if let Some(i) = mine {
                        m.slots[i].key.store(key, SeqCst);
                        m.slots[i].seen_ns.store(now, SeqCst);
                        m.slots[i].owner.store(me, SeqCst);
                    }
                }
                seq = m.seq.load(SeqCst);
            }
            let ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: RECHECK.as_nanos() as libc::c_long,
            };
            // SAFETY: FUTEX_WAIT on a 4-byte aligned word of a live shared mapping, with a
            // relative timeout; it returns at once if the word no longer holds `seq`.
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    m.seq.as_ptr(),
                    libc::FUTEX_WAIT,
                    seq,
                    &ts as *const libc::timespec,
                )
            };
        }
    }

    /// Ends this thread's turn (nothing if it is not the holder) and wakes the waiters.
    pub fn release(&self) {
        {
            let Some(_l) = Locked::take(&self.file) else {
                return;
            };
            if self.map.holder.load(SeqCst) != owner() {
                return;
            }
            self.map.holder.store(0, SeqCst);
            self.map.seq.fetch_add(1, SeqCst);
        }
        // SAFETY: FUTEX_WAKE of every waiter on a word of a live shared mapping.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                self.map.seq.as_ptr(),
                libc::FUTEX_WAKE,
                i32::MAX,
            )
        };
    }

    /// Waiting entries listed now (tests).
    #[cfg(test)]
    fn listed(&self) -> usize {
        self.map
            .slots
            .iter()
            .filter(|s| s.owner.load(SeqCst) != 0)
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use std::time::Instant;

    fn board_dir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("smore-board-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Waits up to 5 s for `n` waiting entries.
    fn until_listed(b: &Board, n: usize) {
        let give_up = Instant::now() + Duration::from_secs(5);
        while b.listed() < n {
            assert!(Instant::now() < give_up, "{n} waiters never listed");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn turns_never_overlap_and_a_waiting_earlier_deadline_goes_first() {
        let dir = board_dir("order");
        let path = dir.join("board");
        let holder = Board::open(&path).unwrap();
        holder.acquire(100);
        // Two waiters arrive while the turn is held, the later deadline first.
        let order = Arc::new(Mutex::new(Vec::new()));
        let running = Arc::new(AtomicU32::new(0));
        let spawn = |id: u32, key: u64| {
            let (path, order, running) = (path.clone(), order.clone(), running.clone());
            std::thread::spawn(move || {
                let b = Board::open(&path).unwrap();
                b.acquire(key);
                assert_eq!(running.fetch_add(1, SeqCst), 0, "two turns at once");
                order.lock().unwrap().push(id);
                std::thread::sleep(Duration::from_millis(5));
                running.fetch_sub(1, SeqCst);
                b.release();
            })
        };
        let late = spawn(2, 500);
        until_listed(&holder, 1);
        let early = spawn(3, 200);
        until_listed(&holder, 2);
        assert!(order.lock().unwrap().is_empty(), "the turn is still held");
        holder.release();
        late.join().unwrap();
        early.join().unwrap();
        assert_eq!(*order.lock().unwrap(), vec![3, 2], "deadline order");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_turn_whose_holder_never_releases_ends_with_its_lease() {
        let dir = board_dir("lease");
        let path = dir.join("board");
        // Held by a thread that lives on and never releases.
        let (tx, rx) = std::sync::mpsc::channel();
        let p = path.clone();
        std::thread::spawn(move || {
            let b = Board::open(&p).unwrap();
            // Read before `acquire`, which stamps the lease: the lease cannot end before
            // `held_at + LEASE` (read after, the stamp could be earlier and the check race).
            let held_at = Instant::now();
            b.acquire(1);
            tx.send(held_at).unwrap();
            std::thread::sleep(LEASE * 4);
        });
        let held_at = rx.recv().unwrap();
        Board::open(&path).unwrap().acquire(2);
        assert!(
            held_at.elapsed() >= LEASE,
            "took the turn {:?} after it was taken, before the lease ran out",
            held_at.elapsed()
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_turn_whose_holder_died_is_free_at_once() {
        let dir = board_dir("dead");
        let path = dir.join("board");
        let p = path.clone();
        std::thread::spawn(move || Board::open(&p).unwrap().acquire(1))
            .join()
            .unwrap();
        let waited = Board::open(&path).unwrap().acquire(2);
        assert!(waited < LEASE / 2, "waited {waited:?} for a dead holder");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_waiter_that_stopped_looking_does_not_stand_first() {
        let dir = board_dir("stale");
        let path = dir.join("board");
        let b = Board::open(&path).unwrap();
        // An entry of a live thread with the smallest key, last seen long ago: as a stopped
        // waiter would leave it.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            tx.send(owner()).unwrap();
            std::thread::sleep(Duration::from_secs(2));
        });
        let live = rx.recv().unwrap();
        assert!(alive(live));
        let s = &b.map.slots[0];
        s.key.store(0, SeqCst);
        s.seen_ns.store(1, SeqCst);
        s.owner.store(live, SeqCst);
        let waited = b.acquire(5);
        assert!(waited < LEASE / 2, "waited {waited:?} behind a stale entry");
        assert_eq!(b.listed(), 0, "the stale entry is gone");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_order_is_edf_or_fifo() {
        assert_eq!("edf".parse::<Order>(), Ok(Order::Edf));
        assert_eq!("fifo".parse::<Order>(), Ok(Order::Fifo));
        assert!("lifo".parse::<Order>().unwrap_err().contains("edf"));
    }
}

//! A study's dispatch board (`smore demo --serialize`, docs/harvest.md, "Serializing the
//! functions"): the function instances of one GPU take turns, one request's kernels at a time,
//! in deadline order (`edf`) or arrival order (`fifo`), so that no function's kernels wait on
//! the GPU behind another function's.
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
//! A turn ends when its holder releases it, or at the latest when its lease runs out (a holder
//! that died or hangs does not stop the others).
//!
//! Must never: let two holders run at once while both are alive and within their lease; leave a
//! waiter asleep for longer than [`RECHECK`] without looking at the board again.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::SeqCst};
use std::time::Duration;

/// Waiting requests the board holds: 64 (reasoning: one per function instance of a GPU, and a
/// demo runs a handful).
pub const SLOTS: usize = 64;
/// The longest a turn may last before the others take the GPU anyway: 200 ms (reasoning: a
/// request of the demo's functions runs in a few ms, so a turn this long belongs to a holder
/// that died or hangs).
pub const LEASE: Duration = Duration::from_millis(200);
/// How long a waiter sleeps before it looks at the board again even if no release woke it:
/// 2 ms (a lease that ran out wakes no one).
pub const RECHECK: Duration = Duration::from_millis(2);

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
    /// Who waits (a pid in the demo; 0 = free).
    id: AtomicU32,
    _pad: u32,
    /// Its key: smaller goes first.
    key: AtomicU64,
}

/// The shared layout (one 4 KiB page would do; the file is sized to it).
#[repr(C)]
struct Layout {
    /// Bumped on every release: the futex word waiters sleep on.
    seq: AtomicU32,
    /// The turn's holder (0 = none).
    holder: AtomicU32,
    /// When the holder's turn ends at the latest, CLOCK_MONOTONIC ns.
    lease_until: AtomicU64,
    slots: [Slot; SLOTS],
}

/// One process's view of a GPU's board. Waiters and holders are threads, by their thread id
/// (a pid for a single-threaded process), so that the board can tell a dead one.
pub struct Board {
    file: File,
    map: &'static Layout,
}

/// This thread's id.
fn me() -> u32 {
    // SAFETY: gettid takes no arguments and cannot fail.
    (unsafe { libc::gettid() }) as u32
}

/// Whether thread `id` still lives (`kill(id, 0)`: only "no such process" says it does not).
fn alive(id: u32) -> bool {
    // SAFETY: signal 0 sends nothing; it only checks that the thread exists.
    let rc = unsafe { libc::kill(id as libc::pid_t, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec to a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Holds the board's `flock` for as long as it lives.
struct Locked<'a>(&'a File);

impl<'a> Locked<'a> {
    fn take(f: &'a File) -> Locked<'a> {
        // SAFETY: flock on an fd this File owns; an EINTR is retried.
        while unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {}
        Locked(f)
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
            let _l = Locked::take(&file);
            if file.metadata()?.len() < bytes as u64 {
                file.set_len(bytes as u64)?;
            }
        }
        // SAFETY: maps `bytes` of a file at least that long, shared and read-write; the mapping
        // is never unmapped (the `&'static` below), and a zero-filled file is a valid Layout
        // (atomics of zero: no holder, no waiters).
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
        // SAFETY: a live, never-unmapped, suitably aligned (page) mapping of a Layout.
        let map = unsafe { &*(p as *const Layout) };
        Ok(Board { file, map })
    }

    /// Waits for this thread's turn for a request of `key` (its deadline or arrival, ns);
    /// returns how long it waited. The turn lasts until [`Board::release`] or [`LEASE`].
    pub fn acquire(&self, key: u64) -> Duration {
        let start = monotonic_ns();
        let id = me();
        let mut mine: Option<usize> = None;
        loop {
            let seq;
            {
                let _l = Locked::take(&self.file);
                let m = self.map;
                let now = monotonic_ns();
                let holder = m.holder.load(SeqCst);
                let free = holder == 0 || m.lease_until.load(SeqCst) <= now || !alive(holder);
                // A waiter that died is forgotten (it would stand first for ever).
                for s in &m.slots {
                    let w = s.id.load(SeqCst);
                    if w != 0 && w != id && !alive(w) {
                        s.id.store(0, SeqCst);
                    }
                }
                let first = m.slots.iter().enumerate().all(|(i, s)| {
                    let w = s.id.load(SeqCst);
                    Some(i) == mine || w == 0 || (key, id) <= (s.key.load(SeqCst), w)
                });
                if free && first {
                    if let Some(i) = mine {
                        m.slots[i].id.store(0, SeqCst);
                    }
                    m.holder.store(id, SeqCst);
                    m.lease_until.store(now + LEASE.as_nanos() as u64, SeqCst);
                    return Duration::from_nanos(monotonic_ns().saturating_sub(start));
                }
                if mine.is_none() {
                    // A full table: wait unlisted and look again (never blocks a turn).
                    mine = m.slots.iter().position(|s| s.id.load(SeqCst) == 0);
                    if let Some(i) = mine {
                        m.slots[i].key.store(key, SeqCst);
                        m.slots[i].id.store(id, SeqCst);
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
                    self.map.seq.as_ptr(),
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
            let _l = Locked::take(&self.file);
            if self.map.holder.load(SeqCst) != me() {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn turns_never_overlap_and_a_waiting_earlier_deadline_goes_first() {
        let dir = std::env::temp_dir().join(format!("smore-board-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("board");
        let holder = Board::open(&path).unwrap();
        holder.acquire(100);
        // Two waiters arrive while the turn is held: the later deadline first.
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
        std::thread::sleep(Duration::from_millis(20));
        let early = spawn(3, 200);
        std::thread::sleep(Duration::from_millis(20));
        assert!(order.lock().unwrap().is_empty(), "the turn is still held");
        holder.release();
        late.join().unwrap();
        early.join().unwrap();
        assert_eq!(*order.lock().unwrap(), vec![3, 2], "deadline order");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_turn_whose_holder_never_releases_ends_with_its_lease() {
        let dir = std::env::temp_dir().join(format!("smore-board-lease-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("board");
        // Held by a thread that lives on and never releases.
        let (tx, rx) = std::sync::mpsc::channel();
        let p = path.clone();
        std::thread::spawn(move || {
            Board::open(&p).unwrap().acquire(1);
            tx.send(()).unwrap();
            std::thread::sleep(LEASE * 4);
        });
        rx.recv().unwrap();
        let waited = Board::open(&path).unwrap().acquire(2);
        assert!(
            waited >= LEASE - RECHECK,
            "took the turn after {waited:?}, before the lease ran out"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_turn_whose_holder_died_is_free_at_once() {
        let dir = std::env::temp_dir().join(format!("smore-board-dead-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
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
    fn an_order_is_edf_or_fifo() {
        assert_eq!("edf".parse::<Order>(), Ok(Order::Edf));
        assert_eq!("fifo".parse::<Order>(), Ok(Order::Fifo));
        assert!("lifo".parse::<Order>().unwrap_err().contains("edf"));
    }
}

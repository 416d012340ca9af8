//! The per-grant shared ledger: one slot per process in a `MAP_SHARED` table
//! (`smore_protocol::ledger`, created by `smore run`), so that the cap a grant carries is the
//! *grant's*, whatever number of processes share it (issue 12 item 4: four children forked
//! before CUDA initialised each got a fresh ledger — 4 × 1 GiB under one 1 GiB grant).
//!
//! Owns the rule "the sum of the live slots plus this request ≤ cap" and the reclaim of a dead
//! process's slot. The check is lock-free across processes:
//!
//! - **reserve-then-check**: a reservation adds its bytes to its own slot (one sequentially
//!   consistent RMW), then sums every slot (sequentially consistent loads); if the sum passes the
//!   cap it takes the bytes back. Of two racing reservations, the one whose add comes later in the
//!   single order of sequentially consistent operations sees the other's add (its loads follow
//!   its own add), so the reservations that succeed never sum past the cap — whatever the
//!   interleaving of processes and threads. Two racers can both see each other and both back
//!   off; then each retries while what the others hold (without its own bytes) leaves room, up to
//!   [`RETRIES`] times — a refusal in a race is possible, an over-commit is not.
//! - **dead slots**: a process that died (or exited) leaves its bytes in its slot; the driver has
//!   freed them. Before a refusal (and when the table is full) every slot's owner is checked for
//!   liveness — pid plus start time, through the callback the runtime gives (a `/proc` read: the
//!   allocation slow path, never a launch) — and a dead one is zeroed and freed.
//!
//! Must never: be used on the launch path; let a refused reservation leave bytes in its slot;
//! free a slot whose owner lives.

use crate::limits::MAX_DEVICES;
use smore_protocol::ledger::{
    owner_pid, LedgerSlot, LedgerTable, LEDGER_SLOTS, OWNER_FREE, OWNER_RECLAIMING,
};
use std::sync::atomic::Ordering::SeqCst;

/// Attempts of a reservation that lost a race (both racers saw each other and backed off) while
/// the others' holdings still leave room: 64 (reasoning: each attempt is a few hundred ns; the
/// racers back off in turn, and a loser with room gets in within a few rounds).
pub const RETRIES: u32 = 64;

/// How long a process waits for another process of its grant to measure the first context
/// footprint on a device: 5 s (reasoning: creating a context takes tens to hundreds of ms on a
/// real driver; past this the measurer is hung and the waiter goes on unchecked, as before the
/// claim existed, and the NVML watchdog bounds the rest).
pub const FIRST_CONTEXT_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// What [`Group::begin_first_context`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FirstContext {
    /// This process measures the grant's first context (unchecked: its cost is unknown); it
    /// calls [`Group::end_first_context`] once the footprint is published or the call failed.
    Mine,
    /// Another process measured it: check this context against the cap with this footprint.
    Known(u64),
    /// The measurer did not publish within [`FIRST_CONTEXT_WAIT`]: go on unchecked.
    Unmeasured,
}

/// Whether the process of an owner word still lives (pid alive with the same start time).
pub type Alive = fn(u64) -> bool;

/// Why no slot could be had.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ClaimError {
    /// Every slot is held by a live process.
    #[error("the grant's shared ledger is full ({LEDGER_SLOTS} live processes hold memory under it): end some of the function's processes")]
    Full,
    /// `/proc` is another pid namespace's: the members' lives cannot be told by their pids.
    #[error("/proc is another pid namespace's, so the grant's processes cannot be told alive or dead from here: mount a /proc for this pid namespace (`unshare --mount-proc`) or run the process in the pid namespace of its `smore run`")]
    ForeignProc,
    /// The table could not be mapped (the reason was logged).
    #[error("the grant's shared ledger (SMORE_LEDGER_FD) cannot be used here (the line before says why): start the process from its `smore run` with the fd it handed down")]
    Unusable,
    /// This process's start time cannot be read (`/proc/<pid>/stat`).
    #[error("this process's start time cannot be read from /proc, so its slot in the grant's shared ledger could not be told from another's: make /proc readable")]
    StartUnknown,
    /// This process's pid namespace cannot be read (`/proc/self/ns/pid`).
    #[error("this process's pid namespace cannot be read (/proc/self/ns/pid), so it cannot tell which of the grant's processes it may judge alive or dead: make /proc/self/ns/pid readable")]
    NamespaceUnknown,
}

/// This process's slot in a grant's table.
#[derive(Debug, Clone, Copy)]
pub struct Group {
    table: &'static LedgerTable,
    slot: usize,
    /// This process's owner word (kept: the slot's word reads [`OWNER_RECLAIMING`] for a moment
    /// while another process checks it).
    owner: u64,
    /// This process's pid namespace (`LedgerTable::slot_ns`): the slots it may judge.
    ns: u32,
    alive: Alive,
}

impl Group {
    /// Takes a slot for `owner`: the slot it already holds (the same pid and start time: this
    /// process before an `exec`, whose memory the driver freed at the exec — zeroed), else a free
    /// one, else one freed from a dead process.
    ///
    /// `ns`: this process's pid namespace (`smore_protocol::ledger::own_pid_namespace`, not 0):
    /// it judges the life only of slots of its own namespace (or of none said, by older shims).
    pub fn claim(
        table: &'static LedgerTable,
        owner: u64,
        ns: u32,
        alive: Alive,
    ) -> Result<Group, ClaimError> {
        let g = |slot| Group {
            table,
            slot,
            owner,
            ns,
            alive,
        };
        // Its own slot: the same owner word in this pid namespace (or in none said, an older
        // shim's) — the same word in another namespace is another process (pid 1 of two
        // containers started in the same tick). The word is read before the namespace (a
        // claimant writes them the other way round), and the slot is taken as a free one is:
        // marked busy, checked again, zeroed, named (found by review, 2026-11-29: read the
        // other way, or written without a claim, another namespace's live slot was zeroed).
        let mine = |ns_of: u32| ns_of == 0 || ns_of == ns;
        for (i, s) in table.slots.iter().enumerate() {
            if s.owner.load(SeqCst) != owner || !mine(table.slot_ns[i].load(SeqCst)) {
                continue;
            }
            if s.owner
                .compare_exchange(owner, OWNER_RECLAIMING, SeqCst, SeqCst)
                .is_err()
            {
                continue;
            }
            if !mine(table.slot_ns[i].load(SeqCst)) {
                s.owner.store(owner, SeqCst);
                continue;
            }
            zero(s);
            table.slot_ns[i].store(ns, SeqCst);
            s.owner.store(owner, SeqCst);
            return Ok(g(i));
        }
        for round in 0..2 {
            for (i, s) in table.slots.iter().enumerate() {
                // Marked busy while its namespace is written, so that no process judges it by
                // the owner word before it says which namespace that pid is of.
                if s.owner
                    .compare_exchange(OWNER_FREE, OWNER_RECLAIMING, SeqCst, SeqCst)
                    .is_ok()
                {
                    // A reclaim zeroes a slot before freeing it; zero it again all the same (a
                    // slot is this process's from here on).
                    zero(s);
                    table.slot_ns[i].store(ns, SeqCst);
                    s.owner.store(owner, SeqCst);
                    return Ok(g(i));
                }
            }
            // As no slot's holder (`reclaim_dead` skips its own: slot 0 would never be freed).
            if round == 0 && g(usize::MAX).reclaim_dead() == 0 {
                break;
            }
        }
        Err(ClaimError::Full)
    }

    fn own(&self, dev: usize) -> Option<&'static std::sync::atomic::AtomicU64> {
        self.table.slots[self.slot].bytes.get(dev)
    }

    /// This process's counter for `dev` (`None` beyond [`MAX_DEVICES`]).
    pub fn counter(&self, dev: usize) -> Option<&'static std::sync::atomic::AtomicU64> {
        self.own(dev)
    }

    /// The largest context footprint a process of the grant measured on `dev` (0: none yet).
    pub fn footprint(&self, dev: usize) -> u64 {
        self.table.footprint.get(dev).map_or(0, |f| f.load(SeqCst))
    }

    /// The words the grant's processes share for harvesting on grant-page slot `slot`: the
    /// collision bucket, its probe clock and the newest collision evidence
    /// (`LedgerTable::contention`, `probe`, `evidence`).
    pub fn contention(&self, slot: usize) -> Option<crate::harvest::SharedWords> {
        let t = self.table;
        Some(crate::harvest::SharedWords {
            bucket: t.contention.get(slot)?,
            probe: t.probe.get(slot)?,
            evidence: t.evidence.get(slot)?,
        })
    }

    /// The raw-share gate the grant's processes share on grant-page slot `slot`
    /// (`LedgerTable::raw`: its theoretical arrival time).
    pub fn raw(&self, slot: usize) -> Option<&'static std::sync::atomic::AtomicU64> {
        self.table.raw.get(slot)
    }

    /// Takes the measurement of the grant's first context on `dev` for this process, or waits
    /// (at most [`FIRST_CONTEXT_WAIT`]) while another live process of the grant measures it.
    /// Context creation is the slow path (a driver call of milliseconds), never a launch.
    pub fn begin_first_context(&self, dev: usize) -> FirstContext {
        let Some(m) = self.table.measuring.get(dev) else {
            return FirstContext::Mine;
        };
        let me = self.owner;
        let deadline = std::time::Instant::now() + FIRST_CONTEXT_WAIT;
        loop {
            let f = self.footprint(dev);
            if f > 0 {
                return FirstContext::Known(f);
            }
            match m.compare_exchange(OWNER_FREE, me, SeqCst, SeqCst) {
                Ok(_) => {
                    // The measurer before us may have published and left in between.
                    let f = self.footprint(dev);
                    if f > 0 {
                        let _ = m.compare_exchange(me, OWNER_FREE, SeqCst, SeqCst);
                        return FirstContext::Known(f);
                    }
                    return FirstContext::Mine;
                }
                Err(holder) if holder == me => return FirstContext::Mine,
                Err(holder) => {
                    if std::time::Instant::now() >= deadline {
                        return FirstContext::Unmeasured;
                    }
                    if !self.may_be_alive(holder) {
                        // Its measurer died before publishing: free the claim and try again.
                        let _ = m.compare_exchange(holder, OWNER_FREE, SeqCst, SeqCst);
                        continue;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            }
        }
    }

    /// Ends this process's measurement of `dev`'s first context (published or failed).
    pub fn end_first_context(&self, dev: usize) {
        if let Some(m) = self.table.measuring.get(dev) {
            let _ = m.compare_exchange(self.owner, OWNER_FREE, SeqCst, SeqCst);
        }
    }

    /// Tells the grant's other processes what a context on `dev` costs.
    pub fn publish_footprint(&self, dev: usize, bytes: u64) {
        if let Some(f) = self.table.footprint.get(dev) {
            f.fetch_max(bytes, SeqCst);
        }
    }

    /// Bytes every process of the grant holds on `dev` (dead ones included until reclaimed).
    pub fn sum(&self, dev: usize) -> u64 {
        if dev >= MAX_DEVICES {
            return 0;
        }
        self.table
            .slots
            .iter()
            .filter(|s| s.owner.load(SeqCst) != OWNER_FREE)
            .map(|s| s.bytes[dev].load(SeqCst))
            .fold(0u64, u64::saturating_add)
    }

    /// [`Group::sum`] after reclaiming dead processes' slots (info calls, refusals).
    pub fn live_sum(&self, dev: usize) -> u64 {
        self.reclaim_dead();
        self.sum(dev)
    }

    /// Reserves `bytes` on `dev` for this process unless the grant's processes together would
    /// pass `cap`. `Err` carries what the grant's processes hold (for the refusal's log line).
    pub fn reserve(&self, dev: usize, bytes: u64, cap: u64) -> Result<(), u64> {
        let Some(own) = self.own(dev) else {
            return Ok(());
        };
        if bytes > cap {
            return Err(self.sum(dev));
        }
        let mut reclaimed = false;
        for _ in 0..RETRIES {
            // Overflow is impossible in practice (each slot stays near the cap); saturate anyway.
            if own
                .fetch_update(SeqCst, SeqCst, |v| v.checked_add(bytes))
                .is_err()
            {
                return Err(self.sum(dev));
            }
            let total = self.sum(dev);
            if total <= cap {
                return Ok(());
            }
            own.fetch_sub(bytes, SeqCst);
            let others = self.sum(dev);
            if others.saturating_add(bytes) > cap {
                if reclaimed || self.reclaim_dead() == 0 {
                    return Err(others);
                }
                reclaimed = true;
            }
            std::hint::spin_loop();
        }
        Err(self.sum(dev))
    }

    /// Whether the process of owner word `owner` may live: it does by its pid here, or a slot
    /// with that word is of another pid namespace (whose pids mean nothing here).
    fn may_be_alive(&self, owner: u64) -> bool {
        // The word before the namespace, as a claimant writes them the other way round.
        let foreign = (0..LEDGER_SLOTS).any(|i| {
            self.table.slots[i].owner.load(SeqCst) == owner && {
                let ns = self.table.slot_ns[i].load(SeqCst);
                ns != 0 && ns != self.ns
            }
        });
        foreign || (self.alive)(owner)
    }

    /// Frees the slots of processes that no longer live (their bytes zeroed first). Returns how
    /// many. Never this process's own slot.
    pub fn reclaim_dead(&self) -> usize {
        let mut n = 0;
        for (i, s) in self.table.slots.iter().enumerate() {
            let owner = s.owner.load(SeqCst);
            if i == self.slot || owner == OWNER_FREE || owner == OWNER_RECLAIMING {
                continue;
            }
            // A pid of another pid namespace names another process (or none) here: alive.
            let ns = self.table.slot_ns[i].load(SeqCst);
            if (ns != 0 && ns != self.ns) || owner_pid(owner) == 0 || (self.alive)(owner) {
                continue;
            }
            if s.owner
                .compare_exchange(owner, OWNER_RECLAIMING, SeqCst, SeqCst)
                .is_ok()
            {
                // The slot may have been freed and taken since, by a process of another
                // namespace with the same owner word (it writes its namespace first): then it
                // is that process's, and stays.
                if self.table.slot_ns[i].load(SeqCst) != ns {
                    s.owner.store(owner, SeqCst);
                    continue;
                }
                zero(s);
                // Free, it says no namespace: an older shim that takes it writes none.
                self.table.slot_ns[i].store(0, SeqCst);
                s.owner.store(OWNER_FREE, SeqCst);
                n += 1;
            }
        }
        n
    }
}

fn zero(s: &LedgerSlot) {
    for b in &s.bytes {
        b.store(0, SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use smore_protocol::ledger::{owner_word, LEDGER_MAGIC, LEDGER_VERSION};
    use std::sync::atomic::{AtomicU64, AtomicUsize};
    use std::sync::{Arc, Barrier};

    fn table() -> &'static LedgerTable {
        Box::leak(Box::new(LedgerTable {
            magic: LEDGER_MAGIC,
            version: LEDGER_VERSION,
            reserved: 0,
            footprint: std::array::from_fn(|_| AtomicU64::new(0)),
            measuring: std::array::from_fn(|_| AtomicU64::new(0)),
            slots: std::array::from_fn(|_| LedgerSlot {
                owner: AtomicU64::new(0),
                bytes: std::array::from_fn(|_| AtomicU64::new(0)),
            }),
            contention: std::array::from_fn(|_| AtomicU64::new(0)),
            probe: std::array::from_fn(|_| AtomicU64::new(0)),
            evidence: std::array::from_fn(|_| AtomicU64::new(0)),
            raw: std::array::from_fn(|_| AtomicU64::new(0)),
            slot_ns: std::array::from_fn(|_| std::sync::atomic::AtomicU32::new(0)),
        }))
    }

    /// The pid namespace of the tests' processes.
    const NS: u32 = 4_026_531_836;

    /// Pids 1..=1000 live; above that they are dead.
    fn alive(owner: u64) -> bool {
        owner_pid(owner) <= 1000
    }

    #[test]
    fn processes_of_one_grant_share_its_cap_and_a_dead_ones_charge_is_reclaimed() {
        let t = table();
        let a = Group::claim(t, owner_word(10, 1), NS, alive).unwrap();
        let b = Group::claim(t, owner_word(11, 1), NS, alive).unwrap();
        assert!(a.reserve(0, 600, 1000).is_ok());
        assert_eq!(b.reserve(0, 600, 1000), Err(600), "the cap is the grant's");
        let dead = Group::claim(t, owner_word(5000, 1), NS, alive).unwrap();
        assert!(b.reserve(0, 400, 1000).is_ok());
        assert_eq!(b.sum(0), 1000);
        assert!(a.reserve(1, 1000, 1000).is_ok(), "devices are separate");
        // A dead process's charge counts until a refusal looks for dead processes.
        a.counter(0).unwrap().fetch_sub(600, SeqCst);
        dead.counter(0).unwrap().fetch_add(600, SeqCst);
        assert!(a.reserve(0, 500, 1000).is_ok(), "reclaimed before refusing");
        assert_eq!((a.sum(0), b.sum(0)), (900, 900));
        // The same process after an exec gets its own slot back, zeroed.
        let a2 = Group::claim(t, owner_word(10, 1), NS, alive).unwrap();
        assert_eq!(a2.slot, a.slot);
        assert_eq!(a2.sum(0), 400);
        // A recycled pid is another owner.
        let c = Group::claim(t, owner_word(10, 2), NS, alive).unwrap();
        assert_ne!(c.slot, a.slot);
        assert_eq!(b.reserve(0, u64::MAX, 1000), Err(400));
    }

    #[test]
    fn a_slot_of_another_pid_namespace_is_never_judged_dead_from_outside_it() {
        let t = table();
        // A worker in a pid namespace of its own holds 600 of 1000; its pid (5001) names no
        // living process in this namespace.
        let other = Group::claim(t, owner_word(5001, 1), NS + 1, alive).unwrap();
        assert_eq!(t.slot_ns[other.slot].load(SeqCst), NS + 1);
        assert!(other.reserve(0, 600, 1000).is_ok());
        let here = Group::claim(t, owner_word(10, 1), NS, alive).unwrap();
        assert_eq!(
            here.reserve(0, 600, 1000),
            Err(600),
            "its bytes stay: the cap holds"
        );
        assert_eq!(here.reclaim_dead(), 0);
        // From inside its namespace the same dead pid is reclaimed.
        let inside = Group::claim(t, owner_word(20, 1), NS + 1, alive).unwrap();
        assert_eq!(inside.reclaim_dead(), 1);
        assert!(here.reserve(0, 600, 1000).is_ok());
        // A slot taken by an older shim says no namespace: judged by its pid, as before.
        let old = Group::claim(t, owner_word(5002, 1), NS, alive).unwrap();
        t.slot_ns[old.slot].store(0, SeqCst);
        assert_eq!(here.reclaim_dead(), 1);
        // A freed slot says no namespace again (an older shim that takes it writes none).
        assert_eq!(t.slot_ns[old.slot].load(SeqCst), 0);
        // The same owner word in two namespaces (pid 1 of two containers started in one tick)
        // is two processes: two slots, neither's charge zeroed by the other's claim.
        let a = Group::claim(t, owner_word(1, 9), NS + 2, alive).unwrap();
        assert!(a.reserve(0, 100, 1000).is_ok());
        let b = Group::claim(t, owner_word(1, 9), NS + 3, alive).unwrap();
        assert_ne!(a.slot, b.slot);
        assert_eq!(a.counter(0).unwrap().load(SeqCst), 100);
        // The same word and namespace is the same process (after an exec): its slot, zeroed.
        let a2 = Group::claim(t, owner_word(1, 9), NS + 2, alive).unwrap();
        assert_eq!(a2.slot, a.slot);
    }

    #[test]
    fn the_same_owner_word_claimed_at_once_from_two_namespaces_takes_two_slots() {
        for _ in 0..300 {
            let t = table();
            let barrier = Arc::new(Barrier::new(2));
            let claims: Vec<_> = [NS + 5, NS + 6]
                .into_iter()
                .map(|ns| {
                    let b = barrier.clone();
                    std::thread::spawn(move || {
                        b.wait();
                        let g = Group::claim(t, owner_word(1, 3), ns, alive).unwrap();
                        g.counter(0).unwrap().fetch_add(100, SeqCst);
                        g.slot
                    })
                })
                .collect();
            let slots: Vec<usize> = claims.into_iter().map(|c| c.join().unwrap()).collect();
            assert_ne!(slots[0], slots[1], "two processes, two slots");
            for s in slots {
                assert_eq!(t.slots[s].bytes[0].load(SeqCst), 100, "no charge zeroed");
            }
        }
    }

    #[test]
    fn a_full_table_of_live_processes_refuses_a_slot_and_a_dead_one_is_reused() {
        let t = table();
        for p in 0..LEDGER_SLOTS as u32 {
            Group::claim(t, owner_word(p + 1, 0), NS, alive).unwrap();
        }
        assert_eq!(
            Group::claim(t, owner_word(999, 7), NS, alive).unwrap_err(),
            ClaimError::Full
        );
        // Once pid 128 is dead its slot is reclaimed and reused.
        let g = Group::claim(t, owner_word(999, 8), NS, |o| owner_pid(o) != 128).unwrap();
        assert_eq!(g.slot, 127);
        // Slot 0's too (the claim reclaims as no slot's holder).
        let g = Group::claim(t, owner_word(998, 8), NS, |o| owner_pid(o) != 1).unwrap();
        assert_eq!(g.slot, 0);
    }

    /// Several "processes" (slots) × threads race for one cap: what succeeded never sums past it
    /// at any instant, and every byte reserved is accounted.
    #[test]
    fn racing_processes_and_threads_never_pass_the_grants_cap() {
        for round in 0..10u64 {
            let t = table();
            let cap = 1000 + round * 13;
            let groups: Vec<Group> = (0..4)
                .map(|p| Group::claim(t, owner_word(p + 1, 0), NS, alive).unwrap())
                .collect();
            let ok = Arc::new(AtomicUsize::new(0));
            let barrier = Arc::new(Barrier::new(16));
            let hs: Vec<_> = (0..16)
                .map(|i| {
                    let g = groups[i % 4];
                    let (ok, barrier) = (ok.clone(), barrier.clone());
                    std::thread::spawn(move || {
                        barrier.wait();
                        let mut held = 0;
                        for k in 0..300 {
                            // `ok` counts what is held (the "driver's ledger"): raised after a
                            // reservation succeeded, lowered before its bytes are given back.
                            // The slot sums themselves include racers' transient reservations.
                            if g.reserve(0, 10, cap).is_ok() {
                                held += 1;
                                let n = ok.fetch_add(1, SeqCst) + 1;
                                assert!(n as u64 * 10 <= cap, "over-commit: {n} × 10 > {cap}");
                            }
                            if k % 3 == 2 && held > 0 {
                                held -= 1;
                                ok.fetch_sub(1, SeqCst);
                                g.counter(0).unwrap().fetch_sub(10, SeqCst);
                            }
                        }
                    })
                })
                .collect();
            for h in hs {
                h.join().unwrap();
            }
            assert_eq!(groups[0].sum(0), ok.load(SeqCst) as u64 * 10);
            assert!(groups[0].sum(0) <= cap);
        }
    }

    #[test]
    fn the_first_context_is_measured_by_one_process_and_the_others_wait_for_its_figure() {
        let t = table();
        let a = Group::claim(t, owner_word(11, 1), NS, alive).unwrap();
        let b = Group::claim(t, owner_word(12, 1), NS, alive).unwrap();
        assert_eq!(a.begin_first_context(0), FirstContext::Mine);
        // b waits while a measures; a publishes and ends: b gets the figure.
        let waiter = std::thread::spawn(move || b.begin_first_context(0));
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(!waiter.is_finished(), "b must wait while a measures");
        a.publish_footprint(0, 4 << 20);
        a.end_first_context(0);
        assert_eq!(waiter.join().unwrap(), FirstContext::Known(4 << 20));
        // Once known, nobody measures again.
        assert_eq!(a.begin_first_context(0), FirstContext::Known(4 << 20));
    }

    #[test]
    fn a_measurer_that_died_does_not_hold_the_others() {
        let t = table();
        let dead = Group::claim(t, owner_word(5000, 1), NS, alive).unwrap();
        let b = Group::claim(t, owner_word(13, 1), NS, alive).unwrap();
        assert_eq!(dead.begin_first_context(1), FirstContext::Mine);
        // Its process is gone (pid > 1000 is dead here): b takes the measurement at once.
        assert_eq!(b.begin_first_context(1), FirstContext::Mine);
        b.end_first_context(1);
    }
}

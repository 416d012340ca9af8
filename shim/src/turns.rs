//! Turns: the harvesting functions of a time-sliced GPU put their work on the GPU one function at
//! a time, through the GPU's turn board (`smore_protocol::board`, made by the arbiter;
//! docs/harvest.md, "Serializing the functions"; docs/shim.md, "Turns").
//!
//! Why: on a time-sliced GPU a kernel that waits behind another function's looks, to its shim,
//! like one that waits behind the training job, so the shims charged their collision budgets for
//! each other's work; and the GPU's round robin among contexts served several requests at once
//! instead of one after the other. With turns, the waits a shim measures are behind training
//! (or a process outside smore) only.
//!
//! A turn is a lease on the board's one turn word: the holder's member index and until when
//! (µs). A launch of the holder extends the lease to the end of the holder's queued work
//! ([`crate::harvest::Backlog`]) plus [`TURN_GAP_NS`] — the host time between one request's
//! launches — so a turn lasts while its holder keeps work on the GPU and lapses soon after
//! (no synchronization is hooked). A launch of another process waits, on the host, until the
//! lease runs out and it is first in line (earliest wait first), then takes the turn with one
//! compare-and-swap.
//!
//! Owns the turn rule and the member seats. Bounds that keep a function from stalling its
//! neighbours through a board it can write: a lease is never honoured further than
//! [`MAX_LEASE_NS`] ahead, a holder stops extending after [`TURN_MAX_NS`] while others wait, and
//! a launch waits at most [`MAX_WAIT_NS`] before it goes without a turn.
//!
//! Must never: make a syscall or take a lock when the turn is free or already this process's
//! (one load, at most one compare-and-swap); leave a launch waiting longer than [`MAX_WAIT_NS`].

use smore_protocol::board::{split_turn, turn_word, Member, TurnBoard, BOARD_MEMBERS};
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{Acquire, Relaxed, SeqCst};

/// How long a turn outlasts its holder's queued work: 500 µs. Reasoning: the holder's next
/// launch of the same request comes within tens of µs of the last (a framework's host work
/// between kernels) and keeps the turn; the estimate of the queue's end errs by a few hundred µs;
/// a longer gap leaves the GPU to the trainer alone while a neighbour waits.
pub const TURN_GAP_NS: u64 = 500_000;
/// The furthest ahead a lease is written or honoured: 20 ms. Reasoning: a holder's lease is its
/// queued work (at most the backlog horizon, 4 ms, or one longer launch) plus the gap; a lease
/// further out is a launch longer than that, whose holder loses the exclusive turn at 20 ms, or
/// a function that wrote the board to stall its neighbours.
pub const MAX_LEASE_NS: u64 = 20_000_000;
/// How long a holder keeps extending its turn while another process waits: 20 ms. Reasoning: a
/// request of the functions smore serves runs in a few ms; a holder that keeps the GPU busy
/// this long is serving several, and the waiting one's deadline is as near as its.
pub const TURN_MAX_NS: u64 = 20_000_000;
/// The longest a launch waits for a turn before it goes without one: 25 ms. Reasoning: a few
/// functions' turns ahead of it (each a request of a few ms); past it the board is stalled (a
/// hung or hostile holder), and going without a turn is what a GPU without turns does.
pub const MAX_WAIT_NS: u64 = 25_000_000;
/// How often a waiting launch looks at the board again, at most: 2 ms (it wakes at the lease's
/// end when that is sooner), and refreshes its place in line.
pub const RECHECK_NS: u64 = 2_000_000;
/// A waiter that has not looked at the board for this long is passed over: 10 ms (5 ×
/// [`RECHECK_NS`]; a waiter that died or was stopped must not stand first for ever).
pub const WAITER_STALE_NS: u64 = 10_000_000;

/// What a launch does about the GPU's turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Take {
    /// The turn is this process's (taken, kept or extended): launch.
    Go,
    /// Another process holds the turn or is first in line: look again at this time
    /// (CLOCK_MONOTONIC ns).
    WaitUntil(u64),
}

/// Why a process has no seat on a board.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeatError {
    /// Every member slot is held by a live process: this process runs without turns.
    Full,
}

impl std::fmt::Display for SeatError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SeatError::Full => write!(
                f,
                "every one of the turn board's {BOARD_MEMBERS} seats is held by a live process; \
                 this process runs without turns (its launches may wait on the GPU behind other \
                 functions')"
            ),
        }
    }
}

/// A process's seat on a GPU's board, for the device of grant-page slot `slot`.
#[derive(Debug)]
pub struct Seat<'a> {
    board: &'a TurnBoard,
    member: usize,
    slot: usize,
    /// When this process last took the turn (ns; 0 = never).
    taken_at: AtomicU64,
}

fn us(ns: u64) -> u64 {
    ns / 1_000
}

impl<'a> Seat<'a> {
    /// Takes a member slot for the process of owner word `owner` (its own if it holds one
    /// already; a slot whose owner `alive` says is gone is reclaimed when none is free). Cold:
    /// `alive` reads `/proc`.
    pub fn join(
        board: &'a TurnBoard,
        slot: usize,
        owner: u64,
        alive: impl Fn(u64) -> bool,
    ) -> Result<Seat<'a>, SeatError> {
        let seat = |member| {
            let m: &Member = &board.members[member];
            m.waiting_since.store(0, SeqCst);
            Seat {
                board,
                member,
                slot,
                taken_at: AtomicU64::new(0),
            }
        };
        if let Some(i) = board
            .members
            .iter()
            .position(|m| m.owner.load(SeqCst) == owner)
        {
            return Ok(seat(i));
        }
        for round in 0..2 {
            for (i, m) in board.members.iter().enumerate() {
                if m.owner.compare_exchange(0, owner, SeqCst, SeqCst).is_ok() {
                    return Ok(seat(i));
                }
            }
            if round == 0 {
                for m in &board.members {
                    let o = m.owner.load(SeqCst);
                    if o != 0 && o != owner && !alive(o) {
                        // A dead process's seat; a racer that freed it first makes this a no-op.
                        let _ = m.owner.compare_exchange(o, 0, SeqCst, SeqCst);
                    }
                }
            }
        }
        Err(SeatError::Full)
    }

    /// The grant-page slot whose device this seat takes turns on.
    #[inline]
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// Whether the GPU's functions take turns now (the arbiter's switch: off under MPS).
    #[inline]
    pub fn enabled(&self) -> bool {
        self.board.enabled.load(Relaxed) != 0
    }

    /// One attempt at the turn at `now` for a launch after which this process's queued work
    /// ends at `work_end` (ns): the lease becomes `work_end` + [`TURN_GAP_NS`], at most
    /// [`MAX_LEASE_NS`] ahead.
    #[inline]
    pub fn try_take(&self, now: u64, work_end: u64) -> Take {
        let lease = us(work_end
            .max(now)
            .saturating_add(TURN_GAP_NS)
            .min(now.saturating_add(MAX_LEASE_NS)));
        let now_us = us(now);
        let mut word = self.board.turn.load(Acquire);
        loop {
            let (holder, until) = split_turn(word);
            let honoured = until > now_us && until <= now_us + us(MAX_LEASE_NS);
            if holder == Some(self.member) && honoured {
                // Kept: extend, unless it was held past TURN_MAX_NS while another waits.
                if lease <= until || self.overstayed(now) {
                    return Take::Go;
                }
                match self.board.turn.compare_exchange_weak(
                    word,
                    turn_word(self.member, lease),
                    SeqCst,
                    Acquire,
                ) {
                    Ok(_) => return Take::Go,
                    Err(w) => word = w,
                }
                continue;
            }
            if honoured {
                self.stand_in_line(now);
                return Take::WaitUntil((until * 1_000).min(now + RECHECK_NS));
            }
            // Free (no holder, a lease that ran out, or one not honoured): the first in line
            // takes it.
            if self.someone_ahead(now) {
                self.stand_in_line(now);
                return Take::WaitUntil(now + RECHECK_NS.min(TURN_GAP_NS));
            }
            match self.board.turn.compare_exchange_weak(
                word,
                turn_word(self.member, lease),
                SeqCst,
                Acquire,
            ) {
                Ok(_) => {
                    self.taken_at.store(now, Relaxed);
                    self.leave_line();
                    return Take::Go;
                }
                Err(w) => word = w,
            }
        }
    }

    /// This process stops waiting (it took the turn or gave up).
    #[inline]
    pub fn leave_line(&self) {
        let m = &self.board.members[self.member];
        if m.waiting_since.load(Relaxed) != 0 {
            m.waiting_since.store(0, SeqCst);
        }
    }

    /// Ends this process's turn now if it holds one (its work is done early, or it leaves).
    pub fn give_up(&self) {
        let word = self.board.turn.load(Acquire);
        if split_turn(word).0 == Some(self.member) {
            let _ = self.board.turn.compare_exchange(word, 0, SeqCst, Relaxed);
        }
    }

    fn stand_in_line(&self, now: u64) {
        let m = &self.board.members[self.member];
        if m.waiting_since.load(Relaxed) == 0 {
            m.waiting_since.store(now.max(1), SeqCst);
        }
        m.seen_ns.store(now, SeqCst);
    }

    /// Whether a live waiter stands before this process: one that began waiting earlier (or at
    /// the same time, with a lower index); any live waiter when this process does not wait.
    fn someone_ahead(&self, now: u64) -> bool {
        let mine = self.board.members[self.member].waiting_since.load(SeqCst);
        let key = (if mine == 0 { u64::MAX } else { mine }, self.member);
        self.board.members.iter().enumerate().any(|(i, m)| {
            if i == self.member {
                return false;
            }
            let since = m.waiting_since.load(SeqCst);
            since != 0
                && m.seen_ns.load(SeqCst).saturating_add(WAITER_STALE_NS) >= now
                && (since, i) < key
        })
    }

    /// Whether this process has held the turn past [`TURN_MAX_NS`] while a live process waits.
    fn overstayed(&self, now: u64) -> bool {
        now.saturating_sub(self.taken_at.load(Relaxed)) > TURN_MAX_NS && self.someone_ahead(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn board() -> &'static TurnBoard {
        Box::leak(Box::new(TurnBoard::empty()))
    }

    fn seat(b: &'static TurnBoard, owner: u64) -> Seat<'static> {
        Seat::join(b, 0, owner, |_| true).unwrap()
    }

    #[test]
    fn a_free_turn_is_taken_and_kept_while_its_holder_has_work() {
        let b = board();
        let (a, c) = (seat(b, 1), seat(b, 2));
        let t0 = 1_000 * MS;
        assert_eq!(a.try_take(t0, t0 + 2 * MS), Take::Go);
        // The other waits until the lease (work + gap) runs out.
        match c.try_take(t0 + MS, t0 + 2 * MS) {
            Take::WaitUntil(t) => assert!(t > t0 + MS && t <= t0 + 2 * MS + TURN_GAP_NS, "{t}"),
            other => panic!("{other:?}"),
        }
        // The holder's next launch extends it.
        assert_eq!(a.try_take(t0 + 2 * MS, t0 + 4 * MS), Take::Go);
        assert!(matches!(c.try_take(t0 + 3 * MS, 0), Take::WaitUntil(_)));
        // Once it lapses, the waiter takes it; the old holder now waits.
        let later = t0 + 4 * MS + TURN_GAP_NS + 1_000;
        assert_eq!(c.try_take(later, later + MS), Take::Go);
        assert!(matches!(a.try_take(later, later + MS), Take::WaitUntil(_)));
    }

    #[test]
    fn the_first_in_line_goes_first() {
        let b = board();
        let (h, early, late) = (seat(b, 1), seat(b, 2), seat(b, 3));
        let t0 = 1_000 * MS;
        assert_eq!(h.try_take(t0, t0 + MS), Take::Go);
        assert!(matches!(early.try_take(t0 + 100, 0), Take::WaitUntil(_)));
        assert!(matches!(late.try_take(t0 + 200, 0), Take::WaitUntil(_)));
        let free = t0 + MS + TURN_GAP_NS + 1_000;
        // The later waiter finds the turn free but someone ahead of it.
        assert!(matches!(late.try_take(free, free), Take::WaitUntil(_)));
        assert_eq!(early.try_take(free, free + MS), Take::Go);
        // A waiter that stopped looking is passed over.
        let b = board();
        let (h, gone, next) = (seat(b, 1), seat(b, 2), seat(b, 3));
        assert_eq!(h.try_take(t0, t0), Take::Go);
        assert!(matches!(gone.try_take(t0 + 100, 0), Take::WaitUntil(_)));
        let much_later = t0 + WAITER_STALE_NS + MS;
        assert_eq!(next.try_take(much_later, much_later), Take::Go);
    }

    #[test]
    fn a_lease_too_far_ahead_is_not_honoured_and_a_long_holder_yields() {
        let b = board();
        let (a, c) = (seat(b, 1), seat(b, 2));
        let t0 = 1_000 * MS;
        // A board written to stall: a lease an hour ahead.
        b.turn.store(turn_word(0, us(t0 + 3_600_000 * MS)), SeqCst);
        assert_eq!(c.try_take(t0, t0 + 3_600_000 * MS), Take::Go);
        // A holder's own lease is capped.
        let (_, until) = split_turn(b.turn.load(SeqCst));
        assert!(until <= us(t0 + MAX_LEASE_NS));
        // A holder that keeps launching extends its turn up to TURN_MAX_NS while another waits.
        let b = board();
        let (a2, c2) = (seat(b, 1), seat(b, 2));
        assert_eq!(a2.try_take(t0, t0 + MS), Take::Go);
        let mut t = t0;
        while t < t0 + TURN_MAX_NS + MS {
            t += MS / 2;
            let _ = c2.try_take(t, t);
            assert_eq!(a2.try_take(t, t + MS), Take::Go);
        }
        // It went on (its launches never wait while it holds the turn), but stopped extending,
        // so the lease ran out and the waiter has it.
        let t = t + MS + TURN_GAP_NS;
        assert_eq!(c2.try_take(t, t + MS), Take::Go);
        assert!(matches!(a2.try_take(t, t + MS), Take::WaitUntil(_)));
        let _ = a;
    }

    #[test]
    fn seats_are_reclaimed_from_dead_processes_and_a_full_board_says_so() {
        let b = board();
        for o in 1..=BOARD_MEMBERS as u64 {
            seat(b, o);
        }
        assert_eq!(
            Seat::join(b, 0, 999, |_| true).unwrap_err(),
            SeatError::Full
        );
        let s = Seat::join(b, 0, 999, |o| o != 7).unwrap();
        assert_eq!(s.member, 6);
        // Joining again finds the same seat.
        assert_eq!(Seat::join(b, 0, 999, |_| true).unwrap().member, 6);
    }

    #[test]
    fn giving_up_frees_the_turn_for_the_next() {
        let b = board();
        let (a, c) = (seat(b, 1), seat(b, 2));
        let t0 = 1_000 * MS;
        assert_eq!(a.try_take(t0, t0 + 3 * MS), Take::Go);
        c.give_up();
        assert!(matches!(c.try_take(t0 + 10, 0), Take::WaitUntil(_)));
        a.give_up();
        assert_eq!(c.try_take(t0 + 20, t0 + MS), Take::Go);
    }
}

//! Turns: the harvesting functions of a time-sliced GPU put their work on the GPU one function at
//! a time, through the GPU's turn board (`smore_protocol::board`, made by the arbiter;
//! docs/harvest.md, "Serializing the functions"; docs/shim.md, "Turns").
//!
//! Why: on a time-sliced GPU a kernel that waits behind another function's looks, to its shim,
//! like one that waits behind the training job, so the shims charged their collision budgets for
//! each other's work; and the GPU's round robin among contexts served several requests at once
//! instead of one after the other. With turns, the waits a shim measures are mostly behind
//! training (or a process outside smore).
//!
//! A turn is a lease on the board's one turn word: the holder's seat, which of its function's
//! processes holds it (a tag of its pid), and until when (µs). Seats are the arbiter's: one per
//! instance, in the grant page (`DeviceGrant::turn_seat`), so every process of a function stands
//! in line as that function; its worker processes take the turn from each other like functions
//! do (a function's line is its seat's, and a worker waiting on it counts as waiting for the
//! holder's [`TURN_MAX_NS`]). A launch of the holder extends the lease
//! to the end of its queued work ([`crate::harvest::Backlog`]) plus [`TURN_GAP_NS`] — the host
//! time between one request's launches — so a turn lasts while its holder keeps work on the GPU
//! and lapses soon after (no synchronization is hooked). Another function's launch waits, on the
//! host, until the lease runs out and it is first in line, then takes the turn with one
//! compare-and-swap — or, as an MPS client, goes at once beside the holder when the wait
//! would make its request miss its deadline (a cut-in, [`Urgency`]). The line is in deadline order: a launch's key is the deadline of its
//! function's current request, which the arbiter writes into the grant page at the request's
//! admission (`DeviceGrant::turn_key_ns`), or the time it came if none is known.
//!
//! Owns the turn rule. Bounds that keep a function from stalling its neighbours through a board
//! it can write: a lease is never honoured further than [`MAX_LEASE_NS`] ahead; a holder that
//! has had the turn [`TURN_MAX_NS`] while another waits cuts its lease short; a waiter's claim to
//! have looked in the future is not believed, nor a seat the arbiter did not give; a launch
//! waits at most [`MAX_WAIT_NS`] before it goes without a turn, and when the turn never passed
//! between functions meanwhile (a stalled board, not a long line), or on a second give-up within
//! [`GIVE_UP_BACKOFF_NS`], its function goes without turns for [`GIVE_UP_BACKOFF_NS`] — so a
//! board made to stall costs a neighbour at most 2 × [`MAX_WAIT_NS`] per
//! [`GIVE_UP_BACKOFF_NS`].
//!
//! Must never: make a syscall, take a lock or allocate (a free turn scans the seats; a held one
//! is one load and at most one compare-and-swap); leave a launch waiting longer than
//! [`MAX_WAIT_NS`].

use smore_protocol::board::{split_turn, turn_tag, turn_word, TurnBoard, BOARD_MEMBERS};
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
/// How long a holder keeps its turn while another function waits: 20 ms, after which its next
/// launch cuts the lease to [`TURN_GAP_NS`]. Reasoning: a request of the functions smore serves
/// runs in a few ms; a holder that keeps the GPU busy this long is serving several, and the
/// waiting one's deadline is as near as its.
pub const TURN_MAX_NS: u64 = 20_000_000;
/// The longest a launch waits for a turn before it goes without one: 30 ms. Reasoning: above a
/// holder's [`TURN_MAX_NS`] plus its last lease (its backlog, 4 ms, and the gap), so an honest
/// line never gives up; past it the board is stalled (a hung or hostile holder), and going
/// without a turn is what a GPU without turns does.
pub const MAX_WAIT_NS: u64 = 30_000_000;
// A waiter outlasts one holder's turn and the lease of its backlog; a longer line, or a long
// launch's lease, may make it give up, which sends only that launch without a turn while the
// line moves.
const _: () = assert!(MAX_WAIT_NS > TURN_MAX_NS + crate::harvest::BACKLOG_HORIZON_NS + TURN_GAP_NS);

/// After a launch gave up waiting on a stalled board (the turn never passed between functions
/// while it waited), how long its function goes without turns: 1 s. Reasoning: bounds what a
/// board made to stall costs a function 2 × [`MAX_WAIT_NS`] per second (6 %) at most, instead
/// of that per launch.
pub const GIVE_UP_BACKOFF_NS: u64 = 1_000_000_000;
/// Compare-and-swap tries of one look at the board before it looks again later: 16 (an honest
/// board changes a few times per lease; a word that changes under every try is being written in
/// a loop).
const CAS_TRIES: u32 = 16;
/// How often a waiting launch looks at the board again, at most: 2 ms (it wakes at the lease's
/// end when that is sooner), and refreshes its place in line.
pub const RECHECK_NS: u64 = 2_000_000;
/// A waiter that has not looked at the board for this long is passed over: 10 ms (5 ×
/// [`RECHECK_NS`]; a waiter that died or was stopped must not stand first for ever).
pub const WAITER_STALE_NS: u64 = 10_000_000;
/// How old a request's deadline may be and still place a launch in line: 1 s. Reasoning: a
/// request past its deadline goes first (it is the most urgent), but a deadline that old is the
/// last request's, left on the page, and a launch outside any request takes its place by when it
/// came.
pub const KEY_MAX_AGE_NS: u64 = 1_000_000_000;

/// A launch's place in line: its request's deadline from the grant page (`deadline`, 0 = none
/// known) while at most [`KEY_MAX_AGE_NS`] old, else when it came (`now`).
#[inline]
pub fn key(deadline: u64, now: u64) -> u64 {
    request_deadline(deadline, now).unwrap_or(now)
}

/// The deadline of the function's current request from the grant page (`deadline`, 0 = none
/// known) while at most [`KEY_MAX_AGE_NS`] old at `now`.
#[inline]
pub fn request_deadline(deadline: u64, now: u64) -> Option<u64> {
    (deadline > 0 && deadline.saturating_add(KEY_MAX_AGE_NS) >= now).then_some(deadline)
}

/// What a launch does about the GPU's turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Take {
    /// The turn is this function's (taken, kept or extended), or turns are off for now (a
    /// recent give-up): launch.
    Go,
    /// Another function holds the turn or is first in line: look again at this time
    /// (CLOCK_MONOTONIC ns).
    WaitUntil(u64),
    /// Another function holds the turn, and waiting for its lease to end would leave this
    /// launch's request no time to run before its deadline: launch now, beside the holder's
    /// work, without taking the turn (docs/shim.md, "Turns": a cut-in).
    CutIn,
}

/// How much GPU time a launch reckons its request still needs when it decides whether to cut
/// in ([`Urgency::cuts_in`]): 4 × its own. Reasoning: a request is a few launches (the demo's
/// mobilenet three of 200 µs) and under MPS each runs slowed beside the trainer (β 0.5: 1.5 ×),
/// so one launch's time alone cuts in too late. Measured (simulated MPS `harvest`, seed 8, one
/// run each, within the ±1.5 pp the runs spread by; docs/harvest.md, "Cut-ins under MPS"): DSR
/// 95.1 / 95.4 / 95.9 / 92.1 % at × 1 / 2 / 4 / 8 — at × 8 so many launches cut in that the
/// functions slow each other as without turns.
pub const CUT_IN_LAUNCHES: u64 = 4;

/// What a launch may cut in for: its own GPU time and its request's deadline (both ns, the
/// deadline on CLOCK_MONOTONIC). Only for an MPS client ([`Urgency::on`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Urgency {
    cost_ns: u64,
    deadline_ns: u64,
}

impl Urgency {
    /// A launch of `cost_ns` for a request due at `deadline` (none known: no cut-in), of a
    /// process NVML lists as an MPS client (`mps`; on a time-sliced GPU a cut-in would put two functions in the
    /// GPU's round robin, and the one that cut in would wait out the holder's slice anyway and
    /// pay for it as a collision: docs/harvest.md, "Cut-ins under MPS").
    #[inline]
    pub fn on(mps: bool, cost_ns: u64, deadline: Option<u64>) -> Option<Urgency> {
        deadline.filter(|_| mps).map(|deadline_ns| Urgency {
            cost_ns,
            deadline_ns,
        })
    }

    /// Whether this launch, at `now`, cuts in beside a lease that ends at `until_ns`: it can
    /// still finish by its request's deadline, and waiting for the lease would leave its request
    /// less than [`CUT_IN_LAUNCHES`] × its GPU time (all ns). Reasoning: the line is there so
    /// that the functions do not wait on the GPU behind each other; under MPS, where kernels
    /// of different processes run at once, a request that would miss its deadline after the
    /// wait is served better beside the holder, both slowed a little. A request already past
    /// hope (its launch cannot finish in time) waits its turn: it would only slow the holder.
    /// The wait reckoned is the holder's lease alone; waiters ahead of this launch add theirs,
    /// and it looks again at each lease's end.
    #[inline]
    pub fn cuts_in(&self, now: u64, until_ns: u64) -> bool {
        let need = self.cost_ns.saturating_mul(CUT_IN_LAUNCHES);
        now.saturating_add(self.cost_ns) <= self.deadline_ns
            && until_ns.saturating_add(need) > self.deadline_ns
    }
}

/// A process's seat on a GPU's board — its function's, given by the arbiter — for the device of
/// grant-page slot `slot`.
#[derive(Debug)]
pub struct Seat<'a> {
    board: &'a TurnBoard,
    member: usize,
    /// This process among its function's ([`smore_protocol::board::process_tag`]).
    tag: u16,
    /// The key this process last stood in the seat's line with (0: not in line): a key there
    /// that is not this is another process's of the function ([`Seat::worker_ahead`]).
    in_line: AtomicU64,
    slot: usize,
    /// When this process last took the turn, or last found no one waiting while it held it (ns).
    taken_at: AtomicU64,
    /// Until when this process goes without turns after a give-up (ns; 0 = never gave up).
    skip_until: AtomicU64,
    /// When a launch of this process last gave up waiting (ns; 0 = never).
    last_give_up: AtomicU64,
}

fn us(ns: u64) -> u64 {
    ns / 1_000
}

impl<'a> Seat<'a> {
    /// The seat `member` (the grant page's `turn_seat`) on `board` for the process of `tag`
    /// ([`smore_protocol::board::process_tag`]), for grant-page slot `slot`; none for a seat
    /// beyond the board.
    pub fn new(board: &'a TurnBoard, member: usize, tag: u16, slot: usize) -> Option<Seat<'a>> {
        (member < BOARD_MEMBERS).then(|| Seat {
            board,
            member,
            tag,
            in_line: AtomicU64::new(0),
            slot,
            taken_at: AtomicU64::new(0),
            skip_until: AtomicU64::new(0),
            last_give_up: AtomicU64::new(0),
        })
    }

    /// The seat's index on the board (what the grant page's `turn_seat` must still say).
    #[inline]
    pub fn member(&self) -> usize {
        self.member
    }

    /// Whether this process takes turns at `now`: not during the back-off after a give-up, when
    /// its launches go without a turn (and what its samples waited may be behind other
    /// functions).
    #[inline]
    pub fn taking_turns(&self, now: u64) -> bool {
        now >= self.skip_until.load(Relaxed)
    }

    /// The GPU's board (its phase ring is written through it: `smore_protocol::phase`).
    #[inline]
    pub fn board(&self) -> &'a TurnBoard {
        self.board
    }

    /// The grant-page slot whose device this seat takes turns on.
    #[inline]
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// Whether the GPU's functions take turns now (the arbiter's switch, `[policy] turns`).
    #[inline]
    pub fn enabled(&self) -> bool {
        self.board.enabled.load(Relaxed) != 0
    }

    /// One attempt at the turn at `now` for a launch of place `key` in line (its request's
    /// deadline, or `now` when none is known; smaller goes first) after which this process's
    /// queued work ends at `work_end` (ns): the lease becomes `work_end` + [`TURN_GAP_NS`], at
    /// most [`MAX_LEASE_NS`] ahead. A launch with an `urgent` request that would miss its
    /// deadline waiting for another's lease cuts in ([`Urgency::cuts_in`]).
    #[inline]
    pub fn try_take(&self, now: u64, work_end: u64, key: u64, urgent: Option<Urgency>) -> Take {
        if now < self.skip_until.load(Relaxed) {
            // Without turns for now: not in anyone's way either.
            self.leave_line();
            return Take::Go;
        }
        let key = key.max(1);
        let lease = us(work_end
            .max(now)
            .saturating_add(TURN_GAP_NS)
            .min(now.saturating_add(MAX_LEASE_NS)));
        let now_us = us(now);
        let mut word = self.board.turn.load(Acquire);
        for _ in 0..CAS_TRIES {
            let (holder, until) = split_turn(word);
            let mine = holder == Some(self.member) && turn_tag(word) == self.tag;
            let honoured = until > now_us && until <= now_us + us(MAX_LEASE_NS);
            if mine && honoured {
                // Held past TURN_MAX_NS while another waits (another function, or a worker of
                // this one in the seat's line): never extended again, and cut to the gap, so the
                // turn passes within it.
                let overstayed = self.overstayed(now);
                // Another thread of the process may have stood in line meanwhile.
                self.leave_line();
                let target = if overstayed {
                    until.min(us(now.saturating_add(TURN_GAP_NS)))
                } else {
                    lease.max(until)
                };
                if target == until {
                    return Take::Go;
                }
                match self.board.turn.compare_exchange_weak(
                    word,
                    turn_word(self.member, self.tag, target),
                    SeqCst,
                    Acquire,
                ) {
                    Ok(_) => return Take::Go,
                    Err(w) => word = w,
                }
                continue;
            }
            if honoured {
                if urgent.is_some_and(|u| u.cuts_in(now, until * 1_000)) {
                    self.leave_line();
                    return Take::CutIn;
                }
                self.stand_in_line(now, key);
                return Take::WaitUntil((until * 1_000).min(now + RECHECK_NS));
            }
            // Free (no holder, a lease that ran out, or one not honoured): the first in line
            // takes it — but not the holder whose turn just ended for overstaying, whatever its
            // key: its waiters go first.
            if mine && self.overstayed(now) {
                return Take::WaitUntil(now + RECHECK_NS.min(TURN_GAP_NS));
            }
            if self.someone_ahead(now, key) || self.worker_ahead(now, key) {
                self.stand_in_line(now, key);
                return Take::WaitUntil(now + RECHECK_NS.min(TURN_GAP_NS));
            }
            match self.board.turn.compare_exchange_weak(
                word,
                turn_word(self.member, self.tag, lease),
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
        // The word kept changing under every try (a board written in a loop): look again soon.
        Take::WaitUntil(now + RECHECK_NS.min(TURN_GAP_NS))
    }

    /// The seat the board's turn word names, whether or not its lease still runs.
    #[inline]
    pub fn holder(&self) -> Option<usize> {
        split_turn(self.board.turn.load(Relaxed)).0
    }

    /// Who holds the turn, the seat and its process, whether or not its lease still runs (for
    /// telling a line that moves from a stalled one: a turn passed between two processes of one
    /// function moved too).
    #[inline]
    pub fn holding(&self) -> (Option<usize>, u16) {
        let word = self.board.turn.load(Relaxed);
        (split_turn(word).0, turn_tag(word))
    }

    /// This process stops waiting at `now`, after a wait that began at `start`: it took the
    /// turn or went without one (`gave_up` after [`MAX_WAIT_NS`]). A give-up while the turn never
    /// passed between functions (`!moved`: a stalled board), or a second one within
    /// [`GIVE_UP_BACKOFF_NS`] by a wait that began after the first (a board made to look as if it
    /// moved; threads giving up together count once), sends its function without turns for
    /// [`GIVE_UP_BACKOFF_NS`]; a first give-up in a line that moved is contention, and only the
    /// one launch goes without.
    #[inline]
    pub fn leave_line_at(&self, (start, now): (u64, u64), gave_up: bool, moved: bool) {
        let repeated = gave_up && {
            let last = self.last_give_up.swap(now, Relaxed);
            last != 0 && start > last && last.saturating_add(GIVE_UP_BACKOFF_NS) > now
        };
        if gave_up && (!moved || repeated) {
            self.skip_until
                .store(now.saturating_add(GIVE_UP_BACKOFF_NS), Relaxed);
        }
        self.leave_line();
    }

    /// Takes this process's place off its seat's line: the seat's key, if it is still the one
    /// this process stood with — another process of the function may stand there now.
    #[inline]
    fn leave_line(&self) {
        let mine = self.in_line.swap(0, Relaxed);
        if mine != 0 {
            let m = &self.board.members[self.member];
            let _ = m.key.compare_exchange(mine, 0, SeqCst, Relaxed);
        }
    }

    fn stand_in_line(&self, now: u64, key: u64) {
        let m = &self.board.members[self.member];
        // Seen first: a waiter is never live with another's stale time.
        m.seen_ns.store(now, SeqCst);
        self.in_line.store(key, Relaxed);
        if m.key.load(Relaxed) != key {
            m.key.store(key, SeqCst);
        }
    }

    /// Whether a live waiter stands before this process, whose place is `key`: one with a
    /// smaller key (or the same, with a lower seat). Live: a seat the arbiter gave (owner set),
    /// waiting (key set), that looked within [`WAITER_STALE_NS`] and not in the future.
    fn someone_ahead(&self, now: u64, key: u64) -> bool {
        let key = (key, self.member);
        self.board.members.iter().enumerate().any(|(i, m)| {
            if i == self.member {
                return false;
            }
            let k = m.key.load(SeqCst);
            if k == 0 || (k, i) >= key || m.owner.load(Relaxed) == 0 {
                return false;
            }
            let seen = m.seen_ns.load(SeqCst);
            seen <= now.saturating_add(RECHECK_NS) && seen.saturating_add(WAITER_STALE_NS) >= now
        })
    }

    /// Whether another process of this function stands in the seat's line before `key`: the
    /// seat's key is set by a live waiter, not the key this process stood with, and no later
    /// than `key` (the processes of a function mostly share one key, its current request's
    /// deadline: then the one waiting goes first).
    fn worker_ahead(&self, now: u64, key: u64) -> bool {
        let m = &self.board.members[self.member];
        let k = m.key.load(SeqCst);
        if k == 0 || k > key || k == self.in_line.load(Relaxed) {
            return false;
        }
        let seen = m.seen_ns.load(SeqCst);
        seen <= now.saturating_add(RECHECK_NS) && seen.saturating_add(WAITER_STALE_NS) >= now
    }

    /// Whether this process has held the turn past [`TURN_MAX_NS`] while a live function waits,
    /// or another process of its own (any: a holder that keeps the GPU this long yields whatever
    /// the keys). A holder that finds no one waiting starts its count again, so the seats are
    /// scanned at most once per [`TURN_MAX_NS`] while it holds the turn.
    fn overstayed(&self, now: u64) -> bool {
        if now.saturating_sub(self.taken_at.load(Relaxed)) <= TURN_MAX_NS {
            return false;
        }
        if self.someone_ahead(now, u64::MAX) || self.worker_ahead(now, u64::MAX) {
            return true;
        }
        self.taken_at.store(now, Relaxed);
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn board() -> &'static TurnBoard {
        let b: &'static TurnBoard = Box::leak(Box::new(TurnBoard::empty()));
        for (i, m) in b.members.iter().enumerate() {
            m.owner.store(100 + i as u64, SeqCst);
        }
        b
    }

    fn seat(b: &'static TurnBoard, member: usize) -> Seat<'static> {
        Seat::new(b, member, 1, 0).unwrap()
    }

    #[test]
    fn a_free_turn_is_taken_and_kept_while_its_holder_has_work() {
        let b = board();
        let (a, c) = (seat(b, 0), seat(b, 1));
        let t0 = 1_000 * MS;
        assert_eq!(a.try_take(t0, t0 + 2 * MS, t0, None), Take::Go);
        // The other waits until the lease (work + gap) runs out.
        match c.try_take(t0 + MS, t0 + 2 * MS, t0 + MS, None) {
            Take::WaitUntil(t) => assert!(t > t0 + MS && t <= t0 + 2 * MS + TURN_GAP_NS, "{t}"),
            other => panic!("{other:?}"),
        }
        // The holder's next launch extends it.
        assert_eq!(
            a.try_take(t0 + 2 * MS, t0 + 4 * MS, t0 + 2 * MS, None),
            Take::Go
        );
        assert!(matches!(
            c.try_take(t0 + 3 * MS, 0, t0 + MS, None),
            Take::WaitUntil(_)
        ));
        // Once it lapses, the waiter takes it; the old holder now waits.
        let later = t0 + 4 * MS + TURN_GAP_NS + 1_000;
        assert_eq!(c.try_take(later, later + MS, t0 + MS, None), Take::Go);
        assert!(matches!(
            a.try_take(later, later + MS, later, None),
            Take::WaitUntil(_)
        ));
        assert!(
            Seat::new(b, BOARD_MEMBERS, 1, 0).is_none(),
            "no seat beyond the board"
        );
    }

    #[test]
    fn the_first_in_line_goes_first_and_a_waiter_that_stopped_looking_is_passed_over() {
        let b = board();
        let (h, early, late) = (seat(b, 0), seat(b, 1), seat(b, 2));
        let t0 = 1_000 * MS;
        assert_eq!(h.try_take(t0, t0 + MS, t0, None), Take::Go);
        assert!(matches!(
            early.try_take(t0 + 100, 0, t0 + 100, None),
            Take::WaitUntil(_)
        ));
        assert!(matches!(
            late.try_take(t0 + 200, 0, t0 + 200, None),
            Take::WaitUntil(_)
        ));
        let free = t0 + MS + TURN_GAP_NS + 1_000;
        // The later waiter finds the turn free but someone ahead of it.
        assert!(matches!(
            late.try_take(free, free, t0 + 200, None),
            Take::WaitUntil(_)
        ));
        assert_eq!(early.try_take(free, free + MS, t0 + 100, None), Take::Go);
        let b = board();
        let (h, gone, next) = (seat(b, 0), seat(b, 1), seat(b, 2));
        assert_eq!(h.try_take(t0, t0, t0, None), Take::Go);
        assert!(matches!(
            gone.try_take(t0 + 100, 0, t0 + 100, None),
            Take::WaitUntil(_)
        ));
        let much_later = t0 + WAITER_STALE_NS + MS;
        assert_eq!(
            next.try_take(much_later, much_later, much_later, None),
            Take::Go
        );
    }

    #[test]
    fn the_earliest_deadline_goes_first_whoever_waited_longest() {
        let b = board();
        let (h, relaxed, urgent) = (seat(b, 0), seat(b, 1), seat(b, 2));
        let t0 = 1_000 * MS;
        assert_eq!(h.try_take(t0, t0 + MS, t0 + 50 * MS, None), Take::Go);
        // The relaxed request came first, deadline 40 ms out; the urgent one later, 5 ms out.
        assert!(matches!(
            relaxed.try_take(t0 + 100, 0, t0 + 40 * MS, None),
            Take::WaitUntil(_)
        ));
        assert!(matches!(
            urgent.try_take(t0 + 200, 0, t0 + 5 * MS, None),
            Take::WaitUntil(_)
        ));
        let free = t0 + MS + TURN_GAP_NS + 1_000;
        assert!(matches!(
            relaxed.try_take(free, free, t0 + 40 * MS, None),
            Take::WaitUntil(_)
        ));
        assert_eq!(
            urgent.try_take(free, free + MS, t0 + 5 * MS, None),
            Take::Go
        );
        // A newcomer with an earlier deadline than every waiter takes a free turn at once.
        let b = board();
        let (waiter, newcomer, h) = (seat(b, 0), seat(b, 1), seat(b, 2));
        assert_eq!(h.try_take(t0, t0, t0, None), Take::Go);
        assert!(matches!(
            waiter.try_take(t0 + 100, 0, t0 + 40 * MS, None),
            Take::WaitUntil(_)
        ));
        let free = t0 + TURN_GAP_NS + 1_000;
        assert_eq!(newcomer.try_take(free, free, t0 + 2 * MS, None), Take::Go);
        assert_eq!(key(0, t0), t0, "no deadline known: by when it came");
        assert_eq!(key(t0 - MS, t0), t0 - MS, "a late request goes first");
        let late = 5 * KEY_MAX_AGE_NS;
        assert_eq!(key(1, late), late, "an old deadline is the last request's");
    }

    #[test]
    fn a_board_written_to_stall_costs_a_bounded_wait() {
        let b = board();
        let (c, d) = (seat(b, 0), seat(b, 1));
        let t0 = 1_000 * MS;
        // A lease an hour ahead is not honoured; a holder's own lease is capped.
        b.turn
            .store(turn_word(5, 1, us(t0 + 3_600_000 * MS)), SeqCst);
        assert_eq!(c.try_take(t0, t0 + 3_600_000 * MS, t0, None), Take::Go);
        let (_, until) = split_turn(b.turn.load(SeqCst));
        assert!(until <= us(t0 + MAX_LEASE_NS));
        // A seat the arbiter never gave, and one that claims to look in the future, stand in no
        // one's way.
        let t1 = t0 + MAX_LEASE_NS + MS;
        b.members[7].owner.store(0, SeqCst);
        b.members[7].key.store(1, SeqCst);
        b.members[7].seen_ns.store(t1, SeqCst);
        b.members[9].key.store(1, SeqCst);
        b.members[9].seen_ns.store(u64::MAX, SeqCst);
        assert_eq!(d.try_take(t1, t1 + 5 * MS, t1, None), Take::Go);
        // After a give-up the function goes without turns for the back-off, then takes them
        // again.
        let t2 = t1 + MS;
        assert!(matches!(c.try_take(t2, t2, t2, None), Take::WaitUntil(_)));
        c.leave_line_at((t2 - MS, t2), true, false);
        assert_eq!(c.try_take(t2 + MS, t2, t2, None), Take::Go);
        assert_eq!(c.holder(), Some(1), "it went without taking the turn");
        // In a line that moved, a first give-up sends only that launch without a turn; a
        // second within the back-off (a board made to look as if it moved) the function.
        let b = board();
        let (e, f) = (seat(b, 0), seat(b, 1));
        let t3 = 10_000 * MS;
        assert_eq!(f.try_take(t3, t3 + 5 * MS, t3, None), Take::Go);
        e.leave_line_at((t3 - MS, t3), true, true);
        assert!(matches!(
            e.try_take(t3 + MS, t3, t3, None),
            Take::WaitUntil(_)
        ));
        e.leave_line_at((t3 + MS, t3 + 2 * MS), true, true);
        assert_eq!(e.try_take(t3 + 3 * MS, t3, t3, None), Take::Go);
        // After the back-off it takes turns again.
        let after = t2 + GIVE_UP_BACKOFF_NS + MS;
        assert_eq!(c.try_take(after, after + MS, after, None), Take::Go);
        assert_eq!(c.holder(), Some(0));
    }

    #[test]
    fn a_holder_that_keeps_the_gpu_past_its_turn_while_another_waits_passes_it_on() {
        // Whatever the holder's deadline: later than the waiter's, or earlier (its own next
        // launch must not take the turn straight back).
        for holder_key in [None, Some(1_000 * MS - MS)] {
            let b = board();
            let (a, c) = (seat(b, 0), seat(b, 1));
            let t0 = 1_000 * MS;
            let key = |t: u64| holder_key.unwrap_or(t);
            assert_eq!(a.try_take(t0, t0 + MS, key(t0), None), Take::Go);
            let mut t = t0;
            // Launching every 0.2 ms, always 1 ms of work queued: it keeps the turn up to
            // TURN_MAX_NS, then its lease is cut to the gap and never extended.
            while t < t0 + TURN_MAX_NS {
                t += MS / 5;
                let _ = c.try_take(t, t, t0 + MS, None);
                assert_eq!(a.try_take(t, t + MS, key(t), None), Take::Go);
            }
            let mut passed = None;
            while t < t0 + TURN_MAX_NS + 5 * MS {
                t += MS / 5;
                let _ = a.try_take(t, t + MS, key(t), None);
                if c.try_take(t, t + MS, t0 + MS, None) == Take::Go {
                    passed = Some(t);
                    break;
                }
            }
            let passed = passed.unwrap_or_else(|| panic!("{holder_key:?}: the turn passed on"));
            assert!(passed <= t0 + TURN_MAX_NS + MS + TURN_GAP_NS, "{passed}");
            assert_eq!(c.holder(), Some(1));
            assert!(matches!(
                a.try_take(t, t + MS, key(t), None),
                Take::WaitUntil(_)
            ));
        }
    }

    #[test]
    fn a_launch_that_would_miss_its_deadline_waiting_cuts_in_and_the_turn_stays() {
        let b = board();
        let (h, w) = (seat(b, 0), seat(b, 1));
        let t0 = 1_000 * MS;
        let cost = 200_000;
        // The holder's lease: 3 ms of work and the gap.
        assert_eq!(h.try_take(t0, t0 + 3 * MS, t0 + 50 * MS, None), Take::Go);
        let lease_end = t0 + 3 * MS + TURN_GAP_NS;
        let word = b.turn.load(SeqCst);
        let now = t0 + 100;
        // With slack after the lease (due 10 ms out), it waits in line.
        let slack = Urgency::on(true, cost, Some(t0 + 10 * MS));
        assert!(matches!(
            w.try_take(now, now, t0 + 10 * MS, slack),
            Take::WaitUntil(_)
        ));
        assert_ne!(b.members[1].key.load(SeqCst), 0, "it stands in line");
        // Due 3.7 ms out: the lease's end leaves less than 4 × 0.2 ms, so it cuts in.
        let due = now + 3_700_000;
        let urgent = Urgency::on(true, cost, Some(due));
        assert_eq!(w.try_take(now, now, due, urgent), Take::CutIn);
        assert_eq!(b.members[1].key.load(SeqCst), 0, "out of the line");
        assert_eq!(
            b.turn.load(SeqCst),
            word,
            "the turn and its lease are untouched"
        );
        // The boundary: exactly 4 × its GPU time left after the lease is enough.
        let edge = lease_end + CUT_IN_LAUNCHES * cost;
        assert!(!Urgency::on(true, cost, Some(edge))
            .unwrap()
            .cuts_in(now, lease_end));
        assert!(Urgency::on(true, cost, Some(edge - 1))
            .unwrap()
            .cuts_in(now, lease_end));
        // Not on a time-sliced GPU, not without a deadline (nor one over a second old), and
        // not for a request past hope: those wait their turn.
        assert_eq!(Urgency::on(false, cost, Some(due)), None);
        assert_eq!(Urgency::on(true, cost, None), None);
        assert_eq!(request_deadline(t0, t0 + KEY_MAX_AGE_NS + 1), None);
        let hopeless = Urgency::on(true, cost, Some(now + cost - 1));
        assert!(matches!(
            w.try_take(now, now, now + cost - 1, hopeless),
            Take::WaitUntil(_)
        ));
        assert_eq!(b.turn.load(SeqCst), word);
        // The holder's own launches go as before; a free turn is taken, not cut into.
        assert_eq!(
            h.try_take(t0 + MS, t0 + 3 * MS, t0 + 50 * MS, None),
            Take::Go
        );
        let free = lease_end + 1_000;
        assert_eq!(w.try_take(free, free + MS, due, urgent), Take::Go);
        assert_eq!(h.holder(), Some(1));
    }

    #[test]
    fn the_worker_processes_of_one_function_take_turns_with_each_other() {
        let b = board();
        // Two processes of the function seated at 2 (tags 7 and 8).
        let a = Seat::new(b, 2, 7, 0).unwrap();
        let w = Seat::new(b, 2, 8, 0).unwrap();
        let t0 = 1_000 * MS;
        assert_eq!(a.try_take(t0, t0 + 2 * MS, t0 + 50 * MS, None), Take::Go);
        // The sibling waits for the holder's lease like another function would.
        let t = t0 + 100;
        assert!(matches!(
            w.try_take(t, t + MS, t0 + 40 * MS, None),
            Take::WaitUntil(_)
        ));
        assert_eq!(
            b.members[2].key.load(SeqCst),
            t0 + 40 * MS,
            "in its seat's line"
        );
        // The holder's further launches keep its turn and leave the sibling's place in line.
        for dt in [200_000, 400_000, 600_000] {
            assert_eq!(
                a.try_take(t0 + dt, t0 + 2 * MS, t0 + 50 * MS, None),
                Take::Go
            );
        }
        assert_eq!(b.members[2].key.load(SeqCst), t0 + 40 * MS, "still in line");
        // Once the lease lapses the holder does not take it back over the sibling in line
        // (an earlier deadline), and the sibling takes it.
        let free = t0 + 2 * MS + TURN_GAP_NS + 1_000;
        assert!(matches!(
            a.try_take(free, free + MS, t0 + 50 * MS, None),
            Take::WaitUntil(_)
        ));
        assert_eq!(w.try_take(free, free + MS, t0 + 40 * MS, None), Take::Go);
        assert_eq!(a.holder(), Some(2));
        assert_eq!(turn_tag(b.turn.load(SeqCst)), 8);
        // A holder that keeps the GPU past TURN_MAX_NS yields to a waiting sibling too.
        let mut t = free;
        let mut passed = false;
        while t < free + TURN_MAX_NS + 10 * MS {
            t += MS;
            // The holder (tag 8) keeps launching; the other (tag 7) stands in line.
            let _ = a.try_take(t, t + MS, t0 + 30 * MS, None);
            if w.try_take(t, t + MS, t0 + 40 * MS, None) != Take::Go {
                passed = true;
                break;
            }
        }
        assert!(passed, "the turn passed to the waiting sibling");
        assert!(
            t <= free + TURN_MAX_NS + MS + TURN_GAP_NS + MS,
            "{}",
            t - free
        );
        // With the same key (one request's deadline on the function's page), the process that
        // waits goes first too: the holder, back at a lapsed turn, leaves it to the waiter.
        {
            let (p, q) = (
                Seat::new(b, 4, 1, 0).unwrap(),
                Seat::new(b, 4, 2, 0).unwrap(),
            );
            let k = t0 + 60 * MS;
            let t1 = t0 + 100 * MS;
            assert_eq!(p.try_take(t1, t1 + MS, k, None), Take::Go);
            assert!(matches!(
                q.try_take(t1 + 1_000, t1 + MS, k, None),
                Take::WaitUntil(_)
            ));
            let lapsed = t1 + MS + TURN_GAP_NS + 1_000;
            assert!(matches!(
                p.try_take(lapsed, lapsed + MS, k, None),
                Take::WaitUntil(_)
            ));
            assert_eq!(q.try_take(lapsed, lapsed + MS, k, None), Take::Go);
        }
    }

    #[test]
    fn a_holder_alone_keeps_its_turn_past_turn_max() {
        let b = board();
        let a = seat(b, 0);
        let t0 = 1_000 * MS;
        let mut t = t0;
        while t < t0 + 3 * TURN_MAX_NS {
            assert_eq!(a.try_take(t, t + MS, t, None), Take::Go);
            t += MS / 5;
        }
        let (h, until) = split_turn(b.turn.load(SeqCst));
        assert_eq!(h, Some(0));
        assert!(until * 1_000 > t, "still extended");
    }
}

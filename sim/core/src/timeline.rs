//! The per-device timeline: queued operations of every process, the time-sliced scheduler that
//! advances them to "now", and the blocking waits (stream, event, context synchronize) that return
//! at the simulated completion instants in real wall-clock time.

use crate::config::{NvmlProcessUtil, SchedMode};
use crate::layout::*;
use crate::node::{Node, SimError};
use std::sync::atomic::Ordering::{AcqRel, Acquire};

/// What an event looks like to `cuEventQuery`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventStatus {
    /// Never recorded: CUDA treats it as complete.
    NeverRecorded,
    /// Recorded, and the stream has not reached it yet.
    Pending,
    /// Completed at this CLOCK_MONOTONIC instant (ns).
    Done(u64),
}

pub(crate) fn init_sched(s: &mut Sched) {
    for (i, op) in s.ops.iter_mut().enumerate() {
        op.kind = OP_FREE;
        op.next = if i + 1 < OPS_PER_DEVICE {
            i as u32 + 1
        } else {
            NONE
        };
    }
    s.free_head = 0;
    s.running = NONE;
    s.rr_last = 0;
    s.sim_time_ns = crate::now_ns();
    s.next_sample_ns = s.sim_time_ns;
    s.initialized = 1;
}

fn alloc_op(s: &mut Sched) -> Option<u32> {
    let i = s.free_head;
    if i == NONE {
        return None;
    }
    s.free_head = s.ops[i as usize].next;
    Some(i)
}

fn free_op(s: &mut Sched, i: u32) {
    s.ops[i as usize].kind = OP_FREE;
    s.ops[i as usize].next = s.free_head;
    s.free_head = i;
}

fn dec_pending(s: &mut Sched, p: u32) {
    let c = &mut s.pending[p as usize];
    if *c > 0 {
        *c -= 1;
        if *c == 0 {
            s.procs_pending = s.procs_pending.saturating_sub(1);
        }
    }
}

fn inc_pending(s: &mut Sched, p: u32) {
    let c = &mut s.pending[p as usize];
    *c += 1;
    if *c == 1 {
        s.procs_pending += 1;
    }
}

/// Removes the head op of a stream and accounts it complete.
fn pop(s: &mut Sched, p: u32, local: u32) {
    let st = &mut s.streams[p as usize][local as usize];
    let i = st.head;
    if i == NONE {
        return;
    }
    st.head = s.ops[i as usize].next;
    if st.head == NONE {
        st.tail = NONE;
    }
    st.completed += 1;
    free_op(s, i);
    dec_pending(s, p);
}

/// Forgets everything a dead process had queued or owned on this device.
pub(crate) fn drop_process(s: &mut Sched, p: u32) {
    set_preempted(s, p, false);
    for local in 0..STREAMS_PER_PROC as u32 {
        let st = s.streams[p as usize][local as usize];
        if st.in_use == 0 {
            continue;
        }
        let mut i = st.head;
        while i != NONE {
            let next = s.ops[i as usize].next;
            free_op(s, i);
            i = next;
        }
        s.streams[p as usize][local as usize] = Stream {
            in_use: 0,
            priority: 0,
            head: NONE,
            tail: NONE,
            submitted: 0,
            completed: 0,
        };
    }
    if s.pending[p as usize] > 0 {
        s.pending[p as usize] = 0;
        s.procs_pending = s.procs_pending.saturating_sub(1);
    }
    for ev in s.events.iter_mut() {
        if ev.owner == p + 1 {
            ev.owner = 0;
            ev.state = EV_NEVER;
        }
    }
    if s.running == p {
        s.running = NONE;
    }
}

fn wait_resolved(s: &Sched, op: &Op) -> bool {
    let ev = &s.events[op.event as usize];
    ev.gen != op.gen || ev.state != EV_PENDING
}

/// The op the context of process `p` would run next: the head of its highest-priority runnable
/// stream (lower value = higher priority, as in CUDA), ties by submission order.
fn pick_op(s: &Sched, p: u32) -> Option<(u32, u32)> {
    if s.pending[p as usize] == 0 {
        return None;
    }
    let mut best: Option<(i32, u64, u32, u32)> = None;
    for (local, st) in s.streams[p as usize].iter().enumerate() {
        if st.in_use == 0 || st.head == NONE {
            continue;
        }
        let op = &s.ops[st.head as usize];
        if op.kind == OP_WAIT && !wait_resolved(s, op) {
            continue;
        }
        let key = (st.priority, op.seq);
        if best.is_none_or(|b| key < (b.0, b.1)) {
            best = Some((st.priority, op.seq, local as u32, st.head));
        }
    }
    best.map(|b| (b.2, b.3))
}

fn next_runnable(s: &Sched, after: u32) -> u32 {
    let n = MAX_PROCS as u32;
    for k in 1..=n {
        let p = (after.wrapping_add(k)) % n;
        if s.pending[p as usize] > 0 && pick_op(s, p).is_some() {
            return p;
        }
    }
    NONE
}

/// `held`: NVML's per-process figure counts the time a process waited for its timeslice with
/// work pending as well as its kernels' run time ([`crate::config::NvmlProcessUtil::Held`]).
fn take_snapshot(s: &mut Sched, procs: &[ProcSlot], d: usize, time_ns: u64, held: bool) {
    let i = s.snap_next as usize;
    let busy = s.busy_ns;
    let snap = &mut s.snaps[i];
    snap.time_ns = time_ns;
    snap.busy_ns = busy;
    for (k, p) in procs.iter().enumerate() {
        snap.pids[k] = p.pid.load(Acquire);
        let waited = if held {
            p.interference_ns[d].load(Acquire)
        } else {
            0
        };
        snap.proc_gpu_ns[k] = p.gpu_time_ns[d].load(Acquire) + waited;
    }
    s.snap_next = ((i + 1) % SNAPSHOTS) as u32;
    s.snap_count = (s.snap_count + 1).min(SNAPSHOTS as u32);
}

/// The last `n` snapshots, oldest first.
pub(crate) fn latest_snapshots(s: &Sched, n: usize) -> Vec<Snapshot> {
    let count = (s.snap_count as usize).min(n);
    (0..count)
        .map(|k| {
            let idx = (s.snap_next as usize + SNAPSHOTS - count + k) % SNAPSHOTS;
            s.snaps[idx]
        })
        .collect()
}

/// Records the utilization snapshots of every sample boundary at or before `t`.
fn snapshots_until(s: &mut Sched, procs: &[ProcSlot], d: usize, t: u64, period: u64, held: bool) {
    while s.next_sample_ns <= t {
        let at = s.next_sample_ns;
        take_snapshot(s, procs, d, at, held);
        s.next_sample_ns = at + period;
    }
}

/// Advances device `d`'s timeline to `now` under the node's scheduling mode, completes markers,
/// accounts GPU time, solo-equivalent work and interference, and records utilization snapshots at
/// sample boundaries.
fn advance(s: &mut Sched, procs: &[ProcSlot], d: usize, h: &Header, now: u64) {
    if now <= s.sim_time_ns {
        return;
    }
    let period = h.sample_period_ns.max(1);
    // After a long idle gap only the last SNAPSHOTS boundaries matter.
    let horizon_floor = now.saturating_sub(period * SNAPSHOTS as u64);
    if s.next_sample_ns < horizon_floor {
        s.next_sample_ns = horizon_floor;
    }
    match SchedMode::from_code(h.mode) {
        SchedMode::TimeSlice => advance_timeslice(s, procs, d, h, now, period),
        SchedMode::Mps => advance_mps(s, procs, d, h.mps_beta_permille, now, period),
    }
    s.sim_time_ns = now;
}

/// Charges `dt` of interference to every context except `running` that had runnable work while
/// `running` held the GPU (time slicing: their pending kernels waited because another context ran).
fn charge_waiters(s: &Sched, procs: &[ProcSlot], d: usize, running: u32, dt: u64) {
    if s.procs_pending <= 1 || dt == 0 {
        return;
    }
    let mut imposed = 0u64;
    for q in 0..MAX_PROCS as u32 {
        if q != running && s.pending[q as usize] > 0 && pick_op(s, q).is_some() {
            procs[q as usize].interference_ns[d].fetch_add(dt, AcqRel);
            imposed += dt;
        }
    }
    if imposed > 0 {
        procs[running as usize].imposed_ns[d].fetch_add(imposed, AcqRel);
    }
}

/// Whether process slot `p`'s next runnable op is a kernel: state to save if it loses the GPU
/// now. A marker or a resolved wait takes no time and leaves nothing running (a kernel that ended
/// at its slice's end, followed by its event record, is not preempted work).
fn kernel_next(s: &Sched, p: u32) -> bool {
    pick_op(s, p).is_some_and(|(_, opi)| !matches!(s.ops[opi as usize].kind, OP_MARKER | OP_WAIT))
}

/// Whether process slot `p` lost the GPU with work running and has not had it back.
fn is_preempted(s: &Sched, p: u32) -> bool {
    s.preempted[p as usize / 64] & (1 << (p % 64)) != 0
}

fn set_preempted(s: &mut Sched, p: u32, on: bool) {
    let (w, bit) = (p as usize / 64, 1u64 << (p % 64));
    if on {
        s.preempted[w] |= bit;
    } else {
        s.preempted[w] &= !bit;
    }
}

/// A context switch in progress for `dt`: every context with work waits, the incoming one too.
fn charge_switch(s: &Sched, procs: &[ProcSlot], d: usize, dt: u64) {
    for q in 0..MAX_PROCS as u32 {
        if s.pending[q as usize] > 0 && pick_op(s, q).is_some() {
            procs[q as usize].interference_ns[d].fetch_add(dt, AcqRel);
        }
    }
}

/// Time slicing: runs queued kernels context by context, one timeslice at a time.
fn advance_timeslice(
    s: &mut Sched,
    procs: &[ProcSlot],
    d: usize,
    h: &Header,
    now: u64,
    period: u64,
) {
    let mut t = s.sim_time_ns;
    let held = NvmlProcessUtil::from_code(h.nvml_process_util) == NvmlProcessUtil::Held;
    loop {
        snapshots_until(s, procs, d, t, period, held);
        let horizon = now.min(s.next_sample_ns);
        let mut cur = s.running;
        if cur != NONE {
            let mine = (s.pending[cur as usize] > 0) as u32;
            let others = s.procs_pending - mine;
            let expired = t >= s.slice_end_ns && others > 0;
            if expired || pick_op(s, cur).is_none() {
                cur = NONE;
            }
        }
        if cur == NONE {
            let outgoing = s.running;
            let from = if outgoing != NONE {
                outgoing
            } else {
                s.rr_last
            };
            cur = next_runnable(s, from);
            if cur == NONE {
                s.running = NONE;
                t = horizon;
                if t >= now {
                    break;
                }
                continue;
            }
            // Handing the GPU to another context costs the switch time (if the node has one)
            // when state must move: the outgoing context is preempted with work still running
            // (its state is saved), or the incoming one was preempted before (its state is
            // restored). A context that went idle is left without a save. Nothing runs
            // meanwhile and every context with work waits.
            if cur != outgoing && outgoing != NONE && kernel_next(s, outgoing) {
                set_preempted(s, outgoing, true);
            }
            let restoring = is_preempted(s, cur);
            set_preempted(s, cur, false);
            let preempting = outgoing != NONE && cur != outgoing && is_preempted(s, outgoing);
            if cur != s.rr_last && h.switch_ns > 0 && (preempting || restoring) {
                s.switch_left_ns = h.switch_ns.min(u64::from(u32::MAX)) as u32;
            }
            s.running = cur;
            s.rr_last = cur;
            s.slice_end_ns = t + u64::from(s.switch_left_ns) + h.timeslice_ns;
        }
        if s.switch_left_ns > 0 {
            let run_until = horizon.min(t + u64::from(s.switch_left_ns));
            let dt = run_until - t;
            s.switch_left_ns -= dt as u32;
            s.busy_ns += dt;
            charge_switch(s, procs, d, dt);
            t = run_until;
            if t >= now {
                break;
            }
            continue;
        }
        let Some((local, opi)) = pick_op(s, cur) else {
            continue;
        };
        let op = s.ops[opi as usize];
        match op.kind {
            OP_MARKER => {
                let ev = &mut s.events[op.event as usize];
                if ev.gen == op.gen && ev.state == EV_PENDING {
                    ev.state = EV_DONE;
                    ev.time_ns = t;
                }
                pop(s, cur, local);
            }
            OP_WAIT => pop(s, cur, local),
            _ => {
                let others = s.procs_pending - 1;
                let limit = if others > 0 {
                    s.slice_end_ns.max(t)
                } else {
                    u64::MAX
                };
                let run_until = horizon.min(t + op.remaining_ns).min(limit);
                let dt = run_until - t;
                s.ops[opi as usize].remaining_ns -= dt;
                s.busy_ns += dt;
                procs[cur as usize].gpu_time_ns[d].fetch_add(dt, AcqRel);
                procs[cur as usize].work_ns[d].fetch_add(dt, AcqRel);
                charge_waiters(s, procs, d, cur, dt);
                t = run_until;
                if s.ops[opi as usize].remaining_ns == 0 {
                    pop(s, cur, local);
                }
                if t >= now {
                    break;
                }
            }
        }
    }
}

/// A kernel at the head of a context, running concurrently with others under MPS.
#[derive(Clone, Copy)]
struct Running {
    proc_: u32,
    local: u32,
    op: u32,
}

/// Wall time a kernel with `remaining_ns` of solo work needs at slowdown `factor_permille`/1000.
fn mps_finish_ns(remaining_ns: u64, factor_permille: u64) -> u64 {
    let ns = (remaining_ns as u128 * factor_permille as u128).div_ceil(1000);
    ns.min(u64::MAX as u128) as u64
}

/// Solo-equivalent work done in `dt` of wall time at slowdown `factor_permille`/1000.
fn mps_progress_ns(dt: u64, factor_permille: u64) -> u64 {
    (dt as u128 * 1000 / factor_permille as u128) as u64
}

/// MPS: the head kernel of every context with work runs at once; with k of them running, each
/// progresses at 1/(1 + β·(k−1)) of its solo rate (docs/simgpu.md, "MPS mode"). Markers and
/// stream waits complete the instant their context reaches them, as in time slicing.
fn advance_mps(
    s: &mut Sched,
    procs: &[ProcSlot],
    d: usize,
    beta_permille: u32,
    now: u64,
    period: u64,
) {
    let mut t = s.sim_time_ns;
    let mut running = [Running {
        proc_: NONE,
        local: NONE,
        op: NONE,
    }; MAX_PROCS];
    s.running = NONE;
    loop {
        // Under MPS a process's figure is its kernels' running time, however slowed: the `held`
        // model describes time slicing only.
        snapshots_until(s, procs, d, t, period, false);
        let horizon = now.min(s.next_sample_ns);
        // Zero-time ops at the heads complete at t. A marker completing may resolve another
        // context's stream wait, so repeat until a pass completes nothing.
        let mut k;
        loop {
            let mut completed = false;
            k = 0;
            for p in 0..MAX_PROCS as u32 {
                if s.pending[p as usize] == 0 {
                    continue;
                }
                while let Some((local, opi)) = pick_op(s, p) {
                    let op = s.ops[opi as usize];
                    match op.kind {
                        OP_MARKER => {
                            let ev = &mut s.events[op.event as usize];
                            if ev.gen == op.gen && ev.state == EV_PENDING {
                                ev.state = EV_DONE;
                                ev.time_ns = t;
                            }
                            pop(s, p, local);
                            completed = true;
                        }
                        OP_WAIT => {
                            pop(s, p, local);
                            completed = true;
                        }
                        _ => {
                            running[k] = Running {
                                proc_: p,
                                local,
                                op: opi,
                            };
                            k += 1;
                            break;
                        }
                    }
                }
            }
            if !completed {
                break;
            }
        }
        if k == 0 {
            t = horizon;
            if t >= now {
                break;
            }
            continue;
        }
        let factor = 1000 + beta_permille as u64 * (k as u64 - 1);
        let mut dt = horizon - t;
        for r in &running[..k] {
            dt = dt.min(mps_finish_ns(s.ops[r.op as usize].remaining_ns, factor));
        }
        // Each kernel's extra time is imposed by the k − 1 it ran beside, in equal parts.
        let mut extra = [0u64; MAX_PROCS];
        for (i, r) in running[..k].iter().enumerate() {
            let op = &mut s.ops[r.op as usize];
            let done = mps_progress_ns(dt, factor).min(op.remaining_ns);
            op.remaining_ns -= done;
            let finished = op.remaining_ns == 0;
            let slot = &procs[r.proc_ as usize];
            slot.gpu_time_ns[d].fetch_add(dt, AcqRel);
            slot.work_ns[d].fetch_add(done, AcqRel);
            slot.interference_ns[d].fetch_add(dt - done, AcqRel);
            extra[i] = dt - done;
            if finished {
                pop(s, r.proc_, r.local);
            }
        }
        if k > 1 {
            let all: u64 = extra[..k].iter().sum();
            for (i, r) in running[..k].iter().enumerate() {
                let imposed = (all - extra[i]) / (k as u64 - 1);
                procs[r.proc_ as usize].imposed_ns[d].fetch_add(imposed, AcqRel);
            }
        }
        s.busy_ns += dt;
        t += dt;
        if t >= now {
            break;
        }
    }
}

/// Sum of the kernel time still queued in a stream up to and including op `until` (or all).
fn queued_ns(s: &Sched, p: u32, local: u32, until: Option<u32>) -> u64 {
    let mut i = s.streams[p as usize][local as usize].head;
    let mut sum = 0u64;
    while i != NONE {
        let op = &s.ops[i as usize];
        if op.kind == OP_KERNEL {
            sum += op.remaining_ns;
        }
        if Some(i) == until {
            break;
        }
        i = op.next;
    }
    sum
}

thread_local! {
    static PRECISE_TIMERS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Shortest sleep between re-checks while waiting, ns (avoids spinning on 2-core CI machines).
const MIN_WAIT_NS: u64 = 20_000;
/// How often a waiter looks for dead processes whose queued work could stall it, ns.
const REAP_EVERY_NS: u64 = 100_000_000;

impl Node {
    fn local_slot(&self) -> Result<u32, SimError> {
        if self.slot == NONE {
            Err(SimError::InvalidHandle)
        } else {
            Ok(self.slot)
        }
    }

    /// Locks device `d`, advances its timeline to `now`, and runs `f`.
    pub(crate) fn with_device<R>(
        &self,
        d: u32,
        now: u64,
        f: impl FnOnce(&mut Sched, &Header) -> R,
    ) -> R {
        let procs = &self.state.procs;
        let h = &self.state.header;
        self.with_device_raw(d, |s| {
            advance(s, procs, d as usize, h, now);
            f(s, h)
        })
    }

    /// Blocks until `check` (run with the device advanced to now) returns `Ok`. `Err(lb)` gives a
    /// lower bound on how long from now completion can take; the waiter sleeps that long (at
    /// least [`MIN_WAIT_NS`]) and checks again.
    fn wait_on<R>(&self, d: u32, mut check: impl FnMut(&Sched) -> Result<R, u64>) -> R {
        PRECISE_TIMERS.with(|c| {
            if !c.get() {
                // SAFETY: PR_SET_TIMERSLACK only changes this thread's timer slack (1 ns), so
                // the simulated completion instants are observed within a few µs.
                unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1u64, 0, 0, 0) };
                c.set(true);
            }
        });
        let mut last_reap = crate::now_ns();
        loop {
            let now = crate::now_ns();
            match self.with_device(d, now, |s, _| check(s)) {
                Ok(r) => return r,
                Err(lb) => {
                    if now - last_reap > REAP_EVERY_NS {
                        self.reap_dead();
                        last_reap = now;
                    }
                    crate::sleep_until(now + lb.max(MIN_WAIT_NS));
                }
            }
        }
    }

    /// Creates a stream on device `d` with a CUDA priority (lower = more urgent); returns its
    /// local index.
    pub fn stream_create(&self, d: u32, priority: i32) -> Result<u32, SimError> {
        let p = self.local_slot()?;
        self.dev(d)?;
        self.with_device(d, crate::now_ns(), |s, _| {
            for (local, st) in s.streams[p as usize].iter_mut().enumerate() {
                if st.in_use == 0 {
                    *st = Stream {
                        in_use: 1,
                        priority,
                        head: NONE,
                        tail: NONE,
                        submitted: 0,
                        completed: 0,
                    };
                    return Ok(local as u32);
                }
            }
            Err(SimError::OutOfResources)
        })
    }

    /// Destroys a stream once its queued work has run (CUDA lets destroy return at once and
    /// finishes the work; we wait, which is observably the same for the caller's later syncs).
    pub fn stream_destroy(&self, d: u32, local: u32) -> Result<(), SimError> {
        self.stream_sync(d, local)?;
        let p = self.local_slot()?;
        self.with_device(d, crate::now_ns(), |s, _| {
            s.streams[p as usize][local as usize].in_use = 0;
        });
        Ok(())
    }

    fn enqueue(
        &self,
        d: u32,
        local: u32,
        kind: u32,
        event: u32,
        gen: u64,
        dur_ns: u64,
    ) -> Result<(), SimError> {
        let p = self.local_slot()?;
        self.dev(d)?;
        if local as usize >= STREAMS_PER_PROC {
            return Err(SimError::InvalidHandle);
        }
        // Blocks while this process has a full push buffer or the device's op table is full.
        self.wait_on(d, |s| {
            let st = &s.streams[p as usize][local as usize];
            if st.in_use == 0 {
                return Ok(Err(SimError::InvalidHandle));
            }
            if s.pending[p as usize] >= MAX_INFLIGHT_PER_PROC || s.free_head == NONE {
                return Err(queued_ns(s, p, local, None).min(1_000_000));
            }
            Ok(Ok(()))
        })?;
        self.with_device(d, crate::now_ns(), |s, _| {
            if s.streams[p as usize][local as usize].in_use == 0 {
                return Err(SimError::InvalidHandle);
            }
            let Some(i) = alloc_op(s) else {
                return Err(SimError::OutOfResources);
            };
            let seq = s.seq;
            s.seq += 1;
            s.ops[i as usize] = Op {
                kind,
                next: NONE,
                proc_: p,
                stream: local,
                event,
                _pad: 0,
                gen,
                remaining_ns: dur_ns,
                seq,
            };
            let st = &mut s.streams[p as usize][local as usize];
            if st.tail == NONE {
                st.head = i;
            } else {
                let tail = st.tail;
                s.ops[tail as usize].next = i;
            }
            let st = &mut s.streams[p as usize][local as usize];
            st.tail = i;
            st.submitted += 1;
            inc_pending(s, p);
            Ok(())
        })
    }

    /// Queues a kernel of `dur_ns` on a stream.
    pub fn launch(&self, d: u32, local: u32, dur_ns: u64) -> Result<(), SimError> {
        self.enqueue(d, local, OP_KERNEL, 0, 0, dur_ns)
    }

    /// Blocks until everything queued on the stream so far has run.
    pub fn stream_sync(&self, d: u32, local: u32) -> Result<(), SimError> {
        let p = self.local_slot()?;
        self.dev(d)?;
        let target = self.with_device(d, crate::now_ns(), |s, _| {
            s.streams[p as usize][local as usize].submitted
        });
        self.wait_on(d, |s| {
            let st = &s.streams[p as usize][local as usize];
            if st.in_use == 0 || st.completed >= target {
                Ok(())
            } else {
                Err(queued_ns(s, p, local, None))
            }
        });
        Ok(())
    }

    /// Whether the stream has no queued work left (`cuStreamQuery`).
    pub fn stream_idle(&self, d: u32, local: u32) -> Result<bool, SimError> {
        let p = self.local_slot()?;
        self.dev(d)?;
        Ok(self.with_device(d, crate::now_ns(), |s, _| {
            s.streams[p as usize][local as usize].head == NONE
        }))
    }

    /// Blocks until everything this process queued on device `d` has run (`cuCtxSynchronize`).
    pub fn device_sync(&self, d: u32) -> Result<(), SimError> {
        let p = self.local_slot()?;
        self.dev(d)?;
        let targets: Vec<u64> = self.with_device(d, crate::now_ns(), |s, _| {
            s.streams[p as usize]
                .iter()
                .map(|st| st.submitted)
                .collect()
        });
        self.wait_on(d, |s| {
            let mut lb = 0;
            let mut done = true;
            for (local, st) in s.streams[p as usize].iter().enumerate() {
                if st.in_use != 0 && st.completed < targets[local] {
                    done = false;
                    lb += queued_ns(s, p, local as u32, None);
                }
            }
            if done {
                Ok(())
            } else {
                Err(lb)
            }
        });
        Ok(())
    }

    /// Allocates an event slot on device `d`.
    pub fn event_create(&self, d: u32) -> Result<u32, SimError> {
        let p = self.local_slot()?;
        self.dev(d)?;
        self.with_device(d, crate::now_ns(), |s, _| {
            for (i, ev) in s.events.iter_mut().enumerate() {
                if ev.owner == 0 {
                    *ev = Event {
                        owner: p + 1,
                        state: EV_NEVER,
                        gen: ev.gen,
                        time_ns: 0,
                        stream: NONE,
                        _pad: 0,
                    };
                    return Ok(i as u32);
                }
            }
            Err(SimError::OutOfResources)
        })
    }

    /// Frees event slot `ev` on device `d`; a marker of it still queued completes nothing.
    pub fn event_destroy(&self, d: u32, ev: u32) -> Result<(), SimError> {
        let p = self.local_slot()?;
        self.dev(d)?;
        self.with_device(d, crate::now_ns(), |s, _| {
            let e = s
                .events
                .get_mut(ev as usize)
                .ok_or(SimError::InvalidHandle)?;
            if e.owner != p + 1 {
                return Err(SimError::InvalidHandle);
            }
            // Bump the generation so a queued marker of this event completes nothing.
            e.gen += 1;
            e.owner = 0;
            e.state = EV_NEVER;
            Ok(())
        })
    }

    /// Records an event on a stream: it completes when the context reaches it.
    pub fn event_record(&self, d: u32, ev: u32, local: u32) -> Result<(), SimError> {
        let p = self.local_slot()?;
        self.dev(d)?;
        let gen = self.with_device(d, crate::now_ns(), |s, _| {
            let e = s
                .events
                .get_mut(ev as usize)
                .ok_or(SimError::InvalidHandle)?;
            if e.owner != p + 1 {
                return Err(SimError::InvalidHandle);
            }
            e.gen += 1;
            e.state = EV_PENDING;
            e.stream = p * STREAMS_PER_PROC as u32 + local;
            Ok(e.gen)
        })?;
        self.enqueue(d, local, OP_MARKER, ev, gen, 0)
    }

    /// Where event `ev` on device `d` stands, as `cuEventQuery` sees it.
    pub fn event_status(&self, d: u32, ev: u32) -> Result<EventStatus, SimError> {
        self.dev(d)?;
        self.with_device(d, crate::now_ns(), |s, _| {
            let e = s.events.get(ev as usize).ok_or(SimError::InvalidHandle)?;
            Ok(match e.state {
                EV_NEVER => EventStatus::NeverRecorded,
                EV_PENDING => EventStatus::Pending,
                _ => EventStatus::Done(e.time_ns),
            })
        })
    }

    /// Blocks until the event completes; returns its status afterwards.
    pub fn event_sync(&self, d: u32, ev: u32) -> Result<EventStatus, SimError> {
        self.dev(d)?;
        if ev as usize >= EVENTS_PER_DEVICE {
            return Err(SimError::InvalidHandle);
        }
        let st = self.wait_on(d, |s| {
            let e = &s.events[ev as usize];
            match e.state {
                EV_NEVER => Ok(EventStatus::NeverRecorded),
                EV_DONE => Ok(EventStatus::Done(e.time_ns)),
                _ => {
                    let (p, local) = (
                        e.stream / STREAMS_PER_PROC as u32,
                        e.stream % STREAMS_PER_PROC as u32,
                    );
                    // Find the marker to bound the wait by the kernels queued ahead of it.
                    let mut i = s.streams[p as usize][local as usize].head;
                    let mut marker = None;
                    while i != NONE {
                        let op = &s.ops[i as usize];
                        if op.kind == OP_MARKER && op.event == ev && op.gen == e.gen {
                            marker = Some(i);
                            break;
                        }
                        i = op.next;
                    }
                    Err(queued_ns(s, p, local, marker))
                }
            }
        });
        Ok(st)
    }

    /// Makes future work on a stream wait for an event of the same device (`cuStreamWaitEvent`).
    pub fn stream_wait_event(&self, d: u32, local: u32, ev: u32) -> Result<(), SimError> {
        self.dev(d)?;
        let pending = self.with_device(d, crate::now_ns(), |s, _| {
            s.events
                .get(ev as usize)
                .map(|e| (e.state == EV_PENDING).then_some(e.gen))
                .ok_or(SimError::InvalidHandle)
        })?;
        match pending {
            Some(gen) => self.enqueue(d, local, OP_WAIT, ev, gen, 0),
            None => Ok(()),
        }
    }

    /// Ground truth for a study, never for smore itself: when the kernels process `pid` has
    /// queued on device `d` will all have run if its context kept the GPU — now plus their
    /// remaining run time — or `None` when it has nothing queued there or holds no slot on the
    /// node. `smore demo --phase-oracle` gives it to the simulated functions so they can wait
    /// out the training job's busy phase: a reference for what holding buys when the trainer's
    /// phase is known (docs/harvest.md, "What perfect phase knowledge buys"). The real driver
    /// has nothing like it.
    pub fn truth_busy_until(&self, d: u32, pid: u32) -> Option<u64> {
        self.dev(d).ok()?;
        let slot = self
            .state
            .procs
            .iter()
            .position(|p| p.pid.load(Acquire) != 0 && self.local_pid(p) == Some(pid))?;
        let now = crate::now_ns();
        self.with_device(d, now, |s, _| {
            if s.pending[slot] == 0 {
                return None;
            }
            let queued: u64 = (0..STREAMS_PER_PROC as u32)
                .filter(|&l| s.streams[slot][l as usize].in_use != 0)
                .map(|l| queued_ns(s, slot as u32, l, None))
                .sum();
            (queued > 0).then_some(now + queued)
        })
    }

    /// Ops this process has queued on device `d` (tests and the in-flight bound).
    pub fn queued_ops(&self, d: u32) -> u32 {
        if self.slot == NONE {
            return 0;
        }
        self.with_device(d, crate::now_ns(), |s, _| s.pending[self.slot as usize])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{NvmlProcessUtil, SchedMode, SimConfig};

    /// A node in a temp file with two process slots: this process and its parent (both alive,
    /// so neither is reaped), each driving the timeline as its own context.
    fn two_contexts(cfg: &SimConfig) -> (Node, Node, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!(
            "smore-sim-unit-{}-{}",
            std::process::id(),
            crate::now_ns()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("node.state");
        let a = Node::open(path.to_str().unwrap(), cfg).unwrap();
        // SAFETY: getppid has no preconditions.
        let ppid = unsafe { libc::getppid() } as u32;
        let b_slot = crate::node::claim_slot_for_test(a.state, ppid);
        let b = Node::with(a.state, b_slot, ppid);
        (a, b, dir)
    }

    fn elapsed_ms(n: &Node, e0: u32, e1: u32) -> f64 {
        match (
            n.event_status(0, e0).unwrap(),
            n.event_status(0, e1).unwrap(),
        ) {
            (EventStatus::Done(t0), EventStatus::Done(t1)) => (t1 - t0) as f64 / 1e6,
            other => panic!("events not done: {other:?}"),
        }
    }

    /// A 5 ms kernel on a stream of `n` followed by an event: work queued behind [`gated`] waits
    /// for it, so kernels of several contexts start at the same simulated instant however late
    /// the test thread gets to queue them.
    fn gate(n: &Node) -> u32 {
        let st = n.stream_create(0, 0).unwrap();
        let g = n.event_create(0).unwrap();
        n.launch(0, st, 5_000_000).unwrap();
        n.event_record(0, g, st).unwrap();
        g
    }

    /// Queues `wait(gate), event, kernel(ms), event` on a fresh stream of `n`; returns the stream
    /// and the events.
    fn timed_kernel(n: &Node, gate: u32, ms: u64) -> (u32, u32, u32) {
        let st = n.stream_create(0, 0).unwrap();
        let (e0, e1) = (n.event_create(0).unwrap(), n.event_create(0).unwrap());
        n.stream_wait_event(0, st, gate).unwrap();
        n.event_record(0, e0, st).unwrap();
        n.launch(0, st, ms * 1_000_000).unwrap();
        n.event_record(0, e1, st).unwrap();
        (st, e0, e1)
    }

    #[test]
    fn the_ground_truth_says_when_a_process_queued_work_will_have_run() {
        let (a, b, dir) = two_contexts(&SimConfig::default());
        // SAFETY: getppid has no preconditions.
        let ppid = unsafe { libc::getppid() } as u32;
        assert_eq!(a.truth_busy_until(0, ppid), None, "nothing queued yet");
        let st = b.stream_create(0, 0).unwrap();
        let t0 = crate::now_ns();
        // Long kernels: the question below must come while they run, however late this thread
        // gets the CPU on a loaded machine.
        b.launch(0, st, 200_000_000).unwrap();
        b.launch(0, st, 200_000_000).unwrap();
        let until = a.truth_busy_until(0, ppid).expect("B has 400 ms queued");
        let after = crate::now_ns();
        // B's kernels started when queued, on an otherwise idle GPU: they end 400 ms after that,
        // however late this thread asks.
        assert!(
            (t0 + 400_000_000..=after + 400_000_000).contains(&until),
            "{} ms after the launch",
            (until - t0) as f64 / 1e6
        );
        assert_eq!(a.truth_busy_until(1, ppid), None, "no such device");
        assert_eq!(a.truth_busy_until(0, u32::MAX), None, "no such process");
        b.stream_sync(0, st).unwrap();
        assert_eq!(a.truth_busy_until(0, ppid), None, "all of it has run");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn mps_two_concurrent_kernels_each_run_at_the_modelled_rate() {
        let cfg = SimConfig {
            mode: SchedMode::Mps,
            mps_beta_permille: 500,
            ..SimConfig::default()
        };
        let (a, b, dir) = two_contexts(&cfg);
        assert_eq!(a.mode(), SchedMode::Mps);
        let g = gate(&a);
        let (sa, a0, a1) = timed_kernel(&a, g, 40);
        let (sb, b0, b1) = timed_kernel(&b, g, 40);
        a.stream_sync(0, sa).unwrap();
        b.stream_sync(0, sb).unwrap();
        let returned = crate::now_ns();
        // Both ran concurrently at 1/(1 + 0.5) of solo: 40 ms of work each take 60 ms.
        for (n, e0, e1) in [(&a, a0, a1), (&b, b0, b1)] {
            let ms = elapsed_ms(n, e0, e1);
            assert!((59.0..61.5).contains(&ms), "event pair measured {ms} ms");
            // Synchronization never returns before the simulated completion.
            let EventStatus::Done(end) = n.event_status(0, e1).unwrap() else {
                panic!("end event pending after sync");
            };
            assert!(end <= returned, "sync returned before the kernel ended");
        }
        // A also ran the 5 ms gate, alone.
        for (n, work_ms) in [(&a, 45), (&b, 40)] {
            let t = n.truth_of(0, n.pid).unwrap();
            assert!(
                (t.work_ns as i64 - work_ms * 1_000_000).abs() < 10_000,
                "{t:?}"
            );
            let extra = t.interference_ns as f64 / 1e6;
            assert!(
                (19.0..21.5).contains(&extra),
                "interference {extra} ms: {t:?}"
            );
            assert_eq!(t.gpu_active_ns, t.work_ns + t.interference_ns);
        }
        // The device was busy once for the overlap, not twice (plus the 5 ms gate).
        let busy = a.busy_ns(0) as f64 / 1e6;
        assert!((64.0..66.5).contains(&busy), "busy {busy} ms");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn mps_kernel_speeds_up_when_its_neighbour_finishes() {
        let cfg = SimConfig {
            mode: SchedMode::Mps,
            mps_beta_permille: 1000,
            ..SimConfig::default()
        };
        let (a, b, dir) = two_contexts(&cfg);
        // A: 40 ms of work; B: 10 ms. Together (β = 1) each runs at 1/2: B ends at 20 ms having
        // let A do 10 ms; A's remaining 30 ms run alone: A ends at 50 ms.
        let g = gate(&a);
        let (sa, a0, a1) = timed_kernel(&a, g, 40);
        let (sb, b0, b1) = timed_kernel(&b, g, 10);
        a.stream_sync(0, sa).unwrap();
        b.stream_sync(0, sb).unwrap();
        let (ma, mb) = (elapsed_ms(&a, a0, a1), elapsed_ms(&b, b0, b1));
        assert!((49.0..51.5).contains(&ma), "A took {ma} ms");
        assert!((19.5..21.0).contains(&mb), "B took {mb} ms");
        let (ta, tb) = (a.truth_of(0, a.pid).unwrap(), b.truth_of(0, b.pid).unwrap());
        assert!(
            (ta.interference_ns as f64 / 1e6 - 10.0).abs() < 1.0,
            "{ta:?}"
        );
        assert!(
            (tb.interference_ns as f64 / 1e6 - 10.0).abs() < 1.0,
            "{tb:?}"
        );
        // Beside one other kernel, a kernel's extra time is all its neighbour's doing.
        assert_eq!(ta.imposed_ns, tb.interference_ns, "{ta:?} {tb:?}");
        assert_eq!(tb.imposed_ns, ta.interference_ns, "{ta:?} {tb:?}");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn the_held_nvml_model_counts_the_wait_for_a_timeslice_and_the_running_model_does_not() {
        for (model, lo_ms, hi_ms) in [
            (NvmlProcessUtil::Running, 19.0, 26.0),
            (NvmlProcessUtil::Held, 36.0, 46.0),
        ] {
            let cfg = SimConfig {
                nvml_process_util: model,
                ..SimConfig::default()
            };
            let (a, b, dir) = two_contexts(&cfg);
            assert_eq!(a.nvml_process_util(), model);
            // Two 20 ms kernels time-sliced at 2 ms (A also runs the 5 ms gate): each waits
            // ~20 ms for the other's slices. NVML's figure of each, in the first snapshot after
            // both finished: its run time (running), or run time + wait (held: the two sum to
            // ~twice the device's busy time, as measured on a time-sliced H200).
            let g = gate(&a);
            let (sa, _, _) = timed_kernel(&a, g, 20);
            let (sb, _, _) = timed_kernel(&b, g, 20);
            a.stream_sync(0, sa).unwrap();
            b.stream_sync(0, sb).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(200));
            let snap = a.with_device(0, crate::now_ns(), |s, _| latest_snapshots(s, 1)[0]);
            for (n, extra_ms) in [(&a, 5.0), (&b, 0.0)] {
                let ms = snap.proc_gpu_ns[n.slot as usize] as f64 / 1e6 - extra_ms;
                assert!(
                    (lo_ms..hi_ms).contains(&ms),
                    "{model}: NVML figure {ms} ms outside {lo_ms}..{hi_ms}"
                );
            }
            let _ = std::fs::remove_dir_all(dir);
        }
    }

    #[test]
    fn a_context_switch_cost_delays_both_contexts_and_is_charged_as_interference() {
        let cfg = SimConfig {
            switch_ns: 250_000,
            ..SimConfig::default()
        };
        let (a, b, dir) = two_contexts(&cfg);
        // Two 20 ms kernels time-sliced at 2 ms with a 250 µs switch: ~20 switches add ~5 ms to
        // the 40 ms both take without (timeslice_waiting_is_charged_as_interference).
        let g = gate(&a);
        let (sa, a0, a1) = timed_kernel(&a, g, 20);
        let (sb, _, _) = timed_kernel(&b, g, 20);
        a.stream_sync(0, sa).unwrap();
        b.stream_sync(0, sb).unwrap();
        let ma = elapsed_ms(&a, a0, a1);
        assert!((42.0..48.0).contains(&ma), "A took {ma} ms");
        for n in [&a, &b] {
            let t = n.truth_of(0, n.pid).unwrap();
            let waited = t.interference_ns as f64 / 1e6;
            assert!((20.0..28.0).contains(&waited), "waited {waited} ms: {t:?}");
            assert_eq!(t.gpu_active_ns, t.work_ns, "a switch is nobody's run time");
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_switch_costs_only_when_running_work_is_preempted_or_restored() {
        let cfg = SimConfig {
            switch_ns: 250_000,
            ..SimConfig::default()
        };
        let (a, b, dir) = two_contexts(&cfg);
        // A runs a kernel and goes idle; then B runs one: nothing to save or restore, so B
        // waits for nothing.
        let sa = a.stream_create(0, 0).unwrap();
        a.launch(0, sa, 1_000_000).unwrap();
        a.stream_sync(0, sa).unwrap();
        let sb = b.stream_create(0, 0).unwrap();
        b.launch(0, sb, 1_000_000).unwrap();
        b.stream_sync(0, sb).unwrap();
        assert_eq!(b.truth_of(0, b.pid).unwrap().interference_ns, 0);
        assert_eq!(a.truth_of(0, a.pid).unwrap().interference_ns, 0);
        // B's 20 ms kernel and A's 1 ms one behind the same gate: A, which holds the GPU, runs
        // its kernel first (B waits 1 ms); its slice then ends with only its event record left,
        // which is no running work: the handover to B is free. The record still needs the GPU:
        // B is preempted for it (a switch) and restored after it (another). B waits 1 ms and two
        // switches; charging A's trailing record as preempted work made it three.
        let g = gate(&a);
        let (sb, _, _) = timed_kernel(&b, g, 20);
        let (sa, _, _) = timed_kernel(&a, g, 1);
        a.stream_sync(0, sa).unwrap();
        b.stream_sync(0, sb).unwrap();
        let waited = b.truth_of(0, b.pid).unwrap().interference_ns as f64 / 1e6;
        assert!((1.45..1.55).contains(&waited), "B waited {waited} ms");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn timeslice_waiting_is_charged_as_interference() {
        let cfg = SimConfig::default();
        let (a, b, dir) = two_contexts(&cfg);
        assert_eq!(a.mode(), SchedMode::TimeSlice);
        // Two 20 ms kernels time-sliced at 2 ms: each waits while the other runs. Both finish at
        // about 40 ms, each having waited about 20 ms (the last slice ends alone).
        let g = gate(&a);
        let (sa, a0, a1) = timed_kernel(&a, g, 20);
        let (sb, _, _) = timed_kernel(&b, g, 20);
        a.stream_sync(0, sa).unwrap();
        b.stream_sync(0, sb).unwrap();
        // The event pair measures wall time between the markers, which includes the slices B held.
        let ma = elapsed_ms(&a, a0, a1);
        assert!((37.0..41.0).contains(&ma), "A took {ma} ms");
        for (n, work_ms) in [(&a, 25), (&b, 20)] {
            let t = n.truth_of(0, n.pid).unwrap();
            assert!(
                (t.work_ns as i64 - work_ms * 1_000_000).abs() < 10_000,
                "{t:?}"
            );
            assert_eq!(
                t.gpu_active_ns, t.work_ns,
                "time slicing runs at full speed"
            );
            let waited = t.interference_ns as f64 / 1e6;
            assert!((16.0..20.5).contains(&waited), "waited {waited} ms: {t:?}");
        }
        // What each imposed is what the other waited: the only other context with work.
        let (ta, tb) = (a.truth_of(0, a.pid).unwrap(), b.truth_of(0, b.pid).unwrap());
        assert_eq!(ta.imposed_ns, tb.interference_ns, "{ta:?} {tb:?}");
        assert_eq!(tb.imposed_ns, ta.interference_ns, "{ta:?} {tb:?}");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_lone_process_suffers_no_interference_in_either_mode() {
        for mode in [SchedMode::TimeSlice, SchedMode::Mps] {
            let cfg = SimConfig {
                mode,
                ..SimConfig::default()
            };
            let (a, _b, dir) = two_contexts(&cfg);
            let g = gate(&a);
            let (sa, e0, e1) = timed_kernel(&a, g, 10);
            a.stream_sync(0, sa).unwrap();
            let ms = elapsed_ms(&a, e0, e1);
            assert!((9.9..10.5).contains(&ms), "{mode}: {ms} ms");
            let t = a.truth_of(0, a.pid).unwrap();
            assert_eq!(t.interference_ns, 0, "{mode}: {t:?}");
            assert_eq!(t.work_ns, 15_000_000, "{mode}: gate + kernel: {t:?}");
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

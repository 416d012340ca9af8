//! Taking memory back from functions when training grows (docs/arbiter.md, "Memory headroom and
//! reclaim").
//!
//! Owns: the reclaim line test, how much to take back, and the order — (1) lower the caps of
//! live functions to what they hold, largest unused part first; (2) unload idle instances;
//! (3) preempt running ones — both (2) and (3) largest cap first, then the most recently
//! registered (the fewest instances to stop for the memory needed, and the least warm ones).
//! [`plan`] is pure over [`Candidate`]s; `State::reclaim` applies it. Must never: preempt while
//! lowering caps covers the need, count an instance already preempted as memory still to take,
//! or take more than the plan's need.

use super::events::EventKind;
use super::persist::Preemption;
use super::{InstanceId, State};
use smore_protocol::size::format_size;
use smore_protocol::wire::PreemptReason;

/// One function instance of the GPU as the plan sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// The instance.
    pub id: InstanceId,
    /// Its cap, bytes.
    pub cap: u64,
    /// What it holds (NVML or its shim's report, the larger), bytes.
    pub held: u64,
    /// No request admitted or reported for `idle_after_s`.
    pub idle: bool,
    /// When it registered, seconds since the epoch.
    pub registered_at: f64,
}

/// One step of a reclaim.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Lower the instance's cap to `to` bytes.
    Lower {
        /// The instance.
        id: InstanceId,
        /// The new cap, bytes.
        to: u64,
    },
    /// Preempt the instance (reason [`PreemptReason::Unload`] for idle ones).
    Preempt {
        /// The instance.
        id: InstanceId,
        /// Why.
        reason: PreemptReason,
    },
}

/// The GPU's memory as the reclaim rule sees it, bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ledger {
    /// Capacity.
    pub total: u64,
    /// Training's current NVML memory.
    pub training_now: u64,
    /// Training's high-water mark.
    pub training_peak: u64,
    /// The headroom kept above it (0 without training).
    pub headroom: u64,
    /// Σ caps of live (not preempted) instances.
    pub caps: u64,
    /// Σ caps of preempted instances whose processes have not exited yet (memory on its way
    /// back).
    pub leaving: u64,
}

impl Ledger {
    /// Whether training's memory and its next step (the headroom) plus every cap crossed the
    /// reclaim line (`line` × capacity). Counting the headroom is what keeps training's next
    /// allocation below capacity: after any sample under the line, training may still take a
    /// step of up to its headroom before the functions could be in its way.
    pub fn crossed(&self, line: f64) -> bool {
        let line = (self.total as f64 * line) as u64;
        self.training_now + self.headroom + self.caps + self.leaving > line
    }

    /// Bytes to take from live instances so that their caps and training's reservation (peak +
    /// headroom) fit under σ again (memory already leaving counts as taken).
    pub fn need(&self, sigma: f64) -> u64 {
        let budget = (self.total as f64 * sigma) as u64;
        (self.caps + self.training_peak.max(self.training_now) + self.headroom)
            .saturating_sub(budget)
    }
}

/// The steps that take `need` bytes back from `live` (instances not already preempted), in the
/// documented order; empty when `need` is 0. Takes all it can when `need` exceeds everything.
pub fn plan(need: u64, live: &[Candidate]) -> Vec<Step> {
    let mut steps = Vec::new();
    let mut need = need;
    if need == 0 {
        return steps;
    }
    // (1) Unused cap, largest first: nothing stops, the functions only cannot grow.
    let mut by_slack: Vec<&Candidate> = live.iter().filter(|c| c.cap > c.held).collect();
    by_slack.sort_by(|a, b| {
        (b.cap - b.held)
            .cmp(&(a.cap - a.held))
            .then(a.id.cmp(&b.id))
    });
    let mut lowered = std::collections::BTreeMap::new();
    for c in by_slack {
        if need == 0 {
            break;
        }
        let take = (c.cap - c.held).min(need);
        need -= take;
        lowered.insert(c.id, c.cap - take);
        steps.push(Step::Lower {
            id: c.id,
            to: c.cap - take,
        });
    }
    // (2) idle, then (3) running: largest (remaining) cap first, then the newest.
    for idle in [true, false] {
        let mut group: Vec<(u64, &Candidate)> = live
            .iter()
            .filter(|c| c.idle == idle)
            .map(|c| (lowered.get(&c.id).copied().unwrap_or(c.cap), c))
            .filter(|(cap, _)| *cap > 0)
            .collect();
        group.sort_by(|(ca, a), (cb, b)| {
            cb.cmp(ca)
                .then(b.registered_at.total_cmp(&a.registered_at))
                .then(a.id.cmp(&b.id))
        });
        for (cap, c) in group {
            if need == 0 {
                return steps;
            }
            need = need.saturating_sub(cap);
            steps.push(Step::Preempt {
                id: c.id,
                reason: if idle {
                    PreemptReason::Unload
                } else {
                    PreemptReason::TrainingMemory
                },
            });
        }
    }
    steps
}

impl State {
    /// One reclaim check of `gpu` after its NVML sample (every reconcile round): when training
    /// memory + every cap crossed the reclaim line, takes back what [`Ledger::need`] says, in
    /// [`plan`]'s order.
    pub(super) fn reclaim(&mut self, gpu: u32, now: f64) {
        let Some(g) = self.gpus.iter().find(|g| g.info.index == gpu) else {
            return;
        };
        let on = || self.instances.values().filter(move |i| i.rec.gpu == gpu);
        let reserved = self.training_reserved(g);
        let ledger = Ledger {
            total: g.info.total,
            training_now: g.training_used,
            training_peak: g.memory.peak(),
            headroom: reserved.saturating_sub(g.memory.peak()),
            caps: on()
                .filter(|i| i.rec.preempt.is_none())
                .map(|i| i.rec.cap)
                .sum(),
            leaving: on()
                .filter(|i| i.rec.preempt.is_some())
                .map(|i| i.rec.cap)
                .sum(),
        };
        if !ledger.crossed(self.cfg.reclaim_line) {
            return;
        }
        let need = ledger.need(self.cfg.memory_safety);
        let idle_after = self.cfg.idle_after_s;
        let live: Vec<Candidate> = on()
            .filter(|i| i.rec.preempt.is_none())
            .map(|i| Candidate {
                id: i.rec.id,
                cap: i.rec.cap,
                held: i.held().min(i.rec.cap),
                idle: now - i.last_active >= idle_after,
                registered_at: i.registered_at,
            })
            .collect();
        let steps = plan(need, &live);
        if steps.is_empty() {
            return;
        }
        let why = format!(
            "training on GPU {gpu} uses {} (high-water mark {}, headroom {}) and function caps {} (+{} leaving) crossed the reclaim line {}",
            format_size(ledger.training_now),
            format_size(ledger.training_peak),
            format_size(ledger.headroom),
            format_size(ledger.caps),
            format_size(ledger.leaving),
            format_size((ledger.total as f64 * self.cfg.reclaim_line) as u64),
        );
        let (mut lowered, mut bytes, mut stopped) = (0u64, 0u64, 0u64);
        for step in &steps {
            match *step {
                Step::Lower { id, to } => {
                    if let Some(i) = self.instances.get_mut(&id) {
                        bytes += i.rec.cap - to;
                        lowered += 1;
                        let from = i.rec.cap;
                        i.rec.cap = to;
                        i.write_page();
                        self.event(
                            EventKind::Memory,
                            Some(id),
                            None,
                            format!(
                                "cap lowered {} → {} (what it holds) for training",
                                format_size(from),
                                format_size(to)
                            ),
                        );
                    }
                }
                Step::Preempt { id, reason } => {
                    stopped += 1;
                    self.preempt(id, reason, now, &why);
                }
            }
        }
        self.counters.reclaims += 1;
        self.counters.caps_lowered += lowered;
        self.counters.bytes_lowered += bytes;
        if let Some(g) = self.gpus.iter_mut().find(|g| g.info.index == gpu) {
            g.memory.reclaimed(now);
        }
        self.dirty = true;
        tracing::warn!(
            "reclaim on GPU {gpu}: {why}; needed {}: {lowered} cap(s) lowered by {}, {stopped} instance(s) preempted",
            format_size(need),
            format_size(bytes)
        );
        self.event(
            EventKind::Reclaim,
            None,
            None,
            format!(
                "{why}: needed {}; {lowered} cap(s) lowered by {}, {stopped} instance(s) unloaded or preempted; admission held until training is stable for {} s",
                format_size(need),
                format_size(bytes),
                self.cfg.reclaim_hold_s
            ),
        );
    }

    /// Preempts instance `id`: its page cap becomes 0 at once (the shim refuses every new
    /// allocation), its requests are refused with `Reply::Preempted`, and after the grace period
    /// its processes are killed (`reconcile`). What it holds stays counted until they exit.
    fn preempt(&mut self, id: InstanceId, reason: PreemptReason, now: f64, why: &str) {
        let grace = self.cfg.preempt_grace_ms;
        let Some(i) = self.instances.get_mut(&id) else {
            return;
        };
        let message = match reason {
            PreemptReason::Unload => format!(
                "instance {id} of function {} unloaded: idle and {why}",
                i.rec.function
            ),
            PreemptReason::TrainingMemory => format!(
                "instance {id} of function {} preempted: {why}",
                i.rec.function
            ),
        };
        i.rec.cap = i.held().min(i.rec.cap);
        i.rec.preempt = Some(Preemption {
            reason,
            message: message.clone(),
            at: now,
            deadline: now + grace as f64 / 1e3,
            enforced: false,
        });
        i.write_page();
        let pid = i.rec.pid;
        match reason {
            PreemptReason::Unload => self.counters.unloaded += 1,
            PreemptReason::TrainingMemory => self.counters.preempted += 1,
        }
        self.dirty = true;
        tracing::warn!("{message}; grace {grace} ms");
        self.event(
            EventKind::Preempted,
            Some(id),
            Some(pid),
            format!("{message}; it must exit within {grace} ms"),
        );
    }

    /// The preemption of instance `id`, if it is preempted: (reason, message, ms left before
    /// the arbiter enforces).
    pub fn preemption(&self, id: InstanceId) -> Option<(PreemptReason, String, u64)> {
        let p = self.instances.get(&id)?.rec.preempt.as_ref()?;
        let left = ((p.deadline - self.clock.now()) * 1e3).max(0.0) as u64;
        Some((p.reason, p.message.clone(), left))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn c(id: u64, cap: u64, held: u64, idle: bool, at: f64) -> Candidate {
        Candidate {
            id,
            cap,
            held,
            idle,
            registered_at: at,
        }
    }

    #[test]
    fn the_line_counts_leaving_memory_and_the_need_restores_headroom() {
        let l = Ledger {
            total: 10 * GIB,
            training_now: 4 * GIB,
            training_peak: 4 * GIB,
            headroom: 2 * GIB,
            caps: 5 * GIB,
            leaving: GIB,
        };
        assert!(l.crossed(0.97), "4 + 2 + 5 + 1 GiB > 9.7 GiB");
        // σ·10 = 9.5 GiB; caps 5 + reserved 6 = 11: 1.5 GiB to take from live instances.
        assert_eq!(l.need(0.95), 11 * GIB - ((10 * GIB) as f64 * 0.95) as u64);
        let calm = Ledger {
            caps: 2 * GIB,
            leaving: 0,
            ..l
        };
        let edge = Ledger {
            caps: 3 * GIB + GIB / 2,
            leaving: 0,
            ..l
        };
        assert!(
            !edge.crossed(0.97),
            "4 + 2 + 3.5 = 9.5 GiB: admitted up to σ, not crossed"
        );
        assert!(!calm.crossed(0.97));
        assert_eq!(calm.need(0.95), 0);
    }

    #[test]
    fn unused_cap_is_taken_before_anyone_is_stopped() {
        let live = [
            c(1, 4 * GIB, GIB, false, 0.0),
            c(2, 2 * GIB, GIB, true, 0.0),
        ];
        assert_eq!(
            plan(2 * GIB, &live),
            vec![Step::Lower { id: 1, to: 2 * GIB }],
            "3 GiB unused on instance 1 cover 2 GiB: only lowered, by what is needed"
        );
        assert_eq!(plan(0, &live), vec![]);
    }

    #[test]
    fn idle_instances_go_before_running_ones_largest_then_newest_first() {
        let live = [
            c(1, 2 * GIB, 2 * GIB, false, 1.0),
            c(2, 3 * GIB, 3 * GIB, false, 2.0),
            c(3, 3 * GIB, 3 * GIB, false, 3.0),
            c(4, GIB, GIB, true, 0.0),
        ];
        let steps = plan(5 * GIB, &live);
        assert_eq!(
            steps,
            vec![
                Step::Preempt {
                    id: 4,
                    reason: PreemptReason::Unload
                },
                Step::Preempt {
                    id: 3,
                    reason: PreemptReason::TrainingMemory
                },
                Step::Preempt {
                    id: 2,
                    reason: PreemptReason::TrainingMemory
                },
            ],
            "idle first; then 3 GiB before 2 GiB, the newer of equal caps first; stop once covered"
        );
    }

    #[test]
    fn a_lowered_cap_is_what_its_preemption_frees() {
        // Lowering 1 → 1 GiB frees 1 GiB; 2 GiB more are needed: preempting 1 frees only its
        // remaining 1 GiB, so 2 goes too.
        let live = [c(1, 2 * GIB, GIB, false, 5.0), c(2, GIB, GIB, false, 1.0)];
        let steps = plan(3 * GIB, &live);
        assert_eq!(steps.len(), 3, "{steps:?}");
        assert_eq!(steps[0], Step::Lower { id: 1, to: GIB });
    }
}

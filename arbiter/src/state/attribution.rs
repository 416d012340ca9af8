//! Attribution: which GPU process belongs to which function instance. A process is an
//! instance's when it is the registered process or a descendant of it (a runtime's worker);
//! every other GPU process is training's.
//!
//! Owns: [`attribute`], the one rule that splits an NVML sample between instances and training.
//! Must never: attribute a process to an instance without a process fact backing it.

use super::facts::ProcFacts;
use super::training::TrainingProc;
use crate::gpus::GpuSample;
use std::collections::BTreeMap;

/// What an instance's processes use on one GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    /// NVML memory, bytes.
    pub used: u64,
    /// SM utilization, percent (sum over the processes).
    pub sm: u32,
    /// The processes.
    pub pids: Vec<u32>,
}

/// One GPU's sample, split.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Attribution {
    /// Per instance id.
    pub instances: BTreeMap<u64, Usage>,
    /// Processes no instance owns, by pid.
    pub training: Vec<TrainingProc>,
}

/// Splits `sample` between the `owners` (instance id, registered pid) and training.
pub fn attribute(sample: &GpuSample, owners: &[(u64, u32)], facts: &dyn ProcFacts) -> Attribution {
    let mut out = Attribution::default();
    for (&pid, &used) in &sample.procs {
        let owner = owners
            .iter()
            .find(|&&(_, root)| root == pid || facts.is_descendant_of(pid, root))
            .map(|&(id, _)| id);
        let util = sample.proc_util.get(&pid).copied();
        match owner {
            Some(id) => {
                let e = out.instances.entry(id).or_default();
                e.used += used;
                e.sm += util.unwrap_or(0);
                e.pids.push(pid);
            }
            None => out.training.push(TrainingProc {
                pid,
                used,
                sm_util: util,
            }),
        }
    }
    out.training.sort_by_key(|t| t.pid);
    for u in out.instances.values_mut() {
        u.pids.sort_unstable();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::facts::fake::FakeProcs;
    use super::*;

    #[test]
    fn descendants_are_their_functions_and_strangers_are_training() {
        let procs = FakeProcs::default();
        procs.spawn(100, 1, 10, true); // the function
        procs.spawn(101, 100, 11, true); // its worker
        procs.spawn(102, 101, 12, true); // the worker's child
        procs.spawn(200, 1, 13, false); // a trainer
        let mut s = GpuSample::default();
        for (pid, mem, util) in [(101, 1 << 20, 5), (102, 2 << 20, 7), (200, 1 << 30, 60)] {
            s.procs.insert(pid, mem);
            s.proc_util.insert(pid, util);
        }
        let a = attribute(&s, &[(1, 100)], &procs);
        assert_eq!(
            a.instances[&1],
            Usage {
                used: 3 << 20,
                sm: 12,
                pids: vec![101, 102]
            }
        );
        assert_eq!(a.training.len(), 1);
        assert_eq!(a.training[0].pid, 200);
        // The worker's parent link gone (it exited mid-sample): not attributable, training.
        procs.exit(101);
        let a = attribute(&s, &[(1, 100)], &procs);
        assert_eq!(
            a.training.iter().map(|t| t.pid).collect::<Vec<_>>(),
            [101, 102, 200]
        );
    }
}

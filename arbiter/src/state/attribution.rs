//! Attribution: which GPU process belongs to which function instance. A process is an
//! instance's when it is the registered process or a descendant of it (a runtime's worker);
//! every other GPU process is training's.
//!
//! Owns: [`Attributor`], the one rule that splits an NVML sample between instances and
//! training, and the memory that keeps its cost proportional to what changed: each GPU process
//! is resolved once when it first appears (one parent walk, stopping at a known instance root
//! or an already-attributed ancestor), tracked by a pidfd ([`Tracked`]) so a recycled pid is
//! never taken for the old process, and forgotten when it exits. The shim check reads
//! `/proc/<pid>/maps` once per process.
//!
//! Must never: attribute a process to an instance without a process fact backing it, or keep
//! a cached answer for a process that exited.

use super::facts::{ProcFacts, Tracked, MAX_ANCESTRY_DEPTH};
use super::training::TrainingProc;
use super::InstanceId;
use crate::gpus::GpuSample;
use std::collections::{BTreeMap, HashMap};

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
    pub instances: BTreeMap<InstanceId, Usage>,
    /// Processes no instance owns, by pid.
    pub training: Vec<TrainingProc>,
    /// Processes of functions that released their grant but still use the GPU: (pid, the
    /// released instance).
    pub released: Vec<(u32, InstanceId)>,
    /// MPS servers on the GPU: (pid, memory in bytes). Neither training nor a function's; their
    /// memory is held beside training's, so that no process's memory is in no figure.
    pub mps_servers: Vec<(u32, u64)>,
}

/// Whose a GPU process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// A function instance's (its registered process or a descendant).
    Instance(InstanceId),
    /// A function that released its grant (`op=release`) and lives on: still watched.
    Released(InstanceId),
    /// Nobody registered it: training.
    Training,
    /// Nobody registered it, and it is an MPS server: the process through which MPS clients'
    /// kernels run, not a job of its own. NVML lists it among a GPU's compute processes (on an
    /// NVIDIA H200, driver 580.159.04, with 69 MB), and taken for training it turned harvest on
    /// over a GPU with no trainer (docs/real-gpu.md, section 11). Only a process no function
    /// owns is asked: a function's process named so stays the function's.
    MpsServer,
}

/// A GPU process seen before.
#[derive(Debug)]
struct Known {
    life: Tracked,
    owner: Owner,
    /// Whether the shim is mapped (read once; None until asked or when unreadable).
    shim: Option<bool>,
}

/// The functions' registered processes this round: pid → owner (an instance, or a function
/// that released its grant).
pub type Roots = HashMap<u32, Owner>;

/// Attribution with memory (see the module docs).
#[derive(Debug, Default)]
pub struct Attributor {
    known: HashMap<u32, Known>,
    /// Fork events of functions' descendants (None: parent chain and session only).
    lineage: Option<std::sync::Arc<crate::lineage::Lineage>>,
}

impl Attributor {
    /// Attribution that also asks `lineage` (fork events) before walking parents.
    pub fn with_lineage(lineage: std::sync::Arc<crate::lineage::Lineage>) -> Attributor {
        Attributor {
            known: HashMap::new(),
            lineage: Some(lineage),
        }
    }

    /// Forgets every process that exited (one liveness check each: a `poll(2)` on its pidfd).
    pub fn prune(&mut self, facts: &dyn ProcFacts) {
        self.known.retain(|_, k| k.life.alive(facts));
    }

    /// An instance was released: its processes are resolved again if they stay on a GPU.
    pub fn forget_instance(&mut self, id: InstanceId) {
        self.known.retain(|_, k| k.owner != Owner::Instance(id));
    }

    /// An instance registered: processes taken for training may be its (a process NVML saw
    /// before it registered), and a released function may have registered again: both are
    /// resolved again.
    pub fn forget_training(&mut self) {
        self.known
            .retain(|_, k| matches!(k.owner, Owner::Instance(_)));
    }

    /// The GPU processes attributed to instance `id`: (pid, start).
    pub fn processes_of(&self, id: InstanceId) -> Vec<(u32, u64)> {
        self.known
            .values()
            .filter(|k| k.owner == Owner::Instance(id))
            .map(|k| (k.life.pid, k.life.start))
            .collect()
    }

    /// GPU processes remembered.
    pub fn len(&self) -> usize {
        self.known.len()
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.known.is_empty()
    }

    /// Whose `pid` is: cached, or resolved now by one bounded parent walk. None when the
    /// process cannot be read (it vanished): not cached, training for this sample.
    pub fn owner(&mut self, pid: u32, roots: &Roots, facts: &dyn ProcFacts) -> Option<Owner> {
        if let Some(k) = self.known.get(&pid) {
            return Some(k.owner);
        }
        let start = facts.start_time(pid)?;
        let owner = self.resolve(pid, start, roots, facts);
        self.known.insert(
            pid,
            Known {
                life: Tracked::new(pid, start, facts),
                owner,
                shim: None,
            },
        );
        Some(owner)
    }

    /// Whose the process `pid` (which had `start`) is, without caching the answer (fork
    /// records, then the parent walk, then the session).
    pub fn resolve(&self, pid: u32, start: u64, roots: &Roots, facts: &dyn ProcFacts) -> Owner {
        if let Some(&o) = roots.get(&pid) {
            return o;
        }
        if let Some(o) = self
            .lineage
            .as_ref()
            .and_then(|l| l.root_of(pid, start))
            .and_then(|root| roots.get(&root).copied())
        {
            return o;
        }
        let mut p = pid;
        for _ in 0..MAX_ANCESTRY_DEPTH {
            if let Some(&o) = roots.get(&p) {
                return o;
            }
            if p != pid {
                if let Some(k) = self
                    .known
                    .get(&p)
                    .filter(|k| matches!(k.owner, Owner::Instance(_) | Owner::Released(_)))
                {
                    return k.owner;
                }
            }
            match facts.parent(p) {
                Some(pp) if pp != 0 && pp != p => p = pp,
                _ => break,
            }
        }
        // Left the parent chain (re-parented) but not the session a function leads.
        match facts.session(pid).and_then(|sid| roots.get(&sid)) {
            Some(&o) => o,
            None if facts.is_mps_server(pid) == Some(true) => Owner::MpsServer,
            None => Owner::Training,
        }
    }

    /// Whether the shim is mapped into `pid` (read once per process; None: cannot tell).
    pub fn shim_mapped(&mut self, pid: u32, facts: &dyn ProcFacts) -> Option<bool> {
        match self.known.get_mut(&pid) {
            Some(k) => {
                if k.shim.is_none() {
                    k.shim = facts.shim_mapped(pid);
                }
                k.shim
            }
            None => facts.shim_mapped(pid),
        }
    }

    /// Splits `sample` between the instances (`roots`) and training.
    pub fn split(
        &mut self,
        sample: &GpuSample,
        roots: &Roots,
        facts: &dyn ProcFacts,
    ) -> Attribution {
        let mut out = Attribution::default();
        for (&pid, &used) in &sample.procs {
            let util = sample.proc_util.get(&pid).copied();
            match self.owner(pid, roots, facts) {
                Some(Owner::Instance(id)) => {
                    let e = out.instances.entry(id).or_default();
                    e.used += used;
                    e.sm += util.unwrap_or(0);
                    e.pids.push(pid);
                }
                Some(Owner::Released(id)) => out.released.push((pid, id)),
                Some(Owner::MpsServer) => out.mps_servers.push((pid, used)),
                Some(Owner::Training) | None => out.training.push(TrainingProc {
                    pid,
                    used,
                    sm_util: util,
                }),
            }
        }
        out.training.sort_by_key(|t| t.pid);
        out.released.sort_unstable();
        out.mps_servers.sort_unstable();
        for u in out.instances.values_mut() {
            u.pids.sort_unstable();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::super::facts::fake::FakeProcs;
    use super::*;

    fn sample(procs: &[(u32, u64, u32)]) -> GpuSample {
        let mut s = GpuSample::default();
        for &(pid, mem, util) in procs {
            s.procs.insert(pid, mem);
            s.proc_util.insert(pid, util);
        }
        s
    }

    #[test]
    fn an_mps_server_is_neither_training_nor_a_function_and_a_functions_process_named_so_stays_its()
    {
        let procs = FakeProcs::default();
        procs.spawn(100, 1, 10, true); // the function
        procs.spawn(101, 100, 11, true); // its worker, named like an MPS server
        procs.mark_mps_server(101);
        procs.spawn(300, 1, 12, false); // the MPS server
        procs.mark_mps_server(300);
        procs.spawn(200, 1, 13, false); // a trainer
        let s = sample(&[(101, 1 << 20, 5), (200, 1 << 30, 60), (300, 69 << 20, 0)]);
        let roots = Roots::from([(100, Owner::Instance(1))]);
        let mut at = Attributor::default();
        let a = at.split(&s, &roots, &procs);
        assert_eq!(a.mps_servers, vec![(300, 69 << 20)]);
        assert_eq!(a.training.len(), 1);
        assert_eq!(a.training[0].pid, 200);
        assert_eq!(
            a.instances[&1].pids,
            vec![101],
            "the function's, whatever its name"
        );
        // Known afterwards: the next sample reads nothing again.
        let before = procs.reads();
        assert_eq!(at.split(&s, &roots, &procs), a);
        assert_eq!(procs.reads(), before);
    }

    #[test]
    fn descendants_are_their_functions_and_strangers_are_training() {
        let procs = FakeProcs::default();
        procs.spawn(100, 1, 10, true); // the function
        procs.spawn(101, 100, 11, true); // its worker
        procs.spawn(102, 101, 12, true); // the worker's child
        procs.spawn(200, 1, 13, false); // a trainer
        let s = sample(&[(101, 1 << 20, 5), (102, 2 << 20, 7), (200, 1 << 30, 60)]);
        let roots = Roots::from([(100, Owner::Instance(1))]);
        let mut at = Attributor::default();
        let a = at.split(&s, &roots, &procs);
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
    }

    #[test]
    fn a_descendant_started_later_is_attributed_and_known_processes_cost_no_reads() {
        let procs = FakeProcs::default();
        procs.spawn(100, 1, 10, true);
        procs.spawn(200, 1, 13, false);
        let roots = Roots::from([(100, Owner::Instance(7))]);
        let mut at = Attributor::default();
        let s = sample(&[(100, 1 << 20, 5), (200, 1 << 30, 60)]);
        at.split(&s, &roots, &procs);
        // Steady state: the same processes cost no /proc read at all.
        let before = procs.reads();
        for _ in 0..100 {
            at.prune(&procs);
            at.split(&s, &roots, &procs);
        }
        assert_eq!(procs.reads(), before);
        // A grandchild started after the function registered: attributed to it.
        procs.spawn(150, 100, 20, true);
        procs.spawn(151, 150, 21, true);
        let s = sample(&[(100, 1 << 20, 5), (151, 4 << 20, 9), (200, 1 << 30, 60)]);
        let a = at.split(&s, &roots, &procs);
        assert_eq!(a.instances[&7].pids, vec![100, 151]);
    }

    #[test]
    fn a_recycled_pid_is_not_its_old_owners_and_exited_processes_are_forgotten() {
        let procs = FakeProcs::default();
        procs.spawn(100, 1, 10, true);
        procs.spawn(101, 100, 11, true);
        let roots = Roots::from([(100, Owner::Instance(7))]);
        let mut at = Attributor::default();
        let a = at.split(&sample(&[(101, 1 << 20, 5)]), &roots, &procs);
        assert_eq!(a.instances[&7].pids, vec![101]);
        // The worker exits; an unrelated process gets its pid.
        procs.exit(101);
        at.prune(&procs);
        assert!(at.is_empty(), "an exited process is forgotten");
        procs.spawn(101, 1, 99, false);
        let a = at.split(&sample(&[(101, 1 << 30, 60)]), &roots, &procs);
        assert!(a.instances.is_empty());
        assert_eq!(a.training[0].pid, 101);
    }

    #[test]
    fn the_shim_check_reads_maps_once_per_process() {
        let procs = FakeProcs::default();
        procs.spawn(100, 1, 10, false);
        let roots = Roots::from([(100, Owner::Instance(7))]);
        let mut at = Attributor::default();
        at.split(&sample(&[(100, 1, 1)]), &roots, &procs);
        assert_eq!(at.shim_mapped(100, &procs), Some(false));
        let before = procs.reads();
        for _ in 0..10 {
            assert_eq!(at.shim_mapped(100, &procs), Some(false));
        }
        assert_eq!(procs.reads(), before);
    }

    #[test]
    fn a_double_forked_child_is_its_functions_by_fork_record_or_session() {
        let procs = FakeProcs::default();
        procs.spawn(100, 1, 10, true); // the function
        procs.spawn(101, 100, 11, true); // its child, which forks and exits
        procs.spawn(102, 101, 12, true); // the grandchild
        let roots = Roots::from([(100, Owner::Instance(7))]);
        // The grandchild is re-parented to init and left the function's session (setsid).
        procs.exit(101);
        procs.reparent(102, 1, Some(102));
        let s = sample(&[(102, 4 << 30, 50)]);
        // Without fork records: training (what the parent chain and the session can see).
        let a = Attributor::default().split(&s, &roots, &procs);
        assert_eq!(a.training.len(), 1);
        // With the fork events recorded while the child lived: the function's.
        let lineage = std::sync::Arc::new(crate::lineage::Lineage::without_connector("test"));
        lineage.add_root(100, 10);
        lineage.on_fork(100, 101, || Some(11));
        lineage.on_fork(101, 102, || Some(12));
        lineage.on_exit(101);
        let a = Attributor::with_lineage(lineage.clone()).split(&s, &roots, &procs);
        assert_eq!(a.instances[&7].pids, vec![102]);
        assert!(a.training.is_empty());
        // A process that kept the session the function leads is its function's without records.
        procs.spawn(103, 1, 13, true);
        procs.reparent(103, 1, Some(100));
        let a = Attributor::default().split(&sample(&[(103, 1, 1)]), &roots, &procs);
        assert_eq!(a.instances[&7].pids, vec![103]);
        // A session nobody registered leads is no evidence.
        procs.spawn(104, 1, 14, true);
        procs.reparent(104, 1, Some(55));
        let a = Attributor::default().split(&sample(&[(104, 1, 1)]), &roots, &procs);
        assert_eq!(a.training.len(), 1);
    }
}

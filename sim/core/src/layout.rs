//! Layout of the node state file. Every process maps the same bytes, so everything here is
//! `repr(C)`, fixed-size, and valid when zero-filled (a fresh sparse file) except the mutexes,
//! which the creator initialises before publishing the magic number.

use crate::lock::SharedMutex;
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU32, AtomicU64};

/// "SMORESIM" — set last by the creator; a reader that does not see it waits for initialisation.
pub const MAGIC: u64 = 0x534d_4f52_4553_494d;
/// Bumped whenever this layout changes, so a stale state file is refused instead of misread.
pub const LAYOUT_VERSION: u32 = 7;

/// Devices per simulated node (a DGX has 8).
pub const MAX_DEVICES: usize = 8;
/// Processes that may hold a context on the node at once.
pub const MAX_PROCS: usize = 128;
/// Streams per process per device. PyTorch creates at most 32 + 32 pool streams per device plus
/// the default and per-thread streams, so 128 leaves room.
pub const STREAMS_PER_PROC: usize = 128;
/// Queued operations per device across all processes.
pub const OPS_PER_DEVICE: usize = 16384;
/// Events per device across all processes.
pub const EVENTS_PER_DEVICE: usize = 16384;
/// Queued operations one process may have per device before launches block. Reasoning: the real
/// driver's push buffer holds on the order of a thousand launches before `cuLaunchKernel` blocks.
pub const MAX_INFLIGHT_PER_PROC: u32 = 1024;
/// Utilization snapshots kept per device (64 × 1/6 s ≈ 10 s of history, NVML keeps a few seconds).
pub const SNAPSHOTS: usize = 64;

pub const NONE: u32 = u32::MAX;

#[repr(C)]
pub struct Header {
    pub magic: AtomicU64,
    pub version: u32,
    pub device_count: u32,
    pub timeslice_ns: u64,
    pub default_kernel_ns: u64,
    pub context_bytes: u64,
    pub sample_period_ns: u64,
    pub driver_version: u32,
    /// [`crate::config::SchedMode`] code: 0 time slicing, 1 MPS.
    pub mode: u32,
    /// MPS interference coefficient β, thousandths.
    pub mps_beta_permille: u32,
    /// [`crate::config::NvmlProcessUtil`] code: 0 running, 1 held.
    pub nvml_process_util: u32,
    /// Time a time-sliced device spends switching from one context to another, ns (0: free).
    pub switch_ns: u64,
    /// CLOCK_REALTIME − CLOCK_MONOTONIC at creation, ns: turns timeline instants into the
    /// Unix-epoch timestamps NVML reports, the same way in every process (a per-call offset would
    /// jitter and make a sample's timestamp differ between two queries).
    pub realtime_offset_ns: u64,
}

/// One process of the node. `pid == 0` means free. Memory counters are atomics because
/// allocations do not take the device lock.
#[repr(C)]
pub struct ProcSlot {
    pub pid: AtomicU32,
    /// Bit d set: the process has a context on device d (NVML lists it as a compute process).
    pub ctx_mask: AtomicU32,
    /// Process start time (clock ticks since boot, /proc/<pid>/stat field 22): detects pid reuse.
    pub start_time: AtomicU64,
    /// Inode of the process's pid namespace (`/proc/<pid>/ns/pid`; 0 = unknown): `pid` is the
    /// pid in that namespace, translated by each observer into its own (crate::pidns).
    pub pidns: AtomicU64,
    pub mem_used: [AtomicU64; MAX_DEVICES],
    /// Cumulative time this process's kernels were running on the device (SM activity, what NVML's
    /// per-process utilization reports under the default `running` model), per device (written
    /// under the device lock). In MPS mode a kernel that runs slowed beside others still counts
    /// all the time it was running.
    pub gpu_time_ns: [AtomicU64; MAX_DEVICES],
    /// Solo-equivalent kernel time completed: how long the work done would have taken alone.
    pub work_ns: [AtomicU64; MAX_DEVICES],
    /// Ground truth for tests (never shown through NVML): wall time this process had runnable
    /// work on the device minus the solo-equivalent work it got done then — time its pending
    /// kernels waited while other contexts held the GPU (time slicing), or the extra time its
    /// kernels took because others ran concurrently (MPS).
    pub interference_ns: [AtomicU64; MAX_DEVICES],
    /// Ground truth for tests (never shown through NVML): the interference this process's
    /// kernels imposed on the others — time slicing: for each instant it held the GPU, the
    /// number of other contexts that waited with work then; MPS: each other running kernel's
    /// extra time, split evenly among the kernels it ran beside. Summed over a device's
    /// processes it equals their summed `interference_ns`, less what context switches cost.
    pub imposed_ns: [AtomicU64; MAX_DEVICES],
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct Stream {
    pub in_use: u32,
    pub priority: i32,
    pub head: u32,
    pub tail: u32,
    pub submitted: u64,
    pub completed: u64,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct Event {
    /// Owning process slot + 1; 0 = free.
    pub owner: u32,
    /// 0 = never recorded, 1 = recorded and pending, 2 = complete.
    pub state: u32,
    /// Incremented on each record, so a superseded record's marker does not complete it.
    pub gen: u64,
    pub time_ns: u64,
    /// Global stream id (process slot × STREAMS_PER_PROC + local) of the pending record.
    pub stream: u32,
    pub _pad: u32,
}

pub const EV_NEVER: u32 = 0;
pub const EV_PENDING: u32 = 1;
pub const EV_DONE: u32 = 2;

pub const OP_FREE: u32 = 0;
pub const OP_KERNEL: u32 = 1;
pub const OP_MARKER: u32 = 2;
pub const OP_WAIT: u32 = 3;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct Op {
    pub kind: u32,
    pub next: u32,
    pub proc_: u32,
    pub stream: u32,
    pub event: u32,
    pub _pad: u32,
    pub gen: u64,
    pub remaining_ns: u64,
    pub seq: u64,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct Snapshot {
    pub time_ns: u64,
    pub busy_ns: u64,
    pub proc_gpu_ns: [u64; MAX_PROCS],
    pub pids: [u32; MAX_PROCS],
}

/// Scheduler state of one device; only touched with the device lock held.
#[repr(C)]
pub struct Sched {
    pub initialized: u32,
    /// Process slot whose context holds the GPU, or NONE.
    pub running: u32,
    /// Process slot that ran last (round-robin position).
    pub rr_last: u32,
    /// What is left of the context switch in progress, ns (time slicing with a switch cost).
    pub switch_left_ns: u32,
    pub sim_time_ns: u64,
    pub slice_end_ns: u64,
    pub busy_ns: u64,
    pub seq: u64,
    pub free_head: u32,
    /// Number of processes with at least one queued op.
    pub procs_pending: u32,
    pub pending: [u32; MAX_PROCS],
    /// Bit p set ⇔ process slot p lost the GPU with work running (it was preempted), so giving
    /// it the GPU back restores its state: with a switch cost, a switch (docs/simgpu.md,
    /// "Context switches").
    pub preempted: [u64; MAX_PROCS / 64],
    pub next_sample_ns: u64,
    pub snap_next: u32,
    pub snap_count: u32,
    pub last_reap_ns: u64,
    pub snaps: [Snapshot; SNAPSHOTS],
    pub streams: [[Stream; STREAMS_PER_PROC]; MAX_PROCS],
    pub events: [Event; EVENTS_PER_DEVICE],
    pub ops: [Op; OPS_PER_DEVICE],
}

#[repr(C)]
pub struct Device {
    pub total_mem: u64,
    pub sm_count: u32,
    pub _pad: u32,
    pub name: [u8; 96],
    pub uuid: [u8; 16],
    pub used_mem: AtomicU64,
    pub lock: SharedMutex,
    pub sched: UnsafeCell<Sched>,
}

#[repr(C)]
pub struct NodeState {
    pub header: Header,
    pub procs: [ProcSlot; MAX_PROCS],
    pub devices: [Device; MAX_DEVICES],
}

// SAFETY: every field shared between threads is an atomic, or `sched`, which is only accessed
// with the device's process-shared mutex held (see `Node::with_device`).
unsafe impl Sync for NodeState {}

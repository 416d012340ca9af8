//! Process-local driver state: the mapped node, contexts, handle objects and allocation tables.
//! Handles given to applications are pointers to leaked boxes carrying a magic number, so a stale
//! or foreign handle is refused with an error code instead of being trusted.

use cudarc::driver::sys::cudaError_enum as E;
use smore_simgpu::{MemError, Node, SimError, MAX_DEVICES};
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::*};
use std::sync::{Mutex, MutexGuard};

pub type R = E;

pub const CTX_MAGIC: u64 = 0x5358_4354_5800_0001;
pub const STREAM_MAGIC: u64 = 0x5358_5354_5200_0002;
pub const EVENT_MAGIC: u64 = 0x5358_4556_5400_0003;
pub const MODULE_MAGIC: u64 = 0x5358_4d4f_4400_0004;
pub const FUNC_MAGIC: u64 = 0x5358_4655_4e00_0005;
pub const GRAPH_MAGIC: u64 = 0x5358_4752_4100_0006;
pub const EXEC_MAGIC: u64 = 0x5358_4558_4500_0007;
pub const POOL_MAGIC: u64 = 0x5358_504f_4f00_0008;

#[repr(C)]
pub struct Ctx {
    pub magic: AtomicU64,
    pub dev: u32,
    pub default_stream: u32,
    pub primary: bool,
    pub flags: AtomicU32,
}

#[repr(C)]
pub struct StreamObj {
    pub magic: AtomicU64,
    pub dev: u32,
    pub local: u32,
    pub flags: u32,
    pub priority: i32,
    pub ctx: *mut Ctx,
    pub capturing: AtomicBool,
    pub captured: Mutex<Vec<u64>>,
}

#[repr(C)]
pub struct EventObj {
    pub magic: AtomicU64,
    pub dev: u32,
    pub idx: u32,
    pub flags: u32,
}

#[repr(C)]
pub struct Module {
    pub magic: AtomicU64,
    /// Kernel durations from a `smore-sim-module` image; empty for an unknown image.
    pub kernels: HashMap<String, u64>,
    pub functions: Mutex<HashMap<String, usize>>,
}

#[repr(C)]
pub struct Function {
    pub magic: AtomicU64,
    pub dur_ns: u64,
    /// `smore_sim_spin`: duration from the first kernel parameter.
    pub spin: bool,
}

#[repr(C)]
pub struct Graph {
    pub magic: AtomicU64,
    pub kernels: Vec<u64>,
    /// Memory-allocation nodes: (node device, bytes).
    pub allocs: Mutex<Vec<(u32, u64)>>,
}

#[repr(C)]
pub struct GraphExec {
    pub magic: AtomicU64,
    pub total_ns: u64,
    pub kernels: usize,
    /// The graph's memory-allocation nodes: backed with device memory at the first launch
    /// (charged once, `backed`) and given back when the executable graph is destroyed.
    pub allocs: Vec<(u32, u64)>,
    pub backed: AtomicBool,
}

#[repr(C)]
pub struct Pool {
    pub magic: AtomicU64,
    pub dev: u32,
    pub release_threshold: AtomicU64,
    pub used: AtomicU64,
    pub reserved: AtomicU64,
    pub used_high: AtomicU64,
    pub reserved_high: AtomicU64,
}

#[derive(Clone, Copy, Debug)]
pub enum AllocKind {
    Device,
    Managed { host: usize },
    Pool { pool: usize },
}

#[derive(Clone, Copy, Debug)]
pub struct Alloc {
    pub dev: u32,
    pub size: u64,
    pub kind: AllocKind,
}

/// A physical VMM allocation: freed (credited to the node) when `refs` — the creation plus every
/// `cuMemRetainAllocationHandle`, minus every `cuMemRelease` — and `maps` are both zero, as the
/// real driver does (cuda.h, `cuMemRelease`: "freed when all outstanding mappings to the memory
/// are unmapped and when all outstanding references to the handle … are also released").
pub struct VmmHandle {
    pub dev: u32,
    pub size: u64,
    pub maps: u32,
    pub refs: u32,
}

#[derive(Default)]
pub struct Tables {
    pub allocs: HashMap<u64, Alloc>,
    pub vmm: HashMap<u64, VmmHandle>,
    pub next_vmm: u64,
    pub reservations: HashMap<u64, u64>,
    /// Mapped VA → (physical handle, size).
    pub mappings: HashMap<u64, (u64, u64)>,
    pub arrays: HashMap<usize, (u32, u64)>,
    /// Mipmapped arrays: handle → (device, bytes of every level).
    pub mipmaps: HashMap<usize, (u32, u64)>,
    pub primary: [usize; MAX_DEVICES],
    pub primary_refs: [u32; MAX_DEVICES],
    pub primary_flags: [u32; MAX_DEVICES],
    pub default_pools: [usize; MAX_DEVICES],
}

pub struct Driver {
    pub node: Node,
    pub tables: Mutex<Tables>,
    /// CUDA ordinal → node device index, from `CUDA_VISIBLE_DEVICES` (all devices when unset).
    pub visible: Vec<u32>,
}

/// Parses `CUDA_VISIBLE_DEVICES` the way the real driver does: a comma-separated list of indices
/// or (prefixes of) `GPU-<uuid>` strings; the list ends at the first entry that names no device
/// (or repeats one), so `"1,x,0"` makes only device 1 visible and `""` hides every device.
pub fn parse_visible(spec: Option<&str>, uuids: &[String]) -> Vec<u32> {
    let Some(spec) = spec else {
        return (0..uuids.len() as u32).collect();
    };
    let mut out: Vec<u32> = Vec::new();
    for entry in spec.split(',').map(str::trim) {
        let found = if let Ok(i) = entry.parse::<u32>() {
            ((i as usize) < uuids.len()).then_some(i)
        } else if entry.starts_with("GPU-") && entry.len() > 4 {
            let hits: Vec<u32> = (0..uuids.len() as u32)
                .filter(|&i| uuids[i as usize].starts_with(entry))
                .collect();
            (hits.len() == 1).then(|| hits[0])
        } else {
            None
        };
        match found {
            Some(i) if !out.contains(&i) => out.push(i),
            _ => break,
        }
    }
    out
}

struct Global {
    pid: u32,
    driver: &'static Driver,
}

static DRIVER: Mutex<Option<Global>> = Mutex::new(None);
static FAST_PTR: AtomicU64 = AtomicU64::new(0);
static FAST_PID: AtomicU32 = AtomicU32::new(0);

fn current_pid() -> u32 {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() as u32 }
}

/// `cuInit`: opens the node once per process (again in a forked child).
pub fn init() -> Result<&'static Driver, R> {
    let pid = current_pid();
    let mut g = DRIVER.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(gl) = g.as_ref() {
        if gl.pid == pid {
            return Ok(gl.driver);
        }
    }
    let node = Node::open_from_env().map_err(|e| {
        eprintln!("smore simulated libcuda: cuInit failed: {e}");
        match e {
            SimError::TooManyProcesses => E::CUDA_ERROR_OUT_OF_MEMORY,
            _ => E::CUDA_ERROR_NO_DEVICE,
        }
    })?;
    let uuids: Vec<String> = (0..node.device_count())
        .filter_map(|i| node.device_info(i).ok().map(|d| d.uuid_string()))
        .collect();
    let visible = parse_visible(
        std::env::var("CUDA_VISIBLE_DEVICES").ok().as_deref(),
        &uuids,
    );
    let driver: &'static Driver = Box::leak(Box::new(Driver {
        node,
        tables: Mutex::new(Tables::default()),
        visible,
    }));
    // Processes that died without exiting cleanly still hold memory until someone reaps them.
    driver.node.reap_dead();
    *g = Some(Global { pid, driver });
    // SAFETY: registering a plain extern "C" function with no captured state.
    unsafe { libc::atexit(release_at_exit) };
    FAST_PTR.store(driver as *const Driver as u64, Release);
    FAST_PID.store(pid, Release);
    Ok(driver)
}

extern "C" fn release_at_exit() {
    let _ = std::panic::catch_unwind(|| {
        if let Ok(d) = driver() {
            d.node.release_self();
        }
    });
}

/// The initialised driver of this process, or `CUDA_ERROR_NOT_INITIALIZED`.
pub fn driver() -> Result<&'static Driver, R> {
    let p = FAST_PTR.load(Acquire);
    if p != 0 && FAST_PID.load(Acquire) == current_pid() {
        // SAFETY: FAST_PTR only ever holds a leaked, never-freed `Driver` of this process.
        return Ok(unsafe { &*(p as *const Driver) });
    }
    Err(E::CUDA_ERROR_NOT_INITIALIZED)
}

impl Driver {
    pub fn tables(&self) -> MutexGuard<'_, Tables> {
        self.tables.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn charge(&self, dev: u32, bytes: u64) -> Result<(), R> {
        self.node
            .charge(dev, bytes)
            .map_err(|MemError { .. }| E::CUDA_ERROR_OUT_OF_MEMORY)
    }
}

pub fn sim_err(e: SimError) -> R {
    match e {
        SimError::InvalidDevice => E::CUDA_ERROR_INVALID_DEVICE,
        SimError::InvalidHandle => E::CUDA_ERROR_INVALID_HANDLE,
        SimError::OutOfResources | SimError::TooManyProcesses => E::CUDA_ERROR_OUT_OF_MEMORY,
        SimError::Io(_) | SimError::BadState(_) => E::CUDA_ERROR_NOT_INITIALIZED,
    }
}

thread_local! {
    /// The thread's context stack (top = current).
    pub static CTX_STACK: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
    /// Per-thread default streams, per context.
    pub static PER_THREAD: RefCell<HashMap<usize, usize>> = RefCell::new(HashMap::new());
}

pub fn current_ctx() -> Option<&'static Ctx> {
    let p = CTX_STACK.with(|s| s.borrow().last().copied())?;
    // SAFETY: only pointers to leaked `Ctx` boxes are pushed; destroyed contexts keep their box
    // (magic cleared) so a stale pointer is detected rather than dangling.
    let c = unsafe { &*(p as *const Ctx) };
    (c.magic.load(Acquire) == CTX_MAGIC).then_some(c)
}

pub fn set_current(ctx: usize) {
    CTX_STACK.with(|s| {
        let mut s = s.borrow_mut();
        if let Some(top) = s.last_mut() {
            *top = ctx;
        } else {
            s.push(ctx);
        }
        if ctx == 0 {
            s.pop();
        }
    });
}

/// Checks a handle pointer's magic and returns the object.
///
/// # Safety
/// `p` must be null or a pointer this driver handed out (the real driver has the same contract).
pub unsafe fn obj<'a, T>(p: *const T, magic: u64) -> Option<&'a T> {
    if p.is_null() || !(p as usize).is_multiple_of(std::mem::align_of::<u64>()) {
        return None;
    }
    // Every handle type starts with its magic number.
    // SAFETY: `p` is non-null, 8-byte aligned and (caller's contract) a handle this driver handed
    // out, whose first field is an `AtomicU64` magic number.
    let m = unsafe { &*(p as *const AtomicU64) }.load(Acquire);
    // SAFETY: the magic matches, so `p` is a `T` this driver allocated; handle objects are leaked
    // boxes that are never freed (destroy only clears the magic), so it lives for `'a`.
    (m == magic).then(|| unsafe { &*p })
}

/// A fresh device virtual address range (never reused in this process).
pub fn new_va(size: u64) -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0x7f00_0000_0000);
    const ALIGN: u64 = 2 << 20;
    let span = size.div_ceil(ALIGN).max(1) * ALIGN + ALIGN;
    NEXT.fetch_add(span, Relaxed)
}

/// A fresh 32-bit device address for the legacy `cuMemAlloc` (v1) entry point.
pub fn new_va32(size: u64) -> Option<u32> {
    static NEXT: AtomicU64 = AtomicU64::new(0x1000_0000);
    let span = size.div_ceil(512).max(1) * 512;
    let a = NEXT.fetch_add(span, Relaxed);
    (a + span <= 0xffff_0000).then_some(a as u32)
}

#[cfg(test)]
mod visible_tests {
    use super::parse_visible;

    #[test]
    fn cuda_visible_devices_follows_the_driver_rules() {
        let u: Vec<String> = ["GPU-aaaa-1", "GPU-bbbb-2", "GPU-abcd-3"]
            .map(String::from)
            .to_vec();
        assert_eq!(parse_visible(None, &u), vec![0, 1, 2]);
        assert_eq!(parse_visible(Some(""), &u), Vec::<u32>::new());
        assert_eq!(parse_visible(Some("2,0"), &u), vec![2, 0]);
        assert_eq!(parse_visible(Some("1,x,0"), &u), vec![1]);
        assert_eq!(parse_visible(Some("1,1"), &u), vec![1]);
        assert_eq!(parse_visible(Some("5"), &u), Vec::<u32>::new());
        assert_eq!(parse_visible(Some("GPU-b"), &u), vec![1]);
        // Ambiguous prefix names no device.
        assert_eq!(parse_visible(Some("GPU-a"), &u), Vec::<u32>::new());
    }
}

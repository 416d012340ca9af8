//! The scriptable probe behind `sim-probe` and `sim-probe-linked`.
//!
//! Operations run in order; each prints one line of `key=value` fields starting with `op=`, so
//! tests can assert on them. A failing driver call prints `rc=<code>` and the script goes on (a
//! refused allocation must not end the process — that is what the shim promises).
//!
//! | op | effect |
//! |---|---|
//! | `alloc:<kind>:<size>` | kind = v2, pitch, managed, async, pool (the default pool), mypool (the `pool-create` pool), vmm, vmm-released, array, array3d, mipmap (2 levels of 1024 floats × size/4 KiB rows: 1.25 × size), graph (a captured graph plus one memory-allocation node of size, instantiated and launched; freed by destroying the executable graph) |
//! | `pool-create[:<ordinal>]` / `pool-destroy` | cuMemPoolCreate on the device, or on another ordinal (then `mypool`) / cuMemPoolDestroy of it |
//! | `pool-threshold:<size\|max>` / `pool-trim` | release threshold / cuMemPoolTrimTo(0) of `mypool` if created, else of the default pool |
//! | `free` / `free-all` | frees the newest / every live allocation through the matching path |
//! | `vmm-retain` / `vmm-release-retained` | cuMemRetainAllocationHandle on the newest VMM mapping / cuMemRelease of every retained handle |
//! | `procmem` | device memory NVML attributes to this process (the driver's own ledger) |
//! | `primary-retain` / `primary-release` | cuDevicePrimaryCtxRetain / cuDevicePrimaryCtxRelease of the probe's device (the last release destroys the probe's own context) |
//! | `ctx-create` / `ctx-destroy` | cuCtxCreate_v2 on the device (the probe's context stays current) / cuCtxDestroy_v2 of the newest (both through `dlsym`) |
//! | `meminfo` / `totalmem` | cuMemGetInfo / cuDeviceTotalMem |
//! | `nvml-meminfo` | nvmlDeviceGetMemoryInfo of the same device via dlopen(libnvidia-ml.so.1) |
//! | `launch:<us>[:<count>[:<via>]]` | enqueue kernels, via = kernel, ex, coop, coop-multi (cuLaunchCooperativeKernelMultiDevice, one device), graph |
//! | `run:<us>:<count>[:<via>]` | launch then sync; prints wall time |
//! | `stream` | create a stream and use it from now on |
//! | `sync` / `sleep:<ms>` / `ready` | stream sync / sleep / print a marker line |
//! | `pool-info` | default pool reserved and used bytes |
//! | `familymem` | device memory NVML attributes to this process and its `--fork` siblings together (`used=`) |
//! | `storm:<threads>:<size>:<ms>[:<hold>]` | threads allocate (`cuMemAlloc_v2`, holding up to `hold` each, default 4, freeing the oldest past it or on a refusal) for ms; after every successful allocation the family's memory by NVML (the driver's ledger) is compared with the cap `cuMemGetInfo` reports: `ok= refused= overcommits= max_family= max_device= cap=` (`max_family` sums per-process figures read one after another, not a snapshot; `max_device` is the device-wide count, exact when the family is the device's only user) |
//! | `die` | SIGKILL itself (no exit handler runs) |
//! | `only:<i>:<op>` | runs `<op>` in `--fork` child `i` only (`op=skip` in the others) |
//!
//! `--fork N` forks N children before the driver is loaded (as a function that forks before its
//! first CUDA call); each child runs the script and tags its lines `proc=<i>`, and the parent
//! waits for them all (exit status 1 if one failed; a child killed by a signal is reported
//! `op=child proc=<i> signal=<n>`).

use crate::driver::{DirectTable, Ptr, Session};
use anyhow::{bail, Context, Result};
use clap::Parser;
use cudarc::driver::sys::CUlaunchConfig;
use smore_protocol::size::parse_size;
use std::ffi::{c_int, c_void};
use std::io::Write;
use std::time::Instant;

/// Command line of `sim-probe` / `sim-probe-linked`: how to reach the driver, then the script.
#[derive(Parser, Debug)]
#[command(about = "Scriptable CUDA driver client for smore's tests (see the module docs for ops)")]
pub struct Args {
    /// How to reach the driver and which device to use.
    #[command(flatten)]
    pub resolve: crate::driver::ResolveArgs,
    /// Fork this many children before loading the driver; each runs the script.
    #[arg(long, default_value_t = 0)]
    pub fork: usize,
    /// Operations, in order.
    pub ops: Vec<String>,
}

/// This process's place among `--fork` siblings: (index, every sibling's pid).
static FAMILY: std::sync::OnceLock<(usize, Vec<u32>)> = std::sync::OnceLock::new();

/// The pids whose memory counts as this probe's family (itself alone without `--fork`).
fn family() -> Vec<u32> {
    FAMILY
        .get()
        .map_or_else(|| vec![std::process::id()], |(_, p)| p.clone())
}

/// Siblings that have opened the device: a counter in a `MAP_SHARED` page made before the fork,
/// so that `--fork` children start their scripts together, each with its context made (a storm
/// of one sibling would otherwise fill the grant before a slower sibling's context fits).
static OPENED: std::sync::OnceLock<(&'static std::sync::atomic::AtomicU32, usize)> =
    std::sync::OnceLock::new();

/// How long a `--fork` child waits for its siblings to open the device before going on: 10 s.
const SIBLINGS_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Counts this process's device as opened and waits (bounded) for every `--fork` sibling's.
fn wait_for_siblings() {
    use std::sync::atomic::Ordering::SeqCst;
    let Some((opened, n)) = OPENED.get() else {
        return;
    };
    opened.fetch_add(1, SeqCst);
    let deadline = std::time::Instant::now() + SIBLINGS_WAIT;
    while (opened.load(SeqCst) as usize) < *n && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Forks `n` children that return (to run the script) once every sibling's pid is known; the
/// parent waits for them and exits.
fn fork_children(n: usize) -> Result<()> {
    use std::io::Read;
    // SAFETY: an anonymous shared mapping of one page, checked for MAP_FAILED; it is never
    // unmapped, so the 'static reference below stays valid in this process and its children.
    let page = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if page == libc::MAP_FAILED {
        bail!("mmap: {}", std::io::Error::last_os_error());
    }
    // SAFETY: the page is zeroed, page-aligned (so aligned for an AtomicU32) and lives forever.
    let opened: &'static std::sync::atomic::AtomicU32 =
        unsafe { &*(page as *const std::sync::atomic::AtomicU32) };
    let _ = OPENED.set((opened, n));
    let mut fds = [0; 2];
    // SAFETY: pipe() with a valid two-int array.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        bail!("pipe: {}", std::io::Error::last_os_error());
    }
    let mut pids = Vec::with_capacity(n);
    for i in 0..n {
        // SAFETY: the probe is single-threaded here (before the driver is loaded).
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            bail!("fork: {}", std::io::Error::last_os_error());
        }
        if pid == 0 {
            // SAFETY: closing our copy of the write end; the read end is owned from here.
            unsafe { libc::close(fds[1]) };
            // SAFETY: fds[0] is an open pipe read end this process owns.
            let mut r = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fds[0]) };
            let mut msg = vec![0u8; 4 * n];
            // Messages of ≤ PIPE_BUF bytes are written atomically: each child reads one whole.
            r.read_exact(&mut msg)?;
            let all = msg
                .chunks(4)
                .map(|c| u32::from_ne_bytes(c.try_into().unwrap()))
                .collect();
            let _ = FAMILY.set((i, all));
            return Ok(());
        }
        pids.push(pid as u32);
    }
    let msg: Vec<u8> = pids.iter().flat_map(|p| p.to_ne_bytes()).collect();
    anyhow::ensure!(msg.len() <= 4096, "--fork: at most 1024 children");
    for _ in 0..n {
        // SAFETY: writing a buffer we own to the pipe's write end.
        let w = unsafe { libc::write(fds[1], msg.as_ptr().cast(), msg.len()) };
        anyhow::ensure!(w as usize == msg.len(), "pipe write failed");
    }
    let mut failed = false;
    for (i, pid) in pids.iter().enumerate() {
        let mut status = 0;
        // SAFETY: waiting for our own child with a valid status pointer.
        unsafe { libc::waitpid(*pid as i32, &mut status, 0) };
        if libc::WIFSIGNALED(status) {
            emit(format!(
                "op=child proc={i} signal={}",
                libc::WTERMSIG(status)
            ));
        } else if libc::WEXITSTATUS(status) != 0 {
            failed = true;
        }
    }
    std::process::exit(i32::from(failed));
}

enum Live {
    Device(u64),
    Async(u64),
    Vmm {
        va: u64,
        size: usize,
        handle: u64,
    },
    /// Mapped, handle already released (the CUDA idiom: the mapping keeps the memory).
    VmmMapped {
        va: u64,
        size: usize,
    },
    Array(Ptr),
    Mipmap(Ptr),
    GraphExec(Ptr),
}

/// CUmemAllocationProp for a pinned device allocation on `dev` (layout of cuda.h, 32 bytes).
#[repr(C)]
struct AllocProp {
    kind: u32,
    handle_types: u32,
    loc_type: u32,
    loc_id: c_int,
    win32: *mut c_void,
    flags: [u8; 8],
}

/// CUmemAccessDesc: location + CU_MEM_ACCESS_FLAGS_PROT_READWRITE.
#[repr(C)]
struct AccessDesc {
    loc_type: u32,
    loc_id: c_int,
    flags: u32,
}

#[repr(C)]
struct ArrayDesc {
    width: usize,
    height: usize,
    format: u32,
    channels: u32,
}

#[repr(C)]
struct Array3DDesc {
    width: usize,
    height: usize,
    depth: usize,
    format: u32,
    channels: u32,
    flags: u32,
}

struct Probe {
    s: Session,
    stream: Ptr,
    live: Vec<Live>,
    /// Handles from `vmm-retain`, each owing one cuMemRelease.
    retained: Vec<u64>,
    /// Contexts from `ctx-create`.
    contexts: Vec<Ptr>,
    /// The pool from `pool-create`.
    pool: Ptr,
    spin: Ptr,
}

fn emit(line: String) {
    let mut out = std::io::stdout().lock();
    let _ = match FAMILY.get() {
        Some((i, _)) => writeln!(out, "{line} proc={i}"),
        None => writeln!(out, "{line}"),
    };
    let _ = out.flush();
}

impl Probe {
    fn alloc(&mut self, kind: &str, size: u64) -> Result<String> {
        let d = &self.s.drv;
        let size_us = size as usize;
        let mut ptr = 0u64;
        // SAFETY: every call passes out-pointers to locals and handles of this driver.
        let rc = unsafe {
            match kind {
                "v2" => (d.cuMemAlloc)(&mut ptr, size_us),
                "pitch" => {
                    let mut pitch = 0usize;
                    let width = 4096usize;
                    let height = size_us.div_ceil(width).max(1);
                    (d.cuMemAllocPitch)(&mut ptr, &mut pitch, width, height, 4)
                }
                "managed" => (d.cuMemAllocManaged)(&mut ptr, size_us, 1),
                "async" => (d.cuMemAllocAsync)(&mut ptr, size_us, self.stream),
                "pool" => {
                    let mut pool = std::ptr::null_mut();
                    let rc = (d.cuDeviceGetDefaultMemPool)(&mut pool, self.s.device);
                    if rc != 0 {
                        rc
                    } else {
                        (d.cuMemAllocFromPoolAsync)(&mut ptr, size_us, pool, self.stream)
                    }
                }
                "mypool" => (d.cuMemAllocFromPoolAsync)(&mut ptr, size_us, self.pool, self.stream),
                "vmm" => return self.alloc_vmm(size_us, false),
                "vmm-released" => return self.alloc_vmm(size_us, true),
                "graph" => return self.alloc_graph(size_us),
                "mipmap" => {
                    let mut arr = std::ptr::null_mut();
                    let desc = Array3DDesc {
                        width: 1024,
                        height: size_us.div_ceil(4 * 1024).max(1),
                        depth: 0,
                        format: 0x20,
                        channels: 1,
                        flags: 0,
                    };
                    let rc = (d.cuMipmappedArrayCreate)(
                        &mut arr,
                        &desc as *const Array3DDesc as *const c_void,
                        2,
                    );
                    if rc == 0 {
                        self.live.push(Live::Mipmap(arr));
                    }
                    return Ok(format!("rc={rc}"));
                }
                "array" | "array3d" => {
                    let mut arr = std::ptr::null_mut();
                    let floats = size_us.div_ceil(4).max(1);
                    let rc = if kind == "array" {
                        let desc = ArrayDesc {
                            width: 1024,
                            height: floats.div_ceil(1024),
                            format: 0x20,
                            channels: 1,
                        };
                        (d.cuArrayCreate)(&mut arr, &desc as *const ArrayDesc as *const c_void)
                    } else {
                        let desc = Array3DDesc {
                            width: 256,
                            height: 256,
                            depth: floats.div_ceil(65536),
                            format: 0x20,
                            channels: 1,
                            flags: 0,
                        };
                        (d.cuArray3DCreate)(&mut arr, &desc as *const Array3DDesc as *const c_void)
                    };
                    if rc == 0 {
                        self.live.push(Live::Array(arr));
                    }
                    return Ok(format!("rc={rc}"));
                }
                other => bail!("unknown alloc kind {other:?}"),
            }
        };
        if rc == 0 {
            self.live
                .push(if matches!(kind, "async" | "pool" | "mypool") {
                    Live::Async(ptr)
                } else {
                    Live::Device(ptr)
                });
        }
        Ok(format!("rc={rc} ptr={ptr:#x}"))
    }

    /// cuMemCreate → reserve → map → set access; with `release`, the handle is released at once
    /// (the mapping alone keeps the memory, as PyTorch's expandable segments do).
    fn alloc_vmm(&mut self, size: usize, release: bool) -> Result<String> {
        let d = &self.s.drv;
        let gran = 2usize << 20;
        let size = size.div_ceil(gran) * gran;
        let prop = AllocProp {
            kind: 1,
            handle_types: 0,
            loc_type: 1,
            loc_id: self.s.device,
            win32: std::ptr::null_mut(),
            flags: [0; 8],
        };
        let mut handle = 0u64;
        let mut va = 0u64;
        // SAFETY: prop/desc are valid cuda.h layouts; out-pointers to locals.
        unsafe {
            let rc = (d.cuMemCreate)(
                &mut handle,
                size,
                &prop as *const AllocProp as *const c_void,
                0,
            );
            if rc != 0 {
                return Ok(format!("rc={rc} step=create"));
            }
            let rc = (d.cuMemAddressReserve)(&mut va, size, 0, 0, 0);
            if rc != 0 {
                (d.cuMemRelease)(handle);
                return Ok(format!("rc={rc} step=reserve"));
            }
            let rc = (d.cuMemMap)(va, size, 0, handle, 0);
            if rc != 0 {
                (d.cuMemAddressFree)(va, size);
                (d.cuMemRelease)(handle);
                return Ok(format!("rc={rc} step=map"));
            }
            let desc = AccessDesc {
                loc_type: 1,
                loc_id: self.s.device,
                flags: 3,
            };
            let rc = (d.cuMemSetAccess)(va, size, &desc as *const AccessDesc as *const c_void, 1);
            if release {
                let rel = (d.cuMemRelease)(handle);
                self.live.push(Live::VmmMapped { va, size });
                return Ok(format!("rc={} ptr={va:#x} release_rc={rel}", rc.max(rel)));
            }
            self.live.push(Live::Vmm { va, size, handle });
            Ok(format!("rc={rc} ptr={va:#x}"))
        }
    }

    /// A graph with one memory-allocation node of `size` bytes on this device: captured (empty)
    /// on the probe's stream, the node added, instantiated, launched and synchronised.
    fn alloc_graph(&mut self, size: usize) -> Result<String> {
        if self.stream.is_null() {
            self.stream = self.s.new_stream()?;
        }
        let d = &self.s.drv;
        /// CUDA_MEM_ALLOC_NODE_PARAMS (cuda.h).
        #[repr(C)]
        struct Params {
            pool_props: [u8; 88],
            access: *const c_void,
            access_count: usize,
            bytesize: usize,
            dptr: u64,
        }
        let mut params = Params {
            pool_props: [0; 88],
            access: std::ptr::null(),
            access_count: 0,
            bytesize: size,
            dptr: 0,
        };
        // Pinned allocation (1) located on device (1) `self.s.device`.
        params.pool_props[0..4].copy_from_slice(&1u32.to_ne_bytes());
        params.pool_props[8..12].copy_from_slice(&1u32.to_ne_bytes());
        params.pool_props[12..16].copy_from_slice(&self.s.device.to_ne_bytes());
        // SAFETY: handles of this driver; out-pointers to locals; `params` has the cuda.h layout.
        unsafe {
            let rc = (d.cuStreamBeginCapture)(self.stream, 0);
            if rc != 0 {
                return Ok(format!("rc={rc} step=capture"));
            }
            let mut g = std::ptr::null_mut();
            let rc = (d.cuStreamEndCapture)(self.stream, &mut g);
            if rc != 0 {
                return Ok(format!("rc={rc} step=capture"));
            }
            let mut node = std::ptr::null_mut();
            let rc = (d.cuGraphAddMemAllocNode)(
                &mut node,
                g,
                std::ptr::null(),
                0,
                (&mut params as *mut Params).cast(),
            );
            if rc != 0 {
                (d.cuGraphDestroy)(g);
                return Ok(format!("rc={rc} step=node"));
            }
            let mut exec = std::ptr::null_mut();
            let rc = (d.cuGraphInstantiate)(&mut exec, g, 0);
            (d.cuGraphDestroy)(g);
            if rc != 0 {
                return Ok(format!("rc={rc} step=instantiate"));
            }
            self.live.push(Live::GraphExec(exec));
            let rc = (d.cuGraphLaunch)(exec, self.stream);
            let sync = (d.cuStreamSynchronize)(self.stream);
            Ok(format!(
                "rc={} step=launch ptr={:#x}",
                rc.max(sync),
                params.dptr
            ))
        }
    }

    /// The `pool-create` pool, else the device's default pool.
    fn pool_or_default(&self) -> Result<Ptr> {
        if !self.pool.is_null() {
            return Ok(self.pool);
        }
        let mut pool = std::ptr::null_mut();
        // SAFETY: out-pointer to a local.
        let rc = unsafe { (self.s.drv.cuDeviceGetDefaultMemPool)(&mut pool, self.s.device) };
        self.s.drv.check(rc, "cuDeviceGetDefaultMemPool")?;
        Ok(pool)
    }

    fn free_one(&mut self, l: Live) -> u32 {
        let d = &self.s.drv;
        // SAFETY: each allocation is freed through the path that made it.
        unsafe {
            match l {
                Live::Device(p) => (d.cuMemFree)(p),
                Live::Async(p) => {
                    let rc = (d.cuMemFreeAsync)(p, self.stream);
                    (d.cuStreamSynchronize)(self.stream);
                    rc
                }
                Live::Vmm { va, size, handle } => {
                    let a = (d.cuMemUnmap)(va, size);
                    let b = (d.cuMemAddressFree)(va, size);
                    let c = (d.cuMemRelease)(handle);
                    a.max(b).max(c)
                }
                Live::VmmMapped { va, size } => {
                    let a = (d.cuMemUnmap)(va, size);
                    let b = (d.cuMemAddressFree)(va, size);
                    a.max(b)
                }
                Live::Array(a) => (d.cuArrayDestroy)(a),
                Live::Mipmap(a) => (d.cuMipmappedArrayDestroy)(a),
                Live::GraphExec(e) => (d.cuGraphExecDestroy)(e),
            }
        }
    }

    fn launch(&mut self, us: f64, count: u32, via: &str) -> Result<u32> {
        let d = &self.s.drv;
        let mut dur_ns: u64 = (us * 1000.0).round() as u64;
        let mut param: Ptr = &mut dur_ns as *mut u64 as Ptr;
        let params: *mut Ptr = &mut param;
        // SAFETY: spin kernel launches with one u64 parameter; handles belong to this driver.
        unsafe {
            match via {
                "kernel" => {
                    for _ in 0..count {
                        let rc = (d.cuLaunchKernel)(
                            self.spin,
                            1,
                            1,
                            1,
                            128,
                            1,
                            1,
                            0,
                            self.stream,
                            params,
                            std::ptr::null_mut(),
                        );
                        if rc != 0 {
                            return Ok(rc);
                        }
                    }
                }
                "coop" => {
                    for _ in 0..count {
                        let rc = (d.cuLaunchCooperativeKernel)(
                            self.spin,
                            1,
                            1,
                            1,
                            128,
                            1,
                            1,
                            0,
                            self.stream,
                            params,
                        );
                        if rc != 0 {
                            return Ok(rc);
                        }
                    }
                }
                "coop-multi" => {
                    let mut p = cudarc::driver::sys::CUDA_LAUNCH_PARAMS {
                        function: self.spin as _,
                        gridDimX: 1,
                        gridDimY: 1,
                        gridDimZ: 1,
                        blockDimX: 128,
                        blockDimY: 1,
                        blockDimZ: 1,
                        sharedMemBytes: 0,
                        hStream: self.stream as _,
                        kernelParams: params,
                    };
                    for _ in 0..count {
                        let rc = (d.cuLaunchCooperativeKernelMultiDevice)(&mut p, 1, 0);
                        if rc != 0 {
                            return Ok(rc);
                        }
                    }
                }
                "ex" => {
                    let cfg = CUlaunchConfig {
                        gridDimX: 1,
                        gridDimY: 1,
                        gridDimZ: 1,
                        blockDimX: 128,
                        blockDimY: 1,
                        blockDimZ: 1,
                        sharedMemBytes: 0,
                        hStream: self.stream as _,
                        attrs: std::ptr::null_mut(),
                        numAttrs: 0,
                    };
                    for _ in 0..count {
                        let rc =
                            (d.cuLaunchKernelEx)(&cfg, self.spin, params, std::ptr::null_mut());
                        if rc != 0 {
                            return Ok(rc);
                        }
                    }
                }
                "graph" => {
                    if self.stream.is_null() {
                        self.stream = self.s.new_stream()?;
                    }
                    let rc = (d.cuStreamBeginCapture)(self.stream, 0);
                    if rc != 0 {
                        return Ok(rc);
                    }
                    for _ in 0..count {
                        (d.cuLaunchKernel)(
                            self.spin,
                            1,
                            1,
                            1,
                            128,
                            1,
                            1,
                            0,
                            self.stream,
                            params,
                            std::ptr::null_mut(),
                        );
                    }
                    let mut g = std::ptr::null_mut();
                    let rc = (d.cuStreamEndCapture)(self.stream, &mut g);
                    if rc != 0 {
                        return Ok(rc);
                    }
                    let mut exec = std::ptr::null_mut();
                    let rc = (d.cuGraphInstantiate)(&mut exec, g, 0);
                    if rc != 0 {
                        return Ok(rc);
                    }
                    let rc = (d.cuGraphLaunch)(exec, self.stream);
                    (d.cuGraphDestroy)(g);
                    return Ok(rc);
                }
                other => bail!(
                    "unknown launch path {other:?}: expected kernel, ex, coop, coop-multi or graph"
                ),
            }
        }
        Ok(0)
    }

    fn op(&mut self, op: &str) -> Result<String> {
        let parts: Vec<&str> = op.split(':').collect();
        let d = &self.s.drv;
        Ok(match parts.as_slice() {
            ["alloc", kind, size] => {
                let bytes = parse_size(size)?;
                format!(
                    "op=alloc kind={kind} size={bytes} {}",
                    self.alloc(kind, bytes)?
                )
            }
            ["free"] => match self.live.pop() {
                Some(l) => format!("op=free rc={}", self.free_one(l)),
                None => "op=free rc=none".to_string(),
            },
            ["free-all"] => {
                let mut worst = 0;
                while let Some(l) = self.live.pop() {
                    worst = worst.max(self.free_one(l));
                }
                format!("op=free-all rc={worst}")
            }
            ["meminfo"] => {
                let (mut free, mut total) = (0usize, 0usize);
                // SAFETY: out-pointers to locals.
                let rc = unsafe { (d.cuMemGetInfo)(&mut free, &mut total) };
                format!("op=meminfo rc={rc} free={free} total={total}")
            }
            ["totalmem"] => {
                let mut total = 0usize;
                // SAFETY: out-pointer to a local.
                let rc = unsafe { (d.cuDeviceTotalMem)(&mut total, self.s.device) };
                format!("op=totalmem rc={rc} total={total}")
            }
            ["nvml-meminfo"] => nvml_meminfo(self.s.device as u32)?,
            ["procmem"] => nvml_procmem(self.s.device as u32)?,
            ["familymem"] => {
                let nvml = Nvml::open(self.s.device as u32)?;
                format!("op=familymem rc=0 used={}", nvml.family_used(&family())?)
            }
            ["storm", threads, size, ms, hold @ ..] => self.storm(
                threads.parse()?,
                parse_size(size).map_err(anyhow::Error::msg)?,
                ms.parse()?,
                hold.first().map_or(Ok(4), |h| h.parse())?,
            )?,
            ["only", i, rest @ ..] => {
                if FAMILY.get().is_some_and(|(me, _)| me.to_string() == *i) {
                    return self.op(&rest.join(":"));
                }
                "op=skip".to_string()
            }
            ["die"] => {
                // SAFETY: signalling this very process.
                unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
                unreachable!("SIGKILL is not caught")
            }
            ["vmm-retain"] => {
                let va = self.live.iter().rev().find_map(|l| match l {
                    Live::Vmm { va, .. } | Live::VmmMapped { va, .. } => Some(*va),
                    _ => None,
                });
                let Some(va) = va else {
                    bail!("vmm-retain: no live VMM mapping")
                };
                let mut h = 0u64;
                // SAFETY: out-pointer to a local; `va` is a mapped address of this driver.
                let rc = unsafe { (d.cuMemRetainAllocationHandle)(&mut h, va as *mut c_void) };
                if rc == 0 {
                    self.retained.push(h);
                }
                format!("op=vmm-retain rc={rc}")
            }
            ["pool-create", rest @ ..] => {
                // CUmemPoolProps (cuda.h, 88 bytes): pinned allocations on this device (or on
                // the ordinal given: `pool-create:<ordinal>`).
                let dev: i32 = match rest {
                    [o] => o.parse()?,
                    _ => self.s.device,
                };
                let mut props = [0u8; 88];
                props[0..4].copy_from_slice(&1u32.to_ne_bytes());
                props[8..12].copy_from_slice(&1u32.to_ne_bytes());
                props[12..16].copy_from_slice(&dev.to_ne_bytes());
                let mut pool = std::ptr::null_mut();
                // SAFETY: out-pointer to a local; `props` has the CUmemPoolProps layout.
                let rc = unsafe { (d.cuMemPoolCreate)(&mut pool, props.as_ptr().cast()) };
                if rc == 0 {
                    self.pool = pool;
                }
                format!("op=pool-create rc={rc}")
            }
            ["pool-destroy"] => {
                // SAFETY: the pool this probe created.
                let rc = unsafe { (d.cuMemPoolDestroy)(self.pool) };
                self.pool = std::ptr::null_mut();
                format!("op=pool-destroy rc={rc}")
            }
            ["pool-threshold", size] => {
                let mut v: u64 = if *size == "max" {
                    u64::MAX
                } else {
                    parse_size(size)?
                };
                let pool = self.pool_or_default()?;
                // SAFETY: CU_MEMPOOL_ATTR_RELEASE_THRESHOLD (4) takes a cuuint64_t.
                let rc = unsafe {
                    (d.cuMemPoolSetAttribute)(pool, 4, &mut v as *mut u64 as *mut c_void)
                };
                format!("op=pool-threshold rc={rc}")
            }
            ["pool-trim"] => {
                let pool = self.pool_or_default()?;
                // SAFETY: a pool handle of this driver.
                let rc = unsafe { (d.cuMemPoolTrimTo)(pool, 0) };
                format!("op=pool-trim rc={rc}")
            }
            ["primary-retain"] => {
                let mut ctx = std::ptr::null_mut();
                // SAFETY: out-pointer to a local; the probe's device.
                let rc = unsafe { (d.cuDevicePrimaryCtxRetain)(&mut ctx, self.s.device) };
                format!("op=primary-retain rc={rc}")
            }
            ["primary-release"] => {
                // SAFETY: the probe's device, whose primary context it retained.
                let rc = unsafe { (d.cuDevicePrimaryCtxRelease)(self.s.device) };
                format!("op=primary-release rc={rc}")
            }
            ["ctx-create"] => {
                type Create = unsafe extern "C" fn(*mut Ptr, u32, c_int) -> u32;
                let f: Create = libcuda_fn(c"cuCtxCreate_v2")?;
                let mut ctx: Ptr = std::ptr::null_mut();
                // SAFETY: out-pointer to a local; the probe's device; the probe's own context is
                // made current again (cuCtxCreate makes the new one current).
                let rc = unsafe {
                    let rc = f(&mut ctx, 0, self.s.device);
                    (d.cuCtxSetCurrent)(self.s.ctx);
                    rc
                };
                if rc == 0 {
                    self.contexts.push(ctx);
                }
                format!("op=ctx-create rc={rc}")
            }
            ["ctx-destroy"] => {
                type Destroy = unsafe extern "C" fn(Ptr) -> u32;
                let f: Destroy = libcuda_fn(c"cuCtxDestroy_v2")?;
                let Some(ctx) = self.contexts.pop() else {
                    bail!("ctx-destroy: no context from ctx-create")
                };
                // SAFETY: a context this driver created and nobody else uses.
                let rc = unsafe { f(ctx) };
                format!("op=ctx-destroy rc={rc}")
            }
            ["vmm-release-retained"] => {
                let mut worst = 0;
                for h in std::mem::take(&mut self.retained) {
                    // SAFETY: a handle the driver returned from cuMemRetainAllocationHandle.
                    worst = worst.max(unsafe { (d.cuMemRelease)(h) });
                }
                format!("op=vmm-release-retained rc={worst}")
            }
            ["pool-info"] => {
                let mut pool = std::ptr::null_mut();
                let (mut reserved, mut used) = (0u64, 0u64);
                // SAFETY: out-pointers to locals; attributes 5 and 7 are u64.
                let rc = unsafe {
                    (d.cuDeviceGetDefaultMemPool)(&mut pool, self.s.device)
                        .max((d.cuMemPoolGetAttribute)(
                            pool,
                            5,
                            &mut reserved as *mut u64 as *mut c_void,
                        ))
                        .max((d.cuMemPoolGetAttribute)(
                            pool,
                            7,
                            &mut used as *mut u64 as *mut c_void,
                        ))
                };
                format!("op=pool-info rc={rc} reserved={reserved} used={used}")
            }
            ["launch", us, rest @ ..] => {
                let count = rest.first().map(|c| c.parse()).transpose()?.unwrap_or(1);
                let via = rest.get(1).copied().unwrap_or("kernel");
                let t = Instant::now();
                let rc = self.launch(us.parse()?, count, via)?;
                format!(
                    "op=launch via={via} count={count} rc={rc} enqueue_us={:.1}",
                    t.elapsed().as_secs_f64() * 1e6
                )
            }
            ["run", us, count, rest @ ..] => {
                let via = rest.first().copied().unwrap_or("kernel");
                let t = Instant::now();
                let rc = self.launch(us.parse()?, count.parse()?, via)?;
                self.s.sync(self.stream)?;
                format!(
                    "op=run via={via} count={count} rc={rc} wall_ms={:.3}",
                    t.elapsed().as_secs_f64() * 1e3
                )
            }
            ["stream"] => {
                self.stream = self.s.new_stream()?;
                "op=stream rc=0".to_string()
            }
            ["sync"] => {
                // SAFETY: stream handle of this driver (or the default stream).
                let rc = unsafe { (d.cuStreamSynchronize)(self.stream) };
                format!("op=sync rc={rc}")
            }
            ["sleep", ms] => {
                std::thread::sleep(std::time::Duration::from_millis(ms.parse()?));
                format!("op=sleep ms={ms}")
            }
            ["ready"] => "op=ready".to_string(),
            ["procaddr", name, version, flags, expect] => {
                procaddr_matches(name, version.parse()?, flags.parse()?, expect)?
            }
            _ => bail!("unknown op {op:?} (see `sim-probe --help` and the probe module docs)"),
        })
    }
}

/// Resolves `name` through cuGetProcAddress_v2 and reports whether the pointer is the export
/// `expect` (found with dlsym on the same handle).
fn procaddr_matches(name: &str, version: c_int, flags: u64, expect: &str) -> Result<String> {
    type V2 =
        unsafe extern "C" fn(*const std::ffi::c_char, *mut Ptr, c_int, u64, *mut c_int) -> u32;
    let h = crate::driver::libcuda_handle()?;
    // SAFETY: dlsym on a valid handle; the export has the cuGetProcAddress_v2 signature.
    unsafe {
        let f = libc::dlsym(h, c"cuGetProcAddress_v2".as_ptr());
        if f.is_null() {
            bail!("no cuGetProcAddress_v2");
        }
        let f: V2 = std::mem::transmute(f);
        let cname = std::ffi::CString::new(name)?;
        let mut p: Ptr = std::ptr::null_mut();
        let mut status: c_int = -1;
        let rc = f(cname.as_ptr(), &mut p, version, flags, &mut status);
        let cexp = std::ffi::CString::new(expect)?;
        let want = libc::dlsym(h, cexp.as_ptr());
        Ok(format!(
            "op=procaddr name={name} version={version} flags={flags} rc={rc} status={status} match={}",
            !p.is_null() && p == want
        ))
    }
}

/// `dlsym(libcuda.so.1, name)` as a function of type `F` (an `unsafe extern "C" fn`).
fn libcuda_fn<F: Copy>(name: &std::ffi::CStr) -> Result<F> {
    assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<Ptr>());
    let h = crate::driver::libcuda_handle()?;
    // SAFETY: dlsym on a valid handle with a NUL-terminated name.
    let p = unsafe { libc::dlsym(h, name.as_ptr()) };
    if p.is_null() {
        bail!("dlsym({name:?}) found nothing");
    }
    // SAFETY: `F` is a function pointer type (size checked) with the export's C prototype, as
    // the caller declares it.
    Ok(unsafe { std::mem::transmute_copy::<Ptr, F>(&p) })
}

/// `nvmlProcessInfo_t` (v2/v3 layout, nvml.h).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct NvmlProcessInfo {
    pid: u32,
    used: u64,
    _gpu_instance: u32,
    _compute_instance: u32,
}
type NvmlProcs = unsafe extern "C" fn(Ptr, *mut u32, *mut NvmlProcessInfo) -> u32;

/// Device memory NVML attributes to this process on NVML index `index` (0 when not listed).
fn nvml_procmem(index: u32) -> Result<String> {
    // SAFETY: dlopen/dlsym with valid names; the NVML entry points have these signatures.
    unsafe {
        let h = libc::dlopen(
            c"libnvidia-ml.so.1".as_ptr(),
            libc::RTLD_NOW | libc::RTLD_LOCAL,
        );
        if h.is_null() {
            bail!("dlopen(libnvidia-ml.so.1) failed");
        }
        let sym = |n: &std::ffi::CStr| {
            let p = libc::dlsym(h, n.as_ptr());
            if p.is_null() {
                bail!("dlsym({n:?}) failed")
            }
            Ok(p)
        };
        let init: NvmlInit = std::mem::transmute(sym(c"nvmlInit_v2")?);
        let handle: NvmlHandle = std::mem::transmute(sym(c"nvmlDeviceGetHandleByIndex_v2")?);
        let procs: NvmlProcs =
            std::mem::transmute(sym(c"nvmlDeviceGetComputeRunningProcesses_v3")?);
        let mut dev = std::ptr::null_mut();
        let rc = init().max(handle(index, &mut dev));
        if rc != 0 {
            return Ok(format!("op=procmem rc={rc}"));
        }
        let mut buf = [NvmlProcessInfo::default(); 64];
        let mut n = buf.len() as u32;
        let rc = procs(dev, &mut n, buf.as_mut_ptr());
        let me = std::process::id();
        let used = buf[..(n as usize).min(buf.len())]
            .iter()
            .find(|p| p.pid == me)
            .map_or(0, |p| p.used);
        Ok(format!("op=procmem rc={rc} used={used}"))
    }
}

/// NVML's process list of one device, resolved once.
struct Nvml {
    dev: Ptr,
    procs: NvmlProcs,
    mem: NvmlMem,
}

// SAFETY: an NVML device handle is an opaque token valid from any thread (NVML is thread-safe).
unsafe impl Sync for Nvml {}

impl Nvml {
    fn open(index: u32) -> Result<Nvml> {
        // SAFETY: dlopen/dlsym with valid names; the NVML entry points have these signatures.
        unsafe {
            let h = libc::dlopen(
                c"libnvidia-ml.so.1".as_ptr(),
                libc::RTLD_NOW | libc::RTLD_LOCAL,
            );
            if h.is_null() {
                bail!("dlopen(libnvidia-ml.so.1) failed");
            }
            let sym = |n: &std::ffi::CStr| {
                let p = libc::dlsym(h, n.as_ptr());
                if p.is_null() {
                    bail!("dlsym({n:?}) failed")
                }
                Ok(p)
            };
            let init: NvmlInit = std::mem::transmute(sym(c"nvmlInit_v2")?);
            let handle: NvmlHandle = std::mem::transmute(sym(c"nvmlDeviceGetHandleByIndex_v2")?);
            let procs: NvmlProcs =
                std::mem::transmute(sym(c"nvmlDeviceGetComputeRunningProcesses_v3")?);
            let mem: NvmlMem = std::mem::transmute(sym(c"nvmlDeviceGetMemoryInfo")?);
            let mut dev = std::ptr::null_mut();
            let rc = init().max(handle(index, &mut dev));
            anyhow::ensure!(rc == 0, "NVML device {index}: rc={rc}");
            Ok(Nvml { dev, procs, mem })
        }
    }

    /// Device memory in use on the whole device, by NVML: one reading of the driver's device-wide
    /// count (a consistent figure, unlike a sum of per-process figures read one after another).
    fn device_used(&self) -> Result<u64> {
        let mut m = [0u64; 3];
        // SAFETY: a valid device handle and an out-pointer to nvmlMemory_t's three u64s.
        let rc = unsafe { (self.mem)(self.dev, &mut m) };
        anyhow::ensure!(rc == 0, "nvmlDeviceGetMemoryInfo: rc={rc}");
        Ok(m[2])
    }

    /// Device memory of the processes `pids` together, by NVML.
    fn family_used(&self, pids: &[u32]) -> Result<u64> {
        let mut buf = [NvmlProcessInfo::default(); 256];
        let mut n = buf.len() as u32;
        // SAFETY: a valid device handle, count and buffer of that many entries.
        let rc = unsafe { (self.procs)(self.dev, &mut n, buf.as_mut_ptr()) };
        anyhow::ensure!(rc == 0, "nvmlDeviceGetComputeRunningProcesses: rc={rc}");
        Ok(buf[..(n as usize).min(buf.len())]
            .iter()
            .filter(|p| pids.contains(&p.pid))
            .map(|p| p.used)
            .sum())
    }
}

type NvmlInit = unsafe extern "C" fn() -> u32;
type NvmlHandle = unsafe extern "C" fn(u32, *mut Ptr) -> u32;
type NvmlMem = unsafe extern "C" fn(Ptr, *mut [u64; 3]) -> u32;

fn nvml_meminfo(index: u32) -> Result<String> {
    // SAFETY: dlopen/dlsym with valid names; the NVML entry points have these signatures.
    unsafe {
        let h = libc::dlopen(
            c"libnvidia-ml.so.1".as_ptr(),
            libc::RTLD_NOW | libc::RTLD_LOCAL,
        );
        if h.is_null() {
            bail!("dlopen(libnvidia-ml.so.1) failed");
        }
        let sym = |n: &std::ffi::CStr| {
            let p = libc::dlsym(h, n.as_ptr());
            if p.is_null() {
                bail!("dlsym({n:?}) failed")
            }
            Ok(p)
        };
        let init: NvmlInit = std::mem::transmute(sym(c"nvmlInit_v2")?);
        let handle: NvmlHandle = std::mem::transmute(sym(c"nvmlDeviceGetHandleByIndex_v2")?);
        let mem: NvmlMem = std::mem::transmute(sym(c"nvmlDeviceGetMemoryInfo")?);
        let rc = init();
        if rc != 0 {
            return Ok(format!("op=nvml-meminfo rc={rc} step=init"));
        }
        let mut dev = std::ptr::null_mut();
        let rc = handle(index, &mut dev);
        if rc != 0 {
            return Ok(format!("op=nvml-meminfo rc={rc} step=handle"));
        }
        let mut m = [0u64; 3];
        let rc = mem(dev, &mut m);
        Ok(format!(
            "op=nvml-meminfo rc={rc} total={} free={} used={}",
            m[0], m[1], m[2]
        ))
    }
}

impl Probe {
    /// `storm:<threads>:<size>:<ms>` (see the module docs).
    fn storm(&mut self, threads: usize, size: u64, ms: u64, hold: usize) -> Result<String> {
        use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
        let d = &self.s.drv;
        let (mut free, mut cap) = (0usize, 0usize);
        // SAFETY: out-pointers to locals.
        let rc = unsafe { (d.cuMemGetInfo)(&mut free, &mut cap) };
        anyhow::ensure!(rc == 0, "cuMemGetInfo: rc={rc}");
        let nvml = Nvml::open(self.s.device as u32)?;
        let fam = family();
        let (ok, refused, over, max) = (
            AtomicU64::new(0),
            AtomicU64::new(0),
            AtomicU64::new(0),
            AtomicU64::new(0),
        );
        let max_device = AtomicU64::new(0);
        let ctx = self.s.ctx as usize;
        let deadline = Instant::now() + std::time::Duration::from_millis(ms);
        let t0 = Instant::now();
        std::thread::scope(|sc| -> Result<()> {
            let mut workers = Vec::with_capacity(threads);
            for _ in 0..threads {
                workers.push(sc.spawn(|| -> Result<()> {
                    // SAFETY: making the probe's context current on this thread.
                    unsafe { (d.cuCtxSetCurrent)(ctx as Ptr) };
                    let mut held: std::collections::VecDeque<u64> = Default::default();
                    while Instant::now() < deadline {
                        let mut p = 0u64;
                        // SAFETY: out-pointer to a local.
                        let rc = unsafe { (d.cuMemAlloc)(&mut p, size as usize) };
                        if rc == 0 {
                            ok.fetch_add(1, Relaxed);
                            held.push_back(p);
                            let used = nvml.family_used(&fam)?;
                            max.fetch_max(used, Relaxed);
                            max_device.fetch_max(nvml.device_used()?, Relaxed);
                            if used > cap as u64 {
                                over.fetch_add(1, Relaxed);
                            }
                        } else {
                            refused.fetch_add(1, Relaxed);
                        }
                        if held.len() >= hold.max(1) || (rc != 0 && !held.is_empty()) {
                            let p = held.pop_front().unwrap();
                            // SAFETY: freeing our own allocation.
                            unsafe { (d.cuMemFree)(p) };
                        }
                    }
                    for p in held {
                        // SAFETY: freeing our own allocation.
                        unsafe { (d.cuMemFree)(p) };
                    }
                    Ok(())
                }));
            }
            // A thread that failed (NVML unreadable) fails the op: a storm that stopped
            // checking must not report zero over-commits.
            for w in workers {
                w.join()
                    .map_err(|_| anyhow::anyhow!("a storm thread panicked"))??;
            }
            Ok(())
        })?;
        let secs = t0.elapsed().as_secs_f64();
        Ok(format!(
            "op=storm threads={threads} ok={} refused={} overcommits={} max_family={} max_device={} cap={cap} allocs_per_s={:.0}",
            ok.load(Relaxed),
            refused.load(Relaxed),
            over.load(Relaxed),
            max.load(Relaxed),
            max_device.load(Relaxed),
            ok.load(Relaxed) as f64 / secs
        ))
    }
}

/// Runs the probe; `direct` is the driver-linked table of `sim-probe-linked`.
pub fn main_with(direct: Option<&dyn Fn(bool) -> DirectTable>) -> Result<()> {
    let args = Args::parse();
    if args.fork > 0 {
        fork_children(args.fork)?;
    }
    let drv = args.resolve.load(direct)?;
    let resolved: Vec<String> = drv
        .names
        .iter()
        .filter(|(b, _)| matches!(*b, "cuMemAlloc" | "cuLaunchKernel" | "cuMemGetInfo"))
        .map(|(b, n)| format!("{b}={n}"))
        .collect();
    let s =
        Session::open(drv, args.resolve.device, &[("tick", 10.0)]).context("opening the device")?;
    wait_for_siblings();
    let spin = s.function("smore_sim_spin")?;
    emit(format!(
        "op=init resolve={} {}",
        args.resolve.resolve,
        resolved.join(" ")
    ));
    let mut p = Probe {
        s,
        stream: std::ptr::null_mut(),
        live: Vec::new(),
        retained: Vec::new(),
        contexts: Vec::new(),
        pool: std::ptr::null_mut(),
        spin,
    };
    for op in &args.ops {
        let line = p.op(op)?;
        emit(line);
    }
    Ok(())
}

//! Client programs for the shim's end-to-end tests, one subcommand per situation the shim must
//! survive. Every line printed is `op=<name> key=value ...`, like `sim-probe`.
//!
//! - `race`: N threads allocate M-byte blocks at once until refused (the cap must hold exactly
//!   and be used up), then free everything.
//! - `fork`: allocate, fork; the child sets a different `SMORE_MEMORY_LIMIT` and reads its memory
//!   info (a re-initialised shim sees the new cap and none of the parent's allocations).
//! - `rtld-next`: `dlsym(RTLD_NEXT, …)` and `dlsym(RTLD_DEFAULT, …)` of a hooked name from the
//!   executable must agree (the shim's `dlsym` keeps the caller's `RTLD_NEXT` context).
//! - `hold`: stays alive, reading commands from stdin — `alloc <size>` (kept until exit), `meminfo`
//!   — and answering each with one line (`op=ready` first); exits at EOF. The arbiter-restart
//!   test drives a long-lived function with it.
//! - `v1`: the CUDA < 3.2 ABI (32-bit pointers and sizes) as a program built for it gets it:
//!   `cuGetProcAddress(name, 3000, 0)`. The shim must hand back its v1 hooks, not the `_v2` ones
//!   a name-based mapping would pick (which would read 64-bit out parameters into 32-bit slots).
use anyhow::{bail, Result};
use clap::{Parser, Subcommand};
use smore_protocol::size::parse_size;
use smore_sim_clients::driver::{Ptr, ResolveArgs, Session};
use std::io::Write;
use std::sync::{Arc, Barrier};

#[derive(Parser, Debug)]
#[command(about = "Shim test clients (see the module docs)")]
struct Args {
    #[command(flatten)]
    resolve: ResolveArgs,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Threads racing for the cap with equal-sized allocations.
    Race {
        #[arg(long, default_value_t = 8)]
        threads: usize,
        #[arg(long, default_value = "1MiB")]
        size: String,
    },
    /// Allocate, fork, and report the child's view after it changed SMORE_MEMORY_LIMIT.
    Fork {
        #[arg(long, default_value = "600MiB")]
        parent_alloc: String,
        #[arg(long, default_value = "256MiB")]
        child_cap: String,
    },
    /// Allocate, query and free through the v1 (32-bit) entry points of cuGetProcAddress(…, 3000).
    V1 {
        #[arg(long, default_value = "48MiB")]
        size: String,
        #[arg(long, default_value = "32MiB")]
        more: String,
    },
    /// NVML memory information of NVML index `index` (v1 and v2), after CUDA is initialised.
    NvmlInfo {
        #[arg(long)]
        index: u32,
    },
    /// Stay alive and answer `alloc <size>` / `meminfo` lines from stdin until EOF.
    Hold,
    /// Compare dlsym(RTLD_NEXT) and dlsym(RTLD_DEFAULT) of a hooked name.
    RtldNext {
        #[arg(long, default_value = "cuMemAlloc_v2")]
        symbol: String,
    },
}

fn emit(line: String) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn meminfo(s: &Session) -> String {
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: out-pointers to locals.
    let rc = unsafe { (s.drv.cuMemGetInfo)(&mut free, &mut total) };
    format!("rc={rc} free={free} total={total}")
}

fn race(s: &Session, threads: usize, size: usize) -> Result<()> {
    let barrier = Arc::new(Barrier::new(threads));
    let ctx = s.ctx as usize;
    let (alloc, free, set) = (s.drv.cuMemAlloc, s.drv.cuMemFree, s.drv.cuCtxSetCurrent);
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                // SAFETY: the context handle of this process's session.
                unsafe { set(ctx as *mut std::ffi::c_void) };
                barrier.wait();
                let mut got = Vec::new();
                let last = loop {
                    let mut p = 0u64;
                    // SAFETY: out-pointer to a local.
                    let rc = unsafe { alloc(&mut p, size) };
                    if rc != 0 {
                        break rc;
                    }
                    got.push(p);
                };
                (got, last)
            })
        })
        .collect();
    let mut all = Vec::new();
    let mut codes = Vec::new();
    for h in handles {
        let (got, rc) = h
            .join()
            .map_err(|_| anyhow::anyhow!("race thread panicked"))?;
        all.extend(got);
        codes.push(rc);
    }
    codes.sort();
    codes.dedup();
    let codes: Vec<String> = codes.iter().map(u32::to_string).collect();
    emit(format!(
        "op=race threads={threads} size={size} ok={} bytes={} stop_rc={}",
        all.len(),
        all.len() * size,
        codes.join(",")
    ));
    emit(format!("op=meminfo {}", meminfo(s)));
    let mut worst = 0;
    for p in all {
        // SAFETY: pointers this process allocated.
        worst = worst.max(unsafe { free(p) });
    }
    emit(format!("op=free-all rc={worst}"));
    emit(format!("op=meminfo {}", meminfo(s)));
    Ok(())
}

fn fork(s: &Session, resolve: &ResolveArgs, parent_alloc: u64, child_cap: &str) -> Result<()> {
    let mut p = 0u64;
    // SAFETY: out-pointer to a local.
    let rc = unsafe { (s.drv.cuMemAlloc)(&mut p, parent_alloc as usize) };
    emit(format!("op=alloc who=parent rc={rc}"));
    emit(format!("op=meminfo who=parent {}", meminfo(s)));
    // SAFETY: fork in a process whose only other threads are none (the probe is single-threaded
    // here); the child only calls async-signal-tolerant code paths of this test client and exits
    // with _exit.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        bail!("fork failed");
    }
    if pid == 0 {
        // The child is single-threaded: changing the environment is safe here.
        std::env::set_var("SMORE_MEMORY_LIMIT", child_cap);
        // A forked child must initialise CUDA again (the driver refuses the parent's state).
        let child = resolve
            .load(None)
            .and_then(|d| Session::open(d, resolve.device, &[("tick", 10.0)]));
        match child {
            Ok(c) => {
                emit(format!("op=meminfo who=child {}", meminfo(&c)));
                let cap = parse_size(child_cap).unwrap_or(0) as usize;
                let mut p = 0u64;
                // SAFETY: out-pointer to a local.
                let over = unsafe { (c.drv.cuMemAlloc)(&mut p, cap + 1) };
                // SAFETY: as above.
                let at = unsafe { (c.drv.cuMemAlloc)(&mut p, cap) };
                emit(format!("op=alloc who=child over_rc={over} at_cap_rc={at}"));
            }
            Err(e) => emit(format!("op=meminfo who=child error={e:#}")),
        }
        // SAFETY: leave without running the parent's atexit handlers (the driver's).
        unsafe { libc::_exit(0) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    emit(format!("op=child-exit status={status}"));
    emit(format!("op=meminfo who=parent {}", meminfo(s)));
    Ok(())
}

fn hold(s: &Session) -> Result<()> {
    use std::io::BufRead;
    emit("op=ready".into());
    let mut kept = Vec::new();
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["alloc", size] => {
                let bytes = parse_size(size)? as usize;
                let mut p = 0u64;
                // SAFETY: out-pointer to a local.
                let rc = unsafe { (s.drv.cuMemAlloc)(&mut p, bytes) };
                if rc == 0 {
                    kept.push(p);
                }
                emit(format!("op=alloc size={bytes} rc={rc}"));
            }
            ["meminfo"] => emit(format!("op=meminfo {}", meminfo(s))),
            [] => {}
            other => bail!("unknown hold command {other:?}: expected `alloc <size>` or `meminfo`"),
        }
    }
    for p in kept {
        // SAFETY: pointers this process allocated.
        unsafe { (s.drv.cuMemFree)(p) };
    }
    Ok(())
}

fn rtld_next(symbol: &str) -> Result<()> {
    let c = std::ffi::CString::new(symbol)?;
    // SAFETY: dlsym with the special handles and a NUL-terminated name.
    let (next, default) = unsafe {
        (
            libc::dlsym(libc::RTLD_NEXT, c.as_ptr()) as usize,
            libc::dlsym(libc::RTLD_DEFAULT, c.as_ptr()) as usize,
        )
    };
    emit(format!(
        "op=rtld-next symbol={symbol} next={next:#x} default={default:#x} same={}",
        next == default
    ));
    Ok(())
}

/// `CUDA_ARRAY_DESCRIPTOR_v1`.
#[repr(C)]
struct ArrayDescV1 {
    width: u32,
    height: u32,
    format: u32,
    channels: u32,
}

fn v1(s: &Session, size: u32, more: u32) -> Result<()> {
    type Gpa = unsafe extern "C" fn(*const std::ffi::c_char, *mut Ptr, i32, u64) -> u32;
    let h = smore_sim_clients::driver::libcuda_handle()?;
    // SAFETY: dlsym on the driver handle; the export has the cuGetProcAddress (v1) prototype.
    let gpa: Gpa = unsafe {
        let p = libc::dlsym(h, c"cuGetProcAddress".as_ptr());
        if p.is_null() {
            bail!("no cuGetProcAddress");
        }
        std::mem::transmute::<Ptr, Gpa>(p)
    };
    let get = |name: &str, version: i32| -> Result<Ptr> {
        let c = std::ffi::CString::new(name)?;
        let mut p: Ptr = std::ptr::null_mut();
        // SAFETY: valid name and out pointer.
        let rc = unsafe { gpa(c.as_ptr(), &mut p, version, 0) };
        if rc != 0 || p.is_null() {
            bail!("cuGetProcAddress({name}, {version}) = {rc}");
        }
        Ok(p)
    };
    let distinct = [
        "cuMemAlloc",
        "cuMemFree",
        "cuMemGetInfo",
        "cuDeviceTotalMem",
        "cuMemAllocPitch",
    ]
    .iter()
    .map(|n| Ok(get(n, 3000)? != get(n, 12000)?))
    .collect::<Result<Vec<bool>>>()?
    .into_iter()
    .all(|d| d);
    emit(format!("op=v1-variants distinct={distinct}"));
    // SAFETY: each pointer was resolved for the v1 variant, whose cuda.h prototype is spelled here.
    unsafe {
        let alloc: unsafe extern "C" fn(*mut u32, u32) -> u32 =
            std::mem::transmute(get("cuMemAlloc", 3000)?);
        let free: unsafe extern "C" fn(u32) -> u32 = std::mem::transmute(get("cuMemFree", 3000)?);
        let info: unsafe extern "C" fn(*mut u32, *mut u32) -> u32 =
            std::mem::transmute(get("cuMemGetInfo", 3000)?);
        let total: unsafe extern "C" fn(*mut u32, i32) -> u32 =
            std::mem::transmute(get("cuDeviceTotalMem", 3000)?);
        let pitch: unsafe extern "C" fn(*mut u32, *mut u32, u32, u32, u32) -> u32 =
            std::mem::transmute(get("cuMemAllocPitch", 3000)?);
        let array: unsafe extern "C" fn(*mut Ptr, *const ArrayDescV1) -> u32 =
            std::mem::transmute(get("cuArrayCreate", 3000)?);
        let destroy: unsafe extern "C" fn(Ptr) -> u32 =
            std::mem::transmute(get("cuArrayDestroy", 3000)?);
        let meminfo = |tag: &str| {
            // Guards catch a 64-bit write into these 32-bit slots.
            let mut v = [0u32, 0xdead_beef, 0, 0xdead_beef];
            let rc = info(&mut v[0], &mut v[2]);
            emit(format!(
                "op=meminfo tag={tag} rc={rc} free={} total={} guards_intact={}",
                v[0],
                v[2],
                v[1] == 0xdead_beef && v[3] == 0xdead_beef
            ));
        };
        let (mut a, mut b) = ([0u32, 0xdead_beef], 0u32);
        let rc = alloc(&mut a[0], size);
        emit(format!(
            "op=alloc kind=v1 rc={rc} guard_intact={}",
            a[1] == 0xdead_beef
        ));
        let rc2 = alloc(&mut b, more);
        emit(format!("op=alloc kind=v1 rc={rc2}"));
        meminfo("after-alloc");
        let mut t = [0u32, 0xdead_beef];
        let rc = total(&mut t[0], s.device);
        emit(format!(
            "op=totalmem rc={rc} total={} guard_intact={}",
            t[0],
            t[1] == 0xdead_beef
        ));
        emit(format!("op=free kind=v1 rc={}", free(a[0])));
        meminfo("after-free");
        let (mut p, mut pp) = (0u32, 0u32);
        let rc = pitch(&mut p, &mut pp, 4096, size / 4096, 4);
        emit(format!("op=alloc kind=pitch-v1 rc={rc} pitch={pp}"));
        meminfo("after-pitch");
        emit(format!("op=free kind=pitch-v1 rc={}", free(p)));
        let mut arr: Ptr = std::ptr::null_mut();
        let desc = ArrayDescV1 {
            width: 1024,
            height: size / 4096,
            format: 0x20,
            channels: 1,
        };
        let rc = array(&mut arr, &desc);
        emit(format!("op=alloc kind=array-v1 rc={rc}"));
        meminfo("after-array");
        emit(format!("op=free kind=array-v1 rc={}", destroy(arr)));
        meminfo("end");
    }
    Ok(())
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
#[derive(Default)]
struct NvmlMemoryV2 {
    version: u32,
    total: u64,
    reserved: u64,
    free: u64,
    used: u64,
}

fn nvml_info(index: u32) -> Result<()> {
    type Init = unsafe extern "C" fn() -> u32;
    type Handle = unsafe extern "C" fn(u32, *mut Ptr) -> u32;
    type Mem = unsafe extern "C" fn(Ptr, *mut [u64; 3]) -> u32;
    type MemV2 = unsafe extern "C" fn(Ptr, *mut NvmlMemoryV2) -> u32;
    // SAFETY: dlopen/dlsym with valid names; the NVML exports have these nvml.h prototypes.
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
        let init: Init = std::mem::transmute(sym(c"nvmlInit_v2")?);
        let handle: Handle = std::mem::transmute(sym(c"nvmlDeviceGetHandleByIndex_v2")?);
        let mem: Mem = std::mem::transmute(sym(c"nvmlDeviceGetMemoryInfo")?);
        let mem2: MemV2 = std::mem::transmute(sym(c"nvmlDeviceGetMemoryInfo_v2")?);
        if init() != 0 {
            bail!("nvmlInit_v2 failed");
        }
        let mut dev: Ptr = std::ptr::null_mut();
        let rc = handle(index, &mut dev);
        if rc != 0 {
            bail!("nvmlDeviceGetHandleByIndex_v2({index}) = {rc}");
        }
        let mut m = [0u64; 3];
        let rc = mem(dev, &mut m);
        emit(format!(
            "op=nvml v=1 index={index} rc={rc} total={} free={} used={}",
            m[0], m[1], m[2]
        ));
        // nvmlMemory_v2 version word: sizeof | 2 << 24.
        let mut m2 = NvmlMemoryV2 {
            version: std::mem::size_of::<NvmlMemoryV2>() as u32 | (2 << 24),
            ..Default::default()
        };
        let rc = mem2(dev, &mut m2);
        emit(format!(
            "op=nvml v=2 index={index} rc={rc} total={} free={} used={} reserved={}",
            m2.total, m2.free, m2.used, m2.reserved
        ));
    }
    Ok(())
}

fn main() -> Result<()> {
    let a = Args::parse();
    if let Cmd::RtldNext { symbol } = &a.cmd {
        return rtld_next(symbol);
    }
    let drv = a.resolve.load(None)?;
    let s = Session::open(drv, a.resolve.device, &[("tick", 10.0)])?;
    match a.cmd {
        Cmd::Race { threads, size } => race(&s, threads, parse_size(&size)? as usize),
        Cmd::Fork {
            parent_alloc,
            child_cap,
        } => fork(&s, &a.resolve, parse_size(&parent_alloc)?, &child_cap),
        Cmd::V1 { size, more } => v1(&s, parse_size(&size)? as u32, parse_size(&more)? as u32),
        Cmd::NvmlInfo { index } => {
            let mut p = 0u64;
            // SAFETY: out pointer to a local; 256 MiB held while NVML is queried.
            let rc = unsafe { (s.drv.cuMemAlloc)(&mut p, 256 << 20) };
            emit(format!("op=alloc rc={rc}"));
            nvml_info(index)
        }
        Cmd::Hold => hold(&s),
        Cmd::RtldNext { .. } => unreachable!("handled above"),
    }
}

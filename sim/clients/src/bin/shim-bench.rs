//! `shim-bench`: what the shim costs and how well it holds a share, on the driver it runs against
//! (the simulated one in CI; a real one on a GPU node). Prints figures; asserts nothing.
//!
//! - **Launch overhead**: the same process calls `cuLaunchKernel` of the bare driver and of the
//!   shim (loaded with `dlopen(RTLD_LOCAL)`, so it interposes nothing and forwards to the very same
//!   driver), alternating batches; reports ns per launch of each and the difference. The shim runs
//!   unthrottled (share 100): this is the fast path every launch of an unthrottled process takes.
//! - **Allocation overhead**: `cuMemAlloc_v2` + `cuMemFree_v2` of 1 MiB, bare vs shim (with a cap,
//!   so the ledger is used), on 1 thread, 8 threads, and in 8 processes at once.
//! - **Share accuracy**: `sim-function` under the shim at shares 10–90 %, alone and beside an
//!   unshimmed `sim-trainer`, each on a fresh simulated node (when `--sim` is on), run in parallel.
//!
//! Run it like the other clients (docs/simgpu.md): `LD_LIBRARY_PATH` must reach `libcuda.so.1`.
use anyhow::{anyhow, bail, Context, Result};
use clap::{Parser, Subcommand};
use cudarc::driver::sys::CUdeviceptr;
use smore_sim_clients::driver::{Driver, Resolve, Session};
use std::ffi::{c_uint, c_void, CString};
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// A child that inherits none of this process's grant-bearing variables: the overhead phase sets
/// `SMORE_MEMORY_LIMIT` and `SMORE_SM_WINDOW_MS` on itself (for the shim copies it dlopens), and a
/// user's `SMORE_ARBITER_SOCKET` must not make the bench's children register with a live arbiter.
fn child(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut c = Command::new(program);
    smore_protocol::env::scrub_inherited(&mut c);
    c
}
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
#[command(about = "Benchmarks of libsmore_shim.so: launch/allocation overhead and share accuracy")]
struct Args {
    /// Path of libsmore_shim.so (default: next to this binary, or in its deps/ directory).
    #[arg(long)]
    shim: Option<PathBuf>,
    /// Fewer, shorter rounds (a smoke run for CI).
    #[arg(long)]
    quick: bool,
    #[command(subcommand)]
    cmd: Option<Cmd>,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Everything (the default).
    All,
    /// Launch and allocation overhead only.
    Overhead,
    /// Share accuracy only (needs sim-function / sim-trainer next to this binary).
    Share,
    /// One allocation-overhead process of the 8-process run (internal).
    #[command(hide = true)]
    AllocWorker { rounds: usize, n: usize },
}

type Launch = unsafe extern "C" fn(
    *mut c_void,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    *mut c_void,
    *mut *mut c_void,
    *mut *mut c_void,
) -> u32;
type Alloc = unsafe extern "C" fn(*mut CUdeviceptr, usize) -> u32;
type Free = unsafe extern "C" fn(CUdeviceptr) -> u32;

/// The shim's hooks, looked up in a locally loaded copy.
struct Hooks {
    launch: Launch,
    alloc: Alloc,
    free: Free,
}

fn exe_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent().expect("exe dir").to_path_buf()
}

fn shim_path(arg: &Option<PathBuf>) -> Result<PathBuf> {
    if let Some(p) = arg {
        return Ok(p.clone());
    }
    let dir = exe_dir();
    [
        dir.join("libsmore_shim.so"),
        dir.join("deps/libsmore_shim.so"),
    ]
    .into_iter()
    .find(|p| p.exists())
    .ok_or_else(|| anyhow!("libsmore_shim.so not found next to {dir:?}: pass --shim PATH"))
}

fn load_hooks(path: &PathBuf) -> Result<Hooks> {
    // A cap far above any device: the allocation path does its full reserve/commit/credit work
    // without refusing anything. Set before the shim reads its environment (on first use).
    std::env::set_var("SMORE_MEMORY_LIMIT", "1TiB");
    std::env::remove_var("SMORE_SM_SHARE");
    let c = CString::new(path.to_string_lossy().as_bytes())?;
    // SAFETY: dlopen of a path; RTLD_LOCAL so the shim interposes nothing in this process.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        bail!("dlopen({path:?}) failed");
    }
    let sym = |n: &std::ffi::CStr| -> Result<*mut c_void> {
        // SAFETY: valid handle and name.
        let p = unsafe { libc::dlsym(h, n.as_ptr()) };
        if p.is_null() {
            bail!("the shim exports no {n:?}");
        }
        Ok(p)
    };
    // SAFETY: the shim's exports have the cuda.h prototypes.
    unsafe {
        Ok(Hooks {
            launch: std::mem::transmute::<*mut c_void, Launch>(sym(c"cuLaunchKernel")?),
            alloc: std::mem::transmute::<*mut c_void, Alloc>(sym(c"cuMemAlloc_v2")?),
            free: std::mem::transmute::<*mut c_void, Free>(sym(c"cuMemFree_v2")?),
        })
    }
}

/// Loads a second copy of the shim (a copy of the file, so the dynamic loader gives it its own
/// state) after setting a throttling share for it; `None` if the copy cannot be made.
fn throttled_copy(shim: &PathBuf) -> Result<Option<Hooks>> {
    let copy = std::env::temp_dir().join(format!("smore-shim-bench-{}.so", std::process::id()));
    if std::fs::copy(shim, &copy).is_err() {
        return Ok(None);
    }
    let hooks = load_hooks(&copy);
    std::env::set_var("SMORE_SM_SHARE", "99");
    std::env::set_var("SMORE_SM_WINDOW_MS", "10000");
    let _ = std::fs::remove_file(&copy);
    hooks.map(Some)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// ns per call of `n` launches of a zero-length kernel through `f`.
fn time_launches(f: Launch, func: *mut c_void, stream: *mut c_void, n: usize) -> Result<f64> {
    let mut dur: u64 = 0;
    let mut p: *mut c_void = &mut dur as *mut u64 as *mut c_void;
    let params: *mut *mut c_void = &mut p;
    let t = Instant::now();
    for _ in 0..n {
        // SAFETY: the spin kernel with its one u64 parameter, on this process's stream.
        let rc = unsafe {
            f(
                func,
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                stream,
                params,
                std::ptr::null_mut(),
            )
        };
        if rc != 0 {
            bail!("cuLaunchKernel failed with {rc}");
        }
    }
    Ok(t.elapsed().as_nanos() as f64 / n as f64)
}

/// ns per alloc + free pair of 1 MiB through (alloc, free).
fn time_allocs(alloc: Alloc, free: Free, n: usize) -> Result<f64> {
    let t = Instant::now();
    for _ in 0..n {
        let mut p: CUdeviceptr = 0;
        // SAFETY: out pointer to a local; the pointer is freed right away.
        let rc = unsafe { alloc(&mut p, 1 << 20) };
        if rc != 0 {
            bail!("cuMemAlloc_v2 failed with {rc}");
        }
        // SAFETY: as above.
        unsafe { free(p) };
    }
    Ok(t.elapsed().as_nanos() as f64 / n as f64)
}

fn session() -> Result<Session> {
    let drv = Driver::load(Resolve::Dlsym { per_thread: false }, None)?;
    Session::open(drv, 0, &[("tick", 10.0)])
}

/// Alternating bare / shim rounds; returns (bare ns, shim ns, median of per-round differences).
fn alternate(rounds: usize, mut f: impl FnMut(bool) -> Result<f64>) -> Result<(f64, f64, f64)> {
    f(false)?;
    f(true)?; // warm-up: the shim initialises on first use
    let (mut bare, mut shim, mut diff) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..rounds {
        // Alternate the order too, so drift favours neither side.
        let (b, s) = if r % 2 == 0 {
            let b = f(false)?;
            (b, f(true)?)
        } else {
            let s = f(true)?;
            (f(false)?, s)
        };
        bare.push(b);
        shim.push(s);
        diff.push(s - b);
    }
    Ok((median(&mut bare), median(&mut shim), median(&mut diff)))
}

fn overhead(hooks: &Hooks, shim: &PathBuf, quick: bool) -> Result<()> {
    let s = session()?;
    let spin = s.function("smore_sim_spin")?;
    let stream = s.new_stream()?;
    let (rounds, n) = if quick { (6, 2_000) } else { (30, 20_000) };
    let bare_launch: Launch = s.drv.cuLaunchKernel;
    let (b, sh, d) = alternate(rounds, |shim| {
        let f = if shim { hooks.launch } else { bare_launch };
        let r = time_launches(f, spin, stream, n);
        s.sync(stream)?;
        r
    })?;
    println!(
        "launch  bare_ns={b:.1} shim_ns={sh:.1} added_ns={d:.1} ratio={:.3}  (unthrottled, {rounds} rounds x {n}, median)",
        sh / b
    );
    // The throttled path with budget available: a second, independent copy of the shim whose
    // runtime starts at share 99 % of a 10 s window (zero-length kernels never exhaust it).
    if let Some(throttled) = throttled_copy(shim)? {
        let (b, sh, d) = alternate(rounds, |shim| {
            let f = if shim { throttled.launch } else { bare_launch };
            let r = time_launches(f, spin, stream, n);
            s.sync(stream)?;
            r
        })?;
        println!(
            "launchT bare_ns={b:.1} shim_ns={sh:.1} added_ns={d:.1} ratio={:.3}  (share 99 %, budget available: gate admission, no sleep)",
            sh / b
        );
        // The throttled path asks the driver for the current device (cuCtxGetDevice) once per
        // launch: its cost is the driver's, shown here so the shim's own share can be told apart.
        type CtxGetDevice = unsafe extern "C" fn(*mut i32) -> u32;
        let h = smore_sim_clients::driver::libcuda_handle()?;
        // SAFETY: dlsym on the driver handle; the export has this cuda.h prototype.
        let get: CtxGetDevice = unsafe {
            let p = libc::dlsym(h, c"cuCtxGetDevice".as_ptr());
            if p.is_null() {
                bail!("no cuCtxGetDevice");
            }
            std::mem::transmute::<*mut c_void, CtxGetDevice>(p)
        };
        let t = Instant::now();
        let mut dev = 0i32;
        for _ in 0..n {
            // SAFETY: out pointer to a local.
            unsafe { get(&mut dev) };
        }
        println!(
            "ctxdev  driver_ns={:.1}  (one cuCtxGetDevice of this driver, part of launchT)",
            t.elapsed().as_nanos() as f64 / n as f64
        );
    }
    let (bare_alloc, bare_free): (Alloc, Free) = (s.drv.cuMemAlloc, s.drv.cuMemFree);
    let n = n / 4;
    let (b, sh, d) = alternate(rounds, |shim| {
        if shim {
            time_allocs(hooks.alloc, hooks.free, n)
        } else {
            time_allocs(bare_alloc, bare_free, n)
        }
    })?;
    println!(
        "alloc1  bare_ns={b:.1} shim_ns={sh:.1} added_ns={d:.1} ratio={:.3}  (1 MiB alloc+free, 1 thread)",
        sh / b
    );
    // 8 threads at once, each timing its own pairs.
    let ctx = s.ctx as usize;
    let set = s.drv.cuCtxSetCurrent;
    let (ha, hf) = (hooks.alloc as usize, hooks.free as usize);
    let (ba, bf) = (bare_alloc as usize, bare_free as usize);
    let (b, sh, d) = alternate(rounds.min(10), |shim| {
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(8));
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let barrier = barrier.clone();
                std::thread::spawn(move || -> Result<f64> {
                    // SAFETY: this process's context; addresses of functions with these types.
                    let (a, f) = unsafe {
                        set(ctx as *mut c_void);
                        if shim {
                            (
                                std::mem::transmute::<usize, Alloc>(ha),
                                std::mem::transmute::<usize, Free>(hf),
                            )
                        } else {
                            (
                                std::mem::transmute::<usize, Alloc>(ba),
                                std::mem::transmute::<usize, Free>(bf),
                            )
                        }
                    };
                    barrier.wait();
                    time_allocs(a, f, n)
                })
            })
            .collect();
        let mut per: Vec<f64> = Vec::new();
        for h in handles {
            per.push(h.join().map_err(|_| anyhow!("thread panicked"))??);
        }
        Ok(median(&mut per))
    })?;
    println!(
        "alloc8t bare_ns={b:.1} shim_ns={sh:.1} added_ns={d:.1} ratio={:.3}  (1 MiB alloc+free, 8 threads at once, per thread)",
        sh / b
    );
    Ok(())
}

fn alloc_worker(hooks: &Hooks, rounds: usize, n: usize) -> Result<()> {
    let s = session()?;
    let (ba, bf): (Alloc, Free) = (s.drv.cuMemAlloc, s.drv.cuMemFree);
    let (b, sh, d) = alternate(rounds, |shim| {
        if shim {
            time_allocs(hooks.alloc, hooks.free, n)
        } else {
            time_allocs(ba, bf, n)
        }
    })?;
    println!("worker bare_ns={b:.1} shim_ns={sh:.1} added_ns={d:.1}");
    Ok(())
}

fn eight_processes(shim: &PathBuf, quick: bool) -> Result<()> {
    let (rounds, n) = if quick { ("4", "500") } else { ("10", "5000") };
    let children: Vec<_> = (0..8)
        .map(|_| {
            child(std::env::current_exe()?)
                .arg("--shim")
                .arg(shim)
                .args(["alloc-worker", rounds, n])
                .stdout(Stdio::piped())
                .spawn()
                .context("spawning an alloc worker")
        })
        .collect::<Result<_>>()?;
    let (mut b, mut s, mut d) = (Vec::new(), Vec::new(), Vec::new());
    for c in children {
        let out = c.wait_with_output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let field = |k: &str| -> Result<f64> {
            text.split_whitespace()
                .find_map(|t| t.strip_prefix(k))
                .ok_or_else(|| anyhow!("worker printed no {k}: {text}"))?
                .parse()
                .map_err(|e| anyhow!("{k}: {e}"))
        };
        b.push(field("bare_ns=")?);
        s.push(field("shim_ns=")?);
        d.push(field("added_ns=")?);
    }
    let (b, s, d) = (median(&mut b), median(&mut s), median(&mut d));
    println!(
        "alloc8p bare_ns={b:.1} shim_ns={s:.1} added_ns={d:.1} ratio={:.3}  (1 MiB alloc+free, 8 processes at once, median process)",
        s / b
    );
    Ok(())
}

/// Requests/s of a sim-function run → fraction of the GPU it got (requests × kernels × µs).
fn function_share(out: &str, kernels: f64, kernel_us: f64) -> Result<f64> {
    let rps: f64 = out
        .lines()
        .find(|l| l.starts_with("function"))
        .and_then(|l| {
            l.split_whitespace()
                .find_map(|t| t.strip_prefix("requests_per_s="))
        })
        .ok_or_else(|| anyhow!("no function summary in {out:?}"))?
        .parse()?;
    Ok(rps * kernels * kernel_us / 1e6)
}

fn share_table(shim: &PathBuf, quick: bool) -> Result<()> {
    let dir = exe_dir();
    let (function, trainer) = (dir.join("sim-function"), dir.join("sim-trainer"));
    let secs = if quick { "1" } else { "5" };
    let shares: Vec<u32> = if quick {
        vec![25, 75]
    } else {
        (1..=9).map(|i| i * 10).collect()
    };
    let tmp = std::env::temp_dir().join(format!("smore-shim-bench-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    let mut runs = Vec::new();
    for &share in &shares {
        for beside in [false, true] {
            // A fresh simulated node per run (ignored by a real driver).
            let state = tmp.join(format!("node-{share}-{beside}.state"));
            let trainer_child = if beside {
                Some(
                    child(&trainer)
                        .env("SMORE_SIM_STATE", &state)
                        .args([
                            "--kernel-us",
                            "250",
                            "--kernels",
                            "1",
                            "--quiet",
                            "--seconds",
                        ])
                        .arg(format!("{}", secs.parse::<f64>()? + 1.0))
                        .stdout(Stdio::null())
                        .spawn()?,
                )
            } else {
                None
            };
            if beside {
                std::thread::sleep(Duration::from_millis(200));
            }
            let f = child(&function)
                .env("SMORE_SIM_STATE", &state)
                .env("LD_PRELOAD", shim)
                .env("SMORE_SM_SHARE", share.to_string())
                .args([
                    "--kernel-us",
                    "250",
                    "--kernels",
                    "8",
                    "--quiet",
                    "--seconds",
                    secs,
                ])
                .stdout(Stdio::piped())
                .spawn()?;
            runs.push((share, beside, f, trainer_child));
        }
    }
    println!("share   alone_%  beside_trainer_%   (sim-function 8 x 250 us requests back to back; {secs} s; GPU share from completed work)");
    let mut rows: Vec<(u32, f64, f64)> = Vec::new();
    for (share, beside, f, t) in runs {
        let out = f.wait_with_output()?;
        if let Some(mut t) = t {
            let _ = t.wait();
        }
        let got = function_share(&String::from_utf8_lossy(&out.stdout), 8.0, 250.0)? * 100.0;
        match rows.iter_mut().find(|r| r.0 == share) {
            Some(r) if beside => r.2 = got,
            Some(r) => r.1 = got,
            None if beside => rows.push((share, f64::NAN, got)),
            None => rows.push((share, got, f64::NAN)),
        }
    }
    for (share, alone, beside) in rows {
        println!("share={share:<3} alone={alone:.1} beside_trainer={beside:.1}");
    }
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(())
}

fn main() -> Result<()> {
    let a = Args::parse();
    let shim = shim_path(&a.shim)?;
    match a.cmd.unwrap_or(Cmd::All) {
        Cmd::AllocWorker { rounds, n } => alloc_worker(&load_hooks(&shim)?, rounds, n),
        Cmd::Overhead => {
            overhead(&load_hooks(&shim)?, &shim, a.quick)?;
            eight_processes(&shim, a.quick)
        }
        Cmd::Share => share_table(&shim, a.quick),
        Cmd::All => {
            overhead(&load_hooks(&shim)?, &shim, a.quick)?;
            eight_processes(&shim, a.quick)?;
            share_table(&shim, a.quick)
        }
    }
}

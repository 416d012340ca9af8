//! `smore bench arbiter`: the arbiter's own CPU use per second of wall time with `--functions N`
//! idle functions alive, `status` latency, registration latency and throughput, and
//! grant-change propagation time, against a real `smore arbiter` process on a simulated node.
//!
//! `smore bench shim`: runs the shim benchmark (`shim-bench`, built with the workspace) on a
//! simulated node, or on the real driver with `--real-gpu`. It prints figures (ns added per
//! launch and per allocation, shim vs bare on the same driver in the same run, and share
//! accuracy); it asserts nothing. See docs/shim.md for what each figure means.

use anyhow::{Context, Result};
use smore_protocol::install as artifacts;

/// Options of `smore bench shim`.
#[derive(clap::Args, Debug)]
pub struct BenchShimArgs {
    /// Fewer, shorter rounds.
    #[arg(long)]
    pub quick: bool,
    /// Use the real CUDA driver and NVML instead of a simulated node.
    #[arg(long)]
    pub real_gpu: bool,
    /// What to measure: all, overhead or share.
    #[arg(default_value = "all", value_parser = ["all", "overhead", "share"])]
    pub what: String,
}

/// `smore bench shim`: runs the installed `shim-bench` program and prints its figures.
pub fn shim(a: BenchShimArgs) -> Result<()> {
    let bench = artifacts::require("shim-bench")?;
    let mut cmd = std::process::Command::new(&bench);
    // A user's SMORE_ARBITER_SOCKET or caps must not reach the bench (or, through it, its
    // children): figures would be of a grant the user set, and children would register with the
    // live arbiter.
    smore_protocol::env::scrub_inherited(&mut cmd);
    if a.quick {
        cmd.arg("--quick");
    }
    cmd.arg(&a.what);
    let _tmp;
    if !a.real_gpu {
        let t = tempfile::Builder::new().prefix("smore-bench-").tempdir()?;
        let node = crate::demo::simulated_node(t.path())?;
        cmd.envs(node.env.iter().map(|(k, v)| (k, v)));
        eprintln!(
            "smore bench shim: simulated GPU in {} (figures are the simulator's, not a GPU's)",
            node.dir.display()
        );
        _tmp = t;
    }
    let status = cmd
        .status()
        .with_context(|| format!("running {}", bench.display()))?;
    if !status.success() {
        anyhow::bail!("shim-bench exited with {status}");
    }
    Ok(())
}

/// Options of `smore bench arbiter`.
#[derive(clap::Args, Debug)]
pub struct BenchArbiterArgs {
    /// Sequential registrations (and share changes) to time.
    #[arg(long, default_value_t = 500)]
    pub rounds: usize,
    /// Clients registering at once for the throughput figure.
    #[arg(long, default_value_t = 200)]
    pub concurrent: usize,
    /// Idle functions kept alive under `smore run` while measuring (each holds a context and
    /// 32 MiB on the simulated GPU and sleeps).
    #[arg(long, default_value_t = 0)]
    pub functions: usize,
    /// Seconds over which the arbiter's CPU use is measured.
    #[arg(long, default_value_t = 10.0)]
    pub measure_s: f64,
}

/// User + system CPU time of `pid`, seconds.
fn cpu_seconds(pid: u32) -> Result<f64> {
    smore_arbiter::proc::cpu_seconds(pid).context("reading the arbiter's CPU time")
}

/// Idle functions that hold a simulated context: the simulated GPU admits at most 128
/// processes per node (sim/), so functions beyond this many are registered but context-less
/// (`smore run -- sleep`), which still costs the arbiter a connection, a grant and a watched
/// process each.
const MAX_CONTEXT_FUNCTIONS: usize = 100;

/// Starts `n` idle functions and waits until each is ready: the first
/// [`MAX_CONTEXT_FUNCTIONS`] are `smore run --memory 384MiB … -- sim-function --serve
/// --model-memory-mib 32` (a context and 32 MiB), the rest `smore run … -- sleep`. The children
/// are killed when the returned guards drop.
fn idle_functions(
    node: &crate::demo::Node,
    socket: &std::path::Path,
    n: usize,
) -> Result<Vec<Idle>> {
    use std::io::BufRead;
    let smore = std::env::current_exe()?;
    let function = artifacts::require("sim-function")?;
    let mut started = Vec::with_capacity(n);
    for i in 0..n {
        let mut cmd = node.command(&smore);
        cmd.args(["run", "--memory", "384MiB", "--function"])
            .arg(format!("idle{i}"))
            .arg("--socket")
            .arg(socket)
            .arg("--");
        if i < MAX_CONTEXT_FUNCTIONS {
            cmd.arg(&function)
                .args(["--serve", "--model-memory-mib", "32", "--load-ms", "0"]);
        } else {
            cmd.args(["sleep", "100000"]);
        }
        let mut child = cmd
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::fs::File::create(
                node.dir.join(format!("idle{i}.log")),
            )?)
            .spawn()
            .with_context(|| format!("starting idle function {i}"))?;
        let out = child.stdout.take().context("no stdout")?;
        started.push((Idle(child), out));
    }
    let mut ready = Vec::with_capacity(n);
    for (i, (child, out)) in started.into_iter().enumerate() {
        if i < MAX_CONTEXT_FUNCTIONS {
            let mut line = String::new();
            std::io::BufReader::new(out).read_line(&mut line)?;
            if line.trim() != "ready" {
                let log = std::fs::read_to_string(node.dir.join(format!("idle{i}.log")))
                    .unwrap_or_default();
                anyhow::bail!("idle function {i} did not start (said {line:?}): {log}");
            }
        }
        ready.push(child);
    }
    Ok(ready)
}

/// An idle function process (killed on drop; its stdin stays open until then).
struct Idle(std::process::Child);

impl Drop for Idle {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn percentiles(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    let q = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
    (q(0.5), q(0.99), v[v.len() - 1])
}

fn register(
    c: &smore_protocol::conn::Client,
    name: &str,
) -> Result<(smore_protocol::wire::Grant, Option<std::os::fd::OwnedFd>)> {
    use smore_protocol::wire::{Register, Reply, Request};
    let (r, fd) = c.call_with_fd(Request::Register(Register {
        function: name.into(),
        model: None,
        slo_ms: None,
        memory: Some(1 << 20),
        resume: None,
        gpu: None,
        exec: true,
        gpus: None,
    }))?;
    match r {
        Reply::Granted(g) => Ok((g, fd)),
        other => anyhow::bail!("registration answered {other:?}"),
    }
}

/// `smore bench arbiter`: starts an arbiter on a simulated node and times registrations and share
/// changes against it.
pub fn arbiter(a: BenchArbiterArgs) -> Result<()> {
    use smore_protocol::conn::Client;
    use smore_protocol::wire::{Reply, Request};
    use std::time::{Duration, Instant};
    let t = tempfile::Builder::new().prefix("smore-bench-").tempdir()?;
    let mut node = crate::demo::simulated_node(t.path())?;
    // An 80 GiB GPU, or larger for many idle functions: each holds a simulated context
    // (300 MiB) and 32 MiB under a 384 MiB cap.
    let gib = 80u64.max((a.functions as u64 * 384).div_ceil(1024) * 100 / 90 + 1);
    node.env
        .push(("SMORE_SIM_MEMORY".to_string(), format!("{gib}GiB")));
    let socket = node.dir.join("arbiter.sock");
    // The bench registers its concurrent and sequential rounds from its own process: lift the
    // one-grant-per-process rule for this arbiter only (a node keeps the default of 1).
    let cfg = node.dir.join("node.toml");
    std::fs::write(&cfg, "[functions]\ngrants_per_process = 100000\n")?;
    let mut child = node
        .command(std::env::current_exe()?)
        .args(["arbiter", "--config"])
        .arg(&cfg)
        .arg("--socket")
        .arg(&socket)
        .arg("--state-dir")
        .arg(node.dir.join("state"))
        .stderr(std::fs::File::create(node.dir.join("arbiter.log"))?)
        .spawn()?;
    let t0 = Instant::now();
    while Client::connect(&socket).is_err() {
        if t0.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            anyhow::bail!("the arbiter did not start");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let result = (|| -> Result<()> {
        println!(
            "smore bench arbiter — simulated node, arbiter at {}",
            socket.display()
        );
        // 0. The arbiter's own cost with `functions` idle functions alive.
        let t = Instant::now();
        let idle = idle_functions(&node, &socket, a.functions)?;
        let op = Client::connect(&socket)?;
        let live = |op: &Client| -> Result<usize> {
            match op.call(Request::Status)? {
                Reply::Status { snapshot } => Ok(snapshot["gpus"].as_array().map_or(0, |g| {
                    g.iter()
                        .map(|g| g["functions"].as_array().map_or(0, Vec::len))
                        .sum::<usize>()
                })),
                other => anyhow::bail!("status answered {other:?}"),
            }
        };
        while live(&op)? < a.functions {
            if t.elapsed() > Duration::from_secs(600) {
                anyhow::bail!("the idle functions did not all register");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        if a.functions > 0 {
            println!(
                "  {} idle functions registered in {:.1} s ({} with a simulated context)",
                a.functions,
                t.elapsed().as_secs_f64(),
                a.functions.min(MAX_CONTEXT_FUNCTIONS)
            );
        }
        std::thread::sleep(Duration::from_secs(2));
        let (c0, w0) = (cpu_seconds(child.id())?, Instant::now());
        std::thread::sleep(Duration::from_secs_f64(a.measure_s));
        let cpu = (cpu_seconds(child.id())? - c0) / w0.elapsed().as_secs_f64();
        let op = Client::connect(&socket)?;
        let mut status = Vec::new();
        let mut live = 0;
        for _ in 0..50 {
            let s = Instant::now();
            match op.call(Request::Status)? {
                Reply::Status { snapshot } => {
                    live = snapshot["gpus"].as_array().map_or(0, |g| {
                        g.iter()
                            .map(|g| g["functions"].as_array().map_or(0, Vec::len))
                            .sum::<usize>()
                    });
                }
                other => anyhow::bail!("status answered {other:?}"),
            }
            status.push(s.elapsed().as_secs_f64() * 1e3);
        }
        if live < a.functions {
            anyhow::bail!(
                "status shows {live} functions, {} were started",
                a.functions
            );
        }
        let (sp50, sp99, _) = percentiles(status);
        // 1. Sequential: connect + register + receive the page fd, then close (release).
        let mut lat = Vec::new();
        for i in 0..a.rounds {
            let s = Instant::now();
            let c = Client::connect(&socket)?;
            register(&c, &format!("seq{i}"))?;
            lat.push(s.elapsed().as_secs_f64() * 1e6);
        }
        let (p50, p99, max) = percentiles(lat);
        println!("  registration latency (connect + register + page fd), sequential: p50 {p50:.0} µs, p99 {p99:.0} µs, max {max:.0} µs");
        println!(
            "  functions={} arbiter_cpu={:.2}% of a core  status p50 {sp50:.2} ms p99 {sp99:.2} ms  registration p99 {:.2} ms",
            a.functions,
            cpu * 100.0,
            p99 / 1e3
        );
        // 2. Concurrent: N clients at once.
        std::thread::sleep(Duration::from_millis(200));
        let s = Instant::now();
        let hs: Vec<_> = (0..a.concurrent)
            .map(|i| {
                let socket = socket.clone();
                std::thread::spawn(move || -> Result<(Client, f64)> {
                    let c = Client::connect(&socket)?;
                    register(&c, &format!("par{i}"))?;
                    Ok((c, s.elapsed().as_secs_f64()))
                })
            })
            .collect();
        let mut held = Vec::new();
        let mut last: f64 = 0.0;
        for h in hs {
            let (c, t) = h
                .join()
                .map_err(|_| anyhow::anyhow!("client thread panicked"))??;
            last = last.max(t);
            held.push(c);
        }
        println!(
            "  {} concurrent registrations: all served in {:.1} ms ({:.0} registrations/s)",
            a.concurrent,
            last * 1e3,
            a.concurrent as f64 / last
        );
        drop(held);
        // 3. Grant-change propagation: `set_share` sent → new value visible in the client's
        // read-only mapping (what the shim reads on its next launch).
        // The function is a process of its own (`smore run -- sleep`), its page read through
        // /proc/<pid>/fd: a function is never an operator, and this process registered the
        // rounds above (their releases must have landed before it asks as the operator).
        let op = Client::connect(&socket)?;
        let me = std::process::id();
        let t = Instant::now();
        loop {
            let mine = match op.call(Request::Status)? {
                Reply::Status { snapshot } => {
                    snapshot["gpus"].as_array().into_iter().flatten().any(|g| {
                        g["functions"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .any(|f| f["pid"] == me)
                    })
                }
                other => anyhow::bail!("status answered {other:?}"),
            };
            if !mine {
                break;
            }
            if t.elapsed() > Duration::from_secs(30) {
                anyhow::bail!("the bench's own registrations were not released");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut holder = node
            .command(std::env::current_exe()?)
            .args([
                "run",
                "--function",
                "propagation",
                "--memory",
                "1MiB",
                "--",
                "sleep",
                "600",
            ])
            .env(smore_protocol::wire::ENV_SOCKET, &socket)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()?;
        let found = (|| -> Result<(u64, std::os::fd::OwnedFd)> {
            let t = Instant::now();
            loop {
                if let Reply::Status { snapshot } = op.call(Request::Status)? {
                    let id = snapshot["gpus"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .find_map(|g| {
                            g["functions"].as_array()?.iter().find_map(|f| {
                                (f["function"] == "propagation")
                                    .then(|| f["id"].as_u64())
                                    .flatten()
                            })
                        });
                    // Registered before it execs the command, whose environment names the fd.
                    let env = std::fs::read(format!("/proc/{}/environ", holder.id()))?;
                    let key = format!("{}=", smore_protocol::wire::ENV_GRANT_FD);
                    let n = String::from_utf8_lossy(&env)
                        .split('\0')
                        .find_map(|v| v.strip_prefix(&key).map(str::to_string));
                    if let (Some(id), Some(n)) = (id, n) {
                        let f = std::fs::File::open(format!("/proc/{}/fd/{n}", holder.id()))?;
                        return Ok((id, f.into()));
                    }
                }
                if t.elapsed() > Duration::from_secs(30) {
                    anyhow::bail!("the propagation function did not register");
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })();
        let (instance, fd) = match found {
            Ok(x) => x,
            Err(e) => {
                let _ = holder.kill();
                let _ = holder.wait();
                return Err(e);
            }
        };
        let view = smore_arbiter::grantpage::PageView::map(fd)?;
        let mut prop = Vec::new();
        for i in 0..a.rounds {
            let share = 10 + (i % 80) as u32;
            let s = Instant::now();
            match op.call(Request::SetShare { instance, share })? {
                Reply::Ok => {}
                other => {
                    let _ = holder.kill();
                    let _ = holder.wait();
                    anyhow::bail!("set_share answered {other:?}")
                }
            }
            while view.page().share(0) != share {
                std::hint::spin_loop();
            }
            prop.push(s.elapsed().as_secs_f64() * 1e6);
        }
        let (p50, p99, max) = percentiles(prop);
        println!("  grant change → visible in the function's page (incl. the operator's round trip): p50 {p50:.0} µs, p99 {p99:.0} µs, max {max:.0} µs");
        let _ = holder.kill();
        let _ = holder.wait();
        drop(idle);
        Ok(())
    })();
    let _ = child.kill();
    let _ = child.wait();
    result
}

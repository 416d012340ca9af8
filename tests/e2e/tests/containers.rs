//! Functions in containers (docs/kubernetes.md): `smore cdi generate` on the simulated node, and
//! one scenario run three ways — on the host, in its own pid namespace (`unshare --pid`), and in
//! a podman container that gets the shim through the CDI spec (`--device <kind>=1` of two GPUs:
//! it must land on GPU 1). Each way the
//! function's allocations are capped, its launches are gated by the share the arbiter writes into
//! its grant page, and the arbiter attributes it (NVML memory, the shim check in
//! `/proc/<pid>/maps`) to the process's pid in the arbiter's namespace, never to training.
//!
//! The namespace and podman variants print why they skip when the tool or the privilege is
//! missing (`unshare --pid` needs CAP_SYS_ADMIN; podman runs rootful here, with runc).

use smore_e2e::*;
use smore_protocol::wire::{Reply, Request};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const MIB: u64 = 1 << 20;
/// The function's cap.
const CAP: &str = "1GiB";
/// Kernels of the gated phase: `KERNELS` × `KERNEL_US` of GPU time alone (300 ms).
const KERNELS: u32 = 150;
const KERNEL_US: u32 = 2000;
/// The share the operator sets before the gated phase, percent: the phase then takes about
/// 100 / SHARE × its solo time.
const SHARE: u32 = 25;

/// The probe's script: 512 MiB fits the 1 GiB cap, 700 MiB more does not; then, once the test
/// has set the share (the probe sleeps for it), the gated kernels; then it holds still.
fn script() -> Vec<String> {
    vec![
        "alloc:v2:512MiB".into(),
        "alloc:v2:700MiB".into(),
        "ready".into(),
        "sleep:2000".into(),
        format!("run:{KERNEL_US}:{KERNELS}"),
        "ready".into(),
        "sleep:60000".into(),
    ]
}

/// What a function process showed and what the arbiter saw of it.
struct Seen {
    allocs: Vec<Fields>,
    run_wall_ms: f64,
    /// The function's entry in the arbiter's status.
    function: serde_json::Value,
    /// Every GPU's training processes in the arbiter's status.
    training: Vec<serde_json::Value>,
}

/// Reads `child`'s stdout lines until the `n`-th `op=ready`, collecting the `key=value` lines.
fn until_ready(out: &mut impl BufRead, n: usize, lines: &mut Vec<Fields>, log: &mut String) {
    let mut seen = 0;
    let mut line = String::new();
    while seen < n {
        line.clear();
        let got = out
            .read_line(&mut line)
            .expect("reading the function's output");
        assert!(got > 0, "the function exited early:\n{log}");
        log.push_str(&line);
        if line.trim() == "op=ready" {
            seen += 1;
        }
        lines.extend(parse_lines(&line));
    }
}

/// Runs the scenario with the probe started by `cmd` (stdout piped), named `function`.
fn scenario(arb: &Arbiter, function: &str, mut cmd: Command) -> (Seen, Child) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawning the function");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let (mut lines, mut log) = (Vec::new(), String::new());
    until_ready(&mut out, 1, &mut lines, &mut log);
    let mine = |a: &Arbiter| {
        a.functions()
            .into_iter()
            .find(|f| f["function"] == function)
    };
    wait_until("the function registered", Duration::from_secs(10), || {
        mine(arb).is_some()
    });
    let id = mine(arb).unwrap()["id"].as_u64().unwrap();
    match arb.call(Request::SetShare {
        instance: id,
        share: SHARE,
    }) {
        Reply::Ok => {}
        r => panic!("set share answered {r:?}"),
    }
    until_ready(&mut out, 1, &mut lines, &mut log);
    let run = ops(&lines, "run")[0].clone();
    // The arbiter's NVML view catches up within a few reconcile rounds (50 ms here).
    wait_until(
        "the arbiter saw the function's memory and shim",
        Duration::from_secs(10),
        || {
            mine(arb).is_some_and(|f| {
                f["nvml_used"].as_u64().unwrap_or(0) >= 512 * MIB && f["shim_loaded"] == true
            })
        },
    );
    let status = arb.status();
    let gpus = status["gpus"].as_array().unwrap();
    let function = gpus
        .iter()
        .flat_map(|g| g["functions"].as_array().unwrap())
        .find(|f| f["function"] == function)
        .cloned()
        .unwrap();
    let seen = Seen {
        allocs: ops(&lines, "alloc").into_iter().cloned().collect(),
        run_wall_ms: num(&run, "wall_ms"),
        training: gpus.iter().map(|g| g["training"].clone()).collect(),
        function,
    };
    (seen, child)
}

/// `NSpid` of `/proc/<pid>/status`: the process's pid in each namespace, outermost first.
fn nspid(pid: u32) -> Vec<u32> {
    let st = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    st.lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .map(|l| l.split_whitespace().map(|f| f.parse().unwrap()).collect())
        .unwrap_or_default()
}

/// The checks every variant must pass; `inner` is the pid the function has in its own
/// namespace when it runs in one (None on the host).
fn assert_capped_gated_attributed(s: &Seen, inner: Option<u32>, ctx: &str) {
    assert_eq!(s.allocs[0]["rc"], "0", "{ctx}: 512 MiB under the cap");
    assert_eq!(
        s.allocs[1]["rc"], "2",
        "{ctx}: 512 + 700 MiB passes the cap"
    );
    let solo_ms = (KERNELS * KERNEL_US) as f64 / 1000.0;
    // At a 25 % share the phase takes ~4 × its solo time; 2 × leaves room for a loaded machine
    // while an ungated run (1 ×, plus launch overheads) cannot reach it.
    assert!(
        s.run_wall_ms >= 2.0 * solo_ms,
        "{ctx}: {KERNELS} × {KERNEL_US} µs at a {SHARE} % share took {} ms (solo {solo_ms} ms): not gated",
        s.run_wall_ms
    );
    let pid = s.function["pid"].as_u64().unwrap() as u32;
    let ns = nspid(pid);
    match inner {
        None => assert_eq!(ns, [pid], "{ctx}: a host process"),
        Some(inner) => assert_eq!(
            ns,
            [pid, inner],
            "{ctx}: the arbiter names the function by its host pid {pid}, whose innermost pid is {inner}"
        ),
    }
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
    assert!(
        exe.to_string_lossy().ends_with("sim-probe"),
        "{ctx}: pid {pid} is {exe:?}"
    );
    assert!(
        s.training
            .iter()
            .all(|t| t.as_array().is_some_and(|t| t.is_empty())),
        "{ctx}: the function is not training: {:?}",
        s.training
    );
}

fn finish(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn a_function_on_the_host_and_one_in_its_own_pid_namespace_are_capped_gated_and_attributed() {
    let sim = SimGpu::exact(1, "8GiB");
    let arb = Arbiter::new(&sim, "");
    let env = |name: &'static str| {
        [
            (
                "SMORE_ARBITER_SOCKET",
                arb.socket.to_str().unwrap().to_owned(),
            ),
            ("SMORE_MEMORY_LIMIT", CAP.to_owned()),
            ("SMORE_FUNCTION", name.to_owned()),
        ]
    };
    let probe = bin("sim-probe");
    let host = {
        let mut c = sim.shimmed(&probe, &[]);
        c.envs(env("on-host")).args(script());
        c
    };
    let (seen, child) = scenario(&arb, "on-host", host);
    assert_capped_gated_attributed(&seen, None, "host");
    finish(child);

    let can = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "true"])
        .output();
    match can {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            eprintln!(
                "SKIPPED the pid-namespace variant: `unshare --pid --fork --mount-proc true` failed ({}; it needs CAP_SYS_ADMIN): {}",
                o.status,
                String::from_utf8_lossy(&o.stderr).trim()
            );
            return;
        }
        Err(e) => {
            eprintln!("SKIPPED the pid-namespace variant: no `unshare` (util-linux): {e}");
            return;
        }
    }
    let mut ns = sim.command("unshare");
    ns.args(["--pid", "--fork", "--mount-proc"])
        .env("LD_PRELOAD", shim_lib())
        .envs(env("in-pidns"))
        .arg(&probe)
        .args(script());
    let (seen, child) = scenario(&arb, "in-pidns", ns);
    // `unshare --fork` makes the probe pid 1 of the new namespace.
    assert_capped_gated_attributed(&seen, Some(1), "pid namespace");
    finish(child);
}

#[test]
fn cdi_generate_describes_the_simulated_node() {
    let sim = SimGpu::exact(2, "8GiB");
    let arb = Arbiter::new(&sim, "failure_policy = \"fail-closed\"");
    let out = sim.dir().join("cdi/smore.json");
    let r = arb
        .smore()
        .args(["cdi", "generate", "--config"])
        .arg(&arb.cfg)
        .arg("--output")
        .arg(&out)
        .output()
        .unwrap();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let spec: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let names: Vec<&str> = spec["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["0", "1", "all"]);
    let env: Vec<&str> = spec["containerEdits"]["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    assert!(env.contains(&"SMORE_ARBITER_SOCKET=/run/smore/arbiter.sock"));
    assert!(env.contains(&"SMORE_FAILURE=closed"));
    let state = format!("SMORE_SIM_STATE={}", sim.state_path().display());
    assert!(env.contains(&state.as_str()), "{env:?}");
    let mounts = spec["containerEdits"]["mounts"].as_array().unwrap();
    let host_of = |target: &str| -> PathBuf {
        let m = mounts
            .iter()
            .find(|m| m["containerPath"] == target)
            .unwrap_or_else(|| panic!("no mount at {target}: {mounts:?}"));
        PathBuf::from(m["hostPath"].as_str().unwrap())
    };
    // The shim mounted is the one the arbiter checks for: the same file.
    assert_eq!(
        host_of("/usr/local/lib/smore/libsmore_shim.so"),
        std::fs::canonicalize(shim_lib()).unwrap()
    );
    assert_eq!(host_of("/run/smore"), arb.socket.parent().unwrap());
    assert_eq!(
        spec["devices"][1]["containerEdits"]["env"],
        serde_json::json!(["SMORE_GPUS=1", "CUDA_VISIBLE_DEVICES=1"])
    );
    // A kind CDI would reject is refused before anything is written.
    let r = arb
        .smore()
        .args(["cdi", "generate", "--kind", "not a kind", "--config"])
        .arg(&arb.cfg)
        .output()
        .unwrap();
    assert!(!r.status.success());
    assert!(String::from_utf8_lossy(&r.stderr).contains("<vendor>/<class>"));
}

/// A podman set up for this test alone: its own storage, run root and containers.conf (runc,
/// `default_ulimits = []` — without it podman fails to set the default ulimits here), an image
/// imported from a minimal rootfs, and a CDI spec of a kind no other spec uses. Removed on drop.
struct Podman {
    dir: tempfile::TempDir,
    spec: PathBuf,
    kind: String,
    containers: Vec<String>,
}

/// The image's name.
const IMAGE: &str = "localhost/smore-e2e-function:1";

impl Podman {
    /// None (with the reason printed) when podman cannot run containers here.
    fn new() -> Option<Podman> {
        let skip = |why: String| {
            eprintln!("SKIPPED the podman variant: {why}");
            None
        };
        match Command::new("podman").arg("--version").output() {
            Ok(o) if o.status.success() => {}
            Ok(o) => return skip(format!("`podman --version` failed: {}", o.status)),
            Err(e) => {
                return skip(format!(
                    "no podman ({e}); Debian: apt-get install podman runc"
                ))
            }
        }
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return skip("podman runs rootful in this test; run it as root".into());
        }
        let dir = tempfile::Builder::new()
            .prefix("smore-podman-")
            .tempdir()
            .ok()?;
        std::fs::write(
            dir.path().join("containers.conf"),
            "[containers]\ndefault_ulimits = []\n[engine]\nruntime = \"runc\"\ncgroup_manager = \"cgroupfs\"\nevents_logger = \"file\"\n",
        )
        .ok()?;
        let kind = format!("e2e{}.smore.dev/gpu", std::process::id());
        let spec = PathBuf::from(format!(
            "/var/run/cdi/smore-e2e-{}.json",
            std::process::id()
        ));
        Some(Podman {
            dir,
            spec,
            kind,
            containers: Vec::new(),
        })
    }

    /// `podman` with this test's storage and configuration.
    fn cmd(&self) -> Command {
        let d = self.dir.path();
        let mut c = Command::new("podman");
        c.env("CONTAINERS_CONF", d.join("containers.conf"))
            .arg("--root")
            .arg(d.join("storage"))
            .arg("--runroot")
            .arg(d.join("run"))
            .args(["--storage-driver", "vfs"]);
        c
    }

    /// Imports an image holding only the shared libraries `programs` need (the programs
    /// themselves and smore's files come in through mounts: `-v` and the CDI spec).
    fn import(&self, programs: &[PathBuf]) {
        let root = self.dir.path().join("rootfs");
        for p in programs {
            let out = run_ok(Command::new("ldd").arg(p)).unwrap();
            for lib in out
                .split_whitespace()
                .filter(|w| w.starts_with('/') && Path::new(w).exists())
            {
                let dst = root.join(lib.trim_start_matches('/'));
                std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
                std::fs::copy(lib, &dst).unwrap();
            }
        }
        for d in ["tmp", "proc", "dev", "sys", "run"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        let tar = self.dir.path().join("rootfs.tar");
        run_ok(
            Command::new("tar")
                .arg("-C")
                .arg(&root)
                .arg("-cf")
                .arg(&tar)
                .arg("."),
        )
        .unwrap();
        run_ok(self.cmd().arg("import").arg(&tar).arg(IMAGE)).unwrap();
    }

    /// `podman run` of `program` (mounted read-only at /usr/local/bin) in a container named
    /// `name` with `<kind>=<device>`.
    fn run(&mut self, name: &str, device: &str, program: &Path, env: &[(&str, &str)]) -> Command {
        self.containers.push(name.into());
        let target = format!(
            "/usr/local/bin/{}",
            program.file_name().unwrap().to_string_lossy()
        );
        let mut c = self.cmd();
        c.args(["run", "--rm", "--network", "none", "--name", name])
            .arg("--device")
            .arg(format!("{}={device}", self.kind))
            .arg("--volume")
            .arg(format!("{}:{target}:ro", program.display()));
        for (k, v) in env {
            c.arg("--env").arg(format!("{k}={v}"));
        }
        c.arg(IMAGE).arg(target);
        c
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        for name in &self.containers {
            let _ = self
                .cmd()
                .args(["rm", "--force", "--time", "0", name])
                .output();
        }
        let _ = self.cmd().args(["rmi", "--force", IMAGE]).output();
        let _ = std::fs::remove_file(&self.spec);
    }
}

#[test]
fn a_function_in_a_podman_container_gets_the_shim_through_cdi_and_is_capped_gated_and_attributed() {
    let Some(mut podman) = Podman::new() else {
        return;
    };
    let t0 = std::time::Instant::now();
    // Two GPUs, the container given the second: placement on an empty node would pick GPU 0
    // (least loaded, first), so landing on GPU 1 — and being capped and gated there, through page
    // slot 0, its only CUDA ordinal — shows SMORE_GPUS at work.
    let sim = SimGpu::exact(2, "8GiB");
    let arb = Arbiter::new(&sim, "");
    let probe = bin("sim-probe");
    podman.import(&[
        probe.clone(),
        shim_lib(),
        sim.lib_dir().join("libcuda.so.1"),
        sim.lib_dir().join("libnvidia-ml.so.1"),
    ]);
    let r = arb
        .smore()
        .args(["cdi", "generate", "--kind", &podman.kind, "--config"])
        .arg(&arb.cfg)
        .arg("--output")
        .arg(&podman.spec)
        .output()
        .unwrap();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let name = format!("smore-e2e-{}", std::process::id());
    let mut run = podman.run(
        &name,
        "1",
        &probe,
        &[("SMORE_MEMORY_LIMIT", CAP), ("SMORE_FUNCTION", "in-podman")],
    );
    run.args(script());
    let (seen, child) = scenario(&arb, "in-podman", run);
    // The container's command is pid 1 of its namespace.
    assert_capped_gated_attributed(&seen, Some(1), "podman");
    assert_eq!(
        seen.function["gpu"], 1,
        "placed on the GPU the container was given"
    );
    finish(child);
    eprintln!(
        "podman variant: {:?} including the image import",
        t0.elapsed()
    );
}

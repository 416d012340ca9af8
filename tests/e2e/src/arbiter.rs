//! A real `smore arbiter` process on a simulated node, as end-to-end tests start it: a config
//! written into the node's directory (socket, state directory, a fast 50 ms reconcile period,
//! plus whatever sections the test adds), restartable with the same config and state, killed on
//! drop. Logs of every start are kept for assertion messages.

use crate::SimGpu;
use smore_protocol::conn::Client;
use smore_protocol::wire::{Reply, Request};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// Config lines (append to a test's `extra`) for a test that plays several functions from its
/// own process: a node allows one grant per process (`[functions] grants_per_process`, issue 12
/// item 13), a test's threads all share the test's pid.
pub const MANY_GRANTS_PER_PROCESS: &str = "\n[functions]\ngrants_per_process = 100000\n";

/// A running (or killed, restartable) arbiter.
pub struct Arbiter {
    child: Option<Child>,
    smore: PathBuf,
    env: Vec<(String, String)>,
    /// The arbiter's config file.
    pub cfg: PathBuf,
    /// The arbiter's Unix socket.
    pub socket: PathBuf,
    /// The arbiter's state directory.
    pub state_dir: PathBuf,
    dir: PathBuf,
    starts: u32,
    /// More `smore arbiter` arguments (after `--config <file>`).
    args: Vec<String>,
}

impl Arbiter {
    /// Writes `node.toml` (with `extra` appended: more `[arbiter]` keys first, then any other
    /// sections) and starts `smore arbiter` from `smore`, waiting until it accepts connections.
    pub fn start(sim: &SimGpu, smore: &Path, extra: &str) -> Arbiter {
        Arbiter::start_with(sim, smore, extra, &[])
    }

    fn start_with(sim: &SimGpu, smore: &Path, extra: &str, args: &[&str]) -> Arbiter {
        let dir = sim.dir().to_path_buf();
        let socket = dir.join("arbiter.sock");
        let state_dir = dir.join("state");
        let cfg = dir.join("node.toml");
        // 50 ms unless `extra` sets its own period (a test of the watchdog's timing).
        let reconcile = if extra.contains("reconcile_ms") {
            ""
        } else {
            "reconcile_ms = 50\n"
        };
        // The simulated GPU's event timestamps are exact: no timing-noise allowance, which a
        // real node's default takes off every wait and stretch (docs/harvest.md, "Timing
        // noise"). Each key the test does not set itself, into its own `[gpus]` table when it
        // has one (a table header on a line of its own).
        let exact: String = ["wait_noise_us", "stretch_noise_us"]
            .iter()
            .filter(|k| !extra.contains(*k))
            .map(|k| format!("{k} = 0\n"))
            .collect();
        let extra = if exact.is_empty() {
            extra.to_string()
        } else if let Some(at) = extra.find("[gpus]\n") {
            let at = at + "[gpus]\n".len();
            format!("{}{exact}{}", &extra[..at], &extra[at..])
        } else {
            assert!(
                !extra.contains("[gpus]"),
                "put `[gpus]` on a line of its own in the test's config: {extra}"
            );
            format!("{extra}\n\n[gpus]\n{exact}")
        };
        std::fs::write(
            &cfg,
            format!(
                "[arbiter]\nsocket = {socket:?}\nstate_dir = {state_dir:?}\n{reconcile}{extra}\n"
            ),
        )
        .expect("writing node.toml");
        let mut a = Arbiter {
            child: None,
            smore: smore.to_path_buf(),
            env: sim.env().to_vec(),
            cfg,
            socket,
            state_dir,
            dir,
            starts: 0,
            args: args.iter().map(|s| s.to_string()).collect(),
        };
        a.launch();
        a
    }

    /// [`Arbiter::start`] of the workspace's `smore` binary.
    pub fn new(sim: &SimGpu, extra: &str) -> Arbiter {
        Arbiter::start(sim, &crate::bin("smore"), extra)
    }

    /// [`Arbiter::new`] with more `smore arbiter` arguments (e.g. `--log-format json`).
    pub fn with_args(sim: &SimGpu, extra: &str, args: &[&str]) -> Arbiter {
        Arbiter::start_with(sim, &crate::bin("smore"), extra, args)
    }

    /// [`Arbiter::new`] with `policy` as the `[policy]` section.
    pub fn with_policy(sim: &SimGpu, policy: &str) -> Arbiter {
        Arbiter::new(sim, &format!("\n[policy]\n{policy}\n"))
    }

    fn log_path(&self, n: u32) -> PathBuf {
        self.dir.join(format!("arbiter-{n}.log"))
    }

    fn launch(&mut self) {
        self.starts += 1;
        let log = std::fs::File::create(self.log_path(self.starts)).expect("arbiter log");
        let child = Command::new(&self.smore)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .args(["arbiter", "--config"])
            .arg(&self.cfg)
            .args(&self.args)
            .env("RUST_LOG", "debug")
            .stderr(log)
            .spawn()
            .expect("spawning smore arbiter");
        self.child = Some(child);
        let t0 = Instant::now();
        while std::os::unix::net::UnixStream::connect(&self.socket).is_err() {
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "arbiter did not start:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL: the arbiter gets no chance to clean anything up.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The running arbiter's pid (None once killed or taken).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Takes the arbiter's process out of the harness (to signal it and wait for its exit); a
    /// later [`Arbiter::revive`] starts a new one.
    pub fn take_child(&mut self) -> Option<Child> {
        self.child.take()
    }

    /// Kills the arbiter and starts it again with the same config and state directory.
    pub fn restart(&mut self) {
        self.kill();
        self.launch();
    }

    /// Starts a [`Arbiter::kill`]ed arbiter again with the same config and state directory
    /// (for tests that act while it is down).
    pub fn revive(&mut self) {
        assert!(self.child.is_none(), "revive: the arbiter is still running");
        self.launch();
    }

    /// Everything the arbiter logged, over all its starts.
    pub fn logs(&self) -> String {
        (1..=self.starts)
            .map(|n| std::fs::read_to_string(self.log_path(n)).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n--- restart ---\n")
    }

    /// A new connection to the arbiter; panics when it cannot connect.
    pub fn client(&self) -> Client {
        Client::connect(&self.socket).expect("connecting to the arbiter")
    }

    /// One request on a fresh connection, its reply.
    pub fn call(&self, req: Request) -> Reply {
        self.client().call(req).expect("arbiter request")
    }

    /// One request on a fresh connection, its reply and the fd that came with it.
    pub fn call_with_fd(&self, req: Request) -> (Reply, Option<OwnedFd>) {
        self.client().call_with_fd(req).expect("arbiter request")
    }

    /// The `status` snapshot.
    pub fn status(&self) -> serde_json::Value {
        match self.client().call(Request::Status).expect("status request") {
            Reply::Status { snapshot } => snapshot,
            r => panic!("status answered {r:?}"),
        }
    }

    /// Every function instance of every GPU in the snapshot.
    pub fn functions(&self) -> Vec<serde_json::Value> {
        self.status()["gpus"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["functions"].as_array().cloned().unwrap_or_default())
            .collect()
    }

    /// Waits until the arbiter lists a training process on GPU `gpu` (it finds them through
    /// NVML at its reconcile period), failing the test after `limit`.
    pub fn wait_for_training(&self, gpu: usize, limit: Duration) {
        crate::wait_until(&format!("training detected on GPU {gpu}"), limit, || {
            self.status()["gpus"][gpu]["training"]
                .as_array()
                .is_some_and(|t| !t.is_empty())
        });
    }

    /// A `smore` command with the node's environment and this arbiter's socket.
    pub fn smore(&self) -> Command {
        let mut c = Command::new(&self.smore);
        c.envs(self.env.iter().map(|(k, v)| (k, v)));
        c.env(smore_protocol::wire::ENV_SOCKET, &self.socket);
        c
    }

    /// Starts `sim-function ARGS` as function `function` under `smore run` with the shim (SLO
    /// 100 ms, a 1 GiB cap), its output discarded.
    pub fn run_sim_function(&self, function: &str, args: &[&str]) -> Child {
        self.smore()
            .args(["run", "--function", function, "--slo", "100"])
            .args(["--memory", "1GiB", "--shim"])
            .arg(crate::shim_lib())
            .arg("--")
            .arg(crate::bin("sim-function"))
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("smore run sim-function")
    }
}

impl Drop for Arbiter {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A `Register` request as a function runtime sends it (`exec`: the caller runs the function
/// itself), for `function` of `model` with `slo_ms` and a `memory` cap in bytes.
pub fn registration(function: &str, model: Option<&str>, slo_ms: f64, memory: u64) -> Request {
    Request::Register(smore_protocol::wire::Register {
        function: function.into(),
        model: model.map(Into::into),
        slo_ms: Some(slo_ms),
        memory: Some(memory),
        resume: None,
        gpu: None,
        exec: true,
        gpus: None,
    })
}

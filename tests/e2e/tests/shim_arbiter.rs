//! Arbiter mode of the shim against a tiny in-test arbiter: registration over the Unix socket,
//! the grant page passed as `SCM_RIGHTS`, live changes to the page, an inherited
//! `SMORE_GRANT_FD`, and the failure policy when the arbiter cannot be used.

use smore_e2e::*;
use smore_protocol::conn::send_with_fd;
use smore_protocol::grant::{GrantPage, PAGE_BYTES};
use smore_protocol::wire::{self, Envelope, Grant, RefuseCode, Register, Reply, Request};
use std::io::{BufRead, BufReader, Read};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

const MIB: u64 = 1 << 20;

/// A grant page in a sealed memfd, as the arbiter makes it: writable here, sealed against any
/// new writable mapping (`F_SEAL_FUTURE_WRITE`) before it is handed out.
struct Page {
    fd: OwnedFd,
    page: &'static GrantPage,
}

fn grant_page(cap: u64, share: u32, cloexec: bool) -> Page {
    let flags = libc::MFD_ALLOW_SEALING | if cloexec { libc::MFD_CLOEXEC } else { 0 };
    // SAFETY: memfd_create with a NUL-terminated name; the result is checked.
    let raw = unsafe { libc::memfd_create(c"smore-test-grant".as_ptr(), flags) };
    assert!(
        raw >= 0,
        "memfd_create: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: `raw` is a fresh fd we own.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: plain syscalls on our own fd; results checked.
    unsafe {
        assert_eq!(
            libc::ftruncate(fd.as_raw_fd(), PAGE_BYTES as libc::off_t),
            0
        );
        let p = libc::mmap(
            std::ptr::null_mut(),
            PAGE_BYTES,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        // The mapping is page-sized and aligned, lives for the test process (never unmapped).
        std::ptr::write(p as *mut GrantPage, GrantPage::unlimited());
        let page: &'static GrantPage = &*(p as *const GrantPage);
        page.set(0, cap, share);
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_FUTURE_WRITE;
        assert_eq!(libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals), 0);
        Page { fd, page }
    }
}

/// What the fake arbiter saw.
struct Seen {
    request: Envelope,
    /// The shim closed the connection (it does so only when its process ends).
    closed: Arc<AtomicBool>,
}

/// Serves one registration on `dir/arbiter.sock`: answers `reply` (with the page fd when it is
/// a grant), then waits for the connection to close.
fn fake_arbiter(
    dir: &std::path::Path,
    reply: Reply,
    page: Option<OwnedFd>,
) -> (
    std::path::PathBuf,
    std::thread::JoinHandle<Seen>,
    Arc<AtomicBool>,
) {
    let path = dir.join("arbiter.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let closed = Arc::new(AtomicBool::new(false));
    let flag = closed.clone();
    let h = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let request: Envelope = wire::read_frame(&mut s, wire::MAX_REQUEST_FRAME).unwrap();
        send_with_fd(&s, &reply, page.as_ref().map(|f| f.as_fd())).unwrap();
        let mut buf = [0u8; 64];
        // Blocks until the client closes its end (process exit).
        while matches!(s.read(&mut buf), Ok(n) if n > 0) {}
        flag.store(true, SeqCst);
        Seen {
            request,
            closed: flag,
        }
    });
    (path, h, closed)
}

fn granted(cap: u64, share: u32) -> Reply {
    Reply::Granted(Grant {
        instance: 7,
        gpu_index: 0,
        gpu_uuid: "GPU-test".into(),
        memory_cap: cap,
        sm_share: share,
        generation: 1,
        predicted_train: None,
        predicted_fn: None,
        rule: "test".into(),
        failure_policy: None,
        pid: None,
        board: false,
    })
}

#[test]
fn registration_maps_the_granted_page_and_follows_its_changes() {
    let sim = SimGpu::exact(1, "8GiB");
    let page = grant_page(64 * MIB, 100, true);
    let live = page.page;
    let (path, server, closed) = fake_arbiter(sim.dir(), granted(64 * MIB, 100), Some(page.fd));
    let mut child = sim
        .shimmed(bin("sim-probe"), &[])
        .env("SMORE_ARBITER_SOCKET", &path)
        .env("SMORE_FUNCTION", "resnet")
        .env("SMORE_MODEL", "resnet50")
        .env("SMORE_SLO_MS", "50")
        .env("SMORE_MEMORY_LIMIT", "64MiB")
        .args([
            "alloc:v2:48MiB",
            "alloc:v2:32MiB",
            "meminfo",
            "ready",
            "sleep:300",
        ])
        .args([
            "meminfo",
            "alloc:v2:1MiB",
            "run:1000:100",
            "free-all",
            "meminfo",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    let mut out = String::new();
    loop {
        let mut l = String::new();
        assert!(
            reader.read_line(&mut l).unwrap() > 0,
            "probe ended early: {out}"
        );
        out.push_str(&l);
        if l.starts_with("op=ready") {
            break;
        }
    }
    // The arbiter changes the grant while the function runs: the next calls obey it.
    assert!(
        !closed.load(SeqCst),
        "the connection stays open while the process runs"
    );
    live.set(0, 128 * MIB, 25);
    reader.read_to_string(&mut out).unwrap();
    assert!(child.wait().unwrap().success(), "{out}");
    let seen = server.join().unwrap();
    assert!(
        seen.closed.load(SeqCst),
        "exit closes the connection (the release)"
    );
    match seen.request.req {
        Request::Register(Register {
            function,
            model,
            slo_ms,
            memory,
            ..
        }) => {
            assert_eq!(function, "resnet");
            assert_eq!(model.as_deref(), Some("resnet50"));
            assert_eq!(slo_ms, Some(50.0));
            assert_eq!(memory, Some(64 * MIB));
        }
        other => panic!("expected a registration, got {other:?}"),
    }
    let l = parse_lines(&out);
    let a = ops(&l, "alloc");
    assert_eq!(
        (
            a[0]["rc"].as_str(),
            a[1]["rc"].as_str(),
            a[2]["rc"].as_str()
        ),
        ("0", "2", "0"),
        "{out}"
    );
    let info = ops(&l, "meminfo");
    assert_eq!(num(info[0], "total") as u64, 64 * MIB, "{out}");
    assert_eq!(
        num(info[1], "total") as u64,
        128 * MIB,
        "the new cap: {out}"
    );
    assert_eq!(num(info[1], "free") as u64, 80 * MIB, "{out}");
    // 100 ms of kernels at the new 25 % share: ≥ (100 − 25) / 0.25 = 300 ms (unthrottled: 100).
    let ms = num(ops(&l, "run")[0], "wall_ms");
    assert!(ms >= 250.0, "the new share is enforced: {ms} ms\n{out}");
}

#[test]
fn an_inherited_grant_fd_is_the_live_page() {
    let sim = SimGpu::exact(1, "8GiB");
    // Not close-on-exec: the probe inherits it, as from `smore run`.
    let page = grant_page(64 * MIB, 100, false);
    let out = run_ok(
        sim.shimmed(bin("sim-probe"), &[])
            .env("SMORE_GRANT_FD", page.fd.as_raw_fd().to_string())
            .env("SMORE_MEMORY_LIMIT", "1GiB")
            .args(["alloc:v2:48MiB", "alloc:v2:32MiB", "meminfo"]),
    )
    .unwrap();
    let l = parse_lines(&out);
    let a = ops(&l, "alloc");
    assert_eq!(
        (a[0]["rc"].as_str(), a[1]["rc"].as_str()),
        ("0", "2"),
        "the page's cap, not the env's: {out}"
    );
    assert_eq!(num(ops(&l, "meminfo")[0], "total") as u64, 64 * MIB);
}

/// Runs the probe of `sim` with the shim, a 64 MiB cap and `env`: the return codes of a 48 MiB
/// and a 32 MiB allocation, and the shim's stderr.
fn probe_allocs(sim: &SimGpu, env: &[(&str, &str)]) -> (Vec<String>, String) {
    let mut env = env.to_vec();
    env.push(("SMORE_MEMORY_LIMIT", "64MiB"));
    let out = sim
        .shimmed(bin("sim-probe"), &env)
        .args(["alloc:v2:48MiB", "alloc:v2:32MiB"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let l = parse_lines(&stdout);
    (
        ops(&l, "alloc").iter().map(|f| f["rc"].clone()).collect(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn an_unreachable_arbiter_applies_the_failure_policy() {
    let sim = SimGpu::exact(1, "8GiB");
    let missing = sim.dir().join("no-arbiter.sock");
    // open (the default): the standalone contract applies.
    let missing = missing.to_str().expect("a UTF-8 temporary path");
    let (rcs, err) = probe_allocs(&sim, &[("SMORE_ARBITER_SOCKET", missing)]);
    assert_eq!(rcs, ["0", "2"], "{err}");
    assert!(
        err.contains("no-arbiter.sock") && err.contains("SMORE_FAILURE=open"),
        "{err}"
    );
    // closed: nothing is allocated.
    let (rcs, err) = probe_allocs(
        &sim,
        &[
            ("SMORE_ARBITER_SOCKET", missing),
            ("SMORE_FAILURE", "closed"),
        ],
    );
    assert_eq!(rcs, ["2", "2"], "{err}");
    assert!(err.contains("SMORE_FAILURE=closed"), "{err}");
}

#[test]
fn a_refused_registration_applies_the_failure_policy() {
    for (policy, want) in [("open", ["0", "2"]), ("closed", ["2", "2"])] {
        let sim = SimGpu::exact(1, "8GiB");
        let refusal = Reply::Refused {
            code: RefuseCode::NoMemory,
            reason: "no GPU has 64 MiB".into(),
        };
        let (path, server, _) = fake_arbiter(sim.dir(), refusal, None);
        let path = path.to_str().expect("a UTF-8 temporary path");
        let (rcs, err) = probe_allocs(
            &sim,
            &[("SMORE_ARBITER_SOCKET", path), ("SMORE_FAILURE", policy)],
        );
        assert_eq!(rcs, want, "{policy}: {err}");
        assert!(
            err.contains("refused") && err.contains("no GPU has 64 MiB"),
            "{err}"
        );
        server.join().unwrap();
    }
}

/// GPU 0 from the arbiter's `status`: the bytes granted there and its functions.
fn gpu0(arb: &Arbiter) -> (Option<u64>, Vec<Listed>) {
    let snapshot = arb.status();
    let g = &snapshot["gpus"][0];
    let fns = g["functions"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|f| Listed {
                    id: f["id"].as_u64(),
                    pid: f["pid"].as_u64(),
                    attached: f["attached"].as_bool(),
                })
                .collect()
        })
        .unwrap_or_default();
    (g["granted"].as_u64(), fns)
}

/// One function as `status` lists it.
#[derive(Debug)]
struct Listed {
    id: Option<u64>,
    pid: Option<u64>,
    attached: Option<bool>,
}

/// A `shim-client hold` process driven line by line.
struct Held {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    out: BufReader<std::process::ChildStdout>,
    /// Its stderr (a file, readable while it runs).
    err: std::path::PathBuf,
}

impl Held {
    fn spawn(cmd: Command, err: std::path::PathBuf) -> Held {
        let mut h = Held::start(cmd, err);
        assert_eq!(h.line(), "op=ready");
        h
    }

    /// Tells a launcher that waits for a line on stdin to start the held process, and waits for
    /// it to be ready.
    fn go(&mut self) {
        use std::io::Write;
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "go").unwrap();
        stdin.flush().unwrap();
        assert_eq!(self.line(), "op=ready");
    }

    /// Spawns `cmd` without waiting for anything.
    fn start(mut cmd: Command, err: std::path::PathBuf) -> Held {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&err).unwrap())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let out = BufReader::new(child.stdout.take().unwrap());
        Held {
            child,
            stdin,
            out,
            err,
        }
    }

    fn line(&mut self) -> String {
        let mut l = String::new();
        self.out.read_line(&mut l).unwrap();
        assert!(!l.is_empty(), "the held function ended early");
        l.trim().to_string()
    }

    fn ask(&mut self, cmd: &str) -> String {
        use std::io::Write;
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{cmd}").unwrap();
        stdin.flush().unwrap();
        self.line()
    }

    fn alloc(&mut self, size: &str) -> String {
        let l = self.ask(&format!("alloc {size}"));
        parse_lines(&l)[0]["rc"].clone()
    }

    fn total(&mut self) -> u64 {
        let l = self.ask("meminfo");
        num(&parse_lines(&l)[0], "total") as u64
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.err).unwrap_or_default()
    }

    /// Closes stdin (the function exits) and returns its stderr.
    fn finish(mut self) -> String {
        drop(self.stdin.take());
        let mut rest = String::new();
        self.out.read_to_string(&mut rest).unwrap();
        let status = self.child.wait().unwrap();
        let err = self.stderr();
        assert!(status.success(), "{status}: {rest}\n{err}");
        err
    }
}

/// How long a function or the arbiter may take to react to a change in these tests.
const REACT: Duration = Duration::from_secs(15);

#[derive(Clone, Copy, PartialEq, Debug)]
enum Mode {
    /// `smore run` registered and exec'd the function (inherited SMORE_ARBITER_FD/GRANT_FD).
    SmoreRun,
    /// The shim registered itself on the first CUDA call (SMORE_ARBITER_SOCKET only).
    Socket,
}

/// The arbiter is SIGKILLed and restarted while a function runs: the function keeps its last
/// grant (open) or refuses allocations (closed) meanwhile, re-registers by itself as the same
/// instance, is counted once, and its cap holds throughout; the re-attached page is live.
///
/// `node_policy` is the arbiter's `[arbiter] failure_policy`, announced in the grant: when set it
/// overrides the function's own `SMORE_FAILURE` (`env_policy`), which a function controls.
fn arbiter_restart(mode: Mode, env_policy: &str, node_policy: Option<&str>) {
    let sim = SimGpu::exact(1, "16GiB");
    let config = node_policy.map_or(String::new(), |p| format!("failure_policy = \"{p}\"\n"));
    let mut arb = Arbiter::new(&sim, &config);
    let policy = match node_policy {
        Some("fail-closed") => "closed",
        Some("fail-open") => "open",
        Some(other) => panic!("not a failure policy: {other}"),
        None => env_policy,
    };
    let cmd = match mode {
        Mode::SmoreRun => {
            let mut c = sim.command(bin("smore"));
            c.args(["run", "--function", "held", "--memory", "64MiB", "--shim"])
                .arg(shim_lib())
                .arg("--")
                .arg(bin("shim-client"))
                .arg("hold");
            c
        }
        Mode::Socket => {
            let mut c = sim.shimmed(
                bin("shim-client"),
                &[("SMORE_FUNCTION", "held"), ("SMORE_MEMORY_LIMIT", "64MiB")],
            );
            c.arg("hold");
            c
        }
    };
    let mut cmd = cmd;
    cmd.env("SMORE_ARBITER_SOCKET", &arb.socket)
        .env("SMORE_FAILURE", env_policy)
        .env("SMORE_LOG", "info");
    let mut f = Held::spawn(cmd, sim.dir().join("function.err"));
    let pid = f.child.id() as u64;
    let ctx = format!("{mode:?}, SMORE_FAILURE={env_policy}, node policy {node_policy:?}");
    assert_eq!(f.alloc("48MiB"), "0", "{ctx}");
    assert_eq!(f.alloc("32MiB"), "2", "the grant's 64 MiB cap: {ctx}");
    let (_, fns) = gpu0(&arb);
    assert_eq!(fns.len(), 1, "{ctx}: {fns:?}");
    let id = fns[0].id.unwrap();
    assert_eq!(fns[0].pid, Some(pid), "{ctx}");
    assert_eq!(fns[0].attached, Some(true), "{ctx}");

    arb.kill();
    let mut used = 48;
    if policy == "closed" {
        // Once the shim has seen the hang-up, its view is a 0-byte cap and nothing is allocated.
        wait_until("fail-closed after the arbiter died", REACT, || {
            f.total() == 0
        });
        assert_eq!(f.alloc("8MiB"), "2", "{ctx}");
    } else {
        // The last grant stays in force, cap included.
        assert_eq!(f.alloc("8MiB"), "0", "{ctx}");
        assert_eq!(f.alloc("16MiB"), "2", "{ctx}");
        assert_eq!(f.total(), 64 << 20, "{ctx}");
        used += 8;
    }

    arb.revive();
    wait_until("the function re-attached", REACT, || {
        let (_, fns) = gpu0(&arb);
        fns.len() == 1 && fns[0].attached == Some(true)
    });
    let (granted, fns) = gpu0(&arb);
    assert_eq!(fns.len(), 1, "counted once: {ctx}: {fns:?}");
    assert_eq!(fns[0].id, Some(id), "same instance: {ctx}");
    assert_eq!(fns[0].pid, Some(pid), "{ctx}");
    assert_eq!(
        granted,
        Some(64 << 20),
        "the GPU counts its cap once: {ctx}"
    );
    // The new page is swapped in right after the reply that marks it attached.
    wait_until("the re-attached grant applies", REACT, || {
        f.total() == 64 << 20
    });
    let room = 64 - used;
    assert_eq!(f.alloc(&format!("{room}MiB")), "0", "{ctx}");
    assert_eq!(f.alloc("1MiB"), "2", "the cap is still enforced: {ctx}");

    // The page now mapped is the restarted arbiter's live page: an operator change reaches it.
    assert_eq!(
        arb.call(Request::SetMemory {
            instance: id,
            bytes: 128 << 20
        }),
        Reply::Ok
    );
    assert_eq!(f.total(), 128 << 20, "{ctx}");
    assert_eq!(f.alloc("32MiB"), "0", "{ctx}");
    assert_eq!(f.alloc("48MiB"), "2", "{ctx}");

    let err = f.finish();
    assert!(
        err.contains("arbiter connection lost") && err.contains("re-attached as instance"),
        "{ctx}: {err}"
    );
    // Exit closes the new connection: the grant is released.
    wait_until("the grant released at exit", REACT, || {
        gpu0(&arb).1.is_empty()
    });
    let logs = arb.logs();
    assert!(
        logs.contains("re-attached"),
        "the arbiter logged the resumption: {logs}"
    );
}

#[test]
fn an_arbiter_restart_under_smore_run_keeps_the_grant_and_resumes_it() {
    arbiter_restart(Mode::SmoreRun, "open", None);
}

#[test]
fn an_arbiter_restart_fails_closed_then_the_shim_re_registers_itself() {
    arbiter_restart(Mode::Socket, "closed", None);
}

/// `[arbiter] failure_policy = "fail-closed"` reaches the shim in the grant and wins over the
/// function's own `SMORE_FAILURE=open`, whichever way it registered.
#[test]
fn the_node_failure_policy_overrides_the_function_environment() {
    arbiter_restart(Mode::Socket, "open", Some("fail-closed"));
    arbiter_restart(Mode::SmoreRun, "open", Some("fail-closed"));
}

/// Under `smore run` the registration belongs to the process `smore run` exec'd. A descendant
/// that inherited the grant (here: a wrapper shell forks the function) must not re-register after
/// a restart — the arbiter would grant it a second instance. It keeps the last grant; the
/// instance stays listed once (detached, its memory still counted).
#[test]
fn a_descendant_sharing_a_smore_run_grant_does_not_re_register() {
    let sim = SimGpu::exact(1, "16GiB");
    let mut arb = Arbiter::new(&sim, "");
    let mut cmd = sim.command(bin("smore"));
    // `; true` makes the shell fork the function instead of exec'ing it.
    let script = format!("{:?} hold; true", bin("shim-client"));
    cmd.args([
        "run",
        "--function",
        "wrapped",
        "--memory",
        "64MiB",
        "--shim",
    ])
    .arg(shim_lib())
    .args(["--", "sh", "-c", &script])
    .env("SMORE_ARBITER_SOCKET", &arb.socket);
    let mut f = Held::spawn(cmd, sim.dir().join("function.err"));
    let shell = f.child.id() as u64;
    assert_eq!(f.alloc("48MiB"), "0");
    let (_, fns) = gpu0(&arb);
    assert_eq!((fns.len(), fns[0].pid), (1, Some(shell)), "{fns:?}");
    let id = fns[0].id.unwrap();

    arb.kill();
    arb.revive();
    wait_until("the descendant gave up re-registering", REACT, || {
        f.stderr().contains("not re-registering")
    });
    let err = f.stderr();
    assert!(
        err.contains(&format!("instance {id} belongs to pid {shell}")),
        "{err}"
    );
    let (granted, fns) = gpu0(&arb);
    assert_eq!(fns.len(), 1, "counted once: {fns:?}");
    assert_eq!(fns[0].id, Some(id));
    assert_eq!(fns[0].attached, Some(false), "nobody re-attached it");
    assert_eq!(granted, Some(64 << 20), "its memory still counts");
    // The last grant still caps the function.
    assert_eq!(f.alloc("16MiB"), "0");
    assert_eq!(f.alloc("1MiB"), "2");
    // And it follows the page this arbiter made for the instance when it attached (before, it
    // kept the dead arbiter's page: an operator's change never reached it).
    assert_eq!(
        arb.call(Request::SetMemory {
            instance: id,
            bytes: 128 << 20
        }),
        Reply::Ok
    );
    wait_until("the descendant follows the new page", REACT, || {
        f.total() == 128 << 20
    });
    assert_eq!(f.alloc("32MiB"), "0");
    assert_eq!(f.alloc("48MiB"), "2");
    assert!(
        f.stderr().contains("following the arbiter's page"),
        "{}",
        f.stderr()
    );
    f.finish();
    wait_until("released when the shell exits", REACT, || {
        gpu0(&arb).1.is_empty()
    });
}

/// A process that only reports — here a worker started with `close_fds` (as Python's
/// `subprocess` starts one) under a launcher that never uses CUDA, so nobody re-registers the
/// instance — follows the grant across an arbiter restart: the failure policy while the arbiter
/// is away (closed: nothing allocated; open: the last grant), and the restarted arbiter's page
/// once it attaches again, where an operator's change reaches it (docs/shim.md, "Workers after
/// an arbiter restart"). Before, it kept the dead arbiter's page for good under either policy.
fn a_worker_that_only_reports_follows_the_grant_across_a_restart(policy: &str) {
    let sim = SimGpu::exact(1, "16GiB");
    let mut arb = Arbiter::new(&sim, "");
    let mut cmd = sim.command(bin("smore"));
    let py = "import subprocess, sys\nsys.exit(subprocess.Popen(sys.argv[1:]).wait())";
    cmd.args([
        "run",
        "--function",
        "workers",
        "--memory",
        "64MiB",
        "--shim",
    ])
    .arg(shim_lib())
    .args(["--", "python3", "-c", py])
    .arg(bin("shim-client"))
    .arg("hold")
    .env("SMORE_ARBITER_SOCKET", &arb.socket)
    .env("SMORE_FAILURE", policy)
    .env("SMORE_LOG", "info");
    let mut f = Held::spawn(cmd, sim.dir().join("function.err"));
    assert_eq!(f.alloc("48MiB"), "0", "{policy}");
    assert_eq!(f.alloc("32MiB"), "2", "the grant's 64 MiB cap: {policy}");
    let (_, fns) = gpu0(&arb);
    assert_eq!(fns.len(), 1, "{fns:?}");
    let id = fns[0].id.unwrap();
    // Its reporter attaches with its first report (a second after it started).
    wait_until("the worker's reporter attached", REACT, || {
        arb.logs().contains("a report connection attached")
    });

    arb.kill();
    let mut used = 48;
    if policy == "closed" {
        wait_until("the worker fails closed", REACT, || f.total() == 0);
        assert_eq!(f.alloc("8MiB"), "2", "{policy}");
    } else {
        assert_eq!(f.alloc("8MiB"), "0", "the last grant: {policy}");
        assert_eq!(f.total(), 64 << 20);
        used += 8;
    }
    arb.revive();
    // Nobody resumes the instance (its registered process, python, has no CUDA and so no
    // watcher): it stays listed, detached, its memory counted.
    let (granted, fns) = gpu0(&arb);
    assert_eq!(fns.len(), 1, "{fns:?}");
    assert_eq!(fns[0].attached, Some(false));
    assert_eq!(granted, Some(64 << 20));
    wait_until(
        "the worker follows the restarted arbiter's page",
        REACT,
        || f.stderr().contains("following the arbiter's page"),
    );
    assert_eq!(f.total(), 64 << 20, "{policy}");
    assert_eq!(
        arb.call(Request::SetMemory {
            instance: id,
            bytes: 128 << 20
        }),
        Reply::Ok
    );
    assert_eq!(
        f.total(),
        128 << 20,
        "an operator's change reaches it: {policy}"
    );
    let room = 128 - used;
    assert_eq!(f.alloc(&format!("{room}MiB")), "0", "{policy}");
    assert_eq!(f.alloc("1MiB"), "2", "the new cap is enforced: {policy}");
    let err = f.finish();
    if policy == "closed" {
        assert!(err.contains("failure policy closed"), "{err}");
    }
}

/// A worker that only reports, started while the arbiter is away, under fail-closed: it found
/// the page its launcher holds, but no arbiter runs — it refuses every allocation until the
/// restarted arbiter's page reaches it (before, it ran on the dead arbiter's page for good).
#[test]
fn a_worker_started_while_the_arbiter_is_away_fails_closed_until_it_is_back() {
    let sim = SimGpu::exact(1, "16GiB");
    let mut arb = Arbiter::new(&sim, "");
    let mut cmd = sim.command(bin("smore"));
    // The launcher starts its worker when told (one line on stdin), as a `close_fds` worker.
    let py = "import subprocess, sys\nsys.stdin.readline()\n\
              sys.exit(subprocess.Popen(sys.argv[1:]).wait())";
    cmd.args(["run", "--function", "late", "--memory", "64MiB", "--shim"])
        .arg(shim_lib())
        .args(["--", "python3", "-c", py])
        .arg(bin("shim-client"))
        .arg("hold")
        .env("SMORE_ARBITER_SOCKET", &arb.socket)
        .env("SMORE_FAILURE", "closed")
        .env("SMORE_LOG", "info");
    // The registration is done before `smore run` execs the launcher; then the arbiter dies,
    // and only then does the worker start.
    let mut f = Held::start(cmd, sim.dir().join("function.err"));
    let comm = format!("/proc/{}/comm", f.child.id());
    wait_until("smore run exec'd the launcher", REACT, || {
        std::fs::read_to_string(&comm).is_ok_and(|c| c.starts_with("python"))
    });
    assert_eq!(gpu0(&arb).1.len(), 1, "granted before the exec");
    arb.kill();
    f.go();
    wait_until("the late worker fails closed", REACT, || f.total() == 0);
    assert_eq!(f.alloc("8MiB"), "2");
    arb.revive();
    wait_until(
        "the late worker follows the restarted arbiter's page",
        REACT,
        || f.total() == 64 << 20,
    );
    assert_eq!(f.alloc("48MiB"), "0");
    assert_eq!(f.alloc("32MiB"), "2", "the grant's cap");
    let err = f.finish();
    assert!(
        err.contains("arbiter unreachable") && err.contains("failure policy closed"),
        "{err}"
    );
}

#[test]
fn a_worker_that_only_reports_fails_closed_then_follows_the_restarted_arbiters_page() {
    a_worker_that_only_reports_follows_the_grant_across_a_restart("closed");
}

#[test]
fn a_worker_that_only_reports_keeps_its_grant_then_follows_the_restarted_arbiters_page() {
    a_worker_that_only_reports_follows_the_grant_across_a_restart("open");
}

//! The arbiter as an operator runs it: a real `smore arbiter` process on the simulated GPU, real
//! clients over its Unix socket, real processes under `smore run`.

use smore_e2e::{registration, wait_exit, wait_until, Arbiter, SimGpu, MANY_GRANTS_PER_PROCESS};
use smore_protocol::conn::{recv_with_fd, send_with_fd, Client};
use smore_protocol::grant::{GrantPage, PAGE_BYTES};
use smore_protocol::wire::{self, Envelope, ErrorCode, Register, Reply, Request, MAX_FRAME};
use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const SMORE: &str = env!("CARGO_BIN_EXE_smore");

fn register(c: &Client, function: &str, memory: u64) -> (Reply, Option<OwnedFd>) {
    c.call_with_fd(registration(function, None, 50.0, memory))
        .unwrap()
}

/// A read-only view of a grant page, as the shim maps it.
struct PageView(*mut std::ffi::c_void);

impl PageView {
    fn map(fd: &OwnedFd) -> PageView {
        // SAFETY: read-only shared mapping of a PAGE_BYTES memfd; unmapped in Drop.
        let p = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                PAGE_BYTES,
                rustix::mm::ProtFlags::READ,
                rustix::mm::MapFlags::SHARED,
                fd,
                0,
            )
        }
        .unwrap();
        PageView(p)
    }
    fn page(&self) -> &GrantPage {
        // SAFETY: the mapping holds an initialised GrantPage written by the arbiter; atomics only.
        unsafe { &*(self.0.cast::<GrantPage>()) }
    }
}

impl Drop for PageView {
    fn drop(&mut self) {
        // SAFETY: unmapping the mapping made in `map`.
        unsafe { rustix::mm::munmap(self.0, PAGE_BYTES).unwrap() };
    }
}

#[test]
fn registration_gets_a_grant_page_it_cannot_write() {
    let sim = SimGpu::exact(2, "16GiB");
    let arb = Arbiter::new(&sim, MANY_GRANTS_PER_PROCESS);
    let c = arb.client();
    let (reply, fd) = register(&c, "resnet", 3 << 30);
    let Reply::Granted(g) = reply else {
        panic!("{reply:?}")
    };
    assert_eq!(g.memory_cap, 3 << 30);
    assert_eq!(g.sm_share, 100, "no training on the node: unthrottled");
    assert!(g.gpu_uuid.starts_with("GPU-"));
    let fd = fd.expect("the grant page travels with the reply");
    let view = PageView::map(&fd);
    assert!(view.page().is_valid());
    assert_eq!(view.page().cap(0), 3 << 30);
    // The client cannot map it writable, upgrade its mapping, or write the fd.
    // SAFETY: attempted writable mapping of the page; must fail (unmapped if it did not).
    let w = unsafe {
        rustix::mm::mmap(
            std::ptr::null_mut(),
            PAGE_BYTES,
            rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
            rustix::mm::MapFlags::SHARED,
            &fd,
            0,
        )
    };
    assert!(w.is_err(), "a writable shared mapping must be refused");
    // SAFETY: mprotect on our own read-only mapping; must be refused.
    let up = unsafe {
        rustix::mm::mprotect(
            view.0,
            PAGE_BYTES,
            rustix::mm::MprotectFlags::READ | rustix::mm::MprotectFlags::WRITE,
        )
    };
    assert!(
        up.is_err(),
        "upgrading the mapping to writable must be refused"
    );
    let mut f = std::fs::File::from(fd.try_clone().unwrap());
    assert!(
        f.write_all(&[0xff; 64]).is_err(),
        "write(2) on the page must be refused"
    );
    assert_eq!(view.page().cap(0), 3 << 30);
    // Status shows it; a second registration on the same connection is refused.
    let fns = arb.functions();
    assert_eq!(fns.len(), 1);
    assert_eq!(fns[0]["function"], "resnet");
    assert_eq!(fns[0]["pid"], std::process::id());
    let (again, _) = register(&c, "resnet", 1 << 20);
    assert!(
        matches!(
            again,
            Reply::Error {
                code: ErrorCode::AlreadyRegistered,
                ..
            }
        ),
        "{again:?}"
    );
    // Memory is never over-committed: 16 GiB × σ 0.95 × 2 GPUs = 30.4 GiB; 3 GiB used.
    let mut held = Vec::new();
    let mut granted = 3u64 << 30;
    loop {
        let c = arb.client();
        match register(&c, "filler", 4 << 30).0 {
            Reply::Granted(_) => {
                granted += 4 << 30;
                held.push(c);
            }
            Reply::Refused { code, reason } => {
                assert_eq!(code, wire::RefuseCode::NoMemory, "{reason}");
                break;
            }
            r => panic!("{r:?}"),
        }
    }
    assert!(granted as f64 <= 2.0 * 0.95 * (16u64 << 30) as f64);
    assert_eq!(
        held.len(),
        6,
        "3 + 6·4 = 27 GiB fit, a seventh 4 GiB does not"
    );
}

#[test]
fn live_share_changes_reach_the_page_before_the_reply() {
    let sim = SimGpu::exact(1, "16GiB");
    let arb = Arbiter::new(&sim, "");
    // The function is another process: a function (or its descendant, like a `smore share`
    // this test spawns) is never an operator. Its page is read through /proc/<pid>/fd.
    let mut function = arb
        .smore()
        .args(["run", "--function", "f", "--memory", "1GiB", "--shim"])
        .arg(smore_e2e::shim_lib())
        .args(["--", "sleep", "60"])
        .spawn()
        .unwrap();
    wait_until("registration", Duration::from_secs(10), || {
        arb.functions().len() == 1
    });
    let instance = arb.functions()[0]["id"].as_u64().unwrap();
    // Registered before it execs the command: the page fd is in the command's environment.
    let page_fd = || {
        let environ = std::fs::read(format!("/proc/{}/environ", function.id())).ok()?;
        String::from_utf8_lossy(&environ).split('\0').find_map(|v| {
            v.strip_prefix(&format!("{}=", wire::ENV_GRANT_FD))
                .map(str::to_string)
        })
    };
    wait_until(
        "smore run hands the page fd to the command",
        Duration::from_secs(10),
        || page_fd().is_some(),
    );
    let page_fd = page_fd().unwrap();
    let fd = OwnedFd::from(
        std::fs::File::open(format!("/proc/{}/fd/{page_fd}", function.id())).unwrap(),
    );
    let view = PageView::map(&fd);
    let gen0 = view.page().generation(0);
    let t0 = Instant::now();
    let out = arb
        .smore()
        .args(["share", &instance.to_string(), "25"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Written before the reply: visible the moment the command returns.
    assert_eq!(view.page().share(0), 25);
    assert!(view.page().generation(0) > gen0);
    eprintln!(
        "share change visible after {:?} (including spawning `smore share`)",
        t0.elapsed()
    );
    // Back to the policy's share.
    let out = arb
        .smore()
        .args(["share", &instance.to_string(), "auto"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(view.page().share(0), 100);
    // Bad values are refused with a message.
    let out = arb
        .smore()
        .args(["share", &instance.to_string(), "140"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("1–100"));
    function.kill().unwrap();
    function.wait().unwrap();
}

#[test]
fn a_sigkilled_function_is_released_within_a_second() {
    let sim = SimGpu::exact(1, "16GiB");
    let arb = Arbiter::new(&sim, "");
    let mut child = arb
        .smore()
        .args(["run", "--function", "sleeper", "--memory", "1GiB", "--shim"])
        .arg(smore_e2e::shim_lib())
        .args(["--", "sleep", "60"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until("registration", Duration::from_secs(10), || {
        arb.functions().len() == 1
    });
    let f = &arb.functions()[0];
    assert_eq!(
        f["pid"],
        child.id(),
        "the grant belongs to the exec'd command"
    );
    assert_eq!(f["function"], "sleeper");
    child.kill().unwrap();
    child.wait().unwrap();
    let took = wait_until("release", Duration::from_secs(1), || {
        arb.functions().is_empty()
    });
    eprintln!("released {took:?} after SIGKILL");
    let ev = arb.status()["events"].to_string();
    assert!(ev.contains("released"), "{ev}");
    // The decision log holds both decisions, one JSON object per line.
    let log = std::fs::read_to_string(sim.dir().join("state/decisions.jsonl")).unwrap();
    let kinds: Vec<String> = log
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["kind"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(kinds, ["admitted", "released"], "{log}");
}

#[test]
fn smore_run_refused_for_memory_exits_with_the_refusal_code() {
    let sim = SimGpu::exact(1, "16GiB");
    let arb = Arbiter::new(&sim, "");
    let out = arb
        .smore()
        .args(["run", "--memory", "100GiB", "--shim"])
        .arg(smore_e2e::shim_lib())
        .args(["--", "true"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(wire::RefuseCode::NoMemory.exit_code())
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("refused") && err.contains("100GiB"), "{err}");
}

#[test]
fn smore_run_without_an_arbiter_exits_69() {
    let sim = SimGpu::exact(1, "16GiB");
    let out = sim
        .command(SMORE)
        .args(["run", "--socket", "/nonexistent/smore.sock", "--shim"])
        .arg(smore_e2e::shim_lib())
        .args(["--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(69));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is `smore arbiter` running?"));
}

#[test]
fn an_arbiter_restart_loses_nothing_and_counts_nothing_twice() {
    let sim = SimGpu::exact(1, "16GiB");
    let mut arb = Arbiter::new(&sim, "");
    let c = arb.client();
    let (Reply::Granted(g), Some(fd)) = register(&c, "survivor", 8 << 30) else {
        panic!()
    };
    let view = PageView::map(&fd);
    arb.kill();
    drop(c);
    // The client keeps its last grant while the arbiter is away.
    assert_eq!(view.page().cap(0), 8 << 30);
    arb.restart();
    let fns = arb.functions();
    assert_eq!(fns.len(), 1, "restored from the state dir");
    assert_eq!(fns[0]["attached"], false);
    // Its 8 GiB still count: another 8 GiB does not fit in 16 GiB × 0.95.
    let other = arb.client();
    assert!(matches!(
        register(&other, "greedy", 8 << 30).0,
        Reply::Refused { .. }
    ));
    // The client re-registers with `resume`: same instance, attached, counted once.
    let c = arb.client();
    let (reply, fd) = c
        .call_with_fd(Request::Register(Register {
            function: "survivor".into(),
            model: None,
            slo_ms: None,
            memory: Some(8 << 30),
            resume: Some(g.instance),
            gpu: Some(g.gpu_index),
            exec: true,
            gpus: None,
        }))
        .unwrap();
    let Reply::Granted(g2) = reply else {
        panic!("{reply:?}")
    };
    assert_eq!(g2.instance, g.instance);
    assert_eq!(PageView::map(&fd.unwrap()).page().cap(0), 8 << 30);
    let fns = arb.functions();
    assert_eq!(fns.len(), 1);
    assert_eq!(fns[0]["attached"], true);
}

#[test]
fn two_hundred_concurrent_registrations_are_served() {
    let sim = SimGpu::exact(2, "16GiB");
    let arb = Arbiter::new(&sim, MANY_GRANTS_PER_PROCESS);
    let socket = arb.socket.clone();
    let t0 = Instant::now();
    let handles: Vec<_> = (0..200)
        .map(|i| {
            let socket = socket.clone();
            std::thread::spawn(move || {
                let c = Client::connect(&socket).unwrap();
                let (r, fd) = register(&c, &format!("f{i}"), 16 << 20);
                assert!(matches!(r, Reply::Granted(_)), "{r:?}");
                assert!(fd.is_some());
                (c, Instant::now())
            })
        })
        .collect();
    let done: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let last = done.iter().map(|(_, t)| *t).max().unwrap() - t0;
    eprintln!("200 concurrent registrations served in {last:?}");
    // Served, not timed: figures belong to `smore bench arbiter`. The bound only catches a
    // serialised or stuck accept loop (200 × the 10 s client timeout), not a slow machine.
    assert!(last < Duration::from_secs(60), "took {last:?}");
    assert_eq!(arb.functions().len(), 200);
    drop(done);
    wait_until("all released", Duration::from_secs(5), || {
        arb.functions().is_empty()
    });
}

/// Starts `smore arbiter` on a `node.toml` holding `config`; it must refuse to start. Its stderr.
fn refused_config(config: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("node.toml");
    std::fs::write(&cfg, config).unwrap();
    let out = Command::new(SMORE)
        .args(["arbiter", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "started with {config:?}: {err}");
    err
}

#[test]
fn config_errors_name_the_file_line_and_key() {
    let err =
        refused_config("[arbiter]\nsocket = \"/tmp/x.sock\"\n\n[policy]\ntheta_train = 2000\n");
    assert!(
        err.contains("node.toml:5:") && err.contains("policy.theta_train"),
        "{err}"
    );
    let err = refused_config("[watchdog]\nacton = \"log\"\n");
    assert!(
        err.contains("node.toml:2:") && err.contains("acton"),
        "{err}"
    );
}

#[test]
fn a_default_memory_larger_than_any_gpu_stops_the_daemon_at_start() {
    let err = refused_config("[functions]\ndefault_memory = \"18446744073709551615\"\n");
    assert!(
        err.contains("node.toml:2:") && err.contains("functions.default_memory"),
        "{err}"
    );
}

#[test]
fn malformed_messages_get_errors_and_do_not_disturb_others() {
    let sim = SimGpu::exact(1, "16GiB");
    let arb = Arbiter::new(&sim, "");
    let good = arb.client();
    let (Reply::Granted(_), _) = register(&good, "good", 1 << 20) else {
        panic!()
    };
    // Garbage JSON: an error, and the connection stays usable.
    let s = UnixStream::connect(&arb.socket).unwrap();
    let mut frame = 7u32.to_le_bytes().to_vec();
    frame.extend_from_slice(b"{oops!}");
    (&s).write_all(&frame).unwrap();
    let (r, _): (Reply, _) = recv_with_fd(&s, MAX_FRAME).unwrap();
    assert!(
        matches!(
            r,
            Reply::Error {
                code: ErrorCode::Malformed,
                ..
            }
        ),
        "{r:?}"
    );
    send_with_fd(&s, &Envelope::new(Request::Status), None).unwrap();
    let (r, _): (Reply, _) = recv_with_fd(&s, MAX_FRAME).unwrap();
    assert!(matches!(r, Reply::Status { .. }));
    // Requests that need a registration say so.
    send_with_fd(
        &s,
        &Envelope::new(Request::Admit {
            request: None,
            waited_ms: None,
        }),
        None,
    )
    .unwrap();
    let (r, _): (Reply, _) = recv_with_fd(&s, MAX_FRAME).unwrap();
    assert!(
        matches!(
            r,
            Reply::Error {
                code: ErrorCode::NotRegistered,
                ..
            }
        ),
        "{r:?}"
    );
    // A different protocol version is refused.
    let v = UnixStream::connect(&arb.socket).unwrap();
    send_with_fd(&v, &serde_json::json!({"v": 99, "op": "status"}), None).unwrap();
    let (r, _): (Reply, _) = recv_with_fd(&v, MAX_FRAME).unwrap();
    assert!(
        matches!(
            r,
            Reply::Error {
                code: ErrorCode::Version,
                ..
            }
        ),
        "{r:?}"
    );
    // An oversized frame is refused and the connection closed.
    let big = UnixStream::connect(&arb.socket).unwrap();
    (&big).write_all(&(1u32 << 30).to_le_bytes()).unwrap();
    let (r, _): (Reply, _) = recv_with_fd(&big, MAX_FRAME).unwrap();
    assert!(
        matches!(
            r,
            Reply::Error {
                code: ErrorCode::TooLarge,
                ..
            }
        ),
        "{r:?}"
    );
    // A client killed mid-frame (half a message, then gone).
    {
        let half = UnixStream::connect(&arb.socket).unwrap();
        (&half).write_all(&100u32.to_le_bytes()).unwrap();
        (&half).write_all(b"{\"v\":1,").unwrap();
    }
    // The good client is unaffected.
    assert_eq!(arb.functions().len(), 1);
    assert!(matches!(
        good.call(Request::Report {
            latencies_ms: vec![3.0],
            used_bytes: None,
            throttled_ns: None,
            refusals: None,
            gpu_ns: None,
            contention_ns: None,
            deferred_ns: None,
            turn_waited_ns: None,
            turn_cut_ins: None,
            measured_contention_ns: None,
            contention_ahead_ns: None,
            contention_shared: None,
            raw_shared: None,
        })
        .unwrap(),
        Reply::Ok
    ));
}

#[test]
fn nvml_discovery_and_training_detection_feed_status_and_metrics() {
    let sim = SimGpu::exact(2, "16GiB");
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let arb = Arbiter::new(&sim, &format!("metrics_addr = \"127.0.0.1:{port}\"\n"));
    // An unregistered process holding memory on GPU 1: training, never touched.
    let mut trainer = sim.spawn_memory_holder(1, "3GiB");
    arb.wait_for_training(1, Duration::from_secs(10));
    let s = arb.status();
    assert_eq!(s["gpus"].as_array().unwrap().len(), 2);
    assert_eq!(s["gpus"][1]["training"][0]["pid"], trainer.id());
    assert!(s["gpus"][1]["training_used"].as_u64().unwrap() >= 3 << 30);
    // The trainer's memory is reserved: a 13 GiB function only fits on GPU 0 (15.2 vs 12.2 GiB).
    let c = arb.client();
    let (Reply::Granted(g), _) = register(&c, "big", 13 << 30) else {
        panic!()
    };
    assert_eq!(g.gpu_index, 0);
    // Human-readable status and metrics.
    let out = arb.smore().arg("status").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let training = text
        .lines()
        .find(|l| l.trim_start().starts_with("training"))
        .unwrap_or_else(|| panic!("no training row: {text}"));
    assert!(training.contains(&trainer.id().to_string()), "{training}");
    assert!(text.contains("big"), "{text}");
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    conn.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut body = String::new();
    std::io::Read::read_to_string(&mut conn, &mut body).unwrap();
    assert!(
        body.contains("smore_function_memory_cap_bytes{gpu=\"0\""),
        "{body}"
    );
    assert!(body.contains("smore_registrations_total 1"), "{body}");
    trainer.kill().unwrap();
    trainer.wait().unwrap();
}

/// `smore run --function <function> --memory 1GiB` with a preload that names no shim, up to the
/// `--`: the program appended runs registered but bypasses the shim.
fn run_without_shim(arb: &Arbiter, function: &str) -> Command {
    let mut c = arb.smore();
    c.args([
        "run",
        "--function",
        function,
        "--memory",
        "1GiB",
        "--shim",
        "/nonexistent/libsmore_shim.so",
        "--",
    ]);
    c
}

/// The watchdog SIGKILLs `child` within `limit` and records an event saying `why`.
fn assert_killed_by_the_watchdog(arb: &Arbiter, mut child: Child, limit: Duration, why: &str) {
    use std::os::unix::process::ExitStatusExt;
    let status = wait_exit(&mut child, "the watchdog acted", limit, || arb.logs());
    assert_eq!(status.signal(), Some(9), "{status}");
    let ev = arb.status()["events"].to_string();
    assert!(ev.contains(why), "{ev}");
}

#[test]
fn a_function_without_the_shim_gets_the_watchdog() {
    let sim = SimGpu::exact(1, "16GiB");
    let arb = Arbiter::new(&sim, "[watchdog]\naction = \"sigkill\"\n");
    // Registered through `smore run`, but the preload names no shim: the GPU process bypasses it.
    let child = run_without_shim(&arb, "sneaky")
        .arg(smore_e2e::bin("sim-probe"))
        .args(["alloc:v2:64MiB", "sleep:30000"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert_killed_by_the_watchdog(
        &arb,
        child,
        Duration::from_secs(15),
        "without the smore shim",
    );
    assert_eq!(arb.status()["counters"]["watchdog_actions"], 1);
}

#[test]
fn a_function_using_more_sm_time_than_its_share_gets_the_watchdog() {
    let sim = SimGpu::exact(1, "16GiB");
    // The shim check is off: this catches a process whose launches escape the shim some other
    // way (raw driver pointers, direct ioctls), from NVML's per-process SM samples alone.
    let arb = Arbiter::new(
        &sim,
        "[watchdog]\naction = \"sigkill\"\ncheck_shim = false\n",
    );
    let mut trainer = sim
        .command(smore_e2e::bin("sim-trainer"))
        .args([
            "--kernels",
            "4",
            "--kernel-us",
            "5000",
            "--seconds",
            "30",
            "--quiet",
        ])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    arb.wait_for_training(0, Duration::from_secs(10));
    eprintln!("before: {}", arb.status()["gpus"][0]);
    let child = run_without_shim(&arb, "greedy")
        .arg(smore_e2e::bin("sim-function"))
        .args(["--interval-ms", "0", "--seconds", "30", "--quiet"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert_killed_by_the_watchdog(&arb, child, Duration::from_secs(20), "over its share");
    trainer.kill().unwrap();
    trainer.wait().unwrap();
}

/// A process holds one grant (issue 12, item 13): a second registration from it, on another
/// connection, is refused `invalid` with the instance it holds, and nothing is counted; once the
/// first is released, it may register again.
#[test]
fn a_process_cannot_collect_grants() {
    let sim = SimGpu::exact(1, "16GiB");
    let arb = Arbiter::new(&sim, "");
    let first = arb.client();
    let (r, _page) = register(&first, "one", 1 << 30);
    let Reply::Granted(g) = r else {
        panic!("{r:?}")
    };
    let second = arb.client();
    match register(&second, "two", 1 << 30).0 {
        Reply::Refused { code, reason } => {
            assert_eq!(code, wire::RefuseCode::Invalid, "{reason}");
            assert!(
                reason.contains("one grant per process")
                    && reason.contains(&format!("instance {}", g.instance)),
                "{reason}"
            );
        }
        r => panic!("a second grant for the same process: {r:?}"),
    }
    assert_eq!(arb.functions().len(), 1, "nothing registered");
    drop(first);
    wait_until("the first grant released", Duration::from_secs(5), || {
        arb.functions().is_empty()
    });
    let (r, _page) = register(&second, "two", 1 << 30);
    assert!(matches!(r, Reply::Granted(_)), "{r:?}");
}

/// A `default_memory` that parses but that no GPU of the node can give (8 GiB × σ 0.95 here)
/// stops the daemon at start with what to do (issue 12, item 15), instead of refusing every
/// registration that declares no memory.
#[test]
fn a_default_memory_no_gpu_here_can_give_stops_the_daemon_at_start() {
    let sim = SimGpu::exact(1, "8GiB");
    let cfg = sim.dir().join("node.toml");
    std::fs::write(
        &cfg,
        format!(
            "[arbiter]\nsocket = {:?}\nstate_dir = {:?}\n\n[functions]\ndefault_memory = \"20GiB\"\n",
            sim.dir().join("arbiter.sock"),
            sim.dir().join("state")
        ),
    )
    .unwrap();
    let out = Command::new(SMORE)
        .envs(sim.env().iter().map(|(k, v)| (k, v)))
        .args(["arbiter", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "started: {err}");
    assert!(
        err.contains("functions.default_memory") && err.contains("more than any GPU here can give"),
        "{err}"
    );
    assert!(!sim.dir().join("arbiter.sock").exists(), "bound its socket");
}

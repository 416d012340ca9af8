//! Arbiter mode of the shim against a tiny in-test arbiter: registration over the Unix socket,
//! the grant page passed as `SCM_RIGHTS`, live changes to the page, an inherited
//! `SMORE_GRANT_FD`, and the failure policy when the arbiter cannot be used.

use smore_e2e::*;
use smore_protocol::conn::send_with_fd;
use smore_protocol::grant::{GrantPage, PAGE_BYTES};
use smore_protocol::wire::{self, Envelope, Grant, RefuseCode, Reply, Request};
use std::io::{BufRead, BufReader, Read};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;

const MIB: u64 = 1 << 20;

fn sim() -> SimGpu {
    SimGpu::builder()
        .memory("8GiB")
        .context_memory("0")
        .build()
        .expect("simulated node")
}

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
    })
}

#[test]
fn registration_maps_the_granted_page_and_follows_its_changes() {
    let sim = sim();
    let page = grant_page(64 * MIB, 100, true);
    let live = page.page;
    let (path, server, closed) = fake_arbiter(sim.dir(), granted(64 * MIB, 100), Some(page.fd));
    let mut child = sim
        .command(bin("sim-probe"))
        .env("LD_PRELOAD", shim_lib())
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
        Request::Register {
            function,
            model,
            slo_ms,
            memory,
            ..
        } => {
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
    let sim = sim();
    // Not close-on-exec: the probe inherits it, as from `smore run`.
    let page = grant_page(64 * MIB, 100, false);
    let out = run_ok(
        sim.command(bin("sim-probe"))
            .env("LD_PRELOAD", shim_lib())
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

fn probe_allocs(cmd: &mut Command) -> (Vec<String>, String) {
    let out = cmd
        .env("LD_PRELOAD", shim_lib())
        .env("SMORE_MEMORY_LIMIT", "64MiB")
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
    let sim = sim();
    let missing = sim.dir().join("no-arbiter.sock");
    // open (the default): the standalone contract applies.
    let (rcs, err) = probe_allocs(
        sim.command(bin("sim-probe"))
            .env("SMORE_ARBITER_SOCKET", &missing),
    );
    assert_eq!(rcs, ["0", "2"], "{err}");
    assert!(
        err.contains("no-arbiter.sock") && err.contains("SMORE_FAILURE=open"),
        "{err}"
    );
    // closed: nothing is allocated.
    let (rcs, err) = probe_allocs(
        sim.command(bin("sim-probe"))
            .env("SMORE_ARBITER_SOCKET", &missing)
            .env("SMORE_FAILURE", "closed"),
    );
    assert_eq!(rcs, ["2", "2"], "{err}");
    assert!(err.contains("SMORE_FAILURE=closed"), "{err}");
}

#[test]
fn a_refused_registration_applies_the_failure_policy() {
    for (policy, want) in [("open", ["0", "2"]), ("closed", ["2", "2"])] {
        let sim = sim();
        let refusal = Reply::Refused {
            code: RefuseCode::NoMemory,
            reason: "no GPU has 64 MiB".into(),
        };
        let (path, server, _) = fake_arbiter(sim.dir(), refusal, None);
        let (rcs, err) = probe_allocs(
            sim.command(bin("sim-probe"))
                .env("SMORE_ARBITER_SOCKET", &path)
                .env("SMORE_FAILURE", policy),
        );
        assert_eq!(rcs, want, "{policy}: {err}");
        assert!(
            err.contains("refused") && err.contains("no GPU has 64 MiB"),
            "{err}"
        );
        server.join().unwrap();
    }
}

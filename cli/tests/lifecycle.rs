//! The arbiter as a service (docs/arbiter.md, "Running it as a service"): SIGTERM shuts it down
//! cleanly (state persisted, socket removed), SIGHUP applies a changed θ_train live, one state
//! directory admits one arbiter, `--check` validates without starting, and the socket's
//! directory is not conjured out of a typo.

use smore_e2e::{registration, wait_exit, wait_until, Arbiter, SimGpu};
use smore_protocol::wire::Reply;
use std::process::{Command, Stdio};
use std::time::Duration;

const SMORE: &str = env!("CARGO_BIN_EXE_smore");

fn signal(pid: u32, sig: rustix::process::Signal) {
    let pid = rustix::process::Pid::from_raw(pid as i32).expect("a live arbiter has a pid > 0");
    rustix::process::kill_process(pid, sig).expect("signalling the arbiter");
}

#[test]
fn sigterm_persists_the_grants_removes_the_socket_and_exits_0() {
    let sim = SimGpu::exact(1, "16GiB");
    let mut arb = Arbiter::new(&sim, "");
    let c = arb.client();
    let (reply, _page) = c
        .call_with_fd(registration("resnet-term", None, 50.0, 1 << 30))
        .unwrap();
    let Reply::Granted(g) = reply else {
        panic!("{reply:?}")
    };
    let persisted = arb.state_dir.join("instances.json");
    // Drop the file the registration wrote: only the shutdown can write it again.
    std::fs::remove_file(&persisted).unwrap();
    let mut child = arb.take_child().unwrap();
    signal(child.id(), rustix::process::Signal::TERM);
    let status = wait_exit(
        &mut child,
        "arbiter exit on SIGTERM",
        Duration::from_secs(10),
        || arb.logs(),
    );
    let logs = arb.logs();
    assert!(status.success(), "{status:?}\n{logs}");
    assert!(logs.contains("received SIGTERM: shutting down"), "{logs}");
    assert!(!arb.socket.exists(), "socket left behind\n{logs}");
    let saved = std::fs::read_to_string(&persisted).expect("state persisted on SIGTERM");
    assert!(saved.contains("resnet-term"), "{saved}");
    // The next start re-reads it: the instance is still known under its id.
    arb.revive();
    assert!(
        arb.functions()
            .iter()
            .any(|f| f["id"] == g.instance && f["function"] == "resnet-term"),
        "{:?}",
        arb.functions()
    );
    drop(c);
}

#[test]
fn sigint_shuts_down_like_sigterm() {
    let sim = SimGpu::exact(1, "16GiB");
    let mut arb = Arbiter::new(&sim, "");
    let mut child = arb.take_child().unwrap();
    signal(child.id(), rustix::process::Signal::INT);
    let status = wait_exit(
        &mut child,
        "arbiter exit on SIGINT",
        Duration::from_secs(10),
        || arb.logs(),
    );
    assert!(status.success(), "{status:?}\n{}", arb.logs());
    assert!(!arb.socket.exists(), "{}", arb.logs());
    assert!(arb.logs().contains("received SIGINT"), "{}", arb.logs());
}

fn status_json(arb: &Arbiter) -> serde_json::Value {
    let out = arb.smore().args(["status", "--json"]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).expect("status --json is JSON")
}

#[test]
fn sighup_applies_a_changed_theta_and_names_what_needs_a_restart() {
    let sim = SimGpu::exact(1, "16GiB");
    let arb = Arbiter::new(&sim, "\n[policy]\ntheta_train = 0.1\n");
    assert_eq!(status_json(&arb)["arbiter"]["theta_train"], 0.1);
    let cfg = std::fs::read_to_string(&arb.cfg).unwrap();
    // θ changes live; the reconcile period needs a restart.
    let cfg = cfg
        .replace("theta_train = 0.1", "theta_train = 0.25")
        .replace("reconcile_ms = 50", "reconcile_ms = 60");
    std::fs::write(&arb.cfg, cfg).unwrap();
    signal(arb.pid().unwrap(), rustix::process::Signal::HUP);
    wait_until(
        "θ_train 0.25 in status --json",
        Duration::from_secs(10),
        || status_json(&arb)["arbiter"]["theta_train"] == 0.25,
    );
    let s = status_json(&arb);
    assert_eq!(s["gpus"][0]["harvest"]["theta"], 0.25, "{s}");
    wait_until("the reload logged", Duration::from_secs(5), || {
        arb.logs().contains("needs a restart")
    });
    let logs = arb.logs();
    assert!(
        logs.contains("reload applied theta_train: 0.1 -> 0.25"),
        "{logs}"
    );
    assert!(
        logs.contains("reconcile_ms: 50 -> 60 needs a restart"),
        "{logs}"
    );

    // A file that does not validate changes nothing, and the arbiter keeps serving.
    std::fs::write(&arb.cfg, "[policy]\ntheta_train = \"ten\"\n").unwrap();
    signal(arb.pid().unwrap(), rustix::process::Signal::HUP);
    wait_until("the refused reload logged", Duration::from_secs(5), || {
        arb.logs().contains("reload refused")
    });
    assert_eq!(status_json(&arb)["arbiter"]["theta_train"], 0.25);
}

#[test]
fn a_second_arbiter_on_the_same_state_dir_is_refused() {
    let sim = SimGpu::exact(1, "16GiB");
    let arb = Arbiter::new(&sim, "");
    // Another socket, the same state directory.
    let other = sim.dir().join("other.toml");
    let sock2 = sim.dir().join("other.sock");
    std::fs::write(
        &other,
        format!(
            "[arbiter]\nsocket = {sock2:?}\nstate_dir = {:?}\n",
            arb.state_dir
        ),
    )
    .unwrap();
    let mut second = sim
        .command(SMORE)
        .args(["arbiter", "--config"])
        .arg(&other)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = wait_exit(
        &mut second,
        "second arbiter refused",
        Duration::from_secs(20),
        String::new,
    );
    let mut err = String::new();
    std::io::Read::read_to_string(&mut second.stderr.take().unwrap(), &mut err).unwrap();
    assert!(!status.success(), "{err}");
    assert!(
        err.contains("already uses the state directory")
            && err.contains(&format!("pid {}", arb.pid().unwrap())),
        "{err}"
    );
    assert!(!sock2.exists(), "the refused arbiter bound its socket");
    // The first one is undisturbed.
    assert!(arb.status()["gpus"].is_array());
}

fn smore_check(sim: &SimGpu, cfg: &std::path::Path) -> std::process::Output {
    sim.command(SMORE)
        .args(["arbiter", "--check", "--config"])
        .arg(cfg)
        .output()
        .unwrap()
}

#[test]
fn check_validates_the_config_and_exits_without_starting() {
    let sim = SimGpu::exact(1, "16GiB");
    let dir = sim.dir();
    let good = dir.join("good.toml");
    let sock = dir.join("checked.sock");
    let state = dir.join("checked-state");
    std::fs::write(
        &good,
        format!(
            "[arbiter]\nsocket = {sock:?}\nstate_dir = {state:?}\n\n[policy]\ntheta_train = 0.2\n"
        ),
    )
    .unwrap();
    let out = smore_check(&sim, &good);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(stdout.contains("configuration OK"), "{stdout}");
    assert!(
        !sock.exists() && !state.exists(),
        "--check touched the node"
    );

    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "[policy]\ntheta_train = \"ten\"\n").unwrap();
    let out = smore_check(&sim, &bad);
    assert!(!out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("theta_train"),
        "{out:?}"
    );

    let deep = dir.join("deep.toml");
    std::fs::write(
        &deep,
        format!(
            "[arbiter]\nsocket = {:?}\nstate_dir = {state:?}\n",
            dir.join("no/such/dir/arbiter.sock")
        ),
    )
    .unwrap();
    let out = smore_check(&sim, &deep);
    assert!(!out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("does not exist"),
        "{out:?}"
    );
}

#[test]
fn the_arbiter_does_not_create_arbitrary_parent_directories_for_its_socket() {
    let sim = SimGpu::exact(1, "16GiB");
    let dir = sim.dir();
    let cfg = dir.join("deep.toml");
    let deep = dir.join("typo/nested/arbiter.sock");
    std::fs::write(
        &cfg,
        format!(
            "[arbiter]\nsocket = {deep:?}\nstate_dir = {:?}\n",
            dir.join("state-deep")
        ),
    )
    .unwrap();
    let out = Command::new(SMORE)
        .envs(sim.env().iter().map(|(k, v)| (k, v)))
        .args(["arbiter", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(!out.status.success(), "{out:?}");
    assert!(!dir.join("typo").exists(), "created the socket's ancestors");

    // Only the socket's own directory (like /run/smore under /run) is created.
    let shallow = dir.join("run-smore/arbiter.sock");
    std::fs::write(
        &cfg,
        format!(
            "[arbiter]\nsocket = {shallow:?}\nstate_dir = {:?}\n",
            dir.join("state-shallow")
        ),
    )
    .unwrap();
    let mut child = Command::new(SMORE)
        .envs(sim.env().iter().map(|(k, v)| (k, v)))
        .args(["arbiter", "--config"])
        .arg(&cfg)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_until(
        "the socket in its new directory",
        Duration::from_secs(30),
        || std::os::unix::net::UnixStream::connect(&shallow).is_ok(),
    );
    signal(child.id(), rustix::process::Signal::TERM);
    let status = wait_exit(
        &mut child,
        "arbiter exit",
        Duration::from_secs(10),
        String::new,
    );
    assert!(status.success(), "{status:?}");
}

/// `socket_group` hands the socket to a group: its members may use the arbiter, others get a
/// message that names the permission problem (not "is the arbiter running?").
#[test]
fn socket_group_grants_access_and_a_stranger_is_told_it_is_a_permission_problem() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    if Command::new("setpriv").arg("--version").output().is_err() {
        eprintln!("skipped: setpriv (util-linux) is not installed, so no user can be switched to");
        return;
    }
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: switching users needs root");
        return;
    }
    const GROUP: u32 = 4242;
    const NOBODY: &str = "65534";
    let sim = SimGpu::exact(1, "16GiB");
    let arb = Arbiter::new(&sim, &format!("socket_group = \"{GROUP}\"\n"));
    let meta = std::fs::metadata(&arb.socket).unwrap();
    assert_eq!(meta.gid(), GROUP, "socket group");
    assert_eq!(meta.mode() & 0o777, 0o660, "socket mode");
    // The test's node directory is private (0700); let other users reach the socket in it.
    std::fs::set_permissions(sim.dir(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let as_user = |gid: &str| {
        let mut c = Command::new("setpriv");
        c.args(["--reuid", NOBODY, "--regid", gid, "--clear-groups", SMORE])
            .args(["status", "--json"])
            .env(smore_protocol::wire::ENV_SOCKET, &arb.socket);
        c.output().unwrap()
    };
    let member = as_user(&GROUP.to_string());
    assert!(
        member.status.success(),
        "a member of socket_group: {member:?}\n{}",
        arb.logs()
    );
    let stranger = as_user(NOBODY);
    let err = String::from_utf8_lossy(&stranger.stderr);
    assert_eq!(stranger.status.code(), Some(69), "{stranger:?}");
    assert!(
        err.contains("permission denied") && err.contains("socket_group"),
        "{err}"
    );
    assert!(!err.contains("running?"), "{err}");
}

//! Who is an operator (docs/arbiter.md, "Operators"): the users and @groups of `[arbiter]
//! operators` (default: root and the arbiter's own user), never a function's process nor one of
//! its descendants whatever its user; functions running as root are warned about, or refused with
//! `[functions] allow_root = false`.

use smore_e2e::{wait_until, Arbiter, SimGpu};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

const SMORE: &str = env!("CARGO_BIN_EXE_smore");

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A function under `smore run` that sleeps; waits until it is registered, returns it and its
/// instance id.
fn sleeper(arb: &Arbiter, function: &str) -> (Child, u64) {
    let child = arb
        .smore()
        .args(["run", "--function", function, "--memory", "1GiB", "--shim"])
        .arg(smore_e2e::shim_lib())
        .args(["--", "sleep", "60"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let id = |arb: &Arbiter| {
        arb.functions()
            .into_iter()
            .find(|f| f["function"] == function)
            .and_then(|f| f["id"].as_u64())
    };
    wait_until("the function registered", Duration::from_secs(10), || {
        id(arb).is_some()
    });
    (child, id(arb).unwrap())
}

/// `command` run as a function under `smore run`.
fn as_function(arb: &Arbiter, function: &str, command: &[&str]) -> Output {
    arb.smore()
        .args(["run", "--function", function, "--memory", "1GiB", "--shim"])
        .arg(smore_e2e::shim_lib())
        .arg("--")
        .args(command)
        .output()
        .unwrap()
}

fn share_of(arb: &Arbiter, id: u64) -> u64 {
    arb.functions()
        .into_iter()
        .find(|f| f["id"] == id)
        .and_then(|f| f["share"].as_u64())
        .unwrap()
}

/// A function — its registered process, or a descendant of it — is refused operator requests
/// with a message that says why, though it runs as root (the tests' user) and root is an
/// operator by default; the admin outside any function is served.
#[test]
fn a_function_or_its_descendant_is_never_an_operator_whatever_its_user() {
    let sim = SimGpu::exact(1, "16GiB");
    let arb = Arbiter::new(&sim, "");
    let (mut victim, id) = sleeper(&arb, "victim");
    let id_s = id.to_string();
    // The function's registered process itself (`smore share` is what `smore run` exec'd).
    let out = as_function(&arb, "rogue", &[SMORE, "share", &id_s, "90"]);
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("belongs to function rogue") && err.contains("never an operator"),
        "{err}"
    );
    // A descendant of a function (a shell's child), whatever its user.
    let out = as_function(
        &arb,
        "rogue-child",
        &["sh", "-c", &format!("{SMORE} share {id_s} 90; exit $?")],
    );
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("never an operator"), "{err}");
    assert_ne!(share_of(&arb, id), 90, "nothing changed");
    // The admin (root, not a function) is an operator by default.
    let out = Command::new(SMORE)
        .args(["share", &id_s, "30", "--socket"])
        .arg(&arb.socket)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(share_of(&arb, id), 30);
    // Functions running as root are registered with a warning (the default).
    let ev = arb.status()["events"].to_string();
    assert!(ev.contains("runs as root"), "{ev}");
    victim.kill().unwrap();
    victim.wait().unwrap();
}

/// `[functions] allow_root = false` refuses a function running as root, saying why.
#[test]
fn a_node_may_refuse_functions_running_as_root() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: needs a function running as root");
        return;
    }
    let sim = SimGpu::exact(1, "16GiB");
    let arb = Arbiter::new(&sim, "\n[functions]\nallow_root = false\n");
    let out = as_function(&arb, "as-root", &["true"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(79), "{err}");
    assert!(
        err.contains("runs as root") && err.contains("allow_root"),
        "{err}"
    );
    assert!(arb.functions().is_empty());
}

/// An operator listed by group (`"@gid"`) may change shares; a user outside the list may not,
/// and root is no operator when the list does not name it. Unknown names stop `--check`.
#[test]
fn operators_listed_by_group_are_served_and_others_are_told_why() {
    use std::os::unix::fs::PermissionsExt;
    if Command::new("setpriv").arg("--version").output().is_err() {
        eprintln!("skipped: setpriv (util-linux) is not installed, so no user can be switched to");
        return;
    }
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: switching users needs root");
        return;
    }
    const ADMINS: u32 = 4343;
    const NOBODY: &str = "65534";
    let sim = SimGpu::exact(1, "16GiB");
    let arb = Arbiter::new(
        &sim,
        &format!(
            "socket_group = \"{ADMINS}\"\nsocket_mode = \"0666\"\noperators = [\"@{ADMINS}\"]\n"
        ),
    );
    std::fs::set_permissions(sim.dir(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let (mut victim, id) = sleeper(&arb, "victim");
    let share_as = |gid: &str, groups: &str, share: &str| {
        Command::new("setpriv")
            .args(["--reuid", NOBODY, "--regid", gid, "--groups", groups, SMORE])
            .args(["share", &id.to_string(), share, "--socket"])
            .arg(&arb.socket)
            .output()
            .unwrap()
    };
    // A member through a supplementary group.
    let out = share_as(NOBODY, &ADMINS.to_string(), "40");
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stderr),
        arb.logs()
    );
    assert_eq!(share_of(&arb, id), 40);
    // Not a member.
    let out = share_as(NOBODY, NOBODY, "50");
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("uid 65534 is not an operator") && err.contains("[arbiter] operators"),
        "{err}"
    );
    // Root, not listed.
    let out = Command::new(SMORE)
        .args(["share", &id.to_string(), "50", "--socket"])
        .arg(&arb.socket)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("uid 0 is not an operator"));
    assert_eq!(share_of(&arb, id), 40);
    victim.kill().unwrap();
    victim.wait().unwrap();
    // An unknown user or group is a config error `--check` reports.
    let cfg = sim.dir().join("bad.toml");
    std::fs::write(&cfg, "[arbiter]\noperators = [\"no-such-user-smore\"]\n").unwrap();
    let out = Command::new(SMORE)
        .args(["arbiter", "--check", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("arbiter.operators") && err.contains("no-such-user-smore"),
        "{err}"
    );
}

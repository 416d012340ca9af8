//! The client programs' own command-line behaviour: help, and clear errors when the driver cannot
//! be reached or an option is wrong. (Their behaviour against a driver is exercised by smore-e2e.)

use std::process::Command;

fn run(bin: &str, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(bin)
        .args(args)
        .env_remove("LD_LIBRARY_PATH")
        .env("LD_LIBRARY_PATH", "/nonexistent-smore-test")
        .output()
        .expect("spawn");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn help_lists_the_resolution_options() {
    for bin in [
        env!("CARGO_BIN_EXE_sim-probe"),
        env!("CARGO_BIN_EXE_sim-trainer"),
        env!("CARGO_BIN_EXE_sim-function"),
    ] {
        let (code, out, _) = run(bin, &["--help"]);
        assert_eq!(code, 0, "{bin}");
        assert!(
            out.contains("--resolve")
                && out.contains("--cuda-version")
                && out.contains("--per-thread"),
            "{out}"
        );
    }
}

#[test]
fn an_unknown_resolution_path_is_refused_by_name() {
    let (code, _, err) = run(
        env!("CARGO_BIN_EXE_sim-probe"),
        &["--resolve", "magic", "meminfo"],
    );
    assert_eq!(code, 1);
    assert!(err.contains("unknown --resolve \"magic\""), "{err}");
}

#[test]
fn a_missing_driver_says_where_it_looked() {
    let (code, _, err) = run(
        env!("CARGO_BIN_EXE_sim-probe"),
        &["--resolve", "dlsym", "meminfo"],
    );
    assert_eq!(code, 1);
    assert!(
        err.contains("dlopen(libcuda.so.1) failed") && err.contains("LD_LIBRARY_PATH"),
        "{err}"
    );
}

#[test]
fn direct_resolution_needs_the_linked_binary() {
    let (code, _, err) = run(
        env!("CARGO_BIN_EXE_sim-probe"),
        &["--resolve", "direct", "meminfo"],
    );
    assert_eq!(code, 1);
    assert!(err.contains("sim-probe-linked"), "{err}");
}

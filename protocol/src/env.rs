//! The shim's environment contract, seen from a program that starts other programs.
//!
//! Owns: which variables carry a grant or a connection into a shimmed process, and the one rule
//! for starting a child that must not inherit them.
//!
//! Why: a bench or the demo that sets `SMORE_SM_WINDOW_MS`/`SMORE_MEMORY_LIMIT` for its own
//! measurement, or a user's shell with `SMORE_ARBITER_SOCKET` exported, would otherwise hand those
//! to every child it starts — shares then read three times too high, and a bench's children
//! register with the user's live arbiter (docs/cli.md, "smore bench"). Children get exactly the
//! variables their starter sets on them.
//!
//! Must never: remove the simulated GPU's own configuration (`SMORE_SIM_*`), where the libraries
//! are (`SMORE_LIB_DIR`) or the diagnostics (`SMORE_LOG`, `SMORE_TRACE_SAMPLES`): they describe
//! the machine or what to record, not a grant.

use std::process::Command;

/// Variables kept when a child's grant-bearing environment is scrubbed (see the module docs).
const KEPT_PREFIXES: [&str; 4] = [
    "SMORE_SIM_",
    "SMORE_LIB_DIR",
    "SMORE_LOG",
    "SMORE_TRACE_SAMPLES",
];

/// Whether `name` carries a grant, a cap, a share or an arbiter connection into a process: every
/// `SMORE_*` variable but the machine-describing ones, and `LD_PRELOAD` (which loads the shim).
pub fn is_grant_bearing(name: &str) -> bool {
    if name == "LD_PRELOAD" {
        return true;
    }
    name.starts_with("SMORE_") && !KEPT_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// Removes from `cmd` every grant-bearing variable this process would pass on. Variables set on
/// `cmd` afterwards (`.env(..)`) still reach the child: call this first, then set what the child
/// should have.
pub fn scrub_inherited(cmd: &mut Command) -> &mut Command {
    for (k, _) in std::env::vars_os() {
        if k.to_str().is_some_and(is_grant_bearing) {
            cmd.env_remove(&k);
        }
    }
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grant_variables_are_scrubbed_and_machine_variables_kept() {
        for v in [
            "SMORE_SM_SHARE",
            "SMORE_SM_SHARE_1",
            "SMORE_MEMORY_LIMIT",
            "SMORE_SM_WINDOW_MS",
            "SMORE_ARBITER_SOCKET",
            "SMORE_ARBITER_FD",
            "SMORE_GRANT_FD",
            "SMORE_CONTENTION_PPM",
            "SMORE_FAILURE",
            "LD_PRELOAD",
        ] {
            assert!(is_grant_bearing(v), "{v}");
        }
        for v in [
            "SMORE_SIM_STATE",
            "SMORE_SIM_MODE",
            "SMORE_LIB_DIR",
            "SMORE_LOG",
            "SMORE_TRACE_SAMPLES",
            "PATH",
            "LD_LIBRARY_PATH",
        ] {
            assert!(!is_grant_bearing(v), "{v}");
        }
    }

    #[test]
    fn a_scrubbed_child_sees_only_what_its_starter_set() {
        // A variable of this test's own (no other test reads it), inherited unless scrubbed.
        std::env::set_var("SMORE_SCRUB_PROBE", "leaked");
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg("echo \"${SMORE_SCRUB_PROBE:-unset} ${SMORE_SM_SHARE:-unset} ${SMORE_SIM_STATE:-unset}\"");
        scrub_inherited(&mut cmd)
            .env("SMORE_SM_SHARE", "25")
            .env("SMORE_SIM_STATE", "/tmp/x");
        let out = cmd.output().unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "unset 25 /tmp/x"
        );
    }
}

//! Stamps `smore --version` with the git commit and the build date. Without git (a source
//! tarball) or outside a checkout the commit reads `unknown`, and the date without GNU `date`;
//! the build never fails over either.

use std::process::Command;

fn main() {
    let commit = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into());
    let dirty = Command::new("git")
        .args(["status", "--porcelain", "--untracked-files=no"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .is_some_and(|o| !o.stdout.is_empty());
    // SOURCE_DATE_EPOCH (reproducible builds) wins over the clock.
    let secs = std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs())
        });
    let suffix = if dirty { "-dirty" } else { "" };
    println!("cargo:rustc-env=SMORE_GIT_COMMIT={commit}{suffix}");
    println!("cargo:rustc-env=SMORE_BUILD_DATE={}", date(secs));
    // Rebuild when HEAD moves (a commit or a checkout: both append to logs/HEAD), not on every
    // build. `--git-path` finds them in a linked worktree too.
    for name in ["HEAD", "logs/HEAD", "index"] {
        let path = Command::new("git")
            .args(["rev-parse", "--path-format=absolute", "--git-path", name])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| String::from_utf8(o.stdout).ok());
        if let Some(p) = path.map(|p| p.trim().to_string()) {
            if std::path::Path::new(&p).exists() {
                println!("cargo:rerun-if-changed={p}");
            }
        }
    }
    println!("cargo:rerun-if-env-changed=SOURCE_DATE_EPOCH");
}

/// `YYYY-MM-DD` (UTC) of a Unix time, by `date`; `unknown` where it is missing or not GNU date.
fn date(secs: u64) -> String {
    Command::new("date")
        .args(["-u", "-d", &format!("@{secs}"), "+%Y-%m-%d"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| s.len() == 10)
        .unwrap_or_else(|| "unknown".into())
}

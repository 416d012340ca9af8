//! Where the files smore runs with live: the shim, and (for the simulated GPU) the fake driver
//! libraries and client programs. An installed smore keeps them next to the `smore` binary (or in
//! `../lib`); a development build finds them in its `target/<profile>` directory.
//!
//! This is a contract between the `smore` binary (which preloads the shim into `smore run`'s
//! child) and the demo and benchmarks (which also start the simulated GPU's programs); both find
//! files the same way through [`require`].

use std::fmt;
use std::path::PathBuf;

/// Environment variable naming an extra directory searched first.
pub const ENV_LIB_DIR: &str = "SMORE_LIB_DIR";

/// Directories searched, in order: `$SMORE_LIB_DIR`, the binary's directory, `../lib`, and (a
/// development build) `deps/`, where cdylibs built only as dependencies stay.
pub fn search_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(d) = std::env::var_os(ENV_LIB_DIR) {
        dirs.push(PathBuf::from(d));
    }
    if let Ok(exe) = std::env::current_exe() {
        if let Some(dir) = exe.parent() {
            dirs.push(dir.to_path_buf());
            dirs.push(dir.join("../lib"));
            dirs.push(dir.join("deps"));
        }
    }
    dirs
}

/// Finds a file by name: in `$SMORE_LIB_DIR` when it is set and holds the file, else the newest
/// copy in the other [`search_dirs`]. An installation has one copy; a development build can have
/// two (`target/<profile>/` and `deps/`, the latter refreshed by `cargo test` alone), and every
/// user of this lookup — `smore run`'s shim, the arbiter's check of which shim is genuine, the
/// demo — must agree on the same, current one.
pub fn find(name: &str) -> Option<PathBuf> {
    if let Some(d) = std::env::var_os(ENV_LIB_DIR) {
        let p = PathBuf::from(d).join(name);
        if p.exists() {
            return Some(p);
        }
    }
    search_dirs()
        .into_iter()
        .map(|d| d.join(name))
        .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
        .max_by_key(|(t, _)| *t)
        .map(|(_, p)| p)
}

/// A file smore needs was not found in any of the [`search_dirs`].
#[derive(Debug)]
pub struct NotInstalled {
    /// The file looked for, e.g. `libsmore_shim.so`.
    pub name: String,
    /// Where it was looked for.
    pub searched: Vec<PathBuf>,
}

impl fmt::Display for NotInstalled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} not found in {:?}: build the workspace (`cargo build --release --workspace`) or set {ENV_LIB_DIR} to the directory holding it",
            self.name, self.searched
        )
    }
}

impl std::error::Error for NotInstalled {}

/// Like [`find`], with an error that says what to build.
pub fn require(name: &str) -> Result<PathBuf, NotInstalled> {
    find(name).ok_or_else(|| NotInstalled {
        name: name.to_string(),
        searched: search_dirs(),
    })
}

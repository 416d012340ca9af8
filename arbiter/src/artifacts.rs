//! Where the files smore runs with live: the shim, and (for the simulated GPU) the fake driver
//! libraries and client programs. An installed smore keeps them next to the `smore` binary (or in
//! `../lib`); a development build finds them in its `target/<profile>` directory.

use anyhow::{bail, Result};
use std::path::PathBuf;

/// Directories searched, in order: `$SMORE_LIB_DIR`, the binary's directory, `../lib`.
pub fn search_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(d) = std::env::var_os("SMORE_LIB_DIR") {
        dirs.push(PathBuf::from(d));
    }
    if let Ok(exe) = std::env::current_exe() {
        if let Some(dir) = exe.parent() {
            dirs.push(dir.to_path_buf());
            dirs.push(dir.join("../lib"));
            // A development build: cdylibs built only as dependencies stay in deps/.
            dirs.push(dir.join("deps"));
        }
    }
    dirs
}

/// Finds a file by name in [`search_dirs`].
pub fn find(name: &str) -> Option<PathBuf> {
    search_dirs()
        .into_iter()
        .map(|d| d.join(name))
        .find(|p| p.exists())
}

/// Like [`find`], with an error that says what to build.
pub fn require(name: &str) -> Result<PathBuf> {
    match find(name) {
        Some(p) => Ok(p),
        None => bail!(
            "{name} not found in {:?}: build the workspace (`cargo build --workspace`) or set SMORE_LIB_DIR",
            search_dirs()
        ),
    }
}

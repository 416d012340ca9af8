//! Builds a link stub `libcuda.so` (SONAME `libcuda.so.1`) for `sim-probe-linked`, exactly like
//! the stubs the CUDA toolkit ships in `lib64/stubs`: it only satisfies the linker. At run time the
//! dynamic loader finds the real (or simulated) `libcuda.so.1` through LD_LIBRARY_PATH.
//!
//! The exported names are read from `src/driver.rs` (the `=> export | export_ptsz :` entries of
//! the `driver_api!` table), so the stub cannot drift from the table.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=src/driver.rs");
    let table = std::fs::read_to_string("src/driver.rs").expect("read src/driver.rs");
    let mut names = Vec::new();
    for line in table.lines() {
        let Some((_, rest)) = line.split_once(" => ") else {
            continue;
        };
        let Some((exports, _)) = rest.split_once(" : fn(") else {
            continue;
        };
        for n in exports.split('|') {
            let n = n.trim();
            if !n.is_empty() && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                names.push(n.to_string());
            }
        }
    }
    assert!(names.len() > 20, "driver table not found in src/driver.rs");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let src = out.join("cuda_stub.c");
    let body: String = names
        .iter()
        .map(|n| format!("void {n}(void) {{}}\n"))
        .collect();
    std::fs::write(&src, body).unwrap();
    let compiler = cc::Build::new().get_compiler();
    let status = Command::new(compiler.path())
        .args(["-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o"])
        .arg(out.join("libcuda.so"))
        .arg(&src)
        .status()
        .expect("run the C compiler for the libcuda link stub");
    assert!(status.success(), "building the libcuda link stub failed");
    println!("cargo:rustc-link-search=native={}", out.display());
}

//! Gives `libsmore_shim.so` a SONAME (docs/shim.md, "Release build and portability"). The shim is
//! preloaded by path (`LD_PRELOAD=/usr/lib/smore/libsmore_shim.so`), never linked against, so the
//! SONAME is the file name itself: it names the library in `ldd`, core dumps and package tools.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libsmore_shim.so");
}

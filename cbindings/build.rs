//! Gives `libsmore.so` the SONAME `libsmore.so.0` (docs/cbindings.md, "Linking"): runtimes that
//! link `-lsmore` record `libsmore.so.0` and keep working across compatible releases; an
//! incompatible change of the C ABI bumps the number.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libsmore.so.0");
}

//! Give the fake driver the real driver's SONAME, and bind its own symbol references locally so an
//! LD_PRELOADed shim cannot redirect the addresses `cuGetProcAddress` hands out (the real
//! libcuda.so.1 behaves the same way: its internal table never points into an interposer).
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic");
}

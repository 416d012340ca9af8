//! Compiles the vendored kubelet device plugin API (proto/, Apache-2.0, see proto/README.md)
//! into Rust with protox (pure Rust, no `protoc`) and tonic-prost-build.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(["deviceplugin/v1beta1/api.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}

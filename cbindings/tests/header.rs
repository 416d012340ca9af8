//! The checked-in header is what cbindgen generates from the current source (CI fails when it is
//! stale). Refresh with `SMORE_BLESS=1 cargo test -p smore-c --test header`.

#[test]
fn the_checked_in_header_is_current() {
    let dir = env!("CARGO_MANIFEST_DIR");
    let cfg = cbindgen::Config::from_file(format!("{dir}/cbindgen.toml")).unwrap();
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(cfg)
        .generate()
        .expect("cbindgen")
        .write(&mut generated);
    let path = format!("{dir}/include/smore.h");
    if std::env::var_os("SMORE_BLESS").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let current = std::fs::read(&path).unwrap_or_default();
    assert!(
        current == generated,
        "{path} is stale: run `SMORE_BLESS=1 cargo test -p smore-c --test header` and commit it"
    );
}

//! The shim benchmark (`shim-bench`) runs on the simulated GPU and prints its figures. Values
//! are not asserted (they depend on the machine); that every figure is printed and finite is.

use smore_e2e::*;

#[test]
fn the_shim_benchmark_prints_its_figures() {
    let sim = SimGpu::exact(1, "8GiB");
    let out = run_ok(
        sim.command(bin("shim-bench"))
            .arg("--shim")
            .arg(shim_lib())
            .arg("--quick"),
    )
    .unwrap();
    eprintln!("{out}");
    let l = parse_lines(&out);
    for kind in ["launch", "alloc1", "alloc8t", "alloc8p"] {
        let line = out
            .lines()
            .find(|x| x.starts_with(kind))
            .unwrap_or_else(|| panic!("no {kind} figures in:\n{out}"));
        let f = &parse_lines(line)[0];
        for key in ["bare_ns", "shim_ns", "added_ns"] {
            assert!(num(f, key).is_finite(), "{kind} {key}: {line}");
        }
    }
    let shares: Vec<_> = l.iter().filter(|f| f.contains_key("share")).collect();
    assert_eq!(shares.len(), 2, "{out}");
    for s in shares {
        assert!(
            num(s, "alone") > 0.0 && num(s, "beside_trainer") > 0.0,
            "{s:?}"
        );
    }
}

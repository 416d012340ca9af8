//! The shim benchmark (`shim-bench`) runs on the simulated GPU and prints its figures. Overhead
//! values are not asserted (they depend on the machine); that every figure is printed and finite
//! is, and that the share runs measure the share they were asked for — not one set by the
//! overhead phase or by the user's shell (issue: shares read three times too high when
//! `SMORE_SM_WINDOW_MS` leaked from the overhead phase into the share runs).

use smore_e2e::*;

#[test]
fn the_shim_benchmark_prints_its_figures() {
    let sim = SimGpu::exact(1, "8GiB");
    let out = run_ok(
        sim.command(bin("shim-bench"))
            .arg("--shim")
            .arg(shim_lib())
            .arg("--quick")
            // A user's shell with smore variables exported: none of them may reach the children.
            .env("SMORE_SM_WINDOW_MS", "10000")
            .env("SMORE_SM_SHARE", "99")
            .env("SMORE_ARBITER_SOCKET", "/nonexistent/smore.sock"),
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
        // Alone, a function held to `share` % gets about that share; what this checks is that
        // nothing leaked into the share runs (a leaked 10 s window gave 93 % at share 25, three
        // times the share). The quick runs last 1 s from start-up, so the bucket's initial fill
        // (one 100 ms window, the shim's DEFAULT_WINDOW_MS) adds up to share × 0.1; the bound
        // is checked where a leak shows (shares up to 50 %) with a wide band for loaded machines.
        let want = num(s, "share");
        let alone = num(s, "alone");
        if want > 50.0 {
            continue;
        }
        assert!(
            (want - 8.0..=want * 1.1 + 10.0).contains(&alone),
            "share {want} %: alone {alone:.1} %\n{out}"
        );
    }
}

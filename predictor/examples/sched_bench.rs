//! Prints decision latency of SMORE Algorithm 1 and the multi-way query latency (see
//! `smore_predictor::bench`): `cargo run -p smore-predictor --release --example sched_bench`.
fn main() -> anyhow::Result<()> {
    smore_predictor::bench::run()
}

//! Scriptable driver client, reaching the driver through dlsym or cuGetProcAddress.
fn main() {
    if let Err(e) = smore_sim_clients::probe::main_with(None) {
        eprintln!("sim-probe: {e:#}");
        std::process::exit(1);
    }
}

//! Scriptable driver client linked against libcuda.so.1 (direct linking, as programs built with
//! `-lcuda` do). It also accepts `--resolve dlsym|procaddr`.
smore_sim_clients::declare_direct_driver!();

fn main() {
    if let Err(e) = smore_sim_clients::probe::main_with(Some(&direct_table)) {
        eprintln!("sim-probe-linked: {e:#}");
        std::process::exit(1);
    }
}

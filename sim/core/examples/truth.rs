// TEMPORARY diagnostic, not committed.
fn main() {
    let mut a = std::env::args().skip(1);
    let path = a.next().unwrap();
    let n = smore_simgpu::Node::observe(&path).unwrap();
    for pid in a {
        let pid: u32 = pid.parse().unwrap();
        if let Some(t) = n.truth_of(0, pid) {
            println!(
                "{pid} {} {} {} {}",
                t.gpu_active_ns, t.work_ns, t.interference_ns, t.imposed_ns
            );
        }
    }
}

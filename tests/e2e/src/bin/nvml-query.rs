//! Prints what NVML says about every device, through `nvml-wrapper` — the crate the arbiter
//! uses — so tests can check the simulated NVML works under it. One `key=value` line per fact.
use nvml_wrapper::Nvml;
use std::ffi::OsStr;

/// `--since-ago-ms N`: ask for process-utilization samples newer than now − N ms (wall clock, µs
/// since the Unix epoch, as HAMi-core does); without it, every sample NVML keeps (lastSeen = 0).
fn since_us() -> Result<u64, Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().position(|a| a == "--since-ago-ms") {
        None => Ok(0),
        Some(i) => {
            let ms: u64 = args
                .get(i + 1)
                .ok_or("--since-ago-ms needs a value")?
                .parse()?;
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
            Ok((now.as_micros() as u64).saturating_sub(ms * 1000))
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let since = since_us()?;
    let nvml = Nvml::builder()
        .lib_path(OsStr::new("libnvidia-ml.so.1"))
        .init()?;
    let n = nvml.device_count()?;
    println!("op=count devices={n} driver={}", nvml.sys_driver_version()?);
    for i in 0..n {
        let d = nvml.device_by_index(i)?;
        let m = d.memory_info()?;
        println!(
            "op=device index={i} name={:?} uuid={} total={} used={} free={} util={}",
            d.name()?.replace(' ', "_"),
            d.uuid()?,
            m.total,
            m.used,
            m.free,
            d.utilization_rates()?.gpu
        );
        for p in d.running_compute_processes()? {
            let used = match p.used_gpu_memory {
                nvml_wrapper::enums::device::UsedGpuMemory::Used(b) => b,
                nvml_wrapper::enums::device::UsedGpuMemory::Unavailable => 0,
            };
            println!("op=process index={i} pid={} used={used}", p.pid);
        }
        for p in d.mps_running_compute_processes()? {
            println!("op=mps index={i} pid={}", p.pid);
        }
        match d.process_utilization_stats(since) {
            Ok(samples) => {
                for s in samples {
                    println!(
                        "op=putil index={i} pid={} sm={} ts={} since={since}",
                        s.pid, s.sm_util, s.timestamp
                    );
                }
            }
            Err(nvml_wrapper::error::NvmlError::NotFound) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

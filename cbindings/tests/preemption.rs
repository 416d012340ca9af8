//! A runtime on the C ABI learns that the arbiter preempted its instance (training needs the
//! memory back; docs/arbiter.md, "Memory headroom and reclaim"): `smore_admit` answers
//! `SMORE_STATUS_PREEMPTED` with the arbiter's reason, every later request is refused the same
//! way without asking, and `smore_poll_preemption` reports it with the grace left.

use smore::{
    smore_admit, smore_connect, smore_disconnect, smore_last_error, smore_poll_preemption,
    smore_register, smore_request_begin, SmoreAdmission, SmoreGrant, SmorePreemption, SmoreStatus,
};
use smore_e2e::{bin, wait_until, Arbiter, SimGpu};
use std::ffi::{CStr, CString};
use std::time::Duration;

fn last_error() -> String {
    // SAFETY: smore_last_error returns a valid NUL-terminated string owned by this thread.
    unsafe { CStr::from_ptr(smore_last_error()) }
        .to_string_lossy()
        .into_owned()
}

#[test]
fn a_preempted_runtime_is_told_why_and_its_requests_are_refused() {
    let sim = SimGpu::exact(1, "8GiB");
    // The memory below is held by a child process without the shim: no shim check. The grace
    // is long because the instance's process is this test's (it is released before then).
    let arb = Arbiter::new(
        &sim,
        "\n[policy]\ntraining_headroom = \"1GiB\"\ntraining_headroom_fraction = 0.0\npreempt_grace_ms = 600000\n\n[watchdog]\ncheck_shim = false\n",
    );
    let start = sim.dir().join("second");
    // Started through a shell that exits at once: the trainer is no descendant of this process
    // (whose descendants' GPU memory is the instance's).
    let out = sim
        .command("sh")
        .arg("-c")
        .arg(format!(
            "{} --memory-mib 1024 --second-after-ms 0 --second-mib 2048 --seconds 30 --kernels 2 --kernel-us 2000 --host-ms 10 --quiet --grow-start-file {} >/dev/null 2>&1 & echo $!",
            bin("sim-trainer").display(),
            start.display()
        ))
        .output()
        .unwrap();
    let trainer: i32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    arb.wait_for_training(0, Duration::from_secs(30));
    let socket = CString::new(arb.socket.display().to_string()).unwrap();
    let function = CString::new("capi").unwrap();
    let mut h = std::ptr::null_mut();
    let mut grant = SmoreGrant {
        instance: 0,
        gpu_index: 0,
        sm_share: 0,
        memory_cap: 0,
    };
    // SAFETY: valid C strings and out-pointers; the handle is disconnected below.
    unsafe {
        assert_eq!(smore_connect(socket.as_ptr(), &mut h), SmoreStatus::Ok);
        assert_eq!(
            smore_register(
                h,
                function.as_ptr(),
                std::ptr::null(),
                50.0,
                5 << 30,
                &mut grant
            ),
            SmoreStatus::Ok,
            "{}",
            last_error()
        );
    }
    // A child of this process holds 4 GiB on the GPU: the instance's memory.
    let mut holder = sim.spawn_memory_holder(0, "4GiB");
    wait_until("the instance's 4 GiB seen", Duration::from_secs(20), || {
        arb.functions()
            .first()
            .is_some_and(|f| f["nvml_used"].as_u64() == Some(4 << 30))
    });
    // A second training process (2 GiB): 3 + 1 headroom + 5 GiB cap > 7.76 GiB; lowering the
    // cap to 4 GiB is not enough, the instance is preempted.
    std::fs::write(&start, b"").unwrap();
    let mut adm = SmoreAdmission {
        admitted: 0,
        predicted_train: 0.0,
        predicted_fn: 0.0,
    };
    let mut status = SmoreStatus::Ok;
    wait_until(
        "admission answers preempted",
        Duration::from_secs(30),
        || {
            let mut id = 0;
            // SAFETY: a live handle and valid out-pointers.
            unsafe {
                status = smore_request_begin(h, &mut id);
                if status == SmoreStatus::Ok {
                    status = smore_admit(h, id, &mut adm);
                }
            }
            std::thread::sleep(Duration::from_millis(20));
            status == SmoreStatus::Preempted
        },
    );
    let msg = last_error();
    assert!(
        msg.contains("preempted") && msg.contains("GPU 0") && msg.contains("exit within"),
        "{msg}"
    );
    assert_eq!(adm.admitted, 0);
    let mut id = 0;
    let mut p = SmorePreemption {
        preempted: 0,
        unload: 0,
        grace_ms: 0,
    };
    // SAFETY: a live handle and valid out-pointers.
    unsafe {
        assert_eq!(smore_request_begin(h, &mut id), SmoreStatus::Preempted);
        assert_eq!(smore_poll_preemption(h, &mut p), SmoreStatus::Preempted);
    }
    assert_eq!((p.preempted, p.unload), (1, 0));
    assert!(p.grace_ms > 0 && p.grace_ms <= 600_000, "{}", p.grace_ms);
    let st = arb.status();
    assert!(
        st["counters"]["preempted_requests"].as_u64() >= Some(1),
        "{st}"
    );
    // Disconnecting releases the grant (before the deadline: the process is this test).
    // SAFETY: the handle from smore_connect, freed once.
    unsafe { smore_disconnect(h) };
    wait_until("released", Duration::from_secs(10), || {
        arb.functions().is_empty()
    });
    let _ = holder.kill();
    let _ = holder.wait();
    // The trainer this test started (its second process stops by itself after --seconds).
    let _ = std::process::Command::new("kill")
        .arg(trainer.to_string())
        .status();
}

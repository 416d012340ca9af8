//! Clock, sleep, fork hook and the runtime slot: thin, audited wrappers over libc.
//!
//! Must never: block except in [`sleep_until`], or take a lock in the fork-child handler.

use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering::*};

/// CLOCK_MONOTONIC in ns (a vDSO read, no syscall on Linux x86-64/aarch64).
#[inline]
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC is always supported.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Sleeps until the CLOCK_MONOTONIC instant `deadline_ns` (absolute: no drift from 10 ms ticks or
/// from the time spent computing the deadline). Retries on EINTR.
pub fn sleep_until(deadline_ns: u64) {
    let ts = libc::timespec {
        tv_sec: (deadline_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (deadline_ns % 1_000_000_000) as libc::c_long,
    };
    loop {
        // SAFETY: `ts` is a valid timespec; a null remainder is allowed with TIMER_ABSTIME.
        let r = unsafe {
            libc::clock_nanosleep(
                libc::CLOCK_MONOTONIC,
                libc::TIMER_ABSTIME,
                &ts,
                std::ptr::null_mut(),
            )
        };
        if r != libc::EINTR {
            return;
        }
    }
}

/// A slot holding a leaked `&'static T` that can be emptied without freeing (fork child: the
/// old value may be mid-use by a thread that no longer exists, and its locks may be held).
pub struct LeakedSlot<T>(AtomicPtr<T>);

impl<T> LeakedSlot<T> {
    pub const fn new() -> Self {
        LeakedSlot(AtomicPtr::new(std::ptr::null_mut()))
    }

    #[inline]
    pub fn get(&self) -> Option<&'static T> {
        let p = self.0.load(Acquire);
        // SAFETY: the slot only ever holds null or a pointer from `Box::leak` in `install`, and
        // leaked values are never freed, so a non-null pointer is valid for 'static.
        unsafe { p.as_ref() }
    }

    /// Installs `v` unless another thread won; returns the value in the slot.
    pub fn install(&self, v: Box<T>) -> &'static T {
        let p: *mut T = Box::leak(v);
        match self
            .0
            .compare_exchange(std::ptr::null_mut(), p, AcqRel, Acquire)
        {
            // SAFETY: `p` is the leaked box we just stored.
            Ok(_) => unsafe { &*p },
            Err(cur) => {
                // SAFETY: we still own `p` (never published); `cur` is a leaked value (see get).
                unsafe {
                    drop(Box::from_raw(p));
                    &*cur
                }
            }
        }
    }

    /// Empties the slot, leaking the old value (lock-free: safe in a fork child handler).
    pub fn clear(&self) {
        self.0.store(std::ptr::null_mut(), Release);
    }
}

impl<T> Default for LeakedSlot<T> {
    fn default() -> Self {
        Self::new()
    }
}

static ATFORK: AtomicBool = AtomicBool::new(false);

extern "C" fn child_after_fork() {
    // No locks, no allocation: only atomic stores (see runtime::after_fork_child).
    let _ = std::panic::catch_unwind(crate::runtime::after_fork_child);
}

/// Registers the fork-child handler once per process image.
pub fn register_atfork() {
    if ATFORK.swap(true, AcqRel) {
        return;
    }
    // SAFETY: registering a plain extern "C" fn with no prepare/parent handlers.
    unsafe { libc::pthread_atfork(None, None, Some(child_after_fork)) };
}

/// This process's id (getpid: cheap, not cached across fork by glibc ≥ 2.25).
pub fn pid() -> u32 {
    std::process::id()
}

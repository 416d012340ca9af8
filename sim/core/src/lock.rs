//! A process-shared, robust pthread mutex living inside the mapped node file. Robust means that
//! when a process dies holding it (a test SIGKILLs one), the next locker gets `EOWNERDEAD`, marks
//! it consistent and goes on, instead of every process of the node hanging forever.

use std::cell::UnsafeCell;

#[repr(C)]
pub struct SharedMutex {
    inner: UnsafeCell<libc::pthread_mutex_t>,
}

impl SharedMutex {
    /// Initialises the mutex in place.
    ///
    /// # Safety
    /// `this` must point into the mapped state, and no other process may use the mutex yet
    /// (the creator holds the file lock and has not published the magic number).
    pub unsafe fn init(this: *const SharedMutex) {
        // SAFETY: `pthread_mutexattr_t` is a plain C struct for which all-zero bytes are a valid
        // (uninitialised) value; `pthread_mutexattr_init` below initialises it before any use.
        let mut attr: libc::pthread_mutexattr_t = unsafe { std::mem::zeroed() };
        // SAFETY: `attr` is a live local; init/setpshared/setrobust/destroy are called in the
        // order POSIX requires, and `attr` is not used after `pthread_mutexattr_destroy`.
        unsafe {
            libc::pthread_mutexattr_init(&mut attr);
            libc::pthread_mutexattr_setpshared(&mut attr, libc::PTHREAD_PROCESS_SHARED);
            libc::pthread_mutexattr_setrobust(&mut attr, libc::PTHREAD_MUTEX_ROBUST);
        }
        // SAFETY: the caller guarantees `this` points into the mapped state and that no other
        // process uses the mutex yet, so initialising it in place races with nobody.
        unsafe { libc::pthread_mutex_init((*this).inner.get(), &attr) };
        // SAFETY: `attr` was initialised above and is not used again.
        unsafe { libc::pthread_mutexattr_destroy(&mut attr) };
    }

    /// Locks; returns a guard that unlocks on drop.
    pub fn lock(&self) -> Guard<'_> {
        // SAFETY: the mutex was initialised by the node creator before the magic was published,
        // and lives in a mapping that outlives every guard (the node is never unmapped).
        let rc = unsafe { libc::pthread_mutex_lock(self.inner.get()) };
        if rc == libc::EOWNERDEAD {
            // The previous holder died; the protected state may be mid-update, which the
            // scheduler tolerates (it re-derives counts it cannot trust on the next reap).
            // SAFETY: we hold the mutex (EOWNERDEAD returns it locked).
            unsafe { libc::pthread_mutex_consistent(self.inner.get()) };
        }
        Guard { m: self }
    }
}

pub struct Guard<'a> {
    m: &'a SharedMutex,
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        // SAFETY: this guard holds the lock.
        unsafe { libc::pthread_mutex_unlock(self.m.inner.get()) };
    }
}

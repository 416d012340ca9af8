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
        let mut attr: libc::pthread_mutexattr_t = std::mem::zeroed();
        libc::pthread_mutexattr_init(&mut attr);
        libc::pthread_mutexattr_setpshared(&mut attr, libc::PTHREAD_PROCESS_SHARED);
        libc::pthread_mutexattr_setrobust(&mut attr, libc::PTHREAD_MUTEX_ROBUST);
        libc::pthread_mutex_init((*this).inner.get(), &attr);
        libc::pthread_mutexattr_destroy(&mut attr);
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

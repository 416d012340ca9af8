//! Maps the arbiter's grant page (a sealed memfd) read-only, and read-write a grant's shared
//! ledger (`smore_protocol::ledger`, made by `smore run`) and a GPU's turn board
//! (`smore_protocol::board`, made by the arbiter).
//!
//! Must never: map the grant page writable, accept an fd smaller than the page layout, or return a page
//! whose magic / version is not ours (a wrong fd must not be read as limits).

use smore_protocol::board::{TurnBoard, BOARD_BYTES};
use smore_protocol::grant::{GrantPage, PAGE_BYTES};
use smore_protocol::ledger::{LedgerTable, LEDGER_BYTES};
use std::os::fd::RawFd;

/// Which file an fd is open on: two fds name the same grant page when these are equal (a
/// restarted arbiter's page for the same instance is another memfd, another inode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileId {
    dev: u64,
    ino: u64,
}

/// The file `fd` is open on (`fstat`); None when `fd` is not open.
pub fn file_id(fd: RawFd) -> Option<FileId> {
    // SAFETY: `libc::stat` is plain old data, for which all-zero bytes are a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat on any integer is safe (EBADF for a non-fd); `st` is a valid out pointer.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return None;
    }
    Some(FileId {
        dev: st.st_dev,
        ino: st.st_ino,
    })
}

/// Maps `fd` (`PROT_READ`, `MAP_SHARED`) and checks it holds a [`GrantPage`] of our layout. The
/// mapping is never unmapped: the page is the process's live limits until it exits. The fd itself
/// may be closed afterwards (the mapping keeps the memfd alive).
pub fn map_fd(fd: RawFd) -> Result<&'static GrantPage, String> {
    // SAFETY: `libc::stat` is plain old data, for which all-zero bytes are a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat on any integer is safe (EBADF for a non-fd); `st` is a valid out pointer.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(format!(
            "fd {fd} is not open ({})",
            std::io::Error::last_os_error()
        ));
    }
    if (st.st_size as u64) < std::mem::size_of::<GrantPage>() as u64 {
        return Err(format!(
            "fd {fd} holds {} bytes, less than a grant page ({} bytes)",
            st.st_size,
            std::mem::size_of::<GrantPage>()
        ));
    }
    // SAFETY: a fresh read-only shared mapping of an open fd; the kernel checks the rest.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            PAGE_BYTES,
            libc::PROT_READ,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(format!(
            "mmap of fd {fd} failed: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: the mapping is PAGE_BYTES ≥ size_of::<GrantPage>() long (asserted in the protocol
    // crate), page-aligned, lives for the rest of the process (never unmapped), and every field
    // the shim reads after the header is an atomic (loads are valid on read-only memory).
    let page: &'static GrantPage = unsafe { &*(p as *const GrantPage) };
    if !page.is_valid() {
        // SAFETY: unmapping the mapping we just made; nothing references it.
        unsafe { libc::munmap(p, PAGE_BYTES) };
        return Err(format!(
            "fd {fd} is not a smore grant page (magic or layout version differ)"
        ));
    }
    Ok(page)
}

/// Maps `fd` (`PROT_READ | PROT_WRITE`, `MAP_SHARED`) and checks it holds a [`LedgerTable`] of
/// our layout. Never unmapped (the table is the process's ledger until it exits); a fork child
/// inherits the mapping, an exec'd descendant maps the inherited fd again.
pub fn map_ledger_fd(fd: RawFd) -> Result<&'static LedgerTable, String> {
    map_shared(fd, LEDGER_BYTES, "shared ledger", LedgerTable::is_valid)
}

/// Maps `fd` (`PROT_READ | PROT_WRITE`, `MAP_SHARED`) and checks it holds a [`TurnBoard`] of our
/// layout (the GPU's turn board, from the arbiter). Never unmapped, like the ledger.
pub fn map_board_fd(fd: RawFd) -> Result<&'static TurnBoard, String> {
    // Every function of the GPU maps it: one that could shrink it would make the others' next
    // access fault. The arbiter's boards are sealed against it; a board that is not is refused.
    // SAFETY: fcntl(F_GET_SEALS) on any integer is safe (EBADF / EINVAL for a non-memfd).
    let seals = unsafe { libc::fcntl(fd, libc::F_GET_SEALS) };
    if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
        return Err(format!(
            "fd {fd} is not sealed against shrinking (not an arbiter's turn board)"
        ));
    }
    map_shared(fd, BOARD_BYTES, "turn board", TurnBoard::is_valid)
}

/// A table shared read-write between processes: every field written after its creation is an
/// atomic, and all-zero bytes are a valid value of it (its creator zero-fills the memfd).
trait SharedTable {}
impl SharedTable for LedgerTable {}
impl SharedTable for TurnBoard {}

/// Maps `fd` of exactly `bytes` read-write and shared, as a `T` that `valid` accepts.
fn map_shared<T: SharedTable>(
    fd: RawFd,
    bytes: usize,
    what: &str,
    valid: fn(&T) -> bool,
) -> Result<&'static T, String> {
    // SAFETY: `libc::stat` is plain old data, for which all-zero bytes are a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat on any integer is safe (EBADF for a non-fd); `st` is a valid out pointer.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(format!(
            "fd {fd} is not open ({})",
            std::io::Error::last_os_error()
        ));
    }
    if st.st_size as u64 != bytes as u64 {
        return Err(format!(
            "fd {fd} holds {} bytes, not a {what}'s {bytes}",
            st.st_size
        ));
    }
    debug_assert!(std::mem::size_of::<T>() <= bytes);
    // SAFETY: a fresh shared mapping of an open fd of `bytes`; the kernel checks the rest.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(format!(
            "mmap of fd {fd} failed: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: the mapping is `bytes` ≥ size_of::<T>() long (the protocol crate sizes both
    // tables' memfds to whole pages of their layouts), page-aligned, lives for the rest of the
    // process (never unmapped), and `T: SharedTable` — every field written after creation is an
    // atomic (other processes write it concurrently through the same atomics) and zero bytes
    // are valid.
    let table: &'static T = unsafe { &*(p as *const T) };
    if !valid(table) {
        // SAFETY: unmapping the mapping we just made; nothing references it.
        unsafe { libc::munmap(p, bytes) };
        return Err(format!(
            "fd {fd} is not a smore {what} (magic or layout version differ)"
        ));
    }
    Ok(table)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

    fn memfd(bytes: usize) -> OwnedFd {
        // SAFETY: memfd_create with a NUL-terminated name; the result is checked and owned.
        let fd = unsafe { libc::memfd_create(c"smore-shim-test".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: a fresh fd we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: ftruncate on our own fd.
        let rc = unsafe { libc::ftruncate(fd.as_raw_fd(), bytes as libc::off_t) };
        assert_eq!(rc, 0);
        fd
    }

    #[test]
    fn only_a_shared_ledger_of_our_layout_is_mapped_and_writes_are_shared() {
        let e = map_ledger_fd(memfd(LEDGER_BYTES).as_raw_fd()).unwrap_err();
        assert!(e.contains("not a smore shared ledger"), "{e}");
        let e = map_ledger_fd(memfd(PAGE_BYTES).as_raw_fd()).unwrap_err();
        assert!(e.contains("not a shared ledger's"), "{e}");
        let fd = smore_protocol::ledger::create().unwrap();
        let a = map_ledger_fd(fd.as_raw_fd()).unwrap();
        let b = map_ledger_fd(fd.as_raw_fd()).unwrap();
        a.slots[3].bytes[1].store(77, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(
            b.slots[3].bytes[1].load(std::sync::atomic::Ordering::SeqCst),
            77
        );
    }

    #[test]
    fn only_a_turn_board_of_our_layout_is_mapped_and_writes_are_shared() {
        let e = map_board_fd(memfd(BOARD_BYTES).as_raw_fd()).unwrap_err();
        assert!(e.contains("not sealed"), "{e}");
        let board = |fd: OwnedFd| {
            map_shared(
                fd.as_raw_fd(),
                BOARD_BYTES,
                "turn board",
                TurnBoard::is_valid,
            )
        };
        let e = board(memfd(BOARD_BYTES)).unwrap_err();
        assert!(e.contains("not a smore turn board"), "{e}");
        let e = board(memfd(LEDGER_BYTES)).unwrap_err();
        assert!(e.contains("not a turn board's"), "{e}");
        let fd = smore_protocol::board::create().unwrap();
        let a = map_board_fd(fd.as_raw_fd()).unwrap();
        let b = map_board_fd(fd.as_raw_fd()).unwrap();
        a.turn.store(42, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(b.turn.load(std::sync::atomic::Ordering::SeqCst), 42);
        assert_eq!(b.enabled.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[test]
    fn only_a_grant_page_of_our_layout_is_mapped() {
        let zeros = memfd(PAGE_BYTES);
        let e = map_fd(zeros.as_raw_fd()).unwrap_err();
        assert!(e.contains("not a smore grant page"), "{e}");
        let short = memfd(16);
        let e = map_fd(short.as_raw_fd()).unwrap_err();
        assert!(e.contains("less than a grant page"), "{e}");
        let good = memfd(PAGE_BYTES);
        let page = GrantPage::unlimited();
        page.set(0, 1 << 30, 40);
        // SAFETY: writing the page's bytes into our own memfd (a plain copy of a repr(C) value).
        let bytes = unsafe {
            std::slice::from_raw_parts(
                &page as *const GrantPage as *const u8,
                std::mem::size_of::<GrantPage>(),
            )
        };
        // SAFETY: pwrite of a valid buffer to our own fd.
        let n = unsafe { libc::pwrite(good.as_raw_fd(), bytes.as_ptr().cast(), bytes.len(), 0) };
        assert_eq!(n as usize, bytes.len());
        let mapped = map_fd(good.as_raw_fd()).unwrap();
        assert_eq!(mapped.cap(0), 1 << 30);
        assert_eq!(mapped.share(0), 40);
    }
}

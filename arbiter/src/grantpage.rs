//! The grant page the arbiter owns: a 4 KiB sealed memfd holding a [`GrantPage`].
//!
//! The arbiter maps the page read-write *before* sealing it with `F_SEAL_FUTURE_WRITE`, so its own
//! mapping stays writable while every later mapping — the shim's, or one made by re-opening
//! `/proc/<pid>/fd/N` — can only be read-only; `F_SEAL_SHRINK|GROW` keep the size fixed and
//! `F_SEAL_SEAL` freezes the seals. A function process therefore cannot raise its own cap or
//! share. This is the only module of the arbiter with `unsafe` (one mmap, one munmap, one
//! reference to the mapping — for the grant page and for the GPU's turn board).
//!
//! The turn board ([`BoardHandle`], `smore_protocol::board`) is the other memfd the arbiter hands
//! to functions: one per GPU, writable by every function on it (they take turns through it), so
//! it is sealed only against resizing; the arbiter writes its `enabled` word and the seats' owner
//! words (every round) and clears a seat it frees.

use smore_protocol::board::{TurnBoard, BOARD_BYTES};
use smore_protocol::grant::{GrantPage, PAGE_BYTES};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;

/// A GPU's turn board, mapped read-write (docs/harvest.md, "Serializing the functions").
pub struct BoardHandle {
    fd: OwnedFd,
    ptr: NonNull<TurnBoard>,
}

// SAFETY: the mapping is shared memory whose every mutable field is an atomic; the pointer is
// valid for the life of the handle and accessed only through `&TurnBoard`.
unsafe impl Send for BoardHandle {}
// SAFETY: as above — concurrent access goes through atomics only.
unsafe impl Sync for BoardHandle {}

impl BoardHandle {
    /// Creates an empty board, turns on.
    pub fn new() -> std::io::Result<BoardHandle> {
        let fd = smore_protocol::board::create()?;
        // SAFETY: a fresh shared mapping of a file `create` sized to BOARD_BYTES and sealed
        // against resizing; the kernel picks the address.
        let p = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                BOARD_BYTES,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::SHARED,
                &fd,
                0,
            )?
        };
        let ptr = NonNull::new(p.cast::<TurnBoard>()).ok_or(std::io::ErrorKind::Other)?;
        Ok(BoardHandle { fd, ptr })
    }

    /// The live board (writes go through its atomics).
    pub fn board(&self) -> &TurnBoard {
        // SAFETY: `ptr` points at a TurnBoard (header written by `create`, the rest zero: every
        // field is an integer or atomic, for which zero is valid) in a mapping of BOARD_BYTES ≥
        // its size that lives as long as `self`; all mutation is through atomics.
        unsafe { self.ptr.as_ref() }
    }

    /// Turns the GPU's turns on (time-sliced) or off (MPS).
    pub fn set_enabled(&self, on: bool) {
        self.board()
            .enabled
            .store(u32::from(on), std::sync::atomic::Ordering::Relaxed);
    }

    /// Gives seat `seat` to instance `id`: its owner word, nobody in line there.
    pub fn claim(&self, seat: usize, id: u64) {
        use std::sync::atomic::Ordering::SeqCst;
        if let Some(m) = self.board().members.get(seat) {
            m.key.store(0, SeqCst);
            m.seen_ns.store(0, SeqCst);
            m.owner.store(id, SeqCst);
        }
    }

    /// Frees seat `seat` (its instance was released), and the turn if the seat holds it.
    pub fn vacate(&self, seat: usize) {
        use std::sync::atomic::Ordering::SeqCst;
        let b = self.board();
        if let Some(m) = b.members.get(seat) {
            m.owner.store(0, SeqCst);
            m.key.store(0, SeqCst);
            m.seen_ns.store(0, SeqCst);
        }
        let word = b.turn.load(SeqCst);
        if smore_protocol::board::split_turn(word).0 == Some(seat) {
            let _ = b.turn.compare_exchange(word, 0, SeqCst, SeqCst);
        }
    }

    /// Rewrites every seat's owner word (the instance seated there, 0 = free): the board is the
    /// functions' to write, and the shims pass over a waiter on a seat without an owner.
    pub fn set_owners(&self, owners: &[u64; smore_protocol::board::BOARD_MEMBERS]) {
        use std::sync::atomic::Ordering::Relaxed;
        for (m, o) in self.board().members.iter().zip(owners) {
            if m.owner.load(Relaxed) != *o {
                m.owner.store(*o, Relaxed);
            }
        }
    }

    /// The fd to pass to the function process.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Drop for BoardHandle {
    fn drop(&mut self) {
        // SAFETY: `ptr`/BOARD_BYTES is exactly the mapping made in `new`, unmapped once; no
        // reference from `board()` outlives `self`.
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), BOARD_BYTES) };
    }
}

impl std::fmt::Debug for BoardHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BoardHandle").field("fd", &self.fd).finish()
    }
}

/// An owned, sealed, writable-by-us grant page.
pub struct PageHandle {
    fd: OwnedFd,
    ptr: NonNull<GrantPage>,
}

// SAFETY: the mapping is shared memory whose every mutable field is an atomic; the pointer is
// valid for the life of the handle and accessed only through `&GrantPage`.
unsafe impl Send for PageHandle {}
// SAFETY: as above — concurrent access goes through atomics only.
unsafe impl Sync for PageHandle {}

impl PageHandle {
    /// Creates a page with every device uncapped and unthrottled.
    pub fn new(name: &str) -> std::io::Result<PageHandle> {
        use rustix::fs::{MemfdFlags, SealFlags};
        let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
        rustix::fs::ftruncate(&fd, PAGE_BYTES as u64)?;
        // SAFETY: a fresh shared mapping of a file we just sized to PAGE_BYTES; no other mapping
        // of it exists yet, the kernel picks the address.
        let p = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                PAGE_BYTES,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::SHARED,
                &fd,
                0,
            )?
        };
        let ptr = NonNull::new(p.cast::<GrantPage>()).ok_or(std::io::ErrorKind::Other)?;
        // SAFETY: the mapping is PAGE_BYTES ≥ size_of::<GrantPage>() long, page-aligned (more
        // than GrantPage's alignment) and not yet shared with anyone.
        unsafe { ptr.as_ptr().write(GrantPage::unlimited()) };
        rustix::fs::fcntl_add_seals(
            &fd,
            SealFlags::FUTURE_WRITE | SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL,
        )?;
        Ok(PageHandle { fd, ptr })
    }

    /// The live page (writes go through its atomics).
    pub fn page(&self) -> &GrantPage {
        // SAFETY: `ptr` points at an initialised GrantPage in a mapping that lives as long as
        // `self`; all mutation is through atomics, so shared references are sound.
        unsafe { self.ptr.as_ref() }
    }

    /// The fd to pass to the function process.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// A read-only mapping of a grant page received over the socket, as the shim makes it (used by
/// `smore bench arbiter` to time grant propagation).
pub struct PageView {
    ptr: NonNull<GrantPage>,
}

impl PageView {
    /// Maps `fd` read-only and checks it is a grant page.
    pub fn map<F: AsFd>(fd: F) -> std::io::Result<PageView> {
        // SAFETY: a fresh read-only shared mapping of PAGE_BYTES; the kernel picks the address.
        let p = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                PAGE_BYTES,
                rustix::mm::ProtFlags::READ,
                rustix::mm::MapFlags::SHARED,
                fd,
                0,
            )?
        };
        let ptr = NonNull::new(p.cast::<GrantPage>()).ok_or(std::io::ErrorKind::Other)?;
        let v = PageView { ptr };
        if !v.page().is_valid() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "not a grant page",
            ));
        }
        Ok(v)
    }

    /// The mapped page (the arbiter's writable view).
    pub fn page(&self) -> &GrantPage {
        // SAFETY: the mapping is PAGE_BYTES long, page-aligned, written only through atomics by
        // the arbiter, and lives as long as `self`.
        unsafe { self.ptr.as_ref() }
    }
}

impl Drop for PageView {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping made in `map`; no reference outlives `self`.
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), PAGE_BYTES) };
    }
}

impl std::fmt::Debug for PageHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PageHandle")
            .field("fd", &self.fd)
            .finish_non_exhaustive()
    }
}

impl Drop for PageHandle {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping made in `new`; no reference to it outlives
        // `self` (page() borrows self).
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), PAGE_BYTES) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_cannot_be_mapped_writable_by_a_receiver() {
        let h = PageHandle::new("smore-test").unwrap();
        h.page().set(0, 1 << 30, 40);
        assert_eq!(h.page().cap(0), 1 << 30);
        // A receiver of the fd: a writable shared mapping is refused by the seal.
        // SAFETY: test-only mapping attempt of a valid fd; the result is unmapped below if it
        // (wrongly) succeeded.
        let w = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                PAGE_BYTES,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::SHARED,
                h.fd(),
                0,
            )
        };
        assert!(w.is_err(), "writable mapping must be refused");
        // Writing through a re-opened /proc path is refused too.
        let path = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&h.fd()));
        let reopened = std::fs::OpenOptions::new().write(true).open(&path);
        if let Ok(mut f) = reopened {
            use std::io::Write;
            assert!(
                f.write_all(&[0xff; 16]).is_err(),
                "write(2) must be refused by the seal"
            );
        }
        // A read-only mapping sees our writes live.
        // SAFETY: read-only shared mapping of the page; only read through atomics, unmapped below.
        let r = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                PAGE_BYTES,
                rustix::mm::ProtFlags::READ,
                rustix::mm::MapFlags::SHARED,
                h.fd(),
                0,
            )
        }
        .unwrap();
        // SAFETY: `r` maps the initialised page read-only; fields are atomics.
        let view = unsafe { &*(r.cast::<GrantPage>()) };
        assert!(view.is_valid());
        assert_eq!(view.share(0), 40);
        h.page().set(0, 1 << 30, 70);
        assert_eq!(view.share(0), 70);
        // SAFETY: unmapping the test mapping made above; `view` is not used afterwards.
        unsafe { rustix::mm::munmap(r, PAGE_BYTES).unwrap() };
    }
}

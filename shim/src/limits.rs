//! The limits view: per device a memory cap (bytes), an SM share (percent) and a generation
//! counter, read with atomic loads only.
//!
//! Owns the layout the enforcement code reads. In standalone mode the page is process-local
//! (filled once from the environment); in arbiter mode (a later issue) the same `#[repr(C)]` page
//! will be an arbiter-owned file mapped read-only, so the arbiter — not the tenant — owns the
//! limits (HAMi's 0666 shared file let a tenant raise its own cap). Must never: write to a page
//! it does not own, or be read with anything but atomic loads on the hot path.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

/// Devices per process the shim tracks (CUDA ordinals 0..16). Reasoning: the largest common
/// nodes have 8–16 GPUs; ordinals beyond this are passed through unaccounted (documented).
pub const MAX_DEVICES: usize = 16;
/// `b"SMORELIM"` — identifies a limits page (arbiter mode checks it after mmap).
pub const PAGE_MAGIC: u64 = 0x4d49_4c45_524f_4d53;
/// Layout version of [`LimitsPage`].
pub const PAGE_VERSION: u32 = 1;

/// One device's grant.
#[repr(C)]
#[derive(Debug)]
pub struct DeviceLimits {
    /// Memory cap in bytes; `u64::MAX` = uncapped.
    pub mem_cap_bytes: AtomicU64,
    /// SM time share in percent, 1..=100 (100 = unthrottled).
    pub sm_share_pct: AtomicU32,
    _pad: u32,
    /// Bumped by the owner on every change of this device's grant (lets readers cache derived
    /// values and notice changes with one load).
    pub generation: AtomicU64,
}

/// The whole page: header plus [`MAX_DEVICES`] grants. 8 + 4 + 4 + 16 × 24 = 400 bytes (< 4 KiB).
#[repr(C)]
#[derive(Debug)]
pub struct LimitsPage {
    pub magic: u64,
    pub version: u32,
    /// Bit d set ⇔ device d has a share below 100: the launch fast path reads only this word.
    pub throttled_mask: AtomicU32,
    pub devices: [DeviceLimits; MAX_DEVICES],
}

impl LimitsPage {
    /// A process-local page with the given caps and shares (standalone mode).
    pub fn new(caps: &[u64; MAX_DEVICES], shares: &[u32; MAX_DEVICES]) -> LimitsPage {
        let page = LimitsPage {
            magic: PAGE_MAGIC,
            version: PAGE_VERSION,
            throttled_mask: AtomicU32::new(0),
            devices: std::array::from_fn(|_| DeviceLimits {
                mem_cap_bytes: AtomicU64::new(u64::MAX),
                sm_share_pct: AtomicU32::new(100),
                _pad: 0,
                generation: AtomicU64::new(0),
            }),
        };
        for d in 0..MAX_DEVICES {
            page.set(d, caps[d], shares[d]);
        }
        page
    }

    /// Owner-side update of one device (standalone: at init; tests). Arbiter mode never calls
    /// this on a mapped page: the mapping is read-only.
    pub fn set(&self, dev: usize, cap: u64, share: u32) {
        let Some(d) = self.devices.get(dev) else {
            return;
        };
        let share = share.clamp(1, 100);
        d.mem_cap_bytes.store(cap, Relaxed);
        d.sm_share_pct.store(share, Relaxed);
        d.generation.fetch_add(1, Relaxed);
        if share < 100 {
            self.throttled_mask.fetch_or(1 << dev, Relaxed);
        } else {
            self.throttled_mask.fetch_and(!(1 << dev), Relaxed);
        }
    }

    /// Memory cap of `dev`; devices beyond [`MAX_DEVICES`] are uncapped.
    #[inline]
    pub fn cap(&self, dev: usize) -> u64 {
        self.devices
            .get(dev)
            .map_or(u64::MAX, |d| d.mem_cap_bytes.load(Relaxed))
    }

    /// SM share of `dev` in percent (100 for untracked devices).
    #[inline]
    pub fn share(&self, dev: usize) -> u32 {
        self.devices
            .get(dev)
            .map_or(100, |d| d.sm_share_pct.load(Relaxed).clamp(1, 100))
    }

    /// True when no device is throttled: the whole launch fast-path test.
    #[inline]
    pub fn none_throttled(&self) -> bool {
        self.throttled_mask.load(Relaxed) == 0
    }

    pub fn generation(&self, dev: usize) -> u64 {
        self.devices
            .get(dev)
            .map_or(0, |d| d.generation.load(Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_layout_is_stable() {
        assert_eq!(std::mem::size_of::<DeviceLimits>(), 24);
        assert_eq!(std::mem::size_of::<LimitsPage>(), 16 + 24 * MAX_DEVICES);
    }

    #[test]
    fn mask_follows_shares() {
        let mut shares = [100; MAX_DEVICES];
        shares[3] = 40;
        let p = LimitsPage::new(&[u64::MAX; MAX_DEVICES], &shares);
        assert!(!p.none_throttled());
        assert_eq!(p.share(3), 40);
        assert_eq!(p.share(99), 100);
        let g = p.generation(3);
        p.set(3, 1 << 30, 100);
        assert!(p.none_throttled());
        assert_eq!(p.cap(3), 1 << 30);
        assert_eq!(p.generation(3), g + 1);
    }
}

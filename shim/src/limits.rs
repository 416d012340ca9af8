//! The live limits view: per device a memory cap (bytes), an SM share (percent) and a generation
//! counter, in the shared [`GrantPage`] layout of `smore_protocol::grant`, read with atomic loads
//! only.
//!
//! Owns where the page comes from and how the hot path reads it. In standalone mode the page is
//! process-local (filled once from the environment, see [`standalone`]); in arbiter mode it is the
//! arbiter's sealed memfd mapped read-only (`sys::grant`), so the arbiter — not the tenant — owns
//! the limits (HAMi's 0666 shared file let a tenant raise its own cap). Must never: write to a page
//! it does not own, or be read with anything but atomic loads on the hot path.

pub use smore_protocol::grant::{GrantPage, MAX_DEVICES};
use std::sync::atomic::Ordering::Relaxed;

/// A leaked, process-local page with the given caps, shares, contention budgets and
/// context-switch cost (standalone mode).
pub fn standalone(
    caps: &[u64; MAX_DEVICES],
    shares: &[u32; MAX_DEVICES],
    contention_ppm: &[u32; MAX_DEVICES],
    switch_ns: u64,
) -> &'static GrantPage {
    let page: &'static GrantPage = Box::leak(Box::new(GrantPage::unlimited()));
    for d in 0..MAX_DEVICES {
        page.set(d, caps[d], shares[d]);
        page.set_contention(d, contention_ppm[d]);
        page.set_switch(d, switch_ns);
    }
    page
}

/// Memory cap of `dev` in bytes; devices beyond [`MAX_DEVICES`] are uncapped.
#[inline]
pub fn cap(page: &GrantPage, dev: usize) -> u64 {
    page.cap(dev)
}

/// SM share of `dev` in percent, clamped to 1..=100 (a page is foreign memory: never trust a
/// value outside the documented range); 100 for untracked devices.
#[inline]
pub fn share(page: &GrantPage, dev: usize) -> u32 {
    page.share(dev).clamp(1, 100)
}

/// True when no device is throttled: the whole launch fast-path test (one relaxed load).
#[inline]
pub fn none_throttled(page: &GrantPage) -> bool {
    page.throttled_mask.load(Relaxed) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_standalone_page_holds_the_configured_caps_and_shares() {
        let mut shares = [100; MAX_DEVICES];
        shares[3] = 40;
        let mut caps = [u64::MAX; MAX_DEVICES];
        caps[1] = 1 << 30;
        let mut budgets = [0; MAX_DEVICES];
        budgets[5] = 20_000;
        let p = standalone(&caps, &shares, &budgets, 0);
        assert_eq!(p.contention(5), 20_000);
        assert_eq!(share(p, 5), 100);
        assert_eq!(p.throttled_mask.load(Relaxed), 1 << 3 | 1 << 5);
        p.set_contention(5, 0);
        assert!(p.is_valid());
        assert!(!none_throttled(p));
        assert_eq!(share(p, 3), 40);
        assert_eq!(share(p, 99), 100);
        assert_eq!(cap(p, 1), 1 << 30);
        assert_eq!(cap(p, 0), u64::MAX);
        p.set(3, u64::MAX, 100);
        assert!(none_throttled(p));
    }
}

//! Rate-limited logging to stderr.
//!
//! Owns the process-wide log level and per-call-site rate limits. Lines look like
//! `smore-shim[<pid>] <level>: <message>`. Must never: write to stdout, log on the launch fast
//! path, or flood stderr (each site logs at most once per [`RATE_PERIOD_NS`] and reports how many
//! lines it suppressed).

use crate::config::Level;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::*};

/// One line per call site per second at most (reasoning: an allocation loop hitting the cap must
/// not bury the host's own stderr; one line a second still shows it is ongoing).
pub const RATE_PERIOD_NS: u64 = 1_000_000_000;

static LEVEL: AtomicU8 = AtomicU8::new(Level::Warn as u8);

/// Sets the process-wide level: lines less severe than `l` are dropped.
pub fn set_level(l: Level) {
    LEVEL.store(l as u8, Relaxed);
}

/// Whether lines of level `l` are written.
#[inline]
pub fn enabled(l: Level) -> bool {
    l as u8 <= LEVEL.load(Relaxed)
}

/// Per-site limiter: `static R: RateLimit = RateLimit::new();`.
pub struct RateLimit {
    next_ns: AtomicU64,
    suppressed: AtomicU64,
}

impl Default for RateLimit {
    fn default() -> Self {
        Self::new()
    }
}

impl RateLimit {
    /// A site that may log at once.
    pub const fn new() -> RateLimit {
        RateLimit {
            next_ns: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// `Some(suppressed_since_last)` if a line may be written at `now`.
    pub fn check(&self, now: u64) -> Option<u64> {
        let next = self.next_ns.load(Relaxed);
        if now >= next
            && self
                .next_ns
                .compare_exchange(next, now + RATE_PERIOD_NS, AcqRel, Relaxed)
                .is_ok()
        {
            Some(self.suppressed.swap(0, AcqRel))
        } else {
            self.suppressed.fetch_add(1, Relaxed);
            None
        }
    }
}

fn tag(l: Level) -> &'static str {
    match l {
        Level::Error => "error",
        Level::Warn => "warn",
        Level::Info => "info",
        Level::Debug => "debug",
    }
}

/// Writes one line (no rate limit: for once-only messages).
pub fn line(l: Level, msg: std::fmt::Arguments<'_>) {
    if !enabled(l) {
        return;
    }
    let s = format!("smore-shim[{}] {}: {}\n", std::process::id(), tag(l), msg);
    // One write(2) per line so lines of concurrent threads/processes do not interleave, and no
    // lock (std's stderr lock held by one thread at a fork would wedge the child's logging).
    crate::sys::os::write_stderr(s.as_bytes());
}

/// Writes one line if `rl` allows it now.
pub fn limited(rl: &RateLimit, now: u64, l: Level, msg: std::fmt::Arguments<'_>) {
    if !enabled(l) {
        return;
    }
    if let Some(skipped) = rl.check(now) {
        if skipped > 0 {
            line(
                l,
                format_args!("{msg} ({skipped} similar lines suppressed)"),
            );
        } else {
            line(l, msg);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_limited_site_reports_how_many_lines_it_suppressed() {
        let r = RateLimit::new();
        assert_eq!(r.check(5), Some(0));
        assert_eq!(r.check(6), None);
        assert_eq!(r.check(7), None);
        assert_eq!(r.check(5 + RATE_PERIOD_NS), Some(2));
    }

    #[test]
    fn a_level_enables_itself_and_the_more_severe_ones() {
        set_level(Level::Warn);
        assert!(enabled(Level::Error) && enabled(Level::Warn));
        assert!(!enabled(Level::Info) && !enabled(Level::Debug));
    }
}

//! An opt-in trace of every settled sample, for diagnosing the harvest estimate on a real GPU.
//!
//! On an NVIDIA H200 the shims' collision time per request read 0.89–0.95 of their GPU time
//! beside a trainer busy 8–11 % of the time (docs/real-gpu.md, section 9, point 1). Whether that
//! is waits for the trainer's timeslice or start-time jitter of short kernels taken for waits
//! can only be told from the samples themselves: each sampled launch's measured time, solo cost,
//! queue wait and collision. `SMORE_TRACE_SAMPLES=<path>` (`{pid}` in it is replaced by the
//! process id) appends one line per settled sample to that file.
//!
//! Owns the trace's buffer and file. Must never: allocate or write on the unthrottled launch path
//! (it runs where samples settle — the sampler, under its lock, on sampled launches and while a
//! launch waits for a first measurement — into a buffer allocated when the trace is opened; the
//! file is written when the buffer holds 128 KiB or a second has passed since the last write),
//! nor hang or fail the process (only a regular file is opened, without blocking or following a
//! symbolic link; a write error ends the trace). Samples buffered since the last write are lost
//! when the process exits: the runtime is never dropped.

use std::fmt::Write as _;
use std::fs::File;
use std::io::Write as _;

/// Buffer size: 256 KiB (reasoning: a line is ≤ 110 bytes, and the buffer is written once it
/// holds 128 KiB, so the line that crosses that mark still fits and the buffer never grows).
const BUFFER_BYTES: usize = 256 * 1024;
/// Written when this much is buffered.
const FLUSH_AT_BYTES: usize = BUFFER_BYTES - 128 * 1024;
/// Written at least this often, ns: 1 s (a trace of a process that is killed loses at most the
/// last second).
const FLUSH_EVERY_NS: u64 = 1_000_000_000;
/// The file's first line: the columns.
pub const HEADER: &str = "# t_ns dev ns d0_ns wait_ns collided_ns handover submitted_ns (-1: not known; d0_ns and collided_ns -1: a first measurement, not judged; lines starting with # are comments, and a header repeats where another process or image appends)\n";

/// One settled sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// When it settled (CLOCK_MONOTONIC ns).
    pub t_ns: u64,
    /// Device ordinal.
    pub dev: usize,
    /// Measured GPU time, ns.
    pub ns: u64,
    /// Solo cost it was judged against (calibrated), ns; `None` for a first measurement.
    pub d0_ns: Option<u64>,
    /// How long it waited for the GPU, when known.
    pub wait_ns: Option<u64>,
    /// The collision time it was taken for, ns; `None` for a first measurement (not judged).
    pub collided_ns: Option<u64>,
    /// Whether it was charged context switches.
    pub handover: bool,
    /// When it was submitted (CLOCK_MONOTONIC ns, read just before its start event is recorded,
    /// the instant its queue wait counts from): with `wait_ns` and
    /// `ns`, when it waited and ran on the shared clock, so traces of several processes can be
    /// laid side by side (whose waits overlapped whose runs; docs/harvest.md, "What perfect
    /// phase knowledge buys").
    pub submitted_ns: u64,
}

/// Appends `s` as one line to `out`.
pub fn format_line(out: &mut String, s: &Sample) {
    let opt = |v: Option<u64>| v.map_or(-1, i128::from);
    let _ = writeln!(
        out,
        "{} {} {} {} {} {} {} {}",
        s.t_ns,
        s.dev,
        s.ns,
        opt(s.d0_ns),
        opt(s.wait_ns),
        opt(s.collided_ns),
        u8::from(s.handover),
        s.submitted_ns
    );
}

/// The open trace.
pub struct SampleTrace {
    file: File,
    buf: String,
    last_write_ns: u64,
}

impl SampleTrace {
    /// Opens (appends to) the trace at `path` with `{pid}` replaced by `pid`, writing the header.
    /// Called once, when the shim starts, never on a launch.
    pub fn open(path: &str, pid: u32, now_ns: u64) -> std::io::Result<SampleTrace> {
        use std::os::unix::fs::OpenOptionsExt;
        let path = path.replace("{pid}", &pid.to_string());
        // Never block on a FIFO nobody reads, nor follow a link planted at a predictable name.
        let opened = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path);
        let mut file = opened.map_err(|e| std::io::Error::new(e.kind(), format!("{path}: {e}")))?;
        if !file.metadata()?.is_file() {
            // A pipe, a terminal or a device (stdout among them) could block the sampler, raise
            // SIGPIPE or write where the shim must not.
            return Err(std::io::Error::other(format!(
                "{path} is not a regular file"
            )));
        }
        file.write_all(HEADER.as_bytes())?;
        Ok(SampleTrace {
            file,
            buf: String::with_capacity(BUFFER_BYTES),
            last_write_ns: now_ns,
        })
    }

    /// Adds one sample; writes the buffer when it is nearly full or a second has passed. `Err`
    /// when the file cannot be written (the caller drops the trace).
    pub fn record(&mut self, s: &Sample) -> std::io::Result<()> {
        format_line(&mut self.buf, s);
        if self.buf.len() >= FLUSH_AT_BYTES
            || s.t_ns.saturating_sub(self.last_write_ns) >= FLUSH_EVERY_NS
        {
            self.write(s.t_ns)?;
        }
        Ok(())
    }

    fn write(&mut self, now_ns: u64) -> std::io::Result<()> {
        let r = self.file.write_all(self.buf.as_bytes());
        self.buf.clear();
        self.last_write_ns = now_ns;
        r
    }
}

impl Drop for SampleTrace {
    fn drop(&mut self) {
        let _ = self.file.write_all(self.buf.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(t_ns: u64) -> Sample {
        Sample {
            t_ns,
            dev: 0,
            ns: 40_000,
            d0_ns: Some(30_000),
            wait_ns: None,
            collided_ns: Some(10_000),
            handover: false,
            submitted_ns: t_ns.saturating_sub(50_000),
        }
    }

    #[test]
    fn a_line_has_every_column_and_unknowns_are_minus_one() {
        let mut s = String::new();
        format_line(&mut s, &sample(7));
        assert_eq!(s, "7 0 40000 30000 -1 10000 0 0\n");
        s.clear();
        format_line(
            &mut s,
            &Sample {
                d0_ns: None,
                wait_ns: Some(5),
                collided_ns: None,
                handover: true,
                ..sample(8)
            },
        );
        assert_eq!(s, "8 0 40000 -1 5 -1 1 0\n");
        assert_eq!(HEADER.split_whitespace().nth(7), Some("handover"));
        assert_eq!(HEADER.split_whitespace().nth(8), Some("submitted_ns"));
        s.clear();
        format_line(&mut s, &sample(2_000_000));
        assert!(s.ends_with(" 1950000\n"), "{s}");
    }

    #[test]
    fn only_a_regular_file_is_traced_into() {
        let e = SampleTrace::open("/dev/null", 1, 0)
            .err()
            .expect("a device is refused");
        assert!(e.to_string().contains("not a regular file"), "{e}");
        let dir = std::env::temp_dir().join(format!("smore-trace-link-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let link = dir.join("planted");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(dir.join("target"), &link).unwrap();
        assert!(
            SampleTrace::open(link.to_str().unwrap(), 1, 0).is_err(),
            "a link is not followed"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn samples_reach_the_file_within_a_second_and_at_drop() {
        let dir = std::env::temp_dir().join(format!("smore-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t-{pid}.txt");
        let mut t = SampleTrace::open(path.to_str().unwrap(), 42, 0).unwrap();
        let file = dir.join("t-42.txt");
        t.record(&sample(1)).unwrap();
        let read = || std::fs::read_to_string(&file).unwrap();
        assert_eq!(read(), HEADER, "buffered");
        t.record(&sample(FLUSH_EVERY_NS + 1)).unwrap();
        assert_eq!(read().lines().count(), 3, "a second later: written");
        t.record(&sample(FLUSH_EVERY_NS + 2)).unwrap();
        drop(t);
        assert_eq!(read().lines().count(), 4, "the rest at drop");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

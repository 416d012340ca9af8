//! An opt-in trace of every settled sample, for diagnosing the harvest estimate on a real GPU.
//!
//! On an NVIDIA H200 the shims' collision time per request read 0.89–0.95 of their GPU time
//! beside a trainer busy 8–11 % of the time (docs/real-gpu.md, section 9, point 1). Whether that
//! is waits for the trainer's timeslice or start-time jitter of short kernels taken for waits
//! can only be told from the samples themselves: each sampled launch's measured time, solo cost,
//! queue wait and collision. `SMORE_TRACE_SAMPLES=<path>` (`{pid}` in it is replaced by the
//! process id) appends one line per settled sample to that file.
//!
//! Owns the trace's buffer and file. Must never: allocate or write on the launch fast path (it
//! runs where samples settle — the sampler, under its lock, at most once per sampled launch —
//! into a buffer allocated when the trace is opened; the file is written when the buffer is
//! nearly full or a second has passed), nor fail the process (a write error ends the trace).

use std::fmt::Write as _;
use std::fs::File;
use std::io::Write as _;

/// Buffer size: 256 KiB (reasoning: a line is ≤ 100 bytes and a harvesting function settles at
/// most ~1 000 samples a second, so a second's lines fit; the buffer is written before it would
/// have to grow).
const BUFFER_BYTES: usize = 256 * 1024;
/// Written when this much is buffered: room for one more second at the highest rate.
const FLUSH_AT_BYTES: usize = BUFFER_BYTES - 128 * 1024;
/// Written at least this often, ns: 1 s (a trace of a process that is killed loses at most the
/// last second).
const FLUSH_EVERY_NS: u64 = 1_000_000_000;
/// The file's first line: the columns.
pub const HEADER: &str =
    "# t_ns dev ns d0_ns wait_ns collided_ns handover (wait_ns -1: not known; d0_ns -1: first measurement)\n";

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
    /// The collision time it was taken for, ns.
    pub collided_ns: u64,
    /// Whether it was charged context switches.
    pub handover: bool,
}

/// Appends `s` as one line to `out`.
pub fn format_line(out: &mut String, s: &Sample) {
    let opt = |v: Option<u64>| v.map_or(-1, i128::from);
    let _ = writeln!(
        out,
        "{} {} {} {} {} {} {}",
        s.t_ns,
        s.dev,
        s.ns,
        opt(s.d0_ns),
        opt(s.wait_ns),
        s.collided_ns,
        u8::from(s.handover)
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
        let path = path.replace("{pid}", &pid.to_string());
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
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
            collided_ns: 10_000,
            handover: false,
        }
    }

    #[test]
    fn a_line_has_every_column_and_unknowns_are_minus_one() {
        let mut s = String::new();
        format_line(&mut s, &sample(7));
        assert_eq!(s, "7 0 40000 30000 -1 10000 0\n");
        s.clear();
        format_line(
            &mut s,
            &Sample {
                d0_ns: None,
                wait_ns: Some(5),
                handover: true,
                ..sample(8)
            },
        );
        assert_eq!(s, "8 0 40000 -1 5 10000 1\n");
        assert_eq!(HEADER.split_whitespace().nth(7), Some("handover"));
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

//! The ways a program reaches the CUDA driver, as the client programs spell them on their
//! command line (`--resolve`, `--cuda-version`, `--per-thread`; see `sim/clients/src/driver.rs`).
//!
//! Owns: the one list of resolution styles every end-to-end test iterates over, so that a test
//! "through every resolution style" means the same six styles everywhere (docs/shim.md, "smore vs
//! HAMi-core": every allocation path tested through 6 resolution styles).
//!
//! Must never: pick a program or flags that the style does not name — a style that silently fell
//! back to another would make the "every style" tests pass without exercising it.

use crate::bin;
use std::path::PathBuf;

/// One way of reaching the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// Linked against `libcuda.so.1`, calling the exports `cuda.h`'s macros produce
    /// (`cuMemAlloc` → `cuMemAlloc_v2`); only `sim-probe-linked` links the driver.
    Direct,
    /// As [`Resolution::Direct`], built with `CUDA_API_PER_THREAD_DEFAULT_STREAM` (`_ptsz`).
    DirectPerThread,
    /// `dlopen("libcuda.so.1")` + `dlsym` of the exported names (NCCL, Triton, plugins).
    Dlsym,
    /// As [`Resolution::Dlsym`], of the per-thread default stream exports (`_ptsz`).
    DlsymPerThread,
    /// `cuGetProcAddress_v2` by base name at cudaVersion 12000, default-stream flags
    /// (libcudart ≥ 12, hence PyTorch).
    ProcAddress12,
    /// `cuGetProcAddress_v2` at cudaVersion 13000 with the per-thread default stream flag.
    ProcAddress13PerThread,
}

impl Resolution {
    /// Every style, in the order the tests report them.
    pub const ALL: [Resolution; 6] = [
        Resolution::Direct,
        Resolution::DirectPerThread,
        Resolution::Dlsym,
        Resolution::DlsymPerThread,
        Resolution::ProcAddress12,
        Resolution::ProcAddress13PerThread,
    ];

    /// The styles a program that is not linked against the driver can use (`sim-probe`,
    /// `shim-client`).
    pub const UNLINKED: [Resolution; 4] = [
        Resolution::Dlsym,
        Resolution::DlsymPerThread,
        Resolution::ProcAddress12,
        Resolution::ProcAddress13PerThread,
    ];

    /// The probe program that can resolve this way.
    pub fn probe(self) -> PathBuf {
        match self {
            Resolution::Direct | Resolution::DirectPerThread => bin("sim-probe-linked"),
            _ => bin("sim-probe"),
        }
    }

    /// The client options selecting this style.
    pub fn args(self) -> &'static [&'static str] {
        match self {
            Resolution::Direct => &["--resolve", "direct"],
            Resolution::DirectPerThread => &["--resolve", "direct", "--per-thread"],
            Resolution::Dlsym => &["--resolve", "dlsym"],
            Resolution::DlsymPerThread => &["--resolve", "dlsym", "--per-thread"],
            Resolution::ProcAddress12 => &["--resolve", "procaddr", "--cuda-version", "12000"],
            Resolution::ProcAddress13PerThread => &[
                "--resolve",
                "procaddr",
                "--cuda-version",
                "13000",
                "--per-thread",
            ],
        }
    }
}

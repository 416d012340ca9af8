//! What survives an arbiter restart: one [`Record`] per instance (the live instance embeds the
//! same record, so the two cannot drift), written atomically to `state_dir/instances.json`.
//!
//! Owns: the file format ([`PersistFile`], [`PERSIST_VERSION`]), [`save`] and [`load`]. Must
//! never: replace a good file with an empty or partial one (serialize first, write a temp file,
//! rename), or start silently from a file it cannot read.

use super::memory::GpuMemoryRecord;
use serde::{Deserialize, Serialize};
use smore_protocol::wire::PreemptReason;
use std::path::{Path, PathBuf};

/// Version of the persisted state file.
pub const PERSIST_VERSION: u32 = 1;

/// An instance's durable facts.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Record {
    /// Instance id.
    pub id: u64,
    /// Registered process.
    pub pid: u32,
    /// Its start time (clock ticks since boot): tells a live process from a recycled pid.
    pub start: u64,
    /// Its uid.
    pub uid: u32,
    /// Function name.
    pub function: String,
    /// Model id.
    pub model: String,
    /// Latency SLO, ms.
    pub slo_ms: f64,
    /// NVML index of its GPU.
    pub gpu: u32,
    /// Page slot the grant is written to.
    pub slot: u32,
    /// Memory cap, bytes.
    pub cap: u64,
    /// SM share, percent.
    pub share: u32,
    /// A share the operator fixed.
    pub share_override: Option<u32>,
    /// Set once the instance is preempted (kept across restarts: a restarted arbiter still
    /// refuses its requests and enforces the same deadline).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preempt: Option<Preemption>,
}

/// A preemption in progress.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Preemption {
    /// Why.
    pub reason: PreemptReason,
    /// What happened, for a person.
    pub message: String,
    /// When, seconds since the epoch.
    pub at: f64,
    /// When the arbiter kills the instance's processes if they still live, seconds since the
    /// epoch.
    pub deadline: f64,
    /// The kill was sent.
    #[serde(default)]
    pub enforced: bool,
}

/// The old name of [`Record`].
pub type Persisted = Record;

/// The file.
#[derive(Debug, Serialize, Deserialize)]
pub struct PersistFile {
    /// [`PERSIST_VERSION`] of the writer.
    pub version: u32,
    /// Next instance id to hand out.
    pub next_id: u64,
    /// The instances.
    pub instances: Vec<Record>,
    /// Training memory per GPU: high-water marks, last growth and reclaim (absent in files of
    /// arbiters before headroom tracking: read as none).
    #[serde(default)]
    pub gpus: Vec<GpuMemoryRecord>,
    /// Harvest per GPU: the collision budget's calibration and the raw-share throttles (absent
    /// in files of arbiters before 2026-11-29: read as none, every budget whole).
    #[serde(default)]
    pub harvest: Vec<HarvestRecord>,
}

/// What one GPU's harvest had learnt (docs/harvest.md, "Across an arbiter restart"): without it a
/// restarted arbiter handed the functions their whole collision budget and no throttle again,
/// and the trainer paid for it until the calibration's cuts caught up (about 40 s).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct HarvestRecord {
    /// NVML index of the GPU.
    pub gpu: u32,
    /// Its collision budget's calibration, in [`crate::harvest::CALIBRATION_MIN`]..=1: learnt
    /// beside the training processes below, and taken up only while one of them still lives.
    pub calibration: f64,
    /// The training processes on it when it was saved (pid and start time).
    #[serde(default)]
    pub trainers: Vec<Trainer>,
    /// The instances on it whose raw share is throttled.
    #[serde(default)]
    pub throttles: Vec<ThrottleRecord>,
}

/// A training process, as a calibration was learnt beside it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Trainer {
    /// Its pid.
    pub pid: u32,
    /// Its start time (clock ticks since boot): a recycled pid is another process.
    pub start: u64,
}

/// A throttled instance's ceiling.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ThrottleRecord {
    /// Instance id.
    pub instance: u64,
    /// Its raw share's ceiling, percent of the GPU for the whole function.
    pub ceiling_pct: u32,
}

/// Why the state could not be saved or loaded.
#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    /// Serializing failed; the previous file is kept.
    #[error(
        "cannot serialize the grants ({0}); the previous {path} is kept",
        path = "instances.json"
    )]
    Serialize(serde_json::Error),
    /// Writing or renaming failed.
    #[error("cannot write {path}: {source}; check that state_dir is writable and has space")]
    Write {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// Reading failed.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The file does not parse.
    #[error("{path} is corrupt ({source}); move it away to start without the previous grants")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The error.
        source: serde_json::Error,
    },
    /// Another format version.
    #[error("{path} has format version {found} (this arbiter reads {PERSIST_VERSION}); move it away to start fresh")]
    Version {
        /// The file.
        path: PathBuf,
        /// Its version.
        found: u32,
    },
}

/// Writes `file` to `path` atomically: serialize, write `path.tmp`, rename. A serialization
/// failure leaves the old file untouched.
pub fn save(path: &Path, file: &PersistFile) -> Result<(), PersistError> {
    let body = serde_json::to_vec(file).map_err(PersistError::Serialize)?;
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, body)
        .and_then(|_| std::fs::rename(&tmp, path))
        .map_err(|source| PersistError::Write {
            path: path.to_path_buf(),
            source,
        })
}

/// Reads the file at `path`; None when there is none.
pub fn load(path: &Path) -> Result<Option<PersistFile>, PersistError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(PersistError::Read {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    let file: PersistFile =
        serde_json::from_str(&text).map_err(|source| PersistError::Corrupt {
            path: path.to_path_buf(),
            source,
        })?;
    if file.version != PERSIST_VERSION {
        return Err(PersistError::Version {
            path: path.to_path_buf(),
            found: file.version,
        });
    }
    Ok(Some(file))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_write_keeps_the_previous_file_and_versions_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("instances.json");
        let f = PersistFile {
            version: PERSIST_VERSION,
            next_id: 3,
            instances: vec![],
            gpus: vec![],
            harvest: vec![],
        };
        save(&path, &f).unwrap();
        assert_eq!(load(&path).unwrap().unwrap().next_id, 3);
        // A write into a missing directory fails and names the file.
        let bad = dir.path().join("gone/instances.json");
        assert!(matches!(save(&bad, &f), Err(PersistError::Write { .. })));
        std::fs::write(&path, br#"{"version":9,"next_id":1,"instances":[]}"#).unwrap();
        assert!(matches!(
            load(&path),
            Err(PersistError::Version { found: 9, .. })
        ));
        std::fs::write(&path, b"{").unwrap();
        assert!(matches!(load(&path), Err(PersistError::Corrupt { .. })));
        assert!(load(&dir.path().join("none.json")).unwrap().is_none());
    }
}

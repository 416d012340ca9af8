//! Events worth telling the operator: a bounded ring for `status` and the decision log
//! (`state_dir/decisions.jsonl`, one JSON object per line, kept across restarts).
//!
//! Owns: [`EventKind`], [`Event`], [`EventLog`]. Must never: grow without bound (the ring keeps
//! [`MAX_EVENTS`]), or fail a transition because the log cannot be written (it is logged).

use serde::Serialize;
use std::collections::VecDeque;
use std::path::PathBuf;

/// Events kept for `status` (oldest dropped first).
pub const MAX_EVENTS: usize = 256;

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// An instance was admitted.
    Admitted,
    /// A registration was refused.
    Refused,
    /// An instance was released.
    Released,
    /// A restored instance re-registered.
    Resumed,
    /// An instance was kept from the previous arbiter.
    Restored,
    /// The operator changed a share.
    Share,
    /// The operator changed a cap.
    Memory,
    /// The watchdog acted.
    Watchdog,
    /// Training memory grew on a GPU (a new training process or a higher high-water mark).
    Growth,
    /// Memory was taken back from functions (caps lowered, instances unloaded or preempted).
    Reclaim,
    /// An instance was preempted (or unloaded) to give training its memory.
    Preempted,
    /// Something of the arbiter itself the operator must know (e.g. prewarm failed to start).
    Arbiter,
}

impl EventKind {
    /// The name in status and the decision log.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Admitted => "admitted",
            EventKind::Refused => "refused",
            EventKind::Released => "released",
            EventKind::Resumed => "resumed",
            EventKind::Restored => "restored",
            EventKind::Share => "share",
            EventKind::Memory => "memory",
            EventKind::Watchdog => "watchdog",
            EventKind::Growth => "growth",
            EventKind::Reclaim => "reclaim",
            EventKind::Preempted => "preempted",
            EventKind::Arbiter => "arbiter",
        }
    }
}

/// Something worth telling the operator.
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    /// Seconds since the epoch.
    pub time: f64,
    /// What happened.
    pub kind: EventKind,
    /// The instance concerned.
    pub instance: Option<u64>,
    /// The process concerned.
    pub pid: Option<u32>,
    /// For a person.
    pub message: String,
}

/// The ring of recent events and the decision log.
#[derive(Debug, Default)]
pub struct EventLog {
    ring: VecDeque<Event>,
    /// `decisions.jsonl` to append to (None: no state directory, e.g. unit tests).
    file: Option<PathBuf>,
}

impl EventLog {
    /// A log appending to `file` when given.
    pub fn new(file: Option<PathBuf>) -> EventLog {
        EventLog {
            ring: VecDeque::new(),
            file,
        }
    }

    /// Records `ev`.
    pub fn push(&mut self, ev: Event) {
        tracing::info!(
            kind = ev.kind.as_str(),
            instance = ev.instance,
            pid = ev.pid,
            "{}",
            ev.message
        );
        if let Some(path) = &self.file {
            let r = serde_json::to_string(&ev)
                .map_err(std::io::Error::other)
                .and_then(|line| {
                    let mut f = std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(path)?;
                    std::io::Write::write_all(&mut f, format!("{line}\n").as_bytes())
                });
            if let Err(e) = r {
                tracing::debug!("decision log {}: {e}", path.display());
            }
        }
        if self.ring.len() >= MAX_EVENTS {
            self.ring.pop_front();
        }
        self.ring.push_back(ev);
    }

    /// The kept events, oldest first.
    pub fn recent(&self) -> &VecDeque<Event> {
        &self.ring
    }
}

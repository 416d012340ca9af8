//! Arbiter mode: where the live grant page comes from when an arbiter runs the node.
//!
//! - `SMORE_GRANT_FD=<n>`: an inherited fd of the arbiter's sealed memfd (`smore run` passes it);
//!   mapped read-only, nothing else to do (the registration is held by whoever holds the arbiter
//!   connection, e.g. `SMORE_ARBITER_FD`).
//! - else `SMORE_ARBITER_SOCKET=<path>`: on the first CUDA call, connect, send
//!   `Register { function, model, slo_ms, memory }`, receive `Granted` with the page fd as
//!   `SCM_RIGHTS`, map it, and keep the connection open for the process lifetime (closing it is
//!   the release).
//!
//! Owns the registration exchange and its failure reasons. Must never: block the host longer
//! than [`ARBITER_TIMEOUT`], trust anything but the page the arbiter sent, or send identity
//! (the arbiter reads it from `SO_PEERCRED`).

use crate::config::Config;
use crate::ffi::grant;
use crate::limits::GrantPage;
use smore_protocol::conn::Client;
use smore_protocol::wire::{Reply, Request, ENV_GRANT_FD, ENV_SOCKET};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// Longest the first CUDA call waits for the arbiter's answer: 5 s (reasoning: admission is a
/// lookup plus a predictor call, milliseconds; a busy arbiter may queue a few hundred
/// registrations; beyond this the host must not hang — the failure policy applies).
pub const ARBITER_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the limits come from.
pub enum Source {
    /// No arbiter configured: the standalone environment contract.
    Standalone,
    /// The arbiter's live page.
    Arbiter(&'static GrantPage),
    /// An arbiter was configured but could not be used (the reason, for one log line).
    Unavailable(String),
}

/// What the registration sends, from the environment (`SMORE_FUNCTION`, `SMORE_MODEL`,
/// `SMORE_SLO_MS`) and the parsed memory limit.
pub fn register_request(get: &impl Fn(&str) -> Option<String>, config: &Config) -> Request {
    let function = get("SMORE_FUNCTION")
        .filter(|f| !f.is_empty())
        .or_else(|| {
            std::env::current_exe()
                .ok()?
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| "unknown".into());
    let memory = config.mem_cap[0];
    Request::Register {
        function,
        model: get("SMORE_MODEL").filter(|m| !m.is_empty()),
        slo_ms: get("SMORE_SLO_MS").and_then(|s| s.trim().parse::<f64>().ok()),
        memory: (memory != u64::MAX).then_some(memory),
        resume: None,
        gpu: None,
        // Not exec'd by `smore run`: the arbiter writes the grant to the slot of the GPU's NVML
        // index (the shim indexes slots by CUDA ordinal: equal unless CUDA_VISIBLE_DEVICES or
        // CUDA_DEVICE_ORDER reorder devices; see docs/shim.md).
        exec: false,
    }
}

/// Resolves the limits source from the environment.
pub fn source(get: impl Fn(&str) -> Option<String>, config: &Config) -> Source {
    if let Some(v) = get(ENV_GRANT_FD) {
        let Ok(fd) = v.trim().parse::<RawFd>() else {
            return Source::Unavailable(format!(
                "{ENV_GRANT_FD}={v:?} is not a file descriptor number"
            ));
        };
        return match grant::map_fd(fd) {
            Ok(p) => Source::Arbiter(p),
            Err(e) => Source::Unavailable(format!("{ENV_GRANT_FD}: {e}")),
        };
    }
    let Some(path) = get(ENV_SOCKET).filter(|p| !p.is_empty()) else {
        return Source::Standalone;
    };
    match register(&path, register_request(&get, config)) {
        Ok(p) => Source::Arbiter(p),
        Err(e) => Source::Unavailable(format!("arbiter at {path}: {e}")),
    }
}

fn register(path: &str, req: Request) -> Result<&'static GrantPage, String> {
    let stream = UnixStream::connect(path).map_err(|e| format!("connect failed: {e}"))?;
    stream
        .set_read_timeout(Some(ARBITER_TIMEOUT))
        .and_then(|_| stream.set_write_timeout(Some(ARBITER_TIMEOUT)))
        .map_err(|e| format!("socket options: {e}"))?;
    let client = Client::from_stream(stream);
    let (reply, fd) = client
        .call_with_fd(req)
        .map_err(|e| format!("registration failed: {e}"))?;
    match reply {
        Reply::Granted(g) => {
            let fd = fd.ok_or("the Granted reply carried no grant page fd")?;
            let page = grant::map_fd(fd.as_raw_fd())?;
            // The mapping keeps the memfd alive; the fd itself can go.
            drop(fd);
            // Held for the process lifetime: leaked on purpose (closing it releases the grant).
            // Its fd is close-on-exec, so exec'd programs do not hold the grant.
            std::mem::forget(client.into_stream());
            crate::log::line(
                crate::config::Level::Info,
                format_args!(
                    "arbiter mode: instance {} on GPU {} ({}), cap {} B, share {} %",
                    g.instance, g.gpu_index, g.gpu_uuid, g.memory_cap, g.sm_share
                ),
            );
            Ok(page)
        }
        Reply::Refused { code, reason } => {
            Err(format!("registration refused ({code:?}): {reason}"))
        }
        Reply::Error { code, message } => Err(format!("arbiter error ({code:?}): {message}")),
        other => Err(format!("unexpected reply {other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn registration_carries_the_function_and_its_declared_needs() {
        let mut c = Config::default();
        c.mem_cap[0] = 2 << 30;
        let get = env(&[
            ("SMORE_FUNCTION", "resnet"),
            ("SMORE_MODEL", "resnet50"),
            ("SMORE_SLO_MS", "50"),
        ]);
        match register_request(&get, &c) {
            Request::Register {
                function,
                model,
                slo_ms,
                memory,
                resume,
                gpu,
                exec,
            } => {
                assert_eq!(function, "resnet");
                assert_eq!(model.as_deref(), Some("resnet50"));
                assert_eq!(slo_ms, Some(50.0));
                assert_eq!(memory, Some(2 << 30));
                assert_eq!((resume, gpu, exec), (None, None, false));
            }
            other => panic!("{other:?}"),
        }
        // Defaults: the executable's name, no declared memory, a bad SLO is simply not sent.
        match register_request(&env(&[("SMORE_SLO_MS", "fast")]), &Config::default()) {
            Request::Register {
                function,
                slo_ms,
                memory,
                ..
            } => {
                assert!(!function.is_empty() && function != "unknown");
                assert_eq!((slo_ms, memory), (None, None));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn no_arbiter_variables_means_standalone_and_bad_ones_are_reported() {
        assert!(matches!(
            source(env(&[]), &Config::default()),
            Source::Standalone
        ));
        match source(env(&[("SMORE_GRANT_FD", "seven")]), &Config::default()) {
            Source::Unavailable(why) => assert!(why.contains("SMORE_GRANT_FD"), "{why}"),
            _ => panic!("a non-number fd must be refused"),
        }
        // A descriptor number that is not open.
        match source(env(&[("SMORE_GRANT_FD", "987654")]), &Config::default()) {
            Source::Unavailable(why) => assert!(why.contains("not open"), "{why}"),
            _ => panic!("a closed fd must be refused"),
        }
        match source(
            env(&[("SMORE_ARBITER_SOCKET", "/nonexistent/smore.sock")]),
            &Config::default(),
        ) {
            Source::Unavailable(why) => assert!(why.contains("connect failed"), "{why}"),
            _ => panic!("an unreachable socket must be reported"),
        }
    }
}

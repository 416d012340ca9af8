//! The standalone environment contract: `SMORE_MEMORY_LIMIT[_<ordinal>]`, `SMORE_SM_SHARE[_<ordinal>]`,
//! `SMORE_CONTENTION_PPM[_<ordinal>]`, `SMORE_SM_WINDOW_MS`, `SMORE_LOG`, `SMORE_FAILURE`.
//!
//! Owns parsing and validation only (pure, safe, testable with an injected variable lookup). Must
//! never panic on user input: every bad value becomes a [`ConfigError`] naming the variable and the
//! value, which the runtime reports once on stderr before running pass-through (see docs/shim.md).

use crate::limits::MAX_DEVICES;
use smore_protocol::grant::MAX_SWITCH_NS;
use std::fmt;

/// Default SM-share window: 100 ms. Source: the issue ("default about 100 ms"); long enough that
/// a 1–2 ms sampling period sees ≥ 50 samples per window, short enough that a function's burst
/// (bounded by share × window of GPU time) stays well under a trainer iteration.
pub const DEFAULT_WINDOW_MS: u64 = 100;
/// Largest accepted window: 10 s (reasoning: beyond that the "share of each window" is no longer
/// a latency bound for the co-located trainer).
pub const MAX_WINDOW_MS: u64 = 10_000;

/// Log verbosity, most severe first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// The shim cannot do what it was asked (a bad value, an unreachable arbiter).
    Error = 0,
    /// Something was refused or degraded (an allocation over the cap).
    Warn = 1,
    /// What the shim decided (mode, caps, footprints).
    Info = 2,
    /// Retries and details.
    Debug = 3,
}

/// What a hook does when the shim cannot do its job (bad configuration, the device of an
/// allocation cannot be determined, an internal panic).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailurePolicy {
    /// Call the real driver unaccounted (default): the host process never breaks because of us.
    Open,
    /// Refuse what cannot be accounted: allocations fail with CUDA_ERROR_OUT_OF_MEMORY; a bad
    /// configuration means a cap of 0. Launches are never refused (a refused launch would hang or
    /// corrupt the host's work), they pass unthrottled.
    Closed,
}

/// Validated standalone configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Memory cap in bytes per CUDA device ordinal; `u64::MAX` = no cap.
    pub mem_cap: [u64; MAX_DEVICES],
    /// SM time share in percent per device, 1..=100.
    pub sm_share: [u32; MAX_DEVICES],
    /// Contention budget per device, parts per million of wall time (0 = harvest off); the
    /// standalone counterpart of the grant page's `contention_ppm`.
    pub contention_ppm: [u32; MAX_DEVICES],
    /// What one context switch costs on every device, ns (`SMORE_SWITCH_US`; 0 = free); the
    /// standalone counterpart of the grant page's `switch_ns`.
    pub switch_ns: u64,
    /// The gate's window (`SMORE_SM_WINDOW_MS`), ms.
    pub window_ms: u64,
    /// Log verbosity (`SMORE_LOG`).
    pub log: Level,
    /// What to do when the shim cannot enforce (`SMORE_FAILURE`).
    pub policy: FailurePolicy,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            mem_cap: [u64::MAX; MAX_DEVICES],
            sm_share: [100; MAX_DEVICES],
            contention_ppm: [0; MAX_DEVICES],
            switch_ns: 0,
            window_ms: DEFAULT_WINDOW_MS,
            log: Level::Warn,
            policy: FailurePolicy::Open,
        }
    }
}

/// A bad environment value: names the variable, the value and what was expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The variable.
    pub var: String,
    /// Its value as found.
    pub value: String,
    /// What a valid value looks like.
    pub expected: &'static str,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid {}={:?}: expected {}",
            self.var, self.value, self.expected
        )
    }
}

/// Result of reading the environment. Log level and failure policy are parsed first and
/// independently, so even a bad limit is reported at the right level and handled by the
/// right policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    /// The configuration, defaults in place of bad values.
    pub config: Config,
    /// Every bad value found.
    pub errors: Vec<ConfigError>,
}

const SIZE_EXPECTED: &str =
    "bytes or a size like 512MiB, 2GiB, 1.5GB (units B, K/KB/KiB … T/TB/TiB)";

/// A byte size in the contract's syntax (`smore_protocol::size::parse_size`: bytes, `512MiB`,
/// `2GiB`, `1.5GB`, …); `None` when malformed.
fn parse_size(s: &str) -> Option<u64> {
    smore_protocol::size::parse_size(s).ok()
}

fn parse_share(s: &str) -> Option<u32> {
    let t = s.trim();
    let t = t.strip_suffix('%').unwrap_or(t);
    match t.parse::<u32>() {
        Ok(v) if (1..=100).contains(&v) => Some(v),
        _ => None,
    }
}

fn parse_level(s: &str) -> Option<Level> {
    Some(match s.trim().to_ascii_lowercase().as_str() {
        "error" => Level::Error,
        "warn" | "warning" => Level::Warn,
        "info" => Level::Info,
        "debug" | "trace" => Level::Debug,
        _ => return None,
    })
}

const PPM_EXPECTED: &str = "an integer 0..=1000000 (parts per million of wall time; 0 = off)";

fn parse_ppm(s: &str) -> Option<u32> {
    s.trim().parse::<u32>().ok().filter(|&p| p <= 1_000_000)
}

fn parse_policy(s: &str) -> Option<FailurePolicy> {
    Some(match s.trim().to_ascii_lowercase().as_str() {
        "open" | "fail-open" => FailurePolicy::Open,
        "closed" | "fail-closed" => FailurePolicy::Closed,
        _ => return None,
    })
}

/// Reads the contract through `get` (a variable lookup; `std::env::var` in production).
pub fn parse(get: impl Fn(&str) -> Option<String>) -> Parsed {
    let mut c = Config::default();
    let mut errors = Vec::new();
    let mut bad = |var: &str, value: &str, expected: &'static str| {
        errors.push(ConfigError {
            var: var.to_string(),
            value: value.to_string(),
            expected,
        })
    };

    if let Some(v) = get("SMORE_LOG") {
        match parse_level(&v) {
            Some(l) => c.log = l,
            None => bad("SMORE_LOG", &v, "error, warn, info or debug"),
        }
    }
    if let Some(v) = get("SMORE_FAILURE") {
        match parse_policy(&v) {
            Some(p) => c.policy = p,
            None => bad("SMORE_FAILURE", &v, "open or closed"),
        }
    }
    if let Some(v) = get("SMORE_MEMORY_LIMIT") {
        match parse_size(&v) {
            Some(b) => c.mem_cap = [b; MAX_DEVICES],
            None => bad("SMORE_MEMORY_LIMIT", &v, SIZE_EXPECTED),
        }
    }
    if let Some(v) = get("SMORE_SM_SHARE") {
        match parse_share(&v) {
            Some(p) => c.sm_share = [p; MAX_DEVICES],
            None => bad("SMORE_SM_SHARE", &v, "an integer percent 1..=100"),
        }
    }
    for d in 0..MAX_DEVICES {
        let var = format!("SMORE_MEMORY_LIMIT_{d}");
        if let Some(v) = get(&var) {
            match parse_size(&v) {
                Some(b) => c.mem_cap[d] = b,
                None => bad(&var, &v, SIZE_EXPECTED),
            }
        }
        let var = format!("SMORE_SM_SHARE_{d}");
        if let Some(v) = get(&var) {
            match parse_share(&v) {
                Some(p) => c.sm_share[d] = p,
                None => bad(&var, &v, "an integer percent 1..=100"),
            }
        }
    }
    if let Some(v) = get("SMORE_CONTENTION_PPM") {
        match parse_ppm(&v) {
            Some(p) => c.contention_ppm = [p; MAX_DEVICES],
            None => bad("SMORE_CONTENTION_PPM", &v, PPM_EXPECTED),
        }
    }
    for d in 0..MAX_DEVICES {
        let var = format!("SMORE_CONTENTION_PPM_{d}");
        if let Some(v) = get(&var) {
            match parse_ppm(&v) {
                Some(p) => c.contention_ppm[d] = p,
                None => bad(&var, &v, PPM_EXPECTED),
            }
        }
    }
    if let Some(v) = get("SMORE_SWITCH_US") {
        match v.trim().parse::<u64>() {
            Ok(us) if us.saturating_mul(1_000) <= MAX_SWITCH_NS => c.switch_ns = us * 1_000,
            _ => bad("SMORE_SWITCH_US", &v, "microseconds 0..=10000"),
        }
    }
    if let Some(v) = get("SMORE_SM_WINDOW_MS") {
        match v.trim().parse::<u64>() {
            Ok(ms) if (1..=MAX_WINDOW_MS).contains(&ms) => c.window_ms = ms,
            _ => bad("SMORE_SM_WINDOW_MS", &v, "milliseconds 1..=10000"),
        }
    }
    Parsed { config: c, errors }
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
    fn sizes_use_the_protocol_syntax() {
        let p = parse(env(&[
            ("SMORE_MEMORY_LIMIT", "1.5GiB"),
            ("SMORE_MEMORY_LIMIT_2", "100MB"),
        ]));
        assert!(p.errors.is_empty(), "{:?}", p.errors);
        assert_eq!(p.config.mem_cap[0], 3 << 29);
        assert_eq!(p.config.mem_cap[2], 100_000_000);
        for bad in ["", "abc", "12XB", "-1", "GiB", "99999999999999999999TiB"] {
            let p = parse(env(&[("SMORE_MEMORY_LIMIT", bad)]));
            assert_eq!(p.errors.len(), 1, "{bad:?} must be refused");
        }
    }

    #[test]
    fn a_switch_cost_is_microseconds_within_the_page_bound() {
        let p = parse(env(&[("SMORE_SWITCH_US", "250")]));
        assert!(p.errors.is_empty(), "{:?}", p.errors);
        assert_eq!(p.config.switch_ns, 250_000);
        for bad in ["", "-1", "0.5", "10001", "ms"] {
            let p = parse(env(&[("SMORE_SWITCH_US", bad)]));
            assert_eq!(p.errors.len(), 1, "{bad:?} must be refused");
            assert!(p.errors[0].to_string().contains("SMORE_SWITCH_US"));
        }
    }

    #[test]
    fn no_variables_give_the_default_config() {
        let p = parse(env(&[]));
        assert!(p.errors.is_empty());
        assert_eq!(p.config, Config::default());
    }

    #[test]
    fn a_per_device_variable_overrides_the_global_one() {
        let p = parse(env(&[
            ("SMORE_MEMORY_LIMIT", "2GiB"),
            ("SMORE_MEMORY_LIMIT_1", "512MiB"),
            ("SMORE_SM_SHARE", "25"),
            ("SMORE_SM_SHARE_2", "100%"),
            ("SMORE_SM_WINDOW_MS", "50"),
            ("SMORE_LOG", "debug"),
            ("SMORE_FAILURE", "closed"),
        ]));
        assert!(p.errors.is_empty(), "{:?}", p.errors);
        assert_eq!(p.config.mem_cap[0], 2 << 30);
        assert_eq!(p.config.mem_cap[1], 512 << 20);
        assert_eq!(p.config.mem_cap[2], 2 << 30);
        assert_eq!(p.config.sm_share[0], 25);
        assert_eq!(p.config.sm_share[2], 100);
        assert_eq!(p.config.window_ms, 50);
        assert_eq!(p.config.log, Level::Debug);
        assert_eq!(p.config.policy, FailurePolicy::Closed);
    }

    #[test]
    fn a_contention_budget_is_read_in_parts_per_million_per_device() {
        let p = parse(env(&[
            ("SMORE_CONTENTION_PPM", "50000"),
            ("SMORE_CONTENTION_PPM_2", "0"),
        ]));
        assert!(p.errors.is_empty(), "{:?}", p.errors);
        assert_eq!(p.config.contention_ppm[0], 50_000);
        assert_eq!(p.config.contention_ppm[2], 0);
        for bad in ["-1", "1000001", "5%", ""] {
            let p = parse(env(&[("SMORE_CONTENTION_PPM", bad)]));
            assert_eq!(p.errors.len(), 1, "{bad:?} must be refused");
        }
    }

    #[test]
    fn every_bad_value_is_reported_with_its_variable() {
        let p = parse(env(&[
            ("SMORE_SM_SHARE", "0"),
            ("SMORE_MEMORY_LIMIT_3", "lots"),
            ("SMORE_LOG", "loud"),
            ("SMORE_SM_WINDOW_MS", "0"),
        ]));
        let vars: Vec<_> = p.errors.iter().map(|e| e.var.as_str()).collect();
        assert_eq!(
            vars,
            [
                "SMORE_LOG",
                "SMORE_SM_SHARE",
                "SMORE_MEMORY_LIMIT_3",
                "SMORE_SM_WINDOW_MS"
            ]
        );
        let msg = p.errors[1].to_string();
        assert!(
            msg.contains("SMORE_SM_SHARE") && msg.contains("\"0\""),
            "{msg}"
        );
        for s in ["101", "-5", "50.5", ""] {
            assert!(
                !parse(env(&[("SMORE_SM_SHARE", s)])).errors.is_empty(),
                "{s}"
            );
        }
    }
}

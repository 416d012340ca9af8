//! Adapter from the policy seam to SMORE's degradation-aware scheduler (predictor crate).
use crate::config::Config;
use crate::policy::Policy;
use anyhow::{bail, Result};

/// Builds the SMORE policy from `[policy] catalog` and `model`.
pub fn from_config(_cfg: &Config) -> Result<Box<dyn Policy>> {
    bail!("[policy] name = \"smore\" is not available in this build yet; use name = \"fit\"")
}

//! # smore-predictor
//!
//! Co-location degradation prediction (SMORE, Liu et al., TPDS 2025): per-model features, pair-wise
//! random-forest models, multi-way weights with online updates, and a lookup table for fast queries.
//!
//! Must never: present synthetic data as measured, or let one bad observation blow up a weight.
#![forbid(unsafe_code)]

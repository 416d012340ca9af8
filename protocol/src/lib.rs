//! # smore-protocol
//!
//! Owns the contracts that cross a process boundary between the shim (inside function processes),
//! the `smore` CLI, runtimes using the C ABI, and the arbiter (the node daemon):
//!
//! - [`wire`]: the Unix-socket messages and their framing (length-prefixed JSON, versioned);
//! - [`grant`]: the layout of the grant page the arbiter writes and the shim maps read-only;
//! - [`conn`]: one connection: framed messages, the grant page fd as `SCM_RIGHTS`, `SO_PEERCRED`;
//! - [`size`]: human-readable byte sizes used by the environment contract and the config;
//! - [`env`]: which variables carry a grant into a child process, and scrubbing them;
//! - [`ledger`]: the layout of the shared ledger through which every process of one grant
//!   charges the grant's one memory cap;
//! - [`board`]: the layout of the turn board through which the harvesting functions of a
//!   time-sliced GPU take turns;
//! - [`phase`]: the training job's phase predicted from the samples on that board;
//! - [`install`]: where an installed (or freshly built) smore keeps the shim and its helpers.
//!
//! Must never: depend on anything heavy (the shim links it into other people's processes), allocate
//! or lock on the read side of the grant page, or change a layout or message without bumping its
//! version.
#![forbid(unsafe_code)]

pub mod board;
pub mod conn;
pub mod env;
// grant.rs belongs to the shim re-layering (documented there); exempt until it is.
#[allow(missing_docs)]
pub mod grant;
pub mod install;
pub mod ledger;
pub mod phase;
pub mod size;
pub mod wire;

//! The bottom layer: everything that talks to the C world below the shim — the dynamic linker,
//! the real driver, libc — behind safe functions. Imports nothing from the crate but the pure
//! export-name table ([`crate::variants`]), so every layer above may use it and it uses none of
//! them; where the runtime must be told of something (a fork), it passes a callback down.
//!
//! - [`dlsym`]: the real `dlsym` (from `dlvsym(RTLD_NEXT, …)`); the exported trampoline that
//!   interposes `dlsym` is a hook (`hooks::resolution`).
//! - [`driver`]: opens the real `libcuda.so.1` / `libnvidia-ml.so.1`, resolves each real export by
//!   its exact name on that handle; safe wrappers for the helper calls the shim makes itself.
//! - [`grant`]: maps the arbiter's grant page read-only.
//! - [`os`]: monotonic clock, absolute sleep, stderr, fds, signal mask, fork-handler
//!   registration (with the runtime's callback), and the lock-free slots holding leaked values.
//!
//! Must never: call anything that could re-enter our own `dlsym` export while resolving the real
//! `dlsym`, fall back to a global symbol look-up, let a panic unwind into C, or import a module
//! above it.

pub mod dlsym;
pub mod driver;
pub mod grant;
pub mod os;

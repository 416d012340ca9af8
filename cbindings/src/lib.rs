//! # smore-c
//!
//! The C ABI (and checked-in header) through which any function runtime — C, C++, Python via
//! ctypes — registers with the arbiter, declares its SLO, reports request latencies and asks for
//! admission.
//!
//! Must never: let a panic cross the ABI, or block the runtime when the arbiter is gone.

//! A small shim so the hot-path atomics can be swapped for loom's model-checked ones.
//!
//! Under `--cfg lameduck_loom` (not plain `loom`, which would also switch Tokio into its own loom mode and compile out its signal and net modules) the counter and the arrival table's owner word are built on `loom::sync::atomic`; otherwise on `std`.

#[cfg(lameduck_loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

#[cfg(not(lameduck_loom))]
pub(crate) use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

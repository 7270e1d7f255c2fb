//! A small shim so the hot-path atomics can be swapped for loom's model-checked ones.
//!
//! Under `--cfg loom` the counter is built on `loom::sync::atomic`; otherwise on `std`.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicUsize, Ordering};

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicUsize, Ordering};

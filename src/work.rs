//! The work a drain waits for and ends, transport-agnostic: named background tasks, the
//! resource closers that run in order after them, and bounded actions (recovery, closers).
//! [`Work`] is the handle that owns them; the lifecycle holds a clone of it.

pub(crate) mod action;
pub(crate) mod closers;
mod handle;
pub(crate) mod tasks;

pub use handle::Work;

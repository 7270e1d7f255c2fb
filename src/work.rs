//! The work a drain waits for and ends, transport-agnostic: named background tasks, the
//! resource closers that run in order after them, and bounded actions (recovery, closers).

pub(crate) mod action;
pub(crate) mod closers;
pub(crate) mod tasks;

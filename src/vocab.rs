//! The words every part may use: phases, events and triggers, their JSON names, the budget
//! and the configuration error, what an admin token may be, and the poison-free lock.

pub(crate) mod budget;
pub(crate) mod error;
pub(crate) mod names;
pub(crate) mod phase;
pub(crate) mod sync;
#[cfg(feature = "admin")]
pub(crate) mod token;

//! The hot path: the packed in-flight counter, the guard and its leaked block, what a drain
//! observes beside the count (arrivals, stalled writes, traffic-path labels). It depends on
//! nothing above it but the shared vocabulary (`vocab`); everything above reads it through
//! methods. Concurrency here is modelled with loom (`loom.rs`).

pub(crate) mod counter;
pub(crate) mod guard;
pub(crate) mod loom;
pub(crate) mod observed;
pub(crate) mod path_counts;
pub(crate) mod stall;

//! The Kubernetes API as evidence (feature `kube`): this Pod's EndpointSlices and its
//! deletion.
//!
//! An add-on: `watch` watches this Pod and every EndpointSlice that lists it and feeds the
//! coordinator's link (`crate::propagation::link`, compiled in every build so the report says which
//! evidence was used, and without the feature why the API was not) through a few
//! crate-internal methods of the [`Drain`](crate::Drain) handle. Nothing in the coordinator
//! depends on this module.

mod model;
mod watch;

pub use watch::{
    EndpointWatch, KubeError, DEFAULT_EVICTION_GRACE, DEFAULT_NODE_SHUTDOWN_GRACE,
    DEFAULT_PROXY_ALLOWANCE,
};

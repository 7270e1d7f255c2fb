//! The Kubernetes API as evidence: this Pod's EndpointSlices and its deletion.
//!
//! [`link`] is what the coordinator reads — compiled in every build, so the report says which
//! evidence was used and, without the `kube` feature, why the API was not. `watch` (feature
//! `kube`) is the only writer: it watches this Pod and every EndpointSlice that lists it and
//! feeds the link.

pub(crate) mod link;
#[cfg(feature = "kube")]
mod watch;

pub use link::{DeletionBudget, EndpointSliceEvidence};
#[cfg(feature = "kube")]
pub use watch::{EndpointWatch, KubeError, DEFAULT_PROXY_ALLOWANCE};

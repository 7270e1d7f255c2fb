//! Long-form guides, one per stack.
//!
//! | Guide | For |
//! |---|---|
//! | [`axum`] | apps that keep `axum::serve(...).with_graceful_shutdown(...)` |
//! | [`hyper`] | apps with their own hyper accept loop |
//! | [`tonic`] | gRPC services: the drain layer, GOAWAY, the standard health service |
//! | [`kubernetes`] | the Pod spec: probes, `preStop`, the grace period, reading the report |
//!
//! Apps that can hand their accept loop to [`serve`](crate::serve) need none of the first
//! three: it does every connection step of the drain itself.

#[cfg(feature = "admin")]
#[cfg_attr(docsrs, doc(cfg(feature = "admin")))]
#[doc = include_str!("docs/axum.md")]
pub mod axum {}

#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
#[doc = include_str!("docs/hyper.md")]
pub mod hyper {}

#[cfg(feature = "grpc")]
#[cfg_attr(docsrs, doc(cfg(feature = "grpc")))]
#[doc = include_str!("docs/tonic.md")]
pub mod tonic {}

#[cfg(feature = "admin")]
#[cfg_attr(docsrs, doc(cfg(feature = "admin")))]
#[doc = include_str!("docs/kubernetes.md")]
pub mod kubernetes {}

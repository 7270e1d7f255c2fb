//! Long-form guides, one per stack.
//!
//! | Guide | For | Features |
//! |---|---|---|
//! | [`axum`] | axum apps: [`lameduck::serve`][serve] (recommended), the one-call [`axum_serve`][one-call] that keeps axum's accept loop, or `axum::serve` wired by hand | `axum` (default) |
//! | [`hyper`] | apps with their own hyper accept loop | `http` (default) |
//! | [`tonic`] | gRPC services: the drain layer, GOAWAY, the standard health service | `grpc` |
//! | [`worker`] | queue consumers, pollers, cron-style processes with no HTTP | none |
//! | [`kubernetes`] | the Pod spec: probes, `preStop`, the grace period, reading the report | none (`admin` for the probes) |
//!
//! Apps that can hand their accept loop to [`lameduck::serve`][serve] need neither the
//! axum nor the hyper guide: it does every connection step of the drain itself.
//!
//! A guide whose feature this build of the docs leaves out links to the crate's
//! [feature table](crate#feature-flags).
//!
#![cfg_attr(feature = "axum", doc = "[one-call]: crate::axum_serve")]
#![cfg_attr(feature = "http", doc = "[serve]: crate::serve")]
#![cfg_attr(
    not(feature = "axum"),
    doc = "[`axum`]: crate#feature-flags\n[one-call]: crate#feature-flags"
)]
#![cfg_attr(
    not(feature = "http"),
    doc = "[`hyper`]: crate#feature-flags\n[serve]: crate#feature-flags"
)]
#![cfg_attr(not(feature = "grpc"), doc = "[`tonic`]: crate#feature-flags")]

#[cfg(feature = "axum")]
#[doc = include_str!("docs/axum.md")]
pub mod axum {}

#[cfg(feature = "http")]
#[doc = include_str!("docs/hyper.md")]
pub mod hyper {}

#[cfg(feature = "grpc")]
#[doc = include_str!("docs/tonic.md")]
#[doc = ""]
#[cfg_attr(feature = "axum", doc = "[axum-guide]: crate::guide::axum")]
#[cfg_attr(not(feature = "axum"), doc = "[axum-guide]: crate#feature-flags")]
pub mod tonic {}

#[doc = include_str!("docs/worker.md")]
pub mod worker {}

#[doc = include_str!("docs/kubernetes.md")]
// Links to items behind features, resolved in every feature set (after a blank line: a link
// definition cannot interrupt a paragraph).
#[doc = ""]
#[cfg_attr(feature = "admin", doc = "[admin-router]: crate::admin")]
#[cfg_attr(
    feature = "admin",
    doc = "[prestop-blocking]: crate::admin::prestop_blocking"
)]
#[cfg_attr(feature = "http", doc = "[serve]: crate::serve")]
#[cfg_attr(feature = "http", doc = "[stream-stop]: crate::StreamStop::new")]
#[cfg_attr(
    feature = "http",
    doc = "[max-connections]: crate::Serve::max_connections"
)]
#[cfg_attr(
    not(feature = "admin"),
    doc = "[admin-router]: crate#feature-flags\n[prestop-blocking]: crate#feature-flags"
)]
#[cfg_attr(
    not(feature = "http"),
    doc = "[serve]: crate#feature-flags\n[stream-stop]: crate#feature-flags\n[max-connections]: crate#feature-flags"
)]
pub mod kubernetes {}

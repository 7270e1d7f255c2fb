//! HTTP integration: the drain layer, connection metadata, the accept loop and long-lived
//! streams.
//!
//! * [`DrainLayer`] / [`DrainService`]: tower middleware that counts each request until its
//!   response body ends, adds `Connection: close` while draining, and records what arrives
//!   after the readiness flip.
//! * [`ConnMeta`]: connection id, accept time, peer, request index.
//! * [`serve()`]: the accept loop (HTTP/1.1 + HTTP/2 on one port) that keeps accepting while
//!   draining, sends GOAWAY, closes idle connections at `stopped_accepting` and force-closes at
//!   the deadline.
//! * [`StreamStop`] / [`EndOnStop`]: end server-sent events and other endless streams at
//!   `stopped_accepting`, optionally spread over a window.
//!
//! axum apps that keep axum's accept loop: see [`guide::axum`] (feature `axum`); apps with their
//! own hyper accept loop: see [`guide::hyper`](crate::guide::hyper).
//!
#![cfg_attr(feature = "axum", doc = "[`guide::axum`]: crate::guide::axum")]
#![cfg_attr(not(feature = "axum"), doc = "[`guide::axum`]: crate#feature-flags")]

pub(crate) mod accept;
mod body;
mod conn_meta;
mod connection;
pub mod future;
mod io;
mod layer;
mod line;
pub(crate) mod options;
mod refusal;
mod serve;
mod service;
mod stream;

pub use body::DrainBody;
#[cfg(feature = "axum")]
pub(crate) use conn_meta::note_accepted;
pub use conn_meta::ConnMeta;
pub use layer::DrainLayer;
pub use line::{Naming, RequestLine, Unnamed};
pub use refusal::{Refusal, RefuseAfterStop, ServeAfterStop};
pub use serve::{
    serve, Serve, DEFAULT_HTTP2_MAX_CONCURRENT_STREAMS, SUGGESTED_HEADER_READ_TIMEOUT,
};
pub use service::DrainService;
pub use stream::{EndOnStop, StreamStop};

// Not a public module: its `serve` is `axum_serve` at the root and its future
// `server::AxumServe`, so that `use lameduck::*;` leaves the `axum` crate's name alone.
#[cfg(feature = "axum")]
mod axum_serve;
#[cfg(feature = "axum")]
#[doc(hidden)] // public as `lameduck::axum_serve`
pub use axum_serve::serve as axum_serve;
#[cfg(feature = "axum")]
pub use axum_serve::AxumServe;

//! Graceful shutdown for services on Kubernetes.
//!
//! `lameduck` puts a service into *lame-duck mode* when it is asked to go away: it flips
//! readiness, keeps serving whatever still arrives while load balancers catch up, counts
//! in-flight requests and background tasks, closes resources in order once the work that uses
//! them is done, and exits inside the Pod's `terminationGracePeriodSeconds` — then explains the
//! drain with a [`DrainReport`] (its parts are in [`report`]). The service's life is a line of
//! [phases](Phase), from `Starting` to `Done`; [`Phase`] draws it, with what moves it from one
//! phase to the next.
//!
//! # Quick start
//!
//! ```
//! use std::time::Duration;
//! use lameduck::{Drain, Propagation, Signals, Trigger};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), lameduck::ConfigError> {
//! let drain = Drain::builder()
//!     .propagation(Propagation::quiet(Duration::from_secs(2)))
//!     # .signals(Signals::none()).report_to_stderr(false)
//!     .build()?;
//!
//! drain.work().spawn("flush-uploads", async { /* must finish before exit */ });
//! drain.work().on_close("database", || async { Ok::<_, std::io::Error>(()) });
//!
//! # drain.start(Trigger::Api);
//! let report = drain.run().await; // waits for the stop signal (or /drain), then drains
//! # assert_eq!(report.exit_code, 0);
//! // Return it from `main` (`-> Result<DrainReport, _>`) to exit with its code after
//! // destructors ran.
//! # Ok(()) }
//! ```
//!
//! # The budget
//!
//! One budget, counted from the first trigger, because kubelet counts the `preStop` hook inside
//! the grace period:
//!
//! ```text
//! hard deadline     = origin + grace_period − safety_margin      (margin default 1 s)
//! quiesce deadline  = hard deadline − close_budget                (close_budget default 5 s)
//! propagation max   ≤ quiesce deadline
//! ```
//!
//! # Stacks
//!
//! | You run | Use | Guide |
//! |---|---|---|
//! | axum, hyper or any tower service, and can hand over the accept loop (recommended) | [`serve`] + [`Drain::layer`]; `.connect_info()` for `ConnectInfo` extractors | [`guide::axum`] (which one) |
//! | axum, keeping axum's own accept loop | [`axum_serve`] + [`Drain::layer`] | [`guide::axum`] |
//! | your own hyper accept loop | [`Drain::layer`] + [`ConnMeta`] + the tokens | [`guide::hyper`] |
//! | tonic (gRPC) | [`Drain::layer`] + [`grpc::health`] | [`guide::tonic`] |
//! | server-sent events, WebSockets, watches | [`StreamStop::new`], [`StreamStop::wrap`], a guard per socket | `examples/sse.rs`, `examples/websocket.rs` |
//! | queue consumers, pollers, cron-style workers (no HTTP) | [`Work::spawn_cancellable`] | [`guide::worker`] |
//! | Kubernetes probes and `preStop` | [`AdminBuilder::new`]`(&drain).serve(listener)` | [`guide::kubernetes`] |
//!
//! Each guide opens with the `Cargo.toml` lines it needs. An item that needs a feature this
//! build of the docs leaves out links to the table below.
//!
//! # Feature flags
//!
//! | Feature | Default | Enables |
//! |---|---|---|
//! | `http` | yes | [`DrainLayer`] (tower middleware), [`ConnMeta`], the [`serve`] accept loop and [`StreamStop`] — on hyper 1 and hyper-util |
//! | `axum` | yes | [`axum_serve`]: `axum::serve` with [`ConnMeta`], the stop token and the deadline bound, in one call; implies `http` |
//! | `admin` | yes | the admin router (`/livez`, `/readyz`, `/drain`, `/status`) on axum, and the [`prestop`] helper; implies `axum` |
//! | `grpc` | no | [`grpc::health`]: the standard gRPC health service (tonic-health) following the drain; implies `http` |
//! | `metrics` | no | gauges, histograms and counters of the drain through the `metrics` facade (bring your own exporter); `Metrics::new` (`Metrics::record`, `Metrics::spawn_updater`) |
//! | `kube` | no | [`EndpointWatch`]: watches this Pod and its EndpointSlices (kube-rs 2.0, rustls on ring, k8s-openapi without a Kubernetes version of its own: your binary picks it); propagation waits for the slices plus a proxy allowance, the deletion's grace shrinks the deadlines, each endpoint change is in the timeline. Without it, the report's `endpoint_slice_unused` says so |
//! | `prometheus` | no | `GET /metrics` on the admin router (`AdminBuilder::prometheus`) in Prometheus text format, and `drain_metrics::prometheus_builder`; no HTTP listener or TLS of its own; implies `metrics` and `admin` |
//!
//! The defaults are what a typical axum service needs. With no features at all, the
//! coordinator ([`Drain`], phases, budget, tasks, closers, signals, the report) is still there
//! for services that are not HTTP.
//!
#![forbid(unsafe_code)]
// Items behind a feature this build leaves out: their links point at the feature table, so the
// docs build without broken links in every feature set.
#![cfg_attr(
    not(feature = "http"),
    doc = "[`serve`]: crate#feature-flags\n[`Drain::layer`]: crate#feature-flags\n[`ConnMeta`]: crate#feature-flags\n[`guide::hyper`]: crate#feature-flags\n[`StreamStop::new`]: crate#feature-flags\n[`StreamStop::wrap`]: crate#feature-flags\n[`DrainLayer`]: crate#feature-flags\n[`StreamStop`]: crate#feature-flags"
)]
#![cfg_attr(
    not(feature = "axum"),
    doc = "[`axum_serve`]: crate#feature-flags\n[`guide::axum`]: crate#feature-flags"
)]
#![cfg_attr(
    not(feature = "grpc"),
    doc = "[`grpc::health`]: crate#feature-flags\n[`guide::tonic`]: crate#feature-flags"
)]
#![cfg_attr(not(feature = "kube"), doc = "[`EndpointWatch`]: crate#feature-flags")]
#![cfg_attr(
    not(feature = "admin"),
    doc = "[`AdminBuilder::new`]: crate#feature-flags\n[`prestop`]: crate#feature-flags"
)]
// On docs.rs, `doc_cfg` labels every item behind a feature with it (no per-item attribute).
#![cfg_attr(docsrs, feature(doc_cfg))]

// One folder a part (see the crate's design): the hot path, the lifecycle, the work, the
// propagation (policy, arrival evidence, the EndpointSlice link), readiness, the report, the
// words every part uses, and the drain handle that puts them together; the add-ons below.
mod drain;
mod hot;
// Named `server`, not `http`: a module named `http` would make `use lameduck::*;` shadow the
// `http` crate (E0659).
#[cfg(feature = "kube")]
mod kube;
mod lifecycle;
mod propagation;
mod readiness;
#[cfg(feature = "http")]
pub mod server;
mod vocab;
mod work;

#[cfg(feature = "admin")]
pub mod admin;
#[cfg(feature = "grpc")]
pub mod grpc;
pub mod guide;
// Public as `drain_metrics`, not `metrics`: the `metrics` crate keeps its name under a glob.
#[cfg(feature = "metrics")]
pub mod drain_metrics;
/// Without the `metrics` feature no add-on follows the lifecycle.
#[cfg(not(feature = "metrics"))]
mod drain_metrics {
    pub(crate) fn observer() -> Option<Box<dyn crate::lifecycle::Observer>> {
        None
    }
}
pub mod report;

#[cfg(feature = "kube")]
pub use self::kube::{
    EndpointWatch, KubeError, DEFAULT_EVICTION_GRACE, DEFAULT_NODE_SHUTDOWN_GRACE,
    DEFAULT_PROXY_ALLOWANCE,
};
#[cfg(feature = "axum")]
pub use self::server::axum_serve;
#[cfg(feature = "http")]
pub use self::server::{
    serve, ConnMeta, DrainBody, DrainLayer, DrainService, EndOnStop, Serve, StreamStop,
};
#[cfg(feature = "metrics")]
pub use drain::metrics::Metrics;
pub use drain::{Counts, Drain, DrainBuilder, Moments, Readiness, StartupGate, PROXY_LABEL_ENV};
pub use lifecycle::{Status, STATUS_TIMELINE_LIMIT};
pub use vocab::budget::{
    parse_duration, Budget, GRACE_PERIOD_ENV, MAX_GRACE_PERIOD, MIN_GRACE_PERIOD,
    SHORTEST_GRACE_ENV,
};
pub use vocab::error::ConfigError;
pub use work::closers::{BoxError, CloseOptions};
/// Internals that this crate's own tests, examples and benchmarks reach: the advice rules and
/// one drain's propagation in virtual time (the simulation that checks ε). Not a public API: no
/// stability promise.
#[doc(hidden)]
pub mod __private {
    pub use crate::propagation::sim as evidence_sim;
    pub use crate::report::rules::advise;
}
pub use drain::signal::{Signals, StopSignal, STOP_SIGNAL_ENV};
pub use hot::guard::InFlightGuard;
pub use propagation::{Propagation, NODE_AGENTS_ENV, PER_REQUEST_PEERS_ENV};
pub use readiness::{ReadinessAnswer, KNATIVE_PROBE_HEADER, PROBE_HEADER};
pub use report::DrainReport;
pub use vocab::phase::ReadinessWhileDraining;
pub use vocab::phase::{CommitReason, Event, EventKind, Phase, Trigger};
pub use work::tasks::TaskContext;
pub use work::Work;

#[cfg(feature = "admin")]
pub use admin::{prestop, prestop_blocking, AdminBuilder, PrestopError, PrestopOptions};

// Compile-checks the README's Rust examples (the first is an axum service with the admin port).
#[doc = include_str!("../README.md")]
#[cfg(all(doctest, feature = "admin"))]
pub struct ReadmeDoctests;

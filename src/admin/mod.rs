//! The admin listener: probes, the `preStop` drain endpoint, status, and a `preStop` client.
//!
//! `lameduck::AdminBuilder::new(&drain).router()` ([`AdminBuilder::new`]) builds an [`axum::Router`] for a **separate**
//! listener that kubelet and operators talk to. It is not the service's traffic port and must
//! not be in the Kubernetes Service.
//!
//! | Route | Methods | Answers |
//! |---|---|---|
//! | `/livez` | GET, HEAD | `200 ok`, always — including for the whole drain (a failing liveness probe during a drain makes kubelet restart the container and lose work). `?verbose` lists the checks. |
//! | `/readyz` | GET, HEAD | `200 ok` when Serving; `503` with a one-line reason (`starting: waiting for cache-warmup`, `draining`, `check db failed: …`) otherwise — except that while draining under [`ReadinessWhileDraining::Auto`](crate::ReadinessWhileDraining::Auto) (the default) kubelet's probe (`User-Agent: kube-probe/…`) is still answered `200` until accepting stops, so the EndpointSlice keeps `serving=true`. `/status` shows both answers (`ready`, `ready_for_kubelet`). `?verbose` lists every check, one per line. |
//! | `/drain` | GET, POST | Starts the drain (trigger `prestop`; idempotent) and answers with the `/status` JSON once `wait` holds: `wait=none` → `202` at once; `wait=propagated` → `200` after `stopped_accepting`; `wait=drained` (default) → `200` when the drain is done. `timeout=<duration>` (`20s`, `1500ms`) bounds the wait: `504` with the status when it passes, and the drain goes on. On [`AdminBuilder::serve`], at most `max_connections` less an eighth (56 of 64) callers wait at once; one more gets `503` + `Retry-After` (the drain is started for it all the same). |
//! | `/status` | GET, HEAD | `200` with the [`Status`](crate::Status) JSON: phase, in-flight, connections, tasks, budget left, timeline so far. |
//! | `/metrics` | GET, HEAD | Only with the `prometheus` feature and a handle given to `AdminBuilder::prometheus`: samples the drain's metrics (module `lameduck::metrics`) and answers `200` with the recorder's Prometheus text exposition. |
//!
//! GET is accepted on `/drain` because a Kubernetes `httpGet` lifecycle hook can only send GET.
//!
//! # Bad input changes nothing
//!
//! Requests are checked in this order, and nothing is started before every check passed:
//! unknown route → `404`; method not allowed → `405` with `Allow`; body declared over the
//! limit (default 1 KiB; parameters live in the query string) → `413`; `/drain` only, which
//! reads its body before acting: a body over the limit → `413`, one that has not arrived
//! within the header-read timeout (5 s) → `408`; `/drain` without the right bearer token →
//! `401`; unknown, duplicate, empty or malformed query parameter, or a bad value → `400`
//! naming it. Probes and `/status` never read a body: a client that announces one and never
//! sends it gets its answer at once, and the connection is closed after it.
//!
//! # The token
//!
//! When a token is configured ([`AdminBuilder::token`], or env `LAMEDUCK_ADMIN_TOKEN` by
//! default), `/drain` requires `Authorization: Bearer <token>`; without it the answer is `401`
//! and the drain does not start. Probes and `/status` stay open: kubelet probes cannot be
//! configured with a secret, and they change nothing.
//!
//! A token is 1 to 4096 characters of visible ASCII (`!` to `~`) once surrounding whitespace
//! is trimmed: what kubelet's `httpGet` headers, `curl` and the bundled [`prestop`] client send
//! verbatim. The router and the client check the same rule, and a token that breaks it is
//! refused at startup, naming what is wrong, never the value: [`AdminBuilder::token`] returns
//! an error, and so does [`Drain::builder`](crate::Drain::builder)'s `build` for `LAMEDUCK_ADMIN_TOKEN`.
//!
//! # Serving it
//!
//! Serve the admin endpoint on its own listener with [`AdminBuilder::serve`], not with the
//! drain's accept loop and not behind the drain's request layer: the admin listener must stay
//! up until the process exits (probes keep coming during the drain), and a
//! `/drain?wait=drained` request counted as in-flight work would wait for itself.
//!
//! [`AdminBuilder::serve`] is built for hostile networks: an HTTP/1 header-read timeout (5 s)
//! and a connection cap (64) that evicts the connection that owes least (idle, or a head or a
//! body still arriving; never one whose client's bytes are not read yet), so slowloris
//! connections, bodies that never come and connection floods cannot lock the probes out; and
//! [`Drain::run`](crate::Drain::run) does not return before every `/drain?wait=…` caller got its answer, fully
//! written (bounded by the hard deadline), while connections that owe nothing close at once
//! and never hold the exit.
//! The router alone (`lameduck::AdminBuilder::new(&drain).router()`) can be served by `axum::serve` too, without the
//! timeout and the cap; `run` then waits until each `/drain` answer is handed to axum, not
//! until it is written.
//!
//! ```
//! use lameduck::{Drain, Signals};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let drain = Drain::builder().build()?;
//! let listener = tokio::net::TcpListener::bind("0.0.0.0:9901").await?;
//! tokio::spawn(lameduck::AdminBuilder::new(&drain).serve(listener));
//! # Ok(()) }
//! ```
//!
//! # A `preStop` hook without `curl`
//!
//! Distroless images have no `curl`. The app binary can be its own `preStop` exec command:
//! [`prestop`] (or [`prestop_blocking`] from a synchronous `main`) performs `GET /drain` against
//! the local admin port and returns `Ok` when the drain reached the wait condition, so `main`
//! can exit 0, or 1 on an error. An exec hook runs inside the container with its environment,
//! so the token can come from a Secret, which an `httpGet` hook's headers cannot.
//!
//! ```no_run
//! use lameduck::admin::{prestop_blocking, PrestopOptions};
//!
//! fn main() {
//!     if std::env::args().nth(1).as_deref() == Some("prestop") {
//!         let admin = "127.0.0.1:9901".parse().unwrap();
//!         match prestop_blocking(admin, PrestopOptions::from_env()) {
//!             Ok(status) => {
//!                 eprintln!("prestop: drain reached {}", status.phase);
//!                 std::process::exit(0);
//!             }
//!             Err(e) => {
//!                 eprintln!("prestop: {e}");
//!                 std::process::exit(1);
//!             }
//!         }
//!     }
//!     // ... the service itself
//! }
//! ```
//!
//! The guide [`guide::kubernetes`](crate::guide::kubernetes) puts all of this in a Pod spec.

mod handlers;
mod prestop;
mod query;
mod router;
mod serve;

pub use handlers::ADMIN_TOKEN_ENV;
pub use prestop::{prestop, prestop_blocking, PrestopError, PrestopOptions};
pub use query::Wait;
pub use router::AdminBuilder;
pub use serve::{AdminServe, DEFAULT_ADMIN_HEADER_READ_TIMEOUT, DEFAULT_ADMIN_MAX_CONNECTIONS};

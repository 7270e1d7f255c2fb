//! [`DrainLayer`]: the tower layer, and [`Drain::layer`].
//!
//! # Invariants
//!
//! * The layer and its service hold no reference count: one `&'static` entry of its
//!   coordinator's table of leaked, deduplicated option sets, which also holds the two sites
//!   the layer's guards count at (see `server::options`). Cloning either is a copy, so the
//!   per-request clones axum makes cost nothing but the copy.
//! * The options are read only while draining; the table is locked only then (and when a layer
//!   is built).

use std::fmt;
use std::marker::PhantomData;

use std::time::Duration;

use http::{HeaderName, HeaderValue};
use tower_layer::Layer;

use crate::drain::Drain;

use super::line::{Naming, RequestLine, Unnamed};
use super::options::{register, LayerEntry, Options};
use super::refusal::{Refusal, RefuseAfterStop, ServeAfterStop};
use super::service::DrainService;

impl Drain {
    /// The tower layer that counts every request as in flight until its response body ends.
    ///
    /// See [`DrainLayer`] for what it does while draining and its options.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(feature = "admin")] {
    /// use axum::{routing::get, Router};
    ///
    /// let drain = lameduck::Drain::builder().build().unwrap();
    /// let app: Router = Router::new()
    ///     .route("/", get(|| async { "hello" }))
    ///     .layer(drain.layer());
    /// # let _: Router = app;
    /// # }
    /// ```
    pub fn layer(&self) -> DrainLayer {
        DrainLayer {
            entry: register(Options::default(), self.core()),
            mode: PhantomData,
        }
    }
}

/// Tower middleware that ties every request to the drain.
///
/// Built with [`Drain::layer`]; wraps a service in [`DrainService`]. Works with
/// `axum::Router::layer` (it adds no error type: the service's error is the inner one), with a
/// plain hyper service through `hyper_util::service::TowerToHyperService`, and with tonic.
///
/// Per request:
///
/// * **Always**: takes an in-flight guard in `call`, keeps it in the response future, and moves
///   it into the response body ([`DrainBody`](crate::DrainBody)); the request counts until the
///   server drops the body, which hyper does as soon as the body has ended or failed, or the
///   client went away. A streaming body is in flight for as long as it streams. While Serving
///   this is *all* it does: one atomic operation on the way in, one on the way out, one relaxed
///   load each time the response future is polled; no lock, no allocation, no reference count.
///   The response future and body are the inner ones plus 16 bytes.
/// * **While draining**:
///   * HTTP/1.x responses get `Connection: close`, so pooled connections move off one by one and
///     the client knows (never on HTTP/2, where the header is illegal and GOAWAY does the job;
///     never on `101 Switching Protocols`). The drain is checked when the response future is
///     polled, before the inner future: a response completed by the very poll during which
///     the drain started goes without the header, and the next one on its connection has it.
///   * The request is reported to the propagation policy as activity, and counted as arriving
///     on a *new* connection (accepted after the drain started) or a *reused* one. The
///     connection is known from [`ConnMeta`](crate::ConnMeta) in the request's extensions
///     (attached by [`serve`](crate::serve) while draining) or from axum's
///     `ConnectInfo<ConnMeta>`. A request without either is counted as **reused**: lameduck only
///     reports "new connection" — the evidence that some path still routes here — when it knows.
///   * The request is registered for the straggler list (method, path, peer, age).
///
/// Requests that started *before* the drain and are still running at the quiesce deadline are
/// listed as "undescribed guards", unless [`describe_requests`](Self::describe_requests) is on.
///
/// # What the layer can and cannot see
///
/// A request counts until the server drops its response body, right after taking its last
/// frame (or when the client goes away). The layer does not see the socket: bytes the server still holds for a client
/// that reads slowly are not counted, so under `axum::serve` or another server a drain can
/// report zero in flight while a large response is still being written. Under
/// [`serve`](crate::serve) the connection counts them instead (until the kernel has accepted
/// every byte) and names them at the quiesce deadline; see the
/// [axum guide][axum-slow-readers].
///
#[cfg_attr(
    feature = "axum",
    doc = "[axum-slow-readers]: crate::guide::axum#slow-readers"
)]
#[cfg_attr(
    not(feature = "axum"),
    doc = "[axum-slow-readers]: crate#feature-flags"
)]
///
/// # Upgraded connections
///
/// A `101 Switching Protocols` response ends the HTTP exchange: its guard is released with its
/// empty body, so an upgraded connection (a WebSocket) is no longer counted. Take a guard with
/// [`Drain::enter`] in the task that serves the socket, and end that task with
/// [`StreamStop::new`](crate::StreamStop::new).
///
/// # Options
///
/// * [`describe_requests`](Self::describe_requests): carry each request's method and path, so
///   a request that started before the drain can be named as a straggler.
/// * [`phase_header`](Self::phase_header) / [`instance_header`](Self::instance_header): name the
///   phase and the instance in a response header, so a client can tell it was served by a
///   draining process.
/// * [`refuse_after_stop`](Self::refuse_after_stop): after `stopped_accepting`, answer `503` +
///   `Retry-After` + `Connection: close` instead of serving. The layer's second type parameter
///   says which ([`ServeAfterStop`](crate::server::ServeAfterStop), the default, or
///   [`RefuseAfterStop`](crate::server::RefuseAfterStop)), so a layer that never refuses carries
///   no refusal state and no refusal check.
///
/// The layer is `Copy`: the options live in a table of its coordinator's (each distinct set of
/// options is kept for the life of the process, like the coordinator's counter), read only
/// while draining. Build layers at startup, not per request.
pub struct DrainLayer<N = Unnamed, R = ServeAfterStop> {
    /// The layer's options and the sites its guards count at (see `server::options`).
    entry: &'static LayerEntry,
    mode: PhantomData<fn() -> (N, R)>,
}

impl<N, R> Clone for DrainLayer<N, R> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<N, R> Copy for DrainLayer<N, R> {}

impl<N, R> DrainLayer<N, R> {
    fn with_options(mut self, f: impl FnOnce(&mut Options)) -> Self {
        let mut o = self.entry.options.clone();
        f(&mut o);
        self.entry = register(o, self.entry.sites[0].core());
        self
    }

    /// Carry each request's method and the first 80 bytes of its path with the request, so
    /// that a request that started *before* the drain and is still running at the quiesce
    /// deadline is named in the straggler list (`GET /export`) instead of being counted as an
    /// "undescribed guard". Off by default.
    ///
    /// The trade-off: the copy costs no allocation and no lock, but every request pays for it,
    /// and the response future and body grow by 88 bytes, which axum and hyper move several
    /// times per request (BENCHMARKS.md has the measured cost, variant `lameduck-named`).
    /// Requests that arrive *while draining* are named either way, from the request itself,
    /// with their peer and age. Turn it on when long requests or streams are expected to
    /// outlive the drain and their names matter more than the per-request cost.
    ///
    /// With it on, a request that started before the drain is named on the first poll of its
    /// response future or body after the drain started, its age is reported as the drain's age
    /// (a lower bound), its peer is not recorded, and a body that is never polled again stays
    /// unnamed. Long paths are truncated; the query string is never kept.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(feature = "admin")] {
    /// use axum::{routing::get, Router};
    ///
    /// let drain = lameduck::Drain::builder().build().unwrap();
    /// let app: Router = Router::new()
    ///     .route("/export", get(|| async { "a long export" }))
    ///     .layer(drain.layer().describe_requests());
    /// # let _: Router = app;
    /// # }
    /// ```
    pub fn describe_requests(self) -> DrainLayer<RequestLine, R> {
        DrainLayer {
            entry: self.entry,
            mode: PhantomData,
        }
    }

    /// While draining, add header `name` with the current phase (`draining`,
    /// `stopped_accepting`, …) to responses to requests that arrived while draining.
    ///
    /// # Examples
    ///
    /// ```
    /// use http::HeaderName;
    ///
    /// let drain = lameduck::Drain::builder().build().unwrap();
    /// let layer = drain
    ///     .layer()
    ///     .phase_header(HeaderName::from_static("x-lameduck-phase"));
    /// # let _ = layer;
    /// ```
    pub fn phase_header(self, name: HeaderName) -> Self {
        self.with_options(|o| o.phase_header = Some(name))
    }

    /// While draining, add header `name: value` naming this instance (e.g. the Pod name from
    /// `POD_NAME`) to responses to requests that arrived while draining.
    ///
    /// # Examples
    ///
    /// ```
    /// use http::{HeaderName, HeaderValue};
    ///
    /// let drain = lameduck::Drain::builder().build().unwrap();
    /// let pod = std::env::var("POD_NAME").unwrap_or_else(|_| "local".to_owned());
    /// let layer = drain.layer().instance_header(
    ///     HeaderName::from_static("x-lameduck-instance"),
    ///     HeaderValue::try_from(pod).unwrap(),
    /// );
    /// # let _ = layer;
    /// ```
    pub fn instance_header(self, name: HeaderName, value: HeaderValue) -> Self {
        self.with_options(|o| o.instance_header = Some((name, value)))
    }

    /// Refusal mode (off by default): from `stopped_accepting` on, answer new requests with
    /// `503 Service Unavailable`, `Retry-After: <retry_after in whole seconds, at least 1>` and
    /// (HTTP/1.x) `Connection: close` instead of calling the inner service.
    ///
    /// Only for clients known to retry: a refused request is lost for clients that do not.
    /// Pair it with [`Serve::keep_listening_after_stop`](crate::server::Serve::keep_listening_after_stop)
    /// so late clients get an answer instead of a refused connection.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[cfg(feature = "admin")] {
    /// use std::time::Duration;
    /// use axum::{routing::get, Router};
    ///
    /// # async fn run(drain: lameduck::Drain) -> std::io::Result<()> {
    /// let app = Router::new()
    ///     .route("/", get(|| async { "hello" }))
    ///     .layer(drain.layer().refuse_after_stop(Duration::from_secs(1)));
    /// let listener = tokio::net::TcpListener::bind("0.0.0.0:8080").await?;
    /// lameduck::serve(listener, app, &drain)
    ///     .keep_listening_after_stop()
    ///     .await;
    /// # Ok(()) }
    /// # }
    /// ```
    pub fn refuse_after_stop(self, retry_after: Duration) -> DrainLayer<N, RefuseAfterStop> {
        let secs = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
        let layer =
            self.with_options(|o| o.refuse_retry_after = Some(HeaderValue::from(secs.max(1))));
        DrainLayer {
            entry: layer.entry,
            mode: PhantomData,
        }
    }
}

impl<S, N: Naming, R: Refusal> Layer<S> for DrainLayer<N, R> {
    type Service = DrainService<S, N, R>;

    fn layer(&self, inner: S) -> Self::Service {
        DrainService::new(inner, &self.entry.sites)
    }
}

impl<N, R> fmt::Debug for DrainLayer<N, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("DrainLayer");
        let o = &self.entry.options;
        d.field("phase_header", &o.phase_header)
            .field("instance_header", &o.instance_header)
            .field("refuse_retry_after", &o.refuse_retry_after);
        d.field("naming", &std::any::type_name::<N>())
            .field("refusal", &std::any::type_name::<R>())
            .finish_non_exhaustive()
    }
}

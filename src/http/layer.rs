//! [`DrainLayer`]: the tower layer, and [`Drain::layer`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, HeaderValue};
use tower_layer::Layer;

use crate::guard::Core;
use crate::Drain;

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
            drain: self.clone(),
            extras: None,
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
///   body ends, errors or is dropped. A streaming body is in flight for as long as it streams.
///   While Serving this is *all* it does: one atomic operation on the way in, one on the way out,
///   a bounded copy of the method and path (see below), no lock, no allocation.
/// * **While draining**:
///   * HTTP/1.x responses get `Connection: close`, so pooled connections move off one by one and
///     the client knows (never on HTTP/2, where the header is illegal and GOAWAY does the job;
///     never on `101 Switching Protocols`).
///   * The request is reported to the propagation policy as activity, and counted as arriving
///     on a *new* connection (accepted after the drain started) or a *reused* one. The
///     connection is known from [`ConnMeta`](crate::ConnMeta) in the request's extensions
///     (attached by [`serve`](crate::serve)) or from axum's `ConnectInfo<ConnMeta>`. A request
///     without either is counted as **reused**: lameduck only reports "new connection" — the
///     evidence that some path still routes here — when it knows.
///   * The request is registered for the straggler list (method, path, peer, age). Requests that
///     started *before* the drain are described on the first poll of their future or body after
///     the drain started, from an inline copy of the method and the first bytes of the path made
///     in `call`; their age is reported as the drain's age (a lower bound), their peer is not
///     recorded, and a body that is never polled again stays unnamed.
///
/// # What the layer can and cannot see
///
/// A request counts until its response body's last frame is handed to the server (or the body
/// is dropped). The layer does not see the socket: bytes the server still holds for a client
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
/// [`Drain::stream_stop`].
///
/// # Options
///
/// * [`phase_header`](Self::phase_header) / [`instance_header`](Self::instance_header): name the
///   phase and the instance in a response header, so a client can tell it was served by a
///   draining process.
/// * [`refuse_after_stop`](Self::refuse_after_stop): after `stopped_accepting`, answer `503` +
///   `Retry-After` + `Connection: close` instead of serving.
///
/// Options live behind one shared pointer; each request that arrives while draining clones it
/// into its future. Without options nothing is cloned.
#[derive(Clone)]
pub struct DrainLayer {
    drain: Drain,
    extras: Option<Arc<Extras>>,
}

/// What the options add; read only while draining.
#[derive(Clone)]
pub(crate) struct Extras {
    pub(crate) drain: Drain,
    pub(crate) phase_header: Option<HeaderName>,
    pub(crate) instance_header: Option<(HeaderName, HeaderValue)>,
    /// `Retry-After` value, when refusal mode is on.
    pub(crate) refuse_retry_after: Option<HeaderValue>,
}

impl DrainLayer {
    fn extras(&mut self) -> &mut Extras {
        let drain = &self.drain;
        Arc::make_mut(self.extras.get_or_insert_with(|| {
            Arc::new(Extras {
                drain: drain.clone(),
                phase_header: None,
                instance_header: None,
                refuse_retry_after: None,
            })
        }))
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
    pub fn phase_header(mut self, name: HeaderName) -> Self {
        self.extras().phase_header = Some(name);
        self
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
    pub fn instance_header(mut self, name: HeaderName, value: HeaderValue) -> Self {
        self.extras().instance_header = Some((name, value));
        self
    }

    /// Refusal mode (off by default): from `stopped_accepting` on, answer new requests with
    /// `503 Service Unavailable`, `Retry-After: <retry_after in whole seconds, at least 1>` and
    /// (HTTP/1.x) `Connection: close` instead of calling the inner service.
    ///
    /// Only for clients known to retry: a refused request is lost for clients that do not.
    /// Pair it with [`Serve::keep_listening_after_stop`](crate::http::Serve::keep_listening_after_stop)
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
    ///     .await
    /// # }
    /// # }
    /// ```
    pub fn refuse_after_stop(mut self, retry_after: Duration) -> Self {
        let secs = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
        self.extras().refuse_retry_after = Some(HeaderValue::from(secs.max(1)));
        self
    }
}

impl<S> Layer<S> for DrainLayer {
    type Service = DrainService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        DrainService::new(inner, self.core(), self.extras.clone())
    }
}

impl DrainLayer {
    fn core(&self) -> &'static Core {
        self.drain.inner.core
    }
}

impl fmt::Debug for DrainLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("DrainLayer");
        if let Some(e) = &self.extras {
            d.field("phase_header", &e.phase_header)
                .field("instance_header", &e.instance_header)
                .field("refuse_retry_after", &e.refuse_retry_after);
        }
        d.finish_non_exhaustive()
    }
}

impl fmt::Debug for Extras {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Extras")
            .field("phase_header", &self.phase_header)
            .field("instance_header", &self.instance_header)
            .field("refuse_retry_after", &self.refuse_retry_after)
            .finish_non_exhaustive()
    }
}

//! One call to serve an axum [`Router`] under the drain: [`serve`], public as
//! `lameduck::axum_serve` (a public module named `axum` would shadow the `axum` crate under
//! `use lameduck::*;`).
//!
//! `axum::serve(listener, app)` alone stops at the wrong moment (whatever future it is given),
//! waits for every connection forever, and attaches no [`ConnMeta`], so the drain cannot tell
//! requests on new connections from requests on reused ones. [`serve`] is `axum::serve` with
//! those three pieces in place; the [axum guide](crate::guide::axum) explains each of them and
//! what [`lameduck::serve`](crate::serve) does beyond it.
//!
//! # Invariants
//!
//! * One [`ConnMeta`] per accepted connection, made by its `Connected` implementation (the same
//!   path as `into_make_service_with_connect_info::<ConnMeta>()`), and counted in the arrival
//!   rate of the coordinator given to [`serve`] — which that path, unable to name one, cannot.
//! * Every request carries `ConnectInfo<ConnMeta>` and `ConnectInfo<SocketAddr>`.
//! * The future resolves at the latest at the quiesce deadline.

use std::convert::Infallible;
use std::fmt;
use std::future::{ready, Future, IntoFuture, Ready};
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::extract::connect_info::ConnectInfo;
use axum::extract::Request;
use axum::response::Response;
use axum::serve::IncomingStream;
use axum::Router;
use tokio::net::TcpListener;
use tower_service::Service;

use crate::drain::Drain;
use crate::hot::guard::Core;
use crate::server::note_accepted;
use crate::server::ConnMeta;

/// Serves `router` on `listener` with `axum::serve`, wired to `drain`: the one-call integration
/// for axum apps.
///
/// * Marks startup complete ([`Readiness::mark_serving`](crate::Readiness::mark_serving)) when
///   it starts.
/// * Keeps accepting while Draining; stops accepting at `stopped_accepting`
///   ([`Moments::stopped_accepting`](crate::Moments::stopped_accepting)), when axum closes its listener and idle connections and sends
///   HTTP/2 connections a GOAWAY.
/// * Attaches a [`ConnMeta`] per connection, so the [`DrainLayer`](crate::DrainLayer) counts
///   requests on new versus reused connections and new connections feed the propagation
///   policy. Handlers read it with `ConnectInfo<ConnMeta>`; `ConnectInfo<SocketAddr>`
///   extractors keep working too (see the cost below).
/// * Resolves to `()`, as [`lameduck::serve`](crate::serve) does, when every connection has
///   finished, or at the quiesce deadline
///   ([`Moments::deadline_exceeded`](crate::Moments::deadline_exceeded)) at the latest, so a
///   stuck connection cannot hold the process past its budget: whatever is still running then
///   is named in the report's stragglers.
///
/// It does not count requests itself: add [`Drain::layer`] to the router, as with
/// [`lameduck::serve`](crate::serve).
///
/// # Cost
///
/// Per request, on top of `axum::serve` with `into_make_service_with_connect_info::<ConnMeta>()`:
/// one atomic increment (the request's [`ConnMeta::request_index`]) and the
/// `ConnectInfo<SocketAddr>` extension, which is one allocation — `tests/alloc.rs` counts
/// 24 allocations per request against 23 for that wiring (axum 0.8.9, a small route through
/// [`Drain::layer`], client included). Per connection: the [`ConnMeta`], one allocation.
///
/// # Compared with `lameduck::serve`
///
/// axum's own loop does not let lameduck close connections: HTTP/2 connections get their
/// GOAWAY at `stopped_accepting` rather than at the trigger,
/// [`Counts::connections`](crate::Counts::connections) stays 0, and connections still busy at the deadline are not force-closed — the future resolves and
/// they end with the process, which exits once the report is written. Use
/// [`lameduck::serve`](crate::serve) (it takes the same router; add
/// [`connect_info`](crate::server::Serve::connect_info) for `ConnectInfo` extractors) when that
/// matters. The [axum guide](crate::guide::axum#which-serve) puts the two side by side.
///
/// # Examples
///
/// ```
/// use std::net::SocketAddr;
///
/// use axum::{extract::ConnectInfo, routing::get, Router};
/// use lameduck::{ConnMeta, Drain, Trigger};
/// # use lameduck::{Propagation, Signals};
/// # use std::time::Duration;
///
/// async fn peer(ConnectInfo(addr): ConnectInfo<SocketAddr>) -> String {
///     addr.to_string()
/// }
///
/// async fn conn(ConnectInfo(conn): ConnectInfo<ConnMeta>) -> String {
///     conn.id().to_string()
/// }
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let drain = Drain::builder()
///     # .propagation(Propagation::fixed(Duration::from_secs(1)))
///     # .signals(Signals::none()).report_to_stderr(false).termination_log(None)
///     .build()?;
/// let app = Router::new()
///     .route("/peer", get(peer))
///     .route("/conn", get(conn))
///     .layer(drain.layer());
///
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
/// let server = tokio::spawn(lameduck::axum_serve(listener, app, &drain));
///
/// # drain.start(Trigger::Api);
/// let report = drain.run().await; // signals → drain → closers → report
/// server.await?; // ended at stopped_accepting, or at the deadline at the latest
/// # assert_eq!(report.exit_code, 0);
/// # Ok(()) }
/// ```
pub fn serve(listener: TcpListener, router: Router, drain: &Drain) -> AxumServe {
    let drain = drain.clone();
    // Turns every route into its final form once, as `into_make_service*` does; a router
    // called as it is would redo that per request (three allocations more).
    let router = router.with_state(());
    let core = drain.core();
    let server = axum::serve(listener, WithConnMeta { router, core })
        .with_graceful_shutdown(drain.moments().stopped_accepting().cancelled_owned())
        .into_future();
    let deadline = drain.moments().deadline_exceeded();
    AxumServe {
        inner: Box::pin(async move {
            drain.readiness().mark_serving();
            // From now on every accepted connection counts in the arrival rate, as under
            // `lameduck::serve`: an idle server has a rate of zero, not no data.
            drain.core().observed().observe_arrivals();
            tokio::select! {
                result = server => {
                    // axum 0.8 retries accept errors itself and has no other error to return;
                    // should a later one, it is said, not returned: both serve functions
                    // resolve to `()`.
                    if let Err(e) = result {
                        tracing::warn!(error = %e, "lameduck: axum::serve ended with an error");
                    }
                }
                // What is still running is a straggler: the report names it.
                () = deadline.cancelled_owned() => {}
            }
        }),
    }
}

/// The future returned by [`serve`]: resolves when every connection has finished after
/// `stopped_accepting`, or at the quiesce deadline.
///
/// `Send + 'static`: `.await` it or hand it to `tokio::spawn`.
#[must_use = "futures do nothing unless polled"]
pub struct AxumServe {
    inner: Pin<Box<dyn Future<Output = ()> + Send>>,
}

impl Future for AxumServe {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl fmt::Debug for AxumServe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AxumServe").finish_non_exhaustive()
    }
}

/// axum's per-connection factory: one [`ConnMeta`] per accepted connection, counted in the
/// arrival rate of the coordinator `serve` was given (axum's `Connected` hook cannot name one).
#[derive(Clone)]
struct WithConnMeta {
    router: Router,
    core: &'static Core,
}

impl Service<IncomingStream<'_, TcpListener>> for WithConnMeta {
    type Response = AxumConnService;
    type Error = Infallible;
    type Future = Ready<Result<AxumConnService, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, stream: IncomingStream<'_, TcpListener>) -> Self::Future {
        let peer = *stream.remote_addr();
        let path = note_accepted(self.core, Some(peer));
        let meta = ConnMeta::counted(Some(peer), None, self.core, path);
        ready(Ok(AxumConnService {
            router: self.router.clone(),
            meta,
            peer,
        }))
    }
}

/// The router for one connection: attaches both `ConnectInfo`s to each request.
#[derive(Clone)]
struct AxumConnService {
    router: Router,
    meta: ConnMeta,
    peer: SocketAddr,
}

impl Service<Request> for AxumConnService {
    type Response = Response;
    type Error = Infallible;
    type Future = <Router as Service<Request>>::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        <Router as Service<Request>>::poll_ready(&mut self.router, cx)
    }

    fn call(&mut self, mut req: Request) -> Self::Future {
        // `for_request` counts the request in the propagation evidence too (see
        // `lameduck::serve`'s connection).
        let extensions = req.extensions_mut();
        extensions.insert(ConnectInfo(self.meta.for_request()));
        // The bridge for existing `ConnectInfo<SocketAddr>` extractors.
        extensions.insert(ConnectInfo(self.peer));
        self.router.call(req)
    }
}

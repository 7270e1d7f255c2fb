//! The variants the benchmarks compare: one hello-world axum `Router`, bare or with one
//! in-flight-counting middleware.
//!
//! Included with `#[path]` by `benches/layer.rs`, `examples/bench_requests.rs` (callgrind) and
//! `examples/bench_server.rs` (load), so every figure in BENCHMARKS.md measures the same code.
//!
//! Every counting middleware except `from_fn` is applied the same way, with `Router::layer`,
//! and the ones built here ([`CountLayer`]) keep their guard in the response future and move it
//! into the response body, exactly as lameduck's layer does: only the guard differs.

// Each including target uses a different subset.
#![allow(dead_code)]

use std::convert::Infallible;
use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll, Waker};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::{from_fn_with_state, Next};
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use lameduck::{Drain, DrainService, Propagation, Signals};
use pin_project_lite::pin_project;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::task::task_tracker::TaskTrackerToken;
use tokio_util::task::TaskTracker;
use tower_layer::Layer;
use tower_service::Service;

/// One way of serving the hello-world router.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Variant {
    /// The bare router.
    Plain,
    /// `Router::layer(drain.layer())`.
    Lameduck,
    /// `drain.layer()` wrapped around the whole router (`Layer::layer(&drain.layer(), router)`).
    LameduckOuter,
    /// [`Variant::Atomic`]'s layer wrapped around the whole router: the floor for
    /// [`Variant::LameduckOuter`].
    AtomicOuter,
    /// Reference layer: the guard is a `&'static AtomicUsize`, one `fetch_add` in `call`, one
    /// `fetch_sub` when the body is dropped. The floor for "a guard in the body".
    Atomic,
    /// `axum::middleware::from_fn_with_state`: `Arc<AtomicUsize>` increment before
    /// `next.run`, decrement (by a drop guard) when the response head is ready.
    FromFn,
    /// Reference layer with a `tokio_util::task::TaskTracker::token()` as the guard.
    TaskTracker,
    /// Reference layer with a `tokio::sync::Semaphore` permit (`try_acquire_owned`).
    Semaphore,
    /// Reference layer with a `tokio_graceful::Shutdown::guard()`.
    Graceful,
    /// tower-http's `InFlightRequestsLayer`.
    InFlight,
}

impl Variant {
    pub(crate) const ALL: [Variant; 10] = [
        Variant::Plain,
        Variant::Lameduck,
        Variant::LameduckOuter,
        Variant::AtomicOuter,
        Variant::Atomic,
        Variant::FromFn,
        Variant::TaskTracker,
        Variant::Semaphore,
        Variant::Graceful,
        Variant::InFlight,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Variant::Plain => "plain",
            Variant::Lameduck => "lameduck",
            Variant::LameduckOuter => "lameduck-outer",
            Variant::AtomicOuter => "atomic-outer",
            Variant::Atomic => "atomic",
            Variant::FromFn => "from_fn",
            Variant::TaskTracker => "tasktracker",
            Variant::Semaphore => "semaphore",
            Variant::Graceful => "graceful",
            Variant::InFlight => "inflight",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<Variant> {
        Variant::ALL.into_iter().find(|v| v.name() == s)
    }

    pub(crate) fn names() -> String {
        Variant::ALL.map(Variant::name).join(", ")
    }
}

/// The coordinator used by the lameduck variants: never triggered, no signals, no output.
pub(crate) fn drain() -> Drain {
    let drain = Drain::builder()
        .grace_period(Duration::from_secs(30))
        .propagation(Propagation::fixed(Duration::from_secs(1)))
        .signals(Signals::none())
        .report_to_stderr(false)
        .termination_log(None)
        .build()
        .expect("valid drain settings");
    drain.mark_started();
    drain
}

/// The bare router: one route, a static body.
pub(crate) fn hello() -> Router {
    Router::new().route("/", get(|| async { "hello" }))
}

/// The service for one variant: a `Router`, or a layer wrapped around one.
#[derive(Clone)]
pub(crate) enum App {
    Router(Router),
    Outer(DrainService<Router>),
    AtomicOuter(Count<StaticAtomic, Router>),
}

/// Builds the service for `variant`. Must run inside a Tokio runtime context: the
/// `tokio-graceful` coordinator spawns its signal task when built.
pub(crate) fn app(variant: Variant, drain: &Drain) -> App {
    let router = hello();
    App::Router(match variant {
        Variant::Plain => router,
        Variant::Lameduck => router.layer(drain.layer()),
        Variant::LameduckOuter => return App::Outer(drain.layer().layer(router)),
        Variant::AtomicOuter => {
            return App::AtomicOuter(CountLayer::new(StaticAtomic::leak()).layer(router))
        }
        Variant::Atomic => router.layer(CountLayer::new(StaticAtomic::leak())),
        Variant::FromFn => router.layer(from_fn_with_state(
            Arc::new(AtomicUsize::new(0)),
            count_around_next,
        )),
        Variant::TaskTracker => router.layer(CountLayer::new(TaskTracker::new())),
        Variant::Semaphore => router.layer(CountLayer::new(Arc::new(Semaphore::new(
            Semaphore::MAX_PERMITS,
        )))),
        Variant::Graceful => router.layer(CountLayer::new(Arc::new(
            tokio_graceful::Shutdown::new(std::future::pending::<()>()),
        ))),
        Variant::InFlight => router.layer(tower_http::metrics::InFlightRequestsLayer::pair().0),
    })
}

impl App {
    /// Runs one request through the service in-process and consumes the response body;
    /// returns the body's length.
    pub(crate) fn one_request(&self) -> usize {
        match self {
            App::Router(r) => one_request(r),
            App::Outer(s) => one_request(s),
            App::AtomicOuter(s) => one_request(s),
        }
    }
}

/// `from_fn`'s counting: increment, run the rest, decrement when the response head is ready
/// (a drop guard, so a cancelled request is not leaked). The body is not covered: holding the
/// count until the body ends would mean wrapping `Body` into a new boxed `Body` here.
async fn count_around_next(
    State(count): State<Arc<AtomicUsize>>,
    req: Request,
    next: Next,
) -> Response {
    struct Dec<'a>(&'a AtomicUsize);
    impl Drop for Dec<'_> {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::Release);
        }
    }
    count.fetch_add(1, Ordering::Relaxed);
    let _dec = Dec(&count);
    next.run(req).await
}

/// One request, driven by hand: clone the service (as hyper-util's tower adapter does per
/// request), `poll_ready`, `call`, poll the future, poll the body to its end, drop it.
///
/// Every variant's future and body complete on their first poll, so a no-op waker suffices
/// and no runtime scheduling is measured.
pub(crate) fn one_request<S, B>(svc: &S) -> usize
where
    S: Service<Request<Body>, Response = http::Response<B>, Error = Infallible> + Clone,
    B: HttpBody<Data = Bytes>,
    B::Error: std::fmt::Debug,
{
    let mut cx = Context::from_waker(Waker::noop());
    let mut svc = svc.clone();
    let Poll::Ready(Ok(())) = svc.poll_ready(&mut cx) else {
        panic!("the router is always ready");
    };
    let mut req = Request::new(Body::empty());
    *req.uri_mut() = http::Uri::from_static("/");
    let mut fut = pin!(svc.call(req));
    let res = poll_bounded(fut.as_mut(), &mut cx);
    let mut body = pin!(res.into_body());
    let mut len = 0;
    for _ in 0..16 {
        match body.as_mut().poll_frame(&mut cx) {
            Poll::Ready(None) => return len,
            Poll::Ready(Some(frame)) => {
                if let Ok(data) = frame.expect("hello body never fails").into_data() {
                    len += std::hint::black_box(data).len();
                }
            }
            Poll::Pending => {}
        }
    }
    panic!("the body did not end within 16 polls");
}

fn poll_bounded<F, T>(mut fut: Pin<&mut F>, cx: &mut Context<'_>) -> T
where
    F: Future<Output = Result<T, Infallible>>,
{
    for _ in 0..16 {
        if let Poll::Ready(Ok(v)) = fut.as_mut().poll(cx) {
            return v;
        }
    }
    panic!("the response future did not complete within 16 polls");
}

// ---- serving a variant over TCP ----

/// The server names `serve` accepts besides the [`Variant`] names.
pub(crate) const SERVE_ONLY: [&str; 2] = ["plain-lserve", "lameduck-lserve"];

/// Serves one variant on `listener` until the process ends:
///
/// * `plain-lserve`, `lameduck-lserve`: the bare router, or `Router::layer(drain.layer())`,
///   under `lameduck::serve` (the accept loop alone, and with the layer);
/// * `lameduck-outer`, `atomic-outer`: the layer around the whole router, under
///   `lameduck::serve` (`axum::serve` takes only services whose body is axum's `Body`);
/// * every other [`Variant`]: that router under `axum::serve`.
pub(crate) async fn serve(
    name: String,
    listener: tokio::net::TcpListener,
    drain: Drain,
) -> Result<(), String> {
    let drain = &drain;
    let variant = match name.as_str() {
        "plain-lserve" => Variant::Plain,
        "lameduck-lserve" => Variant::Lameduck,
        other => Variant::parse(other).ok_or_else(|| {
            format!(
                "unknown variant {other:?}; try {}, {}",
                SERVE_ONLY.join(", "),
                Variant::names()
            )
        })?,
    };
    match app(variant, drain) {
        App::Router(router) if SERVE_ONLY.contains(&name.as_str()) => {
            lameduck::serve(listener, router, drain).await
        }
        App::Router(router) => axum::serve(listener, router).await,
        App::Outer(svc) => lameduck::serve(listener, svc, drain).await,
        App::AtomicOuter(svc) => lameduck::serve(listener, svc, drain).await,
    }
    .map_err(|e| e.to_string())
}

// ---- the reference layer: a guard taken in `call`, moved into the body ----

/// Something that hands out a guard per request.
pub(crate) trait Acquire: Clone + Send + Sync + 'static {
    type Guard: Send + 'static;
    fn acquire(&self) -> Self::Guard;
}

/// The floor: a leaked counter, so the guard is a plain reference (no reference count).
#[derive(Clone, Copy)]
pub(crate) struct StaticAtomic(&'static AtomicUsize);

impl StaticAtomic {
    pub(crate) fn leak() -> Self {
        Self(Box::leak(Box::new(AtomicUsize::new(0))))
    }
}

pub(crate) struct AtomicGuard(&'static AtomicUsize);

impl Drop for AtomicGuard {
    #[inline]
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Release);
    }
}

impl Acquire for StaticAtomic {
    type Guard = AtomicGuard;
    #[inline]
    fn acquire(&self) -> AtomicGuard {
        self.0.fetch_add(1, Ordering::Relaxed);
        AtomicGuard(self.0)
    }
}

impl Acquire for TaskTracker {
    type Guard = TaskTrackerToken;
    #[inline]
    fn acquire(&self) -> TaskTrackerToken {
        self.token()
    }
}

impl Acquire for Arc<Semaphore> {
    type Guard = OwnedSemaphorePermit;
    #[inline]
    fn acquire(&self) -> OwnedSemaphorePermit {
        // An owned permit, because the guard must outlive `call`; never exhausted.
        self.clone()
            .try_acquire_owned()
            .expect("MAX_PERMITS is never exhausted")
    }
}

impl Acquire for Arc<tokio_graceful::Shutdown> {
    type Guard = tokio_graceful::ShutdownGuard;
    #[inline]
    fn acquire(&self) -> tokio_graceful::ShutdownGuard {
        self.guard()
    }
}

/// Tower layer: takes `A::acquire()` in `call`, keeps it in the future, moves it into the body.
#[derive(Clone)]
pub(crate) struct CountLayer<A> {
    source: A,
}

impl<A> CountLayer<A> {
    pub(crate) fn new(source: A) -> Self {
        Self { source }
    }
}

impl<A: Clone, S> Layer<S> for CountLayer<A> {
    type Service = Count<A, S>;
    fn layer(&self, inner: S) -> Count<A, S> {
        Count {
            inner,
            source: self.source.clone(),
        }
    }
}

#[derive(Clone)]
pub(crate) struct Count<A, S> {
    inner: S,
    source: A,
}

impl<A, S, ReqBody, ResBody> Service<http::Request<ReqBody>> for Count<A, S>
where
    A: Acquire,
    S: Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
{
    type Response = http::Response<CountBody<ResBody, A::Guard>>;
    type Error = S::Error;
    type Future = CountFuture<S::Future, A::Guard>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    #[inline]
    fn call(&mut self, req: http::Request<ReqBody>) -> Self::Future {
        let guard = self.source.acquire();
        CountFuture {
            fut: self.inner.call(req),
            guard: Some(guard),
        }
    }
}

pin_project! {
    pub(crate) struct CountFuture<F, G> {
        #[pin]
        fut: F,
        guard: Option<G>,
    }
}

impl<F, G, B, E> Future for CountFuture<F, G>
where
    F: Future<Output = Result<http::Response<B>, E>>,
{
    type Output = Result<http::Response<CountBody<B, G>>, E>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let res = ready!(this.fut.poll(cx))?;
        let guard = this.guard.take();
        Poll::Ready(Ok(res.map(|body| CountBody { body, guard })))
    }
}

pin_project! {
    pub(crate) struct CountBody<B, G> {
        #[pin]
        body: B,
        guard: Option<G>,
    }
}

impl<B: HttpBody, G> HttpBody for CountBody<B, G> {
    type Data = B::Data;
    type Error = B::Error;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.project();
        let frame = ready!(this.body.poll_frame(cx));
        if !matches!(frame, Some(Ok(_))) {
            // Released at the end of the body, as lameduck's layer does.
            *this.guard = None;
        }
        Poll::Ready(frame)
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

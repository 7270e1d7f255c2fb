//! The variants the benchmarks compare: one hello-world axum `Router`, bare or with one
//! in-flight-counting middleware, applied with `Router::layer` or wrapped around the whole
//! router (`-outer`).
//!
//! Included with `#[path]` by `benches/layer.rs`, `examples/bench_requests.rs` (callgrind) and
//! `examples/bench_server.rs` (load), so every figure in BENCHMARKS.md measures the same code.
//!
//! The reference layers built here take their guard in `call` and either release it when the
//! response head is ready ([`HeadLayer`]) or move it into the response body ([`CountLayer`]),
//! as lameduck's layer does: only the guard and where it lives differ.

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
use lameduck::server::RequestLine;
use lameduck::{Drain, DrainService, Propagation, Signals};
use pin_project_lite::pin_project;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio_util::task::task_tracker::TaskTrackerToken;
use tokio_util::task::TaskTracker;
use tower_http::metrics::in_flight_requests::InFlightRequests;
use tower_http::metrics::InFlightRequestsLayer;
use tower_layer::Layer;
use tower_service::Service;

/// One way of serving the hello-world router.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Variant {
    /// The bare router.
    Plain,
    /// A layer that only forwards (its future is the inner one): what `Router::layer` costs
    /// any layer. The baseline the counting layers are compared with.
    Noop,
    /// The floor: a leaked `AtomicUsize` (draining bit packed in, as lameduck's) and a `Notify`
    /// woken on the last leave while draining; `fetch_add` in `call`, `fetch_sub` when the
    /// response head is ready (the guard lives in the future only).
    Floor,
    /// [`Variant::Floor`]'s guard moved into the response body, released when the body ends:
    /// what counting until the body ends costs with the cheapest guard.
    FloorBody,
    /// [`Variant::FloorBody`] with the counter behind an `Arc` instead of leaked: the guard
    /// and the service each hold a reference count (what lameduck's layer would cost with an
    /// `Arc<Core>` in place of its leaked `&'static Core`).
    FloorBodyArc,
    /// `Router::layer(drain.layer())`.
    Lameduck,
    /// `Router::layer(drain.layer().describe_requests())`: with the request line carried.
    LameduckNamed,
    /// `axum::middleware::from_fn_with_state`: `Arc<AtomicUsize>` increment before
    /// `next.run`, decrement (by a drop guard) when the response head is ready.
    FromFn,
    /// Reference layer with a `tokio_util::task::TaskTracker::token()` in the body.
    TaskTracker,
    /// Reference layer with a `tokio::sync::Semaphore` permit (`try_acquire_owned`) in the body.
    Semaphore,
    /// Reference layer with a `tokio_graceful::Shutdown::guard()` in the body.
    Graceful,
    /// tower-http's `InFlightRequestsLayer` (its guard lives in the body too).
    InFlight,
    /// The same middleware wrapped around the whole router.
    NoopOuter,
    FloorOuter,
    FloorBodyOuter,
    FloorBodyArcOuter,
    LameduckOuter,
    LameduckNamedOuter,
    SemaphoreOuter,
    InFlightOuter,
}

impl Variant {
    pub(crate) const ALL: [Variant; 20] = [
        Variant::Plain,
        Variant::Noop,
        Variant::Floor,
        Variant::FloorBody,
        Variant::FloorBodyArc,
        Variant::Lameduck,
        Variant::LameduckNamed,
        Variant::FromFn,
        Variant::TaskTracker,
        Variant::Semaphore,
        Variant::Graceful,
        Variant::InFlight,
        Variant::NoopOuter,
        Variant::FloorOuter,
        Variant::FloorBodyOuter,
        Variant::FloorBodyArcOuter,
        Variant::LameduckOuter,
        Variant::LameduckNamedOuter,
        Variant::SemaphoreOuter,
        Variant::InFlightOuter,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Variant::Plain => "plain",
            Variant::Noop => "noop",
            Variant::Floor => "floor",
            Variant::FloorBody => "floor-body",
            Variant::FloorBodyArc => "floor-body-arc",
            Variant::Lameduck => "lameduck",
            Variant::LameduckNamed => "lameduck-named",
            Variant::FromFn => "from_fn",
            Variant::TaskTracker => "tasktracker",
            Variant::Semaphore => "semaphore",
            Variant::Graceful => "graceful",
            Variant::InFlight => "inflight",
            Variant::NoopOuter => "noop-outer",
            Variant::FloorOuter => "floor-outer",
            Variant::FloorBodyOuter => "floor-body-outer",
            Variant::FloorBodyArcOuter => "floor-body-arc-outer",
            Variant::LameduckOuter => "lameduck-outer",
            Variant::LameduckNamedOuter => "lameduck-named-outer",
            Variant::SemaphoreOuter => "semaphore-outer",
            Variant::InFlightOuter => "inflight-outer",
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
    drain.readiness().mark_serving();
    drain
}

/// The bare router: one route, a static body.
pub(crate) fn hello() -> Router {
    Router::new().route("/", get(|| async { "hello" }))
}

/// The service for one variant: a `Router`, or a middleware wrapped around one.
#[derive(Clone)]
pub(crate) enum App {
    Router(Router),
    Noop(Noop<Router>),
    Floor(Head<Floor, Router>),
    FloorBody(Count<Floor, Router>),
    FloorBodyArc(Count<ArcFloor, Router>),
    Lameduck(DrainService<Router>),
    LameduckNamed(DrainService<Router, RequestLine>),
    Semaphore(Count<Arc<Semaphore>, Router>),
    InFlight(InFlightRequests<Router>),
}

/// Runs `$body` with `$s` bound to the service inside `$app`, whatever its type.
macro_rules! with_app {
    ($app:expr, |$s:ident| $body:expr) => {
        match $app {
            App::Router($s) => $body,
            App::Noop($s) => $body,
            App::Floor($s) => $body,
            App::FloorBody($s) => $body,
            App::FloorBodyArc($s) => $body,
            App::Lameduck($s) => $body,
            App::LameduckNamed($s) => $body,
            App::Semaphore($s) => $body,
            App::InFlight($s) => $body,
        }
    };
}
// Used by name only from `bench_requests`; the other including targets use it in this file.
#[allow(unused_imports)]
pub(crate) use with_app;

/// Builds the service for `variant`. Must run inside a Tokio runtime context: the
/// `tokio-graceful` coordinator spawns its signal task when built.
///
/// Every router is given its state (`with_state(())`) before it serves, as `axum::serve` does
/// through `into_make_service`: until then axum builds each handler (and applies each
/// `Router::layer`) anew on every request, a cost no server pays.
pub(crate) fn app(variant: Variant, drain: &Drain) -> App {
    let router = hello().with_state(());
    let semaphore = || Arc::new(Semaphore::new(Semaphore::MAX_PERMITS));
    App::Router(match variant {
        Variant::Plain => router,
        Variant::Noop => router.layer(NoopLayer),
        Variant::Floor => router.layer(HeadLayer::new(Floor::leak())),
        Variant::FloorBody => router.layer(CountLayer::new(Floor::leak())),
        Variant::FloorBodyArc => router.layer(CountLayer::new(ArcFloor::new())),
        Variant::Lameduck => router.layer(drain.layer()),
        Variant::LameduckNamed => router.layer(drain.layer().describe_requests()),
        Variant::FromFn => router.layer(from_fn_with_state(
            Arc::new(AtomicUsize::new(0)),
            count_around_next,
        )),
        Variant::TaskTracker => router.layer(CountLayer::new(TaskTracker::new())),
        Variant::Semaphore => router.layer(CountLayer::new(semaphore())),
        Variant::Graceful => router.layer(CountLayer::new(Arc::new(
            tokio_graceful::Shutdown::new(std::future::pending::<()>()),
        ))),
        Variant::InFlight => router.layer(InFlightRequestsLayer::pair().0),
        Variant::NoopOuter => return App::Noop(NoopLayer.layer(router)),
        Variant::FloorOuter => return App::Floor(HeadLayer::new(Floor::leak()).layer(router)),
        Variant::FloorBodyOuter => {
            return App::FloorBody(CountLayer::new(Floor::leak()).layer(router))
        }
        Variant::FloorBodyArcOuter => {
            return App::FloorBodyArc(CountLayer::new(ArcFloor::new()).layer(router))
        }
        Variant::LameduckOuter => return App::Lameduck(drain.layer().layer(router)),
        Variant::LameduckNamedOuter => {
            return App::LameduckNamed(drain.layer().describe_requests().layer(router))
        }
        Variant::SemaphoreOuter => {
            return App::Semaphore(CountLayer::new(semaphore()).layer(router))
        }
        Variant::InFlightOuter => {
            return App::InFlight(InFlightRequestsLayer::pair().0.layer(router))
        }
    })
}

impl App {
    /// Runs one request through the service in-process and consumes the response body;
    /// returns the body's length.
    pub(crate) fn one_request(&self) -> usize {
        with_app!(self, |s| one_request(s))
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
///
/// Never inlined: each variant gets a function of its own, so its code is compiled and laid out
/// on its own, not as one arm of a function that holds every variant (where one variant's
/// code changed the registers and stack frame of all the others).
#[inline(never)]
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
/// * every `-outer` variant: the middleware around the whole router, under `lameduck::serve`
///   (`axum::serve` takes only services whose body is axum's `Body`);
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
            lameduck::serve(listener, router, drain).await;
            Ok(())
        }
        App::Router(router) => axum::serve(listener, router).await,
        app => {
            with_app!(app, |s| lameduck::serve(listener, s, drain).await);
            Ok(())
        }
    }
    .map_err(|e: std::io::Error| e.to_string())
}

// ---- the reference layer: a guard taken in `call`, moved into the body ----

/// Something that hands out a guard per request.
pub(crate) trait Acquire: Clone + Send + Sync + 'static {
    type Guard: Send + 'static;
    fn acquire(&self) -> Self::Guard;
}

/// The floor: a leaked counter with the draining flag packed in (bit 0) and a `Notify` for the
/// waiter, so the guard is a plain reference (no reference count) and leaving is one
/// `fetch_sub` plus one comparison, as in lameduck's counter.
#[derive(Clone, Copy)]
pub(crate) struct Floor(&'static FloorState);

pub(crate) struct FloorState {
    count: AtomicUsize,
    zero: Notify,
}

impl Floor {
    pub(crate) fn leak() -> Self {
        Self(Box::leak(Box::new(FloorState {
            count: AtomicUsize::new(0),
            zero: Notify::new(),
        })))
    }
}

pub(crate) struct FloorGuard(&'static FloorState);

impl Drop for FloorGuard {
    #[inline]
    fn drop(&mut self) {
        // Step 2, flag in bit 0: the last guard while draining wakes the waiter.
        if self.0.count.fetch_sub(2, Ordering::Release) == 3 {
            self.0.zero.notify_waiters();
        }
    }
}

impl Acquire for Floor {
    type Guard = FloorGuard;
    #[inline]
    fn acquire(&self) -> FloorGuard {
        self.0.count.fetch_add(2, Ordering::Relaxed);
        FloorGuard(self.0)
    }
}

/// [`Floor`]'s counter behind an `Arc`: the same guard, plus a reference count held by the
/// guard (and by every clone of the service).
#[derive(Clone)]
pub(crate) struct ArcFloor(Arc<FloorState>);

impl ArcFloor {
    pub(crate) fn new() -> Self {
        Self(Arc::new(FloorState {
            count: AtomicUsize::new(0),
            zero: Notify::new(),
        }))
    }
}

pub(crate) struct ArcFloorGuard(Arc<FloorState>);

impl Drop for ArcFloorGuard {
    #[inline]
    fn drop(&mut self) {
        if self.0.count.fetch_sub(2, Ordering::Release) == 3 {
            self.0.zero.notify_waiters();
        }
    }
}

impl Acquire for ArcFloor {
    type Guard = ArcFloorGuard;
    #[inline]
    fn acquire(&self) -> ArcFloorGuard {
        self.0.count.fetch_add(2, Ordering::Relaxed);
        ArcFloorGuard(self.0.clone())
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

// ---- the floor with the guard in the future only, and the no-op layer ----

/// Tower layer: takes `A::acquire()` in `call` and releases it when the response head is ready.
#[derive(Clone)]
pub(crate) struct HeadLayer<A> {
    source: A,
}

impl<A> HeadLayer<A> {
    pub(crate) fn new(source: A) -> Self {
        Self { source }
    }
}

impl<A: Clone, S> Layer<S> for HeadLayer<A> {
    type Service = Head<A, S>;
    fn layer(&self, inner: S) -> Head<A, S> {
        Head {
            inner,
            source: self.source.clone(),
        }
    }
}

#[derive(Clone)]
pub(crate) struct Head<A, S> {
    inner: S,
    source: A,
}

impl<A, S, R> Service<R> for Head<A, S>
where
    A: Acquire,
    S: Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = HeadFuture<S::Future, A::Guard>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    #[inline]
    fn call(&mut self, req: R) -> Self::Future {
        let guard = self.source.acquire();
        HeadFuture {
            fut: self.inner.call(req),
            guard: Some(guard),
        }
    }
}

pin_project! {
    pub(crate) struct HeadFuture<F, G> {
        #[pin]
        fut: F,
        guard: Option<G>,
    }
}

impl<F: Future, G> Future for HeadFuture<F, G> {
    type Output = F::Output;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let out = ready!(this.fut.poll(cx));
        *this.guard = None;
        Poll::Ready(out)
    }
}

/// A layer that forwards every call: its service's future is the inner one.
#[derive(Clone, Copy)]
pub(crate) struct NoopLayer;

impl<S> Layer<S> for NoopLayer {
    type Service = Noop<S>;
    fn layer(&self, inner: S) -> Noop<S> {
        Noop { inner }
    }
}

#[derive(Clone)]
pub(crate) struct Noop<S> {
    inner: S,
}

impl<S: Service<R>, R> Service<R> for Noop<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    #[inline]
    fn call(&mut self, req: R) -> S::Future {
        self.inner.call(req)
    }
}

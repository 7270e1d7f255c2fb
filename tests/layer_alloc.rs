//! The drain layer adds no allocation per request while Serving.
//!
//! A counting global allocator (per test binary, hence its own file) counts the allocations of
//! the current thread while N requests go through a tower service stack in-process, with and
//! without the layer: call, poll the response future, drain the body, drop it.

// A global allocator cannot be written without `unsafe impl GlobalAlloc`; this test binary is
// the only place in the package that needs it (the library forbids unsafe code).
#![allow(unsafe_code)]
#![cfg(feature = "http")]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::convert::Infallible;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, Response};
use http_body::Body;
use http_body_util::Full;
use lameduck::{Drain, Propagation, Signals};
use tower_layer::Layer;
use tower_service::Service;

struct Counting;

thread_local! {
    // Const-initialised and without a destructor, so touching it never allocates.
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: every call is forwarded unchanged to the system allocator; the counter is a
// thread-local `Cell`, which neither allocates nor locks.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocs() -> u64 {
    ALLOCS.with(Cell::get)
}

/// An endpoint that itself allocates nothing: static body, empty header map.
#[derive(Clone)]
struct Hello;

impl Service<Request<()>> for Hello {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<()>) -> Self::Future {
        std::future::ready(Ok(Response::new(Full::new(Bytes::from_static(b"hello")))))
    }
}

/// Drives one request to the end of its body, synchronously.
fn one_request<S, B>(svc: &mut S, path: &'static str)
where
    S: Service<Request<()>, Response = Response<B>, Error = Infallible>,
    B: Body,
{
    let mut cx = Context::from_waker(Waker::noop());
    assert!(svc.poll_ready(&mut cx).is_ready());
    let mut req = Request::new(());
    *req.uri_mut() = http::Uri::from_static(path);
    let mut fut = pin!(svc.call(req));
    let Poll::Ready(Ok(res)) = fut.as_mut().poll(&mut cx) else {
        panic!("the test endpoint is always ready");
    };
    let mut body = pin!(res.into_body());
    while let Poll::Ready(Some(frame)) = body.as_mut().poll_frame(&mut cx) {
        assert!(frame.is_ok());
    }
}

fn count<S, B>(svc: &mut S, n: u64) -> u64
where
    S: Service<Request<()>, Response = Response<B>, Error = Infallible>,
    B: Body,
{
    // Warm up once, so lazily initialised statics do not count.
    one_request(svc, "/warm");
    let before = allocs();
    for _ in 0..n {
        one_request(svc, "/api/v1/items/12345?with=query");
    }
    allocs() - before
}

fn drain() -> Drain {
    Drain::builder()
        .grace_period(Duration::from_secs(30))
        .propagation(Propagation::fixed(Duration::from_secs(1)))
        .signals(Signals::none())
        .report_to_stderr(false)
        .termination_log(None)
        .build()
        .unwrap()
}

#[test]
fn the_layer_adds_no_allocation_per_request_while_serving() {
    const N: u64 = 1_000;
    let drain = drain();
    drain.mark_started();

    let mut bare = Hello;
    let baseline = count(&mut bare, N);

    let mut layered = drain.layer().layer(Hello);
    let with_layer = count(&mut layered, N);
    assert_eq!(
        with_layer,
        baseline,
        "the layer allocated {} times over {N} requests",
        with_layer - baseline
    );

    // Options cost nothing while Serving either.
    let mut with_options = drain
        .layer()
        .phase_header(HeaderName::from_static("x-lameduck-phase"))
        .instance_header(
            HeaderName::from_static("x-lameduck-instance"),
            HeaderValue::from_static("pod-a"),
        )
        .refuse_after_stop(Duration::from_secs(1))
        .layer(Hello);
    assert_eq!(count(&mut with_options, N), baseline);
    assert_eq!(
        drain.in_flight(),
        0,
        "every guard was released at the end of its body"
    );

    // The counter does see the layer's work: once draining, each request is registered for
    // the straggler list, which allocates.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async { assert!(drain.start(lameduck::Trigger::Api)) });
    assert!(count(&mut layered, N) > baseline);
}

#[test]
fn cloning_the_service_allocates_nothing() {
    // axum clones route services per request; the layer's part of that clone must be free.
    let drain = drain();
    let svc = drain.layer().layer(Hello);
    let before = allocs();
    for _ in 0..1_000 {
        let c = svc.clone();
        drop(c);
    }
    assert_eq!(allocs() - before, 0);
}

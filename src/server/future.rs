//! [`ResponseFuture`]: the response future of [`DrainService`](crate::DrainService).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use http::header::{CONNECTION, RETRY_AFTER};
use http::{HeaderValue, Response, StatusCode};
use pin_project_lite::pin_project;

use crate::hot::guard::{Core, InFlightGuard};

use super::body::DrainBody;
use super::line::{Naming, Unnamed};
use super::options::{options, tag_options, TAG_HTTP1};
use super::refusal::{Refusal, ServeAfterStop};

pin_project! {
    /// The response future of [`DrainService`](crate::DrainService).
    ///
    /// Holds the request's in-flight guard until the inner future resolves, then moves it into
    /// the response body. If the inner future fails, or this future is dropped (the client went
    /// away before the headers were ready), the guard is released with it.
    ///
    /// The inner future plus 16 bytes (the guard, which also carries the request's HTTP version
    /// and the layer's options), plus the request line with
    /// [`describe_requests`](crate::DrainLayer::describe_requests). A layer that never refuses
    /// (the default, [`ServeAfterStop`]) has no refused state to carry.
    #[must_use = "futures do nothing unless polled"]
    pub struct ResponseFuture<F, N = Unnamed, R = ServeAfterStop>
    where
        R: Refusal,
    {
        #[pin]
        state: State<F, R>,
        guard: Option<InFlightGuard>,
        line: N,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, R>
    where
        R: Refusal,
    {
        Called {
            #[pin]
            fut: F,
        },
        // Refusal mode, after `stopped_accepting`: the inner service was not called. The
        // marker is uninhabited for `ServeAfterStop`, so this variant does not exist there.
        Refused {
            refused: R::Refused,
        },
    }
}

impl<F, N, R: Refusal> ResponseFuture<F, N, R> {
    #[inline(always)]
    pub(crate) fn called(fut: F, guard: InFlightGuard, line: N) -> Self {
        Self {
            state: State::Called { fut },
            guard: Some(guard),
            line,
        }
    }

    pub(crate) fn refused(guard: InFlightGuard, line: N, refused: R::Refused) -> Self {
        Self {
            state: State::Refused { refused },
            guard: Some(guard),
            line,
        }
    }
}

impl<F, N, R, B, E> Future for ResponseFuture<F, N, R>
where
    F: Future<Output = Result<Response<B>, E>>,
    N: Naming,
    R: Refusal,
{
    type Output = Result<Response<DrainBody<B, N, R>>, E>;

    // Always inlined: out of line, the response (~150 bytes) is returned through memory and
    // copied again by the caller (BENCHMARKS.md, "Where the cost went").
    #[inline(always)]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        match this.state.project() {
            StateProj::Called { fut } => {
                // One call of the inner poll and one place that builds the output, whatever
                // the phase: two calls (or two builders) would each write a response of their
                // own, which the caller then copies into one place. While draining, two cold
                // calls around the inner poll name the request and mark the response.
                let draining = match this.guard {
                    Some(g) if g.core().counter.is_draining() => {
                        this.line.describe(g);
                        Some((g.core(), g.tag()))
                    }
                    _ => None,
                };
                let mut polled = fut.poll(cx);
                if let Some((core, tag)) = draining {
                    mark_polled(&mut polled, core, tag);
                }
                let res = match ready!(polled) {
                    Ok(res) => res,
                    Err(e) => {
                        // No body will carry the guard: the request is over.
                        *this.guard = None;
                        return Poll::Ready(Err(e));
                    }
                };
                let guard = this.guard.take();
                Poll::Ready(Ok(res.map(|body| DrainBody::new(body, guard, *this.line))))
            }
            StateProj::Refused { refused } => {
                Poll::Ready(Ok(refusal(this.guard.take(), *this.line, *refused)))
            }
        }
    }
}

/// Marks a response that is ready while draining. Cold: never reached while Serving.
#[cold]
#[inline(never)]
fn mark_polled<B, E>(polled: &mut Poll<Result<Response<B>, E>>, core: &Core, tag: u32) {
    if let Poll::Ready(Ok(res)) = polled {
        mark_draining(res, core, tag);
    }
}

/// The `503` of refusal mode.
#[cold]
#[inline(never)]
fn refusal<B, N, R: Refusal>(
    guard: Option<InFlightGuard>,
    line: N,
    refused: R::Refused,
) -> Response<DrainBody<B, N, R>> {
    let tag = guard.as_ref().map_or(0, InFlightGuard::tag);
    let opts = guard
        .as_ref()
        .and_then(|g| options(g.core(), tag_options(tag)));
    let mut res = Response::new(DrainBody::empty(guard, line, refused));
    *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    let h = res.headers_mut();
    if let Some(v) = opts.and_then(|o| o.refuse_retry_after.clone()) {
        h.insert(RETRY_AFTER, v);
    }
    if tag & TAG_HTTP1 != 0 {
        h.insert(CONNECTION, HeaderValue::from_static("close"));
    }
    res
}

/// Response headers while draining.
fn mark_draining<B>(res: &mut Response<B>, core: &Core, tag: u32) {
    // A 101 carries `Connection: upgrade`; replacing it would break the upgrade.
    if tag & TAG_HTTP1 != 0 && res.status() != StatusCode::SWITCHING_PROTOCOLS {
        res.headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
    }
    let Some(o) = options(core, tag_options(tag)) else {
        return;
    };
    if let Some(name) = &o.phase_header {
        res.headers_mut().insert(
            name.clone(),
            HeaderValue::from_static(core.phase().as_str()),
        );
    }
    if let Some((name, value)) = &o.instance_header {
        res.headers_mut().insert(name.clone(), value.clone());
    }
}

impl<F, N: fmt::Debug, R: Refusal> fmt::Debug for ResponseFuture<F, N, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("request", &self.line)
            .field("guard", &self.guard)
            .finish_non_exhaustive()
    }
}

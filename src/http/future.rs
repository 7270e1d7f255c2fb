//! [`ResponseFuture`]: the response future of [`DrainService`](crate::DrainService).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use http::header::{CONNECTION, RETRY_AFTER};
use http::{HeaderValue, Response, StatusCode, Version};
use pin_project_lite::pin_project;

use crate::guard::InFlightGuard;

use super::body::DrainBody;
use super::layer::Extras;
use super::line::RequestLine;

pin_project! {
    /// The response future of [`DrainService`](crate::DrainService).
    ///
    /// Holds the request's in-flight guard until the inner future resolves, then moves it into
    /// the response body. If the inner future fails, or this future is dropped (the client went
    /// away before the headers were ready), the guard is released with it.
    #[must_use = "futures do nothing unless polled"]
    pub struct ResponseFuture<F> {
        #[pin]
        state: State<F>,
        guard: Option<InFlightGuard>,
        version: Version,
        line: RequestLine,
        // Only set for requests that arrived while draining, and only when options are set.
        extras: Option<Arc<Extras>>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Called {
            #[pin]
            fut: F,
        },
        Refused {
            retry_after: Option<HeaderValue>,
        },
    }
}

impl<F> ResponseFuture<F> {
    #[inline]
    pub(crate) fn called(
        fut: F,
        guard: InFlightGuard,
        version: Version,
        line: RequestLine,
        extras: Option<Arc<Extras>>,
    ) -> Self {
        Self {
            state: State::Called { fut },
            guard: Some(guard),
            version,
            line,
            extras,
        }
    }

    pub(crate) fn refused(
        guard: InFlightGuard,
        version: Version,
        retry_after: HeaderValue,
    ) -> Self {
        Self {
            state: State::Refused {
                retry_after: Some(retry_after),
            },
            guard: Some(guard),
            version,
            line: RequestLine::new(&http::Method::GET, ""),
            extras: None,
        }
    }
}

/// HTTP/1.x only: `Connection` is a hop-by-hop header that HTTP/2 and HTTP/3 forbid.
fn is_http1(v: Version) -> bool {
    v == Version::HTTP_11 || v == Version::HTTP_10 || v == Version::HTTP_09
}

impl<F, B, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<DrainBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        match this.state.project() {
            StateProj::Called { fut } => {
                this.line.describe_if_draining(this.guard);
                let mut res = match ready!(fut.poll(cx)) {
                    Ok(res) => res,
                    Err(e) => {
                        // No body will carry the guard: the request is over.
                        *this.guard = None;
                        return Poll::Ready(Err(e));
                    }
                };
                let draining = this
                    .guard
                    .as_ref()
                    .is_some_and(|g| g.core().counter.is_draining());
                if draining {
                    mark_draining(&mut res, *this.version, this.extras.as_deref());
                }
                let guard = this.guard.take();
                let line = *this.line;
                Poll::Ready(Ok(res.map(|body| DrainBody::new(body, guard, line))))
            }
            StateProj::Refused { retry_after } => {
                let mut res = Response::new(DrainBody::empty(this.guard.take()));
                *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                let h = res.headers_mut();
                if let Some(v) = retry_after.take() {
                    h.insert(RETRY_AFTER, v);
                }
                if is_http1(*this.version) {
                    h.insert(CONNECTION, HeaderValue::from_static("close"));
                }
                Poll::Ready(Ok(res))
            }
        }
    }
}

/// Response headers while draining. Cold: never reached while Serving.
#[cold]
#[inline(never)]
fn mark_draining<B>(res: &mut Response<B>, version: Version, extras: Option<&Extras>) {
    // A 101 carries `Connection: upgrade`; replacing it would break the upgrade.
    if is_http1(version) && res.status() != StatusCode::SWITCHING_PROTOCOLS {
        res.headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
    }
    if let Some(extras) = extras {
        if let Some(name) = &extras.phase_header {
            let phase = extras.drain.phase();
            res.headers_mut()
                .insert(name.clone(), HeaderValue::from_static(phase.as_str()));
        }
        if let Some((name, value)) = &extras.instance_header {
            res.headers_mut().insert(name.clone(), value.clone());
        }
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("request", &self.line)
            .field("guard", &self.guard)
            .finish_non_exhaustive()
    }
}

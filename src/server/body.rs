//! [`DrainBody`]: the response body that carries the request's in-flight guard.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::hot::guard::InFlightGuard;

use super::line::{Naming, Unnamed};
use super::refusal::{Refusal, ServeAfterStop};

pin_project! {
    /// A response body that keeps its request counted as in flight until the body is done.
    ///
    /// The guard is released when this body is dropped. hyper — and so `axum::serve`,
    /// [`serve`](crate::serve) and tonic — drops a response body as soon as it has ended, failed
    /// or reported [`is_end_stream`](http_body::Body::is_end_stream), and when the client
    /// disconnects mid-body or the server force-closes the connection. A streaming body
    /// (server-sent events, a download) therefore counts for as long as it streams.
    ///
    /// Released at drop rather than on the last frame, as tower-http's `InFlightRequests`
    /// does: hyper's HTTP/1 writer never polls a sized body for its end (it stops at
    /// `is_end_stream`), so a check on every frame would cost every request and never fire
    /// there. A server that keeps a finished body alive keeps its
    /// request counted until it lets go of the body.
    ///
    /// Data and error types are the inner body's. Its size is the inner body's plus 16 bytes
    /// (the guard), plus the request line with
    /// [`describe_requests`](crate::DrainLayer::describe_requests). With
    /// [`refuse_after_stop`](crate::DrainLayer::refuse_after_stop), 8 more when the inner body
    /// type has no spare bit pattern to mark a refusal's empty body (boxed bodies such as axum's
    /// `Body` have one).
    pub struct DrainBody<B, N = Unnamed, R = ServeAfterStop>
    where
        R: Refusal,
    {
        #[pin]
        kind: BodyKind<B, R>,
        guard: Option<InFlightGuard>,
        line: N,
    }
}

pin_project! {
    #[project = KindProj]
    enum BodyKind<B, R>
    where
        R: Refusal,
    {
        Inner {
            #[pin]
            body: B,
        },
        // The body of a refused request (refusal mode); `B` may have no empty value. The
        // marker is uninhabited for `ServeAfterStop`, so this variant does not exist there.
        Empty {
            refused: R::Refused,
        },
    }
}

impl<B, N, R: Refusal> DrainBody<B, N, R> {
    #[inline]
    pub(crate) fn new(body: B, guard: Option<InFlightGuard>, line: N) -> Self {
        Self {
            kind: BodyKind::Inner { body },
            guard,
            line,
        }
    }

    pub(crate) fn empty(guard: Option<InFlightGuard>, line: N, refused: R::Refused) -> Self {
        Self {
            kind: BodyKind::Empty { refused },
            guard,
            line,
        }
    }
}

impl<B: Body, N: Naming, R: Refusal> Body for DrainBody<B, N, R> {
    type Data = B::Data;
    type Error = B::Error;

    // Always inlined: out of line, each frame result (~100 bytes) is returned through memory.
    #[inline(always)]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        match this.kind.project() {
            KindProj::Inner { body } => {
                this.line.describe_if_draining(this.guard);
                body.poll_frame(cx)
            }
            KindProj::Empty { .. } => Poll::Ready(None),
        }
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        match &self.kind {
            BodyKind::Inner { body } => body.is_end_stream(),
            BodyKind::Empty { .. } => true,
        }
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            BodyKind::Inner { body } => body.size_hint(),
            BodyKind::Empty { .. } => SizeHint::with_exact(0),
        }
    }
}

impl<B, N: fmt::Debug, R: Refusal> fmt::Debug for DrainBody<B, N, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DrainBody")
            .field("request", &self.line)
            .field("in_flight", &self.guard.is_some())
            .finish_non_exhaustive()
    }
}

//! [`DrainService`]: the middleware service.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use crate::guard::{Core, InFlightGuard};
use crate::Phase;

use super::body::DrainBody;
use super::conn::ConnMeta;
use super::future::ResponseFuture;
use super::layer::Extras;
use super::line::{describe_now, RequestLine};

/// Counts each request as in flight until its response body ends; see
/// [`DrainLayer`](crate::DrainLayer) for the behaviour while draining.
///
/// Built by [`DrainLayer`](crate::DrainLayer). The service's error type is the inner service's:
/// the middleware never fails a request (refusal, when enabled, is a `503` response).
#[derive(Clone)]
pub struct DrainService<S> {
    inner: S,
    /// A plain `&'static` reference, so cloning the service (axum clones it per request) costs
    /// no reference count.
    core: &'static Core,
    extras: Option<Arc<Extras>>,
}

impl<S> DrainService<S> {
    pub(crate) fn new(inner: S, core: &'static Core, extras: Option<Arc<Extras>>) -> Self {
        Self {
            inner,
            core,
            extras,
        }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for DrainService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    type Response = Response<DrainBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    #[inline]
    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        // The guard is taken here, held by the future, moved into the body, and released when
        // the body ends, errors or is dropped (see `DrainBody`).
        let (mut guard, draining) = self.core.enter();
        let version = req.version();
        if !draining {
            // Serving: the copy is what lets a request that outlives the drain's start be named
            // later without registering every request now.
            let line = RequestLine::new(req.method(), req.uri().path());
            return ResponseFuture::called(self.inner.call(req), guard, version, line, None);
        }
        match self.while_draining(&mut guard, &req) {
            Some(retry_after) => ResponseFuture::refused(guard, version, retry_after),
            None => {
                let line = RequestLine::new(req.method(), req.uri().path());
                let extras = self.extras.clone();
                ResponseFuture::called(self.inner.call(req), guard, version, line, extras)
            }
        }
    }
}

impl<S> DrainService<S> {
    /// Accounting for a request that arrived while draining. Returns the `Retry-After` value if
    /// the request must be refused.
    #[cold]
    #[inline(never)]
    fn while_draining<B>(
        &self,
        guard: &mut InFlightGuard,
        req: &Request<B>,
    ) -> Option<http::HeaderValue> {
        let meta = conn_meta(req);
        let on_new = meta.is_some_and(|m| m.is_new_since_drain(self.core));
        if on_new {
            let m = meta.expect("on_new implies a ConnMeta");
            // Under axum::serve nobody saw the accept: count the connection on its first
            // request after the drain. Under lameduck::serve the accept loop already did.
            if m.claim_record() {
                self.core.note_connection(m.peer());
            }
        }
        self.core.note_request(on_new);
        if let Some(extras) = &self.extras {
            if let Some(retry_after) = &extras.refuse_retry_after {
                if extras.drain.phase() >= Phase::StoppedAccepting {
                    return Some(retry_after.clone());
                }
            }
        }
        describe_now(guard, req.method(), req.uri().path(), meta);
        None
    }
}

/// The connection metadata attached by `lameduck::serve` (or a custom accept loop), else the
/// one axum attaches through `ConnectInfo`.
fn conn_meta<B>(req: &Request<B>) -> Option<&ConnMeta> {
    let ext = req.extensions();
    if let Some(m) = ext.get::<ConnMeta>() {
        return Some(m);
    }
    #[cfg(feature = "axum")]
    if let Some(axum::extract::ConnectInfo(m)) = ext.get::<axum::extract::ConnectInfo<ConnMeta>>() {
        return Some(m);
    }
    None
}

impl<S: fmt::Debug> fmt::Debug for DrainService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DrainService")
            .field("inner", &self.inner)
            .field("extras", &self.extras)
            .finish_non_exhaustive()
    }
}

//! [`DrainService`]: the middleware service.

use std::fmt;
use std::marker::PhantomData;
use std::task::{Context, Poll};

use http::{Request, Response, Version};
use tower_service::Service;

use crate::hot::guard::{Core, InFlightGuard, Site};
use crate::vocab::phase::Phase;

use super::body::DrainBody;
use super::conn_meta::ConnMeta;
use super::future::ResponseFuture;
use super::line::{request_info, Naming, Unnamed};
use super::options::{options, tag_options};
use super::refusal::{Refusal, ServeAfterStop};

/// Counts each request as in flight until its response body ends; see
/// [`DrainLayer`](crate::DrainLayer) for the behaviour while draining.
///
/// Built by [`DrainLayer`](crate::DrainLayer). The service's error type is the inner service's:
/// the middleware never fails a request (refusal, when enabled, is a `503` response).
pub struct DrainService<S, N = Unnamed, R = ServeAfterStop> {
    inner: S,
    /// Where the guards count: `[HTTP/1.x, HTTP/2 and later]`, in the layer's leaked entry
    /// (see `server::options`). A plain `&'static` reference, so cloning the service (axum
    /// clones it per request) costs no reference count.
    sites: &'static [Site; 2],
    mode: PhantomData<fn() -> (N, R)>,
}

impl<S: Clone, N, R> Clone for DrainService<S, N, R> {
    #[inline]
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            sites: self.sites,
            mode: PhantomData,
        }
    }
}

impl<S, N, R> DrainService<S, N, R> {
    pub(crate) fn new(inner: S, sites: &'static [Site; 2]) -> Self {
        Self {
            inner,
            sites,
            mode: PhantomData,
        }
    }

    fn core(&self) -> &'static Core {
        self.sites[0].core()
    }

    /// The layer's options index (see `server::options`).
    fn opts(&self) -> u32 {
        tag_options(self.sites[0].tag())
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

impl<S, N, R, ReqBody, ResBody> Service<Request<ReqBody>> for DrainService<S, N, R>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    N: Naming,
    R: Refusal,
{
    type Response = Response<DrainBody<ResBody, N, R>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, N, R>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    #[inline]
    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        // The guard is taken here, held by the future, moved into the body, and released when
        // the body is dropped (see `DrainBody`).
        let site = &self.sites[usize::from(req.version() >= Version::HTTP_2)];
        let (mut guard, draining) = site.enter();
        if let Some(refused) = R::REFUSED {
            // Refusal mode only (`R` decides at compile time): the inner service may not be
            // called at all.
            if draining {
                return self.call_refusing(guard, req, refused);
            }
        }
        // A copy of the request line with `describe_requests`, nothing otherwise.
        let line = N::capture(&req);
        // One place builds the future whatever the phase; while draining, the inner call goes
        // through a cold function that also does the accounting. The request is moved, never
        // lent, and the guard stays here, so the hot path hands the request to the inner
        // service without a copy and keeps the guard in registers.
        let mut entry = None;
        let fut = if draining {
            // A call before the request is moved: without it, the compiler hoists the move of
            // the request into the cold call's argument above the branch, and the hot path
            // pays for a copy it does not use.
            self.core().observed().note_request_activity();
            self.call_draining(req, guard.tag(), &mut entry)
        } else {
            self.inner.call(req)
        };
        if let Some(entry) = entry {
            guard.adopt(entry);
        }
        ResponseFuture::called(fut, guard, line)
    }
}

impl<S, N: Naming, R: Refusal> DrainService<S, N, R> {
    /// The inner call for a request that arrived while draining, with its accounting; `entry`
    /// receives the request's entry in the straggler list, registered once the inner call has
    /// returned (a panicking inner service leaves nothing registered).
    #[cold]
    #[inline(never)]
    fn call_draining<ReqBody, ResBody>(
        &mut self,
        req: Request<ReqBody>,
        tag: u32,
        entry: &mut Option<&'static Site>,
    ) -> S::Future
    where
        S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    {
        let meta = self.note_arrival(&req);
        let info = request_info(req.method(), req.uri().path(), meta);
        let fut = self.inner.call(req);
        *entry = Some(self.core().register(info, tag));
        fut
    }

    /// `call` for a request that arrived while draining, in refusal mode.
    #[cold]
    #[inline(never)]
    fn call_refusing<ReqBody, ResBody>(
        &mut self,
        mut guard: InFlightGuard,
        req: Request<ReqBody>,
        refused: R::Refused,
    ) -> ResponseFuture<S::Future, N, R>
    where
        S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    {
        self.core().observed().record_activity();
        let line = N::capture(&req);
        let meta = self.note_arrival(&req);
        if self.refuses() {
            return ResponseFuture::refused(guard, line, refused);
        }
        let info = request_info(req.method(), req.uri().path(), meta);
        let fut = self.inner.call(req);
        guard.describe(info);
        ResponseFuture::called(fut, guard, line)
    }

    /// Refusal mode: `true` once the drain stopped accepting.
    fn refuses(&self) -> bool {
        options(self.core(), self.opts()).is_some()
            && self.core().phase() >= Phase::StoppedAccepting
    }

    /// Accounting for a request that arrived while draining (refused or not): new or reused
    /// connection, traffic path. Returns the request's connection, if known.
    fn note_arrival<'r, B>(&self, req: &'r Request<B>) -> Option<&'r ConnMeta> {
        let meta = conn_meta(req);
        let core = self.core();
        let on_new = meta.is_some_and(|m| m.is_new_since_drain(core));
        if on_new {
            let m = meta.expect("on_new implies a ConnMeta");
            // Under axum::serve nobody saw the accept: count the connection on its first
            // request after the drain. Under lameduck::serve the accept loop already did.
            if m.claim_record() {
                core.observed().note_connection(m.peer(), m.path());
            }
        }
        if !on_new {
            if let Some(m) = meta {
                m.note_told();
            }
        }
        core.observed().note_request(on_new);
        if let Some(label) = req.headers().get(TRAFFIC_PATH_HEADER) {
            core.observed().note_path(label.as_bytes(), on_new);
        }
        meta
    }
}

/// The request header whose value names the route a request took (`ingress`, `service`,
/// `pod-ip`): set by the rollout probe, or by each proxy in front. While draining the report
/// splits its after-drain counts by it (`after_flip.paths`).
const TRAFFIC_PATH_HEADER: &str = "x-traffic-path";

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

impl<S: fmt::Debug, N, R> fmt::Debug for DrainService<S, N, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DrainService")
            .field("inner", &self.inner)
            .field("options", &options(self.core(), self.opts()))
            .finish_non_exhaustive()
    }
}

//! Naming requests that started before the drain: [`Naming`], [`Unnamed`] and [`RequestLine`].
//!
//! Requests that arrive while Serving are not registered anywhere (that would cost a lock and
//! an allocation per request). If one of them is still running when the drain starts, the
//! straggler list can only name it if the request's method and path travelled with it. That is
//! opt-in ([`DrainLayer::describe_requests`](crate::DrainLayer::describe_requests)): the copy
//! is a bounded `memcpy` per request and no allocation, but it makes the response future and
//! body 88 bytes bigger, and they are moved several times per request. Without it, such a
//! request is reported as an "undescribed guard" (requests that arrive *while draining* are
//! always named, from the request itself).
//!
//! With the copy, long paths are truncated, the query string is never kept, and a body that is
//! never polled again after the drain starts (a silent stream) stays an "undescribed guard".

use std::fmt;

use http::Method;
use tokio::time::Instant;

use crate::hot::guard::{InFlightGuard, RequestInfo};

use super::conn_meta::ConnMeta;

pub(crate) mod sealed {
    use super::InFlightGuard;

    pub trait SealedLine: Copy + Send + Sync + Unpin + 'static {
        /// What travels with a request that arrived while Serving.
        fn capture<B>(req: &http::Request<B>) -> Self;
        /// Describes the guard from the capture if nobody described it yet (the drain has
        /// started: only the draining paths call this).
        fn describe(&self, guard: &mut InFlightGuard);
        /// [`describe`](Self::describe) if the drain has started.
        fn describe_if_draining(&self, guard: &mut Option<InFlightGuard>);
    }
}

/// What a [`DrainLayer`](crate::DrainLayer) keeps of each request that arrives while Serving,
/// to name it in the straggler list should it outlive the drain's start: nothing
/// ([`Unnamed`], the default) or its method and path ([`RequestLine`]).
///
/// Sealed: implemented by these two types only.
pub trait Naming: sealed::SealedLine {}

/// Keeps nothing of requests that arrive while Serving (the default): one that is still in
/// flight at the quiesce deadline is listed as an "undescribed guard".
///
/// See [`DrainLayer::describe_requests`](crate::DrainLayer::describe_requests) for the
/// alternative and its cost.
#[derive(Clone, Copy, Debug, Default)]
pub struct Unnamed;

impl sealed::SealedLine for Unnamed {
    #[inline(always)]
    fn capture<B>(_: &http::Request<B>) -> Self {
        // Nothing read: not even the path, whose char-boundary check the compiler could not
        // drop, and no reference to the request that would keep it in memory.
        Unnamed
    }

    #[inline(always)]
    fn describe(&self, _: &mut InFlightGuard) {}

    #[inline(always)]
    fn describe_if_draining(&self, _: &mut Option<InFlightGuard>) {}
}

impl Naming for Unnamed {}

/// Bytes kept of `METHOD` + path. Sized so the copy stays a couple of cache lines.
const CAP: usize = 80;
/// Longest path kept when the request is described from the request itself (while draining).
const LONG_PATH: usize = 256;

/// An inline copy of a request's method and the first bytes of its path, carried by the
/// response future and body so that a request that started before the drain can be named in
/// the straggler list. Selected with
/// [`DrainLayer::describe_requests`](crate::DrainLayer::describe_requests).
#[derive(Clone, Copy)]
pub struct RequestLine {
    buf: [u8; CAP],
    method_len: u8,
    len: u8,
    truncated: bool,
}

impl sealed::SealedLine for RequestLine {
    #[inline]
    fn capture<B>(req: &http::Request<B>) -> Self {
        Self::new(req.method(), req.uri().path())
    }

    #[inline]
    fn describe(&self, guard: &mut InFlightGuard) {
        if !guard.is_described() {
            self.describe_cold(guard);
        }
    }

    /// One relaxed load while Serving.
    #[inline]
    fn describe_if_draining(&self, guard: &mut Option<InFlightGuard>) {
        if let Some(g) = guard {
            if !g.is_described() && g.core().counter.is_draining() {
                self.describe_cold(g);
            }
        }
    }
}

impl Naming for RequestLine {}

impl RequestLine {
    #[inline]
    fn new(method: &Method, path: &str) -> Self {
        let mut buf = [0u8; CAP];
        let m = method.as_str().as_bytes();
        let method_len = m.len().min(16);
        buf[..method_len].copy_from_slice(&m[..method_len]);
        let p = path.as_bytes();
        let room = CAP - method_len;
        let path_len = p.len().min(room);
        buf[method_len..method_len + path_len].copy_from_slice(&p[..path_len]);
        Self {
            buf,
            method_len: method_len as u8,
            len: (method_len + path_len) as u8,
            truncated: p.len() > room,
        }
    }

    fn info(&self) -> RequestInfo {
        let method = String::from_utf8_lossy(&self.buf[..self.method_len as usize]).into_owned();
        let mut path =
            String::from_utf8_lossy(&self.buf[self.method_len as usize..self.len as usize])
                .into_owned();
        if self.truncated {
            path.push('…');
        }
        RequestInfo {
            method,
            path,
            peer: None,
            // Unknown: recording a start instant per request while Serving is work the hot path
            // does not do. The report then uses the drain's age as a lower bound.
            started: None,
        }
    }

    #[cold]
    #[inline(never)]
    fn describe_cold(&self, guard: &mut InFlightGuard) {
        guard.describe(self.info());
    }
}

impl fmt::Debug for RequestLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let i = self.info();
        write!(f, "{} {}", i.method, i.path)
    }
}

/// What is known of a request that arrived while draining, from the request itself.
pub(crate) fn request_info(method: &Method, path: &str, meta: Option<&ConnMeta>) -> RequestInfo {
    let mut end = path.len().min(LONG_PATH);
    while !path.is_char_boundary(end) {
        end -= 1;
    }
    let mut p = path[..end].to_owned();
    if end < path.len() {
        p.push('…');
    }
    RequestInfo {
        method: method.as_str().to_owned(),
        path: p,
        peer: meta.and_then(ConnMeta::peer),
        started: Some(Instant::now()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_method_and_path() {
        let l = RequestLine::new(&Method::GET, "/stream/events");
        let i = l.info();
        assert_eq!(i.method, "GET");
        assert_eq!(i.path, "/stream/events");
        assert!(i.started.is_none());
    }

    #[test]
    fn truncates_long_paths_with_a_marker() {
        let long = format!("/{}", "a".repeat(200));
        let i = RequestLine::new(&Method::POST, &long).info();
        assert_eq!(i.method, "POST");
        assert_eq!(i.path.chars().count(), CAP - 4 + 1);
        assert!(i.path.ends_with('…'));
    }

    #[test]
    fn cut_multibyte_characters_do_not_panic() {
        let path = format!("/{}", "é".repeat(100));
        let i = RequestLine::new(&Method::GET, &path).info();
        assert!(i.path.starts_with("/é"));
    }
}

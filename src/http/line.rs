//! A fixed-size inline copy of a request's method and path, for the straggler list.
//!
//! Requests that arrive while Serving are not registered anywhere (that would cost a lock and
//! an allocation per request). If one of them is still running when the drain starts, its
//! response future or body describes it on the first poll after the drain started, from this
//! copy. The copy costs a bounded `memcpy` per request and no allocation; the price is that
//! long paths are truncated, the query string is never kept, and a body that is never polled
//! again after the drain starts (a silent stream) stays an "undescribed guard" in the report.

use std::fmt;

use http::Method;
use tokio::time::Instant;

use crate::guard::{InFlightGuard, RequestInfo};

use super::conn::ConnMeta;

/// Bytes kept of `METHOD` + path. Sized so the copy stays a couple of cache lines.
const CAP: usize = 80;
/// Longest path kept when the request is described from the request itself (while draining).
const LONG_PATH: usize = 256;

#[derive(Clone, Copy)]
pub(crate) struct RequestLine {
    buf: [u8; CAP],
    method_len: u8,
    len: u8,
    truncated: bool,
}

impl RequestLine {
    #[inline]
    pub(crate) fn new(method: &Method, path: &str) -> Self {
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

    /// Describes the guard from this copy if the drain has started and nobody described it yet.
    /// One relaxed load while Serving.
    #[inline]
    pub(crate) fn describe_if_draining(&self, guard: &mut Option<InFlightGuard>) {
        if let Some(g) = guard {
            if !g.is_described() && g.core().counter.is_draining() {
                self.describe_cold(g);
            }
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

/// Describes a request that arrived while draining, from the request itself.
pub(crate) fn describe_now(
    guard: &mut InFlightGuard,
    method: &Method,
    path: &str,
    meta: Option<&ConnMeta>,
) {
    let mut end = path.len().min(LONG_PATH);
    while !path.is_char_boundary(end) {
        end -= 1;
    }
    let mut p = path[..end].to_owned();
    if end < path.len() {
        p.push('…');
    }
    guard.describe(RequestInfo {
        method: method.as_str().to_owned(),
        path: p,
        peer: meta.and_then(ConnMeta::peer),
        started: Some(Instant::now()),
    });
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

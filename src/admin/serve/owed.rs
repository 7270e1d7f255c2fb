//! The admin server's per-request accounting: a request owes an answer ([`Busy`]) from the
//! handler's call until the handler has returned it, except while the handler waits for the
//! request body ([`OwedReading`]); the answer is then being delivered ([`Delivering`]) until its
//! body is handed to hyper ([`Held`]), which only the peer can delay (a full socket, an
//! HTTP/2 flow-control window it keeps shut).

use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use http_body::{Frame, SizeHint};
use hyper::body::{Bytes, Incoming};

use super::{Slot, OWED, READING};

/// Counts one admin request as in progress on its connection until its answer is computed
/// ([`computed`](Self::computed)) or the request is dropped.
pub(super) struct Busy(Arc<Slot>);

impl Busy {
    pub(super) fn new(slot: Arc<Slot>) -> Self {
        // Release: the cap's eviction check must not miss a request that started.
        slot.owed.fetch_add(OWED, Ordering::Release);
        slot.started.fetch_add(1, Ordering::Release);
        Self(slot)
    }

    /// The handler returned its answer: from now on only its delivery is owed.
    pub(super) fn computed(self) -> Delivering {
        // Release, before `self` leaves the busy count: a check that sees the request no
        // longer busy (its Acquire load of `owed` first) sees it delivering.
        if self.0.delivering.fetch_add(1, Ordering::Release) == 0 {
            let us = self.0.accepted.elapsed().as_micros() as u64 + 1;
            self.0.delivering_since.store(us, Ordering::Relaxed);
        }
        Delivering(Arc::clone(&self.0))
    }
}

/// Counts one computed answer as being delivered on its connection until its body is handed
/// to hyper (or dropped, with the connection).
pub(super) struct Delivering(Arc<Slot>);

impl Drop for Delivering {
    fn drop(&mut self) {
        // Release: pairs with the exit's and the eviction check's Acquire.
        self.0.delivering.fetch_sub(1, Ordering::Release);
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.owed.fetch_sub(OWED, Ordering::Release);
    }
}

/// A request body that, while a handler waits for it, takes its request out of the busy
/// count: a client that sent a head and withholds its body is owed nothing yet, so it can be
/// evicted at the cap and closed at exit.
pub(super) struct OwedReading {
    inner: Incoming,
    slot: Arc<Slot>,
    waiting: bool,
}

impl OwedReading {
    pub(super) fn new(inner: Incoming, slot: Arc<Slot>) -> Self {
        Self {
            inner,
            slot,
            waiting: false,
        }
    }

    fn set_waiting(&mut self, waiting: bool) {
        if self.waiting != waiting {
            self.waiting = waiting;
            // Release: pairs with the eviction check's Acquire.
            if waiting {
                self.slot.owed.fetch_add(READING, Ordering::Release);
            } else {
                self.slot.owed.fetch_sub(READING, Ordering::Release);
            }
        }
    }
}

impl http_body::Body for OwedReading {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        let r = Pin::new(&mut this.inner).poll_frame(cx);
        let waiting = match &r {
            Poll::Pending => true,
            Poll::Ready(Some(Ok(_))) => !this.inner.is_end_stream(),
            Poll::Ready(_) => false,
        };
        this.set_waiting(waiting);
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for OwedReading {
    fn drop(&mut self) {
        self.set_waiting(false);
    }
}

/// A response body that keeps `_hold` alive until the body is done or dropped.
pub(crate) struct Held<T> {
    pub(crate) inner: Body,
    pub(crate) _hold: T,
}

impl<T: Unpin> http_body::Body for Held<T> {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

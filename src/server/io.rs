//! [`WatchedIo`]: a connection's socket that counts a pending write as in-flight work.
//!
//! A response's guard is released when hyper drops its body, right after taking the last
//! frame, which is not when its bytes have left: hyper buffers them, and a slow reader keeps them in the socket's
//! send queue. Under [`serve`](super::serve) every connection's socket is wrapped in a
//! [`WatchedIo`], so that a connection whose writes are pending counts as in flight and is named
//! as a `response` straggler at the quiesce deadline.
//!
//! # Invariants
//!
//! * A write is *pending* from the first `poll_write` that returned `WritePending` until a
//!   `poll_flush` (or `poll_shutdown`) returns `Ready`: hyper and h2 flush the socket only once
//!   their own buffer is empty, so that is the moment every response byte was accepted by the
//!   kernel. While pending, the connection holds exactly one [`InFlightGuard`] (taken with
//!   `Core::hold`: not an arrival, so the propagation policy sees no activity).
//! * Writes that complete at once touch no atomic: one add to a plain field, one branch.
//! * The guard and the registry entry go away with the pending write, or with the socket
//!   (force-close, peer reset, task aborted): the entry is removed before the guard, so a
//!   waiter that sees zero in flight finds no stalled write left.
//! * A read costs one relaxed load more than the socket's own: whether the connection task
//!   asked ([`Peek`]) if a request is waiting unread in the socket before it closes an idle
//!   HTTP/1 connection. Only that question, asked once per close, peeks at the socket.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::hot::guard::{Core, InFlightGuard};
use crate::hot::stall::StalledWrite;

use super::conn_meta::ConnShared;

/// The connection task's question to the socket, in `ConnShared::peek`: before it closes an
/// idle HTTP/1 connection, is a request waiting in the socket that hyper has not read yet?
/// hyper closes an idle connection without reading, so a request that arrived a moment
/// before the close (its bytes in the socket, its readiness not yet seen, or the close
/// branch polled first) was lost: "connection closed before message completed", 1 in 7,841
/// once on the testbed. The socket answers at hyper's next read, which comes at the task's
/// next poll of an idle connection; it peeks, so the bytes stay for hyper.
pub(crate) struct Peek;

impl Peek {
    /// No question.
    pub(crate) const NONE: u8 = 0;
    /// Asked, not answered yet (hyper has not read since: it is not idle).
    pub(crate) const ASKED: u8 = 1;
    /// Bytes were waiting unread.
    pub(crate) const WAITING: u8 = 2;
    /// Nothing was waiting (or the peer closed its side).
    pub(crate) const EMPTY: u8 = 3;
}

/// A TCP stream whose pending writes count as in-flight work. See the module docs.
pub(crate) struct WatchedIo {
    io: TcpStream,
    core: &'static Core,
    conn: u64,
    peer: Option<SocketAddr>,
    /// Bytes written on the connection so far; a plain field, only this task writes it.
    written: u64,
    pending: Option<WritePending>,
    /// Where the connection task asks its [`Peek`] question.
    shared: Arc<ConnShared>,
}

/// A write that could not complete at once (or, for [`Pending::after_goaway`], an HTTP/2
/// connection finishing its streams): the guard, and (once draining) the straggler entry.
pub(crate) struct WritePending {
    entry: Option<Arc<StalledWrite>>,
    guard: InFlightGuard,
}

impl WritePending {
    /// Counts an HTTP/2 connection that was sent GOAWAY as in flight until it closes: hyper
    /// closes it once every stream has sent everything, including data queued behind the
    /// peer's flow-control window, which the socket never sees. Only called while draining.
    pub(crate) fn after_goaway(core: &'static Core, conn: u64, peer: Option<SocketAddr>) -> Self {
        let entry = core.observed().stalls().register(conn, true, peer, 0);
        Self {
            entry: Some(entry),
            guard: core.hold(),
        }
    }
}

impl Drop for WritePending {
    fn drop(&mut self) {
        // Unregister before the guard leaves (a field, dropped after this), so whoever sees
        // zero in flight sees no stalled write.
        if let Some(e) = &self.entry {
            self.guard.core().observed().stalls().unregister(e);
        }
    }
}

impl WatchedIo {
    pub(crate) fn new(
        io: TcpStream,
        core: &'static Core,
        (conn, peer): (u64, Option<SocketAddr>),
        shared: Arc<ConnShared>,
    ) -> Self {
        Self {
            io,
            core,
            conn,
            peer,
            written: 0,
            pending: None,
            shared,
        }
    }

    /// Answers the connection task's [`Peek`] question: peeks at one byte, without waiting.
    #[cold]
    #[inline(never)]
    fn answer_peek(&self) {
        let mut byte = [std::mem::MaybeUninit::<u8>::uninit()];
        let waiting = matches!(socket2::SockRef::from(&self.io).peek(&mut byte), Ok(n) if n > 0);
        let answer = if waiting { Peek::WAITING } else { Peek::EMPTY };
        // Relaxed: asked and answered on the connection's own task.
        self.shared.peek.store(answer, Ordering::Relaxed);
    }

    #[inline]
    fn after_write(&mut self, r: &Poll<io::Result<usize>>) {
        match r {
            Poll::Ready(Ok(n)) => {
                self.written += *n as u64;
                if let Some(p) = &self.pending {
                    if let Some(e) = &p.entry {
                        // Relaxed: a gauge read at the deadline.
                        e.written.store(self.written, Ordering::Relaxed);
                    }
                }
            }
            Poll::Pending => self.stalled(),
            Poll::Ready(Err(_)) => {}
        }
    }

    /// A write could not complete: count the connection (once), and name it once draining.
    #[cold]
    fn stalled(&mut self) {
        let core = self.core;
        let pending = self.pending.get_or_insert_with(|| WritePending {
            entry: None,
            guard: core.hold(),
        });
        // Registered lazily: a write that stalled while Serving is named at the next poll after
        // the drain started (the connection task polls the connection when the drain starts).
        if pending.entry.is_none() && core.counter.is_draining() {
            pending.entry = Some(core.observed().stalls().register(
                self.conn,
                false,
                self.peer,
                self.written,
            ));
        }
    }

    #[inline]
    fn after_flush(&mut self, r: &Poll<io::Result<()>>) {
        if r.is_ready() && self.pending.is_some() {
            // Everything hyper had was accepted by the socket (or the socket failed).
            self.pending = None;
        }
    }
}

impl AsyncRead for WatchedIo {
    #[inline]
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.shared.peek.load(Ordering::Relaxed) == Peek::ASKED {
            self.answer_peek();
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for WatchedIo {
    #[inline]
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let r = Pin::new(&mut this.io).poll_write(cx, buf);
        this.after_write(&r);
        r
    }

    #[inline]
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let r = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.after_write(&r);
        r
    }

    #[inline]
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    #[inline]
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let r = Pin::new(&mut this.io).poll_flush(cx);
        this.after_flush(&r);
        r
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let r = Pin::new(&mut this.io).poll_shutdown(cx);
        this.after_flush(&r);
        r
    }
}

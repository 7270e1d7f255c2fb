//! [`AdminBuilder::serve`]: the admin listener's own accept loop, built to answer probes under
//! a slowloris or a connection flood, and to answer every `/drain` caller before the process
//! exits.
//!
//! # Invariants
//!
//! * At most `max_connections` connections are open. A new connection at the cap evicts the
//!   connection that owes least: an idle keep-alive connection first, then one that has not
//!   delivered a request head (silent, a head still arriving) or whose next request is not
//!   read yet (keep-alive, pipelining), then one whose answers have
//!   waited for the peer to take them for [`STUCK_DELIVERY`] or more, oldest first; only when every open connection is busy is the
//!   new one refused (closed at once). So a flood of slow, silent or non-reading connections
//!   cannot lock kubelet's probes out, and an answer being computed is never cut to make room.
//! * *Busy* means an answer is being computed: from the handler's call until it returns,
//!   except while it waits for the request body (a client that withholds its body is owed
//!   nothing yet). Probes never read a body, so they are busy from their call.
//! * *Delivering* means a computed answer's body has not been handed to hyper yet. For a peer
//!   that reads, that lasts no longer than the poll that computed it (admin answers are
//!   small); only the peer can make it last (an HTTP/2 stream window it keeps at zero, a full
//!   socket), so the server owes it nothing it can still do.
//! * A connection that has not started a request and whose client may have sent bytes its
//!   task has not read yet (just accepted, or woken by its socket since its last poll) is
//!   never evicted: under a flood the accept
//!   loop can run ahead of the connection tasks, and a probe whose head has arrived must be
//!   read before anything can judge it idle. When only such connections stand in the way, the
//!   accept loop waits for them to be polled (at most 1 s, then the newest is refused). Once
//!   a connection was answered, unread bytes are its next request: kubelet opens a connection
//!   per probe, and a peer that pipelines and never reads keeps its socket waking, which must
//!   not keep its slot.
//! * At most the cap less an eighth (at least one slot) of requests wait for the drain
//!   (`/drain?wait=…`, busy for the whole drain): the rest stays for probes ([`WaitSeats`]).
//! * HTTP/1 request heads must arrive within the header-read timeout, `/drain` bodies too.
//! * Every connection task runs as owed work of the drain's exit holds: when
//!   [`Drain::run`](crate::Drain::run) is about to return, the listener closes, connections
//!   that owe nothing (idle, a head or a body still arriving) close at once, and busy or
//!   delivering ones finish their response (hyper's graceful shutdown writes it out) before
//!   `run` returns — within [`DELIVERY_WAIT`] (a fifteenth of the grace period when that is
//!   shorter, at least 100 ms, never past the hard deadline): by then every answer is computed, and a
//!   connection still owing one has a peer that does not read. It is cut, and the report
//!   names it (a `response` straggler).

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use axum::body::Body;
use axum::Router;
use http::Request;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::drain::AdminSeam;
use crate::report::{Straggler, StragglerKind};
use crate::server::accept::Acceptor;
use crate::vocab::sync::MutexExt;

mod owed;
mod slots;
mod waiters;

pub(crate) use owed::Held;
use owed::{Busy, OwedReading};
use slots::{
    AdminSlots, Admission, Slot, DELIVERY_WAIT, FRESH_WAIT, OWED, READING, STUCK_DELIVERY,
};
pub(crate) use waiters::WaitSeats;

/// The admin server's default HTTP/1 header-read timeout: probes send their head at once.
pub const DEFAULT_ADMIN_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// The admin server's default cap on open connections.
pub const DEFAULT_ADMIN_MAX_CONNECTIONS: usize = 64;

/// The future returned by [`AdminBuilder::serve`](super::AdminBuilder::serve): serves the
/// admin router until [`Drain::run`](crate::Drain::run) is about to return, then stops
/// accepting and resolves (connections still writing an answer finish on their own, and `run`
/// waits for them).
#[must_use = "futures do nothing unless polled"]
pub struct AdminServe {
    inner: Pin<Box<dyn Future<Output = io::Result<()>> + Send>>,
}

impl AdminServe {
    pub(crate) fn new(
        listener: TcpListener,
        router: Router,
        seam: AdminSeam,
        header_read_timeout: Duration,
        max_connections: usize,
    ) -> Self {
        Self {
            inner: Box::pin(run(
                listener,
                router,
                seam,
                header_read_timeout,
                max_connections.max(1),
            )),
        }
    }
}

impl Future for AdminServe {
    type Output = io::Result<()>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl fmt::Debug for AdminServe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdminServe").finish_non_exhaustive()
    }
}

/// The most streams an HTTP/2 connection to the admin port may have open at once.
const ADMIN_H2_STREAMS: u32 = 8;

async fn run(
    listener: TcpListener,
    router: Router,
    seam: AdminSeam,
    header_read_timeout: Duration,
    cap: usize,
) -> io::Result<()> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout);
    // Probes and `/drain` calls send a request or two per connection; more streams are only
    // what a hostile peer holds open.
    builder.http2().max_concurrent_streams(ADMIN_H2_STREAMS);
    let exiting = seam.exit_holds().exiting().clone();
    let slots = Arc::new(AdminSlots::default());
    let seats = WaitSeats::for_cap(cap);
    let mut acceptor = Acceptor::new(listener, "admin ");
    let mut stop = pin!(exiting.cancelled());
    while let Some((stream, peer)) = acceptor.next(stop.as_mut()).await {
        let slot = Arc::new(Slot::new(peer));
        let give_up = Instant::now() + FRESH_WAIT;
        let admitted = loop {
            match slots.admit(&slot, cap) {
                Admission::Admitted => break true,
                Admission::Refused => break false,
                Admission::Wait => tokio::select! {
                    biased;
                    () = exiting.cancelled() => return Ok(()),
                    () = slots.changed.notified() => {}
                    // A delivery that was recent may have become stuck (evictable) since:
                    // nothing signals that, so look again.
                    () = tokio::time::sleep(STUCK_DELIVERY / 5) => {}
                    () = tokio::time::sleep_until(give_up) => break false,
                },
            }
        };
        if !admitted {
            tracing::warn!(
                max_connections = cap,
                "lameduck: admin connection refused: every admin connection is busy"
            );
            drop(stream);
            continue;
        }
        let conn = serve_conn(
            builder.clone(),
            stream,
            router.clone(),
            slot,
            Arc::clone(&slots),
            Arc::clone(&seats),
            seam.clone(),
        );
        seam.exit_holds().spawn(conn);
    }
    Ok(())
}

async fn serve_conn(
    builder: auto::Builder<TokioExecutor>,
    stream: TcpStream,
    router: Router,
    slot: Arc<Slot>,
    slots: Arc<AdminSlots>,
    seats: Arc<WaitSeats>,
    seam: AdminSeam,
) {
    let _ = stream.set_nodelay(true);
    let exiting = seam.exit_holds().exiting().clone();
    let counted = Arc::clone(&slot);
    let svc = hyper::service::service_fn(move |mut req: Request<Incoming>| {
        counted.note_request(&req);
        req.extensions_mut().insert(Arc::clone(&seats));
        let busy = Busy::new(Arc::clone(&counted));
        let req = req.map(|body| OwedReading::new(body, Arc::clone(&counted)));
        let mut router = router.clone();
        async move {
            let res = tower_service::Service::call(&mut router, req).await?;
            let delivering = busy.computed();
            Ok::<_, Infallible>(res.map(|body| {
                Body::new(Held {
                    inner: body,
                    _hold: delivering,
                })
            }))
        }
    });
    let conn = builder.serve_connection(TokioIo::new(stream), svc);
    let mut conn = pin!(conn);
    let wake = Arc::new(ReadWake {
        slot: Arc::clone(&slot),
        task: Mutex::new(None),
    });
    let waker = Waker::from(Arc::clone(&wake));
    // Set once the process is about to exit and an answer is still owed: when its connection
    // is cut, and the wait that gives.
    let mut cut: Option<(Instant, Duration)> = None;
    loop {
        let watched = Watched {
            conn: conn.as_mut(),
            wake: &wake,
            waker: &waker,
            slots: &slots,
        };
        tokio::select! {
            res = watched => {
                if let Err(e) = res {
                    tracing::debug!(error = %e, "lameduck: admin connection ended with an error");
                }
                break;
            }
            () = slot.evict.cancelled() => {
                tracing::debug!("lameduck: admin connection evicted at the connection cap");
                break;
            }
            () = exiting.cancelled(), if cut.is_none() => {
                if !slot.owes() {
                    // Nothing owed: idle, or a head or a body still arriving.
                    break;
                }
                // Finishes the answer (and writes it out), then closes; a peer that does not
                // take it does not hold the exit.
                conn.as_mut().graceful_shutdown();
                cut = Some(seam.exit_holds().deliver_by().unwrap_or_else(|| {
                    (Instant::now() + DELIVERY_WAIT, DELIVERY_WAIT)
                }));
            }
            () = sleep_until_some(cut.map(|(at, _)| at)) => {
                note_cut_at_exit(&seam, &slot, cut.map_or(DELIVERY_WAIT, |(_, w)| w));
                break;
            }
        }
    }
    slots.remove(&slot);
}

/// The exit's wait for `slot`'s answer is over: names the connection, for the last report, if
/// its answer is still owed.
fn note_cut_at_exit(seam: &AdminSeam, slot: &Slot, waited: Duration) {
    if slot.owes() {
        tracing::warn!(
            peer = %slot.peer,
            "lameduck: admin answer not taken by its peer at exit; connection cut"
        );
        seam.exit_holds().note_cut(slot.cut_at_exit(waited));
    }
}

/// Sleeps until `at`; never resolves for `None`.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The waker the connection is polled with: marks the slot `unread` when the socket (or a
/// timer of the connection) wakes the task, then wakes the task.
struct ReadWake {
    slot: Arc<Slot>,
    task: Mutex<Option<Waker>>,
}

impl Wake for ReadWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // Release: pairs with the eviction check's Acquire.
        self.slot.wakes.fetch_add(1, Ordering::Release);
        let task = self.task.locked();
        if let Some(w) = &*task {
            w.wake_by_ref();
        }
    }
}

/// Polls the connection with its [`ReadWake`], records the wake-ups it has seen once the poll
/// ended (a wake-up during the poll stays unread), and tells the accept loop when a
/// connection it may be waiting for has read.
struct Watched<'a, F> {
    conn: Pin<&'a mut F>,
    wake: &'a Arc<ReadWake>,
    waker: &'a Waker,
    slots: &'a AdminSlots,
}

impl<F: Future> Future for Watched<'_, F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        {
            let mut task = self.wake.task.locked();
            match &*task {
                Some(w) if w.will_wake(cx.waker()) => {}
                _ => *task = Some(cx.waker().clone()),
            }
        }
        let slot = &self.wake.slot;
        let seen = slot.wakes.load(Ordering::Acquire);
        let waker = self.waker;
        let r = self.conn.as_mut().poll(&mut Context::from_waker(waker));
        // Release: whoever sees this count sees what the poll did (a request made busy).
        let slot = &self.wake.slot;
        let was_unread = slot.read.swap(seen, Ordering::AcqRel) != seen;
        if was_unread {
            // What the client sent is read (a complete head made the connection busy): the
            // accept loop may be waiting for this. One waiter; a stored permit only makes it
            // check once more.
            self.slots.changed.notify_one();
        }
        r
    }
}

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
//!   `run` returns — within [`DELIVERY_WAIT`]: by then every answer is computed, and a
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

use crate::drain::Drain;
use crate::report::{Straggler, StragglerKind};
use crate::server::accept::Acceptor;
use crate::sync::MutexExt;

mod owed;
mod waiters;

pub(crate) use owed::Held;
use owed::{Busy, Reading};
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
        drain: Drain,
        header_read_timeout: Duration,
        max_connections: usize,
    ) -> Self {
        Self {
            inner: Box::pin(run(
                listener,
                router,
                drain,
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

/// How long a connection that owes an answer when the process is about to exit may take to
/// deliver it before it is cut: every answer is computed by then and small, so only a peer
/// that does not read needs longer.
const DELIVERY_WAIT: Duration = Duration::from_secs(2);

/// How long a computed answer must have waited for its peer to take it before the cap may
/// evict its connection: far longer than a reading peer's delivery of a small answer, even
/// on a loaded machine, and short enough that a peer keeping its window shut frees its slot
/// within a probe's timeout.
const STUCK_DELIVERY: Duration = Duration::from_millis(500);

/// One open admin connection, as the cap sees it.
struct Slot {
    accepted: Instant,
    peer: SocketAddr,
    /// Low half: requests whose response has not been fully handed to hyper yet (answers
    /// owed). High half: how many of those are waiting for their request body, which owes the
    /// client nothing yet. One word, so that one load sees both.
    owed: AtomicU64,
    /// Answers computed whose body hyper has not taken yet (see the module docs).
    delivering: AtomicU64,
    /// When `delivering` last rose from zero, in microseconds since `accepted` (+1; 0 = not
    /// delivering): a delivery younger than [`STUCK_DELIVERY`] is a peer that reads but whose
    /// task has not been polled yet, not one that keeps its window shut.
    delivering_since: AtomicU64,
    /// Requests started on the connection so far.
    started: AtomicUsize,
    /// The last request started, for the report when the connection is cut at exit.
    last: Mutex<Option<LastRequest>>,
    /// Wake-ups of the connection's task by its socket (or its timers), counting acceptance
    /// as the first.
    wakes: AtomicU64,
    /// The count of wake-ups the task had seen when its last poll of the connection ended.
    /// While it is behind `wakes`, the client may have sent bytes not read yet (a complete head
    /// makes the connection busy in the poll that reads it).
    read: AtomicU64,
    evict: CancellationToken,
}

const OWED: u64 = 1;
const READING: u64 = 1 << 32;

/// What the report names of a connection's last request.
struct LastRequest {
    line: String,
    http2: bool,
    at: Instant,
}

/// The longest request path kept for the report.
const MAX_NAMED_PATH: usize = 128;

impl Slot {
    fn new(peer: SocketAddr) -> Self {
        Self {
            accepted: Instant::now(),
            peer,
            owed: AtomicU64::new(0),
            delivering: AtomicU64::new(0),
            delivering_since: AtomicU64::new(0),
            started: AtomicUsize::new(0),
            last: Mutex::new(None),
            wakes: AtomicU64::new(1),
            read: AtomicU64::new(0),
            evict: CancellationToken::new(),
        }
    }

    /// The client may have sent bytes that the connection's task has not read yet.
    fn is_unread(&self) -> bool {
        // `read` first: it never passes `wakes`, so a wake-up between the loads only makes the
        // answer `true`. Acquire: pairs with the Release in `Watched::poll`, so the state the
        // poll left (busy) is seen with it.
        let read = self.read.load(Ordering::Acquire);
        self.wakes.load(Ordering::Acquire) != read
    }

    /// The client may have sent its first request head, not read yet: the connection is not
    /// evicted before it is (a probe in a flood of silent connections).
    fn is_unread_head(&self) -> bool {
        self.started.load(Ordering::Acquire) == 0 && self.is_unread()
    }

    /// An answer is being computed or written: the connection is neither evicted nor closed at
    /// exit before it is out.
    fn is_busy(&self) -> bool {
        // Acquire: pairs with the Release of `Busy` and `Reading`, so a request that started
        // (or finished its body) is seen by the cap's eviction check.
        let v = self.owed.load(Ordering::Acquire);
        (v & (READING - 1)) > (v >> 32)
    }

    /// A computed answer has not been handed to hyper yet.
    fn is_delivering(&self) -> bool {
        // Acquire: pairs with the Release of `Delivering`. Read after `owed` (see
        // `Busy::computed`), so an answer is seen busy or delivering, never neither.
        self.delivering.load(Ordering::Acquire) > 0
    }

    /// A computed answer has waited less than [`STUCK_DELIVERY`] to be taken: under a flood
    /// the connection's task may simply not have been polled since; it is not evicted yet.
    fn is_delivering_recently(&self) -> bool {
        if !self.is_delivering() {
            return false;
        }
        // Relaxed: a timestamp; a stale 0 reads as "not recent", which only allows what the
        // delivering state allowed before it was stamped.
        let since = self.delivering_since.load(Ordering::Relaxed);
        since != 0
            && self.accepted.elapsed().as_micros() as u64 + 1
                < since + STUCK_DELIVERY.as_micros() as u64
    }

    /// An answer is being computed or delivered.
    fn owes(&self) -> bool {
        self.is_busy() || self.is_delivering()
    }

    /// Which connection the cap evicts first (lowest): idle keep-alive (it had its answers),
    /// then no request head yet or a next request not read yet, then answers waiting for the
    /// peer to take them.
    fn eviction_rank(&self) -> u8 {
        if self.is_delivering() {
            2
        } else if self.started.load(Ordering::Acquire) == 0 || self.is_unread() {
            1
        } else {
            0
        }
    }

    fn note_request<B>(&self, req: &Request<B>) {
        let path = req.uri().path();
        let mut end = path.len().min(MAX_NAMED_PATH);
        while !path.is_char_boundary(end) {
            end -= 1;
        }
        *self.last.locked() = Some(LastRequest {
            line: format!("{} {}", req.method(), &path[..end]),
            http2: req.version() == http::Version::HTTP_2,
            at: Instant::now(),
        });
    }

    /// The report's name for this connection, cut at exit with an answer undelivered.
    fn cut_at_exit(&self) -> Straggler {
        let last = self.last.locked();
        let (proto, line, since) = match &*last {
            Some(l) => (
                if l.http2 { "HTTP/2" } else { "HTTP/1" },
                l.line.as_str(),
                l.at,
            ),
            None => ("HTTP", "a request", self.accepted),
        };
        let name = format!(
            "admin {proto} connection from {}: the answer to {line} was not taken within {} ms \
             of the exit (the peer does not read: a full socket, or an HTTP/2 flow-control \
             window kept shut); connection cut",
            self.peer,
            DELIVERY_WAIT.as_millis()
        );
        let mut s = Straggler::new(StragglerKind::Response, name, since.elapsed());
        s.peer = Some(self.peer.to_string());
        s
    }
}

/// How a connection at the cap can make room.
enum Admission {
    Admitted,
    /// Every connection is busy: the new one is refused.
    Refused,
    /// Nothing can be evicted before some connection has read what its client sent.
    Wait,
}

/// How long the accept loop waits for connections to read what their clients sent before it
/// gives up on the newest connection.
const FRESH_WAIT: Duration = Duration::from_secs(1);

#[derive(Default)]
struct Slots {
    open: Mutex<Vec<Arc<Slot>>>,
    /// A connection read what its client sent, or closed: room may have appeared.
    changed: Notify,
}

impl Slots {
    /// Makes room for `slot`, evicting the connection that owes least: first an idle
    /// keep-alive connection (it had its answers), then one that has not delivered a request
    /// head, then one whose answers wait for its peer to take them, oldest first. Never a busy
    /// one, and never one whose task has not yet read what its client sent: a probe in a flood
    /// of silent connections has its head read before anything can evict it, however long its
    /// task waits for a thread.
    fn admit(&self, slot: &Arc<Slot>, cap: usize) -> Admission {
        let mut open = self.open.locked();
        if open.len() >= cap {
            let mut unread = false;
            let victim = open
                .iter()
                .enumerate()
                .filter(|(_, s)| {
                    // A delivery that has not been stuck long waits like an unread head: its
                    // peer may read, and its task not have been polled yet. Unread bytes on a
                    // connection that was answered already are its next request (a keep-alive
                    // or pipelining peer, never kubelet, which opens a connection per probe):
                    // a peer that pipelines and never reads keeps its socket waking, and
                    // must not hold its slot that way.
                    let u = s.is_unread_head() || s.is_delivering_recently();
                    unread |= u;
                    !u && !s.is_busy()
                })
                .min_by_key(|(_, s)| (s.eviction_rank(), s.accepted))
                .map(|(i, _)| i);
            match victim {
                Some(i) => {
                    let evicted = open.swap_remove(i);
                    evicted.evict.cancel();
                }
                None if unread => return Admission::Wait,
                None => return Admission::Refused,
            }
        }
        open.push(Arc::clone(slot));
        Admission::Admitted
    }

    fn remove(&self, slot: &Arc<Slot>) {
        let mut open = self.open.locked();
        if let Some(i) = open.iter().position(|s| Arc::ptr_eq(s, slot)) {
            open.swap_remove(i);
        }
        drop(open);
        self.changed.notify_one();
    }
}

async fn run(
    listener: TcpListener,
    router: Router,
    drain: Drain,
    header_read_timeout: Duration,
    cap: usize,
) -> io::Result<()> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout);
    let exiting = drain.exit_holds().exiting().clone();
    let slots = Arc::new(Slots::default());
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
            drain.clone(),
        );
        drain.exit_holds().spawn(conn);
    }
    Ok(())
}

async fn serve_conn(
    builder: auto::Builder<TokioExecutor>,
    stream: TcpStream,
    router: Router,
    slot: Arc<Slot>,
    slots: Arc<Slots>,
    seats: Arc<WaitSeats>,
    drain: Drain,
) {
    let _ = stream.set_nodelay(true);
    let exiting = drain.exit_holds().exiting().clone();
    let counted = Arc::clone(&slot);
    let svc = hyper::service::service_fn(move |mut req: Request<Incoming>| {
        counted.note_request(&req);
        req.extensions_mut().insert(Arc::clone(&seats));
        let busy = Busy::new(Arc::clone(&counted));
        let req = req.map(|body| Reading::new(body, Arc::clone(&counted)));
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
    // Set once the process is about to exit and an answer is still owed.
    let mut cut_at: Option<Instant> = None;
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
            () = exiting.cancelled(), if cut_at.is_none() => {
                if !slot.owes() {
                    // Nothing owed: idle, or a head or a body still arriving.
                    break;
                }
                // Finishes the answer (and writes it out), then closes; a peer that does not
                // take it does not hold the exit.
                conn.as_mut().graceful_shutdown();
                cut_at = Some(Instant::now() + DELIVERY_WAIT);
            }
            () = sleep_until_some(cut_at) => {
                if slot.owes() {
                    tracing::warn!(
                        peer = %slot.peer,
                        "lameduck: admin answer not taken by its peer at exit; connection cut"
                    );
                    drain.exit_holds().note_cut(slot.cut_at_exit());
                }
                break;
            }
        }
    }
    slots.remove(&slot);
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
    slots: &'a Slots,
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

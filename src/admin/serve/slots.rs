//! The admin connections as the cap sees them: one [`Slot`] per open connection, and the
//! [`AdminSlots`] that admit a new one by evicting the connection that owes least.

use super::*;

/// How long a connection that owes an answer when the process is about to exit may take to
/// deliver it before it is cut, at most: every answer is computed by then and small, so only a
/// peer that does not read needs longer. `run` sets a shorter bound for a short grace period
/// (a fifteenth of it, at least 100 ms, never past the hard deadline); this one applies where
/// it did not.
pub(super) const DELIVERY_WAIT: Duration = Duration::from_secs(2);

/// How long a computed answer must have waited for its peer to take it before the cap may
/// evict its connection: far longer than a reading peer's delivery of a small answer, even
/// on a loaded machine, and short enough that a peer keeping its window shut frees its slot
/// within a probe's timeout.
pub(super) const STUCK_DELIVERY: Duration = Duration::from_millis(500);

/// One open admin connection, as the cap sees it.
pub(super) struct Slot {
    pub(super) accepted: Instant,
    pub(super) peer: SocketAddr,
    /// Low half: requests whose response has not been fully handed to hyper yet (answers
    /// owed). High half: how many of those are waiting for their request body, which owes the
    /// client nothing yet. One word, so that one load sees both.
    pub(super) owed: AtomicU64,
    /// Answers computed whose body hyper has not taken yet (see the module docs).
    pub(super) delivering: AtomicU64,
    /// When `delivering` last rose from zero, in microseconds since `accepted` (+1; 0 = not
    /// delivering): a delivery younger than [`STUCK_DELIVERY`] is a peer that reads but whose
    /// task has not been polled yet, not one that keeps its window shut.
    pub(super) delivering_since: AtomicU64,
    /// Requests started on the connection so far.
    pub(super) started: AtomicUsize,
    /// The last request started, for the report when the connection is cut at exit.
    pub(super) last: Mutex<Option<LastRequest>>,
    /// Wake-ups of the connection's task by its socket (or its timers), counting acceptance
    /// as the first.
    pub(super) wakes: AtomicU64,
    /// The count of wake-ups the task had seen when its last poll of the connection ended.
    /// While it is behind `wakes`, the client may have sent bytes not read yet (a complete head
    /// makes the connection busy in the poll that reads it).
    pub(super) read: AtomicU64,
    pub(super) evict: CancellationToken,
}

pub(super) const OWED: u64 = 1;
pub(super) const READING: u64 = 1 << 32;

/// What the report names of a connection's last request.
pub(super) struct LastRequest {
    pub(super) line: String,
    pub(super) http2: bool,
    pub(super) at: Instant,
}

/// The longest request path kept for the report.
pub(super) const MAX_NAMED_PATH: usize = 128;

impl Slot {
    pub(super) fn new(peer: SocketAddr) -> Self {
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
    pub(super) fn is_unread(&self) -> bool {
        // `read` first: it never passes `wakes`, so a wake-up between the loads only makes the
        // answer `true`. Acquire: pairs with the Release in `Watched::poll`, so the state the
        // poll left (busy) is seen with it.
        let read = self.read.load(Ordering::Acquire);
        self.wakes.load(Ordering::Acquire) != read
    }

    /// The client may have sent its first request head, not read yet: the connection is not
    /// evicted before it is (a probe in a flood of silent connections).
    pub(super) fn is_unread_head(&self) -> bool {
        self.started.load(Ordering::Acquire) == 0 && self.is_unread()
    }

    /// An answer is being computed or written: the connection is neither evicted nor closed at
    /// exit before it is out.
    pub(super) fn is_busy(&self) -> bool {
        // Acquire: pairs with the Release of `Busy` and `OwedReading`, so a request that started
        // (or finished its body) is seen by the cap's eviction check.
        let v = self.owed.load(Ordering::Acquire);
        (v & (READING - 1)) > (v >> 32)
    }

    /// A computed answer has not been handed to hyper yet.
    pub(super) fn is_delivering(&self) -> bool {
        // Acquire: pairs with the Release of `Delivering`. Read after `owed` (see
        // `Busy::computed`), so an answer is seen busy or delivering, never neither.
        self.delivering.load(Ordering::Acquire) > 0
    }

    /// A computed answer has waited less than [`STUCK_DELIVERY`] to be taken: under a flood
    /// the connection's task may simply not have been polled since; it is not evicted yet.
    pub(super) fn is_delivering_recently(&self) -> bool {
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
    pub(super) fn owes(&self) -> bool {
        self.is_busy() || self.is_delivering()
    }

    /// Which connection the cap evicts first (lowest): idle keep-alive (it had its answers),
    /// then no request head yet or a next request not read yet, then answers waiting for the
    /// peer to take them.
    pub(super) fn eviction_rank(&self) -> u8 {
        if self.is_delivering() {
            2
        } else if self.started.load(Ordering::Acquire) == 0 || self.is_unread() {
            1
        } else {
            0
        }
    }

    pub(super) fn note_request<B>(&self, req: &Request<B>) {
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
    pub(super) fn cut_at_exit(&self, waited: Duration) -> Straggler {
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
            waited.as_millis()
        );
        let mut s = Straggler::new(StragglerKind::Response, name, since.elapsed());
        s.peer = Some(self.peer.to_string());
        s
    }
}

/// How a connection at the cap can make room.
pub(super) enum Admission {
    Admitted,
    /// Every connection is busy: the new one is refused.
    Refused,
    /// Nothing can be evicted before some connection has read what its client sent.
    Wait,
}

/// How long the accept loop waits for connections to read what their clients sent before it
/// gives up on the newest connection.
pub(super) const FRESH_WAIT: Duration = Duration::from_secs(1);

#[derive(Default)]
pub(super) struct AdminSlots {
    pub(super) open: Mutex<Vec<Arc<Slot>>>,
    /// A connection read what its client sent, or closed: room may have appeared.
    pub(super) changed: Notify,
}

impl AdminSlots {
    /// Makes room for `slot`, evicting the connection that owes least: first an idle
    /// keep-alive connection (it had its answers), then one that has not delivered a request
    /// head, then one whose answers wait for its peer to take them, oldest first. Never a busy
    /// one, and never one whose task has not yet read what its client sent: a probe in a flood
    /// of silent connections has its head read before anything can evict it, however long its
    /// task waits for a thread.
    pub(super) fn admit(&self, slot: &Arc<Slot>, cap: usize) -> Admission {
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

    pub(super) fn remove(&self, slot: &Arc<Slot>) {
        let mut open = self.open.locked();
        if let Some(i) = open.iter().position(|s| Arc::ptr_eq(s, slot)) {
            open.swap_remove(i);
        }
        drop(open);
        self.changed.notify_one();
    }
}

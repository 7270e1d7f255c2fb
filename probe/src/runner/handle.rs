//! [`ProbeHandle`]: how a run is told to stop, and the live counters its progress line reads.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::record::Outcome;

/// Controls a running probe and reads its progress; cheap to clone.
#[derive(Debug, Clone)]
pub struct ProbeHandle {
    inner: Arc<HandleInner>,
}

#[derive(Debug)]
struct HandleInner {
    /// `Running` → `StopSending` → `Abort`; only ever moves forward.
    control: watch::Sender<Control>,
    stats: Stats,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Control {
    Running,
    StopSending,
    Abort,
}

/// Live counters. Relaxed everywhere: they are statistics read for display, and the final
/// numbers come from the records, not from here.
#[derive(Debug, Default)]
pub(super) struct Stats {
    started: Mutex<Option<Instant>>,
    sent: AtomicU64,
    succeeded: AtomicU64,
    failed: AtomicU64,
    unfinished: AtomicU64,
    in_flight: AtomicU64,
    not_sent: AtomicU64,
    draining_reused: AtomicU64,
    draining_new: AtomicU64,
    connections_opened: Arc<AtomicU64>,
    sending_done: AtomicBool,
}

impl Stats {
    pub(super) fn mark_serving(&self, origin: Instant) {
        *self.started.lock().expect("stats lock") = Some(origin);
    }

    /// The counter the connection pool adds its openings to.
    pub(super) fn connections_opened(&self) -> Arc<AtomicU64> {
        self.connections_opened.clone()
    }

    /// A request task was spawned.
    pub(super) fn request_sent(&self) {
        self.sent.fetch_add(1, Ordering::Relaxed);
        self.in_flight.fetch_add(1, Ordering::Relaxed);
    }

    /// A request was not sent: the in-flight cap was reached.
    pub(super) fn request_not_sent(&self) {
        self.not_sent.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn not_sent(&self) -> u64 {
        self.not_sent.load(Ordering::Relaxed)
    }

    /// A request ended with `outcome`; `draining` says whether a draining instance answered,
    /// and on which kind of connection.
    pub(super) fn request_ended(&self, outcome: Outcome, draining: Option<bool>) {
        match outcome {
            Outcome::Ok => &self.succeeded,
            Outcome::Failed => &self.failed,
            Outcome::Unfinished => &self.unfinished,
        }
        .fetch_add(1, Ordering::Relaxed);
        match draining {
            Some(true) => self.draining_reused.fetch_add(1, Ordering::Relaxed),
            Some(false) => self.draining_new.fetch_add(1, Ordering::Relaxed),
            None => 0,
        };
    }

    /// The request's record is stored: it no longer counts as in flight.
    pub(super) fn request_stored(&self) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
    }

    pub(super) fn sending_done(&self) {
        self.sending_done.store(true, Ordering::Relaxed);
    }
}

/// A snapshot of a running probe, for a progress line.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Progress {
    /// Since the run started.
    pub elapsed: Duration,
    /// Requests started.
    pub sent: u64,
    /// Requests that ended `ok`.
    pub succeeded: u64,
    /// Requests that ended `failed`.
    pub failed: u64,
    /// Requests recorded `unfinished` (only at the end).
    pub unfinished: u64,
    /// Requests running now.
    pub in_flight: u64,
    /// Requests skipped because `max_in_flight` were running.
    pub not_sent: u64,
    /// Requests answered by a draining instance on a reused connection.
    pub draining_reused: u64,
    /// Requests answered by a draining instance on a new connection.
    pub draining_new: u64,
    /// Connections opened.
    pub connections_opened: u64,
    /// `true` once sending has stopped and the probe waits for running requests.
    pub sending_done: bool,
}

impl Progress {
    /// One line for a terminal:
    /// `  12s  sent 265  ok 263  failed 0  in flight 2  conns 4  draining: 17 reused, 1 new`.
    pub fn line(&self) -> String {
        let mut line = format!(
            "{:>5}s  sent {}  ok {}  failed {}  in flight {}  conns {}  draining: {} reused, {} new",
            self.elapsed.as_secs(),
            self.sent,
            self.succeeded,
            self.failed,
            self.in_flight,
            self.connections_opened,
            self.draining_reused,
            self.draining_new
        );
        if self.not_sent > 0 {
            line.push_str(&format!("  not sent {}", self.not_sent));
        }
        if self.sending_done && self.in_flight > 0 {
            line.push_str("  (waiting for running requests)");
        }
        line
    }
}

impl ProbeHandle {
    pub(super) fn new() -> Self {
        ProbeHandle {
            inner: Arc::new(HandleInner {
                control: watch::Sender::new(Control::Running),
                stats: Stats::default(),
            }),
        }
    }

    /// Stops sending new requests; requests still running get `drain_wait` to finish, then
    /// the run ends as it would at the end of `duration`. Idempotent.
    pub fn stop(&self) {
        self.advance(Control::StopSending);
    }

    /// Stops sending and stops waiting: requests still running are recorded `unfinished` at
    /// once and the run ends. Idempotent.
    pub fn abort(&self) {
        self.advance(Control::Abort);
    }

    /// Where the run is told to be, and every later change.
    pub(super) fn control(&self) -> watch::Receiver<Control> {
        self.inner.control.subscribe()
    }

    /// `true` once [`stop`](Self::stop) or [`abort`](Self::abort) was called.
    pub(super) fn stopping(&self) -> bool {
        *self.inner.control.borrow() >= Control::StopSending
    }

    pub(super) fn stats(&self) -> &Stats {
        &self.inner.stats
    }

    fn advance(&self, to: Control) {
        self.inner.control.send_if_modified(|now| {
            if *now < to {
                *now = to;
                true
            } else {
                false
            }
        });
    }

    /// What the probe has done so far.
    pub fn progress(&self) -> Progress {
        let s = &self.inner.stats;
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Progress {
            elapsed: s
                .started
                .lock()
                .expect("stats lock")
                .map_or(Duration::ZERO, |t| t.elapsed()),
            sent: r(&s.sent),
            succeeded: r(&s.succeeded),
            failed: r(&s.failed),
            unfinished: r(&s.unfinished),
            in_flight: r(&s.in_flight),
            not_sent: r(&s.not_sent),
            draining_reused: r(&s.draining_reused),
            draining_new: r(&s.draining_new),
            connections_opened: r(&s.connections_opened),
            sending_done: s.sending_done.load(Ordering::Relaxed),
        }
    }
}

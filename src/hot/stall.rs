//! Connections whose response bytes wait for a slow peer: the registry behind the
//! `response` stragglers.
//!
//! # Invariants
//!
//! * An entry exists only while its connection holds an in-flight guard for a pending write,
//!   and only once the drain has started: while Serving a stalled write costs one guard (one
//!   atomic operation each way) and nothing here.
//! * Entries are keyed by the process-unique connection id and their kind; a connection has at
//!   most one of each.
//! * The byte count is written by the connection's own task only, read here at the deadline:
//!   a gauge, so `Relaxed` is enough.

// Only the accept loop of the `http` feature writes it; every build reads it into the report.
#![cfg_attr(not(feature = "http"), allow(dead_code))]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::time::Instant;

use crate::vocab::sync::MutexExt;

/// One connection with response bytes not yet delivered, as the straggler list names it.
#[derive(Debug)]
pub(crate) struct StalledWrite {
    pub(crate) conn: u64,
    /// `true` for an HTTP/2 connection still open after its GOAWAY (its streams may hold data
    /// queued behind the peer's flow-control window, which never reaches the socket); `false`
    /// for a write the socket could not take.
    pub(crate) after_goaway: bool,
    pub(crate) peer: Option<SocketAddr>,
    /// When the write that is still pending first could not complete.
    pub(crate) since: Instant,
    /// Bytes written on the connection so far (all responses).
    pub(crate) written: AtomicU64,
}

impl StalledWrite {
    pub(crate) fn written(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }

    /// The straggler's name.
    pub(crate) fn describe(&self) -> String {
        let peer = self
            .peer
            .map_or_else(|| "an unknown peer".to_owned(), |p| p.to_string());
        if self.after_goaway {
            format!(
                "HTTP/2 connection {} from {peer} still sending its responses after GOAWAY",
                self.conn
            )
        } else {
            format!(
                "response to {peer} not delivered: {} bytes written on connection {}",
                self.written(),
                self.conn
            )
        }
    }
}

/// The registry of stalled writes while draining.
#[derive(Debug, Default)]
pub(crate) struct Stalls {
    entries: Mutex<BTreeMap<(u64, bool), Arc<StalledWrite>>>,
}

impl Stalls {
    /// Names connection `conn` (from `peer`, `written` bytes so far) as a stalled write from
    /// now on, until [`unregister`](Self::unregister). Written by the accept loop of the `http`
    /// feature only.
    pub(crate) fn register(
        &self,
        conn: u64,
        after_goaway: bool,
        peer: Option<SocketAddr>,
        written: u64,
    ) -> Arc<StalledWrite> {
        let entry = Arc::new(StalledWrite {
            conn,
            after_goaway,
            peer,
            since: Instant::now(),
            written: written.into(),
        });
        self.lock().insert((conn, after_goaway), Arc::clone(&entry));
        entry
    }

    pub(crate) fn unregister(&self, entry: &StalledWrite) {
        self.lock().remove(&(entry.conn, entry.after_goaway));
    }

    /// The stalled writes now, oldest connection first.
    /// The `keep` oldest stalled writes, and how many there are.
    pub(crate) fn oldest(&self, keep: usize) -> (Vec<Arc<StalledWrite>>, usize) {
        let entries = self.lock();
        let oldest = crate::vocab::sync::oldest(entries.values(), keep, |w| w.since);
        (oldest.into_iter().cloned().collect(), entries.len())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<(u64, bool), Arc<StalledWrite>>> {
        // Every write is a single insert or remove: a panic cannot leave it half-done.
        self.entries.locked()
    }
}

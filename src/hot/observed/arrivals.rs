//! The arrival table: per path (a peer address), which recent slots of [`SLOT`] saw a new
//! connection or a request, written lock-free on every connection and the first request of a
//! slot; the propagation evidence reads it. See the [parent module](super) for the invariants.
//!
//! # The rows
//!
//! A row belongs to one peer while that peer is *live*: it has a connection open, or sent
//! something in the last ring-turn ([`RING`] slots, 32 s, longer than the evidence window).
//! A peer that has been silent that long and holds no connection gives its row up to the next
//! new peer — while Serving only: from the trigger on, the rows the drain's evidence reads stay
//! as they are. Only when more peers are live at once than there are rows do the rest share
//! one row, [`PathId::OTHER`], with connections of no known peer; the evidence never lets that
//! row prove a silence (its peers' rates are mixed: a dense peer's silence would prove nothing
//! about a sparse one behind it).
//!
//! Each row's owner and its open connections are one atomic word, `key << 24 | open`: a
//! connection joins its peer's row by a compare-exchange that checks the key and counts itself
//! in one step, and a row is taken over by one that checks "no connection open" and swaps the
//! key in one step, so a connection is never counted on a row that changed owner under it.
//! Taking a row (a new peer's) is serialised by a lock; finding one's row is lock-free.

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::vocab::sync::MutexExt;

mod row;

use row::{key_of, Row};

/// The length of one slot of the arrival ring.
pub(crate) const SLOT: Duration = Duration::from_millis(250);
/// Ring entries: more than the evidence window, so the trigger's slot never overwrites one of
/// it. Also how long a peer without an open connection keeps its row after its last arrival.
pub(crate) const RING: usize = 128;

/// Slots in a second, the bucket of the request counts.
pub(crate) const SLOTS_PER_SECOND: u64 = 4;
/// Seconds of request counts kept per path: the evidence window (at most a ring-turn, 32 s)
/// and as long again, in which kept connections still hand in what they counted before the
/// trigger.
pub(crate) const SECONDS: usize = 64;

/// The tag of the second `slot` is in: the second + 1 (0 = never written).
#[inline]
pub(crate) fn second_tag(slot: u64) -> u32 {
    (slot / SLOTS_PER_SECOND + 1) as u32
}

/// Paths the arrival evidence tells apart: one row per live peer address, up to `PATHS − 1`
/// of them, and one row, [`PathId::OTHER`], for the rest (and for connections of no known
/// peer).
pub(crate) const PATHS: usize = 64;

/// The bits of a row's state word that count its open connections (16 million).
const OPEN_BITS: u32 = 24;
const OPEN_MASK: u64 = (1 << OPEN_BITS) - 1;
/// A row's key while it is being (re)assigned: no peer's key (theirs are odd).
const TAKING: u64 = 2;

/// A row of [`Arrivals`]: the path a connection's arrivals are counted on. Resolved once per
/// connection; each of its requests is counted on it without a lookup.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct PathId(u8);

impl PathId {
    /// The shared row: peers beyond the table, and connections of no known peer.
    pub(crate) const OTHER: PathId = PathId(PATHS as u8 - 1);

    pub(crate) fn index(self) -> usize {
        usize::from(self.0)
    }
}

/// Which slots saw activity — a new connection, or a request — per path.
///
/// Each ring entry holds `(slot + 1) << 2 | fresh << 1 | connection` for the latest slot that
/// wrote it, so `fetch_max` keeps the newest slot, and within one slot a connection over a
/// request. *Fresh* marks a slot in which a connection was accepted that then closed while
/// Serving after a few requests (four at most): a connection of a fresh-connection client, not one a pool still keeps (a pool's
/// connections are open at the trigger, and a burst of them when the pool was made is not a
/// rate of new connections).
#[derive(Debug)]
pub(crate) struct Arrivals {
    /// Boxed: the rows are most of a coordinator's leaked block, and `Core` stays small.
    rows: Box<[Row; PATHS]>,
    /// Serialises giving rows to new peers, so that two first connections of one peer take
    /// one row, not two. Never held by a connection whose peer has a row.
    taking: Mutex<()>,
    /// Set at the trigger: rows keep their owners from then on (the evidence reads them).
    frozen: AtomicBool,
    /// Nanoseconds since `Observed::base` + 1 of when connections started to be counted; 0 = no
    /// source of connection data (neither `serve` nor `ConnMeta` through `axum::serve`).
    observing_since: AtomicU64,
    /// At least one request was counted (not only connections).
    requests_seen: AtomicBool,
}

/// A ring entry's slot part: `slot + 1` in 30 bits (0 = never written).
#[inline]
fn entry(slot: u64) -> u32 {
    ((slot + 1) & 0x3fff_ffff) as u32
}

/// What one slot of a path saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Activity {
    /// A new connection or a request.
    pub(crate) active: bool,
    /// A new connection.
    pub(crate) connection: bool,
    /// A new connection that closed while Serving.
    pub(crate) fresh: bool,
}

const _: () = assert!(PATHS <= 256, "a PathId is a u8");

impl Arrivals {
    pub(crate) fn new() -> Self {
        Self {
            rows: Box::new(std::array::from_fn(|_| Row::new())),
            taking: Mutex::new(()),
            frozen: AtomicBool::new(false),
            observing_since: AtomicU64::new(0),
            requests_seen: AtomicBool::new(false),
        }
    }

    /// A new connection of `peer` in `slot`: its row, with the connection counted open on it
    /// until [`closed`](Self::closed), and its arrival recorded. [`PathId::OTHER`] without a
    /// peer, or while every row has a live owner. Once per connection: a few relaxed loads
    /// and a compare-exchange; a new peer's first connection also takes a short lock.
    pub(crate) fn open(&self, peer: Option<IpAddr>, slot: u64) -> PathId {
        let path = match peer {
            None => PathId::OTHER,
            Some(ip) => {
                let key = key_of(ip);
                self.find(key)
                    .or_else(|| self.take(key, ip, slot))
                    .unwrap_or(PathId::OTHER)
            }
        };
        if path == PathId::OTHER {
            // Relaxed: a count read at the trigger; the shared row never changes owner.
            self.rows[path.index()].owner.join_any();
        }
        self.record(path, slot);
        path
    }

    /// The row `key` owns, joined (one more connection open on it).
    fn find(&self, key: u64) -> Option<PathId> {
        let keyed = PATHS - 1;
        let start = (key >> 1) as usize % keyed;
        for i in (start..keyed).chain(0..start) {
            let row = &self.rows[i];
            if row.owner.join(key) {
                return Some(PathId(i as u8));
            }
            // Rows are taken from the start of each peer's sequence and never freed: a free
            // one means the key is nowhere after it.
            if row.owner.key() == 0 {
                return None;
            }
        }
        None
    }

    /// A row for a new peer: the first free one in its sequence, else (while Serving) the
    /// one whose owner has been silent longest past a ring-turn with nothing open.
    #[cold]
    fn take(&self, key: u64, ip: IpAddr, slot: u64) -> Option<PathId> {
        let _one_at_a_time = self.taking.locked();
        // Another first connection of the same peer may have taken one meanwhile.
        if let Some(p) = self.find(key) {
            return Some(p);
        }
        let keyed = PATHS - 1;
        let start = (key >> 1) as usize % keyed;
        let frozen = self.frozen.load(Ordering::Relaxed);
        loop {
            let mut best: Option<(usize, u64)> = None;
            for i in (start..keyed).chain(0..start) {
                let row = &self.rows[i];
                if row.owner.key() == 0 {
                    best = Some((i, 0));
                    break;
                }
                if frozen || !row.reusable(slot) {
                    continue;
                }
                let last = row.last.load(Ordering::Relaxed);
                if best.is_none_or(|(_, l)| last < l) {
                    best = Some((i, last));
                }
            }
            let (i, _) = best?;
            if self.rows[i].take(key, ip, slot) {
                return Some(PathId(i as u8));
            }
            // Its owner connected again just now: look for another.
        }
    }

    /// Rows keep their owners from now on: the drain's evidence reads them by row.
    pub(crate) fn freeze(&self) {
        self.frozen.store(true, Ordering::Relaxed);
    }

    /// The paths in use, with their peer address (`None` for [`PathId::OTHER`]).
    pub(crate) fn paths(&self) -> impl Iterator<Item = (PathId, Option<IpAddr>)> + '_ {
        self.rows.iter().enumerate().filter_map(|(i, row)| {
            let id = PathId(i as u8);
            if id == PathId::OTHER {
                Some((id, None))
            } else {
                match row.owner.key() {
                    0 | TAKING => None,
                    _ => Some((id, *row.peer.locked())),
                }
            }
        })
    }

    /// Counts one new connection of `path` in slot `slot`. One relaxed atomic operation on
    /// the ring entry (the value is read by the driver, which tolerates a slot seen a moment
    /// late) and one on the row's last activity.
    #[inline]
    pub(crate) fn record(&self, path: PathId, slot: u64) {
        let row = &self.rows[path.index()];
        row.ring[(slot % RING as u64) as usize]
            .fetch_max((entry(slot) << 2) | 1, Ordering::Relaxed);
        row.last.fetch_max(slot + 1, Ordering::Relaxed);
    }

    /// Counts one request of `path` in `slot`. While the slot's entry already says so (every
    /// request after the first of each slot), one relaxed load of the entry, no write.
    #[inline]
    pub(crate) fn note_request(&self, path: PathId, slot: u64) {
        let entry_ref = &self.rows[path.index()].ring[(slot % RING as u64) as usize];
        let v = entry(slot) << 2;
        // Relaxed: read by the driver, which tolerates a slot seen a moment late.
        if entry_ref.load(Ordering::Relaxed) < v {
            self.note_request_slow(path, slot);
        }
    }

    /// The first request of a slot: two arguments, as few as the fast path has to pass.
    #[cold]
    #[inline(never)]
    fn note_request_slow(&self, path: PathId, slot: u64) {
        let row = &self.rows[path.index()];
        row.ring[(slot % RING as u64) as usize].fetch_max(entry(slot) << 2, Ordering::Relaxed);
        row.last.fetch_max(slot + 1, Ordering::Relaxed);
        if !self.requests_seen.load(Ordering::Relaxed) {
            self.requests_seen.store(true, Ordering::Relaxed);
        }
    }

    /// Adds `n` requests of `path` to the second tagged `tag` (see [`second_tag`]): once per
    /// connection and second, by its [`RequestTally`].
    pub(crate) fn count_requests(&self, path: PathId, tag: u32, n: u32) {
        self.rows[path.index()].requests[tag as usize % SECONDS].add(tag, n);
    }

    /// The requests of `path` counted in the seconds `seconds` (a second whose bucket a later
    /// one took over reads as 0: ask within [`SECONDS`] of them).
    pub(crate) fn requests_in(&self, path: PathId, seconds: std::ops::Range<u64>) -> u64 {
        let row = &self.rows[path.index()];
        seconds
            .map(|s| {
                let tag = (s + 1) as u32;
                u64::from(row.requests[tag as usize % SECONDS].read(tag))
            })
            .sum()
    }

    /// A connection of `path` closed: the last thing it writes on the row, which may then go
    /// to another peer.
    #[inline]
    pub(crate) fn closed(&self, path: PathId) {
        self.rows[path.index()].owner.leave();
    }

    /// The latest slot (+1) with a connection or a request on `path` (0: none).
    pub(crate) fn last_active(&self, path: PathId) -> u64 {
        self.rows[path.index()].last.load(Ordering::Relaxed)
    }

    /// Connections of `path` open now.
    pub(crate) fn open_count(&self, path: PathId) -> u32 {
        self.rows[path.index()].owner.open()
    }

    /// A new connection of `path` after the drain started, at `stamp` (see `Observed`).
    pub(crate) fn after_drain(&self, path: PathId, stamp: u64) {
        let row = &self.rows[path.index()];
        row.after.fetch_add(1, Ordering::Relaxed);
        row.last_after.fetch_max(stamp, Ordering::Relaxed);
    }

    /// New connections of `path` since the drain started, and the stamp of the last (0 =
    /// none).
    pub(crate) fn after(&self, path: PathId) -> (u32, u64) {
        let row = &self.rows[path.index()];
        (
            row.after.load(Ordering::Relaxed),
            row.last_after.load(Ordering::Relaxed),
        )
    }

    /// A connection of `path` open at the drain's start was told to close (or closed)
    /// `after` the start.
    pub(crate) fn told(&self, path: PathId, after: Duration) {
        let row = &self.rows[path.index()];
        row.told_us
            .fetch_add(after.as_micros() as u64, Ordering::Relaxed);
        row.told.fetch_add(1, Ordering::Relaxed);
    }

    /// A connection of `path` open at the drain's start had been kept alive (see [`Row`]'s
    /// `kept`), as seen when it was told to close or closed.
    pub(crate) fn kept(&self, path: PathId) {
        self.rows[path.index()].kept.fetch_add(1, Ordering::Relaxed);
    }

    /// How many of `path`'s connections open at the drain's start were seen kept alive.
    pub(crate) fn kept_count(&self, path: PathId) -> u32 {
        self.rows[path.index()].kept.load(Ordering::Relaxed)
    }

    /// A connection of `path` open at the drain's start closed before being told to.
    pub(crate) fn left(&self, path: PathId) {
        self.rows[path.index()].left.fetch_add(1, Ordering::Relaxed);
    }

    /// How many of `path`'s connections open at the drain's start closed before being told to.
    pub(crate) fn left_count(&self, path: PathId) -> u32 {
        self.rows[path.index()].left.load(Ordering::Relaxed)
    }

    /// How many of `path`'s connections open at the drain's start were told to close, and
    /// the sum of how long after the start.
    pub(crate) fn told_sum(&self, path: PathId) -> (u32, Duration) {
        let row = &self.rows[path.index()];
        (
            row.told.load(Ordering::Relaxed),
            Duration::from_micros(row.told_us.load(Ordering::Relaxed)),
        )
    }

    /// Connection data is available from `stamp` on (the first caller wins).
    pub(crate) fn observe_from(&self, stamp: u64) {
        // A plain load first: after the first connection this is never written again.
        if self.observing_since.load(Ordering::Relaxed) == 0 {
            let _ = self.observing_since.compare_exchange(
                0,
                stamp,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
    }

    pub(crate) fn observing_since(&self) -> u64 {
        self.observing_since.load(Ordering::Relaxed)
    }

    /// What `slot` saw on `path`. An entry from another ring-turn reads as nothing.
    pub(crate) fn activity(&self, path: PathId, slot: u64) -> Activity {
        let v = self.rows[path.index()].ring[(slot % RING as u64) as usize].load(Ordering::Relaxed);
        if v >> 2 == entry(slot) {
            Activity {
                active: true,
                connection: v & 1 == 1,
                fresh: v & 2 == 2,
            }
        } else {
            Activity::default()
        }
    }

    /// A connection of `path` accepted in `slot` closed while Serving: marks the slot fresh
    /// (unless the ring turned since).
    pub(crate) fn closed_fresh(&self, path: PathId, slot: u64) {
        self.rows[path.index()].ring[(slot % RING as u64) as usize]
            .fetch_max((entry(slot) << 2) | 3, Ordering::Relaxed);
    }

    pub(crate) fn requests_seen(&self) -> bool {
        self.requests_seen.load(Ordering::Relaxed)
    }
}

/// The slot of `t`, counted from `base`. No 128-bit division: it runs on every request.
#[inline]
pub(crate) fn slot_of(base: Instant, t: Instant) -> u64 {
    const PER_SEC: u64 = 1_000_000_000 / SLOT.as_nanos() as u64;
    let d = t.saturating_duration_since(base);
    d.as_secs() * PER_SEC + u64::from(d.subsec_nanos() / SLOT.as_nanos() as u32)
}

const _: () = assert!(
    1_000_000_000 % SLOT.as_nanos() == 0,
    "a slot divides a second"
);

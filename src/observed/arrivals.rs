//! The arrival ring: per path (a peer address), which recent slots of [`SLOT`] saw a new
//! connection or a request, written lock-free on every connection and the first request of a
//! slot; the propagation evidence reads it. See the [parent module](super) for the invariants.

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use tokio::time::Instant;

/// The length of one slot of the arrival ring.
pub(crate) const SLOT: Duration = Duration::from_millis(250);
/// Ring entries: more than the evidence window, so the trigger's slot never overwrites one of
/// it.
pub(crate) const RING: usize = 128;

/// Paths the arrival evidence tells apart: one row per peer address, up to `PATHS − 1` of them,
/// and one row, [`PathId::OTHER`], for the rest (and for connections of no known peer).
pub(crate) const PATHS: usize = 16;

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

/// One path's counts.
#[derive(Debug)]
struct Row {
    /// A hash of the peer address with its low bit set; 0 = free. Claimed once, never freed
    /// (a coordinator lives as long as its process).
    key: AtomicU64,
    peer: OnceLock<IpAddr>,
    /// Which recent slots saw activity: `(slot + 1) << 2 | fresh << 1 | connection` of the
    /// latest slot that wrote the entry (32 bits: slots of 250 ms wrap after 8 years of
    /// serving).
    ring: [AtomicU32; RING],
    /// Connections of this path open now.
    open: AtomicU32,
    /// New connections since the drain started, and the stamp of the last (0 = none).
    after: AtomicU32,
    last_after: AtomicU64,
    /// Connections open at the drain's start that have since been told to close (their first
    /// response after it said `Connection: close`, a GOAWAY, or they closed), and the sum of
    /// how long after the start that came, in microseconds: how fast the path's kept
    /// connections are used.
    told: AtomicU32,
    told_us: AtomicU64,
    /// Connections open at the drain's start that closed since, by the client's own doing,
    /// before being told to close: a request in flight at the start whose client then left
    /// (a fresh connection), or a pool's idle timeout. No reconnect of the drain's making.
    left: AtomicU32,
    /// Connections open at the drain's start that had carried more requests than a fresh
    /// connection does when they were told to close or closed: kept alive by a client that
    /// reuses them (a pool), which opens new ones when its own demand needs them.
    kept: AtomicU32,
}

impl Row {
    fn new() -> Self {
        Self {
            key: AtomicU64::new(0),
            peer: OnceLock::new(),
            ring: std::array::from_fn(|_| AtomicU32::new(0)),
            open: AtomicU32::new(0),
            after: AtomicU32::new(0),
            last_after: AtomicU64::new(0),
            told: AtomicU32::new(0),
            told_us: AtomicU64::new(0),
            left: AtomicU32::new(0),
            kept: AtomicU32::new(0),
        }
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

/// A hash of `ip` with its low bit set (0 marks a free row). Deterministic: a peer cannot
/// pick its row, and two peers sharing one only merge their evidence.
fn key_of(ip: IpAddr) -> u64 {
    let bits: u128 = match ip.to_canonical() {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6) ^ (1 << 127),
    };
    let mix = |mut z: u64| {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    mix(mix(bits as u64) ^ (bits >> 64) as u64) | 1
}

impl Arrivals {
    pub(crate) fn new() -> Self {
        Self {
            rows: Box::new(std::array::from_fn(|_| Row::new())),
            observing_since: AtomicU64::new(0),
            requests_seen: AtomicBool::new(false),
        }
    }

    /// The row of `peer`, claimed on its first connection; [`PathId::OTHER`] without a peer
    /// or once every row is taken. Once per connection: a few relaxed loads, a
    /// compare-exchange for a peer's first.
    pub(crate) fn path_of(&self, peer: Option<IpAddr>) -> PathId {
        let Some(ip) = peer else {
            return PathId::OTHER;
        };
        let key = key_of(ip);
        let keyed = PATHS - 1;
        let start = (key >> 1) as usize % keyed;
        for i in (start..keyed).chain(0..start) {
            let row = &self.rows[i];
            // Relaxed: the key alone identifies the row; the peer address is for the report.
            let mut current = row.key.load(Ordering::Relaxed);
            if current == 0 {
                match row
                    .key
                    .compare_exchange(0, key, Ordering::Relaxed, Ordering::Relaxed)
                {
                    Ok(_) => {
                        let _ = row.peer.set(ip.to_canonical());
                        return PathId(i as u8);
                    }
                    Err(now) => current = now,
                }
            }
            if current == key {
                return PathId(i as u8);
            }
        }
        PathId::OTHER
    }

    /// The paths in use, with their peer address (`None` for [`PathId::OTHER`]).
    pub(crate) fn paths(&self) -> impl Iterator<Item = (PathId, Option<IpAddr>)> + '_ {
        self.rows.iter().enumerate().filter_map(|(i, row)| {
            let id = PathId(i as u8);
            if id == PathId::OTHER {
                Some((id, None))
            } else if row.key.load(Ordering::Relaxed) != 0 {
                Some((id, row.peer.get().copied()))
            } else {
                None
            }
        })
    }

    /// Counts one new connection of `path` in slot `slot`. One relaxed atomic operation: the
    /// value is read by the driver, which tolerates a slot seen a moment late.
    #[inline]
    pub(crate) fn record(&self, path: PathId, slot: u64) {
        self.rows[path.index()].ring[(slot % RING as u64) as usize]
            .fetch_max((entry(slot) << 2) | 1, Ordering::Relaxed);
    }

    /// Counts one request of `path` in `slot`. While the slot's entry already says so (every
    /// request after the first of each slot), one relaxed load of the entry, no write.
    #[inline]
    pub(crate) fn note_request(&self, path: PathId, slot: u64) {
        let entry_ref = &self.rows[path.index()].ring[(slot % RING as u64) as usize];
        let v = entry(slot) << 2;
        // Relaxed: read by the driver, which tolerates a slot seen a moment late.
        if entry_ref.load(Ordering::Relaxed) < v {
            self.note_request_slow(entry_ref, v);
        }
    }

    /// The first request of a slot.
    #[cold]
    #[inline(never)]
    fn note_request_slow(&self, entry: &AtomicU32, v: u32) {
        entry.fetch_max(v, Ordering::Relaxed);
        if !self.requests_seen.load(Ordering::Relaxed) {
            self.requests_seen.store(true, Ordering::Relaxed);
        }
    }

    /// A connection of `path` opened (counted until [`closed`](Self::closed)).
    #[inline]
    pub(crate) fn opened(&self, path: PathId) {
        // Relaxed: a gauge read at the trigger; nothing synchronises through it.
        self.rows[path.index()].open.fetch_add(1, Ordering::Relaxed);
    }

    /// A connection of `path` closed.
    #[inline]
    pub(crate) fn closed(&self, path: PathId) {
        self.rows[path.index()].open.fetch_sub(1, Ordering::Relaxed);
    }

    /// Connections of `path` open now.
    pub(crate) fn open(&self, path: PathId) -> u32 {
        self.rows[path.index()].open.load(Ordering::Relaxed)
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

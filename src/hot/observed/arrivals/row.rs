//! One row of the arrival table: its owner and open connections in one word, its ring, its
//! counts since the drain started; how a connection joins it and a new peer takes it over.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;

use super::{OPEN_BITS, OPEN_MASK, RING, SECONDS, TAKING};
use crate::vocab::sync::MutexExt;

/// A row's owner and the connections open on it, in one word: `key << 24 | open`. The key
/// is a hash of the owner's address (odd), 0 while the row is free, [`TAKING`] while it is
/// being given to a new owner.
///
/// # Invariants (modelled with loom)
///
/// * A connection joins only a row its key owns, and counts itself in the same step
///   ([`join`](Self::join)): a row cannot change owner between the check and the count.
/// * A row changes owner only with no connection open ([`seize`](Self::seize)), and
///   everything its connections wrote (each released as it left) happens before the new
///   owner clears it; what the new owner cleared happens before its connections' writes
///   ([`hand_to`](Self::hand_to) releases, `join` acquires).
#[derive(Debug)]
pub(super) struct Owner(crate::hot::loom::AtomicU64);

impl Owner {
    pub(super) fn new() -> Self {
        Self(crate::hot::loom::AtomicU64::new(0))
    }

    fn load(&self) -> u64 {
        self.0.load(crate::hot::loom::Ordering::Relaxed)
    }

    /// The owner's key (0: free; [`TAKING`]: being given).
    pub(super) fn key(&self) -> u64 {
        self.load() >> OPEN_BITS
    }

    /// Connections open on the row now.
    pub(super) fn open(&self) -> u32 {
        (self.load() & OPEN_MASK) as u32
    }

    /// Counts one more connection on the row if `key` owns it.
    pub(super) fn join(&self, key: u64) -> bool {
        let mut s = self.load();
        while s >> OPEN_BITS == key {
            // Acquire: the connection's writes come after it joined, so after whatever the
            // row's (re)assignment wrote before publishing the key (Release).
            match self.0.compare_exchange_weak(
                s,
                s + 1,
                crate::hot::loom::Ordering::Acquire,
                crate::hot::loom::Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(now) => s = now,
            }
        }
        false
    }

    /// Counts one more connection on a row that never changes owner (the shared one).
    pub(super) fn join_any(&self) {
        // Relaxed: a count read at the trigger; the shared row's writes need no order.
        self.0.fetch_add(1, crate::hot::loom::Ordering::Relaxed);
    }

    /// A connection left the row: the last thing it writes on it.
    pub(super) fn leave(&self) {
        // Release: this connection's writes on the row come before a new owner clears it.
        self.0.fetch_sub(1, crate::hot::loom::Ordering::Release);
    }

    /// Takes the row from its owner (or from nobody) if no connection is open on it; `false`
    /// when one is, or one joined first. The caller clears the row, then [`hand_to`]s it.
    ///
    /// [`hand_to`]: Self::hand_to
    pub(super) fn seize(&self) -> bool {
        let s = self.load();
        if s & OPEN_MASK != 0 || s >> OPEN_BITS == TAKING {
            return false;
        }
        // Acquire: the last connection's writes (each released as it left) are done before
        // the row is cleared. Only with nothing open: a connection joining at the same time
        // either counted itself first (this fails) or finds the key gone.
        self.0
            .compare_exchange(
                s,
                TAKING << OPEN_BITS,
                crate::hot::loom::Ordering::Acquire,
                crate::hot::loom::Ordering::Relaxed,
            )
            .is_ok()
    }

    /// Gives the seized row to `key` with one connection (the caller's) open on it.
    pub(super) fn hand_to(&self, key: u64) {
        // Release: a connection that joins by this key sees the row cleared.
        self.0
            .store(key << OPEN_BITS | 1, crate::hot::loom::Ordering::Release);
    }
}

/// One path's counts.
#[derive(Debug)]
pub(super) struct Row {
    /// The owner and the connections of this path open now.
    pub(super) owner: Owner,
    /// The owner's address, for the report; written only while the row is [`TAKING`].
    pub(super) peer: Mutex<Option<IpAddr>>,
    /// The latest slot (+1) with a connection or a request: how long the owner has been silent.
    pub(super) last: AtomicU64,
    /// Which recent slots saw activity: `(slot + 1) << 2 | fresh << 1 | connection` of the
    /// latest slot that wrote the entry (32 bits: slots of 250 ms wrap after 8 years of
    /// serving).
    pub(super) ring: [AtomicU32; RING],
    /// New connections since the drain started, and the stamp of the last (0 = none).
    pub(super) after: AtomicU32,
    pub(super) last_after: AtomicU64,
    /// Connections open at the drain's start that have since been told to close (their first
    /// response after it said `Connection: close`, a GOAWAY, or they closed), and the sum of
    /// how long after the start that came, in microseconds: how fast the path's kept
    /// connections are used.
    pub(super) told: AtomicU32,
    pub(super) told_us: AtomicU64,
    /// Connections open at the drain's start that closed since, by the client's own doing,
    /// before being told to close: a request in flight at the start whose client then left
    /// (a fresh connection), or a pool's idle timeout. No reconnect of the drain's making.
    pub(super) left: AtomicU32,
    /// Connections open at the drain's start that had carried more requests than a fresh
    /// connection does when they were told to close or closed: kept alive by a client that
    /// reuses them (a pool), which opens new ones when its own demand needs them.
    pub(super) kept: AtomicU32,
    /// Requests per second, as the connections hand them in (each once per second it was
    /// busy in): what the path's rate of requests was, where the ring only says which slots
    /// were busy.
    pub(super) requests: [SecondCount; SECONDS],
}

impl Row {
    pub(super) fn new() -> Self {
        Self {
            owner: Owner::new(),
            peer: Mutex::new(None),
            last: AtomicU64::new(0),
            ring: std::array::from_fn(|_| AtomicU32::new(0)),
            after: AtomicU32::new(0),
            last_after: AtomicU64::new(0),
            told: AtomicU32::new(0),
            told_us: AtomicU64::new(0),
            left: AtomicU32::new(0),
            kept: AtomicU32::new(0),
            requests: std::array::from_fn(|_| SecondCount::new()),
        }
    }

    /// Whether the row may go to a new peer at `slot`: free, or its owner holds no
    /// connection and has been silent for a ring-turn.
    pub(super) fn reusable(&self, slot: u64) -> bool {
        match self.owner.key() {
            0 => true,
            TAKING => false,
            _ => self.owner.open() == 0 && self.last.load(Ordering::Relaxed) + RING as u64 <= slot,
        }
    }

    /// Gives the row, seen [`reusable`](Self::reusable), to `ip` with one connection open on
    /// it; `false` when a connection of the owner came first.
    pub(super) fn take(&self, key: u64, ip: IpAddr, slot: u64) -> bool {
        if !self.owner.seize() {
            return false;
        }
        for e in &self.ring {
            e.store(0, Ordering::Relaxed);
        }
        for c in &self.requests {
            c.clear();
        }
        for c in [&self.after, &self.told, &self.left, &self.kept] {
            c.store(0, Ordering::Relaxed);
        }
        for c in [&self.last_after, &self.told_us] {
            c.store(0, Ordering::Relaxed);
        }
        self.last.store(slot + 1, Ordering::Relaxed);
        *self.peer.locked() = Some(ip);
        self.owner.hand_to(key);
        true
    }
}

/// The requests of a path counted in one second: `tag << 32 | count`, the tag the second + 1
/// (0: never written).
///
/// # Invariants (modelled with loom)
///
/// * No count is lost: two connections handing in the same second both land (a
///   compare-exchange, retried).
/// * A bucket holds one second: a newer second takes it over (its count starts afresh), and a
///   hand-in for an older second than the one it holds is dropped, not added to the newer.
#[derive(Debug)]
pub(super) struct SecondCount(crate::hot::loom::AtomicU64);

impl SecondCount {
    pub(super) fn new() -> Self {
        Self(crate::hot::loom::AtomicU64::new(0))
    }

    /// Adds `n` requests to the second tagged `tag`.
    pub(super) fn add(&self, tag: u32, n: u32) {
        use crate::hot::loom::Ordering::Relaxed;
        let mut held = self.0.load(Relaxed);
        loop {
            let next = match ((held >> 32) as u32).cmp(&tag) {
                std::cmp::Ordering::Equal => {
                    (held & !0xffff_ffff) | u64::from((held as u32).saturating_add(n))
                }
                std::cmp::Ordering::Less => u64::from(tag) << 32 | u64::from(n),
                std::cmp::Ordering::Greater => return,
            };
            match self.0.compare_exchange_weak(held, next, Relaxed, Relaxed) {
                Ok(_) => return,
                Err(now) => held = now,
            }
        }
    }

    /// The count of the second tagged `tag`, or 0 if the bucket holds another.
    pub(super) fn read(&self, tag: u32) -> u32 {
        let held = self.0.load(crate::hot::loom::Ordering::Relaxed);
        if (held >> 32) as u32 == tag {
            held as u32
        } else {
            0
        }
    }

    /// Empty, for a new owner of the row.
    pub(super) fn clear(&self) {
        self.0.store(0, crate::hot::loom::Ordering::Relaxed);
    }
}

/// A 40-bit hash of `ip`, odd (0 marks a free row, [`TAKING`] one being assigned).
/// Deterministic: a peer cannot pick its row, and two peers sharing a key (one chance in 2^39
/// for a pair) only share a row.
pub(super) fn key_of(ip: IpAddr) -> u64 {
    let bits: u128 = match ip.to_canonical() {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6) ^ (1 << 127),
    };
    let mix = |mut z: u64| {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    (mix(mix(bits as u64) ^ (bits >> 64) as u64) >> OPEN_BITS) | 1
}

#[cfg(all(test, lameduck_loom))]
mod loom_model {
    //! Model: a connection of the owner joins and writes while a new peer seizes, clears and
    //! takes the row; a write made while joined never lands after the clearing, and a
    //! connection that joined is never counted on the new owner's row.
    use super::Owner;
    use loom::sync::atomic::{AtomicU64, Ordering};
    use loom::sync::Arc;
    use loom::thread;

    const OLD: u64 = 3;
    const NEW: u64 = 5;

    #[test]
    fn loom_model_a_row_changes_owner_only_with_nothing_open() {
        loom::model(|| {
            let owner = Arc::new(Owner::new());
            owner.hand_to(OLD);
            owner.leave();
            // What the row holds for its owner: 1 written by a connection, 0 by the clearing.
            let data = Arc::new(AtomicU64::new(7));
            let (o, d) = (Arc::clone(&owner), Arc::clone(&data));
            let conn = thread::spawn(move || {
                if o.join(OLD) {
                    d.store(1, Ordering::Relaxed);
                    assert_eq!(o.key(), OLD, "the row changed owner under a connection");
                    o.leave();
                    true
                } else {
                    false
                }
            });
            // Both sides on threads of their own: with the seizing side on the model's main
            // thread, loom never ran its seize between the other's join and leave (a seize
            // that ignored open connections passed).
            let (o, d) = (Arc::clone(&owner), Arc::clone(&data));
            let taker = thread::spawn(move || {
                if o.seize() {
                    d.store(0, Ordering::Relaxed);
                    o.hand_to(NEW);
                    true
                } else {
                    false
                }
            });
            let taken = taker.join().unwrap();
            let joined = conn.join().unwrap();
            if taken {
                assert_eq!(owner.key(), NEW);
                assert_eq!(owner.open(), 1, "only the new owner's connection is open");
                if joined {
                    assert_eq!(
                        data.load(Ordering::Relaxed),
                        0,
                        "the old owner's write landed after the row was cleared"
                    );
                }
            } else {
                assert!(
                    joined,
                    "seize fails only when a connection of the owner came first"
                );
                assert_eq!(owner.key(), OLD);
                assert_eq!(owner.open(), 0);
            }
        });
    }

    #[test]
    fn loom_model_a_second_count_loses_no_request_and_keeps_one_second() {
        use super::SecondCount;
        loom::model(|| {
            // Two connections hand in the same second: both counts land.
            let c = Arc::new(SecondCount::new());
            let (a, b) = (Arc::clone(&c), Arc::clone(&c));
            let one = thread::spawn(move || a.add(7, 2));
            let two = thread::spawn(move || b.add(7, 3));
            one.join().unwrap();
            two.join().unwrap();
            assert_eq!(c.read(7), 5, "a count was lost");
        });
        loom::model(|| {
            // An older second and a newer one race for the bucket: the newer holds it, with
            // its own count only, whichever came first.
            let c = Arc::new(SecondCount::new());
            c.add(7, 1);
            let (a, b) = (Arc::clone(&c), Arc::clone(&c));
            let old = thread::spawn(move || a.add(7, 2));
            let new = thread::spawn(move || b.add(8, 5));
            old.join().unwrap();
            new.join().unwrap();
            assert_eq!(c.read(8), 5, "the newer second's count is not its own");
            assert_eq!(c.read(7), 0, "the bucket still holds the older second");
        });
    }
}

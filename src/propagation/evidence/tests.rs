use super::fit::Slots;
use super::path::{gamma_lower_quantile, pool_silence};
use super::*;
use crate::hot::observed::{PathId, PATHS};

/// The fit of `pattern` (`#` busy, `.` empty), all before the trigger, with max 15 s.
fn fit(pattern: &str) -> Estimate {
    let mut slots = Slots::new();
    for c in pattern.chars() {
        slots.push(c == '#');
    }
    Estimate::fit(
        &slots,
        pattern.len(),
        false,
        DEFAULT_EPSILON,
        Duration::from_secs(15),
    )
}

#[test]
fn dense_traffic_needs_about_a_second_at_most() {
    let (t, rule) = fit(&"#".repeat(120)).required().unwrap();
    assert!(t <= Duration::from_millis(1000), "{t:?}");
    assert_eq!(rule, SilenceRule::Markov);
}

#[test]
fn independent_gaps_ask_for_more_than_one_gap_would() {
    // One slot in 12 empty, in runs of one: about 10 arrivals/s.
    let e = fit(&"###########.".repeat(10));
    let (t, rule) = e.required().unwrap();
    assert_eq!(rule, SilenceRule::Markov);
    // One gap of k slots has chance about (1/12)^k; but the drain gives about 55 busy slots
    // before max for one to begin, and the tail is taken no lighter than k^-2.
    assert!(
        t > Duration::from_secs(3) && t < Duration::from_secs(10),
        "{t:?}"
    );
    // One slot in two empty (about 3/s) asks for more than max (15 s) on the same terms.
    let (t, _) = fit(&"#.".repeat(60)).required().unwrap();
    assert!(t > Duration::from_secs(15), "{t:?}");
}

#[test]
fn one_burst_is_not_a_rate() {
    let e = fit(&format!("{}#{}", ".".repeat(60), ".".repeat(59)));
    let weak = e
        .required()
        .is_none_or(|(t, _)| t > Duration::from_secs(15));
    assert!(weak, "{:?}", e.required());
}

#[test]
fn regular_pauses_are_not_taken_for_independent_gaps() {
    // 5 s on, 5 s off: half the slots empty, in runs of 20. The gaps are the process.
    let pattern = format!("{}{}", "#".repeat(20), ".".repeat(20)).repeat(3);
    let e = fit(&pattern);
    assert_eq!(e.longest_gap, 20);
    assert!(e.stay_empty() > 0.85, "{}", e.stay_empty());
    // Never a silence of 5 s or less: that happened every 10 s while routing was unchanged.
    let t = e.required().map_or(Duration::MAX, |(t, _)| t);
    assert!(t > Duration::from_secs(15), "{t:?}");
}

#[test]
fn the_longest_gap_is_a_lower_bound() {
    // Dense, but once a 2 s gap: the silence must outlast it.
    let pattern = format!("{}{}{}", "#".repeat(60), ".".repeat(8), "#".repeat(52));
    let (t, _) = fit(&pattern).required().unwrap();
    assert!(t >= SLOT * 10, "{t:?}");
}

#[test]
fn a_gap_running_at_the_trigger_counts_against_the_silence() {
    // Dense, then nothing in the last 2 s before the trigger: not fitted, but conditioned on.
    let e = fit(&format!("{}{}", "#".repeat(112), ".".repeat(8)));
    assert_eq!(e.elapsed, 8);
    let (t, _) = e.required().unwrap_or((Duration::MAX, SilenceRule::Markov));
    let dense = fit(&"#".repeat(120)).required().unwrap().0;
    assert!(t > dense, "{t:?} vs {dense:?}");
}

const P: PathId = PathId::OTHER;

#[test]
fn ring_entries_from_an_older_turn_read_as_empty() {
    let a = Arrivals::new();
    let seen = |a: &Arrivals, k| {
        let x = a.activity(P, k);
        (x.active, x.connection)
    };
    a.record(P, 5);
    assert_eq!(seen(&a, 5), (true, true));
    assert_eq!(seen(&a, 5 + RING as u64), (false, false));
    a.record(P, 5 + RING as u64);
    assert_eq!(seen(&a, 5), (false, false));
    // A late write of the older slot does not hide the newer one.
    a.record(P, 5);
    assert_eq!(seen(&a, 5 + RING as u64), (true, true));
    // Nor does a late close of a connection of the older slot.
    a.closed_fresh(P, 5);
    assert!(!a.activity(P, 5 + RING as u64).fresh);
    a.closed_fresh(P, 5 + RING as u64);
    assert!(a.activity(P, 5 + RING as u64).fresh);
}

#[test]
fn a_request_marks_its_slot_and_a_connection_wins_over_it() {
    let a = Arrivals::new();
    assert!(!a.requests_seen());
    let seen = |a: &Arrivals, k| {
        let x = a.activity(P, k);
        (x.active, x.connection)
    };
    a.note_request(P, 7);
    a.note_request(P, 7);
    assert_eq!(seen(&a, 7), (true, false));
    assert!(a.requests_seen());
    // A connection in the same slot marks it; a later request does not unmark it.
    a.record(P, 7);
    a.note_request(P, 7);
    assert_eq!(seen(&a, 7), (true, true));
    // A request of an older ring-turn does not hide a newer slot.
    a.note_request(P, 7 + RING as u64);
    a.note_request(P, 7);
    assert_eq!(seen(&a, 7 + RING as u64), (true, false));
}

#[cfg(feature = "http")] // the tally is the HTTP side's
#[test]
fn a_connection_hands_in_its_requests_once_a_second_and_at_its_close() {
    use crate::hot::observed::{RequestTally, SECONDS};
    let a = Arrivals::new();
    let (one, two) = (RequestTally::default(), RequestTally::default());
    // Slots 8..12 are second 2, 12..16 second 3. Connection one: 3 requests in second 2, 2 in
    // second 3; connection two: 4 in second 2, then it closes.
    let mut n1 = 0;
    for slot in [8, 9, 9, 12, 15] {
        one.note(&a, P, slot, n1);
        n1 += 1;
    }
    for (i, slot) in [8u64, 10, 11, 11].into_iter().enumerate() {
        two.note(&a, P, slot, i as u64);
    }
    // Second 2 of connection two is handed in only at its close; one's second 3 not yet.
    assert_eq!(a.requests_in(P, 2..3), 3);
    two.close(&a, P, 4);
    assert_eq!(a.requests_in(P, 2..3), 7);
    assert_eq!(a.requests_in(P, 3..4), 0);
    one.close(&a, P, n1);
    assert_eq!(a.requests_in(P, 2..4), 9);
    // A bucket taken over by a later second reads 0 for the earlier, and a late hand-in for
    // the earlier second is dropped, not added to the later.
    let later = RequestTally::default();
    later.note(&a, P, 12 + 4 * SECONDS as u64, 0); // second 3 + SECONDS: second 3's bucket
    later.close(&a, P, 6);
    let (third, its_later) = (3..4, 3 + SECONDS as u64..4 + SECONDS as u64);
    assert_eq!(a.requests_in(P, third.clone()), 0);
    assert_eq!(a.requests_in(P, its_later.clone()), 6);
    let stale = RequestTally::default();
    stale.note(&a, P, 13, 0); // second 3, long after
    stale.close(&a, P, 5);
    assert_eq!(a.requests_in(P, third), 0);
    assert_eq!(a.requests_in(P, its_later), 6);
}

fn ip(i: u32) -> Option<std::net::IpAddr> {
    Some(std::net::IpAddr::from(std::net::Ipv4Addr::from(
        u32::from(std::net::Ipv4Addr::new(198, 18, 0, 0)) + i,
    )))
}

/// Opens and closes one connection of `peer` in `slot` (a one-off client): its row.
fn one_off(a: &Arrivals, peer: Option<std::net::IpAddr>, slot: u64) -> PathId {
    let p = a.open(peer, slot);
    a.closed(p);
    p
}

#[test]
fn each_live_peer_gets_a_row_of_its_own_until_the_table_is_full() {
    let a = Arrivals::new();
    let first = one_off(&a, ip(1), 0);
    assert_eq!(one_off(&a, ip(1), 0), first, "the same peer, the same row");
    let mut seen = std::collections::HashSet::new();
    for i in 1..PATHS as u32 {
        let p = one_off(&a, ip(i), 1);
        assert_ne!(p, PathId::OTHER, "peer {i}");
        assert!(seen.insert(p), "peer {i} shares a row");
    }
    // Every row's owner was active within a ring-turn: the next peer shares the last row.
    assert_eq!(
        one_off(&a, ip(PATHS as u32), 2),
        PathId::OTHER,
        "beyond the table"
    );
    assert_eq!(one_off(&a, None, 2), PathId::OTHER);
    // An IPv4-mapped IPv6 address is the same peer.
    let mapped = "::ffff:198.18.0.3".parse::<std::net::IpAddr>().unwrap();
    assert_eq!(one_off(&a, Some(mapped), 2), one_off(&a, ip(3), 2));
    assert_eq!(a.paths().count(), PATHS);
}

#[test]
fn a_peer_silent_for_a_ring_turn_gives_its_row_to_a_new_one() {
    let a = Arrivals::new();
    // Every row taken in slot 0; peer 5 keeps a connection open, peer 6 sends a request in
    // slot 100; every row has counts of after the drain's start (of a drain that never
    // froze them, to see them cleared).
    let rows: Vec<PathId> = (1..PATHS as u32).map(|i| one_off(&a, ip(i), 0)).collect();
    let held = a.open(ip(5), 0);
    assert_eq!(held, rows[4]);
    a.note_request(rows[5], 100);
    rows.iter().for_each(|&r| a.after_drain(r, 1));
    // Within a ring-turn of their last arrival, nobody gives a row up.
    assert_eq!(one_off(&a, ip(1000), RING as u64), PathId::OTHER);
    // Past it, the silent peers without a connection do, the longest silent first (all of
    // slot 0 here: the first in the new peer's sequence), and the new owner's row is clean.
    let taken = a.open(ip(1000), RING as u64 + 1);
    assert_ne!(taken, PathId::OTHER);
    assert_ne!(taken, held, "a peer with a connection open keeps its row");
    assert_ne!(taken, rows[5], "a peer active since keeps its row");
    assert_eq!(a.open_count(taken), 1);
    assert_eq!(
        a.after(taken),
        (0, 0),
        "counts of the former owner are cleared"
    );
    assert!(
        !a.activity(taken, 0).active,
        "the former owner's slots are cleared"
    );
    assert!(a.activity(taken, RING as u64 + 1).connection);
    let peers: Vec<_> = a
        .paths()
        .filter(|(p, _)| *p == taken)
        .map(|(_, ip)| ip)
        .collect();
    assert_eq!(peers, vec![ip(1000)]);
    // The former owner, back, finds no row of its own until another one ages out...
    a.closed(taken);
    assert_ne!(one_off(&a, ip(1000), RING as u64 + 2), PathId::OTHER);
    // ... and the peer whose connection stayed open still counts on its row.
    assert_eq!(one_off(&a, ip(5), RING as u64 + 2), held);
    a.closed(held);
}

#[test]
fn from_the_trigger_on_rows_keep_their_owners() {
    let a = Arrivals::new();
    for i in 1..PATHS as u32 {
        one_off(&a, ip(i), 0);
    }
    a.freeze();
    // The drain reads the rows by their ids: a new peer during the drain shares the last.
    assert_eq!(one_off(&a, ip(1000), 10 * RING as u64), PathId::OTHER);
}

#[test]
fn a_connection_is_never_counted_on_a_row_that_changed_owner_under_it() {
    // Two threads on one clock the churn advances: one peer's connections come and go on its
    // row while one-off peers take rows, the clock moving an eighth of a ring a one-off, so
    // rows keep aging out — the peer's own too, whenever it has nothing open — and keep being
    // taken. Whenever the peer has a connection open on a row, the row is its own; at the end
    // no row counts a connection open. (The clock is shared, not fixed: with every one-off at
    // one slot the table stayed full of them once they filled it, and whether the peer got a
    // row at all depended on which thread ran first.)
    use std::sync::atomic::{AtomicU64, Ordering};
    let a = std::sync::Arc::new(Arrivals::new());
    for i in 1..PATHS as u32 {
        one_off(&a, ip(i), 0);
    }
    let now = std::sync::Arc::new(AtomicU64::new(10 * RING as u64));
    let (b, clock) = (std::sync::Arc::clone(&a), std::sync::Arc::clone(&now));
    let churn = std::thread::spawn(move || {
        for n in 0..20_000u32 {
            let t = clock.fetch_add(RING as u64 / 8, Ordering::Relaxed);
            one_off(&b, ip(100_000 + n), t);
        }
    });
    let mut own = 0;
    for _ in 0..20_000 {
        let p = a.open(ip(7), now.load(Ordering::Relaxed));
        if p != PathId::OTHER {
            own += 1;
            let owner: Vec<_> = a
                .paths()
                .filter(|(q, _)| *q == p)
                .map(|(_, ip)| ip)
                .collect();
            assert_eq!(owner, vec![ip(7)], "{p:?}");
        }
        a.closed(p);
    }
    churn.join().unwrap();
    // After the churn the one-offs' rows age out too: the peer gets one.
    let p = a.open(ip(7), now.load(Ordering::Relaxed) + RING as u64 + 1);
    own += usize::from(p != PathId::OTHER);
    a.closed(p);
    assert!(own > 0, "the peer never had a row");
    for (p, _) in a.paths() {
        assert_eq!(a.open_count(p), 0, "{p:?}");
    }
}

#[test]
fn slots_are_counted_without_a_wide_division() {
    let base = Instant::from_std(std::time::Instant::now());
    for ms in [0u64, 249, 250, 999, 1000, 1251, 86_400_123] {
        let t = base + Duration::from_millis(ms);
        assert_eq!(slot_of(base, t), ms / 250, "{ms} ms");
    }
}

#[test]
fn a_pool_waits_for_its_connections_to_be_reused_at_their_own_pace() {
    // 32 connections each first used a mean 1.45 s after the trigger: a connection that landed
    // here again may wait that long and more to reconnect.
    let slow = pool_silence(
        32,
        32,
        Duration::from_secs_f64(32.0 * 1.45),
        DEFAULT_EPSILON,
    );
    assert!(slow > Duration::from_secs(15), "{slow:?}");
    // The same pool used 50 times as often is 50 times as quick.
    let fast = pool_silence(
        32,
        32,
        Duration::from_secs_f64(32.0 * 0.029),
        DEFAULT_EPSILON,
    );
    assert!(fast < Duration::from_millis(600), "{fast:?}");
    // One connection is one sample: a wide bound.
    let one = pool_silence(1, 1, Duration::from_millis(100), DEFAULT_EPSILON);
    assert!(one > Duration::from_secs(5), "{one:?}");
}

#[test]
fn the_gamma_quantile_errs_low_and_is_exact_for_a_pool() {
    // The 1 % quantiles of Gamma(k, 1), by bisection of the incomplete gamma series.
    for (k, q) in [
        (1.0, 0.01005),
        (2.0, 0.14855),
        (4.0, 0.82325),
        (10.0, 4.1302),
        (32.0, 20.324),
        (256.0, 220.255),
        (100.0, 78.216),
    ] {
        let g = gamma_lower_quantile(k);
        assert!(g <= q * 1.0001 && g > q * 0.999, "k = {k}: {g} vs {q}");
    }
    // Beyond the exact range, and between whole numbers, the cube-root approximation: low.
    for (k, q) in [(300.0, 261.18), (2.5, 0.27715)] {
        let g = gamma_lower_quantile(k);
        assert!(g <= q && g > q * 0.85, "k = {k}: {g} vs {q}");
    }
}

// Drains that open connections as the accept loop of the `http` feature does.
#[cfg(feature = "http")]
mod drains;

use super::fit::Slots;
use super::path::{gamma_lower_quantile, pool_silence};
use super::*;
use crate::observed::PathId;

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

#[test]
fn each_peer_gets_a_row_of_its_own_until_the_table_is_full() {
    let a = Arrivals::new();
    let ip = |i: u8| Some(std::net::IpAddr::from([198, 18, 0, i]));
    let first = a.path_of(ip(1));
    assert_eq!(a.path_of(ip(1)), first, "the same peer, the same row");
    let mut seen = std::collections::HashSet::new();
    for i in 1..=15 {
        let p = a.path_of(ip(i));
        assert_ne!(p, PathId::OTHER, "peer {i}");
        assert!(seen.insert(p), "peer {i} shares a row");
    }
    assert_eq!(a.path_of(ip(16)), PathId::OTHER, "beyond the table");
    assert_eq!(a.path_of(None), PathId::OTHER);
    // An IPv4-mapped IPv6 address is the same peer.
    let mapped = "::ffff:198.18.0.3".parse::<std::net::IpAddr>().unwrap();
    assert_eq!(a.path_of(Some(mapped)), a.path_of(ip(3)));
    assert_eq!(a.paths().count(), 16);
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

use super::fit::Slots;
use super::path::{gamma_lower_quantile, pool_silence};
use super::*;
use crate::observed::PathId;
use crate::report::{EvidenceKind, EvidenceReport, MaxReason};

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

// ---- the rule, driven with synthetic arrivals on the paused clock ----
//
// Arrivals go through `Drain::note_connection`, the accept loop's own hook: counted in
// the ring while Serving, and as new connections once draining.

use crate::drain::Drain;
use crate::phase::{EventKind, Phase, Trigger};
use crate::propagation::Propagation;
use crate::signal::Signals;

const PEER: Option<std::net::SocketAddr> = None;

fn drain(p: Propagation) -> Drain {
    let d = Drain::builder()
        .grace_period(Duration::from_secs(30)) // max = 15 s
        .propagation(p)
        .signals(Signals::none())
        .report_to_stderr(false)
        .termination_log(None)
        .build()
        .unwrap();
    d.core().observed().observe_arrivals();
    d.mark_serving();
    d
}

/// One connection every `every`, `n` times.
async fn arrivals(d: &Drain, every: Duration, n: u32) {
    for _ in 0..n {
        tokio::time::sleep(every).await;
        d.note_connection(PEER);
    }
}

async fn committed(d: &Drain) -> (u64, EvidenceReport) {
    let report = d.drained().await;
    let at = report.event(EventKind::StoppedAccepting).unwrap().at_ms;
    (at, report.propagation.evidence.clone().unwrap())
}

#[tokio::test(start_paused = true)]
async fn dense_traffic_commits_soon_after_the_last_connection() {
    let d = drain(Propagation::default());
    arrivals(&d, Duration::from_millis(50), 600).await; // 20/s for 30 s
    assert!(d.start(Trigger::Api));
    // The proxies keep sending for 2 s more, then move on; the last connection comes at
    // 2.1 s, 100 ms into its slot.
    arrivals(&d, Duration::from_millis(50), 40).await;
    arrivals(&d, Duration::from_millis(100), 1).await;
    let (at, ev) = committed(&d).await;
    assert_eq!(ev.kind, EvidenceKind::Confidence, "{ev:?}");
    assert_eq!((ev.slots_observed, ev.empty_slots), (120, 0));
    // Two whole empty slots, counted from the end of the last connection's slot (2.25 s):
    // the commit at 2.75 s, 650 ms of silence, more than quiet (500 ms).
    assert_eq!(ev.t_conf_ms, Some(500), "{ev:?}");
    assert_eq!(ev.rule, Some(SilenceRule::Markov));
    assert_eq!(at, 2750);
    assert_eq!(ev.silence_ms, 650);
}

#[tokio::test(start_paused = true)]
async fn a_moderate_rate_asks_for_its_own_silence_and_learns_from_the_drain() {
    let d = drain(Propagation::default());
    // A connection in 11 slots of every 12 (the 12th empty), 30 s before the trigger and
    // 3 s after it.
    for _ in 0..10 {
        for i in 0..12 {
            tokio::time::sleep(SLOT).await;
            if i != 11 {
                d.note_connection(PEER);
            }
        }
    }
    d.start(Trigger::Api);
    for i in 0..12 {
        tokio::time::sleep(SLOT).await;
        if i != 11 {
            d.note_connection(PEER);
        }
    }
    let (at, ev) = committed(&d).await;
    assert_eq!(ev.kind, EvidenceKind::Confidence, "{ev:?}");
    assert_eq!(ev.rule, Some(SilenceRule::Markov));
    assert_eq!(ev.slots_observed, 120);
    // The drain's own slots are fitted up to the last connection (at 2.75 s).
    // (The trigger's slot is the first of them.)
    assert_eq!(ev.slots_after_trigger, 12, "{ev:?}");
    assert_eq!(ev.longest_gap_ms, Some(250));
    let t = ev.t_conf_ms.unwrap();
    assert!((3000..10_000).contains(&t), "{ev:?}");
    // Counted from the end of the last connection's slot (3 s); the timer wakes on the next
    // whole millisecond.
    assert!((3000 + t..=3001 + t).contains(&at), "{at} vs 3000 + {t}");
}

#[tokio::test(start_paused = true)]
async fn requests_on_open_connections_do_not_hold_the_window() {
    let d = drain(Propagation::default());
    arrivals(&d, Duration::from_millis(50), 600).await;
    d.start(Trigger::Api);
    let d2 = d.clone();
    let pinned = tokio::spawn(async move {
        // A client pinned to an open connection: a request every 200 ms (bounded: 5 s).
        for _ in 0..25 {
            if d2.phase() >= Phase::StoppedAccepting {
                break;
            }
            drop(d2.enter());
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    let (at, ev) = committed(&d).await;
    pinned.await.unwrap();
    assert_eq!(ev.kind, EvidenceKind::Confidence);
    assert_eq!(
        at, 1000,
        "no new connection after the trigger: min and quiet, not max"
    );
}

#[tokio::test(start_paused = true)]
async fn sparse_traffic_waits_to_max_and_says_so() {
    let d = drain(Propagation::default());
    arrivals(&d, Duration::from_secs(3), 10).await; // 0.33/s
    d.start(Trigger::Api);
    let (at, ev) = committed(&d).await;
    assert_eq!(at, 15_000);
    assert_eq!(ev.kind, EvidenceKind::Max);
    assert_eq!(ev.max_reason, Some(MaxReason::NotEnoughEvidence));
    assert_eq!(ev.weak, Some(WeakEvidence::TooSparse));
    assert!(ev.t_conf_ms.is_none_or(|t| t > 15_000), "{ev:?}");
    let report = d.report().unwrap();
    let weak = report
        .advice
        .iter()
        .find(|a| a.rule == crate::report::AdviceRule::WeakEvidence)
        .unwrap();
    assert!(
        weak.message.contains("new connections/s before the drain"),
        "{}",
        weak.message
    );
    assert!(weak.message.contains("waited 15.0 s"), "{}", weak.message);
}

#[tokio::test(start_paused = true)]
async fn one_burst_then_silence_does_not_pass_for_a_rate() {
    let d = drain(Propagation::default());
    tokio::time::sleep(Duration::from_secs(10)).await;
    arrivals(&d, Duration::from_millis(1), 200).await; // 200 connections in 200 ms
    tokio::time::sleep(Duration::from_secs(20)).await;
    d.start(Trigger::Api);
    let (at, ev) = committed(&d).await;
    assert_eq!(at, 15_000);
    assert_eq!(ev.kind, EvidenceKind::Max);
    assert_eq!(ev.weak, Some(WeakEvidence::TooSparse));
    assert!(ev.slots_observed - ev.empty_slots <= 2, "{ev:?}");
}

#[tokio::test(start_paused = true)]
async fn a_process_younger_than_the_window_uses_only_what_it_saw() {
    let d = drain(Propagation::default());
    arrivals(&d, Duration::from_millis(50), 60).await; // 3 s of dense traffic
    d.start(Trigger::Api);
    let (at, ev) = committed(&d).await;
    assert_eq!(at, 15_000);
    assert_eq!(ev.weak, Some(WeakEvidence::TooFewSlots));
    assert_eq!(ev.slots_observed, 12);
    assert_eq!(ev.max_reason, Some(MaxReason::NotEnoughEvidence));

    // 14.75 s is still too short (59 slots: a shorter window sees too few of the traffic's
    // phases, the simulation's young processes broke ε with 5 s).
    let d = drain(Propagation::default());
    arrivals(&d, Duration::from_millis(50), 295).await;
    d.start(Trigger::Api);
    let (_, ev) = committed(&d).await;
    assert_eq!(
        (ev.weak, ev.slots_observed),
        (Some(WeakEvidence::TooFewSlots), 59)
    );

    // 16 s of the same traffic is enough, and only those 64 slots count.
    let d = drain(Propagation::default());
    arrivals(&d, Duration::from_millis(50), 320).await;
    d.start(Trigger::Api);
    let (at, ev) = committed(&d).await;
    assert_eq!(
        (ev.kind, ev.slots_observed, ev.empty_slots),
        (EvidenceKind::Confidence, 64, 0)
    );
    // Fewer slots, more doubt: no shorter than the 500 ms of a full window, still short.
    let t = ev.t_conf_ms.unwrap();
    assert!((500..=1500).contains(&t), "{ev:?}");
    // Nothing after the trigger (at the start of its slot): the whole slots are counted from
    // the end of the trigger's.
    assert_eq!(at, 250 + t);
}

#[tokio::test(start_paused = true)]
async fn no_connection_data_waits_to_max_and_names_the_fix() {
    let d = Drain::builder()
        .grace_period(Duration::from_secs(30))
        .signals(Signals::none())
        .report_to_stderr(false)
        .termination_log(None)
        .build()
        .unwrap();
    d.mark_serving();
    tokio::time::sleep(Duration::from_secs(30)).await;
    d.start(Trigger::Api);
    let (at, ev) = committed(&d).await;
    assert_eq!(at, 15_000);
    assert_eq!(ev.weak, Some(WeakEvidence::NoConnectionData));
    let report = d.report().unwrap();
    let a = report
        .advice
        .iter()
        .find(|a| a.rule == crate::report::AdviceRule::NoConnectionData)
        .unwrap();
    // Nothing arrived at all: an idle process, not a wiring gap.
    assert_eq!(a.level, crate::report::AdviceLevel::Info);
    assert!(a.message.starts_with("nothing arrived"), "{}", a.message);
}

#[tokio::test(start_paused = true)]
async fn the_fallback_replaces_max_when_evidence_is_weak() {
    let d = drain(Propagation::default().quiet_suffices_after(Duration::from_secs(4)));
    arrivals(&d, Duration::from_secs(3), 10).await;
    d.start(Trigger::Api);
    // While draining, /status names what the policy waits on.
    tokio::task::yield_now().await;
    assert_eq!(d.status().evidence.unwrap().kind, EvidenceKind::Fallback);
    let (at, ev) = committed(&d).await;
    assert_eq!(at, 4000);
    assert_eq!(ev.kind, EvidenceKind::Fallback);
    assert_eq!(ev.fallback_ms, Some(4000));
    assert_eq!(ev.max_reason, None);
}

#[tokio::test(start_paused = true)]
async fn connections_that_never_stop_commit_at_max_as_never_quiet() {
    let d = drain(Propagation::default());
    arrivals(&d, Duration::from_millis(50), 600).await;
    d.start(Trigger::Api);
    let d2 = d.clone();
    let load = tokio::spawn(async move {
        // Bounded: 20 s of one connection every 100 ms, or until stopped.
        for _ in 0..200 {
            if d2.phase() >= Phase::StoppedAccepting {
                break;
            }
            d2.note_connection(PEER);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let (at, ev) = committed(&d).await;
    load.await.unwrap();
    assert_eq!(at, 15_000);
    assert_eq!(ev.max_reason, Some(MaxReason::TrafficNeverWentQuiet));
    assert_eq!(ev.weak, None);
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
fn the_gamma_quantile_errs_low() {
    // The 1 % quantiles of Gamma(k, 1), by bisection of the incomplete gamma series.
    for (k, q) in [
        (1.0, 0.01005),
        (2.0, 0.14855),
        (4.0, 0.82325),
        (10.0, 4.1302),
        (32.0, 20.324),
        (100.0, 78.216),
    ] {
        let g = gamma_lower_quantile(k);
        assert!(g <= q && g > q * 0.1, "k = {k}: {g} vs {q}");
    }
}

//! The rule, driven with synthetic arrivals on the paused clock.
//!
//! Arrivals go through `ServeSeam::note_connection`, the accept loop's own hook: counted in
//! the ring while Serving, and as new connections once draining; each closes at once.

use super::*;

use crate::drain::signal::Signals;
use crate::drain::Drain;
use crate::propagation::Propagation;
use crate::report::{EvidenceKind, EvidenceReport, MaxReason};
use crate::vocab::phase::{EventKind, Phase, Trigger};

const PEER: Option<std::net::SocketAddr> = Some(std::net::SocketAddr::new(
    std::net::IpAddr::V4(std::net::Ipv4Addr::new(198, 18, 0, 7)),
    40000,
));

/// A connection from [`PEER`], accepted and closed at once (its row is free to age out).
fn connect(d: &Drain) {
    let (_, path) = crate::drain::ServeSeam::new(d).note_connection(PEER);
    d.core().observed().arrivals().closed(path);
}

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
    d.readiness().mark_serving();
    d
}

/// One connection every `every`, `n` times.
async fn arrivals(d: &Drain, every: Duration, n: u32) {
    for _ in 0..n {
        tokio::time::sleep(every).await;
        connect(d);
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
                connect(&d);
            }
        }
    }
    d.start(Trigger::Api);
    for i in 0..12 {
        tokio::time::sleep(SLOT).await;
        if i != 11 {
            connect(&d);
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
    d.readiness().mark_serving();
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
async fn connections_that_never_stop_are_served_past_max_up_to_the_cap() {
    // A connection every 100 ms for as long as the process accepts: some proxy still routes
    // here at `max` (15 s), so the drain keeps serving, up to the cap a second before the
    // quiesce deadline (24 s of a 30 s grace), and says it left while still routed.
    let d = drain(Propagation::default());
    arrivals(&d, Duration::from_millis(50), 600).await;
    d.start(Trigger::Api);
    let d2 = d.clone();
    let load = tokio::spawn(async move {
        // Bounded: 30 s of one connection every 100 ms, or until stopped.
        for _ in 0..300 {
            if d2.phase() >= Phase::StoppedAccepting {
                break;
            }
            connect(&d2);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let (at, ev) = committed(&d).await;
    load.await.unwrap();
    assert_eq!(at, 23_000);
    assert_eq!(ev.max_reason, Some(MaxReason::TrafficNeverWentQuiet));
    assert_eq!(ev.weak, None);
    assert_eq!(ev.past_max_ms, Some(8_000));
    assert!(ev.still_routed_at_cap, "{ev:?}");
}

#[tokio::test(start_paused = true)]
async fn a_path_still_routed_at_max_is_served_until_its_connections_stop() {
    // The same connections stop at 19 s (their proxy caught up, late): the drain serves past
    // `max` until their silence is one a path still routed here shows less than once in 1/ε
    // drains before the cap (at 10/s with ~40 gaps left, about 1.1 s), not to the cap.
    let d = drain(Propagation::default());
    arrivals(&d, Duration::from_millis(50), 600).await;
    d.start(Trigger::Api);
    for _ in 0..190 {
        connect(&d);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (at, ev) = committed(&d).await;
    assert!(
        (19_500..20_500).contains(&at),
        "committed at {at} ms: {ev:?}"
    );
    assert_eq!(ev.past_max_ms, Some(at - 15_000));
    assert!(!ev.still_routed_at_cap);
}

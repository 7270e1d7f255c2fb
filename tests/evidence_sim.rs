//! The propagation simulation, in virtual time: lameduck's own estimator and policy check
//! over a family of arrival processes (`examples/support/evidence_sim.rs` says how a run is
//! drawn). A process held to ε whose losses after a commit on evidence are *significantly*
//! above ε (the one-sided 95 % Clopper–Pearson lower bound of the loss fraction above 10⁻³)
//! fails; the full table, with enough runs to bound every row from above as well, is
//! `cargo run --release --example evidence_sim`.

#[path = "../examples/support/evidence_sim.rs"]
mod sim;

use sim::{
    clopper_pearson, family, lifo_pools, many_peers, routers, scenarios, simulate, simulate_lifo,
    simulate_lifo_declared, simulate_router, simulate_scenario, Phase, Pool, Process, Scenario,
    Shares, Spread, Summary,
};

const RUNS: u64 = 300;
const EPSILON: f64 = 1e-3;

#[test]
fn every_process_of_the_family_holds_epsilon() {
    let mut broken = Vec::new();
    for (i, p) in family().iter().enumerate() {
        for (j, phase) in [Phase::Random, Phase::GapStart, Phase::Young]
            .into_iter()
            .enumerate()
        {
            let s = simulate(p, phase, RUNS, 0x5eed ^ ((i as u64) << 8 | j as u64));
            let (lower, _) = clopper_pearson(s.lost, s.runs);
            if p.held_to_epsilon() && lower > EPSILON {
                broken.push(format!(
                    "{} ({}): {} of {} lost after a commit on evidence",
                    p.name(),
                    phase.name(),
                    s.lost,
                    s.runs
                ));
            }
        }
    }
    assert!(broken.is_empty(), "ε broken:\n{}", broken.join("\n"));
}

#[test]
fn dense_traffic_commits_within_a_second_of_the_proxies() {
    let s = simulate(&Process::Poisson { rate: 50.0 }, Phase::Random, RUNS, 50);
    assert_eq!(s.lost, 0);
    // The evidence asks for 0.5–1 s of silence at 50/s, the default quiet window (500 ms) no
    // more: the "within ~0.5 s of the proxies", to the slot.
    assert!(s.median <= 0.8 && s.median >= 0.45, "{s:?}");
    assert!(s.p99 <= 1.1, "{s:?}");
    assert!(s.on_evidence > s.runs / 2, "{s:?}");
}

#[test]
fn on_off_traffic_does_not_commit_inside_its_pauses() {
    for (on, off) in [(5.0, 5.0), (2.0, 8.0), (1.0, 1.0)] {
        let p = Process::OnOff {
            on,
            off,
            every: 0.1,
        };
        for phase in [Phase::Random, Phase::GapStart, Phase::Young] {
            let s = simulate(&p, phase, RUNS, 55);
            assert_eq!(s.lost, 0, "{}: {s:?}", p.name());
        }
    }
}

#[test]
fn a_pause_at_the_trigger_is_what_no_local_evidence_can_tell() {
    // Reported, not held to ε: the table says so. This pins that it is indeed lost often, so
    // the table's row keeps meaning what it says.
    let p = Process::PausesAtTrigger {
        rate: 10.0,
        pause: (2.0, 20.0),
    };
    assert!(!p.held_to_epsilon());
    let s = simulate(&p, Phase::Random, RUNS, 77);
    assert!(s.lost > 0, "{s:?}");
}

/// Fails naming every row whose losses after a commit on evidence are significantly above ε.
fn assert_rows_hold_epsilon(rows: impl Iterator<Item = (String, Summary)>) {
    let broken: Vec<String> = rows
        .filter(|(_, s)| clopper_pearson(s.lost, s.runs).0 > EPSILON)
        .map(|(name, s)| {
            format!(
                "{name}: {} of {} lost after a commit on evidence",
                s.lost, s.runs
            )
        })
        .collect();
    assert!(broken.is_empty(), "ε broken:\n{}", broken.join("\n"));
}

#[test]
fn pools_and_many_proxies_hold_epsilon() {
    assert_rows_hold_epsilon(
        scenarios()
            .iter()
            .enumerate()
            .map(|(i, sc)| (sc.name(), simulate_scenario(sc, RUNS, 0x9001 ^ i as u64))),
    );
}

/// Many peers, most of them one-off. With a table of 16 rows that were never freed, 15
/// one-off peers early in the process's life put every later peer on one shared row, fitted
/// as one path: a dense peer whose node converged proved the row quiet while a sparse peer's
/// node still routed here.
#[test]
fn many_peers_most_of_them_one_off_hold_epsilon() {
    let rows: Vec<(String, Summary)> = many_peers()
        .iter()
        .enumerate()
        .map(|(i, sc)| (sc.name(), simulate_scenario(sc, RUNS, 0x3a7e ^ i as u64)))
        .collect();
    // The rows are not all at `max`: where the one-offs are rare, the dense peers' silence
    // still ends drains on evidence.
    assert!(
        rows.iter().any(|(_, s)| s.on_evidence > s.runs / 10),
        "{rows:?}"
    );
    assert_rows_hold_epsilon(rows.into_iter());
}

/// L7 routers (pooled upstream connections, a choice per request) declared as such: judged by
/// the silence of all their requests, they hold ε and end most drains on evidence, where the
/// kept-connections rule alone holds every one of them to `max`.
#[test]
fn declared_per_request_routers_hold_epsilon_and_end_drains_on_evidence() {
    let rows: Vec<(String, Summary)> = routers()
        .iter()
        .enumerate()
        .map(|(i, r)| (r.name(), simulate_router(r, RUNS, 0x7e57 ^ i as u64)))
        .collect();
    // A router sending 20/s or more here, request by request, ends most drains on evidence;
    // one at 5/s, or one whose requests come in bursts of 8 (5 bursts a second), is too sparse
    // in slots for its silence to say much before `max`, as any path at that rate is.
    for ((name, s), r) in rows.iter().zip(routers()) {
        if r.rate >= 20.0 && r.burst == 1 {
            assert!(s.on_evidence > s.runs / 2, "{name}: {s:?}");
        }
    }
    assert_rows_hold_epsilon(rows.into_iter());
}

/// A client pool declared by mistake as a per-request router: its silence is taken for
/// proof, and a pool that connects again at its next concurrency peak is lost on. This pins
/// that the mistake costs (BENCHMARKS.md has the rates), so the docs' warning stays true.
#[test]
fn a_pool_declared_by_mistake_loses_drains() {
    let lost: u64 = lifo_pools()
        .iter()
        .enumerate()
        .map(|(i, pool)| simulate_lifo_declared(pool, RUNS, 0xdec1 ^ i as u64).lost)
        .sum();
    assert!(lost > 0, "no loss from pools declared per request");
}

/// Pools that take their most recent idle connection first (hyper's) and open one only when
/// none is idle: once the drain closed their connections here, they open the next at a
/// concurrency peak, however late. The pool wait that bounded a reconnect by how soon the
/// connections were reused lost 1.4 %, 0.5 % and 3.5 % of three of these rows' drains (20,000
/// each); a kept-alive path now waits to `max`.
#[test]
fn most_recent_first_pools_hold_epsilon() {
    assert_rows_hold_epsilon(
        lifo_pools()
            .iter()
            .enumerate()
            .map(|(i, pool)| (pool.name(), simulate_lifo(pool, RUNS, 0x11f0 ^ i as u64))),
    );
}

#[test]
fn a_pool_beside_a_trickle_does_not_make_the_trickle_look_dense() {
    // The cell: a kept-alive pool and fresh connections from one peer. Its requests
    // made every slot busy and the drain committed on a short silence; the trickle must be
    // judged by its own rate.
    let sc = Scenario::Pooled {
        pool: Pool {
            conns: 32,
            rate: 22.0,
            endpoints: 2,
        },
        fresh: 2.5,
        same_peer: true,
    };
    let s = simulate_scenario(&sc, RUNS, 32);
    assert_eq!(s.lost, 0, "{s:?}");
}

#[test]
fn a_dense_fast_proxy_does_not_prove_a_slow_one() {
    // Two nodes: most traffic through one converging within 2 s, a trickle through a
    // straggler 5–40 s behind. The total's silence says nothing about the straggler.
    let sc = Scenario::Proxies {
        n: 2,
        shares: Shares::Zipf,
        spread: Spread::Straggler,
        fresh: 50.0,
        pool: None,
    };
    let s = simulate_scenario(&sc, RUNS, 33);
    assert_eq!(s.lost, 0, "{s:?}");
}

#[test]
fn a_drain_that_cannot_say_at_the_trigger_looks_again_and_commits_on_what_came_after() {
    // Dense fresh connections (20/s, one request each) through a proxy that still routes here
    // for 1 s after the trigger, and one connection open at the trigger with a slow request in
    // flight, which its client closes after the answer at 1.5 s. Until then the connection
    // might be a kept one whose client connects again whenever it needs to (`weak` is
    // `kept_connections`); once it left by itself the path's silence can say. The drain must
    // look again at each slot and commit on that silence, not sleep to `max` (15 s) because
    // the first check could not say: before the look at every slot, a drain that could not
    // say at the trigger slept to `max` (the datapath's pool cell behind kube-proxy 8 s late:
    // silent from 4.0 s, committed at 15 s).
    use lameduck::__private::evidence_sim::{drain, Arrival, What};
    use lameduck::report::{EvidenceKind, PathRouting};
    use lameduck::Propagation;
    use std::time::Duration;

    let ms = Duration::from_millis;
    let trigger = ms(30_000);
    let mut trace = Vec::new();
    for k in 0..620u64 {
        trace.push(Arrival::new(ms(50 * k), 0, What::Fresh));
    }
    trace.retain(|a| a.at < trigger + ms(1_000));
    trace.push(Arrival::new(trigger - ms(300), 0, What::Open));
    trace.push(Arrival::new(trigger + ms(1_500), 0, What::Left));
    trace.sort_by_key(|a| a.at);
    let out = drain(
        &trace,
        trigger,
        &Propagation::default(),
        Duration::from_secs(30),
    )
    .expect("the default policy");
    let ev = &out.evidence;
    assert_eq!(out.kind(), EvidenceKind::Confidence, "{ev:?}");
    assert_eq!(ev.paths[0].routing, PathRouting::Connections, "{ev:?}");
    assert_eq!(ev.paths[0].kept_alive, 0, "{ev:?}");
    assert!(
        out.commit >= ms(1_500) && out.commit <= ms(3_000),
        "committed {:?} after the trigger: {ev:?}",
        out.commit
    );
}

/// A proxy slower than `max` (15 s) and faster than the cap (23 s): the drain sees its fresh
/// connections still arriving at `max` and serves on while they keep coming. Past `max` the
/// silence that ended the drain was three of the path's mean gaps, which a Poisson path shows
/// about once in twenty gaps: 19–62 % of these drains at 0.5–5/s committed while the proxy
/// still routed here (the real stack's `real_stack_a_node_slower_than_max_is_outlasted` lost a
/// connection that way in CI). It is now the silence such a path shows by chance less than
/// once in 1/ε drains before the cap, at most 10 s: held to ε from 1/s, and at 0.5/s far
/// below the old rule's loss.
#[test]
fn a_proxy_slower_than_max_is_served_until_its_connections_stop() {
    for (i, rate) in sim::PAST_MAX_RATES.into_iter().enumerate() {
        let s = sim::simulate_past_max(rate, RUNS, 0x9a57 ^ i as u64);
        assert_eq!(s.on_evidence, 0, "{rate}/s: {s:?}");
        let lost = s.lost + s.lost_at_max;
        let (lower, _) = clopper_pearson(lost, s.runs);
        let bound = if sim::past_max_held_to_epsilon(rate) {
            EPSILON
        } else {
            0.05
        };
        assert!(
            lower <= bound,
            "{rate}/s: {lost} of {} drains committed while the proxy still routed here: {s:?}",
            s.runs
        );
    }
}

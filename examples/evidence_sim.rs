//! Run with `cargo run --release --example evidence_sim [-- RUNS [SEED [FILTER]]]`
//!
//! The propagation simulation, in full: for every arrival process of the family, at a random
//! trigger and at the start of a gap, `RUNS` drains (default 20,000) through lameduck's own
//! estimator and policy check in virtual time, and a fixed 5 s sleep on the same traces.
//! Prints the Markdown table that `BENCHMARKS.md` and the Kubernetes guide quote. `FILTER`
//! keeps only the processes whose name contains it (to tighten one row's bound with more runs).
//! Then the pools and many proxies, the many-peer rows, the most-recent-first pools
//! (`lifo_pools`; with `SIM_DEBUG=1` each of their losses on evidence is printed with its
//! path's evidence), the declared per-request routers, the pools declared by mistake, and
//! Poisson paths through a proxy slower than `max` (`past-max`: served past it while their
//! connections arrive; every commit there is at or past `max`, so its loss is the "lost at
//! max" column). `SIM_TABLES=family,routers` (of `family`, `scenarios`, `lifo`, `routers`,
//! `declared`, `past-max`) runs only those tables.

#[path = "support/evidence_sim.rs"]
mod sim;

use sim::{
    clopper_pearson, family, lifo_pools, many_peers, past_max_held_to_epsilon, routers, scenarios,
    simulate, simulate_lifo, simulate_lifo_declared, simulate_past_max, simulate_router,
    simulate_scenario, Phase, Summary, PAST_MAX, PAST_MAX_RATES,
};

fn main() {
    let mut args = std::env::args().skip(1);
    let runs: u64 = args.next().map_or(20_000, |a| a.parse().expect("RUNS"));
    let seed: u64 = args.next().map_or(1, |a| a.parse().expect("SEED"));
    let filter = args.next().unwrap_or_default();
    println!(
        "{runs} drains per row, seed {seed}; default policy (ε = 10⁻³, quiet 500 ms, min 1 s, \
         max 15 s of a 30 s grace); proxy delay log-uniform 0.2–40 s.\n"
    );
    println!(
        "| process | trigger | lost on evidence (95 % upper) | lost at max | on evidence / at max | \
         commit − proxy, median / p99 | 5 s sleep: lost | 5 s sleep: median / p99 |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let tables = std::env::var("SIM_TABLES").unwrap_or_default();
    let table = |name: &str| tables.is_empty() || tables.split(',').any(|t| t.trim() == name);
    let mut broken = Vec::new();
    for (i, p) in family().iter().enumerate().filter(|_| table("family")) {
        if !p.name().contains(filter.as_str()) {
            continue;
        }
        for (j, phase) in [Phase::Random, Phase::GapStart, Phase::Young]
            .into_iter()
            .enumerate()
        {
            let s = simulate(p, phase, runs, seed ^ ((i as u64) << 8 | j as u64));
            let (lo, _) = clopper_pearson(s.lost, s.runs);
            if p.held_to_epsilon() && lo > 1e-3 {
                broken.push(format!("{} ({})", p.name(), phase.name()));
            }
            row(&p.name(), phase.name(), &s);
        }
    }
    println!(
        "\nPools and many proxies (a loss: a new connection that reaches the process through a \
         proxy that still routes here after the commit, a pool's reconnects included; commit − \
         the slowest proxy):\n"
    );
    println!(
        "| traffic | trigger | lost on evidence (95 % upper) | lost at max | on evidence / at max | \
         commit − slowest proxy, median / p99 | 5 s sleep: lost | 5 s sleep: median / p99 |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let scenarios: Vec<_> = scenarios().into_iter().chain(many_peers()).collect();
    for (i, sc) in scenarios.iter().enumerate().filter(|_| table("scenarios")) {
        if !sc.name().contains(filter.as_str()) {
            continue;
        }
        let s = simulate_scenario(sc, runs, seed ^ (0x5c << 16 | i as u64));
        let (lo, _) = clopper_pearson(s.lost, s.runs);
        if lo > 1e-3 {
            broken.push(format!("{} (random)", sc.name()));
        }
        row(&sc.name(), "random", &s);
    }
    for (i, pool) in lifo_pools().iter().enumerate().filter(|_| table("lifo")) {
        if !pool.name().contains(filter.as_str()) {
            continue;
        }
        let s = simulate_lifo(pool, runs, seed ^ (0x11f0 << 16 | i as u64));
        let (lo, _) = clopper_pearson(s.lost, s.runs);
        if lo > 1e-3 {
            broken.push(format!("{} (random)", pool.name()));
        }
        row(&pool.name(), "random", &s);
    }
    for (i, router) in routers().iter().enumerate().filter(|_| table("routers")) {
        if !router.name().contains(filter.as_str()) {
            continue;
        }
        let s = simulate_router(router, runs, seed ^ (0x7e57 << 16 | i as u64));
        let (lo, _) = clopper_pearson(s.lost, s.runs);
        if lo > 1e-3 {
            broken.push(format!("{} (random)", router.name()));
        }
        row(&router.name(), "random", &s);
    }
    // Not held to ε: a client pool declared by mistake to route per request.
    for (i, pool) in lifo_pools()
        .iter()
        .enumerate()
        .filter(|_| table("declared"))
    {
        let name = format!(
            "{}, declared per request by mistake (not held to ε)",
            pool.name()
        );
        if !name.contains(filter.as_str()) {
            continue;
        }
        let s = simulate_lifo_declared(pool, runs, seed ^ (0xdec1 << 16 | i as u64));
        row(&name, "random", &s);
    }
    // Served past `max`: every commit here is at or past `max`, and a loss is a connection
    // through the proxy after it, whatever the commit went on.
    for (i, rate) in PAST_MAX_RATES
        .into_iter()
        .enumerate()
        .filter(|_| table("past-max"))
    {
        let held = past_max_held_to_epsilon(rate);
        let name = format!(
            "Poisson {rate}/s, proxy {}–{} s late (past max; lost at max is the row's loss{})",
            PAST_MAX.0,
            PAST_MAX.1,
            if held { "" } else { "; not held to ε" }
        );
        if !name.contains(filter.as_str()) {
            continue;
        }
        let s = simulate_past_max(rate, runs, seed ^ (0x9a57 << 16 | i as u64));
        let (lo, _) = clopper_pearson(s.lost + s.lost_at_max, s.runs);
        if held && lo > 1e-3 {
            broken.push(format!("{name} (random)"));
        }
        row(&name, "random", &s);
    }
    if !broken.is_empty() {
        eprintln!(
            "ε broken (95 % lower bound above 10⁻³): {}",
            broken.join(", ")
        );
        std::process::exit(1);
    }
}

fn row(name: &str, phase: &str, s: &Summary) {
    let (_, hi) = clopper_pearson(s.lost, s.runs);
    let pct = |k: u64| format!("{:.2} %", 100.0 * k as f64 / s.runs as f64);
    println!(
        "| {} | {} | {} ({:.1e}) | {} | {} / {} | {:+.1} s / {:+.1} s | {} | {:+.1} s / {:+.1} s |",
        name,
        phase,
        s.lost,
        hi,
        pct(s.lost_at_max),
        pct(s.on_evidence),
        pct(s.at_max),
        s.median,
        s.p99,
        pct(s.lost_sleep),
        s.median_sleep,
        s.p99_sleep,
    );
}

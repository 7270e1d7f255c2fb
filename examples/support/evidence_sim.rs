//! The propagation simulation: arrival processes, a seeded generator, and the runs that drive
//! lameduck's own estimator and policy check (`lameduck::__private::evidence_sim::drain`) in virtual
//! time. Shared by `tests/evidence_sim.rs` (run by `cargo test`) and
//! `examples/evidence_sim.rs` (the full table).
//!
//! One run: the process runs from t = 0; the trigger comes at a random instant between 40 s
//! and 70 s (a full 30 s window behind it) or, for the worst phase, right after the last
//! arrival before that instant — at the start of the gap that instant fell in, so the gap is
//! picked in proportion to its length; the proxies stop routing here `D` after the trigger,
//! `D` log-uniform between 0.2 s and 40 s, so the trace ends there. A run *loses* when a
//! connection arrives after the commit and before the proxies stopped: after a commit on
//! evidence (`confidence`), that is what ε bounds; after a commit at `max` (the proxies were
//! slower than `max`, the traffic never went quiet), no rule could have helped and it is
//! counted apart. A fixed 5 s sleep is run on the same traces.
//!
//! The third phase, *young*: the process has served only 6–30 s when the trigger comes (a
//! random instant), and the proxies began routing here a log-uniform 0.2–40 s after it
//! started serving (so the window holds the proxies' startup, and is short, or empty); the
//! traffic is the process's from t = 0, of which only what came after that startup arrives.

#![allow(dead_code)] // each user takes what it needs

use std::time::Duration;

use lameduck::__private::evidence_sim::{drain, Arrival, DrainOutcome, What};
use lameduck::report::{EvidenceKind, SilenceRule};
use lameduck::Propagation;

/// splitmix64: small, seeded, good enough to draw arrival times.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1).
    pub(crate) fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    pub(crate) fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    pub(crate) fn exp(&mut self, rate: f64) -> f64 {
        -self.unit().ln() / rate
    }

    pub(crate) fn log_uniform(&mut self, lo: f64, hi: f64) -> f64 {
        (lo.ln() + (hi.ln() - lo.ln()) * self.unit()).exp()
    }

    /// Pareto with scale `xm` and shape `alpha`.
    pub(crate) fn pareto(&mut self, xm: f64, alpha: f64) -> f64 {
        xm / self.unit().powf(1.0 / alpha)
    }
}

/// An arrival process: new connections (or requests) at the instants it draws, in seconds.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Process {
    /// Independent arrivals at `rate` per second.
    Poisson { rate: f64 },
    /// A connection every `every` seconds for `on` seconds, then nothing for `off`; the cycle
    /// starts at a random phase.
    OnOff { on: f64, off: f64, every: f64 },
    /// `size` connections spread over `spread` seconds every `period` seconds.
    Bursts { period: f64, size: u32, spread: f64 },
    /// Poisson at `rates[s]` in state `s`, which lasts an exponential time of mean
    /// `means[s]` seconds (a Markov-modulated Poisson process).
    Modulated { rates: [f64; 2], means: [f64; 2] },
    /// Gaps drawn from a Pareto law (scale `xm` seconds, shape `alpha`): heavy-tailed.
    Pareto { xm: f64, alpha: f64 },
    /// Poisson whose rate goes linearly from `from` at 0 s to `to` at `over` seconds.
    Ramp { from: f64, to: f64, over: f64 },
    /// Poisson at `rate` that pauses at the trigger for reasons of its own, for a time
    /// uniform in `pause` seconds, then resumes: not held to ε (see `held_to_epsilon`).
    PausesAtTrigger { rate: f64, pause: (f64, f64) },
}

impl Process {
    /// Whether the process is held to ε. A rate that stops at the trigger for reasons of its
    /// own looks exactly like converged proxies: no local evidence can tell them apart.
    pub(crate) fn held_to_epsilon(&self) -> bool {
        !matches!(self, Process::PausesAtTrigger { .. })
    }

    pub(crate) fn name(&self) -> String {
        match *self {
            Process::Poisson { rate } => format!("Poisson {rate}/s"),
            Process::OnOff { on, off, every } => {
                format!(
                    "on/off {on} s on / {off} s off, every {} ms",
                    every * 1000.0
                )
            }
            Process::Bursts {
                period,
                size,
                spread,
            } => format!(
                "bursts of {size} in {} ms every {period} s",
                spread * 1000.0
            ),
            Process::Modulated { rates, means } => format!(
                "Markov-modulated {}/s ({} s) ↔ {}/s ({} s)",
                rates[0], means[0], rates[1], means[1]
            ),
            Process::Pareto { xm, alpha } => {
                format!("Pareto gaps, scale {} ms, shape {alpha}", xm * 1000.0)
            }
            Process::Ramp { from, to, over } => format!("ramp {from}/s → {to}/s over {over} s"),
            Process::PausesAtTrigger { rate, pause } => format!(
                "Poisson {rate}/s pausing at the trigger for {}–{} s (not held to ε)",
                pause.0, pause.1
            ),
        }
    }

    /// The arrival instants in `[from, to)`, in seconds, sorted; `trigger` for the process
    /// that pauses there.
    pub(crate) fn arrivals(&self, rng: &mut Rng, from: f64, to: f64, trigger: f64) -> Vec<f64> {
        let mut out = Vec::new();
        match *self {
            Process::Poisson { rate } => poisson(rng, rate, from, to, &mut out),
            Process::OnOff { on, off, every } => {
                let period = on + off;
                let phase = rng.uniform(0.0, period);
                let mut cycle = ((from - phase) / period).floor() * period + phase;
                while cycle < to {
                    let mut t = cycle;
                    while t < cycle + on {
                        if t >= from && t < to {
                            out.push(t);
                        }
                        t += every;
                    }
                    cycle += period;
                }
            }
            Process::Bursts {
                period,
                size,
                spread,
            } => {
                let phase = rng.uniform(0.0, period);
                let mut start = ((from - phase) / period).floor() * period + phase;
                while start < to {
                    let mut burst: Vec<f64> = (0..size)
                        .map(|_| start + rng.uniform(0.0, spread))
                        .filter(|&t| t >= from && t < to)
                        .collect();
                    burst.sort_by(f64::total_cmp);
                    out.extend(burst);
                    start += period;
                }
            }
            Process::Modulated { rates, means } => {
                // The stationary chance of each state, then alternate.
                let mut state = usize::from(rng.unit() >= means[0] / (means[0] + means[1]));
                let mut t = from;
                while t < to {
                    let end = (t + rng.exp(1.0 / means[state])).min(to);
                    poisson(rng, rates[state], t, end, &mut out);
                    t = end;
                    state = 1 - state;
                }
            }
            Process::Pareto { xm, alpha } => {
                // Start inside a gap, as a process long under way would.
                let first = rng.pareto(xm, alpha);
                let mut t = from - rng.uniform(0.0, first);
                while t < to {
                    t += rng.pareto(xm, alpha);
                    if t >= from && t < to {
                        out.push(t);
                    }
                }
            }
            Process::Ramp {
                from: r0,
                to: r1,
                over,
            } => {
                // Thinning: Poisson at the top rate, each kept with rate(t) / top.
                let rate = |t: f64| r0 + (r1 - r0) * (t / over).clamp(0.0, 1.0);
                let top = r0.max(r1);
                let mut t = from;
                loop {
                    t += rng.exp(top);
                    if t >= to {
                        break;
                    }
                    if rng.unit() * top < rate(t) {
                        out.push(t);
                    }
                }
            }
            Process::PausesAtTrigger { rate, pause } => {
                poisson(rng, rate, from, trigger.min(to), &mut out);
                let resume = trigger + rng.uniform(pause.0, pause.1);
                if resume < to {
                    poisson(rng, rate, resume, to, &mut out);
                }
            }
        }
        out
    }
}

fn poisson(rng: &mut Rng, rate: f64, from: f64, to: f64, out: &mut Vec<f64>) {
    if rate <= 0.0 {
        return;
    }
    let mut t = from;
    loop {
        t += rng.exp(rate);
        if t >= to {
            return;
        }
        out.push(t);
    }
}

/// The family the simulation covers.
pub(crate) fn family() -> Vec<Process> {
    use Process::*;
    vec![
        Poisson { rate: 0.5 },
        Poisson { rate: 2.0 },
        Poisson { rate: 10.0 },
        Poisson { rate: 50.0 },
        OnOff {
            on: 5.0,
            off: 5.0,
            every: 0.1,
        },
        OnOff {
            on: 2.0,
            off: 8.0,
            every: 0.1,
        },
        OnOff {
            on: 1.0,
            off: 1.0,
            every: 0.1,
        },
        Bursts {
            period: 2.0,
            size: 10,
            spread: 0.1,
        },
        Bursts {
            period: 10.0,
            size: 50,
            spread: 0.2,
        },
        Modulated {
            rates: [20.0, 0.5],
            means: [5.0, 5.0],
        },
        Modulated {
            rates: [50.0, 0.0],
            means: [3.0, 3.0],
        },
        Pareto {
            xm: 0.1,
            alpha: 2.5,
        },
        Pareto {
            xm: 0.02,
            alpha: 1.2,
        },
        Ramp {
            from: 0.5,
            to: 20.0,
            over: 70.0,
        },
        Ramp {
            from: 20.0,
            to: 0.5,
            over: 70.0,
        },
        PausesAtTrigger {
            rate: 10.0,
            pause: (2.0, 20.0),
        },
    ]
}

/// Where the trigger falls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// A random instant.
    Random,
    /// Right after an arrival: at the start of the gap a random instant fell in.
    GapStart,
    /// A random instant 6–30 s after serving began, the proxies routing here from a random
    /// startup delay on.
    Young,
}

impl Phase {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Phase::Random => "random",
            Phase::GapStart => "gap start",
            Phase::Young => "young",
        }
    }
}

/// What one run measured.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Run {
    /// The proxies' delay after the trigger, seconds.
    pub(crate) proxy: f64,
    /// The commit, seconds after the trigger.
    pub(crate) commit: f64,
    pub(crate) kind: EvidenceKind,
    pub(crate) rule: Option<SilenceRule>,
    /// A connection arrived after the commit and before the proxies stopped.
    pub(crate) lost: bool,
    /// The same for a fixed 5 s sleep.
    pub(crate) lost_sleep: bool,
}

pub(crate) const SLEEP: f64 = 5.0;

/// One drain of `process` with the trigger at `phase`, seeded by `rng`.
pub(crate) fn run(process: &Process, phase: Phase, rng: &mut Rng) -> Run {
    let instant = if phase == Phase::Young {
        rng.uniform(6.0, 30.0)
    } else {
        rng.uniform(40.0, 70.0)
    };
    let proxy = rng.log_uniform(0.2, 40.0);
    // Only the last 30 s before the trigger are read; up to 60 s of history are drawn, so
    // the window is full even when the trigger moves back to the start of a long gap.
    let from = (instant - 60.0).max(0.0);
    let horizon = 110.0;
    let mut trace = process.arrivals(rng, from, horizon, instant);
    if phase == Phase::Young {
        let startup = rng.log_uniform(0.2, 40.0);
        trace.retain(|&t| t >= startup);
    }
    let trigger = match phase {
        Phase::Random | Phase::Young => instant,
        Phase::GapStart => match trace.iter().rev().find(|&&t| t < instant) {
            Some(&t) => t + 1e-6,
            None => instant,
        },
    };
    if let Process::PausesAtTrigger { .. } = process {
        // The pause was drawn at `instant`; keep it at the trigger.
        if phase == Phase::GapStart {
            let shift = instant - trigger;
            for t in trace.iter_mut().filter(|t| **t >= instant) {
                *t -= shift;
            }
        }
    }
    let stop = trigger + proxy;
    trace.retain(|&t| t < stop);
    let arrivals: Vec<Arrival> = trace
        .iter()
        .map(|&t| Arrival::new(Duration::from_secs_f64(t), 0, What::Fresh))
        .collect();
    let out = drain(
        &arrivals,
        Duration::from_secs_f64(trigger),
        &Propagation::default(),
        Duration::from_secs(30),
    )
    .expect("the default policy");
    let commit = out.commit.as_secs_f64();
    let commit_at = trigger + commit;
    let lost = trace.iter().any(|&t| t > commit_at);
    let lost_sleep = trace.iter().any(|&t| t > trigger + SLEEP);
    Run {
        proxy,
        commit,
        kind: out.kind(),
        rule: out.evidence.rule,
        lost,
        lost_sleep,
    }
}

/// Clopper–Pearson one-sided 95 % bounds of a binomial fraction `k / n`: `(lower, upper)`.
pub(crate) fn clopper_pearson(k: u64, n: u64) -> (f64, f64) {
    // P(X ≤ k) for X ~ Bin(n, p), summed in logs.
    let cdf = |p: f64| -> f64 {
        if p <= 0.0 {
            return 1.0;
        }
        if p >= 1.0 {
            return if k >= n { 1.0 } else { 0.0 };
        }
        let (lp, lq) = (p.ln(), (1.0 - p).ln());
        let mut ln_choose = 0.0f64;
        let mut sum = 0.0;
        for i in 0..=k.min(n) {
            if i > 0 {
                ln_choose += ((n - i + 1) as f64).ln() - (i as f64).ln();
            }
            sum += (ln_choose + i as f64 * lp + (n - i) as f64 * lq).exp();
        }
        sum.min(1.0)
    };
    let solve = |f: &dyn Fn(f64) -> bool| {
        // The p where `f` turns from true to false, by bisection.
        let (mut lo, mut hi) = (0.0f64, 1.0f64);
        for _ in 0..60 {
            let mid = (lo + hi) / 2.0;
            if f(mid) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        (lo + hi) / 2.0
    };
    let upper = if k >= n {
        1.0
    } else {
        solve(&|p| cdf(p) > 0.05)
    };
    let lower = if k == 0 {
        0.0
    } else {
        // P(X ≥ k) = 1 − P(X ≤ k − 1) = 0.05.
        let below = |p: f64| {
            if k == 0 {
                return 0.0;
            }
            let km = k - 1;
            let (lp, lq) = (p.ln(), (1.0 - p).ln());
            let mut ln_choose = 0.0f64;
            let mut sum = 0.0;
            for i in 0..=km {
                if i > 0 {
                    ln_choose += ((n - i + 1) as f64).ln() - (i as f64).ln();
                }
                sum += (ln_choose + i as f64 * lp + (n - i) as f64 * lq).exp();
            }
            1.0 - sum.min(1.0)
        };
        solve(&|p| below(p) < 0.05)
    };
    (lower, upper)
}

/// The summary of `runs` of one process at one phase.
#[derive(Clone, Debug)]
pub(crate) struct Summary {
    pub(crate) runs: u64,
    /// Lost after a commit on evidence (held to ε).
    pub(crate) lost: u64,
    /// Lost after a commit at `max`: the proxies were slower than `max`.
    pub(crate) lost_at_max: u64,
    pub(crate) lost_sleep: u64,
    /// Commits on evidence, at max.
    pub(crate) on_evidence: u64,
    pub(crate) at_max: u64,
    pub(crate) by_longest_gap: u64,
    /// Median and p99 of commit − proxy delay, seconds; the same for the sleep.
    pub(crate) median: f64,
    pub(crate) p99: f64,
    pub(crate) median_sleep: f64,
    pub(crate) p99_sleep: f64,
}

pub(crate) fn summarize(runs: &[Run]) -> Summary {
    let mut after: Vec<f64> = runs.iter().map(|r| r.commit - r.proxy).collect();
    let mut after_sleep: Vec<f64> = runs.iter().map(|r| SLEEP - r.proxy).collect();
    after.sort_by(f64::total_cmp);
    after_sleep.sort_by(f64::total_cmp);
    let q = |v: &[f64], q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    let count = |f: &dyn Fn(&Run) -> bool| runs.iter().filter(|r| f(r)).count() as u64;
    Summary {
        runs: runs.len() as u64,
        lost: count(&|r| r.lost && r.kind != EvidenceKind::Max),
        lost_at_max: count(&|r| r.lost && r.kind == EvidenceKind::Max),
        lost_sleep: count(&|r| r.lost_sleep),
        on_evidence: count(&|r| r.kind == EvidenceKind::Confidence),
        at_max: count(&|r| r.kind == EvidenceKind::Max),
        by_longest_gap: count(&|r| {
            r.kind == EvidenceKind::Confidence && r.rule == Some(SilenceRule::LongestGap)
        }),
        median: q(&after, 0.5),
        p99: q(&after, 0.99),
        median_sleep: q(&after_sleep, 0.5),
        p99_sleep: q(&after_sleep, 0.99),
    }
}

/// Runs `n` drains of `process` at `phase`, seeded by `seed`.
pub(crate) fn simulate(process: &Process, phase: Phase, n: u64, seed: u64) -> Summary {
    simulate_runs(n, seed, |rng| run(process, phase, rng))
}

/// `n` runs of `one`, seeded by `seed`, summarized.
fn simulate_runs(n: u64, seed: u64, mut one: impl FnMut(&mut Rng) -> Run) -> Summary {
    let mut rng = Rng::new(seed);
    let runs: Vec<Run> = (0..n).map(|_| one(&mut rng)).collect();
    summarize(&runs)
}

// ---- Scenarios beyond one process through one proxy: kept-alive pools, many proxies ----

/// How the proxies' convergence times spread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Spread {
    /// Each proxy log-uniform in 0.2–40 s after the trigger, independently.
    LogUniform,
    /// All but one log-uniform in 0.2–2 s; one straggler log-uniform in 5–40 s.
    Straggler,
}

/// How the traffic splits over the proxies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Shares {
    Equal,
    /// Proxy i carries a share proportional to 1/i.
    Zipf,
}

/// A kept-alive client pool: `conns` connections to this process, `rate` requests/s over them
/// in all; when the server closes one, the client reconnects through its proxy on its next
/// request and lands here again with chance 1/`endpoints` while the proxy still routes here,
/// else elsewhere, where it stays.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pool {
    pub(crate) conns: u32,
    pub(crate) rate: f64,
    pub(crate) endpoints: u32,
}

/// A drain's traffic: per proxy, fresh connections and pools, each on a path (peer) of its
/// own or sharing one.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Scenario {
    /// One proxy: a pool, and fresh connections at `fresh` per second (already the share
    /// that lands here), from the same peer or from two.
    Pooled {
        pool: Pool,
        fresh: f64,
        same_peer: bool,
    },
    /// `n` proxies converging on their own schedules, each with its share of `fresh`
    /// connections per second from a peer of its own, and, with `pool`, a pool of its own
    /// from another peer.
    Proxies {
        n: u32,
        shares: Shares,
        spread: Spread,
        fresh: f64,
        pool: Option<Pool>,
    },
    /// Many client Pods, most of them one-off, on `proxies` nodes converging on their own
    /// schedules: per node a peer at `dense` fresh connections per second — but for the last
    /// node, with `sparse`, whose one peer opens that many; and `one_offs` peers that each open one connection, at a
    /// uniform instant of the process's life (7 to 8 minutes long, the trigger near its
    /// end; with `early`, all in its first 4 minutes), each behind a node of its own choice.
    ManyPeers {
        proxies: u32,
        dense: f64,
        sparse: Option<f64>,
        one_offs: u32,
        early: bool,
    },
}

impl Scenario {
    pub(crate) fn name(&self) -> String {
        let pool = |p: &Pool| {
            format!(
                "pool of {} at {}/s ({} endpoints)",
                p.conns, p.rate, p.endpoints
            )
        };
        match self {
            Scenario::Pooled {
                pool: p,
                fresh,
                same_peer,
            } => {
                if *fresh == 0.0 {
                    pool(p)
                } else {
                    format!(
                        "{} + fresh {fresh}/s, {}",
                        pool(p),
                        if *same_peer { "one peer" } else { "two peers" }
                    )
                }
            }
            Scenario::Proxies {
                n,
                shares,
                spread,
                fresh,
                pool: p,
            } => format!(
                "{n} proxies, {}, {}, fresh {fresh}/s{}",
                match shares {
                    Shares::Equal => "equal shares",
                    Shares::Zipf => "Zipf shares",
                },
                match spread {
                    Spread::LogUniform => "each 0.2–40 s",
                    Spread::Straggler => "one straggler",
                },
                p.map_or(String::new(), |p| format!(" + a {} each", pool(&p)))
            ),
            Scenario::ManyPeers {
                proxies,
                dense,
                sparse,
                one_offs,
                early,
            } => format!(
                "{proxies} nodes, a peer at {dense}/s on each{}, {one_offs} one-off peers{}",
                sparse.map_or(String::new(), |r| format!(" but the last, at {r}/s")),
                if *early {
                    " in the first 4 minutes"
                } else {
                    " over the process's life"
                }
            ),
        }
    }
}

/// Many peers, most of them one-off: the rows of the arrival table age out, and a row shared by
/// peers beyond it proves no silence. Without that, 15 one-off peers early in the process's
/// life left every later peer on one shared row, judged as one path: a dense peer's silence
/// passed for a sparse one's.
pub(crate) fn many_peers() -> Vec<Scenario> {
    vec![
        Scenario::ManyPeers {
            proxies: 2,
            dense: 20.0,
            sparse: Some(0.5),
            one_offs: 40,
            early: true,
        },
        Scenario::ManyPeers {
            proxies: 3,
            dense: 20.0,
            sparse: None,
            one_offs: 10,
            early: false,
        },
        Scenario::ManyPeers {
            proxies: 3,
            dense: 20.0,
            sparse: Some(2.0),
            one_offs: 400,
            early: false,
        },
    ]
}

/// The scenarios the simulation covers beside the single-process family.
pub(crate) fn scenarios() -> Vec<Scenario> {
    let pool = Pool {
        conns: 32,
        rate: 22.0,
        endpoints: 2,
    };
    let mut out = vec![
        Scenario::Pooled {
            pool,
            fresh: 0.0,
            same_peer: false,
        },
        Scenario::Pooled {
            pool,
            fresh: 2.5,
            same_peer: true,
        },
        Scenario::Pooled {
            pool,
            fresh: 2.5,
            same_peer: false,
        },
        Scenario::Pooled {
            pool,
            fresh: 0.33,
            same_peer: true,
        },
        Scenario::Pooled {
            pool: Pool {
                conns: 4,
                rate: 50.0,
                endpoints: 2,
            },
            fresh: 25.0,
            same_peer: true,
        },
        Scenario::Pooled {
            pool: Pool {
                conns: 2,
                rate: 20.0,
                endpoints: 2,
            },
            fresh: 2.5,
            same_peer: true,
        },
        Scenario::Pooled {
            pool: Pool {
                conns: 8,
                rate: 40.0,
                endpoints: 5,
            },
            fresh: 0.0,
            same_peer: false,
        },
    ];
    for n in [2, 5, 20] {
        for shares in [Shares::Equal, Shares::Zipf] {
            for spread in [Spread::LogUniform, Spread::Straggler] {
                out.push(Scenario::Proxies {
                    n,
                    shares,
                    spread,
                    fresh: 50.0,
                    pool: None,
                });
            }
        }
    }
    for n in [2, 5] {
        out.push(Scenario::Proxies {
            n,
            shares: Shares::Equal,
            spread: Spread::LogUniform,
            fresh: 50.0,
            pool: Some(pool),
        });
    }
    out
}

/// One pool connection's requests after the trigger, each with the coin that says whether a
/// reconnect at that request would land here.
struct PoolConn {
    after: Vec<(f64, bool)>,
}

impl PoolConn {
    /// Whether the connection delivers a new connection here at or after `commit` while its
    /// proxy (converging at `stop`) still routes here: closed by the drain (or at the commit,
    /// should it still be open then), it reconnects on its next request.
    fn lost(&self, commit: f64, stop: f64) -> bool {
        for (i, &(t, here)) in self.after.iter().enumerate() {
            let reconnect = i > 0 || t >= commit;
            if !reconnect {
                continue; // served on the kept connection, which closes after it
            }
            if !(t < stop && here) {
                return false; // landed elsewhere, and stays there
            }
            if t >= commit {
                return true;
            }
        }
        false
    }
}

/// Appends `pool`'s arrivals on `path` from `from` (connections opened then, long before the
/// window) to `horizon`, the drain triggered at `trigger`, its proxy routing here until
/// `stop`; returns the connections, for the losses.
fn pool_trace(
    rng: &mut Rng,
    pool: Pool,
    path: u16,
    (from, trigger, stop, horizon): (f64, f64, f64, f64),
    out: &mut Vec<(f64, u16, What)>,
) -> Vec<PoolConn> {
    let per = pool.rate / f64::from(pool.conns);
    let mut conns = Vec::new();
    for _ in 0..pool.conns {
        out.push((from, path, What::Open));
        let mut t = from;
        let mut after = Vec::new();
        loop {
            t += rng.exp(per);
            if t >= horizon {
                break;
            }
            if t < trigger {
                out.push((t, path, What::Request));
            } else {
                let here = rng.unit() < 1.0 / f64::from(pool.endpoints);
                after.push((t, here));
            }
        }
        // Before any commit: the first request after the trigger on the kept connection, then
        // reconnects for as long as they land here.
        for (i, &(t, here)) in after.iter().enumerate() {
            if i == 0 {
                out.push((t, path, What::Request));
                out.push((t + 1e-4, path, What::Close));
                continue;
            }
            if !(t < stop && here) {
                break;
            }
            out.push((t, path, What::Open));
            out.push((t + 1e-4, path, What::Close));
        }
        conns.push(PoolConn { after });
    }
    conns
}

/// The default policy's drain over `out` (seconds, path, what; in any order), triggered at
/// `trigger` seconds, with a 30 s grace.
fn drain_trace(out: Vec<(f64, u16, What)>, trigger: f64) -> DrainOutcome {
    drain_trace_with(out, trigger, &Propagation::default())
}

/// [`drain_trace`] under `propagation`.
fn drain_trace_with(
    mut out: Vec<(f64, u16, What)>,
    trigger: f64,
    propagation: &Propagation,
) -> DrainOutcome {
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    let arrivals: Vec<Arrival> = out
        .iter()
        .map(|&(t, path, what)| Arrival::new(Duration::from_secs_f64(t.max(0.0)), path, what))
        .collect();
    drain(
        &arrivals,
        Duration::from_secs_f64(trigger),
        propagation,
        Duration::from_secs(30),
    )
    .expect("the default policy")
}

/// The default policy with the simulation's path 0 (peer 198.18.0.1) declared to route per
/// request.
fn path0_declared() -> Propagation {
    Propagation::default().per_request_peers(["198.18.0.1"])
}

/// One drain of a scenario, at a random trigger.
pub(crate) fn run_scenario(scenario: &Scenario, rng: &mut Rng) -> Run {
    // Many peers: a process 7 to 8 minutes old, so one-offs of long ago fill what they fill.
    let life = if matches!(scenario, Scenario::ManyPeers { .. }) {
        rng.uniform(420.0, 450.0)
    } else {
        rng.uniform(40.0, 70.0)
    };
    let trigger = life;
    let from = trigger - 60.0;
    let horizon = trigger + 70.0;
    let mut out: Vec<(f64, u16, What)> = Vec::new();
    // Per proxy: when it stops routing here; the fresh arrivals and pools it carries.
    let mut fresh: Vec<(f64, f64)> = Vec::new(); // (time, stop) of every fresh arrival here
    let mut pools: Vec<(PoolConn, f64)> = Vec::new();
    let stops: Vec<f64>;
    match *scenario {
        Scenario::Pooled {
            pool,
            fresh: rate,
            same_peer,
        } => {
            let stop = trigger + rng.log_uniform(0.2, 40.0);
            stops = vec![stop];
            let mut ts = Vec::new();
            poisson(rng, rate, from, stop, &mut ts);
            let fresh_path = if same_peer { 0 } else { 1 };
            for t in ts {
                out.push((t, fresh_path, What::Fresh));
                fresh.push((t, stop));
            }
            for c in pool_trace(rng, pool, 0, (from, trigger, stop, horizon), &mut out) {
                pools.push((c, stop));
            }
        }
        Scenario::Proxies {
            n,
            shares,
            spread,
            fresh: rate,
            pool,
        } => {
            let weights: Vec<f64> = (1..=n)
                .map(|i| match shares {
                    Shares::Equal => 1.0,
                    Shares::Zipf => 1.0 / f64::from(i),
                })
                .collect();
            let total: f64 = weights.iter().sum();
            let straggler = (rng.unit() * f64::from(n)) as u32;
            stops = (0..n)
                .map(|i| {
                    trigger
                        + match spread {
                            Spread::LogUniform => rng.log_uniform(0.2, 40.0),
                            Spread::Straggler if i == straggler => rng.log_uniform(5.0, 40.0),
                            Spread::Straggler => rng.log_uniform(0.2, 2.0),
                        }
                })
                .collect();
            for i in 0..n {
                let stop = stops[i as usize];
                let mut ts = Vec::new();
                poisson(rng, rate * weights[i as usize] / total, from, stop, &mut ts);
                let path = (2 * i) as u16;
                for t in ts {
                    out.push((t, path, What::Fresh));
                    fresh.push((t, stop));
                }
                if let Some(pool) = pool {
                    let window = (from, trigger, stop, horizon);
                    for c in pool_trace(rng, pool, path + 1, window, &mut out) {
                        pools.push((c, stop));
                    }
                }
            }
        }
        Scenario::ManyPeers {
            proxies,
            dense,
            sparse,
            one_offs,
            early,
        } => {
            stops = (0..proxies)
                .map(|_| trigger + rng.log_uniform(0.2, 40.0))
                .collect();
            for (i, &stop) in stops.iter().enumerate() {
                // The last node carries the sparse peer alone, when there is one.
                let rate = match sparse {
                    Some(r) if i + 1 == stops.len() => r,
                    _ => dense,
                };
                let mut ts = Vec::new();
                poisson(rng, rate, from, stop, &mut ts);
                for t in ts {
                    out.push((t, i as u16, What::Fresh));
                    fresh.push((t, stop));
                }
            }
            let last = if early { 240.0 } else { horizon };
            for k in 0..one_offs {
                let t = rng.uniform(0.0, last);
                let stop = stops[(rng.unit() * f64::from(proxies)) as usize];
                if t < stop {
                    out.push((t, (100 + k) as u16, What::Fresh));
                    fresh.push((t, stop));
                }
            }
        }
    }
    let o = drain_trace(out, trigger);
    let commit = o.commit.as_secs_f64();
    let lost_at = |c: f64| {
        let at = trigger + c;
        fresh.iter().any(|&(t, _)| t >= at) || pools.iter().any(|(p, stop)| p.lost(at, *stop))
    };
    let slowest = stops.iter().copied().fold(trigger, f64::max) - trigger;
    Run {
        proxy: slowest,
        commit,
        kind: o.kind(),
        rule: o.evidence.rule,
        lost: lost_at(commit),
        lost_sleep: lost_at(SLEEP),
    }
}

/// Runs `n` drains of `scenario`, seeded by `seed`.
pub(crate) fn simulate_scenario(scenario: &Scenario, n: u64, seed: u64) -> Summary {
    simulate_runs(n, seed, |rng| run_scenario(scenario, rng))
}

// ---- A pool that takes its most recently returned idle connection first ----

/// A client pool that takes its most recently returned idle connection first (hyper's does):
/// requests at `rate` per second, each lasting an exponential time of mean `service` seconds,
/// and, with `burst`, `size` more at once every `period` seconds (at a random phase), the
/// concurrency peaks that reach the connections parked at the bottom of its stack. A request
/// that finds no idle connection opens one through the proxy: it lands here with chance
/// 1/`endpoints` while the proxy routes here, else elsewhere. Nothing idles out in a run.
/// After the trigger a connection here is closed after its response (`Connection: close`),
/// and at the commit every one still open is closed; the pool then opens connections again
/// only when a peak needs them — which is when a parked connection's close costs a request,
/// if that new connection lands here after the commit while the proxy still routes here.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Lifo {
    pub(crate) rate: f64,
    pub(crate) service: f64,
    pub(crate) burst: Option<(f64, u32)>,
    /// `extra` requests/s more for `seconds` from an instant up to 3 s after the trigger: a
    /// surge of demand during the drain, which makes the pool open connections beyond its
    /// reconnect wave (and so look routed per request) while its proxy still routes here.
    pub(crate) surge: Option<(f64, f64)>,
    pub(crate) endpoints: u32,
}

impl Lifo {
    pub(crate) fn name(&self) -> String {
        format!(
            "most-recent-first pool, {}/s of {} ms{} ({} endpoints)",
            self.rate,
            self.service * 1000.0,
            self.burst.map_or(String::new(), |(period, size)| format!(
                " + {size} at once every {period} s"
            )) + &self.surge.map_or(String::new(), |(extra, secs)| format!(
                " + {extra}/s more for {secs} s from the drain on"
            )),
            self.endpoints
        )
    }

    /// Every request from `from` to `horizon`: start, duration, and the coin that says where a
    /// connection it opens lands (here when below 1/`endpoints`).
    fn requests(
        &self,
        rng: &mut Rng,
        (from, trigger, horizon): (f64, f64, f64),
    ) -> Vec<(f64, f64, f64)> {
        let mut starts = Vec::new();
        poisson(rng, self.rate, from, horizon, &mut starts);
        if let Some((extra, secs)) = self.surge {
            let at = trigger + rng.uniform(0.0, 3.0);
            poisson(rng, extra, at, (at + secs).min(horizon), &mut starts);
        }
        if let Some((period, size)) = self.burst {
            let mut t = from + rng.uniform(0.0, period);
            while t < horizon {
                starts.extend((0..size).map(|i| t + 1e-5 * f64::from(i)));
                t += period;
            }
        }
        starts.sort_by(f64::total_cmp);
        starts
            .into_iter()
            .map(|t| (t, rng.exp(1.0 / self.service), rng.unit()))
            .collect()
    }
}

/// One connection of a [`Lifo`] pool.
struct LifoConn {
    here: bool,
    open: bool,
    /// Told to close: it closes after the response in flight.
    closing: bool,
}

/// Plays a [`Lifo`] pool's requests against this process triggered at `trigger`, its proxy
/// routing here until `stop`, the drain committing at `commit` (`None`: never). Returns the
/// arrivals here on `path`, and whether a connection landed here after the commit.
fn lifo_play(
    pool: &Lifo,
    requests: &[(f64, f64, f64)],
    path: u16,
    (trigger, stop, commit): (f64, f64, Option<f64>),
) -> (Vec<(f64, u16, What)>, bool) {
    let mut out = Vec::new();
    let mut conns: Vec<LifoConn> = Vec::new();
    let mut idle: Vec<usize> = Vec::new();
    // (end, connection) of the requests in flight.
    let mut busy: Vec<(f64, usize)> = Vec::new();
    let mut committed = false;
    for &(t, dur, coin) in requests {
        // Responses that ended by now: the connection goes back on top of the stack, or
        // closes when it was told to.
        busy.sort_by(|a, b| b.0.total_cmp(&a.0));
        while busy.last().is_some_and(|&(end, _)| end <= t) {
            let (end, k) = busy.pop().expect("checked");
            let c = &mut conns[k];
            if c.closing && c.open {
                c.open = false;
                out.push((end, path, What::Close));
            } else if c.open {
                idle.push(k);
            }
        }
        if let Some(at) = commit.filter(|&at| !committed && t >= at) {
            committed = true;
            for c in conns.iter_mut().filter(|c| c.here && c.open) {
                c.open = false;
                out.push((at, path, What::Close));
            }
        }
        let k = loop {
            match idle.pop() {
                Some(k) if conns[k].open => break Some(k),
                Some(_) => continue,
                None => break None,
            }
        };
        let k = match k {
            Some(k) => {
                let c = &mut conns[k];
                if c.here {
                    out.push((t, path, What::Request));
                    c.closing |= t >= trigger;
                }
                k
            }
            None => {
                let here = t < stop && coin < 1.0 / f64::from(pool.endpoints);
                if here && committed {
                    return (out, true);
                }
                if here {
                    out.push((t, path, What::Open));
                }
                conns.push(LifoConn {
                    here,
                    open: true,
                    closing: here && t >= trigger,
                });
                conns.len() - 1
            }
        };
        busy.push((t + dur, k));
    }
    (out, false)
}

/// The most-recent-first pools the simulation covers.
pub(crate) fn lifo_pools() -> Vec<Lifo> {
    vec![
        Lifo {
            rate: 20.0,
            service: 0.05,
            burst: None,
            surge: None,
            endpoints: 2,
        },
        Lifo {
            rate: 20.0,
            service: 0.05,
            burst: Some((5.0, 8)),
            surge: None,
            endpoints: 2,
        },
        Lifo {
            rate: 50.0,
            service: 0.1,
            burst: Some((2.0, 4)),
            surge: None,
            endpoints: 3,
        },
        Lifo {
            rate: 5.0,
            service: 0.2,
            burst: Some((20.0, 16)),
            surge: None,
            endpoints: 2,
        },
        Lifo {
            rate: 20.0,
            service: 0.1,
            burst: None,
            surge: Some((300.0, 20.0)),
            endpoints: 2,
        },
        Lifo {
            rate: 20.0,
            service: 0.2,
            burst: Some((5.0, 8)),
            surge: Some((60.0, 5.0)),
            endpoints: 3,
        },
    ]
}

/// One drain with a [`Lifo`] pool on one path, at a random trigger, its proxy converging
/// log-uniform 0.2–40 s after it; with `declared`, the pool's peer declared (by mistake) to
/// route per request.
pub(crate) fn run_lifo(pool: &Lifo, declared: bool, rng: &mut Rng) -> Run {
    let trigger = rng.uniform(40.0, 70.0);
    let (from, horizon) = (trigger - 60.0, trigger + 70.0);
    let stop = trigger + rng.log_uniform(0.2, 40.0);
    let requests = pool.requests(rng, (from, trigger, horizon));
    let (out, _) = lifo_play(pool, &requests, 0, (trigger, stop, None));
    let propagation = if declared {
        path0_declared()
    } else {
        Propagation::default()
    };
    let o = drain_trace_with(out, trigger, &propagation);
    let commit = o.commit.as_secs_f64();
    let lost_at = |c: f64| lifo_play(pool, &requests, 0, (trigger, stop, Some(trigger + c))).1;
    if std::env::var("SIM_DEBUG").is_ok() && lost_at(commit) && o.kind() != EvidenceKind::Max {
        let p = &o.evidence.paths[0];
        eprintln!(
            "lost: commit {commit:.2} stop {:.2} {:?} open {} new {} open_now {} wait {:?} reused {:?} t_conf {:?}",
            stop - trigger, p.routing, p.open_at_trigger, p.new_after_trigger, p.open_now,
            p.pool_wait_ms, p.kept_reused, p.t_conf_ms
        );
    }
    Run {
        proxy: stop - trigger,
        commit,
        kind: o.kind(),
        rule: o.evidence.rule,
        lost: lost_at(commit),
        lost_sleep: lost_at(SLEEP),
    }
}

/// Runs `n` drains with `pool`, seeded by `seed`.
pub(crate) fn simulate_lifo(pool: &Lifo, n: u64, seed: u64) -> Summary {
    simulate_runs(n, seed, |rng| run_lifo(pool, false, rng))
}

/// Runs `n` drains with `pool` declared, by mistake, to route per request.
pub(crate) fn simulate_lifo_declared(pool: &Lifo, n: u64, seed: u64) -> Summary {
    simulate_runs(n, seed, |rng| run_lifo(pool, true, rng))
}

// ---- A router that chooses an endpoint per request (an L7 proxy), declared as such ----

/// An L7 proxy in front of this process: `rate` requests per second reach this process (its
/// share), over `conns` pooled upstream connections it keeps alive, until its health check or
/// endpoint watch drops this process (`stop`); then it sends nothing more, on any connection.
/// After the trigger each kept connection carries one more request, told to close with it;
/// the router's later requests here come on new connections, each closed after its answer.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Router {
    pub(crate) conns: u32,
    pub(crate) rate: f64,
    /// Requests come in bursts of this many at once (a fan-out), at `rate` / `burst` bursts/s.
    pub(crate) burst: u32,
}

impl Router {
    pub(crate) fn name(&self) -> String {
        format!(
            "L7 router, {}/s here over {} pooled connections{}, declared",
            self.rate,
            self.conns,
            if self.burst > 1 {
                format!(" (in bursts of {})", self.burst)
            } else {
                String::new()
            }
        )
    }
}

/// The per-request routers the simulation covers (declared as such).
pub(crate) fn routers() -> Vec<Router> {
    vec![
        Router {
            conns: 8,
            rate: 20.0,
            burst: 1,
        },
        Router {
            conns: 32,
            rate: 100.0,
            burst: 1,
        },
        Router {
            conns: 4,
            rate: 5.0,
            burst: 1,
        },
        Router {
            conns: 16,
            rate: 40.0,
            burst: 8,
        },
    ]
}

/// One drain behind a declared [`Router`] at a random trigger; its health check drops this
/// process log-uniform 0.2–40 s after it. A loss: a request here after the commit and before
/// that.
pub(crate) fn run_router(router: &Router, rng: &mut Rng) -> Run {
    let trigger = rng.uniform(40.0, 70.0);
    let (from, horizon) = (trigger - 60.0, trigger + 70.0);
    let stop = trigger + rng.log_uniform(0.2, 40.0);
    let mut bursts = Vec::new();
    poisson(
        rng,
        router.rate / f64::from(router.burst),
        from,
        stop.min(horizon),
        &mut bursts,
    );
    let times: Vec<f64> = bursts
        .iter()
        .flat_map(|&t| (0..router.burst).map(move |i| t + 1e-5 * f64::from(i)))
        .collect();
    let mut out: Vec<(f64, u16, What)> = (0..router.conns).map(|_| (from, 0, What::Open)).collect();
    let mut untold = router.conns;
    for &t in &times {
        if t < trigger {
            out.push((t, 0, What::Request));
        } else if untold > 0 {
            untold -= 1;
            out.push((t, 0, What::Request));
            out.push((t + 1e-4, 0, What::Close));
        } else {
            out.push((t, 0, What::Fresh));
        }
    }
    let o = drain_trace_with(out, trigger, &path0_declared());
    run_of(&o, &times, trigger, stop)
}

/// The run of a drain `o` triggered at `trigger` over arrivals at `times` through a proxy that
/// stopped routing here at `stop` (seconds): a loss is an arrival at or after the commit.
fn run_of(o: &DrainOutcome, times: &[f64], trigger: f64, stop: f64) -> Run {
    let commit = o.commit.as_secs_f64();
    let lost_at = |c: f64| times.iter().any(|&t| t >= trigger + c);
    Run {
        proxy: stop - trigger,
        commit,
        kind: o.kind(),
        rule: o.evidence.rule,
        lost: lost_at(commit),
        lost_sleep: lost_at(SLEEP),
    }
}

/// Runs `n` drains behind `router`, seeded by `seed`.
pub(crate) fn simulate_router(router: &Router, n: u64, seed: u64) -> Summary {
    simulate_runs(n, seed, |rng| run_router(router, rng))
}

// ---- A proxy slower than `max`: served past it while its connections keep arriving ----

/// The proxy's delay for [`run_past_max`]: uniform in this range of seconds after the trigger,
/// past `max` (15 s of the 30 s grace) and before the cap (the quiesce deadline less its
/// reserve, 23 s).
pub(crate) const PAST_MAX: (f64, f64) = (15.5, 22.0);

/// The rates of [`run_past_max`]'s rows, per second.
pub(crate) const PAST_MAX_RATES: [f64; 5] = [0.5, 1.0, 2.0, 5.0, 20.0];

/// Whether a [`run_past_max`] row at `rate` is held to ε: below 1/s the silence past `max` is
/// bounded at 10 s (so that one early connection does not hold a drain to the cap), which such
/// a path shows by chance more often.
pub(crate) fn past_max_held_to_epsilon(rate: f64) -> bool {
    rate >= 1.0
}

/// One drain of Poisson fresh connections at `rate` per second (the share that lands here)
/// through a proxy that stops routing here [`PAST_MAX`] after the trigger. Every loss here
/// comes after a commit at or past `max`: the drain saw the connections arriving at `max` and
/// served on until their silence said the proxy had stopped; a silence that came by chance
/// ended it early.
pub(crate) fn run_past_max(rate: f64, rng: &mut Rng) -> Run {
    let trigger = rng.uniform(40.0, 70.0);
    let stop = trigger + rng.uniform(PAST_MAX.0, PAST_MAX.1);
    let mut times = Vec::new();
    poisson(rng, rate, trigger - 60.0, stop, &mut times);
    let out = times.iter().map(|&t| (t, 0, What::Fresh)).collect();
    run_of(&drain_trace(out, trigger), &times, trigger, stop)
}

/// Runs `n` drains of [`run_past_max`] at `rate`, seeded by `seed`.
pub(crate) fn simulate_past_max(rate: f64, n: u64, seed: u64) -> Summary {
    simulate_runs(n, seed, |rng| run_past_max(rate, rng))
}

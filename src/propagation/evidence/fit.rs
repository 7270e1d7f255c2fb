//! The model behind the required silence: a two-state chain over busy and empty slots whose
//! uncertainty is kept (a Beta posterior for "an empty slot follows an empty slot"), the
//! number of chances the drain gives a gap to pass for convergence, and the longest gap seen
//! as a lower bound. The module docs of `evidence` say why.

use std::time::Duration;

use super::SLOT;
use crate::report::SilenceRule;

/// The strength, in slots, of the prior that pulls "an empty slot follows an empty slot"
/// towards "a slot is empty" (independent slots): with few empty slots seen, the chain is not
/// assumed stickier than the fraction of empty slots says, nor much less sticky.
const KAPPA: f64 = 10.0;

/// The heaviest-tailed gap law the model assumes the window may have missed: the chance
/// that a gap lasts k slots falls no faster than k^−TAIL (a Beta mixture of geometric laws
/// with `b` ≤ TAIL). The window holds tens of gaps, too few to tell a geometric tail from a
/// power law (pauses that last as long as the window, heavy-tailed clients); the simulation
/// (`tests/evidence_sim.rs`) shows ε holding with 2 on every process of its family, and
/// breaking with 3 on Markov-modulated and Pareto traffic.
const TAIL: f64 = 2.0;

/// Slots in the fit: the 120 of the window, the trigger's, and up to a ring-turn after it.
pub(crate) const MAX_SEQ: usize = 256;

/// A run of busy/empty slots, oldest first: the window before the trigger, then the trigger's
/// slot and those after it.
#[derive(Clone, Debug)]
pub(crate) struct Slots {
    bits: [u64; MAX_SEQ / 64],
    len: usize,
}

impl Slots {
    pub(crate) fn new() -> Self {
        Self {
            bits: [0; MAX_SEQ / 64],
            len: 0,
        }
    }

    /// Appends one slot; slots beyond [`MAX_SEQ`] are dropped (the caller never has more).
    pub(crate) fn push(&mut self, busy: bool) {
        if self.len < MAX_SEQ {
            if busy {
                self.bits[self.len / 64] |= 1 << (self.len % 64);
            }
            self.len += 1;
        }
    }

    fn get(&self, i: usize) -> bool {
        self.bits[i / 64] & (1 << (i % 64)) != 0
    }
}

/// The fit of the chain to a run of slots, and the silence it asks for.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Estimate {
    /// Slots of the window before the trigger (at most 120).
    pub(crate) slots_before: u64,
    /// Slots fitted from the trigger's on: up to the last one with a new connection.
    pub(crate) slots_after: u64,
    /// Of the slots observed (before the trigger, and fitted after it), those without activity.
    pub(crate) empty: u64,
    /// Transitions between consecutive fitted slots: empty→empty, empty→busy, busy→empty,
    /// busy→busy.
    ee: u64,
    eb: u64,
    be: u64,
    bb: u64,
    /// The longest run of empty slots that ended in the fit (or began at its start).
    pub(crate) longest_gap: u64,
    /// Empty slots between the last active slot and the trigger, when nothing arrived from
    /// the trigger's slot on: the part of the current gap that came before the trigger.
    pub(crate) elapsed: u64,
    /// Requests were seen, not only new connections.
    pub(crate) requests_seen: bool,
    pub(crate) epsilon: f64,
    /// `max` in slots: each busy slot before it is a chance for a gap to begin.
    horizon: u64,
}

impl Estimate {
    /// Fits the chain to `slots`, of which the first `before` are the window before the
    /// trigger. The trailing empty slots are the silence being tested and are not fitted;
    /// those before the trigger are the current gap's elapsed part.
    pub(crate) fn fit(
        slots: &Slots,
        before: usize,
        requests_seen: bool,
        epsilon: f64,
        max: Duration,
    ) -> Self {
        let before = before.min(slots.len);
        let last_busy = (0..slots.len).rev().find(|&i| slots.get(i));
        let mut e = Estimate {
            slots_before: before as u64,
            slots_after: 0,
            empty: 0,
            ee: 0,
            eb: 0,
            be: 0,
            bb: 0,
            longest_gap: 0,
            elapsed: 0,
            requests_seen,
            epsilon,
            horizon: (max.as_nanos() / SLOT.as_nanos()) as u64,
        };
        let Some(last) = last_busy else {
            e.elapsed = before as u64;
            e.empty = before as u64;
            return e;
        };
        e.slots_after = (last + 1).saturating_sub(before) as u64;
        e.elapsed = before.saturating_sub(last + 1) as u64;
        let mut run = 0;
        for i in 0..=last {
            let busy = slots.get(i);
            if i > 0 {
                match (slots.get(i - 1), busy) {
                    (false, false) => e.ee += 1,
                    (false, true) => e.eb += 1,
                    (true, false) => e.be += 1,
                    (true, true) => e.bb += 1,
                }
            }
            if busy {
                e.longest_gap = e.longest_gap.max(run);
                run = 0;
            } else {
                e.empty += 1;
                run += 1;
            }
        }
        e.empty += e.elapsed;
        e
    }

    /// Slots observed: the window, and the slots fitted after the trigger.
    fn observed(&self) -> u64 {
        self.slots_before + self.slots_after
    }

    /// Observed slots with activity.
    pub(crate) fn busy(&self) -> u64 {
        self.observed() - self.empty
    }

    /// p̂, the chance that a slot is empty, with half a slot of doubt either way.
    pub(crate) fn p_empty(&self) -> f64 {
        (self.empty as f64 + 0.5) / (self.observed() as f64 + 1.0)
    }

    /// λ̂, the equivalent Poisson rate of activity per second.
    pub(crate) fn rate(&self) -> f64 {
        -self.p_empty().ln() / SLOT.as_secs_f64()
    }

    /// â, the posterior mean chance that an empty slot follows an empty slot.
    pub(crate) fn stay_empty(&self) -> f64 {
        let (a, b) = self.beta();
        a / (a + b)
    }

    /// q̂, the chance that a gap begins after a busy slot.
    pub(crate) fn gap_start(&self) -> f64 {
        (self.be as f64 + 0.5) / ((self.be + self.bb) as f64 + 1.0)
    }

    /// The law of "empty follows empty" per gap: the Beta posterior of the transitions seen
    /// plus the prior, its tail made no lighter than [`TAIL`].
    fn beta(&self) -> (f64, f64) {
        let p = self.p_empty();
        let (a, b) = (
            self.ee as f64 + KAPPA * p,
            self.eb as f64 + KAPPA * (1.0 - p),
        );
        // The same mean, a heavier tail: no lighter than a power law of exponent TAIL.
        if b > TAIL {
            (a * TAIL / b, TAIL)
        } else {
            (a, b)
        }
    }

    /// The chances the drain gives a gap to begin: the current position, and each busy slot
    /// expected before `max`.
    pub(crate) fn chances(&self) -> f64 {
        1.0 + self.horizon as f64 * (1.0 - self.p_empty())
    }

    /// The silence after which, had the proxies still routed here, activity would have come
    /// with probability ≥ 1 − ε over the whole wait, and the bound that set it; `None` when
    /// even four times `max` would not be enough.
    pub(crate) fn required(&self) -> Option<(Duration, SilenceRule)> {
        let k_gap = self.longest_gap + 1;
        let limit = 4 * self.horizon + 8;
        let k_markov = self.markov_slots(limit)?;
        let (k, rule) = if k_gap > k_markov {
            (k_gap, SilenceRule::LongestGap)
        } else {
            (k_markov, SilenceRule::Markov)
        };
        // k whole empty slots: the drain counts them from the end of the last busy slot.
        Some((SLOT * k as u32, rule))
    }

    /// The fewest empty slots k such that a run of k (or of the elapsed part plus k) has
    /// chance ≤ ε over the drain's chances, up to `limit`.
    fn markov_slots(&self, limit: u64) -> Option<u64> {
        let (a, b) = self.beta();
        let q = self.gap_start();
        let future = (self.chances() - 1.0) * q;
        let g0 = self.elapsed;
        // E[s^(j+1)] = E[s^j] · (a + j) / (a + b + j) for s ~ Beta(a, b): the chance that a gap
        // already one slot long lasts j slots more, the uncertainty of s included.
        let step = |j: u64| (a + j as f64) / (a + b + j as f64);
        // m = E[s^(k−1)] for the gaps to come; cur = E[s^(g0+k−1)] / E[s^(g0−1)] for the gap
        // the trigger fell in, when it began before the trigger.
        let mut m = 1.0f64;
        let mut cur = if g0 > 0 { step(g0 - 1) } else { 1.0 };
        for k in 1..=limit {
            if k > 1 {
                m *= step(k - 2);
                if g0 > 0 {
                    cur *= step(g0 + k - 2);
                }
            }
            let now = if g0 == 0 { q * m } else { cur };
            if now + future * m <= self.epsilon {
                return Some(k);
            }
        }
        None
    }
}

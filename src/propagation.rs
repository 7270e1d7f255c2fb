//! When to commit to leaving: the quiet window (default) or a fixed delay.

use std::time::Duration;

use crate::budget::{Budget, DurationDisplay};
use crate::ConfigError;

const DEFAULT_QUIET: Duration = Duration::from_secs(2);
const DEFAULT_MIN: Duration = Duration::from_secs(2);

/// The propagation policy: how long to keep accepting after the trigger, while load balancers
/// catch up with the readiness flip.
///
/// * [`Propagation::quiet`] (the default, with `quiet = 2s`, `min = 2s`, `max = grace/2`): commit
///   once at least `min` has passed since the trigger **and** no new connection and no new
///   request has arrived for `quiet` **and** nothing is in flight; commit anyway at `max`.
///   This *measures* propagation instead of guessing it.
/// * [`Propagation::fixed`]: commit a fixed time after the trigger (a `sleep` in `preStop`,
///   done inside the process).
///
/// `max` is clamped to the quiesce deadline when it is left at its default; an explicit `max`
/// beyond it is a [`ConfigError`].
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use lameduck::{Drain, Propagation};
///
/// let drain = Drain::builder()
///     .grace_period(Duration::from_secs(60))
///     .propagation(
///         Propagation::quiet(Duration::from_secs(3))
///             .min(Duration::from_secs(5))
///             .max(Duration::from_secs(40)),
///     )
///     .build()?;
/// # Ok::<(), lameduck::ConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Propagation {
    kind: Kind,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Kind {
    Quiet {
        quiet: Option<Duration>,
        min: Option<Duration>,
        max: Option<Duration>,
    },
    Fixed(Duration),
}

impl Default for Propagation {
    fn default() -> Self {
        Self {
            kind: Kind::Quiet {
                quiet: None,
                min: None,
                max: None,
            },
        }
    }
}

impl Propagation {
    /// The quiet-window policy with the given quiet period; `min` and `max` keep their defaults
    /// until set.
    pub fn quiet(quiet: Duration) -> Self {
        Self {
            kind: Kind::Quiet {
                quiet: Some(quiet),
                min: None,
                max: None,
            },
        }
    }

    /// The earliest commit, counted from the trigger. Ignored by [`Propagation::fixed`].
    pub fn min(mut self, d: Duration) -> Self {
        if let Kind::Quiet { min, .. } = &mut self.kind {
            *min = Some(d);
        }
        self
    }

    /// The latest commit, counted from the trigger. Ignored by [`Propagation::fixed`].
    pub fn max(mut self, d: Duration) -> Self {
        if let Kind::Quiet { max, .. } = &mut self.kind {
            *max = Some(d);
        }
        self
    }

    /// Commit exactly `d` after the trigger, whatever the traffic.
    pub fn fixed(d: Duration) -> Self {
        Self {
            kind: Kind::Fixed(d),
        }
    }

    pub(crate) fn resolve(&self, budget: &Budget) -> Result<Policy, ConfigError> {
        let window = budget.quiesce_deadline();
        match self.kind {
            Kind::Fixed(d) => {
                if d > window {
                    return Err(ConfigError::propagation(format!(
                        "fixed propagation delay ({}) is past the quiesce deadline ({} after the trigger): \
                         lower the delay or raise grace_period",
                        DurationDisplay(d),
                        DurationDisplay(window)
                    )));
                }
                Ok(Policy::Fixed(d))
            }
            Kind::Quiet { quiet, min, max } => {
                let max = match max {
                    Some(m) if m > window => {
                        return Err(ConfigError::propagation(format!(
                            "propagation max ({}) is past the quiesce deadline ({} after the trigger \
                             = grace_period − safety_margin − close_budget): lower max or raise grace_period",
                            DurationDisplay(m),
                            DurationDisplay(window)
                        )))
                    }
                    Some(m) => m,
                    None => (budget.grace_period / 2).min(window),
                };
                let min = match min {
                    Some(m) if m > max => {
                        return Err(ConfigError::propagation(format!(
                            "propagation min ({}) is above max ({}): lower min or raise max",
                            DurationDisplay(m),
                            DurationDisplay(max)
                        )))
                    }
                    Some(m) => m,
                    None => DEFAULT_MIN.min(max),
                };
                let quiet = quiet.unwrap_or(DEFAULT_QUIET.min(max));
                if quiet.is_zero() {
                    return Err(ConfigError::propagation(
                        "propagation quiet window is zero: use Propagation::fixed for a fixed delay, \
                         or set quiet to e.g. 2s",
                    ));
                }
                Ok(Policy::Quiet { quiet, min, max })
            }
        }
    }
}

/// A validated policy, offsets from the origin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Policy {
    Quiet {
        quiet: Duration,
        min: Duration,
        max: Duration,
    },
    Fixed(Duration),
}

impl Policy {
    pub(crate) fn report(&self) -> crate::report::PolicyReport {
        let ms = |d: Duration| d.as_millis() as u64;
        match *self {
            Policy::Quiet { quiet, min, max } => crate::report::PolicyReport {
                kind: "quiet".to_owned(),
                quiet_ms: Some(ms(quiet)),
                min_ms: ms(min),
                max_ms: ms(max),
            },
            Policy::Fixed(d) => crate::report::PolicyReport {
                kind: "fixed".to_owned(),
                quiet_ms: None,
                min_ms: ms(d),
                max_ms: ms(d),
            },
        }
    }
}

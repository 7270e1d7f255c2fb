//! Grace-period arithmetic: one budget, counted from the first trigger.
//!
//! ```text
//! hard deadline     = origin + grace_period − safety_margin
//! quiesce deadline  = hard deadline − close_budget
//! propagation max   ≤ quiesce deadline
//! ```

use std::fmt;
use std::time::Duration;

use crate::vocab::error::ConfigError;

/// The environment variable read for the grace period when the builder is not given one.
pub const GRACE_PERIOD_ENV: &str = "LAMEDUCK_GRACE_PERIOD";

/// The environment variable read for the shortest grace the Pod may be given when the builder
/// is not given one ([`DrainBuilder::shortest_grace`](crate::DrainBuilder::shortest_grace)).
pub const SHORTEST_GRACE_ENV: &str = "LAMEDUCK_SHORTEST_GRACE";

pub(crate) const DEFAULT_GRACE: Duration = Duration::from_secs(30);
/// The longest grace period accepted. Kubernetes validates `terminationGracePeriodSeconds` only
/// as non-negative, so it gives no cap; a day is far past any drain worth the name, and keeps
/// every deadline (`origin + grace`) representable on any platform's monotonic clock.
pub const MAX_GRACE_PERIOD: Duration = Duration::from_secs(24 * 3600);
/// The shortest grace period accepted: Kubernetes counts `terminationGracePeriodSeconds` in
/// whole seconds (0 is an immediate SIGKILL), and below a second no drain can finish.
pub const MIN_GRACE_PERIOD: Duration = Duration::from_secs(1);
const DEFAULT_MARGIN: Duration = Duration::from_secs(1);
const DEFAULT_CLOSE: Duration = Duration::from_secs(5);

/// The resolved, validated budget. All offsets are from the drain's origin (the first trigger).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// The Pod's `terminationGracePeriodSeconds`.
    pub grace_period: Duration,
    /// Kept free before the hard deadline so the process exits before SIGKILL.
    pub safety_margin: Duration,
    /// Reserved for resource closers, before the hard deadline.
    pub close_budget: Duration,
}

impl Budget {
    /// Resolves the budget from explicit settings, the environment and the defaults.
    ///
    /// Defaults are sized for a 30 s grace period; for a shorter one the *defaults* of the
    /// margin and the close budget shrink in proportion. Explicit values are never changed.
    pub(crate) fn resolve(
        grace: Option<Duration>,
        margin: Option<Duration>,
        close: Option<Duration>,
        env: Option<&str>,
    ) -> Result<Self, ConfigError> {
        let grace_period = match (grace, env) {
            (Some(g), _) => g,
            (None, Some(raw)) => parse_duration(raw).map_err(|e| {
                ConfigError::env(format!(
                    "{GRACE_PERIOD_ENV}={raw:?} is not a duration ({e}); set it to e.g. `30s` or `30`"
                ))
            })?,
            (None, None) => DEFAULT_GRACE,
        };
        let from = if grace.is_none() && env.is_some() {
            GRACE_PERIOD_ENV
        } else {
            "grace_period"
        };
        if grace_period.is_zero() {
            return Err(ConfigError::budget(format!(
                "{from} is zero: set it to the Pod's terminationGracePeriodSeconds (e.g. 30s)"
            )));
        }
        if grace_period < MIN_GRACE_PERIOD {
            return Err(ConfigError::budget(format!(
                "{from} ({}) is below {}: Kubernetes counts terminationGracePeriodSeconds in whole \
                 seconds and no drain fits in less; set it to the Pod's terminationGracePeriodSeconds (e.g. 30s)",
                DurationDisplay(grace_period),
                DurationDisplay(MIN_GRACE_PERIOD),
            )));
        }
        if grace_period > MAX_GRACE_PERIOD {
            return Err(ConfigError::budget(format!(
                "{from} ({}) is above the maximum of {} (24h): set it to the Pod's \
                 terminationGracePeriodSeconds (e.g. 30s)",
                DurationDisplay(grace_period),
                DurationDisplay(MAX_GRACE_PERIOD),
            )));
        }
        let scale = |default: Duration| {
            if grace_period >= DEFAULT_GRACE {
                default
            } else {
                // Whole milliseconds, so messages and reports stay readable.
                let ms = default.as_millis() * grace_period.as_millis() / DEFAULT_GRACE.as_millis();
                Duration::from_millis(ms as u64)
            }
        };
        let safety_margin = margin.unwrap_or_else(|| scale(DEFAULT_MARGIN));
        let close_budget = close.unwrap_or_else(|| scale(DEFAULT_CLOSE));
        // Both are checked before they are added, so the sum cannot overflow.
        let reserved = close_budget.checked_add(safety_margin);
        if close_budget >= grace_period
            || safety_margin >= grace_period
            || reserved.is_none_or(|r| r >= grace_period)
        {
            return Err(ConfigError::budget(format!(
                "close_budget ({}) + safety_margin ({}) leaves nothing of grace_period ({}): \
                 lower close_budget or safety_margin, or raise grace_period",
                DurationDisplay(close_budget),
                DurationDisplay(safety_margin),
                DurationDisplay(grace_period),
            )));
        }
        Ok(Self {
            grace_period,
            safety_margin,
            close_budget,
        })
    }

    /// Resolves the shortest grace the Pod may be given (node shutdown, eviction): the explicit
    /// setting, else `env` (the value of `LAMEDUCK_SHORTEST_GRACE`), else none. It must be a
    /// grace period Kubernetes could give (at least 1 s) and no longer than `grace_period`
    /// (longer would never shorten a drain: a mistake worth a clear error); equal to it is
    /// allowed and changes nothing.
    pub(crate) fn resolve_shortest(
        &self,
        explicit: Option<Duration>,
        env: Option<&str>,
    ) -> Result<Option<Duration>, ConfigError> {
        let (d, from) = match (explicit, env.map(str::trim).filter(|v| !v.is_empty())) {
            (Some(d), _) => (d, "shortest_grace"),
            (None, Some(raw)) => (
                parse_duration(raw).map_err(|e| {
                    ConfigError::env(format!(
                        "{SHORTEST_GRACE_ENV}={raw:?} is not a duration ({e}); set it to the \
                         shortest grace the Pod may get, e.g. `15s` (a node shutdown's budget)"
                    ))
                })?,
                SHORTEST_GRACE_ENV,
            ),
            (None, None) => return Ok(None),
        };
        if d < MIN_GRACE_PERIOD {
            return Err(ConfigError::budget(format!(
                "{from} ({}) is below {}: no drain fits in less; set it to the shortest grace the \
                 Pod may get (e.g. 15s for a node shutdown), or leave it unset",
                DurationDisplay(d),
                DurationDisplay(MIN_GRACE_PERIOD),
            )));
        }
        if d > self.grace_period {
            return Err(ConfigError::budget(format!(
                "{from} ({}) is longer than grace_period ({}): it would never shorten a drain; \
                 set it to the shortest grace the Pod may get (node shutdown, eviction), at most \
                 the grace period",
                DurationDisplay(d),
                DurationDisplay(self.grace_period),
            )));
        }
        Ok(Some(d))
    }

    /// Offset of the hard deadline from the origin: the process must be gone by then.
    pub fn hard_deadline(&self) -> Duration {
        // `resolve` guarantees safety_margin < grace_period; saturate rather than panic anyway.
        self.grace_period.saturating_sub(self.safety_margin)
    }

    /// Offset of the quiesce deadline from the origin: stragglers are cut here so closers get
    /// `close_budget`.
    pub fn quiesce_deadline(&self) -> Duration {
        self.hard_deadline().saturating_sub(self.close_budget)
    }

    /// When the watchdog acts, as an offset from the origin: half the safety margin past the
    /// hard deadline, so a driver that ends right at the hard deadline is not taken for
    /// starved, and the process is still gone before SIGKILL.
    pub(crate) fn watchdog_deadline(&self) -> Duration {
        self.hard_deadline().saturating_add(self.safety_margin / 2)
    }
}

/// Parses a duration such as `30s`, `1500ms`, `2m`, `1h`, or a bare number of seconds (`30`,
/// as in `terminationGracePeriodSeconds`).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use lameduck::parse_duration;
///
/// assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
/// assert_eq!(parse_duration("1500ms").unwrap(), Duration::from_millis(1500));
/// assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
/// assert_eq!(parse_duration("45").unwrap(), Duration::from_secs(45));
/// assert!(parse_duration("soon").is_err());
/// ```
pub fn parse_duration(raw: &str) -> Result<Duration, ConfigError> {
    let s = raw.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    if digits.is_empty() {
        return Err(ConfigError::parse(format!(
            "`{raw}` is not a duration: expected a whole number with an optional unit (ms, s, m, h), e.g. `30s`"
        )));
    }
    let n: u64 = digits.parse().map_err(|_| {
        ConfigError::parse(format!(
            "`{raw}` is not a duration: the number is too large"
        ))
    })?;
    let too_large = || {
        ConfigError::parse(format!(
            "`{raw}` is not a duration: the number is too large"
        ))
    };
    let d = match unit.trim() {
        "ms" => Duration::from_millis(n),
        "" | "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.checked_mul(60).ok_or_else(too_large)?),
        "h" => Duration::from_secs(n.checked_mul(3600).ok_or_else(too_large)?),
        other => {
            return Err(ConfigError::parse(format!(
                "`{raw}` is not a duration: unknown unit `{other}` (use ms, s, m or h)"
            )))
        }
    };
    Ok(d)
}

/// Formats a duration the way it is parsed: `1500ms`, `30s`.
#[derive(Clone, Copy)]
pub(crate) struct DurationDisplay(pub(crate) Duration);

impl fmt::Display for DurationDisplay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.0;
        if d.subsec_nanos() == 0 {
            write!(f, "{}s", d.as_secs())
        } else if d.subsec_nanos() % 1_000_000 == 0 {
            write!(f, "{}ms", d.as_millis())
        } else {
            write!(f, "{:?}", d)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_shrink_for_short_grace_periods() {
        let b = Budget::resolve(Some(Duration::from_secs(6)), None, None, None).unwrap();
        assert_eq!(b.safety_margin, Duration::from_millis(200));
        assert_eq!(b.close_budget, Duration::from_secs(1));
        let b = Budget::resolve(None, None, None, None).unwrap();
        assert_eq!(b.hard_deadline(), Duration::from_secs(29));
        assert_eq!(b.quiesce_deadline(), Duration::from_secs(24));
    }

    #[test]
    fn explicit_values_are_not_shrunk() {
        let err = Budget::resolve(
            Some(Duration::from_secs(5)),
            None,
            Some(Duration::from_secs(5)),
            None,
        )
        .unwrap_err();
        assert!(err.is_budget());
        assert!(err.to_string().contains("close_budget (5s)"), "{err}");
    }

    #[test]
    fn grace_periods_outside_what_kubernetes_can_mean_are_refused() {
        let env = |raw: &str| Budget::resolve(None, None, None, Some(raw)).unwrap_err();
        let e = env("18446744073709551615");
        assert!(e.is_budget(), "{e}");
        assert!(e.to_string().contains("above the maximum of 86400s"), "{e}");
        assert!(e.to_string().starts_with("LAMEDUCK_GRACE_PERIOD ("), "{e}");
        for raw in ["1ms", "30ms", "999ms"] {
            let e = env(raw);
            assert!(
                e.to_string().contains(&format!("({raw}) is below 1s")),
                "{e}"
            );
        }
        let e = Budget::resolve(Some(Duration::from_millis(30)), None, None, None).unwrap_err();
        assert!(
            e.to_string().starts_with("grace_period (30ms) is below 1s"),
            "{e}"
        );
        let e = Budget::resolve(Some(Duration::MAX), None, None, None).unwrap_err();
        assert!(e.is_budget(), "{e}");
        // Explicit margins too large to add are refused, not overflowed.
        let e = Budget::resolve(
            Some(Duration::from_secs(10)),
            Some(Duration::MAX),
            Some(Duration::MAX),
            None,
        )
        .unwrap_err();
        assert!(e.is_budget(), "{e}");
        assert!(Budget::resolve(None, None, None, Some("24h")).is_ok());
        assert!(Budget::resolve(None, None, None, Some("1s")).is_ok());
    }

    #[test]
    fn display_round_trips() {
        for s in ["30s", "1500ms", "0s"] {
            assert_eq!(DurationDisplay(parse_duration(s).unwrap()).to_string(), s);
        }
    }

    #[test]
    fn a_shortest_grace_is_a_grace_kubernetes_could_give_and_no_longer_than_the_grace() {
        let b = Budget::resolve(Some(Duration::from_secs(30)), None, None, None).unwrap();
        assert_eq!(b.resolve_shortest(None, None).unwrap(), None);
        assert_eq!(b.resolve_shortest(None, Some("  ")).unwrap(), None);
        assert_eq!(
            b.resolve_shortest(None, Some("15s")).unwrap(),
            Some(Duration::from_secs(15))
        );
        // The explicit setting wins over the environment.
        assert_eq!(
            b.resolve_shortest(Some(Duration::from_secs(10)), Some("15s"))
                .unwrap(),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            b.resolve_shortest(Some(Duration::from_secs(30)), None)
                .unwrap(),
            Some(Duration::from_secs(30))
        );
        let e = b
            .resolve_shortest(None, Some("soon"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("LAMEDUCK_SHORTEST_GRACE") && e.contains("15s"),
            "{e}"
        );
        let e = b
            .resolve_shortest(Some(Duration::from_millis(500)), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("shortest_grace (500ms) is below 1s"), "{e}");
        let e = b
            .resolve_shortest(None, Some("45s"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("LAMEDUCK_SHORTEST_GRACE (45s) is longer than grace_period (30s)"),
            "{e}"
        );
    }
}

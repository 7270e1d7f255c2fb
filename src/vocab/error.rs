//! Configuration errors.

use std::fmt;

/// A setting given to [`DrainBuilder`](crate::DrainBuilder) (or read from the environment)
/// that cannot work.
///
/// The message names the setting and says what to change, e.g.
/// `close_budget (5s) + safety_margin (1s) leaves nothing of grace_period (5s): lower one of them or raise grace_period`.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
///
/// let err = lameduck::Drain::builder()
///     .grace_period(Duration::from_secs(5))
///     .close_budget(Duration::from_secs(5))
///     .build()
///     .unwrap_err();
/// assert!(err.is_budget());
/// assert!(err.to_string().contains("close_budget"));
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct ConfigError {
    kind: ConfigErrorKind,
    message: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ConfigErrorKind {
    Budget,
    Propagation,
    Env,
    Parse,
}

impl ConfigError {
    pub(crate) fn budget(message: impl Into<String>) -> Self {
        Self {
            kind: ConfigErrorKind::Budget,
            message: message.into(),
        }
    }

    pub(crate) fn propagation(message: impl Into<String>) -> Self {
        Self {
            kind: ConfigErrorKind::Propagation,
            message: message.into(),
        }
    }

    pub(crate) fn env(message: impl Into<String>) -> Self {
        Self {
            kind: ConfigErrorKind::Env,
            message: message.into(),
        }
    }

    pub(crate) fn parse(message: impl Into<String>) -> Self {
        Self {
            kind: ConfigErrorKind::Parse,
            message: message.into(),
        }
    }

    /// `true` if the grace period, safety margin and close budget do not fit together.
    pub fn is_budget(&self) -> bool {
        self.kind == ConfigErrorKind::Budget
    }

    /// `true` if the propagation policy's numbers are inconsistent (e.g. `min` above `max`).
    pub fn is_propagation(&self) -> bool {
        self.kind == ConfigErrorKind::Propagation
    }

    /// `true` if an environment variable (e.g. `LAMEDUCK_GRACE_PERIOD`) could not be used.
    pub fn is_env(&self) -> bool {
        self.kind == ConfigErrorKind::Env
    }

    /// `true` if a string could not be parsed: a duration (see [`parse_duration`](crate::parse_duration)),
    /// a name (a `LAMEDUCK_*` variable, `str::parse` of a setting, `/drain`'s query), or an
    /// admin token given to `AdminBuilder::token`.
    pub fn is_parse(&self) -> bool {
        self.kind == ConfigErrorKind::Parse
    }
}

impl fmt::Debug for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConfigError")
            .field("kind", &self.kind)
            .field("message", &self.message)
            .finish()
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ConfigError {}

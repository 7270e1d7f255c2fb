//! [`ConfigError`]: which setting to change, by its flag and its field, and why.

use std::fmt;

use super::Kind;

/// The settings a [`ConfigError`] can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Setting {
    Target,
    Host,
    Label,
    ProxyLabel,
    ShortRate,
    SlowRate,
    StreamRate,
    Slow,
    Stream,
    ShortPath,
    SlowPath,
    StreamPath,
    Duration,
    DrainWait,
    ConnectTimeout,
    MaxInFlight,
    MaxIdle,
    OnOff,
}

impl Setting {
    pub(super) fn rate(kind: Kind) -> Setting {
        match kind {
            Kind::Short => Setting::ShortRate,
            Kind::Slow => Setting::SlowRate,
            Kind::Stream => Setting::StreamRate,
        }
    }

    pub(super) fn path(kind: Kind) -> Setting {
        match kind {
            Kind::Short => Setting::ShortPath,
            Kind::Slow => Setting::SlowPath,
            Kind::Stream => Setting::StreamPath,
        }
    }

    /// (field of `ProbeConfig`, command-line flag)
    fn names(self) -> (&'static str, &'static str) {
        match self {
            Setting::Target => ("target", "--target"),
            Setting::Host => ("host", "--host"),
            Setting::Label => ("label", "--label"),
            Setting::ProxyLabel => ("proxy_label", "--proxy-label"),
            Setting::ShortRate => ("short_rate", "--rate"),
            Setting::SlowRate => ("slow_rate", "--slow-rate"),
            Setting::StreamRate => ("stream_rate", "--stream-rate"),
            Setting::Slow => ("slow", "--slow"),
            Setting::Stream => ("stream", "--stream"),
            Setting::ShortPath => ("short_path", "--path"),
            Setting::SlowPath => ("slow_path", "--slow-path"),
            Setting::StreamPath => ("stream_path", "--stream-path"),
            Setting::Duration => ("duration", "--duration"),
            Setting::DrainWait => ("drain_wait", "--drain-wait"),
            Setting::ConnectTimeout => ("connect_timeout", "--connect-timeout"),
            Setting::MaxInFlight => ("max_in_flight", "--max-in-flight"),
            Setting::MaxIdle => ("max_idle", "--max-idle"),
            Setting::OnOff => ("on_off", "--on-off"),
        }
    }
}

/// A [`ProbeConfig`](crate::ProbeConfig) setting that cannot work, with what to change.
///
/// `Display` names the setting by its command-line flag and its field, e.g.
/// `--rate (short_rate): must be a number of requests per second ≥ 0 (0 sends none), got -1`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    setting: Setting,
    message: String,
}

impl ConfigError {
    pub(super) fn new(setting: Setting, message: String) -> Self {
        ConfigError { setting, message }
    }

    /// The command-line flag of the setting to change (`--rate`).
    pub fn flag(&self) -> &'static str {
        self.setting.names().1
    }

    /// The [`ProbeConfig`](crate::ProbeConfig) field of the setting to change (`short_rate`).
    pub fn field(&self) -> &'static str {
        self.setting.names().0
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (field, flag) = self.setting.names();
        write!(f, "{flag} ({field}): {}", self.message)
    }
}

impl std::error::Error for ConfigError {}

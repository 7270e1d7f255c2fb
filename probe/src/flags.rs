//! What every command line of the probe shares: the error that says what to type instead,
//! durations written with units, and clap's outcomes (help, version, a mistake) in the probe's
//! one-line form. The commands (`cli`, `check`, `correlate`) build on it; it knows none of them.

use std::fmt;
use std::time::Duration;

use clap::error::{ContextKind, ContextValue, ErrorKind};

use crate::config::ConfigError;

/// What a command's arguments came to: its arguments, or a request for its help or the
/// version.
#[derive(Debug, Clone, PartialEq)]
pub enum Parsed<T> {
    /// The arguments, validated.
    Args(T),
    /// `--help`: print the command's usage and exit 0.
    Help,
    /// `--version`: print the version and exit 0.
    Version,
}

/// A command-line mistake, with what to type instead.
///
/// `Display` is one lowercase line, e.g. `--duration: "30" has no unit; write it like 30s,
/// 1500ms or 2m`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CliError {
    message: String,
}

impl CliError {
    pub(crate) fn new(message: impl Into<String>) -> Self {
        CliError {
            message: message.into(),
        }
    }

    /// The message, without a trailing hint.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CliError {}

impl From<ConfigError> for CliError {
    fn from(e: ConfigError) -> Self {
        CliError::new(e.to_string())
    }
}

/// Parses the flags of the sub-command `name`: `Err` holds what to do instead (its help, the
/// version, or the one-line message).
pub(crate) fn subcommand_flags<F: clap::Parser, T>(
    name: &str,
    args: &[String],
) -> Result<F, Result<Parsed<T>, CliError>> {
    let argv = std::iter::once(name.to_owned()).chain(args.iter().cloned());
    F::try_parse_from(argv).map_err(clap_outcome)
}

/// Turns a clap error into help, version, or the probe's one-line message.
pub(crate) fn clap_outcome<T>(e: clap::Error) -> Result<Parsed<T>, CliError> {
    let context = |kind| match e.get(kind) {
        Some(ContextValue::String(s)) => Some(s.clone()),
        Some(ContextValue::Strings(v)) => v.first().cloned(),
        _ => None,
    };
    // "--duration <DUR>" → "--duration"
    let arg = context(ContextKind::InvalidArg)
        .map(|a| a.split([' ', '=']).next().unwrap_or_default().to_owned())
        .unwrap_or_default();
    let message = match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            return Ok(Parsed::Help)
        }
        ErrorKind::DisplayVersion => return Ok(Parsed::Version),
        ErrorKind::UnknownArgument if arg.starts_with('-') => {
            match context(ContextKind::SuggestedArg) {
                Some(s) => {
                    format!("unknown flag {arg} (did you mean {s}?); see --help for the list")
                }
                None => format!("unknown flag {arg}; see --help for the list"),
            }
        }
        ErrorKind::UnknownArgument => {
            format!("unexpected argument {arg:?}; flags start with -- (e.g. --target {arg})")
        }
        ErrorKind::ValueValidation => match std::error::Error::source(&e) {
            Some(source) => format!("{arg}: {source}"),
            None => format!("{arg}: invalid value"),
        },
        ErrorKind::InvalidValue | ErrorKind::NoEquals => format!("{arg} needs a value"),
        ErrorKind::TooManyValues => format!("{arg} takes no value"),
        _ => {
            // Anything else: clap's first line, without its "error: " prefix.
            let text = e.render().to_string();
            let line = text.lines().next().unwrap_or_default();
            line.strip_prefix("error: ").unwrap_or(line).to_owned()
        }
    };
    Err(CliError::new(message))
}

/// Parses a duration written with units: `1500ms`, `30s`, `2m`, `1h`, `0.5s`, `1m30s`.
///
/// A bare number is refused (is `30` seconds or milliseconds?).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use lameduck_probe::cli::parse_duration;
///
/// assert_eq!(parse_duration("1500ms").unwrap(), Duration::from_millis(1500));
/// assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
/// assert!(parse_duration("30").unwrap_err().contains("no unit"));
/// ```
///
/// # Errors
///
/// A message saying what is wrong and how to write it.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let s = text.trim();
    let how = "write it like 30s, 1500ms, 2m or 1m30s";
    if s.is_empty() {
        return Err(format!("empty duration; {how}"));
    }
    let mut total = 0.0_f64;
    let mut rest = s;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if number_len == 0 {
            return Err(format!("{text:?} is not a duration; {how}"));
        }
        let number: f64 = rest[..number_len]
            .parse()
            .map_err(|_| format!("{text:?} is not a duration; {how}"))?;
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let seconds = match unit {
            "" => return Err(format!("{text:?} has no unit; {how}")),
            "ms" => 0.001,
            "s" => 1.0,
            "m" | "min" => 60.0,
            "h" => 3600.0,
            other => {
                return Err(format!(
                    "{text:?} has an unknown unit {other:?}; use ms, s, m or h"
                ))
            }
        };
        total += number * seconds;
    }
    if !total.is_finite() || total > 1e9 {
        return Err(format!("{text:?} is too long"));
    }
    // Rounded to whole microseconds so 0.1s is exactly 100ms.
    Ok(Duration::from_micros((total * 1_000_000.0).round() as u64))
}

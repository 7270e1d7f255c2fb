//! The command line: flags into a [`ProbeConfig`], with errors that say what to type instead.
//!
//! Hand-written to keep the probe's build small; `--flag value` and `--flag=value` both work.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use crate::config::{ConfigError, ProbeConfig};

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// Run the probe.
    Run(Box<RunArgs>),
    /// Print [`usage`] and exit 0.
    Help,
    /// Print the version and exit 0.
    Version,
}

/// A probe run from the command line.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct RunArgs {
    /// The validated probe settings.
    pub config: ProbeConfig,
    /// `--out FILE`: where to write one JSON line per request.
    pub out: Option<PathBuf>,
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
    fn new(message: impl Into<String>) -> Self {
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

/// The `--help` text.
pub fn usage() -> &'static str {
    "\
lameduck-probe: send tagged requests at a service during a rolling restart and tell which
ones failed, on which connection, answered by which instance in which drain phase.

USAGE:
    lameduck-probe --target HOST:PORT [OPTIONS]

TARGET:
    --target ADDR            host:port, [v6]:port or http://host:port (required)
    --host NAME              Host header / :authority to send (default: the target)
    --http 1|2               HTTP/1.1, or HTTP/2 with prior knowledge (h2c) [default: 1]
    --connections MODE       keepalive | fresh | mixed [default: keepalive]
    --label NAME             traffic-path label, sent as x-traffic-path and recorded
                             (e.g. ingress, service, pod-ip) [default: default]

LOAD (a rate of 0 sends none of that kind):
    --rate N                 short requests (GET /) per second [default: 20]
    --slow-rate N            slow requests (GET /slow?ms=..) per second [default: 2]
    --slow DUR               how long a slow request takes on the server [default: 2s]
    --stream-rate N          streaming requests (GET /stream?ms=..) per second [default: 0]
    --stream DUR             how long a stream lasts [default: 3s]
    --path PATH              path of short requests [default: /]
    --slow-path PATH         path of slow requests, {ms} filled in [default: /slow?ms={ms}]
    --stream-path PATH       path of streams, {ms} filled in [default: /stream?ms={ms}]

TIME AND LIMITS:
    --duration DUR           how long to send [default: 30s]
    --drain-wait DUR         then how long to wait for running requests; the rest are
                             counted unfinished [default: 10s]
    --connect-timeout DUR    limit for one connect [default: 3s]
    --max-in-flight N        requests running at most; more are not sent [default: 256]
    --max-idle N             idle keep-alive connections kept [default: 32]
    --allow-unreachable-start
                             start even if the first connection attempt fails

OUTPUT:
    --out FILE               write one JSON line per request
    --quiet                  no progress line on stderr
    -h, --help               this text
    -V, --version            the version

DUR is a number with a unit: 1500ms, 30s, 2m, 1h, or combined like 1m30s.
Exit status: 0 nothing failed or unfinished, 1 some did, 2 bad flags, 3 target unreachable
at the start or --out not writable.
Ctrl-C stops sending and waits for running requests (--drain-wait); a second Ctrl-C stops
waiting. Either way the summary so far is printed.
"
}

/// Parses the arguments after the program name.
///
/// # Examples
///
/// ```
/// use lameduck_probe::cli::{parse_args, Command};
///
/// let cmd = parse_args(["--target", "127.0.0.1:8080", "--duration=45s", "--http", "2"]).unwrap();
/// let Command::Run(run) = cmd else { panic!() };
/// assert_eq!(run.config.duration.as_secs(), 45);
///
/// let err = parse_args(["--target", "127.0.0.1:8080", "--rate", "fast"]).unwrap_err();
/// assert_eq!(err.to_string(), r#"--rate: "fast" is not a number of requests per second"#);
/// ```
///
/// # Errors
///
/// Unknown flag, missing value, malformed value, missing `--target`, or a value the config
/// refuses; the message names the flag.
pub fn parse_args<I, S>(args: I) -> Result<Command, CliError>
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    let mut config = ProbeConfig::new("");
    config.progress = true;
    let mut target = None;
    let mut out = None;
    let mut args = args.into_iter().map(Into::into);
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => {
                (flag.to_owned(), Some(value.to_owned()))
            }
            _ => (arg.clone(), None),
        };
        // Flags without a value first.
        match flag.as_str() {
            "-h" | "--help" => return Ok(Command::Help),
            "-V" | "--version" => return Ok(Command::Version),
            "--allow-unreachable-start" | "--quiet" => {
                if inline.is_some() {
                    return Err(CliError::new(format!("{flag} takes no value")));
                }
                if flag == "--quiet" {
                    config.progress = false;
                } else {
                    config.allow_unreachable_start = true;
                }
                continue;
            }
            _ => {}
        }
        if !flag.starts_with('-') {
            return Err(CliError::new(format!(
                "unexpected argument {arg:?}; flags start with -- (e.g. --target {arg})"
            )));
        }
        if !FLAGS_WITH_VALUE.contains(&flag.as_str()) {
            return Err(CliError::new(format!(
                "unknown flag {flag}; see --help for the list"
            )));
        }
        let value = match inline {
            Some(v) => v,
            None => match args.next() {
                Some(v) if !(v.starts_with("--") && v.len() > 2) => v,
                _ => return Err(CliError::new(format!("{flag} needs a value"))),
            },
        };
        let value = value.as_str();
        match flag.as_str() {
            "--target" => target = Some(value.to_owned()),
            "--host" => config.host = Some(value.to_owned()),
            "--http" => config.http = value.parse().map_err(|e| flag_error(&flag, e))?,
            "--connections" => {
                config.connections = value.parse().map_err(|e| flag_error(&flag, e))?
            }
            "--label" => config.label = value.to_owned(),
            "--rate" => config.short_rate = parse_rate(&flag, value)?,
            "--slow-rate" => config.slow_rate = parse_rate(&flag, value)?,
            "--stream-rate" => config.stream_rate = parse_rate(&flag, value)?,
            "--slow" => config.slow = parse_flag_duration(&flag, value)?,
            "--stream" => config.stream = parse_flag_duration(&flag, value)?,
            "--path" => config.short_path = value.to_owned(),
            "--slow-path" => config.slow_path = value.to_owned(),
            "--stream-path" => config.stream_path = value.to_owned(),
            "--duration" => config.duration = parse_flag_duration(&flag, value)?,
            "--drain-wait" => config.drain_wait = parse_flag_duration(&flag, value)?,
            "--connect-timeout" => config.connect_timeout = parse_flag_duration(&flag, value)?,
            "--max-in-flight" => config.max_in_flight = parse_count(&flag, value)?,
            "--max-idle" => config.max_idle = parse_count(&flag, value)?,
            "--out" => {
                if value.is_empty() {
                    return Err(CliError::new("--out needs a file name"));
                }
                out = Some(PathBuf::from(value));
            }
            _ => unreachable!("every flag in FLAGS_WITH_VALUE has an arm"),
        }
    }
    config.target = target.ok_or_else(|| {
        CliError::new("--target is required, e.g. --target 127.0.0.1:8080 (see --help)")
    })?;
    config.validate()?;
    Ok(Command::Run(Box::new(RunArgs { config, out })))
}

const FLAGS_WITH_VALUE: &[&str] = &[
    "--target",
    "--host",
    "--http",
    "--connections",
    "--label",
    "--rate",
    "--slow-rate",
    "--stream-rate",
    "--slow",
    "--stream",
    "--path",
    "--slow-path",
    "--stream-path",
    "--duration",
    "--drain-wait",
    "--connect-timeout",
    "--max-in-flight",
    "--max-idle",
    "--out",
];

fn flag_error(flag: &str, e: String) -> CliError {
    CliError::new(format!("{flag}: {e}"))
}

fn parse_flag_duration(flag: &str, value: &str) -> Result<Duration, CliError> {
    parse_duration(value).map_err(|e| flag_error(flag, e))
}

fn parse_rate(flag: &str, value: &str) -> Result<f64, CliError> {
    let rate: f64 = value.trim().parse().map_err(|_| {
        flag_error(
            flag,
            format!("{value:?} is not a number of requests per second"),
        )
    })?;
    if !rate.is_finite() || rate < 0.0 {
        return Err(flag_error(
            flag,
            format!("{value:?}: a rate must be a number ≥ 0 (0 sends none of this kind)"),
        ));
    }
    Ok(rate)
}

fn parse_count(flag: &str, value: &str) -> Result<usize, CliError> {
    value
        .trim()
        .parse()
        .map_err(|_| flag_error(flag, format!("{value:?} is not a whole number")))
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

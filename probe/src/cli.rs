//! The command line: flags into a [`ProbeConfig`], with errors that say what to type instead.
//!
//! Parsed with `clap`; `--flag value` and `--flag=value` both work, a mistyped flag gets a
//! suggestion, and `--target`, `--host`, `--label` and `--proxy-label` fall back to the
//! environment (`LAMEDUCK_PROBE_TARGET`, ...). clap's own messages are rewritten into the
//! probe's one-line form (`--rate: "fast" is not a number of requests per second`).

use std::path::PathBuf;
use std::time::Duration;

use clap::{CommandFactory, Parser};

use crate::config::{ConnectionMode, HttpVersion, OnOff, ProbeConfig};
use crate::flags::{clap_outcome, Parsed};
pub use crate::flags::{parse_duration, CliError};
/// What the command line asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// Run the probe.
    Run(Box<RunArgs>),
    /// Print [`usage`] and exit 0.
    Help,
    /// Print the version and exit 0.
    Version,
    /// `correlate`: join records with drain reports.
    Correlate(Box<crate::correlate::CorrelateArgs>),
    /// Print [`correlate_usage`](crate::correlate::correlate_usage) and exit 0.
    CorrelateHelp,
    /// `check`: start a service, stop it as kubelet would, judge its shutdown.
    #[cfg(unix)]
    Check(Box<crate::check::CheckArgs>),
    /// Print [`check_usage`](crate::check::check_usage) and exit 0.
    #[cfg(unix)]
    CheckHelp,
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

/// The flags, as clap sees them. Every value is optional so [`ProbeConfig::new`] stays the one
/// place defaults live; the `[default: ..]` notes in the help repeat them.
#[derive(Debug, Parser)]
#[command(
    name = "lameduck-probe",
    version,
    about = "lameduck-probe: send tagged requests at a service during a rolling restart and tell which\nones failed, on which connection, answered by which instance in which drain phase.",
    help_template = "{about}\n\nUSAGE:\n    {usage}\n\n{all-args}{after-help}",
    override_usage = "lameduck-probe --target HOST:PORT [OPTIONS]\n    lameduck-probe correlate --probe FILE --report [NAME=]FILE... [--events FILE] [--svg FILE]\n    lameduck-probe check --target HOST:PORT --ready URL [OPTIONS] -- COMMAND [ARGS...]",
    after_help = AFTER_HELP,
    next_line_help = false,
    args_override_self = true,
    allow_negative_numbers = true,
    max_term_width = 100
)]
struct RunFlags {
    /// host:port, [v6]:port or http://host:port (required)
    #[arg(
        long,
        value_name = "ADDR",
        env = "LAMEDUCK_PROBE_TARGET",
        hide_env = true,
        help_heading = "TARGET"
    )]
    target: Option<String>,
    /// Host header / :authority to send [default: the target]
    #[arg(
        long,
        value_name = "NAME",
        env = "LAMEDUCK_PROBE_HOST",
        hide_env = true,
        help_heading = "TARGET"
    )]
    host: Option<String>,
    /// HTTP/1.1, or HTTP/2 with prior knowledge (h2c) [default: 1]
    #[arg(long, value_name = "1|2", value_parser = parse_http, help_heading = "TARGET")]
    http: Option<HttpVersion>,
    /// keepalive | fresh | mixed [default: keepalive]
    #[arg(long, value_name = "MODE", value_parser = parse_mode, help_heading = "TARGET")]
    connections: Option<ConnectionMode>,
    /// Sent as x-traffic-path (ingress, service, pod-ip) [default: default]
    #[arg(
        long,
        value_name = "NAME",
        env = "LAMEDUCK_PROBE_LABEL",
        hide_env = true,
        help_heading = "TARGET"
    )]
    label: Option<String>,
    /// What sits in between, for the record (e.g. "kube-proxy iptables 1.31")
    #[arg(
        long,
        value_name = "TEXT",
        env = "LAMEDUCK_PROBE_PROXY_LABEL",
        hide_env = true,
        help_heading = "TARGET"
    )]
    proxy_label: Option<String>,
    /// Open every connection from this local address (one client Pod among many)
    #[arg(long, value_name = "ADDR", help_heading = "TARGET")]
    bind: Option<std::net::IpAddr>,

    /// Short requests (GET /) per second; 0 sends none [default: 20]
    #[arg(long, value_name = "N", value_parser = parse_rate, help_heading = "LOAD")]
    rate: Option<f64>,
    /// Slow requests (GET /slow?ms=..) per second [default: 2]
    #[arg(long, value_name = "N", value_parser = parse_rate, help_heading = "LOAD")]
    slow_rate: Option<f64>,
    /// How long a slow request takes on the server [default: 2s]
    #[arg(long, value_name = "DUR", value_parser = parse_duration, help_heading = "LOAD")]
    slow: Option<Duration>,
    /// Streaming requests (GET /stream?ms=..) per second [default: 0]
    #[arg(long, value_name = "N", value_parser = parse_rate, help_heading = "LOAD")]
    stream_rate: Option<f64>,
    /// How long a stream lasts [default: 3s]
    #[arg(long, value_name = "DUR", value_parser = parse_duration, help_heading = "LOAD")]
    stream: Option<Duration>,
    /// Path of short requests [default: /]
    #[arg(long, value_name = "PATH", help_heading = "LOAD")]
    path: Option<String>,
    /// Path of slow requests, {ms} filled in [default: /slow?ms={ms}]
    #[arg(long, value_name = "PATH", help_heading = "LOAD")]
    slow_path: Option<String>,
    /// Path of streams, {ms} filled in [default: /stream?ms={ms}]
    #[arg(long, value_name = "PATH", help_heading = "LOAD")]
    stream_path: Option<String>,

    /// Retry a failure once on a new connection; it still counts
    #[arg(long, help_heading = "LOAD")]
    retry_idempotent: bool,
    /// Send for ON, pause for OFF, again and again (a poller; 200ms/2800ms: bursts)
    #[arg(long, value_name = "ON/OFF", value_parser = parse_on_off, help_heading = "LOAD")]
    on_off: Option<OnOff>,

    /// How long to send [default: 30s]
    #[arg(long, value_name = "DUR", value_parser = parse_duration, help_heading = "TIME AND LIMITS")]
    duration: Option<Duration>,
    /// Then how long to wait for running requests [default: 10s]
    #[arg(long, value_name = "DUR", value_parser = parse_duration, help_heading = "TIME AND LIMITS")]
    drain_wait: Option<Duration>,
    /// Limit for one connect [default: 3s]
    #[arg(long, value_name = "DUR", value_parser = parse_duration, help_heading = "TIME AND LIMITS")]
    connect_timeout: Option<Duration>,
    /// Requests running at most; more are not sent [default: 256]
    #[arg(long, value_name = "N", value_parser = parse_count, help_heading = "TIME AND LIMITS")]
    max_in_flight: Option<usize>,
    /// Idle keep-alive connections kept [default: 32]
    #[arg(long, value_name = "N", value_parser = parse_count, help_heading = "TIME AND LIMITS")]
    max_idle: Option<usize>,
    /// Start even if the first connection attempt fails
    #[arg(long, help_heading = "TIME AND LIMITS")]
    allow_unreachable_start: bool,

    /// Write one JSON line per request
    #[arg(long, value_name = "FILE", help_heading = "OUTPUT")]
    out: Option<String>,
    /// No progress line on stderr
    #[arg(long, help_heading = "OUTPUT")]
    quiet: bool,
}

const AFTER_HELP: &str = "\
DUR is a number with a unit: 1500ms, 30s, 2m, 1h, or combined like 1m30s.
--target, --host, --label and --proxy-label fall back to LAMEDUCK_PROBE_TARGET,
LAMEDUCK_PROBE_HOST, LAMEDUCK_PROBE_LABEL and LAMEDUCK_PROBE_PROXY_LABEL.
Exit status: 0 nothing failed or unfinished, 1 some did, 2 bad flags, 3 target unreachable
at the start or --out not writable.
Ctrl-C stops sending and waits for running requests (--drain-wait); a second Ctrl-C stops
waiting. Either way the summary so far is printed.
`lameduck-probe correlate --help`: join the records with drain reports into a diagnosis.
`lameduck-probe check --help`: start a service, stop it as kubelet would, judge its shutdown.
";

/// The `--help` text.
pub fn usage() -> String {
    RunFlags::command().render_help().to_string()
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
    let args: Vec<String> = args.into_iter().map(Into::into).collect();
    if args.first().map(String::as_str) == Some("correlate") {
        return Ok(match crate::correlate::parse_correlate(&args[1..])? {
            Parsed::Args(a) => Command::Correlate(Box::new(a)),
            Parsed::Help => Command::CorrelateHelp,
            Parsed::Version => Command::Version,
        });
    }
    #[cfg(unix)]
    if args.first().map(String::as_str) == Some("check") {
        return Ok(match crate::check::parse_check(&args[1..])? {
            Parsed::Args(a) => Command::Check(Box::new(a)),
            Parsed::Help => Command::CheckHelp,
            Parsed::Version => Command::Version,
        });
    }
    let argv = std::iter::once("lameduck-probe".to_owned()).chain(args);
    let flags = match RunFlags::try_parse_from(argv) {
        Ok(flags) => flags,
        Err(e) => {
            return clap_outcome(e).map(|p| match p {
                Parsed::Args(command) => command,
                Parsed::Help => Command::Help,
                Parsed::Version => Command::Version,
            })
        }
    };
    let mut config = ProbeConfig::new("");
    config.progress = !flags.quiet;
    config.allow_unreachable_start = flags.allow_unreachable_start;
    config.retry_idempotent = flags.retry_idempotent;
    macro_rules! set {
        ($($flag:ident => $field:ident),* $(,)?) => {
            $(if let Some(v) = flags.$flag { config.$field = v; })*
        };
    }
    set!(
        http => http, connections => connections, label => label, rate => short_rate,
        slow_rate => slow_rate, slow => slow, stream_rate => stream_rate, stream => stream,
        path => short_path, slow_path => slow_path, stream_path => stream_path,
        duration => duration, drain_wait => drain_wait, connect_timeout => connect_timeout,
        max_in_flight => max_in_flight, max_idle => max_idle,
    );
    config.host = flags.host;
    config.on_off = flags.on_off;
    config.proxy_label = flags.proxy_label;
    config.bind = flags.bind;
    let out = match flags.out {
        Some(path) if path.is_empty() => return Err(CliError::new("--out needs a file name")),
        other => other.map(PathBuf::from),
    };
    config.target = flags.target.ok_or_else(|| {
        CliError::new("--target is required, e.g. --target 127.0.0.1:8080 (see --help)")
    })?;
    config.validate()?;
    Ok(Command::Run(Box::new(RunArgs { config, out })))
}

fn parse_http(value: &str) -> Result<HttpVersion, String> {
    value.parse()
}

fn parse_mode(value: &str) -> Result<ConnectionMode, String> {
    value.parse()
}

fn parse_rate(value: &str) -> Result<f64, String> {
    let rate: f64 = value
        .trim()
        .parse()
        .map_err(|_| format!("{value:?} is not a number of requests per second"))?;
    if !rate.is_finite() || rate < 0.0 {
        return Err(format!(
            "{value:?}: a rate must be a number ≥ 0 (0 sends none of this kind)"
        ));
    }
    Ok(rate)
}

fn parse_count(value: &str) -> Result<usize, String> {
    value
        .trim()
        .parse()
        .map_err(|_| format!("{value:?} is not a whole number"))
}

/// Parses `ON/OFF`, two durations: `5s/5s`, `200ms/2800ms`.
fn parse_on_off(text: &str) -> Result<OnOff, String> {
    let (on, off) = text
        .split_once('/')
        .ok_or_else(|| format!("{text:?} is not ON/OFF, e.g. 5s/5s or 200ms/2800ms"))?;
    Ok(OnOff {
        on: parse_duration(on)?,
        off: parse_duration(off)?,
    })
}

//! `lameduck-probe check [OPTIONS] -- COMMAND ARGS…`: the flags.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use super::{default_traffic, signal_of, CheckArgs, ExpectReadiness, PreStop};
use crate::config::{ConnectionMode, HttpVersion};
use crate::flags::{parse_duration, subcommand_flags, CliError, Parsed};

#[derive(Debug, Parser)]
#[command(
    name = "lameduck-probe check",
    about = "Start a service, send it traffic, stop it the way kubelet does (preStop, stop signal,\nSIGKILL at the grace period) and judge its shutdown: startup, readiness, liveness, stop\nsignal, listener, in-flight requests, keep-alive close, exit, drain report.",
    help_template = "{about}\n\nUSAGE:\n    {usage}\n\n{all-args}{after-help}",
    override_usage = "lameduck-probe check --target HOST:PORT --ready URL [OPTIONS] -- COMMAND [ARGS...]",
    after_help = CHECK_AFTER_HELP,
    args_override_self = true,
    max_term_width = 100
)]
struct CheckFlags {
    /// Where the traffic goes: host:port of the service's listener (required)
    #[arg(long, value_name = "ADDR", help_heading = "SERVICE")]
    target: Option<String>,
    /// Readiness probe URL, http://host:port/path (required)
    #[arg(long, value_name = "URL", help_heading = "SERVICE")]
    ready: Option<String>,
    /// Liveness probe URL
    #[arg(long, value_name = "URL", help_heading = "SERVICE")]
    live: Option<String>,
    /// A header for the probes, "Name: value" (like a probe's httpHeaders; repeatable)
    #[arg(long, value_name = "HEADER", help_heading = "SERVICE")]
    probe_header: Vec<String>,
    /// What readiness does once told to stop: flip (503) or serving (200 through the window) [default: flip]
    #[arg(long, value_name = "flip|serving", value_parser = parse_expect, help_heading = "SERVICE")]
    expect_readiness: Option<ExpectReadiness>,
    /// Start the command as PID 1 of a new PID namespace, as in a container (unshare; root or user namespaces)
    #[arg(long, help_heading = "SERVICE")]
    pid_namespace: bool,
    /// The service's lameduck drain report file: the report must be there (missing, unreadable or no report FAILs) [default: its stderr line]
    #[arg(long, value_name = "FILE", help_heading = "SERVICE")]
    report_file: Option<PathBuf>,
    /// Expect a lameduck drain report: judge the report contract, FAIL without one [default: when one is found]
    #[arg(long, help_heading = "SERVICE")]
    expect_report: bool,

    /// preStop httpGet: GET this URL before the stop signal
    #[arg(long, value_name = "URL", help_heading = "STOP", conflicts_with_all = ["prestop_exec", "prestop_sleep"])]
    prestop_http: Option<String>,
    /// preStop exec: run this with sh -c before the stop signal (judged as telling the service only where it shows it was told)
    #[arg(
        long,
        value_name = "CMD",
        help_heading = "STOP",
        conflicts_with = "prestop_sleep"
    )]
    prestop_exec: Option<String>,
    /// preStop sleep: wait this long before the stop signal
    #[arg(long, value_name = "DUR", value_parser = parse_duration, help_heading = "STOP")]
    prestop_sleep: Option<Duration>,
    /// The stop signal (the image's STOPSIGNAL) [default: TERM]
    #[arg(long, value_name = "SIG", help_heading = "STOP")]
    stop_signal: Option<String>,
    /// terminationGracePeriodSeconds: SIGKILL this long after the stop [default: 30s]
    #[arg(long, value_name = "DUR", value_parser = parse_duration, help_heading = "STOP")]
    grace_period: Option<Duration>,
    /// A budget shorter than the grace period: SIGKILL this long after the stop, as a node
    /// shutdown or an eviction does to a Pod whatever its grace [default: the grace period]
    #[arg(long, value_name = "DUR", value_parser = parse_duration, help_heading = "STOP")]
    kill_after: Option<Duration>,

    /// Longest wait for the first 200 from --ready [default: 30s]
    #[arg(long, value_name = "DUR", value_parser = parse_duration, help_heading = "TIME")]
    startup_timeout: Option<Duration>,
    /// Traffic before the stop [default: 16s, past the 15 s lameduck observes before judging by evidence]
    #[arg(long, value_name = "DUR", value_parser = parse_duration, help_heading = "TIME")]
    warmup: Option<Duration>,
    /// How long after the stop new connections still arrive (proxies catching up) [default: 2s]
    #[arg(long, value_name = "DUR", value_parser = parse_duration, help_heading = "TIME")]
    drain_window: Option<Duration>,

    /// Short requests per second [default: 20]
    #[arg(long, value_name = "N", help_heading = "TRAFFIC")]
    rate: Option<f64>,
    /// Slow requests per second [default: 4]
    #[arg(long, value_name = "N", help_heading = "TRAFFIC")]
    slow_rate: Option<f64>,
    /// How long a slow request takes [default: 1500ms]
    #[arg(long, value_name = "DUR", value_parser = parse_duration, help_heading = "TRAFFIC")]
    slow: Option<Duration>,
    /// Streams per second [default: 1]
    #[arg(long, value_name = "N", help_heading = "TRAFFIC")]
    stream_rate: Option<f64>,
    /// How long a stream lasts [default: 2s]
    #[arg(long, value_name = "DUR", value_parser = parse_duration, help_heading = "TRAFFIC")]
    stream: Option<Duration>,
    /// Path of short requests [default: /]
    #[arg(long, value_name = "PATH", help_heading = "TRAFFIC")]
    path: Option<String>,
    /// Path of slow requests, {ms} filled in [default: /slow?ms={ms}]
    #[arg(long, value_name = "PATH", help_heading = "TRAFFIC")]
    slow_path: Option<String>,
    /// Path of streams, {ms} filled in [default: /stream?ms={ms}]
    #[arg(long, value_name = "PATH", help_heading = "TRAFFIC")]
    stream_path: Option<String>,
    /// HTTP/1.1 or HTTP/2 (h2c) [default: 1]
    #[arg(long, value_name = "1|2", value_parser = parse_http, help_heading = "TRAFFIC")]
    http: Option<HttpVersion>,
    /// keepalive | fresh | mixed [default: mixed]
    #[arg(long, value_name = "MODE", value_parser = parse_mode, help_heading = "TRAFFIC")]
    connections: Option<ConnectionMode>,

    /// Write the result as JSON
    #[arg(long, value_name = "FILE", help_heading = "OUTPUT")]
    json: Option<PathBuf>,
    /// Write the result as JUnit XML (one test case per contract)
    #[arg(long, value_name = "FILE", help_heading = "OUTPUT")]
    junit: Option<PathBuf>,
    /// NOT MEASURED fails the run too (exit 1, a JUnit failure)
    #[arg(long, help_heading = "OUTPUT")]
    strict: bool,

    /// The service's command line
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<String>,
}

const CHECK_AFTER_HELP: &str = "\
t+0 is the Pod's deletion: the preStop hook runs, then the stop signal goes to the process
(PID 1 of the namespace with --pid-namespace); SIGKILL at t+grace. Traffic runs from the
first 200 on --ready for --warmup, and through --drain-window after t+0.
The service is judged from when it was told to stop: t+0 with --prestop-http, the signal
with --prestop-sleep; with --prestop-exec, when its drain report's trigger (prestop, api) and
drain start, or else its first changed answer before the signal, show the hook reached it,
and from the signal when nothing does (a hook like `sleep 5` tells the service nothing).
The report contract is judged where a lameduck drain report is expected (one was found,
--report-file, --expect-report, or x-lameduck-phase headers); elsewhere it is left out.
Exit status: 0 no contract FAIL or WARN (nor NOT MEASURED with --strict), 1 any, 2 bad
flags, 3 the command could not be started or an output file not written, 130 interrupted
(SIGINT, SIGTERM or SIGHUP; the service and what it started are killed). The JUnit file agrees: a
failure for each contract that makes the status 1, an error for 3 and 130.
";

/// The `check --help` text.
pub fn check_usage() -> String {
    use clap::CommandFactory;
    CheckFlags::command().render_help().to_string()
}

fn parse_expect(v: &str) -> Result<ExpectReadiness, String> {
    match v {
        "flip" => Ok(ExpectReadiness::Flip),
        "serving" => Ok(ExpectReadiness::Serving),
        _ => Err(format!("expected flip or serving, got {v:?}")),
    }
}

fn parse_http(v: &str) -> Result<HttpVersion, String> {
    v.parse()
}

fn parse_mode(v: &str) -> Result<ConnectionMode, String> {
    v.parse()
}

/// Parses the arguments after `check`.
///
/// # Examples
///
/// ```
/// use lameduck_probe::cli::{parse_args, Command};
///
/// let cmd = parse_args([
///     "check", "--target", "127.0.0.1:8080", "--ready", "http://127.0.0.1:9901/readyz",
///     "--grace-period", "10s", "--", "./service", "--listen", "127.0.0.1:8080",
/// ])
/// .unwrap();
/// let Command::Check(check) = cmd else { panic!() };
/// assert_eq!(check.command, ["./service", "--listen", "127.0.0.1:8080"]);
/// assert_eq!(check.grace_period.as_secs(), 10);
/// ```
///
/// # Errors
///
/// A missing command, target or readiness URL, a bad value; the message names the flag.
pub fn parse_check(args: &[String]) -> Result<Parsed<CheckArgs>, CliError> {
    let flags: CheckFlags = match subcommand_flags("check", args) {
        Ok(flags) => flags,
        Err(done) => return done,
    };
    let fail = |m: String| Err(CliError::new(m));
    if flags.command.is_empty() {
        return fail("no command: put the service's command line after --, e.g. -- ./service --listen 127.0.0.1:8080".into());
    }
    let Some(target) = flags.target else {
        return fail("--target is required: the host:port the service listens on".into());
    };
    let Some(ready) = flags.ready else {
        return fail(
            "--ready is required: the readiness URL, e.g. http://127.0.0.1:9901/readyz".into(),
        );
    };
    let mut probe_headers = Vec::new();
    for h in &flags.probe_header {
        match h.split_once(':') {
            Some((name, value)) if !name.trim().is_empty() => {
                probe_headers.push((name.trim().to_owned(), value.trim().to_owned()))
            }
            _ => return fail(format!("--probe-header {h:?}: write it as \"Name: value\"")),
        }
    }
    let stop_signal = flags.stop_signal.unwrap_or_else(|| "TERM".to_owned());
    if let Err(e) = signal_of(&stop_signal) {
        return fail(format!("--stop-signal: {e}"));
    }
    let mut traffic = default_traffic();
    traffic.target = target;
    macro_rules! set {
        ($($flag:ident => $field:ident),* $(,)?) => {
            $(if let Some(v) = flags.$flag { traffic.$field = v; })*
        };
    }
    set!(
        rate => short_rate, slow_rate => slow_rate, slow => slow, stream_rate => stream_rate,
        stream => stream, path => short_path, slow_path => slow_path, stream_path => stream_path,
        http => http, connections => connections,
    );
    // `duration` is set by the run; a placeholder keeps validation meaningful.
    traffic.duration = Duration::from_secs(1);
    traffic.validate()?;
    let prestop = if let Some(u) = flags.prestop_http {
        Some(PreStop::Http(u))
    } else if let Some(c) = flags.prestop_exec {
        Some(PreStop::Exec(c))
    } else {
        flags.prestop_sleep.map(PreStop::Sleep)
    };
    let grace_period = flags.grace_period.unwrap_or(Duration::from_secs(30));
    kill_after_fits(flags.kill_after, grace_period)?;
    Ok(Parsed::Args(CheckArgs {
        command: flags.command,
        pid_namespace: flags.pid_namespace,
        ready_url: ready,
        live_url: flags.live,
        probe_headers,
        expect_readiness: flags.expect_readiness.unwrap_or(ExpectReadiness::Flip),
        prestop,
        stop_signal,
        grace_period,
        kill_after: flags.kill_after,
        startup_timeout: flags.startup_timeout.unwrap_or(Duration::from_secs(30)),
        warmup: flags.warmup.unwrap_or(super::DEFAULT_WARMUP),
        drain_window: flags.drain_window.unwrap_or(Duration::from_secs(2)),
        report_file: flags.report_file,
        expect_report: flags.expect_report,
        strict: flags.strict,
        traffic,
        json: flags.json,
        junit: flags.junit,
    }))
}

/// `--kill-after` is the shorter budget a node shutdown or an eviction gives: above zero, at
/// most the grace period.
fn kill_after_fits(kill_after: Option<Duration>, grace: Duration) -> Result<(), CliError> {
    match kill_after {
        Some(k) if k.is_zero() || k > grace => Err(CliError::new(format!(
            "--kill-after ({} ms) must be above zero and at most --grace-period ({} ms): it is \
             the shorter budget a node shutdown or an eviction gives",
            k.as_millis(),
            grace.as_millis()
        ))),
        _ => Ok(()),
    }
}

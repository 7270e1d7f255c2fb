//! The `correlate` command line: its flags, help text and parsing.

use std::path::PathBuf;

use clap::Parser;

use crate::flags::{subcommand_flags, CliError, Parsed};

/// The `correlate` command's inputs.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CorrelateArgs {
    /// `--probe FILE`: the probe's JSON lines.
    pub probe: PathBuf,
    /// `--report [NAME=]FILE`, in order; `None` takes the name from the report.
    pub reports: Vec<(Option<String>, PathBuf)>,
    /// `--events FILE`: external events, JSON lines.
    pub events: Option<PathBuf>,
    /// `--svg FILE`: where to draw the picture.
    pub svg: Option<PathBuf>,
}

#[derive(Debug, Parser)]
#[command(
    name = "lameduck-probe correlate",
    about = "Join the probe's records with drain reports (and external events): print a diagnosis\nper instance and a class for every failure, optionally draw it as SVG.",
    help_template = "{about}\n\nUSAGE:\n    {usage}\n\n{all-args}{after-help}",
    after_help = "Instances: a report belongs to NAME when given, else to its pod.name, else to its file\nname; records belong to their x-instance answer.\nEvents file lines: {\"unix_ms\": 1764556801203, \"instance\": \"web-1\", \"event\": \"endpoint_removed\"}.\nExit status: 0 printed, 2 bad flags, 3 a file unreadable or not what it should be.\n"
)]
struct CorrelateFlags {
    /// The probe's records (lameduck-probe --out FILE)
    #[arg(long, value_name = "FILE")]
    probe: PathBuf,
    /// A drain report, named after its instance or not (once per instance)
    #[arg(long, value_name = "[NAME=]FILE", required = true)]
    report: Vec<String>,
    /// External events as JSON lines {unix_ms, instance, event}
    #[arg(long, value_name = "FILE")]
    events: Option<PathBuf>,
    /// Also draw the rollout as an SVG picture
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
}

/// The `correlate --help` text.
pub fn correlate_usage() -> String {
    use clap::CommandFactory;
    CorrelateFlags::command().render_help().to_string()
}

pub(crate) fn parse_correlate(args: &[String]) -> Result<Parsed<CorrelateArgs>, CliError> {
    let flags: CorrelateFlags = match subcommand_flags("correlate", args) {
        Ok(flags) => flags,
        Err(done) => return done,
    };
    let reports = flags
        .report
        .iter()
        .map(|r| match r.split_once('=') {
            Some((name, path)) if !name.contains('/') && !name.is_empty() => {
                (Some(name.to_owned()), PathBuf::from(path))
            }
            _ => (None, PathBuf::from(r)),
        })
        .collect();
    Ok(Parsed::Args(CorrelateArgs {
        probe: flags.probe,
        reports,
        events: flags.events,
        svg: flags.svg,
    }))
}

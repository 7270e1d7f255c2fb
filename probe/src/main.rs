//! `lameduck-probe`: the command line over the library. See `lameduck-probe --help`.

#![forbid(unsafe_code)]

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use lameduck_probe::cli::{parse_args, usage, Command, RunArgs};
use lameduck_probe::correlate::{correlate_usage, run_correlate, CorrelateArgs};
use lameduck_probe::{Probe, ProbeHandle, ProbeResult};

fn main() -> ExitCode {
    match parse_args(std::env::args().skip(1)) {
        Ok(Command::Run(run)) => run_main(*run),
        Ok(Command::Help) => {
            print!("{}", usage());
            ExitCode::SUCCESS
        }
        Ok(Command::Version) => {
            println!("lameduck-probe {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Ok(Command::CorrelateHelp) => {
            print!("{}", correlate_usage());
            ExitCode::SUCCESS
        }
        Ok(Command::Correlate(args)) => correlate_main(&args),
        #[cfg(unix)]
        Ok(Command::CheckHelp) => {
            print!("{}", lameduck_probe::check::check_usage());
            ExitCode::SUCCESS
        }
        #[cfg(unix)]
        Ok(Command::Check(args)) => check_main(&args),
        Err(e) => {
            eprintln!("lameduck-probe: {e}");
            match std::env::args().nth(1).as_deref() {
                Some(sub @ ("check" | "correlate")) => {
                    eprintln!("run lameduck-probe {sub} --help for the flags")
                }
                _ => eprintln!("run lameduck-probe --help for the flags"),
            }
            ExitCode::from(2)
        }
    }
}

/// A multi-threaded runtime (`workers` threads, or one per core); `who` prefixes the error.
fn runtime(workers: Option<usize>, who: &str) -> Result<tokio::runtime::Runtime, ExitCode> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = workers {
        builder.worker_threads(n);
    }
    builder.enable_all().build().map_err(|e| {
        eprintln!("{who}: cannot start the async runtime: {e}");
        ExitCode::from(3)
    })
}

/// `lameduck-probe`: runs the probe, prints the summary, writes the records when asked.
fn run_main(run: RunArgs) -> ExitCode {
    // Open the output first: finding it unwritable after a 10-minute run would lose the run.
    let out = match &run.out {
        None => None,
        Some(path) => match File::create(path) {
            Ok(file) => Some((path.clone(), BufWriter::new(file))),
            Err(e) => {
                eprintln!("lameduck-probe: --out {}: {e}", path.display());
                return ExitCode::from(3);
            }
        },
    };
    let runtime = match runtime(None, "lameduck-probe") {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    runtime.block_on(async move {
        let probe = match Probe::new(run.config) {
            Ok(probe) => probe,
            Err(e) => {
                eprintln!("lameduck-probe: {e}");
                return ExitCode::from(2);
            }
        };
        stop_on_ctrl_c(probe.handle(), probe.config().drain_wait);
        let result = match probe.run().await {
            Ok(result) => result,
            Err(e) => {
                eprintln!("lameduck-probe: {e}");
                return ExitCode::from(3);
            }
        };
        print!("{}", result.summary.table());
        if let Some((path, file)) = out {
            if let Err(code) = write_records(&result, &path, file) {
                return code;
            }
        }
        if result.summary.is_clean() {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        }
    })
}

/// The first Ctrl-C stops sending (running requests get `drain_wait`), the second stops
/// waiting.
fn stop_on_ctrl_c(handle: ProbeHandle, drain_wait: Duration) {
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_err() {
            return;
        }
        eprintln!(
            "lameduck-probe: stopping; waiting up to {drain_wait:?} for running requests (Ctrl-C again to stop now)"
        );
        handle.stop();
        if tokio::signal::ctrl_c().await.is_ok() {
            handle.abort();
        }
    });
}

/// Writes the records as JSON lines to `--out` and says where.
fn write_records(result: &ProbeResult, path: &Path, file: BufWriter<File>) -> Result<(), ExitCode> {
    match result.write_json_lines(file) {
        Ok(()) => {
            println!(
                "{:<24}{} ({} lines)",
                "records",
                path.display(),
                result.records.len()
            );
            Ok(())
        }
        Err(e) => {
            eprintln!("lameduck-probe: writing {}: {e}", path.display());
            Err(ExitCode::from(3))
        }
    }
}

/// `lameduck-probe correlate`: prints the diagnosis, draws the SVG when asked.
fn correlate_main(args: &CorrelateArgs) -> ExitCode {
    let (correlation, records) = match run_correlate(args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("lameduck-probe correlate: {e}");
            return ExitCode::from(3);
        }
    };
    // A closed pipe (`| head`) ends the output quietly instead of panicking.
    let mut stdout = std::io::stdout().lock();
    if stdout.write_all(correlation.table().as_bytes()).is_err() {
        return ExitCode::SUCCESS;
    }
    if let Some(path) = &args.svg {
        if let Err(e) = std::fs::write(path, correlation.svg(&records)) {
            eprintln!("lameduck-probe correlate: --svg {}: {e}", path.display());
            return ExitCode::from(3);
        }
        let _ = writeln!(stdout, "picture                 {}", path.display());
    }
    ExitCode::SUCCESS
}

/// Resolves at SIGINT, SIGTERM or SIGHUP (never, if they cannot be listened to).
#[cfg(unix)]
async fn interrupted() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut int), Ok(mut term), Ok(mut hup)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => {}
        _ = term.recv() => {}
        _ = hup.recv() => {}
    }
}

/// `lameduck-probe check`: runs the check, prints the table, writes JSON and JUnit.
#[cfg(unix)]
fn check_main(args: &lameduck_probe::check::CheckArgs) -> ExitCode {
    let runtime = match runtime(Some(2), "lameduck-probe check") {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    // Interrupted (Ctrl-C, a CI runner's SIGTERM, a closed terminal's or a timeout's SIGHUP),
    // the run is dropped: the service is in a process group of its own, so the terminal's
    // signal never reached it, and the drop kills it and everything it started. Killed
    // (SIGKILL), no drop runs: the service's parent-death signal takes it down.
    let run = runtime.block_on(async {
        tokio::select! {
            result = lameduck_probe::check::run_check(args) => Some(result),
            () = interrupted() => None,
        }
    });
    let Some(run) = run else {
        let why = "interrupted: the service and everything it started were killed";
        eprintln!("lameduck-probe check: {why}");
        if let Some(path) = &args.junit {
            let _ = std::fs::write(path, lameduck_probe::check::junit_error(&args.command, why));
        }
        return ExitCode::from(130);
    };
    let report = match run {
        Ok(report) => report,
        Err(e) => {
            eprintln!("lameduck-probe check: {e}");
            if let Some(path) = &args.junit {
                let text = lameduck_probe::check::junit_error(&args.command, &e.to_string());
                if let Err(e) = std::fs::write(path, text) {
                    eprintln!("lameduck-probe check: writing {}: {e}", path.display());
                }
            }
            return ExitCode::from(3);
        }
    };
    print!("{}", report.table());
    let mut code = if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    };
    for (path, text) in [
        (&args.json, report.to_json()),
        (&args.junit, report.junit()),
    ] {
        if let Some(path) = path {
            if let Err(e) = std::fs::write(path, text) {
                eprintln!("lameduck-probe check: writing {}: {e}", path.display());
                code = ExitCode::from(3);
            }
        }
    }
    code
}

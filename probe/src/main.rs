//! `lameduck-probe`: the command line over the library. See `lameduck-probe --help`.

#![forbid(unsafe_code)]

use std::fs::File;
use std::io::{BufWriter, Write};
use std::process::ExitCode;

use lameduck_probe::cli::{parse_args, usage, Command};
use lameduck_probe::correlate::{correlate_usage, run_correlate, CorrelateArgs};
use lameduck_probe::Probe;

fn main() -> ExitCode {
    let run = match parse_args(std::env::args().skip(1)) {
        Ok(Command::Run(run)) => run,
        Ok(Command::Help) => {
            print!("{}", usage());
            return ExitCode::SUCCESS;
        }
        Ok(Command::Version) => {
            println!("lameduck-probe {}", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
        Ok(Command::CorrelateHelp) => {
            print!("{}", correlate_usage());
            return ExitCode::SUCCESS;
        }
        Ok(Command::Correlate(args)) => return correlate_main(&args),
        #[cfg(unix)]
        Ok(Command::CheckHelp) => {
            print!("{}", lameduck_probe::check::check_usage());
            return ExitCode::SUCCESS;
        }
        #[cfg(unix)]
        Ok(Command::Check(args)) => return check_main(&args),
        Err(e) => {
            eprintln!("lameduck-probe: {e}");
            match std::env::args().nth(1).as_deref() {
                Some(sub @ ("check" | "correlate")) => {
                    eprintln!("run lameduck-probe {sub} --help for the flags")
                }
                _ => eprintln!("run lameduck-probe --help for the flags"),
            }
            return ExitCode::from(2);
        }
    };
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
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("lameduck-probe: cannot start the async runtime: {e}");
            return ExitCode::from(3);
        }
    };
    runtime.block_on(async move {
        let probe = match Probe::new(run.config) {
            Ok(probe) => probe,
            Err(e) => {
                eprintln!("lameduck-probe: {e}");
                return ExitCode::from(2);
            }
        };
        let handle = probe.handle();
        let drain_wait = probe.config().drain_wait;
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
        let result = match probe.run().await {
            Ok(result) => result,
            Err(e) => {
                eprintln!("lameduck-probe: {e}");
                return ExitCode::from(3);
            }
        };
        print!("{}", result.summary.table());
        if let Some((path, file)) = out {
            match result.write_json_lines(file) {
                Ok(()) => println!(
                    "{:<24}{} ({} lines)",
                    "records",
                    path.display(),
                    result.records.len()
                ),
                Err(e) => {
                    eprintln!("lameduck-probe: writing {}: {e}", path.display());
                    return ExitCode::from(3);
                }
            }
        }
        if result.summary.is_clean() {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        }
    })
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

/// `lameduck-probe check`: runs the check, prints the table, writes JSON and JUnit.
#[cfg(unix)]
fn check_main(args: &lameduck_probe::check::CheckArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("lameduck-probe check: cannot start the async runtime: {e}");
            return ExitCode::from(3);
        }
    };
    let report = match runtime.block_on(lameduck_probe::check::run_check(args)) {
        Ok(report) => report,
        Err(e) => {
            eprintln!("lameduck-probe check: {e}");
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

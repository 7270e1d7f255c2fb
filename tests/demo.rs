//! The demo, run as the README tells a newcomer to (`cargo run --example demo`): it exits 0,
//! loses nothing with lameduck and something without it, and every figure it prints about the
//! drain fits the drain it describes. Datapath: the demo's own round-robin TCP balancer on
//! loopback; its client does not retry.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A directory of the test's own, removed however the test ends.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The figure after `label` in the client table titled `title`.
fn row(out: &str, title: &str, label: &str) -> u64 {
    let table = &out[out
        .find(title)
        .unwrap_or_else(|| panic!("no {title:?} in:\n{out}"))..];
    let line = table
        .lines()
        .find(|l| l.trim_start().starts_with(label))
        .unwrap_or_else(|| panic!("no {label:?} under {title:?}"));
    line.split_whitespace().last().unwrap().parse().unwrap()
}

#[test]
fn the_demo_loses_nothing_and_every_figure_of_its_drain_fits_it() {
    let dir = Scratch(std::env::temp_dir().join(format!("lameduck-demo-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let mut child = Command::new(common::example_bin("demo"))
        .current_dir(&dir.0)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The demo takes about 25 s; bounded at 180 s.
    let deadline = Instant::now() + Duration::from_secs(180);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the demo did not finish in 180 s");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let output = child.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the demo failed ({}):\n{out}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );

    // With lameduck nothing was lost; the naive shutdown lost requests.
    for (title, lost) in [
        ("(b) client's view, lameduck", false),
        ("(c) client's view, naive shutdown", true),
    ] {
        let sent = row(&out, title, "requests sent");
        let (ok, failed, unfinished) = (
            row(&out, title, "succeeded"),
            row(&out, title, "failed"),
            row(&out, title, "unfinished"),
        );
        assert_eq!(ok + failed + unfinished, sent, "{title}:\n{out}");
        assert!(
            sent > 100,
            "{title}: too few requests to say anything:\n{out}"
        );
        assert_eq!(failed + unfinished > 0, lost, "{title}:\n{out}");
    }

    // The drain's summary on screen is the report's, and every figure of it fits the drain.
    let json = std::fs::read_to_string(Path::new(&dir.0).join("target/demo/report-lameduck.json"))
        .expect("the demo writes its lameduck run's report");
    let report: lameduck::DrainReport = serde_json::from_str(&json).unwrap();
    common::assert_figures_fit(&report);
    let shown: Vec<&str> = out
        .split("(a) timeline of instance-a's drain (lameduck)")
        .nth(1)
        .expect("the demo prints the drain's summary")
        .lines()
        .skip_while(|l| l.trim().is_empty())
        .take_while(|l| !l.trim().is_empty())
        .map(str::trim)
        .collect();
    let summary = report.summary();
    let expected: Vec<&str> = summary.lines().map(str::trim).collect();
    assert_eq!(shown, expected, "the summary on screen is not the report's");
    assert_eq!(report.exit_code, 0, "{json}");
    assert!(
        report.budget.used_ms < report.budget.grace_ms,
        "the drain outlasted its grace: {json}"
    );
}

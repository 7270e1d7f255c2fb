//! Run with `cargo run --release --example demo`.
//!
//! A minimal, self-contained drain: simulated requests and a background task on one
//! coordinator, a trigger, and the timeline that explains what happened.

use std::time::Duration;

use lameduck::{Drain, Propagation, Signals, Trigger};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let drain = Drain::builder()
        .grace_period(Duration::from_secs(6))
        .propagation(
            Propagation::quiet(Duration::from_millis(300))
                .min(Duration::from_millis(500))
                .max(Duration::from_secs(3)),
        )
        .signals(Signals::none())
        .report_to_stderr(false)
        .termination_log(None)
        .build()?;

    let warmup = drain.startup_gate("warmup");
    drain.mark_started();
    println!("phase {} ready={}", drain.phase(), drain.is_ready());
    warmup.open();
    println!("phase {} ready={}", drain.phase(), drain.is_ready());

    drain.spawn("flush", async {
        tokio::time::sleep(Duration::from_millis(700)).await;
    });
    drain.on_close("database", || async {
        tokio::time::sleep(Duration::from_millis(20)).await;
        Ok::<_, std::io::Error>(())
    });

    // A slow request in flight when the drain starts, and a few that arrive during it.
    let slow = drain.enter();
    let d = drain.clone();
    tokio::spawn(async move {
        for _ in 0..5 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let _req = d.enter();
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(900)).await;
        drop(slow);
    });

    drain.start(Trigger::Api);
    println!(
        "drain started: ready={} in_flight={}",
        drain.is_ready(),
        drain.in_flight()
    );
    let report = drain.drained().await;
    println!("{}", report.summary());
    std::process::exit(report.exit_code);
}

//! Run with `cargo run --example queue_consumer`.
//!
//! A queue consumer that stops pulling when the drain starts, finishes its current item,
//! checkpoints on *hurry*, and — if it is still stuck at the quiesce deadline — has its
//! unacknowledged item put back on the queue by a recovery action before it is aborted.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lameduck::{Drain, Propagation, Signals, Trigger};

type Queue = Arc<Mutex<VecDeque<u32>>>;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let drain = Drain::builder()
        .grace_period(Duration::from_secs(4))
        .propagation(Propagation::fixed(Duration::from_millis(200)))
        .signals(Signals::none())
        .report_to_stderr(false)
        .termination_log(None)
        .build()?;

    let queue: Queue = Arc::new(Mutex::new((0..20).collect()));
    let in_progress = Arc::new(Mutex::new(None::<u32>));

    let (q, cur) = (queue.clone(), in_progress.clone());
    let (rq, rcur) = (queue.clone(), in_progress.clone());
    drain.spawn_with_recovery(
        "queue-consumer",
        move |ctx| async move {
            while !ctx.drain_started().is_cancelled() {
                let Some(item) = q.lock().unwrap().pop_front() else {
                    break;
                };
                *cur.lock().unwrap() = Some(item);
                // Item 5 hangs (a stuck downstream call); the others take 100 ms.
                let work = if item == 5 {
                    Duration::MAX
                } else {
                    Duration::from_millis(100)
                };
                tokio::time::sleep(work).await;
                println!("processed {item}");
                *cur.lock().unwrap() = None;
            }
        },
        Duration::from_millis(500),
        move || async move {
            if let Some(item) = rcur.lock().unwrap().take() {
                rq.lock().unwrap().push_front(item);
                println!("recovery: item {item} returned to the queue");
            }
            Ok::<_, lameduck::BoxError>(())
        },
    );

    tokio::time::sleep(Duration::from_millis(550)).await;
    drain.start(Trigger::Api);
    let report = drain.drained().await;
    println!(
        "outcome {:?}, stragglers {:?}",
        report.outcome, report.stragglers
    );
    println!(
        "queue head after the drain: {:?}",
        queue.lock().unwrap().front()
    );
    Ok(())
}

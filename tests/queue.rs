//! Long-running work with a deadline and a recovery path: a queue consumer on an in-process
//! queue loses no item across a drain, whether it finishes, hurries, or is cut at the deadline.

mod common;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{ms, secs};
use lameduck::report::Outcome;
use lameduck::{Drain, Propagation, Trigger};

#[derive(Default)]
struct Queue {
    items: Mutex<VecDeque<u32>>,
    /// The item taken but not yet acknowledged.
    in_progress: Mutex<Option<u32>>,
    done: Mutex<Vec<u32>>,
}

impl Queue {
    fn with(n: u32) -> Arc<Self> {
        let q = Self::default();
        q.items.lock().unwrap().extend(0..n);
        Arc::new(q)
    }
    fn take(&self) -> Option<u32> {
        let item = self.items.lock().unwrap().pop_front()?;
        *self.in_progress.lock().unwrap() = Some(item);
        Some(item)
    }
    fn ack(&self) {
        let item = self.in_progress.lock().unwrap().take().unwrap();
        self.done.lock().unwrap().push(item);
    }
    /// Puts the unacknowledged item back at the head of the queue.
    fn requeue(&self) -> bool {
        match self.in_progress.lock().unwrap().take() {
            Some(item) => {
                self.items.lock().unwrap().push_front(item);
                true
            }
            None => false,
        }
    }
    /// Every item is either done or back in the queue, exactly once.
    fn assert_nothing_lost(&self, n: u32) {
        let mut all: Vec<u32> = self.done.lock().unwrap().clone();
        all.extend(self.items.lock().unwrap().iter().copied());
        all.sort_unstable();
        assert_eq!(all, (0..n).collect::<Vec<_>>());
        assert!(self.in_progress.lock().unwrap().is_none());
    }
}

fn drain() -> Drain {
    common::drain(secs(10), Propagation::fixed(ms(100)))
}

/// Spawns a consumer whose item `stuck` never finishes and which ignores `hurry` when
/// `obey_hurry` is false.
fn spawn_consumer(
    drain: &Drain,
    q: &Arc<Queue>,
    per_item: Duration,
    stuck: Option<u32>,
    obey_hurry: bool,
) {
    let (work, rec) = (q.clone(), q.clone());
    drain.work().spawn_with_recovery(
        "queue-consumer",
        move |ctx| async move {
            loop {
                if ctx.drain_started().is_cancelled() {
                    return; // stop taking new work
                }
                let Some(item) = work.take() else { return };
                let t = if Some(item) == stuck {
                    Duration::MAX
                } else {
                    per_item
                };
                tokio::select! {
                    () = tokio::time::sleep(t) => work.ack(),
                    () = ctx.hurry().cancelled(), if obey_hurry => {
                        work.requeue(); // checkpoint: give it back now
                        return;
                    }
                }
            }
        },
        Duration::from_secs(1),
        move || async move {
            if rec.requeue() {
                Ok(())
            } else {
                Err("nothing to requeue".to_owned())
            }
        },
    );
}

#[tokio::test(start_paused = true)]
async fn the_consumer_finishes_its_current_item_and_stops_pulling() {
    let (drain, q) = (drain(), Queue::with(100));
    spawn_consumer(&drain, &q, Duration::from_millis(300), None, true);
    tokio::time::sleep(Duration::from_millis(1000)).await; // 3 done, the 4th in progress
    drain.start(Trigger::Sigterm);
    let report = drain.drained().await;
    assert_eq!(report.outcome, Outcome::Clean);
    assert_eq!(q.done.lock().unwrap().len(), 4, "finished the current item");
    q.assert_nothing_lost(100);
}

#[tokio::test(start_paused = true)]
async fn a_stuck_item_is_requeued_by_the_recovery_action_at_the_deadline() {
    let (drain, q) = (drain(), Queue::with(10));
    spawn_consumer(&drain, &q, Duration::from_millis(100), Some(2), false);
    tokio::time::sleep(Duration::from_millis(500)).await;
    drain.start(Trigger::Sigterm);
    let report = drain.drained().await;
    assert_eq!(report.outcome, Outcome::DeadlineExceeded);
    let st = &report.stragglers[0];
    assert_eq!(
        (st.name.as_str(), st.recovery.clone()),
        ("queue-consumer", Some(lameduck::report::ActionResult::Ok))
    );
    assert_eq!(
        q.items.lock().unwrap().front(),
        Some(&2),
        "item 2 is back at the head"
    );
    q.assert_nothing_lost(10);
}

#[tokio::test(start_paused = true)]
async fn hurry_lets_a_slow_item_be_checkpointed_before_the_deadline() {
    let (drain, q) = (drain(), Queue::with(10));
    spawn_consumer(&drain, &q, Duration::from_secs(60), None, true);
    tokio::time::sleep(Duration::from_millis(10)).await;
    drain.start(Trigger::Sigterm);
    let report = drain.drained().await;
    // The consumer gave the item back on `hurry`, before the deadline: a clean drain.
    assert_eq!(report.outcome, Outcome::Clean);
    assert!(report.stragglers.is_empty());
    q.assert_nothing_lost(10);
    assert_eq!(q.items.lock().unwrap().len(), 10);
}

//! Run with `cargo run --example queue_consumer`, then stop it with Ctrl-C or
//! `kill <pid>` (SIGTERM, what kubelet sends). `LAMEDUCK_GRACE_PERIOD=8s` shortens the drain.
//!
//! The shape a queue worker copies (the worker guide, `lameduck::guide::worker`, explains each
//! piece): the drain starts at SIGTERM; the consumer stops taking messages, finishes the one in
//! hand, and when a long job cannot finish in time it checkpoints on *hurry* and hands the
//! message back; a recovery action returns a message whose handler is stuck (a downstream call
//! that never answers) before the task is aborted at the quiesce deadline; the broker
//! connection is closed last; `main` returns the report, so the exit code is the drain's (0
//! clean, 1 when work was cut at the deadline or a closer failed).
//!
//! The in-memory `Broker` stands in for a real one (SQS, RabbitMQ, Kafka, a database table).
//! Message 7 is a long job (30 s of work in 1 s steps) so a drain shows *hurry*; set
//! `QUEUE_STUCK=1` to make message 3 hang forever instead, to see the recovery action and an
//! exit code of 1.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lameduck::{Drain, DrainReport, Propagation, TaskContext};

#[tokio::main]
async fn main() -> Result<DrainReport, Box<dyn std::error::Error>> {
    let drain = Drain::builder()
        // Nothing routes to a worker: commit at the trigger instead of measuring traffic.
        .propagation(Propagation::fixed(Duration::ZERO))
        .build()?; // grace period from LAMEDUCK_GRACE_PERIOD (default 30 s); SIGTERM, SIGINT

    let broker = Broker::connect();

    // Registered first, closed last: after the consumer has ended (or been aborted).
    let b = broker.clone();
    drain.work().on_close("broker", move || async move {
        b.close();
        Ok::<_, std::io::Error>(())
    });

    let (b, in_hand) = (broker.clone(), Arc::new(Mutex::new(None::<Message>)));
    let (rb, rin_hand) = (broker.clone(), in_hand.clone());
    drain.work().spawn_with_recovery(
        "orders-consumer",
        move |cx| async move {
            loop {
                // Only the wait for the next message races the drain: a message in hand is
                // finished (or checkpointed below), never dropped.
                let msg = tokio::select! {
                    () = cx.drain_started().cancelled() => break,
                    msg = b.receive() => msg,
                };
                *in_hand.lock().unwrap() = Some(msg.clone());
                match handle(&msg, &cx).await {
                    Done::Finished => b.ack(&msg),
                    // Hurry fired mid-job: save the progress, give the message back, stop.
                    Done::Checkpointed(step) => {
                        println!("hurry: message {} checkpointed at step {step}", msg.id);
                        b.nack(Message { step, ..msg });
                        *in_hand.lock().unwrap() = None;
                        break;
                    }
                }
                *in_hand.lock().unwrap() = None;
            }
        },
        Duration::from_secs(1),
        // The safety net, for a handler that ignores hurry (stuck in a call with no timeout):
        // runs at the quiesce deadline, before the task is aborted.
        move || async move {
            if let Some(msg) = rin_hand.lock().unwrap().take() {
                println!("recovery: message {} returned to the queue", msg.id);
                rb.nack(msg);
            }
            Ok::<_, std::io::Error>(())
        },
    );

    // Waits for SIGTERM / SIGINT, then drains: the consumer stops, the broker closes, the
    // report is written to stderr. Returning it from `main` exits with its code after
    // destructors ran.
    let report = drain.run().await;
    println!("{} messages left on the queue", broker.len());
    Ok(report)
}

#[derive(Clone, Debug)]
struct Message {
    id: u32,
    /// Steps of a long job already done (the checkpoint).
    step: u32,
}

enum Done {
    Finished,
    Checkpointed(u32),
}

/// Processes one message; a long job checks `hurry` between its steps.
async fn handle(msg: &Message, cx: &TaskContext) -> Done {
    let stuck = std::env::var_os("QUEUE_STUCK").is_some();
    if msg.id == 3 && stuck {
        std::future::pending::<()>().await; // a downstream call that never answers
    }
    let steps = if msg.id == 7 { 30 } else { 1 };
    for step in msg.step..steps {
        if cx.hurry().is_cancelled() {
            return Done::Checkpointed(step);
        }
        tokio::time::sleep(Duration::from_millis(if steps > 1 { 1000 } else { 200 })).await;
    }
    println!("processed message {}", msg.id);
    Done::Finished
}

/// An in-memory stand-in for a message broker.
#[derive(Clone)]
struct Broker {
    queue: Arc<Mutex<VecDeque<Message>>>,
}

impl Broker {
    fn connect() -> Self {
        let queue = (0..1000).map(|id| Message { id, step: 0 }).collect();
        Self {
            queue: Arc::new(Mutex::new(queue)),
        }
    }

    async fn receive(&self) -> Message {
        loop {
            if let Some(msg) = self.queue.lock().unwrap().pop_front() {
                return msg;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn ack(&self, _msg: &Message) {}

    fn nack(&self, msg: Message) {
        self.queue.lock().unwrap().push_front(msg);
    }

    fn len(&self) -> usize {
        self.queue.lock().unwrap().len()
    }

    fn close(&self) {
        println!("broker connection closed");
    }
}

//! Background tasks, ordered closers, the quiesce deadline and the report, with paused time.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{ms, quiet_builder, secs};
use lameduck::report::{ActionResult, Outcome, StragglerKind, TaskResult, TERMINATION_LOG_LIMIT};
use lameduck::{CloseOptions, DrainReport, EventKind, Phase, Propagation, Trigger};
use tokio::time::Instant;

/// Grace 10 s, a fixed 100 ms propagation delay.
fn builder() -> lameduck::DrainBuilder {
    quiet_builder()
        .grace_period(secs(10))
        .propagation(Propagation::fixed(ms(100)))
}

#[tokio::test(start_paused = true)]
async fn a_must_finish_task_delays_closing() {
    let drain = builder().build().unwrap();
    drain.work().spawn("upload-flush", async {
        tokio::time::sleep(secs(3)).await;
    });
    assert_eq!(drain.counts().tasks(), 1);
    let closed_at = Arc::new(Mutex::new(None));
    let c = closed_at.clone();
    drain.work().on_close("bucket", move || async move {
        *c.lock().unwrap() = Some(Instant::now());
        Ok::<_, std::io::Error>(())
    });
    let t0 = Instant::now();
    drain.start(Trigger::Api);
    tokio::time::sleep(secs(1)).await;
    assert_eq!(drain.phase(), Phase::StoppedAccepting);
    let report = drain.drained().await;
    assert_eq!(report.outcome, Outcome::Clean);
    assert_eq!(report.event(EventKind::TasksDone).unwrap().at_ms, 3000);
    let closed = closed_at.lock().unwrap().unwrap();
    assert!(closed >= t0 + secs(3));
    // tasks_done comes before the closer.
    let order: Vec<_> = report.timeline.iter().map(|e| e.event).collect();
    let td = order
        .iter()
        .position(|e| *e == EventKind::TasksDone)
        .unwrap();
    let rc = order
        .iter()
        .position(|e| *e == EventKind::ResourceClosed)
        .unwrap();
    assert!(td < rc);
}

/// A batch that finished at +986 ms of a drain that stopped accepting at +5 s: the timeline's
/// `tasks_done` is seen at the stop, and says the work ended at +986 ms (not that it ran 5 s).
#[tokio::test(start_paused = true)]
async fn tasks_done_says_when_the_last_task_ended_before_the_stop() {
    let drain = quiet_builder()
        .grace_period(secs(10))
        .propagation(Propagation::fixed(secs(5)))
        .build()
        .unwrap();
    drain.start(Trigger::Api);
    drain.work().spawn("batch", async {
        tokio::time::sleep(ms(986)).await;
    });
    let report = drain.drained().await;
    let done = report.event(EventKind::TasksDone).unwrap();
    let stop = report.event(EventKind::StoppedAccepting).unwrap();
    assert!(done.at_ms >= stop.at_ms, "{done:?} {stop:?}");
    assert_eq!(
        done.detail.as_deref(),
        Some("the last task, `batch`, ended at +986 ms, before stopped_accepting")
    );
    let zero = report.event(EventKind::InFlightZero).unwrap();
    assert_eq!(
        zero.detail.as_deref(),
        Some("none in flight at stopped_accepting")
    );

    // No task at all: said so.
    let drain = builder().build().unwrap();
    drain.start(Trigger::Api);
    let report = drain.drained().await;
    let done = report.event(EventKind::TasksDone).unwrap();
    assert_eq!(done.detail.as_deref(), Some("no task ran"));
}

#[tokio::test(start_paused = true)]
async fn a_cancellable_task_sees_its_token_at_drain_start() {
    let drain = builder().build().unwrap();
    let stopped_at = Arc::new(Mutex::new(None));
    let st = stopped_at.clone();
    drain
        .work()
        .spawn_cancellable("queue-consumer", move |ctx| async move {
            ctx.drain_started().cancelled().await;
            *st.lock().unwrap() = Some(Instant::now());
            // Finish the current item.
            tokio::time::sleep(Duration::from_millis(500)).await;
        });
    tokio::time::sleep(secs(2)).await;
    assert!(stopped_at.lock().unwrap().is_none());
    let t0 = Instant::now();
    drain.start(Trigger::Api);
    tokio::task::yield_now().await;
    let report = drain.drained().await;
    assert_eq!(*stopped_at.lock().unwrap(), Some(t0));
    assert_eq!(report.event(EventKind::TasksDone).unwrap().at_ms, 500);
    assert_eq!(report.outcome, Outcome::Clean);
}

#[tokio::test(start_paused = true)]
async fn closers_run_in_reverse_order_and_failures_do_not_stop_the_next() {
    let drain = builder().build().unwrap();
    let ran = Arc::new(Mutex::new(Vec::new()));
    let r = ran.clone();
    drain.work().on_close("postgres", move || async move {
        r.lock().unwrap().push("postgres");
        Ok::<_, std::io::Error>(())
    });
    let r = ran.clone();
    drain.work().on_close("cache", move || async move {
        r.lock().unwrap().push("cache");
        Err::<(), _>(std::io::Error::other("connection reset"))
    });
    let r = ran.clone();
    drain.work().on_close("metrics", move || async move {
        r.lock().unwrap().push("metrics");
        if true {
            panic!("closer bug");
        }
        Ok::<_, std::io::Error>(())
    });
    let r = ran.clone();
    drain.work().on_close_with(
        "queue",
        lameduck::CloseOptions::new().timeout(Duration::from_millis(300)),
        move || async move {
            r.lock().unwrap().push("queue");
            std::future::pending::<()>().await;
            Ok::<_, std::io::Error>(())
        },
    );
    drain.start(Trigger::Api);
    let report = drain.drained().await;
    assert_eq!(
        *ran.lock().unwrap(),
        vec!["queue", "metrics", "cache", "postgres"]
    );
    let results: Vec<_> = report
        .closers
        .iter()
        .map(|c| (c.name.as_str(), c.result.clone()))
        .collect();
    assert_eq!(
        results,
        vec![
            ("queue", ActionResult::TimedOut),
            ("metrics", ActionResult::Panicked),
            ("cache", ActionResult::Error("connection reset".to_owned())),
            ("postgres", ActionResult::Ok),
        ]
    );
    // The JSON keeps the strings.
    assert_eq!(
        serde_json::to_value(&report.closers[2]).unwrap()["result"],
        "error: connection reset"
    );
    assert_eq!(report.closers[0].took_ms, 300);
    assert_eq!(report.outcome, Outcome::CloserFailed);
    assert_eq!(report.exit_code, 1);
    assert_eq!(
        report
            .timeline
            .iter()
            .filter(|e| e.event == EventKind::ResourceClosed)
            .count(),
        4
    );
}

#[tokio::test(start_paused = true)]
async fn a_slow_closer_cannot_take_the_time_of_the_one_registered_before_it() {
    let drain = builder().build().unwrap();
    // Registered first, so closed last: the pool everything else used.
    drain.work().on_close("db-pool", || async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        Ok::<_, std::io::Error>(())
    });
    // Registered second, so closed first, and it hangs.
    drain.work().on_close("exporter", || async {
        std::future::pending::<()>().await;
        Ok::<_, std::io::Error>(())
    });
    drain.start(Trigger::Api);
    let report = drain.drained().await;
    let results: Vec<_> = report
        .closers
        .iter()
        .map(|c| (c.name.as_str(), c.result.clone()))
        .collect();
    assert_eq!(
        results,
        vec![
            ("exporter", ActionResult::TimedOut),
            ("db-pool", ActionResult::Ok)
        ]
    );
    // The exporter got half of what was left before the hard deadline, not all of it.
    let closed = report.event(EventKind::ResourceClosed).unwrap().at_ms;
    let took = report.closers[0].took_ms;
    let left = drain.moments().budget().hard_deadline().as_millis() as u64 - (closed - took);
    // Millisecond rounding on both sides of the division.
    assert!(took.abs_diff(left / 2) <= 1, "{took} ms of {left} ms");
}

#[tokio::test(start_paused = true)]
async fn a_critical_closer_keeps_its_time_after_a_long_explicit_timeout() {
    let drain = builder().build().unwrap();
    drain
        .work()
        .on_close_with("db-pool", CloseOptions::new().critical(), || async {
            Ok::<_, std::io::Error>(())
        });
    drain.work().on_close_with(
        "exporter",
        CloseOptions::new().timeout(Duration::from_secs(3600)),
        || async {
            std::future::pending::<()>().await;
            Ok::<_, std::io::Error>(())
        },
    );
    drain.start(Trigger::Api);
    let report = drain.drained().await;
    assert_eq!(report.closers[0].result, ActionResult::TimedOut);
    assert_eq!(report.closers[1].name, "db-pool");
    assert_eq!(report.closers[1].result, ActionResult::Ok);
}

#[tokio::test(start_paused = true)]
async fn a_task_that_never_ends_is_a_straggler_and_the_drain_still_finishes() {
    let drain = builder().build().unwrap();
    // grace 10 s: margin 333 ms, close 1666 ms → quiesce at 8001 ms, hard at 9667 ms.
    drain
        .work()
        .spawn("stuck-export", std::future::pending::<()>());
    let closer_ran = Arc::new(Mutex::new(false));
    let c = closer_ran.clone();
    drain.work().on_close("db", move || async move {
        *c.lock().unwrap() = true;
        Ok::<_, std::io::Error>(())
    });
    let t0 = Instant::now();
    drain.start(Trigger::Sigterm);
    let report = drain.drained().await;
    let took = t0.elapsed();
    assert!(took < drain.moments().budget().hard_deadline(), "{took:?}");
    assert_eq!(report.outcome, Outcome::DeadlineExceeded);
    assert_eq!(report.exit_code, 1);
    let deadline = report.event(EventKind::DeadlineExceeded).unwrap();
    assert_eq!(
        deadline.at_ms,
        drain.moments().budget().quiesce_deadline().as_millis() as u64
    );
    assert_eq!(report.stragglers.len(), 1);
    assert_eq!(report.stragglers[0].kind, StragglerKind::Task);
    assert_eq!(report.stragglers[0].name, "stuck-export");
    assert!(*closer_ran.lock().unwrap(), "closing still got its time");
    assert_eq!(report.tasks.len(), 1);
    assert_eq!(report.tasks[0].result, TaskResult::Aborted);
    assert_eq!(drain.counts().tasks(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_request_still_in_flight_at_the_deadline_is_a_straggler() {
    let drain = builder().build().unwrap();
    let _guard = drain.enter();
    drain.start(Trigger::Api);
    let report = drain.drained().await;
    assert_eq!(report.outcome, Outcome::DeadlineExceeded);
    assert_eq!(report.stragglers.len(), 1);
    assert_eq!(report.stragglers[0].kind, StragglerKind::Request);
    assert!(report.event(EventKind::InFlightZero).is_none());
}

#[tokio::test(start_paused = true)]
async fn a_panicking_task_is_recorded_and_does_not_take_the_coordinator_down() {
    let drain = builder().build().unwrap();
    drain.work().spawn("bad-job", async {
        tokio::time::sleep(Duration::from_millis(10)).await;
        panic!("boom");
    });
    tokio::time::sleep(secs(1)).await;
    assert_eq!(drain.counts().tasks(), 0);
    drain.start(Trigger::Api);
    let report = drain.drained().await;
    assert_eq!(report.tasks.len(), 1);
    assert_eq!(report.tasks[0].name, "bad-job");
    assert_eq!(report.tasks[0].result, TaskResult::Panicked);
    // A panicked task is recorded; the drain itself is clean.
    assert_eq!(report.outcome, Outcome::Clean);
}

#[tokio::test(start_paused = true)]
async fn recovery_runs_for_an_unfinished_task_before_it_is_aborted() {
    let drain = builder().build().unwrap();
    let queue = Arc::new(Mutex::new(Vec::<u32>::new()));
    let hurried = Arc::new(Mutex::new(None));
    let (h, q) = (hurried.clone(), queue.clone());
    drain.work().spawn_with_recovery(
        "consumer",
        move |ctx| async move {
            ctx.hurry().cancelled().await;
            *h.lock().unwrap() = Some(Instant::now());
            std::future::pending::<()>().await;
        },
        secs(1),
        move || async move {
            q.lock().unwrap().push(7);
            Ok::<_, std::io::Error>(())
        },
    );
    let t0 = Instant::now();
    drain.start(Trigger::Api);
    let report = drain.drained().await;
    assert_eq!(
        *queue.lock().unwrap(),
        vec![7],
        "the item went back to the queue"
    );
    let hurry_at = hurried.lock().unwrap().unwrap() - t0;
    assert!(hurry_at < drain.moments().budget().quiesce_deadline());
    let st = &report.stragglers[0];
    assert_eq!(st.name, "consumer");
    assert_eq!(st.recovery, Some(ActionResult::Ok));
}

#[tokio::test(start_paused = true)]
async fn the_report_round_trips_and_holds_every_event() {
    let drain = builder().build().unwrap();
    drain
        .work()
        .on_close("db", || async { Ok::<_, std::io::Error>(()) });
    drain.work().spawn("short", async {
        tokio::time::sleep(Duration::from_millis(50)).await;
    });
    drain.start(Trigger::PreStop);
    drain.start(Trigger::Sigterm);
    let report = drain.drained().await;
    let json = report.to_json();
    let back: DrainReport = serde_json::from_str(&json).unwrap();
    assert_eq!(back, report);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    for key in [
        "outcome",
        "trigger",
        "exit_code",
        "budget",
        "timeline",
        "after_flip",
        "stragglers",
        "closers",
        "pod",
    ] {
        assert!(v.get(key).is_some(), "missing {key}");
    }
    assert_eq!(v["trigger"], "prestop");
    assert_eq!(v["outcome"], "clean");
    assert_eq!(v["budget"]["grace_ms"], 10_000);
    let events: Vec<&str> = v["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert_eq!(
        events,
        [
            "drain_started",
            "readiness_flipped",
            "signal_received",
            "propagation_done",
            "stopped_accepting",
            // The default readiness policy (auto) flips kubelet's view at stopped_accepting.
            "readiness_flipped",
            "in_flight_zero",
            "tasks_done",
            "resource_closed",
            "done"
        ]
    );
    assert_eq!(v["propagation"]["evidence"]["kind"], "fixed");
}

#[tokio::test(start_paused = true)]
async fn the_termination_summary_is_capped_and_written_to_the_log_path() {
    let dir = std::env::temp_dir().join(format!("lameduck-tlog-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("termination-log");
    std::fs::write(&log, "").unwrap();
    let drain = builder()
        .termination_log(Some(log.clone()))
        .report_file(dir.join("report.json"))
        .build()
        .unwrap();
    // 300 closers with long names: far more than 4096 bytes of summary.
    for i in 0..300 {
        drain.work().on_close(
            format!("resource-with-a-long-descriptive-name-{i:04}"),
            || async { Ok::<_, std::io::Error>(()) },
        );
    }
    drain.start(Trigger::Api);
    let report = drain.drained().await;
    let summary = report.summary();
    assert!(summary.len() <= TERMINATION_LOG_LIMIT, "{}", summary.len());
    assert!(summary.starts_with("info: this drain used"), "{summary}");
    assert!(summary.contains("\nlameduck drain clean (exit 0), trigger api"));
    assert!(summary.ends_with("…(truncated)\n"));
    let written = std::fs::read_to_string(&log).unwrap();
    assert_eq!(written, summary);
    let file = std::fs::read_to_string(dir.join("report.json")).unwrap();
    let back: DrainReport = serde_json::from_str(file.trim()).unwrap();
    assert_eq!(back, report);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_missing_termination_log_is_not_an_error() {
    let drain = builder()
        .termination_log(Some("/nonexistent-dir/termination-log".into()))
        .build()
        .unwrap();
    drain.start(Trigger::Api);
    assert_eq!(drain.drained().await.outcome, Outcome::Clean);
}

#[tokio::test(start_paused = true)]
async fn a_panicking_task_starts_the_drain_when_asked_and_only_then() {
    let drain = builder().drain_on_task_panic(true).build().unwrap();
    drain.readiness().mark_serving();
    drain.work().spawn("exporter", async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        panic!("lost the connection");
    });
    let report = drain.drained().await;
    assert_eq!(report.trigger, Some(Trigger::TaskPanic));
    assert_eq!(report.tasks.len(), 1);
    assert_eq!(report.tasks[0].name, "exporter");
    assert_eq!(report.tasks[0].result, TaskResult::Panicked);
    assert!(report.summary().contains("task exporter panicked"));

    // Without the setting the panic is recorded and nothing starts.
    let calm = builder().build().unwrap();
    calm.readiness().mark_serving();
    calm.work()
        .spawn("exporter", async { panic!("lost the connection") });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(calm.phase(), Phase::Serving);
    calm.start(Trigger::Api);
    let report = calm.drained().await;
    assert_eq!(report.trigger, Some(Trigger::Api));
    assert_eq!(report.tasks[0].result, TaskResult::Panicked);
}

#[tokio::test(start_paused = true)]
async fn the_report_says_what_path_it_measured() {
    let drain = builder()
        .proxy_label("kube-proxy iptables")
        .build()
        .unwrap();
    drain.start(Trigger::Api);
    let report = drain.drained().await;
    assert_eq!(report.proxy_label.as_deref(), Some("kube-proxy iptables"));
    assert!(report
        .to_json()
        .contains("\"proxy_label\":\"kube-proxy iptables\""));
    assert!(report
        .summary()
        .contains("measured through: kube-proxy iptables"));
    // Not set: not in the JSON at all.
    let plain = builder().build().unwrap();
    plain.start(Trigger::Api);
    assert!(!plain.drained().await.to_json().contains("proxy_label"));
}

#[tokio::test(start_paused = true)]
async fn spawn_hands_back_tokios_handle_with_the_output_the_panic_and_the_abort() {
    let drain = builder().build().unwrap();
    let answer = drain.work().spawn("compute", async { 6 * 7 });
    assert_eq!(answer.await.unwrap(), 42);
    let boom = drain.work().spawn("boom", async {
        if drain_never_ends() {
            panic!("boom");
        }
    });
    assert!(
        boom.await.unwrap_err().is_panic(),
        "the handle reports the panic"
    );
    let stuck = drain
        .work()
        .spawn_cancellable("stuck", |_ctx| std::future::pending::<()>());
    let named = drain.work().spawn_cancellable("stops", |ctx| async move {
        ctx.drain_started().cancelled().await;
        ctx.stopped_accepting().cancelled().await;
        "stopped"
    });
    assert_eq!(drain.counts().tasks(), 2, "finished tasks no longer count");
    drain.start(Trigger::Api);
    assert_eq!(named.await.unwrap(), "stopped");
    let report = drain.drained().await;
    assert!(
        stuck.await.unwrap_err().is_cancelled(),
        "aborted at the deadline"
    );
    let ended: Vec<_> = report
        .tasks
        .iter()
        .map(|t| (t.name.as_str(), t.result))
        .collect();
    assert_eq!(
        ended,
        [
            ("boom", TaskResult::Panicked),
            ("stuck", TaskResult::Aborted)
        ],
        "the report still names what panicked or was cut: {ended:?}"
    );
}

/// Keeps the compiler from seeing the panic as unconditional.
fn drain_never_ends() -> bool {
    std::hint::black_box(true)
}

#[tokio::test(start_paused = true)]
async fn a_worker_without_http_is_not_told_about_connections() {
    // The worker guide's setup: no HTTP, a fixed zero delay, one task.
    let drain = quiet_builder()
        .propagation(Propagation::fixed(Duration::ZERO))
        .build()
        .unwrap();
    drain
        .work()
        .spawn_cancellable("consumer", |ctx| async move {
            ctx.drain_started().cancelled().await;
        });
    drain.start(Trigger::Sigterm);
    let report = drain.drained().await;
    assert_eq!(report.outcome, Outcome::Clean);
    let rules: Vec<_> = report.advice.iter().map(|a| a.rule.as_str()).collect();
    assert!(
        !rules.contains(&"not_enough_traffic") && !rules.contains(&"no_connection_data"),
        "nothing to measure is not news: {rules:?}"
    );
    let done = report
        .event(EventKind::PropagationDone)
        .expect("propagation_done");
    let detail = done.detail.as_deref().unwrap_or_default();
    assert!(
        detail.starts_with("fixed: a set delay") && !detail.contains("serve"),
        "{detail}"
    );
}

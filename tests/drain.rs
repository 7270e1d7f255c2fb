//! Behaviour of the coordinator core, with paused Tokio time.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{ms, quiet_builder};
use lameduck::AdminBuilder;
use lameduck::{
    CommitReason, ConfigError, Drain, EventKind, Phase, Propagation, ReadinessWhileDraining,
    Trigger,
};
use tokio::time::Instant;

#[tokio::test(start_paused = true)]
async fn phases_move_forward_in_order() {
    let drain = quiet_builder()
        .grace_period(Duration::from_secs(10))
        .propagation(Propagation::fixed(ms(500)))
        .build()
        .unwrap();
    let mut rx = drain.moments().subscribe();
    assert_eq!(drain.phase(), Phase::Starting);
    drain.readiness().mark_serving();
    assert_eq!(drain.phase(), Phase::Serving);

    let seen = tokio::spawn(async move {
        let mut seen = vec![*rx.borrow_and_update()];
        while rx.changed().await.is_ok() {
            let p = *rx.borrow_and_update();
            seen.push(p);
            if p == Phase::Done {
                break;
            }
        }
        seen
    });
    tokio::task::yield_now().await; // let the observer see Serving
    assert!(drain.start(Trigger::Api));
    assert_eq!(drain.phase(), Phase::Draining);
    tokio::time::sleep(ms(600)).await;
    assert!(drain.phase() >= Phase::StoppedAccepting);
    let report = drain.drained().await;
    common::assert_figures_fit(&report);
    // A watch shows the latest phase, so the observer may skip some; what it sees is in order.
    let seen = seen.await.unwrap();
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
    assert_eq!(seen.first(), Some(&Phase::Serving));
    assert_eq!(seen.last(), Some(&Phase::Done));
    let kinds: Vec<_> = report.timeline.iter().map(|e| e.event).collect();
    assert_eq!(
        kinds,
        vec![
            EventKind::DrainStarted,
            EventKind::ReadinessFlipped,
            EventKind::PropagationDone,
            EventKind::StoppedAccepting,
            // The default readiness policy (auto) flips kubelet's view at stopped_accepting.
            EventKind::ReadinessFlipped,
            EventKind::InFlightZero,
            EventKind::TasksDone,
            EventKind::Done,
        ]
    );
    let flips: Vec<_> = report
        .timeline
        .iter()
        .filter(|e| e.event == EventKind::ReadinessFlipped)
        .map(|e| (e.at_ms, e.detail.clone().unwrap_or_default()))
        .collect();
    assert_eq!(flips[0].0, 0);
    assert!(flips[0].1.contains("other than kubelet"), "{flips:?}");
    assert_eq!(flips[1].0, 500);
    assert!(flips[1].1.contains("kubelet"), "{flips:?}");
    assert_eq!(
        report.event(EventKind::StoppedAccepting).unwrap().reason,
        Some(CommitReason::Fixed)
    );
    assert_eq!(
        report.event(EventKind::StoppedAccepting).unwrap().at_ms,
        500
    );
    assert_eq!(report.exit_code, 0);
}

#[tokio::test(start_paused = true)]
async fn readiness_is_false_until_every_gate_opens() {
    let drain = quiet_builder().build().unwrap();
    let warm = drain.readiness().startup_gate("cache-warmup");
    let migrations = drain.readiness().startup_gate("migrations");
    drain.readiness().mark_serving();
    assert_eq!(drain.phase(), Phase::Starting);
    let r = drain.readiness().answer();
    assert!(!r.ready);
    assert_eq!(r.reason, "starting: waiting for cache-warmup");
    warm.open();
    assert!(!drain.readiness().is_ready());
    assert_eq!(
        drain.readiness().answer().reason,
        "starting: waiting for migrations"
    );
    assert_eq!(drain.phase(), Phase::Starting);
    migrations.open();
    assert!(drain.readiness().is_ready());
    assert_eq!(drain.phase(), Phase::Serving);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_gate_keeps_readiness_false() {
    let drain = quiet_builder().build().unwrap();
    let gate = drain.readiness().startup_gate("warmup");
    drop(gate);
    drain.readiness().mark_serving();
    assert!(!drain.readiness().is_ready());
    assert_eq!(drain.phase(), Phase::Starting);
    assert!(drain
        .readiness()
        .answer()
        .checks
        .iter()
        .any(|c| c == "[-]gate warmup waiting"));
}

#[tokio::test(start_paused = true)]
async fn readiness_checks_are_listed_and_can_fail() {
    let drain = quiet_builder().build().unwrap();
    drain.readiness().mark_serving();
    let healthy = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let h = healthy.clone();
    drain.readiness().check("local-disk", move || {
        if h.load(std::sync::atomic::Ordering::Relaxed) {
            Ok(())
        } else {
            Err("full")
        }
    });
    assert!(drain.readiness().is_ready());
    healthy.store(false, std::sync::atomic::Ordering::Relaxed);
    let r = drain.readiness().answer();
    assert!(!r.ready);
    assert_eq!(r.reason, "check local-disk failed: full");
    assert!(r.checks.contains(&"[-]local-disk failed: full".to_owned()));
}

#[tokio::test(start_paused = true)]
async fn exactly_one_of_many_concurrent_starts_wins() {
    let drain = quiet_builder().build().unwrap();
    drain.readiness().mark_serving();
    let mut handles = Vec::new();
    for i in 0..100 {
        let d = drain.clone();
        handles.push(tokio::spawn(async move {
            d.start(if i % 2 == 0 {
                Trigger::Api
            } else {
                Trigger::PreStop
            })
        }));
    }
    let mut wins = 0;
    for h in handles {
        if h.await.unwrap() {
            wins += 1;
        }
    }
    assert_eq!(wins, 1);
    let tl = drain.moments().timeline();
    assert_eq!(
        tl.iter()
            .filter(|e| e.event == EventKind::DrainStarted)
            .count(),
        1
    );
    // Repeats collapse: one `signal_received` per trigger kind, counting the 99 later calls.
    let received: Vec<_> = tl
        .iter()
        .filter(|e| e.event == EventKind::SignalReceived)
        .collect();
    assert_eq!(received.len(), 2, "{received:?}");
    let total: u64 = received.iter().map(|e| e.count.unwrap_or(1)).sum();
    assert_eq!(total, 99);
}

#[tokio::test(start_paused = true)]
async fn later_triggers_do_not_move_the_origin() {
    let drain = quiet_builder()
        .grace_period(Duration::from_secs(10))
        .propagation(Propagation::fixed(Duration::from_secs(2)))
        .build()
        .unwrap();
    let t0 = Instant::now();
    drain.start(Trigger::PreStop);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!drain.start(Trigger::Sigterm));
    assert_eq!(
        drain.moments().quiesce_deadline().unwrap(),
        t0 + drain.moments().budget().quiesce_deadline()
    );
    let report = drain.drained().await;
    common::assert_figures_fit(&report);
    assert_eq!(report.trigger, Some(Trigger::PreStop));
    let sig = report.event(EventKind::SignalReceived).unwrap();
    assert_eq!(sig.trigger, Some(Trigger::Sigterm));
    assert_eq!(sig.at_ms, 1000);
    // Propagation still counted from the first trigger.
    assert_eq!(
        report.event(EventKind::StoppedAccepting).unwrap().at_ms,
        2000
    );
}

// ---------- budget and configuration errors ----------

fn err(b: lameduck::DrainBuilder) -> ConfigError {
    b.build().unwrap_err()
}

#[test]
fn budget_arithmetic() {
    let d = Drain::builder()
        .grace_period(Duration::from_secs(30))
        .build()
        .unwrap();
    let b = d.moments().budget();
    assert_eq!(b.hard_deadline(), Duration::from_secs(29));
    assert_eq!(b.quiesce_deadline(), Duration::from_secs(24));

    let d = Drain::builder()
        .grace_period(Duration::from_secs(60))
        .safety_margin(Duration::from_secs(2))
        .close_budget(Duration::from_secs(10))
        .build()
        .unwrap();
    assert_eq!(
        d.moments().budget().quiesce_deadline(),
        Duration::from_secs(48)
    );

    // Short grace period: the defaults shrink in proportion.
    let d = Drain::builder().grace_period(ms(3000)).build().unwrap();
    assert_eq!(d.moments().budget().safety_margin, ms(100));
    assert_eq!(d.moments().budget().close_budget, ms(500));
}

#[test]
fn every_config_error_names_the_setting() {
    let e = err(Drain::builder().grace_period(Duration::ZERO));
    assert!(
        e.is_budget() && e.to_string().contains("grace_period is zero"),
        "{e}"
    );

    let e = err(Drain::builder()
        .grace_period(Duration::from_secs(5))
        .close_budget(Duration::from_secs(5)));
    assert!(e.is_budget());
    assert_eq!(
        e.to_string(),
        "close_budget (5s) + safety_margin (166ms) leaves nothing of grace_period (5s): \
         lower close_budget or safety_margin, or raise grace_period"
    );

    let e = err(Drain::builder()
        .grace_period(Duration::from_secs(5))
        .close_budget(Duration::from_secs(4))
        .safety_margin(Duration::from_secs(1)));
    assert!(
        e.to_string()
            .contains("close_budget (4s) + safety_margin (1s)"),
        "{e}"
    );

    let e = err(Drain::builder().propagation(
        Propagation::quiet(Duration::from_secs(1))
            .min(Duration::from_secs(10))
            .max(Duration::from_secs(5)),
    ));
    assert!(e.is_propagation());
    assert!(e.to_string().contains("min (10s) is above max (5s)"), "{e}");

    let e = err(Drain::builder()
        .grace_period(Duration::from_secs(30))
        .propagation(Propagation::quiet(Duration::from_secs(1)).max(Duration::from_secs(25))));
    assert!(e.is_propagation());
    assert!(
        e.to_string()
            .contains("max (25s) is past the quiesce deadline (24s"),
        "{e}"
    );

    let e = err(Drain::builder().propagation(Propagation::fixed(Duration::from_secs(60))));
    assert!(
        e.to_string().contains("fixed propagation delay (60s)"),
        "{e}"
    );

    let e = err(Drain::builder().propagation(Propagation::quiet(Duration::ZERO)));
    assert!(e.to_string().contains("quiet window is zero"), "{e}");

    // The evidence settings: checked, and refused where they cannot apply.
    let e = err(Drain::builder().propagation(
        Propagation::default()
            .max(Duration::from_secs(5))
            .quiet_suffices_after(Duration::from_secs(6)),
    ));
    assert!(e.is_propagation());
    assert!(
        e.to_string()
            .contains("quiet_suffices_after (6s) is above max (5s)"),
        "{e}"
    );
    for bad in [0.0, 1.0, -0.5, f64::NAN] {
        let e = err(Drain::builder().propagation(Propagation::default().miss_probability(bad)));
        assert!(e.to_string().contains("miss_probability"), "{bad}: {e}");
    }
    let e = err(Drain::builder().propagation(
        Propagation::fixed(Duration::from_secs(1)).quiet_suffices_after(Duration::ZERO),
    ));
    assert!(
        e.to_string()
            .contains("quiet_suffices_after does not apply to Propagation::fixed"),
        "{e}"
    );
    for (setting, p) in [
        (
            "min",
            Propagation::fixed(Duration::from_secs(1)).min(Duration::from_secs(5)),
        ),
        (
            "max",
            Propagation::fixed(Duration::from_secs(1)).max(Duration::from_secs(5)),
        ),
    ] {
        let e = err(Drain::builder().propagation(p));
        assert!(
            e.to_string()
                .contains(&format!("{setting} does not apply to Propagation::fixed")),
            "{e}"
        );
    }

    let e = err(Drain::builder().hurry_lead(Duration::from_secs(100)));
    assert!(e.to_string().contains("hurry_lead (100s)"), "{e}");

    for bad in ["ingress", "10.0.0.0/33", "10.0.0.256"] {
        let e = err(Drain::builder()
            .propagation(Propagation::default().per_request_peers(["10.0.0.1", bad])));
        assert!(e.is_propagation(), "{bad}: {e}");
        assert!(
            e.to_string().starts_with("per_request_peers:") && e.to_string().contains(bad),
            "{e}"
        );
    }
    let e = err(Drain::builder()
        .propagation(Propagation::fixed(Duration::from_secs(1)).per_request_peers(["10.0.0.1"])));
    assert!(
        e.to_string()
            .contains("per_request_peers does not apply to Propagation::fixed"),
        "{e}"
    );
}

#[test]
fn unparsable_durations_are_errors_not_panics() {
    for bad in ["", "abc", "10x", "-5s", "99999999999999999999999s", "1.5s"] {
        let e = lameduck::parse_duration(bad).unwrap_err();
        assert!(e.is_parse(), "{bad}: {e}");
        assert!(e.to_string().contains("is not a duration"), "{bad}: {e}");
    }
}

/// The environment is process-wide, so this test runs in a child process of its own.
#[test]
fn grace_period_from_the_environment() {
    if std::env::var_os("LAMEDUCK_ENV_CHILD").is_some() {
        let v = std::env::var("LAMEDUCK_GRACE_PERIOD").unwrap();
        match Drain::builder().build() {
            Ok(d) => println!("GRACE={}", d.moments().budget().grace_period.as_millis()),
            Err(e) => println!("ERR={} env={}", e, e.is_env()),
        }
        let _ = v;
        return;
    }
    let run = |value: &str| {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "grace_period_from_the_environment",
                "--nocapture",
                "-q",
            ])
            .env("LAMEDUCK_ENV_CHILD", "1")
            .env("LAMEDUCK_GRACE_PERIOD", value)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    assert!(run("45").contains("GRACE=45000"));
    assert!(run("1500ms").contains("GRACE=1500"));
    assert!(run("2m").contains("GRACE=120000"));
    let bad = run("soon");
    assert!(
        bad.contains("ERR=LAMEDUCK_GRACE_PERIOD=\"soon\" is not a duration")
            && bad.contains("env=true"),
        "{bad}"
    );
    // Accepted once, this overflowed `Instant + Duration` at the trigger.
    let huge = run("18446744073709551615");
    assert!(
        huge.contains(
            "ERR=LAMEDUCK_GRACE_PERIOD (18446744073709551615s) is above the maximum of 86400s"
        ),
        "{huge}"
    );
    for short in ["1ms", "30ms"] {
        let out = run(short);
        assert!(
            out.contains(&format!("ERR=LAMEDUCK_GRACE_PERIOD ({short}) is below 1s")),
            "{out}"
        );
    }
}

#[test]
fn grace_periods_kubernetes_cannot_mean_are_refused_by_the_builder() {
    let e = err(Drain::builder().grace_period(Duration::from_secs(u64::MAX)));
    assert!(e.is_budget(), "{e}");
    assert!(
        e.to_string().contains("above the maximum of 86400s (24h)"),
        "{e}"
    );
    for short in [ms(1), ms(30)] {
        let e = err(Drain::builder().grace_period(short));
        assert!(e.is_budget(), "{e}");
        assert!(e.to_string().contains("is below 1s"), "{e}");
    }
    // What is reserved after the propagation window is named with its numbers.
    let e = err(quiet_builder()
        .grace_period(Duration::from_secs(3))
        .safety_margin(Duration::from_secs(1))
        .close_budget(Duration::from_secs(1))
        .propagation(Propagation::fixed(Duration::from_secs(2))));
    assert!(
        e.to_string()
            .contains("fixed propagation delay (2s) is past the quiesce deadline (1s"),
        "{e}"
    );
    assert!(quiet_builder()
        .grace_period(Duration::from_secs(24 * 3600))
        .build()
        .is_ok());
}

/// The environment is process-wide, so this test runs in a child process of its own.
#[test]
fn stop_signal_from_the_environment() {
    if std::env::var_os("LAMEDUCK_ENV_CHILD").is_some() {
        match Drain::builder().build() {
            Ok(_) => println!("OK"),
            Err(e) => println!("ERR={} env={}", e, e.is_env()),
        }
        return;
    }
    let run = |value: &str| {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "stop_signal_from_the_environment",
                "--nocapture",
                "-q",
            ])
            .env("LAMEDUCK_ENV_CHILD", "1")
            .env("LAMEDUCK_STOP_SIGNAL", value)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    for good in ["SIGQUIT", "quit", "SIGTERM", "SigInt", ""] {
        assert!(run(good).contains("OK"), "{good}");
    }
    let bad = run("SIGHUP");
    assert!(
        bad.contains(
            "ERR=LAMEDUCK_STOP_SIGNAL=\"SIGHUP\": `SIGHUP` is not a supported stop signal: \
             use SIGTERM, SIGINT or SIGQUIT env=true"
        ),
        "{bad}"
    );
}

// ---------- the quiet window ----------
//
// These drive the quiet-window mechanics with `Drain::enter` alone, which gives no connection
// data: without a floor the policy would wait to max (tested in `tests/evidence.rs`). A zero
// floor says "the proxies have converged", leaving only `min`, `quiet` and in-flight work.

/// The `stopped_accepting` event, once the drain has committed.
async fn stopped_accepting(drain: &Drain) -> lameduck::Event {
    drain.moments().reached(Phase::StoppedAccepting).await;
    drain
        .moments()
        .timeline()
        .into_iter()
        .find(|e| e.event == EventKind::StoppedAccepting)
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn quiet_window_waits_while_activity_continues() {
    let drain = quiet_builder()
        .grace_period(Duration::from_secs(30))
        .propagation(
            Propagation::quiet(Duration::from_secs(2))
                .min(Duration::from_secs(1))
                .max(Duration::from_secs(20))
                .quiet_suffices_after(Duration::ZERO),
        )
        .build()
        .unwrap();
    drain.start(Trigger::Api);
    // A request every second for 6 s: each one is activity.
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(drain.phase(), Phase::Draining);
        drop(drain.enter());
    }
    // Last activity at 6 s: commit at 8 s, not before.
    tokio::time::sleep(ms(1900)).await;
    assert_eq!(drain.phase(), Phase::Draining);
    let e = stopped_accepting(&drain).await;
    assert_eq!(e.reason, Some(CommitReason::Quiet));
    assert_eq!(e.at_ms, 8000);
}

#[tokio::test(start_paused = true)]
async fn quiet_window_respects_min() {
    let drain = quiet_builder()
        .propagation(
            Propagation::quiet(ms(500))
                .min(Duration::from_secs(3))
                .max(Duration::from_secs(10))
                .quiet_suffices_after(Duration::ZERO),
        )
        .build()
        .unwrap();
    drain.start(Trigger::Api);
    let report = drain.drained().await;
    common::assert_figures_fit(&report);
    let e = report.event(EventKind::StoppedAccepting).unwrap();
    assert_eq!(e.reason, Some(CommitReason::Quiet));
    assert_eq!(e.at_ms, 3000);
}

#[tokio::test(start_paused = true)]
async fn quiet_window_commits_at_max_under_endless_activity() {
    let drain = quiet_builder()
        .grace_period(Duration::from_secs(30))
        .propagation(
            Propagation::quiet(Duration::from_secs(2))
                .min(Duration::from_secs(1))
                .max(Duration::from_secs(5)),
        )
        .build()
        .unwrap();
    drain.start(Trigger::Api);
    let d = drain.clone();
    let load = tokio::spawn(async move {
        // Bounded: 100 requests, one every 500 ms (50 s at most, paused time).
        for _ in 0..100 {
            if d.phase() >= Phase::StoppedAccepting {
                break;
            }
            drop(d.enter());
            tokio::time::sleep(ms(500)).await;
        }
    });
    let e = stopped_accepting(&drain).await;
    load.await.unwrap();
    assert_eq!(e.reason, Some(CommitReason::Max));
    assert_eq!(e.at_ms, 5000);
}

#[tokio::test(start_paused = true)]
async fn quiet_window_waits_for_in_flight_work() {
    let drain = quiet_builder()
        .propagation(
            Propagation::quiet(Duration::from_secs(1))
                .min(Duration::from_secs(1))
                .max(Duration::from_secs(10))
                .quiet_suffices_after(Duration::ZERO),
        )
        .build()
        .unwrap();
    let guard = drain.enter(); // entered before the drain: not activity
    drain.start(Trigger::Api);
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        drain.phase(),
        Phase::Draining,
        "quiet, but a request is in flight"
    );
    drop(guard);
    let e = stopped_accepting(&drain).await;
    assert_eq!(e.reason, Some(CommitReason::Quiet));
    assert_eq!(e.at_ms, 4000);
    // The report says the guard, not the silence, set the time: the window held at 1 s.
    let report = drain.drained().await;
    common::assert_figures_fit(&report);
    let hold = report
        .propagation
        .evidence
        .as_ref()
        .and_then(|e| e.in_flight_hold.as_ref())
        .expect("the in-flight hold");
    assert_eq!(
        (hold.since_ms, hold.waited_ms, hold.in_flight),
        (1000, 3000, 1)
    );
    assert_eq!(hold.work[0].name, "(undescribed guard)");
    assert_eq!(hold.work[0].age_ms, 1000);
}

#[tokio::test(start_paused = true)]
async fn default_policy_fits_short_grace_periods() {
    // 4 s grace: margin 133 ms, close 666 ms, max = 2 s, min and quiet shrink to fit.
    let drain = quiet_builder()
        .grace_period(Duration::from_secs(4))
        .build()
        .unwrap();
    drain.start(Trigger::Api);
    let report = drain.drained().await;
    common::assert_figures_fit(&report);
    assert!(report.event(EventKind::StoppedAccepting).unwrap().at_ms <= 2000);
    assert_eq!(report.exit_code, 0);
}

// ---------- in-flight guards ----------

#[tokio::test(start_paused = true)]
async fn in_flight_zero_waits_for_the_last_guard() {
    let drain = quiet_builder()
        .propagation(Propagation::fixed(ms(100)))
        .build()
        .unwrap();
    let guard = drain.enter();
    assert_eq!(drain.counts().in_flight(), 1);
    drain.start(Trigger::Api);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(drain.phase(), Phase::StoppedAccepting);
    drop(guard);
    let report = drain.drained().await;
    common::assert_figures_fit(&report);
    assert_eq!(report.event(EventKind::InFlightZero).unwrap().at_ms, 2000);
    assert_eq!(drain.counts().in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_panic_releases_the_guard() {
    let drain = quiet_builder().build().unwrap();
    let d = drain.clone();
    let r = tokio::spawn(async move {
        let _guard = d.enter();
        panic!("handler bug");
    })
    .await;
    assert!(r.unwrap_err().is_panic());
    assert_eq!(drain.counts().in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn dropping_an_unfinished_future_releases_the_guard() {
    let drain = quiet_builder()
        .propagation(Propagation::fixed(ms(10)))
        .build()
        .unwrap();
    let d = drain.clone();
    let fut = async move {
        let _guard = d.enter();
        std::future::pending::<()>().await;
    };
    let timed_out = tokio::time::timeout(Duration::from_secs(1), fut).await;
    assert!(timed_out.is_err());
    assert_eq!(drain.counts().in_flight(), 0);
    drain.start(Trigger::Api);
    assert_eq!(drain.drained().await.exit_code, 0);
}

#[tokio::test(start_paused = true)]
async fn force_skips_the_waits_and_reports_forced() {
    let drain = quiet_builder().build().unwrap();
    let _stuck = drain.enter();
    drain.work().spawn("flush", std::future::pending::<()>());
    drain.start(Trigger::Sigint);
    tokio::time::sleep(ms(100)).await;
    assert!(drain.force());
    assert!(!drain.force());
    let report = drain.drained().await;
    common::assert_figures_fit(&report);
    assert_eq!(report.outcome, lameduck::report::Outcome::Forced);
    assert_eq!(report.exit_code, 1);
    assert!(report.budget.used_ms < 1000);
    // What the force cut is named, as at the deadline: the request and the task.
    use lameduck::report::StragglerKind;
    let kinds: Vec<_> = report.stragglers.iter().map(|s| s.kind).collect();
    assert!(
        kinds.contains(&StragglerKind::Request),
        "{:?}",
        report.stragglers
    );
    assert!(
        report
            .stragglers
            .iter()
            .any(|s| s.kind == StragglerKind::Task && s.name == "flush"),
        "{:?}",
        report.stragglers
    );
}

// ---------- readiness while draining is a policy ----------

/// Samples readiness in every phase of a drain with a 1 s fixed propagation and one request
/// that ends 2 s after the trigger; the report names the policy.
async fn readiness_through_a_drain(
    policy: ReadinessWhileDraining,
) -> (Vec<(Phase, bool)>, lameduck::DrainReport) {
    let drain = quiet_builder()
        .readiness_while_draining(policy)
        .propagation(Propagation::fixed(Duration::from_secs(1)))
        .build()
        .unwrap();
    drain.readiness().mark_serving();
    let mut seen = vec![(drain.phase(), drain.readiness().is_ready())];
    let guard = drain.enter();
    drain.start(Trigger::Sigterm);
    seen.push((drain.phase(), drain.readiness().is_ready()));
    assert!(drain
        .readiness()
        .answer()
        .checks
        .iter()
        .any(|c| c.contains(policy.as_str())));
    tokio::time::sleep(ms(1500)).await;
    seen.push((drain.phase(), drain.readiness().is_ready()));
    drop(guard);
    let report = drain.drained().await;
    common::assert_figures_fit(&report);
    seen.push((drain.phase(), drain.readiness().is_ready()));
    assert_eq!(report.readiness_policy, policy);
    (seen, report)
}

#[tokio::test(start_paused = true)]
async fn not_ready_policy_flips_readiness_at_the_trigger() {
    let (seen, report) = readiness_through_a_drain(ReadinessWhileDraining::NotReady).await;
    assert_eq!(
        seen,
        [
            (Phase::Serving, true),
            (Phase::Draining, false),
            (Phase::StoppedAccepting, false),
            (Phase::Done, false)
        ]
    );
    assert_eq!(report.event(EventKind::ReadinessFlipped).unwrap().at_ms, 0);
}

#[tokio::test(start_paused = true)]
async fn serving_until_stop_policy_keeps_readiness_until_stopped_accepting() {
    let (seen, report) = readiness_through_a_drain(ReadinessWhileDraining::ServingUntilStop).await;
    assert_eq!(
        seen,
        [
            (Phase::Serving, true),
            (Phase::Draining, true),
            (Phase::StoppedAccepting, false),
            (Phase::Done, false)
        ]
    );
    assert_eq!(
        report.event(EventKind::ReadinessFlipped).unwrap().at_ms,
        1000
    );
    assert!(report
        .to_json()
        .contains("\"readiness_policy\":\"serving_until_stop\""));
}

// ---------- bounded state ----------

#[tokio::test(start_paused = true)]
async fn repeated_triggers_collapse_and_nothing_is_appended_after_done() {
    let drain = quiet_builder()
        .propagation(Propagation::fixed(ms(100)))
        .build()
        .unwrap();
    drain.readiness().mark_serving();
    let triggers = [
        Trigger::Api,
        Trigger::PreStop,
        Trigger::Sigterm,
        Trigger::Sigint,
    ];
    for i in 0..50_000 {
        drain.start(triggers[i % triggers.len()]);
    }
    let tl = drain.moments().timeline();
    let received: Vec<_> = tl
        .iter()
        .filter(|e| e.event == EventKind::SignalReceived)
        .collect();
    assert_eq!(
        received.len(),
        4,
        "one event per trigger kind: {received:?}"
    );
    let total: u64 = received.iter().map(|e| e.count.unwrap_or(1)).sum();
    assert_eq!(total, 49_999);
    // Each keeps the time of its first arrival.
    assert!(received.iter().all(|e| e.at_ms == 0));

    let report = drain.drained().await;
    common::assert_figures_fit(&report);
    let done = drain.moments().timeline();
    for _ in 0..1_000 {
        drain.start(Trigger::PreStop);
        drain.start(Trigger::Sigquit);
    }
    assert_eq!(drain.moments().timeline(), done, "appended after Done");
    assert_eq!(report.timeline, done);
    assert_eq!(report.timeline.last().unwrap().event, EventKind::Done);
}

#[tokio::test(start_paused = true)]
async fn the_status_timeline_is_capped_with_a_count_of_what_was_left_out() {
    let drain = quiet_builder()
        .propagation(Propagation::fixed(ms(100)))
        .build()
        .unwrap();
    // Closers are the one thing that adds events per registration.
    for i in 0..200 {
        drain
            .work()
            .on_close(format!("c{i}"), || async { Ok::<_, std::io::Error>(()) });
    }
    drain.start(Trigger::Api);
    let report = drain.drained().await;
    common::assert_figures_fit(&report);
    let full = report.timeline.len();
    assert!(full > lameduck::STATUS_TIMELINE_LIMIT);
    let status = drain.status();
    assert_eq!(status.timeline.len(), lameduck::STATUS_TIMELINE_LIMIT);
    assert_eq!(
        status.timeline_omitted,
        full - lameduck::STATUS_TIMELINE_LIMIT
    );
    // Both ends survive: the start and the end of the drain.
    assert_eq!(status.timeline[0].event, EventKind::DrainStarted);
    assert_eq!(status.timeline.last().unwrap().event, EventKind::Done);
}

/// 10 000 admin calls (`/drain` and `/status`, no token) over real HTTP on keep-alive
/// connections: the timeline and the bodies stay the same size.
#[cfg(feature = "admin")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_floods_keep_the_timeline_and_bodies_bounded() {
    use http_body_util::{BodyExt, Empty};

    let drain = quiet_builder()
        .grace_period(Duration::from_secs(60))
        .propagation(Propagation::fixed(Duration::from_secs(40)))
        .build()
        .unwrap();
    drain.readiness().mark_serving();
    let (listener, addr) = common::bind().await;
    let router = AdminBuilder::new(&drain).without_token().router();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });

    // 10 000 over HTTP (the 50 000-trigger case runs in-process above); enough to show no
    // growth, short enough for a shared CI machine.
    const CALLS: usize = 10_000;
    const CONNS: usize = 4;
    let mut clients = Vec::new();
    for c in 0..CONNS {
        clients.push(tokio::spawn(async move {
            let (mut tx, _conn) = common::h1(addr).await;
            let mut largest = 0;
            for i in 0..CALLS / CONNS {
                let path = if (i + c) % 2 == 0 {
                    "/drain?wait=none"
                } else {
                    "/status"
                };
                let req = http::Request::builder()
                    .method(if path == "/status" { "GET" } else { "POST" })
                    .uri(path)
                    .header("host", "admin")
                    .body(Empty::new())
                    .unwrap();
                let resp = tx.send_request(req).await.unwrap();
                assert!(resp.status().is_success(), "{path}: {}", resp.status());
                let body = resp.into_body().collect().await.unwrap().to_bytes();
                largest = largest.max(body.len());
            }
            largest
        }));
    }
    let mut largest = 0;
    for c in clients {
        let l = tokio::time::timeout(Duration::from_secs(240), c)
            .await
            .expect("the flood finished")
            .unwrap();
        largest = largest.max(l);
    }
    let tl = drain.moments().timeline();
    assert!(tl.len() <= 4, "{tl:?}");
    let received = tl
        .iter()
        .find(|e| e.event == EventKind::SignalReceived)
        .expect("repeated /drain calls are counted");
    assert_eq!(received.count, Some((CALLS / 2 - 1) as u64));
    // A status body with a handful of events: a few hundred bytes, never growing with calls.
    assert!(largest < 4096, "largest body {largest} bytes");
    drain.force();
}

/// SIGTERM while the process is still starting (a startup gate never opened): it was never
/// ready, so no proxy routed here and there is no propagation to wait for.
#[tokio::test(start_paused = true)]
async fn a_drain_before_the_process_ever_served_stops_accepting_at_once() {
    let drain = quiet_builder()
        .grace_period(Duration::from_secs(30))
        .propagation(Propagation::quiet(ms(1000)).max(Duration::from_secs(15)))
        .build()
        .unwrap();
    let _warm_up = drain.readiness().startup_gate("warm-up");
    drain.readiness().mark_serving();
    assert_eq!(drain.phase(), Phase::Starting);
    let t0 = Instant::now();
    assert!(drain.start(Trigger::Sigterm));
    let report = drain.drained().await;
    common::assert_figures_fit(&report);
    assert!(t0.elapsed() < ms(100), "{:?}", t0.elapsed());
    let stop = report
        .timeline
        .iter()
        .find(|e| e.event == EventKind::StoppedAccepting)
        .unwrap();
    assert_eq!(stop.reason, Some(CommitReason::NeverServed), "{stop:?}");
    assert_eq!(stop.at_ms, 0);
    let says: Vec<&str> = report.advice.iter().map(|a| a.message.as_str()).collect();
    assert!(
        says.iter().all(|m| !m.contains("served for only")),
        "{says:?}"
    );
    let rule = report
        .advice
        .iter()
        .find(|a| a.rule.as_str() == "never_served")
        .unwrap_or_else(|| panic!("{says:?}"));
    assert!(rule.message.contains("never ready"), "{}", rule.message);
}

/// `/status` gives both readiness answers: under `Auto` (the default), while draining, callers
/// other than kubelet see "not ready" and kubelet's probe still "ready" until accepting stops.
#[tokio::test(start_paused = true)]
async fn status_shows_both_readiness_answers_under_auto() {
    let drain = quiet_builder()
        .grace_period(Duration::from_secs(10))
        .propagation(Propagation::fixed(ms(500)))
        .build()
        .unwrap();
    drain.readiness().mark_serving();
    let s = drain.status();
    assert!(s.ready && s.ready_for_kubelet);
    assert!(drain.start(Trigger::Api));
    let s = drain.status();
    assert_eq!(s.readiness_policy, ReadinessWhileDraining::Auto);
    assert!(!s.ready && s.ready_for_kubelet, "{s:?}");
    let json = serde_json::to_value(&s).unwrap();
    assert_eq!(
        (json["ready"].clone(), json["ready_for_kubelet"].clone()),
        (false.into(), true.into())
    );
    drain.moments().reached(Phase::StoppedAccepting).await;
    let s = drain.status();
    assert!(!s.ready && !s.ready_for_kubelet, "{s:?}");
}

#[tokio::test(start_paused = true)]
async fn a_force_while_closing_aborts_the_closer_running_and_skips_the_rest() {
    let drain = quiet_builder()
        .propagation(Propagation::fixed(ms(100)))
        .build()
        .unwrap();
    drain
        .work()
        .on_close("db-pool", || async { Ok::<(), std::io::Error>(()) });
    let (closing_tx, closing_rx) = tokio::sync::oneshot::channel();
    drain.work().on_close("exporter", move || async move {
        let _ = closing_tx.send(());
        std::future::pending::<Result<(), std::io::Error>>().await
    });
    drain.start(Trigger::Sigint);
    // Synchronisation point: the exporter's closer is running.
    closing_rx.await.unwrap();
    assert!(drain.force());
    let report = drain.drained().await;
    common::assert_figures_fit(&report);
    assert_eq!(report.outcome, lameduck::report::Outcome::Forced);
    let closers: Vec<_> = report
        .closers
        .iter()
        .map(|c| (c.name.as_str(), c.result.to_string()))
        .collect();
    assert_eq!(
        closers,
        [
            ("exporter", "aborted".to_owned()),
            ("db-pool", "skipped".to_owned())
        ]
    );
}

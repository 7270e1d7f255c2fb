//! The drain tells its story through `tracing`: one span, one INFO event per lifecycle event,
//! with structured fields.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::quiet_builder;
use lameduck::{Propagation, Trigger};
use tracing::field::{Field, Visit};
use tracing::{Level, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

#[derive(Clone, Debug)]
struct Captured {
    level: Level,
    target: String,
    fields: BTreeMap<String, String>,
    spans: Vec<String>,
}

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<Captured>>>);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_owned(), value.to_string());
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_event(&self, event: &tracing::Event<'_>, ctx: Context<'_, S>) {
        let mut fields = BTreeMap::new();
        event.record(&mut Fields(&mut fields));
        let spans = ctx
            .event_scope(event)
            .map(|s| s.from_root().map(|span| span.name().to_owned()).collect())
            .unwrap_or_default();
        self.0.lock().unwrap().push(Captured {
            level: *event.metadata().level(),
            target: event.metadata().target().to_owned(),
            fields,
            spans,
        });
    }
}

#[tokio::test(start_paused = true)]
async fn a_drain_is_a_handful_of_info_events_with_fields() {
    let capture = Capture::default();
    let subscriber = tracing_subscriber::registry().with(capture.clone());
    let _default = tracing::subscriber::set_default(subscriber);

    let drain = quiet_builder()
        .propagation(Propagation::fixed(Duration::from_millis(300)))
        .build()
        .unwrap();
    drain
        .work()
        .on_close("db", || async { Ok::<_, std::io::Error>(()) });
    let guard = drain.enter();
    drain.start(Trigger::Sigterm);
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop(guard);
    drain.drained().await;

    let events = capture.0.lock().unwrap().clone();
    let info: Vec<&Captured> = events
        .iter()
        .filter(|e| e.level == Level::INFO && e.target.starts_with("lameduck"))
        .collect();
    let names: Vec<&str> = info
        .iter()
        .filter_map(|e| e.fields.get("event").map(String::as_str))
        .collect();
    assert_eq!(
        names,
        [
            "drain_started",
            "readiness_flipped",
            "propagation_done",
            "stopped_accepting",
            "readiness_flipped", // kubelet's view, under the default policy (auto)
            "tasks_done",        // no task: done at once; the request ends 200 ms later
            "in_flight_zero",
            "resource_closed",
            "done"
        ]
    );
    // A production log at INFO: the events above plus the report line, nothing per request.
    assert!(info.len() <= 10, "{} INFO events", info.len());
    let event = |name: &str| {
        *info
            .iter()
            .find(|e| e.fields["event"] == name)
            .unwrap_or_else(|| panic!("no {name} event"))
    };
    let started = event("drain_started");
    assert_eq!(started.fields["trigger"], "sigterm");
    assert_eq!(started.fields["in_flight"], "1");
    let stopped = event("stopped_accepting");
    assert_eq!(stopped.fields["reason"], "fixed");
    assert_eq!(stopped.fields["at_ms"], "300");
    assert_eq!(stopped.fields["in_flight"], "1");
    assert_eq!(stopped.spans, ["lameduck_drain"]);
    let propagated = event("propagation_done");
    assert!(
        propagated.fields["detail"].starts_with("fixed:"),
        "the evidence rides on the event: {:?}",
        propagated.fields
    );
    let zero = event("in_flight_zero");
    assert_eq!(zero.fields["at_ms"], "500");
    let closed = event("resource_closed");
    assert_eq!(closed.fields["name"], "db");
    let report = events
        .iter()
        .find(|e| e.target == "lameduck::report")
        .expect("the report is a tracing event");
    assert_eq!(report.fields["outcome"], "clean");
    assert!(report.fields["report"].contains("\"trigger\":\"sigterm\""));
}

//! One request through an axum `Router`, in-process (no sockets): bare, with `drain.layer()`,
//! and with each anchor middleware. The response body is consumed in every variant, so the body
//! wrappers are measured too.
//!
//! Run with `cargo bench --bench layer` (about 30 s). The variants are described in
//! `benches/support/variants.rs`; BENCHMARKS.md has the figures.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};

#[path = "support/variants.rs"]
mod variants;

use variants::{app, drain, Variant};

fn layer(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // The tokio-graceful coordinator spawns its signal task when built; nothing is polled by
    // the runtime while measuring (every future completes on its first poll).
    let _ctx = rt.enter();
    let drain = drain();
    let mut group = c.benchmark_group("request");
    for variant in Variant::ALL {
        let app = app(variant, &drain);
        assert_eq!(app.one_request(), 5, "{}: wrong body", variant.name());
        group.bench_function(variant.name(), |b| b.iter(|| app.one_request()));
    }
    group.finish();
    assert_eq!(drain.counts().in_flight(), 0, "every guard was released");
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = layer
}
criterion_main!(benches);

//! Run with `cargo run --release --example bench_requests -- <variant> <n>`.
//!
//! Runs `n` in-process requests through the hello-world router of one variant (see
//! `benches/support/variants.rs`), or `n` guard acquire/release pairs for a `guard-*` variant,
//! and prints nothing else of interest: it is the workload `benches/callgrind.sh` runs under
//! `valgrind --tool=callgrind` at two values of `n`, so that setup cost cancels out of
//! `(instructions(n2) − instructions(n1)) / (n2 − n1)`.
//!
//! Variants: plain, lameduck, lameduck-outer, atomic-outer, atomic, from_fn, tasktracker, semaphore,
//! graceful, inflight; guard-lameduck, guard-atomic, guard-tasktracker, guard-semaphore,
//! guard-graceful.

use std::hint::black_box;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

#[path = "../benches/support/variants.rs"]
mod variants;

use variants::{app, drain, Variant};

const GUARDS: [&str; 5] = [
    "guard-lameduck",
    "guard-atomic",
    "guard-tasktracker",
    "guard-semaphore",
    "guard-graceful",
];

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let (Some(variant), Some(n)) = (args.next(), args.next().and_then(|n| n.parse::<u64>().ok()))
    else {
        eprintln!(
            "usage: bench_requests <variant> <n>\n  variants: {}, {}",
            Variant::names(),
            GUARDS.join(", ")
        );
        return ExitCode::from(2);
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // Context only (tokio-graceful spawns its signal task when built); nothing is scheduled
    // while the loop runs.
    let _ctx = rt.enter();
    let drain = drain();

    if let Some(v) = Variant::parse(&variant) {
        let app = app(v, &drain);
        let mut bytes = 0;
        for _ in 0..n {
            bytes += app.one_request();
        }
        assert_eq!(bytes as u64, 5 * n);
    } else {
        match variant.as_str() {
            "guard-lameduck" => (0..n).for_each(|_| drop(black_box(drain.enter()))),
            "guard-atomic" => {
                let c = Arc::new(AtomicUsize::new(0));
                for _ in 0..n {
                    black_box(&c).fetch_add(1, Ordering::Relaxed);
                    black_box(&c).fetch_sub(1, Ordering::Release);
                }
            }
            "guard-tasktracker" => {
                let t = tokio_util::task::TaskTracker::new();
                (0..n).for_each(|_| drop(black_box(t.token())));
            }
            "guard-semaphore" => {
                let s = tokio::sync::Semaphore::new(tokio::sync::Semaphore::MAX_PERMITS);
                (0..n).for_each(|_| drop(black_box(s.try_acquire().unwrap())));
            }
            "guard-graceful" => {
                let s = tokio_graceful::Shutdown::new(std::future::pending::<()>());
                (0..n).for_each(|_| drop(black_box(s.guard())));
            }
            other => {
                eprintln!("unknown variant {other:?}");
                return ExitCode::from(2);
            }
        }
    }
    assert_eq!(drain.in_flight(), 0);
    println!("{variant} {n}");
    ExitCode::SUCCESS
}

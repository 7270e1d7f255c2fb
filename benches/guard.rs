//! Acquire + release one in-flight guard: lameduck's `drain.enter()` and drop, against a bare
//! atomic increment/decrement (the floor) and the guards of other crates. Single-threaded, and
//! with two threads contending on the same counter.
//!
//! Run with `cargo bench --bench guard` (about 30 s). BENCHMARKS.md has the figures.

use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion};
use lameduck::{Drain, Propagation, Signals};
use tokio::sync::Semaphore;
use tokio_util::task::TaskTracker;

/// The guards under test, all built once and shared by both groups.
struct Subjects {
    drain: Drain,
    atomic: Arc<AtomicUsize>,
    tracker: TaskTracker,
    semaphore: Semaphore,
    graceful: tokio_graceful::Shutdown,
}

/// The floor: `fetch_add` on the way in, `fetch_sub` in `Drop`, with the orderings of lameduck's
/// counter and nothing else. Shaped like a guard (taken, passed through `black_box`, dropped) so
/// that it is measured exactly as the guards it is compared with.
struct AtomicGuard<'a>(&'a AtomicUsize);

impl<'a> AtomicGuard<'a> {
    #[inline]
    fn new(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Self(count)
    }
}

impl Drop for AtomicGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Release);
    }
}

#[derive(Clone, Copy)]
enum Mode {
    OneThread,
    TwoThreads,
}

/// Runs every subject in one group. The closures are generic parameters, not trait objects, so
/// each is inlined into its own measuring loop: no indirect call skews the nanosecond figures.
fn group(c: &mut Criterion, s: &Subjects, mode: Mode) {
    let title = match mode {
        Mode::OneThread => "guard/1-thread",
        Mode::TwoThreads => "guard/2-threads",
    };
    let mut g = c.benchmark_group(title);
    bench(&mut g, mode, "lameduck", || {
        drop(black_box(s.drain.enter()))
    });
    let atomic: &AtomicUsize = &s.atomic;
    bench(&mut g, mode, "atomic", || {
        drop(black_box(AtomicGuard::new(atomic)))
    });
    bench(&mut g, mode, "tasktracker", || {
        drop(black_box(s.tracker.token()))
    });
    bench(&mut g, mode, "semaphore", || {
        drop(black_box(s.semaphore.try_acquire().unwrap()))
    });
    bench(&mut g, mode, "graceful", || {
        drop(black_box(s.graceful.guard()))
    });
    g.finish();
}

fn bench<F: Fn() + Sync>(g: &mut BenchmarkGroup<'_, WallTime>, mode: Mode, name: &str, op: F) {
    match mode {
        Mode::OneThread => g.bench_function(name, |b| b.iter(&op)),
        Mode::TwoThreads => g.bench_function(name, |b| b.iter_custom(|n| contended(n, &op))),
    };
}

/// Two threads each run `op` `iters` times on the same subject; the time is the wall time of
/// the pair, so the figure is "per operation, per thread, while the other thread does the same".
fn contended<F: Fn() + Sync>(iters: u64, op: &F) -> Duration {
    let barrier = Barrier::new(2);
    std::thread::scope(|s| {
        let other = s.spawn(|| {
            barrier.wait();
            for _ in 0..iters {
                op();
            }
        });
        barrier.wait();
        let start = Instant::now();
        for _ in 0..iters {
            op();
        }
        other.join().unwrap();
        start.elapsed()
    })
}

fn guards(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // tokio-graceful spawns its signal task when built; the guards themselves need no runtime.
    let _ctx = rt.enter();
    let drain = Drain::builder()
        .propagation(Propagation::fixed(Duration::from_secs(1)))
        .signals(Signals::none())
        .report_to_stderr(false)
        .termination_log(None)
        .build()
        .unwrap();
    drain.readiness().mark_serving();
    let subjects = Subjects {
        drain,
        atomic: Arc::new(AtomicUsize::new(0)),
        tracker: TaskTracker::new(),
        semaphore: Semaphore::new(Semaphore::MAX_PERMITS),
        graceful: tokio_graceful::Shutdown::new(std::future::pending::<()>()),
    };

    group(c, &subjects, Mode::OneThread);
    group(c, &subjects, Mode::TwoThreads);
    assert_eq!(subjects.drain.counts().in_flight(), 0);
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = guards
}
criterion_main!(benches);

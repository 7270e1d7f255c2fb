//! `Drain::enter` and dropping the guard allocate nothing, while serving and while draining.

// A counting global allocator has to implement the unsafe `GlobalAlloc` trait.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lameduck::{Drain, Propagation, Signals, Trigger};

struct Counting;

static ALLOCS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Only the measuring thread counts: the test harness and the runtime's other threads
    /// allocate whenever they like, and their allocations are not the guard's.
    static MEASURING: Cell<bool> = const { Cell::new(false) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if MEASURING.try_with(Cell::get).unwrap_or(false) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations_for(n: usize, f: impl Fn()) -> usize {
    let before = ALLOCS.load(Ordering::Relaxed);
    MEASURING.with(|m| m.set(true));
    for _ in 0..n {
        f();
    }
    MEASURING.with(|m| m.set(false));
    ALLOCS.load(Ordering::Relaxed) - before
}

#[test]
fn enter_and_drop_allocate_nothing() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let drain = Drain::builder()
            .signals(Signals::none())
            .report_to_stderr(false)
            .termination_log(None)
            .propagation(Propagation::fixed(Duration::from_secs(5)))
            .build()
            .unwrap();
        drain.mark_started();
        // Sanity check that the counter sees allocations at all.
        assert!(allocations_for(10, || drop(std::hint::black_box(vec![1u8; 16]))) >= 10);

        let serving = allocations_for(10_000, || drop(std::hint::black_box(drain.enter())));
        assert_eq!(serving, 0, "allocations while serving");

        drain.start(Trigger::Api);
        let draining = allocations_for(10_000, || drop(std::hint::black_box(drain.enter())));
        assert_eq!(draining, 0, "allocations while draining");
    });
}

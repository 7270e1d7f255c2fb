//! Long-lived streams: [`StreamStop`] and the [`EndOnStop`] adapter.
//!
//! Server-sent events, WebSockets and watches never finish on their own, so waiting for
//! in-flight work to reach zero would wait until the quiesce deadline cuts them. They get their
//! own signal at `stopped_accepting` — after load balancers had their time to catch up, so the
//! client's reconnection lands on another replica — optionally spread over a window so that
//! thousands of clients do not reconnect in the same millisecond.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::WaitForCancellationFutureOwned;

use crate::drain::Drain;

/// Spread offsets come from one process-wide sequence (see `spread_fraction`).
static SPREAD_SEQ: AtomicU64 = AtomicU64::new(0);

/// The `n`-th point of the golden-ratio sequence in `[0, 1)`: deterministic, and any run of
/// consecutive callers — ten or ten thousand — lands evenly spread over the window, without a
/// random number generator.
fn spread_fraction(n: u64) -> f64 {
    const PHI_FRAC: f64 = 0.618_033_988_749_894_9;
    (n as f64 * PHI_FRAC).fract()
}

pin_project! {
    /// Resolves when a long-lived stream should end: at `stopped_accepting`, plus this
    /// stream's offset when [`spread`](Self::spread).
    ///
    /// Created by [`StreamStop::new`].
    ///
    /// # Cancel safety
    ///
    /// Dropping it before it resolves has no effect on the drain.
    #[must_use = "futures do nothing unless polled"]
    pub struct StreamStop {
        #[pin]
        state: StopState,
        offset: Duration,
        drain: Drain,
    }
}

pin_project! {
    #[project = StopStateProj]
    enum StopState {
        Waiting {
            #[pin]
            stopped: WaitForCancellationFutureOwned,
        },
        Delaying {
            #[pin]
            sleep: Sleep,
        },
        Fired,
    }
}

impl StreamStop {
    /// A future that resolves at `stopped_accepting`: end a long-lived stream now.
    ///
    /// Wrap a body or a `Stream` with [`StreamStop::wrap`] to end it cleanly at that moment;
    /// [`StreamStop::spread`] spreads the ends of many streams over a window.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use lameduck::{Drain, Propagation, Signals, Trigger};
    /// use lameduck::StreamStop;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let drain = Drain::builder()
    ///     .propagation(Propagation::fixed(Duration::from_secs(2)))
    ///     .signals(Signals::none())
    ///     .report_to_stderr(false)
    ///     .build()
    ///     .unwrap();
    /// let stop = lameduck::StreamStop::new(&drain);
    /// drain.start(Trigger::Api);
    /// stop.await; // two seconds later, at stopped_accepting
    /// assert!(drain.phase() >= lameduck::Phase::StoppedAccepting);
    /// # }
    /// ```
    pub fn new(drain: &Drain) -> Self {
        Self {
            state: StopState::Waiting {
                stopped: drain.moments().stopped_accepting().cancelled_owned(),
            },
            offset: Duration::ZERO,
            drain: drain.clone(),
        }
    }

    /// Resolves at `stopped_accepting` plus an offset in `[0, window)` instead, different for
    /// each call, so that streams end spread over the window. The offset is clamped to the quiesce deadline: a stream told to stop after it
    /// would be cut instead.
    ///
    /// Offsets follow a deterministic low-discrepancy sequence: however many streams are open,
    /// their ends are spread evenly over the window.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use lameduck::{Drain, Phase, Propagation, Signals, Trigger};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let drain = Drain::builder()
    ///     .propagation(Propagation::fixed(Duration::from_secs(1)))
    ///     .signals(Signals::none())
    ///     .report_to_stderr(false)
    ///     .build()
    ///     .unwrap();
    /// // One per stream; thousands of them end spread over 10 s instead of all at once.
    /// let stops: Vec<_> = (0..3).map(|_| lameduck::StreamStop::new(&drain).spread(Duration::from_secs(10))).collect();
    /// assert!(stops.iter().all(|s| s.offset() < Duration::from_secs(10)));
    /// drain.start(Trigger::Api);
    /// for stop in stops {
    ///     stop.await;
    ///     assert!(drain.phase() >= Phase::StoppedAccepting);
    /// }
    /// # }
    /// ```
    pub fn spread(mut self, window: Duration) -> Self {
        // Relaxed: any distinct sequence numbers will do.
        let n = SPREAD_SEQ.fetch_add(1, Ordering::Relaxed);
        self.offset = window.mul_f64(spread_fraction(n));
        self
    }

    /// This stream's offset after `stopped_accepting` (zero unless spread).
    pub fn offset(&self) -> Duration {
        self.offset
    }

    /// Wraps a response body or a `Stream` so that it ends cleanly — at a frame or item
    /// boundary, as if it had finished — when this signal fires.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(feature = "admin")] {
    /// use std::time::Duration;
    /// use axum::{body::Body, response::Response, routing::get, Router, extract::State};
    /// use lameduck::Drain;
    ///
    /// async fn events(State(drain): State<Drain>) -> Response {
    ///     let (tx, rx) = tokio::sync::mpsc::channel::<Result<String, std::io::Error>>(8);
    ///     tokio::spawn(async move {
    ///         for i in 0.. {
    ///             if tx.send(Ok(format!("data: {i}\n\n"))).await.is_err() {
    ///                 break; // the client left, or the stream was ended
    ///             }
    ///             tokio::time::sleep(Duration::from_secs(1)).await;
    ///         }
    ///     });
    ///     let stream = as_stream(rx); // any `futures_core::Stream` of events
    ///     let stream = lameduck::StreamStop::new(&drain).spread(Duration::from_secs(5)).wrap(stream);
    ///     Response::new(Body::from_stream(stream))
    /// }
    /// # fn as_stream<T>(rx: tokio::sync::mpsc::Receiver<T>) -> impl futures_core::Stream<Item = T> + Send + 'static
    /// # where T: Send + 'static {
    /// #     struct S<T>(tokio::sync::mpsc::Receiver<T>);
    /// #     impl<T> futures_core::Stream for S<T> {
    /// #         type Item = T;
    /// #         fn poll_next(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Option<T>> {
    /// #             self.0.poll_recv(cx)
    /// #         }
    /// #     }
    /// #     S(rx)
    /// # }
    ///
    /// let drain = Drain::builder().build().unwrap();
    /// let app: Router = Router::new().route("/events", get(events)).with_state(drain.clone());
    /// # let _: Router = app.layer(drain.layer());
    /// # }
    /// ```
    pub fn wrap<T>(self, inner: T) -> EndOnStop<T> {
        EndOnStop {
            inner,
            stop: self,
            ended: false,
        }
    }
}

impl Future for StreamStop {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            let this = self.as_mut().project();
            match this.state.project() {
                StopStateProj::Waiting { stopped } => {
                    ready!(stopped.poll(cx));
                    let offset = *this.offset;
                    if offset.is_zero() {
                        self.as_mut().project().state.set(StopState::Fired);
                        return Poll::Ready(());
                    }
                    let mut until = Instant::now() + offset;
                    if let Some(deadline) = this.drain.moments().quiesce_deadline() {
                        until = until.min(deadline);
                    }
                    self.as_mut().project().state.set(StopState::Delaying {
                        sleep: tokio::time::sleep_until(until),
                    });
                }
                StopStateProj::Delaying { sleep } => {
                    ready!(sleep.poll(cx));
                    self.as_mut().project().state.set(StopState::Fired);
                    return Poll::Ready(());
                }
                StopStateProj::Fired => return Poll::Ready(()),
            }
        }
    }
}

impl fmt::Debug for StreamStop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            StopState::Waiting { .. } => "waiting",
            StopState::Delaying { .. } => "delaying",
            StopState::Fired => "fired",
        };
        f.debug_struct("StreamStop")
            .field("state", &state)
            .field("offset", &self.offset)
            .finish()
    }
}

pin_project! {
    /// A body or `Stream` that ends cleanly when its [`StreamStop`] fires.
    ///
    /// Created by [`StreamStop::wrap`]. The signal is checked before each frame or item, so a
    /// producer that is always ready still stops; whatever the inner value would have produced
    /// next is dropped with it. A body wrapped this way never reports an exact size: it may end
    /// early, and an HTTP/1 `Content-Length` would then be a lie.
    #[must_use = "bodies and streams do nothing unless polled"]
    pub struct EndOnStop<T> {
        #[pin]
        inner: T,
        #[pin]
        stop: StreamStop,
        ended: bool,
    }
}

impl<T> EndOnStop<T> {
    /// `true` once the stop signal ended the stream (or the inner value finished).
    pub fn is_ended(&self) -> bool {
        self.ended
    }

    /// The wrapped value.
    pub fn into_inner(self) -> T {
        self.inner
    }
}

impl<T: Body> Body for EndOnStop<T> {
    type Data = T::Data;
    type Error = T::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        if *this.ended {
            return Poll::Ready(None);
        }
        if this.stop.poll(cx).is_ready() {
            *this.ended = true;
            return Poll::Ready(None);
        }
        let frame = ready!(this.inner.poll_frame(cx));
        if frame.is_none() {
            *this.ended = true;
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.ended || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let mut hint = SizeHint::new();
        if let Some(upper) = self.inner.size_hint().upper() {
            hint.set_upper(upper);
        }
        hint
    }
}

impl<T: futures_core::Stream> futures_core::Stream for EndOnStop<T> {
    type Item = T::Item;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.project();
        if *this.ended {
            return Poll::Ready(None);
        }
        if this.stop.poll(cx).is_ready() {
            *this.ended = true;
            return Poll::Ready(None);
        }
        let item = ready!(this.inner.poll_next(cx));
        if item.is_none() {
            *this.ended = true;
        }
        Poll::Ready(item)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        if self.ended {
            (0, Some(0))
        } else {
            (0, self.inner.size_hint().1)
        }
    }
}

impl<T> fmt::Debug for EndOnStop<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EndOnStop")
            .field("stop", &self.stop)
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::spread_fraction;

    #[test]
    fn spread_is_even_for_any_prefix() {
        for n in [10u64, 100, 1000] {
            let mut buckets = [0u32; 10];
            for i in 0..n {
                let f = spread_fraction(i);
                assert!((0.0..1.0).contains(&f));
                buckets[(f * 10.0) as usize] += 1;
            }
            let expected = (n / 10) as u32;
            for b in buckets {
                assert!(b.abs_diff(expected) <= 2, "{buckets:?} for {n}");
            }
        }
    }
}

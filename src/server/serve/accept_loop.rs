//! What a [`Serve`](super::Serve) runs once polled: the accept loop, one task per connection,
//! and the wait for those tasks once the listener has closed.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::{pin, Pin};
use std::time::Duration;

use http::{Request, Response};
use http_body::Body;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::bound::ConnectionBound;
use super::Setup;
use crate::drain::{Drain, ServeSeam};
use crate::server::accept::Acceptor;
use crate::server::conn_meta::ConnMeta;
use crate::server::connection::{ConnTask, ConnTokens};
use crate::vocab::phase::Phase;
use crate::work::closers::BoxError;

/// Serves until the drain is over: accepts until the listener closes, then waits for the
/// connections to end.
pub(super) async fn run<S, B>(setup: Setup<S>)
where
    S: tower_service::Service<Request<Incoming>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let Setup {
        listener,
        service,
        drain,
        keep_listening,
        header_read_timeout,
        h2_streams,
        max_connections,
        conn_meta_always,
        #[cfg(feature = "axum")]
        connect_info,
    } = setup;
    let mut bound = ConnectionBound::new(max_connections);
    announce_start(&drain, header_read_timeout);
    let tokens = ConnTokens {
        drain: drain.moments().drain_started(),
        idle_close: CancellationToken::new(),
        deadline: drain.moments().deadline_exceeded(),
        closing: CancellationToken::new(),
        conn_meta_always,
        #[cfg(feature = "axum")]
        connect_info,
    };
    let connections = Connections {
        builder: connection_builder(header_read_timeout, h2_streams),
        tokens,
        tracker: TaskTracker::new(),
        service,
        seam: ServeSeam::new(&drain),
        drain,
    };
    let mut acceptor = Acceptor::new(listener, "");
    {
        let mut closes = pin!(listener_closes(&connections.drain, keep_listening));
        while let Some((stream, peer, permit)) =
            accept(&mut acceptor, bound.as_mut(), closes.as_mut()).await
        {
            connections.spawn(stream, peer, permit);
        }
    }
    drop(acceptor);
    connections.wait_until_gone().await;
}

/// Marks startup complete and records the server's settings for the report; from now on every
/// accepted connection counts in the arrival rate (the evidence).
fn announce_start(drain: &Drain, header_read_timeout: Option<Duration>) {
    drain.readiness().mark_serving();
    ServeSeam::new(drain).note_server(crate::report::ServerReport {
        header_read_timeout_ms: header_read_timeout.map(|t| t.as_millis() as u64),
    });
    drain.core().observed().observe_arrivals();
}

/// The hyper builder every connection is served with.
fn connection_builder(
    header_read_timeout: Option<Duration>,
    h2_streams: u32,
) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    if let Some(t) = header_read_timeout {
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(t);
    }
    // Extended CONNECT, so WebSockets work over HTTP/2 too.
    builder
        .http2()
        .enable_connect_protocol()
        .max_concurrent_streams(h2_streams);
    builder
}

/// When the listener closes: at `stopped_accepting`, or — when keeping it open for refusals —
/// when the drain leaves StoppedAccepting (zero in flight, or the deadline).
async fn listener_closes(drain: &Drain, keep_listening: bool) {
    if keep_listening {
        tokio::select! {
            () = drain.moments().reached(Phase::Closing) => {}
            () = drain.moments().deadline_exceeded().cancelled_owned() => {}
        }
    } else {
        drain.moments().stopped_accepting().cancelled_owned().await;
    }
}

/// The next connection and its permit under the bound (if any); `None` once `closes` resolves.
async fn accept<F>(
    acceptor: &mut Acceptor,
    bound: Option<&mut ConnectionBound>,
    mut closes: Pin<&mut F>,
) -> Option<(TcpStream, SocketAddr, Option<OwnedSemaphorePermit>)>
where
    F: Future<Output = ()>,
{
    let permit = match bound {
        None => None,
        Some(bound) => Some(bound.permit(closes.as_mut()).await?),
    };
    let (stream, peer) = acceptor.next(closes).await?;
    Some((stream, peer, permit))
}

/// The accepted connections' tasks, and what each is started with.
struct Connections<S> {
    builder: auto::Builder<TokioExecutor>,
    tokens: ConnTokens,
    tracker: TaskTracker,
    service: S,
    /// Where each connection is recorded.
    seam: ServeSeam,
    drain: Drain,
}

impl<S> Connections<S> {
    /// Records the connection as activity and serves it on its own task, which holds `permit`
    /// until the connection is gone.
    fn spawn<B>(&self, stream: TcpStream, peer: SocketAddr, permit: Option<OwnedSemaphorePermit>)
    where
        S: tower_service::Service<Request<Incoming>, Response = Response<B>>
            + Clone
            + Send
            + 'static,
        S::Future: Send + 'static,
        S::Error: Into<BoxError>,
        B: Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<BoxError>,
    {
        let (after_drain, path) = self.seam.note_connection(Some(peer));
        let meta = ConnMeta::counted(Some(peer), Some(after_drain), self.drain.core(), path);
        let conn = ConnTask::new(self.drain.core(), meta, self.tokens.clone());
        let svc = TowerToHyperService::new(self.service.clone());
        let run = conn.run(self.builder.clone(), stream, svc);
        match permit {
            None => self.tracker.spawn(run),
            Some(permit) => self.tracker.spawn(async move {
                run.await;
                drop(permit);
            }),
        };
    }

    /// Once the listener has closed: closes idle connections and waits for every connection
    /// to end, closing those that never sent a complete request head once nothing is in flight.
    async fn wait_until_gone(self) {
        tracing::info!(
            connections = self.drain.counts().connections(),
            "lameduck: listener closed; waiting for connections to finish"
        );
        self.tokens.idle_close.cancel();
        self.tracker.close();
        tokio::select! {
            () = self.tracker.wait() => {}
            () = self.drain.moments().reached(Phase::Closing) => {
                // Nothing is in flight any more: connections still waiting for a first request
                // head (slowloris, or a client that connected and went quiet) hold nothing.
                self.tokens.closing.cancel();
                self.tracker.wait().await;
            }
        }
    }
}

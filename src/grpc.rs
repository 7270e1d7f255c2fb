//! gRPC integration: the standard health service (`grpc.health.v1.Health`, from tonic-health)
//! kept in step with the drain.
//!
//! [`health`] returns a [`HealthReporter`] and a health service:
//!
//! | Phase | `Check` / `Watch` status of `""` and each named service |
//! |---|---|
//! | Starting | `NOT_SERVING` |
//! | Serving | `SERVING` |
//! | Draining | under [`Auto`](crate::ReadinessWhileDraining::Auto) (the default): `SERVING` to kubelet's gRPC probe (`user-agent: kube-probe/…`), `NOT_SERVING` at once to every other caller; `NOT_SERVING` at once under [`NotReady`](crate::ReadinessWhileDraining::NotReady); `SERVING` under [`ServingUntilStop`](crate::ReadinessWhileDraining::ServingUntilStop) |
//! | StoppedAccepting and later | `NOT_SERVING`; every open `Watch` gets a last `NOT_SERVING` and ends with status `OK` |
//!
//! The status follows the phase and the readiness policy — what `/readyz` says, by the same
//! rule, without the readiness checks, which are user code and change without telling anyone.
//! kubelet's gRPC probe sends `user-agent: kube-probe/<version>` (followed by its gRPC
//! library's own token), so `Auto` tells it apart here as on `/readyz`; a caller without a
//! User-Agent is taken for a load balancer. Report a named
//! service's own trouble with the returned reporter; the next phase change overwrites it.
//!
//! `Watch` streams never end on their own, so under [`Drain::layer`] each one would count as
//! in flight until the quiesce deadline cut it. They end at `stopped_accepting`, like any other
//! long-lived stream ([`StreamStop::new`]): the watcher reconnects, to another replica.
//!
//! For a gRPC service on Kubernetes, see the [tonic guide](crate::guide::tonic).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use pin_project_lite::pin_project;
use tokio::sync::watch;
use tonic::{Request, Response, Status};
use tonic_health::pb::health_check_response::ServingStatus as WireStatus;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};
use tonic_health::server::{HealthReporter, HealthService};
use tonic_health::ServingStatus;

use tokio_util::sync::WaitForCancellationFutureOwned;

use crate::drain::Drain;
use crate::readiness::{ready_in, Caller};
use crate::server::StreamStop;
use crate::vocab::phase::Phase;
use crate::vocab::phase::ReadinessWhileDraining;

/// The standard gRPC health service, with its status following `drain`: `NOT_SERVING`
/// while Starting, `SERVING` while Serving, `NOT_SERVING` from the drain's start (or from
/// `stopped_accepting` under
/// [`ReadinessWhileDraining::ServingUntilStop`]).
///
/// The overall status (service name `""`) and every name in `services` (fully qualified,
/// e.g. `"helloworld.Greeter"`, or `<S as tonic::server::NamedService>::NAME`) follow the
/// phase. `Watch` streams end at `stopped_accepting` after a last `NOT_SERVING`, so they do
/// not hold the drain until its deadline. The returned [`HealthReporter`] sets statuses by
/// hand in between (a dependency is down); the next phase change overwrites them.
///
/// A task spawned here keeps the statuses up to date; it ends at `stopped_accepting`.
/// See the [module docs](crate::grpc) for the table and the [tonic guide](crate::guide::tonic).
///
/// # Examples
///
/// ```
/// use lameduck::Drain;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let drain = Drain::builder().build().unwrap();
/// let (_reporter, health) = lameduck::grpc::health(&drain, ["helloworld.Greeter"]);
/// let routes = tonic::service::Routes::new(health).prepare();
/// // Serve it (and the real services) behind the drain layer:
/// let app = routes.into_axum_router().layer(drain.layer());
/// # let _ = app;
/// // let listener = tokio::net::TcpListener::bind("0.0.0.0:50051").await?;
/// // tokio::spawn(lameduck::serve(listener, app, &drain));
/// # }
/// ```
///
/// # Panics
///
/// Outside a Tokio runtime (it spawns the task that follows the phase).
pub fn health<I, N>(drain: &Drain, services: I) -> (HealthReporter, HealthServer<DrainHealth>)
where
    I: IntoIterator<Item = N>,
    N: Into<String>,
{
    let reporter = HealthReporter::new();
    let mut names: Vec<String> = vec![String::new()];
    for name in services {
        let name = name.into();
        if !names.contains(&name) {
            names.push(name);
        }
    }
    tokio::spawn(follow_phase(
        drain.moments().subscribe(),
        drain.readiness().policy(),
        reporter.clone(),
        names,
    ));
    let service = DrainHealth {
        inner: HealthService::from_health_reporter(reporter.clone()),
        drain: drain.clone(),
    };
    (reporter, HealthServer::new(service))
}

/// gRPC health goes by `User-Agent` only: kubelet's gRPC probe sends `kube-probe/…`.
fn caller_of<T>(request: &Request<T>) -> Caller {
    let ua = request.metadata().get("user-agent");
    match ua.map(|v| v.as_encoded_bytes()) {
        Some(ua) if ua.starts_with(b"kube-probe/") => Caller::Kubelet,
        _ => Caller::Other,
    }
}

/// Sets every name's status at each phase change, until nothing can change any more.
///
/// Holds only the phase receiver, not a `Drain`, so it keeps nothing else alive.
async fn follow_phase(
    mut phases: watch::Receiver<Phase>,
    policy: ReadinessWhileDraining,
    reporter: HealthReporter,
    names: Vec<String>,
) {
    let mut last = None;
    loop {
        let phase = *phases.borrow_and_update();
        // The statuses held are kubelet's view; `DrainHealth` answers other callers by the
        // same rule (they differ only under `Auto`).
        let status = if ready_in(phase, policy, Caller::Kubelet) {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        if last != Some(status) {
            for name in &names {
                reporter.set_service_status(name, status).await;
            }
            tracing::debug!(phase = %phase, status = %status, "lameduck: gRPC health status");
            last = Some(status);
        }
        if phase >= Phase::StoppedAccepting || phases.changed().await.is_err() {
            break;
        }
    }
}

/// The `grpc.health.v1.Health` implementation returned (inside a [`HealthServer`]) by
/// [`health`].
///
/// `Check` answers from the statuses the reporter holds; `Watch` streams end at
/// `stopped_accepting` (see [`WatchUntilStop`]).
pub struct DrainHealth {
    inner: HealthService,
    drain: Drain,
}

impl fmt::Debug for DrainHealth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DrainHealth")
            .field("phase", &self.drain.phase())
            .finish_non_exhaustive()
    }
}

#[tonic::async_trait]
impl Health for DrainHealth {
    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        let caller = caller_of(&request);
        let mut response = self.inner.check(request).await?;
        if !self.serving_for(caller) {
            response.get_mut().status = WireStatus::NotServing as i32;
        }
        Ok(response)
    }

    type WatchStream = WatchUntilStop;

    async fn watch(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        // Taken before the inner call, so a watch opened just before the stop still ends.
        let stop = StreamStop::new(&self.drain);
        let caller = caller_of(&request);
        // The statuses held are kubelet's view: a caller that sees "not serving" from the
        // trigger gets its own NOT_SERVING then (see `WatchUntilStop`).
        let policy = self.drain.readiness().policy();
        let differs = ready_in(Phase::Draining, policy, caller)
            != ready_in(Phase::Draining, policy, Caller::Kubelet);
        let not_serving_from =
            differs.then(|| Box::pin(self.drain.moments().drain_started().cancelled_owned()));
        let response = self.inner.watch(request).await?;
        Ok(response.map(|inner| WatchUntilStop {
            inner,
            stop,
            not_serving_from,
            state: WatchState::Open,
            last_not_serving: false,
        }))
    }
}

impl DrainHealth {
    /// Whether the phase lets `caller` see `SERVING` (the reporter's own statuses still apply
    /// when it does).
    fn serving_for(&self, caller: Caller) -> bool {
        let phase = self.drain.phase();
        phase != Phase::Draining || ready_in(phase, self.drain.readiness().policy(), caller)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WatchState {
    Open,
    /// NOT_SERVING sent for this caller from the trigger; the held statuses are not passed on.
    NotServing,
    Ended,
}

pin_project! {
    /// A health `Watch` stream that, at `stopped_accepting`, sends a last `NOT_SERVING` and
    /// ends (the call ends with status `OK`), so the watcher moves to another replica instead
    /// of holding this one's drain until the deadline.
    ///
    /// The last message is sent by the stream itself, not by the task that follows the phase,
    /// so a watcher sees it even when the readiness policy kept `SERVING` until this moment.
    #[must_use = "streams do nothing unless polled"]
    pub struct WatchUntilStop {
        inner: tonic_health::server::WatchStream,
        #[pin]
        stop: StreamStop,
        not_serving_from: Option<Pin<Box<WaitForCancellationFutureOwned>>>,
        state: WatchState,
        // The last message passed on was NOT_SERVING (the phase follower's own, which can
        // arrive just before `stop` is seen): then the stream ends without repeating it.
        last_not_serving: bool,
    }
}

impl futures_core::Stream for WatchUntilStop {
    type Item = Result<HealthCheckResponse, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.project();
        if *this.state == WatchState::Ended {
            return Poll::Ready(None);
        }
        if this.stop.poll(cx).is_ready() {
            let sent = *this.state == WatchState::NotServing || *this.last_not_serving;
            *this.state = WatchState::Ended;
            if sent {
                return Poll::Ready(None);
            }
            return Poll::Ready(Some(Ok(HealthCheckResponse {
                status: WireStatus::NotServing as i32,
            })));
        }
        if *this.state == WatchState::Open {
            if let Some(from) = this.not_serving_from.as_mut() {
                if from.as_mut().poll(cx).is_ready() {
                    *this.state = WatchState::NotServing;
                    return Poll::Ready(Some(Ok(HealthCheckResponse {
                        status: WireStatus::NotServing as i32,
                    })));
                }
            }
        }
        loop {
            let item = ready!(Pin::new(&mut *this.inner).poll_next(cx));
            if item.is_none() {
                *this.state = WatchState::Ended;
                return Poll::Ready(None);
            }
            // Held statuses say SERVING to kubelet's view; this caller already has its answer.
            if *this.state != WatchState::NotServing {
                *this.last_not_serving = matches!(
                    &item,
                    Some(Ok(r)) if r.status == WireStatus::NotServing as i32
                );
                return Poll::Ready(item);
            }
        }
    }
}

impl fmt::Debug for WatchUntilStop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WatchUntilStop")
            .field("stop", &self.stop)
            .field("ended", &(self.state == WatchState::Ended))
            .finish_non_exhaustive()
    }
}

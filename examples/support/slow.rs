//! `slow.Slow`: one unary RPC that sleeps, written by hand so that building needs no `protoc`.
//!
//! ```proto
//! syntax = "proto3";
//! package slow;
//!
//! service Slow {
//!   rpc Sleep (SleepRequest) returns (SleepReply);
//! }
//! message SleepRequest { uint64 millis = 1; }
//! message SleepReply {
//!   uint64 slept_millis = 1;
//!   uint64 connection = 2;  // id of the server-side connection that carried the call
//! }
//! ```
//!
//! The messages derive `prost::Message`; the server routes by path and hands the call to
//! `tonic::server::Grpc`, and the client calls `tonic::client::Grpc::unary` — the same calls
//! that generated code makes. Shared by `examples/grpc.rs` and `tests/grpc.rs`.
// Each user needs a different part of it.
#![allow(dead_code)]

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http::uri::PathAndQuery;
use lameduck::ConnMeta;
use tonic::body::Body;
use tonic::server::{Grpc, NamedService, UnaryService};
use tonic::transport::Channel;
use tonic::{Request, Response, Status};
use tonic_prost::ProstCodec;

/// The service's fully qualified name, for the health service and for routing.
pub(crate) const SERVICE: &str = "slow.Slow";
const SLEEP: &str = "/slow.Slow/Sleep";
/// Longer requests are cut to this: an example should not hold a drain for an hour.
const MAX_SLEEP: Duration = Duration::from_secs(60);

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct SleepRequest {
    #[prost(uint64, tag = "1")]
    pub(crate) millis: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct SleepReply {
    #[prost(uint64, tag = "1")]
    pub(crate) slept_millis: u64,
    /// The id of the server-side connection ([`ConnMeta::id`]) that carried the call; 0 when
    /// the server does not attach a `ConnMeta`.
    #[prost(uint64, tag = "2")]
    pub(crate) connection: u64,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// The server side: a tower service over HTTP requests, as tonic's routes expect.
#[derive(Clone, Debug, Default)]
pub(crate) struct SlowServer;

impl NamedService for SlowServer {
    const NAME: &'static str = SERVICE;
}

impl tower_service::Service<http::Request<Body>> for SlowServer {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        match req.uri().path() {
            SLEEP => Box::pin(async move {
                let mut grpc = Grpc::new(ProstCodec::<SleepReply, SleepRequest>::default());
                Ok(grpc.unary(Sleep, req).await)
            }),
            _ => Box::pin(async { Ok(Status::unimplemented("no such method").into_http()) }),
        }
    }
}

/// The handler of `Sleep`.
struct Sleep;

impl UnaryService<SleepRequest> for Sleep {
    type Response = SleepReply;
    type Future = BoxFuture<Result<Response<SleepReply>, Status>>;

    fn call(&mut self, request: Request<SleepRequest>) -> Self::Future {
        // `lameduck::serve` attaches the connection's metadata; tonic keeps HTTP extensions.
        let connection = request
            .extensions()
            .get::<ConnMeta>()
            .map_or(0, ConnMeta::id);
        let wanted = Duration::from_millis(request.into_inner().millis).min(MAX_SLEEP);
        Box::pin(async move {
            tokio::time::sleep(wanted).await;
            Ok(Response::new(SleepReply {
                slept_millis: wanted.as_millis() as u64,
                connection,
            }))
        })
    }
}

/// The client side.
#[derive(Clone, Debug)]
pub(crate) struct SlowClient {
    inner: tonic::client::Grpc<Channel>,
}

impl SlowClient {
    pub(crate) fn new(channel: Channel) -> Self {
        Self {
            inner: tonic::client::Grpc::new(channel),
        }
    }

    pub(crate) async fn sleep(&mut self, millis: u64) -> Result<SleepReply, Status> {
        self.inner
            .ready()
            .await
            .map_err(|e| Status::unavailable(format!("channel not ready: {e}")))?;
        let codec = ProstCodec::<SleepRequest, SleepReply>::default();
        let reply = self
            .inner
            .unary(
                Request::new(SleepRequest { millis }),
                PathAndQuery::from_static(SLEEP),
                codec,
            )
            .await?;
        Ok(reply.into_inner())
    }
}

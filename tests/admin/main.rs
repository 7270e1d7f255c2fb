//! The admin router over real HTTP on 127.0.0.1, one concern a file: the probes and `/status`
//! (`probes`), `/drain` (`drain`), the bearer token (`token`), the `preStop` client helper
//! (`prestop`), and the input the router must refuse, tabled and fuzzed (`fuzz`).

#[path = "../common/mod.rs"]
mod common;

mod drain;
mod flood;
mod fuzz;
mod prestop;
mod probes;
mod token;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::Router;
use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use lameduck::{Drain, DrainBuilder, Phase, Propagation, Status};
use tokio::net::TcpStream;

use common::{bind, ms, quiet_builder, secs, text, within};
use lameduck::AdminBuilder;

pub(crate) const TOKEN: &str = "s3cr3t-t0ken";

pub(crate) type ReqBody = BoxBody<Bytes, Infallible>;

/// Grace 20 s (`/status` shows it), a fixed 100 ms propagation delay.
pub(crate) fn builder() -> DrainBuilder {
    quiet_builder()
        .grace_period(secs(20))
        .propagation(Propagation::fixed(ms(100)))
}

pub(crate) fn serving() -> Drain {
    let drain = builder().build().unwrap();
    drain.readiness().mark_serving();
    assert_eq!(drain.phase(), Phase::Serving);
    drain
}

pub(crate) async fn serve(router: Router) -> SocketAddr {
    let (listener, addr) = bind().await;
    tokio::spawn(async move {
        axum::serve(listener, router).await.unwrap();
    });
    addr
}

/// Serves `drain`'s admin router with the test token.
pub(crate) async fn serve_with_token(drain: &Drain) -> SocketAddr {
    serve(AdminBuilder::new(drain).token(TOKEN).unwrap().router()).await
}

/// Serves `drain`'s admin router with no token.
pub(crate) async fn serve_open(drain: &Drain) -> SocketAddr {
    serve(AdminBuilder::new(drain).without_token().router()).await
}

pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: String,
}

impl Answer {
    pub(crate) fn json(&self) -> Status {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not the status JSON ({e}): {}", self.body))
    }
}

/// One request on a fresh HTTP/1.1 connection (so a refused body can never spoil a pooled
/// connection for the next request).
pub(crate) async fn send(addr: SocketAddr, req: Request<ReqBody>) -> Answer {
    within("the admin's answer", async {
        let stream = TcpStream::connect(addr).await.unwrap();
        let (mut tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn);
        let (status, headers, body) = text(tx.send_request(req).await.unwrap()).await;
        Answer {
            status,
            headers,
            body,
        }
    })
    .await
}

pub(crate) fn request(method: Method, addr: SocketAddr, target: &str) -> http::request::Builder {
    Request::builder()
        .method(method)
        .uri(format!("http://{addr}{target}"))
        .header(http::header::HOST, addr.to_string())
}

pub(crate) fn empty() -> ReqBody {
    Empty::new().boxed()
}

pub(crate) async fn get(addr: SocketAddr, target: &str) -> Answer {
    send(
        addr,
        request(Method::GET, addr, target).body(empty()).unwrap(),
    )
    .await
}

/// `GET target` with the test token.
pub(crate) async fn drain_call(addr: SocketAddr, target: &str) -> Answer {
    let req = request(Method::GET, addr, target)
        .header("authorization", format!("Bearer {TOKEN}"))
        .body(empty())
        .unwrap();
    send(addr, req).await
}

/// A body of `n` bytes sent in 100-byte frames with no declared length (chunked on the wire).
pub(crate) struct Chunked(pub(crate) usize);

impl Body for Chunked {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.0 == 0 {
            return Poll::Ready(None);
        }
        let n = self.0.min(100);
        self.0 -= n;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(vec![b'x'; n])))))
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

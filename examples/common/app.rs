//! The demo application shared by the `service` and `demo` examples: `GET /`, `GET /slow?ms=N`,
//! `GET /stream?ms=N`; every response carries `x-instance` and echoes `x-request-id`.

use std::collections::HashMap;
use std::convert::Infallible;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Query, Request};
use axum::http::{HeaderName, HeaderValue};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::get;
use axum::Router;

/// The routes, with the `x-instance` / `x-request-id` headers.
pub(crate) fn app(instance: &str) -> Router {
    let instance = HeaderValue::try_from(instance).unwrap_or(HeaderValue::from_static("invalid"));
    Router::new()
        .route("/", get(|| async { "ok" }))
        .route("/slow", get(slow))
        .route("/stream", get(stream))
        .layer(middleware::from_fn(move |req: Request, next: Next| {
            let instance = instance.clone();
            async move {
                let id = req.headers().get("x-request-id").cloned();
                let mut res = next.run(req).await;
                let h = res.headers_mut();
                h.insert(HeaderName::from_static("x-instance"), instance);
                if let Some(id) = id {
                    h.insert(HeaderName::from_static("x-request-id"), id);
                }
                res
            }
        }))
}

fn millis(q: &HashMap<String, String>) -> Duration {
    Duration::from_millis(
        q.get("ms")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
            .min(600_000),
    )
}

async fn slow(Query(q): Query<HashMap<String, String>>) -> &'static str {
    tokio::time::sleep(millis(&q)).await;
    "ok"
}

/// A chunked body: one chunk every 100 ms for the requested time.
async fn stream(Query(q): Query<HashMap<String, String>>) -> Response {
    let total = millis(&q);
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<axum::body::Bytes, Infallible>>(4);
    tokio::spawn(async move {
        let start = tokio::time::Instant::now();
        let mut i = 0u64;
        loop {
            if tx.send(Ok(format!("chunk {i}\n").into())).await.is_err() {
                return; // the client went away
            }
            i += 1;
            if start.elapsed() >= total {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100).min(total)).await;
        }
    });
    let body = http_body_util::StreamBody::new(ReceiverStream(rx));
    Response::new(Body::new(body))
}

/// `mpsc::Receiver` as a stream of body frames.
struct ReceiverStream(tokio::sync::mpsc::Receiver<Result<axum::body::Bytes, Infallible>>);

impl futures_core::Stream for ReceiverStream {
    type Item = Result<http_body::Frame<axum::body::Bytes>, Infallible>;
    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.0
            .poll_recv(cx)
            .map(|o| o.map(|r| r.map(http_body::Frame::data)))
    }
}

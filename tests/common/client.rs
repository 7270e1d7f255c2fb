//! Hyper clients on 127.0.0.1 (raw HTTP/1.1 and HTTP/2 connections) and what the tests read
//! from their answers.

use std::net::SocketAddr;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

pub type H1 = hyper::client::conn::http1::SendRequest<Empty<Bytes>>;
pub type H2 = hyper::client::conn::http2::SendRequest<Empty<Bytes>>;

/// A raw HTTP/1.1 client connection; the handle resolves when the connection closes.
pub async fn h1(addr: SocketAddr) -> (H1, JoinHandle<hyper::Result<()>>) {
    let io = TokioIo::new(TcpStream::connect(addr).await.unwrap());
    let (sender, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
    (sender, tokio::spawn(conn))
}

/// A raw HTTP/2 (prior knowledge) client connection.
pub async fn h2(addr: SocketAddr) -> (H2, JoinHandle<hyper::Result<()>>) {
    let io = TokioIo::new(TcpStream::connect(addr).await.unwrap());
    let (sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
        .await
        .unwrap();
    (sender, tokio::spawn(conn))
}

pub fn get(path: &str) -> Request<Empty<Bytes>> {
    Request::builder()
        .uri(path)
        .header("host", "test")
        .body(Empty::new())
        .unwrap()
}

pub async fn send1(sender: &mut H1, path: &str) -> Response<Incoming> {
    sender.ready().await.expect("connection ready");
    sender.send_request(get(path)).await.expect("response")
}

pub async fn send2(sender: &mut H2, path: &str) -> hyper::Result<Response<Incoming>> {
    sender.ready().await?;
    let req = Request::builder()
        .uri(format!("http://test{path}"))
        .version(http::Version::HTTP_2)
        .body(Empty::new())
        .unwrap();
    sender.send_request(req).await
}

pub async fn text(res: Response<Incoming>) -> (StatusCode, http::HeaderMap, String) {
    let (parts, body) = res.into_parts();
    let bytes = body.collect().await.expect("full body").to_bytes();
    (
        parts.status,
        parts.headers,
        String::from_utf8(bytes.to_vec()).unwrap(),
    )
}

pub fn connection_close(headers: &http::HeaderMap) -> bool {
    headers
        .get(http::header::CONNECTION)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"))
}

/// A request on a keep-alive connection opened before the drain: answered on that connection
/// (`id`, from the `conn` header) with `Connection: close`, and then the server closes it.
pub async fn reused_then_closed(
    sender: &mut H1,
    conn: JoinHandle<hyper::Result<()>>,
    id: u64,
    path: &str,
) {
    let (status, headers, _) = text(send1(sender, path).await).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        connection_close(&headers),
        "Connection: close while draining"
    );
    assert_eq!(conn_header(&headers), id, "served on the reused connection");
    super::within("the server to close the reused connection", conn)
        .await
        .unwrap()
        .unwrap();
}

/// Parses the `conn` header the test apps set.
pub fn conn_header(headers: &http::HeaderMap) -> u64 {
    headers
        .get("conn")
        .expect("conn header")
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// Reads the next data frame of a response body.
pub async fn next_chunk(body: &mut Incoming) -> Option<Bytes> {
    loop {
        match body.frame().await? {
            Ok(f) => {
                if let Ok(d) = f.into_data() {
                    return Some(d);
                }
            }
            Err(_) => return None,
        }
    }
}

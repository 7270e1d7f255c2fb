//! The `preStop` client helper against a live admin port, and each way it fails: a closed
//! port, a refused token, a timeout, a peer that is not an HTTP server, an oversized answer.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use lameduck::admin::{prestop, prestop_blocking, PrestopOptions, Wait};
use lameduck::{Phase, Trigger};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::{bind, within};
use crate::{serve_with_token, serving, TOKEN};

/// The helper's options with the test token.
fn with_token(wait: Wait, timeout: Option<Duration>) -> PrestopOptions {
    PrestopOptions {
        token: Some(TOKEN.into()),
        wait,
        timeout,
    }
}

/// A server on 127.0.0.1 for one connection that is not the admin router: it reads the
/// request first (closing with unread input would reset the connection), then `answer` writes
/// what it likes.
async fn one_connection<F, Fut>(answer: F) -> SocketAddr
where
    F: FnOnce(TcpStream) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let (listener, addr) = bind().await;
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut buf = [0u8; 1024];
        let _ = s.read(&mut buf).await;
        answer(s).await;
    });
    addr
}

#[tokio::test]
async fn prestop_helper_drains_a_live_admin_port() {
    let drain = serving();
    let addr = serve_with_token(&drain).await;
    let options = with_token(Wait::Drained, Some(Duration::from_secs(15)));
    // The address the app binds (0.0.0.0) works as well: it means the loopback address.
    let unspecified = SocketAddr::from(([0, 0, 0, 0], addr.port()));
    let status = prestop(unspecified, options).await.unwrap();
    assert_eq!(status.phase, Phase::Done);
    assert_eq!(status.trigger, Some(Trigger::PreStop));
    assert_eq!(drain.report().unwrap().exit_code, 0);
}

#[tokio::test]
async fn prestop_helper_reports_each_failure() {
    // A closed port: bind, learn the port, close (the listener is dropped at once).
    let (_, closed) = bind().await;
    let err = prestop(closed, PrestopOptions::default())
        .await
        .unwrap_err();
    assert!(err.is_connect(), "{err}");
    assert!(err.to_string().contains("cannot connect"), "{err}");

    let drain = serving();
    let addr = serve_with_token(&drain).await;
    let err = prestop(addr, PrestopOptions::default()).await.unwrap_err();
    assert_eq!(err.status(), Some(401), "{err}");
    assert!(err.to_string().contains("LAMEDUCK_ADMIN_TOKEN"), "{err}");
    let wrong = PrestopOptions {
        token: Some("nope".into()),
        ..PrestopOptions::default()
    };
    assert_eq!(prestop(addr, wrong).await.unwrap_err().status(), Some(401));
    assert_eq!(drain.phase(), Phase::Serving);

    let guard = drain.enter();
    let timed = with_token(Wait::Drained, Some(Duration::from_millis(200)));
    let err = prestop(addr, timed).await.unwrap_err();
    assert!(err.is_status() && err.status() == Some(504), "{err}");
    assert!(err.to_string().contains("it goes on"), "{err}");

    let status = prestop(addr, with_token(Wait::None, None)).await.unwrap();
    assert!(status.phase.is_draining());
    drop(guard);
    drain.drained().await;

    // Not an HTTP server at all: the answer is refused as malformed, not trusted.
    let bogus_addr = one_connection(|mut s| async move {
        let _ = s.write_all(b"SSH-2.0-nope\r\n\r\n").await;
        let _ = s.shutdown().await;
    })
    .await;
    let err = prestop(bogus_addr, PrestopOptions::default())
        .await
        .unwrap_err();
    assert!(err.is_invalid_response(), "{err}");
}

#[tokio::test]
async fn prestop_helper_refuses_an_oversized_answer() {
    // An HTTP server that answers 200 with a body far past the helper's limit: refused as
    // malformed, without reading it all.
    let addr = one_connection(|mut s| async move {
        let len = 64 << 20;
        let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {len}\r\n\r\n");
        let _ = s.write_all(head.as_bytes()).await;
        let chunk = vec![b'x'; 1 << 16];
        for _ in 0..(len / chunk.len()) {
            if s.write_all(&chunk).await.is_err() {
                break; // the helper gave up and closed
            }
        }
    })
    .await;
    let err = within(
        "the helper to give up",
        prestop(addr, PrestopOptions::default()),
    )
    .await
    .unwrap_err();
    assert!(err.is_invalid_response(), "{err}");
    assert!(err.to_string().contains("larger than"), "{err}");
}

#[test]
fn prestop_blocking_works_before_a_runtime_exists() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (drain, addr) = rt.block_on(async {
        let drain = serving();
        let addr = serve_with_token(&drain).await;
        (drain, addr)
    });
    let options = with_token(Wait::Propagated, Some(Duration::from_secs(15)));
    let status = std::thread::spawn(move || prestop_blocking(addr, options))
        .join()
        .unwrap()
        .unwrap();
    assert!(status.phase >= Phase::StoppedAccepting);
    rt.block_on(drain.drained());

    // Inside a runtime it refuses instead of panicking.
    let err = rt
        .block_on(async { prestop_blocking(addr, PrestopOptions::default()) })
        .unwrap_err();
    assert!(err.to_string().contains("inside a Tokio runtime"), "{err}");
}

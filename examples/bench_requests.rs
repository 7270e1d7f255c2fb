//! Run with `cargo run --release --example bench_requests -- <variant> <n>`.
//!
//! Runs `n` in-process requests through the hello-world router of one variant (see
//! `benches/support/variants.rs`), or `n` guard acquire/release pairs for a `guard-*` variant,
//! and prints nothing else of interest: it is the workload `benches/callgrind.sh` runs under
//! `valgrind --tool=callgrind` at two values of `n`, so that setup cost cancels out of
//! `(instructions(n2) − instructions(n1)) / (n2 − n1)`.
//!
//! Variants: every name of `benches/support/variants.rs` (in-process), the same with `hyper-`
//! (through a hyper connection over an in-memory pipe) or `tcp-` (over loopback TCP, plus
//! `tcp-plain-lserve` and `tcp-lameduck-lserve`), and guard-lameduck, guard-floor,
//! guard-floor-arc, guard-tasktracker, guard-semaphore, guard-graceful.

use std::convert::Infallible;
use std::hint::black_box;
use std::process::ExitCode;

#[path = "../benches/support/variants.rs"]
mod variants;

use bytes::Bytes;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use variants::{app, drain, with_app, Acquire, App, ArcFloor, Floor, Variant};

const GUARDS: [&str; 6] = [
    "guard-lameduck",
    "guard-floor",
    "guard-floor-arc",
    "guard-tasktracker",
    "guard-semaphore",
    "guard-graceful",
];

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let (Some(variant), Some(n)) = (args.next(), args.next().and_then(|n| n.parse::<u64>().ok()))
    else {
        eprintln!(
            "usage: bench_requests <variant> <n>\n  variants: {}, {}",
            Variant::names(),
            GUARDS.join(", ")
        );
        return ExitCode::from(2);
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // Context only (tokio-graceful spawns its signal task when built); nothing is scheduled
    // while the loop runs.
    let _ctx = rt.enter();
    let drain = drain();

    if let Some(server) = variant.strip_prefix("tcp-") {
        rt.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            // Its own task, as in a real server: the client's wake-ups do not poll it.
            let server = tokio::spawn(variants::serve(server.to_owned(), listener, drain.clone()));
            let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
            stream.set_nodelay(true).unwrap();
            requests(stream, n).await;
            server.abort();
        });
    } else if let Some(v) = variant.strip_prefix("hyper-").and_then(Variant::parse) {
        let app = app(v, &drain);
        rt.block_on(async { with_app!(app, |s| over_hyper(s, n).await) });
    } else if let Some(v) = Variant::parse(&variant) {
        let app = app(v, &drain);
        let mut bytes = 0;
        for _ in 0..n {
            bytes += app.one_request();
        }
        assert_eq!(bytes as u64, 5 * n);
    } else {
        match variant.as_str() {
            "guard-lameduck" => (0..n).for_each(|_| drop(black_box(drain.enter()))),
            "guard-floor" => {
                // The reference layers' guard: `fetch_add` in, `fetch_sub` in `Drop`.
                let floor = Floor::leak();
                (0..n).for_each(|_| drop(black_box(floor.acquire())));
            }
            "guard-floor-arc" => {
                // The same guard with the counter behind an `Arc` (a reference count per guard).
                let floor = ArcFloor::new();
                (0..n).for_each(|_| drop(black_box(floor.acquire())));
            }
            "guard-tasktracker" => {
                let t = tokio_util::task::TaskTracker::new();
                (0..n).for_each(|_| drop(black_box(t.token())));
            }
            "guard-semaphore" => {
                let s = tokio::sync::Semaphore::new(tokio::sync::Semaphore::MAX_PERMITS);
                (0..n).for_each(|_| drop(black_box(s.try_acquire().unwrap())));
            }
            "guard-graceful" => {
                let s = tokio_graceful::Shutdown::new(std::future::pending::<()>());
                (0..n).for_each(|_| drop(black_box(s.guard())));
            }
            other => {
                eprintln!("unknown variant {other:?}");
                return ExitCode::from(2);
            }
        }
    }
    assert_eq!(drain.counts().in_flight(), 0);
    println!("{variant} {n}");
    ExitCode::SUCCESS
}

/// `n` sequential keep-alive requests through a hyper HTTP/1.1 server connection, over an
/// in-memory pipe; each response is read to its end before the next request is written.
async fn over_hyper<S, B>(svc: S, n: u64)
where
    S: tower_service::Service<
            http::Request<hyper::body::Incoming>,
            Response = http::Response<B>,
            Error = Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (client, server) = tokio::io::duplex(16 * 1024);
    let conn = tokio::spawn(
        hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(server), TowerToHyperService::new(svc)),
    );
    requests(client, n).await;
    conn.await.unwrap().unwrap();
}

/// `n` sequential `GET /` requests on one HTTP/1.1 keep-alive connection; each response is read
/// to its end before the next request is written. Closes the connection at the end.
async fn requests<IO: AsyncRead + AsyncWrite>(io: IO, n: u64) {
    let (mut rd, mut wr) = tokio::io::split(io);
    let mut buf = vec![0u8; 4096];
    for _ in 0..n {
        wr.write_all(b"GET / HTTP/1.1\r\nhost: bench\r\n\r\n")
            .await
            .unwrap();
        let mut got = 0;
        // The response ends with its 5-byte body; bounded by the buffer size.
        while !buf[..got].ends_with(b"\r\n\r\nhello") {
            assert!(got < buf.len(), "response larger than expected");
            let k = rd.read(&mut buf[got..]).await.unwrap();
            assert!(k > 0, "the server closed the connection");
            got += k;
        }
    }
    wr.shutdown().await.unwrap();
}

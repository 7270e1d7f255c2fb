//! [`AdminBuilder::serve`](lameduck::admin::AdminBuilder::serve) under floods, over raw sockets:
//! requests whose body never comes must not lock kubelet's probes out nor hold the exit, and a
//! connection flood must not evict a probe before its head is read.

use std::net::SocketAddr;
use std::time::Duration;

use lameduck::{Drain, Phase, Propagation, Trigger};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::common::{bind, ms, quiet_builder, secs, within};
use crate::TOKEN;

/// What kubelet's HTTP prober sends (Go's client, keep-alives off).
fn kubelet_request(path: &str) -> String {
    format!(
        "GET {path} HTTP/1.1\r\nHost: 10.0.0.7:9901\r\nUser-Agent: kube-probe/1.34\r\n\
         Accept: */*\r\nConnection: close\r\nAccept-Encoding: gzip\r\n\r\n"
    )
}

/// One kubelet probe with kubelet's default 1 s timeout: the status code, or why it failed.
async fn kubelet_probe(addr: SocketAddr, path: &str) -> Result<u16, String> {
    let probe = async {
        let mut s = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        s.write_all(kubelet_request(path).as_bytes())
            .await
            .map_err(|e| format!("write: {e}"))?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw)
            .await
            .map_err(|e| format!("read: {e}"))?;
        let head = String::from_utf8_lossy(&raw);
        head.split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| format!("no status line in {head:?}"))
    };
    match tokio::time::timeout(Duration::from_secs(1), probe).await {
        Ok(r) => r,
        Err(_) => Err("timed out after 1 s".to_owned()),
    }
}

/// [`kubelet_probe`] on a blocking socket, 1 s for each step.
fn blocking_kubelet_probe(addr: SocketAddr, path: &str) -> Result<u16, String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1))
        .map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(1))).unwrap();
    s.write_all(kubelet_request(path).as_bytes())
        .map_err(|e| format!("write: {e}"))?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(|e| format!("read: {e}"))?;
    let head = String::from_utf8_lossy(&raw);
    head.split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no status line in {head:?}"))
}

#[derive(Clone, Copy, Debug)]
enum Pending {
    /// `Content-Length: 1000`, then nothing.
    Length,
    /// `Transfer-Encoding: chunked`, one chunk announced, then nothing.
    Chunked,
}

/// Sends a request head announcing a body, and never the body.
async fn body_never_comes(addr: SocketAddr, target: &str, body: Pending, token: bool) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let auth = if token {
        format!("Authorization: Bearer {TOKEN}\r\n")
    } else {
        String::new()
    };
    let req = match body {
        Pending::Length => {
            format!("GET {target} HTTP/1.1\r\nHost: admin\r\n{auth}Content-Length: 1000\r\n\r\n")
        }
        Pending::Chunked => format!(
            "GET {target} HTTP/1.1\r\nHost: admin\r\n{auth}Transfer-Encoding: chunked\r\n\r\n3e8\r\n"
        ),
    };
    s.write_all(req.as_bytes()).await.unwrap();
    s
}

fn admin(drain: &Drain, token: bool) -> lameduck::admin::AdminBuilder {
    let b = drain.admin();
    if token {
        b.token(TOKEN)
    } else {
        b.without_token()
    }
}

/// Serves the admin port with its defaults (64 connections, 5 s header timeout).
async fn serve_admin(drain: &Drain, token: bool) -> SocketAddr {
    let (listener, addr) = bind().await;
    tokio::spawn(admin(drain, token).serve(listener));
    addr
}

async fn flood(addr: SocketAddr, n: usize, body: Pending, token: bool) -> Vec<TcpStream> {
    let mut held = Vec::with_capacity(n);
    for i in 0..n {
        // Both kinds of route: probes (which need no body) and `/drain` (which reads it).
        let target = if i % 2 == 0 { "/livez" } else { "/drain" };
        held.push(body_never_comes(addr, target, body, token).await);
    }
    // Setup only: let the server reach every head before kubelet comes.
    tokio::time::sleep(ms(300)).await;
    held
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_probes_are_answered_while_bodies_never_come() {
    for n in [64, 200] {
        for body in [Pending::Length, Pending::Chunked] {
            for token in [false, true] {
                let drain = quiet_builder().grace_period(secs(30)).build().unwrap();
                drain.readiness().mark_serving();
                let addr = serve_admin(&drain, token).await;
                let _held = flood(addr, n, body, token).await;
                for path in ["/livez", "/readyz", "/livez", "/readyz", "/status"] {
                    let answer = kubelet_probe(addr, path).await;
                    assert_eq!(
                        answer,
                        Ok(200),
                        "{path} with {n} connections whose {body:?} body never comes, token {token}"
                    );
                }
                assert_eq!(drain.phase(), Phase::Serving, "nothing started a drain");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_with_a_body_that_never_comes_is_answered_at_once() {
    let drain = quiet_builder().build().unwrap();
    drain.readiness().mark_serving();
    let addr = serve_admin(&drain, true).await;
    for body in [Pending::Length, Pending::Chunked] {
        let mut s = body_never_comes(addr, "/livez", body, false).await;
        let mut raw = Vec::new();
        within("the probe's answer", s.read_to_end(&mut raw))
            .await
            .unwrap();
        let raw = String::from_utf8_lossy(&raw);
        assert!(raw.starts_with("HTTP/1.1 200 "), "{body:?}: {raw}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_body_that_never_comes_is_refused_in_time_and_changes_nothing() {
    let drain = quiet_builder().build().unwrap();
    drain.readiness().mark_serving();
    let (listener, addr) = bind().await;
    tokio::spawn(
        drain
            .admin()
            .without_token()
            .header_read_timeout(ms(300))
            .serve(listener),
    );
    for body in [Pending::Length, Pending::Chunked] {
        let mut s = body_never_comes(addr, "/drain?wait=none", body, false).await;
        let mut raw = Vec::new();
        within("the refusal", s.read_to_end(&mut raw))
            .await
            .unwrap();
        let raw = String::from_utf8_lossy(&raw);
        assert!(raw.starts_with("HTTP/1.1 408 "), "{body:?}: {raw}");
        assert!(raw.contains("request body"), "{raw}");
    }
    assert_eq!(
        drain.phase(),
        Phase::Serving,
        "a refused /drain started nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_that_never_come_do_not_hold_the_exit() {
    for n in [64, 200] {
        for token in [false, true] {
            // The hard deadline is 9 s after the trigger; the drain itself is done in ~0.1 s.
            let grace = secs(10);
            let drain = quiet_builder()
                .grace_period(grace)
                .propagation(Propagation::fixed(ms(50)))
                .build()
                .unwrap();
            drain.readiness().mark_serving();
            let addr = serve_admin(&drain, token).await;
            let held_length = flood(addr, n / 2, Pending::Length, token).await;
            let held_chunked = flood(addr, n / 2, Pending::Chunked, token).await;

            let started = Instant::now();
            assert!(drain.start(Trigger::Api));
            let report = within("run returns", drain.run()).await;
            let took = started.elapsed();
            eprintln!("{n} pending bodies, token {token}: run returned {took:?} after the trigger");
            assert_eq!(report.exit_code, 0);
            // Done at ~0.1 s; a held exit lasts until the hard deadline (9 s).
            assert!(
                took < grace / 4,
                "{n} connections, token {token}: run returned {took:?} after the trigger \
                 (grace {grace:?}): the admin connections held the exit"
            );
            drop((held_length, held_chunked));
        }
    }
}

/// Silent connections, one every `every` at most, each dropped after `hold` newer ones, until
/// `stop` or `max` connections; returns how many were opened.
async fn connection_flood(
    addr: SocketAddr,
    every: Duration,
    hold: usize,
    max: usize,
    stop: tokio_util::sync::CancellationToken,
) -> usize {
    let mut held = std::collections::VecDeque::with_capacity(hold + 1);
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut opened = 0;
    while opened < max && !stop.is_cancelled() {
        tick.tick().await;
        if let Ok(s) = TcpStream::connect(addr).await {
            opened += 1;
            held.push_back(s);
            if held.len() > hold {
                held.pop_front();
            }
        }
    }
    opened
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_flood_never_evicts_a_probe_before_its_head_is_read() {
    let drain = quiet_builder().build().unwrap();
    drain.readiness().mark_serving();
    // A small cap, so that a few accepts are enough to evict a probe whose head is not read.
    let (listener, addr) = bind().await;
    tokio::spawn(
        drain
            .admin()
            .without_token()
            .max_connections(8)
            .serve(listener),
    );
    let stop = tokio_util::sync::CancellationToken::new();
    // Bounded: 4 × 3,000 connections at most, at most 2,000 a second (paced, so that the
    // kernel's accept queue does not fill: a dropped SYN fails a probe whatever the server
    // does), and stopped once the probes are done.
    let flooders: Vec<_> = (0..4)
        .map(|_| tokio::spawn(connection_flood(addr, ms(2), 16, 3_000, stop.clone())))
        .collect();
    let started = Instant::now();
    // kubelet is another process: the prober gets its own thread, blocking sockets, so that
    // the flood's tasks cannot delay its head between connect and write.
    let prober = std::thread::spawn(move || {
        (0..150)
            .filter_map(|i| {
                let path = if i % 2 == 0 { "/livez" } else { "/readyz" };
                let r = blocking_kubelet_probe(addr, path);
                std::thread::sleep(ms(10));
                (r != Ok(200)).then_some(r)
            })
            .collect::<Vec<_>>()
    });
    let failed = within(
        "the probes",
        tokio::task::spawn_blocking(move || prober.join().unwrap()),
    )
    .await
    .unwrap();
    stop.cancel();
    let mut opened = 0;
    for f in flooders {
        opened += within("the flood ends", f).await.unwrap();
    }
    let rate = opened as f64 / started.elapsed().as_secs_f64();
    eprintln!(
        "flood: {opened} connections, {rate:.0}/s; {} probes failed",
        failed.len()
    );
    assert!(
        failed.is_empty(),
        "{} of 150 probes failed under a flood of {opened} connections ({rate:.0}/s): {failed:?}",
        failed.len()
    );
}

/// The admin server on a current-thread runtime of its own thread, which the test can stall:
/// while it is stalled, connections queue in the kernel, and once it runs again its accept
/// loop takes them in one go, before any connection's task has run — what a flood does to a
/// busy runtime.
struct StallableAdmin {
    addr: SocketAddr,
    stall: tokio::sync::mpsc::UnboundedSender<(Duration, std::sync::mpsc::Sender<()>)>,
    _thread: std::thread::JoinHandle<()>,
}

impl StallableAdmin {
    fn start(cap: usize) -> Self {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stall, mut stalls) =
            tokio::sync::mpsc::unbounded_channel::<(Duration, std::sync::mpsc::Sender<()>)>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let drain = quiet_builder().build().unwrap();
                drain.readiness().mark_serving();
                let (listener, addr) = bind().await;
                tokio::spawn(
                    drain
                        .admin()
                        .without_token()
                        .max_connections(cap)
                        .serve(listener),
                );
                ready_tx.send(addr).unwrap();
                // Ends when the test drops its sender.
                while let Some((d, stalled)) = stalls.recv().await {
                    let _ = stalled.send(());
                    // Blocks the runtime's only thread: nothing else runs meanwhile.
                    std::thread::sleep(d);
                }
            });
        });
        let addr = ready_rx.recv_timeout(secs(15)).unwrap();
        Self {
            addr,
            stall,
            _thread: thread,
        }
    }

    /// Stalls the server for `d`; returns once the stall has begun.
    fn stall(&self, d: Duration) {
        let (tx, rx) = std::sync::mpsc::channel();
        self.stall.send((d, tx)).unwrap();
        rx.recv_timeout(secs(15)).unwrap();
    }
}

#[test]
fn a_probe_whose_head_arrived_in_a_burst_of_connections_is_answered() {
    use std::io::{Read, Write};

    let cap = 8;
    let admin = StallableAdmin::start(cap);
    for round in 0..5 {
        let stall = ms(500);
        admin.stall(stall);
        let began = std::time::Instant::now();
        let silent = |n: usize| -> Vec<std::net::TcpStream> {
            (0..n)
                .map(|_| std::net::TcpStream::connect(admin.addr).unwrap())
                .collect()
        };
        // Queued behind the stalled accept loop: silent connections, the probe with its whole
        // head sent, and more silent connections than the cap.
        let before = silent(cap + 2);
        let mut probe = std::net::TcpStream::connect(admin.addr).unwrap();
        probe
            .write_all(kubelet_request("/livez").as_bytes())
            .unwrap();
        let after = silent(2 * cap);
        assert!(
            began.elapsed() < stall,
            "setup outlasted the stall: the burst was not queued"
        );

        probe
            .set_read_timeout(Some(stall + Duration::from_secs(2)))
            .unwrap();
        let mut raw = Vec::new();
        let read = probe.read_to_end(&mut raw);
        let raw = String::from_utf8_lossy(&raw);
        assert!(
            read.is_ok() && raw.starts_with("HTTP/1.1 200 "),
            "round {round}: the probe in the burst was not answered: {read:?} {raw:?}"
        );
        drop((before, after));
    }
}

/// Sends `GET /drain?wait=drained` (with the token when asked) and keeps the connection.
async fn drain_waiter(addr: SocketAddr, token: bool) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let auth = if token {
        format!("Authorization: Bearer {TOKEN}\r\n")
    } else {
        String::new()
    };
    let req = format!("GET /drain?wait=drained HTTP/1.1\r\nHost: admin\r\n{auth}\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    s
}

/// What a connection answered within `patience`: its raw bytes, or `None` when it said
/// nothing (still waiting).
async fn answer_within(s: &mut TcpStream, patience: Duration) -> Option<String> {
    let mut raw = Vec::new();
    match tokio::time::timeout(patience, s.read_to_end(&mut raw)).await {
        Ok(_) => Some(String::from_utf8_lossy(&raw).into_owned()),
        Err(_) if raw.is_empty() => None,
        Err(_) => Some(String::from_utf8_lossy(&raw).into_owned()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_waiters_at_the_cap_leave_room_for_kubelet_probes() {
    for token in [false, true] {
        // The drain lasts 20 s: every waiter the server keeps waits that long.
        let drain = quiet_builder()
            .grace_period(secs(30))
            .propagation(Propagation::fixed(secs(20)))
            .build()
            .unwrap();
        drain.readiness().mark_serving();
        let addr = serve_admin(&drain, token).await;
        let mut waiters = Vec::new();
        for _ in 0..lameduck::admin::DEFAULT_ADMIN_MAX_CONNECTIONS {
            waiters.push(drain_waiter(addr, token).await);
        }
        // Setup only: let the server reach every head before kubelet comes.
        tokio::time::sleep(ms(300)).await;
        assert_eq!(
            drain.phase(),
            Phase::Draining,
            "the waiters started the drain"
        );
        for path in [
            "/livez", "/readyz", "/livez", "/readyz", "/livez", "/readyz",
        ] {
            let answer = kubelet_probe(addr, path).await;
            assert_eq!(
                answer,
                Ok(200),
                "{path} beside 64 /drain?wait=drained callers, token {token}"
            );
        }
        // The callers the server did not keep were told so, not left hanging or cut.
        let answers: Vec<_> = waiters
            .into_iter()
            .map(|mut s| tokio::spawn(async move { (answer_within(&mut s, ms(500)).await, s) }))
            .collect();
        let mut told = 0;
        let mut waiting = 0;
        let mut kept = Vec::new();
        for a in answers {
            let (answer, s) = within("a waiter's answer", a).await.unwrap();
            kept.push(s);
            match answer {
                None => waiting += 1,
                Some(raw) => {
                    assert!(raw.starts_with("HTTP/1.1 503 "), "token {token}: {raw}");
                    assert!(raw.to_ascii_lowercase().contains("retry-after:"), "{raw}");
                    assert!(raw.contains("wait=none"), "{raw}");
                    told += 1;
                }
            }
        }
        eprintln!("token {token}: {waiting} waiters kept, {told} told to retry");
        assert!(waiting >= 1, "some /drain callers are kept waiting");
        let cap = lameduck::admin::DEFAULT_ADMIN_MAX_CONNECTIONS;
        assert!(
            waiting <= cap - cap / 8,
            "an eighth of the admin connections is kept from the waiters ({waiting})"
        );
        assert!(told >= 1, "one caller past the share was told to retry");
        assert_eq!(waiting + told, kept.len());
    }
}

/// Opens a connection that pipelines `GET /livez` requests and never reads an answer: once
/// its receive buffer and the server's send buffer are full, the server cannot write.
async fn pipeliner(addr: SocketAddr, requests: usize) -> (TcpStream, tokio::task::JoinHandle<()>) {
    let s = TcpStream::connect(addr).await.unwrap();
    let std = s.into_std().unwrap();
    let writer = TcpStream::from_std(std.try_clone().unwrap()).unwrap();
    let keep = TcpStream::from_std(std).unwrap();
    let task = tokio::spawn(async move {
        let mut writer = writer;
        let one = b"GET /livez HTTP/1.1\r\nHost: admin\r\nUser-Agent: pipeliner/1\r\n\r\n";
        let all: Vec<u8> = one
            .iter()
            .copied()
            .cycle()
            .take(one.len() * requests)
            .collect();
        // Blocks once the server stops reading; bounded by the test aborting it.
        let _ = writer.write_all(&all).await;
        std::future::pending::<()>().await;
    });
    (keep, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_pipeline_and_never_read_do_not_delay_kubelet_probes() {
    let drain = quiet_builder().build().unwrap();
    drain.readiness().mark_serving();
    let addr = serve_admin(&drain, false).await;
    let mut held = Vec::new();
    for _ in 0..lameduck::admin::DEFAULT_ADMIN_MAX_CONNECTIONS {
        held.push(pipeliner(addr, 20_000).await);
    }
    // Setup only: let the server answer until every pipeliner's buffers are full.
    tokio::time::sleep(ms(1000)).await;
    let mut failed = Vec::new();
    let probes = Instant::now();
    for i in 0..30 {
        let path = if i % 2 == 0 { "/livez" } else { "/readyz" };
        let r = kubelet_probe(addr, path).await;
        if r != Ok(200) {
            failed.push(r);
        }
    }
    eprintln!("30 probes took {:?}", probes.elapsed());
    for (_, task) in &held {
        task.abort();
    }
    assert!(
        failed.is_empty(),
        "{} of 30 kubelet probes failed beside 64 pipelining clients that never read: {failed:?}",
        failed.len()
    );
}

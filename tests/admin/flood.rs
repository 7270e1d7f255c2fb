//! [`AdminBuilder::serve`](lameduck::admin::AdminBuilder::serve) under floods, over raw sockets:
//! requests whose body never comes must not lock kubelet's probes out nor hold the exit, and a
//! connection flood must not evict a probe before its head is read.

use std::net::SocketAddr;
use std::time::Duration;

use lameduck::{Drain, Phase, Propagation, Trigger};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::common::{bind, ms, quiet_builder, secs, within, PATIENCE};
use crate::TOKEN;
use lameduck::AdminBuilder;

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
    let b = AdminBuilder::new(drain);
    if token {
        b.token(TOKEN).unwrap()
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
        AdminBuilder::new(&drain)
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

/// The admin server on a current-thread runtime of its own thread, which the test can hold:
/// while it is held, connections queue in the kernel, and once it is released its accept loop
/// takes them in one go, before any connection's task has run — what a flood does to a busy
/// runtime. A hold is a synchronisation point, not a duration: however slow the machine,
/// whatever the test sends while holding is queued before the server looks at any of it.
struct HeldAdmin {
    addr: SocketAddr,
    holds: tokio::sync::mpsc::UnboundedSender<(
        std::sync::mpsc::Sender<()>,
        std::sync::mpsc::Receiver<()>,
    )>,
    _thread: std::thread::JoinHandle<()>,
}

/// The server is held until this is dropped (also when the test fails).
struct Hold {
    _release: std::sync::mpsc::Sender<()>,
}

impl HeldAdmin {
    fn start(cap: usize) -> Self {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (holds, mut held) = tokio::sync::mpsc::unbounded_channel::<(
            std::sync::mpsc::Sender<()>,
            std::sync::mpsc::Receiver<()>,
        )>();
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
                    AdminBuilder::new(&drain)
                        .without_token()
                        .max_connections(cap)
                        .serve(listener),
                );
                ready_tx.send(addr).unwrap();
                // Ends when the test drops its sender.
                while let Some((begun, release)) = held.recv().await {
                    let _ = begun.send(());
                    // Blocks the runtime's only thread until the hold is dropped.
                    let _ = release.recv();
                }
            });
        });
        let addr = ready_rx.recv_timeout(PATIENCE).unwrap();
        Self {
            addr,
            holds,
            _thread: thread,
        }
    }

    /// Holds the server; returns once nothing of it runs any more.
    fn hold(&self) -> Hold {
        let (begun_tx, begun_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel();
        self.holds.send((begun_tx, release_rx)).unwrap();
        begun_rx.recv_timeout(PATIENCE).unwrap();
        Hold {
            _release: release_tx,
        }
    }
}

/// Sends kubelet's request for `path` on a new connection; the caller reads the answer.
fn send_probe(addr: SocketAddr, path: &str) -> std::net::TcpStream {
    use std::io::Write;
    let mut probe = std::net::TcpStream::connect(addr).unwrap();
    probe.write_all(kubelet_request(path).as_bytes()).unwrap();
    probe
}

/// The probe's answer: `Ok` with its status line, or why there is none. Waits up to
/// [`PATIENCE`]: how soon the answer comes depends on the machine, whether it comes does not.
fn probe_answer(mut probe: std::net::TcpStream) -> Result<String, String> {
    use std::io::Read;
    probe.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut raw = Vec::new();
    let read = probe.read_to_end(&mut raw);
    let raw = String::from_utf8_lossy(&raw);
    let status = raw.lines().next().unwrap_or_default().to_owned();
    match read {
        Ok(_) if status.starts_with("HTTP/1.1 200 ") => Ok(status),
        Ok(_) if raw.is_empty() => Err("closed without an answer (evicted or refused)".into()),
        Ok(_) => Err(format!("answered {status:?}")),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset && raw.is_empty() => {
            Err("reset without an answer (evicted or refused)".into())
        }
        Err(e) => Err(format!("{e} after {:?}", raw)),
    }
}

/// Silent connections from plain threads (another process, as far as the server can tell),
/// each thread keeping its newest `keep` open and closing the older ones. The threads open
/// only as many as the test allows ([`Flood::open`]): a flood paced by the clock would outrun
/// a starved server, fill the kernel's accept queue, and fail a probe's connect whatever the
/// server does. Counts what it opened, and the connections the server had closed by the time
/// the flood let go of them.
struct Flood {
    counts: std::sync::Arc<FloodCounts>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

#[derive(Default)]
struct FloodCounts {
    /// Connections the threads may still open.
    allowed: std::sync::atomic::AtomicUsize,
    opened: std::sync::atomic::AtomicUsize,
    closed_by_server: std::sync::atomic::AtomicUsize,
    stop: std::sync::atomic::AtomicBool,
}

impl Flood {
    fn start(addr: SocketAddr, threads: usize, keep: usize) -> Self {
        let counts = std::sync::Arc::new(FloodCounts::default());
        let threads = (0..threads)
            .map(|_| {
                let counts = counts.clone();
                std::thread::spawn(move || Self::run(addr, keep, &counts))
            })
            .collect();
        Self { counts, threads }
    }

    fn run(addr: SocketAddr, keep: usize, counts: &FloodCounts) {
        use std::io::Read;
        use std::sync::atomic::Ordering::SeqCst;
        let mut held = std::collections::VecDeque::with_capacity(keep + 1);
        while !counts.stop.load(SeqCst) {
            let allowed = counts
                .allowed
                .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
                .is_ok();
            if !allowed {
                std::thread::sleep(ms(1));
                continue;
            }
            let s = std::net::TcpStream::connect(addr).unwrap();
            counts.opened.fetch_add(1, SeqCst);
            held.push_back(s);
            if held.len() > keep {
                let oldest: std::net::TcpStream = held.pop_front().unwrap();
                oldest.set_nonblocking(true).unwrap();
                if matches!((&oldest).read(&mut [0; 1]), Ok(0)) {
                    counts.closed_by_server.fetch_add(1, SeqCst);
                }
            }
        }
    }

    /// Lets the threads open `n` more connections, and waits until they have (bounded by
    /// [`PATIENCE`]).
    fn open(&self, n: usize) {
        use std::sync::atomic::Ordering::SeqCst;
        let target = self.counts.opened.load(SeqCst) + n;
        self.counts.allowed.fetch_add(n, SeqCst);
        let started = std::time::Instant::now();
        while self.counts.opened.load(SeqCst) < target {
            assert!(
                started.elapsed() < PATIENCE,
                "the flood did not open {n} connections"
            );
            std::thread::sleep(ms(1));
        }
    }

    /// Stops the threads; returns (opened, closed by the server).
    fn stop(mut self) -> (usize, usize) {
        use std::sync::atomic::Ordering::SeqCst;
        self.counts.stop.store(true, SeqCst);
        for t in std::mem::take(&mut self.threads) {
            t.join().unwrap();
        }
        (
            self.counts.opened.load(SeqCst),
            self.counts.closed_by_server.load(SeqCst),
        )
    }
}

impl Drop for Flood {
    /// Also when the test fails: the threads end with it.
    fn drop(&mut self) {
        self.counts
            .stop
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The promise under a flood, whatever the machine's speed: a probe whose head has been sent
/// is answered, however many connections arrive after it before the server looks, and however
/// late its task runs. Each round holds the server (a synchronisation point, not a sleep), lets
/// the flood queue a cap of connections, sends the probe's head, lets the flood queue twice the
/// cap behind it, and releases: the accept loop then meets the probe and a full cap of newer
/// connections before the probe's task has read anything. Only whether the answer comes is
/// judged, not how soon.
#[test]
fn a_connection_flood_never_evicts_a_probe_before_its_head_is_read() {
    let cap = 8;
    let admin = HeldAdmin::start(cap);
    let flood = Flood::start(admin.addr, 4, 16);
    let rounds = 20;
    let mut failed = Vec::new();
    for round in 0..rounds {
        let path = if round % 2 == 0 { "/livez" } else { "/readyz" };
        let hold = admin.hold();
        flood.open(cap);
        let probe = send_probe(admin.addr, path);
        flood.open(2 * cap);
        drop(hold);
        if let Err(why) = probe_answer(probe) {
            failed.push(format!("round {round} ({path}): {why}"));
        }
    }
    let (opened, closed) = flood.stop();
    eprintln!(
        "flood: {opened} connections, {closed} of them closed by the server before the flood let go; {} of {rounds} probes failed",
        failed.len()
    );
    assert!(
        failed.is_empty(),
        "{} of {rounds} probes sent ahead of a flood were not answered: {failed:?}",
        failed.len()
    );
    // The flood did fill the cap: the server made room by closing flood connections.
    assert!(
        closed > 0,
        "the server closed none of {opened} flood connections"
    );
}

#[test]
fn a_probe_whose_head_arrived_in_a_burst_of_connections_is_answered() {
    let cap = 8;
    let admin = HeldAdmin::start(cap);
    let silent = |n: usize| -> Vec<std::net::TcpStream> {
        (0..n)
            .map(|_| std::net::TcpStream::connect(admin.addr).unwrap())
            .collect()
    };
    // Twenty rounds: whether an evicted probe still gets its answer out depends on the order
    // in which its task notices the eviction, so one round alone proves little.
    for round in 0..20 {
        let hold = admin.hold();
        // Queued behind the held accept loop: silent connections, the probe with its whole
        // head sent, and more silent connections than the cap.
        let before = silent(cap + 2);
        let probe = send_probe(admin.addr, "/livez");
        let after = silent(2 * cap);
        drop(hold);
        let answer = probe_answer(probe);
        assert!(
            answer.is_ok(),
            "round {round}: the probe in the burst was not answered: {answer:?}"
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

//! `lameduck::serve`: the accept loop and connection lifecycle across the drain, with real
//! sockets on 127.0.0.1 and real hyper clients (HTTP/1.1 and HTTP/2).
#![cfg(feature = "admin")] // the test app is an axum Router

mod common;

use std::time::Duration;

use common::*;
use http::StatusCode;
use http_body_util::BodyExt;
use lameduck::report::Outcome;
use lameduck::{EventKind, Phase, Propagation, Trigger};

#[tokio::test]
async fn idle_keep_alive_connection_is_closed_only_at_stopped_accepting() {
    let drain = drain(secs(6), Propagation::fixed(ms(1500)));
    let (addr, server) = start_serve(&drain, Probe::default()).await;

    let (mut idle, idle_conn) = h1(addr).await;
    let (status, headers, _) = text(send1(&mut idle, "/conn").await).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        !connection_close(&headers),
        "no Connection: close while Serving"
    );

    assert!(drain.start(Trigger::Api));
    // Synchronisation point: the connection's end. By then stopped_accepting (1.5 s after the
    // trigger) must be in the timeline; a close at the trigger would be seen long before.
    within("idle connection closed", idle_conn)
        .await
        .unwrap()
        .unwrap();
    assert!(
        has_event(&drain, EventKind::StoppedAccepting),
        "the idle keep-alive connection closed before stopped_accepting"
    );
    drop(idle);

    drained_clean(&drain, server).await;
    assert_eq!(drain.counts().connections(), 0);
}

#[tokio::test]
async fn http2_gets_goaway_in_flight_streams_finish_and_new_connections_work() {
    let drain = drain(secs(8), Propagation::fixed(secs(4)));
    let (addr, server) = start_serve(&drain, Probe::default()).await;

    let (mut old, old_conn) = h2(addr).await;
    let warm = send2(&mut old, "/conn").await.unwrap();
    let old_id = conn_header(warm.headers());
    assert_eq!(warm.version(), http::Version::HTTP_2);

    let slow = {
        let mut s = old.clone();
        tokio::spawn(async move { text(send2(&mut s, "/slow/1000").await.unwrap()).await })
    };
    eventually("slow request in flight", || drain.counts().in_flight() == 1).await;
    assert!(drain.start(Trigger::Api));

    let (status, headers, body) = within("slow stream", slow).await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, "slow done");
    assert!(
        !headers.contains_key(http::header::CONNECTION),
        "no Connection header on HTTP/2"
    );

    // GOAWAY: the server closes the connection once its streams are done — while still
    // Draining, long before stopped_accepting.
    within("old HTTP/2 connection closed", old_conn)
        .await
        .unwrap()
        .unwrap();
    assert!(
        is_phase(&drain, Phase::Draining),
        "GOAWAY only came at stopped_accepting"
    );
    assert!(
        send2(&mut old, "/conn").await.is_err(),
        "old connection still usable"
    );

    // The listener still accepts: a new connection is served.
    let (mut fresh, _fresh_conn) = h2(addr).await;
    let res = send2(&mut fresh, "/conn").await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_ne!(conn_header(res.headers()), old_id);
    assert!(is_phase(&drain, Phase::Draining));
    drop(fresh);

    let report = within("drain done", drain.drained()).await;
    assert_eq!(report.outcome, Outcome::Clean);
    assert_eq!(report.after_flip.new_connections, 1);
    assert_eq!(report.after_flip.requests_on_new_connections, 1);
    within("serve returns", server).await.unwrap();
}

#[tokio::test]
async fn accept_continues_while_draining() {
    let drain = drain(secs(6), Propagation::fixed(ms(2500)));
    let (addr, server) = start_serve(&drain, Probe::default()).await;

    assert!(drain.start(Trigger::Api));

    let (mut late, _late_conn) = h1(addr).await;
    let (status, headers, body) = text(send1(&mut late, "/conn").await).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, "ok");
    assert!(connection_close(&headers));

    let (mut late2, _late2_conn) = h2(addr).await;
    assert_eq!(
        send2(&mut late2, "/conn").await.unwrap().status(),
        StatusCode::OK
    );
    // Synchronisation point: both answers are in, and the drain has still not committed
    // (2.5 s after the trigger), so both connections were accepted while draining.
    assert!(is_phase(&drain, Phase::Draining));

    let report = within("drain done", drain.drained()).await;
    assert_eq!(report.outcome, Outcome::Clean);
    assert_eq!(report.after_flip.new_connections, 2);
    within("serve returns", server).await.unwrap();
}

#[tokio::test]
async fn after_flip_counters_match_new_and_reused_connections() {
    let drain = drain(secs(6), Propagation::fixed(ms(1500)));
    let (addr, server) = start_serve(&drain, Probe::default()).await;

    // Two pooled connections opened before the drain.
    let (mut a, _a_conn) = h1(addr).await;
    let (mut b, _b_conn) = h1(addr).await;
    for s in [&mut a, &mut b] {
        assert_eq!(text(send1(s, "/conn").await).await.0, StatusCode::OK);
    }

    assert!(drain.start(Trigger::Api));

    // One request on each pooled connection: reused.
    for s in [&mut a, &mut b] {
        let (status, headers, _) = text(send1(s, "/conn").await).await;
        assert_eq!(status, StatusCode::OK);
        assert!(connection_close(&headers));
    }
    // Three new HTTP/1.1 connections and one new HTTP/2 connection, one request each.
    for _ in 0..3 {
        let (mut n, _n_conn) = h1(addr).await;
        assert_eq!(text(send1(&mut n, "/conn").await).await.0, StatusCode::OK);
    }
    let (mut n2, _n2_conn) = h2(addr).await;
    assert_eq!(
        send2(&mut n2, "/conn").await.unwrap().status(),
        StatusCode::OK
    );
    assert!(
        is_phase(&drain, Phase::Draining),
        "test window: still draining"
    );

    let report = within("drain done", drain.drained()).await;
    let af = &report.after_flip;
    assert_eq!(af.new_connections, 4);
    assert_eq!(af.requests_on_new_connections, 4);
    assert_eq!(af.requests_on_reused_connections, 2);
    assert!(af.last_new_connection_ms.is_some());
    assert_eq!(af.peers.len(), 1);
    assert_eq!(af.peers[0].peer, "127.0.0.1");
    assert_eq!(af.peers[0].new_connections, 4);
    within("serve returns", server).await.unwrap();
}

#[tokio::test]
async fn quiesce_deadline_cuts_a_never_ending_stream_names_it_and_serve_returns() {
    // grace 4s → quiesce deadline ≈ 3.2s after the trigger.
    let drain = drain(secs(4), Propagation::fixed(ms(500)));
    // Naming a request that started before the trigger is opt-in.
    let (addr, server) = start_serve_describing(&drain, Probe::default()).await;

    let (mut c, c_conn) = h1(addr).await;
    let res = send1(&mut c, "/forever").await;
    assert_eq!(res.status(), StatusCode::OK);
    let mut body = res.into_body();
    assert!(next_chunk(&mut body).await.is_some());

    // The stream began before the trigger.
    assert!(drain.start(Trigger::Api));
    let reader = tokio::spawn(async move {
        let mut n = 0u32;
        loop {
            match body.frame().await {
                Some(Ok(_)) => n += 1,
                Some(Err(_)) => return (n, false),
                None => return (n, true),
            }
        }
    });

    let report = within("drain done", drain.drained()).await;
    assert_eq!(report.outcome, Outcome::DeadlineExceeded);
    assert_eq!(report.exit_code, 1);
    assert!(report
        .timeline
        .iter()
        .any(|e| e.event == EventKind::DeadlineExceeded));
    let straggler = report
        .stragglers
        .iter()
        .find(|s| s.kind == lameduck::report::StragglerKind::Request)
        .expect("the stream is named as a straggler");
    assert_eq!(straggler.name, "GET /forever");

    within("serve returns", server).await.unwrap();
    assert_eq!(drain.counts().connections(), 0);
    let (chunks_after_trigger, clean_end) = within("client sees the cut", reader).await.unwrap();
    assert!(
        chunks_after_trigger > 0,
        "the stream kept flowing while draining"
    );
    assert!(!clean_end, "the stream was cut, not ended");
    // The client's connection is gone too.
    let _ = within("client connection closed", c_conn).await.unwrap();
}

#[tokio::test]
async fn by_default_a_stream_from_before_the_trigger_is_an_undescribed_straggler() {
    // grace 4s → quiesce deadline ≈ 3.2s after the trigger.
    let drain = drain(secs(4), Propagation::fixed(ms(500)));
    let (addr, server) = start_serve(&drain, Probe::default()).await;

    let (mut c, _c_conn) = h1(addr).await;
    let mut before = send1(&mut c, "/forever").await.into_body();
    assert!(next_chunk(&mut before).await.is_some());
    assert!(drain.start(Trigger::Api));
    // One that arrives while draining is named from the request itself, with its peer.
    let (mut c2, _c2_conn) = h1(addr).await;
    let mut during = send1(&mut c2, "/forever").await.into_body();
    assert!(next_chunk(&mut during).await.is_some());
    let readers = tokio::spawn(async move {
        while next_chunk(&mut before).await.is_some() {}
        while next_chunk(&mut during).await.is_some() {}
    });

    let report = within("drain done", drain.drained()).await;
    assert_eq!(report.outcome, Outcome::DeadlineExceeded);
    let mut requests: Vec<_> = report
        .stragglers
        .iter()
        .filter(|s| s.kind == lameduck::report::StragglerKind::Request)
        .map(|s| (s.name.as_str(), s.peer.is_some()))
        .collect();
    requests.sort_unstable();
    assert_eq!(
        requests,
        [("(undescribed guard)", false), ("GET /forever", true)]
    );
    within("serve returns", server).await.unwrap();
    readers.abort();
}

#[tokio::test]
async fn refusal_mode_answers_503_with_retry_after_after_stop() {
    let drain = drain(secs(6), Propagation::fixed(ms(500)));
    let (listener, addr) = bind().await;
    let app = app(&drain, Probe::default())
        .layer(drain.layer().refuse_after_stop(Duration::from_millis(1500)));
    let server = tokio::spawn(
        lameduck::serve(listener, app, &drain)
            .keep_listening_after_stop()
            .conn_meta_on_every_request(),
    );

    // Something in flight keeps the drain in StoppedAccepting for a while.
    let slow = slow_request(&drain, addr, 2500).await;

    assert!(drain.start(Trigger::Api));
    // Before stopped_accepting: served.
    let (mut early, _early_conn) = h1(addr).await;
    assert_eq!(
        text(send1(&mut early, "/conn").await).await.0,
        StatusCode::OK
    );

    within(
        "stopped accepting",
        drain.moments().reached(Phase::StoppedAccepting),
    )
    .await;
    let (mut late, late_conn) = h1(addr).await;
    let (status, headers, _) = text(send1(&mut late, "/conn").await).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(headers.get(http::header::RETRY_AFTER).unwrap(), "2");
    assert!(connection_close(&headers));
    within("refused connection closed", late_conn)
        .await
        .unwrap()
        .unwrap();

    let (status, _, body) = within("slow request", slow).await.unwrap();
    assert_eq!((status, body.as_str()), (StatusCode::OK, "slow done"));
    drained_clean(&drain, server).await;
}

#[tokio::test]
async fn http2_connection_opened_during_the_drain_keeps_serving_until_stopped_accepting() {
    let drain = drain(secs(8), Propagation::fixed(ms(2500)));
    let (addr, server) = start_serve(&drain, Probe::default()).await;
    assert!(drain.start(Trigger::Api));

    // A client that still routes here opens a connection during the drain: every call goes on
    // that one connection, with no GOAWAY after the first (which would force a reconnect per
    // call), until stopped_accepting.
    let (mut late, late_conn) = h2(addr).await;
    let mut ids = Vec::new();
    for _ in 0..5 {
        let res = send2(&mut late, "/conn")
            .await
            .expect("served on the same connection");
        assert_eq!(res.status(), StatusCode::OK);
        ids.push(conn_header(res.headers()));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ids.windows(2).all(|w| w[0] == w[1]), "{ids:?}");
    assert!(is_phase(&drain, Phase::Draining));

    // At stopped_accepting it gets its GOAWAY and the connection ends.
    within("late HTTP/2 connection closed", late_conn)
        .await
        .unwrap()
        .unwrap();
    assert!(drain.phase() >= Phase::StoppedAccepting);
    let report = within("drain done", drain.drained()).await;
    assert_eq!(report.after_flip.new_connections, 1);
    assert_eq!(report.after_flip.requests_on_new_connections, 5);
    within("serve returns", server).await.unwrap();
}

/// Messages of the events emitted on this thread, for a synchronisation point.
#[derive(Clone, Default)]
struct Messages(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Messages {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Message<'a>(&'a mut String);
        impl tracing::field::Visit for Message<'_> {
            fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                if f.name() == "message" {
                    *self.0 = format!("{v:?}");
                }
            }
        }
        let mut m = String::new();
        event.record(&mut Message(&mut m));
        self.0.lock().unwrap().push(m);
    }
}

// Current-thread runtime: the accept loop's events reach this thread's subscriber.
#[tokio::test]
async fn at_the_connection_bound_serve_waits_and_accepts_once_a_connection_closes() {
    use tracing_subscriber::layer::SubscriberExt;

    let messages = Messages::default();
    let _default =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(messages.clone()));
    let drain = drain(secs(30), Propagation::fixed(ms(300)));
    let (listener, addr) = bind().await;
    let app = app(&drain, Probe::default()).layer(drain.layer());
    let server = tokio::spawn(
        lameduck::serve(listener, app, &drain)
            .max_connections(2)
            // The app reads `ConnMeta` on every request.
            .conn_meta_on_every_request(),
    );

    let (mut first, first_conn) = h1(addr).await;
    let (mut second, _second_conn) = h1(addr).await;
    for c in [&mut first, &mut second] {
        assert_eq!(text(send1(c, "/conn").await).await.0, StatusCode::OK);
    }
    // The synchronisation point: the accept loop says it waits for a connection to close.
    eventually("the bound reached", || {
        messages
            .0
            .lock()
            .unwrap()
            .iter()
            .any(|m| m.contains("connection bound reached"))
    })
    .await;
    assert_eq!(drain.counts().connections(), 2);

    // A third client connects (the kernel queues it) and is served once the first leaves.
    let (mut third, _third_conn) = h1(addr).await;
    let answer = tokio::spawn(async move { text(send1(&mut third, "/conn").await).await.0 });
    drop(first);
    within("first connection closed", first_conn)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        within("the third client's answer", answer).await.unwrap(),
        StatusCode::OK
    );
    assert_eq!(drain.counts().connections(), 2);

    assert!(drain.start(Trigger::Api));
    drop(second);
    drained_clean(&drain, server).await;
}

/// A stream that outlives the quiet window holds the commit, and the report says so: the
/// window held while it was in flight, the commit waited for it, and the evidence names it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_holds_the_commit_is_named_in_the_evidence() {
    // The fallback at once: the window holds 300 ms after the trigger (`min`), whatever the
    // arrival data says, so only the stream can hold the commit.
    let drain = drain(
        secs(20),
        Propagation::quiet(ms(200))
            .min(ms(300))
            .max(secs(10))
            .quiet_suffices_after(Duration::ZERO),
    );
    let (addr, server) = start_serve_describing(&drain, Probe::default()).await;

    // 20 chunks 100 ms apart: about 2 s, begun before the trigger.
    let (mut c, _c_conn) = h1(addr).await;
    let res = send1(&mut c, "/stream/20/100").await;
    assert_eq!(res.status(), StatusCode::OK);
    let mut body = res.into_body();
    assert!(next_chunk(&mut body).await.is_some());
    assert!(drain.start(Trigger::Api));
    let reader = tokio::spawn(async move {
        let mut n = 0u32;
        while next_chunk(&mut body).await.is_some() {
            n += 1;
        }
        n
    });

    let report = drained_clean(&drain, server).await;
    assert_eq!(within("the stream ends", reader).await.unwrap(), 19);
    let evidence = report.propagation.evidence.as_ref().expect("evidence");
    let hold = evidence
        .in_flight_hold
        .as_ref()
        .unwrap_or_else(|| panic!("the stream held the commit: {evidence:?}"));
    assert_eq!(hold.in_flight, 1, "{hold:?}");
    assert_eq!(hold.work.len(), 1, "{hold:?}");
    assert_eq!(hold.work[0].name, "GET /stream/20/100");
    assert!(hold.since_ms >= 300, "not before min: {hold:?}");
    // The stream had about 1.7 s left when the window held; the commit waited for it.
    assert!(hold.waited_ms >= 1000, "{hold:?}");
    let stopped = report.event(EventKind::StoppedAccepting).unwrap();
    assert!(
        stopped.at_ms >= hold.since_ms + hold.waited_ms,
        "{report:?}"
    );
    // The evidence line on the timeline says it too.
    let done = report.event(EventKind::PropagationDone).unwrap();
    let detail = done.detail.as_deref().unwrap_or_default();
    assert!(
        detail.contains("held")
            && detail.contains("by in-flight work")
            && detail.contains("GET /stream/20/100"),
        "{detail}"
    );
}

/// Requests that reach idle keep-alive connections just as the listener closes are answered,
/// not cut. hyper closes an idle HTTP/1 connection without reading from it, so a request whose
/// bytes were already in the socket — not yet seen by the runtime, or its close branch polled
/// first — was lost ("connection closed before message completed", once in 7,841 on the
/// testbed). Here a thread watches the drain's phase and writes a request on each of 32 idle
/// keep-alive connections the moment the drain stops accepting, before `serve` closes its idle
/// connections: every request written while its connection was still open must get its full
/// answer, with `Connection: close`. A connection the server had already closed when the
/// thread came to it (its FIN already here: a request still on the wire, which no server can
/// serve) is counted apart; a drain in which fewer than a quarter were still open is run
/// again (up to five).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_waiting_unread_when_the_listener_closes_is_answered() {
    const N: usize = 32;
    // On a loaded machine the server may close every idle connection before the thread comes
    // to them (nothing to test then): up to five drains, until one has a quarter written.
    for attempt in 1..=5 {
        let (written, answered, cut) = race_the_close(N).await;
        if written < N / 4 {
            println!("attempt {attempt}: only {written} of {N} still open when written; again");
            continue;
        }
        assert_eq!(
            answered,
            written,
            "requests cut at the close ({} of {N} closed before the thread came to them): \
             {cut:?}",
            N - written
        );
        return;
    }
    panic!("in five drains the server closed its idle connections before the thread wrote");
}

/// One drain of [`a_request_waiting_unread_when_the_listener_closes_is_answered`]: `n` idle
/// keep-alive connections, a request written on each one still open the moment the drain
/// stops accepting. Returns how many were written, how many of those were answered, and what
/// the others read instead.
async fn race_the_close(n: usize) -> (usize, usize, Vec<String>) {
    use std::io::Write;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const REQUEST: &[u8] = b"GET /conn HTTP/1.1\r\nhost: lameduck\r\n\r\n";
    let drain = drain(secs(6), Propagation::fixed(ms(300)));
    let (addr, server) = start_serve(&drain, Probe::default()).await;
    // Keep-alive connections, each with one request answered.
    let mut conns = Vec::new();
    for _ in 0..n {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(REQUEST).await.unwrap();
        let head = read_response(&mut s).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        conns.push(s.into_std().unwrap());
    }
    let d = drain.clone();
    let writer = std::thread::spawn(move || {
        // Bounded: 5 s of spinning at most.
        let until = std::time::Instant::now() + Duration::from_secs(5);
        while d.phase() < Phase::StoppedAccepting && std::time::Instant::now() < until {
            std::hint::spin_loop();
        }
        // Each connection: is the server's FIN already here? If not, the request goes out.
        let mut sent = Vec::new();
        for s in &mut conns {
            s.set_nonblocking(true).unwrap();
            let open = !matches!(s.peek(&mut [0u8]), Ok(0));
            if open {
                s.write_all(REQUEST).unwrap();
            }
            sent.push(open);
        }
        (conns, sent)
    });
    assert!(drain.start(Trigger::Api));
    let (conns, sent) = tokio::task::spawn_blocking(move || writer.join().unwrap())
        .await
        .unwrap();
    let written = sent.iter().filter(|&&open| open).count();
    let mut answered = 0;
    let mut cut = Vec::new();
    for (s, open) in conns.into_iter().zip(sent) {
        if !open {
            continue;
        }
        let mut s = tokio::net::TcpStream::from_std(s).unwrap();
        let head = within("an answer", read_response(&mut s)).await;
        let close = head.to_ascii_lowercase().contains("connection: close");
        if head.starts_with("HTTP/1.1 200") && close {
            answered += 1;
            // Closed after the answer.
            let mut rest = Vec::new();
            let _ = within("the close", s.read_to_end(&mut rest)).await;
        } else {
            cut.push(head);
        }
    }
    drained_clean(&drain, server).await;
    (written, answered, cut)
}

/// One HTTP/1.1 response's head and body (by `content-length`), as text; what was read
/// before the connection ended, if it ended first.
async fn read_response(s: &mut tokio::net::TcpStream) -> String {
    use tokio::io::AsyncReadExt;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&buf).into_owned();
        if let Some(end) = text.find("\r\n\r\n") {
            let len = text[..end]
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse::<usize>().ok())?
                })
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                return text;
            }
        }
        match s.read(&mut chunk).await {
            Ok(0) => return format!("ended after {:?}", text),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) => return format!("{e} after {:?}", text),
        }
    }
}

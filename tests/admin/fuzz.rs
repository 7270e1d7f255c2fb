//! Input the router must refuse without changing state: a table of known-bad requests, and a
//! bounded, seeded random loop (`LAMEDUCK_FUZZ_SEED` changes the seed).

use bytes::Bytes;
use http::{Method, StatusCode};
use http_body_util::{BodyExt, Full};
use lameduck::{EventKind, Phase};

use crate::common::{event_count, Rng};
use crate::{
    drain_call, empty, get, request, send, serve_with_token, serving, Chunked, ReqBody, TOKEN,
};

#[tokio::test]
async fn bad_input_is_refused_and_changes_nothing() {
    let drain = serving();
    let addr = serve_with_token(&drain).await;
    let auth = format!("Bearer {TOKEN}");
    let big = || Full::new(Bytes::from(vec![b'x'; 2048])).boxed();
    // (method, target, authorized, body, expected status, text the answer must contain)
    type Case = (
        Method,
        &'static str,
        bool,
        fn() -> ReqBody,
        u16,
        &'static str,
    );
    let none: fn() -> ReqBody = empty;
    // A table reads best one case per line.
    #[rustfmt::skip]
    let cases: Vec<Case> = vec![
        (Method::GET, "/", true, none, 404, "/livez"),
        (Method::GET, "/nope", true, none, 404, "/nope"),
        (Method::GET, "/livez/", true, none, 404, ""),
        (Method::GET, "/DRAIN", true, none, 404, ""),
        (Method::GET, "/drain/now", true, none, 404, ""),
        (Method::PUT, "/drain", true, none, 405, "GET, POST"),
        (Method::HEAD, "/drain", true, none, 405, ""),
        (Method::DELETE, "/drain", true, none, 405, "GET, POST"),
        (Method::DELETE, "/livez", false, none, 405, "GET, HEAD"),
        (Method::POST, "/readyz", false, none, 405, "GET, HEAD"),
        (Method::OPTIONS, "/status", false, none, 405, "GET, HEAD"),
        (Method::GET, "/drain?wait=none", false, none, 401, "missing bearer token"),
        (Method::GET, "/drain?foo=1", true, none, 400, "`foo`"),
        (Method::GET, "/drain?Wait=none", true, none, 400, "`Wait`"),
        (Method::GET, "/drain?wait=soon", true, none, 400, "`wait`"),
        (Method::GET, "/drain?wait=", true, none, 400, "`wait`"),
        (Method::GET, "/drain?wait", true, none, 400, "`wait`"),
        (Method::GET, "/drain?wait=Drained", true, none, 400, "`wait`"),
        (Method::GET, "/drain?timeout=", true, none, 400, "`timeout`"),
        (Method::GET, "/drain?timeout=soon", true, none, 400, "`timeout`"),
        (Method::GET, "/drain?timeout=-1s", true, none, 400, "`timeout`"),
        (Method::GET, "/drain?timeout=5parsecs", true, none, 400, "`timeout`"),
        (Method::GET, "/drain?timeout=99999999999999999999999999999999999999s", true, none, 400, "`timeout`"),
        (Method::GET, "/drain?wait=none&wait=none", true, none, 400, "duplicate"),
        (Method::GET, "/drain?wait=none&wait=drained", true, none, 400, "duplicate"),
        (Method::GET, "/drain?wait=none&timeout=1s&timeout=2s", true, none, 400, "duplicate"),
        (Method::GET, "/drain?=none", true, none, 400, "empty parameter name"),
        (Method::GET, "/drain?wait=%zz", true, none, 400, "`wait`"),
        (Method::GET, "/drain?wait=none%0D%0AX:1", true, none, 400, "`wait`"),
        (Method::GET, "/readyz?verbose=maybe", false, none, 400, "`verbose`"),
        (Method::GET, "/readyz?x", false, none, 400, "`x`"),
        (Method::GET, "/livez?verbose&verbose", false, none, 400, "duplicate"),
        (Method::GET, "/status?pretty", false, none, 400, "takes no parameters"),
        (Method::POST, "/drain?wait=none", true, big, 413, "1024 bytes"),
        (Method::GET, "/livez", false, big, 413, "1024 bytes"),
        (Method::POST, "/drain?wait=none", true, || Chunked(4096).boxed(), 413, "1024 bytes"),
        (Method::POST, "/drain?wait=none", false, big, 413, ""),
    ];
    for (method, target, authorized, body, want, needle) in cases {
        let mut req = request(method.clone(), addr, target);
        if authorized {
            req = req.header("authorization", &auth);
        }
        let a = send(addr, req.body(body()).unwrap()).await;
        assert_eq!(a.status.as_u16(), want, "{method} {target}: {}", a.body);
        assert!(a.body.contains(needle), "{method} {target}: {:?}", a.body);
        assert!(!a.body.trim_end().contains('\n'), "one line: {:?}", a.body);
        if want == 405 {
            assert!(a.headers.contains_key("allow"), "{method} {target}");
        }
        assert_eq!(drain.phase(), Phase::Serving, "{method} {target}");
        assert!(drain.moments().timeline().is_empty(), "{method} {target}");
        let r = get(addr, "/readyz").await;
        assert_eq!(r.status, StatusCode::OK, "{method} {target}");
    }
    // Empty segments are ignored, so this one is valid — and it is the only drain.
    let a = drain_call(addr, "/drain?wait=none&&").await;
    assert_eq!(a.status, StatusCode::ACCEPTED, "{}", a.body);
    drain.drained().await;
    assert_eq!(event_count(&drain, EventKind::DrainStarted), 1);
}

#[tokio::test]
async fn random_requests_never_fail_the_server_nor_change_state() {
    let seed = std::env::var("LAMEDUCK_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x1a4e_d0c5_eed5_u64);
    let mut rng = Rng(seed | 1);
    let drain = serving();
    let addr = serve_with_token(&drain).await;

    let methods = [
        "GET", "GET", "GET", "POST", "POST", "HEAD", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE",
        "PURGE", "get", "BREW",
    ];
    let paths = [
        "/",
        "/livez",
        "/readyz",
        "/drain",
        "/drain",
        "/drain",
        "/status",
        "/livez/",
        "/drain/",
        "//drain",
        "/drain/x",
        "/DRAIN",
        "/%64rain",
        "/readyz/verbose",
        "/metrics",
        "/drain.json",
    ];
    let keys = [
        "wait",
        "wait",
        "timeout",
        "timeout",
        "verbose",
        "foo",
        "",
        "WAIT",
        "w%61it",
        "wait%00",
        "timeout%20",
    ];
    let values = [
        "none",
        "propagated",
        "drained",
        "",
        "1s",
        "0",
        "250ms",
        "soon",
        "%zz",
        "%",
        "-1",
        "99999999999999999999",
        "true",
        "1",
        "%E2%9C%93",
        "none%0Anone",
        "+",
    ];
    let auths = [
        "Bearer s3cr3t-t0ken",
        "bearer s3cr3t-t0ken",
        "Bearer wrong",
        "Basic czNjcjN0",
        "Bearer",
        "Bearer s3cr3t-t0ken extra",
        "s3cr3t-t0ken",
    ];

    let mut codes = std::collections::BTreeMap::<u16, usize>::new();
    let rounds = 1500;
    let mut sent = 0;
    for round in 0..rounds {
        let method = rng.pick(&methods);
        let path = if rng.chance(15) {
            format!("/{}", rng.word())
        } else {
            rng.pick(&paths).to_owned()
        };
        let mut query = Vec::new();
        for _ in 0..rng.below(4) {
            let key = if rng.chance(10) {
                rng.word()
            } else {
                rng.pick(&keys).to_owned()
            };
            let value = if rng.chance(10) {
                rng.word()
            } else {
                rng.pick(&values).to_owned()
            };
            query.push(match rng.below(4) {
                0 => key,
                _ => format!("{key}={value}"),
            });
        }
        let mut auth_headers = Vec::new();
        for _ in 0..rng.below(3) {
            auth_headers.push(rng.pick(&auths));
        }
        let body_len = match rng.below(10) {
            0 => 2048,
            1 => 16,
            _ => 0,
        };

        // A request that could pass every check would legitimately start the drain; give it a
        // parameter nobody knows, so it must be refused after auth and before the drain.
        let right = |a: &&str| a.eq_ignore_ascii_case("bearer s3cr3t-t0ken");
        let maybe_valid = matches!(method, "GET" | "POST")
            && path.to_ascii_lowercase().contains("rain")
            && auth_headers.len() == 1
            && auth_headers.iter().any(right)
            && body_len <= 1024;
        if maybe_valid {
            query.push("fuzz-unknown=1".to_owned());
        }
        let target = if query.is_empty() && rng.chance(50) {
            path.clone()
        } else {
            format!(
                "{path}?{}",
                query.join(if rng.chance(10) { "&&" } else { "&" })
            )
        };

        let mut req = request(
            Method::from_bytes(method.as_bytes()).unwrap(),
            addr,
            &target,
        );
        for a in &auth_headers {
            req = req.header("authorization", *a);
        }
        if rng.chance(20) {
            req = req.header("x-fuzz", rng.word());
        }
        if rng.chance(10) {
            req = req.header(
                "content-type",
                rng.pick(&["application/json", "text/plain", "x/y"]),
            );
        }
        let body = if body_len > 0 && rng.chance(50) {
            // Set explicitly: a client sends no body on a GET of unknown length otherwise.
            req = req.header("transfer-encoding", "chunked");
            Chunked(body_len).boxed()
        } else if body_len > 0 {
            Full::new(Bytes::from(vec![b'x'; body_len])).boxed()
        } else {
            empty()
        };
        let Ok(req) = req.body(body) else {
            continue; // not a valid URI: the client cannot even send it
        };
        let a = send(addr, req).await;
        sent += 1;
        let code = a.status.as_u16();
        *codes.entry(code).or_default() += 1;
        assert!(
            matches!(code, 200 | 400 | 401 | 404 | 405 | 413),
            "round {round} (seed {seed:#x}): {method} {target} {auth_headers:?} body {body_len} -> {code}: {}",
            a.body
        );
        if maybe_valid {
            assert_ne!(code, 200, "round {round}: {method} {target}");
        }
        assert_eq!(
            drain.phase(),
            Phase::Serving,
            "round {round}: {method} {target} {auth_headers:?} {body_len} -> {code}"
        );
        assert!(
            drain.moments().timeline().is_empty(),
            "round {round}: {method} {target}"
        );
    }
    assert!(
        sent > rounds * 9 / 10,
        "only {sent} of {rounds} requests could be sent"
    );
    // The loop reached every kind of refusal, not just one.
    for code in [200, 400, 401, 404, 405, 413] {
        assert!(codes.contains_key(&code), "no {code} in {codes:?}");
    }
    assert_eq!(get(addr, "/readyz").await.status, StatusCode::OK);
}

//! The bearer token on `/drain`: required, compared exactly, failing closed when unusable, and
//! read from the environment by default.

use http::{Method, StatusCode};
use lameduck::admin::{prestop, PrestopOptions};
use lameduck::Phase;

use crate::{drain_call, empty, get, request, send, serve, serve_with_token, serving, TOKEN};
use lameduck::AdminBuilder;

#[tokio::test]
async fn token_is_required_accepted_and_rejected() {
    let drain = serving();
    let addr = serve_with_token(&drain).await;
    let right = format!("Bearer {TOKEN}");
    let refused: Vec<Vec<String>> = vec![
        vec![],
        vec!["Bearer wrong-token".into()],
        vec![format!("Bearer {TOKEN}x")],
        vec![format!("Basic {TOKEN}")],
        vec!["Bearer".into()],
        vec![TOKEN.into()],
        vec![right.clone(), right.clone()],
    ];
    for headers in refused {
        let mut req = request(Method::GET, addr, "/drain?wait=none");
        for v in &headers {
            req = req.header("authorization", v);
        }
        let a = send(addr, req.body(empty()).unwrap()).await;
        assert_eq!(
            a.status,
            StatusCode::UNAUTHORIZED,
            "{headers:?}: {}",
            a.body
        );
        assert_eq!(
            a.headers["www-authenticate"],
            "Bearer realm=\"lameduck-admin\""
        );
        assert_eq!(drain.phase(), Phase::Serving, "{headers:?}");
        assert!(drain.moments().timeline().is_empty());
    }
    // Probes and status need no token.
    assert_eq!(get(addr, "/livez").await.status, StatusCode::OK);
    assert_eq!(get(addr, "/readyz").await.status, StatusCode::OK);
    assert_eq!(get(addr, "/status").await.status, StatusCode::OK);

    let a = drain_call(addr, "/drain?wait=none").await;
    assert_eq!(a.status, StatusCode::ACCEPTED);
    drain.drained().await;
}

#[tokio::test]
async fn a_token_no_request_could_carry_is_refused_by_the_builder() {
    let drain = serving();
    for (token, what) in [
        ("  ", "is empty"),
        ("s3cr3t t0ken", "holds a space at character 7"),
        ("s3cr3t\tt0ken", "holds a tab at character 7"),
        ("s3crét-t0ken", "holds a non-ASCII character at character 5"),
    ] {
        let e = AdminBuilder::new(&drain).token(token).unwrap_err();
        let said = e.to_string();
        assert!(e.is_parse(), "{token:?}: {said}");
        assert!(
            said.starts_with(&format!("the admin token {what}: ")) && said.contains("not shown"),
            "{token:?}: {said}"
        );
        for part in ["s3cr", "t0ken"] {
            assert!(
                !said.contains(part),
                "{token:?}: the error shows the token: {said}"
            );
        }
    }
    assert_eq!(drain.phase(), Phase::Serving);
}

/// The router and the bundled `preStop` client accept the same tokens: at the edges of the
/// rule (every visible ASCII punctuation, the longest), what one takes the other sends.
#[tokio::test]
async fn the_router_and_the_prestop_client_agree_on_every_accepted_token() {
    let longest = "x".repeat(4096);
    for token in [
        "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
        "a",
        longest.as_str(),
        "  padded-by-a-secret-file\n",
    ] {
        let drain = serving();
        let addr = serve(AdminBuilder::new(&drain).token(token).unwrap().router()).await;
        let options = PrestopOptions {
            token: Some(token.to_owned()),
            wait: lameduck::admin::Wait::None,
            timeout: None,
        };
        let status = prestop(addr, options)
            .await
            .unwrap_or_else(|e| panic!("{} bytes: {e}", token.len()));
        assert!(status.phase >= Phase::Draining, "{}", token.len());
    }
    // Over the longest, both refuse: the builder, and the client before it sends anything.
    let drain = serving();
    let longer = "x".repeat(4097);
    assert!(AdminBuilder::new(&drain).token(longer.as_str()).is_err());
    let addr = serve_with_token(&drain).await;
    let options = PrestopOptions {
        token: Some(longer),
        ..PrestopOptions::default()
    };
    let e = prestop(addr, options).await.unwrap_err();
    assert!(e.to_string().contains("4097 characters long"), "{e}");
    assert_eq!(drain.phase(), Phase::Serving);
}

#[tokio::test]
async fn token_defaults_to_the_environment() {
    // The only test that touches this variable; every other router sets its token explicitly.
    std::env::set_var(lameduck::admin::ADMIN_TOKEN_ENV, format!("  {TOKEN}\n"));
    let drain = serving();
    let addr = serve(AdminBuilder::new(&drain).router()).await;
    let options = PrestopOptions::from_env();
    std::env::remove_var(lameduck::admin::ADMIN_TOKEN_ENV);
    assert_eq!(options.token.as_deref(), Some(TOKEN));

    assert_eq!(get(addr, "/drain").await.status, StatusCode::UNAUTHORIZED);
    assert_eq!(drain.phase(), Phase::Serving);
    let status = prestop(addr, options).await.unwrap();
    assert_eq!(status.phase, Phase::Done);
}

/// Set in the child that [`an_admin_token_no_request_could_carry_is_refused_at_build`] runs.
const BUILD_CHILD_ENV: &str = "LAMEDUCK_TOKEN_BUILD_CHILD";

/// A token in `LAMEDUCK_ADMIN_TOKEN` that the preStop client could never send (a space, a
/// tab, a non-ASCII character) stops the process at startup, with an error that names the
/// variable and what is wrong, never the value. Each case runs in a child process: the
/// environment is the process's, and the other tests build coordinators meanwhile.
#[test]
fn an_admin_token_no_request_could_carry_is_refused_at_build() {
    if std::env::var_os(BUILD_CHILD_ENV).is_some() {
        match crate::builder().build() {
            Ok(_) => println!("BUILT"),
            Err(e) => println!("REFUSED: {e}"),
        }
        return;
    }
    use std::os::unix::ffi::OsStrExt as _;
    let cases: [(&std::ffi::OsStr, &str); 5] = [
        ("s3cr3t t0ken".as_ref(), "holds a space"),
        ("s3cr3t\tt0ken".as_ref(), "holds a tab"),
        ("s3cr3t\nt0ken".as_ref(), "holds a line break"),
        ("s3crét-t0ken".as_ref(), "holds a non-ASCII character"),
        (
            std::ffi::OsStr::from_bytes(b"s3cr\xff-t0ken"),
            "is not valid UTF-8",
        ),
    ];
    for (token, what) in cases {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "token::an_admin_token_no_request_could_carry_is_refused_at_build",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(BUILD_CHILD_ENV, "1")
            .env(lameduck::admin::ADMIN_TOKEN_ENV, token)
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stdout);
        // The harness prints the test's name on the same line, before the child's words.
        let line = said
            .lines()
            .find_map(|l| {
                let at = l.find("REFUSED: ").or_else(|| l.find("BUILT"))?;
                Some(&l[at..])
            })
            .unwrap_or_else(|| panic!("{token:?}: the child said nothing: {said}"));
        assert!(
            line.starts_with(&format!("REFUSED: LAMEDUCK_ADMIN_TOKEN {what}")),
            "{token:?}: {line}"
        );
        assert!(
            line.contains("visible ASCII") && line.contains("not shown"),
            "{token:?}: {line}"
        );
        for part in ["s3cr", "t0ken"] {
            assert!(
                !line.contains(part),
                "{token:?}: the error shows the token: {line}"
            );
        }
    }
}

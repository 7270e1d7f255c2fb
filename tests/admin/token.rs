//! The bearer token on `/drain`: required, compared exactly, failing closed when unusable, and
//! read from the environment by default.

use http::{Method, StatusCode};
use lameduck::admin::{prestop, PrestopOptions};
use lameduck::Phase;

use crate::{drain_call, empty, get, request, send, serve, serve_with_token, serving, TOKEN};

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
async fn unusable_token_fails_closed() {
    let drain = serving();
    let addr = serve(drain.admin().token("  ").router()).await;
    let a = get(addr, "/drain?wait=none").await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);
    assert!(a.body.contains("unusable"), "{}", a.body);
    assert_eq!(drain.phase(), Phase::Serving);
}

#[tokio::test]
async fn token_defaults_to_the_environment() {
    // The only test that touches this variable; every other router sets its token explicitly.
    std::env::set_var(lameduck::admin::ADMIN_TOKEN_ENV, format!("  {TOKEN}\n"));
    let drain = serving();
    let addr = serve(drain.admin().router()).await;
    let options = PrestopOptions::from_env();
    std::env::remove_var(lameduck::admin::ADMIN_TOKEN_ENV);
    assert_eq!(options.token.as_deref(), Some(TOKEN));

    assert_eq!(get(addr, "/drain").await.status, StatusCode::UNAUTHORIZED);
    assert_eq!(drain.phase(), Phase::Serving);
    let status = prestop(addr, options).await.unwrap();
    assert_eq!(status.phase, Phase::Done);
}

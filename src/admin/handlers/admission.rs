//! Admission, shared by every admin route: the bearer token, the method, the body (bounded in
//! size and time), and the refusals they answer with.

use super::*;

pub(in crate::admin) enum Token {
    Open,
    Required(Box<[u8]>),
    /// Set but unusable: `/drain` is refused (fail closed) with this reason.
    Invalid(String),
}

impl Token {
    /// The token to require, or why `/drain` is refused: the rule the `preStop` client sends
    /// by ([`crate::vocab::token`]).
    pub(in crate::admin) fn from_setting(raw: &str, source: &str) -> Token {
        match crate::vocab::token::check(raw) {
            Ok(t) => Token::Required(t.as_bytes().into()),
            Err(problem) => Token::Invalid(format!("{source} {problem}")),
        }
    }
}

pub(in crate::admin) struct AdminState {
    pub(in crate::admin) drain: Drain,
    /// What the handlers reach beyond the public handle.
    pub(in crate::admin) seam: AdminSeam,
    pub(in crate::admin) token: Token,
    pub(in crate::admin) body_limit: usize,
    /// How long `/drain` waits for its request body; past it, `408`.
    pub(in crate::admin) body_read_timeout: Duration,
    #[cfg(feature = "prometheus")]
    pub(in crate::admin) prometheus: Option<metrics_exporter_prometheus::PrometheusHandle>,
}

pub(in crate::admin) type HandlerOutcome = Result<Response, AdminRefusal>;

/// A request refused before anything changed: a 4xx with a one-line message.
#[derive(Debug)]
pub(in crate::admin) enum AdminRefusal {
    NotAllowed {
        message: String,
        allow: &'static str,
    },
    TooLarge(String),
    /// The request body did not arrive in time.
    BodyTimeout(String),
    Unauthorized(String),
    BadRequest(String),
}

impl IntoResponse for AdminRefusal {
    fn into_response(self) -> Response {
        match self {
            AdminRefusal::NotAllowed { message, allow } => {
                let mut res = text(StatusCode::METHOD_NOT_ALLOWED, message);
                res.headers_mut()
                    .insert(header::ALLOW, HeaderValue::from_static(allow));
                res
            }
            AdminRefusal::TooLarge(message) => text(StatusCode::PAYLOAD_TOO_LARGE, message),
            AdminRefusal::BodyTimeout(message) => {
                let mut res = text(StatusCode::REQUEST_TIMEOUT, message);
                // The rest of the body may still come: the connection cannot be reused.
                res.headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
                res
            }
            AdminRefusal::Unauthorized(message) => {
                let mut res = text(StatusCode::UNAUTHORIZED, message);
                res.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer realm=\"lameduck-admin\""),
                );
                res
            }
            AdminRefusal::BadRequest(message) => text(StatusCode::BAD_REQUEST, message),
        }
    }
}

/// What a route does with a request body.
#[derive(Clone, Copy)]
pub(super) enum BodyUse {
    /// Never read: probes answer at once, whatever the client is still sending (kubelet sends
    /// no body; a client that announces one and never sends it must not delay the answer).
    /// A declared length over the limit is still refused.
    Ignore,
    /// Read and dropped, bounded in size and time (`/drain`, which changes state: a request
    /// that does not arrive in full is refused, not acted upon).
    Read,
}

impl AdminState {
    /// Method and body checks shared by every route; returns the request head.
    pub(super) async fn admit(
        &self,
        req: Request,
        route: &str,
        allowed: &[Method],
        allow: &'static str,
        body_use: BodyUse,
    ) -> Result<Parts, AdminRefusal> {
        let (parts, body) = req.into_parts();
        if !allowed.contains(&parts.method) {
            return Err(AdminRefusal::NotAllowed {
                message: format!(
                    "method {} is not allowed on {route}: use {allow}",
                    shorten(parts.method.as_str())
                ),
                allow,
            });
        }
        if body.size_hint().lower() > self.body_limit as u64 {
            return Err(self.too_large());
        }
        match body_use {
            // Dropped unread: hyper answers, then closes the connection instead of reading on.
            BodyUse::Ignore => drop(body),
            BodyUse::Read => self.read_body(body).await?,
        }
        Ok(parts)
    }

    pub(super) fn too_large(&self) -> AdminRefusal {
        AdminRefusal::TooLarge(format!(
            "request body over the admin limit of {} bytes: \
             admin routes take no body, parameters go in the query string",
            self.body_limit
        ))
    }

    /// Reads and drops the body, refusing it past the size limit or when it has not arrived
    /// within the body-read timeout.
    pub(super) async fn read_body(&self, body: Body) -> Result<(), AdminRefusal> {
        let read = Limited::new(body, self.body_limit).collect();
        match tokio::time::timeout(self.body_read_timeout, read).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => Err(self.too_large()),
            Ok(Err(_)) => Err(bad_request("could not read the request body")),
            Err(_) => Err(AdminRefusal::BodyTimeout(format!(
                "the request body did not arrive within {} ms: \
                 admin routes take no body, send none",
                self.body_read_timeout.as_millis()
            ))),
        }
    }

    pub(super) fn authorize(&self, headers: &HeaderMap) -> Result<(), AdminRefusal> {
        let expected = match &self.token {
            Token::Open => return Ok(()),
            Token::Invalid(why) => {
                return Err(unauthorized(format!(
                    "the admin token is unusable ({why}): fix {ADMIN_TOKEN_ENV} or the builder's \
                     token; /drain is refused until then"
                )))
            }
            Token::Required(t) => t,
        };
        let mut values = headers.get_all(header::AUTHORIZATION).iter();
        let value = match (values.next(), values.next()) {
            (Some(v), None) => v,
            (None, _) => {
                return Err(unauthorized(
                    "missing bearer token: send `Authorization: Bearer <token>` \
                     (the value of LAMEDUCK_ADMIN_TOKEN)",
                ))
            }
            (Some(_), Some(_)) => {
                return Err(unauthorized(
                    "more than one Authorization header: send exactly one",
                ))
            }
        };
        match bearer(value.as_bytes()) {
            Some(given) if constant_time_eq(given, expected) => Ok(()),
            Some(_) => Err(unauthorized("wrong bearer token")),
            None => Err(unauthorized(
                "the Authorization header is not `Bearer <token>`",
            )),
        }
    }
}

/// The token of a `Bearer <token>` credential (scheme case-insensitive, per RFC 9110).
pub(super) fn bearer(value: &[u8]) -> Option<&[u8]> {
    let space = value.iter().position(|b| *b == b' ')?;
    let (scheme, rest) = value.split_at(space);
    if !scheme.eq_ignore_ascii_case(b"bearer") {
        return None;
    }
    let token = rest.trim_ascii();
    (!token.is_empty()).then_some(token)
}

/// Compares without an early exit, so the time taken does not tell how much of a guess was
/// right. (The length is not secret enough to hide.)
pub(super) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

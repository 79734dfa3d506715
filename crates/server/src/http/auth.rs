//! Who a request is, and whether the route it asks for is theirs to use.
//!
//! Credentials come in the `Authorization` header, `Basic` (user and password) or `Bearer` (a
//! token from `CREATE TOKEN`, or a JWT), or, for a browser's `EventSource` and `WebSocket`,
//! which cannot set headers, as an `access_token` query parameter. Over HTTPS with client CAs,
//! a request without these logs in as the user its connection's verified client certificate
//! names. A request with none is anonymous: while
//! no user is defined it may do everything, as before there were users; after, what `PUBLIC`
//! is granted.
//!
//! Each route reads or writes one object its path names, so the check is made here, once, by
//! route and method: `GET /streams/{s}` reads stream `s`, `POST` writes it, `PUT /tables/{t}/…`
//! writes table `t`. `/sql` checks each statement; `/metrics` is for superusers; `/healthz`
//! and `/mqtt` (whose CONNECT carries its own credentials) are open. Subscriptions opened over
//! a WebSocket after the first are checked when they open (`Engine::open_subscription`).

use axum::extract::{MatchedPath, Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use onehop_engine::{EngineError, ObjectKind, Principal, Privilege};

use super::AppState;
use super::error::ApiError;

/// The query parameter a browser passes its token in; never taken for a filter.
pub const ACCESS_TOKEN_PARAMETER: &str = "access_token";
/// The `WWW-Authenticate` challenge of a 401: both schemes onehop takes.
pub const CHALLENGE: &str = "Basic realm=\"onehop\", Bearer realm=\"onehop\"";

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.as_millis() as u64)
}

fn malformed(message: &str) -> ApiError {
    ApiError {
        retry_after_s: None,
        hint: Some("send Authorization: Basic base64(user:password) or Authorization: Bearer <token>".into()),
        status: StatusCode::UNAUTHORIZED,
        code: "unauthenticated",
        message: message.into(),
    }
}

/// What a request presents, taken out of it before any wait (a request is not `Sync`).
#[derive(Debug, PartialEq, Eq)]
pub enum Credentials {
    None,
    Token(String),
    Password {
        user: String,
        password: String,
    },
    /// The common name of the connection's verified client certificate.
    Certificate(String),
}

/// The credentials an `Authorization` header's value holds: `Basic base64(user:password)`
/// or `Bearer token` (schemes in any case, as RFC 9110 has them).
pub fn parse_authorization(value: &[u8]) -> Result<Credentials, ApiError> {
    let value = std::str::from_utf8(value).map_err(|_| malformed("the Authorization header is not text"))?;
    let (scheme, credentials) = value.split_once(' ').unwrap_or((value, ""));
    let credentials = credentials.trim();
    if scheme.eq_ignore_ascii_case("bearer") {
        return Ok(Credentials::Token(credentials.to_string()));
    }
    if scheme.eq_ignore_ascii_case("basic") {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(credentials)
            .ok()
            .and_then(|bytes| String::from_utf8(bytes).ok())
            .ok_or_else(|| malformed("Basic credentials must be base64 of user:password in UTF-8"))?;
        let (user, password) =
            decoded.split_once(':').ok_or_else(|| malformed("Basic credentials must be user:password"))?;
        return Ok(Credentials::Password { user: user.to_string(), password: password.to_string() });
    }
    let scheme: String = scheme.chars().take(32).collect();
    Err(malformed(&format!("unknown Authorization scheme {scheme:?}")))
}

fn credentials_of(request: &Request) -> Result<Credentials, ApiError> {
    if let Some(value) = request.headers().get(header::AUTHORIZATION) {
        return parse_authorization(value.as_bytes());
    }
    let token = request.uri().query().and_then(|query| {
        query.split('&').find_map(|pair| pair.strip_prefix(ACCESS_TOKEN_PARAMETER)?.strip_prefix('='))
    });
    // Tokens are letters, digits, `_` (and `-`, `.` in a JWT): nothing to percent-decode.
    if let Some(token) = token {
        return Ok(Credentials::Token(token.to_string()));
    }
    Ok(match request.extensions().get::<crate::tls::VerifiedClient>() {
        Some(verified) => Credentials::Certificate(verified.0.to_string()),
        None => Credentials::None,
    })
}

/// The principal `credentials` stand for, once checked; failed passwords are counted against
/// `source`, the client's address.
async fn principal_of(
    state: &AppState,
    credentials: Credentials,
    source: Option<std::net::IpAddr>,
) -> Result<Principal, ApiError> {
    let access = state.engine.access();
    let refused = |user: Option<&str>, error: EngineError| {
        crate::access::login_failed("http", user, &error.message());
        ApiError::from(error)
    };
    match credentials {
        Credentials::None => Ok(access.anonymous()),
        Credentials::Token(token) => access.login_token(&token, now_ms()).map_err(|error| refused(None, error)),
        Credentials::Password { user, password } => {
            access.login_password(&user, password.as_bytes(), source).await.map_err(|error| refused(Some(&user), error))
        }
        Credentials::Certificate(user) => access.login_certificate(&user).map_err(|error| refused(Some(&user), error)),
    }
}

/// The `subject` parameter of a query, decoded as the handlers decode it.
fn subject_of(query: Option<&str>) -> Result<Option<String>, ApiError> {
    let Some(query) = query else { return Ok(None) };
    Ok(super::query::pairs(query)?.into_iter().find_map(|(name, value)| (name == "subject").then_some(value)))
}

/// What a route reads or writes, from its template and the request's path, method and query.
/// On a stream, a topic grant stands in for a stream grant when the query names a subject it
/// covers: a read or subscription whose subject filter it covers, a write of one subject it
/// matches (the handlers then keep to that subject).
fn route_check(
    state: &AppState,
    principal: &Principal,
    template: &str,
    path: &str,
    method: &Method,
    query: Option<&str>,
) -> Result<(), ApiError> {
    let access = state.engine.access();
    match template {
        "/streams/{stream}" | "/tables/{table}" | "/tables/{table}/{id}" | "/views/{view}" | "/views/{view}/{key}" => {
            let target = super::subscribe::target_of_path(path)?;
            let (kind, name) = target.object();
            let reads = matches!(*method, Method::GET | Method::HEAD);
            let privilege = if reads { Privilege::Read } else { Privilege::Write };
            let refused = match access.authorize(principal, privilege, kind, name) {
                Ok(()) => return Ok(()),
                Err(refused) => refused,
            };
            let subject = match kind {
                ObjectKind::Stream => subject_of(query)?,
                _ => None,
            };
            let allowed = subject.is_some_and(|subject| match reads {
                true => access.authorize_subscription(principal, kind, name, Some(&subject)).is_ok(),
                false => access.authorize_subject(principal, privilege, name, &subject).is_ok(),
            });
            if !allowed {
                return Err(refused.into());
            }
        }
        "/metrics" => access.authorize_superuser(principal, "read the metrics")?,
        "/cluster" => access.authorize_superuser(principal, "read the cluster's state")?,
        "/cluster/nodes" | "/cluster/nodes/{id}" => {
            access.authorize_superuser(principal, "change the cluster's members")?
        }
        _ => {}
    }
    Ok(())
}

/// The most of a refused request's body read before the refusal is sent.
const REFUSED_BODY_BYTES_MAX: usize = 64 * 1024;
/// How long a refused request's body may take to arrive before the refusal goes anyway.
const REFUSED_BODY_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Reads (and drops) a refused request's body when it is small, before the refusal is sent.
/// Over HTTP/2 a response sent while the client is still sending its body ends with a
/// RST_STREAM(NO_ERROR) after it, as RFC 9113 §8.1 allows; some clients (curl 7.88, which
/// Debian 12 ships) report that as a failed request instead of the 401 or 403. A small body
/// read first needs no reset. A large or slow one is not waited for.
async fn read_small_body(request: Request) {
    let small = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|length| length.to_str().ok()?.parse::<usize>().ok())
        .is_none_or(|length| length <= REFUSED_BODY_BYTES_MAX);
    if small {
        let body = axum::body::to_bytes(request.into_body(), REFUSED_BODY_BYTES_MAX);
        let _ = tokio::time::timeout(REFUSED_BODY_WAIT, body).await;
    }
}

/// The middleware: the request's principal is found, checked against its route, and left in
/// its extensions for the handlers (`/sql` runs statements as it).
pub async fn authorize(State(state): State<AppState>, mut request: Request, next: Next) -> Response {
    let access = state.engine.access();
    if !access.enabled() {
        // No user is defined: everything is allowed and credentials are not checked (see
        // `Access::login_password`), so nothing is read from the request.
        request.extensions_mut().insert(access.anonymous());
        return next.run(request).await;
    }
    let template = request.extensions().get::<MatchedPath>().map(|path| path.as_str().to_string());
    let (path, method) = (request.uri().path().to_string(), request.method().clone());
    let query = request.uri().query().map(str::to_string);
    let credentials = credentials_of(&request);
    let source = request.extensions().get::<super::connection::ClientAddress>().map(|client| client.0.ip());
    let checked = async {
        let principal = principal_of(&state, credentials?, source).await?;
        if let Some(template) = &template {
            route_check(&state, &principal, template, &path, &method, query.as_deref())?;
        }
        Ok::<_, ApiError>(principal)
    };
    match checked.await {
        Ok(principal) => {
            request.extensions_mut().insert(principal);
            next.run(request).await
        }
        Err(error) => {
            read_small_body(request).await;
            error.into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authorization_headers_parse_or_are_refused_with_a_reason() {
        assert_eq!(
            parse_authorization(b"Basic YWxpY2U6czNjcjp0").unwrap(),
            Credentials::Password { user: "alice".into(), password: "s3cr:t".into() }
        );
        assert_eq!(parse_authorization(b"bearer  oht_ab_cd ").unwrap(), Credentials::Token("oht_ab_cd".into()));
        for bad in [&b"Basic !!"[..], b"Basic YWxpY2U=", b"Digest x", b"Basic \xff", b"", b"\xff\xfe"] {
            let refused = parse_authorization(bad).unwrap_err();
            assert_eq!(refused.status, StatusCode::UNAUTHORIZED, "{bad:?}");
        }
    }
}

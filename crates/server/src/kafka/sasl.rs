//! SASL on the Kafka listener (KIP-43, KIP-152): who a connection is, before anything else
//! once users exist. SaslHandshake names a mechanism, SaslAuthenticate carries its messages:
//!
//! - `PLAIN`: one message, `[authzid] NUL user NUL password`, checked as a password is.
//! - `SCRAM-SHA-256`, `SCRAM-SHA-512`: two round trips ([`ScramExchange`]); the password never
//!   crosses the network, and the client checks the server holds the user's credential.
//! - `OAUTHBEARER` (KIP-255, RFC 7628): one message carrying a bearer token, a JWT signed by a
//!   configured key (or one of onehop's own tokens).
//!
//! A login with a token that expires tells the client how long its session lasts
//! (`session_lifetime_ms`, KIP-368); the client logs in again on the same connection before
//! then, with the same mechanism and as the same user. A request after the session has ended
//! closes the connection, as Kafka's brokers do.
//!
//! A failed authentication is answered (SASL_AUTHENTICATION_FAILED, with why) and the
//! connection closed, as Kafka's brokers do.

use kafka_protocol::ResponseError;
use kafka_protocol::messages::sasl_authenticate_request::SaslAuthenticateRequest;
use kafka_protocol::messages::sasl_authenticate_response::SaslAuthenticateResponse;
use kafka_protocol::messages::sasl_handshake_request::SaslHandshakeRequest;
use kafka_protocol::messages::sasl_handshake_response::SaslHandshakeResponse;
use kafka_protocol::protocol::StrBytes;
use onehop_engine::access::credential::ScramHash;
use onehop_engine::access::scram::ScramExchange;
use onehop_engine::{Engine, EngineError, Principal};

/// The mechanisms served, as SaslHandshake lists them.
pub(super) const MECHANISMS: [&str; 4] = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mechanism {
    Plain,
    Scram(ScramHash),
    OAuthBearer,
}

impl Mechanism {
    fn name(self) -> &'static str {
        match self {
            Mechanism::Plain => "PLAIN",
            Mechanism::Scram(hash) => hash.name(),
            Mechanism::OAuthBearer => "OAUTHBEARER",
        }
    }
}

/// One connection's identity and where its SASL exchange is.
pub(super) struct Session {
    /// Who the connection is: anonymous until it authenticates.
    pub principal: Principal,
    pub authenticated: bool,
    mechanism: Option<Mechanism>,
    scram: Option<ScramExchange>,
    /// An authenticated connection is logging in again (KIP-368).
    reauthenticating: bool,
    /// Authenticated by its client certificate; a SASL login may replace it.
    by_certificate: bool,
    /// The connection, counted against its user's limit once it has logged in.
    held: Option<onehop_engine::Held>,
    /// How long the connection reads nothing after its answer: its user is over its publish
    /// rates.
    pub muted_for: Option<std::time::Duration>,
    /// Set when the connection must close once its answer is written (a failed login).
    pub close_after_answer: Option<String>,
}

impl Session {
    pub fn new(engine: &Engine) -> Session {
        Session {
            principal: engine.access().anonymous(),
            authenticated: false,
            mechanism: None,
            scram: None,
            reauthenticating: false,
            by_certificate: false,
            held: None,
            muted_for: None,
            close_after_answer: None,
        }
    }

    /// Whether a request other than ApiVersions and SASL's may be served: once users exist,
    /// only after authentication.
    pub fn may_proceed(&self, engine: &Engine) -> bool {
        self.authenticated || !engine.access().enabled()
    }

    /// Logs the connection in as the user its verified client certificate names; a name that
    /// is not a user leaves it as it was (SASL may follow), and is counted as a failed login.
    pub fn log_in_with_certificate(&mut self, engine: &Engine, user: &str) {
        let held = engine.access().login_certificate(user).and_then(|principal| {
            let held = principal.hold(onehop_engine::Resource::Connection)?;
            Ok((principal, held))
        });
        match held {
            Ok((principal, held)) => {
                self.principal = principal;
                self.held = held;
                self.authenticated = engine.access().enabled();
                self.by_certificate = self.authenticated;
            }
            Err(error) if error.code() == "limit_exceeded" => crate::access::limit_refused("kafka"),
            Err(error) => crate::access::login_failed("kafka", Some(user), &error.message()),
        }
    }

    /// Whether the token this connection logged in with has expired and it did not log in
    /// again in time.
    pub fn expired(&self) -> bool {
        self.authenticated
            && self.principal.expires_ms().is_some_and(|expires| onehop_engine::access::now_ms() >= expires)
    }
}

/// SaslHandshake (version 1: the exchange follows in SaslAuthenticate requests).
pub(super) fn handshake(session: &mut Session, request: SaslHandshakeRequest) -> SaslHandshakeResponse {
    let mut response = SaslHandshakeResponse::default();
    response.mechanisms = MECHANISMS.iter().map(|name| StrBytes::from_static_str(name)).collect();
    let mechanism = match request.mechanism.as_str() {
        "PLAIN" => Mechanism::Plain,
        "SCRAM-SHA-256" => Mechanism::Scram(ScramHash::Sha256),
        "SCRAM-SHA-512" => Mechanism::Scram(ScramHash::Sha512),
        "OAUTHBEARER" => Mechanism::OAuthBearer,
        _ => {
            response.error_code = ResponseError::UnsupportedSaslMechanism.code();
            return response;
        }
    };
    // Mid-exchange, or a login again with another mechanism than the first (KIP-368 keeps it).
    let mid_exchange = session.scram.is_some() || (session.mechanism.is_some() && !session.authenticated);
    let relogin = session.authenticated && !session.by_certificate;
    if mid_exchange || (relogin && session.mechanism != Some(mechanism)) {
        response.error_code = ResponseError::IllegalSaslState.code();
        return response;
    }
    session.reauthenticating = relogin;
    session.mechanism = Some(mechanism);
    response
}

use onehop_engine::access::now_ms;

/// SaslAuthenticate (of `version`): one step of the mechanism the handshake chose.
pub(super) async fn authenticate(
    engine: &Engine,
    session: &mut Session,
    request: SaslAuthenticateRequest,
    version: i16,
    source: std::net::IpAddr,
) -> SaslAuthenticateResponse {
    let mut response = SaslAuthenticateResponse::default();
    let access = engine.access();
    let out_of_turn = session.authenticated && !session.reauthenticating && !session.by_certificate;
    let step: Result<Option<(Principal, Vec<u8>)>, EngineError> = match (session.mechanism, out_of_turn) {
        (None, _) | (_, true) => {
            response.error_code = ResponseError::IllegalSaslState.code();
            response.error_message = Some(StrBytes::from_static_str("SaslHandshake must come first, once"));
            session.close_after_answer = Some("SaslAuthenticate out of turn".into());
            return response;
        }
        (Some(Mechanism::Plain), false) => {
            plain(engine, &request.auth_bytes, source).await.map(|principal| Some((principal, Vec::new())))
        }
        (Some(Mechanism::OAuthBearer), false) => {
            oauth_bearer(engine, &request.auth_bytes).map(|principal| Some((principal, Vec::new())))
        }
        (Some(Mechanism::Scram(hash)), false) => match session.scram.take() {
            None => ScramExchange::start(access, hash, &request.auth_bytes).map(|(exchange, server_first)| {
                session.scram = Some(exchange);
                response.auth_bytes = server_first.into();
                None
            }),
            // The proof is the guess: slowed and counted as a password login is.
            Some(exchange) => {
                let claimed = exchange.claimed_user().to_string();
                match access.admit_login(&claimed, Some(source)).await {
                    Err(refusal) => Err(refusal),
                    Ok(()) => {
                        let finished = exchange.finish(access, &request.auth_bytes);
                        access.login_checked(&claimed, Some(source), finished.is_ok());
                        finished.map(Some)
                    }
                }
            }
        },
    };
    // Logging in again must not change who the connection is (KIP-368). A first login takes
    // a place in the user's connection limit; at the limit it fails, and says why.
    let step = match step {
        Ok(Some((principal, _))) if session.reauthenticating && principal.user() != session.principal.user() => {
            Err(EngineError::Unauthenticated(onehop_engine::access::LoginFailure::WrongPassword))
        }
        Ok(Some((principal, server_final))) if !session.reauthenticating => {
            match principal.hold(onehop_engine::Resource::Connection) {
                Ok(held) => {
                    session.held = held;
                    Ok(Some((principal, server_final)))
                }
                Err(error) => {
                    crate::access::limit_refused("kafka");
                    Err(error)
                }
            }
        }
        other => other,
    };
    match step {
        Ok(None) => {}
        Ok(Some((principal, server_final))) => {
            // The client logs in again before this much time has passed; clients of version 0
            // cannot be told, and their connection closes at the token's expiry.
            if version >= 1
                && let Some(expires) = principal.expires_ms()
            {
                response.session_lifetime_ms = expires.saturating_sub(now_ms()).clamp(1, i64::MAX as u64) as i64;
            }
            if session.reauthenticating {
                metrics::counter!(super::REAUTHENTICATIONS).increment(1);
            }
            session.principal = principal;
            session.authenticated = true;
            session.reauthenticating = false;
            session.by_certificate = false;
            response.auth_bytes = server_final.into();
        }
        Err(error) => {
            session.reauthenticating = false;
            let mechanism = session.mechanism.map_or("PLAIN", Mechanism::name);
            crate::access::login_failed("kafka", None, &error.message());
            response.error_code = ResponseError::SaslAuthenticationFailed.code();
            response.error_message = Some(StrBytes::from_string(format!(
                "authentication failed with SASL mechanism {mechanism}: {}",
                error.message()
            )));
            session.close_after_answer = Some(format!("SASL {mechanism} authentication failed"));
        }
    }
    response
}

/// OAUTHBEARER's one message (RFC 7628 §3.1): a GS2 header (`n,,` or `n,a=user,`), then
/// `key=value` pairs each ended by 0x01, one of them `auth=Bearer <token>`, and a final 0x01.
fn oauth_bearer(engine: &Engine, message: &[u8]) -> Result<Principal, EngineError> {
    let refused =
        |reason: &'static str| EngineError::Unauthenticated(onehop_engine::access::LoginFailure::BadJwt(reason));
    let text = std::str::from_utf8(message).map_err(|_| refused("the OAUTHBEARER message is not UTF-8"))?;
    let mut parts = text.split('\u{1}');
    let header = parts.next().unwrap_or_default();
    let authzid = match header.strip_prefix("n,").and_then(|rest| rest.strip_suffix(',')) {
        Some("") => None,
        Some(rest) => Some(rest.strip_prefix("a=").ok_or_else(|| refused("a malformed OAUTHBEARER GS2 header"))?),
        None => return Err(refused("the OAUTHBEARER GS2 header must be n,, or n,a=user, (no channel binding)")),
    };
    let token = parts
        .find_map(|pair| pair.strip_prefix("auth="))
        .and_then(|auth| auth.strip_prefix("Bearer ").or_else(|| auth.strip_prefix("bearer ")))
        .map(str::trim)
        .ok_or_else(|| refused("the OAUTHBEARER message has no auth=Bearer <token>"))?;
    let access = engine.access();
    if !access.is_token(token) {
        return Err(refused("the OAUTHBEARER token is neither a JWT this server has keys for nor a onehop token"));
    }
    let principal = access.login_token(token, now_ms())?;
    if authzid.is_some_and(|authzid| principal.user().is_some_and(|user| user != authzid)) {
        return Err(refused("the OAUTHBEARER authorization identity is not the token's user"));
    }
    Ok(principal)
}

/// PLAIN's one message: `[authzid] NUL user NUL password` (RFC 4616); an authorization
/// identity other than the user is refused.
async fn plain(engine: &Engine, message: &[u8], source: std::net::IpAddr) -> Result<Principal, EngineError> {
    let refused = || EngineError::Unauthenticated(onehop_engine::access::LoginFailure::WrongPassword);
    let mut parts = message.splitn(3, |byte| *byte == 0);
    let (Some(authzid), Some(user), Some(password)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(refused());
    };
    let user = std::str::from_utf8(user).map_err(|_| refused())?;
    if !authzid.is_empty() && authzid != user.as_bytes() {
        return Err(refused());
    }
    let access = engine.access();
    // A token as the password logs in as its user, as over MQTT.
    if let Ok(token) = std::str::from_utf8(password)
        && access.is_token(token)
    {
        let principal = access.login_token(token, now_ms())?;
        if principal.user().is_some_and(|owner| owner != user) && access.enabled() {
            return Err(refused());
        }
        return Ok(principal);
    }
    access.login_password(user, password, Some(source)).await
}

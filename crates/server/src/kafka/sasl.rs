//! SASL on the Kafka listener (KIP-43, KIP-152): who a connection is, before anything else
//! once users exist. SaslHandshake names a mechanism, SaslAuthenticate carries its messages:
//!
//! - `PLAIN`: one message, `[authzid] NUL user NUL password`, checked as a password is.
//! - `SCRAM-SHA-256`, `SCRAM-SHA-512`: two round trips ([`ScramExchange`]); the password never
//!   crosses the network, and the client checks the server holds the user's credential.
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
pub(super) const MECHANISMS: [&str; 3] = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mechanism {
    Plain,
    Scram(ScramHash),
}

/// One connection's identity and where its SASL exchange is.
pub(super) struct Session {
    /// Who the connection is: anonymous until it authenticates.
    pub principal: Principal,
    pub authenticated: bool,
    mechanism: Option<Mechanism>,
    scram: Option<ScramExchange>,
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
            close_after_answer: None,
        }
    }

    /// Whether a request other than ApiVersions and SASL's may be served: once users exist,
    /// only after authentication.
    pub fn may_proceed(&self, engine: &Engine) -> bool {
        self.authenticated || !engine.access().enabled()
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
        _ => {
            response.error_code = ResponseError::UnsupportedSaslMechanism.code();
            return response;
        }
    };
    if session.authenticated || session.mechanism.is_some() {
        response.error_code = ResponseError::IllegalSaslState.code();
        return response;
    }
    session.mechanism = Some(mechanism);
    response
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.as_millis() as u64)
}

/// SaslAuthenticate: one step of the mechanism the handshake chose.
pub(super) async fn authenticate(
    engine: &Engine,
    session: &mut Session,
    request: SaslAuthenticateRequest,
) -> SaslAuthenticateResponse {
    let mut response = SaslAuthenticateResponse::default();
    let access = engine.access();
    let step: Result<Option<(Principal, Vec<u8>)>, EngineError> = match (session.mechanism, session.authenticated) {
        (None, _) | (_, true) => {
            response.error_code = ResponseError::IllegalSaslState.code();
            response.error_message = Some(StrBytes::from_static_str("SaslHandshake must come first, once"));
            session.close_after_answer = Some("SaslAuthenticate out of turn".into());
            return response;
        }
        (Some(Mechanism::Plain), false) => {
            plain(engine, &request.auth_bytes).await.map(|principal| Some((principal, Vec::new())))
        }
        (Some(Mechanism::Scram(hash)), false) => match session.scram.take() {
            None => ScramExchange::start(access, hash, &request.auth_bytes).map(|(exchange, server_first)| {
                session.scram = Some(exchange);
                response.auth_bytes = server_first.into();
                None
            }),
            Some(exchange) => exchange.finish(access, &request.auth_bytes).map(Some),
        },
    };
    match step {
        Ok(None) => {}
        Ok(Some((principal, server_final))) => {
            session.principal = principal;
            session.authenticated = true;
            response.auth_bytes = server_final.into();
        }
        Err(error) => {
            let mechanism = match session.mechanism {
                Some(Mechanism::Scram(hash)) => hash.name(),
                _ => "PLAIN",
            };
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

/// PLAIN's one message: `[authzid] NUL user NUL password` (RFC 4616); an authorization
/// identity other than the user is refused.
async fn plain(engine: &Engine, message: &[u8]) -> Result<Principal, EngineError> {
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
        && token.starts_with(onehop_engine::access::TOKEN_PREFIX)
    {
        let principal = access.login_token(token, now_ms())?;
        if principal.user().is_some_and(|owner| owner != user) && access.enabled() {
            return Err(refused());
        }
        return Ok(principal);
    }
    access.login_password(user, password).await
}

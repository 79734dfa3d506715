//! Who may do what: users, roles, grants and tokens, checked here for every protocol.
//!
//! - `credential`: passwords kept as SCRAM credentials.
//! - `der`: the little DER a public key file or a client certificate needs read.
//! - `failed_logins`: password guessing slowed, per address, per user and address, per user.
//! - `jwt`: JSON Web Tokens from an identity provider, checked against configured keys.
//! - `limits`: what each user holds and sends, against its limits.
//! - `model`: users, roles, grants, tokens and the permissions they add up to.
//! - `records`: their records in the catalog.
//! - `scram`: the server side of a SCRAM exchange (Kafka's SASL SCRAM-SHA-256/512).
//!
//! A front end turns what a client presents (a password, a token, nothing) into a
//! [`Principal`] once per connection or request ([`Access::login_password`],
//! [`Access::login_token`], [`Access::anonymous`]), and asks [`Access::authorize`] before each
//! publish and each subscription. While no user is defined, access is off and everything is
//! allowed, as before there were users; the first `CREATE USER` turns it on.

pub mod credential;
pub mod der;
pub mod failed_logins;
pub mod jwt;
pub mod limits;
pub mod model;
pub(crate) mod records;
pub mod scram;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use rand::RngCore;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::error::EngineError;
use credential::{ITERATIONS_DEFAULT, ScramCredential, ScramHash, hex};
use jwt::JwtVerifier;
use limits::{Held, Limited, Resource, Usage};
use model::{AccessDefs, ObjectKind, Permissions, Privilege, TokenDef};

/// Passwords checked recently, kept so that a client sending its password with every request
/// (HTTP Basic) pays the PBKDF2 iterations once, not per request. Past this many the cache is
/// emptied: a flood of distinct wrong passwords cannot grow memory, and costs its sender the
/// iterations every time.
const VERIFIED_PASSWORDS_MAX: usize = 4096;
/// Logins refused unchecked after too many failures from their address
/// ([`failed_logins`]).
pub const LOGINS_THROTTLED: &str = "auth_logins_throttled_total";
/// Logins made to wait before their check: their user had many failures from many addresses.
pub const LOGINS_SLOWED: &str = "auth_logins_slowed_total";

/// The prefix of every token onehop issues, so a leaked one is recognisable (secret scanners
/// look for such prefixes).
pub const TOKEN_PREFIX: &str = "oht_";
const TOKEN_ID_BYTES: usize = 4;
const TOKEN_SECRET_BYTES: usize = 32;

pub use crate::engine::{PASSWORD_BYTES_MAX, validate_grantee_name};

/// What creating a user did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum UserCreated {
    Created,
    /// The first user, created while access was off: made a superuser (`ADMIN ON ALL`), since
    /// creating it turns access on and someone must be able to manage it.
    CreatedSuperuser,
    /// It existed already (`IF NOT EXISTS`); its password was left as it was.
    Existed,
}

/// Why a client could not be identified. The messages never say whether a user exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoginFailure {
    /// Access is on and the client presented nothing.
    Missing,
    /// A user name and password that do not match (or a user that does not exist).
    WrongPassword,
    /// A token that is not one of this server's, was dropped, or has expired.
    BadToken,
    /// The user this connection logged in as was dropped since.
    UserDropped,
    /// A JWT that does not verify or whose claims do not hold, and why.
    BadJwt(&'static str),
    /// The token this connection logged in with has expired since.
    Expired,
    /// The token this connection logged in with was dropped since.
    TokenDropped,
    /// A client certificate that verified, whose common name is not a user.
    UnknownCertificateUser,
}

impl LoginFailure {
    pub fn message(self) -> &'static str {
        match self {
            LoginFailure::Missing => "this server requires credentials: a user name and password, or a token",
            LoginFailure::WrongPassword => "wrong user name or password",
            LoginFailure::BadToken => "unknown, dropped or expired token",
            LoginFailure::UserDropped => "the user this connection logged in as no longer exists",
            LoginFailure::BadJwt(reason) => reason,
            LoginFailure::Expired => "the token this connection logged in with has expired: log in again",
            LoginFailure::TokenDropped => "the token this connection logged in with was dropped: log in again",
            LoginFailure::UnknownCertificateUser => "the client certificate's common name (CN) is not a user",
        }
    }
}

/// An identity as a connection or request holds it: a user, or a client without credentials,
/// with what it may do as of the access generation it was computed at.
#[derive(Clone, Debug)]
pub struct Principal {
    user: Option<Arc<str>>,
    /// The roles a JWT named: `Some` for an identity from a JWT, whose user need not exist.
    jwt_roles: Option<Arc<[String]>>,
    /// For a JWT identity: whether it has its user's grants too.
    jwt_user_grants: bool,
    /// When the token it logged in with expires (ms since the Unix epoch).
    expires_ms: Option<u64>,
    /// The id of the onehop token it logged in with: dropping the token ends what it may do.
    token: Option<Arc<str>>,
    permissions: Arc<Permissions>,
    generation: u64,
    /// The user's limits and usage, when it has limits.
    limited: Option<Arc<Limited>>,
}

impl Principal {
    /// The user's name; `None` for a client without credentials.
    pub fn user(&self) -> Option<&str> {
        self.user.as_deref()
    }

    /// When the token this principal logged in with stops being accepted, if it does.
    pub fn expires_ms(&self) -> Option<u64> {
        self.expires_ms
    }

    /// Counts a connection or subscription against the user's limit while the returned
    /// [`Held`] lives, or refuses it at the limit (`None`: the user has no limits).
    pub fn hold(&self, resource: Resource) -> Result<Option<Held>, EngineError> {
        match &self.limited {
            None => Ok(None),
            Some(limited) => limited.hold(resource),
        }
    }

    /// Takes a publish of `records` and `bytes` now, or refuses it (HTTP answers 429): the
    /// user's publish rates have no room for it.
    pub fn admit_publish(&self, records: u64, bytes: u64) -> Result<(), EngineError> {
        match &self.limited {
            Some(limited) if limited.limits_publishes() => limited.admit(records, bytes, std::time::Instant::now()),
            _ => Ok(()),
        }
    }

    /// Takes a publish of `records` and `bytes` and says how long to wait before going on
    /// (MQTT and Kafka slow the client down): zero within the user's rates.
    pub fn throttle_publish(&self, records: u64, bytes: u64) -> std::time::Duration {
        match &self.limited {
            Some(limited) if limited.limits_publishes() => limited.throttle(records, bytes, std::time::Instant::now()),
            _ => std::time::Duration::ZERO,
        }
    }
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.as_millis() as u64)
}

/// The users, roles, grants and tokens in force, and the checks made against them.
pub struct Access {
    /// Replaced whole on every change (copy on write): a check reads one `Arc`, and a change
    /// never holds the lock while it computes.
    defs: RwLock<Arc<AccessDefs>>,
    /// Bumped on every change, so a principal computed earlier knows to recompute.
    generation: AtomicU64,
    /// The generation again, for what waits on changes: open subscriptions check again
    /// whether they may still read what they follow.
    changes: tokio::sync::watch::Sender<u64>,
    /// SHA-256 of (a per-process key, user, password) of passwords that verified, with the salt
    /// of the credential they verified against: a later change of password changes the salt.
    verified: Mutex<HashMap<[u8; 32], Vec<u8>>>,
    verified_key: [u8; 32],
    /// A credential no password matches, checked when a user does not exist, so that a wrong
    /// name costs what a wrong password does and the time taken does not tell them apart.
    decoy: OnceLock<ScramCredential>,
    /// The anonymous principal of the definitions in force, made once per change: every HTTP
    /// request without credentials takes one, and on a server with no users that is every
    /// request.
    anonymous: RwLock<Principal>,
    /// The keys and settings JWTs are checked with, when configured (`--jwt-keys`).
    jwt: RwLock<Option<Arc<JwtVerifier>>>,
    /// What each user with limits holds and has sent, shared by all its connections. An entry
    /// is made at a user's first login with limits and kept: at most one per user.
    usages: Mutex<HashMap<String, Arc<Usage>>>,
    /// Failed password logins, which slow further guesses.
    failed_logins: failed_logins::FailedLogins,
}

impl Default for Access {
    fn default() -> Self {
        Access::new(AccessDefs::default())
    }
}

impl Access {
    pub(crate) fn new(defs: AccessDefs) -> Access {
        let mut verified_key = [0u8; 32];
        rand::rng().fill_bytes(&mut verified_key);
        let anonymous = Principal {
            user: None,
            jwt_roles: None,
            jwt_user_grants: false,
            expires_ms: None,
            token: None,
            permissions: Arc::new(defs.permissions(None, &[])),
            generation: 1,
            limited: None,
        };
        Access {
            defs: RwLock::new(Arc::new(defs)),
            generation: AtomicU64::new(1),
            changes: tokio::sync::watch::channel(1).0,
            verified: Mutex::new(HashMap::new()),
            verified_key,
            decoy: OnceLock::new(),
            anonymous: RwLock::new(anonymous),
            jwt: RwLock::new(None),
            usages: Mutex::new(HashMap::new()),
            failed_logins: Default::default(),
        }
    }

    /// Puts `verifier` in force for JWTs from now on (at start, and when its file is read
    /// again); `None` refuses every JWT.
    pub fn set_jwt(&self, verifier: Option<Arc<JwtVerifier>>) {
        *self.jwt.write().expect("jwt lock") = verifier;
    }

    fn jwt(&self) -> Option<Arc<JwtVerifier>> {
        self.jwt.read().expect("jwt lock").clone()
    }

    /// Whether a password or bearer value is a token rather than a password: one of onehop's
    /// (`oht_…`), or a JWT while JWT keys are configured.
    pub fn is_token(&self, text: &str) -> bool {
        text.starts_with(TOKEN_PREFIX) || (jwt::looks_like_jwt(text) && self.jwt().is_some())
    }

    /// Whether access is on: some user is defined.
    pub fn enabled(&self) -> bool {
        !self.defs().users.is_empty()
    }

    /// A number that changes with every change to access: a decision made while it read `g`
    /// holds while it reads `g`.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The definitions in force.
    pub fn defs(&self) -> Arc<AccessDefs> {
        self.defs.read().expect("access lock").clone()
    }

    /// Puts `defs` in force (after their records are durable in the catalog).
    pub(crate) fn replace(&self, defs: AccessDefs) {
        *self.defs.write().expect("access lock") = Arc::new(defs);
        self.generation.fetch_add(1, Ordering::AcqRel);
        // Until this is done a caller may take the previous one, whose generation says it is
        // stale: its checks recompute (see `permissions`).
        *self.anonymous.write().expect("anonymous lock") = self.principal(None);
        self.changes.send_replace(self.generation.load(Ordering::Acquire));
    }

    /// A receiver that sees every change to access (its value is the generation).
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    fn principal(&self, user: Option<&str>) -> Principal {
        let generation = self.generation.load(Ordering::Acquire);
        let defs = self.defs();
        let permissions = Arc::new(defs.permissions(user, &[]));
        let limited = user.and_then(|user| self.limited(&defs, user));
        Principal {
            user: user.map(Arc::from),
            jwt_roles: None,
            jwt_user_grants: false,
            expires_ms: None,
            token: None,
            permissions,
            generation,
            limited,
        }
    }

    /// The principal of a verified JWT: its user (who need not exist) with the roles it names,
    /// and that user's own grants only when the JWT settings say so (`user_grants`).
    fn jwt_principal(
        &self,
        user: Arc<str>,
        roles: Arc<[String]>,
        user_grants: bool,
        expires_ms: Option<u64>,
    ) -> Principal {
        let generation = self.generation.load(Ordering::Acquire);
        let defs = self.defs();
        let grantee = user_grants.then_some(&*user);
        let permissions = Arc::new(defs.permissions(grantee, &roles));
        let limited = self.limited(&defs, &user);
        Principal {
            user: Some(user),
            jwt_roles: Some(roles),
            jwt_user_grants: user_grants,
            expires_ms,
            token: None,
            permissions,
            generation,
            limited,
        }
    }

    /// The limits and usage of `user`, if it is a user with limits.
    fn limited(&self, defs: &AccessDefs, user: &str) -> Option<Arc<Limited>> {
        let limits = defs.users.get(user).map(|def| def.limits).filter(|limits| !limits.is_none())?;
        let usage = self.usages.lock().expect("usages lock").entry(user.to_string()).or_default().clone();
        Some(Arc::new(Limited { user: Arc::from(user), limits, usage }))
    }

    /// A client that presented no credentials: it may do what `PUBLIC` is granted, or
    /// everything while access is off.
    pub fn anonymous(&self) -> Principal {
        self.anonymous.read().expect("anonymous lock").clone()
    }

    /// Checks `password` for `user`. The PBKDF2 iterations run on a blocking thread, since
    /// they take milliseconds; a password that verified recently is recognised without them.
    /// While access is off, credentials are not checked: the client is anonymous, as every
    /// client is then (so clients configured with credentials keep working on a server that
    /// has no users yet, as with an MQTT broker that allows anonymous clients).
    ///
    /// `source` is the client's address: failed logins from it, and for `user` from it, make
    /// later attempts wait, and many for `user` from anywhere slow each attempt
    /// ([`failed_logins`]); a refusal for that is [`EngineError::LoginThrottled`].
    /// Before a login whose proof its protocol checks (a SCRAM exchange) or this module does:
    /// waits, or refuses with [`EngineError::LoginThrottled`], as the failed logins of `user`
    /// from `source` require ([`failed_logins`]). [`Access::login_checked`] reports the outcome.
    pub async fn admit_login(&self, user: &str, source: Option<std::net::IpAddr>) -> Result<(), EngineError> {
        match self.failed_logins.admit(user, source, now_ms()) {
            failed_logins::Admission::Check => Ok(()),
            failed_logins::Admission::CheckAfter(wait_ms) => {
                metrics::counter!(LOGINS_SLOWED).increment(1);
                tokio::time::sleep(std::time::Duration::from_millis(wait_ms)).await;
                Ok(())
            }
            failed_logins::Admission::Refuse { retry_after_ms } => {
                metrics::counter!(LOGINS_THROTTLED).increment(1);
                Err(EngineError::LoginThrottled { retry_after_ms })
            }
        }
    }

    /// The outcome of a login [`Access::admit_login`] admitted: a failure slows the next
    /// guesses, a success clears them.
    pub fn login_checked(&self, user: &str, source: Option<std::net::IpAddr>, succeeded: bool) {
        if succeeded {
            self.failed_logins.succeeded(user, source);
        } else {
            self.failed_logins.failed(user, source, now_ms());
        }
    }

    pub async fn login_password(
        &self,
        user: &str,
        password: &[u8],
        source: Option<std::net::IpAddr>,
    ) -> Result<Principal, EngineError> {
        let defs = self.defs();
        if defs.users.is_empty() {
            return Ok(self.anonymous());
        }
        let credential = defs.users.get(user).and_then(|def| def.credentials.first().cloned());
        let cache_key = self.verified_key(user, password);
        if let Some(credential) = &credential
            && self.verified.lock().expect("verified lock").get(&cache_key) == Some(&credential.salt)
        {
            // This very password verified before: no guess, so nothing to slow.
            return Ok(self.principal(Some(user)));
        }
        self.admit_login(user, source).await?;
        let known = credential.is_some();
        let credential = credential.unwrap_or_else(|| {
            self.decoy.get_or_init(|| ScramCredential::new(ScramHash::Sha256, b"", ITERATIONS_DEFAULT)).clone()
        });
        let salt = credential.salt.clone();
        let password = password.to_vec();
        let verified = tokio::task::spawn_blocking(move || credential.verify(&password))
            .await
            .map_err(|error| EngineError::Internal(format!("a password check failed: {error}")))?;
        if !(verified && known) {
            self.failed_logins.failed(user, source, now_ms());
            return Err(EngineError::Unauthenticated(LoginFailure::WrongPassword));
        }
        self.failed_logins.succeeded(user, source);
        let mut cache = self.verified.lock().expect("verified lock");
        if cache.len() >= VERIFIED_PASSWORDS_MAX {
            cache.clear();
        }
        cache.insert(cache_key, salt);
        drop(cache);
        Ok(self.principal(Some(user)))
    }

    fn verified_key(&self, user: &str, password: &[u8]) -> [u8; 32] {
        let mut hasher = Sha256::new();
        hasher.update(self.verified_key);
        hasher.update((user.len() as u64).to_le_bytes());
        hasher.update(user.as_bytes());
        hasher.update(password);
        hasher.finalize().into()
    }

    /// Checks a token at `now_ms`: one onehop issued (`oht_{id}_{secret}`), or a JWT signed
    /// by a configured key.
    pub fn login_token(&self, token: &str, now_ms: u64) -> Result<Principal, EngineError> {
        let bad = || EngineError::Unauthenticated(LoginFailure::BadToken);
        let defs = self.defs();
        if defs.users.is_empty() {
            return Ok(self.anonymous());
        }
        if !token.starts_with(TOKEN_PREFIX)
            && let Some(verifier) = self.jwt()
        {
            let identity = verifier
                .verify(token, now_ms)
                .map_err(|reason| EngineError::Unauthenticated(LoginFailure::BadJwt(reason)))?;
            let (user, roles) = (Arc::from(identity.user), Arc::from(identity.roles));
            return Ok(self.jwt_principal(user, roles, identity.user_grants, identity.expires_ms));
        }
        let (id, _) = token.strip_prefix(TOKEN_PREFIX).and_then(|rest| rest.split_once('_')).ok_or_else(bad)?;
        let def = defs.tokens.get(id).ok_or_else(bad)?;
        let hash = Sha256::digest(token.as_bytes());
        if !bool::from(hash.as_slice().ct_eq(&def.secret_sha256)) {
            return Err(bad());
        }
        if def.expires_ms.is_some_and(|expires| now_ms >= expires) || !defs.users.contains_key(&def.user) {
            return Err(bad());
        }
        let mut principal = self.principal(Some(&def.user));
        principal.expires_ms = def.expires_ms;
        principal.token = Some(Arc::from(id));
        Ok(principal)
    }

    /// The user a verified client certificate names (its subject's common name): the TLS
    /// handshake has checked the certificate against the configured CAs, so the name is all
    /// that is left to check. The user must exist.
    pub fn login_certificate(&self, common_name: &str) -> Result<Principal, EngineError> {
        let defs = self.defs();
        if defs.users.is_empty() {
            return Ok(self.anonymous());
        }
        if !defs.users.contains_key(common_name) {
            return Err(EngineError::Unauthenticated(LoginFailure::UnknownCertificateUser));
        }
        Ok(self.principal(Some(common_name)))
    }

    /// Brings `principal` up to date with the access in force, once per change: a connection
    /// calls this before its checks so that each check reads what it already holds.
    pub fn refresh(&self, principal: &mut Principal) -> Result<(), EngineError> {
        if principal.generation == self.generation.load(Ordering::Acquire) {
            return Ok(());
        }
        let user = principal.user.clone();
        if let (Some(user), Some(roles)) = (&user, &principal.jwt_roles) {
            *principal =
                self.jwt_principal(user.clone(), roles.clone(), principal.jwt_user_grants, principal.expires_ms);
            return Ok(());
        }
        if let Some(user) = &user
            && !self.defs().users.contains_key(&**user)
        {
            return Err(EngineError::Unauthenticated(LoginFailure::UserDropped));
        }
        if let Some(token) = &principal.token
            && !self.defs().tokens.contains_key(&**token)
        {
            return Err(EngineError::Unauthenticated(LoginFailure::TokenDropped));
        }
        let (expires_ms, token) = (principal.expires_ms, principal.token.clone());
        *principal = self.principal(user.as_deref());
        principal.expires_ms = expires_ms;
        principal.token = token;
        Ok(())
    }

    /// Whether `principal` may do `privilege` on the object `kind` `name`: nothing is refused
    /// while access is off; a refusal to a client without credentials asks for them.
    pub fn authorize(
        &self,
        principal: &Principal,
        privilege: Privilege,
        kind: ObjectKind,
        name: &str,
    ) -> Result<(), EngineError> {
        self.check(principal, |permissions| permissions.allows(privilege, kind, name)).map_err(|error| {
            error.unwrap_or_else(|| EngineError::Forbidden {
                user: principal.user().map(str::to_string),
                privilege,
                object: format!("{kind} {name}"),
            })
        })
    }

    /// Whether `principal` may do `privilege` on the record with subject `subject` (an MQTT
    /// topic) in the stream `stream`: a grant on the stream, or a topic grant matching the
    /// subject. The refusal is the stream's.
    pub fn authorize_subject(
        &self,
        principal: &Principal,
        privilege: Privilege,
        stream: &str,
        subject: &str,
    ) -> Result<(), EngineError> {
        let refused = match self.authorize(principal, privilege, ObjectKind::Stream, stream) {
            Ok(()) => return Ok(()),
            Err(refused) => refused,
        };
        match self.permissions(principal)? {
            Some(permissions) if permissions.allows_topic(privilege, subject) => Ok(()),
            _ => Err(refused),
        }
    }

    /// Whether `principal` may read the object `kind` `name` through a subscription whose
    /// subject filter is `filter`: a grant on the object, or, for a stream, a topic grant that
    /// covers every subject the filter matches. The refusal is the object's.
    pub fn authorize_subscription(
        &self,
        principal: &Principal,
        kind: ObjectKind,
        name: &str,
        filter: Option<&str>,
    ) -> Result<(), EngineError> {
        let refused = match self.authorize(principal, Privilege::Read, kind, name) {
            Ok(()) => return Ok(()),
            Err(refused) => refused,
        };
        match (kind, filter, self.permissions(principal)?) {
            (ObjectKind::Stream, Some(filter), Some(permissions))
                if permissions.allows_topic_filter(Privilege::Read, filter) =>
            {
                Ok(())
            }
            _ => Err(refused),
        }
    }

    /// Whether a client without credentials may connect at all: access is off, or `PUBLIC` is
    /// granted something. An MQTT broker refuses the CONNECT of an anonymous client that could
    /// do nothing, rather than accepting it and refusing everything it then asks.
    pub fn anonymous_welcome(&self) -> bool {
        let defs = self.defs();
        defs.users.is_empty() || defs.grants.iter().any(|grant| grant.grantee == model::PUBLIC)
    }

    /// Whether `principal` has `ADMIN ON ALL`: manages users, roles, grants and tokens. `what`
    /// names the action for the refusal (`create users`).
    pub fn authorize_superuser(&self, principal: &Principal, what: &str) -> Result<(), EngineError> {
        self.check(principal, Permissions::is_superuser).map_err(|error| {
            error.unwrap_or_else(|| EngineError::NotSuperuser {
                user: principal.user().map(str::to_string),
                action: what.to_string(),
            })
        })
    }

    /// The permissions `principal` has now, for checks a caller makes itself (`SHOW STREAMS`
    /// lists what these reach). `None` while access is off.
    pub fn permissions(&self, principal: &Principal) -> Result<Option<Arc<Permissions>>, EngineError> {
        if !self.enabled() {
            return Ok(None);
        }
        if principal.generation == self.generation.load(Ordering::Acquire) {
            return Ok(Some(principal.permissions.clone()));
        }
        let mut current = principal.clone();
        self.refresh(&mut current)?;
        Ok(Some(current.permissions))
    }

    /// `Ok` when `allowed` holds for `principal`'s permissions or access is off; else the
    /// refusal for a client without credentials, or `None` for the caller's own.
    fn check(&self, principal: &Principal, allowed: impl Fn(&Permissions) -> bool) -> Result<(), Option<EngineError>> {
        let Some(permissions) = self.permissions(principal).map_err(Some)? else {
            return Ok(());
        };
        if principal.expires_ms.is_some_and(|expires| now_ms() >= expires) {
            return Err(Some(EngineError::Unauthenticated(LoginFailure::Expired)));
        }
        if allowed(&permissions) {
            return Ok(());
        }
        match principal.user {
            None => Err(Some(EngineError::Unauthenticated(LoginFailure::Missing))),
            Some(_) => Err(None),
        }
    }
}

/// A new token for `user`: its definition (what the catalog keeps) and the secret, which is
/// shown once and kept nowhere.
pub(crate) fn new_token(user: &str, now_ms: u64, valid_ms: Option<u64>) -> (TokenDef, String) {
    let mut id = [0u8; TOKEN_ID_BYTES];
    let mut secret = [0u8; TOKEN_SECRET_BYTES];
    rand::rng().fill_bytes(&mut id);
    rand::rng().fill_bytes(&mut secret);
    let id = hex(&id);
    let token = format!("{TOKEN_PREFIX}{id}_{}", hex(&secret));
    let def = TokenDef {
        id,
        user: user.to_string(),
        secret_sha256: Sha256::digest(token.as_bytes()).to_vec(),
        created_ms: now_ms,
        expires_ms: valid_ms.map(|valid| now_ms.saturating_add(valid)),
    };
    (def, token)
}

/// Credentials for `password`: SCRAM-SHA-256 (what passwords sent in clear are checked
/// against) and SCRAM-SHA-512 (for Kafka clients that use it).
pub(crate) fn credentials(password: &[u8]) -> Vec<ScramCredential> {
    [ScramHash::Sha256, ScramHash::Sha512]
        .into_iter()
        .map(|hash| ScramCredential::new(hash, password, ITERATIONS_DEFAULT))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::model::{Grant, ObjectPattern, UserDef};
    use super::*;

    fn access_with_alice() -> Access {
        let mut defs = AccessDefs::default();
        defs.users.insert(
            "alice".into(),
            UserDef {
                name: "alice".into(),
                credentials: credentials(b"secret"),
                created_ms: 0,
                limits: Default::default(),
            },
        );
        defs.grants.insert(Grant {
            grantee: "alice".into(),
            privilege: Privilege::Write,
            object: ObjectPattern { kind: Some(ObjectKind::Stream), name: "orders".into() },
        });
        Access::new(defs)
    }

    #[tokio::test]
    async fn passwords_tokens_and_grants_decide_and_refusals_say_why() {
        let off = Access::default();
        assert!(!off.enabled());
        off.authorize(&off.anonymous(), Privilege::Admin, ObjectKind::Table, "x").unwrap();

        let access = access_with_alice();
        assert!(access.enabled());
        let anonymous = access.authorize(&access.anonymous(), Privilege::Read, ObjectKind::Stream, "orders");
        assert!(matches!(anonymous, Err(EngineError::Unauthenticated(LoginFailure::Missing))));
        for (user, password) in [("alice", "wrong"), ("nobody", "secret"), ("alice", "")] {
            let refused = access.login_password(user, password.as_bytes(), None).await.unwrap_err();
            assert_eq!(refused.to_string(), "wrong user name or password");
        }
        let alice = access.login_password("alice", b"secret", None).await.unwrap();
        // Verified once, recognised without the iterations the second time.
        assert_eq!(access.verified.lock().unwrap().len(), 1);
        access.login_password("alice", b"secret", None).await.unwrap();
        access.authorize(&alice, Privilege::Write, ObjectKind::Stream, "orders").unwrap();
        let forbidden = access.authorize(&alice, Privilege::Read, ObjectKind::Stream, "orders").unwrap_err();
        assert_eq!(forbidden.code(), "forbidden");
        assert!(forbidden.to_string().contains("GRANT READ ON STREAM orders TO alice"), "{forbidden}");

        let (def, token) = new_token("alice", 1_000, Some(60_000));
        let mut defs = (*access.defs()).clone();
        defs.tokens.insert(def.id.clone(), def.clone());
        access.replace(defs);
        assert_eq!(access.login_token(&token, 2_000).unwrap().user(), Some("alice"));
        assert!(access.login_token(&token, 61_000).is_err(), "expired");
        let forged = format!("{TOKEN_PREFIX}{}_{}", def.id, "0".repeat(64));
        assert!(access.login_token(&forged, 2_000).is_err());
        assert!(access.login_token("oht_nothing", 2_000).is_err());

        // Dropping the user ends what its connections may do.
        let mut held = alice.clone();
        let mut defs = (*access.defs()).clone();
        defs.users.remove("alice");
        defs.users.insert(
            "bob".into(),
            UserDef { name: "bob".into(), credentials: credentials(b"x"), created_ms: 0, limits: Default::default() },
        );
        access.replace(defs);
        assert!(matches!(access.refresh(&mut held), Err(EngineError::Unauthenticated(LoginFailure::UserDropped))));
        assert!(access.authorize(&alice, Privilege::Write, ObjectKind::Stream, "orders").is_err());
        assert!(access.login_token(&token, 2_000).is_err(), "a dropped user's tokens stop working");
    }
}

//! JSON Web Tokens (RFC 7519) issued by someone else — an identity provider, an application's
//! login service — and checked here against keys the operator configured (`--jwt-keys`): a
//! JWKS document (RFC 7517), as identity providers publish it, or PEM public keys.
//!
//! A token is a signed JWS in compact form (RFC 7515): `header.claims.signature`, each part
//! base64url without padding. Signatures are checked with `ring`: HS256/384/512 against
//! `oct` keys, RS256/384/512 and PS256/384/512 against RSA keys (2048 bits or more),
//! ES256/ES384 against P-256/P-384 keys, EdDSA against Ed25519 keys. `none` and any header
//! with `crit` parameters are refused.
//!
//! A verified token stands for the user its `sub` claim names (another claim if configured),
//! with the onehop roles its `roles` claim lists. The user need not exist in onehop: grants to
//! its name, to those roles and to `PUBLIC` are what it may do. `exp` and `nbf` are honoured
//! with [`LEEWAY_MS`] for clocks that disagree; `iss` and `aud` are checked when configured,
//! and a token carrying an audience is refused where none is configured (RFC 7519 §4.1.3).

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use ring::signature::{self, RsaPublicKeyComponents, UnparsedPublicKey};
use serde_json::Value;

use super::der::{self, PublicKey};

/// The longest token looked at: real ones are well under 2 KiB.
pub const TOKEN_BYTES_MAX: usize = 16 * 1024;
/// How far apart the issuer's clock and this one may be for `exp` and `nbf`.
pub const LEEWAY_MS: u64 = 30_000;
/// The longest user name a token may carry.
pub const USER_BYTES_MAX: usize = 256;
/// Most roles a token may name.
pub const ROLES_MAX: usize = 64;
/// Fewest RSA modulus bits accepted (RFC 7518 §3.3 requires 2048).
const RSA_BITS_MIN: usize = 2048;

/// How tokens are read, besides the keys.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JwtSettings {
    /// The `iss` a token must carry; `None`: any.
    pub issuer: Option<String>,
    /// The value the token's `aud` must be or contain; `None`: a token with `aud` is refused.
    pub audience: Option<String>,
    /// The claim naming the user.
    pub user_claim: String,
    /// The claim listing onehop roles (an array of names, or one string of names separated by
    /// spaces, as OAuth's `scope`).
    pub roles_claim: String,
    /// Whether a token also has the grants of the onehop user its user claim names. Off by
    /// default: a token then has what its roles and `PUBLIC` are granted, and a `sub` that
    /// happens to name a local superuser (`root`) is no way to its rights.
    pub user_grants: bool,
}

impl Default for JwtSettings {
    fn default() -> Self {
        JwtSettings {
            issuer: None,
            audience: None,
            user_claim: "sub".into(),
            roles_claim: "roles".into(),
            user_grants: false,
        }
    }
}

/// Who a verified token says its bearer is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JwtIdentity {
    pub user: String,
    pub roles: Vec<String>,
    /// `exp` in ms since the Unix epoch, leeway included.
    pub expires_ms: Option<u64>,
    /// Whether it has the grants of the onehop user of its name too ([`JwtSettings::user_grants`]).
    pub user_grants: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Algorithm {
    Hs256,
    Hs384,
    Hs512,
    Rs256,
    Rs384,
    Rs512,
    Ps256,
    Ps384,
    Ps512,
    Es256,
    Es384,
    EdDsa,
}

impl Algorithm {
    fn parse(name: &str) -> Option<Algorithm> {
        Some(match name {
            "HS256" => Algorithm::Hs256,
            "HS384" => Algorithm::Hs384,
            "HS512" => Algorithm::Hs512,
            "RS256" => Algorithm::Rs256,
            "RS384" => Algorithm::Rs384,
            "RS512" => Algorithm::Rs512,
            "PS256" => Algorithm::Ps256,
            "PS384" => Algorithm::Ps384,
            "PS512" => Algorithm::Ps512,
            "ES256" => Algorithm::Es256,
            "ES384" => Algorithm::Es384,
            "EdDSA" => Algorithm::EdDsa,
            _ => return None,
        })
    }
}

/// A key's material.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Material {
    Hmac(Vec<u8>),
    Public(PublicKey),
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Key {
    kid: Option<String>,
    /// The only algorithm the key may be used with, when its JWK says (`alg`).
    alg: Option<Algorithm>,
    material: Material,
}

impl Key {
    /// Whether this key can check a signature made with `alg`.
    fn fits(&self, alg: Algorithm) -> bool {
        if self.alg.is_some_and(|own| own != alg) {
            return false;
        }
        use Algorithm::*;
        matches!(
            (&self.material, alg),
            (Material::Hmac(_), Hs256 | Hs384 | Hs512)
                | (Material::Public(PublicKey::Rsa { .. }), Rs256 | Rs384 | Rs512 | Ps256 | Ps384 | Ps512)
                | (Material::Public(PublicKey::Ec { p384: false, .. }), Es256)
                | (Material::Public(PublicKey::Ec { p384: true, .. }), Es384)
                | (Material::Public(PublicKey::Ed25519(_)), EdDsa)
        )
    }

    fn verifies(&self, alg: Algorithm, message: &[u8], signature: &[u8]) -> bool {
        use Algorithm::*;
        match &self.material {
            Material::Hmac(secret) => {
                let (algorithm, hash_bytes) = match alg {
                    Hs256 => (ring::hmac::HMAC_SHA256, 32),
                    Hs384 => (ring::hmac::HMAC_SHA384, 48),
                    _ => (ring::hmac::HMAC_SHA512, 64),
                };
                // RFC 7518 §3.2: a key at least as long as the hash.
                secret.len() >= hash_bytes
                    && ring::hmac::verify(&ring::hmac::Key::new(algorithm, secret), message, signature).is_ok()
            }
            Material::Public(PublicKey::Rsa { n, e }) => {
                let parameters: &signature::RsaParameters = match alg {
                    Rs256 => &signature::RSA_PKCS1_2048_8192_SHA256,
                    Rs384 => &signature::RSA_PKCS1_2048_8192_SHA384,
                    Rs512 => &signature::RSA_PKCS1_2048_8192_SHA512,
                    Ps256 => &signature::RSA_PSS_2048_8192_SHA256,
                    Ps384 => &signature::RSA_PSS_2048_8192_SHA384,
                    _ => &signature::RSA_PSS_2048_8192_SHA512,
                };
                RsaPublicKeyComponents { n, e }.verify(parameters, message, signature).is_ok()
            }
            Material::Public(PublicKey::Ec { p384, point }) => {
                let algorithm =
                    if *p384 { &signature::ECDSA_P384_SHA384_FIXED } else { &signature::ECDSA_P256_SHA256_FIXED };
                UnparsedPublicKey::new(algorithm, point).verify(message, signature).is_ok()
            }
            Material::Public(PublicKey::Ed25519(key)) => {
                UnparsedPublicKey::new(&signature::ED25519, key).verify(message, signature).is_ok()
            }
        }
    }
}

/// The configured keys and settings: what every JWT is checked against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JwtVerifier {
    keys: Vec<Key>,
    settings: JwtSettings,
}

/// Whether `text` has the shape of a compact JWS: three base64url parts, the first a JSON
/// object (`eyJ` is how `{"` begins in base64). Said before any check, to route a password or
/// bearer value to the right check.
pub fn looks_like_jwt(text: &str) -> bool {
    text.starts_with("eyJ")
        && text.bytes().filter(|byte| *byte == b'.').count() == 2
        && text.bytes().all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.'))
}

impl JwtVerifier {
    /// Keys from a file's text: a JWKS (`{"keys": [...]}`), one JWK, or PEM public keys
    /// (`PUBLIC KEY`, `RSA PUBLIC KEY`). An error names what is wrong; a file with no key to
    /// check signatures with is an error.
    pub fn from_text(text: &str, settings: JwtSettings) -> Result<JwtVerifier, String> {
        if settings.user_claim.is_empty() || settings.roles_claim.is_empty() {
            return Err("the user and roles claims must have names".into());
        }
        let trimmed = text.trim_start();
        let keys = if trimmed.starts_with('{') { jwks_keys(trimmed)? } else { pem_keys(text)? };
        if keys.is_empty() {
            return Err("no signing key in the file".into());
        }
        Ok(JwtVerifier { keys, settings })
    }

    pub fn key_count(&self) -> usize {
        self.keys.len()
    }

    /// Checks `token` at `now_ms`: its signature against the configured keys, then its claims.
    /// The error says why, in words safe to show the token's bearer.
    pub fn verify(&self, token: &str, now_ms: u64) -> Result<JwtIdentity, &'static str> {
        if token.len() > TOKEN_BYTES_MAX {
            return Err("the token is longer than 16 KiB");
        }
        let mut parts = token.split('.');
        let (Some(header64), Some(claims64), Some(signature64), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err("a JWT has three parts separated by dots");
        };
        let header = json_part(header64).ok_or("the JWT header is not base64url JSON")?;
        let header = header.as_object().ok_or("the JWT header is not a JSON object")?;
        if header.contains_key("crit") {
            return Err("the JWT header has critical parameters (crit), which are not understood");
        }
        let alg = header.get("alg").and_then(Value::as_str).ok_or("the JWT header has no alg")?;
        let alg = Algorithm::parse(alg).ok_or("the JWT's alg is none or not one onehop accepts")?;
        let kid = match header.get("kid") {
            None => None,
            Some(Value::String(kid)) => Some(kid.as_str()),
            Some(_) => return Err("the JWT header's kid is not a string"),
        };
        let signature = URL_SAFE_NO_PAD.decode(signature64).map_err(|_| "the JWT signature is not base64url")?;
        let message = &token.as_bytes()[..header64.len() + 1 + claims64.len()];
        let mut candidates = self.keys.iter().filter(|key| kid.is_none() || key.kid.as_deref() == kid).peekable();
        if candidates.peek().is_none() {
            return Err("no configured key has the JWT's key id (kid)");
        }
        let mut fitting = candidates.filter(|key| key.fits(alg)).peekable();
        if fitting.peek().is_none() {
            return Err("no configured key is of the JWT's algorithm");
        }
        if !fitting.any(|key| key.verifies(alg, message, &signature)) {
            return Err("the JWT's signature does not verify");
        }
        let claims = json_part(claims64).ok_or("the JWT claims are not base64url JSON")?;
        self.identity(&claims, now_ms)
    }

    /// What the verified `claims` say, if they hold at `now_ms`.
    fn identity(&self, claims: &Value, now_ms: u64) -> Result<JwtIdentity, &'static str> {
        let claims = claims.as_object().ok_or("the JWT claims are not a JSON object")?;
        let instant = |name: &str| -> Result<Option<u64>, &'static str> {
            match claims.get(name) {
                None => Ok(None),
                Some(value) => {
                    let seconds = value.as_f64().filter(|seconds| seconds.is_finite() && *seconds >= 0.0);
                    let seconds = seconds.ok_or("the JWT's exp or nbf is not a number of seconds")?;
                    Ok(Some((seconds * 1000.0).min(u64::MAX as f64 / 2.0) as u64))
                }
            }
        };
        let expires_ms = instant("exp")?.map(|exp| exp.saturating_add(LEEWAY_MS));
        if expires_ms.is_some_and(|expires| now_ms >= expires) {
            return Err("the JWT has expired (exp)");
        }
        if instant("nbf")?.is_some_and(|not_before| now_ms.saturating_add(LEEWAY_MS) < not_before) {
            return Err("the JWT is not valid yet (nbf)");
        }
        if let Some(issuer) = &self.settings.issuer
            && claims.get("iss").and_then(Value::as_str) != Some(issuer.as_str())
        {
            return Err("the JWT's issuer (iss) is not the one configured");
        }
        match (&self.settings.audience, claims.get("aud")) {
            (None, None) => {}
            (None, Some(_)) => return Err("the JWT names an audience (aud) but this server is configured with none"),
            (Some(_), None) => return Err("the JWT names no audience (aud)"),
            (Some(audience), Some(aud)) => {
                let listed = match aud {
                    Value::String(one) => one == audience,
                    Value::Array(many) => many.iter().any(|one| one.as_str() == Some(audience)),
                    _ => false,
                };
                if !listed {
                    return Err("the JWT's audience (aud) does not include this server's");
                }
            }
        }
        let user = claims
            .get(&self.settings.user_claim)
            .and_then(Value::as_str)
            .ok_or("the JWT has no user claim (sub, or the one configured)")?;
        if user.is_empty() || user.len() > USER_BYTES_MAX || user.chars().any(char::is_control) {
            return Err("the JWT's user is empty, longer than 256 bytes or has control characters");
        }
        let roles: Vec<String> = match claims.get(&self.settings.roles_claim) {
            None => Vec::new(),
            Some(Value::String(names)) => names.split_whitespace().map(str::to_string).collect(),
            Some(Value::Array(names)) => names
                .iter()
                .map(|name| name.as_str().map(str::to_string))
                .collect::<Option<_>>()
                .ok_or("the JWT's roles are not all strings")?,
            Some(_) => return Err("the JWT's roles claim is not a list of names"),
        };
        if roles.len() > ROLES_MAX {
            return Err("the JWT names more than 64 roles");
        }
        Ok(JwtIdentity { user: user.to_string(), roles, expires_ms, user_grants: self.settings.user_grants })
    }
}

fn json_part(part: &str) -> Option<Value> {
    let bytes = URL_SAFE_NO_PAD.decode(part).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Keys from a JWKS or a single JWK. Keys marked for encryption (`"use": "enc"`) are skipped,
/// as identity providers publish those beside their signing keys.
fn jwks_keys(text: &str) -> Result<Vec<Key>, String> {
    let document: Value = serde_json::from_str(text).map_err(|error| format!("not JSON: {error}"))?;
    let jwks: Vec<&Value> = match document.get("keys") {
        Some(Value::Array(keys)) => keys.iter().collect(),
        Some(_) => return Err("\"keys\" is not an array".into()),
        None => vec![&document],
    };
    let mut keys = Vec::new();
    for (index, jwk) in jwks.into_iter().enumerate() {
        if jwk.get("use").and_then(Value::as_str).is_some_and(|usage| usage != "sig") {
            continue;
        }
        keys.push(jwk_key(jwk).map_err(|error| format!("key {index}: {error}"))?);
    }
    Ok(keys)
}

fn jwk_key(jwk: &Value) -> Result<Key, String> {
    let text = |name: &str| jwk.get(name).and_then(Value::as_str);
    let bytes = |name: &str| -> Result<Vec<u8>, String> {
        let value = text(name).ok_or_else(|| format!("no \"{name}\""))?;
        URL_SAFE_NO_PAD.decode(value.trim_end_matches('=')).map_err(|_| format!("\"{name}\" is not base64url"))
    };
    let kid = text("kid").map(str::to_string);
    let alg = match text("alg") {
        None => None,
        Some(name) => Some(Algorithm::parse(name).ok_or_else(|| format!("alg {name:?} is not one onehop accepts"))?),
    };
    let material = match text("kty") {
        Some("oct") => {
            let secret = bytes("k")?;
            if secret.len() < 32 {
                return Err("an HMAC key shorter than 32 bytes".into());
            }
            Material::Hmac(secret)
        }
        Some("RSA") => {
            let strip = |bytes: Vec<u8>| bytes.into_iter().skip_while(|byte| *byte == 0).collect::<Vec<u8>>();
            Material::Public(rsa_key(strip(bytes("n")?), strip(bytes("e")?))?)
        }
        Some("EC") => {
            let (p384, size) = match text("crv") {
                Some("P-256") => (false, 32),
                Some("P-384") => (true, 48),
                other => return Err(format!("EC curve {other:?}: only P-256 and P-384")),
            };
            let (x, y) = (bytes("x")?, bytes("y")?);
            if x.len() != size || y.len() != size {
                return Err("EC coordinates of the wrong length".into());
            }
            let mut point = vec![0x04];
            point.extend(x);
            point.extend(y);
            Material::Public(PublicKey::Ec { p384, point })
        }
        Some("OKP") => {
            if text("crv") != Some("Ed25519") {
                return Err("OKP keys: only Ed25519".into());
            }
            let key = bytes("x")?;
            if key.len() != 32 {
                return Err("an Ed25519 key that is not 32 bytes".into());
            }
            Material::Public(PublicKey::Ed25519(key))
        }
        other => return Err(format!("key type {other:?}: only oct, RSA, EC and OKP")),
    };
    if jwk.get("d").is_some() {
        return Err("a private key: give only the public key".into());
    }
    Ok(Key { kid, alg, material })
}

fn rsa_key(n: Vec<u8>, e: Vec<u8>) -> Result<PublicKey, String> {
    if n.len() * 8 < RSA_BITS_MIN {
        return Err(format!("an RSA key of fewer than {RSA_BITS_MIN} bits"));
    }
    if e.is_empty() {
        return Err("an RSA key with a zero exponent".into());
    }
    Ok(PublicKey::Rsa { n, e })
}

/// Keys from PEM blocks: `PUBLIC KEY` (SubjectPublicKeyInfo) and `RSA PUBLIC KEY` (PKCS #1).
fn pem_keys(text: &str) -> Result<Vec<Key>, String> {
    let mut keys = Vec::new();
    let mut lines = text.lines().map(str::trim);
    while let Some(line) = lines.next() {
        let Some(label) = line.strip_prefix("-----BEGIN ").and_then(|rest| rest.strip_suffix("-----")) else {
            continue;
        };
        let end = format!("-----END {label}-----");
        let mut body = String::new();
        loop {
            let line = lines.next().ok_or_else(|| format!("the PEM block {label:?} has no end"))?;
            if line == end {
                break;
            }
            body.push_str(line);
        }
        if label.contains("PRIVATE") {
            return Err(format!(
                "a {label}: give the public key only (openssl pkey -in key.pem -pubout), never the private one"
            ));
        }
        let der = STANDARD.decode(&body).map_err(|_| format!("the PEM block {label:?} is not base64"))?;
        let key = match label {
            "PUBLIC KEY" => der::subject_public_key_info(&der)?,
            "RSA PUBLIC KEY" => {
                let mut outer = der::Reader::new(&der);
                let mut rsa = der::Reader::new(outer.expect(der::SEQUENCE, "RSAPublicKey")?);
                let n = rsa.expect(der::INTEGER, "the RSA modulus")?;
                let e = rsa.expect(der::INTEGER, "the RSA exponent")?;
                let strip = |bytes: &[u8]| bytes.iter().copied().skip_while(|byte| *byte == 0).collect::<Vec<u8>>();
                PublicKey::Rsa { n: strip(n), e: strip(e) }
            }
            other => return Err(format!("a PEM block {other:?}: expected PUBLIC KEY")),
        };
        let key = match key {
            PublicKey::Rsa { n, e } => rsa_key(n, e)?,
            other => other,
        };
        keys.push(Key { kid: None, alg: None, material: Material::Public(key) });
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"an HMAC secret of thirty-two bytes or more";

    fn hs256(header: &str, claims: &str, secret: &[u8]) -> String {
        let signing_input = format!("{}.{}", URL_SAFE_NO_PAD.encode(header), URL_SAFE_NO_PAD.encode(claims));
        let tag = ring::hmac::sign(&ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret), signing_input.as_bytes());
        format!("{signing_input}.{}", URL_SAFE_NO_PAD.encode(tag.as_ref()))
    }

    fn hmac_verifier(settings: JwtSettings) -> JwtVerifier {
        let jwks = format!(r#"{{"keys":[{{"kty":"oct","kid":"k1","k":"{}"}}]}}"#, URL_SAFE_NO_PAD.encode(SECRET));
        JwtVerifier::from_text(&jwks, settings).unwrap()
    }

    #[test]
    fn a_signed_token_names_its_user_and_roles_until_it_expires() {
        let verifier = hmac_verifier(JwtSettings::default());
        let token = hs256(
            r#"{"alg":"HS256","kid":"k1","typ":"JWT"}"#,
            r#"{"sub":"device-7","roles":["sensors","ops"],"exp":1000}"#,
            SECRET,
        );
        assert!(looks_like_jwt(&token));
        let identity = verifier.verify(&token, 999_000).unwrap();
        assert_eq!(identity.user, "device-7");
        assert_eq!(identity.roles, ["sensors", "ops"]);
        assert_eq!(identity.expires_ms, Some(1_000_000 + LEEWAY_MS));
        assert_eq!(verifier.verify(&token, 1_000_000 + LEEWAY_MS), Err("the JWT has expired (exp)"));
        let scoped = hs256(r#"{"alg":"HS256"}"#, r#"{"sub":"a","roles":"x y"}"#, SECRET);
        assert_eq!(verifier.verify(&scoped, 0).unwrap().roles, ["x", "y"]);
    }

    #[test]
    fn forged_foreign_and_malformed_tokens_are_refused_with_a_reason() {
        let verifier = hmac_verifier(JwtSettings::default());
        let claims = r#"{"sub":"a"}"#;
        let cases = [
            (hs256(r#"{"alg":"HS256"}"#, claims, b"another secret of thirty-two bytes!!"), "does not verify"),
            (hs256(r#"{"alg":"HS256","kid":"k2"}"#, claims, SECRET), "key id"),
            (hs256(r#"{"alg":"none"}"#, claims, SECRET), "none"),
            (hs256(r#"{"alg":"RS256"}"#, claims, SECRET), "algorithm"),
            (hs256(r#"{"alg":"HS256","crit":["b64"]}"#, claims, SECRET), "critical"),
            (hs256(r#"{"alg":"HS256"}"#, r#"{"sub":"a","aud":"x"}"#, SECRET), "audience"),
            (hs256(r#"{"alg":"HS256"}"#, r#"{"sub":"a","nbf":99999}"#, SECRET), "not valid yet"),
            (hs256(r#"{"alg":"HS256"}"#, r#"{"sub":""}"#, SECRET), "user"),
            (hs256(r#"{"alg":"HS256"}"#, r#"{"name":"a"}"#, SECRET), "no user claim"),
            (hs256(r#"{"alg":"HS256"}"#, "[1]", SECRET), "not a JSON object"),
            ("a.b".to_string(), "three parts"),
            ("eyJ.e30.!!".to_string(), "header"),
        ];
        for (token, reason) in cases {
            let refused = verifier.verify(&token, 0).unwrap_err();
            assert!(refused.contains(reason), "{token}: {refused:?} should say {reason:?}");
        }
        let strict = hmac_verifier(JwtSettings {
            issuer: Some("https://id.example".into()),
            audience: Some("onehop".into()),
            ..JwtSettings::default()
        });
        let good =
            hs256(r#"{"alg":"HS256"}"#, r#"{"sub":"a","iss":"https://id.example","aud":["x","onehop"]}"#, SECRET);
        strict.verify(&good, 0).unwrap();
        let other_issuer = hs256(r#"{"alg":"HS256"}"#, r#"{"sub":"a","iss":"https://evil","aud":"onehop"}"#, SECRET);
        assert!(strict.verify(&other_issuer, 0).unwrap_err().contains("issuer"));
    }

    #[test]
    fn key_files_that_cannot_verify_are_refused() {
        for (text, reason) in [
            (r#"{"keys":[]}"#, "no signing key"),
            (r#"{"kty":"oct","k":"c2hvcnQ"}"#, "shorter than 32"),
            (r#"{"kty":"RSA","n":"AQAB","e":"AQAB"}"#, "fewer than 2048"),
            (r#"{"kty":"EC","crv":"P-521","x":"","y":""}"#, "P-256"),
            (r#"{"kty":"OKP","crv":"Ed25519","x":"AAAA","d":"AAAA"}"#, "32 bytes"),
            ("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n", "public key only"),
            ("-----BEGIN PUBLIC KEY-----\nAAAA\n", "no end"),
            ("nothing here", "no signing key"),
        ] {
            let refused = JwtVerifier::from_text(text, JwtSettings::default()).unwrap_err();
            assert!(refused.contains(reason), "{text}: {refused:?} should say {reason:?}");
        }
        let encryption_only = r#"{"keys":[{"kty":"RSA","use":"enc","n":"AQAB","e":"AQAB"}]}"#;
        assert!(JwtVerifier::from_text(encryption_only, JwtSettings::default()).is_err());
    }
}

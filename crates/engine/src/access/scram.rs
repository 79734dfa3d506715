//! The server side of a SCRAM exchange (RFC 5802, RFC 7677), as Kafka's SASL SCRAM-SHA-256
//! and SCRAM-SHA-512 run it: the client proves it knows the password without sending it, and
//! the server proves it holds the user's credential.
//!
//! ```text
//! client-first  n,,n=alice,r=<client nonce>
//! server-first  r=<client nonce><server nonce>,s=<salt>,i=4096
//! client-final  c=biws,r=<both nonces>,p=<proof>
//! server-final  v=<server signature>
//! ```
//!
//! A user that does not exist gets a made-up salt (the same one every time, from a key of the
//! process) and fails at the proof, like a wrong password, so the exchange does not reveal
//! which users exist.

use base64::Engine as _;
use rand::RngCore;
use subtle::ConstantTimeEq;

use super::credential::{ITERATIONS_DEFAULT, ScramHash};
use super::{Access, LoginFailure, Principal};
use crate::error::EngineError;

/// Longest SCRAM message taken: a user name, a nonce and a proof fit in far less.
pub const MESSAGE_BYTES_MAX: usize = 4096;
const SERVER_NONCE_BYTES: usize = 24;

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

fn failed() -> EngineError {
    EngineError::Unauthenticated(LoginFailure::WrongPassword)
}

fn malformed(what: &str) -> EngineError {
    EngineError::InvalidDefinition(format!("a malformed SCRAM message: {what}"))
}

/// A SCRAM exchange after the server's first message, waiting for the client's final one.
pub struct ScramExchange {
    hash: ScramHash,
    /// `None` for a user that does not exist: the exchange runs on and fails at the proof.
    user: Option<String>,
    /// The user the client names, existing or not.
    claimed: String,
    stored_key: Vec<u8>,
    server_key: Vec<u8>,
    gs2_header: String,
    client_first_bare: String,
    server_first: String,
    nonce: String,
}

/// Decodes a SCRAM user name (`=2C` is `,`, `=3D` is `=`); `None` for any other `=`.
fn decode_name(text: &str) -> Option<String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('=') {
        out.push_str(&rest[..at]);
        match rest.get(at..at + 3) {
            Some("=2C") => out.push(','),
            Some("=3D") => out.push('='),
            _ => return None,
        }
        rest = &rest[at + 3..];
    }
    out.push_str(rest);
    Some(out)
}

impl ScramExchange {
    /// Takes the client's first message; answers the server's first.
    pub fn start(
        access: &Access,
        hash: ScramHash,
        client_first: &[u8],
    ) -> Result<(ScramExchange, Vec<u8>), EngineError> {
        ScramExchange::start_as(access, hash, client_first, None)
    }

    /// [`ScramExchange::start`] for a protocol that names the user before the exchange (the
    /// Postgres startup message): `user` is the one logging in, whatever `n=` says (libpq sends
    /// it empty).
    pub fn start_as(
        access: &Access,
        hash: ScramHash,
        client_first: &[u8],
        user: Option<&str>,
    ) -> Result<(ScramExchange, Vec<u8>), EngineError> {
        if client_first.len() > MESSAGE_BYTES_MAX {
            return Err(malformed("too long"));
        }
        let text = std::str::from_utf8(client_first).map_err(|_| malformed("not UTF-8"))?;
        // gs2 header: channel binding flag, an optional authorization identity, then the bare
        // message. Channel binding is not offered, so `p=` is refused.
        let mut parts = text.splitn(3, ',');
        let (flag, authzid, bare) = (parts.next(), parts.next(), parts.next());
        let (Some(flag), Some(authzid), Some(bare)) = (flag, authzid, bare) else {
            return Err(malformed("expected a gs2 header and the bare message"));
        };
        if flag != "n" && flag != "y" {
            return Err(malformed("channel binding is not supported"));
        }
        let mut name = None;
        let mut client_nonce = None;
        for attribute in bare.split(',') {
            match attribute.split_once('=') {
                Some(("n", value)) => name = Some(decode_name(value).ok_or_else(|| malformed("a bad user name"))?),
                Some(("r", value)) if !value.is_empty() => client_nonce = Some(value.to_string()),
                // Kafka's delegation tokens say `tokenauth=true`; onehop has none to check.
                Some(("tokenauth", _)) => return Err(failed()),
                Some(("m", _)) => return Err(malformed("mandatory extensions are not supported")),
                _ => {}
            }
        }
        let name = user.map(str::to_string).or(name);
        let (Some(name), Some(client_nonce)) = (name, client_nonce) else {
            return Err(malformed("expected n= and r="));
        };
        if let Some(authorized) = authzid.strip_prefix("a=")
            && decode_name(authorized).as_deref() != Some(name.as_str())
        {
            return Err(failed());
        }
        let defs = access.defs();
        let credential = defs.users.get(&name).and_then(|user| user.credentials.iter().find(|c| c.hash == hash));
        let (user, salt, iterations, stored_key, server_key) = match credential {
            Some(credential) => (
                Some(name.clone()),
                credential.salt.clone(),
                credential.iterations,
                credential.stored_key.clone(),
                credential.server_key.clone(),
            ),
            None => {
                let salt = hash.hmac(&access.verified_key, name.as_bytes())[..16].to_vec();
                let none = vec![0u8; hash.key_bytes()];
                (None, salt, ITERATIONS_DEFAULT, none.clone(), none)
            }
        };
        let mut server_nonce = [0u8; SERVER_NONCE_BYTES];
        rand::rng().fill_bytes(&mut server_nonce);
        let nonce = format!("{client_nonce}{}", b64().encode(server_nonce));
        let server_first = format!("r={nonce},s={},i={iterations}", b64().encode(&salt));
        let exchange = ScramExchange {
            hash,
            claimed: name.clone(),
            user,
            stored_key,
            server_key,
            gs2_header: format!("{flag},{authzid},"),
            client_first_bare: bare.to_string(),
            server_first: server_first.clone(),
            nonce,
        };
        Ok((exchange, server_first.into_bytes()))
    }

    /// The user the client logs in as (who may not exist).
    pub fn claimed_user(&self) -> &str {
        &self.claimed
    }

    /// Takes the client's final message: the principal and the server's final message when
    /// the proof holds.
    pub fn finish(self, access: &Access, client_final: &[u8]) -> Result<(Principal, Vec<u8>), EngineError> {
        if client_final.len() > MESSAGE_BYTES_MAX {
            return Err(malformed("too long"));
        }
        let text = std::str::from_utf8(client_final).map_err(|_| malformed("not UTF-8"))?;
        let (without_proof, proof) = text.rsplit_once(",p=").ok_or_else(|| malformed("no proof"))?;
        let mut binding = None;
        let mut nonce = None;
        for attribute in without_proof.split(',') {
            match attribute.split_once('=') {
                Some(("c", value)) => binding = Some(value),
                Some(("r", value)) => nonce = Some(value),
                _ => {}
            }
        }
        // The nonce must end with the one the server sent. librdkafka sends its own nonce
        // again in front of it, and Kafka's brokers take that (they check the end only); the
        // part the server chose is there either way, which is what keeps a replay out.
        let nonce_holds = nonce.is_some_and(|nonce| nonce.ends_with(&self.nonce));
        if binding != Some(b64().encode(&self.gs2_header).as_str()) || !nonce_holds {
            return Err(failed());
        }
        let proof = b64().decode(proof).map_err(|_| malformed("a proof that is not base64"))?;
        let auth_message = format!("{},{},{without_proof}", self.client_first_bare, self.server_first);
        let client_signature = self.hash.hmac(&self.stored_key, auth_message.as_bytes());
        if proof.len() != client_signature.len() {
            return Err(failed());
        }
        let client_key: Vec<u8> = proof.iter().zip(&client_signature).map(|(a, b)| a ^ b).collect();
        let matches = bool::from(self.hash.digest(&client_key).ct_eq(&self.stored_key));
        let Some(user) = self.user.filter(|_| matches) else {
            return Err(failed());
        };
        // The user may have been dropped during the exchange.
        if !access.defs().users.contains_key(&user) {
            return Err(failed());
        }
        let server_signature = self.hash.hmac(&self.server_key, auth_message.as_bytes());
        let server_final = format!("v={}", b64().encode(server_signature));
        Ok((access.principal(Some(&user)), server_final.into_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::credential::ScramCredential;
    use crate::access::model::{AccessDefs, UserDef};

    /// The client side, as a Kafka client computes it.
    fn client_final(hash: ScramHash, password: &str, client_first_bare: &str, server_first: &str) -> String {
        let fields: Vec<&str> = server_first.split(',').collect();
        let nonce = fields[0].strip_prefix("r=").unwrap();
        let salt = b64().decode(fields[1].strip_prefix("s=").unwrap()).unwrap();
        let iterations: u32 = fields[2].strip_prefix("i=").unwrap().parse().unwrap();
        let salted = hash.salted_password(password.as_bytes(), &salt, iterations);
        let client_key = hash.hmac(&salted, b"Client Key");
        let stored_key = hash.digest(&client_key);
        let without_proof = format!("c=biws,r={nonce}");
        let auth_message = format!("{client_first_bare},{server_first},{without_proof}");
        let signature = hash.hmac(&stored_key, auth_message.as_bytes());
        let proof: Vec<u8> = client_key.iter().zip(&signature).map(|(a, b)| a ^ b).collect();
        format!("{without_proof},p={}", b64().encode(proof))
    }

    fn access() -> Access {
        let mut defs = AccessDefs::default();
        let credentials = [ScramHash::Sha256, ScramHash::Sha512]
            .into_iter()
            .map(|hash| ScramCredential::new(hash, b"pencil", ITERATIONS_DEFAULT))
            .collect();
        defs.users.insert(
            "us,er".into(),
            UserDef { name: "us,er".into(), credentials, created_ms: 0, limits: Default::default() },
        );
        Access::new(defs)
    }

    #[test]
    fn a_scram_exchange_logs_in_with_the_right_password_only() {
        let access = access();
        for hash in [ScramHash::Sha256, ScramHash::Sha512] {
            let bare = "n=us=2Cer,r=fyko+d2lbbFgONRv9qkxdawL";
            let (exchange, server_first) =
                ScramExchange::start(&access, hash, format!("n,,{bare}").as_bytes()).unwrap();
            let server_first = String::from_utf8(server_first).unwrap();
            assert!(server_first.starts_with("r=fyko+d2lbbFgONRv9qkxdawL") && server_first.ends_with(",i=4096"));
            let last = client_final(hash, "pencil", bare, &server_first);
            let (principal, server_final) = exchange.finish(&access, last.as_bytes()).unwrap();
            assert_eq!(principal.user(), Some("us,er"));
            assert!(server_final.starts_with(b"v="));

            let (exchange, server_first) =
                ScramExchange::start(&access, hash, format!("n,,{bare}").as_bytes()).unwrap();
            let last = client_final(hash, "wrong", bare, &String::from_utf8(server_first).unwrap());
            assert!(matches!(exchange.finish(&access, last.as_bytes()), Err(EngineError::Unauthenticated(_))));
        }
        // An unknown user gets a salt all the same, the same one each time, and fails.
        let first = |name: &str| {
            let message = format!("n,,n={name},r=abc");
            let (_, server_first) = ScramExchange::start(&access, ScramHash::Sha256, message.as_bytes()).unwrap();
            let text = String::from_utf8(server_first).unwrap();
            text.split(',').nth(1).unwrap().to_string()
        };
        assert_eq!(first("nobody"), first("nobody"));
        let (exchange, server_first) = ScramExchange::start(&access, ScramHash::Sha256, b"n,,n=nobody,r=abc").unwrap();
        let last =
            client_final(ScramHash::Sha256, "pencil", "n=nobody,r=abc", &String::from_utf8(server_first).unwrap());
        assert!(exchange.finish(&access, last.as_bytes()).is_err());
        for bad in [&b"p=tls-unique,,n=a,r=b"[..], b"n,,r=b", b"n,,n=a=2Xb,r=c", b"nonsense", b"n,,n=a,r=b,m=x"] {
            assert!(ScramExchange::start(&access, ScramHash::Sha256, bad).is_err(), "{bad:?}");
        }
    }
}

//! Passwords as the server keeps them: SCRAM credentials (RFC 5802, RFC 7677), the form
//! Postgres and Kafka store. The password itself is never kept, only a salt, an iteration count
//! and two keys derived from it, so a copy of the catalog does not give the passwords away and
//! costs an attacker the iterations per guess.
//!
//! One credential serves every way a client proves its password: a password sent as it is
//! (HTTP Basic, MQTT, Kafka's SASL PLAIN) is checked by deriving the stored key again; a SCRAM
//! exchange (Kafka's SASL SCRAM-SHA-256/512) proves it without sending it. A user keeps one
//! credential per hash, since a SCRAM-SHA-512 client needs keys derived with SHA-512.

use hmac::{Hmac, Mac};
use rand::RngCore;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256, Sha512};
use subtle::ConstantTimeEq;

/// PBKDF2 iterations of a new credential: Postgres's and Kafka's default. Each check of a
/// password sent in clear costs twice this many SHA blocks (milliseconds of CPU), which is why
/// a connection is checked once and HTTP keeps what it checked (see `Access`).
pub const ITERATIONS_DEFAULT: u32 = 4096;
/// Fewest iterations a stored credential may have: Kafka refuses fewer too.
pub const ITERATIONS_MIN: u32 = 4096;
/// Most iterations a stored credential may have: a damaged or hostile record must not make a
/// login take minutes.
pub const ITERATIONS_MAX: u32 = 1 << 20;
const SALT_BYTES: usize = 16;

/// The hash a SCRAM credential is derived with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ScramHash {
    #[serde(rename = "SCRAM-SHA-256")]
    Sha256,
    #[serde(rename = "SCRAM-SHA-512")]
    Sha512,
}

impl ScramHash {
    pub fn name(self) -> &'static str {
        match self {
            ScramHash::Sha256 => "SCRAM-SHA-256",
            ScramHash::Sha512 => "SCRAM-SHA-512",
        }
    }

    /// The digest length in bytes: the length of every key.
    pub fn key_bytes(self) -> usize {
        match self {
            ScramHash::Sha256 => 32,
            ScramHash::Sha512 => 64,
        }
    }

    pub fn hmac(self, key: &[u8], message: &[u8]) -> Vec<u8> {
        match self {
            ScramHash::Sha256 => {
                let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key length");
                mac.update(message);
                mac.finalize().into_bytes().to_vec()
            }
            ScramHash::Sha512 => {
                let mut mac = Hmac::<Sha512>::new_from_slice(key).expect("HMAC takes any key length");
                mac.update(message);
                mac.finalize().into_bytes().to_vec()
            }
        }
    }

    pub fn digest(self, message: &[u8]) -> Vec<u8> {
        match self {
            ScramHash::Sha256 => Sha256::digest(message).to_vec(),
            ScramHash::Sha512 => Sha512::digest(message).to_vec(),
        }
    }

    /// SCRAM's `Hi()`: PBKDF2 with this hash's HMAC.
    pub fn salted_password(self, password: &[u8], salt: &[u8], iterations: u32) -> Vec<u8> {
        let mut out = vec![0u8; self.key_bytes()];
        match self {
            ScramHash::Sha256 => pbkdf2::pbkdf2_hmac::<Sha256>(password, salt, iterations, &mut out),
            ScramHash::Sha512 => pbkdf2::pbkdf2_hmac::<Sha512>(password, salt, iterations, &mut out),
        }
        out
    }
}

/// A SCRAM credential: what the server keeps of a password.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScramCredential {
    pub hash: ScramHash,
    pub iterations: u32,
    #[serde(with = "hex_bytes")]
    pub salt: Vec<u8>,
    /// `H(HMAC(SaltedPassword, "Client Key"))`: what a client's proof is checked against.
    #[serde(with = "hex_bytes")]
    pub stored_key: Vec<u8>,
    /// `HMAC(SaltedPassword, "Server Key")`: what the server proves itself with.
    #[serde(with = "hex_bytes")]
    pub server_key: Vec<u8>,
}

impl ScramCredential {
    /// A credential for `password`, with a fresh random salt.
    pub fn new(hash: ScramHash, password: &[u8], iterations: u32) -> ScramCredential {
        let mut salt = vec![0u8; SALT_BYTES];
        rand::rng().fill_bytes(&mut salt);
        Self::derive(hash, password, salt, iterations)
    }

    fn derive(hash: ScramHash, password: &[u8], salt: Vec<u8>, iterations: u32) -> ScramCredential {
        let salted = hash.salted_password(password, &salt, iterations);
        let client_key = hash.hmac(&salted, b"Client Key");
        ScramCredential {
            hash,
            iterations,
            stored_key: hash.digest(&client_key),
            server_key: hash.hmac(&salted, b"Server Key"),
            salt,
        }
    }

    /// Whether `password` is the one this credential was made from, compared in constant time.
    pub fn verify(&self, password: &[u8]) -> bool {
        let again = Self::derive(self.hash, password, self.salt.clone(), self.iterations);
        bool::from(again.stored_key.ct_eq(&self.stored_key))
    }

    /// Checks a credential read back from the catalog.
    pub fn validate(&self) -> Result<(), String> {
        if !(ITERATIONS_MIN..=ITERATIONS_MAX).contains(&self.iterations) {
            return Err(format!("{} iterations, outside {ITERATIONS_MIN}..={ITERATIONS_MAX}", self.iterations));
        }
        let length = self.hash.key_bytes();
        if self.salt.is_empty() || self.stored_key.len() != length || self.server_key.len() != length {
            return Err(format!("a {} credential with keys of the wrong length", self.hash.name()));
        }
        Ok(())
    }
}

/// Bytes as lowercase hex in JSON.
mod hex_bytes {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&super::hex(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(deserializer)?;
        super::unhex(&text).ok_or_else(|| serde::de::Error::custom("not an even-length lowercase hex string"))
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

pub(crate) fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|at| {
            let pair = text.get(at..at + 2)?;
            if pair.bytes().any(|byte| byte.is_ascii_uppercase()) {
                return None;
            }
            u8::from_str_radix(pair, 16).ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7677's example exchange: user "user", password "pencil". The server signature the
    /// RFC lists follows from the server key and the exchange's messages, and the client proof
    /// from the stored key, so both check the derivation end to end.
    #[test]
    fn scram_sha_256_keys_match_rfc_7677() {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD;
        let salt = b64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        let credential = ScramCredential::derive(ScramHash::Sha256, b"pencil", salt, 4096);
        let nonce = "rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0";
        let auth_message =
            format!("n=user,r=rOprNGfwEbeRWgbNEkqO,r={nonce},s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096,c=biws,r={nonce}");
        let server_signature = ScramHash::Sha256.hmac(&credential.server_key, auth_message.as_bytes());
        assert_eq!(b64.encode(server_signature), "6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=");
        let proof = b64.decode("dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=").unwrap();
        let client_signature = ScramHash::Sha256.hmac(&credential.stored_key, auth_message.as_bytes());
        let client_key: Vec<u8> = proof.iter().zip(&client_signature).map(|(a, b)| a ^ b).collect();
        assert_eq!(ScramHash::Sha256.digest(&client_key), credential.stored_key);
        assert!(credential.verify(b"pencil"));
        assert!(!credential.verify(b"pencil "));
        assert!(!credential.verify(b""));
    }

    #[test]
    fn a_credential_round_trips_through_json_and_checks_its_bounds() {
        for hash in [ScramHash::Sha256, ScramHash::Sha512] {
            let credential = ScramCredential::new(hash, "pässword".as_bytes(), ITERATIONS_MIN);
            let text = serde_json::to_string(&credential).unwrap();
            assert!(!text.contains("pässword"));
            let back: ScramCredential = serde_json::from_str(&text).unwrap();
            assert_eq!(back, credential);
            back.validate().unwrap();
            assert!(back.verify("pässword".as_bytes()));
            assert!(!back.verify(b"password"));
        }
        let mut weak = ScramCredential::new(ScramHash::Sha256, b"x", ITERATIONS_MIN);
        weak.iterations = 1;
        assert!(weak.validate().is_err());
        weak.iterations = ITERATIONS_MAX + 1;
        assert!(weak.validate().is_err());
        assert_eq!(unhex("0aFF"), None);
        assert_eq!(unhex("0a1"), None);
        assert_eq!(unhex("0aff"), Some(vec![0x0a, 0xff]));
    }
}

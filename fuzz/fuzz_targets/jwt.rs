//! Arbitrary bytes as a JWT, as a key file (JWKS or PEM) and as DER (a public key, a client
//! certificate): each is taken or refused with a reason, never a panic, and a token checked
//! against a key it was not signed with never verifies.
#![no_main]

use libfuzzer_sys::fuzz_target;
use onehop_engine::access::der;
use onehop_engine::access::jwt::{JwtSettings, JwtVerifier, looks_like_jwt};

/// An HMAC key no fuzzer input is signed with (guessing an HMAC-SHA256 tag is not a thing a
/// fuzzer does): any token that verifies against it is a bug.
const JWKS: &str = r#"{"keys":[{"kty":"oct","kid":"k","k":"ZnV6emluZyBrZXkgb2YgdGhpcnR5LXR3byBieXRlcyEhIQ"}]}"#;

fuzz_target!(|data: &[u8]| {
    let verifier = JwtVerifier::from_text(JWKS, JwtSettings::default()).expect("the fuzzing key");
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = looks_like_jwt(text);
        assert!(verifier.verify(text, 0).is_err(), "a token not signed with the key verified: {text:?}");
        if let Ok(parsed) = JwtVerifier::from_text(text, JwtSettings::default()) {
            assert!(parsed.key_count() > 0);
            let _ = parsed.verify("eyJhbGciOiJIUzI1NiJ9.e30.AAAA", 0);
        }
    }
    let _ = der::subject_public_key_info(data);
    let _ = der::certificate_common_name(data);
});

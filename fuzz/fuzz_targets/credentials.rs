//! Arbitrary bytes as an `Authorization` header's value, and as a stored SCRAM credential read
//! back from the catalog: each is taken or refused with a reason, never a panic; a credential
//! that validates has keys of its hash's length and iterations within bounds.
#![no_main]

use libfuzzer_sys::fuzz_target;
use onehop_engine::access::credential::{ITERATIONS_MAX, ITERATIONS_MIN, ScramCredential};
use onehop_server::http::auth::{Credentials, parse_authorization};

fuzz_target!(|data: &[u8]| {
    if let Ok(Credentials::Password { user, .. }) = parse_authorization(data) {
        assert!(!user.contains(':'), "the user name ends at the first colon");
    }
    if let Ok(credential) = serde_json::from_slice::<ScramCredential>(data)
        && credential.validate().is_ok()
    {
        assert!((ITERATIONS_MIN..=ITERATIONS_MAX).contains(&credential.iterations));
        assert_eq!(credential.stored_key.len(), credential.hash.key_bytes());
    }
});

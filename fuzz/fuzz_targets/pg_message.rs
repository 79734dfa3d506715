//! Arbitrary bytes as what a Postgres client sends: the first message's body (startup, SSL,
//! GSS or cancel request), a message after it with any type byte, and a SASL initial response;
//! and, for a Bind, its parameters decoded as each type in text and binary. Every input ends
//! in a message or an error naming what is wrong, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use onehop_server::pg::{codec, types};

fuzz_target!(|data: &[u8]| {
    let _ = codec::decode_startup(data);
    let _ = codec::decode_sasl_initial(data);
    let Some((&tag, body)) = data.split_first() else { return };
    if let Ok(codec::Frontend::Bind { parameters, .. }) = codec::decode(tag, body) {
        for parameter in parameters.iter().flatten() {
            for oid in [types::BOOL, types::INT2, types::INT4, types::INT8, types::FLOAT4, types::FLOAT8, types::TEXT, types::UNKNOWN, 600] {
                let _ = types::decode_parameter(parameter, oid, false);
                let _ = types::decode_parameter(parameter, oid, true);
            }
        }
    }
});

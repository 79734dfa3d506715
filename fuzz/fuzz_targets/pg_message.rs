//! Arbitrary bytes as what a Postgres client sends: the first message's body (startup, SSL,
//! GSS or cancel request), a message after it with any type byte, and a SASL initial response;
//! and, for a Bind, its parameters decoded as each type in text and binary; and the bytes as
//! COPY data in the text and CSV formats, and as a SUBSCRIBE statement. Every input ends in a
//! message, rows, a plan or an error naming what is wrong, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use onehop_server::pg::{codec, copy, subscribe, types};
use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::parser::Parser;

fn format(sql: &str) -> copy::Format {
    let statement = Parser::parse_sql(&PostgreSqlDialect {}, sql).expect("parses").remove(0);
    match copy::plan(&statement) {
        Ok(copy::Copy::In { format, .. }) => format,
        _ => unreachable!("a COPY FROM STDIN"),
    }
}

fuzz_target!(|data: &[u8]| {
    for sql in ["COPY t FROM STDIN", "COPY t FROM STDIN WITH (FORMAT csv, HEADER)", "COPY t FROM STDIN WITH (FORMAT csv, QUOTE '|', ESCAPE '!')"] {
        let format = format(sql);
        if let Ok(lines) = copy::decode(data, &format) {
            // What decodes goes out and comes back the same.
            for line in lines.iter().take(64) {
                let fields: Vec<Option<&str>> = line.iter().map(Option::as_deref).collect();
                let again = copy::decode(&copy::encode_line(&fields, &format), &copy::Format { header: false, ..format.clone() });
                assert_eq!(again.ok(), Some(vec![line.clone()]));
            }
        }
    }
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = subscribe::parse(text);
    }
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

//! `POST /streams/{s}` publishes, `GET /streams/{s}` reads.
//!
//! Publishing takes the body as one record's value (with `?key=` and `?subject=`), or, with
//! `Content-Type: application/x-ndjson`, one JSON envelope per line:
//! `{"key":…,"subject":…,"headers":{…},"value":…}` where the value is stored as its JSON text
//! and a missing or null value is a tombstone. The answer says where each record went and is
//! sent only once the records are durable (`Onehop-Durability: async|fsync` overrides the
//! stream's default).

use std::collections::BTreeMap;
use std::io::Write as _;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use base64::Engine as _;
use onehop_engine::subject::validate_subject;
use onehop_engine::{Position, Published, Stream};
use onehop_log::{Durability, NewRecord, Record, Text};
use serde::Deserialize;
use serde_json::{Value, json};

use super::AppState;
use super::error::ApiError;
use onehop_engine::units::parse_rfc3339_ms;

/// The request header that overrides a stream's durability for one publish.
pub const DURABILITY_HEADER: &str = "onehop-durability";
/// Records a read returns when it does not say.
const READ_LIMIT_DEFAULT: usize = 100;
/// Most records one read returns.
const READ_LIMIT_MAX: usize = 10_000;
/// Bytes of keys and values one read collects at most (about; at least one record).
const READ_BYTES_MAX: usize = 16 * 1024 * 1024;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PublishQuery {
    key: Option<String>,
    subject: Option<String>,
}

/// One line of an NDJSON publish.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Envelope {
    key: Option<String>,
    subject: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default)]
    value: Option<Value>,
}

fn query_error(rejection: QueryRejection) -> ApiError {
    ApiError::bad_request("bad_query", rejection.body_text())
}

/// The query string as `T`: one URL serves reads and subscriptions, whose parameters differ, so
/// it is parsed once the kind of request is known.
fn typed_query<T: serde::de::DeserializeOwned>(raw: &str) -> Result<T, ApiError> {
    let uri: axum::http::Uri = format!("/?{raw}")
        .parse()
        .map_err(|_| ApiError::bad_request("bad_query", "the query string is not valid in a URL"))?;
    Query::try_from_uri(&uri).map(|Query(query)| query).map_err(query_error)
}

pub fn durability(headers: &HeaderMap) -> Result<Option<Durability>, ApiError> {
    let Some(value) = headers.get(DURABILITY_HEADER) else { return Ok(None) };
    let text = value.to_str().unwrap_or_default();
    text.parse().map(Some).map_err(|_| {
        ApiError::bad_request(
            "bad_durability",
            format!("Onehop-Durability must be \"fsync\" or \"async\", not {text:?}"),
        )
    })
}

fn checked_subject(subject: Option<String>, line: Option<usize>) -> Result<Option<Text>, ApiError> {
    let Some(subject) = subject else { return Ok(None) };
    validate_subject(&subject).map_err(|error| {
        let at = line.map_or_else(String::new, |line| format!("line {line}: "));
        ApiError::bad_request("bad_subject", format!("{at}subject {subject:?}: {error}"))
    })?;
    Ok(Some(subject.into()))
}

fn is_ndjson(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with("application/x-ndjson") || value.starts_with("application/jsonl"))
}

fn parse_envelopes(body: &[u8]) -> Result<Vec<NewRecord>, ApiError> {
    let text =
        std::str::from_utf8(body).map_err(|_| ApiError::bad_request("bad_json", "the NDJSON body is not UTF-8"))?;
    let mut records = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let line_number = index + 1;
        if line.trim().is_empty() {
            continue;
        }
        let envelope: Envelope = serde_json::from_str(line)
            .map_err(|error| ApiError::bad_request("bad_json", format!("line {line_number}: {error}")))?;
        records.push(NewRecord {
            timestamp_ms: None,
            key: envelope.key.map(Bytes::from),
            subject: checked_subject(envelope.subject, Some(line_number))?,
            headers: envelope.headers.into_iter().map(|(name, value)| (name.into(), Bytes::from(value))).collect(),
            value: match envelope.value {
                None | Some(Value::Null) => None,
                Some(value) => Some(Bytes::from(serde_json::to_vec(&value).expect("a JSON value serializes"))),
            },
        });
    }
    if records.is_empty() {
        return Err(ApiError::bad_request("empty_batch", "the NDJSON body holds no records"));
    }
    Ok(records)
}

pub async fn publish(
    State(state): State<AppState>,
    Path(name): Path<String>,
    query: Result<Query<PublishQuery>, QueryRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(query) = query.map_err(query_error)?;
    let durability = durability(&headers)?;
    let body = body.map_err(|rejection| ApiError {
        status: rejection.status(),
        code: if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE { "body_too_large" } else { "bad_body" },
        message: format!("{} (the limit is {} bytes)", rejection.body_text(), state.body_bytes_max),
    })?;
    let (records, batch) = if is_ndjson(&headers) {
        if query.key.is_some() || query.subject.is_some() {
            return Err(ApiError::bad_request(
                "bad_query",
                "with an NDJSON body, give each record's key and subject in its envelope, not in the query",
            ));
        }
        (parse_envelopes(&body)?, true)
    } else {
        let record = NewRecord {
            timestamp_ms: None,
            key: query.key.map(Bytes::from),
            subject: checked_subject(query.subject, None)?,
            headers: Vec::new(),
            value: Some(body),
        };
        (vec![record], false)
    };
    let stream = state.engine.stream_or_create(&name).await?;
    let published = stream.publish(&records, durability).await?;
    Ok(Json(if batch {
        json!({ "stream": name, "records": published })
    } else {
        let Published { partition, offset } = published[0];
        json!({ "stream": name, "partition": partition, "offset": offset })
    }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadQuery {
    from: Option<String>,
    limit: Option<usize>,
    partition: Option<u32>,
}

pub fn parse_position(text: Option<&str>) -> Result<Position, ApiError> {
    Ok(match text {
        None | Some("earliest") => Position::Earliest,
        Some("latest") => Position::Latest,
        Some(text) if !text.is_empty() && text.bytes().all(|byte| byte.is_ascii_digit()) => Position::Offset(
            text.parse().map_err(|_| ApiError::bad_request("bad_offset", format!("offset {text} is too large")))?,
        ),
        Some(text) => Position::Time(parse_rfc3339_ms(text).map_err(|reason| {
            ApiError::bad_request(
                "bad_offset",
                format!("from={text:?}: expected earliest, latest, an offset or an RFC 3339 time ({reason})"),
            )
        })?),
    })
}

/// A record as JSON. The value is the JSON it holds when it holds JSON; otherwise `value_text`
/// (UTF-8) or `value_base64`. A tombstone has `"value": null`. Keys likewise (`key` or
/// `key_base64`).
pub fn record_json(partition: u32, record: &Record) -> Value {
    let mut object = serde_json::Map::new();
    object.insert("id".into(), json!(format!("{partition}:{}", record.offset)));
    object.insert("partition".into(), json!(partition));
    object.insert("offset".into(), json!(record.offset));
    object.insert("timestamp".into(), json!(record.timestamp_ms));
    if let Some(key) = &record.key {
        match std::str::from_utf8(key) {
            Ok(key) => object.insert("key".into(), json!(key)),
            Err(_) => object.insert("key_base64".into(), json!(base64::engine::general_purpose::STANDARD.encode(key))),
        };
    }
    if let Some(subject) = &record.subject {
        object.insert("subject".into(), json!(subject.as_str()));
    }
    let (headers, headers_base64) = headers_json(record);
    if !headers.is_empty() {
        object.insert("headers".into(), Value::Object(headers));
    }
    if !headers_base64.is_empty() {
        object.insert("headers_base64".into(), Value::Object(headers_base64));
    }
    match &record.value {
        None => {
            object.insert("value".into(), Value::Null);
        }
        Some(value) => {
            if let Ok(parsed) = serde_json::from_slice::<Value>(value) {
                object.insert("value".into(), parsed);
            } else if let Ok(text) = std::str::from_utf8(value) {
                object.insert("value_text".into(), json!(text));
            } else {
                object.insert("value_base64".into(), json!(base64::engine::general_purpose::STANDARD.encode(value)));
            }
        }
    }
    Value::Object(object)
}

/// A record's headers as JSON objects: those whose value is UTF-8 text, and the others with
/// their value in base64 (an MQTT 5 correlation data is binary), as keys and values are.
fn headers_json(record: &Record) -> (serde_json::Map<String, Value>, serde_json::Map<String, Value>) {
    let (mut text, mut binary) = (serde_json::Map::new(), serde_json::Map::new());
    for (name, value) in record.headers.iter() {
        match std::str::from_utf8(value) {
            Ok(value) => text.insert(name.to_string(), json!(value)),
            Err(_) => binary.insert(name.to_string(), json!(base64::engine::general_purpose::STANDARD.encode(value))),
        };
    }
    (text, binary)
}

/// [`record_json`] written out as bytes, copying a JSON value as it is stored instead of
/// parsing and writing it again: what subscriptions send for every record they deliver. A value
/// with a line break in it (pretty-printed JSON) is written again on one line, as SSE needs.
pub fn record_json_bytes(partition: u32, record: &Record) -> Vec<u8> {
    let value = match &record.value {
        Some(value) if is_one_line_json(value) => value.trim_ascii(),
        _ => return record_json(partition, record).to_string().into_bytes(),
    };
    let offset = record.offset;
    let mut out = Vec::with_capacity(value.len() + 128);
    // Into the buffer itself: writing to a Vec cannot fail.
    let _ = write!(
        out,
        "{{\"id\":\"{partition}:{offset}\",\"partition\":{partition},\"offset\":{offset},\"timestamp\":{}",
        record.timestamp_ms
    );
    if let Some(key) = &record.key {
        match std::str::from_utf8(key) {
            Ok(key) => {
                out.extend_from_slice(b",\"key\":");
                serde_json::to_writer(&mut out, key).expect("a string serializes");
            }
            Err(_) => {
                out.extend_from_slice(b",\"key_base64\":\"");
                out.extend_from_slice(base64::engine::general_purpose::STANDARD.encode(key).as_bytes());
                out.push(b'"');
            }
        }
    }
    if let Some(subject) = &record.subject {
        out.extend_from_slice(b",\"subject\":");
        serde_json::to_writer(&mut out, subject.as_str()).expect("a string serializes");
    }
    let (headers, headers_base64) = headers_json(record);
    for (field, headers) in [(&b",\"headers\":"[..], headers), (b",\"headers_base64\":", headers_base64)] {
        if !headers.is_empty() {
            out.extend_from_slice(field);
            serde_json::to_writer(&mut out, &headers).expect("headers serialize");
        }
    }
    out.extend_from_slice(b",\"value\":");
    out.extend_from_slice(value);
    out.push(b'}');
    out
}

/// Whether `value` is one JSON value with no line break anywhere (checked without building it).
fn is_one_line_json(value: &[u8]) -> bool {
    !value.iter().any(|&byte| byte == b'\n' || byte == b'\r')
        && serde_json::from_slice::<serde::de::IgnoredAny>(value).is_ok()
}

/// `GET /streams/{s}`: a read; with `Accept: text/event-stream` an SSE subscription; with a
/// WebSocket upgrade, a socket whose first subscription is this URL's.
pub async fn read_or_subscribe(
    State(state): State<AppState>,
    Path(name): Path<String>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    upgrade: Result<axum::extract::ws::WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse;
    let raw = raw.unwrap_or_default();
    // Not being a WebSocket handshake is no error: it is a read or an SSE subscription.
    if let Ok(upgrade) = upgrade {
        let target = super::subscribe::Target::Stream(name.clone());
        // Refuse a bad first subscription before upgrading, in HTTP.
        let params = super::subscribe::Params::parse(&raw, &target)?;
        state.engine.stream(&name)?;
        let request = super::ws::Request { subscription: "url".into(), target, params };
        let max = state.subscriptions_per_socket_max;
        return Ok(super::ws::configure(upgrade)
            .on_upgrade(move |socket| super::ws::serve(state, socket, Some(request), max))
            .into_response());
    }
    if super::sse::wants_events(&headers) {
        return super::sse::subscribe(state, super::subscribe::Target::Stream(name), &raw, &headers).await;
    }
    let query: ReadQuery = typed_query(&raw)?;
    Ok(read(state, name, query).await?.into_response())
}

async fn read(state: AppState, name: String, query: ReadQuery) -> Result<Json<Value>, ApiError> {
    let stream = state.engine.stream(&name)?;
    let limit = query.limit.unwrap_or(READ_LIMIT_DEFAULT);
    if limit == 0 || limit > READ_LIMIT_MAX {
        return Err(ApiError::bad_request("bad_limit", format!("limit must be between 1 and {READ_LIMIT_MAX}")));
    }
    let position = parse_position(query.from.as_deref())?;
    let partitions: Vec<u32> = match query.partition {
        Some(partition) => {
            stream.partition(partition)?;
            vec![partition]
        }
        None if matches!(position, Position::Offset(_)) && stream.partition_count() > 1 => {
            return Err(ApiError::bad_request(
                "bad_offset",
                format!(
                    "an offset is per partition: add partition=0..{} (stream {name:?} has {} partitions)",
                    stream.partition_count() - 1,
                    stream.partition_count()
                ),
            ));
        }
        None => (0..stream.partition_count()).collect(),
    };
    let (records, next) = read_partitions(&stream, &partitions, position, limit)?;
    Ok(Json(json!({ "stream": name, "records": records, "next": next })))
}

/// Reads partition by partition until `limit` records; returns them and, per partition, the
/// offset to continue from.
fn read_partitions(
    stream: &Stream,
    partitions: &[u32],
    position: Position,
    limit: usize,
) -> Result<(Vec<Value>, BTreeMap<String, u64>), ApiError> {
    let mut records = Vec::new();
    let mut next = BTreeMap::new();
    for &partition in partitions {
        let from = stream.resolve(partition, position)?;
        let left = limit - records.len();
        let read = if left == 0 {
            Vec::new()
        } else {
            stream.read(partition, Position::Offset(from), left, READ_BYTES_MAX)?
        };
        next.insert(partition.to_string(), read.last().map_or(from, |record| record.offset + 1));
        records.extend(read.iter().map(|record| record_json(partition, record)));
    }
    Ok((records, next))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(key: Option<&[u8]>, subject: Option<&str>, headers: &[(&str, &[u8])], value: Option<&[u8]>) -> Record {
        Record {
            offset: 41,
            timestamp_ms: 1_700_000_000_123,
            key: key.map(Bytes::copy_from_slice),
            subject: subject.map(Text::from),
            headers: headers.iter().map(|(name, value)| (Text::from(*name), Bytes::copy_from_slice(value))).collect(),
            value: value.map(Bytes::copy_from_slice),
        }
    }

    #[test]
    fn a_record_written_as_bytes_is_the_record_as_json() {
        let values: [Option<&[u8]>; 9] = [
            Some(br#"{"n":1,"tags":["a","b"],"nested":{"x":null}}"#),
            Some(b"  42 "),
            Some(b"\"text with \\\"quotes\\\"\""),
            Some(b"{\n  \"pretty\": true\n}"),
            Some(b"not json"),
            Some(&[0xff, 0x00, 0x10]),
            Some(b"{\"unfinished\":"),
            Some(b""),
            None,
        ];
        for value in values {
            for (key, subject, headers) in [
                (None, None, &[][..]),
                (Some(&b"k\"1"[..]), Some("a/b"), &[("trace", &b"t1"[..]), ("b", "\u{e9}".as_bytes())][..]),
                (None, None, &[("binary", &[0xff, 0x00][..]), ("text", b"t")][..]),
                (Some(&[0xfe, 0x01][..]), None, &[][..]),
            ] {
                let record = record(key, subject, headers, value);
                let bytes = record_json_bytes(3, &record);
                assert!(!bytes.contains(&b'\n'), "one line: {}", String::from_utf8_lossy(&bytes));
                let parsed: Value = serde_json::from_slice(&bytes).unwrap();
                assert_eq!(parsed, record_json(3, &record), "{}", String::from_utf8_lossy(&bytes));
            }
        }
    }

    #[test]
    fn a_header_that_is_not_text_is_given_in_base64() {
        let record = record(None, None, &[("binary", &[0xff, 0x00][..]), ("text", b"t")], Some(b"1"));
        let json = record_json(0, &record);
        assert_eq!(json["headers"], json!({"text": "t"}), "{json}");
        assert_eq!(json["headers_base64"], json!({"binary": "/wA="}), "{json}");
    }
}

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
use axum::extract::rejection::BytesRejection;
use axum::extract::{Extension, Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use base64::Engine as _;
use onehop_engine::subject::{SubjectFilter, validate_subject};
use onehop_engine::{Durability, NewRecord, Record, Text};
use onehop_engine::{Position, Published, Stream};
use serde::Deserialize;
use serde_json::{Value, json};

use onehop_engine::idempotency::IDEMPOTENCY_HEADER;

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

/// A publish's query: `key` and `subject` of the one record the body is.
#[derive(Default)]
pub struct PublishQuery {
    key: Option<String>,
    subject: Option<String>,
}

impl PublishQuery {
    fn parse(raw: &str) -> Result<PublishQuery, ApiError> {
        let mut query = PublishQuery::default();
        for (name, value) in super::query::pairs(raw)? {
            match name.as_str() {
                "key" => query.key = Some(value),
                "subject" => query.subject = Some(value),
                other => {
                    return Err(ApiError::bad_request(
                        "bad_query",
                        format!("unknown parameter {other:?}: a publish takes key and subject"),
                    ));
                }
            }
        }
        Ok(query)
    }
}

/// One line of an NDJSON publish.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Envelope {
    key: Option<String>,
    subject: Option<String>,
    #[serde(default)]
    headers: EnvelopeHeaders,
    #[serde(default)]
    value: Option<Value>,
}

/// An envelope's headers: an object of names to text or `null`, or, to repeat a name, a list
/// of `[name, text or null]` pairs in order.
#[derive(Deserialize)]
#[serde(untagged, expecting = "headers as an object of names to text or null, or a list of [name, value] pairs")]
enum EnvelopeHeaders {
    Object(BTreeMap<String, Option<String>>),
    List(Vec<(String, Option<String>)>),
}

impl Default for EnvelopeHeaders {
    fn default() -> Self {
        EnvelopeHeaders::List(Vec::new())
    }
}

impl EnvelopeHeaders {
    fn into_record_headers(self) -> Vec<(Text, Option<Bytes>)> {
        let pairs: Vec<(String, Option<String>)> = match self {
            EnvelopeHeaders::Object(object) => object.into_iter().collect(),
            EnvelopeHeaders::List(list) => list,
        };
        pairs.into_iter().map(|(name, value)| (name.into(), value.map(Bytes::from))).collect()
    }
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

/// Whether the body says it is one JSON document: `application/json` or `application/…+json`
/// (any case, any parameters).
fn is_json(headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(header::CONTENT_TYPE).and_then(|value| value.to_str().ok()) else {
        return false;
    };
    let media_type = value.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    media_type == "application/json" || (media_type.starts_with("application/") && media_type.ends_with("+json"))
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
        let headers = envelope.headers.into_record_headers();
        if headers.iter().any(|(name, _)| name.as_str() == IDEMPOTENCY_HEADER) {
            return Err(ApiError::bad_request(
                "bad_header",
                format!(
                    "line {line_number}: the {IDEMPOTENCY_HEADER} header is the server's own: send Idempotency-Key"
                ),
            ));
        }
        records.push(NewRecord {
            timestamp_ms: None,
            key: envelope.key.map(Bytes::from),
            subject: checked_subject(envelope.subject, Some(line_number))?,
            headers,
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

/// The request header naming a write so that its retries are answered, not written again.
pub const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";
/// The response header on the answer to a retry of a keyed write.
pub const REPLAYED_HEADER: &str = "idempotent-replayed";

/// The write's idempotency key, when it has one.
fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get(IDEMPOTENCY_KEY_HEADER) else { return Ok(None) };
    let key = value.to_str().map_err(|_| {
        ApiError::bad_request("bad_idempotency_key", "the Idempotency-Key header is not visible ASCII text")
    })?;
    onehop_engine::idempotency::check_key(key)
        .map_err(|reason| ApiError::bad_request("bad_idempotency_key", reason))?;
    Ok(Some(key.to_string()))
}

pub async fn publish(
    State(state): State<AppState>,
    Extension(principal): Extension<onehop_engine::Principal>,
    Path(name): Path<String>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse as _;
    let query = PublishQuery::parse(raw.as_deref().unwrap_or_default())?;
    let durability = durability(&headers)?;
    let key = idempotency_key(&headers)?;
    let body = body.map_err(|rejection| ApiError {
        retry_after_s: None,
        hint: None,
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
        // A body that says it is JSON and is not would be stored as text, and read back as
        // `value_text` by clients that expect a value: refused instead.
        if is_json(&headers)
            && let Err(error) = serde_json::from_slice::<serde::de::IgnoredAny>(&body)
        {
            return Err(ApiError::bad_request(
                "bad_json",
                format!("the body is not valid JSON, as its Content-Type says it is: {error}"),
            ));
        }
        let record = NewRecord {
            timestamp_ms: None,
            key: query.key.map(Bytes::from),
            subject: checked_subject(query.subject, None)?,
            headers: Vec::new(),
            value: Some(body),
        };
        (vec![record], false)
    };
    // Within the user's publish rates, or a 429 with nothing written.
    let bytes = records.iter().map(|record| record.value.as_ref().map_or(0, Bytes::len) as u64).sum();
    principal.admit_publish(records.len() as u64, bytes)?;
    let stream = state.engine.stream_or_create(&name).await?;
    let (published, replayed) = match &key {
        Some(key) => {
            let scope = principal.user().unwrap_or_default();
            state.engine.publish_idempotent(&stream, records, durability, scope, key).await?
        }
        None => (stream.publish(&records, durability).await?, false),
    };
    let mut response = Json(if batch {
        json!({ "stream": name, "records": published })
    } else {
        let Published { partition, offset } = published[0];
        json!({ "stream": name, "partition": partition, "offset": offset })
    })
    .into_response();
    if replayed {
        response.headers_mut().insert(REPLAYED_HEADER, header::HeaderValue::from_static("true"));
    }
    Ok(response)
}

/// A read's query.
#[derive(Default)]
pub struct ReadQuery {
    from: Option<String>,
    limit: Option<usize>,
    partition: Option<u32>,
    subject: Option<SubjectFilter>,
}

impl ReadQuery {
    fn parse(raw: &str) -> Result<ReadQuery, ApiError> {
        let mut query = ReadQuery::default();
        for (name, value) in super::query::pairs(raw)? {
            match name.as_str() {
                "from" => query.from = Some(value),
                "limit" => {
                    query.limit = Some(value.parse().map_err(|_| {
                        ApiError::bad_request("bad_limit", format!("limit must be a number, not {value:?}"))
                    })?);
                }
                "partition" => {
                    query.partition = Some(value.parse().map_err(|_| {
                        ApiError::bad_request("bad_query", format!("partition must be a number, not {value:?}"))
                    })?);
                }
                "subject" => {
                    query.subject =
                        Some(SubjectFilter::parse(&value).map_err(|error| {
                            ApiError::bad_request("bad_filter", format!("subject={value:?}: {error}"))
                        })?);
                }
                other => {
                    return Err(ApiError::bad_request(
                        "bad_query",
                        format!(
                            "unknown parameter {other:?}: a read takes from, limit, partition and subject (a \
                             subscription also takes field=value filters)"
                        ),
                    ));
                }
            }
        }
        Ok(query)
    }
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
    let HeadersJson { text, binary, list } = headers_json(record);
    if !text.is_empty() {
        object.insert("headers".into(), Value::Object(text));
    }
    if !binary.is_empty() {
        object.insert("headers_base64".into(), Value::Object(binary));
    }
    if let Some(list) = list {
        object.insert("header_list".into(), list);
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

/// A record's headers in JSON.
struct HeadersJson {
    /// Names to values that are UTF-8 text or null; a repeated name's last value (as Kafka's
    /// `lastHeader`).
    text: serde_json::Map<String, Value>,
    /// Names to the other values, in base64 (an MQTT 5 correlation data is binary), as keys and
    /// values are.
    binary: serde_json::Map<String, Value>,
    /// When a name repeats, which an object cannot hold: every header in order, as `[name,
    /// value]` with the value text, null or `{"base64": …}`.
    list: Option<Value>,
}

fn headers_json(record: &Record) -> HeadersJson {
    let (mut text, mut binary) = (serde_json::Map::new(), serde_json::Map::new());
    let mut repeated = false;
    for (name, value) in record.headers.iter() {
        repeated |= text.contains_key(name) || binary.contains_key(name);
        match value.map(std::str::from_utf8) {
            None => {
                binary.remove(name);
                text.insert(name.to_string(), Value::Null);
            }
            Some(Ok(value)) => {
                binary.remove(name);
                text.insert(name.to_string(), json!(value));
            }
            Some(Err(_)) => {
                text.remove(name);
                binary.insert(name.to_string(), json!(base64_of(value.unwrap_or_default())));
            }
        }
    }
    let list = repeated.then(|| {
        let pairs = record.headers.iter().map(|(name, value)| {
            let value = match value.map(|value| (value, std::str::from_utf8(value))) {
                None => Value::Null,
                Some((_, Ok(text))) => json!(text),
                Some((bytes, Err(_))) => json!({"base64": base64_of(bytes)}),
            };
            json!([name, value])
        });
        Value::Array(pairs.collect())
    });
    HeadersJson { text, binary, list }
}

fn base64_of(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
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
    let HeadersJson { text, binary, list } = headers_json(record);
    for (field, headers) in [(&b",\"headers\":"[..], text), (b",\"headers_base64\":", binary)] {
        if !headers.is_empty() {
            out.extend_from_slice(field);
            serde_json::to_writer(&mut out, &headers).expect("headers serialize");
        }
    }
    if let Some(list) = list {
        out.extend_from_slice(b",\"header_list\":");
        serde_json::to_writer(&mut out, &list).expect("headers serialize");
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
    Extension(principal): Extension<onehop_engine::Principal>,
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
        super::subscribe::ensure_exists(&state, &target).await?;
        let request = super::ws::Request { subscription: "url".into(), target, params };
        let max = state.subscriptions_per_socket_max;
        let held = principal.hold(onehop_engine::Resource::Connection)?;
        return Ok(super::ws::configure(upgrade)
            .on_upgrade(move |socket| super::ws::serve(state, principal, socket, Some(request), max, held))
            .into_response());
    }
    if super::sse::wants_events(&headers) {
        return super::sse::subscribe(state, principal, super::subscribe::Target::Stream(name), &raw, &headers).await;
    }
    let query = ReadQuery::parse(&raw)?;
    Ok(read(state, name, query).await?.into_response())
}

async fn read(state: AppState, name: String, query: ReadQuery) -> Result<Json<Value>, ApiError> {
    let stream = state.engine.stream(&name)?;
    let limit = query.limit.unwrap_or(READ_LIMIT_DEFAULT);
    if limit == 0 || limit > READ_LIMIT_MAX {
        return Err(ApiError::bad_request("bad_limit", format!("limit must be between 1 and {READ_LIMIT_MAX}")));
    }
    let starts = read_starts(&stream, &name, query.from.as_deref(), query.partition)?;
    let (records, next) = read_partitions(&stream, &starts, query.subject.as_ref(), limit)?;
    // The same positions as a resume id, which `from` takes back: the way to continue a read of
    // several partitions in one parameter (and to subscribe from where the read ended).
    let mut next_from = String::new();
    for (i, (partition, next)) in next.iter().enumerate() {
        if i > 0 {
            next_from.push(',');
        }
        next_from.push_str(&format!("{partition}:{}", *next as i64 - 1));
    }
    let next: BTreeMap<String, u64> = next.into_iter().map(|(partition, next)| (partition.to_string(), next)).collect();
    Ok(Json(json!({ "stream": name, "records": records, "next": next, "next_from": next_from })))
}

/// A partition and the offset a read starts (or goes on) from in it.
type PartitionStart = (u32, u64);

/// Where a read starts in each partition it reads: every partition (or the one `partition`
/// names) from `from`, or, when `from` is a resume id (`0:41,1:-1`, a previous read's
/// `next_from` or an event id), the partitions it lists, each right after its offset.
fn read_starts(
    stream: &Stream,
    name: &str,
    from: Option<&str>,
    only: Option<u32>,
) -> Result<Vec<(u32, u64)>, ApiError> {
    if let Some(only) = only {
        stream.check_partition(only)?;
    }
    if let Some(id) = from.filter(|from| from.contains(':') && !from.contains('T')) {
        let listed = parse_read_id(id, stream.partition_count())
            .map_err(|reason| ApiError::bad_request("bad_offset", format!("from={id:?}: {reason}")))?;
        let Some(only) = only else { return Ok(listed) };
        let found: Vec<(u32, u64)> = listed.into_iter().filter(|(partition, _)| *partition == only).collect();
        if found.is_empty() {
            return Err(ApiError::bad_request("bad_offset", format!("from={id:?} does not list partition {only}")));
        }
        return Ok(found);
    }
    let position = parse_position(from)?;
    let partitions: Vec<u32> = match only {
        Some(partition) => vec![partition],
        None if matches!(position, Position::Offset(_)) && stream.partition_count() > 1 => {
            return Err(ApiError::bad_request(
                "bad_offset",
                format!(
                    "an offset is per partition: add partition=0..{} (stream {name:?} has {} partitions), or give \
                     from as partition:offset pairs (a read's next_from)",
                    stream.partition_count() - 1,
                    stream.partition_count()
                ),
            ));
        }
        None => (0..stream.partition_count()).collect(),
    };
    partitions.into_iter().map(|partition| Ok((partition, stream.resolve(partition, position)?))).collect()
}

/// `partition:offset` pairs (the offset last read, `-1` for none), each partition at most
/// once, as (partition, the offset to read from) in the order given.
fn parse_read_id(text: &str, partitions: u32) -> Result<Vec<(u32, u64)>, String> {
    let mut starts: Vec<(u32, u64)> = Vec::new();
    for part in text.split(',') {
        let (partition, offset) =
            part.trim().split_once(':').ok_or_else(|| format!("{part:?} is not partition:offset"))?;
        let partition: u32 = partition.parse().map_err(|_| format!("bad partition in {part:?}"))?;
        let offset: i64 = offset.parse().map_err(|_| format!("bad offset in {part:?}"))?;
        if partition >= partitions || offset < -1 {
            return Err(format!("{part:?} does not fit a stream of {partitions} partitions"));
        }
        if starts.iter().any(|(seen, _)| *seen == partition) {
            return Err(format!("partition {partition} is listed twice"));
        }
        starts.push((partition, (offset + 1) as u64));
    }
    Ok(starts)
}

/// Records one read scans at most when it filters by subject, so a filter that matches little
/// cannot make one request read a whole stream; `next` says where to go on.
const READ_SCAN_RECORDS_MAX: usize = 100_000;
/// Records read at a time while filtering.
const READ_SCAN_CHUNK: usize = 1_000;

/// Reads partition by partition until `limit` records (those whose subject `subject` matches,
/// when given); returns them and, per partition, the offset to continue from.
fn read_partitions(
    stream: &Stream,
    starts: &[(u32, u64)],
    subject: Option<&SubjectFilter>,
    limit: usize,
) -> Result<(Vec<Value>, Vec<PartitionStart>), ApiError> {
    let mut records = Vec::new();
    let mut next = Vec::with_capacity(starts.len());
    let mut scanned = 0;
    for &(partition, from) in starts {
        let mut at = from;
        'partition: while records.len() < limit && scanned < READ_SCAN_RECORDS_MAX {
            let want = match subject {
                None => limit - records.len(),
                Some(_) => READ_SCAN_CHUNK.min(READ_SCAN_RECORDS_MAX - scanned),
            };
            let read = stream.read(partition, Position::Offset(at), want, READ_BYTES_MAX)?;
            if read.is_empty() {
                break;
            }
            for record in &read {
                at = record.offset + 1;
                scanned += 1;
                let wanted = subject.is_none_or(|filter| {
                    onehop_engine::hub::record_subject(stream.name(), record, stream.is_table())
                        .is_some_and(|subject| filter.matches(subject))
                });
                if wanted {
                    records.push(record_json(partition, record));
                    if records.len() == limit {
                        break 'partition;
                    }
                }
            }
            if subject.is_none() {
                // Unfiltered, one read is this partition's share (it stopped at the limit or
                // at the read's byte budget); the next partitions get what is left.
                break;
            }
        }
        next.push((partition, at));
    }
    Ok((records, next))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(key: Option<&[u8]>, subject: Option<&str>, headers: &[(&str, &[u8])], value: Option<&[u8]>) -> Record {
        let headers: Vec<(&str, Option<&[u8]>)> = headers.iter().map(|(name, value)| (*name, Some(*value))).collect();
        with_headers(key, subject, &headers, value)
    }

    fn with_headers(
        key: Option<&[u8]>,
        subject: Option<&str>,
        headers: &[(&str, Option<&[u8]>)],
        value: Option<&[u8]>,
    ) -> Record {
        Record {
            offset: 41,
            timestamp_ms: 1_700_000_000_123,
            key: key.map(Bytes::copy_from_slice),
            subject: subject.map(Text::from),
            headers: headers
                .iter()
                .map(|(name, value)| (Text::from(*name), value.map(Bytes::copy_from_slice)))
                .collect(),
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
                let headers: Vec<(&str, Option<&[u8]>)> =
                    headers.iter().map(|(name, value)| (*name, Some(*value))).collect();
                let repeated_and_null = [&headers[..], &[("trace", None), ("trace", Some(&b"t2"[..]))]].concat();
                for headers in [headers, repeated_and_null] {
                    let record = with_headers(key, subject, &headers, value);
                    let bytes = record_json_bytes(3, &record);
                    assert!(!bytes.contains(&b'\n'), "one line: {}", String::from_utf8_lossy(&bytes));
                    let parsed: Value = serde_json::from_slice(&bytes).unwrap();
                    assert_eq!(parsed, record_json(3, &record), "{}", String::from_utf8_lossy(&bytes));
                }
                let record = record(key, subject, &[], value);
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
        assert_eq!(json.get("header_list"), None, "no name repeats");
    }

    #[test]
    fn a_repeated_name_lists_every_header_in_order_and_null_stays_null() {
        let headers: [(&str, Option<&[u8]>); 5] =
            [("trace", Some(b"a")), ("n", None), ("trace", Some(&[0xff])), ("e", Some(b"")), ("trace", Some(b"c"))];
        let json = record_json(0, &with_headers(None, None, &headers, Some(b"1")));
        assert_eq!(json["headers"], json!({"trace": "c", "n": null, "e": ""}), "{json}");
        assert_eq!(json.get("headers_base64"), None, "{json}");
        assert_eq!(
            json["header_list"],
            json!([["trace", "a"], ["n", null], ["trace", {"base64": "/w=="}], ["e", ""], ["trace", "c"]]),
            "{json}"
        );
    }

    #[test]
    fn an_envelope_takes_headers_as_an_object_or_as_a_list_with_repeats_and_nulls() {
        let parse =
            |line: &str| serde_json::from_str::<Envelope>(line).map(|envelope| envelope.headers.into_record_headers());
        let text =
            |name: &str, value: Option<&str>| (Text::from(name), value.map(|value| Bytes::from(value.to_string())));
        assert_eq!(parse(r#"{"headers":{"a":"1","b":null}}"#).unwrap(), vec![text("a", Some("1")), text("b", None)]);
        assert_eq!(
            parse(r#"{"headers":[["t","1"],["t",null],["t","2"]]}"#).unwrap(),
            vec![text("t", Some("1")), text("t", None), text("t", Some("2"))]
        );
        assert_eq!(parse(r#"{"value":1}"#).unwrap(), vec![]);
        let refused = parse(r#"{"headers":[["t"]]}"#).err().unwrap().to_string();
        assert!(refused.contains("list of [name, value] pairs"), "{refused}");
        assert!(parse(r#"{"headers":{"a":1}}"#).is_err(), "a number is not a header value");
    }
}

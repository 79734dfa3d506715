//! What SSE and WebSocket subscriptions share: the URL of what to follow, the filter in its
//! query, where to start, a table's snapshot, and the JSON of each event.
//!
//! | URL | follows |
//! |-----|---------|
//! | `/streams/{s}?subject=a/+&team=red` | records whose subject matches and whose JSON value has `team` = `red` |
//! | `/tables/{t}?customer=42` | rows entering, changing in and leaving the set `customer = 42` |
//! | `/tables/{t}/{id}` | one row |
//!
//! Query parameters other than `subject`, `from` and `snapshot` (and the read parameters
//! `limit`, `partition`, `after`, `scan`, refused here) are `field=value` conditions
//! (all must hold; an array field matches when an element does). `from` is `latest` (the
//! default), `earliest`, an offset, an RFC 3339 time or an event id. `snapshot=true` on a table
//! sends the matching rows first, then the changes after them.

use std::io::Write as _;

use axum::body::Bytes;
use onehop_engine::hub::{Change, Cursor, Event};
use onehop_engine::subject::SubjectFilter;
pub use onehop_engine::subscription::Target;
use onehop_engine::subscription::{Snapshot, Start};
use onehop_engine::{Filter, Row};
use serde_json::{Value, json};

use super::AppState;
use super::error::ApiError;
use super::sse::start_positions;
use super::streams::record_json_bytes;

/// The target a URL path names: `/streams/{s}`, `/tables/{t}`, `/tables/{t}/{id}`,
/// `/views/{v}` or `/views/{v}/{key}`.
pub fn target_of_path(path: &str) -> Result<Target, ApiError> {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let decode = |part: &str| {
        percent_decode(part).ok_or_else(|| ApiError::bad_request("bad_url", format!("{part:?} is not valid UTF-8")))
    };
    match parts.as_slice() {
        ["streams", name] => Ok(Target::Stream(decode(name)?)),
        ["tables", name] => Ok(Target::Table(decode(name)?)),
        ["tables", name, id] => Ok(Target::Row { table: decode(name)?, id: decode(id)? }),
        ["views", name] => Ok(Target::View { view: decode(name)?, key: None }),
        ["views", name, key] => Ok(Target::View { view: decode(name)?, key: Some(decode(key)?) }),
        _ => Err(ApiError::bad_request(
            "bad_url",
            format!(
                "{path:?} names nothing to subscribe to: use /streams/{{s}}, /tables/{{t}}, /tables/{{t}}/{{id}}, /views/{{v}} or /views/{{v}}/{{key}}"
            ),
        )),
    }
}

pub(super) fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            if i + 3 > bytes.len() {
                return None;
            }
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// A subscription's query: its filter, start and snapshot wish.
#[derive(Clone, Debug, Default)]
pub struct Params {
    pub filter: Filter,
    pub from: Option<String>,
    pub snapshot: bool,
}

impl Params {
    /// Parses a raw query string for a subscription to `target`.
    pub fn parse(raw: &str, target: &Target) -> Result<Params, ApiError> {
        let mut params = Params::default();
        for (name, value) in super::query::pairs(raw)? {
            match name.as_str() {
                "from" => params.from = Some(value),
                "subject" => {
                    if !matches!(target, Target::Stream(_)) {
                        return Err(ApiError::bad_request(
                            "bad_filter",
                            "table rows have no subject; filter them with field=value",
                        ));
                    }
                    params.filter.subject =
                        Some(SubjectFilter::parse(&value).map_err(|error| {
                            ApiError::bad_request("bad_filter", format!("subject={value:?}: {error}"))
                        })?);
                }
                "final" if matches!(target, Target::View { .. }) => {
                    // Only the last value of each window, once it closes.
                    match value.as_str() {
                        "true" | "1" => params.filter = params.filter.with_condition("final", "true")?,
                        "false" | "0" => {}
                        other => {
                            return Err(ApiError::bad_request(
                                "bad_query",
                                format!("final must be true or false, not {other:?}"),
                            ));
                        }
                    }
                }
                "snapshot" => {
                    if matches!(target, Target::Stream(_)) {
                        return Err(ApiError::bad_request(
                            "bad_query",
                            "snapshot=true is for tables; a stream replays its history with from=earliest",
                        ));
                    }
                    params.snapshot = match value.as_str() {
                        "true" | "1" => true,
                        "false" | "0" => false,
                        other => {
                            return Err(ApiError::bad_request(
                                "bad_query",
                                format!("snapshot must be true or false, not {other:?}"),
                            ));
                        }
                    };
                }
                "limit" | "partition" | "after" | "scan" => {
                    return Err(ApiError::bad_request(
                        "bad_query",
                        format!("{name} is for reads; a subscription takes from, snapshot, subject and field=value"),
                    ));
                }
                field => params.filter = params.filter.with_condition(field, &value)?,
            }
        }
        if params.snapshot && params.from.is_some() {
            return Err(ApiError::bad_request(
                "bad_query",
                "snapshot=true starts from the snapshot; to resume after it, use from (or Last-Event-ID) alone",
            ));
        }
        if let Target::Row { id, .. } | Target::View { key: Some(id), .. } = target {
            params.filter.key = Some(Bytes::from(id.clone()));
        }
        Ok(params)
    }
}

/// Checks that `target` exists before a subscription to it opens. A stream that does not is
/// created, when the server creates streams on first use (`auto_create`): subscribers often
/// start before publishers, as NATS, MQTT and Kafka clients may. Tables and views are never
/// created this way: they need a definition.
pub async fn ensure_exists(state: &AppState, target: &Target) -> Result<(), ApiError> {
    state.engine.followed_stream(target).await?;
    Ok(())
}

/// A started subscription: its snapshot (if asked for), each row encoded as the JSON of a
/// snapshot event, and the cursor that follows.
pub struct Opened {
    pub cursor: Cursor,
    pub snapshot: Option<Vec<Bytes>>,
    /// The subscription, counted against its user's limit while it lives.
    pub held: Option<onehop_engine::Held>,
}

/// Starts a subscription through the engine's one way to open them
/// ([`onehop_engine::Engine::open_subscription`]). `resume` is a `Last-Event-ID`. A subscriber
/// that falls behind the live feed reads on from the log: it gets every event, later, and keeps
/// its connection.
pub async fn open(
    state: &AppState,
    principal: &onehop_engine::Principal,
    target: &Target,
    params: Params,
    resume: Option<&str>,
) -> Result<Opened, ApiError> {
    let start = if params.snapshot && resume.is_none() {
        Start::Snapshot
    } else {
        let stream = state.engine.followed_stream(target).await?;
        Start::Positions(start_positions(&stream, params.from.as_deref(), resume)?)
    };
    let held = principal.hold(onehop_engine::Resource::Subscription)?;
    let opened = state.engine.open_subscription(principal, target, params.filter, start).await?;
    let snapshot = opened.snapshot.map(|snapshot| match (snapshot, target) {
        (Snapshot::Rows(rows), Target::Table(table) | Target::Row { table, .. }) => {
            rows.iter().map(|row| encode_snapshot_row(table, row)).collect()
        }
        (Snapshot::ViewRows(keys), Target::View { view, .. }) => keys
            .into_iter()
            .flat_map(|(key, rows)| rows.into_iter().map(move |row| (key.clone(), row)))
            .map(|(key, row)| encode_view_snapshot_row(view, &key, &row))
            .collect(),
        // The engine answers a table's rows for a table and a view's for a view.
        (snapshot, target) => unreachable!("a {snapshot:?} for {target:?}"),
    });
    Ok(Opened { cursor: opened.cursor, snapshot, held })
}

/// A table change as JSON: `{"id","table","op","key","offset","timestamp","row"}`; `row` is the
/// row after the change (null when deleted).
fn change_json(table: &str, key: &[u8], op: &str, offset: u64, timestamp_ms: i64, row: Option<&[u8]>) -> Bytes {
    let row = row.map_or("null", |row| std::str::from_utf8(row).unwrap_or("null"));
    let text = format!(
        "{{\"id\":\"0:{offset}\",\"table\":{},\"op\":\"{op}\",\"key\":{},\"offset\":{offset},\"timestamp\":{timestamp_ms},\"row\":{row}}}",
        json!(table),
        json!(String::from_utf8_lossy(key)),
    );
    Bytes::from(text)
}

/// The JSON of an event, shared by every subscriber and wire format: a stream record as reads
/// return it, or a table change.
pub fn encode(event: &Event, change: Change) -> Bytes {
    if let Some(view) = event.stream.strip_prefix(onehop_engine::view::runtime::OUTPUT_PREFIX) {
        return encode_view_change(view, event);
    }
    if !event.table {
        return Bytes::from(record_json_bytes(event.partition, &event.record));
    }
    let record = &event.record;
    change_json(
        &event.stream,
        record.key.as_deref().unwrap_or_default(),
        change.as_str(),
        record.offset,
        record.timestamp_ms,
        record.value.as_deref(),
    )
}

/// A view change as JSON: `{"id","view","key","offset","timestamp","final","row"}` (and
/// `"removed":true` for a row that is gone, `"before"` with the row as it was when it had one). Written from the stored value's parts, without
/// parsing the row: this runs once per change, at the rate the view changes.
fn encode_view_change(view: &str, event: &Event) -> Bytes {
    let record = &event.record;
    let value = record.value.as_deref().unwrap_or_default();
    let Some(parts) = onehop_engine::view::runtime::change_parts(value) else {
        return encode_view_change_parsed(view, event);
    };
    let (is_final, removed, fields) = (parts.is_final, parts.removed, parts.fields);
    let key = String::from_utf8_lossy(record.key.as_deref().unwrap_or_default());
    let offset = record.offset;
    let mut out = Vec::with_capacity(fields.len() + view.len() + key.len() + 112);
    // Into the buffer itself: writing to a Vec cannot fail.
    let _ = write!(
        out,
        "{{\"id\":\"0:{offset}\",\"offset\":{offset},\"timestamp\":{},\"final\":{is_final}",
        record.timestamp_ms
    );
    if removed {
        out.extend_from_slice(b",\"removed\":true");
    }
    out.extend_from_slice(b",\"view\":");
    serde_json::to_writer(&mut out, view).expect("a string serializes");
    out.extend_from_slice(b",\"key\":");
    serde_json::to_writer(&mut out, &key).expect("a string serializes");
    if let Some(before) = parts.before {
        out.extend_from_slice(b",\"before\":");
        out.extend_from_slice(before);
    }
    out.extend_from_slice(b",\"row\":{");
    out.extend_from_slice(fields);
    out.push(b'}');
    Bytes::from(out)
}

/// [`encode_view_change`] for a value in another layout: parsed and written again.
fn encode_view_change_parsed(view: &str, event: &Event) -> Bytes {
    let record = &event.record;
    let mut row: Value =
        record.value.as_deref().and_then(|value| serde_json::from_slice(value).ok()).unwrap_or(Value::Null);
    let (is_final, removed, before) = match &mut row {
        Value::Object(fields) => (
            fields.remove("final").is_some_and(|value| value == Value::Bool(true)),
            fields.remove("removed").is_some_and(|value| value == Value::Bool(true)),
            fields.remove("before"),
        ),
        _ => (false, false, None),
    };
    let mut change = json!({
        "id": format!("0:{}", record.offset),
        "view": view,
        "key": String::from_utf8_lossy(record.key.as_deref().unwrap_or_default()),
        "offset": record.offset,
        "timestamp": record.timestamp_ms,
        "final": is_final,
        "row": row,
    });
    if removed {
        change["removed"] = Value::Bool(true);
    }
    if let Some(before) = before {
        change["before"] = before;
    }
    Bytes::from(change.to_string())
}

/// A view row of a snapshot: `{"view","key","op":"snapshot","final","row"}`.
fn encode_view_snapshot_row(view: &str, key: &str, row: &Value) -> Bytes {
    let mut row = row.clone();
    let is_final = match &mut row {
        Value::Object(fields) => fields.remove("final").is_some_and(|value| value == Value::Bool(true)),
        _ => false,
    };
    Bytes::from(json!({ "view": view, "key": key, "op": "snapshot", "final": is_final, "row": row }).to_string())
}

/// A snapshot row as JSON, shaped like a change with `"op":"snapshot"`.
pub fn encode_snapshot_row(table: &str, row: &Row) -> Bytes {
    change_json(table, row.id.as_bytes(), "snapshot", row.offset, row.timestamp_ms, Some(&row.json))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_view_change_is_written_as_its_parsed_form_would_be() {
        use onehop_engine::view::runtime::change_value;
        use onehop_engine::view::state::Change as ViewChange;
        let row = json!({"sku": "a\"b", "n": 3, "window_start": 0, "window_end": 5000});
        let was = std::sync::Arc::new(json!({"sku": "a\"b", "n": 2, "note": "}\\"}));
        for (is_final, removed, before) in
            [(false, false, None), (true, false, None), (false, true, None), (false, false, Some(was))]
        {
            for row in [row.clone(), json!({})] {
                let (key, row) = ("k/é".to_string(), std::sync::Arc::new(row));
                let change = ViewChange { key, row, is_final, removed, before: before.clone() };
                let record = onehop_engine::Record {
                    offset: 7,
                    timestamp_ms: 1_700_000_000_000,
                    key: Some(Bytes::from(change.key.clone())),
                    subject: None,
                    headers: Default::default(),
                    value: Some(Bytes::from(change_value(&change))),
                };
                let event = Event::new("__view.clicks".into(), 0, record, false);
                let fast: Value = serde_json::from_slice(&encode_view_change("clicks", &event)).unwrap();
                let parsed: Value = serde_json::from_slice(&encode_view_change_parsed("clicks", &event)).unwrap();
                assert_eq!(fast, parsed);
                assert_eq!(fast["row"], *change.row);
                assert_eq!(fast["final"], is_final);
                assert_eq!(fast.get("before"), change.before.as_deref());
            }
        }
    }

    #[test]
    fn targets_and_params_parse() {
        assert!(matches!(target_of_path("/tables/orders/o%201"), Ok(Target::Row { id, .. }) if id == "o 1"));
        assert!(matches!(target_of_path("/streams/s"), Ok(Target::Stream(name)) if name == "s"));
        assert!(matches!(target_of_path("/views/v/k%201"), Ok(Target::View { key: Some(key), .. }) if key == "k 1"));
        assert!(target_of_path("/things/v").is_err());
        let view = Target::View { view: "v".into(), key: Some("k".into()) };
        let params = Params::parse("final=true&snapshot=true", &view).unwrap();
        assert_eq!(params.filter.key.as_deref(), Some(&b"k"[..]));
        assert_eq!(params.filter.conditions[0].path, "final");
        assert_eq!(Params::parse("final=perhaps", &view).unwrap_err().code, "bad_query");
        let table = Target::Table("t".into());
        let params = Params::parse("customer=42&tags=a%20b&snapshot=true", &table).unwrap();
        assert!(params.snapshot);
        assert_eq!(params.filter.conditions.len(), 2);
        assert_eq!(params.filter.conditions[1].value, "a b");
        assert_eq!(Params::parse("subject=a/b", &table).unwrap_err().code, "bad_filter");
        assert_eq!(Params::parse("bad%20field=1", &table).unwrap_err().code, "bad_filter");
        assert_eq!(Params::parse("snapshot=maybe", &table).unwrap_err().code, "bad_query");
        let stream = Target::Stream("s".into());
        assert_eq!(Params::parse("subject=a/%23/b", &stream).unwrap_err().code, "bad_filter");
        assert_eq!(Params::parse("snapshot=true", &stream).unwrap_err().code, "bad_query");
        let row = Target::Row { table: "t".into(), id: "o1".into() };
        assert_eq!(Params::parse("", &row).unwrap().filter.key.as_deref(), Some(&b"o1"[..]));
    }
}

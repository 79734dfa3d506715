//! The catalog: every definition (and every user, role, grant and token: `access::records`) is a record of the compacted `__catalog` topic (one partition,
//! `fsync`), keyed by `{kind}/{name}` with a JSON value; dropping a definition appends a
//! tombstone. At start the engine replays the topic, newest record per key winning, so the
//! definitions survive restarts exactly as acknowledged.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use onehop_log::{Durability, NewRecord, Record};

use crate::system::SystemTopic;
use serde::{Deserialize, Serialize};

use crate::error::EngineError;
use crate::subject::SubjectFilter;
use crate::tabledef::{Column, ColumnType, IndexDef, TableDef};
use crate::view::ViewDef;
use crate::view::transform::TransformDef;

/// The topic holding the catalog. Names starting with `__` are reserved for the system.
pub const CATALOG_TOPIC: &str = "__catalog";
/// A stream has at most this many partitions: each partition has its own write and sync
/// threads, and 64 already exceeds what one disk can use.
pub const STREAM_PARTITIONS_MAX: u32 = 64;
const STREAM_KEY_PREFIX: &str = "stream/";
const TABLE_KEY_PREFIX: &str = "table/";
const VIEW_KEY_PREFIX: &str = "view/";
const TRANSFORM_KEY_PREFIX: &str = "transform/";
const DEFINITION_VERSION: u32 = 1;

/// What a stream is: its name, partition count, retention and default durability.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamDef {
    pub name: String,
    pub partitions: u32,
    /// Segments whose newest record is older than this are deleted; `None` keeps everything.
    pub retention_ms: Option<u64>,
    /// The oldest segments of each partition are deleted past this size; `None`: no cap.
    pub retention_bytes: Option<u64>,
    /// Durability of publishes that do not ask for one.
    pub durability: Durability,
    /// MQTT topics this stream takes (a topic filter such as `devices/+/telemetry`): a publish
    /// to a matching topic lands here whatever its first level says.
    pub mqtt_topic: Option<String>,
    /// Closed segments keep only the newest record per key (Kafka's `cleanup.policy=compact`);
    /// records without a key are all kept. Set at creation, never changed.
    pub compacted: bool,
}

impl StreamDef {
    pub fn validate(&self) -> Result<(), EngineError> {
        validate_name(&self.name)?;
        if self.partitions == 0 || self.partitions > STREAM_PARTITIONS_MAX {
            return Err(EngineError::InvalidDefinition(format!(
                "partitions must be between 1 and {STREAM_PARTITIONS_MAX}, not {}",
                self.partitions
            )));
        }
        if self.retention_ms == Some(0) || self.retention_bytes == Some(0) {
            return Err(EngineError::InvalidDefinition("a retention of 0 would delete everything".into()));
        }
        if let Some(topic) = &self.mqtt_topic {
            mqtt_route(topic)?;
        }
        Ok(())
    }

    /// A short description for messages: `partitions = 4, durability = fsync, …`.
    pub fn describe(&self) -> String {
        let mut text = format!("partitions = {}, durability = {}", self.partitions, self.durability);
        if let Some(ms) = self.retention_ms {
            text.push_str(&format!(", retention_ms = {ms}"));
        }
        if let Some(bytes) = self.retention_bytes {
            text.push_str(&format!(", retention_bytes = {bytes}"));
        }
        if let Some(topic) = &self.mqtt_topic {
            text.push_str(&format!(", mqtt_topic = '{topic}'"));
        }
        if self.compacted {
            text.push_str(", cleanup = 'compact'");
        }
        text
    }
}

/// The parsed form of a stream's `mqtt_topic`: a valid MQTT topic filter outside the `$`
/// topics MQTT reserves.
pub fn mqtt_route(topic: &str) -> Result<SubjectFilter, EngineError> {
    let bad = |reason: String| EngineError::InvalidDefinition(format!("mqtt_topic {topic:?}: {reason}"));
    let filter = SubjectFilter::parse(topic).map_err(|error| bad(error.to_string()))?;
    if topic.starts_with('$') {
        return Err(bad("topics starting with $ are reserved".into()));
    }
    Ok(filter)
}

/// Checks a user-chosen name: a usable directory name, and not reserved.
pub fn validate_name(name: &str) -> Result<(), EngineError> {
    onehop_log::validate_topic_name(name)
        .map_err(|reason| EngineError::InvalidName { name: name.to_string(), reason })?;
    if name.starts_with("__") {
        return Err(EngineError::InvalidName {
            name: name.to_string(),
            reason: "names starting with \"__\" are reserved for onehop".into(),
        });
    }
    Ok(())
}

/// The JSON form of a stream definition in the catalog.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StreamRecord {
    version: u32,
    name: String,
    partitions: u32,
    retention_ms: Option<u64>,
    retention_bytes: Option<u64>,
    durability: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mqtt_topic: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    compacted: bool,
}

/// The catalog record that stores `def`.
pub(crate) fn stream_record(def: &StreamDef) -> NewRecord {
    let value = StreamRecord {
        version: DEFINITION_VERSION,
        name: def.name.clone(),
        partitions: def.partitions,
        retention_ms: def.retention_ms,
        retention_bytes: def.retention_bytes,
        durability: def.durability.to_string(),
        mqtt_topic: def.mqtt_topic.clone(),
        compacted: def.compacted,
    };
    let value = serde_json::to_vec(&value).expect("a definition serializes");
    NewRecord::keyed(Bytes::from(format!("{STREAM_KEY_PREFIX}{}", def.name)), value)
}

fn parse_stream(record: &Record, value: &[u8]) -> Result<StreamDef, EngineError> {
    let bad = |reason: String| EngineError::Catalog { offset: record.offset, reason };
    let parsed: StreamRecord = serde_json::from_slice(value).map_err(|error| bad(error.to_string()))?;
    if parsed.version != DEFINITION_VERSION {
        return Err(bad(format!("definition version {} is newer than this onehop understands", parsed.version)));
    }
    let def = StreamDef {
        name: parsed.name,
        partitions: parsed.partitions,
        retention_ms: parsed.retention_ms,
        retention_bytes: parsed.retention_bytes,
        durability: parsed.durability.parse().map_err(bad)?,
        mqtt_topic: parsed.mqtt_topic,
        compacted: parsed.compacted,
    };
    def.validate().map_err(|error| bad(error.to_string()))?;
    Ok(def)
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ColumnRecord {
    name: String,
    #[serde(rename = "type")]
    ty: String,
    not_null: bool,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct IndexRecord {
    name: String,
    field: String,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ForeignKeyRecord {
    column: String,
    table: String,
}

/// The JSON form of a table definition in the catalog.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TableRecord {
    version: u32,
    name: String,
    primary_key: String,
    columns: Vec<ColumnRecord>,
    indexes: Vec<IndexRecord>,
    durability: String,
    /// Left out when there are none, so a table without them is stored as before.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    foreign_keys: Vec<ForeignKeyRecord>,
}

/// The catalog record that stores `def`.
pub(crate) fn table_record(def: &TableDef) -> NewRecord {
    NewRecord::keyed(Bytes::from(format!("{TABLE_KEY_PREFIX}{}", def.name)), table_json(def))
}

/// `def` as the catalog stores it (JSON); also how a cluster's nodes pass it on.
pub(crate) fn table_json(def: &TableDef) -> Vec<u8> {
    let value = TableRecord {
        version: DEFINITION_VERSION,
        name: def.name.clone(),
        primary_key: def.primary_key.clone(),
        columns: def
            .columns
            .iter()
            .map(|column| ColumnRecord {
                name: column.name.clone(),
                ty: column.ty.to_string(),
                not_null: column.not_null,
            })
            .collect(),
        indexes: def
            .indexes
            .iter()
            .map(|index| IndexRecord { name: index.name.clone(), field: index.field.clone() })
            .collect(),
        durability: def.durability.to_string(),
        foreign_keys: def
            .foreign_keys
            .iter()
            .map(|key| ForeignKeyRecord { column: key.column.clone(), table: key.table.clone() })
            .collect(),
    };
    serde_json::to_vec(&value).expect("a definition serializes")
}

/// The catalog record that drops the definition of `name` (a stream when `table` is false).
pub(crate) fn drop_record(name: &str, table: bool) -> NewRecord {
    let prefix = if table { TABLE_KEY_PREFIX } else { STREAM_KEY_PREFIX };
    NewRecord { key: Some(Bytes::from(format!("{prefix}{name}"))), ..NewRecord::default() }
}

fn parse_table(record: &Record, value: &[u8]) -> Result<TableDef, EngineError> {
    parse_table_json(value).map_err(|reason| EngineError::Catalog { offset: record.offset, reason })
}

/// A table definition from its JSON ([`table_json`]), checked.
pub(crate) fn parse_table_json(value: &[u8]) -> Result<TableDef, String> {
    let parsed: TableRecord = serde_json::from_slice(value).map_err(|error| error.to_string())?;
    if parsed.version != DEFINITION_VERSION {
        return Err(format!("definition version {} is newer than this onehop understands", parsed.version));
    }
    let columns = parsed
        .columns
        .into_iter()
        .map(|column| Ok(Column { ty: ColumnType::parse(&column.ty)?, name: column.name, not_null: column.not_null }))
        .collect::<Result<Vec<_>, String>>()?;
    let def = TableDef {
        name: parsed.name,
        primary_key: parsed.primary_key,
        columns,
        indexes: parsed.indexes.into_iter().map(|index| IndexDef { name: index.name, field: index.field }).collect(),
        durability: parsed.durability.parse()?,
        foreign_keys: parsed
            .foreign_keys
            .into_iter()
            .map(|key| crate::ForeignKey { column: key.column, table: key.table })
            .collect(),
    };
    def.validate().map_err(|error| error.to_string())?;
    Ok(def)
}

/// The JSON form of a view definition in the catalog.
#[derive(Serialize, Deserialize)]
struct ViewRecord {
    version: u32,
    view: ViewDef,
}

/// The catalog record that stores `def`.
pub(crate) fn view_record(def: &ViewDef) -> NewRecord {
    let value = ViewRecord { version: DEFINITION_VERSION, view: def.clone() };
    let value = serde_json::to_vec(&value).expect("a definition serializes");
    NewRecord::keyed(Bytes::from(format!("{VIEW_KEY_PREFIX}{}", def.name)), value)
}

/// The catalog record that drops the view `name`.
pub(crate) fn drop_view_record(name: &str) -> NewRecord {
    NewRecord { key: Some(Bytes::from(format!("{VIEW_KEY_PREFIX}{name}"))), ..NewRecord::default() }
}

fn parse_view(record: &Record, value: &[u8]) -> Result<ViewDef, EngineError> {
    let bad = |reason: String| EngineError::Catalog { offset: record.offset, reason };
    let parsed: ViewRecord = serde_json::from_slice(value).map_err(|error| bad(error.to_string()))?;
    if parsed.version != DEFINITION_VERSION {
        return Err(bad(format!("definition version {} is newer than this onehop understands", parsed.version)));
    }
    Ok(parsed.view)
}

/// The JSON form of a transform definition in the catalog (its output stream has its own
/// `stream/` record, written in the same batch).
#[derive(Serialize, Deserialize)]
struct TransformRecord {
    version: u32,
    transform: TransformDef,
}

/// The catalog record that stores `def`.
pub(crate) fn transform_record(def: &TransformDef) -> NewRecord {
    let value = TransformRecord { version: DEFINITION_VERSION, transform: def.clone() };
    let value = serde_json::to_vec(&value).expect("a definition serializes");
    NewRecord::keyed(Bytes::from(format!("{TRANSFORM_KEY_PREFIX}{}", def.name)), value)
}

/// The catalog record that drops the transform `name`.
pub(crate) fn drop_transform_record(name: &str) -> NewRecord {
    NewRecord { key: Some(Bytes::from(format!("{TRANSFORM_KEY_PREFIX}{name}"))), ..NewRecord::default() }
}

fn parse_transform(record: &Record, value: &[u8]) -> Result<TransformDef, EngineError> {
    let bad = |reason: String| EngineError::Catalog { offset: record.offset, reason };
    let parsed: TransformRecord = serde_json::from_slice(value).map_err(|error| bad(error.to_string()))?;
    if parsed.version != DEFINITION_VERSION {
        return Err(bad(format!("definition version {} is newer than this onehop understands", parsed.version)));
    }
    Ok(parsed.transform)
}

/// Everything the catalog defines, and what it says was dropped.
#[derive(Default)]
pub(crate) struct Definitions {
    pub streams: BTreeMap<String, StreamDef>,
    pub tables: BTreeMap<String, TableDef>,
    pub views: BTreeMap<String, ViewDef>,
    pub transforms: BTreeMap<String, TransformDef>,
    /// Streams and tables whose newest record is a drop (a tombstone): the only names whose
    /// data may be deleted at start (what a drop cut short by a crash left). A name the
    /// catalog does not mention at all is never taken for dropped.
    pub dropped: BTreeSet<String>,
    /// Views whose newest record is a drop.
    pub dropped_views: BTreeSet<String>,
    /// Users, roles, grants and tokens.
    pub access: crate::access::model::AccessDefs,
}

impl Definitions {
    /// Notes that the newest record of `name` is a definition (`defined`) or a drop.
    fn note(&mut self, name: &str, defined: bool, view: bool) {
        let dropped = if view { &mut self.dropped_views } else { &mut self.dropped };
        if defined {
            dropped.remove(name);
        } else {
            dropped.insert(name.to_string());
        }
    }
}

/// Every definition in the catalog, newest record per key winning.
pub(crate) fn replay(catalog: &SystemTopic) -> Result<Definitions, EngineError> {
    let mut defs = Definitions::default();
    catalog.replay(|record| apply(&mut defs, &record))?;
    Ok(defs)
}

/// Applies one catalog record to the definitions replayed so far.
fn apply(defs: &mut Definitions, record: &Record) -> Result<(), EngineError> {
    let key = record.key.as_deref().unwrap_or_default();
    let key = std::str::from_utf8(key).unwrap_or_default();
    if let Some(name) = key.strip_prefix(TABLE_KEY_PREFIX) {
        defs.note(name, record.value.is_some(), false);
        match &record.value {
            None => {
                defs.tables.remove(name);
            }
            Some(value) => {
                let def = parse_table(record, value)?;
                if def.name != name {
                    return Err(EngineError::Catalog {
                        offset: record.offset,
                        reason: format!("key names {name:?} but the definition names {:?}", def.name),
                    });
                }
                defs.tables.insert(def.name.clone(), def);
            }
        }
        return Ok(());
    }
    if let Some(name) = key.strip_prefix(VIEW_KEY_PREFIX) {
        defs.note(name, record.value.is_some(), true);
        match &record.value {
            None => {
                defs.views.remove(name);
            }
            Some(value) => {
                let def = parse_view(record, value)?;
                defs.views.insert(name.to_string(), def);
            }
        }
        return Ok(());
    }
    if let Some(name) = key.strip_prefix(TRANSFORM_KEY_PREFIX) {
        match &record.value {
            None => {
                defs.transforms.remove(name);
            }
            Some(value) => {
                let def = parse_transform(record, value)?;
                defs.transforms.insert(name.to_string(), def);
            }
        }
        return Ok(());
    }
    if crate::access::records::is_access_key(key) {
        return crate::access::records::apply(&mut defs.access, key, record);
    }
    let Some(name) = key.strip_prefix(STREAM_KEY_PREFIX) else {
        // A kind this version does not know (written by a newer one): keep going, say so.
        tracing::warn!(offset = record.offset, key, "skipping a catalog record of an unknown kind");
        return Ok(());
    };
    defs.note(name, record.value.is_some(), false);
    match &record.value {
        None => {
            defs.streams.remove(name);
        }
        Some(value) => {
            let def = parse_stream(record, value)?;
            if def.name != name {
                return Err(EngineError::Catalog {
                    offset: record.offset,
                    reason: format!("key names {name:?} but the definition names {:?}", def.name),
                });
            }
            defs.streams.insert(def.name.clone(), def);
        }
    }
    Ok(())
}

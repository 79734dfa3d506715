//! View checkpoints, written incrementally to one compacted topic.
//!
//! A view's checkpoint is many records. Its header, keyed by the view's name, holds the source
//! positions, the counters and the view's incarnation. Beside it there is one record per key
//! (its open windows; `{view}\u{1}{incarnation}\u{1}k\u{1}{key}`) and one per closed window
//! (`{view}\u{1}{incarnation}\u{1}c\u{1}{start}\u{1}{key}`). A checkpoint appends, in one
//! batch, the keys that changed since the last one, the windows that closed (each written
//! once) and tombstones for what went, then the header. So its cost follows what changed, not
//! the size of the state: a view of 10 000 keys keeping an hour of closed windows writes its
//! open windows and a few thousand new closed ones a second, not every window it keeps.
//! Compaction keeps the newest record per key, which is the state as of the newest header.
//!
//! One batch is all or nothing in the log (one CRC), so a crash leaves the checkpoint before or
//! after, never half of one. The incarnation tells a view's records from those of an earlier
//! view of the same name whose drop was cut short; those are deleted at the next start.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use onehop_log::NewRecord;

use crate::system::{SystemTopic, SystemTopicConfig};
use serde::{Deserialize, Serialize};

use super::ViewDef;
use super::state::{Closed, Delta, KeyState, ViewState};
use crate::error::EngineError;

/// The compacted topic of view and transform checkpoints (a transform's header is keyed
/// `transform/{name}`).
pub const CHECKPOINT_TOPIC: &str = "__view_checkpoints";
/// The checkpoint format before incremental checkpoints: the whole state in the header.
const WHOLE_STATE_VERSION: u32 = 1;
const VERSION: u32 = 2;
/// Separates the parts of a key or closed-window record's key (never in a view name).
const SEPARATOR: char = '\u{1}';

/// Where views and transforms write their checkpoints, and how often at most while they
/// change (the engine's `checkpoint_interval`): shorter means less to replay after a crash and
/// more checkpoint writes.
#[derive(Clone)]
pub(crate) struct Checkpointing {
    pub topic: Arc<SystemTopic>,
    pub interval: Duration,
}

pub(crate) fn checkpoint_config() -> SystemTopicConfig {
    // A whole-state checkpoint of a large view is one record.
    SystemTopicConfig { segment_bytes_max: 256 * 1024 * 1024, record_bytes_max: 128 * 1024 * 1024 }
}

/// A view's header: where the state stands in the source, and its counters.
#[derive(Serialize, Deserialize)]
struct Header {
    version: u32,
    #[serde(default)]
    incarnation: u64,
    positions: Vec<u64>,
    /// Where the change stream ended once the changes of everything before `positions` were
    /// written; none when the view was replaying quietly (its first backfill), or before
    /// changes were written exactly once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    change_end: Option<u64>,
    #[serde(default)]
    events: u64,
    #[serde(default)]
    late_events: u64,
    #[serde(default)]
    invalid_events: u64,
    /// Version 1 only: the whole state.
    #[serde(default, skip_serializing)]
    state: Option<ViewState>,
}

/// A view as its checkpoint left it.
pub struct Restored {
    pub incarnation: u64,
    pub positions: Vec<u64>,
    /// Where the change stream ended at the checkpoint (see [`Header`]).
    pub change_end: Option<u64>,
    pub state: ViewState,
    /// The state came from a whole-state checkpoint: the next checkpoint writes all of it.
    pub write_everything: bool,
}

impl Restored {
    /// A view with nothing saved yet, starting from `positions`, in a new incarnation.
    pub(crate) fn empty(positions: Vec<u64>) -> Restored {
        Restored {
            incarnation: new_incarnation(),
            positions,
            change_end: None,
            state: ViewState::default(),
            write_everything: false,
        }
    }

    /// The header of this checkpoint as it stands (a view created writes it first).
    pub(crate) fn header(&self, view: &str) -> NewRecord {
        let counters = Delta {
            events: self.state.events,
            late_events: self.state.late_events,
            invalid_events: self.state.invalid_events,
            ..Delta::default()
        };
        header(view, self.incarnation, self.positions.clone(), self.change_end, &counters)
    }
}

/// A new incarnation for a view created, or started over with no usable checkpoint.
pub(crate) fn new_incarnation() -> u64 {
    // Randomly keyed per process, and each `RandomState` differs from the last; the clock too.
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    hasher.write_u128(now.as_nanos());
    hasher.finish()
}

fn prefix(view: &str, incarnation: u64) -> String {
    format!("{view}{SEPARATOR}{incarnation:016x}{SEPARATOR}")
}

fn key_record_key(view: &str, incarnation: u64, key: &str) -> String {
    format!("{}k{SEPARATOR}{key}", prefix(view, incarnation))
}

fn closed_record_key(view: &str, incarnation: u64, start: i64, key: &str) -> String {
    format!("{}c{SEPARATOR}{start}{SEPARATOR}{key}", prefix(view, incarnation))
}

/// The records of one checkpoint: `delta`'s keys and closed windows, then the header with
/// `positions` and `change_end`. Appended as one batch.
pub fn records(
    view: &str,
    incarnation: u64,
    positions: Vec<u64>,
    change_end: Option<u64>,
    delta: &Delta,
) -> Vec<NewRecord> {
    let mut records = Vec::with_capacity(delta.keys.len() + delta.closed.len() + 1);
    for (key, state) in &delta.keys {
        let record_key = Bytes::from(key_record_key(view, incarnation, key));
        records.push(match state {
            Some(state) => {
                NewRecord::keyed(record_key, serde_json::to_vec(&state.saved()).expect("a key state serializes"))
            }
            None => NewRecord::tombstone(record_key),
        });
    }
    for (key, start, closed) in &delta.closed {
        let record_key = Bytes::from(closed_record_key(view, incarnation, *start, key));
        records.push(match closed {
            Some(closed) => {
                NewRecord::keyed(record_key, serde_json::to_vec(&**closed).expect("a closed window serializes"))
            }
            None => NewRecord::tombstone(record_key),
        });
    }
    records.push(header(view, incarnation, positions, change_end, delta));
    records
}

/// A header alone: a view that starts (nothing saved yet), or whose state did not change.
pub fn header(view: &str, incarnation: u64, positions: Vec<u64>, change_end: Option<u64>, delta: &Delta) -> NewRecord {
    let header = Header {
        version: VERSION,
        incarnation,
        positions,
        change_end,
        events: delta.events,
        late_events: delta.late_events,
        invalid_events: delta.invalid_events,
        state: None,
    };
    NewRecord::keyed(Bytes::from(view.to_string()), serde_json::to_vec(&header).expect("a header serializes"))
}

/// Tombstones for every record of a view whose state is `whole` ([`ViewState::everything`]),
/// the header first: a drop cut short leaves records no header names, deleted at the next start.
pub fn tombstones(view: &str, incarnation: u64, whole: &Delta) -> Vec<NewRecord> {
    let mut records = vec![NewRecord::tombstone(view.to_string())];
    records.extend(whole.keys.iter().map(|(key, _)| NewRecord::tombstone(key_record_key(view, incarnation, key))));
    records.extend(
        whole
            .closed
            .iter()
            .map(|(key, start, _)| NewRecord::tombstone(closed_record_key(view, incarnation, *start, key))),
    );
    records
}

/// The newest record of every key in the topic (key → value; a deleted one is absent).
pub fn read_all(checkpoints: &SystemTopic) -> Result<HashMap<String, Bytes>, EngineError> {
    checkpoints.newest()
}

/// View `def`'s checkpoint in `stored` (its header is taken out): `None` (and a warning) when
/// there is none or it cannot be read, and the view starts over from its source.
pub fn restore(def: &ViewDef, stored: &mut HashMap<String, Bytes>) -> Option<Restored> {
    let view = def.name.as_str();
    let value = stored.remove(view)?;
    let header = match serde_json::from_slice::<Header>(&value) {
        Ok(header) => header,
        Err(error) => {
            tracing::warn!(view, %error, "skipping an unreadable view checkpoint");
            return None;
        }
    };
    match header.version {
        WHOLE_STATE_VERSION => {
            let Some(state) = header.state else {
                tracing::warn!(view, "skipping a view checkpoint without its state");
                return None;
            };
            let restored = Restored {
                incarnation: new_incarnation(),
                positions: header.positions,
                change_end: None,
                state,
                write_everything: true,
            };
            return Some(restored);
        }
        VERSION => {}
        version => {
            tracing::warn!(view, version, "skipping a view checkpoint of an unknown version");
            return None;
        }
    }
    let prefix = prefix(view, header.incarnation);
    // Left in `stored`: what [`strays`] deletes is decided from the live incarnations.
    let (mut keys, mut closed) = (Vec::new(), Vec::new());
    for (record_key, value) in stored.iter().filter(|(key, _)| key.starts_with(&prefix)) {
        let rest = &record_key[prefix.len()..];
        let parsed = if let Some(key) = rest.strip_prefix(&format!("k{SEPARATOR}")) {
            serde_json::from_slice::<KeyState>(value).map(|state| keys.push((key.to_string(), state)))
        } else if let Some((start, key)) =
            rest.strip_prefix(&format!("c{SEPARATOR}")).and_then(|rest| rest.split_once(SEPARATOR))
            && start.parse::<i64>().is_ok()
        {
            serde_json::from_slice::<Closed>(value).map(|window| closed.push((key.to_string(), window)))
        } else {
            Ok(())
        };
        if let Err(error) = parsed {
            // Every record of a checkpoint is written by this code; one that does not parse
            // means the stored state is not what was saved, so none of it is used.
            tracing::warn!(view, %error, "skipping a view checkpoint with an unreadable record");
            return None;
        }
    }
    let counters = (header.events, header.late_events, header.invalid_events);
    Some(Restored {
        incarnation: header.incarnation,
        positions: header.positions,
        change_end: header.change_end,
        state: ViewState::restore(def, counters, keys, closed),
        write_everything: false,
    })
}

/// The view a checkpoint record's key belongs to.
pub fn view_of_key(key: &str) -> &str {
    key.split(SEPARATOR).next().unwrap_or(key)
}

/// Keys of records that belong to no live view incarnation: left by a drop cut short, or by a
/// view that started over. `live` holds (name, incarnation) of each view's checkpoint read at
/// start (kept even when the view could not be opened) and of each open view.
pub fn strays(stored: &HashMap<String, Bytes>, live: &[(String, u64)]) -> Vec<String> {
    let live: Vec<String> = live.iter().map(|(view, incarnation)| prefix(view, *incarnation)).collect();
    stored
        .keys()
        .filter(|key| key.contains(SEPARATOR) && !live.iter().any(|prefix| key.starts_with(prefix.as_str())))
        .cloned()
        .collect()
}

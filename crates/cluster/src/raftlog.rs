//! The Raft log on disk: what a node has accepted from a leader, in index order, durable before
//! openraft is told so.
//!
//! A directory of segment files, `segment-<first index>.log`, each an 8-byte header (`OHRL`,
//! the format as a u16 LE, two zero bytes) and a run of frames
//! `[length u32 LE][crc32c u32 LE][postcard entry]`, plus `vote` (the node's vote) and `purged`
//! (the last entry removed from the front). docs/cluster.md ("The Raft log on disk") is the
//! format's description, with what each format changed. One [`LogStore::append`] writes every entry it is
//! given and fdatasyncs once: openraft hands over, in one call, every entry proposed while the
//! previous call was on disk, so this is group commit at the Raft layer.
//!
//! openraft's pitfall (its issue #2118: a leader change may treat appends still in flight as
//! flushed) does not arise here: `append` reports the flush, and returns, only after fdatasync,
//! so nothing is ever in flight between openraft and the disk.
//!
//! Recovery keeps every whole, checksummed frame. A torn tail of the last segment (an append
//! that was writing when the process died, never reported flushed) is cut. Damage followed by
//! valid frames, a gap in the indexes, or a segment that does not start where its name says
//! stops the node with an error naming the file: nothing that might have been acknowledged is
//! ever cut.

use crate::sys::fs::{self, File, OpenOptions};
use crate::sys::sync_dir;
use std::collections::{BTreeMap, VecDeque};
use std::fmt::Debug;
use std::io::{self, Write};
use std::ops::{Bound, RangeBounds};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use openraft::storage::{LogFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{AnyError, Entry, LogId, OptionalSend, StorageError, StorageIOError, Vote};

use crate::TypeConfig;

/// A new segment is started once the current one holds this many bytes.
const SEGMENT_BYTES: u64 = 64 * 1024 * 1024;
/// The newest entries kept decoded in memory, for replication and apply, up to this many bytes.
const CACHE_BYTES: usize = 32 * 1024 * 1024;
/// The largest frame recovery believes; a longer length is damage.
pub const FRAME_BYTES_MAX: usize = 256 * 1024 * 1024;
const FRAME_HEADER: usize = 8;

type Error = StorageError<u64>;

fn io_error(make: fn(AnyError) -> StorageIOError<u64>, error: impl std::error::Error + 'static) -> Error {
    make(AnyError::new(&error)).into()
}

fn write_error(error: io::Error) -> Error {
    io_error(StorageIOError::write_logs, error)
}

fn read_error(error: io::Error) -> Error {
    io_error(StorageIOError::read_logs, error)
}

/// The first bytes of every segment this release writes.
const SEGMENT_MAGIC: [u8; 4] = *b"OHRL";
/// Bytes of a segment's header: the magic, the format (u16 LE) and two zero bytes.
pub const SEGMENT_HEADER_BYTES: usize = 8;
/// The format this release writes. 1: each segment starts with its header, and the body of
/// each normal entry's command starts with the applier's own format byte. 0: a segment from
/// before formats were numbered, with no header (its first four bytes are a frame's length,
/// never the magic: as a length, `OHRL` is past [`FRAME_BYTES_MAX`]); its entries are read as
/// format 1 with [`UNNUMBERED_BODY`] put before each command's body.
pub const FORMAT: u16 = 1;
/// The format byte given to the body of a command read from a format 0 segment, written
/// before bodies carried one.
pub const UNNUMBERED_BODY: u8 = 0;

/// What to do when the Raft log of one node cannot be trusted.
const REPLACE_NODE: &str = "What to do: the other nodes hold the cluster's log. Stop this node, move its whole data \
     directory aside (keep it until the node has caught up), and start the node again with an empty one, with the \
     same --node-id and addresses: it waits for the leader, installs the leader's snapshot and catches up. On a \
     single node, or when most nodes are damaged, restore the data directory from a backup instead.";

/// Why a Raft log directory cannot be opened. Each error names the file and what to do.
#[derive(Debug, thiserror::Error)]
pub enum OpenLogError {
    #[error("{path}: {source}. Check the disk and the directory's permissions, then start again")]
    Io { path: PathBuf, source: io::Error },
    #[error(
        "{path}: damaged at byte {position} ({reason}), and valid entries follow or newer segments do, so this \
         is not the torn end of an interrupted append; nothing was cut, since entries after it may have been \
         acknowledged. {REPLACE_NODE}"
    )]
    Damaged { path: PathBuf, position: u64, reason: String },
    #[error(
        "{path}: holds entry {found} where entry {expected} belongs: a segment of the Raft log is missing or \
         out of place. {REPLACE_NODE}"
    )]
    Gap { path: PathBuf, expected: u64, found: u64 },
    #[error(
        "{path}, this node's {what}, cannot be read ({reason}); without it the node could vote twice in a term \
         or lose track of its log. {REPLACE_NODE}"
    )]
    Unreadable { path: PathBuf, what: &'static str, reason: String },
    #[error(
        "{path}: Raft log format {found}, written by a newer onehop; this one reads formats up to {FORMAT}. \
         Start the node with the release that wrote it, or a newer one"
    )]
    NewerFormat { path: PathBuf, found: u16 },
}

/// What the start of a segment file says of its format.
enum Header {
    /// Format 0: frames from byte 0.
    Unnumbered,
    Format(u16),
    /// Shorter than a header, and all of it a header's start (or empty): a segment whose
    /// creation a crash interrupted, holding no entry.
    Torn,
    /// The magic, and bytes a header never holds.
    Bad,
}

fn header_of(bytes: &[u8]) -> Header {
    let header = segment_header();
    if bytes.len() < SEGMENT_HEADER_BYTES && bytes.len() <= SEGMENT_MAGIC.len() && SEGMENT_MAGIC.starts_with(bytes) {
        return Header::Torn;
    }
    if !bytes.starts_with(&SEGMENT_MAGIC) {
        return Header::Unnumbered;
    }
    if bytes.len() < SEGMENT_HEADER_BYTES {
        return if header.starts_with(bytes) { Header::Torn } else { Header::Bad };
    }
    match (u16::from_le_bytes([bytes[4], bytes[5]]), [bytes[6], bytes[7]]) {
        (format, [0, 0]) => Header::Format(format),
        _ => Header::Bad,
    }
}

fn segment_header() -> [u8; SEGMENT_HEADER_BYTES] {
    let mut header = [0u8; SEGMENT_HEADER_BYTES];
    header[..4].copy_from_slice(&SEGMENT_MAGIC);
    header[4..6].copy_from_slice(&FORMAT.to_le_bytes());
    header
}

/// An entry read from a segment of `format`, as this release reads it.
fn as_current(mut entry: Entry<TypeConfig>, format: u16) -> Entry<TypeConfig> {
    if format == 0
        && let openraft::EntryPayload::Normal(command) = &mut entry.payload
    {
        let mut body = Vec::with_capacity(command.body.len() + 1);
        body.push(UNNUMBERED_BODY);
        body.extend_from_slice(&command.body);
        command.body = body.into();
    }
    entry
}

struct Segment {
    first: u64,
    path: PathBuf,
    file: File,
    /// The format its header names (0: none).
    format: u16,
    /// Byte position of each entry: entry `first + i` starts at `positions[i]`.
    positions: Vec<u64>,
    len: u64,
}

impl Segment {
    fn last(&self) -> Option<u64> {
        (!self.positions.is_empty()).then(|| self.first + self.positions.len() as u64 - 1)
    }
}

struct Inner {
    dir: PathBuf,
    segments: BTreeMap<u64, Segment>,
    last_log_id: Option<LogId<u64>>,
    last_purged: Option<LogId<u64>>,
    vote: Option<Vote<u64>>,
    /// The newest entries, decoded, with their encoded sizes.
    cache: VecDeque<(Entry<TypeConfig>, usize)>,
    cache_bytes: usize,
}

/// The Raft log of one node. Clones share the same files: openraft's reader is a clone.
#[derive(Clone)]
pub struct LogStore {
    inner: Arc<Mutex<Inner>>,
}

fn segment_path(dir: &Path, first: u64) -> PathBuf {
    dir.join(format!("segment-{first:020}.log"))
}

/// Writes `bytes` to `dir/name` so that a crash leaves either the old or the new content.
pub(crate) fn write_atomically(dir: &Path, name: &str, bytes: &[u8]) -> io::Result<()> {
    let temporary = dir.join(format!("{name}.tmp"));
    let mut file = File::create(&temporary)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    fs::rename(&temporary, dir.join(name))?;
    sync_dir(dir)
}

fn read_optional<T: serde::de::DeserializeOwned>(path: &Path, what: &'static str) -> Result<Option<T>, OpenLogError> {
    match fs::read(path) {
        Ok(bytes) => postcard::from_bytes(&bytes).map(Some).map_err(|error| OpenLogError::Unreadable {
            path: path.to_owned(),
            what,
            reason: error.to_string(),
        }),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(OpenLogError::Io { path: path.to_owned(), source }),
    }
}

/// One frame around an encoded entry.
pub fn encode_frame(entry: &Entry<TypeConfig>) -> Vec<u8> {
    let payload = postcard::to_allocvec(entry).expect("an entry always encodes");
    let mut frame = Vec::with_capacity(FRAME_HEADER + payload.len());
    frame.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    frame.extend_from_slice(&crc32c::crc32c(&payload).to_le_bytes());
    frame.extend_from_slice(&payload);
    frame
}

/// The entry in the frame at the start of `bytes` and the frame's length, or why there is none.
pub fn decode_frame(bytes: &[u8]) -> Result<(Entry<TypeConfig>, usize), String> {
    if bytes.len() < FRAME_HEADER {
        return Err("a frame header cut short".into());
    }
    let len = u32::from_le_bytes(bytes[0..4].try_into().unwrap()) as usize;
    let crc = u32::from_le_bytes(bytes[4..8].try_into().unwrap());
    if len > FRAME_BYTES_MAX {
        return Err(format!("a frame of {len} bytes, more than any entry"));
    }
    let Some(payload) = bytes.get(FRAME_HEADER..FRAME_HEADER + len) else {
        return Err("a frame cut short".into());
    };
    if crc32c::crc32c(payload) != crc {
        return Err("a checksum that does not match".into());
    }
    let entry = postcard::from_bytes(payload).map_err(|error| format!("an entry that does not decode: {error}"))?;
    Ok((entry, FRAME_HEADER + len))
}

impl LogStore {
    /// Opens (or creates) the Raft log in `dir`, recovering as the module says.
    pub fn open(dir: impl AsRef<Path>) -> Result<LogStore, OpenLogError> {
        let dir = dir.as_ref().to_owned();
        let at = |path: &Path| {
            let path = path.to_owned();
            move |source| OpenLogError::Io { path, source }
        };
        crate::sys::create_dir_durably(&dir).map_err(at(&dir))?;
        let vote = read_optional::<Vote<u64>>(&dir.join("vote"), "vote in the current term")?;
        let last_purged =
            read_optional::<Option<LogId<u64>>>(&dir.join("purged"), "record of the entries it purged")?.flatten();

        let mut firsts = Vec::new();
        for item in fs::read_dir(&dir).map_err(at(&dir))? {
            let name = item.map_err(at(&dir))?.file_name();
            let name = name.to_string_lossy();
            if let Some(first) = name.strip_prefix("segment-").and_then(|rest| rest.strip_suffix(".log"))
                && let Ok(first) = first.parse::<u64>()
            {
                firsts.push(first);
            }
        }
        firsts.sort_unstable();

        let mut segments = BTreeMap::new();
        let mut last_log_id = last_purged;
        let mut cache = VecDeque::new();
        let mut cache_bytes = 0;
        let count = firsts.len();
        for (n, first) in firsts.into_iter().enumerate() {
            let path = segment_path(&dir, first);
            let bytes = fs::read(&path).map_err(at(&path))?;
            let (format, start) = match header_of(&bytes) {
                Header::Unnumbered => (0, 0),
                Header::Format(format) if format <= FORMAT => (format, SEGMENT_HEADER_BYTES),
                Header::Format(found) => return Err(OpenLogError::NewerFormat { path, found }),
                Header::Torn if n + 1 == count => {
                    // The newest segment, created by an append that a crash interrupted before
                    // anything it wrote was durable: it holds no entry.
                    fs::remove_file(&path).map_err(at(&path))?;
                    sync_dir(&dir).map_err(at(&dir))?;
                    continue;
                }
                Header::Torn | Header::Bad => {
                    let reason = "a segment header that is not whole".to_string();
                    return Err(OpenLogError::Damaged { path, position: 0, reason });
                }
            };
            let mut positions = Vec::new();
            let mut position = start;
            while position < bytes.len() {
                match decode_frame(&bytes[position..]) {
                    Ok((entry, len)) => {
                        let entry = as_current(entry, format);
                        let expected = first + positions.len() as u64;
                        if entry.log_id.index != expected {
                            return Err(OpenLogError::Gap { path, expected, found: entry.log_id.index });
                        }
                        positions.push(position as u64);
                        position += len;
                        last_log_id = Some(entry.log_id);
                        cache_bytes += len;
                        cache.push_back((entry, len));
                        while cache_bytes > CACHE_BYTES {
                            let (_, len) = cache.pop_front().expect("cache holds what it counts");
                            cache_bytes -= len;
                        }
                    }
                    Err(reason) => {
                        let valid_follows =
                            (position + 1..bytes.len()).any(|start| decode_frame(&bytes[start..]).is_ok());
                        if n + 1 < count || valid_follows {
                            return Err(OpenLogError::Damaged { path, position: position as u64, reason });
                        }
                        tracing::warn!(
                            path = %path.display(),
                            position,
                            cut = bytes.len() - position,
                            "cutting the torn tail of the Raft log (an append the crash interrupted, never reported durable)"
                        );
                        let file = OpenOptions::new().write(true).open(&path).map_err(at(&path))?;
                        file.set_len(position as u64).map_err(at(&path))?;
                        file.sync_all().map_err(at(&path))?;
                        break;
                    }
                }
            }
            if let Some(previous) = segments.values().last().and_then(Segment::last)
                && first != previous + 1
            {
                return Err(OpenLogError::Gap { path, expected: previous + 1, found: first });
            }
            let file = OpenOptions::new().read(true).append(true).open(&path).map_err(at(&path))?;
            let len = position as u64;
            segments.insert(first, Segment { first, path, file, format, positions, len });
        }
        // Entries at or before the purge point are gone even where their segment remains.
        cache.retain(|(entry, _)| last_purged.is_none_or(|purged| entry.log_id.index > purged.index));
        cache_bytes = cache.iter().map(|(_, len)| len).sum();
        let inner = Inner { dir, segments, last_log_id, last_purged, vote, cache, cache_bytes };
        Ok(LogStore { inner: Arc::new(Mutex::new(inner)) })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("raft log lock")
    }

    /// The index of the first and last entry held, if any.
    pub fn bounds(&self) -> Option<(u64, u64)> {
        let inner = self.lock();
        let last = inner.last_log_id?.index;
        let first = inner.last_purged.map_or_else(|| inner.segments.keys().next().copied(), |p| Some(p.index + 1))?;
        (first <= last).then_some((first, last))
    }

    /// Entries `start..end` that are held, stopping after the one that reaches `max_bytes`.
    fn entries(&self, start: u64, end: u64, max_bytes: usize) -> io::Result<Vec<Entry<TypeConfig>>> {
        let inner = self.lock();
        let Some(last) = inner.last_log_id.map(|id| id.index) else { return Ok(Vec::new()) };
        let first_present = inner.last_purged.map_or(0, |purged| purged.index + 1);
        let (start, end) = (start.max(first_present), end.min(last + 1));
        let mut entries = Vec::with_capacity(end.saturating_sub(start) as usize);
        let cached_from = inner.cache.front().map_or(u64::MAX, |(entry, _)| entry.log_id.index);
        let (mut index, mut bytes) = (start, 0);
        while index < end && bytes < max_bytes {
            if index >= cached_from {
                let (entry, len) = &inner.cache[(index - cached_from) as usize];
                entries.push(entry.clone());
                bytes += len;
                index += 1;
                continue;
            }
            let Some((_, segment)) = inner.segments.range(..=index).next_back() else { break };
            let Some(&position) = segment.positions.get((index - segment.first) as usize) else { break };
            let mut header = [0u8; FRAME_HEADER];
            segment.file.read_exact_at(&mut header, position)?;
            let len = u32::from_le_bytes(header[0..4].try_into().unwrap()) as usize;
            if len > FRAME_BYTES_MAX {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("a frame of {len} bytes at {position}"),
                ));
            }
            let mut frame = vec![0u8; FRAME_HEADER + len];
            segment.file.read_exact_at(&mut frame, position)?;
            let (entry, _) =
                decode_frame(&frame).map_err(|reason| io::Error::new(io::ErrorKind::InvalidData, reason))?;
            entries.push(as_current(entry, segment.format));
            bytes += frame.len();
            index += 1;
        }
        Ok(entries)
    }

    fn append_blocking(&self, entries: Vec<Entry<TypeConfig>>) -> io::Result<()> {
        let mut inner = self.lock();
        let inner = &mut *inner;
        let mut touched: Vec<u64> = Vec::new();
        let mut rolled = false;
        let mut framed = Vec::with_capacity(entries.len());
        for entry in entries {
            let frame = encode_frame(&entry);
            let index = entry.log_id.index;
            // A segment of an earlier format is never appended to: what is appended is in
            // this release's format, from a header on.
            let roll = match inner.segments.values().last() {
                None => true,
                Some(segment) => segment.len >= SEGMENT_BYTES || segment.format != FORMAT,
            };
            if roll {
                let path = segment_path(&inner.dir, index);
                let mut file = OpenOptions::new().read(true).append(true).create_new(true).open(&path)?;
                file.write_all(&segment_header())?;
                let len = SEGMENT_HEADER_BYTES as u64;
                let segment = Segment { first: index, path, file, format: FORMAT, positions: Vec::new(), len };
                inner.segments.insert(index, segment);
                touched.push(index);
                rolled = true;
            }
            let segment = inner.segments.values_mut().last().expect("a segment was just made");
            if segment.first + segment.positions.len() as u64 != index {
                return Err(io::Error::other(format!(
                    "entry {index} appended where entry {} belongs",
                    segment.first + segment.positions.len() as u64
                )));
            }
            segment.file.write_all(&frame)?;
            segment.positions.push(segment.len);
            segment.len += frame.len() as u64;
            if touched.last() != Some(&segment.first) {
                touched.push(segment.first);
            }
            framed.push((entry, frame.len()));
        }
        for first in touched {
            inner.segments[&first].file.sync_data()?;
        }
        if rolled {
            sync_dir(&inner.dir)?;
        }
        for (entry, len) in framed {
            inner.last_log_id = Some(entry.log_id);
            inner.cache_bytes += len;
            inner.cache.push_back((entry, len));
        }
        while inner.cache_bytes > CACHE_BYTES && inner.cache.len() > 1 {
            let (_, len) = inner.cache.pop_front().expect("cache holds what it counts");
            inner.cache_bytes -= len;
        }
        Ok(())
    }

    fn truncate_blocking(&self, log_id: LogId<u64>) -> io::Result<()> {
        let mut guard = self.lock();
        let inner = &mut *guard;
        let index = log_id.index;
        // From the newest segment back, so a crash part-way leaves a contiguous log.
        let doomed: Vec<u64> = inner.segments.range(index..).map(|(first, _)| *first).rev().collect();
        for first in &doomed {
            let segment = inner.segments.remove(first).expect("listed above");
            fs::remove_file(&segment.path)?;
        }
        if !doomed.is_empty() {
            sync_dir(&inner.dir)?;
        }
        if let Some((_, segment)) = inner.segments.range_mut(..index).next_back()
            && let Some(&position) = segment.positions.get((index - segment.first) as usize)
        {
            segment.file.set_len(position)?;
            segment.file.sync_data()?;
            segment.positions.truncate((index - segment.first) as usize);
            segment.len = position;
        }
        while inner.cache.back().is_some_and(|(entry, _)| entry.log_id.index >= index) {
            let (_, len) = inner.cache.pop_back().expect("just looked");
            inner.cache_bytes -= len;
        }
        drop(guard);
        // The entry before the cut is the new last one (or, with none left, the purge point).
        let previous = match index.checked_sub(1) {
            Some(before) => self.entries(before, index, usize::MAX)?.pop(),
            None => None,
        };
        let mut inner = self.lock();
        inner.last_log_id = previous.map(|entry| entry.log_id).or(inner.last_purged);
        Ok(())
    }

    fn purge_blocking(&self, log_id: LogId<u64>) -> io::Result<()> {
        let mut inner = self.lock();
        let inner = &mut *inner;
        write_atomically(&inner.dir, "purged", &postcard::to_allocvec(&Some(log_id)).expect("a log id encodes"))?;
        inner.last_purged = Some(log_id);
        // Purged past the last entry held (a snapshot installed): every segment goes, and the
        // next append starts a segment at the entry after the purge point.
        let everything = inner.last_log_id.is_none_or(|last| last.index <= log_id.index);
        let newest = inner.segments.keys().next_back().copied();
        let doomed: Vec<u64> = inner
            .segments
            .values()
            // Otherwise the newest segment stays open for appends even when it is all purged.
            .filter(|segment| everything || segment.last().is_some_and(|last| last <= log_id.index))
            .map(|segment| segment.first)
            .filter(|first| everything || Some(*first) != newest)
            .collect();
        for first in doomed {
            let segment = inner.segments.remove(&first).expect("listed above");
            fs::remove_file(&segment.path)?;
        }
        sync_dir(&inner.dir)?;
        while inner.cache.front().is_some_and(|(entry, _)| entry.log_id.index <= log_id.index) {
            let (_, len) = inner.cache.pop_front().expect("just looked");
            inner.cache_bytes -= len;
        }
        if inner.last_log_id.is_none_or(|last| last.index < log_id.index) {
            inner.last_log_id = Some(log_id);
        }
        Ok(())
    }

    /// After a snapshot's install brought the state to `last`, drops the entries it replaces
    /// and moves the purge point to `last`. The entries after `last` stay when they continue
    /// the snapshot's history: the log holds `last` itself, or was purged up to it (openraft
    /// does so once told the install is done, and then appends what the leader sends next).
    /// Otherwise none of the entries held after `last` is in that history (two logs that
    /// differ at an index differ after it too), so they all go, and the leader sends them
    /// again.
    pub(crate) fn drop_replaced_by_snapshot(&self, last: LogId<u64>) -> io::Result<()> {
        let purged_to_it = self.lock().last_purged == Some(last);
        let held = self.entries(last.index, last.index + 1, usize::MAX)?.pop();
        if !purged_to_it
            && held.map(|entry| entry.log_id) != Some(last)
            && let Some((first, _)) = self.bounds()
        {
            self.truncate_blocking(LogId::new(last.leader_id, first))?;
        }
        self.purge_blocking(last)
    }

    /// Appends `entries` (each following the last entry held) and returns once they are on disk.
    pub async fn append_durably(&self, entries: Vec<Entry<TypeConfig>>) -> io::Result<()> {
        self.blocking(move |store| store.append_blocking(entries)).await
    }

    async fn blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce(LogStore) -> io::Result<T> + Send + 'static,
    ) -> io::Result<T> {
        let store = self.clone();
        crate::sys::blocking(move || work(store)).await
    }
}

fn bounds_of<RB: RangeBounds<u64>>(range: &RB) -> (u64, u64) {
    let start = match range.start_bound() {
        Bound::Included(start) => *start,
        Bound::Excluded(start) => start.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(end) => end.saturating_add(1),
        Bound::Excluded(end) => *end,
        Bound::Unbounded => u64::MAX,
    };
    (start, end)
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, Error> {
        let (start, end) = bounds_of(&range);
        self.entries(start, end, usize::MAX).map_err(read_error)
    }

    async fn limited_get_log_entries(&mut self, start: u64, end: u64) -> Result<Vec<Entry<TypeConfig>>, Error> {
        // At most 4 096 entries and about 8 MB per read: one append-entries request stays small.
        self.entries(start, end.min(start.saturating_add(4096)), 8 * 1024 * 1024).map_err(read_error)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, Error> {
        let inner = self.lock();
        Ok(LogState { last_purged_log_id: inner.last_purged, last_log_id: inner.last_log_id })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> Result<(), Error> {
        let vote = *vote;
        self.blocking(move |store| {
            let dir = store.lock().dir.clone();
            write_atomically(&dir, "vote", &postcard::to_allocvec(&vote).expect("a vote encodes"))?;
            store.lock().vote = Some(vote);
            Ok(())
        })
        .await
        .map_err(|error| io_error(StorageIOError::write_vote, error))
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<u64>>, Error> {
        Ok(self.lock().vote)
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), Error>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        // Durable before openraft hears of it, and before this returns (see the module docs).
        match self.append_durably(entries.into_iter().collect()).await {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(error) => {
                let reported = io::Error::new(error.kind(), error.to_string());
                callback.log_io_completed(Err(reported));
                Err(write_error(error))
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId<u64>) -> Result<(), Error> {
        self.blocking(move |store| store.truncate_blocking(log_id)).await.map_err(write_error)
    }

    async fn purge(&mut self, log_id: LogId<u64>) -> Result<(), Error> {
        self.blocking(move |store| store.purge_blocking(log_id)).await.map_err(write_error)
    }
}

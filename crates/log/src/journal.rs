//! The shared journal: one file, written and synced for every partition of a log, so that the
//! writes of many partitions in one group-commit window are made durable by one `fdatasync`
//! instead of one per partition file (which a closed-loop producer across ten partitions, or a
//! consumer committing its offsets beside them, pays in series).
//!
//! With the journal on, a partition still writes each batch to its own segment (the page
//! cache; readers and everything else are unchanged) and hands a copy to the journal, which
//! keeps it as a record naming the topic, partition, segment and position. An append that asked
//! for `fsync` waits until a sync of the journal covers its record. Group commit without a
//! thread of its own: the first partition thread to wait while no commit runs becomes the
//! leader, writes every record handed over so far with one write and syncs the file once, then
//! wakes everyone that commit covered; records handed over meanwhile go in the next commit,
//! led by one of their waiters. So a batch costs no hand-off beyond what the partition's own
//! fdatasync cost, and one sync covers every partition written in its window. A small thread
//! commits records nobody waits for (`async` appends) within 200 ms, and grows the file's
//! runway while nothing is being committed. The segment files are synced later: when a
//! segment is closed (a roll or a clean shutdown, as without the journal), and for every
//! segment a journal file refers to before that file is deleted (a checkpoint, when the file is
//! full).
//!
//! Replay, when the log opens and before any partition does: every record of every journal
//! file whose segment is still its partition's newest is written to the segment at its position
//! if the bytes there differ (a power cut lost or tore them), and those segments are synced.
//! Only the newest segment can lack a journalled batch, because a roll syncs the segment it
//! closes before the next exists; retention and compaction touch only closed segments, so a
//! record never lands on bytes they rewrote. A dropped topic's records are voided by a `forget`
//! record journalled (and synced) before its directory goes, so a topic made again under the
//! same name never gets the old one's batches. After replay the segments hold everything, the
//! old files are deleted and a new one starts.
//!
//! File layout, `{log}/+journal/{sequence:020}.journal` (`+` is not allowed in a topic name):
//! records back to back, then zeros (the runway written ahead so that syncs need no size
//! change). A record is `magic u32 | body length u32 | crc32c(body) u32 | body`, little endian;
//! the body is `kind u8 | topic length u16 | topic | partition u32 | segment base u64 | position
//! u64 | batch bytes` (kind 1, a batch) or `kind u8 | topic length u16 | topic` (kind 2, forget).
//! Reading stops at the first record that is not whole and valid: the torn end of a write that
//! was never acknowledged, or the runway.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::{OpenError, io_at};
use crate::file::{SegmentFile, Storage};
use crate::metrics as m;
use crate::partition::CONFIG_FILE;
use crate::segment::{LOG_SUFFIX, Segment, segment_file, sync_dir};

/// The journal's directory inside the log directory.
pub(crate) const JOURNAL_DIR: &str = "+journal";
const SUFFIX: &str = "journal";
const MAGIC: u32 = 0x4E52_4A4F; // "OJRN"
const HEADER_BYTES: usize = 12;
const KIND_BATCH: u8 = 1;
const KIND_FORGET: u8 = 2;
/// A commit past the runway writes this much of zeros after its records, at most.
const BUSY_RUNWAY_BYTES: u64 = 64 << 10;
static ZEROS: [u8; BUSY_RUNWAY_BYTES as usize] = [0; BUSY_RUNWAY_BYTES as usize];
/// Records handed over and not yet committed, past which a submitter commits them itself: the
/// journal's memory is bounded even when nothing asks for a sync.
const PENDING_BYTES_MAX: usize = 16 << 20;
/// Records nobody waits for are committed within this long.
const IDLE_SYNC: Duration = Duration::from_millis(200);

/// Settings of the journal.
#[derive(Clone, Debug)]
pub struct JournalOptions {
    /// A file that has grown past this is checkpointed and a new one started. Opening the log
    /// reads each file whole, so this also bounds the replay's memory.
    pub file_bytes_max: u64,
    /// Zeros written ahead of the records while nothing is committed, so that a sync covers
    /// data, not a new file size; they grow once half is used. Small enough that a commit
    /// waiting behind their growth waits a few milliseconds at most.
    pub runway_bytes: u64,
}

impl Default for JournalOptions {
    fn default() -> Self {
        JournalOptions { file_bytes_max: 64 << 20, runway_bytes: 1 << 20 }
    }
}

/// What the partitions' threads and the journal's own share.
struct State {
    /// Encoded records handed over, not yet committed.
    pending: Vec<u8>,
    /// The segment of each batch record in `pending`.
    segments: Vec<Arc<Segment>>,
    /// Tickets: every record gets the next; `durable` says how far the commits got.
    submitted: u64,
    durable: u64,
    /// A commit (or the runway's growth) holds the file.
    leading: bool,
    failed: Option<String>,
    closing: bool,
}

struct Inner {
    dir: PathBuf,
    options: JournalOptions,
    state: Mutex<State>,
    /// Wakes those waiting for a commit to end.
    progress: Condvar,
    /// Wakes the journal's thread (closing).
    wake: Condvar,
    /// Only the leader of a commit, or the journal's thread growing the runway, takes it.
    file: Mutex<JournalFile>,
    storage: Arc<dyn Storage>,
    fsync_seconds: metrics::Histogram,
}

/// The journal of one log. Cloned handles share it.
#[derive(Clone)]
pub(crate) struct Journal {
    inner: Arc<Inner>,
    thread: Arc<Mutex<Option<JoinHandle<()>>>>,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("Journal").field("dir", &self.inner.dir).finish()
    }
}

/// What [`Journal::replay`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JournalReplay {
    /// Journal files read.
    pub files: usize,
    /// Batch records found in them.
    pub records: usize,
    /// Batches written back into a segment that had lost or torn them.
    pub restored: usize,
    /// Records skipped: their partition is gone or was dropped, or their segment is closed.
    pub skipped: usize,
}

/// One record read back.
enum Read {
    Batch { topic: String, partition: u32, segment: u64, position: u64, bytes: Vec<u8> },
    Forget { topic: String },
}

fn encode_batch(out: &mut Vec<u8>, topic: &str, partition: u32, segment: u64, position: u64, batch: &[u8]) {
    let start = begin_record(out, KIND_BATCH, topic, 4 + 8 + 8 + batch.len());
    out.extend_from_slice(&partition.to_le_bytes());
    out.extend_from_slice(&segment.to_le_bytes());
    out.extend_from_slice(&position.to_le_bytes());
    out.extend_from_slice(batch);
    seal(out, start);
}

fn encode_forget(out: &mut Vec<u8>, topic: &str) {
    let start = begin_record(out, KIND_FORGET, topic, 0);
    seal(out, start);
}

/// Starts a record of `kind` for `topic` whose body has `rest` more bytes after the topic;
/// returns where it starts, for [`seal`].
fn begin_record(out: &mut Vec<u8>, kind: u8, topic: &str, rest: usize) -> usize {
    let body_len = 1 + 2 + topic.len() + rest;
    let start = out.len();
    out.reserve(HEADER_BYTES + body_len);
    out.extend_from_slice(&MAGIC.to_le_bytes());
    out.extend_from_slice(&(body_len as u32).to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.push(kind);
    out.extend_from_slice(&(topic.len() as u16).to_le_bytes());
    out.extend_from_slice(topic.as_bytes());
    start
}

/// Writes the CRC of the record that starts at `start` and ends the buffer.
fn seal(out: &mut [u8], start: usize) {
    let crc = crc32c::crc32c(&out[start + HEADER_BYTES..]);
    out[start + 8..start + 12].copy_from_slice(&crc.to_le_bytes());
}

/// Decodes the records of one file's bytes, up to the first that is not whole and valid.
fn decode(bytes: &[u8]) -> (Vec<Read>, usize) {
    let mut records = Vec::new();
    let mut at = 0;
    while let Some(header) = bytes.get(at..at + HEADER_BYTES) {
        let word = |i: usize| u32::from_le_bytes(header[i..i + 4].try_into().expect("4 bytes"));
        if word(0) != MAGIC {
            break;
        }
        let body_len = word(4) as usize;
        let Some(body) = bytes.get(at + HEADER_BYTES..at + HEADER_BYTES + body_len) else { break };
        if crc32c::crc32c(body) != word(8) {
            break;
        }
        let Some(record) = decode_body(body) else { break };
        records.push(record);
        at += HEADER_BYTES + body_len;
    }
    (records, at)
}

fn decode_body(body: &[u8]) -> Option<Read> {
    let (&kind, rest) = body.split_first()?;
    let topic_len = u16::from_le_bytes(rest.get(..2)?.try_into().ok()?) as usize;
    let topic = std::str::from_utf8(rest.get(2..2 + topic_len)?).ok()?.to_string();
    let rest = &rest[2 + topic_len..];
    match kind {
        KIND_FORGET if rest.is_empty() => Some(Read::Forget { topic }),
        KIND_BATCH if rest.len() >= 20 => {
            let partition = u32::from_le_bytes(rest[..4].try_into().ok()?);
            let segment = u64::from_le_bytes(rest[4..12].try_into().ok()?);
            let position = u64::from_le_bytes(rest[12..20].try_into().ok()?);
            Some(Read::Batch { topic, partition, segment, position, bytes: rest[20..].to_vec() })
        }
        _ => None,
    }
}

/// A batch record read back: (segment base offset, position, the batch).
type Journalled = (u64, u64, Vec<u8>);

fn journal_files(dir: &Path) -> std::io::Result<Vec<(u64, PathBuf)>> {
    let mut files = Vec::new();
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(files),
        Err(error) => return Err(error),
    };
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(stem) = name.strip_suffix(&format!(".{SUFFIX}"))
            && let Ok(sequence) = stem.parse::<u64>()
        {
            files.push((sequence, entry.path()));
        }
    }
    files.sort();
    Ok(files)
}

fn file_name(dir: &Path, sequence: u64) -> PathBuf {
    dir.join(format!("{sequence:020}.{SUFFIX}"))
}

/// Puts every journalled batch back into its segment where the segment lost it, syncs those
/// segments, and returns the sequence number the next journal file takes. Runs before any
/// partition of `log_dir` opens.
fn replay(log_dir: &Path, storage: &dyn Storage) -> Result<(JournalReplay, u64, Vec<PathBuf>), OpenError> {
    let dir = log_dir.join(JOURNAL_DIR);
    let files = journal_files(&dir).map_err(io_at(&dir))?;
    let mut report = JournalReplay { files: files.len(), ..JournalReplay::default() };
    // Per partition, its records in journal order.
    let mut batches: BTreeMap<(String, u32), Vec<Journalled>> = BTreeMap::new();
    for (_, path) in &files {
        let bytes = fs::read(path).map_err(io_at(path))?;
        let (records, valid) = decode(&bytes);
        if bytes[valid..].iter().any(|&byte| byte != 0) {
            // The end of a write a crash tore (never acknowledged), or damage; either way
            // nothing after it is used, and nothing is deleted because of it.
            tracing::info!(journal = %path.display(), at = valid, "the journal file's records end before its last written bytes");
        }
        for record in records {
            match record {
                Read::Batch { topic, partition, segment, position, bytes } => {
                    report.records += 1;
                    batches.entry((topic, partition)).or_default().push((segment, position, bytes));
                }
                Read::Forget { topic } => {
                    batches.retain(|(name, _), records| {
                        if *name == topic {
                            report.skipped += records.len();
                        }
                        *name != topic
                    });
                }
            }
        }
    }
    for ((topic, partition), records) in batches {
        let partition_dir = log_dir.join(&topic).join(partition.to_string());
        if !partition_dir.join(CONFIG_FILE).exists() {
            report.skipped += records.len();
            continue;
        }
        let bases = crate::check::segment_bases(&partition_dir).map_err(io_at(&partition_dir))?;
        let Some(&newest) = bases.last() else {
            report.skipped += records.len();
            continue;
        };
        let path = segment_file(&partition_dir, newest, LOG_SUFFIX);
        let file = storage.open(&path, false).map_err(io_at(&path))?;
        let mut restored = 0;
        for (segment, position, bytes) in records {
            if segment != newest {
                report.skipped += 1;
                continue;
            }
            if !holds(&*file, position, &bytes) {
                file.write_all_at(&bytes, position).map_err(io_at(&path))?;
                restored += 1;
            }
        }
        // Identical bytes may be in the page cache only (a process crash): sync either way.
        file.sync_data().map_err(io_at(&path))?;
        if restored > 0 {
            tracing::warn!(segment = %path.display(), batches = restored, "restored acknowledged batches from the journal");
            Segment::invalidate_index(&partition_dir, newest).map_err(io_at(&partition_dir))?;
        }
        report.restored += restored;
    }
    let next = files.last().map_or(0, |(sequence, _)| sequence + 1);
    Ok((report, next, files.into_iter().map(|(_, path)| path).collect()))
}

fn holds(file: &dyn SegmentFile, position: u64, bytes: &[u8]) -> bool {
    let mut found = vec![0; bytes.len()];
    file.read_exact_at(&mut found, position).is_ok() && found == bytes
}

/// Replays a journal a log opened without one finds (it ran with one before), then deletes it:
/// its records may be the only durable copy of acknowledged batches.
pub(crate) fn replay_leftover(log_dir: &Path, storage: &dyn Storage) -> Result<Option<JournalReplay>, OpenError> {
    let dir = log_dir.join(JOURNAL_DIR);
    if fs::metadata(&dir).is_err() {
        return Ok(None);
    }
    let (report, _, files) = replay(log_dir, storage)?;
    for path in &files {
        fs::remove_file(path).map_err(io_at(path))?;
    }
    fs::remove_dir(&dir).map_err(io_at(&dir))?;
    sync_dir(log_dir).map_err(io_at(log_dir))?;
    Ok(Some(report))
}

impl Journal {
    /// Replays the journal of the log in `log_dir` (see the module), then starts a new journal
    /// file and the journal's thread.
    pub(crate) fn open(
        log_dir: &Path,
        storage: Arc<dyn Storage>,
        options: JournalOptions,
    ) -> Result<(Journal, JournalReplay), OpenError> {
        let (report, sequence, old) = replay(log_dir, &*storage)?;
        let dir = log_dir.join(JOURNAL_DIR);
        fs::create_dir_all(&dir).map_err(io_at(&dir))?;
        sync_dir(log_dir).map_err(io_at(log_dir))?;
        let (file, path) = create_file(&dir, &*storage, sequence).map_err(io_at(&dir))?;
        // The new file exists (durably) before the old ones go: their records are in the
        // segments now, synced by the replay.
        for path in &old {
            fs::remove_file(path).map_err(io_at(path))?;
        }
        sync_dir(&dir).map_err(io_at(&dir))?;
        let runway_bytes = options.runway_bytes.max(BUSY_RUNWAY_BYTES);
        let mut file =
            JournalFile { file, path, sequence, position: 0, runway: Some(0), runway_bytes, segments: HashMap::new() };
        // A runway from the start, or the first commits would each change the file's size.
        file.grow_runway_if_low().map_err(io_at(&file.path))?;
        let inner = Arc::new(Inner {
            dir,
            options,
            state: Mutex::new(State {
                pending: Vec::new(),
                segments: Vec::new(),
                submitted: 0,
                durable: 0,
                leading: false,
                failed: None,
                closing: false,
            }),
            progress: Condvar::new(),
            wake: Condvar::new(),
            file: Mutex::new(file),
            storage,
            fsync_seconds: metrics::histogram!(m::FSYNC_SECONDS),
        });
        let journal = Journal { inner, thread: Arc::new(Mutex::new(None)) };
        let thread = {
            let journal = journal.clone();
            std::thread::Builder::new()
                .name("log-journal".into())
                .spawn(move || journal.run_background())
                .map_err(io_at(log_dir))?
        };
        *journal.thread.lock().expect("journal thread lock") = Some(thread);
        Ok((journal, report))
    }

    /// Hands the journal a copy of `batch`, just written to `segment` of `topic`/`partition` at
    /// `position`; returns its ticket for [`wait`](Self::wait). Records are journalled in the
    /// order they are submitted, so one partition's stay in offset order.
    pub(crate) fn submit(
        &self,
        topic: &str,
        partition: u32,
        segment: &Arc<Segment>,
        position: u64,
        batch: &[u8],
    ) -> Result<u64, String> {
        let (ticket, full) = {
            let mut state = self.inner.state.lock().expect("journal lock");
            if let Some(reason) = &state.failed {
                return Err(reason.clone());
            }
            if state.closing {
                return Err("the log's journal is closed".into());
            }
            encode_batch(&mut state.pending, topic, partition, segment.base_offset, position, batch);
            state.segments.push(segment.clone());
            state.submitted += 1;
            (state.submitted, state.pending.len() > PENDING_BYTES_MAX)
        };
        if full {
            // Nobody has asked for a sync in a while: commit now rather than hold more.
            self.wait(ticket)?;
        }
        Ok(ticket)
    }

    /// Waits until the record with `ticket`, and every record before it, is durable: leads a
    /// commit when none runs, or waits for the one running and, if it did not cover `ticket`,
    /// for the next.
    pub(crate) fn wait(&self, ticket: u64) -> Result<(), String> {
        let mut state = self.inner.state.lock().expect("journal lock");
        loop {
            if let Some(reason) = &state.failed {
                return Err(reason.clone());
            }
            if state.durable >= ticket {
                return Ok(());
            }
            if state.leading {
                state = self.inner.progress.wait(state).expect("journal lock");
                continue;
            }
            state.leading = true;
            let mut records = std::mem::take(&mut state.pending);
            let segments = std::mem::take(&mut state.segments);
            let last = state.submitted;
            drop(state);
            let leader = Leader { inner: &self.inner };
            let committed = self.inner.file.lock().expect("journal file lock").commit(&self.inner, &records, segments);
            std::mem::forget(leader);
            state = self.inner.state.lock().expect("journal lock");
            state.leading = false;
            match committed {
                Ok(()) => state.durable = last,
                Err(reason) => {
                    tracing::error!(journal = %self.inner.dir.display(), %reason, "the log journal failed; appends that wait on it are refused");
                    state.failed.get_or_insert(reason);
                }
            }
            if state.pending.is_empty() {
                // The buffer goes back, its capacity kept, unless one burst made it huge.
                records.clear();
                if records.capacity() <= 4 << 20 {
                    state.pending = records;
                }
            }
            self.inner.progress.notify_all();
        }
    }

    /// Voids every journalled record of `topic`, durably: called once its partitions are closed
    /// (their segments synced) and before its directory is removed.
    pub(crate) fn forget(&self, topic: &str) -> Result<(), String> {
        let ticket = {
            let mut state = self.inner.state.lock().expect("journal lock");
            if let Some(reason) = &state.failed {
                return Err(reason.clone());
            }
            if state.closing {
                return Err("the log's journal is closed".into());
            }
            encode_forget(&mut state.pending, topic);
            state.submitted += 1;
            state.submitted
        };
        self.wait(ticket)
    }

    /// Commits what is pending, then stops the journal's thread. Idempotent.
    pub(crate) fn close(&self) {
        {
            let mut state = self.inner.state.lock().expect("journal lock");
            state.closing = true;
            self.inner.wake.notify_all();
        }
        if let Some(thread) = self.thread.lock().expect("journal thread lock").take()
            && thread.join().is_err()
        {
            tracing::error!(journal = %self.inner.dir.display(), "the log journal thread panicked");
        }
    }

    /// The journal's thread: commits records nobody waits for within [`IDLE_SYNC`], grows the
    /// runway while nothing is committed, and commits the rest when the log closes.
    fn run_background(&self) {
        loop {
            let mut state = self.inner.state.lock().expect("journal lock");
            let (guard, _) = self.inner.wake.wait_timeout(state, IDLE_SYNC).expect("journal lock");
            state = guard;
            let (submitted, durable, closing) = (state.submitted, state.durable, state.closing);
            if state.failed.is_some() {
                if closing {
                    return;
                }
                continue;
            }
            if submitted > durable {
                drop(state);
                // An error is the waiters' to report; this thread only stops on close.
                let _ = self.wait(submitted);
                continue;
            }
            if closing {
                return;
            }
            if state.leading {
                continue;
            }
            state.leading = true;
            drop(state);
            if let Err(error) = self.inner.file.lock().expect("journal file lock").grow_runway_if_low() {
                tracing::warn!(journal = %self.inner.dir.display(), %error, "cannot grow the journal's runway; appending instead");
            }
            self.inner.state.lock().expect("journal lock").leading = false;
            self.inner.progress.notify_all();
        }
    }
}

/// Held by a commit's leader: if the commit panics, the journal fails instead of leaving every
/// later waiter waiting for a leader that is gone.
struct Leader<'a> {
    inner: &'a Inner,
}

impl Drop for Leader<'_> {
    fn drop(&mut self) {
        let mut state = self.inner.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        state.failed.get_or_insert_with(|| "a journal commit panicked".to_string());
        state.leading = false;
        self.inner.progress.notify_all();
    }
}

fn create_file(dir: &Path, storage: &dyn Storage, sequence: u64) -> std::io::Result<(Box<dyn SegmentFile>, PathBuf)> {
    let path = file_name(dir, sequence);
    let file = storage.open(&path, true)?;
    sync_dir(dir)?;
    Ok((file, path))
}

/// The journal file being written: only a commit's leader (or the runway's growth) holds it.
struct JournalFile {
    file: Box<dyn SegmentFile>,
    path: PathBuf,
    sequence: u64,
    /// Where the next record goes.
    position: u64,
    /// Zeros are written (and synced) up to here; `None` once growing them failed.
    runway: Option<u64>,
    /// How much the runway grows by ([`JournalOptions::runway_bytes`]).
    runway_bytes: u64,
    /// The segments the current file's records went to, by address: synced before the file
    /// is deleted.
    segments: HashMap<usize, Arc<Segment>>,
}

impl JournalFile {
    /// Writes `records` with one write, syncs the file, and starts the next file if this one
    /// is full.
    fn commit(&mut self, inner: &Inner, records: &[u8], segments: Vec<Arc<Segment>>) -> Result<(), String> {
        if !records.is_empty() {
            let end = self.position + records.len() as u64;
            let written = self.file.write_all_at(records, self.position).and_then(|()| match self.runway {
                // Past the runway (too busy to grow it): a short stretch of zeros after the
                // records spares the next few commits a change of the file's size.
                Some(runway) if end > runway => {
                    let extended = (end + 1).next_multiple_of(BUSY_RUNWAY_BYTES);
                    self.file.write_all_at(&ZEROS[..(extended - end) as usize], end)?;
                    self.runway = Some(extended);
                    Ok(())
                }
                _ => Ok(()),
            });
            written.map_err(|error| format!("journal write failed: {error}"))?;
            self.position = end;
        }
        for segment in segments {
            self.segments.entry(Arc::as_ptr(&segment) as usize).or_insert(segment);
        }
        let started = Instant::now();
        self.file.sync_data().map_err(|error| format!("journal fsync failed: {error}"))?;
        inner.fsync_seconds.record(started.elapsed().as_secs_f64());
        if self.position >= inner.options.file_bytes_max {
            self.checkpoint(inner).map_err(|error| format!("journal checkpoint failed: {error}"))?;
        }
        Ok(())
    }

    fn grow_runway_if_low(&mut self) -> std::io::Result<()> {
        let Some(runway) = self.runway else { return Ok(()) };
        let grow = self.runway_bytes;
        if runway - self.position >= grow / 2 {
            return Ok(());
        }
        let grown = self.file.write_all_at(&vec![0u8; grow as usize], runway).and_then(|()| self.file.sync_data());
        match grown {
            Ok(()) => self.runway = Some(runway + grow),
            Err(_) => self.runway = None,
        }
        grown
    }

    /// Starts the next file, syncs every segment the full one's records went to, then deletes
    /// it: its records are in the segments, durably. Runs inside a commit, after its sync, so
    /// every record of the full file is written and synced, and none of the next file's is yet.
    fn checkpoint(&mut self, inner: &Inner) -> std::io::Result<()> {
        let (file, path) = create_file(&inner.dir, &*inner.storage, self.sequence + 1)?;
        for segment in self.segments.values() {
            segment.sync()?;
        }
        self.segments.clear();
        let old = std::mem::replace(&mut self.path, path);
        self.file = file;
        self.sequence += 1;
        self.position = 0;
        self.runway = Some(0);
        fs::remove_file(&old)?;
        sync_dir(&inner.dir)?;
        if let Err(error) = self.grow_runway_if_low() {
            // Not fatal: commits append instead.
            tracing::warn!(journal = %self.path.display(), %error, "cannot grow the journal's runway; appending instead");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_read_back_as_written_and_reading_stops_at_the_first_bad_one() {
        let mut bytes = Vec::new();
        encode_batch(&mut bytes, "orders", 3, 100, 4096, b"a batch");
        encode_forget(&mut bytes, "gone");
        encode_batch(&mut bytes, "x", 0, 0, 0, b"");
        let whole = bytes.len();
        let (records, valid) = decode(&bytes);
        assert_eq!(valid, whole);
        assert_eq!(records.len(), 3);
        assert!(matches!(&records[0], Read::Batch { topic, partition: 3, segment: 100, position: 4096, bytes }
            if topic == "orders" && bytes == b"a batch"));
        assert!(matches!(&records[1], Read::Forget { topic } if topic == "gone"));
        // Every cut and every flipped byte of the last record stops the reading before it.
        let last_start = {
            let mut first_two = Vec::new();
            encode_batch(&mut first_two, "orders", 3, 100, 4096, b"a batch");
            encode_forget(&mut first_two, "gone");
            first_two.len()
        };
        for cut in last_start..whole {
            let (records, valid) = decode(&bytes[..cut]);
            assert_eq!((records.len(), valid), (2, last_start), "cut at {cut}");
        }
        for flip in last_start..whole {
            let mut damaged = bytes.clone();
            damaged[flip] ^= 0x40;
            let (records, valid) = decode(&damaged);
            assert_eq!((records.len(), valid), (2, last_start), "byte {flip} flipped");
        }
        // Zeros after the records (the runway) end the reading.
        bytes.extend_from_slice(&[0; 64]);
        assert_eq!(decode(&bytes).1, whole);
    }
}

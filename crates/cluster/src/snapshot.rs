//! Snapshots: how a node that lacks entries the others already purged from their Raft logs
//! gets the state those entries made.
//!
//! A snapshot is the applier's state as files (in onehop, the log's partitions, catalog and
//! view checkpoints), as of the last command applied when it was taken. Taking one costs no
//! copy: the applier hard-links its files into a directory of their own ([`Applier::snapshot_files`])
//! while no command is being applied, and notes how many bytes of each belong to the
//! snapshot. What it sends is an archive read straight from those links ([`Archive`]):
//!
//! ```text
//! "onehop-snapshot1"                                        16 bytes
//! per file: [path length u16 LE][path, UTF-8][byte count u64 LE][bytes]
//! [0u16]                                                    the end
//! ```
//!
//! A node that receives one keeps the archive, records that an install is pending, and
//! restarts ([`Applier::restart`]): before its applier opens again, [`install_pending`] puts
//! the archive's files in place of the state's, keeping the files the applier keeps for itself
//! (onehop: MQTT sessions, Kafka groups), records the snapshot as applied, and drops Raft log
//! entries that the snapshot replaces. Each step can be repeated after a crash.
//!
//! Snapshots work on the real file system only: the simulation (`sim` feature) runs its nodes
//! without them, keeping the whole log.
//!
//! [`Applier::snapshot_files`]: crate::Applier::snapshot_files
//! [`Applier::restart`]: crate::Applier::restart

use std::fs::{self, File};
use std::io::{self, BufReader, Read, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use openraft::{BasicNode, LogId, StoredMembership};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncSeek, AsyncWrite, ReadBuf};

use crate::raftlog::{LogStore, write_atomically};

const MAGIC: &[u8; 16] = b"onehop-snapshot1";
/// The longest path an archive may name.
const PATH_BYTES_MAX: usize = 4096;

/// The directory under the node's directory where snapshots are sent from and received to.
pub(crate) const SNAPSHOT_DIR: &str = "snapshot";
/// A received archive, complete and synced.
const ARCHIVE: &str = "archive";
/// The snapshot's metadata, written once the archive is complete: its presence means an
/// install is pending, and it is removed last.
const PENDING: &str = "pending";
/// Written once the archive is unpacked into `INSTALL`, synced.
const UNPACKED: &str = "unpacked";
/// The archive's files, unpacked: the new state's root until it is moved into place.
const INSTALL: &str = "install";
/// The state's root before the install, until the install is done.
const OLD: &str = "old";
/// Prefix of the directories of links a snapshot being sent reads from.
const SENDING: &str = "sending-";
/// Prefix of an archive being received.
const RECEIVING: &str = "receiving-";

/// One file of a snapshot: its path under the state's root (`/`-separated), the file to read
/// it from, and how many bytes of that file it is.
#[derive(Clone, Debug)]
pub struct SnapshotFile {
    pub path: String,
    pub source: PathBuf,
    pub bytes: u64,
}

/// What a pending install records.
#[derive(Clone, Serialize, Deserialize)]
pub(crate) struct Pending {
    pub last: Option<LogId<u64>>,
    pub membership: StoredMembership<u64, BasicNode>,
}

/// A snapshot's bytes: an archive read from a snapshot's links (sending), or the file an
/// archive is received into.
pub enum SnapshotData {
    Sending(Archive),
    Receiving(Received),
}

/// The file an archive is received into, removed when dropped unless it was installed
/// (renamed to the pending archive): openraft drops a snapshot it no longer needs.
pub struct Received {
    pub(crate) file: tokio::fs::File,
    pub(crate) path: PathBuf,
    /// Keeps this node from starting elections while the archive arrives.
    pub(crate) paused: Option<ElectionsPaused>,
}

impl Drop for Received {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// Turns this node's elections off and on. The leader's snapshot chunks, unlike its
/// heartbeats, do not reset a follower's election timer (openraft 0.9), so a node receiving a
/// snapshot that takes longer than the election timeout would start an election, depose the
/// leader (whose term it passes), and have the transfer start over: with enough data, forever.
#[derive(Clone, Default)]
pub(crate) struct Elections(Arc<ElectionState>);

/// Why elections are off: a snapshot arriving, or this node cut off from a majority (it
/// could not win, and each try would raise its term: see `Inner::gate_elections`).
#[derive(Default)]
pub(crate) struct ElectionState {
    switch: std::sync::OnceLock<ElectionSwitch>,
    receiving: std::sync::atomic::AtomicBool,
    cut_off: std::sync::atomic::AtomicBool,
}

/// Turns elections on or off (a node's Raft, behind a trait object: the state machine that
/// holds it is inside that Raft).
type ElectionSwitch = Box<dyn Fn(bool) + Send + Sync>;

impl Elections {
    /// Gives it the node's Raft, once there is one.
    pub(crate) fn attach(&self, raft: openraft::Raft<crate::TypeConfig>) {
        let _ = self.0.switch.set(Box::new(move |on| raft.runtime_config().elect(on)));
        self.apply();
    }

    /// Elections on unless a reason holds them off.
    fn apply(&self) {
        use std::sync::atomic::Ordering::SeqCst;
        if let Some(switch) = self.0.switch.get() {
            switch(!self.0.receiving.load(SeqCst) && !self.0.cut_off.load(SeqCst));
        }
    }

    fn set(&self, on: bool) {
        self.0.receiving.store(!on, std::sync::atomic::Ordering::SeqCst);
        self.apply();
    }

    /// Whether this node could not win an election now: it reaches no majority of voters
    /// that have lost their leader too. Off then, it keeps its term until it could.
    pub(crate) fn set_cut_off(&self, cut_off: bool) {
        if self.0.cut_off.swap(cut_off, std::sync::atomic::Ordering::SeqCst) != cut_off {
            if cut_off {
                tracing::info!("no majority could elect this node now: it stands for no election, and its term stays");
            } else {
                tracing::info!("a majority could elect this node again: it may stand for election");
            }
            self.apply();
        }
    }

    /// Elections off until the returned guard is dropped, or until no chunk arrived for
    /// [`STALLED_AFTER`] (a leader gone mid-transfer must not leave this node unable to stand).
    pub(crate) fn pause(&self) -> ElectionsPaused {
        self.set(false);
        let progress = Arc::new(std::sync::Mutex::new(std::time::Instant::now()));
        let over = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (elections, watched, ended) = (self.clone(), progress.clone(), over.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                if ended.load(std::sync::atomic::Ordering::SeqCst) {
                    return;
                }
                if watched.lock().expect("progress lock").elapsed() >= STALLED_AFTER {
                    tracing::warn!("no snapshot chunk for a while: this node may stand for election again");
                    elections.set(true);
                    return;
                }
            }
        });
        ElectionsPaused { elections: self.clone(), progress, over }
    }
}

/// A snapshot transfer with no chunk for this long is taken as abandoned.
const STALLED_AFTER: std::time::Duration = std::time::Duration::from_secs(10);

/// Elections stay off while this lives (see [`Elections::pause`]).
pub(crate) struct ElectionsPaused {
    elections: Elections,
    progress: Arc<std::sync::Mutex<std::time::Instant>>,
    over: Arc<std::sync::atomic::AtomicBool>,
}

impl ElectionsPaused {
    /// A chunk arrived.
    fn progressed(&self) {
        *self.progress.lock().expect("progress lock") = std::time::Instant::now();
    }

    /// The node restarts to install: elections stay off until it does.
    pub(crate) fn keep_off(mut self) {
        self.over.store(true, std::sync::atomic::Ordering::SeqCst);
        self.elections = Elections::default();
    }
}

impl Drop for ElectionsPaused {
    fn drop(&mut self) {
        self.over.store(true, std::sync::atomic::Ordering::SeqCst);
        self.elections.set(true);
    }
}

/// An archive of a snapshot's files, read on demand from its links, which are removed when it
/// is dropped.
pub struct Archive {
    parts: Vec<Part>,
    /// Where each part starts in the archive.
    starts: Vec<u64>,
    len: u64,
    position: u64,
    /// The open file of the part read last.
    open: Option<(usize, File)>,
    /// The directory of links, removed on drop.
    links: Option<PathBuf>,
}

enum Part {
    Bytes(Vec<u8>),
    File { path: PathBuf, bytes: u64 },
}

impl Part {
    fn len(&self) -> u64 {
        match self {
            Part::Bytes(bytes) => bytes.len() as u64,
            Part::File { bytes, .. } => *bytes,
        }
    }
}

/// Whether `path` is a relative path of plain names: no empty, `.` or `..` component, no NUL.
fn valid_path(path: &str) -> bool {
    !path.is_empty()
        && path.len() <= PATH_BYTES_MAX
        && !path.contains('\0')
        && path.split('/').all(|part| !part.is_empty() && part != "." && part != "..")
}

impl Archive {
    /// The archive of `files`, whose links live in `links` (removed when the archive is
    /// dropped; `None`: nothing to remove).
    pub fn new(files: Vec<SnapshotFile>, links: Option<PathBuf>) -> io::Result<Archive> {
        let mut parts = vec![Part::Bytes(MAGIC.to_vec())];
        for file in files {
            if !valid_path(&file.path) {
                return Err(io::Error::other(format!("a snapshot cannot hold the path {:?}", file.path)));
            }
            let mut header = Vec::with_capacity(2 + file.path.len() + 8);
            header.extend_from_slice(&(file.path.len() as u16).to_le_bytes());
            header.extend_from_slice(file.path.as_bytes());
            header.extend_from_slice(&file.bytes.to_le_bytes());
            parts.push(Part::Bytes(header));
            parts.push(Part::File { path: file.source, bytes: file.bytes });
        }
        parts.push(Part::Bytes(0u16.to_le_bytes().to_vec()));
        let mut starts = Vec::with_capacity(parts.len());
        let mut len = 0;
        for part in &parts {
            starts.push(len);
            len += part.len();
        }
        Ok(Archive { parts, starts, len, position: 0, open: None, links })
    }

    /// The archive's length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Reads at the current position into `buf`, from one part.
    fn read_here(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.position >= self.len || buf.is_empty() {
            return Ok(0);
        }
        let index = self.starts.partition_point(|start| *start <= self.position) - 1;
        let within = self.position - self.starts[index];
        let left = (self.parts[index].len() - within).min(buf.len() as u64) as usize;
        let read = match &self.parts[index] {
            Part::Bytes(bytes) => {
                buf[..left].copy_from_slice(&bytes[within as usize..within as usize + left]);
                left
            }
            Part::File { path, .. } => {
                if self.open.as_ref().is_none_or(|(open, _)| *open != index) {
                    self.open = Some((index, File::open(path)?));
                }
                let (_, file) = self.open.as_ref().expect("opened above");
                let read = file.read_at(&mut buf[..left], within)?;
                if read == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!(
                            "{} ended before the snapshot's {} bytes of it",
                            path.display(),
                            self.parts[index].len()
                        ),
                    ));
                }
                read
            }
        };
        self.position += read as u64;
        Ok(read)
    }
}

impl Drop for Archive {
    fn drop(&mut self) {
        self.open = None;
        if let Some(links) = &self.links {
            let _ = fs::remove_dir_all(links);
        }
    }
}

impl AsyncRead for SnapshotData {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match &mut *self {
            SnapshotData::Sending(archive) => {
                // Local files, read in pieces of at most the buffer's size: short enough to
                // read in place.
                let read = archive.read_here(buf.initialize_unfilled())?;
                buf.advance(read);
                Poll::Ready(Ok(()))
            }
            SnapshotData::Receiving(received) => Pin::new(&mut received.file).poll_read(cx, buf),
        }
    }
}

impl AsyncSeek for SnapshotData {
    fn start_seek(mut self: Pin<&mut Self>, position: SeekFrom) -> io::Result<()> {
        match &mut *self {
            SnapshotData::Sending(archive) => {
                let to = match position {
                    SeekFrom::Start(to) => Some(to),
                    SeekFrom::End(delta) => archive.len.checked_add_signed(delta),
                    SeekFrom::Current(delta) => archive.position.checked_add_signed(delta),
                };
                archive.position = to.ok_or_else(|| io::Error::other("a seek before the snapshot's start"))?;
                Ok(())
            }
            SnapshotData::Receiving(received) => Pin::new(&mut received.file).start_seek(position),
        }
    }

    fn poll_complete(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<u64>> {
        match &mut *self {
            SnapshotData::Sending(archive) => Poll::Ready(Ok(archive.position)),
            SnapshotData::Receiving(received) => Pin::new(&mut received.file).poll_complete(cx),
        }
    }
}

fn read_only() -> io::Error {
    io::Error::new(io::ErrorKind::Unsupported, "a snapshot being sent is read, never written")
}

impl AsyncWrite for SnapshotData {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match &mut *self {
            SnapshotData::Sending(_) => Poll::Ready(Err(read_only())),
            SnapshotData::Receiving(received) => {
                if let Some(paused) = &received.paused {
                    paused.progressed();
                }
                Pin::new(&mut received.file).poll_write(cx, buf)
            }
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut *self {
            SnapshotData::Sending(_) => Poll::Ready(Ok(())),
            SnapshotData::Receiving(received) => Pin::new(&mut received.file).poll_flush(cx),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut *self {
            SnapshotData::Sending(_) => Poll::Ready(Ok(())),
            SnapshotData::Receiving(received) => Pin::new(&mut received.file).poll_shutdown(cx),
        }
    }
}

/// A fresh directory of links for a snapshot being sent, under `dir` (the node's).
pub(crate) fn links_dir(dir: &Path) -> io::Result<PathBuf> {
    let snapshots = dir.join(SNAPSHOT_DIR);
    fs::create_dir_all(&snapshots)?;
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
    let links = snapshots.join(format!("{SENDING}{nanos}"));
    fs::create_dir(&links)?;
    Ok(links)
}

/// A fresh file to receive an archive into; earlier ones (a transfer cut short, or one
/// openraft dropped as stale) are removed, since one is received at a time.
pub(crate) fn receiving_file(dir: &Path) -> io::Result<PathBuf> {
    let snapshots = dir.join(SNAPSHOT_DIR);
    fs::create_dir_all(&snapshots)?;
    for entry in fs::read_dir(&snapshots)? {
        let entry = entry?;
        if entry.file_name().to_string_lossy().starts_with(RECEIVING) {
            fs::remove_file(entry.path())?;
        }
    }
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
    Ok(snapshots.join(format!("{RECEIVING}{nanos}")))
}

/// Removes what snapshots sent before a restart left behind (their links).
pub(crate) fn remove_sending_leftovers(dir: &Path) -> io::Result<()> {
    let snapshots = dir.join(SNAPSHOT_DIR);
    let Ok(entries) = fs::read_dir(&snapshots) else { return Ok(()) };
    for entry in entries {
        let entry = entry?;
        if entry.file_name().to_string_lossy().starts_with(SENDING) {
            fs::remove_dir_all(entry.path())?;
        }
    }
    Ok(())
}

/// Whether an install is pending in `dir` (see [`install_pending`]).
pub(crate) fn is_pending(dir: &Path) -> bool {
    fs::metadata(dir.join(SNAPSHOT_DIR).join(PENDING)).is_ok()
}

/// Makes the received archive `received` the pending install of the snapshot `pending`:
/// synced and renamed, then the record that it is pending. A crash before that record leaves
/// no install pending, and the node catches up again from the leader.
pub(crate) fn make_pending(dir: &Path, received: &Path, pending: &Pending) -> io::Result<()> {
    let snapshots = dir.join(SNAPSHOT_DIR);
    File::open(received)?.sync_all()?;
    fs::rename(received, snapshots.join(ARCHIVE))?;
    crate::sys::sync_dir(&snapshots)?;
    write_atomically(&snapshots, PENDING, &postcard::to_allocvec(pending).map_err(io::Error::other)?)
}

/// Unpacks `archive` into `into` (made new), every file and directory synced; returns the
/// bytes of its files. An archive that is damaged, or names a path outside `into`, is refused
/// with why (what was unpacked before stays in `into`, which the install removes before trying
/// again).
pub fn unpack(archive: &Path, into: &Path) -> io::Result<u64> {
    let invalid =
        |reason: String| io::Error::new(io::ErrorKind::InvalidData, format!("{}: {reason}", archive.display()));
    let mut reader = BufReader::with_capacity(1 << 20, File::open(archive)?);
    let mut magic = [0u8; 16];
    reader.read_exact(&mut magic).map_err(|_| invalid("too short to be a snapshot".into()))?;
    if &magic != MAGIC {
        return Err(invalid("not a onehop snapshot".into()));
    }
    fs::create_dir_all(into)?;
    let mut dirs = std::collections::BTreeSet::from([into.to_path_buf()]);
    let (mut files, mut total) = (0u64, 0u64);
    let mut last_report = std::time::Instant::now();
    loop {
        let mut len = [0u8; 2];
        reader.read_exact(&mut len).map_err(|_| invalid("cut short before its end".into()))?;
        let len = u16::from_le_bytes(len) as usize;
        if len == 0 {
            break;
        }
        let mut path = vec![0u8; len];
        reader.read_exact(&mut path).map_err(|_| invalid("cut short in a path".into()))?;
        let path = String::from_utf8(path).map_err(|_| invalid("a path that is not UTF-8".into()))?;
        if !valid_path(&path) {
            return Err(invalid(format!("the path {path:?} is not a plain relative path")));
        }
        let mut bytes = [0u8; 8];
        reader.read_exact(&mut bytes).map_err(|_| invalid("cut short in a length".into()))?;
        let bytes = u64::from_le_bytes(bytes);
        let target = into.join(&path);
        let parent = target.parent().expect("a joined path has a parent").to_path_buf();
        fs::create_dir_all(&parent)?;
        let mut dir = parent.clone();
        while dir.starts_with(into) && dirs.insert(dir.clone()) {
            dir = dir.parent().expect("below into").to_path_buf();
        }
        let mut file = fs::OpenOptions::new().write(true).create_new(true).open(&target).map_err(|error| {
            io::Error::new(error.kind(), format!("{}: {error} (named twice in the snapshot?)", target.display()))
        })?;
        let copied = io::copy(&mut (&mut reader).take(bytes), &mut file)?;
        if copied != bytes {
            return Err(invalid(format!("cut short in {path} ({copied} of {bytes} bytes)")));
        }
        file.flush()?;
        file.sync_all()?;
        files += 1;
        total += bytes;
        if last_report.elapsed() >= std::time::Duration::from_secs(2) {
            tracing::info!(files, bytes = total, "unpacking the snapshot");
            last_report = std::time::Instant::now();
        }
    }
    if reader.read(&mut [0u8; 1])? != 0 {
        return Err(invalid("bytes after its end".into()));
    }
    // Deepest first, so each directory's entry is synced after its own entries.
    for dir in dirs.iter().rev() {
        crate::sys::sync_dir(dir)?;
    }
    tracing::info!(files, bytes = total, "snapshot unpacked");
    Ok(total)
}

/// Moves `from` to `to` (same file system) and syncs both parents.
fn rename_durably(from: &Path, to: &Path) -> io::Result<()> {
    fs::rename(from, to)?;
    crate::sys::sync_dir(to.parent().expect("a path with a parent"))?;
    crate::sys::sync_dir(from.parent().expect("a path with a parent"))
}

/// Finishes a snapshot install this node began before it restarted: call it before the applier
/// opens its state in `root`. `dir` is the node's directory (the one `NodeOptions::dir` names).
/// The entries of `root` that `keep` accepts stay (the node's own); every other entry is
/// replaced by the snapshot's. Returns the index the snapshot brought the node to, when an
/// install was pending.
///
/// Each step can be repeated, and each leaves a state the next start recognises: unpacked
/// (the archive's files synced beside the root), swapped (the root replaced, the old one
/// beside it), recorded (the progress record says the snapshot's index, the Raft log holds no
/// entry the snapshot replaces), cleaned.
pub fn install_pending(dir: &Path, root: &Path, keep: impl Fn(&str) -> bool) -> io::Result<Option<u64>> {
    let snapshots = dir.join(SNAPSHOT_DIR);
    let pending_path = snapshots.join(PENDING);
    let archive = snapshots.join(ARCHIVE);
    let pending: Pending = match fs::read(&pending_path) {
        Ok(bytes) => postcard::from_bytes(&bytes).map_err(|error| {
            io::Error::new(io::ErrorKind::InvalidData, format!("{}: {error}", pending_path.display()))
        })?,
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            // No install pending: an archive never recorded as pending was not complete (the
            // node catches up anew), and the rest is what a finished install left.
            remove_leftovers(&snapshots)?;
            return Ok(None);
        }
        Err(error) => return Err(error),
    };
    let index = pending.last.map_or(0, |last| last.index);
    let (install, old, unpacked) = (snapshots.join(INSTALL), snapshots.join(OLD), snapshots.join(UNPACKED));
    tracing::info!(index, "installing the snapshot received from the leader");
    if fs::metadata(&unpacked).is_err() {
        if fs::metadata(&install).is_ok() {
            fs::remove_dir_all(&install)?;
        }
        unpack(&archive, &install)?;
        write_atomically(&snapshots, UNPACKED, b"")?;
    }
    if fs::metadata(&install).is_ok() {
        if fs::metadata(root).is_ok() {
            // What the node keeps for itself moves into the new root; the rest goes aside.
            for entry in fs::read_dir(root)? {
                let entry = entry?;
                let name = entry.file_name();
                if keep(&name.to_string_lossy()) {
                    let target = install.join(&name);
                    if fs::metadata(&target).is_ok() {
                        fs::remove_dir_all(&target)?;
                    }
                    fs::rename(entry.path(), target)?;
                }
            }
            crate::sys::sync_dir(&install)?;
            crate::sys::sync_dir(root)?;
            if fs::metadata(&old).is_ok() {
                fs::remove_dir_all(&old)?;
            }
            rename_durably(root, &old)?;
        }
        rename_durably(&install, root)?;
    }
    crate::machine::record_applied(dir, pending.last, pending.membership.clone())?;
    if let Some(last) = pending.last {
        let log = LogStore::open(dir.join("raft")).map_err(io::Error::other)?;
        log.drop_replaced_by_snapshot(last)?;
    }
    // Done: the record of the install goes first, so a crash from here on leaves only what
    // `remove_leftovers` removes.
    fs::remove_file(&pending_path)?;
    crate::sys::sync_dir(&snapshots)?;
    remove_leftovers(&snapshots)?;
    tracing::info!(index, "snapshot installed");
    Ok(Some(index))
}

/// Removes, with no install pending, the files an install leaves: the archive, its unpacked
/// copy (when it never got in place) and the state it replaced.
fn remove_leftovers(snapshots: &Path) -> io::Result<()> {
    for file in [ARCHIVE, UNPACKED] {
        match fs::remove_file(snapshots.join(file)) {
            Err(error) if error.kind() != io::ErrorKind::NotFound => return Err(error),
            _ => {}
        }
    }
    for dir in [INSTALL, OLD] {
        match fs::remove_dir_all(snapshots.join(dir)) {
            Err(error) if error.kind() != io::ErrorKind::NotFound => return Err(error),
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncSeekExt};

    fn file(dir: &Path, name: &str, content: &[u8]) -> PathBuf {
        let path = dir.join(name);
        fs::write(&path, content).unwrap();
        path
    }

    #[tokio::test]
    async fn an_archive_reads_its_files_up_to_their_lengths_and_seeks() {
        let dir = tempfile::tempdir().unwrap();
        let a = file(dir.path(), "a", b"hello world");
        let b = file(dir.path(), "b", b"0123456789");
        let files = vec![
            SnapshotFile { path: "t/0/a".into(), source: a, bytes: 5 },
            SnapshotFile { path: "t/1/b".into(), source: b, bytes: 10 },
        ];
        let archive = Archive::new(files, None).unwrap();
        let len = archive.len();
        let mut data = SnapshotData::Sending(archive);
        assert_eq!(data.seek(SeekFrom::End(0)).await.unwrap(), len);
        data.seek(SeekFrom::Start(0)).await.unwrap();
        let mut whole = Vec::new();
        data.read_to_end(&mut whole).await.unwrap();
        assert_eq!(whole.len() as u64, len);
        assert!(whole.starts_with(MAGIC));
        assert!(whole.windows(5).any(|w| w == b"hello"));
        assert!(!whole.windows(6).any(|w| w == b"hello "), "only the snapshot's bytes of a file");
        // From the middle, in small reads, as openraft sends chunks.
        data.seek(SeekFrom::Start(20)).await.unwrap();
        let mut tail = Vec::new();
        let mut chunk = [0u8; 3];
        loop {
            let read = data.read(&mut chunk).await.unwrap();
            if read == 0 {
                break;
            }
            tail.extend_from_slice(&chunk[..read]);
        }
        assert_eq!(tail, whole[20..]);

        let out = dir.path().join("archive");
        fs::write(&out, &whole).unwrap();
        let into = dir.path().join("into");
        assert_eq!(unpack(&out, &into).unwrap(), 15);
        assert_eq!(fs::read(into.join("t/0/a")).unwrap(), b"hello");
        assert_eq!(fs::read(into.join("t/1/b")).unwrap(), b"0123456789");
    }

    #[test]
    fn paths_that_leave_the_root_are_refused() {
        for path in ["", "/etc/passwd", "a/../../b", "a//b", "./a", "a/.", "a\0b"] {
            assert!(!valid_path(path), "{path:?}");
        }
        assert!(valid_path("orders/0/00000000000000000000.log"));
        let dir = tempfile::tempdir().unwrap();
        let source = file(dir.path(), "x", b"x");
        assert!(Archive::new(vec![SnapshotFile { path: "../x".into(), source, bytes: 1 }], None).is_err());
    }

    #[test]
    fn damaged_archives_are_refused_and_unpack_nothing_outside() {
        let dir = tempfile::tempdir().unwrap();
        let mut good = MAGIC.to_vec();
        good.extend_from_slice(&3u16.to_le_bytes());
        good.extend_from_slice(b"a/b");
        good.extend_from_slice(&4u64.to_le_bytes());
        good.extend_from_slice(b"data");
        good.extend_from_slice(&0u16.to_le_bytes());
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("empty", Vec::new()),
            ("other magic", b"not-a-snapshot!!".to_vec()),
            ("cut in the data", good[..good.len() - 4].to_vec()),
            ("no end", good[..good.len() - 2].to_vec()),
            ("trailing bytes", [good.clone(), vec![1]].concat()),
            ("escaping path", {
                let mut bad = MAGIC.to_vec();
                bad.extend_from_slice(&5u16.to_le_bytes());
                bad.extend_from_slice(b"../ab");
                bad.extend_from_slice(&0u64.to_le_bytes());
                bad.extend_from_slice(&0u16.to_le_bytes());
                bad
            }),
            ("a length past the end", {
                let mut bad = MAGIC.to_vec();
                bad.extend_from_slice(&1u16.to_le_bytes());
                bad.extend_from_slice(b"a");
                bad.extend_from_slice(&u64::MAX.to_le_bytes());
                bad
            }),
        ];
        for (name, bytes) in cases {
            let archive = file(dir.path(), "archive", &bytes);
            let into = dir.path().join(format!("into-{}", name.replace(' ', "-")));
            assert!(unpack(&archive, &into).is_err(), "{name}");
            assert!(fs::metadata(dir.path().join("ab")).is_err(), "{name}");
        }
        let archive = file(dir.path(), "archive", &good);
        assert_eq!(unpack(&archive, &dir.path().join("ok")).unwrap(), 4);
    }

    #[test]
    fn an_install_replaces_the_root_but_what_the_node_keeps_and_can_be_repeated() {
        let dir = tempfile::tempdir().unwrap();
        let node = dir.path().join("cluster");
        let root = dir.path().join("log");
        fs::create_dir_all(root.join("orders/0")).unwrap();
        fs::write(root.join("orders/0/old.log"), b"old").unwrap();
        fs::create_dir_all(root.join("dropped/0")).unwrap();
        fs::create_dir_all(root.join("__mine/0")).unwrap();
        fs::write(root.join("__mine/0/s.log"), b"mine").unwrap();
        // The archive a leader sends.
        let source = file(dir.path(), "new.log", b"new records");
        let mut archive =
            Archive::new(vec![SnapshotFile { path: "orders/0/new.log".into(), source, bytes: 11 }], None).unwrap();
        let mut bytes = vec![0u8; archive.len() as usize];
        let mut at = 0;
        while at < bytes.len() {
            at += archive.read_here(&mut bytes[at..]).unwrap();
        }
        fs::create_dir_all(node.join(SNAPSHOT_DIR)).unwrap();
        let received = receiving_file(&node).unwrap();
        fs::write(&received, &bytes).unwrap();
        let last = LogId::new(openraft::CommittedLeaderId::new(3, 1), 42);
        let pending = Pending { last: Some(last), membership: StoredMembership::default() };
        make_pending(&node, &received, &pending).unwrap();

        let keep = |name: &str| name.starts_with("__mine");
        assert_eq!(install_pending(&node, &root, keep).unwrap(), Some(42));
        assert_eq!(fs::read(root.join("orders/0/new.log")).unwrap(), b"new records");
        assert!(fs::metadata(root.join("orders/0/old.log")).is_err());
        assert!(fs::metadata(root.join("dropped")).is_err());
        assert_eq!(fs::read(root.join("__mine/0/s.log")).unwrap(), b"mine");
        assert_eq!(crate::machine::read_applied(&node).unwrap().0, Some(last));
        // Nothing pending any more; what a crash at the end of an install would leave (the
        // archive, its unpacked copy, the old state) goes, and the state stays.
        let snapshots = node.join(SNAPSHOT_DIR);
        fs::write(snapshots.join(ARCHIVE), b"left").unwrap();
        fs::write(snapshots.join(UNPACKED), b"").unwrap();
        fs::create_dir_all(snapshots.join(OLD).join("orders")).unwrap();
        assert_eq!(install_pending(&node, &root, keep).unwrap(), None);
        for left in [ARCHIVE, UNPACKED, OLD] {
            assert!(fs::metadata(snapshots.join(left)).is_err(), "{left}");
        }
        assert_eq!(fs::read(root.join("orders/0/new.log")).unwrap(), b"new records");

        // A crash after the swap, before the record: the next start finishes alike.
        let source = file(dir.path(), "newer.log", b"newer");
        let archive =
            Archive::new(vec![SnapshotFile { path: "orders/0/newer.log".into(), source, bytes: 5 }], None).unwrap();
        let mut data = SnapshotData::Sending(archive);
        let mut bytes = Vec::new();
        futures_read_all(&mut data, &mut bytes);
        let received = receiving_file(&node).unwrap();
        fs::write(&received, &bytes).unwrap();
        let last = LogId::new(openraft::CommittedLeaderId::new(4, 1), 50);
        make_pending(&node, &received, &Pending { last: Some(last), membership: StoredMembership::default() }).unwrap();
        unpack(&snapshots.join(ARCHIVE), &snapshots.join(INSTALL)).unwrap();
        write_atomically(&snapshots, UNPACKED, b"").unwrap();
        fs::rename(root.join("__mine"), snapshots.join(INSTALL).join("__mine")).unwrap();
        rename_durably(&root, &snapshots.join(OLD)).unwrap();
        assert_eq!(install_pending(&node, &root, keep).unwrap(), Some(50));
        assert_eq!(fs::read(root.join("orders/0/newer.log")).unwrap(), b"newer");
        assert_eq!(fs::read(root.join("__mine/0/s.log")).unwrap(), b"mine");
        assert_eq!(crate::machine::read_applied(&node).unwrap().0, Some(last));
    }

    fn futures_read_all(data: &mut SnapshotData, into: &mut Vec<u8>) {
        let SnapshotData::Sending(archive) = data else { panic!("an archive") };
        let mut buf = [0u8; 7];
        loop {
            let read = archive.read_here(&mut buf).unwrap();
            if read == 0 {
                break;
            }
            into.extend_from_slice(&buf[..read]);
        }
    }
}

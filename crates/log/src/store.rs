//! The log as a whole: a directory of topics, each a directory of numbered partitions, plus a
//! maintenance thread that applies retention and compaction, and the data-directory lock.
//!
//! ```text
//! {dir}/{topic}/{partition}/partition.conf
//! {dir}/{topic}/{partition}/{base_offset:020}.log | .index | .timeindex
//! ```

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::config::PartitionConfig;
use crate::error::{OpenError, io_at};
use crate::file::{FileStorage, Storage};
use crate::journal::{JOURNAL_DIR, Journal, JournalOptions, JournalReplay};
use crate::partition::{CONFIG_FILE, Partition, PartitionOptions, RecoveryReport};
use crate::recovery::RecoveryPolicy;
use crate::segment::sync_dir;

/// Longest topic name: Kafka's 249. Names become directory names, within the 255 bytes a file
/// name may have.
pub const TOPIC_NAME_BYTES_MAX: usize = 249;

/// Checks that `name` is a usable topic name: 1–249 characters of `A-Z a-z 0-9 . _ -`,
/// not `.` or `..`.
pub fn validate_topic_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > TOPIC_NAME_BYTES_MAX {
        return Err(format!("a name must be 1 to {TOPIC_NAME_BYTES_MAX} characters long"));
    }
    if name == "." || name == ".." {
        return Err("a name cannot be \".\" or \"..\"".into());
    }
    if let Some(bad) = name.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))) {
        return Err(format!("{bad:?} is not allowed in a name: use letters, digits, '.', '_' and '-'"));
    }
    Ok(())
}

type PartitionMap = BTreeMap<(String, u32), Arc<Partition>>;

/// Where a dropped topic's directory goes while its files are deleted: `+` is not allowed in
/// a topic name, so nothing in it is ever opened as a topic.
const DROPPING_DIR: &str = "+dropping";

fn remove_if_there(path: &Path) -> Result<(), OpenError> {
    match fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(io_at(path)(error)),
    }
}

/// Deletes what drops a crash interrupted: the directories [`Log::remove_topic`] had moved
/// aside and not yet deleted. Their topics were dropped before the move.
fn finish_drops(dir: &Path) -> Result<(), OpenError> {
    let dropping = dir.join(DROPPING_DIR);
    if fs::metadata(&dropping).is_err() {
        return Ok(());
    }
    tracing::info!(path = %dropping.display(), "finishing the removal of dropped topics a crash interrupted");
    remove_if_there(&dropping)?;
    sync_dir(dir).map_err(io_at(dir))
}

/// The partition directories under the log directory `dir`, as (topic, partition, path), in
/// order: each `{topic}/{partition}` that holds a `partition.conf`.
pub fn partition_dirs(dir: &Path) -> std::io::Result<Vec<(String, u32, PathBuf)>> {
    let mut found = Vec::new();
    for topic in fs::read_dir(dir)? {
        let topic = topic?;
        let name = topic.file_name().to_string_lossy().into_owned();
        if !topic.path().is_dir() || validate_topic_name(&name).is_err() {
            continue;
        }
        for partition in fs::read_dir(topic.path())? {
            let partition = partition?;
            let Ok(index) = partition.file_name().to_string_lossy().parse::<u32>() else { continue };
            if partition.path().join(CONFIG_FILE).exists() {
                found.push((name.clone(), index, partition.path()));
            }
        }
    }
    found.sort();
    Ok(found)
}

/// Settings of the log as a whole.
#[derive(Clone, Debug)]
pub struct LogOptions {
    /// How often retention and compaction run over every partition.
    pub maintenance_interval: Duration,
    /// The file layer under every segment.
    pub storage: Arc<dyn Storage>,
    /// What opening a partition may do with damaged bytes, for every topic not in
    /// `topic_recovery`.
    pub recovery: RecoveryPolicy,
    /// Topics that recover by a policy of their own (the catalog never has its tail cut).
    pub topic_recovery: BTreeMap<String, RecoveryPolicy>,
    /// One shared journal for every partition's batches (`journal.rs`): an `fsync` append
    /// waits for one sync of the journal, shared by every partition, instead of its segment's.
    pub journal: Option<JournalOptions>,
}

impl Default for LogOptions {
    fn default() -> Self {
        LogOptions {
            maintenance_interval: Duration::from_secs(30),
            storage: Arc::new(FileStorage),
            recovery: RecoveryPolicy::default(),
            topic_recovery: BTreeMap::new(),
            journal: None,
        }
    }
}

impl LogOptions {
    /// How partitions of `topic` are opened.
    fn partition_options(&self, topic: &str) -> PartitionOptions {
        let recovery = self.topic_recovery.get(topic).unwrap_or(&self.recovery).clone();
        PartitionOptions { storage: self.storage.clone(), recovery }
    }
}

pub struct Log {
    dir: PathBuf,
    options: LogOptions,
    partitions: Arc<RwLock<PartitionMap>>,
    /// Set to stop the maintenance thread; the condvar wakes it early.
    stop: Arc<(Mutex<bool>, Condvar)>,
    maintenance: Mutex<Option<JoinHandle<()>>>,
    journal: Option<Journal>,
    /// What replaying the journal did when the log opened.
    journal_replay: Option<JournalReplay>,
}

/// One partition found and recovered by [`Log::open`].
#[derive(Clone, Debug)]
pub struct OpenedPartition {
    pub topic: String,
    pub partition: u32,
    pub recovery: RecoveryReport,
}

impl Log {
    /// Opens (creating if needed) the log in `dir` and recovers every partition in it.
    pub fn open(dir: impl AsRef<Path>, options: LogOptions) -> Result<(Log, Vec<OpenedPartition>), OpenError> {
        let dir = dir.as_ref().to_path_buf();
        fs::create_dir_all(&dir).map_err(io_at(&dir))?;
        finish_drops(&dir)?;
        // The journal is replayed before any partition opens: a segment missing a journalled
        // batch gets it back before recovery reads the segment.
        let (journal, journal_replay) = match &options.journal {
            Some(journal_options) => {
                let (journal, replay) = Journal::open(&dir, options.storage.clone(), journal_options.clone())?;
                if replay.records > 0 {
                    tracing::info!(
                        files = replay.files,
                        records = replay.records,
                        restored = replay.restored,
                        skipped = replay.skipped,
                        "replayed the log's journal"
                    );
                }
                (Some(journal), Some(replay))
            }
            // It ran with a journal before: what only the journal holds goes into the segments.
            None => (None, crate::journal::replay_leftover(&dir, &*options.storage)?),
        };
        let found = partition_dirs(&dir).map_err(io_at(&dir))?;
        let mut partitions = BTreeMap::new();
        let mut opened = Vec::new();
        let total = found.len();
        for (i, (topic, index, path)) in found.into_iter().enumerate() {
            let (partition, recovery) =
                Partition::open_existing_with_options(&path, &options.partition_options(&topic))?;
            if let Some(journal) = &journal {
                partition.use_journal(journal.clone(), &topic, index);
            }
            tracing::info!(
                topic = %topic, partition = index, progress = %format!("{}/{}", i + 1, total),
                segments = recovery.segments, end_offset = partition.end_offset(),
                truncated_bytes = recovery.truncated_bytes, "opened partition"
            );
            partitions.insert((topic.clone(), index), Arc::new(partition));
            opened.push(OpenedPartition { topic, partition: index, recovery });
        }
        let partitions = Arc::new(RwLock::new(partitions));
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let maintenance = {
            let (partitions, stop) = (partitions.clone(), stop.clone());
            let interval = options.maintenance_interval;
            std::thread::Builder::new()
                .name("log-maintenance".into())
                .spawn(move || run_maintenance(partitions, stop, interval))
                .map_err(io_at(&dir))?
        };
        let log =
            Log { dir, options, partitions, stop, maintenance: Mutex::new(Some(maintenance)), journal, journal_replay };
        Ok((log, opened))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// What replaying the journal did when the log opened; `None` when there was none.
    pub fn journal_replay(&self) -> Option<&JournalReplay> {
        self.journal_replay.as_ref()
    }

    /// Opens partition `index` of `topic`, creating it with `config` if it does not exist. An
    /// already-open partition is returned as it is.
    pub fn open_partition(
        &self,
        topic: &str,
        index: u32,
        config: PartitionConfig,
    ) -> Result<Arc<Partition>, OpenError> {
        let path = self.dir.join(topic).join(index.to_string());
        validate_topic_name(topic).map_err(|reason| OpenError::BadConfig { path: path.clone(), reason })?;
        let mut partitions = self.partitions.write().expect("partitions lock");
        if let Some(partition) = partitions.get(&(topic.to_string(), index)) {
            return Ok(partition.clone());
        }
        let (partition, _) = Partition::open_with_options(&path, config, &self.options.partition_options(topic))?;
        if let Some(journal) = &self.journal {
            partition.use_journal(journal.clone(), topic, index);
        }
        let partition = Arc::new(partition);
        partitions.insert((topic.to_string(), index), partition.clone());
        Ok(partition)
    }

    pub fn partition(&self, topic: &str, index: u32) -> Option<Arc<Partition>> {
        self.partitions.read().expect("partitions lock").get(&(topic.to_string(), index)).cloned()
    }

    /// Every open partition, in (topic, index) order.
    pub fn partitions(&self) -> Vec<(String, u32, Arc<Partition>)> {
        let partitions = self.partitions.read().expect("partitions lock");
        partitions.iter().map(|((topic, index), partition)| (topic.clone(), *index, partition.clone())).collect()
    }

    /// Names of the topics with at least one open partition.
    pub fn topics(&self) -> Vec<String> {
        let partitions = self.partitions.read().expect("partitions lock");
        let mut topics: Vec<String> = partitions.keys().map(|(topic, _)| topic.clone()).collect();
        topics.dedup();
        topics
    }

    /// Closes every partition of `topic` and deletes its directory. Appends still queued are
    /// written first; later appends and reads of those partitions fail with `Closed`.
    pub fn remove_topic(&self, topic: &str) -> Result<(), OpenError> {
        validate_topic_name(topic).map_err(|reason| OpenError::BadConfig { path: self.dir.join(topic), reason })?;
        let removed: Vec<Arc<Partition>> = {
            let mut partitions = self.partitions.write().expect("partitions lock");
            let keys: Vec<(String, u32)> = partitions.keys().filter(|(name, _)| name == topic).cloned().collect();
            keys.iter().filter_map(|key| partitions.remove(key)).collect()
        };
        for partition in &removed {
            partition.close();
        }
        // Closed, the partitions' segments are synced; the journal's records of them must not
        // come back into a topic made again under this name.
        if let Some(journal) = &self.journal {
            journal
                .forget(topic)
                .map_err(|reason| io_at(&self.dir.join(JOURNAL_DIR))(std::io::Error::other(reason)))?;
        }
        // The directory leaves the topics' namespace in one rename before anything in it is
        // deleted: a crash while its files go one by one must not leave a partition that lists
        // segments that are gone (the next open would refuse it as missing records). The next
        // open finishes what a crash interrupted.
        let path = self.dir.join(topic);
        let aside = self.dir.join(DROPPING_DIR);
        let dropping = aside.join(topic);
        if fs::metadata(&path).is_ok() {
            fs::create_dir_all(&aside).map_err(io_at(&aside))?;
            remove_if_there(&dropping)?;
            fs::rename(&path, &dropping).map_err(io_at(&path))?;
            sync_dir(&self.dir).map_err(io_at(&self.dir))?;
        }
        remove_if_there(&dropping)?;
        // The removal itself must survive a crash, or the topic could come back.
        sync_dir(&self.dir).map_err(io_at(&self.dir))?;
        Ok(())
    }

    /// Stops maintenance, then closes every partition: queued appends are written and synced,
    /// and each active segment's index is written. Idempotent.
    pub fn close(&self) {
        {
            let (stopped, wake) = &*self.stop;
            *stopped.lock().expect("stop lock") = true;
            wake.notify_all();
        }
        if let Some(handle) = self.maintenance.lock().expect("maintenance handle lock").take() {
            let _ = handle.join();
        }
        for (_, _, partition) in self.partitions() {
            partition.close();
        }
        if let Some(journal) = &self.journal {
            journal.close();
        }
    }
}

impl Drop for Log {
    fn drop(&mut self) {
        self.close();
    }
}

fn run_maintenance(partitions: Arc<RwLock<PartitionMap>>, stop: Arc<(Mutex<bool>, Condvar)>, interval: Duration) {
    let (stopped, wake) = &*stop;
    loop {
        {
            let guard = stopped.lock().expect("stop lock");
            let (guard, _) = wake.wait_timeout_while(guard, interval, |stopped| !*stopped).expect("stop lock");
            if *guard {
                return;
            }
        }
        let snapshot: Vec<_> = partitions.read().expect("partitions lock").values().cloned().collect();
        for partition in snapshot {
            if let Err(error) = partition.maintain() {
                tracing::error!(partition = %partition.dir().display(), %error, "log maintenance failed");
            }
        }
    }
}

/// An exclusive lock on a data directory, held for the life of the process: a second process
/// opening the same directory is refused instead of corrupting it.
pub struct DirLock {
    _file: File,
    path: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error(
        "data directory {dir} is in use by another onehop process{holder}; stop that process or choose \
         another --data-dir"
    )]
    Busy { dir: PathBuf, holder: String },
    #[error("cannot lock data directory {dir}: {source}")]
    Io { dir: PathBuf, source: std::io::Error },
}

impl DirLock {
    /// Takes the lock file `{dir}/LOCK` (creating `dir`), writing this process's id into it.
    pub fn acquire(dir: impl AsRef<Path>) -> Result<DirLock, LockError> {
        let dir = dir.as_ref();
        let io = |source| LockError::Io { dir: dir.to_path_buf(), source };
        fs::create_dir_all(dir).map_err(io)?;
        let path = dir.join("LOCK");
        let mut file =
            OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path).map_err(io)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = holder.trim();
                let holder = if holder.is_empty() { String::new() } else { format!(" (pid {holder})") };
                return Err(LockError::Busy { dir: dir.to_path_buf(), holder });
            }
            Err(std::fs::TryLockError::Error(error)) => return Err(io(error)),
        }
        file.set_len(0).map_err(io)?;
        file.write_all(format!("{}\n", std::process::id()).as_bytes()).map_err(io)?;
        Ok(DirLock { _file: file, path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

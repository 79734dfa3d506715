//! A fault-injecting file layer for the log: real files underneath, plus a model of what the
//! disk has made durable, so a test can fail a write or a sync, let the disk corrupt a write
//! silently, or cut the power.
//!
//! The model: each segment file's **durable image** is its content at its last successful
//! sync (or when it was opened). Writes and length changes since then are **pending**. A power
//! cut ([`SimulatedDisk::power_cut`]) freezes the disk (every later operation fails, as the
//! process would be gone) and rewrites each file as its durable image plus a random part of
//! its pending writes: each 512-byte sector of each pending write reaches the disk or not,
//! independently, which is what a disk with a volatile cache and a kernel writing pages back in
//! any order may do. A process crash without a power cut is a power cut that keeps everything
//! (`keep_probability` 1).

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use onehop_log::{SegmentFile, Storage};

/// The unit a power cut keeps or loses.
pub const SECTOR_BYTES: u64 = 512;

#[derive(Debug)]
enum Pending {
    Write { position: u64, bytes: Vec<u8> },
    SetLen(u64),
}

#[derive(Debug, Default)]
struct Tracked {
    durable: Vec<u8>,
    pending: Vec<Pending>,
}

/// Faults armed for a coming operation; each fires once.
#[derive(Debug, Default)]
struct Faults {
    /// Fail the n-th sync from now (1 = the next).
    fail_sync_in: Option<usize>,
    /// Fail the n-th batch write from now, after writing its first `.1` bytes.
    fail_batch_write_in: Option<(usize, usize)>,
    /// Flip a byte of the n-th batch write from now, and report success.
    corrupt_batch_write_in: Option<usize>,
}

#[derive(Debug, Default)]
struct State {
    files: HashMap<PathBuf, Tracked>,
    /// How long a sync takes: while it runs, the writer goes on writing, as on a real disk.
    sync_latency: Duration,
    frozen: bool,
    faults: Faults,
    /// Where corrupted writes went: (file, position of the batch).
    corrupted: Vec<(PathBuf, u64)>,
}

/// The fault-injecting [`Storage`]. Clones share one disk.
#[derive(Clone, Debug, Default)]
pub struct SimulatedDisk {
    state: Arc<Mutex<State>>,
}

fn frozen_error() -> io::Error {
    io::Error::other("the simulated disk lost power")
}

/// Counts down an armed fault; true when it fires now.
fn fires(countdown: &mut Option<usize>) -> bool {
    match countdown {
        Some(1) => {
            *countdown = None;
            true
        }
        Some(n) => {
            *n -= 1;
            false
        }
        None => false,
    }
}

impl SimulatedDisk {
    pub fn new() -> Self {
        Self::default()
    }

    /// A disk whose syncs take `latency` (the writes they cover are those made before they end).
    pub fn with_sync_latency(latency: Duration) -> Self {
        let disk = Self::default();
        disk.state.lock().unwrap().sync_latency = latency;
        disk
    }

    /// The n-th sync from now (1 = the next) fails with an I/O error.
    pub fn fail_sync_in(&self, n: usize) {
        self.state.lock().unwrap().faults.fail_sync_in = Some(n);
    }

    /// The n-th batch write from now writes only its first `written` bytes, then fails.
    pub fn fail_batch_write_in(&self, n: usize, written: usize) {
        self.state.lock().unwrap().faults.fail_batch_write_in = Some((n, written));
    }

    /// The n-th batch write from now reaches the disk with one byte changed, and succeeds:
    /// a disk that corrupts what it stores.
    pub fn corrupt_batch_write_in(&self, n: usize) {
        self.state.lock().unwrap().faults.corrupt_batch_write_in = Some(n);
    }

    /// Where the corrupted writes went: (segment file, byte position of the batch).
    pub fn corrupted(&self) -> Vec<(PathBuf, u64)> {
        self.state.lock().unwrap().corrupted.clone()
    }

    /// Waits a random time in `wait_ms`, then cuts the power with a random generator seeded
    /// from `rng`: the power cut of a seeded test.
    pub fn power_cut_soon(&self, rng: &mut rand::rngs::StdRng, wait_ms: std::ops::Range<u64>, keep_probability: f64) {
        use rand::{Rng, SeedableRng};
        std::thread::sleep(Duration::from_millis(rng.random_range(wait_ms)));
        let mut cut_rng = rand::rngs::StdRng::seed_from_u64(rng.random());
        self.power_cut(keep_probability, || cut_rng.random());
    }

    /// Cuts the power: from now on every operation fails, and every file becomes its durable
    /// image plus each sector of each pending write with probability `keep_probability`
    /// (decided by `random`, which returns values in `[0, 1)`). Pending length changes are
    /// kept with the same probability.
    pub fn power_cut(&self, keep_probability: f64, mut random: impl FnMut() -> f64) {
        let mut state = self.state.lock().unwrap();
        state.frozen = true;
        for (path, tracked) in &state.files {
            let mut image = tracked.durable.clone();
            for pending in &tracked.pending {
                match pending {
                    Pending::SetLen(len) => {
                        if random() < keep_probability {
                            image.resize(*len as usize, 0);
                        }
                    }
                    Pending::Write { position, bytes } => {
                        let end = position + bytes.len() as u64;
                        let mut at = *position;
                        while at < end {
                            let sector_end = ((at / SECTOR_BYTES) + 1) * SECTOR_BYTES;
                            let piece_end = sector_end.min(end);
                            if random() < keep_probability {
                                if image.len() < piece_end as usize {
                                    image.resize(piece_end as usize, 0);
                                }
                                let from = (at - position) as usize;
                                let to = (piece_end - position) as usize;
                                image[at as usize..piece_end as usize].copy_from_slice(&bytes[from..to]);
                            }
                            at = piece_end;
                        }
                    }
                }
            }
            // A file deleted since (retention, compaction) stays deleted.
            if path.exists() {
                std::fs::write(path, &image).expect("write the image a power cut left");
            }
        }
    }
}

impl Storage for SimulatedDisk {
    fn open(&self, path: &Path, create_new: bool) -> io::Result<Box<dyn SegmentFile>> {
        let mut state = self.state.lock().unwrap();
        if state.frozen {
            return Err(frozen_error());
        }
        let file = OpenOptions::new().read(true).write(true).create_new(create_new).open(path)?;
        // What a file holds when it is opened is what the disk holds: durable.
        let durable = std::fs::read(path)?;
        state.files.insert(path.to_path_buf(), Tracked { durable, pending: Vec::new() });
        Ok(Box::new(SimulatedFile { path: path.to_path_buf(), file, state: self.state.clone() }))
    }
}

#[derive(Debug)]
struct SimulatedFile {
    path: PathBuf,
    file: File,
    state: Arc<Mutex<State>>,
}

impl SimulatedFile {
    fn sync(&self) -> io::Result<()> {
        let latency = self.state.lock().unwrap().sync_latency;
        std::thread::sleep(latency);
        let mut state = self.state.lock().unwrap();
        if state.frozen {
            return Err(frozen_error());
        }
        if fires(&mut state.faults.fail_sync_in) {
            return Err(io::Error::other("simulated fsync failure"));
        }
        let content = std::fs::read(&self.path)?;
        let tracked = state.files.entry(self.path.clone()).or_default();
        tracked.durable = content;
        tracked.pending.clear();
        Ok(())
    }
}

impl SegmentFile for SimulatedFile {
    fn read_exact_at(&self, buffer: &mut [u8], position: u64) -> io::Result<()> {
        FileExt::read_exact_at(&self.file, buffer, position)
    }

    fn write_all_at(&self, bytes: &[u8], position: u64) -> io::Result<()> {
        let mut state = self.state.lock().unwrap();
        if state.frozen {
            return Err(frozen_error());
        }
        let is_batch = bytes.starts_with(b"OHB1");
        let mut written = bytes.to_vec();
        if is_batch {
            let failing = match &mut state.faults.fail_batch_write_in {
                Some((1, prefix)) => Some(*prefix),
                Some((n, _)) => {
                    *n -= 1;
                    None
                }
                None => None,
            };
            if let Some(prefix) = failing {
                state.faults.fail_batch_write_in = None;
                let prefix = prefix.min(bytes.len());
                FileExt::write_all_at(&self.file, &bytes[..prefix], position)?;
                let tracked = state.files.entry(self.path.clone()).or_default();
                tracked.pending.push(Pending::Write { position, bytes: bytes[..prefix].to_vec() });
                return Err(io::Error::other("simulated write failure"));
            }
            if fires(&mut state.faults.corrupt_batch_write_in) {
                // A byte in the records, past the header: the CRC no longer matches.
                let at = (written.len() - 1).min(60);
                written[at] ^= 0x5A;
                state.corrupted.push((self.path.clone(), position));
            }
        }
        FileExt::write_all_at(&self.file, &written, position)?;
        let tracked = state.files.entry(self.path.clone()).or_default();
        tracked.pending.push(Pending::Write { position, bytes: written });
        Ok(())
    }

    fn size(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut state = self.state.lock().unwrap();
        if state.frozen {
            return Err(frozen_error());
        }
        self.file.set_len(len)?;
        state.files.entry(self.path.clone()).or_default().pending.push(Pending::SetLen(len));
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        self.sync()
    }

    fn sync_all(&self) -> io::Result<()> {
        self.sync()
    }
}

//! What opening a segment does with bytes that are not valid batches.
//!
//! A scan stops at the first bad batch. What comes after it decides what the bad bytes are:
//!
//! - **Zeros to the end of the file**: the zero-filled runway of the active segment. Cut, and
//!   not counted as damage.
//! - **Nothing valid to the end of the file** (in the last segment): a **torn tail**, the last
//!   write cut short by a crash. Every acknowledged `fsync` append was synced before it, so the
//!   batch was never acknowledged, and cutting it is right — unless the partition's policy says
//!   its tail must never be cut ([`RecoveryPolicy::cut_torn_tail`], false for the catalog).
//! - **A valid, checksummed batch further on** (at or past the offsets the damaged batch could
//!   have held): **damage**, not a crash. A crash tears only what was written last, so the
//!   batches after the bad one were written after it and may have been acknowledged: cutting
//!   from the bad batch would lose them and give their offsets out again. Opening refuses, and
//!   names the file, the bytes and the offsets.
//!
//! With [`RecoveryPolicy::discard_damaged`], damage is set aside instead of refused: the
//! segment is rewritten with every valid batch it holds and without the damaged bytes (whose
//! offsets stay unused: a gap), after a copy of the original file is kept beside it as
//! `{base_offset:020}.log.damaged-{unix_ms}`. Nothing the disk still holds is deleted.

use std::borrow::Cow;
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::error::{Damaged, DamagedTail, OpenError};
use crate::file::SegmentFile;
use crate::format::{BATCH_HEADER_BYTES, BATCH_MAGIC, BatchHeader, decode_records};
use crate::segment::{SCAN_CHUNK_BYTES, ScanStop, read_batch_at, scan, sync_dir};

/// What opening a partition may do with bytes it cannot read as valid batches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecoveryPolicy {
    /// Cut a torn tail: a last segment ending in bytes that are not a valid batch, with nothing
    /// valid after them. After a crash that is the write in progress, never acknowledged, so
    /// this is true for data. A topic whose loss of even an unacknowledged record would drive
    /// wrong decisions (the catalog: a definition cut away would make its stream look dropped)
    /// sets it false and is refused instead, unless `discard_damaged` is set.
    pub cut_torn_tail: bool,
    /// Set damaged bytes aside instead of refusing to open: in any segment, valid batches
    /// after the damage are kept and the damaged bytes dropped (a copy of the file is kept).
    pub discard_damaged: bool,
    /// What a refusal tells the operator to do to go on (in the operator's terms: a flag or a
    /// setting), after the facts of the damage.
    pub remedy: Cow<'static, str>,
}

impl Default for RecoveryPolicy {
    fn default() -> Self {
        RecoveryPolicy {
            cut_torn_tail: true,
            discard_damaged: false,
            remedy: Cow::Borrowed(
                "restore the partition from a replica or backup, or open it with discard_damaged to set the damaged \
                 bytes aside and keep every valid batch (a copy of the file is kept)",
            ),
        }
    }
}

/// Damaged bytes that [`RecoveryPolicy::discard_damaged`] set aside.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Discarded {
    /// The segment file, and the copy of it as it was before.
    pub segment: PathBuf,
    pub copy: PathBuf,
    /// The byte ranges `[start, end)` of the original file that were dropped.
    pub ranges: Vec<(u64, u64)>,
    /// The offsets `[first, next)` the dropped bytes could have held. `next` is `None` when
    /// nothing valid follows them in the segment.
    pub offsets: Vec<(u64, Option<u64>)>,
}

/// The bytes from a bad batch on, as the scan found them.
pub(crate) enum Damage {
    /// Only zeros: the runway.
    Zeros,
    /// Something that is not a batch up to the end of the file, and nothing valid in it.
    Tail {
        /// The end of the last non-zero byte.
        damaged_end: u64,
    },
    /// A valid batch starts at `resume_at`, holding offsets from `resume_offset`.
    Middle {
        resume_at: u64,
        resume_offset: u64,
        /// The damaged bytes hold a whole aligned sector of zeros: what a power cut leaves of
        /// writes the disk never got to (the runway under them was zeros). Damage at rest (a
        /// flipped bit, a bad block read back as garbage) rarely looks like that.
        zero_sector: bool,
    },
}

/// The unit a disk writes whole; a power cut keeps or loses each one.
const SECTOR_BYTES: u64 = 512;

/// Whether `[from, to)` of `file` contains a whole `SECTOR_BYTES`-aligned sector of zeros.
fn holds_zero_sector(file: &dyn SegmentFile, from: u64, to: u64) -> io::Result<bool> {
    let mut sector = from.next_multiple_of(SECTOR_BYTES);
    let mut buffer = [0u8; SECTOR_BYTES as usize];
    while sector + SECTOR_BYTES <= to {
        file.read_exact_at(&mut buffer, sector)?;
        if buffer.iter().all(|&byte| byte == 0) {
            return Ok(true);
        }
        sector += SECTOR_BYTES;
    }
    Ok(false)
}

/// Looks at what follows the bad batch at `position` (of a file of `file_bytes`), whose
/// records would have started at offset `first_offset`.
pub(crate) fn assess(file: &dyn SegmentFile, position: u64, file_bytes: u64, first_offset: u64) -> io::Result<Damage> {
    if let Some((resume_at, header)) = find_valid_batch(file, position + 1, file_bytes, first_offset)? {
        let zero_sector = holds_zero_sector(file, position, resume_at)?;
        return Ok(Damage::Middle { resume_at, resume_offset: header.base_offset, zero_sector });
    }
    let damaged_end = last_nonzero_end(file, position, file_bytes)?;
    Ok(if damaged_end > position { Damage::Tail { damaged_end } } else { Damage::Zeros })
}

/// The first position at or after `from` where a whole, valid batch starts (magic, header,
/// length within the file, CRC, records) whose offsets are not below `min_offset`.
///
/// Batches are not aligned, so every occurrence of the magic is a candidate; a candidate that
/// is not a valid batch (the magic inside some value) is passed over.
pub(crate) fn find_valid_batch(
    file: &dyn SegmentFile,
    from: u64,
    end: u64,
    min_offset: u64,
) -> io::Result<Option<(u64, BatchHeader)>> {
    let magic = BATCH_MAGIC.to_le_bytes();
    let mut buffer = vec![0u8; SCAN_CHUNK_BYTES];
    let mut chunk_start = from;
    while chunk_start + BATCH_HEADER_BYTES as u64 <= end {
        let len = ((end - chunk_start) as usize).min(SCAN_CHUNK_BYTES);
        file.read_exact_at(&mut buffer[..len], chunk_start)?;
        for at in 0..len.saturating_sub(magic.len() - 1) {
            if buffer[at..at + magic.len()] != magic {
                continue;
            }
            let candidate = chunk_start + at as u64;
            if let Some(header) = valid_batch_at(file, candidate, end, min_offset)? {
                return Ok(Some((candidate, header)));
            }
        }
        if len < SCAN_CHUNK_BYTES {
            break;
        }
        // Chunks overlap by the magic's length less one, so a magic across a boundary is seen.
        chunk_start += (len - (magic.len() - 1)) as u64;
    }
    Ok(None)
}

/// The header of the batch at `position` if it is whole and valid and starts at or past
/// `min_offset`.
fn valid_batch_at(file: &dyn SegmentFile, position: u64, end: u64, min_offset: u64) -> io::Result<Option<BatchHeader>> {
    match read_batch_at(file, position, end) {
        Ok(Some((header, batch))) => {
            let valid = header.base_offset >= min_offset && decode_records(&header, &batch).is_ok();
            Ok(valid.then_some(header))
        }
        Ok(None) | Err(ScanStop::Bad { .. } | ScanStop::Newer { .. }) => Ok(None),
        Err(ScanStop::Io(error)) => Err(error),
    }
}

/// The end of the last non-zero byte in `[from, end)` of `file`, or `from` when all are zero.
pub(crate) fn last_nonzero_end(file: &dyn SegmentFile, from: u64, end: u64) -> io::Result<u64> {
    let mut buffer = vec![0u8; SCAN_CHUNK_BYTES];
    let mut last = from;
    let mut at = from;
    while at < end {
        let len = ((end - at) as usize).min(SCAN_CHUNK_BYTES);
        file.read_exact_at(&mut buffer[..len], at)?;
        if let Some(index) = buffer[..len].iter().rposition(|&byte| byte != 0) {
            last = at + index as u64 + 1;
        }
        at += len as u64;
    }
    Ok(last)
}

/// Said of damage that looks like writes a power cut lost.
const POWER_CUT_NOTE: &str = " The damaged bytes hold whole sectors of zeros, which is what a power cut leaves of writes \
                              the disk had not yet made durable: if this machine lost power, these records were never \
                              acknowledged, and setting them aside loses nothing that was.";

/// What to do with bad bytes found by a scan.
pub(crate) enum Decision {
    /// Cut the file at the bad batch (the runway, or a torn tail); `damaged_end` is the end of
    /// the last non-zero byte cut.
    Cut { damaged_end: u64 },
    /// Rewrite the segment without its damaged bytes ([`discard_damage`]).
    Discard,
}

/// Bad bytes a scan stopped at, and what follows them.
pub(crate) struct BadBytes<'a> {
    pub path: &'a Path,
    /// Where the first bad batch starts.
    pub position: u64,
    /// The offset its records would have started at.
    pub first_offset: u64,
    pub reason: &'a str,
    pub damage: &'a Damage,
}

impl BadBytes<'_> {
    /// Cuts, discards, or refuses (the error names the file, the bytes, the offsets and the way
    /// out), by what the bytes are, whether the segment is the last, and the policy.
    pub(crate) fn decide(&self, is_tail: bool, policy: &RecoveryPolicy) -> Result<Decision, OpenError> {
        let (path, position, first_offset) = (self.path.to_path_buf(), self.position, self.first_offset);
        let (reason, remedy) = (self.reason.to_string(), policy.remedy.to_string());
        match *self.damage {
            Damage::Zeros if is_tail => Ok(Decision::Cut { damaged_end: position }),
            Damage::Tail { damaged_end } if is_tail && policy.cut_torn_tail => Ok(Decision::Cut { damaged_end }),
            _ if policy.discard_damaged => Ok(Decision::Discard),
            Damage::Middle { resume_at, resume_offset, zero_sector } => Err(OpenError::Damaged(Box::new(Damaged {
                path,
                position,
                resume_at,
                first_offset,
                resume_offset,
                reason,
                power_cut_note: if zero_sector { POWER_CUT_NOTE.into() } else { String::new() },
                remedy,
            }))),
            Damage::Tail { damaged_end } if is_tail => Err(OpenError::DamagedTail(Box::new(DamagedTail {
                path,
                position,
                bytes: damaged_end - position,
                first_offset,
                reason,
                remedy,
            }))),
            Damage::Zeros | Damage::Tail { .. } => Err(OpenError::Corrupt { path, position, reason, remedy }),
        }
    }
}

/// Rewrites the segment at `path` with every valid batch it holds and none of its damaged
/// bytes, after keeping a copy of it as it is. The caller reopens and rescans it.
pub(crate) fn discard_damage(
    dir: &Path,
    path: &Path,
    file: &dyn SegmentFile,
    base_offset: u64,
) -> io::Result<Discarded> {
    let file_bytes = file.size()?;
    let mut kept: Vec<(u64, u64)> = Vec::new();
    let mut ranges = Vec::new();
    let mut offsets = Vec::new();
    let mut position = 0;
    let mut next_offset = base_offset;
    loop {
        let mut region_end = position;
        let scanned = scan(file, position, file_bytes, next_offset, |at, header, _| {
            region_end = at + header.batch_len as u64;
            next_offset = header.next_offset();
        });
        if region_end > position {
            kept.push((position, region_end));
        }
        let bad_at = match scanned {
            Ok(()) => break,
            Err(ScanStop::Io(error)) => return Err(error),
            Err(ScanStop::Newer { position, reason }) => {
                // Not damage: a newer onehop's batch is never set aside.
                return Err(io::Error::other(format!(
                    "byte {position} holds a batch a newer onehop wrote ({reason}): run that release"
                )));
            }
            Err(ScanStop::Bad { position, .. }) => position,
        };
        match assess(file, bad_at, file_bytes, next_offset)? {
            Damage::Zeros => break,
            Damage::Tail { damaged_end } => {
                ranges.push((bad_at, damaged_end));
                offsets.push((next_offset, None));
                break;
            }
            Damage::Middle { resume_at, resume_offset, .. } => {
                ranges.push((bad_at, resume_at));
                offsets.push((next_offset, Some(resume_offset)));
                position = resume_at;
            }
        }
    }
    let copy = keep_copy(path)?;
    let temporary = path.with_extension("repair.tmp");
    let mut repaired = File::create(&temporary)?;
    let mut buffer = vec![0u8; SCAN_CHUNK_BYTES];
    for (start, end) in kept {
        let mut at = start;
        while at < end {
            let len = ((end - at) as usize).min(SCAN_CHUNK_BYTES);
            file.read_exact_at(&mut buffer[..len], at)?;
            repaired.write_all(&buffer[..len])?;
            at += len as u64;
        }
    }
    repaired.sync_all()?;
    drop(repaired);
    // The indexes describe the old file; a crash between these steps leaves the original
    // segment (and its copy) or the repaired one, never half of either.
    crate::segment::Segment::invalidate_index(dir, base_offset)?;
    fs::rename(&temporary, path)?;
    sync_dir(dir)?;
    Ok(Discarded { segment: path.to_path_buf(), copy, ranges, offsets })
}

/// Keeps the file at `path` as it is under a new name beside it (a hard link, or a copy where
/// links are not possible), durably, and returns that name.
pub(crate) fn keep_copy(path: &Path) -> io::Result<PathBuf> {
    let now_ms = crate::partition::now_ms();
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".damaged-{now_ms}"));
    let copy = PathBuf::from(name);
    if fs::hard_link(path, &copy).is_err() {
        fs::copy(path, &copy)?;
        File::open(&copy)?.sync_all()?;
    }
    if let Some(dir) = path.parent() {
        sync_dir(dir)?;
    }
    Ok(copy)
}

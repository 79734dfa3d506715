//! The file layer under segments: what the log asks of a segment file, and the one place that
//! opens them.
//!
//! Segments reach their bytes only through [`SegmentFile`], and partitions open segment files
//! only through a [`Storage`]. [`FileStorage`] is the real one (`std::fs::File`, positioned
//! reads and writes). Tests substitute a storage that injects faults — torn writes, failed
//! syncs, writes the disk silently corrupts, a power cut that keeps only part of what was not
//! yet synced — so recovery and the poisoning of a partition after an I/O failure are tested
//! against the failures they exist for, not only against files edited after the fact.
//!
//! Index files, `partition.conf` and compaction's temporary files are written straight with
//! `std::fs`: they are caches or are replaced atomically, and recovery never trusts them over
//! the segment files.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// The operations the log performs on one segment file. Positions are byte offsets from the
/// start of the file. Implementations must be safe to call from several threads at once: the
/// write thread writes, the sync thread syncs and readers read, concurrently.
pub trait SegmentFile: Send + Sync + fmt::Debug {
    /// Fills `buffer` from `position`, or fails (`UnexpectedEof` when the file is too short).
    fn read_exact_at(&self, buffer: &mut [u8], position: u64) -> io::Result<()>;
    /// Writes all of `bytes` at `position`, growing the file when they pass its end.
    fn write_all_at(&self, bytes: &[u8], position: u64) -> io::Result<()>;
    /// The file's length in bytes.
    fn size(&self) -> io::Result<u64>;
    /// Cuts or extends (with zeros) the file to `len` bytes.
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Makes the written bytes (and the length, when it changed) durable: `fdatasync`.
    fn sync_data(&self) -> io::Result<()>;
    /// Makes the bytes and all metadata durable: `fsync`.
    fn sync_all(&self) -> io::Result<()>;
}

/// Opens segment files. One per log, shared by every partition.
pub trait Storage: Send + Sync + fmt::Debug {
    /// Opens the file at `path` for reading and writing. With `create_new`, creates it and
    /// fails if it exists; without, fails if it does not.
    fn open(&self, path: &Path, create_new: bool) -> io::Result<Box<dyn SegmentFile>>;
}

/// The real file system.
#[derive(Clone, Copy, Debug, Default)]
pub struct FileStorage;

impl Storage for FileStorage {
    fn open(&self, path: &Path, create_new: bool) -> io::Result<Box<dyn SegmentFile>> {
        let file = OpenOptions::new().read(true).write(true).create_new(create_new).open(path)?;
        Ok(Box::new(file))
    }
}

impl SegmentFile for File {
    fn read_exact_at(&self, buffer: &mut [u8], position: u64) -> io::Result<()> {
        FileExt::read_exact_at(self, buffer, position)
    }

    fn write_all_at(&self, bytes: &[u8], position: u64) -> io::Result<()> {
        FileExt::write_all_at(self, bytes, position)
    }

    fn size(&self) -> io::Result<u64> {
        Ok(self.metadata()?.len())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        File::set_len(self, len)
    }

    fn sync_data(&self) -> io::Result<()> {
        File::sync_data(self)
    }

    fn sync_all(&self) -> io::Result<()> {
        File::sync_all(self)
    }
}

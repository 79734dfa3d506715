//! The tail cache: the newest batches of a partition's active segment, kept in memory as the
//! write thread wrote them.
//!
//! Most reads of a busy log are close behind its writer: the hub's tailers, subscriptions that
//! fell a little behind, views following their source. Served from here, such a read takes the
//! bytes this process encoded itself: no `pread`, no fresh buffer to fault in, no copy, no
//! checksum (the checksum guards what comes back from the disk). A read that starts before the
//! cached batches, or finds them evicted meanwhile, reads the file as before.
//!
//! What a reader may see does not change: batches are cached once written, before they are
//! durable, and a read still stops at the partition's published end, so a cached batch is
//! readable exactly when the same batch in the file is.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::format::BatchHeader;
use crate::segment::Segment;

/// Bytes of batches a partition keeps in memory. At 100 000 records/s of ~330 bytes this is
/// ~30 ms of writes: more than a tailer falls behind between two of its reads, even across a
/// few milliseconds without a CPU, and little beside the page cache holding the same bytes.
/// A batch larger than this is not cached.
pub(crate) const TAIL_CACHE_BYTES: usize = 1024 * 1024;
/// How long a batch stays cached. Readers close behind the writer read a batch within
/// milliseconds; by age, the memory all partitions together hold is what they were written in
/// this long, whatever their number, instead of up to [`TAIL_CACHE_BYTES`] each for every
/// partition ever written (a server of thousands of tables would hold gigabytes). The write
/// thread drops the whole cache once it has written nothing for this long.
pub(crate) const TAIL_CACHE_AGE: Duration = Duration::from_millis(250);

/// One batch as written: header and payload, byte for byte what the file holds.
#[derive(Clone)]
pub(crate) struct CachedBatch {
    pub(crate) segment: Arc<Segment>,
    /// The batch's position in `segment`, for reporting a record that does not decode.
    pub(crate) position: u64,
    pub(crate) header: BatchHeader,
    pub(crate) bytes: Bytes,
    pub(crate) written_at: Instant,
}

/// The newest batches, in offset order with no gap between them: at most
/// [`TAIL_CACHE_BYTES`] of them, none older than [`TAIL_CACHE_AGE`] when the next is pushed.
#[derive(Default)]
pub(crate) struct TailCache {
    batches: VecDeque<CachedBatch>,
    bytes: usize,
}

impl TailCache {
    /// Keeps a batch just written, after every batch before it, and lets the oldest go beyond
    /// the budget. A batch that does not follow the last one (none does after a failed write)
    /// starts the cache again, so the cached batches never have a gap.
    pub(crate) fn push(&mut self, batch: CachedBatch) {
        if batch.bytes.len() > TAIL_CACHE_BYTES {
            self.clear();
            return;
        }
        if self.batches.back().is_some_and(|last| last.header.next_offset() != batch.header.base_offset) {
            self.clear();
        }
        let oldest_kept = batch.written_at.checked_sub(TAIL_CACHE_AGE);
        self.bytes += batch.bytes.len();
        self.batches.push_back(batch);
        while self.bytes > TAIL_CACHE_BYTES
            || self.batches.front().zip(oldest_kept).is_some_and(|(front, oldest)| front.written_at < oldest)
        {
            let evicted = self.batches.pop_front().expect("the batch just pushed is neither too old nor too large");
            self.bytes -= evicted.bytes.len();
        }
    }

    /// Forgets everything: the active segment was closed (retention and compaction may then
    /// change what the file holds) or a batch was too large to keep.
    pub(crate) fn clear(&mut self) {
        self.batches.clear();
        self.bytes = 0;
    }

    /// The cached batches from the one holding `offset` on, below `end` (the published end:
    /// later batches are written but not yet readable), enough of them for `records` records
    /// from `offset`. `None` when `offset` is not cached: read the file.
    pub(crate) fn batches_from(&self, offset: u64, end: u64, records: usize) -> Option<Vec<CachedBatch>> {
        let first = self.batches.front()?;
        if offset < first.header.base_offset || offset >= end {
            return None;
        }
        // Batches are in offset order: the first one that ends after `offset` holds it.
        let start = self.batches.partition_point(|batch| batch.header.next_offset() <= offset);
        let mut taken = Vec::new();
        let mut counted = 0;
        for batch in self.batches.range(start..) {
            if batch.header.base_offset >= end || counted >= records {
                break;
            }
            counted += (batch.header.next_offset() - offset.max(batch.header.base_offset)) as usize;
            taken.push(batch.clone());
        }
        if taken.is_empty() { None } else { Some(taken) }
    }

    #[cfg(test)]
    fn offsets(&self) -> Option<(u64, u64)> {
        Some((self.batches.front()?.header.base_offset, self.batches.back()?.header.next_offset()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{BatchBuilder, NewRecord, encode_record};

    fn segment() -> (tempfile::TempDir, Arc<Segment>) {
        let dir = tempfile::tempdir().unwrap();
        let segment = Arc::new(Segment::create(dir.path(), 0, 4096, &crate::file::FileStorage).unwrap());
        (dir, segment)
    }

    /// A batch of `count` records of `value_bytes` each from `base_offset`.
    fn batch(segment: &Arc<Segment>, base_offset: u64, count: u32, value_bytes: usize) -> CachedBatch {
        let mut encoded = Vec::new();
        for _ in 0..count {
            encode_record(&mut encoded, &NewRecord::value(vec![7u8; value_bytes]), 1);
        }
        let mut buffer = Vec::new();
        let mut builder = BatchBuilder::new(&mut buffer, base_offset);
        builder.push_encoded(&encoded, base_offset, count, 1, 1);
        let header = builder.finish();
        CachedBatch {
            segment: segment.clone(),
            position: 0,
            header,
            bytes: Bytes::from(buffer),
            written_at: Instant::now(),
        }
    }

    fn bases(batches: &[CachedBatch]) -> Vec<u64> {
        batches.iter().map(|batch| batch.header.base_offset).collect()
    }

    #[test]
    fn reads_find_the_batch_holding_an_offset_and_stop_at_the_published_end() {
        let (_dir, segment) = segment();
        let mut cache = TailCache::default();
        for base in [0, 10, 20, 30] {
            cache.push(batch(&segment, base, 10, 16));
        }
        assert_eq!(bases(&cache.batches_from(0, 40, 1).unwrap()), [0]);
        assert_eq!(bases(&cache.batches_from(15, 40, 1).unwrap()), [10]);
        // Five records wanted from 15: the rest of that batch is enough.
        assert_eq!(bases(&cache.batches_from(15, 40, 5).unwrap()), [10]);
        assert_eq!(bases(&cache.batches_from(15, 40, 6).unwrap()), [10, 20]);
        assert_eq!(bases(&cache.batches_from(15, 40, 1000).unwrap()), [10, 20, 30]);
        // Written but not published: not readable, from the cache or the file.
        assert_eq!(bases(&cache.batches_from(15, 30, 1000).unwrap()), [10, 20]);
        assert!(cache.batches_from(30, 30, 1000).is_none());
        assert!(cache.batches_from(40, 40, 1).is_none());
    }

    #[test]
    fn the_oldest_batches_go_beyond_the_budget_and_reads_before_them_miss() {
        let (_dir, segment) = segment();
        let mut cache = TailCache::default();
        // ~100 KiB batches: eleven of them do not fit in 1 MiB.
        let mut base = 0;
        for _ in 0..11 {
            cache.push(batch(&segment, base, 100, 1000));
            base += 100;
        }
        assert!(cache.bytes <= TAIL_CACHE_BYTES);
        let (first, next) = cache.offsets().unwrap();
        assert!(first > 0, "nothing was evicted");
        assert_eq!(next, 1100);
        assert_eq!(cache.bytes, cache.batches.iter().map(|batch| batch.bytes.len()).sum::<usize>());
        assert!(cache.batches_from(first - 1, 1100, 1).is_none());
        assert_eq!(bases(&cache.batches_from(first, 1100, 1).unwrap()), [first]);
    }

    #[test]
    fn batches_older_than_the_age_go_when_the_next_is_pushed() {
        let (_dir, segment) = segment();
        let mut cache = TailCache::default();
        let start = Instant::now();
        for (base, age_ms) in [(0, 400), (10, 300), (20, 100), (30, 0)] {
            let mut pushed = batch(&segment, base, 10, 16);
            pushed.written_at = start + Duration::from_millis(400 - age_ms);
            cache.push(pushed);
        }
        // Written 400 and 300 ms before the newest: gone; 100 ms before: kept.
        assert_eq!(cache.offsets(), Some((20, 40)));
        assert_eq!(cache.bytes, cache.batches.iter().map(|batch| batch.bytes.len()).sum::<usize>());
        assert!(cache.batches_from(15, 40, 1).is_none());
        assert_eq!(bases(&cache.batches_from(25, 40, 100).unwrap()), [20, 30]);
    }

    #[test]
    fn a_gap_or_an_oversized_batch_starts_the_cache_again() {
        let (_dir, segment) = segment();
        let mut cache = TailCache::default();
        cache.push(batch(&segment, 0, 10, 16));
        cache.push(batch(&segment, 10, 10, 16));
        // Offsets 20..30 never cached (a failed write, say): what follows starts afresh.
        cache.push(batch(&segment, 30, 10, 16));
        assert_eq!(cache.offsets(), Some((30, 40)));
        assert!(cache.batches_from(15, 40, 1).is_none());
        cache.push(batch(&segment, 40, 2, TAIL_CACHE_BYTES));
        assert_eq!(cache.offsets(), None);
        assert_eq!(cache.bytes, 0);
        cache.push(batch(&segment, 42, 1, 16));
        assert_eq!(cache.offsets(), Some((42, 43)));
    }
}

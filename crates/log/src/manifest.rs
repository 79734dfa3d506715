//! The partition's list of its own segments, `segments.manifest`: what opening checks the
//! segment files against, so that a segment deleted or cut short at a batch boundary is found
//! instead of read around.
//!
//! Every segment file on its own can look whole: a segment cut at a batch boundary ends in a
//! valid batch, and a deleted one leaves nothing to scan. Only a record of what the partition
//! held says records are missing. The manifest is that record: each segment's base offset and,
//! for a closed segment, the offset its records end at (the next offset of its last batch).
//! It is rewritten, through a temporary file and a rename, whenever that changes: a roll (the
//! closed segment's end, the new one), retention (segments removed), compaction (a segment's
//! records end sooner, or it is removed), and recovery that was told to accept a loss.
//!
//! Opening compares ([`check`]): a listed segment whose file is gone, a closed segment whose
//! records end before the listed end, and, in a partition that is not compacted, a segment
//! that does not start where the one before it ends, are **missing records**: the open is
//! refused naming the files and offsets, unless the recovery policy says to accept the loss.
//!
//! The manifest may lag the files in one way only: a roll creates the new segment file before
//! the manifest names it, so files past the last listed one are taken as rolls the manifest had
//! not caught up with (they must follow on without a gap). A manifest that is missing (a
//! partition from before manifests) or damaged is rebuilt from the files; that loses the check
//! once, never a record.
//!
//! It also records where the partition starts when records were deleted inside a segment
//! (`start`, Kafka's DeleteRecords).
//!
//! Text, one line each, and a checksum of every byte before the last line:
//!
//! ```text
//! # onehop partition segments; rewritten on roll, retention and compaction, checked on open
//! version 1
//! segment 0 1485
//! segment 1485 1977
//! segment 1977 active
//! crc32c 1a2b3c4d
//! ```

use std::fs;
use std::io;
use std::path::Path;

use crate::segment::write_atomically;

pub(crate) const MANIFEST_FILE: &str = "segments.manifest";
const MANIFEST_VERSION: u32 = 1;
const FIRST_LINE: &str = "# onehop partition segments; rewritten on roll, retention and compaction, checked on open";

/// One segment as the manifest lists it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Listed {
    pub(crate) base_offset: u64,
    /// Where a closed segment's records end (the next offset of its last batch); `None` for the
    /// active segment, whose end only its scan can tell.
    pub(crate) records_end: Option<u64>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Manifest {
    /// Where the partition's records start, when records before it were deleted inside a
    /// segment (Kafka's DeleteRecords); reads before it are refused. `None`: the first
    /// segment's base offset.
    pub(crate) start: Option<u64>,
    /// In offset order; the last one was the active segment when the manifest was written.
    pub(crate) segments: Vec<Listed>,
}

/// Why a manifest on disk was not used.
#[derive(Debug)]
pub(crate) enum Unusable {
    Missing,
    Damaged(String),
}

impl Manifest {
    pub(crate) fn encode(&self) -> String {
        let mut text = format!("{FIRST_LINE}\nversion {MANIFEST_VERSION}\n");
        if let Some(start) = self.start {
            text.push_str(&format!("start {start}\n"));
        }
        for listed in &self.segments {
            match listed.records_end {
                Some(end) => text.push_str(&format!("segment {} {end}\n", listed.base_offset)),
                None => text.push_str(&format!("segment {} active\n", listed.base_offset)),
            }
        }
        let crc = crc32c::crc32c(text.as_bytes());
        text.push_str(&format!("crc32c {crc:08x}\n"));
        text
    }

    pub(crate) fn decode(text: &str) -> Result<Manifest, String> {
        let body_end = text.trim_end_matches('\n').rfind('\n').map(|at| at + 1).ok_or("no checksum line")?;
        let (body, last) = text.split_at(body_end);
        let crc = last
            .trim_end()
            .strip_prefix("crc32c ")
            .and_then(|hex| u32::from_str_radix(hex, 16).ok())
            .ok_or("the last line is not `crc32c <hex>`")?;
        if crc32c::crc32c(body.as_bytes()) != crc {
            return Err("checksum mismatch".into());
        }
        let mut manifest = Manifest::default();
        let mut version = None;
        for line in body.lines().filter(|line| !line.starts_with('#')) {
            let words: Vec<&str> = line.split(' ').collect();
            let number = |word: &str| word.parse::<u64>().map_err(|_| format!("{word:?} is not an offset"));
            match words.as_slice() {
                ["version", found] => version = Some(found.parse::<u32>().map_err(|_| "a bad version line")?),
                ["start", start] => manifest.start = Some(number(start)?),
                ["segment", base, "active"] => {
                    manifest.segments.push(Listed { base_offset: number(base)?, records_end: None })
                }
                ["segment", base, end] => {
                    manifest.segments.push(Listed { base_offset: number(base)?, records_end: Some(number(end)?) })
                }
                _ => return Err(format!("an unknown line {line:?}")),
            }
        }
        match version {
            Some(MANIFEST_VERSION) => {}
            Some(other) => return Err(format!("version {other}, written by a newer onehop")),
            None => return Err("no version line".into()),
        }
        let ordered = manifest.segments.windows(2).all(|pair| {
            pair[0].base_offset < pair[1].base_offset
                && pair[0].records_end.is_some_and(|end| end >= pair[0].base_offset && end <= pair[1].base_offset)
        });
        if !ordered {
            return Err("segments out of order, or a closed segment without an end".into());
        }
        Ok(manifest)
    }

    /// The manifest of segments given as `(base_offset, records_end)` in offset order, the last
    /// one active.
    pub(crate) fn of(start: Option<u64>, segments: impl Iterator<Item = (u64, u64)>) -> Manifest {
        let mut manifest = Manifest {
            start,
            segments: segments.map(|(base_offset, end)| Listed { base_offset, records_end: Some(end) }).collect(),
        };
        if let Some(last) = manifest.segments.last_mut() {
            last.records_end = None;
        }
        manifest
    }

    /// Reads the manifest in `dir`.
    pub(crate) fn read(dir: &Path) -> Result<Manifest, Unusable> {
        match fs::read(dir.join(MANIFEST_FILE)) {
            Err(error) if error.kind() == io::ErrorKind::NotFound => Err(Unusable::Missing),
            Err(error) => Err(Unusable::Damaged(error.to_string())),
            Ok(bytes) => {
                let text = String::from_utf8(bytes).map_err(|_| Unusable::Damaged("not UTF-8".into()))?;
                Manifest::decode(&text).map_err(Unusable::Damaged)
            }
        }
    }

    /// Writes the manifest in `dir` durably (a temporary file, a rename, the directory synced).
    pub(crate) fn write(&self, dir: &Path) -> io::Result<()> {
        write_atomically(&dir.join(MANIFEST_FILE), self.encode().as_bytes())?;
        crate::segment::sync_dir(dir)
    }

    fn listed(&self, base_offset: u64) -> Option<&Listed> {
        self.segments.binary_search_by_key(&base_offset, |listed| listed.base_offset).ok().map(|at| &self.segments[at])
    }
}

/// A segment file as opening found it: its base offset and where its records end.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Found {
    pub(crate) base_offset: u64,
    pub(crate) records_end: u64,
}

/// Records the files do not hold though the partition did: `[from, to)`, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MissingRecords {
    pub from: u64,
    /// `None` when the newest segment is gone: how far its records went is not known.
    pub to: Option<u64>,
    /// What the files show: which segment is gone or ends early.
    pub cause: String,
}

/// What the manifest says of the segment files before they are opened.
pub(crate) struct Plan {
    /// Listed as closed: opened as closed segments even when it is the last file (the files
    /// after it are gone), so damage at its end is never cut as a torn write.
    pub(crate) closed: Vec<u64>,
    /// Files that maintenance had already taken out of the partition when it stopped: below the
    /// first listed segment (retention), or between listed ones in a compacted partition (a
    /// segment compaction emptied). The manifest was written before the file was deleted.
    pub(crate) leftovers: Vec<u64>,
}

/// Sorts the files in `bases` (sorted) by what `manifest` says of them.
pub(crate) fn plan(manifest: &Manifest, bases: &[u64], compacted: bool) -> Plan {
    let mut plan = Plan { closed: Vec::new(), leftovers: Vec::new() };
    let (Some(first), Some(last)) = (manifest.segments.first(), manifest.segments.last()) else {
        return plan;
    };
    for &base in bases {
        match manifest.listed(base) {
            Some(Listed { records_end: Some(_), .. }) => plan.closed.push(base),
            Some(_) => {}
            None if base < first.base_offset => plan.leftovers.push(base),
            None if compacted && base < last.base_offset => plan.leftovers.push(base),
            None => {}
        }
    }
    plan
}

/// Compares the opened segments (`found`, in offset order, leftovers removed) with the manifest,
/// and returns every range of records that is missing. With no manifest to compare with, only
/// what the files show on their own is checked: in a partition that is not compacted, each
/// segment starts where the one before it ends.
pub(crate) fn check(manifest: Option<&Manifest>, found: &[Found], compacted: bool) -> Vec<MissingRecords> {
    let mut missing = Vec::new();
    let name = |base: u64| format!("{base:020}.log");
    if let Some(manifest) = manifest {
        for (at, listed) in manifest.segments.iter().enumerate() {
            if found.iter().any(|segment| segment.base_offset == listed.base_offset) {
                continue;
            }
            let next_listed = manifest.segments.get(at + 1).map(|next| next.base_offset);
            missing.push(MissingRecords {
                from: listed.base_offset,
                to: next_listed.or(listed.records_end),
                cause: match next_listed {
                    Some(_) => format!("segment {} is gone", name(listed.base_offset)),
                    None => format!(
                        "segment {}, the newest, is gone (with every record from offset {} on)",
                        name(listed.base_offset),
                        listed.base_offset
                    ),
                },
            });
        }
    }
    for (at, segment) in found.iter().enumerate() {
        let listed_end = manifest.and_then(|manifest| manifest.listed(segment.base_offset)).and_then(|l| l.records_end);
        if let Some(end) = listed_end
            && segment.records_end < end
        {
            missing.push(MissingRecords {
                from: segment.records_end,
                to: Some(end),
                cause: format!(
                    "segment {} ends at offset {} but held records up to offset {end}: it was cut short",
                    name(segment.base_offset),
                    segment.records_end
                ),
            });
            continue;
        }
        let Some(next) = found.get(at + 1) else { continue };
        // A gap the manifest lists (compaction emptied the end of the segment, or a loss that
        // was accepted) is part of the partition; one it does not list is missing records.
        let gap_listed = listed_end.is_some_and(|end| end <= segment.records_end);
        let next_listed = manifest.is_some_and(|manifest| manifest.listed(next.base_offset).is_some());
        if segment.records_end < next.base_offset && !compacted && !(gap_listed && next_listed) {
            missing.push(MissingRecords {
                from: segment.records_end,
                to: Some(next.base_offset),
                cause: format!(
                    "segment {} ends at offset {} but the next one, {}, starts at offset {}",
                    name(segment.base_offset),
                    segment.records_end,
                    name(next.base_offset),
                    next.base_offset
                ),
            });
        }
    }
    missing.sort_by_key(|gap| gap.from);
    missing
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(segments: &[(u64, Option<u64>)]) -> Manifest {
        Manifest {
            start: None,
            segments: segments.iter().map(|&(base_offset, records_end)| Listed { base_offset, records_end }).collect(),
        }
    }

    fn found(segments: &[(u64, u64)]) -> Vec<Found> {
        segments.iter().map(|&(base_offset, records_end)| Found { base_offset, records_end }).collect()
    }

    #[test]
    fn a_manifest_reads_back_as_written_and_refuses_a_changed_byte() {
        let manifest = listed(&[(0, Some(1485)), (1485, Some(1977)), (1977, None)]);
        let text = manifest.encode();
        assert_eq!(Manifest::decode(&text).unwrap(), manifest);
        let started = Manifest { start: Some(1500), ..manifest.clone() };
        assert_eq!(Manifest::decode(&started.encode()).unwrap(), started);
        let changed = text.replacen("1977", "1978", 1);
        assert!(Manifest::decode(&changed).unwrap_err().contains("checksum"), "{changed}");
        assert!(Manifest::decode("").is_err());
        assert!(Manifest::decode(&text[..text.len() - 3]).is_err());
    }

    #[test]
    fn the_documented_example_reads() {
        let manifest = listed(&[(0, Some(1485)), (1485, Some(1977)), (1977, None)]);
        let text = manifest.encode();
        let doc = include_str!("../../../docs/log-format.md");
        assert!(doc.contains(&text), "docs/log-format.md shows the manifest as written:\n{text}");
    }

    #[test]
    fn whole_segments_that_follow_on_are_not_missing_anything() {
        let manifest = listed(&[(0, Some(10)), (10, None)]);
        assert!(check(Some(&manifest), &found(&[(0, 10), (10, 25)]), false).is_empty());
        // A roll the manifest had not caught up with.
        assert!(check(Some(&manifest), &found(&[(0, 10), (10, 25), (25, 30)]), false).is_empty());
        assert!(check(None, &found(&[(0, 10), (10, 25)]), false).is_empty());
    }

    #[test]
    fn a_segment_cut_at_a_batch_boundary_or_deleted_is_missing_records() {
        let manifest = listed(&[(0, Some(10)), (10, Some(20)), (20, None)]);
        let cut = check(Some(&manifest), &found(&[(0, 10), (10, 15), (20, 30)]), false);
        assert_eq!((cut[0].from, cut[0].to), (15, Some(20)), "{cut:?}");
        // Without a manifest the files still show it, when the partition is not compacted.
        let cut = check(None, &found(&[(0, 10), (10, 15), (20, 30)]), false);
        assert_eq!((cut[0].from, cut[0].to), (15, Some(20)), "{cut:?}");
        let deleted = check(Some(&manifest), &found(&[(0, 10), (20, 30)]), false);
        assert!(deleted.iter().any(|gap| (gap.from, gap.to) == (10, Some(20))), "{deleted:?}");
        let first = check(Some(&manifest), &found(&[(10, 20), (20, 30)]), false);
        assert_eq!((first[0].from, first[0].to), (0, Some(10)), "{first:?}");
        let newest = check(Some(&manifest), &found(&[(0, 10), (10, 20)]), false);
        assert_eq!((newest[0].from, newest[0].to), (20, None), "{newest:?}");
        assert!(newest[0].cause.contains("the newest"), "{newest:?}");
    }

    #[test]
    fn compaction_gaps_the_manifest_lists_are_kept_and_cuts_below_them_are_not() {
        // A compacted segment whose last records were compacted away ends early; the manifest
        // says where.
        let manifest = listed(&[(0, Some(7)), (10, Some(20)), (20, None)]);
        assert!(check(Some(&manifest), &found(&[(0, 7), (10, 20), (20, 30)]), true).is_empty());
        // The rewrite's crash window: the manifest has the new end, the file is still the old one.
        assert!(check(Some(&manifest), &found(&[(0, 10), (10, 20), (20, 30)]), true).is_empty());
        let cut = check(Some(&manifest), &found(&[(0, 5), (10, 20), (20, 30)]), true);
        assert_eq!((cut[0].from, cut[0].to), (5, Some(7)), "{cut:?}");
        let deleted = check(Some(&manifest), &found(&[(0, 7), (20, 30)]), true);
        assert_eq!((deleted[0].from, deleted[0].to), (10, Some(20)), "{deleted:?}");
        // A loss accepted earlier in a partition that is not compacted is listed, and kept.
        let accepted = listed(&[(0, Some(5)), (10, None)]);
        assert!(check(Some(&accepted), &found(&[(0, 5), (10, 12)]), false).is_empty());
    }

    #[test]
    fn the_plan_takes_files_maintenance_had_dropped_as_leftovers() {
        let manifest = listed(&[(10, Some(20)), (30, None)]);
        let plan = plan(&manifest, &[0, 10, 20, 30, 40], true);
        assert_eq!(plan.leftovers, vec![0, 20]);
        assert_eq!(plan.closed, vec![10]);
        let plan = super::plan(&manifest, &[0, 10, 20, 30], false);
        assert_eq!(plan.leftovers, vec![0], "a stray middle file of an uncompacted partition is checked, not dropped");
    }
}

//! The crash test: a child process appends from several concurrent writers and reports every
//! acknowledged append on stdout; the parent kills it with SIGKILL at a random moment, reopens
//! the partition and checks that
//!
//! - every acknowledged append is there, at the offset its acknowledgement gave, byte for byte;
//! - offsets are dense from 0 to the end, and what was recovered before is still there;
//! - every record present is whole and is exactly what its embedded ids say it must be (its
//!   bytes are derived from the ids), appends are whole and contiguous, and each writer's
//!   appends appear in order without gaps (a writer issues its next append only after the ack).
//!
//! The child is this test binary run again with `--exact crash_child` and `ONEHOP_CRASH_DIR`
//! set; without that variable `crash_child` does nothing. Every cycle reopens the same
//! directory, so kills land during recovery, appends, fsyncs and segment rolls (segments are
//! 64 KiB). `ONEHOP_CRASH_CYCLES` sets the number of cycles (default 30) and
//! `ONEHOP_CRASH_SEED` the kill timing.

mod common;

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{filler, stored};
use onehop_log::{Durability, NewRecord, Partition, PartitionConfig, Record};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const DIR_ENV: &str = "ONEHOP_CRASH_DIR";
const CYCLE_ENV: &str = "ONEHOP_CRASH_CYCLE";
const WRITERS: u32 = 8;
/// A child that is never killed stops appending after this long (the parent kills far sooner).
const CHILD_RUN_MAX: Duration = Duration::from_secs(60);
/// The parent gives up on a child that does not open the partition within this.
const CHILD_READY_TIMEOUT: Duration = Duration::from_secs(60);

fn config() -> PartitionConfig {
    PartitionConfig {
        segment_bytes_max: 64 * 1024,
        index_interval_bytes: 4096,
        durability: Durability::Fsync,
        async_fsync_interval_ms: 5,
        record_bytes_max: 16 * 1024,
        batch_bytes_max: 64 * 1024,
        queue_bytes_max: 1 << 20,
        ..Default::default()
    }
}

/// Which append a record belongs to: the cycle (child process), the writer task in it, and the
/// writer's sequence number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct AppendId {
    cycle: u32,
    writer: u32,
    seq: u64,
}

fn mix(id: AppendId, salt: u64) -> u64 {
    let mut x = (id.cycle as u64) << 40 ^ (id.writer as u64) << 32 ^ id.seq ^ salt.wrapping_mul(0xA24B_AED4_963E_E407);
    // splitmix64
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The records of one append, entirely determined by its id.
fn append_records(id: AppendId) -> Vec<NewRecord> {
    let count = 1 + mix(id, 0) % 4;
    (0..count)
        .map(|index| {
            let h = mix(id, 1 + index);
            // Mostly small values, sometimes several kilobytes so batches straddle roll points.
            let value_len = if h.is_multiple_of(16) { 2_000 + h % 6_000 } else { h % 300 } as usize;
            NewRecord {
                timestamp_ms: Some(1_700_000_000_000 + (h % 1_000_000) as i64),
                key: Some(format!("c{}-w{}-s{}-i{index}", id.cycle, id.writer, id.seq).into()),
                subject: h.is_multiple_of(3).then(|| format!("crash/writer-{}", id.writer).into()),
                headers: if h.is_multiple_of(5) {
                    vec![("count".into(), Some(count.to_string().into()))]
                } else {
                    vec![]
                },
                value: (!h.is_multiple_of(11)).then(|| filler(h, value_len)),
            }
        })
        .collect()
}

fn durability(id: AppendId) -> Durability {
    if mix(id, 99).is_multiple_of(2) { Durability::Fsync } else { Durability::Async }
}

/// Reads the ids back from a record key `c{cycle}-w{writer}-s{seq}-i{index}`.
fn parse_key(key: &[u8]) -> Option<(AppendId, u64)> {
    let key = std::str::from_utf8(key).ok()?;
    let mut parts = key.split('-');
    let mut field = |prefix: char| parts.next()?.strip_prefix(prefix)?.parse::<u64>().ok();
    let id = AppendId { cycle: field('c')? as u32, writer: field('w')? as u32, seq: field('s')? };
    let index = field('i')?;
    parts.next().is_none().then_some((id, index))
}

fn emit(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").expect("write to the parent");
    out.flush().expect("flush to the parent");
}

/// The child: appends from `WRITERS` tasks until killed, printing `@@ACK` per acknowledgement.
#[test]
fn crash_child() {
    let Some(dir) = std::env::var_os(DIR_ENV) else { return };
    let cycle: u32 = std::env::var(CYCLE_ENV).expect("cycle number").parse().expect("cycle number");
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async move {
        let (partition, _) = Partition::open_existing(&dir).expect("the child opens the partition");
        let partition = Arc::new(partition);
        emit("@@READY");
        let deadline = Instant::now() + CHILD_RUN_MAX;
        let mut writers = Vec::new();
        for writer in 0..WRITERS {
            let partition = partition.clone();
            writers.push(tokio::spawn(async move {
                let mut seq = 0;
                while Instant::now() < deadline {
                    let id = AppendId { cycle, writer, seq };
                    let ack = partition.append_with(&append_records(id), durability(id)).await.expect("append");
                    emit(&format!("@@ACK {cycle} {writer} {seq} {} {}", ack.base_offset, ack.record_count));
                    seq += 1;
                }
            }));
        }
        for writer in writers {
            writer.await.unwrap();
        }
    });
}

struct Acked {
    id: AppendId,
    base_offset: u64,
    record_count: u64,
}

enum Event {
    Ready,
    Acked(Acked),
}

fn parse_event(line: &str) -> Option<Event> {
    // libtest may print its own text on the same line before ours.
    if line.contains("@@READY") {
        return Some(Event::Ready);
    }
    let fields: Vec<u64> = line[line.find("@@ACK ")? + 6..].split_whitespace().map(|f| f.parse().unwrap()).collect();
    let [cycle, writer, seq, base_offset, record_count] = fields[..] else { panic!("bad ack line {line:?}") };
    Some(Event::Acked(Acked {
        id: AppendId { cycle: cycle as u32, writer: writer as u32, seq },
        base_offset,
        record_count,
    }))
}

/// Runs one child, kills it at a random moment, and returns what it acknowledged.
fn run_child(dir: &Path, cycle: u32, rng: &mut StdRng) -> Vec<Acked> {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "crash_child", "--nocapture", "--test-threads", "1"])
        .env(DIR_ENV, dir)
        .env(CYCLE_ENV, cycle.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the child");
    let stdout = child.stdout.take().unwrap();
    let (sender, events) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        let mut line = String::new();
        // A line cut by the kill has no newline: its append was not reported, so it is ignored.
        while reader.read_line(&mut line).is_ok_and(|read| read > 0) && line.ends_with('\n') {
            if let Some(event) = parse_event(&line) {
                let _ = sender.send(event);
            }
            line.clear();
        }
    });
    if rng.random_ratio(1, 8) {
        // Now and then, kill it while it opens (and maybe recovers) the partition.
        std::thread::sleep(Duration::from_millis(rng.random_range(0..20)));
    } else {
        match events.recv_timeout(CHILD_READY_TIMEOUT) {
            Ok(Event::Ready) => {}
            Ok(Event::Acked(_)) => panic!("the child acknowledged an append before it was ready"),
            Err(error) => {
                let _ = child.kill();
                panic!("the child did not get ready: {error}; it exited with {:?}", child.wait());
            }
        }
        std::thread::sleep(Duration::from_millis(rng.random_range(0..150)));
    }
    child.kill().expect("SIGKILL the child");
    let status = child.wait().expect("reap the child");
    reader.join().expect("the reader thread");
    // A child that ended on its own (a failed append, a panic) is a failure, not a crash.
    assert_eq!(status.signal(), Some(9), "the child was not killed but exited: {status}");
    events
        .try_iter()
        .filter_map(|event| match event {
            Event::Acked(acked) => Some(acked),
            Event::Ready => None,
        })
        .collect()
}

/// What the checks of earlier cycles established.
#[derive(Default)]
struct Verified {
    /// Every record recovered after the previous kill.
    records: Vec<Record>,
    /// Appends found so far.
    seen: HashSet<AppendId>,
    /// The next sequence number expected of each (cycle, writer).
    next_seq: HashMap<(u32, u32), u64>,
}

/// Reopens the partition after a kill and checks everything the module comment promises.
fn verify(dir: &Path, cycle: u32, acked: &[Acked], verified: &mut Verified) {
    let (partition, report) = Partition::open_existing(dir).expect("reopen after the kill");
    let end = partition.end_offset();
    assert_eq!(partition.start_offset(), 0);
    let records = partition.read(0, usize::MAX, usize::MAX).expect("read everything");
    assert_eq!(records.len() as u64, end, "a read from 0 returns every record up to the end");
    for (i, record) in records.iter().enumerate() {
        assert_eq!(record.offset, i as u64, "offsets are dense");
    }
    let before = &verified.records;
    assert!(records.len() >= before.len(), "cycle {cycle}: the log shrank from {} to {end}", before.len());
    if let Some(i) = records.iter().zip(before).position(|(now, then)| now != then) {
        panic!(
            "cycle {cycle}: record {i} changed after it was recovered:\nthen {:?}\nnow  {:?}",
            before[i], records[i]
        );
    }

    // Walk what is new append by append (what was there before was walked already).
    let mut at = before.len();
    while at < records.len() {
        let key = records[at].key.as_deref().unwrap_or_default();
        let Some((id, index)) = parse_key(key) else {
            panic!("record {at} is not one the test wrote: {:?}", records[at])
        };
        assert_eq!(index, 0, "record {at} starts in the middle of append {id:?}");
        let expected = append_records(id);
        assert!(at + expected.len() <= records.len(), "append {id:?} at {at} is cut short at the end {end}");
        for (i, new) in expected.iter().enumerate() {
            let offset = at + i;
            assert_eq!(records[offset], stored(offset as u64, new), "record {offset} (append {id:?}) is not intact");
        }
        assert!(verified.seen.insert(id), "append {id:?} appears twice");
        let next = verified.next_seq.entry((id.cycle, id.writer)).or_default();
        assert_eq!(id.seq, *next, "writer {} of cycle {} skipped or reordered an append", id.writer, id.cycle);
        *next += 1;
        at += expected.len();
    }

    // Every acknowledged append is where its acknowledgement said.
    for ack in acked {
        let expected = append_records(ack.id);
        assert_eq!(ack.record_count, expected.len() as u64);
        let range = ack.base_offset as usize..(ack.base_offset + ack.record_count) as usize;
        assert!(
            range.end <= records.len(),
            "cycle {cycle}: acknowledged append {:?} at {} was lost (recovered end offset {end}, {} bytes truncated)",
            ack.id,
            ack.base_offset,
            report.truncated_bytes
        );
        // The walk above checked the bytes of every append found; this one must be the same append.
        let (found, index) = parse_key(records[range.start].key.as_deref().unwrap_or_default()).unwrap();
        assert_eq!(
            (found, index),
            (ack.id, 0),
            "acknowledged append {:?} is not at offset {}",
            ack.id,
            ack.base_offset
        );
    }
    eprintln!(
        "crash cycle {}/{}: {} appends acknowledged, recovered end offset {end} in {} segments, truncated {} bytes{}",
        cycle + 1,
        cycles(),
        acked.len(),
        report.segments,
        report.truncated_bytes,
        report
            .truncated_at
            .as_ref()
            .map(|(position, reason)| format!(" at byte {position} ({reason})"))
            .unwrap_or_default(),
    );
    partition.close();
    verified.records = records;
}

fn cycles() -> u32 {
    std::env::var("ONEHOP_CRASH_CYCLES").ok().and_then(|cycles| cycles.parse().ok()).unwrap_or(30)
}

#[test]
fn acknowledged_appends_survive_kill_9() {
    if std::env::var_os(DIR_ENV).is_some() {
        return; // a child runs only crash_child
    }
    let seed = std::env::var("ONEHOP_CRASH_SEED").ok().and_then(|seed| seed.parse().ok()).unwrap_or_else(rand::random);
    eprintln!("crash test: {} cycles, ONEHOP_CRASH_SEED={seed}", cycles());
    let mut rng = StdRng::seed_from_u64(seed);
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("partition");
    Partition::open(&dir, config()).expect("create the partition").0.close();
    let mut verified = Verified::default();
    let mut acked_total = 0;
    for cycle in 0..cycles() {
        let acked = run_child(&dir, cycle, &mut rng);
        acked_total += acked.len();
        verify(&dir, cycle, &acked, &mut verified);
    }
    assert!(acked_total > 0, "no append was ever acknowledged: the test tested nothing");
    let segments = common::segment_bases(&dir).len();
    assert!(segments > 1, "the kills never came near a segment roll");
}

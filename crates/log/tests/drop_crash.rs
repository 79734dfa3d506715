//! Dropping topics under kill -9: a child process makes topics of several partitions and
//! segments, appends to them, and drops them, over and over, reporting each step on stdout;
//! the parent kills it at a random moment and reopens the log. Every open must succeed (a drop
//! cut short must never leave a partition whose manifest names segments already deleted, which
//! the open would refuse as missing records), a topic reported dropped must be gone, a topic
//! whose drop was cut short must be gone or whole, and every other topic reported made must
//! hold every record its acknowledged appends wrote.
//!
//! The child is this test binary run again with `--exact drop_child` and `ONEHOP_DROP_DIR`
//! set; without that variable `drop_child` does nothing. `ONEHOP_DROP_CYCLES` sets the number
//! of cycles (default 30) and `ONEHOP_DROP_SEED` the kill timing.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use onehop_log::{Durability, Log, LogOptions, NewRecord, PartitionConfig};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const DIR_ENV: &str = "ONEHOP_DROP_DIR";
const CYCLE_ENV: &str = "ONEHOP_DROP_CYCLE";
const PARTITIONS: u32 = 3;
const BATCHES: u64 = 40;
const CHILD_RUN_MAX: Duration = Duration::from_secs(60);
const CHILD_READY_TIMEOUT: Duration = Duration::from_secs(60);

fn config() -> PartitionConfig {
    PartitionConfig {
        // Many small segments: many files for a drop to delete, so kills land inside drops.
        segment_bytes_max: 4096,
        index_interval_bytes: 1024,
        record_bytes_max: 4096,
        batch_bytes_max: 4096,
        queue_bytes_max: 1 << 20,
        durability: Durability::Async,
        ..Default::default()
    }
}

fn records(topic: &str, partition: u32, batch: u64) -> Vec<NewRecord> {
    (0..2)
        .map(|i| NewRecord {
            key: Some(format!("{topic}/{partition}/{batch}/{i}").into()),
            value: Some("v".repeat(1000).into()),
            ..Default::default()
        })
        .collect()
}

fn emit(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").expect("write to the parent");
    out.flush().expect("flush to the parent");
}

/// The child: makes, fills and drops topics `c{cycle}-{n}` until killed.
#[test]
fn drop_child() {
    let Some(dir) = std::env::var_os(DIR_ENV) else { return };
    let cycle: u32 = std::env::var(CYCLE_ENV).expect("cycle number").parse().expect("cycle number");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (log, _) = Log::open(&dir, LogOptions::default()).expect("the child opens the log");
    emit("@@READY");
    let deadline = Instant::now() + CHILD_RUN_MAX;
    let mut n = 0;
    while Instant::now() < deadline {
        let topic = format!("c{cycle}-{n}");
        for partition in 0..PARTITIONS {
            let opened = log.open_partition(&topic, partition, config()).expect("make the partition");
            for batch in 0..BATCHES {
                runtime.block_on(opened.append(&records(&topic, partition, batch))).expect("append");
            }
        }
        emit(&format!("@@MADE {topic}"));
        // Every other topic stays, so that each open finds a mix of kept and dropped ones.
        if n % 2 == 0 {
            emit(&format!("@@DROPPING {topic}"));
            log.remove_topic(&topic).expect("drop the topic");
            emit(&format!("@@DROPPED {topic}"));
        }
        n += 1;
    }
}

#[derive(Default)]
struct Reported {
    made: BTreeSet<String>,
    /// Topics whose drop began; a kill before it ended leaves each either whole or gone.
    dropping: BTreeSet<String>,
    dropped: BTreeSet<String>,
}

fn run_child(dir: &Path, cycle: u32, rng: &mut StdRng, reported: &mut Reported) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "drop_child", "--nocapture", "--test-threads", "1"])
        .env(DIR_ENV, dir)
        .env(CYCLE_ENV, cycle.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the child");
    let stdout = child.stdout.take().unwrap();
    let (sender, lines) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        let mut line = String::new();
        // A line cut by the kill has no newline: what it reported is not counted.
        while reader.read_line(&mut line).is_ok_and(|read| read > 0) && line.ends_with('\n') {
            let _ = sender.send(line.clone());
            line.clear();
        }
    });
    loop {
        match lines.recv_timeout(CHILD_READY_TIMEOUT) {
            Ok(line) if line.contains("@@READY") => break,
            Ok(_) => {}
            Err(error) => {
                let _ = child.kill();
                panic!("the child did not get ready: {error}; it exited with {:?}", child.wait());
            }
        }
    }
    if rng.random_ratio(3, 4) {
        // Most kills land just after a drop began, while its files are being deleted.
        let deadline = Instant::now() + CHILD_READY_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match lines.recv_timeout(left) {
                Ok(line) if line.contains("@@DROPPING ") => {
                    record(&line, reported);
                    break;
                }
                Ok(line) => record(&line, reported),
                Err(error) => {
                    let _ = child.kill();
                    panic!("the child began no drop: {error}; it exited with {:?}", child.wait());
                }
            }
        }
        std::thread::sleep(Duration::from_micros(rng.random_range(0..3000)));
    } else {
        std::thread::sleep(Duration::from_millis(rng.random_range(5..1500)));
    }
    child.kill().expect("SIGKILL the child");
    let status = child.wait().expect("reap the child");
    reader.join().expect("the reader thread");
    assert_eq!(status.signal(), Some(9), "the child was not killed but exited: {status}");
    for line in lines.try_iter() {
        record(&line, reported);
    }
}

fn record(line: &str, reported: &mut Reported) {
    // libtest may print its own text on the same line before ours.
    if let Some(at) = line.find("@@MADE ") {
        reported.made.insert(line[at + 7..].trim().to_string());
    } else if let Some(at) = line.find("@@DROPPING ") {
        reported.dropping.insert(line[at + 11..].trim().to_string());
    } else if let Some(at) = line.find("@@DROPPED ") {
        reported.dropped.insert(line[at + 10..].trim().to_string());
    }
}

fn verify(dir: &Path, reported: &Reported) {
    let (log, _) = Log::open(dir, LogOptions::default())
        .unwrap_or_else(|error| panic!("the log must open after a kill during drops: {error}"));
    assert!(!dir.join("+dropping").exists(), "the open finishes every interrupted drop");
    let topics: BTreeSet<String> = log.topics().into_iter().collect();
    for topic in &reported.dropped {
        assert!(!topics.contains(topic), "{topic} was dropped but came back");
        assert!(!dir.join(topic).exists(), "{topic} was dropped but its directory is there");
    }
    for topic in reported.made.difference(&reported.dropped) {
        if reported.dropping.contains(topic) && !topics.contains(topic) {
            // Its drop was cut short after the directory moved aside: gone, every partition.
            assert!(!dir.join(topic).exists(), "{topic} is half dropped");
            continue;
        }
        for partition in 0..PARTITIONS {
            let opened = log.partition(topic, partition).unwrap_or_else(|| panic!("{topic}/{partition} is gone"));
            let read =
                opened.read(0, usize::MAX, usize::MAX).unwrap_or_else(|error| panic!("{topic}/{partition}: {error}"));
            let keys: Vec<String> = read
                .iter()
                .map(|record| String::from_utf8_lossy(record.key.as_deref().unwrap()).into_owned())
                .collect();
            let expected: Vec<String> = (0..BATCHES)
                .flat_map(|batch| (0..2).map(move |i| format!("{topic}/{partition}/{batch}/{i}")))
                .collect();
            assert_eq!(keys, expected, "{topic}/{partition} lost records it acknowledged");
        }
    }
    log.close();
}

#[test]
fn a_drop_cut_short_by_kill_9_never_blocks_the_next_open() {
    let cycles: u32 = std::env::var("ONEHOP_DROP_CYCLES").ok().and_then(|text| text.parse().ok()).unwrap_or(30);
    let seed: u64 =
        std::env::var("ONEHOP_DROP_SEED").ok().and_then(|text| text.parse().ok()).unwrap_or_else(rand::random);
    println!("seed {seed} (ONEHOP_DROP_SEED={seed} repeats the kill timing)");
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let mut reported = Reported::default();
    for cycle in 0..cycles {
        run_child(dir.path(), cycle, &mut rng, &mut reported);
        verify(dir.path(), &reported);
        println!(
            "cycle {}/{cycles}: {} topics made, {} drops begun, {} ended",
            cycle + 1,
            reported.made.len(),
            reported.dropping.len(),
            reported.dropped.len()
        );
    }
    assert!(!reported.dropping.is_empty(), "the children began no drop: the test proved nothing");
}

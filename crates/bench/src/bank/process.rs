//! One ledger process (`onehop bench bank-ledger`, started by the harness): a leader that
//! takes transfers on stdin, applies them and group-commits them to the transaction log, or a
//! standby that follows the log on its node, applies it, and takes over when told.
//!
//! The harness talks to it over pipes, one line per message:
//!
//! - stdin: `t <command> <from> <to> <amount>` (a transfer), `takeover`, `finish`;
//! - stdout: `ack <command> <seq> <ns>` (every command up to `command` is committed, the log
//!   ends at `seq`), `applied <seq> <ns>` (the standby applied up to `seq`), `leading <seq>`
//!   (a standby took over after `seq`), `state …` (the final figures, at `finish`),
//!   `error <message>`.
//!
//! Times are CLOCK_MONOTONIC nanoseconds, which every process on the machine shares, so the
//! harness can subtract a leader's commit time from a standby's apply time.

use std::io::{BufRead, BufWriter, Stdout, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use serde::Deserialize;

use super::ledger::{Ledger, RecordValue, Replayed, Transaction, Transfer, encode_record, encode_takeover};
use super::node::{EventReader, Logged, Publisher, ReadOutcome};

/// What a ledger process is started as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Leader,
    Standby,
}

#[derive(Clone, Debug)]
pub struct LedgerOptions {
    pub role: Role,
    /// Every node's HTTP address (`host:port`).
    pub nodes: Vec<String>,
    /// The node a leader publishes to first.
    pub publish_node: usize,
    /// The node a standby follows the log on.
    pub follow_node: usize,
    pub stream: String,
    pub accounts: u32,
    pub initial_balance: u64,
    /// The epoch this process's records carry once it leads: 1 for the first leader, one more
    /// for each takeover.
    pub epoch: u64,
    /// Transactions in one publish (one request, one Raft entry) at most.
    pub batch_max: usize,
    /// Transactions in one record of the log.
    pub per_record: usize,
}

/// CLOCK_MONOTONIC in nanoseconds: the clock every process of a run compares times on.
pub fn monotonic_ns() -> u64 {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

enum Input {
    Transfer(Transfer),
    Takeover,
    Finish,
    /// The harness went away.
    Closed,
}

fn parse_input(line: &str) -> anyhow::Result<Input> {
    let mut words = line.split_ascii_whitespace();
    match words.next() {
        Some("t") => {
            let mut number = || -> anyhow::Result<u64> {
                Ok(words.next().context("a transfer with too few fields")?.parse::<u64>()?)
            };
            let (command, from, to, amount) = (number()?, number()?, number()?, number()?);
            Ok(Input::Transfer(Transfer { command, from: u32::try_from(from)?, to: u32::try_from(to)?, amount }))
        }
        Some("takeover") => Ok(Input::Takeover),
        Some("finish") => Ok(Input::Finish),
        _ => bail!("an input line the ledger does not know: {line:?}"),
    }
}

/// The process's stdout, one whole line at a time, flushed at once: the harness times what
/// it reads.
struct Output(Mutex<BufWriter<Stdout>>);

impl Output {
    fn say(&self, line: std::fmt::Arguments) {
        let mut out = self.0.lock().expect("stdout lock");
        // The harness gone means nobody reads this; the process ends with its stdin.
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }
}

/// What the standby's reader shares with the main thread.
#[derive(Default)]
struct Following {
    /// The highest sequence received from the node: in its Raft log, fdatasynced.
    durable_seq: u64,
    duplicates: u64,
    fenced: u64,
    /// Set once this process's own takeover marker came back through the log: the sequence
    /// applied before it.
    caught_up: Option<u64>,
    error: Option<String>,
}

#[derive(Deserialize)]
struct RecordEvent {
    offset: u64,
    value: RecordValue,
}

pub fn run(options: LedgerOptions) -> anyhow::Result<()> {
    let (sender, inputs) = std::sync::mpsc::channel();
    // Read stdin on its own thread from the start, so the harness never blocks on a full pipe
    // while a standby is still catching up. Unbounded: the harness sends at most one run's
    // commands.
    std::thread::Builder::new().name("ledger-stdin".into()).spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let input = match line.map_err(anyhow::Error::from).and_then(|line| parse_input(&line)) {
                Ok(input) => input,
                Err(error) => {
                    eprintln!("onehop bench bank-ledger: {error:#}");
                    Input::Closed
                }
            };
            if sender.send(input).is_err() {
                return;
            }
        }
        let _ = sender.send(Input::Closed);
    })?;
    let output = Arc::new(Output(Mutex::new(BufWriter::new(std::io::stdout()))));
    let ledger = Ledger::new(options.accounts, options.initial_balance);
    let result = match options.role {
        Role::Leader => lead(&options, ledger, &inputs, &output, Counts::default()),
        Role::Standby => stand_by(&options, ledger, &inputs, &output),
    };
    if let Err(error) = &result {
        output.say(format_args!("error {error:#}"));
    }
    result
}

/// Counters a standby carries into its leadership, for the final `state` line.
#[derive(Clone, Copy, Default)]
struct Counts {
    durable_seq: u64,
    duplicates: u64,
    fenced: u64,
}

fn say_state(output: &Output, ledger: &Ledger, committed_seq: u64, counts: Counts, publisher: Option<&Publisher>) {
    let (unknown, republished) =
        publisher.map_or((0, 0), |publisher| (publisher.unknown_outcomes, publisher.republished));
    let round_trip_us = |quantile: f64| {
        publisher.map_or(0, |publisher| {
            if quantile >= 1.0 {
                publisher.round_trips.max() / 1000
            } else {
                publisher.round_trips.value_at_quantile(quantile) / 1000
            }
        })
    };
    output.say(format_args!(
        "state applied={} durable={} committed={committed_seq} sum={} digest={} rejected={} duplicates={} fenced={} unknown_outcomes={unknown} republished={republished} publish_p50_us={} publish_p99_us={} publish_max_us={}",
        ledger.applied_seq(),
        counts.durable_seq,
        ledger.sum(),
        ledger.digest(),
        ledger.rejected(),
        counts.duplicates,
        counts.fenced,
        round_trip_us(0.5),
        round_trip_us(0.99),
        round_trip_us(1.0),
    ));
}

/// The leader's loop: take every transfer waiting (up to `batch_max`), decide each, publish
/// them as one request, acknowledge, repeat. Transfers that arrive while a publish is out wait
/// in the channel and make the next batch: group commit at the pace of the log.
fn lead(
    options: &LedgerOptions,
    mut ledger: Ledger,
    inputs: &Receiver<Input>,
    output: &Output,
    counts: Counts,
) -> anyhow::Result<()> {
    let mut publisher = Publisher::new(options.nodes.clone(), options.publish_node, &options.stream);
    let mut batch: Vec<Transaction> = Vec::with_capacity(options.batch_max);
    let mut body = String::new();
    let mut committed_seq = ledger.applied_seq();
    loop {
        let mut finish = false;
        let mut last_command = None;
        let mut next = Some(inputs.recv().unwrap_or(Input::Closed));
        while let Some(input) = next.take() {
            match input {
                Input::Transfer(transfer) => {
                    if let Some(transaction) = ledger.decide(transfer)? {
                        batch.push(transaction);
                    }
                    last_command = Some(transfer.command);
                }
                Input::Takeover => {}
                Input::Finish => finish = true,
                Input::Closed => return Ok(()),
            }
            if batch.len() < options.batch_max && !finish {
                next = match inputs.try_recv() {
                    Ok(input) => Some(input),
                    Err(TryRecvError::Empty) => None,
                    Err(TryRecvError::Disconnected) => Some(Input::Closed),
                };
            }
        }
        if let Some(last) = batch.last() {
            body.clear();
            for records in batch.chunks(options.per_record) {
                encode_record(&mut body, options.epoch, records);
            }
            publisher.publish(body.as_bytes(), Logged::Through(last.seq))?;
            committed_seq = last.seq;
            batch.clear();
        }
        if let Some(command) = last_command {
            output.say(format_args!("ack {command} {committed_seq} {}", monotonic_ns()));
        }
        if finish {
            say_state(output, &ledger, committed_seq, counts, Some(&publisher));
            return Ok(());
        }
    }
}

/// The standby: follow the log until told to take over (or to finish), then lead.
fn stand_by(
    options: &LedgerOptions,
    ledger: Ledger,
    inputs: &Receiver<Input>,
    output: &Arc<Output>,
) -> anyhow::Result<()> {
    let ledger = Arc::new(Mutex::new(ledger));
    let following = Arc::new((Mutex::new(Following::default()), Condvar::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let follower = {
        let (address, stream) = (options.nodes[options.follow_node].clone(), options.stream.clone());
        let (ledger, following, stop, output) = (ledger.clone(), following.clone(), stop.clone(), output.clone());
        let takeover_epoch = options.epoch;
        std::thread::Builder::new().name("ledger-follow".into()).spawn(move || {
            if let Err(error) = follow(&address, &stream, takeover_epoch, &ledger, &following, &stop, &output) {
                let (state, wake) = &*following;
                state.lock().expect("following lock").error = Some(format!("{error:#}"));
                wake.notify_all();
            }
        })?
    };
    let counts = |following: &Following| Counts {
        durable_seq: following.durable_seq,
        duplicates: following.duplicates,
        fenced: following.fenced,
    };
    match inputs.recv().unwrap_or(Input::Closed) {
        Input::Transfer(transfer) => {
            bail!("transfer {} reached the standby before it took over", transfer.command)
        }
        Input::Closed => {
            stop.store(true, Ordering::Relaxed);
            Ok(())
        }
        Input::Finish => {
            stop.store(true, Ordering::Relaxed);
            let _ = follower.join();
            let state = following.0.lock().expect("following lock");
            if let Some(error) = &state.error {
                bail!("following the log: {error}");
            }
            let ledger = ledger.lock().expect("ledger lock");
            say_state(output, &ledger, 0, counts(&state), None);
            Ok(())
        }
        Input::Takeover => {
            // Fence the old leader: once this marker is in the log, its records after it
            // are ignored by every reader. Then apply everything before the marker.
            let after_seq = ledger.lock().expect("ledger lock").applied_seq();
            let mut publisher = Publisher::new(options.nodes.clone(), options.follow_node, &options.stream);
            publisher.publish(encode_takeover(options.epoch, after_seq).as_bytes(), Logged::Takeover(options.epoch))?;
            let (state, wake) = &*following;
            let state = wake
                .wait_timeout_while(state.lock().expect("following lock"), Duration::from_secs(60), |state| {
                    state.caught_up.is_none() && state.error.is_none()
                })
                .expect("following lock")
                .0;
            if let Some(error) = &state.error {
                bail!("following the log: {error}");
            }
            let Some(seq) = state.caught_up else { bail!("the takeover marker did not come back within 60 s") };
            let counts = counts(&state);
            drop(state);
            stop.store(true, Ordering::Relaxed);
            let _ = follower.join();
            output.say(format_args!("leading {seq}"));
            let ledger = Arc::try_unwrap(ledger).map_err(|_| anyhow::anyhow!("the ledger is still shared"))?;
            lead(options, ledger.into_inner().expect("ledger lock"), inputs, output, counts)
        }
    }
}

/// Reads the log on one node from the start, applying each transaction once, until stopped or
/// until the takeover marker of `takeover_epoch` comes back.
fn follow(
    address: &str,
    stream: &str,
    takeover_epoch: u64,
    ledger: &Mutex<Ledger>,
    following: &(Mutex<Following>, Condvar),
    stop: &AtomicBool,
    output: &Output,
) -> anyhow::Result<()> {
    let path = format!("/streams/{stream}");
    let tick = Duration::from_millis(100);
    let mut reader = EventReader::open(address, &path, "earliest", tick)?;
    // The position after the last record read, to resume from if the connection drops.
    let mut resume_id: Option<String> = None;
    let mut epoch_max = 0;
    let mut reconnects = 0;
    while !stop.load(Ordering::Relaxed) {
        let mut problem: Option<anyhow::Error> = None;
        let mut done = false;
        let before = ledger.lock().expect("ledger lock").applied_seq();
        let outcome = reader.read(|event, data| {
            if event != "record" || problem.is_some() || done {
                return;
            }
            let record: RecordEvent = match serde_json::from_str(data) {
                Ok(record) => record,
                Err(error) => {
                    problem = Some(anyhow::anyhow!("a record that is not the ledger's: {error}: {data}"));
                    return;
                }
            };
            resume_id = Some(format!("0:{}", record.offset));
            let (state, wake) = following;
            let mut state = state.lock().expect("following lock");
            if record.value.e < epoch_max {
                state.fenced += record.value.tx.len() as u64;
                return;
            }
            epoch_max = record.value.e;
            if record.value.takeover.is_some() {
                if record.value.e == takeover_epoch {
                    state.caught_up = Some(ledger.lock().expect("ledger lock").applied_seq());
                    wake.notify_all();
                    done = true;
                }
                return;
            }
            let mut ledger = ledger.lock().expect("ledger lock");
            for transaction in record.value.transactions() {
                state.durable_seq = state.durable_seq.max(transaction.seq);
                match ledger.replay(&transaction) {
                    Ok(Replayed::Applied) => {}
                    Ok(Replayed::Duplicate) => state.duplicates += 1,
                    Err(error) => {
                        problem = Some(error.into());
                        return;
                    }
                }
            }
        });
        if let Some(problem) = problem {
            return Err(problem);
        }
        let after = ledger.lock().expect("ledger lock").applied_seq();
        if after > before {
            output.say(format_args!("applied {after} {}", monotonic_ns()));
        }
        if done {
            return Ok(());
        }
        if let ReadOutcome::Closed(why) = outcome {
            // The node went away or ended the response: resume on it where this left off.
            reconnects += 1;
            if reconnects > 100 {
                bail!("the subscription on {address} keeps ending: {why}");
            }
            std::thread::sleep(Duration::from_millis(100));
            if let Ok(resumed) = EventReader::open(address, &path, resume_id.as_deref().unwrap_or("earliest"), tick) {
                reader = resumed;
            }
        }
    }
    Ok(())
}

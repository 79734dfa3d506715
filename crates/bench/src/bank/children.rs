//! The ledger processes of a run: started as children, told what to do on their stdin,
//! heard on their stdout, killed with SIGKILL by their PID.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use hdrhistogram::Histogram;

use super::observer::Timing;
use super::process::monotonic_ns;
use crate::histogram;

/// A ledger process's final `state` line.
pub(super) type FinalState = BTreeMap<String, u64>;

/// What the ledger processes have said so far, by slot: 0 is the first leader, 1 the first
/// standby, 2 the standby started after a takeover.
#[derive(Default)]
pub(super) struct Tally {
    /// When the leader of the moment acknowledged each sequence (index = sequence).
    pub(super) commit_ns: Vec<u64>,
    /// When a standby first applied each sequence.
    pub(super) applied_ns: Vec<u64>,
    pub(super) committed_seq: u64,
    pub(super) acked_command: u64,
    pub(super) acks: u64,
    pub(super) last_ack_ns: u64,
    pub(super) leader_slot: usize,
    pub(super) standby_slot: usize,
    pub(super) applied_by_slot: [u64; 3],
    pub(super) lag_seq_max: u64,
    pub(super) leading_ns: Option<u64>,
    pub(super) states: [Option<FinalState>; 3],
    pub(super) errors: Vec<String>,
    /// The schedule, once it is set: acknowledgements are timed against it.
    pub(super) timing: Option<Timing>,
    /// Scheduled time to the leader's acknowledgement, per measured command.
    pub(super) commit_latency: Option<Histogram<u64>>,
}

impl Tally {
    pub(super) fn hear(&mut self, slot: usize, line: &str) {
        let mut words = line.split_ascii_whitespace();
        let kind = words.next().unwrap_or_default();
        let mut numbers = words.clone().map(|word| word.parse::<u64>().unwrap_or(0));
        match kind {
            "ack" if slot == self.leader_slot => {
                let (command, seq, ns) =
                    (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0), numbers.next().unwrap_or(0));
                for at in self.committed_seq + 1..=seq.min(self.commit_ns.len() as u64 - 1) {
                    self.commit_ns[at as usize] = ns;
                }
                self.committed_seq = self.committed_seq.max(seq);
                if let (Some(timing), Some(histogram)) = (self.timing, self.commit_latency.as_mut()) {
                    for acked in self.acked_command + 1..=command {
                        if timing.is_measured(acked) {
                            histogram::record(histogram, ns.saturating_sub(timing.due_ns(acked)));
                        }
                    }
                }
                self.acked_command = self.acked_command.max(command);
                self.acks += 1;
                self.last_ack_ns = ns;
            }
            "applied" => {
                let (seq, ns) = (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0));
                if slot == self.standby_slot {
                    for at in self.applied_by_slot[slot] + 1..=seq.min(self.applied_ns.len() as u64 - 1) {
                        if self.applied_ns[at as usize] == 0 {
                            self.applied_ns[at as usize] = ns;
                        }
                    }
                    self.lag_seq_max = self.lag_seq_max.max(self.committed_seq.saturating_sub(seq));
                }
                self.applied_by_slot[slot] = self.applied_by_slot[slot].max(seq);
            }
            "leading" => self.leading_ns = Some(monotonic_ns()),
            "state" => {
                let state = words
                    .filter_map(|word| word.split_once('='))
                    .map(|(name, value)| (name.to_string(), value.parse().unwrap_or(0)))
                    .collect();
                self.states[slot] = Some(state);
            }
            "error" => self.errors.push(format!("ledger process {slot}: {}", &line[6.min(line.len())..])),
            _ => {}
        }
    }
}

pub(super) type Shared = Arc<(Mutex<Tally>, Condvar)>;

/// A ledger process this run started; killed (SIGKILL, by its PID) and reaped on drop.
pub(super) struct LedgerChild {
    child: Child,
    stdin: Option<BufWriter<ChildStdin>>,
    reader: Option<JoinHandle<()>>,
}

impl LedgerChild {
    pub(super) fn start(exe: &Path, args: &[String], slot: usize, shared: &Shared) -> anyhow::Result<LedgerChild> {
        let mut child = Command::new(exe)
            .args(["bench", "bank-ledger"])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {} bench bank-ledger", exe.display()))?;
        let stdout = child.stdout.take().expect("stdout is piped");
        let stdin = BufWriter::with_capacity(64 * 1024, child.stdin.take().expect("stdin is piped"));
        let shared = shared.clone();
        let reader = std::thread::Builder::new().name(format!("bank-ledger-{slot}")).spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let (tally, changed) = &*shared;
                tally.lock().expect("tally lock").hear(slot, &line);
                changed.notify_all();
            }
        })?;
        Ok(LedgerChild { child, stdin: Some(stdin), reader: Some(reader) })
    }

    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(super) fn stdin(&mut self) -> &mut BufWriter<ChildStdin> {
        self.stdin.as_mut().expect("the process's stdin is open until it is killed")
    }

    pub(super) fn say(&mut self, line: &str) -> anyhow::Result<()> {
        let stdin = self.stdin();
        stdin.write_all(line.as_bytes())?;
        stdin.write_all(b"\n")?;
        stdin.flush()?;
        Ok(())
    }

    /// SIGKILL, then waits until its output is read to the end, so every acknowledgement it
    /// made before dying is counted.
    pub(super) fn kill_9(&mut self) -> anyhow::Result<()> {
        self.child.kill().context("killing the ledger process")?;
        self.child.wait()?;
        self.stdin = None;
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        Ok(())
    }

    /// Waits (up to `timeout`) for the process to exit after `finish`, and for its output.
    pub(super) fn finish(&mut self, timeout: Duration) -> anyhow::Result<()> {
        self.say("finish")?;
        let deadline = Instant::now() + timeout;
        while self.child.try_wait()?.is_none() {
            if Instant::now() > deadline {
                bail!("the ledger process {} did not finish within {timeout:?}", self.pid());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        Ok(())
    }
}

impl Drop for LedgerChild {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

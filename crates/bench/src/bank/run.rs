//! One run at one rate: the nodes, the two ledger processes, the observer, the open-loop
//! command generator, the kill, the drain and the gate.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::children::{FinalState, LedgerChild, Shared, Tally};
use super::ledger::{Commands, Transfer};
use super::node;
use super::observer::{Observer, Timing};
use super::process::monotonic_ns;
use super::report::{CpuCores, Gate, Percentiles, RunReport};
use super::{BankOptions, Kill, STREAM};
use crate::histogram;
use crate::server::ServerProcess;

/// How long the log may take to reach the expected sequence everywhere after the schedule
/// ends, before the run is called incomplete.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(60);
/// A generator this far ahead of a due time sleeps (flushing first); closer, it writes on, so
/// at high rates it sends every command due in one write instead of sleeping per command.
const SLEEP_THRESHOLD_NS: u64 = 50_000;

/// Where each party of the run talks to the cluster.
struct Placement {
    ledger_node: usize,
    standby_node: usize,
    observer_node: usize,
}

fn ledger_args(options: &BankOptions, addresses: &[String], role: &str, node: usize, epoch: u64) -> Vec<String> {
    vec![
        "--role".into(),
        role.into(),
        "--nodes".into(),
        addresses.join(","),
        "--node".into(),
        node.to_string(),
        "--stream".into(),
        STREAM.into(),
        "--accounts".into(),
        options.accounts.to_string(),
        "--initial-balance".into(),
        options.initial_balance.to_string(),
        "--epoch".into(),
        epoch.to_string(),
        "--batch-max".into(),
        options.batch_max.to_string(),
        "--per-record".into(),
        options.per_record.to_string(),
    ]
}

/// Runs the ledger at `rate` against `node_count` nodes (3: the cluster; 1: the floor).
pub fn run(options: &BankOptions, rate: u64, node_count: usize, progress: bool) -> anyhow::Result<RunReport> {
    let (mut nodes, placement) = if node_count == 1 {
        let node = ServerProcess::start(&options.exe, &options.dir, &[]).context("starting onehop serve")?;
        (vec![node], Placement { ledger_node: 0, standby_node: 0, observer_node: 0 })
    } else {
        let (nodes, leader) = crate::target::cluster::start_nodes(&options.exe, &options.dir, node_count)?;
        // The ledger writes to the Raft leader (no forwarding hop), the standby and the
        // observer read on the two followers.
        let ledger_node = leader as usize - 1;
        let standby_node = (ledger_node + 1) % node_count;
        let observer_node = (ledger_node + 2) % node_count;
        (nodes, Placement { ledger_node, standby_node, observer_node })
    };
    let addresses: Vec<String> = nodes.iter().map(|node| node.url.trim_start_matches("http://").to_string()).collect();
    node::sql(&addresses[placement.ledger_node], &format!("CREATE STREAM {STREAM} WITH (partitions = 1)"))?;

    let rate_hz = rate as f64;
    let total = ((options.warmup + options.duration).as_secs_f64() * rate_hz).round() as u64;
    if total == 0 {
        bail!("{rate} tx/s for {:?} is no transaction at all", options.warmup + options.duration);
    }
    let measured_first = (options.warmup.as_secs_f64() * rate_hz).round() as u64 + 1;
    let kill_at = match options.kill {
        Kill::None => None,
        _ => Some(((options.warmup.as_secs_f64() + options.duration.as_secs_f64() / 2.0) * rate_hz) as u64),
    };

    let shared: Shared = Arc::new((
        Mutex::new(Tally {
            commit_ns: vec![0; total as usize + 1],
            applied_ns: vec![0; total as usize + 1],
            leader_slot: 0,
            standby_slot: 1,
            ..Tally::default()
        }),
        Condvar::new(),
    ));
    let mut children = vec![
        LedgerChild::start(
            &options.exe,
            &ledger_args(options, &addresses, "leader", placement.ledger_node, 1),
            0,
            &shared,
        )?,
        LedgerChild::start(
            &options.exe,
            &ledger_args(options, &addresses, "standby", placement.standby_node, 2),
            1,
            &shared,
        )?,
    ];
    let (mut leader, mut standby) = (0, 1);
    // The schedule starts once the processes are up and subscribed.
    std::thread::sleep(Duration::from_millis(300));
    let start_ns = monotonic_ns() + 100_000_000;
    let timing = Timing { start_ns, rate: rate_hz, measured_first, measured_last: total };
    {
        let mut tally = shared.0.lock().expect("tally lock");
        tally.timing = Some(timing);
        tally.commit_latency = Some(histogram::latency_histogram());
    }
    let observer = Observer::start(addresses[placement.observer_node].clone(), timing, total)?;

    let sent = Arc::new(AtomicU64::new(0));
    let bar = super::progress::Bar::start(
        progress,
        format!("{} {rate} tx/s", if node_count == 1 { "1 node" } else { "cluster" }),
        total,
        sent.clone(),
        {
            let shared = shared.clone();
            move || {
                let tally = shared.0.lock().expect("tally lock");
                (tally.committed_seq, tally.applied_by_slot[tally.standby_slot])
            }
        },
        observer.seq.clone(),
    );

    let mut commands = Commands::new(options.seed, options.accounts, options.amount_max);
    let mut history: Vec<Transfer> = Vec::new();
    let mut cpu_before = None;
    let mut cpu_before_host = None;
    let mut killed_ns = None;
    let mut line = String::with_capacity(64);
    for command in 1..=total {
        let due_ns = timing.due_ns(command);
        let now_ns = monotonic_ns();
        if due_ns > now_ns + SLEEP_THRESHOLD_NS {
            children[leader].stdin().flush()?;
            std::thread::sleep(Duration::from_nanos(due_ns - now_ns));
        }
        if command == measured_first {
            cpu_before = Some(cpu_sample(&nodes, &children));
            cpu_before_host = Some(crate::host::HostUsage::take(monotonic_ns(), &[]));
        }
        let transfer = commands.draw(command);
        if options.kill == Kill::Ledger {
            history.push(transfer);
        }
        line.clear();
        use std::fmt::Write as _;
        writeln!(line, "t {} {} {} {}", transfer.command, transfer.from, transfer.to, transfer.amount)?;
        children[leader].stdin().write_all(line.as_bytes())?;
        sent.store(command, Ordering::Relaxed);
        if Some(command) == kill_at {
            children[leader].stdin().flush()?;
            killed_ns = Some(monotonic_ns());
            match options.kill {
                Kill::Ledger => {
                    children[leader].kill_9()?;
                    // The standby takes over; every command without an acknowledgement is
                    // sent to it again, with its id, and a new standby follows the log.
                    let acked = {
                        let mut tally = shared.0.lock().expect("tally lock");
                        tally.leader_slot = standby;
                        tally.standby_slot = 2;
                        tally.acked_command
                    };
                    children[standby].say("takeover")?;
                    for transfer in &history[acked as usize..command as usize] {
                        line.clear();
                        writeln!(line, "t {} {} {} {}", transfer.command, transfer.from, transfer.to, transfer.amount)?;
                        children[standby].stdin().write_all(line.as_bytes())?;
                    }
                    children[standby].stdin().flush()?;
                    let args = ledger_args(options, &addresses, "standby", placement.ledger_node, 3);
                    children.push(LedgerChild::start(&options.exe, &args, 2, &shared)?);
                    (leader, standby) = (standby, 2);
                }
                Kill::Node => nodes[placement.ledger_node].kill_9()?,
                Kill::None => {}
            }
        }
    }
    children[leader].stdin().flush()?;
    let schedule_end_ns = monotonic_ns();
    let cpu_after = cpu_sample(&nodes, &children);

    // Drain: until the leader committed, the standby applied and the observer saw everything.
    let deadline = Instant::now() + DRAIN_TIMEOUT;
    loop {
        let (tally, changed) = &*shared;
        let tally = changed.wait_timeout(tally.lock().expect("tally lock"), Duration::from_millis(50)).expect("lock").0;
        let done = tally.committed_seq >= total
            && tally.applied_by_slot[tally.standby_slot] >= total
            && observer.seq.load(Ordering::Relaxed) >= total;
        if done || !tally.errors.is_empty() || Instant::now() > deadline {
            break;
        }
    }
    let finished = [leader, standby].map(|index| children[index].finish(Duration::from_secs(10)));
    let observed = observer.finish()?;
    bar.finish();
    let tally = shared.0.lock().expect("tally lock");
    let mut problems: Vec<String> = tally.errors.clone();
    problems.extend(finished.into_iter().filter_map(|result| result.err().map(|error| format!("{error:#}"))));
    let leader_state = tally.states[tally.leader_slot].clone().unwrap_or_default();
    let standby_state = tally.states[tally.standby_slot].clone().unwrap_or_default();
    let value = |state: &FinalState, name: &str| state.get(name).copied().unwrap_or(0);
    let expected_sum = u64::from(options.accounts) * options.initial_balance;
    let gate = Gate {
        expected_seq: total,
        leader_committed: value(&leader_state, "committed"),
        standby_durable: value(&standby_state, "durable"),
        standby_applied: value(&standby_state, "applied"),
        observed: observed.seq,
        observer_gaps: observed.gaps,
        balances_equal: !leader_state.is_empty()
            && value(&leader_state, "digest") == value(&standby_state, "digest")
            && value(&leader_state, "applied") == value(&standby_state, "applied"),
        sum_conserved: value(&leader_state, "sum") == expected_sum && value(&standby_state, "sum") == expected_sum,
    };
    if !gate.holds() {
        problems.push(gate.describe_failure());
    }

    let (mut lag, mut delivery) = (histogram::latency_histogram(), histogram::latency_histogram());
    for seq in measured_first..=total.min(tally.committed_seq) {
        let (commit, applied) = (tally.commit_ns[seq as usize], tally.applied_ns[seq as usize]);
        if commit > 0 && applied > 0 {
            histogram::record(&mut lag, applied.saturating_sub(commit));
        }
        let received = observed.received_ns.get(seq as usize).copied().unwrap_or(0);
        if commit > 0 && received > 0 {
            histogram::record(&mut delivery, received.saturating_sub(commit));
        }
    }
    let measured = total - measured_first + 1;
    let last_ack_ns = tally.last_ack_ns.max(start_ns + 1);
    let elapsed_s = (last_ack_ns - start_ns) as f64 / 1e9;
    let cpu = cpu_before.map(|before| CpuCores::between(&before, &cpu_after, node_count));
    drop(tally);
    let tally = shared.0.lock().expect("tally lock");
    let report = RunReport {
        kind: "bank_run",
        nodes: node_count,
        kill: options.kill.name(),
        target_tx_per_s: rate,
        achieved_tx_per_s: (tally.committed_seq as f64 / elapsed_s).min(rate_hz * 10.0),
        transactions: total,
        measured_transactions: measured,
        rejected: value(&leader_state, "rejected"),
        tx_per_publish: tally.committed_seq as f64 / tally.acks.max(1) as f64,
        publish_round_trip_ms: ["publish_p50_us", "publish_p99_us", "publish_max_us"]
            .map(|name| value(&leader_state, name) as f64 / 1e3),
        publication_ms: Percentiles::of(&observed.publication),
        commit_ms: tally.commit_latency.as_ref().map(Percentiles::of).unwrap_or_default(),
        delivery_after_commit_ms: Percentiles::of(&delivery),
        standby_lag_ms: Percentiles::of(&lag),
        standby_lag_seq_max: tally.lag_seq_max,
        takeover_ms: match (killed_ns, tally.leading_ns) {
            (Some(killed), Some(leading)) => Some(leading.saturating_sub(killed) as f64 / 1e6),
            _ => None,
        },
        standby_duplicates_skipped: value(&standby_state, "duplicates"),
        fenced: value(&standby_state, "fenced") + observed.fenced,
        observer_duplicates_skipped: observed.duplicates,
        unknown_outcomes: value(&leader_state, "unknown_outcomes"),
        republished: value(&leader_state, "republished"),
        passes_latency: false,
        gate,
        cpu_cores: cpu,
        host: cpu_before_host
            .map(|before| crate::host::HostUsage::take(cpu_after.wall_ns, &[]).since(&before).summary()),
        schedule_s: (schedule_end_ns.saturating_sub(start_ns)) as f64 / 1e9,
        problems,
    }
    .judged();
    drop(tally);
    drop(children);
    drop(nodes);
    Ok(report)
}

/// CPU time so far of each node, each ledger process, and this process, with the time.
pub struct CpuSample {
    pub wall_ns: u64,
    /// Every CPU's busy time on the machine (everything but idle and I/O wait), whoever used it.
    pub machine_busy_ns: u64,
    pub nodes_ns: Vec<u64>,
    pub ledgers_ns: Vec<u64>,
    pub harness_ns: u64,
}

fn cpu_sample(nodes: &[ServerProcess], children: &[LedgerChild]) -> CpuSample {
    let of = |pid: u32| crate::host::process_cpu_ns(pid).unwrap_or(0);
    CpuSample {
        wall_ns: monotonic_ns(),
        machine_busy_ns: machine_busy_ns(),
        nodes_ns: nodes.iter().map(|node| of(node.pid())).collect(),
        ledgers_ns: children.iter().map(|child| of(child.pid())).collect(),
        harness_ns: crate::host::own_cpu_ns(),
    }
}

/// Busy CPU time of the whole machine so far, from the first line of /proc/stat.
fn machine_busy_ns() -> u64 {
    let Ok(stat) = std::fs::read_to_string("/proc/stat") else { return 0 };
    let Some(line) = stat.lines().next() else { return 0 };
    let ticks: Vec<u64> = line.split_whitespace().skip(1).filter_map(|word| word.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal …: busy is all but idle and iowait.
    let busy: u64 =
        ticks.iter().take(8).enumerate().filter(|(index, _)| *index != 3 && *index != 4).map(|(_, t)| t).sum();
    // SAFETY: sysconf takes no pointers.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    busy * 1_000_000_000 / per_second
}

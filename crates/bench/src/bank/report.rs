//! A run's figures, the gate, and how they are printed: a table, JSON lines, summary.md and an
//! SVG of latency against rate.

use hdrhistogram::Histogram;
use serde::Serialize;

use super::run::CpuSample;
use crate::plot::{Chart, Series};

/// The study's latency limits on publication: p95 under 7 ms, p99 under 10 ms.
pub const P95_LIMIT_MS: f64 = 7.0;
pub const P99_LIMIT_MS: f64 = 10.0;

/// Latency percentiles in milliseconds.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Percentiles {
    pub count: u64,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

impl Percentiles {
    pub fn of(histogram: &Histogram<u64>) -> Percentiles {
        let figures = crate::histogram::Percentiles::of(histogram);
        let ms = |ns: u64| ns as f64 / 1e6;
        Percentiles {
            count: figures.count,
            p50: ms(figures.p50_ns),
            p95: ms(figures.p95_ns),
            p99: ms(figures.p99_ns),
            p999: ms(figures.p999_ns),
            max: ms(figures.max_ns),
        }
    }
}

/// The completeness gate: every party reached the expected sequence, nothing was skipped, and
/// both ledgers hold the same balances, whose sum is what it was at the start.
#[derive(Clone, Debug, Serialize)]
pub struct Gate {
    pub expected_seq: u64,
    pub leader_committed: u64,
    pub standby_durable: u64,
    pub standby_applied: u64,
    pub observed: u64,
    pub observer_gaps: u64,
    pub balances_equal: bool,
    pub sum_conserved: bool,
}

impl Gate {
    pub fn holds(&self) -> bool {
        let expected = self.expected_seq;
        self.leader_committed == expected
            && self.standby_durable == expected
            && self.standby_applied == expected
            && self.observed == expected
            && self.observer_gaps == 0
            && self.balances_equal
            && self.sum_conserved
    }

    pub fn describe_failure(&self) -> String {
        format!(
            "gate failed: expected sequence {}, leader committed {}, standby durable {} and applied {}, observer {} ({} gaps), balances equal {}, sum conserved {}",
            self.expected_seq,
            self.leader_committed,
            self.standby_durable,
            self.standby_applied,
            self.observed,
            self.observer_gaps,
            self.balances_equal,
            self.sum_conserved
        )
    }
}

/// Cores each party used over the measured window (CPU seconds per second).
#[derive(Clone, Debug, Serialize)]
pub struct CpuCores {
    pub nodes: Vec<f64>,
    pub nodes_total: f64,
    pub ledger_processes: Vec<f64>,
    pub harness: f64,
    /// The whole machine's busy cores, and what of them none of this run's processes used
    /// (another engineer's build, the kernel's own threads).
    pub machine: f64,
    pub others: f64,
}

impl CpuCores {
    pub fn between(before: &CpuSample, after: &CpuSample, node_count: usize) -> CpuCores {
        let wall = after.wall_ns.saturating_sub(before.wall_ns).max(1) as f64;
        let cores = |after: u64, before: u64| after.saturating_sub(before) as f64 / wall;
        let nodes: Vec<f64> =
            (0..node_count).map(|index| cores(after.nodes_ns[index], before.nodes_ns[index])).collect();
        let ledger_processes: Vec<f64> = after
            .ledgers_ns
            .iter()
            .enumerate()
            .map(|(index, after)| cores(*after, before.ledgers_ns.get(index).copied().unwrap_or(0)))
            .collect();
        let nodes_total: f64 = nodes.iter().sum();
        let ledgers_total: f64 = ledger_processes.iter().sum();
        let harness = cores(after.harness_ns, before.harness_ns);
        let machine = cores(after.machine_busy_ns, before.machine_busy_ns);
        CpuCores {
            nodes_total,
            nodes,
            ledger_processes,
            harness,
            machine,
            others: (machine - nodes_total - ledgers_total - harness).max(0.0),
        }
    }
}

/// One run's figures: a JSON line of `--json`, a row of the table.
#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    pub kind: &'static str,
    pub nodes: usize,
    pub kill: &'static str,
    pub target_tx_per_s: u64,
    /// Sequences committed over the time from the schedule's start to the last commit.
    pub achieved_tx_per_s: f64,
    pub transactions: u64,
    pub measured_transactions: u64,
    pub rejected: u64,
    pub tx_per_publish: f64,
    /// The leader's publishes, request written to answer read (the last leader's, after a
    /// takeover): p50, p99 and the longest, in ms.
    pub publish_round_trip_ms: [f64; 3],
    /// Observer receipt minus the command's scheduled time, over the measured window.
    pub publication_ms: Percentiles,
    /// Scheduled time to the leader's commit acknowledgement (in the ledger process), per
    /// measured command: the first part of publication latency.
    pub commit_ms: Percentiles,
    /// The leader's commit acknowledgement to the observer's receipt, per sequence: the
    /// second part (the commit reaching a follower, its apply, the SSE delivery).
    pub delivery_after_commit_ms: Percentiles,
    /// Standby apply time minus the leader's commit acknowledgement, per sequence.
    pub standby_lag_ms: Percentiles,
    pub standby_lag_seq_max: u64,
    /// From the kill to the standby leading (`--kill ledger`).
    pub takeover_ms: Option<f64>,
    pub standby_duplicates_skipped: u64,
    pub fenced: u64,
    pub observer_duplicates_skipped: u64,
    pub unknown_outcomes: u64,
    pub republished: u64,
    pub gate: Gate,
    /// The gate holds and publication p95 and p99 are under the study's limits.
    pub passes_latency: bool,
    pub cpu_cores: Option<CpuCores>,
    /// The machine over the measured window: CPU and I/O pressure, steal.
    pub host: Option<crate::host::HostSummary>,
    pub schedule_s: f64,
    pub problems: Vec<String>,
}

impl RunReport {
    pub fn judged(mut self) -> RunReport {
        self.passes_latency = self.publication_ms.p95 < P95_LIMIT_MS && self.publication_ms.p99 < P99_LIMIT_MS;
        self
    }

    pub fn passes(&self) -> bool {
        self.passes_latency && self.gate.holds()
    }
}

/// The sweep's verdict: the highest rate whose run passes.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    pub kind: &'static str,
    pub nodes: usize,
    pub kill: &'static str,
    pub highest_passing_tx_per_s: Option<u64>,
    pub gate_held_everywhere: bool,
    pub command: String,
}

pub fn summarize(runs: &[RunReport], nodes: usize, kill: &'static str, command: &str) -> Summary {
    let of_nodes = runs.iter().filter(|run| run.nodes == nodes);
    Summary {
        kind: "bank_summary",
        nodes,
        kill,
        highest_passing_tx_per_s: of_nodes.clone().filter(|run| run.passes()).map(|run| run.target_tx_per_s).max(),
        gate_held_everywhere: of_nodes.clone().all(|run| run.gate.holds()),
        command: command.to_string(),
    }
}

/// The table printed at the end, one row per run.
pub fn table(runs: &[RunReport]) -> String {
    let mut text = String::from(
        "| nodes | kill | target tx/s | achieved tx/s | publication p50 / p95 / p99 ms | of which to commit p50 / p99 | commit to observer p50 / p99 | standby lag p50 / p99 ms | tx per publish | CPU cores: nodes (each), ledgers, harness, others | CPU pressure | gate | passes |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for run in runs {
        let cpu = run.cpu_cores.as_ref().map_or("–".to_string(), |cpu| {
            format!(
                "{:.2} ({}), {:.2}, {:.2}, {:.2}",
                cpu.nodes_total,
                cpu.nodes.iter().map(|cores| format!("{cores:.2}")).collect::<Vec<_>>().join(" "),
                cpu.ledger_processes.iter().sum::<f64>(),
                cpu.harness,
                cpu.others
            )
        });
        let pressure =
            run.host.and_then(|host| host.cpu_pressure_pct).map_or("–".to_string(), |pct| format!("{pct:.0} %"));
        text.push_str(&format!(
            "| {} | {} | {} | {:.0} | {:.2} / {:.2} / {:.2} | {:.2} / {:.2} | {:.2} / {:.2} | {:.2} / {:.2} | {:.0} | {cpu} | {pressure} | {} | {} |\n",
            run.nodes,
            run.kill,
            run.target_tx_per_s,
            run.achieved_tx_per_s,
            run.publication_ms.p50,
            run.publication_ms.p95,
            run.publication_ms.p99,
            run.commit_ms.p50,
            run.commit_ms.p99,
            run.delivery_after_commit_ms.p50,
            run.delivery_after_commit_ms.p99,
            run.standby_lag_ms.p50,
            run.standby_lag_ms.p99,
            run.tx_per_publish,
            if run.gate.holds() { "holds" } else { "FAILS" },
            if run.passes() { "yes" } else { "no" },
        ));
    }
    text
}

/// Publication latency percentiles against the target rate, one line per percentile and
/// cluster size, with the study's two limits.
pub fn chart(runs: &[RunReport]) -> String {
    let mut series = Vec::new();
    let mut sizes: Vec<usize> = runs.iter().map(|run| run.nodes).collect();
    sizes.sort_unstable();
    sizes.dedup();
    for nodes in sizes {
        let label = if nodes == 1 { "1 node" } else { "3 nodes" };
        let of = |pick: fn(&Percentiles) -> f64| -> Vec<(f64, f64)> {
            runs.iter()
                .filter(|run| run.nodes == nodes)
                .map(|run| (run.target_tx_per_s as f64, pick(&run.publication_ms).max(0.01)))
                .collect()
        };
        series.push(Series { name: format!("{label} p50"), points: of(|p| p.p50) });
        series.push(Series { name: format!("{label} p95"), points: of(|p| p.p95) });
        series.push(Series { name: format!("{label} p99"), points: of(|p| p.p99) });
    }
    let rates: Vec<f64> = runs.iter().map(|run| run.target_tx_per_s as f64).collect();
    let (low, high) = rates.iter().fold((f64::MAX, f64::MIN), |(low, high), rate| (low.min(*rate), high.max(*rate)));
    if low <= high {
        series.push(Series { name: "p95 limit 7 ms".into(), points: vec![(low, P95_LIMIT_MS), (high, P95_LIMIT_MS)] });
        series.push(Series { name: "p99 limit 10 ms".into(), points: vec![(low, P99_LIMIT_MS), (high, P99_LIMIT_MS)] });
    }
    Chart {
        title: "onehop bench bank: publication latency against rate".into(),
        x_label: "target rate (tx/s)".into(),
        y_label: "latency (ms)".into(),
        x_log: true,
        x_range: None,
        y_log: true,
        series,
        x_tick_labels: Vec::new(),
    }
    .to_svg()
}

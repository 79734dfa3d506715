//! `onehop bench bank`: study 3 of ../shared/BENCHMARKS.md on onehop — a leader/standby ledger
//! on a replicated log.
//!
//! # Layout
//!
//! - `ledger`: balances, transfers, the leader's decisions and the standby's replay, the log's
//!   record format, the seeded commands (no I/O; unit-tested).
//! - `node`: blocking HTTP/1.1 to the nodes — the group-commit publisher with its
//!   unknown-outcome recovery, and an SSE reader.
//! - `process`: one ledger process (`onehop bench bank-ledger`), leader or standby, driven by
//!   the harness over its stdin and stdout.
//! - `run`: one run at one rate — nodes, the open-loop generator, the kill, the drain, the
//!   gate; `children`: the ledger processes it starts and hears; `observer`: the harness's
//!   own reader of the log.
//! - `report`: figures, gate, table, JSON, SVG; `progress`: the bar.
//!
//! # What runs
//!
//! Three `onehop serve` nodes form a cluster; the transaction log is the one-partition stream
//! [`STREAM`]. The harness sends transfers on an open-loop schedule to the ledger leader (a
//! child process), which applies them to its balances, numbers them, and publishes them to
//! the Raft leader node in one NDJSON request per batch (one Raft entry): while a batch is
//! out, the next one gathers. The standby (another child) follows the log on a second node
//! and applies it; the observer (a thread of the harness) follows it on the third and times
//! each transaction against its command's scheduled time.

mod children;
pub mod ledger;
pub mod node;
mod observer;
pub mod process;
mod progress;
pub mod report;
mod run;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::bail;

pub use report::{RunReport, Summary};

/// The transaction log's stream.
pub const STREAM: &str = "bank_tx";
/// The rates of the study's sweep.
pub const RATES_DEFAULT: [u64; 6] = [5_000, 10_000, 20_000, 50_000, 100_000, 150_000];

/// What to kill halfway through the measured window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kill {
    None,
    /// The ledger leader process (kill -9): the standby takes over.
    Ledger,
    /// The Raft leader node, which the ledger publishes to (kill -9).
    Node,
}

impl Kill {
    pub fn parse(text: &str) -> anyhow::Result<Kill> {
        match text {
            "none" => Ok(Kill::None),
            "ledger" => Ok(Kill::Ledger),
            "node" => Ok(Kill::Node),
            other => bail!("--kill takes none, ledger or node, not {other:?}"),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Kill::None => "none",
            Kill::Ledger => "ledger",
            Kill::Node => "node",
        }
    }
}

#[derive(Clone, Debug)]
pub struct BankOptions {
    /// The onehop executable: the nodes and the ledger processes.
    pub exe: PathBuf,
    /// Where the nodes keep their data.
    pub dir: PathBuf,
    pub rates: Vec<u64>,
    pub duration: Duration,
    pub warmup: Duration,
    pub accounts: u32,
    pub initial_balance: u64,
    /// Transfers move 1 to this much.
    pub amount_max: u64,
    pub kill: Kill,
    /// Transactions in one publish at most.
    pub batch_max: usize,
    /// Transactions in one record of the log.
    pub per_record: usize,
    /// Also run each rate against one node, for the cost of replication.
    pub floor: bool,
    pub seed: u64,
    pub progress: bool,
    pub command: String,
}

impl BankOptions {
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.rates.is_empty() || self.rates.contains(&0) {
            bail!("--rates needs one or more positive rates");
        }
        if self.accounts < 2 {
            bail!("--accounts must be at least 2: a transfer moves money between two accounts");
        }
        if self.amount_max == 0 || self.initial_balance == 0 {
            bail!("--initial-balance and --amount-max must be positive");
        }
        if self.accounts as u128 * self.initial_balance as u128 > u64::MAX as u128 / 2 {
            bail!("--accounts × --initial-balance must fit in 63 bits");
        }
        if !(1..=100_000).contains(&self.batch_max) || !(1..=10_000).contains(&self.per_record) {
            bail!("--batch-max must be 1 to 100000 and --per-record 1 to 10000");
        }
        if self.floor && self.kill != Kill::None {
            bail!("--floor runs one node, which has no standby node to fail over to: use it with --kill none");
        }
        Ok(())
    }
}

/// Runs every rate (and, with `floor`, every rate on one node too), one after another.
pub fn run(options: &BankOptions) -> anyhow::Result<Vec<RunReport>> {
    options.validate()?;
    let mut reports = Vec::new();
    let mut sizes = vec![3];
    if options.floor {
        sizes.push(1);
    }
    for rate in &options.rates {
        for nodes in &sizes {
            let report = run::run(options, *rate, *nodes, options.progress)?;
            if options.progress {
                eprintln!(
                    "{} node(s), {rate} tx/s: achieved {:.0}, publication p50 {:.2} / p95 {:.2} / p99 {:.2} ms, gate {}",
                    nodes,
                    report.achieved_tx_per_s,
                    report.publication_ms.p50,
                    report.publication_ms.p95,
                    report.publication_ms.p99,
                    if report.gate.holds() { "holds" } else { "FAILS" }
                );
            }
            reports.push(report);
        }
    }
    Ok(reports)
}

/// The summary lines: the cluster's, then the floor's when it ran.
pub fn summaries(options: &BankOptions, reports: &[RunReport]) -> Vec<Summary> {
    let mut sizes = vec![3];
    if options.floor {
        sizes.push(1);
    }
    sizes.into_iter().map(|nodes| report::summarize(reports, nodes, options.kill.name(), &options.command)).collect()
}

/// Writes results.json (one line per run and summary), summary.md and bank-latency.svg.
pub fn write_out(dir: &std::path::Path, reports: &[RunReport], summaries: &[Summary]) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut lines = String::new();
    for report in reports {
        lines.push_str(&serde_json::to_string(report)?);
        lines.push('\n');
    }
    for summary in summaries {
        lines.push_str(&serde_json::to_string(summary)?);
        lines.push('\n');
    }
    std::fs::write(dir.join("results.json"), lines)?;
    let mut markdown =
        format!("# onehop bench bank\n\n    {}\n\n", summaries.first().map_or("", |s| s.command.as_str()));
    markdown.push_str(&report::table(reports));
    for summary in summaries {
        markdown.push_str(&format!(
            "\n{} node(s): highest passing rate {}\n",
            summary.nodes,
            summary.highest_passing_tx_per_s.map_or("none".to_string(), |rate| format!("{rate} tx/s"))
        ));
    }
    for report in reports {
        for problem in &report.problems {
            markdown.push_str(&format!("\n- {} node(s) at {} tx/s: {problem}", report.nodes, report.target_tx_per_s));
        }
    }
    std::fs::write(dir.join("summary.md"), markdown)?;
    std::fs::write(dir.join("bank-latency.svg"), report::chart(reports))?;
    Ok(())
}

//! What the machine did besides the workload during a run: the CPU time the harness process
//! and a server it started used, the kernel's pressure stall information (PSI: how much of the
//! time some task waited for a CPU, or for I/O), and the CPU time the hypervisor took from this
//! VM's CPUs for others (steal). On a small, shared VM a run's tail often
//! says more about these than about the target; recording them per run lets a reader tell a
//! slow target from a busy machine.

use serde::Serialize;

/// The counters: as read at one moment ([`HostUsage::take`]), or what they counted over a run
/// or several ([`HostUsage::since`], [`HostUsage::merge`]). A counter the machine does not have
/// is `None`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HostUsage {
    wall_ns: u64,
    harness_cpu_ns: u64,
    target_cpu_ns: Option<u64>,
    cpu_some_us: Option<u64>,
    io_some_us: Option<u64>,
    io_full_us: Option<u64>,
    steal_ns: Option<u64>,
}

/// What meta.json says: cores used on average, and the share of the time stalled.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct HostSummary {
    pub seconds: f64,
    /// CPU time of the harness process ÷ wall time (the echo target's threads included, since
    /// it runs in the harness).
    pub harness_cores: f64,
    /// CPU time of the server the harness started ÷ wall time; `None` for `--url` and the echo.
    pub target_cores: Option<f64>,
    /// Share of the time at least one task waited for a CPU (PSI `cpu some`), in %.
    pub cpu_pressure_pct: Option<f64>,
    /// Share of the time at least one task waited for I/O (PSI `io some`), in %.
    pub io_pressure_pct: Option<f64>,
    /// Share of the time every non-idle task waited for I/O (PSI `io full`), in %.
    pub io_full_pct: Option<f64>,
    /// CPU time the hypervisor ran something else on this VM's CPUs while they had work
    /// (`steal` in /proc/stat), summed over the CPUs, in ms: a stretch the whole VM stood still.
    pub cpu_steal_ms: Option<f64>,
}

/// The `total=` (µs) of the `some` or `full` line of a PSI file.
pub fn psi_total(text: &str, kind: &str) -> Option<u64> {
    let line = text.lines().find(|line| line.split_whitespace().next() == Some(kind))?;
    line.split_whitespace().find_map(|field| field.strip_prefix("total="))?.parse().ok()
}

fn psi(resource: &str, kind: &str) -> Option<u64> {
    psi_total(&std::fs::read_to_string(format!("/proc/pressure/{resource}")).ok()?, kind)
}

/// The `steal` ticks of the all-CPU line of /proc/stat (its eighth number).
pub fn steal_ticks(stat: &str) -> Option<u64> {
    let line = stat.lines().find(|line| line.split_whitespace().next() == Some("cpu"))?;
    line.split_whitespace().nth(8)?.parse().ok()
}

fn steal_ns() -> Option<u64> {
    let ticks = steal_ticks(&std::fs::read_to_string("/proc/stat").ok()?)?;
    Some(ticks * 1_000_000_000 / clock_ticks_per_second())
}

fn clock_ticks_per_second() -> u64 {
    // SAFETY: sysconf takes no pointers.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as u64 } else { 100 }
}

/// User + system CPU time of process `pid` from /proc, in ns.
pub fn process_cpu_ns(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields are counted after its last ')'.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(ticks * 1_000_000_000 / clock_ticks_per_second())
}

pub fn own_cpu_ns() -> u64 {
    // SAFETY: getrusage writes into the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return 0;
    }
    let ns = |time: libc::timeval| time.tv_sec as u64 * 1_000_000_000 + time.tv_usec as u64 * 1_000;
    ns(usage.ru_utime) + ns(usage.ru_stime)
}

impl HostUsage {
    /// Reads the counters now; `wall_ns` on the run's clock, `target_pids` the processes of a
    /// target the harness started (a server, or a peer's brokers), their CPU summed.
    pub fn take(wall_ns: u64, target_pids: &[u32]) -> HostUsage {
        let target_cpu_ns = if target_pids.is_empty() {
            None
        } else {
            target_pids.iter().map(|pid| process_cpu_ns(*pid)).sum::<Option<u64>>()
        };
        HostUsage {
            wall_ns,
            harness_cpu_ns: own_cpu_ns(),
            target_cpu_ns,
            cpu_some_us: psi("cpu", "some"),
            io_some_us: psi("io", "some"),
            io_full_us: psi("io", "full"),
            steal_ns: steal_ns(),
        }
    }

    /// What was used between `before` and this reading.
    pub fn since(&self, before: &HostUsage) -> HostUsage {
        let delta = |after: Option<u64>, before: Option<u64>| Some(after?.saturating_sub(before?));
        HostUsage {
            wall_ns: self.wall_ns.saturating_sub(before.wall_ns),
            harness_cpu_ns: self.harness_cpu_ns.saturating_sub(before.harness_cpu_ns),
            target_cpu_ns: delta(self.target_cpu_ns, before.target_cpu_ns),
            cpu_some_us: delta(self.cpu_some_us, before.cpu_some_us),
            io_some_us: delta(self.io_some_us, before.io_some_us),
            io_full_us: delta(self.io_full_us, before.io_full_us),
            steal_ns: delta(self.steal_ns, before.steal_ns),
        }
    }

    /// Adds another run's.
    pub fn merge(&mut self, other: &HostUsage) {
        let add = |mine: Option<u64>, theirs: Option<u64>| Some(mine? + theirs?);
        self.wall_ns += other.wall_ns;
        self.harness_cpu_ns += other.harness_cpu_ns;
        self.target_cpu_ns = add(self.target_cpu_ns, other.target_cpu_ns);
        self.cpu_some_us = add(self.cpu_some_us, other.cpu_some_us);
        self.io_some_us = add(self.io_some_us, other.io_some_us);
        self.io_full_us = add(self.io_full_us, other.io_full_us);
        self.steal_ns = add(self.steal_ns, other.steal_ns);
    }

    pub fn summary(&self) -> HostSummary {
        let wall_ns = self.wall_ns.max(1) as f64;
        let share = |us: Option<u64>| us.map(|us| (us as f64 * 1e3 * 100.0 / wall_ns).min(100.0));
        HostSummary {
            seconds: self.wall_ns as f64 / 1e9,
            harness_cores: self.harness_cpu_ns as f64 / wall_ns,
            target_cores: self.target_cpu_ns.map(|ns| ns as f64 / wall_ns),
            cpu_pressure_pct: share(self.cpu_some_us),
            io_pressure_pct: share(self.io_some_us),
            io_full_pct: share(self.io_full_us),
            cpu_steal_ms: self.steal_ns.map(|ns| ns as f64 / 1e6),
        }
    }
}

impl HostSummary {
    /// For the run line and summary.md: `target 1.01 cores, harness 0.31, CPU pressure 45 %`.
    pub fn describe(&self) -> String {
        let mut text = match self.target_cores {
            Some(cores) => format!("target {cores:.2} cores, harness {:.2}", self.harness_cores),
            None => format!("harness {:.2} cores", self.harness_cores),
        };
        if let Some(pct) = self.cpu_pressure_pct {
            text.push_str(&format!(", CPU pressure {pct:.0} %"));
        }
        if let Some(pct) = self.io_pressure_pct {
            text.push_str(&format!(", I/O pressure {pct:.0} %"));
        }
        // Only when there was some: most runs have none, and the line is long enough.
        if let Some(ms) = self.cpu_steal_ms.filter(|ms| *ms > 0.0) {
            text.push_str(&format!(", {ms:.0} ms of CPU stolen by the hypervisor"));
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psi_totals_are_read_by_kind() {
        let text = "some avg10=45.21 avg60=33.19 avg300=19.43 total=4602488543\n\
                    full avg10=0.00 avg60=0.00 avg300=0.00 total=17\n";
        assert_eq!(psi_total(text, "some"), Some(4_602_488_543));
        assert_eq!(psi_total(text, "full"), Some(17));
        assert_eq!(psi_total("some avg10=1.00\n", "some"), None);
        assert_eq!(psi_total("", "some"), None);
    }

    #[test]
    fn steal_is_the_eighth_number_of_the_cpu_line() {
        let stat = "cpu  3027621 77694 1054423 7239916 155529 0 109707 12274 0 0\n\
                    cpu0 1513810 38847 527211 3619958 77764 0 54853 6137 0 0\nintr 1\n";
        assert_eq!(steal_ticks(stat), Some(12_274));
        assert_eq!(steal_ticks("cpu  1 2 3 4 5 6 7\n"), None, "a kernel without the column");
        assert_eq!(steal_ticks("intr 1\n"), None);
    }

    #[test]
    fn a_run_is_what_changed_and_runs_add_up() {
        let before = HostUsage {
            wall_ns: 1_000_000_000,
            harness_cpu_ns: 500_000_000,
            target_cpu_ns: Some(2_000_000_000),
            cpu_some_us: Some(10_000_000),
            io_some_us: Some(1_000),
            io_full_us: None,
            steal_ns: Some(0),
        };
        let after = HostUsage {
            wall_ns: 11_000_000_000,
            harness_cpu_ns: 3_500_000_000,
            target_cpu_ns: Some(12_000_000_000),
            cpu_some_us: Some(14_500_000),
            io_some_us: Some(1_001_000),
            io_full_us: None,
            steal_ns: Some(20_000_000),
        };
        let run = after.since(&before);
        let summary = run.summary();
        assert_eq!(summary.seconds, 10.0);
        assert!((summary.harness_cores - 0.3).abs() < 1e-9 && summary.target_cores == Some(1.0), "{summary:?}");
        assert_eq!(
            (summary.cpu_pressure_pct, summary.io_pressure_pct, summary.io_full_pct),
            (Some(45.0), Some(10.0), None)
        );
        assert_eq!(summary.cpu_steal_ms, Some(20.0));
        assert_eq!(
            summary.describe(),
            "target 1.00 cores, harness 0.30, CPU pressure 45 %, I/O pressure 10 %, 20 ms of CPU stolen by the hypervisor"
        );
        let mut two = run;
        two.merge(&run);
        assert_eq!(two.summary().seconds, 20.0);
        assert_eq!(two.summary().cpu_pressure_pct, Some(45.0));
        assert_eq!(two.summary().cpu_steal_ms, Some(40.0));
        // A run without a started server has no target figure, and neither has their sum.
        let mut without = run;
        without.target_cpu_ns = None;
        without.steal_ns = Some(0);
        two.merge(&without);
        assert_eq!(two.summary().target_cores, None);
        // No steal, nothing said about it.
        assert_eq!(without.summary().describe(), "harness 0.30 cores, CPU pressure 45 %, I/O pressure 10 %");
    }

    #[test]
    fn this_process_and_machine_can_be_read() {
        let before = HostUsage::take(0, &[std::process::id()]);
        // Some CPU for the counters to see.
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_add(i * i);
        }
        assert!(x > 0);
        let after = HostUsage::take(1_000_000_000, &[std::process::id()]);
        let usage = after.since(&before).summary();
        assert!(usage.harness_cores > 0.0, "{usage:?}");
        assert!(usage.target_cores.is_some(), "{usage:?}");
        // Linux has had the steal column since 2.6.11.
        assert!(usage.cpu_steal_ms.is_some_and(|ms| ms >= 0.0), "{usage:?}");
    }
}

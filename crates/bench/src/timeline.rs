//! A run over time. The merged histogram says how long the tail is, not when it happened: per
//! 100 ms slice of the run, this gives the latency of the events due in it beside what the
//! machine did meanwhile (CPU time the hypervisor took, CPU and I/O pressure, cores used), so a
//! reader can see whether the slow stretches line up with the VM standing still, the disk, or
//! neither. Written per run as `timeline.csv` and `timeline.svg`.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::Context as _;

use crate::analysis::RawRow;
use crate::host::{HostSummary, HostUsage};
use crate::plot::{Chart, Series};
use crate::schedule::Clock;

/// The width of a slice.
pub const SLICE: Duration = Duration::from_millis(100);
const SLICE_NS: u64 = SLICE.as_nanos() as u64;

/// Reads the machine's counters at the start of every slice, on a thread of its own (at the
/// process's own priority: it must not push the target aside), and once more when finished,
/// which closes the last slice.
pub struct HostSampler {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Vec<HostUsage>>>,
}

impl HostSampler {
    /// Samples at `first_ns`, `first_ns` + one slice, … on `clock`.
    pub fn start(clock: Clock, first_ns: u64, target_pids: Vec<u32>) -> anyhow::Result<HostSampler> {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::Builder::new().name("bench-host".into()).spawn(move || {
            let mut samples = Vec::new();
            let mut due_ns = first_ns;
            loop {
                let now_ns = clock.now_ns();
                if stopped.load(Ordering::Relaxed) {
                    samples.push(HostUsage::take(now_ns, &target_pids));
                    return samples;
                }
                if now_ns < due_ns {
                    // Until the slice is due, or until a finish unparks it.
                    std::thread::park_timeout(Duration::from_nanos(due_ns - now_ns));
                    continue;
                }
                samples.push(HostUsage::take(now_ns, &target_pids));
                due_ns += SLICE_NS;
            }
        })?;
        Ok(HostSampler { stop, thread: Some(thread) })
    }

    /// Stops sampling and returns the samples, oldest first.
    pub fn finish(mut self) -> Vec<HostUsage> {
        self.stop_thread().unwrap_or_default()
    }

    fn stop_thread(&mut self) -> Option<Vec<HostUsage>> {
        self.stop.store(true, Ordering::Relaxed);
        let thread = self.thread.take()?;
        thread.thread().unpark();
        thread.join().ok()
    }
}

impl Drop for HostSampler {
    fn drop(&mut self) {
        self.stop_thread();
    }
}

/// The latencies of a run by slice of their event's intended send time.
pub struct Timeline {
    start_ns: u64,
    latencies: Vec<Vec<u64>>,
}

/// One slice: its latency samples' percentiles and the machine over it.
#[derive(Clone, Debug, PartialEq)]
pub struct Slice {
    /// Seconds from the schedule's start (warm-up included) to the slice's start.
    pub start_s: f64,
    pub samples: usize,
    /// p50, p99 and max, when the slice has samples.
    pub latency_ns: Option<(u64, u64, u64)>,
    pub host: Option<HostSummary>,
    /// The share of the slice the server was stopped on purpose (`--pause-ms`), in %; `None`
    /// when no pauses were asked for.
    pub target_stopped_pct: Option<f64>,
}

pub const CSV_HEADER: &str = "start_s,samples,latency_p50_ns,latency_p99_ns,latency_max_ns,cpu_steal_ms,\
cpu_pressure_pct,io_pressure_pct,target_cores,harness_cores,target_stopped_pct";

impl Timeline {
    /// Slices start at `start_ns`, the schedule's start on the run's clock.
    pub fn new(start_ns: u64) -> Timeline {
        Timeline { start_ns, latencies: Vec::new() }
    }

    /// Takes a raw row's latency: a delivery's or a view row's (freshness) that was received.
    pub fn record(&mut self, row: &RawRow) {
        if !matches!(row.kind, "delivery" | "fresh") {
            return;
        }
        if let Some(received_ns) = row.received_ns {
            let slice = (row.intended_ns.saturating_sub(self.start_ns) / SLICE_NS) as usize;
            if self.latencies.len() <= slice {
                self.latencies.resize_with(slice + 1, Vec::new);
            }
            self.latencies[slice].push(received_ns.saturating_sub(row.intended_ns));
        }
    }

    /// The slices, given the machine's samples taken at each slice's start and when the
    /// server was stopped on purpose (from, to, on the run's clock; empty when it never was).
    pub fn slices(mut self, host: &[HostUsage], stopped_ns: &[(u64, u64)]) -> Vec<Slice> {
        let start_ns = self.start_ns;
        let count = self.latencies.len().max(host.len().saturating_sub(1));
        self.latencies.resize_with(count, Vec::new);
        self.latencies
            .into_iter()
            .enumerate()
            .map(|(index, mut latencies)| {
                latencies.sort_unstable();
                let rank = |quantile: f64| {
                    latencies[((quantile * latencies.len() as f64).ceil() as usize).clamp(1, latencies.len()) - 1]
                };
                Slice {
                    start_s: index as f64 * SLICE.as_secs_f64(),
                    samples: latencies.len(),
                    latency_ns: (!latencies.is_empty())
                        .then(|| (rank(0.5), rank(0.99), latencies[latencies.len() - 1])),
                    host: host.get(index + 1).map(|after| after.since(&host[index]).summary()),
                    target_stopped_pct: (!stopped_ns.is_empty()).then(|| {
                        let (from, to) = (start_ns + index as u64 * SLICE_NS, start_ns + (index as u64 + 1) * SLICE_NS);
                        let overlap: u64 =
                            stopped_ns.iter().map(|&(begin, end)| end.min(to).saturating_sub(begin.max(from))).sum();
                        overlap as f64 * 100.0 / SLICE_NS as f64
                    }),
                }
            })
            .collect()
    }
}

/// `timeline.csv`: one line per slice; a field is empty where there is nothing to say.
pub fn to_csv(slices: &[Slice]) -> String {
    let mut text = format!("{CSV_HEADER}\n");
    let some = |value: Option<String>| value.unwrap_or_default();
    for slice in slices {
        let host = slice.host.as_ref();
        let _ = writeln!(
            text,
            "{:.1},{},{},{},{},{},{},{},{},{},{}",
            slice.start_s,
            slice.samples,
            some(slice.latency_ns.map(|(p50, _, _)| p50.to_string())),
            some(slice.latency_ns.map(|(_, p99, _)| p99.to_string())),
            some(slice.latency_ns.map(|(_, _, max)| max.to_string())),
            some(host.and_then(|host| host.cpu_steal_ms).map(|ms| format!("{ms:.0}"))),
            some(host.and_then(|host| host.cpu_pressure_pct).map(|pct| format!("{pct:.1}"))),
            some(host.and_then(|host| host.io_pressure_pct).map(|pct| format!("{pct:.1}"))),
            some(host.and_then(|host| host.target_cores).map(|cores| format!("{cores:.2}"))),
            some(host.map(|host| format!("{:.2}", host.harness_cores))),
            some(slice.target_stopped_pct.map(|pct| format!("{pct:.1}"))),
        );
    }
    text
}

/// `timeline.svg`: latency by slice above, the machine by slice below, on one time axis.
pub fn to_svg(title: &str, slices: &[Slice]) -> String {
    let seconds = slices.len() as f64 * SLICE.as_secs_f64();
    let step = [1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0].into_iter().find(|step| seconds / step <= 12.0).unwrap_or(120.0);
    let ticks: Vec<(f64, String)> =
        (0..=(seconds / step) as usize).map(|i| (i as f64 * step, format!("{}", i as f64 * step))).collect();
    let latency = |name: &str, pick: fn(&(u64, u64, u64)) -> u64| Series {
        name: name.to_string(),
        points: slices
            .iter()
            .filter_map(|slice| slice.latency_ns.as_ref().map(|latency| (slice.start_s, pick(latency) as f64 / 1e6)))
            .collect(),
    };
    let machine = |name: &str, pick: fn(&HostSummary) -> Option<f64>| Series {
        name: name.to_string(),
        points: slices
            .iter()
            .filter_map(|slice| slice.host.as_ref().and_then(pick).map(|value| (slice.start_s, value)))
            .collect(),
    };
    let upper = Chart {
        title: format!("{title}: latency of the events due in each 100 ms"),
        x_label: "seconds from the schedule's start (warm-up included)".into(),
        y_label: "latency (ms)".into(),
        x_log: false,
        x_range: Some((0.0, seconds)),
        y_log: true,
        series: vec![
            latency("p50", |latency| latency.0),
            latency("p99", |latency| latency.1),
            latency("max", |latency| latency.2),
        ],
        x_tick_labels: ticks.clone(),
    };
    let lower = Chart {
        title: "the machine in each 100 ms".into(),
        x_label: "seconds from the schedule's start (warm-up included)".into(),
        y_label: "% of the time, or ms".into(),
        x_log: false,
        x_range: Some((0.0, seconds)),
        y_log: false,
        series: {
            let mut series = vec![
                machine("CPU pressure %", |host| host.cpu_pressure_pct),
                machine("I/O pressure %", |host| host.io_pressure_pct),
                machine("steal (ms)", |host| host.cpu_steal_ms),
            ];
            if slices.iter().any(|slice| slice.target_stopped_pct.is_some()) {
                series.push(Series {
                    name: "stopped on purpose %".into(),
                    points: slices
                        .iter()
                        .filter_map(|slice| slice.target_stopped_pct.map(|pct| (slice.start_s, pct)))
                        .collect(),
                });
            }
            series
        },
        x_tick_labels: ticks,
    };
    crate::plot::stack(&[upper, lower])
}

/// Writes `timeline.csv` and `timeline.svg` into a run's directory.
pub fn write(directory: &Path, title: &str, slices: &[Slice]) -> anyhow::Result<()> {
    for (name, text) in [("timeline.csv", to_csv(slices)), ("timeline.svg", to_svg(title, slices))] {
        let path = directory.join(name);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(kind: &'static str, intended_ns: u64, received_ns: Option<u64>) -> RawRow {
        RawRow {
            kind,
            event_id: 0,
            observer_id: None,
            key: String::new(),
            intended_ns,
            sent_ns: None,
            ack_ns: None,
            received_ns,
            arrived_ns: None,
        }
    }

    #[test]
    fn latencies_fall_in_the_slice_of_their_intended_send() {
        let start = 1_000_000_000;
        let mut timeline = Timeline::new(start);
        // Slice 0: 1, 2, …, 100 ms; slice 2: one of 7 ms; slice 1 empty.
        for ms in 1..=100u64 {
            timeline.record(&row("delivery", start + 10_000_000, Some(start + 10_000_000 + ms * 1_000_000)));
        }
        timeline.record(&row("fresh", start + 250_000_000, Some(start + 257_000_000)));
        // Not latencies: a missed delivery, a window's close, a query.
        timeline.record(&row("delivery", start + 50_000_000, None));
        timeline.record(&row("close", start + 50_000_000, Some(start + 60_000_000)));
        timeline.record(&row("query", start + 50_000_000, Some(start + 60_000_000)));
        let slices = timeline.slices(&[], &[]);
        assert_eq!(slices.len(), 3);
        assert_eq!(slices[0].samples, 100);
        assert_eq!(slices[0].latency_ns, Some((50_000_000, 99_000_000, 100_000_000)));
        assert_eq!((slices[1].samples, slices[1].latency_ns), (0, None));
        assert_eq!(slices[2].latency_ns, Some((7_000_000, 7_000_000, 7_000_000)));
        assert!((slices[2].start_s - 0.2).abs() < 1e-9);
        assert!(slices.iter().all(|slice| slice.host.is_none()));
        let csv = to_csv(&slices);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines[0], CSV_HEADER);
        assert_eq!(lines[1], "0.0,100,50000000,99000000,100000000,,,,,,");
        assert_eq!(lines[2], "0.1,0,,,,,,,,,");
        let svg = to_svg("W4 onehop 100000/s #1", &slices);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"), "{svg}");
        assert!(svg.contains("W4 onehop 100000/s #1: latency") && svg.contains("the machine in each 100 ms"));
        assert!(!svg.contains("stopped on purpose"), "no pauses, no series for them");
    }

    #[test]
    fn a_stopped_server_is_shown_by_slice() {
        let start = 1_000_000_000;
        let mut timeline = Timeline::new(start);
        timeline.record(&row("delivery", start + 350_000_000, Some(start + 360_000_000)));
        // Stopped 40 ms from 0.05 s (across slices 0 and 1) and 30 ms from 0.2 s.
        let stopped = [(start + 80_000_000, start + 120_000_000), (start + 200_000_000, start + 230_000_000)];
        let slices = timeline.slices(&[], &stopped);
        let pct: Vec<f64> = slices.iter().map(|slice| slice.target_stopped_pct.unwrap()).collect();
        assert_eq!(pct, vec![20.0, 20.0, 30.0, 0.0]);
        assert!(to_csv(&slices).lines().nth(3).unwrap().ends_with(",30.0"), "{}", to_csv(&slices));
        assert!(to_svg("W4", &slices).contains("stopped on purpose %"));
    }

    #[test]
    fn the_machine_is_sampled_once_per_slice_until_finished() {
        let clock = Clock::start();
        let sampler = HostSampler::start(clock, clock.now_ns(), Vec::new()).unwrap();
        std::thread::sleep(Duration::from_millis(350));
        let elapsed_ns = clock.now_ns();
        let samples = sampler.finish();
        // One at each 100 ms that had begun before the finish, and the closing one.
        let due = (elapsed_ns / SLICE_NS + 1) as usize;
        assert!(samples.len() >= 2 && samples.len() <= due + 2, "{} samples, {due} due", samples.len());
        let slices = Timeline::new(0).slices(&samples, &[]);
        assert_eq!(slices.len(), samples.len() - 1);
        for slice in &slices {
            let host = slice.host.expect("a reading per slice");
            assert!(host.seconds >= 0.0 && host.seconds <= elapsed_ns as f64 / 1e9 + 1.0, "{host:?}");
            assert!(host.target_cores.is_none());
        }
    }
}

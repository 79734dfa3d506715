//! One run: open a session on a target, drive the schedule, drain, stop the observers.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context;
use tokio::runtime::Handle;

use crate::client::DRAIN_TIMEOUT;
use crate::plan::Plan;
use crate::progress::RunProgress;
use crate::recorder::{Outcome, Recorder};
use crate::schedule::{Clock, DriveLimits, Schedule, drive};
use crate::target::{Session, Target};

/// How long observers may take, after the last answer, to receive what they are owed.
const RECEIVE_TIMEOUT: Duration = Duration::from_secs(5);
/// The schedule starts this long after the session is ready, so event 0 is not late before
/// the scheduler thread is even running.
const START_LEAD: Duration = Duration::from_millis(20);

#[derive(Clone, Debug)]
pub struct RunSpec {
    pub schedule: Schedule,
    /// Point queries per second alongside the events (views).
    pub query_rate_hz: Option<f64>,
    pub limits: DriveLimits,
    /// The progress bar's label.
    pub label: String,
    pub progress: bool,
    /// Stop a started server now and then (the echo, in-process, is never stopped).
    pub pauses: Option<crate::pause::Pauses>,
}

/// What a run recorded, ready for analysis.
pub struct RunData {
    pub recorder: Arc<Recorder>,
    pub started_at: SystemTime,
    pub ended_at: SystemTime,
    /// Resident memory of the server at the end of the run, when the target started it (a peer's
    /// processes summed).
    pub server_rss_mb: Option<f64>,
    /// The target's fdatasyncs from just before the schedule started to the end of the drain
    /// (warm-up included), when it exposes them.
    pub target_fsyncs: Option<crate::fsyncs::Fsyncs>,
    /// Failed logins and TLS handshakes the target counted over the same span.
    pub target_refusals: Option<u64>,
    /// CPU used by the harness and a started server, and the machine's pressure, over the
    /// same span.
    pub host: crate::host::HostUsage,
    /// The same counters read at the start of every slice of the schedule and once at the
    /// end of the drain (see [`crate::timeline`]).
    pub host_samples: Vec<crate::host::HostUsage>,
    /// The stalls made on purpose, when asked for and the target is a started server.
    pub pauses: Option<crate::pause::PauseFigures>,
    /// When the server was stopped (from, to, on the run's clock).
    pub stopped_ns: Vec<(u64, u64)>,
}

/// Resident set size of process `pid`, in MiB, from /proc.
pub fn rss_mb(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// Runs `plan` once against `target`.
pub fn run_once(target: &dyn Target, plan: &Plan, spec: &RunSpec, runtime: &Handle) -> anyhow::Result<RunData> {
    // Before the target opens: its observer threads take the run's priority as they start.
    crate::priority::enter_run(spec.schedule.rate_hz);
    let clock = Clock::start();
    let queries = spec.query_rate_hz.map(|rate_hz| Schedule { rate_hz, ..spec.schedule });
    let recorder = Arc::new(Recorder::new(clock, spec.schedule, queries));
    let Session { mut producer, querier, observers } = target.open(plan, &recorder, runtime)?;
    let fsyncs_before = target.fsyncs(runtime);
    let refusals_before = target.refusals(runtime);
    let target_pids = target.process_ids();
    let host_before = crate::host::HostUsage::take(clock.now_ns(), &target_pids);
    let start_ns = clock.now_ns() + START_LEAD.as_nanos() as u64;
    recorder.start_at(start_ns);
    let sampler = crate::timeline::HostSampler::start(clock, start_ns, target_pids.clone())?;
    let progress = RunProgress::start(spec.progress, spec.label.clone(), recorder.clone());
    let pauser = match (spec.pauses, target.server_pid()) {
        (Some(pauses), Some(pid)) => {
            let starts = pauses.starts(&spec.schedule);
            Some(crate::pause::Pauser::start(pid, pauses, clock, start_ns, starts).context("starting the pauses")?)
        }
        _ => None,
    };
    // Schedules run to their end; the flag is how a caller would cut one short.
    let never = Arc::new(AtomicBool::new(false));
    let query_thread = match querier {
        Some(mut querier) => {
            let (recorder, never, limits) = (recorder.clone(), never.clone(), spec.limits);
            Some(std::thread::Builder::new().name("bench-queries".into()).spawn(move || {
                crate::priority::raise_this_thread();
                let queries = recorder.queries.as_ref().expect("a query track");
                drive(
                    queries,
                    DriveLimits { linger: Duration::ZERO, batch_max: 1, ..limits },
                    querier.as_mut(),
                    &never,
                );
                querier
            })?)
        }
        None => None,
    };
    let producer = {
        let (recorder, limits) = (recorder.clone(), spec.limits);
        std::thread::Builder::new()
            .name("bench-schedule".into())
            .spawn(move || {
                crate::priority::raise_this_thread();
                drive(&recorder.events, limits, producer.as_mut(), &never);
                producer
            })?
            .join()
            .map_err(|_| anyhow::anyhow!("the scheduler thread panicked"))?
    };
    let querier = match query_thread {
        Some(thread) => Some(thread.join().map_err(|_| anyhow::anyhow!("the query thread panicked"))?),
        None => None,
    };
    // Every pause ends inside the schedule: by now the last is over.
    let (pauses, stopped_ns) = match pauser.map(crate::pause::Pauser::finish) {
        Some((figures, stopped)) => (Some(figures), stopped),
        None => (None, Vec::new()),
    };
    // Let the last answers come back, then the last deliveries.
    let deadline = Instant::now() + DRAIN_TIMEOUT;
    let in_flight = || recorder.events.in_flight() + recorder.queries.as_ref().map_or(0, |queries| queries.in_flight());
    while in_flight() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    wait_for_receipts(plan, &recorder);
    let server_rss_mb =
        target_pids.iter().map(|pid| rss_mb(*pid)).sum::<Option<f64>>().filter(|_| !target_pids.is_empty());
    let target_fsyncs = fsyncs_before.and_then(|before| Some(target.fsyncs(runtime)?.since(&before)));
    let target_refusals = refusals_before.and_then(|before| Some(target.refusals(runtime)?.saturating_sub(before)));
    let host = crate::host::HostUsage::take(clock.now_ns(), &target_pids).since(&host_before);
    let host_samples = sampler.finish();
    let ended_at = clock.system_time_at(clock.now_ns());
    observers.stop(runtime).context("stopping the observers")?;
    drop(producer);
    drop(querier);
    progress.finish();
    Ok(RunData {
        recorder,
        started_at: clock.system_time_at(start_ns),
        ended_at,
        server_rss_mb,
        target_fsyncs,
        target_refusals,
        host,
        host_samples,
        pauses,
        stopped_ns,
    })
}

/// Waits (bounded) until the observers have received everything the acknowledged events owe
/// them: every matching subscriber's copy, or for a view, every window's closing row.
fn wait_for_receipts(plan: &Plan, recorder: &Recorder) {
    let events = &recorder.events;
    let acknowledged = || (0..events.schedule.total()).filter(|seq| events.outcome(*seq) == Outcome::Ok);
    let (target, deadline) = match plan {
        Plan::Fanout(fanout) => {
            let owed: u64 = acknowledged().map(|seq| fanout.routing.observers_of(seq).len() as u64).sum();
            (owed, Instant::now() + RECEIVE_TIMEOUT)
        }
        Plan::Ingest(ingest) => {
            (acknowledged().count() as u64 * ingest.subscribers as u64, Instant::now() + RECEIVE_TIMEOUT)
        }
        Plan::View(view) => {
            let windows: HashSet<(u32, i64)> = acknowledged()
                .map(|seq| (view.key_of(seq), view.window_of(events.clock.epoch_ms_at(events.intended_ns(seq)))))
                .collect();
            // The last window closes at its end plus grace, by the wall clock.
            let last_close_ns = windows
                .iter()
                .map(|(_, start)| events.clock.ns_at_epoch_ms(start + view.window_ms + view.grace_ms))
                .max()
                .unwrap_or(0);
            while recorder.finals_count() < windows.len() as u64 && events.clock.now_ns() < last_close_ns {
                std::thread::sleep(Duration::from_millis(20));
            }
            (windows.len() as u64, Instant::now() + RECEIVE_TIMEOUT)
        }
    };
    let received = || match plan {
        Plan::View(_) => recorder.finals_count(),
        _ => recorder.received_count(),
    };
    while received() < target && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
}

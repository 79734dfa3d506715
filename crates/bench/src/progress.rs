//! A progress bar per run on stderr: phase, elapsed time, the rate actually sent, what is in
//! flight and what the observers received.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

use crate::recorder::Recorder;

/// How often the bar is redrawn.
const TICK: Duration = Duration::from_millis(200);
/// The achieved rate is measured over this much of the recent past.
const RATE_WINDOW_TICKS: usize = 5;

pub struct RunProgress {
    bar: ProgressBar,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RunProgress {
    /// Starts drawing `label`'s bar (nothing when not `enabled`).
    pub fn start(enabled: bool, label: String, recorder: Arc<Recorder>) -> RunProgress {
        let stop = Arc::new(AtomicBool::new(false));
        if !enabled {
            return RunProgress { bar: ProgressBar::hidden(), stop, thread: None };
        }
        let bar = ProgressBar::new(recorder.events.schedule.total());
        bar.set_style(
            ProgressStyle::with_template("{prefix:>24} [{elapsed_precise}] {bar:25} {pos}/{len} {wide_msg}")
                .expect("a valid template"),
        );
        bar.set_prefix(label);
        let thread = {
            let (bar, stop) = (bar.clone(), stop.clone());
            std::thread::Builder::new()
                .name("bench-progress".into())
                .spawn(move || {
                    let events = &recorder.events;
                    let mut recent: VecDeque<(u64, u64)> = VecDeque::new();
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(TICK);
                        let now_ns = recorder.clock.now_ns();
                        let sent = events.sent_count();
                        recent.push_back((now_ns, sent));
                        if recent.len() > RATE_WINDOW_TICKS {
                            recent.pop_front();
                        }
                        let (first_ns, first_sent) = recent.front().copied().unwrap_or((now_ns, sent));
                        let rate = if now_ns > first_ns {
                            (sent - first_sent) as f64 * 1e9 / (now_ns - first_ns) as f64
                        } else {
                            0.0
                        };
                        let warmup_end_ns = events.start_ns() + events.schedule.warmup.as_nanos() as u64;
                        let phase = if now_ns < warmup_end_ns {
                            "warm-up"
                        } else if now_ns < events.end_ns() {
                            "measuring"
                        } else {
                            "draining"
                        };
                        bar.set_position(sent);
                        bar.set_message(format!(
                            "{phase}, {rate:.0}/s sent, in flight {}, received {}",
                            events.in_flight(),
                            recorder.received_count()
                        ));
                    }
                })
                .ok()
        };
        RunProgress { bar, stop, thread }
    }

    pub fn finish(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        self.bar.finish_and_clear();
    }
}

impl Drop for RunProgress {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

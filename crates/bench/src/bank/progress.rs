//! The bar on stderr while a run goes: commands sent, and how far the leader, the standby and
//! the observer have come.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

/// How often the bar is redrawn.
const TICK: Duration = Duration::from_millis(200);

pub struct Bar {
    bar: ProgressBar,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Bar {
    /// Starts drawing (nothing when not `enabled`). `positions` reads the leader's committed
    /// and the standby's applied sequence.
    pub fn start(
        enabled: bool,
        label: String,
        total: u64,
        sent: Arc<AtomicU64>,
        positions: impl Fn() -> (u64, u64) + Send + 'static,
        observed: Arc<AtomicU64>,
    ) -> Bar {
        let stop = Arc::new(AtomicBool::new(false));
        if !enabled {
            return Bar { bar: ProgressBar::hidden(), stop, thread: None };
        }
        let bar = ProgressBar::new(total);
        bar.set_style(
            ProgressStyle::with_template("{prefix:>20} [{elapsed_precise}] {bar:25} {pos}/{len} {wide_msg}")
                .expect("a valid template"),
        );
        bar.set_prefix(label);
        let thread = {
            let (bar, stop) = (bar.clone(), stop.clone());
            std::thread::Builder::new()
                .name("bank-progress".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(TICK);
                        let (committed, applied) = positions();
                        bar.set_position(sent.load(Ordering::Relaxed));
                        bar.set_message(format!(
                            "committed {committed}, standby applied {applied}, observed {}",
                            observed.load(Ordering::Relaxed)
                        ));
                    }
                })
                .ok()
        };
        Bar { bar, stop, thread }
    }

    pub fn finish(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        self.bar.finish_and_clear();
    }
}

impl Drop for Bar {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

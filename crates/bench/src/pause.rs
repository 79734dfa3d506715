//! Stalls made on purpose: the server the harness started is stopped (SIGSTOP) for a set time
//! at fixed points of the measured window and then let go (SIGCONT). What a slow disk, a
//! hypervisor taking the CPUs or a collector's pause does to a real server, on demand: a run
//! then shows how long the target takes to catch up, not only how it runs undisturbed.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Once};
use std::thread::JoinHandle;
use std::time::Duration;

use serde::Serialize;

use crate::schedule::{Clock, Schedule};

/// The server is stopped for `length` every `every` of the measured window.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pauses {
    pub length: Duration,
    pub every: Duration,
}

/// What a run's pauses were, for meta.json, the run line and the summary.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct PauseFigures {
    pub length_ms: f64,
    pub every_s: f64,
    /// Pauses made.
    pub made: u64,
    /// Time the server was stopped, summed over the pauses, as measured.
    pub stopped_ms: f64,
}

impl PauseFigures {
    /// The same pauses over more runs.
    pub fn merge(&mut self, other: &PauseFigures) {
        self.made += other.made;
        self.stopped_ms += other.stopped_ms;
    }
}

impl Pauses {
    /// When each pause starts, from the schedule's start: one `every` after the warm-up ends,
    /// then every `every`, each over before the measured window ends.
    pub fn starts(&self, schedule: &Schedule) -> Vec<Duration> {
        let end = schedule.warmup + schedule.duration;
        (1..).map(|k| schedule.warmup + self.every * k).take_while(|start| *start + self.length <= end).collect()
    }
}

/// The thread that stops and continues the server.
pub struct Pauser {
    pauses: Pauses,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Vec<(u64, u64)>>>,
}

/// The process stopped right now (0: none), for the signal handler below.
static STOPPED: AtomicI32 = AtomicI32::new(0);

/// Interrupted (Ctrl-C, a TERM or a hang-up) in the middle of a pause, the harness dies
/// without running destructors: the server would stay stopped, with the signal its process
/// group got pending, until someone continued it. This continues it first, then dies of the
/// signal as before. Only async-signal-safe calls: an atomic load, kill, signal, raise.
extern "C" fn continue_then_die(signal: libc::c_int) {
    let pid = STOPPED.load(Ordering::SeqCst);
    // SAFETY: kill(2), signal(2) and raise(3) are async-signal-safe and take plain integers.
    unsafe {
        if pid > 0 {
            libc::kill(pid, libc::SIGCONT);
        }
        libc::signal(signal, libc::SIG_DFL);
        libc::raise(signal);
    }
}

fn continue_on_interrupt() {
    static INSTALLED: Once = Once::new();
    INSTALLED.call_once(|| {
        for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            // SAFETY: the handler only makes async-signal-safe calls (see above).
            unsafe { libc::signal(signal, continue_then_die as *const () as libc::sighandler_t) };
        }
    });
}

/// Continues the process when dropped, so a stopped server is never left behind.
struct Continue(libc::pid_t);

impl Drop for Continue {
    fn drop(&mut self) {
        // SAFETY: kill(2) with a pid and a signal number has no memory-safety preconditions.
        unsafe { libc::kill(self.0, libc::SIGCONT) };
        STOPPED.store(0, Ordering::SeqCst);
    }
}

impl Pauser {
    /// Starts pausing process `pid` at `start_ns + starts[i]` on `clock`.
    pub fn start(
        pid: u32,
        pauses: Pauses,
        clock: Clock,
        start_ns: u64,
        starts: Vec<Duration>,
    ) -> std::io::Result<Pauser> {
        continue_on_interrupt();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            std::thread::Builder::new().name("bench-pauses".into()).spawn(move || {
                let pid = pid as libc::pid_t;
                let mut stopped = Vec::new();
                for start in starts {
                    let due_ns = start_ns + start.as_nanos() as u64;
                    loop {
                        let now_ns = clock.now_ns();
                        if stop.load(Ordering::Relaxed) {
                            return stopped;
                        }
                        if now_ns >= due_ns {
                            break;
                        }
                        std::thread::sleep(Duration::from_nanos(due_ns - now_ns).min(Duration::from_millis(50)));
                    }
                    let began_ns = clock.now_ns();
                    // Set before the stop: an interrupt in between continues a running
                    // process, which is harmless.
                    STOPPED.store(pid, Ordering::SeqCst);
                    // SAFETY: as in `Continue::drop`.
                    if unsafe { libc::kill(pid, libc::SIGSTOP) } != 0 {
                        STOPPED.store(0, Ordering::SeqCst);
                        // The server is gone; the run will say so.
                        break;
                    }
                    let resume = Continue(pid);
                    std::thread::sleep(pauses.length);
                    drop(resume);
                    stopped.push((began_ns, clock.now_ns()));
                }
                stopped
            })?
        };
        Ok(Pauser { pauses, stop, thread: Some(thread) })
    }

    /// Waits for the pause under way, if any, and says what was done, with when the server
    /// was stopped (from, to, on the run's clock). Pauses not yet begun are not made.
    pub fn finish(mut self) -> (PauseFigures, Vec<(u64, u64)>) {
        self.stop.store(true, Ordering::Relaxed);
        let stopped = self.thread.take().and_then(|thread| thread.join().ok()).unwrap_or_default();
        let figures = PauseFigures {
            length_ms: self.pauses.length.as_secs_f64() * 1e3,
            every_s: self.pauses.every.as_secs_f64(),
            made: stopped.len() as u64,
            stopped_ms: stopped.iter().map(|(from, to)| to - from).sum::<u64>() as f64 / 1e6,
        };
        (figures, stopped)
    }
}

impl Drop for Pauser {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_fall_in_the_measured_window() {
        let schedule = Schedule { rate_hz: 1.0, warmup: Duration::from_secs(1), duration: Duration::from_secs(3) };
        let every_second = Pauses { length: Duration::from_millis(30), every: Duration::from_secs(1) };
        let seconds = |starts: Vec<Duration>| starts.iter().map(Duration::as_secs_f64).collect::<Vec<_>>();
        // At 2 s and 3 s; one at 4 s would end after the window does.
        assert_eq!(seconds(every_second.starts(&schedule)), vec![2.0, 3.0]);
        let longer = Pauses { length: Duration::from_millis(400), every: Duration::from_millis(1500) };
        assert_eq!(seconds(longer.starts(&schedule)), vec![2.5]);
    }

    #[test]
    fn a_paused_process_is_stopped_then_continued() {
        // A child of our own that we stop and continue: its state in /proc shows each. It is
        // continued and killed however the test ends.
        struct Child(std::process::Child);
        impl Drop for Child {
            fn drop(&mut self) {
                // SAFETY: as in `Continue::drop`.
                unsafe { libc::kill(self.0.id() as libc::pid_t, libc::SIGCONT) };
                let _ = self.0.kill();
                let _ = self.0.wait();
            }
        }
        let child = Child(std::process::Command::new("sleep").arg("30").spawn().unwrap());
        let pid = child.0.id();
        let state = || {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
            stat.rsplit(") ").next().unwrap().chars().next().unwrap()
        };
        let clock = Clock::start();
        let pauses = Pauses { length: Duration::from_millis(300), every: Duration::from_secs(1) };
        let pauser = Pauser::start(pid, pauses, clock, clock.now_ns(), vec![Duration::from_millis(50)]).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(state(), 'T', "stopped during the pause");
        let (figures, stopped) = pauser.finish();
        // Continued: asleep in sleep(1), or for a moment on a busy machine still running on its
        // way back to sleep; anything but stopped.
        assert!(matches!(state(), 'S' | 'R'), "continued after it, not stopped: {}", state());
        assert_eq!(figures.made, 1);
        assert!(figures.stopped_ms >= 300.0, "{figures:?}");
        assert_eq!(stopped.len(), 1);
        assert!(stopped[0].1 - stopped[0].0 >= 300_000_000, "{stopped:?}");
        // A pauser dropped in the middle of a pause still continues the process.
        let pauser = Pauser::start(pid, pauses, clock, clock.now_ns(), vec![Duration::ZERO]).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(state(), 'T');
        drop(pauser);
        assert_eq!(state(), 'S');
        drop(child);
    }
}

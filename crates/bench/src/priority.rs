//! The harness's own threads ask for a higher scheduling priority than the target's.
//!
//! On a machine with as few cores as this one (2), the harness and the target share them. When
//! an event fans out, the target's workers write to every subscriber at once, and the harness's
//! observers, at the same priority, wait for a core before they can read what already arrived:
//! W2 measured ~140 µs of its receipts' time in the harness that way, of which ~35 µs was the
//! harness's own reading. The latency figures did not change between the two settings (p50
//! 1.08–1.18 ms in both), because the cores are busy with the same work either way; what changes
//! is whether the harness records a receipt when it arrives or when a core is free, and so how
//! much of a sample is the harness's own time. A measuring instrument should be the first to see
//! what it measures.
//!
//! So the threads that send on schedule and record what arrives (the scheduler, answer and
//! acknowledgement readers, observers) run at nice [`HARNESS_NICE`] when the process may raise
//! its priority (root or `CAP_SYS_NICE`), and at the process's own nice otherwise. meta.json
//! records which (`knobs.harness_nice`). Targets never inherit it: a server the harness starts
//! is set back to the process's own nice before it runs, and the in-process echo target's
//! threads are started from the main thread, which is never raised.
//!
//! Only at low rates, though: up to [`RAISED_UP_TO_HZ`] events a second. There the harness's
//! threads are idle between events, and priority only decides who runs first when one arrives.
//! At high rates they are busy, and priority becomes a share of the cores taken from the target:
//! at 100 000/s (W4) the target's p99 was 14, 25 and 30 ms with the harness raised against 8.5,
//! 15 and 19 ms at equal priority, in three alternating pairs. So a run above the line keeps
//! every harness thread at the process's own nice, the runtime's workers included (they follow
//! the current run each time they wake).

use std::cell::Cell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

/// The nice the harness's threads ask for: above the default (0) by enough that a woken
/// observer runs before a busy target thread, not so much that it starves the target.
pub const HARNESS_NICE: i32 = -5;

/// The nice of the process's main thread, which the harness never changes: what targets run at.
pub fn base_nice() -> i32 {
    static BASE: OnceLock<i32> = OnceLock::new();
    *BASE.get_or_init(|| {
        // SAFETY: plain syscalls without pointers. On Linux nice is per thread, and
        // PRIO_PROCESS with the process id names the main thread.
        unsafe {
            *libc::__errno_location() = 0;
            let nice = libc::getpriority(libc::PRIO_PROCESS, libc::getpid() as libc::id_t);
            if *libc::__errno_location() != 0 { 0 } else { nice }
        }
    })
}

/// Whether harness threads get [`HARNESS_NICE`]: tried once, on a short-lived thread, so the
/// answer does not depend on which thread asks first.
fn granted() -> bool {
    static GRANTED: OnceLock<bool> = OnceLock::new();
    *GRANTED.get_or_init(|| {
        let base = base_nice();
        if HARNESS_NICE >= base {
            return false;
        }
        std::thread::spawn(|| set_this_thread(HARNESS_NICE)).join().unwrap_or(false)
    })
}

fn set_this_thread(nice: i32) -> bool {
    // SAFETY: plain syscalls without pointers; on Linux a thread id names just that thread.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, nice) == 0 }
}

/// The highest offered rate (events per second) at which harness threads are raised.
pub const RAISED_UP_TO_HZ: f64 = 20_000.0;

/// Whether the current run raises harness threads (set by [`enter_run`]).
static RUN_RAISED: AtomicBool = AtomicBool::new(true);

thread_local! {
    /// The nice this thread was last set to by [`raise_this_thread`].
    static APPLIED: Cell<Option<i32>> = const { Cell::new(None) };
}

/// The nice the harness's threads run at during a run at `rate_hz`.
pub fn nice_for(rate_hz: f64) -> i32 {
    if rate_hz <= RAISED_UP_TO_HZ && granted() { HARNESS_NICE } else { base_nice() }
}

/// Starts a run at `rate_hz`: the harness threads that start or wake from now on take its nice.
pub fn enter_run(rate_hz: f64) {
    RUN_RAISED.store(rate_hz <= RAISED_UP_TO_HZ, Ordering::Relaxed);
}

/// The nice the harness's threads run at in the current run.
pub fn harness_nice() -> i32 {
    if RUN_RAISED.load(Ordering::Relaxed) && granted() { HARNESS_NICE } else { base_nice() }
}

/// Sets the calling harness thread to [`harness_nice`]: raised when the current run is raised
/// and the process may raise, the process's own nice otherwise. A thread already there makes
/// no syscall, so the runtime's workers call it each time they wake.
pub fn raise_this_thread() {
    let nice = harness_nice();
    if APPLIED.get() != Some(nice) && set_this_thread(nice) {
        APPLIED.set(Some(nice));
    }
}

/// Sets the calling thread back to the process's own nice: for a thread about to start a
/// target. Lowering a priority is always permitted.
pub fn reset_this_thread() {
    if set_this_thread(base_nice()) {
        APPLIED.set(Some(base_nice()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn this_thread_nice() -> i32 {
        // SAFETY: a plain syscall without pointers.
        unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) }
    }

    #[test]
    fn only_raised_threads_of_slow_runs_change_priority() {
        let base = base_nice();
        let raised = std::thread::spawn(|| {
            raise_this_thread();
            let raised = this_thread_nice();
            reset_this_thread();
            (raised, this_thread_nice())
        })
        .join()
        .unwrap();
        assert_eq!(raised, (harness_nice(), base));
        // Neither this thread nor the main thread moved.
        assert_eq!(this_thread_nice(), base);
        assert_eq!(base_nice(), base);
        // Raised exactly when permitted; otherwise threads run at the process's nice.
        assert!(harness_nice() == HARNESS_NICE || harness_nice() == base);

        // A fast run keeps the harness at the target's priority. (In the same test: the run's
        // setting is process-wide.)
        let slow = nice_for(RAISED_UP_TO_HZ);
        assert_eq!(nice_for(RAISED_UP_TO_HZ * 5.0), base_nice());
        // One thread through a slow run, a fast one and a slow one again, as a runtime worker
        // that wakes in each would.
        let seen = std::thread::spawn(move || {
            let mut seen = Vec::new();
            for rate_hz in [10.0, 100_000.0, 1_000.0] {
                enter_run(rate_hz);
                raise_this_thread();
                seen.push((harness_nice(), this_thread_nice()));
            }
            seen
        })
        .join()
        .unwrap();
        assert_eq!(seen, vec![(slow, slow), (base_nice(), base_nice()), (slow, slow)]);
    }
}

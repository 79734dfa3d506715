//! The open-loop schedule: one clock, when each event is due, and the thread that sends it then.
//!
//! Event `seq` of a run is due at `start + seq / rate`. A scheduler thread sleeps to each due
//! time (with a 1 ns timer slack) and hands everything due by then to the producer in one call,
//! whatever the target has answered so far: a stalled target cannot slow the schedule down, so
//! its stall shows up as latency counted from the intended time (no coordinated omission).

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::recorder::Track;

/// The one monotonic clock of a run. Every timestamp the harness takes is nanoseconds since
/// `base`; the wall clock is read once, at `base`, to place events in epoch-aligned windows.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    base: Instant,
    epoch_base_ns: u64,
}

impl Clock {
    pub fn start() -> Clock {
        let base = Instant::now();
        let epoch_base_ns = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| since.as_nanos() as u64);
        Clock { base, epoch_base_ns }
    }

    pub fn now_ns(&self) -> u64 {
        self.base.elapsed().as_nanos() as u64
    }

    /// Milliseconds since the Unix epoch at clock time `ns`.
    pub fn epoch_ms_at(&self, ns: u64) -> i64 {
        ((self.epoch_base_ns + ns) / 1_000_000) as i64
    }

    /// Clock time of the epoch millisecond `ms` (0 if it was before the clock started).
    pub fn ns_at_epoch_ms(&self, ms: i64) -> u64 {
        (ms.max(0) as u64 * 1_000_000).saturating_sub(self.epoch_base_ns)
    }

    /// The wall-clock time at clock time `ns`.
    pub fn system_time_at(&self, ns: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_nanos(self.epoch_base_ns + ns)
    }
}

/// A fixed-rate schedule: a warm-up that is sent but not measured, then the measured window.
#[derive(Clone, Copy, Debug)]
pub struct Schedule {
    pub rate_hz: f64,
    pub warmup: Duration,
    pub duration: Duration,
}

impl Schedule {
    /// Events in the whole schedule, warm-up included.
    pub fn total(&self) -> u64 {
        ((self.warmup + self.duration).as_secs_f64() * self.rate_hz) as u64
    }

    /// When event `seq` is due, relative to the schedule's start.
    pub fn offset_ns(&self, seq: u64) -> u64 {
        (seq as f64 * 1e9 / self.rate_hz) as u64
    }

    /// Whether event `seq` is in the measured window (after the warm-up).
    pub fn is_measured(&self, seq: u64) -> bool {
        let offset = self.offset_ns(seq);
        offset >= self.warmup.as_nanos() as u64 && offset < (self.warmup + self.duration).as_nanos() as u64
    }

    /// The measured events, as a range of sequence numbers.
    pub fn measured(&self) -> Range<u64> {
        let total = self.total();
        let first = (0..total).find(|seq| self.is_measured(*seq)).unwrap_or(total);
        first..total
    }
}

/// The sending side of a target, driven by the scheduler thread.
pub trait Producer: Send {
    /// Sends the events `seqs`, all due by now, without waiting for their answers: whoever
    /// receives an answer records it in the track ([`Track::answered`]). The producer records
    /// when each event actually went out ([`Track::sent`]).
    fn send(&mut self, seqs: Range<u64>);

    /// Event `seq` is due shortly, alone: work that does not depend on the send time (encoding
    /// the request) can be done now, off the measured path. Optional.
    fn prepare(&mut self, _seq: u64) {}
}

/// How the scheduler may group and hold back events.
#[derive(Clone, Copy, Debug)]
pub struct DriveLimits {
    /// Events sent but not yet answered, at most; an event due beyond it is not sent and counts
    /// as an error, so a collapsed target cannot exhaust the harness.
    pub in_flight_max: u64,
    /// Most events handed to the producer in one call.
    pub batch_max: u64,
    /// How long the scheduler lets due events gather before sending them together (0: each at
    /// its own time). Latency still counts from each event's intended time.
    pub linger: Duration,
}

impl Default for DriveLimits {
    fn default() -> Self {
        DriveLimits { in_flight_max: 10_000, batch_max: 1_000, linger: Duration::ZERO }
    }
}

/// Lets this thread's sleeps end within microseconds of the intended time instead of the
/// default 50 µs timer slack.
pub fn tighten_timer_slack() {
    // SAFETY: PR_SET_TIMERSLACK takes an integer and touches no memory of ours.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0);
    }
}

/// At rates below [`SPIN_BELOW_HZ`] the scheduler sleeps to this long before each due time
/// and spins the rest: a thread woken from a sleep on this VM runs ~70 µs late (p99 ~80 µs,
/// even with a 1 ns timer slack), and that lateness would count as the target's latency.
pub const SPIN: Duration = Duration::from_micros(200);
/// Spinning 200 µs per event costs at most 10 % of a core below this rate.
pub const SPIN_BELOW_HZ: f64 = 500.0;
/// From [`SPIN_BELOW_HZ`] up to this rate the scheduler spins [`SHORT_SPIN`] instead (at most
/// 20 % of a core), which still covers a typical late wake-up: at W4's 1 000/s, sleeping all
/// the way left a send lag of 30–40 µs at p50, the largest part of the harness's own time
/// there. Above it the scheduler only sleeps. Either way its lateness is recorded
/// (`sent_ns - intended_ns`).
pub const SHORT_SPIN_BELOW_HZ: f64 = 2_000.0;
pub const SHORT_SPIN: Duration = Duration::from_micros(100);

/// How long the scheduler spins before each due time at `rate_hz`.
pub fn spin_for(rate_hz: f64) -> Duration {
    if rate_hz < SPIN_BELOW_HZ {
        SPIN
    } else if rate_hz <= SHORT_SPIN_BELOW_HZ {
        SHORT_SPIN
    } else {
        Duration::ZERO
    }
}

/// Runs `track`'s schedule on the calling thread until its last event is sent or `stop` is set.
pub fn drive(track: &Track, limits: DriveLimits, producer: &mut dyn Producer, stop: &AtomicBool) {
    tighten_timer_slack();
    let total = track.schedule.total();
    let linger_ns = limits.linger.as_nanos() as u64;
    let spin_ns = spin_for(track.schedule.rate_hz).as_nanos() as u64;
    let mut seq = 0;
    let mut prepared = None;
    while seq < total && !stop.load(Ordering::Relaxed) {
        let now_ns = track.clock.now_ns();
        let wake_ns = track.intended_ns(seq) + linger_ns;
        if wake_ns > now_ns {
            let remaining_ns = wake_ns - now_ns;
            if remaining_ns > spin_ns {
                std::thread::sleep(Duration::from_nanos(remaining_ns - spin_ns));
            } else {
                if spin_ns > 0 && prepared != Some(seq) {
                    producer.prepare(seq);
                    prepared = Some(seq);
                }
                std::hint::spin_loop();
            }
            continue;
        }
        let mut end = seq + 1;
        while end < total && end - seq < limits.batch_max && track.intended_ns(end) <= now_ns {
            end += 1;
        }
        let room = limits.in_flight_max.saturating_sub(track.in_flight());
        let send_end = seq + (end - seq).min(room);
        for skipped in send_end..end {
            track.skipped(skipped);
        }
        if send_end > seq {
            track.begin(send_end - seq);
            producer.send(seq..send_end);
        }
        seq = end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_measured_window_follows_the_warmup() {
        let schedule = Schedule { rate_hz: 10.0, warmup: Duration::from_secs(1), duration: Duration::from_secs(2) };
        assert_eq!(schedule.total(), 30);
        assert_eq!(schedule.offset_ns(15), 1_500_000_000);
        assert_eq!(schedule.measured(), 10..30);
        assert!(!schedule.is_measured(9) && schedule.is_measured(10) && schedule.is_measured(29));
    }

    #[test]
    fn epoch_and_clock_times_convert_both_ways() {
        let clock = Clock::start();
        let ms = clock.epoch_ms_at(5_000_000_000);
        let back = clock.ns_at_epoch_ms(ms);
        assert!(back <= 5_000_000_000 && 5_000_000_000 - back < 1_000_000, "{back}");
    }
}

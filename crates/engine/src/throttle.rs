//! `--bwlimit`: one token bucket shared by every stream, so the limit holds
//! for the job as a whole however many streams run.
//!
//! A stream asks for the bytes it is about to move; if the bucket is short
//! it takes them anyway (the bucket goes into debt) and sleeps until the
//! debt would have been earned. Sleeping outside the lock keeps other
//! streams' requests flowing, and the debt makes them queue up behind it,
//! which spreads the rate smoothly. The bucket holds at most a tenth of a
//! second's worth, so a pause is never followed by a burst above the rate.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The longest one sleep lasts before the cancel flag is looked at again:
/// a signal stops a throttled job within this, at any rate.
const NAP: Duration = Duration::from_millis(100);

pub struct Throttle {
    rate: f64,
    burst: f64,
    state: Mutex<(f64, Instant)>,
    /// Any of these set ends a wait.
    cancel: [Arc<AtomicBool>; 2],
    /// Nanoseconds streams spent waiting here, summed over streams: how
    /// much the limit held the job back.
    waited: std::sync::atomic::AtomicU64,
}

impl Throttle {
    /// A bucket for `rate` bytes per second; a wait ends early once
    /// either of `cancel` is set.
    pub fn new(rate: u64, cancel: [Arc<AtomicBool>; 2]) -> Throttle {
        let rate = rate.max(1) as f64;
        Throttle {
            rate,
            burst: rate / 10.0,
            state: Mutex::new((0.0, Instant::now())),
            cancel,
            waited: Default::default(),
        }
    }

    /// Waits until `bytes` more may be moved, or the job is cancelled
    /// (then returns at once, false).
    pub fn take(&self, bytes: u64) -> bool {
        let wait = {
            let mut s = self.state.lock().expect("throttle lock");
            let now = Instant::now();
            let earned = now.duration_since(s.1).as_secs_f64() * self.rate;
            s.0 = (s.0 + earned).min(self.burst) - bytes as f64;
            s.1 = now;
            if s.0 >= 0.0 {
                return !self.cancelled();
            }
            -s.0 / self.rate
        };
        let start = Instant::now();
        let until = start + Duration::from_secs_f64(wait);
        let done = loop {
            if self.cancelled() {
                break false;
            }
            let Some(left) = until.checked_duration_since(Instant::now()) else {
                break true;
            };
            std::thread::sleep(left.min(NAP));
        };
        let ns = start.elapsed().as_nanos() as u64;
        self.waited.fetch_add(ns, Relaxed);
        done
    }

    /// Stream-time spent waiting for the limit so far.
    pub fn waited(&self) -> Duration {
        Duration::from_nanos(self.waited.load(Relaxed))
    }

    fn cancelled(&self) -> bool {
        self.cancel.iter().any(|c| c.load(Relaxed))
    }

    /// The largest piece a stream should move between two requests, so
    /// the rate stays smooth at every scale: a multiple of 64 KiB, which
    /// keeps direct I/O aligned.
    pub fn piece(&self) -> u64 {
        (self.burst as u64).clamp(64 << 10, 4 << 20) / (64 << 10) * (64 << 10)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_the_rate_across_threads() {
        let t = Throttle::new(20 << 20, Default::default()); // 20 MiB/s
        let start = Instant::now();
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..40 {
                        t.take(64 << 10); // 4 x 2.5 MiB = 10 MiB
                    }
                });
            }
        });
        let secs = start.elapsed().as_secs_f64();
        // 10 MiB at 20 MiB/s: 0.5 s (less the first tenth of a second's
        // credit never granted: the bucket starts empty).
        assert!((0.45..0.6).contains(&secs), "{secs}");
        assert_eq!(
            Throttle::new(30_000_000, Default::default()).piece() % 4096,
            0
        );
    }

    #[test]
    fn a_cancel_ends_a_long_wait_within_a_nap() {
        let cancel = Arc::new(AtomicBool::new(false));
        let t = Throttle::new(1000, [cancel.clone(), Arc::default()]); // a 64 KiB debt: 65 s
        let start = Instant::now();
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(200));
                cancel.store(true, Relaxed);
            });
            assert!(!t.take(64 << 10));
        });
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "{:?}",
            start.elapsed()
        );
    }
}

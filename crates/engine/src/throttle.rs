//! `--bwlimit`: one token bucket shared by every stream, so the limit holds
//! for the job as a whole however many streams run.
//!
//! A stream asks for the bytes it is about to move; if the bucket is short
//! it takes them anyway (the bucket goes into debt) and sleeps until the
//! debt would have been earned. Sleeping outside the lock keeps other
//! streams' requests flowing, and the debt makes them queue up behind it,
//! which spreads the rate smoothly. The bucket holds at most a tenth of a
//! second's worth, so a pause is never followed by a burst above the rate.

use std::sync::Mutex;
use std::time::{Duration, Instant};

pub struct Throttle {
    rate: f64,
    burst: f64,
    state: Mutex<(f64, Instant)>,
}

impl Throttle {
    /// A bucket for `rate` bytes per second.
    pub fn new(rate: u64) -> Throttle {
        let rate = rate.max(1) as f64;
        Throttle {
            rate,
            burst: rate / 10.0,
            state: Mutex::new((0.0, Instant::now())),
        }
    }

    /// Waits until `bytes` more may be moved.
    pub fn take(&self, bytes: u64) {
        let wait = {
            let mut s = self.state.lock().expect("throttle lock");
            let now = Instant::now();
            let earned = now.duration_since(s.1).as_secs_f64() * self.rate;
            s.0 = (s.0 + earned).min(self.burst) - bytes as f64;
            s.1 = now;
            if s.0 >= 0.0 {
                return;
            }
            -s.0 / self.rate
        };
        std::thread::sleep(Duration::from_secs_f64(wait));
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
        let t = Throttle::new(20 << 20); // 20 MiB/s
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
        assert_eq!(Throttle::new(30_000_000).piece() % 4096, 0);
    }
}

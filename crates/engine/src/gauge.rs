//! Where the streams spend their time: the bottleneck report.
//!
//! Each stream publishes what it is doing right now in one relaxed atomic
//! byte (a store costs about a nanosecond, so the hot path pays nothing
//! measurable), and a sampler thread reads all of them every few
//! milliseconds. From the samples come stream-seconds per activity, and a
//! one-line verdict: a job whose streams mostly wait on the source is
//! source-bound, one that mostly writes is target-bound, one whose streams
//! mostly wait for work is bound by the walk (more streams will not help).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::time::Duration;

/// What a stream is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Activity {
    /// Waiting for work: the queue is empty.
    Idle = 0,
    /// Listing and stat-ing source directories, opening source files.
    Walk = 1,
    /// Reading file data (the source's; for verify and block-delta, DST's
    /// too).
    Read = 2,
    /// Writing data or creating entries and setting metadata in DST.
    Write = 3,
    /// A copy done inside the kernel (`copy_file_range`, clone, or the
    /// buffered fallback), reading and writing at once.
    Copy = 4,
    /// Waiting for the journal to record a chunk durably.
    Journal = 5,
    /// Not in use: `-j auto` runs fewer streams than it could.
    Parked = 6,
}

pub const KINDS: usize = 7;

/// Seconds of stream time per activity, summed over the streams.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Busy {
    pub idle: f64,
    pub walk: f64,
    pub read: f64,
    pub write: f64,
    pub copy: f64,
    pub journal: f64,
    /// Streams `-j auto` kept out of use (not part of the total).
    pub parked: f64,
}

impl Busy {
    pub fn total(&self) -> f64 {
        self.idle + self.walk + self.read + self.write + self.copy + self.journal
    }

    /// One line saying what bounds the job, for people.
    pub fn verdict(&self) -> &'static str {
        let total = self.total();
        if total <= 0.0 {
            return "too short to tell";
        }
        let target = self.write + self.journal;
        let most = self.walk.max(self.read).max(target).max(self.copy);
        if self.idle > 0.5 * total {
            "streams mostly waited for work the walk had not found yet: fewer streams would do"
        } else if most == self.walk {
            "bound by metadata (listing, stat, open): more streams help while the disks have IOPS to spare"
        } else if most == self.copy {
            "bound by in-kernel copies, both disks at once"
        } else if self.read > 1.5 * target {
            "bound by reads: more streams help only a disk with latency to hide"
        } else if target > 1.5 * self.read {
            "bound by target writes: more streams help only while the target has latency to hide"
        } else {
            "balanced between source reads and target writes"
        }
    }
}

/// The streams' current activities and the sampled totals.
pub struct Gauge {
    now: Vec<AtomicU8>,
    samples: [AtomicU64; KINDS],
    interval: Duration,
}

impl Gauge {
    pub fn new(streams: usize) -> Gauge {
        Gauge {
            now: (0..streams)
                .map(|_| AtomicU8::new(Activity::Idle as u8))
                .collect(),
            samples: Default::default(),
            interval: Duration::from_millis(5),
        }
    }

    /// Stream `i` is now doing `a`.
    #[inline]
    pub fn set(&self, i: usize, a: Activity) {
        if let Some(s) = self.now.get(i) {
            s.store(a as u8, Relaxed);
        }
    }

    /// Samples every stream until `done` is set.
    pub fn sample_until(&self, done: &AtomicBool) {
        while !done.load(Relaxed) {
            std::thread::sleep(self.interval);
            for s in &self.now {
                let k = (s.load(Relaxed) as usize).min(KINDS - 1);
                self.samples[k].fetch_add(1, Relaxed);
            }
        }
    }

    /// The samples so far, per activity (indexed by `Activity as usize`).
    pub fn counts(&self) -> [u64; KINDS] {
        std::array::from_fn(|k| self.samples[k].load(Relaxed))
    }

    /// Stream-seconds per activity, scaled so they add up to `streams ×
    /// elapsed`, parked streams included (sleeps overshoot, so samples are
    /// shares, not durations).
    pub fn busy(&self, elapsed: Duration) -> Busy {
        let n: Vec<f64> = self
            .samples
            .iter()
            .map(|s| s.load(Relaxed) as f64)
            .collect();
        let sum: f64 = n.iter().sum();
        if sum == 0.0 {
            return Busy::default();
        }
        let scale = elapsed.as_secs_f64() * self.now.len() as f64 / sum;
        Busy {
            idle: n[0] * scale,
            walk: n[1] * scale,
            read: n[2] * scale,
            write: n[3] * scale,
            copy: n[4] * scale,
            journal: n[5] * scale,
            parked: n[6] * scale,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts() {
        let b = |idle, read, write| Busy {
            idle,
            read,
            write,
            ..Busy::default()
        };
        assert!(b(8.0, 1.0, 1.0)
            .verdict()
            .starts_with("streams mostly waited"));
        assert!(b(0.0, 1.0, 5.0).verdict().starts_with("bound by target"));
        assert!(b(0.0, 5.0, 1.0).verdict().starts_with("bound by reads"));
        assert!(b(0.0, 1.0, 1.2).verdict().starts_with("balanced"));
        let walk = Busy {
            walk: 5.0,
            read: 1.0,
            ..Busy::default()
        };
        assert!(walk.verdict().starts_with("bound by metadata"));
        assert_eq!(Busy::default().verdict(), "too short to tell");
    }

    #[test]
    fn samples_scale_to_stream_time() {
        let g = Gauge::new(2);
        g.set(0, Activity::Write);
        g.set(1, Activity::Idle);
        let done = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| g.sample_until(&done));
            std::thread::sleep(Duration::from_millis(60));
            done.store(true, Relaxed);
        });
        let b = g.busy(Duration::from_secs(1));
        assert!((b.total() + b.parked - 2.0).abs() < 1e-9);
        assert!((b.write - 1.0).abs() < 1e-9 && (b.idle - 1.0).abs() < 1e-9);
    }
}

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

/// How hard one host worked during a job: the CPU its sluice process
/// used, and for the host that serves a source across a wire, the time
/// its threads spent in the file system answering (listing, opening,
/// reading, hashing).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Load {
    /// Seconds spent answering in file system calls, summed over threads.
    pub disk: f64,
    /// Seconds of CPU, user and system, all threads.
    pub cpu: f64,
    /// Cores the host has.
    pub cores: u32,
}

impl Load {
    /// This host and this process, now.
    pub fn now() -> Load {
        Load::this_host(sluice_sys::process_cpu_time())
    }

    /// This host, whose sluice process has used `cpu` so far.
    pub fn this_host(cpu: Duration) -> Load {
        Load {
            disk: 0.0,
            cpu: cpu.as_secs_f64(),
            cores: std::thread::available_parallelism().map_or(1, |n| n.get() as u32),
        }
    }

    /// The share of the host's CPU the process used over `elapsed`.
    fn cpu_share(&self, elapsed: f64) -> f64 {
        self.cpu / (elapsed * f64::from(self.cores.max(1)))
    }
}

/// What bounded a job that read its source across a wire, naming the
/// side: the job runs on the destination host (`here`), the source host
/// (`far`) answers its reads. Streams waiting on the source are waiting
/// on the far host's disk if it spent about that long in the file system,
/// else on the link between the two; a host whose sluice used most of its
/// cores is the bound whatever the streams waited on.
pub fn across(busy: &Busy, elapsed: f64, here: &Load, far: &Load) -> &'static str {
    let total = busy.total();
    if total <= 0.0 || elapsed <= 0.0 {
        return "too short to tell";
    }
    let target = busy.write + busy.journal;
    let source = busy.read + busy.walk;
    // Streams left idle while a few chunks crawl over the link are not
    // waiting for the walk: idleness speaks only when the walk is most of
    // the rest.
    if busy.idle > 0.5 * total && busy.walk > busy.read + target {
        busy.verdict()
    } else if here.cpu_share(elapsed) >= BUSY_CPU {
        "bound by the destination host's CPU"
    } else if far.cpu_share(elapsed) >= BUSY_CPU {
        "bound by the source host's CPU"
    } else if target > 1.5 * source {
        "bound by writes to the destination host's disk"
    } else if source > 1.5 * target && far.disk >= 0.5 * source {
        "bound by the source host's disk: its reads took most of the time streams waited"
    } else if source > 1.5 * target {
        "bound by the link between the hosts: neither host's disk or CPU was busy"
    } else {
        "balanced between the source host's reads and the destination host's writes"
    }
}

/// A host whose sluice used this share of its cores is bound by its CPU.
const BUSY_CPU: f64 = 0.8;

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
    fn verdicts_across_hosts_name_the_side() {
        let waits = Busy {
            read: 8.0,
            write: 1.0,
            ..Busy::default()
        };
        let calm = Load {
            disk: 0.5,
            cpu: 1.0,
            cores: 2,
        };
        let v = |b: &Busy, here: &Load, far: &Load| across(b, 4.0, here, far);
        assert!(v(&waits, &calm, &calm).starts_with("bound by the link"));
        let disk = Load { disk: 6.0, ..calm };
        assert!(v(&waits, &calm, &disk).starts_with("bound by the source host's disk"));
        let hot = Load { cpu: 7.0, ..calm };
        assert!(v(&waits, &calm, &hot).starts_with("bound by the source host's CPU"));
        assert!(v(&waits, &hot, &calm).starts_with("bound by the destination host's CPU"));
        let writes = Busy {
            read: 1.0,
            write: 8.0,
            ..Busy::default()
        };
        assert!(v(&writes, &calm, &calm).starts_with("bound by writes to the destination"));
        let both = Busy {
            read: 4.0,
            write: 4.0,
            ..Busy::default()
        };
        assert!(v(&both, &calm, &calm).starts_with("balanced"));
        let idle = Busy {
            idle: 9.0,
            walk: 1.0,
            ..Busy::default()
        };
        assert!(v(&idle, &calm, &calm).starts_with("streams mostly waited"));
        // More streams than chunks in flight: the rest idle, the link holds.
        let few = Busy {
            idle: 9.0,
            read: 2.0,
            ..Busy::default()
        };
        assert!(v(&few, &calm, &calm).starts_with("bound by the link"));
        assert_eq!(v(&Busy::default(), &calm, &calm), "too short to tell");
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

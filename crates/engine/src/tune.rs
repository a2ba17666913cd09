//! `-j auto`: the number of active streams, tuned while the job runs.
//!
//! The pool starts as many streams as the memory budget allows, but only
//! the first `target` take work; the others wait at the [`Gate`] (they hold
//! no buffer: buffers are allocated on first use). A tuner thread measures
//! throughput (an entry finished, or 256 KiB moved, is one unit) and
//! climbs:
//!
//! * The first climb moves fast: quarter-second windows, steps as large as
//!   the idle CPU suggests (up to 4x), larger still while each step pays
//!   nearly in proportion (a share with latency to hide). Its last step is
//!   kept unless it made things worse, since windows this early are noisy;
//!   one that made things worse tries the middle before going back.
//! * After it, windows are a second long. A step up must gain by a tenth or
//!   more, and by more than the noise between windows at one target, or it
//!   is taken back exactly; a flat response holds, looking upward now and
//!   then, since a job changes from small files to chunks and back.
//! * No step goes up while the process uses 95% of the cores ([`BUSY`]).
//! * A step whose new streams mostly waited for work (the walk behind) is
//!   measured once more before it is judged.
//!
//! Within that count, a second climber sets how many streams may copy
//! chunks of big files at once (the queue's chunk limit), scored by chunk
//! bytes per second alone. It moves only in a window where the first held
//! still and chunks were copied throughout, so each sees its own effect;
//! the streams it takes from big files go to small ones.

use crate::gauge::{Activity, Gauge, KINDS};
use crate::options::Stats;
use crate::queue::Queue;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// The most streams `-j auto` may use (memory permitting).
pub const AUTO_MAX: usize = 64;

/// The share of the cores the process may use and still add streams.
/// It was 85%: on the dense set from disk the process used 1.6-1.85 of 2
/// cores at 16 streams, so auto held there, while `-j 32` took 4.4 s
/// against 5.2-5.5 s (streams blocked on cold reads cost no CPU; the
/// loop device's and interrupt work is not the process's). A copy between
/// two tmpfs mounts, the case the rule is for, uses 1.98 cores at 8.
pub const BUSY: f64 = 0.95;

/// Data and chunk tasks the queue holds per stream at work.
pub const QUEUE_PER_STREAM: usize = 4;

/// How many streams may take work.
pub struct Gate {
    target: AtomicUsize,
    max: usize,
    closed: AtomicBool,
    lock: Mutex<()>,
    cv: Condvar,
}

impl Gate {
    pub fn new(target: usize, max: usize) -> Gate {
        Gate {
            target: AtomicUsize::new(target.clamp(1, max)),
            max,
            closed: AtomicBool::new(false),
            lock: Mutex::new(()),
            cv: Condvar::new(),
        }
    }

    pub fn target(&self) -> usize {
        self.target.load(Relaxed)
    }

    pub fn set(&self, n: usize) {
        let _g = self.lock.lock().expect("gate lock");
        self.target.store(n.clamp(1, self.max), Relaxed);
        self.cv.notify_all();
    }

    /// Waits until stream `id` may take work; false once the job is over.
    pub fn wait_turn(&self, id: usize) -> bool {
        if id < self.target.load(Relaxed) {
            return !self.closed.load(Relaxed);
        }
        let mut g = self.lock.lock().expect("gate lock");
        while id >= self.target.load(Relaxed) && !self.closed.load(Relaxed) {
            g = self.cv.wait(g).expect("gate lock");
        }
        !self.closed.load(Relaxed)
    }

    /// The job is over: every waiting stream leaves.
    pub fn close(&self) {
        let _g = self.lock.lock().expect("gate lock");
        self.closed.store(true, Relaxed);
        self.cv.notify_all();
    }
}

/// The hill climber's state; pure, so its decisions are tested alone.
#[derive(Debug)]
pub struct Climb {
    pub target: usize,
    max: usize,
    /// +1 or -1.
    dir: i32,
    factor: f64,
    last: Option<f64>,
    flat: u32,
    /// The target before the last move, to return to exactly.
    before: usize,
    /// The target the last score was measured at.
    measured_at: usize,
    /// Typical relative change between two windows at one target, once
    /// one such pair has been seen.
    noise: Option<f64>,
    /// Set by the caller: how many times more CPU the process could use
    /// ([`BUSY`] of the cores over what it used in the last window). At 1 or
    /// less no step goes up, since more streams would only queue for a core
    /// (a copy between two RAM-backed file systems); while the first climb
    /// pays, a large headroom makes the steps larger.
    pub headroom: f64,
    /// True until the first step that does not pay: the first climb.
    pub rising: bool,
    /// Set by the caller: the share of the working streams' time spent
    /// waiting for work in the last window.
    pub idle: f64,
    /// The last step up was measured again, its first window inconclusive.
    retried: bool,
    /// The fewest streams seen doing no better than fewer: steps up stay
    /// below it until a periodic look upward forgets it.
    bad: Option<usize>,
}

impl Climb {
    /// A new ceiling (the chunk climber's is the stream target).
    pub fn set_max(&mut self, max: usize) {
        self.max = max.max(1);
        self.target = self.target.min(self.max);
        self.before = self.before.min(self.max);
    }

    /// Starts again at `n`, forgetting the last measurement (it was taken
    /// under another ceiling).
    pub fn restart_at(&mut self, n: usize) {
        self.target = n.clamp(1, self.max);
        self.before = self.target;
        self.measured_at = self.target;
        self.last = None;
        self.flat = 0;
    }

    /// A climber that tries fewer first: for the chunk limit, where
    /// streams not needed by big files are worth more to small ones.
    pub fn descending(start: usize, max: usize) -> Climb {
        Climb {
            dir: -1,
            rising: false,
            ..Climb::new(start, max)
        }
    }

    pub fn new(start: usize, max: usize) -> Climb {
        Climb {
            target: start.clamp(1, max),
            max,
            dir: 1,
            factor: 2.0,
            last: None,
            flat: 0,
            before: start.clamp(1, max),
            headroom: f64::INFINITY,
            rising: true,
            idle: 0.0,
            retried: false,
            bad: None,
            measured_at: start.clamp(1, max),
            noise: None,
        }
    }

    /// Takes the throughput measured at the current target; returns the
    /// next target. More streams must earn their keep: a step up that
    /// gained nothing is taken back (they would only hold memory and
    /// contend), a step down that lost nothing is kept.
    ///
    /// "Gained" means beyond the measurements' own noise: at least 10%,
    /// and at least 2.5 times the typical change between two seconds at
    /// the same target. On the huge file, where a second holds a few
    /// 64 MiB chunks, seconds differ by 10-20% on their own, and a fixed
    /// 10% let the climber drift to 50 streams on lucky seconds.
    pub fn step(&mut self, score: f64) -> usize {
        let moved = self.target != self.measured_at;
        self.measured_at = self.target;
        let Some(last) = self.last.replace(score) else {
            return self.move_on();
        };
        if !moved && last > 0.0 {
            let change = (score / last - 1.0).abs();
            self.noise = Some(self.noise.map_or(change, |n| 0.7 * n + 0.3 * change));
        }
        let margin = 1.0 + self.threshold();
        // Two windows at the same target differ by noise or because the
        // work changed, not by anything a step did: no cause to move on.
        let gained = moved && score > last * margin;
        let doubtful = self.idle > 0.25 || self.rising;
        if moved && !gained && self.dir > 0 && doubtful && !self.retried {
            // The streams just added mostly waited for work: the walk had
            // not found enough yet (on a share, the first half second),
            // which says nothing of what they can do. Or the first climb's
            // quarter-second window, on work whose windows differ by 30%
            // (the mixed set from disk), said "worse" once: going back on
            // that left a run at 8 streams, 40% slower than 16. Measure
            // once more against the same baseline.
            self.retried = true;
            self.last = Some(last);
            self.measured_at = self.before;
            return self.target;
        }
        self.retried = false;
        let first_climb = self.rising;
        self.rising &= gained;
        let worse = moved && score * margin < last;
        if gained {
            self.flat = 0;
            // A step up that paid nearly in proportion (doubling the
            // streams gave +60% or more: a target with latency to hide)
            // is followed by a bigger one; the climb to 64 streams took 4
            // of a 10-second job's seconds on the 1 ms share.
            let ratio = self.target as f64 / self.before.max(1) as f64;
            if self.dir > 0 && ratio >= 1.5 && score > last * (1.0 + 0.6 * (ratio - 1.0)) {
                self.factor = (self.factor * 2.0).min(4.0);
            }
            self.move_on()
        } else if self.dir > 0 && self.target != self.before && first_climb && !worse {
            // The first climb's last step neither paid nor hurt: keep it
            // and hold. Windows this early are noisy (the walk is starting,
            // big and small files alternate), and on every pair measured
            // more streams were as fast or faster until the CPU ran out:
            // taking such steps back left the mixed set from disk at 8-16
            // streams, 13% slower than 32. Later steps up must pay.
            self.flat = 0;
            self.before = self.target;
            self.target
        } else if self.dir > 0 && self.target != self.before {
            self.flat = 0;
            self.bad = Some(self.bad.map_or(self.target, |b| b.min(self.target)));
            let (from, to) = (self.before, self.target);
            if to >= 3 * from && first_climb {
                // A big step (idle cores suggested it) overshot: try the
                // middle before settling back, against the same baseline.
                // A huge file from tmpfs gained 15% at 16 streams over 8
                // and nothing at 31.
                self.last = Some(last);
                self.measured_at = from;
                self.target = ((from * to) as f64).sqrt().round() as usize;
                self.rising = true;
                return self.target;
            }
            // More streams did no better (or worse): take the step back,
            // exactly, and look upward again only later, more gently.
            self.dir = -1;
            self.factor = (self.factor / 1.5).max(1.25);
            self.last = Some(last);
            self.target = self.before;
            // `last` was measured here: the next window compares with it
            // at the same target.
            self.measured_at = self.target;
            self.target
        } else if worse {
            // Fewer streams made it worse: go back up.
            self.flat = 0;
            self.dir = 1;
            self.factor = (self.factor / 1.5).max(1.25);
            self.move_on()
        } else {
            self.flat += 1;
            // Hold; every few rounds look upward again, the work may have
            // changed its nature.
            if self.flat >= 6 {
                self.flat = 0;
                self.bad = None;
                self.dir = 1;
                self.factor = self.factor.max(1.5);
                self.move_on()
            } else {
                self.before = self.target;
                self.target
            }
        }
    }

    /// The relative change that counts as a real one.
    fn threshold(&self) -> f64 {
        self.noise.map_or(0.10, |n| (2.5 * n).clamp(0.10, 0.50))
    }

    fn move_on(&mut self) -> usize {
        self.before = self.target;
        if self.dir > 0 && self.headroom <= 1.0 {
            return self.target;
        }
        let t = self.target as f64;
        let next = if self.dir > 0 {
            // While the first climb pays, step as far as the idle CPU
            // suggests (up to 4x): a share at 1 ms per request that uses a
            // tenth of the cores at 8 streams wants 32 or more, and each
            // window spent at 8 and 16 cost a tenth of a 10 s job.
            let factor = if self.rising {
                self.factor.max(self.headroom.min(4.0))
            } else {
                self.factor
            };
            (t * factor).ceil()
        } else {
            (t / self.factor).floor()
        };
        let mut next = (next as usize).clamp(1, self.max);
        if let Some(bad) = self.bad.filter(|&b| self.dir > 0 && next >= b) {
            next = (self.target + bad) / 2; // halfway to what did not pay
        }
        if next == self.target {
            // At a bound: turn around next time.
            self.dir = -self.dir;
        }
        self.target = next;
        next
    }
}

/// Work done so far, in units: an entry finished, or 256 KiB moved.
fn units(stats: &Stats) -> f64 {
    stats.entries_done() as f64 + stats.data_moved.load(Relaxed) as f64 / (256.0 * 1024.0)
}

/// Runs the tuner until `done` is set. The process's CPU time tells it
/// when the cores are the limit: then it does not go up at all. (The
/// gauge cannot: a saturated disk and a share with latency to hide both
/// show streams writing; only a step up tells them apart.) Returns the
/// stream targets it set and the chunk limits, each after the one it
/// started from.
pub fn run<T>(
    gate: &Gate,
    queue: &Queue<T>,
    stats: &Stats,
    gauge: &Gauge,
    done: &AtomicBool,
    interval: Duration,
) -> (Vec<u32>, Vec<u32>) {
    let mut climb = Climb::new(gate.target(), gate.max);
    let mut chunks = Climb::descending(gate.target(), gate.target());
    let mut chunk_bytes = stats.chunk_bytes.load(Relaxed);
    let mut trace = vec![gate.target() as u32];
    let mut chunk_trace = trace.clone();
    let mut warming_up = true;
    let (mut before, mut at) = (units(stats), Instant::now());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let mut cpu = sluice_sys::process_cpu_time();
    let mut samples = gauge.counts();
    // Each window's measures and decision on stderr, for whoever wonders
    // why auto chose what it did.
    let log = std::env::var_os("SLUICE_TUNE_LOG").is_some();
    while !done.load(Relaxed) {
        // Quarter-length windows while the first climb keeps paying: on a
        // share, every second spent at too few streams costs most.
        let window = if climb.rising { interval / 4 } else { interval };
        nap(window, done);
        let chunked_before = queue.chunk_work() > 0;
        let (now, t, cpu_now) = (units(stats), Instant::now(), sluice_sys::process_cpu_time());
        let secs = t.duration_since(at).as_secs_f64();
        let score = (now - before) / secs;
        let used = (cpu_now - cpu).as_secs_f64() / secs;
        let counts = gauge.counts();
        let idle = idle_share(&samples, &counts);
        climb.idle = idle;
        samples = counts;
        climb.headroom = BUSY * cores / used.max(1e-3);
        (before, at, cpu) = (now, t, cpu_now);
        if done.load(Relaxed) {
            break;
        }
        if warming_up {
            // The first window holds the start of the walk and a cold
            // cache: as a baseline it made every later one look like a gain.
            warming_up = false;
            trace.push(climb.target as u32);
            chunk_trace.push(chunks.target as u32);
            chunk_bytes = stats.chunk_bytes.load(Relaxed);
            continue;
        }
        let held = climb.target;
        let next = climb.step(score);
        if log {
            eprintln!(
                "sluice: tune: {secs:.2} s at {held} streams: {score:.0} units/s, \
                 {used:.2} cores, {:.0}% idle -> {next}",
                idle * 100.0
            );
        }
        gate.set(next);
        queue.set_data_cap(next * QUEUE_PER_STREAM);
        trace.push(next as u32);
        let cb = stats.chunk_bytes.load(Relaxed);
        let chunk_rate = (cb - chunk_bytes) as f64 / secs;
        chunk_bytes = cb;
        // A chunk limit the second climber has not lowered follows the
        // stream count up: in a job of big files only, the first climber
        // is the one that adds streams for chunks.
        let follows = chunks.target >= held;
        chunks.set_max(next);
        if follows && next > held {
            chunks.restart_at(next);
        } else if next == held && chunked_before && queue.chunk_work() > 0 && chunk_rate > 0.0 {
            chunks.headroom = climb.headroom;
            chunks.step(chunk_rate);
        }
        queue.set_chunk_limit(chunks.target);
        chunk_trace.push(chunks.target as u32);
        if next != held {
            // Streams just woken (or parked) take a moment to reach their
            // pace: the next window starts after it, so a quarter-second
            // window does not judge 64 streams by their first 50 ms.
            nap(window / 5, done);
            (before, at, cpu) = (units(stats), Instant::now(), sluice_sys::process_cpu_time());
            chunk_bytes = stats.chunk_bytes.load(Relaxed);
            samples = gauge.counts();
        }
    }
    (trace, chunk_trace)
}

/// The share of working streams' time spent waiting for work between two
/// gauge readings (parked streams do not count).
fn idle_share(before: &[u64; KINDS], now: &[u64; KINDS]) -> f64 {
    let d = |a: Activity| (now[a as usize] - before[a as usize]) as f64;
    let parked = d(Activity::Parked);
    let all: f64 = (0..KINDS).map(|k| (now[k] - before[k]) as f64).sum::<f64>() - parked;
    if all > 0.0 {
        d(Activity::Idle) / all
    } else {
        0.0
    }
}

/// Sleeps `d` in short naps, so the end of the job is not held up.
fn nap(d: Duration, done: &AtomicBool) {
    let start = Instant::now();
    while start.elapsed() < d && !done.load(Relaxed) {
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Throughput rising to 8 streams, flat after, and a little worse
    /// beyond 16 (contention), as a disk behaves.
    fn curve(n: usize) -> f64 {
        let n = n as f64;
        if n <= 8.0 {
            100.0 * n
        } else if n <= 16.0 {
            800.0
        } else {
            800.0 - 10.0 * (n - 16.0)
        }
    }

    #[test]
    fn climbs_to_the_knee_and_stays_near_it() {
        let mut c = Climb::new(2, 64);
        let mut seen = Vec::new();
        for _ in 0..40 {
            let t = c.target;
            seen.push(t);
            c.step(curve(t));
        }
        let late = &seen[20..];
        assert!(
            late.iter().filter(|&&t| (5..=16).contains(&t)).count() >= late.len() * 3 / 4,
            "{seen:?}"
        );
    }

    /// Big files that stream as fast on 2 streams as on 16 (one disk):
    /// the chunk climber gives the rest back; where every stream adds
    /// bandwidth it stays at the top.
    #[test]
    fn the_chunk_limit_comes_down_where_big_files_gain_nothing() {
        let mut c = Climb::descending(16, 16);
        for _ in 0..12 {
            let t = c.target;
            c.step(if t >= 2 { 600.0 } else { 350.0 });
        }
        assert!(c.target < 16, "kept {} chunk streams for nothing", c.target);
        assert!(c.target >= 2, "starved big files: {}", c.target);
        let mut c = Climb::descending(16, 16);
        for _ in 0..12 {
            let t = c.target;
            c.step(100.0 * t as f64);
        }
        assert!(c.target >= 12, "gave up bandwidth: {}", c.target);
    }

    #[test]
    fn no_more_streams_than_the_cores_can_run() {
        let mut c = Climb::new(8, 64);
        c.headroom = 0.9;
        for _ in 0..30 {
            let t = c.target;
            assert!(c.step(curve(t) * 2.0) <= 8, "grew with the CPUs busy");
        }
    }

    /// A flat curve measured with +-20% noise (a second of 64 MiB chunks):
    /// the climber holds instead of wandering on lucky seconds, and a real
    /// doubling still shows through that noise.
    #[test]
    fn noise_does_not_look_like_a_gain() {
        let mut x = 12345u64;
        let mut noisy = || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            1.0 + 0.2 * (((x >> 33) as f64 / (1u64 << 31) as f64) * 2.0 - 1.0)
        };
        let mut c = Climb::new(8, 64);
        let mut seen = Vec::new();
        for _ in 0..60 {
            seen.push(c.target);
            c.step(500.0 * noisy());
        }
        // it keeps the first climb's step (32: headroom unknown) and holds
        // there, looking up now and then but never staying up
        let late = &seen[20..];
        let changes = late.windows(2).filter(|w| w[0] != w[1]).count();
        let at_32 = late.iter().filter(|&&t| t == 32).count();
        assert!(
            late.iter().all(|&t| t <= 48) && at_32 * 4 >= late.len() * 3,
            "wandered on noise ({changes} changes): {seen:?}"
        );
        let mut c = Climb::new(8, 64);
        for _ in 0..30 {
            let t = c.target as f64;
            c.step(50.0 * t.min(48.0) * noisy());
        }
        assert!(c.target >= 32, "missed a real gain: {}", c.target);
    }

    /// Writes dominate on a share with latency per request too, but there
    /// every step up pays: the climb goes on to the top.
    #[test]
    fn a_target_with_latency_to_hide_gets_many_streams() {
        let mut c = Climb::new(8, 64);
        let share = |n: usize| 100.0 * (n.min(48) as f64);
        for _ in 0..10 {
            let t = c.target;
            c.step(share(t));
        }
        assert!(c.target >= 32, "stopped at {}", c.target);
        // and gets there fast: near-linear gains take bigger steps, and
        // idle cores bigger ones from the start
        let climb = |headroom: f64| {
            let mut c = Climb::new(8, 64);
            let mut seen = vec![c.target];
            for _ in 0..3 {
                let t = c.target;
                c.headroom = headroom;
                seen.push(c.step(share(t)));
            }
            seen
        };
        assert_eq!(climb(1.5), [8, 16, 64, 64], "too slow a climb");
        assert_eq!(climb(10.0), [8, 32, 64, 64], "too slow a climb");
        // a big first step that hurt tries the middle, which is kept if
        // it does not hurt; past the first climb, steps are small again
        let mut c = Climb::new(8, 64);
        c.headroom = 10.0;
        c.step(800.0);
        c.step(600.0); // 32 worse than 8: measured again
        assert_eq!(c.target, 32);
        c.step(600.0); // still worse: try 16
        assert_eq!(c.target, 16);
        c.step(800.0); // as good as 8, twice: kept
        c.step(800.0);
        assert_eq!(c.target, 16);
        assert!(!c.rising);
        for _ in 0..8 {
            c.step(800.0);
        }
        assert!(c.target <= 24, "probed up by {}", c.target);
    }

    /// A step up measured while the new streams mostly waited for work
    /// (the walk behind, early in a job on a share) is measured again
    /// before it is judged; once the work is there it pays and stays. If
    /// the second window is no better either, the step is taken back.
    #[test]
    fn a_step_up_that_found_no_work_yet_is_measured_again() {
        let mut c = Climb::new(32, 64);
        c.headroom = 2.0;
        c.step(2600.0); // at 32 -> 64
        assert_eq!(c.target, 64);
        c.idle = 0.5;
        assert_eq!(c.step(2600.0), 64, "judged streams that had no work");
        c.idle = 0.1;
        assert_eq!(c.step(3400.0), 64);
        assert_eq!(c.step(3400.0), 64);

        let mut c = Climb::new(32, 64);
        c.step(2600.0);
        c.idle = 0.5;
        c.step(2600.0);
        assert_eq!(c.step(2000.0), 32, "kept streams that made it worse");
    }

    /// A flat curve: the first climb's step is kept (it did not hurt, and
    /// early windows cannot tell more), then the climber holds; its later
    /// looks upward do not pay and are taken back, so it does not drift.
    #[test]
    fn a_flat_curve_keeps_its_first_step_then_holds() {
        let mut c = Climb::new(8, 64);
        c.headroom = 1.5;
        let mut seen = Vec::new();
        for _ in 0..40 {
            seen.push(c.step(500.0));
        }
        assert_eq!(seen[..3], [16, 16, 16], "{seen:?}");
        let changes = seen.windows(2).filter(|w| w[0] != w[1]).count();
        assert!(changes <= 14, "{changes} changes on a flat curve: {seen:?}");
        let late = &seen[20..];
        let above = late.iter().filter(|&&t| t > 16).count();
        assert!(
            above <= late.len() / 5 && late.iter().all(|&t| t <= 32),
            "more streams for nothing: {seen:?}"
        );
    }

    #[test]
    fn the_gate_parks_streams_above_the_target_and_frees_them_at_close() {
        let g = Gate::new(1, 4);
        assert!(g.wait_turn(0));
        std::thread::scope(|s| {
            let h = s.spawn(|| g.wait_turn(3));
            std::thread::sleep(Duration::from_millis(20));
            assert!(!h.is_finished());
            g.set(4);
            assert!(h.join().unwrap());
        });
        g.set(1);
        std::thread::scope(|s| {
            let h = s.spawn(|| g.wait_turn(2));
            std::thread::sleep(Duration::from_millis(20));
            g.close();
            assert!(!h.join().unwrap());
        });
    }
}

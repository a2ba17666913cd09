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
//! * After it, windows are a second long, and the count held is compared
//!   now and then with another ([`Look`]): first with the other end of the
//!   climb (where it started, or the most it tried if it came back down),
//!   then with half and twice as many, down and up in turn, windows at
//!   each taken in turn until the mean difference stands out of the noise
//!   (or eight pairs say it does not: the count stays). A look that finds
//!   nothing better doubles the wait before the next that way (6 windows
//!   to 64), so a long job spends most of its time at its count, yet
//!   follows its work as it changes. No look starts near the end.
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

/// Windows held at one count, once the first climb is over, before the
/// first look down or up from it; each look that finds nothing better
/// doubles the wait in its direction, up to [`MAX_WAIT`].
const FIRST_WAIT: u32 = 6;
const MAX_WAIT: u32 = 64;

/// No look starts with fewer windows of work left than this (once the
/// walk is over, the work left is known): it could not pay for itself.
/// The first look on the 8 GiB file came a second before the end and cost
/// 3% there.
const LOOK_WORTH: f64 = 8.0;

/// A look at another count ends, undecided, after this many pairs of
/// windows: by then the difference is within the noise, and the count
/// held stays.
const MAX_PAIRS: usize = 8;

/// What the extra streams must be shown to buy, as the log of a ratio
/// (0.04: 4%), for a look to keep them.
const EARN: f64 = 0.04;

/// The hill climber's state; pure, so its decisions are tested alone.
#[derive(Debug)]
pub struct Climb {
    pub target: usize,
    max: usize,
    /// +1 or -1: the way the next look goes (the first climb only goes up).
    dir: i32,
    factor: f64,
    last: Option<f64>,
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
    /// The fewest streams seen doing no better than fewer: the first
    /// climb's steps up stay below it.
    bad: Option<usize>,
    /// Past the first climb: the look at another count under way.
    look: Option<Look>,
    /// Windows held since the last look ended.
    held: u32,
    /// Windows to hold before the next look down ([0]) and up ([1]).
    wait: [u32; 2],
    /// Set by the caller: windows of work left at the last window's pace
    /// (infinite while the walk is still finding work).
    pub windows_left: f64,
    /// The count the first climb started from, and the most it tried.
    start: usize,
    peak: usize,
    /// The count the first look compares with: the other end of the first
    /// climb. Its steps were judged on one or two quarter-second windows;
    /// a climb from 16 to 64 kept though it cost 10% (a long job from
    /// disk) is missed by looks at half the count, each half of it within
    /// the noise, and one from 16 to 55 taken back on an unlucky quarter
    /// second never looked up again in a 19-second job.
    first_look: Option<usize>,
}

/// Past the first climb, the held count (`home`) is compared with another
/// (`other`: the first climb's other end, then half or twice as many) in
/// windows taken in turn, home, other | other, home | home, other ..., so
/// that a drift in the work weighs on both alike and only every second
/// window follows a change. Each pair gives the log of the ratio "more
/// streams / fewer streams"; the look ends as soon as the mean of those,
/// give or take 2.5 standard errors, says the extra streams buy something
/// (more than half of [`EARN`]) or less than [`EARN`].
///
/// One-second windows of the mixed set from disk differ by 15-30% at one
/// count, so a 10% difference takes several pairs to show; judging it on
/// one window each (as the first climb must, to be quick) walked the count
/// on noise, and not looking at all left a 20-second job at 64 streams
/// where 16 were 12% faster.
#[derive(Debug)]
struct Look {
    home: usize,
    other: usize,
    /// ln(score with more streams / score with fewer), one per pair.
    gains: Vec<f64>,
    /// The first window of the pair under way: its score, whether it was
    /// at `other`, and the share of time its streams waited for work.
    first: Option<(f64, bool, f64)>,
    /// Pairs left out because the larger count's streams had no work.
    skipped: u32,
}

enum Verdict {
    More,
    Fewer,
    Home,
    Open,
}

impl Look {
    /// `spread`: the expected spread of one pair's gain, from the windows
    /// held at one count before the look (their noise); the pairs' own
    /// spread takes over as they come in.
    fn verdict(&self, spread: f64) -> Verdict {
        let n = self.gains.len() as f64;
        if n == 0.0 {
            return Verdict::Open;
        }
        let mean = self.gains.iter().sum::<f64>() / n;
        let squares: f64 = self.gains.iter().map(|g| (g - mean).powi(2)).sum();
        // A few pairs that happen to agree say little of the spread: the
        // noise measured while holding is the floor. 2.5 standard errors,
        // not 2, since the verdict is asked after every pair.
        let sample = if n > 1.0 {
            (squares / (n - 1.0)).sqrt()
        } else {
            0.0
        };
        let error = 2.5 * spread.max(sample).max(0.025) / n.sqrt();
        if mean - error > 0.0 && mean > EARN / 2.0 {
            Verdict::More
        } else if mean + error < EARN {
            Verdict::Fewer
        } else if self.gains.len() >= MAX_PAIRS {
            // Within the noise: stay. Deciding by the larger mean walked
            // a flat curve up and down on nothing.
            Verdict::Home
        } else {
            Verdict::Open
        }
    }
}

impl Climb {
    /// A new ceiling (the chunk climber's is the stream target).
    pub fn set_max(&mut self, max: usize) {
        self.max = max.max(1);
        self.target = self.target.min(self.max);
        self.before = self.before.min(self.max);
        if self
            .look
            .as_ref()
            .is_some_and(|l| l.home.max(l.other) > self.max)
        {
            self.look = None;
            self.held = 0;
        }
    }

    /// Starts again at `n`, forgetting the last measurement (it was taken
    /// under another ceiling).
    pub fn restart_at(&mut self, n: usize) {
        self.target = n.clamp(1, self.max);
        self.before = self.target;
        self.measured_at = self.target;
        self.last = None;
        self.look = None;
        self.held = 0;
    }

    /// True while another count is being compared with the held one.
    pub fn looking(&self) -> bool {
        self.look.is_some()
    }

    /// A climber that tries fewer first, without a climb: for the chunk
    /// limit, where streams not needed by big files are worth more to
    /// small ones. It looks down after two windows (one measure of noise).
    pub fn descending(start: usize, max: usize) -> Climb {
        Climb {
            dir: -1,
            rising: false,
            wait: [2, FIRST_WAIT],
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
            before: start.clamp(1, max),
            headroom: f64::INFINITY,
            rising: true,
            idle: 0.0,
            retried: false,
            bad: None,
            measured_at: start.clamp(1, max),
            noise: None,
            look: None,
            held: 0,
            wait: [FIRST_WAIT; 2],
            windows_left: f64::INFINITY,
            start: start.clamp(1, max),
            peak: start.clamp(1, max),
            first_look: None,
        }
    }

    /// Takes the throughput measured at the current target; returns the
    /// next target: by the first climb's rules while it lasts, then by
    /// looks at half and twice the held count ([`Look`]).
    pub fn step(&mut self, score: f64) -> usize {
        if !self.rising {
            return self.settled(score);
        }
        let next = self.climb(score);
        if !self.rising {
            // The first look goes to the other end of the climb: back up to
            // the most it tried if it came down, else back to its start.
            self.held = 0;
            let up = next < self.peak;
            let end = if up { self.peak } else { self.start };
            self.dir = if up { 1 } else { -1 };
            self.first_look = (end != next).then_some(end);
        }
        next
    }

    /// The first climb. More streams must earn their keep: a step up that
    /// gained nothing is taken back (they would only hold memory and
    /// contend).
    ///
    /// "Gained" means beyond the measurements' own noise: at least 10%,
    /// and at least 2.5 times the typical change between two seconds at
    /// the same target. On the huge file, where a second holds a few
    /// 64 MiB chunks, seconds differ by 10-20% on their own, and a fixed
    /// 10% let the climber drift to 50 streams on lucky seconds.
    fn climb(&mut self, score: f64) -> usize {
        let moved = self.target != self.measured_at;
        self.measured_at = self.target;
        let Some(last) = self.last.replace(score) else {
            return self.move_on();
        };
        self.note_noise(moved, last, score);
        let margin = 1.0 + self.threshold();
        // Two windows at the same target differ by noise or because the
        // work changed, not by anything a step did: no cause to move on.
        let gained = moved && score > last * margin;
        if moved && !gained && !self.retried {
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
        self.rising = gained;
        let worse = moved && score * margin < last;
        if gained {
            // A step up that paid nearly in proportion (doubling the
            // streams gave +60% or more: a target with latency to hide)
            // is followed by a bigger one; the climb to 64 streams took 4
            // of a 10-second job's seconds on the 1 ms share.
            let ratio = self.target as f64 / self.before.max(1) as f64;
            if ratio >= 1.5 && score > last * (1.0 + 0.6 * (ratio - 1.0)) {
                self.factor = (self.factor * 2.0).min(4.0);
            }
            self.move_on()
        } else if self.target != self.before && !worse {
            // The first climb's last step neither paid nor hurt: keep it,
            // for the looks that follow to judge. Windows this early are
            // noisy (the walk is starting, big and small files alternate),
            // and on every pair measured more streams were as fast or
            // faster until the CPU ran out: taking such steps back left
            // the mixed set from disk at 8-16 streams, 13% slower than 32.
            self.before = self.target;
            self.target
        } else if self.target != self.before {
            self.bad = Some(self.bad.map_or(self.target, |b| b.min(self.target)));
            let (from, to) = (self.before, self.target);
            if to >= 3 * from {
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
            // More streams did worse: take the step back, exactly.
            self.last = Some(last);
            self.target = self.before;
            // `last` was measured here: the next window compares with it
            // at the same target.
            self.measured_at = self.target;
            self.target
        } else {
            // At the ceiling, or the cores busy: the climb is over.
            self.before = self.target;
            self.target
        }
    }

    /// Past the first climb: holds, and now and then looks at half or
    /// twice the count ([`Look`]), down and up in turn. A look that finds
    /// the other count better moves there and looks on the same way at
    /// once; one that does not waits twice as long before that way again,
    /// so a job of hours that found its count spends little time away from
    /// it, yet notices within a minute or two when its work changes.
    fn settled(&mut self, score: f64) -> usize {
        let at = self.target;
        let moved = at != self.measured_at;
        self.measured_at = at;
        if let Some(last) = self.last.replace(score) {
            self.note_noise(moved, last, score);
        }
        let Some(mut look) = self.look.take() else {
            self.held += 1;
            let way = usize::from(self.dir > 0);
            if self.held >= self.wait[way] && self.windows_left >= LOOK_WORTH {
                match self.other(self.dir) {
                    Some(other) => {
                        self.look = Some(Look {
                            home: at,
                            other,
                            gains: Vec::new(),
                            first: Some((score, false, self.idle)),
                            skipped: 0,
                        });
                        self.target = other;
                    }
                    // At a bound, or the cores busy: the other way next.
                    None => self.dir = -self.dir,
                }
            }
            return self.target;
        };
        let at_other = at == look.other;
        let Some((first, first_at_other, first_idle)) = look.first.take() else {
            // The first window of a pair; the second is at the other count.
            look.first = Some((score, at_other, self.idle));
            self.target = if at_other { look.home } else { look.other };
            self.look = Some(look);
            return self.target;
        };
        let (at_other_score, home_score) = if first_at_other {
            (first, score)
        } else {
            (score, first)
        };
        let other_is_more = look.other > look.home;
        // How much the streams at the larger count waited for work.
        let more_idle = if first_at_other == other_is_more {
            first_idle
        } else {
            self.idle
        };
        if at_other_score <= 0.0 || home_score <= 0.0 || more_idle > 0.25 {
            // Nothing done in a window, or the larger count's streams
            // mostly waited for work (the walk behind): the pair says
            // nothing of what streams can do.
            look.skipped += 1;
        } else {
            let ratio = (at_other_score / home_score).ln();
            look.gains.push(if other_is_more { ratio } else { -ratio });
        }
        let verdict = if look.skipped >= 3 {
            Verdict::Home
        } else {
            look.verdict(1.25 * self.noise.unwrap_or(0.12))
        };
        let winner = match verdict {
            Verdict::Open => {
                // The next pair starts here.
                self.look = Some(look);
                return self.target;
            }
            Verdict::More => look.home.max(look.other),
            Verdict::Fewer => look.home.min(look.other),
            Verdict::Home => look.home,
        };
        let way = usize::from(self.dir > 0);
        self.held = 0;
        if winner == look.other {
            // Moved: look on the same way after one window there, and the
            // other way soon.
            self.wait[way] = 1;
            self.wait[1 - way] = FIRST_WAIT;
        } else {
            self.wait[way] = (self.wait[way] * 2).clamp(FIRST_WAIT, MAX_WAIT);
            self.dir = -self.dir;
        }
        self.target = winner;
        self.target
    }

    /// The count a look `dir` compares with, if there is one.
    fn other(&mut self, dir: i32) -> Option<usize> {
        let t = self.target;
        if dir < 0 {
            let end = self.first_look.take().filter(|&c| c < t);
            (t > 1).then(|| end.unwrap_or(t / 2).max(1))
        } else {
            // More streams only queue for a core when the cores are busy,
            // and add nothing when those at work wait for work already.
            let end = self.first_look.take().filter(|&c| c > t);
            (t < self.max && self.headroom > 1.0 && self.idle <= 0.25)
                .then(|| end.unwrap_or(t * 2).min(self.max))
        }
    }

    /// Two windows at one target: their difference is noise (or the work
    /// changing), which sets how large a change must be to count.
    fn note_noise(&mut self, moved: bool, last: f64, score: f64) {
        if !moved && last > 0.0 {
            let change = (score / last - 1.0).abs();
            self.noise = Some(self.noise.map_or(change, |n| 0.7 * n + 0.3 * change));
        }
    }

    /// The relative change that counts as a real one in the first climb.
    fn threshold(&self) -> f64 {
        self.noise.map_or(0.10, |n| (2.5 * n).clamp(0.10, 0.50))
    }

    /// The first climb's next step up: as far as the idle CPU suggests
    /// (up to 4x). A share at 1 ms per request that uses a tenth of the
    /// cores at 8 streams wants 32 or more, and each window spent at 8 and
    /// 16 cost a tenth of a 10 s job. At the ceiling, or with the cores
    /// busy, it stays (and the next window ends the climb).
    fn move_on(&mut self) -> usize {
        self.before = self.target;
        if self.headroom <= 1.0 {
            return self.target;
        }
        let factor = self.factor.max(self.headroom.min(4.0));
        let mut next = ((self.target as f64 * factor).ceil() as usize).clamp(1, self.max);
        if let Some(bad) = self.bad.filter(|&b| next >= b) {
            next = (self.target + bad) / 2; // halfway to what did not pay
        }
        self.peak = self.peak.max(next);
        self.target = next;
        next
    }
}

/// Work done so far: entries finished and bytes moved.
fn work(stats: &Stats) -> [f64; 2] {
    [
        stats.entries_done() as f64,
        stats.data_moved.load(Relaxed) as f64,
    ]
}

/// Work as one number, in units: an entry finished, or 256 KiB moved.
fn units([entries, bytes]: [f64; 2]) -> f64 {
    entries + bytes / (256.0 * 1024.0)
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
    let (mut before, mut at) = (work(stats), Instant::now());
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
        let (now, t, cpu_now) = (work(stats), Instant::now(), sluice_sys::process_cpu_time());
        let secs = t.duration_since(at).as_secs_f64();
        let done_now = [now[0] - before[0], now[1] - before[1]];
        let score = units(done_now) / secs;
        let used = (cpu_now - cpu).as_secs_f64() / secs;
        let counts = gauge.counts();
        let idle = idle_share(&samples, &counts);
        climb.idle = idle;
        samples = counts;
        climb.headroom = BUSY * cores / used.max(1e-3);
        climb.windows_left = seconds_left(stats, score) / interval.as_secs_f64();
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
                 {used:.2} cores, {:.0}% idle -> {next} ({:.0} entries/s, {:.1} MiB/s, \
                 {:.0} s left)",
                idle * 100.0,
                done_now[0] / secs,
                done_now[1] / secs / 1048576.0,
                climb.windows_left * interval.as_secs_f64()
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
        } else if next == held
            && !climb.looking()
            && chunked_before
            && queue.chunk_work() > 0
            && chunk_rate > 0.0
        {
            chunks.headroom = climb.headroom;
            chunks.windows_left = climb.windows_left;
            chunks.step(chunk_rate);
        }
        queue.set_chunk_limit(chunks.target);
        chunk_trace.push(chunks.target as u32);
        if next != held {
            // Streams just woken (or parked) take a moment to reach their
            // pace: the next window starts after it, so a quarter-second
            // window does not judge 64 streams by their first 50 ms.
            nap(window / 5, done);
            (before, at, cpu) = (work(stats), Instant::now(), sluice_sys::process_cpu_time());
            chunk_bytes = stats.chunk_bytes.load(Relaxed);
            samples = gauge.counts();
        }
    }
    (trace, chunk_trace)
}

/// Seconds of work left at `score` units a second, once the walk has found
/// it all (entries not yet finished, bytes not yet written); infinite
/// before. Files found unchanged count as work left until passed, so it
/// errs long.
fn seconds_left(stats: &Stats, score: f64) -> f64 {
    let p = stats.progress();
    if !p.walk_done() || score <= 0.0 {
        return f64::INFINITY;
    }
    let left = [
        p.found.saturating_sub(p.done) as f64,
        p.bytes_found.saturating_sub(p.bytes) as f64,
    ];
    units(left) / score
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

    /// Uniform noise of +-`spread`, from a seeded generator.
    fn noise(seed: u64, spread: f64) -> impl FnMut() -> f64 {
        let mut x = seed;
        move || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            1.0 + spread * (((x >> 33) as f64 / (1u64 << 31) as f64) * 2.0 - 1.0)
        }
    }

    /// Runs a climber from `start` on `curve` with noise; the targets seen.
    fn run(
        start: usize,
        headroom: f64,
        windows: usize,
        seed: u64,
        spread: f64,
        curve: impl Fn(usize) -> f64,
    ) -> Vec<usize> {
        let mut noisy = noise(seed, spread);
        let mut c = Climb::new(start, 64);
        c.headroom = headroom;
        (0..windows)
            .map(|_| {
                let t = c.target;
                c.step(curve(t) * noisy());
                t
            })
            .collect()
    }

    /// Gains to 8 streams, flat after, measured with +-20% noise (a second
    /// of 64 MiB chunks): the climber neither wanders up on lucky seconds
    /// nor down on unlucky ones, and a real doubling still shows through.
    #[test]
    fn noise_does_not_look_like_a_gain() {
        for seed in 1..=6 {
            let seen = run(8, f64::INFINITY, 120, seed, 0.2, |t| {
                500.0 * t.min(8) as f64 / 8.0
            });
            let late = &seen[40..];
            let below = late.iter().filter(|&&t| t < 8).count();
            let changes = late.windows(2).filter(|w| w[0] != w[1]).count();
            assert!(
                below * 10 <= late.len() && changes <= late.len() / 3,
                "wandered on noise (seed {seed}): {seen:?}"
            );
            let seen = run(8, f64::INFINITY, 30, seed, 0.2, |t| 50.0 * t.min(48) as f64);
            assert!(seen[29] >= 32, "missed a real gain (seed {seed}): {seen:?}");
        }
    }

    /// A long job where more than 16 streams cost a little (10% at 64: the
    /// mixed set five times over from disk, where writeback and reads share
    /// one disk), measured with +-15% noise. The first climb, on idle cores,
    /// goes to 64 and keeps it (no single window shows the loss); the looks
    /// that follow bring it down to 16, and it stays there.
    #[test]
    fn a_long_job_comes_back_from_an_overshoot() {
        let curve = |t: usize| {
            let t = t as f64;
            if t <= 16.0 {
                1000.0 * (0.6 + 0.4 * t / 16.0)
            } else {
                1000.0 * (1.0 - 0.05 * (t / 16.0).log2())
            }
        };
        let mut all = 0.0;
        for seed in 1..=8 {
            let seen = run(16, 4.0, 240, seed, 0.15, curve);
            assert!(
                seen.iter().take(4).any(|&t| t == 64),
                "no overshoot to start from: {seen:?}"
            );
            let late = &seen[60..];
            let rate = late.iter().map(|&t| curve(t)).sum::<f64>() / late.len() as f64 / curve(16);
            assert!(
                rate >= 0.95,
                "seed {seed}: {:.0}% of the best: {seen:?}",
                100.0 * rate
            );
            all += rate / 8.0;
        }
        assert!(
            all >= 0.965,
            "{:.1}% of the best over all seeds",
            100.0 * all
        );
    }

    /// Writes dominate on a share with latency per request too, but there
    /// every step up pays: the climb goes on to the top.
    #[test]
    fn a_target_with_latency_to_hide_gets_many_streams() {
        let mut c = Climb::new(8, 64);
        let share = |n: usize| 100.0 * (n.min(48) as f64);
        let mut seen = Vec::new();
        for _ in 0..16 {
            let t = c.target;
            seen.push(c.step(share(t)));
        }
        // the first look goes back to 8 for one window, and returns
        let at_8 = seen[3..].iter().filter(|&&t| t == 8).count();
        assert!(c.target >= 32 && at_8 <= 1, "{seen:?}");
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

    /// A first climb that came back down on unlucky windows looks up to
    /// the most it tried once it has held a while, and goes there if it
    /// pays; one that kept a step that did not pay looks back at its start.
    #[test]
    fn the_first_look_checks_the_other_end_of_the_climb() {
        let mut c = Climb::new(16, 64);
        c.headroom = 4.0;
        let mut seen = vec![c.step(1000.0)]; // at 16 -> 64
        for unlucky in [700.0, 700.0, 750.0, 750.0] {
            seen.push(c.step(unlucky)); // 64 twice, then the middle twice
        }
        assert_eq!(seen, [64, 64, 32, 32, 16], "the climb");
        assert!(!c.rising);
        for _ in 0..FIRST_WAIT {
            seen.push(c.step(1000.0));
        }
        assert_eq!(c.target, 64, "no look up: {seen:?}");
        c.step(1200.0);
        assert_eq!(c.target, 64, "did not keep a 20% gain: {seen:?}");

        let mut c = Climb::new(16, 64);
        c.headroom = 4.0;
        c.step(1000.0); // -> 64
        c.step(1000.0); // flat: measured again
        c.step(1000.0); // kept
        assert_eq!((c.target, c.rising), (64, false));
        // not with too little work left for a look to pay
        c.windows_left = LOOK_WORTH - 1.0;
        for _ in 0..2 * FIRST_WAIT {
            c.step(900.0);
        }
        assert_eq!(c.target, 64, "looked with the job nearly over");
        c.windows_left = f64::INFINITY;
        c.step(900.0);
        assert_eq!(c.target, 16, "no look back at the start");
        c.step(1000.0);
        assert_eq!(c.target, 16, "kept streams that cost 10%");
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

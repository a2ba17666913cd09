//! The memory budget: `--mem-limit` decides how many streams run and how
//! big each one's data buffer is, before anything starts.
//!
//! A job's memory is a fixed base (the binary, the queues, the progress
//! thread) plus, per stream, its data buffer and a small fixed part (the
//! 64 KiB listing buffer, the batch being copied, the touched stack). The
//! queues are bounded and hold no file data, so nothing else grows with
//! the tree, except two things a tree can make large on purpose: the map of
//! hard-linked inodes still waiting for their other names, and the list of
//! entries `--delete` will remove.

/// What the budget allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    pub jobs: usize,
    /// Each stream's data buffer, a multiple of 64 KiB.
    pub buf: usize,
}

/// Memory that does not depend on the number of streams, at least: the
/// queues, the progress and journal threads, and room for what the process
/// already holds when the job starts (see [`base`]).
pub const BASE: u64 = 8 << 20;

/// The fixed part of this process's budget: what it holds now plus 6 MiB
/// for the job's own fixed parts, or [`BASE`] if that is more.
pub fn base() -> u64 {
    let now = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kib| kib << 10);
    BASE.max(now + (6 << 20))
}
/// A stream's memory besides its data buffer.
pub const PER_STREAM: u64 = 256 << 10;
/// The data buffer a stream gets when memory allows: big enough for
/// efficient direct I/O.
pub const MAX_BUF: u64 = 4 << 20;
/// The smallest data buffer worth running with.
pub const MIN_BUF: u64 = 256 << 10;

/// What the data buffers of all the streams at work may hold together:
/// 8 streams get 3 MiB each, 48 get 512 KiB, 96 and more the smallest.
/// More bought nothing measurable against 4 MiB each (bench/mem.py,
/// results/mem-*.md: a 2 GiB file, -j 8, 2.34 s against 2.40 s; with -j
/// auto 2.09 s and 50 MiB resident against 2.27 s and 136 MiB): with many
/// streams the disk has that much in flight anyway. A stream mid-chunk
/// when the tuner adds streams keeps its larger buffer until its next
/// chunk, so a job may briefly hold up to twice this.
pub const POOL: u64 = 24 << 20;

/// Each stream's data buffer when `streams` are at work: its share of
/// [`POOL`], between [`MIN_BUF`] and what the budget gave (`most`), a
/// multiple of 64 KiB.
pub fn share(most: usize, streams: usize) -> usize {
    let per = (POOL / streams.max(1) as u64).clamp(MIN_BUF, MAX_BUF) as usize;
    per.min(most) / (64 << 10) * (64 << 10)
}

/// The smallest `--mem-limit` a job can run in (one stream, smallest buffer).
pub const MIN_LIMIT: u64 = BASE + PER_STREAM + MIN_BUF;

/// Fits `jobs` streams into `limit` bytes beside a fixed `base`: full
/// buffers if they fit, else smaller ones, else fewer streams.
pub fn plan(limit: u64, jobs: usize, base: u64) -> Result<Budget, String> {
    let least = base + PER_STREAM + MIN_BUF;
    if limit < least {
        return Err(format!(
            "--mem-limit {limit} is too small: this job needs at least {} KiB",
            least >> 10
        ));
    }
    let jobs = jobs.max(1) as u64;
    let room = limit - base;
    let per = room / jobs;
    let (jobs, buf) = if per >= PER_STREAM + MIN_BUF {
        (jobs, (per - PER_STREAM).min(MAX_BUF))
    } else {
        (room / (PER_STREAM + MIN_BUF), MIN_BUF)
    };
    let buf = buf / (64 << 10) * (64 << 10);
    Ok(Budget {
        jobs: jobs as usize,
        buf: buf as usize,
    })
}

/// The default limit: an eighth of the machine's memory, so several jobs
/// and the page cache keep room; never below what 8 full streams need.
pub fn default_limit() -> u64 {
    let eighth = sluice_sys::total_memory() / 8;
    eighth.max(BASE + 8 * (PER_STREAM + MAX_BUF))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn a_plan_always_fits(limit in MIN_LIMIT..(64u64 << 30), jobs in 1usize..512) {
            let b = plan(limit, jobs, BASE).unwrap();
            prop_assert!(b.jobs >= 1 && b.jobs <= jobs);
            prop_assert!(b.buf as u64 >= MIN_BUF && b.buf as u64 <= MAX_BUF);
            prop_assert_eq!(b.buf % (64 << 10), 0);
            prop_assert!(BASE + b.jobs as u64 * (PER_STREAM + b.buf as u64) <= limit);
        }
    }

    #[test]
    fn buffers_shrink_as_streams_grow() {
        assert_eq!(share(4 << 20, 4), 4 << 20);
        assert_eq!(share(4 << 20, 8), 3 << 20);
        assert_eq!(share(4 << 20, 48), 512 << 10);
        assert_eq!(share(4 << 20, 1000), 256 << 10);
        // --mem-limit's smaller buffers stay smaller; a multiple of 64 KiB.
        assert_eq!(share(768 << 10, 8), 768 << 10);
        assert_eq!(share(768 << 10, 40), 576 << 10);
    }

    #[test]
    fn examples() {
        assert_eq!(
            plan(3 << 30, 8, BASE).unwrap(),
            Budget {
                jobs: 8,
                buf: 4 << 20
            }
        );
        // 16 MiB for 8 streams: 1 MiB of room each, 768 KiB buffers
        assert_eq!(
            plan(16 << 20, 8, BASE).unwrap(),
            Budget {
                jobs: 8,
                buf: 768 << 10
            }
        );
        // 10 MiB for 8 streams: only 4 fit with the smallest buffer
        assert_eq!(
            plan(10 << 20, 8, BASE).unwrap(),
            Budget {
                jobs: 4,
                buf: 256 << 10
            }
        );
        assert!(plan(1 << 20, 1, BASE).is_err());
    }
}

//! What a job is told and what it tells back: its options, its live
//! counters and summary, and the events a caller receives.

use crate::error::{EntryError, Side};
use crate::gauge::{Busy, Load};
use crate::source::Wire;
use sluice_sys::Stat;
use sluice_walk::Filter;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Duration;

/// Whether file data may be shared with the source by cloning extents.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Reflink {
    /// Clone where the file systems allow, copy otherwise.
    #[default]
    Auto,
    /// Clone or fail the entry.
    Always,
    /// Always write a physical copy.
    Never,
}

/// The processes that share one job, each running its own part of it
/// (`shard`) with its own streams: MPI ranks. Every member calls each
/// method at the same point of the job, so an implementation may be a
/// collective operation.
pub trait Group: Send + Sync {
    /// Whether every member's walk ended clean (no error, not stopped),
    /// `clean` being this member's: `--delete` removes nothing otherwise.
    fn all_clean(&self, clean: bool) -> bool;

    /// How many of the `mine` deletions this member would make it may
    /// make, of the job's `max` (`--max-delete`): the budget goes to the
    /// members in turn, each taking what it needs of what is left.
    fn delete_budget(&self, mine: u64, max: u64) -> u64 {
        mine.min(max)
    }

    /// Whether the members share the job out as it goes (see
    /// [`crate::exchange`]) rather than each walking all of it and taking
    /// its part (`--shard`).
    fn shares_work(&self) -> bool {
        false
    }

    /// Starts sharing work for one job, whose side is `desk`; the group
    /// calls [`Desk::close`](Desk::close) once every
    /// member is idle and no work is on its way. Every member calls it
    /// when its streams start.
    fn open(&self, desk: std::sync::Arc<dyn Desk>) {
        let _ = desk;
    }

    /// Hands `items` to member `to`, whose they are.
    fn send(&self, to: u32, items: Vec<Item>) {
        let _ = (to, items);
    }

    /// Whether another member waits for work: a lister then queues its
    /// batches of files, where they can be lent, rather than copy them
    /// itself at once.
    fn hungry(&self) -> bool {
        false
    }
}

/// A piece of work handed from one part of a job to another (see
/// [`crate::exchange`]).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Item {
    /// A subdirectory to create in DST and walk: `dir` is its parent's
    /// path, relative to the roots ("" for the roots).
    Dir {
        dir: Vec<u8>,
        name: Vec<u8>,
        st: Stat,
    },
    /// Files of one directory to copy, from its lister's queue.
    Files {
        dir: Vec<u8>,
        entries: Vec<(Vec<u8>, Stat)>,
    },
    /// Entries the taker owns though another part listed them: files
    /// with more than one name, and big files it has chunks of.
    Owned {
        dir: Vec<u8>,
        entries: Vec<(Vec<u8>, Stat)>,
    },
}

/// One part's side of the exchange, which the group calls (from its own
/// thread) while the job's streams run.
pub trait Desk: Send + Sync {
    /// Whether this part has nothing queued or running: only work from
    /// another part can give it some.
    fn idle(&self) -> bool;
    /// Work for a part that asked: empty when there is none to spare.
    fn lend(&self) -> Vec<Item>;
    /// Queues work another part lent or handed over.
    fn take(&self, items: Vec<Item>);
    /// Every part is idle and no work is on its way: the streams end.
    fn close(&self);
}

/// Everything a copy job is told; `Default` is what `sluice copy` does
/// without options.
#[derive(Clone)]
pub struct CopyOptions {
    /// Number of streams in the pool (with `auto_jobs`, where tuning starts).
    pub jobs: usize,
    /// `-j auto`: tune the number of active streams while the job runs.
    pub auto_jobs: bool,
    /// Files larger than twice this are copied as chunks of this size.
    pub chunk_size: u64,
    pub filter: Filter,
    /// Do not descend into directories on another file system than SRC.
    pub one_file_system: bool,
    /// Walk and count, write nothing.
    pub dry_run: bool,
    /// Copy files of 1 MiB and more with `O_DIRECT` where both file systems
    /// allow it, bypassing the page cache.
    pub direct: bool,
    pub reflink: Reflink,
    /// fsync every file before its rename and every directory when done.
    pub fsync: bool,
    /// Preserve owner and group (and with them set-id bits); needs root.
    pub preserve_owner: bool,
    /// Create device nodes (needs root).
    pub privileged: bool,
    /// Compare files whose size and mtime match by content too.
    pub checksum: bool,
    /// Remove entries of DST that SRC does not have, after a clean walk.
    pub delete: bool,
    /// Stop deleting before the deletion that would exceed this many.
    pub max_delete: Option<u64>,
    /// Compare instead of copying (`sluice verify`): nothing is written.
    pub check: Option<Check>,
    /// Read back every file written and compare it with its source before
    /// it is renamed into place (`--verify`).
    pub verify: bool,
    /// The content hash of `verify`.
    pub hash: HashKind,
    /// Patch changed big files in place instead of cloning the old copy
    /// into a temporary (readers may see them half-updated meanwhile).
    pub inplace: bool,
    /// How many times a file whose source changed while it was copied is
    /// copied again before it is reported as failed.
    pub retries: u32,
    /// The most memory the job may use, in bytes (buffers and streams are
    /// sized to fit; see `budget`).
    pub mem_limit: u64,
    /// The most bytes of file data per second, over all streams.
    pub bwlimit: Option<u64>,
    /// Only regular files with `lo <= size < hi` (and the directories that
    /// lead to them); `sluice probe` uses it to try small and big files
    /// apart.
    pub size_window: Option<(u64, u64)>,
    /// This process's part of a job split over several (`--shard I/N`):
    /// only its entries and chunks are copied, and nothing is deleted.
    pub shard: Option<crate::shard::Shard>,
    /// The other processes running this job's other parts, when they can
    /// be asked (MPI ranks): deletes wait for all of them.
    pub group: Option<std::sync::Arc<dyn Group>>,
    /// Only the root directory's own entries (`sluice watch` syncing one
    /// directory that changed): subdirectories DST already has are not
    /// descended, new ones are copied whole.
    pub shallow: bool,
    /// A subdirectory of SRC and DST (relative, `/`-separated) that is
    /// this job's whole tree (`sluice watch` syncs one directory that
    /// changed): reached from the roots' descriptors without following a
    /// symlink, and prepended to every path the filter sees, since the
    /// filter's patterns are written for the roots.
    pub sub: Vec<u8>,
    /// Delete even when SRC's root lists nothing while DST's has entries
    /// (`--allow-empty-src`): without it, an empty SRC root (an unmounted
    /// share, an expired automount) never empties DST.
    pub allow_empty_src: bool,
    /// Which extended attributes are copied and compared; `None` copies
    /// none (`--no-xattrs`, ACLs included, since they are stored as
    /// extended attributes).
    pub xattrs: Option<sluice_sys::XattrSet>,
    /// Copy permission bits (`--no-perms` clears it: new entries get SRC's
    /// bits less the umask, existing ones keep DST's, and the quick check
    /// ignores modes).
    pub perms: bool,
    /// The quick check compares sizes only, not mtimes (`--size-only`).
    pub size_only: bool,
    /// Leave alone a DST file newer than its source (`--update`).
    pub update: bool,
    /// Leave alone every entry DST already has (`--ignore-existing`).
    pub ignore_existing: bool,
    /// Report every entry created, updated or linked, with why
    /// (`Reporter::entry_changed`; `-v`). Off, nothing is gathered.
    pub verbose: bool,
    /// The caller already holds DST's one-writer lock (`sluice watch`
    /// holds it across passes), so the job does not take it.
    pub dst_locked: bool,
}

/// What `sluice verify` compares besides content.
#[derive(Clone, Copy, Debug, Default)]
pub struct Check {
    /// Mode, owner (as root), mtime and extended attributes too.
    pub metadata: bool,
}

pub use crate::hash::HashKind;

/// Default chunk size: at 64 MiB a chunk takes ~0.1 s at disk speed, small
/// enough that 8 streams share an 8 GiB file evenly and a resumed copy
/// redoes little, large enough that per-chunk overhead is negligible.
pub const DEFAULT_CHUNK: u64 = 64 << 20;

/// Default number of streams (and where `-j auto` starts): enough
/// concurrent creates and cold reads to hide a disk's latency on a small
/// machine. It was 8; the best fixed count was 16 or 32 on every set from
/// disk, and with buffers drawn from one pool more streams cost no memory.
/// Started at 16, auto took 4.60 s on the dense set from disk against 4.88 s
/// from 8 (`-j 32` 4.65 s), and 4.40 s against 4.57 s on the mixed set
/// (`-j 32` 4.36 s); the same on the huge file (10.2 and 10.0 s, every
/// fixed count 10.7 s or more) and between tmpfs mounts (0.85 s).
pub const DEFAULT_JOBS: usize = 16;

impl Default for CopyOptions {
    fn default() -> Self {
        let root = sluice_sys::is_root();
        CopyOptions {
            jobs: DEFAULT_JOBS,
            auto_jobs: true,
            chunk_size: DEFAULT_CHUNK,
            filter: Filter::default(),
            one_file_system: false,
            dry_run: false,
            direct: true,
            reflink: Reflink::Auto,
            fsync: false,
            preserve_owner: root,
            privileged: root,
            checksum: false,
            delete: false,
            max_delete: None,
            check: None,
            verify: false,
            hash: HashKind::Xxh3,
            inplace: false,
            retries: 2,
            mem_limit: crate::budget::default_limit(),
            bwlimit: None,
            size_window: None,
            shard: None,
            group: None,
            shallow: false,
            sub: Vec::new(),
            allow_empty_src: false,
            dst_locked: false,
            verbose: false,
            xattrs: Some(sluice_sys::XattrSet::All),
            perms: true,
            size_only: false,
            update: false,
            ignore_existing: false,
        }
    }
}

impl CopyOptions {
    /// The path the filter matches for `rel` (relative to this job's SRC).
    pub(crate) fn filter_path(&self, rel: Vec<u8>) -> Vec<u8> {
        if self.sub.is_empty() {
            return rel;
        }
        let mut p = self.sub.clone();
        p.push(b'/');
        p.extend_from_slice(&rel);
        p
    }

    /// What the planner needs of these options.
    pub(crate) fn rules(&self) -> crate::plan::Rules {
        crate::plan::Rules {
            perm_mask: self.cmp_mask(),
            owners: self.preserve_owner,
            size_only: self.size_only,
            update: self.update,
            ignore_existing: self.ignore_existing,
            delete: self.delete,
            checksum: self.checksum,
            xattrs: self.xattrs.is_some(),
        }
    }

    /// Permission bits the quick check compares (none with `--no-perms`).
    pub(crate) fn cmp_mask(&self) -> u32 {
        if self.perms {
            self.perm_mask()
        } else {
            0
        }
    }

    /// Permission bits that may be set: set-id bits only with owners kept.
    pub(crate) fn perm_mask(&self) -> u32 {
        if self.preserve_owner {
            0o7777
        } else {
            0o1777
        }
    }
}

/// Live counters of a job, readable from another thread while it runs.
#[derive(Default)]
pub struct Stats {
    pub files_copied: AtomicU64,
    pub bytes_copied: AtomicU64,
    /// Of those, bytes moved as chunks of big files (bandwidth-bound work).
    pub chunk_bytes: AtomicU64,
    /// File data moved so far, counted per buffer or kernel copy rather
    /// than per file or chunk: the tuner's quarter-second windows would
    /// otherwise see 64 MiB chunks finish in bursts.
    pub data_moved: AtomicU64,
    pub dirs_created: AtomicU64,
    pub symlinks: AtomicU64,
    pub hardlinks: AtomicU64,
    pub specials: AtomicU64,
    pub skipped: AtomicU64,
    /// Entries DST already had, up to date (or fixed in place).
    pub unchanged: AtomicU64,
    /// Entries removed from DST by `--delete`.
    pub deleted: AtomicU64,
    /// Entries `verify` found different (or missing, or extra).
    pub differences: AtomicU64,
    /// Copies started again because the source changed meanwhile.
    pub retries: AtomicU64,
    /// Where the streams spent their time, known once the job is over.
    pub busy: Mutex<Busy>,
    /// Streams in use at the end (what `-j auto` settled on).
    pub streams: AtomicU64,
    /// Stream-nanoseconds spent waiting for `--bwlimit`.
    pub throttle_wait_ns: AtomicU64,
    /// With `-j auto`: the streams in use at the start and after each
    /// tuning step.
    pub streams_trace: Mutex<Vec<u32>>,
    /// With `-j auto`: how many of them could copy chunks of big files.
    pub chunk_streams_trace: Mutex<Vec<u32>>,
    pub errors: AtomicU64,
    /// Entries and bytes listed so far (the walk runs ahead of the copy).
    pub entries_found: AtomicU64,
    pub bytes_found: AtomicU64,
    /// Directories found and not yet listed; see [`Stats::walk_done`].
    pub listings_pending: AtomicU64,
    /// Set once the first directory is queued.
    pub walk_started: AtomicBool,
}

/// What a progress line shows: one process's counters, or a job's summed
/// over the processes that share it (MPI ranks).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// Entries finished, copied or not ([`Stats::entries_done`]).
    pub done: u64,
    pub found: u64,
    /// Bytes written (or moved across a wire, whichever is more).
    pub bytes: u64,
    pub bytes_found: u64,
    pub files: u64,
    pub listings_pending: u64,
    pub walk_started: bool,
}

impl Progress {
    /// Whether the walk is over (see [`Stats::walk_done`]).
    pub fn walk_done(&self) -> bool {
        self.walk_started && self.listings_pending == 0
    }

    /// This and `other` together.
    pub fn add(&self, other: &Progress) -> Progress {
        Progress {
            done: self.done + other.done,
            found: self.found + other.found,
            bytes: self.bytes + other.bytes,
            bytes_found: self.bytes_found + other.bytes_found,
            files: self.files + other.files,
            listings_pending: self.listings_pending + other.listings_pending,
            walk_started: self.walk_started || other.walk_started,
        }
    }
}

impl Stats {
    /// Whether the walk is over: every directory listed, so
    /// `entries_found` and `bytes_found` are the job's totals.
    pub fn walk_done(&self) -> bool {
        self.walk_started.load(Relaxed) && self.listings_pending.load(Relaxed) == 0
    }

    /// Entries finished so far, copied or not.
    pub fn entries_done(&self) -> u64 {
        self.files_copied.load(Relaxed)
            + self.dirs_created.load(Relaxed)
            + self.symlinks.load(Relaxed)
            + self.hardlinks.load(Relaxed)
            + self.specials.load(Relaxed)
            + self.skipped.load(Relaxed)
            + self.unchanged.load(Relaxed)
            + self.differences.load(Relaxed)
            + self.errors.load(Relaxed)
    }

    /// What a progress line shows, now.
    pub fn progress(&self) -> Progress {
        Progress {
            done: self.entries_done(),
            found: self.entries_found.load(Relaxed),
            bytes: (self.bytes_copied.load(Relaxed)).max(self.data_moved.load(Relaxed)),
            bytes_found: self.bytes_found.load(Relaxed),
            files: self.files_copied.load(Relaxed),
            listings_pending: self.listings_pending.load(Relaxed),
            walk_started: self.walk_started.load(Relaxed),
        }
    }

    /// A consistent-enough snapshot for the final report.
    pub fn summary(&self, elapsed: Duration) -> Summary {
        Summary {
            files_copied: self.files_copied.load(Relaxed),
            bytes_copied: self.bytes_copied.load(Relaxed),
            dirs_created: self.dirs_created.load(Relaxed),
            symlinks: self.symlinks.load(Relaxed),
            hardlinks: self.hardlinks.load(Relaxed),
            specials: self.specials.load(Relaxed),
            files_skipped: self.skipped.load(Relaxed) + self.unchanged.load(Relaxed),
            unchanged: self.unchanged.load(Relaxed),
            deleted: self.deleted.load(Relaxed),
            differences: self.differences.load(Relaxed),
            retries: self.retries.load(Relaxed),
            busy: *self.busy.lock().expect("busy lock"),
            peak_rss: sluice_sys::peak_rss(),
            cpu: sluice_sys::process_cpu_time(),
            streams: self.streams.load(Relaxed),
            streams_trace: self.streams_trace.lock().expect("trace lock").clone(),
            chunk_streams_trace: self.chunk_streams_trace.lock().expect("trace lock").clone(),
            errors: self.errors.load(Relaxed),
            throttle_wait: Duration::from_nanos(self.throttle_wait_ns.load(Relaxed)),
            elapsed,
        }
    }
}

/// What a finished job did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Summary {
    pub files_copied: u64,
    pub bytes_copied: u64,
    pub dirs_created: u64,
    pub symlinks: u64,
    pub hardlinks: u64,
    pub specials: u64,
    /// Entries not copied: up to date in DST, excluded, or uncopyable.
    pub files_skipped: u64,
    /// Of those, entries DST already had up to date.
    pub unchanged: u64,
    pub deleted: u64,
    /// Entries `verify` found different, missing or extra.
    pub differences: u64,
    /// Copies started again because their source changed meanwhile.
    pub retries: u64,
    /// Stream-seconds per activity: what bounded the job.
    pub busy: Busy,
    /// The most memory the process had resident, in bytes.
    pub peak_rss: u64,
    /// CPU the process had used, user and system, all threads.
    pub cpu: Duration,
    /// Streams in use at the end.
    pub streams: u64,
    /// With `-j auto`: streams in use at the start and after each second's
    /// tuning step.
    pub streams_trace: Vec<u32>,
    /// With `-j auto`: how many of them could copy chunks of big files.
    pub chunk_streams_trace: Vec<u32>,
    pub errors: u64,
    /// Stream-time spent waiting for `--bwlimit`.
    pub throttle_wait: Duration,
    pub elapsed: Duration,
}

/// Jobs shorter than this get no bottleneck verdict: a handful of samples
/// say nothing (every no-op run used to end "fewer streams would do").
pub const JUDGE_AFTER: Duration = Duration::from_millis(300);

impl Summary {
    /// What bounded the job, in words; `None` when it was too short to
    /// judge. A job that spent much of its stream-time waiting for
    /// `--bwlimit` was bound by it, whatever else the streams did.
    ///
    /// With `wire`, the source was read across it: the verdict names the
    /// host (or the link) that bounded the job, from this host's CPU and
    /// what the source's host said of its own load.
    pub fn bottleneck(&self, wire: Option<&Wire>) -> Option<&'static str> {
        if self.elapsed < JUDGE_AFTER {
            return None;
        }
        let elapsed = self.elapsed.as_secs_f64();
        if self.throttle_wait.as_secs_f64() >= 0.5 * elapsed {
            return Some("bound by --bwlimit");
        }
        Some(match wire.and_then(|w| w.far) {
            Some(far) => {
                let here = Load::this_host(self.cpu);
                crate::gauge::across(&self.busy, elapsed, &here, &far)
            }
            None => self.busy.verdict(),
        })
    }
}

/// How a job that was not stopped by a fatal error ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Everything copied (exit 0).
    Complete,
    /// Finished, but some entries failed and were reported (exit 1).
    Partial,
    /// Stopped by the caller's cancel flag (exit 130).
    Interrupted,
}

/// Receives per-entry events as they happen, from any stream.
pub trait Reporter: Send + Sync {
    /// An entry failed; the job goes on without it.
    fn entry_failed(&self, err: &EntryError);
    /// An entry was not copied because it cannot be (a device node without
    /// root, an unknown file type); `path` is its full source path.
    fn entry_skipped(&self, path: &[u8], why: &str);
    /// An entry of DST was removed by `--delete`; `path` is its full path.
    fn entry_deleted(&self, path: &[u8]);
    /// `verify` found an entry different: `src` and `dst` are its two full
    /// paths, `side` the one it exists on (both, unless it is missing on
    /// the other), and `what` says which side has what.
    fn entry_differs(&self, side: Side, src: &[u8], dst: &[u8], what: &str);
    /// With `verbose`: an entry of DST was created (`why` is `["new"]`),
    /// replaced, fixed in place or linked (`action`: `copy`, `update`,
    /// `update metadata`, `link`) — or in a dry run, would be. `path` is
    /// its full DST path; a directory's ends in `/`.
    fn entry_changed(&self, path: &[u8], action: &str, why: &[&'static str]);
    /// Something the user should know that is not an entry's failure: a
    /// leftover temporary removed, an unreadable journal discarded, a
    /// source directory that vanished while the tree was walked. `path` is
    /// a full path.
    fn notice(&self, path: &[u8], what: &str);
}

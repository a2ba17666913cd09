//! A copy job: its options, its shared state, its counters, and `copy()`.

use crate::budget::Budget;
use crate::error::{EntryError, JobError, Side};
use crate::existing::Extras;
use crate::gauge::{Busy, Gauge};
use crate::journal::Journal;
use crate::queue::Queue;
use crate::source::{LocalSource, Source, SrcDir, SrcRoot};
use crate::throttle::Throttle;
use crate::tree::DirNode;
use crate::tune::Gate;
use crate::worker::{Task, Worker};
use sluice_sys::{Errno, Stat};
use sluice_walk::Filter;
use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
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
/// concurrent creates to hide a disk's metadata latency on a small machine.
pub const DEFAULT_JOBS: usize = 8;

/// How often `-j auto` measures and adjusts.
const TUNE_EVERY: Duration = Duration::from_secs(1);

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
#[derive(Clone, Debug, PartialEq)]
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
    pub fn bottleneck(&self) -> Option<&'static str> {
        if self.elapsed < JUDGE_AFTER {
            return None;
        }
        if self.throttle_wait.as_secs_f64() >= 0.5 * self.elapsed.as_secs_f64() {
            return Some("bound by --bwlimit");
        }
        Some(self.busy.verdict())
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

/// Hard-link bookkeeping for one source inode with more than one name.
pub(crate) enum LinkState {
    /// Its first name is being copied; later names wait here.
    Copying(Vec<(Arc<DirNode>, CString)>),
    /// Copied; later names are linked to this path relative to DST, whose
    /// inode number in DST is given.
    Done(Vec<u8>, u64),
    /// The first copy failed; later names fail too.
    Failed,
}

/// State shared by the streams of one job.
pub(crate) struct Shared {
    pub opts: CopyOptions,
    /// Where entries are read from.
    pub source: Arc<dyn Source>,
    pub queue: Queue<Task>,
    pub stats: Arc<Stats>,
    reporter: Arc<dyn Reporter>,
    /// Set by the caller (a signal): the job stops, state saved.
    cancel: Arc<AtomicBool>,
    /// Set by a fatal error: the job stops too, but the caller's flag is
    /// left alone (a full disk under `--delete` is followed by a pass that
    /// frees space).
    halted: Arc<AtomicBool>,
    fatal: Mutex<Option<EntryError>>,
    pub links: Mutex<HashMap<(u32, u32, u64), LinkState>>,
    src_root: Vec<u8>,
    dst_root: Vec<u8>,
    /// DST's root directory, for linking later names of a hard-linked file.
    pub dst_root_fd: Option<OwnedFd>,
    /// SRC's device, for `--one-file-system`.
    pub root_dev: (u32, u32),
    /// DST root's device: with `--one-file-system`, nothing on another
    /// file system in DST is deleted.
    pub dst_root_dev: Option<(u32, u32)>,
    /// SRC root's metadata.
    pub root_stat: Stat,
    /// Whether DST's root directory is the job's (a tree copy), rather than
    /// the user's directory a single file is copied into.
    pub owns_root: bool,
    /// Cleared after the first `copy_file_range` the kernel refuses.
    pub kernel_copy_ok: AtomicBool,
    /// Cleared after the first clone the file systems refuse.
    pub clone_ok: AtomicBool,
    /// Cleared when DST refuses `O_TMPFILE`.
    pub unnamed_ok: AtomicBool,
    /// Cleared after DST refuses to clone an older copy (block-delta).
    pub delta_clone_ok: AtomicBool,
    pid: u32,
    tmp_seq: AtomicU64,
    /// Resume state of big files; `None` in a dry run.
    pub journal: Option<Journal>,
    /// The user's umask, cleared for the job (`--no-perms` applies it).
    pub umask: u32,
    /// Whether `--delete` removes what it finds (a dry run only counts,
    /// except in the walk that frees a full disk).
    pub deletes_for_real: bool,
    /// Entries SRC's root listed (filtered or not): none means SRC may be
    /// an unmounted mount point, and `--delete` must not empty DST.
    pub src_root_entries: AtomicU64,
    /// Entries DST's root had before the run (state files not counted).
    pub dst_root_entries: AtomicU64,
    /// Entries of DST that SRC lacks, for `--delete` after the walk.
    pub extras: Mutex<Vec<Extras>>,
    /// Entries waiting for `--delete` to remove the directory in their way.
    pub(crate) replaced: Mutex<Vec<crate::existing::Replacement>>,
    /// What each stream is doing, sampled for the bottleneck report.
    pub gauge: Gauge,
    /// Streams and buffer size that fit `--mem-limit`.
    pub budget: Budget,
    /// `--bwlimit`, shared by all streams.
    pub throttle: Option<Throttle>,
    /// How many of the streams may take work (all of them unless `-j auto`).
    pub gate: Gate,
}

impl Shared {
    /// The mode an entry made from `st` gets: SRC's (set-id bits only with
    /// owners kept), or with `--no-perms` SRC's less the umask.
    pub fn mode_for(&self, st: &Stat) -> u32 {
        if self.opts.perms {
            st.perm() & self.opts.perm_mask()
        } else {
            st.perm() & 0o777 & !self.umask
        }
    }

    /// The mode a file is created with before its owner is set (set-id
    /// bits come after the chown, which would clear them).
    pub fn create_mode(&self, st: &Stat) -> u32 {
        self.mode_for(st) & 0o1777
    }

    /// Whether this job changes DST (not a dry run, not `verify`).
    pub fn writes(&self) -> bool {
        !self.opts.dry_run && !self.checking()
    }

    /// Whether this job compares rather than copies.
    pub fn checking(&self) -> bool {
        self.opts.check.is_some()
    }

    /// With `-v`, tells the reporter that the entry at `rel()` (relative to
    /// DST's root, built only then) was created, updated or linked, and why.
    pub fn changed(&self, rel: impl FnOnce() -> Vec<u8>, action: &str, why: &[&'static str]) {
        if self.opts.verbose {
            self.reporter
                .entry_changed(&self.full_path(Side::Dst, &rel()), action, why);
        }
    }

    /// Records a difference `verify` found at `rel`.
    pub fn differs(&self, side: Side, rel: &[u8], what: &str) {
        self.stats.differences.fetch_add(1, Relaxed);
        self.reporter.entry_differs(
            side,
            &self.full_path(Side::Src, rel),
            &self.full_path(Side::Dst, rel),
            what,
        );
    }

    /// Whether temporary `name` in DST directory `dir` is a resumable big
    /// file an earlier run recorded (and so must not be removed).
    pub fn journal_owns(&self, dir: &[u8], name: &CStr) -> bool {
        self.journal
            .as_ref()
            .is_some_and(|j| j.owns(dir, name.to_bytes()))
    }

    pub fn reporter(&self) -> &dyn Reporter {
        &*self.reporter
    }

    /// True once the job must stop: cancelled, or a fatal error.
    pub fn stopped(&self) -> bool {
        self.cancel.load(Relaxed) || self.halted.load(Relaxed)
    }

    /// Records an entry failure; a fatal one stops the job. A copy cut
    /// short because the job was stopped is not a failure of its entry.
    pub fn fail(&self, err: EntryError) {
        if self.stopped() && err.reason == crate::Reason::Os(Errno::INTR) {
            return;
        }
        self.stats.errors.fetch_add(1, Relaxed);
        if err.is_fatal() {
            let mut fatal = self.fatal.lock().expect("fatal lock");
            if fatal.is_none() {
                *fatal = Some(err);
            }
            self.halted.store(true, Relaxed);
            return;
        }
        self.reporter.entry_failed(&err);
    }

    /// An entry failure for the entry at `rel` (relative to the roots).
    pub fn error(
        &self,
        side: Side,
        rel: &[u8],
        op: &'static str,
        reason: crate::Reason,
    ) -> EntryError {
        EntryError {
            path: self.full_path(side, rel),
            side,
            op,
            reason,
        }
    }

    /// The full path of an entry given relative to the roots.
    pub fn full_path(&self, side: Side, rel: &[u8]) -> Vec<u8> {
        let root = match side {
            Side::Src => &self.src_root,
            Side::Dst => &self.dst_root,
        };
        let mut p = root.clone();
        if !rel.is_empty() {
            if !p.ends_with(b"/") {
                p.push(b'/');
            }
            p.extend_from_slice(rel);
        }
        p
    }

    /// Writes a fresh temporary name for the DST directory `dir` (device
    /// and inode), unique across streams and runs, into `out` as a
    /// NUL-terminated string: `.sluice-<pid>-<seq>-<tag>.tmp`, whose tag
    /// proves to a later run that sluice created it in that directory.
    pub fn temp_name(&self, dir: (u32, u32, u64), out: &mut [u8; 64]) {
        use std::io::Write;
        let n = self.tmp_seq.fetch_add(1, Relaxed);
        let tag = sluice_sys::temp_tag(dir, u64::from(self.pid), n);
        let mut cur = &mut out[..];
        let _ = write!(cur, ".sluice-{:x}-{:x}-{tag:x}.tmp\0", self.pid, n);
    }
}

/// Copies SRC to DST with `opts`, counting into `stats` and reporting entry
/// failures to `reporter`. Setting `cancel` stops the job at the next entry
/// boundary; temporaries in flight are removed.
///
/// On `Err`, nothing partial is left under a final name: files are renamed
/// into place only when complete.
///
/// `sync --delete` onto a destination that fills up converges: when the
/// copy stops on a full disk, the trees are walked again without writing
/// (a dry run's walk), the extras `--delete` would remove are removed if
/// that walk had no error, and the copy runs once more. Deletes never run
/// before a clean walk, and a job that has room pays nothing for this.
pub fn copy(
    src: &Path,
    dst: &Path,
    opts: CopyOptions,
    stats: Arc<Stats>,
    reporter: Arc<dyn Reporter>,
    cancel: Arc<AtomicBool>,
) -> Result<Outcome, JobError> {
    let local: Arc<dyn Source> = Arc::new(LocalSource);
    copy_from(&local, src, dst, opts, stats, reporter, cancel)
}

/// [`copy`] from any [`Source`] (`src` is the root's path there): the
/// engine runs here, where DST is, and reads SRC through `source`.
pub fn copy_from(
    source: &Arc<dyn Source>,
    src: &Path,
    dst: &Path,
    opts: CopyOptions,
    stats: Arc<Stats>,
    reporter: Arc<dyn Reporter>,
    cancel: Arc<AtomicBool>,
) -> Result<Outcome, JobError> {
    let may_free = opts.delete && !opts.dry_run && opts.check.is_none();
    let first = run(
        source,
        src,
        dst,
        opts.clone(),
        Pass::Copy,
        &stats,
        &reporter,
        &cancel,
    );
    let full = matches!(&first, Err(JobError::Fatal(e)) if e.is_out_of_space());
    if !may_free || !full || cancel.load(Relaxed) {
        return first;
    }
    reporter.notice(
        dst.as_os_str().as_bytes(),
        "destination full: removing what --delete would remove (after a clean walk), \
         then copying again",
    );
    let walk = Arc::new(Stats::default());
    let freed = run(
        source,
        src,
        dst,
        opts.clone(),
        Pass::FreeSpace,
        &walk,
        &reporter,
        &cancel,
    );
    let deleted = walk.deleted.load(Relaxed);
    stats.deleted.fetch_add(deleted, Relaxed);
    if !matches!(freed, Ok(Outcome::Complete)) || deleted == 0 {
        return first;
    }
    // The full disk was the first pass's only way to stop; the retry's
    // own errors are what the job reports.
    stats.errors.store(0, Relaxed);
    run(
        source,
        src,
        dst,
        opts,
        Pass::Copy,
        &stats,
        &reporter,
        &cancel,
    )
}

/// Which pass of a job `run` makes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pass {
    /// The job as asked.
    Copy,
    /// After a full disk under `--delete`: walk without writing, then
    /// remove the extras for real.
    FreeSpace,
}

#[allow(clippy::too_many_arguments)]
fn run(
    source: &Arc<dyn Source>,
    src: &Path,
    dst: &Path,
    mut opts: CopyOptions,
    pass: Pass,
    stats: &Arc<Stats>,
    reporter: &Arc<dyn Reporter>,
    cancel: &Arc<AtomicBool>,
) -> Result<Outcome, JobError> {
    let (stats, reporter, cancel) = (stats.clone(), reporter.clone(), cancel.clone());
    if pass == Pass::FreeSpace {
        opts.dry_run = true;
    }
    sluice_sys::raise_fd_limit();
    let label = source.name(src);
    let src_root = source
        .open_root(src)
        .map_err(|e| JobError::source(&label, e))?;
    // Checked first: a job that cannot run must not create DST.
    // Under --bwlimit throughput is flat by design: nothing to tune by.
    let auto = opts.auto_jobs && opts.bwlimit.is_none();
    let most = if auto {
        crate::tune::AUTO_MAX
    } else {
        opts.jobs
    };
    let budget = crate::budget::plan(opts.mem_limit, most, crate::budget::base())
        .map_err(JobError::Usage)?;
    let access = if opts.check.is_some() {
        Access::Read
    } else if opts.dry_run {
        Access::Peek
    } else {
        Access::Write
    };
    let access = match access {
        // The walk that frees space deletes for real: DST is locked.
        Access::Peek if pass == Pass::FreeSpace && !opts.dst_locked => Access::Write,
        Access::Peek if pass == Pass::FreeSpace => Access::WriteLocked,
        Access::Write if opts.dst_locked => Access::WriteLocked,
        a => a,
    };
    let roots = match src_root {
        SrcRoot::Dir(dir) if source.is_local() => Roots::tree(src, dir, dst, access, &opts.sub)?,
        SrcRoot::Dir(dir) if opts.sub.is_empty() => Roots::far_tree(&label, dir, dst, access)?,
        SrcRoot::Dir(_) => {
            return Err(JobError::Usage(
                "a subdirectory pass needs a local SRC".into(),
            ))
        }
        SrcRoot::File {
            dir,
            name,
            st,
            real,
        } => {
            let real = source.is_local().then_some(real);
            Roots::file(&label, (dir, name, st), real.as_deref(), dst, access)?
        }
    };
    // After the roots exist (created with the user's umask, like mkdir -p):
    // from here on every mode is given explicitly and must not be masked.
    let umask = sluice_sys::clear_umask();
    let jobs = budget.jobs;
    let src_stat = source
        .stat_dir(&roots.src_dir)
        .map_err(|e| JobError::Source {
            path: label.clone(),
            source: e.into(),
        })?;
    let dst_root_fd = match &roots.dst_fd {
        Some(fd) => Some(fd.try_clone().map_err(|source| JobError::Destination {
            path: dst.to_owned(),
            source,
        })?),
        None => None,
    };
    let journal = match &dst_root_fd {
        Some(_) if opts.check.is_some() || opts.dry_run => None,
        Some(fd) => {
            let j = Journal::open(fd, roots.single.as_ref().map(|s| s.1.to_bytes()))
                .map_err(|e| JobError::destination(&roots.dst_path, e))?;
            if let Some(why) = &j.discarded {
                let mut path = roots.dst_path.as_os_str().as_bytes().to_vec();
                path.push(b'/');
                path.extend_from_slice(j.file_name().as_bytes());
                reporter.notice(
                    &path,
                    &format!(
                        "the journal of an earlier run could not be read ({why}); it was \
                         removed, and big files it recorded are copied again in full"
                    ),
                );
            }
            Some(j)
        }
        None => None,
    };
    let facts = crate::tree::DstFacts::of(roots.dst_fd.as_ref());
    let halted = Arc::new(AtomicBool::new(false));
    let throttle = opts
        .bwlimit
        .map(|r| Throttle::new(r, [cancel.clone(), halted.clone()]));
    let shared = Arc::new(Shared {
        // Sized for the streams that start working, not for every stream
        // -j auto could add (a longer queue only spreads a directory's
        // files); the tuner resizes it with the stream target.
        queue: Queue::new(opts.jobs.min(jobs) * crate::tune::QUEUE_PER_STREAM, 256),
        source: source.clone(),
        stats,
        reporter,
        cancel,
        halted,
        fatal: Mutex::new(None),
        links: Mutex::new(HashMap::new()),
        src_root: roots.src_path.as_os_str().as_bytes().to_vec(),
        dst_root: roots.dst_path.as_os_str().as_bytes().to_vec(),
        dst_root_fd,
        root_dev: src_stat.dev,
        dst_root_dev: roots.dst_fd.as_ref().map(|_| (facts.id.0, facts.id.1)),
        root_stat: src_stat,
        owns_root: roots.single.is_none(),
        kernel_copy_ok: AtomicBool::new(opts.reflink != Reflink::Never),
        clone_ok: AtomicBool::new(opts.reflink != Reflink::Never),
        unnamed_ok: AtomicBool::new(true),
        delta_clone_ok: AtomicBool::new(opts.reflink != Reflink::Never),
        pid: std::process::id(),
        tmp_seq: AtomicU64::new(0),
        journal,
        deletes_for_real: pass == Pass::FreeSpace || !opts.dry_run,
        umask,
        src_root_entries: AtomicU64::new(0),
        dst_root_entries: AtomicU64::new(0),
        extras: Mutex::new(Vec::new()),
        replaced: Mutex::new(Vec::new()),
        gauge: Gauge::new(jobs),
        budget,
        throttle,
        gate: Gate::new(if auto { opts.jobs.min(jobs) } else { jobs }, jobs),
        opts,
    });
    let root = Arc::new(DirNode {
        creates_as: facts.creates_as,
        dst_id: facts.id,
        default_acl: facts.default_acl,
        src_kind: source.kind(&roots.src_dir),
        src: roots.src_dir,
        dst: roots.dst_fd,
        // A single file's target directory is the user's: its entry is
        // compared like any in an existing directory.
        existed: roots.dst_existed || (roots.single.is_some() && shared.dst_root_fd.is_some()),
        rel: Vec::new(),
        stat: src_stat,
        owned: roots.single.is_none() && shared.writes(),
        parent: None,
        shared: shared.clone(),
    });
    let first = match roots.single {
        None => Task::List(root, crate::worker::Listing::new(&shared.stats)),
        Some((src_name, dst_name, st)) => {
            // One file: the walk is over before it starts.
            shared.stats.entries_found.fetch_add(1, Relaxed);
            shared.stats.bytes_found.fetch_add(st.size, Relaxed);
            Task::Single {
                node: root,
                src_name,
                dst_name,
                st,
            }
        }
    };
    shared
        .queue
        .push(crate::queue::Lane::Dir, first)
        .unwrap_or_else(|_| unreachable!("a new queue has room"));
    shared.stats.walk_started.store(true, Relaxed);
    let started = std::time::Instant::now();
    let sampled = AtomicBool::new(false);
    std::thread::scope(|s| {
        let streams: Vec<_> = (0..jobs)
            .map(|i| {
                let shared = shared.clone();
                std::thread::Builder::new()
                    .name(format!("stream-{i}"))
                    // Deep trees recurse when the queue is full; stacks are
                    // virtual memory, only touched pages cost anything.
                    .stack_size(64 << 20)
                    .spawn_scoped(s, move || Worker::new(shared, i).run())
                    .expect("spawn stream thread")
            })
            .collect();
        s.spawn(|| shared.gauge.sample_until(&sampled));
        if auto {
            s.spawn(|| {
                let (trace, chunk_trace) = crate::tune::run(
                    &shared.gate,
                    &shared.queue,
                    &shared.stats,
                    &shared.gauge,
                    &sampled,
                    TUNE_EVERY,
                );
                *shared.stats.streams_trace.lock().expect("trace lock") = trace;
                *shared.stats.chunk_streams_trace.lock().expect("trace lock") = chunk_trace;
            });
        }
        for t in streams {
            let _ = t.join();
        }
        sampled.store(true, Relaxed);
    });
    shared
        .stats
        .streams
        .store(shared.gate.target() as u64, Relaxed);
    *shared.stats.busy.lock().expect("busy lock") = shared.gauge.busy(started.elapsed());
    if let Some(t) = &shared.throttle {
        let ns = t.waited().as_nanos() as u64;
        shared.stats.throttle_wait_ns.fetch_add(ns, Relaxed);
    }
    // Streams are gone; anything still queued (after a stop) is dropped here,
    // which removes its temporaries.
    drop(shared.queue.close());
    if !shared.stopped() && shared.opts.delete {
        crate::delete::run(&shared);
        crate::existing::replace(&shared);
    }
    // Held directories hold `shared`: let them go whatever happened.
    shared.replaced.lock().expect("replaced lock").clear();
    close_journal(&shared);
    if let Some(err) = shared.fatal.lock().expect("fatal lock").take() {
        return Err(JobError::Fatal(err));
    }
    if shared.stopped() {
        return Ok(Outcome::Interrupted);
    }
    if shared.stats.errors.load(Relaxed) + shared.stats.differences.load(Relaxed) > 0 {
        Ok(Outcome::Partial)
    } else {
        Ok(Outcome::Complete)
    }
}

/// Ends the journal: after a complete walk, records no file claimed (its
/// source vanished, or it was finished before the crash) are dropped with
/// their temporaries; the file itself goes once no record is left.
fn close_journal(shared: &Shared) {
    let Some(journal) = &shared.journal else {
        return;
    };
    let mut clean = Vec::new();
    if !shared.stopped() {
        let root = shared.dst_root_fd.as_ref().expect("not a dry run");
        for (rel, rec) in journal.unclaimed() {
            let (dir, _) = crate::journal::split_rel(&rel);
            if let Ok(fd) = crate::target::open_beneath(root.as_fd(), dir) {
                if let Ok(name) = CString::new(rec.temp) {
                    let _ = sluice_sys::unlink_at(fd.as_fd(), &name);
                }
            }
            clean.push(rel);
        }
    }
    if journal.close(&clean) && shared.owns_root {
        // Removing the journal changed the root's times; put SRC's back.
        let root = shared.dst_root_fd.as_ref().expect("not a dry run");
        if let Err(e) = sluice_sys::set_times(root.as_fd(), &shared.root_stat) {
            shared.fail(shared.error(Side::Dst, b"", "set times", crate::Reason::Os(e)));
        }
    }
}

/// What a job does to DST.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Access {
    /// Looks (a dry run): opened read-only if it exists, to compare with;
    /// never created or locked.
    Peek,
    /// Reads it (`verify`): it must exist, and is neither created nor locked.
    Read,
    /// Writes it: created if missing, checked writable, locked.
    Write,
    /// Writes it under a lock the caller holds.
    WriteLocked,
}

/// The opened roots of a job.
struct Roots {
    src_path: PathBuf,
    dst_path: PathBuf,
    src_dir: SrcDir,
    dst_fd: Option<OwnedFd>,
    /// DST's root directory existed before this run.
    dst_existed: bool,
    /// For a single-file copy: source name, destination name, source stat,
    /// with the fds above being their parent directories.
    single: Option<(CString, CString, Stat)>,
}

/// The absolute, symlink-free form of a path that may not exist yet: its
/// deepest existing ancestor canonicalized, the rest appended.
pub(crate) fn resolve(path: &Path) -> std::io::Result<PathBuf> {
    let abs = std::path::absolute(path)?;
    let mut existing = abs.as_path();
    let mut rest = Vec::new();
    loop {
        match existing.canonicalize() {
            Ok(c) => {
                let mut out = c;
                out.extend(rest.iter().rev());
                return Ok(out);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let Some(parent) = existing.parent() else {
                    return Err(e);
                };
                rest.push(existing.file_name().unwrap_or_default().to_owned());
                existing = parent;
            }
            Err(e) => return Err(e),
        }
    }
}

impl Roots {
    fn tree(
        src: &Path,
        src_top: SrcDir,
        dst: &Path,
        access: Access,
        sub: &[u8],
    ) -> Result<Roots, JobError> {
        let src_abs = resolve(src).map_err(|e| JobError::source(src, e))?;
        let dst_abs = resolve(dst).map_err(|e| JobError::destination(dst, e))?;
        if dst_abs.starts_with(&src_abs) || src_abs.starts_with(&dst_abs) {
            return Err(JobError::Usage(format!(
                "source {} and destination {} overlap; refusing to copy a tree into itself",
                src.display(),
                dst.display()
            )));
        }
        let src_path = join_path(src, sub);
        let dst_path = join_path(dst, sub);
        let src_dir = match src_top.fd() {
            Some(top) if !sub.is_empty() => SrcDir::local(
                crate::target::open_beneath(top, sub)
                    .map_err(|e| JobError::source(&src_path, e))?,
            ),
            _ => src_top,
        };
        let (dst_fd, dst_existed) = dst_tree(dst, &dst_path, access, sub)?;
        Ok(Roots {
            src_path,
            dst_path,
            src_dir,
            dst_fd,
            dst_existed,
            single: None,
        })
    }

    /// The roots of a tree whose SRC is across a wire.
    fn far_tree(
        src: &Path,
        src_dir: SrcDir,
        dst: &Path,
        access: Access,
    ) -> Result<Roots, JobError> {
        let (dst_fd, dst_existed) = dst_tree(dst, dst, access, &[])?;
        Ok(Roots {
            src_path: src.to_owned(),
            dst_path: dst.to_owned(),
            src_dir,
            dst_fd,
            dst_existed,
            single: None,
        })
    }

    /// The roots of a single-file copy: `file` is the source's directory,
    /// the file's name there and its stat; `real` its resolved path when
    /// SRC is local (a copy onto itself is refused).
    fn file(
        src: &Path,
        file: (SrcDir, CString, Stat),
        real: Option<&Path>,
        dst: &Path,
        access: Access,
    ) -> Result<Roots, JobError> {
        let (src_dir, src_name, st) = file;
        if st.file_type() == sluice_sys::FileType::Directory {
            return Err(JobError::Usage(format!("{} is a directory", src.display())));
        }
        // `copy FILE dir/`: a trailing slash names a directory, made if
        // missing (never a file called `dir`). The copy takes the name SRC
        // was given by (a symlink's, not its target's).
        let given = src
            .file_name()
            .map(|n| n.as_bytes().to_vec())
            .unwrap_or_else(|| src_name.to_bytes().to_vec());
        let names_dir = dst.as_os_str().as_bytes().ends_with(b"/");
        let (dst_dir, dst_name) = if dst.is_dir() || names_dir {
            (dst.to_owned(), given)
        } else {
            let name = dst
                .file_name()
                .ok_or_else(|| JobError::Usage(format!("{} names no file", dst.display())))?;
            let dir = match dst.parent() {
                Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
                _ => PathBuf::from("."),
            };
            (dir, name.as_bytes().to_vec())
        };
        let dst_full = dst_dir.join(std::ffi::OsStr::from_bytes(&dst_name));
        if let Some(real) = real {
            if resolve(&dst_full).map_err(|e| JobError::destination(dst, e))? == real {
                return Err(JobError::Usage(format!(
                    "source {} and destination {} are the same file",
                    src.display(),
                    dst.display()
                )));
            }
        }
        let dst_fd = match access {
            Access::Peek => crate::target::open_root(&dst_dir, false)?,
            Access::Read => crate::target::open_root(&dst_dir, true)?,
            Access::Write | Access::WriteLocked => {
                let (fd, _) = crate::target::create_root(&dst_dir)?;
                // The target directory is locked as a tree's root is: a
                // tree run over it would otherwise take this copy's
                // temporary for a leftover.
                if access == Access::Write {
                    crate::target::lock_root(fd.as_fd(), &dst_dir)?;
                }
                Some(fd)
            }
        };
        Ok(Roots {
            src_path: (real.and_then(Path::parent).or(src.parent()))
                .unwrap_or(Path::new("/"))
                .to_owned(),
            dst_path: dst_dir,
            src_dir,
            dst_fd,
            dst_existed: false,
            single: Some((src_name, cstring(&dst_name), st)),
        })
    }
}

/// Opens (or, to write, creates and locks) DST's root of a tree and the
/// subdirectory `sub` below it. Returns it (`None`: a dry run's DST that
/// does not exist) and whether it existed.
fn dst_tree(
    dst: &Path,
    dst_path: &Path,
    access: Access,
    sub: &[u8],
) -> Result<(Option<OwnedFd>, bool), JobError> {
    let below = |root: OwnedFd| crate::target::open_beneath(root.as_fd(), sub);
    let (dst_fd, dst_existed) = match access {
        // Only looks: an existing DST is opened to compare with.
        Access::Peek => match crate::target::open_root(dst, false)? {
            Some(root) => match below(root) {
                Ok(fd) => (Some(fd), true),
                Err(Errno::NOENT) => (None, false),
                Err(e) => return Err(JobError::destination(dst_path, e)),
            },
            None => (None, false),
        },
        Access::Read => {
            let root = crate::target::open_root(dst, true)?.expect("must exist");
            let fd = below(root).map_err(|e| JobError::destination(dst_path, e))?;
            (Some(fd), true)
        }
        Access::Write | Access::WriteLocked => {
            let (root, existed) = crate::target::create_root(dst)?;
            // One writer per DST (guarantee 6). The lock lives on DST's
            // own directory, so no lock file is ever left inside it.
            if access == Access::Write {
                crate::target::lock_root(root.as_fd(), dst)?;
            }
            if sub.is_empty() {
                (Some(root), existed)
            } else {
                let (fd, existed) = crate::target::make_beneath(root.as_fd(), sub)
                    .map_err(|e| JobError::destination(dst_path, e))?;
                (Some(fd), existed)
            }
        }
    };
    Ok((dst_fd, dst_existed))
}

/// `base/sub` for messages (`base` when `sub` is empty).
fn join_path(base: &Path, sub: &[u8]) -> PathBuf {
    if sub.is_empty() {
        base.to_owned()
    } else {
        base.join(std::ffi::OsStr::from_bytes(sub))
    }
}

fn cstring(b: &[u8]) -> CString {
    CString::new(b).expect("a path component has no NUL")
}

//! What the streams of one job share, and the values they pass each other:
//! the job's state ([`Shared`]), the directories and big files in flight
//! ([`DirNode`], [`BigFile`], kept in [`Table`]s), the tasks on the queue
//! ([`Task`]: plain values that name what they work on by key, never hold
//! it) and a stream's own context ([`Worker`]). Types only, and the few methods every layer above uses;
//! what is done with them lives in the modules above (`worker` runs
//! tasks, `copy`, `existing`, `verify`, `delta` and `meta` carry them out,
//! `tree` finishes directories, `job` builds and runs the whole).

use crate::budget::Budget;
use crate::error::{EntryError, Reason, Side};
use crate::gauge::{Activity, Gauge};
use crate::journal::Journal;
use crate::ledger::{Claim, Key, Links, Table};
use crate::options::{CopyOptions, Reporter, Stats};
use crate::queue::{Lane, Queue};
use crate::source::{Source, SrcFile};
use crate::throttle::Throttle;
use crate::tune::Gate;
use sluice_sys::{AlignedBuf, Errno, Stat};
use sluice_walk::DirStream;
use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

/// State shared by the streams of one job.
pub(crate) struct Shared {
    pub opts: CopyOptions,
    /// Where entries are read from.
    pub source: Arc<dyn Source>,
    pub queue: Queue<Task>,
    pub stats: Arc<Stats>,
    pub(crate) reporter: Arc<dyn Reporter>,
    /// Set by the caller (a signal): the job stops, state saved.
    pub(crate) cancel: Arc<AtomicBool>,
    /// Set by a fatal error: the job stops too, but the caller's flag is
    /// left alone (a full disk under `--delete` is followed by a pass that
    /// frees space).
    pub(crate) halted: Arc<AtomicBool>,
    pub(crate) fatal: Mutex<Option<EntryError>>,
    pub(crate) src_root: Vec<u8>,
    pub(crate) dst_root: Vec<u8>,
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
    /// New directories are filled under a temporary name and renamed into
    /// place when finished, so their files are created under their final
    /// names (see `Worker::make_dir`). Off where other processes write
    /// into the same tree (`--shard`, MPI ranks): they name directories by
    /// path.
    pub hide_new_dirs: bool,
    /// Cleared after DST refuses to clone an older copy (block-delta).
    pub delta_clone_ok: AtomicBool,
    pub(crate) pid: u32,
    pub(crate) tmp_seq: AtomicU64,
    /// Resume state of big files; `None` in a dry run.
    pub journal: Option<Journal>,
    /// A part of a split job: the journals of earlier runs split another
    /// way, read when a temporary another run made is first met (see
    /// [`Shared::earlier_splits`]).
    pub(crate) earlier: std::sync::OnceLock<Vec<(crate::shard::Shard, crate::journal::Resumable)>>,
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
    /// What is in flight, the hard-link groups, and what waits for the
    /// end of the walk.
    pub(crate) ledger: Ledger,
    /// What each stream is doing, sampled for the bottleneck report.
    pub gauge: Gauge,
    /// Streams and buffer size that fit `--mem-limit`.
    pub budget: Budget,
    /// `--bwlimit`, shared by all streams.
    pub throttle: Option<Throttle>,
    /// How many of the streams may take work (all of them unless `-j auto`).
    pub gate: Gate,
    /// The group this job's work is shared out with as it goes (see
    /// [`crate::exchange`]), and this member's part of it.
    pub(crate) sharing: Option<(Arc<dyn crate::options::Group>, crate::shard::Shard)>,
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

    /// The journals of earlier runs of this job split into another count
    /// of parts ([`crate::journal::Journal::earlier_splits`]), read once,
    /// when first asked: only a rerun that finds a shared temporary it did
    /// not make pays for listing DST's root.
    pub fn earlier_splits(&self) -> &[(crate::shard::Shard, crate::journal::Resumable)] {
        self.earlier
            .get_or_init(|| match (&self.journal, self.opts.shard) {
                (Some(j), Some(part)) => j.earlier_splits(part.count),
                _ => Vec::new(),
            })
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

/// A hard-linked name waiting for its group's data: its directory (held)
/// and its name there.
pub(crate) type Waiting = (Arc<DirNode>, CString);

/// A job's bookkeeping, in one place, fed by what the streams report:
/// the directories and big files in flight (by the keys tasks carry), the
/// hard-link groups, the extras DST has that SRC lacks, and the entries
/// waiting for `--delete` to remove a directory in their way.
#[derive(Default)]
pub(crate) struct Ledger {
    /// Directories in flight.
    pub dirs: Table<DirNode>,
    /// Big files being copied chunk by chunk.
    pub bigs: Table<BigFile>,
    /// Big files being compared chunk by chunk (`verify`).
    pub checks: Table<CheckBig>,
    /// A waiting name holds its directory until it is linked.
    links: Mutex<Links<(u32, u32, u64), Waiting>>,
    extras: Mutex<Vec<Extras>>,
    /// Directories other parts of the job wrote into, finished once every
    /// part is done: (path, SRC's metadata, whether it existed).
    unfinished: Mutex<Vec<(Vec<u8>, Stat, bool)>>,
    /// Temporaries of earlier runs a part of a split job saw and could not
    /// tell from another part's in use: removed once every part is done.
    leftovers: Mutex<Vec<Extras>>,
    /// New directories an interrupted run was filling, by the path of the
    /// directory they are in: a SRC directory of that name takes one up
    /// and renames it into place; what is left when that directory is
    /// finished is removed.
    hidden: Mutex<Vec<(Vec<u8>, CString)>>,
    any_hidden: AtomicBool,
    replaced: Mutex<Vec<Replacement>>,
}

impl Ledger {
    /// A directory other parts wrote into is done here: it is finished
    /// at the end of the job.
    pub fn finish_later(&self, node: &DirNode) {
        let later = (node.rel.clone(), node.stat, node.existed);
        self.unfinished.lock().expect("unfinished lock").push(later);
    }

    /// `name` in DST directory `rel` is a new directory an interrupted run
    /// was filling.
    pub fn found_hidden(&self, rel: &[u8], name: CString) {
        self.any_hidden.store(true, Relaxed);
        let mut hidden = self.hidden.lock().expect("hidden lock");
        hidden.push((rel.to_vec(), name));
    }

    /// What [`Ledger::found_hidden`] found in `rel`.
    pub fn take_hidden(&self, rel: &[u8]) -> Vec<CString> {
        if !self.any_hidden.load(Relaxed) {
            return Vec::new();
        }
        let mut hidden = self.hidden.lock().expect("hidden lock");
        let (mine, rest) = std::mem::take(&mut *hidden)
            .into_iter()
            .partition(|(dir, _)| dir == rel);
        *hidden = rest;
        mine.into_iter().map(|(_, name)| name).collect()
    }

    /// The directories [`Ledger::finish_later`] kept.
    pub fn take_unfinished(&self) -> Vec<(Vec<u8>, Stat, bool)> {
        std::mem::take(&mut self.unfinished.lock().expect("unfinished lock"))
    }

    /// Name `name` in `node` of hard-link group `key` is to be copied:
    /// see [`Links::claim`]. A name that waits holds its directory.
    pub fn claim_link(&self, key: (u32, u32, u64), node: &Arc<DirNode>, name: &CStr) -> Claim {
        self.links.lock().expect("links lock").claim(key, || {
            node.hold();
            (node.clone(), name.to_owned())
        })
    }

    /// The first copy of group `key` ended (at `rel`, inode `ino`, or
    /// failed): the names that waited, each holding its directory.
    pub fn settle_link(
        &self,
        key: (u32, u32, u64),
        copied: Option<(Vec<u8>, u64)>,
    ) -> Vec<Waiting> {
        self.links.lock().expect("links lock").settle(key, copied)
    }

    /// Whether DST's inode `ino` for a name of group `key` is linked as in
    /// SRC: see [`Links::intact`].
    pub fn link_intact(
        &self,
        key: (u32, u32, u64),
        rel: impl FnOnce() -> Vec<u8>,
        ino: u64,
    ) -> bool {
        self.links.lock().expect("links lock").intact(key, rel, ino)
    }

    /// Entries of a DST directory that SRC lacks, for `--delete`.
    pub fn found_extras(&self, extras: Extras) {
        self.extras.lock().expect("extras lock").push(extras);
    }

    pub fn take_extras(&self) -> Vec<Extras> {
        std::mem::take(&mut *self.extras.lock().expect("extras lock"))
    }

    pub fn found_leftovers(&self, left: Extras) {
        self.leftovers.lock().expect("leftovers lock").push(left);
    }

    pub fn take_leftovers(&self) -> Vec<Extras> {
        std::mem::take(&mut *self.leftovers.lock().expect("leftovers lock"))
    }

    /// An entry to copy once `--delete` removed the directory in its way;
    /// it holds its directory until then.
    pub fn replace_later(&self, r: Replacement) {
        r.node.hold();
        self.replaced.lock().expect("replaced lock").push(r);
    }

    pub fn take_replacements(&self) -> Vec<Replacement> {
        std::mem::take(&mut *self.replaced.lock().expect("replaced lock"))
    }

    /// The end of a job, whatever happened: big files still open go (their
    /// `Drop` removes or keeps their temporaries), and so does every
    /// directory (which hold the job's state).
    pub fn close(&self) {
        self.bigs.clear();
        self.checks.clear();
        self.replaced.lock().expect("replaced lock").clear();
        self.links.lock().expect("links lock").clear();
        self.dirs.clear();
    }
}

/// A source entry whose DST name holds a directory: copied once `--delete`
/// has removed that directory, after the walk. Holds its directory.
pub(crate) struct Replacement {
    pub(crate) node: Arc<DirNode>,
    pub(crate) src_name: CString,
    pub(crate) dst_name: CString,
    pub(crate) st: Stat,
}

/// Entries of one DST directory that SRC does not have, removed after the
/// walk if it had no error.
pub(crate) struct Extras {
    /// The directory, relative to DST's root.
    pub dir: Vec<u8>,
    /// The source directory's metadata, re-applied after the removal
    /// changed the directory's times.
    pub src_stat: Stat,
    /// Names, and whether each is a directory.
    pub names: Vec<(CString, bool)>,
}

/// An open directory pair: the source directory and its copy in DST.
///
/// It is finished (its mode and times set) when the last hold on it is
/// released: a hold is taken for every task that works in it, every
/// subdirectory in flight, every big file open in it and every hard link
/// waiting to be made in it, and given back when that is done (see
/// `tree.rs`). A task names its directory by `key`; the job's table of
/// directories keeps it while held.
pub(crate) struct DirNode {
    /// Its key in the job's table of directories.
    pub(crate) key: Key,
    /// Holds not yet released.
    pub(crate) holds: AtomicU32,
    pub(crate) src: crate::source::SrcDir,
    /// `None` in a dry run, where DST is never touched.
    pub(crate) dst: Option<OwnedFd>,
    /// Whether the DST directory existed before this run: only then are
    /// its entries compared with the source's (a new one is empty).
    pub(crate) existed: bool,
    /// Path relative to the job's roots ("" for the roots).
    pub(crate) rel: Vec<u8>,
    /// The source directory's metadata, applied on drop.
    pub(crate) stat: Stat,
    /// Owner and group that entries created in the DST directory get
    /// without a chown (our euid/egid; `None` if the directory is set-gid
    /// or unknown, so every entry is chowned).
    pub(crate) creates_as: Option<(u32, u32)>,
    /// The DST directory's device and inode: the tag of the temporaries
    /// created in it (see `sluice_sys::temp_tag`); zeros in a dry run.
    pub(crate) dst_id: (u32, u32, u64),
    /// Whether the DST directory has a default ACL, so that what is created
    /// in it inherits ACLs SRC's entries may not have (removed again).
    pub(crate) default_acl: bool,
    /// What the source directory's file system reports sizes as.
    pub(crate) src_kind: sluice_sys::FsKind,
    /// Whether the metadata of this directory is ours to set (false for the
    /// parent of a single-file copy, which the job does not own).
    pub(crate) owned: bool,
    /// The parent, on which this directory holds a hold until it is
    /// finished (so a parent is always finished after its children).
    pub(crate) parent: Option<Arc<DirNode>>,
    pub(crate) shared: Arc<Shared>,
    /// Another part of the job writes into it too (see
    /// [`crate::exchange`]): its mode and times wait for the end of the
    /// job, when no part writes anywhere.
    pub(crate) shared_out: AtomicBool,
    /// A new directory filled under this name in its parent, renamed to
    /// its own name when finished (see `Worker::make_dir`).
    pub(crate) hidden: Option<TempName>,
}

impl DirNode {
    /// Takes a hold on this directory: it is not finished before the hold
    /// is released (`DirNode::release`). Only whoever holds it already may
    /// take another, so the count never climbs back from zero.
    pub fn hold(&self) {
        self.holds.fetch_add(1, Relaxed);
    }

    /// The destination directory's descriptor (not called in dry runs).
    pub fn dst(&self) -> BorrowedFd<'_> {
        self.dst
            .as_ref()
            .expect("a DST directory: not called for one a dry run would create")
            .as_fd()
    }

    /// True when an entry created here already has `st`'s owner and group,
    /// so the chown (a syscall and an inode write per file) can be skipped.
    pub fn creates_owned_by(&self, st: &sluice_sys::Stat) -> bool {
        self.creates_as == Some((st.uid, st.gid))
    }

    /// Path of a child relative to the roots.
    pub fn child_rel(&self, name: &CStr) -> Vec<u8> {
        let name = name.to_bytes();
        let mut rel = Vec::with_capacity(self.rel.len() + 1 + name.len());
        rel.extend_from_slice(&self.rel);
        if !rel.is_empty() {
            rel.push(b'/');
        }
        rel.extend_from_slice(name);
        rel
    }

    /// An error about a child entry, with its full path.
    pub fn error(&self, name: &CStr, side: Side, op: &'static str, reason: Reason) -> EntryError {
        self.shared.error(side, &self.child_rel(name), op, reason)
    }

    /// An error about this directory itself.
    pub fn self_error(&self, side: Side, op: &'static str, reason: Reason) -> EntryError {
        self.shared.error(side, &self.rel, op, reason)
    }
}

/// Entries per small-file batch: enough to amortise queue traffic, few
/// enough that one big directory spreads over all streams.
pub(crate) const BATCH: usize = 128;

/// A unit of work on the queue: a plain value that names what it works on
/// by key (its directory, its big file), so it could as well be written to
/// a socket; the stream that takes it looks the key up.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) enum Task {
    /// List an already opened directory pair (the roots).
    List { dir: Key },
    /// Open, create in DST, then list a subdirectory of `parent`.
    Dir {
        parent: Key,
        name: CString,
        st: Stat,
    },
    /// Copy a batch of non-directory entries of one directory.
    Files(FileBatch),
    /// Copy the next unclaimed chunk of a big file.
    Chunk { big: Key },
    /// Compare the next unclaimed chunk of a big file (`verify`).
    Check { big: Key },
    /// Copy one file under another name (SRC given as a file).
    Single {
        dir: Key,
        src_name: CString,
        dst_name: CString,
        st: Stat,
    },
}

impl Task {
    pub(crate) fn lane(&self) -> Lane {
        match self {
            Task::List { .. } | Task::Dir { .. } => Lane::Dir,
            Task::Chunk { .. } | Task::Check { .. } => Lane::Chunk,
            _ => Lane::Data,
        }
    }

    /// The directory this task holds (taken when it was made, released
    /// when it has run).
    pub(crate) fn holds(&self) -> Option<Key> {
        match self {
            Task::List { dir } | Task::Single { dir, .. } => Some(*dir),
            Task::Dir { parent, .. } => Some(*parent),
            Task::Files(batch) => Some(batch.dir),
            Task::Chunk { .. } | Task::Check { .. } => None,
        }
    }
}

/// A directory being listed: counted in `Stats::listings_pending` from
/// when it is found until its listing is over (its subdirectories are
/// counted before that), so the count reaches zero exactly when the walk
/// is over and the totals found are final. Counted up with the task that
/// lists it; this guard counts it down when that task has run.
pub(crate) struct Listing<'a>(&'a Stats);

impl<'a> Listing<'a> {
    /// A directory found: its listing task is about to be queued.
    pub fn found(stats: &Stats) {
        stats.listings_pending.fetch_add(1, Relaxed);
    }

    /// The listing of a directory found earlier has begun.
    pub fn begun(stats: &'a Stats) -> Listing<'a> {
        Listing(stats)
    }
}

impl Drop for Listing<'_> {
    fn drop(&mut self) {
        self.0.listings_pending.fetch_sub(1, Relaxed);
    }
}

/// Entries of one directory, names packed into one buffer so a batch costs
/// two allocations however many entries it holds.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct FileBatch {
    pub(crate) dir: Key,
    pub(crate) names: Vec<u8>,
    pub(crate) entries: Vec<(u32, Stat)>,
}

impl FileBatch {
    pub(crate) fn new(dir: Key) -> Self {
        FileBatch {
            dir,
            names: Vec::with_capacity(BATCH * 16),
            entries: Vec::with_capacity(BATCH),
        }
    }

    pub(crate) fn push(&mut self, name: &CStr, st: Stat) {
        self.entries.push((self.names.len() as u32, st));
        self.names.extend_from_slice(name.to_bytes_with_nul());
    }

    pub(crate) fn name(&self, start: u32) -> &CStr {
        CStr::from_bytes_until_nul(&self.names[start as usize..]).expect("names are NUL-terminated")
    }
}

/// Per-stream scratch space, reused for every entry.
pub(crate) struct Scratch {
    /// Data buffer for read/write copies, allocated on first use.
    pub buf: Option<AlignedBuf>,
    pub xattr_names: Vec<u8>,
    pub xattr_value: Vec<u8>,
    pub link: Vec<u8>,
    pub stream: Option<DirStream>,
    pub(crate) buf_size: usize,
}

impl Scratch {
    /// The stream's data buffer (its size set by the job's memory budget
    /// and the streams at work, see [`crate::budget::share`]), allocated on
    /// first use, and again when that size changed.
    pub fn buf(&mut self) -> &mut [u8] {
        let size = self.buf_size;
        if self.buf.as_ref().is_some_and(|b| b.len() != size) {
            self.buf = None;
        }
        self.buf
            .get_or_insert_with(|| AlignedBuf::new(size))
            .as_mut_slice()
    }
}

/// One stream of the pool.
pub(crate) struct Worker {
    pub shared: Arc<Shared>,
    pub scratch: Scratch,
    /// Why the entry being copied differs from DST's (`-v`): set by
    /// `up_to_date`, `["new"]` where DST has nothing.
    pub why: Vec<&'static str>,
    /// This stream's index, for the gauge.
    pub(crate) id: usize,
    /// Runs a task on this stream (the pool's dispatch, `worker.rs`): what
    /// [`Worker::queue_task`] does with a task the full queue refuses.
    run: fn(&mut Worker, Task),
}

impl Worker {
    /// Stream `id` of the pool, running tasks with `run`.
    pub fn new(shared: Arc<Shared>, id: usize, run: fn(&mut Worker, Task)) -> Self {
        let buf_size = shared.budget.buf;
        Worker {
            shared,
            id,
            run,
            why: Vec::new(),
            scratch: Scratch {
                buf: None,
                xattr_names: Vec::new(),
                xattr_value: Vec::new(),
                link: Vec::new(),
                stream: None,
                buf_size,
            },
        }
    }

    pub(crate) fn id(&self) -> usize {
        self.id
    }

    /// Sizes this stream's data buffer for the streams at work now: they
    /// share one pool of buffer memory ([`crate::budget::share`]). Called
    /// before each task, and before each chunk of a big file (a stream may
    /// stay on one file while the tuner adds streams).
    pub(crate) fn fit_buffer(&mut self) {
        let streams = self.shared.gate.target();
        self.scratch.buf_size = crate::budget::share(self.shared.budget.buf, streams);
    }

    /// Tells the gauge what this stream is doing now.
    #[inline]
    pub(crate) fn doing(&self, a: Activity) {
        self.shared.gauge.set(self.id, a);
    }

    /// Queues a task, or runs it right here when the queue is full (so a
    /// full queue holds the stream back rather than growing).
    pub(crate) fn queue_task(&mut self, task: Task) {
        if let Err(task) = self.shared.queue.push(task.lane(), task) {
            (self.run)(self, task);
        }
    }
}

/// A temporary's name, kept inline so naming a file allocates nothing.
#[derive(Clone, Copy)]
pub(crate) struct TempName {
    pub(crate) bytes: [u8; 64],
}

impl TempName {
    /// The name the new directory `name` has in directory `dir` (its
    /// identity) while it is filled: the same in every run.
    pub(crate) fn hidden(dir: (u32, u32, u64), name: &[u8]) -> TempName {
        let mut bytes = [0u8; 64];
        sluice_sys::hidden_dir_name(dir, name, &mut bytes);
        TempName { bytes }
    }

    pub(crate) fn as_cstr(&self) -> &CStr {
        CStr::from_bytes_until_nul(&self.bytes).expect("NUL-terminated")
    }
}

/// A big file whose chunks are copied by any number of streams at once.
/// Holds its directory until it is finished.
pub(crate) struct BigFile {
    /// Its key in the job's table of big files.
    pub(crate) key: Key,
    pub(crate) node: Arc<DirNode>,
    pub(crate) src_name: CString,
    pub(crate) dst_name: CString,
    /// Path in DST relative to its root: the file's key in the journal.
    pub(crate) rel: Vec<u8>,
    /// The temporary being filled; `None` when the final file itself is
    /// patched (`--inplace`).
    pub(crate) tmp: Option<TempName>,
    pub(crate) src: SrcFile,
    pub(crate) dst: Arc<OwnedFd>,
    /// Whether `src` and `dst` were switched to `O_DIRECT`.
    pub(crate) direct: bool,
    /// Whether `dst` already holds an older version: chunks are compared
    /// and only differing blocks written (see `delta`).
    pub(crate) delta: bool,
    /// DST's older version, open for reading, when SRC is across a wire
    /// and `dst` is a fresh temporary: pieces whose digests match are
    /// taken from it rather than fetched.
    pub(crate) old: Option<OwnedFd>,
    pub(crate) st: Stat,
    /// The chunks still to copy (all of them, unless resumed).
    pub(crate) todo: Vec<u64>,
    /// Index into `todo` of the next chunk to claim.
    pub(crate) next: AtomicU64,
    pub(crate) done: AtomicU64,
    pub(crate) failed: Mutex<Option<EntryError>>,
    /// Why it is copied (`-v`), said when it is committed.
    pub(crate) why: Vec<&'static str>,
    /// Bytes this run wrote into it: counted as copied once it is committed
    /// (a file that then fails copied nothing).
    pub(crate) copied: AtomicU64,
    /// Whether the journal has a record of this file.
    pub(crate) journaled: bool,
    /// How many times the source changed under earlier attempts.
    pub(crate) attempt: u32,
    pub(crate) committed: AtomicBool,
    /// Split by chunk between the parts of a job (`--shard`): how they
    /// share it, and the inode of the temporary they share.
    pub(crate) part: Option<(crate::parts::PartFile, u64)>,
}

/// A big file compared chunk by chunk by any number of streams. Holds its
/// directory until it is finished.
pub(crate) struct CheckBig {
    /// Its key in the job's table of compared files.
    pub(crate) key: Key,
    pub(crate) node: Arc<DirNode>,
    pub(crate) name: CString,
    pub(crate) src: SrcFile,
    pub(crate) dst: OwnedFd,
    pub(crate) st: Stat,
    pub(crate) dst_st: Stat,
    pub(crate) chunks: u64,
    pub(crate) next: AtomicU64,
    pub(crate) done: AtomicU64,
    pub(crate) differs: AtomicBool,
    pub(crate) failed: Mutex<Option<EntryError>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A task is a value: it goes through an encoding and comes back the
    /// same, which is what carrying it to another process needs.
    #[test]
    fn a_task_round_trips_through_an_encoding() {
        let st = Stat {
            size: 5 << 30,
            mode: 0o100644,
            ..Stat::default()
        };
        let mut batch = FileBatch::new(Key(7));
        batch.push(c"a", st);
        batch.push(c"b\nc", st);
        let tasks = [
            Task::List { dir: Key(0) },
            Task::Dir {
                parent: Key(1),
                name: CString::new(b"\xff\xfe".to_vec()).unwrap(),
                st,
            },
            Task::Files(batch),
            Task::Chunk { big: Key(3) },
            Task::Check { big: Key(4) },
            Task::Single {
                dir: Key(0),
                src_name: c"x".to_owned(),
                dst_name: c"y".to_owned(),
                st,
            },
        ];
        for t in tasks {
            let text = serde_json::to_string(&t).unwrap();
            let back: Task = serde_json::from_str(&text).unwrap();
            assert_eq!(back, t, "{text}");
            assert_eq!(back.holds(), t.holds());
        }
    }
}

//! `sluice watch`: an initial sync, then continuous replication.
//!
//! ```text
//!  inotify (one watch per SRC directory) ─► dirty directories, coalesced
//!     ─► a pass: for each dirty directory, a shallow sync job (a new
//!        subdirectory: a whole one) on the same engine ─► lag, report
//!  every --rescan, after an event-queue overflow, after DST came back:
//!     a full sync of the tree
//! ```
//!
//! Events only say where to look; what to copy is decided by the same
//! comparison `sluice sync` makes, so a lost or misread event costs a
//! later look, never a wrong copy. Deletes go through the engine's
//! `--delete`, which removes a directory's extras only after both of its
//! listings were read without error.
//!
//! The watch holds DST's one-writer lock for its whole life. Before every
//! pass it checks that DST is still the directory it started with (same
//! device and inode): an unmounted share leaves an empty mount point
//! behind, which must not be filled. Until DST is back, changes wait, and
//! the pass after it returns is a full one.

use crate::error::JobError;
use crate::job::copy;
use crate::options::{CopyOptions, Outcome, Reporter, Stats, Summary};
use sluice_sys::notify::{Event, Inotify, Kind};
use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How a watch behaves.
pub struct WatchOptions {
    /// A full sync of the whole tree this often, whatever the events said.
    pub rescan: Duration,
    /// A pass starts once no event came for this long...
    pub settle: Duration,
    /// ...or once the oldest waiting change is this old.
    pub max_delay: Duration,
    /// The longest wait between attempts while DST is unavailable.
    pub retry_max: Duration,
}

impl Default for WatchOptions {
    fn default() -> Self {
        WatchOptions {
            rescan: Duration::from_secs(600),
            settle: Duration::from_millis(50),
            max_delay: Duration::from_millis(500),
            retry_max: Duration::from_secs(30),
        }
    }
}

/// One pass of a watch, as reported.
#[derive(Clone, Debug)]
pub struct Pass {
    /// A full sync (the first, a rescan, after an overflow or an outage).
    pub full: bool,
    /// Why a full pass ran.
    pub reason: &'static str,
    /// Directories synced (1 for a full pass).
    pub dirs: usize,
    /// Changes (events) the pass covered.
    pub changes: usize,
    /// Seconds from each covered change to the end of the pass, sorted.
    pub lags: Vec<f64>,
    pub summary: Summary,
    /// Directories of SRC watched after the pass.
    pub watching: usize,
}

/// What a watch tells its caller as it goes.
pub trait WatchReporter: Reporter {
    /// A pass finished.
    fn pass(&self, pass: &Pass);
    /// SRC or DST cannot be used now (DST unwritable, or either side no
    /// longer the directory the watch started with); changes wait (said
    /// once per outage).
    fn unavailable(&self, side: crate::Side, why: &str);
    /// Both sides are back.
    fn available(&self);
    /// Something is degraded but the watch goes on (inotify limits).
    fn warning(&self, msg: &str);
}

/// A directory to sync, with the changes that made it dirty.
struct Dirty {
    /// Copy it whole (new, or moved in), not just its own entries.
    whole: bool,
    /// When each change was seen (bounded: the lag of the first ones tells
    /// the story).
    seen: Vec<Instant>,
}

/// The watches: inotify watch number ↔ directory relative to SRC.
struct Watches {
    inotify: Inotify,
    src: PathBuf,
    rel: HashMap<i32, Vec<u8>>,
    /// Set once `max_user_watches` was hit: rescans carry the rest.
    full: bool,
}

fn join(base: &Path, rel: &[u8]) -> PathBuf {
    if rel.is_empty() {
        base.to_owned()
    } else {
        base.join(OsStr::from_bytes(rel))
    }
}

fn child(rel: &[u8], name: &[u8]) -> Vec<u8> {
    let mut r = rel.to_vec();
    if !r.is_empty() {
        r.push(b'/');
    }
    r.extend_from_slice(name);
    r
}

fn parent(rel: &[u8]) -> Vec<u8> {
    match rel.iter().rposition(|&b| b == b'/') {
        Some(i) => rel[..i].to_vec(),
        None => Vec::new(),
    }
}

/// Whether `rel` is `dir` or below it.
fn under(rel: &[u8], dir: &[u8]) -> bool {
    dir.is_empty() || rel == dir || (rel.starts_with(dir) && rel.get(dir.len()) == Some(&b'/'))
}

impl Watches {
    /// Watches `rel` and every directory below it (same file system as
    /// SRC's root is not required: a watch is cheap).
    fn add_tree(&mut self, rel: &[u8], reporter: &dyn WatchReporter) {
        let mut stack = vec![rel.to_vec()];
        while let Some(rel) = stack.pop() {
            let path = join(&self.src, &rel);
            match self.inotify.add(&path) {
                Ok(wd) => {
                    self.rel.insert(wd, rel.clone());
                }
                Err(sluice_sys::Errno::NOSPC) => {
                    if !self.full {
                        self.full = true;
                        reporter.warning(
                            "inotify watch limit reached (fs.inotify.max_user_watches): \
                             directories beyond it are caught by the periodic rescan only",
                        );
                    }
                    return;
                }
                // Gone meanwhile, or not a directory any more: its parent's
                // events say so.
                Err(_) => continue,
            }
            let Ok(rd) = std::fs::read_dir(&path) else {
                continue;
            };
            for e in rd.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(child(&rel, e.file_name().as_bytes()));
                }
            }
        }
    }

    /// Forgets the watches at `rel` and below (moved out of SRC).
    fn remove_tree(&mut self, rel: &[u8]) {
        let gone: Vec<i32> = self
            .rel
            .iter()
            .filter(|(_, r)| under(r, rel))
            .map(|(&wd, _)| wd)
            .collect();
        for wd in gone {
            self.inotify.remove(wd);
            self.rel.remove(&wd);
        }
    }
}

/// Whether directory `rel` or one above it is excluded from the job.
fn excluded(filter: &sluice_walk::Filter, rel: &[u8]) -> bool {
    if filter.is_empty() || rel.is_empty() {
        return false;
    }
    let mut end = 0;
    for (i, name) in rel.split(|&b| b == b'/').enumerate() {
        end += name.len() + usize::from(i > 0);
        if filter.excludes(name, &rel[..end], true) {
            return true;
        }
    }
    false
}

/// Whether `path` is the directory (device, inode) a watch started with.
fn same_dir(dst: &Path, id: (u64, u64)) -> bool {
    std::fs::metadata(dst).is_ok_and(|m| m.is_dir() && (m.dev(), m.ino()) == id)
}

/// Runs until `cancel` is set. `options(full)` makes a pass's sync job
/// options (a full pass may tune its streams; a small one runs a few). Returns the totals over all passes.
pub fn watch(
    src: &Path,
    dst: &Path,
    options: &dyn Fn(bool) -> CopyOptions,
    wopts: &WatchOptions,
    reporter: Arc<dyn WatchReporter>,
    cancel: Arc<AtomicBool>,
) -> Result<Totals, JobError> {
    if !src.is_dir() {
        return Err(JobError::Usage(format!(
            "{} is not a directory; sluice watch replicates a tree",
            src.display()
        )));
    }
    let src = src.canonicalize().map_err(|e| JobError::source(src, e))?;
    let dst_err = |e: std::io::Error| JobError::destination(dst, e);
    // Checked before DST is created: it must not appear inside SRC.
    let dst_abs = crate::target::resolve(dst).map_err(dst_err)?;
    if dst_abs.starts_with(&src) || src.starts_with(&dst_abs) {
        return Err(JobError::Usage(format!(
            "source {} and destination {} overlap; refusing to replicate a tree into itself",
            src.display(),
            dst.display()
        )));
    }
    let (dst_dir, _) = crate::target::create_root(dst)?;
    crate::target::lock_root(sluice_sys::fd(&dst_dir), dst, false)?;
    // Held (with its lock) until the watch ends.
    let dst_dir = std::fs::File::from(dst_dir);
    let meta = dst_dir.metadata().map_err(dst_err)?;
    let dst_id = (meta.dev(), meta.ino());
    // SRC is remembered the same way: a share that drops leaves an empty
    // mount point, which must never look like "everything was deleted".
    let src_meta = std::fs::metadata(&src).map_err(|e| JobError::source(&src, e))?;
    let src_id = (src_meta.dev(), src_meta.ino());

    let inotify = Inotify::new().map_err(|e| JobError::source(&src, e))?;
    let mut watches = Watches {
        inotify,
        src: src.clone(),
        rel: HashMap::new(),
        full: false,
    };
    // Watches first: a change made during the initial sync is seen.
    watches.add_tree(b"", &*reporter);

    let mut w = Watcher {
        src,
        dst: dst.to_owned(),
        dst_id,
        src_id,
        full_needed: false,
        watching: 0,
        options,
        reporter,
        cancel,
        totals: Totals::default(),
    };
    let mut dirty: BTreeMap<Vec<u8>, Dirty> = BTreeMap::new();
    let mut full_due: Option<&'static str> = Some("initial sync");
    let mut last_full = Instant::now();
    let mut last_event = Instant::now();
    let mut moved_from: HashMap<u32, Vec<u8>> = HashMap::new();
    let mut down_since: Option<Instant> = None;
    let mut retry_at = Instant::now();
    let mut backoff = Duration::from_millis(250);
    while !w.cancel.load(Relaxed) {
        // Wait for events, but no longer than the next thing due.
        let oldest = dirty.values().filter_map(|d| d.seen.first()).min().copied();
        let wait = if full_due.is_some() || oldest.is_some() {
            wopts.settle
        } else {
            Duration::from_millis(200)
        };
        let events = watches
            .inotify
            .read(wait)
            .map_err(|e| JobError::source(&w.src, e))?;
        let now = Instant::now();
        if !events.is_empty() {
            last_event = now;
        }
        for ev in events {
            if ev.kind == Kind::Overflow {
                full_due = Some("event queue overflow");
                continue;
            }
            on_event(
                &mut watches,
                &mut dirty,
                &mut moved_from,
                &ev,
                now,
                &*w.reporter,
            );
        }
        // A rename whose other half never came: moved out of SRC.
        for (_, rel) in moved_from.drain() {
            watches.remove_tree(&rel);
        }
        if last_full.elapsed() >= wopts.rescan {
            full_due.get_or_insert("periodic rescan");
        }
        let settled = now.duration_since(last_event) >= wopts.settle
            || oldest.is_some_and(|t| now.duration_since(t) >= wopts.max_delay);
        if (full_due.is_none() && dirty.is_empty()) || !settled || now < retry_at {
            continue;
        }
        let gone = [
            (&w.src, w.src_id, crate::Side::Src),
            (&w.dst, w.dst_id, crate::Side::Dst),
        ]
        .into_iter()
        .find(|(path, id, _)| !same_dir(path, *id));
        if let Some((path, _, side)) = gone {
            if down_since.is_none() {
                down_since = Some(now);
                let name = if side == crate::Side::Src {
                    "SRC"
                } else {
                    "DST"
                };
                w.reporter.unavailable(
                    side,
                    &format!(
                        "{name} {} is missing or is not the directory the watch started \
                         with (unmounted?); changes wait until it is back",
                        path.display()
                    ),
                );
            }
            retry_at = now + backoff;
            backoff = (backoff * 2).min(wopts.retry_max);
            continue;
        }
        if down_since.take().is_some() {
            w.reporter.available();
            full_due.get_or_insert("DST is back");
        }
        w.watching = watches.rel.len();
        let result = match full_due {
            Some(reason) => {
                // The full pass covers every dirty directory too.
                let seen: Vec<Instant> = dirty.values().flat_map(|d| d.seen.clone()).collect();
                w.full_pass(reason, seen).map(|ok| {
                    if ok {
                        full_due = None;
                        dirty.clear();
                        last_full = Instant::now();
                    }
                })
            }
            None => w.dirty_pass(&mut dirty).map(|()| {
                if std::mem::take(&mut w.full_needed) {
                    full_due = Some("a directory of DST was not a directory");
                }
            }),
        };
        match result {
            Ok(()) => backoff = Duration::from_millis(250),
            // Bad usage (SRC and DST overlap, say), or a DST that cannot
            // take the initial sync: say so and stop, rather than wait.
            Err(e) if matches!(e, JobError::Usage(_)) || w.totals.passes == 0 => return Err(e),
            Err(e) => {
                // DST failed as a whole (gone, full, read-only): the
                // changes wait and the attempt is repeated.
                if down_since.is_none() {
                    down_since = Some(Instant::now());
                    w.reporter.unavailable(crate::Side::Dst, &e.to_string());
                }
                retry_at = Instant::now() + backoff;
                backoff = (backoff * 2).min(wopts.retry_max);
            }
        }
    }
    Ok(w.totals)
}

/// Totals over a watch's passes.
#[derive(Clone, Debug, Default)]
pub struct Totals {
    pub passes: u64,
    pub full_passes: u64,
    pub files_copied: u64,
    pub bytes_copied: u64,
    pub deleted: u64,
    pub errors: u64,
    pub changes: u64,
    /// Every change's lag, seconds (bounded to the last 100,000).
    pub lags: Vec<f64>,
}

struct Watcher<'a> {
    src: PathBuf,
    dst: PathBuf,
    dst_id: (u64, u64),
    /// SRC root's device and inode when the watch started.
    src_id: (u64, u64),
    /// A pass found DST in a shape only a full pass mends.
    full_needed: bool,
    /// Directories watched now, for the pass report.
    watching: usize,
    /// A pass's job options; `true` for a full pass.
    options: &'a dyn Fn(bool) -> CopyOptions,
    reporter: Arc<dyn WatchReporter>,
    cancel: Arc<AtomicBool>,
    totals: Totals,
}

/// Forwards a pass's per-entry reports to the watch's reporter.
struct Forward(Arc<dyn WatchReporter>);

impl Reporter for Forward {
    fn entry_failed(&self, err: &crate::EntryError) {
        self.0.entry_failed(err)
    }
    fn entry_skipped(&self, path: &[u8], why: &str) {
        self.0.entry_skipped(path, why)
    }
    fn entry_deleted(&self, path: &[u8]) {
        self.0.entry_deleted(path)
    }
    fn entry_differs(&self, side: crate::Side, src: &[u8], dst: &[u8], what: &str) {
        self.0.entry_differs(side, src, dst, what)
    }
    fn notice(&self, path: &[u8], what: &str) {
        self.0.notice(path, what)
    }
    fn entry_changed(&self, path: &[u8], action: &str, why: &[&'static str]) {
        self.0.entry_changed(path, action, why)
    }
}

impl Watcher<'_> {
    /// One sync job of `rel`; Ok(false) if it was interrupted.
    fn job(&self, rel: &[u8], shallow: bool, stats: &Arc<Stats>) -> Result<bool, JobError> {
        let mut opts = (self.options)(!shallow && rel.is_empty());
        if excluded(&opts.filter, rel) {
            return Ok(true);
        }
        opts.sub = rel.to_vec();
        opts.shallow = shallow;
        // The watch holds DST's lock across passes.
        opts.dst_locked = true;
        // A directory that is gone, or is something else now, is its
        // parent's business (whose pass the same change marked): a job on
        // it would copy a file *into* DST's directory of that name. The job
        // reaches SRC/rel and DST/rel from the roots without following a
        // symlink, so one planted in DST never redirects a pass.
        let src = join(&self.src, rel);
        if !rel.is_empty() && !std::fs::symlink_metadata(&src).is_ok_and(|m| m.is_dir()) {
            return Ok(true);
        }
        match copy(
            &self.src,
            &self.dst,
            opts,
            stats.clone(),
            Arc::new(Forward(self.reporter.clone())),
            self.cancel.clone(),
        ) {
            Ok(Outcome::Interrupted) => Ok(false),
            Ok(_) => Ok(true),
            // Gone (or no longer a directory) since the check: its
            // parent's pass deals with that.
            Err(JobError::Source { source, .. })
                if !rel.is_empty()
                    && source.raw_os_error().is_some_and(|e| {
                        use sluice_sys::Errno;
                        [Errno::NOENT, Errno::NOTDIR, Errno::LOOP]
                            .iter()
                            .any(|x| x.raw_os_error() == e)
                    }) =>
            {
                Ok(true)
            }
            Err(e) => Err(e),
        }
    }

    fn full_pass(&mut self, reason: &'static str, seen: Vec<Instant>) -> Result<bool, JobError> {
        let stats = Arc::new(Stats::default());
        let start = Instant::now();
        let done = self.job(b"", false, &stats)?;
        self.finish(true, reason, 1, seen, &stats, start);
        Ok(done)
    }

    /// Syncs every dirty directory not covered by a dirty ancestor copied
    /// whole, parents first (a new directory's parent exists in DST).
    fn dirty_pass(&mut self, dirty: &mut BTreeMap<Vec<u8>, Dirty>) -> Result<(), JobError> {
        let stats = Arc::new(Stats::default());
        let start = Instant::now();
        let mut whole: Vec<Vec<u8>> = Vec::new();
        let mut seen = Vec::new();
        let mut dirs = 0;
        let todo: Vec<Vec<u8>> = dirty.keys().cloned().collect();
        for rel in todo {
            if self.cancel.load(Relaxed) {
                break;
            }
            let covered = whole.iter().any(|w| under(&rel, w));
            let d = dirty.get(&rel).expect("listed");
            if !covered {
                match self.job(&rel, !d.whole, &stats) {
                    Ok(true) => {}
                    Ok(false) => break,
                    // DST/rel cannot be reached as a directory beneath DST
                    // (a symlink or file planted there): a full pass, which
                    // replaces it as any differing entry, takes over.
                    Err(JobError::Destination { .. }) => {
                        self.full_needed = true;
                        dirty.remove(&rel);
                        continue;
                    }
                    Err(e) => return Err(e),
                }
                dirs += 1;
                if d.whole {
                    whole.push(rel.clone());
                }
            }
            let d = dirty.remove(&rel).expect("listed");
            seen.extend(d.seen);
        }
        self.finish(false, "", dirs, seen, &stats, start);
        Ok(())
    }

    fn finish(
        &mut self,
        full: bool,
        reason: &'static str,
        dirs: usize,
        seen: Vec<Instant>,
        stats: &Stats,
        start: Instant,
    ) {
        let end = Instant::now();
        let mut lags: Vec<f64> = seen
            .iter()
            .map(|t| end.duration_since(*t).as_secs_f64())
            .collect();
        lags.sort_by(f64::total_cmp);
        let summary = stats.summary(end.duration_since(start));
        let t = &mut self.totals;
        t.passes += 1;
        t.full_passes += u64::from(full);
        t.files_copied += summary.files_copied;
        t.bytes_copied += summary.bytes_copied;
        t.deleted += summary.deleted;
        t.errors += summary.errors;
        t.changes += seen.len() as u64;
        t.lags.extend(&lags);
        if t.lags.len() > 100_000 {
            t.lags.drain(..t.lags.len() - 100_000);
        }
        self.reporter.pass(&Pass {
            full,
            reason,
            dirs,
            changes: seen.len(),
            lags,
            summary,
            watching: self.watching,
        });
    }
}

/// Marks what an event makes dirty, and keeps the watches in step with
/// directories created, moved and removed.
fn on_event(
    watches: &mut Watches,
    dirty: &mut BTreeMap<Vec<u8>, Dirty>,
    moved_from: &mut HashMap<u32, Vec<u8>>,
    ev: &Event,
    now: Instant,
    reporter: &dyn WatchReporter,
) {
    let Some(dir) = watches.rel.get(&ev.wd).cloned() else {
        return;
    };
    let mut mark = |rel: Vec<u8>, whole: bool| {
        let d = dirty.entry(rel).or_insert(Dirty {
            whole,
            seen: Vec::new(),
        });
        d.whole |= whole;
        if d.seen.len() < 10_000 {
            d.seen.push(now);
        }
    };
    if ev.kind == Kind::Gone {
        watches.rel.remove(&ev.wd);
        return;
    }
    if ev.name.is_empty() {
        // The directory's own metadata: its parent's pass sets it.
        if !dir.is_empty() {
            mark(parent(&dir), false);
        } else {
            mark(dir, false);
        }
        return;
    }
    let rel = child(&dir, &ev.name);
    mark(dir, false);
    if !ev.dir {
        return;
    }
    match ev.kind {
        Kind::MovedFrom => {
            moved_from.insert(ev.cookie, rel);
        }
        Kind::MovedTo => {
            // Renamed within SRC: the old half's watches move along (a
            // watch follows its inode; adding it again renames it here).
            moved_from.remove(&ev.cookie);
            watches.add_tree(&rel, reporter);
            mark(rel, true);
        }
        Kind::Changed => {
            // A new directory: watched before it is copied, so nothing
            // created in it meanwhile is missed.
            watches.add_tree(&rel, reporter);
            mark(rel, true);
        }
        Kind::Deleted => watches.remove_tree(&rel),
        Kind::Gone | Kind::Overflow => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        assert_eq!(child(b"", b"a"), b"a");
        assert_eq!(child(b"a", b"b"), b"a/b");
        assert_eq!(parent(b"a/b"), b"a");
        assert_eq!(parent(b"a"), b"");
        assert!(under(b"a/b", b"a"));
        assert!(under(b"a", b"a"));
        assert!(!under(b"ab", b"a"));
        assert!(under(b"x", b""));
    }

    #[test]
    fn exclusions_cover_whole_subtrees() {
        let f = sluice_walk::Filter::new(&["cache".into(), "a/skip".into()], &[]).unwrap();
        assert!(excluded(&f, b"cache"));
        assert!(excluded(&f, b"x/cache/y"));
        assert!(excluded(&f, b"a/skip/z"));
        assert!(!excluded(&f, b"b/skip"));
        assert!(!excluded(&f, b"a"));
        assert!(!excluded(&f, b""));
    }
}

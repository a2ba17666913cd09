//! A copy job: its options, its shared state, its counters, and `copy()`.

use crate::error::{JobError, Side};
use crate::gauge::Gauge;
use crate::journal::Journal;
use crate::options::{CopyOptions, Outcome, Reflink, Reporter, Stats};
use crate::queue::Queue;
use crate::source::{LocalSource, Source, SrcDir, SrcRoot};
use crate::state::Shared;
use crate::target::resolve;
use crate::throttle::Throttle;

use crate::state::{DirNode, Ledger, Listing, Task, Worker};
use crate::tune::Gate;
use sluice_sys::{Errno, Stat};
use std::ffi::CString;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How often `-j auto` measures and adjusts.
const TUNE_EVERY: Duration = Duration::from_secs(1);

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
        Access::Write if opts.shard.is_some() => Access::WritePart,
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
            let j = Journal::open(
                fd,
                roots.single.as_ref().map(|s| s.1.to_bytes()),
                opts.shard.as_ref(),
            )
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
    // A tree shared out between the members of a group as it goes; a
    // single file is split by chunk, as `--shard` splits it.
    let sharing = match (&opts.group, opts.shard) {
        (Some(g), Some(part)) if g.shares_work() && roots.single.is_none() => {
            Some((g.clone(), part))
        }
        _ => None,
    };
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
        hide_new_dirs: opts.shard.is_none() && opts.group.is_none(),
        delta_clone_ok: AtomicBool::new(opts.reflink != Reflink::Never),
        pid: std::process::id(),
        tmp_seq: AtomicU64::new(0),
        journal,
        earlier: std::sync::OnceLock::new(),
        deletes_for_real: pass == Pass::FreeSpace || !opts.dry_run,
        umask,
        src_root_entries: AtomicU64::new(0),
        dst_root_entries: AtomicU64::new(0),
        ledger: Ledger::default(),
        gauge: Gauge::new(jobs),
        budget,
        throttle,
        gate: Gate::new(if auto { opts.jobs.min(jobs) } else { jobs }, jobs),
        sharing,
        opts,
    });
    // Its one hold is the first task's.
    let key = shared.ledger.dirs.key();
    let root = Arc::new(DirNode {
        key,
        holds: std::sync::atomic::AtomicU32::new(1),
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
        shared_out: std::sync::atomic::AtomicBool::new(false),
        hidden: None,
    });
    shared.ledger.dirs.insert(key, root);
    let first = match roots.single {
        None => {
            Listing::found(&shared.stats);
            Task::List { dir: key }
        }
        Some((src_name, dst_name, st)) => {
            // One file: the walk is over before it starts.
            shared.stats.entries_found.fetch_add(1, Relaxed);
            shared.stats.bytes_found.fetch_add(st.size, Relaxed);
            Task::Single {
                dir: key,
                src_name,
                dst_name,
                st,
            }
        }
    };
    // Sharing, part 0 lists the root and the others start with nothing:
    // work comes to them from the group, which holds every part's queue
    // open until no part has any left.
    let desk = shared.sharing.as_ref().map(|(group, part)| {
        shared.queue.hold();
        let root = shared.ledger.dirs.get(key).expect("the root is held");
        let desk = Arc::new(crate::exchange::JobDesk {
            shared: shared.clone(),
            root,
        });
        group.open(desk.clone());
        (desk, part.index == 0)
    });
    match &desk {
        Some((_, false)) => drop(Listing::begun(&shared.stats)),
        _ => shared
            .queue
            .push(crate::queue::Lane::Dir, first)
            .unwrap_or_else(|_| unreachable!("a new queue has room")),
    }
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
                    .spawn_scoped(s, move || Worker::stream(shared, i).run())
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
    if let Some((desk, lists_root)) = desk {
        // The root's first task, which only part 0 ran, is done.
        if !lists_root {
            desk.root.release();
        }
        // Every part is done writing: what several wrote into is finished.
        if !shared.stopped() {
            crate::tree::finish_unfinished(&shared);
        }
    }
    shared
        .stats
        .streams
        .store(shared.gate.target() as u64, Relaxed);
    *shared.stats.busy.lock().expect("busy lock") = shared.gauge.busy(started.elapsed());
    if let Some(t) = &shared.throttle {
        let ns = t.waited().as_nanos() as u64;
        shared.stats.throttle_wait_ns.fetch_add(ns, Relaxed);
    }
    // Streams are gone; anything still queued (after a stop) is dropped
    // here, and big files still open go, which removes their temporaries
    // (or, journaled, keeps them for the rerun).
    drop(shared.queue.close());
    shared.ledger.bigs.clear();
    shared.ledger.checks.clear();
    // Every member of a group asks, whatever its own state: the others
    // wait for its answer. Past it, every member's files are committed.
    let all_clean = match &shared.opts.group {
        Some(group) if shared.writes() => {
            let errors = shared.stats.errors.load(Relaxed);
            group.all_clean(!shared.stopped() && errors == 0)
        }
        _ => true,
    };
    if !shared.stopped() && shared.opts.delete {
        crate::delete::run(&shared, all_clean);
        crate::worker::replace(&shared);
    }
    if all_clean && shared.opts.group.is_some() && !shared.stopped() {
        crate::delete::leftovers(&shared);
    }
    // Directories hold `shared`: let them go whatever happened.
    shared.ledger.close();
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
            let (dir, _) = crate::target::split_rel(&rel);
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
    /// Writes it as one part of a job split over processes (`--shard`):
    /// locked shared with the other parts.
    WritePart,
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
            Access::Write | Access::WriteLocked | Access::WritePart => {
                let (fd, _) = crate::target::create_root(&dst_dir)?;
                // The target directory is locked as a tree's root is: a
                // tree run over it would otherwise take this copy's
                // temporary for a leftover.
                if access != Access::WriteLocked {
                    let part = access == Access::WritePart;
                    crate::target::lock_root(fd.as_fd(), &dst_dir, part)?;
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
        Access::Write | Access::WriteLocked | Access::WritePart => {
            let (root, existed) = crate::target::create_root(dst)?;
            // One writer per DST (guarantee 6). The lock lives on DST's
            // own directory, so no lock file is ever left inside it.
            if access != Access::WriteLocked {
                let part = access == Access::WritePart;
                crate::target::lock_root(root.as_fd(), dst, part)?;
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

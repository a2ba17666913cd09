//! The destination side: the one module of the engine that turns a DST
//! *path* into a descriptor.
//!
//! Everything a job writes is reached from DST's root descriptor, held
//! for the whole job, one name at a time: the syscall layer refuses any
//! name with a `/` in it (or `..`), so a directory of DST swapped for a
//! symlink mid-run can never redirect a write, a link or a delete. The
//! few operations that need more than one component — a watch pass on a
//! subdirectory, the first name of a hard-linked file, a journal record's
//! temporary, a delete after the walk — go through [`open_beneath`] or
//! [`make_beneath`] here (`openat2` with `RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS`, else `O_NOFOLLOW` per component). State files
//! (the journal, chunk maps) are opened with [`open_state`]: `O_NOFOLLOW`
//! from a held directory, checked to be regular files.
//!
//! DST's root itself is named by the user, so symlinks in that path are
//! followed as any tool does; the part of it that does not exist yet is
//! created one component at a time from the deepest existing ancestor.
//!
//! Locks: a writing job holds an exclusive `flock` on its DST root, and a
//! shared one on every DST directory it enters that existed before; a job
//! refuses to start below a directory another run holds exclusively (its
//! root), and a job that meets another run's root below its own leaves
//! that subtree alone (reported), so two runs never remove each other's
//! temporaries.

use crate::error::JobError;
use sluice_sys::{Errno, FileType};
use std::ffi::{CStr, CString, OsStr};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// Opens the directory `rel` below the held directory `root`, never
/// through a symlink and never outside `root`.
pub(crate) fn open_beneath(root: BorrowedFd<'_>, rel: &[u8]) -> Result<OwnedFd, Errno> {
    sluice_sys::open_dir_beneath(root, rel)
}

/// Opens the directory this run calls `rel` below `root`, where some of
/// the way may still be a new directory filled under a temporary name
/// (`DirNode::hidden`): a component not found under its own name is
/// looked for under that one, then once more under its own (renamed into
/// place meanwhile). Never through a symlink.
pub(crate) fn open_as_named(root: BorrowedFd<'_>, rel: &[u8]) -> Result<OwnedFd, Errno> {
    match open_beneath(root, rel) {
        Err(Errno::NOENT) => {}
        other => return other,
    }
    let mut cur = open_beneath(root, b"")?;
    for part in rel.split(|&b| b == b'/').filter(|p| !p.is_empty()) {
        let name = CString::new(part).map_err(|_| Errno::INVAL)?;
        let next = match sluice_sys::open_dir_at(cur.as_fd(), &name) {
            Err(Errno::NOENT) => {
                let id = sluice_sys::stat_fd(cur.as_fd())?.identity();
                let mut buf = [0u8; 64];
                let hidden = sluice_sys::hidden_dir_name(id, part, &mut buf);
                match sluice_sys::open_dir_at(cur.as_fd(), hidden) {
                    Err(Errno::NOENT) => sluice_sys::open_dir_at(cur.as_fd(), &name),
                    other => other,
                }
            }
            other => other,
        };
        cur = next?;
    }
    Ok(cur)
}

/// Removes `name` in `dir` and, if it is a directory, everything in it:
/// never through a symlink, never into another file system.
pub(crate) fn remove_tree_at(dir: BorrowedFd<'_>, name: &CStr) -> Result<(), Errno> {
    let dev = sluice_sys::stat_fd(dir)?.dev;
    remove_entry(dir, name, dev, &mut sluice_walk::DirStream::default())
}

/// Opens the directory `rel` below `root`, creating what is missing of it
/// (owner-only, as any directory a job creates until it is finished),
/// never through a symlink. Returns whether the last component existed.
pub(crate) fn make_beneath(root: BorrowedFd<'_>, rel: &[u8]) -> Result<(OwnedFd, bool), Errno> {
    let mut cur = sluice_sys::open_dir_beneath(root, b"")?;
    let mut existed = true;
    for part in rel.split(|&b| b == b'/').filter(|p| !p.is_empty()) {
        let name = CString::new(part).map_err(|_| Errno::INVAL)?;
        existed = match sluice_sys::mkdir_at(cur.as_fd(), &name, 0o700) {
            Ok(()) => false,
            Err(Errno::EXIST) => true,
            Err(e) => return Err(e),
        };
        cur = sluice_sys::open_dir_at(cur.as_fd(), &name)?;
    }
    Ok((cur, existed))
}

/// Opens (or with `create`, creates owner-only) the state file `name` in
/// the held directory `dir`: not through a symlink, and only a regular
/// file. `Ok(None)`: absent, and not to be created.
pub(crate) fn open_state(
    dir: BorrowedFd<'_>,
    name: &CStr,
    create: bool,
) -> Result<Option<std::fs::File>, Errno> {
    sluice_sys::open_state_file(dir, name, create)
}

/// Opens the state file `name` in `dir` (as [`open_state`] does) as a redb
/// database with a `cache` of that many bytes: `Ok(None)` if absent and
/// not to be created. Errors are in words, for the caller to prefix.
pub(crate) fn open_state_db(
    dir: BorrowedFd<'_>,
    name: &CStr,
    create: bool,
    cache: usize,
) -> Result<Option<redb::Database>, StateError> {
    let file = match open_state(dir, name, create) {
        Ok(Some(f)) => f,
        Ok(None) => return Ok(None),
        Err(Errno::INVAL) => return Err(StateError::other("not a regular file")),
        Err(e) => return Err(StateError::other(std::io::Error::from(e))),
    };
    let backend = redb::backends::FileBackend::new(file).map_err(StateError::other)?;
    let mut b = redb::Builder::new();
    b.set_cache_size(cache);
    match b.create_with_backend(backend) {
        Ok(db) => Ok(Some(db)),
        Err(redb::DatabaseError::DatabaseAlreadyOpen) => Err(StateError::Busy),
        Err(e) => Err(StateError::other(e)),
    }
}

/// Why a state file (a journal, a chunk map) could not be opened or read.
#[derive(Debug)]
pub(crate) enum StateError {
    /// Another process has it open: it is in use, not damaged.
    Busy,
    Other(String),
}

impl StateError {
    pub(crate) fn other(e: impl std::fmt::Display) -> StateError {
        StateError::Other(e.to_string())
    }
}

impl std::fmt::Display for StateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StateError::Busy => {
                f.write_str("another sluice run is using it; wait for it to finish")
            }
            StateError::Other(why) => f.write_str(why),
        }
    }
}

impl From<StateError> for String {
    fn from(e: StateError) -> String {
        e.to_string()
    }
}

/// Why a later name of a hard-linked file could not be linked.
pub(crate) enum LinkFailure {
    Os(Errno),
    /// The first name no longer holds the file this run copied there.
    Replaced,
}

/// Links `to_name` in `to_dir` to the file this run committed at
/// `from_rel` (relative to `root`), whose inode is `ino`: the first name's
/// directory is opened beneath the root, so a directory swapped for a
/// symlink cannot make DST link to a file outside it, and the linked inode
/// is checked (a name replaced meanwhile is unlinked again).
pub(crate) fn link_beneath(
    root: BorrowedFd<'_>,
    from_rel: &[u8],
    ino: u64,
    to_dir: BorrowedFd<'_>,
    to_name: &CStr,
) -> Result<(), LinkFailure> {
    let (dir, name) = split_rel(from_rel);
    let from_dir = open_as_named(root, dir).map_err(LinkFailure::Os)?;
    let name = CString::new(name).map_err(|_| LinkFailure::Os(Errno::INVAL))?;
    sluice_sys::link_at(from_dir.as_fd(), &name, to_dir, to_name).map_err(LinkFailure::Os)?;
    match sluice_sys::stat_at(to_dir, to_name) {
        Ok(st) if ino == 0 || st.ino == ino => Ok(()),
        _ => {
            let _ = sluice_sys::unlink_at(to_dir, to_name);
            Err(LinkFailure::Replaced)
        }
    }
}

/// DST's root for a job that writes: created if missing (like `mkdir -p`,
/// but each missing component with `mkdirat` and opened without following
/// a symlink), then checked writable. Returns whether it existed.
pub(crate) fn create_root(path: &Path) -> Result<(OwnedFd, bool), JobError> {
    let err = |e: Errno| JobError::destination(path, e);
    let abs = std::path::absolute(path).map_err(|e| JobError::destination(path, e))?;
    // The deepest ancestor that exists, opened as the user named it.
    let mut missing: Vec<&OsStr> = Vec::new();
    let mut base = abs.as_path();
    let mut base_fd = loop {
        match sluice_sys::open_dir_path(base) {
            Ok(fd) => break fd,
            Err(Errno::NOENT) => {}
            Err(Errno::NOTDIR) if missing.is_empty() => return Err(not_a_dir(path)),
            Err(e) => return Err(JobError::destination(base, e)),
        }
        match (base.parent(), base.components().next_back()) {
            (Some(parent), Some(Component::Normal(name))) => {
                missing.push(name);
                base = parent;
            }
            _ => return Err(err(Errno::NOENT)),
        }
    };
    let existed = missing.is_empty();
    // Made as `mkdir -p` would, with the user's umask (given explicitly:
    // an earlier job in this process cleared the process's).
    let mode = 0o777 & !sluice_sys::clear_umask();
    for name in missing.iter().rev() {
        let name = CString::new(name.as_bytes()).map_err(|_| err(Errno::INVAL))?;
        match sluice_sys::mkdir_at(base_fd.as_fd(), &name, mode) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(e) => return Err(err(e)),
        }
        base_fd = sluice_sys::open_dir_at(base_fd.as_fd(), &name).map_err(|e| match e {
            Errno::NOTDIR | Errno::LOOP => not_a_dir(path),
            e => err(e),
        })?;
    }
    sluice_sys::check_writable_dir(base_fd.as_fd()).map_err(err)?;
    Ok((base_fd, existed))
}

/// DST's root for a job that only reads it: `None` if it does not exist
/// and `must_exist` is false.
pub(crate) fn open_root(path: &Path, must_exist: bool) -> Result<Option<OwnedFd>, JobError> {
    match sluice_sys::open_dir_path(path) {
        Ok(fd) => Ok(Some(fd)),
        Err(Errno::NOENT) if !must_exist => Ok(None),
        Err(Errno::NOTDIR) if path.exists() => Err(not_a_dir(path)),
        Err(e) => Err(JobError::destination(path, e)),
    }
}

fn not_a_dir(path: &Path) -> JobError {
    JobError::Usage(format!(
        "destination {} is a file, not a directory; a directory SRC is copied into a directory \
         (name a new or existing directory, or remove the file)",
        path.display()
    ))
}

/// One writer per DST: takes the exclusive lock on DST's root, and refuses
/// a DST below the root of another run (which holds its root exclusively).
/// `dir` is the opened root, `path` how the user named it. The parts of a
/// job split over processes (`--shard`) are one writer: each takes the
/// lock shared, which still keeps out any run that is not a part.
pub(crate) fn lock_root(dir: BorrowedFd<'_>, path: &Path, part: bool) -> Result<(), JobError> {
    let busy = |p: &Path| {
        JobError::Usage(format!(
            "another sluice run is writing to {}; wait for it to finish",
            p.display()
        ))
    };
    let lock = if part {
        sluice_sys::try_lock_shared(dir)
    } else {
        sluice_sys::try_lock(dir)
    };
    match lock {
        Err(Errno::WOULDBLOCK) => return Err(busy(path)),
        Err(e) => return Err(JobError::destination(path, e)),
        Ok(()) => {}
    }
    // Each ancestor: a shared lock is refused while another run holds it
    // exclusively (it is that run's DST); taken and released at once.
    let real = resolve(path).unwrap_or_else(|_| PathBuf::from(path));
    for anc in real.ancestors().skip(1) {
        let Ok(fd) = sluice_sys::open_dir_path(anc) else {
            continue; // unreadable: nobody we could collide with can be told apart
        };
        match sluice_sys::try_lock_shared(fd.as_fd()) {
            Err(Errno::WOULDBLOCK) => return Err(busy(anc)),
            _ => {
                let _ = sluice_sys::unlock(fd.as_fd());
            }
        }
    }
    Ok(())
}

/// Marks a DST directory that existed before this run as in use by it (a
/// shared lock, held while `dir` is open). False when another run holds it
/// exclusively: that run's DST, which this run must leave alone.
pub(crate) fn enter(dir: BorrowedFd<'_>) -> bool {
    !matches!(sluice_sys::try_lock_shared(dir), Err(Errno::WOULDBLOCK))
}

/// Whether a DST entry is a directory on another file system than the
/// directory `parent_dev` it sits in: a mount point, never deleted into.
pub(crate) fn is_mount_point(dir: BorrowedFd<'_>, parent_dev: (u32, u32)) -> bool {
    sluice_sys::stat_fd(dir).is_ok_and(|st| st.dev != parent_dev)
}

/// Whether `name` in `dir` is a directory (not following a symlink).
pub(crate) fn is_dir_at(dir: BorrowedFd<'_>, name: &CStr) -> bool {
    sluice_sys::stat_at(dir, name).is_ok_and(|st| st.file_type() == FileType::Directory)
}

/// Creates the fresh directory `name` in DST's root `dst` (made if
/// missing), owner-only; fails if the name exists, so a directory or
/// symlink planted under it beforehand is never used (`sluice probe`'s
/// scratch space).
pub fn create_scratch(dst: &Path, name: &str) -> Result<PathBuf, JobError> {
    let (root, _) = create_root(dst)?;
    let c = CString::new(name).map_err(|_| JobError::Usage(format!("bad name {name:?}")))?;
    let path = dst.join(name);
    sluice_sys::mkdir_at(root.as_fd(), &c, 0o700).map_err(|e| JobError::destination(&path, e))?;
    Ok(path)
}

/// Removes the directory `path` and everything in it, from descriptors:
/// never through a symlink, never into another file system, on up to
/// `threads` threads (one subtree of `path` each at a time).
pub fn remove_tree(path: &Path, threads: usize) -> std::io::Result<()> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .and_then(|n| CString::new(n.as_bytes()).ok())
        .ok_or_else(|| std::io::Error::other("names no directory"))?;
    let parent = sluice_sys::open_dir_path(parent)?;
    let top = sluice_sys::open_dir_at(parent.as_fd(), &name)?;
    let dev = sluice_sys::stat_fd(top.as_fd())?.dev;
    let mut stream = sluice_walk::DirStream::default();
    let mut names = Vec::new();
    stream.for_each(top.as_fd(), |e| {
        names.push(e.name.to_owned());
        true
    })?;
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..threads.clamp(1, 64) {
            s.spawn(|| {
                let mut stream = sluice_walk::DirStream::default();
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(n) = names.get(i) else { break };
                    let _ = remove_entry(top.as_fd(), n, dev, &mut stream);
                }
            });
        }
    });
    Ok(sluice_sys::rmdir_at(parent.as_fd(), &name)?)
}

/// Removes `name` in `dir`, a whole tree if it is a directory on `dev`.
fn remove_entry(
    dir: BorrowedFd<'_>,
    name: &CStr,
    dev: (u32, u32),
    stream: &mut sluice_walk::DirStream,
) -> Result<(), Errno> {
    if !is_dir_at(dir, name) {
        return sluice_sys::unlink_at(dir, name);
    }
    let sub = sluice_sys::open_dir_at(dir, name)?;
    if is_mount_point(sub.as_fd(), dev) {
        return Err(Errno::XDEV);
    }
    let mut names = Vec::new();
    stream.for_each(sub.as_fd(), |e| {
        names.push(e.name.to_owned());
        true
    })?;
    for n in &names {
        let _ = remove_entry(sub.as_fd(), n, dev, stream);
    }
    sluice_sys::rmdir_at(dir, name)
}

/// Splits `a/b/name` into (`a/b`, `name`).
pub(crate) fn split_rel(rel: &[u8]) -> (&[u8], &[u8]) {
    match rel.iter().rposition(|&b| b == b'/') {
        Some(i) => (&rel[..i], &rel[i + 1..]),
        None => (&[], rel),
    }
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

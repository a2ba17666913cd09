//! Directories in flight, and the metadata they receive when done.
//!
//! A [`DirNode`] is held by every task that still works inside the
//! directory (the task names it by key; the hold is counted in the node),
//! by every big file or hard link still to be finished in it, and by each
//! of its subdirectories in flight. When the last hold is released, the
//! node leaves the job's table and only then are the directory's mode and
//! times set and, with `--fsync`, the directory synced: its times come out
//! right because nothing is written into it afterwards, and a parent is
//! always finished after its children. A directory other processes of
//! the job write into too waits for the end of the job instead
//! ([`finish_unfinished`]).

use crate::error::{Reason, Side};
use crate::state::{DirNode, Shared};
use sluice_sys::Stat;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::Ordering::{AcqRel, Relaxed};

/// Sets the mode and times of the DST directory `dst` from SRC's `stat`
/// (and with `--fsync` syncs it), once nothing more is written into it.
/// One that `existed` is only touched where it differs, so a re-run over
/// an unchanged tree changes no ctime; with --no-perms its mode is DST's
/// business.
fn finish(
    shared: &Shared,
    dst: BorrowedFd<'_>,
    stat: &Stat,
    existed: bool,
) -> Result<(), (&'static str, sluice_sys::Errno)> {
    let opts = &shared.opts;
    let perm = shared.mode_for(stat);
    let now = if existed {
        Some(sluice_sys::stat_fd(dst).map_err(|e| ("stat", e))?)
    } else {
        None
    };
    let keep_mode = now.is_some() && !opts.perms;
    if !keep_mode && now.is_none_or(|now| now.perm() != perm) {
        sluice_sys::set_perm(dst, perm).map_err(|e| ("chmod", e))?;
    }
    if now.is_none_or(|now| crate::compare::dir_times_differ(stat, &now)) {
        sluice_sys::set_times(dst, stat).map_err(|e| ("set times", e))?;
    }
    if opts.fsync {
        sluice_sys::sync(dst).map_err(|e| ("fsync", e))?;
    }
    Ok(())
}

/// Finishes the directories other parts of the job wrote into (see
/// [`crate::exchange`]), once every part is done: each is opened again
/// beneath DST's root.
pub(crate) fn finish_unfinished(shared: &Shared) {
    let Some(root) = &shared.dst_root_fd else {
        return;
    };
    let mut dirs = shared.ledger.take_unfinished();
    // Deepest first, as a parent is always finished after its children:
    // a mode without search permission set on a parent first would shut
    // the way to a child.
    let depth = |rel: &[u8]| match rel {
        [] => 0,
        _ => 1 + rel.iter().filter(|&&b| b == b'/').count(),
    };
    dirs.sort_by(|a, b| depth(&b.0).cmp(&depth(&a.0)).then_with(|| a.0.cmp(&b.0)));
    // Adopted once for each loan from it: finished once.
    dirs.dedup_by(|a, b| a.0 == b.0);
    for (rel, stat, existed) in dirs {
        let done = crate::target::open_beneath(root.as_fd(), &rel)
            .map_err(|e| ("open directory", e))
            .and_then(|dst| finish(shared, dst.as_fd(), &stat, existed));
        if let Err((op, e)) = done {
            shared.fail(shared.error(Side::Dst, &rel, op, Reason::Os(e)));
        }
    }
}

impl DirNode {
    /// Releases a hold (see [`DirNode::hold`]). The last one finishes the
    /// directory, then releases its hold on its parent, and so on up.
    /// Nothing is set on a stopped job, nor on a directory the job does not
    /// own (a single file's target directory).
    pub(crate) fn release(&self) {
        let mut node = self;
        loop {
            if node.holds.fetch_sub(1, AcqRel) != 1 {
                return;
            }
            let shared = &node.shared;
            shared.ledger.dirs.remove(node.key);
            if node.owned && !shared.stopped() {
                if node.shared_out.load(Relaxed) {
                    shared.ledger.finish_later(node);
                } else if let Some(dst) = &node.dst {
                    // Before its times are set: a removal changes them.
                    remove_unfinished_new_dirs(node, dst.as_fd());
                    if let Err((op, e)) = finish(shared, dst.as_fd(), &node.stat, node.existed) {
                        shared.fail(node.self_error(Side::Dst, op, Reason::Os(e)));
                    }
                    // Even after a failure above: its entries are complete.
                    if let Err(e) = node.put_in_place() {
                        shared.fail(node.self_error(Side::Dst, "rename into place", Reason::Os(e)));
                    }
                }
            }
            match &node.parent {
                Some(p) => node = p,
                None => return,
            }
        }
    }

    /// Renames a new directory filled under a temporary name
    /// ([`DirNode::hidden`]) to its own, unless something took that name
    /// meanwhile (`EEXIST`, reported: the copy stays under the temporary
    /// name, which the next run removes).
    fn put_in_place(&self) -> Result<(), sluice_sys::Errno> {
        let (Some(hidden), Some(parent)) = (&self.hidden, &self.parent) else {
            return Ok(());
        };
        let name = crate::target::split_rel(&self.rel).1;
        let name = std::ffi::CString::new(name).map_err(|_| sluice_sys::Errno::INVAL)?;
        let dir = parent.dst();
        match sluice_sys::rename_noreplace_at(dir, hidden.as_cstr(), &name) {
            // A file system without RENAME_NOREPLACE (some network and
            // FUSE ones): a plain rename, which cannot replace a file or a
            // directory with entries either, only an empty directory.
            Err(sluice_sys::Errno::INVAL | sluice_sys::Errno::NOSYS) => {
                sluice_sys::rename_at(dir, hidden.as_cstr(), dir, &name)
            }
            other => other,
        }
    }
}

/// Removes the new directories an interrupted run was filling in `node`
/// that no SRC directory took up (each took up is in place by now: its
/// children are finished before it).
fn remove_unfinished_new_dirs(node: &DirNode, dst: BorrowedFd<'_>) {
    let shared = &node.shared;
    for name in shared.ledger.take_hidden(&node.rel) {
        let rel = node.child_rel(&name);
        match crate::target::remove_tree_at(dst, &name) {
            Ok(()) => shared.reporter().notice(
                &shared.full_path(Side::Dst, &rel),
                "removed a directory an interrupted sluice run had begun",
            ),
            Err(sluice_sys::Errno::NOENT) => {}
            Err(e) => shared.fail(shared.error(
                Side::Dst,
                &rel,
                "remove leftover directory",
                Reason::Os(e),
            )),
        }
    }
}

/// What a job needs to know about a DST directory before writing into it,
/// from one `statx` (and one `getxattr`).
pub(crate) struct DstFacts {
    pub creates_as: Option<(u32, u32)>,
    pub id: (u32, u32, u64),
    pub default_acl: bool,
}

impl DstFacts {
    /// Facts of `dst` (`None`: a dry run's directory that does not exist).
    pub fn of(dst: Option<&OwnedFd>) -> DstFacts {
        let st = dst.and_then(|d| sluice_sys::stat_fd(d.as_fd()).ok());
        DstFacts::with_stat(dst, st)
    }

    /// Facts of `dst`, whose `statx` the caller has: new entries are owned
    /// by the creator's ids, unless the directory is set-gid (then the
    /// group is inherited).
    pub fn with_stat(dst: Option<&OwnedFd>, st: Option<Stat>) -> DstFacts {
        match (dst, st) {
            (Some(dst), Some(st)) => DstFacts {
                creates_as: (st.mode & 0o2000 == 0).then(sluice_sys::effective_ids),
                id: st.identity(),
                default_acl: sluice_sys::has_xattr(dst.as_fd(), crate::meta::ACL_DEFAULT),
            },
            _ => DstFacts {
                creates_as: None,
                id: (0, 0, 0),
                default_acl: false,
            },
        }
    }
}

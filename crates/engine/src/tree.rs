//! Directories in flight, and the metadata they receive when done.
//!
//! A [`DirNode`] is shared (`Arc`) by every task that still works inside the
//! directory, and each node holds its parent. When the last task finishes,
//! the node is dropped and only then are the directory's mode and times set
//! and, with `--fsync`, the directory synced: its times come out right
//! because nothing is written into it afterwards, and a parent is always
//! finished after its children.

use crate::error::{EntryError, Reason, Side};
use crate::job::Shared;
use sluice_sys::Stat;
use std::ffi::CStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

/// An open directory pair: the source directory and its copy in DST.
pub struct DirNode {
    pub src: crate::source::SrcDir,
    /// `None` in a dry run, where DST is never touched.
    pub dst: Option<OwnedFd>,
    /// Whether the DST directory existed before this run: only then are
    /// its entries compared with the source's (a new one is empty).
    pub existed: bool,
    /// Path relative to the job's roots ("" for the roots).
    pub rel: Vec<u8>,
    /// The source directory's metadata, applied on drop.
    pub stat: Stat,
    /// Owner and group that entries created in the DST directory get
    /// without a chown (our euid/egid; `None` if the directory is set-gid
    /// or unknown, so every entry is chowned).
    pub creates_as: Option<(u32, u32)>,
    /// The DST directory's device and inode: the tag of the temporaries
    /// created in it (see `sluice_sys::temp_tag`); zeros in a dry run.
    pub dst_id: (u32, u32, u64),
    /// Whether the DST directory has a default ACL, so that what is created
    /// in it inherits ACLs SRC's entries may not have (removed again).
    pub default_acl: bool,
    /// What the source directory's file system reports sizes as.
    pub src_kind: sluice_sys::FsKind,
    /// Whether the metadata of this directory is ours to set (false for the
    /// parent of a single-file copy, which the job does not own).
    pub owned: bool,
    /// Held, never read: keeps the parent open and unfinished until this
    /// directory is finished.
    #[allow(dead_code)]
    pub parent: Option<Arc<DirNode>>,
    pub(crate) shared: Arc<Shared>,
}

impl DirNode {
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

    fn finish(&self) -> Result<(), (&'static str, sluice_sys::Errno)> {
        let Some(dst) = &self.dst else { return Ok(()) };
        let dst = dst.as_fd();
        let opts = &self.shared.opts;
        let perm = self.shared.mode_for(&self.stat);
        // A directory that existed is only touched where it differs, so a
        // re-run over an unchanged tree changes no ctime; with --no-perms
        // its mode is DST's business.
        let now = if self.existed {
            Some(sluice_sys::stat_fd(dst).map_err(|e| ("stat", e))?)
        } else {
            None
        };
        let keep_mode = now.is_some() && !opts.perms;
        if !keep_mode && now.is_none_or(|now| now.perm() != perm) {
            sluice_sys::set_perm(dst, perm).map_err(|e| ("chmod", e))?;
        }
        if now.is_none_or(|now| crate::compare::dir_times_differ(&self.stat, &now)) {
            sluice_sys::set_times(dst, &self.stat).map_err(|e| ("set times", e))?;
        }
        if opts.fsync {
            sluice_sys::sync(dst).map_err(|e| ("fsync", e))?;
        }
        Ok(())
    }
}

impl Drop for DirNode {
    fn drop(&mut self) {
        if !self.owned || self.shared.stopped() {
            return;
        }
        if let Err((op, e)) = self.finish() {
            self.shared
                .fail(self.self_error(Side::Dst, op, Reason::Os(e)));
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
                id: dir_id(&st),
                default_acl: sluice_sys::has_xattr(dst.as_fd(), crate::copy::ACL_DEFAULT),
            },
            _ => DstFacts {
                creates_as: None,
                id: (0, 0, 0),
                default_acl: false,
            },
        }
    }
}

/// A directory's identity (device, inode): what tags its temporaries.
pub(crate) fn dir_id(st: &Stat) -> (u32, u32, u64) {
    (st.dev.0, st.dev.1, st.ino)
}

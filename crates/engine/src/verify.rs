//! Comparing content: `sluice verify` (actions that hash instead of write,
//! on the same pool and scheduler as a copy), and `--verify` on copy and
//! sync, which reads back what was written before it gets its final name.
//!
//! Each side is hashed on its own (XXH3-128 by default, BLAKE3 on request)
//! and the digests compared, so the same code serves a remote side later,
//! where only digests cross the network. Big files are compared chunk by
//! chunk on all streams at once, with `O_DIRECT` reads where allowed.

use crate::error::{EntryError, Reason, Side};
use crate::hash::hash_range;
use crate::plan;
use crate::queue::Lane;
use crate::source::{Open, SrcFile};
use crate::state::{CheckBig, DirNode, Task, Worker};
use sluice_sys::{Errno, FileType, Stat};
use std::ffi::CStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};

/// Files from this size up are read with `O_DIRECT` when comparing.
const DIRECT_MIN: u64 = 1 << 20;

/// Opens `name` for reading on both sides.
fn open_pair(node: &DirNode, name: &CStr) -> Result<(SrcFile, OwnedFd), EntryError> {
    let err = |side| move |e| node.error(name, side, "open", Reason::Os(e));
    Ok((
        node.shared
            .source
            .open(&node.src, name)
            .map_err(err(Side::Src))?,
        sluice_sys::open_read_at(node.dst(), name).map_err(err(Side::Dst))?,
    ))
}

fn kind_name(t: FileType) -> &'static str {
    match t {
        FileType::RegularFile => "file",
        FileType::Directory => "directory",
        FileType::Symlink => "symlink",
        FileType::Fifo => "fifo",
        FileType::Socket => "socket",
        FileType::CharacterDevice => "character device",
        FileType::BlockDevice => "block device",
        FileType::Unknown => "unknown entry",
    }
}

impl Worker {
    /// Hashes both files' `[off, off + len)` with the job's hash; true when
    /// they match. The stream's buffer is split between the two sides.
    fn same_range(
        &mut self,
        src: &SrcFile,
        dst: BorrowedFd<'_>,
        off: u64,
        len: u64,
    ) -> Result<bool, (Side, Errno)> {
        let kind = self.shared.opts.hash;
        self.doing(crate::gauge::Activity::Read);
        let buf = self.scratch.buf();
        let (a, b) = buf.split_at_mut(buf.len() / 2);
        let source = &self.shared.source;
        let (ds, ns) = (source.hash(src, off, len, a, kind)).map_err(|e| (Side::Src, e))?;
        let (dd, nd) = hash_range(dst, off, len, b, kind).map_err(|e| (Side::Dst, e))?;
        Ok(ds == dd && ns == nd)
    }

    /// `--verify`: reads back `[off, off + len)` of what was just written
    /// and compares it with the source; a mismatch fails the entry before
    /// it is committed.
    pub(crate) fn read_back(
        &mut self,
        node: &DirNode,
        dst_name: &CStr,
        src: &SrcFile,
        dst: BorrowedFd<'_>,
        off: u64,
        len: u64,
    ) -> Result<(), EntryError> {
        match self.same_range(src, dst, off, len) {
            Ok(true) => Ok(()),
            Ok(false) => Err(node.error(
                dst_name,
                Side::Dst,
                "verify",
                Reason::Other("what was read back differs from the source".into()),
            )),
            Err((side, e)) => Err(node.error(dst_name, side, "verify read", Reason::Os(e))),
        }
    }

    /// Compares one directory's metadata (with `--metadata`).
    pub(crate) fn check_dir_meta(&self, rel: &[u8], src: &Stat, dst_fd: BorrowedFd<'_>) {
        if !self.shared.opts.check.is_some_and(|c| c.metadata) {
            return;
        }
        match sluice_sys::stat_fd(dst_fd) {
            Ok(dst) => {
                if let Some(what) = self.meta_difference(src, &dst, None) {
                    self.shared.differs(Side::Src, rel, &what);
                }
            }
            Err(e) => self
                .shared
                .fail(self.shared.error(Side::Dst, rel, "stat", Reason::Os(e))),
        }
    }

    /// The first metadata difference between two entries of one kind, if
    /// any: mode, owner (when run as root), mtime, extended attributes.
    fn meta_difference(
        &self,
        src: &Stat,
        dst: &Stat,
        fds: Option<(Open<'_>, BorrowedFd<'_>)>,
    ) -> Option<String> {
        let mask = self.shared.opts.perm_mask();
        if src.file_type() != FileType::Symlink && src.perm() & mask != dst.perm() & mask {
            return Some(format!(
                "mode {:o} in SRC, {:o} in DST",
                src.perm() & mask,
                dst.perm() & mask
            ));
        }
        if self.shared.opts.preserve_owner && (src.uid, src.gid) != (dst.uid, dst.gid) {
            return Some(format!(
                "owner {}:{} in SRC, {}:{} in DST",
                src.uid, src.gid, dst.uid, dst.gid
            ));
        }
        if src.file_type() != FileType::Directory && src.mtime != dst.mtime {
            return Some(format!(
                "mtime {} in SRC, {} in DST",
                crate::error::date(src.mtime),
                crate::error::date(dst.mtime)
            ));
        }
        if let Some((s, d)) = fds {
            let source = &*self.shared.source;
            if !crate::source::xattrs_match(source, s, d, sluice_sys::XattrSet::All) {
                return Some("extended attributes differ".into());
            }
        }
        None
    }

    /// Finds `name` in DST and checks its kind (and size for files).
    /// Reports a difference and returns `None` when they already differ.
    fn check_counterpart(&self, node: &DirNode, name: &CStr, st: &Stat) -> Option<Stat> {
        let sh = &self.shared;
        let rel = node.child_rel(name);
        let dst = match sluice_sys::stat_at(node.dst(), name) {
            Ok(d) => d,
            Err(Errno::NOENT) => {
                sh.differs(Side::Src, &rel, "missing in DST");
                return None;
            }
            Err(e) => {
                sh.fail(node.error(name, Side::Dst, "stat", Reason::Os(e)));
                return None;
            }
        };
        if dst.file_type() != st.file_type() {
            let what = format!(
                "a {} in SRC, a {} in DST",
                kind_name(st.file_type()),
                kind_name(dst.file_type())
            );
            sh.differs(Side::Src, &rel, &what);
            return None;
        }
        if st.file_type() == FileType::RegularFile && dst.size != st.size {
            let what = format!("size {} in SRC, {} in DST", st.size, dst.size);
            sh.differs(Side::Src, &rel, &what);
            return None;
        }
        Some(dst)
    }

    /// `sluice verify` of one non-directory entry.
    pub(crate) fn check_entry(&mut self, node: &DirNode, name: &CStr, st: &Stat) {
        let Some(dst) = self.check_counterpart(node, name, st) else {
            return;
        };
        let sh = self.shared.clone();
        let rel = node.child_rel(name);
        let mut fds = None;
        let what = match st.file_type() {
            FileType::RegularFile => {
                let (src_fd, dst_fd) = match open_pair(node, name) {
                    Ok(fds) => fds,
                    Err(err) => return sh.fail(err),
                };
                let same = self.same_range(&src_fd, dst_fd.as_fd(), 0, u64::MAX);
                match same {
                    Err((side, e)) => {
                        return sh.fail(node.error(name, side, "read", Reason::Os(e)))
                    }
                    Ok(false) => Some("content differs".to_string()),
                    Ok(true) => {
                        sh.stats.files_copied.fetch_add(1, Relaxed);
                        sh.stats.bytes_copied.fetch_add(st.size, Relaxed);
                        fds = Some((src_fd, dst_fd));
                        None
                    }
                }
            }
            FileType::Symlink => {
                let s = sh.source.read_link(&node.src, name, Vec::new());
                let d = sluice_sys::readlink_at(node.dst(), name, Vec::new());
                match (s, d) {
                    (Ok(s), Ok(d)) if s == d => {
                        sh.stats.symlinks.fetch_add(1, Relaxed);
                        None
                    }
                    (Ok(_), Ok(_)) => Some("symlink target differs".to_string()),
                    (Err(e), _) | (_, Err(e)) => {
                        return sh.fail(node.error(name, Side::Src, "readlink", Reason::Os(e)));
                    }
                }
            }
            FileType::CharacterDevice | FileType::BlockDevice if st.rdev != dst.rdev => {
                Some("device number differs".to_string())
            }
            _ => {
                sh.stats.specials.fetch_add(1, Relaxed);
                None
            }
        };
        let what = what.or_else(|| {
            if !sh.opts.check.is_some_and(|c| c.metadata) {
                return None;
            }
            let borrowed = fds.as_ref().map(|(s, d)| (Open::File(s), d.as_fd()));
            self.meta_difference(st, &dst, borrowed)
        });
        if let Some(what) = what {
            sh.differs(Side::Src, &rel, &what);
        }
    }

    /// `sluice verify` of a big file: its chunks are compared on up to
    /// `jobs` streams at once.
    pub(crate) fn check_big(&mut self, node: &Arc<DirNode>, name: &CStr, st: &Stat, chunks: u64) {
        let Some(dst_st) = self.check_counterpart(node, name, st) else {
            return;
        };
        let sh = self.shared.clone();
        let (src, dst) = match open_pair(node, name) {
            Ok(fds) => fds,
            Err(err) => return sh.fail(err),
        };
        if sh.opts.direct && st.size >= DIRECT_MIN && !st.is_sparse() {
            // Both or neither: a failed switch just means cached reads.
            if let Some(fd) = src.fd() {
                if sluice_sys::set_direct(fd, true).is_ok()
                    && sluice_sys::set_direct(dst.as_fd(), true).is_err()
                {
                    let _ = sluice_sys::set_direct(fd, false);
                }
            }
        }
        // Held until it is finished; named by key on the queue.
        node.hold();
        let key = sh.ledger.checks.key();
        let big = Arc::new(CheckBig {
            key,
            node: node.clone(),
            name: name.to_owned(),
            src,
            dst,
            st: *st,
            dst_st,
            chunks,
            next: AtomicU64::new(0),
            done: AtomicU64::new(0),
            differs: AtomicBool::new(false),
            failed: Mutex::new(None),
        });
        sh.ledger.checks.insert(key, big);
        for _ in 0..chunks.min(sh.budget.jobs as u64) {
            self.queue_task(Task::Check { big: key });
        }
    }

    /// Claims and compares chunks of `big`, yielding to other work between
    /// chunks like a copy does.
    pub(crate) fn run_check_chunks(&mut self, big: Arc<CheckBig>) {
        loop {
            let i = big.next.fetch_add(1, Relaxed);
            if i >= big.chunks {
                return;
            }
            let pending = !self.shared.stopped()
                && !big.differs.load(Relaxed)
                && big.failed.lock().expect("chunk lock").is_none();
            if pending {
                let (off, len) = plan::chunk_range(big.st.size, self.shared.opts.chunk_size, i);
                match self.same_range(&big.src, big.dst.as_fd(), off, len) {
                    Ok(true) => {
                        self.shared.stats.bytes_copied.fetch_add(len, Relaxed);
                        self.shared.stats.chunk_bytes.fetch_add(len, Relaxed);
                    }
                    Ok(false) => big.differs.store(true, Relaxed),
                    Err((side, e)) => {
                        let err = big.node.error(&big.name, side, "read", Reason::Os(e));
                        big.failed.lock().expect("chunk lock").get_or_insert(err);
                    }
                }
            }
            if big.done.fetch_add(1, Relaxed) + 1 == big.chunks {
                return self.finish_check(&big);
            }
            if self
                .shared
                .queue
                .push(Lane::Chunk, Task::Check { big: big.key })
                .is_ok()
            {
                return;
            }
        }
    }

    /// Called once, by the stream that compared the last chunk: the file
    /// leaves the table and releases its directory.
    fn finish_check(&mut self, big: &CheckBig) {
        self.shared.ledger.checks.remove(big.key);
        if !self.shared.stopped() {
            self.settle_check(big);
            big.node.release();
        }
    }

    fn settle_check(&mut self, big: &CheckBig) {
        let sh = self.shared.clone();
        if let Some(err) = big.failed.lock().expect("chunk lock").take() {
            return sh.fail(err);
        }
        let rel = big.node.child_rel(&big.name);
        if big.differs.load(Relaxed) {
            return sh.differs(Side::Src, &rel, "content differs");
        }
        sh.stats.files_copied.fetch_add(1, Relaxed);
        if sh.opts.check.is_some_and(|c| c.metadata) {
            let fds = Some((Open::File(&big.src), big.dst.as_fd()));
            if let Some(what) = self.meta_difference(&big.st, &big.dst_st, fds) {
                sh.differs(Side::Src, &rel, &what);
            }
        }
    }
}

//! Moving one entry: the life of a file from temporary to final name.
//!
//! Every entry is created under a temporary name in its target directory
//! (`O_EXCL`, so nothing planted there is opened or followed), filled,
//! given its metadata, and renamed over the final name only when complete.
//! A failure at any step removes the temporary ([`TempGuard`]), so a reader
//! or a crash never sees a torn file under a real name; a kill -9 leaves at
//! most `.sluice-*.tmp` files that a later run removes.

use crate::error::{EntryError, Reason, Side};
use crate::gauge::Activity;
use crate::ledger::Claim;
use crate::meta::{link_key, LinkKey, ACL_ACCESS, ACL_DEFAULT};
use crate::options::Reflink;
use crate::parts::PartFile;
use crate::plan;
use crate::queue::Lane;
use crate::shard::Shard;
use crate::source::{Open, SrcFile};
use crate::state::Shared;
use crate::state::{BigFile, DirNode, Task, TempName, Worker};
use sluice_sys::{CopyMethod, Errno, FileType, Stat};
use std::ffi::CStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};

impl TempName {
    /// A fresh temporary's name for DST directory `node`.
    fn new(shared: &Shared, node: &DirNode) -> TempName {
        let mut bytes = [0u8; 64];
        shared.temp_name(node.dst_id, &mut bytes);
        TempName { bytes }
    }

    /// A temporary's name read back from the journal; `None` unless it has
    /// the shape of one.
    fn from_bytes(name: &[u8]) -> Option<TempName> {
        if !sluice_sys::is_temp_name(name) || name.len() >= 64 {
            return None;
        }
        let mut bytes = [0u8; 64];
        bytes[..name.len()].copy_from_slice(name);
        Some(TempName { bytes })
    }
}

/// An exclusive `flock` on an open file, released when dropped.
struct FileLock<'a>(BorrowedFd<'a>);

impl<'a> FileLock<'a> {
    fn take(fd: BorrowedFd<'a>) -> Result<FileLock<'a>, Errno> {
        sluice_sys::lock(fd)?;
        Ok(FileLock(fd))
    }
}

impl Drop for FileLock<'_> {
    fn drop(&mut self) {
        let _ = sluice_sys::unlock(self.0);
    }
}

/// A big file opened for copying, before it is tracked.
struct OpenedBig {
    tmp: Option<TempName>,
    dst: OwnedFd,
    record: Option<crate::journal::Record>,
    cloned: bool,
    delta: bool,
    old: Option<OwnedFd>,
    direct: bool,
    todo: Vec<u64>,
    part: Option<(PartFile, u64)>,
}

/// A regular file being written that has no final name yet: unnamed
/// (`O_TMPFILE`) where DST supports it, else under a temporary name; or,
/// in a new directory still filled under a temporary name of its own
/// (`DirNode::hidden`), under its final name there, removed again unless
/// committed.
struct Pending<'a, 'n> {
    fd: OwnedFd,
    temp: Option<TempGuard<'a>>,
    placed: Option<(BorrowedFd<'a>, &'n CStr)>,
}

impl Drop for Pending<'_, '_> {
    fn drop(&mut self) {
        if let Some((dir, name)) = self.placed {
            let _ = sluice_sys::unlink_at(dir, name);
        }
    }
}

impl Pending<'_, '_> {
    /// Gives the complete file its final name, replacing what had it.
    fn commit(mut self, shared: &Shared, node: &DirNode, name: &CStr) -> Result<(), Errno> {
        let dir = node.dst();
        if self.placed.take().is_some() {
            return Ok(()); // it has its name; the directory's comes later
        }
        if let Some(guard) = self.temp.take() {
            return guard.commit(name);
        }
        match sluice_sys::link_unnamed(self.fd.as_fd(), dir, name) {
            // The name is taken (an older copy): link under a temporary name
            // and rename over it, which replaces atomically.
            Err(Errno::EXIST) => {
                let tmp = TempName::new(shared, node);
                sluice_sys::link_unnamed(self.fd.as_fd(), dir, tmp.as_cstr())?;
                TempGuard::new(dir, tmp).commit(name)
            }
            other => other,
        }
    }
}

/// Removes a temporary on drop unless it was committed.
struct TempGuard<'a> {
    dir: BorrowedFd<'a>,
    name: TempName,
    armed: bool,
}

impl<'a> TempGuard<'a> {
    fn new(dir: BorrowedFd<'a>, name: TempName) -> Self {
        TempGuard {
            dir,
            name,
            armed: true,
        }
    }

    /// Renames the temporary over `final_name`; on success it is no longer ours.
    fn commit(mut self, final_name: &CStr) -> Result<(), Errno> {
        sluice_sys::rename_at(self.dir, self.name.as_cstr(), self.dir, final_name)?;
        self.armed = false;
        Ok(())
    }
}

impl Drop for TempGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            let _ = sluice_sys::unlink_at(self.dir, self.name.as_cstr());
        }
    }
}

/// Which tree an errno from a copy between two files most likely concerns.
fn copy_side(e: Errno) -> Side {
    match e {
        Errno::NOSPC | Errno::DQUOT | Errno::ROFS | Errno::FBIG => Side::Dst,
        _ => Side::Src,
    }
}

/// Whether `copy_file_range` said "not between these two files", as
/// opposed to a real I/O failure.
fn kernel_copy_refused(e: Errno) -> bool {
    matches!(
        e,
        Errno::XDEV | Errno::NOSYS | Errno::OPNOTSUPP | Errno::INVAL
    )
}

/// Whether a clone failed because the file systems cannot clone.
fn clone_refused(e: Errno) -> bool {
    matches!(
        e,
        Errno::XDEV | Errno::OPNOTSUPP | Errno::INVAL | Errno::NOTTY | Errno::NOSYS
    )
}

/// Files from this size up are copied with `O_DIRECT` by default.
const DIRECT_MIN: u64 = 1 << 20;

/// The most one `copy_file_range` call is asked to copy.
const KERNEL_STEP: u64 = 8 << 20;

impl BigFile {
    fn chunks(&self) -> u64 {
        self.todo.len() as u64
    }
}

impl Drop for BigFile {
    fn drop(&mut self) {
        let Some(tmp) = self.tmp.filter(|_| !self.committed.load(Relaxed)) else {
            return; // committed, or patched in place: never removed
        };
        let journal = self.node.shared.journal.as_ref();
        // Stopped (interrupt, full disk): the temporary and its record stay
        // so the next run copies only the chunks that had not landed.
        if self.journaled && self.node.shared.stopped() && journal.is_some_and(|j| j.working()) {
            // What landed is kept, and counts: the rerun does not copy it.
            let stats = &self.node.shared.stats;
            stats
                .bytes_copied
                .fetch_add(self.copied.load(Relaxed), Relaxed);
            return;
        }
        // A temporary shared with other parts stays in any case: they may
        // still be writing into it.
        if self.part.is_none() {
            let _ = sluice_sys::unlink_at(self.node.dst(), tmp.as_cstr());
        }
        if let (true, Some(j)) = (self.journaled, journal) {
            j.forget(&self.rel);
        }
    }
}

/// Where a later name of a hard-linked file links from.
enum LinkFrom<'a> {
    /// A name in a DST directory this stream holds open.
    Held(BorrowedFd<'a>, &'a CStr),
    /// A path below DST's root (a directory finished earlier), and the
    /// inode this run committed there.
    Beneath(BorrowedFd<'a>, &'a [u8], u64),
}

impl Worker {
    /// Copies one non-directory entry; failures are reported, not returned.
    pub(crate) fn copy_entry(
        &mut self,
        node: &Arc<DirNode>,
        src_name: &CStr,
        dst_name: &CStr,
        st: &Stat,
    ) {
        if self.shared.checking() {
            return self.check_entry(node, src_name, st);
        }
        if node.existed && self.up_to_date(node, src_name, dst_name, st) {
            return;
        }
        if !node.existed && self.shared.opts.verbose {
            self.why.clear();
            self.why.push("new");
        }
        let stats = &self.shared.stats;
        let res = match st.file_type() {
            FileType::RegularFile if self.shared.opts.dry_run => {
                stats.files_copied.fetch_add(1, Relaxed);
                stats.bytes_copied.fetch_add(st.size, Relaxed);
                Ok(())
            }
            FileType::Symlink if self.shared.opts.dry_run => {
                stats.symlinks.fetch_add(1, Relaxed);
                Ok(())
            }
            _ if self.shared.opts.dry_run => {
                stats.specials.fetch_add(1, Relaxed);
                Ok(())
            }
            FileType::RegularFile => {
                let key = link_key(st);
                if let Some(key) = key {
                    if !self.claim_link(key, node, dst_name) {
                        return;
                    }
                }
                let res = self.copy_whole_retrying(node, src_name, dst_name, st);
                if let Some(key) = key {
                    self.finish_link(key, node, dst_name, res.is_ok());
                }
                res
            }
            FileType::Symlink => self.copy_symlink(node, src_name, dst_name, st),
            _ => self.copy_special(node, dst_name, st),
        };
        match res {
            Ok(()) => self.report_changed(node, dst_name),
            Err(err) => self.shared.fail(err),
        }
    }

    /// `-v`: says that `dst_name` was copied (or updated), and why.
    fn report_changed(&self, node: &DirNode, dst_name: &CStr) {
        if self.shared.opts.verbose {
            let action = if self.why == ["new"] {
                "copy"
            } else {
                "update"
            };
            self.shared
                .changed(|| node.child_rel(dst_name), action, &self.why);
        }
    }

    /// Copies a regular file, again (up to `--retries` times, with the
    /// source's new metadata) when it changed while being copied.
    fn copy_whole_retrying(
        &mut self,
        node: &DirNode,
        src_name: &CStr,
        dst_name: &CStr,
        st: &Stat,
    ) -> Result<(), EntryError> {
        let mut st = *st;
        let mut attempt = 0;
        loop {
            let res = self.copy_whole(node, src_name, dst_name, &st);
            match res {
                Err(EntryError {
                    reason: Reason::Changed(_),
                    ..
                }) if attempt < self.shared.opts.retries => {
                    match self.shared.source.stat(&node.src, src_name) {
                        Ok(now) if now.file_type() == FileType::RegularFile => st = now,
                        _ => return res,
                    }
                    attempt += 1;
                    self.shared.stats.retries.fetch_add(1, Relaxed);
                }
                other => return other,
            }
        }
    }

    /// Copies a regular file on this stream alone.
    fn copy_whole(
        &mut self,
        node: &DirNode,
        src_name: &CStr,
        dst_name: &CStr,
        st: &Stat,
    ) -> Result<(), EntryError> {
        let src = (self.shared.source.open(&node.src, src_name))
            .map_err(|e| node.error(src_name, Side::Src, "open", Reason::Os(e)))?;
        self.doing(Activity::Write);
        let pending = self.create_pending(node, dst_name, st)?;
        let dst = pending.fd.as_fd();
        let mut size = st.size;
        if node.src_kind == sluice_sys::FsKind::Synthetic {
            // /proc says 0 bytes, /sys 4096: what a read returns is the file.
            self.doing(Activity::Copy);
            size = self
                .copy_to_end(&src, dst)
                .map_err(|(op, e)| node.error(dst_name, copy_side(e), op, Reason::Os(e)))?;
        } else if st.size > 0 {
            let copied = self
                .copy_data(&src, dst, st)
                .map_err(|(op, e)| node.error(dst_name, copy_side(e), op, Reason::Os(e)))?;
            // Size and mtime of the open file after the copy (one statx on
            // a hot inode, well under 1% of a small file's copy); a file
            // big enough to take a while is also looked up by name again,
            // to catch one replaced meanwhile.
            check_unchanged(node, src_name, &src, st, st.size >= DIRECT_MIN)?;
            if copied != st.size && !st.is_sparse() {
                return Err(node.error(
                    src_name,
                    Side::Src,
                    "read",
                    Reason::Changed(format!("expected {} bytes, read {copied}", st.size)),
                ));
            }
            if self.shared.opts.verify {
                self.read_back(node, dst_name, &src, dst, 0, st.size)?;
            }
            // A sparse file's size was set before its data: after a power
            // loss it could come back full-sized with SRC's mtime and
            // zeros, which the quick check would take as up to date. Its
            // data is made durable before its times say it is complete.
            // (A dense file's size grows with its data, so a crash leaves
            // it short, which the quick check sees.)
            if st.is_sparse() && !self.shared.opts.fsync {
                sluice_sys::sync_data(dst)
                    .map_err(|e| node.error(dst_name, Side::Dst, "write back", Reason::Os(e)))?;
            }
        }
        self.doing(Activity::Write);
        self.finish_file(node, Open::File(&src), dst, dst_name, st)?;
        pending
            .commit(&self.shared, node, dst_name)
            .map_err(|e| node.error(dst_name, Side::Dst, "rename into place", Reason::Os(e)))?;
        let stats = &self.shared.stats;
        stats.files_copied.fetch_add(1, Relaxed);
        stats.bytes_copied.fetch_add(size, Relaxed);
        Ok(())
    }

    /// Copies a file whose size cannot be trusted by reading it to its end
    /// through the stream's buffer, in reads of 64 KiB (`/proc` answers a
    /// larger one with ENOMEM). Returns the bytes copied.
    fn copy_to_end(
        &mut self,
        src: &SrcFile,
        dst: BorrowedFd<'_>,
    ) -> Result<u64, (&'static str, Errno)> {
        let Some(src) = src.fd() else {
            return self.copy_far(src, dst, 0, u64::MAX, false, false);
        };
        let buf = self.scratch.buf();
        let most = buf.len().min(64 << 10);
        let n = sluice_sys::copy_range(
            src,
            dst,
            0,
            u64::MAX,
            CopyMethod::Buffered,
            &mut buf[..most],
        )
        .map_err(|e| ("copy", e))?;
        self.shared.stats.data_moved.fetch_add(n, Relaxed);
        Ok(n)
    }

    /// Creates the file that will become `dst_name` once complete. In a
    /// new directory not yet in place it is created under `dst_name`
    /// itself (a sparse file excepted: its size is set before its data,
    /// so one cut short by a crash would look complete to `--size-only`).
    fn create_pending<'a, 'n>(
        &self,
        node: &'a DirNode,
        dst_name: &'n CStr,
        st: &Stat,
    ) -> Result<Pending<'a, 'n>, EntryError> {
        let perm = self.shared.create_mode(st);
        let err = |e| node.error(dst_name, Side::Dst, "create temporary for", Reason::Os(e));
        if node.hidden.is_some() && !node.existed && !st.is_sparse() {
            let fd = sluice_sys::create_excl_at(node.dst(), dst_name, perm).map_err(err)?;
            return Ok(Pending {
                fd,
                temp: None,
                placed: Some((node.dst(), dst_name)),
            });
        }
        if self.shared.unnamed_ok.load(Relaxed) {
            match sluice_sys::create_unnamed(node.dst(), perm) {
                Ok(fd) => {
                    return Ok(Pending {
                        fd,
                        temp: None,
                        placed: None,
                    })
                }
                Err(Errno::OPNOTSUPP) | Err(Errno::ISDIR) | Err(Errno::INVAL) => {
                    self.shared.unnamed_ok.store(false, Relaxed)
                }
                Err(e) => return Err(err(e)),
            }
        }
        let tmp = TempName::new(&self.shared, node);
        let fd = sluice_sys::create_excl_at(node.dst(), tmp.as_cstr(), perm).map_err(err)?;
        Ok(Pending {
            fd,
            temp: Some(TempGuard::new(node.dst(), tmp)),
            placed: None,
        })
    }

    /// Applies metadata to a complete file and, with `--fsync`, makes it
    /// durable; the caller renames it into place afterwards.
    fn finish_file(
        &mut self,
        node: &DirNode,
        src: Open<'_>,
        dst: BorrowedFd<'_>,
        dst_name: &CStr,
        st: &Stat,
    ) -> Result<(), EntryError> {
        self.copy_owner_and_xattrs(node, dst_name, src, dst, st)?;
        let err = |op, e| node.error(dst_name, Side::Dst, op, Reason::Os(e));
        // chown cleared any set-id bits; put them back now that the owner is right.
        if self.shared.opts.preserve_owner && self.shared.opts.perms && st.perm() & 0o6000 != 0 {
            sluice_sys::set_perm(dst, st.perm()).map_err(|e| err("chmod", e))?;
        }
        sluice_sys::set_times(dst, st).map_err(|e| err("set times", e))?;
        if self.shared.opts.fsync {
            sluice_sys::sync(dst).map_err(|e| err("fsync", e))?;
        }
        Ok(())
    }

    /// Copies a whole file's data (clone, kernel copy or read/write, holes
    /// kept). Returns the bytes found in the source.
    fn copy_data(
        &mut self,
        src: &SrcFile,
        dst: BorrowedFd<'_>,
        st: &Stat,
    ) -> Result<u64, (&'static str, Errno)> {
        self.doing(Activity::Copy);
        let Some(src_fd) = src.fd() else {
            if st.is_sparse() {
                sluice_sys::set_len(dst, st.size).map_err(|e| ("truncate", e))?;
            }
            return self.copy_far(src, dst, 0, st.size, st.is_sparse(), false);
        };
        let src = src_fd;
        if self.try_reflink(src, dst)? {
            return Ok(st.size);
        }
        if st.is_sparse() {
            sluice_sys::set_len(dst, st.size).map_err(|e| ("truncate", e))?;
            return self.copy_extents(src, dst, 0, st.size);
        }
        if self.use_direct(src, dst, st) {
            let copied = self.copy_direct(src, dst, 0, st.size)?;
            // Direct writes end on a block boundary; cut the overshoot.
            sluice_sys::set_len(dst, st.size).map_err(|e| ("truncate", e))?;
            return Ok(copied);
        }
        self.copy_range(src, dst, 0, st.size)
    }

    /// Switches both files to `O_DIRECT` when it pays: large, dense files,
    /// unless `--no-direct`. Measured on an 8 GiB copy here: 1.2 GiB/s
    /// direct against 450 MiB/s through the page cache (before writeback),
    /// because the page cache costs a core per ~500 MiB/s on this machine.
    fn use_direct(&self, src: BorrowedFd<'_>, dst: BorrowedFd<'_>, st: &Stat) -> bool {
        if !self.shared.opts.direct || st.is_sparse() || st.size < DIRECT_MIN {
            return false;
        }
        if sluice_sys::set_direct(src, true).is_err() {
            return false;
        }
        if sluice_sys::set_direct(dst, true).is_err() {
            let _ = sluice_sys::set_direct(src, false);
            return false;
        }
        true
    }

    /// Tries to clone `src` into `dst`; `Ok(false)` means copy instead.
    fn try_reflink(
        &self,
        src: BorrowedFd<'_>,
        dst: BorrowedFd<'_>,
    ) -> Result<bool, (&'static str, Errno)> {
        let sh = &self.shared;
        if !sh.clone_ok.load(Relaxed) {
            return Ok(false);
        }
        match sluice_sys::clone_file(src, dst) {
            Ok(()) => Ok(true),
            Err(e) if sh.opts.reflink == Reflink::Always => Err(("clone", e)),
            Err(e) if clone_refused(e) => {
                sh.clone_ok.store(false, Relaxed);
                Ok(false)
            }
            Err(e) => Err(("clone", e)),
        }
    }

    /// Copies the data extents of `[off, off + len)`, skipping holes; the
    /// destination must already have its final size.
    fn copy_extents(
        &mut self,
        src: BorrowedFd<'_>,
        dst: BorrowedFd<'_>,
        off: u64,
        len: u64,
    ) -> Result<u64, (&'static str, Errno)> {
        let end = off + len;
        let mut pos = off;
        while pos < end {
            let Some(data) = sluice_sys::next_data(src, pos).map_err(|e| ("seek data", e))? else {
                break;
            };
            if data >= end {
                break;
            }
            let hole = sluice_sys::next_hole(src, data)
                .map_err(|e| ("seek hole", e))?
                .min(end);
            self.copy_range(src, dst, data, hole - data)?;
            pos = hole;
        }
        // Holes count as copied: the caller checks a sparse source for
        // changes with a stat, since a shrunk file just ends in a hole here.
        Ok(len)
    }

    /// Copies `[off, off + len)` with the best method this job has left,
    /// in `--bwlimit`-sized pieces when the job is throttled.
    fn copy_range(
        &mut self,
        src: BorrowedFd<'_>,
        dst: BorrowedFd<'_>,
        off: u64,
        len: u64,
    ) -> Result<u64, (&'static str, Errno)> {
        let shared = self.shared.clone();
        let Some(throttle) = &shared.throttle else {
            return self.copy_piece(src, dst, off, len);
        };
        let mut done = 0;
        while done < len {
            let want = throttle.piece().min(len - done);
            if !throttle.take(want) {
                return Err(("copy", Errno::INTR)); // stopped
            }
            let n = self.copy_piece(src, dst, off + done, want)?;
            done += n;
            if n < want {
                break;
            }
        }
        Ok(done)
    }

    /// Copies `[off, off + len)` (to the source's end with `u64::MAX`) of a
    /// file that has no local descriptor (a source across a wire): read
    /// through the stream's buffer, written at the same offsets, throttled
    /// like any copy. With `sparse`, DST already has its final size and
    /// all-zero pieces are left as holes. With `direct`, `dst` is
    /// `O_DIRECT` and a short last piece is written rounded up to the
    /// block (the caller cuts the file to size). Returns the bytes read.
    fn copy_far(
        &mut self,
        src: &SrcFile,
        dst: BorrowedFd<'_>,
        off: u64,
        len: u64,
        sparse: bool,
        direct: bool,
    ) -> Result<u64, (&'static str, Errno)> {
        let (shared, id) = (self.shared.clone(), self.id());
        let buf = self.scratch.buf();
        let piece = match &shared.throttle {
            Some(t) => (t.piece() as usize).min(buf.len()),
            None => buf.len(),
        };
        let mut done = 0u64;
        while done < len {
            let want = (len - done).min(piece as u64) as usize;
            if shared
                .throttle
                .as_ref()
                .is_some_and(|t| !t.take(want as u64))
            {
                return Err(("copy", Errno::INTR)); // stopped
            }
            // Waiting on the far end counts as reading: the summary then
            // says whether the wire or DST's disk bounded the job.
            shared.gauge.set(id, Activity::Read);
            let n = (shared.source.read_at(src, &mut buf[..want], off + done))
                .map_err(|e| ("read", e))?;
            let whole = if direct {
                n.next_multiple_of(sluice_sys::DIRECT_ALIGN).min(buf.len())
            } else {
                n
            };
            let data = &buf[..whole];
            shared.gauge.set(id, Activity::Write);
            if !(sparse && data.iter().all(|&b| b == 0)) {
                sluice_sys::write_all_at(dst, data, off + done).map_err(|e| ("write", e))?;
            }
            shared.stats.data_moved.fetch_add(n as u64, Relaxed);
            done += n as u64;
            if n < want {
                break; // the source ended
            }
        }
        Ok(done)
    }

    /// Copies `[off, off + len)` in the kernel if it can, else through the
    /// stream's buffer.
    fn copy_piece(
        &mut self,
        src: BorrowedFd<'_>,
        dst: BorrowedFd<'_>,
        off: u64,
        len: u64,
    ) -> Result<u64, (&'static str, Errno)> {
        let moved = &self.shared.stats.data_moved;
        // In steps, so progress (and the tuner's windows) see a chunk move
        // along rather than arrive whole.
        let mut done = 0;
        while done < len && self.shared.kernel_copy_ok.load(Relaxed) {
            let want = (len - done).min(KERNEL_STEP);
            match sluice_sys::copy_range(src, dst, off + done, want, CopyMethod::Kernel, &mut []) {
                // Nothing of this step was written: the rest goes buffered.
                Err(e) if kernel_copy_refused(e) => {
                    self.shared.kernel_copy_ok.store(false, Relaxed)
                }
                Err(e) => return Err(("copy", e)),
                Ok(n) => {
                    moved.fetch_add(n, Relaxed);
                    done += n;
                    if n < want {
                        return Ok(done); // the source ended early
                    }
                }
            }
        }
        if done == len {
            return Ok(done);
        }
        let buf = self.scratch.buf();
        let n = sluice_sys::copy_range(src, dst, off + done, len - done, CopyMethod::Buffered, buf)
            .map_err(|e| ("copy", e))?;
        moved.fetch_add(n, Relaxed);
        Ok(done + n)
    }

    fn copy_symlink(
        &mut self,
        node: &DirNode,
        src_name: &CStr,
        dst_name: &CStr,
        st: &Stat,
    ) -> Result<(), EntryError> {
        let reuse = std::mem::take(&mut self.scratch.link);
        let target = (self.shared.source.read_link(&node.src, src_name, reuse))
            .map_err(|e| node.error(src_name, Side::Src, "readlink", Reason::Os(e)))?;
        let placed = self.place_at(node, dst_name, st, "symlink", |dir, tmp| {
            sluice_sys::symlink_at(&target, dir, tmp)
        });
        self.scratch.link = target.into_bytes();
        placed?;
        self.shared.stats.symlinks.fetch_add(1, Relaxed);
        Ok(())
    }

    fn copy_special(
        &mut self,
        node: &DirNode,
        dst_name: &CStr,
        st: &Stat,
    ) -> Result<(), EntryError> {
        self.place_at(node, dst_name, st, "mknod", |dir, tmp| {
            sluice_sys::mknod_at(dir, tmp, st)
        })?;
        self.shared.stats.specials.fetch_add(1, Relaxed);
        Ok(())
    }

    /// Creates an entry that cannot be opened (symlink, FIFO, device) under
    /// a temporary name with `make`, gives it owner and times, and renames
    /// it over `dst_name`. On failure the temporary is removed.
    fn place_at(
        &self,
        node: &DirNode,
        dst_name: &CStr,
        st: &Stat,
        op: &'static str,
        make: impl FnOnce(BorrowedFd<'_>, &CStr) -> Result<(), Errno>,
    ) -> Result<(), EntryError> {
        self.doing(Activity::Write);
        let tmp = TempName::new(&self.shared, node);
        make(node.dst(), tmp.as_cstr())
            .map_err(|e| node.error(dst_name, Side::Dst, op, Reason::Os(e)))?;
        let guard = TempGuard::new(node.dst(), tmp);
        self.finish_at(node, tmp, dst_name, st)?;
        guard
            .commit(dst_name)
            .map_err(|e| node.error(dst_name, Side::Dst, "rename into place", Reason::Os(e)))
    }

    /// Owner and times of an entry that cannot be opened (symlink, FIFO, device).
    fn finish_at(
        &self,
        node: &DirNode,
        tmp: TempName,
        dst_name: &CStr,
        st: &Stat,
    ) -> Result<(), EntryError> {
        let err = |op, e| node.error(dst_name, Side::Dst, op, Reason::Os(e));
        if self.shared.opts.preserve_owner && !node.creates_owned_by(st) {
            sluice_sys::set_owner_at(node.dst(), tmp.as_cstr(), st).map_err(|e| err("chown", e))?;
        }
        if self.drops_inherited_acls(node) && st.file_type() != FileType::Symlink {
            // A FIFO or device node inherits ACLs too (SRC's own are not
            // copied for these: they cannot be opened to read them).
            for acl in [ACL_ACCESS, ACL_DEFAULT] {
                sluice_sys::remove_xattr_at(node.dst(), tmp.as_cstr(), acl)
                    .map_err(|e| err("remove inherited ACL", e))?;
            }
            let perm = self.shared.mode_for(st);
            sluice_sys::set_perm_at(node.dst(), tmp.as_cstr(), perm)
                .map_err(|e| err("chmod", e))?;
        }
        sluice_sys::set_times_at(node.dst(), tmp.as_cstr(), st).map_err(|e| err("set times", e))
    }

    /// Whether this name of a hard-linked inode copies its data. If not,
    /// it was linked (its group was copied), queued to be linked (its
    /// group is being copied) or failed (its group failed).
    fn claim_link(&mut self, key: LinkKey, node: &Arc<DirNode>, dst_name: &CStr) -> bool {
        let res = match self.shared.ledger.claim_link(key, node, dst_name) {
            Claim::First => return true,
            Claim::Waits => return false,
            Claim::LinkTo(rel, ino) => {
                let shared = self.shared.clone();
                let root = shared.dst_root_fd.as_ref().expect("not a dry run");
                let from = LinkFrom::Beneath(root.as_fd(), &rel, ino);
                self.place_link(from, node, dst_name)
            }
            Claim::Failed => Err(node.error(
                dst_name,
                Side::Dst,
                "link",
                Reason::Other("the file it is a hard link of failed to copy".into()),
            )),
        };
        if let Err(err) = res {
            self.shared.fail(err);
        }
        false
    }

    /// Records the outcome of a hard-linked inode's first copy and links the
    /// names that waited for it (releasing their directories).
    fn finish_link(&mut self, key: LinkKey, first: &DirNode, name: &CStr, ok: bool) {
        let copied = ok.then(|| {
            // The inode lets a later run tell a correct link from a copy.
            let ino = sluice_sys::stat_at(first.dst(), name).map_or(0, |st| st.ino);
            (first.child_rel(name), ino)
        });
        for (node, to) in self.shared.ledger.settle_link(key, copied) {
            let res = if ok {
                self.place_link(LinkFrom::Held(first.dst(), name), &node, &to)
            } else {
                Err(node.error(
                    &to,
                    Side::Dst,
                    "link",
                    Reason::Other("the file it is a hard link of failed to copy".into()),
                ))
            };
            if let Err(err) = res {
                self.shared.fail(err);
            }
            node.release();
        }
    }

    /// Makes `to_name` in `to` a hard link of `from`, replacing whatever
    /// had that name, atomically.
    fn place_link(
        &mut self,
        from: LinkFrom<'_>,
        to: &DirNode,
        to_name: &CStr,
    ) -> Result<(), EntryError> {
        let tmp = TempName::new(&self.shared, to);
        let linked = match from {
            LinkFrom::Held(dir, name) => {
                sluice_sys::link_at(dir, name, to.dst(), tmp.as_cstr()).map_err(Reason::Os)
            }
            LinkFrom::Beneath(root, rel, ino) => {
                crate::target::link_beneath(root, rel, ino, to.dst(), tmp.as_cstr()).map_err(|f| {
                    match f {
                        crate::target::LinkFailure::Os(e) => Reason::Os(e),
                        crate::target::LinkFailure::Replaced => Reason::Other(format!(
                            "{} is no longer the file this run copied there",
                            crate::error::escape(rel)
                        )),
                    }
                })
            }
        };
        linked.map_err(|r| to.error(to_name, Side::Dst, "link", r))?;
        TempGuard::new(to.dst(), tmp)
            .commit(to_name)
            .map_err(|e| to.error(to_name, Side::Dst, "rename into place", Reason::Os(e)))?;
        self.shared.stats.hardlinks.fetch_add(1, Relaxed);
        self.shared
            .changed(|| to.child_rel(to_name), "link", &["hard link"]);
        Ok(())
    }

    /// Prepares a big file and queues its chunks on up to `jobs` streams.
    pub(crate) fn start_big(
        &mut self,
        node: &Arc<DirNode>,
        src_name: &CStr,
        dst_name: &CStr,
        st: &Stat,
        chunks: u64,
    ) {
        self.start_big_attempt(node, src_name, dst_name, st, chunks, 0)
    }

    fn start_big_attempt(
        &mut self,
        node: &Arc<DirNode>,
        src_name: &CStr,
        dst_name: &CStr,
        st: &Stat,
        chunks: u64,
        attempt: u32,
    ) {
        if self.shared.checking() {
            return self.check_big(node, src_name, st, chunks);
        }
        if self.shared.opts.dry_run {
            return self.copy_entry(node, src_name, dst_name, st);
        }
        if attempt == 0 && node.existed && self.up_to_date(node, src_name, dst_name, st) {
            return;
        }
        let key = link_key(st);
        if let Some(key) = key.filter(|_| attempt == 0) {
            if !self.claim_link(key, node, dst_name) {
                return;
            }
        }
        match self.open_big(node, src_name, dst_name, st, chunks, attempt) {
            Ok(big) if big.chunks() == 0 => self.finish_big(&big),
            Ok(big) => {
                let streams = big.chunks().min(self.shared.budget.jobs as u64);
                for _ in 0..streams {
                    self.queue_task(Task::Chunk { big: big.key });
                }
            }
            Err(err) => {
                if let Some(key) = key {
                    self.finish_link(key, node, dst_name, false);
                }
                self.shared.fail(err);
            }
        }
    }

    /// Opens the source and the temporary of a big file: the one an earlier
    /// run recorded in the journal when it still matches the source (only
    /// its missing chunks are left to copy), else a new one.
    fn open_big(
        &mut self,
        node: &Arc<DirNode>,
        src_name: &CStr,
        dst_name: &CStr,
        st: &Stat,
        chunks: u64,
        attempt: u32,
    ) -> Result<Arc<BigFile>, EntryError> {
        let src = (self.shared.source.open(&node.src, src_name))
            .map_err(|e| node.error(src_name, Side::Src, "open", Reason::Os(e)))?;
        let rel = node.child_rel(dst_name);
        let chunk_size = self.shared.opts.chunk_size;
        let journal = self.shared.journal.as_ref();
        let err = |op, e| node.error(dst_name, Side::Dst, op, Reason::Os(e));
        // A big file split between the parts of a job (`--shard`) has its
        // own way in: the temporary they share.
        let part = match self.shared.opts.shard {
            Some(shard) if Shard::splits(st) => {
                Some(PartFile::new(shard, &rel, st, chunk_size, node.dst_id.2))
            }
            _ => None,
        };
        if let Some(part) = part {
            let opened = part
                .open(node.dst(), self.shared.create_mode(st))
                .map_err(|(op, e)| err(op, e))?;
            let tmp = TempName::from_bytes(part.temp().to_bytes()).expect("a temporary's name");
            // Another part may be writing into it: set to size, never cut
            // short, and space reserved only by the part that made it.
            if opened.size != st.size {
                sluice_sys::set_len(opened.fd.as_fd(), st.size).map_err(|e| err("truncate", e))?;
            }
            if opened.created && !st.is_sparse() {
                sluice_sys::preallocate(opened.fd.as_fd(), st.size)
                    .map_err(|e| err("allocate", e))?;
            }
            // What this part's journal says landed counts only in the very
            // temporary it was written to.
            let tmp_bytes = tmp.as_cstr().to_bytes();
            let rec = journal
                .and_then(|j| j.take(&rel))
                .filter(|r| {
                    !opened.created
                        && r.matches(st, chunk_size)
                        && r.temp == tmp_bytes
                        && r.temp_ino == opened.ino
                })
                .unwrap_or_else(|| {
                    let mut r = crate::journal::Record::new(tmp_bytes, st, chunk_size, chunks);
                    r.temp_ino = opened.ino;
                    r
                });
            let todo = if part.marked(node.dst(), opened.ino) {
                Vec::new()
            } else {
                let shard = self.shared.opts.shard.expect("a part");
                let path = Shard::path_hash(b"", &rel);
                let mut mine = shard.chunks(path, chunks);
                mine.retain(|&i| !rec.is_done(i));
                if !opened.created {
                    // What parts of earlier runs split another way left in
                    // this very temporary: a marker says all of a part's
                    // chunks are in, a journal record which of them are.
                    for (earlier, records) in self.shared.earlier_splits() {
                        if part.marked_in(node.dst(), opened.ino, *earlier) {
                            mine.retain(|&i| !earlier.owns_chunk(path, i));
                        } else if let Some(r) = records.get(&rel).filter(|r| {
                            r.matches(st, chunk_size)
                                && r.temp == tmp_bytes
                                && r.temp_ino == opened.ino
                        }) {
                            mine.retain(|&i| !r.is_done(i));
                        }
                    }
                }
                mine
            };
            let parts = Some((part, opened.ino));
            let direct = match src.fd() {
                Some(fd) => self.use_direct(fd, opened.fd.as_fd(), st),
                None => false,
            };
            let opened = OpenedBig {
                tmp: Some(tmp),
                dst: opened.fd,
                record: Some(rec),
                cloned: false,
                delta: false,
                old: None,
                direct,
                todo,
                part: parts,
            };
            return Ok(self.track_big(node, src_name, dst_name, rel, src, st, attempt, opened));
        }
        let resumed = journal
            .and_then(|j| j.take(&rel))
            .and_then(|rec| resume_temp(node, rec, st, chunk_size));
        let in_place = match resumed {
            None if self.shared.opts.inplace && node.existed => {
                self.open_in_place(node, dst_name, st)
            }
            _ => None,
        };
        let (tmp, dst, record, cloned, delta) = match (resumed, in_place) {
            (Some((tmp, fd, rec)), _) => (Some(tmp), fd, Some(rec), false, false),
            (None, Some(fd)) => (None, fd, None, false, true),
            (None, None) => {
                let tmp = TempName::new(&self.shared, node);
                let mode = self.shared.create_mode(st);
                let dst = sluice_sys::create_excl_at(node.dst(), tmp.as_cstr(), mode)
                    .map_err(|e| err("create temporary for", e))?;
                let guard = TempGuard::new(node.dst(), tmp);
                let cloned = match src.fd() {
                    Some(fd) => self
                        .try_reflink(fd, dst.as_fd())
                        .map_err(|(op, e)| err(op, e))?,
                    None => false,
                };
                let delta = !cloned && node.existed && self.clone_old(node, dst_name, dst.as_fd());
                if !cloned {
                    sluice_sys::set_len(dst.as_fd(), st.size).map_err(|e| err("truncate", e))?;
                }
                if !cloned && !delta && !st.is_sparse() {
                    // Reserving the space up front finds a full disk before
                    // any chunk is written and lets the file system lay it
                    // out in one piece.
                    sluice_sys::preallocate(dst.as_fd(), st.size)
                        .map_err(|e| err("allocate", e))?;
                }
                std::mem::forget(guard); // BigFile's Drop owns the temporary from here
                let mut rec =
                    crate::journal::Record::new(tmp.as_cstr().to_bytes(), st, chunk_size, chunks);
                rec.temp_ino = sluice_sys::stat_fd(dst.as_fd()).map_or(0, |t| t.ino);
                (Some(tmp), dst, Some(rec), cloned, delta)
            }
        };
        let todo: Vec<u64> = match &record {
            _ if cloned => Vec::new(),
            Some(rec) => (0..chunks).filter(|&i| !rec.is_done(i)).collect(),
            None => (0..chunks).collect(),
        };
        // Across a wire, an older version is worth reading here rather
        // than fetching again (a clone or --inplace already holds it).
        let old = match (src.fd(), delta, node.existed) {
            (None, false, true) => {
                sluice_sys::open_read_at(node.dst(), dst_name)
                    .ok()
                    .filter(|fd| {
                        sluice_sys::stat_fd(fd.as_fd())
                            .is_ok_and(|s| s.file_type() == FileType::RegularFile && s.size > 0)
                    })
            }
            _ => None,
        };
        let direct = !cloned
            && match src.fd() {
                Some(fd) => self.use_direct(fd, dst.as_fd(), st),
                // Data from across a wire is written with O_DIRECT alone
                // (whole aligned pieces; the file is cut to size at the end).
                None => {
                    !delta
                        && old.is_none()
                        && self.shared.opts.direct
                        && !st.is_sparse()
                        && st.size >= DIRECT_MIN
                        && (self.shared.opts.chunk_size)
                            .is_multiple_of(sluice_sys::DIRECT_ALIGN as u64)
                        && sluice_sys::set_direct(dst.as_fd(), true).is_ok()
                }
            };
        let opened = OpenedBig {
            tmp,
            dst,
            record,
            cloned,
            delta,
            old,
            direct,
            todo,
            part: None,
        };
        Ok(self.track_big(node, src_name, dst_name, rel, src, st, attempt, opened))
    }

    /// Records a big file just opened in the journal and the job's table,
    /// holding its directory until it is finished.
    #[allow(clippy::too_many_arguments)]
    fn track_big(
        &mut self,
        node: &Arc<DirNode>,
        src_name: &CStr,
        dst_name: &CStr,
        rel: Vec<u8>,
        src: SrcFile,
        st: &Stat,
        attempt: u32,
        o: OpenedBig,
    ) -> Arc<BigFile> {
        let journal = self.shared.journal.as_ref();
        // In place needs no record: the source's mtime is set last, so an
        // interrupted file still looks changed and is compared again.
        let journaled = !o.todo.is_empty() && journal.is_some() && o.record.is_some();
        if let (true, Some(j), Some(rec)) = (journaled, journal, o.record) {
            j.begin(&rel, rec);
        }
        // Held until it is finished; named by key on the queue.
        node.hold();
        let key = self.shared.ledger.bigs.key();
        let big = Arc::new(BigFile {
            key,
            node: node.clone(),
            src_name: src_name.to_owned(),
            dst_name: dst_name.to_owned(),
            rel,
            tmp: o.tmp,
            src,
            dst: Arc::new(o.dst),
            direct: o.direct,
            delta: o.delta,
            old: o.old,
            st: *st,
            todo: o.todo,
            next: AtomicU64::new(0),
            done: AtomicU64::new(0),
            failed: Mutex::new(None),
            copied: AtomicU64::new(if o.cloned { st.size } else { 0 }),
            why: if self.shared.opts.verbose {
                if node.existed {
                    self.why.clone()
                } else {
                    vec!["new"]
                }
            } else {
                Vec::new()
            },
            journaled,
            attempt,
            committed: AtomicBool::new(false),
            part: o.part,
        });
        self.shared.ledger.bigs.insert(key, big.clone());
        big
    }

    /// Claims and copies chunks of `big` until they are all claimed or the
    /// queue has room to let another stream take the next one.
    pub(crate) fn run_chunks(&mut self, big: Arc<BigFile>) {
        loop {
            let n = big.next.fetch_add(1, Relaxed);
            if n >= big.chunks() {
                return;
            }
            let i = big.todo[n as usize];
            let healthy =
                !self.shared.stopped() && big.failed.lock().expect("chunk lock").is_none();
            if healthy {
                self.fit_buffer();
                let copied = self.copy_chunk(&big, i).map_err(|(op, e)| {
                    big.node
                        .error(&big.dst_name, copy_side(e), op, Reason::Os(e))
                });
                let checked = copied.and_then(|()| {
                    if !self.shared.opts.verify {
                        return Ok(());
                    }
                    let (off, len) = plan::chunk_range(big.st.size, self.shared.opts.chunk_size, i);
                    self.read_back(
                        &big.node,
                        &big.dst_name,
                        &big.src,
                        big.dst.as_fd(),
                        off,
                        len,
                    )
                });
                match checked {
                    Ok(()) => {
                        if let (true, Some(j)) = (big.journaled, &self.shared.journal) {
                            self.doing(Activity::Journal);
                            j.chunk_done(&big.rel, i, &big.dst);
                        }
                    }
                    Err(err) => {
                        big.failed.lock().expect("chunk lock").get_or_insert(err);
                    }
                }
            }
            if big.done.fetch_add(1, Relaxed) + 1 == big.chunks() {
                return self.finish_big(&big);
            }
            if big.next.load(Relaxed) >= big.chunks() {
                return;
            }
            // Yield to small files and other chunks between chunks; keep
            // going here only when the queue is full.
            if self
                .shared
                .queue
                .push(Lane::Chunk, Task::Chunk { big: big.key })
                .is_ok()
            {
                return;
            }
        }
    }

    fn copy_chunk(&mut self, big: &BigFile, i: u64) -> Result<(), (&'static str, Errno)> {
        let (off, len) = plan::chunk_range(big.st.size, self.shared.opts.chunk_size, i);
        let dst = big.dst.as_fd();
        self.doing(Activity::Copy);
        let copied = match big.src.fd() {
            None if big.delta => self.patch_far(&big.src, None, dst, off, len)?,
            None => match &big.old {
                Some(old) => self.patch_far(&big.src, Some(old.as_fd()), dst, off, len)?,
                None => {
                    let (sparse, direct) = (big.st.is_sparse(), big.direct);
                    self.copy_far(&big.src, dst, off, len, sparse, direct)?
                }
            },
            Some(_) if big.delta => self.patch_range(&big.src, dst, off, len, big.direct)?,
            Some(src) if big.direct => self.copy_direct(src, dst, off, len)?,
            Some(src) if big.st.is_sparse() => self.copy_extents(src, dst, off, len)?,
            Some(src) => self.copy_range(src, dst, off, len)?,
        };
        big.copied.fetch_add(copied, Relaxed);
        self.shared.stats.chunk_bytes.fetch_add(copied, Relaxed);
        Ok(())
    }

    /// Called once, by the stream that finished the last chunk: the file
    /// leaves the table and releases its directory, whatever became of it.
    fn finish_big(&mut self, big: &BigFile) {
        self.shared.ledger.bigs.remove(big.key);
        if self.shared.stopped() {
            return;
        }
        self.settle_big(big);
        big.node.release();
    }

    fn settle_big(&mut self, big: &BigFile) {
        let key = link_key(&big.st);
        let res = self.commit_big(big);
        let ok = res.is_ok();
        if let Err(err) = res {
            if matches!(err.reason, Reason::Changed(_)) && big.attempt < self.shared.opts.retries {
                return self.retry_big(big);
            }
            self.shared.fail(err);
        }
        if let Some(key) = key {
            self.finish_link(key, &big.node, &big.dst_name, ok);
        }
    }

    /// Starts a big file over whose source changed while it was copied:
    /// its temporary and record go now (so they cannot be mistaken for the
    /// new attempt's), and the new attempt copies the source as it is now.
    fn retry_big(&mut self, big: &BigFile) {
        if let Some(tmp) = &big.tmp {
            let _ = sluice_sys::unlink_at(big.node.dst(), tmp.as_cstr());
        }
        if let (true, Some(j)) = (big.journaled, &self.shared.journal) {
            j.forget(&big.rel);
        }
        big.committed.store(true, Relaxed); // settled: Drop leaves it alone
        self.shared.stats.retries.fetch_add(1, Relaxed);
        let st = match self.shared.source.stat(&big.node.src, &big.src_name) {
            Ok(st) if st.file_type() == FileType::RegularFile => st,
            Ok(_) | Err(_) => {
                return self.shared.fail(big.node.error(
                    &big.src_name,
                    Side::Src,
                    "read",
                    Reason::Changed("removed or replaced by a non-file".into()),
                ))
            }
        };
        let chunks = plan::chunk_count(st.size, self.shared.opts.chunk_size);
        self.start_big_attempt(
            &big.node,
            &big.src_name,
            &big.dst_name,
            &st,
            chunks,
            big.attempt + 1,
        );
    }

    fn commit_big(&mut self, big: &BigFile) -> Result<(), EntryError> {
        if let Some(err) = big.failed.lock().expect("chunk lock").take() {
            return Err(err);
        }
        let node = &big.node;
        check_unchanged(node, &big.src_name, &big.src, &big.st, true)?;
        let shared = self.shared.clone();
        let journal = shared.journal.as_ref().filter(|_| big.journaled);
        if journal.is_some_and(|j| j.sync_failed(&big.rel)) {
            return Err(node.error(
                &big.dst_name,
                Side::Dst,
                "write back",
                Reason::Os(Errno::IO),
            ));
        }
        if big.direct {
            sluice_sys::set_len(big.dst.as_fd(), big.st.size)
                .map_err(|e| node.error(&big.dst_name, Side::Dst, "truncate", Reason::Os(e)))?;
        }
        // Its size was set up front (or it is patched in place): unless the
        // journal synced every chunk (and is still working), the data is made durable
        // before the times that make it look complete (see `copy_whole`).
        // A part's chunks are made durable before its marker says so (a
        // part that does not commit never reaches --fsync's sync below).
        let recorded = big.journaled && journal.is_some_and(|j| j.working());
        let synced = recorded || (self.shared.opts.fsync && big.part.is_none());
        if !synced {
            sluice_sys::sync_data(big.dst.as_fd())
                .map_err(|e| node.error(&big.dst_name, Side::Dst, "write back", Reason::Os(e)))?;
        }
        // Shared with other parts: under the temporary's lock, this part
        // says its chunks are in; only the part that finds every other
        // part's marker there goes on to commit (holding the lock).
        let _turn = match &big.part {
            Some((part, ino)) => {
                let fail = |op, e| node.error(&big.dst_name, Side::Dst, op, Reason::Os(e));
                let turn = FileLock::take(big.dst.as_fd()).map_err(|e| fail("lock", e))?;
                if !part
                    .mark(node.dst(), *ino)
                    .map_err(|e| fail("mark its part of", e))?
                {
                    big.committed.store(true, Relaxed); // the temporary is the others' too
                    if let Some(j) = journal {
                        j.forget(&big.rel);
                    }
                    let copied = big.copied.load(Relaxed);
                    self.shared.stats.bytes_copied.fetch_add(copied, Relaxed);
                    return Ok(());
                }
                // Whoever wrote the last chunk, the file ends at its size.
                sluice_sys::set_len(big.dst.as_fd(), big.st.size)
                    .map_err(|e| fail("truncate", e))?;
                Some(turn)
            }
            None => None,
        };
        self.finish_file(
            node,
            Open::File(&big.src),
            big.dst.as_fd(),
            &big.dst_name,
            &big.st,
        )?;
        if let Some(tmp) = &big.tmp {
            sluice_sys::rename_at(node.dst(), tmp.as_cstr(), node.dst(), &big.dst_name).map_err(
                |e| node.error(&big.dst_name, Side::Dst, "rename into place", Reason::Os(e)),
            )?;
            // Durable mode: the rename itself reaches the disk before the
            // record goes, so a crash cannot lose both.
            if self.shared.opts.fsync {
                sluice_sys::sync(node.dst()).map_err(|e| {
                    node.error(&big.dst_name, Side::Dst, "fsync directory", Reason::Os(e))
                })?;
            }
        }
        if let Some((part, ino)) = &big.part {
            part.clear(node.dst(), *ino);
        }
        big.committed.store(true, Relaxed);
        if let Some(j) = journal {
            j.forget(&big.rel);
        }
        let stats = &self.shared.stats;
        stats.files_copied.fetch_add(1, Relaxed);
        stats
            .bytes_copied
            .fetch_add(big.copied.load(Relaxed), Relaxed);
        let action = if big.why == ["new"] { "copy" } else { "update" };
        self.shared.changed(|| big.rel.clone(), action, &big.why);
        Ok(())
    }
}

/// Reopens the temporary an earlier run recorded for a big file, if the
/// record is about this same source and the temporary is still there with
/// the right size. Otherwise the stale temporary is removed.
fn resume_temp(
    node: &DirNode,
    rec: crate::journal::Record,
    st: &Stat,
    chunk_size: u64,
) -> Option<(TempName, OwnedFd, crate::journal::Record)> {
    let tmp = TempName::from_bytes(&rec.temp)?;
    if rec.matches(st, chunk_size) {
        if let Ok(fd) = sluice_sys::open_write_at(node.dst(), tmp.as_cstr()) {
            let ok = sluice_sys::stat_fd(fd.as_fd()).is_ok_and(|t| {
                t.file_type() == FileType::RegularFile
                    && t.size == st.size
                    && t.nlink == 1
                    && (rec.temp_ino == 0 || rec.temp_ino == t.ino)
            });
            if ok {
                return Some((tmp, fd, rec));
            }
        }
    }
    let _ = sluice_sys::unlink_at(node.dst(), tmp.as_cstr());
    None
}

/// Fails when the open source no longer has the size and mtime it was
/// listed with: the copy may be torn and must not be committed.
fn check_unchanged(
    node: &DirNode,
    name: &CStr,
    src: &SrcFile,
    st: &Stat,
    by_name: bool,
) -> Result<(), EntryError> {
    let source = &node.shared.source;
    let changed = |what: String| Err(node.error(name, Side::Src, "read", Reason::Changed(what)));
    let now =
        (source.stat_file(src)).map_err(|e| node.error(name, Side::Src, "stat", Reason::Os(e)))?;
    if now.size != st.size || now.mtime != st.mtime {
        return changed(format!(
            "size {} -> {}, mtime {}.{:09} -> {}.{:09}",
            st.size, now.size, st.mtime.0, st.mtime.1, now.mtime.0, now.mtime.1
        ));
    }
    if by_name {
        match source.stat(&node.src, name) {
            Ok(named) if named.ino == st.ino => {}
            Ok(_) => return changed("replaced by another file".into()),
            Err(Errno::NOENT) => return changed("removed".into()),
            Err(e) => return Err(node.error(name, Side::Src, "stat", Reason::Os(e))),
        }
    }
    Ok(())
}

impl Worker {
    /// Copies `[off, off + len)` between `O_DIRECT` descriptors through the
    /// stream's aligned buffer. Returns the bytes read.
    fn copy_direct(
        &mut self,
        src: BorrowedFd<'_>,
        dst: BorrowedFd<'_>,
        off: u64,
        len: u64,
    ) -> Result<u64, (&'static str, Errno)> {
        let (gauge, id, throttle) = (&self.shared.gauge, self.id(), &self.shared.throttle);
        let buf = self.scratch.buf();
        let most = throttle.as_ref().map_or(buf.len() as u64, |t| t.piece());
        let mut done = 0u64;
        while done < len {
            // O_DIRECT lengths must be aligned too; at the end of the file
            // the read comes back short.
            let want = (len - done).next_multiple_of(sluice_sys::DIRECT_ALIGN as u64);
            let step = want.min(buf.len() as u64).min(most) as usize;
            if throttle.as_ref().is_some_and(|t| !t.take(step as u64)) {
                return Err(("copy", Errno::INTR)); // stopped
            }
            gauge.set(id, Activity::Read);
            let n = sluice_sys::read_full_at(src, &mut buf[..step], off + done)
                .map_err(|e| ("read", e))?;
            let n = n.min((len - done) as usize);
            if n == 0 {
                break;
            }
            // O_DIRECT writes whole blocks; the overshoot past the end of the
            // file is cut off when the file is finished.
            let aligned = n.next_multiple_of(sluice_sys::DIRECT_ALIGN).min(buf.len());
            gauge.set(id, Activity::Write);
            sluice_sys::write_all_at(dst, &buf[..aligned], off + done).map_err(|e| ("write", e))?;
            self.shared.stats.data_moved.fetch_add(n as u64, Relaxed);
            done += n as u64;
        }
        Ok(done)
    }
}

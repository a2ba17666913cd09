//! Block-delta: a big file that changed is rewritten only where it differs.
//!
//! Two ways, both chosen per file when DST already has an older version:
//!
//! * **Clone and patch** (the default, where DST's file system can clone:
//!   xfs, btrfs): the old DST file is cloned (`FICLONE`, instant, shares
//!   extents) into the temporary, each chunk of the source is compared with
//!   the clone and written only where it differs, and the temporary is
//!   renamed over the old file. Nothing half-updated is ever seen under the
//!   final name, and the journal resumes it like any big file.
//! * **In place** (`--inplace`, any file system): the old file itself is
//!   patched. Readers may see it half-updated while it runs, which is why
//!   it is opt-in; it is resumable without a journal, because the source's
//!   mtime is set only at the very end, so an interrupted file still looks
//!   changed to the next run, which compares again and skips what already
//!   matches.
//!
//! Where neither applies (ext4 without `--inplace`) the file is copied
//! whole: a fresh temporary must receive every byte anyway, so comparing
//! first would only add reads.

use crate::gauge::Activity;
use crate::source::SrcFile;
use crate::state::{DirNode, Worker};
use sluice_sys::{Errno, FileType, Stat};
use std::ffi::CStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::Ordering::Relaxed;

impl Worker {
    /// `--inplace`: opens DST's older version of a big file for patching,
    /// sized to the source's length. `None` when there is none to patch (or
    /// it has other hard links, which patching would change too).
    pub(crate) fn open_in_place(
        &self,
        node: &DirNode,
        dst_name: &CStr,
        st: &Stat,
    ) -> Option<OwnedFd> {
        let fd = sluice_sys::open_write_at(node.dst(), dst_name).ok()?;
        let old = sluice_sys::stat_fd(fd.as_fd()).ok()?;
        if old.file_type() != FileType::RegularFile || old.nlink != 1 || old.size == 0 {
            return None;
        }
        sluice_sys::set_len(fd.as_fd(), st.size).ok()?;
        Some(fd)
    }

    /// Clones DST's older version of a file into the fresh temporary `tmp`,
    /// so only differing chunks need writing. False when there is none, or
    /// DST cannot clone (remembered for the rest of the job).
    pub(crate) fn clone_old(&self, node: &DirNode, dst_name: &CStr, tmp: BorrowedFd<'_>) -> bool {
        let sh = &self.shared;
        if !sh.delta_clone_ok.load(Relaxed) {
            return false;
        }
        let Ok(old) = sluice_sys::open_read_at(node.dst(), dst_name) else {
            return false;
        };
        match sluice_sys::stat_fd(old.as_fd()) {
            Ok(st) if st.file_type() == FileType::RegularFile && st.size > 0 => {}
            _ => return false,
        }
        match sluice_sys::clone_file(old.as_fd(), tmp) {
            Ok(()) => true,
            Err(_) => {
                sh.delta_clone_ok.store(false, Relaxed);
                false
            }
        }
    }

    /// Makes `[off, off + len)` of `dst` equal to the source's by reading
    /// both and writing only the blocks that differ (half the stream's
    /// buffer at a time). Returns the bytes written.
    pub(crate) fn patch_range(
        &mut self,
        src: &SrcFile,
        dst: BorrowedFd<'_>,
        off: u64,
        len: u64,
        direct: bool,
    ) -> Result<u64, (&'static str, Errno)> {
        let align = sluice_sys::DIRECT_ALIGN;
        let (gauge, id, throttle) = (&self.shared.gauge, self.id(), &self.shared.throttle);
        let source = &self.shared.source;
        let buf = self.scratch.buf();
        let (a, b) = buf.split_at_mut(buf.len() / 2);
        let (mut done, mut written) = (0u64, 0u64);
        while done < len {
            let want = (len - done).min(a.len() as u64) as usize;
            let step = want.next_multiple_of(align).min(a.len());
            let at = off + done;
            gauge.set(id, Activity::Read);
            let n = (source.read_at(src, &mut a[..step], at)).map_err(|e| ("read", e))?;
            let n = n.min(want);
            if n == 0 {
                break;
            }
            let m = sluice_sys::read_full_at(dst, &mut b[..step], at)
                .map_err(|e| ("read old copy", e))?
                .min(want);
            if m != n || a[..n] != b[..n] {
                // Direct writes are whole blocks; past the end of the file
                // the overshoot is cut when the file is finished.
                let end = if direct {
                    n.next_multiple_of(align).min(a.len())
                } else {
                    n
                };
                if throttle.as_ref().is_some_and(|t| !t.take(n as u64)) {
                    return Err(("write", Errno::INTR)); // stopped
                }
                gauge.set(id, Activity::Write);
                sluice_sys::write_all_at(dst, &a[..end], at).map_err(|e| ("write", e))?;
                written += n as u64;
            }
            done += n as u64;
            if n < want {
                break;
            }
        }
        Ok(written)
    }
}

/// The piece a changed big file from across a wire is compared in: one
/// digest exchange per MiB, and a change costs at most a MiB on the wire.
const FAR_PIECE: usize = 1 << 20;

impl Worker {
    /// Makes `[off, off + len)` of `dst` equal to a far source's, moving
    /// across the wire only the pieces that differ: each piece of `basis`
    /// (DST's older version) is hashed here, the source hashes its own, and
    /// only where the digests differ are the bytes fetched. An equal piece
    /// is copied from `old` locally; with `old` `None`, `dst` itself holds
    /// the older version (a clone, or `--inplace`) and an equal piece stays
    /// as it is. Returns the bytes fetched.
    pub(crate) fn patch_far(
        &mut self,
        src: &SrcFile,
        old: Option<BorrowedFd<'_>>,
        dst: BorrowedFd<'_>,
        off: u64,
        len: u64,
    ) -> Result<u64, (&'static str, Errno)> {
        let kind = crate::hash::HashKind::Xxh3;
        let basis = old.unwrap_or(dst);
        let shared = self.shared.clone();
        let (gauge, id) = (&shared.gauge, self.id());
        let buf = self.scratch.buf();
        let piece = FAR_PIECE.min(buf.len());
        let buf = &mut buf[..piece];
        let (mut done, mut fetched) = (0u64, 0u64);
        while done < len {
            let want = (len - done).min(piece as u64);
            let at = off + done;
            gauge.set(id, Activity::Read);
            let ours = crate::hash::hash_range(basis, at, want, buf, kind)
                .map_err(|e| ("read old copy", e))?;
            let theirs = (shared.source.hash(src, at, want, buf, kind)).map_err(|e| ("read", e))?;
            if ours == theirs {
                if let Some(old) = old {
                    let n = sluice_sys::read_full_at(old, &mut buf[..want as usize], at)
                        .map_err(|e| ("read old copy", e))?;
                    gauge.set(id, Activity::Write);
                    sluice_sys::write_all_at(dst, &buf[..n], at).map_err(|e| ("write", e))?;
                }
                done += theirs.1;
                if theirs.1 < want {
                    break; // the source ends here
                }
                continue;
            }
            if shared.throttle.as_ref().is_some_and(|t| !t.take(want)) {
                return Err(("write", Errno::INTR)); // stopped
            }
            let n = (shared.source.read_at(src, &mut buf[..want as usize], at))
                .map_err(|e| ("read", e))?;
            gauge.set(id, Activity::Write);
            sluice_sys::write_all_at(dst, &buf[..n], at).map_err(|e| ("write", e))?;
            shared.stats.data_moved.fetch_add(n as u64, Relaxed);
            fetched += n as u64;
            done += n as u64;
            if (n as u64) < want {
                break;
            }
        }
        Ok(fetched)
    }
}

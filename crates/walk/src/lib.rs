//! Reading directories the fast way, and deciding which entries a job sees.
//!
//! [`DirStream`] lists one directory with `getdents64` into a large reused
//! buffer and `statx`es each entry relative to the directory's descriptor,
//! so listing never allocates per entry and never builds a full path.
//! [`Filter`] applies `--exclude`/`--include` globs.
//!
//! Scheduling directories across threads is not done here: in sluice every
//! directory is a task on the engine's one pool of streams (see the engine
//! crate), so this crate must stay free of threads and queues.

#![forbid(unsafe_code)]

mod filter;
pub use filter::{Filter, FilterError};

use sluice_sys::{Errno, Stat};
use std::ffi::CStr;
use std::mem::MaybeUninit;
use std::os::fd::BorrowedFd;

/// Size of the `getdents64` buffer: large enough that a directory of a
/// thousand entries is read in two or three calls.
pub const LIST_BUF: usize = 64 * 1024;

/// A reusable buffer for listing directories.
pub struct DirStream {
    buf: Vec<MaybeUninit<u8>>,
}

impl Default for DirStream {
    fn default() -> Self {
        DirStream {
            buf: vec![MaybeUninit::uninit(); LIST_BUF],
        }
    }
}

/// One directory entry as listed, before any `statx`.
pub struct Listed<'a> {
    pub name: &'a CStr,
    pub ino: u64,
    /// The directory entry says it is a directory (`DT_DIR`).
    pub is_dir: bool,
}

impl DirStream {
    /// Calls `each` for every entry of `dir` except `.` and `..`, streaming:
    /// memory does not grow with the directory's size. Stops early when
    /// `each` returns `false`. A failed `getdents64` is returned; entries
    /// already passed to `each` stay passed.
    pub fn for_each(
        &mut self,
        dir: BorrowedFd<'_>,
        mut each: impl FnMut(Listed<'_>) -> bool,
    ) -> Result<(), Errno> {
        let mut raw = rustix::fs::RawDir::new(dir, &mut self.buf);
        while let Some(entry) = raw.next() {
            let entry = entry?;
            let name = entry.file_name();
            let b = name.to_bytes();
            if b == b"." || b == b".." {
                continue;
            }
            if !each(Listed {
                name,
                ino: entry.ino(),
                is_dir: entry.file_type() == rustix::fs::FileType::Directory,
            }) {
                break;
            }
        }
        Ok(())
    }
}

/// `statx` of one listed entry (symlinks not followed).
pub fn stat_entry(dir: BorrowedFd<'_>, name: &CStr) -> Result<Stat, Errno> {
    sluice_sys::stat_at(dir, name)
}

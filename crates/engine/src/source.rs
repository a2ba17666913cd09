//! The side entries are read from.
//!
//! [`Source`] is everything the engine asks of SRC: open and list a
//! directory, `statx` an entry, read a symlink, open a file and read a
//! range of it. [`LocalSource`] answers from a local file system; a source
//! on another host answers the same questions over `sluice serve`, so the
//! engine (which runs where DST is, next to the many small writes a file
//! costs) never learns which it has.
//!
//! Handles are what the source gave back: a local one holds a descriptor.
//! The local fast paths (reflink clone, `copy_file_range`, `SEEK_DATA`,
//! `O_DIRECT`, extended attributes) take that descriptor through
//! [`SrcFile::fd`] and [`SrcDir::fd`]; they are the sites a remote handle,
//! which has none, must go around.

use crate::hash::{Digest, HashKind};
use sluice_sys::{Errno, FsKind, Stat};
use sluice_walk::DirStream;
use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

/// An open source directory.
pub struct SrcDir(OwnedFd);

/// An open source file.
pub struct SrcFile(OwnedFd);

impl SrcDir {
    /// The directory of a local source, opened by the job's root code.
    pub fn local(fd: OwnedFd) -> SrcDir {
        SrcDir(fd)
    }

    /// The local descriptor (local fast paths only).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

impl SrcFile {
    /// The local descriptor (local fast paths only).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// What [`Source::list`] calls for each entry: its name, whether the
/// listing says it is a directory, and its `statx`.
pub type Each<'a> = &'a mut dyn FnMut(&CStr, bool, Result<Stat, Errno>) -> bool;

/// What the engine asks of SRC. Names are single components (the sys
/// layer refuses anything else); nothing here writes.
pub trait Source: Send + Sync {
    /// Opens the directory `name` in `dir`, never following a symlink.
    fn open_dir(&self, dir: &SrcDir, name: &CStr) -> Result<SrcDir, Errno>;
    /// `statx` of an open directory.
    fn stat_dir(&self, dir: &SrcDir) -> Result<Stat, Errno>;
    /// What the directory's file system reports sizes as.
    fn kind(&self, dir: &SrcDir) -> FsKind;
    /// Calls `each` with every entry's name, whether the listing says it
    /// is a directory, and its `statx` (not following a symlink), until it
    /// returns false. The stats come with the listing, so a source across
    /// a wire answers a directory in one exchange, never one per entry.
    /// Memory does not grow with the directory: `buf` is reused.
    fn list(&self, dir: &SrcDir, buf: &mut DirStream, each: Each<'_>) -> Result<(), Errno>;
    /// `statx` of an entry, not following a symlink.
    fn stat(&self, dir: &SrcDir, name: &CStr) -> Result<Stat, Errno>;
    /// Where a symlink points (`reuse` is a buffer to fill).
    fn read_link(&self, dir: &SrcDir, name: &CStr, reuse: Vec<u8>) -> Result<CString, Errno>;
    /// Opens a file for reading (never blocking on a FIFO swapped in).
    fn open(&self, dir: &SrcDir, name: &CStr) -> Result<SrcFile, Errno>;
    /// `statx` of an open file.
    fn stat_file(&self, file: &SrcFile) -> Result<Stat, Errno>;
    /// Reads up to `buf.len()` bytes at `off`; fewer only at the end.
    fn read_at(&self, file: &SrcFile, buf: &mut [u8], off: u64) -> Result<usize, Errno>;
    /// Digest of `[off, off + len)` (to the end with `u64::MAX`) and the
    /// bytes it covers, read through `buf` (aligned for `O_DIRECT`). A
    /// source across a wire hashes at its end and sends the digest.
    fn hash(
        &self,
        file: &SrcFile,
        off: u64,
        len: u64,
        buf: &mut [u8],
        kind: HashKind,
    ) -> Result<(Digest, u64), Errno>;
}

/// A source on a local file system.
pub struct LocalSource;

impl Source for LocalSource {
    fn open_dir(&self, dir: &SrcDir, name: &CStr) -> Result<SrcDir, Errno> {
        sluice_sys::open_dir_at(dir.fd(), name).map(SrcDir)
    }

    fn stat_dir(&self, dir: &SrcDir) -> Result<Stat, Errno> {
        sluice_sys::stat_fd(dir.fd())
    }

    fn kind(&self, dir: &SrcDir) -> FsKind {
        sluice_sys::fs_kind(dir.fd())
    }

    fn list(&self, dir: &SrcDir, buf: &mut DirStream, each: Each<'_>) -> Result<(), Errno> {
        let fd = dir.fd();
        buf.for_each(fd, |e| {
            each(e.name, e.is_dir, sluice_walk::stat_entry(fd, e.name))
        })
    }

    fn stat(&self, dir: &SrcDir, name: &CStr) -> Result<Stat, Errno> {
        sluice_walk::stat_entry(dir.fd(), name)
    }

    fn read_link(&self, dir: &SrcDir, name: &CStr, reuse: Vec<u8>) -> Result<CString, Errno> {
        sluice_sys::readlink_at(dir.fd(), name, reuse)
    }

    fn open(&self, dir: &SrcDir, name: &CStr) -> Result<SrcFile, Errno> {
        sluice_sys::open_read_at(dir.fd(), name).map(SrcFile)
    }

    fn stat_file(&self, file: &SrcFile) -> Result<Stat, Errno> {
        sluice_sys::stat_fd(file.fd())
    }

    fn read_at(&self, file: &SrcFile, buf: &mut [u8], off: u64) -> Result<usize, Errno> {
        sluice_sys::read_full_at(file.fd(), buf, off)
    }

    fn hash(
        &self,
        file: &SrcFile,
        off: u64,
        len: u64,
        buf: &mut [u8],
        kind: HashKind,
    ) -> Result<(Digest, u64), Errno> {
        crate::hash::hash_range(file.fd(), off, len, buf, kind)
    }
}

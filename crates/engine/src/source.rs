//! The side entries are read from.
//!
//! [`Source`] is everything the engine asks of SRC: open its root, open
//! and list a directory (stats with the names), `statx` an entry, read a
//! symlink, open a file, read or hash a range of it, read extended
//! attributes. [`LocalSource`] answers from a local file system; a source
//! on another host (`sluice_remote::RemoteSource`) answers the same
//! questions over `sluice serve`, so the engine (which runs where DST is,
//! next to the many small writes a file costs) never learns which it has.
//!
//! Handles are what the source gave back: a local one holds a descriptor,
//! a far one ([`Far`]) a number at the far end. The local fast paths
//! (reflink clone, `copy_file_range`, `SEEK_DATA`, `O_DIRECT`, fd-to-fd
//! extended attributes) take the descriptor through [`SrcFile::fd`] and
//! [`SrcDir::fd`]; a far handle has none and is read through the trait.

use crate::hash::{Digest, HashKind};
use sluice_sys::{Errno, FileType, FsKind, Stat, XattrSet};
use sluice_walk::DirStream;
use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// An open source directory.
pub struct SrcDir(Handle);

/// An open source file.
pub struct SrcFile(Handle);

enum Handle {
    Local(OwnedFd),
    Far(Far),
}

/// A handle a source across a wire gave out: its number there, and whom
/// to tell when the engine drops it (so the far end closes it too).
pub struct Far {
    pub id: u64,
    pub owner: Arc<dyn Release>,
}

/// Told when a [`Far`] handle is dropped.
pub trait Release: Send + Sync {
    fn release(&self, id: u64);
}

impl Drop for Far {
    fn drop(&mut self) {
        self.owner.release(self.id);
    }
}

impl Handle {
    fn fd(&self) -> Option<BorrowedFd<'_>> {
        match self {
            Handle::Local(fd) => Some(fd.as_fd()),
            Handle::Far(_) => None,
        }
    }

    fn far(&self) -> Option<u64> {
        match self {
            Handle::Local(_) => None,
            Handle::Far(f) => Some(f.id),
        }
    }
}

impl SrcDir {
    /// The directory of a local source, opened by the job's root code.
    pub fn local(fd: OwnedFd) -> SrcDir {
        SrcDir(Handle::Local(fd))
    }

    /// A directory a source across a wire opened.
    pub fn far(far: Far) -> SrcDir {
        SrcDir(Handle::Far(far))
    }

    /// The local descriptor, for the local fast paths; `None` for a
    /// directory across a wire.
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.0.fd()
    }

    /// The far end's number for it, if it is across a wire.
    pub fn far_id(&self) -> Option<u64> {
        self.0.far()
    }
}

impl SrcFile {
    /// A file a source across a wire opened.
    pub fn far(far: Far) -> SrcFile {
        SrcFile(Handle::Far(far))
    }

    /// The local descriptor, for the local fast paths (clone, kernel copy,
    /// holes, `O_DIRECT`); `None` for a file across a wire, which is read
    /// through [`Source::read_at`].
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.0.fd()
    }

    /// The far end's number for it, if it is across a wire.
    pub fn far_id(&self) -> Option<u64> {
        self.0.far()
    }
}

/// Extended attributes as read: names and values.
pub type Xattrs = Vec<(CString, Vec<u8>)>;

/// Either kind of open entry, for what both have (extended attributes).
#[derive(Clone, Copy)]
pub enum Open<'a> {
    Dir(&'a SrcDir),
    File(&'a SrcFile),
}

impl Open<'_> {
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        match self {
            Open::Dir(d) => d.fd(),
            Open::File(f) => f.fd(),
        }
    }

    pub fn far_id(&self) -> Option<u64> {
        match self {
            Open::Dir(d) => d.far_id(),
            Open::File(f) => f.far_id(),
        }
    }
}

/// What [`Source::list`] calls for each entry: its name, whether the
/// listing says it is a directory, and its `statx`.
pub type Each<'a> = &'a mut dyn FnMut(&CStr, bool, Result<Stat, Errno>) -> bool;

/// SRC's root as the user named it: a directory, or one file (with the
/// directory holding it).
pub enum SrcRoot {
    Dir(SrcDir),
    File {
        dir: SrcDir,
        name: CString,
        st: Stat,
        /// The file's own path, symlinks resolved: a copy onto itself is
        /// refused by comparing it with DST's.
        real: PathBuf,
    },
}

/// SRC of `sluice image`, opened: a block device or a regular file.
pub struct ImageSrc {
    pub file: SrcFile,
    pub st: Stat,
    /// Bytes to image: a device's size, a file's length.
    pub size: u64,
    pub device: bool,
}

/// What the engine asks of SRC. Names are single components (the sys
/// layer refuses anything else); nothing here writes.
pub trait Source: Send + Sync {
    /// Opens SRC's root, following a symlink there (the user named it).
    fn open_root(&self, path: &Path) -> Result<SrcRoot, std::io::Error>;
    /// Opens SRC of `sluice image`: a block device (refused while mounted
    /// read-write, unless `allow_mounted`) or a regular file. A refusal
    /// that is no errno comes as an error whose text says why.
    fn open_image(&self, path: &Path, allow_mounted: bool) -> Result<ImageSrc, std::io::Error>;
    /// Whether paths of this source are on this machine (so a DST inside
    /// SRC, or the same file on both sides, is a question to ask).
    fn is_local(&self) -> bool;
    /// How a path of this source is written in messages.
    fn name(&self, path: &Path) -> PathBuf {
        path.to_owned()
    }
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
    /// With `prefetch` the caller will read most of what it lists (DST has
    /// none of it), and a source across a wire may send small files'
    /// contents along. Memory does not grow with the directory: `buf` is
    /// reused.
    fn list(
        &self,
        dir: &SrcDir,
        buf: &mut DirStream,
        prefetch: bool,
        each: Each<'_>,
    ) -> Result<(), Errno>;
    /// Whether `dir` has an entry `name` (what `--delete` asks of every
    /// entry DST has; a source across a wire answers from one listing).
    fn has(&self, dir: &SrcDir, name: &CStr) -> Result<bool, Errno> {
        match self.stat(dir, name) {
            Ok(_) => Ok(true),
            Err(Errno::NOENT) => Ok(false),
            Err(e) => Err(e),
        }
    }
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
    /// The extended attributes (ACLs included with `XattrSet::All`) of an
    /// open entry.
    fn xattrs(&self, of: Open<'_>, set: XattrSet) -> Result<Xattrs, Errno>;
    /// What crossed the connections to a source across a wire so far
    /// (`None` for a local source).
    fn wire(&self) -> Option<Wire> {
        None
    }
}

/// Bytes that crossed the connections to a source across a wire, counted
/// apart from the bytes written.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Wire {
    /// Direct data connections besides the control connection.
    pub streams: usize,
    /// Data connections that broke during the job (each replaced if it
    /// could be).
    pub streams_dropped: u64,
    pub bytes_received: u64,
    pub bytes_sent: u64,
    /// How hard the source's host worked, when it could say.
    pub far: Option<crate::gauge::Load>,
}

/// The descriptor of a local handle: a local source is never handed a
/// handle from across a wire.
fn local(fd: Option<BorrowedFd<'_>>) -> Result<BorrowedFd<'_>, Errno> {
    fd.ok_or(Errno::BADF)
}

/// A source on a local file system.
pub struct LocalSource;

impl Source for LocalSource {
    fn open_root(&self, path: &Path) -> Result<SrcRoot, std::io::Error> {
        if std::fs::metadata(path)?.is_dir() {
            return Ok(SrcRoot::Dir(SrcDir::local(sluice_sys::open_dir_path(
                path,
            )?)));
        }
        let real = path.canonicalize()?;
        let (Some(dir), Some(name)) = (real.parent(), real.file_name()) else {
            return Err(std::io::Error::other("names no file"));
        };
        let dir = sluice_sys::open_dir_path(dir)?;
        let name = CString::new(name.as_bytes()).map_err(std::io::Error::other)?;
        let st = sluice_sys::stat_at(dir.as_fd(), &name)?;
        Ok(SrcRoot::File {
            dir: SrcDir::local(dir),
            name,
            st,
            real,
        })
    }

    fn open_image(&self, path: &Path, allow_mounted: bool) -> Result<ImageSrc, std::io::Error> {
        let fd = sluice_sys::open_image(path, false, false)?;
        let st = sluice_sys::stat_fd(fd.as_fd())?;
        let device = match st.file_type() {
            FileType::BlockDevice => true,
            FileType::RegularFile => false,
            _ => {
                return Err(std::io::Error::other(format!(
                    "{} is neither a block device nor a file; `sluice copy` copies trees",
                    path.display()
                )))
            }
        };
        if device && !allow_mounted {
            if let Some((point, true)) = mount_of(st.rdev, path) {
                return Err(std::io::Error::other(format!(
                    "{} is mounted read-write on {point}: an image of a live file system is \
                     inconsistent. Image a snapshot (LVM, btrfs) or freeze it (fsfreeze -f \
                     {point}), or pass --allow-mounted",
                    path.display()
                )));
            }
        }
        let size = if device {
            sluice_sys::end_of(fd.as_fd())?
        } else {
            st.size
        };
        Ok(ImageSrc {
            file: SrcFile(Handle::Local(fd)),
            st,
            size,
            device,
        })
    }

    fn is_local(&self) -> bool {
        true
    }

    fn open_dir(&self, dir: &SrcDir, name: &CStr) -> Result<SrcDir, Errno> {
        sluice_sys::open_dir_at(local(dir.fd())?, name).map(|fd| SrcDir(Handle::Local(fd)))
    }

    fn stat_dir(&self, dir: &SrcDir) -> Result<Stat, Errno> {
        sluice_sys::stat_fd(local(dir.fd())?)
    }

    fn kind(&self, dir: &SrcDir) -> FsKind {
        dir.fd().map_or(FsKind::Plain, sluice_sys::fs_kind)
    }

    fn list(
        &self,
        dir: &SrcDir,
        buf: &mut DirStream,
        _prefetch: bool,
        each: Each<'_>,
    ) -> Result<(), Errno> {
        let fd = local(dir.fd())?;
        buf.for_each(fd, |e| {
            each(e.name, e.is_dir, sluice_walk::stat_entry(fd, e.name))
        })
    }

    fn stat(&self, dir: &SrcDir, name: &CStr) -> Result<Stat, Errno> {
        sluice_walk::stat_entry(local(dir.fd())?, name)
    }

    fn read_link(&self, dir: &SrcDir, name: &CStr, reuse: Vec<u8>) -> Result<CString, Errno> {
        sluice_sys::readlink_at(local(dir.fd())?, name, reuse)
    }

    fn open(&self, dir: &SrcDir, name: &CStr) -> Result<SrcFile, Errno> {
        sluice_sys::open_read_at(local(dir.fd())?, name).map(|fd| SrcFile(Handle::Local(fd)))
    }

    fn stat_file(&self, file: &SrcFile) -> Result<Stat, Errno> {
        sluice_sys::stat_fd(local(file.fd())?)
    }

    fn read_at(&self, file: &SrcFile, buf: &mut [u8], off: u64) -> Result<usize, Errno> {
        sluice_sys::read_full_at(local(file.fd())?, buf, off)
    }

    fn hash(
        &self,
        file: &SrcFile,
        off: u64,
        len: u64,
        buf: &mut [u8],
        kind: HashKind,
    ) -> Result<(Digest, u64), Errno> {
        crate::hash::hash_range(local(file.fd())?, off, len, buf, kind)
    }

    fn xattrs(&self, of: Open<'_>, set: XattrSet) -> Result<Xattrs, Errno> {
        sluice_sys::read_xattrs(local(of.fd())?, set)
    }
}

/// Whether the local `dst` carries the same attributes of `set` as the
/// source's `src` (unreadable on either side counts as different).
pub fn xattrs_match(
    source: &dyn Source,
    src: Open<'_>,
    dst: BorrowedFd<'_>,
    set: XattrSet,
) -> bool {
    match src.fd() {
        Some(fd) => sluice_sys::xattrs_equal(fd, dst, set).unwrap_or(false),
        None => source
            .xattrs(src, set)
            .and_then(|attrs| sluice_sys::xattrs_are(dst, set, &attrs))
            .unwrap_or(false),
    }
}

/// Copies the attributes of `set` from the source's `src` onto the local
/// `dst`: fd to fd for a local source (`names` and `value` are scratch),
/// as one list from a source across a wire. The error names what it hit.
pub fn copy_xattrs(
    source: &dyn Source,
    src: Open<'_>,
    dst: BorrowedFd<'_>,
    set: XattrSet,
    names: &mut Vec<u8>,
    value: &mut Vec<u8>,
) -> Result<(), (Errno, String)> {
    match src.fd() {
        Some(fd) => sluice_sys::copy_xattrs(fd, dst, set, names, value),
        None => {
            let attrs = source
                .xattrs(src, set)
                .map_err(|e| (e, "read extended attributes".to_string()))?;
            sluice_sys::set_xattrs(dst, &attrs)
        }
    }
}

/// Whether the source's `src` has the attribute `name`.
pub fn has_xattr(source: &dyn Source, src: Open<'_>, name: &CStr) -> bool {
    match src.fd() {
        Some(fd) => sluice_sys::has_xattr(fd, name),
        None => source
            .xattrs(src, XattrSet::All)
            .is_ok_and(|attrs| attrs.iter().any(|(n, _)| n.as_c_str() == name)),
    }
}

/// Where `dev` (major, minor) or `path` is mounted, and whether read-write,
/// from `/proc/self/mountinfo`: by device number, or by the mount's source
/// path (btrfs reports an anonymous device number).
pub fn mount_of(dev: (u32, u32), path: &Path) -> Option<(String, bool)> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = format!("{}:{}", dev.0, dev.1);
    let real = path.canonicalize().ok();
    let mut found = None;
    for line in info.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let Some(sep) = f.iter().position(|&x| x == "-") else {
            continue;
        };
        let (Some(num), Some(point), Some(opts), Some(source)) =
            (f.get(2), f.get(4), f.get(5), f.get(sep + 2))
        else {
            continue;
        };
        let by_source = real.is_some()
            && source.starts_with('/')
            && Path::new(source).canonicalize().ok() == real;
        if *num == want || by_source {
            let rw = opts.split(',').any(|o| o == "rw");
            // A read-write mount anywhere is what matters.
            if rw || found.is_none() {
                found = Some((point.to_string(), rw));
            }
        }
    }
    found
}

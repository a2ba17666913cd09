//! The thin syscall layer of sluice.
//!
//! Every file-system operation the engine performs goes through here, relative
//! to a directory file descriptor, so that paths longer than `PATH_MAX` work
//! and no symlink inside the destination is ever followed. Each wrapper picks
//! the fastest primitive the kernel offers and falls back cleanly
//! (`FICLONE`, then `copy_file_range`, then `pread`/`pwrite`).
//!
//! This is the only crate that may contain `unsafe`; it has one block, the
//! `FS_IOC_FIEMAP` ioctl in `extents`, which rustix does not wrap. It must never make policy decisions
//! (what to copy, what to report): callers get plain `Errno`s back.

use std::ffi::CStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

pub use rustix::fs::{FileType, Mode, OFlags};
pub use rustix::io::Errno;

/// Result of a raw syscall wrapper.
pub type Result<T> = std::result::Result<T, Errno>;

mod buf;
pub mod extents;
pub mod notify;
mod xattr;
pub use buf::{AlignedBuf, DIRECT_ALIGN};
pub use xattr::{
    copy_xattrs, has_xattr, read_xattrs, remove_xattr, remove_xattr_at, set_xattrs, xattrs_are,
    xattrs_equal, XattrSet,
};

/// The metadata sluice needs about one entry, read once with `statx`. A
/// plain value: it crosses the wire as it is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Stat {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub ino: u64,
    pub size: u64,
    pub blocks: u64,
    pub dev: (u32, u32),
    pub rdev: (u32, u32),
    pub atime: (i64, u32),
    pub mtime: (i64, u32),
    /// When the inode last changed (data or metadata, xattrs included).
    pub ctime: (i64, u32),
}

impl Stat {
    /// The inode's identity: device (major, minor) and inode number. What
    /// tags a directory's temporaries and keys a hard-link group.
    pub fn identity(&self) -> (u32, u32, u64) {
        (self.dev.0, self.dev.1, self.ino)
    }

    /// The file type bits of `mode`.
    pub fn file_type(&self) -> FileType {
        FileType::from_raw_mode(self.mode)
    }

    /// Permission bits including set-id and sticky bits.
    pub fn perm(&self) -> u32 {
        self.mode & 0o7777
    }

    /// True when the file has fewer allocated blocks than its size needs,
    /// so its holes are worth finding with `SEEK_DATA`/`SEEK_HOLE`.
    pub fn is_sparse(&self) -> bool {
        self.blocks.saturating_mul(512) < self.size
    }

    fn from_statx(x: &rustix::fs::Statx) -> Stat {
        Stat {
            mode: u32::from(x.stx_mode),
            uid: x.stx_uid,
            gid: x.stx_gid,
            nlink: x.stx_nlink,
            ino: x.stx_ino,
            size: x.stx_size,
            blocks: x.stx_blocks,
            dev: (x.stx_dev_major, x.stx_dev_minor),
            rdev: (x.stx_rdev_major, x.stx_rdev_minor),
            atime: (x.stx_atime.tv_sec, x.stx_atime.tv_nsec),
            mtime: (x.stx_mtime.tv_sec, x.stx_mtime.tv_nsec),
            ctime: (x.stx_ctime.tv_sec, x.stx_ctime.tv_nsec),
        }
    }
}

fn statx_mask() -> rustix::fs::StatxFlags {
    use rustix::fs::StatxFlags as F;
    F::TYPE
        | F::MODE
        | F::NLINK
        | F::UID
        | F::GID
        | F::ATIME
        | F::MTIME
        | F::CTIME
        | F::INO
        | F::SIZE
        | F::BLOCKS
}

/// Refuses a name that is not one path component (`a/b`, `..`, empty):
/// every `*at` wrapper here resolves exactly one name below a directory it
/// was handed, so no path through a directory that could be swapped for a
/// symlink is ever walked by the kernel. A multi-component DST path must be
/// opened one component at a time (see the engine's `target` module).
#[inline]
fn one(name: &CStr) -> Result<&CStr> {
    let b = name.to_bytes();
    if b.is_empty() || b == b".." || b.contains(&b'/') {
        return Err(Errno::INVAL);
    }
    Ok(name)
}

/// `statx(dir, name, AT_SYMLINK_NOFOLLOW)`: the entry itself, never a link target.
pub fn stat_at(dir: BorrowedFd<'_>, name: &CStr) -> Result<Stat> {
    one(name)?;
    let x = rustix::fs::statx(
        dir,
        name,
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
        statx_mask(),
    )?;
    Ok(Stat::from_statx(&x))
}

/// `statx` of an open file descriptor.
pub fn stat_fd(fd: BorrowedFd<'_>) -> Result<Stat> {
    let x = rustix::fs::statx(fd, c"", rustix::fs::AtFlags::EMPTY_PATH, statx_mask())?;
    Ok(Stat::from_statx(&x))
}

/// Opens a directory below `dir` without following a symlink at `name`.
pub fn open_dir_at(dir: BorrowedFd<'_>, name: &CStr) -> Result<OwnedFd> {
    one(name)?;
    rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

/// Opens the directory `rel` (components joined by `/`) below `dir`
/// without following any symlink on the way and without leaving `dir`:
/// `openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS` where the kernel
/// has it (5.6+), else one `O_NOFOLLOW` component at a time. An empty
/// `rel` reopens `dir` itself.
pub fn open_dir_beneath(dir: BorrowedFd<'_>, rel: &[u8]) -> Result<OwnedFd> {
    use rustix::fs::ResolveFlags as R;
    let parts = || {
        rel.split(|&b| b == b'/')
            .filter(|p| !p.is_empty() && *p != b".")
    };
    if parts().any(|p| p == b"..") {
        return Err(Errno::INVAL);
    }
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let path = if rel.is_empty() { &b"."[..] } else { rel };
    let path = std::ffi::CString::new(path).map_err(|_| Errno::INVAL)?;
    let how = R::BENEATH | R::NO_SYMLINKS | R::NO_MAGICLINKS;
    match rustix::fs::openat2(dir, &path, flags, Mode::empty(), how) {
        Err(Errno::NOSYS) | Err(Errno::PERM) => {} // no openat2 (or a seccomp filter)
        other => return other,
    }
    let mut cur = rustix::fs::openat(dir, c".", flags, Mode::empty())?;
    for part in parts() {
        let name = std::ffi::CString::new(part).map_err(|_| Errno::INVAL)?;
        cur = open_dir_at(cur.as_fd(), &name)?;
    }
    Ok(cur)
}

/// Opens a directory by path (for the roots of a job); follows symlinks, as a
/// user naming a root expects.
pub fn open_dir_path(path: &std::path::Path) -> Result<OwnedFd> {
    rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

/// Opens a regular file below `dir` for reading, never through a symlink.
/// `O_NOATIME` is tried first so a copy leaves the source's atime alone; it
/// is refused for files the caller does not own, so it is retried without.
pub fn open_read_at(dir: BorrowedFd<'_>, name: &CStr) -> Result<OwnedFd> {
    one(name)?;
    // O_NONBLOCK: a FIFO swapped in after the entry was listed must not
    // block the stream forever (it has no effect on regular files).
    let flags =
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK;
    match rustix::fs::openat(dir, name, flags | OFlags::NOATIME, Mode::empty()) {
        Err(Errno::PERM) => rustix::fs::openat(dir, name, flags, Mode::empty()),
        other => other,
    }
}

/// Opens an existing file below `dir` for reading and writing, never through a
/// symlink (a resumed temporary).
pub fn open_write_at(dir: BorrowedFd<'_>, name: &CStr) -> Result<OwnedFd> {
    one(name)?;
    rustix::fs::openat(
        dir,
        name,
        OFlags::RDWR | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK,
        Mode::empty(),
    )
}

/// Creates a new file below `dir` for writing (and reading back): `O_EXCL` so an existing name
/// (including a symlink planted there) is never opened or followed.
pub fn create_excl_at(dir: BorrowedFd<'_>, name: &CStr, perm: u32) -> Result<OwnedFd> {
    one(name)?;
    rustix::fs::openat(
        dir,
        name,
        OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(perm),
    )
}

/// Creates an unnamed file in `dir` (`O_TMPFILE`): it has no name until
/// [`link_unnamed`] gives it one, and vanishes by itself if the process dies
/// first, so it can never be seen half-written. Creating it does not lock
/// the directory, which matters when many streams write into one.
/// File systems without `O_TMPFILE` answer `EOPNOTSUPP` or `EISDIR`.
pub fn create_unnamed(dir: BorrowedFd<'_>, perm: u32) -> Result<OwnedFd> {
    rustix::fs::openat(
        dir,
        c".",
        OFlags::RDWR | OFlags::TMPFILE | OFlags::CLOEXEC,
        Mode::from_raw_mode(perm),
    )
}

/// Gives an `O_TMPFILE` file the name `name` in `dir`; fails with `EEXIST`
/// if the name is taken. `AT_EMPTY_PATH` needs `CAP_DAC_READ_SEARCH`;
/// without it the `/proc/self/fd` link is used, as `open(2)` documents.
pub fn link_unnamed(fd: BorrowedFd<'_>, dir: BorrowedFd<'_>, name: &CStr) -> Result<()> {
    use rustix::fs::AtFlags;
    one(name)?;
    match rustix::fs::linkat(fd, c"", dir, name, AtFlags::EMPTY_PATH) {
        Err(Errno::NOENT) | Err(Errno::PERM) => {
            use std::os::fd::AsRawFd;
            let proc_path = format!("/proc/self/fd/{}", fd.as_raw_fd());
            rustix::fs::linkat(
                rustix::fs::CWD,
                proc_path.as_str(),
                dir,
                name,
                AtFlags::SYMLINK_FOLLOW,
            )
        }
        other => other,
    }
}

/// Switches an open file to or from `O_DIRECT` (Linux lets `F_SETFL`
/// toggle it). File systems that cannot do direct I/O answer `EINVAL`.
pub fn set_direct(fd: BorrowedFd<'_>, on: bool) -> Result<()> {
    let flags = rustix::fs::fcntl_getfl(fd)?;
    let flags = if on {
        flags | OFlags::DIRECT
    } else {
        flags - OFlags::DIRECT
    };
    rustix::fs::fcntl_setfl(fd, flags)
}

/// Fails unless this process may create entries in `dir` (write and
/// search permission, a writable file system).
pub fn check_writable_dir(dir: BorrowedFd<'_>) -> Result<()> {
    use rustix::fs::{Access, AtFlags};
    rustix::fs::accessat(
        dir,
        c".",
        Access::WRITE_OK | Access::EXEC_OK,
        AtFlags::EACCESS,
    )
}

/// Takes an exclusive `flock` on an open directory without waiting;
/// `EWOULDBLOCK` means another process holds it. Released when every
/// descriptor sharing this open file is closed, so a crash releases it too.
pub fn try_lock(fd: BorrowedFd<'_>) -> Result<()> {
    rustix::fs::flock(fd, rustix::fs::FlockOperation::NonBlockingLockExclusive)
}

/// Takes an exclusive `flock` on an open file, waiting for it: the parts
/// of a split job (`--shard`) take turns at a file they share.
pub fn lock(fd: BorrowedFd<'_>) -> Result<()> {
    rustix::fs::flock(fd, rustix::fs::FlockOperation::LockExclusive)
}

/// Takes a shared `flock` on an open directory without waiting: fails with
/// `EWOULDBLOCK` while another open file holds it exclusively (another run
/// whose DST is this directory).
pub fn try_lock_shared(fd: BorrowedFd<'_>) -> Result<()> {
    rustix::fs::flock(fd, rustix::fs::FlockOperation::NonBlockingLockShared)
}

/// Releases an `flock` taken on this open file.
pub fn unlock(fd: BorrowedFd<'_>) -> Result<()> {
    rustix::fs::flock(fd, rustix::fs::FlockOperation::Unlock)
}

/// Opens (with `create`, creating owner-only) a state file of sluice's
/// (a journal, a chunk map) named `name` in the held directory `dir`:
/// never through a symlink (`O_NOFOLLOW`), never a FIFO or device
/// (`O_NONBLOCK`, then `fstat` must say regular file, else `EINVAL`).
/// `Ok(None)`: it does not exist and `create` was false.
pub fn open_state_file(
    dir: BorrowedFd<'_>,
    name: &CStr,
    create: bool,
) -> Result<Option<std::fs::File>> {
    one(name)?;
    let mut flags =
        OFlags::RDWR | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK;
    if create {
        flags |= OFlags::CREATE;
    }
    let fd = match rustix::fs::openat(dir, name, flags, Mode::from_raw_mode(0o600)) {
        Ok(fd) => fd,
        Err(Errno::NOENT) if !create => return Ok(None),
        Err(e) => return Err(e),
    };
    if stat_fd(fd.as_fd())?.file_type() != FileType::RegularFile {
        return Err(Errno::INVAL);
    }
    // Back to blocking I/O for the database that reads and writes it.
    let fl = rustix::fs::fcntl_getfl(&fd)?;
    rustix::fs::fcntl_setfl(&fd, fl - OFlags::NONBLOCK)?;
    Ok(Some(std::fs::File::from(fd)))
}

/// What a file system's sizes and block counts can be trusted for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FsKind {
    /// Sizes are the bytes a read returns; few blocks mean holes.
    Plain,
    /// Sizes are right but block counts may be 0 (FUSE): never a sign of holes.
    NoBlocks,
    /// Sizes are not what a read returns (`/proc` says 0, `/sys` 4096):
    /// files must be read to their end.
    Synthetic,
}

/// The kind of the file system holding `fd` (`fstatfs`).
pub fn fs_kind(fd: BorrowedFd<'_>) -> FsKind {
    const PROC: i64 = 0x9fa0;
    const SYSFS: i64 = 0x6265_6572;
    const DEBUGFS: i64 = 0x6462_6720;
    const TRACEFS: i64 = 0x7472_6163;
    const SECURITYFS: i64 = 0x7363_6673;
    const CONFIGFS: i64 = 0x6265_6570;
    const CGROUP: i64 = 0x0027_e0eb;
    const CGROUP2: i64 = 0x6367_7270;
    const EFIVARFS: i64 = 0xde5e_81e4;
    const PSTORE: i64 = 0x6165_676c;
    const BPF: i64 = 0xcafe_4a11;
    const FUSE: i64 = 0x6573_5546;
    let Ok(st) = rustix::fs::fstatfs(fd) else {
        return FsKind::Plain;
    };
    #[allow(clippy::unnecessary_cast)]
    match st.f_type as i64 {
        PROC | SYSFS | DEBUGFS | TRACEFS | SECURITYFS | CONFIGFS | CGROUP | CGROUP2 | EFIVARFS
        | PSTORE | BPF => FsKind::Synthetic,
        FUSE => FsKind::NoBlocks,
        _ => FsKind::Plain,
    }
}

/// Whether `name` has the shape of a sluice temporary,
/// `.sluice-<hex>-<hex>-<hex>.tmp` (process, sequence, tag) or the
/// untagged `.sluice-<hex>-<hex>.tmp` of earlier versions. The shape alone
/// never licenses a removal: see [`temp_tag`].
pub fn is_temp_name(name: &[u8]) -> bool {
    temp_parts(name).is_some()
}

/// The hex fields of a temporary's name.
fn temp_parts(name: &[u8]) -> Option<Vec<&[u8]>> {
    let mid = name.strip_prefix(b".sluice-")?.strip_suffix(b".tmp")?;
    let parts: Vec<&[u8]> = mid.split(|&b| b == b'-').collect();
    let hex = |p: &&[u8]| !p.is_empty() && p.len() <= 16 && p.iter().all(u8::is_ascii_hexdigit);
    ((2..=3).contains(&parts.len()) && parts.iter().all(hex)).then_some(parts)
}

/// The tag that makes a temporary provably sluice's: a hash of the
/// directory it was created in (device and inode) and the name's other
/// fields. A file that merely looks like a temporary (one copied from a
/// SRC that was itself a DST, or a user's) carries no tag or the tag of
/// another directory, and is left alone.
pub fn temp_tag(dir: (u32, u32, u64), pid: u64, seq: u64) -> u64 {
    let mut h: u64 = 0x736c_7569_6365_7470; // "sluicetp"
    for v in [u64::from(dir.0), u64::from(dir.1), dir.2, pid, seq] {
        // SplitMix64 rounds: cheap, and every input bit moves the output.
        h = (h ^ v).wrapping_add(0x9e37_79b9_7f4a_7c15);
        h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        h ^= h >> 31;
    }
    h
}

/// The first field of a new directory's name while it is filled (see
/// [`hidden_dir_name`]): no process has this pid.
const HIDDEN_PID: u64 = 0;

/// The name a new directory has while it is being filled, before it is
/// renamed to `name` in the directory identified by `dir`. The same for
/// every run, so an interrupted run's directory is found and filled on:
/// `.sluice-0-<hash of name>-<tag>.tmp`, a temporary's shape (tagged as
/// any, so it is provably sluice's) with pid 0. Written NUL-terminated
/// into `out`, and returned from there.
pub fn hidden_dir_name<'a>(dir: (u32, u32, u64), name: &[u8], out: &'a mut [u8; 64]) -> &'a CStr {
    use std::io::Write;
    // FNV-1a over the name, then one SplitMix round via the tag.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in name {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    let h = temp_tag((0, 0, 0), HIDDEN_PID, h);
    let tag = temp_tag(dir, HIDDEN_PID, h);
    let mut cur = &mut out[..];
    let _ = write!(cur, ".sluice-{HIDDEN_PID:x}-{h:x}-{tag:x}.tmp\0");
    CStr::from_bytes_until_nul(out).expect("a NUL ends the name")
}

/// Whether `name` has the shape of a new directory's name while it is
/// filled ([`hidden_dir_name`]); [`is_own_temp`] says whether it is ours.
pub fn is_hidden_dir_name(name: &[u8]) -> bool {
    is_temp_name(name) && name.starts_with(b".sluice-0-")
}

/// Whether `name` is a temporary sluice created in the directory
/// identified by `dir`: its tag matches.
pub fn is_own_temp(name: &[u8], dir: (u32, u32, u64)) -> bool {
    let Some(parts) = temp_parts(name) else {
        return false;
    };
    let num = |p: &[u8]| u64::from_str_radix(std::str::from_utf8(p).ok()?, 16).ok();
    match parts.as_slice() {
        [pid, seq, tag] => match (num(pid), num(seq), num(tag)) {
            // A temporary the parts of a split job share is tagged with
            // the directory's inode alone: the device number differs
            // between machines mounting one file system.
            (Some(p), Some(s), Some(t)) => {
                temp_tag(dir, p, s) == t || temp_tag((0, 0, dir.2), p, s) == t
            }
            _ => false,
        },
        _ => false,
    }
}

/// `mkdirat`.
pub fn mkdir_at(dir: BorrowedFd<'_>, name: &CStr, perm: u32) -> Result<()> {
    one(name)?;
    rustix::fs::mkdirat(dir, name, Mode::from_raw_mode(perm))
}

/// Atomically replaces `to` with `from`, both below directory fds.
pub fn rename_at(
    dir: BorrowedFd<'_>,
    from: &CStr,
    to_dir: BorrowedFd<'_>,
    to: &CStr,
) -> Result<()> {
    one(from)?;
    one(to)?;
    rustix::fs::renameat(dir, from, to_dir, to)
}

/// Renames `from` to `to` in `dir` only if `to` does not exist
/// (`RENAME_NOREPLACE`): `EEXIST` if it does.
pub fn rename_noreplace_at(dir: BorrowedFd<'_>, from: &CStr, to: &CStr) -> Result<()> {
    one(from)?;
    one(to)?;
    rustix::fs::renameat_with(dir, from, dir, to, rustix::fs::RenameFlags::NOREPLACE)
}

/// Removes a non-directory entry.
pub fn unlink_at(dir: BorrowedFd<'_>, name: &CStr) -> Result<()> {
    one(name)?;
    rustix::fs::unlinkat(dir, name, rustix::fs::AtFlags::empty())
}

/// Removes an empty directory.
pub fn rmdir_at(dir: BorrowedFd<'_>, name: &CStr) -> Result<()> {
    one(name)?;
    rustix::fs::unlinkat(dir, name, rustix::fs::AtFlags::REMOVEDIR)
}

/// Creates a hard link `to` for the existing `from` (not following symlinks).
pub fn link_at(
    from_dir: BorrowedFd<'_>,
    from: &CStr,
    to_dir: BorrowedFd<'_>,
    to: &CStr,
) -> Result<()> {
    one(from)?;
    one(to)?;
    rustix::fs::linkat(from_dir, from, to_dir, to, rustix::fs::AtFlags::empty())
}

/// Reads a symlink's target into `reuse` (cleared first).
pub fn readlink_at(dir: BorrowedFd<'_>, name: &CStr, reuse: Vec<u8>) -> Result<std::ffi::CString> {
    one(name)?;
    rustix::fs::readlinkat(dir, name, reuse)
}

/// Creates a symlink named `name` below `dir` pointing at `target`.
pub fn symlink_at(target: &CStr, dir: BorrowedFd<'_>, name: &CStr) -> Result<()> {
    one(name)?;
    rustix::fs::symlinkat(target, dir, name)
}

/// Creates a FIFO, socket or device node.
pub fn mknod_at(dir: BorrowedFd<'_>, name: &CStr, st: &Stat) -> Result<()> {
    one(name)?;
    let dev = rustix::fs::makedev(st.rdev.0, st.rdev.1);
    rustix::fs::mknodat(
        dir,
        name,
        st.file_type(),
        Mode::from_raw_mode(st.perm() & 0o777),
        dev,
    )
}

fn timestamps(st: &Stat) -> rustix::fs::Timestamps {
    rustix::fs::Timestamps {
        last_access: rustix::fs::Timespec {
            tv_sec: st.atime.0,
            tv_nsec: st.atime.1.into(),
        },
        last_modification: rustix::fs::Timespec {
            tv_sec: st.mtime.0,
            tv_nsec: st.mtime.1.into(),
        },
    }
}

/// Sets atime and mtime (nanoseconds) of an open file or directory.
pub fn set_times(fd: BorrowedFd<'_>, st: &Stat) -> Result<()> {
    rustix::fs::futimens(fd, &timestamps(st))
}

/// Sets atime and mtime of the entry itself (a symlink is not followed).
pub fn set_times_at(dir: BorrowedFd<'_>, name: &CStr, st: &Stat) -> Result<()> {
    one(name)?;
    rustix::fs::utimensat(
        dir,
        name,
        &timestamps(st),
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )
}

/// Sets owner and group of an open file.
pub fn set_owner(fd: BorrowedFd<'_>, st: &Stat) -> Result<()> {
    let (uid, gid) = ids(st);
    rustix::fs::fchown(fd, Some(uid), Some(gid))
}

/// Sets owner and group of the entry itself (a symlink is not followed).
pub fn set_owner_at(dir: BorrowedFd<'_>, name: &CStr, st: &Stat) -> Result<()> {
    one(name)?;
    let (uid, gid) = ids(st);
    rustix::fs::chownat(
        dir,
        name,
        Some(uid),
        Some(gid),
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )
}

fn ids(st: &Stat) -> (rustix::fs::Uid, rustix::fs::Gid) {
    (
        rustix::fs::Uid::from_raw(st.uid),
        rustix::fs::Gid::from_raw(st.gid),
    )
}

/// Sets permission bits of the entry `name` in `dir` (not a symlink: the
/// kernel cannot change a link's mode, and a link is never followed here
/// because callers pass entries they just created).
pub fn set_perm_at(dir: BorrowedFd<'_>, name: &CStr, perm: u32) -> Result<()> {
    one(name)?;
    rustix::fs::chmodat(
        dir,
        name,
        Mode::from_raw_mode(perm),
        rustix::fs::AtFlags::empty(),
    )
}

/// Sets permission bits of an open file.
pub fn set_perm(fd: BorrowedFd<'_>, perm: u32) -> Result<()> {
    rustix::fs::fchmod(fd, Mode::from_raw_mode(perm))
}

/// Sets the file's size; the new range reads as zeros and takes no space.
pub fn set_len(fd: BorrowedFd<'_>, len: u64) -> Result<()> {
    rustix::fs::ftruncate(fd, len)
}

/// Reserves `len` bytes so a big file is laid out contiguously and a full
/// disk is found before any data is written. Unsupported file systems
/// (tmpfs before 3.5, some FUSE) are not an error.
pub fn preallocate(fd: BorrowedFd<'_>, len: u64) -> Result<()> {
    match rustix::fs::fallocate(fd, rustix::fs::FallocateFlags::empty(), 0, len) {
        Err(Errno::OPNOTSUPP) | Err(Errno::NOSYS) | Err(Errno::INVAL) => Ok(()),
        other => other,
    }
}

/// Opens a block device or image file named by the user (symlinks
/// followed, as for any root), read-only or read-write. With `excl`, for a
/// block device only: `O_EXCL`, which fails with `EBUSY` while the device
/// is mounted or held by another exclusive opener.
pub fn open_image(path: &std::path::Path, write: bool, excl: bool) -> Result<OwnedFd> {
    let mut flags = OFlags::CLOEXEC | OFlags::NOCTTY;
    flags |= if write { OFlags::RDWR } else { OFlags::RDONLY };
    if excl {
        flags |= OFlags::EXCL;
    }
    rustix::fs::open(path, flags, Mode::empty())
}

/// The size of an open file or block device, from seeking to its end
/// (`statx` reports 0 for block devices).
pub fn end_of(fd: BorrowedFd<'_>) -> Result<u64> {
    rustix::fs::seek(fd, rustix::fs::SeekFrom::End(0))
}

/// Makes `[off, off + len)` read as zeros without writing them: punches a
/// hole in a file (keeping its size), or asks a block device to zero the
/// range (`BLKZEROOUT` through `fallocate`). `EOPNOTSUPP` and `EINVAL`
/// mean the caller must write zeros itself.
pub fn zero_range(fd: BorrowedFd<'_>, off: u64, len: u64, device: bool) -> Result<()> {
    use rustix::fs::FallocateFlags as F;
    let mode = if device {
        F::ZERO_RANGE | F::KEEP_SIZE
    } else {
        F::PUNCH_HOLE | F::KEEP_SIZE
    };
    rustix::fs::fallocate(fd, mode, off, len)
}

/// `fsync`.
pub fn sync(fd: BorrowedFd<'_>) -> Result<()> {
    rustix::fs::fsync(fd)
}

/// `syncfs`: everything dirty on the file system holding `fd`.
pub fn sync_fs(fd: BorrowedFd<'_>) -> Result<()> {
    rustix::fs::syncfs(fd)
}

/// `fdatasync`: the data and what is needed to read it back (size,
/// allocated extents), not the times.
pub fn sync_data(fd: BorrowedFd<'_>) -> Result<()> {
    rustix::fs::fdatasync(fd)
}

/// Clones all of `src` into `dst` (`FICLONE`): shares extents, copies nothing.
pub fn clone_file(src: BorrowedFd<'_>, dst: BorrowedFd<'_>) -> Result<()> {
    rustix::fs::ioctl_ficlone(dst, src)
}

/// Where the next data at or after `off` starts, or `None` past the last data.
pub fn next_data(fd: BorrowedFd<'_>, off: u64) -> Result<Option<u64>> {
    match rustix::fs::seek(fd, rustix::fs::SeekFrom::Data(off)) {
        Ok(pos) => Ok(Some(pos)),
        Err(Errno::NXIO) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Where the hole at or after `off` starts (the file's end counts as a hole).
pub fn next_hole(fd: BorrowedFd<'_>, off: u64) -> Result<u64> {
    rustix::fs::seek(fd, rustix::fs::SeekFrom::Hole(off))
}

/// How one range is moved between two files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyMethod {
    /// In-kernel `copy_file_range` (may reflink on xfs/btrfs).
    Kernel,
    /// `pread`/`pwrite` through a user buffer.
    Buffered,
}

/// Copies `len` bytes at `off` from `src` to the same offset in `dst`.
/// Returns the bytes copied, short only when `src` ended early (it shrank).
///
/// With `CopyMethod::Kernel`, an `EXDEV`/`ENOSYS`/`EOPNOTSUPP`/`EINVAL`
/// answer is returned as `Err` untouched so the caller can switch methods
/// for the rest of the job; nothing has been written to `dst` by then.
pub fn copy_range(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    off: u64,
    len: u64,
    method: CopyMethod,
    buf: &mut [u8],
) -> Result<u64> {
    let mut done = 0u64;
    while done < len {
        let want = len - done;
        let n = match method {
            CopyMethod::Kernel => {
                let mut off_in = off + done;
                let mut off_out = off + done;
                // copy_file_range takes at most a size_t; cap each call so a
                // cancellation check between calls stays responsive.
                let step = want.min(1 << 30) as usize;
                rustix::fs::copy_file_range(src, Some(&mut off_in), dst, Some(&mut off_out), step)?
            }
            CopyMethod::Buffered => {
                let step = want.min(buf.len() as u64) as usize;
                let n = pread_retry(src, &mut buf[..step], off + done)?;
                if n > 0 {
                    write_all_at(dst, &buf[..n], off + done)?;
                }
                n
            }
        };
        if n == 0 {
            break;
        }
        done += n as u64;
    }
    Ok(done)
}

fn pread_retry(fd: BorrowedFd<'_>, buf: &mut [u8], off: u64) -> Result<usize> {
    loop {
        match rustix::io::pread(fd, &mut *buf, off) {
            Err(Errno::INTR) => continue,
            other => return other,
        }
    }
}

/// Reads into `buf` at `off` until it is full or the file ends.
pub fn read_full_at(fd: BorrowedFd<'_>, buf: &mut [u8], off: u64) -> Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        let n = pread_retry(fd, &mut buf[done..], off + done as u64)?;
        if n == 0 {
            break;
        }
        done += n;
    }
    Ok(done)
}

/// Writes all of `data` at `off`.
pub fn write_all_at(fd: BorrowedFd<'_>, mut data: &[u8], mut off: u64) -> Result<()> {
    while !data.is_empty() {
        match rustix::io::pwrite(fd, data, off) {
            Ok(0) => return Err(Errno::IO),
            Ok(n) => {
                data = &data[n..];
                off += n as u64;
            }
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Raises the open-files limit to its hard maximum: a deep parallel walk
/// keeps one descriptor per directory with work still pending.
pub fn raise_fd_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut lim = getrlimit(Resource::Nofile);
    if lim.current != lim.maximum {
        lim.current = lim.maximum;
        let _ = setrlimit(Resource::Nofile, lim);
    }
}

/// Clears the process umask so created entries get exactly the modes asked
/// for; sluice sets every mode explicitly from the source. Returns the
/// user's umask, the one the process started with (a second job in the
/// same process, a watch pass say, would otherwise see the cleared 0).
pub fn clear_umask() -> u32 {
    static USER: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *USER.get_or_init(|| rustix::process::umask(Mode::empty()).bits())
}

/// Writes all dirty data out and drops the page cache (needs root), so a
/// measurement that follows reads from the disk.
pub fn drop_caches() {
    rustix::fs::sync();
    let _ = std::fs::write("/proc/sys/vm/drop_caches", "3");
}

/// The most memory this process has had resident (`VmHWM`), in bytes.
pub fn peak_rss() -> u64 {
    proc_kib("/proc/self/status", "VmHWM:")
}

/// CPU time this process has used so far, user and system, all threads.
pub fn process_cpu_time() -> std::time::Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    std::time::Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// The machine's memory (`MemTotal`), in bytes.
pub fn total_memory() -> u64 {
    proc_kib("/proc/meminfo", "MemTotal:")
}

/// A `NAME:  N kB` line of a /proc file, in bytes (0 when absent).
fn proc_kib(path: &str, key: &str) -> u64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024)
}

/// True when running with root's effective uid (owners and devices can be
/// preserved).
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Effective user and group ids: the owner of entries this process creates.
pub fn effective_ids() -> (u32, u32) {
    (
        rustix::process::geteuid().as_raw(),
        rustix::process::getegid().as_raw(),
    )
}

/// Borrow helper so callers can pass `&OwnedFd` where a `BorrowedFd` is wanted.
pub fn fd<F: AsFd>(f: &F) -> BorrowedFd<'_> {
    f.as_fd()
}

/// Points this process's standard output (descriptor 1) at `fd`: what
/// `sluice serve` does while a job runs there, so what the job prints
/// goes to its client rather than into the protocol's stream.
pub fn redirect_stdout(fd: BorrowedFd<'_>) -> Result<()> {
    rustix::stdio::dup2_stdout(fd)
}

#[cfg(test)]
mod tests {
    use super::{is_own_temp, is_temp_name, temp_tag};

    #[test]
    fn hidden_dir_names_are_own_temporaries_and_stable() {
        let name_of = |dir, name: &[u8]| {
            let mut out = [0u8; 64];
            super::hidden_dir_name(dir, name, &mut out)
                .to_bytes()
                .to_vec()
        };
        let a = name_of((8, 1, 42), b"photos");
        assert_eq!(a, name_of((8, 1, 42), b"photos"));
        assert_ne!(a, name_of((8, 1, 42), b"photoz"));
        assert_ne!(a, name_of((8, 1, 43), b"photos"));
        assert!(is_temp_name(&a) && super::is_hidden_dir_name(&a));
        assert!(is_own_temp(&a, (8, 1, 42)));
        assert!(!is_own_temp(&a, (8, 1, 43)));
        assert!(!super::is_hidden_dir_name(b".sluice-1a2b-0-ff.tmp"));
    }

    #[test]
    fn temp_names_are_recognised_exactly() {
        assert!(is_temp_name(b".sluice-1a2b-0.tmp"));
        assert!(is_temp_name(b".sluice-ff-12ab.tmp"));
        assert!(!is_temp_name(b".sluice-1a2b.tmp"));
        assert!(!is_temp_name(b".sluice--1.tmp"));
        assert!(!is_temp_name(b".sluice-xyz-1.tmp"));
        assert!(!is_temp_name(b"sluice-1-2.tmp"));
        assert!(!is_temp_name(b".sluice-1-2.tmp.bak"));
        assert!(is_temp_name(b".sluice-1-2-ab.tmp"));
        assert!(!is_temp_name(b".sluice-1-2-3-4.tmp"));
    }

    #[test]
    fn no_wrapper_resolves_more_than_one_component() {
        let dir = std::fs::File::open("/").unwrap();
        let d = super::fd(&dir);
        for bad in [c"usr/bin", c"..", c"", c"/etc"] {
            assert_eq!(
                super::stat_at(d, bad).err(),
                Some(super::Errno::INVAL),
                "{bad:?}"
            );
            assert_eq!(
                super::open_dir_at(d, bad).err(),
                Some(super::Errno::INVAL),
                "{bad:?}"
            );
        }
        assert!(super::open_dir_at(d, c"usr").is_ok());
        assert!(super::open_dir_beneath(d, b"usr/bin").is_ok());
        assert_eq!(
            super::open_dir_beneath(d, b"usr/../etc").err(),
            Some(super::Errno::INVAL)
        );
    }

    #[test]
    fn only_tagged_temporaries_of_this_directory_are_ours() {
        let dir = (8, 1, 1234);
        let tag = temp_tag(dir, 0x1a, 7);
        let name = format!(".sluice-1a-7-{tag:x}.tmp");
        assert!(is_own_temp(name.as_bytes(), dir));
        assert!(
            !is_own_temp(name.as_bytes(), (8, 1, 1235)),
            "another directory"
        );
        assert!(!is_own_temp(b".sluice-1a-7.tmp", dir), "untagged");
        let forged = format!(".sluice-1a-8-{tag:x}.tmp");
        assert!(!is_own_temp(forged.as_bytes(), dir), "tag of another name");
    }
}

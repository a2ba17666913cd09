//! A FUSE pass-through file system that delays every operation by a fixed
//! latency, the way a network share does: a test target on which one
//! stream is slow however fast the disk behind it is, and on which many
//! streams in flight pay off.
//!
//! Every request (lookup, create, each write of at most 128 KiB, setattr,
//! rename, ...) sleeps for the latency, then is done on the backing
//! directory. Requests are served by a pool of threads, so concurrent
//! requests overlap their latencies as they would on the wire.
//!
//! Node ids are the backing inode numbers (the backing root's swapped with
//! 1, which FUSE reserves for the root), so hard links keep one identity.

use fuser::{
    AccessFlags, BsdFileFlags, Config, Errno, FileAttr, FileHandle, FileType, Filesystem,
    FopenFlags, Generation, INodeNo, LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyLseek, ReplyOpen,
    ReplyStatfs, ReplyWrite, ReplyXattr, Request, SessionACL, TimeOrNow, WriteFlags,
};
use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::{self, File, Permissions};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirEntryExt, FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long the kernel may cache names and attributes.
const TTL: Duration = Duration::from_secs(1);

type Entries = Arc<Vec<(u64, FileType, OsString)>>;

pub struct LatencyFs {
    root: PathBuf,
    root_ino: u64,
    latency: Duration,
    /// Node id to a backing path (one of its names, for a hard link).
    paths: RwLock<HashMap<u64, PathBuf>>,
    files: RwLock<HashMap<u64, Arc<File>>>,
    dirs: Mutex<HashMap<u64, Entries>>,
    next_fh: AtomicU64,
    ops: Arc<AtomicU64>,
}

/// A mounted [`LatencyFs`]; unmounted on drop.
pub struct Mount {
    session: Option<fuser::BackgroundSession>,
    ops: Arc<AtomicU64>,
}

impl Mount {
    /// Requests served so far.
    pub fn ops(&self) -> u64 {
        self.ops.load(Relaxed)
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if let Some(s) = self.session.take() {
            let _ = s.umount_and_join();
        }
    }
}

/// Session options: any user may enter (as on a share), `threads`
/// requests in flight at once, each on its own `/dev/fuse` descriptor.
pub fn config(threads: usize) -> Config {
    let mut c = Config::default();
    c.mount_options = vec![
        MountOption::FSName("latencyfs".into()),
        MountOption::Subtype("latencyfs".into()),
    ];
    c.acl = SessionACL::All;
    c.n_threads = Some(threads.max(1));
    c.clone_fd = true;
    c
}

impl LatencyFs {
    pub fn new(backing: &Path, latency: Duration) -> io::Result<LatencyFs> {
        let root = fs::canonicalize(backing)?;
        let root_ino = fs::metadata(&root)?.ino();
        let paths = HashMap::from([(INodeNo::ROOT.0, root.clone())]);
        Ok(LatencyFs {
            root,
            root_ino,
            latency,
            paths: RwLock::new(paths),
            files: RwLock::new(HashMap::new()),
            dirs: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            ops: Arc::new(AtomicU64::new(0)),
        })
    }

    /// Mounts at `mountpoint`, served by `threads` threads in the
    /// background.
    pub fn mount(self, mountpoint: &Path, threads: usize) -> io::Result<Mount> {
        let ops = self.ops.clone();
        let session = fuser::spawn_mount(self, mountpoint, &config(threads))?;
        Ok(Mount {
            session: Some(session),
            ops,
        })
    }

    /// Requests served so far.
    pub fn ops(&self) -> Arc<AtomicU64> {
        self.ops.clone()
    }

    /// The round trip every request pays.
    fn wait(&self) {
        self.ops.fetch_add(1, Relaxed);
        if !self.latency.is_zero() {
            std::thread::sleep(self.latency);
        }
    }

    fn node(&self, ino: u64) -> u64 {
        if ino == self.root_ino {
            INodeNo::ROOT.0
        } else if ino == INodeNo::ROOT.0 {
            self.root_ino
        } else {
            ino
        }
    }

    fn path(&self, ino: INodeNo) -> Result<PathBuf, Errno> {
        let paths = self.paths.read().expect("paths");
        paths.get(&ino.0).cloned().ok_or(Errno::ENOENT)
    }

    fn child(&self, parent: INodeNo, name: &OsStr) -> Result<PathBuf, Errno> {
        Ok(self.path(parent)?.join(name))
    }

    fn file(&self, fh: FileHandle) -> Result<Arc<File>, Errno> {
        let files = self.files.read().expect("files");
        files.get(&fh.0).cloned().ok_or(Errno::EBADF)
    }

    fn attr(&self, m: &fs::Metadata) -> FileAttr {
        FileAttr {
            ino: INodeNo(self.node(m.ino())),
            size: m.size(),
            blocks: m.blocks(),
            atime: time(m.atime(), m.atime_nsec()),
            mtime: time(m.mtime(), m.mtime_nsec()),
            ctime: time(m.ctime(), m.ctime_nsec()),
            crtime: UNIX_EPOCH,
            kind: kind(m.mode()),
            perm: (m.mode() & 0o7777) as u16,
            nlink: m.nlink() as u32,
            uid: m.uid(),
            gid: m.gid(),
            rdev: m.rdev() as u32,
            blksize: m.blksize() as u32,
            flags: 0,
        }
    }

    /// Looks `path` up and remembers it as its node's name.
    fn entry(&self, path: PathBuf) -> Result<FileAttr, Errno> {
        let attr = self.attr(&fs::symlink_metadata(&path)?);
        self.paths.write().expect("paths").insert(attr.ino.0, path);
        Ok(attr)
    }

    /// A new entry gets exactly the requested mode (the server's umask must
    /// not narrow it) and the caller's owner, as on a share.
    fn created(&self, req: &Request, path: PathBuf, mode: u32) -> Result<FileAttr, Errno> {
        if kind(mode) != FileType::Symlink {
            fs::set_permissions(&path, Permissions::from_mode(mode & 0o7777))?;
        }
        if rustix::process::geteuid().is_root() {
            std::os::unix::fs::lchown(&path, Some(req.uid()), Some(req.gid()))?;
        }
        self.entry(path)
    }

    fn add_file(&self, f: File) -> FileHandle {
        let fh = self.next_fh.fetch_add(1, Relaxed);
        self.files.write().expect("files").insert(fh, Arc::new(f));
        FileHandle(fh)
    }

    #[allow(clippy::too_many_arguments)]
    fn do_setattr(
        &self,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        fh: Option<FileHandle>,
    ) -> Result<FileAttr, Errno> {
        let path = self.path(ino)?;
        if let Some(mode) = mode {
            fs::set_permissions(&path, Permissions::from_mode(mode & 0o7777))?;
        }
        if uid.is_some() || gid.is_some() {
            std::os::unix::fs::lchown(&path, uid, gid)?;
        }
        if let Some(size) = size {
            match fh.map(|fh| self.file(fh)) {
                Some(f) => f?.set_len(size)?,
                None => fs::OpenOptions::new()
                    .write(true)
                    .open(&path)?
                    .set_len(size)?,
            }
        }
        if atime.is_some() || mtime.is_some() {
            let times = rustix::fs::Timestamps {
                last_access: timespec(atime),
                last_modification: timespec(mtime),
            };
            rx(rustix::fs::utimensat(
                rustix::fs::CWD,
                &path,
                &times,
                rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
            ))?;
        }
        Ok(self.attr(&fs::symlink_metadata(&path)?))
    }

    fn do_rename(&self, old: &Path, new: &Path, flags: RenameFlags) -> Result<(), Errno> {
        let moved = fs::symlink_metadata(old)?;
        rx(rustix::fs::renameat_with(
            rustix::fs::CWD,
            old,
            rustix::fs::CWD,
            new,
            rustix::fs::RenameFlags::from_bits_retain(flags.bits()),
        ))?;
        let mut paths = self.paths.write().expect("paths");
        paths.insert(self.node(moved.ino()), new.to_path_buf());
        if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            let other = fs::symlink_metadata(old)?;
            paths.insert(self.node(other.ino()), old.to_path_buf());
        } else if moved.is_dir() {
            // Every name below the directory moved with it.
            for p in paths.values_mut() {
                if let Ok(rest) = p.strip_prefix(old) {
                    *p = new.join(rest);
                }
            }
        }
        Ok(())
    }

    fn list(&self, path: &Path) -> Result<Entries, Errno> {
        let mut v = vec![
            (
                self.node(fs::metadata(path)?.ino()),
                FileType::Directory,
                ".".into(),
            ),
            (INodeNo::ROOT.0, FileType::Directory, "..".into()),
        ];
        for e in fs::read_dir(path)? {
            let e = e?;
            let t = e.file_type()?;
            v.push((self.node(e.ino()), file_type(t), e.file_name()));
        }
        Ok(Arc::new(v))
    }
}

fn time(sec: i64, nsec: i64) -> SystemTime {
    if sec >= 0 {
        UNIX_EPOCH + Duration::new(sec as u64, nsec as u32)
    } else {
        UNIX_EPOCH - Duration::from_secs(sec.unsigned_abs()) + Duration::from_nanos(nsec as u64)
    }
}

fn timespec(t: Option<TimeOrNow>) -> rustix::fs::Timespec {
    let (tv_sec, tv_nsec) = match t {
        None => (0, rustix::fs::UTIME_OMIT),
        Some(TimeOrNow::Now) => (0, rustix::fs::UTIME_NOW),
        Some(TimeOrNow::SpecificTime(t)) => match t.duration_since(UNIX_EPOCH) {
            Ok(d) => (d.as_secs() as i64, d.subsec_nanos() as _),
            Err(e) => {
                let d = e.duration();
                let (s, n) = (d.as_secs() as i64, d.subsec_nanos());
                if n == 0 {
                    (-s, 0)
                } else {
                    (-s - 1, (1_000_000_000 - n) as _)
                }
            }
        },
    };
    rustix::fs::Timespec { tv_sec, tv_nsec }
}

fn kind(mode: u32) -> FileType {
    match mode & 0o170000 {
        0o040000 => FileType::Directory,
        0o120000 => FileType::Symlink,
        0o010000 => FileType::NamedPipe,
        0o020000 => FileType::CharDevice,
        0o060000 => FileType::BlockDevice,
        0o140000 => FileType::Socket,
        _ => FileType::RegularFile,
    }
}

fn file_type(t: fs::FileType) -> FileType {
    FileType::from_std(t).unwrap_or(FileType::RegularFile)
}

/// Opens with the caller's flags, less those that only mean something at
/// creation (the kernel has done that part).
fn open_flags(flags: i32) -> rustix::fs::OFlags {
    let f = rustix::fs::OFlags::from_bits_retain(flags as u32);
    f.difference(rustix::fs::OFlags::CREATE | rustix::fs::OFlags::EXCL | rustix::fs::OFlags::NOCTTY)
        | rustix::fs::OFlags::CLOEXEC
}

macro_rules! reply {
    ($reply:ident, $result:expr, |$v:ident| $ok:expr) => {
        match $result {
            Ok($v) => $ok,
            Err(e) => $reply.error(Errno::from(e)),
        }
    };
}

impl Filesystem for LatencyFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.wait();
        reply!(
            reply,
            self.child(parent, name).and_then(|p| self.entry(p)),
            |a| { reply.entry(&TTL, &a, Generation(0)) }
        );
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        self.wait();
        let m = match fh {
            Some(fh) => self.file(fh).and_then(|f| Ok(f.metadata()?)),
            None => self.path(ino).and_then(|p| Ok(fs::symlink_metadata(p)?)),
        };
        reply!(reply, m, |m| reply.attr(&TTL, &self.attr(&m)));
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        self.wait();
        let r = self.do_setattr(ino, mode, uid, gid, size, atime, mtime, fh);
        reply!(reply, r, |a| reply.attr(&TTL, &a));
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        self.wait();
        let r = self.path(ino).and_then(|p| Ok(fs::read_link(p)?));
        reply!(reply, r, |t| reply.data(t.as_os_str().as_bytes()));
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        self.wait();
        let r = self.child(parent, name).and_then(|p| {
            rx(rustix::fs::mknodat(
                rustix::fs::CWD,
                &p,
                rustix::fs::FileType::from_raw_mode(mode),
                rustix::fs::Mode::from_raw_mode(mode),
                rdev.into(),
            ))?;
            self.created(req, p, mode)
        });
        reply!(reply, r, |a| reply.entry(&TTL, &a, Generation(0)));
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        self.wait();
        let r = self.child(parent, name).and_then(|p| {
            fs::create_dir(&p)?;
            self.created(req, p, mode)
        });
        reply!(reply, r, |a| reply.entry(&TTL, &a, Generation(0)));
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.wait();
        let r = self
            .child(parent, name)
            .and_then(|p| Ok(fs::remove_file(p)?));
        reply!(reply, r, |_v| reply.ok());
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.wait();
        let r = self
            .child(parent, name)
            .and_then(|p| Ok(fs::remove_dir(p)?));
        reply!(reply, r, |_v| reply.ok());
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        self.wait();
        let r = self.child(parent, link_name).and_then(|p| {
            std::os::unix::fs::symlink(target, &p)?;
            self.created(req, p, 0o120777)
        });
        reply!(reply, r, |a| reply.entry(&TTL, &a, Generation(0)));
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        self.wait();
        let r = self.child(parent, name).and_then(|old| {
            let new = self.child(newparent, newname)?;
            self.do_rename(&old, &new, flags)
        });
        reply!(reply, r, |_v| reply.ok());
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.wait();
        let r = self.path(ino).and_then(|old| {
            let new = self.child(newparent, newname)?;
            fs::hard_link(old, &new)?;
            self.entry(new)
        });
        reply!(reply, r, |a| reply.entry(&TTL, &a, Generation(0)));
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.wait();
        let r = self.path(ino).and_then(|p| {
            let fd = rx(rustix::fs::open(
                &p,
                open_flags(flags.0),
                rustix::fs::Mode::empty(),
            ))?;
            Ok(self.add_file(File::from(fd)))
        });
        reply!(reply, r, |fh| reply.opened(fh, FopenFlags::empty()));
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        self.wait();
        let r = self.child(parent, name).and_then(|p| {
            let fd = rx(rustix::fs::open(
                &p,
                open_flags(flags) | rustix::fs::OFlags::CREATE | rustix::fs::OFlags::EXCL,
                rustix::fs::Mode::from_raw_mode(mode & 0o7777),
            ))?;
            let attr = self.created(req, p, mode)?;
            Ok((attr, self.add_file(File::from(fd))))
        });
        reply!(reply, r, |v| reply.created(
            &TTL,
            &v.0,
            Generation(0),
            v.1,
            FopenFlags::empty()
        ));
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.wait();
        let r = self.file(fh).and_then(|f| {
            let mut buf = vec![0; size as usize];
            let mut got = 0;
            while got < buf.len() {
                match f.read_at(&mut buf[got..], offset + got as u64)? {
                    0 => break,
                    n => got += n,
                }
            }
            buf.truncate(got);
            Ok(buf)
        });
        reply!(reply, r, |b| reply.data(&b));
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        self.wait();
        let r = self
            .file(fh)
            .and_then(|f| Ok(f.write_all_at(data, offset)?));
        reply!(reply, r, |_v| reply.written(data.len() as u32));
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.wait();
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.wait();
        self.files.write().expect("files").remove(&fh.0);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.wait();
        let r = self.file(fh).and_then(|f| {
            if datasync {
                f.sync_data()?
            } else {
                f.sync_all()?
            }
            Ok(())
        });
        reply!(reply, r, |_v| reply.ok());
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.wait();
        let r = self.path(ino).and_then(|p| self.list(&p)).map(|entries| {
            let fh = self.next_fh.fetch_add(1, Relaxed);
            self.dirs.lock().expect("dirs").insert(fh, entries);
            FileHandle(fh)
        });
        reply!(reply, r, |fh| reply.opened(fh, FopenFlags::empty()));
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        self.wait();
        let entries = self.dirs.lock().expect("dirs").get(&fh.0).cloned();
        let Some(entries) = entries else {
            return reply.error(Errno::EBADF);
        };
        for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(*ino), i as u64 + 1, *kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.wait();
        self.dirs.lock().expect("dirs").remove(&fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.wait();
        let r = self.path(ino).and_then(|p| Ok(File::open(p)?.sync_all()?));
        reply!(reply, r, |_v| reply.ok());
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        self.wait();
        reply!(reply, rx(rustix::fs::statvfs(&self.root)), |s| reply
            .statfs(
                s.f_blocks,
                s.f_bfree,
                s.f_bavail,
                s.f_files,
                s.f_ffree,
                s.f_bsize as u32,
                s.f_namemax as u32,
                s.f_frsize as u32
            ));
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        self.wait();
        let r = self.path(ino).and_then(|p| {
            let flags = rustix::fs::XattrFlags::from_bits_retain(flags as u32);
            rx(rustix::fs::lsetxattr(&p, name, value, flags))
        });
        reply!(reply, r, |_v| reply.ok());
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        self.wait();
        let r = self.path(ino).and_then(|p| {
            if size == 0 {
                return Ok(Err(rx(rustix::fs::lgetxattr_query(&p, name))?));
            }
            let mut buf = vec![0; size as usize];
            let n = rx(rustix::fs::lgetxattr(&p, name, &mut buf[..]))?;
            buf.truncate(n);
            Ok(Ok(buf))
        });
        reply!(reply, r, |v| match v {
            Ok(data) => reply.data(&data),
            Err(len) => reply.size(len as u32),
        });
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        self.wait();
        let r = self.path(ino).and_then(|p| {
            if size == 0 {
                return Ok(Err(rx(rustix::fs::llistxattr_query(&p))?));
            }
            let mut buf = vec![0; size as usize];
            let n = rx(rustix::fs::llistxattr(&p, &mut buf[..]))?;
            buf.truncate(n);
            Ok(Ok(buf))
        });
        reply!(reply, r, |v| match v {
            Ok(data) => reply.data(&data),
            Err(len) => reply.size(len as u32),
        });
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.wait();
        let r = self
            .path(ino)
            .and_then(|p| rx(rustix::fs::lremovexattr(&p, name)));
        reply!(reply, r, |_v| reply.ok());
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        self.wait();
        reply.ok();
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        self.wait();
        let r = self.file(fh).and_then(|f| {
            let mode = rustix::fs::FallocateFlags::from_bits_retain(mode as u32);
            rx(rustix::fs::fallocate(&*f, mode, offset, length))
        });
        reply!(reply, r, |_v| reply.ok());
    }

    fn lseek(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        self.wait();
        let r = self.file(fh).and_then(|f| {
            use rustix::fs::SeekFrom;
            let pos = match whence {
                3 => SeekFrom::Data(offset as u64),
                4 => SeekFrom::Hole(offset as u64),
                2 => SeekFrom::End(offset),
                _ => SeekFrom::Start(offset as u64),
            };
            rx(rustix::fs::seek(&*f, pos))
        });
        reply!(reply, r, |o| reply.offset(o as i64));
    }
}

/// A rustix result as a reply's errno.
fn rx<T>(r: rustix::io::Result<T>) -> Result<T, Errno> {
    r.map_err(|e| Errno::from_i32(e.raw_os_error()))
}

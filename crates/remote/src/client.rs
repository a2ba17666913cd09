//! The asking end: a [`Source`] whose tree is on another host, reached
//! through whatever carries `sluice serve --stdio`'s stdin and stdout
//! (ssh, as the binary sets it up).
//!
//! One connection (a [`Peer`]) carries every stream's requests, many in
//! flight at once. When it ends mid-job every call fails with
//! `ECONNRESET` and the job is stopped; the command says why and exits 2.

use crate::peer::{handshake, ConnectError, Handler, Peer};
use crate::wire::{self, Inline, Reply, Request, Root};
use sluice_engine::hash::{Digest, HashKind};
use sluice_engine::source::{
    Each, Far, ImageSrc, Open, Release, Source, SrcDir, SrcFile, SrcRoot, Wire, Xattrs,
};
use sluice_sys::{Errno, FsKind, Stat, XattrSet};
use sluice_walk::DirStream;
use std::collections::{HashMap, HashSet};
use std::ffi::{CStr, CString, OsStr};
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

/// Connects over `input`/`output` (the pipes of the remote shell that
/// started `sluice serve`): trades handshakes and starts the reader.
/// `on_lost` is told if the connection drops; `handler` gets the
/// messages of a job that runs at the other end.
pub fn connect(
    input: impl Read + Send + 'static,
    mut output: impl Write + Send + 'static,
    on_lost: impl Fn() + Send + Sync + 'static,
    handler: Handler,
) -> Result<Arc<Peer>, ConnectError> {
    let input =
        handshake(input, &mut output)?.ok_or(ConnectError::NoSluice { lines: Vec::new() })?;
    Peer::start(input, output, on_lost, handler).map_err(ConnectError::Io)
}

/// A tree on another host, as a [`Source`].
pub struct RemoteSource {
    conn: Arc<Peer>,
    /// `[user@]host`, for messages (`None`: the other end is the client,
    /// whose paths are written as given).
    login: Option<String>,
    kept: Arc<Kept>,
}

/// Handle numbers of files kept here (sent with a listing), apart from
/// the far end's numbers.
const KEPT: u64 = 1 << 63;

/// A small file sent with its directory's listing.
struct KeptFile {
    st: Stat,
    data: Vec<u8>,
    xattrs: Vec<(CString, Vec<u8>)>,
}

/// What listings sent along, until the engine opens it or drops the
/// directory: per directory handle, files and symlink targets by name,
/// and the names alone for [`Source::has`]; the kept files open now.
#[derive(Default)]
struct Along {
    files: HashMap<u64, HashMap<Vec<u8>, KeptFile>>,
    links: HashMap<u64, HashMap<Vec<u8>, Vec<u8>>>,
    names: HashMap<u64, Arc<HashSet<Vec<u8>>>>,
    open: HashMap<u64, Arc<KeptFile>>,
    /// Files open at the far end: what their open and reads told.
    far: HashMap<u64, FarFile>,
    /// Bytes of file data held above (sent along, not yet released).
    bytes: u64,
}

/// The most file data kept from listings at once: past it, listings are
/// asked for without contents until the engine has used some up (with
/// many streams listing at once, 8 MiB a listing would add up).
const KEPT_MOST: u64 = 32 << 20;

/// What the far end said of a file it opened for us.
struct FarFile {
    xattrs: Vec<(CString, Vec<u8>)>,
    /// Its stat at the open, replaced by the stat after a read, and kept
    /// once a read saw it differ from the open's: the source changed.
    st: Stat,
    read: bool,
    changed: bool,
}

/// Owns what listings sent along and releases handles: a dropped
/// directory takes its leftovers with it, a far handle is closed there.
struct Kept {
    conn: Arc<Peer>,
    along: Mutex<Along>,
    next: AtomicU64,
}

impl Release for Kept {
    fn release(&self, id: u64) {
        let mut along = self.along.lock().expect("kept");
        if id & KEPT != 0 {
            if let Some(f) = along.open.remove(&id) {
                along.bytes -= f.data.len() as u64;
            }
            return;
        }
        if let Some(files) = along.files.remove(&id) {
            along.bytes -= files.values().map(|f| f.data.len() as u64).sum::<u64>();
        }
        along.links.remove(&id);
        along.names.remove(&id);
        along.far.remove(&id);
        drop(along);
        self.conn.release(id);
    }
}

impl RemoteSource {
    pub fn new(conn: Arc<Peer>, login: Option<String>) -> RemoteSource {
        let kept = Arc::new(Kept {
            conn: conn.clone(),
            along: Mutex::default(),
            next: AtomicU64::new(KEPT),
        });
        RemoteSource { conn, login, kept }
    }

    fn far(&self, id: u64) -> Far {
        Far {
            id,
            owner: self.kept.clone(),
        }
    }

    /// A kept file, if `file` is one.
    fn kept(&self, file: &SrcFile) -> Option<Arc<KeptFile>> {
        let id = file.far_id().filter(|id| id & KEPT != 0)?;
        self.kept.along.lock().expect("kept").open.get(&id).cloned()
    }

    fn entries(&self, dir: u64, inline: u32) -> Result<Vec<wire::Entry>, Errno> {
        let req = Request::List { dir, inline };
        // A listing that brings its small files along is bulk data: on a
        // data stream, where there is one (the control connection is one
        // TCP flow, which a per-flow cap or a long round trip holds back).
        let reply = if inline > 0 {
            self.conn.call_bulk(req)?
        } else {
            self.conn.call(req)?
        };
        match reply {
            Reply::Entries(e) => Ok(e),
            r => unexpected(r),
        }
    }
}

/// Small files (and every symlink's target) travel with the listing of a
/// directory DST does not have.
const INLINE_MOST: u32 = 64 << 10;

/// A reply of a shape the request does not call for: the far end is not
/// speaking this protocol correctly.
fn unexpected<T>(_: Reply) -> Result<T, Errno> {
    Err(Errno::PROTO)
}

fn dir_id(dir: &SrcDir) -> Result<u64, Errno> {
    dir.far_id().ok_or(Errno::BADF)
}

fn file_id(file: &SrcFile) -> Result<u64, Errno> {
    file.far_id().ok_or(Errno::BADF)
}

impl Source for RemoteSource {
    fn open_root(&self, path: &Path) -> Result<SrcRoot, io::Error> {
        let req = Request::OpenRoot {
            path: path.as_os_str().as_bytes().to_vec(),
        };
        match self.conn.call(req).map_err(io::Error::from)? {
            Reply::Root(Root::Dir(id)) => Ok(SrcRoot::Dir(SrcDir::far(self.far(id)))),
            Reply::Root(Root::File {
                dir,
                name,
                st,
                real,
            }) => Ok(SrcRoot::File {
                dir: SrcDir::far(self.far(dir)),
                name: CString::new(name).map_err(io::Error::other)?,
                st,
                real: PathBuf::from(OsStr::from_bytes(&real)),
            }),
            Reply::RootErr(0, msg) => Err(io::Error::other(msg)),
            Reply::RootErr(raw, _) => Err(io::Error::from_raw_os_error(raw)),
            _ => Err(io::Error::from(Errno::PROTO)),
        }
    }

    fn open_image(&self, path: &Path, allow_mounted: bool) -> Result<ImageSrc, io::Error> {
        let req = Request::OpenImage {
            path: path.as_os_str().as_bytes().to_vec(),
            allow_mounted,
        };
        match self.conn.call(req).map_err(io::Error::from)? {
            Reply::Image {
                handle,
                st,
                size,
                device,
            } => Ok(ImageSrc {
                file: SrcFile::far(self.far(handle)),
                st,
                size,
                device,
            }),
            Reply::RootErr(0, msg) => Err(io::Error::other(msg)),
            Reply::RootErr(raw, _) => Err(io::Error::from_raw_os_error(raw)),
            _ => Err(io::Error::from(Errno::PROTO)),
        }
    }

    fn is_local(&self) -> bool {
        false
    }

    fn wire(&self) -> Option<Wire> {
        Some(self.conn.wire())
    }

    fn name(&self, path: &Path) -> PathBuf {
        let Some(login) = &self.login else {
            return path.to_owned();
        };
        let mut s = OsStr::new(login).to_os_string();
        s.push(":");
        s.push(path.as_os_str());
        PathBuf::from(s)
    }

    fn open_dir(&self, dir: &SrcDir, name: &CStr) -> Result<SrcDir, Errno> {
        let req = Request::OpenDir {
            dir: dir_id(dir)?,
            name: name.to_bytes().to_vec(),
        };
        match self.conn.call(req)? {
            Reply::Handle(id) => Ok(SrcDir::far(self.far(id))),
            r => unexpected(r),
        }
    }

    fn stat_dir(&self, dir: &SrcDir) -> Result<Stat, Errno> {
        match self.conn.call(Request::StatDir { dir: dir_id(dir)? })? {
            Reply::Stat(st) => Ok(st),
            r => unexpected(r),
        }
    }

    fn kind(&self, dir: &SrcDir) -> FsKind {
        let Ok(id) = dir_id(dir) else {
            return FsKind::Plain;
        };
        match self.conn.call(Request::Kind { dir: id }) {
            Ok(Reply::Kind(1)) => FsKind::NoBlocks,
            Ok(Reply::Kind(2)) => FsKind::Synthetic,
            _ => FsKind::Plain,
        }
    }

    fn list(
        &self,
        dir: &SrcDir,
        _buf: &mut DirStream,
        prefetch: bool,
        each: Each<'_>,
    ) -> Result<(), Errno> {
        let id = dir_id(dir)?;
        let room = self.kept.along.lock().expect("kept").bytes < KEPT_MOST;
        let entries = self.entries(id, if prefetch && room { INLINE_MOST } else { 0 })?;
        let mut listed = Vec::with_capacity(entries.len());
        {
            let mut along = self.kept.along.lock().expect("kept");
            for (name, is_dir, st, sent) in entries {
                // A name is one component: anything else is a far end
                // trying to lead the walk in a circle or out of DST.
                if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') {
                    return Err(Errno::PROTO);
                }
                let st = st.map_err(Errno::from_raw_os_error);
                match (sent, &st) {
                    (Some(Inline::File { data, xattrs }), Ok(st)) => {
                        let xattrs = wire::xattrs_in(xattrs)?;
                        along.bytes += data.len() as u64;
                        let file = KeptFile {
                            st: *st,
                            data,
                            xattrs,
                        };
                        along
                            .files
                            .entry(id)
                            .or_default()
                            .insert(name.clone(), file);
                    }
                    (Some(Inline::Link(target)), _) => {
                        along
                            .links
                            .entry(id)
                            .or_default()
                            .insert(name.clone(), target);
                    }
                    _ => {}
                }
                listed.push((name, is_dir, st));
            }
        }
        for (name, is_dir, st) in listed {
            let Ok(name) = CString::new(name) else {
                return Err(Errno::PROTO);
            };
            if !each(&name, is_dir, st) {
                break;
            }
        }
        Ok(())
    }

    fn has(&self, dir: &SrcDir, name: &CStr) -> Result<bool, Errno> {
        let id = dir_id(dir)?;
        let known = self
            .kept
            .along
            .lock()
            .expect("kept")
            .names
            .get(&id)
            .cloned();
        let names = match known {
            Some(n) => n,
            None => {
                let names: HashSet<Vec<u8>> =
                    self.entries(id, 0)?.into_iter().map(|e| e.0).collect();
                let names = Arc::new(names);
                let mut along = self.kept.along.lock().expect("kept");
                along.names.insert(id, names.clone());
                names
            }
        };
        Ok(names.contains(name.to_bytes()))
    }

    fn stat(&self, dir: &SrcDir, name: &CStr) -> Result<Stat, Errno> {
        let req = Request::Stat {
            dir: dir_id(dir)?,
            name: name.to_bytes().to_vec(),
        };
        match self.conn.call(req)? {
            Reply::Stat(st) => Ok(st),
            r => unexpected(r),
        }
    }

    fn read_link(&self, dir: &SrcDir, name: &CStr, _reuse: Vec<u8>) -> Result<CString, Errno> {
        let id = dir_id(dir)?;
        let sent = (self.kept.along.lock().expect("kept").links.get_mut(&id))
            .and_then(|links| links.remove(name.to_bytes()));
        if let Some(target) = sent {
            return CString::new(target).map_err(|_| Errno::PROTO);
        }
        let req = Request::ReadLink {
            dir: dir_id(dir)?,
            name: name.to_bytes().to_vec(),
        };
        match self.conn.call(req)? {
            Reply::Link(t) => CString::new(t).map_err(|_| Errno::PROTO),
            r => unexpected(r),
        }
    }

    fn open(&self, dir: &SrcDir, name: &CStr) -> Result<SrcFile, Errno> {
        let id = dir_id(dir)?;
        {
            let mut along = self.kept.along.lock().expect("kept");
            let sent = (along.files.get_mut(&id)).and_then(|files| files.remove(name.to_bytes()));
            if let Some(file) = sent {
                let kept = self.kept.next.fetch_add(1, Relaxed);
                along.open.insert(kept, Arc::new(file));
                return Ok(SrcFile::far(self.far(kept)));
            }
        }
        let req = Request::Open {
            dir: dir_id(dir)?,
            name: name.to_bytes().to_vec(),
        };
        match self.conn.call(req)? {
            Reply::Opened { handle, st, xattrs } => {
                let xattrs = wire::xattrs_in(xattrs)?;
                let file = FarFile {
                    xattrs,
                    st,
                    read: false,
                    changed: false,
                };
                self.kept
                    .along
                    .lock()
                    .expect("kept")
                    .far
                    .insert(handle, file);
                Ok(SrcFile::far(self.far(handle)))
            }
            r => unexpected(r),
        }
    }

    fn stat_file(&self, file: &SrcFile) -> Result<Stat, Errno> {
        if let Some(k) = self.kept(file) {
            return Ok(k.st);
        }
        // After a read, the stat that came with it (or the one that showed
        // a change) is as fresh as the copy needs.
        let id = file_id(file)?;
        let told = (self.kept.along.lock().expect("kept").far.get(&id))
            .filter(|f| f.read)
            .map(|f| f.st);
        if let Some(st) = told {
            return Ok(st);
        }
        match self.conn.call(Request::StatFile {
            file: file_id(file)?,
        })? {
            Reply::Stat(st) => Ok(st),
            r => unexpected(r),
        }
    }

    fn read_at(&self, file: &SrcFile, buf: &mut [u8], off: u64) -> Result<usize, Errno> {
        if let Some(k) = self.kept(file) {
            let from = (off as usize).min(k.data.len());
            let n = buf.len().min(k.data.len() - from);
            buf[..n].copy_from_slice(&k.data[from..from + n]);
            return Ok(n);
        }
        // Full reads, as a local read_full_at gives: short only at the end.
        let id = file_id(file)?;
        let mut done = 0;
        while done < buf.len() {
            let want = (buf.len() - done).min(wire::MAX_READ as usize);
            let (n, st) =
                self.conn
                    .read_into(id, off + done as u64, &mut buf[done..done + want])?;
            let mut along = self.kept.along.lock().expect("kept");
            if let Some(f) = along.far.get_mut(&id) {
                if !f.changed {
                    f.changed = (st.size, st.mtime) != (f.st.size, f.st.mtime);
                    f.st = st;
                }
                f.read = true;
            }
            drop(along);
            done += n;
            if n < want {
                break;
            }
        }
        Ok(done)
    }

    fn hash(
        &self,
        file: &SrcFile,
        off: u64,
        len: u64,
        _buf: &mut [u8],
        kind: HashKind,
    ) -> Result<(Digest, u64), Errno> {
        if let Some(k) = self.kept(file) {
            let from = (off as usize).min(k.data.len());
            let to = from
                .saturating_add(len.min(usize::MAX as u64) as usize)
                .min(k.data.len());
            let piece = &k.data[from..to];
            return Ok((sluice_engine::hash::digest(piece, kind), piece.len() as u64));
        }
        let req = Request::Hash {
            file: file_id(file)?,
            off,
            len,
            blake3: kind == HashKind::Blake3,
        };
        match self.conn.call_bulk(req)? {
            Reply::Digest(d, n) => Ok((Digest(d), n)),
            r => unexpected(r),
        }
    }

    fn xattrs(&self, of: Open<'_>, set: XattrSet) -> Result<Xattrs, Errno> {
        let takes = |n: &CString| set.takes(n.as_bytes());
        if let Open::File(f) = of {
            if let Some(k) = self.kept(f) {
                return Ok(k.xattrs.iter().filter(|(n, _)| takes(n)).cloned().collect());
            }
            let id = file_id(f)?;
            if let Some(far) = self.kept.along.lock().expect("kept").far.get(&id) {
                return Ok(far
                    .xattrs
                    .iter()
                    .filter(|(n, _)| takes(n))
                    .cloned()
                    .collect());
            }
        }
        let req = Request::Xattrs {
            handle: of.far_id().ok_or(Errno::BADF)?,
            acls: set == XattrSet::All,
        };
        match self.conn.call(req)? {
            Reply::Xattrs(list) => wire::xattrs_in(list),
            r => unexpected(r),
        }
    }
}

//! The asking end: a [`Source`] whose tree is on another host, reached
//! through whatever carries `sluice serve --stdio`'s stdin and stdout
//! (ssh, as the binary sets it up).
//!
//! One connection (a [`Peer`]) carries every stream's requests, many in
//! flight at once. When it ends mid-job every call fails with
//! `ECONNRESET` and the job is stopped; the command says why and exits 2.

use crate::peer::{handshake, ConnectError, Handler, Peer};
use crate::wire::{self, Reply, Request, Root};
use sluice_engine::hash::{Digest, HashKind};
use sluice_engine::source::{Each, Far, Open, Source, SrcDir, SrcFile, SrcRoot, Xattrs};
use sluice_sys::{Errno, FsKind, Stat, XattrSet};
use sluice_walk::DirStream;
use std::ffi::{CStr, CString, OsStr};
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

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
}

impl RemoteSource {
    pub fn new(conn: Arc<Peer>, login: Option<String>) -> RemoteSource {
        RemoteSource { conn, login }
    }

    fn far(&self, id: u64) -> Far {
        Far {
            id,
            owner: self.conn.clone(),
        }
    }
}

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

    fn is_local(&self) -> bool {
        false
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

    fn list(&self, dir: &SrcDir, _buf: &mut DirStream, each: Each<'_>) -> Result<(), Errno> {
        let entries = match self.conn.call(Request::List { dir: dir_id(dir)? })? {
            Reply::Entries(e) => e,
            r => return unexpected(r),
        };
        for (name, is_dir, st) in entries {
            let Ok(name) = CString::new(name) else {
                return Err(Errno::PROTO);
            };
            if !each(&name, is_dir, st.map_err(Errno::from_raw_os_error)) {
                break;
            }
        }
        Ok(())
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
        let req = Request::Open {
            dir: dir_id(dir)?,
            name: name.to_bytes().to_vec(),
        };
        match self.conn.call(req)? {
            Reply::Handle(id) => Ok(SrcFile::far(self.far(id))),
            r => unexpected(r),
        }
    }

    fn stat_file(&self, file: &SrcFile) -> Result<Stat, Errno> {
        match self.conn.call(Request::StatFile {
            file: file_id(file)?,
        })? {
            Reply::Stat(st) => Ok(st),
            r => unexpected(r),
        }
    }

    fn read_at(&self, file: &SrcFile, buf: &mut [u8], off: u64) -> Result<usize, Errno> {
        // Full reads, as a local read_full_at gives: short only at the end.
        let id = file_id(file)?;
        let mut done = 0;
        while done < buf.len() {
            let len = (buf.len() - done).min(wire::MAX_READ as usize) as u32;
            let req = Request::Read {
                file: id,
                off: off + done as u64,
                len,
            };
            let data = match self.conn.call(req)? {
                Reply::Data(d) if d.len() <= len as usize => d,
                r => return unexpected(r),
            };
            buf[done..done + data.len()].copy_from_slice(&data);
            done += data.len();
            if data.len() < len as usize {
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
        let req = Request::Hash {
            file: file_id(file)?,
            off,
            len,
            blake3: kind == HashKind::Blake3,
        };
        match self.conn.call(req)? {
            Reply::Digest(d, n) => Ok((Digest(d), n)),
            r => unexpected(r),
        }
    }

    fn xattrs(&self, of: Open<'_>, set: XattrSet) -> Result<Xattrs, Errno> {
        let req = Request::Xattrs {
            handle: of.far_id().ok_or(Errno::BADF)?,
            acls: set == XattrSet::All,
        };
        match self.conn.call(req)? {
            Reply::Xattrs(list) => list
                .into_iter()
                .map(|(n, v)| Ok((CString::new(n).map_err(|_| Errno::PROTO)?, v)))
                .collect(),
            r => unexpected(r),
        }
    }
}

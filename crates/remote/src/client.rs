//! The asking end: a [`Source`] whose tree is on another host, reached
//! through whatever carries `sluice serve --stdio`'s stdin and stdout
//! (ssh, as the binary sets it up).
//!
//! One connection carries every stream's requests: each call sends a
//! numbered request and waits for the reply with that number, which one
//! reader thread hands out, so as many requests are in flight as the job
//! has streams. When the connection ends mid-job every waiting and later
//! call fails with `ECONNRESET`, and `on_lost` is told once (the job is
//! stopped, and the command says why and exits 2).

use crate::wire::{self, Reply, Request, Root};
use sluice_engine::hash::{Digest, HashKind};
use sluice_engine::source::{Each, Far, Open, Release, Source, SrcDir, SrcFile, SrcRoot, Xattrs};
use sluice_sys::{Errno, FsKind, Stat, XattrSet};
use sluice_walk::DirStream;
use std::collections::HashMap;
use std::ffi::{CStr, CString, OsStr};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{mpsc, Arc, Mutex};

/// Why a connection could not be made.
#[derive(Debug)]
pub enum ConnectError {
    /// The far end closed before saying anything: `lines` is what it
    /// printed instead (a login banner, a shell's error).
    NoSluice {
        lines: Vec<String>,
    },
    /// It answered with another protocol.
    Version {
        theirs: u32,
        program: String,
    },
    Io(io::Error),
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnectError::NoSluice { lines } if lines.is_empty() => {
                write!(f, "the remote end closed before sluice answered")
            }
            ConnectError::NoSluice { lines } => write!(
                f,
                "the remote end printed {:?} instead of sluice's handshake (does a login \
                 script write to stdout?)",
                lines.join("\n")
            ),
            ConnectError::Version { theirs, program } => write!(
                f,
                "the remote end runs {program}, which speaks protocol {theirs}; this is \
                 sluice/{}, protocol {}: install the same version on both hosts",
                env!("CARGO_PKG_VERSION"),
                wire::PROTOCOL
            ),
            ConnectError::Io(e) => write!(f, "{e}"),
        }
    }
}

/// One connection to a `sluice serve`.
pub struct Conn {
    out: Mutex<Box<dyn Write + Send>>,
    waiting: Mutex<HashMap<u64, mpsc::SyncSender<Reply>>>,
    next: AtomicU64,
    lost: AtomicBool,
    why_lost: Mutex<Option<String>>,
    on_lost: Box<dyn Fn() + Send + Sync>,
}

impl Conn {
    /// Trades handshakes over `input`/`output` and starts the reader.
    pub fn start(
        input: impl Read + Send + 'static,
        mut output: impl Write + Send + 'static,
        on_lost: impl Fn() + Send + Sync + 'static,
    ) -> Result<Arc<Conn>, ConnectError> {
        output
            .write_all(wire::hello().as_bytes())
            .and_then(|()| output.flush())
            .map_err(ConnectError::Io)?;
        let mut input = BufReader::with_capacity(1 << 20, input);
        // Lines before the handshake are a login script's; a few are kept
        // for the message, then the far end is taken for not sluice.
        let mut lines = Vec::new();
        loop {
            let mut line = String::new();
            match input.read_line(&mut line) {
                Ok(0) => return Err(ConnectError::NoSluice { lines }),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                    return Err(ConnectError::NoSluice { lines })
                }
                Err(e) => return Err(ConnectError::Io(e)),
            }
            match wire::parse_hello(&line) {
                Some((n, _)) if n == wire::PROTOCOL => break,
                Some((theirs, program)) => {
                    return Err(ConnectError::Version {
                        theirs,
                        program: program.to_string(),
                    })
                }
                None if lines.len() < 20 => lines.push(line.trim_end().to_string()),
                None => return Err(ConnectError::NoSluice { lines }),
            }
        }
        let conn = Arc::new(Conn {
            out: Mutex::new(Box::new(output)),
            waiting: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
            lost: AtomicBool::new(false),
            why_lost: Mutex::new(None),
            on_lost: Box::new(on_lost),
        });
        let reader = conn.clone();
        std::thread::Builder::new()
            .name("remote-reader".into())
            .spawn(move || reader.read_replies(input))
            .map_err(ConnectError::Io)?;
        Ok(conn)
    }

    fn read_replies(&self, mut input: impl Read) {
        let mut frame = Vec::new();
        let why = loop {
            match wire::recv::<Reply>(&mut input, &mut frame) {
                Ok(Some((id, reply))) => {
                    let to = self.waiting.lock().expect("waiting").remove(&id);
                    if let Some(to) = to {
                        let _ = to.send(reply);
                    }
                }
                Ok(None) => break "the remote end closed the connection".to_string(),
                Err(e) => break format!("reading from the remote end: {e}"),
            }
        };
        self.lose(why);
    }

    fn lose(&self, why: String) {
        if self.lost.swap(true, Relaxed) {
            return;
        }
        self.why_lost.lock().expect("why").get_or_insert(why);
        // Every caller still waiting wakes up with an error.
        self.waiting.lock().expect("waiting").clear();
        (self.on_lost)();
    }

    /// Why the connection ended mid-job, if it did.
    pub fn lost(&self) -> Option<String> {
        if !self.lost.load(Relaxed) {
            return None;
        }
        self.why_lost.lock().expect("why").clone()
    }

    /// Ends the conversation: the far end reads the end of its input and
    /// exits; nothing is reported as lost from here on.
    pub fn hang_up(&self) {
        self.lost.store(true, Relaxed);
        *self.out.lock().expect("output") = Box::new(io::sink());
    }

    /// Sends `req` and waits for its reply.
    fn call(&self, req: &Request) -> Result<Reply, Errno> {
        if self.lost.load(Relaxed) {
            return Err(Errno::CONNRESET);
        }
        let id = self.next.fetch_add(1, Relaxed);
        let (tx, rx) = mpsc::sync_channel(1);
        self.waiting.lock().expect("waiting").insert(id, tx);
        let sent = wire::send(&mut *self.out.lock().expect("output"), id, req);
        if let Err(e) = sent {
            self.lose(format!("writing to the remote end: {e}"));
            return Err(Errno::CONNRESET);
        }
        match rx.recv() {
            Ok(Reply::Err(raw)) => Err(Errno::from_raw_os_error(raw)),
            Ok(reply) => Ok(reply),
            Err(_) => Err(Errno::CONNRESET),
        }
    }
}

impl Release for Conn {
    fn release(&self, id: u64) {
        if !self.lost.load(Relaxed) {
            let close = Request::Close { handle: id };
            let _ = wire::send(&mut *self.out.lock().expect("output"), 0, &close);
        }
    }
}

/// A tree on another host, as a [`Source`].
pub struct RemoteSource {
    conn: Arc<Conn>,
    /// `[user@]host`, for messages.
    login: String,
}

impl RemoteSource {
    pub fn new(conn: Arc<Conn>, login: String) -> RemoteSource {
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
        match self.conn.call(&req).map_err(io::Error::from)? {
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
        let mut s = OsStr::new(&self.login).to_os_string();
        s.push(":");
        s.push(path.as_os_str());
        PathBuf::from(s)
    }

    fn open_dir(&self, dir: &SrcDir, name: &CStr) -> Result<SrcDir, Errno> {
        let req = Request::OpenDir {
            dir: dir_id(dir)?,
            name: name.to_bytes().to_vec(),
        };
        match self.conn.call(&req)? {
            Reply::Handle(id) => Ok(SrcDir::far(self.far(id))),
            r => unexpected(r),
        }
    }

    fn stat_dir(&self, dir: &SrcDir) -> Result<Stat, Errno> {
        match self.conn.call(&Request::StatDir { dir: dir_id(dir)? })? {
            Reply::Stat(st) => Ok(st),
            r => unexpected(r),
        }
    }

    fn kind(&self, dir: &SrcDir) -> FsKind {
        let Ok(id) = dir_id(dir) else {
            return FsKind::Plain;
        };
        match self.conn.call(&Request::Kind { dir: id }) {
            Ok(Reply::Kind(1)) => FsKind::NoBlocks,
            Ok(Reply::Kind(2)) => FsKind::Synthetic,
            _ => FsKind::Plain,
        }
    }

    fn list(&self, dir: &SrcDir, _buf: &mut DirStream, each: Each<'_>) -> Result<(), Errno> {
        let entries = match self.conn.call(&Request::List { dir: dir_id(dir)? })? {
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
        match self.conn.call(&req)? {
            Reply::Stat(st) => Ok(st),
            r => unexpected(r),
        }
    }

    fn read_link(&self, dir: &SrcDir, name: &CStr, _reuse: Vec<u8>) -> Result<CString, Errno> {
        let req = Request::ReadLink {
            dir: dir_id(dir)?,
            name: name.to_bytes().to_vec(),
        };
        match self.conn.call(&req)? {
            Reply::Link(t) => CString::new(t).map_err(|_| Errno::PROTO),
            r => unexpected(r),
        }
    }

    fn open(&self, dir: &SrcDir, name: &CStr) -> Result<SrcFile, Errno> {
        let req = Request::Open {
            dir: dir_id(dir)?,
            name: name.to_bytes().to_vec(),
        };
        match self.conn.call(&req)? {
            Reply::Handle(id) => Ok(SrcFile::far(self.far(id))),
            r => unexpected(r),
        }
    }

    fn stat_file(&self, file: &SrcFile) -> Result<Stat, Errno> {
        match self.conn.call(&Request::StatFile {
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
            let data = match self.conn.call(&req)? {
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
        match self.conn.call(&req)? {
            Reply::Digest(d, n) => Ok((Digest(d), n)),
            r => unexpected(r),
        }
    }

    fn xattrs(&self, of: Open<'_>, set: XattrSet) -> Result<Xattrs, Errno> {
        let req = Request::Xattrs {
            handle: of.far_id().ok_or(Errno::BADF)?,
            acls: set == XattrSet::All,
        };
        match self.conn.call(&req)? {
            Reply::Xattrs(list) => list
                .into_iter()
                .map(|(n, v)| Ok((CString::new(n).map_err(|_| Errno::PROTO)?, v)))
                .collect(),
            r => unexpected(r),
        }
    }
}

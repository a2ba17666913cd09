//! `sluice serve --stdio`: answers a client's questions about the tree on
//! this host, on stdin/stdout.
//!
//! Requests are answered by a fixed pool of threads, so a client's many
//! streams each have a read (or a listing) in progress here at once; a
//! slow disk read does not hold up a quick `statx`. The serving side only
//! reads: it opens what it is asked to, by single names from handles it
//! gave out (the sys layer refuses `/` and `..` in a name), and writes
//! nothing anywhere.

use crate::wire::{self, Reply, Request, Root};
use sluice_engine::hash::HashKind;
use sluice_engine::source::{LocalSource, Open, Source, SrcDir, SrcFile, SrcRoot};
use sluice_sys::{AlignedBuf, Errno, FsKind, XattrSet};
use sluice_walk::DirStream;
use std::collections::HashMap;
use std::ffi::CStr;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{mpsc, Arc, Mutex};

/// Threads answering requests: more than a client's usual stream count,
/// so none waits for a thread while another waits for the disk.
const THREADS: usize = 32;

/// What a handle stands for.
enum Held {
    Dir(SrcDir),
    File(SrcFile),
}

struct Server<W> {
    out: Mutex<W>,
    held: Mutex<HashMap<u64, Arc<Held>>>,
    next: AtomicU64,
}

/// Serves one client on `input`/`output` until it hangs up. A client
/// speaking another protocol gets this side's handshake line (so it can
/// say which versions differ) and an error here.
pub fn serve<R, W>(input: R, mut output: W) -> io::Result<()>
where
    R: Read,
    W: Write + Send,
{
    output.write_all(wire::hello().as_bytes())?;
    output.flush()?;
    let mut input = BufReader::with_capacity(1 << 20, input);
    let mut line = String::new();
    input.read_line(&mut line)?;
    match wire::parse_hello(&line) {
        Some((n, _)) if n == wire::PROTOCOL => {}
        Some((n, program)) => {
            return Err(io::Error::other(format!(
                "the client ({program}) speaks protocol {n}, this sluice {}",
                wire::PROTOCOL
            )))
        }
        None if line.is_empty() => return Ok(()), // hung up at once
        None => return Err(io::Error::other("the client sent no sluice handshake")),
    }
    let server = Server {
        out: Mutex::new(output),
        held: Mutex::new(HashMap::new()),
        next: AtomicU64::new(1),
    };
    let (tx, rx) = mpsc::sync_channel::<(u64, Request)>(THREADS * 4);
    let rx = Mutex::new(rx);
    std::thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| {
                let mut list = DirStream::default();
                let mut buf = AlignedBuf::new(1 << 20);
                loop {
                    let next = rx.lock().expect("request queue").recv();
                    let Ok((id, req)) = next else { return };
                    if let Some(reply) = server.answer(req, &mut list, buf.as_mut_slice()) {
                        let mut out = server.out.lock().expect("output");
                        if wire::send(&mut *out, id, &reply).is_err() {
                            return; // the client is gone; reading stops too
                        }
                    }
                }
            });
        }
        let mut frame = Vec::new();
        let res = loop {
            match wire::recv::<Request>(&mut input, &mut frame) {
                Ok(Some(msg)) => {
                    if tx.send(msg).is_err() {
                        break Ok(());
                    }
                }
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            }
        };
        drop(tx);
        res
    })
}

impl<W> Server<W> {
    fn keep(&self, h: Held) -> u64 {
        let id = self.next.fetch_add(1, Relaxed);
        self.held.lock().expect("handles").insert(id, Arc::new(h));
        id
    }

    fn get(&self, id: u64) -> Result<Arc<Held>, Errno> {
        self.held
            .lock()
            .expect("handles")
            .get(&id)
            .cloned()
            .ok_or(Errno::BADF)
    }

    /// Runs `f` on the directory `id` stands for.
    fn on_dir<T>(&self, id: u64, f: impl FnOnce(&SrcDir) -> Result<T, Errno>) -> Result<T, Errno> {
        match &*self.get(id)? {
            Held::Dir(d) => f(d),
            Held::File(_) => Err(Errno::NOTDIR),
        }
    }

    /// Runs `f` on the file `id` stands for.
    fn on_file<T>(
        &self,
        id: u64,
        f: impl FnOnce(&SrcFile) -> Result<T, Errno>,
    ) -> Result<T, Errno> {
        match &*self.get(id)? {
            Held::File(file) => f(file),
            Held::Dir(_) => Err(Errno::ISDIR),
        }
    }

    /// Answers one request (`None` for those that get no reply).
    fn answer(&self, req: Request, list: &mut DirStream, buf: &mut [u8]) -> Option<Reply> {
        let res = match req {
            Request::Close { handle } => {
                self.held.lock().expect("handles").remove(&handle);
                return None;
            }
            Request::OpenRoot { path } => return Some(self.open_root(&path)),
            other => self.call(other, list, buf),
        };
        Some(res.unwrap_or_else(|e| Reply::Err(e.raw_os_error())))
    }

    fn open_root(&self, path: &[u8]) -> Reply {
        let path = Path::new(std::ffi::OsStr::from_bytes(path));
        match LocalSource.open_root(path) {
            Ok(SrcRoot::Dir(d)) => Reply::Root(Root::Dir(self.keep(Held::Dir(d)))),
            Ok(SrcRoot::File {
                dir,
                name,
                st,
                real,
            }) => Reply::Root(Root::File {
                dir: self.keep(Held::Dir(dir)),
                name: name.into_bytes(),
                st,
                real: real.into_os_string().into_vec(),
            }),
            Err(e) => Reply::RootErr(e.raw_os_error().unwrap_or(0), e.to_string()),
        }
    }

    fn call(&self, req: Request, list: &mut DirStream, buf: &mut [u8]) -> Result<Reply, Errno> {
        let src = LocalSource;
        let name = |n: Vec<u8>| std::ffi::CString::new(n).map_err(|_| Errno::INVAL);
        Ok(match req {
            Request::OpenDir { dir, name: n } => {
                let d = self.on_dir(dir, |d| src.open_dir(d, &name(n)?))?;
                Reply::Handle(self.keep(Held::Dir(d)))
            }
            Request::StatDir { dir } => Reply::Stat(self.on_dir(dir, |d| src.stat_dir(d))?),
            Request::Kind { dir } => Reply::Kind(match self.on_dir(dir, |d| Ok(src.kind(d)))? {
                FsKind::Plain => 0,
                FsKind::NoBlocks => 1,
                FsKind::Synthetic => 2,
            }),
            Request::List { dir } => Reply::Entries(self.on_dir(dir, |d| {
                let mut entries = Vec::new();
                src.list(d, list, &mut |n: &CStr, is_dir, st| {
                    let st = st.map_err(|e| e.raw_os_error());
                    entries.push((n.to_bytes().to_vec(), is_dir, st));
                    true
                })?;
                Ok(entries)
            })?),
            Request::Stat { dir, name: n } => {
                Reply::Stat(self.on_dir(dir, |d| src.stat(d, &name(n)?))?)
            }
            Request::ReadLink { dir, name: n } => {
                let link = self.on_dir(dir, |d| src.read_link(d, &name(n)?, Vec::new()))?;
                Reply::Link(link.into_bytes())
            }
            Request::Open { dir, name: n } => {
                let f = self.on_dir(dir, |d| src.open(d, &name(n)?))?;
                Reply::Handle(self.keep(Held::File(f)))
            }
            Request::StatFile { file } => Reply::Stat(self.on_file(file, |f| src.stat_file(f))?),
            Request::Read { file, off, len } => Reply::Data(self.on_file(file, |f| {
                let mut data = vec![0u8; len.min(wire::MAX_READ) as usize];
                let n = src.read_at(f, &mut data, off)?;
                data.truncate(n);
                Ok(data)
            })?),
            Request::Hash {
                file,
                off,
                len,
                blake3,
            } => {
                let kind = if blake3 {
                    HashKind::Blake3
                } else {
                    HashKind::Xxh3
                };
                let (d, n) = self.on_file(file, |f| src.hash(f, off, len, buf, kind))?;
                Reply::Digest(d.0, n)
            }
            Request::Xattrs { handle, acls } => {
                let h = self.get(handle)?;
                let of = match &*h {
                    Held::Dir(d) => Open::Dir(d),
                    Held::File(f) => Open::File(f),
                };
                let set = if acls {
                    XattrSet::All
                } else {
                    XattrSet::NoAcls
                };
                let attrs = src.xattrs(of, set)?;
                Reply::Xattrs(
                    attrs
                        .into_iter()
                        .map(|(n, v)| (n.into_bytes(), v))
                        .collect(),
                )
            }
            Request::OpenRoot { .. } | Request::Close { .. } => unreachable!("answered above"),
        })
    }
}

//! What crosses the wire, and how.
//!
//! The two ends first trade one text line each, `sluice-protocol N
//! sluice/VERSION`: readable in a terminal, and what a login script that
//! prints a banner on stdout gets mixed up with, so the client can say
//! which (rsync's "is your shell clean?"). After it, every message is a
//! frame: a 4-byte little-endian length, then the message in postcard.
//! Requests carry a number the reply repeats, so many streams share one
//! channel with many requests in flight.

use serde::{Deserialize, Serialize};
use sluice_sys::Stat;
use std::ffi::CString;
use std::io::{self, Read, Write};

/// Bumped whenever a message changes shape; both ends must agree.
pub const PROTOCOL: u32 = 4;

/// The largest frame either end accepts (a directory of a few hundred
/// thousand entries, or one read).
pub const MAX_FRAME: usize = 256 << 20;

/// The most one read asks for.
pub const MAX_READ: u32 = 8 << 20;

/// The handshake line this build sends.
pub fn hello() -> String {
    format!(
        "sluice-protocol {PROTOCOL} sluice/{}\n",
        env!("CARGO_PKG_VERSION")
    )
}

/// The protocol number and program a handshake line names, if it is one.
pub fn parse_hello(line: &str) -> Option<(u32, &str)> {
    let mut words = line.trim_end().split(' ');
    if words.next()? != "sluice-protocol" {
        return None;
    }
    let n = words.next()?.parse().ok()?;
    Some((n, words.next().unwrap_or("sluice/?")))
}

/// A question to the side that has SRC.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Request {
    /// SRC's root, as the user named it (symlinks followed).
    OpenRoot {
        path: Vec<u8>,
    },
    OpenDir {
        dir: u64,
        name: Vec<u8>,
    },
    StatDir {
        dir: u64,
    },
    Kind {
        dir: u64,
    },
    /// Every entry of a directory, with its stat, in one reply; with
    /// `inline` > 0 also the contents (and extended attributes) of regular
    /// files up to that size and symlinks' targets, within a budget.
    List {
        dir: u64,
        inline: u32,
    },
    Stat {
        dir: u64,
        name: Vec<u8>,
    },
    ReadLink {
        dir: u64,
        name: Vec<u8>,
    },
    Open {
        dir: u64,
        name: Vec<u8>,
    },
    StatFile {
        file: u64,
    },
    Read {
        file: u64,
        off: u64,
        len: u32,
    },
    Hash {
        file: u64,
        off: u64,
        len: u64,
        blake3: bool,
    },
    Xattrs {
        handle: u64,
        acls: bool,
    },
    /// The handle is no longer needed (no reply).
    Close {
        handle: u64,
    },
    /// SRC of `sluice image`: a block device or a regular file (since
    /// protocol 2).
    OpenImage {
        path: Vec<u8>,
        allow_mounted: bool,
    },
    /// Listen for `n` data streams (see `streams`); the listening end
    /// answers reads on them if `answer_here`, else asks on them.
    Listen {
        n: u32,
        encrypt: bool,
        answer_here: bool,
        /// The end that asks on the streams adds streams while more of
        /// them carry more (`--streams` not given).
        tune: bool,
    },
    /// From the end that asks on the data streams to the end that opens
    /// them: open `n` more. Not answered.
    MoreStreams {
        n: u32,
    },
    /// How hard the answering end has worked so far (for the verdict on
    /// what bounded the job).
    Load,
}

/// SRC's root: a directory, or a file in a directory.
#[derive(Debug, Serialize, Deserialize)]
pub enum Root {
    Dir(u64),
    File {
        dir: u64,
        name: Vec<u8>,
        st: Stat,
        real: Vec<u8>,
    },
}

/// One listed entry: name, whether the listing says directory, its stat
/// or the errno `statx` gave, and what was sent along.
pub type Entry = (Vec<u8>, bool, Result<Stat, i32>, Option<Inline>);

/// An entry's content sent with its listing, so a small file costs no
/// exchange of its own.
#[derive(Debug, Serialize, Deserialize)]
pub enum Inline {
    /// A regular file's bytes (as of the stat listed) and its extended
    /// attributes, ACLs included.
    File { data: Vec<u8>, xattrs: WireXattrs },
    /// A symlink's target.
    Link(Vec<u8>),
}

/// The most file data one listing carries inline.
pub const INLINE_BUDGET: usize = 8 << 20;

/// Extended attributes as they cross the wire: names and values.
pub type WireXattrs = Vec<(Vec<u8>, Vec<u8>)>;

/// Attributes read here, for the wire.
pub fn xattrs_out(attrs: Vec<(CString, Vec<u8>)>) -> WireXattrs {
    attrs
        .into_iter()
        .map(|(n, v)| (n.into_bytes(), v))
        .collect()
}

/// Attributes from the wire; a name with a NUL in it is the far end
/// speaking the protocol wrongly.
pub fn xattrs_in(attrs: WireXattrs) -> Result<Vec<(CString, Vec<u8>)>, sluice_sys::Errno> {
    attrs
        .into_iter()
        .map(|(n, v)| Ok((CString::new(n).map_err(|_| sluice_sys::Errno::PROTO)?, v)))
        .collect()
}

/// An answer.
#[derive(Debug, Serialize, Deserialize)]
pub enum Reply {
    Root(Root),
    Handle(u64),
    Stat(Stat),
    /// `sluice_sys::FsKind` as 0 plain, 1 no blocks, 2 synthetic.
    Kind(u8),
    Entries(Vec<Entry>),
    Link(Vec<u8>),
    /// A file opened: its handle, its stat and extended attributes (ACLs
    /// included) as of the open, so copying it needs no other exchange
    /// than its reads.
    Opened {
        handle: u64,
        st: Stat,
        xattrs: WireXattrs,
    },
    /// Bytes read, and the file's stat after reading them: what the
    /// client checks for a source that changed during the copy.
    Data(Vec<u8>, Stat),
    Digest([u8; 32], u64),
    Xattrs(WireXattrs),
    /// The call failed with this errno.
    Err(i32),
    /// Opening the root failed: errno (0 when none) and what happened.
    RootErr(i32, String),
    /// SRC of an image opened: its handle, stat, size (a device's too)
    /// and whether it is a block device.
    Image {
        handle: u64,
        st: Stat,
        size: u64,
        device: bool,
    },
    /// Where and how to open the data streams asked for.
    Listening(crate::streams::Offer),
    /// Nanoseconds the answering threads spent in the file system, the
    /// process's CPU nanoseconds, and the host's cores.
    Load {
        disk_ns: u64,
        cpu_ns: u64,
        cores: u32,
    },
}

/// Every frame's message, either way.
#[derive(Debug, Serialize, Deserialize)]
pub enum Msg {
    /// A question about the sender's peer's SRC.
    Req(Request),
    /// The answer to the request of the frame's number.
    Rep(Reply),
    /// A copy to this host (push): the client's command line, its SRC
    /// read back across this connection, its DST here.
    Job(Vec<Vec<u8>>),
    /// What the job run here printed on its stdout, for the client's.
    Out(Vec<u8>),
    /// The job run here ended with this exit code.
    Done(u8),
    /// Stop the job run here (the client was interrupted).
    Cancel,
}

/// Writes one frame.
pub fn send<T: Serialize>(w: &mut impl Write, id: u64, msg: &T) -> io::Result<()> {
    let mut buf = vec![0u8; 4];
    buf = postcard::to_extend(&(id, msg), buf).map_err(io::Error::other)?;
    let len = u32::try_from(buf.len() - 4).map_err(io::Error::other)?;
    buf[..4].copy_from_slice(&len.to_le_bytes());
    w.write_all(&buf)?;
    w.flush()
}

/// postcard's integer encoding: 7 bits a byte, low first.
fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn read_varint(b: &[u8]) -> Option<(u64, usize)> {
    let mut v = 0u64;
    for (i, &byte) in b.iter().enumerate().take(10) {
        v |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some((v, i + 1));
        }
    }
    None
}

/// The bytes that follow a frame's number when it holds
/// `Msg::Rep(Reply::Data(..))`: the two variant indices, as postcard
/// writes them (taken from postcard itself, once).
fn data_tags() -> &'static [u8] {
    static TAGS: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    TAGS.get_or_init(|| {
        let st = Stat::default();
        let msg = (0u64, Msg::Rep(Reply::Data(Vec::new(), st)));
        let all = postcard::to_allocvec(&msg).expect("encodes");
        let stat = postcard::to_allocvec(&st).expect("encodes");
        // id 0 (one byte), the tags, an empty byte string (one byte), the stat
        all[1..all.len() - stat.len() - 1].to_vec()
    })
}

/// Writes a `Data` reply around `data`, which is written as it is rather
/// than copied into a frame first (a read is megabytes).
pub fn send_data(w: &mut impl Write, id: u64, data: &[u8], st: &Stat) -> io::Result<()> {
    let stat = postcard::to_allocvec(st).map_err(io::Error::other)?;
    let mut head = vec![0u8; 4];
    varint(id, &mut head);
    head.extend_from_slice(data_tags());
    varint(data.len() as u64, &mut head);
    let len = u32::try_from(head.len() - 4 + data.len() + stat.len()).map_err(io::Error::other)?;
    head[..4].copy_from_slice(&len.to_le_bytes());
    w.write_all(&head)?;
    w.write_all(data)?;
    w.write_all(&stat)?;
    w.flush()
}

/// If the frame in `buf` is a `Data` reply: its number, where the bytes
/// are in `buf`, and the stat that came with them.
pub fn data_reply(buf: &[u8]) -> Option<(u64, std::ops::Range<usize>, Stat)> {
    let (id, n) = read_varint(buf)?;
    let tags = data_tags();
    let rest = buf.get(n..)?.strip_prefix(tags)?;
    let (len, m) = read_varint(rest)?;
    let start = n + tags.len() + m;
    let end = start.checked_add(usize::try_from(len).ok()?)?;
    let st = postcard::from_bytes(buf.get(end..)?).ok()?;
    Some((id, start..end, st))
}

/// Reads one frame into `buf` whole; false at a clean end of the stream.
pub fn recv_raw(r: &mut impl Read, buf: &mut Vec<u8>) -> io::Result<bool> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(false),
        Err(e) => return Err(e),
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a frame of {len} bytes (the most is {MAX_FRAME})"),
        ));
    }
    buf.resize(len, 0);
    r.read_exact(buf)?;
    Ok(true)
}

/// Decodes a frame [`recv_raw`] read.
pub fn decode<T: for<'de> Deserialize<'de>>(buf: &[u8]) -> io::Result<(u64, T)> {
    postcard::from_bytes(buf).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Reads and decodes one frame; `Ok(None)` at a clean end of the stream.
pub fn recv<T: for<'de> Deserialize<'de>>(
    r: &mut impl Read,
    buf: &mut Vec<u8>,
) -> io::Result<Option<(u64, T)>> {
    if !recv_raw(r, buf)? {
        return Ok(None);
    }
    decode(buf).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        let mut pipe = Vec::new();
        send(
            &mut pipe,
            7,
            &Request::Read {
                file: 3,
                off: 1 << 40,
                len: 4096,
            },
        )
        .unwrap();
        send(&mut pipe, 8, &Request::Close { handle: 3 }).unwrap();
        let mut r = &pipe[..];
        let mut buf = Vec::new();
        match recv::<Request>(&mut r, &mut buf).unwrap() {
            Some((
                7,
                Request::Read {
                    file: 3,
                    off,
                    len: 4096,
                },
            )) => assert_eq!(off, 1 << 40),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            recv::<Request>(&mut r, &mut buf).unwrap(),
            Some((8, Request::Close { handle: 3 }))
        ));
        assert!(recv::<Request>(&mut r, &mut buf).unwrap().is_none());
    }

    #[test]
    fn a_data_reply_written_in_pieces_reads_back_in_place() {
        let st = Stat {
            mode: 0o100644,
            ino: 99,
            size: 300,
            mtime: (3, 4),
            ..Stat::default()
        };
        let data: Vec<u8> = (0..300u32).map(|i| i as u8).collect();
        let mut pipe = Vec::new();
        send_data(&mut pipe, 1 << 40, &data, &st).unwrap();
        let mut buf = Vec::new();
        assert!(recv_raw(&mut &pipe[..], &mut buf).unwrap());
        // What postcard itself decodes...
        match decode::<Msg>(&buf).unwrap() {
            (id, Msg::Rep(Reply::Data(d, s))) => {
                assert_eq!((id, &d, s), (1 << 40, &data, st));
            }
            other => panic!("{other:?}"),
        }
        // ...and what is read out without copying.
        let (id, at, s) = data_reply(&buf).unwrap();
        assert_eq!((id, &buf[at], s), (1 << 40, &data[..], st));
        // Other frames are not taken for data.
        let mut other = Vec::new();
        send(&mut other, 5, &Msg::Rep(Reply::Link(b"x".to_vec()))).unwrap();
        assert!(recv_raw(&mut &other[..], &mut buf).unwrap());
        assert!(data_reply(&buf).is_none());
    }

    #[test]
    fn handshake_lines() {
        assert_eq!(parse_hello(&hello()).map(|h| h.0), Some(PROTOCOL));
        assert_eq!(
            parse_hello("sluice-protocol 9 sluice/9.0\n"),
            Some((9, "sluice/9.0"))
        );
        assert_eq!(parse_hello("Welcome to host!\n"), None);
    }
}

//! One end of a connection, either end: it sends requests and waits for
//! their replies, answers the requests the other end sends about this
//! host's tree, and hands every other message to its owner.
//!
//! Each call sends a numbered request and waits for the reply with that
//! number, which one reader thread hands out, so as many requests are in
//! flight as the job has streams. Requests from the other end are
//! answered by a fixed pool of threads (started on the first one), so a
//! slow disk read does not hold up a quick `statx`; answering only reads,
//! opening what it is asked by single names from handles it gave out (the
//! sys layer refuses `/` and `..` in a name), and writes nothing. When
//! the connection ends, every waiting and later call fails with
//! `ECONNRESET` and `on_lost` is told once.

use crate::streams::{self, Stream};
use crate::wire::{self, Msg, Reply, Request, Root};
use sluice_engine::gauge::Load;
use sluice_engine::hash::HashKind;
use sluice_engine::source::{LocalSource, Open, Source, SrcDir, SrcFile, SrcRoot, Wire};
use sluice_sys::{AlignedBuf, Errno, FsKind, Stat, XattrSet};
use sluice_walk::DirStream;
use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{mpsc, Arc, Condvar, Mutex, OnceLock};
use std::time::Instant;

/// Threads answering requests: more than a client's usual stream count,
/// so none waits for a thread while another waits for the disk.
const THREADS: usize = 32;

/// The longest a data stream may be silent while an answer is awaited.
const STREAM_SILENCE: std::time::Duration = std::time::Duration::from_secs(60);

/// The most data streams the tuner grows to.
pub const MOST_STREAMS: usize = 32;

/// How long the end of a job waits for the far end to say how hard it
/// worked.
const LOAD_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// How often the tuner looks at the streams.
const TUNE_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

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
                write!(f, "the other end closed before sluice answered")
            }
            ConnectError::NoSluice { lines } => write!(
                f,
                "the other end printed {:?} instead of sluice's handshake (does a login \
                 script write to stdout?)",
                lines.join("\n")
            ),
            ConnectError::Version { theirs, program } => write!(
                f,
                "the other end runs {program}, which speaks protocol {theirs}; this is \
                 sluice/{}, protocol {}: install the same version on both hosts",
                env!("CARGO_PKG_VERSION"),
                wire::PROTOCOL
            ),
            ConnectError::Io(e) => write!(f, "{e}"),
        }
    }
}

/// Sends this end's handshake line and reads the other's. Lines before it
/// are a login script's: a few are kept for the message, then the other
/// end is taken for not sluice. `Ok(None)`: it hung up without a word
/// (taken as a clean end by a server).
pub fn handshake<R: Read>(
    input: R,
    output: &mut impl Write,
) -> Result<Option<BufReader<R>>, ConnectError> {
    // A far end that already exited (no sluice there, a login script that
    // printed and quit) refuses this write; what it printed says more
    // than the broken pipe, so it is read first.
    let wrote = output
        .write_all(wire::hello().as_bytes())
        .and_then(|()| output.flush());
    let mut input = BufReader::with_capacity(1 << 20, input);
    let mut lines = Vec::new();
    loop {
        let mut line = String::new();
        match input.read_line(&mut line) {
            Ok(0) if lines.is_empty() => return wrote.map(|()| None).map_err(ConnectError::Io),
            Ok(0) => return Err(ConnectError::NoSluice { lines }),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                return Err(ConnectError::NoSluice { lines })
            }
            Err(e) => return Err(ConnectError::Io(e)),
        }
        match wire::parse_hello(&line) {
            Some((n, _)) if n == wire::PROTOCOL => {
                return wrote.map(|()| Some(input)).map_err(ConnectError::Io)
            }
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
}

/// What the owner of a [`Peer`] is handed: every message that is neither
/// a request nor a reply.
pub type Handler = Box<dyn Fn(&Arc<Peer>, Msg) + Send + Sync>;

/// One end of a connection.
pub struct Peer {
    out: Mutex<Box<dyn Write + Send>>,
    waiting: Mutex<HashMap<u64, mpsc::SyncSender<Answer>>>,
    /// Frames read data came in, given back for the reader to fill again.
    frames: Mutex<Vec<Vec<u8>>>,
    /// Buffers for answering reads, reused.
    reads: Mutex<Vec<Vec<u8>>>,
    next: AtomicU64,
    /// Set once the end is noticed (so it is handled once), and `lost`
    /// only after the owner was told, so no call fails before the job
    /// knows why.
    losing: AtomicBool,
    lost: AtomicBool,
    why_lost: Mutex<Option<String>>,
    on_lost: Box<dyn Fn() + Send + Sync>,
    handler: Handler,
    /// Requests from the other end, for the answering pool.
    answer: OnceLock<mpsc::SyncSender<(u64, Request)>>,
    answers: Answers,
    /// The reader thread, joined by [`Peer::wait`].
    reader: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Data streams this end asks on.
    lanes: Lanes,
    /// What ends every data stream, either role: used when the connection
    /// ends, so no thread waits on one for ever.
    sockets: Mutex<Vec<streams::Closer>>,
    /// Told when a data stream breaks, at the end that opens them: one is
    /// opened in its place.
    stream_lost: Mutex<Option<mpsc::Sender<Opening>>>,
    /// This end asks on the streams and tunes how many there are.
    tuning: AtomicBool,
    tuner: std::sync::Once,
    /// Data streams this end asked on that broke.
    dropped: AtomicU64,
    /// Bytes received and sent, every connection of this peer together.
    counts: Arc<Counts>,
}

/// Bytes that crossed, counted as they are read and written.
#[derive(Default)]
struct Counts {
    received: AtomicU64,
    sent: AtomicU64,
}

/// A reader or writer whose bytes are counted.
struct Counted<T> {
    inner: T,
    counts: Arc<Counts>,
}

impl<T: Read> Read for Counted<T> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.counts.received.fetch_add(n as u64, Relaxed);
        Ok(n)
    }
}

impl<T: Write> Write for Counted<T> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.counts.sent.fetch_add(n as u64, Relaxed);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// What the end that opens data streams is asked to open.
enum Opening {
    /// One in place of one that broke.
    Replace,
    /// More, for the tuner.
    More(usize),
}

/// Grows the data streams this end asks on while more of them carry more:
/// when callers waited for a free stream (the streams, not the disks or
/// the engine, were what they waited on) for more than half the last
/// look's time, it asks for as many again; if the next look's
/// goodput is not 10% better, it stops there for the job. Streams that
/// carry nothing extra cost little (an idle socket each), so it never
/// takes any back.
fn tune_streams(peer: std::sync::Weak<Peer>) {
    let look = |p: &Peer| {
        (
            std::time::Instant::now(),
            p.counts.received.load(Relaxed),
            p.lanes.waited_ns.load(Relaxed),
        )
    };
    let Some(mut last) = peer.upgrade().map(|p| look(&p)) else {
        return;
    };
    // The last growth, until judged: goodput before it, the count it asked
    // for, and looks left for the streams to open.
    let mut judging: Option<(f64, usize, u32)> = None;
    loop {
        std::thread::sleep(TUNE_EVERY);
        let Some(p) = peer.upgrade() else { return };
        if p.losing.load(Relaxed) {
            return;
        }
        let now = look(&p);
        let secs = now.0.duration_since(last.0).as_secs_f64();
        let rate = (now.1 - last.1) as f64 / secs;
        let starved = (now.2 - last.2) as f64 / 1e9 / secs;
        last = now;
        let count = p.lanes.count.load(Relaxed);
        match judging {
            // Not all open yet: the window is not theirs (a relay is an
            // ssh login); a few looks, then judged as they are.
            Some((before, want, left)) if count < want && left > 0 => {
                judging = Some((before, want, left - 1));
                continue;
            }
            // Open: the next window is theirs.
            Some((before, _, left)) if left != u32::MAX => {
                judging = Some((before, 0, u32::MAX));
                continue;
            }
            Some((before, _, _)) => {
                judging = None;
                if rate < before * 1.1 {
                    return;
                }
            }
            None => {}
        }
        if starved > 0.5 && count > 0 && count < MOST_STREAMS {
            let more = count.min(MOST_STREAMS - count);
            judging = Some((rate, count + more, 6));
            p.want_streams(more);
        }
    }
}

/// Opens one data stream through its own process (an ssh connection of its
/// own), to the listener on the far host's port given.
pub type Relay = Arc<dyn Fn(u16) -> io::Result<streams::Pipe> + Send + Sync>;

/// How data streams reach the far end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// A TCP connection of their own.
    Direct,
    /// Each through its own ssh process, to the far end's loopback.
    Relayed,
}

/// Data streams to ask on, each carrying one request and its answer at a
/// time: a call takes the free one that has waited longest (so every
/// stream carries its share, and one that died is soon found out), or
/// waits for one.
struct Lanes {
    free: Mutex<std::collections::VecDeque<Lane>>,
    ready: Condvar,
    /// Streams still working (a broken one is dropped).
    count: AtomicUsize,
    /// Time callers spent waiting for a free stream, summed.
    waited_ns: AtomicU64,
}

struct Lane {
    stream: Counted<Stream>,
    /// The last answer's frame, reused.
    frame: Vec<u8>,
}

impl Peer {
    /// Starts the reader on `input` (after the handshake).
    pub fn start(
        input: impl Read + Send + 'static,
        output: impl Write + Send + 'static,
        on_lost: impl Fn() + Send + Sync + 'static,
        handler: Handler,
    ) -> io::Result<Arc<Peer>> {
        let counts = Arc::new(Counts::default());
        let input = Counted {
            inner: input,
            counts: counts.clone(),
        };
        let output = Counted {
            inner: output,
            counts: counts.clone(),
        };
        let peer = Arc::new(Peer {
            counts,
            out: Mutex::new(Box::new(output)),
            waiting: Mutex::new(HashMap::new()),
            frames: Mutex::new(Vec::new()),
            reads: Mutex::new(Vec::new()),
            next: AtomicU64::new(1),
            losing: AtomicBool::new(false),
            lost: AtomicBool::new(false),
            why_lost: Mutex::new(None),
            on_lost: Box::new(on_lost),
            handler,
            answer: OnceLock::new(),
            answers: Answers {
                held: Mutex::new(HashMap::new()),
                next: AtomicU64::new(1),
                disk_ns: AtomicU64::new(0),
            },
            reader: Mutex::new(None),
            lanes: Lanes {
                free: Mutex::new(std::collections::VecDeque::new()),
                ready: Condvar::new(),
                count: AtomicUsize::new(0),
                waited_ns: AtomicU64::new(0),
            },
            sockets: Mutex::new(Vec::new()),
            stream_lost: Mutex::new(None),
            tuning: AtomicBool::new(false),
            tuner: std::sync::Once::new(),
            dropped: AtomicU64::new(0),
        });
        let reader = peer.clone();
        let handle = std::thread::Builder::new()
            .name("peer-reader".into())
            .spawn(move || reader.read(input))?;
        *peer.reader.lock().expect("reader") = Some(handle);
        Ok(peer)
    }

    fn read(self: Arc<Self>, mut input: impl Read) {
        let mut frame = Vec::new();
        let why = loop {
            match wire::recv_raw(&mut input, &mut frame) {
                Ok(true) => {}
                Ok(false) => break "the other end closed the connection".to_string(),
                Err(e) => break format!("reading from the other end: {e}"),
            }
            // Read data goes to its caller in the frame it came in.
            if let Some((id, at, st)) = wire::data_reply(&frame) {
                let to = self.waiting.lock().expect("waiting").remove(&id);
                if let Some(to) = to {
                    let spare = self
                        .frames
                        .lock()
                        .expect("frames")
                        .pop()
                        .unwrap_or_default();
                    let frame = std::mem::replace(&mut frame, spare);
                    let _ = to.send(Answer::Data(frame, at, st));
                }
                continue;
            }
            match wire::decode::<Msg>(&frame) {
                Ok((id, Msg::Rep(reply))) => {
                    let to = self.waiting.lock().expect("waiting").remove(&id);
                    if let Some(to) = to {
                        let _ = to.send(Answer::Reply(reply));
                    }
                }
                Ok((id, Msg::Req(req))) => {
                    if self.answer_pool().send((id, req)).is_err() {
                        break "the answering threads stopped".to_string();
                    }
                }
                Ok((_, msg)) => (self.handler)(&self, msg),
                Err(e) => break format!("reading from the other end: {e}"),
            }
        };
        self.lose(why);
    }

    /// The queue of the answering pool, started on first use.
    fn answer_pool(self: &Arc<Self>) -> &mpsc::SyncSender<(u64, Request)> {
        self.answer.get_or_init(|| {
            let (tx, rx) = mpsc::sync_channel::<(u64, Request)>(THREADS * 4);
            let rx = Arc::new(Mutex::new(rx));
            for _ in 0..THREADS {
                let (peer, rx) = (Arc::downgrade(self), rx.clone());
                std::thread::spawn(move || {
                    let mut list = DirStream::default();
                    let mut buf = AlignedBuf::new(1 << 20);
                    loop {
                        let next = rx.lock().expect("request queue").recv();
                        let (Ok((id, req)), Some(peer)) = (next, peer.upgrade()) else {
                            return;
                        };
                        if let Request::Read { file, off, len } = req {
                            peer.answer_read(id, file, off, len);
                            continue;
                        }
                        if let Request::Listen {
                            n,
                            encrypt,
                            answer_here,
                            tune,
                        } = req
                        {
                            // Streams this end will ask on: it tunes them.
                            if tune && !answer_here {
                                peer.tuning.store(true, Relaxed);
                            }
                            peer.listen(id, n, encrypt, answer_here);
                            continue;
                        }
                        if let Request::MoreStreams { n } = req {
                            peer.open_more(Opening::More(n as usize));
                            continue;
                        }
                        let reply = peer.answers.answer(req, &mut list, buf.as_mut_slice());
                        if let Some(reply) = reply {
                            peer.send(id, &Msg::Rep(reply));
                        }
                    }
                });
            }
            tx
        })
    }

    fn lose(&self, why: String) {
        if self.losing.swap(true, Relaxed) {
            return;
        }
        self.why_lost.lock().expect("why").get_or_insert(why);
        // The owner first (the job is stopped), then every caller still
        // waiting wakes up with an error: a big file whose chunk fails now
        // sees a stopped job and keeps its temporary and journal record
        // for the rerun, rather than removing them as a failed file.
        (self.on_lost)();
        self.lost.store(true, Relaxed);
        self.waiting.lock().expect("waiting").clear();
        self.shut_streams();
    }

    /// Shuts every data stream down (threads reading one wake up).
    fn shut_streams(&self) {
        for s in self.sockets.lock().expect("sockets").drain(..) {
            s.close();
        }
        self.lanes.count.store(0, Relaxed);
        self.lanes.free.lock().expect("lanes").clear();
        self.lanes.ready.notify_all();
    }

    /// Why the connection ended mid-job, if it did.
    pub fn lost(&self) -> Option<String> {
        if !self.lost.load(Relaxed) {
            return None;
        }
        self.why_lost.lock().expect("why").clone()
    }

    /// Ends the conversation: the other end reads the end of its input;
    /// nothing is reported as lost from here on.
    pub fn hang_up(&self) {
        self.losing.store(true, Relaxed);
        self.lost.store(true, Relaxed);
        *self.out.lock().expect("output") = Box::new(io::sink());
        self.shut_streams();
    }

    /// Waits until the other end hangs up.
    pub fn wait(&self) {
        let reader = self.reader.lock().expect("reader").take();
        if let Some(r) = reader {
            let _ = r.join();
        }
    }

    /// Sends one message (a failure to write ends the connection).
    pub fn send(&self, id: u64, msg: &Msg) {
        let sent = wire::send(&mut *self.out.lock().expect("output"), id, msg);
        if let Err(e) = sent {
            self.lose(format!("writing to the other end: {e}"));
        }
    }

    /// Reads what a read request asks into `buf` (grown to fit): the byte
    /// count and the file's stat after the read.
    fn read_for(
        &self,
        buf: &mut Vec<u8>,
        file: u64,
        off: u64,
        len: u32,
    ) -> Result<(usize, Stat), Errno> {
        let len = len.min(wire::MAX_READ) as usize;
        if buf.len() < len {
            buf.resize(len, 0);
        }
        let src = LocalSource;
        let start = Instant::now();
        let read = self.answers.on_file(file, |f| {
            let n = src.read_at(f, &mut buf[..len], off)?;
            Ok((n, src.stat_file(f)?))
        });
        self.answers.spent(start);
        read
    }

    /// Answers a read: the bytes go from a reused buffer straight into
    /// the frame's writes, with the file's stat after them.
    fn answer_read(&self, id: u64, file: u64, off: u64, len: u32) {
        let mut buf = self.reads.lock().expect("reads").pop().unwrap_or_default();
        match self.read_for(&mut buf, file, off, len) {
            Ok((n, st)) => {
                let sent =
                    wire::send_data(&mut *self.out.lock().expect("output"), id, &buf[..n], &st);
                if let Err(e) = sent {
                    self.lose(format!("writing to the other end: {e}"));
                }
            }
            Err(e) => self.send(id, &Msg::Rep(Reply::Err(e.raw_os_error()))),
        }
        self.reads.lock().expect("reads").push(buf);
    }

    /// Answers the other end's `Listen`: a listener for its data streams,
    /// and where to reach it.
    fn listen(self: &Arc<Self>, id: u64, n: u32, encrypt: bool, answer_here: bool) {
        let peer = Arc::downgrade(self);
        let take = move |s: Stream| {
            if let Some(p) = peer.upgrade() {
                p.use_stream(s, !answer_here);
            }
        };
        let log = |m: String| eprintln!("sluice serve: {m}");
        let reply = match streams::listen(n as usize, encrypt, None, take, log) {
            Ok(mut offer) => {
                offer.ip = streams::ssh_server_ip();
                Reply::Listening(offer)
            }
            Err(e) => Reply::Err(e.raw_os_error().unwrap_or(Errno::IO.raw_os_error())),
        };
        self.send(id, &Msg::Rep(reply));
    }

    /// Asks the other end to listen for `n` data streams and opens them
    /// (to `host` unless it names its address), this end asking on them if
    /// `ask` (it reads the far end's files) or answering on them. Where no
    /// direct connection gets through, each stream goes through its own
    /// process from `relay(port)` (its own ssh connection, never a channel
    /// of the control one). Returns how many opened and how; an error says
    /// why none did. From then on, a stream that breaks is replaced the
    /// same way (a few times over: a link that keeps breaking them is left
    /// to the streams that stay, or to the control connection).
    ///
    /// With `tune`, the end that asks on them adds streams while more of
    /// them carry more (see [`tune_streams`]).
    pub fn open_streams(
        self: &Arc<Self>,
        n: usize,
        encrypt: bool,
        host: &str,
        ask: bool,
        tune: bool,
        relay: Relay,
    ) -> Result<(usize, Route), String> {
        if ask && tune {
            self.tuning.store(true, Relaxed);
        }
        let opened = self.connect_streams(n, encrypt, host, ask, tune, &*relay)?;
        let (tx, rx) = mpsc::channel::<Opening>();
        *self.stream_lost.lock().expect("stream lost") = Some(tx);
        let peer = Arc::downgrade(self);
        let host = host.to_string();
        let _ = std::thread::Builder::new()
            .name("data-reconnect".into())
            .spawn(move || {
                let mut replacements = 2 * n.max(2);
                for open in rx {
                    let k = match open {
                        Opening::Replace if replacements == 0 => continue,
                        Opening::Replace => {
                            replacements -= 1;
                            std::thread::sleep(std::time::Duration::from_millis(250));
                            1
                        }
                        Opening::More(k) => k.min(MOST_STREAMS),
                    };
                    let Some(p) = peer.upgrade() else { return };
                    if p.losing.load(Relaxed) {
                        return;
                    }
                    let _ = p.connect_streams(k, encrypt, &host, ask, tune, &*relay);
                }
            });
        Ok(opened)
    }

    /// A data stream broke: the end that opens them opens another.
    fn stream_lost(&self) {
        self.open_more(Opening::Replace);
    }

    /// Opens more data streams at the end that opens them (nothing
    /// elsewhere, nor once the connection is ending).
    fn open_more(&self, open: Opening) {
        if self.losing.load(Relaxed) {
            return;
        }
        if let Some(tx) = &*self.stream_lost.lock().expect("stream lost") {
            let _ = tx.send(open);
        }
    }

    /// The asking end wants `n` more streams: opened here if this end
    /// opens them, else asked of the other end.
    fn want_streams(&self, n: usize) {
        if self.stream_lost.lock().expect("stream lost").is_some() {
            self.open_more(Opening::More(n));
        } else {
            let id = self.next.fetch_add(1, Relaxed);
            self.send(id, &Msg::Req(Request::MoreStreams { n: n as u32 }));
        }
    }

    /// [`Peer::open_streams`], once.
    fn connect_streams(
        self: &Arc<Self>,
        n: usize,
        encrypt: bool,
        host: &str,
        ask: bool,
        tune: bool,
        relay: &(dyn Fn(u16) -> io::Result<streams::Pipe> + Send + Sync),
    ) -> Result<(usize, Route), String> {
        let req = Request::Listen {
            n: n as u32,
            encrypt,
            answer_here: ask,
            tune,
        };
        let offer = match self.call(req) {
            Ok(Reply::Listening(o)) => o,
            Ok(_) => return Err("the other end does not offer data streams".into()),
            Err(e) => return Err(format!("the other end could not listen: {e}")),
        };
        let direct = match streams::connect(&offer, host) {
            Ok(s) => Ok(s),
            Err(e) => {
                let at = offer.ip.as_deref().unwrap_or(host);
                Err(format!("connecting to {at} port {}: {e}", offer.port))
            }
        };
        let (first, route) = match direct {
            Ok(s) => (s, Route::Direct),
            Err(why) => {
                let pipe = relay(offer.port).map_err(|e| format!("{why}; relaying: {e}"))?;
                let s = streams::connect_over(&offer, pipe)
                    .map_err(|e| format!("{why}; relaying: {e}"))?;
                (s, Route::Relayed)
            }
        };
        self.use_stream(first, ask);
        // The rest at once: N ssh handshakes one after another would cost
        // N round trips of setup on a long link.
        let rest: Vec<io::Result<Stream>> = std::thread::scope(|s| {
            let opening: Vec<_> = (1..n)
                .map(|_| {
                    s.spawn(|| match route {
                        Route::Direct => streams::connect(&offer, host),
                        Route::Relayed => {
                            relay(offer.port).and_then(|p| streams::connect_over(&offer, p))
                        }
                    })
                })
                .collect();
            opening
                .into_iter()
                .map(|t| {
                    t.join()
                        .unwrap_or_else(|_| Err(io::Error::other("panicked")))
                })
                .collect()
        });
        let mut opened = 1;
        for s in rest.into_iter().flatten() {
            self.use_stream(s, ask);
            opened += 1;
        }
        Ok((opened, route))
    }

    /// Data streams this end asks on (0 once the connection ended), and
    /// the bytes that crossed every connection so far.
    pub fn wire(&self) -> Wire {
        // Asked before the counts are read, so its bytes are in them; not
        // waited on for long (the job is over: a far end that went quiet
        // must not hold its summary back).
        let far = match self.call_within(Request::Load, LOAD_WAIT) {
            Some(Reply::Load {
                disk_ns,
                cpu_ns,
                cores,
            }) => Some(Load {
                disk: disk_ns as f64 / 1e9,
                cpu: cpu_ns as f64 / 1e9,
                cores,
            }),
            _ => None, // no answer in time, or the connection is gone
        };
        Wire {
            streams: self.lanes.count.load(Relaxed),
            streams_dropped: self.dropped.load(Relaxed),
            bytes_received: self.counts.received.load(Relaxed),
            bytes_sent: self.counts.sent.load(Relaxed),
            far,
        }
    }

    /// Puts a data stream to work: to ask on, or answered on a thread.
    fn use_stream(self: &Arc<Self>, s: Stream, ask: bool) {
        if let Ok(closer) = s.closer() {
            self.sockets.lock().expect("sockets").push(closer);
        }
        if self.losing.load(Relaxed) {
            return;
        }
        if ask {
            // An answer that stops coming (a link that drops packets
            // rather than resetting) breaks the stream; its call is asked
            // elsewhere.
            let _ = s.set_read_timeout(Some(STREAM_SILENCE));
        }
        let s = Counted {
            inner: s,
            counts: self.counts.clone(),
        };
        if ask {
            self.lanes.free.lock().expect("lanes").push_back(Lane {
                stream: s,
                frame: Vec::new(),
            });
            self.lanes.count.fetch_add(1, Relaxed);
            self.lanes.ready.notify_one();
            if self.tuning.load(Relaxed) {
                self.tuner.call_once(|| {
                    let peer = Arc::downgrade(self);
                    let _ = std::thread::Builder::new()
                        .name("data-tuner".into())
                        .spawn(move || tune_streams(peer));
                });
            }
            return;
        }
        let peer = Arc::downgrade(self);
        let _ = std::thread::Builder::new()
            .name("data-stream".into())
            .spawn(move || answer_stream(peer, s));
    }

    /// Asks `req` on a data stream, if one works: `None` when none does
    /// (the caller asks on the control connection instead). A stream that
    /// fails mid-call is dropped, and the call is asked again elsewhere.
    fn on_lane<T>(
        &self,
        req: &Request,
        mut got: impl FnMut(&mut Lane, u64) -> Option<Result<T, Errno>>,
    ) -> Option<Result<T, Errno>> {
        loop {
            let mut lane = {
                let mut free = self.lanes.free.lock().expect("lanes");
                loop {
                    if self.lanes.count.load(Relaxed) == 0 {
                        return None;
                    }
                    if let Some(l) = free.pop_front() {
                        break l;
                    }
                    let since = std::time::Instant::now();
                    free = self.lanes.ready.wait(free).expect("lanes");
                    let waited = since.elapsed().as_nanos() as u64;
                    self.lanes.waited_ns.fetch_add(waited, Relaxed);
                }
            };
            let id = self.next.fetch_add(1, Relaxed);
            let sent = wire::send(&mut lane.stream, id, &Msg::Req(req.clone()))
                .and_then(|()| lane.stream.flush())
                .and_then(|()| {
                    if wire::recv_raw(&mut lane.stream, &mut lane.frame)? {
                        Ok(())
                    } else {
                        Err(io::ErrorKind::UnexpectedEof.into())
                    }
                });
            let answer = match sent {
                Ok(()) => got(&mut lane, id),
                Err(_) => None,
            };
            match answer {
                Some(a) => {
                    self.lanes.free.lock().expect("lanes").push_back(lane);
                    self.lanes.ready.notify_one();
                    return Some(a);
                }
                None => {
                    // Broken: dropped; the call goes to another stream,
                    // and one is opened in its place.
                    let _ = self
                        .lanes
                        .count
                        .fetch_update(Relaxed, Relaxed, |c| c.checked_sub(1));
                    self.lanes.ready.notify_all();
                    self.dropped.fetch_add(1, Relaxed);
                    self.stream_lost();
                }
            }
        }
    }

    /// Sends `req` on the control connection: its id, and where its
    /// answer will come (`None` once the connection is lost).
    fn post(&self, req: Request) -> Option<(u64, mpsc::Receiver<Answer>)> {
        if self.lost.load(Relaxed) {
            return None;
        }
        let id = self.next.fetch_add(1, Relaxed);
        let (tx, rx) = mpsc::sync_channel(1);
        self.waiting.lock().expect("waiting").insert(id, tx);
        self.send(id, &Msg::Req(req));
        Some((id, rx))
    }

    /// Sends `req` and waits at most `wait` for its reply.
    fn call_within(&self, req: Request, wait: std::time::Duration) -> Option<Reply> {
        let (id, rx) = self.post(req)?;
        let got = rx.recv_timeout(wait);
        // A reply after the wait finds no one and is dropped.
        self.waiting.lock().expect("waiting").remove(&id);
        match got {
            Ok(Answer::Reply(r)) => Some(r),
            _ => None,
        }
    }

    /// Sends `req` and waits for its answer.
    fn ask(&self, req: Request) -> Result<Answer, Errno> {
        let (_, rx) = self.post(req).ok_or(Errno::CONNRESET)?;
        match rx.recv() {
            Ok(Answer::Reply(Reply::Err(raw))) => Err(Errno::from_raw_os_error(raw)),
            Ok(answer) => Ok(answer),
            Err(_) => Err(Errno::CONNRESET),
        }
    }

    /// [`Peer::call`] for a request that reads file data (a hash, a
    /// listing with its small files): asked on a data stream when there
    /// is one.
    pub fn call_bulk(&self, req: Request) -> Result<Reply, Errno> {
        let on_lane = self.on_lane(&req, |lane, id| match wire::decode::<Msg>(&lane.frame) {
            Ok((rid, Msg::Rep(Reply::Err(raw)))) if rid == id => {
                Some(Err(Errno::from_raw_os_error(raw)))
            }
            Ok((rid, Msg::Rep(r))) if rid == id => Some(Ok(r)),
            _ => None,
        });
        match on_lane {
            Some(answer) => answer,
            None => self.call(req),
        }
    }

    /// Sends `req` and waits for its reply.
    pub fn call(&self, req: Request) -> Result<Reply, Errno> {
        match self.ask(req)? {
            Answer::Reply(r) => Ok(r),
            // Reads are asked with read_into; data here answers nothing.
            Answer::Data(..) => Err(Errno::PROTO),
        }
    }

    /// Reads up to `buf.len()` bytes of the far file `file` at `off` into
    /// `buf` (copied once, out of the frame they came in); returns how many
    /// and the file's stat after the read.
    pub fn read_into(&self, file: u64, off: u64, buf: &mut [u8]) -> Result<(usize, Stat), Errno> {
        let len = buf.len().min(wire::MAX_READ as usize) as u32;
        let req = Request::Read { file, off, len };
        let on_lane = self.on_lane(&req, |lane, id| match wire::data_reply(&lane.frame) {
            Some((rid, at, st)) if rid == id && at.len() <= len as usize => {
                let n = at.len();
                buf[..n].copy_from_slice(&lane.frame[at]);
                Some(Ok((n, st)))
            }
            Some(_) => None,
            None => match wire::decode::<Msg>(&lane.frame) {
                Ok((rid, Msg::Rep(Reply::Err(raw)))) if rid == id => {
                    Some(Err(Errno::from_raw_os_error(raw)))
                }
                _ => None,
            },
        });
        if let Some(answer) = on_lane {
            return answer;
        }
        match self.ask(Request::Read { file, off, len })? {
            Answer::Data(frame, at, st) if at.len() <= len as usize => {
                let n = at.len();
                buf[..n].copy_from_slice(&frame[at]);
                self.frames.lock().expect("frames").push(frame);
                Ok((n, st))
            }
            _ => Err(Errno::PROTO),
        }
    }
}

impl sluice_engine::source::Release for Peer {
    fn release(&self, id: u64) {
        if !self.lost.load(Relaxed) {
            self.send(0, &Msg::Req(Request::Close { handle: id }));
        }
    }
}

/// Answers the requests that come on a data stream, one at a time, until
/// it closes.
fn answer_stream(peer: std::sync::Weak<Peer>, mut s: Counted<Stream>) {
    let mut frame = Vec::new();
    let mut data = Vec::new();
    let mut list = DirStream::default();
    let mut buf = AlignedBuf::new(1 << 20);
    let broke = || {
        if let Some(p) = peer.upgrade() {
            p.stream_lost();
        }
    };
    while let Ok(true) = wire::recv_raw(&mut s, &mut frame) {
        let Some(peer) = peer.upgrade() else { return };
        let sent = match wire::decode::<Msg>(&frame) {
            Ok((id, Msg::Req(Request::Read { file, off, len }))) => {
                match peer.read_for(&mut data, file, off, len) {
                    Ok((n, st)) => wire::send_data(&mut s, id, &data[..n], &st),
                    Err(e) => wire::send(&mut s, id, &Msg::Rep(Reply::Err(e.raw_os_error()))),
                }
            }
            Ok((id, Msg::Req(req @ (Request::Hash { .. } | Request::List { .. })))) => {
                match peer.answers.answer(req, &mut list, buf.as_mut_slice()) {
                    Some(reply) => wire::send(&mut s, id, &Msg::Rep(reply)),
                    None => Ok(()),
                }
            }
            _ => return, // nothing else is asked on a data stream
        };
        if sent.and_then(|()| s.flush()).is_err() {
            return broke();
        }
    }
    broke()
}

/// Reads what goes along with a listing: the small regular files (up to
/// `most` bytes, within the listing's budget, in listing order) and the
/// symlinks' targets, on several threads, so a cold directory's files are
/// read with the disk's parallelism rather than one after another.
fn send_along(dir: &SrcDir, entries: &mut [wire::Entry], most: u32) {
    let mut budget = wire::INLINE_BUDGET as u64;
    let picks: Vec<usize> = (0..entries.len())
        .filter(|&i| match &entries[i].2 {
            Ok(st) if st.file_type() == sluice_sys::FileType::Symlink => true,
            Ok(st) if st.file_type() == sluice_sys::FileType::RegularFile => {
                let fits = st.size <= u64::from(most) && st.size <= budget;
                budget -= if fits { st.size } else { 0 };
                fits
            }
            _ => false,
        })
        .collect();
    if picks.is_empty() {
        return;
    }
    let threads = picks.len().div_ceil(16).clamp(1, 8);
    let found: Vec<(usize, Option<wire::Inline>)> = std::thread::scope(|s| {
        let entries = &*entries;
        let parts: Vec<_> = picks
            .chunks(picks.len().div_ceil(threads))
            .map(|part| {
                s.spawn(move || {
                    part.iter()
                        .map(|&i| {
                            let (name, _, st, _) = &entries[i];
                            let along = match (CString::new(name.as_slice()), st) {
                                (Ok(name), Ok(st)) => inline_entry(dir, &name, st),
                                _ => None,
                            };
                            (i, along)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        parts
            .into_iter()
            .flat_map(|p| p.join().unwrap_or_default())
            .collect()
    });
    for (i, along) in found {
        entries[i].3 = along;
    }
}

/// A small regular file's bytes and attributes, read whole and only if it
/// still has the listed size and mtime, or a symlink's target.
fn inline_entry(dir: &SrcDir, name: &CStr, st: &Stat) -> Option<wire::Inline> {
    let src = LocalSource;
    match st.file_type() {
        sluice_sys::FileType::Symlink => {
            let target = src.read_link(dir, name, Vec::new()).ok()?;
            Some(wire::Inline::Link(target.into_bytes()))
        }
        sluice_sys::FileType::RegularFile => {
            let size = st.size as usize;
            let file = src.open(dir, name).ok()?;
            // One byte more than listed: a file that grew is not sent.
            let mut data = vec![0u8; size + 1];
            let n = src.read_at(&file, &mut data, 0).ok()?;
            let now = src.stat_file(&file).ok()?;
            if n != size || now.size != st.size || now.mtime != st.mtime {
                return None;
            }
            data.truncate(n);
            let xattrs = src.xattrs(Open::File(&file), XattrSet::All).ok()?;
            Some(wire::Inline::File {
                data,
                xattrs: wire::xattrs_out(xattrs),
            })
        }
        _ => None,
    }
}

/// What a caller waiting on a request gets: a decoded reply, or the
/// frame a read's data came in (and where in it the data is).
enum Answer {
    Reply(Reply),
    Data(Vec<u8>, std::ops::Range<usize>, Stat),
}

/// What a handle stands for.
enum Held {
    Dir(SrcDir),
    File(SrcFile),
}

/// The handles this end gave out, and the answering itself.
struct Answers {
    held: Mutex<HashMap<u64, Arc<Held>>>,
    next: AtomicU64,
    /// Time spent in the file system answering, summed over threads.
    disk_ns: AtomicU64,
}

impl Answers {
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
        let start = Instant::now();
        let reply = self.answer_untimed(req, list, buf);
        self.spent(start);
        reply
    }

    /// Counts the time since `start` as spent in the file system.
    fn spent(&self, start: Instant) {
        let ns = start.elapsed().as_nanos() as u64;
        self.disk_ns.fetch_add(ns, Relaxed);
    }

    fn answer_untimed(&self, req: Request, list: &mut DirStream, buf: &mut [u8]) -> Option<Reply> {
        let res = match req {
            Request::Close { handle } => {
                self.held.lock().expect("handles").remove(&handle);
                return None;
            }
            Request::OpenRoot { path } => return Some(self.open_root(&path)),
            Request::OpenImage {
                path,
                allow_mounted,
            } => return Some(self.open_image(&path, allow_mounted)),
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

    fn open_image(&self, path: &[u8], allow_mounted: bool) -> Reply {
        let path = Path::new(std::ffi::OsStr::from_bytes(path));
        match LocalSource.open_image(path, allow_mounted) {
            Ok(img) => Reply::Image {
                handle: self.keep(Held::File(img.file)),
                st: img.st,
                size: img.size,
                device: img.device,
            },
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
            Request::List { dir, inline } => Reply::Entries(self.on_dir(dir, |d| {
                // A descriptor of its own: a handle listed twice (for
                // --delete, then for the walk) starts at the top each time.
                let d = &src.open_dir(d, c".")?;
                let mut entries = Vec::new();
                src.list(d, list, false, &mut |n: &CStr, is_dir, st| {
                    let st = st.map_err(|e| e.raw_os_error());
                    entries.push((n.to_bytes().to_vec(), is_dir, st, None));
                    true
                })?;
                if inline > 0 {
                    send_along(d, &mut entries, inline);
                }
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
                let st = src.stat_file(&f)?;
                let xattrs = src.xattrs(Open::File(&f), XattrSet::All)?;
                Reply::Opened {
                    handle: self.keep(Held::File(f)),
                    st,
                    xattrs: wire::xattrs_out(xattrs),
                }
            }
            Request::StatFile { file } => Reply::Stat(self.on_file(file, |f| src.stat_file(f))?),
            Request::Load => Reply::Load {
                disk_ns: self.disk_ns.load(Relaxed),
                cpu_ns: sluice_sys::process_cpu_time().as_nanos() as u64,
                cores: std::thread::available_parallelism().map_or(1, |n| n.get() as u32),
            },
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
                Reply::Xattrs(wire::xattrs_out(attrs))
            }
            Request::OpenRoot { .. }
            | Request::OpenImage { .. }
            | Request::Listen { .. }
            | Request::MoreStreams { .. }
            | Request::Close { .. }
            | Request::Read { .. } => {
                unreachable!("answered above, or by answer_read")
            }
        })
    }
}

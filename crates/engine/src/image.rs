//! `sluice image`: a block device or image file copied as one run of
//! chunks, and later runs that write only the chunks that changed.
//!
//! ```text
//!  chunk index ─► stream 1..N: read SRC chunk (or see a hole), hash it,
//!  (one atomic    compare with the map (or with DST's chunk), write what
//!   counter)      differs, holes for zeros ─► results ─► collector:
//!                                                 fdatasync DST, commit
//!                                                 the chunks to the map
//! ```
//!
//! The same parts as a tree copy: a fixed pool of streams, the gauge for
//! the bottleneck report, the token bucket for `--bwlimit`, one collector
//! that owns the journal and syncs data before the records claiming it.
//! The planner is only an index counter: chunks are handed out in order,
//! so N streams read the device as N nearby sequential runs.
//!
//! A first copy to a missing DST goes to a temporary beside it, renamed
//! into place when complete; later runs patch DST in place (that is the
//! point of an incremental), with the map telling which chunks are done.

use crate::chunkmap::{
    extent_sigs, hash_of, hash_of_raw, ChunkMap, Header, Ident, Record, UNKNOWN, ZERO,
};
use crate::error::{EntryError, JobError, Reason, Side};
use crate::gauge::{Activity, Busy, Gauge};
use crate::hash::HashKind;
use crate::options::{Outcome, Reporter};
use crate::source::{Source, SrcFile};
use crate::throttle::Throttle;
use sluice_sys::{AlignedBuf, Errno, FileType, Stat, DIRECT_ALIGN};
use std::ffi::CString;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::sync_channel;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Default chunk of an image: small enough that a changed block rewrites
/// little and the map of a 10 TiB device stays near 40 MiB in memory,
/// large enough that each read is a long sequential request.
pub const IMAGE_CHUNK: u64 = 4 << 20;

/// Default streams: enough requests in flight to keep a disk's queue full
/// while each stream hashes and compares its last chunk.
pub const IMAGE_JOBS: usize = 4;

/// Zero runs shorter than this are written, longer ones become holes.
const SPARSE_BLOCK: usize = 64 << 10;

/// What an image job is told.
#[derive(Clone, Debug)]
pub struct ImageOptions {
    pub jobs: usize,
    pub chunk_size: u64,
    /// Read and write with `O_DIRECT` (where aligned and supported).
    pub direct: bool,
    /// Ignore the map's hashes: compare with DST's data and rebuild it.
    pub rehash: bool,
    /// Image a block device even while it is mounted read-write.
    pub allow_mounted: bool,
    /// Where the chunk map lives (default: beside a file DST, or in the
    /// state directory for a block device).
    pub map: Option<PathBuf>,
    /// Count what would be written; write nothing.
    pub dry_run: bool,
    /// Compare SRC and DST chunk by chunk (`sluice verify`); write nothing.
    pub check: bool,
    pub bwlimit: Option<u64>,
    pub mem_limit: u64,
}

impl Default for ImageOptions {
    fn default() -> Self {
        ImageOptions {
            jobs: IMAGE_JOBS,
            chunk_size: IMAGE_CHUNK,
            // Measured (bench/image.py): buffered writes make every
            // commit's fdatasync flush the page cache, 1.0-2.8 s against
            // 1.2 s for 1 GiB, 5.0 s against 0.8 s for a 2 GiB volume.
            direct: true,
            rehash: false,
            allow_mounted: false,
            map: None,
            dry_run: false,
            check: false,
            bwlimit: None,
            mem_limit: crate::budget::default_limit(),
        }
    }
}

/// Live counters of an image job.
#[derive(Default)]
pub struct ImageStats {
    /// Bytes of SRC the job covers, known once it starts.
    pub size: AtomicU64,
    /// Bytes of SRC dealt with so far (read, or known to be a hole).
    pub bytes_done: AtomicU64,
    /// Bytes read from SRC (holes of a sparse SRC file are not read).
    pub bytes_read: AtomicU64,
    /// Bytes read from DST to compare with.
    pub dst_bytes_read: AtomicU64,
    /// Bytes of data written to DST (zeros made into holes not counted).
    pub bytes_written: AtomicU64,
    pub chunks: AtomicU64,
    pub chunks_written: AtomicU64,
    /// Chunks all zeros in SRC left as holes in a new image (neither
    /// written nor unchanged: written + zero + unchanged = chunks).
    pub chunks_zero: AtomicU64,
    /// Chunks DST already held.
    pub chunks_unchanged: AtomicU64,
    /// Of those, chunks not even read: SRC's extents under them are the
    /// ones they were last read from (btrfs).
    pub chunks_unread: AtomicU64,
    /// Chunks that differ (`verify`).
    pub differences: AtomicU64,
    pub errors: AtomicU64,
}

/// How a run went about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImageMode {
    /// DST did not exist: every non-zero chunk written.
    Full,
    /// The map was trusted: only chunks whose hash changed written.
    Incremental,
    /// No trusted map: DST read and compared chunk by chunk.
    Compare,
    /// SRC is a file untouched since the last run: nothing read.
    Unchanged,
    /// `sluice verify`: compared, nothing written.
    Verify,
}

impl ImageMode {
    pub fn name(self) -> &'static str {
        match self {
            ImageMode::Full => "full",
            ImageMode::Incremental => "incremental",
            ImageMode::Compare => "compare",
            ImageMode::Unchanged => "unchanged",
            ImageMode::Verify => "verify",
        }
    }
}

/// What a finished image job did, besides its counters.
#[derive(Clone, Debug)]
pub struct ImageReport {
    pub mode: ImageMode,
    /// The map's generation after this run (0 without a map).
    pub generation: u64,
    pub map: Option<PathBuf>,
    /// The image written (DST, or DST/name when DST is a directory).
    pub dst: PathBuf,
    pub chunk_size: u64,
    pub streams: usize,
    pub busy: Busy,
}

/// The default place of the chunk map of `dst`: beside it when it is a
/// file; for a block device (whose directory, /dev, forgets everything at
/// reboot) in `$XDG_STATE_HOME/sluice/maps`, named after the device path.
pub fn default_map_path(dst: &Path, device: bool) -> PathBuf {
    if !device {
        let mut name = dst.as_os_str().to_owned();
        name.push(".sluice-map");
        return PathBuf::from(name);
    }
    let abs = std::path::absolute(dst).unwrap_or_else(|_| dst.to_owned());
    let flat: String = abs
        .to_string_lossy()
        .trim_start_matches('/')
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    let state = crate::state_dir().unwrap_or_else(|_| PathBuf::from("/var/lib/sluice"));
    state.join("maps").join(format!(
        "{flat}-{:08x}.map",
        xxhash_rust::xxh3::xxh3_64(abs.as_os_str().as_bytes()) as u32
    ))
}

fn map_err(path: &Path) -> impl Fn(String) -> JobError + '_ {
    move |e| JobError::Usage(format!("chunk map {}: {e}", path.display()))
}

/// The opened SRC of an image job, on this host or across a wire.
struct Src {
    source: Arc<dyn Source>,
    file: SrcFile,
    st: Stat,
    size: u64,
    /// A local regular file with holes: `SEEK_DATA` finds them without
    /// reading.
    sparse: bool,
    /// SRC as messages name it (`host:path` across a wire).
    name: PathBuf,
}

impl Src {
    /// The local descriptor; `None` across a wire.
    fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.file.fd()
    }
}

fn open_source(source: &Arc<dyn Source>, src: &Path, opts: &ImageOptions) -> Result<Src, JobError> {
    let name = source.name(src);
    // Comparing reads nothing into a live file system: no mount check.
    let img = source
        .open_image(src, opts.allow_mounted || opts.check)
        .map_err(|e| match e.raw_os_error() {
            Some(_) => JobError::source(&name, e),
            None => JobError::Usage(e.to_string()),
        })?;
    Ok(Src {
        sparse: img.file.fd().is_some() && !img.device && img.st.is_sparse(),
        source: source.clone(),
        file: img.file,
        st: img.st,
        size: img.size,
        name,
    })
}

/// The opened DST of an image job.
struct Target {
    fd: OwnedFd,
    device: bool,
    /// The final path.
    path: PathBuf,
    /// A first copy's temporary beside `path` (renamed into place at the
    /// end), its directory, and whether this run created it.
    temp: Option<(CString, OwnedFd, bool)>,
}

impl Target {
    fn ident(&self, size: u64) -> Result<Ident, JobError> {
        let st = sluice_sys::stat_fd(self.fd.as_fd())
            .map_err(|e| JobError::destination(&self.path, e))?;
        Ok(Ident::of(&st, size))
    }
}

/// DST as the user named it: an existing directory receives SRC's name.
fn final_path(src: &Path, dst: &Path) -> PathBuf {
    match (dst.is_dir(), src.file_name()) {
        (true, Some(name)) => dst.join(name),
        _ => dst.to_owned(),
    }
}

fn parent_of(path: &Path) -> (PathBuf, CString) {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    };
    let name = path.file_name().unwrap_or_default().as_bytes();
    (
        dir,
        CString::new(name).expect("a path component has no NUL"),
    )
}

/// Opens DST for writing: the device or file itself, the temporary an
/// interrupted first copy left, or a new temporary.
fn open_target(
    path: &Path,
    header: Option<&Header>,
    size: u64,
    perm: u32,
) -> Result<Target, JobError> {
    match std::fs::metadata(path) {
        Ok(m) => {
            use std::os::unix::fs::FileTypeExt;
            let device = m.file_type().is_block_device();
            if !device && !m.is_file() {
                return Err(JobError::Usage(format!(
                    "{} is neither a block device nor a file",
                    path.display()
                )));
            }
            let fd = sluice_sys::open_image(path, true, device).map_err(|e| match e {
                Errno::BUSY => JobError::Usage(format!(
                    "{} is mounted or in use; unmount it first",
                    path.display()
                )),
                e => JobError::destination(path, e),
            })?;
            if device {
                let have =
                    sluice_sys::end_of(fd.as_fd()).map_err(|e| JobError::destination(path, e))?;
                if have < size {
                    return Err(JobError::Usage(format!(
                        "{} holds {have} bytes, less than the {size} of the source",
                        path.display()
                    )));
                }
            }
            Ok(Target {
                fd,
                device,
                path: path.to_owned(),
                temp: None,
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // One temporary name per target, so a run killed at any point
            // leaves nothing the next run does not find again.
            let (dir, final_name) = parent_of(path);
            let dir_fd =
                sluice_sys::open_dir_path(&dir).map_err(|e| JobError::destination(&dir, e))?;
            let name = CString::new(format!(
                ".sluice-{:x}-0.tmp",
                xxhash_rust::xxh3::xxh3_64(final_name.as_bytes())
            ))
            .expect("no NUL");
            let recorded = header.and_then(|h| h.temp.as_deref()) == name.to_str().ok();
            let (fd, fresh) = match sluice_sys::open_write_at(dir_fd.as_fd(), &name) {
                Ok(fd) if recorded => (fd, false),
                Ok(fd) => {
                    // Left by a run killed before its map named it: its
                    // content is unknown, so it starts over empty.
                    sluice_sys::set_len(fd.as_fd(), 0)
                        .map_err(|e| JobError::destination(path, e))?;
                    (fd, true)
                }
                Err(Errno::NOENT) => (
                    sluice_sys::create_excl_at(dir_fd.as_fd(), &name, perm)
                        .map_err(|e| JobError::destination(path, e))?,
                    true,
                ),
                Err(e) => return Err(JobError::destination(path, e)),
            };
            if fresh {
                sluice_sys::set_len(fd.as_fd(), size)
                    .map_err(|e| JobError::destination(path, e))?;
            }
            Ok(Target {
                fd,
                device: false,
                path: path.to_owned(),
                temp: Some((name, dir_fd, fresh)),
            })
        }
        Err(e) => Err(JobError::destination(path, e)),
    }
}

/// One chunk's outcome.
enum Done {
    /// Written (or made zeros) in DST; record its hash once durable.
    Written(u64, u128),
    /// DST already held it; record the hash if the map lacked it.
    Same(u64, u128, bool),
    Failed,
}

/// A stream's unit of work, done: the chunk records it leaves to the
/// collector, which makes them durable and commits them in one go.
struct Unit {
    stream: usize,
    records: Vec<Record>,
    /// It wrote DST: the stream waits for these records before its next
    /// write.
    wrote: bool,
}

/// Chunks per unit of work: 64 MiB, the tree copy's chunk. A stream waits
/// for its last unit to be recorded before it writes again, so a crash
/// costs at most one unit per stream to copy again — as for big files in a
/// tree — while the map keeps its finer chunks for incrementals. (One
/// record per 4 MiB chunk spent half of the stream time waiting on
/// commits: 19 of 38 stream-seconds for an 8 GiB image.)
const UNIT_BYTES: u64 = 64 << 20;

/// What every stream shares.
struct Run<'a> {
    opts: &'a ImageOptions,
    src: &'a Src,
    dst: Option<&'a OwnedFd>,
    dst_path: &'a Path,
    dst_device: bool,
    mode: ImageMode,
    /// DST's chunks read as zeros where this run has not written (a new,
    /// sparse temporary), so zero chunks need no write at all.
    known_zero: bool,
    /// The map's hashes (all [`UNKNOWN`] without a trusted map).
    old: Vec<u128>,
    /// The map's SRC extent signatures (0: none).
    old_sigs: Vec<u64>,
    /// SRC's extent signatures now, where they prove data unchanged.
    sigs: Option<Vec<u64>>,
    chunks: u64,
    /// Chunks per unit of work.
    unit: u64,
    /// The next unit to hand out.
    next: AtomicU64,
    stats: &'a ImageStats,
    reporter: &'a dyn Reporter,
    cancel: &'a AtomicBool,
    gauge: Gauge,
    throttle: Option<Throttle>,
    direct_dst: bool,
    /// xxh3-128 of a whole chunk of zeros (see [`Run::zero_hash`]).
    zero_full: u128,
    /// The first DST failure: it stops the job.
    fatal: Mutex<Option<EntryError>>,
    records: Records,
}

/// Per stream, whether its last written chunk is still to be recorded.
struct Records {
    /// Off in runs without a map to record in.
    on: bool,
    waiting: Mutex<Vec<bool>>,
    cv: Condvar,
}

impl Records {
    fn new(on: bool, streams: usize) -> Records {
        Records {
            on,
            waiting: Mutex::new(vec![false; streams]),
            cv: Condvar::new(),
        }
    }

    fn hold(&self, id: usize) {
        if self.on {
            self.waiting.lock().expect("records lock")[id] = true;
        }
    }

    /// Waits until stream `id`'s last chunk is recorded (or the job stops).
    fn wait(&self, id: usize, cancel: &AtomicBool) {
        let mut w = self.waiting.lock().expect("records lock");
        while w[id] && !cancel.load(Relaxed) {
            w = self
                .cv
                .wait_timeout(w, Duration::from_millis(100))
                .expect("records lock")
                .0;
        }
    }

    fn release(&self, ids: &[usize]) {
        let mut w = self.waiting.lock().expect("records lock");
        for &id in ids {
            w[id] = false;
        }
        self.cv.notify_all();
    }
}

fn is_zero(data: &[u8]) -> bool {
    static ZEROS: [u8; 4096] = [0; 4096];
    data.chunks(ZEROS.len()).all(|c| c == &ZEROS[..c.len()])
}

impl Run<'_> {
    fn record(&self, chunk: u64, hash: u128) -> Record {
        let sig = self.sigs.as_ref().map_or(0, |s| s[chunk as usize]);
        Record { chunk, hash, sig }
    }

    fn chunk_range(&self, i: u64) -> (u64, usize) {
        let off = i * self.opts.chunk_size;
        (
            off,
            (self.src.size - off).min(self.opts.chunk_size) as usize,
        )
    }

    /// Takes units of consecutive chunks until none is left; sends each
    /// unit's records to the collector when it is done.
    fn stream(&self, id: usize, tx: &std::sync::mpsc::SyncSender<Unit>) {
        let cs = self.opts.chunk_size as usize;
        let mut buf = AlignedBuf::new(cs);
        let mut dbuf = matches!(self.mode, ImageMode::Compare | ImageMode::Verify)
            .then(|| AlignedBuf::new(cs));
        loop {
            let first = self.next.fetch_add(1, Relaxed) * self.unit;
            if first >= self.chunks || self.cancel.load(Relaxed) {
                break;
            }
            let mut unit = Unit {
                stream: id,
                records: Vec::new(),
                wrote: false,
            };
            for i in first..(first + self.unit).min(self.chunks) {
                if self.cancel.load(Relaxed) {
                    break;
                }
                let buffers = (buf.as_mut_slice(), dbuf.as_mut().map(|b| b.as_mut_slice()));
                match self.chunk(id, i, buffers.0, buffers.1, unit.wrote) {
                    Ok(Done::Written(i, h)) => {
                        unit.records.push(self.record(i, h));
                        unit.wrote = true;
                    }
                    Ok(Done::Same(i, h, true)) => unit.records.push(self.record(i, h)),
                    Ok(_) => {}
                    Err(e) => {
                        self.stats.errors.fetch_add(1, Relaxed);
                        if e.side == Side::Dst {
                            // DST failing one chunk fails the next the same way.
                            self.fatal.lock().expect("fatal lock").get_or_insert(e);
                            self.cancel.store(true, Relaxed);
                        } else {
                            self.reporter.entry_failed(&e);
                        }
                    }
                }
            }
            self.gauge.set(id, Activity::Idle);
            if unit.wrote {
                self.records.hold(id);
            }
            if tx.send(unit).is_err() {
                break;
            }
        }
        // Out of work: no longer part of the job's stream time.
        self.gauge.set(id, Activity::Parked);
    }

    fn err(&self, side: Side, op: &'static str, i: u64, e: Errno) -> EntryError {
        let path = match side {
            Side::Src => &self.src.name,
            Side::Dst => self.dst_path,
        };
        let (off, _) = self.chunk_range(i);
        EntryError {
            path: path.as_os_str().as_bytes().to_vec(),
            side,
            op,
            reason: Reason::Other(format!(
                "chunk {i} at byte {off}: {}",
                std::io::Error::from_raw_os_error(e.raw_os_error())
            )),
        }
    }

    /// Reads `len` bytes at `off` of `fd` into `buf` (whole aligned
    /// blocks, for `O_DIRECT`); a short read is an error.
    fn read(&self, fd: BorrowedFd<'_>, buf: &mut [u8], off: u64, len: usize) -> Result<(), Errno> {
        let want = (len.div_ceil(DIRECT_ALIGN) * DIRECT_ALIGN).min(buf.len());
        let n = sluice_sys::read_full_at(fd, &mut buf[..want], off)?;
        if n < len {
            return Err(Errno::NODATA);
        }
        Ok(())
    }

    /// Reads `len` bytes of SRC at `off` into `buf`: from the descriptor
    /// here, or across the wire.
    fn read_src(&self, buf: &mut [u8], off: u64, len: usize) -> Result<(), Errno> {
        if let Some(fd) = self.src.fd() {
            return self.read(fd, buf, off, len);
        }
        let mut at = 0;
        while at < len {
            let n = self
                .src
                .source
                .read_at(&self.src.file, &mut buf[at..len], off + at as u64)?;
            if n == 0 {
                return Err(Errno::NODATA);
            }
            at += n;
        }
        Ok(())
    }

    /// For SRC across a wire, before its data is fetched: whether the
    /// chunk is what DST already has, by a digest the far end computes
    /// (only the digest crosses). `Some` when that settles the chunk;
    /// `None` when its data must come over (a first copy asks nothing).
    fn far_same(
        &self,
        id: usize,
        i: u64,
        old: u128,
        sig: u64,
        old_sig: u64,
        dbuf: Option<&mut [u8]>,
    ) -> Result<Option<Done>, EntryError> {
        let (off, len) = self.chunk_range(i);
        let compare = matches!(self.mode, ImageMode::Compare | ImageMode::Verify);
        if !compare && old == UNKNOWN {
            return Ok(None);
        }
        self.gauge.set(id, Activity::Read);
        let (digest, n) = self
            .src
            .source
            .hash(&self.src.file, off, len as u64, &mut [], HashKind::Xxh3)
            .map_err(|e| self.err(Side::Src, "hash", i, e))?;
        if n < len as u64 {
            return Err(self.err(Side::Src, "hash", i, Errno::NODATA));
        }
        let mut theirs = u128::from_le_bytes(digest.0[..16].try_into().expect("16 bytes"));
        let zero = theirs == self.zero_hash(len);
        theirs = if zero { ZERO } else { hash_of_raw(theirs) };
        let same = match (compare, dbuf) {
            (true, Some(dbuf)) => {
                let dst = self.dst.expect("compare has a DST");
                match self.read(dst.as_fd(), dbuf, off, len) {
                    Err(Errno::NODATA) if self.mode == ImageMode::Verify => {
                        return Ok(Some(Done::Failed))
                    }
                    r => r.map_err(|e| self.err(Side::Dst, "read", i, e))?,
                }
                self.stats.dst_bytes_read.fetch_add(len as u64, Relaxed);
                let ours = &dbuf[..len];
                if zero {
                    is_zero(ours)
                } else {
                    hash_of(ours) == theirs
                }
            }
            _ => old == theirs,
        };
        if !same && self.mode == ImageMode::Verify {
            self.differs(i);
            return Ok(Some(Done::Failed));
        }
        if !same {
            return Ok(None); // differs: the data comes over
        }
        self.stats.bytes_done.fetch_add(len as u64, Relaxed);
        self.stats.chunks_unchanged.fetch_add(1, Relaxed);
        Ok(Some(Done::Same(i, theirs, old != theirs || sig != old_sig)))
    }

    /// Reports chunk `i` different (`sluice verify`).
    fn differs(&self, i: u64) {
        let (off, len) = self.chunk_range(i);
        self.stats.differences.fetch_add(1, Relaxed);
        self.reporter.entry_differs(
            Side::Src,
            self.src.name.as_os_str().as_bytes(),
            self.dst_path.as_os_str().as_bytes(),
            &format!("chunk {i} (bytes {off}..{}) differs", off + len as u64),
        );
    }

    /// xxh3-128 of `len` zero bytes (a far chunk of zeros is known by it).
    fn zero_hash(&self, len: usize) -> u128 {
        if len == self.opts.chunk_size as usize {
            return self.zero_full;
        }
        xxhash_rust::xxh3::xxh3_128(&vec![0u8; len])
    }

    fn chunk(
        &self,
        id: usize,
        i: u64,
        buf: &mut [u8],
        mut dbuf: Option<&mut [u8]>,
        unit_wrote: bool,
    ) -> Result<Done, EntryError> {
        let (off, len) = self.chunk_range(i);
        let old = self.old[i as usize];
        let sig = self.sigs.as_ref().map_or(0, |s| s[i as usize]);
        let old_sig = self.old_sigs[i as usize];
        if self.mode == ImageMode::Incremental && sig != 0 && sig == old_sig && old != UNKNOWN {
            // The same extents as when this chunk was last read, on a file
            // system that puts every write in new ones: the same data.
            self.stats.bytes_done.fetch_add(len as u64, Relaxed);
            self.stats.chunks_unread.fetch_add(1, Relaxed);
            self.stats.chunks_unchanged.fetch_add(1, Relaxed);
            return Ok(Done::Same(i, old, false));
        }
        let hole = match self.src.fd() {
            Some(fd) if self.src.sparse => sluice_sys::next_data(fd, off)
                .map_err(|e| self.err(Side::Src, "seek", i, e))?
                .is_none_or(|d| d >= off + len as u64),
            _ => false,
        };
        if self.src.fd().is_none() {
            if let Some(done) = self.far_same(id, i, old, sig, old_sig, dbuf.as_deref_mut())? {
                return Ok(done);
            }
        }
        let zero = if hole {
            true
        } else {
            if let Some(t) = &self.throttle {
                t.take(len as u64);
            }
            self.gauge.set(id, Activity::Read);
            self.read_src(buf, off, len)
                .map_err(|e| self.err(Side::Src, "read", i, e))?;
            self.stats.bytes_read.fetch_add(len as u64, Relaxed);
            is_zero(&buf[..len])
        };
        let data = &buf[..len];
        let hash = if zero { ZERO } else { hash_of(data) };
        self.stats.bytes_done.fetch_add(len as u64, Relaxed);
        let same = match (self.mode, dbuf) {
            (ImageMode::Compare | ImageMode::Verify, Some(dbuf)) => {
                let dst = self.dst.expect("compare has a DST");
                self.gauge.set(id, Activity::Read);
                match self.read(dst.as_fd(), dbuf, off, len) {
                    // A shorter DST: verify reported the sizes already.
                    Err(Errno::NODATA) if self.mode == ImageMode::Verify => {
                        return Ok(Done::Failed)
                    }
                    r => r.map_err(|e| self.err(Side::Dst, "read", i, e))?,
                }
                self.stats.dst_bytes_read.fetch_add(len as u64, Relaxed);
                if zero {
                    is_zero(&dbuf[..len])
                } else {
                    dbuf[..len] == *data
                }
            }
            _ => old == hash || (zero && self.known_zero && old == UNKNOWN),
        };
        if same {
            // Each chunk is counted once: written, zero (a hole left in a
            // new image) or unchanged (DST had it), so the three add up.
            if zero && self.known_zero {
                self.stats.chunks_zero.fetch_add(1, Relaxed);
            } else {
                self.stats.chunks_unchanged.fetch_add(1, Relaxed);
            }
            return Ok(Done::Same(i, hash, old != hash || sig != old_sig));
        }
        if self.mode == ImageMode::Verify {
            self.differs(i);
            return Ok(Done::Failed);
        }
        self.stats.chunks_written.fetch_add(1, Relaxed);
        if self.opts.dry_run {
            return Ok(Done::Same(i, hash, false));
        }
        // At most one written unit per stream waits to be recorded, so a
        // crash makes the next run write at most that one again.
        if !unit_wrote {
            self.gauge.set(id, Activity::Journal);
            self.records.wait(id, self.cancel);
        }
        self.gauge.set(id, Activity::Write);
        self.write(data, off, zero)
            .map_err(|e| self.err(Side::Dst, "write", i, e))?;
        Ok(Done::Written(i, hash))
    }

    /// Writes one chunk: runs of non-zero blocks as data, runs of zero
    /// blocks as holes (or device zeroing), nothing where DST is known to
    /// read as zeros already.
    fn write(&self, data: &[u8], off: u64, zero: bool) -> Result<(), Errno> {
        let dst = self.dst.expect("a writing run has a DST").as_fd();
        if zero {
            return self.zeros(dst, off, data.len());
        }
        // Each block is checked once; a run ends where the kind changes.
        let mut run: Option<(usize, bool)> = None;
        for (k, block) in data.chunks(SPARSE_BLOCK).enumerate() {
            let (start, zero) = (k * SPARSE_BLOCK, is_zero(block));
            match run {
                Some((_, z)) if z == zero => {}
                Some((from, z)) => {
                    self.put_run(dst, &data[from..start], off + from as u64, z)?;
                    run = Some((start, zero));
                }
                None => run = Some((start, zero)),
            }
        }
        match run {
            Some((from, z)) => self.put_run(dst, &data[from..], off + from as u64, z),
            None => Ok(()),
        }
    }

    fn put_run(&self, dst: BorrowedFd<'_>, data: &[u8], off: u64, zero: bool) -> Result<(), Errno> {
        if zero {
            self.zeros(dst, off, data.len())
        } else {
            self.put(dst, data, off)
        }
    }

    fn put(&self, dst: BorrowedFd<'_>, data: &[u8], off: u64) -> Result<(), Errno> {
        // O_DIRECT needs whole blocks; the source's tail may not be one.
        let aligned = data.len().is_multiple_of(DIRECT_ALIGN);
        if self.direct_dst && !aligned {
            let _ = sluice_sys::set_direct(dst, false);
        }
        // Not RWF_DSYNC: one fdatasync per batch in the collector covers
        // every stream's writes at once. Measured: DSYNC writes took an
        // 8 GiB image from 7.5-9.0 s to 10.1 s, and gained nothing on a
        // 2 GiB volume (1.13 s either way).
        sluice_sys::write_all_at(dst, data, off)?;
        self.stats
            .bytes_written
            .fetch_add(data.len() as u64, Relaxed);
        Ok(())
    }

    fn zeros(&self, dst: BorrowedFd<'_>, off: u64, len: usize) -> Result<(), Errno> {
        if self.known_zero {
            return Ok(());
        }
        match sluice_sys::zero_range(dst, off, len as u64, self.dst_device) {
            Ok(()) => Ok(()),
            Err(Errno::OPNOTSUPP | Errno::INVAL | Errno::NOSYS) => {
                static ZEROS: [u8; SPARSE_BLOCK] = [0; SPARSE_BLOCK];
                let mut at = 0;
                while at < len {
                    let n = (len - at).min(SPARSE_BLOCK);
                    sluice_sys::write_all_at(dst, &ZEROS[..n], off + at as u64)?;
                    at += n;
                }
                Ok(())
            }
            Err(e) => Err(e),
        }
    }
}

/// Images SRC onto DST (or compares them, with `opts.check`), reading SRC
/// through `source` (`src` is its path there): the job runs here, where
/// DST is. Across a wire a chunk DST may already have is
/// compared by digests computed at each end; only chunks that differ (or
/// all, on a first copy) cross.
pub fn image_from(
    source: &Arc<dyn Source>,
    src: &Path,
    dst: &Path,
    opts: ImageOptions,
    stats: Arc<ImageStats>,
    reporter: Arc<dyn Reporter>,
    cancel: Arc<AtomicBool>,
) -> Result<(Outcome, ImageReport), JobError> {
    if opts.chunk_size == 0 || !opts.chunk_size.is_multiple_of(DIRECT_ALIGN as u64) {
        return Err(JobError::Usage(format!(
            "--chunk-size must be a multiple of {DIRECT_ALIGN} bytes"
        )));
    }
    let source = open_source(source, src, &opts)?;
    let dst_path = final_path(src, dst);
    if source.source.is_local() && dst_path.canonicalize().ok() == src.canonicalize().ok() {
        return Err(JobError::Usage(format!(
            "source {} and destination {} are the same",
            src.display(),
            dst.display()
        )));
    }
    let size = source.size;
    let chunks = size.div_ceil(opts.chunk_size);
    stats.size.store(size, Relaxed);
    stats.chunks.store(chunks, Relaxed);
    // Every stream holds one chunk buffer, two when it compares with DST.
    let per_stream = 2 * opts.chunk_size + (256 << 10);
    let room = opts.mem_limit.saturating_sub(crate::budget::base());
    let jobs = opts.jobs.min((room / per_stream) as usize).max(1);
    if room < per_stream {
        return Err(JobError::Usage(format!(
            "--mem-limit is too small for {} MiB chunks; lower --chunk-size",
            opts.chunk_size >> 20
        )));
    }

    let writes = !opts.check && !opts.dry_run;
    let mut target = None;
    let mut map = None;
    let mut header = None;
    let device_dst = std::fs::metadata(&dst_path).is_ok_and(|m| {
        use std::os::unix::fs::FileTypeExt;
        m.file_type().is_block_device()
    });
    let map_path = opts
        .map
        .clone()
        .unwrap_or_else(|| default_map_path(&dst_path, device_dst));
    if !opts.check {
        if writes {
            if let Some(dir) = map_path.parent() {
                std::fs::create_dir_all(dir).map_err(|e| JobError::destination(dir, e))?;
            }
        }
        // A symlink there is not followed (and makes the open fail).
        if writes || map_path.symlink_metadata().is_ok() {
            let m = ChunkMap::open(&map_path).map_err(JobError::Usage)?;
            header = m.header().map_err(map_err(&map_path))?;
            map = Some(m);
        }
    }
    let src_ident = Ident::of(&source.st, size);
    let perm = if source.st.file_type() == FileType::RegularFile {
        source.st.perm() & 0o777
    } else {
        0o600
    };
    let dst_fd = if writes {
        let t = open_target(&dst_path, header.as_ref(), size, perm)?;
        target = Some(t);
        target.as_ref().map(|t| &t.fd)
    } else {
        None
    };
    let read_fd;
    let dst_fd = match dst_fd {
        Some(fd) => Some(fd),
        None if dst_path.exists() => {
            read_fd = sluice_sys::open_image(&dst_path, false, false)
                .map_err(|e| JobError::destination(&dst_path, e))?;
            Some(&read_fd)
        }
        None if opts.check => {
            return Err(JobError::destination(
                &dst_path,
                std::io::Error::from(std::io::ErrorKind::NotFound),
            ))
        }
        None => None,
    };

    // Which way this run goes, and what it may believe of DST.
    let dst_ident = match dst_fd {
        Some(fd) => Some(Ident::of(
            &sluice_sys::stat_fd(fd.as_fd()).map_err(|e| JobError::destination(&dst_path, e))?,
            size,
        )),
        None => None,
    };
    let fresh_temp = target
        .as_ref()
        .is_some_and(|t| t.temp.as_ref().is_some_and(|(_, _, new)| *new));
    // The map describes DST if DST is the file it was written for and,
    // after a clean finish, untouched since. After an interrupted run of
    // ours (dirty) DST's times moved, but every record still holds.
    let trusted = !opts.rehash
        && !fresh_temp
        && header.as_ref().is_some_and(|h| {
            h.chunk_size == opts.chunk_size
                && dst_ident
                    .as_ref()
                    .is_some_and(|d| h.dst.same_file(d) && (!h.clean || h.dst == *d))
        });
    let mut mode = if opts.check {
        ImageMode::Verify
    } else if fresh_temp || dst_fd.is_none() {
        ImageMode::Full
    } else if trusted {
        ImageMode::Incremental
    } else {
        ImageMode::Compare
    };
    if let (ImageMode::Verify, Some(d)) = (mode, &dst_ident) {
        // A file DST of another size differs, whatever its chunks say (a
        // device may be larger than the image written to it).
        if d.rdev == (0, 0) && d.size != size {
            stats.differences.fetch_add(1, Relaxed);
            reporter.entry_differs(
                Side::Dst,
                source.name.as_os_str().as_bytes(),
                dst_path.as_os_str().as_bytes(),
                &format!("{size} bytes in SRC, {} in DST", d.size),
            );
        }
    }
    let h = header.as_ref();
    // A file SRC with the identity, size and mtime the last clean run read
    // has nothing new to give.
    if mode == ImageMode::Incremental
        && source.st.file_type() == FileType::RegularFile
        && h.is_some_and(|h| h.clean && h.src == src_ident && h.size == size)
    {
        mode = ImageMode::Unchanged;
    }
    let generation = h.map_or(0, |h| h.generation) + u64::from(writes);
    // (A first copy resumed in its temporary is an incremental of it.)
    let (old, old_sigs) = match (&map, mode) {
        (Some(m), ImageMode::Incremental) => m.load(chunks).map_err(map_err(&map_path))?,
        _ => (vec![UNKNOWN; chunks as usize], vec![0; chunks as usize]),
    };
    // On btrfs every write lands in new extents: a chunk whose extents are
    // those it was last read from holds the same data, and need not be
    // read. (ext4, xfs overwrite in place: no such proof, SRC is read.)
    let sigs = source
        .fd()
        .filter(|&fd| {
            !opts.check
                && source.st.file_type() == FileType::RegularFile
                && sluice_sys::extents::moves_on_write(fd)
        })
        .and_then(|fd| sluice_sys::extents::extents(fd).ok())
        .map(|e| extent_sigs(&e, size, opts.chunk_size));
    let report = |busy| ImageReport {
        mode,
        generation,
        map: map.as_ref().map(|_| map_path.clone()),
        dst: dst_path.clone(),
        chunk_size: opts.chunk_size,
        streams: jobs,
        busy,
    };
    if mode == ImageMode::Unchanged {
        stats.bytes_done.store(size, Relaxed);
        stats.chunks_unchanged.store(chunks, Relaxed);
        let busy = Busy::default();
        let mut r = report(busy);
        r.generation -= u64::from(writes);
        return Ok((Outcome::Complete, r));
    }

    // A writing run: the map says "dirty" before DST changes.
    let temp_name = target
        .as_ref()
        .and_then(|t| t.temp.as_ref())
        .map(|(n, _, _)| n.to_string_lossy().into_owned());
    // The header as a run leaves it: dirty while it writes, clean after.
    let header_now = |t: &Target, clean: bool, src: Ident, temp: Option<String>| {
        Ok::<_, JobError>(Header {
            chunk_size: opts.chunk_size,
            size,
            generation,
            clean,
            dst: t.ident(size)?,
            src,
            temp,
        })
    };
    if let (true, Some(m), Some(t)) = (writes, &map, &target) {
        let hd = header_now(t, false, Ident::default(), temp_name)?;
        let reset = mode != ImageMode::Incremental;
        m.set_header(&hd, reset).map_err(map_err(&map_path))?;
        if mode == ImageMode::Incremental && h.is_some_and(|h| h.size > size) {
            m.truncate(chunks).map_err(map_err(&map_path))?;
        }
        if !t.device && !fresh_temp {
            sluice_sys::set_len(t.fd.as_fd(), size)
                .map_err(|e| JobError::destination(&dst_path, e))?;
        }
    }

    // Where a file system refuses O_DIRECT, that side stays buffered.
    let direct = |fd: BorrowedFd<'_>| opts.direct && sluice_sys::set_direct(fd, true).is_ok();
    if let Some(fd) = source.fd() {
        direct(fd);
    }
    let direct_dst = dst_fd.is_some_and(|fd| direct(fd.as_fd()));
    let run = Run {
        opts: &opts,
        src: &source,
        dst: dst_fd,
        dst_path: &dst_path,
        dst_device: device_dst,
        mode,
        known_zero: fresh_temp,
        old,
        old_sigs,
        sigs,
        chunks,
        unit: (UNIT_BYTES / opts.chunk_size).max(1),
        next: AtomicU64::new(0),
        stats: &stats,
        reporter: &*reporter,
        cancel: &cancel,
        gauge: Gauge::new(jobs),
        throttle: opts
            .bwlimit
            .map(|r| Throttle::new(r, [cancel.clone(), Arc::default()])),
        direct_dst,
        zero_full: xxhash_rust::xxh3::xxh3_128(&vec![0u8; opts.chunk_size as usize]),
        fatal: Mutex::new(None),
        records: Records::new(writes && map.is_some(), jobs),
    };
    let started = Instant::now();
    let sampled = AtomicBool::new(false);
    let committed = std::thread::scope(|s| {
        let (tx, rx) = sync_channel::<Unit>(jobs * 2);
        for id in 0..jobs {
            let (tx, run) = (tx.clone(), &run);
            std::thread::Builder::new()
                .name(format!("image-{id}"))
                .spawn_scoped(s, move || run.stream(id, &tx))
                .expect("spawn image stream");
        }
        drop(tx);
        s.spawn(|| run.gauge.sample_until(&sampled));
        let r = collect(
            &rx,
            dst_fd,
            map.as_ref().filter(|_| writes),
            generation,
            &run.records,
        );
        // Streams stop at their next chunk once the collector gave up.
        if r.is_err() {
            cancel.store(true, Relaxed);
            for _ in rx.iter() {}
        }
        sampled.store(true, Relaxed);
        r
    });
    let busy = run.gauge.busy(started.elapsed());
    let fatal = run.fatal.lock().expect("fatal lock").take();
    drop(run);
    committed.map_err(|e| JobError::destination(&dst_path, std::io::Error::other(e)))?;
    if let Some(e) = fatal {
        return Err(JobError::Fatal(e));
    }

    let failed = stats.errors.load(Relaxed) > 0;
    if cancel.load(Relaxed) && !failed {
        return Ok((Outcome::Interrupted, report(busy)));
    }
    if let (Some(m), Some(t)) = (&map, &target) {
        // Everything is recorded; DST durable and in place, then "clean".
        sluice_sys::sync(t.fd.as_fd()).map_err(|e| JobError::destination(&dst_path, e))?;
        if failed {
            // An incomplete first copy keeps its temporary for the next run.
            return Ok((Outcome::Partial, report(busy)));
        }
        if let Some((name, dir, _)) = &t.temp {
            let (_, final_name) = parent_of(&dst_path);
            sluice_sys::rename_at(dir.as_fd(), name, dir.as_fd(), &final_name)
                .map_err(|e| JobError::destination(&dst_path, e))?;
            let _ = sluice_sys::sync(dir.as_fd());
        }
        let src_now = source.source.stat_file(&source.file).ok();
        let src_still = src_now.is_some_and(|st| Ident::of(&st, size) == src_ident);
        let src = if src_still {
            src_ident.clone()
        } else {
            Ident::default()
        };
        let hd = header_now(t, true, src, None)?;
        m.set_header(&hd, false).map_err(map_err(&map_path))?;
    }
    let outcome = if failed || stats.differences.load(Relaxed) > 0 {
        Outcome::Partial
    } else {
        Outcome::Complete
    };
    Ok((outcome, report(busy)))
}

/// The collector: on each wake-up, everything the streams finished
/// meanwhile is made durable in DST (one `fdatasync`) and then recorded in
/// the map (one commit), and the streams that wrote it may write again.
fn collect(
    rx: &std::sync::mpsc::Receiver<Unit>,
    dst: Option<&OwnedFd>,
    map: Option<&ChunkMap>,
    generation: u64,
    records: &Records,
) -> Result<(), String> {
    let mut batch: Vec<Record> = Vec::new();
    let mut writers: Vec<usize> = Vec::new();
    while let Ok(first) = rx.recv() {
        for unit in std::iter::once(first).chain(rx.try_iter()) {
            batch.extend(unit.records);
            if unit.wrote {
                writers.push(unit.stream);
            }
        }
        if let (Some(map), Some(dst), false) = (map, dst, batch.is_empty()) {
            // Chunks DST already held were read from it, maybe from cache:
            // they are synced too before they are claimed.
            sluice_sys::sync_data(dst.as_fd()).map_err(|e| format!("fdatasync: {e}"))?;
            map.record(&batch, generation)?;
        }
        records.release(&writers);
        batch.clear();
        writers.clear();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_detection() {
        assert!(is_zero(&[0u8; 10000]));
        let mut v = vec![0u8; 10000];
        v[9999] = 1;
        assert!(!is_zero(&v));
        assert!(is_zero(&[]));
    }

    #[test]
    fn map_paths() {
        assert_eq!(
            default_map_path(Path::new("/x/disk.img"), false),
            PathBuf::from("/x/disk.img.sluice-map")
        );
        let dev = default_map_path(Path::new("/dev/loop3"), true);
        assert!(dev.parent().unwrap().ends_with("sluice/maps"), "{dev:?}");
        let name = dev.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            name.starts_with("dev_loop3-") && name.ends_with(".map"),
            "{name}"
        );
    }
}

//! The restart journal: which chunks of each big file in flight have
//! landed, so a re-run after kill -9, power loss or SIGINT copies only the
//! chunks that had not.
//!
//! Small files need no record: an entry is done when DST has it under its
//! final name with the source's size and mtime, which sluice sets on the
//! temporary before the rename (see `compare`). That is both cheaper than a
//! row per file (the dense copy writes nothing here) and more truthful (a
//! row could claim a file that was deleted since).
//!
//! The journal is a redb file in DST's root directory, created when the
//! first big file starts and removed when the job ends with nothing left to
//! resume, so after a successful run no state file remains inside DST.
//! One collector thread owns it: streams send it messages, it batches them
//! into one transaction per wake-up (group commit), and before committing
//! a chunk record it `fdatasync`s the file the chunk was written to, so a
//! record never claims more than a crash would keep.

use crate::target::StateError;
use redb::{ReadableDatabase, ReadableTable, TableDefinition};
use sluice_sys::Stat;
use std::collections::{HashMap, HashSet};
use std::ffi::CString;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// Set in a record's temporary-name length when the temporary's inode follows.
const INO_FLAG: u32 = 1 << 31;

/// Big files in flight, keyed by their path relative to DST's root.
const FILES: TableDefinition<&[u8], &[u8]> = TableDefinition::new("files");

/// Name of the journal of a tree job, in DST's root.
const TREE_NAME: &str = ".sluice-journal.redb";

/// Whether `name` is one of sluice's journal files (never deleted by
/// `--delete`, never mistaken for data).
pub fn is_journal_name(name: &[u8]) -> bool {
    name.starts_with(b".sluice-journal")
}

/// Whether `name` is the journal of a part of a job split into other than
/// `count` parts (an earlier run split another way).
pub fn is_other_split(name: &[u8], count: u32) -> bool {
    let split = is_journal_name(name) && name.windows(6).any(|w| w == b"-part-");
    split && !name.ends_with(format!("-of-{count}.redb").as_bytes())
}

/// The journal's file name for a job writing `single` (a single-file copy:
/// one journal per target name, so two such jobs into one directory do not
/// share it) or a whole tree.
/// A part of a job split over processes (`--shard`) keeps its own,
/// `…-part-I-of-N.redb`, so parts on one machine do not contend for one
/// file.
fn file_name(single: Option<&[u8]>, part: Option<&crate::shard::Shard>) -> String {
    let part = part
        .map(|p| format!("-part-{}-of-{}", p.index, p.count))
        .unwrap_or_default();
    match single {
        None if part.is_empty() => TREE_NAME.to_string(),
        None => format!(".sluice-journal{part}.redb"),
        Some(name) => format!(
            ".sluice-journal-{:016x}{part}.redb",
            xxhash_rust::xxh3::xxh3_64(name)
        ),
    }
}

/// A big file being copied: where its temporary is, which source it copies
/// (a changed source invalidates the record), and which chunks landed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Record {
    pub temp: Vec<u8>,
    pub ino: u64,
    pub size: u64,
    pub mtime: (i64, u32),
    pub chunk_size: u64,
    /// One bit per chunk, set when the chunk is durably in the temporary.
    pub done: Vec<u8>,
    /// The temporary's inode when it was recorded (0: not known, a record
    /// of an older version): a file put in its place since is not it.
    pub temp_ino: u64,
}

impl Record {
    pub fn new(temp: &[u8], st: &Stat, chunk_size: u64, chunks: u64) -> Record {
        Record {
            temp: temp.to_vec(),
            ino: st.ino,
            size: st.size,
            mtime: st.mtime,
            chunk_size,
            done: vec![0; chunks.div_ceil(8) as usize],
            temp_ino: 0,
        }
    }

    /// Whether the record is about this very source file, cut the same way.
    pub fn matches(&self, st: &Stat, chunk_size: u64) -> bool {
        self.ino == st.ino
            && self.size == st.size
            && self.mtime == st.mtime
            && self.chunk_size == chunk_size
    }

    pub fn is_done(&self, i: u64) -> bool {
        self.done
            .get((i / 8) as usize)
            .is_some_and(|b| b & (1 << (i % 8)) != 0)
    }

    fn set_done(&mut self, i: u64) {
        if let Some(b) = self.done.get_mut((i / 8) as usize) {
            *b |= 1 << (i % 8);
        }
    }

    fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(48 + self.temp.len() + self.done.len());
        v.extend_from_slice(&self.ino.to_le_bytes());
        v.extend_from_slice(&self.size.to_le_bytes());
        v.extend_from_slice(&self.mtime.0.to_le_bytes());
        v.extend_from_slice(&self.mtime.1.to_le_bytes());
        v.extend_from_slice(&self.chunk_size.to_le_bytes());
        // The temporary's inode follows its name when known, flagged in the
        // length's top bit (a record without it reads as before).
        let flag = if self.temp_ino != 0 { INO_FLAG } else { 0 };
        v.extend_from_slice(&(self.temp.len() as u32 | flag).to_le_bytes());
        v.extend_from_slice(&self.temp);
        if self.temp_ino != 0 {
            v.extend_from_slice(&self.temp_ino.to_le_bytes());
        }
        v.extend_from_slice(&self.done);
        v
    }

    fn decode(mut b: &[u8]) -> Option<Record> {
        fn take<const N: usize>(b: &mut &[u8]) -> Option<[u8; N]> {
            let (head, rest) = b.split_first_chunk::<N>()?;
            *b = rest;
            Some(*head)
        }
        let ino = u64::from_le_bytes(take(&mut b)?);
        let size = u64::from_le_bytes(take(&mut b)?);
        let sec = i64::from_le_bytes(take(&mut b)?);
        let nsec = u32::from_le_bytes(take(&mut b)?);
        let chunk_size = u64::from_le_bytes(take(&mut b)?);
        let tlen = u32::from_le_bytes(take(&mut b)?);
        let (has_ino, tlen) = (tlen & INO_FLAG != 0, (tlen & !INO_FLAG) as usize);
        if b.len() < tlen {
            return None;
        }
        let (temp, mut done) = b.split_at(tlen);
        let temp_ino = if has_ino {
            u64::from_le_bytes(take(&mut done)?)
        } else {
            0
        };
        Some(Record {
            temp_ino,
            temp: temp.to_vec(),
            ino,
            size,
            mtime: (sec, nsec),
            chunk_size,
            done: done.to_vec(),
        })
    }
}

/// Sequence numbers of chunk records: sent, and committed to the file.
#[derive(Default)]
struct Progress {
    committed: Mutex<u64>,
    changed: Condvar,
}

impl Progress {
    fn set(&self, seq: u64) {
        let mut c = self.committed.lock().expect("journal lock");
        *c = (*c).max(seq);
        self.changed.notify_all();
    }
}

enum Msg {
    /// A big file started (or resumed) with this record.
    Begin(Vec<u8>, Record),
    /// Chunk `i` of a file was written to this descriptor; the last field
    /// is the message's sequence number.
    Chunk(Vec<u8>, u64, Arc<OwnedFd>, u64),
    /// The file is committed, or failed and its temporary removed.
    Forget(Vec<u8>),
}

/// The journal of one job. Cheap when unused: no file, no thread.
pub(crate) struct Journal {
    /// The directory the journal lives in (DST's root, or a single file's
    /// target directory), held so the file is always reached from it.
    dir: OwnedFd,
    name: CString,
    /// Records an earlier run left, not yet claimed by this run.
    resumable: Mutex<HashMap<Vec<u8>, Record>>,
    /// `(directory, temporary name)` of every resumable record, so leftover
    /// cleanup keeps those temporaries.
    owned: HashSet<(Vec<u8>, Vec<u8>)>,
    db: Mutex<Option<redb::Database>>,
    /// The channel to the collector, and the last sequence number sent.
    tx: Mutex<(Option<Sender<Msg>>, u64)>,
    progress: Arc<Progress>,
    collector: Mutex<Option<JoinHandle<Result<(), String>>>>,
    /// Files whose data failed to reach the disk (`fdatasync` error).
    sync_failed: Arc<Mutex<HashSet<Vec<u8>>>>,
    /// Set when the journal cannot be written: the job goes on without
    /// resume state.
    broken: AtomicBool,
    /// Why an earlier run's journal could not be used, if it could not.
    pub discarded: Option<String>,
}

impl Journal {
    /// Opens the journal an earlier run left in `dst_dir` (held open for the
    /// journal's life; the file is opened from it with `O_NOFOLLOW` and must
    /// be a regular file), if there is one. A journal that cannot be read
    /// is removed and [`Journal::discarded`] says why: its temporaries are
    /// then leftovers like any other, and those files start over.
    pub fn open(
        dst_dir: &OwnedFd,
        single: Option<&[u8]>,
        part: Option<&crate::shard::Shard>,
    ) -> std::io::Result<Journal> {
        let dir = dst_dir.try_clone()?;
        let name = CString::new(file_name(single, part)).expect("no NUL in a journal name");
        let (resumable, db, discarded) = match read(&dir, &name) {
            Ok((r, db)) => (r, db, None),
            // The same part of a `--shard` job started twice (parts lock
            // DST shared): the journal is the other's, not damaged.
            Err(StateError::Busy) => {
                return Err(std::io::Error::other(format!(
                    "journal {}: {}",
                    name.to_string_lossy(),
                    StateError::Busy
                )));
            }
            Err(why) => {
                let _ = sluice_sys::unlink_at(dir.as_fd(), &name);
                (HashMap::new(), None, Some(why.to_string()))
            }
        };
        let owned = resumable
            .iter()
            .map(|(rel, rec)| (crate::target::split_rel(rel).0.to_vec(), rec.temp.clone()))
            .collect();
        Ok(Journal {
            dir,
            name,
            resumable: Mutex::new(resumable),
            owned,
            db: Mutex::new(db),
            tx: Mutex::new((None, 0)),
            progress: Arc::new(Progress::default()),
            collector: Mutex::new(None),
            sync_failed: Arc::new(Mutex::new(HashSet::new())),
            broken: AtomicBool::new(false),
            discarded,
        })
    }

    /// The records of the journals that earlier runs of this job split
    /// into other than `count` parts left beside this one, each with the
    /// part that kept it: what they say landed in a shared temporary is
    /// there whatever the split now (see `parts`). Read only; they go at
    /// the end of a clean run. A journal another process holds open is
    /// waited for a moment, then passed over (its chunks are copied again).
    pub fn earlier_splits(&self, count: u32) -> Vec<(crate::shard::Shard, Resumable)> {
        let name = self.name.to_bytes();
        let Some(at) = name.windows(6).position(|w| w == b"-part-") else {
            return Vec::new(); // not a part's journal
        };
        let prefix = &name[..at];
        let Ok(fd) = crate::target::open_beneath(self.dir.as_fd(), b"") else {
            return Vec::new();
        };
        let mut found = Vec::new();
        let _ = sluice_walk::DirStream::default().for_each(fd.as_fd(), |e| {
            if let Some(part) = split_of(e.name.to_bytes(), prefix).filter(|p| p.count != count) {
                found.push((part, e.name.to_owned()));
            }
            true
        });
        let mut earlier = Vec::new();
        for (part, name) in found {
            for _ in 0..20 {
                match read(&fd, &name) {
                    Ok((records, _db)) => {
                        earlier.push((part, records));
                        break;
                    }
                    // Another part of this run reading it at the same moment.
                    Err(StateError::Busy) => {
                        std::thread::sleep(std::time::Duration::from_millis(25))
                    }
                    // Damaged: its files start over, as the part's own would.
                    Err(StateError::Other(_)) => break,
                }
            }
        }
        earlier
    }

    /// The journal's file name, for messages.
    pub fn file_name(&self) -> String {
        self.name.to_string_lossy().into_owned()
    }

    /// Whether the temporary `name` in directory `dir` belongs to a record
    /// this run may resume.
    pub fn owns(&self, dir: &[u8], name: &[u8]) -> bool {
        !self.owned.is_empty() && self.owned.contains(&(dir.to_vec(), name.to_vec()))
    }

    /// Takes the record an earlier run left for `rel`, if any.
    pub fn take(&self, rel: &[u8]) -> Option<Record> {
        let mut r = self.resumable.lock().expect("journal lock");
        if r.is_empty() {
            return None;
        }
        r.remove(rel)
    }

    /// Records left unclaimed by this run (their sources vanished, or are
    /// now up to date in DST): to be cleaned up after a complete walk.
    pub fn unclaimed(&self) -> Vec<(Vec<u8>, Record)> {
        self.resumable
            .lock()
            .expect("journal lock")
            .drain()
            .collect()
    }

    pub fn begin(&self, rel: &[u8], rec: Record) {
        self.send(|_| Msg::Begin(rel.to_vec(), rec));
    }

    /// Records that chunk `i` of `rel` landed, and waits until the record
    /// is committed, so that a crash re-copies at most the one chunk each
    /// stream has in flight. Other streams' records share the commit, and
    /// at the default chunk size the wait is ~1% of a chunk's copy time.
    pub fn chunk_done(&self, rel: &[u8], i: u64, fd: &Arc<OwnedFd>) {
        let seq = self.send(|seq| Msg::Chunk(rel.to_vec(), i, fd.clone(), seq));
        let mut c = self.progress.committed.lock().expect("journal lock");
        while *c < seq && !self.broken.load(Relaxed) {
            c = self.progress.changed.wait(c).expect("journal lock");
        }
    }

    pub fn forget(&self, rel: &[u8]) {
        self.send(|_| Msg::Forget(rel.to_vec()));
    }

    /// Whether the data of `rel` failed to reach the disk.
    pub fn sync_failed(&self, rel: &[u8]) -> bool {
        self.sync_failed.lock().expect("journal lock").contains(rel)
    }

    /// Whether records are being kept (the journal could be written).
    pub fn working(&self) -> bool {
        !self.broken.load(Relaxed)
    }

    /// Sends the message `make` builds from its sequence number; returns
    /// that number (0 when the journal is not working).
    fn send(&self, make: impl FnOnce(u64) -> Msg) -> u64 {
        if self.broken.load(Relaxed) {
            return 0;
        }
        let mut tx = self.tx.lock().expect("journal lock");
        if tx.0.is_none() {
            match self.start() {
                Ok(t) => tx.0 = Some(t),
                Err(_) => {
                    self.broken.store(true, Relaxed);
                    return 0;
                }
            }
        }
        tx.1 += 1;
        let seq = tx.1;
        if tx.0.as_ref().is_some_and(|t| t.send(make(seq)).is_ok()) {
            seq
        } else {
            self.broken.store(true, Relaxed);
            0
        }
    }

    /// Creates the file if needed and starts the collector thread.
    fn start(&self) -> Result<Sender<Msg>, String> {
        let db = match self.db.lock().expect("journal lock").take() {
            Some(db) => db,
            // Owner-only: the umask is cleared for the job, and the
            // journal names files that may be private.
            None => open_db(&self.dir, &self.name, true)?.ok_or("journal vanished")?,
        };
        let (tx, rx) = channel();
        let failed = self.sync_failed.clone();
        let progress = self.progress.clone();
        let handle = std::thread::Builder::new()
            .name("journal".into())
            .spawn(move || {
                let res = collect(db, rx, failed, &progress);
                // Nobody may wait for a commit that will never come.
                progress.set(u64::MAX);
                res
            })
            .map_err(|e| e.to_string())?;
        *self.collector.lock().expect("journal lock") = Some(handle);
        Ok(tx)
    }

    /// Stops the collector after its last commit. When no record remains
    /// the file is removed, and true returned.
    /// `clean` lists records to drop first (their temporaries are gone).
    pub fn close(&self, clean: &[Vec<u8>]) -> bool {
        for rel in clean {
            self.forget(rel);
        }
        drop(self.tx.lock().expect("journal lock").0.take());
        let handle = self.collector.lock().expect("journal lock").take();
        let collected = handle.map(|h| h.join());
        if let Some(Ok(Err(_)) | Err(_)) = collected {
            self.broken.store(true, Relaxed);
        }
        // Whatever the collector committed is in the file; count what is left.
        let db = match self.db.lock().expect("journal lock").take() {
            Some(db) => Some(db),
            None => open_db(&self.dir, &self.name, false).ok().flatten(),
        };
        let Some(db) = db else {
            return false;
        };
        let left = db
            .begin_read()
            .ok()
            .and_then(|r| match r.open_table(FILES) {
                Ok(t) => t.iter().ok().map(|rows| rows.count() as u64),
                Err(redb::TableError::TableDoesNotExist(_)) => Some(0),
                Err(_) => None,
            })
            .unwrap_or(1);
        drop(db);
        left == 0 && sluice_sys::unlink_at(self.dir.as_fd(), &self.name).is_ok()
    }
}

pub(crate) type Resumable = HashMap<Vec<u8>, Record>;

/// The part whose journal `name` is, if it is one of a split job with the
/// journal names starting `prefix` (`<prefix>-part-I-of-N.redb`).
fn split_of(name: &[u8], prefix: &[u8]) -> Option<crate::shard::Shard> {
    let rest = name.strip_prefix(prefix)?.strip_prefix(b"-part-")?;
    let rest = std::str::from_utf8(rest.strip_suffix(b".redb")?).ok()?;
    let (index, count) = rest.split_once("-of-")?;
    let (index, count) = (index.parse().ok()?, count.parse().ok()?);
    (index < count).then_some(crate::shard::Shard { index, count })
}

/// Opens the journal file `name` in `dir` (never through a symlink; only a
/// regular file) as a database: `Ok(None)` if it does not exist and
/// `create` is false. A small cache: the journal holds a few records, and
/// its memory counts against `--mem-limit`.
fn open_db(
    dir: &OwnedFd,
    name: &std::ffi::CStr,
    create: bool,
) -> Result<Option<redb::Database>, StateError> {
    crate::target::open_state_db(dir.as_fd(), name, create, 1 << 20)
}

/// Reads every record of an existing journal file.
fn read(
    dir: &OwnedFd,
    name: &std::ffi::CStr,
) -> Result<(Resumable, Option<redb::Database>), StateError> {
    let mut resumable = HashMap::new();
    let Some(db) = open_db(dir, name, false)? else {
        return Ok((resumable, None));
    };
    let read = db.begin_read().map_err(StateError::other)?;
    match read.open_table(FILES) {
        Ok(table) => {
            for row in table.iter().map_err(StateError::other)? {
                let (k, v) = row.map_err(StateError::other)?;
                if let Some(rec) = Record::decode(v.value()) {
                    resumable.insert(k.value().to_vec(), rec);
                }
            }
        }
        Err(redb::TableError::TableDoesNotExist(_)) => {}
        Err(e) => return Err(StateError::other(e)),
    }
    drop(read);
    Ok((resumable, Some(db)))
}

/// The collector: one transaction per wake-up, each covering every message
/// that arrived meanwhile, data synced before the records that claim it.
fn collect(
    db: redb::Database,
    rx: Receiver<Msg>,
    sync_failed: Arc<Mutex<HashSet<Vec<u8>>>>,
    progress: &Progress,
) -> Result<(), String> {
    let mut live: HashMap<Vec<u8>, Record> = HashMap::new();
    while let Ok(first) = rx.recv() {
        let mut dirty: HashSet<Vec<u8>> = HashSet::new();
        let mut gone: HashSet<Vec<u8>> = HashSet::new();
        let mut landed: Vec<(Vec<u8>, u64, Arc<OwnedFd>)> = Vec::new();
        let mut last_seq = 0;
        for msg in std::iter::once(first).chain(rx.try_iter()) {
            match msg {
                Msg::Begin(rel, rec) => {
                    gone.remove(&rel);
                    dirty.insert(rel.clone());
                    live.insert(rel, rec);
                }
                Msg::Chunk(rel, i, fd, seq) => {
                    last_seq = seq;
                    landed.push((rel, i, fd));
                }
                Msg::Forget(rel) => {
                    live.remove(&rel);
                    dirty.remove(&rel);
                    landed.retain(|(r, ..)| *r != rel);
                    gone.insert(rel);
                }
            }
        }
        // Data first: one fdatasync per file, then the records claiming it.
        let mut synced: HashMap<Vec<u8>, bool> = HashMap::new();
        for (rel, i, fd) in landed {
            let ok = *synced
                .entry(rel.clone())
                .or_insert_with(|| sluice_sys::sync_data(fd.as_fd()).is_ok());
            if !ok {
                sync_failed.lock().expect("journal lock").insert(rel);
                continue;
            }
            if let Some(rec) = live.get_mut(&rel) {
                rec.set_done(i);
                dirty.insert(rel);
            }
        }
        let txn = db.begin_write().map_err(|e| e.to_string())?;
        {
            let mut table = txn.open_table(FILES).map_err(|e| e.to_string())?;
            for rel in &gone {
                table.remove(rel.as_slice()).map_err(|e| e.to_string())?;
            }
            for rel in &dirty {
                if let Some(rec) = live.get(rel) {
                    table
                        .insert(rel.as_slice(), rec.encode().as_slice())
                        .map_err(|e| e.to_string())?;
                }
            }
        }
        txn.commit().map_err(|e| e.to_string())?;
        progress.set(last_seq);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn records_round_trip(temp in prop::collection::vec(any::<u8>(), 0..64),
                              ino: u64, size: u64, sec: i64, nsec: u32, chunk: u64,
                              done in prop::collection::vec(any::<u8>(), 0..64), temp_ino: u64) {
            let rec = Record { temp, ino, size, mtime: (sec, nsec), chunk_size: chunk, done, temp_ino };
            prop_assert_eq!(Record::decode(&rec.encode()), Some(rec));
        }

        #[test]
        fn truncated_records_are_refused(cut in 0usize..40) {
            let rec = Record { temp: b".sluice-1-2.tmp".to_vec(), ino: 1, size: 2, mtime: (3, 4), chunk_size: 5, done: vec![], temp_ino: 9 };
            let bytes = rec.encode();
            prop_assert_eq!(Record::decode(&bytes[..cut.min(bytes.len() - 1)]), None);
        }
    }

    #[test]
    fn a_split_journal_name_says_whose_it_is() {
        use crate::shard::Shard;
        let tree = file_name(None, None);
        let prefix = tree.trim_end_matches(".redb").as_bytes();
        for (index, count) in [(0, 1), (2, 3), (11, 64)] {
            let name = file_name(None, Some(&Shard { index, count }));
            assert_eq!(
                split_of(name.as_bytes(), prefix),
                Some(Shard { index, count })
            );
        }
        assert_eq!(split_of(tree.as_bytes(), prefix), None);
        let single = file_name(Some(b"x"), Some(&Shard { index: 0, count: 2 }));
        assert_eq!(split_of(single.as_bytes(), prefix), None, "another job's");
        assert_eq!(split_of(b".sluice-journal-part-3-of-2.redb", prefix), None);
    }

    #[test]
    fn a_split_journal_is_told_by_its_count() {
        let part = |index, count| file_name(None, Some(&crate::shard::Shard { index, count }));
        assert_eq!(part(1, 4), ".sluice-journal-part-1-of-4.redb");
        assert!(is_other_split(part(1, 4).as_bytes(), 3));
        assert!(!is_other_split(part(1, 4).as_bytes(), 4));
        assert!(is_other_split(part(1, 14).as_bytes(), 4));
        assert!(!is_other_split(TREE_NAME.as_bytes(), 3));
        assert!(!is_other_split(file_name(Some(b"f"), None).as_bytes(), 3));
    }

    #[test]
    fn bitmap() {
        let st = Stat {
            mode: 0o100644,
            uid: 0,
            gid: 0,
            nlink: 1,
            ino: 7,
            size: 100,
            blocks: 1,
            dev: (1, 1),
            rdev: (0, 0),
            atime: (0, 0),
            ctime: (0, 0),
            mtime: (1, 2),
        };
        let mut r = Record::new(b"t", &st, 10, 10);
        assert_eq!(r.done.len(), 2);
        r.set_done(9);
        r.set_done(0);
        assert!(r.is_done(9) && r.is_done(0) && !r.is_done(8));
        assert!(!r.is_done(1000));
        assert!(r.matches(&st, 10));
        assert!(!r.matches(&st, 20));
    }
}

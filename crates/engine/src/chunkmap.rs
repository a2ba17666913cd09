//! The chunk map of an image: for each chunk of DST, the hash of the source
//! data it holds and the generation (run) that wrote it, plus a header
//! saying how DST looked when the last run finished.
//!
//! The map is the image job's journal. A chunk's record is committed only
//! after the data it claims was `fdatasync`ed to DST, so after a crash a
//! record may lag behind DST (the chunk is written again) but never runs
//! ahead of it. A run that writes marks the header dirty first and clean
//! last; in between, the map still describes DST chunk by chunk, so an
//! interrupted run resumes from it.
//!
//! It is a redb file (atomic, crash-safe commits, and an exclusive file
//! lock, which makes it the one-writer-per-DST lock too). Chunk hashes are
//! XXH3-128; two values are reserved: [`UNKNOWN`] (no record) and [`ZERO`]
//! (the chunk is all zeros, a hole in a file DST).

use redb::{ReadableDatabase, TableDefinition};
use serde::{Deserialize, Serialize};
use std::path::Path;

const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
const CHUNKS: TableDefinition<u64, &[u8]> = TableDefinition::new("chunks");

/// No record for this chunk: DST's content there is not known.
pub const UNKNOWN: u128 = 0;
/// The chunk is all zeros.
pub const ZERO: u128 = 1;

/// The map's hash of a chunk's data (never one of the reserved values).
pub fn hash_of(data: &[u8]) -> u128 {
    hash_of_raw(xxhash_rust::xxh3::xxh3_128(data))
}

/// [`hash_of`] from the xxh3-128 of the data (computed elsewhere: by the
/// far end of a wire).
pub fn hash_of_raw(h: u128) -> u128 {
    match h {
        UNKNOWN | ZERO => 2,
        h => h,
    }
}

/// Identity of a file or device at a point in time: a later run compares
/// it to decide whether the map still describes DST (or whether SRC is
/// untouched since).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Ident {
    pub dev: (u32, u32),
    pub ino: u64,
    pub rdev: (u32, u32),
    pub size: u64,
    /// Zero for a block device, whose inode times say nothing of its data.
    pub mtime: (i64, u32),
    /// For a block device, what names the disk behind the device number,
    /// which can change hands (a loop device's backing file, a disk's
    /// WWID); empty if the kernel tells nothing.
    #[serde(default)]
    pub disk: String,
}

impl Ident {
    /// `size` is a block device's (statx knows only a file's).
    pub fn of(st: &sluice_sys::Stat, size: u64) -> Ident {
        let device = st.file_type() == sluice_sys::FileType::BlockDevice;
        Ident {
            dev: st.dev,
            ino: st.ino,
            rdev: st.rdev,
            size: if device { size } else { st.size },
            mtime: if device { (0, 0) } else { st.mtime },
            disk: if device {
                disk_of(st.rdev)
            } else {
                String::new()
            },
        }
    }

    /// The same file or disk, whatever happened to its data since.
    pub fn same_file(&self, other: &Ident) -> bool {
        self.dev == other.dev
            && self.ino == other.ino
            && self.rdev == other.rdev
            && self.disk == other.disk
    }
}

/// What sysfs says names the disk behind block device `rdev`.
fn disk_of(rdev: (u32, u32)) -> String {
    let sys = format!("/sys/dev/block/{}:{}", rdev.0, rdev.1);
    let read = |p: &str| {
        std::fs::read_to_string(format!("{sys}/{p}"))
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    };
    read("loop/backing_file")
        .map(|f| format!("loop:{f}"))
        .or_else(|| read("device/wwid").map(|w| format!("wwid:{w}")))
        .or_else(|| read("../device/wwid").map(|w| format!("wwid:{w}")))
        .or_else(|| read("device/serial").map(|w| format!("serial:{w}")))
        .unwrap_or_default()
}

/// What the map says about the whole image.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    pub chunk_size: u64,
    /// Bytes of SRC the map covers.
    pub size: u64,
    /// Incremented by every run that writes; each chunk record carries the
    /// generation that wrote it.
    pub generation: u64,
    /// False from the start of a writing run until its end.
    pub clean: bool,
    /// DST as the last finished run left it.
    pub dst: Ident,
    /// SRC as the last finished run read it (a regular file whose identity,
    /// size and mtime are unchanged need not be read again).
    pub src: Ident,
    /// A first copy in progress: its temporary's name beside DST.
    pub temp: Option<String>,
}

/// One chunk's record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    pub chunk: u64,
    pub hash: u128,
    /// The signature of the SRC extents the data was read from, where the
    /// file system moves data on every write (0: none).
    pub sig: u64,
}

/// Per chunk of `chunk_size`, a signature of the extents that hold its
/// data (location, length, data flags, clipped to the chunk): equal
/// signatures on a file system that writes every change to new blocks
/// mean equal data. 0 where an extent is not settled (or for chunks past
/// the end).
pub fn extent_sigs(
    extents: &[sluice_sys::extents::Extent],
    size: u64,
    chunk_size: u64,
) -> Vec<u64> {
    let chunks = size.div_ceil(chunk_size);
    let mut out = Vec::with_capacity(chunks as usize);
    let mut first = 0; // first extent that may overlap the current chunk
    for i in 0..chunks {
        let (lo, hi) = (i * chunk_size, ((i + 1) * chunk_size).min(size));
        while first < extents.len() && extents[first].logical + extents[first].length <= lo {
            first += 1;
        }
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        h.update(&lo.to_le_bytes());
        h.update(&hi.to_le_bytes());
        let mut settled = true;
        for e in extents[first..].iter().take_while(|e| e.logical < hi) {
            settled &= !e.unsettled();
            let start = e.logical.max(lo);
            let end = (e.logical + e.length).min(hi);
            h.update(&start.to_le_bytes());
            h.update(&(e.physical + (start - e.logical)).to_le_bytes());
            h.update(&(end - start).to_le_bytes());
            h.update(&e.data_flags().to_le_bytes());
        }
        out.push(if settled { h.digest().max(1) } else { 0 });
    }
    out
}

/// An open chunk map, locked for this process.
pub struct ChunkMap {
    db: redb::Database,
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

impl ChunkMap {
    /// Opens the map at `path`, creating it (owner-only) if missing: from
    /// its directory's descriptor with `O_NOFOLLOW`, and only if it is a
    /// regular file, so a symlink planted under the map's name never makes
    /// sluice create or write a file elsewhere. Another process holding it
    /// open is an error: one writer per DST.
    pub fn open(path: &Path) -> Result<ChunkMap, String> {
        let fail = |e: String| format!("chunk map {}: {e}", path.display());
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let name = path
            .file_name()
            .and_then(|n| std::ffi::CString::new(n.as_encoded_bytes()).ok())
            .ok_or_else(|| fail("names no file".into()))?;
        let dir = sluice_sys::open_dir_path(dir).map_err(|e| fail(e.to_string()))?;
        let db = crate::target::open_state_db(std::os::fd::AsFd::as_fd(&dir), &name, true, 4 << 20)
            .map_err(|e| fail(e.to_string()))?
            .expect("created if missing");
        Ok(ChunkMap { db })
    }

    pub fn header(&self) -> Result<Option<Header>, String> {
        let r = self.db.begin_read().map_err(err)?;
        let t = match r.open_table(META) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(err(e)),
        };
        let Some(v) = t.get("header").map_err(err)? else {
            return Ok(None);
        };
        Ok(serde_json::from_slice(v.value()).ok())
    }

    /// Every chunk's hash ([`UNKNOWN`] where there is no record) and the
    /// signature of SRC's extents its data was read from (0: none), for
    /// the first `chunks` chunks.
    pub fn load(&self, chunks: u64) -> Result<(Vec<u128>, Vec<u64>), String> {
        let mut hashes = vec![UNKNOWN; chunks as usize];
        let mut sigs = vec![0; chunks as usize];
        let r = self.db.begin_read().map_err(err)?;
        let t = match r.open_table(CHUNKS) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok((hashes, sigs)),
            Err(e) => return Err(err(e)),
        };
        for row in t.range(0..chunks).map_err(err)? {
            let (k, v) = row.map_err(err)?;
            let (i, v) = (k.value() as usize, v.value());
            if let Some(h) = v.get(..16) {
                hashes[i] = u128::from_le_bytes(h.try_into().expect("16 bytes"));
            }
            if let Some(s) = v.get(24..32) {
                sigs[i] = u64::from_le_bytes(s.try_into().expect("8 bytes"));
            }
        }
        Ok((hashes, sigs))
    }

    /// Writes `header`, and in the same commit forgets every chunk record
    /// when `reset` (a new chunk size, or `--rehash`).
    pub fn set_header(&self, header: &Header, reset: bool) -> Result<(), String> {
        let txn = self.db.begin_write().map_err(err)?;
        if reset {
            txn.delete_table(CHUNKS).map_err(err)?;
        }
        {
            let mut t = txn.open_table(META).map_err(err)?;
            let v = serde_json::to_vec(header).map_err(err)?;
            t.insert("header", v.as_slice()).map_err(err)?;
        }
        txn.commit().map_err(err)
    }

    /// Records chunks (index, hash, extent signature) as written by
    /// `generation`, in one commit. The caller has made their data durable
    /// first.
    pub fn record(&self, chunks: &[Record], generation: u64) -> Result<(), String> {
        if chunks.is_empty() {
            return Ok(());
        }
        let txn = self.db.begin_write().map_err(err)?;
        {
            let mut t = txn.open_table(CHUNKS).map_err(err)?;
            let mut v = [0u8; 32];
            v[16..24].copy_from_slice(&generation.to_le_bytes());
            for r in chunks {
                v[..16].copy_from_slice(&r.hash.to_le_bytes());
                v[24..].copy_from_slice(&r.sig.to_le_bytes());
                t.insert(r.chunk, v.as_slice()).map_err(err)?;
            }
        }
        txn.commit().map_err(err)
    }

    /// Forgets the records of chunks `from..` (SRC shrank).
    pub fn truncate(&self, from: u64) -> Result<(), String> {
        let txn = self.db.begin_write().map_err(err)?;
        {
            let mut t = txn.open_table(CHUNKS).map_err(err)?;
            t.retain_in(from.., |_, _| false).map_err(err)?;
        }
        txn.commit().map_err(err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_survive_reopen_and_reset_forgets_them() {
        let dir = tempfile_dir();
        let path = dir.join("m");
        let h = Header {
            chunk_size: 4,
            size: 12,
            generation: 1,
            clean: false,
            dst: Ident::default(),
            src: Ident::default(),
            temp: Some(".sluice-1-0.tmp".into()),
        };
        {
            let m = ChunkMap::open(&path).unwrap();
            assert_eq!(m.header().unwrap(), None);
            m.set_header(&h, false).unwrap();
            let r = |chunk, hash, sig| Record { chunk, hash, sig };
            m.record(&[r(0, 77, 5), r(2, ZERO, 0)], 1).unwrap();
            assert!(ChunkMap::open(&path).is_err(), "a second opener is refused");
        }
        let m = ChunkMap::open(&path).unwrap();
        assert_eq!(m.header().unwrap(), Some(h.clone()));
        assert_eq!(m.load(3).unwrap(), (vec![77, UNKNOWN, ZERO], vec![5, 0, 0]));
        m.truncate(1).unwrap();
        assert_eq!(m.load(3).unwrap().0, vec![77, UNKNOWN, UNKNOWN]);
        m.set_header(&h, true).unwrap();
        assert_eq!(m.load(3).unwrap().0, vec![UNKNOWN; 3]);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn extent_signatures_change_with_the_extents_of_their_chunk_only() {
        use sluice_sys::extents::Extent;
        let e = |logical, physical, length| Extent {
            logical,
            physical,
            length,
            flags: 0,
        };
        let before = [e(0, 1000, 10), e(10, 5000, 20)];
        let a = extent_sigs(&before, 30, 8);
        assert_eq!(a.len(), 4);
        assert!(a.iter().all(|&s| s != 0));
        // Bytes 16..20 rewritten elsewhere (copy-on-write): chunk 2 only.
        let after = [
            e(0, 1000, 10),
            e(10, 5000, 6),
            e(16, 9000, 4),
            e(20, 5010, 10),
        ];
        let b = extent_sigs(&after, 30, 8);
        assert_eq!((a[0], a[1], a[3]), (b[0], b[1], b[3]));
        assert_ne!(a[2], b[2]);
        // A snapshot marks extents shared: nothing changed.
        let shared: Vec<Extent> = before
            .iter()
            .map(|x| Extent {
                flags: 0x2000,
                ..*x
            })
            .collect();
        assert_eq!(extent_sigs(&shared, 30, 8), a);
        // Delayed allocation says nothing.
        let delalloc = [
            e(0, 1000, 10),
            Extent {
                flags: 0x4,
                ..e(10, 0, 20)
            },
        ];
        assert_eq!(extent_sigs(&delalloc, 30, 8)[1..], [0, 0, 0]);
    }

    #[test]
    fn real_hashes_avoid_the_reserved_values() {
        assert!(hash_of(b"") > ZERO);
        assert!(hash_of(&[0u8; 4096]) > ZERO);
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!(
            "sluice-chunkmap-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}

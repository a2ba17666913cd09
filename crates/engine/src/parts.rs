//! A big file whose chunks are shared out between the parts of a split
//! job (`--shard`, see [`crate::shard`]): the temporary they all write
//! into and the markers that say whose chunks are in.
//!
//! Names: `.sluice-0-<seq>-<tag>.tmp` for the temporary and
//! `.sluice-<count·2³²+part>-<seq'>-<tag>.tmp` for part `part`'s marker,
//! where `seq` is derived from the file (every part computes the same
//! one), `seq'` mixes in the temporary's inode (a marker only ever speaks
//! for the temporary it was made beside) and the tag is
//! [`sluice_sys::temp_tag`] of the directory's inode, so a run that is not
//! split recognises them as its own leftovers.

use crate::shard::Shard;
use sluice_sys::{Errno, FileType, Stat};
use std::ffi::CString;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

/// One big file's share-out between parts.
pub(crate) struct PartFile {
    shard: Shard,
    seq: u64,
    /// The DST directory's inode.
    dir_ino: u64,
    /// The parts that own at least one chunk.
    owners: Vec<u32>,
}

/// What opening the shared temporary found.
pub(crate) struct Opened {
    pub fd: OwnedFd,
    pub ino: u64,
    /// Its size now (another part may have set it already).
    pub size: u64,
    /// This call created it (no part had started the file).
    pub created: bool,
}

impl PartFile {
    pub fn new(shard: Shard, rel: &[u8], st: &Stat, chunk_size: u64, dir_ino: u64) -> PartFile {
        let chunks = crate::plan::chunk_count(st.size, chunk_size);
        PartFile {
            shard,
            seq: Shard::file_seq(rel, st, chunk_size),
            dir_ino,
            owners: shard.owners(Shard::path_hash(b"", rel), chunks),
        }
    }

    fn name(&self, field: u64, seq: u64) -> CString {
        let tag = sluice_sys::temp_tag((0, 0, self.dir_ino), field, seq);
        CString::new(format!(".sluice-{field:x}-{seq:x}-{tag:x}.tmp")).expect("no NUL")
    }

    /// The shared temporary's name.
    pub fn temp(&self) -> CString {
        self.name(0, self.seq)
    }

    fn marker(&self, part: u32, temp_ino: u64) -> CString {
        self.marker_of(self.shard.marker_field(part), temp_ino)
    }

    fn marker_of(&self, field: u64, temp_ino: u64) -> CString {
        let seq = self.seq ^ temp_ino.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        self.name(field, seq)
    }

    /// Opens the shared temporary in `dir`, creating it (with `mode`) if no
    /// part has yet. Only a regular file with one name is taken: anything
    /// else under that name is refused, never written through.
    pub fn open(&self, dir: BorrowedFd<'_>, mode: u32) -> Result<Opened, (&'static str, Errno)> {
        let name = self.temp();
        let (fd, created) = match sluice_sys::create_excl_at(dir, &name, mode) {
            Ok(fd) => (fd, true),
            Err(Errno::EXIST) => (
                sluice_sys::open_write_at(dir, &name)
                    .map_err(|e| ("open the shared temporary of", e))?,
                false,
            ),
            Err(e) => return Err(("create the shared temporary of", e)),
        };
        let st = sluice_sys::stat_fd(fd.as_fd()).map_err(|e| ("stat", e))?;
        if st.file_type() != FileType::RegularFile || st.nlink != 1 {
            return Err(("open the shared temporary of", Errno::EXIST));
        }
        Ok(Opened {
            fd,
            ino: st.ino,
            size: st.size,
            created,
        })
    }

    /// Whether this part's marker is beside the temporary `temp_ino`: its
    /// chunks are in, from an earlier run.
    pub fn marked(&self, dir: BorrowedFd<'_>, temp_ino: u64) -> bool {
        sluice_sys::stat_at(dir, &self.marker(self.shard.index, temp_ino)).is_ok()
    }

    /// Whether part `earlier` of an earlier run split another way left its
    /// marker beside the temporary `temp_ino`: the chunks that split gave
    /// it are in.
    pub fn marked_in(&self, dir: BorrowedFd<'_>, temp_ino: u64, earlier: Shard) -> bool {
        let name = self.marker_of(earlier.marker_field(earlier.index), temp_ino);
        sluice_sys::stat_at(dir, &name).is_ok()
    }

    /// Leaves this part's marker (its chunks are written and synced) and
    /// says whether every owner's is there. Called holding the
    /// temporary's lock ([`sluice_sys::lock`]), so of two parts finishing
    /// together exactly one sees the other's marker.
    pub fn mark(&self, dir: BorrowedFd<'_>, temp_ino: u64) -> Result<bool, Errno> {
        match sluice_sys::create_excl_at(dir, &self.marker(self.shard.index, temp_ino), 0o600) {
            Ok(_) | Err(Errno::EXIST) => {}
            Err(e) => return Err(e),
        }
        Ok(self
            .owners
            .iter()
            .all(|&p| sluice_sys::stat_at(dir, &self.marker(p, temp_ino)).is_ok()))
    }

    /// Removes every owner's marker, once the file is committed.
    pub fn clear(&self, dir: BorrowedFd<'_>, temp_ino: u64) {
        for &p in &self.owners {
            let _ = sluice_sys::unlink_at(dir, &self.marker(p, temp_ino));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The parts agree on every name, markers differ per part and per
    /// temporary, and all of them read as sluice's own temporaries in the
    /// directory whatever device number it has on a given machine.
    #[test]
    fn every_part_names_the_same_temporary_and_its_own_marker() {
        let st = Stat {
            mode: 0o100644,
            nlink: 1,
            ino: 5,
            size: 10 << 30,
            ..Stat::default()
        };
        let part = |index| PartFile::new(Shard { index, count: 3 }, b"d/big", &st, 64 << 20, 42);
        let (a, b) = (part(0), part(1));
        assert_eq!(a.temp(), b.temp());
        assert_eq!(a.owners, vec![0, 1, 2]);
        assert_ne!(a.marker(0, 9), a.marker(1, 9));
        assert_eq!(a.marker(1, 9), b.marker(1, 9));
        assert_ne!(a.marker(0, 9), a.marker(0, 10));
        for name in [a.temp(), a.marker(2, 9)] {
            assert!(
                sluice_sys::is_own_temp(name.to_bytes(), (0, 47, 42)),
                "{name:?}"
            );
            assert!(
                sluice_sys::is_own_temp(name.to_bytes(), (8, 1, 42)),
                "{name:?}"
            );
            assert!(
                !sluice_sys::is_own_temp(name.to_bytes(), (8, 1, 43)),
                "{name:?}"
            );
        }
        let changed = Stat {
            mtime: (1, 0),
            ..st
        };
        let c = PartFile::new(
            Shard { index: 0, count: 3 },
            b"d/big",
            &changed,
            64 << 20,
            42,
        );
        assert_ne!(a.temp(), c.temp());
    }
}

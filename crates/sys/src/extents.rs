//! Where a file's data lies on disk (`FS_IOC_FIEMAP`), and whether the
//! file system moves it on every write (btrfs copy-on-write): together a
//! record of which parts of a file changed, without reading them.

use crate::{Errno, Result};
use std::os::fd::BorrowedFd;

/// One extent of a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub logical: u64,
    pub physical: u64,
    pub length: u64,
    pub flags: u32,
}

impl Extent {
    /// The location is not final (delayed allocation) or not known: it
    /// says nothing about the data.
    /// Inline and tail-packed data has no location of its own either.
    pub fn unsettled(&self) -> bool {
        const UNKNOWN: u32 = 0x2;
        const DELALLOC: u32 = 0x4;
        const DATA_INLINE: u32 = 0x200;
        const DATA_TAIL: u32 = 0x400;
        self.flags & (UNKNOWN | DELALLOC | DATA_INLINE | DATA_TAIL) != 0
    }

    /// The flags that say something about the data: preallocated
    /// (unwritten) and compressed. `SHARED` is left out: a snapshot shares
    /// every extent without changing a byte.
    pub fn data_flags(&self) -> u32 {
        const ENCODED: u32 = 0x8;
        const UNWRITTEN: u32 = 0x800;
        self.flags & (ENCODED | UNWRITTEN)
    }
}

const BATCH: usize = 256;

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct RawExtent {
    logical: u64,
    physical: u64,
    length: u64,
    reserved64: [u64; 2],
    flags: u32,
    reserved: [u32; 3],
}

/// `struct fiemap` as the kernel's header declares it (the opcode encodes
/// its size), without the flexible array.
#[repr(C)]
struct Header {
    start: u64,
    length: u64,
    flags: u32,
    mapped_extents: u32,
    extent_count: u32,
    reserved: u32,
}

/// The header followed by room for `BATCH` extents.
#[repr(C)]
struct Fiemap {
    header: Header,
    extents: [RawExtent; BATCH],
}

const FS_IOC_FIEMAP: rustix::ioctl::Opcode = rustix::ioctl::opcode::read_write::<Header>(b'f', 11);
const FIEMAP_FLAG_SYNC: u32 = 0x1;
const LAST: u32 = 0x1;

/// Every extent of the file, after writing out its dirty pages
/// (`FIEMAP_FLAG_SYNC`) so that none is still unallocated.
pub fn extents(fd: BorrowedFd<'_>) -> Result<Vec<Extent>> {
    let mut out = Vec::new();
    let mut map = Box::new(Fiemap {
        header: Header {
            start: 0,
            length: u64::MAX,
            flags: FIEMAP_FLAG_SYNC,
            mapped_extents: 0,
            extent_count: BATCH as u32,
            reserved: 0,
        },
        extents: [RawExtent::default(); BATCH],
    });
    loop {
        map.header.mapped_extents = 0;
        map.header.extent_count = BATCH as u32;
        // SAFETY: FS_IOC_FIEMAP takes a `struct fiemap` followed by room
        // for `extent_count` `struct fiemap_extent`s, which `Fiemap` is
        // (both `repr(C)` with the kernel's field order and sizes: 32 and
        // 56 bytes), and it writes no further than that.
        unsafe {
            rustix::ioctl::ioctl(
                fd,
                rustix::ioctl::Updater::<FS_IOC_FIEMAP, Fiemap>::new(&mut map),
            )?;
        }
        let n = (map.header.mapped_extents as usize).min(BATCH);
        if n == 0 {
            return Ok(out);
        }
        for e in &map.extents[..n] {
            out.push(Extent {
                logical: e.logical,
                physical: e.physical,
                length: e.length,
                flags: e.flags,
            });
        }
        let last = map.extents[n - 1];
        if last.flags & LAST != 0 {
            return Ok(out);
        }
        let next = last.logical + last.length;
        map.header.start = next;
        map.header.length = u64::MAX - next;
    }
}

/// Whether a write to this file always lands on new blocks, so that an
/// unchanged extent list proves unchanged data: btrfs, unless the file is
/// `nodatacow` (`chattr +C`).
pub fn moves_on_write(fd: BorrowedFd<'_>) -> bool {
    const BTRFS_SUPER_MAGIC: i64 = 0x9123_683e;
    // f_type is i64 on x86_64 but narrower elsewhere.
    #[allow(clippy::unnecessary_cast)]
    let btrfs = rustix::fs::fstatfs(fd).is_ok_and(|s| s.f_type as i64 == BTRFS_SUPER_MAGIC);
    btrfs && rustix::fs::ioctl_getflags(fd).is_ok_and(|f| !f.contains(rustix::fs::IFlags::NOCOW))
}

/// `EOPNOTSUPP`: the file system has no extent map.
pub fn unsupported(e: Errno) -> bool {
    matches!(e, Errno::OPNOTSUPP | Errno::NOTTY | Errno::INVAL)
}

#[cfg(test)]
mod tests {
    #[test]
    fn layouts_match_the_kernel() {
        assert_eq!(std::mem::size_of::<super::Header>(), 32);
        assert_eq!(std::mem::size_of::<super::RawExtent>(), 56);
    }
}

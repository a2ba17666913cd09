//! Content digests: what `verify`, `--verify` and a changed big file's
//! chunks are compared by. Each side hashes its own bytes, so a side
//! across a wire sends 32 bytes for a range, not the range.

use sluice_sys::Errno;
use std::os::fd::BorrowedFd;

/// The 128-bit (or wider) hash content is compared by.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HashKind {
    /// XXH3-128: ~30 GB/s per core, far beyond any disk.
    #[default]
    Xxh3,
    /// BLAKE3: cryptographic, for when a collision must be infeasible.
    Blake3,
}

/// A content digest: XXH3-128 in the first 16 bytes, or all 32 of BLAKE3.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Digest(pub [u8; 32]);

enum Hasher {
    Xxh3(Box<xxhash_rust::xxh3::Xxh3>),
    Blake3(Box<blake3::Hasher>),
}

impl Hasher {
    fn new(kind: HashKind) -> Hasher {
        match kind {
            HashKind::Xxh3 => Hasher::Xxh3(Box::default()),
            HashKind::Blake3 => Hasher::Blake3(Box::default()),
        }
    }

    fn update(&mut self, data: &[u8]) {
        match self {
            Hasher::Xxh3(h) => h.update(data),
            Hasher::Blake3(h) => {
                h.update(data);
            }
        }
    }

    fn finish(self) -> Digest {
        let mut d = [0u8; 32];
        match self {
            Hasher::Xxh3(h) => d[..16].copy_from_slice(&h.digest128().to_le_bytes()),
            Hasher::Blake3(h) => d.copy_from_slice(h.finalize().as_bytes()),
        }
        Digest(d)
    }
}

/// The digest of bytes already in memory.
pub fn digest(data: &[u8], kind: HashKind) -> Digest {
    let mut h = Hasher::new(kind);
    h.update(data);
    h.finish()
}

/// Hashes `[off, off + len)` of `fd` (to the end of the file when `len` is
/// `u64::MAX`) through `buf`, which is aligned for `O_DIRECT` descriptors.
/// Returns the digest and the bytes read.
pub fn hash_range(
    fd: BorrowedFd<'_>,
    off: u64,
    len: u64,
    buf: &mut [u8],
    kind: HashKind,
) -> Result<(Digest, u64), Errno> {
    let mut h = Hasher::new(kind);
    let mut done = 0u64;
    while done < len {
        // Direct reads need aligned lengths; at the end of the file they
        // come back short.
        let want = (len - done).min(buf.len() as u64);
        let step = (want.next_multiple_of(sluice_sys::DIRECT_ALIGN as u64) as usize).min(buf.len());
        let n = sluice_sys::read_full_at(fd, &mut buf[..step], off + done)?;
        let n = n.min(want as usize);
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        done += n as u64;
        if (n as u64) < want {
            break; // end of file
        }
    }
    Ok((h.finish(), done))
}
